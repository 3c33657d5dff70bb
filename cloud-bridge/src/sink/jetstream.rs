//! The production sink: NATS JetStream (2.10 or newer).
//!
//! - Each record is published to `<prefix>.<edge>.<topic levels>` (see `names.rs`) with
//!   `Nats-Msg-Id = <edge>:<epoch>:<lane>:<seq>`, so a resend inside the stream's duplicate
//!   window is dropped by JetStream itself. Gap records go to `<prefix>.<edge>.%gap` (a token no
//!   topic can produce: a `%` in a level is always encoded) with their body as JSON.
//! - On nats-server 2.12 or newer a batch goes as JetStream atomic batches (ADR-50) of up to
//!   1,000 messages: stored all together or not at all, in the order sent, with one ack for the
//!   batch instead of one per message. A batch that overlaps records already stored (a resend
//!   after a bridge died between publish and mark) is refused whole by JetStream's dedup; that
//!   batch is then published the older way, where dedup drops just the duplicates. The older
//!   way, and the only one on 2.10 and 2.11: per subject one publish in flight, the next after
//!   its ack, subjects side by side, so a failure leaves each subject a prefix of what was sent.
//! - A batch's publishes all acked, and only then, the mark of
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

use super::{Sink, SinkError, StoredReport, Turn};

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
    pub tco_bucket: String,
    pub duplicate_window: Duration,
    pub replicas: usize,
    /// Atomic batch publishing where the server has it (2.12 or newer).
    pub atomic_batches: bool,
}

/// Marks per lane of one (edge, epoch), and the KV revision they were written at.
type MarksAt = (BTreeMap<u8, u64>, u64);

#[derive(Debug, Clone)]
pub struct JetStreamSink {
    client: async_nats::Client,
    js: jetstream::Context,
    /// Publish batches atomically: the server has it and the stream allows it.
    atomic: bool,
    marks: kv::Store,
    /// Per mark key, the marks and revision this bridge last wrote: the next mark tries a
    /// compare-and-set on that revision first, one round trip instead of a read and a write.
    last_marks: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, MarksAt>>>,
    dicts: kv::Store,
    reports: kv::Store,
    prefix: String,
}

