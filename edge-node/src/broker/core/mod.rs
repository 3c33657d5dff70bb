//! The broker core: every session, every connection's protocol state, the subscriptions and
//! the retained store, as one deterministic state machine with no sockets and no clock.
//!
//! The glue feeds it (`connect`, `handle`, `closed`, `spooled`, `handle_timeout`, each with
//! `now`; the wall clock as a [`WallClock`] it reads `now` against, refreshed by the glue) and
//! drains it: `poll_transmit` gives a connection's next packets, `poll_action` what
//! the glue must do for it (wake a connection's writer, append a message to the spool, store a
//! session). Tests drive it the same way, without sockets and without sleeping.
//!
//! What it keeps, per piece:
//! - a **session** per client id ([`session::Session`]): subscriptions, the queue of messages
//!   for it, QoS 1 and 2 messages in flight to it, QoS 2 packet ids it received, its expiry and
//!   the identity that owns it. It outlives its connection when its expiry is above 0.
//! - a **connection** per network connection ([`session::Conn`]): the negotiated limits, topic
//!   aliases, keep-alive, the will, the order its publishes are acknowledged in.
//! - the **router** ([`router::Router`]) and the **retained store** ([`retained::Retained`]).
//!
//! What of this a restart must see (durable sessions' state, the retained store) goes to the
//! session store as numbered ops, and acknowledgements that promise it wait for their commit
//! (`durable.rs`).
//!
//! Every message that enters (a client's PUBLISH, a will, an in-process client's publish) goes
//! through the same ingest: ACL, topic class and route, the spool for the cloud, local delivery.

mod backpressure;
mod connect;
mod deliver;
mod downlink;
pub mod durable;
mod inbound;
pub(crate) mod retained;
mod revoke;
pub mod router;
pub mod session;

#[cfg(test)]
pub(crate) mod tests;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::Rules;
use crate::route::Classes;
use crate::spool::{Durability, Lane};

use self::retained::Retained;
use self::router::Router;
use self::session::{Conn, Session};
use super::codec::Outbound;
use super::metrics::BrokerMetrics;

pub use self::connect::{ConnectRequest, Identity};
pub use self::durable::{StoreOp, StoredDelivery, StoredState, StoredWill};
pub use self::inbound::Refused;
pub use self::router::SubOptions;
pub use self::session::Sid;

/// One network connection, for as long as it lives; never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// A map keyed by an id the broker hands out itself ([`ConnId`], spool tickets), so no client
/// can choose keys that collide: FxHash, one multiply, where SipHash was 14 % of the
/// instructions the local path spends per delivered message (callgrind, paho fan-out).
pub type IdMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// Index of a session in the core's table.
pub(crate) type SessionKey = u32;

/// Whether a client id belongs to the identity that made its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientIds {
    /// Another identity presenting the client id is refused (CONNACK 0x85 / 0x02).
    #[default]
    PerIdentity,
    /// Any identity may take over any client id's session (MQTT's own rule).
    Shared,
}

/// What happens when a subscriber's queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlowSubscriber {
    /// Drop the oldest QoS 0 message queued to make room; with none left to drop, a QoS 0
    /// message is dropped and a QoS 1 or 2 one disconnects the subscriber (DISCONNECT 0x97).
    /// Its session, if it has one, keeps what was queued.
    #[default]
    DropQos0ThenDisconnect,
    /// Never disconnect: the new message is dropped, whatever its QoS.
    DropNewest,
}

/// The core's bounds; each is a `[broker]` key.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_sessions: usize,
    pub max_subscriptions: usize,
    pub max_queued_messages: usize,
    pub max_queued_bytes: usize,
    /// Bytes queued or in flight over all sessions.
    pub max_queued_bytes_total: usize,
    /// QoS 1 and 2 messages in flight to one client, at most (and at most its Receive Maximum).
    pub max_inflight: u16,
    /// Announced Receive Maximum: QoS 1 and 2 publishes a client may have unacknowledged.
    pub receive_maximum: u16,
    pub topic_alias_maximum: u16,
    pub max_topic_length: usize,
    pub max_retained_messages: usize,
    pub max_retained_bytes: usize,
    /// User properties a PUBLISH or a will may carry.
    pub max_user_properties: usize,
    /// Announced Maximum Packet Size.
    pub max_packet_size: u32,
    /// A longer keep-alive (or none) is answered with this Server Keep Alive, seconds.
    pub max_keep_alive: Option<u16>,
    /// Session Expiry Intervals above this are cut to it, seconds.
    pub max_session_expiry: u32,
    pub client_ids: ClientIds,
    pub slow_subscriber: SlowSubscriber,
    /// Queued messages of a connected subscriber past which its publishers are held
    /// (`backpressure.rs`); 0: never.
    pub backpressure_queue: usize,
    /// Longest one hold lasts.
    pub backpressure_wait: Duration,
    pub max_client_id_length: usize,
    /// Control packets (acks, SUBACKs) a client may leave unread before it is disconnected.
    pub max_control_queue: usize,
    /// Topics only the node's own clients publish and receive (the SLO probe's).
    pub internal_topics: Vec<String>,
    /// Topic filters only the node's own clients publish to, whatever the ACL says (its
    /// namespace: [`RESERVED_TOPICS`], the probe's topic, the model announcements); clients
    /// subscribe to them as their ACL allows.
    pub reserved_topics: Vec<String>,
    /// Sessions one identity may hold that outlive their connection (Session Expiry above 0);
    /// a new one past it is refused with 0x97.
    pub max_stored_sessions_per_identity: usize,
    /// Distinct filters one SUBSCRIBE may carry; the rest get 0x97.
    pub max_subscribe_filters: usize,
}

