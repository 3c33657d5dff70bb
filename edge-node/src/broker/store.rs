//! The session store: what the broker core must find again after a restart, clean or not
//! (`core/durable.rs` says what and when): durable sessions with their queued and in-flight
//! messages, QoS 2 packet ids received, pending delayed wills, and the retained messages. One
//! SQLite file (`broker.session_store`, `sessions.db` beside the spool's by default), WAL with
//! `synchronous=NORMAL`: a commit survives the process dying at any point, a power cut may take
//! the last ones.
//!
//! Written by one thread of its own, in group commits: once ops come it waits
//! [`COMMIT_INTERVAL`] for more (ops with the downlink's mark, which everyone waits on, only
//! until nothing more is queued), commits them in one transaction and reports the last op's
//! number back
//! ([`SessionStore::on_commit`]), which releases the acknowledgements that waited for them. An
//! op that is undone within the same batch (a message queued and acknowledged before the commit,
//! the common case for a subscriber that keeps up, which acknowledges within the interval)
//! costs no write at all. The thread runs below the local path's priority, as the spool's
//! writer does (`spool::sched`). Ops waiting for the
//! thread are bounded: past [`MAX_PENDING_OPS`] (or [`MAX_PENDING_BYTES`] of session records)
//! the connections' readers wait
//! ([`SessionStore::room`]), as they do for a full spool, so a disk slower than the clients (a
//! flood of retained QoS 0 messages, whose publishers wait for nothing) holds the clients back
//! instead of filling memory.
//!
//! On disk (schema version 2): `messages` holds each message body once, however many sessions
//! it is queued for (and if it is retained or a will); `deliveries (sid, ord)` a session's
//! queue in order, with the packet id it went out with and whether its PUBREC came; `received
//! (sid, pkid)`, `wills (sid)`, `retained (topic)`; `sessions (sid)` the record. The writer
//! counts, in memory, what refers to each message row, and deletes a row with its last
//! reference. Version 1 (before this file kept more than sessions) had `sessions` keyed by
//! client id and nothing else: it is migrated in place at open.
//!
//! A file SQLite cannot read as a database (not one, or corrupt) is moved aside
//! (`<name>.corrupt-<ms>`) and started afresh: its sessions are gone, and their clients hear it
//! (CONNACK session present 0). Any other failure to open (a lock, permissions, a full disk) is
//! an error naming it: the node does not start rather than forget acknowledged messages.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::codec::{PublishProps, QoS};
use super::core::{Sid, StoreOp, StoredDelivery, StoredState, StoredWill, SubOptions};
use super::message::Message;
use super::metrics::BrokerMetrics;
use crate::broker::core::SessionRecord;

mod backlog;

