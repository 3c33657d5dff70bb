//! The bridge against hostile or broken peers: a certificate from another CA, frames over the
//! size limit, malformed CBOR, a zstd bomb, an unknown protocol version. Each closes that one
//! connection with a reason naming the problem; the bridge keeps serving the real edge, and
//! nothing it already acked is lost. An edge's id is its certificate's, whatever it sends.

use std::time::Duration;

use e2e_tests::certs::Ca;
use e2e_tests::client::Client;
use e2e_tests::cloud::{Status, TestCloud, pki, sink_rows};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::node::TestNode;
use e2e_tests::quic;
use rumqttc::QoS;
use shared::proto::{Batch, Codec, Control, Hello, codec};
use shared::proto::{Lane, Seq};

const WAIT: Duration = Duration::from_secs(20);

fn classes_toml() -> String {
    with_spool(&[telemetry()])
}

fn hello(versions: Vec<u16>) -> Control {
    Control::Hello(Hello {
        versions,
        epoch: "00112233445566778899aabbccddeeff".into(),
        lanes: vec![],
        models: vec![],
        dicts: vec![],
        caps: vec![],
        down_mark: 0,
        down_window: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_peers_are_cut_off_one_by_one_while_the_real_edge_flows() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), "").await;
    let addr = cloud.bridge.quic_addr();
    let edge = TestNode::start(&format!("{}\n{}", classes_toml(), cloud.uplink_section("edge-1"))).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    for i in 0..50 {
        publisher.publish(&format!("telemetry/a/{i}"), QoS::AtLeastOnce, false, "before").await;
    }
    assert!(e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 50).await);
    let (_, cert2, key2) = keys.edges.iter().find(|(id, _, _)| id == "edge-2").unwrap().clone();

    // A client certificate from another CA never gets a session.
    let other = Ca::new(dir.path(), "rogue");
    let rogue = other.client(dir.path(), "edge-1");
    let refused = quic::connect(addr, &keys.ca, &rogue.cert, &rogue.key).await;
    assert!(refused.is_err(), "a certificate from another CA was accepted");
    let handshake = "bridge_connections_refused_total{reason=\"handshake\"}";
    assert!(
        e2e_tests::eventually(WAIT, || cloud.metric(handshake) >= 1.0).await,
        "{}",
        cloud.bridge.metrics().encode()
    );

    // A frame announcing more than the limit: refused on the length alone.
    let conn = quic::connect(addr, &keys.ca, &cert2, &key2).await.unwrap();
    let reason = quic::send_control_and_wait_close(&conn, &u32::MAX.to_be_bytes()).await;
    assert!(reason.contains(&format!("over the {} byte limit", shared::proto::MAX_EDGE_CONTROL_FRAME)), "{reason}");

    // Malformed CBOR.
    let conn = quic::connect(addr, &keys.ca, &cert2, &key2).await.unwrap();
    let reason = quic::send_control_and_wait_close(&conn, &[0, 0, 0, 3, 0xff, 0x00, 0x13]).await;
    assert!(reason.contains("malformed CBOR frame"), "{reason}");

    // A version this bridge does not speak: refused with both lists named.
    let conn = quic::connect(addr, &keys.ca, &cert2, &key2).await.unwrap();
    let unknown = shared::proto::VERSIONS.iter().max().unwrap() + 1;
    let reason = quic::send_control_and_wait_close(&conn, &codec::encode(&hello(vec![unknown])).unwrap()).await;
    let want =
        format!("no common protocol version: this side speaks {:?}, the peer [{unknown}]", shared::proto::VERSIONS);
    assert!(reason.contains(&want), "{reason}");

    // A zstd bomb in a batch, after a proper hello.
    let conn = quic::connect(addr, &keys.ca, &cert2, &key2).await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&codec::encode(&hello(vec![1])).unwrap()).await.unwrap();
    let welcome: Control =
        shared::proto::io::read_frame(&mut recv, shared::proto::MAX_CONTROL_FRAME).await.unwrap().unwrap();
    assert!(matches!(welcome, Control::Welcome(_)), "{welcome:?}");
    let bomb = Batch {
        epoch: "00112233445566778899aabbccddeeff".into(),
        lane: Lane(0),
        first_seq: Seq(1),
        last_seq: Seq(1),
        codec: Codec::Zstd,
        dict: None,
        raw_len: 10,
        body: zstd::bulk::compress(&vec![0u8; 96 << 20], 19).unwrap(),
    };
    let mut uni = conn.open_uni().await.unwrap();
    uni.write_all(&codec::encode(&bomb).unwrap()).await.unwrap();
    uni.finish().unwrap();
    let reason = tokio::time::timeout(WAIT, conn.closed()).await.unwrap().to_string();
    // The bridge reserves the declared length and decompresses no more than that.
    assert!(reason.contains("more bytes of output where the batch declares 10"), "{reason}");

    // The real edge was never disturbed, and nothing acked is lost.
    for i in 0..50 {
        publisher.publish(&format!("telemetry/b/{i}"), QoS::AtLeastOnce, false, "after").await;
    }
    assert!(e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 100).await);
    let rows = sink_rows(&cloud.sink);
    assert!(rows.iter().all(|r| r.edge == "edge-1"), "nothing written by the hostile peers");
    assert_eq!(cloud.metric("bridge_edges_connected"), 1.0, "the real edge only");
    assert!(cloud.metric("bridge_sessions_closed_total{reason=\"protocol\"}") >= 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_writes_only_under_its_own_certificate_id() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let cloud = TestCloud::start(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), "").await;
    // Two edges with the same node_id in their configs: the protocol carries no id at all, the
    // bridge takes it from each certificate.
    let one = TestNode::start(&format!("{}\n{}", classes_toml(), cloud.uplink_section("edge-1"))).await;
    let two = TestNode::start(&format!("{}\n{}", classes_toml(), cloud.uplink_section("edge-2"))).await;
    let mut clients = Vec::new();
    for (node, tag) in [(&one, "one"), (&two, "two")] {
        let c = Client::anonymous(node.local(), tag).await;
        for i in 0..20 {
            c.publish(&format!("telemetry/{tag}/{i}"), QoS::AtLeastOnce, false, tag).await;
        }
        // Kept: dropping a client drops what it has not yet written.
        clients.push(c);
    }
    let all = e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 40).await;
    let rows: Vec<_> = sink_rows(&cloud.sink).into_iter().map(|r| (r.edge, r.topic)).collect();
    assert!(all, "{rows:?}\n{}\n{}", one.metrics(), two.metrics());
    for r in sink_rows(&cloud.sink) {
        let want = if r.payload == b"one" { "edge-1" } else { "edge-2" };
        assert_eq!(r.edge, want, "{:?}", r.topic);
    }
}

