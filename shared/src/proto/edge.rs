//! The edge's side of a bridge session, without I/O. The driver (the uplink in `edge-node`)
//! tells it when the connection comes and goes, hands it every control frame received and the
//! time, asks it whether a batch may be sent and from which seq, and carries out what it
//! returns: control frames to send, acks to apply to the spool.
//!
//! Rules it keeps:
//! - After (re)connecting, nothing is sent before the cloud's `Welcome`; the committed seqs in
//!   it count as acks, so what the cloud already has is deleted and never resent.
//! - Batches of a lane are sent in seq order, each covering the seqs right after the previous
//!   one (with holes where the spool dropped records, which gap records account for); on a
//!   new connection sending resumes after the last ack (unacked batches are resent: the cloud
//!   drops what it already committed).
//! - At most `window` batches are unacked at a time (backpressure).
//! - A ping goes out every `keepalive`; the link is *degraded* while a batch or a ping has
//!   waited longer than `ack_timeout` for its answer (connected, but not acking).
//! - Downlink messages (version 5, [`super::down`]) come in increasing seq order; one at or
//!   below the edge's position is a resend and only re-acked; at most `max_down_pending` may
//!   wait for the driver, and from version 9 nothing past `max_down_bytes` but one (both are
//!   announced in the hello; an older bridge knows neither, and is held to
//!   [`MAX_DOWN_WINDOW`] messages as before). The driver finishes them in order
//!   ([`EdgeSession::down_done`]) once each is durable; refusals and expiries are reported
//!   until the cloud marks them, across reconnects.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::down::{
    DEFAULT_DOWN_WINDOW_BYTES, Down, DownAck, DownOutcome, DownRefusal, EdgeWindow, MAX_DOWN_REPORT, MAX_DOWN_WINDOW,
    clip_reason,
};
use super::{
    Ack, Control, DOWN_WINDOW_VERSION, DOWNLINK_VERSION, DictAnnounce, Hello, Lane, LaneSeq, Seq, SpoolReport, VERSIONS,
};

#[derive(Debug, Clone)]
pub struct EdgeSessionConfig {
    /// Batches in flight at most.
    pub window: usize,
    pub keepalive: Duration,
    pub ack_timeout: Duration,
    /// Downlink messages received and not yet done, at most (1 ..= [`MAX_DOWN_WINDOW`]), and
    /// their bytes as [`Down::weight`] counts them, past which nothing more comes but when none
    /// is held: announced in the hello (version 9), and past either the bridge broke its window
    /// and the session ends. A session of an older version announces nothing the bridge
    /// understands, so it holds [`MAX_DOWN_WINDOW`] messages whatever their bytes.
    pub max_down_pending: usize,
    pub max_down_bytes: usize,
}

