//! A simulated edge node: the shipped broker core with its session store (`broker::store::Inline`
//! on a file in memory), the spool (`spool::Spool` over SQLite), the uplink's connection core
//! (`uplink::core::Conn`, `Dialer`), the protocol session (`EdgeSession`) and the downlink's
//! core (`downlink::DownCore`). This file is the sim's driver of them: it moves packets, frames
//! and commits, and keeps time; every decision is theirs.
//!
//! What the sim's disk does: a store commit waits `COMMIT_INTERVAL` after its first op (as the
//! store's thread gathers; the thread commits the downlink's marks sooner, an order a slower
//! disk gives too), fails while the store is locked (and is tried again, backing off as
//! the thread does), and a crash loses what was not committed; the spool commits every
//! `SPOOL_EVERY`, and a crash loses what it had not.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edge_node::auth::{AuthConfig, AuthState};
use edge_node::broker::codec::{Inbound, QoS};
use edge_node::broker::core::{Action, Broker, ConnId, ConnectRequest, Identity, Limits, Spooled, StoreOp};
use edge_node::broker::metrics::BrokerMetrics;
use edge_node::broker::store::{Backlog, COMMIT_INTERVAL, Inline, backlog_bytes};
use edge_node::downlink::{DownCore, DownMark, DownlinkEntry, Governance, MARK_KEY, RetainPolicy, RulesOf};
use edge_node::route::{Class, Classes, Governance as ClassGovernance, Route};
use edge_node::schema::{Mode, SchemaBinding, SchemaMetrics, Unstaged, Validator};
use edge_node::spool::{Durability, Lane, Seq, Spool, SqliteStorage};
use edge_node::uplink::core::{Conn, ConnError, Dialer, EndKind, Io, Next, SendPolicy};
use edge_node::uplink::into_wire;
use edge_node::uplink::pack::pack_within_cost;
use shared::proto::columns::NoShapes;
use shared::proto::edge::{EdgeSession, EdgeSessionConfig};
use shared::proto::{Batch, Control, WireRecord};

use super::client::{Client, Heard};
use super::{Ctx, Frame};

/// How often the spool commits what was appended (`spool.commit_interval`).
const SPOOL_EVERY: Duration = Duration::from_millis(10);

/// The schema bound to [`SCHEMA_TOPIC`]: a reading with a numeric `temp`.
pub const READING: &str = r#"{"type":"object","required":["temp"],"properties":{"temp":{"type":"number"}}}"#;

/// The topic `[[schema]]` binds on every simulated edge.
pub const SCHEMA_TOPIC: &str = "config/reading";

/// A process of the edge: what a crash throws away.
pub struct EdgeProc {
    pub broker: Broker,
    next_conn: u64,
    store: Store,
    spool: Spool<SqliteStorage>,
    spool_due: Option<Instant>,
    /// Tickets of `full` appends, answered once the spool committed them.
    full: Vec<u64>,
    pub session: EdgeSession,
    pub down: DownCore,
    /// The connection to the bridge: its generation (frames of another are stale) and core.
    pub link: Option<(u64, Conn)>,
    dialer: Dialer,
    pub dial_at: Option<Instant>,
    /// Welcomes the session had when this connection began.
    welcomes: u64,
}

impl std::fmt::Debug for EdgeProc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeProc").finish_non_exhaustive()
    }
}

/// The session store's writes, as its thread makes them.
struct Store {
    inline: Inline,
    /// Sent, not committed: (op id, op), in order.
    pending: Vec<(u64, StoreOp)>,
    /// What they hold and since when they wait, as the store's thread counts them: its
    /// backlog, from which the readers' bound and `/readyz` read.
    backlog: Backlog,
    since: Option<Instant>,
    retry_at: Option<Instant>,
    retry: Duration,
    committed: u64,
}

/// An edge and its clients; its process comes and goes.
#[derive(Debug)]
pub struct Edge {
    pub index: usize,
    pub name: String,
    pub dir: PathBuf,
    /// The downlink position this edge claims in every hello, whatever it holds: a hostile
    /// gateway with a valid certificate.
    pub claims: Option<u64>,
    pub proc: Option<EdgeProc>,
    pub clients: Vec<Client>,
    pub restart_at: Option<Instant>,
    /// The session store refuses commits (a lock another process holds) until then.
    pub store_locked_until: Option<Instant>,
    /// Link generations handed out.
    pub cids: u64,
}

