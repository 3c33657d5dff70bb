//! The uplink's policies on a virtual clock: no socket, no sleep.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use shared::proto::edge::{EdgeSession, EdgeSessionConfig};
use shared::proto::{Ack, Control, LaneSeq, Welcome};

use super::send::MAX_KNOWN;
use super::*;
use shared::proto::{Lane, Seq};

const MIN: Duration = Duration::from_millis(200);
const MAX: Duration = Duration::from_secs(30);

fn dialer(servers: &[&str], probing: bool) -> Dialer {
    Dialer::new(servers.iter().map(|s| s.to_string()).collect(), 0, (MIN, MAX), probing)
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[test]
fn a_round_tries_every_bridge_once_before_it_waits() {
    let mut d = dialer(&["a:1", "b:1", "c:1"], false);
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(d.poll_attempt().server);
        let next = d.handle_end(EndKind::Failed, false, 1.0);
        if order.len() < 3 {
            assert_eq!(next, Next::Now, "a dead bridge is no reason to wait before the next");
        } else {
            assert_eq!(next, Next::Wait { wait: MIN, probe_for: None });
        }
    }
    assert_eq!(order, ["a:1", "b:1", "c:1"]);
    assert_eq!(d.poll_attempt().server, "a:1", "the ring goes round");
}

#[test]
fn failures_double_the_wait_with_jitter_and_only_a_welcome_resets_it() {
    let mut d = dialer(&["a:1"], false);
    let mut waits = Vec::new();
    for _ in 0..10 {
        d.poll_attempt();
        let Next::Wait { wait, .. } = d.handle_end(EndKind::Failed, false, 1.0) else {
            panic!("one bridge: every end waits")
        };
        waits.push(wait);
    }
    assert_eq!(&waits[..4], [MIN, MIN * 2, MIN * 4, MIN * 8]);
    assert_eq!(*waits.last().unwrap(), MAX, "capped at backoff_max");
    // A bridge that completes the handshake and then closes is not a welcome.
    d.poll_attempt();
    assert!(matches!(d.handle_end(EndKind::Failed, false, 0.0), Next::Wait { wait, .. } if wait == MAX / 2));
    d.poll_attempt();
    assert_eq!(d.handle_end(EndKind::Failed, true, 1.0), Next::Wait { wait: MIN, probe_for: None }, "welcomed");
}

#[test]
fn a_refusal_waits_backoff_max_at_once_since_every_bridge_refuses_alike() {
    let mut d = dialer(&["a:1", "b:1", "c:1"], true);
    d.poll_attempt();
    assert_eq!(d.handle_end(EndKind::Refused, false, 1.0), Next::Wait { wait: MAX, probe_for: None });
    assert_eq!(d.poll_attempt().server, "b:1");
}

#[test]
fn a_busy_bridge_sends_the_edge_to_the_next_and_then_into_a_window() {
    let mut d = dialer(&["a:1", "b:1"], true);
    d.poll_attempt();
    assert_eq!(d.handle_end(EndKind::Busy, false, 0.5), Next::Now);
    d.poll_attempt();
    let next = d.handle_end(EndKind::Busy, false, 0.5);
    // The first busy window is 2 s wide (`shared::proto::backoff`); a busy bridge is up, so
    // there is nothing to probe for.
    assert_eq!(next, Next::Wait { wait: Duration::from_secs(1), probe_for: None });
}

#[test]
fn a_probe_answer_cuts_one_wait_short_per_welcomed_session_and_pins_the_address() {
    let mut d = dialer(&["a:1", "b:1"], true);
    d.poll_attempt();
    assert_eq!(d.handle_end(EndKind::Failed, false, 1.0), Next::Now);
    // The second end closes the round: wait, probing for at least backoff_max.
    d.poll_attempt();
    let next = d.handle_end(EndKind::Failed, false, 1.0);
    assert!(matches!(next, Next::Wait { probe_for: Some(p), .. } if p == MAX), "{next:?}");
    d.handle_answer("b:1", addr(7));
    let attempt = d.poll_attempt();
    assert_eq!((attempt.server.as_str(), attempt.pinned), ("b:1", Some(addr(7))));
    assert_eq!(d.poll_attempt().pinned, None, "pinned for one attempt");
    // The bridge answers probes but its handshakes fail (saturated): backoff alone now.
    d.handle_end(EndKind::Failed, false, 1.0);
    d.poll_attempt();
    let Next::Wait { probe_for, .. } = d.handle_end(EndKind::Failed, false, 1.0) else { panic!() };
    assert_eq!(probe_for, None, "disarmed until a welcome");
    d.poll_attempt();
    d.handle_end(EndKind::Failed, true, 1.0);
    d.poll_attempt();
    let Next::Wait { probe_for, .. } = d.handle_end(EndKind::Failed, false, 1.0) else { panic!() };
    assert!(probe_for.is_some(), "armed again by the welcome");
    // Probes off: never.
    let mut off = dialer(&["a:1"], false);
    off.poll_attempt();
    assert!(matches!(off.handle_end(EndKind::Failed, false, 1.0), Next::Wait { probe_for: None, .. }));
}

