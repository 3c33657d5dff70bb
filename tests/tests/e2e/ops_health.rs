//! Health that tells the truth (issue 30): the edge's `/readyz` names the probe, the spool and
//! the uplink, and fails when the uplink has been down with records waiting longer than
//! `health.max_backlog_age`, while `/healthz` (alive) stays 200; the bridge's names its QUIC
//! endpoint and its sink.

use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, pki, uplink_section};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::node::TestNode;
use e2e_tests::{health, health_check};
use rumqttc::QoS;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_on_a_long_uplink_outage_with_records_waiting_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], e2e_tests::free_port()));
    let extra = format!(
        "{}\n{}\n[health]\nmax_backlog_age = \"2s\"\n",
        with_spool(&[telemetry()]),
        uplink_section(&keys, "edge-1", &[addr], "")
    );
    let edge = TestNode::start(&extra).await;
    let http = edge.node.http_addr().unwrap();
    let uplink = |path| health_check(&health(http, path).1, "uplink");
    // The bridge is not there yet, but nothing waits for it: ready.
    let idle = e2e_tests::eventually(WAIT, || {
        health(http, "/readyz").0 == 200 && uplink("/readyz").is_some_and(|(ok, d)| ok && d.contains("nothing waiting"))
    })
    .await;
    assert!(idle, "{}", health(http, "/readyz").1);
    let (_, ready) = health(http, "/readyz");
    assert_eq!(health_check(&ready, "probe").map(|c| c.0), Some(true), "{ready}");
    assert_eq!(health_check(&ready, "spool").map(|c| c.0), Some(true), "{ready}");

    let publisher = Client::anonymous(edge.local(), "pub").await;
    publisher.publish("telemetry/a/1", QoS::AtLeastOnce, false, "waits").await;
    let unready = e2e_tests::eventually(WAIT, || {
        health(http, "/readyz").0 == 503
            && uplink("/readyz").is_some_and(|(ok, d)| !ok && d.contains("over health.max_backlog_age"))
    })
    .await;
    assert!(unready, "{}", health(http, "/readyz").1);
    let (alive, json) = health(http, "/healthz");
    assert_eq!(alive, 200, "alive all along: {json}");
    assert_eq!(json["checks"].as_array().map(Vec::len), Some(1), "only the probe: {json}");

    let cloud = TestCloud::start(dir.path(), keys, addr, "").await;
    let back = e2e_tests::eventually(WAIT, || {
        health(http, "/readyz").0 == 200 && uplink("/readyz").is_some_and(|(ok, d)| ok && d == "connected")
    })
    .await;
    assert!(back, "{}", health(http, "/readyz").1);
    let (status, bridge) = health(cloud.bridge.http_addr().unwrap(), "/readyz");
    assert_eq!(status, 200, "{bridge}");
    assert_eq!(health_check(&bridge, "quic").map(|c| c.0), Some(true), "{bridge}");
    assert_eq!(health_check(&bridge, "sink").map(|c| c.0), Some(true), "{bridge}");
}
