//! The edges' compression dictionaries in SQLite: rows of `edge_dicts`, each edge's within its
//! quota, stored and evicted in one transaction.

use rusqlite::{OptionalExtension, params};
use shared::proto::DictAnnounce;
use shared::units::now_ms;

use super::SqliteSink;
use crate::sink::DictStore;
use crate::sink::error::SinkError;
use crate::sink::quota::{DictIndex, StoredDict};

impl DictStore for SqliteSink {
    async fn load_dicts(&self, edge: &str, ids: &[String]) -> Result<Vec<(String, Vec<u8>)>, SinkError> {
        let (edge, ids) = (edge.to_owned(), ids.to_vec());
        self.blocking(move |conn| {
            let mut stmt = conn
                .prepare_cached("SELECT bytes FROM edge_dicts WHERE edge_id = ?1 AND id = ?2")
                .map_err(|e| SinkError::sqlite("read dict", e))?;
            let mut found = Vec::new();
            for id in ids {
                let bytes: Option<Vec<u8>> = stmt
                    .query_row([&edge, &id], |r| r.get(0))
                    .optional()
                    .map_err(|e| SinkError::sqlite("read dict", e))?;
                if let Some(bytes) = bytes {
                    found.push((id, bytes));
                }
            }
            Ok(found)
        })
        .await
    }

    async fn store_dict(&self, edge: &str, dict: &DictAnnounce) -> Result<(), SinkError> {
        let (edge, dict, quota, metrics) = (edge.to_owned(), dict.clone(), self.quota, self.metrics.clone());
        self.blocking(move |conn| {
            let tx = conn.transaction().map_err(|e| SinkError::sqlite("begin", e))?;
            let mut index = DictIndex::default();
            {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT id, length(bytes), stored_ms FROM edge_dicts WHERE edge_id = ?1 ORDER BY stored_ms, id",
                    )
                    .map_err(|e| SinkError::sqlite("read dicts", e))?;
                let rows = stmt
                    .query_map([&edge], |r| Ok(StoredDict { id: r.get(0)?, bytes: r.get(1)?, stored_ms: r.get(2)? }))
                    .map_err(|e| SinkError::sqlite("read dicts", e))?;
                for row in rows {
                    index.dicts.push(row.map_err(|e| SinkError::sqlite("read dicts", e))?);
                }
            }
            // Rows are ordered by this time: a later store never sorts before an earlier one.
            let now = now_ms().max(index.dicts.last().map_or(0, |d| d.stored_ms + 1));
            let evicted = index.add(&dict.id, dict.bytes.len() as u64, now, &quota);
            tx.execute(
                "INSERT OR REPLACE INTO edge_dicts (edge_id, id, class, bytes, stored_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![edge, dict.id, dict.class, dict.bytes, now],
            )
            .map_err(|e| SinkError::sqlite("store dict", e))?;
            for id in &evicted {
                tx.execute("DELETE FROM edge_dicts WHERE edge_id = ?1 AND id = ?2", params![edge, id])
                    .map_err(|e| SinkError::sqlite("evict dict", e))?;
            }
            tx.commit().map_err(|e| SinkError::sqlite("commit", e))?;
            for id in evicted {
                metrics.dicts_evicted.inc();
                tracing::info!(edge, id, "dictionary evicted: past the edge's dictionary quota");
            }
            Ok(())
        })
        .await
    }
}
