//! Both session ends driven together over a simulated link with a virtual clock: batches can be
//! reordered, lost with the connection, or resent; the sink must end up with every seq exactly
//! once, in order, and the edge must delete only what the sink committed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::cloud::{CloudPhase, CloudSession, Request};
use super::edge::{EdgeEvent, EdgeSession, EdgeSessionConfig, Phase, SessionError};
use super::{Batch, Codec, Control, DOWN_WINDOW_VERSION, DictAnnounce, LaneSeq};
use super::{Lane, Seq};

const EPOCH: &str = "0123456789abcdef";

fn batch(lane: u8, first: u64, last: u64) -> Batch {
    Batch {
        epoch: EPOCH.into(),
        lane: Lane(lane),
        first_seq: Seq(first),
        last_seq: Seq(last),
        codec: Codec::Cbor,
        dict: None,
        raw_len: 0,
        body: vec![],
    }
}

/// The cloud end with its sink: committed seqs per lane and stored dictionaries (the durable
/// state a new bridge reads).
struct Cloud {
    session: CloudSession,
    sink: BTreeMap<u8, Vec<u64>>,
    dicts: BTreeMap<String, Vec<u8>>,
    reports: Vec<super::ClassesReport>,
}

impl Cloud {
    fn connect(sink: BTreeMap<u8, Vec<u64>>) -> Self {
        Self { session: CloudSession::new(64), sink, dicts: BTreeMap::new(), reports: Vec::new() }
    }

    /// A new bridge on the same shared state.
    fn reconnect(self) -> Self {
        Self { session: CloudSession::new(64), ..self }
    }

    fn control(&mut self, frame: Control) -> Result<(), SessionError> {
        match self.session.handle(frame)? {
            Some(Request::Hello(hello)) => {
                assert_eq!(hello.epoch, EPOCH);
                let committed = self
                    .sink
                    .iter()
                    .map(|(lane, seqs)| LaneSeq { lane: Lane(*lane), seq: Seq(seqs.last().copied().unwrap_or(0)) })
                    .collect();
                let mut known = Vec::new();
                for id in hello.dicts {
                    if let Some(bytes) = self.dicts.get(&id) {
                        self.session.add_dict(id.clone(), bytes.clone());
                        known.push(id);
                    }
                }
                self.session.welcome(committed, known);
            }
            Some(Request::StoreDict(d)) => {
                self.dicts.insert(d.id.clone(), d.bytes);
                self.session.dict_stored(d.id);
            }
            Some(Request::Classes(r)) => self.reports.push(r),
            Some(Request::DownAcked(a)) => panic!("no downlink at this build's versions: {a:?}"),
            None => {}
        }
        Ok(())
    }

    /// Delivers a batch; the sink commits what is released at once.
    fn batch(&mut self, b: Batch) {
        for release in self.session.handle_batch(b).unwrap() {
            let seqs = self.sink.entry(release.batch.lane.0).or_default();
            for seq in release.batch.first_seq.0..=release.batch.last_seq.0 {
                if seq > release.skip_through {
                    seqs.push(seq);
                }
            }
            self.session.committed(release.batch.lane.0, release.batch.last_seq.0);
        }
    }
}

/// Moves control frames both ways until neither side has any; returns the edge's events.
fn pump(edge: &mut EdgeSession, cloud: &mut Cloud, now: Instant) -> Vec<EdgeEvent> {
    let mut events = Vec::new();
    loop {
        let mut moved = false;
        while let Some(f) = edge.poll_control() {
            cloud.control(f).unwrap();
            moved = true;
        }
        while let Some(f) = cloud.session.poll_control() {
            events.extend(edge.handle(f, now).unwrap());
            moved = true;
        }
        if !moved {
            return events;
        }
    }
}

