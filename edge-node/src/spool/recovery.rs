//! Spools of other epochs waiting to be sent: a database moved aside by an earlier version
//! (which started a new epoch rather than salvage), one whose salvage could not keep its epoch,
//! one copied off a replaced gateway. `edge-node spool recover FILE` salvages FILE
//! (`salvage.rs`) into `recover/<epoch>.db` beside the spool; the uplink sends each such spool,
//! oldest first, in a session of its own epoch (so the cloud's marks of that epoch apply and
//! nothing it already holds is stored twice), then deletes it once the cloud acknowledged
//! everything in it ([`finish`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::salvage::{Salvaged, salvage};
use super::{Spool, SpoolError, SpoolWriter, SqliteStorage, Storage, WriterMetrics};

/// Where spools waiting to be sent live: `recover/` beside the spool's database.
pub(crate) fn dir(spool: &Path) -> PathBuf {
    spool.with_file_name("recover")
}

/// Why a file could not be queued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoverError {
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{file} has epoch {epoch}, the running spool's: what can be read of it is in the spool already (it was salvaged into it)"
    )]
    SameEpoch { file: PathBuf, epoch: String },
    #[error("a spool of epoch {epoch} is already waiting to be sent: {waiting}")]
    Waiting { epoch: String, waiting: PathBuf },
    #[error("nothing in {file} could be read, not even its epoch: there is nothing to send under it")]
    Unreadable { file: PathBuf },
}

/// Salvages `file` into the recovery queue of the spool at `spool`. Returns what it holds and
/// where it waits.
pub fn queue(file: &Path, spool: &Path) -> Result<(Salvaged, PathBuf), RecoverError> {
    let dir = dir(spool);
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| RecoverError::Io { path: path.clone(), source }
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let tmp = dir.join(format!("incoming-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let salvaged = salvage(file, &tmp, &BTreeMap::new());
    let cleanup = || {
        for extra in ["", "-wal", "-shm"] {
            let mut p = tmp.as_os_str().to_owned();
            p.push(extra);
            let _ = std::fs::remove_file(PathBuf::from(p));
        }
    };
    let salvaged = match salvaged {
        Ok(s) => s,
        Err(e) => {
            cleanup();
            return Err(e.into());
        }
    };
    let Some(epoch) = salvaged.epoch.clone() else {
        cleanup();
        return Err(RecoverError::Unreadable { file: file.to_owned() });
    };
    if current_epoch(spool).as_deref() == Some(epoch.as_str()) {
        cleanup();
        return Err(RecoverError::SameEpoch { file: file.to_owned(), epoch });
    }
    let target = dir.join(format!("{epoch}.db"));
    if target.exists() {
        cleanup();
        return Err(RecoverError::Waiting { epoch, waiting: target });
    }
    std::fs::rename(&tmp, &target).map_err(io(&target))?;
    std::fs::File::open(&dir).and_then(|d| d.sync_all()).map_err(io(&dir))?;
    Ok((salvaged, target))
}

/// The epoch of the spool at `path`, if there is one and it can be read.
fn current_epoch(path: &Path) -> Option<String> {
    let conn = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
    conn.query_row("SELECT value FROM meta WHERE key = 'epoch'", [], |r| r.get(0)).ok()
}

/// The next spool waiting to be sent, the oldest first.
pub(crate) fn next(spool: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir(spool)).ok()?;
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            let waiting = name.ends_with(".db") && !name.starts_with("incoming-");
            waiting.then(|| (e.metadata().and_then(|m| m.modified()).ok(), e.path()))
        })
        .min()
        .map(|(_, path)| path)
}

/// Opens a waiting spool for sending: its own spool thread, with metrics of its own (not
/// exported: they would fight the running spool's).
pub(crate) fn open(path: &Path) -> Result<SpoolWriter, SpoolError> {
    let storage = SqliteStorage::open(path)?;
    let spool = Spool::new(Box::new(storage) as Box<dyn Storage + Send>).with_closed_epoch();
    let metrics = std::sync::Arc::new(WriterMetrics::new(&mut Default::default()));
    SpoolWriter::start(spool, Duration::from_millis(5), 256, metrics)
        .map_err(|source| SpoolError::Io { path: path.to_owned(), source })
}

/// Everything in the waiting spool at `path` reached the cloud: it goes, with its files.
pub(crate) fn finish(path: &Path) -> std::io::Result<()> {
    for extra in ["", "-wal", "-shm", ".seqs"] {
        let mut p = path.as_os_str().to_owned();
        p.push(extra);
        match std::fs::remove_file(PathBuf::from(p)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Spools an earlier version moved aside without salvaging them (`<spool>.corrupt-<ms>`): their
/// records reach the cloud only through [`queue`] (`edge-node spool recover FILE`).
pub(crate) fn orphans(spool: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (spool.parent(), spool.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let prefix = format!("{name}.corrupt-");
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            let rest = n.strip_prefix(&prefix)?;
            rest.bytes().all(|b| b.is_ascii_digit()).then(|| dir.join(&n))
        })
        .collect();
    found.sort();
    found
}

/// Sets a waiting spool the cloud will not take (its epoch retired there) apart, as
/// `<name>.refused`, so the running spool is not held up behind it.
pub(crate) fn refuse(path: &Path) -> std::io::Result<PathBuf> {
    let target = path.with_extension("refused");
    std::fs::rename(path, &target)?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of the running spool's epoch is refused (its readable records are in the spool
    /// already), so is a second file of an epoch already waiting; what an earlier version moved
    /// aside is found by name, and nothing else is.
    #[test]
    fn queue_refuses_the_running_epoch_and_a_second_copy_and_orphans_are_found_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool.db");
        drop(SqliteStorage::open(&spool).unwrap());
        let other = dir.path().join("spool.db.corrupt-1700000000000");
        drop(SqliteStorage::open(&other).unwrap());
        std::fs::write(dir.path().join("spool.db.corrupt-12-wal"), b"").unwrap();
        std::fs::write(dir.path().join("spool.db.damaged-1"), b"").unwrap();
        assert_eq!(orphans(&spool), std::slice::from_ref(&other));

        assert!(matches!(queue(&spool, &spool), Err(RecoverError::SameEpoch { .. })));
        let (salvaged, queued) = queue(&other, &spool).unwrap();
        assert_eq!(queued, dir.path().join("recover").join(format!("{}.db", salvaged.epoch.unwrap())));
        assert_eq!(next(&spool), Some(queued.clone()));
        assert!(matches!(queue(&other, &spool), Err(RecoverError::Waiting { .. })));
        finish(&queued).unwrap();
        assert_eq!(next(&spool), None);
    }
}
