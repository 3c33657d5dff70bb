//! Packets from a connected client: PUBLISH and the QoS flows both ways, SUBSCRIBE,
//! UNSUBSCRIBE, PINGREQ, DISCONNECT, and the errors that close a connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::connect::Identity;
use super::durable::StoreOp;
use super::router::{Filter, SubOptions};
use super::session::{AckSlot, Delivery, Qos2In};
use super::{Broker, ConnId, SessionKey};
use crate::auth::Rules;
use crate::broker::codec::{
    DecodeError, Inbound, Outbound, PublishPacket, PublishProps, QoS, SubscribeRequest, Version, reason,
};
use crate::broker::message::Message;
use crate::schema::{Judged, Verdict};
use shared::proto::SchemaRef;

/// A message the broker would not take: the metric label, the MQTT 5 reason code a publisher
/// hears, and a Reason String where there is more to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub label: &'static str,
    pub code: u8,
    pub text: Option<String>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.text {
            Some(text) => write!(f, "{}: {text}", self.label),
            None => write!(f, "{}", self.label),
        }
    }
}

impl Broker {
    /// A packet the connection's client sent.
    pub fn handle(&mut self, conn: ConnId, packet: Inbound, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if c.closing {
            return;
        }
        c.last_seen = now;
        match packet {
            Inbound::Publish(p) => self.on_publish(conn, p, None, now),
            Inbound::PubAck { pkid, .. } => self.on_ack(conn, pkid, QoS::AtLeastOnce, false),
            Inbound::PubRec { pkid, reason } => self.on_pubrec(conn, pkid, reason, now),
            Inbound::PubRel { pkid } => self.on_pubrel(conn, pkid, now),
            Inbound::PubComp { pkid } => self.on_ack(conn, pkid, QoS::ExactlyOnce, true),
            Inbound::Subscribe { pkid, filters, id } => self.on_subscribe(conn, pkid, filters, id, now),
            Inbound::Unsubscribe { pkid, filters } => self.on_unsubscribe(conn, pkid, filters, now),
            Inbound::PingReq => self.control(conn, Outbound::PingResp, now),
            Inbound::Disconnect { reason, session_expiry } => self.on_disconnect(conn, reason, session_expiry, now),
            // §4.12: AUTH without an Authentication Method in the CONNECT is a protocol error.
            Inbound::Auth => self.protocol_error(conn, "protocol_error", reason::PROTOCOL_ERROR, now),
        }
    }

    /// [`BrokerCore::handle`] of a PUBLISH whose payload the glue validated before it took the
    /// core's lock ([`crate::schema::Validator::judge`]): the core settles that judgment rather
    /// than validating under the lock every client waits for.
    pub(crate) fn handle_publish(&mut self, conn: ConnId, p: PublishPacket, judged: Option<Judged>, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if c.closing {
            return;
        }
        c.last_seen = now;
        self.on_publish(conn, p, judged, now);
    }

    /// A frame the glue could not decode, or broke a rule the codec checks: the connection
    /// closes with the error's reason ([MQTT-4.13.1-1]).
    pub(crate) fn decode_error(&mut self, conn: ConnId, error: &DecodeError, now: Instant) {
        tracing::info!(conn = conn.0, %error, "closing a connection");
        self.protocol_error(conn, error.label(), error.reason(), now);
    }

    fn protocol_error(&mut self, conn: ConnId, label: &'static str, code: u8, now: Instant) {
        self.metrics.disconnect(label);
        self.close(conn, Some(code), now);
    }

