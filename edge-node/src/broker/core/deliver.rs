//! What happens to a message once it is in: its topic class decides the spool and local
//! delivery; local delivery goes through the router to each subscriber's queue, and from the
//! queue to the wire as room in flight allows.

use std::sync::Arc;
use std::time::Instant;

use super::durable::StoreOp;
use super::router::Match;
use super::session::{AckSlot, Delivery, Inflight};
use super::{Action, Broker, ConnId, PendingSpool, SessionKey, SlowSubscriber, SpoolRequest, Spooled};
use crate::broker::codec::{Outbound, QoS, Version, reason};
use crate::broker::message::Message;
use crate::route::{Class, Route};
use crate::spool::Durability;

/// What `poll_transmit` gives a connection's writer.
#[derive(Debug, Default)]
pub struct Transmit {
    pub packets: Vec<Outbound>,
    /// The connection is closing: close the socket once `packets` are written.
    pub closing: bool,
    /// The byte budget ran out with messages still ready: ask again.
    pub more: bool,
}

impl Broker {
    /// Routes a message that entered: the spool for `central` and `both` classes, local
    /// subscribers unless `central`. `ack` is the publisher's (QoS, packet id) to answer once
    /// the message is where it must be: in the spool, and in the session store with every op
    /// made since `since` (its queue entries in durable sessions, its retained copy, its QoS 2
    /// id). `Err(code)`: refused before anything happened, for an MQTT 5 acknowledgement.
    /// `client` is a client's publish (whether the client is the node's own), counted by class;
    /// `None` for a will.
    pub(super) fn ingest(
        &mut self,
        from: Option<ConnId>,
        client: Option<bool>,
        msg: Arc<Message>,
        ack: Option<(QoS, u16)>,
        since: u64,
        now: Instant,
    ) -> Result<(), u8> {
        let classes = self.classes.clone();
        let at = classes.classify_at(&msg.topic);
        let class = at.map(|(_, c)| c);
        if let Some(class) = class {
            class.count(2 + msg.topic.len() + msg.payload.len());
        }
        if let Some(internal) = client {
            self.metrics.published(internal, at.map(|(i, _)| i));
        }
        let route = class.map_or(Route::EdgeDirect, Class::route);
        let local = route != Route::Central;
        let mut retain = msg.retain && local;
        if retain && !msg.payload.is_empty() && !self.is_internal(from) && !self.retained.has_room(&msg) {
            self.metrics.refused("retained_full");
            let v5 = from.and_then(|c| self.conns.get(&c)).is_some_and(|c| c.version == Version::V5);
            if v5 && ack.is_some() {
                return Err(reason::QUOTA_EXCEEDED);
            }
            // No way to say so to an MQTT 3.1.1 client or at QoS 0: delivered, not retained.
            retain = false;
        }
        let to_cloud = class.filter(|_| matches!(route, Route::Central | Route::Both));
        if to_cloud.is_some()
            && let Some(misfit) = self.sink.as_ref().and_then(|s| sink_misfit(s, &msg))
        {
            return Err(self.refuse_for_sink(from, &msg, ack.is_some(), misfit, now));
        }
        match to_cloud {
            Some(class) => {
                let ticket = self.next_ticket();
                let hold = local && class.durability == Durability::Full;
                let mut qos2 = None;
                // A QoS 2 receipt the store keeps: (its op, the receipt).
                let mut receipt = None;
                if let (Some(conn), Some((qos, pkid))) = (from, ack)
                    && let Some(c) = self.conns.get_mut(&conn)
                {
                    c.acks.push_back(AckSlot::Waiting { ticket, qos, pkid, stored: 0 });
                    if qos == QoS::ExactlyOnce {
                        let key = c.session;
                        if let Some(q) = self.session_mut(key).and_then(|s| s.qos2_in.get_mut(&pkid)) {
                            q.ticket = Some(ticket);
                            qos2 = Some((key, pkid));
                            receipt = (q.receipt != 0).then_some((q.stored, q.receipt));
                        }
                    }
                }
                let pending = PendingSpool {
                    conns: from.into_iter().collect(),
                    qos2,
                    deliver: hold.then(|| msg.clone()),
                    retain,
                };
                self.pending.insert(ticket, pending);
                let mut message = spool_message(&msg, class, now, self.wall_ms(now));
                let (lane, durability) = (class.lane, class.durability);
                match receipt {
                    // The spool takes it once its receipt is committed, under the receipt: a
                    // crash then never leaves the message spooled with no receipt to tell its
                    // resend by, nor a receipt whose message the spool could lose.
                    Some((op, receipt)) => {
                        message.properties.receipt = Some(receipt);
                        self.spool_after(op, SpoolRequest { ticket, lane, durability, message });
                    }
                    None => self.actions.push_back(Action::Spool(Box::new(SpoolRequest {
                        ticket,
                        lane,
                        durability,
                        message,
                    }))),
                }
                if local && !hold {
                    self.accept_local(from, &msg, retain, now);
                }
                // The spool's answer releases the ack; the store's commit, too, if this made ops.
                let op_id = self.last_op;
                if op_id > since
                    && let Some(c) = from.and_then(|c| self.conns.get_mut(&c))
                    && let Some(AckSlot::Waiting { stored, .. }) = c
                        .acks
                        .iter_mut()
                        .rev()
                        .find(|s| matches!(s, AckSlot::Waiting { ticket: t, .. } if *t == ticket))
                {
                    *stored = op_id;
                }
            }
            None => {
                if local {
                    self.accept_local(from, &msg, retain, now);
                }
                if let (Some(conn), Some((qos, pkid))) = (from, ack) {
                    self.ack_after_store(conn, ack_packet(qos, pkid, reason::SUCCESS), since, now);
                }
            }
        }
        Ok(())
    }

