//! The downlink (version 5) through both sessions: in order, each message done once on the
//! edge whatever the link and the restarts do, refusals reaching the sink, and the rules an
//! older peer relies on (an edge of version 4 never receives a downlink frame).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use proptest::prelude::*;

use super::cloud::{CloudSession, DownWindow, Request};
use super::down::{Down, DownOutcome, DownRefusal};
use super::edge::{EdgeEvent, EdgeSession, EdgeSessionConfig, SessionError};
use super::{Control, DOWNLINK_VERSION};

const EPOCH: &str = "0123456789abcdef";

fn versions() -> Vec<u16> {
    (1..=DOWNLINK_VERSION).collect()
}

fn down(seq: u64) -> Down {
    Down {
        seq,
        topic: format!("cmd/{seq}"),
        payload: seq.to_be_bytes().to_vec(),
        qos: 1,
        retain: false,
        expires_in_ms: None,
        user_properties: vec![],
        response_topic: None,
        correlation_data: None,
        content_type: None,
    }
}

/// What the edge's driver does with message `seq` in these tests.
fn outcome(seq: u64) -> DownOutcome {
    if seq.is_multiple_of(5) {
        DownOutcome::Refused(format!("topic cmd/{seq} is not allowed"))
    } else if seq.is_multiple_of(7) {
        DownOutcome::Expired
    } else {
        DownOutcome::Delivered
    }
}

/// The sink's side: the messages for this edge, its recorded position and refusals.
#[derive(Debug, Default)]
struct Sink {
    messages: Vec<u64>,
    mark: u64,
    refused: BTreeMap<u64, String>,
    expired: BTreeSet<u64>,
}

/// The edge's durable state: what it delivered (with the position, in one commit), and the
/// refusals and expiries the cloud has not marked.
#[derive(Debug, Default, Clone)]
struct Edge {
    delivered: Vec<u64>,
    done: u64,
    refused: Vec<DownRefusal>,
    expired: Vec<u64>,
}

impl Edge {
    fn session(&self) -> EdgeSession {
        EdgeSession::new(EdgeSessionConfig { max_down_pending: 8, ..Default::default() }, EPOCH, [])
            .with_versions(versions())
            .with_down(self.done, self.refused.clone(), self.expired.clone())
    }

    /// Carries out the session's events, persisting each outcome before it is acked.
    fn events(&mut self, session: &mut EdgeSession, events: Vec<EdgeEvent>) {
        for event in events {
            match event {
                EdgeEvent::Down(d) => {
                    let outcome = outcome(d.seq);
                    if outcome == DownOutcome::Delivered {
                        self.delivered.push(d.seq);
                    }
                    session.down_done(d.seq, outcome).unwrap();
                    self.persist(session);
                }
                EdgeEvent::DownMarked(_) => self.persist(session),
                _ => {}
            }
        }
    }

    fn persist(&mut self, session: &EdgeSession) {
        self.done = session.down_position();
        let (refused, expired) = session.down_unmarked();
        (self.refused, self.expired) = (refused.to_vec(), expired.to_vec());
    }
}

/// The bridge's driver over the sink.
fn cloud_handle(cloud: &mut CloudSession, sink: &mut Sink, frame: Control) -> Result<(), SessionError> {
    match cloud.handle(frame)? {
        Some(Request::Hello(h)) => {
            cloud.welcome(vec![], vec![]);
            // The edge may be further than the sink: it made those durable.
            let position = sink.mark.max(h.down_mark);
            cloud.start_down(position);
        }
        Some(Request::DownAcked(ack)) => {
            for r in ack.refused {
                sink.refused.insert(r.seq, r.reason);
            }
            sink.expired.extend(ack.expired);
            sink.mark = sink.mark.max(ack.up_to);
            cloud.down_marked(ack.up_to);
        }
        _ => {}
    }
    Ok(())
}

/// Sends what the window allows, in order.
fn fill(cloud: &mut CloudSession, sink: &Sink) {
    while cloud.down_room() {
        let after = cloud.down_sent();
        let Some(&next) = sink.messages.iter().find(|s| **s > after) else { break };
        cloud.send_down(down(next)).unwrap();
    }
}

