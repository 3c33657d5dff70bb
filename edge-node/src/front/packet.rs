//! Just enough MQTT to relay: framing, the fields of a PUBLISH the front decides on, and the
//! few packets the front writes itself. Full decoding of rare packets (CONNECT, SUBSCRIBE) goes
//! through rumqttd's public codecs; the hot path (PUBLISH, acks) is parsed here without copying.

use bytes::{BufMut, Bytes, BytesMut};

pub const CONNECT: u8 = 1;
pub const CONNACK: u8 = 2;
pub const PUBLISH: u8 = 3;
pub const PUBACK: u8 = 4;
pub const PUBREC: u8 = 5;
pub const PUBREL: u8 = 6;
pub const PUBCOMP: u8 = 7;
pub const SUBSCRIBE: u8 = 8;
pub const SUBACK: u8 = 9;
pub const PINGRESP: u8 = 13;
pub const DISCONNECT: u8 = 14;

/// MQTT protocol level of a connection, from its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V311,
    V5,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("packet of {size} bytes is over the {max} byte limit")]
    TooLarge { size: usize, max: usize },
    #[error("malformed remaining length")]
    BadLength,
    #[error("malformed {0} packet")]
    Malformed(&'static str),
    #[error("topic alias {0} was never set")]
    UnknownAlias(u16),
    #[error("protocol level {0} is not supported (MQTT 3.1.1 and 5 are)")]
    UnsupportedVersion(u8),
}

/// Where the next packet in `buf` ends: `Ok(None)` when more bytes are needed. Checks the size
/// limit from the header alone, before the body is buffered.
pub fn frame_len(buf: &[u8], max: usize) -> Result<Option<usize>, PacketError> {
    let mut remaining: usize = 0;
    for i in 0..4 {
        let Some(&byte) = buf.get(1 + i) else {
            return Ok(None);
        };
        remaining |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let size = 2 + i + remaining;
            if size > max {
                return Err(PacketError::TooLarge { size, max });
            }
            return Ok((buf.len() >= size).then_some(size));
        }
    }
    Err(PacketError::BadLength)
}

/// Offset of the variable header in a complete frame.
pub fn body_start(frame: &[u8]) -> usize {
    frame.iter().skip(1).position(|b| b & 0x80 == 0).map_or(frame.len(), |i| i + 2)
}

pub fn packet_type(frame: &[u8]) -> u8 {
    frame[0] >> 4
}

/// The protocol level of a CONNECT frame.
pub fn connect_version(frame: &[u8]) -> Result<Version, PacketError> {
    let body = &frame[body_start(frame)..];
    let name_len = usize::from(read_u16(body, 0).ok_or(PacketError::Malformed("CONNECT"))?);
    match body.get(2 + name_len) {
        Some(4) => Ok(Version::V311),
        Some(5) => Ok(Version::V5),
        Some(&other) => Err(PacketError::UnsupportedVersion(other)),
        None => Err(PacketError::Malformed("CONNECT")),
    }
}

/// What the front needs of a PUBLISH: borrowed from the frame, nothing copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishView<'a> {
    pub qos: u8,
    pub retain: bool,
    /// As sent: empty when the publish uses only a topic alias.
    pub topic: &'a [u8],
    pub pkid: u16,
    pub topic_alias: Option<u16>,
}

pub fn parse_publish(frame: &[u8], version: Version) -> Result<PublishView<'_>, PacketError> {
    const M: PacketError = PacketError::Malformed("PUBLISH");
    let qos = (frame[0] >> 1) & 0b11;
    if qos == 3 {
        return Err(M);
    }
    let body = &frame[body_start(frame)..];
    let topic_len = usize::from(read_u16(body, 0).ok_or(M)?);
    let topic = body.get(2..2 + topic_len).ok_or(M)?;
    let mut at = 2 + topic_len;
    let pkid = if qos > 0 {
        let id = read_u16(body, at).ok_or(M)?;
        at += 2;
        if id == 0 {
            return Err(M);
        }
        id
    } else {
        0
    };
    let topic_alias = match version {
        Version::V311 => None,
        Version::V5 => find_topic_alias(body, at)?,
    };
    Ok(PublishView { qos, retain: frame[0] & 1 == 1, topic, pkid, topic_alias })
}

