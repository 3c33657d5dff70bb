//! MQTT 3.1.1 and 5 packets as the broker core sees them, and their bytes on the wire.
//!
//! Decoding and encoding go through rumqttd's public `protocol` codecs (`V4`, `V5`), except
//! where those cannot do the job:
//! - PUBLISH in both directions ([`publish`]): rumqttd keeps a publish's QoS and packet id
//!   crate-private, so a decoded one cannot be read and an outgoing one cannot be written with
//!   the subscriber's packet id. It is also the hot path: one parse, no copy of the topic.
//! - AUTH, which rumqttd does not know.
//! - The traps, guarded here before rumqttd sees a frame: a client-sent CONNACK, SUBACK,
//!   UNSUBACK or PINGRESP is a protocol error (rumqttd's v5 decoder reaches `unreachable!()` on
//!   a CONNACK or UNSUBACK with a body); the fixed header's reserved flags, CONNECT's flag
//!   rules and SUBSCRIBE's reserved option bits are checked (rumqttd does not); an empty
//!   SUBSCRIBE or UNSUBSCRIBE is a protocol error; and nothing with properties or an MQTT 5
//!   reason code is handed to `V4::write`, which panics on them.
//!
//! Every decoder takes a whole frame whose length [`frame_len`] checked against the size limit
//! before its body was buffered.

mod acks;
mod inbound;
mod outbound;
mod props;
pub mod publish;

pub use inbound::{Connect, Inbound, SubscribeRequest, Will, decode, decode_connect};
pub use outbound::{ConnAckProps, Outbound, encode};
pub use publish::PublishPacket;
// What a message carries, named where the codec reads and writes it.
pub use crate::broker::message::{PublishProps, QoS};

/// The MQTT protocol level of a connection, from its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    V311,
    V5,
}

/// Why a frame could not be taken, with the reason code it is answered with (MQTT 5 §2.4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    #[error("packet of {size} bytes is over the {max} byte limit")]
    TooLarge { size: usize, max: usize },
    #[error("protocol level {0} is not supported (MQTT 3.1.1 and 5 are)")]
    UnsupportedVersion(u8),
}

impl DecodeError {
    /// The MQTT 5 reason code for a CONNACK or DISCONNECT answering this error.
    pub(crate) fn reason(&self) -> u8 {
        match self {
            DecodeError::Malformed(_) => reason::MALFORMED,
            DecodeError::Protocol(_) => reason::PROTOCOL_ERROR,
            DecodeError::TooLarge { .. } => reason::PACKET_TOO_LARGE,
            DecodeError::UnsupportedVersion(_) => reason::UNSUPPORTED_VERSION,
        }
    }

    /// The label counted for it.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            DecodeError::Malformed(_) => "malformed",
            DecodeError::Protocol(_) => "protocol_error",
            DecodeError::TooLarge { .. } => "packet_too_large",
            DecodeError::UnsupportedVersion(_) => "unsupported_version",
        }
    }
}

/// Where the next packet in `buf` ends: `Ok(None)` when more bytes are needed. Checks `max` from
/// the fixed header alone, before the body is buffered.
pub(crate) fn frame_len(buf: &[u8], max: usize) -> Result<Option<usize>, DecodeError> {
    let mut remaining: usize = 0;
    for i in 0..4 {
        let Some(&byte) = buf.get(1 + i) else {
            return Ok(None);
        };
        remaining |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let size = 2 + i + remaining;
            if size > max {
                return Err(DecodeError::TooLarge { size, max });
            }
            return Ok((buf.len() >= size).then_some(size));
        }
    }
    Err(DecodeError::Malformed("remaining length over four bytes"))
}

/// Where a frame's variable header starts.
pub(crate) fn body_start(frame: &[u8]) -> usize {
    frame.iter().skip(1).position(|b| b & 0x80 == 0).map_or(frame.len(), |i| i + 2)
}

