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

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::{Control, DictAnnounce, Hello, LaneSeq, SpoolReport, VERSIONS};

#[derive(Debug, Clone)]
pub struct EdgeSessionConfig {
    /// Batches in flight at most.
    pub window: usize,
    pub keepalive: Duration,
    pub ack_timeout: Duration,
}

impl Default for EdgeSessionConfig {
    fn default() -> Self {
        Self { window: 8, keepalive: Duration::from_secs(5), ack_timeout: Duration::from_secs(2) }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
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
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
        }
    }

    /// The protocol version the cloud's Welcome chose (0 before one): what batches are framed
    /// in.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Speaks these versions instead of this build's (for tests of mixed fleets).
    pub fn with_versions(mut self, versions: Vec<u16>) -> Self {
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
            lanes: self.lanes.iter().map(|(l, p)| LaneSeq { lane: *l, seq: p.acked + 1 }).collect(),
            models: self.models.clone(),
            dicts: self.dicts.clone(),
            caps: vec!["zstd".into(), "zstd-dict".into()],
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
    }

    pub fn phase(&self) -> Phase {
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
                if let Some(bad) = w.committed.iter().find(|l| l.seq > super::MAX_SEQ) {
                    return Err(SessionError::Protocol(format!(
                        "welcome says lane {} is committed through seq {}, past the highest seq there is",
                        bad.lane, bad.seq
                    )));
                }
                for LaneSeq { lane, seq } in w.committed {
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
                events.push(EdgeEvent::Ready { version: w.version, dicts: w.dicts, sink: w.sink });
            }
            Control::Refused { reason } => {
                self.phase = Phase::Refused;
                return Err(SessionError::Refused(reason));
            }
            Control::Ack(a) if self.phase == Phase::Ready => {
                let p = self.lanes.entry(a.lane).or_default();
                if a.up_to > p.sent {
                    return Err(SessionError::Protocol(format!(
                        "ack of lane {} up to {} but only {} was sent",
                        a.lane, a.up_to, p.sent
                    )));
                }
                if a.up_to > p.acked {
                    p.acked = a.up_to;
                    events.push(EdgeEvent::Acked { lane: a.lane, up_to: a.up_to });
                }
                self.inflight.retain(|f| {
                    let done = f.lane == a.lane && f.last <= a.up_to;
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
        self.out.pop_front()
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
                    let lanes = self.heads.iter().map(|(l, s)| LaneSeq { lane: *l, seq: *s }).collect();
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

    pub fn is_degraded(&self) -> bool {
        self.degraded
    }

    pub fn rtt(&self) -> Option<Duration> {
        self.rtt
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
        Control::Unknown => "unknown frame",
    }
}
