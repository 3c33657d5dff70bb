//! The simulated cloud bridge and its sink: one bridge process with a session per connected
//! edge, each the shipped `server::core::SessionCore` (its hello's lookups, publishes, marks and
//! the downlink's calls), and the shipped SQLite sink on a file in memory behind a layer that
//! fails as a cluster does.
//!
//! The driver keeps the real one's shape: a sink call or a round of marks is awaited before the
//! session reads its next frame; batches stage beside it, `pipeline` at once, each staging
//! ending when it may, and publish one at a time in the core's order (the Kafka sink's batches
//! ahead, `publish_ahead`, are not modelled: its ordering is tested on a real broker,
//! `kafka_sink::a_batch_given_ahead_waits…`). A call's effect
//! is made when it is asked; its answer comes after a latency, or, while the part of the sink it
//! needs is down, a read fails after a timeout and a write waits (the sinks retry writes) until
//! the part is back.
//!
//! Some runs write the records into the Kafka-like sink of [`super::kafka`] instead (the rest,
//! dictionaries, epochs, reports and the downlink, stays on SQLite): a batch is then a
//! transaction, opened when asked and committed when its answer comes, and a bridge that
//! crashes leaves its open transactions to the cluster, some of their commits still on their
//! way.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloud_bridge::downlink::DownlinkMetrics;
use cloud_bridge::downlink::core::{DownAnswer, DownCall, DownCore};
use cloud_bridge::server::core::{Answer, Call, CoreError, Event, SessionCore};
use cloud_bridge::sink::sqlite::{SqliteSink, Staged};
use cloud_bridge::sink::{DictStore, DownlinkStore, FleetStore, RecordSink, SinkError, SinkMetrics};
use shared::proto::cloud::{CloudSession, DownWindow};
use shared::proto::compress;

use super::kafka::{self, Commit, Write};
use super::{Ctx, Frame};

/// A read the sink cannot answer fails after this (a request timeout).
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A sink call that has not returned after this much real time is stuck (the SQLite sink
/// retries what it takes for a failure of the moment, for ever).
const STUCK: Duration = Duration::from_secs(3);

/// The sink: the shipped SQLite sink, and when each part of it is down.
pub struct Sink {
    rt: tokio::runtime::Runtime,
    pub sqlite: SqliteSink,
    pub metrics: Arc<SinkMetrics>,
    /// Records, marks, epochs, dictionaries, reports are unavailable until then.
    pub records_down_until: Option<Instant>,
    /// The downlink's storage is unavailable until then.
    pub downlink_down_until: Option<Instant>,
    /// A publish may fail until then with an error the sink does not retry, its records
    /// written or not (a leader lost mid-write, a failover): the session ends on it.
    pub writes_failing_until: Option<Instant>,
    /// Records and marks go to the Kafka-like sink instead of SQLite.
    pub kafka: Option<RefCell<kafka::Model>>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink").finish_non_exhaustive()
    }
}

impl Sink {
    pub fn open(path: &Path, kafka: bool) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let metrics = Arc::new(SinkMetrics::default());
        let sqlite = SqliteSink::open(path).expect("the sink").with_metrics(metrics.clone());
        Self {
            rt,
            sqlite,
            metrics,
            records_down_until: None,
            downlink_down_until: None,
            writes_failing_until: None,
            kafka: kafka.then(RefCell::default),
        }
    }

    /// Runs a sink future to its end; `Err` names a call that never returned.
    pub fn run<T>(&self, what: &str, fut: impl Future<Output = T>) -> Result<T, String> {
        let retries = self.metrics.retries.get();
        let out = self.rt.block_on(async { tokio::time::timeout(STUCK, fut).await });
        out.map_err(|_| {
            format!(
                "the sink's {what} did not return: retried {} times for a failure of the moment that does not pass",
                self.metrics.retries.get() - retries
            )
        })
    }

    /// When a call of the records' part asked at `now` may be answered.
    fn records_ready(&self, now: Instant) -> Option<Instant> {
        self.records_down_until.filter(|until| *until > now)
    }

    fn downlink_ready(&self, now: Instant) -> Option<Instant> {
        self.downlink_down_until.filter(|until| *until > now)
    }
}

