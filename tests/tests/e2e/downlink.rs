//! The downlink end to end (issue 31): `cloud-bridge send` stores a message in the sink, the
//! bridge the edge is connected to sends it, the edge hands it to a local durable MQTT 5
//! subscriber, and the edge's ack moves its position in the sink. Run on the SQLite sink, on a
//! real nats-server with JetStream and on a real Kafka broker, through the shipped binary's
//! commands:
//! - a message reaches the subscriber with its MQTT 5 properties (MQTT 5.0 §3.3.2.3.5-§3.3.2.3.9:
//!   the Response Topic, Correlation Data, User Properties and Content Type are forwarded);
//! - a topic the edge's `[[downlink]]` does not allow is refused and listed with the reason;
//! - messages sent while the edge is down wait within `downlink.max_backlog_messages`, the one
//!   past it is refused at `send` with a clear error, the one whose expiry ran out meanwhile is
//!   never delivered, and the rest arrive once each, in order;
//! - a group send stores one message per edge of the group;
//! - a request (`send --wait`) reaches a local app with a response topic and correlation data,
//!   its reply goes up through the spool (a `full` class) and `send` prints it (MQTT 5.0 §4.10:
//!   the responder publishes to the Response Topic with the request's Correlation Data);
//! - many messages in one `send --lines`: a bad line stores nothing, each edge's lines arrive in
//!   order, an id is stored once, each edge's bound holds.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use e2e_tests::client::durable_v5_subscriber;
use e2e_tests::cloud::{TestCloud, cli, pki};
use e2e_tests::fixtures::{class, telemetry, with_spool};
use e2e_tests::nats::NatsServer;
use e2e_tests::node::TestNode;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions, mqttbytes::QoS};

const WAIT: Duration = Duration::from_secs(20);

const DOWNLINK: &str = "[downlink]\nmax_backlog_messages = 4\nmax_backlog_bytes = \"8KiB\"\npoll = \"500ms\"\nsummary_interval = \"200ms\"\n\
                        [downlink.groups]\nlab = [\"edge-1\", \"edge-2\"]\n";

fn send(config: &Path, topic: &str, payload: &str, more: &[&str]) -> (bool, String, String) {
    let mut args = vec!["send", "--edge", "edge-1", "--topic", topic, "--payload", payload];
    args.extend_from_slice(more);
    cli(config, &args)
}

/// A local app that answers each request on `ops/ping` with `pong <payload>` on its response
/// topic, with its correlation data (and nothing on other topics).
async fn responder(addr: SocketAddr) -> AsyncClient {
    let (client, mut events) = AsyncClient::new(MqttOptions::new("responder", addr.ip().to_string(), addr.port()), 100);
    client.subscribe("ops/ping", QoS::AtLeastOnce).await.unwrap();
    let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
    let answer = client.clone();
    tokio::spawn(async move {
        let mut subscribed_tx = Some(subscribed_tx);
        while let Ok(event) = events.poll().await {
            match event {
                Event::Incoming(Packet::Publish(p)) => {
                    let props = p.properties.unwrap_or_default();
                    let Some(topic) = props.response_topic else { continue };
                    let reply = PublishProperties { correlation_data: props.correlation_data, ..Default::default() };
                    let mut payload = b"pong ".to_vec();
                    payload.extend_from_slice(&p.payload);
                    answer.publish_with_properties(topic, QoS::AtLeastOnce, false, payload, reply).await.unwrap();
                }
                Event::Incoming(Packet::SubAck(_)) => {
                    if let Some(s) = subscribed_tx.take() {
                        let _ = s.send(());
                    }
                }
                _ => {}
            }
        }
    });
    tokio::time::timeout(WAIT, subscribed).await.expect("SUBACK").unwrap();
    client
}

async fn next(got: &mut tokio::sync::mpsc::UnboundedReceiver<Publish>) -> (String, String) {
    let p = tokio::time::timeout(WAIT, got.recv()).await.expect("a message in time").unwrap();
    (String::from_utf8_lossy(&p.topic).into_owned(), String::from_utf8_lossy(&p.payload).into_owned())
}