pub use backlog::{Backlog, MAX_PENDING_BYTES, MAX_PENDING_OPS, StoreHealth, backlog_bytes, within_bounds};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("session store {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("session store {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

const SCHEMA_VERSION: i64 = 2;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions (
    sid INTEGER PRIMARY KEY,
    client_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    expiry INTEGER NOT NULL,
    disconnected_ms INTEGER,
    subscriptions TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    expires_ms INTEGER,
    origin TEXT,
    payload_format INTEGER,
    content_type TEXT,
    response_topic TEXT,
    correlation_data BLOB,
    user_properties TEXT
);
CREATE TABLE IF NOT EXISTS deliveries (
    sid INTEGER NOT NULL,
    ord INTEGER NOT NULL,
    msg INTEGER NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    sub_ids TEXT,
    pkid INTEGER,
    released INTEGER NOT NULL,
    backlog INTEGER NOT NULL,
    PRIMARY KEY (sid, ord)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS received (sid INTEGER NOT NULL, pkid INTEGER NOT NULL, PRIMARY KEY (sid, pkid)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS wills (sid INTEGER PRIMARY KEY, msg INTEGER NOT NULL, expiry INTEGER, due_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS retained (topic TEXT PRIMARY KEY, msg INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS marks (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
";

/// How long an open waits for a lock another process holds (someone's `sqlite3` on the file)
/// before the node refuses to start, naming it.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// How long the thread gathers ops after the first before it commits: what a durable-bound
/// publish's acknowledgement waits at most besides the commit, and long enough for a subscriber
/// that keeps up to acknowledge what was queued for it, so the pair cancels out unwritten.
pub const COMMIT_INTERVAL: Duration = Duration::from_millis(5);

/// Whether `ops` commit as soon as nothing more waits for the thread, not after the interval:
/// those with a mark (the downlink's messages and position, `core::downlink`). Nothing waits
/// on them to be undone, and everyone waits on their commit: the edge's subscribers get a
/// downlink message, and the cloud its ack, only then (5 ms of its latency at any rate).
fn urgent(ops: &[(u64, StoreOp)]) -> bool {
    ops.iter().any(|(_, op)| matches!(op, StoreOp::Mark { .. }))
}

/// Most ops in one transaction: a commit a burst made large still ends soon.
const MAX_BATCH: usize = 16_384;

enum Msg {
    /// Ops that commit together or not at all (see [`SessionStore::send`]), when sent, what
    /// they hold ([`backlog_bytes`]), and whether they commit without waiting the interval out
    /// ([`urgent`]).
    Ops(Vec<(u64, StoreOp)>, Instant, usize, bool),
    /// Answered once everything sent before it is committed (or failed to be).
    Flush(mpsc::Sender<()>),
    /// [`Msg::Flush`], then the store is marked closed cleanly: the process is about to exit.
    Close(mpsc::Sender<()>),
}

type Listener = Box<dyn Fn(u64) + Send + Sync>;

/// A handle to the store's writer thread.
#[derive(Clone)]
pub struct SessionStore {
    tx: mpsc::Sender<Msg>,
    listener: Arc<OnceLock<Listener>>,
    backlog: Arc<Backlog>,
}

impl std::fmt::Debug for SessionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionStore").finish_non_exhaustive()
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredSub {
    filter: String,
    qos: u8,
    nl: bool,
    rap: bool,
    rh: u8,
    id: Option<u32>,
}

impl SessionStore {
    /// Opens (or creates, or migrates) the store and returns what it holds. See the module doc
    /// for what is moved aside and what refuses to open.
    pub fn open(path: &Path, metrics: BrokerMetrics) -> Result<(SessionStore, StoredState), StoreError> {
        let sqlite = |source| StoreError::Sqlite { path: path.to_owned(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Io { path: dir.to_owned(), source })?;
        }
        let (writer, state) = match Writer::open(path) {
            Ok(ok) => ok,
            Err(e) if is_damaged(&e) => {
                let aside = move_aside(path)?;
                tracing::error!(path = %path.display(), error = %e, aside = %aside.display(), "session store unreadable: moved aside, its sessions are lost");
                Writer::open(path).map_err(sqlite)?
            }
            Err(e) => return Err(sqlite(e)),
        };
        let (tx, rx) = mpsc::channel();
        let listener: Arc<OnceLock<Listener>> = Arc::default();
        let heard = listener.clone();
        let backlog = Arc::new(Backlog::new(metrics.store_pending.clone()));
        let kept = backlog.clone();
        let shown = path.to_owned();
        std::thread::Builder::new()
            .name("session-store".into())
            .spawn(move || writer.run(rx, &heard, &kept, &metrics, &shown))
            .map_err(|source| StoreError::Io { path: path.to_owned(), source })?;
        Ok((SessionStore { tx, listener, backlog }, state))
    }

    /// Called with the number of the last op committed, after each commit (set once).
    pub(crate) fn on_commit(&self, f: impl Fn(u64) + Send + Sync + 'static) {
        let _ = self.listener.set(Box::new(f));
    }

    /// Hands `ops` to the writer: they are committed in the order sent, and all in the same
    /// transaction. What one call on the core made goes together: a QoS 2 id received must
    /// never be stored without the queue entries of its message (a resend would be taken for a
    /// duplicate of a message that is gone), nor those without the id (it would come twice).
    pub fn send(&self, ops: Vec<(u64, StoreOp)>) {
        let bytes = backlog_bytes(&ops);
        self.backlog.add(ops.len(), bytes);
        let urgent = urgent(&ops);
        // The thread ends only with the process.
        let _ = self.tx.send(Msg::Ops(ops, Instant::now(), bytes, urgent));
    }

    /// Waits while more than [`MAX_PENDING_OPS`] ops, or ops holding [`MAX_PENDING_BYTES`],
    /// wait for the store's thread.
    pub(crate) async fn room(&self) {
        loop {
            let drained = self.backlog.drained.notified();
            if self.backlog.within_bounds() {
                return;
            }
            drained.await;
        }
    }

    /// Whether commits make progress while ops wait, as `/readyz` reads it.
    pub(crate) fn health(&self) -> StoreHealth {
        self.backlog.health()
    }

    /// Blocks until everything sent so far is committed, or for 5 s at most.
    pub fn flush(&self) {
        let (tx, rx) = mpsc::channel();
        let _ = self.tx.send(Msg::Flush(tx));
        let _ = rx.recv_timeout(Duration::from_secs(5));
    }

    /// [`SessionStore::flush`], then marks the store closed cleanly, so the next open knows no
    /// message went out unrecorded. Only when nothing is sent after it.
    pub(crate) fn close(&self) {
        let (tx, rx) = mpsc::channel();
        let _ = self.tx.send(Msg::Close(tx));
        let _ = rx.recv_timeout(Duration::from_secs(5));
    }
}

/// The store's writes on the caller's thread, for the whole-system simulation: it decides when
/// a group commits, fails or stalls, and what a crash keeps (what committed). The same writes,
/// loads and migrations as [`SessionStore`]'s thread.
pub struct Inline {
    writer: Writer,
    path: PathBuf,
}

impl std::fmt::Debug for Inline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inline").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Inline {
    /// Opens (or creates) the store at `path` and returns what it holds, expiries read against
    /// `clock` (an instant and the wall clock then, ms).
    pub fn open(path: &Path, clock: (Instant, u64)) -> Result<(Inline, StoredState), StoreError> {
        let sqlite = |source| StoreError::Sqlite { path: path.to_owned(), source };
        let (writer, state) = Writer::open_waiting(path, Duration::ZERO, clock).map_err(sqlite)?;
        Ok((Inline { writer, path: path.to_owned() }, state))
    }

    /// Commits `ops` in one transaction, or none of them.
    pub fn commit(&mut self, ops: &[(u64, StoreOp)]) -> Result<(), StoreError> {
        self.writer.commit(ops).map_err(|source| StoreError::Sqlite { path: self.path.clone(), source })
    }
}

/// A message row and what refers to it (deliveries, the retained store, wills).
#[derive(Debug, Clone)]
struct Row {
    id: i64,
    refs: u32,
    msg: Arc<Message>,
}

/// The writer thread's state: the connection and, in memory, the message rows by the address of
/// the one allocation every holder of a message shares (the entry keeps it alive, so no other
/// message takes its address meanwhile).
struct Writer {
    conn: Connection,
    rows: HashMap<usize, Row>,
    next_id: i64,
    /// The retained message's row per topic, and the will's per session: what a replacement
    /// releases.
    retained: HashMap<Arc<str>, usize>,
    wills: HashMap<Sid, usize>,
}

fn addr(msg: &Arc<Message>) -> usize {
    Arc::as_ptr(msg) as usize
}

impl Writer {
    fn open(path: &Path) -> rusqlite::Result<(Writer, StoredState)> {
        Self::open_waiting(path, LOCK_WAIT, (Instant::now(), shared::units::now_ms()))
    }

    /// Opens, waiting up to `lock_wait` for a lock another process holds; what expires is read
    /// against `clock` (an instant and the wall clock then, ms).
    fn open_waiting(
        path: &Path,
        lock_wait: Duration,
        clock: (Instant, u64),
    ) -> rusqlite::Result<(Writer, StoredState)> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(lock_wait)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA journal_size_limit = 4194304;",
        )?;
        migrate(&conn)?;
        let mut w = Writer { conn, rows: HashMap::new(), next_id: 1, retained: HashMap::new(), wills: HashMap::new() };
        let state = w.load(clock)?;
        Ok((w, state))
    }

    /// Reads everything back, counts the references of each message and deletes rows nothing
    /// refers to any more.
    fn load(&mut self, (now, wall): (Instant, u64)) -> rusqlite::Result<StoredState> {
        let mut by_id: HashMap<i64, Arc<Message>> = HashMap::new();
        {
            let mut stmt = self.conn.prepare(
                "SELECT id, topic, payload, qos, retain, expires_ms, origin, payload_format, content_type, \
                 response_topic, correlation_data, user_properties FROM messages",
            )?;
            let rows = stmt.query_map([], |r| {
                let expires_ms: Option<u64> = r.get(5)?;
                let user: Option<String> = r.get(11)?;
                let msg = Message {
                    topic: r.get::<_, String>(1)?.into(),
                    payload: Bytes::from(r.get::<_, Vec<u8>>(2)?),
                    qos: QoS::from_bits(r.get(3)?).unwrap_or(QoS::AtLeastOnce),
                    retain: r.get(4)?,
                    props: PublishProps {
                        payload_format: r.get(7)?,
                        content_type: r.get(8)?,
                        response_topic: r.get(9)?,
                        correlation_data: r.get::<_, Option<Vec<u8>>>(10)?.map(Bytes::from),
                        user: user.and_then(|u| serde_json::from_str(&u).ok()).unwrap_or_default(),
                    },
                    expires_at: expires_ms.map(|ms| at_wall(ms, now, wall)),
                    origin: r.get::<_, Option<String>>(6)?.map(Into::into),
                    schema: None,
                };
                Ok((r.get::<_, i64>(0)?, Arc::new(msg)))
            })?;
            for row in rows {
                let (id, msg) = row?;
                self.next_id = self.next_id.max(id + 1);
                by_id.insert(id, msg);
            }
        }
        let refer = |id: i64, rows: &mut HashMap<usize, Row>| -> Option<Arc<Message>> {
            let msg = by_id.get(&id)?.clone();
            rows.entry(addr(&msg)).or_insert_with(|| Row { id, refs: 0, msg: msg.clone() }).refs += 1;
            Some(msg)
        };
        let mut state = StoredState::default();
        {
            let mut stmt = self.conn.prepare(
                "SELECT sid, client_id, owner, expiry, disconnected_ms, subscriptions FROM sessions ORDER BY sid",
            )?;
            let rows = stmt.query_map([], |r| {
                let subs: String = r.get(5)?;
                Ok(SessionRecord {
                    sid: r.get(0)?,
                    client_id: r.get(1)?,
                    owner: r.get(2)?,
                    expiry: r.get(3)?,
                    disconnected_ms: r.get(4)?,
                    subscriptions: subscriptions_from(&subs),
                })
            })?;
            state.sessions = rows.collect::<rusqlite::Result<_>>()?;
        }
        {
            let mut stmt = self.conn.prepare(
                "SELECT sid, ord, msg, qos, retain, sub_ids, pkid, released, backlog FROM deliveries ORDER BY sid, ord",
            )?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let Some(msg) = refer(r.get(2)?, &mut self.rows) else { continue };
                let sub_ids: Option<String> = r.get(5)?;
                state.deliveries.push(StoredDelivery {
                    sid: r.get(0)?,
                    ord: r.get(1)?,
                    msg,
                    qos: QoS::from_bits(r.get(3)?).unwrap_or(QoS::AtLeastOnce),
                    retain: r.get(4)?,
                    sub_ids: sub_ids.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default(),
                    pkid: r.get(6)?,
                    released: r.get(7)?,
                    backlog: r.get(8)?,
                });
            }
        }
        {
            let mut stmt = self.conn.prepare("SELECT sid, pkid, coalesce(receipt, 0) FROM received")?;
            state.received = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as u64)))?
                .collect::<rusqlite::Result<_>>()?;
        }
        {
            let mut stmt = self.conn.prepare("SELECT sid, msg, expiry, due_ms FROM wills")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let sid: Sid = r.get(0)?;
                let Some(msg) = refer(r.get(1)?, &mut self.rows) else { continue };
                self.wills.insert(sid, addr(&msg));
                state.wills.push((sid, StoredWill { msg, expiry: r.get(2)?, due_ms: r.get(3)? }));
            }
        }
        {
            let mut stmt = self.conn.prepare("SELECT topic, msg FROM retained")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let Some(msg) = refer(r.get(1)?, &mut self.rows) else { continue };
                self.retained.insert(msg.topic.clone(), addr(&msg));
                state.retained.push(msg);
            }
        }
        {
            let mut stmt = self.conn.prepare("SELECT key, value FROM marks")?;
            state.marks = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<_>>()?;
        }
        // Bodies nothing refers to (a crash between writes cannot leave them, an older build
        // might have): gone.
        let live: std::collections::HashSet<i64> = self.rows.values().map(|r| r.id).collect();
        let orphans: Vec<i64> = by_id.keys().filter(|id| !live.contains(id)).copied().collect();
        if !orphans.is_empty() {
            let tx = self.conn.unchecked_transaction()?;
            for id in orphans {
                tx.execute("DELETE FROM messages WHERE id = ?1", [id])?;
            }
            tx.commit()?;
        }
        // Present while a run has the store open: found at open, the last run ended without
        // closing it.
        state.unclean =
            self.conn.query_row("SELECT 1 FROM meta WHERE key = 'running'", [], |_| Ok(())).optional()?.is_some();
        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('running', '1')", [])?;
        Ok(state)
    }

    fn run(
        mut self,
        rx: mpsc::Receiver<Msg>,
        listener: &OnceLock<Listener>,
        backlog: &Backlog,
        metrics: &BrokerMetrics,
        path: &Path,
    ) {
        let mut batch: Vec<(u64, StoreOp)> = Vec::new();
        // What the batch's groups hold, as they were counted in.
        let mut batch_bytes = 0;
        // Each with whether it closes the store.
        let mut flushes: Vec<(mpsc::Sender<()>, bool)> = Vec::new();
        let mut failing_since: Option<Instant> = None;
        let mut retry = Duration::from_millis(50);
        let mut policy = crate::spool::sched::WriterPolicy::start();
        metrics.store_healthy.set(1);
        loop {
            // While a batch failed, wait a while for more before trying it again.
            let first = if batch.is_empty() { rx.recv().ok() } else { rx.recv_timeout(retry).ok() };
            let mut oldest: Option<Instant> = None;
            let mut hurry = false;
            // Takes a message into the batch: whether it held urgent ops.
            let mut take =
                |m: Msg, batch: &mut Vec<(u64, StoreOp)>, flushes: &mut Vec<(mpsc::Sender<()>, bool)>| match m {
                    Msg::Ops(ops, sent, bytes, urgent) => {
                        oldest.get_or_insert(sent);
                        batch.extend(ops);
                        batch_bytes += bytes;
                        urgent
                    }
                    Msg::Flush(done) => {
                        flushes.push((done, false));
                        false
                    }
                    Msg::Close(done) => {
                        flushes.push((done, true));
                        false
                    }
                };
            match first {
                Some(m) => hurry = take(m, &mut batch, &mut flushes),
                None if batch.is_empty() => return,
                None => {}
            }
            // Gather for the interval (a flush asked for, or urgent ops, go as soon as nothing
            // more waits): what is undone within it is never written.
            let until = Instant::now() + COMMIT_INTERVAL;
            loop {
                while batch.len() < MAX_BATCH {
                    let Ok(m) = rx.try_recv() else { break };
                    hurry |= take(m, &mut batch, &mut flushes);
                }
                let now = Instant::now();
                if !flushes.is_empty() || hurry || batch.len() >= MAX_BATCH || now >= until {
                    break;
                }
                std::thread::sleep((until - now).min(Duration::from_millis(1)));
            }
            if let Some(sent) = oldest {
                policy.observe(sent.elapsed(), COMMIT_INTERVAL, Instant::now());
            }
            if !batch.is_empty() {
                let started = Instant::now();
                match self.commit(&batch) {
                    Ok(()) => {
                        metrics.store_commit_seconds.observe(started.elapsed().as_secs_f64());
                        let last = batch.last().map_or(0, |(id, _)| *id);
                        backlog.committed(batch.len(), std::mem::take(&mut batch_bytes));
                        batch.clear();
                        metrics.store_healthy.set(1);
                        retry = Duration::from_millis(50);
                        if let Some(since) = failing_since.take() {
                            tracing::warn!(path = %path.display(), after = ?since.elapsed(), "session store commits succeed again");
                        }
                        if let Some(f) = listener.get() {
                            f(last);
                        }
                    }
                    Err(e) => {
                        metrics.store_errors.inc();
                        metrics.store_healthy.set(0);
                        backlog.failed(e.to_string());
                        if failing_since.is_none() {
                            failing_since = Some(Instant::now());
                            tracing::error!(path = %path.display(), error = %e, ops = batch.len(), "session store commit failed; retrying, the acknowledgements that wait for it wait");
                        }
                        retry = (retry * 2).min(Duration::from_secs(2));
                    }
                }
            }
            if batch.is_empty() {
                for (done, close) in flushes.drain(..) {
                    if close && let Err(e) = self.conn.execute("DELETE FROM meta WHERE key = 'running'", []) {
                        tracing::warn!(path = %path.display(), error = %e, "session store not marked closed; the next start resends with DUP");
                    }
                    let _ = done.send(());
                }
            }
        }
    }

    /// Writes `ops` in one transaction. The in-memory references change only once it committed,
    /// so a failed batch is tried again whole.
    fn commit(&mut self, ops: &[(u64, StoreOp)]) -> rusqlite::Result<()> {
        let plan = Plan::make(self, ops);
        let tx = self.conn.transaction()?;
        plan.write(&tx)?;
        tx.commit()?;
        plan.apply(self);
        Ok(())
    }
}

