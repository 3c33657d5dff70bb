//! The broker's metrics: sessions, subscriptions, retained messages, what the core refused,
//! dropped and disconnected, by reason; and the session store's commits.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::labels::{ClassLabel, ReasonLabel, class_label, handle, reason};

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ToLabel {
    to: &'static str,
}

#[derive(Debug, Clone)]
pub struct BrokerMetrics {
    pub sessions: Gauge,
    pub subscriptions: Gauge,
    retained_messages: Gauge,
    retained_bytes: Gauge,
    pub wills: Counter,
    /// PUBLISH packets accepted, by the class their topic is in (`[[class]]`; `edge-direct`
    /// when none matches, `internal` for the node's own clients), resolved per class once
    /// ([`BrokerMetrics::resolve_classes`]) so a publish takes no label lookup.
    publish_in: Family<ClassLabel, Counter>,
    class_in: Vec<Counter>,
    edge_direct_in: Counter,
    publish_in_internal: Counter,
    /// Every client's publishes together (not the node's own), for
    /// `$SYS/broker/messages/received` (not exported).
    pub received: Counter,
    /// Deliveries to clients and to the node's own clients.
    pub publish_out: Counter,
    pub publish_out_internal: Counter,
    dropped: Family<ReasonLabel, Counter>,
    publish_refused: Family<ReasonLabel, Counter>,
    subscribe_refused: Family<ReasonLabel, Counter>,
    disconnects: Family<ReasonLabel, Counter>,
    /// Publisher backpressure (`core/backpressure.rs`).
    pub backpressure_holds: Counter,
    pub backpressure_stalls: Counter,
    /// The session store (`store.rs`).
    pub store_commit_seconds: Histogram,
    pub store_errors: Counter,
    pub store_healthy: Gauge,
    pub store_pending: Gauge,
}

impl BrokerMetrics {
    pub fn new(r: &mut Registry) -> Self {
        let publish_in: Family<ClassLabel, Counter> = Family::default();
        let publish_out: Family<ToLabel, Counter> = Family::default();
        let m = Self {
            sessions: Gauge::default(),
            subscriptions: Gauge::default(),
            retained_messages: Gauge::default(),
            retained_bytes: Gauge::default(),
            wills: Counter::default(),
            class_in: Vec::new(),
            edge_direct_in: handle(&publish_in, &class_label("edge-direct")),
            publish_in_internal: handle(&publish_in, &class_label("internal")),
            publish_in: publish_in.clone(),
            received: Counter::default(),
            publish_out: handle(&publish_out, &ToLabel { to: "clients" }),
            publish_out_internal: handle(&publish_out, &ToLabel { to: "node" }),
            dropped: Family::default(),
            publish_refused: Family::default(),
            subscribe_refused: Family::default(),
            disconnects: Family::default(),
            backpressure_holds: Counter::default(),
            backpressure_stalls: Counter::default(),
            // 50 µs .. ~1.6 s
            store_commit_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            store_errors: Counter::default(),
            store_healthy: Gauge::default(),
            store_pending: Gauge::default(),
        };
        r.register_with_unit(
            "session_store_commit",
            "Session store group commits (durable sessions' queues, QoS 2 ids, wills, retained messages): their duration",
            Unit::Seconds,
            m.store_commit_seconds.clone(),
        );
        r.register(
            "session_store_errors",
            "Session store commits that failed (retried; the acknowledgements that wait for them wait)",
            m.store_errors.clone(),
        );
        r.register(
            "session_store_healthy",
            "1 while the session store's last commit succeeded, 0 while commits fail",
            m.store_healthy.clone(),
        );
        r.register(
            "session_store_pending_ops",
            "Ops sent to the session store's thread and not yet committed (past 65,536, or 16 MiB of session records, client readers wait)",
            m.store_pending.clone(),
        );
        r.register(
            "mqtt_publishers_held",
            "Times a publisher was read no further because a subscriber it reached was broker.backpressure_queue messages behind",
            m.backpressure_holds.clone(),
        );
        r.register(
            "mqtt_subscribers_stalled",
            "Times a subscriber did not drain within broker.backpressure_wait while holding a publisher (it holds none until half drained)",
            m.backpressure_stalls.clone(),
        );
        r.register("mqtt_sessions", "MQTT sessions held, connected or not", m.sessions.clone());
        r.register("mqtt_subscriptions", "Subscriptions held over all sessions", m.subscriptions.clone());
        r.register("mqtt_retained_messages", "Retained messages held", m.retained_messages.clone());
        r.register("mqtt_retained_bytes", "Bytes of retained messages held", m.retained_bytes.clone());
        r.register("mqtt_wills", "Will messages published", m.wills.clone());
        r.register(
            "mqtt_publish_in",
            "PUBLISH packets accepted, by the [[class]] of their topic (edge-direct: none; internal: the node's own clients)",
            publish_in,
        );
        r.register(
            "mqtt_publish_out",
            "PUBLISH packets sent, to clients or to the node's own clients (to=node)",
            publish_out,
        );
        r.register(
            "mqtt_messages_dropped",
            "Messages a subscriber did not get, by reason (queue_full, queue_full_qos0, offline_queue_full, expired, too_large_for_client, session_ended)",
            m.dropped.clone(),
        );
        r.register(
            "mqtt_publish_refused",
            "PUBLISH packets not taken, by reason (acl, topic_too_long, too_many_user_properties, retained_full)",
            m.publish_refused.clone(),
        );
        r.register(
            "mqtt_subscribe_refused",
            "Subscription filters refused, by reason (acl, invalid_filter, max_subscriptions)",
            m.subscribe_refused.clone(),
        );
        r.register(
            "mqtt_disconnects",
            "Client connections closed by the broker for a limit or an error, by reason",
            m.disconnects.clone(),
        );
        m
    }

    /// Resolves the publish counter of each of `classes`, in their order.
    pub fn resolve_classes(&mut self, classes: &crate::route::Classes) {
        self.class_in = classes.iter().map(|c| handle(&self.publish_in, &class_label(&c.name))).collect();
    }

    /// A publish accepted from a client: from the node's own (`internal`), or in the class at
    /// `class` (an index into the classes resolved), or in none.
    pub fn published(&self, internal: bool, class: Option<usize>) {
        let counter = match (internal, class.and_then(|i| self.class_in.get(i))) {
            (true, _) => &self.publish_in_internal,
            (false, Some(c)) => c,
            (false, None) => &self.edge_direct_in,
        };
        counter.inc();
        if !internal {
            self.received.inc();
        }
    }

    pub fn dropped(&self, why: &'static str, n: u64) {
        if n > 0 {
            handle(&self.dropped, &reason(why)).inc_by(n);
        }
    }

    pub fn refused(&self, why: &'static str) {
        handle(&self.publish_refused, &reason(why)).inc();
    }

    pub fn subscribe_refused(&self, why: &'static str) {
        handle(&self.subscribe_refused, &reason(why)).inc();
    }

    pub fn disconnect(&self, why: &'static str) {
        handle(&self.disconnects, &reason(why)).inc();
    }

    pub fn retained(&self, count: usize, bytes: usize) {
        self.retained_messages.set(count as i64);
        self.retained_bytes.set(bytes as i64);
    }
}
