//! The SQLite storage of the spool. See the module essay in `spool/mod.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use rand::RngCore;
use rusqlite::{Connection, OptionalExtension, params};

use shared::units::now_ms;

use super::integrity::{CheckState, IntegrityCheck};
use super::schema::{
    EXPIRY_INDEX, KIND_GAP, KIND_MESSAGE, MAX_LANE, MESSAGE_SIZE, RECORD_OVERHEAD, RECORDS, SCHEMA, SCHEMA_VERSION,
    SEQ_BITS, USAGE,
};
use super::seqs::SeqFile;
use super::{
    Body, ClassUsage, Durability, Gap, Lane, Lost, Message, Opened, Properties, Record, Seq, SpoolError, Storage,
};

/// Per lane: the lane, its next seq and its highest acked seq.
fn lane_rows(conn: &Connection) -> rusqlite::Result<Vec<(u8, u64, u64)>> {
    let mut stmt = conn.prepare_cached("SELECT lane, next_seq, acked FROM lanes ORDER BY lane")?;
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect()
}

/// Message records per class, and their bytes, with keys from `start` to `end`.
fn usage_between(conn: &Connection, start: i64, end: i64) -> rusqlite::Result<Vec<ClassUsage>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT class, count(*), sum({MESSAGE_SIZE}) FROM records \
         WHERE id >= ?1 AND id <= ?2 AND kind = 0 GROUP BY class ORDER BY class"
    ))?;
    stmt.query_map(params![start, end], |r| Ok(ClassUsage { class: r.get(0)?, records: r.get(1)?, bytes: r.get(2)? }))?
        .collect()
}

/// The kept class usage (`class_usage`), if it matches `lanes`: the lanes it was last written
/// with. A run of a version that does not keep it changes the lanes without it.
fn kept_usage(conn: &Connection, lanes: &str) -> rusqlite::Result<Option<Vec<ClassUsage>>> {
    let with: Option<String> =
        conn.query_row("SELECT value FROM meta WHERE key = 'usage_lanes'", [], |r| r.get(0)).optional()?;
    if with.as_deref() != Some(lanes) {
        return Ok(None);
    }
    let mut stmt = conn.prepare_cached(
        "SELECT class, records, bytes FROM class_usage WHERE records > 0 OR bytes > 0 ORDER BY class",
    )?;
    let rows = stmt.query_map([], |r| Ok(ClassUsage { class: r.get(0)?, records: r.get(1)?, bytes: r.get(2)? }))?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map(Some)
}

/// Adds `delta` (records, bytes per class) to the kept usage and notes the lanes it matches, in
/// the transaction that changed the records.
fn keep_usage(tx: &Connection, delta: &BTreeMap<&str, (i64, i64)>, lanes: &str) -> rusqlite::Result<()> {
    let mut add = tx.prepare_cached(
        "INSERT INTO class_usage (class, records, bytes) VALUES (?1, ?2, ?3) \
         ON CONFLICT (class) DO UPDATE SET records = records + excluded.records, bytes = bytes + excluded.bytes",
    )?;
    for (class, (records, bytes)) in delta {
        add.execute(params![class, records, bytes])?;
    }
    tx.prepare_cached("INSERT OR REPLACE INTO meta VALUES ('usage_lanes', ?1)")?.execute([lanes])?;
    Ok(())
}

/// The lanes as `meta.usage_lanes` holds them.
fn lanes_text(lanes: &BTreeMap<u8, (u64, u64)>) -> String {
    let rows: Vec<(u8, u64, u64)> = lanes.iter().map(|(l, (n, a))| (*l, *n, *a)).collect();
    serde_json::to_string(&rows).unwrap_or_default()
}

/// The class usage a clean close leaves in `meta`, with the lanes as they were then.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct UsageNote {
    lanes: Vec<(u8, u64, u64)>,
    usage: Vec<ClassUsage>,
}

/// The messages whose TTL passed by `?1`, served by [`EXPIRY_INDEX`].
pub(super) fn expired_query() -> String {
    format!(
        "SELECT id >> {SEQ_BITS}, id, class, {MESSAGE_SIZE} FROM records \
         WHERE kind = 0 AND expires_ms IS NOT NULL AND expires_ms <= ?1 ORDER BY id"
    )
}

/// The record key of `seq` in `lane`.
fn key(lane: Lane, seq: u64) -> Result<i64, SpoolError> {
    if lane.0 > MAX_LANE || seq >> SEQ_BITS != 0 {
        return Err(SpoolError::KeyRange { lane: lane.0, seq });
    }
    Ok((i64::from(lane.0) << SEQ_BITS) | seq as i64)
}

