//! The fleet view as operators read it: one row per edge from the sink's edge states, bridge
//! states and TCO reports (`cloud-bridge edges list [--json]`, `GET /edges` on any bridge).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shared::tco::Route;
use shared::units::now_ms;

use crate::sink::downlink::{DownDeadLetter, DownSummary};
use crate::sink::{BridgeState, DownlinkStore, EdgeState, FleetData, FleetStates, FleetStore, SinkError, StoredReport};

/// Where an edge stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// A session on a bridge that is writing its state.
    Connected,
    /// Its state says connected, but its bridge stopped, or has not written for three of its
    /// intervals (killed, or cut off from the sink).
    Lost,
    /// Its last session ended.
    Disconnected,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EdgeRow {
    pub edge: String,
    pub status: Status,
    pub bridge: String,
    pub version: u16,
    pub epoch: String,
    pub remote: String,
    pub connected_ms: u64,
    /// The latest moment the edge is known to have been there: its bridge vouches for its live
    /// sessions each time it writes its own state.
    pub last_seen_ms: u64,
    pub lanes: Vec<LaneRow>,
    /// Records the edge holds that the cloud has not committed, all lanes; none before the
    /// edge's first heads.
    pub backlog: Option<u64>,
    pub oldest_unacked_ms: Option<u64>,
    pub dropped: Option<u64>,
    pub gaps: Option<u64>,
    /// Per class, from the edge's latest TCO report: the route it has and the model's choice.
    pub routes: Vec<RouteRow>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaneRow {
    pub lane: u8,
    pub committed: u64,
    pub head: Option<u64>,
    pub backlog: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouteRow {
    pub class: String,
    pub route: Option<Route>,
    pub model: Option<Route>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BridgeRow {
    pub name: String,
    pub quic: String,
    pub live: bool,
    pub stopped: bool,
    pub started_ms: u64,
    pub seen_ms: u64,
    pub edges: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetView {
    pub taken_ms: u64,
    pub bridges: Vec<BridgeRow>,
    pub edges: Vec<EdgeRow>,
    /// Per edge with a downlink: its position, what it did, what waits for it (an edge that
    /// never connected too).
    #[serde(default)]
    pub downlink: Vec<DownSummary>,
    /// The newest downlink messages edges refused or let expire.
    #[serde(default)]
    pub downlink_refused: Vec<DownDeadLetter>,
}

/// A bridge counts as writing while its last state is at most this many of its intervals old.
const SILENT_INTERVALS: u64 = 3;

fn bridge_live(b: &BridgeState, now: u64) -> bool {
    !b.stopped && now.saturating_sub(b.seen_ms) <= SILENT_INTERVALS * b.interval_ms.max(1)
}

/// Joins what the sink holds into rows, as of `now` (ms since the Unix epoch).
pub(crate) fn join(states: FleetStates, reports: &[StoredReport], now: u64) -> FleetView {
    let bridges: BTreeMap<&str, &BridgeState> = states.bridges.iter().map(|b| (b.name.as_str(), b)).collect();
    let reports: BTreeMap<&str, &StoredReport> = reports.iter().map(|r| (r.edge.as_str(), r)).collect();
    let edges = states.edges.iter().map(|e| edge_row(e, bridges.get(e.bridge.as_str()).copied(), &reports, now));
    let edges = edges.collect();
    let bridges = states
        .bridges
        .iter()
        .map(|b| BridgeRow {
            name: b.name.clone(),
            quic: b.quic.clone(),
            live: bridge_live(b, now),
            stopped: b.stopped,
            started_ms: b.started_ms,
            seen_ms: b.seen_ms,
            edges: b.edges,
        })
        .collect();
    FleetView { taken_ms: now, bridges, edges, downlink: Vec::new(), downlink_refused: Vec::new() }
}

fn edge_row(e: &EdgeState, bridge: Option<&BridgeState>, reports: &BTreeMap<&str, &StoredReport>, now: u64) -> EdgeRow {
    let (status, last_seen_ms) = match bridge {
        _ if !e.connected => (Status::Disconnected, e.seen_ms),
        // A session that began before its bridge (re)started died with the bridge's last run.
        Some(b) if e.connected_ms < b.started_ms => (Status::Lost, e.seen_ms),
        Some(b) if bridge_live(b, now) => (Status::Connected, e.seen_ms.max(b.seen_ms)),
        Some(b) => (Status::Lost, e.seen_ms.max(b.seen_ms)),
        None => (Status::Lost, e.seen_ms),
    };
    let lanes: Vec<LaneRow> = e
        .lanes
        .iter()
        .map(|l| LaneRow { lane: l.lane, committed: l.committed, head: l.head, backlog: l.backlog() })
        .collect();
    let backlog = lanes.iter().filter_map(|l| l.backlog).reduce(|a, b| a.saturating_add(b));
    let routes = reports
        .get(e.edge.as_str())
        .map(|r| {
            r.report
                .classes
                .iter()
                .map(|c| RouteRow {
                    class: c.decision.class.clone(),
                    route: c.route.or(c.decision.chosen),
                    model: c.decision.best,
                })
                .collect()
        })
        .unwrap_or_default();
    EdgeRow {
        edge: e.edge.clone(),
        status,
        bridge: e.bridge.clone(),
        version: e.version,
        epoch: e.epoch.clone(),
        remote: e.remote.clone(),
        connected_ms: e.connected_ms,
        last_seen_ms,
        lanes,
        backlog,
        oldest_unacked_ms: e.spool.map(|s| s.oldest_unacked_ms),
        dropped: e.spool.map(|s| s.dropped),
        gaps: e.spool.map(|s| s.gaps),
        routes,
    }
}

/// The view from a running sink.
pub(crate) async fn load_from<S: FleetStore + DownlinkStore>(sink: &S) -> Result<FleetView, SinkError> {
    let states = sink.load_fleet().await?;
    let reports = sink.load_reports().await?;
    let downlink = sink.down_summary().await?;
    let refused = sink.down_dead_letters(None, crate::sink::downlink::REFUSED_SHOWN).await?;
    Ok(FleetView { downlink, downlink_refused: refused, ..join(states, &reports, now_ms()) })
}

/// The view of what a sink holds, read without running a bridge (`sink::load_fleet`).
pub fn of(data: FleetData) -> FleetView {
    FleetView {
        downlink: data.downlink,
        downlink_refused: data.downlink_refused,
        ..join(data.states, &data.reports, now_ms())
    }
}

fn ago(now: u64, ms: u64) -> String {
    let s = now.saturating_sub(ms) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// The view as a table for a terminal.
pub fn table(v: &FleetView) -> String {
    let mut out = String::new();
    let now = v.taken_ms;
    let connected = v.edges.iter().filter(|e| e.status == Status::Connected).count();
    let lost = v.edges.iter().filter(|e| e.status == Status::Lost).count();
    let _ = writeln!(out, "bridges: {}", v.bridges.len());
    for b in &v.bridges {
        let state = if b.stopped {
            "stopped"
        } else if b.live {
            "live"
        } else {
            "silent"
        };
        let _ = writeln!(out, "  {:<28} {:<22} {:<8} {:>6} edges, wrote {} ago", b.name, b.quic, state, b.edges, {
            ago(now, b.seen_ms)
        });
    }
    let _ = writeln!(out, "edges: {} ({connected} connected, {lost} lost)", v.edges.len());
    let _ = writeln!(
        out,
        "{:<24} {:<12} {:<24} {:>3} {:>9} {:>9} {:>8} {:>8} {:>6}  routes (class=now/model)",
        "edge", "status", "bridge", "ver", "last seen", "backlog", "oldest", "dropped", "gaps"
    );
    for e in &v.edges {
        let status = match e.status {
            Status::Connected => "connected",
            Status::Lost => "lost",
            Status::Disconnected => "disconnected",
        };
        let oldest = e.oldest_unacked_ms.map(|ms| if ms == 0 { "-".to_owned() } else { format!("{}s", ms / 1000) });
        let routes = e
            .routes
            .iter()
            .map(|r| format!("{}={}/{}", r.class, or_dash(r.route), or_dash(r.model)))
            .collect::<Vec<_>>()
            .join(" ");
        let _ = writeln!(
            out,
            "{:<24} {:<12} {:<24} {:>3} {:>9} {:>9} {:>8} {:>8} {:>6}  {}",
            e.edge,
            status,
            e.bridge,
            e.version,
            ago(now, e.last_seen_ms),
            or_dash(e.backlog),
            oldest.unwrap_or_else(|| "-".into()),
            or_dash(e.dropped),
            or_dash(e.gaps),
            if routes.is_empty() { "-".into() } else { routes }
        );
    }
    if !v.downlink.is_empty() {
        let _ = writeln!(out, "downlink: {} edges", v.downlink.len());
        let _ = writeln!(
            out,
            "{:<24} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8}",
            "edge", "position", "delivered", "refused", "expired", "waiting", "oldest"
        );
        for d in &v.downlink {
            let _ = writeln!(
                out,
                "{:<24} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8}",
                d.edge,
                d.state.position,
                d.state.delivered,
                d.state.refused,
                d.state.expired,
                d.waiting,
                d.oldest_ms.map_or_else(|| "-".to_owned(), |ms| ago(now, ms))
            );
        }
    }
    for r in &v.downlink_refused {
        let _ =
            writeln!(out, "  {} {} {} {} ({} ago): {}", r.edge, r.seq, r.outcome, r.topic, ago(now, r.at_ms), r.reason);
    }
    out
}

/// How long `GET /edges` answers from the view it read last: a client polling it in a loop
/// costs the sink one read of the fleet a second, whatever its rate.
const CACHE: Duration = Duration::from_secs(1);

type LoadFn = dyn Fn() -> futures_util::future::BoxFuture<'static, Result<FleetView, SinkError>> + Send + Sync;

/// Serves the view over HTTP, read through a short cache; one read at a time.
pub(crate) struct Served {
    load: Box<LoadFn>,
    last: tokio::sync::Mutex<Option<(Instant, Arc<String>)>>,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served").finish_non_exhaustive()
    }
}

impl Served {
    pub(crate) fn new<S: FleetStore + DownlinkStore>(sink: Arc<S>) -> Self {
        let load = move || -> futures_util::future::BoxFuture<'static, Result<FleetView, SinkError>> {
            let sink = sink.clone();
            Box::pin(async move { load_from(&*sink).await })
        };
        Self { load: Box::new(load), last: tokio::sync::Mutex::new(None) }
    }

    /// The view as JSON.
    pub(crate) async fn json(&self) -> Result<Arc<String>, SinkError> {
        let mut last = self.last.lock().await;
        if let Some((at, json)) = &*last
            && at.elapsed() < CACHE
        {
            return Ok(json.clone());
        }
        let view = (self.load)().await?;
        let json = Arc::new(serde_json::to_string(&view).map_err(|e| SinkError::invalid("fleet view", e))?);
        *last = Some((Instant::now(), json.clone()));
        Ok(json)
    }
}

#[cfg(test)]
mod tests {
    use shared::proto::SpoolReport;

    use super::*;
    use crate::sink::LaneState;

    fn edge(name: &str, bridge: &str, connected: bool) -> EdgeState {
        EdgeState {
            edge: name.into(),
            bridge: bridge.into(),
            session: 1,
            connected,
            version: 2,
            epoch: "ep".into(),
            remote: "10.0.0.1:5000".into(),
            connected_ms: 1_000,
            seen_ms: 2_000,
            lanes: vec![
                LaneState { lane: 1, committed: 10, head: Some(15) },
                LaneState { lane: 3, committed: 4, head: Some(4) },
            ],
            spool: Some(SpoolReport { oldest_unacked_ms: 3_000, dropped: 2, gaps: 1 }),
        }
    }

    fn bridge(name: &str, seen_ms: u64, stopped: bool) -> BridgeState {
        BridgeState {
            name: name.into(),
            quic: "0.0.0.0:4433".into(),
            started_ms: 0,
            seen_ms,
            interval_ms: 1_000,
            edges: 1,
            stopped,
        }
    }

    #[test]
    fn an_edge_is_connected_only_while_its_bridge_writes() {
        let mut restarted = bridge("b4", 9_900, false);
        restarted.started_ms = 1_500;
        let states = FleetStates {
            edges: vec![
                edge("a", "b1", true),
                edge("b", "b2", true),
                edge("c", "b3", true),
                edge("d", "b1", false),
                edge("e", "b4", true),
            ],
            bridges: vec![bridge("b1", 9_500, false), bridge("b2", 5_000, false), bridge("b3", 9_900, true), restarted],
        };
        let v = join(states, &[], 10_000);
        let status: Vec<_> = v.edges.iter().map(|e| (e.edge.as_str(), e.status)).collect();
        assert_eq!(
            status,
            [
                ("a", Status::Connected),
                ("b", Status::Lost),
                ("c", Status::Lost),
                ("d", Status::Disconnected),
                ("e", Status::Lost)
            ],
            "b2 is silent for 5 of its 1 s intervals; b3 stopped; e's session began before b4 restarted"
        );
        assert_eq!(v.edges[0].last_seen_ms, 9_500, "its bridge vouches for it");
        assert_eq!(v.edges[3].last_seen_ms, 2_000, "when its session ended");
        assert_eq!(v.edges[0].backlog, Some(5));
        assert_eq!(
            (v.edges[0].oldest_unacked_ms, v.edges[0].dropped, v.edges[0].gaps),
            (Some(3_000), Some(2), Some(1))
        );
        let t = table(&v);
        assert!(t.contains("edges: 5 (1 connected, 3 lost)"), "{t}");
        assert!(t.lines().any(|l| l.starts_with("a ") && l.contains("connected") && l.contains(" 5 ")), "{t}");
    }
}
