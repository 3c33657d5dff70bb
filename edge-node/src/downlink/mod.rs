//! The downlink on the edge (protocol version 5): what a message from the cloud becomes
//! locally, as `[[downlink]]` allows, and the mark that makes its delivery exactly once.
//!
//! A message is decided here ([`Governance::decide`]): the first entry whose filter matches
//! its topic sets the local QoS (at most `max_qos`), what its retain flag does and the user it
//! is published as; a topic no entry matches, a topic that is not a valid MQTT topic name or a
//! QoS out of range is refused with a reason, which goes back to the cloud and is kept there.
//! The policy of handing messages to the broker and taking their commits is [`core`]'s, without
//! I/O; [`Live`] is the running broker as its target.

mod config;
pub mod core;

pub use self::core::{DownCore, RulesOf, Target};
pub use config::{DownlinkEntry, RetainPolicy, check_downlink};

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use shared::proto::down::{Down, DownOutcome, DownRefusal, clip_reason};
use shared::topic::TopicFilter;

use crate::auth::Rules;
use crate::broker::codec::{PublishProps, QoS};
use crate::broker::driver::BrokerHandle;
use crate::broker::message::Message;

/// The key of the downlink's mark in the session store.
pub const MARK_KEY: &str = "downlink";

/// The client id a `[[downlink]]` entry's user is resolved with (for `%c` in the ACL).
pub const CLIENT_ID: &str = "_edge-downlink";

/// The running broker as the downlink's [`Target`]: each call takes the core's lock for a
/// moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Live<'a>(pub &'a BrokerHandle);

