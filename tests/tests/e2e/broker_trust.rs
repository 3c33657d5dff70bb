//! Trust boundaries on the edge (issue 29), black-box on a real `edge-node` process: what an
//! anonymous client may do to the node's own namespace, and what one packet or one pending
//! connection may cost. The floods sample the process's RSS, so these run in nextest's
//! `serial` group.

use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::node::{EdgeProcess, config_text};
use e2e_tests::raw::{RawClient, connect_v5, connect_v5_will, publish_v5, string, subscribe_v5, varint};
use rumqttc::QoS;

const WAIT: Duration = Duration::from_secs(20);
const MIB: u64 = 1 << 20;

async fn an_ordinary_client_gets_through(edge: &EdgeProcess) {
    let mut c = Client::anonymous(edge.addr("local"), "ordinary").await;
    c.subscribe("ordinary/x", QoS::AtLeastOnce).await;
    c.publish("ordinary/x", QoS::AtLeastOnce, false, "hi").await;
    assert!(c.recv(WAIT).await.is_some(), "an ordinary client's message did not come back");
}

async fn healthy(edge: &EdgeProcess) -> bool {
    e2e_tests::eventually(Duration::from_secs(10), || e2e_tests::health(edge.http.unwrap(), "/healthz").0 == 200).await
}

/// A CONNACK's reason code (MQTT 5).
async fn connack(c: &mut RawClient) -> u8 {
    c.until(2, WAIT).await.expect("CONNACK")[3]
}

/// The probe's client id was predictable: a persistent session squatting it came back at every
/// start and `/healthz` answered 503 from then on. The node's client ids are refused to
/// clients (0x85, counted), and the node stays healthy across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_client_ids_cannot_be_squatted() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_text("");
    let edge = EdgeProcess::start(dir.path(), &config);
    assert!(healthy(&edge).await);
    for id in ["_edge-probe-test-edge", "_edge-models-test-edge", "_edge-anything"] {
        let mut c = RawClient::connect(edge.addr("local")).await.unwrap();
        // Session Expiry Interval: 7 days.
        c.send(&connect_v5(id, false, &[0x11, 0, 0x09, 0x3A, 0x80])).await.unwrap();
        assert_eq!(connack(&mut c).await, 0x85, "{id}");
    }
    assert_eq!(edge.metric("edge_mqtt_connects_refused_total{listener=\"local\",reason=\"client_id_reserved\"}"), 3.0);
    drop(edge);
    let edge = EdgeProcess::start(dir.path(), &config);
    assert!(healthy(&edge).await, "{}", edge.stderr());
    // Still healthy some probe intervals later, with nothing stealing its messages.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(healthy(&edge).await);
}

/// `_edge/` is the node's: no client publishes there, whatever the ACL (here: anonymous, no
/// rules) allows; 0x87, counted as `reserved_topic`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_publishes_into_the_nodes_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text(""));
    let mut c = RawClient::connect(edge.addr("local")).await.unwrap();
    c.send(&connect_v5("forger", true, &[])).await.unwrap();
    assert_eq!(connack(&mut c).await, 0);
    c.send(&publish_v5(b"_edge/probe", 1, 7, false, &[], b"forged")).await.unwrap();
    let puback = c.until(4, WAIT).await.expect("PUBACK");
    assert_eq!((&puback[2..4], puback[4]), (&7u16.to_be_bytes()[..], 0x87));
    assert_eq!(edge.metric("edge_mqtt_publish_refused_total{reason=\"reserved_topic\"}"), 1.0);
    // A will there is refused at CONNECT.
    let mut w = RawClient::connect(edge.addr("local")).await.unwrap();
    w.send(&connect_v5_will("will-forger", true, &[], &[], "_edge/probe", b"forged")).await.unwrap();
    assert_eq!(connack(&mut w).await, 0x87);
}

