//! The store-and-forward spool: an outbox on disk for messages that must reach the cloud.
//!
//! # What it promises
//!
//! - A record is durable once [`Spool::flush`] returned for the batch that holds it: it then
//!   survives a process crash (durability `normal`: SQLite WAL with `synchronous=NORMAL`) or a
//!   power cut (`full`: the batch is committed with `synchronous=FULL`). Records appended but
//!   not yet flushed are lost by a crash; that window is what group commit trades for speed.
//! - Every record has a `seq` in its lane. Seqs are handed out in order, never reused once
//!   committed, and continue after a restart: each lane's next seq is stored in the same
//!   transaction as the records that used it.
//! - Nothing is deleted before it is acknowledged: [`Spool::ack`] is cumulative per lane and
//!   deletes exactly the records at or below the acked seq.
//! - Each database has a random `epoch`, made when the database is created. A reinstall starts
//!   a new epoch, so a restarted seq can never be mistaken for data the cloud already has (the
//!   cloud keys by edge, epoch, lane and seq); a damaged database is salvaged into a new one
//!   under its own epoch (see Recovery).
//!
//! # On disk (schema version 2)
//!
//! - `meta(key, value)`: `schema_version`, `epoch` (16 random bytes, hex), `created_ms`,
//!   `closed_cleanly` (`1` only between a graceful stop and the next open).
//! - `lanes(lane, next_seq, acked)`: per lane, the next seq to hand out and the highest acked.
//! - `records(id, kind, durability, class, topic, payload, qos, enqueued_ms, expires_ms,
//!   user_properties, correlation_data, content_type)`, keyed by `id = lane << 56 | seq` as the
//!   rowid, so a lane is one contiguous key range of one B-tree, read in seq order, and an
//!   append, a read or an ack touches that tree only. `lane` and `seq` are computed (virtual)
//!   columns for people and the read-only tools. `kind` is a message or a gap record. An
//!   ordinary rowid table on purpose: records of a few KiB do not fit inline in a WITHOUT ROWID
//!   b-tree page and would each spill onto an overflow page, quadrupling their size on disk.
//!
//! Version 1 keyed records by `PRIMARY KEY (lane, seq)` on a rowid table: two B-trees, so a
//! read walked the index and then looked each row up, and every insert and delete changed
//! both. Opening a version 1 spool migrates it in chunks that need about 4 MiB of free space,
//! not a copy of the spool, and that resume after a crash (`migrate.rs`).
//!
//! # The byte budget
//!
//! Counted as SQLite pages in use (every table) plus the WAL file. Over budget, the spool
//! first checkpoints the WAL, then evicts `normal` messages: the lowest priority lane (highest
//! number) first, oldest first, and commits the deletion in the same transaction as a gap
//! record (its own seq in the lane, listing the dropped seq ranges), so loss is never silent.
//! `full` messages are never evicted: a `full` append that finds no room after lower-priority
//! lanes were evicted is refused and handed back. Gap records are never evicted either. Freed
//! pages go back to the file system (`auto_vacuum = INCREMENTAL`), bounding the file as well.
//! The WAL is checkpointed by a thread of its own once a second or past 4 MiB (see
//! `checkpoint.rs`: never inside a commit, where it would stall PUBACKs) and truncated back to
//! at most 4 MiB when it restarts (`journal_size_limit`), so flash sees neither an
//! ever-growing WAL nor constant truncation.
//!
//! # Draining
//!
//! The uplink reads each lane in seq order, a window at a time ([`Spool::read`], stopping at
//! [`READ_BYTES`] so a window fits one batch frame), and chooses which lane to read next itself
//! (`uplink::drain`). Acks are cumulative per lane.
//!
//! # Recovery
//!
//! Unless the last run closed the spool cleanly (a graceful stop commits everything, then
//! notes `closed_cleanly` in `meta` as its last write; every open clears the note first),
//! `PRAGMA quick_check` runs, beside the spool rather than before it (`integrity.rs`): it reads
//! every page, 1.5 s for a 1.3 GB spool in the page cache and 16 s from a cold disk, and a
//! gateway that reboots after a power cut into a backlog should drain it at once.
//!
//! A damaged database (SQLite cannot read it or one of its pages, or its check failed) is
//! salvaged, at open or, found while running, by the spool's own thread (`damage.rs`): every
//! record it can read goes into a new database under the same epoch, with the same seqs, and a
//! gap record per lane names the seqs it could not read (`salvage.rs`); the damaged file is
//! renamed `<name>.damaged-<unix-ms>` (with its WAL, shared-memory and check-failed files) and
//! kept. Nothing else is damage: a lock another process holds (waited for 5 s), a read-only
//! file, a full disk or an I/O error writing fail the open with their cause, and the database
//! stays where it is. Nothing is ever deleted to recover.
//!
//! The records and bytes per class (budget, quotas, metrics) are kept in `class_usage`, in the
//! transaction of every change of the records, with the lanes they match in
//! `meta.usage_lanes`; an open takes them from there, so no start counts the records (4 to 5 s
//! per GB). A spool from before, or one a version without the table changed since, is counted
//! once. A schema version newer than this build is refused rather than guessed at,
//! and so is a migration that fails (a full disk, say): both leave the file where it is.
//!
//! This module owns the spool's files; it does not know about MQTT connections or the uplink,
//! which call it through [`SpoolWriter`] (the spool's own thread) and [`Spool`]. The one thing
//! it takes from the bridge protocol is the batch frame limit that bounds a read.
//! docs/ARCHITECTURE.md places it in the path of a message.

