//! The downlink's policy on the node, without I/O or a clock: what a message from the cloud
//! becomes (delivered, refused or expired, [`Governance::decide`]), the mark handed to the
//! broker with it, and which messages the session store has committed. The uplink's connection
//! core (`uplink::core::Conn`) calls it for each downlink frame and each store commit; the
//! simulation drives the same code over its own broker and store.
//!
//! A message is handed to the broker ([`Target`]) with the downlink's next mark
//! ([`DownMark`]: the position and the refusals the cloud has not marked), which the session
//! store commits with the message (`broker::core::downlink`): only then is it acked upstream.
//! Messages come on while earlier ones wait for their commit ([`Handed`]), so a window of them
//! shares the store's commits.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::proto::down::{Down, DownOutcome, DownRefusal, clip_reason};

use super::{DownMark, Governance, MARK_KEY, message};
use crate::auth::Rules;
use crate::broker::core::{Broker, Refused};
use crate::broker::message::Message;

/// How long a downlink message waits for the session store's commit before its connection
/// ends: far above a commit (5 ms of gathering and a write), far below the bridge's patience.
pub const COMMIT_WAIT: Duration = Duration::from_secs(10);

/// The session store did not commit a downlink message in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("downlink message {0} not committed by the session store within {COMMIT_WAIT:?}")]
pub struct NotStored(pub u64);

/// The ACL of a user of `[auth]`, as it is now (a reload changes it); `None`: no such user.
pub type RulesOf = Arc<dyn Fn(&str) -> Option<Arc<Rules>> + Send + Sync>;

/// What the downlink needs of the broker: a message delivered locally with the mark in the same
/// commit, or the mark alone; each returns the store op to wait for.
pub trait Target {
    /// [`Broker::publish_downlink`] under [`MARK_KEY`].
    fn publish_downlink(
        &mut self,
        rules: Option<&Rules>,
        msg: Message,
        mark: String,
        now: Instant,
    ) -> Result<u64, Refused>;

    /// [`Broker::store_mark`] under [`MARK_KEY`].
    fn store_mark(&mut self, mark: String) -> u64;
}

impl Target for Broker {
    fn publish_downlink(
        &mut self,
        rules: Option<&Rules>,
        msg: Message,
        mark: String,
        now: Instant,
    ) -> Result<u64, Refused> {
        Broker::publish_downlink(self, rules, msg, MARK_KEY, mark, now)
    }

    fn store_mark(&mut self, mark: String) -> u64 {
        Broker::store_mark(self, MARK_KEY, mark)
    }
}

/// Downlink messages handed to the broker, waiting for the session store's commit, in order:
/// (seq, outcome, store op). Their refusals and expiries, which the session learns only once
/// they are committed, go into the marks of the ones after.
#[derive(Debug, Default)]
pub struct Handed {
    queue: VecDeque<(u64, DownOutcome, u64)>,
    refused: Vec<DownRefusal>,
    expired: Vec<u64>,
    /// Since when the oldest has waited (the first of them, or the last commit).
    since: Option<Instant>,
}

impl Handed {
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The store op the newest waits for.
    pub fn waiting_for(&self) -> Option<u64> {
        self.queue.back().map(|&(_, _, op)| op)
    }

    /// When the oldest has waited [`COMMIT_WAIT`], and its seq.
    pub fn deadline(&self) -> Option<(Instant, u64)> {
        Some((self.since? + COMMIT_WAIT, self.queue.front()?.0))
    }
}

/// The node's downlink: its rules and the mark as last stored, which each new session with the
/// cloud starts from.
pub struct DownCore {
    governance: Governance,
    rules_of: RulesOf,
    mark: DownMark,
}

impl std::fmt::Debug for DownCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DownCore").field("governance", &self.governance).field("mark", &self.mark).finish()
    }
}

impl DownCore {
    /// With `[[downlink]]`'s rules, the users' ACLs and the mark the store held at start.
    pub fn new(governance: Governance, rules_of: RulesOf, mark: DownMark) -> Self {
        Self { governance, rules_of, mark }
    }

