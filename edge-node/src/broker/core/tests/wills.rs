//! wills.

use super::*;

/// [MQTT-3.1.2-8]: the will is published when the connection closes without DISCONNECT.
#[test]
fn mqtt_3_1_2_8_the_will_is_published_when_the_connection_is_lost() {
    let mut h = Harness::new();
    let watcher = h.connect("w", Version::V5);
    h.send(watcher, sub(1, "wills/#", QoS::AtLeastOnce));
    h.recv(watcher);
    let (conn, _) = h.connect_as(with_will("dying", "wills/dying", 0), user("u"));
    h.drop_conn(conn);
    assert_eq!(payloads(&h.recv(watcher)), ["gone"]);
}

/// [MQTT-3.1.2-10]: a normal DISCONNECT removes the will; §3.14.2.1: 0x04 asks for it.
#[test]
fn mqtt_3_1_2_10_a_normal_disconnect_discards_the_will_and_0x04_keeps_it() {
    let mut h = Harness::new();
    let watcher = h.connect("w", Version::V5);
    h.send(watcher, sub(1, "wills/#", QoS::AtLeastOnce));
    h.recv(watcher);
    let (a, _) = h.connect_as(with_will("a", "wills/a", 0), user("u"));
    h.send(a, Inbound::Disconnect { reason: 0, session_expiry: None });
    h.drop_conn(a);
    assert!(payloads(&h.recv(watcher)).is_empty());
    let (b, _) = h.connect_as(with_will("b", "wills/b", 0), user("u"));
    h.send(b, Inbound::Disconnect { reason: 0x04, session_expiry: None });
    assert_eq!(payloads(&h.recv(watcher)), ["gone"]);
}

/// [MQTT-3.1.3-9]: a delayed will waits its Will Delay Interval, and is not sent if the
/// session reconnects first; it goes when the session ends, if that comes sooner.
#[test]
fn mqtt_3_1_3_9_a_delayed_will_waits_and_a_reconnect_cancels_it() {
    let mut h = Harness::new();
    let watcher = h.connect("w", Version::V5);
    h.send(watcher, sub(1, "wills/#", QoS::AtLeastOnce));
    h.recv(watcher);
    let mut c = with_will("slow", "wills/slow", 30);
    c.session_expiry = 600;
    let (conn, _) = h.connect_as(c.clone(), user("u"));
    h.drop_conn(conn);
    h.advance(Duration::from_secs(29));
    assert!(payloads(&h.recv(watcher)).is_empty());
    c.clean_start = false;
    let (conn, _) = h.connect_as(c.clone(), user("u"));
    h.advance(Duration::from_secs(5));
    assert!(payloads(&h.recv(watcher)).is_empty(), "the reconnect cancelled the will");
    h.drop_conn(conn);
    h.advance(Duration::from_secs(31));
    assert_eq!(payloads(&h.recv(watcher)), ["gone"]);

    // Session expiry 5 s, will delay 30 s: the will goes when the session ends.
    let mut c = with_will("short", "wills/short", 30);
    c.session_expiry = 5;
    let (conn, _) = h.connect_as(c, user("u"));
    h.drop_conn(conn);
    h.advance(Duration::from_secs(6));
    assert_eq!(payloads(&h.recv(watcher)), ["gone"]);
}

/// §3.1.3.2.4: the will's Message Expiry Interval is "sent as the Publication Expiry Interval
/// when the Server publishes the Will Message": it counts from publication, not from the
/// CONNECT. A will with 5 s on a connection 10 s old is delivered, with 5 s left.
#[test]
fn mqtt_3_1_3_2_4_a_wills_expiry_counts_from_its_publication() {
    let mut h = Harness::new();
    let watcher = h.connect("w", Version::V5);
    h.send(watcher, sub(1, "wills/#", QoS::AtLeastOnce));
    h.recv(watcher);
    let mut c = with_will("old", "wills/old", 0);
    if let Some(w) = c.will.as_mut() {
        w.expiry = Some(5);
    }
    let (conn, _) = h.connect_as(c, user("u"));
    h.advance(Duration::from_secs(10));
    h.drop_conn(conn);
    h.advance(Duration::from_secs(1));
    let out = h.recv(watcher);
    assert_eq!(payloads(&out), ["gone"]);
    let Some(Outbound::Publish { expiry, .. }) = publishes(&out).first().copied() else { panic!("{out:?}") };
    assert_eq!(*expiry, Some(4), "5 s from publication, 1 s of it gone");
}
