//! Broker state across restarts: what a durable session, the retained store and a pending will
//! keep (`durable.rs`), and the acknowledgements that wait for the store. A restart here is a
//! new core restored from what the store would hold after the ops made so far ([`Replay`], a
//! plain model of the store, which `store::tests` holds the SQLite store to).

use std::collections::BTreeMap;

use super::*;

/// The session store as a plain model: the state its ops leave.
#[derive(Debug, Default, Clone)]
pub(crate) struct Replay {
    pub sessions: BTreeMap<Sid, SessionRecord>,
    pub deliveries: BTreeMap<(Sid, u64), StoredDelivery>,
    pub received: BTreeMap<(Sid, u16), u64>,
    pub wills: BTreeMap<Sid, StoredWill>,
    pub retained: BTreeMap<Arc<str>, Arc<crate::broker::message::Message>>,
    pub marks: BTreeMap<String, String>,
}

impl Replay {
    pub(crate) fn of<'a>(ops: impl IntoIterator<Item = &'a StoreOp>) -> Self {
        let mut r = Replay::default();
        for op in ops {
            r.apply(op);
        }
        r
    }

    pub(crate) fn apply(&mut self, op: &StoreOp) {
        match op {
            StoreOp::Session(s) => {
                self.sessions.insert(s.sid, s.clone());
            }
            StoreOp::Forget { sid, .. } => {
                self.sessions.remove(sid);
                self.deliveries.retain(|(s, _), _| s != sid);
                self.received.retain(|(s, _), _| s != sid);
                self.wills.remove(sid);
            }
            StoreOp::Queue(d) => {
                self.deliveries.insert((d.sid, d.ord), d.clone());
            }
            StoreOp::Sent { sid, ord, pkid } => {
                if let Some(d) = self.deliveries.get_mut(&(*sid, *ord)) {
                    d.pkid = Some(*pkid);
                }
            }
            StoreOp::Released { sid, ord } => {
                if let Some(d) = self.deliveries.get_mut(&(*sid, *ord)) {
                    d.released = true;
                }
            }
            StoreOp::Done { sid, ord, .. } => {
                self.deliveries.remove(&(*sid, *ord));
            }
            StoreOp::Received { sid, pkid, receipt } => {
                self.received.insert((*sid, *pkid), *receipt);
            }
            StoreOp::Mark { key, value } => {
                self.marks.insert((*key).to_owned(), value.clone());
            }
            StoreOp::Settled { sid, pkid } => {
                self.received.remove(&(*sid, *pkid));
            }
            StoreOp::Will { sid, will } => match will {
                Some(w) => {
                    self.wills.insert(*sid, w.clone());
                }
                None => {
                    self.wills.remove(sid);
                }
            },
            StoreOp::Retain { topic, msg } => match msg {
                Some(m) => {
                    self.retained.insert(topic.clone(), m.clone());
                }
                None => {
                    self.retained.remove(topic);
                }
            },
        }
    }

    pub(crate) fn state(&self) -> StoredState {
        StoredState {
            sessions: self.sessions.values().cloned().collect(),
            deliveries: self.deliveries.values().cloned().collect(),
            received: self.received.iter().map(|(&(s, p), &r)| (s, p, r)).collect(),
            wills: self.wills.iter().map(|(s, w)| (*s, w.clone())).collect(),
            retained: self.retained.values().cloned().collect(),
            marks: self.marks.clone(),
            unclean: false,
        }
    }
}

impl Harness {
    /// The node restarts (a crash: connections vanish, no will fires) from what the store holds
    /// after every op made so far; `after` passes on the new core's clock, and so on the wall
    /// clock it reads the store's times against.
    pub(crate) fn restart(&mut self, after: Duration) {
        let state = Replay::of(self.ops()).state();
        self.restart_from(state, after);
    }

    /// [`Harness::restart`] from `state`, what a store loaded.
    pub(crate) fn restart_from(&mut self, state: StoredState, after: Duration) {
        let limits = self.b.limits().clone();
        let classes = self.b.classes.clone();
        let stored = std::mem::take(&mut self.stored);
        let mut fresh = Harness::with(limits, Classes::default());
        fresh.b.classes = classes;
        fresh.now = self.now + after;
        fresh.wall = self.wall;
        fresh.b.set_wall_clock(self.wall);
        // The store's history goes on: the new core's ops follow the old ones'.
        fresh.stored = stored;
        fresh.b.restore(state, fresh.now);
        fresh.next_conn = self.next_conn;
        fresh.drain();
        *self = fresh;
    }
}