/// One SUBSCRIBE of 170,000 copies of `t/#` over 1,000 retained messages took the node past
/// 4 GiB in 7 s while other clients stalled: the copies are one subscription, each answered,
/// and the retained messages go once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_subscribe_with_a_filter_170000_times_is_one_subscription() {
    let dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text(""));
    let mut p = RawClient::connect(edge.addr("local")).await.unwrap();
    p.send(&connect_v5("retainer", true, &[])).await.unwrap();
    assert_eq!(connack(&mut p).await, 0);
    let mut stream = Vec::new();
    for i in 0..1000u16 {
        stream.extend(publish_v5(format!("t/{i}").as_bytes(), 1, i + 1, true, &[], &[b'r'; 100]));
    }
    p.send(&stream).await.unwrap();
    for _ in 0..1000 {
        p.until(4, WAIT).await.expect("PUBACK");
    }
    let before = edge.rss();

    let mut s = RawClient::connect(edge.addr("local")).await.unwrap();
    s.send(&connect_v5("copies", true, &[])).await.unwrap();
    assert_eq!(connack(&mut s).await, 0);
    let copies = 170_000;
    let filters = vec!["t/#".to_owned(); copies];
    // QoS 0: the retained messages come without waiting for acknowledgements.
    s.send(&subscribe_v5(1, &filters, 0)).await.unwrap();
    let suback = s.until(9, WAIT).await.expect("SUBACK");
    // Fixed header (1 + 3-byte length), packet id, empty properties, then a code per filter.
    let codes = &suback[suback.len() - copies..];
    assert!(codes.iter().all(|&c| c == 0), "every copy granted QoS 0");
    let mut retained = 0;
    while retained < 1000 {
        let Some(packet) = s.packet(WAIT).await else { break };
        if packet[0] >> 4 == 3 {
            retained += 1;
        }
    }
    assert_eq!(retained, 1000);
    assert!(s.packet(Duration::from_millis(500)).await.is_none(), "each retained message once");
    let grown = edge.rss().saturating_sub(before);
    assert!(grown < 64 * MIB, "RSS grew {} MiB", grown / MIB);
    an_ordinary_client_gets_through(&edge).await;
}

/// Before authentication a CONNECT may be `max_connect_size` (32 KiB), not `max_packet_size`:
/// 1,000 pending connections declaring 1 MiB CONNECTs held a gigabyte for `connect_timeout`
/// and kept real clients out. Each is closed at its header now, counted; a CONNECT within the
/// bound (a 20 KiB will) is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_is_bounded_before_the_login() {
    let dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text(""));
    let before = edge.rss();
    let mut pending = Vec::new();
    for _ in 0..1000 {
        let mut c = RawClient::connect(edge.addr("local")).await.unwrap();
        // A CONNECT header declaring 1 MiB - 1, and its first 16 KiB.
        let mut head = vec![0x10];
        head.extend(varint((1 << 20) - 1));
        head.extend(string(b"MQTT"));
        head.extend([5, 0b10, 0, 0, 0]);
        head.resize(16 * 1024, b'x');
        let _ = c.send(&head).await;
        pending.push(c);
    }
    for c in &mut pending {
        assert!(c.packet(WAIT).await.is_none(), "closed at its header");
    }
    assert_eq!(
        edge.metric("edge_mqtt_connects_refused_total{listener=\"local\",reason=\"connect_too_large\"}"),
        1000.0
    );
    let grown = edge.rss().saturating_sub(before);
    assert!(grown < 64 * MIB, "RSS grew {} MiB", grown / MIB);

    let mut w = RawClient::connect(edge.addr("local")).await.unwrap();
    w.send(&connect_v5_will("big-will", true, &[], &[], "wills/big", &vec![b'w'; 20 * 1024])).await.unwrap();
    assert_eq!(connack(&mut w).await, 0);
    an_ordinary_client_gets_through(&edge).await;
    // The bound is only the CONNECT's: after the login a packet may be `max_packet_size`.
    w.send(&publish_v5(b"big/after", 0, 0, false, &[], &vec![b'p'; 512 * 1024])).await.unwrap();
    w.send(&[0xC0, 0]).await.unwrap();
    assert!(w.until(13, WAIT).await.is_some(), "PINGRESP after a 512 KiB PUBLISH");
}

