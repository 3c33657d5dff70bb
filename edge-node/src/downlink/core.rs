//! The downlink's policy on the node, without I/O or a clock: what a message from the cloud
//! becomes (delivered, refused or expired, [`Governance::decide`]), the mark handed to the
//! broker with it, and which messages the session store has committed. The uplink's connection
//! core (`uplink::core::Conn`) calls it for each downlink frame and each store commit; the
//! simulation drives the same code over its own broker and store.
//!
//! A message is handed to the broker ([`Target`]) with the downlink's next mark
//! ([`DownMark`]: the position and the refusals the cloud has not marked), which the session
//! store commits with the message (`broker::core::downlink`): only then is it acked upstream.
//! Messages come on while earlier ones wait for their commit, so a window of them shares the
//! store's commits. A store that does not commit holds the downlink (the bridge's window fills),
//! not the connection: telemetry goes on, and `/readyz` says the store is stuck.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use shared::proto::down::{Down, DownOutcome};

use super::{DownMark, Governance, MARK_KEY, message};
use crate::auth::Rules;
use crate::broker::core::{Broker, Refused};
use crate::broker::message::Message;

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

/// A downlink message handed to the broker, waiting for the session store's commit: the store
/// op of its mark, and the mark written with it (its seq and outcome among it).
#[derive(Debug)]
struct Handed {
    op: u64,
    mark: DownMark,
}

/// The node's downlink: its rules, the messages handed to the broker and not yet committed, and
/// the mark as committed, which each new session with the cloud starts from. It outlives every
/// connection: a message handed over is committed (or not) whatever becomes of the connection
/// it came on, and a resend of it on the next is recognised, never handed over again.
pub struct DownCore {
    governance: Governance,
    rules_of: RulesOf,
    /// What the store holds: the position and the refusals the cloud has not marked.
    committed: DownMark,
    /// The mark after the last message handed over (what the store will hold).
    latest: DownMark,
    /// Handed over, not committed, in order.
    handed: VecDeque<Handed>,
    /// Store ops committed so far, as last heard.
    stored: u64,
}

impl std::fmt::Debug for DownCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DownCore")
            .field("governance", &self.governance)
            .field("committed", &self.committed)
            .field("handed", &self.handed.len())
            .finish()
    }
}

impl DownCore {
    /// With `[[downlink]]`'s rules, the users' ACLs and the mark the store held at start.
    pub fn new(governance: Governance, rules_of: RulesOf, mark: DownMark) -> Self {
        Self { governance, rules_of, latest: mark.clone(), committed: mark, handed: VecDeque::new(), stored: 0 }
    }

    /// The position and the refusals and expiries not yet marked by the cloud, as committed.
    pub(crate) fn mark(&self) -> &DownMark {
        &self.committed
    }

    /// Hands `d` to the broker with the mark after it, unless it was handed over already (a
    /// resend after the connection it first came on ended) or is committed (then
    /// [`DownCore::outcome`] has it at once).
    pub(crate) fn offer(&mut self, target: &mut dyn Target, d: &Down, now: Instant) {
        if d.seq <= self.latest.done {
            return;
        }
        let (mark, op) = self.decide(target, d, now);
        self.latest = mark.clone();
        self.handed.push_back(Handed { op, mark });
    }

    /// How message `seq` ended, once the store committed it; `None` while it waits (or was
    /// never offered).
    pub(crate) fn outcome(&self, seq: u64) -> Option<DownOutcome> {
        if seq > self.committed.done {
            return None;
        }
        if let Some((_, reason)) = self.committed.refused.iter().find(|(s, _)| *s == seq) {
            return Some(DownOutcome::Refused(reason.clone()));
        }
        if self.committed.expired.contains(&seq) {
            return Some(DownOutcome::Expired);
        }
        Some(DownOutcome::Delivered)
    }

    /// The store committed every op through `through`: the messages handed over with them are
    /// done, and the mark they carried is the store's.
    pub fn stored(&mut self, through: u64) {
        self.stored = self.stored.max(through);
        while self.handed.front().is_some_and(|h| h.op <= self.stored) {
            if let Some(h) = self.handed.pop_front() {
                self.committed = h.mark;
            }
        }
    }

    /// The store op the newest message handed over waits for, if one waits.
    pub(crate) fn waiting_for(&self) -> Option<u64> {
        self.handed.back().map(|h| h.op)
    }

    /// The cloud marked everything through `up_to`: a new session need not report it again.
    /// (The stored mark keeps it until the next message; a restart reports it once more, which
    /// the cloud takes as the same.)
    pub(crate) fn marked(&mut self, up_to: u64) {
        for mark in [&mut self.committed, &mut self.latest] {
            mark.refused.retain(|(seq, _)| *seq > up_to);
            mark.expired.retain(|seq| *seq > up_to);
        }
    }

    /// Delivers, refuses or expires `d`: the mark after it (which says how), and the store op
    /// of that mark.
    fn decide(&self, target: &mut dyn Target, d: &Down, now: Instant) -> (DownMark, u64) {
        let refuse = |target: &mut dyn Target, outcome: DownOutcome| {
            let mark = self.latest.after(d.seq, &outcome);
            let op = target.store_mark(mark.to_value());
            (mark, op)
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
        let mark = self.latest.after(d.seq, &DownOutcome::Delivered);
        let msg = message(d, &decision, now);
        match target.publish_downlink(rules.as_deref(), msg, mark.to_value(), now) {
            Ok(op) => (mark, op),
            Err(refused) => refuse(target, DownOutcome::Refused(format!("refused by the broker: {refused}"))),
        }
    }
}