#[test]
fn a_session_switched_by_the_edge_retries_the_same_bridge_from_the_start_of_the_backoff() {
    let mut d = dialer(&["a:1", "b:1"], false);
    for _ in 0..6 {
        d.poll_attempt();
        d.handle_end(EndKind::Failed, false, 1.0);
    }
    let before = d.poll_attempt().server;
    d.handle_switch();
    assert_eq!(d.poll_attempt().server, before);
    assert_eq!(d.step(), MIN);
}

/// An outage played on the virtual clock: the bridge is gone for `outage`, the edge tries it
/// as the dialer says, and this returns when it is back. With probes, an answer comes at the
/// first probe after the bridge returns.
fn back_after(outage: Duration, probing: bool, probe_interval: Duration) -> Duration {
    let mut d = dialer(&["a:1"], probing);
    let mut now = Duration::ZERO;
    let handshake = Duration::from_millis(50);
    loop {
        d.poll_attempt();
        now += handshake;
        if now >= outage {
            return now;
        }
        match d.handle_end(EndKind::Failed, false, 0.5) {
            Next::Now => {}
            Next::Wait { wait, probe_for: None } => now += wait,
            Next::Wait { wait, probe_for: Some(most) } => {
                let answered = outage.max(now).div_duration_f64(probe_interval).ceil() * probe_interval.as_secs_f64();
                let answered = Duration::from_secs_f64(answered);
                if answered < now + most {
                    now = answered;
                    d.handle_answer("a:1", addr(1));
                } else {
                    now += wait.max(most);
                }
            }
        }
    }
}

#[test]
fn after_an_outage_probes_bring_the_edge_back_at_the_first_answer_not_at_its_backoff() {
    let interval = Duration::from_secs(2);
    for outage in [Duration::from_secs(20), Duration::from_secs(95), Duration::from_secs(600)] {
        let probed = back_after(outage, true, interval);
        let blind = back_after(outage, false, interval);
        assert!(probed <= outage + interval + Duration::from_millis(50), "{outage:?}: back at {probed:?}");
        assert!(blind <= outage + MAX, "{outage:?}: back at {blind:?} without probes");
        assert!(probed <= blind, "{outage:?}: {probed:?} with probes, {blind:?} without");
    }
}

const LINGER: Duration = Duration::from_secs(1);
const BATCH: usize = 100;

/// A welcomed session with `window` batches in flight at most.
fn session(window: usize, now: Instant) -> EdgeSession {
    let config = EdgeSessionConfig { window, ..EdgeSessionConfig::default() };
    let mut s = EdgeSession::new(config, "00".repeat(16), []);
    s.connected(now);
    while s.poll_control().is_some() {}
    let welcome =
        Welcome { version: 3, committed: vec![LaneSeq { lane: Lane(0), seq: Seq(0) }], dicts: vec![], sink: None };
    s.handle(Control::Welcome(welcome), now).unwrap();
    s
}

/// One pass of the policy at `now`: the reads it asks for, each taken as sent whole.
fn pass(p: &mut SendPolicy, s: &mut EdgeSession, heads: &[(u8, u64)], now: Instant) -> Vec<Read> {
    p.begin();
    let mut reads = Vec::new();
    while let Some(r) = p.poll_read(s, now) {
        let last = heads.iter().find(|(l, _)| *l == r.lane).map_or(r.after, |h| h.1).min(r.after + r.max as u64);
        if last == r.after {
            p.handle_empty_read(r.lane, r.after);
            continue;
        }
        s.sent(r.lane, r.after + 1, last, now).unwrap();
        reads.push(r);
    }
    reads
}

