//! CONNECT and its session: Clean Start, Session Expiry, takeover, ownership, the will; and a
//! connection's end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::session::{Conn, PendingWill, Session, Will};
use super::{Broker, ClientIds, ConnId, SessionKey};
use crate::auth::Rules;
use crate::broker::codec::{ConnAckProps, Connect, Outbound, Version, reason};
use crate::broker::message::Message;

/// Who a connection is, as the front authenticated it.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The identity a session belongs to: `user:<name>`, `cert:<name>`, `anonymous`,
    /// `internal`.
    pub owner: Arc<str>,
    /// The node's own clients: no ACL, no session bound, and the internal topics.
    pub internal: bool,
    /// `None` for internal connections.
    pub rules: Option<Arc<Rules>>,
}

#[derive(Debug)]
pub struct ConnectRequest {
    pub conn: ConnId,
    pub connect: Connect,
    pub identity: Identity,
}

/// A refused CONNECT: the CONNACK reason (MQTT 5; mapped for 3.1.1) and the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub code: u8,
    pub label: &'static str,
}

impl Broker {
    /// Admits a connection: the CONNACK is queued for it (`poll_transmit`). A refusal comes
    /// back for the glue to answer with its own CONNACK before closing.
    pub fn connect(&mut self, req: ConnectRequest, now: Instant) -> Result<(), Refusal> {
        let ConnectRequest { conn, connect: c, identity } = req;
        let refuse = |code, label| Err(Refusal { code, label });
        // [MQTT-4.12.0-1]: this server has no enhanced authentication.
        if c.auth_method.is_some() {
            return refuse(reason::BAD_AUTH_METHOD, "bad_auth_method");
        }
        if c.client_id.len() > self.limits.max_client_id_length {
            return refuse(reason::CLIENT_ID_NOT_VALID, "client_id_invalid");
        }
        if !identity.internal && c.client_id.starts_with(super::INTERNAL_CLIENT_ID_PREFIX) {
            return refuse(reason::CLIENT_ID_NOT_VALID, "client_id_reserved");
        }
        // MQTT 3.1.1 [MQTT-3.1.3-8]: no client id without a clean session; the same rule for
        // MQTT 5, where such a session could never be resumed.
        if c.client_id.is_empty() && !c.clean_start {
            return refuse(reason::CLIENT_ID_NOT_VALID, "client_id_invalid");
        }
        let will = match &c.will {
            Some(w) => {
                let topic = w.topic.as_str();
                if shared::topic::validate_name(topic).is_err() || topic.len() > self.limits.max_topic_length {
                    return refuse(reason::TOPIC_NAME_INVALID, "will_topic_invalid");
                }
                if let Some(label) = self.publish_refused(&identity, topic) {
                    return refuse(reason::NOT_AUTHORIZED, if label == "acl" { "not_authorized" } else { label });
                }
                if w.props.user.len() > self.limits.max_user_properties {
                    return refuse(reason::QUOTA_EXCEEDED, "too_many_user_properties");
                }
                let msg = Message {
                    topic: topic.into(),
                    payload: bytes::Bytes::copy_from_slice(&w.payload),
                    qos: w.qos,
                    retain: w.retain,
                    props: w.props.clone(),
                    expires_at: None,
                    origin: None,
                    schema: None,
                };
                Some(Will { msg: Arc::new(msg), delay: w.delay, expiry: w.expiry })
            }
            None => None,
        };

        let assigned = c.client_id.is_empty().then(|| self.assign_client_id());
        let client_id: Arc<str> = assigned.clone().unwrap_or_else(|| c.client_id.clone()).into();
        let existing = self.by_client.get(&client_id).copied();
        if let Some(key) = existing {
            let owner = self.session(key).map(|s| s.owner.clone());
            if self.limits.client_ids == ClientIds::PerIdentity && owner.as_deref() != Some(&*identity.owner) {
                tracing::info!(client_id = ?client_id, "CONNECT refused: the client id belongs to another identity");
                return refuse(reason::CLIENT_ID_NOT_VALID, "client_id_owned");
            }
        } else if !identity.internal {
            let (all, stored_by_owner) = self.user_sessions(&identity.owner);
            if all >= self.limits.max_sessions {
                return refuse(reason::QUOTA_EXCEEDED, "max_sessions");
            }
            // One identity (a user, a certificate, every anonymous client together) must not
            // fill `max_sessions` with sessions that outlive it and come back at each restart.
            if c.session_expiry > 0 && stored_by_owner >= self.limits.max_stored_sessions_per_identity {
                tracing::info!(client_id = ?client_id, owner = ?identity.owner, "CONNECT refused: broker.max_stored_sessions_per_identity reached");
                return refuse(reason::QUOTA_EXCEEDED, "max_stored_sessions_per_identity");
            }
        }

        // [MQTT-3.1.4-3]: a connection holding this session is told and closed.
        if let Some(old) = existing.and_then(|k| self.session(k)).and_then(|s| s.conn) {
            self.metrics.disconnect("session_taken_over");
            self.close(old, Some(reason::SESSION_TAKEN_OVER), now);
        }
        // A session with expiry 0 ended with that connection: there is none to resume.
        let existing = existing.filter(|k| self.session(*k).is_some_and(|s| s.client_id == client_id));
        // [MQTT-3.1.2-4]: Clean Start discards the session there was. Its CONNACK (Session
        // Present 0) goes once the discard is committed: a crash before would bring the old
        // session back to a client told it had none.
        let mut resumed = None;
        let mut gate = 0;
        if let Some(key) = existing {
            if c.clean_start {
                let since = self.last_op;
                self.end_session(key, now);
                gate = if self.last_op > since && self.last_op > self.durable { self.last_op } else { 0 };
            } else {
                resumed = Some(key);
            }
        }

        let expiry = c.session_expiry.min(self.limits.max_session_expiry);
        let key = match resumed {
            Some(key) => {
                self.resume(key, expiry, now);
                key
            }
            None => self.new_session(client_id.clone(), identity.owner.clone(), identity.internal, expiry),
        };

        let keep_alive = match self.limits.max_keep_alive {
            // MQTT 3.1.1 has no Server Keep Alive: its clients keep their own.
            Some(max) if c.version == Version::V5 && (c.keep_alive == 0 || c.keep_alive > max) => max,
            _ => c.keep_alive,
        };
        let conn_state = Conn {
            session: key,
            gate,
            version: c.version,
            keep_alive,
            last_seen: now,
            send_quota: c.receive_maximum.min(self.limits.max_inflight).max(1),
            max_packet_out: c.max_packet_size.map_or(usize::MAX, |m| m as usize),
            aliases: std::collections::HashMap::new(),
            unacked_in: 0,
            acks: std::collections::VecDeque::new(),
            control: std::collections::VecDeque::new(),
            rules: identity.rules.clone(),
            owner: identity.owner.clone(),
            will,
            expiry_was_zero: c.session_expiry == 0,
            closing: false,
            held: None,
            acks_held: false,
        };
        self.conns.insert(conn, conn_state);
        if let Some(s) = self.session_mut(key) {
            s.conn = Some(conn);
            s.disconnected_at = None;
            s.disconnected_ms = None;
        }

        let v5 = c.version == Version::V5;
        let props = ConnAckProps {
            session_expiry: (v5 && expiry != c.session_expiry).then_some(expiry),
            receive_maximum: v5.then_some(self.limits.receive_maximum),
            max_packet_size: v5.then_some(self.limits.max_packet_size),
            assigned_client_id: if v5 { assigned } else { None },
            topic_alias_maximum: (v5 && self.limits.topic_alias_maximum > 0).then_some(self.limits.topic_alias_maximum),
            server_keep_alive: (v5 && keep_alive != c.keep_alive).then_some(keep_alive),
            reason_string: None,
        };
        // [MQTT-3.2.2-2], [MQTT-3.2.2-3]: Session Present says whether state was resumed.
        let connack = Outbound::ConnAck { session_present: resumed.is_some(), code: 0, props: Box::new(props) };
        if let Some(c) = self.conns.get_mut(&conn) {
            c.control.push_back(connack);
        }
        if resumed.is_some() {
            self.resend_inflight(key, conn, now);
            if let Some(rules) = identity.rules {
                self.prune_subscriptions(key, &rules, now);
                self.drop_unreadable(key, &rules);
            }
        }
        self.persist(key);
        if gate > 0 {
            self.wait_store(conn, gate);
        }
        self.wake(conn);
        Ok(())
    }

