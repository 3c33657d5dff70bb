//! MQTT clients of a simulated edge: they speak packets (`Inbound`/`Outbound`, the codec's own
//! types) to the broker core, as a real client would over its socket: PUBLISH at QoS 0, 1 and
//! 2 with their flows, SUBSCRIBE, UNSUBSCRIBE, DISCONNECT, a connection dropped without one,
//! and a persistent session resumed with what it had in flight resent ([MQTT-4.4.0-1]).
//!
//! Each keeps what the broker acknowledged of its session (the subscriptions a SUBACK granted
//! and an UNSUBACK removed) and what it may not know (asked, the answer lost with the
//! connection), for the check that a session the broker says is present holds what was
//! acknowledged.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use edge_node::broker::codec::{
    Connect, Inbound, Outbound, PublishPacket, PublishProps, QoS, SubscribeRequest, Version,
};

/// A message a client received, as the checks see it.
#[derive(Debug, Clone)]
pub struct Delivered {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub dup: bool,
    pub retain: bool,
    pub response_topic: Option<String>,
    pub user_properties: usize,
}

/// What a client's packets told its side of the world.
#[derive(Debug, Clone)]
pub enum Heard {
    /// CONNACK: whether the session was present.
    Connected { session_present: bool },
    /// The broker took a publish of ours (PUBACK 0, PUBREC below 0x80): its tag and topic.
    Taken { tag: String, topic: String, qos: QoS },
    /// The broker refused a publish of ours with this reason.
    Refused { tag: String, reason: u8 },
    /// A message for the application (a QoS 2 resend of an id awaiting its PUBREL is not one).
    Delivered(Delivered),
    /// The broker closes the connection.
    Closing,
}

#[derive(Debug)]
enum Stage {
    /// QoS 1: PUBACK awaited; QoS 2: PUBREC awaited.
    Sent,
    /// QoS 2: PUBREL sent, PUBCOMP awaited.
    Released,
}

#[derive(Debug)]
struct Out {
    packet: PublishPacket,
    stage: Stage,
}

/// One client and its session as it knows it.
#[derive(Debug)]
pub struct Client {
    pub id: String,
    pub version: Version,
    /// Its session outlives its connection (Session Expiry above 0; 3.1.1: Clean Session 0).
    pub persistent: bool,
    pub conn: Option<edge_node::broker::core::ConnId>,
    /// Its CONNACK came on this connection.
    pub ready: bool,
    next_pkid: u16,
    /// Packets to send, in order, as the broker reads them.
    pub outbox: VecDeque<Inbound>,
    out: BTreeMap<u16, Out>,
    qos2_in: BTreeSet<u16>,
    /// SUBSCRIBE (false) and UNSUBSCRIBE (true) sent and not answered, by packet id.
    asked: BTreeMap<u16, (Vec<String>, bool)>,
    /// The subscriptions the broker acknowledged: filter and granted QoS.
    pub subs: BTreeMap<String, u8>,
    /// Filters asked about and not answered before a connection ended: the session may or may
    /// not hold them.
    pub unsure: BTreeSet<String>,
    /// Messages published, for unique payloads.
    pub published: u64,
}

impl Client {
    pub fn new(id: String, version: Version, persistent: bool) -> Self {
        Self {
            id,
            version,
            persistent,
            conn: None,
            ready: false,
            next_pkid: 0,
            outbox: VecDeque::new(),
            out: BTreeMap::new(),
            qos2_in: BTreeSet::new(),
            asked: BTreeMap::new(),
            subs: BTreeMap::new(),
            unsure: BTreeSet::new(),
            published: 0,
        }
    }

    /// The CONNECT to send; `clean` starts a new session even for a persistent client.
    pub fn connect_packet(&self, clean: bool) -> Connect {
        let expiry = match (self.persistent, self.version) {
            (false, _) => 0,
            (true, Version::V311) => u32::MAX,
            (true, Version::V5) => 3600,
        };
        Connect {
            version: self.version,
            client_id: self.id.clone(),
            clean_start: clean || !self.persistent,
            keep_alive: 0,
            session_expiry: expiry,
            receive_maximum: 32,
            max_packet_size: None,
            topic_alias_maximum: 0,
            request_problem_info: true,
            auth_method: None,
            will: None,
            username: None,
            password: None,
        }
    }

    fn pkid(&mut self) -> u16 {
        loop {
            self.next_pkid = self.next_pkid.wrapping_add(1).max(1);
            let id = self.next_pkid;
            if !self.out.contains_key(&id) && !self.asked.contains_key(&id) {
                return id;
            }
        }
    }

    /// Whether the client may start another exchange (its packet ids and the broker's Receive
    /// Maximum are not spent).
    pub fn has_room(&self) -> bool {
        self.out.len() + self.asked.len() < 24
    }

    /// Queues a PUBLISH of `payload` to `topic`.
    #[allow(clippy::too_many_arguments)]
    pub fn publish(&mut self, topic: &str, payload: Bytes, qos: QoS, retain: bool, props: PublishProps) {
        let pkid = if qos == QoS::AtMostOnce { 0 } else { self.pkid() };
        let packet = PublishPacket {
            dup: false,
            qos,
            retain,
            topic: Bytes::copy_from_slice(topic.as_bytes()),
            pkid,
            topic_alias: None,
            message_expiry: None,
            props,
            excess_user_properties: 0,
            payload,
        };
        if qos != QoS::AtMostOnce {
            self.out.insert(pkid, Out { packet: packet.clone(), stage: Stage::Sent });
        }
        self.published += 1;
        self.outbox.push_back(Inbound::Publish(packet));
    }

