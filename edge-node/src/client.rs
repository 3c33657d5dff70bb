//! An in-process MQTT client of the node's own broker, for the node's own jobs: the SLO probe
//! (`probe`) and the model announcer (`models::announce`). Its API is what those jobs need:
//! connect, subscribe, publish, and the next thing the broker sends. The transport is an
//! in-memory pipe served by the front like any connection, as the trusted internal identity,
//! speaking MQTT 3.1.1; a direct path into the broker can replace it behind the same API.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rumqttd::protocol::{Connect, Filter, Packet, Protocol, QoS, RetainForwardRule, Subscribe, v4::V4};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_util::task::AbortOnDropHandle;

use crate::front::{self, FrontContext, packet};

/// Bytes the pipe buffers each way.
const PIPE_BYTES: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connection to the front closed")]
    Closed,
    #[error("unexpected packet: {0}")]
    Unexpected(&'static str),
    #[error("codec: {0}")]
    Codec(String),
}

/// Opens in-process connections to the node's broker.
#[derive(Clone)]
pub struct Connector {
    ctx: Arc<FrontContext>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").finish_non_exhaustive()
    }
}

impl Connector {
    pub fn new(ctx: Arc<FrontContext>) -> Self {
        Self { ctx }
    }

    /// Connects with a clean session as `client_id` and waits for the CONNACK.
    pub async fn connect(&self, client_id: &str) -> Result<LocalClient, ClientError> {
        let (io, server) = tokio::io::duplex(PIPE_BYTES);
        let serving = self.ctx.tracker.spawn(front::serve_internal(server, self.ctx.clone()));
        let mut client = LocalClient {
            io,
            buf: BytesMut::with_capacity(4096),
            pending: BytesMut::new(),
            next_pkid: 0,
            _serving: AbortOnDropHandle::new(serving),
        };
        let connect = Connect { keep_alive: 60, client_id: client_id.to_owned(), clean_session: true };
        client.write(Packet::Connect(connect, None, None, None, None)).await?;
        let connack = client.read_frame().await?;
        if packet::packet_type(&connack) != packet::CONNACK || connack.get(3) != Some(&0) {
            return Err(ClientError::Unexpected("CONNACK refused"));
        }
        Ok(client)
    }
}

/// What the broker sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message for a subscription; a QoS1 one is acknowledged by the client.
    Message(Message),
    /// The broker acknowledged the QoS1 publish with this packet id.
    PubAck(u16),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub topic: Bytes,
    pub payload: Bytes,
    pub qos: u8,
    pub retain: bool,
    /// When the client read it.
    pub received: Instant,
}

/// One in-process connection. Dropping it ends the connection.
#[derive(Debug)]
pub struct LocalClient {
    io: DuplexStream,
    buf: BytesMut,
    /// PUBACKs owed to the broker, written before the client's next read or publish.
    pending: BytesMut,
    next_pkid: u16,
    _serving: AbortOnDropHandle<()>,
}

impl LocalClient {
    /// Subscribes to `filter` at QoS1 and waits for the SUBACK.
    pub async fn subscribe(&mut self, filter: &str) -> Result<(), ClientError> {
        let filter = Filter {
            path: filter.to_owned(),
            qos: QoS::AtLeastOnce,
            nolocal: false,
            preserve_retain: false,
            retain_forward_rule: RetainForwardRule::Never,
        };
        let pkid = self.pkid();
        self.write(Packet::Subscribe(Subscribe { pkid, filters: vec![filter] }, None)).await?;
        if packet::packet_type(&self.read_frame().await?) != packet::SUBACK {
            return Err(ClientError::Unexpected("SUBACK missing"));
        }
        Ok(())
    }

