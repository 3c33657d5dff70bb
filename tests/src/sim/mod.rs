//! The whole system as a deterministic simulation: one process, one seeded RNG, a virtual
//! clock, no sockets; the shipped sans-IO cores driven over simulated parts that fail.
//!
//! What runs is the product's own: the broker core with its session store (SQLite, on a file in
//! memory, committed when the sim says), the spool, the uplink's connection core and dialer,
//! `EdgeSession` and `CloudSession`, the bridge's `SessionCore` with the downlink's cores on
//! both sides, and the SQLite sink behind its traits. What is simulated: MQTT clients
//! ([`client`]), the link (frames delayed, batch streams overtaking each other, connections
//! cut), the disks (a store that stays locked, a crash that loses what was not committed), the
//! sink's outages (by part: records, downlink) and processes that crash and restart from what
//! their disks kept.
//!
//! Every decision a run makes comes from its seed: a failing seed replays identically, and
//! [`run`] prints the end of its trace. `cargo test` runs a few hundred seeds
//! (`e2e/sim.rs`); `scripts/simulate.sh SEEDS HOURS` searches longer.

pub mod bridge;
pub mod check;
pub mod client;
pub mod edge;
pub mod kafka;
pub mod rng;

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cloud_bridge::sink::DownlinkStore;
use cloud_bridge::sink::downlink::{DownBounds, Enqueued, Outgoing};
use edge_node::broker::codec::{PublishProps, QoS, Version};
use shared::proto::{Batch, Control};

use self::bridge::{Bridge, Sink};
use self::check::Oracle;
use self::client::Client;
use self::edge::{Edge, SCHEMA_TOPIC};
use self::rng::Rng;

/// How a run goes.
#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    /// Actions (client steps, sends, faults) before the system is left to settle.
    pub actions: usize,
    /// Edges, one of them hostile in some runs.
    pub edges: usize,
    /// Clients per edge.
    pub clients: usize,
    /// Lines of trace kept for a failure's report.
    pub trace: usize,
}

impl Config {
    pub fn new(seed: u64) -> Self {
        Self { seed, actions: 400, edges: 2, clients: 4, trace: 300 }
    }
}

/// A run that held.
#[derive(Debug, Clone)]
pub struct Summary {
    pub seed: u64,
    /// Events and timer steps processed.
    pub steps: u64,
    /// Virtual time covered.
    pub simulated: Duration,
    /// A hash of the whole trace: the same seed gives the same one.
    pub trace_hash: u64,
    pub counts: check::Counts,
    /// In a run into the Kafka-like sink, what its transactions went through.
    pub kafka: Option<kafka::Counts>,
}

/// A run that broke a promise.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    /// The run's actions, for its replay.
    pub actions: usize,
    pub step: u64,
    pub at: Duration,
    pub violation: String,
    pub trace: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "seed {} failed at step {} (t={:.3}s): {}",
            self.seed,
            self.step,
            self.at.as_secs_f64(),
            self.violation
        )?;
        writeln!(f, "the last {} lines of its trace:", self.trace.len())?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        write!(f, "replay: scripts/simulate.sh --seed {} {}", self.seed, self.actions)
    }
}

/// A frame on an edge's connection to the bridge.
#[derive(Debug, Clone)]
pub enum Frame {
    Control(Control),
    /// On a unidirectional stream of its own.
    Batch(Box<Batch>),
}

/// What the parts handed the network during a step.
#[derive(Debug, Default)]
pub struct Net {
    /// Edge to bridge: (edge, connection generation, frame).
    pub up: Vec<(usize, u64, Frame)>,
    /// Bridge to edge.
    pub down: Vec<(usize, u64, Control)>,
    /// Connections the edge closed.
    pub closed: Vec<(usize, u64)>,
    /// Connections the bridge closed: whether it refused the edge.
    pub down_closed: Vec<(usize, u64, bool)>,
}

/// The end of the trace, and a hash of all of it.
#[derive(Debug)]
pub struct Trace {
    lines: VecDeque<String>,
    keep: usize,
    hash: u64,
    /// Virtual time of the lines to come.
    at: Duration,
    step: u64,
    /// Every line to stderr as well (`SIM_TRACE_ALL=1`): two runs to diff.
    echo: bool,
}

impl Trace {
    #[cfg(test)]
    fn for_tests() -> Self {
        Self { lines: VecDeque::new(), keep: 100, hash: 0, at: Duration::ZERO, step: 0, echo: false }
    }

