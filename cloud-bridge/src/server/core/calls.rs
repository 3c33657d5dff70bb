//! What a session asks of the sink besides its records: the hello's lookups (the epoch
//! admitted, the marks, the dictionaries), dictionaries and TCO reports the edge sends
//! ([`SessionCore::poll_call`], [`SessionCore::handle_answer`]: one at a time, the session's
//! frames read once each is answered), and the downlink's calls on a lane of their own
//! ([`SessionCore::poll_down_call`], [`SessionCore::handle_down_answer`]: made beside the rest,
//! and a failure pauses the downlink, never the session or its telemetry). What the driver
//! must do beyond the sink comes as [`Event`]s.

use std::time::Instant;

use shared::proto::cloud::{HelloReceived, Request};
use shared::proto::edge::SessionError;
use shared::proto::{ClassesReport, Control, DOWNLINK_VERSION, DictAnnounce, LaneSeq, SinkLimits, compress};

use super::{CoreError, SessionCore};
use crate::downlink::core::{DownAnswer, DownCall};

use crate::sink::{EpochVerdict, SinkError};

/// A sink call for the session's edge.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// [`crate::sink::RecordSink::admit_epoch`].
    AdmitEpoch { epoch: String },
    /// [`crate::sink::RecordSink::committed`], with [`crate::sink::RecordSink::record_limits`].
    Committed { epoch: String },
    /// [`crate::sink::DictStore::load_dicts`].
    LoadDicts { ids: Vec<String> },
    /// [`crate::sink::DictStore::store_dict`].
    StoreDict(DictAnnounce),
    /// [`crate::sink::FleetStore::store_report`]; a failure costs the edge nothing but the
    /// report.
    StoreReport(ClassesReport),
}

/// What the sink answered to a [`Call`].
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Admitted(EpochVerdict),
    Committed { lanes: Vec<LaneSeq>, limits: Option<SinkLimits> },
    Dicts(Vec<(String, Vec<u8>)>),
    DictStored,
    ReportStored,
}

/// What the driver must do beyond the sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The edge was welcomed: its presence, its models (served and announced), the log.
    Welcomed { epoch: String, version: u16, committed: Vec<LaneSeq>, dicts: usize, models: Vec<String> },
    /// A dictionary the batches may use (stored by the edge now, or loaded for its hello).
    Dict { id: String, bytes: Vec<u8>, stored: bool },
    /// The downlink runs: news of this edge's messages should wake it ([`SessionCore::woken`]).
    DownStarted,
}

/// What the call in flight was for.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Asked {
    Admit,
    Committed,
    Dicts,
    DictStored(DictAnnounce),
    Report,
}

impl<H> SessionCore<H> {
    /// A control frame from the edge. A frame that breaks the protocol ends the session once
    /// what was queued for the edge (a `Refused`) is sent ([`CoreError::Refused`]).
    pub fn handle_control(&mut self, frame: Control, now: Instant) -> Result<(), CoreError> {
        let request = self.session.handle(frame).map_err(|error| CoreError::Refused { label: None, error })?;
        match request {
            Some(Request::Hello(hello)) => {
                self.calls.push_back((Call::AdmitEpoch { epoch: hello.epoch.clone() }, Asked::Admit));
                self.hello = Some(Hello { received: hello, committed: Vec::new(), limits: None });
            }
            Some(Request::StoreDict(dict)) => {
                self.calls.push_back((Call::StoreDict(dict.clone()), Asked::DictStored(dict)));
            }
            Some(Request::Classes(report)) => self.calls.push_back((Call::StoreReport(report), Asked::Report)),
            // The session refuses an ack before the downlink started.
            Some(Request::DownAcked(ack)) => {
                let wall = self.wall_ms(now);
                if let Some(down) = self.down.as_mut() {
                    down.handle_ack(&mut self.session, ack, wall)?;
                }
            }
            None => {}
        }
        Ok(())
    }

    /// The next sink call to make, once the one before it was answered.
    pub fn poll_call(&mut self) -> Option<Call> {
        if self.asked.is_some() {
            return None;
        }
        let (call, asked) = self.calls.pop_front()?;
        self.asked = Some(asked);
        Some(call)
    }

    /// The downlink's next sink call, once the one before it was answered.
    pub fn poll_down_call(&mut self, now: Instant) -> Option<DownCall> {
        self.down.as_mut()?.poll_call(&self.session, now)
    }

    /// The sink's answer to the downlink's call made last. A failure pauses the downlink (the
    /// call is made again later); only a broken protocol ends the session.
    pub fn handle_down_answer(&mut self, answer: Result<DownAnswer, SinkError>, now: Instant) -> Result<(), CoreError> {
        let wall = self.wall_ms(now);
        let Some(down) = self.down.as_mut() else { return Ok(()) };
        match answer {
            Err(e) => {
                tracing::warn!(edge = self.edge, error = %e, "downlink: sink call failed; the downlink waits, the session goes on");
                down.handle_error(now);
            }
            Ok(answer) => {
                let was_running = down.is_running();
                down.handle_answer(&mut self.session, answer, wall).map_err(CoreError::Session)?;
                if !was_running && down.is_running() {
                    self.events.push_back(Event::DownStarted);
                }
            }
        }
        Ok(())
    }