    /// Publishes `payload` on `topic` at QoS1 without waiting; its PUBACK comes as
    /// [`Event::PubAck`] with the returned packet id.
    pub async fn publish(&mut self, topic: &str, payload: &[u8], retain: bool) -> Result<u16, ClientError> {
        self.flush_pending().await?;
        let pkid = self.pkid();
        // rumqttd's `Publish` keeps QoS and packet id private, so the frame is written here.
        let remaining = 2 + topic.len() + 2 + payload.len();
        let mut out = BytesMut::with_capacity(remaining + 5);
        out.put_u8((packet::PUBLISH << 4) | 0b0010 | u8::from(retain));
        packet::put_varint(&mut out, remaining);
        out.put_u16(topic.len() as u16);
        out.put_slice(topic.as_bytes());
        out.put_u16(pkid);
        out.put_slice(payload);
        self.io.write_all(&out).await.map_err(|_| ClientError::Closed)?;
        Ok(pkid)
    }

    /// The next message or acknowledgement. Cancel-safe: bytes read stay buffered.
    pub async fn next(&mut self) -> Result<Event, ClientError> {
        loop {
            self.flush_pending().await?;
            let frame = self.read_frame().await?;
            match packet::packet_type(&frame) {
                packet::PUBLISH => {
                    let received = Instant::now();
                    let view = packet::parse_publish(&frame, packet::Version::V311)
                        .map_err(|e| ClientError::Codec(e.to_string()))?;
                    if view.qos == 1 {
                        packet::write_ack(&mut self.pending, packet::PUBACK, view.pkid, 0, packet::Version::V311);
                    }
                    let start = packet::body_start(&frame) + 2 + view.topic.len() + if view.qos > 0 { 2 } else { 0 };
                    let topic = frame.slice_ref(view.topic);
                    return Ok(Event::Message(Message {
                        topic,
                        payload: frame.slice(start.min(frame.len())..),
                        qos: view.qos,
                        retain: view.retain,
                        received,
                    }));
                }
                packet::PUBACK => {
                    let pkid = packet::ack_pkid(&frame).ok_or(ClientError::Unexpected("short PUBACK"))?;
                    return Ok(Event::PubAck(pkid));
                }
                packet::PINGRESP | packet::SUBACK => {}
                packet::DISCONNECT => return Err(ClientError::Closed),
                _ => return Err(ClientError::Unexpected("packet")),
            }
        }
    }

    /// Sends DISCONNECT, so the broker drops the session without firing a will.
    pub async fn disconnect(mut self) -> Result<(), ClientError> {
        self.flush_pending().await?;
        self.io.write_all(&[packet::DISCONNECT << 4, 0]).await.map_err(|_| ClientError::Closed)
    }

    fn pkid(&mut self) -> u16 {
        self.next_pkid = self.next_pkid % u16::MAX + 1;
        self.next_pkid
    }

    async fn write(&mut self, packet: Packet) -> Result<(), ClientError> {
        let mut out = BytesMut::with_capacity(64);
        V4.write(packet, &mut out).map_err(|e| ClientError::Codec(e.to_string()))?;
        self.io.write_all(&out).await.map_err(|_| ClientError::Closed)
    }

    /// Writes owed PUBACKs; each `write` either lands whole or not at all, so a cancelled flush
    /// leaves `pending` consistent.
    async fn flush_pending(&mut self) -> Result<(), ClientError> {
        while !self.pending.is_empty() {
            let n = self.io.write(&self.pending).await.map_err(|_| ClientError::Closed)?;
            if n == 0 {
                return Err(ClientError::Closed);
            }
            self.pending.advance(n);
        }
        Ok(())
    }

    async fn read_frame(&mut self) -> Result<Bytes, ClientError> {
        loop {
            if let Some(len) =
                packet::frame_len(&self.buf, usize::MAX).map_err(|e| ClientError::Codec(e.to_string()))?
            {
                return Ok(self.buf.split_to(len).freeze());
            }
            if self.io.read_buf(&mut self.buf).await.map_err(|_| ClientError::Closed)? == 0 {
                return Err(ClientError::Closed);
            }
        }
    }
}
