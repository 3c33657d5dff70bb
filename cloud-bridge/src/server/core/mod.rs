//! One edge session's policy on the bridge, without I/O: which batches are taken in, which
//! wait ahead of a missing one and for how long, which publish now and in what order, and
//! which marks follow; what the hello, the edge's dictionaries and reports and the downlink ask
//! of the sink (`calls.rs`). The connection task (`server::session`) feeds it what happened,
//! with `now`, and does what it asks; [`CloudSession`] under it keeps the protocol's rules
//! (hello, release order per lane, acks), the downlink's policy is [`DownCore`]'s.
//!
//! Rules it adds:
//! - A batch's records are held with what they cost (`H`, the driver's budget reservation)
//!   until the batch publishes; a batch the session drops (a resend) or replaces gives both
//!   back at once.
//! - A batch is staged ([`SessionCore::poll_stage`], what a sink may do before the batches
//!   ahead are in), then published ([`SessionCore::poll_publish`]). At most `pipeline` are
//!   staged or publishing at once, started in release order; they publish in that order, one
//!   at a time, each only once the one before it is in the sink: a failed publish ends the
//!   session before anything after it is visible, so the edge's resend keeps every lane in
//!   order. A sink that keeps a lane's order itself (`publish_ahead` more than 1) is given up to
//!   that many at once, still in order, each with the last record of the one before it in its
//!   lane still publishing (`after`): it must not land a batch before that record. The
//!   driver reads a batch ahead only while fewer than `pipeline + 1` are under way or waiting.
//! - A lane's mark moves only over a prefix of batches all in the sink, one mark per lane for
//!   every batch that finished together, and marks are written one round at a time; the
//!   edge's ack follows the mark ([`CloudSession::committed`]).
//! - A session that holds batches ahead of a missing one for `stall` ends: an edge that never
//!   sends the missing batch cannot pin the memory of those behind it.

mod calls;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use shared::proto::cloud::CloudSession;
use shared::proto::edge::SessionError;
use shared::proto::{Batch, Control, WireRecord};

pub use calls::{Answer, Call, Event};

use crate::downlink::core::DownCore;

/// A batch to stage and then publish: its records above what the sink has, and what they cost,
/// to give back once the publish ends either way.
#[derive(Debug)]
pub struct Publish<H> {
    /// Names this batch in [`SessionCore::handle_staged`], [`SessionCore::poll_publish`] and
    /// [`SessionCore::handle_published`].
    pub id: u64,
    pub epoch: String,
    pub lane: u8,
    pub records: Vec<WireRecord>,
    pub held: H,
}

