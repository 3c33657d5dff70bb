//! Uplink bytes on the shared trace (`../shared/data/edge-trace-20k.jsonl`): replays it into an
//! edge gateway over MQTT at its own pace (or `--speed` times faster), the inference results
//! edge-direct and the rest (telemetry, pre-processing counters, feedback) routed to the cloud,
//! over the QUIC uplink through a UDP relay that counts every datagram's payload, into a cloud
//! bridge on the SQLite sink. Prints one JSON line: cloud-bound messages, their topic plus
//! payload bytes, UDP payload bytes each way, and the ratio.
//!
//! `trace-replay TRACE [--speed X] [--uplink KEY=VALUE]... [--tco CONFIG]`: each `--uplink`
//! sets a key of the edge's `[uplink]` section (a TOML value, e.g. `--uplink 'linger="250ms"'`).
//! `--tco` takes the `[tco]` section of an edge config (prices, SLAs) and prints the TCO report
//! for the trace's classes after the JSON line: each class's rate and size from the trace, the
//! compression as the uplink measured it in this run (UDP bytes up per topic plus payload byte),
//! the link as the priced config states it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, pki, sink_rows, uplink_section_with_defaults};
use e2e_tests::node::TestNode;
use e2e_tests::relay::UdpRelay;
use rumqttc::QoS;

struct Entry {
    at: Duration,
    topic: String,
    qos: QoS,
    payload: String,
}

fn load(path: &str) -> anyhow::Result<Vec<Entry>> {
    let text = std::fs::read_to_string(path).with_context(|| path.to_owned())?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("{path}:{}", i + 1))?;
            let field = |k: &str| v.get(k).with_context(|| format!("{path}:{}: no {k}", i + 1));
            Ok(Entry {
                at: Duration::from_nanos(field("t")?.as_u64().context("t")?),
                topic: field("topic")?.as_str().context("topic")?.to_owned(),
                qos: if field("qos")?.as_u64() == Some(0) { QoS::AtMostOnce } else { QoS::AtLeastOnce },
                payload: field("payload")?.as_str().context("payload")?.to_owned(),
            })
        })
        .collect()
}

const CLASSES: &str = r##"
[spool]
path = "spool.db"

[[class]]
name = "inference"
filters = ["inference/#"]
route = "edge-direct"

[[class]]
name = "feedback"
filters = ["feedback/#"]
route = "central"
priority = 2

[[class]]
name = "telemetry"
filters = ["telemetry/#"]
route = "central"
priority = 3

[[class]]
name = "preproc"
filters = ["preproc/#"]
route = "central"
priority = 5
"##;