/// The keys of `lane` are `lane_start(lane) .. lane_start(lane + 1)`.
fn lane_start(lane: Lane) -> i64 {
    i64::from(lane.0.min(MAX_LANE + 1)) << SEQ_BITS
}

fn lane_end(lane: Lane) -> i64 {
    lane_start(Lane(lane.0.saturating_add(1)))
}

fn seq_of(id: i64) -> u64 {
    (id as u64) & ((1 << SEQ_BITS) - 1)
}

#[derive(Debug)]
pub struct SqliteStorage {
    conn: Connection,
    path: PathBuf,
    opened: Opened,
    synchronous_full: bool,
    seqs: SeqFile,
    /// The `lanes` table as this connection wrote it: what `meta.usage_lanes` says.
    lanes: BTreeMap<u8, (u64, u64)>,
    /// The integrity check after an unclean stop, running beside the spool.
    check: Option<IntegrityCheck>,
    /// What reads saw, so acks count what they delete without reading it again.
    ledger: super::ledger::Ledger,
    /// `None` only while a rebuild swaps the file.
    _checkpointer: Option<super::checkpoint::Checkpointer>,
}

impl SqliteStorage {
    /// Opens or creates the spool database at `path`. A damaged one (SQLite cannot read it, or
    /// its integrity check failed) is salvaged under its own epoch and the damaged file moved
    /// aside (`salvage.rs`); any other failure (a lock another process holds past
    /// [`LOCK_WAIT`], a read-only file, a full disk, an I/O error) is returned naming it, the
    /// database left as it is: moving it aside would orphan acknowledged records.
    pub fn open(path: &Path) -> Result<Self, SpoolError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| SpoolError::Io { path: dir.to_owned(), source })?;
        }
        super::salvage::finish_interrupted(path)?;
        match Self::open_checked(path) {
            Ok(storage) => Ok(storage),
            Err(e) if e.is_damage() => {
                tracing::error!(error = %e, path = %path.display(), "spool database damaged; salvaging what it holds");
                let salvaged = super::salvage::prepare(path, &BTreeMap::new())?;
                let aside = super::salvage::install(path)?;
                let mut storage = Self::open_checked(path)?;
                storage.opened.moved_aside = Some(aside);
                storage.opened.salvaged = Some(salvaged);
                Ok(storage)
            }
            Err(e) => Err(e),
        }
    }

    fn open_checked(path: &Path) -> Result<Self, SpoolError> {
        let err = |source| SpoolError::Sqlite { path: path.to_owned(), source };
        // A check of an earlier run failed (`integrity.rs`): the database goes aside now.
        if let Ok(report) = std::fs::read_to_string(super::integrity::sidecar(path)) {
            return Err(SpoolError::Sqlite {
                path: path.to_owned(),
                source: rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
                    Some(format!("the integrity check of an earlier run failed: {}", report.trim())),
                ),
            });
        }
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(LOCK_WAIT).map_err(err)?;
        // The check reads every page (1.5 s for a 1.3 GB spool in the page cache, 16 s cold), so
        // it runs only when the last run did not close the spool cleanly (after a crash, a power
        // cut, or on a database with no such note), and then beside the spool, not before it.
        let closed_cleanly = conn
            .query_row("SELECT value FROM meta WHERE key = 'closed_cleanly'", [], |r| r.get::<_, String>(0))
            .is_ok_and(|v| v == "1");
        // auto_vacuum must be chosen before the first table exists; harmless afterwards.
        // SQLite checkpoints the WAL every 1000 pages but never shrinks the file; the size limit
        // truncates it back after each checkpoint, so the WAL stays near 4 MiB at most.
        conn.execute_batch(
            "PRAGMA auto_vacuum = INCREMENTAL; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
             PRAGMA journal_size_limit = 4194304; PRAGMA wal_autocheckpoint = 0;",
        )
        .map_err(err)?;
        let has_meta: bool = conn
            .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'", [], |r| {
                r.get::<_, i64>(0)
            })
            .map_err(err)?
            > 0;
        if !has_meta {
            let mut epoch = [0u8; 16];
            rand::thread_rng().fill_bytes(&mut epoch);
            let epoch: String = epoch.iter().map(|b| format!("{b:02x}")).collect();
            let tx = conn.unchecked_transaction().map_err(err)?;
            tx.execute_batch(SCHEMA).map_err(err)?;
            tx.execute_batch(RECORDS).map_err(err)?;
            tx.execute("INSERT INTO meta VALUES ('schema_version', ?1)", [SCHEMA_VERSION.to_string()]).map_err(err)?;
            tx.execute("INSERT INTO meta VALUES ('epoch', ?1)", [&epoch]).map_err(err)?;
            tx.execute("INSERT INTO meta VALUES ('created_ms', ?1)", [now_ms().to_string()]).map_err(err)?;
            tx.commit().map_err(err)?;
        }
        let version: i64 = conn
            .query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get::<_, String>(0))
            .map_err(err)?
            .parse()
            .unwrap_or(0);
        if version > SCHEMA_VERSION {
            return Err(SpoolError::NewerSchema { path: path.to_owned(), found: version, known: SCHEMA_VERSION });
        }
        if version == 1 {
            super::migrate::v1_to_v2(&conn).map_err(|source| SpoolError::Migration {
                path: path.to_owned(),
                from: 1,
                to: SCHEMA_VERSION,
                source,
            })?;
        }
        // Expiry runs every second; without this it read the whole backlog each time (a full
        // table scan, a tenth of the writer's time while draining 200,000 records). Only
        // records with a TTL are in it, so the others cost nothing more to append or ack. A
        // spool made before the index gets it here, in one pass; older binaries ignore it.
        conn.execute_batch(EXPIRY_INDEX).map_err(err)?;
        conn.execute_batch(USAGE).map_err(err)?;
        conn.execute_batch(super::schema::RECEIPTS).map_err(err)?;
        if !super::schema::has_schema_column(&conn) {
            conn.execute_batch(super::schema::SCHEMA_COLUMN).map_err(err)?;
        }
        // From here on a crash must lead to a check at the next open.
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('closed_cleanly', '0')", []).map_err(err)?;
        let epoch: String =
            conn.query_row("SELECT value FROM meta WHERE key = 'epoch'", [], |r| r.get(0)).map_err(err)?;
        let lane_rows = lane_rows(&conn).map_err(err)?;
        let lanes = lane_rows.iter().map(|&(lane, next, acked)| (Lane(lane), Seq(next), Seq(acked))).collect();
        let mirror: BTreeMap<u8, (u64, u64)> = lane_rows.iter().map(|&(l, n, a)| (l, (n, a))).collect();
        let lanes_now = lanes_text(&mirror);
        // The usage kept with every transaction, crash or not; else the note of a clean close,
        // which holds only if no one changed the lanes since (an older version run in between
        // closes cleanly too, without a note); else every record is counted (4 to 5 s for 1 GB
        // here), once: from then on it is kept.
        let kept = kept_usage(&conn, &lanes_now).map_err(err)?;
        let noted = || {
            closed_cleanly
                .then(|| {
                    conn.query_row("SELECT value FROM meta WHERE key = 'usage'", [], |r| r.get::<_, String>(0)).ok()
                })
                .flatten()
                .and_then(|v| serde_json::from_str::<UsageNote>(&v).ok())
                .filter(|note| note.lanes == lane_rows)
                .map(|note| note.usage)
        };
        let (usage, counted) = match kept {
            Some(usage) => (usage, false),
            None => {
                let (usage, counted) = match noted() {
                    Some(usage) => (usage, false),
                    None => (usage_between(&conn, 0, i64::MAX).map_err(err)?, true),
                };
                let tx = conn.unchecked_transaction().map_err(err)?;
                tx.execute("DELETE FROM class_usage", []).map_err(err)?;
                let delta = usage.iter().map(|u| (u.class.as_str(), (u.records as i64, u.bytes as i64))).collect();
                keep_usage(&tx, &delta, &lanes_now).map_err(err)?;
                tx.commit().map_err(err)?;
                (usage, counted)
            }
        };
        let mut seqs = SeqFile::open(path, &epoch);
        let seqs_file = seqs.path().to_owned();
        let io = |source| SpoolError::Io { path: seqs_file, source };
        let next: BTreeMap<u8, u64> = lane_rows.iter().map(|&(lane, next, _)| (lane, next)).collect();
        for (lane, from, reserved) in seqs.mark_suspects(&next).map_err(io)? {
            tracing::warn!(
                lane = lane.0,
                next = from,
                reserved,
                "spool lane is below seqs it may have handed out before (power cut, crash or restored copy): \
                 its new seqs stay unverified until the cloud's mark is checked"
            );
        }
        let receipts = receipt_rows(&conn).map_err(err)?;
        let opened = Opened {
            epoch,
            lanes,
            usage,
            moved_aside: None,
            salvaged: None,
            checked: !closed_cleanly,
            counted,
            receipts,
        };
        let checkpointer = super::checkpoint::Checkpointer::start(path)
            .map_err(|source| SpoolError::Io { path: path.to_owned(), source })?;
        let check = if closed_cleanly {
            None
        } else {
            Some(IntegrityCheck::start(path).map_err(|source| SpoolError::Io { path: path.to_owned(), source })?)
        };
        Ok(Self {
            conn,
            path: path.to_owned(),
            opened,
            synchronous_full: false,
            seqs,
            lanes: mirror,
            check,
            ledger: Default::default(),
            _checkpointer: Some(checkpointer),
        })
    }

    /// The integrity check of this run, if the last one did not stop cleanly.
    pub fn integrity(&self) -> Option<std::sync::Arc<std::sync::Mutex<CheckState>>> {
        self.check.as_ref().map(IntegrityCheck::state)
    }

    /// Deletes `lane`'s rows with keys `start..=end` and records the ack through `up_to`; what
    /// they held per class is `known` (the reads' ledger) or counted from the rows first.
    fn ack_rows(
        &mut self,
        lane: Lane,
        up_to: Seq,
        (start, end): (i64, i64),
        known: Option<Vec<ClassUsage>>,
    ) -> Result<Vec<ClassUsage>, SpoolError> {
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        // Counted by a pass over the same rows when the ledger does not know them: cheaper than
        // a `DELETE ... RETURNING`, which SQLite materialises row by row before handing out the
        // first (the returning delete was 0.65-0.84 s of CPU per 200,000 acked records against
        // 0.43 s for this pair), and the pass leaves the pages cached for the delete.
        let deleted = match known {
            Some(d) => d,
            None => usage_between(&tx, start, end).map_err(|e| self.err(e))?,
        };
        tx.prepare_cached("DELETE FROM records WHERE id >= ?1 AND id <= ?2")
            .and_then(|mut stmt| stmt.execute(params![start, end]))
            .map_err(|e| self.err(e))?;
        tx.execute("UPDATE lanes SET acked = max(acked, ?2) WHERE lane = ?1", params![lane.0, up_to.0])
            .map_err(|e| self.err(e))?;
        let mut lanes = self.lanes.clone();
        if let Some(row) = lanes.get_mut(&lane.0) {
            row.1 = row.1.max(up_to.0);
        }
        let delta = deleted.iter().map(|u| (u.class.as_str(), (-(u.records as i64), -(u.bytes as i64)))).collect();
        keep_usage(&tx, &delta, &lanes_text(&lanes)).map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))?;
        self.lanes = lanes;
        Ok(deleted)
    }

    fn err(&self, source: rusqlite::Error) -> SpoolError {
        SpoolError::Sqlite { path: self.path.clone(), source }
    }
}