/// Why the core ended the session.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    /// The edge broke the protocol or was refused (`label`: the `connections_refused` reason
    /// of a refusal the bridge decided): send what is queued for it, then end.
    #[error("{error}")]
    Refused { label: Option<&'static str>, error: SessionError },
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Sink(#[from] crate::sink::SinkError),
    #[error("held batches ahead of a missing one for {0:?}")]
    Stalled(Duration),
}

/// A batch under way: where its mark goes, and how far it got.
#[derive(Debug)]
struct Started {
    id: u64,
    lane: u8,
    up_to: u64,
    /// Its last record's seq, if it has records.
    last: Option<u64>,
    count: u64,
    step: Step,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Staging,
    Staged,
    Publishing,
    Published,
}

/// See the module doc.
#[derive(Debug)]
pub struct SessionCore<H> {
    session: CloudSession,
    pipeline: usize,
    /// Batches publishing at once, at most (the sink's `publish_ahead`).
    ahead: usize,
    stall: Duration,
    /// What batches taken in hold, by (lane, first seq), until they publish.
    held: HashMap<(u8, u64), (Vec<WireRecord>, H)>,
    /// Since when batches wait ahead of a missing one.
    held_since: Option<Instant>,
    /// Released, not yet staging, with the last seq each marks.
    queued: VecDeque<(Publish<H>, u64)>,
    /// Staging or publishing, in release order.
    started: VecDeque<Started>,
    next_id: u64,
    /// Per lane, how far the sink has every record, not yet marked.
    marks: BTreeMap<u8, u64>,
    /// A round of marks is being written.
    marking: bool,
    /// Records published in order, not yet counted by the driver.
    published: u64,
    /// The edge, for the log.
    edge: String,
    /// The hello being looked up.
    hello: Option<calls::Hello>,
    /// Sink calls to make, in order, with what their answers are for.
    calls: VecDeque<(Call, calls::Asked)>,
    /// The call in flight.
    asked: Option<calls::Asked>,
    events: VecDeque<Event>,
    /// The edge's downlink, if the bridge delivers one.
    down: Option<DownCore>,
    /// The wall clock as the driver last read it: at `.0` it was `.1` ms since the Unix epoch.
    wall: (Instant, u64),
}

impl<H> SessionCore<H> {
    /// A session that holds at most `max_held` batches ahead of a missing one, for at most
    /// `stall`, and publishes `pipeline` at once.
    pub fn new(session: CloudSession, pipeline: usize, stall: Duration) -> Self {
        Self {
            session,
            pipeline: pipeline.max(1),
            ahead: 1,
            stall,
            held: HashMap::new(),
            held_since: None,
            queued: VecDeque::new(),
            started: VecDeque::new(),
            next_id: 0,
            marks: BTreeMap::new(),
            marking: false,
            published: 0,
            edge: String::new(),
            hello: None,
            calls: VecDeque::new(),
            asked: None,
            events: VecDeque::new(),
            down: None,
            wall: (Instant::now(), 0),
        }
    }

    /// Up to `ahead` batches publishing at once (within `pipeline`), for a sink that keeps a
    /// lane's order itself.
    pub fn with_publish_ahead(mut self, ahead: usize) -> Self {
        self.ahead = ahead.clamp(1, self.pipeline);
        self
    }

    /// The session of `edge` (named in the log), with its downlink run by `down` once the
    /// hello is answered.
    pub fn with_edge(mut self, edge: &str, down: Option<DownCore>) -> Self {
        self.edge = edge.to_owned();
        self.down = down;
        self
    }

    /// The driver read the clocks: at `at` it was `ms` since the Unix epoch. What is left of a
    /// downlink message's expiry is counted from them.
    pub fn set_wall_clock(&mut self, at: Instant, ms: u64) {
        self.wall = (at, ms);
    }

    fn wall_ms(&self, now: Instant) -> u64 {
        let (at, ms) = self.wall;
        ms.saturating_add(now.saturating_duration_since(at).as_millis() as u64)
    }

    /// The protocol session under this core: the hello's lookups, dictionaries, models and
    /// control frames go through it.
    pub fn session(&self) -> &CloudSession {
        &self.session
    }

    pub(crate) fn session_mut(&mut self) -> &mut CloudSession {
        &mut self.session
    }

    /// Whether the driver may read the next batch: one is read ahead while the others publish.
    pub fn wants_batch(&self) -> bool {
        self.started.len() + self.queued.len() <= self.pipeline
    }

    /// A batch read and decoded, with what holding its records costs.
    pub fn handle_batch(
        &mut self,
        batch: Batch,
        records: Vec<WireRecord>,
        held: H,
        now: Instant,
    ) -> Result<(), CoreError> {
        self.held.insert((batch.lane.0, batch.first_seq.0), (records, held));
        for release in self.session.handle_batch(batch)? {
            let (lane, first, up_to) = (release.batch.lane, release.batch.first_seq, release.batch.last_seq);
            let (records, held) = self.held.remove(&(lane.0, first.0)).expect("a released batch was taken in");
            let records: Vec<WireRecord> = records.into_iter().filter(|r| r.seq.0 > release.skip_through).collect();
            let id = self.next_id;
            self.next_id += 1;
            self.queued.push_back((Publish { id, epoch: release.batch.epoch, lane: lane.0, records, held }, up_to.0));
        }
        // What the session dropped (a resend) or replaced gives its memory back.
        let session = &self.session;
        self.held.retain(|(lane, first), _| session.is_held(*lane, *first));
        self.held_since = match (self.held.is_empty(), self.held_since) {
            (true, _) => None,
            (false, None) => Some(now),
            (false, since) => since,
        };
        Ok(())
    }

    /// The next batch to stage, in release order, while fewer than `pipeline` are under way.
    /// Call [`SessionCore::handle_staged`] once it is.
    pub fn poll_stage(&mut self) -> Option<Publish<H>> {
        if self.started.len() >= self.pipeline {
            return None;
        }
        let (publish, up_to) = self.queued.pop_front()?;
        let count = publish.records.len() as u64;
        let last = publish.records.iter().map(|r| r.seq.0).max();
        self.started.push_back(Started { id: publish.id, lane: publish.lane, up_to, last, count, step: Step::Staging });
        Some(publish)
    }

    /// Batch `id` is staged.
    pub fn handle_staged(&mut self, id: u64) {
        if let Some(s) = self.started.iter_mut().find(|s| s.id == id && s.step == Step::Staging) {
            s.step = Step::Staged;
        }
    }

    /// The staged batch to publish now, if every one before it is publishing or in the sink,
    /// fewer than `ahead` are publishing, and it is staged: its id, and the last record of the
    /// latest batch before it in its lane still publishing (see the module doc). Call
    /// [`SessionCore::handle_published`] once it is in.
    pub fn poll_publish(&mut self) -> Option<(u64, Option<u64>)> {
        let publishing = self.started.iter().filter(|s| s.step == Step::Publishing).count();
        if publishing >= self.ahead {
            return None;
        }
        let at = self.started.iter().position(|s| !matches!(s.step, Step::Publishing | Step::Published))?;
        if self.started[at].step != Step::Staged {
            return None;
        }
        let lane = self.started[at].lane;
        let after = self
            .started
            .iter()
            .take(at)
            .rev()
            .filter(|s| s.lane == lane && s.step == Step::Publishing)
            .find_map(|s| s.last);
        let next = &mut self.started[at];
        next.step = Step::Publishing;
        Some((next.id, after))
    }

    /// Batch `id` is in the sink. (One that failed ends the session: the edge resends what
    /// was not acked, on a new one.)
    pub fn handle_published(&mut self, id: u64) {
        if let Some(s) = self.started.iter_mut().find(|s| s.id == id && s.step == Step::Publishing) {
            s.step = Step::Published;
        }
        // The batches in the sink over a prefix: one mark per lane for all of them.
        while self.started.front().is_some_and(|s| s.step == Step::Published) {
            let s = self.started.pop_front().expect("checked");
            self.published += s.count;
            let mark = self.marks.entry(s.lane).or_default();
            *mark = (*mark).max(s.up_to);
        }
    }

    /// Records that reached the sink in order since the last call.
    pub(crate) fn take_published(&mut self) -> u64 {
        std::mem::take(&mut self.published)
    }

    /// The marks to write now, (lane, up to) in lane order, if no round is being written:
    /// write them in order, then call [`SessionCore::handle_marked`].
    pub fn poll_marks(&mut self) -> Option<Vec<(u8, u64)>> {
        if self.marking || self.marks.is_empty() {
            return None;
        }
        self.marking = true;
        Some(std::mem::take(&mut self.marks).into_iter().collect())
    }

    /// The round of marks from [`SessionCore::poll_marks`] is written: the edge gets its acks.
    pub fn handle_marked(&mut self, marks: &[(u8, u64)]) {
        self.marking = false;
        for &(lane, up_to) in marks {
            self.session.committed(lane, up_to);
        }
    }

    /// When the core must hear of time passing: the stall deadline of held batches, the
    /// downlink's next read without news.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let down = self.down.as_ref().and_then(|d| d.poll_timeout());
        self.stall_deadline().into_iter().chain(down).min()
    }

    fn stall_deadline(&self) -> Option<Instant> {
        self.held_since.map(|since| since + self.stall)
    }

    /// Time passed: a session held past its stall deadline ends; a downlink read may be due
    /// ([`SessionCore::poll_call`]).
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), CoreError> {
        match self.stall_deadline() {
            Some(deadline) if now >= deadline => Err(CoreError::Stalled(self.stall)),
            _ => Ok(()),
        }
    }

    /// Batches waiting ahead of a missing one.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// The next control frame to send the edge.
    pub fn poll_control(&mut self) -> Option<Control> {
        self.session.poll_control()
    }
}

#[cfg(test)]
mod tests;