    /// A cloud-bound message the cloud's sink could not store whole: never acknowledged. MQTT 5
    /// hears 0x83 (the PUBLISH is valid, the server will not take it); MQTT 3.1.1 has no way to
    /// refuse but closing (its client publishes again, and the counter says why); at QoS 0 and
    /// for a will it is dropped. Returns the reason code.
    fn refuse_for_sink(
        &mut self,
        from: Option<ConnId>,
        msg: &Message,
        acked: bool,
        misfit: crate::spool::Misfit,
        now: Instant,
    ) -> u8 {
        self.metrics.refused("too_large_for_sink");
        tracing::info!(topic = ?msg.topic, %misfit, "publish refused: the cloud's sink could not store it whole");
        if let Some(conn) = from.filter(|_| acked)
            && self.conns.get(&conn).is_some_and(|c| c.version == Version::V311)
        {
            self.metrics.disconnect("too_large_for_sink");
            self.close(conn, None, now);
        }
        reason::IMPLEMENTATION_SPECIFIC
    }

    /// The glue's answer for a spool append: a message held for it is delivered locally now,
    /// and its publisher's acknowledgement goes (in publish order).
    pub fn spooled(&mut self, ticket: u64, outcome: Spooled, now: Instant) {
        let Some(p) = self.pending.remove(&ticket) else { return };
        let since = self.last_op;
        if let (Spooled::Accepted, Some(msg)) = (outcome, &p.deliver) {
            let from = p.conns.first().copied();
            let retain = p.retain && (msg.payload.is_empty() || self.is_internal(from) || self.retained.has_room(msg));
            self.accept_local(from, msg, retain, now);
        }
        let stored = if self.last_op > since { self.last_op } else { 0 };
        // A QoS 2 packet id stays received only if the message is in: any other outcome ends
        // the exchange, and the client's resend is a new message, not one taken.
        if let Some((key, pkid)) = p.qos2
            && let Some(s) = self.session_mut(key)
            && let Some(q) = s.qos2_in.get_mut(&pkid).filter(|q| q.ticket == Some(ticket))
        {
            if outcome == Spooled::Accepted {
                q.ticket = None;
                q.stored = q.stored.max(stored);
            } else {
                // A stored id goes from the store as its PUBREL would take it, its receipt
                // from the spool.
                self.settle_qos2(key, pkid);
            }
        }
        let code = match outcome {
            Spooled::Accepted => reason::SUCCESS,
            Spooled::Refused => reason::QUOTA_EXCEEDED,
            Spooled::Failed => reason::UNSPECIFIED,
        };
        for conn in p.conns {
            self.answer_spooled(conn, ticket, code, stored, now);
        }
    }

