//! The bridge's Prometheus metrics and its HTTP endpoint: `/metrics`, and `/healthz` for a load
//! balancer (healthy while the QUIC endpoint runs and the sink took its last write).

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
pub struct EdgeLabel {
    pub edge: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabels {
    pub edge: String,
    pub lane: u8,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub connected: Family<EdgeLabel, Gauge>,
    pub committed: Family<LaneLabels, Gauge>,
    pub lag: Family<LaneLabels, Gauge>,
    pub records: Family<EdgeLabel, Counter>,
    pub batches: Family<EdgeLabel, Counter>,
    pub bytes: Family<EdgeLabel, Counter>,
    pub sink_seconds: Histogram,
    pub dicts_stored: Counter,
    pub refused: Family<ReasonLabel, Counter>,
    pub closed: Family<ReasonLabel, Counter>,
    pub sink: Arc<crate::sink::SinkMetrics>,
    pub models: Arc<crate::models::serve::ServeMetrics>,
    pub limits: Arc<crate::limits::LimitMetrics>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("bridge");
        let m = Self {
            registry: Registry::default(),
            connected: Family::default(),
            committed: Family::default(),
            lag: Family::default(),
            records: Family::default(),
            batches: Family::default(),
            bytes: Family::default(),
            sink_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
            dicts_stored: Counter::default(),
            refused: Family::default(),
            closed: Family::default(),
            sink: Arc::default(),
            models: Arc::default(),
            limits: Arc::default(),
        };
        m.models.register(&mut registry);
        m.limits.register(&mut registry);
        m.sink.register(&mut registry);
        let r = &mut registry;
        r.register("edge_connected", "1 while the edge has a session on this bridge", m.connected.clone());
        r.register("committed_seq", "Highest seq committed per edge and lane (this epoch)", m.committed.clone());
        r.register(
            "lag_records",
            "Seqs an edge holds beyond what the sink committed, per lane, as of its last ping",
            m.lag.clone(),
        );
        r.register("records", "Records written to the sink, by edge", m.records.clone());
        r.register("batches", "Batches received, by edge", m.batches.clone());
        r.register("received_bytes", "Batch bytes received (compressed), by edge", m.bytes.clone());
        r.register_with_unit("sink_write", "Sink write latency per batch", Unit::Seconds, m.sink_seconds.clone());
        r.register("dicts_stored", "zstd dictionaries edges announced and this bridge stored", m.dicts_stored.clone());
        r.register(
            "connections_refused",
            "Edge connections refused, by reason (rate and connections before the handshake: limits.handshakes_per_second, limits.max_connections; then handshake, no_identity, denied_serial; at the hello epoch_retired, epochs_exhausted)",
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

pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics_handler))
        .route("/healthz", axum::routing::get(health_handler))
        .with_state(metrics);
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::error!(error = %e, "metrics endpoint failed");
    }
}

async fn metrics_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], m.encode())
}

async fn health_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    if m.sink.healthy() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unhealthy: the sink's last write failed\n")
    }
}
