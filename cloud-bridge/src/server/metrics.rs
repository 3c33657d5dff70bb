//! What the edge sessions count: connections, lag, batches and records taken, sink latency,
//! refusals and ends by reason. Registered by the bridge's `metrics` with the prefix `bridge_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Debug)]
pub struct SessionMetrics {
    pub connected: Gauge,
    pub lag: Gauge,
    pub records: Counter,
    pub batches: Counter,
    pub bytes: Counter,
    pub sink_seconds: Histogram,
    pub dicts_stored: Counter,
    pub refused: Family<ReasonLabel, Counter>,
    pub closed: Family<ReasonLabel, Counter>,
    /// Whether the QUIC accept loop runs (for `/healthz`; not exported).
    pub accepting: std::sync::atomic::AtomicBool,
}

impl Default for SessionMetrics {
    fn default() -> Self {
        Self {
            connected: Gauge::default(),
            lag: Gauge::default(),
            records: Counter::default(),
            batches: Counter::default(),
            bytes: Counter::default(),
            sink_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
            dicts_stored: Counter::default(),
            refused: Family::default(),
            closed: Family::default(),
            accepting: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl SessionMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register("edges_connected", "Edge sessions on this bridge", self.connected.clone());
        r.register(
            "lag_records",
            "Seqs the edges on this bridge hold beyond what the sink committed, all lanes, as of their last pings",
            self.lag.clone(),
        );
        r.register("records", "Records written to the sink", self.records.clone());
        r.register("batches", "Batches received", self.batches.clone());
        r.register("received_bytes", "Batch bytes received (compressed)", self.bytes.clone());
        r.register_with_unit("sink_write", "Sink write latency per batch", Unit::Seconds, self.sink_seconds.clone());
        r.register(
            "dicts_stored",
            "zstd dictionaries edges announced and this bridge stored",
            self.dicts_stored.clone(),
        );
        r.register(
            "connections_refused",
            "Edge connections refused, by reason (rate, connections, handshakes and address_rate before the handshake: limits.handshakes_per_second, limits.max_connections, limits.handshakes_in_flight, limits.cooldown_handshakes_per_second; then handshake, no_identity, edge_rate (limits.edge_handshakes_per_minute), denied_serial; at the hello epoch_retired, epochs_exhausted)",
            self.refused.clone(),
        );
        r.register("sessions_closed", "Edge sessions ended, by reason", self.closed.clone());
    }
}