/// Both ends on one connection until nothing moves.
fn settle(cloud: &mut CloudSession, edge: &mut EdgeSession, sink: &mut Sink, durable: &mut Edge, now: Instant) {
    loop {
        fill(cloud, sink);
        let mut moved = false;
        while let Some(f) = cloud.poll_control() {
            let events = edge.handle(f, now).unwrap();
            durable.events(edge, events);
            moved = true;
        }
        while let Some(f) = edge.poll_control() {
            cloud_handle(cloud, sink, f).unwrap();
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

fn connect(durable: &Edge, now: Instant) -> (CloudSession, EdgeSession) {
    let cloud =
        CloudSession::new(8).with_versions(versions()).with_down_window(DownWindow { messages: 4, bytes: 1 << 20 });
    let mut edge = durable.session();
    edge.connected(now);
    (cloud, edge)
}

#[test]
fn messages_are_delivered_in_order_and_refusals_reach_the_sink_then_are_forgotten() {
    let now = Instant::now();
    let mut sink = Sink { messages: vec![1, 3, 5, 6, 7, 9, 10, 12], ..Sink::default() };
    let mut durable = Edge::default();
    let (mut cloud, mut edge) = connect(&durable, now);
    settle(&mut cloud, &mut edge, &mut sink, &mut durable, now);
    assert_eq!(durable.delivered, [1, 3, 6, 9, 12]);
    assert_eq!(sink.refused.keys().copied().collect::<Vec<_>>(), [5, 10]);
    assert_eq!(sink.refused[&5], "topic cmd/5 is not allowed");
    assert_eq!(sink.expired.iter().copied().collect::<Vec<_>>(), [7]);
    assert_eq!(sink.mark, 12);
    // Marked: the edge keeps nothing more.
    assert!(durable.refused.is_empty() && durable.expired.is_empty(), "{durable:?}");
}

#[test]
fn a_resend_after_a_reconnect_is_acked_not_delivered_again() {
    let now = Instant::now();
    let mut sink = Sink { messages: (1..=6).collect(), ..Sink::default() };
    let mut durable = Edge::default();
    let (mut cloud, mut edge) = connect(&durable, now);
    // The edge finishes 1..=4 but its acks are lost with the connection.
    fill(&mut cloud, &sink);
    cloud_handle(&mut cloud, &mut sink, edge.poll_control().unwrap()).unwrap();
    fill(&mut cloud, &sink);
    while let Some(f) = cloud.poll_control() {
        let events = edge.handle(f, now).unwrap();
        durable.events(&mut edge, events);
    }
    assert_eq!(durable.delivered, [1, 2, 3, 4]);
    assert_eq!(sink.mark, 0, "no ack got through");
    // A new bridge (the sink still at 0) starts from the edge's position in its hello.
    edge.disconnected();
    let (mut cloud, _) = connect(&durable, now);
    edge.connected(now);
    settle(&mut cloud, &mut edge, &mut sink, &mut durable, now);
    assert_eq!(durable.delivered, [1, 2, 3, 4, 6], "nothing twice, 5 refused");
    assert_eq!(sink.mark, 6);
    assert_eq!(sink.refused.keys().copied().collect::<Vec<_>>(), [5]);
    // A bridge that did not read the edge's mark resends from its own: acked, not delivered.
    let mut stale = CloudSession::new(8).with_versions(versions());
    stale.handle(Control::Hello(super::Hello { down_mark: 0, ..hello() })).unwrap();
    stale.welcome(vec![], vec![]);
    stale.start_down(2);
    stale.send_down(down(3)).unwrap();
    let mut edge = durable.session();
    edge.connected(now);
    while edge.poll_control().is_some() {}
    edge.handle(welcome(), now).unwrap();
    let _ = stale.poll_control();
    let events = edge.handle(stale.poll_control().unwrap(), now).unwrap();
    assert!(events.is_empty(), "{events:?}");
    let Some(Control::DownAck(ack)) = edge.poll_control() else { panic!("a re-ack") };
    assert_eq!(ack.up_to, 6);
}

fn hello() -> super::Hello {
    super::Hello {
        versions: versions(),
        epoch: EPOCH.into(),
        lanes: vec![],
        models: vec![],
        dicts: vec![],
        caps: vec![],
        down_mark: 0,
        down_window: None,
    }
}

fn welcome() -> Control {
    Control::Welcome(super::Welcome { version: DOWNLINK_VERSION, committed: vec![], dicts: vec![], sink: None })
}

#[test]
fn an_older_peer_never_sees_a_downlink_frame_and_a_misbehaving_one_is_named() {
    let now = Instant::now();
    // A version 4 edge: the bridge does not start the downlink, and a Down is a violation.
    let mut cloud = CloudSession::new(8).with_versions(versions());
    cloud.handle(Control::Hello(super::Hello { versions: vec![1, 2, 3, 4], down_mark: 9, ..hello() })).unwrap();
    cloud.welcome(vec![], vec![]);
    assert!(!cloud.start_down(0), "no downlink on version 4");
    assert!(!cloud.down_room());
    assert!(cloud.send_down(down(1)).is_err());
    let mut old = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, []).with_versions(vec![1, 2, 3, 4]);
    old.connected(now);
    old.handle(Control::Welcome(super::Welcome { version: 4, committed: vec![], dicts: vec![], sink: None }), now)
        .unwrap();
    let e = old.handle(Control::Down(Box::new(down(1))), now).unwrap_err();
    assert!(e.to_string().contains("version 4"), "{e}");
    // A version 4 hello's mark is not taken (an older edge cannot mean it).
    let mut cloud = CloudSession::new(8).with_versions(versions());
    let Some(Request::Hello(h)) =
        cloud.handle(Control::Hello(super::Hello { versions: vec![4], down_mark: 9, ..hello() })).unwrap()
    else {
        panic!()
    };
    assert_eq!(h.down_mark, 0);

    // On version 5: out of order, past the window, an ack of what was not sent.
    let mut edge = Edge::default().session();
    edge.connected(now);
    edge.handle(welcome(), now).unwrap();
    edge.handle(Control::Down(Box::new(down(5))), now).unwrap();
    let e = edge.handle(Control::Down(Box::new(down(4))), now).unwrap_err();
    assert!(e.to_string().contains("out of order"), "{e}");
    // On version 5 the bridge heard nothing of the edge's 8: it holds what every edge held.
    let mut edge = Edge::default().session();
    edge.connected(now);
    edge.handle(welcome(), now).unwrap();
    for seq in 1..=super::down::MAX_DOWN_WINDOW as u64 {
        edge.handle(Control::Down(Box::new(down(seq))), now).unwrap();
    }
    let e = edge.handle(Control::Down(Box::new(down(257))), now).unwrap_err();
    assert!(e.to_string().contains("more than 256 downlink messages unanswered"), "{e}");
    let e = edge.down_done(2, DownOutcome::Delivered).unwrap_err();
    assert!(e.to_string().contains("the oldest waiting is Some(1)"), "{e}");
    edge.down_done(1, DownOutcome::Delivered).unwrap();
    let e = edge.down_done(1, DownOutcome::Delivered).unwrap_err();
    assert!(e.to_string().contains("done through 1"), "{e}");
    let e = edge.handle(Control::DownMarked { up_to: 3 }, now).unwrap_err();
    assert!(e.to_string().contains("done only through 1"), "{e}");

    let mut cloud = CloudSession::new(8).with_versions(versions());
    cloud.handle(Control::Hello(hello())).unwrap();
    cloud.welcome(vec![], vec![]);
    assert!(cloud.start_down(10));
    cloud.send_down(down(11)).unwrap();
    assert!(cloud.send_down(down(11)).is_err(), "the same seq twice");
    let ack =
        |up_to, refused: Vec<DownRefusal>| Control::DownAck(super::down::DownAck { up_to, refused, expired: vec![] });
    let e = cloud.handle(ack(12, vec![])).unwrap_err();
    assert!(e.to_string().contains("12"), "{e}");
    let e = cloud.handle(ack(11, vec![DownRefusal { seq: 12, reason: "x".into() }])).unwrap_err();
    assert!(e.to_string().contains("after it"), "{e}");
    let e = cloud.handle(ack(11, vec![DownRefusal { seq: 11, reason: "x".repeat(300) }])).unwrap_err();
    assert!(e.to_string().contains("300 bytes"), "{e}");
    assert!(matches!(cloud.handle(ack(11, vec![])).unwrap(), Some(Request::DownAcked(_))));
    let e = cloud.handle(ack(10, vec![])).unwrap_err();
    assert!(e.to_string().contains("11 was acked"), "{e}");
}

/// A bridge that never marks cannot make the edge keep refusals without end: past
/// `MAX_DOWN_REPORT` unmarked, the next message ends the session.
#[test]
fn refusals_the_cloud_never_marks_are_bounded() {
    let now = Instant::now();
    let many: Vec<DownRefusal> =
        (1..=super::down::MAX_DOWN_REPORT as u64).map(|seq| DownRefusal { seq, reason: "no".into() }).collect();
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, []).with_versions(versions()).with_down(
        many.len() as u64,
        many,
        vec![],
    );
    edge.connected(now);
    edge.handle(welcome(), now).unwrap();
    let e = edge.handle(Control::Down(Box::new(down(5000))), now).unwrap_err();
    assert!(e.to_string().contains("4096 downlink refusals and expiries the cloud has not marked"), "{e}");
}

#[test]
fn the_window_bounds_messages_and_bytes_unanswered() {
    let mut cloud =
        CloudSession::new(8).with_versions(versions()).with_down_window(DownWindow { messages: 3, bytes: 1000 });
    cloud.handle(Control::Hello(hello())).unwrap();
    cloud.welcome(vec![], vec![]);
    cloud.start_down(0);
    let big = |seq| Down { payload: vec![0; 600], ..down(seq) };
    cloud.send_down(big(1)).unwrap();
    cloud.send_down(big(2)).unwrap();
    assert!(!cloud.down_room(), "over the bytes");
    let ack = |up_to| Control::DownAck(super::down::DownAck { up_to, ..Default::default() });
    cloud.handle(ack(2)).unwrap();
    for seq in 3..=5 {
        cloud.send_down(down(seq)).unwrap();
    }
    assert!(!cloud.down_room(), "over the count");
    // A message larger than the whole window still goes, alone.
    cloud.handle(ack(5)).unwrap();
    cloud.send_down(Down { payload: vec![0; 5000], ..down(6) }).unwrap();
    assert!(!cloud.down_room());
}

/// A bridge given a window past what an edge holds unanswered sends no more than the edge
/// holds: a bridge configured with 1,024 once sent the 257th before the edge's store caught up,
/// and the edge ended the session each time (delivery at a tenth of the rate).
#[test]
fn a_window_past_what_an_edge_holds_is_held_to_it() {
    let now = Instant::now();
    let mut cloud =
        CloudSession::new(8).with_versions(versions()).with_down_window(DownWindow { messages: 1024, bytes: 1 << 30 });
    cloud.handle(Control::Hello(hello())).unwrap();
    cloud.welcome(vec![], vec![]);
    assert!(cloud.start_down(0));
    while cloud.poll_control().is_some() {}
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, []).with_versions(versions());
    edge.connected(now);
    while edge.poll_control().is_some() {}
    edge.handle(welcome(), now).unwrap();
    // The edge's store commits nothing meanwhile: every message sent stays unanswered.
    let mut seq = 0;
    while cloud.down_room() {
        seq += 1;
        cloud.send_down(down(seq)).unwrap();
    }
    assert_eq!(seq as usize, super::down::MAX_DOWN_WINDOW);
    while let Some(frame) = cloud.poll_control() {
        if let Err(e) = edge.handle(frame, now) {
            panic!("the edge ended the session at {}: {e}", cloud.down_sent());
        }
    }
    // Its first commit frees room for the next.
    edge.down_done(1, DownOutcome::Delivered).unwrap();
    let ack = std::iter::from_fn(|| edge.poll_control()).find_map(|f| match f {
        Control::DownAck(ack) => Some(ack),
        _ => None,
    });
    cloud.handle(Control::DownAck(ack.expect("an ack"))).unwrap();
    assert!(cloud.down_room());
    cloud.send_down(down(seq + 1)).unwrap();
    edge.handle(cloud.poll_control().expect("sent"), now).expect("within what the edge holds");
}

