//! Packets from clients: CONNECT, then everything a client may send after it.

use bytes::{Bytes, BytesMut};
use rumqttd::protocol::{self as rp, Packet, Protocol, v4::V4, v5::V5};

use super::PublishProps;
use super::acks::{puback_code, pubrec_code};
use super::publish::{self, PublishPacket};
use super::{DecodeError, QoS, Version, body_start, read_u16, read_varint};

/// A CONNECT, with the defaults MQTT gives absent properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    pub version: Version,
    pub client_id: String,
    /// MQTT 5 Clean Start; MQTT 3.1.1 Clean Session.
    pub clean_start: bool,
    /// Seconds; 0 turns keep-alive off.
    pub keep_alive: u16,
    /// Seconds the session outlives its connection; `u32::MAX` never expires. MQTT 3.1.1:
    /// 0 with Clean Session, else never.
    pub session_expiry: u32,
    /// QoS 1 and 2 publishes the client takes unacknowledged (65,535 when absent).
    pub receive_maximum: u16,
    /// Largest packet the client takes; `None`: no limit beyond MQTT's.
    pub max_packet_size: Option<u32>,
    /// Highest topic alias the client takes from the server; 0: none.
    pub topic_alias_maximum: u16,
    pub request_problem_info: bool,
    /// MQTT 5 enhanced authentication, which this server does not offer.
    pub auth_method: Option<String>,
    pub will: Option<Will>,
    pub username: Option<String>,
    pub password: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// Will Delay Interval, seconds.
    pub delay: u32,
    /// Message Expiry Interval, seconds.
    pub expiry: Option<u32>,
    pub props: PublishProps,
}

/// One filter of a SUBSCRIBE with its options (§3.8.3.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeRequest {
    pub filter: String,
    pub qos: QoS,
    pub no_local: bool,
    pub retain_as_published: bool,
    /// 0: send retained messages at subscribe; 1: only if the subscription is new; 2: never.
    pub retain_handling: u8,
}

/// A packet a connected client sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    Publish(PublishPacket),
    PubAck {
        pkid: u16,
        reason: u8,
    },
    PubRec {
        pkid: u16,
        reason: u8,
    },
    PubRel {
        pkid: u16,
    },
    PubComp {
        pkid: u16,
    },
    Subscribe {
        pkid: u16,
        filters: Vec<SubscribeRequest>,
        id: Option<u32>,
    },
    Unsubscribe {
        pkid: u16,
        filters: Vec<String>,
    },
    PingReq,
    Disconnect {
        reason: u8,
        session_expiry: Option<u32>,
    },
    /// MQTT 5 AUTH: enhanced authentication, which this server never started.
    Auth,
}

const CONNECT: u8 = 1;
const PUBLISH: u8 = 3;
const PUBACK: u8 = 4;
const PUBREC: u8 = 5;
const PUBREL: u8 = 6;
const PUBCOMP: u8 = 7;
const SUBSCRIBE: u8 = 8;
const UNSUBSCRIBE: u8 = 10;
const PINGREQ: u8 = 12;
const DISCONNECT: u8 = 14;
const AUTH: u8 = 15;

fn malformed(_: rp::Error) -> DecodeError {
    DecodeError::Malformed("rejected by the MQTT codec")
}

