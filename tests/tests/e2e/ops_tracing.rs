//! Tracing end to end (issue 30): a PUBLISH carrying a W3C `traceparent` user property gets
//! spans on the edge (receive, route, spool commit, uplink send) and on the bridge (sink
//! commit), exported over OTLP/HTTP to a real receiver built on the official protobuf
//! definitions (`tests/python/otlp_receiver.py`); the bridge's span is the child of the edge's,
//! so one trace links both processes. The context itself reaches the sink's headers unchanged.
//! Messages with an unsampled context or none get no spans.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use e2e_tests::cloud::{TestCloud, pki, sink_rows, uplink_section};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::node::TestNode;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions, mqttbytes::QoS};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

const WAIT: Duration = Duration::from_secs(20);
const RECEIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/otlp_receiver.py");

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const UNSAMPLED_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// The receiver, killed on drop, and the file it writes spans to.
struct Receiver {
    _child: tokio::process::Child,
    port: u16,
    spans: std::path::PathBuf,
}

impl Receiver {
    async fn start(dir: &Path) -> Receiver {
        let spans = dir.join("spans.jsonl");
        let mut child = tokio::process::Command::new("python3")
            .arg(RECEIVER)
            .arg(&spans)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs the OTLP receiver");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let port = tokio::time::timeout(WAIT, lines.next_line()).await.expect("receiver starts").unwrap();
        let port = port.expect("receiver prints its port").trim().parse().expect("a port");
        Receiver { _child: child, port, spans }
    }

    fn endpoint(&self) -> String {
        format!("[tracing]\nendpoint = \"http://127.0.0.1:{}\"\n", self.port)
    }

    fn spans(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.spans).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).expect("a JSON span")).collect()
    }
}

async fn publish(client: &AsyncClient, topic: &str, traceparent: Option<String>) {
    let props = PublishProperties {
        user_properties: traceparent.map(|t| vec![("traceparent".to_owned(), t)]).unwrap_or_default(),
        ..Default::default()
    };
    client.publish_with_properties(topic, QoS::AtLeastOnce, false, "reading", props).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_links_the_edges_spans_and_the_bridges_over_otlp() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path()).await;
    let keys = pki(dir.path(), &[]);
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), &receiver.endpoint()).await;
    let extra = format!(
        "{}\n{}\n{}",
        with_spool(&[telemetry()]),
        uplink_section(&keys, "edge-1", &[cloud.bridge.quic_addr()], ""),
        receiver.endpoint()
    );
    let edge = TestNode::start(&extra).await;

    let addr = edge.local();
    let (client, mut events) = AsyncClient::new(MqttOptions::new("tracer", addr.ip().to_string(), addr.port()), 100);
    let pump = tokio::spawn(async move {
        let mut acks = 0;
        while acks < 3 {
            if let Event::Incoming(Packet::PubAck(_)) = events.poll().await.expect("v5 event loop") {
                acks += 1;
            }
        }
    });
    let traced = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    publish(&client, "telemetry/a/1", Some(traced.clone())).await;
    publish(&client, "telemetry/a/2", Some(format!("00-{UNSAMPLED_TRACE}-{CLIENT_SPAN}-00"))).await;
    publish(&client, "telemetry/a/3", None).await;
    tokio::time::timeout(WAIT, pump).await.expect("three PUBACKs").unwrap();

    // The context reaches the sink with the record, unchanged (W3C's header name and value).
    let landed = e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 3).await;
    let rows = sink_rows(&cloud.sink);
    assert!(landed, "{rows:?}");
    let headers: Value = serde_json::from_str(rows[0].headers.as_deref().expect("headers")).unwrap();
    assert_eq!(headers.to_string().matches(&traced).count(), 1, "{headers}");

    // Five spans of one trace: four on the edge, one on the bridge.
    let all =
        e2e_tests::eventually(WAIT, || receiver.spans().iter().filter(|s| s["trace_id"] == TRACE).count() >= 5).await;
    let spans = receiver.spans();
    assert!(all, "{spans:#?}");
    let by_name: HashMap<&str, &Value> =
        spans.iter().filter(|s| s["trace_id"] == TRACE).map(|s| (s["name"].as_str().unwrap(), s)).collect();
    assert_eq!(by_name.len(), 5, "one span of each: {spans:#?}");
    let span = |name: &str| *by_name.get(name).unwrap_or_else(|| panic!("no {name} span: {spans:#?}"));
    for name in ["receive", "route", "spool commit", "uplink send"] {
        assert_eq!(span(name)["service"], "edge-node", "{name}");
    }
    assert_eq!(span("sink commit")["service"], "cloud-bridge");
    // The tree: the client's span above the edge's; the bridge's under the edge's uplink span.
    assert_eq!(span("receive")["parent_span_id"], CLIENT_SPAN);
    assert_eq!(span("route")["parent_span_id"], span("receive")["span_id"]);
    assert_eq!(span("spool commit")["parent_span_id"], CLIENT_SPAN);
    assert_eq!(span("uplink send")["parent_span_id"], CLIENT_SPAN);
    assert_eq!(
        span("sink commit")["parent_span_id"],
        span("uplink send")["span_id"],
        "the bridge's span is the child of the edge's: {spans:#?}"
    );
    // What each says of the message.
    assert_eq!(span("receive")["attributes"]["messaging.destination.name"], "telemetry/a/1");
    assert_eq!(span("receive")["attributes"]["messaging.client.id"], "tracer");
    assert_eq!(span("spool commit")["attributes"]["edge.class"], "telemetry");
    assert_eq!(span("sink commit")["attributes"]["edge.id"], "edge-1");
    assert_eq!(span("sink commit")["attributes"]["sink.outcome"], "committed");
    assert_eq!(span("sink commit")["attributes"]["edge.seq"], span("uplink send")["attributes"]["edge.seq"]);
    // In time order: the uplink span ends with the ack, after the sink commit it waited for.
    let at = |name: &str, key: &str| span(name)[key].as_u64().unwrap();
    assert!(at("receive", "start") <= at("spool commit", "start"));
    assert!(at("uplink send", "start") <= at("sink commit", "start"));
    assert!(at("sink commit", "end") <= at("uplink send", "end"));

    // Unsampled and absent contexts: no spans at all.
    assert!(spans.iter().all(|s| s["trace_id"] == TRACE), "only the sampled trace: {spans:#?}");
    assert_eq!(edge.metric("edge_trace_messages_total{outcome=\"traced\"}"), 1.0);
    assert!(edge.metric("edge_trace_spans_total") >= 4.0);
    assert!(cloud.metric("bridge_trace_spans_total") >= 1.0);
}