/// A session of version 9 between sessions of `edge` and `cloud`, welcomed, the downlink
/// started at 0 and both ends' queues emptied.
fn v9(edge: EdgeSessionConfig, cloud: DownWindow, now: Instant) -> (CloudSession, EdgeSession) {
    let mut edge = EdgeSession::new(edge, EPOCH, []);
    let mut cloud = CloudSession::new(8).with_down_window(cloud);
    edge.connected(now);
    let hello = edge.poll_control().expect("a hello");
    assert!(matches!(&hello, Control::Hello(h) if h.down_window.is_some()), "{hello:?}");
    cloud.handle(hello).unwrap();
    cloud.welcome(vec![], vec![]);
    let welcome = cloud.poll_control().expect("a welcome");
    assert!(matches!(&welcome, Control::Welcome(w) if w.version == super::DOWN_WINDOW_VERSION), "{welcome:?}");
    edge.handle(welcome, now).unwrap();
    assert!(cloud.start_down(0));
    while cloud.poll_control().is_some() {}
    while edge.poll_control().is_some() {}
    (cloud, edge)
}

/// [version 9] The edge says in its hello what it holds of the downlink, and the bridge sends
/// within the smaller of that and its own window, in messages and in bytes: what the cloud
/// can make wait in an edge's memory is the edge's to bound. Each message the bridge sends the
/// edge takes.
#[test]
fn the_bridge_sends_within_the_window_an_edge_of_version_9_announces() {
    let now = Instant::now();
    let small = EdgeSessionConfig { max_down_pending: 3, max_down_bytes: 1000, ..Default::default() };
    let (mut cloud, mut edge) = v9(small.clone(), DownWindow { messages: 16, bytes: 1 << 20 }, now);
    assert_eq!(cloud.down_window(), DownWindow { messages: 3, bytes: 1000 });
    let big = |seq| Down { payload: vec![0; 600], ..down(seq) };
    let mut seq = 0;
    while cloud.down_room() {
        seq += 1;
        cloud.send_down(big(seq)).unwrap();
    }
    assert_eq!(seq, 2, "the second passes the bytes, the third waits");
    while let Some(frame) = cloud.poll_control() {
        edge.handle(frame, now).expect("within what the edge announced");
    }
    // The bridge's own window where it is the smaller.
    let (cloud, _) = v9(small, DownWindow { messages: 2, bytes: 500 }, now);
    assert_eq!(cloud.down_window(), DownWindow { messages: 2, bytes: 500 });
}

