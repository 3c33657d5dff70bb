//! The TCO model as an operator meets it: the brief's example through `edge-node tco report`,
//! and a running gateway moving a class when its traffic grows tenfold, with the move in the
//! metrics, in the report and in where the messages go.

use std::process::Command;
use std::time::{Duration, Instant};

use e2e_tests::client::Client;
use e2e_tests::node::EdgeProcess;
use e2e_tests::workspace_bin;
use rumqttc::QoS;
use serde_json::Value;

fn report(config: &std::path::Path, extra: &[&str]) -> (String, String) {
    let out = Command::new(workspace_bin("edge-node"))
        .args(["tco", "report", "--config"])
        .arg(config)
        .args(extra)
        .output()
        .expect("run edge-node tco report");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "tco report failed: {stderr}");
    (stdout, stderr)
}

fn class<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["classes"].as_array().unwrap().iter().find(|c| c["class"] == name).unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn the_brief_example_comes_out_of_the_model() {
    let config = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tco-brief.toml"));
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("chart.svg");
    let (json, _) = report(config, &["--json", "--svg", svg.to_str().unwrap()]);
    let r: Value = serde_json::from_str(&json).unwrap();
    // The brief's decisions: inference results (50 ms SLA) edge-direct, parameter sync central.
    let inference = class(&r, "inference");
    assert_eq!(inference["chosen"], "edge-direct");
    let central = inference["costs"].as_array().unwrap().iter().find(|c| c["route"] == "central").unwrap();
    assert_eq!(central["infeasible"], "SLA 50 ms < central latency 180 ms");
    assert_eq!(class(&r, "parameter-sync")["chosen"], "central");
    assert_ne!(class(&r, "feedback")["chosen"], "edge-direct");
    // Both architectures' 3-year totals from the brief's table and the file's prices.
    let totals: Vec<(String, f64)> = r["architectures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap().to_owned(), a["total"].as_f64().unwrap()))
        .collect();
    let edge = 12_800.0 + 2.1 * 36.0 * 2.0 + 0.3 * 36.0 * 11_090.0;
    let central = 41_500.0 + 87.0 * 36.0 * 2.0 + 1.7 * 36.0 * 11_090.0;
    assert_eq!(totals.len(), 2);
    assert_eq!(totals[0].0, "edge-direct");
    assert!((totals[0].1 - edge).abs() < 0.01, "{totals:?}");
    assert!((totals[1].1 - central).abs() < 0.01, "{totals:?}");
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") && chart.contains("parameter-sync"));
    // The table says the same, with the reason.
    let (table, _) = report(config, &[]);
    assert!(table.contains("declared traffic from the config"), "{table}");
    let line = table.lines().find(|l| l.starts_with("inference")).unwrap();
    assert!(line.contains("edge-direct") && line.contains("SLA 50 ms < central latency 180 ms"), "{line}");
    assert!(table.contains("total    132,723") && table.contains("total    726,472"), "{table}");
}

#[test]
fn a_report_without_a_tco_section_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.toml");
    std::fs::write(&path, "node_id = \"x\"\n").unwrap();
    let out = Command::new(workspace_bin("edge-node")).args(["tco", "report", "--config"]).arg(&path).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no [tco] section"));
}

/// Prices where a class of about 100-byte messages is cheaper central below about 50 msg/s and
/// edge-direct above: the central cluster is already paid for, the uplink costs 3 a GB, the
/// edge's share of its hardware is 50 a month per class.
fn live_config(http: u16) -> String {
    format!(
        r#"node_id = "tco-edge"
[http]
bind = "127.0.0.1:{http}"
[probe]
enabled = false
[[listener]]
name = "local"
bind = "127.0.0.1:0"
anonymous = true
[spool]
path = "spool.db"

[[class]]
name = "counters"
filters = ["counters/#"]
route = "central"
priority = 2

[[class]]
name = "audit"
filters = ["audit/#"]
route = "both"
governance = "audit-copy"
priority = 1

[[class]]
name = "secure"
filters = ["secure/#"]
route = "central"
governance = "central-only"
priority = 1

[tco]
interval = "200ms"
hold = "600ms"
threshold = 0.1
[tco.prices]
months = 36
uplink_per_gb = 3.0
fte_month = 10000
[tco.prices.edge_direct]
hardware = 3600
fte = 0
[tco.prices.central]
hardware = 0
fte = 0
[tco.link]
rtt_ms = 20
commit_ms = 40
[tco.class.counters]
compression = 1.0
[tco.class.audit]
compression = 1.0
[tco.class.secure]
compression = 1.0
"#
    )
}

