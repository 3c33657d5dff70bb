//! The spool's own thread. Connections send appends over a bounded channel; the thread batches
//! them into group commits (up to `commit_batch` records, or what arrives within
//! `commit_interval`; at once when a `full` append is waiting for its PUBACK), commits, and
//! answers `full` appends only after their commit. SQLite stays on one thread; the async front
//! never waits on disk except for a `full` PUBACK.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot};

use super::{Durability, Lane, Message, Record, Seq, Spool, SpoolError, Storage};
use crate::labels::{ClassLabel, class_label, handle};
use shared::units::now_ms;

/// The spool the writer thread owns: SQLite in production, a fault-injecting wrapper in tests.
pub(crate) type DynSpool = Spool<Box<dyn Storage + Send>>;

/// Why a read or an ack of the spool failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    #[error(transparent)]
    Stopped(#[from] AppendError),
    #[error(transparent)]
    Spool(#[from] SpoolError),
}

/// Why a `full` append got no PUBACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
    Append { lane: Lane, message: Box<Message>, durability: Durability, done: Option<Done>, queued: Instant },
    Query { query: Query, queued: Instant },
    Shutdown(oneshot::Sender<()>),
}

/// The uplink's requests, answered after the batch they arrive in is committed.
enum Query {
    Read {
        lane: Lane,
        after: Seq,
        limit: usize,
        done: oneshot::Sender<Result<Vec<Record>, SpoolError>>,
    },
    Ack {
        lane: Lane,
        up_to: Seq,
        done: oneshot::Sender<Result<u64, SpoolError>>,
    },
    CheckMark {
        lane: Lane,
        mark: Seq,
        done: oneshot::Sender<Result<Option<(Seq, u64)>, SpoolError>>,
    },
    Welcomed(oneshot::Sender<Result<(), SpoolError>>),
    Heads(oneshot::Sender<Heads>),
    /// QoS 2 receipts released ([`super::Spool::forget_receipts`]); no answer.
    ForgetReceipts(Vec<u64>),
}