/// [version 9] A bridge that passes what the edge announced, in messages or in bytes, ends the
/// session with the reason; one message larger than the whole window still comes alone. A
/// hello announcing no room at all is refused.
#[test]
fn an_edge_of_version_9_ends_a_session_past_its_announced_window() {
    let now = Instant::now();
    let small = EdgeSessionConfig { max_down_pending: 3, max_down_bytes: 1000, ..Default::default() };
    let (_, mut edge) = v9(small.clone(), DownWindow { messages: 16, bytes: 1 << 20 }, now);
    let big = |seq| Down { payload: vec![0; 600], ..down(seq) };
    edge.handle(Control::Down(Box::new(big(1))), now).unwrap();
    edge.handle(Control::Down(Box::new(big(2))), now).unwrap();
    let e = edge.handle(Control::Down(Box::new(big(3))), now).unwrap_err();
    assert!(e.to_string().contains("past the 1000 bytes this edge announced"), "{e}");
    let (_, mut edge) = v9(small.clone(), DownWindow { messages: 16, bytes: 1 << 20 }, now);
    for seq in 1..=3 {
        edge.handle(Control::Down(Box::new(down(seq))), now).unwrap();
    }
    let e = edge.handle(Control::Down(Box::new(down(4))), now).unwrap_err();
    assert!(e.to_string().contains("more than 3 downlink messages unanswered"), "{e}");
    let (_, mut edge) = v9(small, DownWindow { messages: 16, bytes: 1 << 20 }, now);
    edge.handle(Control::Down(Box::new(Down { payload: vec![0; 5000], ..down(1) })), now).expect("alone, it comes");
    edge.down_done(1, DownOutcome::Delivered).unwrap();
    edge.handle(Control::Down(Box::new(big(2))), now).expect("room again");

    let mut cloud = CloudSession::new(8);
    let window = Some(super::down::EdgeWindow { messages: 0, bytes: 1000 });
    let e = cloud.handle(Control::Hello(super::Hello {
        versions: super::VERSIONS.to_vec(),
        down_window: window,
        ..hello()
    }));
    assert!(e.unwrap_err().to_string().contains("downlink window of 0 messages"));
}

