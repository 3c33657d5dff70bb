//! `[[downlink]]`: which local topics the cloud may publish to, and how. None by default: a new
//! edge takes no message from the cloud until its config says so.

use serde::{Deserialize, Serialize};
use shared::check::Problems;

/// What a retained downlink message becomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RetainPolicy {
    /// Retained as the cloud asked.
    #[default]
    Keep,
    /// Delivered, never retained.
    Drop,
    /// A retained message is refused.
    Refuse,
}

/// One entry: messages for topics `filter` matches are published locally.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DownlinkEntry {
    /// An MQTT topic filter (`+`, `#`); the first entry that matches a message's topic decides.
    pub filter: String,
    /// The highest QoS the message is published at locally (the cloud's is lowered to it).
    /// Default 2.
    #[serde(default = "default_qos")]
    pub max_qos: u8,
    /// `keep`, `drop` or `refuse`. Default `keep`.
    #[serde(default)]
    pub retain: RetainPolicy,
    /// The user (of `[auth]`'s password file and ACL) the messages are published as: its ACL
    /// applies. None: no ACL beyond this entry's filter.
    #[serde(default)]
    pub user: Option<String>,
}

fn default_qos() -> u8 {
    2
}

/// What is wrong with the entries, each at its key.
pub fn check_downlink(entries: &[DownlinkEntry], p: &mut Problems) {
    for (i, e) in entries.iter().enumerate() {
        if let Err(err) = shared::topic::TopicFilter::new(e.filter.clone()) {
            p.bad(format!("downlink[{i}].filter"), format!("{:?}: {err}", e.filter));
        }
        if e.max_qos > 2 {
            p.bad(format!("downlink[{i}].max_qos"), format!("{} is not a QoS (0, 1 or 2)", e.max_qos));
        }
    }
}
