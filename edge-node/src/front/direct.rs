//! A plain TCP client's socket as an [`Outlet`]: the task that routes a message to the client
//! writes its packets itself when no one else is writing to the socket, instead of waking the
//! client's writer task (which then takes the core's lock again for them). With ten
//! subscribers a PUBLISH woke ten tasks; now their packets usually go out from the
//! publisher's task, one `write` each, as a single-threaded broker writes them.
//!
//! Whoever holds the socket ([`Direct::claim`]) is the only one taking the connection's packets
//! from the core and writing, and bytes it could not write wait in `pending` for the next
//! holder, so the client's packets go out in order. A routing task never waits: it claims or
//! leaves the packets to the writer, writes what the socket takes at once, and gives the
//! socket back. The writer task ([`writer`]) holds it while it waits for a slow socket.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use bytes::{Buf, BytesMut};
use prometheus_client::metrics::counter::Counter;
use tokio::net::tcp::OwnedWriteHalf;

use super::FrontContext;
use crate::broker::codec::{self, Outbound, Version};
use crate::broker::core::ConnId;
use crate::broker::driver::{Outlet, Wakers};

/// See the module doc.
#[derive(Debug)]
pub(super) struct Direct {
    half: OwnedWriteHalf,
    version: Version,
    held: AtomicBool,
    /// Bytes taken from the core and not written yet: only the holder touches them.
    pending: Mutex<BytesMut>,
    /// A write failed: the writer ends the connection.
    broken: AtomicBool,
    bytes_out: Counter,
}

impl Direct {
    pub(super) fn new(half: OwnedWriteHalf, version: Version, bytes_out: Counter) -> Arc<Self> {
        Arc::new(Self {
            half,
            version,
            held: AtomicBool::new(false),
            pending: Mutex::new(BytesMut::with_capacity(16 * 1024)),
            broken: AtomicBool::new(false),
            bytes_out,
        })
    }

    /// Takes the socket, whatever is pending (the writer, or the last goodbye).
    fn take(&self) -> bool {
        self.held.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    fn release(&self) {
        self.held.store(false, Ordering::Release);
    }

    /// Writes what the socket takes now; whether anything is left.
    fn flush_some(&self, pending: &mut BytesMut) -> bool {
        while !pending.is_empty() {
            match self.half.try_write(pending) {
                Ok(0) => {
                    self.broken.store(true, Ordering::Relaxed);
                    return true;
                }
                Ok(n) => {
                    pending.advance(n);
                    self.bytes_out.inc_by(n as u64);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(_) => {
                    self.broken.store(true, Ordering::Relaxed);
                    return true;
                }
            }
        }
        // The buffer stays small whatever one burst held.
        if pending.capacity() > 256 * 1024 {
            *pending = BytesMut::with_capacity(16 * 1024);
        }
        false
    }

    fn encode(&self, packets: &[Outbound], pending: &mut BytesMut) {
        for p in packets {
            codec::encode(p, self.version, pending);
        }
    }
}

impl Outlet for Direct {
    fn claim(&self) -> bool {
        if !self.take() {
            return false;
        }
        // Bytes still waiting for the socket are the writer's to finish: a routing task adds
        // nothing behind them, so what the core moved out of its queue stays one batch at most.
        if !self.pending.lock().unwrap_or_else(PoisonError::into_inner).is_empty() {
            self.release();
            return false;
        }
        true
    }

    fn write_and_release(&self, packets: &[Outbound]) -> bool {
        let left = {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            self.encode(packets, &mut pending);
            self.flush_some(&mut pending)
        };
        self.release();
        left
    }
}

/// How a direct writer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    Lost,
    Closed,
    SlowClient,
}

/// The connection's writer task for a [`Direct`] socket: woken when a routing task could not
/// write everything (or could not claim the socket), it takes the socket, writes what is
/// pending and then what the core has, waiting for the socket as long as
/// `broker.slow_client_timeout` allows.
pub(super) async fn writer(d: &Direct, conn: ConnId, wakers: &Wakers, ctx: &FrontContext, batch: usize) -> Ended {
    loop {
        wakers.writer.notified().await;
        // A routing task holds the socket for the time of one `write`.
        while !d.take() {
            tokio::task::yield_now().await;
        }
        loop {
            if let Err(end) = drain(d, ctx.slow_client_timeout).await {
                d.release();
                return end;
            }
            let (t, _) = ctx.broker.with(|b| b.poll_transmit(conn, Instant::now(), batch));
            if t.packets.is_empty() && !t.closing {
                break;
            }
            d.encode(&t.packets, &mut d.pending.lock().unwrap_or_else(PoisonError::into_inner));
            if t.closing {
                // The last packets: written, then closed.
                let end = drain(d, ctx.slow_client_timeout).await.err().unwrap_or(Ended::Closed);
                d.release();
                return end;
            }
        }
        d.release();
        // The reader may be paused waiting for these acknowledgements to go out.
        wakers.reader.notify_one();
    }
}

/// Writes everything pending, waiting for the socket at most `wait` at a time; held by the
/// caller.
async fn drain(d: &Direct, wait: std::time::Duration) -> Result<(), Ended> {
    loop {
        if d.broken.load(Ordering::Relaxed) {
            return Err(Ended::Lost);
        }
        let left = d.flush_some(&mut d.pending.lock().unwrap_or_else(PoisonError::into_inner));
        if !left {
            return Ok(());
        }
        if d.broken.load(Ordering::Relaxed) {
            return Err(Ended::Lost);
        }
        match tokio::time::timeout(wait, d.half.writable()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(Ended::Lost),
            Err(_) => return Err(Ended::SlowClient),
        }
    }
}

/// Writes `packets` (the goodbye of a shutdown) through the socket, waiting for it at most
/// `within`.
pub(super) async fn write_last(d: &Direct, packets: &[Outbound], within: std::time::Duration) {
    let deadline = tokio::time::Instant::now() + within;
    let taken = tokio::time::timeout_at(deadline, async {
        while !d.take() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    if taken.is_err() {
        return;
    }
    d.encode(packets, &mut d.pending.lock().unwrap_or_else(PoisonError::into_inner));
    let _ = tokio::time::timeout_at(deadline, drain(d, within)).await;
    d.release();
}
