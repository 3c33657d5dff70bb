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

/// Issue 43, finding 9: the session store is part of readiness. With its file locked by another
/// process, a durable session's SUBSCRIBE waits for a commit that cannot be made (its SUBACK
/// goes only once the subscription is stored): `/readyz` is 503 naming the session store within
/// `health.max_store_wait`, while the pending gauge shows what waits; released, it is 200 again
/// and the SUBACK comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_while_the_session_store_cannot_commit_and_recovers() {
    let edge = TestNode::start("[health]\nmax_store_wait = \"1s\"\n").await;
    let http = edge.node.http_addr().unwrap();
    let store = |path| health_check(&health(http, path).1, "session store");
    let idle =
        e2e_tests::eventually(WAIT, || health(http, "/readyz").0 == 200 && store("/readyz").is_some_and(|(ok, _)| ok))
            .await;
    assert!(idle, "{}", health(http, "/readyz").1);

    let file = edge.dir.path().join("spool/sessions.db");
    let lock = rusqlite::Connection::open(&file).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE; INSERT INTO meta (key, value) VALUES ('held', 'by a test');").unwrap();
    let mut options = e2e_tests::client::options(edge.local(), "durable");
    options.set_clean_session(false);
    let mut sub = Client::connect(options).await.unwrap();
    let suback = tokio::spawn(async move { sub.subscribe("held/#", QoS::AtLeastOnce).await });
    let unready = e2e_tests::eventually(WAIT, || {
        health(http, "/readyz").0 == 503 && store("/readyz").is_some_and(|(ok, d)| !ok && d.contains("waiting"))
    })
    .await;
    assert!(unready, "{}", health(http, "/readyz").1);
    assert!(!suback.is_finished(), "no SUBACK before the subscription is stored");
    let metrics = e2e_tests::http_get(http, "/metrics");
    let pending =
        metrics.lines().find(|l| l.starts_with("edge_session_store_pending_ops ")).and_then(|l| l.rsplit_once(' '));
    assert!(
        pending.is_some_and(|(_, n)| n.trim().parse::<f64>().is_ok_and(|n| n >= 1.0)),
        "the pending gauge shows the op that waits:\n{metrics}"
    );
    assert_eq!(health(http, "/healthz").0, 200, "alive all along");

    lock.execute_batch("ROLLBACK").unwrap();
    let back =
        e2e_tests::eventually(WAIT, || health(http, "/readyz").0 == 200 && store("/readyz").is_some_and(|(ok, _)| ok))
            .await;
    assert!(back, "{}", health(http, "/readyz").1);
    let codes = tokio::time::timeout(WAIT, suback).await.expect("SUBACK once the store commits").unwrap();
    assert_eq!(codes, [rumqttc::SubscribeReasonCode::Success(QoS::AtLeastOnce)]);
}

/// Issue 43, finding 9 (the bridge's side): `/readyz` follows the sink's state as a probe finds
/// it, not a latch of the last uplink write. With no edge connected, so nothing writes: a
/// nats-server killed makes it 503 naming the sink, started again 200; a SQLite sink locked by
/// another process 503, released 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridges_readiness_follows_its_sink_with_nothing_writing() {
    let ready = |http, want: u16| {
        e2e_tests::eventually(WAIT, move || {
            let (status, json) = health(http, "/readyz");
            status == want && health_check(&json, "sink").is_some_and(|(ok, _)| ok == (want == 200))
        })
    };

    let dir = tempfile::tempdir().unwrap();
    let mut nats = e2e_tests::nats::NatsServer::start();
    let bind = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let cloud = TestCloud::start_on_jetstream(dir.path(), pki(dir.path(), &[]), bind, "", &nats.url()).await;
    let http = cloud.bridge.http_addr().unwrap();
    assert!(ready(http, 200).await, "{}", health(http, "/readyz").1);
    nats.stop();
    assert!(ready(http, 503).await, "the sink down with nothing writing: {}", health(http, "/readyz").1);
    assert_eq!(health(http, "/healthz").0, 200, "alive: the QUIC endpoint accepts");
    nats.start_again();
    assert!(ready(http, 200).await, "back with nothing written: {}", health(http, "/readyz").1);
    cloud.bridge.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let cloud = TestCloud::start(dir.path(), pki(dir.path(), &[]), bind, "").await;
    let http = cloud.bridge.http_addr().unwrap();
    assert!(ready(http, 200).await, "{}", health(http, "/readyz").1);
    let lock = rusqlite::Connection::open(dir.path().join("central.db")).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    assert!(ready(http, 503).await, "the sink locked: {}", health(http, "/readyz").1);
    let (_, json) = health(http, "/readyz");
    let detail = health_check(&json, "sink").unwrap().1;
    assert!(detail.contains("probe") && detail.contains("locked"), "names the probe and the lock: {detail}");
    lock.execute_batch("ROLLBACK").unwrap();
    assert!(ready(http, 200).await, "released: {}", health(http, "/readyz").1);
}