mod checkpoint;
mod config;
mod damage;
pub mod fault;
pub mod inspect;
mod integrity;
mod ledger;
mod migrate;
pub mod recovery;
pub(crate) mod salvage;
pub(crate) mod sched;
mod schema;
mod seqs;
mod sink;
mod sqlite;
mod start;
mod writer;

use std::collections::BTreeMap;
use std::path::PathBuf;

use bytes::Bytes;

pub use config::SpoolConfig;
pub use integrity::CheckState;
/// A lane and a record's seq in it, as the protocol has them.
pub use shared::proto::{Lane, Seq};
pub use sink::{Misfit, SinkFit};
pub use sqlite::SqliteStorage;
pub use start::{StartError, start};
pub use writer::{AppendError, Heads, ReadError, SpoolFigures, SpoolWriter, WriterMetrics};

/// How far a committed batch survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Durability {
    /// Survives a process crash (WAL, `synchronous=NORMAL`).
    #[default]
    Normal,
    /// Survives a power cut (`synchronous=FULL`).
    Full,
}

/// MQTT 5 properties kept with a message so they reach the cloud as headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    pub user: Vec<(String, String)>,
    pub correlation_data: Option<Bytes>,
    pub content_type: Option<String>,
    /// The schema version the payload was validated against on PUBLISH, for the sink's
    /// headers (`[[schema]]`).
    pub schema: Option<shared::proto::SchemaRef>,
    /// The QoS 2 receipt the message came under (`broker::core`): the spool takes a message of
    /// a receipt it holds only once. Not sent to the cloud.
    pub receipt: Option<u64>,
}

/// A message to spool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub class: String,
    pub topic: String,
    pub payload: Bytes,
    pub qos: u8,
    pub enqueued_ms: u64,
    pub expires_ms: Option<u64>,
    pub properties: Properties,
}

/// Why records were dropped before the cloud acknowledged them: the wire's type, so the
/// reason is one value from the spool to the sink.
pub use shared::proto::GapReason;

/// A record that stands for records that are gone, so loss is visible at the other end.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Gap {
    pub class: String,
    pub reason: GapReason,
    /// Inclusive seq ranges of the dropped records, ascending.
    pub ranges: Vec<(u64, u64)>,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    Message(Message),
    Gap(Gap),
}

/// A spooled record with its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub lane: Lane,
    pub seq: Seq,
    /// `Full` records are never evicted: their PUBACK promised they are on disk.
    pub durability: Durability,
    pub body: Body,
}

impl Record {
    pub fn message(&self) -> Option<&Message> {
        match &self.body {
            Body::Message(m) => Some(m),
            Body::Gap(_) => None,
        }
    }
}

/// Records dropped from one lane and class, before they become a gap record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub lane: Lane,
    pub class: String,
    pub seqs: Vec<u64>,
    /// Their [`message_size`] summed, for the class usage.
    pub bytes: u64,
}

/// Message records a class holds and their bytes (payload and topic, see [`message_size`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClassUsage {
    pub class: String,
    pub records: u64,
    pub bytes: u64,
}

