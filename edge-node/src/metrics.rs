//! Prometheus metrics and the HTTP endpoint (`/metrics`, `/healthz`).
//!
//! One registry per node (not a global), so several nodes in one test process keep their own
//! counts. Hot paths hold pre-resolved metric handles; label lookups happen per connection, not
//! per message.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub listener: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub connections: Family<ListenerLabel, Gauge>,
    pub connections_total: Family<ListenerLabel, Counter>,
    pub connects_refused: Family<RefusedLabels, Counter>,
    pub disconnects: Family<ReasonLabel, Counter>,
    pub publish_in: Family<ClassLabel, Counter>,
    pub publish_out: Family<ClassLabel, Counter>,
    pub publish_refused: Family<ReasonLabel, Counter>,
    pub subscribe_refused: Family<ReasonLabel, Counter>,
    pub qos1_inflight: Gauge,
    pub slow_subscriber_skips: Counter,
    /// Process-wide jumps already added to `slow_subscriber_skips`.
    skips_seen: AtomicU64,
    pub bytes_in: Counter,
    pub bytes_out: Counter,
    pub probe_latency: Histogram,
    pub probe_sent: Counter,
    pub probe_received: Counter,
    pub probe_lost: Counter,
    pub spool: Arc<crate::spool::WriterMetrics>,
    pub uplink: Arc<crate::uplink::UplinkMetrics>,
    pub tco: Arc<crate::tco::TcoMetrics>,
    pub models: Arc<crate::models::sync::ModelMetrics>,
    /// The TCO model's last answer, served on `/tco`.
    pub tco_latest: Arc<std::sync::Mutex<crate::tco::Snapshot>>,
    /// Milliseconds after `started` of the last probe delivery; 0 before the first.
    probe_last_ok_ms: AtomicU64,
    started: Instant,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("edge");
        let m = Self {
            connections: Family::default(),
            connections_total: Family::default(),
            connects_refused: Family::default(),
            disconnects: Family::default(),
            publish_in: Family::default(),
            publish_out: Family::default(),
            publish_refused: Family::default(),
            subscribe_refused: Family::default(),
            qos1_inflight: Gauge::default(),
            slow_subscriber_skips: Counter::default(),
            skips_seen: AtomicU64::new(crate::broker_log::cursor_jumps()),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            // 50 µs .. ~1.6 s
            probe_latency: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            probe_sent: Counter::default(),
            probe_received: Counter::default(),
            probe_lost: Counter::default(),
            spool: Arc::new(crate::spool::WriterMetrics {
                appended: Family::default(),
                dropped: Family::default(),
                refused: Counter::default(),
                commit_errors: Family::default(),
                // 50 µs .. ~1.6 s
                commit_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
                // Linear where the 10 ms target is judged, then coarse.
                window_seconds: Histogram::new(
                    [0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 12.0, 15.0, 20.0, 50.0, 100.0, 1000.0]
                        .into_iter()
                        .map(|ms| ms / 1000.0),
                ),
                class_records: Family::default(),
                class_bytes: Family::default(),
                oldest_unacked_seconds: Gauge::default(),
                healthy: Gauge::default(),
                moved_aside: Counter::default(),
            }),
            uplink: Arc::default(),
            tco: Arc::default(),
            models: Arc::default(),
            tco_latest: Arc::default(),
            probe_last_ok_ms: AtomicU64::new(0),
            started: Instant::now(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register("mqtt_connections_open", "Open MQTT client connections", m.connections.clone());
        r.register("mqtt_connections", "MQTT client connections accepted", m.connections_total.clone());
        r.register(
            "mqtt_connects_refused",
            "Connections refused at CONNECT or TLS, by reason",
            m.connects_refused.clone(),
        );
        r.register(
            "mqtt_disconnects",
            "Client connections closed by the broker for a limit or an error, by reason",
            m.disconnects.clone(),
        );
        r.register("mqtt_publish_in", "PUBLISH packets accepted from clients, by topic class", m.publish_in.clone());
        r.register("mqtt_publish_out", "PUBLISH packets delivered to clients, by topic class", m.publish_out.clone());
        r.register(
            "mqtt_publish_refused",
            "PUBLISH packets not delivered, by reason (acl, invalid_topic)",
            m.publish_refused.clone(),
        );
        r.register(
            "mqtt_subscribe_refused",
            "Subscription filters refused, by reason (acl, invalid_filter)",
            m.subscribe_refused.clone(),
        );
        r.register(
            "mqtt_qos1_inflight",
            "QoS1 publishes sent and not yet acknowledged, both directions",
            m.qos1_inflight.clone(),
        );
        r.register(
            "mqtt_slow_subscriber_skips",
            "Times a subscriber fell further behind than the broker's bounded backlog (segment_size x segment_count) and skipped messages; each skip loses one or more messages for that subscriber",
            m.slow_subscriber_skips.clone(),
        );
        r.register("mqtt_received_bytes", "Bytes read from MQTT clients", m.bytes_in.clone());
        r.register("mqtt_sent_bytes", "Bytes written to MQTT clients", m.bytes_out.clone());
        r.register_with_unit(
            "probe_latency",
            "SLO probe publish-to-deliver latency through the front and the broker",
            prometheus_client::registry::Unit::Seconds,
            m.probe_latency.clone(),
        );
        r.register("probe_sent", "SLO probe messages published", m.probe_sent.clone());
        r.register("probe_received", "SLO probe messages delivered back", m.probe_received.clone());
        r.register("probe_lost", "SLO probe messages not delivered within 5 s", m.probe_lost.clone());
        r.register(
            "spool_appended",
            "Messages appended to the store-and-forward spool, by class",
            m.spool.appended.clone(),
        );
        r.register(
            "spool_dropped",
            "Spooled messages dropped before the cloud acked them, by class and reason (evicted, expired); each drop is also a gap record sent to the cloud",
            m.spool.dropped.clone(),
        );
        r.register("spool_refused", "Full-durability messages refused for lack of spool room", m.spool.refused.clone());
        r.register(
            "spool_commit_errors",
            "Spool group commits that failed (retried), by kind (disk_full, io, corrupt, other)",
            m.spool.commit_errors.clone(),
        );
        r.register_with_unit(
            "spool_puback_to_commit",
            "For normal-durability messages: from the append (the PUBACK follows it) to the end of the group commit that made it durable; the window in which a crash loses an acknowledged message",
            prometheus_client::registry::Unit::Seconds,
            m.spool.window_seconds.clone(),
        );
        r.register("spool_class_records", "Message records held in the spool, by class", m.spool.class_records.clone());
        r.register(
            "spool_class_bytes",
            "Payload and topic bytes held in the spool, by class (what class quotas count)",
            m.spool.class_bytes.clone(),
        );
        r.register(
            "spool_oldest_unacked_seconds",
            "Age of the oldest message the cloud has not acknowledged; 0 when the spool is empty",
            m.spool.oldest_unacked_seconds.clone(),
        );
        r.register(
            "spool_moved_aside",
            "Spool databases found unusable (corrupt, not a database) at startup and moved aside; their data is kept in <path>.corrupt-<ms> for recovery",
            m.spool.moved_aside.clone(),
        );
        r.register(
            "spool_healthy",
            "1 while the spool's last commit succeeded, 0 while commits fail (disk full, I/O errors)",
            m.spool.healthy.clone(),
        );
        r.register_with_unit(
            "spool_commit",
            "Spool group commit duration",
            prometheus_client::registry::Unit::Seconds,
            m.spool.commit_seconds.clone(),
        );
        m.uplink.register(r);
        m.tco.register(r);
        m.models.register(r);
        Self { registry, ..m }
    }

    pub fn encode(&self) -> String {
        let jumps = crate::broker_log::cursor_jumps();
        let before = self.skips_seen.swap(jumps, Ordering::Relaxed);
        self.slow_subscriber_skips.inc_by(jumps.saturating_sub(before));
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            out = format!("# encoding failed: {e}\n");
        }
        out
    }

    pub fn probe_delivered(&self, latency: Duration) {
        self.probe_latency.observe(latency.as_secs_f64());
        self.probe_received.inc();
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX).max(1);
        self.probe_last_ok_ms.store(ms, Ordering::Relaxed);
    }

    /// Time since the probe last saw a delivery, `None` if it never has.
    pub fn since_probe_delivery(&self) -> Option<Duration> {
        match self.probe_last_ok_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(self.started.elapsed().saturating_sub(Duration::from_millis(ms))),
        }
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// What `/healthz` needs to decide.
#[derive(Debug, Clone)]
pub struct HealthState {
    pub metrics: Arc<Metrics>,
    /// None when the probe is disabled: health then only says the process serves HTTP.
    pub probe_interval: Option<Duration>,
}

