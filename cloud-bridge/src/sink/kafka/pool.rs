//! The bridge's transactional producers: `producers` of them, each writing for the edges that
//! hash to it, the batches waiting when its transaction ends all in its next one (a group
//! commit), each with its lane's new mark.
//!
//! A producer per edge lane would fence by its `transactional.id` alone, but each is a
//! librdkafka client with threads and connections of its own: a thousand edges on a bridge made
//! hundreds of clients, 45 s to connect them and half a GiB idle. Here a producer's id is this
//! bridge's (`<prefix>.<instance>.<n>`, the instance new at each start), and who may write an
//! edge is decided by the edge's claim ([`super::claims`]): a bridge takes an edge by writing
//! the claim and then fencing the producers of the bridges that held it before, so nothing they
//! had open can commit after; only then are the edge's marks read.
//!
//! A producer writes for an edge only while the marks log shows this bridge's verified claim
//! of it. The marks it keeps are held under the claim's token: a mark cached before the edge
//! went to another bridge and came back is not used again. A batch's records at or below its
//! lane's mark are dropped before writing (a resend of what a fenced bridge committed after
//! the edge heard `committed`); the rest go in the transaction with the lane's new mark, so a
//! `read_committed` reader sees the records and the mark together or neither.
//!
//! A session may have several batches of a lane queued at once (`publish_ahead`): each names
//! the last record of the one before it still publishing, and waits in its producer until the
//! lane's mark covers that record, so a batch never commits ahead of an earlier one whose
//! transaction failed (the earlier one is tried again, then this one). In one group, a lane's
//! waiting batches go in the same transaction, in order.
//!
//! A failed transaction is aborted and answered as such (the callers try again). A producer
//! whose transaction could not be aborted, or that was fenced (another bridge claimed one of
//! its edges), is closed: the next group opens it again under the same id, which settles what
//! the old one left, reads the marks settled, and forgets the marks it kept, so a commit whose
//! answer was lost is found committed, not written twice.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::claims::{Claim, Claims, claim_key, verified_key};
use super::log::StateLog;
use super::mark_key;
use super::outgoing::{Outgoing, Staged, Topic, Writes};
use super::settings::KafkaSettings;
use super::txn::{Shown, TxProducer, attempt, close, open_producer, poll_idle, producer_config, txn_error};
use crate::sink::{OutcomeLabel, SinkError, SinkMetrics};

/// Jobs in one transaction, at most: a batch is up to the edge's batch size, so this bounds a
/// transaction's records too.
const GROUP: usize = 64;
/// Producer ids one claim names to fence, at most: the oldest go first (a chain of claims
/// never verified is a chain of bridges that died while claiming).
const MAX_FENCE: usize = 256;
/// Attempts at committing a claim when the producer's transaction failed for another reason
/// (its producer fenced by another edge's claim, a broker moving).
const ATTEMPTS: u32 = 5;
/// Jobs waiting for a producer, at most; a caller past it waits.
const QUEUE: usize = 1024;
/// How often an idle producer is polled (its transactions poll it otherwise).
const IDLE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// What a producer is asked to do for an edge.
pub(crate) enum Work {
    /// A batch: its records above its lane's mark, and the new mark; not before the lane's mark
    /// reaches `after` (the last record of the batch before it, if that one may still be in
    /// flight).
    Batch { staged: Arc<Staged>, after: Option<u64> },
    /// Writes of the edge's own state, decided by a caller holding the edge's claim.
    Owned(Vec<Outgoing>),
    /// The edge's claim itself: written whoever holds the edge ([`super::claims`]).
    Claim(Outgoing),
    /// The lane's mark as the producer knows it.
    Mark { epoch: String, lane: u8 },
}

struct Job {
    edge: String,
    work: Work,
    queued: std::time::Instant,
    reply: oneshot::Sender<Result<u64, SinkError>>,
}

/// What the producers share with the rest of the sink.
pub(crate) struct Shared {
    pub(crate) settings: KafkaSettings,
    pub(crate) marks: Arc<StateLog>,
    pub(crate) marks_topic: Topic,
    pub(crate) claims: Claims,
    /// The marks this bridge committed, by mark key: a commit is readable only once its
    /// markers are written, a moment after it returns, and a hello to this bridge right after
    /// an ack must hear the mark the ack promised.
    committed: Mutex<BTreeMap<String, u64>>,
    open: AtomicUsize,
    /// Set once the sink is given the bridge's metrics, after the producers started.
    metrics: Mutex<Arc<SinkMetrics>>,
}