    pub fn subscribe(&mut self, filter: &str, qos: QoS) {
        let pkid = self.pkid();
        self.unsure.insert(filter.to_owned());
        self.asked.insert(pkid, (vec![filter.to_owned()], false));
        let filters = vec![SubscribeRequest {
            filter: filter.to_owned(),
            qos,
            no_local: false,
            retain_as_published: false,
            retain_handling: 0,
        }];
        self.outbox.push_back(Inbound::Subscribe { pkid, filters, id: None });
    }

    pub fn unsubscribe(&mut self, filter: &str) {
        let pkid = self.pkid();
        self.unsure.insert(filter.to_owned());
        self.asked.insert(pkid, (vec![filter.to_owned()], true));
        self.outbox.push_back(Inbound::Unsubscribe { pkid, filters: vec![filter.to_owned()] });
    }

    /// The connection is gone (closed by either side, or the node died): what was not sent
    /// stays unsent; a persistent session resends what is in flight when it resumes.
    pub fn lost(&mut self) {
        self.conn = None;
        self.ready = false;
        self.outbox.clear();
        // Answers that never came: the session may hold either.
        for (_, (filters, _)) in std::mem::take(&mut self.asked) {
            self.unsure.extend(filters);
        }
    }

    /// A packet from the broker; what it means for the client, and its answer queued.
    pub fn receive(&mut self, packet: Outbound) -> Option<Heard> {
        match packet {
            Outbound::ConnAck { session_present, code, .. } => {
                if code != 0 {
                    return Some(Heard::Closing);
                }
                self.ready = true;
                if !session_present {
                    // A new session: whatever the client kept of the old one is gone
                    // ([MQTT-3.1.2-4]); its unacknowledged publishes are not the broker's.
                    self.subs.clear();
                    self.unsure.clear();
                    self.out.clear();
                    self.qos2_in.clear();
                } else {
                    // [MQTT-4.4.0-1]: resend unacknowledged PUBLISH (with DUP) and PUBREL.
                    for (pkid, o) in &self.out {
                        let packet = match o.stage {
                            Stage::Sent => Inbound::Publish(PublishPacket { dup: true, ..o.packet.clone() }),
                            Stage::Released => Inbound::PubRel { pkid: *pkid },
                        };
                        self.outbox.push_back(packet);
                    }
                }
                Some(Heard::Connected { session_present })
            }
            Outbound::Publish { msg, qos, pkid, dup, retain, .. } => {
                let delivered = Delivered {
                    topic: msg.topic.to_string(),
                    payload: msg.payload.clone(),
                    qos,
                    dup,
                    retain,
                    response_topic: msg.props.response_topic.clone(),
                    user_properties: msg.props.user.len(),
                };
                match qos {
                    QoS::AtMostOnce => Some(Heard::Delivered(delivered)),
                    QoS::AtLeastOnce => {
                        self.outbox.push_back(Inbound::PubAck { pkid, reason: 0 });
                        Some(Heard::Delivered(delivered))
                    }
                    QoS::ExactlyOnce => {
                        self.outbox.push_back(Inbound::PubRec { pkid, reason: 0 });
                        // Method B of §4.3.3: a resend of an id awaiting its PUBREL is not
                        // delivered again.
                        self.qos2_in.insert(pkid).then_some(Heard::Delivered(delivered))
                    }
                }
            }
            Outbound::PubAck { pkid, reason } => {
                let o = self.out.remove(&pkid)?;
                Some(self.answered(o.packet, reason))
            }
            Outbound::PubRec { pkid, reason } => {
                if reason >= 0x80 {
                    let o = self.out.remove(&pkid)?;
                    return Some(self.answered(o.packet, reason));
                }
                let o = self.out.get_mut(&pkid)?;
                self.outbox.push_back(Inbound::PubRel { pkid });
                if matches!(o.stage, Stage::Released) {
                    return None;
                }
                o.stage = Stage::Released;
                let packet = o.packet.clone();
                Some(self.answered(packet, reason))
            }
            Outbound::PubRefused { pkid, reason, .. } => {
                let o = self.out.remove(&pkid)?;
                Some(self.answered(o.packet, reason))
            }
            Outbound::PubRel { pkid, .. } => {
                self.qos2_in.remove(&pkid);
                self.outbox.push_back(Inbound::PubComp { pkid });
                None
            }
            Outbound::PubComp { pkid, .. } => {
                self.out.remove(&pkid);
                None
            }
            Outbound::SubAck { pkid, codes } => {
                let (filters, _) = self.asked.remove(&pkid)?;
                for (filter, code) in filters.into_iter().zip(codes) {
                    if code <= 2 {
                        self.subs.insert(filter.clone(), code);
                    }
                    self.settle(&filter);
                }
                None
            }
            Outbound::UnsubAck { pkid, .. } => {
                let (filters, _) = self.asked.remove(&pkid)?;
                for filter in filters {
                    self.subs.remove(&filter);
                    self.settle(&filter);
                }
                None
            }
            Outbound::Disconnect { .. } => Some(Heard::Closing),
            Outbound::PingResp => None,
        }
    }

    /// An answer about `filter` came: it is sure unless another question about it is open.
    fn settle(&mut self, filter: &str) {
        if !self.asked.values().any(|(f, _)| f.iter().any(|f| f == filter)) {
            self.unsure.remove(filter);
        }
    }

    fn answered(&mut self, packet: PublishPacket, reason: u8) -> Heard {
        let tag = super::tag_of(&packet.payload).unwrap_or_default().to_owned();
        if reason < 0x80 {
            Heard::Taken { tag, topic: packet.topic_str().to_owned(), qos: packet.qos }
        } else {
            Heard::Refused { tag, reason }
        }
    }
}
