//! The front's metrics: connections, refusals at CONNECT, bytes. What happens to publishes and
//! subscriptions is the broker core's to count (`broker::metrics`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::labels::{ListenerLabel, RefusedLabels};

shared::metrics! {
    #[derive(Debug, Clone)]
    pub struct FrontMetrics {
        pub connections: Family<ListenerLabel, Gauge> => ("mqtt_connections_open", "Open MQTT client connections"),
        pub connections_total: Family<ListenerLabel, Counter> => (
            "mqtt_connections",
            "MQTT client connections accepted"
        ),
        pub connects_refused: Family<RefusedLabels, Counter> => (
            "mqtt_connects_refused",
            "Connections refused at CONNECT or TLS, by reason"
        ),
        pub qos1_inflight: Gauge => (
            "mqtt_qos1_inflight",
            "QoS1 publishes sent and not yet acknowledged, both directions"
        ),
        pub bytes_in: Counter => ("mqtt_received_bytes", "Bytes read from MQTT clients"),
        pub bytes_out: Counter => ("mqtt_sent_bytes", "Bytes written to MQTT clients"),
        /// Lines about unauthenticated peers held back by `log.peer_lines_per_second`.
        pub log_suppressed: Counter => (
            "log_lines_suppressed",
            "Log lines about clients not yet logged in held back by log.peer_lines_per_second"
        ),
    }
}

impl FrontMetrics {
    /// The front's metrics, registered in `r`.
    pub(crate) fn new(r: &mut Registry) -> Self {
        let m = Self::default();
        m.register(r);
        m
    }
}
