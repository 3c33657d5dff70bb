//! The embedded sink: one SQLite file, records unique by (edge, epoch, lane, seq) so a resent
//! record is ignored, a batch's records in one transaction and its mark in a later one (see the
//! module doc of `sink`), `synchronous=FULL` so an ack means on disk.
//!
//! Dead letters: SQLite refuses nothing a record can carry within the protocol's limits (a
//! message is at most 8 MiB, a value up to 1 GB), so no record is set aside here. Its failures
//! are the file's (a lock held by another process, a full disk, I/O errors) and are retried.
//!
//! An edge's epochs are a JSON row of `edge_epochs`, its dictionaries rows of `edge_dicts`,
//! each changed in one transaction with what it retires or evicts (`sink::quota`). The
//! `dicts` table of earlier versions, shared by all edges, is no longer read.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use shared::proto::{DictAnnounce, LaneSeq, RecordBody, WireRecord};

use super::quota::{DictIndex, EdgeQuota, EpochVerdict, Epochs, StoredDict};
use super::{
    BridgeState, DictStore, EdgeState, FleetStates, FleetStore, RecordSink, Retry, SinkError, SinkMetrics,
    StoredReport, Turn,
};
use shared::units::now_ms;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS records (
    edge_id TEXT NOT NULL,
    epoch TEXT NOT NULL,
    lane INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    class TEXT NOT NULL,
    topic TEXT,
    payload BLOB NOT NULL,
    qos INTEGER,
    enqueued_ms INTEGER,
    headers TEXT,
    received_ms INTEGER NOT NULL,
    PRIMARY KEY (edge_id, epoch, lane, seq)
);
CREATE TABLE IF NOT EXISTS marks (
    edge_id TEXT NOT NULL,
    epoch TEXT NOT NULL,
    lane INTEGER NOT NULL,
    committed INTEGER NOT NULL,
    PRIMARY KEY (edge_id, epoch, lane)
);
CREATE TABLE IF NOT EXISTS tco_reports (
    edge_id TEXT PRIMARY KEY,
    received_ms INTEGER NOT NULL,
    report TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS edge_epochs (
    edge_id TEXT PRIMARY KEY,
    epochs TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS fleet_edges (
    edge_id TEXT PRIMARY KEY,
    session INTEGER NOT NULL,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS fleet_bridges (
    name TEXT PRIMARY KEY,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS edge_dicts (
    edge_id TEXT NOT NULL,
    id TEXT NOT NULL,
    class TEXT NOT NULL,
    bytes BLOB NOT NULL,
    stored_ms INTEGER NOT NULL,
    PRIMARY KEY (edge_id, id)
);
";

#[derive(Debug, Clone)]
pub struct SqliteSink {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    pub(super) metrics: Arc<SinkMetrics>,
    quota: EdgeQuota,
}

/// How long a write waits for a lock another process holds before it counts as failed and is
/// retried with backoff ([`Retry`]), so a long lock shows in the metrics and the log.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(250);

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
                        r.seq,
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
                    r.seq,
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

/// A SQLite error of the file at `path`, naming it.
fn at(what: &'static str, path: &Path) -> impl FnOnce(rusqlite::Error) -> SinkError {
    move |e| match SinkError::sqlite(what, e) {
        SinkError::Sqlite { what, code, reason } => {
            SinkError::Sqlite { what, code, reason: format!("{}: {reason}", path.display()) }
        }
        other => other,
    }
}

impl SqliteSink {
    pub fn open(path: &Path) -> Result<Self, SinkError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| SinkError::Io {
                what: "directory",
                path: dir.into(),
                source,
            })?;
        }
        let mut conn = Connection::open(path).map_err(at("open", path))?;
        conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;")
            .and_then(|_| conn.execute_batch(SCHEMA))
            .and_then(|_| conn.execute_batch(super::downlink::sqlite::SCHEMA))
            .and_then(|_| conn.execute_batch(super::schemas::sqlite::SCHEMA))
            .map_err(at("schema", path))?;
        super::downlink::sqlite::migrate(&mut conn).map_err(at("downlink schema", path))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| SinkError::sqlite("open", e))?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_owned(),
            metrics: Arc::default(),
            quota: EdgeQuota::default(),
        })
    }

    /// Keeps each edge within `quota` from now on.
    pub fn with_quota(mut self, quota: EdgeQuota) -> Self {
        self.quota = quota;
        self
    }

    /// Counts into `metrics` (the bridge's registry) from now on.
    pub fn with_metrics(mut self, metrics: Arc<SinkMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, SinkError> + Send + 'static,
    ) -> Result<T, SinkError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn =
                conn.lock().map_err(|_| SinkError::Task { what: "lock", reason: "poisoned by a panic".into() })?;
            f(&mut conn)
        })
        .await
        .map_err(|e| SinkError::Task { what: "sqlite", reason: e.to_string() })?
    }
}