/// The node's own namespace: the probe and whatever else the node publishes for itself.
pub(crate) const RESERVED_TOPICS: &str = "_edge/#";

/// Client ids the node's own clients take (`_edge-probe-<node>`, `_edge-models-<node>`); a
/// client's CONNECT with one is refused, so no persistent session can squat them.
pub(crate) const INTERNAL_CLIENT_ID_PREFIX: &str = "_edge-";

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_sessions: 10_000,
            max_subscriptions: 100,
            max_queued_messages: 10_000,
            max_queued_bytes: 16 << 20,
            max_queued_bytes_total: 64 << 20,
            max_inflight: 100,
            receive_maximum: 1024,
            topic_alias_maximum: 16,
            max_topic_length: 1024,
            max_retained_messages: 10_000,
            max_retained_bytes: 64 << 20,
            max_user_properties: 64,
            max_packet_size: 1 << 20,
            max_keep_alive: None,
            max_session_expiry: 7 * 24 * 3600,
            client_ids: ClientIds::PerIdentity,
            slow_subscriber: SlowSubscriber::DropQos0ThenDisconnect,
            backpressure_queue: 100,
            backpressure_wait: Duration::from_millis(500),
            max_client_id_length: 256,
            max_control_queue: 4096,
            internal_topics: Vec::new(),
            reserved_topics: vec![RESERVED_TOPICS.to_owned()],
            max_stored_sessions_per_identity: 256,
            max_subscribe_filters: 100,
        }
    }
}

/// A durable session's record in the store: who it is, its subscriptions and expiry (its queue,
/// messages in flight, QoS 2 ids and will are stored beside it, see `durable.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub sid: Sid,
    pub client_id: String,
    pub owner: String,
    /// Seconds.
    pub expiry: u32,
    pub subscriptions: Vec<(String, SubOptions)>,
    /// Wall clock, ms since the Unix epoch, when it last lost its connection; `None` while
    /// connected.
    pub disconnected_ms: Option<u64>,
}

/// A message the core hands the spool; the glue appends it and reports back with
/// [`Broker::spooled`].
#[derive(Debug)]
pub struct SpoolRequest {
    pub ticket: u64,
    pub lane: Lane,
    pub durability: Durability,
    pub message: crate::spool::Message,
}

/// How an append went, as the glue reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spooled {
    /// In the spool (for `full` durability: committed).
    Accepted,
    /// The spool had no room (MQTT 5: 0x97).
    Refused,
    /// The commit failed or the spool stopped (MQTT 5: 0x80).
    Failed,
}

/// Work the core leaves for the glue.
#[derive(Debug)]
pub enum Action {
    /// The connection has packets to send (or is closing): its writer should `poll_transmit`.
    Wake(ConnId),
    /// A held publisher may be read again (`Broker::held_until`).
    Resume(ConnId),
    Spool(Box<SpoolRequest>),
    /// The spool may forget these QoS 2 receipts: their releases are committed.
    ForgetReceipts(Vec<u64>),
    /// Write `op` to the session store, after every op of a lower `op_id`, and report the commit
    /// with [`Broker::stored`].
    Store {
        op_id: u64,
        op: StoreOp,
    },
}

/// A message waiting for the spool before it may be acknowledged or delivered locally.
#[derive(Debug)]
struct PendingSpool {
    /// The connection it came on and those whose resend of it waits for the same outcome (a
    /// QoS 2 resend after a reconnect): each has an `AckSlot::Waiting` for the ticket.
    conns: Vec<ConnId>,
    /// A QoS 2 publish: the session and packet id it holds in `qos2_in` until the outcome.
    qos2: Option<(SessionKey, u16)>,
    /// Delivered locally once spooled (`full` durability with a local route).
    deliver: Option<Arc<crate::broker::message::Message>>,
    /// It is to be stored as retained when delivered.
    retain: bool,
}