/// One live session per edge id: a second connection with the same certificate ends the
/// first (close code 3, counted as `replaced`), so one certificate cannot hold many sessions;
/// the edge's connected gauge follows the live one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_connection_of_an_edge_replaces_the_older_one() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), "").await;
    let addr = cloud.bridge.quic_addr();
    let (_, cert, key) = keys.edges.iter().find(|(id, _, _)| id == "edge-2").unwrap().clone();
    let welcomed = |conn: quinn::Connection| async move {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&codec::encode(&hello(vec![1])).unwrap()).await.unwrap();
        let welcome: Control =
            shared::proto::io::read_frame(&mut recv, shared::proto::MAX_CONTROL_FRAME).await.unwrap().unwrap();
        assert!(matches!(welcome, Control::Welcome(_)), "{welcome:?}");
        (conn, send, recv)
    };
    let (first, _s1, _r1) = welcomed(quic::connect(addr, &keys.ca, &cert, &key).await.unwrap()).await;
    let (second, _s2, _r2) = welcomed(quic::connect(addr, &keys.ca, &cert, &key).await.unwrap()).await;
    let closed = tokio::time::timeout(WAIT, first.closed()).await.expect("the older session is closed");
    match &closed {
        quinn::ConnectionError::ApplicationClosed(c) => assert_eq!(u64::from(c.error_code), 3, "{closed}"),
        other => panic!("closed by {other}"),
    }
    assert!(closed.to_string().contains("replaced by a newer connection"), "{closed}");
    assert!(second.close_reason().is_none(), "the newer session stays");
    assert_eq!(cloud.metric("bridge_sessions_closed_total{reason=\"replaced\"}"), 1.0);
    assert_eq!(cloud.metric("bridge_edges_connected"), 1.0, "the live session only");
    // The older session's end never hides the newer one in the fleet view.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let row = cloud.edge_row("edge-2").expect("edge-2 in the fleet view");
    assert_eq!(row.status, Status::Connected, "{row:?}");
    second.close(0u32.into(), b"done");
    let gone = e2e_tests::eventually(WAIT, || cloud.metric("bridge_edges_connected") == 0.0).await;
    assert!(gone, "{}", cloud.bridge.metrics().encode());
    let ended =
        e2e_tests::eventually(WAIT, || cloud.edge_row("edge-2").is_some_and(|e| e.status == Status::Disconnected))
            .await;
    assert!(ended, "{:?}", cloud.fleet());
}

