//! `[broker]`: limits of the embedded MQTT broker, and their own check.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use shared::units::{ByteSize, HumanDuration};

use super::core::{ClientIds, Limits, SlowSubscriber};
use shared::check::Problems;

/// Broker limits. Every one bounds memory or work per client; exceeding one disconnects the
/// client with a stated reason or drops and counts, never grows without bound.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Most client connections at once, over all listeners. Further clients are refused at
    /// CONNECT (CONNACK "server unavailable" / MQTT 5 0x97 quota exceeded). Default: 1000.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Connections accepted that have not finished TLS, CONNECT and the login yet, counted
    /// apart from `max_connections` so a flood of bogus logins neither fills that nor queues
    /// without end. Past it a new connection is closed at once (counted as refused,
    /// `max_pending`). Default: 1000.
    #[serde(default = "default_max_pending_connections")]
    pub max_pending_connections: usize,
    /// Largest MQTT packet accepted from a client, header included. Larger ones disconnect the
    /// client (MQTT 5 reason 0x95 packet too large). Default: 1 MiB.
    #[serde(default = "default_max_packet_size")]
    pub max_packet_size: ByteSize,
    /// QoS 1 and 2 messages in flight to one client before the broker waits for its
    /// acknowledgements (and at most the client's own Receive Maximum). Default: 100.
    #[serde(default = "default_max_inflight")]
    pub max_inflight: u16,
    /// QoS 1 and 2 publishes a client may have unacknowledged, announced as Receive Maximum;
    /// an MQTT 5 client sending more is disconnected (0x93), an MQTT 3.1.1 client is read no
    /// further until acknowledgements catch up. Default: 1024.
    #[serde(default = "default_receive_maximum")]
    pub receive_maximum: u16,
    /// Topic aliases a client may set, announced as Topic Alias Maximum (0: none). Each can hold
    /// a topic of up to `max_topic_length`. Default: 16.
    #[serde(default = "default_topic_alias_maximum")]
    pub topic_alias_maximum: u16,
    /// Longest topic name or filter, bytes; a longer PUBLISH is refused (MQTT 5: 0x90), a
    /// longer filter gets 0x8F. Default: 1024.
    #[serde(default = "default_max_topic_length")]
    pub max_topic_length: usize,
    /// Sessions held, connected or not; a new client id past it is refused (CONNACK 0x97, MQTT
    /// 3.1.1: 3). Default: 1000, or `max_connections` if that is more.
    pub max_sessions: Option<usize>,
    /// Sessions that outlive their connection (a Session Expiry above 0, MQTT 3.1.1's Clean
    /// Session 0) one identity may hold: a user, a certificate, or every anonymous client
    /// together. A new one past it is refused (CONNACK 0x97, MQTT 3.1.1: 3) and counted. Raise
    /// it for many anonymous devices with persistent sessions. Default: 256.
    #[serde(default = "default_max_stored_sessions_per_identity")]
    pub max_stored_sessions_per_identity: usize,
    /// Distinct topic filters one SUBSCRIBE may carry; past it the rest get 0x97 (MQTT 3.1.1:
    /// 0x80) without being looked at. A filter repeated in one SUBSCRIBE counts once. Default:
    /// 100.
    #[serde(default = "default_max_subscribe_filters")]
    pub max_subscribe_filters: usize,
    /// Subscriptions one session may hold; past it a filter gets 0x97. Default: 100.
    #[serde(default = "default_max_subscriptions")]
    pub max_subscriptions: usize,
    /// Messages one session may have queued or in flight; past it `slow_subscriber` decides
    /// (an offline session drops the new message). Default: 10000: a subscriber that keeps up
    /// on average still falls a few thousand messages behind when the scheduler runs its
    /// publisher for a while without it (measured at 130k msg/s on 2 cores).
    #[serde(default = "default_max_queued_messages")]
    pub max_queued_messages: usize,
    /// Bytes one session may have queued or in flight. Default: 16 MiB.
    #[serde(default = "default_max_queued_bytes")]
    pub max_queued_bytes: ByteSize,
    /// Bytes all sessions together may have queued or in flight. Default: 64 MiB.
    #[serde(default = "default_max_queued_bytes_total")]
    pub max_queued_bytes_total: ByteSize,
    /// What a full queue costs a connected subscriber: `drop-qos0-then-disconnect` (its oldest
    /// QoS 0 messages go first; a QoS 1 or 2 message that still finds no room disconnects it
    /// with 0x97, its session keeping what was queued) or `drop-newest` (never disconnected; the
    /// new message is dropped). Every dropped message is counted. Default:
    /// `drop-qos0-then-disconnect`.
    #[serde(default)]
    pub slow_subscriber: SlowSubscriber,
    /// Publisher backpressure: a publisher whose message went to a connected subscriber
    /// already this many messages behind (queued, past those in flight) is read no further
    /// until that queue is half as long, so a subscriber slower than its publisher slows the
    /// publisher (TCP pushes back) instead of filling its queue and meeting `slow_subscriber`.
    /// A publisher with messages in flight to it is read on (their acknowledgements are needed
    /// for its own queue to drain) and its own acknowledgements wait instead. 0 turns it off.
    /// Default: 100 (one round each of `scripts/bench-local.sh`: an unthrottled MQTT.js client
    /// at 1.3x Mosquitto's p99 with 100, 1.7x with 200; the unthrottled Rust generator at 4.9x
    /// Mosquitto's throughput with 100, 3.7x with 50).
    #[serde(default = "default_backpressure_queue")]
    pub backpressure_queue: usize,
    /// Longest a publisher waits for one subscriber's queue to drain; a subscriber that does not
    /// drain in time holds no publisher again until its queue is half as long (so a client that
    /// stops reading cannot hold publishers back for longer), and is counted. Default: 500ms.
    #[serde(default = "default_backpressure_wait")]
    pub backpressure_wait: HumanDuration,
    /// Retained messages held at most; a new retained topic past it is refused (MQTT 5 QoS 1/2:
    /// 0x97; otherwise delivered and not retained). Default: 10000.
    #[serde(default = "default_max_retained_messages")]
    pub max_retained_messages: usize,
    /// User properties one PUBLISH (or will) may carry. A PUBLISH with more is refused (MQTT 5
    /// PUBACK/PUBREC 0x97; at QoS 0 dropped) and counted (`too_many_user_properties`), a CONNECT
    /// whose will has more is refused (CONNACK 0x97); past the cap the decoder keeps none of
    /// them, so one packet cannot make the broker hold thousands of empty pairs (each costs 48
    /// bytes of memory and counts so against every byte bound). Default: 64.
    #[serde(default = "default_max_user_properties")]
    pub max_user_properties: usize,
    /// Bytes of retained messages held at most. Default: 32 MiB.
    #[serde(default = "default_max_retained_bytes")]
    pub max_retained_bytes: ByteSize,
    /// Longest keep-alive an MQTT 5 client may ask for (or none): above it, or with keep-alive
    /// 0, it is told this Server Keep Alive. Absent: the client's value stands. Default: absent.
    pub max_keep_alive: Option<HumanDuration>,
    /// Longest a session outlives its connection; a longer Session Expiry Interval (or MQTT
    /// 3.1.1's Clean Session 0) is cut to it. Default: 7d.
    #[serde(default = "default_max_session_expiry")]
    pub max_session_expiry: HumanDuration,
    /// `per-identity`: a client id belongs to the identity (user, certificate, anonymous) that
    /// made its session, and another one presenting it is refused (CONNACK 0x85, MQTT 3.1.1: 2);
    /// `shared`: any identity may take over any session, as plain MQTT allows.
    /// Default: `per-identity`.
    #[serde(default)]
    pub client_ids: ClientIds,
    /// Longest client id, bytes (CONNACK 0x85 past it). Default: 256.
    #[serde(default = "default_max_client_id_length")]
    pub max_client_id_length: usize,
    /// Acknowledgements and other control packets a client may leave unread before it is
    /// disconnected (0x97). Default: 4096.
    #[serde(default = "default_max_control_queue")]
    pub max_control_queue: usize,
    /// SQLite file keeping, across restarts, sessions with an expiry above 0 (subscriptions,
    /// queued and in-flight messages, QoS 2 ids, delayed wills) and the retained messages.
    /// Default: `sessions.db` beside the spool's database.
    pub session_store: Option<PathBuf>,
    /// No longer used (rumqttd's per-filter log): refused by name. Queues are per subscriber
    /// now: `max_queued_messages`, `max_queued_bytes`.
    #[serde(default, skip_serializing)]
    pub segment_size: Option<toml::Value>,
    /// No longer used: refused by name, as `segment_size`.
    #[serde(default, skip_serializing)]
    pub segment_count: Option<toml::Value>,
    /// Largest CONNECT accepted, header included: it is read before the client is
    /// authenticated, so up to `max_pending_connections` of them are held at once. A larger
    /// one closes the connection (counted as `connect_too_large`); raise it for wills with
    /// large payloads. At most `max_packet_size`. Default: 32 KiB.
    #[serde(default = "default_max_connect_size")]
    pub max_connect_size: ByteSize,
    /// How often the broker's statistics are published, retained, under `$SYS/broker/`
    /// (Mosquitto's names: clients, subscriptions, retained messages, messages and bytes in
    /// and out, uptime, version); `0s`: never. Default: 10s.
    #[serde(default = "default_sys_interval")]
    pub sys_interval: HumanDuration,
    /// Time a new connection has to send its CONNECT (and finish TLS). Default: 10s.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: HumanDuration,
    /// A client that accepts no bytes for this long while the broker has data for it is
    /// disconnected and counted as a slow client. Default: 30s.
    #[serde(default = "default_slow_client_timeout")]
    pub slow_client_timeout: HumanDuration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            max_connections: default_max_connections(),
            max_pending_connections: default_max_pending_connections(),
            max_packet_size: default_max_packet_size(),
            max_connect_size: default_max_connect_size(),
            sys_interval: default_sys_interval(),
            max_inflight: default_max_inflight(),
            receive_maximum: default_receive_maximum(),
            topic_alias_maximum: default_topic_alias_maximum(),
            max_topic_length: default_max_topic_length(),
            max_sessions: None,
            max_stored_sessions_per_identity: default_max_stored_sessions_per_identity(),
            max_subscribe_filters: default_max_subscribe_filters(),
            max_subscriptions: default_max_subscriptions(),
            max_queued_messages: default_max_queued_messages(),
            max_queued_bytes: default_max_queued_bytes(),
            max_queued_bytes_total: default_max_queued_bytes_total(),
            slow_subscriber: SlowSubscriber::default(),
            backpressure_queue: default_backpressure_queue(),
            backpressure_wait: default_backpressure_wait(),
            max_retained_messages: default_max_retained_messages(),
            max_retained_bytes: default_max_retained_bytes(),
            max_user_properties: default_max_user_properties(),
            max_keep_alive: None,
            max_session_expiry: default_max_session_expiry(),
            client_ids: ClientIds::default(),
            max_client_id_length: default_max_client_id_length(),
            max_control_queue: default_max_control_queue(),
            session_store: None,
            segment_size: None,
            segment_count: None,
            connect_timeout: default_connect_timeout(),
            slow_client_timeout: default_slow_client_timeout(),
        }
    }
}