/// Walks a PUBLISH's properties for the topic alias (0x23); other properties are skipped by
/// their declared type.
fn find_topic_alias(body: &[u8], at: usize) -> Result<Option<u16>, PacketError> {
    const M: PacketError = PacketError::Malformed("PUBLISH properties");
    let (len, n) = read_varint(body.get(at..).ok_or(M)?).ok_or(M)?;
    let props = body.get(at + n..at + n + len).ok_or(M)?;
    let mut i = 0;
    let mut alias = None;
    while i < props.len() {
        let id = props[i];
        i += 1;
        i += match id {
            0x01 => 1, // payload format indicator
            0x02 => 4, // message expiry interval
            0x23 => {
                alias = Some(read_u16(props, i).ok_or(M)?);
                2
            }
            0x08 | 0x09 | 0x03 => 2 + usize::from(read_u16(props, i).ok_or(M)?), // response topic, correlation data, content type
            0x26 => {
                let k = 2 + usize::from(read_u16(props, i).ok_or(M)?);
                k + 2 + usize::from(read_u16(props, i + k).ok_or(M)?)
            }
            0x0B => read_varint(props.get(i..).ok_or(M)?).ok_or(M)?.1, // subscription identifier
            _ => return Err(M),
        };
    }
    if i != props.len() || alias == Some(0) {
        return Err(M);
    }
    Ok(alias)
}

/// The packet id of an ack-like packet (PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK).
pub fn ack_pkid(frame: &[u8]) -> Option<u16> {
    read_u16(frame, body_start(frame))
}

pub(super) fn read_u16(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*buf.get(at)?, *buf.get(at + 1)?]))
}

/// A variable byte integer at the start of `buf`: its value and its length in bytes.
pub(super) fn read_varint(buf: &[u8]) -> Option<(usize, usize)> {
    let mut value = 0usize;
    for (i, &b) in buf.iter().take(4).enumerate() {
        value |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Writes an MQTT variable byte integer.
pub fn put_varint(out: &mut BytesMut, mut n: usize) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.put_u8(b);
        if n == 0 {
            break;
        }
    }
}

/// A PUBACK, PUBREC or PUBCOMP (`kind`) with a reason code (MQTT 5 only; MQTT 3.1.1 has none).
pub fn write_ack(out: &mut BytesMut, kind: u8, pkid: u16, reason: u8, version: Version) {
    let fixed = if kind == PUBREL { 0x62 } else { kind << 4 };
    out.put_u8(fixed);
    if version == Version::V5 && reason != 0 {
        out.put_u8(3);
        out.put_u16(pkid);
        out.put_u8(reason);
    } else {
        out.put_u8(2);
        out.put_u16(pkid);
    }
}

/// A SUBACK with one return code per filter.
pub fn write_suback(out: &mut BytesMut, pkid: u16, codes: &[u8], version: Version) {
    out.put_u8(SUBACK << 4);
    let props = usize::from(version == Version::V5);
    put_varint(out, 2 + props + codes.len());
    out.put_u16(pkid);
    if props == 1 {
        out.put_u8(0);
    }
    out.put_slice(codes);
}

/// The return codes of a SUBACK frame, and where they start.
pub fn suback_codes(frame: &[u8], version: Version) -> Option<(usize, &[u8])> {
    let mut at = body_start(frame) + 2;
    if version == Version::V5 {
        let (len, n) = read_varint(frame.get(at..)?)?;
        at += n + len;
    }
    Some((at, frame.get(at..)?))
}

/// Rebuilds a SUBACK so it has a code for every filter the client sent: the broker's codes at
/// the positions that were forwarded (`None`), the front's refusal code elsewhere.
pub fn merge_suback(frame: &[u8], version: Version, refusals: &[Option<u8>]) -> Option<Bytes> {
    let (codes_at, broker_codes) = suback_codes(frame, version)?;
    let mut broker_codes = broker_codes.iter();
    let mut codes = Vec::with_capacity(refusals.len());
    for refusal in refusals {
        codes.push(match refusal {
            None => *broker_codes.next()?,
            Some(code) => *code,
        });
    }
    let head = &frame[body_start(frame)..codes_at];
    let mut out = BytesMut::with_capacity(frame.len() + refusals.len());
    out.put_u8(SUBACK << 4);
    put_varint(&mut out, head.len() + codes.len());
    out.put_slice(head);
    out.put_slice(&codes);
    Some(out.freeze())
}

