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
    /// Per lane found suspect after a reboot (a power cut may have taken commits the sink had
    /// already stored): its reservation then, the highest seq it may have handed out before.
    #[serde(default)]
    suspect_until: BTreeMap<u8, u64>,
    /// The boot this file was last written in (Linux's `boot_id`): an open in the same boot
    /// follows at most a crash of the process, which loses no commit.
    #[serde(default)]
    boot: String,
}

/// This boot's id; empty where there is none (then every open counts as after a reboot).
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_owned()).unwrap_or_default()
}

#[derive(Debug)]
pub(super) struct SeqFile {
    path: PathBuf,
    contents: Contents,
}

impl SeqFile {
    /// The reservations of `epoch` for the database at `db`; none if the file is missing,
    /// unreadable or of another epoch (a new database).
    pub(crate) fn open(db: &Path, epoch: &str) -> Self {
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
    pub(crate) fn reserved(&self, lane: Lane) -> Option<u64> {
        self.contents.reserved.get(&lane.0).copied()
    }

    /// Marks the lanes whose next seq is at or below their reservation as suspect from that
    /// seq (keeping an earlier mark); `lanes` holds each lane's next seq in the database, and a
    /// reserved lane missing from it starts at 1. Returns the lanes newly marked.
    ///
    /// After a reboot (or with no boot id to tell) a suspect lane also keeps its reservation:
    /// a power cut may have taken commits whose records the sink stored, marked or not, so its
    /// new seqs go past everything it may have handed out (`Spool::check_mark`). In the boot
    /// the file was last written in, only a copy put back can have taken commits: the cloud's
    /// mark decides, and seqs stay continuous after a plain crash.
    pub(crate) fn mark_suspects(&mut self, lanes: &BTreeMap<u8, u64>) -> std::io::Result<Vec<(Lane, u64, u64)>> {
        let boot = boot_id();
        let rebooted = boot.is_empty() || boot != self.contents.boot;
        let mut marked = Vec::new();
        for (&lane, &reserved) in &self.contents.reserved {
            let next = lanes.get(&lane).copied().unwrap_or(1);
            if next > reserved {
                continue;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = self.contents.suspect.entry(lane) {
                e.insert(next);
                marked.push((Lane(lane), next, reserved));
            }
            // A lane still suspect from an open in an earlier boot keeps its first seq, and now
            // its reservation too.
            if rebooted {
                self.contents.suspect_until.entry(lane).or_insert(reserved);
            }
        }
        if !marked.is_empty() || rebooted {
            self.contents.boot = boot;
            match self.store() {
                Ok(()) => {}
                Err(e) if !marked.is_empty() => return Err(e),
                // Only the boot id was new: the next open counts as after a reboot, no harm.
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "spool seq reservations: cannot note this boot")
                }
            }
        }
        Ok(marked)
    }

    /// The first seq handed out since the lane was found suspect, and, if that followed a
    /// reboot, the highest it may have handed out before.
    pub(crate) fn suspect(&self, lane: Lane) -> Option<(u64, Option<u64>)> {
        let from = *self.contents.suspect.get(&lane.0)?;
        Some((from, self.contents.suspect_until.get(&lane.0).copied()))
    }

    /// Every suspect lane.
    pub(crate) fn suspects(&self) -> Vec<Lane> {
        self.contents.suspect.keys().map(|l| Lane(*l)).collect()
    }

    pub(crate) fn clear_suspect(&mut self, lane: Lane) -> std::io::Result<()> {
        self.contents.suspect_until.remove(&lane.0);
        if self.contents.suspect.remove(&lane.0).is_some() { self.store() } else { Ok(()) }
    }

