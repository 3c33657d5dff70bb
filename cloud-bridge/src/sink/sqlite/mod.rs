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

mod dicts;
mod downlink;
mod fleet;
pub(in crate::sink) mod inspect;
mod records;
mod schema;
mod schemas;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

use crate::sink::error::SinkError;
use crate::sink::metrics::SinkMetrics;
use crate::sink::quota::EdgeQuota;

pub use records::Staged;

#[derive(Debug, Clone)]
pub struct SqliteSink {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    metrics: Arc<SinkMetrics>,
    quota: EdgeQuota,
}

/// How long a write waits for a lock another process holds before it counts as failed and is
/// retried with backoff ([`crate::sink::Retry`]), so a long lock shows in the metrics and the log.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(250);

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
        schema::create(&mut conn).map_err(|(what, e)| at(what, path)(e))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| SinkError::sqlite("open", e))?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_owned(),
            metrics: Arc::default(),
            quota: EdgeQuota::default(),
        })
    }

    /// Keeps each edge within `quota` from now on.
    pub(crate) fn with_quota(mut self, quota: EdgeQuota) -> Self {
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
