//! How the spool's threads (and the broker's session store, `broker::store`) share the CPU with
//! the local path.
//!
//! Both threads run at nice 10: on a busy two-core gateway a commit burst at the runtime's
//! priority showed in the local path's p99 (1.6-1.8x the run without the spool at 5,000
//! spooled msg/s; 1.2-1.4x at nice 10; see docs/BENCHMARKS.md).
//!
//! The writer goes further where the process may undo it: it runs under `SCHED_IDLE` while it
//! keeps up. A CPU that runs only `SCHED_IDLE` work counts as idle when the kernel places a
//! waking thread, and such work is preempted at once, so the local path's threads do not queue
//! behind a commit (local p99 under a spooled load 1.18-1.24x the unspooled run, against
//! 1.33-1.47x with the writer held at nice 10 in the same runs). The price: `SCHED_IDLE` runs
//! only on spare CPU. On a gateway whose CPU is saturated (inference on every core, say) the
//! writer would starve and the bounded channel would stall the publishers of spooled topics.
//! So once a request had to wait noticeably longer than the commit interval, the writer goes
//! back to nice 10 for [`HOLD`], and tries `SCHED_IDLE` again after that.
//!
//! Leaving `SCHED_IDLE` needs `CAP_SYS_NICE` or an `RLIMIT_NICE` that allows nice 10 (the
//! packaged unit sets `LimitNICE=10`). A process without either would be stuck there, so the
//! writer first tries the round trip on a thread of its own and, if that fails, stays at
//! nice 10 throughout.

use std::time::{Duration, Instant};

use preempt_rt::sched::{Pid, Scheduler, SchedulerParams, set_scheduler};

/// How much longer than the commit interval a request may wait before the writer counts as
/// starved.
const LAG: Duration = Duration::from_millis(100);

/// How long the writer stays at nice 10 after it lagged.
const HOLD: Duration = Duration::from_secs(60);

/// Lowers the calling thread's CPU priority to nice 10.
pub(crate) fn background_priority() {
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 10) {
        tracing::debug!(error = %e, "cannot lower the spool thread's priority");
    }
}

/// The writer thread's scheduling policy. Lives on the writer thread and changes only it.
#[derive(Debug)]
pub(crate) struct WriterPolicy {
    /// Whether this thread may leave `SCHED_IDLE` again, so may enter it.
    may_idle: bool,
    idle: bool,
    promoted_until: Option<Instant>,
}

impl WriterPolicy {
    /// Sets the calling thread to nice 10 and, where it can be undone, `SCHED_IDLE`.
    pub(crate) fn start() -> Self {
        background_priority();
        let may_idle = can_leave_idle();
        if !may_idle {
            tracing::debug!("spool writer stays at nice 10: SCHED_IDLE could not be left again here");
        }
        let mut policy = Self { may_idle, idle: false, promoted_until: None };
        policy.set_idle(true);
        policy
    }

    /// Whether the thread runs under `SCHED_IDLE` now.
    #[cfg(test)]
    pub(super) fn is_idle(&self) -> bool {
        self.idle
    }

    /// Takes the longest wait of the requests in the batch the writer is about to commit: one
    /// that waited past the commit interval plus [`LAG`] means the thread is starved of CPU.
    pub(crate) fn observe(&mut self, waited: Duration, commit_interval: Duration, now: Instant) {
        if waited > commit_interval + LAG {
            if self.idle {
                tracing::info!(
                    waited_ms = waited.as_millis() as u64,
                    "spool writer starved at idle priority; it runs at nice 10 for the next minute"
                );
            }
            self.promoted_until = Some(now + HOLD);
            self.set_idle(false);
        } else if self.promoted_until.is_some_and(|until| now >= until) {
            self.promoted_until = None;
            self.set_idle(true);
        }
    }

    fn set_idle(&mut self, idle: bool) {
        if !self.may_idle || self.idle == idle {
            return;
        }
        let policy = if idle { Scheduler::SCHED_IDLE } else { Scheduler::SCHED_NORMAL };
        match set_scheduler(Pid::current_thread(), policy, SchedulerParams { priority: 0 }) {
            Ok(()) => self.idle = idle,
            Err(e) => {
                tracing::warn!(error = %e, ?policy, "cannot change the spool writer's scheduling policy");
                // Never try SCHED_IDLE again: the next change back might fail the same way.
                self.may_idle = false;
            }
        }
    }
}