/// Decodes the first frame of a connection, which must be a CONNECT ([MQTT-3.1.0-1]).
pub fn decode_connect(frame: Bytes) -> Result<Connect, DecodeError> {
    if frame.first() != Some(&(CONNECT << 4)) {
        return Err(DecodeError::Protocol("the first packet is not a CONNECT"));
    }
    let body = &frame[body_start(&frame)..];
    const SHORT: DecodeError = DecodeError::Malformed("CONNECT shorter than its variable header");
    let name_len = usize::from(read_u16(body, 0).ok_or(SHORT)?);
    let name = body.get(2..2 + name_len).ok_or(SHORT)?;
    let level = *body.get(2 + name_len).ok_or(SHORT)?;
    let flags = *body.get(3 + name_len).ok_or(SHORT)?;
    let version = match (name, level) {
        (b"MQTT", 4) => Version::V311,
        (b"MQTT", 5) => Version::V5,
        (b"MQTT" | b"MQIsdp", other) => return Err(DecodeError::UnsupportedVersion(other)),
        // [MQTT-3.1.2-1]: another protocol name; answered as an unsupported version.
        _ => return Err(DecodeError::UnsupportedVersion(level)),
    };
    check_connect_flags(flags, version)?;
    if version == Version::V5 {
        super::props::check_connect(body, name_len, flags)?;
    }

    let mut buf = BytesMut::from(&frame[..]);
    let packet = match version {
        Version::V311 => V4.read_mut(&mut buf, usize::MAX),
        Version::V5 => V5.read_mut(&mut buf, usize::MAX),
    };
    let Ok(Packet::Connect(connect, props, will, will_props, login)) = packet else {
        return Err(DecodeError::Malformed("CONNECT rejected by the MQTT codec"));
    };
    let props = props.unwrap_or(rp::ConnectProperties {
        session_expiry_interval: None,
        receive_maximum: None,
        max_packet_size: None,
        topic_alias_max: None,
        request_response_info: None,
        request_problem_info: None,
        user_properties: Vec::new(),
        authentication_method: None,
        authentication_data: None,
    });
    // §3.1.2.11.3, §3.1.2.11.4: zero is a protocol error for both.
    if props.receive_maximum == Some(0) {
        return Err(DecodeError::Protocol("Receive Maximum of 0"));
    }
    if props.max_packet_size == Some(0) {
        return Err(DecodeError::Protocol("Maximum Packet Size of 0"));
    }
    if props.request_problem_info.is_some_and(|v| v > 1) || props.request_response_info.is_some_and(|v| v > 1) {
        return Err(DecodeError::Protocol("request information flag over 1"));
    }
    let session_expiry = match version {
        Version::V5 => props.session_expiry_interval.unwrap_or(0),
        Version::V311 if connect.clean_session => 0,
        Version::V311 => u32::MAX,
    };
    let will = will.map(|w| into_will(w, will_props)).transpose()?;
    let (username, password) = match login {
        // rumqttd reads an absent field as empty; the flags say which were sent.
        Some(l) => ((flags & 0x80 != 0).then_some(l.username), (flags & 0x40 != 0).then_some(l.password)),
        None => ((flags & 0x80 != 0).then(String::new), (flags & 0x40 != 0).then(String::new)),
    };
    Ok(Connect {
        version,
        client_id: connect.client_id,
        clean_start: connect.clean_session,
        keep_alive: connect.keep_alive,
        session_expiry,
        receive_maximum: props.receive_maximum.unwrap_or(u16::MAX),
        max_packet_size: props.max_packet_size,
        topic_alias_maximum: props.topic_alias_max.unwrap_or(0),
        request_problem_info: props.request_problem_info != Some(0),
        auth_method: props.authentication_method,
        will,
        username,
        password,
    })
}

/// The connect flags' own rules, which rumqttd does not check.
fn check_connect_flags(flags: u8, version: Version) -> Result<(), DecodeError> {
    // [MQTT-3.1.2-3]: the reserved flag is 0.
    if flags & 0x01 != 0 {
        return Err(DecodeError::Malformed("CONNECT reserved flag set"));
    }
    let will = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 0b11;
    let will_retain = flags & 0x20 != 0;
    // [MQTT-3.1.2-11], [MQTT-3.1.2-13]: without a will, its QoS and retain are 0.
    if !will && (will_qos != 0 || will_retain) {
        return Err(DecodeError::Malformed("will QoS or retain set without a will"));
    }
    // [MQTT-3.1.2-12]: will QoS 3 is malformed.
    if will_qos == 3 {
        return Err(DecodeError::Malformed("will QoS 3"));
    }
    // MQTT 3.1.1 [MQTT-3.1.2-22]: no password without a user name.
    if version == Version::V311 && flags & 0x40 != 0 && flags & 0x80 == 0 {
        return Err(DecodeError::Malformed("password flag without user name flag"));
    }
    Ok(())
}

