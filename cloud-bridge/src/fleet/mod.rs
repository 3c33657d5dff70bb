//! The fleet view (`[fleet]`): where every edge is connected, how far behind it is and what it
//! chose, across every bridge on one sink, without a metric series per edge.
//!
//! - Each session keeps a [`Presence`]: its edge's state ([`EdgeState`]: bridge, protocol
//!   version, lanes' marks and heads, what the spool reports), handed to this bridge's
//!   [`Recorder`] at the welcome, when it changed (at most once per `fleet.state_interval`),
//!   and at the end. Pings alone change nothing, so an idle edge costs no writes after its
//!   welcome.
//! - The recorder keeps one pending state per edge, the latest: a newer state replaces one not
//!   yet written, and the end of a session never replaces a newer session's state. A writer
//!   task stores them at `fleet.state_writes_per_second` at most, oldest first, several per
//!   sink call. 10,000 edges reconnecting at once cost the sink that rate for a while, not a
//!   write each at once; the pending states are bounded by `fleet.max_pending_states` (past
//!   it a state is dropped and counted).
//! - The writer stores the bridge's own state ([`BridgeState`]) every interval, and once more
//!   when it stops in order: an edge whose state names a bridge that stopped writing is shown
//!   `lost`, not connected (a killed bridge writes no ends).
//! - [`view`] joins edge states, bridge states and the TCO reports into one row per edge:
//!   `cloud-bridge edges list` and `GET /edges`.

mod presence;
pub mod view;

use shared::check::Problems;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use shared::units::{HumanDuration, now_ms};
use tokio_util::sync::CancellationToken;

pub use presence::Presence;

use crate::sink::{BridgeState, EdgeState, FleetStore};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// This bridge's name in the fleet view. Default: the host name and the QUIC port.
    #[serde(default)]
    pub name: Option<String>,
    /// Least time between two writes of one edge's state, and how often the bridge writes its
    /// own. Default: 15s.
    #[serde(default = "default_interval")]
    pub state_interval: HumanDuration,
    /// Edge state writes a second, at most, every edge of this bridge together. Default: 200.
    #[serde(default = "default_writes")]
    pub state_writes_per_second: u32,
    /// Edge states waiting to be written, at most (one per edge); past it a state is dropped
    /// and counted. Default: 20,000.
    #[serde(default = "default_max_pending")]
    pub max_pending_states: usize,
}

fn default_interval() -> HumanDuration {
    HumanDuration(Duration::from_secs(15))
}
fn default_writes() -> u32 {
    200
}
fn default_max_pending() -> usize {
    20_000
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            name: None,
            state_interval: default_interval(),
            state_writes_per_second: default_writes(),
            max_pending_states: default_max_pending(),
        }
    }
}

impl FleetConfig {
    /// Every key that cannot work, with why.
    pub(crate) fn check(&self, p: &mut Problems) {
        if self.state_interval.0 < Duration::from_millis(10) {
            p.bad("fleet.state_interval", "must be at least 10ms");
        }
        if self.state_writes_per_second == 0 {
            p.bad("fleet.state_writes_per_second", "must be more than 0");
        }
        if self.max_pending_states == 0 {
            p.bad("fleet.max_pending_states", "must be more than 0");
        }
        if self.name.as_ref().is_some_and(|n| n.is_empty() || n.len() > 255) {
            p.bad("fleet.name", "must be 1 to 255 bytes");
        }
    }

    /// `name`, or the host's name and `port`.
    pub(crate) fn bridge_name(&self, port: u16) -> String {
        self.name.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            let host = host.trim();
            format!("{}:{port}", if host.is_empty() { "bridge" } else { host })
        })
    }
}

shared::metrics! {
    #[derive(Debug)]
    pub struct FleetMetrics {
        pub written: Counter => ("edge_states_written", "Edge states written to the sink for the fleet view"),
        pub coalesced: Counter => (
            "edge_states_coalesced",
            "Edge states replaced by a newer one of the same edge before they were written"
        ),
        pub stale: Counter => (
            "edge_states_stale",
            "Session ends not written because a newer session of the edge was written since"
        ),
        pub dropped: Counter => ("edge_states_dropped", "Edge states dropped with fleet.max_pending_states waiting"),
        pub errors: Counter => ("edge_states_errors", "Edge or bridge state writes the sink failed"),
        pub pending: Gauge => ("edge_states_pending", "Edge states waiting to be written"),
    }
}

/// The edge states waiting to be written, one per edge, in the order their edges first
/// waited.
#[derive(Debug, Default)]
struct Pending {
    states: HashMap<String, EdgeState>,
    order: VecDeque<String>,
}

/// This bridge's sessions hand their states here; the writer ([`run`]) stores them.
#[derive(Debug)]
pub(crate) struct Recorder {
    name: String,
    interval: Duration,
    max_pending: usize,
    pending: std::sync::Mutex<Pending>,
    wake: tokio::sync::Notify,
    /// Welcomed sessions on this bridge now.
    live: AtomicU64,
    metrics: Arc<FleetMetrics>,
}