/// A `full` message the spool could not make room for: handed back, never acknowledged.
#[derive(Debug)]
pub struct Refused {
    pub message: Message,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpoolError {
    #[error("spool database {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("spool database {path} has schema version {found}; this build knows up to {known}")]
    NewerSchema { path: PathBuf, found: i64, known: i64 },
    #[error(
        "spool database {path}: migrating schema version {from} to {to} failed, the database is unchanged since its last completed step and the next start resumes it: {source}"
    )]
    Migration {
        path: PathBuf,
        from: i64,
        to: i64,
        #[source]
        source: rusqlite::Error,
    },
    #[error("spool key out of range: lane {lane} seq {seq} (lanes go up to 126, seqs below 2^56)")]
    KeyRange { lane: u8, seq: u64 },
    #[error("spool directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl SpoolError {
    /// Whether the database is damaged (SQLite cannot read it or a page of it, or its integrity
    /// check failed), rather than locked, read-only, on a full disk or newer than this build.
    pub(crate) fn is_damage(&self) -> bool {
        matches!(self, SpoolError::Sqlite { source, .. } if salvage::is_damage(source))
    }

    /// A short name for what went wrong, for metrics and alerts: `disk_full`, `io` (a read,
    /// write or fsync failed), `corrupt`, `schema` or `other`.
    pub(crate) fn kind(&self) -> &'static str {
        use rusqlite::ffi::ErrorCode;
        match self {
            SpoolError::Sqlite { source: rusqlite::Error::SqliteFailure(e, _), .. } => match e.code {
                ErrorCode::DiskFull => "disk_full",
                ErrorCode::SystemIoFailure => "io",
                ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => "corrupt",
                _ => "other",
            },
            SpoolError::Sqlite { .. } => "other",
            SpoolError::Migration { source: rusqlite::Error::SqliteFailure(e, _), .. }
                if e.code == ErrorCode::DiskFull =>
            {
                "disk_full"
            }
            SpoolError::NewerSchema { .. } | SpoolError::Migration { .. } => "schema",
            SpoolError::KeyRange { .. } => "other",
            SpoolError::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull => "disk_full",
            SpoolError::Io { .. } => "io",
        }
    }
}

/// What a storage holds after opening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub epoch: String,
    /// Per lane: next seq to hand out, highest acked seq.
    pub lanes: Vec<(Lane, Seq, Seq)>,
    /// Message records held per class.
    pub usage: Vec<ClassUsage>,
    /// Set when a damaged database was moved aside to this path.
    pub moved_aside: Option<PathBuf>,
    /// What was salvaged from it (`salvage.rs`).
    pub salvaged: Option<salvage::Salvaged>,
    /// Whether the integrity check ran: it does unless the last run closed the spool cleanly.
    pub checked: bool,
    /// Whether `usage` was counted from the records (every page read) rather than taken from
    /// the note a clean close left.
    pub counted: bool,
    /// QoS 2 receipts held, with the record each took (see [`Spool::append`]).
    pub receipts: Vec<(u64, Lane, Seq)>,
}

/// Where records live. SQLite in production; tests add fault-injecting wrappers.
pub trait Storage {
    fn opened(&self) -> &Opened;
    /// In one transaction: writes `records` and the lanes' next seqs, and deletes the message
    /// records listed in `delete` (dropped records go in the same transaction as the gap record
    /// that accounts for them).
    fn commit(
        &mut self,
        records: &[Record],
        next_seqs: &[(Lane, Seq)],
        delete: &[Lost],
        durability: Durability,
    ) -> Result<(), SpoolError>;
    /// Up to `limit` records of `lane` with seq above `after`, in seq order, stopping after the
    /// record that brings their messages to [`READ_BYTES`] (so at least one record, if any).
    fn read(&mut self, lane: Lane, after: Seq, limit: usize) -> Result<Vec<Record>, SpoolError>;
    /// Deletes `lane`'s records at or below `up_to` and records the ack; returns the message
    /// records deleted per class.
    fn ack(&mut self, lane: Lane, up_to: Seq) -> Result<Vec<ClassUsage>, SpoolError>;
    /// Bytes the spool takes on disk: pages in use, index included, plus the WAL.
    fn used_bytes(&mut self) -> Result<u64, SpoolError>;
    /// The oldest `Normal` message records of `lane` (never gap or `Full` records), of `class`
    /// only if given, that take about `bytes` on disk.
    fn oldest(&mut self, lane: Lane, class: Option<&str>, bytes: u64) -> Result<Vec<Lost>, SpoolError>;
    /// Message records that expired at or before `now_ms`.
    fn expired(&mut self, now_ms: u64) -> Result<Vec<Lost>, SpoolError>;
    /// Lanes holding records eviction may take (`Normal` messages), any order.
    fn lanes_with_evictable(&mut self) -> Result<Vec<Lane>, SpoolError>;
    /// When the first message record still in `lane` was enqueued.
    fn oldest_enqueued_ms(&mut self, lane: Lane) -> Result<Option<u64>, SpoolError>;
    /// Checkpoints the WAL and returns free pages to the file system.
    fn compact(&mut self) -> Result<(), SpoolError>;
    /// Notes, as the last write, that everything is committed and the node stops, with the
    /// class usage as it stands: the next open may skip the integrity check and the count of
    /// every record, each seconds on a large spool.
    fn close_cleanly(&mut self, usage: &[ClassUsage]) -> Result<(), SpoolError>;
    /// For a lane opening found below its reservation (see `seqs.rs`), until the cloud's mark
    /// was checked: the first seq handed out since, and, when that followed a reboot, the
    /// highest it may have handed out before.
    fn suspect(&self, lane: Lane) -> Option<(Seq, Option<Seq>)>;
    /// Every suspect lane.
    fn suspects(&self) -> Vec<Lane>;
    fn clear_suspect(&mut self, lane: Lane) -> Result<(), SpoolError>;
    /// Moves `lane`'s records from seq `from` on, and its next seq, `by` seqs up, durably
    /// (fsynced, whatever the durability of the records).
    fn renumber(&mut self, lane: Lane, from: Seq, by: u64) -> Result<(), SpoolError>;
    /// What is wrong with the database that only a rebuild mends (its integrity check failed
    /// beside it), if anything.
    fn damaged(&self) -> Option<String>;
    /// Salvages the database into a new one that takes its place (`salvage.rs`); `known` holds
    /// each lane's next seq.
    fn rebuild(&mut self, known: &BTreeMap<u8, u64>) -> Result<salvage::Salvaged, SpoolError>;
    /// Forgets these QoS 2 receipts (released), or with `keep`, every receipt but those.
    fn forget_receipts(&mut self, keys: &[u64], keep: bool) -> Result<(), SpoolError>;
}

