//! The fleet view in SQLite: `fleet_edges`, `fleet_bridges` and `tco_reports`, a row each,
//! replaced (`sink::presence` says which write wins).

use rusqlite::{Connection, params};

use super::SqliteSink;
use crate::sink::FleetStore;
use crate::sink::error::SinkError;
use crate::sink::presence::{BridgeState, EdgeState, FleetStates, StoredReport};

impl FleetStore for SqliteSink {
    async fn store_report(&self, report: &StoredReport) -> Result<(), SinkError> {
        let json = serde_json::to_string(&report.report).map_err(|e| SinkError::invalid("store report", e))?;
        let (edge, at) = (report.edge.clone(), report.received_ms);
        self.blocking(move |conn| {
            conn.execute(
                "INSERT OR REPLACE INTO tco_reports (edge_id, received_ms, report) VALUES (?1, ?2, ?3)",
                params![edge, at, json],
            )
            .map(|_| ())
            .map_err(|e| SinkError::sqlite("store report", e))
        })
        .await
    }

    async fn load_reports(&self) -> Result<Vec<StoredReport>, SinkError> {
        self.blocking(move |conn| {
            let mut stmt = conn
                .prepare_cached("SELECT edge_id, received_ms, report FROM tco_reports ORDER BY edge_id")
                .map_err(|e| SinkError::sqlite("read reports", e))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?, r.get::<_, String>(2)?)))
                .map_err(|e| SinkError::sqlite("read reports", e))?;
            let mut out = Vec::new();
            for row in rows {
                let (edge, received_ms, json) = row.map_err(|e| SinkError::sqlite("read reports", e))?;
                let report = serde_json::from_str(&json).map_err(|e| SinkError::corrupt("read reports", &edge, e))?;
                out.push(StoredReport { edge, received_ms, report });
            }
            Ok(out)
        })
        .await
    }

    async fn store_edge_states(&self, states: Vec<EdgeState>) -> Result<Vec<bool>, SinkError> {
        self.blocking(move |conn| {
            let tx = conn.transaction().map_err(|e| SinkError::sqlite("begin", e))?;
            let mut stored = Vec::with_capacity(states.len());
            for state in &states {
                let json = serde_json::to_string(state).map_err(|e| SinkError::invalid("store edge state", e))?;
                // The session id is random: its bits as SQLite's signed integer.
                let session = state.session as i64;
                let sql = if state.connected {
                    "INSERT OR REPLACE INTO fleet_edges (edge_id, session, state) VALUES (?1, ?2, ?3)"
                } else {
                    // An end replaces only its own session (`EdgeState::replaces`).
                    "INSERT INTO fleet_edges (edge_id, session, state) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (edge_id) DO UPDATE SET state = excluded.state \
                     WHERE fleet_edges.session = excluded.session"
                };
                let changed = tx
                    .prepare_cached(sql)
                    .and_then(|mut stmt| stmt.execute(params![state.edge, session, json]))
                    .map_err(|e| SinkError::sqlite("store edge state", e))?;
                stored.push(changed > 0);
            }
            tx.commit().map_err(|e| SinkError::sqlite("commit", e))?;
            Ok(stored)
        })
        .await
    }

    async fn store_bridge_state(&self, state: &BridgeState) -> Result<(), SinkError> {
        let json = serde_json::to_string(state).map_err(|e| SinkError::invalid("store bridge state", e))?;
        let name = state.name.clone();
        self.blocking(move |conn| {
            conn.execute("INSERT OR REPLACE INTO fleet_bridges (name, state) VALUES (?1, ?2)", params![name, json])
                .map(|_| ())
                .map_err(|e| SinkError::sqlite("store bridge state", e))
        })
        .await
    }

    async fn load_fleet(&self) -> Result<FleetStates, SinkError> {
        self.blocking(move |conn| {
            fn all<T: serde::de::DeserializeOwned>(conn: &Connection, sql: &str) -> Result<Vec<T>, SinkError> {
                let mut stmt = conn.prepare_cached(sql).map_err(|e| SinkError::sqlite("read fleet", e))?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
                    .map_err(|e| SinkError::sqlite("read fleet", e))?;
                let mut out = Vec::new();
                for row in rows {
                    let (key, json) = row.map_err(|e| SinkError::sqlite("read fleet", e))?;
                    out.push(serde_json::from_str(&json).map_err(|e| SinkError::corrupt("read fleet", &key, e))?);
                }
                Ok(out)
            }
            Ok(FleetStates {
                edges: all(conn, "SELECT edge_id, state FROM fleet_edges ORDER BY edge_id")?,
                bridges: all(conn, "SELECT name, state FROM fleet_bridges ORDER BY name")?,
            })
        })
        .await
    }
}
