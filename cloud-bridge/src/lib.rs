//! cloud-bridge: terminates the edges' QUIC bridges (ehb/1) and writes what they send into the
//! central cluster exactly once. Stateless: everything an edge's session needs to resume is in
//! the sink, so any instance can serve any edge, one after another.

pub mod certs;
pub mod config;
pub(crate) mod console;
pub mod downlink;
pub mod fleet;
pub(crate) mod ingest;
pub mod limits;
pub mod metrics;
pub mod models;
pub(crate) mod names;
pub mod schemas;
pub mod server;
pub mod sink;
pub mod tco;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::{CloudConfig, SinkConfig};
use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    #[error("tracing: {0}")]
    Tracing(String),
    #[error("{0}")]
    Downlink(String),
    #[error("registry: {0}")]
    Registry(String),
}

/// A running bridge.
#[derive(Debug)]
pub struct Bridge {
    quic_addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    /// Its name in the fleet view.
    name: String,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: tokio_util::task::TaskTracker,
    /// The fleet view's writer, stopped after every session ended so their ends are written.
    fleet_stop: CancellationToken,
    fleet_writer: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// For a reload: new handshakes' certificates, and the deny list (`server::trust`).
    endpoint: quinn::Endpoint,
    trust: Arc<server::trust::Trust>,
    /// Exports `sink commit` spans; flushed at the stop.
    tracer: shared::trace::Tracer,
}

/// What `Bridge::start` made before the sink, for [`Bridge::serve`].
struct Parts {
    endpoint: quinn::Endpoint,
    server: Arc<config::ServerConfig>,
    limits: server::Limits,
    services: server::Services,
    http: Option<tokio::net::TcpListener>,
    writes_per_second: u32,
    /// The `[sink]` section, for what the console reads beside the running sink.
    sink: SinkConfig,
    /// The Schema Registry REST API's section and credentials, and where the versions it
    /// registers are delivered (`[models]`).
    registry: RegistryParts,
}

/// `[registry]` made ready: its credentials read, and, when it writes and the bridge has
/// `[models]`, the model store and the fleet key its versions are delivered with.
type RegistryParts =
    (schemas::config::RegistryConfig, Option<schemas::config::Credentials>, Option<schemas::cli::Delivery>);

async fn registry_parts(config: &CloudConfig) -> Result<RegistryParts, StartError> {
    let r = config.registry.clone();
    let credentials =
        r.credentials.as_deref().map(schemas::config::Credentials::load).transpose().map_err(StartError::Registry)?;
    let delivery = match (&config.models, r.api) {
        (Some(models), schemas::config::Access::ReadWrite) => Some(schemas::cli::Delivery {
            store: models::open(Some(models), config.sink.nats_url())
                .await
                .map_err(|e| StartError::Models(e.to_string()))?,
            key: models::signing_key(&models.signing_key).map_err(|e| StartError::Registry(e.to_string()))?,
        }),
        (None, schemas::config::Access::ReadWrite) => {
            tracing::warn!("[registry] api is read-write and there is no [models]: registered versions reach no edge");
            None
        }
        _ => None,
    };
    Ok((r, credentials, delivery))
}

impl Bridge {
    pub async fn start(config: CloudConfig) -> Result<Bridge, StartError> {
        let metrics = Arc::new(Metrics::new());
        let endpoint = server::endpoint(&config.server, |t| config.limits.apply(t))?;
        let quic_addr =
            endpoint.local_addr().map_err(|source| server::ServerError::Bind { addr: config.server.bind, source })?;
        let http = bind_http(config.http.bind).await?;
        let http_addr = http.as_ref().and_then(|l| l.local_addr().ok());
        let models =
            models::serve::ModelService::start(config.models.as_ref(), config.sink.nats_url(), metrics.models.clone())
                .await
                .map_err(|e| StartError::Models(e.to_string()))?;
        let tracer = shared::trace::Tracer::start(
            &config.tracing,
            "cloud-bridge",
            env!("CARGO_PKG_VERSION"),
            metrics.trace.clone(),
        )
        .map_err(StartError::Tracing)?;
        let name = config.fleet.bridge_name(quic_addr.port());
        let recorder = Arc::new(fleet::Recorder::new(&config.fleet, name, metrics.fleet.clone()));
        // Boxed: opening a model store is a large future, and it would sit in every caller of `start`.
        let registry = Box::pin(registry_parts(&config)).await?;
        let parts = Parts {
            endpoint,
            server: Arc::new(config.server.clone()),
            limits: server_limits(&config.limits, &metrics),
            services: server::Services {
                models,
                fleet: recorder,
                tracer: tracer.clone(),
                downlink: Arc::new(downlink::Downlink::new(config.downlink.clone(), metrics.downlink.clone())),
                // Made on the sink, once it is open (`serve`).
                framer: None,
            },
            http,
            writes_per_second: config.fleet.state_writes_per_second,
            sink: config.sink.clone(),
            registry,
        };
        let sink = config.sink.open(metrics.sink.clone(), config.limits.quota()).await?;
        // A downlink message that passes `send` must fit the sink (JetStream: the server's
        // max_payload).
        config.downlink.fits(sink::DownlinkStore::down_limit(&sink)).map_err(StartError::Downlink)?;
        let bridge = Self::serve(Arc::new(sink), parts, metrics, quic_addr, http_addr);
        tracing::info!(%quic_addr, bridge = bridge.name, "QUIC listener ready");
        Ok(bridge)
    }

