//! The edges' compression dictionaries in JetStream: `<edge>.<id>` in the dictionary bucket,
//! each edge's index at `<edge>`, within the edge's quota.

use bytes::Bytes;
use shared::proto::DictAnnounce;
use shared::units::now_ms;

use super::JetStreamSink;
use super::bucket::{CAS_ATTEMPTS, Cas, edge_key, read_doc, write_doc};
use crate::sink::DictStore;
use crate::sink::error::SinkError;
use crate::sink::quota::DictIndex;

/// Dictionary ids are hex digests, which are valid KV keys; anything else an edge names is not
/// looked up.
fn is_dict_key(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

impl DictStore for JetStreamSink {
    async fn load_dicts(&self, edge: &str, ids: &[String]) -> Result<Vec<(String, Vec<u8>)>, SinkError> {
        let edge = edge_key(edge);
        let mut found = Vec::new();
        for id in ids.iter().filter(|id| is_dict_key(id)) {
            let key = format!("{edge}.{id}");
            if let Some(bytes) = self.dicts.get(&key).await.map_err(|e| SinkError::nats("read dict", &key, &e))? {
                found.push((id.clone(), bytes.to_vec()));
            }
        }
        Ok(found)
    }

    async fn store_dict(&self, edge: &str, dict: &DictAnnounce) -> Result<(), SinkError> {
        if !is_dict_key(&dict.id) {
            return Err(SinkError::invalid("store dict", format!("{:?} is not a dictionary id", dict.id)));
        }
        let index_key = edge_key(edge);
        // Counted in the index first: a crash before the bytes are written leaves an entry no
        // hello finds (the edge announces it again), never bytes the quota does not see.
        let mut evicted = None;
        for _ in 0..CAS_ATTEMPTS {
            let (mut index, revision): (DictIndex, _) = read_doc(&self.dicts, &index_key, "read dicts").await?;
            let out = index.add(&dict.id, dict.bytes.len() as u64, now_ms(), &self.quota);
            match write_doc(&self.dicts, &index_key, &index, revision).await {
                Ok(_) => {
                    evicted = Some(out);
                    break;
                }
                Err(Cas::Changed) => tracing::debug!(key = index_key, "dictionary index changed under us; retrying"),
                Err(Cas::Failed(e)) => return Err(e),
            }
        }
        let evicted = evicted.ok_or_else(|| SinkError::Conflict {
            what: "store dict",
            key: index_key.to_string(),
            attempts: CAS_ATTEMPTS as u32,
        })?;
        let key = format!("{index_key}.{}", dict.id);
        // A put refreshes the entry's age, so a dictionary in use does not expire.
        self.dicts
            .put(&key, Bytes::from(dict.bytes.clone()))
            .await
            .map_err(|e| SinkError::nats("store dict", &key, &e))?;
        for id in evicted {
            let key = format!("{index_key}.{id}");
            if let Err(e) = self.dicts.purge(&key).await {
                tracing::warn!(key, error = %e, "evicted dictionary not deleted; it expires");
            }
            self.metrics.dicts_evicted.inc();
            tracing::info!(edge, id, "dictionary evicted: past the edge's dictionary quota");
        }
        Ok(())
    }
}