/// A CONNACK refusing the connection. MQTT 3.1.1 return codes differ from MQTT 5 reasons, so
/// the caller passes both.
pub fn write_connack_refusal(out: &mut BytesMut, version: Version, v4_code: u8, v5_reason: u8) {
    out.put_u8(CONNACK << 4);
    match version {
        Version::V311 => {
            out.put_u8(2);
            out.put_u8(0);
            out.put_u8(v4_code);
        }
        Version::V5 => {
            out.put_u8(3);
            out.put_u8(0);
            out.put_u8(v5_reason);
            out.put_u8(0);
        }
    }
}

/// An MQTT 5 DISCONNECT with a reason; MQTT 3.1.1 has no server DISCONNECT, so nothing is
/// written for it and the caller just closes.
pub fn write_disconnect(out: &mut BytesMut, version: Version, reason: u8) {
    if version == Version::V5 {
        out.put_slice(&[DISCONNECT << 4, 2, reason, 0]);
    }
}

/// MQTT 5 reason codes the front uses.
pub mod reason {
    pub const UNSPECIFIED: u8 = 0x80;
    pub const MALFORMED: u8 = 0x81;
    pub const PROTOCOL_ERROR: u8 = 0x82;
    pub const NOT_AUTHORIZED: u8 = 0x87;
    pub const BAD_CREDENTIALS: u8 = 0x86;
    pub const SERVER_UNAVAILABLE: u8 = 0x88;
    pub const SERVER_SHUTTING_DOWN: u8 = 0x8B;
    pub const TOPIC_NAME_INVALID: u8 = 0x90;
    pub const PACKET_TOO_LARGE: u8 = 0x95;
    pub const QUOTA_EXCEEDED: u8 = 0x97;
    pub const TOPIC_ALIAS_INVALID: u8 = 0x94;
    pub const TOPIC_FILTER_INVALID: u8 = 0x8F;
    pub const UNSUPPORTED_VERSION: u8 = 0x84;
    /// MQTT 3.1.1 CONNACK return codes.
    pub const V4_UNACCEPTABLE_VERSION: u8 = 1;
    pub const V4_SERVER_UNAVAILABLE: u8 = 3;
    pub const V4_BAD_CREDENTIALS: u8 = 4;
    pub const V4_NOT_AUTHORIZED: u8 = 5;
    /// MQTT 3.1.1 SUBACK failure.
    pub const V4_SUBACK_FAILURE: u8 = 0x80;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_limits() {
        assert_eq!(frame_len(&[0x30], 100), Ok(None));
        assert_eq!(frame_len(&[0x30, 2, 0], 100), Ok(None));
        assert_eq!(frame_len(&[0x30, 2, 0, 0, 9], 100), Ok(Some(4)));
        // 200 bytes declared: refused from the header alone.
        assert_eq!(frame_len(&[0x30, 0xC8, 0x01], 100), Err(PacketError::TooLarge { size: 203, max: 100 }));
        assert_eq!(frame_len(&[0x30, 0xff, 0xff, 0xff, 0xff, 1], usize::MAX), Err(PacketError::BadLength));
    }

    #[test]
    fn parses_publish_v4_and_v5() {
        // QoS1, topic "a/b", pkid 7, payload "x"
        let v4 = [0x32, 8, 0, 3, b'a', b'/', b'b', 0, 7, b'x'];
        let p = parse_publish(&v4, Version::V311).unwrap();
        assert_eq!((p.qos, p.topic, p.pkid, p.topic_alias), (1, &b"a/b"[..], 7, None));
        // v5 QoS0, empty topic, properties: content type "t", alias 5
        let v5 = [0x30, 12, 0, 0, 7, 0x03, 0, 1, b't', 0x23, 0, 5, b'x', b'y'];
        let mut v5 = v5.to_vec();
        v5[1] = (v5.len() - 2) as u8;
        let p = parse_publish(&v5, Version::V5).unwrap();
        assert_eq!((p.qos, p.topic, p.topic_alias), (0, &b""[..], Some(5)));
    }