    fn assign_client_id(&mut self) -> String {
        loop {
            self.next_assigned += 1;
            let id = format!("auto-{:x}-{}", rand::random::<u32>(), self.next_assigned);
            if !self.by_client.contains_key(id.as_str()) {
                return id;
            }
        }
    }

    /// Clients' sessions, and how many of them `owner` holds that outlive their connection.
    fn user_sessions(&self, owner: &str) -> (usize, usize) {
        self.sessions
            .iter()
            .flatten()
            .filter(|s| !s.internal)
            .fold((0, 0), |(all, stored), s| (all + 1, stored + usize::from(s.expiry > 0 && *s.owner == *owner)))
    }

    pub(super) fn new_session(
        &mut self,
        client_id: Arc<str>,
        owner: Arc<str>,
        internal: bool,
        expiry: u32,
    ) -> SessionKey {
        self.next_sid += 1;
        let session = Session::new(self.next_sid, client_id.clone(), owner, internal, expiry);
        let key = match self.free.pop() {
            Some(k) => {
                self.sessions[k as usize] = Some(session);
                k
            }
            None => {
                self.sessions.push(Some(session));
                (self.sessions.len() - 1) as SessionKey
            }
        };
        self.by_client.insert(client_id, key);
        self.metrics.sessions.set(self.by_client.len() as i64);
        key
    }

