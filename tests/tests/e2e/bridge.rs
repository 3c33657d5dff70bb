//! Edge to cloud over the QUIC bridge, both ends real (in process), with mutual TLS from a
//! development PKI and the SQLite sink: everything spooled arrives exactly once, the edge's
//! spool empties as acks come back, a bridge replaced mid-stream by another instance on the
//! same sink loses and duplicates nothing, and a denied certificate is refused.

use std::net::SocketAddr;
use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::cloud::{EdgeRow, Status, TestCloud, pki, sink_rows};
use e2e_tests::fixtures::{inference, telemetry, with_spool};
use e2e_tests::node::TestNode;
use rumqttc::QoS;

const WAIT: Duration = Duration::from_secs(20);

fn classes_toml() -> String {
    with_spool(&[telemetry().priority(3), inference()])
}

async fn publish(client: &Client, prefix: &str, range: std::ops::Range<u32>) {
    for i in range {
        client.publish(&format!("{prefix}/{i}"), QoS::AtLeastOnce, false, format!("m{i}")).await;
    }
}

/// Topic and payload of each message row.
fn payloads(rows: &[e2e_tests::cloud::SinkRow]) -> Vec<String> {
    rows.iter()
        .filter(|r| r.kind == "message")
        .map(|r| format!("{} {}", r.topic.as_deref().unwrap_or(""), String::from_utf8_lossy(&r.payload)))
        .collect()
}

/// A cloud bridge on the SQLite sink, an edge with [`classes_toml`] draining to it as `edge-1`, and
/// a publisher on the edge.
async fn edge_and_cloud(dir: &tempfile::TempDir) -> (TestCloud, TestNode, Client) {
    let cloud = TestCloud::start(dir.path(), pki(dir.path(), &[]), "127.0.0.1:0".parse().unwrap(), "").await;
    let extra = format!("{}\n{}", classes_toml(), cloud.uplink_section("edge-1"));
    let edge = TestNode::start(&extra).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    (cloud, edge, publisher)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spooled_messages_arrive_exactly_once_and_the_spool_empties() {
    let dir = tempfile::tempdir().unwrap();
    let (cloud, edge, publisher) = edge_and_cloud(&dir).await;
    publish(&publisher, "telemetry/cam-1", 0..300).await;
    publish(&publisher, "inference/yolo-edge/v3.2.1", 0..100).await;

    let ok = e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 400).await;
    let rows = sink_rows(&cloud.sink);
    assert!(ok, "{} of 400 records in the sink", rows.len());
    assert!(rows.iter().all(|r| r.edge == "edge-1"), "the edge id comes from the certificate");
    let mut got = payloads(&rows);
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 400, "each message exactly once");
    let topics: Vec<&str> = rows.iter().filter_map(|r| r.topic.as_deref()).collect();
    assert!(topics.contains(&"inference/yolo-edge/v3.2.1/99"), "topics round-trip as they were");
    // Lanes in seq order without holes.
    for lane in [1u8, 3] {
        let seqs: Vec<u64> = rows.iter().filter(|r| r.lane == lane).map(|r| r.seq).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<u64>>(), "lane {lane}");
    }
    // Acks delete the spool's records.
    let empty =
        e2e_tests::eventually(WAIT, || edge.metric("edge_spool_class_records{class=\"telemetry\"}") == 0.0).await;
    assert!(empty, "{}", edge.metrics());
    assert_eq!(edge.metric("edge_uplink_acked_seq{lane=\"3\"}"), 300.0);
    assert_eq!(edge.metric("edge_uplink_connected"), 1.0);
    assert!(edge.metric("edge_uplink_sent_bytes_total") < edge.metric("edge_uplink_raw_bytes_total"), "compressed");
    assert!(edge.metric("edge_uplink_commit_latency_seconds_count") >= 1.0, "commit latency measured per batch");
    assert_eq!(cloud.metric("bridge_records_total"), 400.0);
    // The fleet view: the edge reports its spool heads and what its spool says of itself with
    // each ping; once drained, lane 3 is committed through 300 and nothing is behind.
    let drained = |e: &EdgeRow| {
        e.status == Status::Connected
            && e.lanes.iter().any(|l| l.lane == 3 && l.committed == 300 && l.backlog == Some(0))
            && e.backlog == Some(0)
            && e.oldest_unacked_ms == Some(0)
    };
    assert!(
        e2e_tests::eventually(WAIT, || cloud.edge_row("edge-1").is_some_and(|e| drained(&e))).await,
        "{:?}",
        cloud.fleet()
    );
    let row = cloud.edge_row("edge-1").unwrap();
    assert_eq!((row.bridge.as_str(), row.version), (cloud.bridge.name(), *shared::proto::VERSIONS.last().unwrap()));
    assert_eq!((row.dropped, row.gaps), (Some(0), Some(0)));
    assert_eq!(cloud.metric("bridge_lag_records"), 0.0);
    assert_eq!(cloud.metric("bridge_edges_connected"), 1.0);
    // No series names an edge.
    assert!(!cloud.bridge.metrics().encode().contains("edge=\""), "{}", cloud.bridge.metrics().encode());
}