    /// Answers the connection's publishes that waited for `ticket`; a success goes once the
    /// store committed op `stored` too.
    fn answer_spooled(&mut self, conn: ConnId, ticket: u64, code: u8, stored: u64, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if code != reason::SUCCESS && c.version == Version::V311 {
            // MQTT 3.1.1 has no way to refuse a publish but closing: no acknowledgement, and
            // the client publishes again.
            self.metrics.disconnect("spool_refused");
            self.close(conn, None, now);
            return;
        }
        let durable = self.durable;
        let mut wait = None;
        for slot in c.acks.iter_mut() {
            if let AckSlot::Waiting { ticket: t, qos, pkid, stored: s } = *slot
                && t == ticket
            {
                let packet = ack_packet(qos, pkid, code);
                let op_id = s.max(stored);
                *slot = if code == reason::SUCCESS && op_id > durable {
                    wait = Some(op_id);
                    AckSlot::Stored { op_id, packet }
                } else {
                    AckSlot::Ready(packet)
                };
                // A failed PUBREC ends the exchange: no PUBREL will settle it.
                if code >= 0x80 && qos == QoS::ExactlyOnce {
                    c.unacked_in = c.unacked_in.saturating_sub(1);
                }
            }
        }
        if let Some(op_id) = wait {
            self.wait_store(conn, op_id);
        }
        self.flush_acks(conn, now);
    }

    /// Queues the publisher's acknowledgement behind those still waiting.
    pub(super) fn ack_ready(&mut self, conn: ConnId, qos: QoS, pkid: u16, code: u8, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        c.acks.push_back(AckSlot::Ready(ack_packet(qos, pkid, code)));
        self.flush_acks(conn, now);
    }

    /// Moves the acknowledgements at the front that are ready (or whose store op committed) to
    /// the connection's packets.
    pub(super) fn flush_acks(&mut self, conn: ConnId, now: Instant) {
        // One at a time rather than collected first: this runs for every QoS 1 publish, and a
        // Vec per call showed in the allocator's share of a profile.
        let durable = self.durable;
        loop {
            let Some(c) = self.conns.get_mut(&conn) else { return };
            if c.acks_held {
                return;
            }
            let ready = match c.acks.front() {
                Some(AckSlot::Ready(_)) => true,
                Some(AckSlot::Stored { op_id, .. }) => *op_id <= durable,
                _ => false,
            };
            if !ready {
                return;
            }
            let packet = match c.acks.pop_front() {
                Some(AckSlot::Ready(packet) | AckSlot::Stored { packet, .. }) => packet,
                _ => return,
            };
            if matches!(packet, Outbound::PubAck { .. }) {
                c.unacked_in = c.unacked_in.saturating_sub(1);
            }
            self.control(conn, packet, now);
        }
    }

    /// Whether a message comes from one of the node's own clients (wills have no connection
    /// and are their client's).
    fn is_internal(&self, from: Option<ConnId>) -> bool {
        from.and_then(|c| self.conns.get(&c)).and_then(|c| self.session(c.session)).is_some_and(|s| s.internal)
    }

    /// Local delivery: the retained store, then every matching subscriber.
    pub(super) fn accept_local(&mut self, from: Option<ConnId>, msg: &Arc<Message>, retain: bool, now: Instant) {
        self.accept_local_after(from, msg, retain, 0, now);
    }

    /// [`Broker::accept_local`], the deliveries going out only once the store committed op
    /// `hold` (0: at once).
    pub(super) fn accept_local_after(
        &mut self,
        from: Option<ConnId>,
        msg: &Arc<Message>,
        retain: bool,
        hold: u64,
        now: Instant,
    ) {
        if retain {
            // Room was checked when the message came in.
            if self.retained.store(msg, !self.is_internal(from)).is_ok() {
                let kept = (!msg.payload.is_empty()).then(|| msg.clone());
                self.store(StoreOp::Retain { topic: msg.topic.clone(), msg: kept });
            }
            self.metrics.retained(self.retained.len(), self.retained.bytes());
        }
        self.congested = None;
        self.deliver(msg, hold, now);
        self.hold_publisher(from, now);
    }