/// What the uplink needs to know of the spool: its epoch and, per lane, the acked and the last
/// committed seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heads {
    pub epoch: String,
    pub lanes: Vec<(Lane, Seq, Seq)>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DropLabels {
    pub class: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabel {
    pub outcome: &'static str,
}

shared::metrics! {
    /// Metric handles the writer updates.
    #[derive(Debug, Clone)]
    pub struct WriterMetrics {
        pub appended: Family<ClassLabel, Counter> => (
            "spool_appended",
            "Messages appended to the store-and-forward spool, by class"
        ),
        pub dropped: Family<DropLabels, Counter> => (
            "spool_dropped",
            "Spooled messages dropped before the cloud acked them, by class and reason (evicted, expired); each drop is also a gap record sent to the cloud"
        ),
        pub refused: Counter => ("spool_refused", "Full-durability messages refused for lack of spool room"),
        pub commit_errors: Family<KindLabel, Counter> => (
            "spool_commit_errors",
            "Spool group commits that failed (retried), by kind (disk_full, io, corrupt, other)"
        ),
        pub commit_seconds: Histogram => (
            "spool_commit",
            "Spool group commit duration",
            unit Seconds,
            // 50 µs .. ~1.6 s
            init Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
        ),
        /// From a `normal` append to the end of its commit: the PUBACK-to-commit window, a little
        /// over-stated (the PUBACK leaves after the append).
        pub window_seconds: Histogram => (
            "spool_puback_to_commit",
            "For normal-durability messages: from the append (the PUBACK follows it) to the end of the group commit that made it durable; the window in which a crash loses an acknowledged message",
            unit Seconds,
            // Linear where the 10 ms target is judged, then coarse.
            init Histogram::new(
                [0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 12.0, 15.0, 20.0, 50.0, 100.0, 1000.0]
                    .into_iter()
                    .map(|ms| ms / 1000.0),
            )
        ),
        pub class_records: Family<ClassLabel, Gauge> => (
            "spool_class_records",
            "Message records held in the spool, by class"
        ),
        pub class_bytes: Family<ClassLabel, Gauge> => (
            "spool_class_bytes",
            "Payload and topic bytes held in the spool, by class (what class quotas count)"
        ),
        pub oldest_unacked_seconds: Gauge => (
            "spool_oldest_unacked_seconds",
            "Age of the oldest message the cloud has not acknowledged; 0 when the spool is empty"
        ),
        pub healthy: Gauge => (
            "spool_healthy",
            "1 while the spool's last commit succeeded, 0 while commits fail (disk full, I/O errors)"
        ),
        /// Unusable databases moved aside at startup.
        pub moved_aside: Counter => (
            "spool_moved_aside",
            "Spool databases found damaged (corrupt, not a database, a failed integrity check) and moved aside to <path>.damaged-<ms> once what they held was salvaged into the new one"
        ),
        /// Lanes renumbered past the cloud's mark because the database had gone back in time.
        pub renumbered: Counter => (
            "spool_renumbered",
            "Times a lane's records were renumbered past the cloud's mark because the spool database had gone back in time (power cut, restored copy)"
        ),
        /// Rebuilds of a database found damaged while running, by outcome.
        pub rebuilds: Family<OutcomeLabel, Counter> => (
            "spool_rebuilds",
            "Spool databases found damaged while running (a page SQLite cannot read, a failed integrity check) and salvaged into a new one under the same epoch, by outcome (salvaged, failed)"
        ),
        /// Seqs a salvage could not read (at open or while running), each in a gap record.
        pub unreadable: Counter => (
            "spool_unreadable_seqs",
            "Seqs in damaged pages a salvage could not read (at start or while running); each range goes to the cloud in a gap record (reason unreadable)"
        ),
        /// 1 while the database is known damaged and not rebuilt.
        pub damaged: Gauge => (
            "spool_damaged",
            "1 while the spool database is known damaged and not yet rebuilt (/healthz fails meanwhile, saying why)"
        ),
        /// `spool.budget`, for alerts on the share used (`class_bytes` over it).
        pub budget: Gauge => ("spool_budget", "spool.budget: the bytes the spool may take", unit Bytes),
    }
}

impl WriterMetrics {
    /// The writer's metrics, registered in `r`.
    pub(crate) fn new(r: &mut Registry) -> Self {
        let m = Self::default();
        m.register(r);
        m
    }
}

/// What the spool says of itself beyond its metrics, for the uplink to report to the fleet view:
/// kept by the spool thread, read by anyone.
#[derive(Debug, Default)]
struct Stats {
    /// When the oldest record not yet acked was enqueued, ms since the Unix epoch; 0 if none.
    oldest_unacked_ms: AtomicU64,
    /// The bytes of the records held, every class together.
    bytes: AtomicU64,
    /// The kind of error the last commit failed with (`SpoolError::kind`); none once one
    /// succeeds.
    failing: Mutex<Option<&'static str>>,
    dropped: AtomicU64,
    gaps: AtomicU64,
}

/// A snapshot of [`SpoolWriter::figures`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpoolFigures {
    /// When the oldest record the cloud has not acked was enqueued (ms since the Unix epoch).
    pub oldest_unacked_ms: Option<u64>,
    /// Records dropped before the cloud had them, since start.
    pub dropped: u64,
    /// Gap records written for those, since start.
    pub gaps: u64,
    /// The bytes of the records held.
    pub bytes: u64,
    /// The kind of error commits fail with while they do.
    pub failing: Option<&'static str>,
}

/// A handle to the spool thread.
#[derive(Debug, Clone)]
pub struct SpoolWriter {
    /// Tokio's channel rather than one with a mutex both ends take (flume): this thread runs at
    /// a lower priority, and a connection's send must never wait for it to be scheduled again
    /// because it was preempted holding the channel's lock. A send takes no lock unless the
    /// channel is full.
    tx: mpsc::Sender<Request>,
    /// The spool thread, woken for what must not wait out the commit interval.
    thread: std::thread::Thread,
    /// Set while the thread waits for a first request: a send then wakes it.
    idle: Arc<AtomicBool>,
    /// Signalled after each commit that added records, for the uplink.
    committed: Arc<tokio::sync::Notify>,
    stats: Arc<Stats>,
    /// Why the spool is unhealthy, while it is (damaged and not rebuilt).
    problem: Arc<Mutex<Option<String>>>,
}

