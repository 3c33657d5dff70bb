//! WAL checkpoints off the commit path. SQLite's automatic checkpoint runs inside whichever
//! commit crosses 1,000 WAL pages and fsyncs the database file there: a 4 MiB copy and an fsync
//! that a `normal` message's PUBACK-to-commit window, or a `full` message's PUBACK, then waits
//! for. Instead the spool's connection never checkpoints and this thread, on its own
//! connection, runs a PASSIVE checkpoint (which never blocks the writer) once a second, or as
//! soon as the WAL passes 4 MiB. The WAL thus stays a few MiB (and is truncated back to
//! `journal_size_limit` when it restarts), and flash sees one database fsync a second at most.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rusqlite::Connection;

const PERIOD: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(100);
const WAL_LIMIT: u64 = 4 << 20;

/// Stops the checkpoint thread when dropped, and waits for it (at most one poll): a closed
/// spool then has no connection left, so its files can be copied as they are.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    pub fn start(path: &Path) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let conn = Connection::open(path).map_err(std::io::Error::other)?;
        let wal = {
            let mut p = path.as_os_str().to_owned();
            p.push("-wal");
            PathBuf::from(p)
        };
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name("spool-checkpoint".into()).spawn(move || {
            super::sched::background_priority();
            run(conn, &wal, &flag);
        })?;
        Ok(Self { stop, thread: Some(thread) })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(conn: Connection, wal: &Path, stop: &AtomicBool) {
    let mut last = Instant::now();
    let mut failing = false;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(POLL);
        let size = std::fs::metadata(wal).map_or(0, |m| m.len());
        if size == 0 || (last.elapsed() < PERIOD && size < WAL_LIMIT) {
            continue;
        }
        last = Instant::now();
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            Ok(()) if failing => {
                failing = false;
                tracing::warn!("spool WAL checkpoints succeed again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                // The WAL grows meanwhile; the byte budget still bounds it (compaction
                // checkpoints from the writer when the spool is over budget).
                failing = true;
                tracing::error!(error = %e, "spool WAL checkpoint failed");
            }
            Err(_) => {}
        }
    }
}