fn into_will(w: rp::LastWill, props: Option<rp::LastWillProperties>) -> Result<Will, DecodeError> {
    let topic = std::str::from_utf8(&w.topic)
        .ok()
        .filter(|t| !t.contains('\0'))
        .ok_or(DecodeError::Malformed("will topic is not UTF-8"))?
        .to_owned();
    let mut will = Will {
        topic,
        payload: w.message,
        qos: qos_of(w.qos),
        retain: w.retain,
        delay: 0,
        expiry: None,
        props: PublishProps::default(),
    };
    if let Some(p) = props {
        if p.payload_format_indicator.is_some_and(|v| v > 1) {
            return Err(DecodeError::Protocol("will payload format indicator over 1"));
        }
        will.delay = p.delay_interval.unwrap_or(0);
        will.expiry = p.message_expiry_interval;
        will.props = PublishProps {
            payload_format: p.payload_format_indicator,
            content_type: p.content_type,
            response_topic: p.response_topic,
            correlation_data: p.correlation_data,
            user: p.user_properties,
        };
    }
    Ok(will)
}

fn qos_of(q: rp::QoS) -> QoS {
    match q {
        rp::QoS::AtMostOnce => QoS::AtMostOnce,
        rp::QoS::AtLeastOnce => QoS::AtLeastOnce,
        rp::QoS::ExactlyOnce => QoS::ExactlyOnce,
    }
}

/// Decodes a frame a connected client sent (fixed header included); a PUBLISH keeps at most
/// `max_user_properties` user properties ([`publish::decode`]).
pub fn decode(frame: Bytes, version: Version, max_user_properties: usize) -> Result<Inbound, DecodeError> {
    let Some(&first) = frame.first() else {
        return Err(DecodeError::Malformed("empty frame"));
    };
    let (kind, flags) = (first >> 4, first & 0x0f);
    // [MQTT-2.1.3-1]: reserved flags hold the values §2.1.3 lists.
    let expected_flags = match kind {
        PUBREL | SUBSCRIBE | UNSUBSCRIBE => Some(0b0010),
        PUBLISH => None,
        _ => Some(0),
    };
    if expected_flags.is_some_and(|f| f != flags) {
        return Err(DecodeError::Malformed("reserved fixed header flags"));
    }
    let remaining = frame.len() - body_start(&frame);
    match kind {
        PUBLISH => publish::decode(&frame, version, max_user_properties).map(Inbound::Publish),
        PUBACK | PUBREC | PUBREL | PUBCOMP => ack(&frame, kind, version),
        SUBSCRIBE => subscribe(frame, version),
        UNSUBSCRIBE => unsubscribe(frame, version),
        PINGREQ if remaining == 0 => Ok(Inbound::PingReq),
        PINGREQ => Err(DecodeError::Malformed("PINGREQ with a body")),
        DISCONNECT => disconnect(frame, version),
        // [MQTT-3.1.0-2]: a second CONNECT is a protocol error.
        CONNECT => Err(DecodeError::Protocol("a second CONNECT")),
        AUTH if version == Version::V5 => Ok(Inbound::Auth),
        // CONNACK, SUBACK, UNSUBACK, PINGRESP: the server's to send (§2.1.2); type 0 and, before
        // MQTT 5, type 15 are reserved.
        2 | 9 | 11 | 13 => Err(DecodeError::Protocol("a packet only the server sends")),
        _ => Err(DecodeError::Malformed("reserved packet type")),
    }
}

