//! A fleet at CI size (issue 19): 500 simulated edges, each with its own certificate, all
//! connecting at once to one bridge in its own process on JetStream, 50 of them publishing; the
//! bridge SIGKILLed and started again under them. Every edge is admitted (the excess refused
//! before TLS and back within its busy windows), every edge finds the restarted bridge at once
//! (its stateless resets), the bridge's RSS stays bounded, the fleet view lists every edge
//! connected again, and JetStream holds every acked record of every edge once. Then a failover:
//! a fleet given two bridges, one killed under it, every edge on the other and each record once.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cloud_bridge::fleet::view::Status;
use e2e_tests::fleet::{BridgeProcess, Fleet, FleetSpec, client_configs, edges_list};
use e2e_tests::nats::{NatsServer, read_stream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_edges_ride_out_a_bridge_restart_exactly_once() {
    const EDGES: usize = 500;
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..EDGES).map(|i| format!("edge-{i:03}")).collect();
    let pki = cloud_bridge::certs::init(&dir.path().join("pki"), &[], &ids, false).unwrap();
    // 100 handshakes a second: 500 edges at once are a storm the admission must spread.
    let limits = "[limits]\nhandshakes_per_second = 100\nhandshake_burst = 100\n";
    let sink = format!("kind = \"jetstream\"\nurl = \"{}\"\n", nats.url());
    let mut bridge = BridgeProcess::start(dir.path(), &pki, &sink, limits).unwrap();
    let spec = FleetSpec {
        servers: vec![bridge.quic],
        edges: client_configs(&pki).unwrap(),
        endpoints: 4,
        active: 50,
        rate: 10.0,
        payload: 256,
        lanes: 1,
        backlog: 0,
        uplink: e2e_tests::simedge::uplink_defaults(),
        ramp: 0.0,
    };
    let fleet = Fleet::start(spec).await.unwrap();
    let admitted = fleet.connected(EDGES, Duration::from_secs(60)).await;
    let busy = fleet.stats.busy.load(Ordering::Relaxed);
    assert!(
        admitted.is_some(),
        "{} of {EDGES} connected; {}",
        fleet.stats.connected.load(Ordering::Relaxed),
        bridge.stderr()
    );
    assert!(busy > 0, "500 at once at 100 a second: some were refused before TLS");
    assert_eq!(fleet.stats.refused.load(Ordering::Relaxed), 0, "none refused for itself");
    tokio::time::sleep(Duration::from_secs(2)).await;

    let acked_before = fleet.stats.acked.load(Ordering::Relaxed);
    assert!(acked_before > 0, "the active edges were acked");
    let rss = e2e_tests::PeakRss::start(bridge.pid());
    let welcomes = fleet.stats.welcomes.load(Ordering::Relaxed);
    bridge.restart().unwrap();
    let t = std::time::Instant::now();
    let back = fleet.connected(EDGES, Duration::from_secs(60)).await;
    while fleet.stats.welcomes.load(Ordering::Relaxed) < welcomes + EDGES as u64 {
        assert!(t.elapsed() < Duration::from_secs(60), "not every edge reconnected: {}", bridge.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(back.is_some());
    // Well inside the 15 s idle timeout the edges would otherwise wait for: the restarted
    // bridge resets their old connections, and 500 at 100 a second take about 5 s.
    assert!(t.elapsed() < Duration::from_secs(14), "reconnected after {:?}", t.elapsed());
    let peak = rss.peak();
    drop(rss);
    assert!(peak < 200 << 20, "bridge RSS {} MiB during the storm", peak >> 20);
    // The fleet view from the bucket: every edge connected to the restarted bridge, written at
    // the default rate cap (200 a second: 500 welcomes in about 2.5 s).
    let listed = e2e_tests::eventually(Duration::from_secs(20), || {
        let view = edges_list(&bridge.config());
        view.edges.len() == EDGES && view.edges.iter().all(|e| e.status == Status::Connected)
    })
    .await;
    let view = edges_list(&bridge.config());
    let connected = view.edges.iter().filter(|e| e.status == Status::Connected).count();
    assert!(listed, "{connected} of {} listed edges connected", view.edges.len());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reports = fleet.stop().await;
    drop(bridge);

    exactly_once(&nats, &ids, &reports, 50).await;
}

/// 200 edges, each given both bridges and entering the list at a random place, 40 publishing on
/// two lanes after a backlog of 300 records on each; one bridge SIGKILLed and left dead. Its edges move to the other at their idle timeout (the
/// simulated edges do not probe), which then holds every edge, and JetStream holds every acked
/// record once, though two bridges wrote each moved edge's records and marks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edges_of_a_killed_bridge_move_to_the_other_exactly_once() {
    const EDGES: usize = 200;
    const ACTIVE: usize = 40;
    // Each active edge starts with this many records on each of its lanes.
    const LANES: u8 = 2;
    const BACKLOG: u64 = 300;
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..EDGES).map(|i| format!("edge-{i:03}")).collect();
    let pki = cloud_bridge::certs::init(&dir.path().join("pki"), &[], &ids, false).unwrap();
    let sink = format!("kind = \"jetstream\"\nurl = \"{}\"\n", nats.url());
    let mut bridges: Vec<BridgeProcess> = (0..2)
        .map(|i| {
            let d = dir.path().join(format!("bridge-{i}"));
            std::fs::create_dir_all(&d).unwrap();
            BridgeProcess::start(&d, &pki, &sink, "").unwrap()
        })
        .collect();
    let spec = FleetSpec {
        servers: bridges.iter().map(|b| b.quic).collect(),
        edges: client_configs(&pki).unwrap(),
        endpoints: 2,
        active: ACTIVE,
        rate: 10.0,
        payload: 256,
        lanes: LANES,
        backlog: BACKLOG,
        uplink: e2e_tests::simedge::uplink_defaults(),
        ramp: 0.0,
    };
    let fleet = Fleet::start(spec).await.unwrap();
    assert!(fleet.connected(EDGES, Duration::from_secs(60)).await.is_some(), "the fleet connected");
    let on = |b: &BridgeProcess| b.metric("bridge_edges_connected") as usize;
    let all_counted =
        e2e_tests::eventually(Duration::from_secs(10), || on(&bridges[0]) + on(&bridges[1]) == EDGES).await;
    let (first, second) = (on(&bridges[0]), on(&bridges[1]));
    assert!(all_counted && first > 0 && second > 0, "random starts spread the fleet: {first} + {second}");
    let backlogs = e2e_tests::eventually(Duration::from_secs(30), || {
        fleet.stats.acked.load(Ordering::Relaxed) >= ACTIVE as u64 * u64::from(LANES) * BACKLOG
    })
    .await;
    assert!(backlogs, "the backlogs were acked: {}", fleet.stats.acked.load(Ordering::Relaxed));

    let rss = e2e_tests::PeakRss::start(bridges[1].pid());
    bridges[0].kill();
    let t = std::time::Instant::now();
    let moved = e2e_tests::eventually(Duration::from_secs(60), || on(&bridges[1]) == EDGES).await;
    let took = t.elapsed();
    assert!(moved, "{} of {EDGES} on the live bridge: {}", on(&bridges[1]), bridges[1].stderr());
    // QUIC's 15 s idle timeout, then one handshake (an edge whose next attempt after a lost
    // session fell on the dead bridge waits one 10 s handshake timeout more).
    assert!(took < Duration::from_secs(40), "re-homed after {took:?}");
    eprintln!("{first} edges moved from the killed bridge in {took:?}");
    let peak = rss.peak();
    drop(rss);
    assert!(peak < 200 << 20, "live bridge RSS {} MiB while the edges moved", peak >> 20);
    let acked = fleet.stats.acked.load(Ordering::Relaxed);
    assert!(
        e2e_tests::eventually(Duration::from_secs(10), || fleet.stats.acked.load(Ordering::Relaxed) > acked).await,
        "the moved edges are acked by the live bridge"
    );
    let reports = fleet.stop().await;
    drop(bridges);
    exactly_once(&nats, &ids, &reports, ACTIVE).await;
}

