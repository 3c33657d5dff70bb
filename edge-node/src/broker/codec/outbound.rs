//! Packets the broker sends, and their bytes in the client's protocol version.

use std::sync::Arc;

use bytes::BytesMut;
use rumqttd::protocol::{self as rp, Packet, Protocol, v4::V4, v5::V5};

use super::acks::{puback_reason, pubrec_reason};
use super::publish::{self, Outgoing};
use super::{QoS, Version, reason};
use crate::broker::message::Message;

/// CONNACK properties the broker announces (MQTT 5 §3.2.2.3); `None` leaves one out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnAckProps {
    pub session_expiry: Option<u32>,
    pub receive_maximum: Option<u16>,
    pub max_packet_size: Option<u32>,
    pub assigned_client_id: Option<String>,
    pub topic_alias_maximum: Option<u16>,
    pub server_keep_alive: Option<u16>,
    pub reason_string: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outbound {
    /// `code` is an MQTT 5 reason; MQTT 3.1.1 clients get its return code
    /// ([`reason::connack_v4`]).
    ConnAck {
        session_present: bool,
        code: u8,
        props: Box<ConnAckProps>,
    },
    Publish {
        msg: Arc<Message>,
        qos: QoS,
        pkid: u16,
        dup: bool,
        retain: bool,
        expiry: Option<u32>,
        sub_ids: Vec<u32>,
    },
    PubAck {
        pkid: u16,
        reason: u8,
    },
    PubRec {
        pkid: u16,
        reason: u8,
    },
    /// A refused publish's PUBACK (QoS 1) or PUBREC (QoS 2) with an MQTT 5 Reason String
    /// (§3.4.2.2.2): the core leaves `text` out when it would make the packet larger than the
    /// client's Maximum Packet Size ([MQTT-3.4.2-2]). MQTT 3.1.1 clients get a plain success.
    PubRefused {
        pkid: u16,
        qos2: bool,
        reason: u8,
        text: Option<String>,
    },
    PubRel {
        pkid: u16,
        reason: u8,
    },
    PubComp {
        pkid: u16,
        reason: u8,
    },
    /// MQTT 5 reason codes, one per filter; an MQTT 3.1.1 client sees 0x80 for any failure.
    SubAck {
        pkid: u16,
        codes: Vec<u8>,
    },
    /// MQTT 3.1.1 UNSUBACKs carry no codes.
    UnsubAck {
        pkid: u16,
        codes: Vec<u8>,
    },
    PingResp,
    /// MQTT 5 only: MQTT 3.1.1 has no server DISCONNECT, and nothing is written for it.
    Disconnect {
        reason: u8,
    },
}

impl Outbound {
    /// The PUBLISH as the codec writes it.
    fn outgoing(&self) -> Option<Outgoing<'_>> {
        match self {
            Outbound::Publish { msg, qos, pkid, dup, retain, expiry, sub_ids } => Some(Outgoing {
                topic: &msg.topic,
                payload: &msg.payload,
                qos: *qos,
                pkid: *pkid,
                dup: *dup,
                retain: *retain,
                props: &msg.props,
                expiry: *expiry,
                subscription_ids: sub_ids,
            }),
            _ => None,
        }
    }

    /// Its size on the wire; for the client's Maximum Packet Size.
    pub(crate) fn encoded_len(&self, version: Version) -> usize {
        match self.outgoing() {
            Some(o) => publish::encoded_len(&o, version),
            None => {
                let mut out = BytesMut::new();
                encode(self, version, &mut out);
                out.len()
            }
        }
    }
}

fn connect_code_v5(code: u8) -> rp::ConnectReturnCode {
    use rp::ConnectReturnCode::*;
    match code {
        0x00 => Success,
        0x81 => MalformedPacket,
        0x82 => ProtocolError,
        0x83 => ImplementationSpecificError,
        0x84 => UnsupportedProtocolVersion,
        0x85 => ClientIdentifierNotValid,
        0x86 => BadUserNamePassword,
        0x87 => NotAuthorized,
        0x88 => ServerUnavailable,
        0x89 => ServerBusy,
        0x8A => Banned,
        0x8C => BadAuthenticationMethod,
        0x90 => TopicNameInvalid,
        0x95 => PacketTooLarge,
        0x97 => QuotaExceeded,
        0x99 => PayloadFormatInvalid,
        0x9A => RetainNotSupported,
        0x9B => QoSNotSupported,
        0x9F => ConnectionRateExceeded,
        _ => UnspecifiedError,
    }
}

