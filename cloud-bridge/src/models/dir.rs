//! The embedded model store: a directory. `chunks/<first two hex digits>/<sha256>` holds each
//! chunk once; `manifests/<name>/<version>.manifest` each signed manifest. Every file is
//! written with `shared::fs::write_durably`, so a crash leaves either the whole file or none.

use std::path::{Path, PathBuf};

use shared::model::{Manifest, SignedManifest};

use super::{Listed, ModelStore, StoreError, failed};

#[derive(Debug, Clone)]
pub struct DirStore {
    root: PathBuf,
}

impl DirStore {
    pub fn open(root: &Path) -> Result<Self, StoreError> {
        for sub in ["chunks", "manifests"] {
            std::fs::create_dir_all(root.join(sub)).map_err(|e| failed("open", format!("{}: {e}", root.display())))?;
        }
        Ok(Self { root: root.to_owned() })
    }

    fn chunk_path(&self, hash: &str) -> Result<PathBuf, StoreError> {
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(failed("chunk", format!("{hash:?} is not a SHA-256 in hex")));
        }
        Ok(self.root.join("chunks").join(&hash[..2]).join(hash))
    }

    fn manifest_path(&self, name: &str, version: &str) -> Result<PathBuf, StoreError> {
        shared::model::valid_name("name", name)?;
        shared::model::valid_name("version", version)?;
        Ok(self.root.join("manifests").join(name).join(format!("{version}.manifest")))
    }

    fn manifests(&self) -> Result<Vec<Manifest>, StoreError> {
        let mut out = Vec::new();
        let dir = self.root.join("manifests");
        for model in std::fs::read_dir(&dir).map_err(|e| failed("list", format!("{}: {e}", dir.display())))? {
            let model = model.map_err(|e| failed("list", e))?.path();
            for entry in std::fs::read_dir(&model).map_err(|e| failed("list", format!("{}: {e}", model.display())))? {
                let path = entry.map_err(|e| failed("list", e))?.path();
                if path.extension().is_none_or(|e| e != "manifest") {
                    continue;
                }
                // One unreadable manifest must not hide every other version.
                let read = std::fs::read(&path)
                    .map_err(|e| failed("read", format!("{}: {e}", path.display())))
                    .and_then(|b| Ok(SignedManifest::from_bytes(&b)?.unverified()?));
                match read {
                    Ok(m) => out.push(m),
                    Err(e) => tracing::warn!(path = %path.display(), error = %e, "manifest skipped"),
                }
            }
        }
        out.sort_by(|a, b| (&a.name, a.created_ms, &a.version).cmp(&(&b.name, b.created_ms, &b.version)));
        Ok(out)
    }
}

fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(path.parent().expect("store paths have a parent"))?;
    shared::fs::write_durably(path, |f| f.write_all(bytes))
}

impl ModelStore for DirStore {
    async fn has_chunk(&self, hash: &str) -> Result<bool, StoreError> {
        Ok(self.chunk_path(hash)?.exists())
    }

    async fn put_chunk(&self, hash: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.chunk_path(hash)?;
        if path.exists() {
            return Ok(());
        }
        if shared::model::chunk_hash(bytes) != hash {
            return Err(failed("chunk", format!("bytes do not hash to {hash}")));
        }
        let (path2, bytes) = (path.clone(), bytes.to_vec());
        tokio::task::spawn_blocking(move || write_durably(&path2, &bytes))
            .await
            .map_err(|e| failed("chunk", e))?
            .map_err(|e| failed("chunk", format!("{}: {e}", path.display())))
    }

    async fn get_chunk(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match tokio::fs::read(self.chunk_path(hash)?).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(failed("chunk", format!("{hash}: {e}"))),
        }
    }

    async fn put_manifest(&self, m: &Manifest, signed: &SignedManifest) -> Result<(), StoreError> {
        let path = self.manifest_path(&m.name, &m.version)?;
        let bytes = signed.to_bytes();
        tokio::task::spawn_blocking(move || {
            write_durably(&path, &bytes).map_err(|e| failed("manifest", format!("{}: {e}", path.display())))
        })
        .await
        .map_err(|e| failed("manifest", e))?
    }

    async fn get_manifest(&self, name: &str, version: &str) -> Result<Option<SignedManifest>, StoreError> {
        match tokio::fs::read(self.manifest_path(name, version)?).await {
            Ok(bytes) => Ok(Some(SignedManifest::from_bytes(&bytes)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(failed("manifest", format!("{name} {version}: {e}"))),
        }
    }

    async fn list(&self) -> Result<Vec<Listed>, StoreError> {
        Ok(self.manifests()?.into_iter().map(Listed::from).collect())
    }

    async fn remove(&self, name: &str, version: &str) -> Result<usize, StoreError> {
        let path = self.manifest_path(name, version)?;
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::Missing { name: name.into(), version: version.into() });
            }
            Err(e) => return Err(failed("remove", format!("{}: {e}", path.display()))),
        }
        if let Some(dir) = path.parent() {
            let _ = std::fs::remove_dir(dir); // only when it was the last version
        }
        // Chunks no remaining manifest names are garbage now.
        let keep: std::collections::HashSet<String> =
            self.manifests()?.into_iter().flat_map(|m| m.chunks.into_iter().map(|c| c.hash)).collect();
        let mut removed = 0;
        let chunks = self.root.join("chunks");
        for prefix in std::fs::read_dir(&chunks).map_err(|e| failed("remove", e))? {
            let prefix = prefix.map_err(|e| failed("remove", e))?.path();
            for entry in std::fs::read_dir(&prefix).map_err(|e| failed("remove", e))? {
                let p = entry.map_err(|e| failed("remove", e))?.path();
                let hash = p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
                if !keep.contains(&hash) && std::fs::remove_file(&p).is_ok() {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}