impl JetStreamSink {
    pub async fn connect(s: &JetStreamSettings) -> Result<Self, SinkError> {
        let client = async_nats::connect(&s.url).await.map_err(|e| failed("connect", format!("{}: {e}", s.url)))?;
        let version = client.server_info().version;
        let js = jetstream::new(client.clone());
        let subjects = format!("{}.>", s.subject_prefix);
        let atomic = s.atomic_batches && supports_atomic(&version);
        if s.atomic_batches && !atomic {
            tracing::warn!(version, "nats-server before 2.12 has no atomic batches: publishing message by message");
        }
        let mut stream = js
            .get_or_create_stream(stream::Config {
                name: s.stream.clone(),
                subjects: vec![subjects.clone()],
                duplicate_window: s.duplicate_window,
                num_replicas: s.replicas,
                allow_atomic_publish: atomic,
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
        if atomic && !info.config.allow_atomic_publish {
            // Allowing atomic batches changes nothing for the stream's other publishers.
            let config = stream::Config { allow_atomic_publish: true, ..info.config.clone() };
            js.update_stream(config).await.map_err(|e| failed("stream", format!("{}: allow_atomic: {e}", s.stream)))?;
            tracing::info!(stream = s.stream, "stream now allows atomic batches");
        }
        let marks = bucket(&js, "marks bucket", &s.marks_bucket, s.replicas, Duration::ZERO).await?;
        let dicts = bucket(&js, "dictionary bucket", &s.dicts_bucket, s.replicas, DICT_MAX_AGE).await?;
        let reports = bucket(&js, "TCO report bucket", &s.tco_bucket, s.replicas, Duration::ZERO).await?;
        Ok(Self {
            client,
            js,
            atomic,
            marks,
            last_marks: Default::default(),
            dicts,
            reports,
            prefix: s.subject_prefix.clone(),
        })
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

/// Messages in one atomic batch, the server's default `max_msgs`.
const MAX_ATOMIC: usize = 1000;

/// JetStream's error code for an atomic batch holding a `Nats-Msg-Id` it already stored.
const ERR_BATCH_DUPLICATE: u64 = 10201;

/// Atomic batches came with nats-server 2.12.
fn supports_atomic(version: &str) -> bool {
    let mut parts = version.split(['.', '-']).map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 12)
}

#[derive(Debug, Clone)]
struct Outgoing {
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
}

#[derive(Debug)]
enum Atomic {
    Stored,
    /// Refused whole: some of its messages were stored before.
    Duplicate,
}

/// The JetStream messages of `records`, one per record: subject, headers, payload. Message
/// payloads move out of `records` (the rest of each record stays, for [`addressed`]). Records
/// with neither a message nor a gap must have been dropped before.
fn outgoing(
    prefix: &str,
    edge: &str,
    epoch: &str,
    lane: u8,
    records: &mut [WireRecord],
) -> Result<Vec<Outgoing>, SinkError> {
    let mut messages = Vec::with_capacity(records.len());
    for r in records {
        let payload = match (&mut r.message, &r.gap) {
            (Some(m), _) => Bytes::from(std::mem::take(&mut m.payload)),
            (None, Some(g)) => Bytes::from(serde_json::to_vec(g).map_err(|e| failed("gap record", e))?),
            (None, None) => return Err(failed("publish", format!("record {} is empty", r.seq))),
        };
        let (subject, headers) = addressed(prefix, edge, epoch, lane, r);
        messages.push(Outgoing { subject, headers, payload });
    }
    Ok(messages)
}

/// A record's subject and headers.
fn addressed(prefix: &str, edge: &str, epoch: &str, lane: u8, r: &WireRecord) -> (String, HeaderMap) {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", format!("{edge}:{epoch}:{lane}:{}", r.seq).as_str());
    headers.insert("Edge-Id", edge);
    headers.insert("Edge-Seq", format!("{epoch}:{lane}:{}", r.seq).as_str());
    let subject = match &r.message {
        Some(m) => {
            for (name, value) in crate::names::headers(m) {
                headers.append(header_safe(&name, true).as_str(), header_safe(&value, false).as_str());
            }
            crate::names::subject(prefix, edge, &m.topic)
        }
        None => format!("{prefix}.{}.%gap", crate::names::token(edge)),
    };
    (subject, headers)
}

/// A fresh batch id: at most 64 characters, unique among the batches in flight on the server.
fn batch_id() -> String {
    use rand::Rng;
    format!("{:032x}", rand::thread_rng().r#gen::<u128>())
}

fn turn_failed() -> SinkError {
    failed("publish", "the batch before this one failed")
}

/// Publishes `messages` as one atomic batch: every message but the last goes at once without a
/// reply, staged by the server; the last, sent once `turn` came, commits and waits for the
/// batch's ack. So a batch is on its way while the one before it is still committing, and
/// still lands after it or not at all: if the one before failed, this one is never committed
/// and the server drops it.
///
/// Subjects and headers move out of `messages` into the publishes (copying a header map per
/// message was a tenth of the bridge's time); payloads are shared.
async fn publish_atomic(
    client: &async_nats::Client,
    messages: &mut [Outgoing],
    turn: Option<Turn>,
) -> Result<Atomic, SinkError> {
    let id = batch_id();
    let n = messages.len();
    let Some((last, staged)) = messages.split_last_mut() else { return Ok(Atomic::Stored) };
    let with_batch = |m: &mut Outgoing, seq: usize| {
        let mut headers = std::mem::take(&mut m.headers);
        headers.insert("Nats-Batch-Id", id.as_str());
        headers.insert("Nats-Batch-Sequence", seq.to_string().as_str());
        (std::mem::take(&mut m.subject), headers)
    };
    for (i, m) in staged.iter_mut().enumerate() {
        let (subject, headers) = with_batch(m, i + 1);
        client.publish_with_headers(subject, headers, m.payload.clone()).await.map_err(|e| failed("publish", e))?;
    }
    if let Some(turn) = turn
        && !turn.await
    {
        return Err(turn_failed());
    }
    let (subject, mut headers) = with_batch(last, n);
    headers.insert("Nats-Batch-Commit", "1");
    let reply = client
        .request_with_headers(subject, headers, last.payload.clone())
        .await
        .map_err(|e| failed("publish batch", e))?;
    batch_ack(&reply.payload, n)
}

/// Reads a batch commit's reply: `{"stream":..,"seq":..,"batch":..,"count":N}` or an error.
fn batch_ack(reply: &[u8], sent: usize) -> Result<Atomic, SinkError> {
    let v: serde_json::Value = serde_json::from_slice(reply)
        .map_err(|e| failed("publish batch", format!("unreadable ack {:?}: {e}", String::from_utf8_lossy(reply))))?;
    if let Some(err) = v.get("error") {
        if err.get("err_code").and_then(serde_json::Value::as_u64) == Some(ERR_BATCH_DUPLICATE) {
            return Ok(Atomic::Duplicate);
        }
        return Err(failed("publish batch", err));
    }
    match v.get("count").and_then(serde_json::Value::as_u64) {
        Some(count) if count == sent as u64 => Ok(Atomic::Stored),
        _ => Err(failed("publish batch", format!("ack {v} does not count the {sent} messages sent"))),
    }
}

/// Per subject, one publish in flight at a time, the next sent after the last one's ack: a
/// failure then leaves a subject's stored records a prefix of what was sent, and the edge's
/// resend continues it in order. Subjects run side by side.
async fn publish_chains(js: &jetstream::Context, messages: Vec<Outgoing>) -> Result<(), SinkError> {
    let mut chains: Vec<(String, Vec<(HeaderMap, Bytes)>)> = Vec::new();
    let mut chain_of: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for m in messages {
        let i = *chain_of.entry(m.subject.clone()).or_insert_with(|| {
            chains.push((m.subject, Vec::new()));
            chains.len() - 1
        });
        chains[i].1.push((m.headers, m.payload));
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

async fn read_reports(kv: &kv::Store) -> Result<Vec<StoredReport>, SinkError> {
    let mut keys = kv.keys().await.map_err(|e| failed("read reports", e))?;
    let mut out = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| failed("read reports", e))?;
        if let Some(value) = kv.get(&key).await.map_err(|e| failed("read reports", format!("{key}: {e}")))? {
            out.push(serde_json::from_slice(&value).map_err(|e| failed("read reports", format!("{key}: {e}")))?);
        }
    }
    out.sort_by(|a: &StoredReport, b| a.edge.cmp(&b.edge));
    Ok(out)
}

/// Every edge's latest TCO report in `bucket` on the server at `url`, without touching the
/// stream or the other buckets (for `cloud-bridge tco report`).
pub async fn load_reports_from(url: &str, bucket: &str) -> Result<Vec<StoredReport>, SinkError> {
    let client = async_nats::connect(url).await.map_err(|e| failed("connect", format!("{url}: {e}")))?;
    let js = jetstream::new(client);
    match js.get_key_value(bucket).await {
        Ok(kv) => read_reports(&kv).await,
        // No bucket: no edge has reported yet.
        Err(_) => Ok(Vec::new()),
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
    fn pipeline(&self) -> usize {
        // Atomic batches stage while the ones before commit; message by message, only the
        // building of the next batch's messages overlaps.
        if self.atomic { 4 } else { 2 }
    }

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
        turn: Turn,
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        let (client, js, atomic, prefix) = (self.client.clone(), self.js.clone(), self.atomic, self.prefix.clone());
        // Built now, where the batch is received, not when its turn to publish comes: the
        // publish before it is still waiting for JetStream meanwhile.
        let mut records = records;
        records.retain(|r| r.message.is_some() || r.gap.is_some());
        let messages = outgoing(&self.prefix, &edge, &epoch, lane, &mut records);
        async move {
            let mut messages = messages?;
            if !atomic {
                if !turn.await {
                    return Err(turn_failed());
                }
                return publish_chains(&js, messages).await;
            }
            let mut turn = Some(turn);
            for (chunk, records) in messages.chunks_mut(MAX_ATOMIC).zip(records.chunks(MAX_ATOMIC)) {
                match publish_atomic(&client, chunk, turn.take()).await? {
                    Atomic::Stored => {}
                    Atomic::Duplicate => {
                        // The atomic publish took the subjects and headers; address them again.
                        let again = chunk
                            .iter()
                            .zip(records)
                            .map(|(m, r)| {
                                let (subject, headers) = addressed(&prefix, &edge, &epoch, lane, r);
                                Outgoing { subject, headers, payload: m.payload.clone() }
                            })
                            .collect();
                        publish_chains(&js, again).await?
                    }
                }
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

    async fn store_report(&self, report: &StoredReport) -> Result<(), SinkError> {
        let value = Bytes::from(serde_json::to_vec(report).map_err(|e| failed("store report", e))?);
        let key = mark_key(&report.edge, "tco");
        self.reports.put(&key, value).await.map(|_| ()).map_err(|e| failed("store report", format!("{key}: {e}")))
    }

    async fn load_reports(&self) -> Result<Vec<StoredReport>, SinkError> {
        read_reports(&self.reports).await
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
        let cached = self.last_marks.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
        if let Some((mut marks, revision)) = cached {
            marks.insert(lane, up_to.max(marks.get(&lane).copied().unwrap_or(0)));
            let value = Bytes::from(serde_json::to_vec(&marks).map_err(|e| failed("mark", e))?);
            if let Ok(revision) = self.marks.update(&key, value, revision).await {
                self.remember(key, marks, revision);
                return Ok(());
            }
            // Another bridge wrote since: read, then compare-and-set as below.
        }
        for _ in 0..16 {
            let (mut marks, revision) = self.read_marks(&key).await?;
            if marks.get(&lane).is_some_and(|m| *m >= up_to) {
                if let Some(revision) = revision {
                    self.remember(key, marks, revision);
                }
                return Ok(());
            }
            marks.insert(lane, up_to);
            let value = Bytes::from(serde_json::to_vec(&marks).map_err(|e| failed("mark", e))?);
            let result = match revision {
                Some(rev) => self.marks.update(&key, value, rev).await.map_err(|e| e.to_string()),
                None => self.marks.create(&key, value).await.map_err(|e| e.to_string()),
            };
            match result {
                Ok(revision) => {
                    self.remember(key, marks, revision);
                    return Ok(());
                }
                Err(e) => tracing::debug!(key, error = %e, "mark changed under us; retrying"),
            }
        }
        Err(failed("mark", format!("{key}: could not update after 16 attempts")))
    }
}

impl JetStreamSink {
    fn remember(&self, key: String, marks: BTreeMap<u8, u64>, revision: u64) {
        let mut last = self.last_marks.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded by the edges this bridge serves; an edge's old epochs are not worth keeping.
        if last.len() > 10_000 {
            last.clear();
        }
        last.insert(key, (marks, revision));
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

    #[test]
    fn atomic_batches_need_2_12() {
        assert!(supports_atomic("2.12.0"));
        assert!(supports_atomic("2.15.1"));
        assert!(supports_atomic("3.0.0-beta"));
        assert!(!supports_atomic("2.11.9"));
        assert!(!supports_atomic("2.10.22"));
        assert!(!supports_atomic("garbage"));
    }

    #[test]
    fn batch_acks_are_checked() {
        assert!(matches!(batch_ack(br#"{"stream":"T","seq":5,"batch":"b","count":5}"#, 5), Ok(Atomic::Stored)));
        assert!(batch_ack(br#"{"stream":"T","seq":5,"batch":"b","count":4}"#, 5).is_err());
        let dup = br#"{"error":{"code":400,"err_code":10201,"description":"atomic publish batch contains duplicate message id"}}"#;
        assert!(matches!(batch_ack(dup, 5), Ok(Atomic::Duplicate)));
        let e = batch_ack(br#"{"error":{"code":400,"err_code":10174,"description":"atomic publish is disabled"}}"#, 5);
        assert!(e.unwrap_err().to_string().contains("atomic publish is disabled"));
        assert!(batch_ack(b"", 1).is_err());
    }
}
