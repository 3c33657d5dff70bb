//! Salvage against real damage: garbage written over a page of a real spool file, and over its
//! header.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::*;
use crate::spool::{Durability, Message, Properties, Seq, Spool, SqliteStorage};

fn message(i: u64) -> Message {
    Message {
        class: "telemetry".into(),
        topic: format!("t/{i}"),
        payload: Bytes::from(vec![(i % 251) as u8; 300]),
        qos: 1,
        enqueued_ms: i,
        expires_ms: None,
        properties: Properties::default(),
    }
}

/// A spool of 3,000 records in lane 0 and 500 in lane 3, the first 200 of lane 0 acked, closed
/// and checkpointed: everything in the main file. Returns the epoch.
fn spool(path: &Path) -> String {
    let storage = SqliteStorage::open(path).unwrap();
    let mut spool = Spool::new(storage);
    for i in 0..3_500u64 {
        let lane = if i % 7 == 6 { Lane(3) } else { Lane(0) };
        spool.append(lane, message(i), Durability::Normal);
    }
    spool.flush().unwrap();
    spool.ack(Lane(0), Seq(200)).unwrap();
    let epoch = spool.epoch().to_owned();
    spool.close().unwrap();
    drop(spool);
    let conn = Connection::open(path).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    epoch
}

/// The seqs of each lane's message records, read back from a salvaged database.
fn seqs(path: &Path) -> BTreeMap<u8, BTreeSet<u64>> {
    let conn = Connection::open(path).unwrap();
    let mut out: BTreeMap<u8, BTreeSet<u64>> = BTreeMap::new();
    let mut stmt = conn.prepare("SELECT id FROM records WHERE kind = 0").unwrap();
    for id in stmt.query_map([], |r| r.get::<_, i64>(0)).unwrap() {
        let id = id.unwrap();
        out.entry((id >> SEQ_BITS) as u8).or_default().insert(id as u64 & ((1 << SEQ_BITS) - 1));
    }
    out
}

fn overwrite(path: &Path, at: u64, len: usize) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&vec![0xA5; len]).unwrap();
}

fn lane_rows(path: &Path) -> BTreeMap<u8, (u64, u64)> {
    let conn = Connection::open(path).unwrap();
    let mut stmt = conn.prepare("SELECT lane, next_seq, acked FROM lanes").unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?)))).unwrap().map(Result::unwrap).collect()
}

/// One page of garbage in the middle of the records: every record on other pages is copied
/// under the old epoch with its seq, the lanes keep their next and acked seqs, and the seqs
/// reported unreadable are exactly the ones missing (above the ack), no readable one among them.
#[test]
fn a_garbage_page_loses_only_its_own_records_and_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("spool.db"), dir.path().join("salvaged.db"));
    let epoch = spool(&src);
    let before = seqs(&src);
    let pages = std::fs::metadata(&src).unwrap().len() / 4096;
    overwrite(&src, (pages / 2) * 4096, 4096);
    assert!(
        Connection::open(&src)
            .unwrap()
            .prepare("SELECT count(*) FROM records")
            .unwrap()
            .query_row([], |r| r.get::<_, i64>(0))
            .is_err(),
        "the page is really damaged"
    );
    let got = salvage(&src, &dst, &BTreeMap::new()).unwrap();
    assert_eq!(got.epoch.as_deref(), Some(epoch.as_str()));
    assert!(!got.header_repaired);
    let after = seqs(&dst);
    let mut lost = 0;
    for (lane, had) in &before {
        let kept = after.get(lane).cloned().unwrap_or_default();
        assert!(kept.is_subset(had));
        let missing: Vec<u64> = had.difference(&kept).copied().collect();
        lost += missing.len();
        let ranges = got.unreadable.get(&Lane(*lane)).cloned().unwrap_or_default();
        let within = |s: u64| ranges.iter().any(|(a, b)| (*a..=*b).contains(&s));
        assert!(missing.iter().all(|s| within(*s)), "lane {lane}: missing {missing:?} not all in {ranges:?}");
        assert!(kept.iter().all(|s| !within(*s)), "lane {lane}: a readable seq reported unreadable: {ranges:?}");
    }
    assert!(lost > 0 && lost < 100, "one page of 300-byte records: {lost}");
    assert_eq!(got.records as usize, 3_300 - lost);
    assert_eq!(lane_rows(&dst), BTreeMap::from([(0, (3_001, 200)), (3, (501, 0))]));
}

