//! The bridge's limits against an edge that holds a valid certificate and means harm: batch
//! streams that announce 16 MiB and send almost nothing, a batch that decodes from little to
//! gigabytes, and a storm of handshakes. Memory stays inside the configured budget, the
//! refusals name the limit, and the real edge keeps delivering.

use std::time::{Duration, Instant};

use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, pki, sink_rows};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::node::TestNode;
use e2e_tests::quic;
use rumqttc::QoS;
use shared::proto::codec;

const WAIT: Duration = Duration::from_secs(20);
const EPOCH: &str = "00112233445566778899aabbccddeeff";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_edge_cannot_make_the_bridge_allocate_past_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let limits = "[limits]\nmemory = \"96 MiB\"\nconnection_memory = \"48 MiB\"\n";
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), limits).await;
    let addr = cloud.bridge.quic_addr();
    let edge = TestNode::start(&format!("{}\n{}", with_spool(&[telemetry()]), cloud.uplink_section("edge-1"))).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    for i in 0..50 {
        publisher.publish(&format!("telemetry/a/{i}"), QoS::AtLeastOnce, false, "before").await;
    }
    assert!(e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 50).await);
    let (_, cert2, key2) = keys.edges.iter().find(|(id, _, _)| id == "edge-2").unwrap().clone();
    let baseline = e2e_tests::rss_of(std::process::id());
    let rss = e2e_tests::PeakRss::start(std::process::id());

    // Batch streams announcing 16 MiB each, 1 KiB sent: before, one task per stream (256 of
    // them) allocated the whole announced length, 4 GiB. Now QUIC allows 16 streams, they are
    // read in order, and memory is reserved as bytes arrive.
    let conn = quic::connect(addr, &keys.ca, &cert2, &key2).await.unwrap();
    let _control = quic::welcomed(&conn, EPOCH).await;
    let mut streams = Vec::new();
    while streams.len() < 256 {
        let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_millis(300), conn.open_uni()).await else { break };
        s.write_all(&(16u32 << 20).to_be_bytes()).await.unwrap();
        s.write_all(&[0u8; 1024]).await.unwrap();
        streams.push(s);
    }
    assert_eq!(streams.len(), 16, "limits.streams_per_connection");
    let reserved = "bridge_batch_memory_reserved_bytes";
    assert!(e2e_tests::eventually(WAIT, || cloud.metric(reserved) > 0.0).await, "the first stream is being read");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reserved = cloud.metric(reserved);
    assert!(reserved <= (128 << 10) as f64, "{reserved} bytes reserved for 16 KiB received");
    drop(streams);
    conn.close(0u32.into(), b"");

    // 30 MB of CBOR that is nothing but empty user property pairs (480 MB decoded), in a few
    // KB of zstd: refused on its bound, before it is decoded.
    let conn = quic::connect(addr, &keys.ca, &cert2, &key2).await.unwrap();
    let _control = quic::welcomed(&conn, EPOCH).await;
    let batch = quic::zstd_batch(&quic::empty_pairs_record(10_000_000));
    let mut uni = conn.open_uni().await.unwrap();
    uni.write_all(&codec::encode(&batch).unwrap()).await.unwrap();
    uni.finish().unwrap();
    let reason = tokio::time::timeout(WAIT, conn.closed()).await.unwrap().to_string();
    assert!(reason.contains("more than the connection's memory budget of 48.0 MiB"), "{reason}");

    // The real edge was never held up, nothing acked is lost, and the memory is back.
    for i in 0..50 {
        publisher.publish(&format!("telemetry/b/{i}"), QoS::AtLeastOnce, false, "after").await;
    }
    assert!(e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 100).await);
    assert!(sink_rows(&cloud.sink).iter().all(|r| r.edge == "edge-1"));
    assert!(e2e_tests::eventually(WAIT, || cloud.metric("bridge_batch_memory_reserved_bytes") == 0.0).await);
    let grown = rss.peak().saturating_sub(baseline);
    // The test's own 30 MB of CBOR and its compression are in this process too.
    assert!(grown < 120 << 20, "RSS grew by {} MiB under attack", grown >> 20);
    eprintln!("RSS: baseline {} MiB, peak {} MiB under attack", baseline >> 20, rss.peak() >> 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_storm_is_refused_before_tls_at_the_configured_rate_and_count() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2", "edge-3", "edge-4"]);
    let limits = "[limits]\nhandshakes_per_second = 5\nhandshake_burst = 5\nmax_connections = 3\n";
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), limits).await;
    let addr = cloud.bridge.quic_addr();
    let cert = |id: &str| keys.edges.iter().find(|(e, _, _)| e == id).unwrap().clone();

    // Three connections of three edges are the most the bridge holds at once.
    let mut held = Vec::new();
    for id in ["edge-2", "edge-3", "edge-4"] {
        let (_, c, k) = cert(id);
        held.push(quic::connect(addr, &keys.ca, &c, &k).await.unwrap());
    }
    let (_, c, k) = cert("edge-2");
    let err = quic::connect(addr, &keys.ca, &c, &k).await.unwrap_err();
    assert!(err.contains("refused"), "{err}");
    assert_eq!(cloud.metric("bridge_connections_refused_total{reason=\"connections\"}"), 1.0);
    assert_eq!(cloud.metric("bridge_connections"), 3.0);
    drop(held);
    assert!(e2e_tests::eventually(WAIT, || cloud.metric("bridge_connections") == 0.0).await);

    // 40 at once on a bridge that admits 5 a second: a handful admitted, the rest refused
    // before any TLS work (no handshake failure is counted for them).
    let storm_dir = dir.path().join("storm");
    std::fs::create_dir(&storm_dir).unwrap();
    let limits = "[limits]\nhandshakes_per_second = 5\nhandshake_burst = 5\n";
    let cloud = TestCloud::start(&storm_dir, keys.clone(), "127.0.0.1:0".parse().unwrap(), limits).await;
    let addr = cloud.bridge.quic_addr();
    let started = Instant::now();
    let attempts: Vec<_> = (0..40)
        .map(|_| {
            let (ca, c, k) = (keys.ca.clone(), c.clone(), k.clone());
            tokio::spawn(async move { quic::connect(addr, &ca, &c, &k).await.map(|conn| conn.close(0u32.into(), b"")) })
        })
        .collect();
    let mut refused = 0;
    for a in attempts {
        // An admitted connection of edge-2 may be replaced by the next one: not a refusal.
        if a.await.unwrap().is_err_and(|e| e.contains("refused")) {
            refused += 1;
        }
    }
    let admitted = 40 - refused;
    let most = 5 + (started.elapsed().as_secs_f64() * 5.0).ceil() as usize;
    assert!((1..=most).contains(&admitted), "{admitted} admitted in {:?}", started.elapsed());
    assert_eq!(cloud.metric("bridge_connections_refused_total{reason=\"rate\"}"), refused as f64);
    assert_eq!(cloud.metric("bridge_connections_refused_total{reason=\"handshake\"}"), 0.0);
}

