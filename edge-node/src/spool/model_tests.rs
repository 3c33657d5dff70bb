//! The spool against a plain in-memory model: random sequences of append, flush, read, ack and
//! crash-and-reopen must agree on every read, on seq continuity and on the epoch.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use proptest::prelude::*;

use super::fault::{Fault, Faults, FaultyStorage};
use super::*;

fn message(payload: &[u8]) -> Message {
    Message {
        class: "telemetry".into(),
        topic: "telemetry/cam-1/metrics".into(),
        payload: Bytes::copy_from_slice(payload),
        qos: 1,
        enqueued_ms: 1,
        expires_ms: None,
        properties: Properties::default(),
    }
}

fn open(path: &Path) -> Spool<SqliteStorage> {
    Spool::new(SqliteStorage::open(path).unwrap())
}

#[derive(Debug, Clone)]
enum Op {
    Append {
        lane: u8,
        payload: Vec<u8>,
        full: bool,
    },
    Flush,
    Read {
        lane: u8,
        back: u64,
        limit: usize,
    },
    Ack {
        lane: u8,
        back: u64,
    },
    /// The process dies: what was not flushed is gone; the database is opened again.
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, proptest::collection::vec(any::<u8>(), 0..48), any::<bool>())
            .prop_map(|(lane, payload, full)| Op::Append { lane, payload, full }),
        3 => Just(Op::Flush),
        3 => (0u8..3, 0u64..6, 1usize..12).prop_map(|(lane, back, limit)| Op::Read { lane, back, limit }),
        2 => (0u8..3, 0u64..6).prop_map(|(lane, back)| Op::Ack { lane, back }),
        1 => Just(Op::Crash),
    ]
}

#[derive(Debug, Default)]
struct Model {
    committed: BTreeMap<u8, BTreeMap<u64, Vec<u8>>>,
    next_handed: BTreeMap<u8, u64>,
    next_committed: BTreeMap<u8, u64>,
    acked: BTreeMap<u8, u64>,
    pending: Vec<(u8, u64, Vec<u8>)>,
}

impl Model {
    fn append(&mut self, lane: u8, payload: Vec<u8>) -> u64 {
        let next = self.next_handed.entry(lane).or_insert(1);
        let seq = *next;
        *next += 1;
        self.pending.push((lane, seq, payload));
        seq
    }

    fn flush(&mut self) {
        for (lane, seq, payload) in self.pending.drain(..) {
            self.committed.entry(lane).or_default().insert(seq, payload);
            let nc = self.next_committed.entry(lane).or_insert(1);
            *nc = (*nc).max(seq + 1);
        }
    }

    fn crash(&mut self) {
        self.pending.clear();
        self.next_handed = self.next_committed.clone();
    }

    fn last_committed(&self, lane: u8) -> u64 {
        self.next_committed.get(&lane).copied().unwrap_or(1) - 1
    }

    fn ack(&mut self, lane: u8, up_to: u64) {
        let up_to = up_to.min(self.last_committed(lane));
        let acked = self.acked.entry(lane).or_default();
        if up_to > *acked {
            *acked = up_to;
            if let Some(c) = self.committed.get_mut(&lane) {
                c.retain(|seq, _| *seq > up_to);
            }
        }
    }

    fn read(&self, lane: u8, after: u64, limit: usize) -> Vec<(u64, Vec<u8>)> {
        self.committed
            .get(&lane)
            .map(|c| c.range(after + 1..).take(limit).map(|(s, p)| (*s, p.clone())).collect())
            .unwrap_or_default()
    }
}

