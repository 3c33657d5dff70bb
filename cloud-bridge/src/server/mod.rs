//! The QUIC side: accepts edges with verified client certificates, runs one session per
//! connection, writes released batches to the sink in order and acks what it committed.
//! What a session does is [`core`]'s, without I/O; [`session`] drives it on the connection.

pub mod config;
pub mod core;
pub mod metrics;
mod session;
mod traced;
pub(crate) mod trust;
mod writes;

use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::crypto::rustls::QuicServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::CertificateDer;
use shared::proto::io::FrameIoError;
use shared::proto::{ALPN, close};
use tokio_util::sync::CancellationToken;

use crate::fleet::{Presence, Recorder};
use crate::ingest;
use crate::limits::{Admission, Budget, ConnectionBudget, LogBudget};
use crate::models::serve::ModelService;
use crate::sink::Sink;
use config::ServerConfig;
use metrics::{ReasonLabel, SessionMetrics as Metrics};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error(transparent)]
    Tls(#[from] shared::tls::TlsError),
    #[error("QUIC TLS setup: {0}")]
    Quic(String),
    #[error("cannot bind UDP {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Why a session ended, for the log and the `sessions_closed` metric.
#[derive(Debug, thiserror::Error)]
enum SessionEnd {
    #[error("the edge closed the session")]
    Closed,
    #[error("connection lost: {0}")]
    Connection(#[from] quinn::ConnectionError),
    #[error("control stream: {0}")]
    Frame(#[from] FrameIoError),
    #[error(transparent)]
    Session(#[from] shared::proto::edge::SessionError),
    #[error(transparent)]
    Sink(#[from] crate::sink::SinkError),
    #[error("bridge shutting down")]
    Shutdown,
    #[error("replaced by a newer connection of this edge")]
    Replaced,
    #[error("its certificate was put on the deny list (server.deny_serials, reloaded)")]
    Denied,
    #[error("its certificate expired (notAfter) during the session")]
    Expired,
    #[error(transparent)]
    Ingest(#[from] ingest::IngestError),
    #[error("control frame memory: {0}")]
    ControlMemory(crate::limits::BudgetError),
    #[error("held batches ahead of a missing one for {0:?}")]
    Stalled(Duration),
}

impl From<core::CoreError> for SessionEnd {
    fn from(e: core::CoreError) -> Self {
        match e {
            core::CoreError::Refused { error, .. } | core::CoreError::Session(error) => SessionEnd::Session(error),
            core::CoreError::Sink(e) => SessionEnd::Sink(e),
            core::CoreError::Stalled(d) => SessionEnd::Stalled(d),
        }
    }
}

impl SessionEnd {
    /// Why reading the control stream failed, as the session's end.
    fn control(e: ingest::IngestError) -> Self {
        match e {
            ingest::IngestError::Frame(e) => SessionEnd::Frame(e),
            ingest::IngestError::Batch(e) => SessionEnd::Frame(e.into()),
            ingest::IngestError::Budget(e) => SessionEnd::ControlMemory(e),
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            SessionEnd::Closed => "closed",
            SessionEnd::Connection(_) => "connection",
            SessionEnd::Frame(_) | SessionEnd::Session(_) => "protocol",
            SessionEnd::Ingest(ingest::IngestError::Budget(_))
            | SessionEnd::ControlMemory(_)
            | SessionEnd::Stalled(_) => "stalled",
            SessionEnd::Ingest(_) => "protocol",
            SessionEnd::Sink(_) => "sink",
            SessionEnd::Shutdown => "shutdown",
            SessionEnd::Replaced => "replaced",
            SessionEnd::Denied => "denied_serial",
            SessionEnd::Expired => "certificate_expired",
        }
    }
}

/// The QUIC endpoint for edges: TLS 1.3, ALPN ehb/1, client certificates from the fleet CA.
pub fn endpoint(
    config: &ServerConfig,
    limits: impl FnOnce(&mut quinn::TransportConfig),
) -> Result<quinn::Endpoint, ServerError> {
    let key = shared::tls::load_key(&config.key)?;
    let (reset, cids) = (reset_key(&key), cid_key(&key));
    let server = server_config(config, limits)?;
    let socket =
        std::net::UdpSocket::bind(config.bind).map_err(|source| ServerError::Bind { addr: config.bind, source })?;
    socket_buffers(&socket, config.socket_buffer.0);
    let runtime = quinn::default_runtime().ok_or_else(|| ServerError::Quic("no async runtime".into()))?;
    let mut endpoint_config = quinn::EndpointConfig::new(Arc::new(reset));
    // quinn sends at most one reset per `min_reset_interval` (20 ms by default), and its
    // endpoint driver gives every datagram of one receive batch the same `now`, so any interval
    // at all leaves one reset per batch: after a restart, most of a fleet's keep-alives went
    // unanswered and those edges waited out their 15 s idle timeout (half of 10,000). No limit,
    // then: a reset is always smaller than the packet that caused it, so it reflects fewer
    // bytes than come in, and costs less than receiving them.
    endpoint_config.min_reset_interval(Duration::ZERO);
    // quinn drops packets whose connection id its generator did not make, before any reset,
    // and its default generator's key is random: a restarted bridge would reset nothing.
    endpoint_config.cid_generator(move || Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cids)));
    quinn::Endpoint::new(endpoint_config, Some(server), socket, runtime)
        .map_err(|source| ServerError::Bind { addr: config.bind, source })
}

/// What a handshake is made with: the bridge's certificate and key, the fleet CA edges' client
/// certificates must chain to, and the transport limits. Built at start and again at a reload
/// (`trust::reload`).
fn server_config(
    config: &ServerConfig,
    limits: impl FnOnce(&mut quinn::TransportConfig),
) -> Result<quinn::ServerConfig, ServerError> {
    let provider = shared::tls::provider();
    let roots = Arc::new(shared::tls::load_roots(&config.client_ca)?);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| ServerError::Quic(format!("fleet CA {}: {e}", config.client_ca.display())))?;
    let key = shared::tls::load_key(&config.key)?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| ServerError::Quic(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(shared::tls::load_certs(&config.cert)?, key)
        .map_err(|e| {
            ServerError::Quic(format!("{} does not fit {}: {e}", config.key.display(), config.cert.display()))
        })?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    // No resumption: a resumed handshake takes the client certificate from the first one,
    // without checking it again against the CA, its dates or the deny list.
    tls.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    tls.send_tls13_tickets = 0;
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| ServerError::Quic(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(Duration::from_secs(30).try_into().map_err(|_| ServerError::Quic("idle".into()))?));
    // What edges may take (`limits`): streams, windows, memory.
    limits(&mut transport);
    transport.congestion_controller_factory(config.congestion.factory());
    server.transport_config(Arc::new(transport));
    Ok(server)
}

/// Asks for `bytes` of UDP receive and send buffer on `socket` and logs what the kernel gave
/// (it caps both at `net.core.rmem_max` / `wmem_max`).
fn socket_buffers(socket: &std::net::UdpSocket, bytes: u64) {
    let sock = socket2::SockRef::from(socket);
    let want = usize::try_from(bytes).unwrap_or(usize::MAX);
    let _ = sock.set_recv_buffer_size(want);
    let _ = sock.set_send_buffer_size(want);
    // Linux reports twice what it grants (the other half is its bookkeeping).
    let (recv, send) = (sock.recv_buffer_size().unwrap_or(0) / 2, sock.send_buffer_size().unwrap_or(0) / 2);
    if recv < want || send < want {
        tracing::warn!(
            wanted = want,
            recv,
            send,
            "UDP socket buffers below server.socket_buffer: raise net.core.rmem_max and wmem_max, or a reconnect \
             storm's handshakes are dropped by the kernel and time out"
        );
    } else {
        tracing::debug!(recv, send, "UDP socket buffers");
    }
}

/// QUIC's stateless reset key, derived from the bridge's TLS key. A bridge restarted with the
/// same key (or another behind the same name with it) answers packets of connections it does
/// not know with a reset their edges trust, so they reconnect at once instead of after their
/// idle timeout (15 s); with a random key, as quinn's default, the reset is ignored.
fn reset_key(key: &rustls_pki_types::PrivateKeyDer<'_>) -> ring::hmac::Key {
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, derived(key, "stateless reset key").as_ref())
}

/// The key of the connection ids the bridge issues, derived the same way, so that a restarted
/// bridge recognises its own ids and answers them with a reset.
fn cid_key(key: &rustls_pki_types::PrivateKeyDer<'_>) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&derived(key, "connection id key").as_ref()[..8]);
    u64::from_le_bytes(first)
}

/// A secret for `label` that only holders of the TLS key can make: SHA-256 over both.
fn derived(key: &rustls_pki_types::PrivateKeyDer<'_>, label: &str) -> ring::digest::Digest {
    let mut input = format!("ehb/1 {label}\0").into_bytes();
    input.extend_from_slice(key.secret_der());
    ring::digest::digest(&ring::digest::SHA256, &input)
}

/// What the accept loop admits and what its connections may hold.
#[derive(Debug)]
pub(crate) struct Limits {
    pub admission: Admission,
    pub budget: Budget,
    pub stall: Duration,
    pub log: Arc<LogBudget>,
}

/// Where sessions go besides the sink: the model service, if any, and the fleet view.
#[derive(Debug, Clone)]
pub(crate) struct Services {
    pub models: Option<Arc<ModelService>>,
    pub fleet: Arc<Recorder>,
    /// `sink commit` spans of traced records (`[tracing]`).
    pub tracer: shared::trace::Tracer,
    /// Messages for the edges (`[downlink]`).
    pub downlink: Arc<crate::downlink::Downlink>,
    /// The Confluent framing written before records of `[registry] frame_classes`.
    pub framer: Option<Arc<crate::schemas::frame::Framer>>,
}

/// Accepts edges until `shutdown`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn accept_loop<S: Sink>(
    endpoint: quinn::Endpoint,
    config: Arc<ServerConfig>,
    trust: Arc<trust::Trust>,
    mut limits: Limits,
    sink: Arc<S>,
    services: Services,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: tokio_util::task::TaskTracker,
) {
    metrics.accepting.store(true, std::sync::atomic::Ordering::Relaxed);
    loop {
        let incoming = tokio::select! {
            _ = shutdown.cancelled() => break,
            incoming = endpoint.accept() => match incoming {
                Some(i) => i,
                None => break,
            },
        };
        // Checked on the first packet, before any TLS work: a reconnect storm is refused
        // cheaply, and the edges come back after their backoff.
        let admitted = match limits.admission.admit(incoming.remote_address().ip(), Instant::now()) {
            Ok(a) => a,
            Err(reason) => {
                refuse(&metrics, reason);
                tracing::debug!(remote = %incoming.remote_address(), reason, "edge connection refused before its handshake");
                incoming.refuse();
                continue;
            }
        };
        let (config, sink, metrics, shutdown) = (config.clone(), sink.clone(), metrics.clone(), shutdown.clone());
        let (services, trust) = (services.clone(), trust.clone());
        let (budget, stall, log) = (limits.budget.connection(), limits.stall, limits.log.clone());
        tasks.spawn(async move {
            let mut admitted = admitted;
            let remote = incoming.remote_address();
            let handshake = match tokio::time::timeout(shared::proto::BRIDGE_HANDSHAKE_TIMEOUT, incoming).await {
                Ok(done) => done.map_err(|e| e.to_string()),
                Err(_) => Err(format!("timed out after {:?}", shared::proto::BRIDGE_HANDSHAKE_TIMEOUT)),
            };
            admitted.handshake_done();
            let conn = match handshake {
                Ok(c) => c,
                Err(e) => {
                    refuse(&metrics, "handshake");
                    if let Some(held_back) = log.allow() {
                        tracing::warn!(%remote, error = %e, held_back, "edge handshake failed");
                    }
                    return;
                }
            };
            let Some(cert) = peer_cert(&conn) else {
                refuse(&metrics, "no_identity");
                conn.close(close::NO_IDENTITY.into(), b"no client certificate");
                return;
            };
            let Some(edge) = shared::tls::certificate_identity(&cert) else {
                refuse(&metrics, "no_identity");
                if let Some(held_back) = log.allow() {
                    tracing::warn!(%remote, held_back, "edge certificate names no edge (no DNS name, no CN)");
                }
                conn.close(close::NO_IDENTITY.into(), b"certificate names no edge");
                return;
            };
            // Before the deny list: a denied certificate that keeps calling cools its address
            // down like any other.
            if let Err(reason) = admitted.identified(&edge, Instant::now()) {
                refuse(&metrics, reason);
                if let Some(held_back) = log.allow() {
                    tracing::warn!(%remote, edge, held_back, "edge refused: its certificate starts sessions faster than limits.edge_handshakes_per_minute");
                }
                conn.close(close::TOO_OFTEN.into(), b"too many sessions started with this certificate");
                return;
            }
            let serial = shared::tls::certificate_serial(&cert).unwrap_or_default();
            if trust.denied(&serial) {
                refuse(&metrics, "denied_serial");
                if let Some(held_back) = log.allow() {
                    tracing::warn!(%remote, edge, serial, held_back, "edge certificate is on the deny list");
                }
                conn.close(close::DENIED.into(), b"certificate denied");
                return;
            }
            // TLS checks the validity only at the handshake (and there is no resumption to
            // skip it): the session ends when the certificate does.
            let expires = shared::tls::certificate_expiry(&cert);
            let claim = trust.claim(&edge, &serial);
            let session = SessionLimits { max_held: config.max_held, budget, stall, log };
            serve_edge(conn, &edge, session, sink, services, &metrics, shutdown, &claim, expires).await;
            trust.release(&edge, claim.ticket);
        });
    }
    metrics.accepting.store(false, std::sync::atomic::Ordering::Relaxed);
    endpoint.close(close::DONE.into(), b"bridge shutting down");
    // The socket is released once every connection is gone.
    endpoint.wait_idle().await;
}

/// Waits until `expires` (forever without one; at once if it passed).
async fn until_expiry(expires: Option<std::time::SystemTime>) {
    match expires {
        Some(at) => {
            let left = at.duration_since(std::time::SystemTime::now()).unwrap_or_default();
            tokio::time::sleep(left).await;
        }
        None => std::future::pending().await,
    }
}

fn refuse(metrics: &Metrics, reason: &'static str) {
    metrics.refused.get_or_create(&ReasonLabel { reason }).inc();
}

fn peer_cert(conn: &quinn::Connection) -> Option<CertificateDer<'static>> {
    let certs = conn.peer_identity()?.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    certs.first().cloned()
}

/// What one session may hold.
struct SessionLimits {
    max_held: usize,
    budget: ConnectionBudget,
    stall: Duration,
    log: Arc<LogBudget>,
}

#[allow(clippy::too_many_arguments)]
async fn serve_edge<S: Sink>(
    conn: quinn::Connection,
    edge: &str,
    limits: SessionLimits,
    sink: Arc<S>,
    services: Services,
    metrics: &Metrics,
    shutdown: CancellationToken,
    claim: &trust::Claim,
    expires: Option<std::time::SystemTime>,
) {
    metrics.connected.inc();
    let log = limits.log.clone();
    if let Some(held_back) = log.allow() {
        tracing::info!(edge, remote = %conn.remote_address(), held_back, "edge connected");
    }
    let mut presence = Presence::new(services.fleet.clone(), edge, conn.remote_address());
    // What this session added to the bridge's lag gauge, taken back when it ends.
    let mut lag = 0;
    let end = tokio::select! {
        end = session::run(&conn, edge, limits, &*sink, &services, metrics, &mut presence, &mut lag) => {
            end.err().unwrap_or(SessionEnd::Closed)
        }
        _ = shutdown.cancelled() => SessionEnd::Shutdown,
        _ = claim.ended.cancelled() => if claim.denied() { SessionEnd::Denied } else { SessionEnd::Replaced },
        _ = until_expiry(expires) => SessionEnd::Expired,
    };
    presence.ended();
    metrics.lag.dec_by(lag);
    metrics.connected.dec();
    metrics.closed.get_or_create(&ReasonLabel { reason: end.reason() }).inc();
    if let Some(held_back) = log.allow() {
        match &end {
            SessionEnd::Closed | SessionEnd::Shutdown => tracing::info!(edge, held_back, "edge session ended: {end}"),
            _ => tracing::warn!(edge, held_back, "edge session ended: {end}"),
        }
    }
    let code = match end {
        SessionEnd::Replaced => close::REPLACED,
        SessionEnd::Denied | SessionEnd::Expired => close::DENIED,
        _ => close::DONE,
    };
    conn.close(code.into(), end.to_string().as_bytes());
}