/// One batch's writes, worked out before any is made.
#[derive(Default)]
struct Plan {
    /// Message rows whose references change: `None` once nothing refers to them.
    rows: HashMap<usize, Option<Row>>,
    /// Rows made in this batch (written only if still referred to at its end).
    fresh: std::collections::HashSet<usize>,
    /// Rows stored before whose last reference went.
    deleted: Vec<i64>,
    retained: HashMap<Arc<str>, Option<usize>>,
    wills: HashMap<Sid, Option<(usize, Option<u32>, u64)>>,
    next_id: i64,
    forget: Vec<Sid>,
    sessions: BTreeMap<Sid, Option<SessionRecord>>,
    /// Deliveries queued in this batch and still there at its end.
    queued: BTreeMap<(Sid, u64), StoredDelivery>,
    /// Changes to deliveries stored before, in order.
    changes: Vec<Change>,
    /// QoS 2 ids: kept with their receipt, or gone (`None`).
    received: BTreeMap<(Sid, u16), Option<u64>>,
    /// Marks, the last value of each.
    marks: BTreeMap<&'static str, String>,
}

enum Change {
    Sent(Sid, u64, u16),
    Released(Sid, u64),
    Done(Sid, u64),
}

impl Plan {
    fn make(w: &Writer, ops: &[(u64, StoreOp)]) -> Plan {
        let mut p = Plan { next_id: w.next_id, ..Plan::default() };
        for (_, op) in ops {
            match op {
                StoreOp::Session(r) => {
                    p.sessions.insert(r.sid, Some(r.clone()));
                }
                StoreOp::Forget { sid, msgs } => {
                    p.forget.push(*sid);
                    p.sessions.insert(*sid, None);
                    p.queued.retain(|(s, _), _| s != sid);
                    p.received.retain(|(s, _), _| s != sid);
                    for m in msgs {
                        p.release(w, m);
                    }
                    if let Some(old) = p.will_of(w, *sid) {
                        p.release_addr(w, old);
                    }
                    p.wills.insert(*sid, None);
                }
                StoreOp::Queue(d) => {
                    p.refer(w, &d.msg);
                    p.queued.insert((d.sid, d.ord), d.clone());
                }
                StoreOp::Sent { sid, ord, pkid } => match p.queued.get_mut(&(*sid, *ord)) {
                    Some(d) => d.pkid = Some(*pkid),
                    None => p.changes.push(Change::Sent(*sid, *ord, *pkid)),
                },
                StoreOp::Released { sid, ord } => match p.queued.get_mut(&(*sid, *ord)) {
                    Some(d) => d.released = true,
                    None => p.changes.push(Change::Released(*sid, *ord)),
                },
                StoreOp::Done { sid, ord, msg } => {
                    if p.queued.remove(&(*sid, *ord)).is_none() {
                        p.changes.push(Change::Done(*sid, *ord));
                    }
                    p.release(w, msg);
                }
                StoreOp::Received { sid, pkid, receipt } => {
                    p.received.insert((*sid, *pkid), Some(*receipt));
                }
                StoreOp::Settled { sid, pkid } => {
                    p.received.insert((*sid, *pkid), None);
                }
                StoreOp::Mark { key, value } => {
                    p.marks.insert(key, value.clone());
                }
                StoreOp::Will { sid, will } => {
                    if let Some(old) = p.will_of(w, *sid) {
                        p.release_addr(w, old);
                    }
                    let new = will.as_ref().map(|wl| {
                        p.refer(w, &wl.msg);
                        (addr(&wl.msg), wl.expiry, wl.due_ms)
                    });
                    p.wills.insert(*sid, new);
                }
                StoreOp::Retain { topic, msg } => {
                    let old = match p.retained.get(topic) {
                        Some(a) => *a,
                        None => w.retained.get(topic).copied(),
                    };
                    if let Some(old) = old {
                        p.release_addr(w, old);
                    }
                    if let Some(m) = msg {
                        p.refer(w, m);
                    }
                    p.retained.insert(topic.clone(), msg.as_ref().map(addr));
                }
            }
        }
        p
    }

