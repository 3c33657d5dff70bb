//! Serving model versions to a connected edge.
//!
//! - Right after the welcome the edge hears the latest version of each model its hello names;
//!   while it stays connected the store is polled and each newer version announced. An edge
//!   that reconnects hears the latest again, which is how an interrupted sync resumes.
//! - The edge fetches chunks on bidirectional streams of its own, one chunk per stream. Only
//!   chunks of manifests announced on this connection are served: a chunk name is not a
//!   secret, but a certificate should not open the whole store.
//! - Chunk replies go out below the control stream's priority, so a model transfer never
//!   holds up the acks telemetry waits for.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use shared::proto::io::{read_frame, write_frame};
use shared::proto::{ChunkReply, Fetch, MAX_FETCH_FRAME, ModelAnnounce};

use super::{ModelStore, Store, StoreError};
use crate::limits::ConnectionBudget;

/// Chunk streams' send priority; the control stream keeps quinn's default 0.
const CHUNK_PRIORITY: i32 = -10;

/// The model store as the server uses it.
#[derive(Debug)]
pub(crate) struct ModelService {
    pub store: Arc<Store>,
    /// How often a connected edge's models are checked for a newer version.
    pub poll: Duration,
    /// The store's listing, shared by every connection for half a `poll`: a thousand edges
    /// polling must not list the store a thousand times.
    listing: tokio::sync::Mutex<Option<(std::time::Instant, Arc<Vec<super::Listed>>)>>,
    metrics: Arc<ServeMetrics>,
}

impl ModelService {
    /// The service `[models]` asks for, its store opened (`super::open`: on the sink's servers
    /// when it names none), or none without `[models]`.
    pub(crate) async fn start(
        config: Option<&super::config::ModelsConfig>,
        sink_nats: Option<&str>,
        metrics: Arc<ServeMetrics>,
    ) -> Result<Option<Arc<Self>>, StoreError> {
        let Some(m) = config else { return Ok(None) };
        let store = Box::pin(super::open(Some(m), sink_nats)).await?;
        tracing::info!(store = m.store.name(), "model store open");
        Ok(Some(Arc::new(Self::new(Arc::new(store), m.poll.0, metrics))))
    }

    pub(crate) fn new(store: Arc<Store>, poll: Duration, metrics: Arc<ServeMetrics>) -> Self {
        Self { store, poll, listing: tokio::sync::Mutex::new(None), metrics }
    }

    async fn listing(&self) -> Result<Arc<Vec<super::Listed>>, StoreError> {
        let mut cached = self.listing.lock().await;
        if let Some((at, list)) = cached.as_ref()
            && at.elapsed() < self.poll / 2
        {
            return Ok(list.clone());
        }
        let list = Arc::new(self.store.list().await?);
        *cached = Some((std::time::Instant::now(), list.clone()));
        Ok(list)
    }
}

shared::metrics! {
    /// What serving models counts.
    #[derive(Debug)]
    pub struct ServeMetrics {
        pub announced: Counter => ("models_announced", "Model versions announced to edges"),
        pub chunks: Counter => ("model_chunks_served", "Model chunks sent to edges"),
        pub bytes: Counter => ("model_chunk_bytes_served", "Model chunk bytes sent to edges"),
        pub refused: Counter => (
            "model_fetches_refused",
            "Chunk requests refused (not announced on the connection, missing from the store, no memory for it) or reset (not taken by the edge within limits.stall)"
        ),
    }
}

/// The models side of one edge's connection.
#[derive(Debug)]
pub(crate) struct EdgeModels {
    service: Arc<ModelService>,
    follows: Vec<String>,
    announced: HashMap<String, String>,
    grants: Arc<Mutex<HashSet<String>>>,
}

impl EdgeModels {
    pub(crate) fn new(service: Arc<ModelService>, follows: Vec<String>) -> Self {
        Self { service, follows, announced: HashMap::new(), grants: Arc::default() }
    }

    /// Versions of followed models not announced on this connection yet: the latest of each.
    /// Their chunks may be fetched from now on.
    pub(crate) async fn news(&mut self) -> Result<Vec<ModelAnnounce>, StoreError> {
        if self.follows.is_empty() {
            return Ok(Vec::new());
        }
        let listed = self.service.listing().await?;
        let mut out = Vec::new();
        for name in &self.follows {
            // Oldest first within a model: the last is the latest. A schema's versions are
            // numbered in the order they were registered: the highest is the latest, whenever
            // each was published (a delivery made again later is not newer).
            let mut of_model = listed.iter().filter(|l| &l.name == name);
            let latest = if name.starts_with(shared::model::SCHEMA_PREFIX) {
                of_model.max_by_key(|l| (l.version.parse::<u32>().ok(), l.created_ms))
            } else {
                of_model.next_back()
            };
            let Some(latest) = latest else { continue };
            if self.announced.get(name) == Some(&latest.version) {
                continue;
            }
            let Some(signed) = self.service.store.get_manifest(name, &latest.version).await? else { continue };
            let manifest = signed.unverified()?;
            self.grants.lock().unwrap_or_else(|p| p.into_inner()).extend(manifest.chunks.into_iter().map(|c| c.hash));
            self.announced.insert(name.clone(), latest.version.clone());
            self.service.metrics.announced.inc();
            out.push(ModelAnnounce {
                name: name.clone(),
                version: latest.version.clone(),
                manifest: signed.to_bytes(),
            });
        }
        Ok(out)
    }