    #[test]
    fn rejects_truncated_publish() {
        assert!(parse_publish(&[0x32, 3, 0, 5, b'a'], Version::V311).is_err());
        assert!(parse_publish(&[0x36, 3, 0, 0, 0], Version::V311).is_err());
        // Unknown property id
        assert!(parse_publish(&[0x30, 5, 0, 0, 2, 0x77, 0], Version::V5).is_err());
    }

    proptest::proptest! {
        // The front parses bytes from the network before anything else sees them: no input
        // may panic it, nor rumqttd's codecs it hands CONNECT and SUBSCRIBE to.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512), first in 0u8..=255) {
            use rumqttd::protocol::{Protocol, v4::V4, v5::V5};
            let mut frame = bytes.clone();
            frame.insert(0, first);
            let _ = frame_len(&frame, 1 << 20);
            if let Ok(Some(len)) = frame_len(&frame, 1 << 20) {
                let frame = &frame[..len];
                let _ = parse_publish(frame, Version::V311);
                let _ = parse_publish(frame, Version::V5);
                let _ = connect_version(frame);
                let _ = ack_pkid(frame);
                let _ = suback_codes(frame, Version::V5);
                let _ = merge_suback(frame, Version::V5, &[None, Some(0x87), None]);
                match packet_type(frame) {
                    CONNECT | SUBSCRIBE | PUBLISH => {
                        let _ = V4.read_mut(&mut BytesMut::from(frame), 1 << 20);
                        let _ = V5.read_mut(&mut BytesMut::from(frame), 1 << 20);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Valid packets whose bodies the mutation test corrupts, to reach past the first checks.
    fn seeds() -> Vec<(u8, Vec<u8>)> {
        let mut connect5 = vec![0, 4, b'M', b'Q', b'T', b'T', 5, 0b1100_0110, 0, 60, 5, 0x11, 0, 0, 0, 10];
        connect5.extend([0, 2, b'c', b'1', 0, 0, 1, b'w', 0, 1, b'x', 0, 1, b'u', 0, 1, b'p']);
        let mut connect4 = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0b1100_0110, 0, 60];
        connect4.extend([0, 2, b'c', b'1', 0, 1, b'w', 0, 1, b'x', 0, 1, b'u', 0, 1, b'p']);
        vec![
            (0x10, connect5),
            (0x10, connect4),
            (0x82, vec![0, 1, 0, 0, 3, b'a', b'/', b'b', 0x01]),
            (0x82, vec![0, 1, 0, 3, b'a', b'/', b'#', 0x01, 0, 1, b'+', 0]),
            (0x32, vec![0, 3, b'a', b'/', b'b', 0, 1, 3, 0x23, 0, 5, b'h', b'i']),
        ]
    }

    proptest::proptest! {
        #[test]
        fn mutated_packets_never_panic(
            seed in 0usize..5,
            edits in proptest::collection::vec((0usize..64, proptest::num::u8::ANY), 1..5),
            cut in 0usize..64,
        ) {
            use rumqttd::protocol::{Protocol, v4::V4, v5::V5};
            let (header, mut body) = seeds().swap_remove(seed);
            for (at, value) in edits {
                let i = at % body.len();
                body[i] = value;
            }
            body.truncate(body.len().saturating_sub(cut % 8));
            let mut frame = BytesMut::new();
            frame.put_u8(header);
            put_varint(&mut frame, body.len());
            frame.extend_from_slice(&body);
            let _ = parse_publish(&frame, Version::V5);
            let _ = parse_publish(&frame, Version::V311);
            let _ = connect_version(&frame);
            let _ = V4.read_mut(&mut frame.clone(), 1 << 20);
            let _ = V5.read_mut(&mut frame.clone(), 1 << 20);
        }
    }

    #[test]
    fn merges_suback_codes() {
        let mut broker = BytesMut::new();
        write_suback(&mut broker, 9, &[1, 0], Version::V5);
        let merged = merge_suback(&broker, Version::V5, &[None, Some(reason::NOT_AUTHORIZED), None]).unwrap();
        let mut want = BytesMut::new();
        write_suback(&mut want, 9, &[1, 0x87, 0], Version::V5);
        assert_eq!(merged, want.freeze());
        assert_eq!(ack_pkid(&merged), Some(9));
    }
}
