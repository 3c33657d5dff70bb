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
    Mark {
        key: String,
        seq: u64,
    },
    /// An edge's claim (`o/<edge>`): its token, the claiming bridge's producers, those it fenced.
    Claim {
        edge: String,
        token: String,
        ids: Vec<String>,
        fence: Vec<String>,
    },
    /// A claim verified (`v/<edge>`).
    Verified {
        edge: String,
        token: String,
    },
    Record {
        epoch: String,
        lane: u8,
        seq: u64,
        message: Option<Message>,
    },
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
    /// Producers of another bridge process fenced by a claim.
    pub fences: u64,
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
                Body::Mark { .. } | Body::Claim { .. } | Body::Verified { .. } => self.marks.push(entry),
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

    /// The transactions open or committing in the marks partition: what a read settled now
    /// waits for (`Follower::read_settled`).
    fn pending_marks(&self) -> Vec<usize> {
        let mut t: Vec<usize> = self.marks.iter().map(|e| e.txn).filter(|t| self.pending(*t)).collect();
        t.dedup();
        t
    }

    /// Whether each of `txns` has ended (and a reader is past it).
    fn done(&self, txns: &[usize]) -> bool {
        !txns.iter().any(|t| self.pending(*t))
    }

    /// The last claim of `edge` a `read_committed` reader sees: token, ids, those it fenced.
    fn claim(&self, edge: &str) -> Option<(String, Vec<String>, Vec<String>)> {
        self.stable(&self.marks)
            .filter_map(|b| match b {
                Body::Claim { edge: e, token, ids, fence } if e == edge => {
                    Some((token.clone(), ids.clone(), fence.clone()))
                }
                _ => None,
            })
            .last()
    }

    /// The last verification of a claim of `edge` a `read_committed` reader sees.
    fn verified(&self, edge: &str) -> Option<String> {
        self.stable(&self.marks)
            .filter_map(|b| match b {
                Body::Verified { edge: e, token } if e == edge => Some(token.clone()),
                _ => None,
            })
            .last()
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

/// One of the bridge's producers and the marks it keeps.
#[derive(Debug, Default)]
struct Prod {
    producer: Option<Producer>,
    /// Whether this id was opened before in this process (a reopen must read settled).
    opened: bool,
    /// After a reopen: read the marks settled before the next write (the transactions pending
    /// then, once taken).
    settle: Option<Option<Vec<usize>>>,
    /// The batch in its transaction: (txn, mark key, claim token, up to).
    busy: Option<(usize, String, String, u64)>,
    /// Per mark key: the claim token it was read or written under, and the mark.
    marks: BTreeMap<String, (String, u64)>,
}

/// A claim on its way: written and its fences made; verified once the marks are settled past
/// the transactions pending then.
#[derive(Debug)]
struct Claiming {
    token: String,
    /// The claim's own transaction, and the others pending when it was written.
    own: usize,
    pending: Vec<usize>,
}

/// What one attempt at writing a batch did.
#[derive(Debug)]
pub enum Write {
    /// The marks are not settled yet, or the producer is in another transaction: try again.
    NotYet,
    /// The lane's mark covers the whole batch: nothing written.
    Nothing,
    /// Transaction `txn` holds the batch's new records and mark `up_to`, to be committed.
    Open { txn: usize, producer: Producer, up_to: u64 },
}

/// How a claim stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The edge is this bridge's.
    Held,
    /// Not yet: its producer is in a transaction, or the marks are not settled.
    Wait,
    /// Another claim is last: the hello fails.
    Lost,
}

/// How the commit of a batch went, as the bridge hears it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    Ok,
    /// The transaction failed before its commit: aborted, the producer kept.
    Aborted,
    /// Committed, but the answer was lost: the producer is closed.
    AnswerLost,
}

/// Producers of one bridge.
const PRODUCERS: u8 = 2;

/// The Kafka sink of one bridge process (`cloud_bridge::sink::kafka::pool` and `claims`): lost
/// with the process.
#[derive(Debug)]
pub struct Bridge {
    instance: u64,
    prods: BTreeMap<String, Prod>,
    /// Edges this bridge claimed and verified, with the claim's token.
    verified: BTreeMap<String, String>,
    claiming: BTreeMap<String, Claiming>,
    next: u64,
    /// The marks this bridge committed (readable a moment after the commit returns).
    committed: BTreeMap<String, u64>,
}

impl Bridge {
    /// The bridge process `instance` (a new one at each start).
    pub fn new(instance: u64) -> Self {
        Self {
            instance,
            prods: BTreeMap::new(),
            verified: BTreeMap::new(),
            claiming: BTreeMap::new(),
            next: 1,
            committed: BTreeMap::new(),
        }
    }