    /// Serves chunk requests on the connection's bidirectional streams until it closes. Each
    /// chunk is paid for from `budget` (the connection's batch memory) until it is written, so
    /// an edge that asks and does not read holds at most its budget, not its streams' worth of
    /// 2 MiB chunks, and that for `limits.stall` at most: a chunk not taken by then is reset
    /// (stream error 4).
    pub(crate) fn serve(&self, conn: quinn::Connection, budget: ConnectionBudget) -> tokio::task::JoinHandle<()> {
        let (store, grants, metrics) = (self.service.store.clone(), self.grants.clone(), self.service.metrics.clone());
        tokio::spawn(async move {
            while let Ok((send, recv)) = conn.accept_bi().await {
                let held = budget.clone();
                tokio::spawn(serve_one(send, recv, store.clone(), grants.clone(), metrics.clone(), held));
            }
        })
    }
}

async fn serve_one(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    store: Arc<Store>,
    grants: Arc<Mutex<HashSet<String>>>,
    metrics: Arc<ServeMetrics>,
    budget: ConnectionBudget,
) {
    let _ = send.set_priority(CHUNK_PRIORITY);
    let request =
        match tokio::time::timeout(Duration::from_secs(30), read_frame::<_, Fetch>(&mut recv, MAX_FETCH_FRAME)).await {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) | Err(_) => return,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "bad fetch request");
                let _ = send.reset(1u32.into());
                return;
            }
        };
    let Fetch::Chunk { hash } = request else {
        let _ = send.reset(2u32.into());
        return;
    };
    // A chunk and its frame, reserved before it is read and held until it is written.
    let _held = match budget.reserve(shared::model::CHUNK_MAX as usize + 1024).await {
        Ok(r) => r,
        Err(e) => {
            metrics.refused.inc();
            tracing::debug!(error = %e, "chunk not served: the connection's memory is taken");
            let _ = send.reset(3u32.into());
            return;
        }
    };
    let granted = grants.lock().unwrap_or_else(|p| p.into_inner()).contains(&hash);
    let reply = if !granted {
        metrics.refused.inc();
        ChunkReply { hash, bytes: None, error: Some("not a chunk of a model announced on this connection".into()) }
    } else {
        match store.get_chunk(&hash).await {
            Ok(Some(bytes)) => {
                metrics.chunks.inc();
                metrics.bytes.inc_by(bytes.len() as u64);
                ChunkReply { hash, bytes: Some(bytes), error: None }
            }
            Ok(None) => {
                metrics.refused.inc();
                tracing::error!(hash, "a chunk of an announced manifest is missing from the model store");
                ChunkReply { hash, bytes: None, error: Some("missing from the model store".into()) }
            }
            Err(e) => {
                metrics.refused.inc();
                tracing::error!(hash, error = %e, "model store read failed");
                ChunkReply { hash, bytes: None, error: Some(format!("model store: {e}")) }
            }
        }
    };
    // An edge that asks and does not read would hold the chunk's memory for as long as it
    // keeps the connection: it has `limits.stall` to take it, like a batch it holds up.
    match tokio::time::timeout(budget.stall(), write_frame(&mut send, &reply)).await {
        Ok(Ok(())) => {
            let _ = send.finish();
        }
        Ok(Err(_)) => {}
        Err(_) => {
            metrics.refused.inc();
            tracing::debug!("chunk reset: the edge did not take it within limits.stall");
            let _ = send.reset(4u32.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn news_are_the_latest_followed_versions_once_and_grant_their_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::dir::DirStore::open(&dir.path().join("store")).unwrap();
        let key = shared::model::SigningKey::from_pkcs8(&shared::model::SigningKey::generate().unwrap()).unwrap();
        for (name, version, seed) in [("a", "1", 1), ("a", "2", 2), ("b", "1", 3)] {
            let file = dir.path().join(format!("{name}{version}"));
            std::fs::write(&file, shared::testing::noise(300 << 10, seed)).unwrap();
            super::super::publish(&store, &key, name, version, &file, |_| {}).await.unwrap();
        }
        let service = Arc::new(ModelService::new(Arc::new(Store::Dir(store)), Duration::from_secs(2), Arc::default()));
        let mut edge = EdgeModels::new(service, vec!["a".into(), "missing".into()]);
        let news = edge.news().await.unwrap();
        assert_eq!(news.iter().map(|a| (a.name.as_str(), a.version.as_str())).collect::<Vec<_>>(), [("a", "2")]);
        let manifest =
            shared::model::SignedManifest::from_bytes(&news[0].manifest).unwrap().verify(key.public_key()).unwrap();
        let grants = edge.grants.lock().unwrap().clone();
        assert_eq!(grants, manifest.chunks.iter().map(|c| c.hash.clone()).collect::<HashSet<_>>());
        assert!(edge.news().await.unwrap().is_empty(), "announced once per connection");
    }

    /// Issue 45: a schema version delivered again after a newer one (its first delivery failed)
    /// is the newest by creation time; the newest schema version is the highest number. (Made
    /// within one millisecond, the old order by creation time then version text names 5.)
    #[tokio::test]
    async fn a_schemas_latest_is_its_highest_version_not_its_newest_delivery() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::dir::DirStore::open(&dir.path().join("store")).unwrap();
        let key = shared::model::SigningKey::from_pkcs8(&shared::model::SigningKey::generate().unwrap()).unwrap();
        for version in ["5", "10", "4"] {
            let file = dir.path().join(version);
            std::fs::write(&file, version).unwrap();
            super::super::publish(&store, &key, "schema.t", version, &file, |_| {}).await.unwrap();
        }
        let service = Arc::new(ModelService::new(Arc::new(Store::Dir(store)), Duration::from_secs(2), Arc::default()));
        let mut edge = EdgeModels::new(service, vec!["schema.t".into()]);
        let news = edge.news().await.unwrap();
        assert_eq!(news.iter().map(|a| a.version.as_str()).collect::<Vec<_>>(), ["10"]);
    }
}
