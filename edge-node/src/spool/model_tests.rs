//! The spool against a plain in-memory model: random sequences of append, flush, read, ack and
//! crash-and-reopen must agree on every read, on seq continuity and on the epoch.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use proptest::prelude::*;

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
                        .map(|r| (r.seq.0, r.message.payload.to_vec()))
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
    };
    spool.append(Lane(2), m.clone(), Durability::Full);
    spool.flush().unwrap();
    let got = spool.read(Lane(2), Seq(0), 10).unwrap();
    assert_eq!(got, vec![Record { lane: Lane(2), seq: Seq(1), message: m }]);
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
    assert!(aside.to_string_lossy().contains(".corrupt-"));
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
