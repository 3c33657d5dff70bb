//! Routes through the spool with real clients: `central` goes to the spool and not to local
//! subscribers, `both` to both, unclassified topics stay local; a `full` class PUBACKs only
//! after its commit; MQTT 5 properties are kept; SIGTERM loses nothing that was PUBACKed.

use std::path::Path;
use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::fixtures::{audit, feedback, telemetry, with_spool};
use e2e_tests::node::{EdgeProcess, TestNode, config_text};
use edge_node::spool::{Body, Lane, Record, Seq, Spool, SqliteStorage};
use rumqttc::QoS;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(5);

fn classes_toml() -> String {
    with_spool(&[telemetry().priority(2), feedback(), audit()])
}

/// Everything in the spool at `path`, all lanes, read through a second connection.
fn spooled(path: &Path) -> Vec<Record> {
    let mut spool = Spool::new(SqliteStorage::open(path).unwrap());
    (0..8).flat_map(|l| spool.read(Lane(l), Seq(0), 100_000).unwrap()).collect()
}

fn topics(records: &[Record]) -> Vec<String> {
    records.iter().filter_map(|r| r.message().map(|m| m.topic.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_decide_local_delivery_and_spooling() {
    let t = TestNode::start(&classes_toml()).await;
    let db = t.dir.path().join("spool.db");
    let mut everything = Client::anonymous(t.local(), "everything").await;
    everything.subscribe("#", QoS::AtLeastOnce).await;
    let publisher = Client::anonymous(t.local(), "pub").await;
    publisher.publish("telemetry/cam-1/metrics", QoS::AtLeastOnce, false, "central").await;
    publisher.publish("feedback/t-1/1", QoS::AtLeastOnce, false, "both").await;
    publisher.publish("inference/yolo/v1/cam-1", QoS::AtLeastOnce, false, "local").await;

    let mut local = Vec::new();
    while let Some(p) = everything.recv(Duration::from_millis(700)).await {
        local.push(p.topic);
    }
    local.sort();
    assert_eq!(local, ["feedback/t-1/1", "inference/yolo/v1/cam-1"], "central must not reach local subscribers");
    assert!(
        e2e_tests::eventually(WAIT, || {
            let mut spooled = topics(&spooled(&db));
            spooled.sort();
            spooled == ["feedback/t-1/1", "telemetry/cam-1/metrics"]
        })
        .await,
        "spool holds {:?}",
        topics(&spooled(&db))
    );
    let records = spooled(&db);
    let telemetry = records.iter().find(|r| r.message().is_some_and(|m| m.class == "telemetry")).unwrap();
    assert_eq!(telemetry.lane, Lane(2));
    assert_eq!(t.metric("edge_spool_appended_total{class=\"telemetry\"}"), 1.0);
    assert_eq!(t.metric("edge_spool_appended_total{class=\"feedback\"}"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_class_puback_means_committed_and_mqtt5_properties_are_kept() {
    let t = TestNode::start(&classes_toml()).await;
    let db = t.dir.path().join("spool.db");
    // A raw MQTT 5 client, so the PUBACK's arrival can be checked against the database.
    let mut c = tokio::net::TcpStream::connect(t.local()).await.unwrap();
    c.write_all(&[0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 60, 0, 0, 0]).await.unwrap();
    let mut head = [0u8; 2];
    c.read_exact(&mut head).await.unwrap();
    let mut connack = vec![0u8; head[1] as usize];
    c.read_exact(&mut connack).await.unwrap();
    assert_eq!((head[0], connack[1]), (0x20, 0), "CONNACK refused");
    for i in 0..20u16 {
        let topic = format!("audit/door-{i}");
        let mut body = (topic.len() as u16).to_be_bytes().to_vec();
        body.extend(topic.as_bytes());
        body.extend((i + 1).to_be_bytes());
        // Properties: content type "text/plain", user property trace-id = t-<i>.
        let trace = format!("t-{i}");
        let mut props = vec![0x03, 0, 10];
        props.extend(b"text/plain");
        props.extend([0x26, 0, 8]);
        props.extend(b"trace-id");
        props.extend((trace.len() as u16).to_be_bytes());
        props.extend(trace.as_bytes());
        body.push(props.len() as u8);
        body.extend(props);
        body.extend(b"opened");
        let mut frame = vec![0x32, body.len() as u8];
        frame.extend(body);
        c.write_all(&frame).await.unwrap();
        let mut ack = [0u8; 4];
        tokio::time::timeout(WAIT, c.read_exact(&mut ack)).await.expect("PUBACK").unwrap();
        assert_eq!((ack[0], u16::from_be_bytes([ack[2], ack[3]])), (0x40, i + 1));
        // The PUBACK is the promise: the record is already committed.
        let records = spooled(&db);
        let record = records
            .iter()
            .find(|r| r.message().is_some_and(|m| m.topic == topic))
            .unwrap_or_else(|| panic!("{topic} PUBACKed but not in the spool"));
        let m = record.message().unwrap();
        assert_eq!(m.properties.content_type.as_deref(), Some("text/plain"));
        assert_eq!(m.properties.user, [("trace-id".to_owned(), trace)]);
        assert_eq!(record.durability, edge_node::spool::Durability::Full);
        assert!(matches!(record.body, Body::Message(_)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_loses_nothing_that_was_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut edge = EdgeProcess::start(dir.path(), &config_text(&classes_toml()));
    let publisher = Client::anonymous(edge.addr("local"), "pub").await;
    for i in 0..2000u32 {
        publisher.publish("telemetry/cam-1/metrics", QoS::AtLeastOnce, false, i.to_string()).await;
    }
    // rumqttc sends in order and has 100 in flight at most: wait for the acks to drain by
    // publishing a last QoS1 message from a second client and seeing the counter.
    let http = edge.http.unwrap();
    let metrics = || {
        std::process::Command::new("curl")
            .args(["-s", &format!("http://{http}/metrics")])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    assert!(
        e2e_tests::eventually(Duration::from_secs(20), || { e2e_tests::client_publishes(&metrics()) == 2000.0 }).await,
        "publishes not all accepted"
    );
    edge.signal("TERM");
    let status = edge.wait_exit(Duration::from_secs(10)).expect("exit after SIGTERM");
    assert!(status.success(), "{}", edge.stderr());
    let payloads: Vec<u32> = spooled(&dir.path().join("spool.db"))
        .iter()
        .filter_map(|r| r.message().and_then(|m| std::str::from_utf8(&m.payload).ok()?.parse().ok()))
        .collect();
    assert_eq!(payloads, (0..2000).collect::<Vec<_>>(), "every acknowledged message is in the spool, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_points_loses_nothing_committed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("spool.db");
    let mut all_acked: Vec<String> = Vec::new();
    let mut epoch = None;
    for round in 0..3u32 {
        let mut edge = EdgeProcess::start(dir.path(), &config_text(&classes_toml()));
        let addr = edge.addr("local");
        let publisher = tokio::spawn(e2e_tests::client::publish_until_killed(addr, round, "audit/crash"));
        // A random moment under load, from the clock's low bits.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        tokio::time::sleep(Duration::from_millis(150 + u64::from(nanos % 400))).await;
        if round == 0 {
            // Operators can look while it runs.
            let config = dir.path().join("edge.toml");
            let out = std::process::Command::new(e2e_tests::workspace_bin("edge-node"))
                .args(["spool", "stats", "--config", config.to_str().unwrap()])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert!(stats["lanes"][0]["messages"].as_u64().unwrap() > 0, "{stats}");
            let out = std::process::Command::new(e2e_tests::workspace_bin("edge-node"))
                .args(["spool", "export", "--config", config.to_str().unwrap()])
                .output()
                .unwrap();
            assert!(out.status.success());
            let first: serde_json::Value =
                serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
            assert_eq!((first["topic"].as_str(), first["payload"].as_str()), (Some("audit/crash"), Some("r0-1")));
        }
        edge.signal("KILL");
        edge.wait_exit(WAIT).expect("killed");
        let acked = publisher.await.unwrap();
        assert!(!acked.is_empty(), "round {round}: nothing was acknowledged before the kill");
        all_acked.extend(acked);

        let mut spool = Spool::new(SqliteStorage::open(&db).unwrap());
        let e = spool.epoch().to_owned();
        assert_eq!(epoch.get_or_insert(e.clone()), &e, "epoch changed across a crash");
        let records = spool.read(Lane(0), Seq(0), 1_000_000).unwrap();
        // No holes: seqs run 1..=n (nothing is acked without a cloud).
        let seqs: Vec<u64> = records.iter().map(|r| r.seq.0).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "round {round}: seq holes");
        let payloads: Vec<String> = records
            .iter()
            .filter_map(|r| r.message().map(|m| String::from_utf8_lossy(&m.payload).into_owned()))
            .collect();
        for p in &all_acked {
            assert_eq!(
                payloads.iter().filter(|x| *x == p).count(),
                1,
                "round {round}: {p} acknowledged but present {} times",
                payloads.iter().filter(|x| *x == p).count()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_spool_at_startup_is_moved_aside_and_local_traffic_flows() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spool.db"), b"definitely not SQLite, a torn write perhaps").unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text(&classes_toml()));
    assert!(edge.stderr().contains("spool database damaged; salvaging what it holds"), "{}", edge.stderr());
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("spool.db.damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "the corrupt file is kept, not deleted");
    assert_eq!(edge.metric("edge_spool_moved_aside_total"), 1.0);
    let mut c = Client::anonymous(edge.addr("local"), "local").await;
    c.subscribe("inference/#", QoS::AtLeastOnce).await;
    c.publish("inference/m/v1/cam", QoS::AtLeastOnce, false, "ok").await;
    assert!(c.recv(WAIT).await.is_some(), "local delivery after a spool recovery");
    c.publish("telemetry/cam/metrics", QoS::AtLeastOnce, false, "spooled").await;
    let db = dir.path().join("spool.db");
    assert!(e2e_tests::eventually(WAIT, || topics(&spooled(&db)) == ["telemetry/cam/metrics"]).await);
}

/// MQTT 3.1.1 section 4.6: PUBACKs come back in the order the publishes were received, also when
/// the broker answers some (edge-direct) and the front others (central, refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubacks_keep_publish_order_across_routes() {
    let t = TestNode::start(&classes_toml()).await;
    let mut c = tokio::net::TcpStream::connect(t.local()).await.unwrap();
    c.write_all(&[0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60, 0, 2, b'o', b'k']).await.unwrap();
    let mut connack = [0u8; 4];
    c.read_exact(&mut connack).await.unwrap();
    let mut burst = Vec::new();
    for i in 1..=200u16 {
        let topic: &[u8] = if i % 2 == 0 { b"telemetry/c/m" } else { b"inference/m/v/c" };
        let mut body = (topic.len() as u16).to_be_bytes().to_vec();
        body.extend(topic);
        body.extend(i.to_be_bytes());
        body.extend(b"x");
        burst.extend([0x32, body.len() as u8]);
        burst.extend(body);
    }
    // One write: the front sees the publishes back to back.
    c.write_all(&burst).await.unwrap();
    let mut order = Vec::new();
    for _ in 0..200 {
        let mut ack = [0u8; 4];
        tokio::time::timeout(WAIT, c.read_exact(&mut ack)).await.expect("PUBACK").unwrap();
        assert_eq!(ack[0], 0x40);
        order.push(u16::from_be_bytes([ack[2], ack[3]]));
    }
    assert_eq!(order, (1..=200).collect::<Vec<u16>>(), "PUBACKs out of publish order");
}

/// A spool budget far too small for the telemetry sent: evictions are recorded as gap records
/// that add up exactly to what was dropped, the metric agrees, and local delivery keeps flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_budget_evicts_with_exact_accounting_while_local_delivery_flows() {
    let extra = classes_toml().replace("path = \"spool.db\"", "path = \"spool.db\"\nbudget = \"96 KiB\"");
    let t = TestNode::start(&extra).await;
    let db = t.dir.path().join("spool.db");
    let mut local = Client::anonymous(t.local(), "local-app").await;
    local.subscribe("inference/#", QoS::AtLeastOnce).await;
    let publisher = Client::anonymous(t.local(), "pub").await;
    const TELEMETRY: u64 = 600;
    for i in 0..TELEMETRY {
        publisher.publish("telemetry/cam-1/metrics", QoS::AtLeastOnce, false, vec![b'x'; 1000]).await;
        if i % 10 == 0 {
            publisher.publish("inference/m/v1/cam-1", QoS::AtLeastOnce, false, i.to_string()).await;
        }
    }
    let mut inference = 0;
    while local.recv(Duration::from_millis(700)).await.is_some() {
        inference += 1;
    }
    assert_eq!(inference, TELEMETRY / 10, "local delivery must not be held back by a full spool");

    assert!(
        e2e_tests::eventually(WAIT, || t.metric("edge_spool_appended_total{class=\"telemetry\"}") == TELEMETRY as f64)
            .await
    );
    // Every telemetry message is either still spooled or counted in a gap record, exactly once.
    let settled = e2e_tests::eventually(WAIT, || {
        let records = spooled(&db);
        let held = records.iter().filter(|r| r.message().is_some()).count() as u64;
        let in_gaps: u64 = records
            .iter()
            .filter_map(|r| match &r.body {
                Body::Gap(g) => Some(g.count),
                Body::Message(_) => None,
            })
            .sum();
        held + in_gaps == TELEMETRY
    })
    .await;
    assert!(settled, "held + gaps != sent");
    let in_gaps: u64 =
        spooled(&db).iter().filter_map(|r| if let Body::Gap(g) = &r.body { Some(g.count) } else { None }).sum();
    assert!(in_gaps > 0, "nothing was evicted under a 96 KiB budget");
    // The counter moves after the commit that wrote the gap records, which a reader of the
    // database can see first.
    let evicted = || t.metric("edge_spool_dropped_total{class=\"telemetry\",reason=\"evicted\"}");
    let agree = e2e_tests::eventually(WAIT, || evicted() as u64 == in_gaps).await;
    assert!(agree, "the metric ({}) and the gap records ({in_gaps}) agree", evicted());
    let on_disk: u64 =
        ["", "-wal"].iter().map(|s| std::fs::metadata(format!("{}{s}", db.display())).map_or(0, |m| m.len())).sum();
    assert!(on_disk < 1024 * 1024, "spool files hold {on_disk} bytes under a 96 KiB budget");
}