/// A batch staged, for the sink the run writes records into.
#[derive(Debug)]
enum Batch {
    Sqlite(Staged),
    Kafka(kafka::Staged),
}

/// A publish in flight.
#[derive(Debug)]
enum Pub {
    /// Written when asked; whether its answer is a failure.
    Sqlite { failing: bool },
    /// Tried when due: opened as a transaction, then committed.
    Kafka { staged: kafka::Staged, open: Option<(usize, kafka::Producer, u64)> },
}

/// What a session awaits before it reads on: a call's answer or a round of marks.
#[derive(Debug)]
enum Awaited {
    Call(Result<Answer, SinkError>),
    Marks(Vec<(u8, u64)>),
    /// A hello's epoch admission on the Kafka-like sink: the edge's claim first, tried again
    /// while it waits (since when).
    Claim {
        epoch: String,
        since: Instant,
    },
}

/// One edge's session on the bridge.
#[derive(Debug)]
pub struct Session {
    pub cid: u64,
    core: SessionCore<()>,
    /// Frames arrived, read in order as the session takes them.
    inbox: VecDeque<Frame>,
    awaited: Option<(Instant, Awaited)>,
    /// The downlink's call in flight, made beside the rest: when it is answered, and how.
    down: Option<(Instant, Result<DownAnswer, SinkError>)>,
    /// Stagings in flight: when each is done, its id, its lane and record count, and the
    /// batch staged.
    staging: Vec<(Instant, u64, (u8, usize), Batch)>,
    /// Staged, waiting for the core to publish them.
    staged: BTreeMap<u64, ((u8, usize), Batch)>,
    /// The publish in flight (one at a time): when its next step is due, its id, and what it is.
    publishing: VecDeque<(Instant, u64, Pub)>,
    /// News of the edge's downlink wakes it.
    pub news: bool,
}

/// The bridge process.
#[derive(Debug, Default)]
pub struct Bridge {
    pub up: bool,
    pub restart_at: Option<Instant>,
    pub sessions: BTreeMap<usize, Session>,
}

impl Bridge {
    /// A new connection of `edge`: a newer one replaces the one it had.
    pub fn accept(&mut self, edge: usize, name: &str, cid: u64, sink: &Sink, cx: &mut Ctx<'_>) {
        if let Some(old) = self.sessions.remove(&edge) {
            cx.net.down_closed.push((edge, old.cid, false));
            old.abandon(sink, cx);
        }
        let window = DownWindow { messages: 16, bytes: 1 << 20 };
        let session = CloudSession::new(64).with_down_window(window);
        let down = DownCore::new(name, Arc::new(DownlinkMetrics::default()), Duration::from_secs(5));
        let mut core = SessionCore::new(session, 8, Duration::from_secs(30)).with_edge(name, Some(down));
        core.set_wall_clock(cx.now, cx.wall_ms);
        self.sessions.insert(
            edge,
            Session {
                cid,
                core,
                inbox: VecDeque::new(),
                awaited: None,
                down: None,
                staging: Vec::new(),
                staged: BTreeMap::new(),
                publishing: VecDeque::new(),
                news: false,
            },
        );
    }

    /// The bridge dies: every session with it. Its open transactions stay open in the
    /// cluster; a commit it had sent may still reach the coordinator.
    pub fn crash(&mut self, sink: &Sink, cx: &mut Ctx<'_>) {
        self.up = false;
        let mut model = sink.kafka.as_ref().map(RefCell::borrow_mut);
        for (edge, s) in std::mem::take(&mut self.sessions) {
            cx.net.down_closed.push((edge, s.cid, false));
            for (_, _, p) in s.publishing {
                if let (Some(m), Pub::Kafka { open: Some((txn, producer, _)), .. }) = (model.as_mut(), p)
                    && cx.rng.chance(0.4)
                {
                    let at = cx.now + cx.rng.millis(0, 3_000);
                    cx.trace.line(format!("kafka: {}'s commit is on its way as the bridge dies", producer.id));
                    m.late_commits.push((at, producer, txn));
                }
            }
        }
        if let Some(m) = model.as_mut() {
            m.restart(|| cx.rng.chance(0.4));
        }
    }

