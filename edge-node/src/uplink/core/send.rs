//! What the uplink sends next: which lane, from which seq, and when a partial batch stops
//! waiting to fill.
//!
//! A lane is due when a full batch waits (`batch_records`) or its first waiting record has
//! lingered `linger`: fuller batches compress better and cost fewer streams. Once one lane's
//! linger is over, every lane with records goes with it in the same pass: batches written
//! together share UDP datagrams and acks, which at low rates cost more than the records
//! themselves. Among the due lanes, [`DrainOrder`] picks by priority with a share for the
//! lower ones. Nothing is read while the session's window is full.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use shared::proto::edge::EdgeSession;

use crate::spool::Lane;
use crate::uplink::drain::DrainOrder;

/// A read the policy asks for: up to `max` records of `lane` after seq `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    pub lane: u8,
    pub after: u64,
    pub max: usize,
}

/// The send policy of one connection.
#[derive(Debug)]
pub struct SendPolicy {
    linger: Duration,
    batch_records: usize,
    order: DrainOrder,
    /// Per lane, the last committed seq known.
    heads: BTreeMap<u8, u64>,
    /// Per lane, since when records have waited to be sent.
    waiting_since: BTreeMap<u8, Instant>,
    /// In this pass, a lane's linger ran out: every lane with records goes.
    flushing: bool,
    /// When the earliest lingering lane is due, as the last [`SendPolicy::next`] found it.
    linger_until: Option<Instant>,
}

impl SendPolicy {
    pub fn new(linger: Duration, batch_records: usize, lower_lane_share: f64) -> Self {
        Self {
            linger,
            batch_records: batch_records.max(1),
            order: DrainOrder::new(lower_lane_share),
            heads: BTreeMap::new(),
            waiting_since: BTreeMap::new(),
            flushing: false,
            linger_until: None,
        }
    }

    /// The spool committed `lane` through `last`.
    pub fn set_head(&mut self, lane: u8, last: u64) {
        self.heads.insert(lane, last);
    }

    /// Starts a pass: the reads [`SendPolicy::next`] asks for until it says none, written
    /// together.
    pub fn begin(&mut self) {
        self.flushing = false;
        self.linger_until = None;
    }

    /// The next read of this pass, or `None` when nothing is due or the window is full (then
    /// [`SendPolicy::poll_timeout`] says when a lingering lane will be due).
    pub fn poll_read(&mut self, session: &EdgeSession, now: Instant) -> Option<Read> {
        self.linger_until = None;
        if !session.can_send() {
            return None;
        }
        let mut waiting = Vec::new();
        for (&lane, &last) in &self.heads {
            let next = session.next_seq(lane);
            if last < next {
                self.waiting_since.remove(&lane);
                continue;
            }
            let since = *self.waiting_since.entry(lane).or_insert(now);
            self.flushing |= now >= since + self.linger;
            waiting.push((Lane(lane), last - next + 1 >= self.batch_records as u64, since + self.linger));
        }
        let mut due = Vec::new();
        for (lane, full, until) in waiting {
            if full || self.flushing {
                due.push(lane);
            } else {
                self.linger_until = Some(self.linger_until.map_or(until, |t| t.min(until)));
            }
        }
        let lane = self.order.next(&due)?.0;
        self.waiting_since.remove(&lane);
        Some(Read { lane, after: session.next_seq(lane) - 1, max: self.batch_records })
    }

    /// The spool had nothing of `lane` after `after`: its head is there.
    pub fn handle_empty_read(&mut self, lane: u8, after: u64) {
        self.heads.insert(lane, after);
    }

    /// When a lingering lane is due, if one waits.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.linger_until
    }

    /// Whether a batch of `records` is full: it goes on a stream of its own, so a lost packet
    /// holds up only that batch when the link is busy; partial ones of a pass share one.
    pub fn is_full(&self, records: usize) -> bool {
        records >= self.batch_records
    }
}