#[test]
fn handshake_batches_and_cumulative_acks() {
    let t0 = Instant::now();
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(0, 0)]);
    let mut cloud = Cloud::connect(BTreeMap::new());
    edge.connected(t0);
    assert!(!edge.can_send(), "nothing before the welcome");
    let events = pump(&mut edge, &mut cloud, t0);
    assert_eq!(events, [EdgeEvent::Ready { version: DOWN_WINDOW_VERSION, dicts: vec![], sink: None }]);
    assert_eq!(edge.next_seq(0), 1);
    edge.sent(0, 1, 10, t0).unwrap();
    edge.sent(0, 11, 20, t0).unwrap();
    assert_eq!(edge.in_flight(), 2);
    cloud.batch(batch(0, 1, 10));
    cloud.batch(batch(0, 11, 20));
    let events = pump(&mut edge, &mut cloud, t0);
    let committed = EdgeEvent::Committed { lane: 0, latency: Duration::ZERO };
    assert_eq!(
        events,
        [
            EdgeEvent::Acked { lane: 0, up_to: 10 },
            committed.clone(),
            EdgeEvent::Acked { lane: 0, up_to: 20 },
            committed
        ]
    );
    assert_eq!(edge.in_flight(), 0);
    assert_eq!(cloud.sink[&0], (1..=20).collect::<Vec<u64>>());
}

#[test]
fn a_reconnect_resends_only_what_the_cloud_does_not_have() {
    let t0 = Instant::now();
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(2, 0)]);
    let mut cloud = Cloud::connect(BTreeMap::new());
    edge.connected(t0);
    pump(&mut edge, &mut cloud, t0);
    edge.sent(2, 1, 5, t0).unwrap();
    edge.sent(2, 6, 9, t0).unwrap();
    cloud.batch(batch(2, 1, 5));
    // The link dies before the ack of 1..=5 reaches the edge and before 6..=9 arrives.
    edge.disconnected();
    let sink = cloud.sink;
    // Another bridge instance, same sink.
    let mut cloud = Cloud::connect(sink);
    edge.connected(t0);
    let events = pump(&mut edge, &mut cloud, t0);
    assert_eq!(
        events,
        [
            EdgeEvent::Mark { lane: 2, committed: 5 },
            EdgeEvent::Acked { lane: 2, up_to: 5 },
            EdgeEvent::Ready { version: DOWN_WINDOW_VERSION, dicts: vec![], sink: None }
        ]
    );
    assert_eq!(edge.next_seq(2), 6, "resume after what the cloud committed");
    edge.sent(2, 6, 9, t0).unwrap();
    cloud.batch(batch(2, 6, 9));
    pump(&mut edge, &mut cloud, t0);
    assert_eq!(cloud.sink[&2], (1..=9).collect::<Vec<u64>>());
    assert_eq!(edge.acked(2), 9);
}

#[test]
fn batches_overtaking_each_other_are_held_and_released_in_order() {
    let mut cloud = Cloud::connect(BTreeMap::new());
    cloud
        .control(Control::Hello(super::Hello {
            versions: vec![1],
            epoch: EPOCH.into(),
            lanes: vec![],
            models: vec![],
            dicts: vec![],
            caps: vec![],
            down_mark: 0,
            down_window: None,
        }))
        .unwrap();
    cloud.batch(batch(1, 11, 20));
    cloud.batch(batch(1, 21, 30));
    assert!(!cloud.sink.contains_key(&1), "held until 1..=10 arrives");
    cloud.batch(batch(1, 1, 10));
    assert_eq!(cloud.sink[&1], (1..=30).collect::<Vec<u64>>());
    // A resend overlapping what was committed adds only the new part.
    cloud.batch(batch(1, 25, 35));
    assert_eq!(cloud.sink[&1], (1..=35).collect::<Vec<u64>>());
}

#[test]
fn versions_are_negotiated_and_a_mismatch_is_refused_clearly() {
    let t0 = Instant::now();
    // An edge of the next version against a bridge of this one: they meet at this build's
    // newest, and the edge's batches go in that version's framing.
    let newest = *crate::proto::VERSIONS.last().unwrap();
    let next: Vec<u16> = crate::proto::VERSIONS.iter().copied().chain([newest + 1]).collect();
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, []).with_versions(next);
    let mut cloud = Cloud::connect(BTreeMap::new());
    edge.connected(t0);
    assert_eq!(edge.version(), 0, "no version before the welcome");
    assert_eq!(pump(&mut edge, &mut cloud, t0), [EdgeEvent::Ready { version: newest, dicts: vec![], sink: None }]);
    assert_eq!(edge.version(), newest);

    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, []).with_versions(vec![newest + 1]);
    let mut cloud = Cloud::connect(BTreeMap::new());
    edge.connected(t0);
    let err = cloud.control(edge.poll_control().unwrap()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("no common protocol version: this side speaks {:?}, the peer [{}]", crate::proto::VERSIONS, newest + 1)
    );
    assert_eq!(cloud.session.phase(), CloudPhase::Refused);
    let refused = cloud.session.poll_control().unwrap();
    let err = edge.handle(refused, t0).unwrap_err();
    assert!(err.to_string().contains("the cloud refused this edge: no common protocol version"), "{err}");
    assert_eq!(edge.phase(), Phase::Refused);
}

