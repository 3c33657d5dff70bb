//! Seq reservations: `<spool>.seqs`, a small file beside the database that says, per lane, up
//! to which seq this epoch may already have handed out. It is how the spool notices that its
//! database went back in time.
//!
//! `normal` commits are not fsynced (WAL, `synchronous=NORMAL`), so a power cut can take the
//! last of them back; so does putting back a copy of the database. The records the database
//! still holds are the same as before, but its lanes' next seqs are lower, and the seqs handed
//! out next may be ones the cloud already committed for other records: the cloud's mark in the
//! next Welcome would count them as acked, and the edge would delete them unsent.
//!
//! Before a commit uses a seq past its lane's reservation, the reservation moves ahead by
//! [`BLOCK`] and the file is written and fsynced (`shared::fs::write_durably`): one
//! fsync per 65,536 seqs of a lane. A clean close writes the exact next seqs back. Opening a
//! lane whose next seq is at or below its reservation (after a crash, a power cut or a restored
//! copy: they cannot be told apart here) marks the lane *suspect from* that seq. The cloud's
//! mark decides (`Spool::check_mark`): a mark at or past the suspect seq means the cloud holds
//! seqs this database does not, so the records from the suspect seq on are renumbered past the
//! mark and sent as new; a mark below it means nothing was reused, and the lane is cleared with
//! its seqs unchanged (after a plain crash, the usual case).
//!
//! A copy of the whole directory put back (database and this file together) is caught only
//! when the cloud's mark is above everything the database holds.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Lane, Seq, Spool, SpoolError, Storage};

/// Seqs reserved at a time: one fsync of this file per this many records in a lane.
pub(super) const BLOCK: u64 = 65_536;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Contents {
    epoch: String,
    /// Per lane, the highest seq that may have been handed out.
    reserved: BTreeMap<u8, u64>,
    /// Per lane, the first seq handed out since the database was found below its reservation,
    /// until the cloud's mark was checked.
    #[serde(default)]
    suspect: BTreeMap<u8, u64>,
}

#[derive(Debug)]
pub(super) struct SeqFile {
    path: PathBuf,
    contents: Contents,
}

