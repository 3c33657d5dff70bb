//! Salvage: every record SQLite can still read from a damaged spool database, written into a
//! new one under the same epoch, with the seq ranges it could not read listed for gap records.
//!
//! A database is damaged when SQLite says so (`SQLITE_CORRUPT`, `SQLITE_NOTADB`, an I/O error
//! reading a page) or its integrity check failed. Nothing else is damage: a lock, a read-only
//! file or a full disk leave the database as it is (`sqlite.rs`).
//!
//! Records are read in key order, a window at a time. A window that fails partway is resumed
//! after its last good row: the next readable key is found by probing ever further ahead (a
//! lookup of `id > k` descends the B-tree to `k` only, so keys under a bad page fail and keys
//! past it do not), then narrowed by bisection, so what is reported unreadable is no more than
//! the bad pages' keys (and a row whose own overflow pages are bad). A damaged file header (the
//! first 100 bytes, `SQLITE_NOTADB`) is rewritten in a copy with the values a spool uses, so the
//! pages after it are still read.
//!
//! The new database has the old epoch (when its `meta` row is readable: then the cloud's marks
//! of that epoch still apply, and records it already holds are not stored twice), each lane's
//! next seq past everything the old one may have handed out (its `lanes` row, the seq
//! reservations, the records read), and the records read, unchanged. The unreadable ranges come
//! back to the caller, which writes one gap record per lane for them, with seqs of their own
//! after everything else: the cloud counts the seqs as accounted for, so the lane does not wait
//! for them and the loss is visible at the other end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rusqlite::types::Value;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, params};

use super::schema::{RECORDS, SCHEMA, SCHEMA_VERSION, SEQ_BITS};
use super::{Lane, SpoolError};

/// What a salvage found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Salvaged {
    /// The old epoch, kept; `None` when it could not be read (a new one was made).
    pub epoch: Option<String>,
    /// Records copied.
    pub records: u64,
    /// Per lane, inclusive seq ranges that could not be read, above what the cloud had acked.
    pub unreadable: BTreeMap<Lane, Vec<(u64, u64)>>,
    /// The file header was rewritten to read the pages after it.
    pub header_repaired: bool,
}

impl Salvaged {
    /// Seqs in the unreadable ranges (an upper bound on the records lost: some seqs in them may
    /// never have been used).
    pub(crate) fn unreadable_count(&self) -> u64 {
        self.unreadable.values().flatten().map(|(a, b)| b - a + 1).sum()
    }
}

/// Whether an error says the database (or a page of it) is damaged, as opposed to locked,
/// read-only, on a full disk or not there.
pub(crate) fn is_damage(e: &rusqlite::Error) -> bool {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => true,
            // SQLITE_IOERR_READ, SQLITE_IOERR_SHORT_READ: a page that cannot be read back.
            ErrorCode::SystemIoFailure => matches!(f.extended_code, 266 | 522),
            _ => false,
        },
        _ => false,
    }
}

