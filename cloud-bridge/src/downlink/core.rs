//! One edge's downlink on its session, without I/O or a clock: when to read the sink, what of
//! it to send, what to set aside, and what an ack records. [`CloudSession`] keeps the
//! protocol's rules (order, window, acks); this decides the sink calls around them
//! ([`DownCall`]), which the session's driver makes and answers, one at a time.
//!
//! - Started after the hello, at the sink's position or the edge's (its hello's `down_mark`),
//!   whichever is further; an edge further than the sink has its position recorded first (the
//!   bridge that sent those ended before it could).
//! - A read is due once what was read is sent (made ahead while the window is full), when the
//!   last read was full (a window's messages or bytes), news came ([`DownCore::woken`]),
//!   `downlink.poll` passed, or, on a sink whose reads stop short of the end
//!   ([`DownCore::with_short_reads`]), a record followed a short read.
//! - A message the sink could not make sense of (or too large to send) is set aside with its
//!   reason and sent empty, expiring at once, so the edge's position passes it.
//! - An ack's refusals and position are recorded in the sink before the session tells the edge
//!   they are ([`CloudSession::down_marked`]).
//! - A call the sink fails is made again after a pause (1 s, doubling to 30 s): the downlink
//!   waits, the session and its telemetry go on ([`DownCore::handle_error`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::proto::cloud::CloudSession;
use shared::proto::down::{DownAck, MAX_DOWN_BYTES};
use shared::proto::edge::SessionError;

use super::DownlinkMetrics;
use crate::sink::downlink::{DownDone, DownState, Outgoing, Pending, ReadLimit, done};

/// A sink call the downlink needs, for `edge`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownCall {
    /// The edge's position and counts ([`crate::sink::DownlinkStore::down_state`]).
    State,
    /// Record an ack ([`crate::sink::DownlinkStore::down_record`]).
    Record(DownDone),
    /// Messages after `after`, within `max` ([`crate::sink::DownlinkStore::down_read`]).
    Read { after: u64, max: ReadLimit },
    /// Set message `seq` aside ([`crate::sink::DownlinkStore::down_set_aside`]).
    SetAside { seq: u64, outcome: &'static str, reason: String },
}

/// What the sink answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownAnswer {
    State(DownState),
    Recorded,
    Read(Vec<Pending>),
    SetAside,
}

/// Where the downlink stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Asked the sink for the position; the hello's mark waits.
    Starting {
        edge_mark: u64,
    },
    /// Recording the edge's mark, further than the sink's, before starting there.
    Raising {
        edge_mark: u64,
    },
    Running,
}

/// The call in flight, to know what its answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    State,
    Raise,
    Read {
        want: ReadLimit,
        /// Made while messages sent were not yet recorded as done.
        unrecorded: bool,
    },
    /// The ack through `up_to` being recorded, with its counts.
    Record {
        up_to: u64,
    },
    SetAside,
}