/// An MQTT 5 UNSUBSCRIBE of `filters`.
fn unsubscribe_v5(pkid: u16, filters: &[&str]) -> Vec<u8> {
    let mut body = pkid.to_be_bytes().to_vec();
    body.push(0);
    for f in filters {
        body.extend(string(f.as_bytes()));
    }
    e2e_tests::raw::frame(0xA2, &body)
}

/// A persistent session with 100 long filters looping UNSUBSCRIBEs took the node from 12 MB to
/// 3.8 GB in 5 s: each queued its whole session record for the store. An UNSUBSCRIBE that
/// changes nothing writes nothing now, and a loop of real changes waits for the store beyond
/// 16 MiB of records instead of queueing them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_unsubscribe_loop_is_bounded_by_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text(""));
    let mut c = RawClient::connect(edge.addr("local")).await.unwrap();
    // Session Expiry Interval: 1 day.
    c.send(&connect_v5("looper", false, &[0x11, 0, 0x01, 0x51, 0x80])).await.unwrap();
    assert_eq!(connack(&mut c).await, 0);
    let long: Vec<String> = (0..100).map(|i| format!("{i}/{}", "x".repeat(1000))).collect();
    c.send(&subscribe_v5(1, &long, 1)).await.unwrap();
    c.until(9, WAIT).await.expect("SUBACK");
    let before = edge.rss();
    let mut peak = before;
    for (round, phase) in ["unknown", "real"].iter().cycle().take(40).enumerate() {
        let mut stream = Vec::new();
        for i in 0..500u16 {
            let pkid = 2 + i;
            if *phase == "unknown" {
                stream.extend(unsubscribe_v5(pkid, &["never/subscribed"]));
            } else if i % 2 == 0 {
                stream.extend(subscribe_v5(pkid, &["flip".to_owned()], 0));
            } else {
                stream.extend(unsubscribe_v5(pkid, &["flip"]));
            }
        }
        c.send(&stream).await.unwrap();
        for _ in 0..500 {
            assert!(c.packet(WAIT).await.is_some(), "round {round}: an answer per packet");
        }
        peak = peak.max(edge.rss());
    }
    let grown = peak.saturating_sub(before);
    assert!(grown < 64 * MIB, "RSS grew {} MiB", grown / MIB);
    an_ordinary_client_gets_through(&edge).await;
}

/// The status line of a WebSocket handshake on `addr` with `origin` (none: not a browser).
async fn ws_handshake(addr: std::net::SocketAddr, origin: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let origin = origin.map(|o| format!("Origin: {o}\r\n")).unwrap_or_default();
    let request = format!(
        "GET /mqtt HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: mqtt\r\n{origin}\r\n"
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(WAIT, s.read(&mut buf)).await.unwrap().unwrap();
    String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_owned()
}

/// Any web page could use a WebSocket listener: `Origin: https://evil.example` got 101 and
/// then CONNACK 0 with `[anonymous]`'s rights. By default only pages of this host are served
/// (403 otherwise, counted as `origin`); clients that send no Origin are not browsers and are
/// served; `allowed_origins` lists others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_page_from_elsewhere_cannot_use_a_websocket_listener() {
    let dir = tempfile::tempdir().unwrap();
    let listeners = "[[listener]]\nname = \"ws\"\nbind = \"127.0.0.1:0\"\nanonymous = true\nwebsocket = true\n\
                     [[listener]]\nname = \"hmi\"\nbind = \"127.0.0.1:0\"\nanonymous = true\nwebsocket = true\n\
                     allowed_origins = [\"http://hmi.plant:8080\"]\n";
    let edge = EdgeProcess::start(dir.path(), &config_text(listeners));
    let ws = edge.addr("ws");
    assert!(ws_handshake(ws, Some("https://evil.example")).await.contains(" 403"));
    assert!(ws_handshake(ws, Some("http://localhost.evil.example")).await.contains(" 403"));
    assert!(ws_handshake(ws, Some("http://localhost:3000")).await.contains(" 101"));
    assert!(ws_handshake(ws, None).await.contains(" 101"));
    let hmi = edge.addr("hmi");
    assert!(ws_handshake(hmi, Some("http://hmi.plant:8080")).await.contains(" 101"));
    assert!(ws_handshake(hmi, Some("http://localhost:3000")).await.contains(" 403"));
    assert_eq!(edge.metric("edge_mqtt_connects_refused_total{listener=\"ws\",reason=\"origin\"}"), 2.0);
    assert_eq!(edge.metric("edge_mqtt_connects_refused_total{listener=\"hmi\",reason=\"origin\"}"), 1.0);
}

