//! What the spool does about a damaged database: at open, the storage salvaged it
//! (`sqlite.rs`, `salvage.rs`) and the ranges it could not read become gap records here (pending at once, so the next commit
//! writes them and tells the uplink); while
//! it runs, a read, an ack or a commit that finds a damaged page, or the integrity check beside
//! it, leads the spool's thread to rebuild it the same way (`writer.rs`), under the same epoch,
//! so the lane moves on past what cannot be read instead of failing the same read forever.

use std::collections::BTreeMap;

use super::salvage::Salvaged;
use super::{Body, Durability, Gap, GapReason, Record, Seq, Spool, SpoolError, Storage};

/// The class a gap record for unreadable records names: their own class could not be read.
pub(crate) const UNREADABLE_CLASS: &str = "unknown";

impl<S: Storage> Spool<S> {
    /// Salvages the database into a new one that takes its place, under the same epoch and
    /// with each lane's next seq as this spool knows it; what could not be read goes to the
    /// cloud as gap records with the next commit. Records appended and not yet committed stay
    /// pending and go into the new database.
    pub(crate) fn rebuild(&mut self) -> Result<Salvaged, SpoolError> {
        let known: BTreeMap<u8, u64> = self.lanes.iter().map(|(l, s)| (l.0, s.committed.max(1))).collect();
        let salvaged = self.storage.rebuild(&known)?;
        self.usage = self.storage.opened().usage.iter().map(|u| (u.class.clone(), u.clone())).collect();
        self.queue_unreadable_gaps(&salvaged);
        Ok(salvaged)
    }

    /// What the storage knows is wrong with the database beyond one operation (a failed
    /// integrity check).
    pub(crate) fn damaged(&self) -> Option<String> {
        self.storage.damaged()
    }

    /// Turns the unreadable ranges a salvage left into pending gap records, with seqs after
    /// everything handed out.
    pub(super) fn queue_unreadable_gaps(&mut self, salvaged: &Salvaged) {
        for (&lane, ranges) in &salvaged.unreadable {
            let ranges = ranges.clone();
            let count = ranges.iter().map(|(a, b)| b - a + 1).sum();
            let state = self.lanes.entry(lane).or_default();
            state.next = state.next.max(1);
            let seq = Seq(state.next);
            state.next += 1;
            tracing::error!(lane = lane.0, count, ?ranges, "spool records unreadable after damage; gap record written");
            let gap = Gap { class: UNREADABLE_CLASS.into(), reason: GapReason::Unreadable, ranges, count };
            self.pending.push(Record { lane, seq, durability: Durability::Normal, body: Body::Gap(gap) });
            self.dropped.push((UNREADABLE_CLASS.into(), GapReason::Unreadable, count));
        }
    }
}
