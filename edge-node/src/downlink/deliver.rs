//! Carrying out a downlink message on the node: decided, handed to the broker with its mark,
//! and answered only once the session store committed both.

use std::sync::Arc;
use std::time::Instant;

use shared::proto::down::{Down, DownOutcome, DownRefusal, clip_reason};

use super::{DownMark, Governance, MARK_KEY, message};
use crate::auth::Rules;
use crate::broker::driver::BrokerHandle;

/// How long a downlink message waits for the session store's commit before its connection
/// ends: far above a commit (5 ms of gathering and a write), far below the bridge's patience.
pub const COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The session store did not commit a downlink message in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("downlink message {0} not committed by the session store within {COMMIT_WAIT:?}")]
pub struct NotStored(pub u64);

/// Downlink messages handed to the broker, waiting for the session store's commit, in order:
/// (seq, outcome, store op). Their refusals and expiries, which the session learns only once
/// they are committed, go into the marks of the ones after.
#[derive(Debug, Default)]
pub struct Handed {
    queue: std::collections::VecDeque<(u64, DownOutcome, u64)>,
    refused: Vec<DownRefusal>,
    expired: Vec<u64>,
    /// Since when the oldest has waited (the first of them, or the last commit).
    since: Option<Instant>,
}

impl Handed {
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// The ACL of a user of `[auth]`, as it is now (a reload changes it); `None`: no such user.
pub type RulesOf = Arc<dyn Fn(&str) -> Option<Arc<Rules>> + Send + Sync>;

/// Delivers downlink messages into the broker.
pub struct Deliverer {
    pub broker: Arc<BrokerHandle>,
    pub governance: Governance,
    pub rules_of: RulesOf,
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer").field("governance", &self.governance).finish_non_exhaustive()
    }
}

impl Deliverer {
    /// Delivers, refuses or expires `d` (the next message after the session's position, whose
    /// refusals and expiries not yet marked are `unmarked`) and returns how, once the outcome
    /// and the new mark are committed. A store that has not committed within
    /// [`COMMIT_WAIT`] (a failing disk) is an error: nothing may be acked, and the connection
    /// ends rather than hold the uplink's telemetry behind it; the bridge sends the message
    /// again, and the mark, once committed, tells it apart.
    pub async fn deliver(&self, d: &Down, unmarked: (&[DownRefusal], &[u64])) -> Result<DownOutcome, NotStored> {
        let mut handed = Handed::default();
        self.hand_over_next(d, unmarked, &mut handed);
        self.committed(&handed).await?;
        let mut done = self.take_committed(&mut handed);
        Ok(done.pop().map(|(_, outcome)| outcome).expect("the one handed over is committed"))
    }

    /// Hands `d` to the broker with the mark after it, and queues it in `handed` until the
    /// store commits it; `unmarked` are the session's refusals and expiries not yet marked,
    /// those of the messages still in `handed` go after them. Messages come on while earlier
    /// ones wait for their commit, so a window of them shares the store's commits.
    pub fn hand_over_next(&self, d: &Down, unmarked: (&[DownRefusal], &[u64]), handed: &mut Handed) {
        let now = Instant::now();
        let (outcome, op) = if handed.refused.is_empty() && handed.expired.is_empty() {
            self.hand_over(d, unmarked, now)
        } else {
            let refused: Vec<DownRefusal> = unmarked.0.iter().chain(&handed.refused).cloned().collect();
            let expired: Vec<u64> = unmarked.1.iter().chain(&handed.expired).copied().collect();
            self.hand_over(d, (&refused, &expired), now)
        };
        match &outcome {
            DownOutcome::Delivered => {}
            DownOutcome::Refused(reason) => {
                handed.refused.push(DownRefusal { seq: d.seq, reason: clip_reason(reason.clone()) })
            }
            DownOutcome::Expired => handed.expired.push(d.seq),
        }
        handed.queue.push_back((d.seq, outcome, op));
        handed.since.get_or_insert(now);
    }

    /// Resolves once the store committed the newest message in `handed` (never while it is
    /// empty); a store that has not committed the oldest within [`COMMIT_WAIT`] of its hand-over
    /// is an error: nothing may be acked, and the connection ends rather than hold the
    /// uplink's telemetry behind it; the bridge sends the messages again, and the mark, once
    /// committed, tells them apart.
    pub async fn committed(&self, handed: &Handed) -> Result<(), NotStored> {
        let (Some(&(oldest, _, _)), Some(&(_, _, op)), Some(since)) =
            (handed.queue.front(), handed.queue.back(), handed.since)
        else {
            return std::future::pending().await;
        };
        let left = COMMIT_WAIT.saturating_sub(since.elapsed());
        tokio::time::timeout(left, self.broker.wait_stored(op)).await.map_err(|_| NotStored(oldest))
    }

    /// The messages of `handed` the store has committed, in order, taken off it.
    pub fn take_committed(&self, handed: &mut Handed) -> Vec<(u64, DownOutcome)> {
        let through = self.broker.stored_through();
        let mut done = Vec::new();
        while handed.queue.front().is_some_and(|(_, _, op)| *op <= through) {
            let (seq, outcome, _) = handed.queue.pop_front().expect("checked");
            done.push((seq, outcome));
        }
        if let Some(&(last, _)) = done.last() {
            handed.refused.retain(|r| r.seq > last);
            handed.expired.retain(|s| *s > last);
            handed.since = (!handed.queue.is_empty()).then(Instant::now);
        }
        done
    }