impl Target for Live<'_> {
    fn publish_downlink(
        &mut self,
        rules: Option<&Rules>,
        msg: Message,
        mark: String,
        now: Instant,
    ) -> Result<u64, crate::broker::core::Refused> {
        let (done, routed) = self.0.with(|b| Target::publish_downlink(b, rules, msg, mark, now));
        // A downlink message is never spooled; what `routed` could hold (a will a slow
        // subscriber's end fired) goes to the timer task.
        drop(routed);
        done
    }

    fn store_mark(&mut self, mark: String) -> u64 {
        let (op, routed) = self.0.with(|b| Target::store_mark(b, mark));
        drop(routed);
        op
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
    /// From the config's entries (checked by [`check_downlink`] first: an unusable filter is skipped).
    pub fn new(entries: &[DownlinkEntry]) -> Self {
        let entries =
            entries.iter().filter_map(|e| TopicFilter::new(e.filter.clone()).ok().map(|f| (f, e.clone()))).collect();
        Self { entries }
    }

    /// How `d` is published here, or why it is not.
    pub(crate) fn decide(&self, d: &Down) -> Result<Decision, String> {
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

    pub(crate) fn to_value(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The mark once message `seq` is done with `outcome`, after this one.
    pub(crate) fn after(&self, seq: u64, outcome: &DownOutcome) -> Self {
        let mut next = self.clone();
        next.done = seq;
        match outcome {
            DownOutcome::Delivered => {}
            DownOutcome::Refused(reason) => next.refused.push((seq, clip_reason(reason.clone()))),
            DownOutcome::Expired => next.expired.push(seq),
        }
        next
    }

    /// The refusals as the session takes them back after a restart.
    pub(crate) fn refusals(&self) -> Vec<DownRefusal> {
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
        let mut p = shared::check::Problems::default();
        check_downlink(&doc.downlink, &mut p);
        assert!(p.is_empty(), "{p:?}");
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
        let mut p = shared::check::Problems::default();
        check_downlink(&bad, &mut p);
        let keys: Vec<_> = p.into_vec().into_iter().map(|p| p.key).collect();
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
        let before = DownMark { done: 4, refused: vec![(3, "no".into())], expired: vec![4] };
        let m = before.after(9, &DownOutcome::Refused("x".repeat(400)));
        assert_eq!(m.done, 9);
        assert_eq!(m.refused[0], (3, "no".to_owned()));
        assert_eq!(m.refused[1].1.len(), shared::proto::down::MAX_REFUSAL_REASON);
        assert_eq!(m.expired, [4]);
        assert_eq!(DownMark::parse(Some(&m.to_value())), m);
        assert_eq!(DownMark::parse(Some("garbage")), DownMark::default());
        assert_eq!(DownMark::parse(None).done, 0);
        assert_eq!(m.refusals()[0], earlier[0]);
    }

    mod delivered {
        use std::sync::Arc;

        use super::super::*;
        use crate::broker::BrokerConfig;
        use crate::broker::core::{Broker, WallClock};
        use crate::broker::metrics::BrokerMetrics;
        use crate::broker::store::SessionStore;
        use crate::route::Classes;

        fn down(seq: u64, topic: &str, retain: bool) -> Down {
            Down {
                seq,
                topic: topic.into(),
                payload: format!("p{seq}").into_bytes(),
                qos: 1,
                retain,
                expires_in_ms: None,
                user_properties: vec![],
                response_topic: None,
                correlation_data: None,
                content_type: None,
            }
        }

        fn broker(path: &std::path::Path) -> Arc<BrokerHandle> {
            let metrics = BrokerMetrics::new(&mut Default::default());
            let (store, _) = SessionStore::open(path, metrics.clone()).unwrap();
            let limits = BrokerConfig::default().limits(Vec::new(), Vec::new());
            let core = Broker::new(limits, Arc::new(Classes::default()), metrics, WallClock::read());
            BrokerHandle::new(core, None, Some(store))
        }

        fn core(entry: DownlinkEntry) -> DownCore {
            // No user is in [auth] here.
            let rules_of: RulesOf = Arc::new(|_| None);
            DownCore::new(Governance::new(&[entry]), rules_of, DownMark::default())
        }

        fn entry(user: Option<&str>) -> DownlinkEntry {
            DownlinkEntry {
                filter: "config/#".into(),
                max_qos: 2,
                retain: RetainPolicy::Keep,
                user: user.map(Into::into),
            }
        }

        /// Hands `d` over and waits for its commit, as the uplink's connection does.
        async fn deliver(core: &mut DownCore, broker: &BrokerHandle, d: &Down) -> DownOutcome {
            core.offer(&mut Live(broker), d, Instant::now());
            assert_eq!(core.outcome(d.seq), None, "not before its commit");
            broker.wait_stored(core.waiting_for().expect("handed over")).await;
            core.stored(broker.stored_through());
            assert_eq!(core.waiting_for(), None);
            core.outcome(d.seq).expect("committed")
        }

        /// What a delivery committed is in the SQLite store when its outcome comes back: the
        /// retained message and the mark together; a refusal's mark too, with its reason.
        #[tokio::test]
        async fn an_outcome_comes_back_only_once_the_store_has_the_message_and_the_mark() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("sessions.db");
            let b = broker(&path);
            let mut c = core(entry(None));
            assert_eq!(deliver(&mut c, &b, &down(4, "config/threshold", true)).await, DownOutcome::Delivered);
            // Read at once, from another connection: the commit is behind the outcome, not 5 ms
            // (the store's commit interval) after it.
            let on_disk = |sql: &str| -> Option<String> {
                let conn =
                    rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
                conn.query_row(sql, [], |r| r.get(0)).ok()
            };
            let mark = on_disk("SELECT value FROM marks WHERE key = 'downlink'");
            assert_eq!(DownMark::parse(mark.as_deref()).done, 4);
            assert_eq!(on_disk("SELECT topic FROM retained").as_deref(), Some("config/threshold"));
            let DownOutcome::Refused(reason) = deliver(&mut c, &b, &down(6, "cmd/reboot", false)).await else {
                panic!()
            };
            assert!(reason.contains("not allowed"), "{reason}");
            let expired = Down { expires_in_ms: Some(0), ..down(7, "config/x", false) };
            assert_eq!(deliver(&mut c, &b, &expired).await, DownOutcome::Expired);
            // A user the ACL does not know: refused, not published without an ACL; the mark goes
            // on from where the store is.
            let mut c = DownCore::new(Governance::new(&[entry(Some("ghost"))]), Arc::new(|_| None), c.mark().clone());
            let DownOutcome::Refused(reason) = deliver(&mut c, &b, &down(8, "config/y", true)).await else { panic!() };
            assert!(reason.contains("\"ghost\" is not in [auth]"), "{reason}");
            // No flush, no shutdown: what came back is committed already.
            drop(b);
            let metrics = BrokerMetrics::new(&mut Default::default());
            let (_, state) = SessionStore::open(&path, metrics).unwrap();
            let topics: Vec<&str> = state.retained.iter().map(|m| &*m.topic).collect();
            assert_eq!(topics, ["config/threshold"]);
            let mark = DownMark::parse(state.marks.get(MARK_KEY).map(String::as_str));
            assert_eq!(mark.done, 8);
            // Nothing was marked by the cloud meanwhile: the mark holds every refusal and expiry.
            assert_eq!(mark.refused.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [6, 8]);
            assert_eq!(mark.expired, [7]);
        }
    }
}
