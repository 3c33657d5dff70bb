//! What the core keeps per session and per connection.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use super::router::SubOptions;
use super::{ConnId, SessionKey, SessionRecord};
use crate::auth::Rules;
use crate::broker::codec::{Outbound, QoS, Version};
use crate::broker::message::{DELIVERY_SLOT, Message};

/// A durable session's id in the store; never reused, so a session that ended and one made
/// later under the same client id never mix.
pub type Sid = u64;

/// One message on its way to one session.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub msg: Arc<Message>,
    /// min(published, granted).
    pub qos: QoS,
    /// As published under Retain As Published, else 0; 1 for a retained message sent because
    /// of a new subscription.
    pub retain: bool,
    pub sub_ids: Vec<u32>,
    /// Its packet id once it has one: given when it is first sent, or (QoS 2 to a durable
    /// session) just before, so the id is stored before the client sees it.
    pub pkid: Option<u16>,
    /// It went out before (a resend after a reconnect or a restart): DUP.
    pub dup: bool,
    /// Its place in a durable session's stored queue; 0 when not stored.
    pub ord: u64,
    /// It goes out only once the session store committed this op (0: at once).
    pub hold: u64,
}

// `MESSAGE_COST` counts a queue's slot as this much; it must grow with the struct. Exact on
// 64-bit targets; a 32-bit one has a smaller struct, counted at the 64-bit size.
const _: () = assert!(
    size_of::<Delivery>() <= DELIVERY_SLOT
        && (cfg!(target_pointer_width = "32") || size_of::<Delivery>() == DELIVERY_SLOT),
    "message::DELIVERY_SLOT is Delivery's size"
);

impl Delivery {
    pub(crate) fn new(msg: Arc<Message>, qos: QoS, retain: bool, sub_ids: Vec<u32>) -> Self {
        Self { msg, qos, retain, sub_ids, pkid: None, dup: false, ord: 0, hold: 0 }
    }

    pub(crate) fn weight(&self) -> usize {
        self.msg.weight()
    }
}

/// A QoS 2 packet id received and not yet released.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Qos2In {
    /// The spool ticket its PUBREC still waits for: a resend waits for the same outcome, and
    /// any outcome but success forgets the id.
    pub ticket: Option<u64>,
    /// The session-store op its PUBREC waits for (a durable session's id is stored first).
    pub stored: u64,
    /// The receipt its message went to the spool under: a resend goes there again under it,
    /// and the spool, which holds the receipt with the message it took, takes it once (0: a
    /// session the store does not keep).
    pub receipt: u64,
}

/// A QoS 1 or 2 message sent and not yet acknowledged.
#[derive(Debug, Clone)]
pub(crate) struct Inflight {
    pub pkid: u16,
    pub delivery: Delivery,
    /// QoS 2 after its PUBREC: waiting for PUBCOMP.
    pub released: bool,
    /// Its bytes count against the session's bounds (it came from the queue, not from the
    /// retained backlog).
    pub held: bool,
}

/// A connection's will, as its CONNECT gave it.
#[derive(Debug, Clone)]
pub struct Will {
    /// With no expiry yet: the Message Expiry Interval counts from publication (§3.1.3.2.4).
    pub msg: Arc<Message>,
    /// Will Delay Interval, seconds.
    pub delay: u32,
    /// Message Expiry Interval, seconds.
    pub expiry: Option<u32>,
}

/// A will waiting for its delay to pass (§3.1.3.2.2).
#[derive(Debug, Clone)]
pub(crate) struct PendingWill {
    pub msg: Arc<Message>,
    pub expiry: Option<u32>,
    pub rules: Option<Arc<Rules>>,
    pub due: Instant,
}