/// The six return codes rumqttd's MQTT 3.1.1 CONNACK writer knows; anything else reaches its
/// `unreachable!()`.
fn connect_code_v4(code: u8) -> rp::ConnectReturnCode {
    use rp::ConnectReturnCode::*;
    match reason::connack_v4(code) {
        0 => Success,
        1 => RefusedProtocolVersion,
        2 => ClientIdentifierNotValid,
        4 => BadUserNamePassword,
        5 => NotAuthorized,
        _ => ServiceUnavailable,
    }
}

fn suback_code(code: u8, version: Version) -> rp::SubscribeReasonCode {
    use rp::SubscribeReasonCode::*;
    match (code, version) {
        (0, _) => Success(rp::QoS::AtMostOnce),
        (1, _) => Success(rp::QoS::AtLeastOnce),
        (2, _) => Success(rp::QoS::ExactlyOnce),
        (_, Version::V311) => Failure,
        (0x83, _) => ImplementationSpecific,
        (0x87, _) => NotAuthorized,
        (0x8F, _) => TopicFilterInvalid,
        (0x91, _) => PkidInUse,
        (0x97, _) => QuotaExceeded,
        (0x9E, _) => SharedSubscriptionsNotSupported,
        (0xA1, _) => SubscriptionIdNotSupported,
        (0xA2, _) => WildcardSubscriptionsNotSupported,
        _ => Unspecified,
    }
}

fn unsuback_code(code: u8) -> rp::UnsubAckReason {
    use rp::UnsubAckReason::*;
    match code {
        0x00 => Success,
        0x11 => NoSubscriptionExisted,
        0x83 => ImplementationSpecificError,
        0x87 => NotAuthorized,
        0x8F => TopicFilterInvalid,
        0x91 => PacketIdentifierInUse,
        _ => UnspecifiedError,
    }
}

fn disconnect_reason(code: u8) -> rp::DisconnectReasonCode {
    use rp::DisconnectReasonCode::*;
    match code {
        reason::SUCCESS => NormalDisconnection,
        reason::MALFORMED => MalformedPacket,
        reason::PROTOCOL_ERROR => ProtocolError,
        reason::IMPLEMENTATION_SPECIFIC => ImplementationSpecificError,
        reason::NOT_AUTHORIZED => NotAuthorized,
        reason::SERVER_BUSY => ServerBusy,
        reason::SERVER_SHUTTING_DOWN => ServerShuttingDown,
        reason::KEEP_ALIVE_TIMEOUT => KeepAliveTimeout,
        reason::SESSION_TAKEN_OVER => SessionTakenOver,
        reason::TOPIC_FILTER_INVALID => TopicFilterInvalid,
        reason::TOPIC_NAME_INVALID => TopicNameInvalid,
        reason::RECEIVE_MAXIMUM_EXCEEDED => ReceiveMaximumExceeded,
        reason::TOPIC_ALIAS_INVALID => TopicAliasInvalid,
        reason::PACKET_TOO_LARGE => PacketTooLarge,
        reason::QUOTA_EXCEEDED => QuotaExceeded,
        reason::ADMINISTRATIVE_ACTION => AdministrativeAction,
        reason::PAYLOAD_FORMAT_INVALID => PayloadFormatInvalid,
        reason::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED => SharedSubscriptionNotSupported,
        _ => UnspecifiedError,
    }
}