/// A bridge that stops answering: once the session is degraded, its next deadline is the next
/// ping, never one already past, so a driver sleeping until it does not spin.
#[test]
fn a_degraded_session_never_asks_to_be_woken_in_the_past() {
    let t0 = Instant::now();
    let config = EdgeSessionConfig {
        window: 4,
        keepalive: Duration::from_secs(5),
        ack_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let mut edge = EdgeSession::new(config, EPOCH, [(0, 0)]);
    let mut cloud = Cloud::connect(BTreeMap::new());
    edge.connected(t0);
    pump(&mut edge, &mut cloud, t0);
    edge.sent(0, 1, 10, t0).unwrap();
    // Nothing comes back from here on; the driver wakes whenever it is asked to.
    let mut now = t0;
    let mut wakes = 0;
    let mut nonce = 0;
    while now < t0 + Duration::from_secs(60) {
        let next = edge.poll_timeout().expect("a ping is always due");
        assert!(next > now, "asked to wake at {:?} after t0, at {:?}", next - t0, now - t0);
        now = next;
        edge.handle_timeout(now);
        while let Some(frame) = edge.poll_control() {
            if let Control::Ping { nonce: n } = frame {
                nonce = n;
            }
        }
        wakes += 1;
    }
    assert!(edge.is_degraded());
    assert!(wakes <= 14, "{wakes} wake-ups in a minute: once per ping and for the ack timeout");
    // The ack and the pong end the state; the deadline of a batch sent then counts again.
    edge.handle(Control::Ack(super::Ack { lane: Lane(0), up_to: Seq(10) }), now).unwrap();
    edge.handle(Control::Pong { nonce }, now).unwrap();
    assert!(!edge.is_degraded());
    edge.sent(0, 11, 12, now).unwrap();
    assert_eq!(edge.poll_timeout(), Some(now + Duration::from_secs(2)));
}

#[test]
fn keepalive_rtt_and_degraded_on_a_virtual_clock() {
    let t0 = Instant::now();
    let config = EdgeSessionConfig {
        window: 2,
        keepalive: Duration::from_secs(5),
        ack_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let mut edge = EdgeSession::new(config, EPOCH, [(0, 0)]);
    let mut cloud = Cloud::connect(BTreeMap::new());
    edge.connected(t0);
    pump(&mut edge, &mut cloud, t0);
    assert_eq!(edge.poll_timeout(), Some(t0 + Duration::from_secs(5)));
    let t5 = t0 + Duration::from_secs(5);
    // The spool's head goes out with each ping, for the cloud's lag figure, and what the spool
    // says of itself with it, for the fleet view.
    edge.set_head(0, 42);
    let report = super::SpoolReport { oldest_unacked_ms: 1_500, dropped: 7, gaps: 2 };
    edge.set_spool_report(report);
    assert!(edge.handle_timeout(t5).is_empty());
    let ping = edge.poll_control().unwrap();
    assert!(matches!(ping, Control::Ping { .. }));
    let heads = edge.poll_control().unwrap();
    assert_eq!(heads, Control::Heads { lanes: vec![LaneSeq { lane: Lane(0), seq: Seq(42) }], spool: Some(report) });
    let before = cloud.session.changes();
    cloud.control(heads.clone()).unwrap();
    assert_eq!(cloud.session.lags(), [(0, 42)], "the cloud has committed nothing of lane 0 yet");
    assert_eq!(cloud.session.lane_positions(), [(0, 0, Some(42))]);
    assert_eq!(cloud.session.spool_report(), Some(report));
    assert!(cloud.session.changes() > before, "the fleet view has news");
    let unchanged = cloud.session.changes();
    cloud.control(heads).unwrap();
    assert_eq!(cloud.session.changes(), unchanged, "the same heads again are no news");
    cloud.control(ping).unwrap();
    let pong = cloud.session.poll_control().unwrap();
    assert_eq!(edge.handle(pong, t5 + Duration::from_millis(40)).unwrap(), [EdgeEvent::Rtt(Duration::from_millis(40))]);

    // Batches go out, the window fills, no ack comes: degraded after ack_timeout, not before.
    edge.sent(0, 1, 10, t5).unwrap();
    edge.sent(0, 11, 20, t5).unwrap();
    assert!(!edge.can_send(), "window of 2 is full");
    assert!(edge.handle_timeout(t5 + Duration::from_secs(9)).is_empty());
    assert_eq!(edge.handle_timeout(t5 + Duration::from_secs(10)), [EdgeEvent::Degraded(true)]);
    let ack = Control::Ack(super::Ack { lane: Lane(0), up_to: Seq(20) });
    let events = edge.handle(ack, t5 + Duration::from_secs(11)).unwrap();
    let latency = Duration::from_secs(11);
    assert_eq!(
        events,
        [
            EdgeEvent::Acked { lane: 0, up_to: 20 },
            EdgeEvent::Committed { lane: 0, latency },
            EdgeEvent::Committed { lane: 0, latency },
            EdgeEvent::Degraded(false)
        ]
    );
    assert!(edge.can_send());
}

#[test]
fn protocol_violations_name_the_problem() {
    let t0 = Instant::now();
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(0, 0)]);
    let mut cloud = Cloud::connect(BTreeMap::new());
    edge.connected(t0);
    pump(&mut edge, &mut cloud, t0);
    edge.sent(0, 1, 3, t0).unwrap();
    let err = edge.handle(Control::Ack(super::Ack { lane: Lane(0), up_to: Seq(9) }), t0).unwrap_err();
    assert_eq!(err.to_string(), "protocol violation: ack of lane 0 up to 9 but only 3 was sent");
    assert!(edge.sent(0, 2, 5, t0).unwrap_err().to_string().contains("does not follow 3"));
    let mut wrong = batch(0, 1, 1);
    wrong.epoch = "other".into();
    let err = cloud.session.handle_batch(wrong).unwrap_err();
    assert!(err.to_string().contains("batch of epoch other on a session of epoch"), "{err}");
    let mut fresh = CloudSession::new(4);
    let err = fresh.handle_batch(batch(0, 1, 1)).unwrap_err();
    assert!(err.to_string().contains("batch in phase AwaitHello"), "{err}");
}

