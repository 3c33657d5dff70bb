//! PUBLISH and QoS.

use super::*;

/// [MQTT-3.8.4-8] (MQTT 3.1.1 [MQTT-3.8.4-6]): a message goes out at min(published QoS,
/// granted QoS): a QoS 1 publish reaches a QoS 2 subscriber at QoS 1.
#[test]
fn mqtt_3_8_4_8_delivered_qos_is_the_minimum_of_published_and_granted() {
    let mut h = Harness::new();
    let s2 = h.connect("s2", Version::V5);
    h.send(s2, sub(1, "t", QoS::ExactlyOnce));
    let s0 = h.connect("s0", Version::V311);
    h.send(s0, sub(1, "t", QoS::AtMostOnce));
    h.recv(s2);
    h.recv(s0);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("t", QoS::AtLeastOnce, 1, "x"));
    let qos_of = |out: Vec<Outbound>| match publishes(&out).first() {
        Some(Outbound::Publish { qos, .. }) => *qos,
        other => panic!("{other:?}"),
    };
    assert_eq!(qos_of(h.recv(s2)), QoS::AtLeastOnce);
    assert_eq!(qos_of(h.recv(s0)), QoS::AtMostOnce);
}

/// [MQTT-3.3.4-7]: no more unacknowledged QoS 1 and 2 PUBLISHes to a client than its Receive
/// Maximum; each PUBACK lets the next one go.
#[test]
fn mqtt_3_3_4_7_receive_maximum_bounds_messages_in_flight_to_a_client() {
    let mut h = Harness::new();
    let mut c = connect_packet("rm", Version::V5);
    c.receive_maximum = 2;
    let (s, _) = h.connect_as(c, user("u"));
    h.send(s, sub(1, "t", QoS::AtLeastOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    for i in 1..=4 {
        h.send(p, publish("t", QoS::AtLeastOnce, i, &i.to_string()));
    }
    let first = h.recv(s);
    assert_eq!(payloads(&first), ["1", "2"]);
    assert!(h.recv(s).is_empty());
    let Some(Outbound::Publish { pkid, .. }) = publishes(&first).first().copied().cloned() else { panic!() };
    h.send(s, Inbound::PubAck { pkid, reason: 0 });
    assert_eq!(payloads(&h.recv(s)), ["3"]);
}

/// §4.9 with §3.2.2.3.3: a client that sends more unacknowledged QoS 1 and 2 publishes than our
/// Receive Maximum is disconnected with 0x93.
#[test]
fn mqtt_4_9_receive_maximum_exceeded_by_a_client_disconnects_it_with_0x93() {
    let mut h = Harness::with(
        Limits { receive_maximum: 2, ..Limits::default() },
        Classes::new(vec![Class::new(
            "audit".into(),
            vec![shared::topic::TopicFilter::new("audit/#").unwrap()],
            Route::Central,
            Governance::CentralOnly,
            Lane(0),
            Durability::Full,
            None,
        )]),
    );
    let p = h.connect("p", Version::V5);
    // `full` publishes wait for the spool, so their PUBACKs are owed.
    for i in 1..=2 {
        h.send(p, publish("audit/x", QoS::AtLeastOnce, i, "x"));
    }
    assert!(!h.closing(p));
    h.send(p, publish("audit/x", QoS::AtLeastOnce, 3, "x"));
    assert_eq!(h.recv(p), [Outbound::Disconnect { reason: 0x93 }]);
}

/// [MQTT-3.1.2-24], [MQTT-3.1.2-25]: nothing larger than the client's Maximum Packet Size is
/// sent; such a message is dropped as if sent, and the next one still goes.
#[test]
fn mqtt_3_1_2_25_a_packet_over_the_clients_maximum_is_dropped_as_if_sent() {
    let mut h = Harness::new();
    let mut c = connect_packet("small", Version::V5);
    c.max_packet_size = Some(64);
    let (s, _) = h.connect_as(c, user("u"));
    h.send(s, sub(1, "t", QoS::AtLeastOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("t", QoS::AtLeastOnce, 1, &"x".repeat(100)));
    h.send(p, publish("t", QoS::AtLeastOnce, 2, "fits"));
    let out = h.recv(s);
    assert_eq!(payloads(&out), ["fits"]);
    assert!(out.iter().all(|o| o.encoded_len(Version::V5) <= 64));
}

/// [MQTT-3.3.2-12]: topic aliases up to our maximum are taken; [MQTT-3.3.2-8],
/// [MQTT-3.3.2-9]: 0 or above it is 0x94; §3.3.2.3.4: an alias never set is a protocol error.
#[test]
fn mqtt_3_3_2_12_topic_aliases_are_taken_up_to_the_maximum() {
    let mut h = Harness::limits(|l| l.topic_alias_maximum = 4);
    let s = h.connect("s", Version::V5);
    h.send(s, sub(1, "long/topic", QoS::AtMostOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    let aliased = |topic: &str, alias: u16, payload: &str| {
        let Inbound::Publish(mut pk) = publish(topic, QoS::AtMostOnce, 0, payload) else { unreachable!() };
        pk.topic_alias = Some(alias);
        Inbound::Publish(pk)
    };
    h.send(p, aliased("long/topic", 4, "set"));
    h.send(p, aliased("", 4, "used"));
    assert_eq!(payloads(&h.recv(s)), ["set", "used"]);
    h.send(p, aliased("", 3, "unset"));
    assert_eq!(h.recv(p), [Outbound::Disconnect { reason: 0x82 }]);
    let p = h.connect("p2", Version::V5);
    h.send(p, aliased("long/topic", 5, "over"));
    assert_eq!(h.recv(p), [Outbound::Disconnect { reason: 0x94 }]);
}

/// [MQTT-4.3.3-9]: a resent QoS 2 PUBLISH awaiting its PUBREL is acknowledged again and not
/// delivered again; [MQTT-4.3.3-11]: PUBREL gets PUBCOMP.
#[test]
fn mqtt_4_3_3_9_a_resent_qos2_publish_is_not_delivered_twice() {
    let mut h = Harness::new();
    let s = h.connect("s", Version::V5);
    h.send(s, sub(1, "t", QoS::ExactlyOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("t", QoS::ExactlyOnce, 7, "once"));
    assert_eq!(h.recv(p), [Outbound::PubRec { pkid: 7, reason: 0 }]);
    h.send(p, publish("t", QoS::ExactlyOnce, 7, "once"));
    assert_eq!(h.recv(p), [Outbound::PubRec { pkid: 7, reason: 0 }]);
    h.send(p, Inbound::PubRel { pkid: 7 });
    assert_eq!(h.recv(p), [Outbound::PubComp { pkid: 7, reason: 0 }]);
    assert_eq!(payloads(&h.recv(s)), ["once"]);
}

/// §4.3.3 sender side: QoS 2 out goes PUBLISH, PUBREC, PUBREL, PUBCOMP; a QoS 2 subscriber
/// (the front's own ack juggling disconnected one at its first PUBREC).
#[test]
fn mqtt_4_3_3_qos2_to_a_subscriber_completes_its_four_way_exchange() {
    let mut h = Harness::new();
    let s = h.connect("s", Version::V311);
    h.send(s, sub(1, "#", QoS::ExactlyOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("t", QoS::ExactlyOnce, 1, "x"));
    let out = h.recv(s);
    let Some(Outbound::Publish { pkid, qos: QoS::ExactlyOnce, .. }) = publishes(&out).first().copied().cloned() else {
        panic!("{out:?}")
    };
    h.send(s, Inbound::PubRec { pkid, reason: 0 });
    assert_eq!(h.recv(s), [Outbound::PubRel { pkid, reason: 0 }]);
    h.send(s, Inbound::PubComp { pkid });
    assert!(!h.closing(s));
    h.send(p, Inbound::PubRel { pkid: 1 });
    h.send(p, publish("t", QoS::ExactlyOnce, 2, "y"));
    assert_eq!(payloads(&h.recv(s)), ["y"]);
}

/// [MQTT-4.4.0-1]: on resume, unacknowledged PUBLISHes go again first, with their original
/// packet ids and DUP set, then the rest in order ([MQTT-4.6.0-1]).
#[test]
fn mqtt_4_4_0_1_unacknowledged_messages_are_resent_with_their_packet_ids() {
    let mut h = Harness::new();
    let mut c = connect_packet("r", Version::V5);
    c.session_expiry = 600;
    let (s, _) = h.connect_as(c.clone(), user("u"));
    h.send(s, sub(1, "t", QoS::AtLeastOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("t", QoS::AtLeastOnce, 1, "a"));
    let first = h.recv(s);
    let Some(Outbound::Publish { pkid, .. }) = publishes(&first).first().copied().cloned() else { panic!() };
    h.drop_conn(s);
    h.send(p, publish("t", QoS::AtLeastOnce, 2, "b"));
    c.clean_start = false;
    let (_, out) = h.connect_as(c, user("u"));
    assert_eq!(payloads(&out), ["a", "b"]);
    match publishes(&out)[0] {
        Outbound::Publish { pkid: again, dup, .. } => assert_eq!((*again, *dup), (pkid, true)),
        other => panic!("{other:?}"),
    }
}

/// [MQTT-3.3.2-5], [MQTT-3.3.2-6]: an expired message is not sent; one still valid carries what
/// is left of its Message Expiry Interval.
#[test]
fn mqtt_3_3_2_6_message_expiry_counts_down_while_queued() {
    let mut h = Harness::new();
    let mut c = connect_packet("e", Version::V5);
    c.session_expiry = 600;
    let (s, _) = h.connect_as(c.clone(), user("u"));
    h.send(s, sub(1, "t", QoS::AtLeastOnce));
    h.recv(s);
    h.drop_conn(s);
    let p = h.connect("p", Version::V5);
    for (expiry, payload) in [(10, "short"), (100, "long")] {
        let Inbound::Publish(mut pk) = publish("t", QoS::AtLeastOnce, expiry as u16, payload) else { unreachable!() };
        pk.message_expiry = Some(expiry);
        h.send(p, Inbound::Publish(pk));
    }
    h.advance(Duration::from_secs(30));
    c.clean_start = false;
    let (_, out) = h.connect_as(c, user("u"));
    match publishes(&out).as_slice() {
        [Outbound::Publish { msg, expiry, .. }] => assert_eq!((&*msg.payload, *expiry), (&b"long"[..], Some(70))),
        other => panic!("{other:?}"),
    }
}

/// [MQTT-3.3.5-2]: an MQTT 3.1.1 client cannot hear a refusal: a PUBLISH the ACL refuses is
/// acknowledged positively and not delivered; an MQTT 5 client hears 0x87.
#[test]
fn mqtt_3_3_5_2_a_refused_publish_is_acknowledged_and_dropped() {
    let rules = Arc::new(
        crate::auth::Acl::parse("[users.u]\npublish = [\"ok/#\"]\nsubscribe = [\"#\"]\n")
            .unwrap()
            .rules_for(&crate::auth::Identity::User("u".into()), "c"),
    );
    let mut h = Harness::new();
    let s = h.connect("s", Version::V5);
    h.send(s, sub(1, "#", QoS::AtLeastOnce));
    h.recv(s);
    let identity = Identity { owner: "user:u".into(), internal: false, rules: Some(rules) };
    let (v4, _) = h.connect_as(connect_packet("v4", Version::V311), identity.clone());
    h.send(v4, publish("no/x", QoS::AtLeastOnce, 3, "x"));
    assert_eq!(h.recv(v4), [Outbound::PubAck { pkid: 3, reason: 0 }]);
    let (v5, _) = h.connect_as(connect_packet("v5", Version::V5), identity);
    h.send(v5, publish("no/x", QoS::AtLeastOnce, 4, "x"));
    assert_eq!(h.recv(v5), [Outbound::PubAck { pkid: 4, reason: 0x87 }]);
    assert!(payloads(&h.recv(s)).is_empty());
}

/// A topic alias holds at most `max_topic_length` bytes: a PUBLISH setting one on a longer
/// topic is refused (MQTT 5: 0x90) and sets nothing, so aliases cost at most
/// `topic_alias_maximum` x `max_topic_length` per connection.
#[test]
fn an_alias_on_a_topic_over_the_length_bound_is_not_kept() {
    let mut h = Harness::limits(|l| {
        l.topic_alias_maximum = 2;
        l.max_topic_length = 8;
    });
    let p = h.connect("p", Version::V5);
    let Inbound::Publish(mut pk) = publish("much/too/long", QoS::AtLeastOnce, 1, "x") else { unreachable!() };
    pk.topic_alias = Some(1);
    h.send(p, Inbound::Publish(pk));
    assert_eq!(h.recv(p), [Outbound::PubAck { pkid: 1, reason: 0x90 }]);
    assert!(h.b.conns[&p].aliases.is_empty());
}

/// §3.3.4 with `broker.max_user_properties`: a PUBLISH whose user properties passed the cap (the
/// decoder kept none past it) is refused with 0x97 and delivered to no one.
#[test]
fn a_publish_with_too_many_user_properties_is_refused_with_0x97() {
    let mut h = Harness::new();
    let s = h.connect("s", Version::V5);
    h.send(s, sub(1, "t", QoS::AtLeastOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    let Inbound::Publish(mut packet) = publish("t", QoS::AtLeastOnce, 1, "x") else { unreachable!() };
    packet.excess_user_properties = 1;
    h.send(p, Inbound::Publish(packet));
    assert_eq!(h.recv(p), [Outbound::PubAck { pkid: 1, reason: 0x97 }]);
    assert!(payloads(&h.recv(s)).is_empty());
}

/// User property pairs weigh what they cost in memory (48 bytes and their strings): 1,000
/// empty pairs are 48 KB against the retained store's bound, not nothing.
#[test]
fn empty_user_properties_count_against_the_retained_bytes() {
    let mut h = Harness::limits(|l| {
        l.max_retained_bytes = 100_000;
        l.max_user_properties = 1_000;
    });
    let p = h.connect("p", Version::V5);
    for (i, expect) in [(1u16, 0u8), (2, 0), (3, 0x97)] {
        let Inbound::Publish(mut packet) = publish(&format!("r/{i}"), QoS::AtLeastOnce, i, "x") else { unreachable!() };
        packet.retain = true;
        packet.props.user = vec![(String::new(), String::new()); 1_000];
        h.send(p, Inbound::Publish(packet));
        assert_eq!(h.recv(p), [Outbound::PubAck { pkid: i, reason: expect }], "retained message {i}");
    }
    assert_eq!(h.b.retained_count(), 2);
}