/// Appends `packet`'s bytes in `version` to `out`.
pub fn encode(packet: &Outbound, version: Version, out: &mut BytesMut) {
    if let Some(o) = packet.outgoing() {
        return publish::encode(&o, version, out);
    }
    let v5 = version == Version::V5;
    let rp_packet = match packet {
        Outbound::ConnAck { session_present, code, props } => {
            let code = if v5 { connect_code_v5(*code) } else { connect_code_v4(*code) };
            let connack = rp::ConnAck { session_present: *session_present, code };
            let props = v5.then(|| rp::ConnAckProperties {
                session_expiry_interval: props.session_expiry,
                receive_max: props.receive_maximum,
                max_qos: None,
                retain_available: None,
                max_packet_size: props.max_packet_size,
                assigned_client_identifier: props.assigned_client_id.clone(),
                topic_alias_max: props.topic_alias_maximum,
                reason_string: props.reason_string.clone(),
                user_properties: Vec::new(),
                wildcard_subscription_available: None,
                subscription_identifiers_available: None,
                shared_subscription_available: None,
                server_keep_alive: props.server_keep_alive,
                response_information: None,
                server_reference: None,
                authentication_method: None,
                authentication_data: None,
            });
            Packet::ConnAck(connack, props)
        }
        Outbound::PubAck { pkid, reason } => {
            let reason = if v5 { puback_reason(*reason) } else { rp::PubAckReason::Success };
            Packet::PubAck(rp::PubAck { pkid: *pkid, reason }, None)
        }
        Outbound::PubRec { pkid, reason } => {
            let reason = if v5 { pubrec_reason(*reason) } else { rp::PubRecReason::Success };
            Packet::PubRec(rp::PubRec { pkid: *pkid, reason }, None)
        }
        Outbound::PubRefused { pkid, qos2: false, reason, text } => {
            let (reason, props) = match v5 {
                true => (
                    puback_reason(*reason),
                    text.clone().map(|t| rp::PubAckProperties { reason_string: Some(t), user_properties: Vec::new() }),
                ),
                false => (rp::PubAckReason::Success, None),
            };
            Packet::PubAck(rp::PubAck { pkid: *pkid, reason }, props)
        }
        Outbound::PubRefused { pkid, qos2: true, reason, text } => {
            let (reason, props) = match v5 {
                true => (
                    pubrec_reason(*reason),
                    text.clone().map(|t| rp::PubRecProperties { reason_string: Some(t), user_properties: Vec::new() }),
                ),
                false => (rp::PubRecReason::Success, None),
            };
            Packet::PubRec(rp::PubRec { pkid: *pkid, reason }, props)
        }
        Outbound::PubRel { pkid, reason } => {
            let reason = match (v5, *reason) {
                (true, 0x92) => rp::PubRelReason::PacketIdentifierNotFound,
                _ => rp::PubRelReason::Success,
            };
            Packet::PubRel(rp::PubRel { pkid: *pkid, reason }, None)
        }
        Outbound::PubComp { pkid, reason } => {
            let reason = match (v5, *reason) {
                (true, 0x92) => rp::PubCompReason::PacketIdentifierNotFound,
                _ => rp::PubCompReason::Success,
            };
            Packet::PubComp(rp::PubComp { pkid: *pkid, reason }, None)
        }
        Outbound::SubAck { pkid, codes } => {
            let return_codes = codes.iter().map(|c| suback_code(*c, version)).collect();
            Packet::SubAck(rp::SubAck { pkid: *pkid, return_codes }, None)
        }
        Outbound::UnsubAck { pkid, codes } => {
            let reasons = if v5 { codes.iter().map(|c| unsuback_code(*c)).collect() } else { Vec::new() };
            Packet::UnsubAck(rp::UnsubAck { pkid: *pkid, reasons }, None)
        }
        Outbound::PingResp => Packet::PingResp(rp::PingResp),
        Outbound::Disconnect { reason } => {
            if !v5 {
                return;
            }
            Packet::Disconnect(rp::Disconnect { reason_code: disconnect_reason(*reason) }, None)
        }
        Outbound::Publish { .. } => return,
    };
    // Every packet above is one the codec of its version writes: no properties or MQTT 5 codes
    // go to `V4`.
    let written = if v5 { V5.write(rp_packet, out) } else { V4.write(rp_packet, out) };
    if let Err(e) = written {
        tracing::error!(error = %e, "MQTT codec refused a packet the broker built");
    }
}
