//! Ops sent to the session store's thread and not yet committed: their bound (the clients'
//! readers wait past it), and the store's health as `/readyz` reads it (whether commits make
//! progress, or fail, while ops wait).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::gauge::Gauge;
use shared::units::now_ms;

use super::super::core::StoreOp;
use super::super::message::Message;

/// Ops sent and not yet committed past which client readers wait for the store.
pub const MAX_PENDING_OPS: usize = 65_536;

/// Bytes that ops sent and not yet committed hold ([`backlog_bytes`]) past which client readers
/// wait for the store: a record carries every subscription of its session (up to
/// `max_subscriptions` x `max_topic_length`), so a SUBSCRIBE/UNSUBSCRIBE loop queued gigabytes
/// within the op bound; and an op keeps its message alive until it commits, so a flood of
/// retained QoS 0 messages, each replacing the last, held a gigabyte of messages no one else
/// held while the store was slow.
pub const MAX_PENDING_BYTES: usize = 16 << 20;

/// What `ops`, made by one call on the core and sent together, hold until they commit: each
/// session record's strings and mark's value, and each message once however many of them
/// refer to it (a publish queued for twenty durable sessions is one message). What
/// [`MAX_PENDING_BYTES`] counts.
pub fn backlog_bytes(ops: &[(u64, StoreOp)]) -> usize {
    let mut messages: Vec<&Arc<Message>> = Vec::new();
    let mut bytes = 0;
    for (_, op) in ops {
        match op {
            StoreOp::Session(r) => {
                bytes += 64
                    + r.client_id.len()
                    + r.owner.len()
                    + r.subscriptions.iter().map(|(f, _)| f.len() + 32).sum::<usize>()
            }
            StoreOp::Mark { value, .. } => bytes += 32 + value.len(),
            StoreOp::Queue(d) => messages.push(&d.msg),
            StoreOp::Done { msg, .. } | StoreOp::Retain { msg: Some(msg), .. } => messages.push(msg),
            StoreOp::Will { will: Some(w), .. } => messages.push(&w.msg),
            StoreOp::Forget { msgs, .. } => messages.extend(msgs),
            _ => {}
        }
    }
    messages.sort_unstable_by_key(|m| Arc::as_ptr(m));
    messages.dedup_by_key(|m| Arc::as_ptr(m));
    bytes + messages.iter().map(|m| m.weight()).sum::<usize>()
}

/// Whether `ops` waiting for the store, holding `bytes` ([`backlog_bytes`]), leave room for the
/// clients' readers to go on.
pub fn within_bounds(ops: usize, bytes: usize) -> bool {
    ops <= MAX_PENDING_OPS && bytes <= MAX_PENDING_BYTES
}

/// Ops sent and not yet committed, and a wake-up for those waiting for room. The session
/// store's thread keeps one; the whole-system simulation keeps one on its virtual clock
/// (the `_at` methods), so `/readyz`'s verdict is checked against what its disk did.
#[derive(Debug, Default)]
pub struct Backlog {
    ops: AtomicUsize,
    bytes: AtomicUsize,
    /// When the store last made progress while ops waited (ms): when the first op came to an
    /// empty backlog, or the last commit. How long ops have waited without any commit.
    since_ms: AtomicU64,
    /// The last commit's error, while commits fail.
    failing: Mutex<Option<String>>,
    pub(super) drained: tokio::sync::Notify,
    /// `session_store_pending_ops`: set as ops come as well as when they commit, so a store that
    /// never commits shows what waits.
    pending: Gauge,
}

/// The session store as `/readyz` sees it ([`super::SessionStore::health`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StoreHealth {
    /// Ops waiting for a commit, and what they hold.
    pub ops: usize,
    pub bytes: usize,
    /// Since when no commit was made while ops waited (ms), when ops wait.
    pub stalled_since_ms: Option<u64>,
    /// The last commit's error, while commits fail.
    pub failing: Option<String>,
}

impl Backlog {
    pub(crate) fn new(pending: Gauge) -> Self {
        Self { pending, ..Self::default() }
    }

    /// Ops sent, holding `bytes`.
    pub(super) fn add(&self, ops: usize, bytes: usize) {
        self.add_at(ops, bytes, now_ms());
    }

    /// [`Backlog::add`] at `now` (ms since the Unix epoch).
    pub fn add_at(&self, ops: usize, bytes: usize, now: u64) {
        if self.ops.fetch_add(ops, Relaxed) == 0 {
            self.since_ms.store(now, Relaxed);
        }
        self.bytes.fetch_add(bytes, Relaxed);
        self.pending.set(self.ops.load(Relaxed) as i64);
    }

    /// `ops` holding `bytes` committed: readers waiting for room go on.
    pub(super) fn committed(&self, ops: usize, bytes: usize) {
        self.committed_at(ops, bytes, now_ms());
    }

    /// [`Backlog::committed`] at `now` (ms since the Unix epoch).
    pub fn committed_at(&self, ops: usize, bytes: usize, now: u64) {
        self.since_ms.store(now, Relaxed);
        let left = self.ops.fetch_sub(ops, Relaxed) - ops;
        self.bytes.fetch_sub(bytes, Relaxed);
        self.pending.set(left as i64);
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.drained.notify_waiters();
    }

    /// A commit failed with `error`; it is tried again.
    pub fn failed(&self, error: String) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
    }

    pub fn within_bounds(&self) -> bool {
        within_bounds(self.ops.load(Relaxed), self.bytes.load(Relaxed))
    }

    pub fn health(&self) -> StoreHealth {
        let ops = self.ops.load(Relaxed);
        StoreHealth {
            ops,
            bytes: self.bytes.load(Relaxed),
            stalled_since_ms: (ops > 0).then(|| self.since_ms.load(Relaxed)),
            failing: self.failing.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_names_ops_waiting_since_the_last_progress_and_a_failing_commit() {
        let b = Backlog::new(Gauge::default());
        assert_eq!(b.health(), StoreHealth { ops: 0, bytes: 0, stalled_since_ms: None, failing: None });
        let before = now_ms();
        b.add(3, 300);
        let h = b.health();
        assert_eq!((h.ops, h.bytes), (3, 300));
        assert!(h.stalled_since_ms.is_some_and(|t| t >= before));
        assert_eq!(b.pending.get(), 3, "the gauge shows ops as they come, not only at commits");
        b.failed("database is locked".into());
        assert_eq!(b.health().failing.as_deref(), Some("database is locked"));
        b.committed(2, 200);
        let h = b.health();
        assert_eq!((h.ops, h.bytes, h.failing), (1, 100, None));
        assert_eq!(b.pending.get(), 1);
        b.committed(1, 100);
        assert_eq!(b.health().stalled_since_ms, None);
    }
}
