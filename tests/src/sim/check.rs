//! What the simulation holds the system to: the oracle of what was promised, and the checks
//! made as things happen and at the end.
//!
//! - A session the broker says is present holds the subscriptions its client was acknowledged
//!   (SUBACK, UNSUBACK), give or take those asked about when the connection ended.
//! - A downlink message reaches a client once: a second delivery is a resend with DUP (QoS 1),
//!   and none at all at QoS 2; a client gets one edge's messages in the order they were stored.
//! - Nothing delivered breaks what a local publish would be held to: the topic's schema, a
//!   Response Topic without wildcards, the user-property cap.
//! - Every telemetry message the broker acknowledged (`full` durability, central) is in the
//!   sink at the end, once if published once; nothing is there that no client published.

use std::collections::{BTreeMap, BTreeSet};

use edge_node::broker::codec::QoS;

use super::client::{Client, Delivered};
use super::edge::SCHEMA_TOPIC;

/// The user properties a message may carry (`broker.max_user_properties`).
const MAX_USER_PROPERTIES: usize = 64;

/// A downlink message as stored.
#[derive(Debug, Clone)]
pub struct Down {
    pub edge: String,
    pub seq: u64,
    pub topic: String,
}

#[derive(Debug, Default)]
pub struct Oracle {
    /// The first broken promise.
    pub violation: Option<String>,
    /// Telemetry the broker acknowledged: tag -> (edge, topic, QoS).
    pub taken: BTreeMap<String, (String, String, QoS)>,
    /// Exchanges started per tag (a resend with DUP is not one).
    pub sent: BTreeMap<String, u32>,
    /// Downlink messages stored, by tag.
    pub downs: BTreeMap<String, Down>,
    /// Per (edge, client, tag): deliveries seen.
    seen: BTreeMap<(String, String, String), u32>,
    /// Per (edge, client): the last downlink seq delivered first.
    order: BTreeMap<(String, String), u64>,
    pub counts: Counts,
}

/// What happened, for the summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub published: u64,
    pub delivered: u64,
    pub taken: u64,
    pub downs: u64,
    pub downs_delivered: u64,
    pub resumed: u64,
}

impl Oracle {
    pub fn fail(&mut self, why: String) {
        if self.violation.is_none() {
            self.violation = Some(why);
        }
    }

    /// A client sent a PUBLISH of `payload`: each one at QoS 0 or 1 may be a copy of its own
    /// (a QoS 1 resend with DUP too: at least once); a QoS 2 message is one however often its
    /// exchange resends it.
    pub fn sent(&mut self, _edge: &str, payload: &[u8], qos: QoS) {
        if let Some(tag) = super::tag_of(payload) {
            let n = self.sent.entry(tag.to_owned()).or_default();
            if qos != QoS::ExactlyOnce || *n == 0 {
                *n += 1;
                self.counts.published += 1;
            }
        }
    }

    /// The broker took a publish (PUBACK, or PUBREC for QoS 2).
    pub fn taken(&mut self, edge: &str, tag: &str, topic: &str, qos: QoS) {
        if topic.starts_with("telemetry/") {
            self.taken.insert(tag.to_owned(), (edge.to_owned(), topic.to_owned(), qos));
            self.counts.taken += 1;
        }
    }

    /// CONNACK with session present: the session holds what the client was acknowledged.
    pub fn session_resumed(&mut self, edge: &str, c: &Client, held: &[(String, u8)]) {
        self.counts.resumed += 1;
        let held: BTreeMap<&str, u8> = held.iter().map(|(f, q)| (f.as_str(), *q)).collect();
        for (filter, qos) in &c.subs {
            if c.unsure.contains(filter) {
                continue;
            }
            match held.get(filter.as_str()) {
                None => self.fail(format!(
                    "{edge} {}: CONNACK says session present, but its subscription to {filter:?} (SUBACK granted QoS {qos}) is gone",
                    c.id
                )),
                Some(q) if q != qos => self.fail(format!(
                    "{edge} {}: session present with {filter:?} at QoS {q}, but SUBACK granted QoS {qos}",
                    c.id
                )),
                Some(_) => {}
            }
        }
        for filter in held.keys() {
            if !c.subs.contains_key(*filter) && !c.unsure.contains(*filter) {
                self.fail(format!(
                    "{edge} {}: CONNACK says session present, and the session holds {filter:?}, which UNSUBACK removed (or no SUBACK granted)",
                    c.id
                ));
            }
        }
    }

