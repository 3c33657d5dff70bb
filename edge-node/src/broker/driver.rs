//! The tokio side of the core: one `Broker` behind a mutex that every connection task takes for
//! a moment (never across an await), a `Notify` per connection for its writer, the spool
//! appends and session-store writes the core asks for, and the timer task for wills and
//! session expiry.
//!
//! A publish costs its publisher one lock (route and queue to every subscriber) and each
//! subscriber one wake-up and one lock (take its packets); the packets are encoded after the
//! lock is released. A subscriber woken from the publisher's task usually runs next on the same
//! worker thread (tokio's LIFO slot), so the local path rarely crosses threads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::core::{Action, Broker, ConnId, SpoolRequest, Spooled};
use super::store::{SessionStore, StoreOp};
use crate::spool::{AppendError, SpoolWriter};

/// What a connection's task waits on: its writer for packets to send, its reader (paused while
/// an MQTT 3.1.1 client is past our Receive Maximum) for acknowledgements to have gone out.
#[derive(Debug, Default)]
pub struct Wakers {
    pub writer: Notify,
    pub reader: Notify,
}

/// The running broker, shared by the front's connections and the node's own clients.
#[derive(Debug)]
pub struct BrokerHandle {
    core: Mutex<Broker>,
    wakers: Mutex<HashMap<ConnId, Arc<Wakers>>>,
    next_conn: AtomicU64,
    spool: Option<SpoolWriter>,
    store: Option<SessionStore>,
    /// Wakes the timer task when the core's next deadline may have moved earlier.
    timer: Notify,
}

impl BrokerHandle {
    pub fn new(core: Broker, spool: Option<SpoolWriter>, store: Option<SessionStore>) -> Arc<Self> {
        Arc::new(Self {
            core: Mutex::new(core),
            wakers: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            spool,
            store,
            timer: Notify::new(),
        })
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
    pub async fn unregister(self: &Arc<Self>, conn: ConnId) {
        lock(&self.wakers).remove(&conn);
        let spool = self.with(|b| b.closed(conn, Instant::now()));
        self.run_spool(spool.1).await;
    }

    /// [`BrokerHandle::unregister`] for a connection that fires no will and routes nothing when
    /// it goes (the node's own clients), from where nothing can be awaited.
    pub fn forget(&self, conn: ConnId) {
        lock(&self.wakers).remove(&conn);
        let _ = self.with(|b| b.closed(conn, Instant::now()));
    }

    /// Runs `f` on the core and carries out what it asked for, except the spool appends, which
    /// are returned for the caller to make ([`BrokerHandle::run_spool`]) in order.
    pub fn with<R>(&self, f: impl FnOnce(&mut Broker) -> R) -> (R, Vec<SpoolRequest>) {
        let mut core = lock(&self.core);
        let before = core.poll_timeout();
        let result = f(&mut core);
        let mut wakes = Vec::new();
        let mut spool = Vec::new();
        while let Some(action) = core.poll_action() {
            match action {
                Action::Wake(conn) => wakes.push(conn),
                Action::Spool(req) => spool.push(*req),
                Action::Persist(record) => {
                    if let Some(store) = &self.store {
                        store.send(StoreOp::Put(record));
                    }
                }
                Action::Forget(client_id) => {
                    if let Some(store) = &self.store {
                        store.send(StoreOp::Forget(client_id));
                    }
                }
            }
        }
        let after = core.poll_timeout();
        drop(core);
        if after.is_some() && (before.is_none() || after < before) {
            self.timer.notify_one();
        }
        if !wakes.is_empty() {
            let wakers = lock(&self.wakers);
            for conn in wakes {
                if let Some(w) = wakers.get(&conn) {
                    w.writer.notify_one();
                }
            }
        }
        (result, spool)
    }

    /// Appends what the core routed to the spool, in order, and reports each outcome back. A
    /// `normal` append is answered once the spool has it; a `full` one once committed, on a
    /// task of its own so the caller goes on reading its client meanwhile.
    pub async fn run_spool(self: &Arc<Self>, requests: Vec<SpoolRequest>) {
        for req in requests {
            let Some(spool) = &self.spool else {
                self.report(req.ticket, Spooled::Failed);
                continue;
            };
            let ticket = req.ticket;
            match spool.append(req.lane, req.message, req.durability).await {
                Ok(None) => self.report(ticket, Spooled::Accepted),
                Ok(Some(done)) => {
                    let this = self.clone();
                    tokio::spawn(async move {
                        let outcome = match done.await {
                            Ok(Ok(_)) => Spooled::Accepted,
                            Ok(Err(AppendError::Refused)) => Spooled::Refused,
                            Ok(Err(_)) | Err(_) => Spooled::Failed,
                        };
                        this.report(ticket, outcome);
                    });
                }
                Err(AppendError::Refused) => self.report(ticket, Spooled::Refused),
                Err(_) => self.report(ticket, Spooled::Failed),
            }
        }
    }

    fn report(&self, ticket: u64, outcome: Spooled) {
        // An outcome's own follow-up (a held message delivered locally) routes nothing new to
        // the spool.
        let _ = self.with(|b| b.spooled(ticket, outcome, Instant::now()));
    }

    /// Publishes delayed wills and ends expired sessions on time, until `shutdown`.
    pub async fn run_timers(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let (next, _) = self.with(|b| b.poll_timeout());
            let wait = next.map_or(Duration::from_secs(3600), |at| at.saturating_duration_since(Instant::now()));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.timer.notified() => continue,
                _ = tokio::time::sleep(wait) => {}
            }
            let (_, spool) = self.with(|b| b.handle_timeout(Instant::now()));
            self.run_spool(spool).await;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the core's lock is a bug in the core; the state it left is still
    // the best there is for the other connections.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