/// Reads what can be read of the spool database at `src` and writes it into a new database at
/// `dst` (which must not exist). `known` holds, per lane, the next seq the running spool would
/// hand out, when there is one (a rebuild at run time): it is exact, and wins over the old
/// `lanes` row. Seqs are never skipped: the cloud's mark only moves over contiguous seqs, so
/// each lane's next seq is the old one (or one past the last record read, when neither says):
/// a seq handed out again is caught by the reservations (`seqs.rs`) at the cloud's next mark.
pub(crate) fn salvage(src: &Path, dst: &Path, known: &BTreeMap<u8, u64>) -> Result<Salvaged, SpoolError> {
    let sqlite = |path: &Path| {
        let path = path.to_owned();
        move |source| SpoolError::Sqlite { path: path.clone(), source }
    };
    // Nothing readable at all (not a database, nor one under a repaired header): a new epoch
    // with no records, the file kept aside for a person.
    let opened = open_damaged(src).map_err(|e| tracing::error!(error = %e, "salvage: nothing can be read"));
    let (conn, repaired, _copy) = match opened {
        Ok(o) => o,
        Err(()) => (Connection::open_in_memory().map_err(sqlite(src))?, false, None),
    };
    let epoch: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'epoch'", [], |r| r.get(0))
        .optional()
        .ok()
        .flatten()
        .filter(|e: &String| !e.is_empty() && e.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    let lanes: BTreeMap<u8, (u64, u64)> = conn
        .prepare("SELECT lane, next_seq, acked FROM lanes")
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get::<_, u8>(0)?, (r.get::<_, u64>(1)?, r.get::<_, u64>(2)?))))?.collect()
        })
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "salvage: the lanes table is unreadable; next seqs come from the records and reservations");
            BTreeMap::new()
        });

    let mut out = Connection::open(dst).map_err(sqlite(dst))?;
    out.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
        .map_err(sqlite(dst))?;
    let tx = out.transaction().map_err(sqlite(dst))?;
    tx.execute_batch(SCHEMA).map_err(sqlite(dst))?;
    tx.execute_batch(RECORDS).map_err(sqlite(dst))?;
    let kept_epoch = epoch.clone().unwrap_or_else(new_epoch);
    for (k, v) in [
        ("schema_version", SCHEMA_VERSION.to_string()),
        ("epoch", kept_epoch),
        ("created_ms", shared::units::now_ms().to_string()),
        ("salvaged_from", src.display().to_string()),
    ] {
        tx.execute("INSERT INTO meta VALUES (?1, ?2)", params![k, v]).map_err(sqlite(dst))?;
    }

    // A spool from before the schema column has none to copy.
    let columns = if super::schema::has_schema_column(&conn) { format!("{COLUMNS}, schema") } else { COLUMNS.into() };
    let mut scan = Scan { src: &conn, columns, copied: 0, last_seq: BTreeMap::new(), bad: Vec::new() };
    scan.run(&tx).map_err(sqlite(dst))?;

    // Per lane: the highest seq the old database may have handed out, and its next one anew.
    let mut all: Vec<u8> = lanes.keys().chain(known.keys()).chain(scan.last_seq.keys()).copied().collect();
    all.extend(scan.bad.iter().flat_map(|(a, b)| [lane_of(*a), lane_of(*b)]).flatten());
    all.sort_unstable();
    all.dedup();
    let mut unreadable: BTreeMap<Lane, Vec<(u64, u64)>> = BTreeMap::new();
    for lane in all.into_iter().filter(|l| *l <= super::schema::MAX_LANE) {
        let (next, acked) = lanes.get(&lane).copied().unwrap_or((0, 0));
        let seen = scan.last_seq.get(&lane).copied().unwrap_or(0);
        // The running spool knows exactly, then the lanes row; else the records read.
        let next = known.get(&lane).copied().filter(|n| *n > 0).unwrap_or(next);
        let last = if next > 0 { next - 1 } else { seen }.max(seen);
        let ranges: Vec<(u64, u64)> =
            scan.bad.iter().filter_map(|&(from, to)| clamp(lane, from, to, acked + 1, last)).collect();
        let next_seq = last + 1;
        tx.execute("INSERT INTO lanes (lane, next_seq, acked) VALUES (?1, ?2, ?3)", params![lane, next_seq, acked])
            .map_err(sqlite(dst))?;
        if !ranges.is_empty() {
            unreadable.insert(Lane(lane), ranges);
        }
    }
    tx.commit().map_err(sqlite(dst))?;
    out.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).map_err(sqlite(dst))?;
    drop(out);
    let salvaged = Salvaged { epoch, records: scan.copied, unreadable, header_repaired: repaired };
    tracing::warn!(
        from = %src.display(),
        epoch = salvaged.epoch.as_deref().unwrap_or("unreadable: a new one"),
        records = salvaged.records,
        unreadable = salvaged.unreadable_count(),
        header_repaired = repaired,
        "spool salvaged"
    );
    Ok(salvaged)
}

