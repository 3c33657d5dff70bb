//! Everything at once: 100,000 QoS1 messages published on a real edge-node process (a `full`
//! class, so a PUBACK means committed in the spool) flow through the QUIC bridge into a real
//! nats-server, and while they flow the cloud bridge is restarted, nats-server is SIGKILLed and
//! restarted, the link is blackholed for 30 s, and the edge is SIGKILLed and restarted. Then
//! every acknowledged message is in the stream exactly once, in publish order per topic, with
//! its headers; the only others are the few whose PUBACK the edge's kill cut off.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use e2e_tests::cloud::{TestCloud, pki};
use e2e_tests::fixtures::{class, with_spool};
use e2e_tests::nats::{NatsServer, read_stream};
use e2e_tests::node::{EdgeProcess, config_text};
use e2e_tests::relay::UdpRelay;
use tokio::task::JoinHandle;

const TOTAL: u32 = 100_000;
const PUBLISHERS: usize = 16;
const PER: u32 = TOTAL / PUBLISHERS as u32;
const BLACKHOLE: Duration = Duration::from_secs(30);

fn classes_toml() -> String {
    with_spool(&[class("audit", "chaos/#", "central").governance("central-only").priority(0)])
}

fn topic(k: usize) -> String {
    format!("chaos/t{k:02}")
}

/// One publisher per topic, each continuing from its own next index.
fn publishers(edge: &EdgeProcess, round: u32, next: &[u32], progress: &Arc<AtomicU64>) -> Vec<JoinHandle<Vec<u32>>> {
    let addr = edge.addr("local");
    (0..PUBLISHERS)
        .map(|k| {
            let (progress, from) = (progress.clone(), next[k]);
            tokio::spawn(async move {
                let id = format!("chaos-{k}-{round}");
                e2e_tests::client::publish_range(addr, &id, &topic(k), &format!("t{k:02}"), from..PER, &progress).await
            })
        })
        .collect()
}