/// [versions 8 and 9 together] An edge of version 9 and a bridge of version 8: the bridge skips
/// the announcement it does not know, and the edge, configured to hold 3, takes the bridge's
/// window of up to 256 of any size, as every edge before it did. An edge of version 8 (no
/// announcement) on a bridge of version 9: the bridge's own window.
#[test]
fn edges_and_bridges_of_versions_8_and_9_keep_the_older_window() {
    let now = Instant::now();
    let small = EdgeSessionConfig { max_down_pending: 3, max_down_bytes: 1000, ..Default::default() };
    let previous: Vec<u16> = (1..super::DOWN_WINDOW_VERSION).collect();
    let mut edge = EdgeSession::new(small, EPOCH, []);
    let mut cloud = CloudSession::new(8)
        .with_versions(previous.clone())
        .with_down_window(DownWindow { messages: 16, bytes: 1 << 20 });
    edge.connected(now);
    cloud.handle(edge.poll_control().unwrap()).unwrap();
    cloud.welcome(vec![], vec![]);
    edge.handle(cloud.poll_control().unwrap(), now).unwrap();
    assert!(cloud.start_down(0));
    assert_eq!(cloud.down_window(), DownWindow { messages: 16, bytes: 1 << 20 }, "the announcement skipped");
    for seq in 1..=16 {
        cloud.send_down(Down { payload: vec![0; 600], ..down(seq) }).unwrap();
    }
    while let Some(frame) = cloud.poll_control() {
        edge.handle(frame, now).expect("an edge holds 256 for an older bridge");
    }
    let old = super::Hello { versions: previous, down_window: None, ..hello() };
    let mut cloud = CloudSession::new(8).with_down_window(DownWindow { messages: 16, bytes: 1 << 20 });
    cloud.handle(Control::Hello(old)).unwrap();
    assert_eq!(cloud.down_window(), DownWindow { messages: 16, bytes: 1 << 20 });
}

