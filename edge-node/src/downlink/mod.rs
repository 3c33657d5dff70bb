//! The downlink on the edge (protocol version 5): what a message from the cloud becomes
//! locally, as `[[downlink]]` allows, and the mark that makes its delivery exactly once.
//!
//! A message is decided here ([`Governance::decide`]): the first entry whose filter matches
//! its topic sets the local QoS (at most `max_qos`), what its retain flag does and the user it
//! is published as; a topic no entry matches, a topic that is not a valid MQTT topic name or a
//! QoS out of range is refused with a reason, which goes back to the cloud and is kept there.
//! An allowed message is handed to the broker with the downlink's next mark
//! ([`DownMark`]: the position and the refusals the cloud has not marked), which the session
//! store commits with the message (`broker::core::downlink`): only then is it acked upstream.

mod config;
mod deliver;

pub use config::{DownlinkEntry, RetainPolicy, problems};
pub use deliver::{COMMIT_WAIT, Deliverer, Handed, NotStored, RulesOf};

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use shared::proto::down::{Down, DownOutcome, DownRefusal, clip_reason};
use shared::topic::TopicFilter;

use crate::broker::codec::{PublishProps, QoS};
use crate::broker::message::Message;

/// The key of the downlink's mark in the session store.
pub const MARK_KEY: &str = "downlink";

/// The client id a `[[downlink]]` entry's user is resolved with (for `%c` in the ACL).
pub const CLIENT_ID: &str = "_edge-downlink";

/// The node's downlink: the deliverer and the mark as last stored, which each new session
/// with the cloud starts from.
#[derive(Debug)]
pub struct Downlink {
    deliverer: Deliverer,
    mark: std::sync::Mutex<DownMark>,
}

impl Downlink {
    pub fn new(deliverer: Deliverer, mark: DownMark) -> Self {
        Self { deliverer, mark: std::sync::Mutex::new(mark) }
    }

    /// The position and the refusals and expiries not yet marked by the cloud.
    pub fn mark(&self) -> DownMark {
        self.mark.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Carries out `d` ([`Deliverer::deliver`]) and keeps the mark it stored.
    pub async fn deliver(&self, d: &Down, unmarked: (&[DownRefusal], &[u64])) -> Result<DownOutcome, NotStored> {
        let outcome = self.deliverer.deliver(d, unmarked).await?;
        let mark = DownMark::after(unmarked, d.seq, &outcome);
        *self.mark.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = mark;
        Ok(outcome)
    }

    /// Hands `d` to the broker ([`Deliverer::hand_over_next`]).
    pub fn hand_over(&self, d: &Down, unmarked: (&[DownRefusal], &[u64]), handed: &mut Handed) {
        self.deliverer.hand_over_next(d, unmarked, handed);
    }

    /// Resolves once the newest handed over is committed ([`Deliverer::committed`]).
    pub async fn committed(&self, handed: &Handed) -> Result<(), NotStored> {
        self.deliverer.committed(handed).await
    }

    /// What the store committed of `handed`, in order, taken off it.
    pub fn take_committed(&self, handed: &mut Handed) -> Vec<(u64, DownOutcome)> {
        self.deliverer.take_committed(handed)
    }

    /// Keeps the session's position and unmarked refusals and expiries as the mark: what the
    /// store holds after the commits just taken.
    pub fn sync_mark(&self, done: u64, unmarked: (&[DownRefusal], &[u64])) {
        let mark = DownMark {
            done,
            refused: unmarked.0.iter().map(|r| (r.seq, r.reason.clone())).collect(),
            expired: unmarked.1.to_vec(),
        };
        *self.mark.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = mark;
    }

    /// The cloud marked everything through `up_to`: a new session need not report it again.
    /// (The stored mark keeps it until the next message; a restart reports it once more, which
    /// the cloud takes as the same.)
    pub fn marked(&self, up_to: u64) {
        let mut m = self.mark.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        m.refused.retain(|(seq, _)| *seq > up_to);
        m.expired.retain(|seq| *seq > up_to);
    }
}

/// The entries of `[[downlink]]`, parsed.
#[derive(Debug, Clone, Default)]
pub struct Governance {
    entries: Vec<(TopicFilter, DownlinkEntry)>,
}

/// How an allowed message is published locally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub qos: QoS,
    pub retain: bool,
    /// Published as this user (its ACL); none: no ACL.
    pub user: Option<String>,
}

