//! The cloud's side of a bridge session, without I/O. The driver (a connection task in
//! `cloud-bridge`) hands it control frames and batches; it answers what to write to the sink,
//! in which order, and what to send back.
//!
//! Rules it keeps:
//! - Nothing but a `Hello` before the `Welcome`; a hello without a common version is answered
//!   with `Refused` naming both version lists.
//! - Per lane, batches are released to the sink in seq order over a contiguous prefix: a batch
//!   that arrives ahead of a missing one (streams overtake each other) is held, up to a bound.
//!   Records at or below what was already released are skipped, so a resend after a reconnect
//!   never reaches the sink twice.
//! - An ack goes out only for what the driver reports committed, and acks are cumulative.
//! - A dictionary is checked against its id (a hash of its bytes) and size, and confirmed to
//!   the edge only after the driver stored it where every bridge finds it.
//! - Downlink messages (version 5, [`super::down`]) go out in increasing seq order from the
//!   position the driver starts them at, at most a window (messages and bytes) unanswered: the
//!   driver's, or the one the edge's hello announces where that is smaller (version 9). An ack
//!   may not claim more than was sent, and moves the window.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::down::{DownAck, MAX_DOWN_REPORT, MAX_REFUSAL_REASON};
use super::edge::{SessionError, name};
use super::{
    Ack, Batch, Control, DOWN_WINDOW_VERSION, DOWNLINK_VERSION, DictAnnounce, Lane, LaneSeq, MAX_DICT_BYTES, MAX_DICTS,
    Seq, SpoolReport, VERSIONS, Welcome, negotiate,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloudPhase {
    AwaitHello,
    /// Hello received; the driver looks up the committed seqs and calls `welcome`.
    LookingUp,
    Ready,
    Refused,
}

/// The edge said hello: look up what is committed for (edge, epoch) and call
/// [`CloudSession::welcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloReceived {
    pub epoch: String,
    pub version: u16,
    pub lanes: Vec<LaneSeq>,
    pub models: Vec<String>,
    /// Dictionaries the edge may use: load those the cloud holds before the welcome.
    pub dicts: Vec<String>,
    /// The edge's downlink position (version 5; 0 from older edges).
    pub down_mark: u64,
}

/// What the driver must do for a control frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Hello(HelloReceived),
    /// Store this dictionary where every bridge finds it, then call
    /// [`CloudSession::dict_stored`].
    StoreDict(DictAnnounce),
    /// Keep this edge's TCO classes for the fleet report (the latest replaces the last).
    Classes(super::ClassesReport),
    /// The edge is done with its downlink through `up_to`: record that position and the
    /// refusals, then call [`CloudSession::down_marked`].
    DownAcked(DownAck),
}

/// How much of the downlink may be unanswered at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownWindow {
    pub messages: usize,
    pub bytes: usize,
}

impl Default for DownWindow {
    fn default() -> Self {
        Self { messages: 64, bytes: 4 << 20 }
    }
}

/// The downlink's progress on the cloud's side.
#[derive(Debug, Default)]
struct CloudDown {
    /// Started by the driver, at the position it read.
    started: bool,
    sent: u64,
    acked: u64,
    /// Sent and not acked: seq and weight.
    inflight: VecDeque<(u64, usize)>,
    bytes: usize,
    window: DownWindow,
}

/// A batch the sink may take now: write its records with seq above `skip_through`, in order,
/// then report [`CloudSession::committed`] with `batch.last_seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub skip_through: u64,
    pub batch: Batch,
}

#[derive(Debug, Default)]
struct CloudLane {
    committed: u64,
    released: u64,
    /// Batches that arrived ahead of a missing one, by first seq.
    held: BTreeMap<u64, Batch>,
}

#[derive(Debug)]
pub struct CloudSession {
    versions: Vec<u16>,
    phase: CloudPhase,
    epoch: Option<String>,
    version: u16,
    lanes: BTreeMap<u8, CloudLane>,
    held: usize,
    max_held: usize,
    dicts: HashMap<String, Vec<u8>>,
    out: VecDeque<Control>,
    /// The edge's last committed seq per lane, from its `Heads`.
    heads: BTreeMap<u8, u64>,
    /// Per lane, the lowest seq the edge still holds, from its hello.
    holds: BTreeMap<u8, u64>,
    /// What the edge's spool said of itself last.
    spool: Option<SpoolReport>,
    /// Bumped whenever something the fleet view shows changed (heads, marks, the spool's
    /// report), so the driver can tell without comparing.
    changes: u64,
    /// What the sink can store of one record, told to version 3 edges in the Welcome.
    sink: Option<super::SinkLimits>,
    down: CloudDown,
}