/// A SIGHUP that removed a grant reached a connection only when it next sent bytes (a
/// keep-alive-0 subscriber kept receiving 10 of 10), and an offline session got its revoked
/// queue on resume (10 of 10). Now the reload reaches both at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_reload_reaches_idle_subscribers_and_offline_sessions_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(&acl, "[anonymous]\npublish = [\"#\"]\nsubscribe = [\"a/#\", \"b/#\"]\n").unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text("[auth]\nacl_file = \"acl.toml\"\n"));
    // Keep-alive 0 (connect_v5's), QoS 0, and it never sends a byte after its SUBSCRIBE.
    let mut idle = RawClient::connect(edge.addr("local")).await.unwrap();
    idle.send(&connect_v5("idle", true, &[])).await.unwrap();
    assert_eq!(connack(&mut idle).await, 0);
    idle.send(&subscribe_v5(1, &["a/#".to_owned(), "b/#".to_owned()], 0)).await.unwrap();
    idle.until(9, WAIT).await.expect("SUBACK");
    let mut away = RawClient::connect(edge.addr("local")).await.unwrap();
    away.send(&connect_v5("away", false, &[0x11, 0, 0, 0x0E, 0x10])).await.unwrap();
    assert_eq!(connack(&mut away).await, 0);
    away.send(&subscribe_v5(1, &["a/#".to_owned(), "b/#".to_owned()], 1)).await.unwrap();
    away.until(9, WAIT).await.expect("SUBACK");
    drop(away);
    let publisher = Client::anonymous(edge.addr("local"), "publisher").await;
    for i in 0..10 {
        publisher.publish(&format!("a/{i}"), QoS::AtLeastOnce, false, "before").await;
    }
    // The idle subscriber had those; the offline session queued them.
    for _ in 0..10 {
        assert!(idle.until(3, WAIT).await.is_some());
    }
    std::fs::write(&acl, "[anonymous]\npublish = [\"#\"]\nsubscribe = [\"b/#\"]\n").unwrap();
    edge.signal("HUP");
    assert!(e2e_tests::eventually(WAIT, || edge.stderr().contains("reloaded")).await, "no reload: {}", edge.stderr());
    for i in 0..10 {
        publisher.publish(&format!("a/{i}"), QoS::AtLeastOnce, false, "revoked").await;
    }
    publisher.publish("b/1", QoS::AtLeastOnce, false, "still allowed").await;
    let p = idle.until(3, WAIT).await.expect("the allowed message");
    assert!(String::from_utf8_lossy(&p).contains("b/1"), "the first after the reload is b/1");
    let mut back = RawClient::connect(edge.addr("local")).await.unwrap();
    back.send(&connect_v5("away", false, &[0x11, 0, 0, 0x0E, 0x10])).await.unwrap();
    assert_eq!(connack(&mut back).await, 0);
    let mut topics = Vec::new();
    while let Some(p) = back.packet(Duration::from_millis(1500)).await {
        if p[0] >> 4 == 3 {
            let len = usize::from(u16::from_be_bytes([p[2], p[3]]));
            topics.push(String::from_utf8_lossy(&p[4..4 + len]).into_owned());
            // PUBACK, so the window moves on.
            let pkid = [p[4 + len], p[5 + len]];
            back.send(&[0x40, 2, pkid[0], pkid[1]]).await.unwrap();
        }
    }
    assert_eq!(topics, ["b/1"], "nothing from a/ on resume");
    assert_eq!(edge.metric("edge_mqtt_messages_dropped_total{reason=\"acl_revoked\"}"), 10.0);
}