#[derive(Debug, Clone)]
enum Step {
    /// The bridge's sink gets messages for the edge: this many, spaced by this much.
    Publish(u8, u8),
    /// Frames move both ways until nothing moves.
    Settle,
    /// One frame from the cloud to the edge.
    ToEdge,
    /// One frame from the edge to the cloud.
    ToCloud,
    /// The connection drops with whatever was in flight; the next one goes to another bridge.
    Reconnect,
    /// The edge process dies: only what it persisted remains.
    EdgeCrash,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (1u8..6, 1u8..4).prop_map(|(n, gap)| Step::Publish(n, gap)),
        2 => Just(Step::Settle),
        4 => Just(Step::ToEdge),
        4 => Just(Step::ToCloud),
        1 => Just(Step::Reconnect),
        1 => Just(Step::EdgeCrash),
    ]
}

proptest! {
    /// Whatever the link and the restarts do, every message the sink holds for the edge is
    /// done exactly once, in order: delivered ones delivered once, refused and expired ones
    /// recorded in the sink, and the sink's position at the last message.
    #[test]
    fn each_downlink_message_is_done_exactly_once_over_a_misbehaving_link(steps in prop::collection::vec(step(), 1..80)) {
        let now = Instant::now();
        let mut sink = Sink::default();
        let mut durable = Edge::default();
        let (mut cloud, mut edge) = connect(&durable, now);
        for step in steps {
            match step {
                Step::Publish(n, gap) => {
                    let mut last = sink.messages.last().copied().unwrap_or(0);
                    for _ in 0..n {
                        last += u64::from(gap);
                        sink.messages.push(last);
                    }
                }
                Step::Settle => settle(&mut cloud, &mut edge, &mut sink, &mut durable, now),
                Step::ToEdge => {
                    fill(&mut cloud, &sink);
                    if let Some(f) = cloud.poll_control() {
                        let events = edge.handle(f, now).unwrap();
                        durable.events(&mut edge, events);
                    }
                }
                Step::ToCloud => {
                    if let Some(f) = edge.poll_control() {
                        cloud_handle(&mut cloud, &mut sink, f).unwrap();
                    }
                }
                Step::Reconnect => {
                    edge.disconnected();
                    (cloud, edge) = {
                        let (c, _) = connect(&durable, now);
                        edge.connected(now);
                        (c, edge)
                    };
                }
                Step::EdgeCrash => (cloud, edge) = connect(&durable, now),
            }
        }
        settle(&mut cloud, &mut edge, &mut sink, &mut durable, now);
        let want: Vec<u64> =
            sink.messages.iter().copied().filter(|s| outcome(*s) == DownOutcome::Delivered).collect();
        prop_assert_eq!(&durable.delivered, &want);
        let refused: Vec<u64> =
            sink.messages.iter().copied().filter(|s| matches!(outcome(*s), DownOutcome::Refused(_))).collect();
        prop_assert_eq!(sink.refused.keys().copied().collect::<Vec<_>>(), refused);
        let expired: Vec<u64> = sink.messages.iter().copied().filter(|s| outcome(*s) == DownOutcome::Expired).collect();
        prop_assert_eq!(sink.expired.iter().copied().collect::<Vec<_>>(), expired);
        prop_assert_eq!(sink.mark, sink.messages.last().copied().unwrap_or(0));
        prop_assert!(durable.refused.is_empty() && durable.expired.is_empty());
    }
}