/// Every active edge's records in the stream, on each of its lanes: seqs 1..=n, each once, n at
/// least what it was acked; no other edge wrote.
async fn exactly_once(nats: &NatsServer, ids: &[String], reports: &[e2e_tests::simedge::SimReport], active: usize) {
    let mut per_lane: BTreeMap<(String, usize), Vec<u64>> = BTreeMap::new();
    for m in read_stream(&nats.url(), "EDGE").await {
        let id = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).map(|v| v.as_str().to_owned());
        let id = id.unwrap_or_default();
        let mut parts = id.split(':');
        let (edge, _epoch, lane, seq) = (parts.next(), parts.next(), parts.next(), parts.next());
        let lane = lane.and_then(|l| l.parse().ok()).unwrap_or(usize::MAX);
        let seq = seq.and_then(|s| s.parse().ok()).unwrap_or(0);
        per_lane.entry((edge.unwrap_or_default().to_owned(), lane)).or_default().push(seq);
    }
    let lanes: usize = reports.iter().take(active).map(|r| r.acked.len()).sum();
    assert_eq!(per_lane.len(), lanes, "the {active} active edges' lanes, no one else's: {:?}", per_lane.keys());
    for (i, report) in reports.iter().enumerate().take(active) {
        for (lane, acked) in report.acked.iter().enumerate() {
            let mut seqs = per_lane.remove(&(ids[i].clone(), lane)).unwrap_or_default();
            seqs.sort_unstable();
            let n = seqs.len() as u64;
            assert_eq!(seqs, (1..=n).collect::<Vec<u64>>(), "{} lane {lane}: a hole or a duplicate", ids[i]);
            assert!(n >= *acked && *acked > 0, "{} lane {lane}: {n} stored, {acked} acked", ids[i]);
        }
    }
}