impl Shared {
    fn metrics(&self) -> Arc<SinkMetrics> {
        self.metrics.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// One more (or one fewer) producer open.
    fn opened(&self, delta: isize) {
        let open = if delta > 0 {
            self.open.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.open.fetch_sub(1, Ordering::Relaxed) - 1
        };
        self.metrics().kafka_producers_open.set(open as i64);
    }
}

/// The producers of this bridge.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    senders: Vec<mpsc::Sender<Job>>,
    /// Per edge, held across a read-then-write of its state ([`Pool::owned_write`]), so two of
    /// them (a hello's epochs, a dictionary) do not both read the value before either wrote.
    owned: Mutex<HashMap<String, std::sync::Weak<tokio::sync::Mutex<()>>>>,
}

impl Pool {
    /// The producers (opened when first asked to write), and their tasks.
    pub(crate) fn start(settings: &KafkaSettings, marks: Arc<StateLog>, marks_topic: Topic) -> Self {
        let instance = instance();
        let ids: Vec<String> =
            (0..settings.producers).map(|n| format!("{}.{instance}.{n}", settings.transactional_id_prefix)).collect();
        let claims = Claims::new(settings, instance, ids.clone(), marks.clone());
        let shared = Arc::new(Shared {
            settings: settings.clone(),
            marks,
            marks_topic,
            claims,
            committed: Mutex::default(),
            open: AtomicUsize::new(0),
            metrics: Mutex::default(),
        });
        let senders = ids
            .into_iter()
            .map(|id| {
                let (tx, rx) = mpsc::channel(QUEUE);
                let worker = Worker {
                    id,
                    shared: shared.clone(),
                    producer: None,
                    marks: HashMap::new(),
                    settled: true,
                    waiting: Vec::new(),
                    progressed: false,
                    counted: 0,
                };
                tokio::spawn(worker.run(rx));
                tx
            })
            .collect();
        Self { shared, senders, owned: Mutex::default() }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Counts into `metrics` from now on.
    pub(crate) fn count_into(&self, metrics: Arc<SinkMetrics>) {
        metrics.kafka_producers_open.set(self.open() as i64);
        *self.shared.metrics.lock().unwrap_or_else(|e| e.into_inner()) = metrics;
    }

    /// Producers open now (at most `producers`).
    pub(crate) fn open(&self) -> usize {
        self.shared.open.load(Ordering::Relaxed)
    }

    /// Has `edge`'s producer do `work`; its answer (a mark for [`Work::Mark`]).
    pub(crate) async fn submit(&self, edge: &str, work: Work) -> Result<u64, SinkError> {
        self.submit_now(edge, work).await
    }

    /// [`Pool::submit`], queued by this call unless the producer's queue is full (then by the
    /// future): calls made in order reach the producer in that order.
    pub(crate) fn submit_now(
        &self,
        edge: &str,
        work: Work,
    ) -> impl Future<Output = Result<u64, SinkError>> + Send + 'static + use<> {
        let n = super::names::partition_of(edge, self.senders.len() as i32) as usize;
        let (reply, answer) = oneshot::channel();
        let job = Job { edge: edge.to_owned(), work, reply, queued: std::time::Instant::now() };
        let sender = self.senders[n].clone();
        let waiting = match sender.try_send(job) {
            Ok(()) => None,
            Err(mpsc::error::TrySendError::Full(job) | mpsc::error::TrySendError::Closed(job)) => Some(job),
        };
        async move {
            let gone = || SinkError::Task { what: "kafka producer", reason: "its task ended".into() };
            if let Some(job) = waiting {
                sender.send(job).await.map_err(|_| gone())?;
            }
            answer.await.map_err(|_| gone())?
        }
    }

