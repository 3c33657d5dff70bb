//! The production sink: NATS JetStream (2.10 or newer).
//!
//! - Each record is published to `<prefix>.<edge>.<topic levels>` (see `names.rs`) with
//!   `Nats-Msg-Id = <edge>:<epoch>:<lane>:<seq>`, so a resend inside the stream's duplicate
//!   window is dropped by JetStream itself. Gap records go to `<prefix>.<edge>.%gap` (a token no
//!   topic can produce: a `%` in a level is always encoded) with their body as JSON.
//! - A batch's publishes are pipelined and all their acks awaited; only then is the mark of
//!   (edge, epoch) raised in a KV bucket, with compare-and-set so two bridges racing for one
//!   edge never lower it. A bridge answers a hello from that mark, which is what makes bridges
//!   stateless and exactly-once independent of the duplicate window: what an edge resends after
//!   a reconnect is only what was never marked, at most its in-flight window, and that was
//!   published moments before (well inside the window) unless the bridge died between the
//!   publish acks and the mark.
//! - The stream and bucket are created at start if missing; an existing stream must already
//!   take the prefix's subjects, or the bridge refuses to start, naming it.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use shared::proto::{DictAnnounce, LaneSeq, WireRecord};

use super::{Sink, SinkError};

fn failed(what: &'static str, e: impl std::fmt::Display) -> SinkError {
    SinkError::Failed { what, reason: e.to_string() }
}

/// Dictionaries not stored again for this long expire. An edge names the ones it uses in every
/// hello and announces again any the bridge no longer has, so expiry only bounds the bucket.
const DICT_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// The KV bucket `name`, created if missing (`max_age` zero: entries never expire).
async fn bucket(
    js: &jetstream::Context,
    what: &'static str,
    name: &str,
    replicas: usize,
    max_age: Duration,
) -> Result<kv::Store, SinkError> {
    match js.get_key_value(name).await {
        Ok(kv) => Ok(kv),
        Err(_) => js
            .create_key_value(kv::Config {
                bucket: name.to_owned(),
                history: 1,
                num_replicas: replicas,
                max_age,
                ..Default::default()
            })
            .await
            .map_err(|e| failed(what, format!("{name}: {e}"))),
    }
}

#[derive(Debug, Clone)]
pub struct JetStreamSettings {
    pub url: String,
    pub stream: String,
    pub subject_prefix: String,
    pub marks_bucket: String,
    pub dicts_bucket: String,
    pub duplicate_window: Duration,
    pub replicas: usize,
}

#[derive(Debug, Clone)]
pub struct JetStreamSink {
    js: jetstream::Context,
    marks: kv::Store,
    dicts: kv::Store,
    prefix: String,
}

impl JetStreamSink {
    pub async fn connect(s: &JetStreamSettings) -> Result<Self, SinkError> {
        let client = async_nats::connect(&s.url).await.map_err(|e| failed("connect", format!("{}: {e}", s.url)))?;
        let js = jetstream::new(client);
        let subjects = format!("{}.>", s.subject_prefix);
        let mut stream = js
            .get_or_create_stream(stream::Config {
                name: s.stream.clone(),
                subjects: vec![subjects.clone()],
                duplicate_window: s.duplicate_window,
                num_replicas: s.replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| failed("stream", format!("{}: {e}", s.stream)))?;
        let info = stream.info().await.map_err(|e| failed("stream", format!("{}: {e}", s.stream)))?;
        if !info.config.subjects.contains(&subjects) {
            return Err(failed(
                "stream",
                format!("{} exists with subjects {:?}, not {subjects:?}", s.stream, info.config.subjects),
            ));
        }
        let marks = bucket(&js, "marks bucket", &s.marks_bucket, s.replicas, Duration::ZERO).await?;
        let dicts = bucket(&js, "dictionary bucket", &s.dicts_bucket, s.replicas, DICT_MAX_AGE).await?;
        Ok(Self { js, marks, dicts, prefix: s.subject_prefix.clone() })
    }

    async fn read_marks(&self, key: &str) -> Result<(BTreeMap<u8, u64>, Option<u64>), SinkError> {
        match self.marks.entry(key).await.map_err(|e| failed("read mark", e))? {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let marks =
                    serde_json::from_slice(&entry.value).map_err(|e| failed("read mark", format!("{key}: {e}")))?;
                Ok((marks, Some(entry.revision)))
            }
            Some(entry) => Ok((BTreeMap::new(), Some(entry.revision))),
            None => Ok((BTreeMap::new(), None)),
        }
    }
}