/// On an anonymous listener with no password file, a client that sends a user name (many
/// industrial clients always do) was refused 0x86; Mosquitto serves it anonymously, and so does
/// the node now, with `[anonymous]`'s rights. With a password file the name is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_name_on_an_anonymous_listener_without_passwords_is_served_anonymously() {
    use e2e_tests::raw::connect_v311_login;
    let dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text(""));
    let mut c = RawClient::connect(edge.addr("local")).await.unwrap();
    c.send(&connect_v311_login("plc-7", "operator", b"whatever")).await.unwrap();
    assert_eq!(c.until(2, WAIT).await.expect("CONNACK")[3], 0);
    drop(edge);

    let dir = tempfile::tempdir().unwrap();
    edge_node::auth::PasswordFile::set_password(&dir.path().join("passwd"), "alice", b"wonderland").unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text("[auth]\npassword_file = \"passwd\"\n"));
    let mut c = RawClient::connect(edge.addr("local")).await.unwrap();
    c.send(&connect_v311_login("plc-7", "operator", b"whatever")).await.unwrap();
    assert_eq!(c.until(2, WAIT).await.expect("CONNACK")[3], 4, "3.1.1: bad user name or password");
}

/// [MQTT-3.1.2-2]: an unsupported protocol level is answered, then closed: MQTT 3.1 (level 3)
/// with MQTT 3.1.1's return code 1 in the form it reads, a level after 5 with MQTT 5's 0x84
/// (it was answered 1 in the 3.1.1 form whatever the level).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_3_1_2_2_an_unsupported_level_is_answered_in_its_form() {
    let dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text(""));
    for (level, name, want) in [(6u8, &b"MQTT"[..], vec![0x20, 3, 0, 0x84, 0]), (3, b"MQIsdp", vec![0x20, 2, 0, 1])] {
        let mut body = string(name);
        body.extend([level, 0b10, 0, 0]);
        body.extend(string(b"c"));
        let mut c = RawClient::connect(edge.addr("local")).await.unwrap();
        c.send(&e2e_tests::raw::frame(0x10, &body)).await.unwrap();
        assert_eq!(c.packet(WAIT).await, Some(want), "level {level}");
        assert!(c.packet(WAIT).await.is_none(), "closed after it");
    }
}

/// `$SYS/#` had nothing behind it: the broker's statistics are there now, retained, with
/// Mosquitto's names, and no client publishes into `$SYS` (0x87).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brokers_statistics_are_under_sys_and_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text("[broker]\nsys_interval = \"200ms\"\n"));
    let mut watcher = Client::anonymous(edge.addr("local"), "watcher").await;
    watcher.subscribe("$SYS/#", QoS::AtMostOnce).await;
    // The retained ones first, from before the watcher came; then fresh ones every 200 ms.
    let mut seen = std::collections::BTreeMap::new();
    let until = tokio::time::Instant::now() + Duration::from_millis(1500);
    while tokio::time::Instant::now() < until || seen.len() < 10 {
        let p = watcher.recv(WAIT).await.expect("a $SYS message");
        seen.insert(p.topic.clone(), String::from_utf8_lossy(&p.payload).into_owned());
    }
    assert!(seen["$SYS/broker/version"].starts_with("edge-node "), "{seen:?}");
    assert!(seen["$SYS/broker/uptime"].ends_with(" seconds"), "{seen:?}");
    // The watcher itself, and no internal client, is what is connected.
    assert_eq!(seen["$SYS/broker/clients/connected"], "1", "{seen:?}");
    assert!(seen["$SYS/broker/bytes/received"].parse::<u64>().unwrap() > 0, "{seen:?}");

    let mut forger = RawClient::connect(edge.addr("local")).await.unwrap();
    forger.send(&connect_v5("sys-forger", true, &[])).await.unwrap();
    assert_eq!(connack(&mut forger).await, 0);
    forger.send(&publish_v5(b"$SYS/broker/uptime", 1, 1, true, &[], b"0 seconds")).await.unwrap();
    assert_eq!(forger.until(4, WAIT).await.expect("PUBACK")[4], 0x87);
}

