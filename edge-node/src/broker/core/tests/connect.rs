//! CONNECT, sessions, keep-alive.

use super::*;

/// [MQTT-3.1.2-22] (MQTT 3.1.1 [MQTT-3.1.2-24]): no packet for 1.5 x Keep Alive closes the
/// connection; MQTT 5 hears DISCONNECT 0x8D first.
#[test]
fn mqtt_3_1_2_22_keep_alive_closes_after_one_and_a_half_periods() {
    let mut h = Harness::new();
    let mut c = connect_packet("ka", Version::V5);
    c.keep_alive = 10;
    let (conn, _) = h.connect_as(c, user("u"));
    assert_eq!(h.b.keep_alive_deadline(conn), Some(h.now + Duration::from_secs(15)));
    h.now += Duration::from_secs(14);
    h.send(conn, Inbound::PingReq);
    assert_eq!(h.recv(conn), [Outbound::PingResp]);
    h.now += Duration::from_secs(14);
    h.b.check_keep_alive(conn, h.now);
    assert!(!h.closing(conn), "a packet 14 s ago keeps it open");
    h.now += Duration::from_secs(2);
    h.b.check_keep_alive(conn, h.now);
    assert_eq!(h.recv(conn), [Outbound::Disconnect { reason: 0x8D }]);
    assert!(h.closing(conn));
}

/// §3.1.2.10: a Keep Alive of 0 turns keep-alive off, and the CONNECT is accepted (rumqttd
/// refused it, which failed every test of a black-box conformance check).
#[test]
fn mqtt_3_1_2_10_keep_alive_zero_is_accepted_and_never_times_out() {
    for version in [Version::V311, Version::V5] {
        let mut h = Harness::new();
        let mut c = connect_packet("ka0", version);
        c.keep_alive = 0;
        let (conn, out) = h.connect_as(c, user("u"));
        assert_eq!(Harness::connack(&out).1, 0);
        assert_eq!(h.b.keep_alive_deadline(conn), None);
        h.now += Duration::from_secs(86_400);
        h.b.check_keep_alive(conn, h.now);
        assert!(!h.closing(conn));
    }
}

/// §3.2.2.3.14 with [MQTT-3.1.2-21]: above the server's maximum (or off), MQTT 5 clients are
/// told the Server Keep Alive they must use, and it is enforced.
#[test]
fn mqtt_3_1_2_21_server_keep_alive_is_announced_and_enforced() {
    let mut h = Harness::limits(|l| l.max_keep_alive = Some(30));
    let mut c = connect_packet("ska", Version::V5);
    c.keep_alive = 0;
    let (conn, out) = h.connect_as(c, user("u"));
    assert_eq!(Harness::connack(&out).2.server_keep_alive, Some(30));
    assert_eq!(h.b.keep_alive_deadline(conn), Some(h.now + Duration::from_secs(45)));
}

/// [MQTT-3.1.2-4], [MQTT-3.2.2-2]: Clean Start 1 discards the session; Session Present 0.
#[test]
fn mqtt_3_1_2_4_clean_start_discards_the_session() {
    let mut h = Harness::new();
    let mut c = connect_packet("cs", Version::V5);
    c.clean_start = false;
    c.session_expiry = 300;
    let (conn, _) = h.connect_as(c.clone(), user("u"));
    h.send(conn, sub(1, "a/#", QoS::AtLeastOnce));
    h.drop_conn(conn);
    c.clean_start = true;
    let (conn, out) = h.connect_as(c, user("u"));
    assert!(!Harness::connack(&out).0, "Session Present must be 0");
    let p = h.connect("p", Version::V5);
    h.send(p, publish("a/b", QoS::AtLeastOnce, 1, "x"));
    assert!(payloads(&h.recv(conn)).is_empty(), "the old subscription went with the session");
}

