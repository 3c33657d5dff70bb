//! An ACL reload reaches every session at once (issue 29): connected ones that send nothing,
//! offline ones and their queues, and sessions resumed under narrower rules.

use super::*;
use crate::auth::{Acl, Identity as AuthIdentity, Rules};

fn rules(subscribe: &[&str]) -> Arc<Rules> {
    let list = subscribe.iter().map(|f| format!("\"{f}\"")).collect::<Vec<_>>().join(", ");
    let acl = Acl::parse(&format!("[users.u]\npublish = [\"#\"]\nsubscribe = [{list}]\n")).unwrap();
    Arc::new(acl.rules_for(&AuthIdentity::User("u".into()), "c"))
}

fn with_rules(subscribe: &[&str]) -> Identity {
    Identity { owner: "user:u".into(), internal: false, rules: Some(rules(subscribe)) }
}

fn durable(id: &str) -> Connect {
    let mut c = connect_packet(id, Version::V5);
    c.clean_start = false;
    c.session_expiry = 3600;
    c
}

/// A keep-alive-0 subscriber that never sends a byte kept receiving after its grant was
/// removed: the reload gives its connection the new rules at once, drops the subscription and
/// what was queued for it.
#[test]
fn a_reload_reaches_a_connected_subscriber_that_sends_nothing() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("s"), with_rules(&["a/#", "b/#"]));
    h.send(s, sub(1, "a/#", QoS::AtLeastOnce));
    h.send(s, sub(2, "b/#", QoS::AtLeastOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    // Eleven for a/ and one for b/: the in-flight window is 100, so all go in flight or queue.
    for i in 0..150u16 {
        h.send(p, publish(if i == 0 { "b/1" } else { "a/1" }, QoS::AtLeastOnce, i + 1, "x"));
    }
    h.b.reload_rules(&|_, _| rules(&["b/#"]), h.now);
    h.send(p, publish("a/2", QoS::AtLeastOnce, 200, "after"));
    h.send(p, publish("b/2", QoS::AtLeastOnce, 201, "after"));
    let out = h.recv(s);
    let topics: Vec<&str> = out
        .iter()
        .filter_map(|p| match p {
            Outbound::Publish { msg, .. } => Some(&*msg.topic),
            _ => None,
        })
        .collect();
    assert!(!topics.contains(&"a/2"), "{topics:?}");
    assert!(topics.contains(&"b/2"), "{topics:?}");
    let session = h.b.session(h.b.conns[&s].session).unwrap();
    assert!(session.subs.keys().all(|f| f == "b/#"));
    assert!(session.queue.iter().all(|d| d.msg.topic.starts_with("b/")));
    assert!(session.inflight.iter().all(|i| i.delivery.msg.topic.starts_with("b/")));
    h.b.check_accounting().unwrap();
}

/// An offline session kept queueing from a revoked filter and got it all on resume: the
/// reload drops the subscription and the queue on topics it may no longer read, in the store
/// too; a resume delivers only what it may read.
#[test]
fn an_offline_session_loses_what_it_may_no_longer_read() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("s"), with_rules(&["#"]));
    h.send(s, sub(1, "a/#", QoS::AtLeastOnce));
    h.send(s, sub(2, "b/#", QoS::AtLeastOnce));
    h.drop_conn(s);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("a/1", QoS::AtLeastOnce, 1, "revoked"));
    h.send(p, publish("b/1", QoS::AtLeastOnce, 2, "kept"));
    h.b.reload_rules(&|owner, _| if owner == "user:u" { rules(&["b/#"]) } else { rules(&["#"]) }, h.now);
    h.send(p, publish("a/2", QoS::AtLeastOnce, 3, "after"));
    let (_, out) = h.connect_as(durable("s"), with_rules(&["b/#"]));
    assert_eq!(payloads(&out), ["kept"]);
    h.b.check_accounting().unwrap();
    // What the store keeps for it: a restart brings back nothing revoked.
    h.commit_store();
    let mut restarted = h;
    restarted.restart(Duration::from_secs(1));
    let session = restarted.b.sessions.iter().flatten().find(|s| &*s.client_id == "s").unwrap();
    assert!(session.queue.iter().chain(session.inflight.iter().map(|i| &i.delivery)).all(|d| &*d.msg.topic != "a/1"));
}

/// A session queued under wide rules and resumed under narrower ones (another node's ACL, or a
/// reload while the node was down) gets nothing it may not read.
#[test]
fn a_session_resumed_under_narrower_rules_gets_nothing_it_may_not_read() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("s"), with_rules(&["#"]));
    h.send(s, sub(1, "#", QoS::AtLeastOnce));
    h.drop_conn(s);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("secret/1", QoS::AtLeastOnce, 1, "no"));
    h.send(p, publish("public/1", QoS::AtLeastOnce, 2, "yes"));
    let (_, out) = h.connect_as(durable("s"), with_rules(&["public/#"]));
    assert_eq!(payloads(&out), ["yes"]);
}