    /// Starts the accept loop, the fleet view's writer and the HTTP endpoint on `sink`.
    fn serve<S: sink::Sink + sink::SchemaStore>(
        sink: Arc<S>,
        mut parts: Parts,
        metrics: Arc<Metrics>,
        quic_addr: SocketAddr,
        http_addr: Option<SocketAddr>,
    ) -> Bridge {
        let name = parts.services.fleet.name().to_owned();
        parts.services.framer =
            schemas::frame::Framer::new(&parts.registry.0.frame_classes, sink.clone(), metrics.framed.clone());
        let shutdown = CancellationToken::new();
        let tasks = tokio_util::task::TaskTracker::new();
        if let Some(listener) = parts.http {
            let view = Arc::new(fleet::view::Served::new(sink.clone()));
            let sink_config = Arc::new(parts.sink.clone());
            let dead: console::Load = Box::new(move || {
                let config = sink_config.clone();
                Box::pin(async move { sink::inspect::dead_letters_doc(&config).await })
            });
            let console = Arc::new(console::Console::new(sink.clone(), dead));
            let (config, credentials, delivery) = parts.registry;
            let registry =
                schemas::api::Api::new(sink.clone(), delivery, config, credentials, metrics.schemas.clone()).routes();
            tasks.spawn(metrics::serve(listener, metrics.clone(), view, console, registry, shutdown.clone()));
        }
        let fleet_stop = CancellationToken::new();
        let info = fleet::BridgeInfo { quic: quic_addr, writes_per_second: parts.writes_per_second };
        let writer = tokio::spawn(fleet::run(parts.services.fleet.clone(), sink.clone(), info, fleet_stop.clone()));
        tasks.spawn(parts.services.downlink.clone().watch(sink.clone(), shutdown.clone()));
        tasks.spawn(sink::probe::run(sink.clone(), metrics.sink.clone(), shutdown.clone()));
        let tracer = parts.services.tracer.clone();
        let (m, stop, t) = (metrics.server.clone(), shutdown.clone(), tasks.clone());
        let trust = Arc::new(server::trust::Trust::new(&parts.server.deny_serials));
        let endpoint = parts.endpoint.clone();
        tasks.spawn(server::accept_loop(
            parts.endpoint,
            parts.server,
            trust.clone(),
            parts.limits,
            sink,
            parts.services,
            m,
            stop,
            t,
        ));
        Bridge {
            quic_addr,
            http_addr,
            name,
            metrics,
            shutdown,
            tasks,
            fleet_stop,
            fleet_writer: tokio::sync::Mutex::new(Some(writer)),
            endpoint,
            trust,
            tracer,
        }
    }

    /// Takes `config`'s certificate, key, fleet CA and deny list (`server::trust`); the edge
    /// ids whose sessions it ended because their certificates are denied now. On an error
    /// nothing changed.
    pub fn reload(&self, config: &CloudConfig) -> Result<Vec<String>, server::ServerError> {
        server::trust::reload(&self.endpoint, &self.trust, &config.server, |t| config.limits.apply(t))
    }

    pub fn quic_addr(&self) -> SocketAddr {
        self.quic_addr
    }

    /// Its name in the fleet view (`fleet.name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Closes every session, the endpoint and the HTTP endpoint, writes the fleet view's last
    /// states, and waits until the UDP port is free again.
    pub async fn stop(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        self.fleet_stop.cancel();
        if let Some(writer) = self.fleet_writer.lock().await.take() {
            let _ = writer.await;
        }
        // The last spans go out; bounded by `tracing.timeout`.
        let tracer = self.tracer.clone();
        let _ = tokio::task::spawn_blocking(move || tracer.shutdown()).await;
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.fleet_stop.cancel();
    }
}

/// What the accept loop admits and what a connection may hold, from `[limits]`.
fn server_limits(config: &limits::LimitsConfig, metrics: &Metrics) -> server::Limits {
    let now = std::time::Instant::now();
    server::Limits {
        admission: limits::Admission::new(config, metrics.limits.clone(), now),
        budget: limits::Budget::new(config, metrics.limits.clone()),
        stall: config.stall.0,
        log: Arc::new(limits::LogBudget::new(config, metrics.limits.clone(), now)),
    }
}

/// The HTTP endpoint's socket, if `[http]` names one.
async fn bind_http(bind: Option<SocketAddr>) -> Result<Option<tokio::net::TcpListener>, StartError> {
    let Some(addr) = bind else { return Ok(None) };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| StartError::HttpBind { addr, source })?;
    Ok(Some(listener))
}
