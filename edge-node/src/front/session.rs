//! One client connection after accept (and TLS): the CONNECT exchange, then two relays, client
//! to broker and broker to client, run in one task. The upstream relay decides on every PUBLISH
//! and SUBSCRIBE; the downstream relay only frames packets, counts them, and rewrites a SUBACK
//! the upstream relay trimmed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::connect::{self, Refusal};
use super::packet::{self, PacketError, Version, reason};
use super::relay::{End, Shared, Upstream, relay};
use super::{FrontContext, Listener};
use crate::auth::Identity;
use crate::labels::{self, RefusedLabels};

/// How a connection came in.
struct Entry<'a> {
    listener: &'a str,
    anonymous: bool,
    cert_identity: Option<Identity>,
    peer: Option<SocketAddr>,
}

pub(super) async fn run<S>(
    stream: S,
    peer: SocketAddr,
    cert_identity: Option<Identity>,
    listener: &Listener,
    ctx: &Arc<FrontContext>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin,
{
    let entry = Entry { listener: &listener.name, anonymous: listener.anonymous, cert_identity, peer: Some(peer) };
    serve(stream, entry, ctx).await
}

/// Serves an in-process connection as a trusted internal client (the SLO probe), through the
/// same relay as any client.
pub async fn serve_internal<S>(stream: S, ctx: Arc<FrontContext>)
where
    S: AsyncRead + AsyncWrite + Send + Unpin,
{
    let entry = Entry { listener: "_internal", anonymous: false, cert_identity: Some(Identity::Internal), peer: None };
    serve(stream, entry, &ctx).await
}

async fn serve<S>(stream: S, entry: Entry<'_>, ctx: &Arc<FrontContext>)
where
    S: AsyncRead + AsyncWrite + Send + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let refused = |label: &'static str| {
        ctx.metrics
            .connects_refused
            .get_or_create(&RefusedLabels { listener: entry.listener.to_owned(), reason: label })
            .inc();
    };

    let first = tokio::time::timeout(ctx.connect_timeout, read_connect(&mut rd, &mut buf, ctx.max_packet_size)).await;
    let frame = match first {
        Ok(Ok(Some(frame))) => frame,
        Ok(Ok(None)) => return refused("closed_before_connect"),
        Ok(Err(e)) => {
            tracing::info!(listener = entry.listener, peer = ?entry.peer, error = %e, "bad first packet");
            return refused("malformed");
        }
        Err(_) => return refused("timeout"),
    };
    let version = match packet::connect_version(&frame) {
        Ok(v) => v,
        Err(e) => {
            tracing::info!(listener = entry.listener, peer = ?entry.peer, error = %e, "CONNECT refused");
            let mut out = BytesMut::new();
            packet::write_connack_refusal(
                &mut out,
                Version::V311,
                reason::V4_UNACCEPTABLE_VERSION,
                reason::UNSUPPORTED_VERSION,
            );
            let _ = write_flush(&mut wr, &out).await;
            return refused("unsupported_version");
        }
    };
    let refuse = |refusal: Refusal| {
        let mut out = BytesMut::new();
        packet::write_connack_refusal(&mut out, version, refusal.v4_code, refusal.v5_reason);
        refused(refusal.label);
        out
    };

    let permit = if entry.cert_identity == Some(Identity::Internal) {
        None
    } else {
        match ctx.permits.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                tracing::warn!(listener = entry.listener, peer = ?entry.peer, "connection refused: broker.max_connections reached");
                let _ = write_flush(&mut wr, &refuse(connect::MAX_CONNECTIONS)).await;
                return;
            }
        }
    };

    let admitted = match connect::admit(&frame, version, entry.cert_identity.clone(), entry.anonymous, ctx).await {
        Ok(a) => a,
        Err(refusal) => {
            tracing::info!(listener = entry.listener, peer = ?entry.peer, reason = refusal.label, "CONNECT refused");
            let _ = write_flush(&mut wr, &refuse(refusal)).await;
            return;
        }
    };

    let broker = match TcpStream::connect(ctx.broker_addr).await {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "internal broker unreachable");
            let _ = write_flush(
                &mut wr,
                &refuse(Refusal {
                    v4_code: reason::V4_SERVER_UNAVAILABLE,
                    v5_reason: reason::SERVER_UNAVAILABLE,
                    label: "broker_unavailable",
                }),
            )
            .await;
            return;
        }
    };
    let _ = broker.set_nodelay(true);
    let (brd, mut bwr) = broker.into_split();
    if bwr.write_all(&admitted.broker_connect).await.is_err() {
        return refused("broker_unavailable");
    }

    tracing::debug!(listener = entry.listener, peer = ?entry.peer, user = admitted.identity.name(), client_id = %admitted.client_id, ?version, "connected");
    let label = labels::listener_label(entry.listener);
    ctx.metrics.connections_total.get_or_create(&label).inc();
    let open = ctx.metrics.connections.get_or_create(&label).clone();
    open.inc();

    let internal = entry.cert_identity == Some(Identity::Internal);
    let shared = Shared::new(version, internal, ctx);
    let mut up = Upstream::new(admitted, ctx);
    let end = relay(&shared, &mut up, &mut rd, &mut wr, brd, bwr, buf).await;
    match end {
        End::Shutdown => {
            let mut out = BytesMut::new();
            packet::write_disconnect(&mut out, version, reason::SERVER_SHUTTING_DOWN);
            let _ = tokio::time::timeout(Duration::from_secs(1), write_flush(&mut wr, &out)).await;
        }
        End::Violation(label, code) => {
            tracing::info!(listener = entry.listener, peer = ?entry.peer, client_id = %up.client_id, reason = label, "client disconnected");
            ctx.metrics.disconnects.get_or_create(&labels::reason(label)).inc();
            let mut out = BytesMut::new();
            packet::write_disconnect(&mut out, version, code);
            let _ = tokio::time::timeout(Duration::from_secs(1), write_flush(&mut wr, &out)).await;
        }
        End::SlowClient => {
            tracing::warn!(listener = entry.listener, peer = ?entry.peer, client_id = %up.client_id, "slow client disconnected: accepted no data for broker.slow_client_timeout");
            ctx.metrics.disconnects.get_or_create(&labels::reason("slow_client")).inc();
        }
        End::ClientClosed | End::BrokerClosed => {}
    }
    let _ = wr.shutdown().await;
    tracing::debug!(listener = entry.listener, client_id = %up.client_id, ?end, "connection closed");
    open.dec();
    drop(permit);
}

/// Reads until `buf` holds the first frame and splits it off; `Ok(None)` on EOF. Anything
/// that does not start like a CONNECT is refused at its first byte, not after a timeout.
async fn read_connect<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    max: usize,
) -> Result<Option<Bytes>, PacketError> {
    loop {
        if buf.first().is_some_and(|&b| b != packet::CONNECT << 4) {
            return Err(PacketError::Malformed("first packet: not a CONNECT"));
        }
        if let Some(len) = packet::frame_len(buf, max)? {
            return Ok(Some(buf.split_to(len).freeze()));
        }
        match rd.read_buf(buf).await {
            Ok(0) | Err(_) => return Ok(None),
            Ok(_) => {}
        }
    }
}

async fn write_flush<W: AsyncWrite + Unpin>(wr: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    wr.write_all(bytes).await?;
    wr.flush().await
}