    fn row(&self, w: &Writer, at: usize) -> Option<Row> {
        match self.rows.get(&at) {
            Some(r) => r.clone(),
            None => w.rows.get(&at).cloned(),
        }
    }

    fn refer(&mut self, w: &Writer, msg: &Arc<Message>) {
        let at = addr(msg);
        let row = match self.row(w, at) {
            Some(mut r) => {
                r.refs += 1;
                r
            }
            None => {
                self.next_id += 1;
                self.fresh.insert(at);
                Row { id: self.next_id - 1, refs: 1, msg: msg.clone() }
            }
        };
        self.rows.insert(at, Some(row));
    }

    fn release(&mut self, w: &Writer, msg: &Arc<Message>) {
        self.release_addr(w, addr(msg));
    }

    fn release_addr(&mut self, w: &Writer, at: usize) {
        // An unknown message (nothing stored refers to it) has nothing to release.
        let Some(mut r) = self.row(w, at) else { return };
        r.refs = r.refs.saturating_sub(1);
        if r.refs == 0 && !self.fresh.remove(&at) {
            self.deleted.push(r.id);
        }
        self.rows.insert(at, (r.refs > 0).then_some(r));
    }

    fn will_of(&self, w: &Writer, sid: Sid) -> Option<usize> {
        match self.wills.get(&sid) {
            Some(will) => will.map(|(a, _, _)| a),
            None => w.wills.get(&sid).copied(),
        }
    }

