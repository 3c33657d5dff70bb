//! The bridge session's policy on a virtual clock: no sink, no connection; what the core asks
//! to publish and mark, and what the edge is told, for batches in and publishes done.

use std::rc::Rc;
use std::time::{Duration, Instant};

use shared::proto::cloud::CloudSession;
use shared::proto::{Ack, Batch, Codec, Control, GapReason, Hello, LaneSeq, WireGap, WireRecord};

use super::{CoreError, Publish, SessionCore};
use shared::proto::{Lane, Seq};

const EPOCH: &str = "e1";
const STALL: Duration = Duration::from_secs(30);

fn batch(lane: u8, first: u64, last: u64) -> (Batch, Vec<WireRecord>) {
    let b = Batch {
        epoch: EPOCH.into(),
        lane: Lane(lane),
        first_seq: Seq(first),
        last_seq: Seq(last),
        codec: Codec::Cbor,
        dict: None,
        raw_len: 0,
        body: vec![],
    };
    let gap = |seq| WireGap { class: "c".into(), reason: GapReason::Evicted, ranges: vec![(seq, seq)], count: 1 };
    (b, (first..=last).map(|seq| WireRecord::gap(Seq(seq), gap(seq))).collect())
}

/// A core past its hello, with `committed` in the sink, publishing `pipeline` at once. What a
/// batch holds is an `Rc`: its count says whether the core still keeps it.
fn ready(pipeline: usize, committed: &[(u8, u64)]) -> SessionCore<Rc<()>> {
    let mut session = CloudSession::new(4);
    let hello = Hello {
        versions: shared::proto::VERSIONS.to_vec(),
        epoch: EPOCH.into(),
        lanes: vec![],
        models: vec![],
        dicts: vec![],
        caps: vec![],
        down_mark: 0,
        down_window: None,
    };
    session.handle(Control::Hello(hello)).unwrap();
    session.welcome(committed.iter().map(|&(lane, seq)| LaneSeq { lane: Lane(lane), seq: Seq(seq) }).collect(), vec![]);
    let mut core = SessionCore::new(session, pipeline, STALL);
    while core.poll_control().is_some() {}
    core
}

fn take(core: &mut SessionCore<Rc<()>>, lane: u8, first: u64, last: u64, now: Instant) -> Rc<()> {
    let (b, records) = batch(lane, first, last);
    let held = Rc::new(());
    core.handle_batch(b, records, held.clone(), now).unwrap();
    held
}

/// The batches the core lets stage now.
fn stages(core: &mut SessionCore<Rc<()>>) -> Vec<Publish<Rc<()>>> {
    std::iter::from_fn(|| core.poll_stage()).collect()
}

/// `started` staged, then published in the order the core asks, each at once.
fn publish(core: &mut SessionCore<Rc<()>>, started: &[Publish<Rc<()>>]) {
    for p in started {
        core.handle_staged(p.id);
    }
    while let Some((id, _)) = core.poll_publish() {
        core.handle_published(id);
    }
}

fn seqs(p: &Publish<Rc<()>>) -> Vec<u64> {
    p.records.iter().map(|r| r.seq.0).collect()
}

fn acks(core: &mut SessionCore<Rc<()>>) -> Vec<(u8, u64)> {
    std::iter::from_fn(|| core.poll_control())
        .filter_map(|c| match c {
            Control::Ack(Ack { lane, up_to }) => Some((lane.0, up_to.0)),
            _ => None,
        })
        .collect()
}

