//! SUBSCRIBE and its options.

use super::*;

/// [MQTT-3.8.3-3]: No Local keeps a client's own messages from it.
#[test]
fn mqtt_3_8_3_3_no_local_keeps_own_messages_away() {
    let mut h = Harness::new();
    let c = h.connect("self", Version::V5);
    h.send(c, sub_with(1, "t", QoS::AtMostOnce, |r| r.no_local = true));
    h.recv(c);
    h.send(c, publish("t", QoS::AtMostOnce, 0, "mine"));
    assert!(payloads(&h.recv(c)).is_empty());
    let other = h.connect("other", Version::V5);
    h.send(other, publish("t", QoS::AtMostOnce, 0, "theirs"));
    assert_eq!(payloads(&h.recv(c)), ["theirs"]);
}

/// [MQTT-3.3.1-12], [MQTT-3.3.1-13]: RETAIN is cleared on forwarding unless Retain As
/// Published.
#[test]
fn mqtt_3_3_1_12_retain_as_published_decides_the_retain_flag() {
    let mut h = Harness::new();
    let plain = h.connect("plain", Version::V5);
    h.send(plain, sub(1, "t", QoS::AtMostOnce));
    let rap = h.connect("rap", Version::V5);
    h.send(rap, sub_with(1, "t", QoS::AtMostOnce, |r| r.retain_as_published = true));
    h.recv(plain);
    h.recv(rap);
    let p = h.connect("p", Version::V5);
    h.send(p, retained("t", "r"));
    let flag = |out: Vec<Outbound>| match publishes(&out).first() {
        Some(Outbound::Publish { retain, .. }) => *retain,
        other => panic!("{other:?}"),
    };
    assert!(!flag(h.recv(plain)));
    assert!(flag(h.recv(rap)));
}

/// [MQTT-3.3.1-9], [MQTT-3.3.1-10], [MQTT-3.3.1-11]: Retain Handling 0 sends retained messages
/// at every subscribe, 1 only for a new subscription, 2 never; [MQTT-3.3.1-8] they go with
/// RETAIN set.
#[test]
fn mqtt_3_3_1_10_retain_handling_decides_when_retained_messages_go() {
    let mut h = Harness::new();
    let p = h.connect("p", Version::V5);
    h.send(p, retained("r/1", "kept"));
    let c = h.connect("c", Version::V5);
    for (rh, first, again) in [(0, 1, 1), (1, 1, 0), (2, 0, 0)] {
        let filter = format!("r/+/{rh}");
        let _ = filter;
        h.send(c, sub_with(10 + u16::from(rh), "r/#", QoS::AtMostOnce, |r| r.retain_handling = rh));
        let out = h.recv(c);
        h.send(c, sub_with(20 + u16::from(rh), "r/#", QoS::AtMostOnce, |r| r.retain_handling = rh));
        let out2 = h.recv(c);
        h.send(c, Inbound::Unsubscribe { pkid: 30 + u16::from(rh), filters: vec!["r/#".into()] });
        h.recv(c);
        assert_eq!((payloads(&out).len(), payloads(&out2).len()), (first, again), "retain handling {rh}");
        if first == 1 {
            assert!(matches!(publishes(&out)[0], Outbound::Publish { retain: true, .. }));
        }
    }
}

/// [MQTT-3.3.1-5], [MQTT-3.3.1-6], [MQTT-3.3.1-7], [MQTT-3.3.1-8]: a retained PUBLISH
/// replaces the topic's message, an empty one clears it (and is not stored), RETAIN 0 leaves it.
#[test]
fn mqtt_3_3_1_6_an_empty_retained_message_clears_the_topic() {
    let mut h = Harness::new();
    let p = h.connect("p", Version::V5);
    h.send(p, retained("r", "one"));
    h.send(p, retained("r", "two"));
    h.send(p, publish("r", QoS::AtMostOnce, 0, "not retained"));
    let c = h.connect("c", Version::V5);
    h.send(c, sub(1, "r", QoS::AtMostOnce));
    assert_eq!(payloads(&h.recv(c)), ["two"]);
    h.send(p, retained("r", ""));
    assert_eq!(h.b.retained_count(), 0);
    let d = h.connect("d", Version::V5);
    h.send(d, sub(1, "r", QoS::AtMostOnce));
    assert!(payloads(&h.recv(d)).is_empty());
}

