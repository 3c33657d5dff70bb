//! Model versions on the edge: a chunk cache that survives restarts, and staging.
//!
//! Invariants (guarantee 6 in docs/ARCHITECTURE.md):
//! - a chunk enters the cache only if its bytes hash to its name; a bad one is refused, counted
//!   by the caller and fetched again, never used;
//! - a version becomes visible (`<dir>/<name>/<version>`, then the `current` link) only after
//!   its manifest verified against the fleet key, every chunk verified again while the file is
//!   assembled, and the file is fsynced and renamed into place; the `current` link is switched
//!   by renaming a new link over it, so a reader sees the old version or the new, never half;
//! - a failure while staging (a missing or bad chunk, a full disk) removes the partial file
//!   and leaves `current` where it was; the cache keeps what it had, so a retry resumes.
//!
//! Layout: `<dir>/cache/<sha256>` chunks; `<dir>/<name>/<version>` files with
//! `<version>.manifest` beside them (the signed manifest, kept for `models list` and to
//! re-verify); `<dir>/<name>/current` a symlink to the current version's file name.

pub(crate) mod announce;
mod config;
pub(crate) mod sync;

pub use config::ModelsConfig;

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shared::model::{ChunkRef, Manifest, ModelError, SignedManifest, verify_chunk};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("chunk {index} ({hash}) is not in the cache")]
    MissingChunk { index: usize, hash: String },
    #[error("no model {0}")]
    NoModel(String),
    #[error("{0} has no version before the current one to roll back to")]
    NothingToRollBack(String),
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StageError + 'a {
    move |source| StageError::Io { what, path: path.to_owned(), source }
}

/// Content-addressed chunks, verified on the way in.
#[derive(Debug, Clone)]
pub struct ChunkCache {
    dir: PathBuf,
}

impl ChunkCache {
    pub(crate) fn open(dir: &Path) -> Result<Self, StageError> {
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        Ok(Self { dir: dir.to_owned() })
    }

    fn path(&self, hash: &str) -> PathBuf {
        self.dir.join(hash)
    }

    pub(crate) fn has(&self, c: &ChunkRef) -> bool {
        std::fs::metadata(self.path(&c.hash)).is_ok_and(|m| m.len() == c.size)
    }

    /// Stores chunk `index` of a manifest after checking its bytes against `c`.
    pub fn put(&self, index: usize, c: &ChunkRef, bytes: &[u8]) -> Result<(), StageError> {
        verify_chunk(index, c, bytes)?;
        write_durably(&self.path(&c.hash), |f| f.write_all(bytes))
    }

    pub(crate) fn get(&self, c: &ChunkRef) -> Result<Option<Vec<u8>>, StageError> {
        match std::fs::read(self.path(&c.hash)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read", &self.path(&c.hash))(e)),
        }
    }

    /// The chunks of `m` the cache lacks, with their index: what to fetch.
    pub fn missing<'a>(&self, m: &'a Manifest) -> Vec<(usize, &'a ChunkRef)> {
        let mut seen = std::collections::HashSet::new();
        m.chunks.iter().enumerate().filter(|(_, c)| seen.insert(&c.hash) && !self.has(c)).collect()
    }

    /// Bytes the cache holds.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|d| d.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    }

    /// Removes chunks not in `keep` until the cache holds at most `budget` bytes, oldest first.
    pub(crate) fn trim(&self, budget: u64, keep: &std::collections::HashSet<String>) -> u64 {
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = std::fs::read_dir(&self.dir)
            .map(|d| {
                d.filter_map(|e| {
                    let e = e.ok()?;
                    let m = e.metadata().ok()?;
                    Some((m.modified().ok()?, m.len(), e.path()))
                })
                .collect()
            })
            .unwrap_or_default();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort();
        let mut freed = 0;
        for (_, len, path) in entries {
            if total <= budget {
                break;
            }
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if keep.contains(name) {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
                freed += len;
            }
        }
        freed
    }
}

fn write_durably(path: &Path, fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>) -> Result<(), StageError> {
    shared::fs::write_durably(path, fill).map_err(io("write", path))
}

/// The file beside a model's versions holding the creation time of the newest one ever staged;
/// `~` is in no version's name (`shared::model::valid_name`), so none can take it.
const NEWEST: &str = "~newest";

/// Why an announced version is not staged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Staged,
    Older {
        newest_ms: u64,
    },
    /// A schema version numbered below one staged here.
    Lower {
        highest: u32,
    },
}

