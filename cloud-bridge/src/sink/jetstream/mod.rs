//! The production sink: NATS JetStream (2.10 or newer).
//!
//! - Each record is published to `<prefix>.<edge>.<topic levels>` (see `names.rs`) with
//!   `Nats-Msg-Id = <edge>:<epoch>:<lane>:<seq>`, so a resend inside the stream's duplicate
//!   window is dropped by JetStream itself. Gap records go to `<prefix>.<edge>.%gap` (a token no
//!   topic can produce: a `%` in a level is always encoded) with their body as JSON.
//! - A batch goes as one ADR-50 fast-ingest batch on nats-server 2.14 or newer, as atomic
//!   batches of up to 1,000 messages on 2.12 and 2.13, message by message before (see
//!   `publish.rs`, `fast.rs`, `atomic.rs`); an atomic batch is staged while the one ahead of it
//!   commits. Each way leaves a prefix of the batch stored when it fails part way (per
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

use async_nats::jetstream::{self, kv, stream};

mod atomic;
mod bucket;
mod cluster;
mod dicts;
pub mod downlink;
mod fast;
pub mod fleet;
mod header;
pub(in crate::sink) mod inspect;
mod open;
mod outgoing;
mod publish;
mod records;
mod refused;
mod schemas;

pub use cluster::connect as client;
use publish::Publishing;
pub use publish::{BatchPublish, Staged};

use crate::sink::error::SinkError;
use crate::sink::metrics::SinkMetrics;
use crate::sink::quota::EdgeQuota;

/// Whether `url` (one server or several, comma-separated) names servers a client can use.
pub(crate) fn check_url(url: &str) -> Result<(), SinkError> {
    cluster::servers(url).map(drop)
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
    pub down: DownSettings,
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
    down: std::sync::Arc<JsDown>,
}

/// How long a command (not the bridge) tries the servers before it gives up.
const CLI_CONNECT: Duration = Duration::from_secs(10);

/// Where the downlink lives beside the uplink's stream.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DownSettings {
    pub stream: String,
    pub subject_prefix: String,
    pub bucket: String,
    /// What is not delivered by then is deleted by JetStream.
    pub max_age: shared::units::HumanDuration,
    /// What the news read got, kept a moment for the sessions' reads (`downlink::ahead`): at
    /// most this many bytes; 0 keeps nothing (every message is read twice).
    pub read_ahead_bytes: shared::units::ByteSize,
}

impl Default for DownSettings {
    fn default() -> Self {
        Self {
            stream: "DOWN".into(),
            subject_prefix: "down".into(),
            bucket: "edge-down".into(),
            max_age: shared::units::HumanDuration(Duration::from_secs(7 * 24 * 3600)),
            read_ahead_bytes: shared::units::ByteSize(8 << 20),
        }
    }
}

/// The downlink's stream, bucket and news subscription.
#[derive(Debug)]
pub(in crate::sink) struct JsDown {
    js: jetstream::Context,
    stream: stream::Stream,
    /// The stream's name, for the JSON API.
    name: String,
    /// What one message may weigh: the server's `max_payload`, the stream's `max_msg_size`
    /// (if it has one), as of the connect.
    max_payload: u64,
    max_msg_size: Option<u64>,
    /// Whether the server checks a publish's expected last sequence on a subject filter
    /// (`Nats-Expected-Last-Subject-Sequence-Subject`, nats-server 2.11): a send's bound then
    /// holds across concurrent sends; on older servers two may both take the last room.
    guarded: bool,
    prefix: String,
    positions: kv::Store,
    /// The uplink's stream and subject prefix, where replies arrive.
    uplink: stream::Stream,
    uplink_prefix: String,
    /// The servers, for the hints' connection of their own.
    url: String,
    hints: std::sync::OnceLock<downlink::Hints>,
    /// What the news read got, for the sessions' reads.
    ahead: downlink::ReadAhead,
}

impl JetStreamSink {
    /// Keeps each edge within `quota` from now on.
    pub(crate) fn with_quota(mut self, quota: EdgeQuota) -> Self {
        self.quota = quota;
        self
    }

    /// Counts into `metrics` (the bridge's registry) from now on.
    pub fn with_metrics(mut self, metrics: std::sync::Arc<SinkMetrics>) -> Self {
        self.down.ahead.count_into(metrics.clone());
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

    pub(in crate::sink) fn down(&self) -> &JsDown {
        &self.down
    }
}
