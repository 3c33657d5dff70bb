//! A spool on a bad disk, with real files and processes: a lock another process holds refuses
//! the start and moves nothing; a garbage page found while the node runs, or a damaged header
//! found at start, costs the records on it (as a gap record the cloud sees) and nothing else:
//! every other record reaches the sink under the spool's own epoch.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use e2e_tests::client::publish_range;
use e2e_tests::cloud::{TestCloud, pki, sink_rows};
use e2e_tests::fixtures::{audit, with_spool};
use e2e_tests::node::{EdgeProcess, config_text};

const WAIT: Duration = Duration::from_secs(20);
const COUNT: u32 = 200;

/// A topic of about 800 bytes, so 200 records fill some 45 pages and one page holds a few.
fn topic() -> String {
    format!("audit/{}", "p".repeat(800))
}

/// Spools `COUNT` records with the bridge away and stops the node cleanly. Returns the edge's
/// directory, its config, the bridge's address (free, for the bridge to start on later) and
/// the PKI.
async fn spooled(cloud_dir: &Path) -> (tempfile::TempDir, String, std::net::SocketAddr, cloud_bridge::certs::Pki) {
    let keys = pki(cloud_dir, &[]);
    let bind: std::net::SocketAddr = format!("127.0.0.1:{}", e2e_tests::free_port()).parse().unwrap();
    let uplink = e2e_tests::cloud::uplink_section(&keys, "edge-1", &[bind], "");
    let config = config_text(&format!("{}\n{uplink}", with_spool(&[audit()])));
    let dir = tempfile::tempdir().unwrap();
    let mut edge = EdgeProcess::start(dir.path(), &config);
    let progress = std::sync::atomic::AtomicU64::new(0);
    let acked = publish_range(edge.addr("local"), "dmg", &topic(), "dmg", 0..COUNT, &progress).await;
    assert_eq!(acked.len(), COUNT as usize);
    edge.signal("TERM");
    assert!(edge.wait_exit(WAIT).is_some_and(|s| s.success()), "{}", edge.stderr());
    (dir, config, bind, keys)
}

/// The epochs the sink holds records of.
fn sink_epochs(sink: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(sink).unwrap();
    let mut stmt = conn.prepare("SELECT DISTINCT epoch FROM records").unwrap();
    stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
}

fn epoch_of(db: &Path) -> String {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT value FROM meta WHERE key = 'epoch'", [], |r| r.get(0)).unwrap()
}

/// Writes garbage over the whole page of `db` that holds `needle`; returns its number.
fn damage_page_holding(db: &Path, needle: &[u8]) -> u64 {
    use std::io::{Seek, SeekFrom, Write};
    let bytes = std::fs::read(db).unwrap();
    let at = bytes.windows(needle.len()).position(|w| w == needle).expect("the record is in the main file");
    let page = at as u64 / 4096;
    let mut f = std::fs::OpenOptions::new().write(true).open(db).unwrap();
    f.seek(SeekFrom::Start(page * 4096)).unwrap();
    f.write_all(&[0xA5; 4096]).unwrap();
    page
}

/// What reached the sink for the edge: message payloads, and the seqs the gap records name.
fn landed(sink: &Path) -> (BTreeSet<String>, BTreeSet<u64>, usize) {
    let rows = sink_rows(sink);
    let messages =
        rows.iter().filter(|r| r.kind == "message").map(|r| String::from_utf8_lossy(&r.payload).into_owned());
    let mut gaps = BTreeSet::new();
    let mut gap_records = 0;
    for r in rows.iter().filter(|r| r.kind == "gap") {
        let gap: serde_json::Value = serde_json::from_slice(&r.payload).unwrap_or_default();
        if gap["reason"] == "unreadable" {
            gap_records += 1;
            for range in gap["ranges"].as_array().into_iter().flatten() {
                gaps.extend(range[0].as_u64().unwrap()..=range[1].as_u64().unwrap());
            }
        }
    }
    (messages.collect(), gaps, gap_records)
}