    fn write(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        let id_of = |at: usize| self.rows.get(&at).and_then(|r| r.as_ref().map(|r| r.id));
        for (key, value) in &self.marks {
            tx.prepare_cached("INSERT OR REPLACE INTO marks (key, value) VALUES (?1, ?2)")?
                .execute(params![key, value])?;
        }
        for sid in &self.forget {
            for table in ["deliveries", "received", "wills", "sessions"] {
                tx.prepare_cached(&format!("DELETE FROM {table} WHERE sid = ?1"))?.execute([sid])?;
            }
        }
        for c in &self.changes {
            match *c {
                Change::Sent(sid, ord, pkid) => tx
                    .prepare_cached("UPDATE deliveries SET pkid = ?3 WHERE sid = ?1 AND ord = ?2")?
                    .execute(params![sid, ord, pkid])?,
                Change::Released(sid, ord) => tx
                    .prepare_cached("UPDATE deliveries SET released = 1 WHERE sid = ?1 AND ord = ?2")?
                    .execute(params![sid, ord])?,
                Change::Done(sid, ord) => tx
                    .prepare_cached("DELETE FROM deliveries WHERE sid = ?1 AND ord = ?2")?
                    .execute(params![sid, ord])?,
            };
        }
        for (&(sid, pkid), kept) in &self.received {
            match kept {
                Some(receipt) => tx
                    .prepare_cached("INSERT OR REPLACE INTO received (sid, pkid, receipt) VALUES (?1, ?2, ?3)")?
                    .execute(params![sid, pkid, *receipt as i64])?,
                None => tx
                    .prepare_cached("DELETE FROM received WHERE sid = ?1 AND pkid = ?2")?
                    .execute(params![sid, pkid])?,
            };
        }
        // New bodies before what refers to them.
        let (now, wall) = (Instant::now(), shared::units::now_ms());
        for row in self.fresh.iter().filter_map(|at| self.rows.get(at)?.as_ref()) {
            let m = &row.msg;
            tx.prepare_cached(
                "INSERT INTO messages (id, topic, payload, qos, retain, expires_ms, origin, payload_format, \
                 content_type, response_topic, correlation_data, user_properties) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )?
            .execute(params![
                row.id,
                &*m.topic,
                &m.payload[..],
                m.qos as u8,
                m.retain,
                m.expires_at.map(|at| wall + at.saturating_duration_since(now).as_millis() as u64),
                m.origin.as_deref(),
                m.props.payload_format,
                m.props.content_type,
                m.props.response_topic,
                m.props.correlation_data.as_deref(),
                (!m.props.user.is_empty()).then(|| serde_json::to_string(&m.props.user).unwrap_or_default()),
            ])?;
        }
        for (sid, record) in &self.sessions {
            let Some(r) = record else { continue };
            tx.prepare_cached(
                "INSERT OR REPLACE INTO sessions (sid, client_id, owner, expiry, disconnected_ms, subscriptions) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                sid,
                r.client_id,
                r.owner,
                r.expiry,
                r.disconnected_ms,
                subscriptions_text(r)
            ])?;
        }
        for d in self.queued.values() {
            let Some(msg) = id_of(addr(&d.msg)) else { continue };
            tx.prepare_cached(
                "INSERT OR REPLACE INTO deliveries (sid, ord, msg, qos, retain, sub_ids, pkid, released, backlog) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                d.sid,
                d.ord,
                msg,
                d.qos as u8,
                d.retain,
                (!d.sub_ids.is_empty()).then(|| serde_json::to_string(&d.sub_ids).unwrap_or_default()),
                d.pkid,
                d.released,
                d.backlog,
            ])?;
        }
        for (sid, will) in &self.wills {
            match will.and_then(|(at, expiry, due)| Some((id_of(at)?, expiry, due))) {
                Some((msg, expiry, due)) => tx
                    .prepare_cached("INSERT OR REPLACE INTO wills (sid, msg, expiry, due_ms) VALUES (?1, ?2, ?3, ?4)")?
                    .execute(params![sid, msg, expiry, due])?,
                None => tx.prepare_cached("DELETE FROM wills WHERE sid = ?1")?.execute([sid])?,
            };
        }
        for (topic, at) in &self.retained {
            match at.and_then(id_of) {
                Some(msg) => tx
                    .prepare_cached("INSERT OR REPLACE INTO retained (topic, msg) VALUES (?1, ?2)")?
                    .execute(params![&**topic, msg])?,
                None => tx.prepare_cached("DELETE FROM retained WHERE topic = ?1")?.execute([&**topic])?,
            };
        }
        // Bodies nothing refers to any more.
        for id in &self.deleted {
            tx.prepare_cached("DELETE FROM messages WHERE id = ?1")?.execute([id])?;
        }
        Ok(())
    }

    /// The batch committed: the writer's references become the plan's.
    fn apply(self, w: &mut Writer) {
        for (at, row) in self.rows {
            match row {
                Some(r) => {
                    w.rows.insert(at, r);
                }
                None => {
                    w.rows.remove(&at);
                }
            }
        }
        for (topic, at) in self.retained {
            match at {
                Some(at) => w.retained.insert(topic, at),
                None => w.retained.remove(&topic),
            };
        }
        for (sid, will) in self.wills {
            match will {
                Some((at, _, _)) => w.wills.insert(sid, at),
                None => w.wills.remove(&sid),
            };
        }
        w.next_id = self.next_id;
    }
}

