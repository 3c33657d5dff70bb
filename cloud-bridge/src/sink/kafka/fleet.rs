//! The fleet view in the state topic: `s/<edge>` per edge, `b/<bridge>` per bridge, `r/<edge>`
//! each edge's latest TCO report; latest value per key, written by the plain producer.
//!
//! A live session's state is a plain put. An ended one is put only if it replaces what is
//! stored (`sink::presence`), checked against the state log read to its end: a newer session's
//! state, written by the bridge that took the edge over, stays. (Kafka has no compare-and-set:
//! an end and a takeover's put within the same few milliseconds can still cross; the next state
//! of the live session puts it right.)

use super::KafkaSink;
use crate::sink::presence::{BridgeState, EdgeState, FleetStates, StoredReport};
use crate::sink::{FleetStore, SinkError};

const EDGE: &str = "s/";
const BRIDGE: &str = "b/";
const REPORT: &str = "r/";

fn json<T: serde::Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, SinkError> {
    serde_json::to_vec(value).map_err(|e| SinkError::invalid(what, e))
}

impl FleetStore for KafkaSink {
    async fn store_report(&self, report: &StoredReport) -> Result<(), SinkError> {
        let key = format!("{REPORT}{}", report.edge);
        self.plain.put(&self.state_topic, &key, &json("store report", report)?).await
    }

    async fn load_reports(&self) -> Result<Vec<StoredReport>, SinkError> {
        self.state.read_to_end().await?;
        let mut out = Vec::new();
        for (key, value) in self.state.scan(REPORT) {
            out.push(serde_json::from_slice(&value).map_err(|e| SinkError::corrupt("read reports", &key, e))?);
        }
        Ok(out)
    }

    async fn store_edge_states(&self, states: Vec<EdgeState>) -> Result<Vec<bool>, SinkError> {
        if states.iter().any(|s| !s.connected) {
            self.state.read_to_end().await?;
        }
        let mut stored = Vec::with_capacity(states.len());
        for state in &states {
            let key = format!("{EDGE}{}", state.edge);
            if !state.connected
                && let Some(value) = self.state.get(&key)
            {
                let current: EdgeState =
                    serde_json::from_slice(&value).map_err(|e| SinkError::corrupt("read edge state", &key, e))?;
                if !state.replaces(&current) {
                    stored.push(false);
                    continue;
                }
            }
            self.plain.put(&self.state_topic, &key, &json("store edge state", state)?).await?;
            stored.push(true);
        }
        Ok(stored)
    }

    async fn store_bridge_state(&self, state: &BridgeState) -> Result<(), SinkError> {
        let key = format!("{BRIDGE}{}", state.name);
        self.plain.put(&self.state_topic, &key, &json("store bridge state", state)?).await
    }

    async fn load_fleet(&self) -> Result<FleetStates, SinkError> {
        self.state.read_to_end().await?;
        let mut fleet = FleetStates::default();
        for (key, value) in self.state.scan(EDGE) {
            fleet.edges.push(serde_json::from_slice(&value).map_err(|e| SinkError::corrupt("read fleet", &key, e))?);
        }
        for (key, value) in self.state.scan(BRIDGE) {
            fleet.bridges.push(serde_json::from_slice(&value).map_err(|e| SinkError::corrupt("read fleet", &key, e))?);
        }
        Ok(fleet)
    }
}