    fn ids(&self) -> Vec<String> {
        (0..PRODUCERS).map(|n| format!("edge-bridge.{}.{n}", self.instance)).collect()
    }

    /// The producer `edge` hashes to.
    fn id(&self, edge: &str) -> String {
        let n = edge.bytes().map(u32::from).sum::<u32>() % u32::from(PRODUCERS);
        format!("edge-bridge.{}.{n}", self.instance)
    }

    /// The producer of `id`, opened if it is not.
    fn open(cluster: &mut Cluster, prods: &mut BTreeMap<String, Prod>, id: &str) -> Producer {
        let prod = prods.entry(id.to_owned()).or_default();
        if let Some(p) = &prod.producer {
            return p.clone();
        }
        let p = cluster.init(id);
        if prod.opened {
            prod.settle = Some(None);
        }
        prod.opened = true;
        prod.marks.clear();
        prod.producer = Some(p.clone());
        p
    }

    fn close(&mut self, id: &str) {
        if let Some(prod) = self.prods.get_mut(id) {
            prod.producer = None;
            prod.busy = None;
            prod.marks.clear();
        }
    }

    /// The token of this bridge's claim of `edge` if it holds it: verified, and the last the
    /// log shows.
    fn held(&self, cluster: &Cluster, edge: &str) -> Option<String> {
        let token = self.verified.get(edge)?;
        (cluster.claim(edge).map(|c| c.0) == Some(token.clone())).then(|| token.clone())
    }