/// Batches in order stage in order, `pipeline` at once; one more is read ahead and the next
/// waits for a slot; a slot that frees when a batch is in the sink starts the next.
#[test]
fn batches_stage_in_order_up_to_the_pipeline_with_one_read_ahead() {
    let now = Instant::now();
    let mut core = ready(2, &[]);
    assert!(core.wants_batch());
    for (first, last) in [(1, 10), (11, 20), (21, 30)] {
        take(&mut core, 0, first, last, now);
    }
    let started = stages(&mut core);
    assert_eq!(started.iter().map(|p| p.id).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(seqs(&started[1]), (11..=20).collect::<Vec<_>>());
    assert!(!core.wants_batch(), "two under way and one waiting: no more read ahead");
    core.handle_staged(0);
    assert!(stages(&mut core).is_empty(), "staged is still under way");
    assert_eq!(core.poll_publish(), Some((0, None)));
    core.handle_published(0);
    assert_eq!(stages(&mut core).iter().map(|p| p.id).collect::<Vec<_>>(), [2]);
    assert!(core.wants_batch());
}

/// Batches publish one at a time, in release order, each once it is staged and the one before
/// it is in the sink, whatever order their stagings end in: so a publish that fails ends the
/// session with nothing after it visible. None names a batch before it (`after`): none is
/// publishing.
#[test]
fn batches_publish_one_at_a_time_in_order_once_staged() {
    let now = Instant::now();
    let mut core = ready(3, &[]);
    for (first, last) in [(1, 10), (11, 20), (21, 30)] {
        take(&mut core, 0, first, last, now);
    }
    let started = stages(&mut core);
    assert_eq!(started.len(), 3);
    core.handle_staged(2);
    core.handle_staged(1);
    assert_eq!(core.poll_publish(), None, "the first is not staged yet");
    core.handle_staged(0);
    assert_eq!(core.poll_publish(), Some((0, None)));
    assert_eq!(core.poll_publish(), None, "one publish at a time");
    core.handle_published(1);
    assert_eq!(core.poll_publish(), None, "a publish the core did not ask for changes nothing");
    core.handle_published(0);
    assert_eq!(core.poll_publish(), Some((1, None)));
    core.handle_published(1);
    assert_eq!(core.poll_publish(), Some((2, None)));
    core.handle_published(2);
    assert_eq!(core.take_published(), 30);
}

/// A sink that keeps a lane's order itself (`publish_ahead` 3) is given up to three at once,
/// in release order, each with the last record of the latest batch before it in its lane still
/// publishing: lane 0's second batch names 10, lane 1's first nothing, lane 0's third 20 (not
/// 10: the latest). A batch ends where it likes; the mark moves only over the prefix in the
/// sink, so the edge's ack never covers a batch still publishing.
#[test]
fn a_sink_keeping_the_order_gets_batches_ahead_each_naming_the_record_before_it() {
    let now = Instant::now();
    let mut core = ready(4, &[]).with_publish_ahead(3);
    take(&mut core, 0, 1, 10, now);
    take(&mut core, 0, 11, 20, now);
    take(&mut core, 1, 1, 5, now);
    take(&mut core, 0, 21, 30, now);
    let started = stages(&mut core);
    assert_eq!(started.iter().map(|p| (p.id, p.lane)).collect::<Vec<_>>(), [(0, 0), (1, 0), (2, 1), (3, 0)]);
    core.handle_staged(1);
    assert_eq!(core.poll_publish(), None, "in release order: the first is not staged");
    for id in [0, 2, 3] {
        core.handle_staged(id);
    }
    assert_eq!(core.poll_publish(), Some((0, None)));
    assert_eq!(core.poll_publish(), Some((1, Some(10))));
    assert_eq!(core.poll_publish(), Some((2, None)), "another lane: nothing before it");
    assert_eq!(core.poll_publish(), None, "three publishing at once, at most");
    core.handle_published(1);
    assert_eq!(core.poll_marks(), None, "the second is in, the first is not: no mark");
    assert_eq!(core.poll_publish(), Some((3, Some(10))), "the second is in: the first is the latest publishing");
    core.handle_published(0);
    assert_eq!(core.poll_marks(), Some(vec![(0, 20)]), "the prefix in the sink");
    core.handle_published(3);
    core.handle_published(2);
    assert_eq!(core.take_published(), 35);
}

/// A lane's mark moves over batches in the sink only, one mark for all that are in when the
/// marks are asked for; the edge's ack follows the mark, not the publish.
#[test]
fn marks_follow_published_batches_and_acks_follow_marks() {
    let now = Instant::now();
    let mut core = ready(2, &[]);
    take(&mut core, 0, 1, 10, now);
    take(&mut core, 0, 11, 20, now);
    let started = stages(&mut core);
    core.handle_staged(started[0].id);
    assert_eq!(core.poll_publish(), Some((0, None)));
    assert_eq!(core.poll_marks(), None, "nothing is in the sink yet");
    core.handle_published(0);
    core.handle_staged(started[1].id);
    assert_eq!(core.poll_publish(), Some((1, None)));
    core.handle_published(1);
    assert_eq!(core.take_published(), 20);
    let marks = core.poll_marks().expect("both are in the sink");
    assert_eq!(marks, [(0, 20)]);
    assert!(acks(&mut core).is_empty(), "no ack before the mark is written");
    core.handle_marked(&marks);
    assert_eq!(acks(&mut core), [(0, 20)]);
}

/// Marks are written one round at a time: what finishes while a round is written waits for
/// the next, which covers every lane at once.
#[test]
fn one_round_of_marks_at_a_time_one_mark_per_lane() {
    let now = Instant::now();
    let mut core = ready(3, &[]);
    take(&mut core, 0, 1, 5, now);
    let first = stages(&mut core);
    publish(&mut core, &first);
    let round = core.poll_marks().unwrap();
    take(&mut core, 1, 1, 3, now);
    take(&mut core, 0, 6, 9, now);
    let started = stages(&mut core);
    publish(&mut core, &started);
    assert_eq!(core.poll_marks(), None, "a round is being written");
    core.handle_marked(&round);
    assert_eq!(core.poll_marks().unwrap(), [(0, 9), (1, 3)]);
}

/// A batch ahead of a missing one is held (not published); the missing one releases both, in
/// seq order. Held past `stall`, the session ends; released in time, no deadline is left.
#[test]
fn a_batch_ahead_of_a_missing_one_waits_for_it_until_the_stall_deadline() {
    let t0 = Instant::now();
    let mut core = ready(4, &[]);
    take(&mut core, 0, 11, 20, t0);
    assert!(stages(&mut core).is_empty());
    assert_eq!(core.held(), 1);
    assert_eq!(core.poll_timeout(), Some(t0 + STALL));
    // A later batch held does not push the deadline back.
    take(&mut core, 0, 21, 30, t0 + Duration::from_secs(10));
    assert_eq!(core.poll_timeout(), Some(t0 + STALL));
    assert!(core.handle_timeout(t0 + STALL - Duration::from_millis(1)).is_ok());

    let mut late = ready(4, &[]);
    take(&mut late, 0, 11, 20, t0);
    assert!(matches!(late.handle_timeout(t0 + STALL), Err(CoreError::Stalled(d)) if d == STALL));

    take(&mut core, 0, 1, 10, t0 + Duration::from_secs(20));
    let started = stages(&mut core);
    assert_eq!(
        started.iter().map(|p| (p.records[0].seq.0, p.records.last().unwrap().seq.0)).collect::<Vec<_>>(),
        [(1, 10), (11, 20), (21, 30)]
    );
    assert_eq!((core.held(), core.poll_timeout()), (0, None));
    assert!(core.handle_timeout(t0 + STALL * 10).is_ok());
}

/// A resend of what the sink has is not published again: a batch overlapping what was
/// released publishes only the records above it, one wholly below gives its memory back at
/// once, and the edge is re-acked what is committed.
#[test]
fn a_resend_publishes_only_what_the_sink_has_not() {
    let now = Instant::now();
    let mut core = ready(4, &[(0, 10)]);
    let old = take(&mut core, 0, 5, 10, now);
    assert!(stages(&mut core).is_empty());
    assert_eq!(Rc::strong_count(&old), 1, "the core keeps nothing of a resend");
    assert_eq!(acks(&mut core), [(0, 10)]);
    take(&mut core, 0, 8, 15, now);
    let started = stages(&mut core);
    assert_eq!(seqs(&started[0]), (11..=15).collect::<Vec<_>>());
}

/// What a batch holds is given back when it publishes, not before: the core hands it over
/// with the publish, and a held batch replaced by a resend of it gives back the first copy.
#[test]
fn what_a_batch_holds_goes_with_its_publish_or_when_replaced() {
    let now = Instant::now();
    let mut core = ready(4, &[]);
    let first = take(&mut core, 0, 11, 20, now);
    assert_eq!(Rc::strong_count(&first), 2);
    let again = take(&mut core, 0, 11, 20, now);
    assert_eq!(Rc::strong_count(&first), 1, "replaced by the resend");
    assert_eq!(Rc::strong_count(&again), 2);
    take(&mut core, 0, 1, 10, now);
    let started = stages(&mut core);
    assert_eq!(Rc::strong_count(&again), 2, "the publish holds it now");
    drop(started);
    assert_eq!(Rc::strong_count(&again), 1);
}

/// More batches ahead of a missing one than the session may hold end it with a protocol error
/// naming the lane and the seq it waits for.
#[test]
fn more_held_batches_than_the_bound_end_the_session() {
    let now = Instant::now();
    let mut core = ready(4, &[]);
    for k in 1..=4u64 {
        take(&mut core, 0, k * 10 + 1, k * 10 + 10, now);
    }
    let (b, records) = batch(0, 51, 60);
    let e = core.handle_batch(b, records, Rc::new(()), now).unwrap_err();
    assert!(e.to_string().contains("lane 0 waits for seq 1"), "{e}");
}

/// A batch before the hello is a protocol error, not a publish.
#[test]
fn a_batch_before_the_welcome_is_refused() {
    let mut core: SessionCore<Rc<()>> = SessionCore::new(CloudSession::new(4), 1, STALL);
    let (b, records) = batch(0, 1, 1);
    assert!(matches!(core.handle_batch(b, records, Rc::new(()), Instant::now()), Err(CoreError::Session(_))));
    assert!(core.poll_stage().is_none());
}

/// The downlink's sink calls go on a lane of their own, and a failure pauses the downlink, not
/// the session: the edge's records publish and its acks come while the downlink's storage is
/// unavailable (one nats-server restart once ended four edges' sessions, telemetry and all,
/// and the downlink's reads ran inline on the session's loop). The failed call is made again
/// after a pause.
#[test]
fn a_downlink_that_fails_pauses_the_downlink_not_the_session() {
    use crate::downlink::core::{DownAnswer, DownCall, DownCore};
    use crate::server::core::Answer;
    use crate::sink::{EpochVerdict, SinkError};

    let now = Instant::now();
    let down = DownCore::unmetered("e", Duration::from_secs(5));
    let mut core = SessionCore::new(CloudSession::new(4), 1, STALL).with_edge("e", Some(down));
    let hello = Hello {
        versions: shared::proto::VERSIONS.to_vec(),
        epoch: EPOCH.into(),
        lanes: vec![],
        models: vec![],
        dicts: vec![],
        caps: vec![],
        down_mark: 0,
        down_window: None,
    };
    core.handle_control(Control::Hello(hello), now).unwrap();
    let answers = [
        Answer::Admitted(EpochVerdict::Known),
        Answer::Committed { lanes: vec![], limits: None },
        Answer::Dicts(vec![]),
    ];
    for answer in answers {
        assert!(core.poll_call().is_some());
        core.handle_answer(Ok(answer)).unwrap();
    }
    assert_eq!(core.poll_down_call(now), Some(DownCall::State));
    let unavailable = || SinkError::Unavailable { what: "downlink", reason: "timed out".into() };
    core.handle_down_answer(Err(unavailable()), now).unwrap();
    assert_eq!(core.poll_down_call(now), None, "paused");
    // Telemetry goes on meanwhile.
    take(&mut core, 0, 1, 5, now);
    let started = stages(&mut core);
    publish(&mut core, &started);
    let marks = core.poll_marks().unwrap();
    core.handle_marked(&marks);
    assert_eq!(acks(&mut core), [(0, 5)]);
    // And the downlink's call is made again after the pause.
    let later = core.poll_timeout().expect("the retry is a deadline");
    assert!(later > now);
    assert_eq!(core.poll_down_call(later), Some(DownCall::State));
    core.handle_down_answer(Ok(DownAnswer::State(Default::default())), later).unwrap();
    assert!(matches!(core.poll_down_call(later), Some(DownCall::Read { .. })));
}
