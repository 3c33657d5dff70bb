//! The tokio side of the core: one `Broker` behind a mutex that every connection task takes for
//! a moment (never across an await), a `Notify` per connection for its writer, the spool
//! appends and session-store writes the core asks for, and the timer task for wills and
//! session expiry.
//!
//! A publish costs its publisher one lock (route and queue to every subscriber, and take the
//! packets of each subscriber whose socket it can write to itself, `Outlet`); the packets are
//! encoded and written after the lock is released. A subscriber it cannot write to (TLS,
//! WebSocket, a socket busy or full) gets a wake-up and takes its packets under the lock
//! itself; woken from the publisher's task, it usually runs next on the same worker thread
//! (tokio's LIFO slot).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use shared::trace::{KeyValue, Kind as SpanKind, SpanRecord, TraceParent, Tracer};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::core::{Action, Broker, ConnId, IdMap, SpoolRequest, Spooled, WallClock};

/// How often the timer task gives the core the wall clock again, at least.
const WALL_CLOCK_EVERY: Duration = Duration::from_secs(60);
use super::store::SessionStore;
use crate::spool::{AppendError, Durability, SpoolWriter};

/// What a connection's task waits on: its writer for packets to send, its reader (paused while
/// an MQTT 3.1.1 client is past our Receive Maximum) for acknowledgements to have gone out;
/// and its socket, if the task that routes a message to it may write there itself.
#[derive(Debug, Default)]
pub struct Wakers {
    pub writer: Notify,
    pub reader: Notify,
    pub outlet: std::sync::OnceLock<Arc<dyn Outlet>>,
}

/// A connection's socket that the task routing a message to it may write to itself while the
/// connection's writer is idle (plain TCP, `front::direct`): with ten subscribers a PUBLISH
/// would otherwise wake ten writer tasks, each to take the core's lock again for its packets.
/// Whoever holds the socket is the only one taking the connection's packets from the core, so
/// they go out in order.
pub trait Outlet: Send + Sync + std::fmt::Debug {
    /// Takes the socket if no one is writing to it; `false` leaves the packets to the writer.
    /// Called with the core locked: it must not wait.
    fn claim(&self) -> bool;
    /// Writes what it can of `packets` without waiting, keeps the rest for the writer, and
    /// gives the socket back; whether anything is left for the writer.
    fn write_and_release(&self, packets: &[super::codec::Outbound]) -> bool;
}

/// What a routing task writes to another connection's socket at most, per message routed:
/// more goes to that connection's writer.
const DIRECT_BATCH: usize = 16 * 1024;

/// The running broker, shared by the front's connections and the node's own clients.
#[derive(Debug)]
pub struct BrokerHandle {
    core: Mutex<Broker>,
    wakers: Mutex<IdMap<ConnId, Arc<Wakers>>>,
    next_conn: AtomicU64,
    spool: Option<SpoolWriter>,
    store: Option<SessionStore>,
    /// Wakes the timer task when the core's next deadline may have moved earlier.
    timer: Notify,
    /// Spool appends whose [`Routed`] was dropped unrun; the timer task makes them.
    orphans: Arc<Orphans>,
    /// `spool commit` spans of messages with a trace context.
    tracer: Tracer,
    /// The last op the session store committed, for [`BrokerHandle::wait_stored`].
    committed: tokio::sync::watch::Sender<u64>,
}

/// Spool appends the core asked for during one [`BrokerHandle::with`], in order: the caller
/// makes them with [`BrokerHandle::run_spool`], which keeps its client's messages in order and
/// lets a slow spool hold its reader back. Any call on the core may route something (a closing
/// connection's will, a takeover's), so a `Routed` dropped with requests in it hands them to
/// the timer task rather than losing them.
#[must_use = "spool appends are lost unless made: pass this to BrokerHandle::run_spool"]
#[derive(Debug, Default)]
pub struct Routed {
    requests: Vec<SpoolRequest>,
    /// Set only when there are requests: an empty one costs nothing to make or drop.
    orphans: Option<Arc<Orphans>>,
}

