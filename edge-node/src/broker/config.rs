//! `[broker]`: limits of the embedded MQTT broker, and their own check.

use serde::{Deserialize, Serialize};
use shared::units::{ByteSize, HumanDuration};

use crate::check::Problems;

/// Broker limits. Every one bounds memory or work per client; exceeding one disconnects the
/// client with a stated reason or drops and counts, never grows without bound.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Most client connections at once, over all listeners. Further clients are refused at
    /// CONNECT (CONNACK "server unavailable" / MQTT 5 0x97 quota exceeded). Default: 1000.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Largest MQTT packet accepted from a client, header included. Larger ones disconnect the
    /// client (MQTT 5 reason 0x95 packet too large). Default: 1 MiB.
    #[serde(default = "default_max_packet_size")]
    pub max_packet_size: ByteSize,
    /// QoS1 messages in flight to one subscriber before the broker waits for its PUBACKs.
    /// Default: 100.
    #[serde(default = "default_max_inflight")]
    pub max_inflight: u16,
    /// Size of one in-memory log segment per subscribed filter. Default: 1 MiB.
    #[serde(default = "default_segment_size")]
    pub segment_size: ByteSize,
    /// Segments kept per subscribed filter; with `segment_size` this bounds the memory a filter's
    /// backlog can take (a subscriber that falls further behind skips the oldest). Default: 4.
    #[serde(default = "default_segment_count")]
    pub segment_count: usize,
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
            max_packet_size: default_max_packet_size(),
            max_inflight: default_max_inflight(),
            segment_size: default_segment_size(),
            segment_count: default_segment_count(),
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
        if self.max_packet_size.bytes() < 64 || self.max_packet_size.bytes() > 256 * 1024 * 1024 {
            p.bad(
                "broker.max_packet_size",
                format!("{} is outside 64 B ..= 256 MiB (MQTT's limit)", self.max_packet_size),
            );
        }
        if self.max_inflight == 0 {
            p.bad("broker.max_inflight", "must be at least 1");
        }
        // rumqttd panics on segments under 1 KiB; a segment must also hold the largest packet.
        if self.segment_size.bytes() < 1024 || self.segment_size < self.max_packet_size {
            p.bad(
                "broker.segment_size",
                format!(
                    "{} must be at least 1 KiB and at least broker.max_packet_size ({})",
                    self.segment_size, self.max_packet_size
                ),
            );
        }
        if self.segment_count == 0 {
            p.bad("broker.segment_count", "must be at least 1");
        }
        if self.connect_timeout.0.is_zero() {
            p.bad("broker.connect_timeout", "must be more than 0s");
        }
        if self.slow_client_timeout.0.is_zero() {
            p.bad("broker.slow_client_timeout", "must be more than 0s");
        }
    }
}

fn default_max_connections() -> usize {
    1000
}
fn default_max_packet_size() -> ByteSize {
    ByteSize::mib(1)
}
fn default_max_inflight() -> u16 {
    100
}
fn default_segment_size() -> ByteSize {
    ByteSize::mib(1)
}
fn default_segment_count() -> usize {
    4
}
fn default_connect_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_slow_client_timeout() -> HumanDuration {
    HumanDuration::from_secs(30)
}
