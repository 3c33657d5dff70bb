//! The core driven without sockets or sleeping, one test per normative statement of the OASIS
//! MQTT 5.0 specification it checks (MQTT 3.1.1 ids where only 3.1.1 says it, or where the two
//! differ; both are named in the doc comment). The virtual clock is `Harness::advance`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::*;
use crate::broker::codec::{
    ConnAckProps, Connect, Inbound, Outbound, PublishPacket, PublishProps, QoS, SubscribeRequest, Version,
};
use crate::broker::metrics::BrokerMetrics;
use crate::route::{Class, Governance, Route};
use crate::spool::{Durability, Lane};

pub(crate) struct Harness {
    pub b: Broker,
    pub now: Instant,
    next_conn: u64,
    pub spooled: Vec<SpoolRequest>,
    /// Every store op the core made, in order, in the groups the glue would send together
    /// (what one call on the core made).
    pub stored: Vec<Vec<(u64, StoreOp)>>,
    /// While set, store ops are not reported committed (`commit_store` does it).
    pub hold_store: bool,
    /// Held publishers the core resumed, in order.
    pub resumed: Vec<ConnId>,
    /// The wall clock the core reads `now` against, kept across restarts.
    pub wall: WallClock,
    /// QoS 2 receipts the core let the spool forget, in order.
    pub forgotten: Vec<u64>,
}

pub(crate) fn connect_packet(client_id: &str, version: Version) -> Connect {
    Connect {
        version,
        client_id: client_id.into(),
        clean_start: true,
        keep_alive: 60,
        session_expiry: 0,
        receive_maximum: u16::MAX,
        max_packet_size: None,
        topic_alias_maximum: 0,
        request_problem_info: true,
        auth_method: None,
        will: None,
        username: None,
        password: None,
    }
}

pub(crate) fn publish(topic: &str, qos: QoS, pkid: u16, payload: &str) -> Inbound {
    Inbound::Publish(PublishPacket {
        dup: false,
        qos,
        retain: false,
        topic: Bytes::copy_from_slice(topic.as_bytes()),
        pkid,
        topic_alias: None,
        message_expiry: None,
        props: PublishProps::default(),
        excess_user_properties: 0,
        payload: Bytes::copy_from_slice(payload.as_bytes()),
    })
}

pub(crate) fn retained(topic: &str, payload: &str) -> Inbound {
    let Inbound::Publish(mut p) = publish(topic, QoS::AtMostOnce, 0, payload) else { unreachable!() };
    p.retain = true;
    Inbound::Publish(p)
}

pub(crate) fn sub(pkid: u16, filter: &str, qos: QoS) -> Inbound {
    Inbound::Subscribe { pkid, filters: vec![sub_req(filter, qos)], id: None }
}

pub(crate) fn sub_req(filter: &str, qos: QoS) -> SubscribeRequest {
    SubscribeRequest { filter: filter.into(), qos, no_local: false, retain_as_published: false, retain_handling: 0 }
}

/// The payloads of the PUBLISHes among `packets`.
pub(crate) fn payloads(packets: &[Outbound]) -> Vec<String> {
    packets
        .iter()
        .filter_map(|p| match p {
            Outbound::Publish { msg, .. } => Some(String::from_utf8_lossy(&msg.payload).into_owned()),
            _ => None,
        })
        .collect()
}

pub(crate) fn publishes(packets: &[Outbound]) -> Vec<&Outbound> {
    packets.iter().filter(|p| matches!(p, Outbound::Publish { .. })).collect()
}

pub(crate) fn user(name: &str) -> Identity {
    Identity { owner: format!("user:{name}").into(), internal: false, rules: None }
}

impl Harness {
    pub(crate) fn new() -> Self {
        Self::with(Limits::default(), Classes::default())
    }

    pub(crate) fn with(limits: Limits, classes: Classes) -> Self {
        let metrics = BrokerMetrics::new(&mut Default::default());
        let now = Instant::now();
        let wall = WallClock { at: now, ms: shared::units::now_ms() };
        Self {
            b: Broker::new(limits, Arc::new(classes), metrics, wall),
            now,
            wall,
            next_conn: 0,
            spooled: Vec::new(),
            stored: Vec::new(),
            hold_store: false,
            resumed: Vec::new(),
            forgotten: Vec::new(),
        }
    }

    #[cfg(feature = "schema")]
    pub(crate) fn with_schemas(mut self, v: Arc<crate::schema::Validator>) -> Self {
        self.b = self.b.with_schemas(v);
        self
    }

    pub(crate) fn limits(f: impl FnOnce(&mut Limits)) -> Self {
        let mut limits = Limits::default();
        f(&mut limits);
        Self::with(limits, Classes::default())
    }