impl BrokerConfig {
    pub fn check(&self, p: &mut Problems) {
        if self.max_connections == 0 {
            p.bad("broker.max_connections", "must be at least 1");
        }
        if self.max_pending_connections == 0 {
            p.bad("broker.max_pending_connections", "must be at least 1");
        }
        if self.max_packet_size.bytes() < 64 || self.max_packet_size.bytes() > 256 * 1024 * 1024 {
            p.bad(
                "broker.max_packet_size",
                format!("{} is outside 64 B ..= 256 MiB (MQTT's limit)", self.max_packet_size),
            );
        }
        if self.max_inflight == 0 {
            p.bad("broker.max_inflight", "must be at least 1");
        }
        // A CONNECT with a client id, a user name and a password takes a few hundred bytes.
        if self.max_connect_size.as_usize() < 1024 {
            p.bad("broker.max_connect_size", "must be at least 1 KiB: smaller, ordinary clients could not connect");
        }
        for (key, value) in [("broker.segment_size", &self.segment_size), ("broker.segment_count", &self.segment_count)]
        {
            if value.is_some() {
                p.bad(
                    key,
                    "is no longer used: the broker keeps a queue per subscriber, bounded by broker.max_queued_messages and broker.max_queued_bytes",
                );
            }
        }
        for (key, value) in [
            ("broker.receive_maximum", usize::from(self.receive_maximum)),
            ("broker.max_topic_length", self.max_topic_length),
            ("broker.max_sessions", self.max_sessions.unwrap_or(1)),
            ("broker.max_stored_sessions_per_identity", self.max_stored_sessions_per_identity),
            ("broker.max_subscribe_filters", self.max_subscribe_filters),
            ("broker.max_subscriptions", self.max_subscriptions),
            ("broker.max_queued_messages", self.max_queued_messages),
            ("broker.max_retained_messages", self.max_retained_messages),
            ("broker.max_client_id_length", self.max_client_id_length),
            ("broker.max_control_queue", self.max_control_queue),
        ] {
            if value == 0 {
                p.bad(key, "must be at least 1");
            }
        }
        if self.max_topic_length > 65_535 {
            p.bad("broker.max_topic_length", format!("{} is over MQTT's 65535", self.max_topic_length));
        }
        if self.max_queued_bytes < self.max_packet_size {
            p.bad(
                "broker.max_queued_bytes",
                format!("{} must be at least broker.max_packet_size ({})", self.max_queued_bytes, self.max_packet_size),
            );
        }
        if self.max_queued_bytes_total < self.max_queued_bytes {
            p.bad("broker.max_queued_bytes_total", "must be at least broker.max_queued_bytes");
        }
        if let Some(k) = self.max_keep_alive
            && (k.0.as_secs() == 0 || k.0.as_secs() > u64::from(u16::MAX))
        {
            p.bad("broker.max_keep_alive", format!("{k} is outside 1s ..= 65535s"));
        }
        if self.connect_timeout.0.is_zero() {
            p.bad("broker.connect_timeout", "must be more than 0s");
        }
        if self.slow_client_timeout.0.is_zero() {
            p.bad("broker.slow_client_timeout", "must be more than 0s");
        }
    }
}