impl CloudSession {
    /// A session that holds at most `max_held` out-of-order batches.
    pub fn new(max_held: usize) -> Self {
        Self {
            versions: VERSIONS.to_vec(),
            phase: CloudPhase::AwaitHello,
            epoch: None,
            version: 0,
            lanes: BTreeMap::new(),
            held: 0,
            max_held,
            dicts: HashMap::new(),
            out: VecDeque::new(),
            heads: BTreeMap::new(),
            holds: BTreeMap::new(),
            spool: None,
            changes: 0,
            sink: None,
            down: CloudDown::default(),
        }
    }

    /// Sends the downlink within `window`, and never more messages at once than an edge holds
    /// ([`super::down::MAX_DOWN_WINDOW`]).
    pub fn with_down_window(mut self, window: DownWindow) -> Self {
        let messages = window.messages.clamp(1, super::down::MAX_DOWN_WINDOW);
        self.down.window = DownWindow { messages, ..window };
        self
    }

    /// The downlink's window, as held.
    pub fn down_window(&self) -> DownWindow {
        self.down.window
    }

    /// The sink's limits on one record, for the Welcome of a version 3 session; before
    /// [`CloudSession::welcome`].
    pub fn set_sink_limits(&mut self, sink: Option<super::SinkLimits>) {
        self.sink = sink;
    }

    /// Speaks these versions instead of this build's (for tests of mixed fleets).
    pub fn with_versions(mut self, versions: Vec<u16>) -> Self {
        self.versions = versions;
        self
    }

    #[cfg(test)]
    pub(crate) fn phase(&self) -> CloudPhase {
        self.phase
    }

    pub fn epoch(&self) -> Option<&str> {
        self.epoch.as_deref()
    }

    pub fn version(&self) -> u16 {
        self.version
    }

    /// Dictionaries the edge announced on this connection (and any the driver added).
    pub fn dicts(&self) -> &HashMap<String, Vec<u8>> {
        &self.dicts
    }

    /// Adds a dictionary the driver found in shared storage.
    pub fn add_dict(&mut self, id: String, bytes: Vec<u8>) {
        self.dicts.insert(id, bytes);
    }

