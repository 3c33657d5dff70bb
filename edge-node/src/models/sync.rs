//! Following models over the bridge: each version the cloud announces is verified, its missing
//! chunks fetched, the file staged and local apps told.
//!
//! - The manifest's signature is checked before anything is fetched; a manifest that fails
//!   (another key, a bad signature, truncated) is refused with the reason logged and counted,
//!   and nothing changes locally.
//! - Only chunks the cache lacks are fetched, `parallel` at a time, one QUIC stream each (the
//!   bridge sends them below its control stream's priority). A chunk whose bytes do not hash
//!   to its name is counted and fetched again, at most [`ATTEMPTS`] times, never used.
//! - A lost connection ends the job; the chunks already verified stay in the cache, and the
//!   bridge announces the latest version again on the next connection, so the sync resumes
//!   where it stopped (after a node restart too: the cache is on disk).
//! - A version already staged here is not switched to again: after `edge-node models
//!   rollback` the operator's choice holds until a newer version is published. An announced
//!   version older than the newest ever staged here (`Models::newest_staged_ms`, kept when
//!   its file is pruned or deleted) is refused: a replayed signed manifest cannot downgrade
//!   the edge.
//! - `current` links changed outside the node (the rollback CLI) are noticed within
//!   [`WATCH`] and announced on MQTT.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use shared::model::{ChunkRef, ModelError, SignedManifest};
use shared::proto::io::{FrameIoError, read_frame, write_frame};
use shared::proto::{ChunkReply, Fetch, MAX_CHUNK_FRAME, ModelAnnounce};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::announce::Announcer;
use super::{ChunkCache, Current, Models, StageError};
use crate::labels::handle;

/// Tries per chunk when its bytes do not match its hash.
pub(crate) const ATTEMPTS: usize = 3;
/// How often `current` links are checked for changes made outside the node.
pub(crate) const WATCH: Duration = Duration::from_secs(2);
/// A chunk that does not arrive in this long is given up (the job ends, the next announcement
/// resumes it).
const CHUNK_TIMEOUT: Duration = Duration::from_secs(120);

