//! A Kafka-like sink for the simulation: the transaction protocol the Kafka sink relies on,
//! and the sink's way of using it, so the seams between them (a transaction a crashed bridge
//! left open, a commit that arrives after the edge moved, a producer fenced, an abort, a
//! commit whose answer was lost, a mark committed behind another lane's open transaction) are
//! searched by seed like the rest of the system.
//!
//! [`Cluster`] is Kafka's side, as its protocol states it: each `transactional.id` has a
//! producer epoch, and opening a producer (`init_transactions`) raises it, fencing every
//! earlier producer of the id, and settles the transaction the id left (completes a commit
//! the coordinator had decided, aborts one that was open). A transaction open longer than its
//! timeout is aborted by the coordinator. A commit is decided first and readable once its
//! markers are written, a moment later. A `read_committed` reader sees committed records only,
//! and none past the first transaction still open or committing in a partition (the last
//! stable offset).
//!
//! [`Bridge`] is the Kafka sink's side (`cloud_bridge::sink::kafka::lanes`), kept step for
//! step: a producer per lane under the lane's id, opened when the lane first writes; after
//! opening, the marks are read *settled* (past every transaction open at that moment); a batch
//! drops what the lane's mark covers and writes the rest with the new mark in one
//! transaction; any failure but fencing drops the producer or aborts, and the next attempt
//! reads the mark again; the welcome's `committed` reads to the last stable offset, with what
//! this bridge committed itself. The lane's producer lives as long as the bridge process.
//! (The model runs in the simulation's own steps, so the shipped sink's rdkafka calls are not
//! what runs here: the real ones are proven against real brokers in `e2e/kafka_*.rs`, and
//! this model is kept to their algorithm.)
//!
//! Every lane's marks share one partition here, the worst case of the real marks topic (at
//! most three partitions); an edge's records have a partition of their own, as the edge id key
//! gives them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use shared::proto::{LaneSeq, RecordBody, Seq, WireRecord};

/// How long a transaction may stay open before the coordinator aborts it
/// (`sink.transaction_timeout`'s default).
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);

/// A producer as the coordinator knows it: its id and the epoch it was opened at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Producer {
    pub id: String,
    pub epoch: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Txn {
    Open {
        deadline: Instant,
    },
    /// Decided; readable once its markers are written.
    Committing {
        markers_at: Instant,
    },
    Committed,
    Aborted,
}

#[derive(Debug, Default)]
struct Coordinated {
    epoch: u32,
    open: Option<usize>,
}

/// What a partition holds.
#[derive(Debug, Clone)]
pub enum Body {
    Mark { key: String, seq: u64 },
    Record { epoch: String, lane: u8, seq: u64, message: Option<Message> },
}

#[derive(Debug, Clone)]
struct Entry {
    txn: usize,
    body: Body,
}

/// Why a transactional call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnError {
    /// Another producer of the id was opened since.
    Fenced,
    /// The coordinator aborted the transaction (it timed out).
    Aborted,
}

/// The brokers and their transaction coordinator.
#[derive(Debug, Default)]
pub struct Cluster {
    ids: BTreeMap<String, Coordinated>,
    txns: Vec<Txn>,
    marks: Vec<Entry>,
    records: BTreeMap<String, Vec<Entry>>,
    /// For the run's account: transactions aborted, calls refused as fenced, lanes that
    /// found the marks not settled when they opened.
    pub aborted: u64,
    pub fenced: u64,
    pub unsettled: u64,
}

impl Cluster {
    /// `init_transactions`: a new epoch of `id`, fencing the earlier ones; the transaction
    /// the id left open is aborted, one whose commit was decided is completed.
    pub fn init(&mut self, id: &str) -> Producer {
        let c = self.ids.entry(id.to_owned()).or_default();
        if let Some(t) = c.open.take() {
            match self.txns[t] {
                Txn::Committing { .. } => self.txns[t] = Txn::Committed,
                Txn::Open { .. } => {
                    self.txns[t] = Txn::Aborted;
                    self.aborted += 1;
                }
                Txn::Committed | Txn::Aborted => {}
            }
        }
        c.epoch += 1;
        Producer { id: id.to_owned(), epoch: c.epoch }
    }