#[derive(Debug, Clone, Copy, Default)]
struct LaneState {
    /// Next seq to hand out.
    next: u64,
    /// Next seq after the last committed one.
    committed: u64,
    acked: u64,
}

/// The spool: hands out seqs, batches appends into group commits, reads windows, applies acks.
#[derive(Debug)]
pub struct Spool<S> {
    storage: S,
    /// Bytes on disk the spool may take; `None` for no limit.
    budget: Option<u64>,
    lanes: BTreeMap<Lane, LaneState>,
    pending: Vec<Record>,
    /// [`estimated_size`] of the pending messages.
    pending_bytes: u64,
    pending_durability: Durability,
    /// Records dropped (class, reason, count) since the last `take_dropped`, for metrics.
    dropped: Vec<(String, GapReason, u64)>,
    /// Seqs handed out but dropped before any commit; the next commit writes their gap records.
    uncommitted_drops: Vec<Lost>,
    /// Most records, and bytes ([`estimated_size`]), kept pending while commits fail; beyond
    /// either the oldest `normal` ones go.
    max_pending: usize,
    max_pending_bytes: u64,
    /// Committed message records per class, kept in step with every commit, ack and drop.
    usage: BTreeMap<String, ClassUsage>,
    /// Byte quota per class ([`message_size`] summed).
    quotas: BTreeMap<String, u64>,
    /// The lane each class was last appended to, where its quota evicts.
    class_lanes: BTreeMap<String, Lane>,
    /// A spool of an epoch that takes no new records (a recovered one): a cloud mark past its
    /// head means the cloud has everything in it, never that its seqs were handed out again.
    closed_epoch: bool,
    /// QoS 2 receipts whose messages it took, committed or pending, with their records.
    receipts: std::collections::HashMap<u64, (Lane, Seq)>,
}

impl<S: Storage> Spool<S> {
    pub fn new(storage: S) -> Self {
        let lanes = storage
            .opened()
            .lanes
            .iter()
            .map(|(lane, next, acked)| (*lane, LaneState { next: next.0, committed: next.0, acked: acked.0 }))
            .collect();
        let usage = storage.opened().usage.iter().map(|u| (u.class.clone(), u.clone())).collect();
        let salvaged = storage.opened().salvaged.clone();
        let receipts = storage.opened().receipts.iter().map(|&(key, lane, seq)| (key, (lane, seq))).collect();
        let mut spool = Self {
            storage,
            budget: None,
            lanes,
            pending: Vec::new(),
            pending_bytes: 0,
            pending_durability: Durability::Normal,
            dropped: Vec::new(),
            uncommitted_drops: Vec::new(),
            max_pending: 65_536,
            max_pending_bytes: 64 << 20,
            usage,
            quotas: BTreeMap::new(),
            class_lanes: BTreeMap::new(),
            closed_epoch: false,
            receipts,
        };
        // What a salvage at open could not read goes to the cloud as gap records first thing.
        if let Some(salvaged) = salvaged {
            spool.queue_unreadable_gaps(&salvaged);
        }
        spool
    }

    /// Caps the bytes each named class may hold; over it a `normal` class loses its oldest
    /// records (as gaps) and a `full` class is refused.
    pub(crate) fn with_quotas(mut self, quotas: impl IntoIterator<Item = (String, u64)>) -> Self {
        self.quotas = quotas.into_iter().collect();
        self
    }

    /// Committed message records and bytes per class.
    pub(crate) fn usage(&self) -> impl Iterator<Item = &ClassUsage> {
        self.usage.values()
    }