    /// Handles a control frame. Returns what the driver must look up or store, if anything.
    pub fn handle(&mut self, frame: Control) -> Result<Option<Request>, SessionError> {
        match frame {
            Control::Hello(h) if self.phase == CloudPhase::AwaitHello => {
                let Some(version) = negotiate(&self.versions, &h.versions) else {
                    let error = SessionError::NoCommonVersion { ours: self.versions.clone(), theirs: h.versions };
                    self.out.push_back(Control::Refused { reason: error.to_string() });
                    self.phase = CloudPhase::Refused;
                    return Err(error);
                };
                // The epoch names keys in the sink (a KV key, a column): letters, digits, `-`
                // and `_` only, so no epoch can make a key the sink refuses or another edge's.
                let usable = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
                if h.epoch.is_empty() || h.epoch.len() > 64 || !h.epoch.chars().all(usable) {
                    return Err(SessionError::Protocol(format!("hello with an unusable epoch {:?}", h.epoch)));
                }
                if version >= DOWNLINK_VERSION && h.down_mark > super::MAX_SEQ {
                    return Err(SessionError::Protocol(format!(
                        "hello claims downlink position {}, past the highest seq there is ({})",
                        h.down_mark,
                        super::MAX_SEQ
                    )));
                }
                if let Some(bad) = h.lanes.iter().find(|l| l.seq.0 == 0 || l.seq.0 > super::MAX_SEQ) {
                    return Err(SessionError::Protocol(format!(
                        "hello says lane {} holds seqs from {}, outside 1..={}",
                        bad.lane,
                        bad.seq,
                        super::MAX_SEQ
                    )));
                }
                if version >= DOWN_WINDOW_VERSION
                    && let Some(w) = h.down_window
                {
                    if w.messages == 0 || w.bytes == 0 {
                        return Err(SessionError::Protocol(format!(
                            "hello announces a downlink window of {} messages and {} bytes: none would ever be sent",
                            w.messages, w.bytes
                        )));
                    }
                    // The smaller of the two ends' windows: the edge ends a session past its own.
                    let ours = self.down.window;
                    self.down.window = DownWindow {
                        messages: ours.messages.min(usize::try_from(w.messages).unwrap_or(usize::MAX)),
                        bytes: ours.bytes.min(usize::try_from(w.bytes).unwrap_or(usize::MAX)),
                    };
                }
                self.version = version;
                self.epoch = Some(h.epoch.clone());
                self.holds = h.lanes.iter().map(|l| (l.lane.0, l.seq.0)).collect();
                self.phase = CloudPhase::LookingUp;
                if h.models.len() > super::MAX_MODELS {
                    return Err(SessionError::Protocol(format!(
                        "hello follows {} models, more than {}",
                        h.models.len(),
                        super::MAX_MODELS
                    )));
                }
                if h.dicts.len() > MAX_DICTS {
                    return Err(SessionError::Protocol(format!(
                        "hello names {} dictionaries, more than {MAX_DICTS}",
                        h.dicts.len()
                    )));
                }
                Ok(Some(Request::Hello(HelloReceived {
                    epoch: h.epoch,
                    version,
                    lanes: h.lanes,
                    models: h.models,
                    dicts: h.dicts,
                    down_mark: if version >= DOWNLINK_VERSION { h.down_mark } else { 0 },
                })))
            }
            Control::Ping { nonce } => {
                self.out.push_back(Control::Pong { nonce });
                Ok(None)
            }
            Control::Pong { .. } | Control::Unknown => Ok(None),
            Control::Heads { lanes, spool } => {
                for LaneSeq { lane, seq } in lanes {
                    if self.heads.insert(lane.0, seq.0) != Some(seq.0) {
                        self.changes += 1;
                    }
                }
                if spool.is_some() && spool != self.spool {
                    self.spool = spool;
                    self.changes += 1;
                }
                Ok(None)
            }
            Control::Classes(report) if self.phase == CloudPhase::Ready => {
                if report.classes.len() > super::MAX_REPORT_CLASSES {
                    return Err(SessionError::Protocol(format!(
                        "a classes report of {} classes, more than {}",
                        report.classes.len(),
                        super::MAX_REPORT_CLASSES
                    )));
                }
                if let Some(problem) = report.classes.iter().find_map(super::report_problem) {
                    return Err(SessionError::Protocol(format!("a classes report: {problem}")));
                }
                Ok(Some(Request::Classes(report)))
            }
            Control::Dict(d) if self.phase == CloudPhase::Ready => {
                if super::compress::dict_id_for(self.version, &d.bytes) != d.id {
                    return Err(SessionError::Protocol(format!("dictionary {} does not hash to its id", d.id)));
                }
                if d.bytes.len() > MAX_DICT_BYTES {
                    return Err(SessionError::Protocol(format!(
                        "dictionary {} of {} bytes, more than {MAX_DICT_BYTES}",
                        d.id,
                        d.bytes.len()
                    )));
                }
                if !self.dicts.contains_key(&d.id) && self.dicts.len() >= MAX_DICTS {
                    return Err(SessionError::Protocol(format!(
                        "more than {MAX_DICTS} dictionaries on one connection"
                    )));
                }
                self.dicts.insert(d.id.clone(), d.bytes.clone());
                Ok(Some(Request::StoreDict(d)))
            }
            Control::DownAck(ack) if self.phase == CloudPhase::Ready && self.version >= DOWNLINK_VERSION => {
                self.handle_down_ack(ack).map(|a| a.map(Request::DownAcked))
            }
            other => Err(SessionError::Protocol(format!(
                "unexpected {} from the edge in phase {:?}",
                name(&other),
                self.phase
            ))),
        }
    }

    /// Refuses the edge for `reason` found by the driver (after the hello): the `Refused` frame
    /// is queued, and the returned error ends the session once it is sent.
    pub fn refuse(&mut self, reason: String) -> SessionError {
        self.out.push_back(Control::Refused { reason: reason.clone() });
        self.phase = CloudPhase::Refused;
        SessionError::Refused(reason)
    }

    /// Announces a model version to the edge; only once the session is ready (the welcome
    /// goes first).
    pub fn announce_model(&mut self, announce: super::ModelAnnounce) -> bool {
        if self.phase != CloudPhase::Ready {
            return false;
        }
        self.out.push_back(Control::Model(announce));
        true
    }

    /// The dictionary `id` is stored: the edge may use it.
    pub fn dict_stored(&mut self, id: String) {
        self.out.push_back(Control::DictStored { id });
    }

