//! One session's part in the fleet view: its edge's state, handed to the recorder when the
//! session is welcomed, when what the view shows changed (at most once per interval), and at
//! its end.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rand::Rng;
use shared::proto::cloud::CloudSession;
use shared::units::now_ms;
use tokio::time::Instant;

use super::Recorder;
use crate::sink::{EdgeState, LaneState};

#[derive(Debug)]
pub struct Presence {
    recorder: Arc<Recorder>,
    state: EdgeState,
    welcomed: bool,
    /// The session's change count when `state` was taken, and when it was last handed over.
    taken: u64,
    handed: u64,
    /// When the next state may be handed over.
    next: Instant,
}

impl Presence {
    pub(crate) fn new(recorder: Arc<Recorder>, edge: &str, remote: std::net::SocketAddr) -> Self {
        let state = EdgeState {
            edge: edge.to_owned(),
            bridge: recorder.name().to_owned(),
            session: rand::thread_rng().r#gen(),
            connected: true,
            version: 0,
            epoch: String::new(),
            remote: remote.to_string(),
            connected_ms: now_ms(),
            seen_ms: now_ms(),
            lanes: Vec::new(),
            spool: None,
        };
        Self { recorder, state, welcomed: false, taken: 0, handed: 0, next: Instant::now() }
    }

    /// The session was welcomed: the edge is in the view from now on.
    pub(crate) fn welcomed(&mut self, session: &CloudSession) {
        if !self.welcomed {
            self.welcomed = true;
            self.recorder.live.fetch_add(1, Ordering::Relaxed);
        }
        self.state.version = session.version();
        self.state.epoch = session.epoch().unwrap_or_default().to_owned();
        self.take(session);
        self.hand_over();
    }

    /// When the session has news for the view that waits for its interval: the time to call
    /// [`Presence::update`].
    pub(crate) fn due(&self, session: &CloudSession) -> Option<Instant> {
        (self.welcomed && session.changes() != self.handed).then_some(self.next)
    }

    /// Takes the session's state if it changed, and hands it over if the interval is up.
    pub(crate) fn update(&mut self, session: &CloudSession) {
        if !self.welcomed {
            return;
        }
        if session.changes() != self.taken {
            self.take(session);
        }
        if self.taken != self.handed && Instant::now() >= self.next {
            self.hand_over();
        }
    }

    fn take(&mut self, session: &CloudSession) {
        self.taken = session.changes();
        self.state.lanes = session
            .lane_positions()
            .into_iter()
            .map(|(lane, committed, head)| LaneState { lane, committed, head })
            .collect();
        self.state.spool = session.spool_report();
        self.state.seen_ms = now_ms();
    }

    fn hand_over(&mut self) {
        self.handed = self.taken;
        self.next = Instant::now() + self.recorder.interval;
        self.recorder.submit(self.state.clone());
    }

    /// The session ended: its last state taken goes over as ended, whatever the interval.
    pub(crate) fn ended(mut self) {
        if !self.welcomed {
            return;
        }
        self.recorder.live.fetch_sub(1, Ordering::Relaxed);
        self.state.connected = false;
        self.state.seen_ms = now_ms();
        self.recorder.submit(self.state);
    }
}