/// The topic classes every simulated edge has.
fn classes() -> Classes {
    let class = |name: &str, filter: &str, route, lane, durability| {
        Class::new(
            name.into(),
            vec![shared::topic::TopicFilter::new(filter).expect("a filter")],
            route,
            ClassGovernance::None,
            Lane(lane),
            durability,
            None,
        )
    };
    Classes::new(vec![
        class("telemetry", "telemetry/#", Route::Central, 1, Durability::Full),
        class("status", "status/#", Route::Both, 2, Durability::Normal),
    ])
}

/// `[[downlink]]` of every simulated edge.
fn governance() -> Governance {
    let entry = |filter: &str, user: Option<&str>| DownlinkEntry {
        filter: filter.into(),
        max_qos: 2,
        retain: RetainPolicy::Keep,
        user: user.map(Into::into),
    };
    // `cmd/typo/#` names a user `[auth]` does not know: its messages are refused.
    Governance::new(&[entry("cmd/typo/#", Some("opps")), entry("cmd/#", None), entry("config/#", Some("ops"))])
}

impl Edge {
    pub fn new(index: usize, dir: PathBuf, claims: Option<u64>, clients: Vec<Client>) -> Self {
        Self {
            index,
            name: format!("edge-{index}"),
            dir,
            claims,
            proc: None,
            clients,
            restart_at: None,
            store_locked_until: None,
            cids: 0,
        }
    }

    /// Starts the process from what its disk holds.
    pub fn start(&mut self, cx: &mut Ctx<'_>) {
        let models = self.dir.join("models");
        stage_schema(&models);
        let (inline, state) = Inline::open(&self.dir.join("sessions.db"), (cx.now, cx.wall_ms)).expect("session store");
        let mark = DownMark::parse(state.marks.get(MARK_KEY).map(String::as_str));
        let receipts: std::collections::BTreeSet<u64> =
            state.received.iter().map(|&(.., r)| r).filter(|r| *r != 0).collect();
        let metrics = BrokerMetrics::new(&mut Default::default());
        let limits = Limits { max_retained_messages: 2_000, ..Limits::default() };
        let wall = edge_node::broker::core::WallClock { at: cx.now, ms: cx.wall_ms };
        let binding = SchemaBinding {
            topic: SCHEMA_TOPIC.into(),
            subject: "reading".into(),
            mode: Mode::Enforce,
            unstaged: Unstaged::Refuse,
        };
        let validator = Validator::new(&[binding], &models, SchemaMetrics::default());
        let mut broker = Broker::new(limits, Arc::new(classes()), metrics, wall).with_schemas(Arc::new(validator));
        broker.restore(state, cx.now);
        let storage = SqliteStorage::open(&self.dir.join("spool.db")).expect("spool");
        let mut spool = Spool::new(storage);
        spool.keep_receipts(&receipts).expect("the spool's receipts");
        let epoch = spool.epoch().to_owned();
        let acked = spool.heads().into_iter().map(|(l, a, _)| (l.0, a.0));
        let config = EdgeSessionConfig { window: 4, ..EdgeSessionConfig::default() };
        let session = EdgeSession::new(config, epoch, acked);
        // `[[downlink]]`'s users, looked up as the node does: `ops` has an ACL section.
        let acl = self.dir.join("acl.toml");
        std::fs::write(&acl, "[default]\npublish = [\"#\"]\n[users.ops]\npublish = [\"config/#\"]\n").expect("acl");
        let auth = AuthState::load(&AuthConfig { acl_file: Some(acl), ..AuthConfig::default() }).expect("auth");
        let rules_of: RulesOf = Arc::new(move |user: &str| auth.rules_of_user(user, edge_node::downlink::CLIENT_ID));
        let mut mark = mark;
        if let Some(claim) = self.claims {
            mark.done = claim;
        }
        let down = DownCore::new(governance(), rules_of, mark);
        let dialer = Dialer::new(vec!["bridge".into()], 0, (Duration::from_millis(200), Duration::from_secs(5)), false);
        cx.trace.line(format!("{} starts: epoch {}", self.name, cx.names.epoch(spool.epoch())));
        self.proc = Some(EdgeProc {
            broker,
            next_conn: 0,
            store: Store {
                inline,
                pending: Vec::new(),
                backlog: Backlog::default(),
                since: None,
                retry_at: None,
                retry: Duration::from_millis(50),
                committed: 0,
            },
            spool,
            spool_due: None,
            full: Vec::new(),
            session,
            down,
            link: None,
            dialer,
            dial_at: Some(cx.now),
            welcomes: 0,
        });
        self.restart_at = None;
    }

