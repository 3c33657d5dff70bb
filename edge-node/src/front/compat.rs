//! MQTT 3.1.1 clients over rumqttd's MQTT 5 server.
//!
//! rumqttd 0.20 panics (`unreachable!` in its v4 encoder) when it delivers a publish that
//! carries MQTT 5 properties to an MQTT 3.1.1 subscriber, so a v5 publisher with a trace id would
//! kill every v3.1.1 subscriber's connection. Every client is therefore relayed to the MQTT 5
//! server, and this module translates the packets that differ. MQTT 3.1.1 acks, PINGREQ and
//! DISCONNECT are valid MQTT 5 as they are; PUBLISH, SUBSCRIBE and UNSUBSCRIBE gain an empty
//! property block on the way in, and on the way out properties and reason codes are dropped.

use bytes::{BufMut, BytesMut};

use super::packet::{self, PacketError, put_varint, read_varint};

const UNSUBSCRIBE: u8 = 10;
const UNSUBACK: u8 = 11;
const AUTH: u8 = 15;

/// Where the variable header starts, and the remaining length.
fn split(frame: &[u8]) -> (usize, usize) {
    let start = packet::body_start(frame);
    (start, frame.len() - start)
}

fn read_u16(buf: &[u8], at: usize) -> Option<usize> {
    packet::read_u16(buf, at).map(usize::from)
}

/// Writes `frame` with an empty MQTT 5 property block inserted `at` bytes into its body.
fn insert_empty_properties(frame: &[u8], at: usize, out: &mut BytesMut) {
    let (start, len) = split(frame);
    out.put_u8(frame[0]);
    put_varint(out, len + 1);
    out.put_slice(&frame[start..start + at]);
    out.put_u8(0);
    out.put_slice(&frame[start + at..]);
}

/// A packet from an MQTT 3.1.1 client, as the MQTT 5 broker must see it.
pub fn upstream(frame: &[u8], out: &mut BytesMut) -> Result<(), PacketError> {
    let (start, len) = split(frame);
    let body = &frame[start..];
    match packet::packet_type(frame) {
        packet::PUBLISH => {
            let qos = (frame[0] >> 1) & 0b11;
            let topic_len = read_u16(body, 0).ok_or(PacketError::Malformed("PUBLISH"))?;
            let at = 2 + topic_len + if qos > 0 { 2 } else { 0 };
            if at > len {
                return Err(PacketError::Malformed("PUBLISH"));
            }
            insert_empty_properties(frame, at, out);
        }
        packet::SUBSCRIBE | UNSUBSCRIBE => {
            if len < 2 {
                return Err(PacketError::Malformed("SUBSCRIBE"));
            }
            insert_empty_properties(frame, 2, out);
        }
        _ => out.put_slice(frame),
    }
    Ok(())
}