impl BrokerConfig {
    /// The core's bounds from this section; `internal_topics` are the node's own (the probe's),
    /// `reserved_topics` the filters only the node publishes to.
    pub fn limits(&self, internal_topics: Vec<String>, reserved_topics: Vec<String>) -> Limits {
        Limits {
            max_stored_sessions_per_identity: self.max_stored_sessions_per_identity,
            max_subscribe_filters: self.max_subscribe_filters,
            reserved_topics,
            max_sessions: self.max_sessions.unwrap_or(self.max_connections.max(1000)),
            max_subscriptions: self.max_subscriptions,
            max_queued_messages: self.max_queued_messages,
            max_queued_bytes: self.max_queued_bytes.as_usize(),
            max_queued_bytes_total: self.max_queued_bytes_total.as_usize(),
            max_inflight: self.max_inflight,
            receive_maximum: self.receive_maximum,
            topic_alias_maximum: self.topic_alias_maximum,
            max_topic_length: self.max_topic_length,
            max_retained_messages: self.max_retained_messages,
            max_retained_bytes: self.max_retained_bytes.as_usize(),
            max_user_properties: self.max_user_properties,
            max_packet_size: u32::try_from(self.max_packet_size.bytes()).unwrap_or(u32::MAX),
            max_keep_alive: self.max_keep_alive.map(|k| u16::try_from(k.0.as_secs()).unwrap_or(u16::MAX)),
            max_session_expiry: u32::try_from(self.max_session_expiry.0.as_secs()).unwrap_or(u32::MAX - 1),
            client_ids: self.client_ids,
            slow_subscriber: self.slow_subscriber,
            backpressure_queue: self.backpressure_queue,
            backpressure_wait: self.backpressure_wait.0,
            max_client_id_length: self.max_client_id_length,
            max_control_queue: self.max_control_queue,
            internal_topics,
        }
    }
}