/// Failures before the login logged a line each at `info` with no budget: 500 connections
/// sending garbage write at most `log.peer_lines_per_second` lines a second, the rest counted
/// and told with the next line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_about_peers_not_logged_in_have_a_budget() {
    let dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text("[log]\npeer_lines_per_second = 5\n"));
    for _ in 0..500 {
        let mut c = RawClient::connect(edge.addr("local")).await.unwrap();
        let _ = c.send(b"GET / HTTP/1.1\r\n\r\n").await;
        let _ = c.packet(WAIT).await;
    }
    assert!(
        e2e_tests::eventually(WAIT, || edge
            .metric("edge_mqtt_connects_refused_total{listener=\"local\",reason=\"malformed\"}")
            == 500.0)
        .await
    );
    let lines = edge.stderr().lines().filter(|l| l.contains("bad first packet")).count();
    let suppressed = edge.metric("edge_log_lines_suppressed_total");
    assert!(lines < 100, "{lines} lines");
    assert_eq!(lines as f64 + suppressed, 500.0);
}

/// A TLS connection to `addr` presenting `client` (certificate and key) to a server of `ca`.
async fn tls_client(
    addr: std::net::SocketAddr,
    ca: &std::path::Path,
    client: &e2e_tests::certs::Issued,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in shared::tls::load_certs(ca).unwrap() {
        roots.add(c).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(shared::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            shared::tls::load_certs(&client.cert).unwrap(),
            shared::tls::load_key(&client.key).unwrap(),
        )
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await
}

/// A client logged in by its certificate stayed connected past the certificate's `notAfter`
/// (TLS checks dates at the handshake only): it is disconnected at the expiry now (MQTT 5:
/// DISCONNECT 0x87, counted `certificate_expired`), and a new handshake with it fails, with no
/// session resumption to skip the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_ends_its_connection_when_it_expires() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let ca = e2e_tests::certs::Ca::new(dir.path(), "fleet");
    ca.server(dir.path(), "server");
    let short = ca.client_until(dir.path(), "cam-9", Duration::from_secs(4));
    let listener = "[[listener]]\nname = \"mtls\"\nbind = \"127.0.0.1:0\"\n[listener.tls]\ncert = \"server.pem\"\n\
                    key = \"server.key\"\nclient_ca = \"fleet-ca.pem\"\nclient_certs = \"required\"\n";
    let edge = EdgeProcess::start(dir.path(), &config_text(listener));
    let mut tls = tls_client(edge.addr("mtls"), &ca.cert_path, &short).await.unwrap();
    tls.write_all(&connect_v5("cam-9", true, &[])).await.unwrap();
    let mut buf = vec![0u8; 64];
    let n = tls.read(&mut buf).await.unwrap();
    assert!(n >= 4 && buf[0] == 0x20 && buf[3] == 0, "CONNACK 0: {:?}", &buf[..n]);
    // Nothing more until the certificate expires, then DISCONNECT 0x87 and the close.
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), tls.read_to_end(&mut rest)).await.expect("closed by now");
    assert!(started.elapsed() >= Duration::from_secs(2), "not before the expiry: {:?}", started.elapsed());
    assert_eq!(rest.get(..1), Some(&[0xE0][..]), "{rest:?}");
    assert!(rest.contains(&0x87), "{rest:?}");
    assert_eq!(edge.metric("edge_mqtt_disconnects_total{reason=\"certificate_expired\"}"), 1.0);
    let again = async {
        let mut t = tls_client(edge.addr("mtls"), &ca.cert_path, &short).await?;
        t.write_all(&connect_v5("cam-9", true, &[])).await?;
        let mut b = [0u8; 8];
        match t.read(&mut b).await? {
            0 => Err(std::io::Error::other("closed")),
            _ => Ok(()),
        }
    };
    assert!(again.await.is_err(), "an expired certificate gets no connection");
}