/// A CONNECT keeping its session an hour (Clean Start 0).
pub(crate) fn durable(client_id: &str, version: Version) -> Connect {
    let mut c = connect_packet(client_id, version);
    c.clean_start = false;
    c.session_expiry = 3600;
    c
}

fn acks(out: &[Outbound]) -> Vec<&Outbound> {
    out.iter().filter(|p| !matches!(p, Outbound::Publish { .. } | Outbound::ConnAck { .. })).collect()
}

/// [MQTT-3.1.2-4], [MQTT-3.1.2-5] with §4.1: a session's state (QoS 1 and 2 messages queued for
/// it while it was away, its subscriptions) outlives not only its connection but the node; the
/// CONNACK after the restart says Session Present 1 and the messages come.
#[test]
fn mqtt_3_1_2_5_queued_messages_of_an_offline_session_survive_a_restart() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("sub", Version::V5), user("u"));
    h.send(s, sub(1, "t/#", QoS::ExactlyOnce));
    h.recv(s);
    h.drop_conn(s);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("t/1", QoS::AtLeastOnce, 1, "one"));
    h.send(p, publish("t/2", QoS::ExactlyOnce, 2, "two"));
    h.send(p, publish("t/3", QoS::AtMostOnce, 0, "qos0 is not kept"));
    h.restart(Duration::from_secs(30));
    let (s, out) = h.connect_as(durable("sub", Version::V5), user("u"));
    assert!(Harness::connack(&out).0, "Session Present 1 after the restart");
    let mut got = payloads(&out);
    got.extend(payloads(&h.recv(s)));
    assert_eq!(got, ["one", "two"]);
}

/// [MQTT-3.3.1-1] after a crash: a queued message may have gone out before the record of its
/// sending was committed, so after an unclean stop it goes with DUP (it might be a
/// re-delivery); after a clean one, without.
#[test]
fn mqtt_3_3_1_1_queued_messages_restored_after_a_crash_go_with_dup() {
    for unclean in [false, true] {
        let mut h = Harness::new();
        let (s, _) = h.connect_as(durable("sub", Version::V5), user("u"));
        h.send(s, sub(1, "t/#", QoS::ExactlyOnce));
        h.recv(s);
        h.drop_conn(s);
        let p = h.connect("p", Version::V5);
        h.send(p, publish("t/1", QoS::AtLeastOnce, 1, "one"));
        h.send(p, publish("t/2", QoS::ExactlyOnce, 2, "two"));
        let state = StoredState { unclean, ..Replay::of(h.ops()).state() };
        h.restart_from(state, Duration::from_secs(1));
        let (s, mut out) = h.connect_as(durable("sub", Version::V5), user("u"));
        out.extend(h.recv(s));
        let dups: Vec<bool> = out
            .iter()
            .filter_map(|o| match o {
                Outbound::Publish { dup, .. } => Some(*dup),
                _ => None,
            })
            .collect();
        assert_eq!(dups, [unclean, unclean], "unclean: {unclean}");
    }
}