    /// Answers the hello: `committed` holds, per lane, the highest seq of this edge and epoch
    /// the sink has; `dicts` the dictionary ids it knows.
    ///
    /// A lane whose mark is below what the edge still holds (the sink lost marks: restored
    /// from a backup, a bucket recreated, a new SQLite file) resumes where the edge's records
    /// start: what lies between was acked before and is gone from the edge, and waiting for it
    /// would stall the lane for good.
    pub fn welcome(&mut self, committed: Vec<LaneSeq>, dicts: Vec<String>) {
        for LaneSeq { lane, seq } in &committed {
            let l = self.lanes.entry(lane.0).or_default();
            l.committed = seq.0;
            l.released = seq.0;
        }
        for (lane, low) in std::mem::take(&mut self.holds) {
            let l = self.lanes.entry(lane).or_default();
            l.released = l.released.max(low - 1);
        }
        let sink = self.sink.filter(|_| self.version >= 3);
        self.out.push_back(Control::Welcome(Welcome { version: self.version, committed, dicts, sink }));
        self.phase = CloudPhase::Ready;
        self.changes += 1;
    }

    /// Handles a batch from a unidirectional stream; returns the batches the sink may take now,
    /// in order.
    pub fn handle_batch(&mut self, mut batch: Batch) -> Result<Vec<Release>, SessionError> {
        if self.phase != CloudPhase::Ready {
            return Err(SessionError::Protocol(format!("batch in phase {:?}", self.phase)));
        }
        if batch.epoch.is_empty() {
            batch.epoch = self.epoch.clone().unwrap_or_default();
        }
        if Some(batch.epoch.as_str()) != self.epoch.as_deref() {
            return Err(SessionError::Protocol(format!(
                "batch of epoch {} on a session of epoch {}",
                batch.epoch,
                self.epoch.as_deref().unwrap_or("")
            )));
        }
        let (first, last) = (batch.first_seq.0, batch.last_seq.0);
        if last < first || first == 0 || last > super::MAX_SEQ {
            return Err(SessionError::Protocol(format!("batch seqs {}..={}", batch.first_seq, batch.last_seq)));
        }
        let lane_id = batch.lane.0;
        let lane = self.lanes.entry(lane_id).or_default();
        if last <= lane.released {
            // A resend of what the sink has or is taking: re-ack what is committed.
            if lane.committed > 0 {
                self.out.push_back(Control::Ack(Ack { lane: Lane(lane_id), up_to: Seq(lane.committed) }));
            }
            return Ok(Vec::new());
        }
        if first > lane.released + 1 {
            if self.held >= self.max_held {
                return Err(SessionError::Protocol(format!(
                    "more than {} batches ahead of a missing one (lane {lane_id} waits for seq {})",
                    self.max_held,
                    lane.released + 1
                )));
            }
            if lane.held.insert(first, batch).is_none() {
                self.held += 1;
            }
            return Ok(Vec::new());
        }
        let mut released = vec![Release { skip_through: lane.released, batch }];
        lane.released = last;
        while let Some(entry) = lane.held.first_entry() {
            if *entry.key() > lane.released + 1 {
                break;
            }
            let next = entry.remove();
            self.held -= 1;
            if next.last_seq.0 > lane.released {
                let skip_through = lane.released;
                lane.released = next.last_seq.0;
                released.push(Release { skip_through, batch: next });
            }
        }
        Ok(released)
    }

    /// Whether the batch of `lane` starting at `first_seq` waits ahead of a missing one.
    pub fn is_held(&self, lane: u8, first_seq: u64) -> bool {
        self.lanes.get(&lane).is_some_and(|l| l.held.contains_key(&first_seq))
    }

    /// The sink committed `lane` through `up_to`: the edge gets a cumulative ack.
    pub fn committed(&mut self, lane: u8, up_to: u64) {
        let l = self.lanes.entry(lane).or_default();
        if up_to > l.committed {
            l.committed = up_to;
            self.changes += 1;
            self.out.push_back(Control::Ack(Ack { lane: Lane(lane), up_to: Seq(up_to) }));
        }
    }

    /// Per lane, the cloud's committed seq and the edge's last reported head, if it sent one.
    pub fn lane_positions(&self) -> Vec<(u8, u64, Option<u64>)> {
        let lanes = self.lanes.keys().chain(self.heads.keys()).copied().collect::<std::collections::BTreeSet<u8>>();
        lanes.into_iter().map(|lane| (lane, self.committed_seq(lane), self.heads.get(&lane).copied())).collect()
    }