/// Log lines about single connections are rate-capped: 30 handshakes with a certificate of
/// another CA against `log_lines_per_second = 5` write a line each only while the budget
/// lasts; every other one is counted, and a line written after some were held back says how
/// many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_handshakes_past_the_log_rate_are_counted_not_written() {
    const ATTEMPTS: usize = 30;
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let limits = "[limits]\nlog_lines_per_second = 5\nhandshakes_per_second = 1000\nhandshake_burst = 1000\n";
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), limits).await;
    let rogue = Ca::new(dir.path(), "rogue").client(dir.path(), "edge-1");
    for _ in 0..ATTEMPTS {
        assert!(quic::connect(cloud.bridge.quic_addr(), &keys.ca, &rogue.cert, &rogue.key).await.is_err());
    }
    let refused = "bridge_connections_refused_total{reason=\"handshake\"}";
    assert!(e2e_tests::eventually(WAIT, || cloud.metric(refused) >= ATTEMPTS as f64).await);
    let logs = e2e_tests::captured_logs();
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains("edge handshake failed")).collect();
    let held_back = cloud.metric("bridge_log_lines_suppressed_total") as usize;
    assert_eq!(lines.len() + held_back, ATTEMPTS, "each failure is written or counted: {} + {held_back}", lines.len());
    assert!(held_back > 0 && lines.len() >= 5, "{} written, {held_back} held back", lines.len());
    // Each line says how many were held back before it; together no more than were.
    let said: Vec<usize> = lines
        .iter()
        .map(|l| l.split("held_back=").nth(1).and_then(|v| v.split_whitespace().next()?.parse().ok()).expect(l))
        .collect();
    assert!(said.iter().sum::<usize>() <= held_back, "{said:?} against {held_back}");
}