    /// The sink's answer to the call made last. A failure ends the session (the edge comes
    /// back, to this bridge or another), but for a report, which costs only itself.
    pub fn handle_answer(&mut self, answer: Result<Answer, SinkError>) -> Result<(), CoreError> {
        let Some(asked) = self.asked.take() else { return Ok(()) };
        let answer = match (answer, &asked) {
            (Err(e), Asked::Report) => {
                tracing::warn!(edge = self.edge, error = %e, "TCO report not stored");
                return Ok(());
            }
            (Err(e), _) => return Err(CoreError::Sink(e)),
            (Ok(a), _) => a,
        };
        match (asked, answer) {
            (Asked::Admit, Answer::Admitted(verdict)) => {
                let Some(hello) = &self.hello else { return Ok(()) };
                if let Some((label, why)) = epoch_refusal(&verdict) {
                    let epoch = hello.received.epoch.clone();
                    let error = self.session.refuse(format!("epoch {epoch} of edge {}: {why}", self.edge));
                    return Err(CoreError::Refused { label: Some(label), error });
                }
                let epoch = hello.received.epoch.clone();
                self.calls.push_back((Call::Committed { epoch }, Asked::Committed));
            }
            (Asked::Committed, Answer::Committed { lanes, limits }) => {
                let Some(hello) = self.hello.as_mut() else { return Ok(()) };
                hello.committed = lanes;
                hello.limits = limits;
                let ids = hello.received.dicts.clone();
                self.calls.push_back((Call::LoadDicts { ids }, Asked::Dicts));
            }
            (Asked::Dicts, Answer::Dicts(dicts)) => self.welcome(dicts),
            (Asked::DictStored(dict), Answer::DictStored) => {
                tracing::info!(
                    edge = self.edge,
                    id = dict.id,
                    class = dict.class,
                    bytes = dict.bytes.len(),
                    "dictionary stored"
                );
                self.events.push_back(Event::Dict { id: dict.id.clone(), bytes: dict.bytes, stored: true });
                self.session.dict_stored(dict.id);
            }
            (Asked::Report, Answer::ReportStored) => {}
            (asked, answer) => {
                return Err(CoreError::Session(SessionError::Protocol(format!(
                    "the sink answered {answer:?} to {asked:?} (a bug)"
                ))));
            }
        }
        Ok(())
    }

    /// The hello's lookups are done: the dictionaries the sink holds (checked against their
    /// ids: shared storage is trusted no more than the edge), the welcome, the downlink.
    fn welcome(&mut self, dicts: Vec<(String, Vec<u8>)>) {
        let Some(hello) = self.hello.take() else { return };
        let mut known = Vec::new();
        for (id, bytes) in dicts {
            if compress::dict_id_for(self.session.version(), &bytes) == id {
                self.session.add_dict(id.clone(), bytes.clone());
                self.events.push_back(Event::Dict { id: id.clone(), bytes, stored: false });
                known.push(id);
            }
        }
        let HelloReceived { epoch, version, models, down_mark, .. } = hello.received;
        self.session.set_sink_limits(hello.limits);
        let dicts = known.len();
        self.session.welcome(hello.committed.clone(), known);
        self.events.push_back(Event::Welcomed { epoch, version, committed: hello.committed, dicts, models });
        if self.session.version() >= DOWNLINK_VERSION
            && let Some(down) = self.down.as_mut()
        {
            down.start(down_mark);
        }
    }

    /// News came of this edge's downlink messages.
    pub fn woken(&mut self) {
        if let Some(down) = self.down.as_mut() {
            down.woken();
        }
    }

    /// What the driver must do next beyond the sink.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}

/// A hello being looked up.
#[derive(Debug)]
pub(super) struct Hello {
    received: HelloReceived,
    committed: Vec<LaneSeq>,
    limits: Option<SinkLimits>,
}

/// The `connections_refused` reason for an epoch the sink would not admit, and why.
fn epoch_refusal(verdict: &EpochVerdict) -> Option<(&'static str, &'static str)> {
    match verdict {
        EpochVerdict::Known | EpochVerdict::Added { .. } => None,
        EpochVerdict::Retired => Some((
            "epoch_retired",
            "retired after limits.epochs_per_edge newer ones; its marks are gone, so its records could not be told \
             from new ones (a spool restored from an old copy?)",
        )),
        EpochVerdict::Exhausted => Some((
            "epochs_exhausted",
            "a new epoch, and the edge has used limits.epochs_per_edge + limits.retired_epochs_per_edge already",
        )),
    }
}
