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

fn copy_spool(from_dir: &std::path::Path, to_dir: &std::path::Path) {
    for name in ["spool.db", "spool.db-wal"] {
        let (from, to) = (from_dir.join(name), to_dir.join(name));
        if from.exists() {
            std::fs::copy(&from, &to).unwrap();
        } else {
            let _ = std::fs::remove_file(&to);
        }
    }
    let _ = std::fs::remove_file(to_dir.join("spool.db-shm"));
}

fn epoch_of(dir: &std::path::Path) -> String {
    let conn = rusqlite::Connection::open(dir.join("spool.db")).unwrap();
    conn.query_row("SELECT value FROM meta WHERE key = 'epoch'", [], |r| r.get(0)).unwrap()
}

/// `n` QoS1 messages, each after the last one's PUBACK; returns their payloads.
async fn publish_all(edge: &EdgeProcess, prefix: &str, n: u32) -> Vec<String> {
    let progress = std::sync::atomic::AtomicU64::new(0);
    let topic = format!("audit/{prefix}");
    let acked = e2e_tests::client::publish_range(edge.addr("local"), prefix, &topic, prefix, 0..n, &progress).await;
    assert_eq!(acked.len(), n as usize, "{prefix}: every publish acknowledged");
    acked.into_iter().map(|i| format!("{prefix}-{i}")).collect()
}

fn sink_payloads(cloud_sink: &std::path::Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in sink_rows(cloud_sink).iter().filter(|r| r.kind == "message") {
        *counts.entry(String::from_utf8_lossy(&r.payload).into_owned()).or_default() += 1;
    }
    counts
}

/// A power cut, as the spool sees it: its database goes back to an older state, same epoch,
/// while the cloud keeps the records committed since. With the node stopped, the spool is
/// copied aside; 30 more messages reach the cloud; the old copy is put back; the node restarts
/// with the bridge down and takes 50 new messages (more than the 30, so the cloud's mark is not
/// above the spool's head by then), then the bridge comes back. Without the seq reservation the
/// cloud's mark counted 30 of the new records as acked: deleted unsent, never in the sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_put_back_to_an_older_copy_loses_no_new_message() {
    let cloud_dir = tempfile::tempdir().unwrap();
    let keys = pki(cloud_dir.path(), &[]);
    let cloud = TestCloud::start(cloud_dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), "").await;
    let addr = cloud.bridge.quic_addr();
    let (edge_dir, saved) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = config_text(&format!("{}\n{}", classes_toml(), cloud.uplink_section("edge-1")));
    let sink = cloud.sink.clone();
    let stop = |mut edge: EdgeProcess| {
        edge.signal("TERM");
        edge.wait_exit(WAIT).expect("stopped");
    };
    let landed = |want: &[String]| {
        let counts = sink_payloads(&sink);
        want.iter().all(|p| counts.contains_key(p))
    };

    let edge = EdgeProcess::start(edge_dir.path(), &config);
    let first = publish_all(&edge, "first", 10).await;
    assert!(e2e_tests::eventually(WAIT, || landed(&first)).await, "first run drains: {}", edge.stderr());
    stop(edge);
    copy_spool(edge_dir.path(), saved.path());
    let epoch = epoch_of(saved.path());

    let edge = EdgeProcess::start(edge_dir.path(), &config);
    let second = publish_all(&edge, "second", 30).await;
    assert!(e2e_tests::eventually(WAIT, || landed(&second)).await, "second run drains: {}", edge.stderr());
    stop(edge);

    copy_spool(saved.path(), edge_dir.path());
    assert_eq!(epoch_of(edge_dir.path()), epoch, "the old copy has the same epoch: only seqs can tell");
    cloud.bridge.stop().await;
    drop(cloud);
    let edge = EdgeProcess::start(edge_dir.path(), &config);
    let third = publish_all(&edge, "third", 50).await;
    let cloud = TestCloud::start(cloud_dir.path(), keys, addr, "").await;
    let all_in = e2e_tests::eventually(WAIT, || landed(&third)).await;
    let counts = sink_payloads(&cloud.sink);
    let missing: Vec<&String> = third.iter().filter(|p| !counts.contains_key(*p)).collect();
    assert!(all_in && missing.is_empty(), "{} of 50 new messages never reached the sink: {missing:?}", missing.len());
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "duplicates: {twice:?}");
    assert_eq!(edge.metric("edge_spool_renumbered_total"), 1.0, "{}", edge.stderr());
}