    pub fn line(&mut self, line: String) {
        let line = format!("{:>9.3}s #{:<6} {line}", self.at.as_secs_f64(), self.step);
        for b in line.bytes() {
            self.hash = (self.hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        if self.lines.len() == self.keep {
            self.lines.pop_front();
        }
        if self.echo {
            eprintln!("{line}");
        }
        self.lines.push_back(line);
    }
}

/// Short names for epochs (random per spool), so a trace reads the same on every replay.
#[derive(Debug, Default)]
pub struct Names {
    epochs: BTreeMap<String, usize>,
}

impl Names {
    pub fn epoch(&mut self, epoch: &str) -> String {
        let n = self.epochs.len();
        format!("E{}", self.epochs.entry(epoch.to_owned()).or_insert(n))
    }
}

/// What a part gets to act with during a step.
pub struct Ctx<'a> {
    pub now: Instant,
    pub wall_ms: u64,
    pub rng: &'a mut Rng,
    pub trace: &'a mut Trace,
    pub oracle: &'a mut Oracle,
    pub net: &'a mut Net,
    pub names: &'a mut Names,
}

impl Ctx<'_> {
    /// Records a broken promise; returns its text.
    pub fn fail(&mut self, why: String) -> String {
        self.trace.line(format!("VIOLATION: {why}"));
        self.oracle.fail(why.clone());
        why
    }
}

/// The tag a payload starts with (or a JSON payload's `id`): what names a message end to end.
pub fn tag_of(payload: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(payload.get(..payload.len().min(64))?).ok()?;
    if let Some(rest) = text.strip_prefix("{\"id\":\"") {
        return rest.split('"').next();
    }
    text.split(' ').next().filter(|t| !t.is_empty())
}

#[derive(Debug)]
enum Ev {
    /// The next random action.
    Act,
    ToBridge(usize, u64, Frame),
    ToEdge(usize, u64, Control),
    /// The bridge learns that the edge closed the connection.
    ClosedByEdge(usize, u64),
    /// The edge learns that the bridge closed the connection (and whether it refused it).
    ClosedByBridge(usize, u64, bool),
    /// The link is up: both ends have the connection.
    Connected(usize, u64),
    /// News of downlink messages for an edge reaches the bridge.
    News(usize),
}

/// The link between an edge and the bridge.
#[derive(Debug, Default)]
struct Link {
    /// Connection generation in use, if any.
    cid: Option<u64>,
    /// Nothing gets through until then (a network partition).
    cut_until: Option<Instant>,
    /// When the last control frame each way arrives: they keep their order.
    last_up: Option<Instant>,
    last_down: Option<Instant>,
}

/// The simulated world.
struct World {
    config: Config,
    rng: Rng,
    base: Instant,
    now: Instant,
    queue: BTreeMap<(Instant, u64), Ev>,
    next_ev: u64,
    trace: Trace,
    oracle: Oracle,
    net: Net,
    names: Names,
    edges: Vec<Edge>,
    links: Vec<Link>,
    bridge: Bridge,
    sink: Sink,
    edge_names: Vec<String>,
    _dir: tempfile::TempDir,
    steps: u64,
    /// Steps in a row at one instant without an event.
    stuck: u64,
    sends: u64,
    /// Per edge: since when it has had what telemetry needs to flow (itself, the bridge, the
    /// link, the sink's records, its session store).
    good_since: Vec<Option<Instant>>,
    next_liveness: Instant,
    profile: Profile,
}

/// How often each kind of action comes, and how long the downlink's outages last: a run is
/// stormy (faults of every kind), calm (long downlink outages alone, so a promise that needs a
/// while to break has it) or quiet (no faults).
#[derive(Debug, Clone, Copy)]
struct Profile {
    name: &'static str,
    /// Client actions, sends, edge crashes, bridge crashes, link cuts, store locks, records
    /// outages, downlink outages.
    weights: [u32; 9],
    downlink_outage: (u64, u64),
}

const PROFILES: [Profile; 3] = [
    Profile { name: "stormy", weights: [60, 10, 2, 1, 2, 3, 2, 2, 2], downlink_outage: (500, 8_000) },
    Profile { name: "calm", weights: [60, 10, 0, 0, 0, 0, 0, 1, 0], downlink_outage: (20_000, 60_000) },
    Profile { name: "quiet", weights: [60, 10, 0, 0, 0, 0, 0, 0, 0], downlink_outage: (0, 0) },
];

/// The wall clock when a run starts, ms since the Unix epoch (a fixed day, so runs replay).
const WALL_START: u64 = 1_767_225_600_000;

/// With everything it needs, a record is acked within this.
const LIVENESS: Duration = Duration::from_secs(40);

/// Runs one seed.
pub fn run(config: Config) -> Result<Summary, Failure> {
    let mut w = World::new(config);
    let outcome = w.run();
    drop(w.sink);
    outcome
}