/// A sink that lost its marks (restored from an older backup, a new file) answers a hello with
/// less than the edge acked: the lane resumes at the edge's first record instead of holding
/// every batch for a seq the edge deleted long ago.
#[test]
fn a_sink_that_lost_its_marks_resumes_where_the_edge_records_start() {
    let t0 = Instant::now();
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(0, 500), (1, 7)]);
    let mut cloud = Cloud::connect(BTreeMap::from([(1, vec![1, 2, 3, 4, 5, 6, 7, 8, 9])]));
    edge.connected(t0);
    pump(&mut edge, &mut cloud, t0);
    assert_eq!(edge.next_seq(0), 501);
    edge.sent(0, 501, 600, t0).unwrap();
    cloud.batch(batch(0, 501, 600));
    let events = pump(&mut edge, &mut cloud, t0);
    assert!(events.contains(&EdgeEvent::Acked { lane: 0, up_to: 600 }), "{events:?}");
    // A lane the sink holds more of than the edge thinks keeps the sink's mark.
    assert_eq!(edge.next_seq(1), 10);
    assert_eq!(cloud.session.committed_seq(1), 9);

    // A hello claiming a seq outside the range is refused.
    let mut fresh = CloudSession::new(4);
    let hello = Control::Hello(super::Hello {
        versions: vec![1],
        epoch: EPOCH.into(),
        lanes: vec![LaneSeq { lane: Lane(0), seq: Seq(0) }],
        models: vec![],
        dicts: vec![],
        caps: vec![],
        down_mark: 0,
        down_window: None,
    });
    assert!(fresh.handle(hello).unwrap_err().to_string().contains("holds seqs from 0"));
    // An epoch names sink keys: one that could make a key the sink refuses is refused here.
    let mut fresh = CloudSession::new(4);
    let hello = Control::Hello(super::Hello {
        versions: vec![1],
        epoch: "a*b.c".into(),
        lanes: vec![],
        models: vec![],
        dicts: vec![],
        caps: vec![],
        down_mark: 0,
        down_window: None,
    });
    assert!(fresh.handle(hello).unwrap_err().to_string().contains("unusable epoch"));
}