/// Every retained message a new subscription matches arrives, 500 of them at QoS 1 with a
/// Receive Maximum of 10 (rumqttd delivered the first 100).
#[test]
fn mqtt_3_3_1_9_all_five_hundred_retained_messages_reach_a_new_subscriber() {
    let mut h = Harness::new();
    let p = h.connect("p", Version::V5);
    for i in 0..500 {
        let Inbound::Publish(mut pk) = publish(&format!("r/{i}"), QoS::AtLeastOnce, (i + 1) as u16, "v") else {
            unreachable!()
        };
        pk.retain = true;
        h.send(p, Inbound::Publish(pk));
    }
    let mut c = connect_packet("c", Version::V5);
    c.receive_maximum = 10;
    let (s, _) = h.connect_as(c, user("u"));
    h.send(s, sub(1, "r/#", QoS::AtLeastOnce));
    let mut got = 0;
    loop {
        let out = h.recv(s);
        let mine: Vec<u16> = publishes(&out)
            .iter()
            .filter_map(|o| match o {
                Outbound::Publish { pkid, .. } => Some(*pkid),
                _ => None,
            })
            .collect();
        if mine.is_empty() {
            break;
        }
        got += mine.len();
        for pkid in mine {
            h.send(s, Inbound::PubAck { pkid, reason: 0 });
        }
    }
    assert_eq!(got, 500);
}

/// [MQTT-3.3.4-2], [MQTT-3.3.4-3], [MQTT-3.3.4-4]: overlapping subscriptions of one client get
/// one copy, at the highest QoS granted, carrying every subscription identifier.
#[test]
fn mqtt_3_3_4_4_overlapping_subscriptions_give_one_copy_with_every_identifier() {
    let mut h = Harness::new();
    let c = h.connect("c", Version::V5);
    h.send(c, Inbound::Subscribe { pkid: 1, filters: vec![sub_req("a/+", QoS::AtMostOnce)], id: Some(1) });
    h.send(c, Inbound::Subscribe { pkid: 2, filters: vec![sub_req("a/#", QoS::AtLeastOnce)], id: Some(2) });
    h.recv(c);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("a/b", QoS::ExactlyOnce, 1, "x"));
    let out = h.recv(c);
    match publishes(&out).as_slice() {
        [Outbound::Publish { qos, sub_ids, .. }] => {
            let mut ids = sub_ids.clone();
            ids.sort_unstable();
            assert_eq!((*qos, ids), (QoS::AtLeastOnce, vec![1, 2]));
        }
        other => panic!("{other:?}"),
    }
}

/// [MQTT-4.7.2-1]: `#` and `+` do not match topics starting with `$`; a `$SYS/#` subscription
/// is answered and matches them.
#[test]
fn mqtt_4_7_2_1_wildcards_skip_dollar_topics_and_a_dollar_subscription_is_answered() {
    let mut h = Harness::new();
    let all = h.connect("all", Version::V5);
    h.send(all, sub(1, "#", QoS::AtMostOnce));
    h.send(all, sub(2, "+/x", QoS::AtMostOnce));
    let sys = h.connect("sys", Version::V5);
    h.send(sys, sub(3, "$SYS/#", QoS::AtMostOnce));
    assert_eq!(h.recv(sys), [Outbound::SubAck { pkid: 3, codes: vec![0] }]);
    h.recv(all);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("$SYS/x", QoS::AtMostOnce, 0, "s"));
    assert!(payloads(&h.recv(all)).is_empty());
    assert_eq!(payloads(&h.recv(sys)), ["s"]);
}

/// §4.8.2: a shared subscription delivers each message to one member of its group, round
/// robin; [MQTT-4.8.2-1], [MQTT-4.8.2-2] malformed share names are refused 0x8F;
/// [MQTT-3.8.3-4] No Local on one is a protocol error. No retained messages on subscribe.
#[test]
fn mqtt_4_8_2_a_shared_group_gets_each_message_once() {
    let mut h = Harness::new();
    let p = h.connect("p", Version::V5);
    h.send(p, retained("jobs/old", "retained"));
    let (a, b) = (h.connect("a", Version::V5), h.connect("b", Version::V5));
    let plain = h.connect("plain", Version::V5);
    h.send(a, sub(1, "$share/g/jobs/#", QoS::AtMostOnce));
    h.send(b, sub(1, "$share/g/jobs/#", QoS::AtMostOnce));
    h.send(plain, sub(1, "jobs/#", QoS::AtMostOnce));
    assert!(payloads(&h.recv(a)).is_empty(), "no retained messages on a shared subscription");
    h.recv(b);
    h.recv(plain);
    for i in 0..4 {
        h.send(p, publish("jobs/x", QoS::AtMostOnce, 0, &i.to_string()));
    }
    let (ga, gb) = (payloads(&h.recv(a)), payloads(&h.recv(b)));
    assert_eq!((ga.len(), gb.len()), (2, 2), "{ga:?} {gb:?}");
    assert_eq!(payloads(&h.recv(plain)).len(), 4);

    let c = h.connect("c", Version::V5);
    h.send(
        c,
        Inbound::Subscribe {
            pkid: 5,
            filters: vec![
                sub_req("$share//x", QoS::AtMostOnce),
                sub_req("$share/g+/x", QoS::AtMostOnce),
                sub_req("$share/g", QoS::AtMostOnce),
            ],
            id: None,
        },
    );
    assert_eq!(h.recv(c), [Outbound::SubAck { pkid: 5, codes: vec![0x8F, 0x8F, 0x8F] }]);
    h.send(c, sub_with(6, "$share/g/x", QoS::AtMostOnce, |r| r.no_local = true));
    assert_eq!(h.recv(c), [Outbound::Disconnect { reason: 0x82 }]);
}

