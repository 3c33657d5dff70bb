//! The production sink: NATS JetStream (2.10 or newer).
//!
//! - Each record is published to `<prefix>.<edge>.<topic levels>` (see `names.rs`) with
//!   `Nats-Msg-Id = <edge>:<epoch>:<lane>:<seq>`, so a resend inside the stream's duplicate
//!   window is dropped by JetStream itself. Gap records go to `<prefix>.<edge>.%gap` (a token no
//!   topic can produce: a `%` in a level is always encoded) with their body as JSON.
//! - A batch goes as one ADR-50 fast-ingest batch on nats-server 2.14 or newer, as atomic
//!   batches of up to 1,000 messages on 2.12 and 2.13, message by message before (see
//!   `publish.rs`). Each way leaves a prefix of the batch stored when it fails part way (per
//!   subject, message by message), so the edge's resend continues every topic in order.
//! - A batch's publishes all acked, and only then, the mark of
//!   (edge, epoch) raised in a KV bucket, with compare-and-set so two bridges racing for one
//!   edge never lower it. A bridge answers a hello from that mark, which is what makes bridges
//!   stateless and exactly-once independent of the duplicate window: what an edge resends after
//!   a reconnect is only what was never marked, at most its in-flight window, and that was
//!   published moments before (well inside the window) unless the bridge died between the
//!   publish acks and the mark.
//! - An edge's epochs are registered under its own key in the marks bucket (`<edge>`, next to
//!   `<edge>.<epoch>` per epoch), its dictionaries at `<edge>.<id>` in the dictionary bucket
//!   with their index at `<edge>`: each with compare-and-set, within the edge's quota
//!   (`sink::quota`).
//! - The stream and bucket are created at start if missing; an existing stream must already
//!   take the prefix's subjects, or the bridge refuses to start, naming it.

use std::collections::BTreeMap;
use std::time::Duration;

mod cluster;
mod presence;
pub(in crate::sink) mod publish;
mod refused;

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
pub use cluster::connect as client;
pub(in crate::sink) use cluster::ensure_replicas as ensure_stream_replicas;
use futures_util::StreamExt;

/// Whether `url` (one server or several, comma-separated) names servers a client can use.
pub fn check_url(url: &str) -> Result<(), SinkError> {
    cluster::servers(url).map(drop)
}
pub use presence::load_fleet_from;
pub use publish::BatchPublish;
use publish::Publishing;
use serde::Serialize;
use shared::proto::{DictAnnounce, LaneSeq, WireRecord};

use super::quota::{DictIndex, EdgeQuota, EpochVerdict, Epochs};
use super::{
    BridgeState, DictStore, EdgeState, FleetStates, FleetStore, RecordSink, Retry, SinkError, SinkMetrics,
    StoredReport, Turn,
};
use refused::Failure;
use shared::units::now_ms;

/// The moment's failure of `what`, no error value to classify (a timeout of our own).
fn unavailable(what: &'static str, reason: impl std::fmt::Display) -> SinkError {
    SinkError::Unavailable { what, reason: reason.to_string() }
}

/// Dictionaries not stored again for this long expire. An edge names the ones it uses in every
/// hello and announces again any the bridge no longer has, so expiry only bounds the bucket
/// (of dictionaries stored before they were per edge, too).
const DICT_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

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

#[derive(Debug, Clone)]
pub struct JetStreamSettings {
    pub url: String,
    pub stream: String,
    pub subject_prefix: String,
    pub marks_bucket: String,
    pub dicts_bucket: String,
    pub tco_bucket: String,
    pub fleet_bucket: String,
    /// The schema registry's bucket.
    pub schemas_bucket: String,
    pub duplicate_window: Duration,
    /// Required on a clustered server (`cluster::replicas`); 1 on a single one when absent.
    pub replicas: Option<usize>,
    /// Batch publishing, as far as the server has it.
    pub batches: BatchPublish,
    /// How long connecting and the first JetStream requests are retried at start.
    pub startup_retry: Duration,
    /// The downlink's stream and bucket.
    pub down: crate::sink::downlink::jetstream::DownSettings,
}

/// Marks per lane of one (edge, epoch), and the KV revision they were written at.
type MarksAt = (BTreeMap<u8, u64>, u64);