impl RecordSink for SqliteSink {
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
                .query_map(params![edge, epoch], |r| Ok(LaneSeq { lane: r.get(0)?, seq: r.get(1)? }))
                .map_err(|e| SinkError::sqlite("read marks", e))?;
            rows.collect::<Result<Vec<_>, _>>().map_err(|e| SinkError::sqlite("read marks", e))
        })
        .await
    }

    fn publish(
        &self,
        edge: String,
        epoch: String,
        lane: u8,
        records: Vec<WireRecord>,
        _turn: Turn,
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        // Order by seq is the table's key: a later batch landing first changes nothing a
        // reader by seq sees, so the turn is not awaited and batches commit side by side.
        let sink = self.clone();
        let records = Arc::new(records);
        async move {
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

impl FleetStore for SqliteSink {
    async fn store_report(&self, report: &StoredReport) -> Result<(), SinkError> {
        let json = serde_json::to_string(&report.report).map_err(|e| SinkError::invalid("store report", e))?;
        let (edge, at) = (report.edge.clone(), report.received_ms);
        self.blocking(move |conn| {
            conn.execute(
                "INSERT OR REPLACE INTO tco_reports (edge_id, received_ms, report) VALUES (?1, ?2, ?3)",
                params![edge, at, json],
            )
            .map(|_| ())
            .map_err(|e| SinkError::sqlite("store report", e))
        })
        .await
    }

    async fn load_reports(&self) -> Result<Vec<StoredReport>, SinkError> {
        self.blocking(move |conn| {
            let mut stmt = conn
                .prepare_cached("SELECT edge_id, received_ms, report FROM tco_reports ORDER BY edge_id")
                .map_err(|e| SinkError::sqlite("read reports", e))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?, r.get::<_, String>(2)?)))
                .map_err(|e| SinkError::sqlite("read reports", e))?;
            let mut out = Vec::new();
            for row in rows {
                let (edge, received_ms, json) = row.map_err(|e| SinkError::sqlite("read reports", e))?;
                let report = serde_json::from_str(&json).map_err(|e| SinkError::corrupt("read reports", &edge, e))?;
                out.push(StoredReport { edge, received_ms, report });
            }
            Ok(out)
        })
        .await
    }

    async fn store_edge_states(&self, states: Vec<EdgeState>) -> Result<Vec<bool>, SinkError> {
        self.blocking(move |conn| {
            let tx = conn.transaction().map_err(|e| SinkError::sqlite("begin", e))?;
            let mut stored = Vec::with_capacity(states.len());
            for state in &states {
                let json = serde_json::to_string(state).map_err(|e| SinkError::invalid("store edge state", e))?;
                // The session id is random: its bits as SQLite's signed integer.
                let session = state.session as i64;
                let sql = if state.connected {
                    "INSERT OR REPLACE INTO fleet_edges (edge_id, session, state) VALUES (?1, ?2, ?3)"
                } else {
                    // An end replaces only its own session (`EdgeState::replaces`).
                    "INSERT INTO fleet_edges (edge_id, session, state) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (edge_id) DO UPDATE SET state = excluded.state \
                     WHERE fleet_edges.session = excluded.session"
                };
                let changed = tx
                    .prepare_cached(sql)
                    .and_then(|mut stmt| stmt.execute(params![state.edge, session, json]))
                    .map_err(|e| SinkError::sqlite("store edge state", e))?;
                stored.push(changed > 0);
            }
            tx.commit().map_err(|e| SinkError::sqlite("commit", e))?;
            Ok(stored)
        })
        .await
    }

    async fn store_bridge_state(&self, state: &BridgeState) -> Result<(), SinkError> {
        let json = serde_json::to_string(state).map_err(|e| SinkError::invalid("store bridge state", e))?;
        let name = state.name.clone();
        self.blocking(move |conn| {
            conn.execute("INSERT OR REPLACE INTO fleet_bridges (name, state) VALUES (?1, ?2)", params![name, json])
                .map(|_| ())
                .map_err(|e| SinkError::sqlite("store bridge state", e))
        })
        .await
    }

    async fn load_fleet(&self) -> Result<FleetStates, SinkError> {
        self.blocking(move |conn| {
            fn all<T: serde::de::DeserializeOwned>(conn: &Connection, sql: &str) -> Result<Vec<T>, SinkError> {
                let mut stmt = conn.prepare_cached(sql).map_err(|e| SinkError::sqlite("read fleet", e))?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
                    .map_err(|e| SinkError::sqlite("read fleet", e))?;
                let mut out = Vec::new();
                for row in rows {
                    let (key, json) = row.map_err(|e| SinkError::sqlite("read fleet", e))?;
                    out.push(serde_json::from_str(&json).map_err(|e| SinkError::corrupt("read fleet", &key, e))?);
                }
                Ok(out)
            }
            Ok(FleetStates {
                edges: all(conn, "SELECT edge_id, state FROM fleet_edges ORDER BY edge_id")?,
                bridges: all(conn, "SELECT name, state FROM fleet_bridges ORDER BY name")?,
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::proto::WireMessage;

    fn record(seq: u64) -> WireRecord {
        WireRecord::message(
            seq,
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
        assert_eq!(sink.committed("e1", "ep").await.unwrap(), vec![LaneSeq { lane: 2, seq: 5 }]);
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
        assert_eq!(sink.committed("e1", "ep").await.unwrap(), vec![LaneSeq { lane: 0, seq: 3 }]);
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