proptest! {
    #[test]
    fn spool_agrees_with_model(ops in proptest::collection::vec(op(), 1..120)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.db");
        let mut spool = open(&path);
        let epoch = spool.epoch().to_owned();
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::Append { lane, payload, full } => {
                    let durability = if full { Durability::Full } else { Durability::Normal };
                    let got = spool.append(Lane(lane), message(&payload), durability);
                    let want = model.append(lane, payload);
                    prop_assert_eq!(got, Seq(want));
                }
                Op::Flush => {
                    spool.flush().unwrap();
                    model.flush();
                }
                Op::Read { lane, back, limit } => {
                    let after = model.acked.get(&lane).copied().unwrap_or(0).saturating_sub(back);
                    let got: Vec<(u64, Vec<u8>)> = spool
                        .read(Lane(lane), Seq(after), limit)
                        .unwrap()
                        .into_iter()
                        .map(|r| (r.seq.0, r.message().expect("no gaps without a budget").payload.to_vec()))
                        .collect();
                    prop_assert_eq!(got, model.read(lane, after, limit));
                }
                Op::Ack { lane, back } => {
                    let up_to = model.last_committed(lane).saturating_sub(back);
                    spool.ack(Lane(lane), Seq(up_to)).unwrap();
                    model.ack(lane, up_to);
                }
                Op::Crash => {
                    drop(spool);
                    spool = open(&path);
                    model.crash();
                    prop_assert_eq!(spool.epoch(), epoch.as_str(), "epoch changed across a restart");
                }
            }
            // Seq continuity: a lane holds exactly acked+1 ..= last committed, no holes.
            for lane in 0..3u8 {
                let acked = model.acked.get(&lane).copied().unwrap_or(0);
                let seqs: Vec<u64> =
                    spool.read(Lane(lane), Seq(0), usize::MAX >> 1).unwrap().iter().map(|r| r.seq.0).collect();
                let want: Vec<u64> = (acked + 1..=model.last_committed(lane)).collect();
                prop_assert_eq!(seqs, want, "lane {} has holes or extras", lane);
                prop_assert_eq!(spool.acked(Lane(lane)), Seq(acked));
            }
            // The usage kept in memory matches what is on disk (counted afresh at each open).
            let held: Vec<&Vec<u8>> = model.committed.values().flat_map(|c| c.values()).collect();
            let bytes: u64 = held.iter().map(|p| (p.len() + message(&[]).topic.len()) as u64).sum();
            let usage: Vec<(u64, u64)> = spool.usage().map(|u| (u.records, u.bytes)).filter(|u| u.0 > 0).collect();
            let want = if held.is_empty() { vec![] } else { vec![(held.len() as u64, bytes)] };
            prop_assert_eq!(usage, want);
        }
    }
}

#[test]
fn properties_and_fields_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = open(&dir.path().join("spool.db"));
    let mut m = message(b"{\"cpu\":0.5}");
    m.topic = "inference/yolo-edge/v3.2.1/cam-03".into();
    m.expires_ms = Some(99);
    m.properties = Properties {
        user: vec![("trace-id".into(), "t-1".into()), ("attempt".into(), "2".into())],
        correlation_data: Some(Bytes::from_static(b"\x00\x01")),
        content_type: Some("application/json".into()),
        schema: Some("telemetry/3/0123456789abcdef".parse().unwrap()),
        receipt: None,
    };
    spool.append(Lane(2), m.clone(), Durability::Full);
    spool.flush().unwrap();
    let got = spool.read(Lane(2), Seq(0), 10).unwrap();
    assert_eq!(got, vec![Record { lane: Lane(2), seq: Seq(1), durability: Durability::Full, body: Body::Message(m) }]);
}

#[test]
fn seqs_continue_after_restart_even_when_everything_was_acked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    let mut spool = open(&path);
    for _ in 0..5 {
        spool.append(Lane(0), message(b"x"), Durability::Normal);
    }
    spool.flush().unwrap();
    assert_eq!(spool.ack(Lane(0), Seq(5)).unwrap(), 5);
    drop(spool);
    let mut spool = open(&path);
    assert_eq!(spool.append(Lane(0), message(b"y"), Durability::Normal), Seq(6));
    assert_eq!(spool.acked(Lane(0)), Seq(5));
}

#[test]
fn ack_beyond_committed_is_clamped() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = open(&dir.path().join("spool.db"));
    spool.append(Lane(0), message(b"a"), Durability::Normal);
    spool.flush().unwrap();
    spool.append(Lane(0), message(b"b"), Durability::Normal);
    // Seq 2 is handed out but not committed: an ack for it must not swallow it.
    assert_eq!(spool.ack(Lane(0), Seq(9)).unwrap(), 1);
    spool.flush().unwrap();
    assert_eq!(spool.read(Lane(0), Seq(0), 10).unwrap().len(), 1);
}

#[test]
fn corrupt_database_is_moved_aside_with_a_new_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    let first = open(&path).epoch().to_owned();
    std::fs::write(&path, b"this is not a database, but it was one once").unwrap();
    let _ = std::fs::remove_file(dir.path().join("spool.db-wal"));
    let storage = SqliteStorage::open(&path).unwrap();
    let aside = storage.opened().moved_aside.clone().expect("moved aside");
    assert!(aside.exists(), "the corrupt file is kept for a person to look at");
    assert!(aside.to_string_lossy().contains(".damaged-"));
    assert_ne!(storage.opened().epoch, first, "a new database needs a new epoch");
}

#[test]
fn newer_schema_is_refused_not_guessed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    drop(open(&path));
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'", []).unwrap();
    drop(conn);
    let err = SqliteStorage::open(&path).unwrap_err().to_string();
    assert!(err.contains("schema version 99"), "{err}");
    assert!(path.exists(), "refusing must not move or delete the database");
}