    /// The connection `cid` of `edge` is gone.
    pub fn closed(&mut self, edge: usize, cid: u64, sink: &Sink, cx: &mut Ctx<'_>) {
        if self.sessions.get(&edge).is_some_and(|s| s.cid == cid)
            && let Some(s) = self.sessions.remove(&edge)
        {
            s.abandon(sink, cx);
        }
    }

    pub fn receive(&mut self, edge: usize, cid: u64, frame: Frame) {
        if let Some(s) = self.sessions.get_mut(&edge).filter(|s| s.cid == cid) {
            s.inbox.push_back(frame);
        }
    }

    /// News of messages for `edge`.
    pub fn news(&mut self, edge: usize) {
        if let Some(s) = self.sessions.get_mut(&edge).filter(|s| s.news) {
            s.core.woken();
        }
    }

    pub fn deadline(&self) -> Option<Instant> {
        if !self.up {
            return self.restart_at;
        }
        self.sessions
            .values()
            .flat_map(|s| {
                // While a call or a round of marks is awaited, nothing else happens.
                if let Some((at, _)) = &s.awaited {
                    return [Some(*at), None, None];
                }
                let published = s.publishing.front().map(|(at, ..)| *at);
                let staged = s.staging.iter().map(|(at, ..)| *at).min();
                let written = published.into_iter().chain(staged).min();
                let down = s.down.as_ref().map(|(at, _)| *at);
                [down, written, s.core.poll_timeout()]
            })
            .flatten()
            .min()
    }

    /// Runs every session as far as it goes at `cx.now`.
    pub fn pump(&mut self, sink: &Sink, names: &[String], cx: &mut Ctx<'_>) {
        if let Some(m) = &sink.kafka {
            m.borrow_mut().tick(cx.now, cx.trace);
        }
        if !self.up {
            return;
        }
        let edges: Vec<usize> = self.sessions.keys().copied().collect();
        for edge in edges {
            let Some(s) = self.sessions.get_mut(&edge) else { continue };
            let name = &names[edge];
            s.core.set_wall_clock(cx.now, cx.wall_ms);
            if let Err(why) = s.run(edge, name, sink, cx) {
                cx.trace.line(format!("bridge: session of {name} ends: {why}"));
                let refused = matches!(why, End::Refused);
                // What was queued for the edge (a refusal) goes before the close.
                while let Some(frame) = s.core.poll_control() {
                    cx.net.down.push((edge, s.cid, frame));
                }
                cx.net.down_closed.push((edge, s.cid, refused));
                if let Some(s) = self.sessions.remove(&edge) {
                    s.abandon(sink, cx);
                }
            }
        }
    }
}

/// Why a session ended.
#[derive(Debug)]
enum End {
    Refused,
    Other(String),
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Refused => write!(f, "refused"),
            End::Other(why) => write!(f, "{why}"),
        }
    }
}

fn ended(e: CoreError) -> End {
    match e {
        CoreError::Refused { label: Some(_), .. } => End::Refused,
        other => End::Other(other.to_string()),
    }
}

impl Session {
    /// The session ends while the bridge lives on. A Kafka publish in flight is not stopped
    /// by that: the producer's task commits the transaction it opened, a moment later.
    fn abandon(self, sink: &Sink, cx: &mut Ctx<'_>) {
        let Some(model) = &sink.kafka else { return };
        let mut m = model.borrow_mut();
        for (_, _, p) in self.publishing {
            let Pub::Kafka { staged, open } = p else { continue };
            if let Some(open) = open {
                let at = cx.now + cx.rng.millis(0, 200);
                cx.trace.line(format!("kafka: {}'s commit goes on without its session", open.1.id));
                m.worker_commits.push((at, staged, open));
            }
        }
    }

    /// What the session waits for, for a failure's report.
    pub fn waiting(&self) -> String {
        format!(
            "awaited {:?}, downlink call {:?}, staging {}, publishing {}, inbox {}",
            self.awaited.as_ref().map(|(at, a)| (at, matches!(a, Awaited::Marks(_)))),
            self.down.as_ref().map(|(at, a)| (at, a.is_ok())),
            self.staging.len(),
            self.publishing.len(),
            self.inbox.len()
        )
    }

