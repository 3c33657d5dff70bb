//! The edge gateway as a real process, SIGKILLed at random points under a `full` QoS1 load
//! while its uplink drains to the bridge, restarted each time: every message it PUBACKed
//! (which for a `full` class means committed) ends up in the cloud sink exactly once.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e_tests::cloud::{TestCloud, pki, sink_rows};
use e2e_tests::fixtures::{audit, with_spool};
use e2e_tests::node::{EdgeProcess, config_text};

const WAIT: Duration = Duration::from_secs(30);

fn classes_toml() -> String {
    with_spool(&[audit()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_killed_mid_stream_delivers_every_acknowledged_message_once() {
    let cloud_dir = tempfile::tempdir().unwrap();
    let cloud =
        TestCloud::start(cloud_dir.path(), pki(cloud_dir.path(), &[]), "127.0.0.1:0".parse().unwrap(), "").await;
    let edge_dir = tempfile::tempdir().unwrap();
    let config = config_text(&format!("{}\n{}", classes_toml(), cloud.uplink_section("edge-1")));
    let mut acked: Vec<String> = Vec::new();
    for round in 0..3u32 {
        let mut edge = EdgeProcess::start(edge_dir.path(), &config);
        let publisher = tokio::spawn(e2e_tests::client::publish_until_killed(edge.addr("local"), round, "audit/door"));
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        tokio::time::sleep(Duration::from_millis(300 + u64::from(nanos % 500))).await;
        edge.signal("KILL");
        edge.wait_exit(WAIT).expect("killed");
        let got = publisher.await.unwrap();
        assert!(!got.is_empty(), "round {round}: nothing acknowledged before the kill");
        acked.extend(got);
    }
    // A last start with no kill drains what is left.
    let edge = EdgeProcess::start(edge_dir.path(), &config);
    let done = e2e_tests::eventually(WAIT, || {
        let rows = sink_rows(&cloud.sink);
        let have: std::collections::HashSet<Vec<u8>> = rows.iter().map(|r| r.payload.clone()).collect();
        acked.iter().all(|p| have.contains(p.as_bytes()))
    })
    .await;
    let rows = sink_rows(&cloud.sink);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.kind == "message") {
        *counts.entry(String::from_utf8_lossy(&r.payload).into_owned()).or_default() += 1;
    }
    let missing: Vec<&String> = acked.iter().filter(|p| !counts.contains_key(*p)).collect();
    assert!(
        done && missing.is_empty(),
        "{} of {} acknowledged messages missing, e.g. {:?}",
        missing.len(),
        acked.len(),
        missing.first()
    );
    let twice: Vec<(&String, &usize)> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "duplicates in the sink: {twice:?}");
    // One epoch, and its lane's seqs have no holes the sink cannot account for.
    let seqs: Vec<u64> = rows.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<u64>>(), "seq holes in the sink");
    drop(edge);
}