fn ack(frame: &Bytes, kind: u8, version: Version) -> Result<Inbound, DecodeError> {
    let inbound = match frame[..] {
        // The form nearly every acknowledgement has, the packet id alone (remaining length 2;
        // MQTT 5 §3.4.2.1 omits a success's reason code and properties), is read here: through
        // rumqttd it cost a buffer, a copy and a parse per PUBACK, per subscriber per message.
        [_, 2, hi, lo] => short_ack(kind, u16::from_be_bytes([hi, lo])),
        _ => codec_ack(frame, kind, version)?,
    };
    let pkid = match &inbound {
        Inbound::PubAck { pkid, .. } | Inbound::PubRec { pkid, .. } => *pkid,
        Inbound::PubRel { pkid } | Inbound::PubComp { pkid } => *pkid,
        _ => 0,
    };
    if pkid == 0 {
        return Err(DecodeError::Malformed("acknowledgement of packet id 0"));
    }
    Ok(inbound)
}

/// An acknowledgement of `kind` with a packet id and nothing else: a success.
fn short_ack(kind: u8, pkid: u16) -> Inbound {
    match kind {
        PUBACK => Inbound::PubAck { pkid, reason: super::reason::SUCCESS },
        PUBREC => Inbound::PubRec { pkid, reason: super::reason::SUCCESS },
        PUBREL => Inbound::PubRel { pkid },
        _ => Inbound::PubComp { pkid },
    }
}

/// Any other acknowledgement, through rumqttd's codec.
pub(super) fn codec_ack(frame: &Bytes, kind: u8, version: Version) -> Result<Inbound, DecodeError> {
    let mut buf = BytesMut::from(&frame[..]);
    let decoded = match version {
        Version::V311 => V4.read_mut(&mut buf, usize::MAX),
        Version::V5 => V5.read_mut(&mut buf, usize::MAX),
    };
    let packet = decoded.map_err(malformed)?;
    let inbound = match (kind, packet) {
        (PUBACK, Packet::PubAck(a, _)) => Inbound::PubAck { pkid: a.pkid, reason: puback_code(a.reason) },
        (PUBREC, Packet::PubRec(a, _)) => Inbound::PubRec { pkid: a.pkid, reason: pubrec_code(a.reason) },
        (PUBREL, Packet::PubRel(a, _)) => Inbound::PubRel { pkid: a.pkid },
        (PUBCOMP, Packet::PubComp(a, _)) => Inbound::PubComp { pkid: a.pkid },
        _ => return Err(DecodeError::Malformed("acknowledgement rejected by the MQTT codec")),
    };
    Ok(inbound)
}

fn subscribe(frame: Bytes, version: Version) -> Result<Inbound, DecodeError> {
    check_subscription_options(&frame, version)?;
    let mut buf = BytesMut::from(&frame[..]);
    let decoded = match version {
        Version::V311 => V4.read_mut(&mut buf, usize::MAX),
        Version::V5 => V5.read_mut(&mut buf, usize::MAX),
    };
    let (s, props) = match decoded {
        Ok(Packet::Subscribe(s, props)) => (s, props),
        // [MQTT-3.8.3-2]: a SUBSCRIBE holds at least one filter.
        Err(rp::Error::EmptySubscription) => return Err(DecodeError::Protocol("SUBSCRIBE without a filter")),
        // §3.8.2.1.2: a subscription identifier of 0 is a protocol error.
        Err(rp::Error::SubscriptionIdZero) => return Err(DecodeError::Protocol("subscription identifier 0")),
        _ => return Err(DecodeError::Malformed("SUBSCRIBE rejected by the MQTT codec")),
    };
    if s.pkid == 0 {
        return Err(DecodeError::Malformed("SUBSCRIBE with packet id 0"));
    }
    let id = match props.and_then(|p| p.id) {
        Some(0) => return Err(DecodeError::Protocol("subscription identifier 0")),
        Some(id) => Some(u32::try_from(id).map_err(|_| DecodeError::Malformed("subscription identifier"))?),
        None => None,
    };
    let filters = s
        .filters
        .into_iter()
        .map(|f| SubscribeRequest {
            filter: f.path,
            qos: qos_of(f.qos),
            no_local: f.nolocal,
            retain_as_published: f.preserve_retain,
            retain_handling: match f.retain_forward_rule {
                rp::RetainForwardRule::OnEverySubscribe => 0,
                rp::RetainForwardRule::OnNewSubscribe => 1,
                rp::RetainForwardRule::Never => 2,
            },
        })
        .collect();
    Ok(Inbound::Subscribe { pkid: s.pkid, filters, id })
}

