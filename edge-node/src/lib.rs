//! The edge gateway: an embedded MQTT broker with our own connection layer in front of it.
//!
//! [`Node::start`] binds everything and returns the bound addresses; [`run`] is the same with a
//! shutdown future, for `main` and for tests that only need a running node. This file is where
//! subsystems meet: it builds each one from its config section, registers their metrics in one
//! registry, and creates the handles that carry values between them (the TCO snapshot, the link
//! figures). No subsystem imports another's config or metrics; `tests/layout.rs` holds that.
//! docs/ARCHITECTURE.md maps the modules.

pub mod auth;
pub mod broker;

pub(crate) mod client;
pub mod config;
pub mod downlink;
pub(crate) mod front;
pub mod health;
pub(crate) mod labels;
pub mod metrics;
pub mod models;
pub(crate) mod probe;
pub mod route;
pub mod schema;
pub mod spool;
pub(crate) mod sys;
pub mod tco;
pub mod tls;
pub mod uplink;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::{AuthError, AuthState, LoginPool};
use crate::broker::driver::BrokerHandle;
use crate::broker::metrics::BrokerMetrics;
use crate::client::Connector;
use crate::config::EdgeConfig;
use crate::front::{FrontContext, FrontMetrics, Listener};
use crate::metrics::{Endpoints, Metrics};
use crate::models::sync::ModelMetrics;
use crate::probe::{Health, ProbeMetrics};
use crate::spool::WriterMetrics;
use crate::tco::{LinkFigures, Snapshot, TcoMetrics};
use crate::tls::TlsError;
use crate::uplink::UplinkMetrics;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error(transparent)]
    Listener(#[from] front::BindError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Sessions(#[from] broker::store::StoreError),
    #[error(transparent)]
    Spool(#[from] spool::StartError),
    #[error(transparent)]
    Uplink(#[from] uplink::quic::UplinkSetupError),
    #[error("cannot start the login threads: {0}")]
    LoginThreads(#[source] std::io::Error),
    #[error(transparent)]
    Models(#[from] models::sync::OpenError),
    #[error("tracing: {0}")]
    Tracing(String),
    #[error("http endpoint cannot bind {addr}: {source}")]
    HttpBind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("listener {name:?}: {source}")]
    Tls {
        name: String,
        #[source]
        source: TlsError,
    },
}

/// How to start a node beyond its config; tests use it to inject faults.
#[derive(Debug, Default, Clone)]
pub struct NodeOptions {
    /// Runs the spool over a storage whose writes fail while these faults say so.
    pub spool_faults: Option<spool::fault::Faults>,
}

/// A running edge gateway.
#[derive(Debug)]
pub struct Node {
    config: EdgeConfig,
    mqtt_addrs: Vec<(String, SocketAddr)>,
    http_addr: Option<SocketAddr>,
    listeners: Vec<Arc<Listener>>,
    ctx: Arc<FrontContext>,
    metrics: Arc<Metrics>,
    spool: Option<spool::SpoolWriter>,
    store: broker::store::SessionStore,
}

impl Node {
    /// Binds every listener and starts serving. Fails with the listener and address that could
    /// not be bound, or the file that could not be loaded.
    pub async fn start(config: EdgeConfig) -> Result<Node, StartError> {
        Self::start_with(config, NodeOptions::default()).await
    }

    /// [`Node::start`] with options. Each step is a subsystem's start, in the order their
    /// handles are needed; the helpers below carry what one hands the next.
    pub async fn start_with(config: EdgeConfig, options: NodeOptions) -> Result<Node, StartError> {
        let auth = AuthState::load(&config.auth)?;
        let (m, metrics) = NodeMetrics::register(&config);
        let tracer = shared::trace::Tracer::start(&config.tracing, "edge-node", env!("CARGO_PKG_VERSION"), m.trace)
            .map_err(StartError::Tracing)?;
        let tasks = Tasks { tracker: TaskTracker::new(), shutdown: CancellationToken::new() };
        let bound = front::bind(&config.listeners).await?;
        let http = match config.http.bind {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|source| StartError::HttpBind { addr, source })?),
            None => None,
        };
        let classes = Arc::new(route::Classes::from_config(&config.classes));
        let (store, state, opened) = open_session_store(&config, m.broker.clone())?;
        let spool = start_spool(&config, &classes, &state, options, m.spool)?;
        // What the cloud's sink stores of one record: the uplink learns it, the broker refuses
        // a cloud-bound publish past it.
        let sink_fit = spool.as_ref().map(|_| Arc::new(spool::SinkFit::load(&config.spool.path)));
        let staged_news = Arc::new(tokio::sync::Notify::new());
        let schemas = start_schemas(&config, m.schemas, &staged_news, &tasks);
        let follows = follows(&config, schemas.as_deref());
        let down_mark = downlink::DownMark::parse(state.marks.get(downlink::MARK_KEY).map(String::as_str));
        let core = Parts { classes: classes.clone(), sink_fit: sink_fit.clone(), schemas: schemas.clone() };
        let core = broker_core(&config, &auth, core, state, m.broker.clone(), opened);
        let broker = BrokerHandle::traced(core, spool.clone(), Some(store.clone()), tracer.clone());
        tasks.tracker.spawn(broker.clone().run_timers(tasks.shutdown.clone()));
        let ctx = front_context(&config, auth, m.front.clone(), broker.clone(), schemas.clone(), &tracer, &tasks)?;
        let (listeners, mqtt_addrs) = serve_listeners(bound, &ctx)?;
        // What the uplink measures of its link: the TCO model and readiness read it.
        let link = Arc::new(LinkFigures::default());
        // The TCO model's last answer: the model writes it, the uplink and `/tco` read it.
        let (tco_latest, tco_snapshot) = tokio::sync::watch::channel(Snapshot::default());
        let checks = health::Checks {
            config: config.health.clone(),
            probe: Health {
                metrics: m.probe.clone(),
                interval: config.probe.enabled.then_some(config.probe.interval.0),
            },
            store: store.clone(),
            spool: spool.clone().map(|s| (s, config.spool.budget.bytes())),
            link: config.uplink.as_ref().map(|_| link.clone()),
        };
        let http_addr =
            http.and_then(|socket| serve_http(socket, checks, metrics.clone(), tco_snapshot.clone(), &tasks));
        let connector = Connector::new(broker.clone());
        if config.probe.enabled {
            let (probe, id) = (config.probe.clone(), config.node_id.clone());
            tasks.tracker.spawn(probe::run(connector.clone(), probe, id, m.probe, tasks.shutdown.clone()));
        }
        start_sys(&config, &broker, &m.broker, &m.front, &connector, &tasks);
        let model_jobs = start_models(&config, follows.clone(), m.models, &connector, staged_news, &tasks)?;
        if let (Some(uplink), Some(spool)) = (&config.uplink, &spool) {
            // The user whose ACL a downlink entry names, as `[auth]` is now.
            let auth_of = ctx.clone();
            let rules_of: downlink::RulesOf =
                Arc::new(move |user: &str| auth_of.auth.load().rules_of_user(user, downlink::CLIENT_ID));
            let down = downlink::DownCore::new(downlink::Governance::new(&config.downlink), rules_of, down_mark);
            let task = uplink::Uplink {
                client: uplink::quic::client_config(uplink)?,
                config: uplink.clone(),
                spool: spool.clone(),
                metrics: m.uplink,
                link: link.clone(),
                models: follows,
                model_jobs,
                tco: config.tco.as_ref().map(|t| (tco_snapshot.clone(), t.interval.0)),
                spool_path: Some(config.spool.path.clone()),
                sink_fit,
                tracer: tracer.clone(),
                broker: broker.clone(),
                // Avro and Protobuf payloads go column-wise by the version they were validated
                // against, while it is the one staged.
                shapes: schemas.map(|v| v as Arc<dyn shared::proto::columns::Shapes + Send + Sync>),
            };
            tasks.tracker.spawn(task.run(down, tasks.shutdown.clone()));
        }
        if let Some(tco) = &config.tco {
            let task = tco::run(tco.clone(), classes, link, m.tco, tco_latest, tasks.shutdown.clone());
            tasks.tracker.spawn(task);
        }
        Ok(Node { config, mqtt_addrs, http_addr, listeners, ctx, metrics, spool, store })
    }

    /// Bound MQTT listeners, by name, in config order.
    pub fn mqtt_addrs(&self) -> &[(String, SocketAddr)] {
        &self.mqtt_addrs
    }

    /// The bound address of the listener called `name`.
    pub fn mqtt_addr(&self, name: &str) -> Option<SocketAddr> {
        self.mqtt_addrs.iter().find(|(n, _)| n == name).map(|(_, a)| *a)
    }

    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn config(&self) -> &EdgeConfig {
        &self.config
    }

    /// Applies `now` (edge.toml read again) where it can change live: the password and ACL
    /// files its `[auth]` names and the certificates its listeners name (the same listeners,
    /// by name). Returns the keys that changed and wait for a restart.
    pub fn reload_from(&self, now: &EdgeConfig) -> Result<Vec<String>, ReloadError> {
        let auth = AuthState::load(&now.auth)?;
        let mut acceptors = Vec::new();
        let by_name = |name: &str| now.listeners.iter().find(|l| l.name == name);
        for (listener, lc) in
            self.listeners.iter().zip(self.config.listeners.iter().map(|l| by_name(&l.name).unwrap_or(l)))
        {
            if let (Some(slot), Some(tc)) = (&listener.tls, &lc.tls) {
                let server =
                    tls::server_config(tc).map_err(|source| ReloadError::Tls { name: lc.name.clone(), source })?;
                acceptors.push((slot, TlsAcceptor::from(server)));
            }
        }
        self.ctx.auth.store(Arc::new(auth));
        self.ctx.auth_generation.fetch_add(1, Ordering::AcqRel);
        // Every session at once, connected or not: a subscriber that sends nothing (keep-alive
        // 0) and an offline session both lose what the new rules no longer allow now.
        let auth = self.ctx.auth.load();
        let rules_of = |owner: &str, client_id: &str| front::rules_of_owner(&auth, owner, client_id);
        let (_, routed) = self.ctx.broker.with(|b| b.reload_rules(&rules_of, std::time::Instant::now()));
        drop(routed);
        for (slot, acceptor) in acceptors {
            slot.store(Arc::new(acceptor));
        }
        tracing::info!("reloaded credentials, ACL and certificates");
        Ok(self.config.restart_needed(now))
    }

    /// Stops accepting, disconnects clients (MQTT 5 clients get reason 0x8B) and waits up to
    /// `deadline` for every task to finish.
    pub async fn shutdown(self, deadline: Duration) {
        self.ctx.shutdown.cancel();
        self.ctx.tracker.close();
        if tokio::time::timeout(deadline, self.ctx.tracker.wait()).await.is_err() {
            tracing::warn!(remaining = self.ctx.tracker.len(), "shutdown deadline passed with tasks still running");
        }
        // Every connection is gone: what their ends routed goes to the spool, which commits
        // everything it holds, and the sessions' last records are written, before exiting.
        self.ctx.broker.run_orphans().await;
        if let Some(spool) = &self.spool {
            spool.shutdown().await;
        }
        let store = self.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.close()).await;
        // The last spans go out; bounded by `tracing.timeout`.
        let tracer = self.ctx.tracer.clone();
        let _ = tokio::task::spawn_blocking(move || tracer.shutdown()).await;
    }
}

