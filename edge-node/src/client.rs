//! An in-process MQTT client of the node's own broker, for the node's own jobs: the SLO probe
//! (`probe`) and the model announcer (`models::announce`). Its API is what those jobs need:
//! connect, subscribe, publish, and the next thing the broker sends. It talks to the broker
//! core directly, as a connection of its own with the internal identity: no socket, no
//! encoding; the core treats it as any MQTT 5 client otherwise.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::broker::codec::{self, Inbound, Outbound, PublishPacket, PublishProps, QoS, SubscribeRequest, Version};
use crate::broker::core::{self, ConnId, ConnectRequest};
use crate::broker::driver::{BrokerHandle, Wakers};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("the broker closed the connection")]
    Closed,
    #[error("the broker refused the connection (reason {0:#04x})")]
    Refused(u8),
    #[error("unexpected packet: {0}")]
    Unexpected(&'static str),
    #[error("codec: {0}")]
    Codec(String),
}

/// Opens in-process connections to the node's broker.
#[derive(Debug, Clone)]
pub(crate) struct Connector {
    broker: Arc<BrokerHandle>,
}

impl Connector {
    pub(crate) fn new(broker: Arc<BrokerHandle>) -> Self {
        Self { broker }
    }

    /// Connects with a clean session as `client_id` and waits for the CONNACK.
    pub async fn connect(&self, client_id: &str) -> Result<LocalClient, ClientError> {
        let (conn, wakers) = self.broker.register();
        let connect = codec::Connect {
            version: Version::V5,
            client_id: client_id.to_owned(),
            clean_start: true,
            keep_alive: 0,
            session_expiry: 0,
            receive_maximum: u16::MAX,
            max_packet_size: None,
            topic_alias_maximum: 0,
            request_problem_info: true,
            auth_method: None,
            will: None,
            username: None,
            password: None,
        };
        let identity = core::Identity { owner: "internal".into(), internal: true, rules: None };
        let mut client = LocalClient {
            broker: self.broker.clone(),
            conn,
            wakers,
            inbox: VecDeque::new(),
            early: VecDeque::new(),
            next_pkid: 0,
        };
        let (admitted, routed) =
            self.broker.with(|b| b.connect(ConnectRequest { conn, connect, identity }, Instant::now()));
        self.broker.run_spool(routed).await;
        admitted.map_err(|r| ClientError::Refused(r.code))?;
        match client.recv_packet().await? {
            Outbound::ConnAck { code: 0, .. } => Ok(client),
            Outbound::ConnAck { code, .. } => Err(ClientError::Refused(code)),
            _ => Err(ClientError::Unexpected("no CONNACK first")),
        }
    }
}

/// What the broker sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// A message for a subscription; a QoS1 one is acknowledged by the client.
    Message(Message),
    /// The broker acknowledged the QoS1 publish with this packet id.
    PubAck(u16),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub topic: Bytes,
    pub payload: Bytes,
    pub qos: u8,
    pub retain: bool,
    /// When the client took it from the broker.
    pub received: Instant,
}

/// One in-process connection. Dropping it ends the connection.
#[derive(Debug)]
pub(crate) struct LocalClient {
    broker: Arc<BrokerHandle>,
    conn: ConnId,
    wakers: Arc<Wakers>,
    /// Packets taken from the core and not yet looked at.
    inbox: VecDeque<Outbound>,
    /// Events that came while `subscribe` waited for its SUBACK.
    early: VecDeque<Event>,
    next_pkid: u16,
}

impl LocalClient {
    /// Subscribes to `filter` at QoS1 and waits for the SUBACK.
    pub(crate) async fn subscribe(&mut self, filter: &str) -> Result<(), ClientError> {
        let pkid = self.pkid();
        let request = SubscribeRequest {
            filter: filter.to_owned(),
            qos: QoS::AtLeastOnce,
            no_local: false,
            retain_as_published: false,
            retain_handling: 2,
        };
        self.send(Inbound::Subscribe { pkid, filters: vec![request], id: None }).await;
        loop {
            match self.recv_packet().await? {
                Outbound::SubAck { codes, .. } if codes.first().is_some_and(|c| *c <= 2) => return Ok(()),
                Outbound::SubAck { codes, .. } => {
                    return Err(ClientError::Refused(codes.first().copied().unwrap_or(0x80)));
                }
                other => {
                    if let Some(event) = self.event(other) {
                        self.early.push_back(event);
                    }
                }
            }
        }
    }