fn default_receive_maximum() -> u16 {
    1024
}
fn default_topic_alias_maximum() -> u16 {
    16
}
fn default_max_topic_length() -> usize {
    1024
}
fn default_max_subscriptions() -> usize {
    100
}
fn default_max_queued_messages() -> usize {
    10_000
}
fn default_max_queued_bytes() -> ByteSize {
    ByteSize::mib(16)
}
fn default_max_queued_bytes_total() -> ByteSize {
    ByteSize::mib(64)
}
fn default_backpressure_queue() -> usize {
    100
}
fn default_backpressure_wait() -> HumanDuration {
    HumanDuration(std::time::Duration::from_millis(500))
}
fn default_max_retained_messages() -> usize {
    10_000
}
fn default_max_retained_bytes() -> ByteSize {
    ByteSize::mib(32)
}
fn default_max_user_properties() -> usize {
    64
}
fn default_max_session_expiry() -> HumanDuration {
    HumanDuration::from_secs(7 * 24 * 3600)
}
fn default_max_subscribe_filters() -> usize {
    100
}

fn default_max_stored_sessions_per_identity() -> usize {
    256
}

fn default_max_client_id_length() -> usize {
    256
}
fn default_max_control_queue() -> usize {
    4096
}
fn default_max_connections() -> usize {
    1000
}
fn default_max_pending_connections() -> usize {
    1000
}
fn default_sys_interval() -> HumanDuration {
    HumanDuration(std::time::Duration::from_secs(10))
}
fn default_max_connect_size() -> ByteSize {
    ByteSize::kib(32)
}
fn default_max_packet_size() -> ByteSize {
    ByteSize::mib(1)
}
fn default_max_inflight() -> u16 {
    100
}
fn default_connect_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_slow_client_timeout() -> HumanDuration {
    HumanDuration::from_secs(30)
}