/// The wall clock as the glue read it: at `at` (monotonic) it was `ms` since the Unix epoch. The
/// core reads no clock: the wall times it keeps (a disconnect, a stored will's due time, a
/// spool record's expiry) and compares (a restore) come from the `now` it is given, through
/// this, so a test fixes both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WallClock {
    pub at: Instant,
    pub ms: u64,
}

impl WallClock {
    /// The clocks now: for the glue, never the core.
    pub fn read() -> Self {
        Self { at: Instant::now(), ms: shared::units::now_ms() }
    }

    /// Milliseconds since the Unix epoch at `now`.
    pub(crate) fn ms_at(&self, now: Instant) -> u64 {
        if now >= self.at {
            self.ms.saturating_add(now.duration_since(self.at).as_millis() as u64)
        } else {
            self.ms.saturating_sub(self.at.duration_since(now).as_millis() as u64)
        }
    }
}

/// The broker core. See the module doc.
#[derive(Debug)]
pub struct Broker {
    limits: Limits,
    classes: Arc<Classes>,
    metrics: BrokerMetrics,
    sessions: Vec<Option<Session>>,
    free: Vec<SessionKey>,
    by_client: HashMap<Arc<str>, SessionKey>,
    conns: IdMap<ConnId, Conn>,
    router: Router,
    retained: Retained,
    actions: VecDeque<Action>,
    /// Connections already told to wake since the glue last drained the actions.
    woken: BTreeSet<ConnId>,
    pending: IdMap<u64, PendingSpool>,
    next_ticket: u64,
    /// Offline sessions by when they expire.
    expiries: BTreeSet<(Instant, SessionKey)>,
    /// Delayed wills by when they are due, with the session they belong to.
    wills: BTreeSet<(Instant, SessionKey)>,
    /// Client ids assigned to clients that sent none.
    next_assigned: u64,
    /// Bytes of messages queued or in flight over all sessions.
    held_total: usize,
    /// Scratch for matching.
    matches: Vec<router::Match>,
    /// The number of the last session-store op handed out.
    last_op: u64,
    /// The highest op number the store reported committed.
    durable: u64,
    /// Connections waiting for the store to commit an op: (its number, connection).
    store_waiters: BTreeSet<(u64, ConnId)>,
    /// The last store id given to a session.
    next_sid: Sid,
    /// The last QoS 2 receipt given out.
    next_receipt: u64,
    /// Spool appends waiting for their message's receipt to be committed: (op, request).
    spool_gated: VecDeque<(u64, Box<SpoolRequest>)>,
    /// Receipts released, the spool to forget once their op is committed: (op, receipt).
    receipts_released: Vec<(u64, u64)>,
    /// What the cloud's sink stores of one record: a cloud-bound publish it could not store
    /// whole is refused.
    sink: Option<Arc<crate::spool::SinkFit>>,
    /// `[[schema]]` bindings and the staged versions they check publishes against.
    schemas: Option<Arc<crate::schema::Validator>>,
    /// A session the message being delivered left behind by `backpressure_queue`
    /// (`backpressure.rs`).
    congested: Option<SessionKey>,
    wall: WallClock,
}

impl Broker {
    pub fn new(limits: Limits, classes: Arc<Classes>, mut metrics: BrokerMetrics, wall: WallClock) -> Self {
        metrics.resolve_classes(&classes);
        let retained = Retained::new(limits.max_retained_messages, limits.max_retained_bytes);
        Self {
            limits,
            classes,
            metrics,
            sessions: Vec::new(),
            free: Vec::new(),
            by_client: HashMap::new(),
            conns: IdMap::default(),
            router: Router::default(),
            retained,
            actions: VecDeque::new(),
            woken: BTreeSet::new(),
            pending: IdMap::default(),
            next_ticket: 1,
            expiries: BTreeSet::new(),
            wills: BTreeSet::new(),
            next_assigned: 0,
            held_total: 0,
            matches: Vec::new(),
            last_op: 0,
            durable: 0,
            store_waiters: BTreeSet::new(),
            next_sid: 0,
            next_receipt: 0,
            spool_gated: VecDeque::new(),
            receipts_released: Vec::new(),
            sink: None,
            schemas: None,
            congested: None,
            wall,
        }
    }