/// A backlog of large messages that zstd cannot shrink (camera frames): a batch of them must
/// stay under the bridge's frame limit (16 MiB), or every batch is refused and the uplink never
/// drains. 40 messages of 900 KiB are 35 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_incompressible_messages_drain_in_batches_under_the_frame_limit() {
    use rand::RngCore;
    let dir = tempfile::tempdir().unwrap();
    let (cloud, edge, publisher) = edge_and_cloud(&dir).await;
    let mut sent = Vec::new();
    for i in 0..40u32 {
        let mut frame = vec![0u8; 900 << 10];
        rand::thread_rng().fill_bytes(&mut frame);
        publisher.publish(&format!("telemetry/frames/{i}"), QoS::AtLeastOnce, false, frame.clone()).await;
        sent.push(frame);
    }
    let ok = e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 40).await;
    let rows = sink_rows(&cloud.sink);
    assert!(ok, "{} of 40 frames in the sink; edge: {}", rows.len(), edge.metrics());
    let got: Vec<&[u8]> = rows.iter().map(|r| r.payload.as_slice()).collect();
    assert_eq!(got, sent.iter().map(Vec::as_slice).collect::<Vec<_>>(), "every frame once, in order, intact");
    // A read stops once its messages hold 8 MiB: ten of these frames.
    assert!(edge.metric("edge_uplink_batches_total") >= 4.0, "{}", edge.metrics());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_replaced_mid_stream_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), "").await;
    let addr: SocketAddr = cloud.bridge.quic_addr();
    let extra = format!("{}\n{}", classes_toml(), cloud.uplink_section("edge-1"));
    let edge = TestNode::start(&extra).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    publish(&publisher, "telemetry/a", 0..200).await;
    assert!(e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() >= 50).await);
    // The bridge goes away while traffic continues; the edge spools.
    cloud.bridge.stop().await;
    drop(cloud);
    publish(&publisher, "telemetry/b", 0..200).await;
    assert!(e2e_tests::eventually(WAIT, || edge.metric("edge_uplink_connected") == 0.0).await);
    // Another instance, same sink, same address.
    let cloud = TestCloud::start(dir.path(), keys, addr, "").await;
    let ok = e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 400).await;
    let rows = sink_rows(&cloud.sink);
    assert!(ok, "{} of 400 records after the takeover", rows.len());
    let mut got = payloads(&rows);
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 400, "no duplicates, nothing lost");
    assert!(edge.metric("edge_uplink_reconnects_total") >= 1.0);
}