/// See the module doc.
#[derive(Debug)]
pub struct DownCore {
    edge: String,
    metrics: Arc<DownlinkMetrics>,
    poll: Duration,
    /// A message past this many bytes is set aside ([`DownCore::with_max_bytes`]).
    max_bytes: u64,
    phase: Phase,
    asked: Option<Asked>,
    /// Calls to make, in order, with what their answers mean.
    calls: VecDeque<(DownCall, Asked)>,
    /// Acks waiting for the one being recorded.
    acks: VecDeque<DownAck>,
    /// Read from the sink, not yet sent for want of room.
    ready: VecDeque<Pending>,
    /// Sent on this connection and not yet acked, in order, with their bytes.
    sent: VecDeque<(u64, u64)>,
    /// The position as of the last ack (or the start).
    acked: u64,
    /// The last read filled its request: read again without waiting for news.
    more: bool,
    /// The sink finds only so many of an edge's messages past its position
    /// ([`crate::sink::downlink::DownLimit::reach`]: the Kafka sink's index holds
    /// `max_indexed_per_edge` from it), so a read short of its request while messages sent are
    /// not yet recorded is no proof of the end.
    short_reads: bool,
    /// Such a read came back: read again once the next record is made. Waiting for news held
    /// the rest of a backlog for `downlink.poll` after every window. Not on a sink whose reads
    /// find everything: an empty read after every record cost the window's call lane a round
    /// trip at the end of each burst.
    again_after_record: bool,
    /// No ack came on this connection yet: the first may name refusals an earlier bridge did
    /// not record.
    first_ack: bool,
    /// News came for this edge since the last read.
    woken: bool,
    /// When the next read is due without news.
    poll_at: Option<Instant>,
    /// The invalid message being set aside, sent (empty) once that is done.
    aside: Option<Pending>,
    /// The call in flight, to make again if it fails (a read is asked anew).
    in_flight: Option<DownCall>,
    /// After a failure: nothing is asked before then.
    retry_at: Option<Instant>,
    /// The pause after the next failure.
    backoff: Duration,
}

/// When an edge's first poll falls due after its first read: between half of `poll` and all of
/// it, at a place its id sets (FNV-1a), so a fleet that connected at once polls spread out.
fn first_poll(edge: &str, poll: Duration) -> Duration {
    let hash = edge.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    poll / 2 + poll.mul_f64((hash % 1024) as f64 / 2048.0)
}

/// The first pause after a failed downlink call, and the longest.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

impl DownCore {
    /// A downlink of `edge` with metrics of its own, for other subsystems' tests.
    #[cfg(test)]
    pub(crate) fn unmetered(edge: &str, poll: Duration) -> Self {
        Self::new(edge, Arc::new(DownlinkMetrics::default()), poll)
    }

    /// The downlink of `edge`, reading a window's worth at a time (its session's) and every `poll` without
    /// news. Nothing happens before [`DownCore::start`].
    pub fn new(edge: &str, metrics: Arc<DownlinkMetrics>, poll: Duration) -> Self {
        Self {
            edge: edge.to_owned(),
            metrics,
            poll,
            max_bytes: MAX_DOWN_BYTES as u64,
            phase: Phase::Starting { edge_mark: 0 },
            asked: None,
            calls: VecDeque::new(),
            acks: VecDeque::new(),
            ready: VecDeque::new(),
            sent: VecDeque::new(),
            acked: 0,
            more: false,
            short_reads: false,
            again_after_record: false,
            first_ack: true,
            woken: false,
            poll_at: None,
            aside: None,
            in_flight: None,
            retry_at: None,
            backoff: RETRY_FIRST,
        }
    }

    /// Sets aside messages past `max` bytes (`downlink.max_message_bytes`; at most what a
    /// downlink frame holds), as `send` refuses them: another publisher's are held to it too.
    pub(crate) fn with_max_bytes(mut self, max: u64) -> Self {
        self.max_bytes = max.min(MAX_DOWN_BYTES as u64);
        self
    }

    /// Reads the sink makes may come back short while the edge has not acked (see
    /// the field `short_reads`).
    pub(crate) fn with_short_reads(mut self, short: bool) -> Self {
        self.short_reads = short;
        self
    }

    /// The hello said the edge is done through `edge_mark`: ask the sink where it stands.
    pub(crate) fn start(&mut self, edge_mark: u64) {
        self.phase = Phase::Starting { edge_mark };
        self.calls.push_back((DownCall::State, Asked::State));
    }

    /// Whether the downlink runs (started on a session that speaks it).
    pub(crate) fn is_running(&self) -> bool {
        self.phase == Phase::Running
    }

    /// News came for this edge: read at the next chance.
    pub(crate) fn woken(&mut self) {
        self.woken = true;
    }