impl Default for EdgeSessionConfig {
    fn default() -> Self {
        Self {
            window: 8,
            keepalive: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(2),
            max_down_pending: MAX_DOWN_WINDOW,
            max_down_bytes: DEFAULT_DOWN_WINDOW_BYTES,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Disconnected,
    AwaitWelcome,
    Ready,
    Refused,
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EdgeEvent {
    /// The Welcome says the cloud committed `lane` through `committed`; an `Acked` follows
    /// when that is more than was acked. The driver checks the mark against the spool first.
    Mark { lane: u8, committed: u64 },
    /// The cloud committed `lane` through `up_to`: delete those records from the spool.
    Acked { lane: u8, up_to: u64 },
    /// The session is ready to send batches, in this protocol version; the cloud holds the
    /// dictionaries `dicts`, and its sink stores records within `sink` (version 3; `None`:
    /// no limits of its own, or an older bridge that does not say).
    Ready { version: u16, dicts: Vec<String>, sink: Option<super::SinkLimits> },
    /// The cloud stored a dictionary this edge announced.
    DictStored(String),
    /// A ping's round trip.
    Rtt(Duration),
    /// A batch was acked this long after it was sent: edge-to-central commit latency.
    Committed { lane: u8, latency: Duration },
    /// The link became degraded (connected but not acking) or recovered.
    Degraded(bool),
    /// The cloud announced a model version (unverified: check its signature before use).
    Model(super::ModelAnnounce),
    /// A downlink message to deliver (or refuse); answer with [`EdgeSession::down_done`].
    Down(Box<Down>),
    /// The cloud recorded the downlink position and its refusals through this seq: the
    /// driver may forget the refusals it kept.
    DownMarked(u64),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    #[error("the cloud refused this edge: {0}")]
    Refused(String),
    #[error("no common protocol version: this side speaks {ours:?}, the peer {theirs:?}")]
    NoCommonVersion { ours: Vec<u16>, theirs: Vec<u16> },
    #[error("protocol violation: {0}")]
    Protocol(String),
}

#[derive(Debug, Clone, Copy, Default)]
struct LaneProgress {
    acked: u64,
    sent: u64,
}

#[derive(Debug)]
struct InFlight {
    lane: u8,
    last: u64,
    sent: Instant,
}

#[derive(Debug)]
pub struct EdgeSession {
    config: EdgeSessionConfig,
    versions: Vec<u16>,
    epoch: String,
    models: Vec<String>,
    dicts: Vec<String>,
    phase: Phase,
    lanes: BTreeMap<u8, LaneProgress>,
    inflight: VecDeque<InFlight>,
    out: VecDeque<Control>,
    next_ping: Option<Instant>,
    ping: Option<(u64, Instant)>,
    nonce: u64,
    degraded: bool,
    rtt: Option<Duration>,
    /// The spool's last committed seq per lane, as the driver last reported it.
    heads: BTreeMap<u8, u64>,
    /// What the spool said of itself last, sent with the heads.
    spool: Option<SpoolReport>,
    /// Welcomes received over the session's life.
    welcomes: u64,
    /// The version the last Welcome chose; 0 before one.
    version: u16,
    down: DownState,
}

/// The downlink's progress on this side.
#[derive(Debug, Default)]
struct DownState {
    /// Every message through this one is done and durable (persisted by the driver).
    done: u64,
    /// The highest seq received on this connection (at least `done`).
    received: u64,
    /// Received and not yet done, in order, with their weights.
    pending: VecDeque<(u64, usize)>,
    /// Their weights together.
    pending_bytes: usize,
    /// Not delivered and not yet marked by the cloud: reported in every first ack of a
    /// connection, and new ones in the next ack.
    refused: Vec<DownRefusal>,
    expired: Vec<u64>,
    /// Of those, how many this connection's acks already carried.
    reported: (usize, usize),
    /// An ack is owed.
    ack_due: bool,
}

impl EdgeSession {
    /// A session for the spool of `epoch`, whose lanes were acked up to the given seqs.
    pub fn new(
        config: EdgeSessionConfig,
        epoch: impl Into<String>,
        acked: impl IntoIterator<Item = (u8, u64)>,
    ) -> Self {
        Self {
            config,
            versions: VERSIONS.to_vec(),
            epoch: epoch.into(),
            models: Vec::new(),
            dicts: Vec::new(),
            phase: Phase::Disconnected,
            lanes: acked.into_iter().map(|(l, a)| (l, LaneProgress { acked: a, sent: a })).collect(),
            inflight: VecDeque::new(),
            out: VecDeque::new(),
            next_ping: None,
            ping: None,
            nonce: 0,
            degraded: false,
            rtt: None,
            heads: BTreeMap::new(),
            spool: None,
            welcomes: 0,
            version: 0,
            down: DownState::default(),
        }
    }

    /// Starts the downlink at the edge's persisted position, with the refusals and expiries
    /// it kept that the cloud has not marked.
    #[cfg(test)]
    pub(crate) fn with_down(mut self, done: u64, refused: Vec<DownRefusal>, expired: Vec<u64>) -> Self {
        self.down = DownState { done, received: done, refused, expired, ..DownState::default() };
        self
    }

    /// The protocol version the cloud's Welcome chose (0 before one): what batches are framed
    /// in.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Speaks these versions instead of this build's (for tests of mixed fleets).
    pub(crate) fn with_versions(mut self, versions: Vec<u16>) -> Self {
        self.versions = versions;
        self
    }

    /// Model names to announce in the hello.
    pub fn with_models(mut self, models: Vec<String>) -> Self {
        self.models = models;
        self
    }

    /// Dictionary ids to offer in the next hello.
    pub fn set_dicts(&mut self, ids: Vec<String>) {
        self.dicts = ids;
    }

    /// A connection is up: the hello goes first.
    pub fn connected(&mut self, now: Instant) {
        self.reset();
        self.phase = Phase::AwaitWelcome;
        self.out.push_back(Control::Hello(Hello {
            versions: self.versions.clone(),
            epoch: self.epoch.clone(),
            lanes: self.lanes.iter().map(|(l, p)| LaneSeq { lane: Lane(*l), seq: Seq(p.acked + 1) }).collect(),
            models: self.models.clone(),
            dicts: self.dicts.clone(),
            caps: vec!["zstd".into(), "zstd-dict".into()],
            down_mark: self.down.done,
            down_window: Some(EdgeWindow {
                messages: self.config.max_down_pending as u64,
                bytes: self.config.max_down_bytes as u64,
            }),
        }));
        self.next_ping = Some(now + self.config.keepalive);
    }

    /// The connection is gone: what was in flight will be resent after the last ack.
    pub fn disconnected(&mut self) {
        self.reset();
        if self.phase != Phase::Refused {
            self.phase = Phase::Disconnected;
        }
    }

    fn reset(&mut self) {
        self.out.clear();
        self.inflight.clear();
        self.ping = None;
        self.next_ping = None;
        for p in self.lanes.values_mut() {
            p.sent = p.acked;
        }
        // Messages received and not done are sent again by the next bridge; what was not
        // marked is reported again.
        let d = &mut self.down;
        (d.received, d.reported) = (d.done, (0, 0));
        d.pending.clear();
        d.pending_bytes = 0;
        d.ack_due = !d.refused.is_empty() || !d.expired.is_empty();
    }

    #[cfg(test)]
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// Handles a control frame from the cloud.
    pub fn handle(&mut self, frame: Control, now: Instant) -> Result<Vec<EdgeEvent>, SessionError> {
        let mut events = Vec::new();
        match frame {
            Control::Welcome(w) if self.phase == Phase::AwaitWelcome => {
                if !self.versions.contains(&w.version) {
                    return Err(SessionError::Protocol(format!(
                        "welcome chose version {}, which this edge did not offer ({:?})",
                        w.version, self.versions
                    )));
                }
                if let Some(bad) = w.committed.iter().find(|l| l.seq.0 > super::MAX_SEQ) {
                    return Err(SessionError::Protocol(format!(
                        "welcome says lane {} is committed through seq {}, past the highest seq there is",
                        bad.lane, bad.seq
                    )));
                }
                for LaneSeq { lane: Lane(lane), seq: Seq(seq) } in w.committed {
                    // Before the mark counts as an ack: the spool checks it against what it
                    // holds (its disk may have gone back in time).
                    events.push(EdgeEvent::Mark { lane, committed: seq });
                    let p = self.lanes.entry(lane).or_default();
                    if seq > p.acked {
                        p.acked = seq;
                        p.sent = p.sent.max(seq);
                        events.push(EdgeEvent::Acked { lane, up_to: seq });
                    }
                }
                self.phase = Phase::Ready;
                self.welcomes += 1;
                self.version = w.version;
                // The position goes to the cloud on every connection: the sink may be behind
                // what the edge made durable (an ack lost with the last connection).
                self.down.ack_due = w.version >= DOWNLINK_VERSION;
                events.push(EdgeEvent::Ready { version: w.version, dicts: w.dicts, sink: w.sink });
            }
            Control::Refused { reason } => {
                self.phase = Phase::Refused;
                return Err(SessionError::Refused(reason));
            }
            Control::Ack(Ack { lane: Lane(lane), up_to: Seq(up_to) }) if self.phase == Phase::Ready => {
                let p = self.lanes.entry(lane).or_default();
                if up_to > p.sent {
                    return Err(SessionError::Protocol(format!(
                        "ack of lane {} up to {} but only {} was sent",
                        lane, up_to, p.sent
                    )));
                }
                if up_to > p.acked {
                    p.acked = up_to;
                    events.push(EdgeEvent::Acked { lane, up_to });
                }
                self.inflight.retain(|f| {
                    let done = f.lane == lane && f.last <= up_to;
                    if done {
                        events.push(EdgeEvent::Committed {
                            lane: f.lane,
                            latency: now.saturating_duration_since(f.sent),
                        });
                    }
                    !done
                });
                self.update_degraded(now, &mut events);
            }
            Control::DictStored { id } if self.phase == Phase::Ready => events.push(EdgeEvent::DictStored(id)),
            Control::Model(announce) if self.phase == Phase::Ready => events.push(EdgeEvent::Model(announce)),
            Control::Down(d) if self.phase == Phase::Ready => self.handle_down(d, &mut events)?,
            Control::DownMarked { up_to } if self.phase == Phase::Ready => {
                if up_to > self.down.done {
                    return Err(SessionError::Protocol(format!(
                        "downlink marked through {up_to}, but this edge is done only through {}",
                        self.down.done
                    )));
                }
                let d = &mut self.down;
                let (refused, expired) = (d.refused.len(), d.expired.len());
                d.refused.retain(|r| r.seq > up_to);
                d.expired.retain(|s| *s > up_to);
                d.reported.0 -= (refused - d.refused.len()).min(d.reported.0);
                d.reported.1 -= (expired - d.expired.len()).min(d.reported.1);
                events.push(EdgeEvent::DownMarked(up_to));
            }
            Control::Ping { nonce } => self.out.push_back(Control::Pong { nonce }),
            Control::Pong { nonce } => {
                if let Some((sent_nonce, sent)) = self.ping
                    && sent_nonce == nonce
                {
                    let rtt = now.saturating_duration_since(sent);
                    self.rtt = Some(rtt);
                    self.ping = None;
                    events.push(EdgeEvent::Rtt(rtt));
                    self.update_degraded(now, &mut events);
                }
            }
            Control::Unknown => {}
            other => {
                return Err(SessionError::Protocol(format!("unexpected {} in phase {:?}", name(&other), self.phase)));
            }
        }
        Ok(events)
    }

    /// The next control frame to send.
    pub fn poll_control(&mut self) -> Option<Control> {
        if self.down.ack_due && self.phase == Phase::Ready && self.version >= DOWNLINK_VERSION {
            let d = &mut self.down;
            d.ack_due = false;
            let ack = DownAck {
                up_to: d.done,
                refused: d.refused[d.reported.0..].iter().take(MAX_DOWN_REPORT).cloned().collect(),
                expired: d.expired[d.reported.1..].iter().take(MAX_DOWN_REPORT).copied().collect(),
            };
            d.reported.0 += ack.refused.len();
            d.reported.1 += ack.expired.len();
            // More than one ack's worth goes in the next one.
            d.ack_due = d.reported.0 < d.refused.len() || d.reported.1 < d.expired.len();
            self.out.push_back(Control::DownAck(ack));
        }
        self.out.pop_front()
    }

    fn handle_down(&mut self, d: Box<Down>, events: &mut Vec<EdgeEvent>) -> Result<(), SessionError> {
        if self.version < DOWNLINK_VERSION {
            return Err(SessionError::Protocol(format!("a downlink message on a version {} session", self.version)));
        }
        let state = &mut self.down;
        if d.seq <= state.done {
            // Sent again after a reconnect: done already, the cloud only needs to hear it.
            state.ack_due = true;
            return Ok(());
        }
        if d.seq <= state.received {
            return Err(SessionError::Protocol(format!(
                "downlink message {} after {}: out of order",
                d.seq, state.received
            )));
        }
        // What the cloud has not marked is kept (and rewritten with every mark): a bridge that
        // never marks must not grow it without end.
        if state.refused.len() + state.expired.len() >= MAX_DOWN_REPORT {
            return Err(SessionError::Protocol(format!(
                "{} downlink refusals and expiries the cloud has not marked",
                state.refused.len() + state.expired.len()
            )));
        }
        // What this edge announced holds from version 9; an older bridge knows no announcement
        // and is held to what every edge held before.
        let (messages, bytes) = match self.version >= DOWN_WINDOW_VERSION {
            true => (self.config.max_down_pending, self.config.max_down_bytes),
            false => (MAX_DOWN_WINDOW, usize::MAX),
        };
        if state.pending.len() >= messages {
            return Err(SessionError::Protocol(format!("more than {messages} downlink messages unanswered")));
        }
        if !state.pending.is_empty() && state.pending_bytes >= bytes {
            return Err(SessionError::Protocol(format!(
                "a downlink message past the {bytes} bytes this edge announced: {} held unanswered in {} messages",
                state.pending_bytes,
                state.pending.len()
            )));
        }
        let weight = d.weight();
        state.received = d.seq;
        state.pending.push_back((d.seq, weight));
        state.pending_bytes += weight;
        events.push(EdgeEvent::Down(d));
        Ok(())
    }

    /// The driver finished downlink message `seq` (the oldest one not done) and made that
    /// durable; an ack goes out with the next control frames.
    pub fn down_done(&mut self, seq: u64, outcome: DownOutcome) -> Result<(), SessionError> {
        let d = &mut self.down;
        let Some(&(_, weight)) = d.pending.front().filter(|(oldest, _)| *oldest == seq) else {
            return Err(SessionError::Protocol(format!(
                "downlink message {seq} finished, but the oldest waiting is {:?} (done through {})",
                d.pending.front().map(|(s, _)| s),
                d.done
            )));
        };
        d.pending.pop_front();
        d.pending_bytes -= weight;
        d.done = seq;
        match outcome {
            DownOutcome::Delivered => {}
            DownOutcome::Refused(reason) => d.refused.push(DownRefusal { seq, reason: clip_reason(reason) }),
            DownOutcome::Expired => d.expired.push(seq),
        }
        d.ack_due = true;
        Ok(())
    }

    /// Takes the downlink's state as the driver last stored it, if it is further than this
    /// session's (another session of the node, for a spool of another epoch, went on meanwhile):
    /// before [`EdgeSession::connected`].
    pub fn catch_up_down(&mut self, done: u64, refused: Vec<DownRefusal>, expired: Vec<u64>) {
        if done > self.down.done {
            self.down = DownState { done, received: done, refused, expired, ..DownState::default() };
        }
    }

    /// The oldest downlink message received on this connection and not yet done.
    pub fn down_oldest_pending(&self) -> Option<u64> {
        self.down.pending.front().map(|(seq, _)| *seq)
    }

    /// The downlink position: done through this seq.
    #[cfg(test)]
    pub(crate) fn down_position(&self) -> u64 {
        self.down.done
    }

    /// Refusals the cloud has not marked yet, for the driver to keep across a restart.
    #[cfg(test)]
    pub(crate) fn down_unmarked(&self) -> (&[DownRefusal], &[u64]) {
        (&self.down.refused, &self.down.expired)
    }

    /// Queues the TCO model's classes for the bridge's fleet report; dropped unless connected.
    pub fn report_classes(&mut self, report: super::ClassesReport) {
        if self.phase == Phase::Ready {
            self.out.push_back(Control::Classes(report));
        }
    }

    /// Queues a dictionary announcement; send it before the first batch that uses it.
    pub fn announce_dict(&mut self, dict: DictAnnounce) {
        self.out.push_back(Control::Dict(dict));
    }

    /// Whether a batch may be sent now.
    pub fn can_send(&self) -> bool {
        self.phase == Phase::Ready && self.inflight.len() < self.config.window
    }

    /// The seq the next batch of `lane` starts at.
    pub fn next_seq(&self, lane: u8) -> u64 {
        self.lanes.get(&lane).map_or(1, |p| p.sent + 1)
    }

    /// A batch of `lane` with seqs `first..=last` was sent.
    pub fn sent(&mut self, lane: u8, first: u64, last: u64, now: Instant) -> Result<(), SessionError> {
        if !self.can_send() {
            return Err(SessionError::Protocol("batch sent while the session cannot send".into()));
        }
        let p = self.lanes.entry(lane).or_default();
        // Batches tile the seq space: each starts right after the previous one (records the
        // spool dropped leave holes inside a batch, accounted for by gap records).
        if first != p.sent + 1 || last < first {
            return Err(SessionError::Protocol(format!(
                "batch {first}..={last} of lane {lane} does not follow {}",
                p.sent
            )));
        }
        p.sent = last;
        self.inflight.push_back(InFlight { lane, last, sent: now });
        Ok(())
    }

    /// When [`EdgeSession::handle_timeout`] should run next. Once degraded, the late ack or
    /// pong that made it so is no deadline any more (only a frame ends the state): left in, it
    /// was a deadline in the past after every `handle_timeout`, and the driver spun a core until
    /// the connection ended (10,000 simulated edges did, through a bridge restart).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timeout = self.config.ack_timeout;
        let late = (!self.degraded)
            .then(|| [self.inflight.front().map(|f| f.sent + timeout), self.ping.map(|(_, t)| t + timeout)]);
        late.into_iter().flatten().chain([self.next_ping]).flatten().min()
    }

    /// Sends pings when due and updates the degraded state.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<EdgeEvent> {
        let mut events = Vec::new();
        if matches!(self.phase, Phase::Ready | Phase::AwaitWelcome) && self.next_ping.is_some_and(|t| now >= t) {
            if self.ping.is_none() {
                self.nonce += 1;
                self.ping = Some((self.nonce, now));
                self.out.push_back(Control::Ping { nonce: self.nonce });
                if !self.heads.is_empty() {
                    let lanes = self.heads.iter().map(|(l, s)| LaneSeq { lane: Lane(*l), seq: Seq(*s) }).collect();
                    self.out.push_back(Control::Heads { lanes, spool: self.spool });
                }
            }
            self.next_ping = Some(now + self.config.keepalive);
        }
        self.update_degraded(now, &mut events);
        events
    }

    fn update_degraded(&mut self, now: Instant, events: &mut Vec<EdgeEvent>) {
        let late = |t: Instant| now.saturating_duration_since(t) >= self.config.ack_timeout;
        let degraded = self.inflight.front().is_some_and(|f| late(f.sent)) || self.ping.is_some_and(|(_, t)| late(t));
        if degraded != self.degraded {
            self.degraded = degraded;
            events.push(EdgeEvent::Degraded(degraded));
        }
    }

    /// The spool's last committed seq of `lane`, reported to the cloud with each ping.
    pub fn set_head(&mut self, lane: u8, seq: u64) {
        self.heads.insert(lane, seq);
    }

    /// What the spool says of itself, reported to the cloud with the heads.
    pub fn set_spool_report(&mut self, report: SpoolReport) {
        self.spool = Some(report);
    }

    /// How many times the cloud welcomed this session (a connection got as far as sending).
    pub fn welcomes(&self) -> u64 {
        self.welcomes
    }

    #[cfg(test)]
    pub(crate) fn is_degraded(&self) -> bool {
        self.degraded
    }

    pub fn acked(&self, lane: u8) -> u64 {
        self.lanes.get(&lane).map_or(0, |p| p.acked)
    }

    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }
}

/// A frame's name for error messages.
pub(crate) fn name(frame: &Control) -> &'static str {
    match frame {
        Control::Hello(_) => "hello",
        Control::Welcome(_) => "welcome",
        Control::Refused { .. } => "refused",
        Control::Ack(_) => "ack",
        Control::Ping { .. } => "ping",
        Control::Pong { .. } => "pong",
        Control::Dict(_) => "dict",
        Control::DictStored { .. } => "dict stored",
        Control::Heads { .. } => "heads",
        Control::Classes(_) => "classes",
        Control::Model(_) => "model",
        Control::Down(_) => "down",
        Control::DownAck(_) => "down ack",
        Control::DownMarked { .. } => "down marked",
        Control::Unknown => "unknown frame",
    }
}
