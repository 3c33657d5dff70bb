//! A raw MQTT client for tests that must send what no well-behaved client library does: packets
//! built byte by byte, pipelined without waiting, or never read back.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An MQTT packet: the fixed header byte, the remaining length as a variable byte integer, then
/// `body`.
pub fn frame(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    out.extend(varint(body.len()));
    out.extend_from_slice(body);
    out
}

pub fn varint(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (n % 128) as u8;
        n /= 128;
        out.push(if n > 0 { b | 0x80 } else { b });
        if n == 0 {
            return out;
        }
    }
}

/// A length-prefixed MQTT string.
pub fn string(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(s);
    out
}

/// An MQTT 5 CONNECT, Clean Start, keep-alive off, with `props` (already encoded).
pub fn connect_v5(client_id: &str, clean_start: bool, props: &[u8]) -> Vec<u8> {
    let mut body = string(b"MQTT");
    body.extend([5, if clean_start { 0b10 } else { 0 }, 0, 0]);
    body.extend(varint(props.len()));
    body.extend_from_slice(props);
    body.extend(string(client_id.as_bytes()));
    frame(0x10, &body)
}

/// [`connect_v5`] with a QoS 1 will: its properties (already encoded), topic and payload.
pub fn connect_v5_will(
    client_id: &str,
    clean_start: bool,
    props: &[u8],
    will_props: &[u8],
    topic: &str,
    payload: &[u8],
) -> Vec<u8> {
    let mut body = string(b"MQTT");
    body.extend([5, if clean_start { 0b10 } else { 0 } | 0b0000_1100, 0, 0]);
    body.extend(varint(props.len()));
    body.extend_from_slice(props);
    body.extend(string(client_id.as_bytes()));
    body.extend(varint(will_props.len()));
    body.extend_from_slice(will_props);
    body.extend(string(topic.as_bytes()));
    body.extend(string(payload));
    frame(0x10, &body)
}

/// An MQTT 3.1.1 CONNECT with a user name and password, clean session, keep-alive off.
pub fn connect_v311_login(client_id: &str, user: &str, password: &[u8]) -> Vec<u8> {
    let mut body = string(b"MQTT");
    body.extend([4, 0b1100_0010, 0, 0]);
    body.extend(string(client_id.as_bytes()));
    body.extend(string(user.as_bytes()));
    body.extend(string(password));
    frame(0x10, &body)
}

/// An MQTT 5 PUBLISH with `props`.
pub fn publish_v5(topic: &[u8], qos: u8, pkid: u16, retain: bool, props: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut body = string(topic);
    if qos > 0 {
        body.extend(pkid.to_be_bytes());
    }
    body.extend(varint(props.len()));
    body.extend_from_slice(props);
    body.extend_from_slice(payload);
    frame(0x30 | (qos << 1) | u8::from(retain), &body)
}

/// An MQTT 5 SUBSCRIBE of `filters`, each at QoS `qos`.
pub fn subscribe_v5(pkid: u16, filters: &[String], qos: u8) -> Vec<u8> {
    let mut body = pkid.to_be_bytes().to_vec();
    body.push(0);
    for f in filters {
        body.extend(string(f.as_bytes()));
        body.push(qos);
    }
    frame(0x82, &body)
}

/// A connection that writes what it is given and reads whole packets.
pub struct RawClient {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl RawClient {
    pub async fn connect(addr: SocketAddr) -> std::io::Result<RawClient> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RawClient { stream, buf: Vec::new() })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// The next whole packet (fixed header included), `None` on EOF or after `timeout`.
    pub async fn packet(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(len) = whole(&self.buf) {
                return Some(self.buf.drain(..len).collect());
            }
            self.buf.reserve(64 * 1024);
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Reads packets until one of type `kind` (the high nibble) comes.
    pub async fn until(&mut self, kind: u8, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let p = self.packet(left).await?;
            if p[0] >> 4 == kind {
                return Some(p);
            }
        }
    }
}

/// The length of the first whole packet in `buf`, if there is one.
fn whole(buf: &[u8]) -> Option<usize> {
    let mut len = 0usize;
    for i in 0..4 {
        let b = *buf.get(1 + i)?;
        len |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let total = 2 + i + len;
            return (buf.len() >= total).then_some(total);
        }
    }
    None
}
