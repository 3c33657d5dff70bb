//! A bridge on a real three-server JetStream cluster (issue 30): it takes every server of the
//! cluster in `url`, makes the stream and the buckets R3 (scaling a stream made R1 before),
//! publishes through the SIGKILL of the
//! stream's leader under load, and starts again while the first server it names is down; every
//! record lands once.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, pki};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::nats::{NatsCluster, read_stream};
use e2e_tests::node::TestNode;
use rumqttc::QoS;

const WAIT: Duration = Duration::from_secs(60);

/// How many times each topic is in stream `EDGE`, read from server `at`.
async fn stored(cluster: &NatsCluster, at: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for m in read_stream(&cluster.url(at), "EDGE").await {
        *seen.entry(m.subject.to_string()).or_default() += 1;
    }
    seen
}

async fn stream_messages(cluster: &NatsCluster, at: usize) -> u64 {
    let Ok(client) = async_nats::connect(cluster.url(at)).await else { return 0 };
    let Ok(mut stream) = async_nats::jetstream::new(client).get_stream("EDGE").await else { return 0 };
    stream.info().await.map(|i| i.state.messages).unwrap_or(0)
}

/// The configured replicas of stream `name`. Right after a scale-up the stream's new Raft group
/// may still be electing, and on loaded CI cores a `STREAM.INFO` then outlives the client's
/// 5 s request timeout (seen once in CI): asked again until `WAIT`, as an operator would.
async fn replicas(js: &async_nats::jetstream::Context, name: &str) -> usize {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let error = match js.get_stream(name).await {
            Ok(mut stream) => match stream.info().await {
                Ok(info) => return info.config.num_replicas,
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        assert!(tokio::time::Instant::now() < deadline, "stream {name} unanswered: {error}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_on_a_three_server_cluster_loses_nothing_when_the_stream_leader_dies() {
    let mut cluster = NatsCluster::start().await;
    // A stream made R1 before (the old default): the bridge scales it to the configured 3.
    let js = async_nats::jetstream::new(async_nats::connect(cluster.url(1)).await.unwrap());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "EDGE".into(),
        subjects: vec!["edge.>".into()],
        duplicate_window: Duration::from_secs(120),
        num_replicas: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let section = format!("kind = \"jetstream\"\nurl = \"{}\"\nreplicas = 3\n", cluster.urls());
    let unused = dir.path().join("unused");
    let bind = "127.0.0.1:0".parse().unwrap();
    let cloud = TestCloud::start_with_sink(dir.path(), keys.clone(), bind, "", &section, unused.clone()).await;
    for name in ["EDGE", "KV_edge-marks", "KV_edge-dicts", "KV_edge-tco", "KV_edge-fleet"] {
        assert_eq!(replicas(&js, name).await, 3, "{name}");
    }

    let edge = TestNode::start(&format!("{}\n{}", with_spool(&[telemetry()]), cloud.uplink_section("edge-1"))).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    let publishing = tokio::spawn(async move {
        for i in 0..300 {
            publisher.publish(&format!("telemetry/load/{i}"), QoS::AtLeastOnce, false, format!("{i}")).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        publisher
    });
    // A third of the way in, the stream's leader dies.
    assert!(e2e_tests::eventually(WAIT, || cloud.committed("edge-1", 4) >= 100).await);
    let leader = cluster.stream_leader("EDGE").await;
    cluster.kill(leader);
    let publisher = publishing.await.unwrap();
    let live = (leader + 1) % 3;
    let deadline = tokio::time::Instant::now() + WAIT;
    while stream_messages(&cluster, live).await < 300 {
        assert!(tokio::time::Instant::now() < deadline, "{} of 300 stored", stream_messages(&cluster, live).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seen = stored(&cluster, live).await;
    assert_eq!(seen.len(), 300, "every record");
    assert!(
        seen.values().all(|n| *n == 1),
        "each once: {:?}",
        seen.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
    cluster.start_again(leader);
    cluster.wait_ready().await;

    // A new bridge while the first server it names is down: it takes another and goes on.
    let addr = cloud.bridge.quic_addr();
    cloud.bridge.stop().await;
    drop(cloud);
    cluster.kill(0);
    let cloud = TestCloud::start_with_sink(dir.path(), keys, addr, "", &section, unused).await;
    for i in 300..350 {
        publisher.publish(&format!("telemetry/load/{i}"), QoS::AtLeastOnce, false, format!("{i}")).await;
    }
    assert!(e2e_tests::eventually(WAIT, || cloud.committed("edge-1", 4) >= 350).await);
    let seen = stored(&cluster, 1).await;
    assert_eq!(seen.len(), 350);
    assert!(seen.values().all(|n| *n == 1));
}
