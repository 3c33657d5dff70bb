//! What the uplink sends next: which lane, from which seq, and when a partial batch stops
//! waiting to fill.
//!
//! A lane is due when a full batch waits (`batch_records`) or its first waiting record has
//! lingered `linger`: fuller batches compress better and cost fewer streams. A record lingers
//! from when the policy first knew of it (the head that took it in), not from when the batch
//! before it went: the rest of a backlog, known since the connection began, goes as soon as the
//! full batches before it, not a whole linger after them. Once one lane's
//! linger is over, every lane with records goes with it in the same pass: batches written
//! together share UDP datagrams and acks, which at low rates cost more than the records
//! themselves. Among the due lanes, [`DrainOrder`] picks by priority with a share for the
//! lower ones. Nothing is read while the session's window is full.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use shared::proto::edge::EdgeSession;

use crate::spool::Lane;
use crate::uplink::drain::DrainOrder;

/// Heads kept per lane to time its lingering records: one per spool commit seen, so at a high
/// rate the bound is reached within a linger, and then a batch fills before it is due anyway.
pub(crate) const MAX_KNOWN: usize = 64;

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
    /// Per lane, when its records became known: each entry a head and the time it was learnt,
    /// oldest first; the first waiting record has waited since the first entry at or past it.
    known: BTreeMap<u8, VecDeque<(u64, Instant)>>,
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
            known: BTreeMap::new(),
            flushing: false,
            linger_until: None,
        }
    }

    /// The spool committed `lane` through `last`, learnt at `now`.
    pub fn set_head(&mut self, lane: u8, last: u64, now: Instant) {
        self.heads.insert(lane, last);
        let known = self.known.entry(lane).or_default();
        match known.back() {
            Some(&(head, _)) if head == last => {}
            Some(&(head, _)) if head > last => {
                // Fewer records than known (deleted before they were read): those through
                // `last` were known since the earliest entry past it.
                let mut since = now;
                while let Some(&(head, at)) = known.back()
                    && head >= last
                {
                    since = at;
                    known.pop_back();
                }
                known.push_back((last, since));
            }
            // At the bound, the newest entry takes the new records in: they may go a little
            // before their linger is over, never after it.
            _ if known.len() >= MAX_KNOWN => known.back_mut().expect("a full queue").0 = last,
            _ => known.push_back((last, now)),
        }
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
            let known = self.known.entry(lane).or_default();
            while known.front().is_some_and(|&(head, _)| head < next) {
                known.pop_front();
            }
            if last < next {
                continue;
            }
            if known.is_empty() {
                known.push_back((last, now));
            }
            let since = known.front().expect("just filled").1;
            let full = last - next + 1 >= self.batch_records as u64;
            // Only a lane that waits to fill calls the others out: a backlog's full batches go
            // anyway, and their age is no reason to send other lanes' few records early.
            self.flushing |= !full && now >= since + self.linger;
            waiting.push((Lane(lane), full, since + self.linger));
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
        Some(Read { lane, after: session.next_seq(lane) - 1, max: self.batch_records })
    }

    /// The spool had nothing of `lane` after `after`: its head is there.
    pub fn handle_empty_read(&mut self, lane: u8, after: u64) {
        self.heads.insert(lane, after);
        // Everything through `after` was sent.
        self.known.remove(&lane);
    }

    /// Entries timing `lane`'s records (their bound is [`MAX_KNOWN`]).
    #[cfg(test)]
    pub(crate) fn known_len(&self, lane: u8) -> usize {
        self.known.get(&lane).map_or(0, VecDeque::len)
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