async fn publish_for(publisher: &Client, per_s: u32, span: Duration, payload: &[u8]) {
    let start = Instant::now();
    let mut sent = 0u32;
    while start.elapsed() < span {
        for topic in ["counters/cam-1", "audit/cam-1", "secure/cam-1"] {
            publisher.publish(topic, QoS::AtMostOnce, false, payload.to_vec()).await;
        }
        sent += 1;
        let next = start + Duration::from_secs_f64(f64::from(sent) / f64::from(per_s));
        tokio::time::sleep_until(next.into()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_growing_tenfold_moves_by_the_model_and_governed_classes_stay_off_edge_direct() {
    let dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(dir.path(), &live_config(e2e_tests::free_port()));
    let mut local = Client::anonymous(edge.addr("local"), "local-app").await;
    local.subscribe("counters/#", QoS::AtMostOnce).await;
    let publisher = Client::anonymous(edge.addr("local"), "counter").await;
    let payload = [b'c'; 80];
    let switched = "edge_tco_route_switches_total{class=\"counters\"}";
    let audit_edge = "edge_tco_route{class=\"audit\",route=\"edge-direct\"}";
    let secure_central = "edge_tco_route{class=\"secure\",route=\"central\"}";

    // 20 msg/s for 3 s: central is cheaper; the class stays, local subscribers get nothing.
    publish_for(&publisher, 20, Duration::from_secs(3), &payload).await;
    assert_eq!(edge.metric(switched), 0.0, "{}", edge.stderr());
    assert_eq!(edge.metric("edge_tco_route{class=\"counters\",route=\"central\"}"), 1.0);
    assert!(local.recv(Duration::from_millis(100)).await.is_none(), "central: no local delivery");

    // Ten times that: after the hold time the model moves it edge-direct, once.
    let start = Instant::now();
    while edge.metric(switched) == 0.0 && start.elapsed() < Duration::from_secs(15) {
        publish_for(&publisher, 200, Duration::from_millis(500), &payload).await;
        assert_eq!(edge.metric(audit_edge), 0.0);
        assert_eq!(edge.metric(secure_central), 1.0);
    }
    assert_eq!(edge.metric(switched), 1.0, "{}", edge.stderr());
    publish_for(&publisher, 200, Duration::from_secs(2), &payload).await;
    assert_eq!(edge.metric(switched), 1.0, "one move, no flapping");
    assert_eq!(edge.metric("edge_tco_route{class=\"counters\",route=\"edge-direct\"}"), 1.0);
    assert_eq!(edge.metric(audit_edge), 0.0, "audit-copy never goes edge-direct");
    assert_eq!(edge.metric(secure_central), 1.0, "central-only stays central");
    assert!(edge.metric("edge_tco_monthly_cost{class=\"counters\",route=\"central\"}") > 50.0);
    assert!(local.recv(Duration::from_secs(2)).await.is_some(), "edge-direct: local subscribers get it");
    assert!(edge.stderr().contains("TCO route change"), "{}", edge.stderr());

    // The report, from the running node while the traffic goes on, shows the move and why.
    let traffic = tokio::spawn(async move {
        publish_for(&publisher, 200, Duration::from_secs(60), &payload).await;
    });
    // The node measures rates per interval: wait for one measured under the new traffic.
    let config = dir.path().join("edge.toml");
    let live = || serde_json::from_str::<Value>(&report(&config, &["--json"]).0).unwrap();
    let mut r = live();
    e2e_tests::eventually(Duration::from_secs(10), || {
        r = live();
        class(&r, "counters")["msg_per_s"].as_f64().unwrap() > 100.0
    })
    .await;
    let counters = class(&r, "counters");
    assert_eq!(counters["route"], "edge-direct");
    assert_eq!(counters["switches"], 1);
    assert!(counters["msg_per_s"].as_f64().unwrap() > 100.0, "{counters}");
    assert_ne!(class(&r, "audit")["route"], "edge-direct");
    let (table, _) = report(&config, &[]);
    assert!(table.contains("live, from the running node"), "{table}");
    traffic.abort();
}

/// Edges send their classes to the bridge, which keeps each edge's latest in its sink;
/// `cloud-bridge tco report` sums them per class across the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_keeps_each_edges_classes_for_the_fleet_report() {
    use e2e_tests::cloud::{TestCloud, pki};
    let dir = tempfile::tempdir().unwrap();
    let cloud = TestCloud::start(dir.path(), pki(dir.path(), &[]), "127.0.0.1:0".parse().unwrap(), "").await;
    let brief = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tco-brief.toml")).unwrap();
    // The brief's classes and prices on a test node, reporting every 200 ms.
    let (tco_at, classes_at) = (brief.find("\n[tco]\n").unwrap(), brief.find("\n[[class]]").unwrap());
    let tco = &brief[tco_at..].replace("interval = \"1min\"", "interval = \"200ms\"");
    let classes = &brief[classes_at..tco_at];
    let extra = format!("[spool]\npath = \"spool.db\"\n{classes}\n{}\n{tco}", cloud.uplink_section("edge-1"));
    let edge = e2e_tests::node::TestNode::start(&extra).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    publisher.publish("telemetry/cam-1", QoS::AtLeastOnce, false, vec![b't'; 500]).await;

    let cloud_config = dir.path().join("cloud.toml");
    let bridge = workspace_bin("cloud-bridge");
    let fleet_json = || {
        let out =
            Command::new(&bridge).args(["tco", "report", "--json", "--config"]).arg(&cloud_config).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let start = Instant::now();
    let mut fleet = fleet_json();
    while fleet["edges"].as_array().unwrap().is_empty() && start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        fleet = fleet_json();
    }
    assert_eq!(fleet["edges"][0]["edge"], "edge-1", "{fleet}");
    assert_eq!(fleet["edges"][0]["classes"], 4);
    let class = |name: &str| fleet["classes"].as_array().unwrap().iter().find(|c| c["class"] == name).unwrap().clone();
    assert_eq!(class("inference")["model_choice"]["edge-direct"], 1, "{fleet}");
    assert_eq!(class("parameter-sync")["model_choice"]["central"], 1);
    assert_eq!(class("telemetry")["routes_now"]["central"], 1);
    let out = Command::new(&bridge).args(["tco", "report", "--config"]).arg(&cloud_config).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("edges reporting: 1") && table.contains("edge-1"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("inference") && l.contains("edge-direct x1")), "{table}");
    drop(edge);
}