/// An instant for a wall-clock time, from a pair of readings taken together.
fn at_wall(ms: u64, now: Instant, wall: u64) -> Instant {
    if ms >= wall {
        now + Duration::from_millis(ms - wall)
    } else {
        now.checked_sub(Duration::from_millis(wall - ms)).unwrap_or(now)
    }
}

fn subscriptions_text(r: &SessionRecord) -> String {
    let subs: Vec<StoredSub> = r
        .subscriptions
        .iter()
        .map(|(filter, o)| StoredSub {
            filter: filter.clone(),
            qos: o.qos as u8,
            nl: o.no_local,
            rap: o.retain_as_published,
            rh: o.retain_handling,
            id: o.id,
        })
        .collect();
    serde_json::to_string(&subs).unwrap_or_default()
}

fn subscriptions_from(text: &str) -> Vec<(String, SubOptions)> {
    let subs: Vec<StoredSub> = serde_json::from_str(text).unwrap_or_default();
    subs.into_iter()
        .filter_map(|s| {
            let opts = SubOptions {
                qos: QoS::from_bits(s.qos)?,
                no_local: s.nl,
                retain_as_published: s.rap,
                retain_handling: s.rh.min(2),
                id: s.id,
            };
            Some((s.filter, opts))
        })
        .collect()
}

