//! The codec: the traps of rumqttd's codecs guarded, each packet type of both versions decoded,
//! and our PUBLISH bytes read back by rumqttd's own decoder.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use rumqttd::protocol::{Packet, Protocol, v4::V4, v5::V5};

use super::*;
use crate::broker::message::Message;

/// Decoding with no cap on user properties (the cap has its own test).
fn decode(frame: Bytes, version: Version) -> Result<Inbound, DecodeError> {
    super::decode(frame, version, usize::MAX)
}

fn frame(first: u8, body: &[u8]) -> Bytes {
    let mut out = BytesMut::new();
    out.put_u8(first);
    put_varint(&mut out, body.len());
    out.put_slice(body);
    out.freeze()
}

fn connect_body(level: u8, flags: u8, props: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 4, b'M', b'Q', b'T', b'T', level, flags, 0, 0];
    if level == 5 {
        b.push(props.len() as u8);
        b.extend_from_slice(props);
    }
    b.extend_from_slice(rest);
    b
}

/// [MQTT-3.1.2-10] (MQTT 5) / §3.1.2.10: Keep Alive 0 decodes as off; the CONNECT defaults are
/// MQTT's (Receive Maximum 65,535, no will, expiry 0).
#[test]
fn mqtt_3_1_2_10_a_connect_with_keep_alive_zero_decodes() {
    for level in [4, 5] {
        let c = decode_connect(frame(0x10, &connect_body(level, 0b10, &[], &[0, 1, b'c']))).unwrap();
        assert_eq!((c.keep_alive, c.client_id.as_str(), c.clean_start, c.receive_maximum), (0, "c", true, u16::MAX));
    }
}

/// [MQTT-3.1.2-3]: the reserved flag; [MQTT-3.1.2-11], [MQTT-3.1.2-13]: will QoS and retain
/// without a will; [MQTT-3.1.2-12]: will QoS 3; MQTT 3.1.1 [MQTT-3.1.2-22]: a password
/// without a user name. All malformed, none reaches rumqttd.
#[test]
fn mqtt_3_1_2_3_connect_flags_are_checked() {
    for (level, flags) in [(5, 0b0000_0011), (5, 0b0000_1000), (5, 0b0010_0000), (5, 0b0001_1100), (4, 0b0100_0010)] {
        let e = decode_connect(frame(0x10, &connect_body(level, flags, &[], &[0, 1, b'c']))).unwrap_err();
        assert!(matches!(e, DecodeError::Malformed(_)), "flags {flags:08b}: {e}");
    }
    // MQTT 5 allows a password without a user name.
    let ok = decode_connect(frame(0x10, &connect_body(5, 0b0100_0010, &[], &[0, 1, b'c', 0, 2, b'p', b'w'])));
    assert_eq!(ok.unwrap().password.as_deref(), Some("pw"));
}

/// [MQTT-3.1.2-2]: an unsupported protocol level is answered as such (CONNACK 0x84 / 1);
/// [MQTT-3.1.0-1]: a first packet that is not a CONNECT is a protocol error.
#[test]
fn mqtt_3_1_2_2_unsupported_levels_and_a_non_connect_first_packet() {
    let e = decode_connect(frame(0x10, &connect_body(3, 0b10, &[], &[0, 1, b'c']))).unwrap_err();
    assert_eq!((e.clone(), e.reason()), (DecodeError::UnsupportedVersion(3), 0x84));
    assert_eq!(reason::connack_v4(e.reason()), 1);
    assert!(matches!(decode_connect(frame(0x30, &[0, 1, b't'])), Err(DecodeError::Protocol(_))));
}

/// §3.1.2.11.3, §3.1.2.11.4: Receive Maximum and Maximum Packet Size of 0 are protocol errors.
#[test]
fn mqtt_3_1_2_11_zero_receive_maximum_or_packet_size_is_a_protocol_error() {
    for props in [&[0x21, 0, 0][..], &[0x27, 0, 0, 0, 0][..]] {
        let e = decode_connect(frame(0x10, &connect_body(5, 0b10, props, &[0, 1, b'c']))).unwrap_err();
        assert!(matches!(e, DecodeError::Protocol(_)), "{e}");
    }
}