/// What a lane looks like on disk: message seqs, gap records' own seqs, and the seqs gap
/// records account for, by reason.
#[derive(Debug, Default)]
struct LaneView {
    messages: Vec<u64>,
    gap_records: Vec<u64>,
    evicted: Vec<u64>,
    expired: Vec<u64>,
    refused: Vec<u64>,
    unreadable: Vec<u64>,
}

fn view<S: Storage>(spool: &mut Spool<S>, lane: u8) -> LaneView {
    let mut v = LaneView::default();
    for r in spool.read(Lane(lane), Seq(0), usize::MAX >> 1).unwrap() {
        match r.body {
            Body::Message(_) => v.messages.push(r.seq.0),
            Body::Gap(g) => {
                v.gap_records.push(r.seq.0);
                let seqs: Vec<u64> = g.ranges.iter().flat_map(|(a, b)| *a..=*b).collect();
                assert_eq!(seqs.len() as u64, g.count, "gap count disagrees with its ranges");
                match g.reason {
                    GapReason::Evicted => v.evicted.extend(seqs),
                    GapReason::Expired => v.expired.extend(seqs),
                    GapReason::Refused => v.refused.extend(seqs),
                    GapReason::Unreadable => v.unreadable.extend(seqs),
                    GapReason::Unknown => panic!("the spool wrote a gap of no reason it knows"),
                }
            }
        }
    }
    v
}

proptest! {
    /// A tiny budget: every seq is acked, present, a gap record, or accounted for by exactly one
    /// gap record; evictions take the lowest priority lane and its oldest records first; the
    /// spool stays near its budget.
    #[test]
    fn eviction_accounts_for_every_seq(
        ops in proptest::collection::vec((0u8..3, 200usize..3000, 0u8..10), 1..150),
    ) {
        const BUDGET: u64 = 160 * 1024;
        let dir = tempfile::tempdir().unwrap();
        let mut spool = open(&dir.path().join("spool.db")).with_budget(BUDGET);
        let mut acked = [0u64; 3];
        for (lane, size, action) in ops {
            spool.append(Lane(lane), message(&vec![lane; size]), Durability::Normal);
            if action < 4 {
                let before: Vec<usize> = (0..3).map(|l| view(&mut spool, l).evicted.len()).collect();
                spool.flush().unwrap();
                let after: Vec<LaneView> = (0..3).map(|l| view(&mut spool, l)).collect();
                // Priority: a lane lost records in this flush only if every lower-priority lane
                // was left without messages.
                for l in 0..3 {
                    if after[l].evicted.len() > before[l] {
                        for (lower, view) in after.iter().enumerate().skip(l + 1) {
                            prop_assert!(view.messages.is_empty(), "lane {} evicted while lane {} holds messages", l, lower);
                        }
                    }
                }
                let used = spool.used_bytes().unwrap();
                prop_assert!(used <= BUDGET + 64 * 1024, "spool uses {} bytes over a {} budget", used, BUDGET);
            } else if action == 9 {
                let v = view(&mut spool, lane);
                if let Some(&first) = v.messages.first().min(v.gap_records.first()) {
                    spool.ack(Lane(lane), Seq(first)).unwrap();
                    acked[lane as usize] = acked[lane as usize].max(first);
                }
            }
        }
        spool.flush().unwrap();
        for lane in 0..3u8 {
            let v = view(&mut spool, lane);
            let a = spool.acked(Lane(lane)).0;
            let last = spool.read(Lane(lane), Seq(0), usize::MAX >> 1).unwrap().last().map_or(a, |r| r.seq.0);
            let mut seen: Vec<u64> = (1..=a).collect();
            seen.extend(&v.messages);
            seen.extend(&v.gap_records);
            // Evicted seqs that were acked later are gone from the lane; count the rest.
            seen.extend(v.evicted.iter().filter(|s| **s > a));
            seen.sort_unstable();
            let want: Vec<u64> = (1..=last).collect();
            prop_assert_eq!(&seen, &want, "lane {}: seqs not accounted for exactly once", lane);
            // Age: everything evicted is older than every message still held.
            if let (Some(newest_evicted), Some(oldest_kept)) = (v.evicted.iter().max(), v.messages.first()) {
                prop_assert!(newest_evicted < oldest_kept, "lane {} evicted {} but kept older {}", lane, newest_evicted, oldest_kept);
            }
        }
    }
}