/// A packet from the MQTT 5 broker, as an MQTT 3.1.1 client must see it; nothing for packets
/// MQTT 3.1.1 does not have (a server DISCONNECT, AUTH).
pub fn downstream(frame: &[u8], out: &mut BytesMut) -> Result<(), PacketError> {
    const M: PacketError = PacketError::Malformed("broker packet");
    let (start, len) = split(frame);
    let body = &frame[start..];
    match packet::packet_type(frame) {
        packet::CONNACK => {
            let flags = *body.first().ok_or(M)?;
            let code = match *body.get(1).ok_or(M)? {
                0 => 0,
                0x84 => packet::reason::V4_UNACCEPTABLE_VERSION,
                0x85 => 2,
                0x86 => packet::reason::V4_BAD_CREDENTIALS,
                0x87 => packet::reason::V4_NOT_AUTHORIZED,
                _ => packet::reason::V4_SERVER_UNAVAILABLE,
            };
            out.put_slice(&[frame[0], 2, flags, code]);
        }
        packet::PUBLISH => {
            let qos = (frame[0] >> 1) & 0b11;
            let topic_len = read_u16(body, 0).ok_or(M)?;
            if topic_len == 0 {
                // A broker topic alias: rumqttd only uses them when the client asked for them
                // in its CONNECT, which a translated MQTT 3.1.1 CONNECT never does.
                return Err(PacketError::Malformed("broker PUBLISH without a topic"));
            }
            let at = 2 + topic_len + if qos > 0 { 2 } else { 0 };
            let (props_len, n) = read_varint(body.get(at..).ok_or(M)?).ok_or(M)?;
            let payload_at = at + n + props_len;
            if payload_at > len {
                return Err(M);
            }
            out.put_u8(frame[0]);
            put_varint(out, len - n - props_len);
            out.put_slice(&body[..at]);
            out.put_slice(&body[payload_at..]);
        }
        packet::PUBACK | packet::PUBREC | packet::PUBREL | packet::PUBCOMP | UNSUBACK => {
            let pkid = body.get(..2).ok_or(M)?;
            out.put_slice(&[frame[0], 2]);
            out.put_slice(pkid);
        }
        packet::SUBACK => {
            let pkid = body.get(..2).ok_or(M)?;
            let (props_len, n) = read_varint(body.get(2..).ok_or(M)?).ok_or(M)?;
            let codes = body.get(2 + n + props_len..).ok_or(M)?;
            out.put_u8(frame[0]);
            put_varint(out, 2 + codes.len());
            out.put_slice(pkid);
            out.extend(codes.iter().map(|&c| if c < 0x80 { c } else { packet::reason::V4_SUBACK_FAILURE }));
        }
        packet::DISCONNECT | AUTH => {}
        _ => out.put_slice(frame),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::packet::{Version, parse_publish, suback_codes, write_suback};

    #[test]
    fn publish_round_trips_through_v5() {
        // QoS1 "a/b" pkid 7 payload "xy"
        let v4 = [0x32, 9, 0, 3, b'a', b'/', b'b', 0, 7, b'x', b'y'];
        let mut v5 = BytesMut::new();
        upstream(&v4, &mut v5).unwrap();
        assert_eq!(&v5[..], &[0x32, 10, 0, 3, b'a', b'/', b'b', 0, 7, 0, b'x', b'y']);
        assert_eq!(parse_publish(&v5, Version::V5).unwrap().pkid, 7);
        // The broker adds properties (a user property); the v4 client gets them stripped.
        let mut from_broker = BytesMut::new();
        let props = [0x26, 0, 1, b'k', 0, 1, b'v'];
        from_broker.put_u8(0x32);
        put_varint(&mut from_broker, 7 + 1 + props.len() + 2);
        from_broker.put_slice(&[0, 3, b'a', b'/', b'b', 0, 7, props.len() as u8]);
        from_broker.put_slice(&props);
        from_broker.put_slice(b"xy");
        let mut back = BytesMut::new();
        downstream(&from_broker, &mut back).unwrap();
        assert_eq!(&back[..], &v4[..]);
    }

    #[test]
    fn qos0_publish_and_subscribe() {
        let v4 = [0x30, 5, 0, 1, b't', b'h', b'i'];
        let mut v5 = BytesMut::new();
        upstream(&v4, &mut v5).unwrap();
        assert_eq!(&v5[..], &[0x30, 6, 0, 1, b't', 0, b'h', b'i']);
        let sub = [0x82, 6, 0, 9, 0, 1, b'#', 1];
        let mut v5 = BytesMut::new();
        upstream(&sub, &mut v5).unwrap();
        assert_eq!(&v5[..], &[0x82, 7, 0, 9, 0, 0, 1, b'#', 1]);
    }

    #[test]
    fn acks_and_subacks_lose_reasons_and_properties() {
        let mut out = BytesMut::new();
        downstream(&[0x40, 4, 0, 9, 0x10, 0], &mut out).unwrap();
        assert_eq!(&out[..], &[0x40, 2, 0, 9]);
        let mut suback = BytesMut::new();
        write_suback(&mut suback, 3, &[1, 0x87, 0], Version::V5);
        let mut out = BytesMut::new();
        downstream(&suback, &mut out).unwrap();
        assert_eq!(suback_codes(&out, Version::V311).unwrap().1, &[1, 0x80, 0]);
        let mut out = BytesMut::new();
        downstream(&[0x20, 3, 0, 0, 0], &mut out).unwrap();
        assert_eq!(&out[..], &[0x20, 2, 0, 0]);
        let mut out = BytesMut::new();
        downstream(&[0xE0, 1, 0x8B], &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn malformed_input_is_an_error() {
        let mut out = BytesMut::new();
        assert!(upstream(&[0x32, 3, 0, 9, b'a'], &mut out).is_err());
        assert!(downstream(&[0x30, 2, 0, 0], &mut out).is_err());
        assert!(downstream(&[0x32, 6, 0, 1, b'a', 0, 1, 9], &mut out).is_err());
    }
}