/// Every subsystem's metrics, registered whether or not the subsystem runs, so a scrape always
/// names the same metrics.
struct NodeMetrics {
    front: FrontMetrics,
    broker: BrokerMetrics,
    probe: ProbeMetrics,
    spool: Arc<WriterMetrics>,
    uplink: UplinkMetrics,
    tco: TcoMetrics,
    models: ModelMetrics,
    schemas: schema::SchemaMetrics,
    trace: Arc<shared::trace::TraceCounts>,
}

impl NodeMetrics {
    fn register(config: &EdgeConfig) -> (Self, Arc<Metrics>) {
        let mut root = metrics::registry();
        let registry = metrics::subsystems(&mut root);
        let m = Self {
            front: FrontMetrics::new(registry),
            broker: BrokerMetrics::new(registry),
            probe: ProbeMetrics::new(registry),
            spool: Arc::new(WriterMetrics::new(registry)),
            uplink: UplinkMetrics::new(registry),
            tco: TcoMetrics::new(registry),
            models: ModelMetrics::new(registry),
            schemas: schema::SchemaMetrics::new(registry),
            trace: Arc::new(shared::trace::TraceCounts::default()),
        };
        m.trace.register(registry);
        m.spool.budget.set(i64::try_from(config.spool.budget.bytes()).unwrap_or(i64::MAX));
        (m, Arc::new(Metrics::new(root)))
    }
}