#[test]
fn a_partial_batch_lingers_and_a_full_one_goes_at_once() {
    let t0 = Instant::now();
    let mut s = session(8, t0);
    let mut p = SendPolicy::new(LINGER, BATCH, 0.1);
    p.set_head(0, 10, t0);
    assert!(pass(&mut p, &mut s, &[(0, 10)], t0).is_empty(), "10 records wait to fill a batch");
    assert_eq!(p.poll_timeout(), Some(t0 + LINGER));
    // Still short of a batch a moment before the linger is over: still waiting, same deadline.
    let almost = t0 + LINGER - Duration::from_millis(1);
    p.set_head(0, 50, almost);
    assert!(pass(&mut p, &mut s, &[(0, 50)], almost).is_empty());
    assert_eq!(p.poll_timeout(), Some(t0 + LINGER), "the linger counts from the first waiting record");
    let reads = pass(&mut p, &mut s, &[(0, 50)], t0 + LINGER);
    assert_eq!(reads, [Read { lane: 0, after: 0, max: BATCH }]);
    assert_eq!(p.poll_timeout(), None);
    // A full batch does not wait.
    p.set_head(0, 50 + BATCH as u64, t0 + LINGER);
    let reads = pass(&mut p, &mut s, &[(0, 50 + BATCH as u64)], t0 + LINGER);
    assert_eq!(reads, [Read { lane: 0, after: 50, max: BATCH }]);
    assert!(p.is_full(BATCH) && !p.is_full(BATCH - 1));
}

/// The rest of a backlog lingers from when it became known, not from the last full batch: after
/// a reconnect, the partial batch at the end of an hour's backlog waited a whole linger (1 s by
/// default) after the full batches before it, a second of a two-second drain.
#[test]
fn the_rest_of_a_backlog_lingers_from_when_it_became_known() {
    let t0 = Instant::now();
    let mut s = session(2, t0);
    let mut p = SendPolicy::new(LINGER, BATCH, 0.1);
    let last = 2 * BATCH as u64 + 50;
    p.set_head(0, last, t0);
    let reads = pass(&mut p, &mut s, &[(0, last)], t0);
    assert_eq!(reads.len(), 2, "two full batches, the window");
    // The window opens 900 ms on: the 50 left are not a batch and have waited 900 ms.
    let later = t0 + Duration::from_millis(900);
    s.handle(Control::Ack(Ack { lane: Lane(0), up_to: Seq(2 * BATCH as u64) }), later).unwrap();
    assert!(pass(&mut p, &mut s, &[(0, last)], later).is_empty());
    assert_eq!(p.poll_timeout(), Some(t0 + LINGER), "due a linger after they were known");
    let reads = pass(&mut p, &mut s, &[(0, last)], t0 + LINGER);
    assert_eq!(reads, [Read { lane: 0, after: 2 * BATCH as u64, max: BATCH }]);
}

/// An old backlog's full batches do not call other lanes' few records out early: only a lane
/// whose partial batch has lingered does.
#[test]
fn a_backlogs_age_does_not_flush_other_lanes() {
    let t0 = Instant::now();
    let mut s = session(1_000_000, t0);
    let mut p = SendPolicy::new(LINGER, BATCH, 0.1);
    let backlog = 20 * BATCH as u64;
    p.set_head(0, backlog, t0);
    let later = t0 + LINGER + Duration::from_millis(100);
    p.set_head(5, 3, later - Duration::from_millis(50));
    let reads = pass(&mut p, &mut s, &[(0, backlog), (5, 3)], later);
    assert_eq!(reads.len(), 20, "the backlog's full batches");
    assert!(reads.iter().all(|r| r.lane == 0), "lane 5 has lingered 50 ms: {reads:?}");
    assert_eq!(p.poll_timeout(), Some(later - Duration::from_millis(50) + LINGER));
}