impl HealthState {
    /// `Err(reason)` when the node should be taken out of service.
    pub fn check(&self) -> Result<(), String> {
        let Some(interval) = self.probe_interval else {
            return Ok(());
        };
        // Allow a start-up grace and a few missed probes before calling the broker unhealthy.
        let limit = interval * 10 + Duration::from_secs(2);
        match self.metrics.since_probe_delivery() {
            Some(age) if age > limit => Err(format!("no probe message delivered for {age:?}")),
            None if self.metrics.uptime() > limit => Err("no probe message delivered yet".into()),
            _ => Ok(()),
        }
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until `shutdown`.
pub async fn serve(listener: tokio::net::TcpListener, state: HealthState, shutdown: CancellationToken) {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics_handler))
        .route("/healthz", axum::routing::get(health_handler))
        .route("/tco", axum::routing::get(tco_handler))
        .with_state(state);
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::error!(error = %e, "metrics endpoint failed");
    }
}

async fn metrics_handler(State(state): State<HealthState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], state.metrics.encode())
}

async fn tco_handler(State(state): State<HealthState>) -> impl IntoResponse {
    let snapshot = state.metrics.tco_latest.lock().map(|s| s.clone()).unwrap_or_default();
    if snapshot.classes.is_empty() {
        return (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain")], "no [tco] section\n".to_owned());
    }
    let body = serde_json::to_string_pretty(&snapshot).unwrap_or_default();
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body)
}