    /// A session resumed on a new connection: its pending will is cancelled ([MQTT-3.1.3-9])
    /// and it no longer expires.
    fn resume(&mut self, key: SessionKey, expiry: u32, now: Instant) {
        self.cancel_expiry(key);
        let Some(s) = self.session_mut(key) else { return };
        let cancelled = s.pending_will.take().map(|w| w.due);
        if let Some(due) = cancelled {
            self.wills.remove(&(due, key));
            self.store_will(key, now);
        }
        if let Some(s) = self.session_mut(key) {
            s.expiry = expiry;
        }
    }

    pub(super) fn schedule_expiry(&mut self, key: SessionKey, due: Instant) {
        self.cancel_expiry(key);
        if let Some(s) = self.session_mut(key) {
            s.expires_at = Some(due);
            self.expiries.insert((due, key));
        }
    }

    fn cancel_expiry(&mut self, key: SessionKey) {
        if let Some(due) = self.session_mut(key).and_then(|s| s.expires_at.take()) {
            self.expiries.remove(&(due, key));
        }
    }

    /// [MQTT-4.4.0-1]: unacknowledged PUBLISHes go again first, with their packet ids and DUP;
    /// PUBRELs of released QoS 2 messages go again too, once their release is stored.
    fn resend_inflight(&mut self, key: SessionKey, conn: ConnId, now: Instant) {
        let Some(s) = self.session_mut(key) else { return };
        let mut rels = Vec::new();
        let mut resend = Vec::new();
        for i in s.inflight.drain(..) {
            if i.released {
                rels.push(i);
            } else {
                let mut d = i.delivery;
                d.pkid = Some(i.pkid);
                d.dup = true;
                resend.push((d, i.held));
            }
        }
        // Queued messages are held; those from the retained backlog were not until now.
        let mut added = 0;
        for (d, held) in resend.into_iter().rev() {
            if !held {
                added += d.weight();
            }
            s.queue.push_front(d);
        }
        s.held_bytes += added;
        self.held_total += added;
        let Some(s) = self.session_mut(key) else { return };
        let pubrels: Vec<Outbound> = rels.iter().map(|i| Outbound::PubRel { pkid: i.pkid, reason: 0 }).collect();
        s.inflight.extend(rels);
        // A release made in this run may not be stored yet: wait for all that is pending.
        let op_id = if self.last_op > self.durable { self.last_op } else { 0 };
        for packet in pubrels {
            self.ack_when_stored(conn, packet, op_id, now);
        }
    }