/// What times a lane's records is bounded however often the spool commits, and still times
/// the first waiting record from when it became known; records deleted before they were read
/// keep the time of those before them.
#[test]
fn a_lanes_record_times_are_bounded_and_keep_the_oldest() {
    let t0 = Instant::now();
    let mut s = session(8, t0);
    let mut p = SendPolicy::new(LINGER, 1_000_000, 0.1);
    for i in 1..=10_000u64 {
        p.set_head(0, i, t0 + Duration::from_micros(i * 10));
    }
    assert!(p.known_len(0) <= MAX_KNOWN, "{} entries", p.known_len(0));
    assert!(pass(&mut p, &mut s, &[(0, 10_000)], t0 + Duration::from_millis(500)).is_empty());
    assert_eq!(p.poll_timeout(), Some(t0 + Duration::from_micros(10) + LINGER));
    // The head goes back (the spool dropped its newest records): still the oldest time.
    p.set_head(0, 5, t0 + Duration::from_millis(600));
    assert!(pass(&mut p, &mut s, &[(0, 5)], t0 + Duration::from_millis(600)).is_empty());
    assert_eq!(p.poll_timeout(), Some(t0 + Duration::from_micros(10) + LINGER));
}

#[test]
fn once_one_lane_has_lingered_every_lane_with_records_goes_in_the_same_pass() {
    let t0 = Instant::now();
    let mut s = session(8, t0);
    let mut p = SendPolicy::new(LINGER, BATCH, 0.1);
    p.set_head(2, 5, t0);
    assert!(pass(&mut p, &mut s, &[(2, 5)], t0).is_empty());
    let later = t0 + Duration::from_millis(900);
    p.set_head(5, 3, later);
    assert!(pass(&mut p, &mut s, &[(2, 5), (5, 3)], later).is_empty());
    assert_eq!(p.poll_timeout(), Some(t0 + LINGER), "the earliest lane's deadline");
    let reads = pass(&mut p, &mut s, &[(2, 5), (5, 3)], t0 + LINGER);
    let lanes: Vec<u8> = reads.iter().map(|r| r.lane).collect();
    assert_eq!(lanes, [2, 5], "lane 5 lingered 100 ms only and still goes with lane 2, by priority");
}

#[test]
fn a_full_window_reads_nothing_until_an_ack() {
    let t0 = Instant::now();
    let mut s = session(2, t0);
    let mut p = SendPolicy::new(Duration::ZERO, 10, 0.1);
    p.set_head(0, 1000, t0);
    let reads = pass(&mut p, &mut s, &[(0, 1000)], t0);
    assert_eq!(reads.len(), 2, "two batches in flight at most");
    assert!(pass(&mut p, &mut s, &[(0, 1000)], t0).is_empty());
    s.handle(Control::Ack(Ack { lane: Lane(0), up_to: Seq(10) }), t0).unwrap();
    let reads = pass(&mut p, &mut s, &[(0, 1000)], t0);
    assert_eq!(reads, [Read { lane: 0, after: 20, max: 10 }]);
}

#[test]
fn a_backlogged_high_lane_leaves_the_lower_lanes_their_share() {
    let t0 = Instant::now();
    let mut s = session(1_000_000, t0);
    let mut p = SendPolicy::new(LINGER, 10, 0.1);
    let heads = [(0, 100_000), (3, 100_000), (7, 100_000)];
    for (lane, last) in heads {
        p.set_head(lane, last, t0);
    }
    let mut count = std::collections::BTreeMap::<u8, usize>::new();
    let mut reads = 0;
    while reads < 1000 {
        p.begin();
        let r = p.poll_read(&s, t0).expect("full batches on every lane");
        s.sent(r.lane, r.after + 1, r.after + 10, t0).unwrap();
        *count.entry(r.lane).or_default() += 1;
        reads += 1;
    }
    assert_eq!((count[&0], count[&3], count[&7]), (900, 50, 50), "{count:?}");
}

#[test]
fn a_read_that_finds_nothing_moves_the_head_and_stops_asking() {
    let t0 = Instant::now();
    let mut s = session(8, t0);
    let mut p = SendPolicy::new(Duration::ZERO, BATCH, 0.1);
    // The heads said 40, but the records were deleted (acked by a mark) before the read.
    p.set_head(0, 40, t0);
    assert!(pass(&mut p, &mut s, &[(0, 0)], t0).is_empty());
    p.begin();
    assert_eq!(p.poll_read(&s, t0), None, "no read again until a new head");
}

