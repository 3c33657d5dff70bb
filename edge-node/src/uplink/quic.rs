//! The uplink's QUIC client: TLS 1.3, ALPN ehb/1, the edge's client certificate, the bridge
//! verified against the configured CA. Built at start, so a bad file stops the node with the
//! file's name instead of failing every reconnect.

use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicClientConfig;
use shared::proto::ALPN;
use shared::tls::TlsError;

use super::UplinkConfig;
use super::core::EndKind;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UplinkSetupError {
    #[error("uplink: {0}")]
    Tls(#[from] TlsError),
    #[error("uplink: client certificate {cert}: {reason}")]
    ClientCert { cert: String, reason: String },
    #[error("uplink: QUIC setup: {0}")]
    Quic(String),
}

pub fn client_config(config: &UplinkConfig) -> Result<quinn::ClientConfig, UplinkSetupError> {
    let provider = shared::tls::provider();
    let roots = shared::tls::load_roots(&config.ca)?;
    let certs = shared::tls::load_certs(&config.cert)?;
    let key = shared::tls::load_key(&config.key)?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| UplinkSetupError::Quic(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| UplinkSetupError::ClientCert { cert: config.cert.display().to_string(), reason: e.to_string() })?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = QuicClientConfig::try_from(tls).map_err(|e| UplinkSetupError::Quic(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    // The session pings every `uplink.keepalive` (5 s), which keeps NAT bindings open and
    // tells a dead path (`ack_timeout`, probes); a QUIC keep-alive only fills a longer gap, under
    // the idle timeout. At 2 s, as before, an idle edge sent twice the packets it needs: for
    // 10,000 edges 5,000 more PINGs and 5,000 ACKs a second at the bridge.
    transport.keep_alive_interval(Some(config.keepalive.0.clamp(Duration::from_secs(1), Duration::from_secs(10))));
    transport.max_idle_timeout(Some(
        Duration::from_secs(15).try_into().map_err(|_| UplinkSetupError::Quic("idle timeout".into()))?,
    ));
    transport.congestion_controller_factory(config.congestion.factory());
    client.transport_config(Arc::new(transport));
    Ok(client)
}

/// The name to verify the certificate of the bridge at `server` (`host:port`) against.
pub(crate) fn server_name(config: &UplinkConfig, server: &str) -> String {
    config.server_name.clone().unwrap_or_else(|| {
        let host = server.rsplit_once(':').map_or(server, |(h, _)| h);
        host.trim_start_matches('[').trim_end_matches(']').to_owned()
    })
}

/// Why a pass's batches could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    #[error("connection lost: {0}")]
    Connection(#[from] quinn::ConnectionError),
    #[error("stream: {0}")]
    Write(#[from] quinn::WriteError),
    #[error("stream closed: {0}")]
    Closed(#[from] quinn::ClosedStream),
    #[error(transparent)]
    Frame(#[from] shared::proto::io::FrameIoError),
    #[error("batch: {0}")]
    Encode(#[from] shared::proto::ProtoError),
}

/// One pass's batches as the uplink writes them: a full batch on a stream of its own, so a lost
/// packet holds up only that batch when the link is busy; partial ones together on one stream
/// when the pass ends, one STREAM frame and one datagram instead of one per lane. From version
/// 4 a batch is its head and its body as it is (`batch_frame`): the body is not copied into
/// an envelope first.
#[derive(Debug)]
pub struct PassWriter {
    version: u16,
    small: Vec<u8>,
}

impl PassWriter {
    /// Writes batches for a session of `version` (`EdgeSession::version`).
    pub fn new(version: u16) -> Self {
        Self { version, small: Vec::new() }
    }

    /// Sends `batch` (a full one on a stream of its own, others gathered); returns its frame's
    /// bytes, head and body.
    pub async fn batch(
        &mut self,
        conn: &quinn::Connection,
        batch: &shared::proto::Batch,
        full: bool,
    ) -> Result<usize, SendError> {
        use shared::proto::batch_frame;
        let bytes = match (full, self.version >= batch_frame::BINARY_SINCE) {
            (true, true) => {
                let mut stream = conn.open_uni().await?;
                let head = batch_frame::head(batch, self.version)?;
                stream.write_all(&head).await?;
                stream.write_all(&batch.body).await?;
                stream.finish()?;
                head.len() + batch.body.len()
            }
            (true, false) => {
                let mut stream = conn.open_uni().await?;
                let frame = shared::proto::codec::encode(batch)?;
                stream.write_all(&frame).await?;
                stream.finish()?;
                frame.len()
            }
            (false, _) => {
                let frame = batch_frame::encode(batch, self.version)?;
                self.small.extend_from_slice(&frame);
                frame.len()
            }
        };
        Ok(bytes)
    }

    /// Writes the partial batches of the pass.
    pub async fn finish(self, conn: &quinn::Connection) -> Result<(), SendError> {
        if !self.small.is_empty() {
            let mut stream = conn.open_uni().await?;
            stream.write_all(&self.small).await?;
            stream.finish()?;
        }
        Ok(())
    }
}

/// What a handshake that failed with `e` means for the next attempt.
pub fn end_of_handshake(e: &quinn::ConnectionError) -> EndKind {
    match e {
        quinn::ConnectionError::ConnectionClosed(close)
            if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED =>
        {
            EndKind::Busy
        }
        // A TLS alert in the handshake: the bridge did not accept our certificate. Other
        // closes in the handshake (a bridge giving up one that took too long in a storm) are
        // failures, not refusals that wait out backoff_max.
        quinn::ConnectionError::ConnectionClosed(close) if shared::proto::is_tls_alert(close.error_code.into()) => {
            EndKind::Refused
        }
        _ => EndKind::Failed,
    }
}

/// What an established connection that ended with `e` means for the next attempt.
pub fn end_of_connection(e: &quinn::ConnectionError) -> EndKind {
    match e {
        // The bridge's refusals: no usable identity, a denied certificate, replaced by a newer
        // connection with this certificate.
        quinn::ConnectionError::ApplicationClosed(close)
            if shared::proto::close::is_refusal(u64::from(close.error_code)) =>
        {
            EndKind::Refused
        }
        _ => EndKind::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handshake_end_is_busy_only_before_tls_and_refused_only_on_a_tls_alert() {
        let closed = |code| {
            quinn::ConnectionError::ConnectionClosed(quinn::ConnectionClose {
                error_code: code,
                frame_type: None,
                reason: Default::default(),
            })
        };
        // bad_certificate (42) and certificate_revoked (44) as QUIC CRYPTO_ERRORs (RFC 9001 §4.8).
        for alert in [42, 44] {
            assert_eq!(end_of_handshake(&closed(quinn::TransportErrorCode::crypto(alert))), EndKind::Refused);
        }
        assert_eq!(end_of_handshake(&closed(quinn::TransportErrorCode::CONNECTION_REFUSED)), EndKind::Busy);
        // A bridge that gave the handshake up, or any other close: retried on the short backoff.
        for other in [quinn::TransportErrorCode::PROTOCOL_VIOLATION, quinn::TransportErrorCode::INTERNAL_ERROR] {
            assert_eq!(end_of_handshake(&closed(other)), EndKind::Failed);
        }
        assert_eq!(end_of_handshake(&quinn::ConnectionError::TimedOut), EndKind::Failed);
        let app = |code: u32| {
            quinn::ConnectionError::ApplicationClosed(quinn::ApplicationClose {
                error_code: code.into(),
                reason: Default::default(),
            })
        };
        for (code, kind) in [(0, EndKind::Failed), (1, EndKind::Refused), (2, EndKind::Refused), (3, EndKind::Refused)]
        {
            assert_eq!(end_of_connection(&app(code)), kind, "close code {code}");
        }
        assert_eq!(end_of_connection(&app(4)), EndKind::Failed);
    }
}