    /// The next sink call to make, once the one before it was answered. A read is asked for
    /// only here, when it is due at `now` and the window has room.
    pub(crate) fn poll_call(&mut self, session: &CloudSession, now: Instant) -> Option<DownCall> {
        if self.asked.is_some() || self.retry_at.is_some_and(|at| now < at) {
            return None;
        }
        self.retry_at = None;
        if let Some((call, asked)) = self.calls.pop_front() {
            self.asked = Some(asked);
            self.in_flight = Some(call.clone());
            return Some(call);
        }
        // Read ahead while the window is full: what the next acks free is sent at once, not a
        // read's round trip later. At most one read's worth waits (`ready`), as before.
        if self.phase != Phase::Running || !self.ready.is_empty() || self.aside.is_some() || !self.due(now) {
            return None;
        }
        self.woken = false;
        match self.poll_at {
            // The first read: the polls of edges that connected together (a fleet after a
            // bridge restart) are spread over the second half of the interval, not made at once.
            None => self.poll_at = Some(now + first_poll(&self.edge, self.poll)),
            Some(at) if now >= at => self.poll_at = Some(now + self.poll),
            Some(_) => {}
        }
        // A window's worth: what the session may have unanswered at once, in messages and in
        // bytes, so what waits here for room is bounded as the window is.
        let window = session.down_window();
        let want = ReadLimit { messages: window.messages, bytes: window.bytes as u64 };
        let unrecorded = self.short_reads && session.down_sent() > self.acked;
        self.asked = Some(Asked::Read { want, unrecorded });
        self.in_flight = None;
        Some(DownCall::Read { after: session.down_sent(), max: want })
    }

    /// The call made last failed: it is made again after a pause (a read is asked anew, as
    /// due then), and the session goes on meanwhile.
    pub(crate) fn handle_error(&mut self, now: Instant) {
        let Some(asked) = self.asked.take() else { return };
        if let Some(call) = self.in_flight.take() {
            self.calls.push_front((call, asked));
        }
        self.retry_at = Some(now + self.backoff);
        self.backoff = (self.backoff * 2).min(RETRY_MAX);
    }

    fn due(&self, now: Instant) -> bool {
        self.more || self.woken || self.poll_at.is_none_or(|at| now >= at)
    }

