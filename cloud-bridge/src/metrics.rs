//! The bridge's Prometheus metrics and its HTTP endpoint: `/metrics`, `/healthz` (alive: the
//! QUIC endpoint accepts edges) and `/readyz` for a load balancer (alive, and the sink took its
//! last write), each a JSON naming its checks, and the fleet view's `/edges` (`fleet::view`).
//!
//! No series carries an edge id: with 10,000 edges a bridge would export tens of thousands of
//! series, and a scrape would cost more than the traffic. Per-edge detail is the fleet view's.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// Every subsystem's metrics, in one registry with the prefix `bridge_`, beside the process's
/// (`process_*`) and `bridge_build_info` (`shared::process`).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub server: Arc<crate::server::metrics::SessionMetrics>,
    pub sink: Arc<crate::sink::SinkMetrics>,
    pub models: Arc<crate::models::serve::ServeMetrics>,
    pub limits: Arc<crate::limits::LimitMetrics>,
    pub fleet: Arc<crate::fleet::FleetMetrics>,
    pub trace: Arc<shared::trace::TraceCounts>,
    pub downlink: Arc<crate::downlink::DownlinkMetrics>,
    pub schemas: Arc<crate::schemas::api::RegistryMetrics>,
    pub framed: Arc<crate::schemas::frame::FrameMetrics>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut root = Registry::default();
        shared::process::register(&mut root, "bridge", env!("CARGO_PKG_VERSION"));
        let registry = root.sub_registry_with_prefix("bridge");
        let m = Self {
            registry: Registry::default(),
            server: Arc::default(),
            sink: Arc::default(),
            models: Arc::default(),
            limits: Arc::default(),
            fleet: Arc::default(),
            trace: Arc::default(),
            downlink: Arc::default(),
            schemas: Arc::default(),
            framed: Arc::default(),
        };
        m.models.register(registry);
        m.limits.register(registry);
        m.sink.register(registry);
        m.fleet.register(registry);
        m.server.register(registry);
        m.trace.register(registry);
        m.downlink.register(registry);
        m.schemas.register(registry);
        m.framed.register(registry);
        Self { registry: root, ..m }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Serves `/metrics`, `/healthz`, `/readyz`, `/edges`, the console (`/console`, `/tco`,
/// `/dead-letters`) and the Schema Registry REST API (`schemas::api`) until `shutdown`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    fleet: Arc<crate::fleet::view::Served>,
    console: Arc<crate::console::Console>,
    schema_registry: axum::Router,
    shutdown: CancellationToken,
) {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics_handler))
        .route("/healthz", axum::routing::get(alive_handler))
        .route("/readyz", axum::routing::get(ready_handler))
        .with_state(metrics)
        .merge(axum::Router::new().route("/edges", axum::routing::get(edges_handler)).with_state(fleet))
        .merge(crate::console::routes(console))
        .merge(schema_registry);
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::error!(error = %e, "metrics endpoint failed");
    }
}

async fn metrics_handler(State(m): State<Arc<Metrics>>, headers: axum::http::HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = shared::exposition::respond(accept, m.encode());
    ([(header::CONTENT_TYPE, content_type)], body)
}

async fn edges_handler(State(fleet): State<Arc<crate::fleet::view::Served>>) -> axum::response::Response {
    match fleet.json().await {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json.as_str().to_owned()).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("the fleet view cannot be read: {e}\n")).into_response(),
    }
}

/// One check of `/healthz` or `/readyz`.
#[derive(Debug, serde::Serialize)]
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

impl Metrics {
    fn quic_check(&self) -> Check {
        match self.server.accepting.load(std::sync::atomic::Ordering::Relaxed) {
            true => Check { name: "quic", ok: true, detail: "accepting edges".into() },
            false => Check {
                name: "quic",
                ok: false,
                detail: "the QUIC endpoint is not accepting (starting or stopping)".into(),
            },
        }
    }

    fn sink_check(&self) -> Check {
        let (ok, detail) = self.sink.health.check();
        Check { name: "sink", ok, detail }
    }
}

fn health_response(checks: Vec<Check>) -> axum::response::Response {
    let ok = checks.iter().all(|c| c.ok);
    let body = serde_json::json!({ "status": if ok { "ok" } else { "failing" }, "checks": checks });
    let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, [(header::CONTENT_TYPE, "application/json")], format!("{body:#}\n")).into_response()
}

/// `/healthz`: alive (the QUIC endpoint accepts edges).
async fn alive_handler(State(m): State<Arc<Metrics>>) -> axum::response::Response {
    health_response(vec![m.quic_check()])
}

/// `/readyz`: alive, and the sink takes writes (its newest write or probe went through).
async fn ready_handler(State(m): State<Arc<Metrics>>) -> axum::response::Response {
    health_response(vec![m.quic_check(), m.sink_check()])
}
