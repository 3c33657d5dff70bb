//! Publisher backpressure (`core/backpressure.rs`): a publisher ahead of a subscriber is read
//! no further until that subscriber catches up, within a bounded wait.

use super::*;

/// A subscriber that takes one message in flight (so its queue grows as messages come), a
/// publisher, and the bound at 4 queued messages.
fn harness() -> (Harness, ConnId, ConnId) {
    let mut h = Harness::limits(|l| {
        l.max_inflight = 1;
        l.backpressure_queue = 4;
        l.backpressure_wait = Duration::from_millis(500);
    });
    let s = h.connect("sub", Version::V5);
    h.send(s, sub(1, "t", QoS::AtLeastOnce));
    h.recv(s);
    let p = h.connect("pub", Version::V5);
    (h, s, p)
}

/// Reads what `s` was sent and acknowledges each QoS 1 message.
fn read_and_ack(h: &mut Harness, s: ConnId) -> usize {
    let mut n = 0;
    for out in h.recv(s) {
        if let Outbound::Publish { pkid, .. } = out {
            n += 1;
            h.send(s, Inbound::PubAck { pkid, reason: 0 });
        }
    }
    n
}

#[test]
fn a_publisher_ahead_of_its_subscriber_is_held_until_the_queue_is_half_drained() {
    let (mut h, s, p) = harness();
    h.send(p, publish("t", QoS::AtLeastOnce, 1, "m"));
    assert_eq!(read_and_ack(&mut h, s), 1);
    // The subscriber reads nothing for a while: its queue fills to the bound.
    for pkid in 2..=5 {
        assert_eq!(h.b.held_until(p), None, "not held before the queue is 4 behind ({pkid})");
        h.send(p, publish("t", QoS::AtLeastOnce, pkid, "m"));
    }
    assert_eq!(h.b.held_until(p), Some(h.now + Duration::from_millis(500)));
    // Nothing refused or dropped: every publish was acknowledged.
    let acks = h.recv(p).into_iter().filter(|o| matches!(o, Outbound::PubAck { reason: 0, .. })).count();
    assert_eq!(acks, 5);
    assert_eq!(h.b.session_queue_len(s), 4);
    // The subscriber takes one at a time: the queue is 3, then 2 (half the bound): resumed.
    assert_eq!(read_and_ack(&mut h, s), 1);
    assert!(h.resumed.is_empty(), "3 still queued");
    assert_eq!(read_and_ack(&mut h, s), 1);
    assert_eq!(h.resumed, [p]);
    assert_eq!(h.b.held_until(p), None);
    assert_eq!(h.b.check_accounting(), Ok(()));
}

#[test]
fn a_subscriber_that_does_not_drain_within_the_wait_holds_no_one_until_half_drained() {
    let (mut h, s, p) = harness();
    for pkid in 1..=4 {
        h.send(p, publish("t", QoS::AtLeastOnce, pkid, "m"));
    }
    let until = h.b.held_until(p).expect("held");
    // Too early: still held.
    h.b.hold_expired(p, until - Duration::from_millis(1));
    assert!(h.b.held_until(p).is_some());
    h.now = until;
    h.b.hold_expired(p, h.now);
    assert_eq!(h.b.held_until(p), None, "the wait is over");
    // Stalled: the queue grows past the bound without holding the publisher again.
    for pkid in 6..=20 {
        h.send(p, publish("t", QoS::AtLeastOnce, pkid, "m"));
        assert_eq!(h.b.held_until(p), None, "a stalled subscriber holds no one ({pkid})");
    }
    // Drained to half the bound: it may hold again.
    while h.b.session_queue_len(s) > 2 {
        read_and_ack(&mut h, s);
    }
    h.send(p, publish("t", QoS::AtLeastOnce, 21, "m"));
    h.send(p, publish("t", QoS::AtLeastOnce, 22, "m"));
    assert!(h.b.held_until(p).is_some(), "queue at 4 again, and no longer stalled");
}

#[test]
fn a_subscriber_going_offline_releases_its_publishers() {
    let (mut h, s, p) = harness();
    for pkid in 1..=4 {
        h.send(p, publish("t", QoS::AtLeastOnce, pkid, "m"));
    }
    assert!(h.b.held_until(p).is_some());
    h.drop_conn(s);
    assert_eq!(h.resumed, [p]);
    assert_eq!(h.b.held_until(p), None);
}

/// A client subscribed to what it publishes is read on (holding its socket would keep its
/// acknowledgements of our deliveries from us, and its queue could never drain): its own
/// PUBACKs wait instead, so its in-flight window stops it until it caught up.
#[test]
fn a_publisher_receiving_its_own_messages_is_read_on_and_its_acks_wait() {
    let (mut h, _s, _p) = harness();
    let both = h.connect("both", Version::V5);
    h.send(both, sub(1, "own", QoS::AtLeastOnce));
    h.recv(both);
    for pkid in 1..=6 {
        h.send(both, publish("own", QoS::AtLeastOnce, pkid, "m"));
    }
    assert_eq!(h.b.held_until(both), None, "read on");
    assert!(h.b.hold_deadline(both).is_some(), "held by its acknowledgements");
    let acked = |out: &[Outbound]| {
        out.iter()
            .filter_map(|o| if let Outbound::PubAck { pkid, .. } = o { Some(*pkid) } else { None })
            .collect::<Vec<u16>>()
    };
    // Its first read: the acks of the publishes before its queue was 4 behind, and the first
    // delivery; the rest of the acks wait.
    let out = h.recv(both);
    assert_eq!(acked(&out), [1, 2, 3]);
    // It acknowledges what it receives, and its queue drains to half the bound: the acks go.
    let mut acks = Vec::new();
    let mut out = out;
    for _ in 0..6 {
        for o in &out {
            if let Outbound::Publish { pkid, .. } = o {
                h.send(both, Inbound::PubAck { pkid: *pkid, reason: 0 });
            }
        }
        out = h.recv(both);
        acks.extend(acked(&out));
    }
    assert_eq!(acks, [4, 5, 6]);
    assert_eq!(h.b.hold_deadline(both), None);
    assert!(h.resumed.is_empty(), "its reading never stopped");
}

#[test]
fn the_node_s_own_publishers_and_a_bound_of_0_hold_no_one() {
    let mut h = Harness::limits(|l| {
        l.max_inflight = 1;
        l.backpressure_queue = 0;
    });
    let s = h.connect("sub", Version::V5);
    h.send(s, sub(1, "t", QoS::AtLeastOnce));
    h.recv(s);
    let p = h.connect("pub", Version::V5);
    for pkid in 1..=50 {
        h.send(p, publish("t", QoS::AtLeastOnce, pkid, "m"));
    }
    assert_eq!(h.b.held_until(p), None, "backpressure off");
    let (mut h, _s, _p) = harness();
    let internal = Identity { owner: "node".into(), internal: true, rules: None };
    let (own, _) = h.connect_as(connect_packet("_probe", Version::V5), internal);
    for pkid in 1..=10 {
        h.send(own, publish("t", QoS::AtLeastOnce, pkid, "m"));
    }
    assert_eq!(h.b.held_until(own), None);
}