impl SeqFile {
    /// The reservations of `epoch` for the database at `db`; none if the file is missing,
    /// unreadable or of another epoch (a new database).
    pub fn open(db: &Path, epoch: &str) -> Self {
        let mut path = db.as_os_str().to_owned();
        path.push(".seqs");
        let path = PathBuf::from(path);
        let read = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<Contents>(&bytes)
                .map_err(|e| {
                    // Its protection is gone until the next reservation is written: say so.
                    tracing::warn!(path = %path.display(), error = %e, "spool seq reservations unreadable; starting without them");
                })
                .ok(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "spool seq reservations unreadable; starting without them");
                None
            }
        };
        let contents = read
            .filter(|c| c.epoch == epoch)
            .unwrap_or_else(|| Contents { epoch: epoch.to_owned(), ..Contents::default() });
        Self { path, contents }
    }

    #[cfg(test)]
    pub fn reserved(&self, lane: Lane) -> Option<u64> {
        self.contents.reserved.get(&lane.0).copied()
    }

    /// Marks the lanes whose next seq is at or below their reservation as suspect from that
    /// seq (keeping an earlier mark); `lanes` holds each lane's next seq in the database, and a
    /// reserved lane missing from it starts at 1. Returns the lanes newly marked.
    pub fn mark_suspects(&mut self, lanes: &BTreeMap<u8, u64>) -> std::io::Result<Vec<(Lane, u64, u64)>> {
        let mut marked = Vec::new();
        for (&lane, &reserved) in &self.contents.reserved {
            let next = lanes.get(&lane).copied().unwrap_or(1);
            if next <= reserved && !self.contents.suspect.contains_key(&lane) {
                self.contents.suspect.insert(lane, next);
                marked.push((Lane(lane), next, reserved));
            }
        }
        if !marked.is_empty() {
            self.store()?;
        }
        Ok(marked)
    }

    pub fn suspect(&self, lane: Lane) -> Option<u64> {
        self.contents.suspect.get(&lane.0).copied()
    }

    pub fn clear_suspect(&mut self, lane: Lane) -> std::io::Result<()> {
        if self.contents.suspect.remove(&lane.0).is_some() { self.store() } else { Ok(()) }
    }

    pub fn clear_all_suspects(&mut self) -> std::io::Result<()> {
        if self.contents.suspect.is_empty() {
            return Ok(());
        }
        self.contents.suspect.clear();
        self.store()
    }

    /// Makes sure seqs below each lane's given next seq are reserved, writing the file if any
    /// was not.
    pub fn cover(&mut self, next_seqs: impl IntoIterator<Item = (Lane, u64)>) -> std::io::Result<()> {
        let mut changed = false;
        for (lane, next) in next_seqs {
            let last = next.saturating_sub(1);
            let r = self.contents.reserved.entry(lane.0).or_insert(0);
            if last > *r {
                *r = last.saturating_add(BLOCK);
                changed = true;
            }
        }
        if changed { self.store() } else { Ok(()) }
    }

    /// Sets each lane's reservation to exactly what it used (a clean close). Suspect marks
    /// stay until the cloud's mark is checked.
    pub fn settle(&mut self, next_seqs: impl IntoIterator<Item = (Lane, u64)>) -> std::io::Result<()> {
        self.contents.reserved = next_seqs.into_iter().map(|(lane, next)| (lane.0, next.saturating_sub(1))).collect();
        self.store()
    }

    fn store(&self) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(&self.contents).map_err(std::io::Error::other)?;
        shared::fs::write_durably(&self.path, |f| f.write_all(&bytes))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl<S: Storage> Spool<S> {
    /// A Welcome was fully checked ([`Spool::check_mark`] for each lane it names): a lane it
    /// does not name is one the cloud holds nothing of, so none of its seqs were reused, and
    /// every suspect mark left goes. Without this a suspect lane the cloud had not seen kept its
    /// mark, and a later Welcome's mark over seqs sent since moved records that were not reused.
    pub fn welcomed(&mut self) -> Result<(), SpoolError> {
        self.storage.clear_all_suspects()
    }

    /// Checks the cloud's committed mark of `lane` against this database before the mark is
    /// taken as an ack. When the cloud holds seqs this database handed out again (the lane is
    /// suspect and the mark reaches its suspect seq: the database went back in time) or seqs
    /// past everything it holds, the records that may carry reused seqs (from the suspect seq,
    /// or everything unacked) are renumbered to follow the mark, so the ack deletes none of
    /// them and they are sent as new. Returns the first seq moved and by how much.
    pub fn check_mark(&mut self, lane: Lane, mark: Seq) -> Result<Option<(Seq, u64)>, SpoolError> {
        self.flush()?;
        if self.closed_epoch {
            return Ok(None);
        }
        let state = self.lanes.get(&lane).copied().unwrap_or_default();
        let head = state.committed.saturating_sub(1);
        let suspect = self.storage.suspect_from(lane);
        let from = match suspect {
            Some(from) if mark >= from => Some(from.0),
            _ if mark.0 > head => Some(state.acked + 1),
            _ => None,
        };
        let Some(from) = from else {
            if suspect.is_some() {
                self.storage.clear_suspect(lane)?;
            }
            return Ok(None);
        };
        let by = mark.0 - from + 1;
        self.storage.renumber(lane, Seq(from), by)?;
        self.storage.clear_suspect(lane)?;
        let state = self.lanes.entry(lane).or_default();
        let next = state.next.max(1) + by;
        (state.next, state.committed) = (next, next);
        Ok(Some((Seq(from), by)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_move_in_blocks_survive_reopening_and_belong_to_one_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("spool.db");
        let mut f = SeqFile::open(&db, "e1");
        assert_eq!(f.reserved(Lane(0)), None);
        f.cover([(Lane(0), 11)]).unwrap();
        assert_eq!(f.reserved(Lane(0)), Some(10 + BLOCK));
        // Inside the block: nothing to write.
        let written = std::fs::metadata(f.path()).unwrap().modified().unwrap();
        f.cover([(Lane(0), 5_000)]).unwrap();
        assert_eq!(std::fs::metadata(f.path()).unwrap().modified().unwrap(), written);
        assert_eq!(SeqFile::open(&db, "e1").reserved(Lane(0)), Some(10 + BLOCK));
        f.settle([(Lane(0), 5_000), (Lane(3), 1)]).unwrap();
        let again = SeqFile::open(&db, "e1");
        assert_eq!((again.reserved(Lane(0)), again.reserved(Lane(3))), (Some(4_999), Some(0)));
        assert_eq!(SeqFile::open(&db, "e2").reserved(Lane(0)), None, "another epoch's file is not ours");
    }

    #[test]
    fn a_lane_below_its_reservation_is_suspect_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("spool.db");
        let mut f = SeqFile::open(&db, "e1");
        f.settle([(Lane(0), 21), (Lane(1), 4)]).unwrap();
        // Lane 0 went back to next seq 6; lane 1 is where it was; lane 2 was never used.
        let lanes = BTreeMap::from([(0, 6), (1, 5)]);
        assert_eq!(f.mark_suspects(&lanes).unwrap(), vec![(Lane(0), 6, 20)]);
        let mut again = SeqFile::open(&db, "e1");
        assert_eq!((again.suspect(Lane(0)), again.suspect(Lane(1))), (Some(6), None));
        // A second unclean open keeps the first mark.
        assert!(again.mark_suspects(&BTreeMap::from([(0, 9), (1, 5)])).unwrap().is_empty());
        again.clear_suspect(Lane(0)).unwrap();
        assert_eq!(SeqFile::open(&db, "e1").suspect(Lane(0)), None);
    }

    fn message(payload: &str) -> super::super::Message {
        super::super::Message {
            class: "telemetry".into(),
            topic: "t".into(),
            payload: bytes::Bytes::copy_from_slice(payload.as_bytes()),
            qos: 1,
            enqueued_ms: 0,
            expires_ms: None,
            properties: Default::default(),
        }
    }

    fn open(path: &Path) -> Spool<super::super::SqliteStorage> {
        Spool::new(super::super::SqliteStorage::open(path).unwrap())
    }

    fn payloads(spool: &mut Spool<super::super::SqliteStorage>, after: u64) -> Vec<(u64, String)> {
        let records = spool.read(Lane(0), Seq(after), 1000).unwrap();
        records
            .into_iter()
            .map(|r| (r.seq.0, String::from_utf8_lossy(&r.message().unwrap().payload).into_owned()))
            .collect()
    }

    /// Copies a closed spool's files (the database, its WAL if any), dropping `to`'s stale
    /// shared-memory file.
    fn copy_db(from: &Path, to: &Path) {
        for suffix in ["", "-wal"] {
            let (mut a, mut b) = (from.as_os_str().to_owned(), to.as_os_str().to_owned());
            a.push(suffix);
            b.push(suffix);
            if Path::new(&a).exists() {
                std::fs::copy(&a, &b).unwrap();
            } else {
                let _ = std::fs::remove_file(&b);
            }
        }
        let mut shm = to.as_os_str().to_owned();
        shm.push("-shm");
        let _ = std::fs::remove_file(shm);
    }

    /// The database put back to an older copy (as a power cut or a restore leaves it) hands
    /// out seqs 6.. again, which the cloud committed for other records; the cloud's mark (20)
    /// then renumbers the new records past it instead of deleting them as acked.
    #[test]
    fn records_on_reused_seqs_are_renumbered_past_the_clouds_mark() {
        use super::super::{Durability, Storage};
        let dir = tempfile::tempdir().unwrap();
        let (path, saved) = (dir.path().join("spool.db"), dir.path().join("saved.db"));
        let mut spool = open(&path);
        let epoch = spool.epoch().to_owned();
        for i in 1..=5 {
            spool.append(Lane(0), message(&format!("old-{i}")), Durability::Normal);
        }
        spool.close().unwrap();
        drop(spool);
        copy_db(&path, &saved);
        let mut spool = open(&path);
        for i in 6..=20 {
            spool.append(Lane(0), message(&format!("old-{i}")), Durability::Normal);
        }
        spool.flush().unwrap();
        spool.ack(Lane(0), Seq(20)).unwrap();
        spool.close().unwrap();
        drop(spool);

        copy_db(&saved, &path);
        let mut spool = open(&path);
        assert_eq!(spool.storage.opened().moved_aside, None);
        assert_eq!(spool.epoch(), epoch, "the same epoch: only the seqs tell");
        assert_eq!(spool.storage.suspect_from(Lane(0)), Some(Seq(6)));
        for i in 1..=30 {
            spool.append(Lane(0), message(&format!("new-{i}")), Durability::Normal);
        }
        assert_eq!(spool.check_mark(Lane(0), Seq(20)).unwrap(), Some((Seq(6), 15)));
        spool.ack(Lane(0), Seq(20)).unwrap();
        let got = payloads(&mut spool, 20);
        let want: Vec<(u64, String)> = (1..=30).map(|i| (20 + i, format!("new-{i}"))).collect();
        assert_eq!(got, want, "every new record kept, after the mark, in order");
        assert_eq!(spool.append(Lane(0), message("next"), Durability::Normal), Seq(51));
        spool.close().unwrap();
        drop(spool);
        let mut spool = open(&path);
        assert_eq!(spool.storage.suspect_from(Lane(0)), None, "checked once, and closed cleanly since");
        assert_eq!(payloads(&mut spool, 20).len(), 31);
    }

    /// Appends messages `m-<i>` for `seqs` to lane 0 and commits them.
    fn commit(spool: &mut Spool<super::super::SqliteStorage>, seqs: std::ops::RangeInclusive<u64>) {
        for i in seqs {
            spool.append(Lane(0), message(&format!("m-{i}")), super::super::Durability::Normal);
        }
        spool.flush().unwrap();
    }

    /// After a plain crash the lane is suspect too, but the cloud's mark is below the suspect
    /// seq: nothing moves and seqs stay continuous.
    #[test]
    fn after_a_crash_a_mark_below_the_suspect_seq_moves_nothing() {
        use super::super::{Durability, Storage};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.db");
        let mut spool = open(&path);
        commit(&mut spool, 1..=5);
        drop(spool);
        let mut spool = open(&path);
        assert_eq!(spool.storage.suspect_from(Lane(0)), Some(Seq(6)));
        assert_eq!(spool.check_mark(Lane(0), Seq(3)).unwrap(), None);
        assert_eq!(spool.storage.suspect_from(Lane(0)), None);
        assert_eq!(spool.append(Lane(0), message("m-6"), Durability::Normal), Seq(6));
    }

    /// A suspect lane the Welcome does not name (the cloud has nothing of it) is cleared once
    /// the Welcome is checked: after more is sent and acked and the process crashes again, the
    /// next Welcome's mark is below the new suspect seq and moves nothing. (Keeping the old mark
    /// renumbered acked-and-sent seqs here and left a hole in the sink.)
    #[test]
    fn a_welcome_that_does_not_name_a_suspect_lane_clears_it() {
        use super::super::{Durability, Storage};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.db");
        let mut spool = open(&path);
        commit(&mut spool, 1..=5);
        drop(spool);
        let mut spool = open(&path);
        assert_eq!(spool.storage.suspect_from(Lane(0)), Some(Seq(6)));
        spool.welcomed().unwrap();
        assert_eq!(spool.storage.suspect_from(Lane(0)), None);
        commit(&mut spool, 6..=10);
        spool.ack(Lane(0), Seq(10)).unwrap();
        drop(spool);
        let mut spool = open(&path);
        assert_eq!(spool.storage.suspect_from(Lane(0)), Some(Seq(11)));
        assert_eq!(spool.check_mark(Lane(0), Seq(10)).unwrap(), None);
        assert_eq!(spool.append(Lane(0), message("m-11"), Durability::Normal), Seq(11));
    }

    /// A mark above everything the database holds, with no reservation to tell (the file was
    /// lost too): every unacked record moves past it, none is deleted.
    #[test]
    fn a_mark_past_the_head_moves_every_unacked_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.db");
        let mut spool = open(&path);
        commit(&mut spool, 1..=4);
        spool.ack(Lane(0), Seq(1)).unwrap();
        assert_eq!(spool.check_mark(Lane(0), Seq(100)).unwrap(), Some((Seq(2), 99)));
        spool.ack(Lane(0), Seq(100)).unwrap();
        let got: Vec<u64> = payloads(&mut spool, 0).into_iter().map(|(s, _)| s).collect();
        assert_eq!(got, [101, 102, 103]);
    }
}
