//! Model versions on the cloud side: a store of content-addressed chunks and signed manifests
//! (a directory here; the JetStream object store is the production alternative), and
//! publishing: chunk a file, store the chunks the store lacks, sign and store the manifest.
//!
//! Chunks are shared between versions and models: a version that changes 5 % of a file adds
//! about that much to the store. A manifest is written last, after every chunk it names is
//! durable, so a reader that finds a manifest finds its chunks.

pub mod config;
pub mod dir;
pub(crate) mod js;
pub(crate) mod serve;

use std::future::Future;
use std::path::Path;

use serde::Serialize;
use shared::model::{ChunkError, Manifest, SignedManifest, SigningKey};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("model store {what}: {reason}")]
    Failed { what: &'static str, reason: String },
    #[error(transparent)]
    Model(#[from] shared::model::ModelError),
    #[error("{name} {version} is already published (remove it first to publish it again)")]
    Exists { name: String, version: String },
    #[error("no model {name} {version}")]
    Missing { name: String, version: String },
}

pub(crate) fn failed(what: &'static str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Failed { what, reason: e.to_string() }
}

/// One published version, as `model list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listed {
    pub name: String,
    pub version: String,
    pub size: u64,
    pub chunks: usize,
    pub created_ms: u64,
}

impl From<Manifest> for Listed {
    fn from(m: Manifest) -> Self {
        Listed { chunks: m.chunks.len(), name: m.name, version: m.version, size: m.size, created_ms: m.created_ms }
    }
}

pub trait ModelStore: Send + Sync + 'static {
    fn has_chunk(&self, hash: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Stores a chunk durably under its hash; storing one twice changes nothing.
    fn put_chunk(&self, hash: &str, bytes: &[u8]) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn get_chunk(&self, hash: &str) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send;
    fn put_manifest(
        &self,
        m: &Manifest,
        signed: &SignedManifest,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn get_manifest(
        &self,
        name: &str,
        version: &str,
    ) -> impl Future<Output = Result<Option<SignedManifest>, StoreError>> + Send;
    /// Every version of every model, oldest first within a model.
    fn list(&self) -> impl Future<Output = Result<Vec<Listed>, StoreError>> + Send;
    /// Removes a version, then every chunk no remaining version names. Returns the chunks
    /// removed.
    fn remove(&self, name: &str, version: &str) -> impl Future<Output = Result<usize, StoreError>> + Send;
}

/// The configured store, for the server (the trait's futures are not object-safe).
#[derive(Debug)]
pub enum Store {
    Dir(dir::DirStore),
    Jetstream(Box<js::JsStore>),
}

/// Opens the store `[models]` names: a directory, or a JetStream object store bucket on
/// `sink_nats` (the sink's nats-server, if it has one) unless `url` says otherwise.
pub async fn open(models: Option<&config::ModelsConfig>, sink_nats: Option<&str>) -> Result<Store, StoreError> {
    use config::ModelStoreKind;
    let models = models.ok_or_else(|| failed("open", "the config has no [models] section"))?;
    match models.store {
        ModelStoreKind::Dir => Ok(Store::Dir(dir::DirStore::open(&models.dir)?)),
        ModelStoreKind::Jetstream => {
            let url = match (&models.url, sink_nats) {
                (Some(url), _) => url.clone(),
                (None, Some(url)) => url.to_owned(),
                (None, None) => return Err(failed("open", "models.url is needed: the sink is not jetstream")),
            };
            Ok(Store::Jetstream(Box::new(js::JsStore::connect(&url, &models.bucket, models.replicas).await?)))
        }
    }
}

impl ModelStore for Store {
    async fn has_chunk(&self, hash: &str) -> Result<bool, StoreError> {
        match self {
            Store::Dir(s) => s.has_chunk(hash).await,
            Store::Jetstream(s) => s.has_chunk(hash).await,
        }
    }
    async fn put_chunk(&self, hash: &str, bytes: &[u8]) -> Result<(), StoreError> {
        match self {
            Store::Dir(s) => s.put_chunk(hash, bytes).await,
            Store::Jetstream(s) => s.put_chunk(hash, bytes).await,
        }
    }
    async fn get_chunk(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Store::Dir(s) => s.get_chunk(hash).await,
            Store::Jetstream(s) => s.get_chunk(hash).await,
        }
    }
    async fn put_manifest(&self, m: &Manifest, signed: &SignedManifest) -> Result<(), StoreError> {
        match self {
            Store::Dir(s) => s.put_manifest(m, signed).await,
            Store::Jetstream(s) => s.put_manifest(m, signed).await,
        }
    }
    async fn get_manifest(&self, name: &str, version: &str) -> Result<Option<SignedManifest>, StoreError> {
        match self {
            Store::Dir(s) => s.get_manifest(name, version).await,
            Store::Jetstream(s) => s.get_manifest(name, version).await,
        }
    }
    async fn list(&self) -> Result<Vec<Listed>, StoreError> {
        match self {
            Store::Dir(s) => s.list().await,
            Store::Jetstream(s) => s.list().await,
        }
    }
    async fn remove(&self, name: &str, version: &str) -> Result<usize, StoreError> {
        match self {
            Store::Dir(s) => s.remove(name, version).await,
            Store::Jetstream(s) => s.remove(name, version).await,
        }
    }
}

