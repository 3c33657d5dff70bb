//! PUBLISH on the wire, both directions and both versions: the one packet rumqttd's codecs
//! cannot serve (its `Publish` keeps QoS and packet id private), and the hot path. Decoding
//! takes the topic and payload as slices of the frame; encoding writes the subscriber's packet
//! id, QoS, flags and properties around the shared payload.

use bytes::{BufMut, Bytes, BytesMut};

use super::{DecodeError, PublishProps, QoS, Version, body_start, put_varint, read_u16, read_varint, varint_len};

/// A PUBLISH from a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishPacket {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// As sent: empty when the publish names its topic only by alias. Valid UTF-8.
    pub topic: Bytes,
    /// 0 for QoS 0.
    pub pkid: u16,
    pub topic_alias: Option<u16>,
    /// Message Expiry Interval, seconds.
    pub message_expiry: Option<u32>,
    pub props: PublishProps,
    /// User properties past the decoder's cap: not kept (so one packet cannot make the broker
    /// hold thousands of empty pairs), only counted; the core refuses such a publish.
    pub excess_user_properties: usize,
    pub payload: Bytes,
}

impl PublishPacket {
    /// The topic as sent; empty when only an alias names it.
    pub fn topic_str(&self) -> &str {
        // Checked to be UTF-8 when decoded.
        std::str::from_utf8(&self.topic).unwrap_or_default()
    }
}

const PAYLOAD_FORMAT: u8 = 0x01;
const MESSAGE_EXPIRY: u8 = 0x02;
const CONTENT_TYPE: u8 = 0x03;
const RESPONSE_TOPIC: u8 = 0x08;
const CORRELATION_DATA: u8 = 0x09;
const SUBSCRIPTION_ID: u8 = 0x0B;
const TOPIC_ALIAS: u8 = 0x23;
const USER_PROPERTY: u8 = 0x26;

/// Decodes a PUBLISH frame (fixed header included) sent by a client, keeping at most
/// `max_user_properties` user properties (the rest are checked and counted).
pub fn decode(frame: &Bytes, version: Version, max_user_properties: usize) -> Result<PublishPacket, DecodeError> {
    const SHORT: DecodeError = DecodeError::Malformed("PUBLISH shorter than its fields");
    let flags = frame[0] & 0x0f;
    // [MQTT-3.3.1-4]: QoS 3 is malformed.
    let qos = QoS::from_bits((flags >> 1) & 0b11).ok_or(DecodeError::Malformed("PUBLISH with QoS 3"))?;
    let dup = flags & 0b1000 != 0;
    // [MQTT-3.3.1-2]: DUP must be 0 for QoS 0.
    if dup && qos == QoS::AtMostOnce {
        return Err(DecodeError::Malformed("PUBLISH with DUP set at QoS 0"));
    }
    let start = body_start(frame);
    let body = frame.get(start..).ok_or(SHORT)?;
    let topic_len = usize::from(read_u16(body, 0).ok_or(SHORT)?);
    let topic_bytes = body.get(2..2 + topic_len).ok_or(SHORT)?;
    check_utf8(topic_bytes, "PUBLISH topic")?;
    let topic = frame.slice(start + 2..start + 2 + topic_len);
    let mut at = 2 + topic_len;
    let pkid = if qos == QoS::AtMostOnce {
        0
    } else {
        let id = read_u16(body, at).ok_or(SHORT)?;
        at += 2;
        // [MQTT-2.2.1-3]: a QoS > 0 PUBLISH carries a non-zero packet id.
        if id == 0 {
            return Err(DecodeError::Malformed("PUBLISH with packet id 0"));
        }
        id
    };
    let mut packet = PublishPacket {
        dup,
        qos,
        retain: flags & 1 == 1,
        topic,
        pkid,
        topic_alias: None,
        message_expiry: None,
        props: PublishProps::default(),
        excess_user_properties: 0,
        payload: Bytes::new(),
    };
    if version == Version::V5 {
        let (len, n) = read_varint(body.get(at..).ok_or(SHORT)?).ok_or(SHORT)?;
        let props = body.get(at + n..at + n + len).ok_or(SHORT)?;
        read_props(frame, start + at + n, props, &mut packet, max_user_properties)?;
        at += n + len;
    }
    packet.payload = frame.slice(start + at..);
    Ok(packet)
}