impl Routed {}

impl Drop for Routed {
    fn drop(&mut self) {
        if let Some(orphans) = self.orphans.take().filter(|_| !self.requests.is_empty()) {
            lock(&orphans.requests).append(&mut self.requests);
            orphans.notify.notify_one();
        }
    }
}

#[derive(Debug, Default)]
struct Orphans {
    requests: Mutex<Vec<SpoolRequest>>,
    notify: Notify,
}

impl BrokerHandle {
    /// Without a store (tests), every store op counts as committed at once.
    pub fn new(core: Broker, spool: Option<SpoolWriter>, store: Option<SessionStore>) -> Arc<Self> {
        Self::traced(core, spool, store, Tracer::off())
    }

    /// [`BrokerHandle::new`] recording a span for each traced message's spool append.
    pub(crate) fn traced(
        core: Broker,
        spool: Option<SpoolWriter>,
        store: Option<SessionStore>,
        tracer: Tracer,
    ) -> Arc<Self> {
        let handle = Arc::new(Self {
            tracer,
            committed: tokio::sync::watch::Sender::new(0),
            core: Mutex::new(core),
            wakers: Mutex::new(IdMap::default()),
            next_conn: AtomicU64::new(1),
            spool,
            store,
            timer: Notify::new(),
            orphans: Arc::default(),
        });
        if let Some(store) = &handle.store {
            // Weak: the store's thread must not keep the broker alive.
            let weak = Arc::downgrade(&handle);
            store.on_commit(move |op_id| {
                if let Some(handle) = weak.upgrade() {
                    let (_, routed) = handle.with(|b| b.stored(op_id, Instant::now()));
                    drop(routed);
                    handle.committed.send_replace(op_id);
                }
            });
        }
        handle
    }

    /// A new connection's id and what its task waits on.
    pub fn register(&self) -> (ConnId, Arc<Wakers>) {
        let conn = ConnId(self.next_conn.fetch_add(1, Ordering::Relaxed));
        let wakers = Arc::new(Wakers::default());
        lock(&self.wakers).insert(conn, wakers.clone());
        (conn, wakers)
    }

    /// Forgets the connection: the core drops it and fires its will if it went without
    /// DISCONNECT.
    pub(crate) async fn unregister(self: &Arc<Self>, conn: ConnId) {
        lock(&self.wakers).remove(&conn);
        let (_, spool) = self.with(|b| b.closed(conn, Instant::now()));
        self.run_spool(spool).await;
    }

    /// [`BrokerHandle::unregister`] from where nothing can be awaited (the node's own clients,
    /// dropped): whatever the close routes goes through the timer task.
    pub(crate) fn forget(&self, conn: ConnId) {
        lock(&self.wakers).remove(&conn);
        let (_, routed) = self.with(|b| b.closed(conn, Instant::now()));
        drop(routed);
    }