    /// The process dies: everything not committed is gone, connections with it.
    pub fn crash(&mut self, cx: &mut Ctx<'_>) {
        let Some(p) = self.proc.take() else { return };
        cx.trace.line(format!(
            "{} crashes: {} store ops and {} spool records uncommitted are lost",
            self.name,
            p.store.pending.len(),
            p.spool.pending()
        ));
        if let Some((cid, _)) = p.link {
            cx.net.closed.push((self.index, cid));
        }
        for c in &mut self.clients {
            c.lost();
        }
        drop(p);
    }

    pub fn is_up(&self) -> bool {
        self.proc.is_some()
    }

    /// When this edge next has something to do on its own.
    pub fn deadline(&self) -> Option<Instant> {
        let Some(p) = &self.proc else { return self.restart_at };
        let store = p.store.since.map(|s| (s + COMMIT_INTERVAL).max(p.store.retry_at.unwrap_or(s)));
        let conn = p.link.as_ref().and_then(|(_, c)| c.poll_timeout(&p.session));
        let holds = self.clients.iter().filter_map(|c| c.conn.and_then(|conn| p.broker.hold_deadline(conn)));
        [p.broker.poll_timeout(), store, p.spool_due, conn, p.dial_at].into_iter().flatten().chain(holds).min()
    }

    /// Does what is due at `cx.now`: store commits, spool commits, timers.
    pub fn tick(&mut self, cx: &mut Ctx<'_>) {
        let now = cx.now;
        if self.proc.is_none() {
            if self.restart_at.is_some_and(|at| at <= now) {
                self.start(cx);
            }
            return;
        }
        let locked = self.store_locked_until.is_some_and(|until| now < until);
        let name = self.name.clone();
        let index = self.index;
        let Some(p) = self.proc.as_mut() else { return };
        p.broker.handle_timeout(now);
        for c in &self.clients {
            if let Some(conn) = c.conn
                && p.broker.hold_deadline(conn).is_some_and(|at| at <= now)
            {
                p.broker.hold_expired(conn, now);
            }
        }
        p.drain(cx);
        // The session store's commit.
        let due =
            p.store.since.is_some_and(|s| now >= s + COMMIT_INTERVAL) && p.store.retry_at.is_none_or(|r| now >= r);
        if due {
            if locked {
                p.store.retry = (p.store.retry * 2).min(Duration::from_secs(2));
                p.store.retry_at = Some(now + p.store.retry);
                p.store.backlog.failed("database is locked".into());
            } else {
                let ops = std::mem::take(&mut p.store.pending);
                p.store.inline.commit(&ops).expect("a commit on the sim's disk");
                let last = ops.last().map_or(0, |(id, _)| *id);
                p.store.committed = last;
                p.store.backlog.committed_at(ops.len(), p.store.backlog.health().bytes, cx.wall_ms);
                p.store.since = None;
                p.store.retry_at = None;
                p.store.retry = Duration::from_millis(50);
                p.broker.stored(last, now);
                match p.link.as_mut() {
                    Some((_, conn)) => {
                        if let Err(e) = conn.handle_stored(&mut p.session, &mut p.down, last) {
                            cx.trace.line(format!("{name}: uplink ends: {e}"));
                            p.end_link(index, EndKind::Failed, cx);
                        }
                    }
                    None => p.down.stored(last),
                }
            }
        }
        // The spool's commit.
        if p.spool_due.is_some_and(|at| now >= at) {
            p.spool_due = None;
            p.spool.flush().expect("a spool commit on the sim's disk");
            for ticket in std::mem::take(&mut p.full) {
                p.broker.spooled(ticket, Spooled::Accepted, now);
            }
            if let Some((_, conn)) = p.link.as_mut() {
                let heads = p.spool.heads().into_iter().map(|(l, _, last)| (l.0, last.0));
                conn.set_heads(&mut p.session, heads, now);
            }
        }
        // The uplink's timers.
        if let Some((_, conn)) = p.link.as_mut()
            && conn.poll_timeout(&p.session).is_some_and(|at| at <= now)
            && let Err(e) = conn.handle_timeout(&mut p.session, now)
        {
            cx.trace.line(format!("{name}: uplink ends: {e}"));
            let kind = kind_of(&e);
            p.end_link(index, kind, cx);
        }
    }

