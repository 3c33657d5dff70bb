//! The broker's metrics: sessions, subscriptions, retained messages, what the core refused,
//! dropped and disconnected, by reason; and the session store's commits.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::labels::{ClassLabel, ReasonLabel, class_label, handle, reason};

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ToLabel {
    to: &'static str,
}

shared::metrics! {
    #[derive(Debug, Clone)]
    pub struct BrokerMetrics {
        pub sessions: Gauge => ("mqtt_sessions", "MQTT sessions held, connected or not"),
        pub subscriptions: Gauge => ("mqtt_subscriptions", "Subscriptions held over all sessions"),
        retained_messages: Gauge => ("mqtt_retained_messages", "Retained messages held"),
        retained_bytes: Gauge => ("mqtt_retained_bytes", "Bytes of retained messages held"),
        pub wills: Counter => ("mqtt_wills", "Will messages published"),
        /// PUBLISH packets accepted, by the class their topic is in (`[[class]]`; `edge-direct`
        /// when none matches, `internal` for the node's own clients), resolved per class once
        /// ([`BrokerMetrics::resolve_classes`]) so a publish takes no label lookup.
        publish_in: Family<ClassLabel, Counter> => (
            "mqtt_publish_in",
            "PUBLISH packets accepted, by the [[class]] of their topic (edge-direct: none; internal: the node's own clients)"
        ),
        class_in: Vec<Counter> => (not exported),
        edge_direct_in: Counter => (not exported),
        publish_in_internal: Counter => (not exported),
        /// Every client's publishes together (not the node's own), for
        /// `$SYS/broker/messages/received` (not exported).
        pub received: Counter => (not exported),
        publish_to: Family<ToLabel, Counter> => (
            "mqtt_publish_out",
            "PUBLISH packets sent, to clients or to the node's own clients (to=node)"
        ),
        /// Deliveries to clients and to the node's own clients (`publish_to`'s two series).
        pub publish_out: Counter => (not exported),
        pub publish_out_internal: Counter => (not exported),
        dropped: Family<ReasonLabel, Counter> => (
            "mqtt_messages_dropped",
            "Messages a subscriber did not get, by reason (queue_full, queue_full_qos0, offline_queue_full, expired, too_large_for_client, session_ended)"
        ),
        publish_refused: Family<ReasonLabel, Counter> => (
            "mqtt_publish_refused",
            "PUBLISH packets not taken, by reason (acl, topic_too_long, too_many_user_properties, retained_full)"
        ),
        subscribe_refused: Family<ReasonLabel, Counter> => (
            "mqtt_subscribe_refused",
            "Subscription filters refused, by reason (acl, invalid_filter, max_subscriptions)"
        ),
        disconnects: Family<ReasonLabel, Counter> => (
            "mqtt_disconnects",
            "Client connections closed by the broker for a limit or an error, by reason"
        ),
        /// Publisher backpressure (`core/backpressure.rs`).
        pub backpressure_holds: Counter => (
            "mqtt_publishers_held",
            "Times a publisher was read no further because a subscriber it reached was broker.backpressure_queue messages behind"
        ),
        pub backpressure_stalls: Counter => (
            "mqtt_subscribers_stalled",
            "Times a subscriber did not drain within broker.backpressure_wait while holding a publisher (it holds none until half drained)"
        ),
        /// The session store (`store.rs`).
        pub store_commit_seconds: Histogram => (
            "session_store_commit",
            "Session store group commits (durable sessions' queues, QoS 2 ids, wills, retained messages): their duration",
            unit Seconds,
            // 50 µs .. ~1.6 s
            init Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
        ),
        pub store_errors: Counter => (
            "session_store_errors",
            "Session store commits that failed (retried; the acknowledgements that wait for them wait)"
        ),
        pub store_healthy: Gauge => (
            "session_store_healthy",
            "1 while the session store's last commit succeeded, 0 while commits fail"
        ),
        pub store_pending: Gauge => (
            "session_store_pending_ops",
            "Ops sent to the session store's thread and not yet committed (past 65,536, or 16 MiB of session records, client readers wait)"
        ),
    }
}

impl BrokerMetrics {
    /// The broker's metrics, registered in `r`, with the series a publish counts into resolved.
    pub fn new(r: &mut Registry) -> Self {
        let mut m = Self::default();
        m.edge_direct_in = handle(&m.publish_in, &class_label("edge-direct"));
        m.publish_in_internal = handle(&m.publish_in, &class_label("internal"));
        m.publish_out = handle(&m.publish_to, &ToLabel { to: "clients" });
        m.publish_out_internal = handle(&m.publish_to, &ToLabel { to: "node" });
        m.register(r);
        m
    }

    /// Resolves the publish counter of each of `classes`, in their order.
    pub(crate) fn resolve_classes(&mut self, classes: &crate::route::Classes) {
        self.class_in = classes.iter().map(|c| handle(&self.publish_in, &class_label(&c.name))).collect();
    }

    /// A publish accepted from a client: from the node's own (`internal`), or in the class at
    /// `class` (an index into the classes resolved), or in none.
    pub(crate) fn published(&self, internal: bool, class: Option<usize>) {
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

    pub(crate) fn dropped(&self, why: &'static str, n: u64) {
        if n > 0 {
            handle(&self.dropped, &reason(why)).inc_by(n);
        }
    }

    pub(crate) fn refused(&self, why: &'static str) {
        handle(&self.publish_refused, &reason(why)).inc();
    }

    pub(crate) fn subscribe_refused(&self, why: &'static str) {
        handle(&self.subscribe_refused, &reason(why)).inc();
    }

    pub(crate) fn disconnect(&self, why: &'static str) {
        handle(&self.disconnects, &reason(why)).inc();
    }

    pub(crate) fn retained(&self, count: usize, bytes: usize) {
        self.retained_messages.set(count as i64);
        self.retained_bytes.set(bytes as i64);
    }
}
