//! The front: client connections, from accept to the broker core.
//!
//! It accepts TCP and TLS (TCP_NODELAY on every socket, TLS handshakes in the connection's own
//! task), authenticates at CONNECT (`connect`: certificate, password, or an anonymous loopback
//! listener), resolves the client's ACL rules, enforces the packet-size and connection limits,
//! and then only moves bytes (`conn`): frames from the client go to the broker core decoded,
//! and what the core has for the client goes out encoded. Sessions, routing, the ACL checks on
//! each PUBLISH and SUBSCRIBE and every MQTT rule are the core's (`broker::core`). See
//! docs/ARCHITECTURE.md for where it sits.

mod bind;
mod config;
mod conn;
mod connect;
mod direct;
mod metrics;
pub(crate) mod ws;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::{AuthState, Identity, LoginPool};
use crate::broker::driver::BrokerHandle;
use crate::labels::RefusedLabels;

pub use bind::{BindError, bind};
pub use config::{ListenerConfig, check_listeners, default_listeners};
pub use connect::rules_of_owner;
pub use metrics::FrontMetrics;

impl FrontContext {
    /// Whether a line about a peer not yet logged in may be written now; if so, how many were
    /// held back before it.
    pub(crate) fn peer_line(&self) -> Option<u64> {
        let allowed = self.log.allow_at(std::time::Instant::now());
        if allowed.is_none() {
            self.metrics.log_suppressed.inc();
        }
        allowed
    }
}

/// Everything connections share.
#[derive(Debug)]
pub(crate) struct FrontContext {
    pub max_packet_size: usize,
    /// `broker.max_connect_size`, at most `max_packet_size`: what a client not yet
    /// authenticated may make the node buffer.
    pub max_connect_size: usize,
    pub connect_timeout: Duration,
    pub slow_client_timeout: Duration,
    pub auth: ArcSwap<AuthState>,
    /// Bumped on every reload, so connections re-resolve their ACL rules.
    pub auth_generation: AtomicU64,
    pub metrics: FrontMetrics,
    /// `log.peer_lines_per_second`: what peers not yet logged in may make the node write.
    pub log: shared::log_budget::LogBudget,
    /// Connections admitted (past CONNECT and the login): `broker.max_connections`.
    pub permits: Arc<Semaphore>,
    /// Connections not yet admitted: `broker.max_pending_connections`.
    pub pending: Arc<Semaphore>,
    /// Where password checks run, a bounded number at once.
    pub logins: LoginPool,
    pub broker: Arc<BrokerHandle>,
    pub shutdown: CancellationToken,
    pub tracker: TaskTracker,
    /// Spans for PUBLISHes with a trace context (`[tracing]`).
    pub tracer: shared::trace::Tracer,
    /// The `[[schema]]` bindings, when there are any: a connection validates its PUBLISHes'
    /// payloads before it takes the core's lock ([`crate::schema::Validator::judge`]).
    pub schemas: Option<Arc<crate::schema::Validator>>,
}

/// One bound listener.
pub(crate) struct Listener {
    pub name: String,
    pub anonymous: bool,
    /// MQTT over WebSocket.
    pub websocket: bool,
    /// Browser origins served over WebSocket (`ListenerConfig::allowed_origins`).
    pub origins: ws::Origins,
    /// Present for TLS listeners; swapped on reload.
    pub tls: Option<ArcSwap<TlsAcceptor>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("name", &self.name).field("tls", &self.tls.is_some()).finish()
    }
}