    fn current(&self, p: &Producer) -> Result<(), TxnError> {
        match self.ids.get(&p.id) {
            Some(c) if c.epoch == p.epoch => Ok(()),
            _ => Err(TxnError::Fenced),
        }
    }

    /// Begins a transaction of `p` and appends `writes` to it: records into `edge`'s
    /// partition, marks into the marks partition.
    pub fn write(&mut self, p: &Producer, edge: &str, writes: Vec<Body>, now: Instant) -> Result<usize, TxnError> {
        self.current(p).inspect_err(|_| self.fenced += 1)?;
        let t = self.txns.len();
        self.txns.push(Txn::Open { deadline: now + TRANSACTION_TIMEOUT });
        if let Some(c) = self.ids.get_mut(&p.id) {
            c.open = Some(t);
        }
        for body in writes {
            let entry = Entry { txn: t, body };
            match &entry.body {
                Body::Mark { .. } => self.marks.push(entry),
                Body::Record { .. } => self.records.entry(edge.to_owned()).or_default().push(entry),
            }
        }
        Ok(t)
    }

    /// `commit_transaction` of `p`'s transaction `t`: decided now, readable at `markers_at`.
    pub fn commit(&mut self, p: &Producer, t: usize, markers_at: Instant) -> Result<(), TxnError> {
        self.current(p).inspect_err(|_| self.fenced += 1)?;
        match self.txns[t] {
            Txn::Open { .. } => {
                self.txns[t] = Txn::Committing { markers_at };
                Ok(())
            }
            _ => Err(TxnError::Aborted),
        }
    }

    /// `abort_transaction` of `p`'s transaction `t`.
    pub fn abort(&mut self, p: &Producer, t: usize) {
        if self.current(p).is_ok() && matches!(self.txns[t], Txn::Open { .. }) {
            self.txns[t] = Txn::Aborted;
            self.aborted += 1;
            if let Some(c) = self.ids.get_mut(&p.id) {
                c.open = None;
            }
        }
    }

    /// Markers written and timed-out transactions aborted, up to `now`.
    pub fn tick(&mut self, now: Instant) {
        for c in self.ids.values_mut() {
            let Some(t) = c.open else { continue };
            match self.txns[t] {
                Txn::Open { deadline } if deadline <= now => {
                    // The coordinator bumps the epoch as it aborts: the producer is fenced.
                    self.txns[t] = Txn::Aborted;
                    self.aborted += 1;
                    c.open = None;
                    c.epoch += 1;
                }
                Txn::Committing { markers_at } if markers_at <= now => {
                    self.txns[t] = Txn::Committed;
                    c.open = None;
                }
                _ => {}
            }
        }
    }

    /// When [`Self::tick`] next changes something.
    pub fn deadline(&self) -> Option<Instant> {
        self.ids
            .values()
            .filter_map(|c| c.open)
            .filter_map(|t| match self.txns[t] {
                Txn::Open { deadline } => Some(deadline),
                Txn::Committing { markers_at } => Some(markers_at),
                _ => None,
            })
            .min()
    }

    /// Whether `p`'s last commit is decided and its markers not yet written.
    fn committing(&self, p: &Producer) -> bool {
        let open = self.ids.get(&p.id).and_then(|c| c.open);
        open.is_some_and(|t| matches!(self.txns[t], Txn::Committing { .. }))
    }

    fn pending(&self, t: usize) -> bool {
        matches!(self.txns[t], Txn::Open { .. } | Txn::Committing { .. })
    }

    /// What a `read_committed` reader of `entries` sees: up to the last stable offset.
    fn stable<'a>(&'a self, entries: &'a [Entry]) -> impl Iterator<Item = &'a Body> + 'a {
        entries
            .iter()
            .take_while(|e| !self.pending(e.txn))
            .filter(|e| self.txns[e.txn] == Txn::Committed)
            .map(|e| &e.body)
    }

    /// Whether no transaction is open or committing in the marks partition.
    fn marks_settled(&self) -> bool {
        !self.marks.iter().any(|e| self.pending(e.txn))
    }

    /// The latest value of mark `key` a `read_committed` reader sees.
    fn mark(&self, key: &str) -> Option<u64> {
        self.stable(&self.marks)
            .filter_map(|b| match b {
                Body::Mark { key: k, seq } if k == key => Some(*seq),
                _ => None,
            })
            .last()
    }

    /// Every record of every edge a `read_committed` reader sees, in partition order.
    pub fn read_committed(&self) -> Vec<(String, &Body)> {
        self.records.iter().flat_map(|(edge, entries)| self.stable(entries).map(move |b| (edge.clone(), b))).collect()
    }
}