#[derive(Debug, Clone)]
pub struct JetStreamSink {
    client: async_nats::Client,
    js: jetstream::Context,
    /// How batches are published: what the server has and the config allows.
    publishing: Publishing,
    marks: kv::Store,
    /// Per mark key, the marks and revision this bridge last wrote: the next mark tries a
    /// compare-and-set on that revision first, one round trip instead of a read and a write.
    last_marks: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, MarksAt>>>,
    dicts: kv::Store,
    reports: kv::Store,
    fleet: kv::Store,
    schemas: kv::Store,
    prefix: String,
    /// The records' stream.
    stream: String,
    /// The server's `max_payload`: a message over it is refused for itself before it is sent.
    max_payload: usize,
    /// The stream's `max_msg_size` when it has one, as of the connect.
    max_msg_size: Option<usize>,
    metrics: std::sync::Arc<SinkMetrics>,
    quota: EdgeQuota,
    down: std::sync::Arc<crate::sink::downlink::jetstream::JsDown>,
}

/// How long a command (not the bridge) tries the servers before it gives up.
const CLI_CONNECT: Duration = Duration::from_secs(10);

/// Attempts of a compare-and-set before the write counts as failed (and is retried later).
pub(in crate::sink) const CAS_ATTEMPTS: usize = 16;

impl JetStreamSink {
    /// Connects to the servers in `s.url` and opens (or creates) the stream and the buckets,
    /// retrying what a cluster still starting answers for `s.startup_retry`.
    pub async fn connect(s: &JetStreamSettings) -> Result<Self, SinkError> {
        let client = cluster::connect(&s.url, s.startup_retry).await?;
        let replicas = cluster::replicas(s.replicas, &client.server_info())?;
        cluster::retrying("start", s.startup_retry, || Box::pin(Self::open(client.clone(), s, replicas))).await
    }

    async fn open(client: async_nats::Client, s: &JetStreamSettings, replicas: usize) -> Result<Self, SinkError> {
        let version = client.server_info().version;
        let js = jetstream::new(client.clone());
        let subjects = format!("{}.>", s.subject_prefix);
        let publishing = Publishing::choose(s.batches, &version);
        if !matches!(
            (s.batches, publishing),
            (BatchPublish::Auto | BatchPublish::Off, _)
                | (BatchPublish::Fast, Publishing::Fast)
                | (BatchPublish::Atomic, Publishing::Atomic)
        ) {
            tracing::warn!(
                version,
                wanted = s.batches.name(),
                using = publishing.name(),
                "nats-server lacks the batch publishing asked for"
            );
        }
        let (fast, atomic) = (publishing == Publishing::Fast, publishing == Publishing::Atomic);
        let mut stream = js
            .get_or_create_stream(stream::Config {
                name: s.stream.clone(),
                subjects: vec![subjects.clone()],
                duplicate_window: s.duplicate_window,
                num_replicas: replicas,
                allow_atomic_publish: atomic,
                allow_batch_publish: fast,
                ..Default::default()
            })
            .await
            .map_err(|e| SinkError::nats("stream", &s.stream, &e))?;
        let info = stream.info().await.map_err(|e| SinkError::nats("stream", &s.stream, &e))?.clone();
        if !info.config.subjects.contains(&subjects) {
            return Err(SinkError::invalid(
                "stream",
                format!("{} exists with subjects {:?}, not {subjects:?}", s.stream, info.config.subjects),
            ));
        }

        // Allowing either kind of batch changes nothing for the stream's other publishers.
        if (atomic && !info.config.allow_atomic_publish) || (fast && !info.config.allow_batch_publish) {
            let config = stream::Config {
                allow_atomic_publish: atomic || info.config.allow_atomic_publish,
                allow_batch_publish: fast || info.config.allow_batch_publish,
                ..info.config.clone()
            };
            js.update_stream(config)
                .await
                .map_err(|e| SinkError::nats("stream", &format!("{}: allow batches", s.stream), &e))?;
            tracing::info!(stream = s.stream, publishing = publishing.name(), "stream now allows batches");
        }
        let config = stream.info().await.map_err(|e| SinkError::nats("stream", &s.stream, &e))?.config.clone();
        cluster::ensure_replicas(&js, "stream", &s.stream, &config, replicas).await?;
        let max_msg_size = usize::try_from(info.config.max_message_size).ok().filter(|n| *n > 0);
        let marks = bucket(&js, "marks bucket", &s.marks_bucket, replicas, Duration::ZERO).await?;
        let dicts = bucket(&js, "dictionary bucket", &s.dicts_bucket, replicas, DICT_MAX_AGE).await?;
        let reports = bucket(&js, "TCO report bucket", &s.tco_bucket, replicas, Duration::ZERO).await?;
        let fleet = bucket(&js, "fleet bucket", &s.fleet_bucket, replicas, Duration::ZERO).await?;
        let schemas = bucket(&js, "schema bucket", &s.schemas_bucket, replicas, Duration::ZERO).await?;
        let down = crate::sink::downlink::jetstream::open(
            &js,
            &s.down,
            (&s.stream, &s.subject_prefix),
            replicas,
            s.duplicate_window,
        )
        .await?;
        Ok(Self {
            js,
            publishing,
            marks,
            last_marks: Default::default(),
            dicts,
            reports,
            fleet,
            schemas,
            prefix: s.subject_prefix.clone(),
            stream: s.stream.clone(),
            max_payload: client.server_info().max_payload,
            max_msg_size,
            metrics: Default::default(),
            quota: EdgeQuota::default(),
            down: std::sync::Arc::new(down),
            client,
        })
    }