    /// When a read falls due without news, if the downlink waits for one; or when a failed
    /// call is made again.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if self.asked.is_some() {
            return None;
        }
        if let Some(at) = self.retry_at {
            return Some(at);
        }
        (self.phase == Phase::Running && self.ready.is_empty() && self.aside.is_none())
            .then_some(self.poll_at)
            .flatten()
    }

    /// The answer to the call made last. `wall_ms` is the wall clock, ms since the Unix epoch:
    /// what is left of a message's expiry is counted from it.
    pub(crate) fn handle_answer(
        &mut self,
        session: &mut CloudSession,
        answer: DownAnswer,
        wall_ms: u64,
    ) -> Result<(), SessionError> {
        let Some(asked) = self.asked.take() else { return Ok(()) };
        self.in_flight = None;
        self.backoff = RETRY_FIRST;
        match (asked, answer) {
            (Asked::State, DownAnswer::State(state)) => {
                let Phase::Starting { edge_mark } = self.phase else { return Ok(()) };
                if edge_mark > state.position {
                    self.phase = Phase::Raising { edge_mark };
                    let raise = DownCall::Record(DownDone { up_to: edge_mark, ..Default::default() });
                    self.calls.push_front((raise, Asked::Raise));
                } else {
                    self.run(session, state.position);
                }
            }
            (Asked::Raise, DownAnswer::Recorded) => {
                if let Phase::Raising { edge_mark } = self.phase {
                    self.run(session, edge_mark);
                }
            }
            (Asked::Read { want, unrecorded }, DownAnswer::Read(read)) => {
                self.more = want.reached(read.len(), read.iter().map(|p| p.msg.bytes()).sum());
                self.again_after_record = unrecorded && !self.more;
                self.ready.extend(read);
                self.feed(session, wall_ms)?;
            }
            (Asked::Record { up_to }, DownAnswer::Recorded) => {
                self.acked = up_to;
                self.more |= std::mem::take(&mut self.again_after_record);
                session.down_marked(up_to);
                self.next_ack(session, wall_ms)?;
            }
            (Asked::SetAside, DownAnswer::SetAside) => {
                if let Some(p) = self.aside.take() {
                    self.metrics.invalid.inc();
                    let bytes = p.msg.bytes();
                    let down = Outgoing { expires_at_ms: Some(0), ..p.msg }.to_down(p.seq, wall_ms);
                    self.send(session, down, bytes)?;
                }
                self.feed(session, wall_ms)?;
            }
            (asked, answer) => {
                return Err(SessionError::Protocol(format!(
                    "downlink: the sink answered {answer:?} to {asked:?} (a bug)"
                )));
            }
        }
        // Acks that came while the call was out (a read, a set-aside) are recorded now.
        if self.asked.is_none() && self.calls.is_empty() && !self.acks.is_empty() {
            self.next_ack(session, wall_ms)?;
        }
        Ok(())
    }

    /// The edge's ack, checked by the session: its refusals and position are recorded in the
    /// sink, then the session tells the edge so, and what the window freed is filled.
    pub(crate) fn handle_ack(
        &mut self,
        session: &mut CloudSession,
        ack: DownAck,
        wall_ms: u64,
    ) -> Result<(), SessionError> {
        if self.phase != Phase::Running {
            return Ok(());
        }
        self.acks.push_back(ack);
        if self.asked.is_none() && self.calls.is_empty() {
            self.next_ack(session, wall_ms)?;
        }
        // The room the ack freed is filled now, while its record is made: waiting for the record
        // held the window empty for the sink's round trips after every ack.
        self.feed(session, wall_ms)
    }

    /// Takes the next ack waiting: records it, or, with nothing new, moves on at once.
    fn next_ack(&mut self, session: &mut CloudSession, wall_ms: u64) -> Result<(), SessionError> {
        while let Some(mut ack) = self.acks.pop_front() {
            // The acks that queued behind it go in the same record (each names all before it
            // but the refusals and expiries it lists): one sink call per ack held the downlink
            // to the pace of the sink's round trips, whatever the window. Not into a
            // connection's first ack, whose old refusals are caught up on their own.
            if !self.first_ack {
                for _ in 1..MERGE_ACKS {
                    let Some(next) = self.acks.pop_front() else { break };
                    ack.up_to = ack.up_to.max(next.up_to);
                    ack.refused.extend(next.refused);
                    ack.expired.extend(next.expired);
                }
            }
            let (mut count, mut bytes) = (0, 0);
            while let Some((_, b)) = self.sent.front().copied().filter(|(seq, _)| *seq <= ack.up_to) {
                self.sent.pop_front();
                count += 1;
                bytes += b;
            }
            let up_to = ack.up_to;
            let catch_up = std::mem::replace(&mut self.first_ack, false);
            match done(self.acked, (count, bytes), up_to, (ack.refused, ack.expired), catch_up) {
                Some(done) => {
                    for r in done.refused.iter().filter(|r| r.seq > self.acked) {
                        tracing::info!(
                            edge = self.edge,
                            seq = r.seq,
                            reason = r.reason,
                            "downlink message refused by the edge"
                        );
                    }
                    let m = &self.metrics;
                    m.count("delivered", done.counts.delivered);
                    m.count("refused", done.counts.refused);
                    m.count("expired", done.counts.expired);
                    let up_to = done.up_to;
                    self.calls.push_back((DownCall::Record(done), Asked::Record { up_to }));
                    return Ok(());
                }
                None => {
                    self.acked = up_to;
                    session.down_marked(up_to);
                }
            }
        }
        self.feed(session, wall_ms)
    }

    /// Starts the downlink after `position`, if the session speaks it.
    fn run(&mut self, session: &mut CloudSession, position: u64) {
        if !session.start_down(position) {
            self.phase = Phase::Starting { edge_mark: 0 };
            return;
        }
        self.phase = Phase::Running;
        self.acked = position;
    }

    /// Sends what was read while the window has room; stops at a message to set aside first,
    /// until that is done. Records and reads in flight do not hold it: they concern what was
    /// sent before, or what comes after all of `ready`.
    fn feed(&mut self, session: &mut CloudSession, wall_ms: u64) -> Result<(), SessionError> {
        while self.aside.is_none() && session.down_room() {
            let Some(p) = self.ready.pop_front() else { break };
            let bytes = p.msg.bytes();
            let too_large = (bytes > self.max_bytes)
                .then(|| format!("{bytes} bytes, more than downlink.max_message_bytes ({})", self.max_bytes));
            match p.invalid.clone().or(too_large) {
                Some(reason) => {
                    tracing::warn!(
                        edge = self.edge,
                        seq = p.seq,
                        reason,
                        "downlink message set aside: it does not parse"
                    );
                    let call = DownCall::SetAside { seq: p.seq, outcome: "invalid", reason };
                    self.calls.push_back((call, Asked::SetAside));
                    self.aside = Some(p);
                }
                None => {
                    let down = p.msg.to_down(p.seq, wall_ms);
                    self.send(session, down, bytes)?;
                }
            }
        }
        Ok(())
    }

    fn send(
        &mut self,
        session: &mut CloudSession,
        down: shared::proto::down::Down,
        bytes: u64,
    ) -> Result<(), SessionError> {
        let seq = down.seq;
        session.send_down(down)?;
        self.sent.push_back((seq, bytes));
        self.metrics.sent.inc();
        Ok(())
    }
}