/// What `publish` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Published {
    pub name: String,
    pub version: String,
    pub size: u64,
    pub chunks: usize,
    /// Chunks (and their bytes) the store did not have yet.
    pub new_chunks: usize,
    pub new_bytes: u64,
    pub key_id: String,
}

/// Chunks `file`, stores what is new, signs the manifest and stores it last. `progress` is
/// called with the bytes read so far.
pub async fn publish<S: ModelStore>(
    store: &S,
    key: &SigningKey,
    name: &str,
    version: &str,
    file: &Path,
    mut progress: impl FnMut(u64),
) -> Result<Published, StoreError> {
    shared::model::valid_name("name", name)?;
    shared::model::valid_name("version", version)?;
    if store.get_manifest(name, version).await?.is_some() {
        return Err(StoreError::Exists { name: name.into(), version: version.into() });
    }
    let reader = std::fs::File::open(file).map_err(|e| failed("read", format!("{}: {e}", file.display())))?;
    // Chunking is CPU and file I/O: on a blocking thread, the chunks handed back over a small
    // channel so at most a few are in memory.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(shared::model::ChunkRef, Vec<u8>)>(4);
    let chunker = tokio::task::spawn_blocking(move || {
        shared::model::chunk(std::io::BufReader::with_capacity(1 << 20, reader), |r, bytes| {
            tx.blocking_send((r.clone(), bytes.to_vec())).map_err(|_| "the publisher stopped")
        })
    });
    let (mut size, mut new_chunks, mut new_bytes) = (0u64, 0usize, 0u64);
    while let Some((r, bytes)) = rx.recv().await {
        if !store.has_chunk(&r.hash).await? {
            store.put_chunk(&r.hash, &bytes).await?;
            new_chunks += 1;
            new_bytes += r.size;
        }
        size += r.size;
        progress(size);
    }
    let chunks = match chunker.await.map_err(|e| failed("chunker", e))? {
        Ok(chunks) => chunks,
        Err(ChunkError::Read(e)) => return Err(failed("read", format!("{}: {e}", file.display()))),
        Err(ChunkError::Sink(e)) => return Err(failed("chunker", e)),
    };
    let created_ms = shared::units::now_ms();
    let manifest = Manifest { name: name.into(), version: version.into(), size, chunks, created_ms };
    manifest.check()?;
    let signed = key.sign(&manifest);
    store.put_manifest(&manifest, &signed).await?;
    Ok(Published {
        name: name.into(),
        version: version.into(),
        size,
        chunks: manifest.chunks.len(),
        new_chunks,
        new_bytes,
        key_id: signed.key_id,
    })
}

/// Reads the signing key at `path`.
pub fn signing_key(path: &Path) -> Result<SigningKey, StoreError> {
    let der = std::fs::read(path).map_err(|e| failed("signing key", format!("{}: {e}", path.display())))?;
    SigningKey::from_pkcs8(&der).map_err(|e| failed("signing key", format!("{}: {e}", path.display())))
}

/// Writes a new signing key (`model-signing.pk8`, mode 0600) and its public half
/// (`model-signing.pub`, raw 32 bytes, for the edges' config) into `dir`; refuses to replace
/// an existing key.
pub fn keygen(dir: &Path) -> Result<(std::path::PathBuf, std::path::PathBuf, String), StoreError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).map_err(|e| failed("keygen", format!("{}: {e}", dir.display())))?;
    let (private, public) = (dir.join("model-signing.pk8"), dir.join("model-signing.pub"));
    let der = SigningKey::generate()?;
    let key = SigningKey::from_pkcs8(&der)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&private)
        .map_err(|e| failed("keygen", format!("{}: {e}", private.display())))?;
    f.write_all(&der).and_then(|_| f.sync_all()).map_err(|e| failed("keygen", e))?;
    std::fs::write(&public, key.public_key()).map_err(|e| failed("keygen", format!("{}: {e}", public.display())))?;
    Ok((private, public, shared::model::key_id(key.public_key())))
}

/// Writes a model file's bytes from the store to `out`, verified chunk by chunk.
pub async fn assemble<S: ModelStore>(
    store: &S,
    manifest: &Manifest,
    out: &mut impl std::io::Write,
) -> Result<(), StoreError> {
    for (i, c) in manifest.chunks.iter().enumerate() {
        let bytes =
            store.get_chunk(&c.hash).await?.ok_or_else(|| failed("read", format!("chunk {i} {} missing", c.hash)))?;
        shared::model::verify_chunk(i, c, &bytes)?;
        out.write_all(&bytes).map_err(|e| failed("write", e))?;
    }
    Ok(())
}