/// `deny_serials` took effect only after restarting every bridge, and a SIGHUP killed
/// cloud-bridge (no handler; with the unit's `Restart=on-failure` it stayed down). A SIGHUP now
/// re-reads the certificates and the deny list: a reload that cannot be used changes nothing
/// and the bridge serves on; one that denies a serial closes that edge's live session (close
/// code 2, counted `denied_serial`) and refuses its next handshake, while the other edge flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_reloads_the_deny_list_and_closes_the_denied_edges_session() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let sink = format!("kind = \"sqlite\"\npath = \"{}\"\n", dir.path().join("central.db").display());
    let bridge = e2e_tests::fleet::BridgeProcess::start(dir.path(), &keys, &sink, "").unwrap();
    let up = |edge: &str| e2e_tests::cloud::uplink_section(&keys, edge, &[bridge.quic], "");
    let one = TestNode::start(&format!("{}\n{}", classes_toml(), up("edge-1"))).await;
    let two = TestNode::start(&format!("{}\n{}", classes_toml(), up("edge-2"))).await;
    assert!(e2e_tests::eventually(WAIT, || bridge.metric("bridge_edges_connected") == 2.0).await);
    let hup = |pid: u32| {
        assert!(std::process::Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap().success())
    };

    // A config whose certificate is gone: refused, nothing changes, the bridge lives.
    let text = std::fs::read_to_string(bridge.config()).unwrap();
    std::fs::write(bridge.config(), text.replace(&keys.server_cert.display().to_string(), "/nonexistent.pem")).unwrap();
    hup(bridge.pid());
    assert!(e2e_tests::eventually(WAIT, || bridge.stderr().contains("reload refused")).await, "{}", bridge.stderr());
    assert_eq!(bridge.metric("bridge_edges_connected"), 2.0);

    let cert = shared::tls::load_certs(&keys.edges[1].1).unwrap();
    let serial = shared::tls::certificate_serial(&cert[0]).unwrap();
    std::fs::write(bridge.config(), text.replace("[server]\n", &format!("[server]\ndeny_serials = [\"{serial}\"]\n")))
        .unwrap();
    hup(bridge.pid());
    assert!(
        e2e_tests::eventually(WAIT, || bridge.metric("bridge_sessions_closed_total{reason=\"denied_serial\"}") == 1.0)
            .await,
        "{}",
        bridge.stderr()
    );
    assert!(
        e2e_tests::eventually(WAIT, || bridge.metric("bridge_connections_refused_total{reason=\"denied_serial\"}")
            >= 1.0)
        .await
    );
    assert!(e2e_tests::eventually(WAIT, || two.metric("edge_uplink_refused_total") >= 1.0).await, "{}", two.metrics());
    // The other edge flows on the same bridge.
    let publisher = Client::anonymous(one.local(), "pub").await;
    publisher.publish("telemetry/after", QoS::AtLeastOnce, false, "x").await;
    assert!(
        e2e_tests::eventually(WAIT, || one.metric("edge_spool_class_records{class=\"telemetry\"}") == 0.0
            && bridge.metric("bridge_records_total") >= 1.0)
        .await
    );
    assert_eq!(bridge.metric("bridge_edges_connected"), 1.0);
}

/// An edge certificate's session outlived its `notAfter` (dates are checked at the handshake,
/// and a resumed handshake skipped the certificate): the bridge ends the session when the
/// certificate expires (code 2, counted `certificate_expired`) and offers no resumption, so
/// the edge's next handshake with it fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_session_ends_when_its_certificate_expires() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "fleet");
    let server = ca.server(dir.path(), "cloud");
    let short = ca.client_until(dir.path(), "edge-1", Duration::from_secs(5));
    let keys = cloud_bridge::certs::Pki {
        ca: ca.cert_path.clone(),
        server_cert: server.cert,
        server_key: server.key,
        edges: vec![("edge-1".into(), short.cert, short.key)],
    };
    let cloud = TestCloud::start(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), "").await;
    let edge = TestNode::start(&format!("{}\n{}", classes_toml(), cloud.uplink_section("edge-1"))).await;
    assert!(e2e_tests::eventually(WAIT, || cloud.metric("bridge_edges_connected") == 1.0).await);
    let expired = "bridge_sessions_closed_total{reason=\"certificate_expired\"}";
    assert!(e2e_tests::eventually(WAIT, || cloud.metric(expired) == 1.0).await, "{}", cloud.bridge.metrics().encode());
    // Its handshakes fail from now on: the edge stays down, its records spooled.
    assert!(
        e2e_tests::eventually(WAIT, || cloud.metric("bridge_connections_refused_total{reason=\"handshake\"}") >= 1.0)
            .await
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(cloud.metric("bridge_edges_connected"), 0.0);
    assert_eq!(cloud.metric(expired), 1.0, "no session again");
    drop(edge);
}
