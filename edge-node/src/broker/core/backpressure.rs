//! Publisher backpressure. A QoS 1 publisher is acknowledged as soon as its message is
//! queued, so a publisher faster than one of its subscribers fills that subscriber's queue
//! until the slow-subscriber policy drops messages or the subscriber (measured: an unthrottled
//! rumqttc publisher against one rumqttc subscriber, a queue of 10,000 full in a fraction of a
//! second). Instead, a publisher whose message went to a connected subscriber already
//! `backpressure_queue` messages behind is *held*: its glue reads nothing more from it (TCP's
//! window pushes back on the client) until that queue is half as long, or `backpressure_wait`
//! passed. Nothing is refused or dropped; the publisher goes at the pace its subscribers take.
//!
//! A publisher that cannot be held so without holding back its own subscriber's progress (it
//! has messages in flight to it, whose acknowledgements would wait behind its publishes) is
//! read on, but its own acknowledgements wait instead: its in-flight window stops it.
//!
//! A subscriber that does not drain within the wait is *stalled*: it holds no publisher again
//! until its queue is half as long, so a client that stops reading (or reads a trickle) costs
//! each of its publishers at most one wait per half-queue it drains, and meets the
//! slow-subscriber policy as before. Holds and stalls are counted.

use std::time::Instant;

use super::{Action, Broker, ConnId, SessionKey};

impl Broker {
    /// A message was just queued for `key`: remember it if the session is connected, behind by
    /// the bound and not stalled, for [`Broker::hold_publisher`].
    pub(super) fn note_queue(&mut self, key: SessionKey) {
        let limit = self.limits.backpressure_queue;
        if limit > 0
            && let Some(s) = self.session(key)
            && s.conn.is_some()
            && !s.stalled
            && s.queue.len() >= limit
        {
            self.congested = Some(key);
        }
    }

    /// `from` published the message just delivered: hold it if a queue it reached is behind.
    /// A publisher with messages in flight to it (a client subscribed to what it publishes,
    /// say) is read on, or its acknowledgements of them, which its queue needs to drain, would
    /// wait behind its publishes: its own acknowledgements are held instead, and its in-flight
    /// window (its Receive Maximum, ours for MQTT 3.1.1) stops it. The node's own clients are
    /// never held (nothing reads them).
    pub(super) fn hold_publisher(&mut self, from: Option<ConnId>, now: Instant) {
        let Some(key) = self.congested.take() else { return };
        let Some(conn) = from else { return };
        let until = now + self.limits.backpressure_wait;
        let Some(c) = self.conns.get(&conn).filter(|c| c.held.is_none()) else { return };
        let own = c.session;
        let Some(s) = self.session(own).filter(|s| !s.internal) else { return };
        let acks_only = own == key || !s.inflight.is_empty();
        let Some(c) = self.conns.get_mut(&conn) else { return };
        c.held = Some((until, key));
        c.acks_held = acks_only;
        if let Some(s) = self.session_mut(key) {
            s.holding.push(conn);
        }
        self.metrics.backpressure_holds.inc();
    }

    /// Until when the connection is read no further, if it is held so: its glue reads nothing
    /// until then, or until [`Action::Resume`]; then [`Broker::hold_expired`].
    pub fn held_until(&self, conn: ConnId) -> Option<Instant> {
        self.conns.get(&conn).filter(|c| !c.acks_held).and_then(|c| c.held).map(|(until, _)| until)
    }

    /// When the connection's hold runs out, however it is held: its glue calls
    /// [`Broker::hold_expired`] then.
    pub fn hold_deadline(&self, conn: ConnId) -> Option<Instant> {
        self.conns.get(&conn).and_then(|c| c.held).map(|(until, _)| until)
    }

    /// The connection's hold ran out by `now`: it is read (and acknowledged) again, and the
    /// subscriber that held it, not drained in time, is stalled.
    pub fn hold_expired(&mut self, conn: ConnId, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        let Some((_, key)) = c.held.filter(|(until, _)| *until <= now) else { return };
        self.unhold(conn, now);
        if let Some(s) = self.session_mut(key) {
            s.holding.retain(|h| *h != conn);
            if !s.stalled {
                s.stalled = true;
                self.metrics.backpressure_stalls.inc();
            }
        }
    }

    /// Ends the connection's hold: read again, or its acknowledgements go.
    fn unhold(&mut self, conn: ConnId, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        c.held = None;
        if std::mem::take(&mut c.acks_held) {
            self.flush_acks(conn, now);
        } else {
            self.actions.push_back(Action::Resume(conn));
        }
    }

    /// Messages left `key`'s queue (sent, expired, or the session lost its connection): once it
    /// is half the bound, its publishers resume and it may hold them again.
    pub(super) fn drained(&mut self, key: SessionKey, now: Instant) {
        let half = self.limits.backpressure_queue / 2;
        let Some(s) = self.session_mut(key) else { return };
        if s.holding.is_empty() && !s.stalled {
            return;
        }
        if s.conn.is_some() && s.queue.len() > half {
            return;
        }
        s.stalled = false;
        for conn in std::mem::take(&mut s.holding) {
            if self.conns.get(&conn).is_some_and(|c| c.held.is_some_and(|(_, by)| by == key)) {
                self.unhold(conn, now);
            }
        }
    }
}