/// What local apps are told of a model: the retained message's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Current {
    pub name: String,
    pub version: String,
    pub path: PathBuf,
    pub sha256: String,
    pub size: u64,
}

/// The staged model versions under one directory.
#[derive(Debug, Clone)]
pub struct Models {
    dir: PathBuf,
    public_key: Vec<u8>,
    keep: usize,
}

impl Models {
    pub fn open(dir: &Path, public_key: Vec<u8>, keep: usize) -> Result<Self, StageError> {
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        Ok(Self { dir: dir.to_owned(), public_key, keep: keep.max(1) })
    }

    pub fn cache(&self) -> Result<ChunkCache, StageError> {
        ChunkCache::open(&self.dir.join("cache"))
    }

    /// Checks a signed manifest against the fleet key.
    pub fn verify(&self, signed: &SignedManifest) -> Result<Manifest, StageError> {
        Ok(signed.verify(&self.public_key)?)
    }

    /// Assembles `signed`'s file from the cache, verifying every chunk, then makes it current.
    /// `write` is where the bytes go through (the file; tests put a disk that fills up there).
    pub fn stage(&self, signed: &SignedManifest, cache: &ChunkCache) -> Result<Current, StageError> {
        self.stage_through(signed, cache, |f, bytes| f.write_all(bytes))
    }

    pub(crate) fn stage_through(
        &self,
        signed: &SignedManifest,
        cache: &ChunkCache,
        mut write: impl FnMut(&mut std::fs::File, &[u8]) -> std::io::Result<()>,
    ) -> Result<Current, StageError> {
        let m = self.verify(signed)?;
        let model_dir = self.dir.join(&m.name);
        std::fs::create_dir_all(&model_dir).map_err(io("create", &model_dir))?;
        let target = model_dir.join(&m.version);
        let mut hasher = ring::digest::Context::new(&ring::digest::SHA256);
        let mut failure = None;
        write_durably(&target, |f| {
            for (index, c) in m.chunks.iter().enumerate() {
                let Some(bytes) = cache.get(c).map_err(std::io::Error::other)? else {
                    failure = Some(StageError::MissingChunk { index, hash: c.hash.clone() });
                    return Err(std::io::Error::other("missing chunk"));
                };
                if let Err(e) = verify_chunk(index, c, &bytes) {
                    // A cached chunk that no longer matches is dropped, to be fetched again.
                    let _ = std::fs::remove_file(cache.path(&c.hash));
                    failure = Some(e.into());
                    return Err(std::io::Error::other("bad chunk"));
                }
                hasher.update(&bytes);
                write(f, &bytes)?;
            }
            Ok(())
        })
        .map_err(|e| failure.take().unwrap_or(e))?;
        write_durably(&model_dir.join(format!("{}.manifest", m.version)), |f| f.write_all(&signed.to_bytes()))?;
        // The newest ever staged outlives its file (pruned, deleted): a replayed older
        // manifest is refused against it.
        if self.kept_newest_ms(&m.name).is_none_or(|ms| ms < m.created_ms) {
            write_durably(&model_dir.join(NEWEST), |f| f.write_all(m.created_ms.to_string().as_bytes()))?;
        }
        self.switch(&m.name, &m.version)?;
        self.prune(&m.name);
        Ok(Current {
            name: m.name.clone(),
            version: m.version.clone(),
            path: target,
            sha256: shared::model::hex(hasher.finish().as_ref()),
            size: m.size,
        })
    }

