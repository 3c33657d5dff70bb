//! The production model store: a JetStream object store bucket, on the same nats-server as the
//! telemetry sink, so every bridge serves the same versions and the store is replicated with
//! the cluster. Objects: `chunk/<sha256>` for each chunk once, `manifest/<name>/<version>` for
//! each signed manifest. JetStream acknowledges every object's chunks before `put` returns, so
//! the publish order (chunks, then the manifest) keeps "a manifest's chunks are there".

use async_nats::jetstream::object_store::{self, ObjectStore};
use futures_util::StreamExt;
use shared::model::{Manifest, SignedManifest};
use tokio::io::AsyncReadExt;

use super::{Listed, ModelStore, StoreError, failed};

#[derive(Clone)]
pub struct JsStore {
    bucket: ObjectStore,
    name: String,
}

impl std::fmt::Debug for JsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsStore").field("bucket", &self.name).finish()
    }
}

fn chunk_name(hash: &str) -> Result<String, StoreError> {
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(failed("chunk", format!("{hash:?} is not a SHA-256 in hex")));
    }
    Ok(format!("chunk/{hash}"))
}

fn manifest_name(name: &str, version: &str) -> Result<String, StoreError> {
    shared::model::valid_name("name", name)?;
    shared::model::valid_name("version", version)?;
    Ok(format!("manifest/{name}/{version}"))
}

impl JsStore {
    /// Connects and opens `bucket`, creating it (file storage, `replicas`) if missing.
    pub async fn connect(url: &str, bucket: &str, replicas: usize) -> Result<Self, StoreError> {
        let client = crate::sink::jetstream::client(url, std::time::Duration::from_secs(30))
            .await
            .map_err(|e| failed("connect", e.to_string()))?;
        let js = async_nats::jetstream::new(client);
        let store = match js.get_object_store(bucket).await {
            Ok(s) => s,
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket: bucket.to_owned(),
                    description: Some("edge model chunks and signed manifests (cloud-bridge)".into()),
                    num_replicas: replicas.max(1),
                    ..Default::default()
                })
                .await
                .map_err(|e| failed("create bucket", format!("{bucket}: {e}")))?,
        };
        Ok(Self { bucket: store, name: bucket.to_owned() })
    }

    async fn read(&self, object: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.bucket.get(object).await {
            Ok(mut o) => {
                let mut out = Vec::with_capacity(o.info().size);
                o.read_to_end(&mut out).await.map_err(|e| failed("read", format!("{object}: {e}")))?;
                Ok(Some(out))
            }
            Err(e) if e.kind() == object_store::GetErrorKind::NotFound => Ok(None),
            Err(e) => Err(failed("read", format!("{object}: {e}"))),
        }
    }

    async fn write(&self, object: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.bucket.put(object, &mut &bytes[..]).await.map_err(|e| failed("write", format!("{object}: {e}")))?;
        Ok(())
    }

    /// Every manifest in the bucket; unreadable ones are skipped with a warning.
    async fn manifests(&self) -> Result<Vec<Manifest>, StoreError> {
        let mut names = Vec::new();
        let mut list = self.bucket.list().await.map_err(|e| failed("list", e))?;
        while let Some(info) = list.next().await {
            let info = info.map_err(|e| failed("list", e))?;
            if !info.deleted && info.name.starts_with("manifest/") {
                names.push(info.name);
            }
        }
        let mut out = Vec::new();
        for name in names {
            let read = self
                .read(&name)
                .await
                .and_then(|b| b.ok_or_else(|| failed("read", format!("{name}: gone"))))
                .and_then(|b| Ok(SignedManifest::from_bytes(&b)?.unverified()?));
            match read {
                Ok(m) => out.push(m),
                Err(e) => tracing::warn!(bucket = self.name, object = name, error = %e, "manifest skipped"),
            }
        }
        out.sort_by(|a, b| (&a.name, a.created_ms, &a.version).cmp(&(&b.name, b.created_ms, &b.version)));
        Ok(out)
    }
}

impl ModelStore for JsStore {
    async fn has_chunk(&self, hash: &str) -> Result<bool, StoreError> {
        let name = chunk_name(hash)?;
        match self.bucket.info(&name).await {
            Ok(info) => Ok(!info.deleted),
            Err(e) if e.kind() == object_store::InfoErrorKind::NotFound => Ok(false),
            Err(e) => Err(failed("chunk", format!("{name}: {e}"))),
        }
    }

    async fn put_chunk(&self, hash: &str, bytes: &[u8]) -> Result<(), StoreError> {
        if shared::model::chunk_hash(bytes) != hash {
            return Err(failed("chunk", format!("bytes do not hash to {hash}")));
        }
        if self.has_chunk(hash).await? {
            return Ok(());
        }
        self.write(&chunk_name(hash)?, bytes).await
    }

    async fn get_chunk(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(&chunk_name(hash)?).await
    }

    async fn put_manifest(&self, m: &Manifest, signed: &SignedManifest) -> Result<(), StoreError> {
        self.write(&manifest_name(&m.name, &m.version)?, &signed.to_bytes()).await
    }

    async fn get_manifest(&self, name: &str, version: &str) -> Result<Option<SignedManifest>, StoreError> {
        match self.read(&manifest_name(name, version)?).await? {
            Some(bytes) => Ok(Some(SignedManifest::from_bytes(&bytes)?)),
            None => Ok(None),
        }
    }

    async fn list(&self) -> Result<Vec<Listed>, StoreError> {
        Ok(self.manifests().await?.into_iter().map(Listed::from).collect())
    }

    async fn remove(&self, name: &str, version: &str) -> Result<usize, StoreError> {
        let object = manifest_name(name, version)?;
        match self.bucket.delete(&object).await {
            Ok(()) => {}
            Err(e) if e.kind() == object_store::DeleteErrorKind::NotFound => {
                return Err(StoreError::Missing { name: name.into(), version: version.into() });
            }
            Err(e) => return Err(failed("remove", format!("{object}: {e}"))),
        }
        let keep: std::collections::HashSet<String> =
            self.manifests().await?.into_iter().flat_map(|m| m.chunks.into_iter().map(|c| c.hash)).collect();
        let mut garbage = Vec::new();
        let mut list = self.bucket.list().await.map_err(|e| failed("remove", e))?;
        while let Some(info) = list.next().await {
            let info = info.map_err(|e| failed("remove", e))?;
            if let Some(hash) = info.name.strip_prefix("chunk/")
                && !info.deleted
                && !keep.contains(hash)
            {
                garbage.push(info.name.clone());
            }
        }
        let mut removed = 0;
        for object in garbage {
            if self.bucket.delete(&object).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }
}