/// Where the node's tasks run, and what stops them.
struct Tasks {
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

/// The session store as opened: where, and when (its log line says how long the restore took).
struct StoreOpened {
    path: std::path::PathBuf,
    at: std::time::Instant,
}

fn open_session_store(
    config: &EdgeConfig,
    metrics: BrokerMetrics,
) -> Result<(broker::store::SessionStore, broker::core::StoredState, StoreOpened), StartError> {
    let path = config.broker.session_store.clone().unwrap_or_else(|| config.spool.path.with_file_name("sessions.db"));
    let at = std::time::Instant::now();
    let (store, state) = broker::store::SessionStore::open(&path, metrics)?;
    Ok((store, state, StoreOpened { path, at }))
}

/// The spool, unless no class routes to the cloud and there is no uplink: nothing would ever be
/// spooled or sent. With an uplink it is opened even without classes: the uplink session is
/// also how models and downlink messages come.
fn start_spool(
    config: &EdgeConfig,
    classes: &route::Classes,
    state: &broker::core::StoredState,
    options: NodeOptions,
    metrics: Arc<WriterMetrics>,
) -> Result<Option<spool::SpoolWriter>, StartError> {
    if classes.is_empty() && config.uplink.is_none() {
        return Ok(None);
    }
    // The QoS 2 receipts the session store holds: the spool forgets any other before it takes
    // a message (a release whose forgetting a crash cut short).
    let receipts: std::collections::BTreeSet<u64> =
        state.received.iter().map(|&(.., r)| r).filter(|r| *r != 0).collect();
    let quotas = config.classes.iter().filter_map(|c| Some((c.name.clone(), c.quota?.bytes())));
    Ok(Some(spool::start(&config.spool, quotas, &receipts, options.spool_faults, metrics)?))
}

/// Schema bindings check publishes against the versions staged under `[models]` (the config
/// check refuses bindings without it); the validator rereads them as they are staged.
#[cfg(feature = "schema")]
fn start_schemas(
    config: &EdgeConfig,
    metrics: schema::SchemaMetrics,
    staged: &Arc<tokio::sync::Notify>,
    tasks: &Tasks,
) -> Option<Arc<schema::Validator>> {
    let validator = Arc::new(schema::Validator::new(&config.schemas, &config.models.as_ref()?.dir, metrics));
    tasks.tracker.spawn(validator.clone().run(staged.clone(), tasks.shutdown.clone()));
    Some(validator)
}

/// A build without the `schema` feature validates nothing: its config check refuses bindings.
#[cfg(not(feature = "schema"))]
fn start_schemas(
    _: &EdgeConfig,
    _: schema::SchemaMetrics,
    _: &Arc<tokio::sync::Notify>,
    _: &Tasks,
) -> Option<Arc<schema::Validator>> {
    None
}

/// The models to follow: the configured ones and each bound subject's versions.
fn follows(config: &EdgeConfig, schemas: Option<&schema::Validator>) -> Vec<String> {
    let Some(m) = &config.models else { return Vec::new() };
    let subjects = schemas.iter().flat_map(|v| v.subjects()).map(|s| shared::model::schema_model(&s));
    m.follow.iter().cloned().chain(subjects).collect()
}

/// What the broker core is built with besides its config.
struct Parts {
    classes: Arc<route::Classes>,
    sink_fit: Option<Arc<spool::SinkFit>>,
    schemas: Option<Arc<schema::Validator>>,
}

/// The broker core, with the sessions stored before a restart, under today's ACL.
fn broker_core(
    config: &EdgeConfig,
    auth: &AuthState,
    parts: Parts,
    state: broker::core::StoredState,
    metrics: BrokerMetrics,
    opened: StoreOpened,
) -> broker::core::Broker {
    // The probe's topic is the node's own.
    let internal_topics = if config.probe.enabled { vec![config.probe.topic.clone()] } else { Vec::new() };
    // The node's namespace (docs/ARCHITECTURE.md): `_edge/`, the probe's topic wherever it is,
    // and the model announcements, which tell local apps which file to load and so are the
    // node's word alone.
    let mut reserved_topics =
        vec![broker::core::RESERVED_TOPICS.to_owned(), config.probe.topic.clone(), "$SYS/#".to_owned()];
    if let Some(m) = &config.models {
        reserved_topics.push(format!("{}/#", m.topic_prefix));
    }
    let limits = config.broker.limits(internal_topics, reserved_topics);
    let mut core = broker::core::Broker::new(limits, parts.classes, metrics, broker::core::WallClock::read());
    if let Some(fit) = parts.sink_fit {
        core = core.with_sink_limits(fit);
    }
    if let Some(v) = parts.schemas {
        core = core.with_schemas(v);
    }
    let (sessions, queued, retained) = (state.sessions.len(), state.deliveries.len(), state.retained.len());
    core.restore(state, std::time::Instant::now());
    // The stored sessions come back under today's ACL, not the one they were queued under.
    core.reload_rules(&|owner, client_id| front::rules_of_owner(auth, owner, client_id), std::time::Instant::now());
    tracing::info!(
        path = %opened.path.display(),
        sessions,
        queued,
        retained,
        took = ?opened.at.elapsed(),
        "session store open"
    );
    core
}

/// What every client connection shares.
fn front_context(
    config: &EdgeConfig,
    auth: AuthState,
    metrics: FrontMetrics,
    broker: Arc<BrokerHandle>,
    schemas: Option<Arc<schema::Validator>>,
    tracer: &shared::trace::Tracer,
    tasks: &Tasks,
) -> Result<Arc<FrontContext>, StartError> {
    let b = &config.broker;
    Ok(Arc::new(FrontContext {
        max_packet_size: b.max_packet_size.as_usize(),
        max_connect_size: b.max_connect_size.as_usize().min(b.max_packet_size.as_usize()),
        connect_timeout: b.connect_timeout.0,
        slow_client_timeout: b.slow_client_timeout.0,
        auth: ArcSwap::from_pointee(auth),
        auth_generation: AtomicU64::new(0),
        metrics,
        log: shared::log_budget::LogBudget::new(config.log.peer_lines_per_second, std::time::Instant::now()),
        permits: Arc::new(Semaphore::new(b.max_connections)),
        pending: Arc::new(Semaphore::new(b.max_pending_connections)),
        logins: LoginPool::start(
            config.auth.max_concurrent_logins,
            b.max_pending_connections,
            config.auth.login_wait.0,
        )
        .map_err(StartError::LoginThreads)?,
        broker,
        shutdown: tasks.shutdown.clone(),
        tracker: tasks.tracker.clone(),
        tracer: tracer.clone(),
        schemas: schemas.filter(|v| !v.is_empty()),
    }))
}

/// Starts each bound listener's accept loop; the listeners, and their addresses by name, in
/// config order.
type Served = (Vec<Arc<Listener>>, Vec<(String, SocketAddr)>);
fn serve_listeners(bound: Vec<(Arc<Listener>, TcpListener)>, ctx: &Arc<FrontContext>) -> Result<Served, StartError> {
    let (mut listeners, mut addrs) = (Vec::new(), Vec::new());
    for (listener, socket) in bound {
        let addr = socket.local_addr().map_err(|source| front::BindError::Bind {
            name: listener.name.clone(),
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
        tracing::info!(listener = %listener.name, %addr, tls = listener.tls.is_some(), "MQTT listener ready");
        addrs.push((listener.name.clone(), addr));
        ctx.tracker.spawn(front::accept_loop(socket, listener.clone(), ctx.clone()));
        listeners.push(listener);
    }
    Ok((listeners, addrs))
}

/// Serves `/metrics`, `/healthz`, `/readyz` and `/tco` on `socket`; its address.
fn serve_http(
    socket: TcpListener,
    checks: health::Checks,
    metrics: Arc<Metrics>,
    snapshot: tokio::sync::watch::Receiver<Snapshot>,
    tasks: &Tasks,
) -> Option<SocketAddr> {
    let addr = socket.local_addr().ok();
    let checks = Arc::new(checks);
    let ready = checks.clone();
    let endpoints = Endpoints {
        metrics,
        alive: Arc::new(move || {
            let r = checks.alive();
            (r.ok(), r.json())
        }),
        ready: Arc::new(move || {
            let r = ready.ready();
            (r.ok(), r.json())
        }),
        tco: Arc::new(move || {
            let snapshot = snapshot.borrow();
            (!snapshot.classes.is_empty()).then(|| serde_json::to_string_pretty(&*snapshot).unwrap_or_default())
        }),
    };
    tasks.tracker.spawn(metrics::serve(socket, endpoints, tasks.shutdown.clone()));
    tracing::info!(addr = ?addr, "metrics endpoint ready");
    addr
}

/// The `$SYS` topics, every `broker.sys_interval` (none when it is zero).
fn start_sys(
    config: &EdgeConfig,
    broker: &Arc<BrokerHandle>,
    counts: &BrokerMetrics,
    front: &FrontMetrics,
    connector: &Connector,
    tasks: &Tasks,
) {
    if config.broker.sys_interval.0.is_zero() {
        return;
    }
    let (handle, counts, front) = (broker.clone(), counts.clone(), front.clone());
    let stats = move || {
        let (((connected, total), subscriptions, retained), _) =
            handle.with(|b| (b.client_counts(), b.subscription_count(), b.retained_count()));
        sys::Stats {
            clients_connected: connected as u64,
            clients_total: total as u64,
            subscriptions: subscriptions as u64,
            retained: retained as u64,
            messages_received: counts.received.get(),
            messages_sent: counts.publish_out.get(),
            bytes_received: front.bytes_in.get(),
            bytes_sent: front.bytes_out.get(),
        }
    };
    let client_id = format!("{}sys-{}", broker::core::INTERNAL_CLIENT_ID_PREFIX, config.node_id);
    let task = sys::run(connector.clone(), config.broker.sys_interval.0, client_id, stats, tasks.shutdown.clone());
    tasks.tracker.spawn(task);
}

/// The model syncer under `[models]`: it announces every model held at start (the retained
/// announcement may be older than the model directory, or gone with a lost session store),
/// then stages what the bridge announces; the uplink hands it jobs.
fn start_models(
    config: &EdgeConfig,
    follows: Vec<String>,
    metrics: ModelMetrics,
    connector: &Connector,
    staged: Arc<tokio::sync::Notify>,
    tasks: &Tasks,
) -> Result<Option<tokio::sync::mpsc::Sender<models::sync::ModelJob>>, StartError> {
    let Some(m) = &config.models else { return Ok(None) };
    let announcer = models::announce::Announcer {
        connector: connector.clone(),
        prefix: m.topic_prefix.clone(),
        node_id: config.node_id.clone(),
    };
    let syncer = models::sync::Syncer::open(m, follows, metrics, announcer, staged)?;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tasks.tracker.spawn(syncer.run(rx, tasks.shutdown.clone()));
    Ok(Some(tx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::listener_label;

    #[test]
    fn encodes_registered_metrics() {
        let mut root = metrics::registry();
        let front = FrontMetrics::new(metrics::subsystems(&mut root));
        let probe = ProbeMetrics::new(metrics::subsystems(&mut root));
        let m = Metrics::new(root);
        front.connections_total.get_or_create(&listener_label("local")).inc();
        probe.delivered(Duration::from_micros(300));
        let text = m.encode();
        assert!(text.contains("edge_mqtt_connections_total{listener=\"local\"} 1"), "{text}");
        assert!(text.contains("edge_probe_latency_seconds_count 1"), "{text}");
        assert!(probe.since_delivery().is_some());
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
        assert!(text.contains("edge_build_info{version=\""), "{text}");
    }
}