/// The topic and payload of a PUBLISH frame, found without decoding it (the properties are
/// skipped, not read): what the front validates against a schema before it takes the broker
/// core's lock. `None` for another packet or a PUBLISH too short for its fields; [`decode`]
/// stays the judge of the frame, and the core uses a judgment only for the topic and payload
/// length it decoded.
pub(crate) fn peek(frame: &[u8], version: Version) -> Option<(&str, &[u8])> {
    if frame.first()? >> 4 != 3 {
        return None;
    }
    let qos = (frame[0] >> 1) & 0b11;
    let body = frame.get(body_start(frame)..)?;
    let topic_len = usize::from(read_u16(body, 0)?);
    let topic = std::str::from_utf8(body.get(2..2 + topic_len)?).ok()?;
    let mut at = 2 + topic_len + if qos == 0 { 0 } else { 2 };
    if version == Version::V5 {
        let (len, n) = read_varint(body.get(at..)?)?;
        at += n + len;
    }
    Some((topic, body.get(at..)?))
}

fn check_utf8(bytes: &[u8], what: &'static str) -> Result<(), DecodeError> {
    // [MQTT-1.5.4-1]: well-formed UTF-8; [MQTT-1.5.4-2]: no U+0000.
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.contains('\0') => Ok(()),
        _ => Err(DecodeError::Malformed(what)),
    }
}

/// `props` sits at `offset` in `frame`.
fn read_props(
    frame: &Bytes,
    offset: usize,
    props: &[u8],
    p: &mut PublishPacket,
    max_user: usize,
) -> Result<(), DecodeError> {
    const SHORT: DecodeError = DecodeError::Malformed("PUBLISH property shorter than its value");
    // [MQTT-2.2.2-2]: a property other than user property appears at most once.
    const TWICE: DecodeError = DecodeError::Protocol("PUBLISH property given twice");
    let string = |at: usize| -> Result<(String, usize), DecodeError> {
        let len = usize::from(read_u16(props, at).ok_or(SHORT)?);
        let bytes = props.get(at + 2..at + 2 + len).ok_or(SHORT)?;
        check_utf8(bytes, "PUBLISH property string")?;
        Ok((String::from_utf8_lossy(bytes).into_owned(), 2 + len))
    };
    let mut i = 0;
    while i < props.len() {
        let id = props[i];
        i += 1;
        match id {
            PAYLOAD_FORMAT => {
                let v = *props.get(i).ok_or(SHORT)?;
                if v > 1 || p.props.payload_format.replace(v).is_some() {
                    return Err(if v > 1 { DecodeError::Protocol("payload format indicator over 1") } else { TWICE });
                }
                i += 1;
            }
            MESSAGE_EXPIRY => {
                let v = props.get(i..i + 4).ok_or(SHORT)?;
                if p.message_expiry.replace(u32::from_be_bytes([v[0], v[1], v[2], v[3]])).is_some() {
                    return Err(TWICE);
                }
                i += 4;
            }
            CONTENT_TYPE | RESPONSE_TOPIC => {
                let (s, n) = string(i)?;
                // [MQTT-3.3.2-14]: a Response Topic is a topic name, never a filter.
                if id == RESPONSE_TOPIC && s.contains(['+', '#']) {
                    return Err(DecodeError::Protocol("a Response Topic with a wildcard"));
                }
                let slot = if id == CONTENT_TYPE { &mut p.props.content_type } else { &mut p.props.response_topic };
                if slot.replace(s).is_some() {
                    return Err(TWICE);
                }
                i += n;
            }
            CORRELATION_DATA => {
                let len = usize::from(read_u16(props, i).ok_or(SHORT)?);
                if i + 2 + len > props.len() {
                    return Err(SHORT);
                }
                let data = frame.slice(offset + i + 2..offset + i + 2 + len);
                if p.props.correlation_data.replace(data).is_some() {
                    return Err(TWICE);
                }
                i += 2 + len;
            }
            TOPIC_ALIAS => {
                let v = read_u16(props, i).ok_or(SHORT)?;
                if p.topic_alias.replace(v).is_some() {
                    return Err(TWICE);
                }
                i += 2;
            }
            USER_PROPERTY if p.props.user.len() < max_user => {
                let (k, n) = string(i)?;
                let (v, m) = string(i + n)?;
                p.props.user.push((k, v));
                i += n + m;
            }
            USER_PROPERTY => {
                // Checked as any other, not kept.
                let skip = |at: usize| -> Result<usize, DecodeError> {
                    let len = usize::from(read_u16(props, at).ok_or(SHORT)?);
                    check_utf8(props.get(at + 2..at + 2 + len).ok_or(SHORT)?, "PUBLISH property string")?;
                    Ok(2 + len)
                };
                let n = skip(i)?;
                i += n + skip(i + n)?;
                p.excess_user_properties += 1;
            }
            // [MQTT-3.3.4-6]: a client's PUBLISH carries no subscription identifier.
            SUBSCRIPTION_ID => return Err(DecodeError::Protocol("subscription identifier in a client's PUBLISH")),
            _ => return Err(DecodeError::Malformed("unknown PUBLISH property")),
        }
    }
    Ok(())
}