    /// Runs `f` on the core and carries out what it asked for, except the spool appends, which
    /// are returned for the caller to make ([`BrokerHandle::run_spool`]) in order.
    pub fn with<R>(&self, f: impl FnOnce(&mut Broker) -> R) -> (R, Routed) {
        let mut core = lock(&self.core);
        let before = core.poll_timeout();
        let result = f(&mut core);
        let mut wakes = Vec::new();
        let mut resumes = Vec::new();
        let mut spool = Vec::new();
        self.drain(&mut core, &mut wakes, &mut resumes, &mut spool);
        // Connections to wake whose sockets this task can write to now: their packets are
        // taken here (what taking them asks of the store goes with the rest), written below.
        // Their packets, one buffer for all: (wakers, the end of its packets, closing, more).
        let (mut direct, mut packets) = (Vec::new(), Vec::new());
        if !wakes.is_empty() {
            (direct, packets) = (Vec::with_capacity(wakes.len()), Vec::with_capacity(wakes.len()));
            let wakers = lock(&self.wakers);
            let now = Instant::now();
            wakes.retain(|conn| {
                let Some(w) = wakers.get(conn) else { return true };
                let Some(outlet) = w.outlet.get() else { return true };
                if core.is_closing(*conn) || !outlet.claim() {
                    return true;
                }
                let (closing, more) = core.poll_transmit_into(*conn, now, DIRECT_BATCH, &mut packets);
                direct.push((w.clone(), packets.len(), closing, more));
                false
            });
            drop(wakers);
            if !direct.is_empty() {
                self.drain(&mut core, &mut wakes, &mut resumes, &mut spool);
            }
        }
        let after = core.poll_timeout();
        drop(core);
        if after.is_some() && (before.is_none() || after < before) {
            self.timer.notify_one();
        }
        let mut start = 0;
        for (w, end, closing, more) in &direct {
            let outlet = w.outlet.get().expect("claimed through it");
            let mine = &packets[std::mem::replace(&mut start, *end)..*end];
            if outlet.write_and_release(mine) || *more || *closing {
                w.writer.notify_one();
            } else {
                // The reader may be paused waiting for these acknowledgements to go out.
                w.reader.notify_one();
            }
        }
        if !wakes.is_empty() || !resumes.is_empty() {
            let wakers = lock(&self.wakers);
            for conn in wakes {
                if let Some(w) = wakers.get(&conn) {
                    w.writer.notify_one();
                }
            }
            for conn in resumes {
                if let Some(w) = wakers.get(&conn) {
                    w.reader.notify_one();
                }
            }
        }
        let orphans = (!spool.is_empty()).then(|| self.orphans.clone());
        (result, Routed { requests: spool, orphans })
    }

    /// Carries out the core's actions but the spool appends (collected in `spool`) and the
    /// wake-ups (collected for after the lock).
    fn drain(
        &self,
        core: &mut Broker,
        wakes: &mut Vec<ConnId>,
        resumes: &mut Vec<ConnId>,
        spool: &mut Vec<SpoolRequest>,
    ) {
        let mut store = Vec::new();
        loop {
            // Mostly wake-ups (one per subscriber a message reached): one allocation, not a
            // doubling per few subscribers.
            wakes.reserve(core.actions_waiting());
            while let Some(action) = core.poll_action() {
                match action {
                    Action::Wake(conn) => wakes.push(conn),
                    Action::Resume(conn) => resumes.push(conn),
                    Action::Spool(req) => spool.push(*req),
                    Action::ForgetReceipts(keys) => {
                        if let Some(s) = &self.spool {
                            s.forget_receipts(keys);
                        }
                    }
                    Action::Store { op_id, op } => store.push((op_id, op)),
                }
            }
            match (&self.store, store.last()) {
                // Sent under the core's lock, so the store sees ops in the order they were made,
                // and in one piece (`SessionStore::send`).
                (Some(s), Some(_)) => s.send(std::mem::take(&mut store)),
                (None, Some(&(last, _))) => {
                    store.clear();
                    core.stored(last, Instant::now());
                    continue;
                }
                (_, None) => {}
            }
            break;
        }
    }

    /// Counts a client the front disconnected for accepting no data for
    /// `broker.slow_client_timeout` (`edge_mqtt_disconnects_total{reason="slow_client"}`).
    pub(crate) fn count_slow_client(&self) {
        self.count_disconnect("slow_client");
    }

    /// Counts a client the front disconnected for `reason`
    /// (`edge_mqtt_disconnects_total{reason}`).
    pub(crate) fn count_disconnect(&self, reason: &'static str) {
        lock(&self.core).count_disconnect(reason);
    }

    /// Waits until the session store committed op `op_id` (at once without a store: tests).
    pub(crate) async fn wait_stored(&self, op_id: u64) {
        if self.store.is_none() {
            return;
        }
        let mut rx = self.committed.subscribe();
        // The sender lives as long as this handle.
        let _ = rx.wait_for(|done| *done >= op_id).await;
    }

    /// The store op the session store has committed through (every op, without a store).
    pub(crate) fn stored_through(&self) -> u64 {
        if self.store.is_none() {
            return u64::MAX;
        }
        *self.committed.borrow()
    }