impl Governance {
    /// From the config's entries (checked by [`problems`] first: an unusable filter is skipped).
    pub fn new(entries: &[DownlinkEntry]) -> Self {
        let entries =
            entries.iter().filter_map(|e| TopicFilter::new(e.filter.clone()).ok().map(|f| (f, e.clone()))).collect();
        Self { entries }
    }

    /// How `d` is published here, or why it is not.
    pub fn decide(&self, d: &Down) -> Result<Decision, String> {
        if let Err(e) = shared::topic::validate_name(&d.topic) {
            return Err(format!("topic {:?} is not a topic name: {e}", d.topic));
        }
        let Some(qos) = QoS::from_bits(d.qos) else {
            return Err(format!("QoS {} is not 0, 1 or 2", d.qos));
        };
        let Some((_, entry)) = self.entries.iter().find(|(f, _)| f.matches(&d.topic)) else {
            return Err(format!("topic {:?} is not allowed by this edge's [[downlink]]", d.topic));
        };
        let retain = match (d.retain, entry.retain) {
            (false, _) | (true, RetainPolicy::Drop) => false,
            (true, RetainPolicy::Keep) => true,
            (true, RetainPolicy::Refuse) => {
                return Err(format!("retained messages for {:?} are refused by this edge", d.topic));
            }
        };
        let max = QoS::from_bits(entry.max_qos).unwrap_or(QoS::ExactlyOnce);
        Ok(Decision { qos: qos.min(max), retain, user: entry.user.clone() })
    }
}

/// The local message of `d` as decided, received at `now`: its expiry counts from then.
pub fn message(d: &Down, decision: &Decision, now: Instant) -> Message {
    Message {
        topic: d.topic.as_str().into(),
        payload: Bytes::copy_from_slice(&d.payload),
        qos: decision.qos,
        retain: decision.retain,
        props: PublishProps {
            payload_format: None,
            content_type: d.content_type.clone(),
            response_topic: d.response_topic.clone(),
            correlation_data: d.correlation_data.as_deref().map(Bytes::copy_from_slice),
            user: d.user_properties.clone(),
        },
        expires_at: d.expires_in_ms.map(|ms| now + Duration::from_millis(ms)),
        origin: None,
        schema: None,
    }
}

/// What the session store keeps of the downlink: done through `done`, and the refusals and
/// expiries the cloud has not marked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownMark {
    pub done: u64,
    #[serde(default)]
    pub refused: Vec<(u64, String)>,
    #[serde(default)]
    pub expired: Vec<u64>,
}

impl DownMark {
    /// The mark as stored; a value that does not parse is a fresh start (position 0): the
    /// cloud resends from its own position and nothing is lost, at worst delivered again.
    pub fn parse(value: Option<&str>) -> Self {
        value.and_then(|v| serde_json::from_str(v).ok()).unwrap_or_default()
    }