    /// Lets everything that can happen at `cx.now` without time passing happen: the core's
    /// actions, clients reading and answering, the uplink's frames and batches.
    pub fn pump(&mut self, cx: &mut Ctx<'_>) {
        let Some(p) = self.proc.as_mut() else { return };
        for _ in 0..10_000 {
            let mut progress = p.drain(cx);
            for i in 0..self.clients.len() {
                progress |= p.client_turn(&self.name, &mut self.clients[i], cx);
            }
            progress |= p.uplink_turn(self.index, &self.name, cx);
            if !progress {
                return;
            }
        }
        panic!("{}: the edge never settled", self.name);
    }

    /// A frame from the bridge on connection `cid`.
    pub fn receive(&mut self, cid: u64, frame: Control, cx: &mut Ctx<'_>) {
        let (index, name) = (self.index, self.name.clone());
        let Some(p) = self.proc.as_mut() else { return };
        let Some((_, conn)) = p.link.as_mut().filter(|(g, _)| *g == cid) else { return };
        if let Control::Down(d) = &frame {
            cx.trace.line(format!("{name}: downlink seq {} on {} qos{}", d.seq, d.topic, d.qos));
        }
        let target: &mut dyn edge_node::downlink::Target = &mut p.broker;
        if let Err(e) = conn.handle_control(&mut p.session, &mut p.down, target, frame, cx.now) {
            cx.trace.line(format!("{name}: uplink ends: {e}"));
            let kind = kind_of(&e);
            p.end_link(index, kind, cx);
        }
    }

    /// The bridge or the network ended connection `cid`.
    pub fn link_lost(&mut self, cid: u64, refused: bool, cx: &mut Ctx<'_>) {
        let index = self.index;
        let Some(p) = self.proc.as_mut() else { return };
        if p.link.as_ref().is_some_and(|(g, _)| *g == cid) {
            p.end_link(index, if refused { EndKind::Refused } else { EndKind::Failed }, cx);
        }
    }

    /// A connection to the bridge is up: the session says hello.
    pub fn connected(&mut self, cid: u64, cx: &mut Ctx<'_>) {
        let Some(p) = self.proc.as_mut() else { return };
        let policy = SendPolicy::new(Duration::from_millis(20), 64, 0.2);
        p.welcomes = p.session.welcomes();
        let conn = Conn::start(&mut p.session, &mut p.down, p.store.committed, policy, cx.now);
        p.link = Some((cid, conn));
        p.dial_at = None;
    }

    /// The dial failed (no bridge to take it).
    pub fn dial_failed(&mut self, cx: &mut Ctx<'_>) {
        let Some(p) = self.proc.as_mut() else { return };
        let next = p.dialer.handle_end(EndKind::Failed, false, cx.rng.unit());
        p.dial_at = Some(cx.now + wait_of(next));
    }

    /// Whether the edge wants to connect now.
    pub fn dial_due(&self, now: Instant) -> bool {
        self.proc.as_ref().is_some_and(|p| p.link.is_none() && p.dial_at.is_some_and(|at| at <= now))
    }

    /// Ops sent to the store and not committed, what the store's backlog counts of them, and
    /// the bytes of messages only they hold.
    pub fn store_backlog(&self) -> Option<(usize, usize, usize)> {
        let p = self.proc.as_ref()?;
        Some((p.store.pending.len(), p.store.backlog.health().bytes, held_only_by(&p.store.pending)))
    }