    /// Keeps each edge within `quota` from now on.
    pub fn with_quota(mut self, quota: EdgeQuota) -> Self {
        self.quota = quota;
        self
    }

    /// Counts into `metrics` (the bridge's registry) from now on.
    pub fn with_metrics(mut self, metrics: std::sync::Arc<SinkMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// How many times the client connected to the servers: 1 until it lost them.
    pub fn connects(&self) -> u64 {
        self.client.statistics().connects.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(in crate::sink) fn schemas(&self) -> &kv::Store {
        &self.schemas
    }

    pub(in crate::sink) fn down(&self) -> &crate::sink::downlink::jetstream::JsDown {
        &self.down
    }

    async fn read_marks(&self, key: &str) -> Result<(BTreeMap<u8, u64>, Option<u64>), SinkError> {
        read_doc(&self.marks, key, "read mark").await
    }
}

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

/// Dictionary ids are hex digests, which are valid KV keys; anything else an edge names is not
/// looked up.
fn is_dict_key(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A KV key for (edge, epoch): KV keys allow `[-/_=.a-zA-Z0-9]`, so other edge ids go as hex
/// after a `=`, which no plain id holds: two edges never share a key. (Before, the hex came
/// after an `x`, and the plain id `x612e62` had the key of `a.b`. Such an edge's old mark is not
/// read any more; its hello says where its records start, and the lane resumes there.)
fn mark_key(edge: &str, epoch: &str) -> String {
    format!("{}.{epoch}", edge_key(edge))
}

/// An edge's own KV key: its id if that is a valid key token, else `=` and the id in hex. With
/// no `.` in it, it is distinct from every `<edge>.<x>` key.
pub(in crate::sink) fn edge_key(edge: &str) -> String {
    let plain = !edge.is_empty() && edge.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if plain { edge.to_owned() } else { format!("={}", edge.bytes().map(|b| format!("{b:02x}")).collect::<String>()) }
}

/// JetStream refuses a message whose headers pass this (error 10097).
const MAX_HEADERS: usize = 64 << 10;

impl RecordSink for JetStreamSink {
    /// The server's `max_payload` and the stream's `max_msg_size` bound the whole message, and
    /// JetStream bounds its headers; the bridge's own headers (the message id, the QoS) and the
    /// header block's framing are taken off, as `publish::Outgoing::size` counts them.
    fn record_limits(&self, edge: &str, epoch: &str) -> Option<shared::proto::SinkLimits> {
        let id = format!("{edge}:{epoch}:255:{}", shared::proto::MAX_SEQ);
        let own = ("Nats-Msg-Id".len() + id.len() + 4)
            + ("Mqtt-Qos".len() + 1 + 4)
            + shared::proto::SCHEMA_HEADERS_MAX
            + "NATS/1.0\r\n\r\n".len()
            + 16;
        let whole = self.max_msg_size.map_or(self.max_payload, |m| m.min(self.max_payload));
        Some(shared::proto::SinkLimits {
            record_bytes: whole.saturating_sub(own) as u64,
            header_bytes: MAX_HEADERS.saturating_sub(own) as u64,
        })
    }

    fn pipeline(&self) -> usize {
        // Atomic batches stage while the ones before commit; otherwise only the building of the
        // next batch's messages overlaps, since what is sent is stored at once.
        if self.publishing == Publishing::Atomic { 4 } else { 2 }
    }

    async fn admit_epoch(&self, edge: &str, epoch: &str) -> Result<EpochVerdict, SinkError> {
        let key = edge_key(edge);
        for _ in 0..CAS_ATTEMPTS {
            let (mut epochs, revision): (Epochs, _) = read_doc(&self.marks, &key, "read epochs").await?;
            let verdict = epochs.admit(epoch, now_ms(), &self.quota);
            let EpochVerdict::Added { retired } = &verdict else { return Ok(verdict) };
            match write_doc(&self.marks, &key, &epochs, revision).await {
                Ok(_) => {}
                Err(Cas::Changed) => {
                    tracing::debug!(key, "epochs changed under us; retrying");
                    continue;
                }
                Err(Cas::Failed(e)) => return Err(e),
            }
            self.metrics.epochs_registered.inc();
            for old in retired {
                let marks = mark_key(edge, old);
                // Registered as retired first: a purge that fails leaves marks no hello reads.
                if let Err(e) = self.marks.purge(&marks).await {
                    tracing::warn!(key = marks, error = %e, "marks of a retired epoch not deleted");
                }
                self.last_marks.lock().unwrap_or_else(|e| e.into_inner()).remove(&marks);
                self.metrics.epochs_retired.inc();
                tracing::info!(edge, epoch = old, "epoch retired: more than limits.epochs_per_edge");
            }
            return Ok(verdict);
        }
        Err(SinkError::Conflict { what: "register epoch", key: key.to_string(), attempts: CAS_ATTEMPTS as u32 })
    }

    /// The records' stream and the marks' bucket answer their leaders' info: what a write to
    /// either needs (a server down, a stream without a leader or quorum, a lost connection
    /// fail it).
    async fn probe(&self) -> Result<(), SinkError> {
        self.js.get_stream(&self.stream).await.map_err(|e| SinkError::nats("stream", &self.stream, &e))?;
        let mut marks = self.marks.stream.clone();
        marks.info().await.map_err(|e| SinkError::nats("marks", "", &e))?;
        Ok(())
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
        let (client, js, publishing, prefix) =
            (self.client.clone(), self.js.clone(), self.publishing, self.prefix.clone());
        let (metrics, max_payload) = (self.metrics.clone(), self.max_payload);
        // Built now, where the batch is received, not when its turn to publish comes: the
        // publish before it is still waiting for JetStream meanwhile.
        let mut records = records;
        let messages = publish::outgoing(&self.prefix, &edge, &epoch, lane, &mut records);
        async move {
            let mut messages = messages?;
            let dead = refused::dead_subject(&prefix, &edge);
            let address = |r: &WireRecord| publish::addressed(&prefix, &edge, &epoch, lane, r);
            // Every attempt waits for the same turn, which comes once.
            let turn = futures_util::FutureExt::shared(turn);
            let now = || -> Turn { Box::pin(turn.clone()) };
            let mut retry = Retry::default();
            // A message over the server's limit would fail any batch it is in, every time.
            let oversized = messages.iter().any(|m| m.size() > max_payload);
            loop {
                let result = match publishing {
                    _ if oversized => {
                        Err(Failure::Record { reason: "too_large", detail: format!("over max_payload {max_payload}") })
                    }
                    Publishing::Fast => publish::publish_fast(&client, &mut messages, now()).await,
                    Publishing::Atomic => {
                        let aside = (dead.as_str(), &*metrics);
                        publish::publish_atomic_batches(&client, &js, &mut messages, &records, address, now(), aside)
                            .await
                    }
                    Publishing::Messages => {
                        publish::publish_messages(&js, &mut messages, now(), (&dead, &metrics)).await
                    }
                };
                let result = match result {
                    // A batch is refused whole: message by message, the refused ones set aside.
                    Err(Failure::Record { reason, detail }) => {
                        tracing::info!(
                            edge,
                            lane,
                            reason,
                            detail,
                            "batch refused for a record in it; publishing it message by message"
                        );
                        publish::readdress(&mut messages, &records, address);
                        publish::publish_messages(&js, &mut messages, now(), (&dead, &metrics)).await
                    }
                    other => other,
                };
                match result {
                    Ok(()) => {
                        metrics.wrote();
                        return Ok(());
                    }
                    Err(Failure::Transient(e)) => {
                        retry.wait("publish", &e, &metrics).await;
                        publish::readdress(&mut messages, &records, address);
                    }
                    Err(e) => {
                        // Not the moment's: the session ends on it, and `/healthz` says so.
                        let e = e.into_error();
                        metrics.failed(&e);
                        return Err(e);
                    }
                }
            }
        }
    }

    async fn mark(&self, edge: &str, epoch: &str, lane: u8, up_to: u64) -> Result<(), SinkError> {
        let mut retry = Retry::default();
        loop {
            match self.mark_once(edge, epoch, lane, up_to).await {
                Ok(()) => return Ok(()),
                Err(e) => retry.wait("mark", &e, &self.metrics).await,
            }
        }
    }
}

impl DictStore for JetStreamSink {
    async fn load_dicts(&self, edge: &str, ids: &[String]) -> Result<Vec<(String, Vec<u8>)>, SinkError> {
        let edge = edge_key(edge);
        let mut found = Vec::new();
        for id in ids.iter().filter(|id| is_dict_key(id)) {
            let key = format!("{edge}.{id}");
            if let Some(bytes) = self.dicts.get(&key).await.map_err(|e| SinkError::nats("read dict", &key, &e))? {
                found.push((id.clone(), bytes.to_vec()));
            }
        }
        Ok(found)
    }

    async fn store_dict(&self, edge: &str, dict: &DictAnnounce) -> Result<(), SinkError> {
        if !is_dict_key(&dict.id) {
            return Err(SinkError::invalid("store dict", format!("{:?} is not a dictionary id", dict.id)));
        }
        let index_key = edge_key(edge);
        // Counted in the index first: a crash before the bytes are written leaves an entry no
        // hello finds (the edge announces it again), never bytes the quota does not see.
        let mut evicted = None;
        for _ in 0..CAS_ATTEMPTS {
            let (mut index, revision): (DictIndex, _) = read_doc(&self.dicts, &index_key, "read dicts").await?;
            let out = index.add(&dict.id, dict.bytes.len() as u64, now_ms(), &self.quota);
            match write_doc(&self.dicts, &index_key, &index, revision).await {
                Ok(_) => {
                    evicted = Some(out);
                    break;
                }
                Err(Cas::Changed) => tracing::debug!(key = index_key, "dictionary index changed under us; retrying"),
                Err(Cas::Failed(e)) => return Err(e),
            }
        }
        let evicted = evicted.ok_or_else(|| SinkError::Conflict {
            what: "store dict",
            key: index_key.to_string(),
            attempts: CAS_ATTEMPTS as u32,
        })?;
        let key = format!("{index_key}.{}", dict.id);
        // A put refreshes the entry's age, so a dictionary in use does not expire.
        self.dicts
            .put(&key, Bytes::from(dict.bytes.clone()))
            .await
            .map_err(|e| SinkError::nats("store dict", &key, &e))?;
        for id in evicted {
            let key = format!("{index_key}.{id}");
            if let Err(e) = self.dicts.purge(&key).await {
                tracing::warn!(key, error = %e, "evicted dictionary not deleted; it expires");
            }
            self.metrics.dicts_evicted.inc();
            tracing::info!(edge, id, "dictionary evicted: past the edge's dictionary quota");
        }
        Ok(())
    }
}

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
        presence::store_edge_states(&self.fleet, states).await
    }

    async fn store_bridge_state(&self, state: &BridgeState) -> Result<(), SinkError> {
        presence::store_bridge_state(&self.fleet, state).await
    }

    async fn load_fleet(&self) -> Result<FleetStates, SinkError> {
        presence::load_fleet(&self.fleet).await
    }
}

impl JetStreamSink {
    async fn mark_once(&self, edge: &str, epoch: &str, lane: u8, up_to: u64) -> Result<(), SinkError> {
        // Compare-and-set; a concurrent bridge's higher mark wins.
        let key = mark_key(edge, epoch);
        let cached = self.last_marks.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
        if let Some((mut marks, revision)) = cached {
            marks.insert(lane, up_to.max(marks.get(&lane).copied().unwrap_or(0)));
            let value = Bytes::from(serde_json::to_vec(&marks).map_err(|e| SinkError::invalid("mark", e))?);
            if let Ok(revision) = self.marks.update(&key, value, revision).await {
                self.remember(key, marks, revision);
                return Ok(());
            }
            // Another bridge wrote since: read, then compare-and-set as below.
        }
        for _ in 0..CAS_ATTEMPTS {
            let (mut marks, revision) = self.read_marks(&key).await?;
            if marks.get(&lane).is_some_and(|m| *m >= up_to) {
                if let Some(revision) = revision {
                    self.remember(key, marks, revision);
                }
                return Ok(());
            }
            marks.insert(lane, up_to);
            match write_doc(&self.marks, &key, &marks, revision).await {
                Ok(revision) => {
                    self.remember(key, marks, revision);
                    return Ok(());
                }
                Err(Cas::Changed) => tracing::debug!(key, "mark changed under us; retrying"),
                Err(Cas::Failed(e)) => return Err(e),
            }
        }
        Err(SinkError::Conflict { what: "mark", key: key.to_string(), attempts: CAS_ATTEMPTS as u32 })
    }

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
    fn mark_keys_are_made_safe() {
        assert_eq!(mark_key("edge-1", "ab12"), "edge-1.ab12");
        assert_eq!(mark_key("a.b", "e"), "=612e62.e");
        // No plain id has the key of an escaped one.
        assert_ne!(mark_key("x612e62", "e"), mark_key("a.b", "e"));
        assert_ne!(mark_key("", "e"), mark_key("=", "e"));
    }
}
