//! cloud-bridge: terminates the edges' QUIC bridges (ehb/1) and writes what they send into the
//! central cluster exactly once. Stateless: everything an edge's session needs to resume is in
//! the sink, so any instance can serve any edge, one after another.

pub mod certs;
pub mod config;
pub mod ingest;
pub mod limits;
pub mod metrics;
pub mod models;
pub mod names;
pub mod server;
pub mod sink;
pub mod tco;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::{CloudConfig, SinkConfig};
use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Server(#[from] server::ServerError),
    #[error(transparent)]
    Sink(#[from] sink::SinkError),
    #[error("model store: {0}")]
    Models(String),
    #[error("http endpoint cannot bind {addr}: {source}")]
    HttpBind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A running bridge.
#[derive(Debug)]
pub struct Bridge {
    quic_addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: tokio_util::task::TaskTracker,
}

impl Bridge {
    pub async fn start(config: CloudConfig) -> Result<Bridge, StartError> {
        let metrics = Arc::new(Metrics::new());
        let shutdown = CancellationToken::new();
        let tasks = tokio_util::task::TaskTracker::new();
        let endpoint = server::endpoint(&config.server, &config.limits)?;
        let quic_addr =
            endpoint.local_addr().map_err(|source| server::ServerError::Bind { addr: config.server.bind, source })?;
        let http_addr = match config.http.bind {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| StartError::HttpBind { addr, source })?;
                let bound = listener.local_addr().ok();
                tasks.spawn(metrics::serve(listener, metrics.clone(), shutdown.clone()));
                bound
            }
            None => None,
        };
        let server_config = Arc::new(config.server.clone());
        let models = match &config.models {
            Some(m) => {
                let store = models::open(&config).await.map_err(|e| StartError::Models(e.to_string()))?;
                tracing::info!(store = ?m.store, "model store open");
                Some(Arc::new(models::serve::ModelService::new(Arc::new(store), m.poll.0)))
            }
            None => None,
        };
        let (m, stop, t) = (metrics.clone(), shutdown.clone(), tasks.clone());
        let limits = server::Limits {
            admission: limits::Admission::new(&config.limits, metrics.limits.clone(), std::time::Instant::now()),
            budget: limits::Budget::new(&config.limits, metrics.limits.clone()),
            stall: config.limits.stall.0,
            log: Arc::new(limits::LogBudget::new(&config.limits, metrics.limits.clone(), std::time::Instant::now())),
        };
        match &config.sink {
            SinkConfig::Sqlite { path } => {
                let sink = sink::sqlite::SqliteSink::open(path)?.with_metrics(metrics.sink.clone());
                let sink = Arc::new(sink.with_quota(config.limits.quota()));
                tracing::info!(path = %path.display(), "sink: sqlite");
                tasks.spawn(server::accept_loop(endpoint, server_config, limits, sink, models, m, stop, t));
            }
            SinkConfig::Jetstream {
                url,
                stream,
                subject_prefix,
                marks_bucket,
                dicts_bucket,
                tco_bucket,
                duplicate_window,
                replicas,
                batches,
            } => {
                let settings = sink::jetstream::JetStreamSettings {
                    url: url.clone(),
                    stream: stream.clone(),
                    subject_prefix: subject_prefix.clone(),
                    marks_bucket: marks_bucket.clone(),
                    dicts_bucket: dicts_bucket.clone(),
                    tco_bucket: tco_bucket.clone(),
                    duplicate_window: duplicate_window.0,
                    replicas: *replicas,
                    batches: *batches,
                };
                let sink = sink::jetstream::JetStreamSink::connect(&settings).await?.with_metrics(metrics.sink.clone());
                let sink = Arc::new(sink.with_quota(config.limits.quota()));
                tracing::info!(url, stream, marks_bucket, "sink: jetstream");
                tasks.spawn(server::accept_loop(endpoint, server_config, limits, sink, models, m, stop, t));
            }
        }
        tracing::info!(%quic_addr, "QUIC listener ready");
        Ok(Bridge { quic_addr, http_addr, metrics, shutdown, tasks })
    }

    pub fn quic_addr(&self) -> SocketAddr {
        self.quic_addr
    }

    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Closes every session, the endpoint and the HTTP endpoint, and waits until the UDP port is
    /// free again.
    pub async fn stop(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Runs a bridge until `shutdown` is cancelled, then stops it.
pub async fn run(config: CloudConfig, shutdown: CancellationToken) -> Result<(), StartError> {
    let bridge = Bridge::start(config).await?;
    shutdown.cancelled().await;
    bridge.stop().await;
    Ok(())
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