/// Brings the file to [`SCHEMA_VERSION`]: version 1 had only `sessions`, keyed by client id.
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let sessions: Option<String> = conn
        .query_row("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'sessions'", [], |r| r.get(0))
        .optional()?;
    let tx = conn.unchecked_transaction()?;
    if sessions.is_some_and(|sql| !sql.contains("sid")) {
        tx.execute_batch("ALTER TABLE sessions RENAME TO sessions_v1")?;
        tx.execute_batch(SCHEMA)?;
        tx.execute_batch(
            "INSERT INTO sessions (client_id, owner, expiry, disconnected_ms, subscriptions) \
             SELECT client_id, owner, expiry, disconnected_ms, subscriptions FROM sessions_v1; DROP TABLE sessions_v1;",
        )?;
        tracing::info!("session store migrated from version 1");
    } else {
        tx.execute_batch(SCHEMA)?;
    }
    // The receipt a QoS 2 id's message went to the spool under: added without a version step
    // (an older build names its columns and leaves it empty).
    let receipt: i64 =
        tx.query_row("SELECT count(*) FROM pragma_table_info('received') WHERE name = 'receipt'", [], |r| r.get(0))?;
    if receipt == 0 {
        tx.execute_batch("ALTER TABLE received ADD COLUMN receipt INTEGER")?;
    }
    let version: Option<String> =
        tx.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0)).optional()?;
    if let Some(v) = version.and_then(|v| v.parse::<i64>().ok()).filter(|v| *v > SCHEMA_VERSION) {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_MISMATCH),
            Some(format!("schema version {v}; this build knows up to {SCHEMA_VERSION}")),
        ));
    }
    tx.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?1)", [SCHEMA_VERSION.to_string()])?;
    tx.commit()
}

/// Whether the error says the file is not a readable database (rather than locked, read-only,
/// on a full disk or behind an I/O error, which are not the file's fault).
fn is_damaged(e: &rusqlite::Error) -> bool {
    use rusqlite::ffi::ErrorCode;
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if matches!(f.code, ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt))
}

/// Renames the store and its WAL and shared-memory files to `<name>.corrupt-<ms>`.
fn move_aside(path: &Path) -> Result<PathBuf, StoreError> {
    let suffix = format!(".corrupt-{}", shared::units::now_ms());
    let mut target = path.as_os_str().to_owned();
    target.push(&suffix);
    for extra in ["", "-wal", "-shm"] {
        let mut from = path.as_os_str().to_owned();
        from.push(extra);
        let mut to = target.clone();
        to.push(extra);
        match std::fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(StoreError::Io { path: PathBuf::from(from), source }),
        }
    }
    Ok(PathBuf::from(target))
}

#[cfg(test)]
mod tests;