/// The QoS 2 receipts held, with their records.
fn receipt_rows(conn: &Connection) -> rusqlite::Result<Vec<(u64, Lane, Seq)>> {
    let mut stmt = conn.prepare("SELECT key, lane, seq FROM receipts")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, Lane(r.get(1)?), Seq(r.get(2)?))))?;
    rows.collect()
}

/// How long an open waits for a lock another process holds on the database (someone's
/// `sqlite3` in a write transaction) before it gives up, naming it.
pub(crate) const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Storage for SqliteStorage {
    fn opened(&self) -> &Opened {
        &self.opened
    }

    fn forget_receipts(&mut self, keys: &[u64], keep: bool) -> Result<(), SpoolError> {
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        if keep {
            tx.execute_batch("CREATE TEMP TABLE IF NOT EXISTS keep (key INTEGER PRIMARY KEY); DELETE FROM keep;")
                .map_err(|e| self.err(e))?;
            for key in keys {
                tx.execute("INSERT OR IGNORE INTO keep (key) VALUES (?1)", [*key as i64]).map_err(|e| self.err(e))?;
            }
            tx.execute("DELETE FROM receipts WHERE key NOT IN (SELECT key FROM keep)", []).map_err(|e| self.err(e))?;
        } else {
            let mut delete = tx.prepare_cached("DELETE FROM receipts WHERE key = ?1").map_err(|e| self.err(e))?;
            for key in keys {
                delete.execute([*key as i64]).map_err(|e| self.err(e))?;
            }
        }
        tx.commit().map_err(|e| self.err(e))
    }

    fn commit(
        &mut self,
        records: &[Record],
        next_seqs: &[(Lane, Seq)],
        delete: &[Lost],
        durability: Durability,
    ) -> Result<(), SpoolError> {
        // The reservation first: a seq must never be on disk in the database past what the
        // file says may have been handed out.
        self.seqs
            .cover(next_seqs.iter().map(|(lane, next)| (*lane, next.0)))
            .map_err(|source| SpoolError::Io { path: self.seqs.path().to_owned(), source })?;
        let full = durability == Durability::Full;
        if full != self.synchronous_full {
            let mode = if full { "FULL" } else { "NORMAL" };
            self.conn.pragma_update(None, "synchronous", mode).map_err(|e| self.err(e))?;
            self.synchronous_full = full;
        }
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO records (id, kind, class, topic, payload, qos, enqueued_ms, expires_ms, \
                     user_properties, correlation_data, content_type, durability, schema) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                )
                .map_err(|e| self.err(e))?;
            for r in records {
                let id = key(r.lane, r.seq.0)?;
                let result = match &r.body {
                    Body::Message(m) => {
                        let user = (!m.properties.user.is_empty())
                            .then(|| serde_json::to_string(&m.properties.user).unwrap_or_default());
                        insert.execute(params![
                            id,
                            KIND_MESSAGE,
                            m.class,
                            m.topic,
                            &m.payload[..],
                            m.qos,
                            m.enqueued_ms,
                            m.expires_ms,
                            user,
                            m.properties.correlation_data.as_deref(),
                            m.properties.content_type,
                            i64::from(r.durability == Durability::Full),
                            m.properties.schema.as_ref().map(ToString::to_string),
                        ])
                    }
                    Body::Gap(g) => {
                        let body = serde_json::to_vec(g).unwrap_or_default();
                        insert.execute(params![
                            id,
                            KIND_GAP,
                            g.class,
                            "",
                            body,
                            0,
                            now_ms(),
                            None::<u64>,
                            None::<String>,
                            None::<Vec<u8>>,
                            None::<String>,
                            0,
                            None::<String>
                        ])
                    }
                };
                result.map_err(|e| self.err(e))?;
            }
            let mut remove =
                tx.prepare_cached("DELETE FROM records WHERE id = ?1 AND kind = 0").map_err(|e| self.err(e))?;
            for lost in delete {
                self.ledger.forget(lost.lane);
                for seq in &lost.seqs {
                    remove.execute(params![key(lost.lane, *seq)?]).map_err(|e| self.err(e))?;
                }
            }
            let mut lane = tx
                .prepare_cached(
                    "INSERT INTO lanes (lane, next_seq, acked) VALUES (?1, ?2, 0) \
                     ON CONFLICT (lane) DO UPDATE SET next_seq = max(next_seq, excluded.next_seq)",
                )
                .map_err(|e| self.err(e))?;
            for (l, next) in next_seqs {
                lane.execute(params![l.0, next.0]).map_err(|e| self.err(e))?;
            }
        }
        let mut lanes = self.lanes.clone();
        for (l, next) in next_seqs {
            let row = lanes.entry(l.0).or_insert((next.0, 0));
            row.0 = row.0.max(next.0);
        }
        let mut delta: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for m in records.iter().filter_map(Record::message) {
            let d = delta.entry(m.class.as_str()).or_default();
            *d = (d.0 + 1, d.1 + super::message_size(m) as i64);
        }
        for lost in delete {
            let d = delta.entry(lost.class.as_str()).or_default();
            *d = (d.0 - lost.seqs.len() as i64, d.1 - lost.bytes as i64);
        }
        keep_usage(&tx, &delta, &lanes_text(&lanes)).map_err(|e| self.err(e))?;
        {
            let mut receipt = tx
                .prepare_cached("INSERT OR REPLACE INTO receipts (key, lane, seq) VALUES (?1, ?2, ?3)")
                .map_err(|e| self.err(e))?;
            for r in records {
                if let Some(key) = r.message().and_then(|m| m.properties.receipt) {
                    receipt.execute(params![key as i64, r.lane.0, r.seq.0]).map_err(|e| self.err(e))?;
                }
            }
        }
        tx.commit().map_err(|e| self.err(e))?;
        self.lanes = lanes;
        Ok(())
    }

    fn read(&mut self, lane: Lane, after: Seq, limit: usize) -> Result<Vec<Record>, SpoolError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, class, topic, payload, qos, enqueued_ms, expires_ms, user_properties, correlation_data, \
                 content_type, kind, durability, schema FROM records WHERE id > ?1 AND id < ?2 ORDER BY id LIMIT ?3",
            )
            .map_err(|e| self.err(e))?;
        // A seq past the key range has no records after it.
        let from = key(lane, after.0).unwrap_or(i64::MAX);
        let rows = stmt
            .query_map(params![from, lane_end(lane), limit as i64], |r| {
                let seq = Seq(seq_of(r.get(0)?));
                if r.get::<_, i64>(10)? == KIND_GAP {
                    let body: Vec<u8> = r.get(3)?;
                    let gap: Gap = serde_json::from_slice(&body).map_err(|e| {
                        rusqlite::Error::FromSqlConversionFailure(3, rusqlite::types::Type::Blob, Box::new(e))
                    })?;
                    return Ok(Record { lane, seq, durability: Durability::Normal, body: Body::Gap(gap) });
                }
                let user: Option<String> = r.get(7)?;
                let durability = if r.get::<_, i64>(11)? == 1 { Durability::Full } else { Durability::Normal };
                Ok(Record {
                    lane,
                    seq,
                    durability,
                    body: Body::Message(Message {
                        class: r.get(1)?,
                        topic: r.get(2)?,
                        payload: Bytes::from(r.get::<_, Vec<u8>>(3)?),
                        qos: r.get(4)?,
                        enqueued_ms: r.get(5)?,
                        expires_ms: r.get(6)?,
                        properties: Properties {
                            user: user.and_then(|u| serde_json::from_str(&u).ok()).unwrap_or_default(),
                            correlation_data: r.get::<_, Option<Vec<u8>>>(8)?.map(Bytes::from),
                            content_type: r.get(9)?,
                            // Only this build writes it, in its own form; anything else (a bad
                            // page) costs the header, not the record.
                            schema: r.get::<_, Option<String>>(12)?.and_then(|s| s.parse().ok()),
                            receipt: None,
                        },
                    }),
                })
            })
            .map_err(|e| self.err(e))?;
        // Rows come one at a time: stop once the records read hold READ_BYTES.
        let mut records = Vec::new();
        let mut bytes = 0;
        for row in rows {
            let record = row.map_err(|e| self.err(e))?;
            bytes += match &record.body {
                Body::Message(m) => super::memory_size(m),
                Body::Gap(_) => 0,
            };
            records.push(record);
            if bytes >= super::READ_BYTES {
                break;
            }
        }
        self.ledger.read(lane, after.0, &records);
        Ok(records)
    }

    fn ack(&mut self, lane: Lane, up_to: Seq) -> Result<Vec<ClassUsage>, SpoolError> {
        let (start, end) = (lane_start(lane), key(lane, up_to.0.min((1 << SEQ_BITS) - 1))?);
        let known = self.ledger.ack(lane, seq_of(end));
        let acked = self.ack_rows(lane, up_to, (start, end), known);
        match &acked {
            Ok(_) => self.ledger.swept(lane, seq_of(end)),
            Err(_) => self.ledger.forget(lane),
        }
        acked
    }

    fn used_bytes(&mut self) -> Result<u64, SpoolError> {
        let pragma = |name: &str| self.conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0));
        let pages = pragma("page_count").map_err(|e| self.err(e))?;
        let free = pragma("freelist_count").map_err(|e| self.err(e))?;
        let size = pragma("page_size").map_err(|e| self.err(e))?;
        let mut wal = self.path.as_os_str().to_owned();
        wal.push("-wal");
        let wal = std::fs::metadata(PathBuf::from(wal)).map_or(0, |m| m.len());
        Ok(((pages - free).max(0) * size) as u64 + wal)
    }

    fn oldest(&mut self, lane: Lane, class: Option<&str>, bytes: u64) -> Result<Vec<Lost>, SpoolError> {
        // Two statements rather than `(?4 IS NULL OR class = ?4)`, which would hide the key
        // range from the planner.
        let filter = if class.is_some() { "class = ?4" } else { "?4 IS NULL" };
        let sql = format!(
            "SELECT id, class, length(payload) + length(topic) + coalesce(length(user_properties), 0) + ?3, \
             {MESSAGE_SIZE} FROM records WHERE id >= ?1 AND id < ?5 AND kind = 0 AND durability = 0 AND {filter} \
             ORDER BY id LIMIT ?2"
        );
        let mut stmt = self.conn.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let mut rows = stmt
            .query(params![lane_start(lane), 4096, RECORD_OVERHEAD, class, lane_end(lane)])
            .map_err(|e| self.err(e))?;
        let mut lost: Vec<Lost> = Vec::new();
        let mut freed = 0u64;
        while freed < bytes {
            let Some(row) = rows.next().map_err(|e| self.err(e))? else { break };
            let seq = seq_of(row.get(0).map_err(|e| self.err(e))?);
            let class: String = row.get(1).map_err(|e| self.err(e))?;
            freed += row.get::<_, i64>(2).map_err(|e| self.err(e))? as u64;
            let size = row.get::<_, i64>(3).map_err(|e| self.err(e))? as u64;
            add_lost(&mut lost, lane, class, seq, size);
        }
        Ok(lost)
    }

    fn expired(&mut self, now_ms: u64) -> Result<Vec<Lost>, SpoolError> {
        let mut stmt = self.conn.prepare_cached(&expired_query()).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![now_ms], |r| {
                Ok((Lane(r.get(0)?), seq_of(r.get(1)?), r.get::<_, String>(2)?, r.get::<_, u64>(3)?))
            })
            .map_err(|e| self.err(e))?;
        let mut lost: Vec<Lost> = Vec::new();
        for row in rows {
            let (lane, seq, class, size) = row.map_err(|e| self.err(e))?;
            add_lost(&mut lost, lane, class, seq, size);
        }
        Ok(lost)
    }

    fn lanes_with_evictable(&mut self) -> Result<Vec<Lane>, SpoolError> {
        // A probe per lane finds the first evictable record from the lane's start, instead of
        // reading every record for a DISTINCT.
        let mut stmt = self
            .conn
            .prepare_cached("SELECT 1 FROM records WHERE id >= ?1 AND id < ?2 AND kind = 0 AND durability = 0 LIMIT 1")
            .map_err(|e| self.err(e))?;
        let mut lanes = Vec::new();
        let mut next = Some(0u8);
        while let Some(lane) = next {
            // Lanes with no record at all are skipped by looking up where the next one starts.
            let first: Option<i64> = self
                .conn
                .prepare_cached("SELECT min(id) FROM records WHERE id >= ?1")
                .and_then(|mut s| s.query_row(params![lane_start(Lane(lane))], |r| r.get(0)))
                .map_err(|e| self.err(e))?;
            let Some(first) = first else { break };
            let lane = Lane((first >> SEQ_BITS) as u8);
            if stmt.exists(params![lane_start(lane), lane_end(lane)]).map_err(|e| self.err(e))? {
                lanes.push(lane);
            }
            next = (lane.0 < MAX_LANE).then(|| lane.0 + 1);
        }
        Ok(lanes)
    }

    fn oldest_enqueued_ms(&mut self, lane: Lane) -> Result<Option<u64>, SpoolError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT enqueued_ms FROM records WHERE id >= ?1 AND id < ?2 AND kind = 0 ORDER BY id LIMIT 1",
            )
            .map_err(|e| self.err(e))?;
        let mut rows = stmt.query(params![lane_start(lane), lane_end(lane)]).map_err(|e| self.err(e))?;
        match rows.next().map_err(|e| self.err(e))? {
            Some(row) => Ok(Some(row.get(0).map_err(|e| self.err(e))?)),
            None => Ok(None),
        }
    }

    fn close_cleanly(&mut self, usage: &[ClassUsage]) -> Result<(), SpoolError> {
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        let note = UsageNote { lanes: lane_rows(&tx).map_err(|e| self.err(e))?, usage: usage.to_vec() };
        let note =
            serde_json::to_string(&note).map_err(|e| self.err(rusqlite::Error::ToSqlConversionFailure(e.into())))?;
        tx.execute("INSERT OR REPLACE INTO meta VALUES ('usage', ?1)", [note]).map_err(|e| self.err(e))?;
        // A check that has not passed yet must run again at the next start.
        // Read before the check is dropped, which interrupts one still running.
        let check = self.check.take().map(|c| c.current());
        if matches!(check, None | Some(CheckState::Passed)) {
            tx.execute("INSERT OR REPLACE INTO meta VALUES ('closed_cleanly', '1')", []).map_err(|e| self.err(e))?;
        } else {
            tracing::warn!(check = ?check, "spool integrity check not passed before the stop; it runs again at the next start");
        }
        tx.commit().map_err(|e| self.err(e))?;
        let lanes = lane_rows(&self.conn).map_err(|e| self.err(e))?;
        self.seqs
            .settle(lanes.iter().map(|&(lane, next, _)| (Lane(lane), next)))
            .map_err(|source| SpoolError::Io { path: self.seqs.path().to_owned(), source })
    }

    fn suspect(&self, lane: Lane) -> Option<(Seq, Option<Seq>)> {
        self.seqs.suspect(lane).map(|(from, until)| (Seq(from), until.map(Seq)))
    }

    fn suspects(&self) -> Vec<Lane> {
        self.seqs.suspects()
    }

    fn clear_suspect(&mut self, lane: Lane) -> Result<(), SpoolError> {
        self.seqs.clear_suspect(lane).map_err(|source| SpoolError::Io { path: self.seqs.path().to_owned(), source })
    }

    fn renumber(&mut self, lane: Lane, from: Seq, by: u64) -> Result<(), SpoolError> {
        let next = lane_rows(&self.conn).map_err(|e| self.err(e))?.iter().find(|r| r.0 == lane.0).map_or(1, |r| r.1);
        let new_next = next
            .checked_add(by)
            .filter(|n| *n < 1 << SEQ_BITS)
            .ok_or(SpoolError::KeyRange { lane: lane.0, seq: next.saturating_add(by) })?;
        self.seqs
            .cover([(lane, new_next)])
            .map_err(|source| SpoolError::Io { path: self.seqs.path().to_owned(), source })?;
        let (start, end) = (key(lane, from.0)?, lane_end(lane));
        // Fsynced: a renumber undone by a power cut after its suspect mark was cleared would
        // leave records on reused seqs with nothing to move them (`seqs.rs`).
        if !self.synchronous_full {
            self.conn.pragma_update(None, "synchronous", "FULL").map_err(|e| self.err(e))?;
            self.synchronous_full = true;
        }
        let tx = self.conn.unchecked_transaction().map_err(|e| self.err(e))?;
        // Through negative ids: shifting in place would collide with rows not yet moved.
        tx.execute("UPDATE records SET id = -(id + ?3) WHERE id >= ?1 AND id < ?2", params![start, end, by as i64])
            .map_err(|e| self.err(e))?;
        tx.execute("UPDATE records SET id = -id WHERE id < 0", []).map_err(|e| self.err(e))?;
        tx.execute(
            "INSERT INTO lanes (lane, next_seq, acked) VALUES (?1, ?2, 0) \
             ON CONFLICT (lane) DO UPDATE SET next_seq = excluded.next_seq",
            params![lane.0, new_next],
        )
        .map_err(|e| self.err(e))?;
        let mut lanes = self.lanes.clone();
        lanes.entry(lane.0).or_insert((new_next, 0)).0 = new_next;
        keep_usage(&tx, &BTreeMap::new(), &lanes_text(&lanes)).map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))?;
        self.lanes = lanes;
        Ok(())
    }

    /// Salvages this database while it runs (a page found damaged): what it can read goes into
    /// a new database under the same epoch (`known`: each lane's next seq, which the running
    /// spool knows exactly), which takes this one's place; this one is moved aside.
    fn rebuild(&mut self, known: &BTreeMap<u8, u64>) -> Result<super::salvage::Salvaged, SpoolError> {
        let salvaged = super::salvage::prepare(&self.path, known)?;
        // Nothing of the old file stays open while it moves: the connection, the checkpointer's
        // and the check's.
        self.check = None;
        self._checkpointer = None;
        self.conn = Connection::open_in_memory().map_err(|e| self.err(e))?;
        let aside = super::salvage::install(&self.path)?;
        let mut fresh = Self::open_checked(&self.path)?;
        fresh.opened.moved_aside = Some(aside);
        fresh.opened.salvaged = Some(salvaged.clone());
        *self = fresh;
        Ok(salvaged)
    }

    fn damaged(&self) -> Option<String> {
        match self.check.as_ref().map(IntegrityCheck::current) {
            Some(CheckState::Failed(report)) => Some(format!("integrity check failed: {report}")),
            _ => None,
        }
    }

    fn compact(&mut self) -> Result<(), SpoolError> {
        // Free pages go back first (that is a write, into the WAL); the checkpoint then moves
        // everything into the main file, which shrinks, and truncates the WAL to nothing.
        // The pragma frees one page per step: run it to the end.
        {
            let mut stmt = self.conn.prepare_cached("PRAGMA incremental_vacuum").map_err(|e| self.err(e))?;
            let mut rows = stmt.query([]).map_err(|e| self.err(e))?;
            while rows.next().map_err(|e| self.err(e))?.is_some() {}
        }
        self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).map_err(|e| self.err(e))
    }
}

/// Adds `seq` to the entry of `lane` and `class`, keeping one entry per pair.
fn add_lost(lost: &mut Vec<Lost>, lane: Lane, class: String, seq: u64, size: u64) {
    match lost.iter_mut().find(|l| l.lane == lane && l.class == class) {
        Some(l) => {
            l.seqs.push(seq);
            l.bytes += size;
        }
        None => lost.push(Lost { lane, class, seqs: vec![seq], bytes: size }),
    }
}
