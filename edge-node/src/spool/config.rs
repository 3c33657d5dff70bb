//! `[spool]`: where the spool lives, its budget and its group commits.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use shared::units::{ByteSize, HumanDuration};

use shared::check::Problems;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SpoolConfig {
    /// The SQLite database. Default: `spool/spool.db` beside the config file.
    #[serde(default = "default_spool_path")]
    pub path: PathBuf,
    /// Bytes on disk the spool may take (database, index and WAL). Default: 256 MiB.
    #[serde(default = "default_spool_budget")]
    pub budget: ByteSize,
    /// Longest a `normal` message waits for its group commit. Default: 5ms.
    #[serde(default = "default_commit_interval")]
    pub commit_interval: HumanDuration,
    /// Most records in one commit. Default: 1024.
    #[serde(default = "default_commit_batch")]
    pub commit_batch: usize,
    /// Bytes of messages held in memory while commits fail (a full disk, a failing card); past
    /// it the oldest `normal` ones are dropped, recorded as a `refused` gap once the disk takes
    /// writes again. Default: 64 MiB.
    #[serde(default = "default_max_pending_bytes")]
    pub max_pending_bytes: ByteSize,
}

impl Default for SpoolConfig {
    fn default() -> Self {
        Self {
            path: default_spool_path(),
            budget: default_spool_budget(),
            commit_interval: default_commit_interval(),
            commit_batch: default_commit_batch(),
            max_pending_bytes: default_max_pending_bytes(),
        }
    }
}

impl SpoolConfig {
    pub fn check(&self, p: &mut Problems) {
        if self.budget.bytes() < 64 * 1024 {
            p.bad("spool.budget", format!("{} is under the 64 KiB minimum", self.budget));
        }
        if self.commit_batch == 0 {
            p.bad("spool.commit_batch", "must be at least 1");
        }
        if self.max_pending_bytes.bytes() == 0 {
            p.bad("spool.max_pending_bytes", "must be more than 0 bytes");
        }
    }
}

fn default_spool_path() -> PathBuf {
    PathBuf::from("spool/spool.db")
}
fn default_spool_budget() -> ByteSize {
    ByteSize::mib(256)
}
fn default_commit_interval() -> HumanDuration {
    HumanDuration::from_millis(5)
}
fn default_commit_batch() -> usize {
    1024
}
fn default_max_pending_bytes() -> ByteSize {
    ByteSize::mib(64)
}
