//! The downlink's frames (protocol version 5): messages from the central cluster for an edge's
//! local MQTT topics, and the edge's answers.
//!
//! A message's `seq` is its place in the edge's downlink: increasing, not contiguous (messages
//! for other edges lie between in the sink). The bridge sends them in order on the control
//! stream, at most a window unanswered; the edge answers cumulatively (`DownAck`: everything
//! through `up_to` is done, delivered or refused or expired, and durable on the edge), listing
//! the refused ones with a reason. The bridge records the position and the refusals in the sink
//! and says so (`DownMarked`), after which the edge forgets the refusals. A message's content
//! never breaks the session: whatever the edge cannot deliver it refuses, so one bad message in
//! the sink cannot wedge an edge's downlink; only the order and the window are protocol rules.

use serde::{Deserialize, Serialize};

/// Refusal reasons are cut to this many bytes: the bridge stores them.
pub const MAX_REFUSAL_REASON: usize = 256;

/// Refusals and expiries one `DownAck` may list, at most (an edge lists what it did not yet see
/// marked; the bridge's window keeps that far lower).
pub(crate) const MAX_DOWN_REPORT: usize = 4096;

/// Downlink messages an edge holds received and not yet done, at most: one more and the bridge
/// broke its window, and the edge ends the session. Edges before version 9 hold this many and
/// do not say so in their hello, so a bridge's window is held to it: a bridge configured past
/// it once ended its edges' sessions whenever their store fell behind. From version 9 an edge
/// says what it holds ([`EdgeWindow`]), at most this.
pub const MAX_DOWN_WINDOW: usize = 256;

/// What an edge holds of the downlink unless configured otherwise, in bytes as [`Down::weight`]
/// counts them: the bridge's default window.
pub const DEFAULT_DOWN_WINDOW_BYTES: usize = 4 << 20;

/// How much of the downlink an edge holds received and not yet done (protocol version 9, in its
/// hello): at most `messages`, and past `bytes` (as [`Down::weight`] counts them) nothing more
/// until it holds none. A bridge sends within the smaller of this and its own window; the edge
/// ends a session that passes it. The bytes bound what waits in the edge's memory for its store:
/// before, a bridge's window in bytes was the bridge's to choose, with no bound the edge kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeWindow {
    pub messages: u64,
    pub bytes: u64,
}

/// The most a downlink message may weigh ([`Down::weight`] without its fixed part): its frame
/// stays within [`super::MAX_CONTROL_FRAME`], whose last 64 KiB cover the encoding.
pub const MAX_DOWN_BYTES: usize = crate::model::MAX_MANIFEST_BYTES;

/// A message from the cloud for a local topic.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Down {
    pub seq: u64,
    pub topic: String,
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// The QoS the sender asked for; the edge's `[[downlink]]` entry may lower it.
    pub qos: u8,
    #[serde(default)]
    pub retain: bool,
    /// What is left of its expiry when sent, ms; none: it does not expire. Relative, so the
    /// edge's clock need not agree with the bridge's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_properties: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_topic: Option<String>,
    #[serde(default, with = "serde_bytes", skip_serializing_if = "Option::is_none")]
    pub correlation_data: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
}

impl Down {
    /// What it weighs in a window: its variable bytes and a little for the rest.
    pub(crate) fn weight(&self) -> usize {
        let props: usize =
            self.user_properties.iter().map(|(k, v)| k.len() + v.len() + super::USER_PROPERTY_COST).sum();
        self.topic.len()
            + self.payload.len()
            + props
            + self.response_topic.as_ref().map_or(0, String::len)
            + self.correlation_data.as_ref().map_or(0, Vec::len)
            + self.content_type.as_ref().map_or(0, String::len)
            + 64
    }
}

/// A downlink message the edge would not deliver, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownRefusal {
    pub seq: u64,
    pub reason: String,
}

/// Everything through `up_to` is done on the edge; `refused` and `expired` name those not
/// delivered that the cloud has not yet marked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DownAck {
    pub up_to: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<DownRefusal>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expired: Vec<u64>,
}

/// How the edge's driver finished a downlink message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownOutcome {
    /// Handed to the broker's durable state.
    Delivered,
    /// Not delivered, for this reason (not allowed, too large, a bad topic, ...).
    Refused(String),
    /// Its expiry ran out before it could be delivered.
    Expired,
}

/// `reason` cut to [`MAX_REFUSAL_REASON`] bytes on a character boundary.
pub fn clip_reason(mut reason: String) -> String {
    if reason.len() > MAX_REFUSAL_REASON {
        let mut at = MAX_REFUSAL_REASON;
        while !reason.is_char_boundary(at) {
            at -= 1;
        }
        reason.truncate(at);
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_clipped_on_a_character_boundary() {
        assert_eq!(clip_reason("short".into()), "short");
        let long = "é".repeat(200);
        let clipped = clip_reason(long);
        assert!(clipped.len() <= MAX_REFUSAL_REASON && clipped.chars().all(|c| c == 'é'));
    }
}
