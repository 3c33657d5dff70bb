//! Several bridges serving one edge (issue 19): the edge lists three, one is SIGKILLed under
//! load and later restarted, then the one the edge moved to is killed too. Every message the
//! edge PUBACKed (a `full` class: committed to its spool) is in JetStream once, no Msg-Id twice,
//! and the edge is on another bridge well before QUIC's idle timeout would have told it. Two
//! bridges holding sessions of one edge at once, and their marks' compare-and-set.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use e2e_tests::cloud::uplink_section;
use e2e_tests::fixtures::{audit, with_spool};
use e2e_tests::fleet::BridgeProcess;
use e2e_tests::nats::{NatsServer, read_stream};
use e2e_tests::node::{EdgeProcess, config_text};

const MESSAGES: u32 = 3_000;

/// Publishes `m-0` .. `m-<MESSAGES>` in chunks of 30 a tenth of a second apart (a load that
/// lasts about 10 s however fast the machine), returning the indices the edge acked.
async fn paced_load(addr: std::net::SocketAddr, progress: Arc<AtomicU64>) -> Vec<u32> {
    let mut acked = Vec::new();
    for start in (0..MESSAGES).step_by(30) {
        let range = start..(start + 30).min(MESSAGES);
        acked.extend(e2e_tests::client::publish_range(addr, "pub", "audit/door", "m", range, &progress).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    acked
}

/// A nats-server, a PKI with `edge-1`, and `n` bridge processes on JetStream.
struct Cloud {
    nats: NatsServer,
    pki: cloud_bridge::certs::Pki,
    bridges: Vec<BridgeProcess>,
    _dir: tempfile::TempDir,
}

fn cloud(n: usize) -> Cloud {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let pki = cloud_bridge::certs::init(&dir.path().join("pki"), &[], &["edge-1".to_owned()], false).unwrap();
    let sink = format!("kind = \"jetstream\"\nurl = \"{}\"\n", nats.url());
    let bridges = (0..n)
        .map(|i| {
            let d = dir.path().join(format!("bridge-{i}"));
            std::fs::create_dir_all(&d).unwrap();
            BridgeProcess::start(&d, &pki, &sink, "").unwrap()
        })
        .collect();
    Cloud { nats, pki, bridges, _dir: dir }
}

/// An edge process with `uplink` and the paced load running into it.
struct LoadedEdge {
    edge: EdgeProcess,
    publisher: tokio::task::JoinHandle<Vec<u32>>,
    progress: Arc<AtomicU64>,
    _dir: tempfile::TempDir,
}

fn loaded_edge(uplink: &str) -> LoadedEdge {
    let dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text(&format!("{}\n{uplink}", with_spool(&[audit()]))));
    let progress = Arc::new(AtomicU64::new(0));
    let publisher = tokio::spawn({
        let (addr, progress) = (edge.addr("local"), progress.clone());
        async move { paced_load(addr, progress).await }
    });
    LoadedEdge { edge, publisher, progress, _dir: dir }
}

/// The bridge, of `bridges`, that holds a connection now.
fn holder(bridges: &[BridgeProcess]) -> Option<usize> {
    bridges.iter().position(|b| b.metric("bridge_connections") >= 1.0)
}

async fn wait_for_holder(bridges: &[BridgeProcess], not: Option<usize>, timeout: Duration) -> Option<usize> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(i) = holder(bridges).filter(|i| Some(*i) != not) {
            return Some(i);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Each stream message's Msg-Id and payload.
async fn stored(url: &str) -> Vec<(String, String)> {
    read_stream(url, "EDGE")
        .await
        .iter()
        .map(|m| {
            let id = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).map(|v| v.as_str().to_owned());
            (id.unwrap_or_default(), String::from_utf8_lossy(&m.payload).into_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_with_three_bridges_moves_on_when_one_dies_and_loses_nothing() {
    let Cloud { nats, pki, mut bridges, _dir } = cloud(3);
    let addrs: Vec<_> = bridges.iter().map(|b| b.quic).collect();
    let LoadedEdge { edge, publisher, progress, _dir: _edge_dir } =
        loaded_edge(&e2e_tests::cloud::uplink_section_with_defaults(&pki, "edge-1", &addrs, ""));
    let first = wait_for_holder(&bridges, None, Duration::from_secs(20)).await.expect("the edge connected");
    let records = || edge.metric("edge_uplink_records_total");
    assert!(e2e_tests::eventually(Duration::from_secs(20), || records() > 100.0).await, "records flow");

    // Kill the bridge the edge is on, mid-stream.
    bridges[first].kill();
    let killed = Instant::now();
    let second = wait_for_holder(&bridges, Some(first), Duration::from_secs(30)).await.expect("the edge moved on");
    let moved = killed.elapsed();
    eprintln!("re-homed from bridge {first} to {second} after {moved:?}");
    let sent = records();
    assert!(e2e_tests::eventually(Duration::from_secs(10), || records() > sent).await, "records flow again");
    // With the shipped defaults: seen dead after ack_timeout (2 s) and three unanswered probe
    // rounds (0.2 s each on loopback), not at the 15 s idle timeout; then the next bridge at
    // once.
    assert!(moved < Duration::from_secs(8), "re-homed after {moved:?}");
    assert!(progress.load(Ordering::Relaxed) < u64::from(MESSAGES), "the load was still running when it moved");

    // The dead one comes back; the edge's current one dies: the edge moves again.
    bridges[first].restart().unwrap();
    bridges[second].kill();
    let third = wait_for_holder(&bridges, Some(second), Duration::from_secs(30)).await.expect("moved again");
    bridges[second].restart().unwrap();

    let acked = tokio::time::timeout(Duration::from_secs(120), publisher).await.expect("publisher done").unwrap();
    assert_eq!(acked.len(), MESSAGES as usize, "every publish acked by the edge");
    let drained = e2e_tests::eventually(Duration::from_secs(60), || {
        edge.metric("edge_spool_class_records{class=\"audit\"}") == 0.0
    })
    .await;
    assert!(drained, "the spool drained: {}", edge.stderr());
    tokio::time::sleep(Duration::from_millis(500)).await;

    let stored = stored(&nats.url()).await;
    let mut ids: BTreeMap<&str, usize> = BTreeMap::new();
    let mut payloads: BTreeMap<&str, usize> = BTreeMap::new();
    for (id, payload) in &stored {
        *ids.entry(id).or_default() += 1;
        *payloads.entry(payload).or_default() += 1;
    }
    let twice: Vec<_> = ids.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "Msg-Ids stored twice: {twice:?}");
    let missing: Vec<String> =
        acked.iter().map(|i| format!("m-{i}")).filter(|p| !payloads.contains_key(p.as_str())).collect();
    assert!(missing.is_empty(), "{} acked messages missing, e.g. {:?}", missing.len(), missing.first());
    assert_eq!(stored.len(), MESSAGES as usize, "nothing else stored");
    assert_ne!(first, second);
    assert_ne!(second, third);
}

/// Two bridges hold sessions of one edge at once: the edge's path to the first goes dark (the
/// first keeps its session until its own 30 s idle timeout), the edge moves to the second and
/// resends from the marks it finds there while the first may still be publishing and marking
/// what it had. Every record lands once, and the mark ends at the last seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bridges_holding_one_edge_at_once_store_each_record_once() {
    let Cloud { nats, pki, bridges, _dir } = cloud(2);
    let relays = [
        e2e_tests::relay::UdpRelay::start(bridges[0].quic).await,
        e2e_tests::relay::UdpRelay::start(bridges[1].quic).await,
    ];
    let uplink = uplink_section(&pki, "edge-1", &[relays[0].addr, relays[1].addr], "probe_interval = \"200ms\"");
    let LoadedEdge { edge, publisher, _dir: _edge_dir, .. } = loaded_edge(&uplink);
    let first = wait_for_holder(&bridges, None, Duration::from_secs(20)).await.expect("connected");
    assert!(e2e_tests::eventually(Duration::from_secs(20), || edge.metric("edge_uplink_records_total") > 100.0).await);
    relays[first].impairment.set_blackhole(true);
    let other = 1 - first;
    let both = e2e_tests::eventually(Duration::from_secs(20), || {
        bridges[other].metric("bridge_connections") >= 1.0 && bridges[first].metric("bridge_connections") >= 1.0
    })
    .await;
    assert!(both, "both bridges held a session of the edge at once");
    // The first path comes back while the first bridge still holds its old session.
    relays[first].impairment.set_blackhole(false);
    let acked = tokio::time::timeout(Duration::from_secs(120), publisher).await.expect("publisher done").unwrap();
    assert_eq!(acked.len(), MESSAGES as usize);
    assert!(
        e2e_tests::eventually(Duration::from_secs(60), || edge.metric("edge_spool_class_records{class=\"audit\"}")
            == 0.0)
        .await,
        "drained: {}",
        edge.stderr()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stored = stored(&nats.url()).await;
    let mut seqs: Vec<u64> =
        stored.iter().filter_map(|(id, _)| id.rsplit(':').next().and_then(|s| s.parse().ok())).collect();
    seqs.sort_unstable();
    let n = seqs.len();
    seqs.dedup();
    assert_eq!(n, seqs.len(), "{} seqs stored twice", n - seqs.len());
    assert_eq!(seqs, (1..=u64::from(MESSAGES)).collect::<Vec<_>>(), "each seq once: {n} stored");
}

/// The marks' compare-and-set, two bridges' sinks at once: one raises the mark to 400 while the
/// other, with a stale cached revision, writes lower marks down to 1. A lower mark never wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_mark_from_another_bridge_never_lowers_the_mark() {
    use cloud_bridge::sink::RecordSink;
    use cloud_bridge::sink::jetstream::{BatchPublish, JetStreamSink};
    let nats = NatsServer::start();
    let settings = e2e_tests::nats::sink_settings(nats.url(), BatchPublish::Fast);
    let (a, b) = (JetStreamSink::connect(&settings).await.unwrap(), JetStreamSink::connect(&settings).await.unwrap());
    b.mark("edge-1", "ep", 2, 1).await.unwrap();
    let up = async {
        for seq in 1..=400 {
            a.mark("edge-1", "ep", 2, seq).await.unwrap();
        }
    };
    let down = async {
        for seq in (1..=300).rev() {
            b.mark("edge-1", "ep", 2, seq).await.unwrap();
        }
    };
    tokio::join!(up, down);
    for sink in [&a, &b] {
        let got: Vec<(u8, u64)> =
            sink.committed("edge-1", "ep").await.unwrap().iter().map(|m| (m.lane.0, m.seq.0)).collect();
        assert_eq!(got, vec![(2, 400)]);
    }
}

/// Resync after an outage (issue 19, item 5): the path to the bridge goes dark for 10 s, with
/// a backoff of 30 s. The edge gives the dead connection up on unanswered probes, waits for a
/// probe's answer instead of its backoff, and is acked again within moments of the path coming
/// back; on backoff alone it would come back 15 to 30 s after giving up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_the_edge_is_back_when_a_probe_is_answered_not_at_its_backoff() {
    let Cloud { nats: _nats, pki, bridges, _dir } = cloud(1);
    let relay = e2e_tests::relay::UdpRelay::start(bridges[0].quic).await;
    let uplink = uplink_section(&pki, "edge-1", &[relay.addr], "probe_interval = \"200ms\"")
        .replace("backoff_min = \"50ms\"", "backoff_min = \"30s\"")
        .replace("backoff_max = \"500ms\"", "backoff_max = \"30s\"");
    let LoadedEdge { edge, publisher, _dir: _edge_dir, .. } = loaded_edge(&uplink);
    let commits = || edge.metric("edge_uplink_commit_latency_seconds_count");
    assert!(e2e_tests::eventually(Duration::from_secs(20), || commits() > 0.0).await, "acked before the outage");
    relay.impairment.set_blackhole(true);
    let down = e2e_tests::eventually(Duration::from_secs(15), || edge.metric("edge_uplink_connected") == 0.0).await;
    assert!(down, "the edge gave the dark path up");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = commits();
    relay.impairment.set_blackhole(false);
    let restored = Instant::now();
    let back = e2e_tests::eventually(Duration::from_secs(40), || commits() > before).await;
    let took = restored.elapsed();
    eprintln!("first ack {took:?} after the path came back");
    assert!(back, "acked again");
    assert!(took < Duration::from_secs(5), "first ack {took:?} after the path came back");
    assert!(edge.metric("edge_uplink_probe_answers_total") >= 1.0);
    publisher.abort();
}
