//! What one edge may make the cloud keep for it: epochs and dictionaries. Both are the edge's
//! choice (a new spool names a new epoch, each retraining makes a new dictionary), so a hostile
//! edge with a valid certificate could otherwise fill the marks and dictionary storage.
//!
//! - **Epochs.** Each epoch has its marks (a KV key, rows in SQLite). An edge keeps at most
//!   `epochs` of them live; registering one more retires the oldest registered: its marks are
//!   deleted and its name kept in a bounded list, so a spool of that epoch coming back (restored
//!   from an old copy) is refused by name instead of starting again from seq 1 as if new, which
//!   would store every record it holds a second time. When the retired list is full too, new
//!   epochs are refused: the edge stays out until an operator raises the limits.
//! - **Dictionaries.** Stored per edge (no edge can name another's), at most `dicts` of them
//!   and `dict_bytes` together; storing one more evicts the edge's oldest. An evicted
//!   dictionary is not in the next welcome, so the edge announces it again if it still uses it.
//!
//! The bookkeeping is here, once, for both sinks; each stores it its own way (a KV entry
//! updated with compare-and-set, a row in a transaction).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeQuota {
    /// Epochs with marks, per edge.
    pub epochs: usize,
    /// Names of retired epochs remembered, per edge.
    pub retired_epochs: usize,
    /// Dictionaries stored, per edge.
    pub dicts: usize,
    /// Bytes of dictionaries stored, per edge; at least one largest dictionary.
    pub dict_bytes: u64,
}

impl Default for EdgeQuota {
    fn default() -> Self {
        Self { epochs: 4, retired_epochs: 1024, dicts: 64, dict_bytes: 4 << 20 }
    }
}

/// An edge's epochs as a sink keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Epochs {
    /// Epochs with marks and when each was registered (ms), oldest first.
    #[serde(default)]
    pub live: Vec<(String, u64)>,
    /// Epochs retired by the bound, oldest first: their marks are gone.
    #[serde(default)]
    pub retired: Vec<String>,
}

/// What became of an epoch an edge said hello with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EpochVerdict {
    /// Registered before: its marks stand.
    Known,
    /// Registered now; the marks of `retired` are to be deleted.
    Added { retired: Vec<String> },
    /// Retired by the bound: its marks are gone, so it is refused.
    Retired,
    /// A new epoch, and no room to remember one more retired name.
    Exhausted,
}

impl Epochs {
    /// Registers `epoch` if it is new and there is room; says what became of it.
    pub(crate) fn admit(&mut self, epoch: &str, now_ms: u64, quota: &EdgeQuota) -> EpochVerdict {
        if self.live.iter().any(|(e, _)| e == epoch) {
            return EpochVerdict::Known;
        }
        if self.retired.iter().any(|e| e == epoch) {
            return EpochVerdict::Retired;
        }
        let to_retire = (self.live.len() + 1).saturating_sub(quota.epochs.max(1));
        if self.retired.len() + to_retire > quota.retired_epochs {
            return EpochVerdict::Exhausted;
        }
        let retired: Vec<String> = self.live.drain(..to_retire).map(|(e, _)| e).collect();
        self.retired.extend(retired.iter().cloned());
        self.live.push((epoch.to_owned(), now_ms));
        EpochVerdict::Added { retired }
    }
}

/// One stored dictionary of an edge, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredDict {
    pub id: String,
    pub bytes: u64,
    pub stored_ms: u64,
}

/// An edge's stored dictionaries, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DictIndex {
    #[serde(default)]
    pub dicts: Vec<StoredDict>,
}

impl DictIndex {
    /// Adds dictionary `id` of `bytes` (again: it becomes the newest), then evicts the oldest
    /// until the edge is within `quota`; returns the evicted ids. The one added stays.
    pub(crate) fn add(&mut self, id: &str, bytes: u64, now_ms: u64, quota: &EdgeQuota) -> Vec<String> {
        self.dicts.retain(|d| d.id != id);
        self.dicts.push(StoredDict { id: id.to_owned(), bytes, stored_ms: now_ms });
        let mut evicted = Vec::new();
        while self.dicts.len() > 1
            && (self.dicts.len() > quota.dicts || self.dicts.iter().map(|d| d.bytes).sum::<u64>() > quota.dict_bytes)
        {
            evicted.push(self.dicts.remove(0).id);
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUOTA: EdgeQuota = EdgeQuota { epochs: 2, retired_epochs: 2, dicts: 3, dict_bytes: 100 };

    #[test]
    fn the_oldest_epoch_is_retired_and_then_refused_by_name() {
        let mut epochs = Epochs::default();
        assert_eq!(epochs.admit("a", 1, &QUOTA), EpochVerdict::Added { retired: vec![] });
        assert_eq!(epochs.admit("b", 2, &QUOTA), EpochVerdict::Added { retired: vec![] });
        assert_eq!(epochs.admit("a", 3, &QUOTA), EpochVerdict::Known);
        assert_eq!(epochs.admit("c", 4, &QUOTA), EpochVerdict::Added { retired: vec!["a".into()] });
        assert_eq!(epochs.admit("a", 5, &QUOTA), EpochVerdict::Retired, "a restored old spool");
        assert_eq!(epochs.admit("d", 6, &QUOTA), EpochVerdict::Added { retired: vec!["b".into()] });
        // Two names remembered: a fifth epoch would need a third.
        assert_eq!(epochs.admit("e", 7, &QUOTA), EpochVerdict::Exhausted);
        assert_eq!(epochs.live, [("c".to_owned(), 4), ("d".to_owned(), 6)]);
        assert_eq!(epochs.admit("b", 8, &QUOTA), EpochVerdict::Retired);
        assert_eq!(epochs.admit("d", 9, &QUOTA), EpochVerdict::Known, "live epochs still come in");
    }

    #[test]
    fn a_lowered_epoch_bound_retires_the_excess_at_once() {
        let mut epochs = Epochs::default();
        for (i, e) in ["a", "b", "c"].into_iter().enumerate() {
            epochs.admit(e, i as u64, &EdgeQuota { epochs: 3, ..QUOTA });
        }
        let lower = EdgeQuota { epochs: 1, retired_epochs: 8, ..QUOTA };
        assert_eq!(
            epochs.admit("d", 9, &lower),
            EpochVerdict::Added { retired: vec!["a".into(), "b".into(), "c".into()] }
        );
        assert_eq!(epochs.live.len(), 1);
    }

    #[test]
    fn dictionaries_are_evicted_oldest_first_by_count_and_by_bytes() {
        let mut index = DictIndex::default();
        assert!(index.add("a", 10, 1, &QUOTA).is_empty());
        assert!(index.add("b", 10, 2, &QUOTA).is_empty());
        assert!(index.add("c", 10, 3, &QUOTA).is_empty());
        assert_eq!(index.add("d", 10, 4, &QUOTA), ["a"], "a fourth is one too many");
        // Storing one again makes it the newest.
        assert!(index.add("b", 10, 5, &QUOTA).is_empty());
        assert_eq!(index.add("e", 10, 6, &QUOTA), ["c"]);
        assert_eq!(index.add("big", 85, 7, &QUOTA), ["d", "b"], "100 bytes at most");
        let ids: Vec<_> = index.dicts.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["e", "big"]);
        // One alone over the bytes is kept: the bound is checked to fit the largest.
        assert_eq!(index.add("huge", 500, 8, &QUOTA), ["e", "big"]);
    }
}