/// §2.1.2: a CONNACK, SUBACK, UNSUBACK or PINGRESP from a client is a protocol error, with or
/// without a body (rumqttd's v5 decoder reaches `unreachable!()` on a CONNACK or UNSUBACK
/// with a body); [MQTT-3.1.0-2]: a second CONNECT too.
#[test]
fn server_packets_from_a_client_are_protocol_errors_not_panics() {
    for version in [Version::V311, Version::V5] {
        for (first, body) in [
            (0x20, &[0, 0][..]),
            (0x20, &[0, 0, 0][..]),
            (0x90, &[0, 1, 0][..]),
            (0xB0, &[0, 1, 0, 0][..]),
            (0xB0, &[0, 1][..]),
            (0xD0, &[][..]),
            (0x10, &connect_body(5, 2, &[], &[0, 0])[..]),
        ] {
            let e = decode(frame(first, body), version).unwrap_err();
            assert!(matches!(e, DecodeError::Protocol(_)), "{first:#x}: {e}");
        }
    }
}

/// §4.12, §2.1.2: AUTH is a packet in MQTT 5 (the core answers it as a protocol error, having
/// started no enhanced authentication); type 15 is reserved in MQTT 3.1.1: malformed.
#[test]
fn auth_is_decoded_in_mqtt5_and_reserved_in_mqtt311() {
    assert_eq!(decode(frame(0xF0, &[0x18, 0]), Version::V5).unwrap(), Inbound::Auth);
    assert!(matches!(decode(frame(0xF0, &[]), Version::V311), Err(DecodeError::Malformed(_))));
    assert!(matches!(decode(frame(0x00, &[]), Version::V5), Err(DecodeError::Malformed(_))));
}

/// [MQTT-2.1.3-1]: reserved fixed-header flags; [MQTT-3.3.1-4]: QoS 3; [MQTT-3.3.1-2]: DUP at
/// QoS 0; [MQTT-3.8.3-5] (3.1.1 [MQTT-3.8.3-4]): reserved subscription option bits;
/// [MQTT-3.8.3-2], [MQTT-3.10.3-2]: a SUBSCRIBE or UNSUBSCRIBE without filters.
#[test]
fn mqtt_2_1_3_1_reserved_bits_and_empty_subscriptions_are_refused() {
    let malformed = |first, body: &[u8], v| matches!(decode(frame(first, body), v), Err(DecodeError::Malformed(_)));
    let protocol = |first, body: &[u8], v| matches!(decode(frame(first, body), v), Err(DecodeError::Protocol(_)));
    assert!(malformed(0x80, &[0, 1, 0, 1, b'a', 0], Version::V311), "SUBSCRIBE flags 0000");
    assert!(!malformed(0x62, &[0, 1], Version::V311) && malformed(0x60, &[0, 1], Version::V311), "PUBREL flags");
    assert!(malformed(0x42 | 0x40, &[0, 1], Version::V311));
    assert!(malformed(0x36, &[0, 1, b't', 0, 1], Version::V311), "QoS 3");
    assert!(malformed(0x38, &[0, 1, b't'], Version::V311), "DUP at QoS 0");
    assert!(malformed(0x82, &[0, 1, 0, 0, 1, b'a', 0b0100_0000], Version::V5), "v5 reserved option bits");
    assert!(malformed(0x82, &[0, 1, 0, 1, b'a', 0b0000_0100], Version::V311), "v3 has only QoS bits");
    assert!(protocol(0x82, &[0, 1, 0], Version::V5), "SUBSCRIBE without filters");
    assert!(protocol(0x82, &[0, 1], Version::V311));
    assert!(protocol(0xA2, &[0, 1, 0], Version::V5), "UNSUBSCRIBE without filters");
    assert!(protocol(0xA2, &[0, 1], Version::V311));
}