    /// Sends `msg` to every session a subscription of which matches it: one copy per session
    /// for its ordinary subscriptions, at the highest QoS granted among them and with all their
    /// subscription identifiers ([MQTT-3.3.4-2], [MQTT-3.3.4-4]); one copy per shared group.
    fn deliver(&mut self, msg: &Arc<Message>, hold: u64, now: Instant) {
        let internal_only = self.limits.internal_topics.iter().any(|t| **t == *msg.topic);
        let mut matches = std::mem::take(&mut self.matches);
        matches.clear();
        {
            let sessions = &self.sessions;
            let online =
                |k: SessionKey| sessions.get(k as usize).and_then(Option::as_ref).is_some_and(|s| s.conn.is_some());
            self.router.matches(&msg.topic, &online, &mut matches);
        }
        matches.sort_by_key(|m| (m.shared, m.session));
        let mut i = 0;
        while i < matches.len() {
            let first = matches[i];
            let mut end = i + 1;
            if !first.shared {
                while end < matches.len() && !matches[end].shared && matches[end].session == first.session {
                    end += 1;
                }
            }
            let group = &matches[i..end];
            i = end;
            if let Some(d) = self.delivery_for(first.session, group, msg, internal_only) {
                self.enqueue(first.session, Delivery { hold, ..d }, now);
            }
        }
        self.matches = matches;
    }

    /// The one delivery a session gets for the subscriptions of it that matched.
    fn delivery_for(
        &self,
        key: SessionKey,
        group: &[Match],
        msg: &Arc<Message>,
        internal_only: bool,
    ) -> Option<Delivery> {
        let s = self.session(key)?;
        if internal_only && !s.internal {
            return None;
        }
        let own = msg.origin.as_deref() == Some(&*s.client_id);
        let mut granted: Option<QoS> = None;
        let mut retain = false;
        let mut sub_ids = Vec::new();
        // [MQTT-3.8.3-3]: No Local keeps a client's own messages from its subscription.
        for m in group.iter().filter(|m| !(m.opts.no_local && own)) {
            granted = Some(granted.map_or(m.opts.qos, |g| g.max(m.opts.qos)));
            // [MQTT-3.3.1-12], [MQTT-3.3.1-13]: Retain As Published keeps the flag.
            retain |= m.opts.retain_as_published && msg.retain;
            sub_ids.extend(m.opts.id);
        }
        // [MQTT-3.8.4-8] (MQTT 3.1.1 [MQTT-3.8.4-6]): min(published, granted).
        let qos = granted?.min(msg.qos);
        Some(Delivery::new(msg.clone(), qos, retain, sub_ids))
    }

    /// Puts a delivery in a session's queue under the queue's bounds and the slow-subscriber
    /// policy.
    pub(super) fn enqueue(&mut self, key: SessionKey, d: Delivery, now: Instant) {
        let (max_messages, policy) = (self.limits.max_queued_messages, self.limits.slow_subscriber);
        let weight = d.weight();
        // The total bound leaves this session what the others do not hold.
        let others = self.held_total - self.session(key).map_or(0, |s| s.held_bytes);
        let max_bytes = self.limits.max_queued_bytes.min(self.limits.max_queued_bytes_total.saturating_sub(others));
        let before = self.session(key).map_or(0, |s| s.held_bytes);
        self.enqueue_bounded(key, d, weight, max_messages, max_bytes, policy, now);
        let after = self.session(key).map_or(before, |s| s.held_bytes);
        self.held_total = (self.held_total + after).saturating_sub(before);
        self.store_pushed(key, false);
    }