/// The bridge comes back on a sink that lost its marks (a new SQLite file: a restored backup or
/// a recreated bucket is the same): the edge's lanes resume at the records it still holds.
/// Before, the bridge held every batch for the seqs the edge had deleted after their ack, and
/// nothing landed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_on_a_sink_that_lost_its_marks_resumes_every_lane() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), "").await;
    let addr: SocketAddr = cloud.bridge.quic_addr();
    let edge = TestNode::start(&format!("{}\n{}", classes_toml(), cloud.uplink_section("edge-1"))).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    publish(&publisher, "telemetry/a", 0..50).await;
    assert!(e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 50).await);
    assert!(e2e_tests::eventually(WAIT, || edge.metric("edge_spool_class_records{class=\"telemetry\"}") == 0.0).await);
    cloud.bridge.stop().await;
    drop(cloud);
    let fresh = dir.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    let cloud = TestCloud::start(&fresh, keys, addr, "").await;
    publish(&publisher, "telemetry/b", 0..50).await;
    let ok = e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 50).await;
    let rows = sink_rows(&cloud.sink);
    assert!(ok, "{} of the 50 new records on the new sink", rows.len());
    assert!(rows.iter().all(|r| r.topic.as_deref().is_some_and(|t| t.starts_with("telemetry/b/"))));
    assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), (51..=100).collect::<Vec<_>>());
    assert_eq!(cloud.metric("bridge_sessions_closed_total{reason=\"stalled\"}"), 0.0);
}

const DENIED: &str = "bridge_connections_refused_total{reason=\"denied_serial\"}";

/// A bridge with `deny_serial` on its deny list and edge `edge-1` of `keys` in front of it,
/// holding 10 telemetry messages: refused at least once, nothing in the sink, all 10 kept.
async fn a_denied_edge(
    dir: &tempfile::TempDir,
    keys: cloud_bridge::certs::Pki,
    deny_serial: &str,
) -> (TestCloud, TestNode) {
    let deny = format!("deny_serials = [\"{deny_serial}\"]");
    let cloud = TestCloud::start(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), &deny).await;
    let extra = format!("{}\n{}", classes_toml(), cloud.uplink_section("edge-1"));
    let edge = TestNode::start(&extra).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    publish(&publisher, "telemetry/x", 0..10).await;
    assert!(e2e_tests::eventually(WAIT, || cloud.metric(DENIED) >= 1.0).await, "{}", cloud.bridge.metrics().encode());
    assert!(sink_rows(&cloud.sink).is_empty(), "nothing from a denied certificate lands");
    let kept =
        e2e_tests::eventually(WAIT, || edge.metric("edge_spool_class_records{class=\"telemetry\"}") == 10.0).await;
    assert!(kept, "kept for a later bridge: {}", edge.metrics());
    (cloud, edge)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_certificate_is_refused_and_its_data_stays_spooled() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let cert = shared::tls::load_certs(&keys.edges[0].1).unwrap();
    let serial = shared::tls::certificate_serial(&cert[0]).unwrap();
    let (cloud, edge) = a_denied_edge(&dir, keys, &serial).await;
    // The edge tries again and is refused again; still nothing acked.
    assert!(e2e_tests::eventually(WAIT, || cloud.metric(DENIED) >= 2.0).await, "{}", cloud.bridge.metrics().encode());
    assert_eq!(edge.metric("edge_spool_class_records{class=\"telemetry\"}"), 10.0, "and never acked");
    // Refused, the edge retries at backoff_max (here 500 ms, jittered to 250-500 ms): it used
    // to reset its backoff on every handshake the bridge then closed, about 6 tries a second.
    let before = cloud.metric(DENIED);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tries = cloud.metric(DENIED) - before;
    assert!(tries <= 13.0, "{tries} tries in 3 s");
    assert!(edge.metric("edge_uplink_refused_total") >= 1.0, "{}", edge.metrics());
}

