//! What the downlink counts, all edges together (no metric names an edge: the fleet view does).
//! Registered by the bridge's `metrics` with the prefix `bridge_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabel {
    pub outcome: &'static str,
}

shared::metrics! {
    #[derive(Debug)]
    pub struct DownlinkMetrics {
        /// Messages sent to edges (a resend on a new session counts again).
        pub sent: Counter => ("downlink_sent", "Downlink messages sent to edges, resends included"),
        /// Messages edges acked, by outcome: delivered, refused, expired.
        pub done: Family<OutcomeLabel, Counter> => (
            "downlink_done",
            "Downlink messages edges finished, by outcome (delivered, refused, expired)"
        ),
        /// Messages set aside as published past an edge's backlog bound by a client other than
        /// `send` (JetStream).
        pub trimmed: Counter => (
            "downlink_trimmed",
            "Downlink messages set aside as published past an edge's backlog bound by a client other than send"
        ),
        /// Messages waiting for edges, the whole fleet, as of the last summary.
        pub backlog: Gauge => (
            "downlink_backlog_messages",
            "Downlink messages waiting in the sink for edges, all edges (every downlink.summary_interval)"
        ),
        /// How long the oldest of them has waited, seconds.
        pub oldest: Gauge => (
            "downlink_oldest_pending",
            "How long the oldest downlink message waiting for any edge has waited",
            unit Seconds
        ),
        /// Messages the bridge set aside itself (headers that do not parse).
        pub invalid: Counter => (
            "downlink_invalid",
            "Downlink messages set aside by the bridge: stored with headers that do not parse"
        ),
    }
}

impl DownlinkMetrics {
    pub(crate) fn count(&self, outcome: &'static str, n: u64) {
        if n > 0 {
            self.done.get_or_create(&OutcomeLabel { outcome }).inc_by(n);
        }
    }
}
