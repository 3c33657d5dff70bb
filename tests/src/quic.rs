//! A raw ehb/1 client for tests that must send what a well-behaved edge never would.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use quinn::crypto::rustls::QuicClientConfig;

/// Connects to a bridge with the given client certificate; the error as text if refused.
pub async fn connect(addr: SocketAddr, ca: &Path, cert: &Path, key: &Path) -> Result<quinn::Connection, String> {
    let roots = shared::tls::load_roots(ca).map_err(|e| e.to_string())?;
    let mut tls = rustls::ClientConfig::builder_with_provider(shared::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(
            shared::tls::load_certs(cert).map_err(|e| e.to_string())?,
            shared::tls::load_key(key).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
    tls.alpn_protocols = vec![shared::proto::ALPN.to_vec()];
    let crypto = QuicClientConfig::try_from(tls).map_err(|e| e.to_string())?;
    let mut endpoint = quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0))).map_err(|e| e.to_string())?;
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    let conn = endpoint.connect(addr, "localhost").map_err(|e| e.to_string())?.await.map_err(|e| e.to_string())?;
    // With TLS 1.3 the server checks the client certificate after the client thinks the
    // handshake is done; a refusal shows up as the connection closing right away.
    match tokio::time::timeout(std::time::Duration::from_millis(300), conn.closed()).await {
        Ok(e) => Err(e.to_string()),
        Err(_) => Ok(conn),
    }
}

/// Sends `bytes` on a new control stream and waits for the connection to close; returns the
/// close reason.
pub async fn send_control_and_wait_close(conn: &quinn::Connection, bytes: &[u8]) -> String {
    let (mut send, _recv) = conn.open_bi().await.expect("control stream");
    send.write_all(bytes).await.expect("write");
    let _ = send.finish();
    tokio::time::timeout(std::time::Duration::from_secs(10), conn.closed())
        .await
        .expect("the bridge closes")
        .to_string()
}