/// [MQTT-4.4.0-1] across a restart: a message sent and not acknowledged goes again with its
/// packet id and DUP set; a QoS 2 message whose PUBREC came gets its PUBREL again, not the
/// message.
#[test]
fn mqtt_4_4_0_1_messages_in_flight_are_resent_with_their_ids_after_a_restart() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("sub", Version::V5), user("u"));
    h.send(s, sub(1, "t", QoS::ExactlyOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("t", QoS::AtLeastOnce, 1, "q1"));
    h.send(p, publish("t", QoS::ExactlyOnce, 2, "q2 unreleased"));
    h.send(p, publish("t", QoS::ExactlyOnce, 3, "q2 released"));
    let out = h.recv(s);
    let ids: Vec<(String, u16)> = out
        .iter()
        .filter_map(|o| match o {
            Outbound::Publish { msg, pkid, dup: false, .. } => {
                Some((String::from_utf8_lossy(&msg.payload).into_owned(), *pkid))
            }
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 3, "{out:?}");
    h.send(s, Inbound::PubRec { pkid: ids[2].1, reason: 0 });
    assert_eq!(h.recv(s), [Outbound::PubRel { pkid: ids[2].1, reason: 0 }]);
    h.restart(Duration::from_secs(1));
    let (_, out) = h.connect_as(durable("sub", Version::V5), user("u"));
    let again: Vec<(String, u16, bool)> = out
        .iter()
        .filter_map(|o| match o {
            Outbound::Publish { msg, pkid, dup, .. } => {
                Some((String::from_utf8_lossy(&msg.payload).into_owned(), *pkid, *dup))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        again,
        [("q1".to_owned(), ids[0].1, true), ("q2 unreleased".to_owned(), ids[1].1, true)],
        "resent with their ids and DUP"
    );
    assert!(out.contains(&Outbound::PubRel { pkid: ids[2].1, reason: 0 }), "{out:?}");
}

/// [MQTT-4.3.3-9] across a restart: the QoS 2 packet ids a session received and acknowledged
/// with PUBREC are kept, so the client's DUP resend after the restart is acknowledged and not
/// delivered again, and its PUBREL is answered with PUBCOMP 0x00 ([MQTT-4.3.3-11]).
#[test]
fn mqtt_4_3_3_9_received_qos2_ids_survive_a_restart() {
    let mut h = Harness::new();
    let watcher = h.connect("w", Version::V5);
    h.send(watcher, sub(1, "t", QoS::ExactlyOnce));
    h.recv(watcher);
    let (p, _) = h.connect_as(durable("pub", Version::V5), user("u"));
    h.send(p, publish("t", QoS::ExactlyOnce, 9, "once"));
    assert_eq!(h.recv(p), [Outbound::PubRec { pkid: 9, reason: 0 }]);
    assert_eq!(payloads(&h.recv(watcher)), ["once"]);
    h.restart(Duration::from_secs(1));
    let watcher = h.connect("w", Version::V5);
    h.send(watcher, sub(1, "t", QoS::ExactlyOnce));
    h.recv(watcher);
    let (p, _) = h.connect_as(durable("pub", Version::V5), user("u"));
    let Inbound::Publish(mut again) = publish("t", QoS::ExactlyOnce, 9, "once") else { unreachable!() };
    again.dup = true;
    h.send(p, Inbound::Publish(again));
    assert_eq!(h.recv(p), [Outbound::PubRec { pkid: 9, reason: 0 }]);
    assert!(payloads(&h.recv(watcher)).is_empty(), "not delivered twice");
    h.send(p, Inbound::PubRel { pkid: 9 });
    assert_eq!(h.recv(p), [Outbound::PubComp { pkid: 9, reason: 0 }]);
}

/// [MQTT-3.3.1-5] across a restart: the retained store is kept, a cleared topic stays cleared
/// ([MQTT-3.3.1-6]), and a retained message whose Message Expiry passed while the node was
/// down is gone ([MQTT-3.3.2-5]).
#[test]
fn mqtt_3_3_1_5_retained_messages_survive_a_restart_and_expire_while_down() {
    let mut h = Harness::new();
    let p = h.connect("p", Version::V5);
    h.send(p, retained("state/a", "a"));
    h.send(p, retained("state/b", "b"));
    h.send(p, retained("state/b", ""));
    let Inbound::Publish(mut short) = retained("state/c", "c") else { unreachable!() };
    short.message_expiry = Some(10);
    h.send(p, Inbound::Publish(short));
    h.restart(Duration::from_secs(20));
    let s = h.connect("s", Version::V5);
    h.send(s, sub(1, "state/#", QoS::AtLeastOnce));
    assert_eq!(payloads(&h.recv(s)), ["a"]);
    assert_eq!(h.b.retained_count(), 1);
}

/// [MQTT-3.1.3-9] and §3.1.2.5 across a restart: a delayed will pending when the node went
/// down is published at its time after the restart, or at once if its time passed meanwhile.
#[test]
fn mqtt_3_1_3_9_a_pending_delayed_will_survives_a_restart() {
    for (down, after_restart) in [(10, Some(20)), (60, None)] {
        let mut h = Harness::new();
        let mut c = with_will("dying", "wills/dying", 30);
        c.session_expiry = 600;
        let (conn, _) = h.connect_as(c, user("u"));
        h.drop_conn(conn);
        h.restart(Duration::from_secs(down));
        let w = h.connect("w", Version::V5);
        h.send(w, sub(1, "wills/#", QoS::AtLeastOnce));
        h.recv(w);
        h.advance(Duration::ZERO);
        if let Some(wait) = after_restart {
            assert!(payloads(&h.recv(w)).is_empty(), "not before its time");
            h.advance(Duration::from_secs(wait - 1));
            assert!(payloads(&h.recv(w)).is_empty(), "not before its time");
            h.advance(Duration::from_secs(2));
        }
        assert_eq!(payloads(&h.recv(w)), ["gone"], "down {down} s");
    }
}

/// §3.1.2.11.2 across a restart: a session whose expiry passed while the node was down is gone
/// (Session Present 0, nothing queued comes); one still within it is there.
#[test]
fn mqtt_3_1_2_11_2_a_session_that_expired_while_down_is_gone() {
    let mut h = Harness::new();
    let mut short = durable("short", Version::V5);
    short.session_expiry = 60;
    let (s, _) = h.connect_as(short.clone(), user("u"));
    h.send(s, sub(1, "t", QoS::AtLeastOnce));
    h.drop_conn(s);
    let (l, _) = h.connect_as(durable("long", Version::V5), user("u"));
    h.send(l, sub(1, "t", QoS::AtLeastOnce));
    h.drop_conn(l);
    let p = h.connect("p", Version::V5);
    h.send(p, publish("t", QoS::AtLeastOnce, 1, "x"));
    h.restart(Duration::from_secs(120));
    let (_, out) = h.connect_as(short, user("u"));
    assert!(!Harness::connack(&out).0, "expired while down: no session");
    assert!(payloads(&out).is_empty());
    let (_, out) = h.connect_as(durable("long", Version::V5), user("u"));
    assert!(Harness::connack(&out).0);
    assert_eq!(payloads(&out), ["x"]);
}

/// What "acknowledged" promises: a publish routed to a durable session is PUBACKed (PUBRECed)
/// only once its queue entry is committed; one that reaches only clean sessions is not held.
#[test]
fn a_puback_waits_for_the_queue_entry_of_a_durable_session_to_commit() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("sub", Version::V5), user("u"));
    h.send(s, sub(1, "durable/#", QoS::AtLeastOnce));
    h.drop_conn(s);
    let clean = h.connect("clean", Version::V5);
    h.send(clean, sub(1, "clean/#", QoS::AtLeastOnce));
    h.recv(clean);
    h.hold_store = true;
    let p = h.connect("p", Version::V5);
    h.send(p, publish("clean/x", QoS::AtLeastOnce, 1, "c"));
    assert_eq!(h.recv(p), [Outbound::PubAck { pkid: 1, reason: 0 }], "nothing stored: at once");
    h.send(p, publish("durable/x", QoS::AtLeastOnce, 2, "d"));
    h.send(p, publish("durable/y", QoS::ExactlyOnce, 3, "d2"));
    h.send(p, publish("clean/y", QoS::AtLeastOnce, 4, "c2"));
    assert!(h.recv(p).is_empty(), "waits for the commit, and the next ack keeps its order");
    h.commit_store();
    assert_eq!(
        h.recv(p),
        [
            Outbound::PubAck { pkid: 2, reason: 0 },
            Outbound::PubRec { pkid: 3, reason: 0 },
            Outbound::PubAck { pkid: 4, reason: 0 }
        ]
    );
    // PUBCOMP waits for the id's release to be stored (the publisher's session is durable).
    let (dp, _) = h.connect_as(durable("dpub", Version::V5), user("u"));
    h.send(dp, publish("clean/z", QoS::ExactlyOnce, 5, "z"));
    assert!(acks(&h.recv(dp)).is_empty(), "its id is stored first");
    h.commit_store();
    assert_eq!(h.recv(dp), [Outbound::PubRec { pkid: 5, reason: 0 }]);
    h.send(dp, Inbound::PubRel { pkid: 5 });
    assert!(h.recv(dp).is_empty());
    h.commit_store();
    assert_eq!(h.recv(dp), [Outbound::PubComp { pkid: 5, reason: 0 }]);
}

/// A QoS 2 message to a durable session goes out only once its packet id is stored (a resend
/// after a crash must carry the same id), and its PUBREL once its release is; a QoS 1 message
/// goes at once.
#[test]
fn qos2_to_a_durable_session_goes_once_its_packet_id_is_stored() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("sub", Version::V5), user("u"));
    h.send(s, sub(1, "t", QoS::ExactlyOnce));
    h.recv(s);
    let p = h.connect("p", Version::V5);
    h.hold_store = true;
    h.send(p, publish("t", QoS::AtLeastOnce, 1, "q1"));
    assert_eq!(payloads(&h.recv(s)), ["q1"], "QoS 1: at once");
    h.send(p, publish("t", QoS::ExactlyOnce, 2, "q2"));
    assert!(payloads(&h.recv(s)).is_empty(), "QoS 2: not before its id is stored");
    h.commit_store();
    let out = h.recv(s);
    let Some(Outbound::Publish { pkid, dup: false, .. }) = publishes(&out).first().copied() else { panic!("{out:?}") };
    let pkid = *pkid;
    h.send(s, Inbound::PubRec { pkid, reason: 0 });
    assert!(h.recv(s).is_empty(), "PUBREL waits for the release to be stored");
    h.commit_store();
    assert_eq!(h.recv(s), [Outbound::PubRel { pkid, reason: 0 }]);
}

