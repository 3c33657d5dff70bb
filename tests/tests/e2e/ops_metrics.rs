//! What an operator scrapes (issue 30): both `/metrics` endpoints pass `promtool check metrics`
//! while traffic flows, with one family per name, publishes by their real class, base units,
//! `process_*` and build info; the alert rules pass `promtool check rules`, and every metric
//! they and the Grafana board name is in a scrape.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, pki, sink_rows};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::node::TestNode;
use rumqttc::QoS;

const WAIT: Duration = Duration::from_secs(20);

/// `promtool check metrics` on `text`: its complaints, or none.
fn promtool(text: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus; scripts/install-test-deps.sh installs it)");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() && said.trim().is_empty() { Ok(()) } else { Err(said) }
}

/// The metric names in a rules file or a dashboard: every `edge_`, `bridge_` or `process_`
/// word.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let word = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    text.split(|c: char| !word(c))
        .filter(|w| ["edge_", "bridge_", "process_"].iter().any(|p| w.starts_with(p)))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_endpoints_pass_promtool_with_real_classes_base_units_and_process_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = TestCloud::start(dir.path(), pki(dir.path(), &[]), "127.0.0.1:0".parse().unwrap(), "").await;
    let edge = TestNode::start(&format!("{}\n{}", with_spool(&[telemetry()]), cloud.uplink_section("edge-1"))).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    for i in 0..5 {
        publisher.publish(&format!("telemetry/a/{i}"), QoS::AtLeastOnce, false, "t").await;
        publisher.publish(&format!("local/a/{i}"), QoS::AtLeastOnce, false, "l").await;
    }
    assert!(e2e_tests::eventually(WAIT, || sink_rows(&cloud.sink).len() == 5).await);
    assert!(e2e_tests::eventually(WAIT, || edge.metric("edge_uplink_rtt_seconds") > 0.0).await, "a ping answered");

    // As curl and promtool get it (no Accept header): the Prometheus text format.
    let text = e2e_tests::http_get(edge.node.http_addr().expect("the node's HTTP endpoint"), "/metrics");
    let edge_text = text.clone();
    promtool(&text).unwrap_or_else(|e| panic!("promtool on the edge's /metrics: {e}\n{text}"));
    assert_eq!(edge.metric("edge_mqtt_publish_in_total{class=\"telemetry\"}"), 5.0, "{text}");
    assert_eq!(edge.metric("edge_mqtt_publish_in_total{class=\"edge-direct\"}"), 5.0, "{text}");
    assert!(edge.metric("edge_mqtt_publish_in_total{class=\"internal\"}") > 0.0, "the probe's");
    assert!(edge.metric("edge_uplink_rtt_seconds") < 1.0, "seconds, not microseconds");
    assert!(edge.metric("process_resident_memory_bytes") > 1e6, "{text}");
    assert!(edge.metric("process_open_fds") > 0.0);
    assert!(text.contains(&format!("edge_build_info{{version=\"{}\"", env!("CARGO_PKG_VERSION"))), "{text}");

    let text = e2e_tests::http_get(cloud.bridge.http_addr().expect("the bridge's HTTP endpoint"), "/metrics");
    promtool(&text).unwrap_or_else(|e| panic!("promtool on the bridge's /metrics: {e}\n{text}"));
    assert!(cloud.metric("process_cpu_seconds_total") > 0.0, "{text}");
    assert!(text.contains("bridge_build_info{version="), "{text}");
    assert_eq!(cloud.metric("bridge_records_total"), 5.0);

    // The alert rules pass promtool, and every metric they or the Grafana board name is in
    // one of the two scrapes (a renamed family would leave an alert that never fires).
    let monitoring = e2e_tests::workspace_root().join("config/monitoring");
    let rules = monitoring.join("alerts.yml");
    let check = Command::new("promtool").args(["check", "rules"]).arg(&rules).output().unwrap();
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let scraped: std::collections::BTreeSet<String> = [&edge_text, &text]
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(rest) => rest.split(' ').next().map(str::to_owned),
            None if !l.starts_with('#') => l.split(['{', ' ']).next().map(str::to_owned),
            None => None,
        })
        .collect();
    for file in [rules, monitoring.join("grafana-dashboard.json")] {
        let body = std::fs::read_to_string(&file).unwrap();
        let named = metric_names(&body);
        assert!(named.len() > 8, "{}: {named:?}", file.display());
        let missing: Vec<_> = named.iter().filter(|n| !scraped.contains(*n)).collect();
        assert!(missing.is_empty(), "{} names metrics no scrape has: {missing:?}", file.display());
    }

    // What reached the SQLite sink, as an operator reads it.
    let cli = |args: &[&str]| {
        let out = Command::new(e2e_tests::workspace_bin("cloud-bridge"))
            .args(args)
            .args(["--config", dir.path().join("cloud.toml").to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(cli(&["records", "count"]), "edge-1 5\ntotal 5\n");
    let last = cli(&["records", "tail", "-n", "1", "--edge", "edge-1"]);
    assert!(last.starts_with("edge-1 ") && last.contains(" message telemetry/a/4 (1 bytes) t"), "{last}");
    assert!(cli(&["dead-letters", "list"]).contains("no dead letters"));
}