impl SpoolWriter {
    /// Starts the spool thread over `spool`.
    pub fn start(
        spool: DynSpool,
        commit_interval: Duration,
        commit_batch: usize,
        metrics: Arc<WriterMetrics>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel(commit_batch.max(1) * 8);
        let committed = Arc::new(tokio::sync::Notify::new());
        let notify = committed.clone();
        let idle = Arc::new(AtomicBool::new(false));
        let inbox = Inbox { rx, idle: idle.clone() };
        let stats = Arc::new(Stats::default());
        let kept = stats.clone();
        let problem = Arc::new(Mutex::new(None));
        let said = problem.clone();
        let handle = std::thread::Builder::new().name("spool-writer".into()).spawn(move || {
            let counts = Counts { metrics: &metrics, stats: &kept, problem: &said };
            run(spool, inbox, commit_interval, commit_batch.max(1), counts, &notify);
        })?;
        Ok(Self { tx, thread: handle.thread().clone(), idle, committed, stats, problem })
    }

    /// Why the spool is unhealthy, if it is: its database is damaged and not rebuilt yet (or
    /// the rebuild failed). For `/healthz`.
    pub(crate) fn problem(&self) -> Option<String> {
        self.problem.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Queues `message`. For `full` durability the returned receiver resolves once it is
    /// committed (or refused); `normal` messages are committed within `commit_interval`.
    pub(crate) async fn append(
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
            .send(Request::Append { lane, message: Box::new(message), durability, done, queued: Instant::now() })
            .await
            .map_err(|_| AppendError::Stopped)?;
        if rx.is_some() {
            self.thread.unpark();
        } else {
            self.wake_if_idle();
        }
        Ok(rx)
    }

    /// Forgets QoS 2 receipts whose releases are committed, without waiting: one the spool
    /// does not hear of (its queue full) goes at the next start.
    pub(crate) fn forget_receipts(&self, keys: Vec<u64>) {
        if self.tx.try_send(Request::Query { query: Query::ForgetReceipts(keys), queued: Instant::now() }).is_ok() {
            self.wake_if_idle();
        }
    }

    fn wake_if_idle(&self) {
        if self.idle.swap(false, Ordering::SeqCst) {
            self.thread.unpark();
        }
    }

    async fn query<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Query) -> Result<T, AppendError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Request::Query { query: make(tx), queued: Instant::now() })
            .await
            .map_err(|_| AppendError::Stopped)?;
        self.thread.unpark();
        rx.await.map_err(|_| AppendError::Stopped)
    }

    /// Committed records of `lane` after `after`, in seq order.
    pub(crate) async fn read(&self, lane: Lane, after: Seq, limit: usize) -> Result<Vec<Record>, ReadError> {
        Ok(self.query(|done| Query::Read { lane, after, limit, done }).await??)
    }

    /// Deletes `lane`'s records through `up_to`: the cloud committed them.
    pub(crate) async fn ack(&self, lane: Lane, up_to: Seq) -> Result<u64, ReadError> {
        Ok(self.query(|done| Query::Ack { lane, up_to, done }).await??)
    }

    /// Checks the cloud's mark of `lane` before it is taken as an ack ([`super::Spool::check_mark`]);
    /// returns the first seq renumbered past it and by how much, if the database had gone
    /// back in time.
    pub(crate) async fn check_mark(&self, lane: Lane, mark: Seq) -> Result<Option<(Seq, u64)>, ReadError> {
        Ok(self.query(|done| Query::CheckMark { lane, mark, done }).await??)
    }

    /// Every lane of a Welcome was checked ([`super::Spool::welcomed`]).
    pub(crate) async fn welcomed(&self) -> Result<(), ReadError> {
        Ok(self.query(Query::Welcomed).await??)
    }

    /// The spool's epoch and lane positions.
    pub(crate) async fn heads(&self) -> Result<Heads, AppendError> {
        self.query(Query::Heads).await
    }

    /// The oldest unacked record (as of the last expiry tick, once a second) and the drops so
    /// far.
    pub(crate) fn figures(&self) -> SpoolFigures {
        let oldest = self.stats.oldest_unacked_ms.load(Ordering::Relaxed);
        SpoolFigures {
            oldest_unacked_ms: (oldest > 0).then_some(oldest),
            dropped: self.stats.dropped.load(Ordering::Relaxed),
            gaps: self.stats.gaps.load(Ordering::Relaxed),
            bytes: self.stats.bytes.load(Ordering::Relaxed),
            failing: *self.stats.failing.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
        }
    }

    /// Signalled after each commit that added records.
    pub(crate) fn committed_notify(&self) -> Arc<tokio::sync::Notify> {
        self.committed.clone()
    }

    /// Commits what is queued and stops the thread.
    pub(crate) async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Request::Shutdown(tx)).await.is_ok() {
            self.thread.unpark();
            let _ = rx.await;
        }
    }
}