/// The file header overwritten (SQLite no longer takes the file for a database): the pages
/// after it are read through a copy with a spool's header, every record comes back, and the
/// epoch too.
#[test]
fn a_damaged_header_is_read_through_a_repaired_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("spool.db"), dir.path().join("salvaged.db"));
    let epoch = spool(&src);
    let before = seqs(&src);
    overwrite(&src, 0, 100);
    let e = Connection::open(&src).unwrap().query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0));
    assert!(e.is_err_and(|e| is_damage(&e)), "not a database any more");
    let got = salvage(&src, &dst, &BTreeMap::new()).unwrap();
    assert!(got.header_repaired);
    assert_eq!(got.epoch.as_deref(), Some(epoch.as_str()));
    assert_eq!(seqs(&dst), before);
    assert!(got.unreadable.is_empty());
    assert!(!dir.path().join("spool.db.header-repaired").exists(), "the repaired copy is gone");
}

/// The lanes row gone with its page: the running spool's next seqs are exact and win; with no
/// one to say, the next seq follows the last record read, never skipping seqs.
#[test]
fn the_running_spools_next_seqs_win_and_no_seq_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("spool.db"), dir.path().join("salvaged.db"));
    spool(&src);
    let known = BTreeMap::from([(0u8, 3_005u64)]);
    salvage(&src, &dst, &known).unwrap();
    assert_eq!(lane_rows(&dst)[&0], (3_005, 200));
    let plain = dir.path().join("plain.db");
    salvage(&src, &plain, &BTreeMap::new()).unwrap();
    assert_eq!(lane_rows(&plain)[&0], (3_001, 200));
}

/// Only damage is damage: a lock, a read-only file, a full disk or a failed write leave the
/// database where it is (the start fails naming them); a corrupt page, a file that is not a
/// database or a page that cannot be read back are salvaged.
#[test]
fn only_damage_leads_to_a_salvage() {
    use rusqlite::ffi;
    let code = |primary: i32, extended: i32| {
        rusqlite::Error::SqliteFailure(
            ffi::Error { code: ffi::Error::new(primary).code, extended_code: extended },
            None,
        )
    };
    for (e, damage) in [
        (code(ffi::SQLITE_CORRUPT, ffi::SQLITE_CORRUPT), true),
        (code(ffi::SQLITE_NOTADB, ffi::SQLITE_NOTADB), true),
        (code(ffi::SQLITE_IOERR, ffi::SQLITE_IOERR_READ), true),
        (code(ffi::SQLITE_IOERR, ffi::SQLITE_IOERR_SHORT_READ), true),
        (code(ffi::SQLITE_IOERR, ffi::SQLITE_IOERR_WRITE), false),
        (code(ffi::SQLITE_IOERR, ffi::SQLITE_IOERR_FSYNC), false),
        (code(ffi::SQLITE_BUSY, ffi::SQLITE_BUSY), false),
        (code(ffi::SQLITE_READONLY, ffi::SQLITE_READONLY), false),
        (code(ffi::SQLITE_FULL, ffi::SQLITE_FULL), false),
        (code(ffi::SQLITE_CANTOPEN, ffi::SQLITE_CANTOPEN), false),
        (code(ffi::SQLITE_PERM, ffi::SQLITE_PERM), false),
    ] {
        assert_eq!(is_damage(&e), damage, "{e}");
        let spool = SpoolError::Sqlite { path: "spool.db".into(), source: e };
        assert_eq!(spool.is_damage(), damage);
    }
    let io = SpoolError::Io { path: "spool.db.seqs".into(), source: std::io::Error::from_raw_os_error(28) };
    assert!(!io.is_damage(), "a full disk writing the reservations is no damage");
}
