//! The front's metrics: connections, refusals at CONNECT, bytes. What happens to publishes and
//! subscriptions is the broker core's to count (`broker::metrics`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::labels::{ListenerLabel, RefusedLabels};

#[derive(Debug, Clone)]
pub struct FrontMetrics {
    pub connections: Family<ListenerLabel, Gauge>,
    pub connections_total: Family<ListenerLabel, Counter>,
    pub connects_refused: Family<RefusedLabels, Counter>,
    pub qos1_inflight: Gauge,
    pub bytes_in: Counter,
    pub bytes_out: Counter,
    /// Lines about unauthenticated peers held back by `log.peer_lines_per_second`.
    pub log_suppressed: Counter,
}

impl FrontMetrics {
    pub fn new(r: &mut Registry) -> Self {
        let m = Self {
            connections: Family::default(),
            connections_total: Family::default(),
            connects_refused: Family::default(),
            qos1_inflight: Gauge::default(),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            log_suppressed: Counter::default(),
        };
        r.register("mqtt_connections_open", "Open MQTT client connections", m.connections.clone());
        r.register("mqtt_connections", "MQTT client connections accepted", m.connections_total.clone());
        r.register(
            "mqtt_connects_refused",
            "Connections refused at CONNECT or TLS, by reason",
            m.connects_refused.clone(),
        );
        r.register(
            "mqtt_qos1_inflight",
            "QoS1 publishes sent and not yet acknowledged, both directions",
            m.qos1_inflight.clone(),
        );
        r.register("mqtt_received_bytes", "Bytes read from MQTT clients", m.bytes_in.clone());
        r.register("mqtt_sent_bytes", "Bytes written to MQTT clients", m.bytes_out.clone());
        r.register(
            "log_lines_suppressed",
            "Log lines about clients not yet logged in held back by log.peer_lines_per_second",
            m.log_suppressed.clone(),
        );
        m
    }
}
