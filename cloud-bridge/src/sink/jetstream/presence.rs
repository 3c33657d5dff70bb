//! The fleet view's states in a KV bucket: `edge.<edge key>` per edge, `bridge.<key>` per
//! bridge. A live session's state is a plain put; an ended one is a compare-and-set on the
//! revision of its own session's state, so it never replaces a newer session's
//! (`sink::presence`).

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures_util::future::join_all;

use super::{Cas, edge_key, read_all, read_doc, write_doc};
use crate::sink::{BridgeState, EdgeState, FleetStates, SinkError};

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
pub async fn load_fleet_from(url: &str, bucket: &str) -> Result<FleetStates, SinkError> {
    let client = super::cluster::connect(url, super::CLI_CONNECT).await?;
    let js = async_nats::jetstream::new(client);
    match js.get_key_value(bucket).await {
        Ok(kv) => load_fleet(&kv).await,
        // No bucket: no bridge has written yet.
        Err(_) => Ok(FleetStates::default()),
    }
}