    fn hand_over(&self, d: &Down, unmarked: (&[DownRefusal], &[u64]), now: Instant) -> (DownOutcome, u64) {
        let refuse = |outcome: DownOutcome| {
            let mark = DownMark::after(unmarked, d.seq, &outcome).to_value();
            let (op, routed) = self.broker.with(|b| b.store_mark(MARK_KEY, mark));
            drop(routed);
            (outcome, op)
        };
        if d.expires_in_ms == Some(0) {
            return refuse(DownOutcome::Expired);
        }
        let decision = match self.governance.decide(d) {
            Ok(decision) => decision,
            Err(reason) => return refuse(DownOutcome::Refused(reason)),
        };
        let rules = match &decision.user {
            Some(user) => match (self.rules_of)(user) {
                Some(rules) => Some(rules),
                None => return refuse(DownOutcome::Refused(format!("user {user:?} is not in [auth]"))),
            },
            None => None,
        };
        let mark = DownMark::after(unmarked, d.seq, &DownOutcome::Delivered).to_value();
        let msg = message(d, &decision, now);
        let (done, routed) = self.broker.with(|b| b.publish_downlink(rules.as_deref(), msg, MARK_KEY, mark, now));
        // A downlink message is never spooled; what `routed` could hold (a will a slow
        // subscriber's end fired) goes to the timer task.
        drop(routed);
        match done {
            Ok(op) => (DownOutcome::Delivered, op),
            Err(label) => refuse(DownOutcome::Refused(format!("refused by the broker: {label}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::BrokerConfig;
    use crate::broker::core::{Broker, WallClock};
    use crate::broker::metrics::BrokerMetrics;
    use crate::broker::store::SessionStore;
    use crate::downlink::DownlinkEntry;
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

    fn deliverer(path: &std::path::Path, entry: DownlinkEntry) -> Deliverer {
        let metrics = BrokerMetrics::new(&mut Default::default());
        let (store, _) = SessionStore::open(path, metrics.clone()).unwrap();
        let limits = BrokerConfig::default().limits(Vec::new(), Vec::new());
        let core = Broker::new(limits, Arc::new(Classes::default()), metrics, WallClock::read());
        let broker = BrokerHandle::new(core, None, Some(store));
        // No user is in [auth] here.
        let rules_of: RulesOf = Arc::new(|_| None);
        Deliverer { broker, governance: Governance::new(&[entry]), rules_of }
    }

    fn entry(user: Option<&str>) -> DownlinkEntry {
        DownlinkEntry {
            filter: "config/#".into(),
            max_qos: 2,
            retain: crate::downlink::RetainPolicy::Keep,
            user: user.map(Into::into),
        }
    }

    /// What a delivery committed is in the SQLite store when its outcome comes back: the
    /// retained message and the mark together; a refusal's mark too, with its reason.
    #[tokio::test]
    async fn an_outcome_comes_back_only_once_the_store_has_the_message_and_the_mark() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.db");
        let mut d = deliverer(&path, entry(None));
        assert_eq!(d.deliver(&down(4, "config/threshold", true), (&[], &[])).await, Ok(DownOutcome::Delivered));
        // Read at once, from another connection: the commit is behind the outcome, not 5 ms
        // (the store's commit interval) after it.
        let on_disk = |sql: &str| -> Option<String> {
            let conn = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
            conn.query_row(sql, [], |r| r.get(0)).ok()
        };
        let mark = on_disk("SELECT value FROM marks WHERE key = 'downlink'");
        assert_eq!(DownMark::parse(mark.as_deref()).done, 4);
        assert_eq!(on_disk("SELECT topic FROM retained").as_deref(), Some("config/threshold"));
        let refused = d.deliver(&down(6, "cmd/reboot", false), (&[], &[])).await.unwrap();
        let DownOutcome::Refused(reason) = &refused else { panic!("{refused:?}") };
        assert!(reason.contains("not allowed"), "{reason}");
        let expired =
            d.deliver(&Down { expires_in_ms: Some(0), ..down(7, "config/x", false) }, (&[], &[])).await.unwrap();
        assert_eq!(expired, DownOutcome::Expired);
        // A user the ACL does not know: refused, not published without an ACL.
        d.governance = Governance::new(&[entry(Some("ghost"))]);
        let DownOutcome::Refused(reason) = d.deliver(&down(8, "config/y", true), (&[], &[])).await.unwrap() else {
            panic!()
        };
        assert!(reason.contains("\"ghost\" is not in [auth]"), "{reason}");
        // No flush, no shutdown: what came back is committed already.
        drop(d);
        let metrics = BrokerMetrics::new(&mut Default::default());
        let (_, state) = SessionStore::open(&path, metrics).unwrap();
        let topics: Vec<&str> = state.retained.iter().map(|m| &*m.topic).collect();
        assert_eq!(topics, ["config/threshold"]);
        let mark = DownMark::parse(state.marks.get(MARK_KEY).map(String::as_str));
        assert_eq!(mark.done, 8);
        // The caller's unmarked list was empty each time: the last mark holds only its own.
        assert_eq!(mark.refused.len(), 1);
        assert!(mark.expired.is_empty());
    }
}
