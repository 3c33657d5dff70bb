//! The downlink under failures (issue 31): three edge processes, two bridge processes on one
//! sink (SQLite, a real nats-server with JetStream, and a three-broker Kafka cluster, one of
//! whose brokers is SIGKILLed with the bridge and started again), a durable MQTT 5 subscriber on each
//! edge. 1,000 messages for each edge (half QoS 2 on `cmd/<edge>`, half QoS 1 on
//! `config/<edge>`) and 100 to every edge are stored through `downlink::send`, the code
//! `cloud-bridge send` runs, while one edge is SIGKILLed and started again, one bridge is
//! SIGKILLed (its edges move to the other), and the third edge, offline all along, starts
//! late. Every subscriber gets every message of its topics, in order per topic (the first
//! copies), and a second copy only as the broker's own resend: a QoS 1 duplicate carries DUP
//! (MQTT 5.0 §3.3.1.1), a QoS 2 one carries DUP and the packet id of the copy it repeats (a
//! retransmission before PUBREC, which a receiver using Method B discards, §4.3.3); a copy the
//! downlink delivered twice would be a new PUBLISH without DUP. Messages whose expiry ran out
//! while their edge was offline never arrive, and a topic an edge does not allow is refused
//! and listed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloud_bridge::certs::Pki;
use cloud_bridge::downlink::DownlinkConfig;
use cloud_bridge::downlink::send::{self, Flags, Target};
use cloud_bridge::sink::{DownlinkStore, FleetStore};
use e2e_tests::cloud::{pki, uplink_section};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::fleet::{BridgeProcess, edges_list};
use e2e_tests::nats::NatsServer;
use e2e_tests::node::EdgeProcess;

const EDGES: [&str; 3] = ["e1", "e2", "e3"];
const PER_EDGE: usize = 1000;
const BROADCASTS: usize = 100;
const EXPIRING: usize = 5;
const WAIT: Duration = Duration::from_secs(60);

/// One PUBLISH a subscriber got: topic, payload, DUP, packet id.
type Got = (String, String, bool, u16);

const SUBSCRIBER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/paho_downlink_sub.py");

/// A local app on `addr`: paho-mqtt with a durable MQTT 5 session (`cmd/#` at QoS 2,
/// `config/#` at QoS 1) that reconnects whenever the edge comes back, and what it got. paho,
/// not rumqttc: rumqttc forgets its QoS 2 state at a reconnect and answers the PUBREL the
/// broker must resend (MQTT 5.0 §4.4) by closing the connection, again and again.
struct Subscriber {
    child: std::process::Child,
    got: Arc<Mutex<Vec<Got>>>,
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn subscriber(edge: &str, addr: SocketAddr) -> Subscriber {
    use std::io::BufRead;
    let mut child = std::process::Command::new("python3")
        .arg(SUBSCRIBER)
        .args([addr.ip().to_string(), addr.port().to_string(), format!("app-{edge}")])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with paho-mqtt (scripts/install-test-deps.sh)");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().and_then(Result::ok);
    assert_eq!(first.as_deref(), Some("subscribed"), "the app's SUBACK");
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = got.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if let Ok((topic, payload, dup, mid)) = serde_json::from_str::<Got>(&line) {
                seen.lock().unwrap().push((topic, payload, dup, mid));
            }
        }
    });
    Subscriber { child, got }
}

fn edge_config(pki: &Pki, edge: &str, port: u16, bridges: &[SocketAddr]) -> String {
    format!(
        "node_id = \"{edge}\"\n[http]\nbind = \"127.0.0.1:0\"\n\
         [[listener]]\nname = \"local\"\nbind = \"127.0.0.1:{port}\"\nanonymous = true\n\
         {}\n{}\n[[downlink]]\nfilter = \"cmd/#\"\n[[downlink]]\nfilter = \"config/#\"\nmax_qos = 1\n",
        with_spool(&[telemetry()]),
        uplink_section(pki, edge, bridges, "")
    )
}

/// What each subscriber must end with: per topic, the payloads in order.
fn expected() -> BTreeMap<&'static str, BTreeMap<String, Vec<String>>> {
    EDGES
        .iter()
        .map(|e| {
            let mut topics = BTreeMap::new();
            topics.insert(format!("cmd/{e}"), (0..PER_EDGE / 2).map(|i| i.to_string()).collect());
            topics.insert(format!("config/{e}"), (0..PER_EDGE / 2).map(|i| i.to_string()).collect());
            topics.insert("cmd/all".to_owned(), (0..BROADCASTS).map(|i| format!("b{i}")).collect());
            (*e, topics)
        })
        .collect()
}

