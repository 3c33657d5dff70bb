//! What the core asks the session store to keep, the waits that keep its acknowledgements
//! true across a crash, and what it takes back after a restart.
//!
//! A session is *durable* when it outlives its connection (expiry above 0) and is a client's,
//! not the node's own. For every change to a durable session's state (its record, a queued or
//! in-flight message, a QoS 2 packet id received, a pending delayed will) and to the retained
//! store, the core hands the glue a numbered [`StoreOp`] ([`Action::Store`]). The glue writes
//! them in order, in group commits on the store's own thread, and tells the core how far it
//! committed ([`Broker::stored`]). An acknowledgement that promises something a restart must
//! see waits for that:
//! - a publisher's PUBACK or PUBREC, for the queue entries its message made in durable sessions,
//!   the retained message it set and (QoS 2) its packet id: so nothing acknowledged is lost by
//!   a crash (a SIGKILL, a watchdog restart);
//! - a PUBCOMP, for its packet id's release: else a restored id would take the client's next
//!   message of that id for a resend;
//! - a PUBREL to a subscriber, for its message's release;
//! - a SUBACK or UNSUBACK of a durable session, for its record: a session present after a crash
//!   holds every subscription acknowledged and none whose removal was;
//! - a QoS 2 PUBLISH to a durable session, for its packet id: a resend after a crash must carry
//!   the same id, or a client that delivers on PUBLISH would deliver it twice.
//!
//! QoS 1 deliveries go out at once: if the node dies before their entry commits, their publisher
//! had no PUBACK and sends again (at least once, as QoS 1 allows). A QoS 0 delivery is never
//! stored (§4.1 leaves them optional for offline sessions). The store commits with
//! `synchronous=NORMAL`: a crash of the process loses nothing committed, a power cut may lose
//! the last commits (as the spool's `normal` class).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::session::{AckSlot, Delivery, Inflight, PendingWill, Sid};
use super::{Action, Broker, ConnId, SessionKey, SessionRecord, SpoolRequest};
use crate::broker::codec::{Outbound, QoS};
use crate::broker::message::Message;

/// One change for the session store, in the order the core made it.
#[derive(Debug, Clone)]
pub enum StoreOp {
    /// A durable session's record: made, or its subscriptions, expiry or disconnect time changed.
    Session(SessionRecord),
    /// The session ended or stopped being durable: everything stored under it goes. `msgs` are
    /// the messages of its stored deliveries, whose references go with them (the store knows its
    /// will's itself).
    Forget { sid: Sid, msgs: Vec<Arc<Message>> },
    /// A QoS 1 or 2 message queued for a durable session.
    Queue(StoredDelivery),
    /// The message went out with this packet id: a resend after a restart carries it, with DUP.
    Sent { sid: Sid, ord: u64, pkid: u16 },
    /// Its PUBREC came: PUBREL is what goes again.
    Released { sid: Sid, ord: u64 },
    /// Acknowledged, expired or dropped.
    Done { sid: Sid, ord: u64, msg: Arc<Message> },
    /// A QoS 2 packet id received from the session's client and not yet released, with the
    /// receipt its message goes to the spool under (0: none).
    Received { sid: Sid, pkid: u16, receipt: u64 },
    /// Its PUBREL came.
    Settled { sid: Sid, pkid: u16 },
    /// The pending delayed will, or none.
    Will { sid: Sid, will: Option<StoredWill> },
    /// The topic's retained message, or none.
    Retain { topic: Arc<str>, msg: Option<Arc<Message>> },
    /// A value another part of the node keeps in the same commits as the messages it hands
    /// the broker (the downlink's position, `core::downlink`): written with them or not at all.
    Mark { key: &'static str, value: String },
}

/// A message on its way to a durable session, as stored.
#[derive(Debug, Clone)]
pub struct StoredDelivery {
    pub sid: Sid,
    /// Its place in the session's queue: resent and sent in this order.
    pub ord: u64,
    pub msg: Arc<Message>,
    pub qos: QoS,
    pub retain: bool,
    pub sub_ids: Vec<u32>,
    /// Sent with this packet id (and so resent with DUP).
    pub pkid: Option<u16>,
    /// QoS 2 after its PUBREC.
    pub released: bool,
    /// From a subscribe's retained backlog: not counted against the queue's bounds.
    pub backlog: bool,
}

/// A delayed will waiting for its time.
#[derive(Debug, Clone)]
pub struct StoredWill {
    pub msg: Arc<Message>,
    /// Its Message Expiry Interval, seconds, counted from publication.
    pub expiry: Option<u32>,
    /// When it is due, wall clock ms.
    pub due_ms: u64,
}

/// Everything the store held at start, for [`Broker::restore`].
#[derive(Debug, Default)]
pub struct StoredState {
    pub sessions: Vec<SessionRecord>,
    /// In `(sid, ord)` order.
    pub deliveries: Vec<StoredDelivery>,
    /// (session, packet id, receipt).
    pub received: Vec<(Sid, u16, u64)>,
    pub wills: Vec<(Sid, StoredWill)>,
    pub retained: Vec<Arc<Message>>,
    /// The marks ([`StoreOp::Mark`]) by key.
    pub marks: BTreeMap<String, String>,
    /// The last run did not close the store (a crash, a kill, a power cut): a queued message
    /// may have gone out before the record of its sending was committed, so each is resent
    /// with DUP ([MQTT-3.3.1-1]: it might be a re-delivery).
    pub unclean: bool,
}

impl Broker {
    /// The session's store id if its state goes to the store.
    pub(super) fn durable_sid(&self, key: SessionKey) -> Option<Sid> {
        self.session(key).filter(|s| s.expiry != 0 && !s.internal).map(|s| s.sid)
    }