    /// `/readyz`'s session store check as the shipped code makes it (`health::store_check` of
    /// the store's backlog) at `cx`'s time, beside the truth: how long the oldest op sent has
    /// waited for a commit.
    pub fn store_readiness(&self, now: Instant, wall_ms: u64) -> Option<(edge_node::health::Check, Option<Duration>)> {
        let p = self.proc.as_ref()?;
        let bound = edge_node::health::HealthConfig::default().max_store_wait.0;
        let check = edge_node::health::store_check(&p.store.backlog.health(), wall_ms, bound);
        Some((check, p.store.since.map(|s| now - s)))
    }

    /// The spool's oldest record not yet acked, ms since the Unix epoch.
    pub fn oldest_unacked_ms(&mut self) -> Option<u64> {
        self.proc.as_mut()?.spool.oldest_unacked_ms().ok().flatten()
    }

    /// A client's connection, made now.
    pub fn connect_client(&mut self, i: usize, clean: bool, cx: &mut Ctx<'_>) {
        let name = self.name.clone();
        let Some(p) = self.proc.as_mut() else { return };
        let c = &mut self.clients[i];
        if c.conn.is_some() {
            return;
        }
        p.next_conn += 1;
        let conn = ConnId(p.next_conn);
        let identity = Identity { owner: "user:sim".into(), internal: false, rules: None };
        let connect = c.connect_packet(clean);
        cx.trace.line(format!("{name} {}: CONNECT clean={}", c.id, connect.clean_start));
        match p.broker.connect(ConnectRequest { conn, connect, identity }, cx.now) {
            Ok(()) => c.conn = Some(conn),
            Err(r) => cx.trace.line(format!("{name} {}: refused {}", c.id, r.label)),
        }
    }

    /// A client's connection ends: with DISCONNECT (`normal`) or without.
    pub fn disconnect_client(&mut self, i: usize, normal: bool, cx: &mut Ctx<'_>) {
        let name = self.name.clone();
        let Some(p) = self.proc.as_mut() else { return };
        let c = &mut self.clients[i];
        let Some(conn) = c.conn else { return };
        cx.trace.line(format!("{name} {}: {}", c.id, if normal { "DISCONNECT" } else { "connection dropped" }));
        if normal {
            p.broker.handle(conn, Inbound::Disconnect { reason: 0, session_expiry: None }, cx.now);
        }
        p.broker.closed(conn, cx.now);
        c.lost();
    }
}

/// What ends the connection after `e`.
fn kind_of(e: &ConnError) -> EndKind {
    match e {
        ConnError::Session(shared::proto::edge::SessionError::Refused(_)) => EndKind::Refused,
        _ => EndKind::Failed,
    }
}

fn wait_of(next: Next) -> Duration {
    match next {
        Next::Now => Duration::ZERO,
        Next::Wait { wait, .. } => wait,
    }
}

/// Bytes of the messages among `ops` that nothing else holds (a retained message replaced
/// before its op committed): memory the store's backlog alone keeps.
fn held_only_by(ops: &[(u64, StoreOp)]) -> usize {
    type Msg = Arc<edge_node::broker::message::Message>;
    let mut refs: BTreeMap<usize, (usize, &Msg)> = BTreeMap::new();
    fn note<'a>(refs: &mut BTreeMap<usize, (usize, &'a Msg)>, m: &'a Msg) {
        refs.entry(Arc::as_ptr(m) as usize).or_insert((0, m)).0 += 1;
    }
    for (_, op) in ops {
        match op {
            StoreOp::Retain { msg: Some(m), .. } | StoreOp::Done { msg: m, .. } => note(&mut refs, m),
            StoreOp::Queue(d) => note(&mut refs, &d.msg),
            StoreOp::Will { will: Some(w), .. } => note(&mut refs, &w.msg),
            StoreOp::Forget { msgs, .. } => msgs.iter().for_each(|m| note(&mut refs, m)),
            _ => {}
        }
    }
    refs.values().filter(|(n, m)| Arc::strong_count(m) == *n).map(|(_, m)| m.topic.len() + m.payload.len()).sum()
}