    /// Publishes `payload` on `topic` at QoS1 without waiting; its PUBACK comes as
    /// [`Event::PubAck`] with the returned packet id.
    pub async fn publish(&mut self, topic: &str, payload: &[u8], retain: bool) -> Result<u16, ClientError> {
        let pkid = self.pkid();
        let packet = PublishPacket {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain,
            topic: Bytes::copy_from_slice(topic.as_bytes()),
            pkid,
            topic_alias: None,
            message_expiry: None,
            props: PublishProps::default(),
            excess_user_properties: 0,
            payload: Bytes::copy_from_slice(payload),
        };
        self.send(Inbound::Publish(packet)).await;
        Ok(pkid)
    }

    /// Publishes and waits for the PUBACK; messages that come meanwhile are let go.
    pub(crate) async fn publish_acked(&mut self, topic: &str, payload: &[u8], retain: bool) -> Result<(), ClientError> {
        let pkid = self.publish(topic, payload, retain).await?;
        loop {
            match self.next().await? {
                Event::PubAck(acked) if acked == pkid => return Ok(()),
                Event::PubAck(_) => return Err(ClientError::Unexpected("PUBACK for another publish")),
                Event::Message(_) => {}
            }
        }
    }

    /// The next message or acknowledgement. Cancel-safe: what was taken from the broker stays
    /// in the client.
    pub(crate) async fn next(&mut self) -> Result<Event, ClientError> {
        if let Some(event) = self.early.pop_front() {
            return Ok(event);
        }
        loop {
            let packet = self.recv_packet().await?;
            if let Some(event) = self.event(packet) {
                return Ok(event);
            }
        }
    }

    /// Sends DISCONNECT: the broker drops the session without firing a will.
    pub(crate) async fn disconnect(mut self) -> Result<(), ClientError> {
        self.send(Inbound::Disconnect { reason: 0, session_expiry: None }).await;
        Ok(())
    }

    /// What a packet means to the client; a QoS1 message is acknowledged here.
    fn event(&mut self, packet: Outbound) -> Option<Event> {
        match packet {
            Outbound::Publish { msg, qos, pkid, retain, .. } => {
                if qos != QoS::AtMostOnce {
                    let conn = self.conn;
                    let _ = self.broker.with(|b| b.handle(conn, Inbound::PubAck { pkid, reason: 0 }, Instant::now()));
                }
                Some(Event::Message(Message {
                    topic: Bytes::copy_from_slice(msg.topic.as_bytes()),
                    payload: msg.payload.clone(),
                    qos: qos as u8,
                    retain,
                    received: Instant::now(),
                }))
            }
            Outbound::PubAck { pkid, .. } | Outbound::PubRefused { pkid, qos2: false, .. } => Some(Event::PubAck(pkid)),
            _ => None,
        }
    }

    async fn send(&mut self, packet: Inbound) {
        let conn = self.conn;
        let (_, spool) = self.broker.with(|b| b.handle(conn, packet, Instant::now()));
        self.broker.run_spool(spool).await;
    }

    async fn recv_packet(&mut self) -> Result<Outbound, ClientError> {
        loop {
            if let Some(packet) = self.inbox.pop_front() {
                return match packet {
                    Outbound::Disconnect { .. } => Err(ClientError::Closed),
                    other => Ok(other),
                };
            }
            let conn = self.conn;
            let (t, _) = self.broker.with(|b| b.poll_transmit(conn, Instant::now(), 64 * 1024));
            let closing = t.closing;
            self.inbox.extend(t.packets);
            if self.inbox.is_empty() {
                if closing {
                    return Err(ClientError::Closed);
                }
                self.wakers.writer.notified().await;
            }
        }
    }

    fn pkid(&mut self) -> u16 {
        self.next_pkid = self.next_pkid % u16::MAX + 1;
        self.next_pkid
    }
}

impl Drop for LocalClient {
    fn drop(&mut self) {
        // An internal session has no will and no expiry: nothing it leaves goes to the spool.
        self.broker.forget(self.conn);
    }
}

/// Runs `session` (one connection of a node's own client: the probe, `$SYS`) until `shutdown`,
/// again a second after each end, logging why it ended as `what`.
pub(crate) async fn keep_running<F, Fut>(what: &str, shutdown: &tokio_util::sync::CancellationToken, mut session: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), ClientError>>,
{
    loop {
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = session() => r,
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "{what} ended; reconnecting");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}
