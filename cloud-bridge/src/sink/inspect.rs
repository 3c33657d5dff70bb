//! What reached the sink, for an operator: `cloud-bridge records tail|count` (every sink) and
//! `cloud-bridge dead-letters list` (JetStream and Kafka; the SQLite sink stores every record
//! and has none) and `replay`. Read without a running bridge, from the `[sink]` of its config, by the backend's
//! own `inspect.rs`.

use std::collections::BTreeMap;

use super::SinkError;
use super::config::SinkConfig;
use super::jetstream::inspect::{self as js, Records};
use super::kafka::inspect::Inspect;
pub use super::seen::{DeadLetter, Seen};
use super::sqlite::inspect as sqlite;

/// The last `n` records stored (of `edge`, if given), oldest first.
pub async fn tail(sink: &SinkConfig, edge: Option<&str>, n: usize) -> Result<Vec<Seen>, SinkError> {
    match sink {
        SinkConfig::Sqlite { path } => sqlite::tail(path, edge, n),
        SinkConfig::Jetstream { url, stream, subject_prefix, .. } => {
            js::tail(Records { url, stream, subject_prefix }, edge, n).await
        }
        SinkConfig::Kafka(settings) => Inspect::new(settings)?.tail(edge, n).await,
    }
}

/// Records stored per edge (messages and gap records together).
pub async fn count(sink: &SinkConfig) -> Result<BTreeMap<String, u64>, SinkError> {
    match sink {
        SinkConfig::Sqlite { path } => sqlite::count(path),
        SinkConfig::Jetstream { url, stream, subject_prefix, .. } => {
            js::count(Records { url, stream, subject_prefix }).await
        }
        SinkConfig::Kafka(settings) => Inspect::new(settings)?.count().await,
    }
}

/// Every dead letter (of `edge`, if given), oldest first; none on a sink that sets none aside.
pub async fn dead_letters(sink: &SinkConfig, edge: Option<&str>) -> Result<Vec<DeadLetter>, SinkError> {
    match sink {
        SinkConfig::Sqlite { .. } => Ok(Vec::new()),
        SinkConfig::Jetstream { url, stream, subject_prefix, .. } => {
            js::dead_letters(Records { url, stream, subject_prefix }, edge).await
        }
        SinkConfig::Kafka(settings) => Inspect::new(settings)?.dead_letters(edge).await,
    }
}

/// The dead letters as the console serves them: `{"letters": [...], "note": ...}` (a note for
/// a sink that has none).
pub(crate) async fn dead_letters_doc(sink: &SinkConfig) -> Result<String, SinkError> {
    let note = match sink {
        SinkConfig::Sqlite { .. } => Some("the SQLite sink stores every record: it has no dead letters"),
        SinkConfig::Jetstream { .. } | SinkConfig::Kafka(_) => None,
    };
    let letters = dead_letters(sink, None).await?;
    Ok(serde_json::json!({ "letters": letters, "note": note }).to_string())
}

/// Publishes the dead letters at `seqs` again where they were refused and deletes each once
/// stored; each letter's outcome, the subject it went to or why not
/// (`jetstream::inspect::replay`).
pub async fn replay(sink: &SinkConfig, seqs: &[u64]) -> Result<Vec<(u64, Result<String, SinkError>)>, SinkError> {
    match sink {
        SinkConfig::Sqlite { .. } => {
            Err(SinkError::Invalid { what: "replay", reason: "the SQLite sink has no dead letters".into() })
        }
        SinkConfig::Jetstream { url, stream, subject_prefix, .. } => {
            js::replay(Records { url, stream, subject_prefix }, seqs).await
        }
        SinkConfig::Kafka(settings) => Inspect::new(settings)?.replay(seqs).await,
    }
}
