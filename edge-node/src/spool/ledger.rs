//! What the uplink's reads saw of each lane, so an ack counts what it deletes (records and bytes
//! per class, for the class quotas) from memory instead of reading the rows a second time.
//!
//! The second read was most of an ack's cost in a drain: by the time a batch is acked, the
//! window's later reads have pushed its pages out of SQLite's cache, and the count (a scan and a
//! `GROUP BY` sort) read them all again from the file before the `DELETE` read them once more
//! (a quarter of the spool thread's CPU; docs/BENCHMARKS.md, issue 46).
//!
//! The ledger is only trusted where it is known to be whole, from facts of this connection
//! alone: a lane's `swept` seq is one this connection's own ack deleted through (no row at or
//! below it is left), and its run holds every row a read returned from `from` on, contiguously
//! (a read returns the rows after its seq in key order). An ack through `up_to` is counted from
//! the run when the run starts at or below `swept` and reaches `up_to`; otherwise (the first
//! ack of a run, a read that skipped ahead, rows deleted or moved by eviction, expiry or a
//! renumber, which forget the lane's run) the rows are counted from the database as before.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::{Body, ClassUsage, Lane, Record};

/// Entries held over all lanes at most (16 bytes each): far above a window of reads (8 batches
/// of 1,024 records by default); past it the ledger starts again and acks count from the
/// database until it is whole again.
const MAX_ENTRIES: usize = 1 << 16;

/// Distinct classes named at most; past it, the same.
const MAX_CLASSES: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Entry {
    seq: u64,
    /// The class's index in `Ledger::classes` and the message's size, or `None` for a gap
    /// record (the class usage counts messages only).
    message: Option<(u16, u64)>,
}

#[derive(Debug, Default)]
struct Run {
    /// Every row of the lane with a seq in `(from, to]` is in `entries`, in seq order.
    from: u64,
    to: u64,
    entries: VecDeque<Entry>,
}

#[derive(Debug, Default)]
pub(super) struct Ledger {
    runs: HashMap<u8, Run>,
    /// Per lane, a seq this connection's ack deleted through.
    swept: HashMap<u8, u64>,
    classes: Vec<String>,
    entries: usize,
}

impl Ledger {
    /// Notes what a read of `lane` after `after` returned.
    pub(super) fn read(&mut self, lane: Lane, after: u64, records: &[Record]) {
        let Some(last) = records.last() else { return };
        if records.len() > MAX_ENTRIES {
            // One read larger than the whole ledger (a huge `batch_records`): not kept.
            self.drop_run(lane);
            return;
        }
        if self.entries + records.len() > MAX_ENTRIES {
            self.clear();
        }
        let run = self.runs.entry(lane.0).or_default();
        if after < run.from || after > run.to {
            // Not joined to what the run holds: it starts again here.
            self.entries -= run.entries.len();
            *run = Run { from: after, to: after, entries: VecDeque::new() };
        } else {
            // A read again from inside the run (a resend after a reconnect): the same rows.
            while run.entries.back().is_some_and(|e| e.seq > after) {
                run.entries.pop_back();
                self.entries -= 1;
            }
            run.to = after;
        }
        for r in records {
            let message = match &r.body {
                Body::Message(m) => {
                    let class = match self.classes.iter().position(|c| *c == m.class) {
                        Some(i) => i,
                        None if self.classes.len() < MAX_CLASSES => {
                            self.classes.push(m.class.clone());
                            self.classes.len() - 1
                        }
                        // Too many names to keep: the lane's run is dropped, not made up.
                        None => {
                            self.drop_run(lane);
                            return;
                        }
                    };
                    Some((class as u16, super::message_size(m)))
                }
                Body::Gap(_) => None,
            };
            run.entries.push_back(Entry { seq: r.seq.0, message });
            self.entries += 1;
        }
        run.to = last.seq.0;
    }

    /// What an ack of `lane` through `up_to` deletes, if the ledger knows it whole; the entries
    /// it counts are let go. `None`: count from the database. Either way [`Ledger::swept`]
    /// once the delete is committed, [`Ledger::forget`] if it failed.
    pub(super) fn ack(&mut self, lane: Lane, up_to: u64) -> Option<Vec<ClassUsage>> {
        let swept = *self.swept.get(&lane.0)?;
        let run = self.runs.get_mut(&lane.0)?;
        if run.from > swept || run.to < up_to {
            return None;
        }
        let mut usage: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
        while run.entries.front().is_some_and(|e| e.seq <= up_to) {
            let Some(e) = run.entries.pop_front() else { break };
            self.entries -= 1;
            if let Some((class, size)) = e.message {
                let u = usage.entry(class).or_default();
                *u = (u.0 + 1, u.1 + size);
            }
        }
        run.from = run.from.max(up_to);
        let mut out: Vec<ClassUsage> = usage
            .into_iter()
            .map(|(c, (records, bytes))| ClassUsage { class: self.classes[c as usize].clone(), records, bytes })
            .collect();
        out.sort_by(|a, b| a.class.cmp(&b.class));
        Some(out)
    }