/// Over WebSocket, the CONNECT's bound held only after tungstenite had read a whole message
/// (up to `max_packet_size`): 300 pending connections, each sending 256 KiB of a message that
/// announces 1 MiB, are closed once past `max_connect_size` and its handshake's allowance, and
/// memory stays small; a browser-sized handshake and a CONNECT still get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_is_bounded_before_the_login_too() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    // A CONNECT timeout past the test's wait: a connection closed in time was closed by the cap.
    let ws = "[broker]\nconnect_timeout = \"60s\"\n\
              [[listener]]\nname = \"ws\"\nbind = \"127.0.0.1:0\"\nanonymous = true\nwebsocket = true\n";
    let edge = EdgeProcess::start(dir.path(), &config_text(ws));
    let addr = edge.addr("ws");
    let upgrade = |cookie: usize| {
        format!(
            "GET /mqtt HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Protocol: mqtt\r\nCookie: c={}\r\n\r\n",
            "x".repeat(cookie)
        )
    };
    /// A masked binary frame header announcing `len` bytes (client frames are masked; a zero
    /// mask leaves the payload as it is).
    fn frame_head(len: u64) -> Vec<u8> {
        // RFC 6455 §5.2: the shortest length encoding.
        let mut h = vec![0x82];
        match len {
            0..=125 => h.push(0x80 | len as u8),
            126..=0xFFFF => {
                h.push(0x80 | 126);
                h.extend((len as u16).to_be_bytes());
            }
            _ => {
                h.push(0x80 | 127);
                h.extend(len.to_be_bytes());
            }
        }
        h.extend([0, 0, 0, 0]);
        h
    }
    let before = edge.rss();
    let mut pending = Vec::new();
    for _ in 0..300 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(upgrade(0).as_bytes()).await.unwrap();
        let mut response = vec![0u8; 1024];
        let n = s.read(&mut response).await.unwrap();
        assert!(String::from_utf8_lossy(&response[..n]).starts_with("HTTP/1.1 101"));
        s.write_all(&frame_head(1 << 20)).await.unwrap();
        // Written while the node reads; it stops reading (and closes) before the end.
        let _ = tokio::time::timeout(Duration::from_secs(2), s.write_all(&vec![0u8; 256 << 10])).await;
        pending.push(s);
    }
    let grown = edge.rss().saturating_sub(before);
    assert!(grown < 64 * MIB, "RSS grew {} MiB", grown / MIB);
    for s in &mut pending {
        let mut b = [0u8; 64];
        let closed = matches!(tokio::time::timeout(WAIT, s.read(&mut b)).await, Ok(Ok(0)) | Ok(Err(_)));
        assert!(closed, "closed past its allowance");
    }
    drop(pending);
    // An ordinary WebSocket client, with a browser's 8 KiB of cookies, gets in.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(upgrade(8 << 10).as_bytes()).await.unwrap();
    let mut response = vec![0u8; 1024];
    let n = s.read(&mut response).await.unwrap();
    assert!(String::from_utf8_lossy(&response[..n]).starts_with("HTTP/1.1 101"));
    let connect = connect_v5("ws-ok", true, &[]);
    s.write_all(&frame_head(connect.len() as u64)).await.unwrap();
    s.write_all(&connect).await.unwrap();
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(WAIT, s.read(&mut b)).await.unwrap().unwrap();
    // A binary frame with the CONNACK: 0x82, its length, then 0x20 .. 0x00 (success).
    assert!(n >= 6 && b[0] == 0x82 && b[2] == 0x20 && b[5] == 0, "{:?}", &b[..n]);
}
