//! The node's reserved namespace (issue 29): topics only the node publishes to, client ids only
//! its own clients take, and the sessions one identity may keep.

use super::*;
use crate::broker::core::{INTERNAL_CLIENT_ID_PREFIX, SessionRecord, StoredState};

fn internal() -> Identity {
    Identity { owner: "internal".into(), internal: true, rules: None }
}

fn reserved() -> Harness {
    Harness::limits(|l| l.reserved_topics = vec!["_edge/#".into(), "models/#".into()])
}

/// A forged `models/<name>/current` would point every local app at an unsigned file: no client
/// publishes there, retained or not, whatever its ACL allows (a user without rules here); the
/// node's own client does, and subscribers get it.
#[test]
fn no_client_publishes_into_the_reserved_namespace_whatever_its_acl() {
    let mut h = reserved();
    let app = h.connect("app", Version::V5);
    h.send(app, sub(1, "models/#", QoS::AtLeastOnce));
    h.recv(app);
    let (mallory, _) = h.connect_as(connect_packet("mallory", Version::V5), user("mallory"));
    let mut forged = publish("models/yolo/current", QoS::AtLeastOnce, 1, "{\"path\":\"/tmp/evil\"}");
    if let Inbound::Publish(p) = &mut forged {
        p.retain = true;
    }
    h.send(mallory, forged);
    h.send(mallory, publish("_edge/probe", QoS::AtLeastOnce, 2, "fake probe"));
    assert_eq!(
        h.recv(mallory),
        [Outbound::PubAck { pkid: 1, reason: 0x87 }, Outbound::PubAck { pkid: 2, reason: 0x87 }]
    );
    assert!(payloads(&h.recv(app)).is_empty());
    let late = h.connect("late", Version::V5);
    h.send(late, sub(1, "models/#", QoS::AtLeastOnce));
    assert!(payloads(&h.recv(late)).is_empty(), "nothing forged was retained");

    let (node, _) =
        h.connect_as(connect_packet(&format!("{INTERNAL_CLIENT_ID_PREFIX}models-n1"), Version::V5), internal());
    h.send(node, publish("models/yolo/current", QoS::AtLeastOnce, 1, "signed"));
    assert_eq!(h.recv(node), [Outbound::PubAck { pkid: 1, reason: 0 }]);
    assert_eq!(payloads(&h.recv(app)), ["signed"]);
    // Topics beside the namespace are the ACL's as before.
    h.send(mallory, publish("modelsx/a", QoS::AtLeastOnce, 3, "fine"));
    assert_eq!(h.recv(mallory), [Outbound::PubAck { pkid: 3, reason: 0 }]);
}

/// A will is a publish the client asks for in advance: one into the namespace is refused at
/// CONNECT.
#[test]
fn a_will_into_the_reserved_namespace_is_refused_at_connect() {
    let mut h = reserved();
    let refusal = h.try_connect(with_will("w", "models/yolo/current", 1), user("w")).unwrap_err();
    assert_eq!((refusal.code, refusal.label), (0x87, "reserved_topic"));
}

/// The probe's and the announcer's client ids are predictable: a client taking one (a
/// persistent session restored at every start) kept `/healthz` failing for good. No client
/// takes the prefix; the node's own clients do.
#[test]
fn client_ids_with_the_nodes_prefix_are_refused_to_clients() {
    let mut h = Harness::new();
    let mut squat = connect_packet(&format!("{INTERNAL_CLIENT_ID_PREFIX}probe-gateway"), Version::V5);
    squat.session_expiry = 7 * 24 * 3600;
    let refusal = h.try_connect(squat.clone(), user("mallory")).unwrap_err();
    assert_eq!((refusal.code, refusal.label), (0x85, "client_id_reserved"));
    let (_, out) = h.connect_as(squat, internal());
    assert_eq!(Harness::connack(&out).1, 0);
}

/// A session under a reserved id stored before the prefix was reserved ends at the restore, so
/// the node's client finds its id free.
#[test]
fn a_stored_session_squatting_a_reserved_id_ends_at_restore() {
    let mut h = Harness::new();
    let record = |sid, client_id: &str| SessionRecord {
        sid,
        client_id: client_id.into(),
        owner: "user:mallory".into(),
        expiry: 3600,
        subscriptions: Vec::new(),
        disconnected_ms: None,
    };
    let state = StoredState {
        sessions: vec![record(1, &format!("{INTERNAL_CLIENT_ID_PREFIX}probe-gateway")), record(2, "kept")],
        ..Default::default()
    };
    h.restart_from(state, Duration::from_secs(1));
    let mut c = connect_packet("kept", Version::V5);
    c.clean_start = false;
    let (_, out) = h.connect_as(c, user("mallory"));
    assert!(Harness::connack(&out).0, "the other session is restored");
    let mut node = connect_packet(&format!("{INTERNAL_CLIENT_ID_PREFIX}probe-gateway"), Version::V5);
    node.clean_start = false;
    let (_, out) = h.connect_as(node, internal());
    assert!(!Harness::connack(&out).0, "no squatter's session to resume");
}

/// One identity fills at most `max_stored_sessions_per_identity` with sessions that outlive it
/// (0x97, counted); its clean sessions and other identities are not held by that.
#[test]
fn sessions_that_outlive_their_connection_are_bounded_per_identity() {
    let mut h = Harness::limits(|l| l.max_stored_sessions_per_identity = 2);
    let durable = |id: &str| {
        let mut c = connect_packet(id, Version::V5);
        c.session_expiry = 3600;
        c
    };
    for id in ["a1", "a2"] {
        let (conn, _) = h.connect_as(durable(id), user("alice"));
        h.drop_conn(conn);
    }
    let refusal = h.try_connect(durable("a3"), user("alice")).unwrap_err();
    assert_eq!((refusal.code, refusal.label), (0x97, "max_stored_sessions_per_identity"));
    // Resuming one it has is not a new one.
    let (_, out) = h.connect_as(durable("a1"), user("alice"));
    assert_eq!(Harness::connack(&out).1, 0);
    let (_, out) = h.connect_as(connect_packet("a-clean", Version::V5), user("alice"));
    assert_eq!(Harness::connack(&out).1, 0);
    let (_, out) = h.connect_as(durable("b1"), user("bob"));
    assert_eq!(Harness::connack(&out).1, 0);
}