    /// Points `current` at `version` by renaming a new link over the old one.
    fn switch(&self, name: &str, version: &str) -> Result<(), StageError> {
        let model_dir = self.dir.join(name);
        let tmp = model_dir.join(".current.tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(version, &tmp).map_err(io("link", &tmp))?;
        let current = model_dir.join("current");
        std::fs::rename(&tmp, &current).map_err(io("rename to", &current))?;
        std::fs::File::open(&model_dir).and_then(|d| d.sync_all()).map_err(io("sync", &model_dir))
    }

    /// Versions of `name` staged here, oldest first (by manifest creation time).
    pub fn versions(&self, name: &str) -> Vec<Manifest> {
        let dir = self.dir.join(name);
        let mut out: Vec<Manifest> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let path = e.ok()?.path();
                if path.extension()? != "manifest" {
                    return None;
                }
                let signed = SignedManifest::from_bytes(&std::fs::read(&path).ok()?).ok()?;
                let m = signed.verify(&self.public_key).ok()?;
                dir.join(&m.version).is_file().then_some(m)
            })
            .collect();
        out.sort_by(|a, b| (a.created_ms, &a.version).cmp(&(b.created_ms, &b.version)));
        out
    }

    /// Model names staged here.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                (name != "cache" && e.path().join("current").exists()).then_some(name)
            })
            .collect();
        names.sort();
        names
    }

    /// The creation time of the newest version of `name` ever staged here, kept in
    /// `<dir>/<name>/~newest` across pruning and deleted versions.
    pub(crate) fn newest_staged_ms(&self, name: &str) -> Option<u64> {
        let held = self.versions(name).last().map(|m| m.created_ms);
        held.max(self.kept_newest_ms(name))
    }

    fn kept_newest_ms(&self, name: &str) -> Option<u64> {
        std::fs::read_to_string(self.dir.join(name).join(NEWEST)).ok().and_then(|t| t.trim().parse().ok())
    }

    /// Whether an announced version may be staged: `Err` says why not (staged already, or
    /// older than the newest ever staged here: a signed manifest replayed to downgrade the
    /// edge). The operator's own rollback (`edge-node models rollback`) is not a staging.
    pub(crate) fn admits(&self, m: &Manifest) -> Result<(), Refusal> {
        if self.has_version(&m.name, &m.version) {
            return Err(Refusal::Staged);
        }
        // A schema's versions are numbered by the registry in the order they were registered:
        // the highest is the newest whenever each arrived (a delivery that failed and was made
        // again later is created later, and is still the older version).
        if m.name.starts_with(shared::model::SCHEMA_PREFIX)
            && let Ok(number) = m.version.parse::<u32>()
        {
            let highest = self.versions(&m.name).iter().filter_map(|v| v.version.parse::<u32>().ok()).max();
            if let Some(highest) = highest.filter(|h| *h > number) {
                return Err(Refusal::Lower { highest });
            }
        }
        match self.newest_staged_ms(&m.name) {
            Some(newest) if newest > m.created_ms => Err(Refusal::Older { newest_ms: newest }),
            _ => Ok(()),
        }
    }

    /// Whether `version` of `name` is staged here (file and manifest).
    pub(crate) fn has_version(&self, name: &str, version: &str) -> bool {
        let dir = self.dir.join(name);
        dir.join(version).is_file() && dir.join(format!("{version}.manifest")).is_file()
    }

    /// The version `current` points at, read from the link alone.
    pub(crate) fn current_version(&self, name: &str) -> Option<String> {
        let link = std::fs::read_link(self.dir.join(name).join("current")).ok()?;
        Some(link.to_string_lossy().into_owned())
    }

    /// The current version of `name`, re-hashed from its file.
    pub fn current(&self, name: &str) -> Result<Option<Current>, StageError> {
        let Some(version) = self.current_version(name) else { return Ok(None) };
        let path = self.dir.join(name).join(&version);
        let bytes = std::fs::read(&path).map_err(io("read", &path))?;
        Ok(Some(Current {
            name: name.into(),
            version,
            size: bytes.len() as u64,
            sha256: shared::model::chunk_hash(&bytes),
            path,
        }))
    }

    /// Makes the version before the current one current again.
    pub fn rollback(&self, name: &str) -> Result<Current, StageError> {
        let current = self.current_version(name).ok_or_else(|| StageError::NoModel(name.into()))?;
        let versions = self.versions(name);
        let at = versions.iter().position(|m| m.version == current);
        let previous = match at {
            Some(i) if i > 0 => &versions[i - 1],
            _ => return Err(StageError::NothingToRollBack(name.into())),
        };
        self.switch(name, &previous.version)?;
        self.current(name)?.ok_or_else(|| StageError::NoModel(name.into()))
    }

    /// Keeps the newest `keep` versions and the current one.
    fn prune(&self, name: &str) {
        let current = self.current_version(name);
        let versions = self.versions(name);
        let excess = versions.len().saturating_sub(self.keep);
        for m in versions.into_iter().take(excess) {
            if Some(&m.version) == current.as_ref() {
                continue;
            }
            let dir = self.dir.join(name);
            let _ = std::fs::remove_file(dir.join(&m.version));
            let _ = std::fs::remove_file(dir.join(format!("{}.manifest", m.version)));
        }
    }
}

#[cfg(test)]
mod tests;