impl World {
    fn new(config: Config) -> Self {
        let dir = tempfile::Builder::new().prefix("sim-").tempdir_in(shm()).expect("a temp dir");
        let mut rng = Rng::new(config.seed);
        let now = Instant::now();
        let profile = PROFILES[rng.weighted(&[12, 5, 3])];
        // Some runs have a hostile edge: it claims a downlink position it never had.
        let hostile =
            rng.chance(0.3).then(|| *rng.pick(&[i64::MAX as u64, u64::MAX, (1 << 60) + 7, shared::proto::MAX_SEQ - 2]));
        let mut edges = Vec::new();
        for e in 0..config.edges {
            let clients = (0..config.clients)
                .map(|c| {
                    let version = if rng.chance(0.3) { Version::V311 } else { Version::V5 };
                    Client::new(format!("c{c}"), version, rng.chance(0.7))
                })
                .collect();
            let claims = hostile.filter(|_| e == config.edges - 1 && config.edges > 1);
            edges.push(Edge::new(e, dir.path().join(format!("edge-{e}")), claims, clients));
        }
        // Some runs write the records into a Kafka-like sink (transactions, fencing, aborts).
        let kafka = rng.chance(0.4);
        let sink = Sink::open(&dir.path().join("sink.db"), kafka);
        let edge_names = edges.iter().map(|e| e.name.clone()).collect();
        let n = config.edges;
        let trace = Trace {
            lines: VecDeque::new(),
            keep: config.trace,
            hash: 0xcbf2_9ce4_8422_2325,
            at: Duration::ZERO,
            step: 0,
            echo: std::env::var_os("SIM_TRACE_ALL").is_some(),
        };
        let mut w = World {
            config,
            rng,
            base: now,
            now,
            queue: BTreeMap::new(),
            next_ev: 0,
            trace,
            oracle: Oracle::default(),
            net: Net::default(),
            names: Names::default(),
            edges,
            links: (0..n).map(|_| Link::default()).collect(),
            bridge: Bridge { up: true, ..Bridge::default() },
            sink,
            edge_names,
            _dir: dir,
            steps: 0,
            stuck: 0,
            sends: 0,
            good_since: vec![None; n],
            next_liveness: now,
            profile,
        };
        let into = if w.sink.kafka.is_some() { "a Kafka-like sink" } else { "SQLite" };
        w.trace.line(format!("a {} run, records into {into}", profile.name));
        if let Some(claim) = hostile {
            w.trace.line(format!("edge-{} is hostile: it claims downlink position {claim}", n - 1));
        }
        w
    }

    fn ctx(&mut self) -> (Ctx<'_>, &mut Vec<Edge>, &mut Bridge, &Sink, &[String]) {
        let wall_ms = WALL_START + (self.now - self.base).as_millis() as u64;
        (
            Ctx {
                now: self.now,
                wall_ms,
                rng: &mut self.rng,
                trace: &mut self.trace,
                oracle: &mut self.oracle,
                net: &mut self.net,
                names: &mut self.names,
            },
            &mut self.edges,
            &mut self.bridge,
            &self.sink,
            &self.edge_names,
        )
    }

    fn schedule(&mut self, at: Instant, ev: Ev) {
        self.next_ev += 1;
        self.queue.insert((at, self.next_ev), ev);
    }

    fn run(&mut self) -> Result<Summary, Failure> {
        {
            let (mut cx, edges, ..) = self.ctx();
            for e in edges.iter_mut() {
                e.start(&mut cx);
            }
        }
        self.schedule(self.now, Ev::Act);
        let mut actions = 0;
        let settle_until = loop {
            if let Some(f) = self.step(&mut actions) {
                return Err(f);
            }
            if actions >= self.config.actions {
                break self.now + Duration::from_secs(90);
            }
        };
        // Heal everything and let the system settle: what was promised must now be true.
        self.trace.line("healing: every fault cleared, every process up".into());
        self.sink.records_down_until = None;
        self.sink.downlink_down_until = None;
        self.sink.writes_failing_until = None;
        for l in &mut self.links {
            l.cut_until = None;
        }
        {
            let (mut cx, edges, bridge, ..) = self.ctx();
            for e in edges.iter_mut() {
                e.store_locked_until = None;
                if !e.is_up() {
                    e.start(&mut cx);
                }
            }
            if !bridge.up {
                bridge.up = true;
                bridge.restart_at = None;
            }
        }
        self.queue.retain(|_, ev| !matches!(ev, Ev::Act));
        while self.now < settle_until {
            if let Some(f) = self.step(&mut actions) {
                return Err(f);
            }
            if self.queue.is_empty() && self.next_deadline().is_none() {
                break;
            }
        }
        self.final_checks();
        if let Some(f) = self.failure() {
            return Err(f);
        }
        Ok(Summary {
            seed: self.config.seed,
            steps: self.steps,
            simulated: self.now - self.base,
            trace_hash: self.trace.hash,
            counts: self.oracle.counts,
            kafka: self.sink.kafka.as_ref().map(|m| m.borrow().counts()),
        })
    }