/// [MQTT-3.1.2-5], [MQTT-3.2.2-3], [MQTT-3.1.2-23]: with expiry above 0 the session outlives its
/// connection (Clean Start 1 included), keeps QoS 1 messages for it, and Clean Start 0 resumes
/// it with Session Present 1.
#[test]
fn mqtt_3_1_2_23_a_session_with_expiry_is_kept_and_resumed() {
    let mut h = Harness::new();
    let mut c = connect_packet("keep", Version::V5);
    c.clean_start = true;
    c.session_expiry = 300;
    let (conn, _) = h.connect_as(c.clone(), user("u"));
    h.send(conn, sub(1, "a/#", QoS::AtLeastOnce));
    h.recv(conn);
    h.drop_conn(conn);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("a/b", QoS::AtLeastOnce, 1, "while away"));
    h.send(p, publish("a/b", QoS::AtMostOnce, 0, "qos0 not kept"));
    h.advance(Duration::from_secs(200));
    c.clean_start = false;
    let (_, out) = h.connect_as(c, user("u"));
    assert!(Harness::connack(&out).0, "Session Present must be 1");
    assert_eq!(payloads(&out), ["while away"]);
}

/// §3.1.2.11.2: a session expires its interval after the connection closed; expiry 0 ends
/// with the connection.
#[test]
fn mqtt_3_1_2_11_2_sessions_expire_and_expiry_zero_ends_at_close() {
    let mut h = Harness::new();
    let mut c = connect_packet("exp", Version::V5);
    c.session_expiry = 60;
    let (conn, _) = h.connect_as(c.clone(), user("u"));
    h.drop_conn(conn);
    assert_eq!(h.b.session_count(), 1);
    h.advance(Duration::from_secs(59));
    assert_eq!(h.b.session_count(), 1);
    h.advance(Duration::from_secs(2));
    assert_eq!(h.b.session_count(), 0);
    assert!(h.ops().any(|op| matches!(op, StoreOp::Forget { .. })), "the store forgets an expired session");
    let zero = h.connect("zero", Version::V5);
    h.drop_conn(zero);
    assert_eq!(h.b.session_count(), 0);
}

/// §3.14.2.2.2: the DISCONNECT's Session Expiry Interval replaces the CONNECT's; one that
/// starts from 0 is a protocol error.
#[test]
fn mqtt_3_14_2_2_2_disconnect_sets_session_expiry_but_not_from_zero() {
    let mut h = Harness::new();
    let mut c = connect_packet("d", Version::V5);
    c.session_expiry = 10;
    let (conn, _) = h.connect_as(c, user("u"));
    h.send(conn, Inbound::Disconnect { reason: 0, session_expiry: Some(0) });
    assert_eq!(h.b.session_count(), 0, "expiry 0 from the DISCONNECT ends the session");

    let conn = h.connect("z", Version::V5);
    h.send(conn, Inbound::Disconnect { reason: 0, session_expiry: Some(100) });
    assert_eq!(h.recv(conn), [Outbound::Disconnect { reason: 0x82 }]);
}

/// [MQTT-3.1.4-3]: a second connection with the client id takes the session over; the first
/// hears DISCONNECT 0x8E and is closed.
#[test]
fn mqtt_3_1_4_3_session_takeover_disconnects_the_old_connection() {
    let mut h = Harness::new();
    let old = h.connect("same", Version::V5);
    let new = h.connect("same", Version::V5);
    assert_eq!(h.recv(old), [Outbound::Disconnect { reason: 0x8E }]);
    assert!(h.closing(old));
    assert!(!h.closing(new));
}

/// The session belongs to the identity that made it: another one presenting its client id is
/// refused (MQTT 5 CONNACK 0x85; MQTT 3.1.1 return code 2) unless `client_ids = "shared"`.
#[test]
fn a_client_id_belongs_to_the_identity_that_made_its_session() {
    let mut h = Harness::new();
    let mut c = connect_packet("victim", Version::V5);
    c.session_expiry = 600;
    let (conn, _) = h.connect_as(c.clone(), user("alice"));
    h.drop_conn(conn);
    let refused = h.try_connect(c.clone(), user("mallory")).unwrap_err();
    assert_eq!((refused.code, refused.label), (0x85, "client_id_owned"));
    assert_eq!(crate::broker::codec::reason::connack_v4(refused.code), 2);
    assert!(h.try_connect(c.clone(), user("alice")).is_ok());

    let mut shared = Harness::limits(|l| l.client_ids = ClientIds::Shared);
    let (conn, _) = shared.connect_as(c.clone(), user("alice"));
    shared.drop_conn(conn);
    assert!(shared.try_connect(c, user("mallory")).is_ok());
}