/// `<spool>` with `suffix` appended.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// Salvages the damaged database at `path` into `<path>.salvaged` (written whole and synced
/// before it takes that name), leaving `path` as it is. See [`salvage`] for `known`.
pub(crate) fn prepare(path: &Path, known: &BTreeMap<u8, u64>) -> Result<Salvaged, SpoolError> {
    let (tmp, done) = (beside(path, ".salvaged.tmp"), beside(path, ".salvaged"));
    for stale in [&tmp, &done] {
        remove_with_wal(stale).map_err(|source| SpoolError::Io { path: stale.clone(), source })?;
    }
    let salvaged = salvage(path, &tmp, known)?;
    let io = |source| SpoolError::Io { path: tmp.clone(), source };
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io)?;
    std::fs::rename(&tmp, &done).map_err(io)?;
    Ok(salvaged)
}

/// Moves the damaged database at `path` aside (`<path>.damaged-<unix ms>`, with its WAL,
/// shared-memory and check-failed files) and puts `<path>.salvaged` in its place. Returns where
/// the damaged one went.
pub(crate) fn install(path: &Path) -> Result<PathBuf, SpoolError> {
    let aside = move_aside(path)?;
    let done = beside(path, ".salvaged");
    let io = |source| SpoolError::Io { path: done.clone(), source };
    std::fs::rename(&done, path).map_err(io)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(aside)
}

/// Finishes a salvage a crash interrupted: a `<path>.salvaged` with no database at `path` was
/// complete and the damaged one already aside, so it goes in; beside a database still at
/// `path` it may be from before the damaged one moved, so it goes and the salvage is done again.
pub(crate) fn finish_interrupted(path: &Path) -> Result<(), SpoolError> {
    let done = beside(path, ".salvaged");
    let io = |source| SpoolError::Io { path: done.clone(), source };
    match (done.exists(), path.exists()) {
        (true, false) => {
            tracing::warn!(path = %path.display(), "a salvaged spool was not in place yet: putting it there");
            std::fs::rename(&done, path).map_err(io)
        }
        (true, true) => remove_with_wal(&done).map_err(io),
        _ => Ok(()),
    }
}

fn remove_with_wal(path: &Path) -> std::io::Result<()> {
    for extra in ["", "-wal", "-shm"] {
        match std::fs::remove_file(beside(path, extra)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Renames the database and its WAL, shared-memory and check-failed files to
/// `<name>.damaged-<ms>`: kept for a person to look at, never deleted (`.corrupt-<ms>` is what
/// earlier versions named a spool they moved aside without salvaging it: see `recovery.rs`).
pub(super) fn move_aside(path: &Path) -> Result<PathBuf, SpoolError> {
    let target = beside(path, &format!(".damaged-{}", shared::units::now_ms()));
    for extra in ["", "-wal", "-shm", ".check-failed"] {
        let (from, to) = (beside(path, extra), beside(&target, extra));
        match std::fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(SpoolError::Io { path: from, source }),
        }
    }
    Ok(target)
}

/// The seqs of key range `from..=to` that are in `lane`, within `low..=high`.
fn clamp(lane: u8, from: i64, to: i64, low: u64, high: u64) -> Option<(u64, u64)> {
    let (start, end) = (i64::from(lane) << SEQ_BITS, (i64::from(lane) + 1) << SEQ_BITS);
    let (from, to) = (from.max(start), to.min(end - 1));
    if from > to {
        return None;
    }
    let mask = (1u64 << SEQ_BITS) - 1;
    let (a, b) = ((from as u64 & mask).max(low), (to as u64 & mask).min(high));
    (a <= b).then_some((a, b))
}

fn lane_of(key: i64) -> Option<u8> {
    u8::try_from(key >> SEQ_BITS).ok()
}

fn new_epoch() -> String {
    use rand::RngCore;
    let mut epoch = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut epoch);
    epoch.iter().map(|b| format!("{b:02x}")).collect()
}

/// The columns copied, in order.
const COLUMNS: &str = "id, kind, durability, class, topic, payload, qos, enqueued_ms, expires_ms, user_properties, \
                       correlation_data, content_type";

/// Rows read at a time.
const WINDOW: i64 = 256;

struct Scan<'a> {
    src: &'a Connection,
    /// [`COLUMNS`], and the schema column if the source has it.
    columns: String,
    copied: u64,
    /// Per lane, the highest seq read.
    last_seq: BTreeMap<u8, u64>,
    /// Key ranges that could not be read.
    bad: Vec<(i64, i64)>,
}

