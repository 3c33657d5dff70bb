//! The bridge over a bad link, through the UDP impairment relay: loss, delay and reordering,
//! then a blackhole long enough for the edge to report the link degraded. Everything arrives
//! exactly once, in seq order per lane.

use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, pki, sink_rows};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::node::TestNode;
use e2e_tests::relay::UdpRelay;
use rumqttc::QoS;

const WAIT: Duration = Duration::from_secs(60);

fn classes_toml() -> String {
    with_spool(&[telemetry().priority(2)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_delay_reordering_and_a_blackhole_lose_and_duplicate_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = TestCloud::start(dir.path(), pki(dir.path(), &[]), "127.0.0.1:0".parse().unwrap(), "").await;
    let relay = UdpRelay::start(cloud.bridge.quic_addr()).await;
    relay.impairment.set_loss(50);
    relay.impairment.set_delay(Duration::from_millis(20), Duration::from_millis(10));
    let edge =
        TestNode::start(&format!("{}\n{}", classes_toml(), cloud.uplink_section_via("edge-1", relay.addr))).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    for i in 0..1000 {
        publisher.publish(&format!("telemetry/c/{i}"), QoS::AtLeastOnce, false, format!("{i}")).await;
    }
    assert!(
        e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() >= 500).await,
        "{} rows through 5 % loss",
        sink_rows(&cloud.sink).len()
    );

    // The link goes dark: the edge notices (degraded, then the connection times out) and keeps
    // spooling; when it comes back, the backlog drains.
    relay.impairment.set_blackhole(true);
    for i in 1000..1500 {
        publisher.publish(&format!("telemetry/c/{i}"), QoS::AtLeastOnce, false, format!("{i}")).await;
    }
    let degraded = e2e_tests::eventually(Duration::from_secs(15), || {
        edge.metric("edge_uplink_degraded") == 1.0 || edge.metric("edge_uplink_connected") == 0.0
    })
    .await;
    assert!(degraded, "the edge did not notice the blackhole:\n{}", edge.metrics());
    relay.impairment.set_blackhole(false);
    relay.impairment.set_loss(0);

    let all = e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 1500).await;
    let rows = sink_rows(&cloud.sink);
    assert!(all, "{} of 1500 rows", rows.len());
    let seqs: Vec<u64> = rows.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=1500).collect::<Vec<u64>>(), "exactly once, in seq order");
    let mut payloads: Vec<u32> = rows.iter().map(|r| String::from_utf8_lossy(&r.payload).parse().unwrap()).collect();
    payloads.sort_unstable();
    assert_eq!(payloads, (0..1500).collect::<Vec<u32>>());
    assert!(relay.impairment.dropped.load(std::sync::atomic::Ordering::Relaxed) > 0, "the relay did drop datagrams");
    assert!(
        e2e_tests::eventually(WAIT, || edge.metric("edge_spool_class_records{class=\"telemetry\"}") == 0.0).await,
        "the spool empties once acked"
    );
}