    /// The glue's notice that the connection is gone: its socket closed, or the core closed
    /// it. A connection that went without DISCONNECT fires its will.
    pub fn closed(&mut self, conn: ConnId, now: Instant) {
        if self.conns.get(&conn).is_some_and(|c| !c.closing) {
            self.detach(conn, now);
        }
        if let Some(c) = self.conns.remove(&conn) {
            let key = c.session;
            if self.session(key).is_some_and(|s| s.conn == Some(conn)) {
                // Detached above; nothing holds the session any more.
                if let Some(s) = self.session_mut(key) {
                    s.conn = None;
                }
            }
        }
        self.woken.remove(&conn);
    }

    /// The session loses its connection: the will is published or delayed, and a session
    /// with expiry 0 ends ([MQTT-3.1.2-23] keeps the others).
    pub(super) fn detach(&mut self, conn: ConnId, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        let (key, will, rules) = (c.session, c.will.take(), c.rules.clone());
        let wall = self.wall_ms(now);
        let Some(s) = self.session_mut(key) else { return };
        if s.conn != Some(conn) {
            return;
        }
        s.conn = None;
        s.disconnected_at = Some(now);
        s.disconnected_ms = Some(wall);
        let expiry = s.expiry;
        // Publishers it held are read again: an offline session holds no one.
        self.drained(key, now);
        if let Some(Will { msg, delay, expiry: msg_expiry }) = will {
            if delay == 0 || expiry == 0 {
                self.publish_will(PendingWill { msg, expiry: msg_expiry, rules, due: now }, now);
            } else {
                let due = now + Duration::from_secs(u64::from(delay.min(expiry)));
                if let Some(s) = self.session_mut(key) {
                    s.pending_will = Some(PendingWill { msg, expiry: msg_expiry, rules, due });
                }
                self.wills.insert((due, key));
                self.store_will(key, now);
            }
        }
        match expiry {
            0 => self.end_session(key, now),
            u32::MAX => self.persist(key),
            secs => {
                self.schedule_expiry(key, now + Duration::from_secs(u64::from(secs)));
                self.persist(key);
            }
        }
    }

    /// Ends a session: its pending will goes now, its subscriptions and queue go.
    pub(super) fn end_session(&mut self, key: SessionKey, now: Instant) {
        self.cancel_expiry(key);
        self.store_forget(key);
        let Some(mut s) = self.sessions.get_mut(key as usize).and_then(Option::take) else { return };
        if let Some(will) = s.pending_will.take() {
            self.wills.remove(&(will.due, key));
            self.publish_will(will, now);
        }
        // Spool outcomes still owed to its QoS 2 publishes no longer find it.
        for p in self.pending.values_mut() {
            p.qos2.take_if(|(k, _)| *k == key);
        }
        for filter in s.subs.keys() {
            if let Some(f) = super::router::Filter::parse(filter) {
                self.router.unsubscribe(f, key);
            }
        }
        self.held_total = self.held_total.saturating_sub(s.held_bytes);
        let lost = s.queue.iter().chain(&s.retained_backlog).filter(|d| d.qos as u8 > 0).count()
            + s.inflight.iter().filter(|i| !i.released).count();
        if lost > 0 {
            self.metrics.dropped("session_ended", lost as u64);
        }
        self.by_client.remove(&s.client_id);
        self.free.push(key);
        self.metrics.sessions.set(self.by_client.len() as i64);
        self.metrics.subscriptions.set(self.router.len() as i64);
    }

    /// Publishes a will now: its Message Expiry Interval starts here (§3.1.3.2.4: it is sent as
    /// the Publication Expiry Interval when the server publishes it).
    pub(super) fn publish_will(&mut self, will: PendingWill, now: Instant) {
        tracing::debug!(topic = ?will.msg.topic, "publishing a will");
        self.metrics.wills.inc();
        if will.rules.as_ref().is_none_or(|r| r.may_publish(&will.msg.topic)) {
            let msg = match will.expiry {
                Some(secs) => Arc::new(Message {
                    expires_at: Some(now + Duration::from_secs(u64::from(secs))),
                    ..(*will.msg).clone()
                }),
                None => will.msg,
            };
            let _ = self.ingest(None, None, msg, None, self.last_op, now);
        }
    }
}