    pub fn to_value(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The mark once message `seq` is done with `outcome`, from what is unmarked now.
    pub fn after(unmarked: (&[DownRefusal], &[u64]), seq: u64, outcome: &DownOutcome) -> Self {
        let mut refused: Vec<(u64, String)> = unmarked.0.iter().map(|r| (r.seq, r.reason.clone())).collect();
        let mut expired = unmarked.1.to_vec();
        match outcome {
            DownOutcome::Delivered => {}
            DownOutcome::Refused(reason) => refused.push((seq, clip_reason(reason.clone()))),
            DownOutcome::Expired => expired.push(seq),
        }
        Self { done: seq, refused, expired }
    }

    /// The refusals as the session takes them back after a restart.
    pub fn refusals(&self) -> Vec<DownRefusal> {
        self.refused.iter().map(|(seq, reason)| DownRefusal { seq: *seq, reason: reason.clone() }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn down(topic: &str, qos: u8, retain: bool) -> Down {
        Down {
            seq: 1,
            topic: topic.into(),
            payload: b"on".to_vec(),
            qos,
            retain,
            expires_in_ms: Some(1500),
            user_properties: vec![("k".into(), "v".into())],
            response_topic: Some("reply/cmd".into()),
            correlation_data: Some(vec![7]),
            content_type: Some("text/plain".into()),
        }
    }

    fn governance() -> Governance {
        let toml = r#"
            [[downlink]]
            filter = "cmd/valve/#"
            max_qos = 1
            retain = "refuse"
            user = "cloud"
            [[downlink]]
            filter = "config/#"
            [[downlink]]
            filter = "cmd/#"
            retain = "drop"
        "#;
        #[derive(Deserialize)]
        struct Doc {
            downlink: Vec<DownlinkEntry>,
        }
        let doc: Doc = toml::from_str(toml).unwrap();
        assert!(problems(&doc.downlink).is_empty());
        Governance::new(&doc.downlink)
    }

    #[test]
    fn the_first_matching_entry_decides_qos_retain_and_user() {
        let g = governance();
        assert_eq!(
            g.decide(&down("cmd/valve/3", 2, false)),
            Ok(Decision { qos: QoS::AtLeastOnce, retain: false, user: Some("cloud".into()) })
        );
        assert!(g.decide(&down("cmd/valve/3", 1, true)).unwrap_err().contains("retained messages"));
        assert_eq!(
            g.decide(&down("cmd/pump", 2, true)),
            Ok(Decision { qos: QoS::ExactlyOnce, retain: false, user: None })
        );
        assert_eq!(
            g.decide(&down("config/a", 0, true)),
            Ok(Decision { qos: QoS::AtMostOnce, retain: true, user: None })
        );
    }

    #[test]
    fn what_no_entry_allows_or_is_no_topic_name_is_refused_with_its_reason() {
        let g = governance();
        assert!(
            g.decide(&down("telemetry/x", 1, false)).unwrap_err().contains("not allowed by this edge's [[downlink]]")
        );
        assert!(g.decide(&down("cmd/+", 1, false)).unwrap_err().contains("not a topic name"));
        assert!(g.decide(&down("", 1, false)).unwrap_err().contains("not a topic name"));
        assert!(g.decide(&down("cmd/a", 3, false)).unwrap_err().contains("QoS 3"));
        // No entries: nothing is allowed.
        assert!(Governance::default().decide(&down("cmd/a", 1, false)).is_err());
        let bad = [DownlinkEntry { filter: "a/#/b".into(), max_qos: 3, retain: RetainPolicy::Keep, user: None }];
        let keys: Vec<_> = problems(&bad).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["downlink[0].filter", "downlink[0].max_qos"]);
    }

    #[test]
    fn the_local_message_carries_the_mqtt_5_properties_and_what_is_left_of_the_expiry() {
        let now = Instant::now();
        let d = down("cmd/a", 2, false);
        let m = message(&d, &Decision { qos: QoS::AtLeastOnce, retain: false, user: None }, now);
        assert_eq!(m.qos, QoS::AtLeastOnce);
        assert_eq!(m.props.response_topic.as_deref(), Some("reply/cmd"));
        assert_eq!(m.props.correlation_data.as_deref(), Some(&[7u8][..]));
        assert_eq!(m.props.user, [("k".to_owned(), "v".to_owned())]);
        assert_eq!(m.expires_at, Some(now + Duration::from_millis(1500)));
        assert_eq!(m.origin, None);
    }

    #[test]
    fn the_mark_keeps_the_position_and_the_unmarked_and_survives_bad_values() {
        let earlier = [DownRefusal { seq: 3, reason: "no".into() }];
        let m = DownMark::after((&earlier, &[4]), 9, &DownOutcome::Refused("x".repeat(400)));
        assert_eq!(m.done, 9);
        assert_eq!(m.refused[0], (3, "no".to_owned()));
        assert_eq!(m.refused[1].1.len(), shared::proto::down::MAX_REFUSAL_REASON);
        assert_eq!(m.expired, [4]);
        assert_eq!(DownMark::parse(Some(&m.to_value())), m);
        assert_eq!(DownMark::parse(Some("garbage")), DownMark::default());
        assert_eq!(DownMark::parse(None).done, 0);
        assert_eq!(m.refusals()[0], earlier[0]);
    }
}
