//! routing.

use super::*;

fn central_classes(durability: Durability, route: Route) -> Classes {
    Classes::new(vec![Class::new(
        "telemetry".into(),
        vec![shared::topic::TopicFilter::new("telemetry/#").unwrap()],
        route,
        Governance::None,
        Lane(2),
        durability,
        None,
    )])
}

/// A `central` class goes to the spool only; the publisher's PUBACK waits for the spool's
/// answer; a `both` + `full` message reaches local subscribers only once committed, and a
/// refused one is answered 0x97 and never delivered.
#[test]
fn routes_decide_spool_and_local_delivery_and_full_pubacks_wait_for_the_commit() {
    use Durability;
    use Route;
    let mut h = Harness::with(Limits::default(), central_classes(Durability::Normal, Route::Central));
    let s = h.connect("s", Version::V5);
    h.send(s, sub(1, "#", QoS::AtLeastOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("telemetry/a", QoS::AtLeastOnce, 1, "up"));
    assert_eq!(h.spooled.len(), 1);
    assert!(h.recv(p).is_empty(), "PUBACK waits for the spool to take it");
    let ticket = h.spooled[0].ticket;
    h.b.spooled(ticket, Spooled::Accepted, h.now);
    assert_eq!(h.recv(p), [Outbound::PubAck { pkid: 1, reason: 0 }]);
    assert!(payloads(&h.recv(s)).is_empty(), "central: not for local subscribers");

    let mut h = Harness::with(Limits::default(), central_classes(Durability::Full, Route::Both));
    let s = h.connect("s", Version::V5);
    h.send(s, sub(1, "#", QoS::AtLeastOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("telemetry/a", QoS::AtLeastOnce, 1, "ok"));
    h.send(p, publish("telemetry/a", QoS::AtLeastOnce, 2, "refused"));
    h.send(p, publish("other", QoS::AtLeastOnce, 3, "local"));
    assert!(h.recv(p).is_empty(), "acks keep publish order behind the waiting ones");
    assert_eq!(payloads(&h.recv(s)), ["local"]);
    let (t1, t2) = (h.spooled[0].ticket, h.spooled[1].ticket);
    h.b.spooled(t1, Spooled::Accepted, h.now);
    h.b.spooled(t2, Spooled::Refused, h.now);
    assert_eq!(
        h.recv(p),
        [
            Outbound::PubAck { pkid: 1, reason: 0 },
            Outbound::PubAck { pkid: 2, reason: 0x97 },
            Outbound::PubAck { pkid: 3, reason: 0 }
        ]
    );
    assert_eq!(payloads(&h.recv(s)), ["ok"]);
}

/// Wills go through routing and governance like any message: a will on a `central` topic goes
/// to the spool, not to local subscribers.
#[test]
fn a_will_on_a_central_topic_goes_to_the_spool_not_to_local_subscribers() {
    let mut h = Harness::with(Limits::default(), central_classes(Durability::Normal, Route::Central));
    let s = h.connect("s", Version::V5);
    h.send(s, sub(1, "#", QoS::AtLeastOnce));
    h.recv(s);
    let (w, _) = h.connect_as(with_will("w", "telemetry/last-words", 0), user("u"));
    h.drop_conn(w);
    assert_eq!(h.spooled.len(), 1);
    assert_eq!(h.spooled[0].message.topic, "telemetry/last-words");
    assert!(payloads(&h.recv(s)).is_empty());
}

/// Internal topics (the SLO probe's) reach only the node's own clients, and only they publish
/// there.
#[test]
fn internal_topics_reach_only_internal_clients() {
    let mut h = Harness::limits(|l| l.internal_topics = vec!["_edge/probe".into()]);
    let user_sub = h.connect("u", Version::V5);
    h.send(user_sub, sub(1, "#", QoS::AtMostOnce));
    h.recv(user_sub);
    let internal = Identity { owner: "internal".into(), internal: true, rules: None };
    let (probe, _) = h.connect_as(connect_packet("_probe", Version::V5), internal);
    h.send(probe, sub(1, "_edge/probe", QoS::AtLeastOnce));
    h.recv(probe);
    h.send(probe, publish("_edge/probe", QoS::AtLeastOnce, 1, "tick"));
    assert_eq!(payloads(&h.recv(probe)), ["tick"]);
    assert!(payloads(&h.recv(user_sub)).is_empty());
    let other = h.connect("o", Version::V5);
    h.send(other, publish("_edge/probe", QoS::AtLeastOnce, 1, "fake"));
    assert_eq!(h.recv(other), [Outbound::PubAck { pkid: 1, reason: 0x87 }]);
}

/// Sessions with expiry above 0 are stored (subscriptions, expiry, owner) and come back after
/// a restart, expiring from their disconnect; clean sessions are never stored.
#[test]
fn stored_sessions_come_back_after_a_restart() {
    let mut h = Harness::new();
    let mut c = connect_packet("durable", Version::V5);
    c.session_expiry = 3600;
    let (conn, _) = h.connect_as(c.clone(), user("alice"));
    h.send(conn, sub(1, "a/#", QoS::AtLeastOnce));
    h.drop_conn(conn);
    h.connect("clean", Version::V5);
    let record = h.persisted().last().copied().cloned().unwrap();
    assert_eq!((record.client_id.as_str(), record.owner.as_str(), record.expiry), ("durable", "user:alice", 3600));
    assert!(record.disconnected_ms.is_some());
    assert!(h.persisted().iter().all(|r| r.client_id != "clean"));

    let mut restarted = h;
    restarted.restart(Duration::from_secs(1));
    let p = restarted.connect("p", Version::V5);
    restarted.send(p, publish("a/b", QoS::AtLeastOnce, 1, "queued for you"));
    c.clean_start = false;
    assert_eq!(restarted.try_connect(c.clone(), user("mallory")).unwrap_err().code, 0x85);
    let (_, out) = restarted.connect_as(c, user("alice"));
    assert!(Harness::connack(&out).0);
    assert_eq!(payloads(&out), ["queued for you"]);
}

/// [MQTT-4.3.3-9] with a spool that refuses: a QoS 2 publish the spool did not take leaves no
/// packet id behind, so the MQTT 3.1.1 client's resend after the close (no PUBREC: 3.1.1 cannot
/// refuse) is a new message for the spool, not a duplicate confirmed with PUBREC 0x00.
#[test]
fn mqtt_4_3_3_9_a_qos2_publish_the_spool_refused_is_not_taken_as_received() {
    let mut h = Harness::with(Limits::default(), central_classes(Durability::Full, Route::Central));
    let mut c = connect_packet("p", Version::V311);
    c.clean_start = false;
    c.session_expiry = u32::MAX;
    let (p, _) = h.connect_as(c.clone(), user("u"));
    h.send(p, publish("telemetry/a", QoS::ExactlyOnce, 7, "x"));
    let ticket = h.spooled[0].ticket;
    h.b.spooled(ticket, Spooled::Refused, h.now);
    assert!(h.closing(p), "3.1.1 hears a refusal as a close");
    assert!(h.recv(p).iter().all(|o| !matches!(o, Outbound::PubRec { .. })));
    h.drop_conn(p);
    let (p, _) = h.connect_as(c, user("u"));
    h.send(p, publish("telemetry/a", QoS::ExactlyOnce, 7, "x"));
    assert_eq!(h.spooled.len(), 2, "the resend goes to the spool again");
    assert!(h.recv(p).is_empty(), "and its PUBREC waits for it");
    h.b.spooled(h.spooled[1].ticket, Spooled::Accepted, h.now);
    assert_eq!(h.recv(p), [Outbound::PubRec { pkid: 7, reason: 0 }]);
}

/// [MQTT-4.3.3-9]: a QoS 2 resend that comes while the first copy still waits for the spool
/// gets its PUBREC from the same outcome: 0x97 if the spool refuses, never a 0x00 before it.
#[test]
fn mqtt_4_3_3_9_a_qos2_resend_waits_for_the_spool_outcome_of_the_first() {
    for (outcome, code) in [(Spooled::Refused, 0x97), (Spooled::Accepted, 0)] {
        let mut h = Harness::with(Limits::default(), central_classes(Durability::Full, Route::Central));
        let mut c = connect_packet("p", Version::V5);
        c.clean_start = false;
        c.session_expiry = 600;
        let (p, _) = h.connect_as(c.clone(), user("u"));
        h.send(p, publish("telemetry/a", QoS::ExactlyOnce, 7, "x"));
        h.drop_conn(p);
        let (p, _) = h.connect_as(c, user("u"));
        h.send(p, publish("telemetry/a", QoS::ExactlyOnce, 7, "x"));
        assert_eq!(h.spooled.len(), 1, "a resend, not a new message");
        assert!(h.recv(p).is_empty(), "no PUBREC before the spool answered");
        h.b.spooled(h.spooled[0].ticket, outcome, h.now);
        assert_eq!(h.recv(p), [Outbound::PubRec { pkid: 7, reason: code }]);
        // Refused: the exchange ended, the id is free for a new message. Taken: a resend goes
        // to the spool again under its receipt, which the spool takes once.
        h.send(p, publish("telemetry/a", QoS::ExactlyOnce, 7, "x"));
        assert_eq!(h.spooled.len(), 2);
        let receipts: Vec<_> = h.spooled.iter().map(|r| r.message.properties.receipt).collect();
        assert_eq!(receipts[0] == receipts[1], code == 0, "{receipts:?}");
    }
}

/// What the cloud's sink could not store whole (as the bridge said in its Welcome) is refused
/// at PUBLISH when it is bound for the cloud: MQTT 5 hears 0x83 and it reaches no one; an MQTT
/// 3.1.1 client is disconnected (it cannot hear a refusal); the same message on a local topic
/// is not the sink's business.
#[test]
fn a_cloud_bound_publish_the_sink_could_not_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fit = Arc::new(crate::spool::SinkFit::load(&dir.path().join("spool.db")));
    fit.update(Some(shared::proto::SinkLimits { record_bytes: 1000, header_bytes: 500 }));
    let mut h = Harness::with(Limits::default(), central_classes(Durability::Normal, Route::Both));
    h.b = std::mem::replace(
        &mut h.b,
        Broker::new(
            Limits::default(),
            Arc::new(Classes::default()),
            BrokerMetrics::new(&mut Default::default()),
            h.wall,
        ),
    )
    .with_sink_limits(fit);
    let s = h.connect("s", Version::V5);
    h.send(s, sub(1, "#", QoS::AtLeastOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    let big = "x".repeat(2000);
    h.send(p, publish("telemetry/a", QoS::AtLeastOnce, 1, &big));
    assert_eq!(h.recv(p), [Outbound::PubAck { pkid: 1, reason: 0x83 }]);
    assert!(h.spooled.is_empty() && payloads(&h.recv(s)).is_empty(), "neither spooled nor delivered");
    h.send(p, publish("telemetry/a", QoS::AtLeastOnce, 2, "small"));
    assert_eq!(h.spooled.len(), 1);
    h.send(p, publish("local/a", QoS::AtLeastOnce, 3, &big));
    assert!(payloads(&h.recv(s)).contains(&big), "a local topic is not the sink's business");
    let old = h.connect("old", Version::V311);
    h.send(old, publish("telemetry/a", QoS::AtLeastOnce, 4, &big));
    assert!(h.closing(old), "3.1.1 cannot hear a refusal but as a close");
}

/// [MQTT-4.3.3-9] across a crash, where the session store and the spool commit apart: a QoS 2
/// message goes to the spool under a receipt only once the receipt (its packet id) is
/// committed, and a resend goes there again under the same receipt, for the spool to take once.
/// So a crash never leaves it spooled with no id to tell its resend by (it reached the cloud
/// two and three times), nor an id whose message the spool lost (its resend was PUBRECed and
/// never spooled). A released receipt is the spool's to forget once the release is committed.
#[test]
fn mqtt_4_3_3_9_a_qos2_message_is_spooled_under_its_receipt_once_the_receipt_is_stored() {
    use super::durable::durable;
    for route in [Route::Central, Route::Both] {
        let mut h = Harness::with(Limits::default(), central_classes(Durability::Normal, route));
        let (p, _) = h.connect_as(durable("p", Version::V5), user("u"));
        h.hold_store = true;
        h.send(p, publish("telemetry/a", QoS::ExactlyOnce, 7, "x"));
        assert!(h.spooled.is_empty(), "not before its receipt is committed");
        h.commit_store();
        h.drain();
        let receipt = h.spooled[0].message.properties.receipt.expect("under a receipt");
        // The node dies before the spool answered: the resend goes to the spool again, under
        // the same receipt (the spool, which may hold it, takes it once).
        h.crash(Duration::from_secs(1));
        let (p, _) = h.connect_as(durable("p", Version::V5), user("u"));
        let Inbound::Publish(mut again) = publish("telemetry/a", QoS::ExactlyOnce, 7, "x") else { unreachable!() };
        again.dup = true;
        h.send(p, Inbound::Publish(again));
        assert_eq!(h.spooled.len(), 1, "{route:?}");
        assert_eq!(h.spooled[0].message.properties.receipt, Some(receipt));
        assert!(h.recv(p).is_empty(), "its PUBREC follows the spool's answer");
        h.b.spooled(h.spooled[0].ticket, Spooled::Accepted, h.now);
        assert_eq!(h.recv(p), [Outbound::PubRec { pkid: 7, reason: 0 }]);
        h.hold_store = true;
        h.send(p, Inbound::PubRel { pkid: 7 });
        assert!(h.forgotten.is_empty(), "the release first");
        h.commit_store();
        h.drain();
        assert_eq!(h.forgotten, [receipt]);
        assert_eq!(h.recv(p), [Outbound::PubComp { pkid: 7, reason: 0 }]);
    }
}