    /// Hands `op` to the glue; returns its number.
    pub(super) fn store(&mut self, op: StoreOp) -> u64 {
        self.last_op += 1;
        self.actions.push_back(Action::Store { op_id: self.last_op, op });
        self.last_op
    }

    /// The number of the last op handed out.
    #[cfg(test)]
    pub(crate) fn last_op(&self) -> u64 {
        self.last_op
    }

    /// The op the store reported committed through.
    #[cfg(test)]
    pub(crate) fn durable_through(&self) -> u64 {
        self.durable
    }

    /// The store committed every op through `op_id`: what waited for it goes.
    pub fn stored(&mut self, op_id: u64, now: Instant) {
        if op_id <= self.durable {
            return;
        }
        self.durable = op_id;
        while self.spool_gated.front().is_some_and(|(op, _)| *op <= op_id) {
            if let Some((_, req)) = self.spool_gated.pop_front() {
                self.actions.push_back(Action::Spool(req));
            }
        }
        let released: Vec<u64> =
            self.receipts_released.iter().filter(|(op, _)| *op <= op_id).map(|(_, r)| *r).collect();
        if !released.is_empty() {
            self.receipts_released.retain(|(op, _)| *op > op_id);
            self.actions.push_back(Action::ForgetReceipts(released));
        }
        while let Some(&(g, conn)) = self.store_waiters.first() {
            if g > op_id {
                break;
            }
            self.store_waiters.pop_first();
            self.flush_acks(conn, now);
            self.wake(conn);
        }
    }

    /// Wakes `conn` once the store committed `op_id`.
    pub(super) fn wait_store(&mut self, conn: ConnId, op_id: u64) {
        self.store_waiters.insert((op_id, conn));
    }

    /// Queues `packet` among the connection's acknowledgements, to go once the store committed
    /// every op made since `since` (at once if there were none).
    pub(super) fn ack_after_store(&mut self, conn: ConnId, packet: Outbound, since: u64, now: Instant) {
        let op_id = if self.last_op > since { self.last_op } else { 0 };
        self.ack_when_stored(conn, packet, op_id, now);
    }

    /// Queues `packet` among the connection's acknowledgements, to go once the store committed
    /// op `op_id` (0: nothing to wait for).
    pub(super) fn ack_when_stored(&mut self, conn: ConnId, packet: Outbound, op_id: u64, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if op_id > self.durable {
            c.acks.push_back(AckSlot::Stored { op_id, packet });
            self.wait_store(conn, op_id);
        } else {
            c.acks.push_back(AckSlot::Ready(packet));
        }
        self.flush_acks(conn, now);
    }

    /// Sends control packet `packet` at once, or, when it promises store op `op_id` not yet
    /// committed, among the acknowledgements once that op is.
    pub(super) fn control_when_stored(&mut self, conn: ConnId, packet: Outbound, op_id: u64, now: Instant) {
        if op_id > self.durable {
            self.ack_when_stored(conn, packet, op_id, now);
        } else {
            self.control(conn, packet, now);
        }
    }

    /// Stores the delivery just pushed to the back of a durable session's queue (or retained
    /// backlog), if it is one to keep: QoS 1 or 2 and not stored yet (a queued one not stored
    /// has `ord` 0 only until here, so a back of the queue that was not just pushed is passed).
    pub(super) fn store_pushed(&mut self, key: SessionKey, backlog: bool) {
        let Some(sid) = self.durable_sid(key) else { return };
        let Some(s) = self.session_mut(key) else { return };
        let ord = s.next_ord + 1;
        let back = if backlog { s.retained_backlog.back_mut() } else { s.queue.back_mut() };
        let Some(d) = back.filter(|d| d.qos != QoS::AtMostOnce && d.ord == 0) else { return };
        d.ord = ord;
        let op = StoreOp::Queue(StoredDelivery {
            sid,
            ord: d.ord,
            msg: d.msg.clone(),
            qos: d.qos,
            retain: d.retain,
            sub_ids: d.sub_ids.clone(),
            pkid: None,
            released: false,
            backlog,
        });
        s.next_ord = ord;
        self.store(op);
    }