/// A serial with its high bit set is `00 80 d0 ...` in DER and `serial=80D0...` in what
/// `openssl x509 -serial` prints, which is what an operator pastes: the certificate is refused
/// all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_high_bit_serial_pasted_from_openssl_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (keys, printed) = e2e_tests::cloud::openssl_pki(dir.path(), "edge-1", "80D0A1B2C3D4E5F60718293A4B5C6D7E");
    assert_eq!(printed, "serial=80D0A1B2C3D4E5F60718293A4B5C6D7E");
    a_denied_edge(&dir, keys, &printed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_linger_to_fill_batches() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = TestCloud::start(dir.path(), pki(dir.path(), &[]), "127.0.0.1:0".parse().unwrap(), "").await;
    let extra = format!("{}\n{}linger = \"1s\"\n", classes_toml(), cloud.uplink_section("edge-1"));
    let edge = TestNode::start(&extra).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    // Thirty messages 10 ms apart: each lands in its own group commit.
    for i in 0..30 {
        publish(&publisher, "telemetry/slow", i..i + 1).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 30).await);
    let batches = edge.metric("edge_uplink_batches_total");
    assert!((1.0..=3.0).contains(&batches), "{batches} batches for 30 records");
}

/// A telemetry message such as a camera's metrics: keys and units repeat, values vary.
fn metrics_payload(i: u32) -> String {
    format!(
        r#"{{"camera":"cam-{}","temp_c":{}.{},"fps":{},"dropped_frames":{},"gpu_util":0.{},"status":"ok"}}"#,
        i % 5,
        40 + i % 13,
        i % 10,
        25 + i % 6,
        i % 4,
        i % 97
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dictionaries_are_trained_announced_once_and_found_by_the_next_bridge() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), "").await;
    let addr: SocketAddr = cloud.bridge.quic_addr();
    let extra = format!(
        "{}\n{}linger = \"20ms\"\ndict_size = \"2KiB\"\ndict_samples = \"16KiB\"\n",
        classes_toml(),
        cloud.uplink_section("edge-1")
    );
    let edge = TestNode::start(&extra).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    let mut sent = 0u32;
    // Enough traffic to train on, then until batches go out with the dictionary.
    let deadline = tokio::time::Instant::now() + WAIT;
    while edge.metric("edge_uplink_dict_batches_total") < 3.0 {
        assert!(tokio::time::Instant::now() < deadline, "no batch used a dictionary: {}", edge.metrics());
        for i in sent..sent + 50 {
            publisher.publish(&format!("telemetry/cam-{}", i % 5), QoS::AtLeastOnce, false, metrics_payload(i)).await;
        }
        sent += 50;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(edge.metric("edge_uplink_dicts_trained_total"), 1.0);
    assert_eq!(edge.metric("edge_uplink_dicts_announced_total"), 1.0);
    assert_eq!(cloud.metric("bridge_dicts_stored_total"), 1.0);
    let n = sent as usize;
    assert!(e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == n).await);

    // Another bridge on the same sink: it finds the dictionary there, so the edge neither
    // announces it again nor stops using it.
    cloud.bridge.stop().await;
    drop(cloud);
    let cloud = TestCloud::start(dir.path(), keys, addr, "").await;
    let before = edge.metric("edge_uplink_dict_batches_total");
    for i in sent..sent + 300 {
        publisher.publish(&format!("telemetry/cam-{}", i % 5), QoS::AtLeastOnce, false, metrics_payload(i)).await;
    }
    sent += 300;
    let n = sent as usize;
    let ok = e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == n).await;
    let rows = sink_rows(&cloud.sink);
    assert!(ok, "{} of {sent} records", rows.len());
    let mut got = payloads(&rows);
    got.sort();
    got.dedup();
    assert_eq!(got.len(), sent as usize, "each message exactly once, decoded");
    assert!(got.iter().any(|p| p.contains(&metrics_payload(sent - 1))), "payloads intact");
    assert!(edge.metric("edge_uplink_dict_batches_total") > before, "{}", edge.metrics());
    assert_eq!(edge.metric("edge_uplink_dicts_announced_total"), 1.0, "found, not announced again");
    assert_eq!(cloud.metric("bridge_dicts_stored_total"), 0.0);
}