/// Dictionary ids are hex digests, which are valid KV keys; anything else an edge names is not
/// looked up.
fn is_dict_key(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A KV key for (edge, epoch): KV keys allow `[-/_=.a-zA-Z0-9]`, so other edge ids go as hex.
fn mark_key(edge: &str, epoch: &str) -> String {
    let plain = edge.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    let edge = if plain {
        edge.to_owned()
    } else {
        format!("x{}", edge.bytes().map(|b| format!("{b:02x}")).collect::<String>())
    };
    format!("{edge}.{epoch}")
}

/// Header names hold printable ASCII without `:`; values no CR or LF. Anything else is
/// percent-encoded, reversibly.
fn header_safe(s: &str, name: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let bad = c == '%' || c == '\r' || c == '\n' || (name && (c == ':' || !c.is_ascii_graphic()));
        if bad {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Sink for JetStreamSink {
    async fn committed(&self, edge: &str, epoch: &str) -> Result<Vec<LaneSeq>, SinkError> {
        let (marks, _) = self.read_marks(&mark_key(edge, epoch)).await?;
        Ok(marks.into_iter().map(|(lane, seq)| LaneSeq { lane, seq }).collect())
    }

    fn publish(
        &self,
        edge: String,
        epoch: String,
        lane: u8,
        records: Vec<WireRecord>,
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        let (js, prefix) = (self.js.clone(), self.prefix.clone());
        async move {
            // Per subject, one publish in flight at a time, the next sent after the last one's
            // ack: a failure then leaves a subject's stored records a prefix of what was sent,
            // and the edge's resend continues it in order. Subjects run side by side.
            let mut chains: Vec<(String, Vec<(HeaderMap, Bytes)>)> = Vec::new();
            let mut chain_of: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
            for r in &records {
                let mut headers = HeaderMap::new();
                headers.insert("Nats-Msg-Id", format!("{edge}:{epoch}:{lane}:{}", r.seq).as_str());
                headers.insert("Edge-Id", edge.as_str());
                headers.insert("Edge-Seq", format!("{epoch}:{lane}:{}", r.seq).as_str());
                let (subject, payload) = match (&r.message, &r.gap) {
                    (Some(m), _) => {
                        for (name, value) in crate::names::headers(m) {
                            headers.append(header_safe(&name, true).as_str(), header_safe(&value, false).as_str());
                        }
                        (crate::names::subject(&prefix, &edge, &m.topic), Bytes::from(m.payload.clone()))
                    }
                    (None, Some(g)) => {
                        let body = serde_json::to_vec(g).map_err(|e| failed("gap record", e))?;
                        (format!("{prefix}.{}.%gap", crate::names::token(&edge)), Bytes::from(body))
                    }
                    (None, None) => continue,
                };
                let i = *chain_of.entry(subject.clone()).or_insert_with(|| {
                    chains.push((subject, Vec::new()));
                    chains.len() - 1
                });
                chains[i].1.push((headers, payload));
            }
            let mut running: FuturesUnordered<_> = chains
                .into_iter()
                .map(|(subject, messages)| {
                    let js = js.clone();
                    async move {
                        for (headers, payload) in messages {
                            let ack = js
                                .publish_with_headers(subject.clone(), headers, payload)
                                .await
                                .map_err(|e| failed("publish", e))?;
                            ack.await.map_err(|e| failed("publish ack", e))?;
                        }
                        Ok::<(), SinkError>(())
                    }
                })
                .collect();
            while let Some(result) = running.next().await {
                result?;
            }
            Ok(())
        }
    }

    async fn load_dicts(&self, ids: &[String]) -> Result<Vec<(String, Vec<u8>)>, SinkError> {
        let mut found = Vec::new();
        for id in ids.iter().filter(|id| is_dict_key(id)) {
            if let Some(bytes) = self.dicts.get(id).await.map_err(|e| failed("read dict", format!("{id}: {e}")))? {
                found.push((id.clone(), bytes.to_vec()));
            }
        }
        Ok(found)
    }

    async fn store_dict(&self, dict: &DictAnnounce) -> Result<(), SinkError> {
        if !is_dict_key(&dict.id) {
            return Err(failed("store dict", format!("{:?} is not a dictionary id", dict.id)));
        }
        // A put refreshes the entry's age, so a dictionary in use does not expire.
        self.dicts
            .put(&dict.id, Bytes::from(dict.bytes.clone()))
            .await
            .map(|_| ())
            .map_err(|e| failed("store dict", format!("{}: {e}", dict.id)))
    }

    async fn mark(&self, edge: &str, epoch: &str, lane: u8, up_to: u64) -> Result<(), SinkError> {
        // Compare-and-set; a concurrent bridge's higher mark wins.
        let key = mark_key(edge, epoch);
        for _ in 0..16 {
            let (mut marks, revision) = self.read_marks(&key).await?;
            if marks.get(&lane).is_some_and(|m| *m >= up_to) {
                return Ok(());
            }
            marks.insert(lane, up_to);
            let value = Bytes::from(serde_json::to_vec(&marks).map_err(|e| failed("mark", e))?);
            let result = match revision {
                Some(rev) => self.marks.update(&key, value, rev).await.map(|_| ()).map_err(|e| e.to_string()),
                None => self.marks.create(&key, value).await.map(|_| ()).map_err(|e| e.to_string()),
            };
            match result {
                Ok(()) => return Ok(()),
                Err(e) => tracing::debug!(key, error = %e, "mark changed under us; retrying"),
            }
        }
        Err(failed("mark", format!("{key}: could not update after 16 attempts")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_headers_are_made_safe() {
        assert_eq!(mark_key("edge-1", "ab12"), "edge-1.ab12");
        assert_eq!(mark_key("a.b", "e"), "x612e62.e");
        assert_eq!(header_safe("trace id:x", true), "trace%20id%3Ax");
        assert_eq!(header_safe("line\r\nbreak 100%", false), "line%0D%0Abreak 100%25");
    }
}