    /// A stored delivery left the session (acknowledged, expired, dropped).
    pub(super) fn store_done(&mut self, key: SessionKey, d: &Delivery) {
        if d.ord != 0
            && let Some(sid) = self.durable_sid(key)
        {
            self.store(StoreOp::Done { sid, ord: d.ord, msg: d.msg.clone() });
        }
    }

    /// Forgets what the store holds of a session that ends or stops being durable.
    pub(super) fn store_forget(&mut self, key: SessionKey) {
        let Some(s) = self.session_mut(key) else { return };
        if !std::mem::take(&mut s.persisted) {
            return;
        }
        let receipts: Vec<u64> = s.qos2_in.values().map(|q| q.receipt).filter(|r| *r != 0).collect();
        let msgs: Vec<Arc<Message>> = s
            .queue
            .iter()
            .chain(&s.retained_backlog)
            .chain(s.inflight.iter().map(|i| &i.delivery))
            .filter(|d| d.ord != 0)
            .map(|d| d.msg.clone())
            .collect();
        for d in s.queue.iter_mut().chain(&mut s.retained_backlog) {
            d.ord = 0;
        }
        for i in &mut s.inflight {
            i.delivery.ord = 0;
        }
        let sid = s.sid;
        let op = self.store(StoreOp::Forget { sid, msgs });
        for receipt in receipts {
            self.release_receipt(receipt, op);
        }
    }

    /// The spool may forget `receipt` once op `op` (its release) is committed: before, a crash
    /// could bring the receipt back to a spool that no longer knows its message.
    pub(super) fn release_receipt(&mut self, receipt: u64, op: u64) {
        if receipt == 0 {
            return;
        }
        if op <= self.durable {
            self.actions.push_back(Action::ForgetReceipts(vec![receipt]));
        } else {
            self.receipts_released.push((op, receipt));
        }
    }

    /// Appends `req` to the spool once op `op` (its QoS 2 receipt) is committed: the spool
    /// must never hold a message under a receipt a crash could lose.
    pub(super) fn spool_after(&mut self, op: u64, req: SpoolRequest) {
        if op <= self.durable {
            self.actions.push_back(Action::Spool(Box::new(req)));
        } else {
            self.spool_gated.push_back((op, Box::new(req)));
        }
    }

    /// The pending will of a durable session changed.
    pub(super) fn store_will(&mut self, key: SessionKey, now: Instant) {
        let Some(sid) = self.durable_sid(key) else { return };
        let wall = self.wall_ms(now);
        let Some(s) = self.session(key) else { return };
        let will = s.pending_will.as_ref().map(|w| StoredWill {
            msg: w.msg.clone(),
            expiry: w.expiry,
            due_ms: wall + w.due.saturating_duration_since(now).as_millis() as u64,
        });
        self.store(StoreOp::Will { sid, will });
    }