fn mark_key(edge: &str, epoch: &str, lane: u8) -> String {
    format!("m/{edge}/{epoch}/{lane}")
}

/// A message's MQTT topic and payload.
pub type Message = (String, Vec<u8>);

/// A message as a consumer reads it: edge, topic, payload.
pub type Read = (String, String, Vec<u8>);

/// A batch addressed: what staging gives the Kafka sink.
#[derive(Debug, Clone)]
pub struct Staged {
    pub edge: String,
    pub epoch: String,
    pub lane: u8,
    pub records: Vec<(u64, Option<Message>)>,
}

impl Staged {
    pub fn new(edge: &str, epoch: String, lane: u8, records: Vec<WireRecord>) -> Self {
        let records = records
            .into_iter()
            .map(|r| {
                let message = match r.body {
                    RecordBody::Message(m) => Some((m.topic, m.payload.to_vec())),
                    RecordBody::Gap(_) => None,
                };
                (r.seq.0, message)
            })
            .collect();
        Self { edge: edge.to_owned(), epoch, lane, records }
    }
}

/// A lane's producer on this bridge and the marks it keeps.
#[derive(Debug)]
struct LaneProducer {
    producer: Producer,
    /// Whether the marks were read, settled, since it opened.
    read: bool,
    marks: BTreeMap<String, u64>,
}

/// What one attempt at writing a batch did.
#[derive(Debug)]
pub enum Write {
    /// The marks are not settled yet, or the lane's last commit not written: try again later.
    NotYet,
    /// The lane's mark covers the whole batch: nothing written.
    Nothing,
    /// Transaction `txn` holds the batch's new records and mark `up_to`, to be committed.
    Open { txn: usize, producer: Producer, up_to: u64 },
}

/// How the commit of a batch went, as the bridge hears it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    Ok,
    /// The transaction failed before its commit: aborted, the producer kept.
    Aborted,
    /// Committed, but the answer was lost: the producer is dropped.
    AnswerLost,
}

/// The Kafka sink of one bridge process: lost with the process.
#[derive(Debug, Default)]
pub struct Bridge {
    lanes: BTreeMap<String, LaneProducer>,
    /// The marks this bridge committed (readable a moment after the commit returns).
    committed: BTreeMap<String, u64>,
}

impl Bridge {
    fn id(edge: &str, lane: u8) -> String {
        format!("edge-bridge.{edge}.{lane}")
    }

    /// The welcome's marks: to the last stable offset, with what this bridge committed.
    pub fn committed(&self, cluster: &Cluster, edge: &str, epoch: &str) -> Vec<LaneSeq> {
        let prefix = format!("m/{edge}/{epoch}/");
        let mut lanes: BTreeMap<u8, u64> = BTreeMap::new();
        for b in cluster.stable(&cluster.marks) {
            if let Body::Mark { key, seq } = b
                && let Some(lane) = key.strip_prefix(&prefix).and_then(|l| l.parse().ok())
            {
                lanes.insert(lane, *seq);
            }
        }
        for (key, seq) in self.committed.range(prefix.clone()..).take_while(|(k, _)| k.starts_with(&prefix)) {
            if let Ok(lane) = key[prefix.len()..].parse() {
                let m = lanes.entry(lane).or_insert(0);
                *m = (*m).max(*seq);
            }
        }
        lanes.into_iter().map(|(lane, seq)| LaneSeq { lane: shared::proto::Lane(lane), seq: Seq(seq) }).collect()
    }

