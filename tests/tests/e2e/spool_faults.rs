//! Storage faults injected under a running node (SQLite cannot be made to fill the disk or fail
//! an fsync on demand): each is logged once with its kind, counted in a metric, and the broker
//! keeps serving local traffic; `normal` messages wait in memory and are committed when the disk
//! recovers, `full` ones get no PUBACK.

use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::fixtures::{SPOOL, audit, classes, telemetry};
use e2e_tests::node::TestNode;
use edge_node::NodeOptions;
use edge_node::spool::fault::{Fault, Faults};
use edge_node::spool::{Lane, Seq, Spool, SqliteStorage};
use rumqttc::QoS;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(5);

fn classes_toml() -> String {
    format!("{SPOOL}commit_interval = \"5ms\"\n{}", classes(&[telemetry().priority(2), audit()]))
}

fn spooled_topics(path: &std::path::Path) -> Vec<String> {
    let mut spool = Spool::new(SqliteStorage::open(path).unwrap());
    (0..8)
        .flat_map(|l| spool.read(Lane(l), Seq(0), 100_000).unwrap())
        .filter_map(|r| r.message().map(|m| m.topic.clone()))
        .collect()
}

/// An MQTT 3.1.1 QoS1 publish on a raw socket: returns the PUBACK, or `None` if the connection
/// closed without one.
async fn raw_publish(addr: std::net::SocketAddr, topic: &str) -> Option<[u8; 4]> {
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(&[0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60, 0, 2, b'r', b'w']).await.unwrap();
    let mut connack = [0u8; 4];
    c.read_exact(&mut connack).await.unwrap();
    let mut body = (topic.len() as u16).to_be_bytes().to_vec();
    body.extend(topic.as_bytes());
    body.extend(7u16.to_be_bytes());
    body.extend(b"x");
    let mut frame = vec![0x32, body.len() as u8];
    frame.extend(body);
    c.write_all(&frame).await.unwrap();
    let mut ack = [0u8; 4];
    match tokio::time::timeout(WAIT, c.read_exact(&mut ack)).await.expect("an answer or a close") {
        Ok(_) => Some(ack),
        Err(_) => None,
    }
}

async fn fault_is_reported_and_survived(fault: Fault, kind: &str) {
    let faults = Faults::default();
    let options = NodeOptions { spool_faults: Some(faults.clone()) };
    let t = TestNode::start_with(tempfile::tempdir().unwrap(), &classes_toml(), options).await;
    let db = t.dir.path().join("spool.db");
    let mut local = Client::anonymous(t.local(), "local-app").await;
    local.subscribe("inference/#", QoS::AtLeastOnce).await;
    let publisher = Client::anonymous(t.local(), "pub").await;

    faults.fail(fault, u32::MAX);
    for i in 0..20 {
        publisher.publish(&format!("telemetry/cam/{i}"), QoS::AtLeastOnce, false, "waits").await;
        publisher.publish("inference/m/v1/cam", QoS::AtLeastOnce, false, "local").await;
    }
    for _ in 0..20 {
        assert!(local.recv(WAIT).await.is_some(), "local delivery stops while the spool fails");
    }
    let errors = format!("edge_spool_commit_errors_total{{kind=\"{kind}\"}}");
    assert!(e2e_tests::eventually(WAIT, || t.metric(&errors) > 0.0).await, "{}", t.metrics());
    assert_eq!(t.metric("edge_spool_healthy"), 0.0);
    // A `full` message gets no PUBACK while commits fail: the 3.1.1 connection closes instead.
    assert_eq!(raw_publish(t.local(), "audit/door/1").await, None, "PUBACK for a full message not on disk");
    let logs = e2e_tests::captured_logs();
    assert!(logs.contains("spool commit failed") && logs.contains(&format!("kind=\"{kind}\"")), "{logs}");
    assert!(logs.matches("spool commit failed").count() <= 2, "one line per failure run, not one per retry:\n{logs}");
    assert!(spooled_topics(&db).is_empty());

    faults.clear();
    let want: Vec<String> = (0..20).map(|i| format!("telemetry/cam/{i}")).collect();
    assert!(
        e2e_tests::eventually(WAIT, || spooled_topics(&db) == want).await,
        "the acknowledged normal messages reach the disk once it recovers: {:?}",
        spooled_topics(&db)
    );
    // The writer marks itself healthy after the commit a reader of the database sees first.
    assert!(e2e_tests::eventually(WAIT, || t.metric("edge_spool_healthy") == 1.0).await);
    assert!(e2e_tests::eventually(WAIT, || e2e_tests::captured_logs().contains("spool commits succeed again")).await);
    assert_eq!(raw_publish(t.local(), "audit/door/2").await.map(|a| a[0]), Some(0x40), "PUBACK once on disk");
    assert!(e2e_tests::eventually(WAIT, || spooled_topics(&db).contains(&"audit/door/2".to_owned())).await);
    assert!(!spooled_topics(&db).contains(&"audit/door/1".to_owned()), "the refused message was not kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_is_reported_and_local_traffic_flows() {
    fault_is_reported_and_survived(Fault::DiskFull, "disk_full").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_fsync_is_reported_and_local_traffic_flows() {
    fault_is_reported_and_survived(Fault::FsyncFailed, "io").await;
}

/// The per-class gauges and the oldest-unacked age follow what the spool holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_usage_and_age_are_exported() {
    let t = TestNode::start(&classes_toml()).await;
    let publisher = Client::anonymous(t.local(), "pub").await;
    for i in 0..10 {
        publisher.publish(&format!("telemetry/cam/{i}"), QoS::AtLeastOnce, false, vec![b'x'; 100]).await;
    }
    let records = "edge_spool_class_records{class=\"telemetry\"}";
    assert!(e2e_tests::eventually(WAIT, || t.metric(records) == 10.0).await, "{}", t.metrics());
    // Payload and topic bytes: 100 + "telemetry/cam/N".len() each.
    assert_eq!(t.metric("edge_spool_class_bytes{class=\"telemetry\"}"), 10.0 * (100.0 + 15.0));
    assert!(
        e2e_tests::eventually(Duration::from_secs(4), || t.metric("edge_spool_oldest_unacked_seconds") >= 1.0).await,
        "the oldest record ages"
    );
    assert!(t.metric("edge_spool_puback_to_commit_seconds_count") >= 10.0, "{}", t.metrics());
}