    /// Why a client may not publish to `topic`, if it may not: the node's reserved namespace
    /// first (no ACL opens it), then the ACL.
    pub(super) fn publish_refusal(&self, rules: Option<&Rules>, internal: bool, topic: &str) -> Option<&'static str> {
        if internal {
            return None;
        }
        let reserved = self.limits.internal_topics.iter().any(|t| t == topic)
            || self.limits.reserved_topics.iter().any(|f| shared::topic::matches(f, topic));
        if reserved {
            Some("reserved_topic")
        } else if rules.is_some_and(|r| !r.may_publish(topic)) {
            Some("acl")
        } else {
            None
        }
    }

    pub(super) fn publish_refused(&self, identity: &Identity, topic: &str) -> Option<&'static str> {
        self.publish_refusal(identity.rules.as_deref(), identity.internal, topic)
    }

    /// Whether a message may enter as its publisher holding `rules` sent it, whatever way it
    /// came (a client's PUBLISH, the cloud's downlink): its topic's length, its user
    /// properties (`excess`: those past the decoder's cap), the node's namespace and the ACL,
    /// a Response Topic that is a topic name ([MQTT-3.3.2-14]), and the schema its topic is
    /// bound to (`payload` with the judgment the glue made of it ahead of the lock, if it
    /// did). A valid message names the schema version it matched.
    pub(super) fn admit(
        &self,
        rules: Option<&Rules>,
        internal: bool,
        topic: &str,
        props: &PublishProps,
        excess: usize,
        (payload, judged): (&[u8], Option<Judged>),
    ) -> Result<Option<Arc<SchemaRef>>, Refused> {
        let refused = |label, code, text| Err(Refused { label, code, text });
        if topic.len() > self.limits.max_topic_length {
            return refused("topic_too_long", reason::TOPIC_NAME_INVALID, None);
        }
        if excess > 0 || props.user.len() > self.limits.max_user_properties {
            return refused("too_many_user_properties", reason::QUOTA_EXCEEDED, None);
        }
        if let Some(label) = self.publish_refusal(rules, internal, topic) {
            return refused(label, reason::NOT_AUTHORIZED, None);
        }
        if let Some(rt) = &props.response_topic
            && let Err(e) = shared::topic::validate_name(rt)
        {
            let text = format!("Response Topic {rt:?}: {e}");
            return refused("response_topic_invalid", reason::TOPIC_NAME_INVALID, Some(text));
        }
        // Schema validation: before anything is stored or acknowledged, never for the node's
        // own clients, and for unbound topics nothing beyond the filter match.
        // A judgment the glue made ahead of the lock is settled if it is of this publish.
        let verdict = match (&self.schemas, judged.filter(|j| j.is_of(topic, payload))) {
            (Some(_), _) if internal => return Ok(None),
            (Some(v), Some(judged)) => v.settle_ahead(judged),
            (Some(v), None) => v.check(topic, payload),
            (None, _) => return Ok(None),
        };
        match verdict {
            Verdict::Refused(text) => refused("schema", reason::PAYLOAD_FORMAT_INVALID, Some(text)),
            Verdict::Valid(tag) => Ok(Some(tag)),
            Verdict::Unbound | Verdict::Passed => Ok(None),
        }
    }

    fn on_publish(&mut self, conn: ConnId, p: PublishPacket, judged: Option<Judged>, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        let (key, version) = (c.session, c.version);
        // §4.9: more unacknowledged QoS 1 and 2 publishes than our Receive Maximum.
        if p.qos != QoS::AtMostOnce && c.unacked_in >= self.limits.receive_maximum {
            return self.protocol_error(conn, "receive_maximum_exceeded", reason::RECEIVE_MAXIMUM_EXCEEDED, now);
        }
        let topic: Arc<str> = match (p.topic_alias, p.topic.is_empty()) {
            // [MQTT-3.3.2-8], [MQTT-3.3.2-9]: alias 0, or above our Topic Alias Maximum.
            (Some(a), _) if a == 0 || a > self.limits.topic_alias_maximum => {
                return self.protocol_error(conn, "topic_alias_invalid", reason::TOPIC_ALIAS_INVALID, now);
            }
            (Some(a), false) => {
                let topic: Arc<str> = p.topic_str().into();
                // An alias holds at most a topic the broker takes.
                if topic.len() <= self.limits.max_topic_length {
                    c.aliases.insert(a, topic.clone());
                }
                topic
            }
            (Some(a), true) => match c.aliases.get(&a) {
                Some(t) => t.clone(),
                // §3.3.2.3.4: an alias never set is a protocol error.
                None => return self.protocol_error(conn, "topic_alias_invalid", reason::PROTOCOL_ERROR, now),
            },
            // [MQTT-3.3.2-1]: a topic name, or an alias for one.
            (None, true) => return self.protocol_error(conn, "topic_name_invalid", reason::PROTOCOL_ERROR, now),
            (None, false) => p.topic_str().into(),
        };
        // [MQTT-3.3.2-2]: no wildcards in a topic name.
        if shared::topic::validate_name(&topic).is_err() {
            return self.protocol_error(conn, "topic_name_invalid", reason::TOPIC_NAME_INVALID, now);
        }
        let Some(s) = self.session_mut(key) else { return };
        // [MQTT-4.3.3-9]: a QoS 2 packet id still awaiting its PUBREL is a resend: acknowledged
        // again, not delivered again; while the first one waits for the spool, the resend's
        // PUBREC waits for the same outcome.
        if p.qos == QoS::ExactlyOnce
            && let Some(waiting) = s.qos2_in.get(&p.pkid).copied()
        {
            return self.on_qos2_resend(conn, key, &p, &topic, waiting, now);
        }
        let (internal, client_id) = (s.internal, s.client_id.clone());
        let rules = self.conns.get(&conn).and_then(|c| c.rules.clone());
        let (excess, payload) = (p.excess_user_properties, (&p.payload[..], judged));
        let taken = self.admit(rules.as_deref(), internal, &topic, &p.props, excess, payload);
        let schema = match taken {
            Ok(schema) => schema,
            Err(refused) => {
                self.metrics.refused(refused.label);
                tracing::debug!(conn = conn.0, topic = ?topic, label = refused.label, text = refused.text, "publish refused");
                return self.refuse_publish(conn, key, &p, version, (refused.code, refused.text), now);
            }
        };
        if p.qos != QoS::AtMostOnce
            && let Some(c) = self.conns.get_mut(&conn)
        {
            c.unacked_in += 1;
        }
        // Everything stored from here on is what the acknowledgement waits for.
        let since = self.last_op;
        if p.qos == QoS::ExactlyOnce {
            self.receive_qos2(key, p.pkid);
        }
        let msg = Arc::new(Message {
            topic,
            // A copy, not a slice of the read buffer: a queued message would otherwise pin the
            // whole buffer it arrived in, and a slow subscriber would hold every reader's.
            payload: bytes::Bytes::copy_from_slice(&p.payload),
            qos: p.qos,
            retain: p.retain,
            props: p.props,
            expires_at: p.message_expiry.map(|s| now + Duration::from_secs(u64::from(s))),
            origin: Some(client_id),
            schema,
        });
        let ack = (p.qos != QoS::AtMostOnce).then_some((p.qos, p.pkid));
        if let Err(code) = self.ingest(Some(conn), Some(internal), msg, ack, since, now) {
            if p.qos == QoS::ExactlyOnce {
                self.settle_qos2(key, p.pkid);
            }
            if let Some((qos, pkid)) = ack {
                self.ack_ready(conn, qos, pkid, code, now);
                if qos == QoS::ExactlyOnce
                    && let Some(c) = self.conns.get_mut(&conn)
                {
                    c.unacked_in = c.unacked_in.saturating_sub(1);
                }
            }
        }
    }

    /// A publish not taken: MQTT 5 hears the reason code and, when given, a Reason String;
    /// MQTT 3.1.1 has no way to hear it and gets a positive acknowledgement ([MQTT-3.3.5-2]);
    /// QoS 0 hears nothing.
    fn refuse_publish(
        &mut self,
        conn: ConnId,
        key: SessionKey,
        p: &PublishPacket,
        version: Version,
        (code, text): (u8, Option<String>),
        now: Instant,
    ) {
        let code = if version == Version::V5 { code } else { reason::SUCCESS };
        if let (Some(text), true) = (text, version == Version::V5 && p.qos != QoS::AtMostOnce) {
            let max = self.conns.get(&conn).map_or(usize::MAX, |c| c.max_packet_out);
            let mut packet =
                Outbound::PubRefused { pkid: p.pkid, qos2: p.qos == QoS::ExactlyOnce, reason: code, text: Some(text) };
            // [MQTT-3.4.2-2], [MQTT-3.5.2-2]: no Reason String that would pass the client's
            // Maximum Packet Size.
            if packet.encoded_len(version) > max
                && let Outbound::PubRefused { text, .. } = &mut packet
            {
                *text = None;
            }
            return self.control(conn, packet, now);
        }
        match p.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => self.control(conn, Outbound::PubAck { pkid: p.pkid, reason: code }, now),
            QoS::ExactlyOnce => {
                if code == reason::SUCCESS
                    && let Some(s) = self.session_mut(key)
                {
                    // The exchange goes on to its PUBCOMP; a resend is refused again, so the id
                    // need not survive a restart.
                    s.qos2_in.insert(p.pkid, Qos2In::default());
                }
                self.control(conn, Outbound::PubRec { pkid: p.pkid, reason: code }, now);
            }
        }
    }

    /// A QoS 2 packet id received: kept until its PUBREL, in the store for a durable session.
    fn receive_qos2(&mut self, key: SessionKey, pkid: u16) {
        let sid = self.durable_sid(key);
        let (stored, receipt) = match sid {
            Some(sid) => {
                self.next_receipt += 1;
                let receipt = self.next_receipt;
                (self.store(StoreOp::Received { sid, pkid, receipt }), receipt)
            }
            None => (0, 0),
        };
        if let Some(s) = self.session_mut(key) {
            s.qos2_in.insert(pkid, Qos2In { ticket: None, stored, receipt });
        }
    }

    /// A QoS 2 packet id released (or its publish not taken after all); whether it was known.
    pub(super) fn settle_qos2(&mut self, key: SessionKey, pkid: u16) -> bool {
        let Some(q) = self.session_mut(key).and_then(|s| s.qos2_in.remove(&pkid)) else { return false };
        if let Some(sid) = self.durable_sid(key) {
            let op = self.store(StoreOp::Settled { sid, pkid });
            self.release_receipt(q.receipt, op);
        }
        true
    }

    /// A QoS 2 PUBLISH whose packet id is still in the session's received set: its PUBREC goes
    /// again, after the spool outcome the first one waits for if there is one, and once the id
    /// is stored. A message that goes to the spool goes there again under its receipt (after a
    /// crash, the first one may not have): the spool takes it once, and the PUBREC follows its
    /// answer.
    fn on_qos2_resend(
        &mut self,
        conn: ConnId,
        key: SessionKey,
        p: &PublishPacket,
        topic: &Arc<str>,
        waiting: Qos2In,
        now: Instant,
    ) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        // Its PUBREL settles it like any other.
        c.unacked_in += 1;
        let pkid = p.pkid;
        if let Some((ticket, pending)) = waiting.ticket.and_then(|t| self.pending.get_mut(&t).map(|p| (t, p))) {
            pending.conns.push(conn);
            c.acks.push_back(AckSlot::Waiting { ticket, qos: QoS::ExactlyOnce, pkid, stored: waiting.stored });
            return;
        }
        let respooled = (waiting.receipt != 0).then(|| self.respool(key, p, topic, waiting, now)).flatten();
        match respooled {
            Some(ticket) => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.acks.push_back(AckSlot::Waiting { ticket, qos: QoS::ExactlyOnce, pkid, stored: waiting.stored });
                }
                let pending =
                    super::PendingSpool { conns: vec![conn], qos2: Some((key, pkid)), deliver: None, retain: false };
                self.pending.insert(ticket, pending);
                if let Some(q) = self.session_mut(key).and_then(|s| s.qos2_in.get_mut(&pkid)) {
                    q.ticket = Some(ticket);
                }
            }
            None => {
                let packet = Outbound::PubRec { pkid, reason: reason::SUCCESS };
                self.ack_when_stored(conn, packet, waiting.stored, now);
            }
        }
    }

    /// The spool append of a resent QoS 2 message under its receipt, if its topic goes to the
    /// spool; its ticket.
    fn respool(
        &mut self,
        key: SessionKey,
        p: &PublishPacket,
        topic: &Arc<str>,
        waiting: Qos2In,
        now: Instant,
    ) -> Option<u64> {
        let classes = self.classes.clone();
        let (_, class) = classes.classify_at(topic)?;
        if !matches!(class.route(), crate::route::Route::Central | crate::route::Route::Both) {
            return None;
        }
        let origin = self.session(key).map(|s| s.client_id.clone());
        let msg = Message {
            topic: topic.clone(),
            payload: bytes::Bytes::copy_from_slice(&p.payload),
            qos: p.qos,
            retain: p.retain,
            props: p.props.clone(),
            expires_at: p.message_expiry.map(|s| now + Duration::from_secs(u64::from(s))),
            origin,
            schema: None,
        };
        let mut message = super::deliver::spool_message(&msg, class, now, self.wall_ms(now));
        message.properties.receipt = Some(waiting.receipt);
        let ticket = self.next_ticket();
        let req = super::SpoolRequest { ticket, lane: class.lane, durability: class.durability, message };
        self.spool_after(waiting.stored, req);
        Some(ticket)
    }

    /// PUBACK for QoS 1, PUBCOMP for a released QoS 2: the message leaves flight.
    fn on_ack(&mut self, conn: ConnId, pkid: u16, qos: QoS, released: bool) {
        let Some(key) = self.conns.get(&conn).map(|c| c.session) else { return };
        let Some(s) = self.session_mut(key) else { return };
        let Some(at) =
            s.inflight.iter().position(|i| i.pkid == pkid && i.released == released && i.delivery.qos == qos)
        else {
            return;
        };
        self.leave_flight(conn, key, at);
    }

    /// The message at `at` in flight is done (acknowledged, or refused by the client's PUBREC).
    fn leave_flight(&mut self, conn: ConnId, key: SessionKey, at: usize) {
        let Some(s) = self.session_mut(key) else { return };
        let Some(done) = s.inflight.remove(at) else { return };
        let more = s.front().is_some();
        if done.held {
            self.release(key, done.delivery.weight());
        }
        self.store_done(key, &done.delivery);
        if more {
            self.wake(conn);
        }
    }

    fn on_pubrec(&mut self, conn: ConnId, pkid: u16, code: u8, now: Instant) {
        let Some(key) = self.conns.get(&conn).map(|c| c.session) else { return };
        let Some(s) = self.session_mut(key) else { return };
        let Some(at) = s.inflight.iter().position(|i| i.pkid == pkid && i.delivery.qos == QoS::ExactlyOnce) else {
            return self.control(conn, Outbound::PubRel { pkid, reason: reason::PACKET_ID_NOT_FOUND }, now);
        };
        if code >= 0x80 {
            // §4.3.3: a PUBREC with an error ends the exchange (and, on a shared subscription,
            // the message is not sent elsewhere: [MQTT-4.8.2-6]).
            return self.leave_flight(conn, key, at);
        }
        let first = !s.inflight[at].released;
        s.inflight[at].released = true;
        let ord = s.inflight[at].delivery.ord;
        // Its release is stored before the PUBREL lets the client forget the message.
        let since = self.last_op;
        if first
            && ord != 0
            && let Some(sid) = self.durable_sid(key)
        {
            self.store(StoreOp::Released { sid, ord });
        }
        self.ack_after_store(conn, Outbound::PubRel { pkid, reason: 0 }, since, now);
    }

    fn on_pubrel(&mut self, conn: ConnId, pkid: u16, now: Instant) {
        let Some(key) = self.conns.get(&conn).map(|c| c.session) else { return };
        let since = self.last_op;
        let known = self.settle_qos2(key, pkid);
        if known && let Some(c) = self.conns.get_mut(&conn) {
            c.unacked_in = c.unacked_in.saturating_sub(1);
        }
        let code = if known { 0 } else { reason::PACKET_ID_NOT_FOUND };
        // [MQTT-4.3.3-11]: PUBREL is answered with PUBCOMP of its packet id, once the release
        // is stored: a restored id would take the client's next message of that id for a resend.
        self.ack_after_store(conn, Outbound::PubComp { pkid, reason: code }, since, now);
    }

    fn on_subscribe(&mut self, conn: ConnId, pkid: u16, filters: Vec<SubscribeRequest>, id: Option<u32>, now: Instant) {
        let Some(c) = self.conns.get(&conn) else { return };
        let (key, rules, v5) = (c.session, c.rules.clone(), c.version == Version::V5);
        // What this makes the store keep is what the SUBACK promises.
        let since = self.last_op;
        // A filter repeated in one SUBSCRIBE is handled once, as its last copy asks (a later
        // subscription to a filter replaces the earlier, [MQTT-3.8.4-3]); each copy is
        // answered as the sequence of SUBSCRIBEs [MQTT-3.8.4-5] would have answered it: the
        // QoS it asked for where the last copy was granted, the last copy's refusal where it
        // was not. Past `max_subscribe_filters` distinct filters the rest get 0x97 unread. One
        // packet costs its distinct filters, within that bound.
        let mut last: HashMap<&str, usize> = HashMap::new();
        for (i, f) in filters.iter().enumerate() {
            if last.len() < self.limits.max_subscribe_filters || last.contains_key(f.filter.as_str()) {
                last.insert(&f.filter, i);
            }
        }
        let mut answered: HashMap<&str, u8> = HashMap::new();
        let mut codes = Vec::with_capacity(filters.len());
        let mut out = Subscribed::default();
        for (i, f) in filters.iter().enumerate() {
            let Some(&at) = last.get(f.filter.as_str()) else {
                self.metrics.subscribe_refused("max_subscribe_filters");
                codes.push(if v5 { reason::QUOTA_EXCEEDED } else { reason::V4_SUBACK_FAILURE });
                continue;
            };
            if let Some(&code) = answered.get(f.filter.as_str()) {
                codes.push(if code <= 2 { f.qos as u8 } else { code });
                continue;
            }
            let asked = f.qos as u8;
            let f = &filters[at];
            let code = match self.subscribe_one(key, f, id, rules.as_deref(), now, &mut out) {
                Ok(code) => code,
                Err(SubscribeError::Protocol) => {
                    // [MQTT-3.8.3-4]: No Local on a shared subscription.
                    return self.protocol_error(conn, "protocol_error", reason::PROTOCOL_ERROR, now);
                }
                Err(SubscribeError::Refused(label, code)) => {
                    self.metrics.subscribe_refused(label);
                    code
                }
            };
            let code = if v5 || code <= 2 { code } else { reason::V4_SUBACK_FAILURE };
            if at != i {
                answered.insert(&f.filter, code);
            }
            codes.push(if code <= 2 { asked } else { code });
        }
        let cap = self.limits.max_retained_messages;
        let mut backlog = 0;
        for d in out.retained {
            let Some(s) = self.session_mut(key).filter(|s| s.retained_backlog.len() < cap) else { break };
            s.retained_backlog.push_back(d);
            backlog += 1;
            self.store_pushed(key, true);
        }
        if out.changed {
            self.persist(key);
        }
        // [MQTT-3.8.4-1], [MQTT-3.9.3-1]: one SUBACK, a code per filter in order; for a durable
        // session, once the record holding the subscriptions it reports is committed (this
        // one's, or an earlier one's not yet): a Session Present after a crash must hold every
        // subscription acknowledged ([MQTT-3.2.2-2]). The retained messages it matched go after
        // it.
        let op_id = self.reported_op(key, since);
        self.control_when_stored(conn, Outbound::SubAck { pkid, codes }, op_id, now);
        if op_id > self.durable
            && let Some(s) = self.session_mut(key)
        {
            let from = s.retained_backlog.len() - backlog;
            for d in s.retained_backlog.iter_mut().skip(from) {
                d.hold = d.hold.max(op_id);
            }
        }
        self.metrics.subscriptions.set(self.router.len() as i64);
        self.wake(conn);
    }

    fn subscribe_one(
        &mut self,
        key: SessionKey,
        f: &SubscribeRequest,
        id: Option<u32>,
        rules: Option<&Rules>,
        now: Instant,
        out: &mut Subscribed,
    ) -> Result<u8, SubscribeError> {
        let parsed =
            Filter::parse(&f.filter).ok_or(SubscribeError::Refused("invalid_filter", reason::TOPIC_FILTER_INVALID))?;
        if shared::topic::validate_filter(parsed.filter).is_err() || f.filter.len() > self.limits.max_topic_length {
            return Err(SubscribeError::Refused("invalid_filter", reason::TOPIC_FILTER_INVALID));
        }
        if parsed.share.is_some() && f.no_local {
            return Err(SubscribeError::Protocol);
        }
        // The ACL judges the filter inside `$share/<group>/`.
        if rules.is_some_and(|r| !r.may_subscribe(parsed.filter)) {
            return Err(SubscribeError::Refused("acl", reason::NOT_AUTHORIZED));
        }
        let max = self.limits.max_subscriptions;
        let Some(s) = self.session_mut(key) else { return Err(SubscribeError::Refused("gone", reason::UNSPECIFIED)) };
        if !s.subs.contains_key(&f.filter) && s.subs.len() >= max && !s.internal {
            return Err(SubscribeError::Refused("max_subscriptions", reason::QUOTA_EXCEEDED));
        }
        let internal = s.internal;
        let opts = SubOptions {
            qos: f.qos,
            no_local: f.no_local,
            retain_as_published: f.retain_as_published,
            retain_handling: f.retain_handling,
            id,
        };
        if s.subs.insert(f.filter.clone(), opts) != Some(opts) {
            out.changed = true;
        }
        // [MQTT-3.8.4-3]: a subscription to the same filter replaces the one there was.
        let existed = self.router.subscribe(parsed, key, opts);
        // [MQTT-3.3.1-9], [MQTT-3.3.1-10], [MQTT-3.3.1-11]; none for a shared subscription
        // (§4.8.2).
        let send_retained = parsed.share.is_none() && (f.retain_handling == 0 || (f.retain_handling == 1 && !existed));
        // Only what the session's retained backlog can still take is looked up.
        let room = self.session(key).map_or(0, |s| {
            self.limits.max_retained_messages.saturating_sub(s.retained_backlog.len() + out.retained.len())
        });
        if send_retained {
            for msg in self.retained.matching(parsed.filter, now, room) {
                if !internal && self.limits.internal_topics.iter().any(|t| **t == *msg.topic) {
                    continue;
                }
                // [MQTT-3.3.1-8] (MQTT 3.1.1 [MQTT-3.3.1-8]): sent because of a new
                // subscription, with RETAIN set.
                let qos = msg.qos.min(f.qos);
                out.retained.push(Delivery::new(msg, qos, true, id.into_iter().collect()));
            }
        }
        Ok(f.qos as u8)
    }

    fn on_unsubscribe(&mut self, conn: ConnId, pkid: u16, filters: Vec<String>, now: Instant) {
        let Some(key) = self.conns.get(&conn).map(|c| c.session) else { return };
        let since = self.last_op;
        let mut codes = Vec::with_capacity(filters.len());
        for filter in filters {
            let removed = self.session_mut(key).is_some_and(|s| s.subs.remove(&filter).is_some());
            if removed && let Some(f) = Filter::parse(&filter) {
                self.router.unsubscribe(f, key);
            }
            codes.push(if removed { reason::SUCCESS } else { reason::NO_SUBSCRIPTION_EXISTED });
        }
        // An UNSUBSCRIBE of filters it does not hold writes nothing (a loop of them queued a
        // whole session record each).
        if codes.contains(&reason::SUCCESS) {
            self.persist(key);
        }
        // [MQTT-3.10.4-4], [MQTT-3.11.3-1]: an UNSUBACK, a code per filter; for a durable
        // session once the record without the filters is committed (even when this one removed
        // nothing: an earlier removal may not be), so a crash never brings back a subscription
        // the client was told is gone.
        let op_id = self.reported_op(key, since);
        self.control_when_stored(conn, Outbound::UnsubAck { pkid, codes }, op_id, now);
        self.metrics.subscriptions.set(self.router.len() as i64);
    }

    /// The store op a SUBACK or UNSUBACK of session `key` waits for: the last made since
    /// `since` (its retained backlog, its record), or the record as last written.
    fn reported_op(&self, key: SessionKey, since: u64) -> u64 {
        let made = if self.last_op > since { self.last_op } else { 0 };
        self.session(key).map_or(made, |s| made.max(s.record_op))
    }

    fn on_disconnect(&mut self, conn: ConnId, code: u8, session_expiry: Option<u32>, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        let key = c.session;
        if let Some(expiry) = session_expiry {
            // §3.14.2.2.2: a session that began with expiry 0 cannot be given one now.
            if c.expiry_was_zero && expiry != 0 {
                return self.protocol_error(conn, "protocol_error", reason::PROTOCOL_ERROR, now);
            }
            let max = self.limits.max_session_expiry;
            if let Some(s) = self.session_mut(key) {
                s.expiry = expiry.min(max);
            }
        }
        // [MQTT-3.1.2-10]: a normal DISCONNECT discards the will; 0x04 asks for it.
        if code != reason::DISCONNECT_WITH_WILL
            && let Some(c) = self.conns.get_mut(&conn)
        {
            c.will = None;
        }
        self.close(conn, None, now);
    }

    /// Drops the session's subscriptions the rules no longer allow (after a reload, or on
    /// resuming a session stored under other rules).
    pub(super) fn prune_subscriptions(&mut self, key: SessionKey, rules: &Rules, _now: Instant) {
        let Some(s) = self.session_mut(key) else { return };
        let denied: Vec<String> = s
            .subs
            .keys()
            .filter(|f| Filter::parse(f).is_none_or(|p| !rules.may_subscribe(p.filter)))
            .cloned()
            .collect();
        for f in &denied {
            s.subs.remove(f);
        }
        for f in &denied {
            if let Some(parsed) = Filter::parse(f) {
                self.router.unsubscribe(parsed, key);
            }
            tracing::info!(filter = ?f, "subscription removed: the ACL no longer allows it");
        }
        if !denied.is_empty() {
            self.metrics.subscribe_refused("acl");
            self.persist(key);
        }
    }
}

/// What a SUBSCRIBE's filters made, together.
#[derive(Default)]
struct Subscribed {
    /// Retained messages to queue, at most what the session's backlog can take.
    retained: Vec<Delivery>,
    /// A subscription was added or changed: only then is the session record written.
    changed: bool,
}

enum SubscribeError {
    Protocol,
    Refused(&'static str, u8),
}