/// Seqs a peer sends are checked before any `+ 1` on them: a batch ending at `u64::MAX` (or
/// anywhere past [`super::MAX_SEQ`]) and a Welcome mark past it are protocol errors, not an
/// overflow.
#[test]
fn seqs_near_u64_max_are_refused_on_both_sides() {
    let t0 = Instant::now();
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(0, 0)]);
    let mut cloud = Cloud::connect(BTreeMap::new());
    edge.connected(t0);
    pump(&mut edge, &mut cloud, t0);
    for (first, last) in [(1, u64::MAX), (u64::MAX, u64::MAX), (super::MAX_SEQ + 1, super::MAX_SEQ + 1)] {
        let err = cloud.session.handle_batch(batch(0, first, last)).unwrap_err();
        assert!(err.to_string().contains(&format!("batch seqs {first}..={last}")), "{err}");
    }
    // The largest allowed seq is taken, and the next batch's `released + 1` does not overflow.
    assert!(cloud.session.handle_batch(batch(0, 1, super::MAX_SEQ)).is_ok());
    assert!(cloud.session.handle_batch(batch(0, 2, 3)).is_ok());

    for mark in [u64::MAX, super::MAX_SEQ + 1] {
        let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(0, 0)]);
        edge.connected(t0);
        let welcome = super::Welcome {
            version: 1,
            committed: vec![LaneSeq { lane: Lane(0), seq: Seq(mark) }],
            dicts: vec![],
            sink: None,
        };
        let err = edge.handle(Control::Welcome(welcome), t0).unwrap_err();
        assert!(err.to_string().contains("past the highest seq there is"), "{err}");
    }
}

/// A hello's downlink position is checked as lane seqs are: past [`super::MAX_SEQ`] it is a
/// protocol error, not a value the bridge records (one edge once claimed `i64::MAX`, and the
/// sink's shared counter took it: no message could be stored for any edge after it).
#[test]
fn a_hello_claiming_a_downlink_position_past_the_limit_is_refused() {
    let hello = |down_mark| {
        Control::Hello(super::Hello {
            versions: super::VERSIONS.to_vec(),
            epoch: EPOCH.into(),
            lanes: vec![],
            models: vec![],
            dicts: vec![],
            caps: vec![],
            down_mark,
            down_window: None,
        })
    };
    for claim in [i64::MAX as u64, u64::MAX, super::MAX_SEQ + 1] {
        let err = CloudSession::new(4).handle(hello(claim)).unwrap_err();
        assert!(err.to_string().contains("past the highest seq there is"), "{claim}: {err}");
    }
    assert!(CloudSession::new(4).handle(hello(super::MAX_SEQ)).is_ok());
}

#[derive(Debug, Clone)]
enum Step {
    /// The edge sends a batch of this many records from this lane, if it may.
    Send { lane: u8, records: u64 },
    /// The link delivers the in-transit batch at this index (wrapping), out of order.
    Deliver(usize),
    /// The link drops and comes back; what is in transit is lost.
    Reconnect,
    /// The edge appends records (they become sendable).
    Append { lane: u8, records: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..3u8, 1..6u64).prop_map(|(lane, records)| Step::Send { lane, records }),
        4 => (0..8usize).prop_map(Step::Deliver),
        1 => Just(Step::Reconnect),
        3 => (0..3u8, 1..20u64).prop_map(|(lane, records)| Step::Append { lane, records }),
    ]
}

/// One step of the property test; asserts that every ack the edge applies is in the sink.
fn run(
    step: &Step,
    appended: &mut BTreeMap<u8, u64>,
    edge: &mut EdgeSession,
    cloud: &mut Cloud,
    transit: &mut Vec<Batch>,
) {
    let t0 = Instant::now();
    match *step {
        Step::Append { lane, records } => *appended.entry(lane).or_default() += records,
        Step::Send { lane, records } => {
            let first = edge.next_seq(lane);
            let last = (first + records - 1).min(appended.get(&lane).copied().unwrap_or(0));
            if edge.can_send() && last >= first {
                edge.sent(lane, first, last, t0).unwrap();
                transit.push(batch(lane, first, last));
            }
        }
        Step::Deliver(i) if !transit.is_empty() => {
            let b = transit.remove(i % transit.len());
            cloud.batch(b);
        }
        Step::Deliver(_) => {}
        Step::Reconnect => {
            transit.clear();
            edge.disconnected();
            *cloud = Cloud::connect(std::mem::take(&mut cloud.sink));
            edge.connected(t0);
        }
    }
    for event in pump(edge, cloud, t0) {
        if let EdgeEvent::Acked { lane, up_to } = event {
            let have = cloud.sink.get(&lane).and_then(|s| s.last()).copied().unwrap_or(0);
            assert!(up_to <= have, "edge deletes {up_to} of lane {lane}, sink has {have}");
        }
    }
}

