//! A raw ehb/1 client for tests that must send what a well-behaved edge never would.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use quinn::crypto::rustls::QuicClientConfig;
use shared::proto::{Lane, Seq};

/// Connects to a bridge with the given client certificate; the error as text if refused.
pub async fn connect(addr: SocketAddr, ca: &Path, cert: &Path, key: &Path) -> Result<quinn::Connection, String> {
    connect_from(std::net::Ipv4Addr::LOCALHOST.into(), addr, ca, cert, key).await
}

/// [`connect`] from another local address (any of 127.0.0.0/8 is loopback): the bridge sees
/// another host.
pub async fn connect_from(
    from: std::net::IpAddr,
    addr: SocketAddr,
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> Result<quinn::Connection, String> {
    connect_with(from, addr, ca, cert, key, quinn::TransportConfig::default()).await
}

/// [`connect`] with a receive window of 16 KiB a stream: an edge that means to hold what the
/// bridge sends it unread.
pub async fn connect_tight(addr: SocketAddr, ca: &Path, cert: &Path, key: &Path) -> Result<quinn::Connection, String> {
    let mut transport = quinn::TransportConfig::default();
    transport.stream_receive_window(quinn::VarInt::from_u32(16 << 10));
    transport.receive_window(quinn::VarInt::from_u32(256 << 10));
    connect_with(std::net::Ipv4Addr::LOCALHOST.into(), addr, ca, cert, key, transport).await
}

async fn connect_with(
    from: std::net::IpAddr,
    addr: SocketAddr,
    ca: &Path,
    cert: &Path,
    key: &Path,
    transport: quinn::TransportConfig,
) -> Result<quinn::Connection, String> {
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
    let mut endpoint = quinn::Endpoint::client(SocketAddr::new(from, 0)).map_err(|e| e.to_string())?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    client.transport_config(Arc::new(transport));
    endpoint.set_default_client_config(client);
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
    let (send, recv, answer) = hello(conn, hello_for(epoch)).await;
    assert!(matches!(answer, shared::proto::Control::Welcome(_)), "{answer:?}");
    (send, recv)
}

/// The hello of an edge of this build on `epoch`, naming nothing.
pub fn hello_for(epoch: &str) -> shared::proto::Hello {
    shared::proto::Hello {
        versions: shared::proto::VERSIONS.to_vec(),
        epoch: epoch.into(),
        lanes: vec![],
        models: vec![],
        dicts: vec![],
        caps: vec![],
        down_mark: 0,
        down_window: None,
    }
}

/// Opens the control stream with `hello`; its streams and the bridge's answer (a welcome, or a
/// refusal).
pub async fn hello(
    conn: &quinn::Connection,
    hello: shared::proto::Hello,
) -> (quinn::SendStream, quinn::RecvStream, shared::proto::Control) {
    use shared::proto::{Control, codec};
    let (mut send, mut recv) = conn.open_bi().await.expect("control stream");
    send.write_all(&codec::encode(&Control::Hello(hello)).expect("encode hello")).await.expect("send hello");
    let answer = next_control(&mut recv).await.expect("an answer to the hello");
    (send, recv, answer)
}

/// The next control frame from the bridge, skipping pongs; none once the stream ends.
pub async fn next_control(recv: &mut quinn::RecvStream) -> Option<shared::proto::Control> {
    use shared::proto::Control;
    let read = async {
        loop {
            match shared::proto::io::read_frame(recv, shared::proto::MAX_CONTROL_FRAME).await {
                Ok(Some(Control::Pong { .. })) => continue,
                Ok(frame) => return frame,
                Err(_) => return None,
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), read).await.expect("a control frame in 20 s")
}

/// The CBOR of one record holding `pairs` empty user properties, written piece by piece (the
/// caller must not hold the decoded form it attacks with): 3 bytes a pair, 48 decoded.
pub fn empty_pairs_record(pairs: u32) -> Vec<u8> {
    use shared::proto::{WireMessage, WireRecord};
    let one = vec![WireRecord::message(
        Seq(1),
        WireMessage {
            class: "telemetry".into(),
            topic: "t".into(),
            payload: Vec::new(),
            qos: 0,
            enqueued_ms: 0,
            expires_ms: None,
            user_properties: vec![(String::new(), String::new())],
            correlation_data: None,
            content_type: None,
            schema: None,
        },
    )];
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
        lane: Lane(0),
        first_seq: Seq(1),
        last_seq: Seq(1),
        codec: shared::proto::Codec::Zstd,
        dict: None,
        raw_len: raw.len() as u64,
        body: zstd::bulk::compress(raw, 3).expect("zstd"),
    }
}