    /// This connection deleted every row of `lane` through `up_to`.
    pub(super) fn swept(&mut self, lane: Lane, up_to: u64) {
        let s = self.swept.entry(lane.0).or_default();
        *s = (*s).max(up_to);
        if let Some(run) = self.runs.get_mut(&lane.0) {
            while run.entries.front().is_some_and(|e| e.seq <= up_to) {
                run.entries.pop_front();
                self.entries -= 1;
            }
            run.from = run.from.max(up_to).min(run.to);
        }
    }

    /// Rows of `lane` were deleted or moved other than by an ack, or an ack failed: nothing of
    /// the lane is trusted until an ack counted from the database sweeps it again.
    pub(super) fn forget(&mut self, lane: Lane) {
        self.swept.remove(&lane.0);
        self.drop_run(lane);
    }

    /// The lane's run let go; what was swept stays true.
    fn drop_run(&mut self, lane: Lane) {
        if let Some(run) = self.runs.remove(&lane.0) {
            self.entries -= run.entries.len();
        }
    }

    fn clear(&mut self) {
        self.runs.clear();
        self.classes.clear();
        self.entries = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::{Durability, Gap, Message, Properties, Seq};
    use bytes::Bytes;

    fn message(seq: u64, class: &str, payload: usize) -> Record {
        Record {
            lane: Lane(1),
            seq: Seq(seq),
            durability: Durability::Normal,
            body: Body::Message(Message {
                class: class.into(),
                topic: "t".into(),
                payload: Bytes::from(vec![0; payload]),
                qos: 1,
                enqueued_ms: 0,
                expires_ms: None,
                properties: Properties::default(),
            }),
        }
    }

    fn gap(seq: u64) -> Record {
        let g =
            Gap { class: "a".into(), reason: shared::proto::GapReason::Evicted, ranges: vec![(seq, seq)], count: 1 };
        Record { lane: Lane(1), seq: Seq(seq), durability: Durability::Normal, body: Body::Gap(g) }
    }

    fn counted(u: &[ClassUsage]) -> Vec<(&str, u64, u64)> {
        u.iter().map(|c| (c.class.as_str(), c.records, c.bytes)).collect()
    }

    #[test]
    fn an_ack_is_counted_from_the_reads_only_once_the_lane_was_swept_and_the_run_is_joined() {
        let mut l = Ledger::default();
        l.read(Lane(1), 0, &[message(1, "a", 9), message(2, "b", 19), gap(3), message(5, "a", 4)]);
        // Nothing swept yet: rows below the run may still be in the table.
        assert!(l.ack(Lane(1), 2).is_none());
        l.swept(Lane(1), 2);
        l.read(Lane(1), 5, &[message(6, "b", 9)]);
        let u = l.ack(Lane(1), 5).expect("whole");
        l.swept(Lane(1), 5);
        // Seq 3 is a gap (not counted), 4 was never a row; sizes are payload + topic.
        assert_eq!(counted(&u), vec![("a", 1, 5)]);
        // Past what was read: from the database.
        assert!(l.ack(Lane(1), 7).is_none());
        assert_eq!(counted(&l.ack(Lane(1), 6).unwrap()), vec![("b", 1, 10)]);
    }

    #[test]
    fn a_read_that_skips_ahead_or_rows_moved_make_the_database_count_again() {
        let mut l = Ledger::default();
        l.swept(Lane(1), 0);
        l.read(Lane(1), 0, &[message(1, "a", 1), message(2, "a", 1)]);
        // A read from further on: rows between may exist that no read saw.
        l.read(Lane(1), 10, &[message(11, "a", 1)]);
        assert!(l.ack(Lane(1), 11).is_none());
        l.swept(Lane(1), 11);
        l.read(Lane(1), 11, &[message(12, "a", 1), message(13, "a", 1)]);
        // A resend reads again from inside the run: the same rows, kept once.
        l.read(Lane(1), 12, &[message(13, "a", 1)]);
        assert_eq!(counted(&l.ack(Lane(1), 13).unwrap()), vec![("a", 2, 4)]);
        l.swept(Lane(1), 13);
        l.read(Lane(1), 13, &[message(14, "a", 1)]);
        l.forget(Lane(1));
        assert!(l.ack(Lane(1), 14).is_none());
        assert_eq!(l.entries, 0);
    }

    #[test]
    fn the_ledger_holds_a_bounded_number_of_entries() {
        let mut l = Ledger::default();
        l.swept(Lane(1), 0);
        let batch: Vec<Record> = (1..=1024).map(|s| message(s, "a", 1)).collect();
        for i in 0..(MAX_ENTRIES / 1024 + 4) as u64 {
            let records: Vec<Record> = batch.iter().map(|r| message(r.seq.0 + i * 1024, "a", 1)).collect();
            l.read(Lane(1), i * 1024, &records);
            assert!(l.entries <= MAX_ENTRIES);
        }
        let huge: Vec<Record> = (1..=MAX_ENTRIES as u64 + 1).map(|s| message(s, "a", 1)).collect();
        l.read(Lane(2), 0, &huge);
        assert!(l.entries <= MAX_ENTRIES);
    }
}