    /// Waits while the session store is far behind (`store::MAX_PENDING_OPS`): a client's
    /// reader calls it between reads, so a disk slower than the clients holds them back.
    pub(crate) async fn store_room(&self) {
        if let Some(store) = &self.store {
            store.room().await;
        }
    }

    /// Appends what the core routed to the spool, in order, and reports each outcome back. A
    /// `normal` append is answered once the spool has it; a `full` one once committed, on a
    /// task of its own so the caller goes on reading its client meanwhile.
    pub(crate) async fn run_spool(self: &Arc<Self>, mut routed: Routed) {
        let requests = std::mem::take(&mut routed.requests);
        for req in requests {
            let Some(spool) = &self.spool else {
                self.report(req.ticket, Spooled::Failed);
                continue;
            };
            let ticket = req.ticket;
            let traced = self.tracer.is_on().then(|| SpoolSpan::of(&self.tracer, &req)).flatten();
            let (outcome, seq) = match spool.append(req.lane, req.message, req.durability).await {
                Ok(None) => (Spooled::Accepted, None),
                Ok(Some(done)) => {
                    let this = self.clone();
                    tokio::spawn(async move {
                        let (outcome, seq) = match done.await {
                            Ok(Ok(seq)) => (Spooled::Accepted, Some(seq.0)),
                            Ok(Err(AppendError::Refused)) => (Spooled::Refused, None),
                            Ok(Err(_)) | Err(_) => (Spooled::Failed, None),
                        };
                        this.report(ticket, outcome);
                        if let Some(span) = traced {
                            span.record(&this.tracer, outcome, seq);
                        }
                    });
                    continue;
                }
                Err(AppendError::Refused) => (Spooled::Refused, None),
                Err(_) => (Spooled::Failed, None),
            };
            self.report(ticket, outcome);
            if let Some(span) = traced {
                span.record(&self.tracer, outcome, seq);
            }
        }
    }

    fn report(&self, ticket: u64, outcome: Spooled) {
        // A held message delivered now may close a slow subscriber, whose will may route: the
        // dropped `Routed` hands that to the timer task.
        let (_, routed) = self.with(|b| b.spooled(ticket, outcome, Instant::now()));
        drop(routed);
    }

    /// Publishes delayed wills and ends expired sessions on time, and makes the spool appends
    /// no caller could ([`Routed`]), until `shutdown`; then makes those left.
    pub(crate) async fn run_timers(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            // The core's wall clock follows the system's at least once a minute.
            let (next, _) = self.with(|b| {
                b.set_wall_clock(WallClock::read());
                b.poll_timeout()
            });
            let wait =
                next.map_or(WALL_CLOCK_EVERY, |at| at.saturating_duration_since(Instant::now()).min(WALL_CLOCK_EVERY));
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.run_orphans().await;
                    return;
                }
                _ = self.orphans.notify.notified() => {
                    self.run_orphans().await;
                    continue;
                }
                _ = self.timer.notified() => continue,
                _ = tokio::time::sleep(wait) => {}
            }
            let (_, spool) = self.with(|b| b.handle_timeout(Instant::now()));
            self.run_spool(spool).await;
        }
    }

    /// Makes the spool appends of dropped [`Routed`]s now (the timer task does so as they come).
    pub(crate) async fn run_orphans(self: &Arc<Self>) {
        let requests = std::mem::take(&mut *lock(&self.orphans.requests));
        if !requests.is_empty() {
            self.run_spool(Routed { requests, orphans: None }).await;
        }
    }
}

/// A traced message's spool append: from the append to the spool having it (`normal`) or
/// having committed it (`full`), under the publisher's span.
struct SpoolSpan {
    parent: TraceParent,
    class: String,
    lane: u8,
    durability: Durability,
    start: SystemTime,
}

impl SpoolSpan {
    fn of(tracer: &Tracer, req: &SpoolRequest) -> Option<Self> {
        let parent = tracer.admitted(shared::trace::Stage::Spool, &req.message.properties.user)?;
        let (class, lane, durability) = (req.message.class.clone(), req.lane.0, req.durability);
        Some(Self { parent, class, lane, durability, start: SystemTime::now() })
    }