/// A session resumed with Session Expiry 0 stops being durable: the store forgets it, so a
/// restart does not bring back a session its client gave up.
#[test]
fn a_session_resumed_with_expiry_zero_is_forgotten_by_the_store() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("sub", Version::V5), user("u"));
    h.send(s, sub(1, "t", QoS::AtLeastOnce));
    h.drop_conn(s);
    let mut c = durable("sub", Version::V5);
    c.session_expiry = 0;
    let (_, out) = h.connect_as(c, user("u"));
    assert!(Harness::connack(&out).0);
    h.restart(Duration::from_secs(1));
    let (_, out) = h.connect_as(durable("sub", Version::V5), user("u"));
    assert!(!Harness::connack(&out).0);
}

impl Harness {
    /// The node crashes and restarts from what the store committed (the ops it had not are
    /// lost with the process).
    pub(crate) fn crash(&mut self, after: Duration) {
        let committed = self.b.durable;
        let ops = self.stored.iter().flatten().filter(|(id, _)| *id <= committed).map(|(_, op)| op);
        let state = Replay::of(ops).state();
        self.hold_store = false;
        self.restart_from(state, after);
    }
}

/// [MQTT-3.2.2-2] with [MQTT-3.8.4-1] and [MQTT-3.11.3-1]: a durable session's SUBACK and
/// UNSUBACK go once its record with the change is committed, so a crash right after either
/// restarts into a session that holds what was acknowledged: Session Present 1 never comes with
/// an acknowledged subscription lost, nor with one the client was told is gone.
#[test]
fn mqtt_3_2_2_2_a_present_session_holds_what_suback_and_unsuback_acknowledged() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("sub", Version::V5), user("u"));
    h.send(s, sub(1, "a/#", QoS::AtLeastOnce));
    h.recv(s);
    h.hold_store = true;
    h.send(s, sub(2, "b/#", QoS::AtLeastOnce));
    assert!(h.recv(s).is_empty(), "the SUBACK waits for the session's record");
    h.commit_store();
    assert_eq!(h.recv(s), [Outbound::SubAck { pkid: 2, codes: vec![1] }]);
    h.send(s, Inbound::Unsubscribe { pkid: 3, filters: vec!["a/#".into()] });
    assert!(h.recv(s).is_empty(), "the UNSUBACK waits for the session's record");
    h.commit_store();
    assert_eq!(h.recv(s), [Outbound::UnsubAck { pkid: 3, codes: vec![0] }]);
    // Asked and not acknowledged when the node dies: either way is the client's to find out.
    h.send(s, sub(4, "c/#", QoS::AtLeastOnce));
    h.crash(Duration::from_secs(1));
    let (s, out) = h.connect_as(durable("sub", Version::V5), user("u"));
    assert!(Harness::connack(&out).0);
    assert_eq!(h.b.session_subscriptions("sub").unwrap(), [("b/#".to_owned(), 1)]);
    // A clean session has nothing to wait for, and neither has a SUBSCRIBE that changes nothing.
    h.hold_store = true;
    h.send(s, sub(5, "b/#", QoS::AtLeastOnce));
    assert_eq!(h.recv(s), [Outbound::SubAck { pkid: 5, codes: vec![1] }]);
    let c = h.connect("clean", Version::V5);
    h.send(c, sub(1, "x", QoS::AtLeastOnce));
    assert_eq!(h.recv(c), [Outbound::SubAck { pkid: 1, codes: vec![1] }]);
}

