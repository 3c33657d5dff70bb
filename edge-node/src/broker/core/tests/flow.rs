//! slow subscribers.

use super::*;

/// Guarantee 1's bound: a subscriber whose queue is full loses its oldest QoS 0 messages first;
/// when a QoS 1 message finds no room it is disconnected with 0x97; every message it loses is
/// counted, and the publisher and other subscribers are not held up.
#[test]
fn a_slow_subscriber_loses_qos0_first_then_is_disconnected_with_0x97() {
    let mut h = Harness::limits(|l| l.max_queued_messages = 4);
    let slow = h.connect("slow", Version::V5);
    h.send(slow, sub(1, "t", QoS::AtLeastOnce));
    let fast = h.connect("fast", Version::V5);
    h.send(fast, sub(1, "t", QoS::AtLeastOnce));
    h.recv(slow);
    h.recv(fast);
    let p = h.connect("p", Version::V5);
    let mut fast_got = 0;
    let mut publish_and_read = |h: &mut Harness, packet: Inbound| {
        h.send(p, packet);
        for out in h.recv(fast) {
            if let Outbound::Publish { pkid, qos, .. } = out {
                fast_got += 1;
                if qos == QoS::AtLeastOnce {
                    h.send(fast, Inbound::PubAck { pkid, reason: 0 });
                }
            }
        }
    };
    // QoS 0 fills the queue of a subscriber that reads nothing.
    for i in 0..4 {
        publish_and_read(&mut h, publish("t", QoS::AtMostOnce, 0, &format!("q0-{i}")));
    }
    // A QoS 1 message makes room by dropping the oldest QoS 0 one, four times over.
    for pkid in 1..=4 {
        publish_and_read(&mut h, publish("t", QoS::AtLeastOnce, pkid, "q1"));
        assert!(!h.closing(slow), "QoS 0 made room for QoS 1 message {pkid}");
    }
    publish_and_read(&mut h, publish("t", QoS::AtLeastOnce, 5, "q1"));
    assert!(h.closing(slow), "no QoS 0 left to drop: disconnected");
    assert_eq!(h.recv(slow), [Outbound::Disconnect { reason: 0x97 }]);
    assert_eq!(fast_got, 9, "the other subscriber got everything");
    let acks = h.recv(p);
    assert_eq!(acks.len(), 5, "the publisher was not held up: {acks:?}");
    assert!(!h.closing(p));
    assert_eq!(h.b.check_accounting(), Ok(()));
}

/// The `drop-newest` policy never disconnects: a full queue drops the new message.
#[test]
fn the_drop_newest_policy_keeps_a_slow_subscriber_connected() {
    let mut h = Harness::limits(|l| {
        l.max_queued_messages = 2;
        l.slow_subscriber = SlowSubscriber::DropNewest;
    });
    let slow = h.connect("slow", Version::V5);
    h.send(slow, sub(1, "t", QoS::AtLeastOnce));
    h.recv(slow);
    let p = h.connect("p", Version::V5);
    for pkid in 1..=5 {
        h.send(p, publish("t", QoS::AtLeastOnce, pkid, &pkid.to_string()));
    }
    assert!(!h.closing(slow));
    assert_eq!(payloads(&h.recv(slow)), ["1", "2"]);
}

/// `max_queued_bytes_total` bounds what all sessions hold together, offline ones included.
#[test]
fn the_total_queue_bound_holds_over_all_sessions() {
    let mut h = Harness::limits(|l| {
        l.max_queued_bytes = 10_000;
        l.max_queued_bytes_total = 1_000;
    });
    for id in ["a", "b"] {
        let mut c = connect_packet(id, Version::V5);
        c.session_expiry = 600;
        let (conn, _) = h.connect_as(c, user("u"));
        h.send(conn, sub(1, "t", QoS::AtLeastOnce));
        h.drop_conn(conn);
    }
    let p = h.connect("p", Version::V5);
    for pkid in 1..=20 {
        h.send(p, publish("t", QoS::AtLeastOnce, pkid, &"x".repeat(100)));
    }
    assert!(h.b.held_total <= 1_000, "{}", h.b.held_total);
    assert!(h.b.held_total > 500, "both sessions got some: {}", h.b.held_total);
    assert_eq!(h.b.check_accounting(), Ok(()));
}