/// The seam of the reads' ledger (`ledger.rs`) and eviction: records read, some of them evicted
/// before the cloud acks them, then acked. The ack must not count what eviction took already;
/// the usage kept must equal what a fresh count of the database finds at the next open.
#[test]
fn usage_stays_exact_when_eviction_takes_records_between_a_read_and_its_ack() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    let mut spool = open(&path).with_budget(96 * 1024);
    for _ in 0..20 {
        spool.append(Lane(2), message(&[2; 1500]), Durability::Normal);
    }
    spool.flush().unwrap();
    // A first ack sweeps the lane, so the next ones may be counted from the reads.
    assert_eq!(spool.ack(Lane(2), Seq(2)).unwrap(), 2);
    let read = spool.read(Lane(2), Seq(2), 100).unwrap();
    assert_eq!(read.len(), 18);
    // Higher-priority records crowd the read ones out.
    for i in 0..40u32 {
        spool.append(Lane(0), message(&i.to_be_bytes().repeat(400)), Durability::Normal);
    }
    spool.flush().unwrap();
    // Counted beside the spool, so no read of its own mends the ledger.
    let left: u64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT count(*) FROM records WHERE lane = 2 AND kind = 0 AND seq <= 20", [], |r| r.get(0))
        .unwrap();
    assert!(left < 18, "the budget evicted some of the read records");
    assert_eq!(spool.ack(Lane(2), Seq(20)).unwrap(), left, "an ack counts only what is still there");
    let kept: Vec<(u64, u64)> = spool.usage().map(|u| (u.records, u.bytes)).collect();
    spool.close().unwrap();
    // A database without the clean-close note is counted afresh at its open.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("DELETE FROM meta WHERE key IN ('closed_cleanly', 'usage', 'usage_lanes')", []).unwrap();
    drop(conn);
    let reopened = open(&path);
    let counted: Vec<(u64, u64)> = reopened.usage().map(|u| (u.records, u.bytes)).collect();
    assert_eq!(kept, counted);
}

#[test]
fn full_message_is_refused_when_only_higher_priorities_could_make_room() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = open(&dir.path().join("spool.db")).with_budget(96 * 1024);
    // Lower-priority bulk first: it is evicted to make room for lane 0.
    for _ in 0..20 {
        spool.append(Lane(2), message(&[2; 1500]), Durability::Normal);
    }
    spool.flush().unwrap();
    let mut refused = None;
    let mut accepted = 0;
    for i in 0..400u32 {
        match spool.append_full(Lane(0), message(&i.to_be_bytes().repeat(400))) {
            Ok(_) => accepted += 1,
            Err(r) => {
                refused = Some(r);
                break;
            }
        }
    }
    let refused = refused.expect("a full budget must refuse a full-durability message");
    assert_eq!(refused.message.payload.len(), 1600, "the refused message is handed back whole");
    assert!(accepted > 10);
    assert!(view(&mut spool, 2).messages.is_empty(), "lower priority evicted before refusing");
    let dropped = spool.take_dropped();
    assert_eq!(dropped.iter().map(|(_, _, n)| n).sum::<u64>(), 20, "every evicted record is counted for metrics");
    assert!(dropped.iter().all(|(c, r, _)| c == "telemetry" && *r == GapReason::Evicted));
    let lane0 = view(&mut spool, 0);
    assert!(lane0.evicted.is_empty(), "a full class never evicts its own lane to fit");
    assert_eq!(lane0.messages.len(), accepted);
}

#[test]
fn expired_messages_become_a_gap_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = open(&dir.path().join("spool.db"));
    for i in 0..6u64 {
        let mut m = message(b"t");
        m.expires_ms = (i % 2 == 0).then_some(100 + i);
        spool.append(Lane(1), m, Durability::Normal);
    }
    spool.flush().unwrap();
    assert_eq!(spool.expire(103).unwrap(), 2);
    let v = view(&mut spool, 1);
    assert_eq!(v.expired, [1, 3]);
    assert_eq!(v.messages, [2, 4, 5, 6]);
    assert_eq!(v.gap_records, [7]);
    assert_eq!(spool.take_dropped(), [("telemetry".to_owned(), GapReason::Expired, 2)]);
}

/// A read stops at READ_BYTES of messages (it becomes one uplink batch), after at least one
/// record, whatever `limit` allows.
#[test]
fn a_read_stops_at_its_byte_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = open(&dir.path().join("spool.db"));
    let big = vec![7u8; 3 << 20];
    for _ in 0..5 {
        spool.append(Lane(0), message(&big), Durability::Normal);
    }
    spool.flush().unwrap();
    // 3 MiB and a topic each: the third brings the read past 8 MiB.
    let first = spool.read(Lane(0), Seq(0), 512).unwrap();
    assert_eq!(first.iter().map(|r| r.seq.0).collect::<Vec<_>>(), [1, 2, 3]);
    let rest = spool.read(Lane(0), Seq(3), 512).unwrap();
    assert_eq!(rest.iter().map(|r| r.seq.0).collect::<Vec<_>>(), [4, 5]);
    assert_eq!(spool.read(Lane(0), Seq(0), 2).unwrap().len(), 2, "the record limit still holds");
}