    #[allow(clippy::too_many_arguments)]
    fn enqueue_bounded(
        &mut self,
        key: SessionKey,
        d: Delivery,
        weight: usize,
        max_messages: usize,
        max_bytes: usize,
        policy: SlowSubscriber,
        now: Instant,
    ) {
        let Some(s) = self.session_mut(key) else { return };
        let Some(conn) = s.conn else {
            // An offline session keeps QoS 1 and 2 messages only (§4.1: QoS 0 is optional).
            if d.qos == QoS::AtMostOnce {
                return;
            }
            if s.has_room(weight, max_messages, max_bytes) {
                s.push(d);
            } else {
                self.metrics.dropped("offline_queue_full", 1);
            }
            return;
        };
        if s.has_room(weight, max_messages, max_bytes) {
            s.push(d);
            self.wake(conn);
            self.note_queue(key);
            return;
        }
        match policy {
            SlowSubscriber::DropNewest => self.metrics.dropped("queue_full", 1),
            SlowSubscriber::DropQos0ThenDisconnect => {
                let mut freed = 0;
                while !s.has_room(weight, max_messages, max_bytes) && s.drop_oldest_qos0().is_some() {
                    freed += 1;
                }
                let room = s.has_room(weight, max_messages, max_bytes);
                let qos0 = d.qos == QoS::AtMostOnce;
                if room {
                    s.push(d);
                }
                self.metrics.dropped("queue_full_qos0", freed + u64::from(!room && qos0));
                if room {
                    self.wake(conn);
                    self.note_queue(key);
                } else if !qos0 {
                    self.metrics.dropped("queue_full", 1);
                    self.metrics.disconnect("slow_subscriber");
                    tracing::warn!(conn = conn.0, "slow subscriber disconnected: its queue is full");
                    self.close(conn, Some(reason::QUOTA_EXCEEDED), now);
                }
            }
        }
    }

    /// The connection's next packets: its control packets, then queued messages until they
    /// hold `max_bytes` (at least one): queued
    /// messages as room in flight allows ([MQTT-3.3.4-7]), expired ones left out
    /// ([MQTT-3.3.2-5]) and the rest with their remaining expiry ([MQTT-3.3.2-6]), any larger
    /// than the client takes dropped as if sent ([MQTT-3.1.2-24], [MQTT-3.1.2-25]).
    pub fn poll_transmit(&mut self, conn: ConnId, now: Instant, max_bytes: usize) -> Transmit {
        let mut packets = Vec::new();
        let (closing, more) = self.poll_transmit_into(conn, now, max_bytes, &mut packets);
        Transmit { packets, closing, more }
    }