    fn record(self, tracer: &Tracer, outcome: Spooled, seq: Option<u64>) {
        let mut attributes = vec![
            KeyValue::new("edge.class", self.class),
            KeyValue::new("edge.lane", i64::from(self.lane)),
            KeyValue::new("edge.durability", if self.durability == Durability::Full { "full" } else { "normal" }),
            KeyValue::new("edge.outcome", format!("{outcome:?}").to_lowercase()),
        ];
        if let Some(seq) = seq {
            attributes.push(KeyValue::new("edge.seq", i64::try_from(seq).unwrap_or(i64::MAX)));
        }
        tracer.record(SpanRecord {
            name: "spool commit",
            kind: SpanKind::Internal,
            parent: &self.parent,
            start: self.start,
            end: SystemTime::now(),
            attributes,
            id: None,
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the core's lock is a bug in the core; the state it left is still
    // the best there is for the other connections.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::codec::{Connect, PublishProps, QoS, Version, Will};
    use crate::broker::core::{ConnectRequest, Identity, Limits};
    use crate::broker::metrics::BrokerMetrics;
    use crate::route::{Class, Classes, Governance, Route};
    use crate::spool::{Durability, Lane, Seq, Spool, SqliteStorage, Storage, WriterMetrics};

    /// A will a close routes to the spool reaches it even when the caller that closed the
    /// connection drops what the core routed (here `forget`, which cannot await): the timer
    /// task appends it.
    #[tokio::test]
    async fn a_central_will_routed_where_nothing_awaits_still_reaches_the_spool() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = SqliteStorage::open(&dir.path().join("spool.db")).expect("open");
        let spool = Spool::new(Box::new(storage) as Box<dyn Storage + Send>);
        let metrics = Arc::new(WriterMetrics::new(&mut Default::default()));
        let writer = SpoolWriter::start(spool, Duration::from_millis(5), 64, metrics).expect("writer");
        let classes = Classes::new(vec![Class::new(
            "status".into(),
            vec![shared::topic::TopicFilter::new("status/#").expect("filter")],
            Route::Central,
            Governance::None,
            Lane(1),
            Durability::Normal,
            None,
        )]);
        let metrics = BrokerMetrics::new(&mut Default::default());
        let core = Broker::new(Limits::default(), Arc::new(classes), metrics, WallClock::read());
        let handle = BrokerHandle::new(core, Some(writer.clone()), None);
        let shutdown = CancellationToken::new();
        let timers = tokio::spawn(handle.clone().run_timers(shutdown.clone()));

        let (conn, _) = handle.register();
        let connect = Connect {
            version: Version::V5,
            client_id: "dying".into(),
            clean_start: true,
            keep_alive: 0,
            session_expiry: 0,
            receive_maximum: 10,
            max_packet_size: None,
            topic_alias_maximum: 0,
            request_problem_info: true,
            auth_method: None,
            will: Some(Will {
                topic: "status/dying".into(),
                payload: bytes::Bytes::from_static(b"gone"),
                qos: QoS::AtLeastOnce,
                retain: false,
                delay: 0,
                expiry: None,
                props: PublishProps::default(),
            }),
            username: None,
            password: None,
        };
        let identity = Identity { owner: "user:u".into(), internal: false, rules: None };
        let (admitted, routed) = handle.with(|b| b.connect(ConnectRequest { conn, connect, identity }, Instant::now()));
        admitted.expect("admitted");
        handle.run_spool(routed).await;
        handle.forget(conn);

        let deadline = Instant::now() + Duration::from_secs(10);
        let records = loop {
            let records = writer.read(Lane(1), Seq(0), 10).await.expect("read");
            if !records.is_empty() || Instant::now() > deadline {
                break records;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(records.len(), 1, "the will is in the spool");
        assert_eq!(records[0].message().map(|m| m.topic.as_str()), Some("status/dying"));
        shutdown.cancel();
        timers.await.expect("timers");
        writer.shutdown().await;
    }
}