/// The read bound counts what a record holds in memory: user property pairs at 48 bytes each,
/// so records of tiny payloads with 40,000 empty pairs each (about 200 KB on disk, 1.9 MB read)
/// stop a read after five, not after 512.
#[test]
fn a_read_counts_user_properties_at_what_they_cost_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = open(&dir.path().join("spool.db"));
    let mut m = message(b"x");
    m.properties.user = vec![(String::new(), String::new()); 40_000];
    for _ in 0..8 {
        spool.append(Lane(0), m.clone(), Durability::Normal);
    }
    spool.flush().unwrap();
    let read = spool.read(Lane(0), Seq(0), 512).unwrap();
    assert_eq!(read.len(), 5, "40,000 x 48 B a record: the fifth passes 8 MiB");
}

/// Expiry runs every second on the writer's thread: it must not read the whole backlog.
#[test]
fn expiry_reads_only_the_records_with_a_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    drop(open(&path));
    let conn = rusqlite::Connection::open(&path).unwrap();
    let plan: Vec<String> = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {}", sqlite::expired_query()))
        .unwrap()
        .query_map([0], |r| r.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(plan.iter().any(|step| step.contains("records_expiry")), "{plan:?}");
}

fn faulty(dir: &tempfile::TempDir, fail: u32) -> FaultyStorage<SqliteStorage> {
    let faults = Faults::default();
    faults.fail(Fault::DiskFull, fail);
    FaultyStorage { inner: SqliteStorage::open(&dir.path().join("spool.db")).unwrap(), faults, path: "faulty".into() }
}

#[test]
fn a_failed_commit_keeps_the_batch_and_a_retry_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let storage = faulty(&dir, 2);
    let mut spool = Spool::new(storage);
    for i in 0..10u8 {
        spool.append(Lane(0), message(&[i]), Durability::Normal);
    }
    let err = spool.flush().unwrap_err().to_string();
    assert!(err.contains("faulty") && err.contains("full"), "the error names the problem: {err}");
    assert_eq!(spool.pending(), 10, "nothing dropped on a failed commit");
    // More arrives while the disk is full; the second failure keeps it all too.
    spool.append(Lane(0), message(&[10]), Durability::Normal);
    assert!(spool.flush().is_err());
    spool.flush().unwrap();
    let got: Vec<u8> =
        spool.read(Lane(0), Seq(0), 100).unwrap().iter().map(|r| r.message().unwrap().payload[0]).collect();
    assert_eq!(got, (0..=10).collect::<Vec<u8>>());
    // A failed ack deletes nothing and can be repeated.
    spool.storage.faults.fail(Fault::FsyncFailed, 1);
    assert!(spool.ack(Lane(0), Seq(5)).is_err());
    assert_eq!(spool.acked(Lane(0)), Seq(0));
    assert_eq!(spool.ack(Lane(0), Seq(5)).unwrap(), 5);
    assert_eq!(spool.read(Lane(0), Seq(0), 100).unwrap().len(), 6);
}

#[test]
fn a_full_record_whose_commit_failed_becomes_a_refused_gap_not_a_late_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let storage = faulty(&dir, 1);
    let mut spool = Spool::new(storage);
    spool.append(Lane(0), message(b"n1"), Durability::Normal);
    spool.append(Lane(0), message(b"f2"), Durability::Full);
    spool.append(Lane(0), message(b"n3"), Durability::Normal);
    assert!(spool.flush().is_err());
    // The client of f2 got no PUBACK and resends it as a new message.
    spool.append(Lane(0), message(b"f2-resent"), Durability::Full);
    spool.flush().unwrap();
    let v = view(&mut spool, 0);
    assert_eq!(v.messages, [1, 3, 4], "f2 is not committed late behind its client's back");
    let gaps: Vec<Gap> = spool
        .read(Lane(0), Seq(0), 10)
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.body {
            Body::Gap(g) => Some(g),
            Body::Message(_) => None,
        })
        .collect();
    assert_eq!(gaps.len(), 1);
    assert_eq!((gaps[0].reason, gaps[0].ranges.clone()), (GapReason::Refused, vec![(2, 2)]));
}