/// [MQTT-3.1.3-6], [MQTT-3.1.3-7]: an empty client id gets a unique one, returned in the
/// CONNACK; MQTT 3.1.1 [MQTT-3.1.3-8]: not with Clean Session 0 (refused with 0x85 / 2, as
/// for MQTT 5, where such a session could never be resumed).
#[test]
fn mqtt_3_1_3_7_an_empty_client_id_is_assigned_one() {
    let mut h = Harness::new();
    let (_, a) = h.connect_as(connect_packet("", Version::V5), user("u"));
    let (_, b) = h.connect_as(connect_packet("", Version::V5), user("u"));
    let (ida, idb) = (Harness::connack(&a).2.assigned_client_id, Harness::connack(&b).2.assigned_client_id);
    assert!(ida.is_some() && idb.is_some() && ida != idb, "{ida:?} {idb:?}");
    let mut c = connect_packet("", Version::V311);
    c.clean_start = false;
    assert_eq!(h.try_connect(c, user("u")).unwrap_err().code, 0x85);
}

/// [MQTT-4.12.0-1]: a server without enhanced authentication may refuse an Authentication
/// Method with 0x8C; an AUTH packet then is a protocol error (§4.12).
#[test]
fn mqtt_4_12_0_1_enhanced_authentication_is_refused() {
    let mut h = Harness::new();
    let mut c = connect_packet("auth", Version::V5);
    c.auth_method = Some("SCRAM-SHA-1".into());
    assert_eq!(h.try_connect(c, user("u")).unwrap_err().code, 0x8C);
    let conn = h.connect("noauth", Version::V5);
    h.send(conn, Inbound::Auth);
    assert_eq!(h.recv(conn), [Outbound::Disconnect { reason: 0x82 }]);
}

/// §3.2.2.3: the CONNACK announces Receive Maximum, Maximum Packet Size and Topic Alias
/// Maximum; an MQTT 3.1.1 CONNACK has no properties.
#[test]
fn mqtt_3_2_2_3_connack_announces_the_servers_limits() {
    let mut h = Harness::limits(|l| {
        l.receive_maximum = 50;
        l.max_packet_size = 4096;
        l.topic_alias_maximum = 8;
    });
    let (_, out) = h.connect_as(connect_packet("lim", Version::V5), user("u"));
    let props = Harness::connack(&out).2;
    assert_eq!(
        (props.receive_maximum, props.max_packet_size, props.topic_alias_maximum),
        (Some(50), Some(4096), Some(8))
    );
    let (_, out) = h.connect_as(connect_packet("lim4", Version::V311), user("u"));
    assert_eq!(Harness::connack(&out).2, ConnAckProps::default());
}

/// Sessions are bounded: a new client id past `max_sessions` is refused with 0x97; ids that
/// have a session still connect.
#[test]
fn the_session_bound_refuses_new_client_ids_with_0x97() {
    let mut h = Harness::limits(|l| l.max_sessions = 2);
    h.connect("one", Version::V5);
    h.connect("two", Version::V5);
    assert_eq!(h.try_connect(connect_packet("three", Version::V5), user("u")).unwrap_err().code, 0x97);
    assert!(h.try_connect(connect_packet("one", Version::V5), user("u")).is_ok());
}

/// A will carries user properties as a PUBLISH does, under the same cap: a CONNECT whose will
/// has more is refused with 0x97.
#[test]
fn a_will_with_too_many_user_properties_is_refused_at_connect() {
    let mut h = Harness::limits(|l| l.max_user_properties = 4);
    let mut c = with_will("w", "wills/w", 0);
    if let Some(w) = c.will.as_mut() {
        w.props.user = vec![("k".into(), "v".into()); 5];
    }
    let refusal = h.try_connect(c, user("u")).unwrap_err();
    assert_eq!(refusal.code, 0x97);
}