proptest! {
    /// Whatever the link does, the sink holds each appended seq at most once and in order,
    /// the edge deletes only what the sink has, and once the link behaves everything arrives.
    /// Lanes start at seq 0 or just below [`super::MAX_SEQ`] (the cloud's mark already there),
    /// so every `+ 1` on a peer's seq is also run near the top.
    #[test]
    fn exactly_once_over_a_misbehaving_link(
        steps in proptest::collection::vec(step(), 1..200),
        base in prop_oneof![Just(0u64), Just(super::MAX_SEQ - 5_000)],
    ) {
        let t0 = Instant::now();
        let mut appended: BTreeMap<u8, u64> = (0..3u8).map(|l| (l, base)).collect();
        let acked: Vec<(u8, u64)> = if base == 0 { vec![] } else { (0..3u8).map(|l| (l, base)).collect() };
        let mut edge = EdgeSession::new(EdgeSessionConfig { window: 4, ..Default::default() }, EPOCH, acked.clone());
        let mut cloud = Cloud::connect(acked.iter().map(|(l, s)| (*l, vec![*s])).collect());
        let mut transit: Vec<Batch> = Vec::new();
        edge.connected(t0);
        pump(&mut edge, &mut cloud, t0);
        for s in &steps {
            run(s, &mut appended, &mut edge, &mut cloud, &mut transit);
        }
        // Then a good link: deliver everything in order until all is acked.
        for _ in 0..1000 {
            if appended.iter().all(|(l, n)| edge.acked(*l) == *n) {
                break;
            }
            for lane in 0..3u8 {
                run(&Step::Send { lane, records: 5 }, &mut appended, &mut edge, &mut cloud, &mut transit);
            }
            while !transit.is_empty() {
                run(&Step::Deliver(0), &mut appended, &mut edge, &mut cloud, &mut transit);
            }
        }
        for (lane, n) in &appended {
            let want: Vec<u64> = if base == 0 { (1..=*n).collect() } else { (base..=*n).collect() };
            prop_assert_eq!(cloud.sink.get(lane).cloned().unwrap_or_default(), want);
            prop_assert_eq!(edge.acked(*lane), *n);
        }
    }
}

#[test]
fn dictionaries_are_confirmed_once_stored_and_known_to_the_next_bridge() {
    let t0 = Instant::now();
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(0, 0)]);
    let mut cloud = Cloud::connect(BTreeMap::new());
    edge.connected(t0);
    pump(&mut edge, &mut cloud, t0);
    let bytes = b"a dictionary's bytes".to_vec();
    let id = super::compress::dict_id(&bytes);
    edge.announce_dict(DictAnnounce { id: id.clone(), class: "telemetry".into(), bytes: bytes.clone() });
    assert_eq!(pump(&mut edge, &mut cloud, t0), [EdgeEvent::DictStored(id.clone())]);
    assert_eq!(cloud.session.dicts().get(&id), Some(&bytes));

    // Another bridge: the edge names the dictionary in its hello, the welcome says it is held,
    // and the new session can decode with it without a second announcement.
    edge.disconnected();
    let mut cloud = cloud.reconnect();
    edge.set_dicts(vec![id.clone(), "0000000000000000".into()]);
    edge.connected(t0);
    assert_eq!(
        pump(&mut edge, &mut cloud, t0),
        [EdgeEvent::Ready { version: DOWN_WINDOW_VERSION, dicts: vec![id.clone()], sink: None }]
    );
    assert_eq!(cloud.session.dicts().get(&id), Some(&bytes));
}