/// Issue 27, finding 4: another process holding a write lock on `spool.db` (Python's sqlite3,
/// `BEGIN IMMEDIATE`) made the node move the spool aside and start a new epoch, orphaning 100
/// acknowledged records. Now the start fails, naming the lock, and the file stays; once the lock
/// is gone the node starts on it and every record reaches the sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_locked_by_another_process_refuses_the_start_and_is_not_moved_aside() {
    let cloud_dir = tempfile::tempdir().unwrap();
    let (dir, config, bind, keys) = spooled(cloud_dir.path()).await;
    let db = dir.path().join("spool.db");
    let epoch = epoch_of(&db);
    let mut holder = std::process::Command::new("python3")
        .args(["-c", "import sqlite3,sys,time; c=sqlite3.connect(sys.argv[1], isolation_level=None); c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); time.sleep(60)"])
        .arg(&db)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "locked");
    let refused = EdgeProcess::try_start(dir.path(), &config).err().expect("no start on a locked spool");
    assert!(refused.contains("database is locked"), "the error names the lock: {refused}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(!names.iter().any(|n| n.contains(".damaged-")), "nothing moved aside: {names:?}");
    assert_eq!(epoch_of(&db), epoch);

    let edge = EdgeProcess::start(dir.path(), &config);
    let cloud = TestCloud::start(cloud_dir.path(), keys, bind, "").await;
    let all = e2e_tests::eventually(WAIT, || landed(&cloud.sink).0.len() == COUNT as usize).await;
    assert!(all, "{} of {COUNT} reached the sink: {}", landed(&cloud.sink).0.len(), edge.stderr());
    assert_eq!(sink_epochs(&cloud.sink), [epoch]);
}

/// Issue 27, finding 5: one garbage page in `spool.db` after a clean stop (so no integrity check
/// at start) made every uplink read fail for ever while `/healthz` said 200. Now the read that
/// meets the page makes the spool's thread rebuild the database under its epoch: every record not
/// on that page reaches the sink, a gap record (reason `unreadable`) names the seqs that were,
/// the lane's mark reaches its end, and the node says what happened (metrics, log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_page_found_while_running_costs_its_records_as_a_gap_and_not_the_lane() {
    let cloud_dir = tempfile::tempdir().unwrap();
    let (dir, config, bind, keys) = spooled(cloud_dir.path()).await;
    let db = dir.path().join("spool.db");
    let epoch = epoch_of(&db);
    damage_page_holding(&db, b"dmg-100");
    let edge = EdgeProcess::start(dir.path(), &config);
    let cloud = TestCloud::start(cloud_dir.path(), keys, bind, "").await;
    let done = e2e_tests::eventually(WAIT, || {
        let (messages, gaps, _) = landed(&cloud.sink);
        messages.len() + gaps.len() >= COUNT as usize && !gaps.is_empty()
    })
    .await;
    let (messages, gaps, gap_records) = landed(&cloud.sink);
    assert!(done, "{} messages and {} unreadable seqs reached the sink: {}", messages.len(), gaps.len(), edge.stderr());
    assert_eq!(gap_records, 1, "one gap record");
    assert!(!messages.contains("dmg-100"), "the damaged page's record is gone");
    assert!(messages.len() > COUNT as usize - 10, "only the page's few records are lost: {}", messages.len());
    // Every record is in the sink or named by the gap record, and none of those is both.
    let seqs: BTreeSet<u64> = sink_rows(&cloud.sink).iter().filter(|r| r.kind == "message").map(|r| r.seq).collect();
    assert!((1..=u64::from(COUNT)).all(|s| seqs.contains(&s) != gaps.contains(&s)), "gap {gaps:?}");
    assert_eq!(edge.metric("edge_spool_rebuilds_total{outcome=\"salvaged\"}"), 1.0, "{}", edge.stderr());
    assert_eq!(edge.metric("edge_spool_unreadable_seqs_total"), gaps.len() as f64);
    assert_eq!(edge.metric("edge_spool_damaged"), 0.0);
    let (status, ready) = e2e_tests::health(edge.http.unwrap(), "/readyz");
    assert_eq!(status, 200, "{ready}");
    assert_eq!(e2e_tests::health_check(&ready, "spool").map(|c| c.0), Some(true), "{ready}");
    assert_eq!(epoch_of(&db), epoch, "the rebuilt spool keeps its epoch");
    assert_eq!(sink_epochs(&cloud.sink), std::slice::from_ref(&epoch), "everything went under it");
    let lane_end = u64::from(COUNT) + 1;
    assert!(
        e2e_tests::eventually(WAIT, || cloud.committed("edge-1", 0) == lane_end).await,
        "the lane's mark reaches its gap record: {}",
        cloud.committed("edge-1", 0)
    );
    let row = e2e_tests::eventually(WAIT, || cloud.edge_row("edge-1").is_some_and(|r| r.gaps == Some(1))).await;
    assert!(row, "the fleet view shows the gap: {:?}", cloud.edge_row("edge-1"));
    assert_eq!(cloud.edge_row("edge-1").and_then(|r| r.dropped), Some(gaps.len() as u64));
}

