//! The integrity check after an unclean stop, off the start path.
//!
//! `PRAGMA quick_check` reads every page: 1.5 s for a 1.3 GB spool in the page cache, 16 s
//! from a cold disk, and a gateway that reboots after a power cut into a backlog is the common
//! case. So the spool opens at once and this thread runs the check on a connection of its own
//! (a read transaction on the snapshot it starts from; the writer goes on), at the spool
//! threads' background priority.
//!
//! A failed check is written to `<spool>.check-failed` (synced) before anything else; the spool's
//! thread then rebuilds the database from what it can read (`damage.rs`), `/healthz` failing
//! until it is done. If the node stops first, the next open finds that file and salvages the
//! database as if the check had failed there; nothing is deleted. Only damage is a failure: a
//! check that could not run (a lock, an I/O error of the moment), or was still running when the
//! node stopped, is not a pass either, so the clean-close note is not written and the next start
//! checks again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags};

/// Where a check's failure is kept for the next open.
pub(crate) fn sidecar(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".check-failed");
    PathBuf::from(p)
}

/// How the check of this run stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckState {
    Running,
    Passed,
    /// What the check reported.
    Failed(String),
    /// Stopped with the spool before it finished.
    Interrupted,
}

/// The check's thread: interrupted and joined when dropped, so a closed spool leaves no
/// connection behind.
pub(crate) struct IntegrityCheck {
    state: Arc<Mutex<CheckState>>,
    interrupt: rusqlite::InterruptHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for IntegrityCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntegrityCheck").field("state", &self.current()).finish_non_exhaustive()
    }
}

impl IntegrityCheck {
    pub fn start(path: &Path) -> std::io::Result<Self> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(std::io::Error::other)?;
        let interrupt = conn.get_interrupt_handle();
        let state = Arc::new(Mutex::new(CheckState::Running));
        let (kept, path) = (state.clone(), path.to_owned());
        let thread = std::thread::Builder::new().name("spool-check".into()).spawn(move || {
            super::sched::background_priority();
            let started = std::time::Instant::now();
            let result = conn.query_row("PRAGMA quick_check", [], |r| r.get::<_, String>(0));
            let state = match result {
                Ok(ok) if ok == "ok" => {
                    tracing::info!(took = ?started.elapsed(), "spool integrity check passed");
                    CheckState::Passed
                }
                Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::OperationInterrupted => {
                    CheckState::Interrupted
                }
                Ok(report) => failed(&path, format!("quick_check: {report}")),
                Err(e) if super::salvage::is_damage(&e) => failed(&path, format!("quick_check: {e}")),
                // A lock, an I/O error of the moment: no verdict on the database. The check is
                // not passed, so the next start runs it again.
                Err(e) => {
                    tracing::warn!(error = %e, "spool integrity check could not run; it runs again at the next start");
                    CheckState::Interrupted
                }
            };
            *kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = state;
        })?;
        Ok(Self { state, interrupt, thread: Some(thread) })
    }

    /// A handle to the state, for `/healthz`.
    pub(crate) fn state(&self) -> Arc<Mutex<CheckState>> {
        self.state.clone()
    }

    pub(crate) fn current(&self) -> CheckState {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// Notes the failure where the next open finds it, then reports it.
fn failed(path: &Path, report: String) -> CheckState {
    let note = sidecar(path);
    let written = std::fs::File::create(&note).and_then(|mut f| {
        use std::io::Write;
        f.write_all(report.as_bytes())?;
        f.sync_all()
    });
    match written {
        Ok(()) => tracing::error!(
            path = %path.display(),
            report,
            "spool database failed its integrity check; it is moved aside at the next start (restart the node to do it now)"
        ),
        Err(e) => tracing::error!(
            path = %path.display(),
            report,
            note = %note.display(),
            error = %e,
            "spool database failed its integrity check, and the note for the next start could not be written"
        ),
    }
    CheckState::Failed(report)
}

impl Drop for IntegrityCheck {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            // An interrupt before the statement began is lost: repeat it until the thread ends.
            while !thread.is_finished() {
                self.interrupt.interrupt();
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let _ = thread.join();
        }
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *state == CheckState::Running {
            *state = CheckState::Interrupted;
        }
    }
}