    fn next_deadline(&self) -> Option<Instant> {
        let edges = self.edges.iter().filter_map(Edge::deadline);
        let kafka = self.sink.kafka.as_ref().and_then(|m| m.borrow().deadline());
        edges.chain(self.bridge.deadline()).chain(kafka).min()
    }

    /// One step: the next event or deadline, and everything it sets going.
    fn step(&mut self, actions: &mut usize) -> Option<Failure> {
        self.steps += 1;
        let event = self.queue.first_key_value().map(|((at, _), _)| *at);
        let deadline = self.next_deadline();
        let at = match (event, deadline) {
            (Some(e), Some(d)) => e.min(d),
            (e, d) => e.or(d)?,
        };
        if at <= self.now && event.is_none_or(|e| e > self.now) {
            // A deadline that has passed and makes nothing happen would be met again at once.
            self.stuck += 1;
            if self.stuck > 1_000 {
                self.oracle.fail(format!(
                    "a deadline {:?} ago keeps coming due and nothing happens at it (a timer whose work never runs)",
                    self.now - at
                ));
                return self.failure();
            }
        } else {
            self.stuck = 0;
        }
        self.now = self.now.max(at);
        self.trace.at = self.now - self.base;
        self.trace.step = self.steps;
        if event.is_some_and(|e| e <= self.now)
            && let Some((_, ev)) = self.queue.pop_first()
        {
            if matches!(ev, Ev::Act) {
                *actions += 1;
            }
            self.handle(ev);
        }
        self.settle();
        self.check_bounds();
        self.check_readiness();
        if self.now >= self.next_liveness {
            self.next_liveness = self.now + Duration::from_secs(1);
            self.check_liveness();
        }
        self.failure()
    }

    fn failure(&self) -> Option<Failure> {
        let violation = self.oracle.violation.clone()?;
        Some(Failure {
            seed: self.config.seed,
            actions: self.config.actions,
            step: self.steps,
            at: self.now - self.base,
            violation,
            trace: self.trace.lines.iter().cloned().collect(),
        })
    }

    /// Runs every part until nothing more happens at this instant, and puts what they sent on
    /// the wire.
    fn settle(&mut self) {
        for _ in 0..1_000 {
            {
                let (mut cx, edges, bridge, sink, names) = self.ctx();
                for e in edges.iter_mut() {
                    if e.deadline().is_some_and(|d| d <= cx.now) {
                        e.tick(&mut cx);
                    }
                    e.pump(&mut cx);
                }
                if !bridge.up && bridge.restart_at.is_some_and(|at| at <= cx.now) {
                    cx.trace.line("bridge restarts".into());
                    bridge.up = true;
                    bridge.restart_at = None;
                }
                bridge.pump(sink, names, &mut cx);
            }
            let dials: Vec<usize> = (0..self.edges.len()).filter(|&e| self.edges[e].dial_due(self.now)).collect();
            for e in dials {
                self.dial(e);
            }
            if !self.wire() {
                return;
            }
        }
        self.oracle.fail("the system never settled at one instant".into());
    }

    /// Puts what the parts sent on the link; whether there was anything.
    fn wire(&mut self) -> bool {
        let net = std::mem::take(&mut self.net);
        let any = !(net.up.is_empty() && net.down.is_empty() && net.closed.is_empty() && net.down_closed.is_empty());
        for (edge, cid, frame) in net.up {
            if let Some(at) = self.arrival(edge, true, matches!(frame, Frame::Batch(_))) {
                self.schedule(at, Ev::ToBridge(edge, cid, frame));
            }
        }
        for (edge, cid, frame) in net.down {
            if let Some(at) = self.arrival(edge, false, false) {
                self.schedule(at, Ev::ToEdge(edge, cid, frame));
            }
        }
        for (edge, cid) in net.closed {
            if self.links[edge].cid == Some(cid) {
                self.links[edge].cid = None;
            }
            let at = self.now + self.rng.millis(1, 30);
            self.schedule(at, Ev::ClosedByEdge(edge, cid));
        }
        for (edge, cid, refused) in net.down_closed {
            if self.links[edge].cid == Some(cid) {
                self.links[edge].cid = None;
            }
            let at = self.now + self.rng.millis(1, 30);
            self.schedule(at, Ev::ClosedByBridge(edge, cid, refused));
        }
        any
    }

    /// When a frame sent now arrives, or `None` if the link drops it (cut).
    fn arrival(&mut self, edge: usize, up: bool, stream: bool) -> Option<Instant> {
        let link = &self.links[edge];
        if link.cut_until.is_some_and(|u| u > self.now) {
            return None;
        }
        let delay = self.rng.millis(1, 15);
        let mut at = self.now + delay;
        // Control frames keep their order; batches each have a stream and may overtake.
        if !stream {
            let last = if up { &mut self.links[edge].last_up } else { &mut self.links[edge].last_down };
            at = at.max(last.unwrap_or(at));
            *last = Some(at);
        }
        Some(at)
    }

