//! The fleet view's states in a KV bucket: `edge.<edge key>` per edge, `bridge.<key>` per
//! bridge. A live session's state is a plain put; an ended one is a compare-and-set on the
//! revision of its own session's state, so it never replaces a newer session's
//! (`sink::presence`).
//!
//! Each edge's latest TCO report is at `<edge key>.tco` in the report bucket.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::future::join_all;

use super::bucket::{Cas, edge_key, mark_key, read_all, read_doc, write_doc};
use super::{CLI_CONNECT, JetStreamSink, cluster};
use crate::sink::FleetStore;
use crate::sink::error::SinkError;
use crate::sink::presence::{BridgeState, EdgeState, FleetStates, StoredReport};

impl FleetStore for JetStreamSink {
    async fn store_report(&self, report: &StoredReport) -> Result<(), SinkError> {
        let value = Bytes::from(serde_json::to_vec(report).map_err(|e| SinkError::invalid("store report", e))?);
        let key = mark_key(&report.edge, "tco");
        self.reports.put(&key, value).await.map(|_| ()).map_err(|e| SinkError::nats("store report", &key, &e))
    }

    async fn load_reports(&self) -> Result<Vec<StoredReport>, SinkError> {
        read_reports(&self.reports).await
    }

    async fn store_edge_states(&self, states: Vec<EdgeState>) -> Result<Vec<bool>, SinkError> {
        store_edge_states(&self.fleet, states).await
    }

    async fn store_bridge_state(&self, state: &BridgeState) -> Result<(), SinkError> {
        store_bridge_state(&self.fleet, state).await
    }

    async fn load_fleet(&self) -> Result<FleetStates, SinkError> {
        load_fleet(&self.fleet).await
    }
}

async fn read_reports(kv: &kv::Store) -> Result<Vec<StoredReport>, SinkError> {
    let mut out = Vec::new();
    for (key, value) in read_all(kv, "read reports").await? {
        out.push(serde_json::from_slice(&value).map_err(|e| SinkError::corrupt("read reports", &key, e))?);
    }
    out.sort_by(|a: &StoredReport, b| a.edge.cmp(&b.edge));
    Ok(out)
}

/// Every edge's latest TCO report in `bucket` on the server at `url`, without touching the
/// stream or the other buckets (for `cloud-bridge tco report`).
pub async fn load_reports_from(url: &str, bucket: &str) -> Result<Vec<StoredReport>, SinkError> {
    let client = cluster::connect(url, CLI_CONNECT).await?;
    let js = jetstream::new(client);
    match js.get_key_value(bucket).await {
        Ok(kv) => read_reports(&kv).await,
        // No bucket: no edge has reported yet.
        Err(_) => Ok(Vec::new()),
    }
}

const EDGE: &str = "edge.";
const BRIDGE: &str = "bridge.";

/// Attempts of an end's compare-and-set before it is given up (another writer won each time).
const CAS_ATTEMPTS: usize = 4;

pub(super) async fn store_edge_states(kv: &kv::Store, states: Vec<EdgeState>) -> Result<Vec<bool>, SinkError> {
    // Puts of different keys pipelined over the one connection: a batch costs about one round
    // trip, not one each.
    join_all(states.iter().map(|s| store_edge_state(kv, s))).await.into_iter().collect()
}

async fn store_edge_state(kv: &kv::Store, state: &EdgeState) -> Result<bool, SinkError> {
    let key = format!("{EDGE}{}", edge_key(&state.edge));
    if state.connected {
        let value = Bytes::from(serde_json::to_vec(state).map_err(|e| SinkError::invalid("store edge state", e))?);
        kv.put(&key, value).await.map_err(|e| SinkError::nats("store edge state", &key, &e))?;
        return Ok(true);
    }
    for _ in 0..CAS_ATTEMPTS {
        let (stored, revision): (Option<EdgeState>, _) = read_doc(kv, &key, "read edge state").await?;
        if stored.is_some_and(|stored| !state.replaces(&stored)) {
            return Ok(false);
        }
        match write_doc(kv, &key, state, revision).await {
            Ok(_) => return Ok(true),
            Err(Cas::Changed) => tracing::debug!(key, "edge state changed under us; retrying"),
            Err(Cas::Failed(e)) => return Err(e),
        }
    }
    Err(SinkError::Conflict { what: "store edge state", key: key.to_string(), attempts: CAS_ATTEMPTS as u32 })
}

pub(super) async fn store_bridge_state(kv: &kv::Store, state: &BridgeState) -> Result<(), SinkError> {
    let key = format!("{BRIDGE}{}", edge_key(&state.name));
    let value = Bytes::from(serde_json::to_vec(state).map_err(|e| SinkError::invalid("store bridge state", e))?);
    kv.put(&key, value).await.map(|_| ()).map_err(|e| SinkError::nats("store bridge state", &key, &e))
}

pub(super) async fn load_fleet(kv: &kv::Store) -> Result<FleetStates, SinkError> {
    let mut fleet = FleetStates::default();
    for (key, value) in read_all(kv, "read fleet").await? {
        let bad = |e: serde_json::Error| SinkError::corrupt("read fleet", &key, e);
        if key.starts_with(EDGE) {
            fleet.edges.push(serde_json::from_slice(&value).map_err(bad)?);
        } else if key.starts_with(BRIDGE) {
            fleet.bridges.push(serde_json::from_slice(&value).map_err(bad)?);
        }
    }
    fleet.edges.sort_by(|a, b| a.edge.cmp(&b.edge));
    fleet.bridges.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(fleet)
}

/// The fleet states in `bucket` on the server at `url`, without touching the stream or the
/// other buckets (for `cloud-bridge edges list`).
pub(crate) async fn load_fleet_from(url: &str, bucket: &str) -> Result<FleetStates, SinkError> {
    let client = cluster::connect(url, CLI_CONNECT).await?;
    let js = jetstream::new(client);
    match js.get_key_value(bucket).await {
        Ok(kv) => load_fleet(&kv).await,
        // No bucket: no bridge has written yet.
        Err(_) => Ok(FleetStates::default()),
    }
}