#[test]
fn pending_is_capped_while_commits_fail_and_the_loss_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let storage = faulty(&dir, 8);
    let mut spool = Spool::new(storage).with_max_pending(4);
    for i in 0..10u8 {
        spool.append(Lane(1), message(&[i]), Durability::Normal);
        let _ = spool.flush();
    }
    assert!(spool.pending() <= 4 + 1, "pending stays bounded: {}", spool.pending());
    spool.flush().unwrap();
    spool.flush().unwrap();
    let last = spool.read(Lane(1), Seq(0), 100).unwrap().last().unwrap().seq.0;
    let v = view(&mut spool, 1);
    assert!(!v.refused.is_empty(), "the cap dropped records");
    let mut accounted: Vec<u64> = v.messages.iter().chain(&v.gap_records).chain(&v.refused).copied().collect();
    accounted.sort_unstable();
    assert_eq!(accounted, (1..=last).collect::<Vec<u64>>(), "every seq is a message, a gap, or in a gap");
}

/// The byte cap holds with few, large records: 20 messages of 100 KB against 250 KB pending
/// keep at most three in memory while every commit fails, and the dropped ones become gaps.
#[test]
fn pending_is_capped_in_bytes_while_commits_fail() {
    let dir = tempfile::tempdir().unwrap();
    let storage = faulty(&dir, 20);
    let mut spool = Spool::new(storage).with_max_pending_bytes(250_000);
    let big = vec![7u8; 100_000];
    for _ in 0..20 {
        spool.append(Lane(1), message(&big), Durability::Normal);
        let _ = spool.flush();
        assert!(spool.pending_bytes <= 250_000, "{} bytes pending", spool.pending_bytes);
    }
    spool.flush().unwrap();
    spool.flush().unwrap();
    let v = view(&mut spool, 1);
    assert!(v.refused.len() >= 17, "dropped while failing, and recorded: {:?}", v.refused);
}

#[test]
fn a_class_over_its_quota_loses_its_own_oldest_records_and_a_full_class_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool =
        open(&dir.path().join("spool.db")).with_quotas([("telemetry".to_owned(), 10_000), ("audit".to_owned(), 3_000)]);
    let size = message(&[0; 1000]).topic.len() as u64 + 1000;
    let mut other = message(&[7; 1000]);
    other.class = "other".into();
    for i in 0..30u8 {
        spool.append(Lane(1), message(&[i; 1000]), Durability::Normal);
        spool.append(Lane(1), other.clone(), Durability::Normal);
        spool.flush().unwrap();
    }
    let usage: BTreeMap<String, (u64, u64)> = spool.usage().map(|u| (u.class.clone(), (u.records, u.bytes))).collect();
    let (records, bytes) = usage["telemetry"];
    assert!(bytes <= 10_000, "telemetry holds {bytes} bytes over its 10,000 quota");
    assert_eq!(bytes, records * size);
    assert_eq!(usage["other"], (30, 30 * size), "a class without a quota keeps everything");
    let v = view(&mut spool, 1);
    let kept: Vec<u8> = spool
        .read(Lane(1), Seq(0), 1000)
        .unwrap()
        .iter()
        .filter_map(|r| r.message().filter(|m| m.class == "telemetry").map(|m| m.payload[0]))
        .collect();
    assert_eq!(kept.last(), Some(&29), "the newest records stay");
    assert!(kept.windows(2).all(|w| w[0] + 1 == w[1]), "the oldest went first: {kept:?}");
    assert_eq!(v.evicted.len() as u64, 30 - records, "every eviction is in a gap record");
    // The usage survives a restart: counted afresh from disk.
    drop(spool);
    let spool = open(&dir.path().join("spool.db"));
    let after: BTreeMap<String, (u64, u64)> = spool.usage().map(|u| (u.class.clone(), (u.records, u.bytes))).collect();
    assert_eq!(after, usage);

    let mut spool = spool.with_quotas([("audit".to_owned(), 3_000)]);
    let mut audit = message(&[1; 1000]);
    audit.class = "audit".into();
    assert!(spool.append_full(Lane(0), audit.clone()).is_ok());
    assert!(spool.append_full(Lane(0), audit.clone()).is_ok());
    assert!(spool.append_full(Lane(0), audit.clone()).is_err(), "a third would pass the quota");
    spool.flush().unwrap();
    assert!(spool.append_full(Lane(0), audit).is_err(), "full records are never evicted to make room");
}