#[derive(Debug)]
pub(crate) struct Session {
    /// Its id in the session store (see `durable.rs`).
    pub sid: Sid,
    /// The last `ord` given to a delivery stored for it.
    pub next_ord: u64,
    /// The store holds something of it: its end must forget it.
    pub persisted: bool,
    /// The store op of its record as last written: what a SUBACK or UNSUBACK reporting its
    /// subscriptions waits for, even one that changed nothing.
    pub record_op: u64,
    pub client_id: Arc<str>,
    pub owner: Arc<str>,
    /// The node's own SLO probe or model announcer.
    pub internal: bool,
    /// Seconds it outlives its connection; `u32::MAX`: never expires.
    pub expiry: u32,
    /// Every subscription by the filter the client wrote (`$share/...` included).
    pub subs: HashMap<String, SubOptions>,
    pub conn: Option<ConnId>,
    pub disconnected_at: Option<Instant>,
    /// While offline with a finite expiry: when it ends (its entry in the core's expiries).
    pub expires_at: Option<Instant>,
    /// Wall clock of the disconnect, for the stored record.
    pub disconnected_ms: Option<u64>,
    /// Retained messages a subscribe matched, sent before `queue`; bounded by the retained
    /// store's own bound, not the queue's.
    pub retained_backlog: VecDeque<Delivery>,
    /// Messages waiting to be sent (while connected: for room in flight).
    pub queue: VecDeque<Delivery>,
    /// Bytes of the messages in `queue` and in `inflight`: what the queue bounds count.
    pub held_bytes: usize,
    /// Oldest first.
    pub inflight: VecDeque<Inflight>,
    pub next_pkid: u16,
    /// Packet ids of QoS 2 publishes received whose PUBREL has not come: a resend of one is not
    /// delivered again ([MQTT-4.3.3-9]).
    pub qos2_in: HashMap<u16, Qos2In>,
    pub pending_will: Option<PendingWill>,
    /// Publishers this session's queue holds back (`backpressure.rs`).
    pub holding: Vec<ConnId>,
    /// It did not drain within a hold: it holds no publisher until its queue is half the bound.
    pub stalled: bool,
}

impl Session {
    pub(crate) fn new(sid: Sid, client_id: Arc<str>, owner: Arc<str>, internal: bool, expiry: u32) -> Self {
        Self {
            sid,
            next_ord: 0,
            persisted: false,
            record_op: 0,
            client_id,
            owner,
            internal,
            expiry,
            subs: HashMap::new(),
            conn: None,
            disconnected_at: None,
            expires_at: None,
            disconnected_ms: None,
            retained_backlog: VecDeque::new(),
            queue: VecDeque::new(),
            held_bytes: 0,
            inflight: VecDeque::new(),
            next_pkid: 0,
            qos2_in: HashMap::new(),
            pending_will: None,
            holding: Vec::new(),
            stalled: false,
        }
    }

    /// A packet id no message in flight uses ([MQTT-2.2.1-4]), nor one queued to go again with
    /// its id (after a reconnect, or numbered before it is sent): those are the queue's front.
    pub(crate) fn allocate_pkid(&mut self) -> u16 {
        loop {
            self.next_pkid = self.next_pkid % u16::MAX + 1;
            let id = self.next_pkid;
            let queued = || self.queue.iter().map_while(|d| d.pkid).any(|p| p == id);
            let backlog = || self.retained_backlog.front().and_then(|d| d.pkid) == Some(id);
            if !self.inflight.iter().any(|i| i.pkid == id) && !queued() && !backlog() {
                return id;
            }
        }
    }

    pub(crate) fn record(&self) -> SessionRecord {
        let mut subscriptions: Vec<(String, SubOptions)> = self.subs.iter().map(|(f, o)| (f.clone(), *o)).collect();
        subscriptions.sort_by(|a, b| a.0.cmp(&b.0));
        SessionRecord {
            sid: self.sid,
            client_id: self.client_id.to_string(),
            owner: self.owner.to_string(),
            expiry: self.expiry,
            subscriptions,
            disconnected_ms: self.disconnected_ms,
        }
    }

    /// The queue's bounds hold with `extra` more bytes and one more message (queued and in
    /// flight together).
    pub(crate) fn has_room(&self, extra: usize, max_messages: usize, max_bytes: usize) -> bool {
        self.queue.len() + self.inflight.len() < max_messages && self.held_bytes + extra <= max_bytes
    }