    fn run(&mut self, edge: usize, name: &str, sink: &Sink, cx: &mut Ctx<'_>) -> Result<(), End> {
        let now = cx.now;
        for _ in 0..10_000 {
            let mut progress = false;
            // What is awaited comes back first.
            if let Some((at, _)) = &self.awaited
                && *at <= now
            {
                let Some((_, awaited)) = self.awaited.take() else { break };
                progress = true;
                match awaited {
                    Awaited::Call(answer) => self.core.handle_answer(answer).map_err(ended)?,
                    Awaited::Marks(marks) => self.core.handle_marked(&marks),
                    Awaited::Claim { epoch, since } => {
                        self.awaited = Some(self.claim(name, epoch, since, sink, cx)?);
                        continue;
                    }
                }
                self.events(name, cx);
            }
            // The downlink's call, beside the rest (answered when nothing inline is awaited).
            if self.awaited.is_none() {
                if let Some((at, _)) = &self.down
                    && *at <= now
                {
                    let Some((_, answer)) = self.down.take() else { break };
                    self.core.handle_down_answer(answer, now).map_err(ended)?;
                    self.events(name, cx);
                    progress = true;
                }
                if self.down.is_none()
                    && let Some(call) = self.core.poll_down_call(now)
                {
                    self.down = Some(self.down_call(name, call, sink, cx)?);
                    progress = true;
                }
            }
            if self.awaited.is_none() {
                // Stagings done, in whatever order they end.
                while let Some(i) = self.staging.iter().position(|(at, ..)| *at <= now) {
                    let (_, id, what, staged) = self.staging.remove(i);
                    self.staged.insert(id, (what, staged));
                    self.core.handle_staged(id);
                    progress = true;
                }
                // The publish done.
                while self.publishing.front().is_some_and(|(at, ..)| *at <= now) {
                    let Some((_, id, p)) = self.publishing.pop_front() else { break };
                    match p {
                        Pub::Sqlite { failing: true } => {
                            return Err(End::Other(format!("sink publish {id}: failed, not for the moment")));
                        }
                        Pub::Sqlite { failing: false } => {}
                        Pub::Kafka { staged, open } => {
                            if let Some((at, next)) = kafka_step(name, sink, staged, open, cx)? {
                                self.publishing.push_front((at, id, next));
                                progress = true;
                                break;
                            }
                        }
                    }
                    self.core.handle_published(id);
                    progress = true;
                }
                progress |= self.start_publishes(name, sink, cx)?;
                if let Some(marks) = self.core.poll_marks() {
                    let epoch = self.core.session().epoch().unwrap_or_default().to_owned();
                    for &(lane, up_to) in &marks {
                        if let Some(model) = &sink.kafka {
                            let mut m = model.borrow_mut();
                            let m = &mut *m;
                            match m.bridge.mark(&m.cluster, name, &epoch, lane) {
                                Err(e) => return Err(End::Other(format!("sink mark: {e:?}"))),
                                Ok(k) if k < up_to => {
                                    let why =
                                        format!("mark: lane {lane} asked to be marked to {up_to}, written to {k}");
                                    return Err(End::Other(cx.fail(why)));
                                }
                                Ok(_) => continue,
                            }
                        }
                        sink.run("mark", sink.sqlite.mark(name, &epoch, lane, up_to))
                            .map_err(|e| cx.fail(e))
                            .and_then(|r| r.map_err(|e| cx.fail(format!("mark: {e}"))))
                            .map_err(End::Other)?;
                    }
                    let at = sink.records_ready(now).unwrap_or(now) + cx.rng.millis(1, 8);
                    self.awaited = Some((at, Awaited::Marks(marks)));
                    progress = true;
                }
            }
            if self.awaited.is_none() {
                if let Some(call) = self.core.poll_call() {
                    self.awaited = Some(match call {
                        Call::AdmitEpoch { epoch } if sink.kafka.is_some() => {
                            (now + cx.rng.millis(1, 8), Awaited::Claim { epoch, since: now })
                        }
                        call => {
                            let (at, answer) = self.call(name, call, sink, cx)?;
                            (at, Awaited::Call(answer))
                        }
                    });
                    progress = true;
                } else if let Some(frame) = self.inbox.front() {
                    match frame {
                        Frame::Control(_) => {
                            let Some(Frame::Control(c)) = self.inbox.pop_front() else { break };
                            self.core.handle_control(c, now).map_err(ended)?;
                            progress = true;
                        }
                        Frame::Batch(_) if self.core.wants_batch() => {
                            let Some(Frame::Batch(batch)) = self.inbox.pop_front() else { break };
                            let records = compress::unpack(&batch, self.core.session().dicts(), 64 << 20)
                                .map_err(|e| End::Other(format!("batch: {e}")))?;
                            self.core.handle_batch(*batch, records, (), now).map_err(ended)?;
                            progress = true;
                        }
                        Frame::Batch(_) => {}
                    }
                }
            }
            if self.core.poll_timeout().is_some_and(|at| at <= now) {
                self.core.handle_timeout(now).map_err(ended)?;
            }
            while let Some(frame) = self.core.poll_control() {
                cx.net.down.push((edge, self.cid, frame));
                progress = true;
            }
            if !progress {
                return Ok(());
            }
        }
        Err(End::Other("the session never settled".into()))
    }