    /// What the edge's spool said of itself last.
    pub fn spool_report(&self) -> Option<SpoolReport> {
        self.spool
    }

    /// A count that moves whenever heads, marks or the spool's report change.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Per lane the edge reported, how many seqs it holds beyond what the sink committed.
    pub fn lags(&self) -> Vec<(u8, u64)> {
        self.heads.iter().map(|(lane, head)| (*lane, head.saturating_sub(self.committed_seq(*lane)))).collect()
    }

    pub(crate) fn committed_seq(&self, lane: u8) -> u64 {
        self.lanes.get(&lane).map_or(0, |l| l.committed)
    }

    /// The next control frame to send.
    pub fn poll_control(&mut self) -> Option<Control> {
        self.out.pop_front()
    }

    /// An ack before the driver started the downlink (the one an edge sends after every
    /// welcome, to a bridge that does not deliver) asks nothing of it: `None`.
    fn handle_down_ack(&mut self, ack: DownAck) -> Result<Option<DownAck>, SessionError> {
        let d = &mut self.down;
        if !d.started {
            return Ok(None);
        }
        if ack.up_to < d.acked || ack.up_to > d.sent {
            return Err(SessionError::Protocol(format!(
                "downlink ack through {}, but {} was acked and {} the last sent",
                ack.up_to, d.acked, d.sent
            )));
        }
        if ack.refused.len() > MAX_DOWN_REPORT || ack.expired.len() > MAX_DOWN_REPORT {
            return Err(SessionError::Protocol(format!(
                "a downlink ack naming {} refused and {} expired messages, more than {MAX_DOWN_REPORT}",
                ack.refused.len(),
                ack.expired.len()
            )));
        }
        let past = ack.refused.iter().map(|r| r.seq).chain(ack.expired.iter().copied()).find(|s| *s > ack.up_to);
        if let Some(seq) = past {
            return Err(SessionError::Protocol(format!(
                "a downlink ack through {} names message {seq} after it",
                ack.up_to
            )));
        }
        if let Some(r) = ack.refused.iter().find(|r| r.reason.len() > MAX_REFUSAL_REASON) {
            return Err(SessionError::Protocol(format!(
                "a downlink refusal of {} bytes, more than {MAX_REFUSAL_REASON}",
                r.reason.len()
            )));
        }
        d.acked = ack.up_to;
        while d.inflight.front().is_some_and(|(seq, _)| *seq <= ack.up_to) {
            let (_, weight) = d.inflight.pop_front().expect("checked");
            d.bytes -= weight;
        }
        self.changes += 1;
        Ok(Some(ack))
    }

    /// Starts the downlink after `position` (the sink's mark, or the edge's if it is further):
    /// only on a version 5 session, after the welcome.
    pub fn start_down(&mut self, position: u64) -> bool {
        if self.phase != CloudPhase::Ready || self.version < DOWNLINK_VERSION {
            return false;
        }
        self.down = CloudDown {
            started: true,
            sent: position,
            acked: position,
            window: self.down.window,
            ..CloudDown::default()
        };
        true
    }

    /// Whether a downlink message may be sent now.
    pub fn down_room(&self) -> bool {
        let d = &self.down;
        d.started
            && self.phase == CloudPhase::Ready
            && d.inflight.len() < d.window.messages
            && (d.bytes < d.window.bytes || d.inflight.is_empty())
    }

    /// The position the next downlink message must come after.
    pub fn down_sent(&self) -> u64 {
        self.down.sent
    }

    /// Queues downlink message `d`, the next in order.
    pub fn send_down(&mut self, d: super::down::Down) -> Result<(), SessionError> {
        if !self.down_room() {
            return Err(SessionError::Protocol("downlink message sent without room for it".into()));
        }
        if d.seq <= self.down.sent || d.seq > super::MAX_SEQ {
            return Err(SessionError::Protocol(format!(
                "downlink message {} does not follow {}",
                d.seq, self.down.sent
            )));
        }
        let weight = d.weight();
        self.down.sent = d.seq;
        self.down.bytes += weight;
        self.down.inflight.push_back((d.seq, weight));
        self.out.push_back(Control::Down(Box::new(d)));
        Ok(())
    }

    /// The sink recorded the downlink position and the refusals through `up_to`.
    pub fn down_marked(&mut self, up_to: u64) {
        self.out.push_back(Control::DownMarked { up_to });
    }
}