    /// Queues `d`; its bytes are held until it is sent (QoS 0) or acknowledged.
    pub(crate) fn push(&mut self, d: Delivery) {
        self.held_bytes += d.weight();
        self.queue.push_back(d);
    }

    /// The next message to send, and whether its bytes are held: retained messages a
    /// subscribe matched come first and are not (their store bounds them); the queue's are, and
    /// the caller releases them once sent or acknowledged.
    pub(crate) fn pop(&mut self) -> Option<(Delivery, bool)> {
        if let Some(d) = self.retained_backlog.pop_front() {
            return Some((d, false));
        }
        self.queue.pop_front().map(|d| (d, true))
    }

    pub(crate) fn front(&self) -> Option<&Delivery> {
        self.retained_backlog.front().or_else(|| self.queue.front())
    }

    pub(crate) fn front_mut(&mut self) -> Option<&mut Delivery> {
        match self.retained_backlog.front_mut() {
            Some(d) => Some(d),
            None => self.queue.front_mut(),
        }
    }

    /// Drops the oldest QoS 0 message queued; its weight, if there was one.
    pub(crate) fn drop_oldest_qos0(&mut self) -> Option<usize> {
        let at = self.queue.iter().position(|d| d.qos == QoS::AtMostOnce)?;
        let weight = self.queue.remove(at)?.weight();
        self.held_bytes -= weight;
        Some(weight)
    }
}

/// An acknowledgement owed to the client, in the order its publishes came ([MQTT-4.6.0-2],
/// [MQTT-4.6.0-3]).
#[derive(Debug)]
pub enum AckSlot {
    Ready(Outbound),
    /// Waits for the spool: the ack to send (QoS and packet id) once it answered, and then for
    /// the session store to have committed op `stored` (0: nothing to wait for).
    Waiting {
        ticket: u64,
        qos: QoS,
        pkid: u16,
        stored: u64,
    },
    /// Goes once the session store committed op `op_id` (see `durable.rs`).
    Stored {
        op_id: u64,
        packet: Outbound,
    },
}

#[derive(Debug)]
pub struct Conn {
    pub session: SessionKey,
    /// Nothing goes out, its CONNACK first among it, before the store committed this op: the
    /// discard of the durable session a Clean Start replaced (0: nothing to wait for).
    pub gate: u64,
    pub version: Version,
    /// Seconds, as in force (the client's, or the Server Keep Alive); 0: off.
    pub keep_alive: u16,
    pub last_seen: Instant,
    /// QoS 1 and 2 messages the client takes in flight: min(its Receive Maximum, ours).
    pub send_quota: u16,
    /// Largest packet the client takes.
    pub max_packet_out: usize,
    /// Topic aliases the client set ([MQTT-3.3.2-12]), at most our Topic Alias Maximum.
    pub aliases: HashMap<u16, Arc<str>>,
    /// QoS 1 and 2 publishes received and not yet fully acknowledged, for our Receive Maximum.
    pub unacked_in: u16,
    pub acks: VecDeque<AckSlot>,
    /// Packets other than queued messages, sent first.
    pub control: VecDeque<Outbound>,
    /// `None` for the node's own connections, which the ACL does not apply to.
    pub rules: Option<Arc<Rules>>,
    /// The connected client's identity ([`super::Identity::owner`]): whose rules a reload
    /// gives it.
    pub owner: Arc<str>,
    pub will: Option<Will>,
    /// The CONNECT's Session Expiry Interval was 0 (§3.14.2.2.2: a DISCONNECT may not raise it).
    pub expiry_was_zero: bool,
    /// A DISCONNECT was decided; only what is in `control` goes out before the socket closes.
    pub closing: bool,
    /// Held until then by the queue of that session (`backpressure.rs`): not read meanwhile,
    /// or with `acks_held`, read but not acknowledged.
    pub held: Option<(Instant, SessionKey)>,
    pub acks_held: bool,
}