/// Walks a SUBSCRIBE's filters for the option bits rumqttd does not check: [MQTT-3.8.3-5]
/// reserved bits are 0, MQTT 3.1.1 [MQTT-3.8.3-4] has only the QoS bits.
fn check_subscription_options(frame: &[u8], version: Version) -> Result<(), DecodeError> {
    const SHORT: DecodeError = DecodeError::Malformed("SUBSCRIBE shorter than its filters");
    let body = &frame[body_start(frame)..];
    let mut at = 2;
    if version == Version::V5 {
        let (len, n) = read_varint(body.get(at..).ok_or(SHORT)?).ok_or(SHORT)?;
        at += n + len;
    }
    while at < body.len() {
        let len = usize::from(read_u16(body, at).ok_or(SHORT)?);
        at += 2 + len;
        let options = *body.get(at).ok_or(SHORT)?;
        let reserved = match version {
            Version::V5 => 0b1100_0000,
            Version::V311 => 0b1111_1100,
        };
        if options & reserved != 0 {
            return Err(DecodeError::Malformed("reserved subscription option bits"));
        }
        at += 1;
    }
    Ok(())
}

fn unsubscribe(frame: Bytes, version: Version) -> Result<Inbound, DecodeError> {
    let mut buf = BytesMut::from(&frame[..]);
    let decoded = match version {
        Version::V311 => V4.read_mut(&mut buf, usize::MAX),
        Version::V5 => V5.read_mut(&mut buf, usize::MAX),
    };
    let Ok(Packet::Unsubscribe(u, _)) = decoded else {
        return Err(DecodeError::Malformed("UNSUBSCRIBE rejected by the MQTT codec"));
    };
    // [MQTT-3.10.3-2]: an UNSUBSCRIBE holds at least one filter.
    if u.filters.is_empty() {
        return Err(DecodeError::Protocol("UNSUBSCRIBE without a filter"));
    }
    if u.pkid == 0 {
        return Err(DecodeError::Malformed("UNSUBSCRIBE with packet id 0"));
    }
    Ok(Inbound::Unsubscribe { pkid: u.pkid, filters: u.filters })
}

fn disconnect(frame: Bytes, version: Version) -> Result<Inbound, DecodeError> {
    let body_len = frame.len() - body_start(&frame);
    match (version, body_len) {
        (_, 0) => Ok(Inbound::Disconnect { reason: 0, session_expiry: None }),
        (Version::V311, _) => Err(DecodeError::Malformed("MQTT 3.1.1 DISCONNECT with a body")),
        // §3.14.2.2.1: the property length may be left out after a lone reason code.
        (Version::V5, 1) => Ok(Inbound::Disconnect { reason: frame[frame.len() - 1], session_expiry: None }),
        (Version::V5, _) => {
            let code = frame[body_start(&frame)];
            let mut buf = BytesMut::from(&frame[..]);
            let Ok(Packet::Disconnect(_, props)) = V5.read_mut(&mut buf, usize::MAX) else {
                return Err(DecodeError::Malformed("DISCONNECT rejected by the MQTT codec"));
            };
            Ok(Inbound::Disconnect { reason: code, session_expiry: props.and_then(|p| p.session_expiry_interval) })
        }
    }
}