/// Where the spool thread counts: the metrics, the figures the uplink reports, and its health.
#[derive(Clone, Copy)]
struct Counts<'a> {
    metrics: &'a WriterMetrics,
    stats: &'a Stats,
    problem: &'a Mutex<Option<String>>,
}

/// Rebuilds a database found damaged (`damage.rs`): unhealthy until it is done, and after if it
/// fails. Returns whether the spool works again.
fn mend(spool: &mut DynSpool, counts: Counts<'_>, why: &str) -> bool {
    let say = |s: Option<String>| *counts.problem.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = s;
    tracing::error!(why, "spool database damaged; rebuilding it from what can be read");
    say(Some(format!("spool database damaged ({why}); rebuilding")));
    counts.metrics.damaged.set(1);
    match spool.rebuild() {
        Ok(salvaged) => {
            handle(&counts.metrics.rebuilds, &OutcomeLabel { outcome: "salvaged" }).inc();
            counts.metrics.moved_aside.inc();
            counts.metrics.unreadable.inc_by(salvaged.unreadable_count());
            counts.metrics.damaged.set(0);
            say(None);
            true
        }
        Err(e) => {
            handle(&counts.metrics.rebuilds, &OutcomeLabel { outcome: "failed" }).inc();
            tracing::error!(error = %e, "spool rebuild failed; the spool stays unhealthy until it succeeds");
            say(Some(format!("spool database damaged ({why}) and its rebuild failed: {e}")));
            false
        }
    }
}

fn count_dropped(spool: &mut DynSpool, counts: Counts<'_>) {
    let metrics = counts.metrics;
    for (class, reason, count) in spool.take_dropped() {
        counts.stats.dropped.fetch_add(count, Ordering::Relaxed);
        counts.stats.gaps.fetch_add(1, Ordering::Relaxed);
        handle(&metrics.dropped, &DropLabels { class, reason: reason.as_str() }).inc_by(count);
    }
}