    /// One attempt at writing `staged`: the lane's producer opened (fencing the ones before)
    /// and the marks read settled if it was not, then the batch less what the mark covers.
    pub fn write(&mut self, cluster: &mut Cluster, staged: &Staged, now: Instant) -> Result<Write, TxnError> {
        let id = Self::id(&staged.edge, staged.lane);
        let lane = self.lanes.entry(id.clone()).or_insert_with(|| LaneProducer {
            producer: cluster.init(&id),
            read: false,
            marks: BTreeMap::new(),
        });
        if !lane.read {
            if !cluster.marks_settled() {
                cluster.unsettled += 1;
                return Ok(Write::NotYet);
            }
            lane.read = true;
        }
        if cluster.committing(&lane.producer) {
            // Kafka answers CONCURRENT_TRANSACTIONS until the last commit's markers are
            // written; the client retries.
            return Ok(Write::NotYet);
        }
        let key = mark_key(&staged.edge, &staged.epoch, staged.lane);
        let mark = *lane.marks.entry(staged.epoch.clone()).or_insert_with(|| cluster.mark(&key).unwrap_or(0));
        let fresh: Vec<_> = staged.records.iter().filter(|(seq, _)| *seq > mark).collect();
        let Some(up_to) = fresh.last().map(|(seq, _)| *seq) else { return Ok(Write::Nothing) };
        let mut writes: Vec<Body> = fresh
            .into_iter()
            .map(|(seq, message)| Body::Record {
                epoch: staged.epoch.clone(),
                lane: staged.lane,
                seq: *seq,
                message: message.clone(),
            })
            .collect();
        writes.push(Body::Mark { key, seq: up_to });
        match cluster.write(&lane.producer, &staged.edge, writes, now) {
            Ok(txn) => Ok(Write::Open { txn, producer: lane.producer.clone(), up_to }),
            Err(e) => {
                self.lanes.remove(&id);
                Err(e)
            }
        }
    }

    /// Commits a batch's transaction, going as `how` says. `Ok(true)`: committed and known to
    /// be; `Ok(false)`: the batch must be tried again ([`Self::write`] reads the mark anew if
    /// the producer went).
    pub fn commit(
        &mut self,
        cluster: &mut Cluster,
        staged: &Staged,
        open: (usize, &Producer, u64),
        how: Commit,
        markers_at: Instant,
    ) -> Result<bool, TxnError> {
        let (txn, producer, up_to) = open;
        let id = Self::id(&staged.edge, staged.lane);
        if how == Commit::Aborted {
            cluster.abort(producer, txn);
            return Ok(false);
        }
        match cluster.commit(producer, txn, markers_at) {
            Ok(()) if how == Commit::AnswerLost => {
                self.lanes.remove(&id);
                Ok(false)
            }
            Ok(()) => {
                if let Some(lane) = self.lanes.get_mut(&id) {
                    lane.marks.insert(staged.epoch.clone(), up_to);
                }
                self.committed.insert(mark_key(&staged.edge, &staged.epoch, staged.lane), up_to);
                Ok(true)
            }
            Err(TxnError::Aborted) => {
                self.lanes.remove(&id);
                Ok(false)
            }
            Err(TxnError::Fenced) => {
                self.lanes.remove(&id);
                Err(TxnError::Fenced)
            }
        }
    }

    /// Forgets the lane's producer (a publish holding it was abandoned).
    pub fn drop_lane(&mut self, edge: &str, lane: u8) {
        self.lanes.remove(&Self::id(edge, lane));
    }

    /// The lane's mark as its producer knows it; `None` if the lane has no producer here.
    pub fn mark(&self, edge: &str, epoch: &str, lane: u8) -> Option<u64> {
        self.lanes.get(&Self::id(edge, lane)).and_then(|l| l.marks.get(epoch).copied())
    }
}

/// What a run's transactions went through.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub committed: u64,
    pub aborted: u64,
    pub fenced: u64,
    /// Commits of a dead bridge or an ended session that reached the coordinator and held.
    pub late_committed: u64,
    pub unsettled: u64,
}

/// The Kafka-like sink: the cluster, the bridge process's side of it, and the commits a
/// crashed bridge had sent that reach the coordinator later.
#[derive(Debug, Default)]
pub struct Model {
    pub cluster: Cluster,
    pub bridge: Bridge,
    /// (when, producer, transaction): a dead bridge's commit request still on its way.
    pub late_commits: Vec<(Instant, Producer, usize)>,
    pub late_committed: u64,
}

