//! Downlink messages entering the broker (issue 31): the message and the downlink's mark in
//! the same store call, local delivery only, and the same ACL and namespace as a client's.

use super::durable::{Replay, durable};
use super::*;
use crate::auth::{Acl, Identity as AuthIdentity, Rules};
use crate::broker::message::Message;

fn message(topic: &str, qos: QoS, retain: bool) -> Message {
    Message {
        topic: topic.into(),
        payload: Bytes::from_static(b"set 42"),
        qos,
        retain,
        props: PublishProps::default(),
        expires_at: None,
        origin: None,
        schema: None,
    }
}

/// The mark and what the message queued for an offline durable session are made in one call
/// (so the store commits them together), and a restart from the store finds both: the message
/// comes to its subscriber and the mark says it was done.
#[test]
fn a_downlink_message_and_its_mark_are_stored_together_and_survive_a_restart() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("app", Version::V5), user("u"));
    h.send(s, sub(1, "cmd/#", QoS::ExactlyOnce));
    h.recv(s);
    h.drop_conn(s);
    let before = h.ops().count();
    let now = h.now;
    let last = h.b.publish_downlink(None, message("cmd/valve", QoS::ExactlyOnce, true), "downlink", "7".into(), now);
    let last = last.expect("delivered");
    h.drain();
    let made: Vec<&StoreOp> = h.ops().skip(before).collect();
    assert!(matches!(made[0], StoreOp::Mark { key: "downlink", value } if value == "7"), "{made:?}");
    assert!(made.iter().any(|op| matches!(op, StoreOp::Queue(d) if &*d.msg.topic == "cmd/valve")), "{made:?}");
    assert!(made.iter().any(|op| matches!(op, StoreOp::Retain { msg: Some(_), .. })), "{made:?}");
    assert_eq!(last, h.b.last_op(), "the caller waits for all of it");
    assert!(h.stored.last().is_some_and(|group| group.len() == made.len()), "one group: one commit");

    let state = Replay::of(h.ops()).state();
    assert_eq!(state.marks.get("downlink").map(String::as_str), Some("7"));
    h.restart_from(state, Duration::from_secs(1));
    let (s, out) = h.connect_as(durable("app", Version::V5), user("u"));
    assert!(Harness::connack(&out).0);
    let got = [out, h.recv(s)].concat();
    assert_eq!(payloads(&got), ["set 42"], "delivered once after the restart");
}

/// A downlink message is published as its identity may: the node's namespace and the ACL hold,
/// and a refusal makes nothing, not even the mark (the caller stores the refusal's own).
#[test]
fn a_downlink_message_is_refused_where_its_identity_may_not_publish() {
    let mut h = Harness::new();
    let acl = Acl::parse("[users.cloud]\npublish = [\"cmd/#\"]\nsubscribe = []\n").unwrap();
    let rules: Arc<Rules> = Arc::new(acl.rules_for(&AuthIdentity::User("cloud".into()), "downlink"));
    let now = h.now;
    let before = h.b.last_op();
    let refused =
        h.b.publish_downlink(Some(&rules), message("other/x", QoS::AtLeastOnce, false), "downlink", "1".into(), now);
    assert_eq!(refused.map_err(|r| r.label), Err("acl"));
    let reserved =
        h.b.publish_downlink(None, message("_edge/probe", QoS::AtLeastOnce, false), "downlink", "1".into(), now);
    assert_eq!(reserved.map_err(|r| r.label), Err("reserved_topic"));
    assert_eq!(h.b.last_op(), before, "nothing made");
    assert!(
        h.b.publish_downlink(Some(&rules), message("cmd/a", QoS::AtLeastOnce, false), "downlink", "1".into(), now)
            .is_ok()
    );
    let mark = h.b.store_mark("downlink", "2".into());
    assert_eq!(mark, h.b.last_op());
}

/// A class routing the topic to the cloud does not send a downlink message back up: it came
/// from there. Local subscribers get it.
#[test]
fn a_downlink_message_never_goes_to_the_spool() {
    let classes = Classes::new(vec![Class::new(
        "cmd".into(),
        vec![shared::topic::TopicFilter::new("cmd/#").unwrap()],
        Route::Both,
        Governance::None,
        Lane(1),
        Durability::Normal,
        None,
    )]);
    let mut h = Harness::with(Limits::default(), classes);
    let s = h.connect("local-app", Version::V5);
    h.send(s, sub(1, "cmd/#", QoS::AtLeastOnce));
    h.recv(s);
    let now = h.now;
    h.b.publish_downlink(None, message("cmd/a", QoS::AtLeastOnce, false), "downlink", "1".into(), now).unwrap();
    h.drain();
    assert!(h.spooled.is_empty(), "{:?}", h.spooled.len());
    assert_eq!(payloads(&h.recv(s)), ["set 42"]);
}

/// A downlink message is held to what a local publish is held to, whatever wrote it into the
/// sink: the schema its topic is bound to (MQTT 5 §3.3.2.3.2 and the `[[schema]]` binding), a
/// Response Topic that is a topic name ([MQTT-3.3.2-14]), the user-property cap. A refusal
/// names what broke, for the dead letter the cloud keeps.
#[test]
#[cfg(feature = "schema")]
fn a_downlink_message_is_held_to_what_a_local_publish_is() {
    let dir = tempfile::tempdir().unwrap();
    crate::schema::tests::stage(dir.path(), "reading", 1, r#"{"type":"object","required":["temp"]}"#);
    let binding = crate::schema::SchemaBinding {
        topic: "config/reading".into(),
        subject: "reading".into(),
        mode: crate::schema::Mode::Enforce,
        unstaged: crate::schema::Unstaged::Refuse,
    };
    let v = crate::schema::Validator::uncounted(&[binding], dir.path());
    let mut h = Harness::new().with_schemas(Arc::new(v));
    let s = h.connect("app", Version::V5);
    h.send(s, sub(1, "#", QoS::AtLeastOnce));
    h.recv(s);
    let now = h.now;
    let before = h.b.last_op();
    let send = |h: &mut Harness, m: Message| h.b.publish_downlink(None, m, "downlink", "1".into(), now);
    let refused = send(&mut h, message("config/reading", QoS::AtLeastOnce, false)).unwrap_err();
    assert_eq!(refused.label, "schema");
    assert!(refused.to_string().contains("schema reading v1"), "{refused}");
    let mut m = message("cmd/a", QoS::AtLeastOnce, false);
    m.props.response_topic = Some("reply/+".into());
    let refused = send(&mut h, m).unwrap_err();
    assert_eq!(refused.label, "response_topic_invalid");
    let mut m = message("cmd/a", QoS::AtLeastOnce, false);
    m.props.user = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
    assert_eq!(send(&mut h, m).unwrap_err().label, "too_many_user_properties");
    assert_eq!(h.b.last_op(), before, "nothing made");
    let mut m = message("config/reading", QoS::AtLeastOnce, false);
    m.payload = Bytes::from_static(br#"{"temp":21}"#);
    send(&mut h, m).unwrap();
    h.drain();
    assert_eq!(payloads(&h.recv(s)), [r#"{"temp":21}"#], "only what passes is delivered");
}
