//! The fleet view (issue 19, item 6): per-edge detail across every bridge on one sink, from
//! `cloud-bridge edges list` and `GET /edges`, instead of metric series labelled by edge; edge
//! state writes capped in rate and not made by pings; an edge of a killed bridge shown lost.

use std::time::{Duration, Instant};

use cloud_bridge::fleet::view::{FleetView, Status};
use cloud_bridge::sink::{EdgeState, LaneState, Sink};
use e2e_tests::fleet::{BridgeProcess, Fleet, FleetSpec, client_configs, edges_list};
use e2e_tests::nats::NatsServer;

const WAIT: Duration = Duration::from_secs(30);

fn count(view: &FleetView, bridge: &str, status: Status) -> usize {
    view.edges.iter().filter(|e| e.bridge == bridge && e.status == status).count()
}

fn spec(addr: std::net::SocketAddr, edges: Vec<quinn::ClientConfig>, active: usize) -> FleetSpec {
    use shared::units::HumanDuration;
    let mut uplink = e2e_tests::simedge::uplink_defaults();
    // Batches of about 5 records; pings and reconnects quick enough for the view to follow.
    uplink.linger = HumanDuration(Duration::from_millis(250));
    uplink.keepalive = HumanDuration(Duration::from_millis(200));
    (uplink.backoff_min, uplink.backoff_max) =
        (HumanDuration(Duration::from_millis(100)), HumanDuration(Duration::from_millis(500)));
    FleetSpec {
        servers: vec![addr],
        edges,
        endpoints: 2,
        active,
        rate: 20.0,
        payload: 64,
        lanes: 1,
        backlog: 0,
        uplink,
        ramp: 0.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_view_shows_every_edge_across_bridges_and_the_edges_of_a_killed_bridge_as_lost() {
    const PER_BRIDGE: usize = 30;
    const ACTIVE: usize = 5;
    const INTERVAL_MS: u64 = 300;
    const RATE: f64 = 40.0;
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..2 * PER_BRIDGE).map(|i| format!("edge-{i:02}")).collect();
    let pki = cloud_bridge::certs::init(&dir.path().join("pki"), &[], &ids, false).unwrap();
    let sink = format!("kind = \"jetstream\"\nurl = \"{}\"\n", nats.url());
    let started = Instant::now();
    let mut bridges: Vec<BridgeProcess> = (0..2)
        .map(|i| {
            let d = dir.path().join(format!("bridge-{i}"));
            std::fs::create_dir_all(&d).unwrap();
            let fleet = format!(
                "[fleet]\nname = \"bridge-{i}\"\nstate_interval = \"{INTERVAL_MS}ms\"\nstate_writes_per_second = {RATE}\n"
            );
            BridgeProcess::start(&d, &pki, &sink, &fleet).unwrap()
        })
        .collect();
    let mut configs = client_configs(&pki).unwrap();
    let second = configs.split_off(PER_BRIDGE);
    let fleets = [
        Fleet::start(spec(bridges[0].quic, configs, ACTIVE)).await.unwrap(),
        Fleet::start(spec(bridges[1].quic, second, ACTIVE)).await.unwrap(),
    ];
    for f in &fleets {
        assert!(f.connected(PER_BRIDGE, WAIT).await.is_some(), "the fleet connected");
    }

    // Every edge of both bridges, from the CLI reading the bucket, and from either bridge.
    let all_in = |v: &FleetView| {
        count(v, "bridge-0", Status::Connected) == PER_BRIDGE && count(v, "bridge-1", Status::Connected) == PER_BRIDGE
    };
    let config = dir.path().join("bridge-0/cloud.toml");
    assert!(e2e_tests::eventually(WAIT, || all_in(&edges_list(&config))).await, "{:?}", edges_list(&config));
    // Bridge-1 answers from a view up to a second old (its cache): waited for too.
    let on_1 = || e2e_tests::cloud::fleet_view(bridges[1].http);
    assert!(
        e2e_tests::eventually(WAIT, || all_in(&on_1())).await,
        "GET /edges on bridge-1 shows bridge-0's edges too: {:?}",
        on_1()
    );
    let from_1 = on_1();
    assert_eq!(from_1.bridges.iter().filter(|b| b.live).count(), 2);
    // The welcome is written first; the marks follow once a batch is committed and its state's
    // turn comes (one interval later at most), so they are waited for, not expected at once.
    let marks = |v: &FleetView| {
        let active = v.edges.iter().find(|e| e.edge == "edge-00");
        active.is_some_and(|a| a.lanes.iter().any(|l| l.committed > 0))
    };
    let shown = e2e_tests::eventually(WAIT, || marks(&e2e_tests::cloud::fleet_view(bridges[1].http))).await;
    assert!(shown, "an active edge's marks: {:?}", e2e_tests::cloud::fleet_view(bridges[1].http));
    let from_1 = e2e_tests::cloud::fleet_view(bridges[1].http);
    let active = from_1.edges.iter().find(|e| e.edge == "edge-00").unwrap();
    assert_eq!(active.version, *shared::proto::VERSIONS.last().unwrap());
    // No metric series names an edge.
    let metrics = e2e_tests::http_get(bridges[0].http, "/metrics");
    assert!(!metrics.contains("edge=\""), "{metrics}");
    assert_eq!(e2e_tests::metric(&metrics, "bridge_edges_connected"), Some(PER_BRIDGE as f64));

    // Capped: never more writes than the rate allows since the bridge started (a slower machine
    // writes fewer, never more). 30 welcomes at once took at least 30 / 40 s.
    let written = bridges[0].metric("bridge_edge_states_written_total");
    let allowed = RATE * started.elapsed().as_secs_f64() + RATE / 10.0 + 1.0;
    assert!(written >= PER_BRIDGE as f64 && written <= allowed, "{written} written, {allowed:.0} allowed");
    // Not per ping: 30 edges pinging every 200 ms for 3 s would be 450 writes; only the 5 active
    // ones change (at most once per 300 ms each: 50), plus their last change. Counted from a
    // moment nothing waits to be written: under load the welcomes' writes, capped at 40 a
    // second, could still be draining (64 in one clean-clone CI run).
    let drained = e2e_tests::eventually(WAIT, || bridges[0].metric("bridge_edge_states_pending") == 0.0).await;
    assert!(drained, "the fleet writer never caught up");
    let written = bridges[0].metric("bridge_edge_states_written_total");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let more = bridges[0].metric("bridge_edge_states_written_total") - written;
    let most = ACTIVE as f64 * (3_000.0 / INTERVAL_MS as f64 + 2.0);
    assert!(more <= most, "{more} writes in 3 s, at most {most} expected");

    // A killed bridge writes no ends: its edges are shown lost after three of its intervals.
    bridges[0].kill();
    let lost = e2e_tests::eventually(WAIT, || {
        let v = edges_list(&config);
        count(&v, "bridge-0", Status::Lost) == PER_BRIDGE && count(&v, "bridge-1", Status::Connected) == PER_BRIDGE
    })
    .await;
    assert!(lost, "{:?}", edges_list(&config));
    let table = std::process::Command::new(e2e_tests::workspace_bin("cloud-bridge"))
        .args(["edges", "list", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("edges: 60 (30 connected, 30 lost)"), "{table}");
    assert!(table.lines().any(|l| l.trim_start().starts_with("bridge-0 ") && l.contains("silent")), "{table}");

    // Back: its edges reconnect and are connected again.
    bridges[0].restart().unwrap();
    assert!(e2e_tests::eventually(WAIT, || all_in(&edges_list(&config))).await, "{:?}", edges_list(&config));
    // Edges that close their sessions are shown disconnected.
    let [a, b] = fleets;
    drop(a.stop().await);
    let ended =
        e2e_tests::eventually(WAIT, || count(&edges_list(&config), "bridge-0", Status::Disconnected) == PER_BRIDGE)
            .await;
    assert!(ended, "{:?}", edges_list(&config));
    drop(b.stop().await);
}

fn state(session: u64, connected: bool, committed: u64) -> EdgeState {
    EdgeState {
        edge: "edge.1/x".into(),
        bridge: format!("bridge-{session}"),
        session,
        connected,
        version: 2,
        epoch: "ep".into(),
        remote: "127.0.0.1:1".into(),
        connected_ms: session,
        seen_ms: session,
        lanes: vec![LaneState { lane: 1, committed, head: Some(committed + 1) }],
        spool: None,
    }
}

/// Two bridges' sessions of one edge: the newer one's state is stored, then the older one
/// ends. The end must not replace the newer state, in either sink; the newer one's end does.
async fn the_end_of_an_older_session_keeps_the_newer(sink: &impl Sink) {
    assert_eq!(sink.store_edge_states(vec![state(1, true, 5), state(2, true, 6)]).await.unwrap(), [true, true]);
    assert_eq!(sink.store_edge_states(vec![state(1, false, 7)]).await.unwrap(), [false], "the older one's end");
    let stored = sink.load_fleet().await.unwrap().edges;
    assert_eq!(stored, [state(2, true, 6)]);
    assert_eq!(sink.store_edge_states(vec![state(2, false, 8)]).await.unwrap(), [true]);
    assert_eq!(sink.load_fleet().await.unwrap().edges, [state(2, false, 8)]);
    // An end over nothing is stored (the session's welcome was never written).
    let mut other = state(3, false, 1);
    other.edge = "edge-2".into();
    assert_eq!(sink.store_edge_states(vec![other.clone()]).await.unwrap(), [true]);
    assert_eq!(sink.load_fleet().await.unwrap().edges.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_an_older_session_never_hides_a_newer_one_in_either_sink() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = cloud_bridge::sink::sqlite::SqliteSink::open(&dir.path().join("central.db")).unwrap();
    the_end_of_an_older_session_keeps_the_newer(&sqlite).await;
    let nats = NatsServer::start();
    let settings = e2e_tests::nats::sink_settings(nats.url(), cloud_bridge::sink::jetstream::BatchPublish::Fast);
    let js = cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings).await.unwrap();
    the_end_of_an_older_session_keeps_the_newer(&js).await;
}