/// Stages [`READING`] as version 1 of subject `reading`, as the models subsystem leaves a
/// schema: the version's document, then the `current` link.
fn stage_schema(models: &std::path::Path) {
    use shared::schema::{Kind, Schema, Source, Version};
    let dir = models.join(shared::model::schema_model("reading"));
    if dir.join("current").exists() {
        return;
    }
    std::fs::create_dir_all(&dir).expect("models dir");
    let source = Source { kind: Kind::Json, text: READING.into(), message: None };
    let id = Schema::parse(source.clone()).expect("the reading schema").id().to_owned();
    let doc = Version { subject: "reading".into(), version: 1, id, source, created_ms: 0, compatibility: None };
    std::fs::write(dir.join("1"), serde_json::to_vec(&doc).expect("json")).expect("stage");
    std::os::unix::fs::symlink("1", dir.join("current")).expect("current");
}

impl EdgeProc {
    /// Carries out the core's actions: store ops (what one call made, together), spool
    /// appends (answered at once, or for `full` once committed), wake-ups (every client reads
    /// on each turn anyway).
    fn drain(&mut self, cx: &mut Ctx<'_>) -> bool {
        let mut progress = false;
        let mut group = Vec::new();
        while let Some(action) = self.broker.poll_action() {
            progress = true;
            match action {
                Action::Wake(_) | Action::Resume(_) => {}
                Action::ForgetReceipts(keys) => self.spool.forget_receipts(&keys).expect("forget receipts"),
                Action::Store { op_id, op } => {
                    group.push((op_id, op));
                    self.store.since.get_or_insert(cx.now);
                }
                Action::Spool(req) => {
                    let ticket = req.ticket;
                    if req.durability == Durability::Full {
                        match self.spool.append_full(req.lane, req.message) {
                            Ok(_) => self.full.push(ticket),
                            Err(_) => self.broker.spooled(ticket, Spooled::Refused, cx.now),
                        }
                    } else {
                        self.spool.append(req.lane, req.message, req.durability);
                        self.broker.spooled(ticket, Spooled::Accepted, cx.now);
                    }
                    self.spool_due.get_or_insert(cx.now + SPOOL_EVERY);
                }
            }
        }
        // Sent together, as the driver sends what one call on the core made.
        if !group.is_empty() {
            self.store.backlog.add_at(group.len(), backlog_bytes(&group), cx.wall_ms);
        }
        self.store.pending.append(&mut group);
        progress
    }

    /// One client's turn: it reads what the broker has for it and sends what it can.
    fn client_turn(&mut self, edge: &str, c: &mut Client, cx: &mut Ctx<'_>) -> bool {
        let Some(conn) = c.conn else { return false };
        let mut progress = false;
        let t = self.broker.poll_transmit(conn, cx.now, usize::MAX);
        for packet in t.packets {
            progress = true;
            match c.receive(packet) {
                Some(Heard::Connected { session_present }) => {
                    cx.trace.line(format!("{edge} {}: CONNACK session present {session_present}", c.id));
                    if session_present && c.persistent {
                        let held = self.broker.session_subscriptions(&c.id).unwrap_or_default();
                        cx.oracle.session_resumed(edge, c, &held);
                    }
                }
                Some(Heard::Taken { tag, topic, qos }) => cx.oracle.taken(edge, &tag, &topic, qos),
                Some(Heard::Refused { tag, reason }) => {
                    cx.trace.line(format!("{edge} {}: {tag} refused 0x{reason:02x}", c.id));
                }
                Some(Heard::Delivered(d)) => {
                    if let Some(tag) = super::tag_of(&d.payload).filter(|t| t.starts_with('d')) {
                        cx.trace.line(format!(
                            "{edge} {}: got {tag} qos{} dup={} retain={}",
                            c.id, d.qos as u8, d.dup, d.retain
                        ));
                    }
                    cx.oracle.delivered(edge, &c.id, c.persistent, &d)
                }
                Some(Heard::Closing) => {}
                None => {}
            }
        }
        if t.closing {
            cx.trace.line(format!("{edge} {}: the broker closed the connection", c.id));
            self.broker.closed(conn, cx.now);
            c.lost();
            return true;
        }
        // The reader waits while the store is far behind, and while the broker holds it.
        while c.ready && !c.outbox.is_empty() {
            if !self.store.backlog.within_bounds() || self.broker.held_until(conn).is_some_and(|t| t > cx.now) {
                break;
            }
            let Some(packet) = c.outbox.pop_front() else { break };
            // (A flood's retained messages are told once, by the action.)
            if let Inbound::Publish(p) = &packet
                && !p.dup
                && !p.topic_str().starts_with("local/r")
            {
                cx.trace.line(format!(
                    "{edge} {}: PUBLISH {} qos{} {}{}",
                    c.id,
                    p.topic_str(),
                    p.qos as u8,
                    super::tag_of(&p.payload).unwrap_or("?"),
                    if p.retain { " retained" } else { "" }
                ));
            }
            if let Inbound::Publish(p) = &packet {
                cx.oracle.sent(edge, &p.payload, p.qos);
            }
            self.broker.handle(conn, packet, cx.now);
            self.drain(cx);
            progress = true;
        }
        progress
    }