/// A damaged file header found at start (SQLite no longer takes the file for a database): the
/// records are read through a repaired copy and sent under the spool's own epoch; the damaged
/// file is kept aside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_header_found_at_start_loses_nothing() {
    let cloud_dir = tempfile::tempdir().unwrap();
    let (dir, config, bind, keys) = spooled(cloud_dir.path()).await;
    let db = dir.path().join("spool.db");
    let epoch = epoch_of(&db);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &[0u8; 100]))
        .unwrap();
    let edge = EdgeProcess::start(dir.path(), &config);
    assert_eq!(epoch_of(&db), epoch);
    assert_eq!(edge.metric("edge_spool_moved_aside_total"), 1.0);
    let cloud = TestCloud::start(cloud_dir.path(), keys, bind, "").await;
    let all = e2e_tests::eventually(WAIT, || landed(&cloud.sink).0.len() == COUNT as usize).await;
    assert!(all, "{} of {COUNT} reached the sink: {}", landed(&cloud.sink).0.len(), edge.stderr());
    assert_eq!(sink_epochs(&cloud.sink), [epoch]);
}

/// Issue 27, finding 4's other half: a spool an earlier version moved aside (`spool.db.corrupt-*`,
/// a new epoch started beside it) held 100 acknowledged records no tool ever sent. `edge-node
/// spool recover FILE`, run while the node works on its new epoch, queues what FILE holds; the
/// node sends it under FILE's own epoch, then deletes it, and its own records flow before and
/// after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_moved_aside_by_an_earlier_version_is_sent_under_its_own_epoch_by_spool_recover() {
    let cloud_dir = tempfile::tempdir().unwrap();
    let (dir, config, bind, keys) = spooled(cloud_dir.path()).await;
    let db = dir.path().join("spool.db");
    let old_epoch = epoch_of(&db);
    // What an earlier version did with a spool it could not open.
    let aside = dir.path().join("spool.db.corrupt-1700000000000");
    std::fs::rename(&db, &aside).unwrap();
    for extra in ["-wal", "-shm", ".seqs"] {
        let _ = std::fs::remove_file(dir.path().join(format!("spool.db{extra}")));
    }
    let edge = EdgeProcess::start(dir.path(), &config);
    let cloud = TestCloud::start(cloud_dir.path(), keys, bind, "").await;
    let new_epoch = epoch_of(&db);
    assert_ne!(new_epoch, old_epoch);
    assert!(edge.stderr().contains("moved aside without sending it"), "the node points at it: {}", edge.stderr());
    let progress = std::sync::atomic::AtomicU64::new(0);
    let before = publish_range(edge.addr("local"), "new", "audit/new", "new", 0..10, &progress).await;
    assert_eq!(before.len(), 10);
    assert!(e2e_tests::eventually(WAIT, || landed(&cloud.sink).0.len() == 10).await, "{}", edge.stderr());

    let out = std::process::Command::new(e2e_tests::workspace_bin("edge-node"))
        .args(["spool", "recover", "--config"])
        .arg(dir.path().join("edge.toml"))
        .arg(&aside)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&printed).unwrap();
    assert_eq!(report["epoch"], old_epoch.as_str());
    assert_eq!(report["records"], COUNT);

    let all =
        e2e_tests::eventually(Duration::from_secs(30), || landed(&cloud.sink).0.len() == COUNT as usize + 10).await;
    assert!(all, "{} of {} reached the sink: {}", landed(&cloud.sink).0.len(), COUNT + 10, edge.stderr());
    let mut epochs = sink_epochs(&cloud.sink);
    epochs.sort();
    let mut want = vec![old_epoch, new_epoch];
    want.sort();
    assert_eq!(epochs, want, "the recovered records went under their own epoch");
    let recover = dir.path().join("recover");
    assert!(
        e2e_tests::eventually(WAIT, || std::fs::read_dir(&recover).is_ok_and(|mut d| d.next().is_none())).await,
        "the sent spool is deleted"
    );
    let after = publish_range(edge.addr("local"), "newer", "audit/newer", "newer", 0..10, &progress).await;
    assert_eq!(after.len(), 10);
    assert!(
        e2e_tests::eventually(WAIT, || landed(&cloud.sink).0.len() == COUNT as usize + 20).await,
        "{}",
        edge.stderr()
    );
}