    /// Takes `edge` (`Pool::claim`): its claim committed through the edge's producer, the
    /// producers of the claims before fenced, then, once the marks are settled past what was
    /// pending, verified if it is still the last; the verification written when the producer
    /// is free.
    pub fn claim(&mut self, cluster: &mut Cluster, edge: &str, now: Instant) -> Claim {
        if self.held(cluster, edge).is_some() {
            return Claim::Held;
        }
        let id = self.id(edge);
        if !self.claiming.contains_key(edge) {
            let producer = Self::open(cluster, &mut self.prods, &id);
            if self.prods.get(&id).is_some_and(|p| p.busy.is_some()) || cluster.committing(&producer) {
                return Claim::Wait;
            }
            let mut fence = Vec::new();
            if let Some((token, ids, before)) = cluster.claim(edge) {
                if cluster.verified(edge) != Some(token) {
                    fence.extend(before);
                }
                fence.extend(ids);
            }
            let own = self.ids();
            let mut seen = std::collections::BTreeSet::new();
            fence.retain(|id| !own.contains(id) && seen.insert(id.clone()));
            let token = format!("{}/{}", self.instance, self.next);
            self.next += 1;
            let body = Body::Claim { edge: edge.to_owned(), token: token.clone(), ids: own, fence: fence.clone() };
            let written = cluster
                .write(&producer, edge, vec![body], now)
                .and_then(|t| cluster.commit(&producer, t, now).map(|_| t));
            let Ok(own) = written else {
                self.close(&id);
                return Claim::Wait;
            };
            for victim in &fence {
                cluster.init(victim);
                cluster.fences += 1;
            }
            let pending = cluster.pending_marks().into_iter().filter(|t| *t != own).collect();
            self.claiming.insert(edge.to_owned(), Claiming { token, own, pending });
        }
        let Some(c) = self.claiming.get(edge) else { return Claim::Wait };
        if !cluster.done(&c.pending) {
            cluster.unsettled += 1;
            return Claim::Wait;
        }
        if !cluster.done(&[c.own]) {
            return Claim::Wait;
        }
        let Some(c) = self.claiming.remove(edge) else { return Claim::Wait };
        if cluster.claim(edge).map(|l| l.0) != Some(c.token.clone()) {
            return Claim::Lost;
        }
        self.verified.insert(edge.to_owned(), c.token.clone());
        let producer = Self::open(cluster, &mut self.prods, &id);
        let free = self.prods.get(&id).is_some_and(|p| p.busy.is_none() && p.settle.is_none());
        if free && !cluster.committing(&producer) {
            let body = Body::Verified { edge: edge.to_owned(), token: c.token };
            if cluster.write(&producer, edge, vec![body], now).and_then(|t| cluster.commit(&producer, t, now)).is_err()
            {
                self.close(&id);
            }
        }
        Claim::Held
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

    /// The mark of `key` as `prod` knows it under `token`, else as the log has it.
    fn known(cluster: &Cluster, prod: &mut Prod, key: &str, token: &str) -> u64 {
        if let Some((t, m)) = prod.marks.get(key)
            && t == token
        {
            return *m;
        }
        let stored = cluster.mark(key).unwrap_or(0);
        prod.marks.insert(key.to_owned(), (token.to_owned(), stored));
        stored
    }

    /// One attempt at writing `staged` (`Worker::group`, a group of one): the edge's claim
    /// checked, its producer opened if it is not and the marks read settled after a reopen,
    /// then the batch less what the mark covers. `Err(Fenced)`: the claim is not this bridge's.
    pub fn write(&mut self, cluster: &mut Cluster, staged: &Staged, now: Instant) -> Result<Write, TxnError> {
        let id = self.id(&staged.edge);
        let producer = Self::open(cluster, &mut self.prods, &id);
        let Some(prod) = self.prods.get_mut(&id) else { return Ok(Write::NotYet) };
        if let Some(settle) = &mut prod.settle {
            let pending = settle.get_or_insert_with(|| cluster.pending_marks());
            if !cluster.done(pending) {
                cluster.unsettled += 1;
                return Ok(Write::NotYet);
            }
            prod.settle = None;
        }
        if prod.busy.is_some() || cluster.committing(&producer) {
            // One transaction at a time; Kafka answers CONCURRENT_TRANSACTIONS until the last
            // commit's markers are written.
            return Ok(Write::NotYet);
        }
        let Some(token) = self.held(cluster, &staged.edge) else { return Err(TxnError::Fenced) };
        let Some(prod) = self.prods.get_mut(&id) else { return Ok(Write::NotYet) };
        let key = mark_key(&staged.edge, &staged.epoch, staged.lane);
        let mark = Self::known(cluster, prod, &key, &token);
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
        writes.push(Body::Mark { key: key.clone(), seq: up_to });
        match cluster.write(&producer, &staged.edge, writes, now) {
            Ok(txn) => {
                prod.busy = Some((txn, key, token, up_to));
                Ok(Write::Open { txn, producer, up_to })
            }
            Err(_) => {
                self.close(&id);
                Ok(Write::NotYet)
            }
        }
    }

    /// Commits a batch's transaction, going as `how` says. `true`: committed and known to be;
    /// `false`: the batch must be tried again ([`Self::write`] checks the claim and reads the
    /// mark anew if the producer was closed).
    pub fn commit(
        &mut self,
        cluster: &mut Cluster,
        staged: &Staged,
        open: (usize, &Producer, u64),
        how: Commit,
        markers_at: Instant,
    ) -> bool {
        let (txn, producer, _) = open;
        let id = producer.id.clone();
        let busy = self.prods.get_mut(&id).and_then(|p| p.busy.take_if(|b| b.0 == txn));
        if how == Commit::Aborted {
            cluster.abort(producer, txn);
            return false;
        }
        match cluster.commit(producer, txn, markers_at) {
            Ok(()) if how == Commit::AnswerLost => {
                self.close(&id);
                false
            }
            Ok(()) => {
                if let (Some(prod), Some((_, key, token, up_to))) = (self.prods.get_mut(&id), busy) {
                    prod.marks.insert(key, (token, up_to));
                    self.committed.insert(mark_key(&staged.edge, &staged.epoch, staged.lane), up_to);
                }
                true
            }
            Err(_) => {
                self.close(&id);
                false
            }
        }
    }

    /// The lane's mark as the edge's producer knows it (`Work::Mark`); `Err(Fenced)` if the
    /// edge's claim is not this bridge's.
    pub fn mark(&mut self, cluster: &Cluster, edge: &str, epoch: &str, lane: u8) -> Result<u64, TxnError> {
        let Some(token) = self.held(cluster, edge) else { return Err(TxnError::Fenced) };
        let id = self.id(edge);
        let prod = self.prods.entry(id).or_default();
        Ok(Self::known(cluster, prod, &mark_key(edge, epoch, lane), &token))
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
    /// Producers of a bridge before fenced by a claim.
    pub fences: u64,
}

/// The Kafka-like sink: the cluster, the bridge process's side of it, and the commits a
/// crashed bridge had sent that reach the coordinator later.
#[derive(Debug)]
pub struct Model {
    pub cluster: Cluster,
    pub bridge: Bridge,
    /// Bridge processes started.
    instances: u64,
    /// (when, producer, transaction): a dead bridge's commit request still on its way.
    pub late_commits: Vec<(Instant, Producer, usize)>,
    /// (when, batch, transaction): a live bridge's commit of a batch whose session ended (its
    /// producer's task goes on with it).
    pub worker_commits: Vec<(Instant, Staged, (usize, Producer, u64))>,
    pub late_committed: u64,
}

impl Default for Model {
    fn default() -> Self {
        Self {
            cluster: Cluster::default(),
            bridge: Bridge::new(1),
            instances: 1,
            late_commits: Vec::new(),
            worker_commits: Vec::new(),
            late_committed: 0,
        }
    }
}

impl Model {
    /// The bridge process dies and another starts: the commits its producers' tasks still had
    /// to make may reach the coordinator, or not (`keep`).
    pub fn restart(&mut self, mut keep: impl FnMut() -> bool) {
        for (at, _, (txn, producer, _)) in std::mem::take(&mut self.worker_commits) {
            if keep() {
                self.late_commits.push((at, producer, txn));
            }
        }
        self.instances += 1;
        self.bridge = Bridge::new(self.instances);
    }

    pub fn tick(&mut self, now: Instant, trace: &mut super::Trace) {
        let (due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.worker_commits).into_iter().partition(|c| c.0 <= now);
        self.worker_commits = later;
        for (_, staged, (txn, producer, up_to)) in due {
            let done = self.bridge.commit(&mut self.cluster, &staged, (txn, &producer, up_to), Commit::Ok, now);
            trace.line(format!("kafka: {}'s commit without its session: {done}", producer.id));
        }
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
            fences: c.fences,
        }
    }

    pub fn deadline(&self) -> Option<Instant> {
        let worker = self.worker_commits.iter().map(|c| c.0);
        self.late_commits.iter().map(|c| c.0).chain(worker).chain(self.cluster.deadline()).min()
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
                _ => None,
            })
            .collect()
    }

    fn trace() -> super::super::Trace {
        super::super::Trace::for_tests()
    }

    /// Claims `edge` for the model's bridge, the cluster ticking at `t` meanwhile.
    fn claim(m: &mut Model, edge: &str, t: Instant) {
        for _ in 0..10 {
            match m.bridge.claim(&mut m.cluster, edge, t) {
                Claim::Held => {
                    // Its verification's markers.
                    m.tick(t, &mut trace());
                    return;
                }
                Claim::Wait => m.tick(t, &mut trace()),
                Claim::Lost => panic!("{edge}: claim lost"),
            }
        }
        panic!("{edge}: claim not held");
    }

    fn write(m: &mut Model, staged: &Staged, t: Instant) -> Write {
        m.bridge.write(&mut m.cluster, staged, t).unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn commit(m: &mut Model, staged: &Staged, w: Write, how: Commit, t: Instant) -> bool {
        let (txn, p, up_to) = open(w);
        m.bridge.commit(&mut m.cluster, staged, (txn, &p, up_to), how, t)
    }

    /// A mark committed behind another lane's open transaction is hidden from a
    /// `read_committed` reader; the bridge that next claims the edge fences the dead bridge's
    /// producers (aborting that transaction), reads settled, and its resend of the committed
    /// batch writes nothing.
    #[test]
    fn a_hidden_mark_is_read_after_the_claim_fences_and_the_resend_is_dropped() {
        let t0 = Instant::now();
        let mut m = Model::default();
        let (a, b) = (batch("edge-a", 1..=3), batch("edge-b", 1..=2));
        claim(&mut m, "edge-a", t0);
        claim(&mut m, "edge-b", t0);
        let (ta, pa, _) = open(write(&mut m, &a, t0));
        let wb = write(&mut m, &b, t0);
        assert!(commit(&mut m, &b, wb, Commit::Ok, t0));
        m.tick(t0, &mut trace());
        // The bridge dies: edge-a's transaction stays open, edge-b's mark is behind it.
        m.restart(|| false);
        let heard = m.bridge.committed(&m.cluster, "edge-b", "ep");
        assert!(heard.is_empty(), "the welcome may say less than is committed: {heard:?}");
        assert_eq!(m.bridge.write(&mut m.cluster, &b, t0).unwrap_err(), TxnError::Fenced, "not claimed yet");
        claim(&mut m, "edge-b", t0);
        assert_eq!(m.cluster.fences, 2, "the dead bridge's two producers");
        assert_eq!(m.cluster.aborted, 1);
        assert!(matches!(m.cluster.commit(&pa, ta, t0), Err(TxnError::Fenced)), "the dead bridge's commit");
        assert!(matches!(write(&mut m, &b, t0), Write::Nothing));
        claim(&mut m, "edge-a", t0);
        let again = write(&mut m, &a, t0);
        assert!(commit(&mut m, &a, again, Commit::Ok, t0));
        m.tick(t0, &mut trace());
        assert_eq!(seqs(&m, "edge-a"), [1, 2, 3]);
        assert_eq!(seqs(&m, "edge-b"), [1, 2]);
    }

    /// A claim waits for the transactions open when it was written, even those of producers it
    /// does not fence (a dead bridge that never held the edge), until they end.
    #[test]
    fn a_claim_waits_for_what_is_open_and_a_verified_one_is_not_fenced_again() {
        let t0 = Instant::now();
        let mut m = Model::default();
        claim(&mut m, "edge-c", t0);
        let c = batch("edge-c", 1..=2);
        let _open = open(write(&mut m, &c, t0));
        m.restart(|| false);
        // edge-b was never claimed: nothing to fence, and the dead bridge's transaction holds
        // the marks unsettled until the coordinator aborts it.
        assert_eq!(m.bridge.claim(&mut m.cluster, "edge-b", t0), Claim::Wait);
        m.tick(t0, &mut trace());
        assert_eq!(m.bridge.claim(&mut m.cluster, "edge-b", t0), Claim::Wait);
        assert!(m.cluster.unsettled > 0);
        m.tick(t0 + TRANSACTION_TIMEOUT, &mut trace());
        assert_eq!(m.bridge.claim(&mut m.cluster, "edge-b", t0 + TRANSACTION_TIMEOUT), Claim::Held);
        m.tick(t0 + TRANSACTION_TIMEOUT, &mut trace());
        assert_eq!(m.cluster.fences, 0);
        // The next bridge fences only the producers of the verified claim before it.
        m.restart(|| false);
        claim(&mut m, "edge-b", t0 + TRANSACTION_TIMEOUT);
        assert_eq!(m.cluster.fences, 2);
    }

    /// A commit decided before the bridge died is completed when the next bridge's claim
    /// fences its producer, which then finds the batch covered; a commit whose answer was lost
    /// likewise.
    #[test]
    fn a_decided_commit_is_completed_and_a_lost_answer_writes_nothing_twice() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(1);
        let mut m = Model::default();
        let a = batch("edge-a", 1..=3);
        claim(&mut m, "edge-a", t0);
        let w = write(&mut m, &a, t0);
        assert!(commit(&mut m, &a, w, Commit::Ok, later));
        m.restart(|| false);
        claim(&mut m, "edge-a", t0);
        assert!(matches!(write(&mut m, &a, t0), Write::Nothing));
        let b = batch("edge-a", 3..=5);
        let w = write(&mut m, &b, t0);
        assert!(!commit(&mut m, &b, w, Commit::AnswerLost, t0));
        m.tick(t0, &mut trace());
        assert!(matches!(write(&mut m, &b, t0), Write::Nothing));
        assert_eq!(seqs(&m, "edge-a"), [1, 2, 3, 4, 5]);
    }

    /// A transaction open past its timeout is aborted and its producer fenced; a late commit
    /// of a producer nobody fenced lands; one of a fenced producer does not.
    #[test]
    fn a_timed_out_transaction_is_aborted_and_a_late_commit_lands_if_not_fenced() {
        let t0 = Instant::now();
        let mut m = Model::default();
        let a = batch("edge-a", 1..=2);
        claim(&mut m, "edge-a", t0);
        let (txn, p, _) = open(write(&mut m, &a, t0));
        m.tick(t0 + TRANSACTION_TIMEOUT, &mut trace());
        assert_eq!(m.cluster.aborted, 1);
        assert_eq!(m.cluster.commit(&p, txn, t0), Err(TxnError::Fenced));
        m.restart(|| false);
        let b = batch("edge-b", 1..=2);
        claim(&mut m, "edge-b", t0);
        let (txn, p, _) = open(write(&mut m, &b, t0));
        m.restart(|| false);
        m.late_commits.push((t0, p, txn));
        m.tick(t0, &mut trace());
        assert_eq!(m.late_committed, 1);
        let c = batch("edge-c", 1..=1);
        claim(&mut m, "edge-c", t0);
        let (txn, p, _) = open(write(&mut m, &c, t0));
        m.restart(|| false);
        claim(&mut m, "edge-c", t0);
        m.late_commits.push((t0, p, txn));
        m.tick(t0, &mut trace());
        assert_eq!(m.late_committed, 1, "fenced by the claim");
        assert!(seqs(&m, "edge-a").is_empty());
        assert_eq!(seqs(&m, "edge-b"), [1, 2]);
        assert!(seqs(&m, "edge-c").is_empty());
    }
}
