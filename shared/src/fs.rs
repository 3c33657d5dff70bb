//! Crash-safe file writes, for the model stores on both sides.

use std::fs::File;
use std::io;
use std::path::Path;

/// Writes the file at `path` through `fill`: into a temporary file beside it, fsynced, renamed
/// over `path`, then the directory fsynced. A crash leaves the whole file or none; on error the
/// temporary file is removed and `path` is untouched.
pub fn write_durably(path: &Path, fill: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    fill(tmp.as_file_mut())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    File::open(dir)?.sync_all()
}