/// A stolen certificate that calls as fast as it can gets its own rate, not the bridge's: past
/// `edge_handshake_burst` it is refused after each handshake, and the address it calls from is
/// limited before TLS for `cooldown`, while an edge on another address connects and delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_certificate_cannot_spend_the_bridge_handshake_rate() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let limits = "[limits]\nhandshakes_per_second = 20\nhandshake_burst = 20\nedge_handshakes_per_minute = 6\n\
                  edge_handshake_burst = 3\ncooldown_handshakes_per_second = 1\n";
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), limits).await;
    let addr = cloud.bridge.quic_addr();
    let (_, cert, key) = keys.edges.iter().find(|(id, _, _)| id == "edge-2").unwrap().clone();

    let started = Instant::now();
    let until = started + Duration::from_secs(8);
    let hammer: Vec<_> = (0..4)
        .map(|_| {
            let (ca, cert, key) = (keys.ca.clone(), cert.clone(), key.clone());
            tokio::spawn(async move {
                let mut tries = 0;
                while Instant::now() < until {
                    tries += 1;
                    let from = std::net::Ipv4Addr::new(127, 0, 0, 2).into();
                    if let Ok(conn) = quic::connect_from(from, addr, &ca, &cert, &key).await {
                        conn.close(0u32.into(), b"");
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                ((), tries)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let edge = TestNode::start(&format!("{}\n{}", with_spool(&[telemetry()]), cloud.uplink_section("edge-1"))).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    for i in 0..10 {
        publisher.publish(&format!("telemetry/a/{i}"), QoS::AtLeastOnce, false, "during").await;
    }
    assert!(e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 10).await, "the real edge delivers");
    let mut tries = 0;
    for h in hammer {
        tries += h.await.unwrap().1;
    }
    // Every session but the real edge's has ended (the stolen certificate's replaced each
    // other): the sessions it started are those ended.
    assert!(e2e_tests::eventually(WAIT, || cloud.metric("bridge_edges_connected") == 1.0).await);
    let sessions = e2e_tests::metric_sum(&cloud.bridge.metrics().encode(), "bridge_sessions_closed_total") as usize;
    // Three at once, then six a minute.
    let most = 3 + (started.elapsed().as_secs_f64() / 10.0).ceil() as usize;
    eprintln!("stolen certificate: {sessions} sessions in {tries} tries, {:?}", started.elapsed());
    assert!((3..=most).contains(&sessions), "{sessions} sessions of one certificate, at most {most}");
    let refused = |reason: &str| cloud.metric(&format!("bridge_connections_refused_total{{reason=\"{reason}\"}}"));
    assert!(refused("edge_rate") >= 1.0);
    // Most tries never reached TLS: its address cools down.
    assert!(refused("address_rate") > tries as f64 / 2.0, "{} of {tries} refused before TLS", refused("address_rate"));
    // Handshakes refused once done: one a second, its address's cooled rate, not the bridge's 20.
    let handshakes = refused("edge_rate");
    assert!(handshakes <= started.elapsed().as_secs_f64().ceil() + 1.0, "{handshakes} handshakes refused after TLS");
    assert_eq!(cloud.metric("bridge_cooling_addresses"), 1.0);
}

/// Control frames are paid for like batches (issue 29): one that announces 1 MiB and sends
/// little holds little; a hello of a million empty model names (1 MiB on the wire, tens of MiB
/// decoded) is refused on its decoded bound before it is decoded; one over 1 MiB by its length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_frames_are_paid_from_the_connection_budget() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let limits = "[limits]\nmemory = \"96 MiB\"\nconnection_memory = \"48 MiB\"\n";
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), limits).await;
    let addr = cloud.bridge.quic_addr();
    let (_, cert, key) = keys.edges.iter().find(|(id, _, _)| id == "edge-2").unwrap().clone();
    let reserved = || cloud.metric("bridge_batch_memory_reserved_bytes");

    let conn = quic::connect(addr, &keys.ca, &cert, &key).await.unwrap();
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    send.write_all(&(1u32 << 20).to_be_bytes()).await.unwrap();
    send.write_all(&[0u8; 1024]).await.unwrap();
    assert!(e2e_tests::eventually(WAIT, || reserved() > 0.0).await, "the frame is paid for as it arrives");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(reserved() <= (128 << 10) as f64, "{} bytes reserved for 1 KiB received", reserved());
    conn.close(0u32.into(), b"");
    assert!(e2e_tests::eventually(WAIT, || reserved() == 0.0).await);

    let conn = quic::connect(addr, &keys.ca, &cert, &key).await.unwrap();
    let mut hello = quic::hello_for(EPOCH);
    hello.models = vec![String::new(); 1_000_000];
    let frame = codec::encode(&shared::proto::Control::Hello(hello)).unwrap();
    assert!(frame.len() <= shared::proto::MAX_EDGE_CONTROL_FRAME);
    let reason = quic::send_control_and_wait_close(&conn, &frame).await;
    assert!(reason.contains("control frame memory: needs"), "{reason}");
    assert!(reason.contains("more than the connection's memory budget of 48.0 MiB"), "{reason}");
    assert_eq!(cloud.metric("bridge_sessions_closed_total{reason=\"stalled\"}"), 1.0);

    let conn = quic::connect(addr, &keys.ca, &cert, &key).await.unwrap();
    let reason = quic::send_control_and_wait_close(&conn, &(2u32 << 20).to_be_bytes()).await;
    assert!(reason.contains("frame of 2097152 bytes is over the 1048576 byte limit"), "{reason}");
    assert!(e2e_tests::eventually(WAIT, || reserved() == 0.0).await);
}
