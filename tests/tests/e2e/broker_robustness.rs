//! Bad input and load at the edges of the limits: the broker stays up, refuses or disconnects
//! with a counted reason, and serves the next good client.

use std::time::Duration;

use e2e_tests::client::{self, Client};
use e2e_tests::node::TestNode;
use rumqttc::QoS;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(5);

/// An MQTT 3.1.1 CONNECT, clean session, no credentials.
fn connect_packet(client_id: &str, keep_alive: u16) -> Vec<u8> {
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0x02];
    body.extend(keep_alive.to_be_bytes());
    body.extend((client_id.len() as u16).to_be_bytes());
    body.extend(client_id.as_bytes());
    let mut packet = vec![0x10, body.len() as u8];
    packet.extend(body);
    packet
}

/// Reads until EOF or `timeout`; returns the bytes and whether the peer closed.
async fn read_until_closed(stream: &mut TcpStream, timeout: Duration) -> (Vec<u8>, bool) {
    let mut all = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (all, true),
            Ok(Ok(n)) => all.extend(&buf[..n]),
            Err(_) => return (all, false),
        }
    }
}

async fn good_client_works(t: &TestNode, id: &str) {
    let mut c = Client::anonymous(t.local(), id).await;
    c.subscribe("ok/#", QoS::AtLeastOnce).await;
    c.publish("ok/1", QoS::AtLeastOnce, false, "fine").await;
    assert_eq!(c.recv(WAIT).await.expect("round trip after bad input").topic, "ok/1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_before_and_after_connect_is_dropped() {
    let t = TestNode::start("").await;
    // Not MQTT at all.
    let mut raw = TcpStream::connect(t.local()).await.unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let (_, closed) = read_until_closed(&mut raw, WAIT).await;
    assert!(closed, "garbage connection left open");

    // A valid CONNECT, then a reserved packet type and junk.
    let mut raw = TcpStream::connect(t.local()).await.unwrap();
    raw.write_all(&connect_packet("junk", 30)).await.unwrap();
    let mut connack = [0u8; 4];
    raw.read_exact(&mut connack).await.unwrap();
    assert_eq!(connack, [0x20, 2, 0, 0]);
    raw.write_all(&[0xF0, 0x03, 1, 2, 3, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]).await.unwrap();
    let (_, closed) = read_until_closed(&mut raw, WAIT).await;
    assert!(closed, "connection sending junk after CONNECT left open");

    // A PUBLISH whose topic length runs past the packet.
    let mut raw = TcpStream::connect(t.local()).await.unwrap();
    raw.write_all(&connect_packet("short", 30)).await.unwrap();
    raw.write_all(&[0x32, 0x04, 0x00, 0x40, b'a', b'b']).await.unwrap();
    let (_, closed) = read_until_closed(&mut raw, WAIT).await;
    assert!(closed);
    assert!(t.metric("edge_mqtt_disconnects_total{reason=\"malformed\"}") >= 1.0);
    assert!(t.metric("edge_mqtt_connects_refused_total{listener=\"local\",reason=\"malformed\"}") >= 1.0);
    good_client_works(&t, "after-garbage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_packet_disconnects_and_is_not_delivered() {
    let t = TestNode::start("[broker]\nmax_packet_size = \"4 KiB\"\n").await;
    let mut watcher = Client::anonymous(t.local(), "watcher").await;
    watcher.subscribe("big/#", QoS::AtLeastOnce).await;
    let mut big = Client::anonymous(t.local(), "big").await;
    big.publish("big/1", QoS::AtLeastOnce, false, vec![7u8; 8 * 1024]).await;
    assert!(big.closed(WAIT).await.is_some(), "client with an oversized packet not disconnected");
    assert!(watcher.recv(Duration::from_millis(300)).await.is_none(), "oversized packet delivered");
    assert_eq!(t.metric("edge_mqtt_disconnects_total{reason=\"packet_too_large\"}"), 1.0);

    // A declared length over the limit is refused from the header, before the body arrives.
    let mut raw = TcpStream::connect(t.local()).await.unwrap();
    raw.write_all(&connect_packet("liar", 30)).await.unwrap();
    raw.write_all(&[0x30, 0xFF, 0xFF, 0xFF, 0x7F]).await.unwrap();
    let (_, closed) = read_until_closed(&mut raw, WAIT).await;
    assert!(closed, "256 MiB declared packet not refused");
    assert_eq!(t.metric("edge_mqtt_disconnects_total{reason=\"packet_too_large\"}"), 2.0);
    good_client_works(&t, "after-big").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_are_closed() {
    let t = TestNode::start("[broker]\nconnect_timeout = \"300ms\"\n").await;
    // Connects and never sends CONNECT.
    let mut silent = TcpStream::connect(t.local()).await.unwrap();
    let (_, closed) = read_until_closed(&mut silent, WAIT).await;
    assert!(closed, "silent connection not closed after connect_timeout");
    assert_eq!(t.metric("edge_mqtt_connects_refused_total{listener=\"local\",reason=\"timeout\"}"), 1.0);

    // Connects with keep-alive 1 s, then goes quiet: the broker drops it after 1.5 keep-alives.
    let mut quiet = TcpStream::connect(t.local()).await.unwrap();
    quiet.write_all(&connect_packet("quiet", 1)).await.unwrap();
    let (bytes, closed) = read_until_closed(&mut quiet, WAIT).await;
    assert_eq!(bytes.first(), Some(&0x20), "no CONNACK");
    assert!(closed, "client past its keep-alive not disconnected");
    assert!(e2e_tests::eventually(WAIT, || t.metric("edge_mqtt_connections_open{listener=\"local\"}") == 0.0).await);
    good_client_works(&t, "after-half-open").await;
}

/// [MQTT-3.1.2-24]: the server disconnects a client that sent nothing for one and a half times
/// its keep-alive, and only then. The reader keeps one timer, armed at the first deadline and
/// not moved later with each packet: a client that pings past that first deadline must stay,
/// and be closed once it goes quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_counts_from_the_last_packet_not_the_first_deadline() {
    let t = TestNode::start("").await;
    let mut c = TcpStream::connect(t.local()).await.unwrap();
    c.write_all(&connect_packet("pinger", 1)).await.unwrap();
    let mut connack = [0u8; 4];
    tokio::time::timeout(WAIT, c.read_exact(&mut connack)).await.expect("CONNACK in time").unwrap();
    assert_eq!(connack, [0x20, 2, 0, 0]);
    // PINGREQ every 0.25 s for 3 s: past the first deadline (1.5 s) twice over, with 1.25 s of
    // slack per gap for a loaded machine.
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        c.write_all(&[0xC0, 0]).await.unwrap();
        let mut resp = [0u8; 2];
        tokio::time::timeout(WAIT, c.read_exact(&mut resp)).await.expect("PINGRESP in time").unwrap();
        assert_eq!(resp, [0xD0, 0], "an active client was disconnected");
    }
    let quiet_from = tokio::time::Instant::now();
    let (_, closed) = read_until_closed(&mut c, WAIT).await;
    assert!(closed, "client past its keep-alive not disconnected");
    let after = quiet_from.elapsed();
    assert!(after >= Duration::from_millis(1400), "closed {after:?} after its last packet, before 1.5 keep-alives");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connections_at_once() {
    let t = TestNode::start("[broker]\nmax_connections = 1100\n").await;
    let addr = t.local();
    let mut tasks = Vec::new();
    for i in 0..1000 {
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.ok()?;
            s.write_all(&connect_packet(&format!("c{i}"), 60)).await.ok()?;
            let mut ack = [0u8; 4];
            s.read_exact(&mut ack).await.ok()?;
            (ack == [0x20, 2, 0, 0]).then_some(s)
        }));
    }
    let mut open = Vec::new();
    for task in tasks {
        if let Some(s) = task.await.unwrap() {
            open.push(s);
        }
    }
    assert_eq!(open.len(), 1000, "not every connection got a CONNACK");
    assert_eq!(t.metric("edge_mqtt_connections_open{listener=\"local\"}"), 1000.0);
    good_client_works(&t, "the-1001st").await;
    drop(open);
    assert!(e2e_tests::eventually(WAIT, || t.metric("edge_mqtt_connections_open{listener=\"local\"}") == 0.0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_refused_with_a_reason() {
    let t = TestNode::start("[broker]\nmax_connections = 20\n").await;
    let mut held = Vec::new();
    for i in 0..20 {
        held.push(Client::anonymous(t.local(), &format!("h{i}")).await);
    }
    let err = Client::connect(client::options(t.local(), "one-too-many")).await.err().expect("21st client accepted");
    assert!(err.contains("ServiceUnavailable"), "{err}");
    assert_eq!(t.metric("edge_mqtt_connects_refused_total{listener=\"local\",reason=\"max_connections\"}"), 1.0);
    held.pop();
    // A slot frees up once the broker saw the close.
    assert!(e2e_tests::eventually(WAIT, || t.metric("edge_mqtt_connections_open{listener=\"local\"}") == 19.0).await);
    good_client_works(&t, "after-limit").await;
}

/// A QoS 0 subscriber that stops reading: once its queue is full its oldest messages are
/// dropped and counted (guarantee 1's bound), it is disconnected after `slow_client_timeout`,
/// and other clients are unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_loses_counted_qos0_messages_and_is_dropped() {
    let t = TestNode::start(
        "[broker]\nmax_packet_size = \"2 KiB\"\nmax_queued_messages = 100\nslow_client_timeout = \"2s\"\n",
    )
    .await;
    let mut stalled = TcpStream::connect(t.local()).await.unwrap();
    stalled.write_all(&connect_packet("stalled", 60)).await.unwrap();
    // SUBSCRIBE pkid 1, "flood/#", QoS0; then never read again.
    stalled.write_all(&[0x82, 12, 0, 1, 0, 7, b'f', b'l', b'o', b'o', b'd', b'/', b'#', 0]).await.unwrap();
    let mut acks = [0u8; 9];
    stalled.read_exact(&mut acks).await.unwrap();
    assert_eq!((acks[0], acks[4]), (0x20, 0x90), "CONNACK then SUBACK expected");

    // Keep publishing until the front's writes to the stalled client block for
    // slow_client_timeout (the socket buffers first absorb a few MB).
    let publisher = Client::anonymous(t.local(), "flooder").await;
    let started = std::time::Instant::now();
    let mut i = 0u32;
    while t.metric("edge_mqtt_disconnects_total{reason=\"slow_client\"}") == 0.0 {
        assert!(started.elapsed() < Duration::from_secs(30), "stalled subscriber not disconnected in 30 s");
        for _ in 0..2000 {
            let mut payload = vec![0u8; 1000];
            payload[..4].copy_from_slice(&i.to_be_bytes());
            publisher.publish("flood/x", QoS::AtMostOnce, false, payload).await;
            i += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dropped = t.metric("edge_mqtt_messages_dropped_total{reason=\"queue_full_qos0\"}");
    assert!(dropped >= 1.0, "no drop counted for the stalled subscriber");
    good_client_works(&t, "after-flood").await;
}