#[test]
fn the_wal_is_checkpointed_off_the_commit_path_within_a_few_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    let mut spool = open(&path);
    let file_size = |suffix: &str| std::fs::metadata(format!("{}{suffix}", path.display())).map_or(0, |m| m.len());
    for i in 0..6_000u32 {
        spool.append(Lane(1), message(&i.to_be_bytes().repeat(256)), Durability::Normal);
        if i % 500 == 499 {
            spool.flush().unwrap();
        }
    }
    // Written through the spool's own connection, which never checkpoints: the records are in
    // the WAL until the checkpoint thread copies them into the database file. Once it copied
    // them all, the next commit restarts the WAL and truncates it to journal_size_limit.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        spool.append(Lane(1), message(b"tick"), Durability::Normal);
        spool.flush().unwrap();
        let done = file_size("") >= 6_000 * 1024 && file_size("-wal") <= 4 << 20;
        if done || std::time::Instant::now() > deadline {
            assert!(done, "database {} bytes, WAL {}", file_size(""), file_size("-wal"));
            break;
        }
    }
}

#[test]
fn a_large_ack_keeps_usage_exact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    let mut spool = open(&path);
    // Two classes interleaved in lane 0; lane 1 untouched.
    for i in 0..20_000u32 {
        let mut m = message(&i.to_be_bytes());
        if i % 3 == 0 {
            m.class = "audit".into();
            m.topic = "audit/x".into();
        }
        spool.append(Lane(0), m, Durability::Normal);
    }
    spool.append(Lane(1), message(b"other lane"), Durability::Normal);
    spool.flush().unwrap();
    assert_eq!(spool.ack(Lane(0), Seq(17_000)).unwrap(), 17_000);
    let usage = |s: &Spool<SqliteStorage>| {
        let mut u: Vec<(String, u64, u64)> = s.usage().map(|u| (u.class.clone(), u.records, u.bytes)).collect();
        u.sort();
        u
    };
    let kept = usage(&spool);
    // What a fresh open counts from the table itself.
    drop(spool);
    let spool = open(&path);
    assert_eq!(usage(&spool), kept);
    let audit = (17_000..20_000u32).filter(|i| i % 3 == 0).count() as u64;
    assert_eq!(kept.iter().find(|u| u.0 == "audit").map(|u| u.1), Some(audit));
    assert_eq!(kept.iter().find(|u| u.0 == "telemetry").map(|u| u.1), Some(3_000 - audit + 1));
}

#[test]
fn the_integrity_check_runs_after_a_crash_and_the_usage_is_kept_not_counted_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    let checked = |path: &Path| SqliteStorage::open(path).unwrap().opened().checked;
    let usage = |o: &Opened| o.usage.iter().map(|u| (u.class.clone(), u.records, u.bytes)).collect::<Vec<_>>();
    let mut spool = open(&path);
    spool.append(Lane(0), message(b"one"), Durability::Normal);
    spool.flush().unwrap();
    drop(spool);
    assert!(checked(&path), "a spool dropped without closing is checked");
    let mut spool = open(&path);
    spool.append(Lane(0), message(b"two"), Durability::Normal);
    let mut audit = message(b"three");
    audit.class = "audit".into();
    spool.append(Lane(0), audit, Durability::Normal);
    spool.append(Lane(1), message(b"four"), Durability::Normal);
    spool.flush().unwrap();
    spool.ack(Lane(1), Seq(1)).unwrap();
    // A crash: the usage was kept with each transaction, so it is not counted at the next open.
    drop(spool);
    let storage = SqliteStorage::open(&path).unwrap();
    assert!(storage.opened().checked, "after a crash the check runs (beside the spool)");
    assert!(!storage.opened().counted, "the usage kept with every transaction needs no count");
    let kept = usage(storage.opened());
    // "one" and "two" in lane 0; "four" in lane 1 was acked. Bytes are payload and topic.
    let topic = "telemetry/cam-1/metrics".len() as u64;
    assert_eq!(kept, [("audit".to_owned(), 1, 5 + topic), ("telemetry".to_owned(), 2, 3 + 3 + 2 * topic)]);
    drop(storage);
    // A close counts as clean only once the check passed.
    let mut spool = open(&path);
    let state = spool.storage.integrity().expect("not closed cleanly: checked");
    while *state.lock().unwrap() == CheckState::Running {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(*state.lock().unwrap(), CheckState::Passed);
    spool.close().unwrap();
    drop(spool);
    let storage = SqliteStorage::open(&path).unwrap();
    assert!(!storage.opened().checked, "a cleanly closed spool opens without the check");
    assert!(!storage.opened().counted);
    assert_eq!(usage(storage.opened()), kept);
    drop(storage);
    // A version that does not keep the usage runs in between: it appended (the lanes moved)
    // without it, so the kept usage is not trusted and the records are counted.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("UPDATE lanes SET next_seq = next_seq + 1 WHERE lane = 0", []).unwrap();
    drop(conn);
    let storage = SqliteStorage::open(&path).unwrap();
    assert!(storage.opened().counted);
    assert_eq!(usage(storage.opened()), kept);
    drop(storage);
    // Counted once: kept from then on.
    assert!(!SqliteStorage::open(&path).unwrap().opened().counted);
}

