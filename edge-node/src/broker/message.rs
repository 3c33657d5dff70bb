//! An application message as it crossed the broker: what a publisher sent (or a will, or the
//! node's own in-process clients), shared by reference among every subscriber it goes to.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

/// A message's quality of service (MQTT 3.1.1 §4.3, 5.0 §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QoS {
    AtMostOnce = 0,
    AtLeastOnce = 1,
    ExactlyOnce = 2,
}

impl QoS {
    pub fn from_bits(bits: u8) -> Option<QoS> {
        match bits {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
}

/// The MQTT 5 properties a message carries from publisher to subscriber (§3.3.2.3). The
/// connection-scoped ones (topic alias) and the server's (subscription identifiers, the
/// remaining expiry) travel beside it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishProps {
    pub payload_format: Option<u8>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub user: Vec<(String, String)>,
}

impl PublishProps {
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.payload_format.is_none()
            && self.content_type.is_none()
            && self.response_topic.is_none()
            && self.correlation_data.is_none()
            && self.user.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub topic: Arc<str>,
    /// Its own allocation, not a slice of a connection's read buffer, so a queued or retained
    /// message holds only its own bytes.
    pub payload: Bytes,
    /// As published; each subscriber gets min(this, its granted QoS).
    pub qos: QoS,
    pub retain: bool,
    pub props: PublishProps,
    /// When its Message Expiry Interval runs out.
    pub expires_at: Option<Instant>,
    /// The publishing session's client id, for No Local; `None` for the node's own messages.
    pub origin: Option<Arc<str>>,
    /// The schema version a `[[schema]]` binding validated it against, for the sink's headers.
    pub schema: Option<Arc<shared::proto::SchemaRef>>,
}

/// What a message costs in memory besides its bytes, so that the byte bounds bound the memory
/// they stand for: the struct and its reference counts, the allocations of its payload and
/// topic, its place in a session's queue and the session store's reference to it (measured: a
/// node restoring 100,000 queued messages of 256 bytes took about this much more per message
/// than their bytes, docs/BENCHMARKS.md).
pub(crate) const MESSAGE_COST: usize = size_of::<Message>() + DELIVERY_SLOT + 128;

/// A session queue's entry for one message (`core::session::Delivery`, which checks it).
pub(crate) const DELIVERY_SLOT: usize = 56;

/// What user properties hold in memory: [`shared::proto::USER_PROPERTY_COST`] a pair and their
/// bytes.
pub(crate) fn user_properties_weight(user: &[(String, String)]) -> usize {
    user.iter().map(|(k, v)| shared::proto::USER_PROPERTY_COST + k.len() + v.len()).sum()
}

impl Message {
    /// Bytes it holds: what queue and retained-store bounds count. A user property pair
    /// costs its two `String`s besides its bytes, so an empty one is not free; the message
    /// itself costs [`MESSAGE_COST`].
    pub(crate) fn weight(&self) -> usize {
        let p = &self.props;
        self.topic.len()
            + self.payload.len()
            + p.content_type.as_ref().map_or(0, String::len)
            + p.response_topic.as_ref().map_or(0, String::len)
            + p.correlation_data.as_ref().map_or(0, Bytes::len)
            + user_properties_weight(&p.user)
            + MESSAGE_COST
    }

    /// Seconds of its expiry interval left at `now` (rounded up, so it never reads 0 before it
    /// ran out); `Some(0)` once expired.
    pub(crate) fn remaining_expiry(&self, now: Instant) -> Option<u32> {
        self.expires_at.map(|at| {
            let left = at.saturating_duration_since(now);
            let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            u32::try_from(secs).unwrap_or(u32::MAX)
        })
    }

    pub(crate) fn expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}