fn cloud_bound(topic: &str) -> bool {
    !topic.starts_with("inference/")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let trace = args.first().context("usage: trace-replay TRACE [--speed X] [--uplink KEY=VALUE]...")?;
    let mut speed = 1.0f64;
    let mut uplink_extra = String::new();
    let mut tco_config = None;
    for pair in args[1..].chunks(2) {
        match pair {
            [flag, v] if flag == "--speed" => speed = v.parse().context("--speed")?,
            [flag, v] if flag == "--uplink" => uplink_extra.push_str(&format!("{v}\n")),
            [flag, v] if flag == "--tco" => tco_config = Some(v.clone()),
            other => anyhow::bail!("unexpected arguments {other:?}"),
        }
    }
    let entries = load(trace)?;

    let dir = tempfile::tempdir()?;
    let cloud = TestCloud::start(dir.path(), pki(dir.path(), &[]), "127.0.0.1:0".parse()?, "").await;
    let relay = UdpRelay::start(cloud.bridge.quic_addr()).await;
    // The shipped timings (keepalive 5s, probes), not the tests' fast ones: a 500 ms
    // keepalive alone sent 16 KB of pings and heads over the trace's 40 s.
    let uplink = uplink_section_with_defaults(&cloud.pki, "edge-1", &[relay.addr], "");
    let extra = format!("{CLASSES}\n{uplink}{uplink_extra}");
    let edge = TestNode::start(&extra).await;
    let publisher = Client::anonymous(edge.local(), "trace-replay").await;

    let (mut messages, mut bytes) = (0u64, 0u64);
    let started = Instant::now();
    for e in &entries {
        let due = started + e.at.div_f64(speed);
        tokio::time::sleep_until(due.into()).await;
        publisher.publish(&e.topic, e.qos, false, e.payload.as_bytes()).await;
        if cloud_bound(&e.topic) {
            messages += 1;
            bytes += (e.topic.len() + e.payload.len()) as u64;
        }
    }
    let replayed = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut arrived = 0;
    while Instant::now() < deadline {
        arrived = sink_rows(&cloud.sink).iter().filter(|r| r.kind == "message").count() as u64;
        if arrived >= messages {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    anyhow::ensure!(arrived == messages, "{arrived} of {messages} cloud-bound messages reached the sink");
    // Let the last acks cross before reading the counters.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let up = relay.impairment.bytes_up.load(Ordering::Relaxed);
    let down = relay.impairment.bytes_down.load(Ordering::Relaxed);
    println!(
        "{{\"messages\": {messages}, \"topic_payload_bytes\": {bytes}, \"udp_up_bytes\": {up}, \"udp_down_bytes\": {down}, \"datagrams_up\": {}, \
         \"up_ratio\": {:.4}, \"up_bytes_per_msg\": {:.1}, \"batches\": {}, \"dict_batches\": {}, \"raw_bytes\": {}, \
         \"batch_body_bytes\": {}, \"batch_frame_bytes\": {}, \"replay_seconds\": {:.1}}}",
        relay.impairment.datagrams_up.load(Ordering::Relaxed),
        up as f64 / bytes as f64,
        up as f64 / messages as f64,
        edge.metric("edge_uplink_batches_total"),
        edge.metric("edge_uplink_dict_batches_total"),
        edge.metric("edge_uplink_raw_bytes_total"),
        edge.metric("edge_uplink_sent_bytes_total"),
        edge.metric("edge_uplink_frame_bytes_total"),
        replayed.as_secs_f64(),
    );
    if let Some(path) = tco_config {
        let ratio = up as f64 / bytes as f64;
        print!("{}", tco_report(&path, &edge, &entries, ratio)?);
    }
    Ok(())
}

/// The TCO report of the trace's classes under the prices of the edge config at `path`.
fn tco_report(path: &str, edge: &TestNode, entries: &[Entry], ratio: f64) -> anyhow::Result<String> {
    use edge_node::tco::Measured;
    let priced = edge_node::config::EdgeConfig::load(std::path::Path::new(path))?;
    let tco = priced.tco.context("no [tco] section")?;
    let config = edge.node.config();
    let span = entries.last().map_or(1.0, |e| e.at.as_secs_f64()).max(1e-3);
    let mut totals: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for e in entries {
        let class = e.topic.split('/').next().unwrap_or_default().to_owned();
        let t = totals.entry(class).or_default();
        t.0 += 1;
        t.1 += (e.topic.len() + e.payload.len()) as u64;
    }
    let measured = totals
        .into_iter()
        .map(|(class, (n, b))| (class, Measured { msg_per_s: n as f64 / span, bytes_per_msg: b as f64 / n as f64 }))
        .collect();
    let classes = edge_node::route::Classes::from_config(&config.classes);
    let inputs = edge_node::tco::inputs(&tco, &classes, &measured, &|_| Some(ratio));
    // The link of the priced config, not this run's loopback one, which no deployment has.
    let link = shared::tco::Link { rtt_ms: tco.link.rtt_ms, commit_ms: tco.link.commit_ms };
    let routes = config.classes.iter().map(|c| (c.name.clone(), (c.route, 0))).collect();
    let snapshot = edge_node::tco::snapshot(&tco, link, &inputs, &routes);
    Ok(edge_node::tco::report::table(&snapshot))
}