/// Queued acks recorded together, at most: their refusals and expiries (each ack's bounded by
/// `MAX_DOWN_REPORT`) are what one record sets aside.
const MERGE_ACKS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use shared::proto::Control;
    use shared::proto::cloud::DownWindow;

    fn session() -> CloudSession {
        let mut s = CloudSession::new(4).with_down_window(DownWindow { messages: 16, bytes: 1 << 20 });
        let hello = shared::proto::Hello {
            versions: shared::proto::VERSIONS.to_vec(),
            epoch: "e1".into(),
            lanes: vec![],
            models: vec![],
            dicts: vec![],
            caps: vec![],
            down_mark: 0,
            down_window: None,
        };
        s.handle(Control::Hello(hello)).unwrap();
        s.welcome(vec![], vec![]);
        s
    }

    fn pending(seq: u64) -> Pending {
        Pending {
            seq,
            stored_ms: 0,
            msg: Outgoing { topic: "cmd/a".into(), payload: b"x".to_vec(), qos: 1, ..Outgoing::default() },
            invalid: None,
        }
    }

    /// A session whose downlink started at position 0 and read messages 1 to `n` (sent, none
    /// acked), window 16.
    fn reading(now: Instant, n: u64) -> (CloudSession, DownCore) {
        let mut s = session();
        let mut d = DownCore::new("e", Arc::new(DownlinkMetrics::default()), Duration::from_secs(5));
        d.start(0);
        assert_eq!(d.poll_call(&s, now), Some(DownCall::State));
        d.handle_answer(&mut s, DownAnswer::State(DownState::default()), 0).unwrap();
        assert_eq!(
            d.poll_call(&s, now),
            Some(DownCall::Read { after: 0, max: ReadLimit { messages: 16, bytes: 1 << 20 } })
        );
        d.handle_answer(&mut s, DownAnswer::Read((1..=n).map(pending).collect()), 0).unwrap();
        (s, d)
    }

    /// Acks that come while one is being recorded, or while a read is out, are recorded in
    /// turn, none lost: the edge's position in the sink reaches the last ack. (One that came
    /// during a read once waited for the next ack, and the position stayed behind.)
    #[test]
    fn acks_that_come_while_one_is_recorded_are_recorded_in_turn() {
        let now = Instant::now();
        let (mut s, mut d) = reading(now, 3);
        while s.poll_control().is_some() {}
        for up_to in [1, 3] {
            let ack = DownAck { up_to, ..DownAck::default() };
            s.handle(Control::DownAck(ack.clone())).unwrap();
            d.handle_ack(&mut s, ack, 0).unwrap();
        }
        let mut recorded = Vec::new();
        while let Some(call) = d.poll_call(&s, now) {
            match call {
                DownCall::Record(done) => {
                    recorded.push(done.up_to);
                    d.handle_answer(&mut s, DownAnswer::Recorded, 0).unwrap();
                }
                DownCall::Read { .. } => {
                    d.handle_answer(&mut s, DownAnswer::Read(vec![]), 0).unwrap();
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(recorded, [1, 3]);
        // An ack while a read is out.
        d.woken();
        assert!(matches!(d.poll_call(&s, now), Some(DownCall::Read { .. })));
        d.handle_answer(&mut s, DownAnswer::Read((4..=5).map(pending).collect()), 0).unwrap();
        d.woken();
        let read = d.poll_call(&s, now);
        assert!(matches!(read, Some(DownCall::Read { .. })), "{read:?}");
        let ack = DownAck { up_to: 5, ..DownAck::default() };
        s.handle(Control::DownAck(ack.clone())).unwrap();
        d.handle_ack(&mut s, ack, 0).unwrap();
        d.handle_answer(&mut s, DownAnswer::Read(vec![]), 0).unwrap();
        let Some(DownCall::Record(done)) = d.poll_call(&s, now) else { panic!("the ack is recorded") };
        assert_eq!(done.up_to, 5);
    }

    /// Acks that queue while one is recorded go in one record, with all their refusals: one
    /// sink call per ack held the downlink to the pace of the sink's round trips.
    #[test]
    fn acks_that_queue_are_recorded_together() {
        let now = Instant::now();
        let (mut s, mut d) = reading(now, 5);
        let refused = |seq| shared::proto::down::DownRefusal { seq, reason: "no".into() };
        for (up_to, refusals) in [(1, vec![]), (3, vec![refused(2)]), (5, vec![refused(4)])] {
            let ack = DownAck { up_to, refused: refusals, ..DownAck::default() };
            s.handle(Control::DownAck(ack.clone())).unwrap();
            d.handle_ack(&mut s, ack, 0).unwrap();
        }
        let Some(DownCall::Record(first)) = d.poll_call(&s, now) else { panic!("the first ack is recorded") };
        assert_eq!(first.up_to, 1);
        d.handle_answer(&mut s, DownAnswer::Recorded, 0).unwrap();
        let Some(DownCall::Record(both)) = d.poll_call(&s, now) else { panic!("the two queued, recorded together") };
        assert_eq!((both.up_to, both.refused, both.counts.delivered), (5, vec![refused(2), refused(4)], 2));
        d.handle_answer(&mut s, DownAnswer::Recorded, 0).unwrap();
        assert_eq!(d.poll_call(&s, now), None, "nothing more until news or the poll");
        assert_eq!(s.down_sent(), 5);
    }

    /// The room an ack frees is filled at once, while its record is out, and the next read is
    /// made while the window is full: delivery waited for both round trips after every ack.
    #[test]
    fn the_window_is_filled_while_an_ack_is_recorded_and_read_ahead_while_full() {
        let now = Instant::now();
        let (mut s, mut d) = reading(now, 20);
        assert_eq!(s.down_sent(), 16, "the window is full, 4 wait");
        let ack = DownAck { up_to: 4, ..DownAck::default() };
        s.handle(Control::DownAck(ack.clone())).unwrap();
        d.handle_ack(&mut s, ack, 0).unwrap();
        assert_eq!(s.down_sent(), 20, "sent before the record is made");
        let Some(DownCall::Record(done)) = d.poll_call(&s, now) else { panic!("the ack is recorded") };
        assert_eq!(done.up_to, 4);
        d.handle_answer(&mut s, DownAnswer::Recorded, 0).unwrap();
        assert!(!s.down_room(), "the window is full again");
        d.woken();
        assert_eq!(
            d.poll_call(&s, now),
            Some(DownCall::Read { after: 20, max: ReadLimit { messages: 16, bytes: 1 << 20 } }),
            "read ahead"
        );
        d.handle_answer(&mut s, DownAnswer::Read((21..=22).map(pending).collect()), 0).unwrap();
        assert_eq!(s.down_sent(), 20, "held until there is room");
        assert_eq!(d.poll_call(&s, now), None, "one read's worth waits at most");
        let ack = DownAck { up_to: 5, ..DownAck::default() };
        s.handle(Control::DownAck(ack.clone())).unwrap();
        d.handle_ack(&mut s, ack, 0).unwrap();
        assert_eq!(s.down_sent(), 21);
    }

    /// The edge acks through `up_to`, and the record it asks for is made.
    fn acked_and_recorded(s: &mut CloudSession, d: &mut DownCore, up_to: u64, now: Instant) {
        let ack = DownAck { up_to, ..DownAck::default() };
        s.handle(Control::DownAck(ack.clone())).unwrap();
        d.handle_ack(s, ack, 0).unwrap();
        assert!(matches!(d.poll_call(s, now), Some(DownCall::Record(_))));
        d.handle_answer(s, DownAnswer::Recorded, 0).unwrap();
    }

    /// On a sink whose reads stop short (Kafka's), a read that comes back short while messages
    /// sent are not yet recorded as done is made again after the next record, without news:
    /// the Kafka sink finds no more than `max_indexed_per_edge` past the edge's position until
    /// its ack is recorded, and such a backlog waited for `downlink.poll` (60 s) after every
    /// window. A short read with nothing unrecorded is the end, until news; and on a sink whose
    /// reads find everything, so is every short read.
    #[test]
    fn a_short_read_while_messages_are_unrecorded_is_made_again_after_the_record() {
        let now = Instant::now();
        let (mut s, d) = reading(now, 16);
        let mut d = d.with_short_reads(true);
        assert!(!s.down_room());
        d.woken();
        assert!(matches!(d.poll_call(&s, now), Some(DownCall::Read { after: 16, .. })), "read ahead");
        d.handle_answer(&mut s, DownAnswer::Read(vec![]), 0).unwrap();
        assert_eq!(d.poll_call(&s, now), None, "no room, no news");
        acked_and_recorded(&mut s, &mut d, 4, now);
        assert!(matches!(d.poll_call(&s, now), Some(DownCall::Read { after: 16, .. })), "again, after the record");
        d.handle_answer(&mut s, DownAnswer::Read(vec![]), 0).unwrap();
        assert_eq!(d.poll_call(&s, now), None, "until the next record");
        acked_and_recorded(&mut s, &mut d, 16, now);
        assert!(matches!(d.poll_call(&s, now), Some(DownCall::Read { after: 16, .. })));
        // Short with everything recorded: the end, until news.
        d.handle_answer(&mut s, DownAnswer::Read(vec![]), 0).unwrap();
        assert_eq!(d.poll_call(&s, now), None);

        let (mut s, mut d) = reading(now, 16);
        d.woken();
        assert!(matches!(d.poll_call(&s, now), Some(DownCall::Read { after: 16, .. })));
        d.handle_answer(&mut s, DownAnswer::Read(vec![]), 0).unwrap();
        acked_and_recorded(&mut s, &mut d, 4, now);
        assert_eq!(d.poll_call(&s, now), None, "a sink whose reads find everything: the end");
    }

    /// A message to set aside holds the ones after it until that is recorded, and no read is
    /// made meanwhile (it would read them again).
    #[test]
    fn a_message_set_aside_holds_the_next_ones_and_the_reads() {
        let now = Instant::now();
        let (mut s, mut d) = reading(now, 2);
        let bad = Pending { invalid: Some("no".into()), ..pending(3) };
        d.woken();
        assert!(matches!(d.poll_call(&s, now), Some(DownCall::Read { after: 2, .. })));
        d.handle_answer(&mut s, DownAnswer::Read(vec![bad, pending(4)]), 0).unwrap();
        assert_eq!(s.down_sent(), 2);
        let ack = DownAck { up_to: 2, ..DownAck::default() };
        s.handle(Control::DownAck(ack.clone())).unwrap();
        d.handle_ack(&mut s, ack, 0).unwrap();
        assert_eq!(s.down_sent(), 2, "4 waits behind 3");
        assert!(matches!(d.poll_call(&s, now), Some(DownCall::SetAside { seq: 3, .. })));
        d.handle_answer(&mut s, DownAnswer::SetAside, 0).unwrap();
        assert_eq!(s.down_sent(), 4, "3 sent empty, then 4");
        assert!(matches!(d.poll_call(&s, now), Some(DownCall::Record(_))));
    }

    /// A read is as large as the window in bytes as well as in messages, and one that reached
    /// the bytes is full: the next is made at once, as after one that reached the count.
    #[test]
    fn a_read_is_bounded_by_the_window_bytes_and_full_when_it_reaches_them() {
        let now = Instant::now();
        let (mut s, mut d) = reading(now, 0);
        let big =
            |seq| Pending { msg: Outgoing { payload: vec![b'x'; 600 << 10], ..pending(seq).msg }, ..pending(seq) };
        d.woken();
        let Some(DownCall::Read { max, .. }) = d.poll_call(&s, now) else { panic!("a read") };
        assert_eq!(max, ReadLimit { messages: 16, bytes: 1 << 20 });
        // Two of 600 KiB: 2 of 16 messages, but past the 1 MiB.
        d.handle_answer(&mut s, DownAnswer::Read(vec![big(1), big(2)]), 0).unwrap();
        assert_eq!(s.down_sent(), 2, "the second goes with the window's bytes not yet reached");
        assert!(matches!(d.poll_call(&s, now), Some(DownCall::Read { after: 2, .. })), "read on, no news needed");
        d.handle_answer(&mut s, DownAnswer::Read(vec![pending(3)]), 0).unwrap();
        assert_eq!(d.poll_call(&s, now), None, "a read short of both waits for news");
    }

    /// Edges that connect together poll spread over the second half of `poll` the first time,
    /// then every `poll`: 10,000 sessions back after a restart once read the sink in the same
    /// instant every interval.
    #[test]
    fn first_polls_of_edges_that_connect_together_are_spread() {
        let poll = Duration::from_secs(60);
        let firsts: Vec<Duration> = (0..1000).map(|i| first_poll(&format!("edge-{i:05}"), poll)).collect();
        assert!(firsts.iter().all(|f| *f >= poll / 2 && *f <= poll), "within the second half");
        let mut seconds: Vec<u64> = firsts.iter().map(|f| f.as_secs()).collect();
        seconds.sort();
        seconds.dedup();
        assert!(seconds.len() >= 25, "over most of the 30 s: {seconds:?}");

        let now = Instant::now();
        let (mut s, mut d) = reading(now, 0);
        let first = d.poll_timeout().expect("a poll is due");
        assert_eq!(first - now, first_poll("e", Duration::from_secs(5)));
        assert_eq!(d.poll_call(&s, first - Duration::from_millis(1)), None, "not yet");
        assert!(matches!(d.poll_call(&s, first), Some(DownCall::Read { .. })));
        d.handle_answer(&mut s, DownAnswer::Read(vec![]), 0).unwrap();
        assert_eq!(d.poll_timeout(), Some(first + Duration::from_secs(5)), "then every poll");
    }
}