/// What the broker writes in one PUBLISH to one subscriber; the payload and properties are the
/// message's own, shared by every subscriber.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub topic: &'a str,
    pub payload: &'a Bytes,
    pub qos: QoS,
    pub pkid: u16,
    pub dup: bool,
    pub retain: bool,
    pub props: &'a PublishProps,
    /// The remaining Message Expiry Interval, seconds.
    pub expiry: Option<u32>,
    pub subscription_ids: &'a [u32],
}

fn string_len(s: &str) -> usize {
    2 + s.len()
}

/// The property bytes of `o` (MQTT 5 only), without their length prefix.
fn props_len(o: &Outgoing<'_>) -> usize {
    let p = o.props;
    p.payload_format.map_or(0, |_| 2)
        + o.expiry.map_or(0, |_| 5)
        + p.content_type.as_deref().map_or(0, |s| 1 + string_len(s))
        + p.response_topic.as_deref().map_or(0, |s| 1 + string_len(s))
        + p.correlation_data.as_ref().map_or(0, |d| 3 + d.len())
        + p.user.iter().map(|(k, v)| 1 + string_len(k) + string_len(v)).sum::<usize>()
        + o.subscription_ids.iter().map(|id| 1 + varint_len(*id as usize)).sum::<usize>()
}

fn remaining_len(o: &Outgoing<'_>, version: Version) -> usize {
    let pkid = if o.qos == QoS::AtMostOnce { 0 } else { 2 };
    let props = match version {
        Version::V311 => 0,
        Version::V5 => {
            let n = props_len(o);
            varint_len(n) + n
        }
    };
    string_len(o.topic) + pkid + props + o.payload.len()
}

/// The whole packet's size, for the client's Maximum Packet Size.
pub(crate) fn encoded_len(o: &Outgoing<'_>, version: Version) -> usize {
    let remaining = remaining_len(o, version);
    1 + varint_len(remaining) + remaining
}

pub fn encode(o: &Outgoing<'_>, version: Version, out: &mut BytesMut) {
    let remaining = remaining_len(o, version);
    out.reserve(1 + varint_len(remaining) + remaining);
    out.put_u8(0x30 | (u8::from(o.dup) << 3) | ((o.qos as u8) << 1) | u8::from(o.retain));
    put_varint(out, remaining);
    put_string(out, o.topic);
    if o.qos != QoS::AtMostOnce {
        out.put_u16(o.pkid);
    }
    if version == Version::V5 {
        put_varint(out, props_len(o));
        let p = o.props;
        if let Some(v) = p.payload_format {
            out.put_slice(&[PAYLOAD_FORMAT, v]);
        }
        if let Some(v) = o.expiry {
            out.put_u8(MESSAGE_EXPIRY);
            out.put_u32(v);
        }
        if let Some(s) = &p.content_type {
            out.put_u8(CONTENT_TYPE);
            put_string(out, s);
        }
        if let Some(s) = &p.response_topic {
            out.put_u8(RESPONSE_TOPIC);
            put_string(out, s);
        }
        if let Some(d) = &p.correlation_data {
            out.put_u8(CORRELATION_DATA);
            out.put_u16(d.len() as u16);
            out.put_slice(d);
        }
        for (k, v) in &p.user {
            out.put_u8(USER_PROPERTY);
            put_string(out, k);
            put_string(out, v);
        }
        for id in o.subscription_ids {
            out.put_u8(SUBSCRIPTION_ID);
            put_varint(out, *id as usize);
        }
    }
    out.put_slice(o.payload);
}

fn put_string(out: &mut BytesMut, s: &str) {
    out.put_u16(s.len() as u16);
    out.put_slice(s.as_bytes());
}
