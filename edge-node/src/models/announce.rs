//! Tells local apps which model versions are current: a retained QoS1 message per model on
//! `<prefix>/<name>/current` (JSON: name, version, path, sha256, size), published through the
//! node's own front like any client's. The broker keeps retained messages only in memory, so
//! the node announces every model it holds at start, and again after each staging.

use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use rumqttd::protocol::{Connect, Packet};

use super::Current;
use crate::front::{self, FrontContext, packet};
use crate::probe::{ProbeError, read, write, write_raw};

fn retained_qos1(topic: &str, pkid: u16, payload: &[u8]) -> BytesMut {
    let remaining = 2 + topic.len() + 2 + payload.len();
    let mut out = BytesMut::with_capacity(remaining + 5);
    out.put_u8((packet::PUBLISH << 4) | 0b0011);
    packet::put_varint(&mut out, remaining);
    out.put_u16(topic.len() as u16);
    out.put_slice(topic.as_bytes());
    out.put_u16(pkid);
    out.put_slice(payload);
    out
}

/// Publishes through the node's front on behalf of the model syncer.
#[derive(Clone)]
pub struct Announcer {
    pub(crate) ctx: Arc<FrontContext>,
    pub prefix: String,
    pub node_id: String,
}

impl std::fmt::Debug for Announcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Announcer").field("prefix", &self.prefix).finish()
    }
}

impl Announcer {
    /// Publishes `currents` retained on `<prefix>/<name>/current` and waits for their PUBACKs.
    pub(crate) async fn announce(&self, currents: &[Current]) -> Result<(), ProbeError> {
        let (ctx, prefix, node_id) = (&self.ctx, &self.prefix, &self.node_id);
        if currents.is_empty() {
            return Ok(());
        }
        let (mut io, server) = tokio::io::duplex(64 * 1024);
        let serving = ctx.tracker.spawn(front::serve_internal(server, ctx.clone()));
        let result = async {
            let mut buf = BytesMut::with_capacity(1024);
            let connect = Connect { keep_alive: 60, client_id: format!("_models-{node_id}"), clean_session: true };
            write(&mut io, Packet::Connect(connect, None, None, None, None)).await?;
            let connack = read(&mut io, &mut buf).await?;
            if packet::packet_type(&connack) != packet::CONNACK || connack.get(3) != Some(&0) {
                return Err(ProbeError::Unexpected("CONNACK refused"));
            }
            for (i, c) in currents.iter().enumerate() {
                let topic = format!("{prefix}/{}/current", c.name);
                let payload = serde_json::to_vec(c).map_err(|e| ProbeError::Codec(e.to_string()))?;
                write_raw(&mut io, &retained_qos1(&topic, i as u16 + 1, &payload)).await?;
                if packet::packet_type(&read(&mut io, &mut buf).await?) != packet::PUBACK {
                    return Err(ProbeError::Unexpected("PUBACK missing"));
                }
                tracing::info!(model = c.name, version = c.version, topic, "model announced");
            }
            // DISCONNECT, no properties.
            write_raw(&mut io, &[packet::DISCONNECT << 4, 0]).await
        }
        .await;
        serving.abort();
        result
    }
}
