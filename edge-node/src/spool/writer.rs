//! The spool's own thread. Connections send appends over a bounded channel; the thread batches
//! them into group commits (up to `commit_batch` records, or what arrives within
//! `commit_interval`; at once when a `full` append is waiting for its PUBACK), commits, and
//! answers `full` appends only after their commit. SQLite stays on one thread; the async front
//! never waits on disk except for a `full` PUBACK.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::oneshot;

use super::{Durability, Lane, Message, Seq, Spool, SqliteStorage};

/// Why a `full` append got no PUBACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    #[error("spool budget full: the message was refused")]
    Refused,
    #[error("spool commit failed")]
    CommitFailed,
    #[error("spool writer stopped")]
    Stopped,
}

/// Where a `full` append learns its fate.
type Done = oneshot::Sender<Result<Seq, AppendError>>;

enum Request {
    Append { lane: Lane, message: Box<Message>, durability: Durability, done: Option<Done> },
    Shutdown(oneshot::Sender<()>),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    pub class: String,
    pub reason: &'static str,
}

/// Metric handles the writer updates.
#[derive(Debug, Clone)]
pub struct WriterMetrics {
    pub appended: Family<crate::metrics::ClassLabel, Counter>,
    pub dropped: Family<DropLabels, Counter>,
    pub refused: Counter,
    pub commit_errors: Counter,
    pub commit_seconds: Histogram,
}

/// A handle to the spool thread.
#[derive(Debug, Clone)]
pub struct SpoolWriter {
    tx: flume::Sender<Request>,
}

impl SpoolWriter {
    /// Starts the spool thread over `spool`.
    pub fn start(
        spool: Spool<SqliteStorage>,
        commit_interval: Duration,
        commit_batch: usize,
        metrics: Arc<WriterMetrics>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = flume::bounded(commit_batch.max(1) * 8);
        std::thread::Builder::new()
            .name("spool-writer".into())
            .spawn(move || run(spool, rx, commit_interval, commit_batch.max(1), &metrics))?;
        Ok(Self { tx })
    }

    /// Queues `message`. For `full` durability the returned receiver resolves once it is
    /// committed (or refused); `normal` messages are committed within `commit_interval`.
    pub async fn append(
        &self,
        lane: Lane,
        message: Message,
        durability: Durability,
    ) -> Result<Option<oneshot::Receiver<Result<Seq, AppendError>>>, AppendError> {
        let (done, rx) = if durability == Durability::Full {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        self.tx
            .send_async(Request::Append { lane, message: Box::new(message), durability, done })
            .await
            .map_err(|_| AppendError::Stopped)?;
        Ok(rx)
    }

    /// Commits what is queued and stops the thread.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send_async(Request::Shutdown(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn count_dropped(spool: &mut Spool<SqliteStorage>, metrics: &WriterMetrics) {
    for (class, reason, count) in spool.take_dropped() {
        let reason = match reason {
            super::GapReason::Evicted => "evicted",
            super::GapReason::Expired => "expired",
            super::GapReason::Refused => "refused",
        };
        crate::metrics::handle(&metrics.dropped, &DropLabels { class, reason }).inc_by(count);
    }
}

fn run(
    mut spool: Spool<SqliteStorage>,
    rx: flume::Receiver<Request>,
    commit_interval: Duration,
    commit_batch: usize,
    metrics: &WriterMetrics,
) {
    const EXPIRY_TICK: Duration = Duration::from_secs(1);
    let mut last_expiry = Instant::now();
    loop {
        if last_expiry.elapsed() >= EXPIRY_TICK {
            last_expiry = Instant::now();
            if let Err(e) = spool.expire(now_ms()) {
                tracing::error!(error = %e, "spool expiry failed");
            }
            count_dropped(&mut spool, metrics);
        }
        let first = match rx.recv_timeout(EXPIRY_TICK) {
            Ok(r) => r,
            Err(flume::RecvTimeoutError::Timeout) => continue,
            Err(flume::RecvTimeoutError::Disconnected) => {
                let _ = spool.flush();
                return;
            }
        };
        let mut batch = vec![first];
        let deadline = Instant::now() + commit_interval;
        while batch.len() < commit_batch {
            let urgent = batch.iter().any(|r| !matches!(r, Request::Append { done: None, .. }));
            let next = if urgent { rx.try_recv().ok() } else { rx.recv_deadline(deadline).ok() };
            match next {
                Some(r) => batch.push(r),
                None => break,
            }
        }

        let mut waiters: Vec<(Done, Result<Seq, AppendError>)> = Vec::new();
        let mut shutdown = None;
        for request in batch {
            match request {
                Request::Append { lane, message, durability: Durability::Full, done } => {
                    let class = crate::metrics::class_label(&message.class);
                    let result = spool.append_full(lane, *message).map_err(|_| AppendError::Refused);
                    if result.is_err() {
                        metrics.refused.inc();
                    } else {
                        crate::metrics::handle(&metrics.appended, &class).inc();
                    }
                    if let Some(done) = done {
                        waiters.push((done, result));
                    }
                }
                Request::Append { lane, message, durability, .. } => {
                    crate::metrics::handle(&metrics.appended, &crate::metrics::class_label(&message.class)).inc();
                    spool.append(lane, *message, durability);
                }
                Request::Shutdown(done) => shutdown = Some(done),
            }
        }
        let started = Instant::now();
        let committed = spool.flush();
        metrics.commit_seconds.observe(started.elapsed().as_secs_f64());
        if let Err(e) = &committed {
            metrics.commit_errors.inc();
            tracing::error!(error = %e, pending = spool.pending(), "spool commit failed; retrying with the next batch");
        }
        count_dropped(&mut spool, metrics);
        for (done, result) in waiters {
            let result = match (&committed, result) {
                (Ok(()), r) => r,
                (Err(_), Ok(_)) => Err(AppendError::CommitFailed),
                (Err(_), Err(e)) => Err(e),
            };
            let _ = done.send(result);
        }
        if let Some(done) = shutdown {
            let _ = done.send(());
            return;
        }
    }
}