    pub(crate) fn drain(&mut self) {
        loop {
            let mut group = Vec::new();
            while let Some(a) = self.b.poll_action() {
                match a {
                    Action::Wake(_) => {}
                    Action::Resume(conn) => self.resumed.push(conn),
                    Action::Spool(r) => self.spooled.push(*r),
                    Action::ForgetReceipts(keys) => self.forgotten.extend(keys),
                    Action::Store { op_id, op } => group.push((op_id, op)),
                }
            }
            if !group.is_empty() {
                self.stored.push(group);
            }
            if self.hold_store || self.b.last_op() == self.committed() {
                return;
            }
            self.commit_store();
        }
    }

    /// The store reports every op so far committed.
    pub(crate) fn commit_store(&mut self) {
        let last = self.b.last_op();
        self.b.stored(last, self.now);
    }

    fn committed(&self) -> u64 {
        self.b.durable
    }

    /// Every store op made so far, in order.
    pub(crate) fn ops(&self) -> impl Iterator<Item = &StoreOp> {
        self.stored.iter().flatten().map(|(_, op)| op)
    }

    /// The session records stored, in order.
    pub(crate) fn persisted(&self) -> Vec<&SessionRecord> {
        self.ops()
            .filter_map(|op| match op {
                StoreOp::Session(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    /// Connects and returns the connection and what it was sent (the CONNACK first).
    pub(crate) fn try_connect(
        &mut self,
        c: Connect,
        identity: Identity,
    ) -> Result<(ConnId, Vec<Outbound>), super::connect::Refusal> {
        self.next_conn += 1;
        let conn = ConnId(self.next_conn);
        self.b.connect(ConnectRequest { conn, connect: c, identity }, self.now)?;
        self.drain();
        Ok((conn, self.recv(conn)))
    }

    pub(crate) fn connect_as(&mut self, c: Connect, identity: Identity) -> (ConnId, Vec<Outbound>) {
        self.try_connect(c, identity).unwrap_or_else(|r| panic!("CONNECT refused: {r:?}"))
    }

    pub fn connect(&mut self, client_id: &str, version: Version) -> ConnId {
        self.connect_as(connect_packet(client_id, version), user("u")).0
    }

    pub fn send(&mut self, conn: ConnId, packet: Inbound) {
        self.b.handle(conn, packet, self.now);
        self.drain();
    }

    /// Everything the connection has to send, as its writer would take it: again after each
    /// store commit that let more go.
    pub(crate) fn recv(&mut self, conn: ConnId) -> Vec<Outbound> {
        let mut out = Vec::new();
        loop {
            let t = self.b.poll_transmit(conn, self.now, usize::MAX);
            self.drain();
            if t.packets.is_empty() {
                return out;
            }
            out.extend(t.packets);
        }
    }

    pub(crate) fn closing(&mut self, conn: ConnId) -> bool {
        self.b.is_closing(conn)
    }

    /// The connection is lost without DISCONNECT.
    pub(crate) fn drop_conn(&mut self, conn: ConnId) {
        self.b.closed(conn, self.now);
        self.drain();
    }

    pub(crate) fn advance(&mut self, by: Duration) {
        self.now += by;
        self.b.handle_timeout(self.now);
        self.drain();
    }

    pub(crate) fn connack(packets: &[Outbound]) -> (bool, u8, ConnAckProps) {
        match packets.first() {
            Some(Outbound::ConnAck { session_present, code, props }) => (*session_present, *code, (**props).clone()),
            other => panic!("no CONNACK first: {other:?}"),
        }
    }
}

pub(crate) fn with_will(client_id: &str, topic: &str, delay: u32) -> Connect {
    let mut c = connect_packet(client_id, Version::V5);
    c.will = Some(crate::broker::codec::Will {
        topic: topic.into(),
        payload: Bytes::from_static(b"gone"),
        qos: QoS::AtLeastOnce,
        retain: false,
        delay,
        expiry: None,
        props: PublishProps::default(),
    });
    c
}

pub(crate) fn sub_with(pkid: u16, filter: &str, qos: QoS, f: impl FnOnce(&mut SubscribeRequest)) -> Inbound {
    let mut r = sub_req(filter, qos);
    f(&mut r);
    Inbound::Subscribe { pkid, filters: vec![r], id: None }
}

mod backpressure;
mod connect;
mod downlink;
pub(crate) mod durable;
mod flow;
mod model;
mod namespace;
mod publish;
mod revoke;
mod routing;
#[cfg(feature = "schema")]
mod schema;
mod subscribe;
mod wills;