/// Per topic, the payloads in the order first seen; and the duplicates the broker's resends do
/// not explain.
fn check(got: &[Got]) -> (BTreeMap<String, Vec<String>>, Vec<String>) {
    let mut first: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut copies: BTreeMap<(String, String), u16> = BTreeMap::new();
    let mut unexplained = Vec::new();
    for (topic, payload, dup, pkid) in got {
        match copies.get(&(topic.clone(), payload.clone())) {
            None => {
                copies.insert((topic.clone(), payload.clone()), *pkid);
                first.entry(topic.clone()).or_default().push(payload.clone());
            }
            Some(earlier) => {
                let qos2 = topic.starts_with("cmd/");
                if !dup || (qos2 && earlier != pkid) {
                    unexplained.push(format!("{topic} {payload} dup={dup} pkid {pkid} (first {earlier})"));
                }
            }
        }
    }
    (first, unexplained)
}

/// `fault` is told when the bridge is killed (`"bridge killed"`) and when every message is
/// stored (`"stored"`), for what else the sink's servers go through meanwhile.
async fn chaos<S: DownlinkStore + FleetStore>(
    dir: &Path,
    sink_section: &str,
    sink: S,
    mut fault: impl FnMut(&'static str),
) {
    let keys = pki(dir, &EDGES);
    let downlink = "[downlink]\npoll = \"1s\"\n";
    let (d1, d2) = (dir.join("b1"), dir.join("b2"));
    std::fs::create_dir_all(&d1).unwrap();
    std::fs::create_dir_all(&d2).unwrap();
    let mut b1 = BridgeProcess::start(&d1, &keys, sink_section, downlink).unwrap();
    let b2 = BridgeProcess::start(&d2, &keys, sink_section, downlink).unwrap();
    let bridges = [b1.quic, b2.quic];
    let ports: Vec<u16> = EDGES.iter().map(|_| e2e_tests::free_port()).collect();
    let dirs: Vec<tempfile::TempDir> = EDGES.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let configs: Vec<String> = EDGES.iter().zip(&ports).map(|(e, p)| edge_config(&keys, e, *p, &bridges)).collect();
    let mut edges: Vec<Option<EdgeProcess>> =
        dirs.iter().zip(&configs).map(|(d, c)| Some(EdgeProcess::start(d.path(), c))).collect();
    let apps: Vec<Subscriber> =
        EDGES.iter().zip(&ports).map(|(e, p)| subscriber(e, SocketAddr::from(([127, 0, 0, 1], *p)))).collect();
    let got: Vec<_> = apps.iter().map(|a| a.got.clone()).collect();

    // All three known to the fleet view (so a send to every edge names them), then e3 goes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while edges_list(&b1.config())
        .edges
        .iter()
        .filter(|e| e.status == cloud_bridge::fleet::view::Status::Connected)
        .count()
        < 3
    {
        assert!(tokio::time::Instant::now() < deadline, "the edges never all connected");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut e3 = edges[2].take().unwrap();
    e3.signal("TERM");
    e3.wait_exit(Duration::from_secs(10)).expect("e3 stops");

    let config = DownlinkConfig::default();
    let store = |edge: &str, topic: String, payload: String, qos: u8, expiry: Option<Duration>| {
        let msg =
            send::message(Flags { topic, qos, expiry, payload: payload.into_bytes(), ..Default::default() }).unwrap();
        (vec![edge.to_owned()], msg)
    };
    // Expiring while e3 is away; a topic e1 does not allow.
    for i in 0..EXPIRING {
        let (to, msg) = store("e3", "config/e3/late".into(), i.to_string(), 1, Some(Duration::from_secs(1)));
        send::send(&sink, &config, &to, &msg).await.unwrap();
    }
    let (to, msg) = store("e1", "forbidden/x".into(), "no".into(), 1, None);
    send::send(&sink, &config, &to, &msg).await.unwrap();

    let all = send::edges(&sink, &config, &Target::All).await.unwrap();
    assert_eq!(all, EDGES, "every edge the fleet view knows");
    for i in 0..PER_EDGE / 2 {
        for e in EDGES {
            for (topic, qos) in [(format!("cmd/{e}"), 2), (format!("config/{e}"), 1)] {
                let (to, msg) = store(e, topic, i.to_string(), qos, None);
                let sent = send::send(&sink, &config, &to, &msg).await.unwrap();
                assert!(matches!(sent[0].1, cloud_bridge::sink::downlink::Enqueued::Stored { .. }), "{sent:?}");
            }
        }
        if i % (PER_EDGE / 2 / BROADCASTS) == 0 {
            let msg = send::message(Flags {
                topic: "cmd/all".into(),
                qos: 2,
                payload: format!("b{}", i / (PER_EDGE / 2 / BROADCASTS)).into_bytes(),
                ..Default::default()
            })
            .unwrap();
            send::send(&sink, &config, &all, &msg).await.unwrap();
        }
        if i == PER_EDGE / 6 {
            // e1 dies mid-stream and comes back on the same port and directory.
            let mut e1 = edges[0].take().unwrap();
            e1.signal("KILL");
            e1.wait_exit(Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(300)).await;
            edges[0] = Some(EdgeProcess::start(dirs[0].path(), &configs[0]));
        }
        if i == PER_EDGE / 3 {
            // A bridge dies; its edges find the other.
            b1.kill();
            fault("bridge killed");
        }
    }
    fault("stored");
    // e3 comes back late, after its expiring messages ran out.
    edges[2] = Some(EdgeProcess::start(dirs[2].path(), &configs[2]));

    let want = expected();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let done = EDGES.iter().zip(&got).all(|(e, g)| {
            let (first, _) = check(&g.lock().unwrap());
            want[e].iter().all(|(topic, payloads)| first.get(topic).map_or(0, Vec::len) >= payloads.len())
        });
        if done {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let counts: Vec<_> = got.iter().map(|g| g.lock().unwrap().len()).collect();
            let logs: Vec<String> = edges
                .iter()
                .flatten()
                .map(|e| e.stderr().lines().rev().take(15).collect::<Vec<_>>().join("\n"))
                .collect();
            let mut states = Vec::new();
            for e in EDGES {
                states.push((e, sink.down_state(e).await, sink.down_backlog(e).await));
            }
            let metrics: Vec<String> = edges
                .iter()
                .flatten()
                .map(|e| {
                    let text = e2e_tests::http_get(e.http.unwrap(), "/metrics");
                    text.lines()
                        .filter(|l| {
                            l.contains("downlink") || l.contains("mqtt_messages_dropped") || l.contains("queued")
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .collect();
            panic!(
                "not every message arrived in {WAIT:?}: {counts:?}\nsink: {states:?}\nb2: {}\nb2 metrics: {}\nedges: {logs:#?}\nedge metrics: {metrics:#?}",
                b2.stderr(),
                e2e_tests::http_get(b2.http, "/metrics")
                    .lines()
                    .filter(|l| l.contains("downlink"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Anything delivered twice would come in the moments after.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (e, g) in EDGES.iter().zip(&got) {
        let (first, unexplained) = check(&g.lock().unwrap());
        assert!(unexplained.is_empty(), "{e}: copies no resend explains: {unexplained:?}");
        assert_eq!(first, want[e], "{e}: every message once, in order per topic, nothing else");
    }

    // What was not delivered is accounted for.
    let state = sink.down_state("e3").await.unwrap();
    assert_eq!(state.expired, EXPIRING as u64, "{state:?}");
    let refused = sink.down_dead_letters(Some("e1"), 10).await.unwrap();
    assert_eq!(refused.iter().map(|d| d.topic.as_str()).collect::<Vec<_>>(), ["forbidden/x"], "{refused:?}");
    for e in EDGES {
        let backlog = sink.down_backlog(e).await.unwrap();
        assert_eq!(backlog.messages, 0, "{e}: {backlog:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_reaches_every_edge_once_through_kills_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("central.db");
    let section = format!("kind = \"sqlite\"\npath = \"{}\"\n", path.display());
    let sink = cloud_bridge::sink::sqlite::SqliteSink::open(&path).unwrap();
    Box::pin(chaos(dir.path(), &section, sink, |_| {})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_reaches_every_edge_once_through_kills_on_jetstream() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let section = format!("kind = \"jetstream\"\nurl = \"{}\"\n", nats.url());
    let settings = e2e_tests::nats::sink_settings(nats.url(), cloud_bridge::sink::jetstream::BatchPublish::Auto);
    let sink = cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings).await.unwrap();
    Box::pin(chaos(dir.path(), &section, sink, |_| {})).await;
}

/// [issue 44] The same through a three-broker KRaft cluster (replication 3, 2 in sync): when the
/// bridge is killed, so is a broker (the leader of a third of the downlink's partitions, and of
/// the state topic's), started again once every message is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_reaches_every_edge_once_through_kills_on_kafka() {
    let mut cluster = e2e_tests::kafka::KafkaBroker::cluster();
    let dir = tempfile::tempdir().unwrap();
    let section = format!(
        "kind = \"kafka\"\nbootstrap = \"{}\"\npartitions = 3\nreplication_factor = 3\nmin_insync_replicas = 2\n",
        cluster.bootstrap()
    );
    let mut settings = cloud_bridge::sink::kafka::settings::KafkaSettings::new(&cluster.bootstrap());
    (settings.partitions, settings.replication_factor, settings.min_insync_replicas) = (3, Some(3), Some(2));
    let sink = cloud_bridge::sink::kafka::KafkaSink::connect(&settings).await.unwrap();
    let fault = |at: &'static str| match at {
        "bridge killed" => cluster.kill(0),
        _ => cluster.restart(0),
    };
    Box::pin(chaos(dir.path(), &section, sink, fault)).await;
}