/// An announcement, with the connection it came on (where its chunks are fetched).
#[derive(Debug)]
pub(crate) struct ModelJob {
    pub conn: quinn::Connection,
    pub announce: ModelAnnounce,
    pub received: Instant,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ModelLabel {
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VersionLabels {
    pub model: String,
    pub version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RefusedLabel {
    pub reason: &'static str,
}

shared::metrics! {
    #[derive(Debug, Clone)]
    pub(crate) struct ModelMetrics {
        /// Chunk bytes fetched and the size of the versions staged: their ratio is the delta
        /// efficiency.
        pub fetched_bytes: Family<ModelLabel, Counter> => (
            "model_fetched_bytes",
            "Model chunk bytes fetched from the bridge"
        ),
        pub staged_bytes: Family<ModelLabel, Counter> => ("model_staged_bytes", "Size of the model versions staged"),
        /// Fetched over size for the last version staged, counting the job that staged it (bytes
        /// of an earlier, interrupted job are in `fetched_bytes` only).
        pub last_delta_ratio: Family<ModelLabel, Gauge<f64, std::sync::atomic::AtomicU64>> => (
            "model_last_delta_ratio",
            "Bytes fetched over file size for the last version staged (delta efficiency)"
        ),
        pub chunks_verified: Counter => ("model_chunks_verified", "Fetched chunks whose bytes matched their hash"),
        pub chunks_failed: Counter => (
            "model_chunks_failed",
            "Fetched chunks whose bytes did not match their hash (refetched, never used)"
        ),
        pub refused: Family<RefusedLabel, Counter> => (
            "model_versions_refused",
            "Announced versions not staged, by reason (manifest, fetch, stage, not_followed)"
        ),
        pub announce_to_staged: Histogram => (
            "model_announce_to_staged",
            "From a version's announcement to its file staged and current",
            unit Seconds,
            // 50 ms .. ~27 min
            init Histogram::new(exponential_buckets(0.05, 2.0, 16))
        ),
        /// 1 for each model's current version.
        pub current: Family<VersionLabels, Gauge> => ("model_current", "1 for the current version of each model"),
    }
}

impl ModelMetrics {
    /// The model syncer's metrics, registered in `r`.
    pub(crate) fn new(r: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self::default();
        m.register(r);
        m
    }

    fn set_current(&self, name: &str, version: &str) {
        self.current.get_or_create(&VersionLabels { model: name.into(), version: version.into() }).set(1);
    }
}

#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("manifest: {0}")]
    Manifest(#[from] ModelError),
    #[error("{0}")]
    NotFollowed(String),
    #[error("chunk {hash}: {reason}")]
    Fetch { hash: String, reason: String },
    #[error("connection: {0}")]
    Connection(String),
    #[error("staging: {0}")]
    Stage(#[from] StageError),
    #[error("a blocking task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl SyncError {
    fn reason(&self) -> &'static str {
        match self {
            SyncError::Manifest(_) => "manifest",
            SyncError::NotFollowed(_) => "not_followed",
            SyncError::Fetch { .. } | SyncError::Connection(_) => "fetch",
            SyncError::Stage(_) | SyncError::Task(_) => "stage",
        }
    }
}

/// Follows the models in `follows`: runs [`ModelJob`]s as the uplink hands them over.
#[derive(Debug)]
pub(crate) struct Syncer {
    pub models: Models,
    pub cache: ChunkCache,
    pub follows: Vec<String>,
    pub parallel: usize,
    pub cache_budget: u64,
    pub metrics: ModelMetrics,
    pub announcer: Announcer,
    /// Told after each version staged (schema validation reads staged schemas at once).
    pub staged: std::sync::Arc<tokio::sync::Notify>,
}

/// Why the models could not be opened at start: the key file, or the model directory.
#[derive(Debug, thiserror::Error)]
#[error("models {}: {reason}", path.display())]
pub struct OpenError {
    pub path: std::path::PathBuf,
    pub reason: String,
}

impl Syncer {
    /// The syncer of `[models]` (`config`): its public key read, its directory and chunk cache
    /// opened, following `follows`.
    pub(crate) fn open(
        config: &super::ModelsConfig,
        follows: Vec<String>,
        metrics: ModelMetrics,
        announcer: Announcer,
        staged: std::sync::Arc<tokio::sync::Notify>,
    ) -> Result<Self, OpenError> {
        let key = std::fs::read(&config.public_key)
            .map_err(|e| OpenError { path: config.public_key.clone(), reason: e.to_string() })?;
        let bad_dir = |e: StageError| OpenError { path: config.dir.clone(), reason: e.to_string() };
        let models = Models::open(&config.dir, key, config.keep).map_err(bad_dir)?;
        Ok(Self {
            cache: models.cache().map_err(bad_dir)?,
            models,
            follows,
            parallel: config.parallel,
            cache_budget: config.cache_budget.bytes(),
            metrics,
            announcer,
            staged,
        })
    }

    /// Announces every model held, then runs jobs and watches `current` links until
    /// `shutdown`.
    pub(crate) async fn run(self, mut jobs: mpsc::Receiver<ModelJob>, shutdown: CancellationToken) {
        let mut announced: HashMap<String, String> = HashMap::new();
        self.announce_changes(&mut announced).await;
        let mut watch = tokio::time::interval(WATCH);
        watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                job = jobs.recv() => {
                    let Some(job) = job else { return };
                    let (name, version) = (job.announce.name.clone(), job.announce.version.clone());
                    match self.sync(job, &shutdown).await {
                        Ok(Some(_)) => {
                            self.staged.notify_one();
                            self.announce_changes(&mut announced).await
                        }
                        Ok(None) => {}
                        Err(e) => {
                            self.metrics.refused.get_or_create(&RefusedLabel { reason: e.reason() }).inc();
                            tracing::error!(model = name, version, error = %e, "model version not staged; the current one stays");
                        }
                    }
                }
                _ = watch.tick() => self.announce_changes(&mut announced).await,
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// Announces on MQTT each model whose current version differs from what was announced.
    async fn announce_changes(&self, announced: &mut HashMap<String, String>) {
        let models = self.models.clone();
        let known = announced.clone();
        let changed = tokio::task::spawn_blocking(move || {
            models
                .names()
                .into_iter()
                .filter(|n| models.current_version(n).is_some_and(|v| known.get(n) != Some(&v)))
                .filter_map(|n| match models.current(&n) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(model = n, error = %e, "model not announced");
                        None
                    }
                })
                .collect::<Vec<Current>>()
        })
        .await
        .unwrap_or_default();
        if changed.is_empty() {
            return;
        }
        match self.announcer.announce(&changed).await {
            Ok(()) => {
                for c in changed {
                    if let Some(old) = announced.insert(c.name.clone(), c.version.clone()) {
                        self.metrics.current.remove(&VersionLabels { model: c.name.clone(), version: old });
                    }
                    self.metrics.set_current(&c.name, &c.version);
                }
            }
            Err(e) => tracing::warn!(error = %e, "models not announced"),
        }
    }

    /// Verifies, fetches and stages one announced version. `None`: nothing to do.
    async fn sync(&self, job: ModelJob, shutdown: &CancellationToken) -> Result<Option<Current>, SyncError> {
        let signed = SignedManifest::from_bytes(&job.announce.manifest)?;
        let m = self.models.verify(&signed).map_err(|e| match e {
            StageError::Model(e) => SyncError::Manifest(e),
            e => SyncError::Stage(e),
        })?;
        if m.name != job.announce.name || !self.follows.contains(&m.name) {
            return Err(SyncError::NotFollowed(format!("{} is not a model this edge follows", m.name)));
        }
        match self.models.admits(&m) {
            Ok(()) => {}
            Err(super::Refusal::Staged) => {
                tracing::debug!(model = m.name, version = m.version, "announced version already staged");
                return Ok(None);
            }
            Err(super::Refusal::Older { newest_ms }) => {
                tracing::warn!(
                    model = m.name,
                    version = m.version,
                    created_ms = m.created_ms,
                    newest_ms,
                    "announced version is older than the newest ever staged here; refused (a downgrade is `edge-node models rollback`)"
                );
                return Ok(None);
            }
            Err(super::Refusal::Lower { highest }) => {
                tracing::warn!(
                    model = m.name,
                    version = m.version,
                    highest,
                    "announced schema version is below one staged here; refused (versions are ordered by number, not arrival)"
                );
                return Ok(None);
            }
        }
        tracing::info!(
            model = m.name,
            version = m.version,
            size = m.size,
            chunks = m.chunks.len(),
            "model sync started"
        );
        let label = ModelLabel { model: m.name.clone() };
        let mut fetched = 0u64;
        // A cached chunk that went bad on disk shows up while staging; one more round
        // refetches it.
        let mut rounds = 0;
        let current = loop {
            rounds += 1;
            let missing: Vec<(usize, ChunkRef)> =
                self.cache.missing(&m).into_iter().map(|(i, c)| (i, c.clone())).collect();
            let mut fetches = futures_util::stream::iter(missing)
                .map(|(index, c)| self.fetch(&job.conn, index, c))
                .buffer_unordered(self.parallel.max(1));
            while let Some(result) = tokio::select! {
                r = fetches.next() => r,
                _ = shutdown.cancelled() => return Ok(None),
            } {
                let n = result?;
                fetched += n;
                // Counted as they arrive: a job cut short still fetched them.
                handle(&self.metrics.fetched_bytes, &label).inc_by(n);
            }
            let (models, cache, signed) = (self.models.clone(), self.cache.clone(), signed.clone());
            let staged = tokio::task::spawn_blocking(move || models.stage(&signed, &cache)).await?;
            match staged {
                Ok(c) => break c,
                Err(StageError::MissingChunk { .. } | StageError::Model(ModelError::ChunkHash { .. }))
                    if rounds < 2 =>
                {
                    tracing::warn!(model = m.name, "a cached chunk went missing or bad; fetching it again");
                }
                Err(e) => return Err(e.into()),
            }
        };
        let elapsed = job.received.elapsed();
        self.metrics.announce_to_staged.observe(elapsed.as_secs_f64());
        handle(&self.metrics.staged_bytes, &label).inc_by(m.size);
        let ratio = if m.size > 0 { fetched as f64 / m.size as f64 } else { 0.0 };
        handle(&self.metrics.last_delta_ratio, &label).set(ratio);
        tracing::info!(
            model = m.name,
            version = m.version,
            size = m.size,
            fetched,
            ratio = format!("{ratio:.3}"),
            seconds = format!("{:.2}", elapsed.as_secs_f64()),
            "model staged"
        );
        let keep: HashSet<String> = m.chunks.iter().map(|c| c.hash.clone()).collect();
        let (cache, budget) = (self.cache.clone(), self.cache_budget);
        let _ = tokio::task::spawn_blocking(move || cache.trim(budget, &keep)).await;
        Ok(Some(current))
    }

    /// Fetches chunk `index` until its bytes match, and caches it. Returns the bytes fetched.
    async fn fetch(&self, conn: &quinn::Connection, index: usize, c: ChunkRef) -> Result<u64, SyncError> {
        let mut fetched = 0;
        for attempt in 1..=ATTEMPTS {
            let reply = tokio::time::timeout(CHUNK_TIMEOUT, request(conn, &c.hash))
                .await
                .map_err(|_| SyncError::Connection(format!("chunk {} took longer than {CHUNK_TIMEOUT:?}", c.hash)))??;
            if let Some(error) = reply.error {
                return Err(SyncError::Fetch { hash: c.hash, reason: format!("the bridge says: {error}") });
            }
            let bytes = reply.bytes.unwrap_or_default();
            fetched += bytes.len() as u64;
            let (cache, cr) = (self.cache.clone(), c.clone());
            let put = tokio::task::spawn_blocking(move || cache.put(index, &cr, &bytes)).await?;
            match put {
                Ok(()) => {
                    self.metrics.chunks_verified.inc();
                    return Ok(fetched);
                }
                Err(StageError::Model(e @ ModelError::ChunkHash { .. })) => {
                    self.metrics.chunks_failed.inc();
                    tracing::warn!(attempt, error = %e, "fetched chunk refused; fetching it again");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(SyncError::Fetch { hash: c.hash, reason: format!("bytes did not match the hash in {ATTEMPTS} attempts") })
    }
}

async fn request(conn: &quinn::Connection, hash: &str) -> Result<ChunkReply, SyncError> {
    let lost = |e: &dyn std::fmt::Display| SyncError::Connection(e.to_string());
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| lost(&e))?;
    write_frame(&mut send, &Fetch::Chunk { hash: hash.to_owned() }).await.map_err(|e| lost(&e))?;
    send.finish().map_err(|e| lost(&e))?;
    let reply: Option<ChunkReply> = read_frame(&mut recv, MAX_CHUNK_FRAME).await.map_err(|e: FrameIoError| lost(&e))?;
    let reply =
        reply.ok_or_else(|| SyncError::Connection("the bridge closed a chunk stream without a reply".into()))?;
    if reply.hash != hash {
        return Err(SyncError::Fetch { hash: hash.into(), reason: format!("the reply names chunk {}", reply.hash) });
    }
    Ok(reply)
}