/// The downlink across connections: a message handed to the broker waits for the session
/// store's commit whatever becomes of the connection it came on, and reaches subscribers only
/// then. When the connection ends first (the link drops inside the commit window, or the store
/// stalls), the bridge sends it again on the next one: it is not handed over again (a
/// subscriber once got it twice, both as new PUBLISHes without DUP, [MQTT-3.3.1-1] broken), and
/// it is acked once committed.
#[test]
fn a_downlink_message_outlives_the_connection_it_came_on() {
    use crate::broker::codec::{Outbound, QoS, Version};
    use crate::broker::core::tests::durable::durable;
    use crate::broker::core::tests::{Harness, payloads, sub, user};
    use crate::downlink::{DownCore, DownMark, DownlinkEntry, Governance, RetainPolicy, RulesOf};
    use shared::proto::down::{Down, DownAck};
    use std::sync::Arc;

    let mut h = Harness::new();
    let (app, _) = h.connect_as(durable("app", Version::V5), user("u"));
    h.send(app, sub(1, "cmd/#", QoS::AtLeastOnce));
    h.recv(app);
    let entry = DownlinkEntry { filter: "cmd/#".into(), max_qos: 2, retain: RetainPolicy::Keep, user: None };
    let rules_of: RulesOf = Arc::new(|_| None);
    let mut down = DownCore::new(Governance::new(&[entry]), rules_of, DownMark::default());
    let mut session = EdgeSession::new(EdgeSessionConfig::default(), "e1", [(0, 0)]);
    let now = h.now;
    let down_frame = || {
        Control::Down(Box::new(Down {
            seq: 1,
            topic: "cmd/a".into(),
            payload: b"open".to_vec(),
            qos: 1,
            retain: false,
            expires_in_ms: None,
            user_properties: vec![],
            response_topic: None,
            correlation_data: None,
            content_type: None,
        }))
    };
    let welcome = || {
        Control::Welcome(Welcome {
            version: *shared::proto::VERSIONS.last().unwrap(),
            committed: vec![],
            dicts: vec![],
            sink: None,
        })
    };
    let acks = |conn: &mut Conn, session: &mut EdgeSession| {
        std::iter::from_fn(|| conn.poll_io(session))
            .filter_map(|io| match io {
                Io::Control(Control::DownAck(DownAck { up_to, .. })) => Some(up_to),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    h.hold_store = true;
    let policy = || SendPolicy::new(Duration::from_millis(20), 64, 0.2);
    let mut conn = Conn::start(&mut session, &mut down, h.b.durable_through(), policy(), now);
    conn.handle_control(&mut session, &mut down, &mut h.b, welcome(), now).unwrap();
    conn.handle_control(&mut session, &mut down, &mut h.b, down_frame(), now).unwrap();
    assert!(payloads(&h.recv(app)).is_empty(), "not before its mark is committed");
    assert_eq!(acks(&mut conn, &mut session), [0], "the welcome's ack only: not before the commit");
    // The link drops inside the commit window.
    drop(conn);
    session.disconnected();
    let mut conn = Conn::start(&mut session, &mut down, h.b.durable_through(), policy(), now);
    conn.handle_control(&mut session, &mut down, &mut h.b, welcome(), now).unwrap();
    conn.handle_control(&mut session, &mut down, &mut h.b, down_frame(), now).unwrap();
    let again: Vec<Outbound> = h.recv(app);
    assert!(payloads(&again).is_empty(), "handed over once: {again:?}");
    h.commit_store();
    assert_eq!(payloads(&h.recv(app)), ["open"], "delivered once, once committed");
    conn.handle_stored(&mut session, &mut down, h.b.durable_through()).unwrap();
    assert_eq!(acks(&mut conn, &mut session), [1], "acked once committed");
}

#[test]
fn servers_go_round_from_where_they_start() {
    let list: Vec<String> = ["a:1", "b:1", "c:1"].map(String::from).to_vec();
    let mut s = Servers::new(list, 4);
    assert_eq!(s.current(), "b:1");
    s.advance();
    s.advance();
    assert_eq!(s.current(), "a:1");
    s.prefer("c:1");
    assert_eq!(s.current(), "c:1");
    s.prefer("unknown:1");
    assert_eq!(s.current(), "c:1");
}