/// The ACL judges the filter inside `$share/<group>/`: allowed with no ACL at all, refused
/// when the inner filter is (rumqttd refused every shared subscription without an ACL file).
#[test]
fn the_acl_judges_a_shared_subscription_by_its_inner_filter() {
    let acl = crate::auth::Acl::parse("[users.u]\nsubscribe = [\"jobs/#\"]\n").unwrap();
    let rules = Arc::new(acl.rules_for(&crate::auth::Identity::User("u".into()), "c"));
    let mut h = Harness::new();
    let (c, _) = h.connect_as(
        connect_packet("c", Version::V5),
        Identity { owner: "user:u".into(), internal: false, rules: Some(rules) },
    );
    h.send(
        c,
        Inbound::Subscribe {
            pkid: 1,
            filters: vec![sub_req("$share/g/jobs/#", QoS::AtMostOnce), sub_req("$share/g/secret/#", QoS::AtMostOnce)],
            id: None,
        },
    );
    assert_eq!(h.recv(c), [Outbound::SubAck { pkid: 1, codes: vec![0, 0x87] }]);
    let open = h.connect("open", Version::V5);
    h.send(open, sub(2, "$share/g/anything", QoS::AtMostOnce));
    assert_eq!(h.recv(open), [Outbound::SubAck { pkid: 2, codes: vec![0] }]);
}

/// [MQTT-3.10.4-1], [MQTT-3.10.4-4], §3.11.3: UNSUBSCRIBE removes the subscription and is
/// answered, 0x11 for a filter that had none.
#[test]
fn mqtt_3_10_4_4_unsubscribe_is_answered_per_filter() {
    let mut h = Harness::new();
    let c = h.connect("c", Version::V5);
    h.send(c, sub(1, "a", QoS::AtMostOnce));
    h.recv(c);
    h.send(c, Inbound::Unsubscribe { pkid: 2, filters: vec!["a".into(), "b".into()] });
    assert_eq!(h.recv(c), [Outbound::UnsubAck { pkid: 2, codes: vec![0, 0x11] }]);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("a", QoS::AtMostOnce, 0, "x"));
    assert!(payloads(&h.recv(c)).is_empty());
}

/// Subscriptions per session are bounded: past `max_subscriptions` a filter gets 0x97 (MQTT
/// 3.1.1: 0x80); replacing one of them is not a new one.
#[test]
fn the_subscription_bound_refuses_with_0x97() {
    let mut h = Harness::limits(|l| l.max_subscriptions = 2);
    let c = h.connect("c", Version::V5);
    h.send(
        c,
        Inbound::Subscribe {
            pkid: 1,
            filters: vec![
                sub_req("a", QoS::AtMostOnce),
                sub_req("b", QoS::AtMostOnce),
                sub_req("c", QoS::AtMostOnce),
                sub_req("a", QoS::AtLeastOnce),
            ],
            id: None,
        },
    );
    assert_eq!(h.recv(c), [Outbound::SubAck { pkid: 1, codes: vec![0, 0, 0x97, 1] }]);
    let v4 = h.connect("v4", Version::V311);
    h.send(
        v4,
        Inbound::Subscribe {
            pkid: 1,
            filters: vec![sub_req("a", QoS::AtMostOnce), sub_req("b", QoS::AtMostOnce), sub_req("c", QoS::AtMostOnce)],
            id: None,
        },
    );
    assert_eq!(h.recv(v4), [Outbound::SubAck { pkid: 1, codes: vec![0, 0, 0x80] }]);
}