/// Gauges read from the spool: usage per class after every commit, the oldest unacked age on
/// the expiry tick (it costs a query per lane).
fn update_gauges(spool: &mut DynSpool, counts: Counts<'_>, with_age: bool) {
    let metrics = counts.metrics;
    let mut bytes = 0;
    for u in spool.usage() {
        let class = class_label(&u.class);
        handle(&metrics.class_records, &class).set(u.records as i64);
        handle(&metrics.class_bytes, &class).set(u.bytes as i64);
        bytes += u.bytes;
    }
    counts.stats.bytes.store(bytes, Ordering::Relaxed);
    if with_age {
        match spool.oldest_unacked_ms() {
            Ok(oldest) => {
                let age = oldest.map_or(0, |ms| now_ms().saturating_sub(ms) / 1000);
                metrics.oldest_unacked_seconds.set(age as i64);
                counts.stats.oldest_unacked_ms.store(oldest.unwrap_or(0), Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "spool: cannot read the oldest unacked record"),
        }
    }
}

/// Logs commit failures without flooding: the first of a run, then one line every
/// `REPEAT` with the count, and the recovery.
#[derive(Debug, Default)]
struct FailureLog {
    failing_since: Option<Instant>,
    last_line: Option<Instant>,
    failures: u64,
}

impl FailureLog {
    const REPEAT: Duration = Duration::from_secs(10);

    fn failed(&mut self, e: &SpoolError, pending: usize) {
        self.failures += 1;
        let now = Instant::now();
        if self.last_line.is_none_or(|t| now - t >= Self::REPEAT) {
            self.last_line = Some(now);
            self.failing_since.get_or_insert(now);
            tracing::error!(
                kind = e.kind(),
                error = %e,
                pending,
                failures = self.failures,
                "spool commit failed; normal messages stay in memory and are retried, full ones get no PUBACK; local delivery is not affected"
            );
        }
    }

    fn succeeded(&mut self) {
        if let Some(since) = self.failing_since.take() {
            tracing::warn!(failures = self.failures, after = ?since.elapsed(), "spool commits succeed again");
        }
        self.failures = 0;
        self.last_line = None;
    }
}

/// The thread's end of the channel.
struct Inbox {
    rx: mpsc::Receiver<Request>,
    idle: Arc<AtomicBool>,
}

enum Wait {
    Got(Request),
    TimedOut,
    Closed,
}

impl Inbox {
    /// Waits up to `wait` for a request. Parks instead of blocking in the channel, so that a
    /// sender wakes this thread with an unpark (only when it is idle) and never through a lock.
    fn wait(&mut self, wait: Duration) -> Wait {
        match self.rx.try_recv() {
            Ok(r) => return Wait::Got(r),
            Err(TryRecvError::Disconnected) => return Wait::Closed,
            Err(TryRecvError::Empty) => {}
        }
        self.idle.store(true, Ordering::SeqCst);
        // Again after saying so: a send between the first try and the flag would otherwise
        // not wake us. An unpark before the park makes the park return at once.
        let got = match self.rx.try_recv() {
            Ok(r) => Wait::Got(r),
            Err(TryRecvError::Disconnected) => Wait::Closed,
            Err(TryRecvError::Empty) => {
                std::thread::park_timeout(wait);
                match self.rx.try_recv() {
                    Ok(r) => Wait::Got(r),
                    Err(TryRecvError::Disconnected) => Wait::Closed,
                    Err(TryRecvError::Empty) => Wait::TimedOut,
                }
            }
        };
        self.idle.store(false, Ordering::SeqCst);
        got
    }
}

fn run(
    mut spool: DynSpool,
    mut inbox: Inbox,
    commit_interval: Duration,
    commit_batch: usize,
    counts: Counts<'_>,
    notify: &tokio::sync::Notify,
) {
    let metrics = counts.metrics;
    const EXPIRY_TICK: Duration = Duration::from_secs(1);
    let mut policy = super::sched::WriterPolicy::start();
    let mut last_expiry = Instant::now();
    let mut failures = FailureLog::default();
    let mut last_mend: Option<Instant> = None;
    // Appends of `normal` messages not yet committed, for the window histogram.
    let mut uncommitted: Vec<Instant> = Vec::new();
    metrics.healthy.set(1);
    update_gauges(&mut spool, counts, true);
    loop {
        if last_expiry.elapsed() >= EXPIRY_TICK {
            last_expiry = Instant::now();
            // Damage the integrity check beside the spool found; a failed rebuild is tried again
            // once a minute.
            if let Some(why) = spool.damaged()
                && last_mend.is_none_or(|t: Instant| t.elapsed() >= Duration::from_secs(60))
            {
                last_mend = Some(Instant::now());
                mend(&mut spool, counts, &why);
            }
            if let Err(e) = spool.expire(now_ms()) {
                tracing::error!(kind = e.kind(), error = %e, "spool expiry failed");
            }
            count_dropped(&mut spool, counts);
            update_gauges(&mut spool, counts, true);
        }
        // While commits fail, retry on a short tick even when nothing new arrives.
        let wait = if spool.pending() > 0 { commit_interval.max(Duration::from_millis(50)) } else { EXPIRY_TICK };
        let mut batch = match inbox.wait(wait) {
            Wait::Got(r) => vec![r],
            Wait::TimedOut if spool.pending() > 0 => Vec::new(),
            Wait::TimedOut => continue,
            Wait::Closed => {
                close(&mut spool);
                return;
            }
        };
        // Gather until the batch is full, the interval is up, or something waits for the
        // commit (a `full` append or shutdown, which unpark this thread). Parking rather than
        // waking for every message keeps this thread off a busy CPU between commits.
        let deadline = Instant::now() + commit_interval;
        let is_urgent = |r: &Request| !matches!(r, Request::Append { done: None, .. });
        let mut urgent = batch.iter().any(is_urgent);
        loop {
            while batch.len() < commit_batch {
                let Ok(r) = inbox.rx.try_recv() else { break };
                urgent |= is_urgent(&r);
                batch.push(r);
            }
            let now = Instant::now();
            if urgent || batch.len() >= commit_batch || now >= deadline {
                break;
            }
            std::thread::park_timeout(deadline - now);
        }

        // The channel is first in, first out: the first queued request waited longest.
        let waited = batch
            .iter()
            .find_map(|r| match r {
                Request::Append { queued, .. } | Request::Query { queued, .. } => Some(queued.elapsed()),
                Request::Shutdown(_) => None,
            })
            .unwrap_or_default();
        policy.observe(waited, commit_interval, Instant::now());

        let mut waiters: Vec<(Done, Result<Seq, AppendError>)> = Vec::new();
        let mut queries: Vec<Query> = Vec::new();
        let mut shutdown = None;
        for request in batch {
            match request {
                Request::Append { lane, message, durability: Durability::Full, done, .. } => {
                    let class = class_label(&message.class);
                    let result = spool.append_full(lane, *message).map_err(|_| AppendError::Refused);
                    if result.is_err() {
                        metrics.refused.inc();
                    } else {
                        handle(&metrics.appended, &class).inc();
                    }
                    if let Some(done) = done {
                        waiters.push((done, result));
                    }
                }
                Request::Append { lane, message, durability, queued, .. } => {
                    if uncommitted.len() < 65_536 {
                        uncommitted.push(queued);
                    }
                    handle(&metrics.appended, &class_label(&message.class)).inc();
                    spool.append(lane, *message, durability);
                }
                Request::Query { query, .. } => queries.push(query),
                Request::Shutdown(done) => shutdown = Some(done),
            }
        }
        let started = Instant::now();
        let had = spool.pending();
        let mut committed = spool.flush();
        if let Err(e) = &committed
            && e.is_damage()
            && mend(&mut spool, counts, &e.to_string())
        {
            committed = spool.flush();
        }
        if committed.is_ok() && had > 0 {
            notify.notify_one();
        }
        metrics.commit_seconds.observe(started.elapsed().as_secs_f64());
        match &committed {
            Ok(()) => {
                failures.succeeded();
                metrics.healthy.set(1);
                *counts.stats.failing.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                for queued in uncommitted.drain(..) {
                    metrics.window_seconds.observe(queued.elapsed().as_secs_f64());
                }
            }
            Err(e) => {
                handle(&metrics.commit_errors, &KindLabel { kind: e.kind() }).inc();
                metrics.healthy.set(0);
                *counts.stats.failing.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e.kind());
                failures.failed(e, spool.pending());
            }
        }
        count_dropped(&mut spool, counts);
        update_gauges(&mut spool, counts, false);
        for (done, result) in waiters {
            let result = match (&committed, result) {
                (Ok(()), r) => r,
                (Err(_), Ok(_)) => Err(AppendError::CommitFailed),
                (Err(_), Err(e)) => Err(e),
            };
            let _ = done.send(result);
        }
        for q in queries {
            answer(&mut spool, q, counts);
        }
        if let Some(done) = shutdown {
            close(&mut spool);
            let _ = done.send(());
            return;
        }
    }
}