/// The same for a SUBSCRIBE or UNSUBSCRIBE that changes nothing: its answer reports the
/// session's subscriptions, which an earlier packet may have changed without the change being
/// committed yet (its own answer lost with the connection): it waits for that record.
#[test]
fn an_answer_that_changed_nothing_waits_for_the_record_it_reports() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("sub", Version::V5), user("u"));
    h.send(s, sub(1, "a/#", QoS::AtLeastOnce));
    h.recv(s);
    h.hold_store = true;
    h.send(s, Inbound::Unsubscribe { pkid: 2, filters: vec!["a/#".into()] });
    h.drop_conn(s);
    let (s, out) = h.connect_as(durable("sub", Version::V5), user("u"));
    assert!(Harness::connack(&out).0);
    h.send(s, Inbound::Unsubscribe { pkid: 3, filters: vec!["a/#".into()] });
    assert!(h.recv(s).is_empty(), "\"no subscription\" is not true on disk yet");
    h.commit_store();
    assert_eq!(h.recv(s), [Outbound::UnsubAck { pkid: 3, codes: vec![0x11] }]);
}

/// [MQTT-3.1.2-4] with [MQTT-3.2.2-2]: a Clean Start discards the durable session there was,
/// and its CONNACK (Session Present 0) goes once the discard is committed, nothing before it
/// ([MQTT-3.2.0-1]): a crash between brought the old session, subscriptions and all, back to a
/// client told it had none.
#[test]
fn mqtt_3_1_2_4_a_clean_start_is_answered_once_the_discard_is_committed() {
    let mut h = Harness::new();
    let (s, _) = h.connect_as(durable("c", Version::V5), user("u"));
    h.send(s, sub(1, "old/#", QoS::AtLeastOnce));
    h.recv(s);
    h.drop_conn(s);
    h.hold_store = true;
    let mut clean = durable("c", Version::V5);
    clean.clean_start = true;
    let (s, out) = h.connect_as(clean.clone(), user("u"));
    assert!(out.is_empty(), "no CONNACK before the discard is committed: {out:?}");
    h.send(s, Inbound::PingReq);
    assert!(h.recv(s).is_empty(), "nothing before the CONNACK");
    h.commit_store();
    let out = h.recv(s);
    assert!(matches!(out.first(), Some(Outbound::ConnAck { session_present: false, .. })), "{out:?}");
    assert_eq!(out.get(1), Some(&Outbound::PingResp));
    // Not committed when the node dies: the client never heard Session Present 0, and the old
    // session is what there is.
    h.drop_conn(s);
    h.hold_store = false;
    let (s, _) = h.connect_as(durable("c", Version::V5), user("u"));
    h.send(s, sub(2, "again/#", QoS::AtLeastOnce));
    h.recv(s);
    h.drop_conn(s);
    h.hold_store = true;
    let (_, out) = h.connect_as(clean, user("u"));
    assert!(out.is_empty());
    h.crash(Duration::from_secs(1));
    let (_, out) = h.connect_as(durable("c", Version::V5), user("u"));
    assert!(Harness::connack(&out).0, "the discard was not committed: the session stands");
    assert_eq!(h.b.session_subscriptions("c").unwrap(), [("again/#".to_owned(), 1)]);
}