    /// What the store held at start: sessions offline until their clients come back, with their
    /// queues, messages in flight (resent with their packet ids), QoS 2 ids received and
    /// delayed wills; and the retained messages. A session whose expiry passed while the node
    /// was down ends (its will goes, if it had one); a message whose expiry passed is dropped,
    /// unless it was in flight (a resend goes whatever its expiry, as before the restart).
    pub fn restore(&mut self, state: StoredState, now: Instant) {
        let wall = self.wall_ms(now);
        let unclean = state.unclean;
        for msg in state.retained {
            if msg.expired(now) {
                self.store(StoreOp::Retain { topic: msg.topic.clone(), msg: None });
            } else if self.retained.store(&msg, true).is_err() {
                // A lowered bound: the rest is not kept, and the store forgets it too.
                self.metrics.refused("retained_full");
                self.store(StoreOp::Retain { topic: msg.topic.clone(), msg: None });
            }
        }
        self.metrics.retained(self.retained.len(), self.retained.bytes());
        let mut deliveries = state.deliveries.into_iter().peekable();
        let mut received = state.received;
        received.sort_unstable();
        // Receipts go on from the highest held: every other the spool holds is forgotten
        // before this run takes messages (`Spool::keep_receipts`).
        self.next_receipt = self.next_receipt.max(received.iter().map(|&(.., r)| r).max().unwrap_or(0));
        let mut wills: BTreeMap<Sid, StoredWill> = state.wills.into_iter().collect();
        for r in state.sessions {
            let sid = r.sid;
            self.next_sid = self.next_sid.max(sid);
            // Deliveries and ids of sessions before this one that were not restored: dropped.
            while deliveries.peek().is_some_and(|d| d.sid < sid) {
                deliveries.next();
            }
            let mine: Vec<StoredDelivery> = std::iter::from_fn(|| deliveries.next_if(|d| d.sid == sid)).collect();
            let away = r.disconnected_ms.map_or(0, |ms| wall.saturating_sub(ms) / 1000);
            let expiry = r.expiry.min(self.limits.max_session_expiry);
            let will = wills.remove(&sid);
            // This session's ids: a run of the sorted list.
            let first = received.partition_point(|(s, ..)| *s < sid);
            let end = received.partition_point(|(s, ..)| *s <= sid);
            let mine_received = &received[first..end];
            // A client's session under one of the node's own client ids (stored before they
            // were reserved) would keep the node's client from its id: it ends here.
            let squatted = r.client_id.starts_with(super::INTERNAL_CLIENT_ID_PREFIX);
            if expiry != u32::MAX && away >= u64::from(expiry)
                || self.by_client.contains_key(r.client_id.as_str())
                || squatted
            {
                let msgs: Vec<Arc<Message>> = mine.into_iter().map(|d| d.msg).collect();
                if let Some(w) = will {
                    // It was due by the end of its session at the latest.
                    self.publish_will(PendingWill { msg: w.msg, expiry: w.expiry, rules: None, due: now }, now);
                }
                self.store(StoreOp::Forget { sid, msgs });
                continue;
            }
            let key = self.new_session(r.client_id.into(), r.owner.into(), false, expiry);
            for (filter, opts) in r.subscriptions {
                if let Some(f) = super::router::Filter::parse(&filter) {
                    self.router.subscribe(f, key, opts);
                }
                if let Some(s) = self.session_mut(key) {
                    s.subs.insert(filter, opts);
                }
            }
            let mut held = 0;
            let mut expired = Vec::new();
            if let Some(s) = self.session_mut(key) {
                s.sid = sid;
                s.persisted = true;
                s.disconnected_at = Some(now);
                s.disconnected_ms = r.disconnected_ms.or(Some(wall));
                // The expiry counts from the disconnect, across the restart.
                s.expiry = expiry;
                s.qos2_in.extend(
                    mine_received
                        .iter()
                        .map(|&(_, pkid, receipt)| (pkid, super::session::Qos2In { receipt, ..Default::default() })),
                );
                for d in mine {
                    s.next_ord = s.next_ord.max(d.ord);
                    let delivery = Delivery {
                        msg: d.msg,
                        qos: d.qos,
                        retain: d.retain,
                        sub_ids: d.sub_ids,
                        pkid: d.pkid,
                        dup: d.pkid.is_some() || (unclean && d.qos != QoS::AtMostOnce),
                        ord: d.ord,
                        hold: 0,
                    };
                    if d.pkid.is_none() && delivery.msg.expired(now) {
                        expired.push(delivery);
                    } else if d.pkid.is_some() {
                        let weight = if d.backlog { 0 } else { delivery.weight() };
                        held += weight;
                        s.inflight.push_back(Inflight {
                            pkid: d.pkid.unwrap_or_default(),
                            delivery,
                            released: d.released,
                            held: !d.backlog,
                        });
                    } else if d.backlog {
                        s.retained_backlog.push_back(delivery);
                    } else {
                        held += delivery.weight();
                        s.queue.push_back(delivery);
                    }
                }
                s.held_bytes += held;
            }
            self.held_total += held;
            if !expired.is_empty() {
                self.metrics.dropped("expired", expired.len() as u64);
            }
            for d in &expired {
                self.store_done(key, d);
            }
            let left = u64::from(expiry).saturating_sub(away);
            if expiry != u32::MAX {
                self.schedule_expiry(key, now + Duration::from_secs(left));
            }
            if let Some(w) = will {
                let due = now + Duration::from_millis(w.due_ms.saturating_sub(wall));
                if let Some(s) = self.session_mut(key) {
                    s.pending_will = Some(PendingWill { msg: w.msg, expiry: w.expiry, rules: None, due });
                }
                self.wills.insert((due, key));
            }
        }
        // Wills of sessions not stored any more: nothing to publish them for.
        for (sid, _) in wills {
            self.store(StoreOp::Forget { sid, msgs: Vec::new() });
        }
        self.metrics.subscriptions.set(self.router.len() as i64);
    }
}