    /// When the oldest message not yet acked was enqueued, over all lanes.
    pub fn oldest_unacked_ms(&mut self) -> Result<Option<u64>, SpoolError> {
        let lanes: Vec<Lane> = self.lanes.keys().copied().collect();
        let mut oldest = None;
        for lane in lanes {
            if let Some(ms) = self.storage.oldest_enqueued_ms(lane)? {
                oldest = Some(oldest.map_or(ms, |o: u64| o.min(ms)));
            }
        }
        Ok(oldest)
    }

    /// Keeps the spool within `bytes` on disk (database, index and WAL).
    pub fn with_budget(mut self, bytes: u64) -> Self {
        self.budget = Some(bytes);
        self
    }

    pub fn epoch(&self) -> &str {
        &self.storage.opened().epoch
    }

    /// A spool that takes no new records (`recovery.rs`): its seqs are never handed out again,
    /// so a cloud mark past them is an ack, not a sign of reuse to renumber past.
    pub(crate) fn with_closed_epoch(mut self) -> Self {
        self.closed_epoch = true;
        self
    }

    /// Caps the records kept pending while commits fail (default 65,536).
    #[cfg(test)]
    pub(crate) fn with_max_pending(mut self, records: usize) -> Self {
        self.max_pending = records.max(1);
        self
    }

    /// Caps the bytes of records kept pending while commits fail (default 64 MiB).
    pub(crate) fn with_max_pending_bytes(mut self, bytes: u64) -> Self {
        self.max_pending_bytes = bytes;
        self
    }

    /// Queues a message for the next commit and returns its seq. Seqs start at 1. A message
    /// under a QoS 2 receipt the spool took a message of already (a resend, after a crash lost
    /// the publisher's PUBREC) is that message: its seq comes back, nothing is queued.
    pub fn append(&mut self, lane: Lane, message: Message, durability: Durability) -> Seq {
        if let Some(&(_, seq)) = message.properties.receipt.and_then(|k| self.receipts.get(&k)) {
            return seq;
        }
        let size = estimated_size(&message);
        // Commits keep failing: memory must stay bounded, in records and in bytes (a record
        // cap alone let 65,536 messages of 1 MiB be held). The oldest `normal` records go,
        // accounted for by a gap record once the disk takes writes again.
        while self.pending.len() >= self.max_pending || self.pending_bytes + size > self.max_pending_bytes {
            // Never a gap record: the seqs it accounts for would be lost without a trace.
            let droppable = |r: &Record| r.durability == Durability::Normal && r.message().is_some();
            let Some(i) = self.pending.iter().position(droppable) else { break };
            let r = self.pending.remove(i);
            self.pending_bytes -= r.message().map_or(0, estimated_size);
            self.note_uncommitted_drop(&r);
        }
        if self.class_lanes.get(&message.class) != Some(&lane) {
            self.class_lanes.insert(message.class.clone(), lane);
        }
        let state = self.lanes.entry(lane).or_default();
        state.next = state.next.max(1);
        let seq = Seq(state.next);
        state.next += 1;
        self.pending_durability = self.pending_durability.max(durability);
        self.pending_bytes += size;
        if let Some(key) = message.properties.receipt {
            self.receipts.insert(key, (lane, seq));
        }
        self.pending.push(Record { lane, seq, durability, body: Body::Message(message) });
        seq
    }

    /// The QoS 2 receipts released: a message under one of them is a new one again.
    pub fn forget_receipts(&mut self, keys: &[u64]) -> Result<(), SpoolError> {
        for key in keys {
            self.receipts.remove(key);
        }
        self.storage.forget_receipts(keys, false)
    }

    /// At start, once the broker knows which receipts are live: every other one goes (a
    /// release whose forgetting a crash cut short).
    pub fn keep_receipts(&mut self, live: &std::collections::BTreeSet<u64>) -> Result<(), SpoolError> {
        self.receipts.retain(|key, _| live.contains(key));
        let keep: Vec<u64> = self.receipts.keys().copied().collect();
        self.storage.forget_receipts(&keep, true)
    }