    /// The position and the refusals and expiries not yet marked by the cloud.
    pub fn mark(&self) -> &DownMark {
        &self.mark
    }

    /// Hands `d` to the broker with the mark after it, and queues it in `handed` until the
    /// store commits it; `unmarked` are the session's refusals and expiries not yet marked,
    /// those of the messages still in `handed` go after them.
    pub fn hand_over(
        &self,
        target: &mut dyn Target,
        d: &Down,
        unmarked: (&[DownRefusal], &[u64]),
        handed: &mut Handed,
        now: Instant,
    ) {
        let (outcome, op) = if handed.refused.is_empty() && handed.expired.is_empty() {
            self.decide(target, d, unmarked, now)
        } else {
            let refused: Vec<DownRefusal> = unmarked.0.iter().chain(&handed.refused).cloned().collect();
            let expired: Vec<u64> = unmarked.1.iter().chain(&handed.expired).copied().collect();
            self.decide(target, d, (&refused, &expired), now)
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

    /// The messages of `handed` the store has committed (every op through `through`), in
    /// order, taken off it.
    pub fn take_committed(&self, handed: &mut Handed, through: u64, now: Instant) -> Vec<(u64, DownOutcome)> {
        let mut done = Vec::new();
        while handed.queue.front().is_some_and(|(_, _, op)| *op <= through) {
            let Some((seq, outcome, _)) = handed.queue.pop_front() else { break };
            done.push((seq, outcome));
        }
        if let Some(&(last, _)) = done.last() {
            handed.refused.retain(|r| r.seq > last);
            handed.expired.retain(|s| *s > last);
            handed.since = (!handed.queue.is_empty()).then_some(now);
        }
        done
    }

    /// Keeps the session's position and unmarked refusals and expiries as the mark: what the
    /// store holds after the commits just taken.
    pub fn sync_mark(&mut self, done: u64, unmarked: (&[DownRefusal], &[u64])) {
        self.mark = DownMark {
            done,
            refused: unmarked.0.iter().map(|r| (r.seq, r.reason.clone())).collect(),
            expired: unmarked.1.to_vec(),
        };
    }

    /// The cloud marked everything through `up_to`: a new session need not report it again.
    /// (The stored mark keeps it until the next message; a restart reports it once more, which
    /// the cloud takes as the same.)
    pub fn marked(&mut self, up_to: u64) {
        self.mark.refused.retain(|(seq, _)| *seq > up_to);
        self.mark.expired.retain(|seq| *seq > up_to);
    }

    /// Delivers, refuses or expires `d`, and returns how with the store op of its mark.
    fn decide(
        &self,
        target: &mut dyn Target,
        d: &Down,
        unmarked: (&[DownRefusal], &[u64]),
        now: Instant,
    ) -> (DownOutcome, u64) {
        let refuse = |target: &mut dyn Target, outcome: DownOutcome| {
            let mark = DownMark::after(unmarked, d.seq, &outcome).to_value();
            (outcome, target.store_mark(mark))
        };
        if d.expires_in_ms == Some(0) {
            return refuse(target, DownOutcome::Expired);
        }
        let decision = match self.governance.decide(d) {
            Ok(decision) => decision,
            Err(reason) => return refuse(target, DownOutcome::Refused(reason)),
        };
        let rules = match &decision.user {
            Some(user) => match (self.rules_of)(user) {
                Some(rules) => Some(rules),
                None => return refuse(target, DownOutcome::Refused(format!("user {user:?} is not in [auth]"))),
            },
            None => None,
        };
        let mark = DownMark::after(unmarked, d.seq, &DownOutcome::Delivered).to_value();
        let msg = message(d, &decision, now);
        match target.publish_downlink(rules.as_deref(), msg, mark, now) {
            Ok(op) => (DownOutcome::Delivered, op),
            Err(refused) => refuse(target, DownOutcome::Refused(format!("refused by the broker: {refused}"))),
        }
    }
}