    fn dial(&mut self, e: usize) {
        let cut = self.links[e].cut_until.is_some_and(|u| u > self.now);
        let (mut cx, edges, bridge, ..) = self.ctx();
        if !bridge.up || cut {
            cx.trace.line(format!("edge-{e}: cannot reach the bridge"));
            edges[e].dial_failed(&mut cx);
            return;
        }
        edges[e].cids += 1;
        let cid = edges[e].cids;
        // Not dialing again meanwhile: the connection is under way.
        if let Some(p) = edges[e].proc.as_mut() {
            p.dial_at = None;
        }
        let at = self.now + self.rng.millis(2, 30);
        self.links[e].cid = Some(cid);
        self.schedule(at, Ev::Connected(e, cid));
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Act => {
                self.act();
                let at = self.now + self.rng.millis(1, 250);
                self.schedule(at, Ev::Act);
            }
            Ev::Connected(e, cid) => {
                if self.links[e].cid != Some(cid) {
                    // The link was cut while the handshake was under way: it fails, as a
                    // handshake that times out does.
                    let (mut cx, edges, ..) = self.ctx();
                    if edges[e].proc.as_ref().is_some_and(|p| p.link.is_none() && p.dial_at.is_none()) {
                        edges[e].dial_failed(&mut cx);
                    }
                    return;
                }
                let name = self.edge_names[e].clone();
                let (mut cx, edges, bridge, sink, _) = self.ctx();
                if !bridge.up || !edges[e].is_up() {
                    if edges[e].is_up() {
                        edges[e].dial_failed(&mut cx);
                    }
                    return;
                }
                cx.trace.line(format!("{name}: connected (connection {cid})"));
                bridge.accept(e, &name, cid, sink, &mut cx);
                edges[e].connected(cid, &mut cx);
            }
            Ev::ToBridge(e, cid, frame) => {
                if self.bridge.up {
                    self.bridge.receive(e, cid, frame);
                }
            }
            Ev::ToEdge(e, cid, frame) => {
                let (mut cx, edges, ..) = self.ctx();
                edges[e].receive(cid, frame, &mut cx);
            }
            Ev::ClosedByEdge(e, cid) => {
                let (mut cx, _, bridge, sink, _) = self.ctx();
                bridge.closed(e, cid, sink, &mut cx);
            }
            Ev::ClosedByBridge(e, cid, refused) => {
                let (mut cx, edges, ..) = self.ctx();
                edges[e].link_lost(cid, refused, &mut cx);
            }
            Ev::News(e) => self.bridge.news(e),
        }
    }

    /// One random action: a client's, a send, or a fault.
    fn act(&mut self) {
        let kind = self.rng.weighted(&self.profile.weights);
        match kind {
            0 => self.client_act(),
            1 => self.send(),
            2 => {
                let e = self.rng.below(self.edges.len() as u64) as usize;
                let back = self.now + self.rng.millis(200, 4_000);
                let (mut cx, edges, ..) = self.ctx();
                if edges[e].is_up() {
                    edges[e].crash(&mut cx);
                    edges[e].restart_at = Some(back);
                }
            }
            3 => {
                let back = self.now + self.rng.millis(200, 4_000);
                let (mut cx, _, bridge, sink, _) = self.ctx();
                if bridge.up {
                    cx.trace.line("bridge crashes".into());
                    bridge.crash(sink, &mut cx);
                    bridge.restart_at = Some(back);
                }
            }
            4 => {
                let e = self.rng.below(self.edges.len() as u64) as usize;
                let until = self.now + self.rng.millis(100, 8_000);
                self.trace.line(format!("edge-{e}: link cut until +{:?}", until - self.now));
                self.links[e].cut_until = Some(until);
                // Both ends see the connection die, each when it notices.
                if let Some(cid) = self.links[e].cid.take() {
                    let (a, b) = (self.now + self.rng.millis(50, 3_000), self.now + self.rng.millis(50, 3_000));
                    self.schedule(a, Ev::ClosedByBridge(e, cid, false));
                    self.schedule(b, Ev::ClosedByEdge(e, cid));
                }
            }
            5 => {
                let e = self.rng.below(self.edges.len() as u64) as usize;
                let secs =
                    if self.rng.chance(0.4) { self.rng.millis(10_500, 16_000) } else { self.rng.millis(50, 3_000) };
                self.trace.line(format!("edge-{e}: session store locked for {secs:?}"));
                self.edges[e].store_locked_until = Some(self.now + secs);
            }
            6 => {
                let d = self.rng.millis(500, 8_000);
                self.trace.line(format!("sink: records unavailable for {d:?}"));
                self.sink.records_down_until = Some(self.now + d);
            }
            8 => {
                let d = self.rng.millis(200, 3_000);
                self.trace.line(format!("sink: writes fail, outcome unknown, for {d:?}"));
                self.sink.writes_failing_until = Some(self.now + d);
            }
            _ => {
                let (lo, hi) = self.profile.downlink_outage;
                let d = self.rng.millis(lo, hi);
                self.trace.line(format!("sink: downlink unavailable for {d:?}"));
                self.sink.downlink_down_until = Some(self.now + d);
            }
        }
    }

    fn client_act(&mut self) {
        let e = self.rng.below(self.edges.len() as u64) as usize;
        let i = self.rng.below(self.edges[e].clients.len() as u64) as usize;
        if !self.edges[e].is_up() {
            return;
        }
        let connected = self.edges[e].clients[i].conn.is_some();
        if !connected {
            let clean = self.rng.chance(0.05);
            let (mut cx, edges, ..) = self.ctx();
            edges[e].connect_client(i, clean, &mut cx);
            return;
        }
        if !self.edges[e].clients[i].ready {
            return;
        }
        let what = self.rng.weighted(&[3, 2, 3, 12, 6, 4, 1]);
        let edge_name = self.edge_names[e].clone();
        match what {
            0 | 1 => {
                let normal = what == 0;
                let (mut cx, edges, ..) = self.ctx();
                edges[e].disconnect_client(i, normal, &mut cx);
            }
            2 => {
                let filter = *self.rng.pick(&["cmd/#", "config/#", "telemetry/#", "status/#", "local/#", "#", "cmd/+"]);
                let qos = edge::qos(self.rng.below(3) as u8);
                let c = &mut self.edges[e].clients[i];
                if c.has_room() {
                    self.trace.line(format!("{edge_name} {}: SUBSCRIBE {filter} qos{}", c.id, qos as u8));
                    c.subscribe(filter, qos);
                }
            }
            3 | 4 => {
                let c = &self.edges[e].clients[i];
                if !c.has_room() {
                    return;
                }
                let n = c.published;
                let tag = format!("c{e}.{}.{n}", c.id);
                let qos = edge::qos(self.rng.below(3) as u8);
                let (topic, payload) = match self.rng.below(5) {
                    0 | 1 => (format!("telemetry/{}", c.id), Bytes::from(tag)),
                    2 => (format!("status/{}", c.id), Bytes::from(tag)),
                    3 => ("local/a".to_owned(), Bytes::from(tag)),
                    _ => (SCHEMA_TOPIC.to_owned(), Bytes::from(format!("{{\"id\":\"{tag}\",\"temp\":{n}}}"))),
                };
                let retain = what == 4 && self.rng.chance(0.3);
                self.edges[e].clients[i].publish(&topic, payload, qos, retain, PublishProps::default());
            }
            5 => {
                let c = &mut self.edges[e].clients[i];
                if let Some(filter) = c.subs.keys().next().cloned() {
                    self.trace.line(format!("{edge_name} {}: UNSUBSCRIBE {filter}", c.id));
                    c.unsubscribe(&filter);
                }
            }
            _ => {
                // A flood of retained QoS 0 messages, each replacing the last on its topic:
                // nothing waits for the store, so only its backlog bound holds them back.
                let c = &mut self.edges[e].clients[i];
                let id = c.id.clone();
                let count = self.rng.between(50, 400);
                self.trace.line(format!("{edge_name} {id}: {count} retained QoS 0 messages of 64 KiB"));
                for k in 0..count {
                    let n = c.published;
                    let mut payload = format!("c{e}.{id}.{n} ").into_bytes();
                    payload.resize(64 << 10, b'x');
                    c.publish(
                        &format!("local/r{}", k % 8),
                        Bytes::from(payload),
                        QoS::AtMostOnce,
                        true,
                        PublishProps::default(),
                    );
                }
            }
        }
    }

    /// A downlink message, stored as `cloud-bridge send` stores it (or as any writer of the
    /// stream could), for an edge.
    fn send(&mut self) {
        let e = self.rng.below(self.edges.len() as u64) as usize;
        let name = self.edge_names[e].clone();
        self.sends += 1;
        let tag = format!("d{}", self.sends);
        let (topic, payload) = match self.rng.below(6) {
            0 => (SCHEMA_TOPIC.to_owned(), format!("{{\"id\":\"{tag}\",\"temp\":\"hot\"}}")),
            1 => (SCHEMA_TOPIC.to_owned(), format!("{{\"id\":\"{tag}\",\"temp\":21}}")),
            2 => ("config/threshold".to_owned(), tag.clone()),
            3 => ("telemetry/x".to_owned(), tag.clone()),
            4 if self.rng.chance(0.2) => ("cmd/typo/x".to_owned(), tag.clone()),
            _ => (format!("cmd/{}", self.rng.below(3)), tag.clone()),
        };
        let mut msg = Outgoing {
            topic: topic.clone(),
            payload: payload.into_bytes(),
            qos: self.rng.below(3) as u8,
            retain: self.rng.chance(0.2),
            ..Outgoing::default()
        };
        match self.rng.below(12) {
            0 => msg.response_topic = Some("reply/+".into()),
            1 => msg.user_properties = (0..100).map(|i| (format!("k{i}"), "v".into())).collect(),
            2 => msg.expires_at_ms = Some(WALL_START + (self.now - self.base).as_millis() as u64 + 500),
            _ => {}
        }
        // A send with an id, run again as an operator would after a timeout: stored once.
        let again = self.rng.chance(0.1);
        if again {
            msg.id = Some(format!("id-{tag}"));
        }
        let bounds = DownBounds { messages: 1_000, bytes: 1 << 20 };
        let stored = self.sink.run("downlink enqueue", self.sink.sqlite.enqueue(&name, &msg, bounds));
        match stored {
            Ok(Ok(Enqueued::Stored { seq })) => {
                if again {
                    let repeat = self.sink.run("downlink enqueue", self.sink.sqlite.enqueue(&name, &msg, bounds));
                    if !matches!(repeat, Ok(Ok(Enqueued::Already { seq: s })) if s == seq) {
                        let why =
                            format!("send {tag} to {name} again with its id: {repeat:?}, not already stored as {seq}");
                        self.trace.line(format!("VIOLATION: {why}"));
                        self.oracle.fail(why);
                    }
                }
                self.trace.line(format!("send {tag} to {name} on {topic} qos{}: seq {seq}", msg.qos));
                self.oracle.downs.insert(tag, check::Down { edge: name, seq, topic });
                self.oracle.counts.downs += 1;
                let at = self.now + self.rng.millis(1, 50);
                self.schedule(at, Ev::News(e));
            }
            Ok(Ok(Enqueued::Full(_))) => self.trace.line(format!("send {tag} to {name}: backlog full")),
            Ok(Ok(Enqueued::Already { seq })) => {
                let why = format!("send {tag} to {name}: a new id taken as already stored as {seq}");
                self.trace.line(format!("VIOLATION: {why}"));
                self.oracle.fail(why);
            }
            // A hostile edge may have used its own seqs up: its sends are refused, no other's.
            Ok(Err(err @ cloud_bridge::sink::SinkError::Invalid { .. })) if self.edges[e].claims.is_some() => {
                self.trace.line(format!("send {tag} to {name}: {err}"));
            }
            Ok(Err(err)) => {
                let why = format!("send to {name}: {err}");
                self.trace.line(format!("VIOLATION: {why}"));
                self.oracle.fail(why);
            }
            Err(stuck) => {
                let why = format!("send to {name}: {stuck}");
                self.trace.line(format!("VIOLATION: {why}"));
                self.oracle.fail(why);
            }
        }
    }

    /// The session store's backlog stays within its bounds, whatever the clients send.
    fn check_bounds(&mut self) {
        for e in 0..self.edges.len() {
            let Some((ops, counted, bytes)) = self.edges[e].store_backlog() else { continue };
            let (max_ops, max_bytes) =
                (edge_node::broker::store::MAX_PENDING_OPS, edge_node::broker::store::MAX_PENDING_BYTES);
            // One packet may pass a bound: its reader looked before it was read.
            if ops > max_ops + 1_000 || bytes > max_bytes + (1 << 20) {
                let why = format!(
                    "edge-{e}: the session store's backlog holds {ops} ops and {} KiB of messages nothing else holds ({} KiB counted), past its bounds of {max_ops} ops and {} KiB",
                    bytes >> 10,
                    counted >> 10,
                    max_bytes >> 10
                );
                self.trace.line(format!("VIOLATION: {why}"));
                self.oracle.fail(why);
            }
        }
    }

    /// Readiness tells the truth about the session store: not ready once ops have waited past
    /// `health.max_store_wait` without a commit (a lock held, commits failing), ready whenever
    /// nothing waits.
    fn check_readiness(&mut self) {
        let bound = edge_node::health::HealthConfig::default().max_store_wait.0;
        let wall_ms = WALL_START + (self.now - self.base).as_millis() as u64;
        for e in 0..self.edges.len() {
            let Some((check, waiting)) = self.edges[e].store_readiness(self.now, wall_ms) else { continue };
            let why = match waiting {
                Some(w) if w > bound + Duration::from_secs(1) && check.ok => format!(
                    "edge-{e}: /readyz passes the session store while its ops have waited {w:?} for a commit: {}",
                    check.detail
                ),
                None if !check.ok => {
                    format!("edge-{e}: /readyz fails the session store with nothing waiting: {}", check.detail)
                }
                _ => continue,
            };
            self.trace.line(format!("VIOLATION: {why}"));
            self.oracle.fail(why);
        }
    }

    /// Telemetry flows whenever it can: with the edge, the bridge, the link, the sink's records
    /// and the edge's session store all working for [`LIVENESS`], nothing in the spool is
    /// older than that. (The downlink's storage is not among them: its outage is no reason
    /// for telemetry to stop.)
    fn check_liveness(&mut self) {
        let now = self.now;
        let records_up = self.sink.records_down_until.is_none_or(|u| u <= now);
        for e in 0..self.edges.len() {
            let edge = &self.edges[e];
            let good = edge.is_up()
                && edge.claims.is_none()
                && self.bridge.up
                && records_up
                && self.links[e].cut_until.is_none_or(|u| u <= now)
                && edge.store_locked_until.is_none_or(|u| u <= now);
            if !good {
                self.good_since[e] = None;
                continue;
            }
            let since = *self.good_since[e].get_or_insert(now);
            if now - since < LIVENESS {
                continue;
            }
            let wall_now = WALL_START + (now - self.base).as_millis() as u64;
            if let Some(oldest) = self.edges[e].oldest_unacked_ms()
                && wall_now.saturating_sub(oldest) > LIVENESS.as_millis() as u64
            {
                let why = format!(
                    "edge-{e}: telemetry stopped: a record spooled {:.1}s ago is not acked, though the edge, the bridge, the \
                     link, the sink's records and the session store have all worked for {:.1}s",
                    (wall_now - oldest) as f64 / 1000.0,
                    (now - since).as_secs_f64()
                );
                self.trace.line(format!("VIOLATION: {why}"));
                self.oracle.fail(why);
            }
        }
    }

    /// What must be true once everything healed and settled.
    fn final_checks(&mut self) {
        let records: Vec<(String, String, Vec<u8>)> = if let Some(m) = &self.sink.kafka {
            // What a read_committed consumer reads, each lane in seq order.
            let (records, disorder) = m.borrow().records();
            if let Some(first) = disorder.first() {
                self.oracle.fail(format!("{} lanes out of order in the Kafka records, first: {first}", disorder.len()));
            }
            records
        } else {
            let conn = rusqlite::Connection::open(self.sink.sqlite.path()).expect("the sink's file");
            let mut stmt =
                conn.prepare("SELECT edge_id, topic, payload FROM records WHERE kind = 'message'").expect("records");
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .expect("records")
                .collect::<Result<_, _>>()
                .expect("records")
        };
        // A hostile edge's own sessions are refused: what it took is its own to lose.
        let hostile: Vec<String> = self.edges.iter().filter(|e| e.claims.is_some()).map(|e| e.name.clone()).collect();
        self.oracle.records(&records, &hostile);
        // Every honest edge took every message stored for it.
        for e in 0..self.edges.len() {
            if self.edges[e].claims.is_some() {
                continue;
            }
            let name = self.edge_names[e].clone();
            let last = self.oracle.downs.values().filter(|d| d.edge == name).map(|d| d.seq).max();
            let Some(last) = last else { continue };
            let state = self.sink.run("downlink position", self.sink.sqlite.down_state(&name));
            match state {
                Ok(Ok(s)) if s.position >= last => {}
                Ok(Ok(s)) => {
                    let session = self.bridge.sessions.get(&e).map(|s| s.waiting());
                    self.oracle.fail(format!(
                        "{name}: the downlink is at {} after healing, {last} was stored (its session: {session:?})",
                        s.position
                    ))
                }
                Ok(Err(e)) => self.oracle.fail(format!("{name}: downlink position: {e}")),
                Err(stuck) => self.oracle.fail(stuck),
            }
        }
    }
}

/// Where the sim's files go: memory, so its fsyncs cost nothing.
fn shm() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() { shm } else { std::env::temp_dir() }
}

/// A one-line account of a run.
pub fn describe(s: &Summary) -> String {
    let mut out = String::new();
    let c = &s.counts;
    let _ = write!(
        out,
        "seed {}: {} steps, {:.0}s simulated, {} published, {} delivered, {} telemetry acknowledged, {} downlink stored, \
         {} downlink delivered, {} sessions resumed",
        s.seed,
        s.steps,
        s.simulated.as_secs_f64(),
        c.published,
        c.delivered,
        c.taken,
        c.downs,
        c.downs_delivered,
        c.resumed
    );
    if let Some(k) = &s.kafka {
        let _ = write!(
            out,
            "; kafka: {} transactions committed, {} aborted, {} writes fenced, {} late commits landed, {} waits for \
             settled marks, {} producers fenced by claims",
            k.committed, k.aborted, k.fenced, k.late_committed, k.unsettled, k.fences
        );
    }
    out
}