impl Model {
    pub fn tick(&mut self, now: Instant, trace: &mut super::Trace) {
        let (due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.late_commits).into_iter().partition(|c| c.0 <= now);
        self.late_commits = later;
        for (_, producer, txn) in due {
            let outcome = self.cluster.commit(&producer, txn, now);
            if outcome.is_ok() {
                self.late_committed += 1;
            }
            trace.line(format!("kafka: a dead bridge's commit of {} arrives: {outcome:?}", producer.id));
        }
        self.cluster.tick(now);
    }

    pub fn counts(&self) -> Counts {
        let c = &self.cluster;
        Counts {
            committed: c.txns.iter().filter(|t| **t == Txn::Committed).count() as u64,
            aborted: c.aborted,
            fenced: c.fenced,
            late_committed: self.late_committed,
            unsettled: c.unsettled,
        }
    }

    pub fn deadline(&self) -> Option<Instant> {
        self.late_commits.iter().map(|c| c.0).chain(self.cluster.deadline()).min()
    }

    /// What a `read_committed` consumer reads: (edge, topic, payload) of each message; and
    /// each lane whose records are not in seq order, or repeat one.
    pub fn records(&self) -> (Vec<Read>, Vec<String>) {
        let mut out = Vec::new();
        let mut last: BTreeMap<(String, String, u8), u64> = BTreeMap::new();
        let mut disorder = Vec::new();
        for (edge, body) in self.cluster.read_committed() {
            let Body::Record { epoch, lane, seq, message } = body else { continue };
            let prev = last.insert((edge.clone(), epoch.clone(), *lane), *seq);
            if prev.is_some_and(|p| p >= *seq) {
                disorder.push(format!("{edge} {epoch}:{lane}: seq {seq} after {}", prev.unwrap_or(0)));
            }
            if let Some((topic, payload)) = message {
                out.push((edge.clone(), topic.clone(), payload.clone()));
            }
        }
        (out, disorder)
    }
}

#[cfg(test)]
mod tests {
    //! The model's protocol, each path taken on purpose (the seeds take them by chance).

    use super::*;

    fn batch(edge: &str, seqs: std::ops::RangeInclusive<u64>) -> Staged {
        let records =
            seqs.map(|seq| crate::fixtures::wire_record(seq, &format!("t/{seq}"), format!("{seq}"))).collect();
        Staged::new(edge, "ep".into(), 0, records)
    }

    fn open(w: Write) -> (usize, Producer, u64) {
        match w {
            Write::Open { txn, producer, up_to } => (txn, producer, up_to),
            other => panic!("expected a transaction, got {other:?}"),
        }
    }

    fn seqs(m: &Model, edge: &str) -> Vec<u64> {
        m.cluster
            .read_committed()
            .into_iter()
            .filter(|(e, _)| e == edge)
            .filter_map(|(_, b)| match b {
                Body::Record { seq, .. } => Some(*seq),
                Body::Mark { .. } => None,
            })
            .collect()
    }