    /// Appends a `full` message only if the budget has room for it after evicting lanes of lower
    /// priority than `lane`; otherwise hands it back. Flushes what is pending first, so the room
    /// is measured on disk.
    pub fn append_full(&mut self, lane: Lane, message: Message) -> Result<Seq, Box<Refused>> {
        if let Some(&(_, seq)) = message.properties.receipt.and_then(|k| self.receipts.get(&k)) {
            return Ok(seq);
        }
        if let Some(quota) = self.quotas.get(&message.class) {
            let pending: u64 = self
                .pending
                .iter()
                .filter_map(|r| r.message().filter(|m| m.class == message.class).map(message_size))
                .sum();
            let held = self.usage.get(&message.class).map_or(0, |u| u.bytes);
            if held + pending + message_size(&message) > *quota {
                return Err(Box::new(Refused { message }));
            }
        }
        if let Some(budget) = self.budget {
            let size = estimated_size(&message);
            // Room on disk for everything pending and this: no commit needed to know, so
            // `full` appends keep sharing group commits.
            let room = self.storage.used_bytes().is_ok_and(|used| used + self.pending_bytes + size <= budget);
            let fits = room
                || (self.flush().is_ok() && self.make_room(budget.saturating_sub(size), Some(lane)).unwrap_or(false));
            if !fits {
                return Err(Box::new(Refused { message }));
            }
        }
        Ok(self.append(lane, message, Durability::Full))
    }

    /// Records appended and not yet committed.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Commits what is pending and, if nothing is left, marks the spool closed cleanly.
    pub fn close(&mut self) -> Result<(), SpoolError> {
        self.flush()?;
        if self.pending.is_empty() && self.uncommitted_drops.is_empty() {
            let usage: Vec<ClassUsage> = self.usage.values().cloned().collect();
            self.storage.close_cleanly(&usage)?;
        }
        Ok(())
    }

    /// Commits everything appended so far in one transaction. On failure `normal` records stay
    /// pending for the next try; `full` ones leave the batch (their clients get no PUBACK and
    /// resend) and are accounted for by a `refused` gap record at the next successful commit.
    pub fn flush(&mut self) -> Result<(), SpoolError> {
        if self.pending.is_empty() && self.uncommitted_drops.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.commit_pending() {
            let (full, normal): (Vec<Record>, Vec<Record>) =
                std::mem::take(&mut self.pending).into_iter().partition(|r| r.durability == Durability::Full);
            self.pending = normal;
            self.pending_bytes = self.pending.iter().filter_map(Record::message).map(estimated_size).sum();
            for r in &full {
                self.note_uncommitted_drop(r);
            }
            return Err(e);
        }
        if let Some(budget) = self.budget {
            self.make_room(budget, None)?;
        }
        self.enforce_quotas()
    }

    /// Evicts the oldest `normal` records of each class over its quota.
    fn enforce_quotas(&mut self) -> Result<(), SpoolError> {
        let over: Vec<(String, Lane, u64)> = self
            .quotas
            .iter()
            .filter_map(|(class, quota)| {
                let held = self.usage.get(class).map_or(0, |u| u.bytes);
                let lane = self.class_lanes.get(class)?;
                // Aim a little under the quota so the next commits do not evict again at once.
                (held > *quota).then(|| (class.clone(), *lane, held - quota + quota / 10))
            })
            .collect();
        for (class, lane, need) in over {
            // `oldest` counts on-disk bytes, a little more than the quota's: ask for what the
            // quota needs and let the overhead make it round up.
            let lost = self.storage.oldest(lane, Some(&class), need)?;
            if !lost.is_empty() {
                self.record_gaps(lost, GapReason::Evicted)?;
            }
        }
        Ok(())
    }

    /// Evicts until the spool uses at most `target` bytes, lowest priority lane first (the
    /// highest lane number), oldest first, never lanes at or above `protect` in priority.
    /// Each eviction is committed with its gap record. Returns whether the target was reached.
    fn make_room(&mut self, target: u64, protect: Option<Lane>) -> Result<bool, SpoolError> {
        let mut used = self.storage.used_bytes()?;
        if used > target {
            // The WAL counts too: checkpoint before dropping anything.
            self.storage.compact()?;
            used = self.storage.used_bytes()?;
        }
        let mut exhausted: Vec<Lane> = Vec::new();
        let mut factor = 1;
        while used > target {
            let candidate = self
                .storage
                .lanes_with_evictable()?
                .into_iter()
                .filter(|l| protect.is_none_or(|p| *l > p) && !exhausted.contains(l))
                .max();
            let Some(lane) = candidate else {
                return Ok(false);
            };
            // Aim a little under the target so the next commits do not evict again at once.
            let need = (used - target + target / 10) * factor;
            let lost = self.storage.oldest(lane, None, need)?;
            if lost.is_empty() {
                exhausted.push(lane);
                continue;
            }
            self.record_gaps(lost, GapReason::Evicted)?;
            self.storage.compact()?;
            let now = self.storage.used_bytes()?;
            // Deleted rows do not always free whole pages: take more from the same lane next
            // time rather than moving on to a higher priority. Each round deletes at least one
            // record, so this ends.
            factor = if now >= used { factor * 2 } else { 1 };
            used = now;
        }
        Ok(true)
    }