/// The retained store is bounded: a new topic past the bound is refused 0x97 (MQTT 5, QoS 1)
/// and not delivered; at QoS 0 or on MQTT 3.1.1, where there is no way to say so, it is
/// delivered and not retained.
#[test]
fn the_retained_bound_refuses_new_topics() {
    let mut h = Harness::limits(|l| l.max_retained_messages = 1);
    let s = h.connect("s", Version::V5);
    h.send(s, sub(1, "r/#", QoS::AtLeastOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    h.send(p, retained("r/1", "one"));
    let Inbound::Publish(mut two) = publish("r/2", QoS::AtLeastOnce, 9, "two") else { unreachable!() };
    two.retain = true;
    h.send(p, Inbound::Publish(two));
    assert_eq!(h.recv(p), [Outbound::PubAck { pkid: 9, reason: 0x97 }]);
    h.send(p, retained("r/3", "three"));
    assert_eq!(payloads(&h.recv(s)), ["one", "three"]);
    assert_eq!(h.b.retained_count(), 1);
}

/// One SUBSCRIBE with 20,000 copies of `t/#` over 1,000 retained messages took the node past
/// 4 GiB (every copy scanned the store and collected every match): the copies are one
/// subscription now, each answered with its QoS ([MQTT-3.8.4-5]), and the retained messages
/// are queued once.
#[test]
fn repeated_filters_in_one_subscribe_are_one_subscription() {
    let mut h = Harness::new();
    let p = h.connect("p", Version::V5);
    for i in 0..1000 {
        let mut retained = publish(&format!("t/{i}"), QoS::AtMostOnce, 0, "r");
        if let Inbound::Publish(p) = &mut retained {
            p.retain = true;
        }
        h.send(p, retained);
    }
    let c = h.connect("c", Version::V5);
    let mut filters = vec![sub_req("t/#", QoS::AtMostOnce); 20_000];
    filters.push(sub_req("t/#", QoS::AtLeastOnce));
    h.send(c, Inbound::Subscribe { pkid: 1, filters, id: None });
    let out = h.recv(c);
    let Outbound::SubAck { codes, .. } = &out[0] else { panic!("a SUBACK first: {:?}", out[0]) };
    assert_eq!(codes.len(), 20_001);
    assert!(codes[..20_000].iter().all(|&c| c == 0));
    assert_eq!(codes[20_000], 1);
    let mut delivered = payloads(&out).len();
    for _ in 0..20 {
        delivered += payloads(&h.recv(c)).len();
    }
    assert_eq!(delivered, 1000, "each retained message once");
    assert_eq!(h.b.router.len(), 1);
}

/// Past `max_subscribe_filters` distinct filters in one SUBSCRIBE the rest get 0x97 (MQTT
/// 3.1.1: 0x80) and are not subscribed; a repeat of an admitted filter is still answered.
#[test]
fn distinct_filters_per_subscribe_are_bounded() {
    let mut h = Harness::limits(|l| l.max_subscribe_filters = 2);
    let filters = ["a", "b", "c", "a"].map(|f| sub_req(f, QoS::AtMostOnce)).to_vec();
    let c = h.connect("c", Version::V5);
    h.send(c, Inbound::Subscribe { pkid: 1, filters: filters.clone(), id: None });
    assert_eq!(h.recv(c), [Outbound::SubAck { pkid: 1, codes: vec![0, 0, 0x97, 0] }]);
    let v4 = h.connect("v4", Version::V311);
    h.send(v4, Inbound::Subscribe { pkid: 1, filters, id: None });
    assert_eq!(h.recv(v4), [Outbound::SubAck { pkid: 1, codes: vec![0, 0, 0x80, 0] }]);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("c", QoS::AtMostOnce, 0, "not for them"));
    assert!(payloads(&h.recv(c)).is_empty());
}

/// A session record goes to the store only when a subscription was added, changed or
/// removed: a loop of UNSUBSCRIBEs of an unknown filter (or of the same SUBSCRIBE) wrote a
/// whole record per packet, 12 MB to 3.8 GB of memory in 5 s and an SD card's wear.
#[test]
fn only_real_subscription_changes_are_written_to_the_store() {
    let mut h = Harness::new();
    let mut c = connect_packet("durable", Version::V5);
    c.session_expiry = 3600;
    let (conn, _) = h.connect_as(c, user("u"));
    let start = h.persisted().len();
    h.send(conn, sub(1, "a/#", QoS::AtLeastOnce));
    assert_eq!(h.persisted().len(), start + 1);
    for pkid in 2..200 {
        h.send(conn, sub(pkid, "a/#", QoS::AtLeastOnce));
        h.send(conn, Inbound::Unsubscribe { pkid, filters: vec!["never/subscribed".into()] });
    }
    assert_eq!(h.persisted().len(), start + 1, "nothing changed");
    h.send(conn, sub(300, "a/#", QoS::AtMostOnce));
    assert_eq!(h.persisted().last().unwrap().subscriptions[0].1.qos, QoS::AtMostOnce, "an option changed");
    h.send(conn, Inbound::Unsubscribe { pkid: 301, filters: vec!["a/#".into(), "never".into()] });
    assert_eq!(h.persisted().len(), start + 3);
    assert!(h.persisted().last().unwrap().subscriptions.is_empty());
}