    /// A mark committed behind another lane's open transaction is hidden from a
    /// `read_committed` reader; a lane opening then waits until that transaction ends, and its
    /// resend of the committed batch writes nothing.
    #[test]
    fn a_hidden_mark_is_waited_for_and_the_resend_is_dropped() {
        let t0 = Instant::now();
        let mut m = Model::default();
        let (a, b) = (batch("edge-a", 1..=3), batch("edge-b", 1..=2));
        // Edge-b's lane is open (its marks read) before edge-a's transaction begins.
        let first = batch("edge-b", 1..=1);
        let t = open(m.bridge.write(&mut m.cluster, &first, t0).unwrap());
        m.bridge.commit(&mut m.cluster, &first, (t.0, &t.1, t.2), Commit::Ok, t0).unwrap();
        m.tick(t0, &mut super::super::Trace::for_tests());
        let (ta, pa, _) = open(m.bridge.write(&mut m.cluster, &a, t0).unwrap());
        let tb = open(m.bridge.write(&mut m.cluster, &b, t0).unwrap());
        m.bridge.commit(&mut m.cluster, &b, (tb.0, &tb.1, tb.2), Commit::Ok, t0).unwrap();
        m.tick(t0, &mut super::super::Trace::for_tests());
        // The bridge dies: edge-a's transaction stays open, edge-b's mark is behind it.
        m.bridge = Bridge::default();
        let heard = m.bridge.committed(&m.cluster, "edge-b", "ep");
        assert_eq!(heard[0].seq, Seq(1), "the welcome may say less than is committed");
        assert!(matches!(m.bridge.write(&mut m.cluster, &b, t0).unwrap(), Write::NotYet));
        assert_eq!(m.cluster.unsettled, 1);
        // Edge-a's lane opens again (fencing the dead bridge's producer, aborting its batch).
        let again = open(m.bridge.write(&mut m.cluster, &a, t0).unwrap_or_else(|e| panic!("{e:?}")));
        assert_eq!(m.cluster.aborted, 1);
        assert!(matches!(m.cluster.commit(&pa, ta, t0), Err(TxnError::Fenced)), "the dead bridge's commit");
        m.bridge.commit(&mut m.cluster, &a, (again.0, &again.1, again.2), Commit::Ok, t0).unwrap();
        m.tick(t0, &mut super::super::Trace::for_tests());
        assert!(matches!(m.bridge.write(&mut m.cluster, &b, t0).unwrap(), Write::Nothing));
        assert_eq!(seqs(&m, "edge-a"), [1, 2, 3]);
        assert_eq!(seqs(&m, "edge-b"), [1, 2]);
    }

    /// A commit decided before the bridge died is completed by the next producer of the id,
    /// which then finds the batch covered; a commit whose answer was lost likewise.
    #[test]
    fn a_decided_commit_is_completed_and_a_lost_answer_writes_nothing_twice() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(1);
        let mut m = Model::default();
        let a = batch("edge-a", 1..=3);
        let t = open(m.bridge.write(&mut m.cluster, &a, t0).unwrap());
        m.bridge.commit(&mut m.cluster, &a, (t.0, &t.1, t.2), Commit::Ok, later).unwrap();
        m.bridge = Bridge::default();
        assert!(matches!(m.bridge.write(&mut m.cluster, &a, t0).unwrap(), Write::Nothing));
        let b = batch("edge-a", 3..=5);
        let t = open(m.bridge.write(&mut m.cluster, &b, t0).unwrap());
        assert!(!m.bridge.commit(&mut m.cluster, &b, (t.0, &t.1, t.2), Commit::AnswerLost, t0).unwrap());
        m.tick(t0, &mut super::super::Trace::for_tests());
        assert!(matches!(m.bridge.write(&mut m.cluster, &b, t0).unwrap(), Write::Nothing));
        assert_eq!(seqs(&m, "edge-a"), [1, 2, 3, 4, 5]);
    }

    /// A transaction open past its timeout is aborted and its producer fenced; a late commit
    /// of a producer nobody replaced lands.
    #[test]
    fn a_timed_out_transaction_is_aborted_and_a_late_commit_lands_if_not_fenced() {
        let t0 = Instant::now();
        let mut m = Model::default();
        let a = batch("edge-a", 1..=2);
        let (txn, p, _) = open(m.bridge.write(&mut m.cluster, &a, t0).unwrap());
        m.tick(t0 + TRANSACTION_TIMEOUT, &mut super::super::Trace::for_tests());
        assert_eq!(m.cluster.aborted, 1);
        assert_eq!(m.cluster.commit(&p, txn, t0), Err(TxnError::Fenced));
        m.bridge = Bridge::default();
        let b = batch("edge-b", 1..=2);
        let (txn, p, _) = open(m.bridge.write(&mut m.cluster, &b, t0).unwrap());
        m.bridge = Bridge::default();
        m.late_commits.push((t0, p, txn));
        m.tick(t0, &mut super::super::Trace::for_tests());
        assert_eq!(m.late_committed, 1);
        assert!(seqs(&m, "edge-a").is_empty());
        assert_eq!(seqs(&m, "edge-b"), [1, 2]);
    }
}
