//! The SLO probe: an in-process MQTT client that publishes timestamped QoS1 messages on a
//! reserved topic, through the same front and broker as every client, and records how long each
//! takes to come back. Its histogram is the node's local publish-to-deliver latency as users see
//! it, minus only the client's own socket. The first message of each probe session is a
//! warm-up (rumqttd creates the filter's log when it arrives) and is not recorded.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use rumqttd::protocol::{Connect, Filter, Packet, Protocol, QoS, RetainForwardRule, Subscribe, v4::V4};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_util::sync::CancellationToken;

use crate::config::ProbeConfig;
use crate::front::{self, FrontContext, packet};

/// A probe message not back within this time is counted lost.
const LOST_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error("connection to the front closed")]
    Closed,
    #[error("unexpected packet {0}")]
    Unexpected(&'static str),
    #[error("codec: {0}")]
    Codec(String),
}

/// Runs the probe until `shutdown`, reconnecting after a failure.
pub async fn run(ctx: Arc<FrontContext>, config: ProbeConfig, node_id: String, shutdown: CancellationToken) {
    loop {
        let (client, server) = tokio::io::duplex(256 * 1024);
        let serving = ctx.tracker.spawn(front::serve_internal(server, ctx.clone()));
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = session(client, &ctx, &config, &node_id) => r,
        };
        serving.abort();
        if let Err(e) = result {
            tracing::warn!(error = %e, "SLO probe session ended; reconnecting");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

async fn session(
    mut io: DuplexStream,
    ctx: &FrontContext,
    config: &ProbeConfig,
    node_id: &str,
) -> Result<(), ProbeError> {
    let mut buf = BytesMut::with_capacity(4096);
    let connect = Connect { keep_alive: 60, client_id: format!("_probe-{node_id}"), clean_session: true };
    write(&mut io, Packet::Connect(connect, None, None, None, None)).await?;
    let connack = read(&mut io, &mut buf).await?;
    if packet::packet_type(&connack) != packet::CONNACK || connack.get(3) != Some(&0) {
        return Err(ProbeError::Unexpected("CONNACK refused"));
    }
    let filter = Filter {
        path: config.topic.clone(),
        qos: QoS::AtLeastOnce,
        nolocal: false,
        preserve_retain: false,
        retain_forward_rule: RetainForwardRule::Never,
    };
    write(&mut io, Packet::Subscribe(Subscribe { pkid: 1, filters: vec![filter] }, None)).await?;
    if packet::packet_type(&read(&mut io, &mut buf).await?) != packet::SUBACK {
        return Err(ProbeError::Unexpected("SUBACK missing"));
    }

    let metrics = &ctx.metrics;
    let mut ticker = tokio::time::interval(config.interval.0);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut seq: u64 = 0;
    let mut outstanding: VecDeque<(u64, Instant)> = VecDeque::new();
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                seq += 1;
                let pkid = (seq % u64::from(u16::MAX)) as u16 + 1;
                outstanding.push_back((seq, Instant::now()));
                write_raw(&mut io, &publish_qos1(&config.topic, pkid, seq)).await?;
                metrics.probe_sent.inc();
                while outstanding.front().is_some_and(|(_, at)| at.elapsed() > LOST_AFTER) {
                    outstanding.pop_front();
                    metrics.probe_lost.inc();
                }
            }
            frame = read(&mut io, &mut buf) => {
                let frame = frame?;
                match packet::packet_type(&frame) {
                    packet::PUBLISH => {
                        let received = Instant::now();
                        let view = packet::parse_publish(&frame, packet::Version::V311)
                            .map_err(|e| ProbeError::Codec(e.to_string()))?;
                        if view.qos == 1 {
                            let mut ack = BytesMut::with_capacity(4);
                            packet::write_ack(&mut ack, packet::PUBACK, view.pkid, 0, packet::Version::V311);
                            write_raw(&mut io, &ack).await?;
                        }
                        // The payload is the last 8 bytes: the sequence number.
                        let Some(tail) = frame.len().checked_sub(8).map(|at| &frame[at..]) else { continue };
                        let got = u64::from_be_bytes(tail.try_into().unwrap_or_default());
                        if let Some(i) = outstanding.iter().position(|(s, _)| *s == got) {
                            let (_, sent) = outstanding.remove(i).unwrap_or((got, received));
                            if got > 1 {
                                metrics.probe_delivered(received - sent);
                            }
                        }
                    }
                    packet::PUBACK | packet::PINGRESP => {}
                    packet::DISCONNECT => return Err(ProbeError::Closed),
                    _ => return Err(ProbeError::Unexpected("packet")),
                }
            }
        }
    }
}

/// Writes one packet to an internal connection (also used to announce models).
pub(crate) async fn write(io: &mut DuplexStream, packet: Packet) -> Result<(), ProbeError> {
    let mut out = BytesMut::with_capacity(64);
    V4.write(packet, &mut out).map_err(|e| ProbeError::Codec(e.to_string()))?;
    write_raw(io, &out).await
}

pub(crate) async fn write_raw(io: &mut DuplexStream, bytes: &[u8]) -> Result<(), ProbeError> {
    io.write_all(bytes).await.map_err(|_| ProbeError::Closed)
}

/// rumqttd's `Publish` keeps QoS and packet id private, so the probe writes its frame itself.
fn publish_qos1(topic: &str, pkid: u16, seq: u64) -> Bytes {
    let remaining = 2 + topic.len() + 2 + 8;
    let mut out = BytesMut::with_capacity(remaining + 5);
    out.put_u8((packet::PUBLISH << 4) | 0b0010);
    packet::put_varint(&mut out, remaining);
    out.put_u16(topic.len() as u16);
    out.put_slice(topic.as_bytes());
    out.put_u16(pkid);
    out.put_u64(seq);
    out.freeze()
}

/// Reads one whole packet from an internal connection.
pub(crate) async fn read(io: &mut DuplexStream, buf: &mut BytesMut) -> Result<Bytes, ProbeError> {
    loop {
        if let Some(len) = packet::frame_len(buf, usize::MAX).map_err(|e| ProbeError::Codec(e.to_string()))? {
            return Ok(buf.split_to(len).freeze());
        }
        if io.read_buf(buf).await.map_err(|_| ProbeError::Closed)? == 0 {
            return Err(ProbeError::Closed);
        }
    }
}