/// Waits until `downlink status` of edge-1 contains `want`.
async fn status_shows(config: &Path, want: &str) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (ok, out, err) = cli(config, &["downlink", "status", "--edge", "edge-1"]);
        assert!(ok, "{err}");
        if out.contains(want) {
            return out;
        }
        assert!(tokio::time::Instant::now() < deadline, "status never showed {want:?}: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn delivered_refused_bounded_and_expired(cloud: TestCloud, dir: &Path) {
    let config = dir.join("cloud.toml");
    let replies = class("replies", "reply/#", "central").durability("full");
    let extra = format!(
        "{}\n{}\n[[downlink]]\nfilter = \"config/#\"\n[[downlink]]\nfilter = \"ops/#\"\n",
        with_spool(&[telemetry(), replies]),
        cloud.uplink_section("edge-1")
    );
    let edge = TestNode::start_in(tempfile::tempdir().unwrap(), &extra).await;
    let (_client, mut got) = durable_v5_subscriber(edge.local(), "config/#").await;

    // A command with --wait: a local app answers, the reply comes back up.
    let _responder = responder(edge.local()).await;
    // Known to `send` once the fleet view lists it (a Kafka sink's first write takes a moment).
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cli(&config, &["edges", "list"]).1.lines().any(|l| l.starts_with("edge-1 ")) {
        assert!(tokio::time::Instant::now() < deadline, "edge-1 never listed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (ok, out, err) =
        cli(&config, &["send", "--edge", "edge-1", "--topic", "ops/ping", "--payload", "hi", "--wait", "15s"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("reply from edge-1 on reply/edge-1/") && out.trim_end().ends_with(": pong hi"), "{out}");
    let (ok, _, err) =
        cli(&config, &["send", "--edge", "edge-1", "--topic", "ops/silent", "--payload", "x", "--wait", "1s"]);
    assert!(!ok && err.contains("no reply from edge-1 on reply/edge-1/") && err.contains("within 1s"), "{err}");

    let (ok, out, err) = send(
        &config,
        "config/threshold",
        "0.7",
        &[
            "--user-property",
            "origin=central",
            "--user-property",
            "zone=b",
            "--user-property",
            "alpha=c",
            "--response-topic",
            "reply/edge-1",
            "--correlation-data",
            "c-1",
            "--content-type",
            "text/plain",
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(out.starts_with("edge-1: stored as downlink message "), "{out}");
    let p = tokio::time::timeout(WAIT, got.recv()).await.expect("delivered").unwrap();
    assert_eq!((&p.topic[..], &p.payload[..]), (&b"config/threshold"[..], &b"0.7"[..]));
    let props = p.properties.expect("MQTT 5 properties");
    // In the order sent (MQTT 5.0 §3.3.2.3.7).
    let pairs = [("origin", "central"), ("zone", "b"), ("alpha", "c")].map(|(k, v)| (k.to_owned(), v.to_owned()));
    assert_eq!(props.user_properties, pairs);
    assert_eq!(props.response_topic.as_deref(), Some("reply/edge-1"));
    assert_eq!(props.correlation_data.as_deref(), Some(&b"c-1"[..]));
    assert_eq!(props.content_type.as_deref(), Some("text/plain"));

    // Not allowed on this edge: refused back, kept where an operator finds it.
    let (ok, out, err) = send(&config, "cmd/reboot", "now", &[]);
    assert!(ok, "{out}{err}");
    status_shows(&config, "refused 1").await;
    let (ok, out, err) = cli(&config, &["downlink", "refused", "--edge", "edge-1"]);
    assert!(ok, "{err}");
    assert!(out.contains("edge-1") && out.contains("refused cmd/reboot"), "{out}");
    assert!(out.contains("not allowed by this edge's [[downlink]]"), "{out}");

    // The edge goes down; what is sent meanwhile waits within its bound.
    let TestNode { node, dir: edge_dir } = edge;
    node.shutdown(Duration::from_secs(5)).await;
    for (topic, more) in
        [("config/a", &["--expiry", "1s"][..]), ("config/b", &[]), ("config/c", &[]), ("config/d", &[])]
    {
        let (ok, out, err) = send(&config, topic, &topic[7..], more);
        assert!(ok, "{topic}: {out}{err}");
    }
    let (ok, out, _) = send(&config, "config/e", "e", &[]);
    assert!(!ok, "past the bound: refused");
    assert!(out.contains("edge-1: refused: its backlog holds 4 messages"), "{out}");
    assert!(out.contains("downlink.max_backlog_messages 4"), "{out}");
    let waiting = status_shows(&config, "waiting 4 messages").await;
    assert!(waiting.contains("delivered 3, refused 1, expired 0"), "{waiting}");
    // The fleet view and the bridge's gauges (no edge label) show what waits.
    let (ok, out, err) = cli(&config, &["edges", "list"]);
    assert!(ok, "{err}");
    let row = out.lines().find(|l| l.starts_with("edge-1 ") && l.split_whitespace().count() == 7).unwrap_or_default();
    assert_eq!(row.split_whitespace().skip(2).take(4).collect::<Vec<_>>(), ["3", "1", "0", "4"], "{out}");
    assert!(out.contains("edge-1 4 refused cmd/reboot"), "{out}");
    let http = cloud.bridge.http_addr().unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !e2e_tests::http_get(http, "/metrics").contains("bridge_downlink_backlog_messages 4\n") {
        assert!(tokio::time::Instant::now() < deadline, "{}", e2e_tests::http_get(http, "/metrics"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let edges: serde_json::Value = serde_json::from_str(&e2e_tests::http_get(http, "/edges")).unwrap();
    assert_eq!(edges["downlink"][0]["edge"], "edge-1", "{edges}");
    assert_eq!(edges["downlink"][0]["waiting"], 4, "{edges}");
    assert_eq!(edges["downlink_refused"][0]["topic"], "cmd/reboot", "{edges}");
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // Back: the expired one never arrives; the rest once each, in order.
    let edge = TestNode::start_in(edge_dir, &extra).await;
    let (_client, mut got) = durable_v5_subscriber(edge.local(), "config/#").await;
    for want in ["b", "c", "d"] {
        let (topic, payload) = next(&mut got).await;
        assert_eq!((topic.as_str(), payload.as_str()), (format!("config/{want}").as_str(), want));
    }
    // Acked after the subscriber had them: waited for.
    status_shows(&config, "delivered 6, refused 1, expired 1; waiting 0 messages").await;
    let again = tokio::time::timeout(Duration::from_millis(800), got.recv()).await;
    assert!(again.is_err(), "nothing delivered twice: {again:?}");
    let (_, out, _) = cli(&config, &["downlink", "refused"]);
    assert!(out.contains("expired config/a"), "{out}");

    // A group: one message per edge, whether connected or not.
    let (ok, out, err) = cli(&config, &["send", "--group", "lab", "--topic", "config/all", "--payload", "x"]);
    assert!(ok, "{out}{err}");
    assert_eq!(out.lines().filter(|l| l.contains(": stored as downlink message")).count(), 2, "{out}");
    assert!(out.contains("edge-2: stored"), "{out}");
    assert_eq!(next(&mut got).await, ("config/all".to_owned(), "x".to_owned()));
    // Every edge the fleet view knows: edge-2 never connected.
    let (ok, out, err) = cli(&config, &["send", "--all", "--topic", "config/every", "--payload", "y"]);
    assert!(ok, "{out}{err}");
    assert_eq!(out.lines().collect::<Vec<_>>().len(), 1, "{out}");
    assert!(out.starts_with("edge-1: stored"), "{out}");
    assert_eq!(next(&mut got).await, ("config/every".to_owned(), "y".to_owned()));
    // The bound on bytes, on an edge that never connected: two of 3,000 bytes fit in 8 KiB beside the group message.
    let big = "x".repeat(3000);
    for n in 0..3 {
        let (ok, out, _) = cli(&config, &["send", "--edge", "edge-2", "--topic", "config/big", "--payload", &big]);
        assert_eq!(ok, n < 2, "{out}");
        if n == 2 {
            assert!(out.contains("edge-2: refused: its backlog holds 3 messages, 6031 bytes"), "{out}");
            assert!(out.contains("max_backlog_bytes 8192"), "{out}");
        }
    }
    let (ok, _, err) = cli(&config, &["send", "--group", "nope", "--topic", "config/all", "--payload", "x"]);
    assert!(!ok && err.contains("no group \"nope\" in downlink.groups"), "{err}");
    let (ok, _, err) = send(&config, "config/+", "x", &[]);
    assert!(!ok && err.contains("--topic") && err.contains("wildcard"), "{err}");

    // An edge id nothing knows (a typo) is refused: its message would wait forever. One that
    // is to connect later is named so.
    let (ok, _, err) = cli(&config, &["send", "--edge", "edge-l", "--topic", "config/x", "--payload", "x"]);
    assert!(!ok && err.contains("edge \"edge-l\" is not known") && err.contains("--new-edge"), "{err}");
    let new = ["send", "--edge", "edge-9", "--new-edge", "--topic", "config/x", "--payload", "x"];
    let (ok, out, err) = cli(&config, &new);
    assert!(ok && out.starts_with("edge-9: stored as downlink message"), "{out}{err}");

    // A send run again with its --id (after a timeout, say) stores nothing more, and says so;
    // the edge gets the message once.
    let once = ["--id", "threshold-2026-12-04"];
    let (ok, first, err) = send(&config, "config/once", "1", &once);
    assert!(ok, "{first}{err}");
    let (ok, again, err) = send(&config, "config/once", "1", &once);
    let seq = first.trim_end().rsplit_once("message ").unwrap().1.split(' ').next().unwrap().to_owned();
    assert!(ok && again.contains(&format!("already stored as downlink message {seq} ")), "{first}{again}{err}");
    assert_eq!(next(&mut got).await, ("config/once".to_owned(), "1".to_owned()));
    let twice = tokio::time::timeout(Duration::from_millis(800), got.recv()).await;
    assert!(twice.is_err(), "stored once, delivered once: {twice:?}");
    let (ok, _, err) = send(&config, "config/once", "1", &["--id", "bad id"]);
    assert!(!ok && err.contains("--id \"bad id\""), "{err}");

    // Many messages in one send: a bad line is named and nothing is stored.
    let file = config.with_file_name("lines.jsonl");
    let lines = file.to_str().unwrap();
    let first =
        r#"{"edge": "edge-1", "topic": "config/l1", "payload": "1", "id": "l-1", "user_properties": [["k", "v"]]}"#;
    std::fs::write(&file, format!("{first}\n{{\"edge\": \"edge-1\", \"topic\": \"config/l2\", \"qos\": 3}}\n"))
        .unwrap();
    let (ok, _, err) = cli(&config, &["send", "--lines", lines]);
    assert!(!ok && err.contains("line 2: --qos 3") && err.contains("nothing was stored"), "{err}");
    // Each edge's lines in order, an id stored once, and an edge's backlog bound as for one
    // send: edge-2 holds 3 messages (6,031 bytes), room for one more.
    let more = [
        "",
        r#"{"edges": ["edge-1", "edge-2"], "topic": "config/l2", "payload_base64": "dHdv"}"#,
        r#"{"edge": "edge-1", "topic": "config/l1", "payload": "1", "id": "l-1"}"#,
        r#"{"edge": "edge-2", "topic": "config/l4", "payload": "4"}"#,
    ];
    std::fs::write(&file, format!("{first}\n{}\n", more.join("\n"))).unwrap();
    let (ok, out, err) = cli(&config, &["send", "--lines", lines]);
    assert!(!ok, "edge-2's last line refused: {out}{err}");
    assert!(out.contains("edge-1: 2 stored, 1 already stored (a send with their id)\n"), "{out}");
    assert!(out.contains("edge-2: 1 stored; 1 refused from line 5: its backlog held 4 messages, 6043 bytes"), "{out}");
    assert_eq!(next(&mut got).await, ("config/l1".to_owned(), "1".to_owned()));
    assert_eq!(next(&mut got).await, ("config/l2".to_owned(), "two".to_owned()));
    let third = tokio::time::timeout(Duration::from_millis(800), got.recv()).await;
    assert!(third.is_err(), "the line with a stored id is not sent again: {third:?}");
    cloud.bridge.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_reach_an_edge_once_in_order_within_bounds_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let cloud = TestCloud::start(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), DOWNLINK).await;
    delivered_refused_bounded_and_expired(cloud, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_reach_an_edge_once_in_order_within_bounds_on_jetstream() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let cloud =
        TestCloud::start_on_jetstream(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), DOWNLINK, &nats.url()).await;
    delivered_refused_bounded_and_expired(cloud, dir.path()).await;
}

/// A bridge in `dir` with `extra` in its config, on `kafka` with `sink_extra` after the sink's
/// keys.
async fn on_kafka(
    kafka: &e2e_tests::kafka::KafkaBroker,
    dir: &Path,
    edges: &[&str],
    extra: &str,
    sink_extra: &str,
) -> TestCloud {
    let keys = pki(dir, edges);
    let section = format!("kind = \"kafka\"\nbootstrap = \"{}\"\npartitions = 3\n{sink_extra}", kafka.bootstrap());
    TestCloud::start_with_sink(dir, keys, "127.0.0.1:0".parse().unwrap(), extra, &section, dir.join("unused")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_reach_an_edge_once_in_order_within_bounds_on_kafka() {
    let kafka = e2e_tests::kafka::KafkaBroker::start();
    let dir = tempfile::tempdir().unwrap();
    let cloud = on_kafka(&kafka, dir.path(), &["edge-2"], DOWNLINK, "").await;
    delivered_refused_bounded_and_expired(cloud, dir.path()).await;
}

/// A backlog of several windows on a Kafka sink that indexes a window's worth per edge reaches
/// the edge without waiting for `downlink.poll` (here 60 s). The session reads ahead while its
/// window is full; the sink finds nothing past what it indexed from the edge's position until
/// the edge's ack is recorded, and that short read was taken as the end: the rest waited for
/// the poll after every window. Now, on a sink whose reads stop short, a short read while
/// messages are unrecorded is made again after the next record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_many_windows_reaches_the_edge_without_the_poll_on_kafka() {
    let kafka = e2e_tests::kafka::KafkaBroker::start();
    let dir = tempfile::tempdir().unwrap();
    let extra = "[downlink]\npoll = \"60s\"\nwindow_messages = 8\nsummary_interval = \"200ms\"\n";
    let cloud = on_kafka(&kafka, dir.path(), &[], extra, "[sink.downlink]\nmax_indexed_per_edge = 8\n").await;
    let config = dir.path().join("cloud.toml");
    let edge_config =
        format!("{}\n{}\n[[downlink]]\nfilter = \"config/#\"\n", with_spool(&[]), cloud.uplink_section("edge-1"));
    let edge = TestNode::start_in(tempfile::tempdir().unwrap(), &edge_config).await;
    let (_client, mut got) = durable_v5_subscriber(edge.local(), "config/#").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cli(&config, &["edges", "list"]).1.lines().any(|l| l.starts_with("edge-1 ")) {
        assert!(tokio::time::Instant::now() < deadline, "edge-1 never listed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let file = dir.path().join("lines.jsonl");
    let lines: Vec<String> =
        (0..40).map(|i| format!(r#"{{"edge": "edge-1", "topic": "config/n", "payload": "{i}"}}"#)).collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let (ok, out, err) = cli(&config, &["send", "--lines", file.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    for i in 0..40 {
        assert_eq!(next(&mut got).await, ("config/n".to_owned(), i.to_string()), "in order, within {WAIT:?} each");
    }
    cloud.bridge.stop().await;
}

/// News of a message wakes the edge's session (the sink's news watch): a message sent while
/// the session is up arrives at once, not at the session's next `downlink.poll` (here 60 s).
/// The session's downlink starts on a lane of sink calls of its own, and its start was heard
/// only when a session call came along: the news reached no session, and each message waited
/// for the poll (5 s by default; down-bench delivered 60 msg/s).
async fn news_wakes_the_session(cloud: TestCloud, dir: &Path) {
    let keys = dir.join("cloud.toml");
    let extra =
        format!("{}\n{}\n[[downlink]]\nfilter = \"config/#\"\n", with_spool(&[]), cloud.uplink_section("edge-1"));
    let edge = TestNode::start_in(tempfile::tempdir().unwrap(), &extra).await;
    let (_client, mut got) = durable_v5_subscriber(edge.local(), "config/#").await;
    // A first message, by the session's first read or by news: either way the session reads
    // on its own only every 60 s from then on (its first read is over).
    let (ok, out, err) = send(&keys, "config/now", "start", &[]);
    assert!(ok, "{out}{err}");
    assert_eq!(next(&mut got).await, ("config/now".to_owned(), "start".to_owned()));
    for n in 0..3 {
        let sent = tokio::time::Instant::now();
        let (ok, out, err) = send(&keys, "config/now", &n.to_string(), &[]);
        assert!(ok, "{out}{err}");
        let p = tokio::time::timeout(Duration::from_secs(10), got.recv()).await.expect("woken by news, not the poll");
        assert_eq!(p.unwrap().payload, n.to_string().as_bytes());
        assert!(sent.elapsed() < Duration::from_secs(10), "{:?}", sent.elapsed());
    }
    cloud.bridge.stop().await;
}

const POLL_60S: &str = "[downlink]\npoll = \"60s\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn news_wakes_the_session_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let cloud = TestCloud::start(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), POLL_60S).await;
    news_wakes_the_session(cloud, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn news_wakes_the_session_on_jetstream() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let cloud =
        TestCloud::start_on_jetstream(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), POLL_60S, &nats.url()).await;
    news_wakes_the_session(cloud, dir.path()).await;
}

/// An edge whose classes keep everything local (here: none at all) has nothing to send, but its
/// uplink session is still how the cloud reaches it: a message for it arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_with_nothing_to_send_still_takes_the_downlink() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let cloud = TestCloud::start(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), DOWNLINK).await;
    let extra =
        format!("{}\n{}\n[[downlink]]\nfilter = \"config/#\"\n", with_spool(&[]), cloud.uplink_section("edge-1"));
    let edge = TestNode::start_in(tempfile::tempdir().unwrap(), &extra).await;
    let (_client, mut got) = durable_v5_subscriber(edge.local(), "config/#").await;
    let (ok, out, err) = send(&dir.path().join("cloud.toml"), "config/only", "down", &[]);
    assert!(ok, "{out}{err}");
    assert_eq!(next(&mut got).await, ("config/only".to_owned(), "down".to_owned()));
    cloud.bridge.stop().await;
}
