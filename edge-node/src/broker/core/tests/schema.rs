//! Schema validation on PUBLISH (issue 32): a bound topic's payload is checked before it is
//! stored or acknowledged. MQTT 5 §3.4.2.1 / §3.5.2.1: PUBACK and PUBREC carry reason code 0x99
//! (Payload format invalid) and a Reason String (§3.4.2.2.2), left out when it would pass the
//! client's Maximum Packet Size ([MQTT-3.4.2-2], [MQTT-3.5.2-2]); an MQTT 3.1.1 PUBACK has no
//! reason code (§3.4 of 3.1.1), so a refused publish is dropped and counted there.

use super::*;
use crate::schema::tests::stage;
use crate::schema::{Mode, SchemaBinding, Unstaged, Validator};

const READING: &str = r#"{"type":"object","required":["temp"],"properties":{"temp":{"type":"number"}}}"#;

fn harness(dir: &std::path::Path) -> Harness {
    stage(dir, "reading", 1, READING);
    let binding = SchemaBinding {
        topic: "sensors/+/reading".into(),
        subject: "reading".into(),
        mode: Mode::Enforce,
        unstaged: Unstaged::Refuse,
    };
    let v = Validator::uncounted(&[binding], dir);
    Harness::new().with_schemas(Arc::new(v))
}

#[test]
fn an_invalid_payload_is_refused_with_0x99_and_a_reason_naming_the_field_and_never_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = harness(dir.path());
    let app = h.connect("app", Version::V5);
    h.send(app, sub(1, "sensors/#", QoS::AtLeastOnce));
    h.recv(app);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("sensors/a/reading", QoS::AtLeastOnce, 1, r#"{"temp":"hot"}"#));
    h.send(p, publish("sensors/a/reading", QoS::ExactlyOnce, 2, r#"{}"#));
    h.send(p, publish("sensors/a/reading", QoS::AtLeastOnce, 3, r#"{"temp":21.5}"#));
    let acks = h.recv(p);
    let Outbound::PubRefused { pkid: 1, qos2: false, reason: 0x99, text: Some(text) } = &acks[0] else {
        panic!("{acks:?}")
    };
    assert!(text.starts_with("schema reading v1: /temp: "), "{text}");
    let Outbound::PubRefused { pkid: 2, qos2: true, reason: 0x99, text: Some(text) } = &acks[1] else {
        panic!("{acks:?}")
    };
    assert!(text.contains("temp"), "{text}");
    assert_eq!(acks[2], Outbound::PubAck { pkid: 3, reason: 0 });
    assert_eq!(payloads(&h.recv(app)), [r#"{"temp":21.5}"#]);
    // A refused QoS 2 exchange is over at its PUBREC: the id is free again.
    h.send(p, publish("sensors/a/reading", QoS::ExactlyOnce, 2, r#"{"temp":1}"#));
    assert_eq!(h.recv(p), [Outbound::PubRec { pkid: 2, reason: 0 }]);
}

#[test]
fn an_unbound_topic_is_not_checked() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = harness(dir.path());
    let p = h.connect("p", Version::V5);
    h.send(p, publish("sensors/a/raw", QoS::AtLeastOnce, 1, "not json"));
    assert_eq!(h.recv(p), [Outbound::PubAck { pkid: 1, reason: 0 }]);
}

#[test]
fn an_mqtt_311_publisher_is_acknowledged_but_nothing_is_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = harness(dir.path());
    let app = h.connect("app", Version::V5);
    h.send(app, sub(1, "sensors/#", QoS::AtLeastOnce));
    h.recv(app);
    let p = h.connect("old", Version::V311);
    h.send(p, publish("sensors/a/reading", QoS::AtLeastOnce, 1, "[]"));
    assert_eq!(h.recv(p), [Outbound::PubAck { pkid: 1, reason: 0 }]);
    assert!(!h.closing(p), "the connection stays up");
    assert!(payloads(&h.recv(app)).is_empty());
}

#[test]
fn the_reason_string_is_left_out_when_it_would_pass_the_clients_maximum_packet_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = harness(dir.path());
    let mut c = connect_packet("small", Version::V5);
    c.max_packet_size = Some(16);
    let (p, _) = h.connect_as(c, user("small"));
    h.send(p, publish("sensors/a/reading", QoS::AtLeastOnce, 1, "{}"));
    assert_eq!(h.recv(p), [Outbound::PubRefused { pkid: 1, qos2: false, reason: 0x99, text: None }]);
}