    /// Refuses cloud-bound publishes the cloud's sink could not store whole, as `sink` says.
    pub(crate) fn with_sink_limits(mut self, sink: Arc<crate::spool::SinkFit>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Checks publishes to bound topics before they are taken (`schema`).
    pub fn with_schemas(mut self, schemas: Arc<crate::schema::Validator>) -> Self {
        self.schemas = (!schemas.is_empty()).then_some(schemas);
        self
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// How many actions wait for [`Broker::poll_action`], for the glue to size its buffers once.
    pub fn actions_waiting(&self) -> usize {
        self.actions.len()
    }

    /// The next thing the glue must do, oldest first.
    pub fn poll_action(&mut self) -> Option<Action> {
        let action = self.actions.pop_front();
        if let Some(Action::Wake(conn)) = &action {
            self.woken.remove(conn);
        }
        action
    }

    /// When [`Broker::handle_timeout`] next has work: a delayed will or a session expiry.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let will = self.wills.first().map(|(at, _)| *at);
        let expiry = self.expiries.first().map(|(at, _)| *at);
        will.into_iter().chain(expiry).min()
    }

    /// Publishes delayed wills that are due and ends sessions whose expiry passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(at, key)) = self.wills.first() {
            if at > now {
                break;
            }
            self.wills.pop_first();
            let will = self.session_mut(key).and_then(|s| s.pending_will.take_if(|w| w.due == at));
            if let Some(will) = will {
                self.store_will(key, now);
                self.publish_will(will, now);
            }
        }
        while let Some(&(at, key)) = self.expiries.first() {
            if at > now {
                break;
            }
            self.expiries.pop_first();
            if self.session(key).is_some_and(|s| s.conn.is_none() && s.expires_at == Some(at)) {
                self.end_session(key, now);
            }
        }
    }

    /// When the connection's keep-alive runs out ([MQTT-3.1.2-22]: 1.5 times Keep Alive
    /// without a packet); `None` with keep-alive off or for an unknown connection.
    pub(crate) fn keep_alive_deadline(&self, conn: ConnId) -> Option<Instant> {
        let c = self.conns.get(&conn)?;
        (c.keep_alive > 0 && !c.closing).then(|| c.last_seen + Duration::from_millis(u64::from(c.keep_alive) * 1500))
    }

    /// Closes the connection if its keep-alive ran out by `now` (MQTT 5: DISCONNECT 0x8D).
    pub(crate) fn check_keep_alive(&mut self, conn: ConnId, now: Instant) {
        if self.keep_alive_deadline(conn).is_some_and(|d| d <= now) {
            self.metrics.disconnect("keep_alive_timeout");
            self.close(conn, Some(super::codec::reason::KEEP_ALIVE_TIMEOUT), now);
        }
    }

    /// Whether the connection may send more publishes now: below our Receive Maximum of
    /// unacknowledged ones. The glue stops reading an MQTT 3.1.1 client while not.
    pub fn wants_input(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(|c| c.unacked_in < self.limits.receive_maximum)
    }

    /// Closes the connection for a reason of the server's own (MQTT 5 hears `reason`), its will
    /// discarded: a server going down is not its client going away.
    pub(crate) fn disconnect(&mut self, conn: ConnId, reason: u8, now: Instant) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.will = None;
        }
        self.close(conn, Some(reason), now);
    }

    /// The glue read the clocks again: monotonic and wall time drift apart (NTP, a suspend), so
    /// it does so now and then.
    pub(crate) fn set_wall_clock(&mut self, wall: WallClock) {
        self.wall = wall;
    }

    /// Milliseconds since the Unix epoch at `now`.
    pub(crate) fn wall_ms(&self, now: Instant) -> u64 {
        self.wall.ms_at(now)
    }

    /// Counts a disconnect the glue decided (a slow client), by reason.
    pub(crate) fn count_disconnect(&self, reason: &'static str) {
        self.metrics.disconnect(reason);
    }

    /// Whether the connection is gone or closing: its glue stops reading.
    pub(crate) fn is_closing(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_none_or(|c| c.closing)
    }

    /// New ACL rules for a connection after a reload; subscriptions they no longer allow are
    /// removed.
    pub(crate) fn set_rules(&mut self, conn: ConnId, rules: Arc<Rules>, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        c.rules = Some(rules.clone());
        let key = c.session;
        self.prune_subscriptions(key, &rules, now);
        self.drop_unreadable(key, &rules);
    }

    /// Clients connected now and client sessions held, the node's own left out.
    pub(crate) fn client_counts(&self) -> (usize, usize) {
        let connected = self.conns.values().filter(|c| c.rules.is_some()).count();
        (connected, self.sessions.iter().flatten().filter(|s| !s.internal).count())
    }

    /// The subscriptions of the session of `client_id` (filter and granted QoS), in filter
    /// order; `None` without such a session. For inspection: the simulation checks a resumed
    /// session against what its client was acknowledged.
    pub fn session_subscriptions(&self, client_id: &str) -> Option<Vec<(String, u8)>> {
        let key = *self.by_client.get(client_id)?;
        let mut subs: Vec<(String, u8)> =
            self.session(key)?.subs.iter().map(|(f, o)| (f.clone(), o.qos as u8)).collect();
        subs.sort();
        Some(subs)
    }

    /// Sessions held, connected or not.
    #[cfg(test)]
    pub(crate) fn session_count(&self) -> usize {
        self.by_client.len()
    }

    /// Subscriptions held over all sessions.
    pub(crate) fn subscription_count(&self) -> usize {
        self.router.len()
    }

    pub(crate) fn retained_count(&self) -> usize {
        self.retained.len()
    }

    fn session(&self, key: SessionKey) -> Option<&Session> {
        self.sessions.get(key as usize).and_then(Option::as_ref)
    }

    fn session_mut(&mut self, key: SessionKey) -> Option<&mut Session> {
        self.sessions.get_mut(key as usize).and_then(Option::as_mut)
    }

    fn wake(&mut self, conn: ConnId) {
        if self.woken.insert(conn) {
            self.actions.push_back(Action::Wake(conn));
        }
    }

    /// Queues a control packet (an ack, a SUBACK, a DISCONNECT) for the connection; a client
    /// that leaves too many unread is cut off.
    fn control(&mut self, conn: ConnId, packet: Outbound, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if c.closing {
            return;
        }
        c.control.push_back(packet);
        let over = c.control.len() > self.limits.max_control_queue;
        self.wake(conn);
        if over {
            self.metrics.disconnect("control_queue_full");
            self.close(conn, Some(super::codec::reason::QUOTA_EXCEEDED), now);
        }
    }

    /// Ends the connection: a DISCONNECT with `reason` goes first (MQTT 5 only), nothing else
    /// does. The session is detached at once: it gets no more deliveries on this connection,
    /// and its will is handled as for a lost connection unless the client disconnected
    /// normally.
    fn close(&mut self, conn: ConnId, reason: Option<u8>, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if c.closing {
            return;
        }
        c.control.clear();
        if let (Some(reason), super::codec::Version::V5) = (reason, c.version) {
            c.control.push_back(Outbound::Disconnect { reason });
        }
        c.closing = true;
        self.wake(conn);
        self.detach(conn, now);
    }

    /// Stores a durable session's record; a session that stopped being durable (resumed with
    /// expiry 0) is forgotten by the store.
    fn persist(&mut self, key: SessionKey) {
        let Some(s) = self.session_mut(key) else { return };
        if s.internal {
            return;
        }
        if s.expiry == 0 {
            return self.store_forget(key);
        }
        s.persisted = true;
        let record = s.record();
        let op = self.store(StoreOp::Session(record));
        if let Some(s) = self.session_mut(key) {
            s.record_op = op;
        }
    }

    /// Messages queued (not in flight) for the session of `conn`.
    #[cfg(test)]
    pub(crate) fn session_queue_len(&self, conn: ConnId) -> usize {
        let key = self.conns.get(&conn).map(|c| c.session);
        key.and_then(|k| self.session(k)).map_or(0, |s| s.queue.len())
    }

    /// The byte accounting of the queue bounds, recomputed: every session's held bytes are its
    /// queued messages and its held messages in flight, and the total is their sum.
    #[cfg(test)]
    pub(crate) fn check_accounting(&self) -> Result<(), String> {
        let mut total = 0;
        for s in self.sessions.iter().flatten() {
            let held = s.queue.iter().map(|d| d.weight()).sum::<usize>()
                + s.inflight.iter().filter(|i| i.held).map(|i| i.delivery.weight()).sum::<usize>();
            if held != s.held_bytes {
                return Err(format!("session {} holds {held} bytes, counted {}", s.client_id, s.held_bytes));
            }
            total += held;
        }
        if total != self.held_total {
            return Err(format!("sessions hold {total} bytes, counted {}", self.held_total));
        }
        Ok(())
    }

    /// A message a session held (queued or in flight) left it.
    fn release(&mut self, key: SessionKey, weight: usize) {
        if let Some(s) = self.session_mut(key) {
            s.held_bytes = s.held_bytes.saturating_sub(weight);
        }
        self.held_total = self.held_total.saturating_sub(weight);
    }

    fn next_ticket(&mut self) -> u64 {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }
}
