//! What a config section's own check reports: one [`Problem`] per wrong key, gathered in
//! [`Problems`]. Every section of both binaries checks itself with one signature,
//! `check(&self, &mut Problems)` (with what else it needs to know after it), and each binary's
//! `config` collects them for the whole file, so no subsystem imports `config`.

use std::fmt;
#[cfg(feature = "fs")]
use std::path::Path;

/// One thing wrong with a config file, with the key it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

/// The problems found so far, in the order they were found.
#[derive(Debug, Default)]
pub struct Problems(Vec<Problem>);

impl Problems {
    pub fn bad(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.0.push(Problem { key: key.into(), reason: reason.into() });
    }

    /// A problem at `key` unless `path` is a file that can be read for its metadata (feature
    /// `fs`: the crate does no I/O without it).
    #[cfg(feature = "fs")]
    pub fn file(&mut self, key: impl Into<String>, path: &Path) {
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => {}
            Ok(_) => self.bad(key, format!("{} is not a file", path.display())),
            Err(e) => self.bad(key, format!("{}: {e}", path.display())),
        }
    }

    pub fn into_vec(self) -> Vec<Problem> {
        self.0
    }
}

impl Problems {
    /// The first problem found, if any.
    pub fn first(self) -> Option<Problem> {
        self.0.into_iter().next()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