async fn health_handler(State(state): State<HealthState>) -> impl IntoResponse {
    match state.check() {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("unhealthy: {reason}\n")),
    }
}

/// The metric for `label`, cloned out of its family. `get_or_create` returns a read guard: held
/// across a second call on the same family (as temporaries in one expression are), a create
/// there needs the write lock and deadlocks. Going through this function drops it at once.
pub fn handle<L, M>(family: &Family<L, M>, label: &L) -> M
where
    L: Clone + std::hash::Hash + Eq,
    M: Clone + Default,
{
    family.get_or_create(label).clone()
}

pub fn listener_label(name: &str) -> ListenerLabel {
    ListenerLabel { listener: name.to_owned() }
}

pub fn class_label(class: &str) -> ClassLabel {
    ClassLabel { class: class.to_owned() }
}

pub fn reason(reason: &'static str) -> ReasonLabel {
    ReasonLabel { reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_registered_metrics() {
        let m = Metrics::new();
        m.connections_total.get_or_create(&listener_label("local")).inc();
        m.probe_delivered(Duration::from_micros(300));
        let text = m.encode();
        assert!(text.contains("edge_mqtt_connections_total{listener=\"local\"} 1"), "{text}");
        assert!(text.contains("edge_probe_latency_seconds_count 1"), "{text}");
        assert!(m.since_probe_delivery().is_some());
    }
}