/// The last commit before the thread ends, marking the spool closed cleanly if all went in.
fn close(spool: &mut DynSpool) {
    if let Err(e) = spool.close() {
        tracing::error!(kind = e.kind(), error = %e, "spool: final commit failed");
    }
}

/// Runs `op`; if it found the database damaged, rebuilds it (`mend`) and runs `op` again, so a
/// damaged page costs the uplink a gap record, not a read that fails forever.
fn mended<T>(
    spool: &mut DynSpool,
    counts: Counts<'_>,
    mut op: impl FnMut(&mut DynSpool) -> Result<T, SpoolError>,
) -> Result<T, SpoolError> {
    match op(spool) {
        Err(e) if e.is_damage() && mend(spool, counts, &e.to_string()) => op(spool),
        other => other,
    }
}

fn answer(spool: &mut DynSpool, query: Query, counts: Counts<'_>) {
    match query {
        Query::Read { lane, after, limit, done } => {
            let _ = done.send(mended(spool, counts, |s| s.read(lane, after, limit)));
        }
        Query::Ack { lane, up_to, done } => {
            let result = mended(spool, counts, |s| s.ack(lane, up_to));
            if result.is_ok() {
                update_gauges(spool, counts, false);
            }
            let _ = done.send(result);
        }
        Query::CheckMark { lane, mark, done } => {
            let result = mended(spool, counts, |s| s.check_mark(lane, mark));
            if let Ok(Some((from, by))) = &result {
                tracing::warn!(
                    lane = lane.0,
                    mark = mark.0,
                    from = from.0,
                    by,
                    "the cloud holds seqs this spool handed out again (its database went back in time): \
                     records renumbered past the cloud's mark, none deleted"
                );
                counts.metrics.renumbered.inc();
            }
            let _ = done.send(result);
        }
        Query::Welcomed(done) => {
            let _ = done.send(spool.welcomed());
        }
        Query::Heads(done) => {
            let _ = done.send(Heads { epoch: spool.epoch().to_owned(), lanes: spool.heads() });
        }
        Query::ForgetReceipts(keys) => {
            if let Err(e) = spool.forget_receipts(&keys) {
                tracing::warn!(error = %e, "spool: released QoS 2 receipts not forgotten (the next start does it)");
            }
        }
    }
}