#[test]
fn a_dictionary_that_does_not_hash_to_its_id_or_is_too_large_is_refused() {
    let t0 = Instant::now();
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(0, 0)]);
    let mut cloud = Cloud::connect(BTreeMap::new());
    edge.connected(t0);
    pump(&mut edge, &mut cloud, t0);
    let forged = DictAnnounce { id: "0123456789abcdef".into(), class: "c".into(), bytes: b"other".to_vec() };
    let err = cloud.control(Control::Dict(forged)).unwrap_err();
    assert!(err.to_string().contains("does not hash to its id"), "{err}");
    let big = vec![7u8; super::MAX_DICT_BYTES + 1];
    let huge = DictAnnounce { id: super::compress::dict_id(&big), class: "c".into(), bytes: big };
    let err = cloud.control(Control::Dict(huge)).unwrap_err();
    assert!(err.to_string().contains("more than"), "{err}");
    assert!(cloud.dicts.is_empty(), "nothing refused was stored");
}

#[test]
fn classes_reports_reach_the_bridge_only_when_connected_and_bounded() {
    use crate::tco::{Architecture, ClassInput, Link, Prices, evaluate};
    let prices = Prices {
        currency: "EUR".into(),
        months: 36.0,
        uplink_per_gb: 1.0,
        central_ingest_per_gb: 0.0,
        central_storage_per_gb_month: 0.0,
        retention_months: 0.0,
        edge_per_gb: 0.0,
        fte_month: 1.0,
        edge_direct: Architecture { hardware: 36.0, uplink_gb_month: 0.0, fte: 0.0 },
        central: Architecture { hardware: 0.0, uplink_gb_month: 0.0, fte: 0.0 },
    };
    let input = ClassInput {
        name: "counters".into(),
        msg_per_s: 1.0,
        bytes_per_msg: 100.0,
        compression: 1.0,
        sla_ms: None,
        governance: Default::default(),
        pinned: None,
    };
    let decision = evaluate(&prices, &Link { rtt_ms: 1.0, commit_ms: 1.0 }, &[input])[0].clone();
    let report = |n: usize| super::ClassesReport {
        currency: "EUR".into(),
        classes: vec![super::ClassReport { decision: decision.clone(), route: None, switches: 0 }; n],
    };
    let t0 = Instant::now();
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(0, 0)]);
    let mut cloud = Cloud::connect(BTreeMap::new());
    edge.report_classes(report(1));
    assert_eq!(edge.poll_control(), None, "not connected: nothing queued");
    edge.connected(t0);
    pump(&mut edge, &mut cloud, t0);
    edge.report_classes(report(1));
    pump(&mut edge, &mut cloud, t0);
    assert_eq!(cloud.reports, vec![report(1)]);
    // Through the codec, as bytes, and back.
    let frame = Control::Classes(report(2));
    let bytes = super::codec::encode(&frame).unwrap();
    assert_eq!(super::codec::decode_frame::<Control>(&bytes, super::MAX_CONTROL_FRAME).unwrap(), frame);
    let err = cloud.control(Control::Classes(report(super::MAX_REPORT_CLASSES + 1))).unwrap_err();
    assert!(err.to_string().contains("more than 256"), "{err}");
    // A hostile edge's report that would break the fleet's sums is refused by name: a route
    // named and not priced, a figure that is not a number, a name past the bound.
    let mut unpriced = report(1);
    unpriced.classes[0].decision.costs.clear();
    let mut nan = report(1);
    nan.classes[0].decision.msg_per_s = f64::NAN;
    let mut long = report(1);
    long.classes[0].decision.class = "x".repeat(super::MAX_REPORT_CLASS_NAME + 1);
    for (bad, why) in [(unpriced, "named but not priced"), (nan, "not a number"), (long, "a class name of 257 bytes")] {
        let mut cloud = Cloud::connect(BTreeMap::new());
        let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(0, 0)]);
        edge.connected(t0);
        pump(&mut edge, &mut cloud, t0);
        let err = cloud.control(Control::Classes(bad)).unwrap_err();
        assert!(err.to_string().contains(why), "{why}: {err}");
    }
}

