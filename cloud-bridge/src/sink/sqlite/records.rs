//! Edge records in SQLite: epochs registered, a batch's records in one transaction, marks
//! raised in another.

use rusqlite::{Connection, OptionalExtension, params};
use shared::proto::{Lane, LaneSeq, RecordBody, Seq, WireRecord};
use shared::units::now_ms;

use std::sync::Arc;

use super::{SqliteSink, at};
use crate::sink::RecordSink;
use crate::sink::error::SinkError;
use crate::sink::quota::{EpochVerdict, Epochs};
use crate::sink::retry::Retry;

/// One batch's records in one transaction; a record stored before is kept as it was.
fn insert(conn: &mut Connection, edge: &str, epoch: &str, lane: u8, records: &[WireRecord]) -> Result<(), SinkError> {
    let tx = conn.transaction().map_err(|e| SinkError::sqlite("begin", e))?;
    {
        let mut insert = tx
            .prepare_cached(
                "INSERT OR IGNORE INTO records (edge_id, epoch, lane, seq, kind, class, topic, payload, qos, \
                 enqueued_ms, headers, received_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )
            .map_err(|e| SinkError::sqlite("insert", e))?;
        let received = now_ms();
        for r in records {
            let result = match &r.body {
                RecordBody::Message(m) => {
                    let headers = crate::names::headers(m);
                    insert.execute(params![
                        edge,
                        epoch,
                        lane,
                        r.seq.0,
                        "message",
                        m.class,
                        m.topic,
                        m.payload,
                        m.qos,
                        m.enqueued_ms,
                        serde_json::to_string(&headers).unwrap_or_default(),
                        received
                    ])
                }
                RecordBody::Gap(g) => insert.execute(params![
                    edge,
                    epoch,
                    lane,
                    r.seq.0,
                    "gap",
                    g.class,
                    None::<String>,
                    serde_json::to_vec(g).unwrap_or_default(),
                    None::<u8>,
                    None::<u64>,
                    None::<String>,
                    received
                ]),
            };
            result.map_err(|e| SinkError::sqlite("insert", e))?;
        }
    }
    tx.commit().map_err(|e| SinkError::sqlite("commit", e))
}

/// A batch for [`SqliteSink`]: its records as received.
#[derive(Debug)]
pub struct Staged {
    edge: String,
    epoch: String,
    lane: u8,
    records: Arc<Vec<WireRecord>>,
}

impl RecordSink for SqliteSink {
    type Staged = Staged;

    /// Rows are keyed and read by seq, so the order batches commit in does not matter.
    fn pipeline(&self) -> usize {
        8
    }

    async fn admit_epoch(&self, edge: &str, epoch: &str) -> Result<EpochVerdict, SinkError> {
        let (edge, epoch, quota, metrics) = (edge.to_owned(), epoch.to_owned(), self.quota, self.metrics.clone());
        self.blocking(move |conn| {
            let tx = conn.transaction().map_err(|e| SinkError::sqlite("begin", e))?;
            let json: Option<String> = tx
                .query_row("SELECT epochs FROM edge_epochs WHERE edge_id = ?1", [&edge], |r| r.get(0))
                .optional()
                .map_err(|e| SinkError::sqlite("read epochs", e))?;
            let mut epochs: Epochs = match json {
                Some(j) => serde_json::from_str(&j).map_err(|e| SinkError::corrupt("read epochs", &edge, e))?,
                None => Epochs::default(),
            };
            let verdict = epochs.admit(&epoch, now_ms(), &quota);
            let EpochVerdict::Added { retired } = &verdict else { return Ok(verdict) };
            let json = serde_json::to_string(&epochs).map_err(|e| SinkError::invalid("register epoch", e))?;
            tx.execute("INSERT OR REPLACE INTO edge_epochs (edge_id, epochs) VALUES (?1, ?2)", params![edge, json])
                .map_err(|e| SinkError::sqlite("register epoch", e))?;
            for old in retired {
                tx.execute("DELETE FROM marks WHERE edge_id = ?1 AND epoch = ?2", params![edge, old])
                    .map_err(|e| SinkError::sqlite("retire epoch", e))?;
            }
            tx.commit().map_err(|e| SinkError::sqlite("commit", e))?;
            metrics.epochs_registered.inc();
            for old in retired {
                metrics.epochs_retired.inc();
                tracing::info!(edge, epoch = old, "epoch retired: more than limits.epochs_per_edge");
            }
            Ok(verdict)
        })
        .await
    }

    async fn committed(&self, edge: &str, epoch: &str) -> Result<Vec<LaneSeq>, SinkError> {
        let (edge, epoch) = (edge.to_owned(), epoch.to_owned());
        self.blocking(move |conn| {
            let mut stmt = conn
                .prepare_cached("SELECT lane, committed FROM marks WHERE edge_id = ?1 AND epoch = ?2 ORDER BY lane")
                .map_err(|e| SinkError::sqlite("read marks", e))?;
            let rows = stmt
                .query_map(params![edge, epoch], |r| Ok(LaneSeq { lane: Lane(r.get(0)?), seq: Seq(r.get(1)?) }))
                .map_err(|e| SinkError::sqlite("read marks", e))?;
            rows.collect::<Result<Vec<_>, _>>().map_err(|e| SinkError::sqlite("read marks", e))
        })
        .await
    }

    /// Nothing to do ahead: a batch is one transaction.
    fn stage(
        &self,
        edge: String,
        epoch: String,
        lane: u8,
        records: Vec<WireRecord>,
    ) -> impl Future<Output = Result<Staged, SinkError>> + Send + 'static {
        std::future::ready(Ok(Staged { edge, epoch, lane, records: Arc::new(records) }))
    }

    fn publish(&self, staged: Staged) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        let sink = self.clone();
        async move {
            let Staged { edge, epoch, lane, records } = staged;
            let mut retry = Retry::default();
            loop {
                let (edge, epoch, records) = (edge.clone(), epoch.clone(), records.clone());
                match sink.blocking(move |conn| insert(conn, &edge, &epoch, lane, &records)).await {
                    Ok(()) => {
                        sink.metrics.wrote();
                        return Ok(());
                    }
                    Err(e) => retry.wait("sqlite insert", &e, &sink.metrics).await,
                }
            }
        }
    }

    /// A write lock taken and given back: what another process holding the file locked, a
    /// read-only or vanished file, or a full disk's journal refuses.
    async fn probe(&self) -> Result<(), SinkError> {
        let path = self.path.clone();
        self.blocking(move |conn| conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;").map_err(at("probe", &path))).await
    }

    async fn mark(&self, edge: &str, epoch: &str, lane: u8, up_to: u64) -> Result<(), SinkError> {
        let mut retry = Retry::default();
        loop {
            let (edge, epoch) = (edge.to_owned(), epoch.to_owned());
            let result = self
                .blocking(move |conn| {
                    conn.execute(
                        "INSERT INTO marks (edge_id, epoch, lane, committed) VALUES (?1, ?2, ?3, ?4) \
                         ON CONFLICT (edge_id, epoch, lane) DO UPDATE SET committed = max(committed, excluded.committed)",
                        params![edge, epoch, lane, up_to],
                    )
                    .map(|_| ())
                    .map_err(|e| SinkError::sqlite("mark", e))
                })
                .await;
            match result {
                Ok(()) => return Ok(()),
                Err(e) => retry.wait("sqlite mark", &e, &self.metrics).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::{FleetStore, SinkMetrics};
    use shared::proto::WireMessage;

    fn record(seq: u64) -> WireRecord {
        WireRecord::message(
            Seq(seq),
            WireMessage {
                class: "telemetry".into(),
                topic: "inference/yolo-edge/v3.2.1/cam-03".into(),
                payload: vec![seq as u8],
                qos: 1,
                enqueued_ms: 1,
                expires_ms: None,
                user_properties: vec![("trace-id".into(), "t".into())],
                correlation_data: None,
                content_type: None,
                schema: None,
            },
        )
    }

    #[tokio::test]
    async fn writes_are_idempotent_and_marks_only_advance() {
        let dir = tempfile::tempdir().unwrap();
        let sink = SqliteSink::open(&dir.path().join("central.db")).unwrap();
        sink.write("e1", "ep", 2, (1..=3).map(record).collect(), 3).await.unwrap();
        sink.write("e1", "ep", 2, (2..=5).map(record).collect(), 5).await.unwrap();
        sink.write("e1", "ep", 2, vec![record(4)], 4).await.unwrap();
        assert_eq!(sink.committed("e1", "ep").await.unwrap(), vec![LaneSeq { lane: Lane(2), seq: Seq(5) }]);
        assert!(sink.committed("e1", "other").await.unwrap().is_empty());
        let conn = Connection::open(sink.path()).unwrap();
        let n: i64 = conn.query_row("SELECT count(*) FROM records", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 5);
    }

    #[tokio::test]
    async fn a_write_blocked_by_another_process_lock_is_retried_not_failed() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(SinkMetrics::default());
        let sink = SqliteSink::open(&dir.path().join("central.db")).unwrap().with_metrics(metrics.clone());
        let other = Connection::open(sink.path()).unwrap();
        other.execute_batch("BEGIN EXCLUSIVE").unwrap();
        let writing = tokio::spawn({
            let sink = sink.clone();
            async move { sink.write("e1", "ep", 0, (1..=3).map(record).collect(), 3).await }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while metrics.retries.get() == 0 {
            assert!(std::time::Instant::now() < deadline, "no retry counted while the lock is held");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(!writing.is_finished(), "the write waits for the lock");
        assert!(!metrics.healthy(), "the wait shows in the metrics");
        other.execute_batch("COMMIT").unwrap();
        writing.await.unwrap().unwrap();
        assert!(metrics.healthy());
        assert_eq!(sink.committed("e1", "ep").await.unwrap(), vec![LaneSeq { lane: Lane(0), seq: Seq(3) }]);
    }

    /// Errors say what kind they are: a stored value that does not parse is `Corrupt` naming
    /// its key (not a SQLite failure, not retried as one); a file that is no database is
    /// SQLite's own code (26, SQLITE_NOTADB) with the path; a missing parent directory that
    /// cannot be made is `Io` naming it.
    #[tokio::test]
    async fn errors_are_typed_with_the_sinks_own_codes() {
        let dir = tempfile::tempdir().unwrap();
        let sink = SqliteSink::open(&dir.path().join("central.db")).unwrap();
        let conn = Connection::open(sink.path()).unwrap();
        conn.execute("INSERT INTO tco_reports (edge_id, received_ms, report) VALUES ('edge-7', 1, '{not json')", [])
            .unwrap();
        match sink.load_reports().await {
            Err(SinkError::Corrupt { key, .. }) => assert_eq!(key, "edge-7"),
            other => panic!("{other:?}"),
        }

        let garbage = dir.path().join("garbage.db");
        std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
        match SqliteSink::open(&garbage) {
            Err(SinkError::Sqlite { code: 26, reason, .. }) => assert!(reason.contains("garbage.db"), "{reason}"),
            other => panic!("{other:?}"),
        }

        let file = dir.path().join("a-file");
        std::fs::write(&file, b"").unwrap();
        match SqliteSink::open(&file.join("central.db")) {
            Err(e @ SinkError::Io { .. }) => assert!(e.to_string().contains("a-file"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