/// Each client packet decodes in both versions, with its fields.
#[test]
fn every_client_packet_decodes_in_both_versions() {
    let v5 = Version::V5;
    assert_eq!(decode(frame(0x40, &[0, 7]), v5).unwrap(), Inbound::PubAck { pkid: 7, reason: 0 });
    assert_eq!(decode(frame(0x50, &[0, 7, 0x87, 0]), v5).unwrap(), Inbound::PubRec { pkid: 7, reason: 0x87 });
    assert_eq!(decode(frame(0x62, &[0, 7]), Version::V311).unwrap(), Inbound::PubRel { pkid: 7 });
    assert_eq!(decode(frame(0x70, &[0, 7]), v5).unwrap(), Inbound::PubComp { pkid: 7 });
    assert_eq!(decode(frame(0xC0, &[]), Version::V311).unwrap(), Inbound::PingReq);
    assert_eq!(
        decode(frame(0xE0, &[]), Version::V311).unwrap(),
        Inbound::Disconnect { reason: 0, session_expiry: None }
    );
    assert_eq!(decode(frame(0xE0, &[0x04]), v5).unwrap(), Inbound::Disconnect { reason: 4, session_expiry: None });
    assert_eq!(
        decode(frame(0xE0, &[0, 5, 0x11, 0, 0, 0, 9]), v5).unwrap(),
        Inbound::Disconnect { reason: 0, session_expiry: Some(9) }
    );
    let sub = decode(frame(0x82, &[0, 3, 2, 0x0B, 5, 0, 3, b'a', b'/', b'#', 0b0010_1110]), v5).unwrap();
    match sub {
        Inbound::Subscribe { pkid: 3, filters, id: Some(5) } => {
            let f = &filters[0];
            assert_eq!(
                (f.filter.as_str(), f.qos, f.no_local, f.retain_as_published, f.retain_handling),
                ("a/#", QoS::ExactlyOnce, true, true, 2)
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        decode(frame(0xA2, &[0, 4, 0, 1, b'x']), Version::V311).unwrap(),
        Inbound::Unsubscribe { pkid: 4, filters: vec!["x".into()] }
    );
}

fn message(topic: &str, payload: &[u8], props: PublishProps) -> Arc<Message> {
    Arc::new(Message {
        topic: topic.into(),
        payload: Bytes::copy_from_slice(payload),
        qos: QoS::ExactlyOnce,
        retain: false,
        props,
        expires_at: None,
        origin: None,
        schema: None,
    })
}

/// MQTT 3.1.1 clients never get what `V4::write` would panic on: SUBACK failures are 0x80,
/// CONNACK reasons are return codes, acks carry no reason, no server DISCONNECT is written.
#[test]
fn mqtt311_encoding_never_hands_rumqttd_an_mqtt5_code() {
    let mut out = BytesMut::new();
    encode(&Outbound::SubAck { pkid: 1, codes: vec![0, 0x87, 0x97, 2] }, Version::V311, &mut out);
    assert_eq!(&out[..], &[0x90, 6, 0, 1, 0, 0x80, 0x80, 2]);
    out.clear();
    encode(&Outbound::ConnAck { session_present: false, code: 0x97, props: Box::default() }, Version::V311, &mut out);
    assert_eq!(&out[..], &[0x20, 2, 0, 3]);
    out.clear();
    encode(&Outbound::PubAck { pkid: 9, reason: 0x87 }, Version::V311, &mut out);
    assert_eq!(&out[..], &[0x40, 2, 0, 9]);
    out.clear();
    encode(&Outbound::Disconnect { reason: 0x8E }, Version::V311, &mut out);
    assert!(out.is_empty());
    encode(&Outbound::UnsubAck { pkid: 2, codes: vec![0x11] }, Version::V311, &mut out);
    assert_eq!(&out[..], &[0xB0, 2, 0, 2]);
}

/// MQTT 5 CONNACK and DISCONNECT as rumqttd writes them (its own decoder cannot read a CONNACK
/// back: it reaches `unreachable!()`).
#[test]
fn mqtt5_server_packets_carry_their_codes_and_properties() {
    let connack = Outbound::ConnAck {
        session_present: true,
        code: 0,
        props: Box::new(ConnAckProps {
            receive_maximum: Some(10),
            topic_alias_maximum: Some(16),
            ..ConnAckProps::default()
        }),
    };
    let mut out = BytesMut::new();
    encode(&connack, Version::V5, &mut out);
    // Session Present, reason 0, 6 property bytes: Receive Maximum 10, Topic Alias Maximum 16.
    assert_eq!(&out[..], &[0x20, 9, 1, 0, 6, 0x21, 0, 10, 0x22, 0, 16]);
    let mut out = BytesMut::new();
    encode(&Outbound::Disconnect { reason: 0x97 }, Version::V5, &mut out);
    assert_eq!(&out[..3], &[0xE0, out[1], 0x97]);
    let mut out = BytesMut::new();
    encode(&Outbound::SubAck { pkid: 3, codes: vec![1, 0x87] }, Version::V5, &mut out);
    assert_eq!(&out[..], &[0x90, 5, 0, 3, 0, 1, 0x87]);
}

fn arb_props() -> impl Strategy<Value = PublishProps> {
    (
        proptest::option::of(0u8..=1),
        proptest::option::of("[a-z/]{0,12}"),
        proptest::option::of("[a-z/]{1,12}"),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
        proptest::collection::vec(("[a-zA-Z-]{0,8}", "[ -~]{0,12}"), 0..4),
    )
        .prop_map(|(payload_format, content_type, response_topic, correlation, user)| PublishProps {
            payload_format,
            content_type,
            response_topic,
            correlation_data: correlation.map(Bytes::from),
            user,
        })
}

proptest! {
    /// Our PUBLISH encoder is read back by rumqttd's decoder as what we meant, and by our own
    /// decoder exactly; its announced size is its size.
    #[test]
    fn publish_bytes_are_read_back_by_rumqttd_and_by_us(
        topic in "[a-z0-9/]{1,40}",
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        qos in 0u8..=2,
        pkid in 1u16..,
        retain: bool,
        props in arb_props(),
        expiry in proptest::option::of(any::<u32>()),
        v5: bool,
    ) {
        let version = if v5 { Version::V5 } else { Version::V311 };
        let qos = QoS::from_bits(qos).unwrap();
        let msg = message(&topic, &payload, props.clone());
        let out_packet = Outbound::Publish { msg, qos, pkid, dup: false, retain, expiry, sub_ids: Vec::new() };
        let mut out = BytesMut::new();
        encode(&out_packet, version, &mut out);
        prop_assert_eq!(out.len(), out_packet.encoded_len(version));
        let bytes = out.clone().freeze();
        let ours = publish::decode(&bytes, version, usize::MAX).unwrap();
        prop_assert_eq!(publish::peek(&bytes, version), Some((topic.as_str(), &payload[..])), "peek finds what decode does");
        prop_assert_eq!((ours.topic_str(), &ours.payload[..], ours.qos, ours.pkid * u16::from(qos != QoS::AtMostOnce), ours.retain), (topic.as_str(), &payload[..], qos, pkid * u16::from(qos != QoS::AtMostOnce), retain));
        let decoded = if v5 { V5.read_mut(&mut out, usize::MAX) } else { V4.read_mut(&mut out, usize::MAX) };
        let Ok(Packet::Publish(p, rp_props)) = decoded else { return Err(TestCaseError::fail(format!("{decoded:?}"))) };
        prop_assert_eq!((&p.topic[..], &p.payload[..], p.retain), (topic.as_bytes(), &payload[..], retain));
        if v5 {
            prop_assert_eq!(ours.props, props.clone());
            prop_assert_eq!(ours.message_expiry, expiry);
            let empty = props.is_empty() && expiry.is_none();
            let rp_props = rp_props.unwrap_or_else(|| rumqttd::protocol::PublishProperties {
                payload_format_indicator: None, message_expiry_interval: None, topic_alias: None, response_topic: None,
                correlation_data: None, user_properties: Vec::new(), subscription_identifiers: Vec::new(), content_type: None,
            });
            if !empty {
                prop_assert_eq!(rp_props.user_properties, props.user);
                prop_assert_eq!(rp_props.content_type, props.content_type);
                prop_assert_eq!(rp_props.response_topic, props.response_topic);
                prop_assert_eq!(rp_props.correlation_data, props.correlation_data);
                prop_assert_eq!(rp_props.message_expiry_interval, expiry);
                prop_assert_eq!(rp_props.payload_format_indicator, props.payload_format);
            }
        }
    }

    /// No input panics the decoders (frames of every type, both versions, CONNECT included).
    #[test]
    fn arbitrary_frames_never_panic(first: u8, body in proptest::collection::vec(any::<u8>(), 0..200)) {
        let f = frame(first, &body);
        let _ = frame_len(&f, 1 << 20);
        let _ = decode_connect(f.clone());
        for version in [Version::V311, Version::V5] {
            let peeked = publish::peek(&f, version).map(|(t, p)| (t.to_owned(), p.to_vec()));
            if let Ok(Inbound::Publish(p)) = decode(f.clone(), version) {
                prop_assert_eq!(peeked, Some((p.topic_str().to_owned(), p.payload.to_vec())));
            }
        }
    }
}

/// A PUBLISH with more user properties than the cap keeps only the cap's worth (so one packet
/// cannot make the broker hold 200,000 empty pairs) and counts the rest; those past the cap are
/// still checked.
#[test]
fn user_properties_past_the_cap_are_counted_not_kept() {
    let mut props = BytesMut::new();
    for i in 0..200u8 {
        props.put_u8(0x26);
        props.put_u16(1);
        props.put_u8(b'a' + i % 26);
        props.put_u16(0);
    }
    let mut body = BytesMut::new();
    body.put_u16(1);
    body.put_u8(b't');
    body.put_u16(9);
    put_varint(&mut body, props.len());
    body.put_slice(&props);
    body.put_slice(b"payload");
    let Inbound::Publish(p) = super::decode(frame(0x32, &body), Version::V5, 64).unwrap() else { panic!() };
    assert_eq!((p.props.user.len(), p.excess_user_properties), (64, 136));
    assert_eq!(&p.payload[..], b"payload");
    // A bad string past the cap is still malformed.
    let mut bad = body.clone();
    let at = bad.len() - b"payload".len() - 3;
    bad[at] = 0xff;
    assert!(matches!(super::decode(frame(0x32, &bad), Version::V5, 64), Err(DecodeError::Malformed(_))));
}

/// §2.2.2.2, §3.1.2.11: a property other than User Property appears at most once in a
/// CONNECT's properties and in its will's (rumqttd kept the last); User Property may repeat.
/// [MQTT-3.1.4-1]: a CONNECT that does not match its format closes the connection.
#[test]
fn mqtt_3_1_4_1_a_connect_property_given_twice_is_a_protocol_error() {
    let twice = [0x11, 0, 0, 0, 10, 0x11, 0, 0, 0, 20];
    let e = decode_connect(frame(0x10, &connect_body(5, 0b10, &twice, &[0, 1, b'c']))).unwrap_err();
    assert!(matches!(e, DecodeError::Protocol(_)), "{e}");
    let users = [0x26, 0, 1, b'k', 0, 1, b'v', 0x26, 0, 1, b'k', 0, 1, b'w'];
    assert!(decode_connect(frame(0x10, &connect_body(5, 0b10, &users, &[0, 1, b'c']))).is_ok());
    // A will whose Will Delay Interval comes twice.
    let will = |props: &[u8]| {
        let mut rest = vec![0, 1, b'c', props.len() as u8];
        rest.extend_from_slice(props);
        rest.extend([0, 1, b'w', 0, 1, b'x']);
        decode_connect(frame(0x10, &connect_body(5, 0b0000_0110, &[], &rest)))
    };
    assert!(will(&[0x18, 0, 0, 0, 1]).is_ok());
    assert!(matches!(will(&[0x18, 0, 0, 0, 1, 0x18, 0, 0, 0, 2]), Err(DecodeError::Protocol(_))));
    // [MQTT-3.3.2-14] for the will's Response Topic too.
    assert!(matches!(will(&[0x08, 0, 3, b'r', b'/', b'#']), Err(DecodeError::Protocol(_))));
    assert!(will(&[0x08, 0, 3, b'r', b'/', b'x']).is_ok());
}

/// [MQTT-3.3.2-14]: a Response Topic is a topic name: one with a wildcard is a protocol error.
#[test]
fn mqtt_3_3_2_14_a_response_topic_with_a_wildcard_is_a_protocol_error() {
    let publish = |response: &[u8]| {
        let mut body = BytesMut::new();
        body.put_u16(1);
        body.put_u8(b't');
        body.put_u16(9);
        put_varint(&mut body, 3 + response.len());
        body.put_u8(0x08);
        body.put_u16(response.len() as u16);
        body.put_slice(response);
        super::decode(frame(0x32, &body), Version::V5, 64)
    };
    assert!(publish(b"replies/me").is_ok());
    for bad in [&b"replies/+"[..], b"replies/#", b"#"] {
        assert!(matches!(publish(bad), Err(DecodeError::Protocol(_))), "{}", String::from_utf8_lossy(bad));
    }
}

/// An acknowledgement with the packet id alone (remaining length 2) is read without rumqttd,
/// and must read as rumqttd reads it, in both versions: MQTT 5 §3.4.2.1 (and §3.5.2.1,
/// §3.6.2.1, §3.7.2.1): "The Reason Code and Property Length can be omitted if the Reason Code
/// is 0x00 (Success) and there are no Properties"; MQTT 3.1.1 §3.4.1: remaining length 2.
/// A packet id of 0 is refused either way [MQTT-2.3.1-1].
#[test]
fn short_acknowledgements_read_as_the_mqtt_codec_reads_them() {
    for version in [Version::V311, Version::V5] {
        for first in [0x40, 0x50, 0x62, 0x70] {
            for pkid in [0u16, 1, 2, 255, 256, 0xabcd, u16::MAX] {
                let f = frame(first, &pkid.to_be_bytes());
                let ours = decode(f.clone(), version);
                let theirs = inbound::codec_ack(&f, first >> 4, version).and_then(|i| {
                    if pkid == 0 { Err(DecodeError::Malformed("acknowledgement of packet id 0")) } else { Ok(i) }
                });
                assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{version:?} {first:#x} {pkid}");
                assert_eq!(ours.is_ok(), pkid != 0);
            }
        }
    }
}