impl Scan<'_> {
    fn width(&self) -> usize {
        self.columns.split(',').count()
    }

    fn run(&mut self, out: &Connection) -> rusqlite::Result<()> {
        let marks = (1..=self.width()).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ");
        let mut insert = out.prepare(&format!("INSERT INTO records ({}) VALUES ({marks})", self.columns))?;
        // Keys start at 0 (lane 0, seq 0); what is below is no record of ours.
        let mut pos: i64 = -1;
        loop {
            let (rows, failed) = self.window(pos);
            let full = rows.len() as i64 == WINDOW;
            for row in rows {
                pos = self.keep(&mut insert, row)?;
            }
            if !failed {
                if full {
                    continue;
                }
                return Ok(());
            }
            // Past the last good row: the next key that can be read, and the bad range before it.
            match self.next_key(pos) {
                None => return Ok(()),
                Some(next) => {
                    // The row itself may be what is bad (its overflow pages): alone, then.
                    match self.row(next) {
                        Ok(Some(row)) => pos = self.keep(&mut insert, row)?,
                        Ok(None) => pos = next,
                        Err(_) => {
                            self.bad.push((next, next));
                            pos = next;
                        }
                    }
                }
            }
        }
    }

    /// Up to [`WINDOW`] rows after `pos`, and whether reading stopped at an error.
    fn window(&self, pos: i64) -> (Vec<Vec<Value>>, bool) {
        let mut rows = Vec::new();
        let stmt = self
            .src
            .prepare_cached(&format!("SELECT {} FROM records WHERE id > ?1 ORDER BY id LIMIT ?2", self.columns));
        let Ok(mut stmt) = stmt else { return (rows, true) };
        let Ok(mut found) = stmt.query(params![pos, WINDOW]) else { return (rows, true) };
        loop {
            match found.next() {
                Ok(Some(r)) => {
                    match (0..self.width()).map(|i| r.get::<_, Value>(i)).collect::<rusqlite::Result<Vec<_>>>() {
                        Ok(row) => rows.push(row),
                        Err(_) => return (rows, true),
                    }
                }
                Ok(None) => return (rows, false),
                Err(_) => return (rows, true),
            }
        }
    }

    fn row(&self, key: i64) -> rusqlite::Result<Option<Vec<Value>>> {
        self.src
            .query_row(&format!("SELECT {} FROM records WHERE id = ?1", self.columns), [key], |r| {
                (0..self.width()).map(|i| r.get::<_, Value>(i)).collect()
            })
            .optional()
    }

    fn keep(&mut self, insert: &mut rusqlite::Statement<'_>, row: Vec<Value>) -> rusqlite::Result<i64> {
        let Value::Integer(key) = row[0] else { return Ok(i64::MAX) };
        if let Some(lane) = lane_of(key) {
            let seq = key as u64 & ((1 << SEQ_BITS) - 1);
            let last = self.last_seq.entry(lane).or_default();
            *last = (*last).max(seq);
        }
        insert.execute(rusqlite::params_from_iter(row))?;
        self.copied += 1;
        Ok(key)
    }

    /// The smallest key above `pos` that can be reached, noting the unreachable range before it.
    fn next_key(&mut self, pos: i64) -> Option<i64> {
        let probe = |k: i64| -> Result<Option<i64>, ()> {
            self.src
                .query_row("SELECT id FROM records WHERE id > ?1 ORDER BY id LIMIT 1", [k], |r| r.get(0))
                .optional()
                .map_err(|_| ())
        };
        if let Ok(found) = probe(pos) {
            return found;
        }
        // Further ahead until a probe works...
        let mut bad = pos;
        let mut step: i64 = 1;
        let (mut ok, mut found) = loop {
            let k = pos.saturating_add(step);
            match probe(k) {
                Ok(found) => break (k, found),
                // As far as keys go: nothing after `pos` can be reached.
                Err(()) if k == i64::MAX || step == i64::MAX => {
                    self.bad.push((pos + 1, i64::MAX));
                    return None;
                }
                Err(()) => bad = k,
            }
            step = step.saturating_mul(2);
        };
        // ...then back to the first that does.
        while ok - bad > 1 {
            let mid = bad + (ok - bad) / 2;
            match probe(mid) {
                Ok(f) => (ok, found) = (mid, f),
                Err(()) => bad = mid,
            }
        }
        // Keys in `pos+1..=ok` could not be looked at; above `ok` the next is `found`.
        self.bad.push((pos + 1, ok));
        found
    }
}

