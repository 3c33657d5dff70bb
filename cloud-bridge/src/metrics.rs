//! The bridge's Prometheus metrics and its HTTP endpoint: `/metrics`, `/healthz` for a load
//! balancer (healthy while the QUIC endpoint runs and the sink took its last write), and the
//! fleet view's `/edges` (`fleet::view`).
//!
//! No series carries an edge id: with 10,000 edges a bridge would export tens of thousands of
//! series, and a scrape would cost more than the traffic. Per-edge detail is the fleet view's.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub connected: Gauge,
    pub lag: Gauge,
    pub records: Counter,
    pub batches: Counter,
    pub bytes: Counter,
    pub sink_seconds: Histogram,
    pub dicts_stored: Counter,
    pub refused: Family<ReasonLabel, Counter>,
    pub closed: Family<ReasonLabel, Counter>,
    pub sink: Arc<crate::sink::SinkMetrics>,
    pub models: Arc<crate::models::serve::ServeMetrics>,
    pub limits: Arc<crate::limits::LimitMetrics>,
    pub fleet: Arc<crate::fleet::FleetMetrics>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("bridge");
        let m = Self {
            registry: Registry::default(),
            connected: Gauge::default(),
            lag: Gauge::default(),
            records: Counter::default(),
            batches: Counter::default(),
            bytes: Counter::default(),
            sink_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
            dicts_stored: Counter::default(),
            refused: Family::default(),
            closed: Family::default(),
            sink: Arc::default(),
            models: Arc::default(),
            limits: Arc::default(),
            fleet: Arc::default(),
        };
        m.models.register(&mut registry);
        m.limits.register(&mut registry);
        m.sink.register(&mut registry);
        m.fleet.register(&mut registry);
        let r = &mut registry;
        r.register("edges_connected", "Edge sessions on this bridge", m.connected.clone());
        r.register(
            "lag_records",
            "Seqs the edges on this bridge hold beyond what the sink committed, all lanes, as of their last pings",
            m.lag.clone(),
        );
        r.register("records", "Records written to the sink", m.records.clone());
        r.register("batches", "Batches received", m.batches.clone());
        r.register("received_bytes", "Batch bytes received (compressed)", m.bytes.clone());
        r.register_with_unit("sink_write", "Sink write latency per batch", Unit::Seconds, m.sink_seconds.clone());
        r.register("dicts_stored", "zstd dictionaries edges announced and this bridge stored", m.dicts_stored.clone());
        r.register(
            "connections_refused",
            "Edge connections refused, by reason (rate, connections and handshakes before the handshake: limits.handshakes_per_second, limits.max_connections, limits.handshakes_in_flight; then handshake, no_identity, denied_serial; at the hello epoch_retired, epochs_exhausted)",
            m.refused.clone(),
        );
        r.register("sessions_closed", "Edge sessions ended, by reason", m.closed.clone());
        Self { registry, ..m }
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

/// Serves `/metrics`, `/healthz` and `/edges` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    fleet: Arc<crate::fleet::view::Served>,
    shutdown: CancellationToken,
) {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics_handler))
        .route("/healthz", axum::routing::get(health_handler))
        .with_state(metrics)
        .merge(axum::Router::new().route("/edges", axum::routing::get(edges_handler)).with_state(fleet));
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::error!(error = %e, "metrics endpoint failed");
    }
}

async fn metrics_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], m.encode())
}

async fn edges_handler(State(fleet): State<Arc<crate::fleet::view::Served>>) -> axum::response::Response {
    match fleet.json().await {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json.as_str().to_owned()).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("the fleet view cannot be read: {e}\n")).into_response(),
    }
}

async fn health_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    if m.sink.healthy() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unhealthy: the sink's last write failed\n")
    }
}
