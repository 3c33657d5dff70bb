//! What the edge sessions count: connections, lag, batches and records taken, sink latency,
//! refusals and ends by reason. Registered by the bridge's `metrics` with the prefix `bridge_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    pub reason: &'static str,
}

shared::metrics! {
    #[derive(Debug)]
    pub struct SessionMetrics {
        pub connected: Gauge => ("edges_connected", "Edge sessions on this bridge"),
        pub lag: Gauge => (
            "lag_records",
            "Seqs the edges on this bridge hold beyond what the sink committed, all lanes, as of their last pings"
        ),
        pub records: Counter => ("records", "Records written to the sink"),
        pub batches: Counter => ("batches", "Batches received"),
        pub bytes: Counter => ("received_bytes", "Batch bytes received (compressed)"),
        pub sink_seconds: Histogram => (
            "sink_write",
            "Sink write latency per batch",
            unit Seconds,
            init Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
        ),
        pub dicts_stored: Counter => ("dicts_stored", "zstd dictionaries edges announced and this bridge stored"),
        pub refused: Family<ReasonLabel, Counter> => (
            "connections_refused",
            "Edge connections refused, by reason (rate, connections, handshakes and address_rate before the handshake: limits.handshakes_per_second, limits.max_connections, limits.handshakes_in_flight, limits.cooldown_handshakes_per_second; then handshake, no_identity, edge_rate (limits.edge_handshakes_per_minute), denied_serial; at the hello epoch_retired, epochs_exhausted)"
        ),
        pub closed: Family<ReasonLabel, Counter> => ("sessions_closed", "Edge sessions ended, by reason"),
        /// Whether the QUIC accept loop runs (for `/healthz`; not exported).
        pub accepting: std::sync::atomic::AtomicBool => (not exported),
    }
}