    /// A client got a message.
    pub fn delivered(&mut self, edge: &str, client: &str, persistent: bool, d: &Delivered) {
        self.counts.delivered += 1;
        let tag = super::tag_of(&d.payload).unwrap_or_default().to_owned();
        if d.topic == SCHEMA_TOPIC && !valid_reading(&d.payload) {
            self.fail(format!(
                "{edge} {client}: got {tag} on {SCHEMA_TOPIC}, a payload its schema refuses: {:?}",
                String::from_utf8_lossy(&d.payload)
            ));
        }
        if let Some(rt) = &d.response_topic
            && shared::topic::validate_name(rt).is_err()
        {
            self.fail(format!(
                "{edge} {client}: got {tag} with Response Topic {rt:?}, not a topic name [MQTT-3.3.2-14]"
            ));
        }
        if d.user_properties > MAX_USER_PROPERTIES {
            self.fail(format!(
                "{edge} {client}: got {tag} with {} user properties, more than broker.max_user_properties",
                d.user_properties
            ));
        }
        let Some(down) = self.downs.get(&tag).cloned() else { return };
        if d.retain {
            // Sent because of a new subscription: not a delivery of the message as it came.
            return;
        }
        let seen = self.seen.entry((edge.to_owned(), client.to_owned(), tag.clone())).or_default();
        *seen += 1;
        let seen = *seen;
        if seen == 1 {
            self.counts.downs_delivered += 1;
            let last = self.order.entry((edge.to_owned(), client.to_owned())).or_default();
            let before = std::mem::replace(last, down.seq);
            if down.seq < before {
                self.fail(format!(
                    "{edge} {client}: downlink message {tag} (seq {}) delivered after seq {before}: out of order",
                    down.seq
                ));
            }
            return;
        }
        if d.qos == QoS::ExactlyOnce || !d.dup {
            self.fail(format!(
                "{edge} {client}: downlink message {tag} (seq {}) delivered {} times, this time as a new PUBLISH \
                 (QoS {}, DUP {}){}",
                down.seq,
                seen,
                d.qos as u8,
                d.dup,
                if persistent { "" } else { " to a clean session" }
            ));
        }
    }

    /// At the end: the sink's message records (edge, topic, payload), against what the broker
    /// took.
    pub fn records(&mut self, records: &[(String, String, Vec<u8>)], hostile: &[String]) {
        let mut copies: BTreeMap<String, u32> = BTreeMap::new();
        for (edge, topic, payload) in records {
            let Some(tag) = super::tag_of(payload) else {
                self.fail(format!("the sink holds a record of {edge} on {topic} that no client published"));
                continue;
            };
            if !self.sent.contains_key(tag) {
                self.fail(format!("the sink holds {tag} of {edge} on {topic}, which no client published"));
            }
            *copies.entry(tag.to_owned()).or_default() += 1;
        }
        let mut missing = BTreeSet::new();
        for (tag, (edge, topic, _)) in &self.taken {
            if !copies.contains_key(tag) && !hostile.contains(edge) {
                missing.insert(format!("{tag} ({edge} {topic})"));
            }
        }
        if !missing.is_empty() {
            let first: Vec<_> = missing.iter().take(5).cloned().collect();
            self.fail(format!(
                "{} telemetry messages acknowledged to their publishers never reached the sink: {}",
                missing.len(),
                first.join(", ")
            ));
        }
        for (tag, n) in copies {
            let sent = self.sent.get(&tag).copied().unwrap_or(0);
            if n > sent.max(1) {
                self.fail(format!("{tag} is in the sink {n} times, published {sent} times"));
            }
        }
    }
}

/// Whether `payload` is a reading the bound schema takes.
fn valid_reading(payload: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(payload).is_ok_and(|v| v.get("temp").is_some_and(|t| t.is_number()))
}