    /// Makes sure seqs below each lane's given next seq are reserved, writing the file if any
    /// was not.
    pub(crate) fn cover(&mut self, next_seqs: impl IntoIterator<Item = (Lane, u64)>) -> std::io::Result<()> {
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
    pub(crate) fn settle(&mut self, next_seqs: impl IntoIterator<Item = (Lane, u64)>) -> std::io::Result<()> {
        self.contents.reserved = next_seqs.into_iter().map(|(lane, next)| (lane.0, next.saturating_sub(1))).collect();
        self.store()
    }

    fn store(&self) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(&self.contents).map_err(std::io::Error::other)?;
        shared::fs::write_durably(&self.path, |f| f.write_all(&bytes))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl<S: Storage> Spool<S> {
    /// A Welcome was fully checked ([`Spool::check_mark`] for each lane it names). A suspect
    /// lane it does not name has no mark in the cloud, which says nothing of what the sink
    /// stored without marking it: after a reboot its new seqs move past what the lane may have
    /// handed out before, as a named lane's do; every suspect mark left goes.
    pub fn welcomed(&mut self) -> Result<(), SpoolError> {
        self.flush()?;
        for lane in self.storage.suspects() {
            if let Some((from, Some(until))) = self.storage.suspect(lane) {
                self.move_past(lane, from, until)?;
            }
            self.storage.clear_suspect(lane)?;
        }
        Ok(())
    }

    /// Checks the cloud's committed mark of `lane` against this database before the mark is
    /// taken as an ack. A lane found suspect after a reboot (its database may have gone back in
    /// time with a power cut) may have handed out the seqs from its suspect one up to its
    /// reservation before, and the sink may hold records of them, marked or not (publishing and
    /// marking are two steps): the records appended since move past both the mark and that
    /// reservation, so the ack deletes none of them and the sink takes them as new. In the
    /// same boot only a copy put back can roll it back: the records move past the mark if it
    /// reaches the suspect seq. A lane whose mark is past everything it holds (the reservations
    /// went back too) moves every unacked record past the mark. A hole the move leaves is no wait for the cloud: the next batch starts where
    /// the cloud's mark ends and spans it. Returns the first seq moved and by how much.
    pub fn check_mark(&mut self, lane: Lane, mark: Seq) -> Result<Option<(Seq, u64)>, SpoolError> {
        self.flush()?;
        if self.closed_epoch {
            return Ok(None);
        }
        let state = self.lanes.get(&lane).copied().unwrap_or_default();
        let head = state.committed.saturating_sub(1);
        let suspect = self.storage.suspect(lane);
        let moved = match suspect {
            // After a reboot: past what the sink may hold, marked or not.
            Some((from, Some(until))) => self.move_past(lane, from, mark.max(until))?,
            // A copy put back in the same boot: the mark says what the cloud has.
            Some((from, None)) if mark >= from => self.move_past(lane, from, mark)?,
            Some(_) => None,
            None if mark.0 > head => self.move_past(lane, Seq(state.acked + 1), mark)?,
            None => None,
        };
        // Only once the move is on disk: a second power cut must not find the reused seqs with
        // no mark left to move them.
        if suspect.is_some() {
            self.storage.clear_suspect(lane)?;
        }
        Ok(moved)
    }

    /// Renumbers `lane`'s records from `from` on (and its next seq) to start after `past`,
    /// durably.
    fn move_past(&mut self, lane: Lane, from: Seq, past: Seq) -> Result<Option<(Seq, u64)>, SpoolError> {
        if past < from {
            return Ok(None);
        }
        let by = past.0 - from.0 + 1;
        self.storage.renumber(lane, from, by)?;
        let state = self.lanes.entry(lane).or_default();
        let next = state.next.max(from.0) + by;
        (state.next, state.committed) = (next, next);
        Ok(Some((from, by)))
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
        // A file with no boot noted counts as written before a reboot: the reservation is kept.
        assert_eq!((again.suspect(Lane(0)), again.suspect(Lane(1))), (Some((6, Some(20))), None));
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
        assert_eq!(spool.storage.suspect(Lane(0)), Some((Seq(6), None)));
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
        assert_eq!(spool.storage.suspect(Lane(0)), None, "checked once, and closed cleanly since");
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
        assert_eq!(spool.storage.suspect(Lane(0)), Some((Seq(6), None)));
        assert_eq!(spool.check_mark(Lane(0), Seq(3)).unwrap(), None);
        assert_eq!(spool.storage.suspect(Lane(0)), None);
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
        assert_eq!(spool.storage.suspect(Lane(0)), Some((Seq(6), None)));
        spool.welcomed().unwrap();
        assert_eq!(spool.storage.suspect(Lane(0)), None);
        commit(&mut spool, 6..=10);
        spool.ack(Lane(0), Seq(10)).unwrap();
        drop(spool);
        let mut spool = open(&path);
        assert_eq!(spool.storage.suspect(Lane(0)), Some((Seq(11), None)));
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

    /// What a reboot would look like to the reservations: the boot they were written in is
    /// another one.
    fn reboot(db: &Path) {
        let mut file = db.as_os_str().to_owned();
        file.push(".seqs");
        let text = std::fs::read_to_string(&file).unwrap();
        let mut contents: serde_json::Value = serde_json::from_str(&text).unwrap();
        contents["boot"] = "an-earlier-boot".into();
        std::fs::write(&file, contents.to_string()).unwrap();
    }

    /// Issue 27, finding 6: the sink stored seqs 21..=30 but marked only 20 (publishing and
    /// marking are two steps, and a session ended between them); a power cut took the spool
    /// back to seq 25. The new records must not take seqs the sink holds, marked or not: after
    /// the reboot they move past the lane's reservation (everything it may have handed out),
    /// the mark's ack deletes none of them, and the move is on disk before the suspect mark
    /// goes.
    #[test]
    fn after_a_reboot_new_records_move_past_what_the_sink_may_hold_marked_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let (path, saved) = (dir.path().join("spool.db"), dir.path().join("saved.db"));
        let mut spool = open(&path);
        commit(&mut spool, 1..=25);
        drop(spool);
        copy_db(&path, &saved);
        let mut spool = open(&path);
        commit(&mut spool, 26..=40);
        drop(spool);
        // The power cut: the database as it was at seq 25, the reservations as fsynced.
        copy_db(&saved, &path);
        reboot(&path);
        let mut spool = open(&path);
        let until = match spool.storage.suspect(Lane(0)) {
            Some((Seq(26), Some(until))) => until.0,
            other => panic!("suspect from 26 with its reservation: {other:?}"),
        };
        assert!(until >= 40, "the reservation covers what was handed out: {until}");
        commit(&mut spool, 26..=35);
        assert_eq!(spool.check_mark(Lane(0), Seq(20)).unwrap(), Some((Seq(26), until - 25)));
        spool.ack(Lane(0), Seq(20)).unwrap();
        let got = payloads(&mut spool, 20);
        let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(&seqs[..5], [21, 22, 23, 24, 25], "the records from before the cut keep their seqs");
        assert_eq!(seqs[5..], (until + 1..=until + 10).collect::<Vec<_>>(), "the new ones start past it");
        assert_eq!(got[5].1, "m-26");
        assert_eq!(spool.storage.suspect(Lane(0)), None);
        drop(spool);
        // On disk, whatever comes next.
        let conn = rusqlite::Connection::open(&path).unwrap();
        let first_new: u64 = conn.query_row("SELECT min(seq) FROM records WHERE seq > 25", [], |r| r.get(0)).unwrap();
        assert_eq!(first_new, until + 1);
    }

    /// After a reboot, a suspect lane the Welcome does not name (the cloud has no mark of it,
    /// whatever its sink stored) moves its new seqs past its reservation too.
    #[test]
    fn after_a_reboot_a_lane_the_welcome_does_not_name_moves_past_its_reservation() {
        use super::super::Durability;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.db");
        let mut spool = open(&path);
        commit(&mut spool, 1..=5);
        drop(spool);
        reboot(&path);
        let mut spool = open(&path);
        let Some((Seq(6), Some(until))) = spool.storage.suspect(Lane(0)) else { panic!("suspect") };
        spool.welcomed().unwrap();
        assert_eq!(spool.storage.suspect(Lane(0)), None);
        assert_eq!(spool.append(Lane(0), message("next"), Durability::Normal), Seq(until.0 + 1));
    }
}