    /// Drops messages whose TTL passed, recording them as gaps.
    pub(crate) fn expire(&mut self, now_ms: u64) -> Result<u64, SpoolError> {
        let lost = self.storage.expired(now_ms)?;
        let count = lost.iter().map(|l| l.seqs.len() as u64).sum();
        if count > 0 {
            self.record_gaps(lost, GapReason::Expired)?;
        }
        Ok(count)
    }

    /// Appends and commits one gap record per lane and class.
    fn record_gaps(&mut self, lost: Vec<Lost>, reason: GapReason) -> Result<(), SpoolError> {
        self.record_gaps_for(lost, reason, true)
    }

    fn record_gaps_for(&mut self, lost: Vec<Lost>, reason: GapReason, delete: bool) -> Result<(), SpoolError> {
        let mut gaps = Vec::new();
        for Lost { lane, class, seqs, .. } in &lost {
            let mut seqs = seqs.clone();
            seqs.sort_unstable();
            let count = seqs.len() as u64;
            let (lane, class) = (*lane, class.clone());
            let gap = Gap { class, reason, ranges: ranges(&seqs), count };
            let state = self.lanes.entry(lane).or_default();
            state.next = state.next.max(1);
            let seq = Seq(state.next);
            state.next += 1;
            tracing::warn!(lane = lane.0, class = %gap.class, ?reason, count, "spool dropped records; gap record written");
            gaps.push(Record { lane, seq, durability: Durability::Normal, body: Body::Gap(gap) });
        }
        // What is pending holds lower seqs: it must be committed before (or with) the gap
        // records, or a crash would leave a hole no gap record accounts for.
        let counts: Vec<(String, GapReason, u64)> = gaps
            .iter()
            .filter_map(|r| match &r.body {
                Body::Gap(g) => Some((g.class.clone(), g.reason, g.count)),
                Body::Message(_) => None,
            })
            .collect();
        let gap_count = gaps.len();
        self.pending.extend(gaps);
        let result = self.commit_pending_deleting(if delete { &lost } else { &[] });
        if result.is_err() && delete {
            // The rows were not deleted, so their gap records must not be written later: take
            // them back out and return their seqs, the lanes' latest, newest first.
            let keep = self.pending.len() - gap_count;
            for gap in self.pending.split_off(keep).into_iter().rev() {
                if let Some(state) = self.lanes.get_mut(&gap.lane) {
                    state.next -= 1;
                }
            }
        }
        // Gap records for never-committed seqs simply stay pending on failure.
        result?;
        self.dropped.extend(counts);
        Ok(())
    }

    /// Records dropped by eviction or expiry since the last call: class, reason, count.
    pub(crate) fn take_dropped(&mut self) -> Vec<(String, GapReason, u64)> {
        std::mem::take(&mut self.dropped)
    }

    fn note_uncommitted_drop(&mut self, r: &Record) {
        let class = match &r.body {
            Body::Message(m) => m.class.clone(),
            Body::Gap(g) => g.class.clone(),
        };
        match self.uncommitted_drops.iter_mut().find(|l| l.lane == r.lane && l.class == class) {
            Some(l) => l.seqs.push(r.seq.0),
            // Never committed, so never in the usage: no bytes to take back.
            None => self.uncommitted_drops.push(Lost { lane: r.lane, class, seqs: vec![r.seq.0], bytes: 0 }),
        }
    }

    /// Commits everything pending in one transaction, with gap records for seqs dropped before
    /// any commit. On error the batch stays pending: the caller may retry.
    fn commit_pending(&mut self) -> Result<(), SpoolError> {
        if !self.uncommitted_drops.is_empty() {
            // Nothing of theirs is on disk, so nothing to delete: only the gap records, which
            // stay pending (with everything else) if this commit fails too.
            let drops = std::mem::take(&mut self.uncommitted_drops);
            return self.record_gaps_for(drops, GapReason::Refused, false);
        }
        self.commit_pending_deleting(&[])
    }

    fn commit_pending_deleting(&mut self, delete: &[Lost]) -> Result<(), SpoolError> {
        let mut next: Vec<(Lane, Seq)> = Vec::new();
        for r in &self.pending {
            match next.iter_mut().find(|(l, _)| *l == r.lane) {
                Some((_, s)) => *s = Seq(s.0.max(r.seq.0 + 1)),
                None => next.push((r.lane, Seq(r.seq.0 + 1))),
            }
        }
        self.storage.commit(&self.pending, &next, delete, self.pending_durability)?;
        for m in self.pending.iter().filter_map(Record::message) {
            let u = self
                .usage
                .entry(m.class.clone())
                .or_insert_with(|| ClassUsage { class: m.class.clone(), ..Default::default() });
            u.records += 1;
            u.bytes += message_size(m);
        }
        for lost in delete {
            self.take_usage(&lost.class, lost.seqs.len() as u64, lost.bytes);
        }
        for (lane, seq) in next {
            if let Some(state) = self.lanes.get_mut(&lane) {
                state.committed = state.committed.max(seq.0);
            }
        }
        self.pending.clear();
        self.pending_bytes = 0;
        self.pending_durability = Durability::Normal;
        Ok(())
    }