async fn wait_progress(progress: &AtomicU64, at_least: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while progress.load(Ordering::Relaxed) < at_least {
        assert!(Instant::now() < deadline, "{what}: only {} acked", progress.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_messages_survive_bridge_nats_link_and_edge_failures_exactly_once() {
    let mut nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let any = "127.0.0.1:0".parse().unwrap();
    let cloud = TestCloud::start_on_jetstream(dir.path(), keys.clone(), any, "", &nats.url()).await;
    let bridge_addr = cloud.bridge.quic_addr();
    let relay = UdpRelay::start(bridge_addr).await;
    let edge_dir = tempfile::tempdir().unwrap();
    let config = config_text(&format!("{}\n{}", classes_toml(), cloud.uplink_section_via("edge-1", relay.addr)));
    let mut edge = EdgeProcess::start(edge_dir.path(), &config);

    let progress = Arc::new(AtomicU64::new(0));
    let mut acked: Vec<Vec<u32>> = vec![Vec::new(); PUBLISHERS];
    let mut next = vec![0u32; PUBLISHERS];
    let round0 = publishers(&edge, 0, &next, &progress);

    wait_progress(&progress, 10_000, "before the bridge restart").await;
    cloud.bridge.stop().await;
    drop(cloud);
    let cloud = TestCloud::start_on_jetstream(dir.path(), keys, bridge_addr, "", &nats.url()).await;

    wait_progress(&progress, 20_000, "before the nats-server restart").await;
    tokio::task::block_in_place(|| nats.restart());

    wait_progress(&progress, 30_000, "before the blackhole").await;
    relay.impairment.set_blackhole(true);
    let blackhole_from = Instant::now();

    // The edge dies while the link is down and its spool holds the backlog.
    wait_progress(&progress, 45_000, "before the edge is killed").await;
    assert!(blackhole_from.elapsed() < BLACKHOLE, "publishing too slow to kill the edge during the blackhole");
    edge.signal("KILL");
    edge.wait_exit(Duration::from_secs(10)).expect("edge killed");
    // The publish in flight at the kill may or may not have been committed: no retry of it.
    let mut uncertain = HashSet::new();
    for (k, handle) in round0.into_iter().enumerate() {
        let got = handle.await.unwrap();
        let last = got.last().copied().map_or(next[k], |i| i + 1);
        acked[k].extend(got);
        if last < PER {
            uncertain.insert((k, last));
        }
        next[k] = (last + 1).min(PER);
    }
    let edge = EdgeProcess::start(edge_dir.path(), &config);
    let round1 = publishers(&edge, 1, &next, &progress);

    tokio::time::sleep(BLACKHOLE.saturating_sub(blackhole_from.elapsed())).await;
    relay.impairment.set_blackhole(false);
    for (k, handle) in round1.into_iter().enumerate() {
        let got = handle.await.unwrap();
        assert_eq!(got.len() as u32, PER - next[k], "publisher {k} stopped early");
        acked[k].extend(got);
    }
    let total_acked: usize = acked.iter().map(Vec::len).sum();
    assert!(total_acked >= TOTAL as usize - PUBLISHERS, "{total_acked} acked");

    // Drained: the bridge committed everything the edge holds.
    let drained = e2e_tests::eventually(Duration::from_secs(120), || {
        edge.metric("edge_spool_class_records{class=\"audit\"}") == 0.0
    })
    .await;
    assert!(drained, "spool not drained: {}", e2e_tests::http_get(edge.http.unwrap(), "/metrics"));

    let messages = read_stream(&nats.url(), "EDGE").await;
    let mut per_topic: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut ids = HashSet::new();
    let mut where_: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for m in &messages {
        let headers = m.headers.as_ref().expect("headers");
        let topic = headers.get("Mqtt-Topic").expect("Mqtt-Topic").as_str().to_owned();
        assert_eq!(m.subject.as_str(), format!("edge.edge-1.{}", topic.replace('/', ".")));
        assert_eq!(headers.get("Edge-Id").map(|v| v.as_str()), Some("edge-1"));
        let id = headers.get("Nats-Msg-Id").expect("Nats-Msg-Id").as_str().to_owned();
        assert!(ids.insert(id.clone()), "{id} twice in the stream");
        let payload = String::from_utf8_lossy(&m.payload).into_owned();
        let (tag, i) = payload.rsplit_once('-').expect("payload tag-i");
        assert_eq!(format!("chaos/{tag}"), topic);
        per_topic.entry(topic).or_default().push(i.parse().unwrap());
        where_.insert(payload, id);
    }
    for (k, want) in acked.iter().enumerate() {
        let got = per_topic.remove(&topic(k)).unwrap_or_default();
        if let Some(w) = got.windows(2).find(|w| w[0] >= w[1]) {
            let tag = format!("t{k:02}");
            panic!(
                "{}: {} then {} ({:?}, {:?}); uncertain {:?}",
                topic(k),
                w[0],
                w[1],
                where_.get(&format!("{tag}-{}", w[0])),
                where_.get(&format!("{tag}-{}", w[1])),
                uncertain
            );
        }
        let have: HashSet<u32> = got.iter().copied().collect();
        let missing: Vec<&u32> = want.iter().filter(|i| !have.contains(i)).collect();
        assert!(
            missing.is_empty(),
            "{}: {} acknowledged messages missing, e.g. {:?}",
            topic(k),
            missing.len(),
            missing.first()
        );
        let acked_set: HashSet<&u32> = want.iter().collect();
        for extra in got.iter().filter(|i| !acked_set.contains(i)) {
            assert!(uncertain.contains(&(k, *extra)), "{}: {extra} was never acknowledged", topic(k));
        }
    }
    assert!(per_topic.is_empty(), "unexpected topics: {:?}", per_topic.keys());
    assert!(messages.len() >= total_acked && messages.len() <= total_acked + uncertain.len());
    // The restarted edge found the link down and came back by itself.
    assert!(edge.metric("edge_uplink_reconnects_total") >= 1.0);
    drop(cloud);
}
