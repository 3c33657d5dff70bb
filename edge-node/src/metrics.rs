//! The node's metrics registry and its HTTP endpoint (`/metrics`, `/healthz`, `/readyz`, `/tco`).
//!
//! One registry per node (not a global), so several nodes in one test process keep their own
//! counts. Each subsystem builds and registers its own metrics into it at start (`lib.rs` hands
//! it round); hot paths hold pre-resolved metric handles, and label lookups happen per
//! connection, not per message. Nothing reads a value back out of a metric to decide: values
//! that travel between subsystems go on their own handles.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// `[http]`: the endpoint serving `/metrics`, `/healthz` and `/tco`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Address for `/metrics` and `/healthz`; absent disables the endpoint.
    /// Default: `127.0.0.1:9464`.
    #[serde(default = "default_http_bind")]
    pub bind: Option<SocketAddr>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self { bind: default_http_bind() }
    }
}

fn default_http_bind() -> Option<SocketAddr> {
    Some(SocketAddr::from(([127, 0, 0, 1], 9464)))
}

/// The node's registry: the process's metrics (`process_*`) and `edge_build_info` at its root
/// (`shared::process`), the subsystems' in [`subsystems`] under the prefix `edge_`.
pub(crate) fn registry() -> Registry {
    let mut root = Registry::default();
    shared::process::register(&mut root, "edge", env!("CARGO_PKG_VERSION"));
    root
}

/// Where the subsystems register theirs: `root`'s part with the node's prefix.
pub(crate) fn subsystems(root: &mut Registry) -> &mut Registry {
    root.sub_registry_with_prefix("edge")
}

/// The registry once every subsystem registered.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    pub(crate) fn new(registry: Registry) -> Self {
        Self { registry }
    }

    /// Everything registered, in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            out = format!("# encoding failed: {e}\n");
        }
        out
    }
}

/// A health endpoint's answer: whether every check passed, and the JSON naming each.
pub(crate) type HealthCheck = Arc<dyn Fn() -> (bool, String) + Send + Sync>;
/// `/tco`'s body: the TCO model's last answer as JSON, `None` without a `[tco]` section.
pub(crate) type TcoJson = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// What the endpoint serves.
#[derive(Clone)]
pub(crate) struct Endpoints {
    pub metrics: Arc<Metrics>,
    /// `/healthz`: alive.
    pub alive: HealthCheck,
    /// `/readyz`: serving and making progress.
    pub ready: HealthCheck,
    pub tco: TcoJson,
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoints").finish_non_exhaustive()
    }
}

/// Serves the endpoints on `listener` until `shutdown`.
pub(crate) async fn serve(listener: tokio::net::TcpListener, state: Endpoints, shutdown: CancellationToken) {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics_handler))
        .route("/healthz", axum::routing::get(alive_handler))
        .route("/readyz", axum::routing::get(ready_handler))
        .route("/tco", axum::routing::get(tco_handler))
        .with_state(state);
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::error!(error = %e, "metrics endpoint failed");
    }
}

async fn metrics_handler(State(state): State<Endpoints>, headers: axum::http::HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = shared::exposition::respond(accept, state.metrics.encode());
    ([(header::CONTENT_TYPE, content_type)], body)
}

async fn tco_handler(State(state): State<Endpoints>) -> impl IntoResponse {
    match (state.tco)() {
        Some(body) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body),
        None => (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain")], "no [tco] section\n".to_owned()),
    }
}

async fn alive_handler(State(state): State<Endpoints>) -> impl IntoResponse {
    health_response((state.alive)())
}

async fn ready_handler(State(state): State<Endpoints>) -> impl IntoResponse {
    health_response((state.ready)())
}

fn health_response((ok, json): (bool, String)) -> impl IntoResponse {
    let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, [(header::CONTENT_TYPE, "application/json")], json)
}