    /// [`Broker::poll_transmit`] appending to `packets`, for a caller taking several
    /// connections' packets at once into one buffer (a `Vec` per delivery was 3 % of the local
    /// path's instructions); [`Transmit`]'s `closing` and `more`.
    pub fn poll_transmit_into(
        &mut self,
        conn: ConnId,
        now: Instant,
        max_bytes: usize,
        packets: &mut Vec<Outbound>,
    ) -> (bool, bool) {
        let Some(c) = self.conns.get_mut(&conn) else { return (true, false) };
        if c.gate > self.durable && !c.closing {
            // The CONNACK waits for the store (`connect`), and everything after it.
            return (false, false);
        }
        packets.extend(c.control.drain(..));
        if c.closing {
            return (true, false);
        }
        let (key, quota, max_packet, version) = (c.session, usize::from(c.send_quota), c.max_packet_out, c.version);
        let internal = c.rules.is_none();
        let (sid, durable) = (self.durable_sid(key), self.durable);
        let Some(s) = self.sessions.get_mut(key as usize).and_then(Option::as_mut) else {
            return (false, false);
        };
        let (mut expired, mut too_large, mut sent, mut released, mut bytes) = (0, 0, 0u64, 0usize, 0usize);
        // What the store hears of this, made once `s` is no longer borrowed; nothing allocated
        // unless the session is durable.
        let mut ops: Vec<StoreOp> = Vec::new();
        let mut hold = None;
        let mut number_qos2 = false;
        while bytes < max_bytes {
            let Some(front) = s.front() else { break };
            if front.qos != QoS::AtMostOnce && s.inflight.len() >= quota {
                break;
            }
            if front.hold > durable {
                hold = Some(front.hold);
                break;
            }
            // A QoS 2 message to a durable session gets its packet id stored before it goes.
            if sid.is_some() && front.qos == QoS::ExactlyOnce && front.pkid.is_none() && !front.msg.expired(now) {
                number_qos2 = true;
                break;
            }
            let Some((mut d, held)) = s.pop() else { break };
            let weight = if held { d.weight() } else { 0 };
            let done = |ops: &mut Vec<StoreOp>, d: &Delivery| {
                if let Some(sid) = sid.filter(|_| d.ord != 0) {
                    ops.push(StoreOp::Done { sid, ord: d.ord, msg: d.msg.clone() });
                }
            };
            if !d.dup && d.msg.expired(now) {
                expired += 1;
                released += weight;
                done(&mut ops, &d);
                continue;
            }
            let pkid = match (d.qos, d.pkid) {
                (QoS::AtMostOnce, _) => 0,
                (_, Some(p)) => p,
                (_, None) => {
                    let pkid = s.allocate_pkid();
                    if let Some(sid) = sid.filter(|_| d.ord != 0) {
                        ops.push(StoreOp::Sent { sid, ord: d.ord, pkid });
                    }
                    pkid
                }
            };
            let packet = Outbound::Publish {
                msg: d.msg.clone(),
                qos: d.qos,
                pkid,
                dup: d.dup,
                retain: d.retain,
                expiry: d.msg.remaining_expiry(now),
                sub_ids: if version == Version::V5 { d.sub_ids.clone() } else { Vec::new() },
            };
            let len = packet.encoded_len(version);
            if len > max_packet {
                too_large += 1;
                released += weight;
                done(&mut ops, &d);
                continue;
            }
            if d.qos == QoS::AtMostOnce {
                released += weight;
            } else {
                d.pkid = Some(pkid);
                s.inflight.push_back(Inflight { pkid, delivery: d, released: false, held });
            }
            bytes += len;
            sent += 1;
            packets.push(packet);
        }
        let numbered = if number_qos2 {
            let pkid = s.allocate_pkid();
            s.front_mut().map(|f| {
                f.pkid = Some(pkid);
                (f.ord, pkid)
            })
        } else {
            None
        };
        let more = bytes >= max_bytes
            && hold.is_none()
            && !number_qos2
            && s.front().is_some_and(|f| f.qos == QoS::AtMostOnce || s.inflight.len() < quota);
        s.held_bytes = s.held_bytes.saturating_sub(released);
        self.held_total = self.held_total.saturating_sub(released);
        for op in ops {
            self.store(op);
        }
        if let (Some(sid), Some((ord, pkid))) = (sid, numbered) {
            let op_id = self.store(StoreOp::Sent { sid, ord, pkid });
            if let Some(f) = self.session_mut(key).and_then(|s| s.front_mut()) {
                f.hold = op_id;
            }
            hold = Some(op_id);
        }
        if let Some(op_id) = hold {
            self.wait_store(conn, op_id);
        }
        self.metrics.dropped("expired", expired);
        self.metrics.dropped("too_large_for_client", too_large);
        let out = if internal { &self.metrics.publish_out_internal } else { &self.metrics.publish_out };
        out.inc_by(sent);
        self.drained(key, now);
        (false, more)
    }
}

/// Why the cloud's sink could not store `msg` whole, if it could not.
fn sink_misfit(sink: &crate::spool::SinkFit, msg: &Message) -> Option<crate::spool::Misfit> {
    let p = &msg.props;
    let correlation = p.correlation_data.as_ref().map(bytes::Bytes::len);
    sink.check(&msg.topic, msg.payload.len(), &p.user, correlation, p.content_type.as_deref()).err()
}

fn ack_packet(qos: QoS, pkid: u16, code: u8) -> Outbound {
    match qos {
        QoS::ExactlyOnce => Outbound::PubRec { pkid, reason: code },
        _ => Outbound::PubAck { pkid, reason: code },
    }
}

/// The spool record of a message: its class's expiry (TTL) or the message's own, whichever is
/// sooner.
pub(super) fn spool_message(msg: &Message, class: &Class, now: Instant, wall: u64) -> crate::spool::Message {
    let from_message = msg.expires_at.map(|at| wall + at.saturating_duration_since(now).as_millis() as u64);
    let from_class = class.ttl_ms.map(|t| wall + t);
    let expires_ms = match (from_message, from_class) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    crate::spool::Message {
        class: class.name.clone(),
        topic: msg.topic.to_string(),
        payload: msg.payload.clone(),
        qos: msg.qos as u8,
        enqueued_ms: wall,
        expires_ms,
        properties: crate::spool::Properties {
            user: msg.props.user.clone(),
            correlation_data: msg.props.correlation_data.clone(),
            content_type: msg.props.content_type.clone(),
            schema: msg.schema.as_deref().cloned(),
            receipt: None,
        },
    }
}