    fn events(&mut self, name: &str, cx: &mut Ctx<'_>) {
        while let Some(event) = self.core.poll_event() {
            match event {
                Event::Welcomed { version, .. } => cx.trace.line(format!("bridge: {name} welcomed, version {version}")),
                Event::Dict { .. } => {}
                Event::DownStarted => self.news = true,
            }
        }
    }

    /// Stages what the core asks and starts its publishes; whether it started any.
    fn start_publishes(&mut self, name: &str, sink: &Sink, cx: &mut Ctx<'_>) -> Result<bool, End> {
        let mut started = false;
        while let Some(p) = self.core.poll_stage() {
            let what = (p.lane, p.records.len());
            let staged = if sink.kafka.is_some() {
                Batch::Kafka(kafka::Staged::new(name, p.epoch, p.lane, p.records))
            } else {
                let staged = sink
                    .run("stage", sink.sqlite.stage(name.to_owned(), p.epoch, p.lane, p.records))
                    .map_err(|e| cx.fail(e))
                    .and_then(|r| r.map_err(|e| cx.fail(format!("stage: {e}"))))
                    .map_err(End::Other)?;
                Batch::Sqlite(staged)
            };
            self.staging.push((cx.now + cx.rng.millis(0, 6), p.id, what, staged));
        }
        while let Some((id, _)) = self.core.poll_publish() {
            started = true;
            let staged = match self.staged.remove(&id) {
                Some(((lane, count), Batch::Kafka(staged))) => {
                    cx.trace.line(format!("bridge: {name} lane {lane} publishes {count} records"));
                    self.publishing.push_back((cx.now, id, Pub::Kafka { staged, open: None }));
                    continue;
                }
                Some((what, Batch::Sqlite(staged))) => Some((what, staged)),
                None => None,
            };
            let Some(((lane, count), staged)) = staged else {
                return Err(End::Other(cx.fail(format!("the core published batch {id} before it was staged"))));
            };
            let failing = sink.writes_failing_until.is_some_and(|u| u > cx.now) && cx.rng.chance(0.5);
            // A failed write may still have landed: the edge's resend must find it there once.
            let written = !failing || cx.rng.chance(0.5);
            if written {
                sink.run("publish", sink.sqlite.publish(staged))
                    .map_err(|e| cx.fail(e))
                    .and_then(|r| r.map_err(|e| cx.fail(format!("publish: {e}"))))
                    .map_err(End::Other)?;
            }
            let at = sink.records_ready(cx.now).unwrap_or(cx.now) + cx.rng.millis(1, 10);
            let outcome = match (failing, written) {
                (false, _) => "",
                (true, true) => " (written, then fails)",
                (true, false) => " (fails unwritten)",
            };
            cx.trace.line(format!("bridge: {name} lane {lane} publishes {count} records{outcome}"));
            self.publishing.push_back((at, id, Pub::Sqlite { failing }));
        }
        Ok(started)
    }