/// Writes an MQTT variable byte integer.
pub(crate) fn put_varint(out: &mut bytes::BytesMut, mut n: usize) {
    use bytes::BufMut;
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

/// Bytes an MQTT variable byte integer takes.
pub(crate) fn varint_len(n: usize) -> usize {
    match n {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// A variable byte integer at the start of `buf`: its value and its length in bytes.
pub(crate) fn read_varint(buf: &[u8]) -> Option<(usize, usize)> {
    let mut value = 0usize;
    for (i, &b) in buf.iter().take(4).enumerate() {
        value |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

pub(crate) fn read_u16(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*buf.get(at)?, *buf.get(at + 1)?]))
}

/// MQTT 5 reason codes the broker uses (§2.4), and the MQTT 3.1.1 return codes.
pub(crate) mod reason {
    pub(crate) const SUCCESS: u8 = 0x00;
    pub(crate) const DISCONNECT_WITH_WILL: u8 = 0x04;
    pub(crate) const NO_MATCHING_SUBSCRIBERS: u8 = 0x10;
    pub(crate) const NO_SUBSCRIPTION_EXISTED: u8 = 0x11;
    pub(crate) const UNSPECIFIED: u8 = 0x80;
    pub(crate) const MALFORMED: u8 = 0x81;
    pub(crate) const PROTOCOL_ERROR: u8 = 0x82;
    pub(crate) const IMPLEMENTATION_SPECIFIC: u8 = 0x83;
    pub(crate) const UNSUPPORTED_VERSION: u8 = 0x84;
    pub(crate) const CLIENT_ID_NOT_VALID: u8 = 0x85;
    pub(crate) const BAD_CREDENTIALS: u8 = 0x86;
    pub(crate) const NOT_AUTHORIZED: u8 = 0x87;
    pub(crate) const SERVER_BUSY: u8 = 0x89;
    pub(crate) const BAD_AUTH_METHOD: u8 = 0x8C;
    pub(crate) const KEEP_ALIVE_TIMEOUT: u8 = 0x8D;
    pub(crate) const SESSION_TAKEN_OVER: u8 = 0x8E;
    pub(crate) const TOPIC_FILTER_INVALID: u8 = 0x8F;
    pub(crate) const SERVER_SHUTTING_DOWN: u8 = 0x8B;
    pub(crate) const TOPIC_NAME_INVALID: u8 = 0x90;
    pub(crate) const PACKET_ID_IN_USE: u8 = 0x91;
    pub(crate) const PACKET_ID_NOT_FOUND: u8 = 0x92;
    pub(crate) const RECEIVE_MAXIMUM_EXCEEDED: u8 = 0x93;
    pub(crate) const TOPIC_ALIAS_INVALID: u8 = 0x94;
    pub(crate) const PACKET_TOO_LARGE: u8 = 0x95;
    pub(crate) const QUOTA_EXCEEDED: u8 = 0x97;
    pub(crate) const ADMINISTRATIVE_ACTION: u8 = 0x98;
    pub(crate) const PAYLOAD_FORMAT_INVALID: u8 = 0x99;
    pub(crate) const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0x9E;
    /// MQTT 3.1.1 CONNACK return codes (§3.2.2.3).
    pub(crate) const V4_UNACCEPTABLE_VERSION: u8 = 1;
    pub(crate) const V4_IDENTIFIER_REJECTED: u8 = 2;
    pub(crate) const V4_SERVER_UNAVAILABLE: u8 = 3;
    pub(crate) const V4_BAD_CREDENTIALS: u8 = 4;
    pub(crate) const V4_NOT_AUTHORIZED: u8 = 5;
    /// MQTT 3.1.1 SUBACK failure.
    pub(crate) const V4_SUBACK_FAILURE: u8 = 0x80;

    /// The MQTT 3.1.1 CONNACK return code for an MQTT 5 CONNACK reason.
    pub(crate) fn connack_v4(code: u8) -> u8 {
        match code {
            SUCCESS => 0,
            UNSUPPORTED_VERSION => V4_UNACCEPTABLE_VERSION,
            CLIENT_ID_NOT_VALID => V4_IDENTIFIER_REJECTED,
            BAD_CREDENTIALS => V4_BAD_CREDENTIALS,
            NOT_AUTHORIZED | BAD_AUTH_METHOD => V4_NOT_AUTHORIZED,
            _ => V4_SERVER_UNAVAILABLE,
        }
    }
}

#[cfg(test)]
mod tests;