impl Recorder {
    pub(crate) fn new(config: &FleetConfig, name: String, metrics: Arc<FleetMetrics>) -> Self {
        Self {
            name,
            interval: config.state_interval.0,
            max_pending: config.max_pending_states,
            pending: Default::default(),
            wake: tokio::sync::Notify::new(),
            live: AtomicU64::new(0),
            metrics,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn submit(&self, state: EdgeState) {
        let mut p = self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(waiting) = p.states.get_mut(&state.edge) {
            if state.replaces(waiting) {
                *waiting = state;
                self.metrics.coalesced.inc();
            } else {
                self.metrics.stale.inc();
            }
            return;
        }
        if p.states.len() >= self.max_pending {
            self.metrics.dropped.inc();
            return;
        }
        p.order.push_back(state.edge.clone());
        p.states.insert(state.edge.clone(), state);
        self.metrics.pending.set(p.states.len() as i64);
        drop(p);
        self.wake.notify_one();
    }

    /// Up to `n` states, oldest waiting first.
    fn take(&self, n: usize) -> Vec<EdgeState> {
        let mut p = self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = Vec::with_capacity(n.min(p.order.len()));
        while out.len() < n {
            let Some(edge) = p.order.pop_front() else { break };
            if let Some(state) = p.states.remove(&edge) {
                out.push(state);
            }
        }
        self.metrics.pending.set(p.states.len() as i64);
        out
    }

    fn is_empty(&self) -> bool {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).states.is_empty()
    }
}

/// What the writer needs to know of its bridge.
#[derive(Debug, Clone)]
pub(crate) struct BridgeInfo {
    pub quic: std::net::SocketAddr,
    pub writes_per_second: u32,
}

/// How often the writer takes states: the rate is spent in slices, so a burst of states goes
/// out in a few sink calls instead of one each.
const TICK: Duration = Duration::from_millis(100);

/// How long a stopping bridge spends writing what is pending, at any rate.
const FINAL_FLUSH: Duration = Duration::from_secs(2);

/// Stores the recorder's states and the bridge's own until `stop`, then what is left within
/// [`FINAL_FLUSH`] and the bridge's state as stopped. Cancel `stop` only after every session
/// ended, so their ends are among what is left.
pub(crate) async fn run<S: FleetStore>(
    recorder: Arc<Recorder>,
    sink: Arc<S>,
    info: BridgeInfo,
    stop: CancellationToken,
) {
    let started_ms = now_ms();
    let per_tick = (info.writes_per_second as usize).div_ceil((1000 / TICK.as_millis()) as usize).max(1);
    let bridge_state = |stopped: bool| BridgeState {
        name: recorder.name.clone(),
        quic: info.quic.to_string(),
        started_ms,
        seen_ms: now_ms(),
        interval_ms: recorder.interval.as_millis() as u64,
        edges: recorder.live.load(Ordering::Relaxed),
        stopped,
    };
    let mut heartbeat = tokio::time::interval(recorder.interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = heartbeat.tick() => store_bridge(&*sink, &bridge_state(false), &recorder).await,
            _ = recorder.wake.notified(), if recorder.is_empty() => {}
            _ = tick.tick(), if !recorder.is_empty() => {
                store_edges(&*sink, recorder.take(per_tick), &recorder).await;
            }
        }
    }
    let flush = async {
        while !recorder.is_empty() {
            store_edges(&*sink, recorder.take(500), &recorder).await;
        }
    };
    if tokio::time::timeout(FINAL_FLUSH, flush).await.is_err() {
        tracing::warn!("fleet view: edge states left unwritten at stop; the bridge is shown stopped");
    }
    store_bridge(&*sink, &bridge_state(true), &recorder).await;
}

async fn store_edges<S: FleetStore>(sink: &S, states: Vec<EdgeState>, recorder: &Recorder) {
    if states.is_empty() {
        return;
    }
    let n = states.len() as u64;
    match sink.store_edge_states(states).await {
        Ok(stored) => {
            let written = stored.iter().filter(|s| **s).count() as u64;
            recorder.metrics.written.inc_by(written);
            recorder.metrics.stale.inc_by(n - written);
        }
        Err(e) => {
            // The states are advice: the next change of each edge writes again.
            recorder.metrics.errors.inc();
            tracing::warn!(error = %e, states = n, "fleet view: edge states not written");
        }
    }
}

async fn store_bridge<S: FleetStore>(sink: &S, state: &BridgeState, recorder: &Recorder) {
    if let Err(e) = sink.store_bridge_state(state).await {
        recorder.metrics.errors.inc();
        tracing::warn!(error = %e, "fleet view: bridge state not written");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(edge: &str, session: u64, connected: bool) -> EdgeState {
        EdgeState {
            edge: edge.into(),
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
    fn one_state_per_edge_waits_the_latest_and_the_bound_holds() {
        let config = FleetConfig { max_pending_states: 2, ..FleetConfig::default() };
        let metrics = Arc::new(FleetMetrics::default());
        let r = Recorder::new(&config, "b".into(), metrics.clone());
        r.submit(state("a", 1, true));
        r.submit(state("b", 1, true));
        r.submit(state("a", 2, true));
        r.submit(state("a", 1, false));
        r.submit(state("c", 1, true));
        assert_eq!(metrics.coalesced.get(), 1, "a's newer session replaced its first");
        assert_eq!(metrics.stale.get(), 1, "the first session's end does not replace the second");
        assert_eq!(metrics.dropped.get(), 1, "c found the two places taken");
        let taken = r.take(10);
        assert_eq!(taken.iter().map(|s| (s.edge.as_str(), s.session)).collect::<Vec<_>>(), [("a", 2), ("b", 1)]);
        assert!(r.is_empty());
        assert_eq!(metrics.pending.get(), 0);
    }
}