#[test]
fn model_announcements_follow_the_welcome_and_hellos_follow_a_bounded_list() {
    let t0 = Instant::now();
    let announce = super::ModelAnnounce { name: "yolo".into(), version: "2".into(), manifest: vec![1, 2, 3] };
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(0, 0)]).with_models(vec!["yolo".into()]);
    let mut cloud = Cloud::connect(BTreeMap::new());
    assert!(!cloud.session.announce_model(announce.clone()), "nothing before the welcome");
    // An announcement before the welcome is a protocol violation on the edge too.
    edge.connected(t0);
    let err = edge.handle(Control::Model(announce.clone()), t0).unwrap_err();
    assert!(err.to_string().contains("unexpected model"), "{err}");
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, [(0, 0)]).with_models(vec!["yolo".into()]);
    edge.connected(t0);
    pump(&mut edge, &mut cloud, t0);
    assert!(cloud.session.announce_model(announce.clone()));
    assert_eq!(pump(&mut edge, &mut cloud, t0), vec![EdgeEvent::Model(announce.clone())]);
    // The frame and the fetch frames survive the codec.
    let frame = Control::Model(announce);
    let bytes = super::codec::encode(&frame).unwrap();
    assert_eq!(super::codec::decode_frame::<Control>(&bytes, super::MAX_CONTROL_FRAME).unwrap(), frame);
    let fetch = super::Fetch::Chunk { hash: "ab".repeat(32) };
    let bytes = super::codec::encode(&fetch).unwrap();
    assert_eq!(super::codec::decode_frame::<super::Fetch>(&bytes, super::MAX_FETCH_FRAME).unwrap(), fetch);
    let reply = super::ChunkReply { hash: "ab".repeat(32), bytes: Some(vec![7; 1000]), error: None };
    let bytes = super::codec::encode(&reply).unwrap();
    assert_eq!(super::codec::decode_frame::<super::ChunkReply>(&bytes, super::MAX_CHUNK_FRAME).unwrap(), reply);
    // A request kind this build does not know decodes as such, to be refused.
    let unknown = super::codec::encode(&BTreeMap::from([("type", "teleport")])).unwrap();
    assert_eq!(
        super::codec::decode_frame::<super::Fetch>(&unknown, super::MAX_FETCH_FRAME).unwrap(),
        super::Fetch::Unknown
    );

    let mut cloud = Cloud::connect(BTreeMap::new());
    let hello = super::Hello {
        versions: vec![1],
        epoch: EPOCH.into(),
        lanes: vec![],
        models: (0..=super::MAX_MODELS).map(|i| format!("m{i}")).collect(),
        dicts: vec![],
        caps: vec![],
        down_mark: 0,
        down_window: None,
    };
    let err = cloud.control(Control::Hello(hello)).unwrap_err();
    assert!(err.to_string().contains("more than 64"), "{err}");
}

/// Version 3: the bridge's Welcome says what its sink stores of one record, and the edge hears
/// it with Ready; a version 2 session (an older edge or bridge) gets no such field.
#[test]
fn a_version_3_welcome_carries_the_sinks_limits_and_a_version_2_one_does_not() {
    let t0 = Instant::now();
    let limits = super::SinkLimits { record_bytes: 1 << 20, header_bytes: 64 << 10 };
    for (versions, sink) in [(vec![1, 2, 3], Some(limits)), (vec![1, 2], None)] {
        let mut edge = EdgeSession::new(EdgeSessionConfig::default(), EPOCH, []).with_versions(versions.clone());
        let mut cloud = Cloud::connect(BTreeMap::new());
        cloud.session.set_sink_limits(Some(limits));
        edge.connected(t0);
        let version = *versions.last().unwrap();
        assert_eq!(pump(&mut edge, &mut cloud, t0), [EdgeEvent::Ready { version, dicts: vec![], sink }]);
    }
}

/// What a sink stores of a record is counted from above: headers as the bridge writes them,
/// each user property as if renamed, correlation data in base64.
#[test]
fn record_size_counts_headers_from_above() {
    let user = vec![("trace".to_owned(), "abc".to_owned()), (String::new(), String::new())];
    let (headers, total) = super::record_size("t/x", 100, &user, Some(5), Some("json"));
    let want = ("Mqtt-Topic".len() + 3 + 4)
        + ("Mqtt-Prop-".len() + 8 + 4)
        + ("Mqtt-Prop-".len() + 4)
        + ("Mqtt-Correlation-Data".len() + 8 + 4)
        + ("Mqtt-Content-Type".len() + 4 + 4);
    assert_eq!((headers, total), (want as u64, want as u64 + 100));
}
