//! Fault injection for the spool's storage, for tests: SQLite cannot be made to run out of disk
//! or fail an fsync on demand, so a wrapper returns the errors it would. The node can be started
//! over it (`NodeOptions::spool_faults`, in `lib.rs`) to check that such failures are reported and that local
//! traffic keeps flowing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use std::collections::BTreeMap;

use super::salvage::Salvaged;
use super::{ClassUsage, Durability, Lane, Lost, Opened, Record, Seq, SpoolError, Storage};

/// What the next failing write reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `SQLITE_FULL`: the disk (or the file system quota) is full.
    DiskFull,
    /// `SQLITE_IOERR_FSYNC`: the data could not be made durable.
    FsyncFailed,
}

/// A handle to switch faults on and off while the storage is in use.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    remaining: Arc<AtomicU32>,
    kind: Arc<AtomicU8>,
}

impl Faults {
    /// Fails the next `writes` commits and acks with `fault`.
    pub fn fail(&self, fault: Fault, writes: u32) {
        self.kind.store(fault as u8, Ordering::SeqCst);
        self.remaining.store(writes, Ordering::SeqCst);
    }

    /// Lets writes through again.
    pub fn clear(&self) {
        self.remaining.store(0, Ordering::SeqCst);
    }

    fn take(&self) -> Option<Fault> {
        self.remaining.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).ok()?;
        Some(if self.kind.load(Ordering::SeqCst) == Fault::DiskFull as u8 {
            Fault::DiskFull
        } else {
            Fault::FsyncFailed
        })
    }

    fn check(&self, path: &str) -> Result<(), SpoolError> {
        let code = match self.take() {
            None => return Ok(()),
            Some(Fault::DiskFull) => rusqlite::ffi::SQLITE_FULL,
            Some(Fault::FsyncFailed) => rusqlite::ffi::SQLITE_IOERR_FSYNC,
        };
        Err(SpoolError::Sqlite {
            path: path.into(),
            source: rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None),
        })
    }
}

/// A storage whose writes fail while its [`Faults`] say so.
#[derive(Debug)]
pub(crate) struct FaultyStorage<S> {
    pub inner: S,
    pub faults: Faults,
    /// Named in the errors, as the real path would be.
    pub path: String,
}

impl<S: Storage> Storage for FaultyStorage<S> {
    fn opened(&self) -> &Opened {
        self.inner.opened()
    }
    fn commit(
        &mut self,
        records: &[Record],
        next: &[(Lane, Seq)],
        delete: &[Lost],
        d: Durability,
    ) -> Result<(), SpoolError> {
        self.faults.check(&self.path)?;
        self.inner.commit(records, next, delete, d)
    }
    fn read(&mut self, lane: Lane, after: Seq, limit: usize) -> Result<Vec<Record>, SpoolError> {
        self.inner.read(lane, after, limit)
    }
    fn ack(&mut self, lane: Lane, up_to: Seq) -> Result<Vec<ClassUsage>, SpoolError> {
        self.faults.check(&self.path)?;
        self.inner.ack(lane, up_to)
    }
    fn used_bytes(&mut self) -> Result<u64, SpoolError> {
        self.inner.used_bytes()
    }
    fn oldest(&mut self, lane: Lane, class: Option<&str>, bytes: u64) -> Result<Vec<Lost>, SpoolError> {
        self.inner.oldest(lane, class, bytes)
    }
    fn expired(&mut self, now_ms: u64) -> Result<Vec<Lost>, SpoolError> {
        self.inner.expired(now_ms)
    }
    fn lanes_with_evictable(&mut self) -> Result<Vec<Lane>, SpoolError> {
        self.inner.lanes_with_evictable()
    }
    fn oldest_enqueued_ms(&mut self, lane: Lane) -> Result<Option<u64>, SpoolError> {
        self.inner.oldest_enqueued_ms(lane)
    }
    fn compact(&mut self) -> Result<(), SpoolError> {
        self.inner.compact()
    }
    fn close_cleanly(&mut self, usage: &[ClassUsage]) -> Result<(), SpoolError> {
        self.faults.check(&self.path)?;
        self.inner.close_cleanly(usage)
    }
    fn suspect(&self, lane: Lane) -> Option<(Seq, Option<Seq>)> {
        self.inner.suspect(lane)
    }
    fn suspects(&self) -> Vec<Lane> {
        self.inner.suspects()
    }
    fn clear_suspect(&mut self, lane: Lane) -> Result<(), SpoolError> {
        self.faults.check(&self.path)?;
        self.inner.clear_suspect(lane)
    }
    fn renumber(&mut self, lane: Lane, from: Seq, by: u64) -> Result<(), SpoolError> {
        self.faults.check(&self.path)?;
        self.inner.renumber(lane, from, by)
    }
    fn damaged(&self) -> Option<String> {
        self.inner.damaged()
    }
    fn forget_receipts(&mut self, keys: &[u64], keep: bool) -> Result<(), SpoolError> {
        self.faults.check(&self.path)?;
        self.inner.forget_receipts(keys, keep)
    }