    /// A step of a hello's claim of the edge on the Kafka-like sink (`Pool::claim`): once held,
    /// the epoch's admission is called; while it waits (its producer in a transaction, the
    /// marks not settled, the records' part down) it is tried again, up to the real read's
    /// 30 s; lost to a later claim, the hello fails as fenced.
    fn claim(
        &mut self,
        name: &str,
        epoch: String,
        since: Instant,
        sink: &Sink,
        cx: &mut Ctx<'_>,
    ) -> Result<(Instant, Awaited), End> {
        let now = cx.now;
        let Some(model) = &sink.kafka else { return Err(End::Other(cx.fail("a claim without Kafka".into()))) };
        let verdict = match sink.records_ready(now) {
            Some(_) => kafka::Claim::Wait,
            None => {
                let mut m = model.borrow_mut();
                let m = &mut *m;
                m.bridge.claim(&mut m.cluster, name, now)
            }
        };
        match verdict {
            kafka::Claim::Held => {
                let (at, answer) = self.call(name, Call::AdmitEpoch { epoch }, sink, cx)?;
                Ok((at, Awaited::Call(answer)))
            }
            kafka::Claim::Lost => {
                cx.trace.line(format!("bridge: {name}: claim lost to a later one"));
                Ok((now, Awaited::Call(Err(SinkError::Fenced { what: "claim", key: name.to_owned() }))))
            }
            kafka::Claim::Wait if now.duration_since(since) > Duration::from_secs(30) => {
                cx.trace.line(format!("bridge: {name}: claim not settled in 30 s"));
                Ok((now, Awaited::Call(Err(unavailable("claim")))))
            }
            kafka::Claim::Wait => Ok((now + cx.rng.millis(5, 60), Awaited::Claim { epoch, since })),
        }
    }

    /// Makes `call` on the sink now; when its answer comes and what it is.
    fn call(
        &mut self,
        name: &str,
        call: Call,
        sink: &Sink,
        cx: &mut Ctx<'_>,
    ) -> Result<(Instant, Result<Answer, SinkError>), End> {
        let now = cx.now;
        let latency = cx.rng.millis(1, 8);
        // A read the part that is down cannot answer fails after a timeout; a write waits.
        let (read, what) = match &call {
            Call::AdmitEpoch { .. } => (false, "admit epoch"),
            Call::Committed { .. } => (true, "committed"),
            Call::LoadDicts { .. } => (true, "load dicts"),
            Call::StoreDict(_) => (false, "store dict"),
            Call::StoreReport(_) => (false, "store report"),
        };
        let down = sink.records_ready(now);
        if let (Some(_), true) = (down, read) {
            cx.trace.line(format!("bridge: {name}: sink {what} times out"));
            return Ok((now + READ_TIMEOUT, Err(unavailable(what))));
        }
        let at = down.unwrap_or(now) + latency;
        let s = &sink.sqlite;
        let answer = match call {
            Call::AdmitEpoch { epoch } => sink.run(what, s.admit_epoch(name, &epoch)).map(|r| r.map(Answer::Admitted)),
            Call::Committed { epoch } if sink.kafka.is_some() => {
                let m = sink.kafka.as_ref().map(RefCell::borrow);
                let lanes = m.map(|m| m.bridge.committed(&m.cluster, name, &epoch)).unwrap_or_default();
                Ok(Ok(Answer::Committed { lanes, limits: s.record_limits(name, &epoch) }))
            }
            Call::Committed { epoch } => sink
                .run(what, s.committed(name, &epoch))
                .map(|r| r.map(|lanes| Answer::Committed { lanes, limits: s.record_limits(name, &epoch) })),
            Call::LoadDicts { ids } => sink.run(what, s.load_dicts(name, &ids)).map(|r| r.map(Answer::Dicts)),
            Call::StoreDict(dict) => sink.run(what, s.store_dict(name, &dict)).map(|r| r.map(|_| Answer::DictStored)),
            Call::StoreReport(report) => {
                let stored =
                    cloud_bridge::sink::StoredReport { edge: name.to_owned(), received_ms: cx.wall_ms, report };
                sink.run(what, s.store_report(&stored)).map(|r| r.map(|_| Answer::ReportStored))
            }
        };
        let answer = answer.map_err(|e| End::Other(cx.fail(e)))?;
        if let Err(e) = &answer {
            cx.trace.line(format!("bridge: {name}: sink {what}: {e}"));
        }
        Ok((at, answer))
    }