/// Issue 43, finding 10: `tracing.max_traced_per_second` bounds every kind of span, not only
/// the receive's: 500 traced messages (each its own trace) at a cap of 5 a second give each of
/// the five spans at most 5 for every second they took (they gave 500 each of `spool commit`,
/// `uplink send` and `sink commit`), and the edge's later spans are of traces its receive took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_bounds_every_kind_of_span() {
    const N: usize = 500;
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path()).await;
    let tracing = format!("{}max_traced_per_second = 5\n", receiver.endpoint());
    let keys = pki(dir.path(), &[]);
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), &tracing).await;
    let extra = format!(
        "{}\n{}\n{}",
        with_spool(&[telemetry()]),
        uplink_section(&keys, "edge-1", &[cloud.bridge.quic_addr()], ""),
        tracing
    );
    let edge = TestNode::start(&extra).await;

    let started = std::time::Instant::now();
    let addr = edge.local();
    let (client, mut events) = AsyncClient::new(MqttOptions::new("tracer", addr.ip().to_string(), addr.port()), 1000);
    let pump = tokio::spawn(async move {
        let mut acks = 0;
        while acks < N {
            if let Event::Incoming(Packet::PubAck(_)) = events.poll().await.expect("v5 event loop") {
                acks += 1;
            }
        }
    });
    for i in 0..N {
        publish(&client, &format!("telemetry/a/{i}"), Some(format!("00-{:032x}-{CLIENT_SPAN}-01", i + 1))).await;
    }
    tokio::time::timeout(WAIT, pump).await.expect("every PUBACK").unwrap();
    let landed = e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == N).await;
    assert!(landed, "{} of {N} in the sink", sink_rows(&cloud.sink).len());
    // The spans of the last second exported (the exporter's delay is 500 ms).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seconds = started.elapsed().as_secs() as usize + 1;

    let spans = receiver.spans();
    let mut by_name: HashMap<&str, Vec<&str>> = HashMap::new();
    for s in &spans {
        by_name.entry(s["name"].as_str().unwrap()).or_default().push(s["trace_id"].as_str().unwrap());
    }
    for name in ["receive", "route", "spool commit", "uplink send", "sink commit"] {
        let n = by_name.get(name).map_or(0, Vec::len);
        assert!(n >= 1, "some {name} spans: {by_name:?}");
        assert!(n <= 5 * seconds, "{n} {name} spans in {seconds} s at 5 a second");
    }
    let received: std::collections::HashSet<&str> = by_name["receive"].iter().copied().collect();
    for name in ["spool commit", "uplink send"] {
        let strays: Vec<_> = by_name[name].iter().filter(|t| !received.contains(*t)).collect();
        assert!(strays.is_empty(), "{name} spans of traces the receive did not take: {strays:?}");
    }
    assert!(edge.metric("edge_trace_messages_total{outcome=\"rate_limited\"}") >= (N - 5 * seconds) as f64);
    assert!(cloud.metric("bridge_trace_messages_total{outcome=\"span_rate_limited\"}") >= 1.0);
}