    /// A read-then-write of `edge`'s own state (its epochs, its dictionary index), as
    /// compare-and-set would do it: only the bridge holding the edge's claim writes these keys,
    /// so with the claim held and `logs` read to their ends, what `decide` reads is the latest;
    /// it says what to write, which is committed in one transaction; the logs are then read
    /// until they show it, so the next read sees it.
    pub(crate) async fn owned_write<T>(
        &self,
        edge: &str,
        logs: &[&StateLog],
        decide: impl FnOnce() -> Result<(Vec<Outgoing>, T), SinkError>,
    ) -> Result<T, SinkError> {
        let lock = self.owned_lock(edge);
        let _held = lock.lock().await;
        if self.shared.claims.held(edge).is_none() {
            return Err(SinkError::Fenced { what: "write", key: edge.to_owned() });
        }
        for log in logs {
            log.read_to_end().await?;
        }
        let (writes, out) = decide()?;
        if writes.is_empty() {
            return Ok(out);
        }
        let expected = Shown::of(&writes);
        self.submit(edge, Work::Owned(writes)).await?;
        expected.awaited(logs, self.shared.settings.transaction_timeout.0).await?;
        Ok(out)
    }

    fn owned_lock(&self, edge: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lock) = owned.get(edge).and_then(std::sync::Weak::upgrade) {
            return lock;
        }
        if owned.len() >= 4096 {
            // Only edges in a write hold theirs.
            owned.retain(|_, w| w.strong_count() > 0);
        }
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        owned.insert(edge.to_owned(), Arc::downgrade(&lock));
        lock
    }

    /// Makes this bridge the one writer of `edge` (the module doc's three steps), unless it is
    /// already. Returns the verified mark to write with the edge's state, when it just claimed.
    pub(crate) async fn claim(&self, edge: &str) -> Result<Option<Outgoing>, SinkError> {
        let shared = &self.shared;
        let claims = &shared.claims;
        if claims.held(edge).is_some() {
            return Ok(None);
        }
        shared.marks.read_to_end().await?;
        let key = claim_key(edge);
        let previous = match shared.marks.get(&key) {
            Some(v) => {
                Some(serde_json::from_slice::<Claim>(&v).map_err(|e| SinkError::corrupt("read claim", &key, e))?)
            }
            None => None,
        };
        let mut fence: Vec<String> = Vec::new();
        if let Some(p) = previous {
            let verified = shared.marks.get(&verified_key(edge)).is_some_and(|v| v == p.token.as_bytes());
            if !verified {
                fence.extend(p.fence);
            }
            fence.extend(p.ids);
        }
        let mut seen = std::collections::HashSet::new();
        fence.retain(|id| !claims.ids().contains(id) && seen.insert(id.clone()));
        if fence.len() > MAX_FENCE {
            tracing::warn!(
                edge,
                producers = fence.len(),
                "kafka: claim names more producers than it fences; the oldest left out"
            );
            fence.drain(..fence.len() - MAX_FENCE);
        }
        let token = format!("{}/{}", claims.instance(), claims.next_token());
        let claim =
            Claim { owner: claims.instance().to_owned(), token: token.clone(), ids: claims.ids().to_vec(), fence };
        let value = serde_json::to_vec(&claim).map_err(|e| SinkError::invalid("claim", e))?;
        let mut attempts = 0;
        loop {
            match self.submit(edge, Work::Claim(shared.marks_topic.put(key.clone(), value.clone()))).await {
                Ok(_) => break,
                Err(e @ (SinkError::Unavailable { .. } | SinkError::Kafka { .. })) if attempts < ATTEMPTS => {
                    attempts += 1;
                    tracing::debug!(edge, error = %e, "kafka: claim not committed; trying again");
                    tokio::time::sleep(std::time::Duration::from_millis(100 * u64::from(attempts))).await;
                }
                Err(e) => return Err(e),
            }
        }
        let fenced = claims.fence(&claim.fence).await?;
        let metrics = shared.metrics();
        metrics.kafka_fences.inc_by(fenced as u64);
        shared.marks.read_settled().await?;
        if !shared.marks.is(&key, &value) {
            metrics.kafka_claims.get_or_create(&OutcomeLabel { outcome: "lost" }).inc();
            return Err(SinkError::Fenced { what: "claim", key: edge.to_owned() });
        }
        metrics.kafka_claims.get_or_create(&OutcomeLabel { outcome: "won" }).inc();
        claims.verify(edge, token.clone(), &value);
        tracing::debug!(edge, token, fenced = claim.fence.len(), "kafka: edge claimed");
        Ok(Some(shared.marks_topic.put(verified_key(edge), token.into_bytes())))
    }

    /// The mark of `edge`'s lane as this bridge knows it without asking its producer, while it
    /// holds the edge: the highest it committed or the log shows. A producer's own marks are
    /// these or lower (what it read from the log or committed), so a mark found here to cover
    /// a batch is one the producer would answer too; `None` (not held) or a lower mark is for
    /// the producer to answer ([`Work::Mark`]), in its order.
    pub(crate) fn known_mark(&self, edge: &str, epoch: &str, lane: u8) -> Option<u64> {
        self.shared.claims.held(edge)?;
        let key = mark_key(edge, epoch, lane);
        let logged = self.shared.marks.get(&key).and_then(|v| super::parse_mark(&v)).unwrap_or(0);
        let committed = self.shared.committed.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied();
        Some(logged.max(committed.unwrap_or(0)))
    }

    /// The marks this bridge committed under `prefix` (a [`mark_key`] prefix), with the key.
    pub(crate) fn committed(&self, prefix: &str) -> Vec<(String, u64)> {
        let committed = self.shared.committed.lock().unwrap_or_else(|e| e.into_inner());
        committed
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Forgets the marks this bridge committed under `prefix` (an epoch retired, its marks
    /// deleted).
    pub(crate) fn forget(&self, prefix: &str) {
        let mut committed = self.shared.committed.lock().unwrap_or_else(|e| e.into_inner());
        committed.retain(|k, _| !k.starts_with(prefix));
    }
}

/// This run's name among the bridges: its producers' ids and its claims carry it.
fn instance() -> String {
    use rand::Rng;
    format!("{:016x}", rand::thread_rng().r#gen::<u64>())
}

/// One producer and the marks it keeps.
struct Worker {
    id: String,
    shared: Arc<Shared>,
    producer: Option<TxProducer>,
    /// Per mark key: the claim token it was read or written under, and the mark.
    marks: HashMap<String, (String, u64)>,
    /// Whether what the marks log holds is past everything an earlier producer of this id
    /// committed: false from a reopen until the log is read settled. A producer of this run's
    /// ids that never opened before has nothing earlier.
    settled: bool,
    /// Batches waiting for the batch before them in their lane, oldest first.
    waiting: Vec<Job>,
    /// Whether the last group committed: the waiting batches may go now.
    progressed: bool,
    /// `waiting.len()` as last counted into `kafka_batches_waiting`.
    counted: usize,
}

/// What a group does with a job.
enum Taken {
    /// In the transaction.
    Accepted(Job),
    /// Waits for the batch before it.
    Waits(Job),
    /// Answered already.
    Answered,
}

impl Worker {
    async fn run(mut self, mut jobs: mpsc::Receiver<Job>) {
        loop {
            let mut group = Vec::new();
            // Waiting batches go again at once after a commit; otherwise they wait for a job.
            if !self.progressed || self.waiting.is_empty() {
                match tokio::time::timeout(IDLE_POLL, jobs.recv()).await {
                    Ok(Some(job)) => group.push(job),
                    Ok(None) => break,
                    Err(_) => {
                        if let Some(p) = &self.producer {
                            poll_idle(p);
                        }
                        self.expire_waiting();
                        self.recount();
                        continue;
                    }
                }
            }
            while group.len() < GROUP {
                match jobs.try_recv() {
                    Ok(j) => group.push(j),
                    Err(_) => break,
                }
            }
            self.group(group).await;
            self.recount();
        }
        if let Some(p) = self.producer.take() {
            self.shared.opened(-1);
            close(p);
        }
    }

    /// Brings `kafka_batches_waiting` (all producers' waiting batches) up to date with this
    /// producer's.
    fn recount(&mut self) {
        let now = self.waiting.len();
        let gauge = &self.shared.metrics().kafka_batches_waiting;
        if now > self.counted {
            gauge.inc_by((now - self.counted) as i64);
        } else {
            gauge.dec_by((self.counted - now) as i64);
        }
        self.counted = now;
    }

    /// Lets go of the waiting batches whose callers are gone (a session that ended: the batch
    /// before was not written, so neither is this one), and answers those waiting longer than
    /// a transaction may take (their callers try again).
    fn expire_waiting(&mut self) {
        let within = self.shared.settings.transaction_timeout.0;
        self.waiting.retain(|j| !j.reply.is_closed());
        let (old, young): (Vec<Job>, Vec<Job>) =
            std::mem::take(&mut self.waiting).into_iter().partition(|j| j.queued.elapsed() > within);
        self.waiting = young;
        for job in old {
            let reason = format!("the batch before it in its lane was not written within {within:?}");
            let _ = job.reply.send(Err(SinkError::Unavailable { what: "write", reason }));
        }
    }

    /// One transaction for the jobs of `group` that may write, and the batches waiting before
    /// them.
    async fn group(&mut self, new: Vec<Job>) {
        self.progressed = false;
        let metrics = self.shared.metrics();
        for job in &new {
            metrics.kafka_queue_seconds.observe(job.queued.elapsed().as_secs_f64());
        }
        self.expire_waiting();
        let mut group = std::mem::take(&mut self.waiting);
        group.extend(new);
        if self.producer.is_none()
            && let Err(e) = self.reopen().await
        {
            let reason = e.to_string();
            for job in group {
                let _ = job.reply.send(Err(SinkError::Unavailable { what: "kafka producer", reason: reason.clone() }));
            }
            return;
        }
        // Every job but a claim checks the edge's claim, and a batch reads its mark: both in a log
        // read settled since the producer reopened (the claim that fenced it is in it). Not at
        // the reopen itself: a claim must be written while the transactions of the producers
        // it will fence still hold the log unsettled.
        let checks = group.iter().any(|j| !matches!(j.work, Work::Claim(_)));
        if checks && !self.settled {
            if let Err(e) = self.shared.marks.read_settled().await {
                let reason = e.to_string();
                for job in group {
                    let _ = job.reply.send(Err(SinkError::Unavailable { what: "read marks", reason: reason.clone() }));
                }
                return;
            }
            self.settled = true;
        }
        let mut writes = Writes::default();
        // The marks this transaction raises, by key, with the claim token.
        let mut raised: HashMap<String, (String, u64)> = HashMap::new();
        let mut accepted = Vec::with_capacity(group.len());
        // Until no job is taken: a batch taken raises its lane's mark, which a waiting one may
        // have been waiting for.
        let mut pending = group;
        loop {
            let mut waits = Vec::new();
            let before = accepted.len();
            for job in pending {
                match self.take(job, &mut writes, &mut raised) {
                    Taken::Accepted(job) => accepted.push(job),
                    Taken::Waits(job) => waits.push(job),
                    Taken::Answered => {}
                }
            }
            if waits.is_empty() || accepted.len() == before {
                self.waiting = waits;
                break;
            }
            pending = waits;
        }
        // A group with nothing to write (marks asked, batches all resent) is no transaction.
        let transacted = !writes.is_empty();
        let result = if transacted {
            let started = std::time::Instant::now();
            let result = self.transact(writes).await;
            metrics.kafka_transaction_seconds.observe(started.elapsed().as_secs_f64());
            result
        } else {
            Ok(())
        };
        match result {
            Ok(()) => {
                self.progressed = !raised.is_empty();
                if transacted {
                    metrics.kafka_transactions.get_or_create(&OutcomeLabel { outcome: "committed" }).inc();
                    metrics.kafka_transaction_jobs.inc_by(accepted.len() as u64);
                }
                let mut committed = self.shared.committed.lock().unwrap_or_else(|e| e.into_inner());
                // Bounded by the lanes this bridge writes; the log has them all a moment later.
                if committed.len() > 100_000 {
                    committed.clear();
                }
                for (key, (_, up_to)) in &raised {
                    committed.insert(key.clone(), *up_to);
                }
                drop(committed);
                self.marks.extend(raised);
                for job in accepted {
                    let answer = match &job.work {
                        Work::Mark { epoch, lane } => {
                            let key = mark_key(&job.edge, epoch, *lane);
                            match self.shared.claims.held(&job.edge) {
                                Some(token) => Ok(self.known(&key, &token)),
                                None => Err(SinkError::Fenced { what: "mark", key: job.edge.clone() }),
                            }
                        }
                        _ => Ok(0),
                    };
                    let _ = job.reply.send(answer);
                }
            }
            Err(e) => {
                metrics.kafka_transactions.get_or_create(&OutcomeLabel { outcome: "failed" }).inc();
                let fenced = matches!(e, SinkError::Fenced { .. });
                let reason = e.to_string();
                for job in accepted {
                    // A fence of this producer is another bridge's claim of one of its edges:
                    // whose, the claims say when the caller tries again.
                    let answer = if fenced {
                        SinkError::Unavailable { what: "write", reason: reason.clone() }
                    } else {
                        kafka_like(&e)
                    };
                    let _ = job.reply.send(Err(answer));
                }
            }
        }
    }

    /// What the group does with `job`: its writes added to `writes` (a batch's mark to
    /// `raised`), or it waits, or it is answered (its edge is not this bridge's).
    fn take(&mut self, job: Job, writes: &mut Writes, raised: &mut HashMap<String, (String, u64)>) -> Taken {
        if let Work::Claim(w) = &job.work {
            writes.push(w.clone());
            return Taken::Accepted(job);
        }
        let Some(token) = self.shared.claims.held(&job.edge) else {
            let _ = job.reply.send(Err(SinkError::Fenced { what: "write", key: job.edge.clone() }));
            return Taken::Answered;
        };
        match &job.work {
            Work::Owned(w) => w.iter().for_each(|w| writes.push(w.clone())),
            Work::Batch { staged, after } => {
                let key = mark_key(&staged.edge, &staged.epoch, staged.lane);
                let mark = match raised.get(&key) {
                    Some((_, m)) => *m,
                    None => self.known(&key, &token),
                };
                if after.is_some_and(|a| mark < a) {
                    return Taken::Waits(job);
                }
                // A batch's records rise in seq (the batch's decoding refuses any other order,
                // `proto::compress::check_range`): those above the mark are its tail.
                let from = staged.records.partition_point(|r| r.seq <= mark);
                if let Some(up_to) = staged.records.last().map(|r| r.seq).filter(|&last| last > mark) {
                    writes.batch(staged.clone(), from);
                    let topic = &self.shared.marks_topic;
                    writes.push(Outgoing { seq: up_to, ..topic.put(key.clone(), up_to.to_string().into_bytes()) });
                    raised.insert(key, (token, up_to));
                }
            }
            Work::Mark { .. } | Work::Claim(_) => {}
        }
        Taken::Accepted(job)
    }

    /// The mark under `key` as this producer knows it for the claim `token`, else as the log
    /// has it (read settled when the claim was verified and when this producer opened, and
    /// nobody else writes it while the claim holds).
    fn known(&mut self, key: &str, token: &str) -> u64 {
        if let Some((t, m)) = self.marks.get(key)
            && t == token
        {
            return *m;
        }
        let stored = self.shared.marks.get(key).and_then(|v| super::parse_mark(&v)).unwrap_or(0);
        self.marks.insert(key.to_owned(), (token.to_owned(), stored));
        stored
    }

    /// Opens the producer (fencing its earlier self, settling what it left) and forgets the
    /// marks it kept: those of the log are used once read settled.
    async fn reopen(&mut self) -> Result<(), SinkError> {
        let producer = open_producer(producer_config(&self.shared.settings, &self.id)?, &self.id).await?;
        self.shared.opened(1);
        self.producer = Some(producer);
        self.marks.clear();
        Ok(())
    }

    /// One transaction of `writes`. After a failure the transaction is aborted and the
    /// producer kept (nothing of it was committed: its marks still hold), or, when that cannot
    /// be done, closed.
    async fn transact(&mut self, writes: Writes) -> Result<(), SinkError> {
        let Some(producer) = self.producer.take() else { return Err(SinkError::invalid("write", "no producer")) };
        let timeout = self.shared.settings.transaction_timeout.0;
        let (producer, result) = tokio::task::spawn_blocking(move || attempt(producer, &writes, timeout))
            .await
            .map_err(|e| SinkError::Task { what: "write", reason: e.to_string() })?;
        match producer {
            Some(p) => self.producer = Some(p),
            None => {
                self.shared.opened(-1);
                self.marks.clear();
                self.settled = false;
            }
        }
        result.map_err(|e| txn_error("write", &self.id, &e))
    }
}

/// The same error again, for each caller of a failed group.
fn kafka_like(e: &SinkError) -> SinkError {
    match e {
        SinkError::Unavailable { what, reason } => SinkError::Unavailable { what, reason: reason.clone() },
        SinkError::Kafka { what, code, reason } => SinkError::Kafka { what, code: *code, reason: reason.clone() },
        other => SinkError::Unavailable { what: "write", reason: other.to_string() },
    }
}
