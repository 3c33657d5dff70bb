//! What a sink keeps for the fleet view besides records: each edge's last known session state
//! and each bridge's own, written by `fleet`'s recorder at a capped rate and read by
//! `cloud-bridge edges list` and `GET /edges` across every bridge on the sink.
//!
//! Which write wins, the same in every sink: a live session's state replaces whatever is
//! stored (two bridges holding one edge for a moment take turns until the older ends); an
//! ended session's state replaces only its own, so the end of an edge's older session never
//! hides the newer one on another bridge.

use serde::{Deserialize, Serialize};
use shared::proto::{ClassesReport, SpoolReport};

use super::downlink::{DownDeadLetter, DownSummary};

/// An edge's latest TCO classes report as a sink keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredReport {
    pub edge: String,
    /// When it arrived, ms since the Unix epoch.
    pub received_ms: u64,
    pub report: ClassesReport,
}

/// One edge's session as its bridge last wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeState {
    pub edge: String,
    /// The bridge that holds (or held) the session: its `fleet.name`.
    pub bridge: String,
    /// Random per session, so an ended session replaces only its own state.
    pub session: u64,
    pub connected: bool,
    /// The protocol version of the session; 0 before the hello.
    pub version: u16,
    pub epoch: String,
    /// The edge's address as the bridge saw it.
    pub remote: String,
    /// When the session began, ms since the Unix epoch.
    pub connected_ms: u64,
    /// When this state was taken: the session's end, or a moment it was live.
    pub seen_ms: u64,
    /// Per lane: the cloud's committed seq and the edge's head, as of `seen_ms`.
    #[serde(default)]
    pub lanes: Vec<LaneState>,
    /// What the edge's spool said of itself last (edges from before the field send none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spool: Option<SpoolReport>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneState {
    pub lane: u8,
    /// Highest seq of this lane the sink committed.
    pub committed: u64,
    /// The edge's last committed seq in its spool, from its heads; none before its first ping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<u64>,
}

impl LaneState {
    /// Records the edge holds that the cloud has not committed, as of the state.
    pub(crate) fn backlog(&self) -> Option<u64> {
        self.head.map(|h| h.saturating_sub(self.committed))
    }
}

impl EdgeState {
    /// Whether this state may replace `stored` (see the module doc).
    pub(crate) fn replaces(&self, stored: &EdgeState) -> bool {
        self.connected || stored.session == self.session
    }
}

/// A bridge's own line in the fleet view, rewritten every `fleet.state_interval`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeState {
    pub name: String,
    /// Its QUIC listener.
    pub quic: String,
    pub started_ms: u64,
    /// When it last wrote this.
    pub seen_ms: u64,
    /// How often it writes this, so a reader can tell a bridge that stopped writing.
    pub interval_ms: u64,
    /// Edge sessions it held then.
    pub edges: u64,
    /// It stopped in order (a killed bridge never says so).
    #[serde(default)]
    pub stopped: bool,
}

/// Everything a sink holds for the fleet view.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetStates {
    pub edges: Vec<EdgeState>,
    pub bridges: Vec<BridgeState>,
}

/// Everything the fleet view shows, read from a sink without running a bridge.
#[derive(Debug, Clone, Default)]
pub struct FleetData {
    pub states: FleetStates,
    pub reports: Vec<StoredReport>,
    pub downlink: Vec<DownSummary>,
    pub downlink_refused: Vec<DownDeadLetter>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(session: u64, connected: bool) -> EdgeState {
        EdgeState {
            edge: "e".into(),
            bridge: "b".into(),
            session,
            connected,
            version: 2,
            epoch: "x".into(),
            remote: String::new(),
            connected_ms: 0,
            seen_ms: 0,
            lanes: vec![],
            spool: None,
        }
    }

    #[test]
    fn an_older_sessions_end_never_hides_a_newer_session() {
        let newer = state(2, true);
        assert!(!state(1, false).replaces(&newer), "the old session's end");
        assert!(state(2, false).replaces(&newer), "its own end");
        assert!(state(1, true).replaces(&newer), "two live sessions take turns");
        assert!(state(3, true).replaces(&state(2, false)), "a new session over an ended one");
        let lane = LaneState { lane: 1, committed: 10, head: Some(14) };
        assert_eq!(lane.backlog(), Some(4));
        assert_eq!(LaneState { head: Some(3), ..lane }.backlog(), Some(0), "a head behind the mark is no backlog");
        assert_eq!(LaneState { head: None, ..lane }.backlog(), None);
    }
}