/// Whether this process may move a thread at nice 10 out of `SCHED_IDLE`: tried on a thread
/// that is thrown away, so a refusal leaves nothing stuck.
fn can_leave_idle() -> bool {
    let params = || SchedulerParams { priority: 0 };
    std::thread::Builder::new()
        .name("spool-probe".into())
        .spawn(move || {
            background_priority();
            set_scheduler(Pid::current_thread(), Scheduler::SCHED_IDLE, params()).is_ok()
                && set_scheduler(Pid::current_thread(), Scheduler::SCHED_NORMAL, params()).is_ok()
        })
        .ok()
        .and_then(|t| t.join().ok())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use bytes::Bytes;

    use super::super::{
        Durability, Lane, Message, Properties, Record, Seq, Spool, SpoolWriter, SqliteStorage, WriterMetrics,
    };
    use super::*;

    /// A thread's scheduling policy (0 normal, 5 idle) and nice value, as the kernel has them.
    fn policy_and_nice(stat: &str) -> (u32, i32) {
        let fields: Vec<&str> = stat.rsplit_once(')').expect("stat").1.split_whitespace().collect();
        // Fields from the third on: nice is the 19th, policy the 41st.
        (fields[41 - 3].parse().expect("policy"), fields[19 - 3].parse().expect("nice"))
    }

    fn this_thread() -> (u32, i32) {
        policy_and_nice(&std::fs::read_to_string("/proc/thread-self/stat").expect("own stat"))
    }

    fn writer_thread() -> Option<(u32, i32)> {
        std::fs::read_dir("/proc/self/task")
            .ok()?
            .flatten()
            .find_map(|task| {
                let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
                (comm.trim() == "spool-writer").then(|| std::fs::read_to_string(task.path().join("stat")).ok())?
            })
            .map(|stat| policy_and_nice(&stat))
    }

    #[test]
    fn a_lagging_writer_leaves_idle_priority_for_a_minute_at_nice_10() {
        std::thread::spawn(|| {
            let mut policy = WriterPolicy::start();
            // Tests run as root here and in CI, where the round trip is allowed.
            assert!(can_leave_idle(), "this test needs CAP_SYS_NICE or RLIMIT_NICE >= 10");
            assert!(policy.is_idle());
            assert_eq!(this_thread(), (5, 10));
            let interval = Duration::from_millis(5);
            let t0 = Instant::now();
            policy.observe(Duration::from_millis(100), interval, t0);
            assert!(policy.is_idle(), "within the commit interval plus the lag allowed");
            policy.observe(Duration::from_millis(300), interval, t0);
            assert!(!policy.is_idle());
            assert_eq!(this_thread(), (0, 10), "back to normal scheduling, still at nice 10");
            policy.observe(Duration::ZERO, interval, t0 + HOLD - Duration::from_secs(1));
            assert!(!policy.is_idle(), "held at nice 10 for the minute");
            policy.observe(Duration::ZERO, interval, t0 + HOLD);
            assert!(policy.is_idle());
            assert_eq!(this_thread(), (5, 10));
        })
        .join()
        .expect("policy thread");
    }

    /// With every core busy at normal priority, a writer under `SCHED_IDLE` would get almost no
    /// CPU: it must notice and go back to nice 10, and commit what it was sent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_writer_starved_on_a_busy_machine_goes_back_to_nice_10_and_commits() {
        const COUNT: u32 = 20_000;
        let dir = tempfile::tempdir().expect("tempdir");
        let spool = Spool::new(Box::new(SqliteStorage::open(&dir.path().join("spool.db")).expect("open"))
            as Box<dyn super::super::Storage + Send>);
        let metrics = Arc::new(WriterMetrics::new(&mut Default::default()));
        let writer = SpoolWriter::start(spool, Duration::from_millis(5), 256, metrics).expect("writer");
        let started = Instant::now();
        while writer_thread() != Some((5, 10)) {
            assert!(started.elapsed() < Duration::from_secs(5), "the writer never went idle: {:?}", writer_thread());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let busy = Arc::new(AtomicBool::new(true));
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let spinners: Vec<_> = (0..cores + 1)
            .map(|_| {
                let busy = busy.clone();
                std::thread::spawn(move || {
                    while busy.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let message = |i: u32| Message {
            class: "telemetry".into(),
            topic: format!("telemetry/{i}"),
            payload: Bytes::from(vec![1; 1024]),
            qos: 1,
            enqueued_ms: 1,
            expires_ms: None,
            properties: Properties::default(),
        };
        let mut promoted = false;
        let deadline = Instant::now() + Duration::from_secs(20);
        // More than a starved writer gets through: requests queue and wait.
        for i in 0..COUNT {
            writer.append(Lane(0), message(i), Durability::Normal).await.expect("append");
            if i % 100 == 0 {
                promoted |= writer_thread() == Some((0, 10));
            }
        }
        while !promoted && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(25)).await;
            promoted = writer_thread() == Some((0, 10));
        }
        // Reads stop at READ_BYTES: page through.
        let mut read: Vec<Record> = Vec::new();
        loop {
            let after = read.last().map_or(Seq(0), |r| r.seq);
            let page = writer.read(Lane(0), after, COUNT as usize).await.expect("read");
            if page.is_empty() {
                break;
            }
            read.extend(page);
        }
        busy.store(false, Ordering::Relaxed);
        for s in spinners {
            s.join().expect("spinner");
        }
        assert!(promoted, "the writer stayed under SCHED_IDLE while starved: {:?}", writer_thread());
        assert_eq!(read.len(), COUNT as usize, "every append committed");
        writer.shutdown().await;
    }
}