/// A power cut that damaged a page: the spool opens at once, the check beside it finds the
/// damage and notes it where the next start finds it; a start after that (the node stopped
/// before its spool thread rebuilt the database) salvages it under the same epoch, the damaged
/// file aside with its note, and what could not be read becomes one gap record.
#[test]
fn a_damaged_spool_found_by_the_check_beside_it_is_salvaged_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    let mut spool = open(&path);
    for i in 0..2_000u32 {
        spool.append(Lane(0), message(&[i as u8; 1024]), Durability::Normal);
    }
    spool.flush().unwrap();
    let epoch = spool.epoch().to_owned();
    drop(spool);
    // Garbage over a page of records in the middle of the file.
    {
        use std::io::{Seek, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let pages = f.metadata().unwrap().len() / 4096;
        f.seek(std::io::SeekFrom::Start(pages / 2 * 4096)).unwrap();
        f.write_all(&[0xA5; 4096]).unwrap();
    }
    let storage = SqliteStorage::open(&path).unwrap();
    assert_eq!(storage.opened().epoch, epoch, "it opened at once, before the check");
    let state = storage.integrity().expect("a check runs after an unclean stop");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let report = loop {
        match state.lock().unwrap().clone() {
            CheckState::Failed(report) => break report,
            CheckState::Running => {}
            other => panic!("the check ended {other:?}"),
        }
        assert!(std::time::Instant::now() < deadline, "the check did not finish");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(report.starts_with("quick_check"), "{report}");
    let note = integrity::sidecar(&path);
    assert!(note.exists(), "the failure is noted for the next start");
    drop(storage);
    let storage = SqliteStorage::open(&path).unwrap();
    let aside = storage.opened().moved_aside.clone().expect("moved aside at the next start");
    assert_eq!(storage.opened().epoch, epoch, "salvaged under its own epoch");
    let lost = storage.opened().salvaged.as_ref().expect("salvaged").unreadable_count();
    assert!((1..50).contains(&lost), "one page of 1 KiB records: {lost}");
    assert!(aside.exists(), "kept for a person to look at");
    let mut kept_note = aside.into_os_string();
    kept_note.push(".check-failed");
    assert!(PathBuf::from(kept_note).exists(), "with its note");
    assert!(!note.exists(), "the new database has no note");
    let mut spool = Spool::new(storage);
    spool.flush().unwrap();
    let v = view(&mut spool, 0);
    assert_eq!(v.messages.len() as u64 + lost, 2_000, "every record but those of the page");
    assert_eq!(v.gap_records, [2_001], "one gap record, after everything else");
}

/// A message under a QoS 2 receipt the spool took a message of is that message (a resend after
/// a crash lost the publisher's PUBREC): one record, the same seq, pending or committed, across
/// a reopen, after the record was acked; until the receipt is forgotten (released), or dropped
/// at start as one the session store no longer holds.
#[test]
fn a_message_under_a_receipt_the_spool_holds_is_taken_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool.db");
    let under = |receipt| {
        let mut m = message(b"x");
        m.properties.receipt = Some(receipt);
        m
    };
    let mut spool = open(&path);
    let seq = spool.append(Lane(1), under(7), Durability::Normal);
    assert_eq!(spool.append(Lane(1), under(7), Durability::Normal), seq, "pending");
    spool.flush().unwrap();
    assert_eq!(spool.append_full(Lane(1), under(7)).unwrap(), seq, "committed");
    let other = spool.append(Lane(1), under(8), Durability::Normal);
    spool.flush().unwrap();
    assert_eq!(spool.read(Lane(1), Seq(0), 10).unwrap().len(), 2);
    spool.ack(Lane(1), other).unwrap();
    drop(spool);
    let mut spool = open(&path);
    assert_eq!(spool.append(Lane(1), under(7), Durability::Normal), seq, "reopened, acked or not");
    assert_eq!(spool.append(Lane(1), under(8), Durability::Normal), other);
    spool.forget_receipts(&[7]).unwrap();
    let again = spool.append(Lane(1), under(7), Durability::Normal);
    assert!(again > other, "released: a new message");
    spool.flush().unwrap();
    spool.keep_receipts(&std::collections::BTreeSet::from([7])).unwrap();
    drop(spool);
    let mut spool = open(&path);
    assert_eq!(spool.append(Lane(1), under(7), Durability::Normal), again);
    assert!(spool.append(Lane(1), under(8), Durability::Normal) > again, "8 was not kept");
}