/// Opens a damaged database for reading: as it is, or, when SQLite does not take it for a
/// database at all (its header is gone), a copy with a spool's header written over the first
/// 100 bytes. The copy, if any, is deleted when the returned guard goes.
fn open_damaged(src: &Path) -> Result<(Connection, bool, Option<TempCopy>), SpoolError> {
    let err = |source| SpoolError::Sqlite { path: src.to_owned(), source };
    let open = |path: &Path| -> rusqlite::Result<Connection> {
        let conn =
            Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .or_else(|_| Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY))?;
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0))?;
        Ok(conn)
    };
    match open(src) {
        Ok(conn) => return Ok((conn, false, None)),
        Err(e) if !matches!(&e, rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::NotADatabase) => {
            return Err(err(e));
        }
        Err(_) => {}
    }
    let copy = TempCopy::of(src).map_err(|source| SpoolError::Io { path: src.to_owned(), source })?;
    let conn = open(&copy.0).map_err(err)?;
    Ok((conn, true, Some(copy)))
}

/// A copy of a damaged database with a repaired header, and its WAL.
struct TempCopy(PathBuf);

impl TempCopy {
    fn of(src: &Path) -> std::io::Result<TempCopy> {
        let mut dst = src.as_os_str().to_owned();
        dst.push(".header-repaired");
        let dst = PathBuf::from(dst);
        std::fs::copy(src, &dst)?;
        let mut wal = src.as_os_str().to_owned();
        wal.push("-wal");
        let mut dst_wal = dst.as_os_str().to_owned();
        dst_wal.push("-wal");
        match std::fs::copy(PathBuf::from(&wal), PathBuf::from(&dst_wal)) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let len = std::fs::metadata(&dst)?.len();
        let page: u32 = [4096u32, 1024, 2048, 8192, 16384, 32768, 65536]
            .into_iter()
            .find(|p| len % u64::from(*p) == 0)
            .unwrap_or(4096);
        write_header(&dst, page, len / u64::from(page))?;
        Ok(TempCopy(dst))
    }
}

impl Drop for TempCopy {
    fn drop(&mut self) {
        for extra in ["", "-wal", "-shm"] {
            let mut p = self.0.as_os_str().to_owned();
            p.push(extra);
            let _ = std::fs::remove_file(PathBuf::from(p));
        }
    }
}

/// Writes the 100-byte SQLite header of a database of `pages` pages of `page` bytes, UTF-8, in
/// WAL mode, as SQLite's file format (§1.3 of fileformat2) lays it out. The free list is left
/// empty (its pages are unused) and auto-vacuum off (the pointer-map pages are not read).
fn write_header(path: &Path, page: u32, pages: u64) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    let mut h = [0u8; 100];
    h[..16].copy_from_slice(b"SQLite format 3\0");
    let size = if page == 65536 { 1u16 } else { page as u16 };
    h[16..18].copy_from_slice(&size.to_be_bytes());
    (h[18], h[19], h[20], h[21], h[22], h[23]) = (2, 2, 0, 64, 32, 32);
    h[24..28].copy_from_slice(&1u32.to_be_bytes());
    h[28..32].copy_from_slice(&(pages as u32).to_be_bytes());
    // Schema cookie 1, schema format 4, text encoding UTF-8.
    h[40..44].copy_from_slice(&1u32.to_be_bytes());
    h[44..48].copy_from_slice(&4u32.to_be_bytes());
    h[56..60].copy_from_slice(&1u32.to_be_bytes());
    h[92..96].copy_from_slice(&1u32.to_be_bytes());
    h[96..100].copy_from_slice(&3_045_000u32.to_be_bytes());
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.seek(SeekFrom::Start(0))?;
    f.write_all(&h)
}

#[cfg(test)]
mod tests;
