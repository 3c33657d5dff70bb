//! The fleet console in a real browser (issue 30): Debian's Chromium, headless, loads the page
//! a live bridge serves while an edge reports, runs its script and shows the edge connected,
//! the fleet's cost per class with its chart, and the dead letters' state. The page runs no
//! inline script and writes every value as text: a hostile edge's class named with markup is
//! shown as that text, not run.

use std::process::Command;
use std::time::{Duration, Instant};

use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, pki};
use rumqttc::QoS;

/// A classes report of one class named `name`, priced as an edge's model prices it.
fn hostile_report(name: &str) -> shared::proto::ClassesReport {
    use shared::tco::{Architecture, ClassInput, Link, Prices, evaluate};
    let prices = Prices {
        currency: "USD".into(),
        months: 36.0,
        uplink_per_gb: 1.0,
        central_ingest_per_gb: 0.0,
        central_storage_per_gb_month: 0.0,
        retention_months: 0.0,
        edge_per_gb: 0.0,
        fte_month: 1.0,
        edge_direct: Architecture { hardware: 36.0, uplink_gb_month: 0.0, fte: 0.0 },
        central: Architecture { hardware: 0.0, uplink_gb_month: 0.0, fte: 0.0 },
    };
    let input = ClassInput {
        name: name.into(),
        msg_per_s: 1.0,
        bytes_per_msg: 100.0,
        compression: 1.0,
        sla_ms: None,
        governance: Default::default(),
        pinned: None,
    };
    let decision = evaluate(&prices, &Link { rtt_ms: 1.0, commit_ms: 1.0 }, &[input])[0].clone();
    // The brief's currency: the fleet's sums leave out edges on another.
    shared::proto::ClassesReport {
        currency: "USD".into(),
        classes: vec![shared::proto::ClassReport { decision, route: None, switches: 0 }],
    }
}

/// The DOM of `url` after its scripts ran (Chromium's virtual time: 5 s of page time).
fn rendered(url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .output()
        .expect("chromium (Debian's; scripts/install-test-deps.sh installs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_fleet_its_costs_and_dead_letters_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), "").await;
    let brief = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/tco-brief.toml")).unwrap();
    let (tco_at, classes_at) = (brief.find("\n[tco]\n").unwrap(), brief.find("\n[[class]]").unwrap());
    let tco = &brief[tco_at..].replace("interval = \"1min\"", "interval = \"200ms\"");
    let extra = format!(
        "[spool]\npath = \"spool.db\"\n{}\n{}\n{tco}",
        &brief[classes_at..tco_at],
        cloud.uplink_section("edge-1")
    );
    let edge = e2e_tests::node::TestNode::start(&extra).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    publisher.publish("telemetry/cam-1", QoS::AtLeastOnce, false, vec![b't'; 500]).await;
    let http = cloud.bridge.http_addr().unwrap();
    // The edge's state and its TCO report are in the sink.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !e2e_tests::http_get(http, "/tco").contains("\"class\":\"telemetry\"") {
        assert!(Instant::now() < deadline, "no TCO report: {}", e2e_tests::http_get(http, "/tco"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A hostile edge (a valid certificate) reports a class named with markup.
    let (_, cert, key) = keys.edges.iter().find(|(id, _, _)| id == "edge-2").unwrap().clone();
    let conn = e2e_tests::quic::connect(cloud.bridge.quic_addr(), &keys.ca, &cert, &key).await.unwrap();
    let (mut control, _answers) = e2e_tests::quic::welcomed(&conn, "00112233445566778899aabbccddeeff").await;
    let hostile = "<img src=x onerror=\"document.title='pwned'\">";
    let frame = shared::proto::Control::Classes(hostile_report(hostile));
    control.write_all(&shared::proto::codec::encode(&frame).unwrap()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !e2e_tests::http_get(http, "/tco").contains("onerror") {
        assert!(Instant::now() < deadline, "the hostile report was not kept");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let dom = rendered(&format!("http://{http}/console"));
    assert!(dom.contains("<title>edge-hybrid fleet console</title>"), "no script of the edge's ran: {dom}");
    assert!(!dom.contains("<img"), "markup from an edge became an element: {dom}");
    assert!(dom.contains("&lt;img src=x onerror="), "shown as text: {dom}");
    assert!(dom.contains("data-loaded=\"yes\""), "every part read: {dom}");
    let edge_row = dom.split("data-edge=\"edge-1\"").nth(1).expect("a row for edge-1").split("</tr>").next().unwrap();
    assert!(edge_row.contains("<td class=\"connected\">connected</td>"), "{edge_row}");
    assert!(dom.contains("data-class=\"telemetry\""), "the cost table: {dom}");
    assert!(dom.matches("<rect class=\"now\"").count() >= 1, "the chart: {dom}");
    assert!(dom.contains("the SQLite sink stores every record: it has no dead letters"), "{dom}");

    // The page is its own: no inline script, scripts from this origin only.
    let page = e2e_tests::http_get(http, "/console");
    assert!(!page.contains("<script>"), "{page}");
    let head = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(http).unwrap();
        write!(s, "GET /console HTTP/1.0\r\nHost: t\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out.split("\r\n\r\n").next().unwrap().to_ascii_lowercase()
    };
    assert!(head.contains("content-security-policy: default-src 'self'"), "{head}");
}