    /// Bytes the spool takes on disk now.
    #[cfg(test)]
    pub(crate) fn used_bytes(&mut self) -> Result<u64, SpoolError> {
        self.storage.used_bytes()
    }

    /// Committed records of `lane` after `after`, in seq order.
    pub fn read(&mut self, lane: Lane, after: Seq, limit: usize) -> Result<Vec<Record>, SpoolError> {
        self.storage.read(lane, after, limit)
    }

    /// Deletes `lane`'s records up to and including `up_to`. An ack beyond the last committed
    /// seq is clamped to it (the cloud cannot have what was never sent); an old ack is a no-op.
    pub fn ack(&mut self, lane: Lane, up_to: Seq) -> Result<u64, SpoolError> {
        let Some(state) = self.lanes.get_mut(&lane) else {
            return Ok(0);
        };
        let up_to = up_to.0.min(state.committed.saturating_sub(1));
        if up_to <= state.acked {
            return Ok(0);
        }
        let deleted = self.storage.ack(lane, Seq(up_to))?;
        state.acked = up_to;
        let mut records = 0;
        for d in &deleted {
            records += d.records;
            self.take_usage(&d.class, d.records, d.bytes);
        }
        Ok(records)
    }

    fn take_usage(&mut self, class: &str, records: u64, bytes: u64) {
        if let Some(u) = self.usage.get_mut(class) {
            u.records = u.records.saturating_sub(records);
            u.bytes = u.bytes.saturating_sub(bytes);
        }
    }

    /// Per lane: the highest acked seq and the last committed one.
    pub fn heads(&self) -> Vec<(Lane, Seq, Seq)> {
        self.lanes.iter().map(|(l, s)| (*l, Seq(s.acked), Seq(s.committed.saturating_sub(1)))).collect()
    }

    /// Highest acked seq per lane.
    #[cfg(test)]
    pub(crate) fn acked(&self, lane: Lane) -> Seq {
        Seq(self.lanes.get(&lane).map_or(0, |s| s.acked))
    }
}

/// A message's bytes as class quotas and usage count them: payload and topic. The storage's
/// own overhead counts against the spool's budget, not the class's quota.
pub(crate) fn message_size(m: &Message) -> u64 {
    (m.payload.len() + m.topic.len()) as u64
}

/// What a message holds in memory once read: payload, topic, and its properties, each user
/// property pair at [`shared::proto::USER_PROPERTY_COST`] besides its bytes (an empty pair is a
/// few bytes on disk and 48 in memory). What a read counts against [`READ_BYTES`].
pub(crate) fn memory_size(m: &Message) -> u64 {
    let p = &m.properties;
    let user: usize = p.user.iter().map(|(k, v)| shared::proto::USER_PROPERTY_COST + k.len() + v.len()).sum();
    (m.payload.len()
        + m.topic.len()
        + user
        + p.correlation_data.as_ref().map_or(0, Bytes::len)
        + p.content_type.as_ref().map_or(0, String::len)) as u64
}

/// Message bytes ([`memory_size`]: payloads, topics and properties) a read stops at. A read
/// becomes an uplink batch: the bridge takes batch frames of `MAX_BATCH_FRAME` (16 MiB) at most, and a
/// batch of large messages zstd cannot shrink (camera frames) is about as big compressed as raw.
/// A read stops after the record that reaches this bound, and no message is larger than
/// `MAX_MESSAGE_BYTES` (the config refuses a bigger `broker.max_packet_size` with an uplink), so
/// a read's messages stay under the frame limit. It also bounds what a read holds in memory,
/// which `batch_records` alone did not: 512 records of 1 MiB.
pub(crate) const READ_BYTES: u64 = (shared::proto::MAX_BATCH_FRAME - shared::proto::MAX_MESSAGE_BYTES) as u64;

/// Bytes a message takes in a record, roughly: what eviction counts.
fn estimated_size(m: &Message) -> u64 {
    (m.payload.len() + m.topic.len() + m.class.len() + 64) as u64
}

/// Sorted seqs as inclusive ranges: `[1, 2, 3, 7]` is `[(1, 3), (7, 7)]`.
fn ranges(seqs: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &s in seqs {
        match out.last_mut() {
            Some((_, end)) if *end + 1 == s => *end = s,
            _ => out.push((s, s)),
        }
    }
    out
}

#[cfg(test)]
mod model_tests;
