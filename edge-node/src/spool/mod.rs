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
//! - Each database has a random `epoch`, made when the database is created. A reinstall, or a
//!   corrupt database moved aside, starts a new epoch, so a restarted seq can never be mistaken
//!   for data the cloud already has (the cloud keys by edge, epoch, lane and seq).
//!
//! # On disk (schema version 1)
//!
//! - `meta(key, value)`: `schema_version`, `epoch` (16 random bytes, hex), `created_ms`.
//! - `lanes(lane, next_seq, acked)`: per lane, the next seq to hand out and the highest acked.
//! - `records(lane, seq, kind, class, topic, payload, qos, enqueued_ms, expires_ms,
//!   user_properties, correlation_data, content_type)`, primary key `(lane, seq)`, without rowid,
//!   so a lane is read in seq order straight from the key.
//!
//! # Recovery
//!
//! Opening runs `PRAGMA quick_check`. A database that fails it, or that SQLite cannot open as a
//! database at all, is renamed to `<name>.corrupt-<unix-ms>` (with its WAL and shared-memory
//! files) and reported; a fresh database with a new epoch takes its place. Nothing is ever
//! deleted to recover. A schema version newer than this build is refused rather than guessed at.
//!
//! This module owns the spool's files; it does not know about MQTT connections or the uplink,
//! which call it through [`Spool`].

mod sqlite;

use std::collections::BTreeMap;
use std::path::PathBuf;

use bytes::Bytes;

pub use sqlite::SqliteStorage;

/// A priority lane. Lower numbers drain first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lane(pub u8);

/// A record's position in its lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(pub u64);

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

/// A spooled message with its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub lane: Lane,
    pub seq: Seq,
    pub message: Message,
}

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool database {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("spool database {path} has schema version {found}; this build knows up to {known}")]
    NewerSchema { path: PathBuf, found: i64, known: i64 },
    #[error("spool directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a storage holds after opening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub epoch: String,
    /// Per lane: next seq to hand out, highest acked seq.
    pub lanes: Vec<(Lane, Seq, Seq)>,
    /// Set when a corrupt database was moved aside to this path.
    pub moved_aside: Option<PathBuf>,
}

/// Where records live. SQLite in production; tests add fault-injecting wrappers.
pub trait Storage {
    fn opened(&self) -> &Opened;
    /// Writes `records` and the lanes' next seqs in one transaction.
    fn commit(
        &mut self,
        records: &[Record],
        next_seqs: &[(Lane, Seq)],
        durability: Durability,
    ) -> Result<(), SpoolError>;
    /// Up to `limit` records of `lane` with seq above `after`, in seq order.
    fn read(&mut self, lane: Lane, after: Seq, limit: usize) -> Result<Vec<Record>, SpoolError>;
    /// Deletes `lane`'s records at or below `up_to` and records the ack; returns how many.
    fn ack(&mut self, lane: Lane, up_to: Seq) -> Result<u64, SpoolError>;
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
    lanes: BTreeMap<Lane, LaneState>,
    pending: Vec<Record>,
    pending_durability: Durability,
}

impl<S: Storage> Spool<S> {
    pub fn new(storage: S) -> Self {
        let lanes = storage
            .opened()
            .lanes
            .iter()
            .map(|(lane, next, acked)| (*lane, LaneState { next: next.0, committed: next.0, acked: acked.0 }))
            .collect();
        Self { storage, lanes, pending: Vec::new(), pending_durability: Durability::Normal }
    }

    pub fn epoch(&self) -> &str {
        &self.storage.opened().epoch
    }

    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// Queues a message for the next commit and returns its seq. Seqs start at 1.
    pub fn append(&mut self, lane: Lane, message: Message, durability: Durability) -> Seq {
        let state = self.lanes.entry(lane).or_default();
        state.next = state.next.max(1);
        let seq = Seq(state.next);
        state.next += 1;
        self.pending_durability = self.pending_durability.max(durability);
        self.pending.push(Record { lane, seq, message });
        seq
    }

    /// Records appended and not yet committed.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Commits everything appended so far in one transaction.
    pub fn flush(&mut self) -> Result<(), SpoolError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut next: Vec<(Lane, Seq)> = Vec::new();
        for r in &self.pending {
            match next.iter_mut().find(|(l, _)| *l == r.lane) {
                Some((_, s)) => *s = Seq(s.0.max(r.seq.0 + 1)),
                None => next.push((r.lane, Seq(r.seq.0 + 1))),
            }
        }
        match self.storage.commit(&self.pending, &next, self.pending_durability) {
            Ok(()) => {
                for (lane, seq) in next {
                    if let Some(state) = self.lanes.get_mut(&lane) {
                        state.committed = state.committed.max(seq.0);
                    }
                }
                self.pending.clear();
                self.pending_durability = Durability::Normal;
                Ok(())
            }
            Err(e) => {
                // Keep the batch: the caller may retry, and nothing it was told is lost yet.
                Err(e)
            }
        }
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
        Ok(deleted)
    }

    /// Highest acked seq per lane.
    pub fn acked(&self, lane: Lane) -> Seq {
        Seq(self.lanes.get(&lane).map_or(0, |s| s.acked))
    }
}

#[cfg(test)]
mod model_tests;
