//! The key-value documents every JetStream concern keeps: buckets opened or made, JSON
//! documents read and written with compare-and-set, and the keys edges get in them.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::Serialize;

use super::cluster;
use crate::sink::error::SinkError;

/// The moment's failure of `what`, no error value to classify (a timeout of our own).
pub(super) fn unavailable(what: &'static str, reason: impl std::fmt::Display) -> SinkError {
    SinkError::Unavailable { what, reason: reason.to_string() }
}

/// The KV bucket `name`, created if missing (`max_age` zero: entries never expire), with
/// `replicas`.
pub(in crate::sink) async fn bucket(
    js: &jetstream::Context,
    what: &'static str,
    name: &str,
    replicas: usize,
    max_age: Duration,
) -> Result<kv::Store, SinkError> {
    match js.get_key_value(name).await {
        Ok(kv) => {
            let info = kv.stream.clone().info().await.map_err(|e| SinkError::nats(what, name, &e))?.clone();
            cluster::ensure_replicas(js, what, &info.config.name, &info.config, replicas).await?;
            Ok(kv)
        }
        Err(_) => js
            .create_key_value(kv::Config {
                bucket: name.to_owned(),
                history: 1,
                num_replicas: replicas,
                max_age,
                ..Default::default()
            })
            .await
            .map_err(|e| SinkError::nats(what, name, &e)),
    }
}

/// Attempts of a compare-and-set before the write counts as failed (and is retried later).
pub(in crate::sink) const CAS_ATTEMPTS: usize = 16;

/// The JSON document at `key` and its revision; a deleted or missing one is the default (with
/// the deletion's revision, or none).
pub(in crate::sink) async fn read_doc<T: serde::de::DeserializeOwned + Default>(
    kv: &kv::Store,
    key: &str,
    what: &'static str,
) -> Result<(T, Option<u64>), SinkError> {
    match kv.entry(key).await.map_err(|e| SinkError::nats(what, key, &e))? {
        Some(entry) if entry.operation == kv::Operation::Put => {
            let doc = serde_json::from_slice(&entry.value).map_err(|e| SinkError::corrupt(what, key, e))?;
            Ok((doc, Some(entry.revision)))
        }
        Some(entry) => Ok((T::default(), Some(entry.revision))),
        None => Ok((T::default(), None)),
    }
}

/// Why a compare-and-set did not write.
#[derive(Debug)]
pub(in crate::sink) enum Cas {
    /// Another writer came first: read again and retry.
    Changed,
    /// The server (or the value): retrying the compare-and-set does not help; the caller's
    /// own retry, if it has one, does.
    Failed(SinkError),
}

/// Writes `doc` at `key` if it is still at `revision` (none: not there yet); the new revision,
/// or why not.
pub(in crate::sink) async fn write_doc(
    kv: &kv::Store,
    key: &str,
    doc: &impl Serialize,
    revision: Option<u64>,
) -> Result<u64, Cas> {
    let value = Bytes::from(serde_json::to_vec(doc).map_err(|e| Cas::Failed(SinkError::invalid("write", e)))?);
    match revision {
        Some(rev) => kv.update(key, value, rev).await.map_err(|e| match e.kind() {
            kv::UpdateErrorKind::WrongLastRevision => Cas::Changed,
            _ => Cas::Failed(SinkError::nats("write", key, &e)),
        }),
        None => kv.create(key, value).await.map_err(|e| match e.kind() {
            kv::CreateErrorKind::AlreadyExists => Cas::Changed,
            _ => Cas::Failed(SinkError::nats("write", key, &e)),
        }),
    }
}

/// Every key's latest value in `kv`, in one pass over the bucket's stream (one consumer, not a
/// round trip per key: 10,000 edges' entries in a fraction of a second).
pub(in crate::sink) async fn read_all(kv: &kv::Store, what: &'static str) -> Result<Vec<(String, Bytes)>, SinkError> {
    // The store's own status is the stream info cached when it was opened: ask the server.
    let info = kv.stream.clone().info().await.map_err(|e| SinkError::nats(what, "", &e))?.clone();
    if info.state.messages == 0 {
        return Ok(Vec::new());
    }
    let mut watch = kv.watch_with_history(">").await.map_err(|e| SinkError::nats(what, "", &e))?;
    let read = async {
        let mut out = Vec::new();
        while let Some(entry) = watch.next().await {
            let entry = entry.map_err(|e| SinkError::nats(what, "", &e))?;
            if entry.operation == kv::Operation::Put {
                out.push((entry.key, entry.value));
            }
            // Deletions are entries too: `delta` counts what is left either way.
            if entry.delta == 0 {
                break;
            }
        }
        Ok(out)
    };
    // A bucket purged between the two calls would deliver nothing and never say so.
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .map_err(|_| unavailable(what, "timed out reading the bucket"))?
}

/// A KV key for (edge, epoch): KV keys allow `[-/_=.a-zA-Z0-9]`, so other edge ids go as hex
/// after a `=`, which no plain id holds: two edges never share a key. (Before, the hex came
/// after an `x`, and the plain id `x612e62` had the key of `a.b`. Such an edge's old mark is not
/// read any more; its hello says where its records start, and the lane resumes there.)
pub(super) fn mark_key(edge: &str, epoch: &str) -> String {
    format!("{}.{epoch}", edge_key(edge))
}

/// An edge's own KV key: its id if that is a valid key token, else `=` and the id in hex. With
/// no `.` in it, it is distinct from every `<edge>.<x>` key.
pub(in crate::sink) fn edge_key(edge: &str) -> String {
    let plain = !edge.is_empty() && edge.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if plain { edge.to_owned() } else { format!("={}", edge.bytes().map(|b| format!("{b:02x}")).collect::<String>()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_keys_are_made_safe() {
        assert_eq!(mark_key("edge-1", "ab12"), "edge-1.ab12");
        assert_eq!(mark_key("a.b", "e"), "=612e62.e");
        // No plain id has the key of an escaped one.
        assert_ne!(mark_key("x612e62", "e"), mark_key("a.b", "e"));
        assert_ne!(mark_key("", "e"), mark_key("=", "e"));
    }
}