    /// Makes the downlink's `call` on the sink now; when its answer comes and what it is.
    fn down_call(
        &mut self,
        name: &str,
        call: DownCall,
        sink: &Sink,
        cx: &mut Ctx<'_>,
    ) -> Result<(Instant, Result<DownAnswer, SinkError>), End> {
        let now = cx.now;
        let latency = cx.rng.millis(1, 8);
        let (read, what) = match &call {
            DownCall::State => (true, "downlink position"),
            DownCall::Read { .. } => (true, "downlink read"),
            DownCall::Record(_) => (false, "downlink record"),
            DownCall::SetAside { .. } => (false, "downlink set aside"),
        };
        let down = sink.downlink_ready(now);
        if let (Some(_), true) = (down, read) {
            cx.trace.line(format!("bridge: {name}: sink {what} times out"));
            return Ok((now + READ_TIMEOUT, Err(unavailable(what))));
        }
        let at = down.unwrap_or(now) + latency;
        let s = &sink.sqlite;
        cx.trace.line(format!("bridge: {name}: {call:?}").chars().take(160).collect());
        let answer = match call {
            DownCall::State => sink.run(what, s.down_state(name)).map(|r| r.map(DownAnswer::State)),
            DownCall::Read { after, max } => {
                sink.run(what, s.down_read(name, after, max)).map(|r| r.map(DownAnswer::Read))
            }
            DownCall::Record(done) => {
                sink.run(what, s.down_record(name, &done)).map(|r| r.map(|_| DownAnswer::Recorded))
            }
            DownCall::SetAside { seq, outcome, reason } => {
                sink.run(what, s.down_set_aside(name, seq, outcome, &reason)).map(|r| r.map(|_| DownAnswer::SetAside))
            }
        };
        let answer = answer.map_err(|e| End::Other(cx.fail(e)))?;
        if let Err(e) = &answer {
            cx.trace.line(format!("bridge: {name}: sink {what}: {e}"));
        }
        Ok((at, answer))
    }
}

/// The next step of a publish into the Kafka-like sink: `None` when it is done, else when to
/// take the step after and what it is. While the records' part is down, a write waits.
fn kafka_step(
    name: &str,
    sink: &Sink,
    staged: kafka::Staged,
    open: Option<(usize, kafka::Producer, u64)>,
    cx: &mut Ctx<'_>,
) -> Result<Option<(Instant, Pub)>, End> {
    let now = cx.now;
    if let Some(until) = sink.records_ready(now) {
        return Ok(Some((until, Pub::Kafka { staged, open })));
    }
    let Some(model) = &sink.kafka else { return Err(End::Other(cx.fail("a Kafka publish without Kafka".into()))) };
    let mut model = model.borrow_mut();
    let m = &mut *model;
    let lane = staged.lane;
    let Some((txn, producer, up_to)) = open else {
        return match m.bridge.write(&mut m.cluster, &staged, now) {
            Ok(Write::NotYet) => {
                cx.trace.line(format!(
                    "bridge: {name} lane {lane}: marks not settled or its producer in a transaction, waits"
                ));
                Ok(Some((now + cx.rng.millis(50, 400), Pub::Kafka { staged, open: None })))
            }
            Ok(Write::Nothing) => {
                cx.trace.line(format!("bridge: {name} lane {lane}: its mark covers the batch, nothing written"));
                Ok(None)
            }
            Ok(Write::Open { txn, producer, up_to }) => {
                let open = Some((txn, producer, up_to));
                Ok(Some((now + cx.rng.millis(2, 80), Pub::Kafka { staged, open })))
            }
            Err(e) => Err(End::Other(format!("sink publish: {e:?}"))),
        };
    };
    let failing = sink.writes_failing_until.is_some_and(|u| u > now) && cx.rng.chance(0.5);
    let how = match (failing, cx.rng.chance(0.5)) {
        (false, _) => Commit::Ok,
        (true, true) => Commit::AnswerLost,
        (true, false) => Commit::Aborted,
    };
    let markers_at = now + cx.rng.millis(0, 30);
    if m.bridge.commit(&mut m.cluster, &staged, (txn, &producer, up_to), how, markers_at) {
        return Ok(None);
    }
    cx.trace.line(format!("bridge: {name} lane {lane}: transaction {how:?}, tried again"));
    Ok(Some((now + cx.rng.millis(50, 500), Pub::Kafka { staged, open: None })))
}

fn unavailable(what: &'static str) -> SinkError {
    SinkError::Unavailable { what, reason: "timed out".into() }
}