/// Accepts connections on `socket` until shutdown.
pub(crate) async fn accept_loop(socket: TcpListener, listener: Arc<Listener>, ctx: Arc<FrontContext>) {
    loop {
        let accepted = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            accepted = socket.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                // Taken before any work on the connection (TLS, reading CONNECT, the login), so
                // what clients that never finish cost is bounded; dropping the stream closes it.
                let Ok(pending) = ctx.pending.clone().try_acquire_owned() else {
                    tracing::debug!(listener = %listener.name, %peer, "connection closed: broker.max_pending_connections reached");
                    let reason = "max_pending";
                    ctx.metrics
                        .connects_refused
                        .get_or_create(&RefusedLabels { listener: listener.name.clone(), reason })
                        .inc();
                    continue;
                };
                let listener = listener.clone();
                let ctx2 = ctx.clone();
                ctx.tracker.spawn(async move { handle(stream, peer, listener, ctx2, pending).await });
            }
            Err(e) => {
                // Out of file descriptors or similar: back off instead of spinning.
                tracing::warn!(listener = %listener.name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn handle(
    stream: TcpStream,
    peer: SocketAddr,
    listener: Arc<Listener>,
    ctx: Arc<FrontContext>,
    pending: OwnedSemaphorePermit,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
    }
    // Half-open clients with keep-alive 0 would otherwise hold a connection slot forever.
    let keepalive =
        socket2::TcpKeepalive::new().with_time(Duration::from_secs(60)).with_interval(Duration::from_secs(10));
    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
    // A handle of its own on the socket (TLS and WebSocket take the stream), for the reader to
    // ask for quick acks (`conn.rs`).
    let quickack = socket2::SockRef::from(&stream).try_clone().ok();

    let refused = |reason: &'static str| {
        ctx.metrics.connects_refused.get_or_create(&RefusedLabels { listener: listener.name.clone(), reason }).inc();
    };
    match &listener.tls {
        None => serve(stream, None, &listener, &ctx, peer, pending, quickack).await,
        Some(acceptor) => {
            let acceptor = acceptor.load_full();
            match tokio::time::timeout(ctx.connect_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let first = tls.get_ref().1.peer_certificates().and_then(|chain| chain.first());
                    let cert = first.and_then(|c| {
                        let identity = Identity::Certificate(crate::tls::certificate_identity(c)?);
                        Some(conn::CertIdentity { identity, expires: crate::tls::certificate_expiry(c) })
                    });
                    serve(tls, cert, &listener, &ctx, peer, pending, quickack).await
                }
                Ok(Err(e)) => {
                    if let Some(held_back) = ctx.peer_line() {
                        tracing::info!(listener = %listener.name, %peer, error = %e, held_back, "TLS handshake failed");
                    }
                    refused("tls");
                }
                Err(_) => {
                    if let Some(held_back) = ctx.peer_line() {
                        tracing::info!(listener = %listener.name, %peer, held_back, "TLS handshake timed out");
                    }
                    refused("timeout");
                }
            }
        }
    }
}

/// What a WebSocket client may send before its login besides its CONNECT: the HTTP upgrade
/// request (a browser's, cookies included) and the framing.
const PRE_LOGIN_WEBSOCKET_BYTES: usize = 16 << 10;

/// Serves the connection, over WebSocket on a WebSocket listener.
async fn serve<S>(
    stream: S,
    cert: Option<conn::CertIdentity>,
    listener: &Listener,
    ctx: &Arc<FrontContext>,
    peer: SocketAddr,
    pending: OwnedSemaphorePermit,
    quickack: Option<socket2::Socket>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut entry = conn::Entry {
        listener: &listener.name,
        anonymous: listener.anonymous,
        cert,
        peer,
        pending,
        quickack,
        lift: None,
    };
    if !listener.websocket {
        return conn::serve(stream, entry, ctx).await;
    }
    // Before the login, the handshake's headers and the CONNECT, not a whole largest message.
    let cap = Arc::new(AtomicU64::new((ctx.max_connect_size + PRE_LOGIN_WEBSOCKET_BYTES) as u64));
    entry.lift = Some(cap.clone());
    let stream = ws::Capped::new(stream, cap);
    // A WebSocket message holds at most one largest packet and some of the next.
    let max_message = ctx.max_packet_size + 64 * 1024;
    match tokio::time::timeout(ctx.connect_timeout, ws::accept(stream, max_message, &listener.origins)).await {
        Ok(Ok(ws)) => conn::serve(ws, entry, ctx).await,
        Ok(Err(e)) => {
            let reason = if ws::is_origin_refusal(&e) { "origin" } else { "websocket" };
            if let Some(held_back) = ctx.peer_line() {
                tracing::info!(listener = %listener.name, %peer, error = %e, reason, held_back, "WebSocket handshake refused");
            }
            ctx.metrics
                .connects_refused
                .get_or_create(&RefusedLabels { listener: listener.name.clone(), reason })
                .inc();
        }
        Err(_) => {
            ctx.metrics
                .connects_refused
                .get_or_create(&RefusedLabels { listener: listener.name.clone(), reason: "timeout" })
                .inc();
        }
    }
}