    /// The uplink's turn: what its core asked for, then a send pass.
    fn uplink_turn(&mut self, index: usize, edge: &str, cx: &mut Ctx<'_>) -> bool {
        let mut progress = false;
        let Some((cid, conn)) = self.link.as_mut() else { return false };
        let cid = *cid;
        while let Some(io) = conn.poll_io(&mut self.session) {
            progress = true;
            match io {
                Io::Control(frame) => {
                    if let Control::DownAck(a) = &frame {
                        cx.trace.line(format!("{edge}: downlink ack through {}", a.up_to));
                    }
                    cx.net.up.push((index, cid, Frame::Control(frame)))
                }
                Io::CheckMark { lane, committed } => {
                    self.spool.check_mark(Lane(lane), Seq(committed)).expect("check_mark");
                }
                Io::Ack { lane, up_to } => {
                    self.spool.ack(Lane(lane), Seq(up_to)).expect("ack");
                }
                Io::Ready { version, .. } => {
                    self.spool.welcomed().expect("welcomed");
                    cx.trace.line(format!("{edge}: uplink ready, version {version}"));
                    let heads = self.spool.heads().into_iter().map(|(l, _, last)| (l.0, last.0));
                    conn.set_heads(&mut self.session, heads, cx.now);
                }
                Io::DictStored(_) | Io::Model(_) | Io::Committed(_) | Io::Rtt(_) | Io::Degraded(_) => {}
            }
        }
        conn.begin_pass();
        while let Some(read) = conn.poll_read(&self.session, cx.now) {
            progress = true;
            let records = self.spool.read(Lane(read.lane), Seq(read.after), read.max).expect("read");
            if records.is_empty() {
                conn.handle_empty_read(read.lane, read.after);
                continue;
            }
            let mut wire: Vec<WireRecord> = records.into_iter().map(into_wire).collect();
            let format = shared::proto::columns::Format::of_version(self.session.version());
            let (batch, _) =
                pack_within_cost(Lane(read.lane), Seq(read.after + 1), &mut wire, None, (1, format), &NoShapes)
                    .expect("pack");
            let (first, last) = (batch.first_seq.0, batch.last_seq.0);
            cx.net.up.push((index, cid, Frame::Batch(Box::new(batch))));
            if let Err(e) = conn.handle_sent(&mut self.session, read.lane, first, last, cx.now) {
                cx.trace.line(format!("{edge}: uplink ends: {e}"));
                self.end_link(index, EndKind::Failed, cx);
                return true;
            }
        }
        progress
    }

    /// This side ends connection `cid`: the next attempt is the dialer's.
    fn end_link(&mut self, index: usize, kind: EndKind, cx: &mut Ctx<'_>) {
        let Some((cid, _)) = self.link.take() else { return };
        self.session.disconnected();
        cx.net.closed.push((index, cid));
        let welcomed = self.session.welcomes() > self.welcomes;
        let next = self.dialer.handle_end(kind, welcomed, cx.rng.unit());
        self.dial_at = Some(cx.now + wait_of(next));
    }
}

/// The batch frames of an edge, for the bridge: what a stream carries.
pub fn batch_of(frame: &Frame) -> Option<&Batch> {
    match frame {
        Frame::Batch(b) => Some(b),
        Frame::Control(_) => None,
    }
}

/// QoS of a granted code.
pub fn qos(bits: u8) -> QoS {
    QoS::from_bits(bits.min(2)).unwrap_or(QoS::AtMostOnce)
}
