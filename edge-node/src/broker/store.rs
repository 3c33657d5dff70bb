//! Sessions across restarts: the subscriptions, expiry and owner of every session with an
//! expiry above 0, in a SQLite file of their own (`broker.session_store`, beside the spool's by
//! default). Queued and in-flight messages are not stored: after a restart a session resumes
//! with its subscriptions, and messages published while the node was down never reached it.
//!
//! Writes happen on a thread of their own, batched: the core hands over a record whenever a
//! stored session's subscriptions or expiry change, and a name when one ends.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, params};

use super::core::{SessionRecord, SubOptions};
use crate::broker::codec::QoS;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("session store {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("session store {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    client_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expiry INTEGER NOT NULL,
    disconnected_ms INTEGER,
    subscriptions TEXT NOT NULL
);
";

/// A change to write.
#[derive(Debug)]
pub enum StoreOp {
    Put(SessionRecord),
    Forget(String),
    /// Answered once everything sent before it is written.
    Flush(mpsc::Sender<()>),
}

/// The store's writer thread.
#[derive(Debug, Clone)]
pub struct SessionStore {
    tx: mpsc::Sender<StoreOp>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredSub {
    filter: String,
    qos: u8,
    nl: bool,
    rap: bool,
    rh: u8,
    id: Option<u32>,
}

impl SessionStore {
    /// Opens (or creates) the store and returns the sessions it holds. A file that cannot be
    /// read as a store is moved aside (`<name>.corrupt-<ms>`) and started afresh: sessions are
    /// state a client can rebuild, not data to recover.
    pub fn open(path: &Path) -> Result<(SessionStore, Vec<SessionRecord>), StoreError> {
        let sqlite = |source| StoreError::Sqlite { path: path.to_owned(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Io { path: dir.to_owned(), source })?;
        }
        let (conn, records) = match open_and_load(path) {
            Ok(ok) => ok,
            Err(e) => {
                let aside = path.with_extension(format!("corrupt-{}", shared::units::now_ms()));
                tracing::warn!(path = %path.display(), error = %e, aside = %aside.display(), "session store unreadable; moved aside");
                std::fs::rename(path, &aside).map_err(|source| StoreError::Io { path: path.to_owned(), source })?;
                open_and_load(path).map_err(sqlite)?
            }
        };
        let (tx, rx) = mpsc::channel();
        let shown = path.to_owned();
        std::thread::Builder::new()
            .name("session-store".into())
            .spawn(move || write_loop(conn, rx, &shown))
            .map_err(|source| StoreError::Io { path: path.to_owned(), source })?;
        Ok((SessionStore { tx }, records))
    }

    pub fn send(&self, op: StoreOp) {
        // The thread ends only with the process.
        let _ = self.tx.send(op);
    }

    /// Blocks until everything sent so far is written.
    pub fn flush(&self) {
        let (tx, rx) = mpsc::channel();
        self.send(StoreOp::Flush(tx));
        let _ = rx.recv_timeout(Duration::from_secs(5));
    }
}

fn open_and_load(path: &Path) -> rusqlite::Result<(Connection, Vec<SessionRecord>)> {
    let conn = Connection::open(path)?;
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")?;
    conn.execute_batch(SCHEMA)?;
    let records = {
        let mut stmt = conn.prepare("SELECT client_id, owner, expiry, disconnected_ms, subscriptions FROM sessions")?;
        let rows = stmt.query_map([], |r| {
            let subs: String = r.get(4)?;
            let subs: Vec<StoredSub> = serde_json::from_str(&subs).unwrap_or_default();
            Ok(SessionRecord {
                client_id: r.get(0)?,
                owner: r.get(1)?,
                expiry: r.get(2)?,
                disconnected_ms: r.get(3)?,
                subscriptions: subs
                    .into_iter()
                    .filter_map(|s| {
                        let opts = SubOptions {
                            qos: QoS::from_bits(s.qos)?,
                            no_local: s.nl,
                            retain_as_published: s.rap,
                            retain_handling: s.rh.min(2),
                            id: s.id,
                        };
                        Some((s.filter, opts))
                    })
                    .collect(),
            })
        })?;
        rows.collect::<rusqlite::Result<Vec<_>>>()?
    };
    Ok((conn, records))
}

fn write_loop(mut conn: Connection, rx: mpsc::Receiver<StoreOp>, path: &Path) {
    while let Ok(first) = rx.recv() {
        let mut ops = vec![first];
        // Whatever else came within a moment goes in the same transaction.
        while let Ok(op) = rx.recv_timeout(Duration::from_millis(5)) {
            ops.push(op);
            if ops.len() >= 1024 {
                break;
            }
        }
        if let Err(e) = write(&mut conn, &ops) {
            tracing::warn!(path = %path.display(), error = %e, changes = ops.len(), "session store write failed");
        }
        for op in ops {
            if let StoreOp::Flush(done) = op {
                let _ = done.send(());
            }
        }
    }
}

fn write(conn: &mut Connection, ops: &[StoreOp]) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    for op in ops {
        match op {
            StoreOp::Put(r) => {
                let subs: Vec<StoredSub> = r
                    .subscriptions
                    .iter()
                    .map(|(filter, o)| StoredSub {
                        filter: filter.clone(),
                        qos: o.qos as u8,
                        nl: o.no_local,
                        rap: o.retain_as_published,
                        rh: o.retain_handling,
                        id: o.id,
                    })
                    .collect();
                tx.execute(
                    "INSERT OR REPLACE INTO sessions (client_id, owner, expiry, disconnected_ms, subscriptions) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![
                        r.client_id,
                        r.owner,
                        r.expiry,
                        r.disconnected_ms,
                        serde_json::to_string(&subs).unwrap_or_default()
                    ],
                )?;
            }
            StoreOp::Forget(id) => {
                tx.execute("DELETE FROM sessions WHERE client_id = ?1", [id])?;
            }
            StoreOp::Flush(_) => {}
        }
    }
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> SessionRecord {
        SessionRecord {
            client_id: id.into(),
            owner: "user:a".into(),
            expiry: 600,
            subscriptions: vec![(
                "a/#".into(),
                SubOptions {
                    qos: QoS::ExactlyOnce,
                    no_local: true,
                    retain_as_published: true,
                    retain_handling: 1,
                    id: Some(7),
                },
            )],
            disconnected_ms: Some(42),
        }
    }

    #[test]
    fn records_survive_a_reopen_and_forgotten_ones_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.db");
        {
            let (store, loaded) = SessionStore::open(&path).unwrap();
            assert!(loaded.is_empty());
            store.send(StoreOp::Put(record("a")));
            store.send(StoreOp::Put(record("b")));
            store.send(StoreOp::Forget("b".into()));
            store.flush();
        }
        let (_, loaded) = open_and_load(&path).unwrap();
        assert_eq!(loaded, vec![record("a")]);
    }

    #[test]
    fn an_unreadable_store_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.db");
        std::fs::write(&path, b"not a database at all, just some bytes that are long enough").unwrap();
        let (_, loaded) = SessionStore::open(&path).unwrap();
        assert!(loaded.is_empty());
        assert!(
            std::fs::read_dir(dir.path()).unwrap().any(|e| e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("corrupt"))
        );
    }
}
