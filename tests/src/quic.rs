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

/// Opens the control stream with a hello for `epoch` and waits for the welcome.
pub async fn welcomed(conn: &quinn::Connection, epoch: &str) -> (quinn::SendStream, quinn::RecvStream) {
    use shared::proto::{Control, Hello, codec};
    let hello = Control::Hello(Hello {
        versions: shared::proto::VERSIONS.to_vec(),
        epoch: epoch.into(),
        lanes: vec![],
        models: vec![],
        dicts: vec![],
        caps: vec![],
    });
    let (mut send, mut recv) = conn.open_bi().await.expect("control stream");
    send.write_all(&codec::encode(&hello).expect("encode hello")).await.expect("send hello");
    let welcome: Control = shared::proto::io::read_frame(&mut recv, shared::proto::MAX_CONTROL_FRAME)
        .await
        .expect("read welcome")
        .expect("a welcome");
    assert!(matches!(welcome, Control::Welcome(_)), "{welcome:?}");
    (send, recv)
}

/// The CBOR of one record holding `pairs` empty user properties, written piece by piece (the
/// caller must not hold the decoded form it attacks with): 3 bytes a pair, 48 decoded.
pub fn empty_pairs_record(pairs: u32) -> Vec<u8> {
    use shared::proto::{WireMessage, WireRecord};
    let one = vec![WireRecord {
        seq: 1,
        message: Some(WireMessage {
            class: "telemetry".into(),
            topic: "t".into(),
            payload: Vec::new(),
            qos: 0,
            enqueued_ms: 0,
            expires_ms: None,
            user_properties: vec![(String::new(), String::new())],
            correlation_data: None,
            content_type: None,
        }),
        gap: None,
    }];
    let mut raw = Vec::new();
    ciborium::into_writer(&one, &mut raw).expect("encode a record");
    // The properties are the record's last field: an array of one pair, `81 82 60 60`.
    assert_eq!(&raw[raw.len() - 4..], &[0x81, 0x82, 0x60, 0x60]);
    raw.truncate(raw.len() - 4);
    raw.push(0x9a);
    raw.extend(pairs.to_be_bytes());
    raw.reserve(pairs as usize * 3);
    for _ in 0..pairs {
        raw.extend([0x82, 0x60, 0x60]);
    }
    raw
}

/// A zstd batch (lane 0, seq 1) of `raw` CBOR records.
pub fn zstd_batch(raw: &[u8]) -> shared::proto::Batch {
    shared::proto::Batch {
        epoch: String::new(),
        lane: 0,
        first_seq: 1,
        last_seq: 1,
        codec: shared::proto::Codec::Zstd,
        dict: None,
        raw_len: raw.len() as u64,
        body: zstd::bulk::compress(raw, 3).expect("zstd"),
    }
}