    fn rebuild(&mut self, known: &BTreeMap<u8, u64>) -> Result<Salvaged, SpoolError> {
        self.faults.check(&self.path)?;
        self.inner.rebuild(known)
    }
}

/// A boxed storage is a storage, so the node can run over a fault-injecting wrapper in tests.
impl Storage for Box<dyn Storage + Send> {
    fn opened(&self) -> &Opened {
        (**self).opened()
    }
    fn commit(
        &mut self,
        records: &[Record],
        next: &[(Lane, Seq)],
        delete: &[Lost],
        d: Durability,
    ) -> Result<(), SpoolError> {
        (**self).commit(records, next, delete, d)
    }
    fn read(&mut self, lane: Lane, after: Seq, limit: usize) -> Result<Vec<Record>, SpoolError> {
        (**self).read(lane, after, limit)
    }
    fn ack(&mut self, lane: Lane, up_to: Seq) -> Result<Vec<ClassUsage>, SpoolError> {
        (**self).ack(lane, up_to)
    }
    fn used_bytes(&mut self) -> Result<u64, SpoolError> {
        (**self).used_bytes()
    }
    fn oldest(&mut self, lane: Lane, class: Option<&str>, bytes: u64) -> Result<Vec<Lost>, SpoolError> {
        (**self).oldest(lane, class, bytes)
    }
    fn expired(&mut self, now_ms: u64) -> Result<Vec<Lost>, SpoolError> {
        (**self).expired(now_ms)
    }
    fn lanes_with_evictable(&mut self) -> Result<Vec<Lane>, SpoolError> {
        (**self).lanes_with_evictable()
    }
    fn oldest_enqueued_ms(&mut self, lane: Lane) -> Result<Option<u64>, SpoolError> {
        (**self).oldest_enqueued_ms(lane)
    }
    fn compact(&mut self) -> Result<(), SpoolError> {
        (**self).compact()
    }
    fn close_cleanly(&mut self, usage: &[ClassUsage]) -> Result<(), SpoolError> {
        (**self).close_cleanly(usage)
    }
    fn suspect(&self, lane: Lane) -> Option<(Seq, Option<Seq>)> {
        (**self).suspect(lane)
    }
    fn suspects(&self) -> Vec<Lane> {
        (**self).suspects()
    }
    fn clear_suspect(&mut self, lane: Lane) -> Result<(), SpoolError> {
        (**self).clear_suspect(lane)
    }
    fn renumber(&mut self, lane: Lane, from: Seq, by: u64) -> Result<(), SpoolError> {
        (**self).renumber(lane, from, by)
    }
    fn damaged(&self) -> Option<String> {
        (**self).damaged()
    }
    fn forget_receipts(&mut self, keys: &[u64], keep: bool) -> Result<(), SpoolError> {
        (**self).forget_receipts(keys, keep)
    }

    fn rebuild(&mut self, known: &BTreeMap<u8, u64>) -> Result<Salvaged, SpoolError> {
        (**self).rebuild(known)
    }
}
