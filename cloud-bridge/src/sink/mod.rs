//! Where committed edge records go. A batch lands in two steps, not one: [`RecordSink::publish`]
//! writes its records idempotently (a record written twice is kept once, by its
//! `{edge}:{epoch}:{lane}:{seq}` key), then, once every batch before it in the lane published,
//! the session calls [`RecordSink::mark`] to raise the committed mark of (edge, epoch, lane). A crash
//! between the two leaves records with no mark over them: the edge resends them, and the
//! idempotent publish keeps one copy. The bridge acks an edge only after `mark` returned, and
//! answers an edge's hello with `committed`, so any bridge instance can take over any edge.
//! docs/ARCHITECTURE.md follows one record through both steps.
//!
//! A write that fails for the moment (the server away, a full disk, a timeout) is retried by
//! the sink with backoff ([`Retry`]), on the same session: a sink outage costs the edges
//! latency, not their connections (every edge of a bridge reconnecting at once is a storm of
//! its own). A record a sink refuses for itself is the sink's to set aside (JetStream's
//! dead-letter subject, `sink::jetstream`); the SQLite sink refuses nothing a record can carry
//! within the protocol's limits.
//!
//! What an edge makes a sink keep beyond its records, its epochs and dictionaries, is bounded
//! per edge ([`quota`]). The fleet view's states ([`presence`]) are one per edge and one per
//! bridge, replaced, never appended.

pub mod config;
pub mod downlink;
pub mod health;
pub mod inspect;
pub mod jetstream;
pub mod presence;
pub mod quota;
pub mod schemas;
pub mod sqlite;

use std::future::Future;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use serde::{Deserialize, Serialize};
use shared::proto::{ClassesReport, DictAnnounce, LaneSeq, WireRecord};

pub use downlink::DownlinkStore;
pub use presence::{BridgeState, EdgeState, FleetData, FleetStates, LaneState};
pub use quota::{EdgeQuota, EpochVerdict};
pub use schemas::SchemaStore;

/// An edge's latest TCO classes report as a sink keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredReport {
    pub edge: String,
    /// When it arrived, ms since the Unix epoch.
    pub received_ms: u64,
    pub report: ClassesReport,
}

/// Why a sink call failed, by kind, with the sink's own code where it gave one. `what` names
/// the call (`mark`, `read dicts`, ...); `key` what it was about, where there is one.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// No answer: the connection is down, a request timed out, no server responded. The
    /// moment's; a write is retried ([`Retry`]).
    #[error("sink {what}: unavailable: {reason}")]
    Unavailable { what: &'static str, reason: String },
    /// JetStream answered with an API error: `code` is its `err_code` (nats-server's
    /// `errors.json`), where it gave one.
    #[error("sink {what}: JetStream error{}: {reason}", code.map(|c| format!(" {c}")).unwrap_or_default())]
    JetStream { what: &'static str, code: Option<u64>, reason: String },
    /// SQLite failed: `code` is its extended result code (`SQLITE_BUSY` 5, `SQLITE_FULL` 13, ...).
    #[error("sink {what}: SQLite error {code}: {reason}")]
    Sqlite { what: &'static str, code: i32, reason: String },
    /// A value the sink holds does not parse (a mark, a state, an index, a report).
    #[error("sink {what}: {key} unreadable: {reason}")]
    Corrupt { what: &'static str, key: String, reason: String },
    /// A compare-and-set found the value changed by another writer every time.
    #[error("sink {what}: {key} changed under each of {attempts} attempts (other bridges writing it)")]
    Conflict { what: &'static str, key: String, attempts: u32 },
    /// The call cannot be done with what it was given (not a dictionary id, an empty record);
    /// trying again changes nothing.
    #[error("sink {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    /// A record JetStream refuses for itself that could not be set aside either.
    #[error("sink publish: record refused ({reason}): {detail}")]
    Refused { reason: &'static str, detail: String },
    /// The batch before this one failed, so this one was not made visible.
    #[error("sink publish: the batch before this one failed")]
    Turn,
    /// A file or directory of the sink.
    #[error("sink {what}: {path}: {source}")]
    Io {
        what: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The bridge's own task doing the call ended without an answer (a panic, a cancel).
    #[error("sink {what}: task ended: {reason}")]
    Task { what: &'static str, reason: String },
}

impl SinkError {
    /// The kind as a short label, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkError::Unavailable { .. } => "unavailable",
            SinkError::JetStream { .. } => "jetstream",
            SinkError::Sqlite { .. } => "sqlite",
            SinkError::Corrupt { .. } => "corrupt",
            SinkError::Conflict { .. } => "conflict",
            SinkError::Invalid { .. } => "invalid",
            SinkError::Refused { .. } => "refused",
            SinkError::Turn => "turn",
            SinkError::Io { .. } => "io",
            SinkError::Task { .. } => "task",
        }
    }

    /// From a SQLite error: its extended code, or `Corrupt` for a value of the wrong type.
    pub fn sqlite(what: &'static str, e: rusqlite::Error) -> Self {
        match e {
            rusqlite::Error::SqliteFailure(f, msg) => {
                SinkError::Sqlite { what, code: f.extended_code, reason: msg.unwrap_or_else(|| f.to_string()) }
            }
            e @ (rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)) => {
                SinkError::Corrupt { what, key: "a row".into(), reason: e.to_string() }
            }
            e => SinkError::Sqlite { what, code: 1, reason: e.to_string() },
        }
    }

    /// From a NATS client error: `JetStream` with its code if the server answered with an API
    /// error anywhere in the chain, `Unavailable` otherwise; `key` goes into the reason.
    pub fn nats(what: &'static str, key: &str, e: &(dyn std::error::Error + 'static)) -> Self {
        let reason = if key.is_empty() { e.to_string() } else { format!("{key}: {e}") };
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(c) = cause {
            if let Some(j) = c.downcast_ref::<async_nats::jetstream::Error>() {
                return SinkError::JetStream { what, code: Some(j.error_code().0), reason };
            }
            cause = c.source();
        }
        SinkError::Unavailable { what, reason }
    }

    /// A stored value of `key` that does not parse.
    pub fn corrupt(what: &'static str, key: impl std::fmt::Display, e: impl std::fmt::Display) -> Self {
        SinkError::Corrupt { what, key: key.to_string(), reason: e.to_string() }
    }

    /// A call given what it cannot take.
    pub fn invalid(what: &'static str, reason: impl std::fmt::Display) -> Self {
        SinkError::Invalid { what, reason: reason.to_string() }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct DeadLetterLabel {
    pub reason: &'static str,
}

/// What the sinks count, and whether the sink takes writes ([`health::SinkHealth`], for
/// `/readyz`).
#[derive(Debug)]
pub struct SinkMetrics {
    pub retries: Counter,
    pub dead_letters: Family<DeadLetterLabel, Counter>,
    pub epochs_registered: Counter,
    pub epochs_retired: Counter,
    pub dicts_evicted: Counter,
    /// What `/readyz` reads: the newest write's or probe's outcome.
    pub health: health::SinkHealth,
    /// `health` for Prometheus (alerts).
    pub healthy: Gauge,
}

impl Default for SinkMetrics {
    fn default() -> Self {
        Self {
            retries: Counter::default(),
            dead_letters: Family::default(),
            epochs_registered: Counter::default(),
            epochs_retired: Counter::default(),
            dicts_evicted: Counter::default(),
            health: health::SinkHealth::default(),
            healthy: {
                let g = Gauge::default();
                g.set(1);
                g
            },
        }
    }
}

impl SinkMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register("sink_retries", "Sink writes retried after failing for the moment", self.retries.clone());
        r.register(
            "sink_healthy",
            "1 while the sink's newest write or probe succeeded, 0 while they fail",
            self.healthy.clone(),
        );
        r.register(
            "dead_letters",
            "Records the sink refused for themselves, set aside in its dead-letter subject, by reason",
            self.dead_letters.clone(),
        );
        r.register("epochs_registered", "Epochs edges began that the sink registered", self.epochs_registered.clone());
        r.register(
            "epochs_retired",
            "Epochs retired, marks deleted, past limits.epochs_per_edge of one edge",
            self.epochs_retired.clone(),
        );
        r.register(
            "dicts_evicted",
            "Dictionaries deleted past limits.dicts_per_edge or limits.dict_bytes_per_edge of one edge",
            self.dicts_evicted.clone(),
        );
    }

    pub fn healthy(&self) -> bool {
        self.health.ok()
    }

    /// A write went through.
    pub fn wrote(&self) {
        self.health.wrote(None);
        self.healthy.set(1);
    }

    /// A write failed with `error`.
    pub fn failed(&self, error: &dyn std::fmt::Display) {
        self.health.wrote(Some(error.to_string()));
        self.healthy.set(0);
    }

    /// The probe answered ([`health::run`]).
    pub fn probed(&self, error: Option<String>) {
        self.healthy.set(i64::from(error.is_none()));
        self.health.probed(error);
    }

    /// The probe has not answered in time.
    pub fn probed_late(&self) {
        self.health.probe_waits();
        self.healthy.set(0);
    }
}

/// Backoff for a sink write that failed for the moment: 100 ms doubling to 5 s, with jitter, so
/// the sessions of one bridge do not hit a recovering server in step.
#[derive(Debug)]
pub struct Retry {
    next: Duration,
    attempts: u32,
}

impl Default for Retry {
    fn default() -> Self {
        Self { next: Duration::from_millis(100), attempts: 0 }
    }
}

impl Retry {
    /// Counts the failure, marks the sink unhealthy and waits before the next attempt.
    pub async fn wait(&mut self, what: &str, error: &SinkError, metrics: &SinkMetrics) {
        use rand::Rng;
        metrics.retries.inc();
        metrics.failed(error);
        if self.attempts == 0 {
            tracing::warn!(what, kind = error.kind(), %error, "sink write failed; retrying");
        } else {
            tracing::debug!(what, kind = error.kind(), %error, attempts = self.attempts, "sink write failed again; retrying");
        }
        self.attempts += 1;
        let wait = self.next.mul_f64(rand::thread_rng().gen_range(0.5..1.0));
        self.next = (self.next * 2).min(Duration::from_secs(5));
        tokio::time::sleep(wait).await;
    }
}

/// Resolves once the batch published before this one is in the sink: `true`, or `false` if
/// it failed. A sink makes no record of a batch visible before its turn came with `true`;
/// otherwise a failure of the batch before would land this one's records first and the
/// earlier one's after the edge's resend, out of order. A sink that keeps order by seq itself
/// may ignore it.
pub type Turn = std::pin::Pin<Box<dyn Future<Output = bool> + Send>>;

/// A turn that has come: the first batch of a connection.
pub fn first_turn() -> Turn {
    Box::pin(std::future::ready(true))
}

/// A sink, by concern: edge records and their marks ([`RecordSink`]), the edges' compression
/// dictionaries ([`DictStore`]) and what the fleet view shows ([`FleetStore`]). A session takes
/// all three; the fleet writer and `edges list` only the last.
pub trait Sink: RecordSink + DictStore + FleetStore + DownlinkStore {}

impl<T: RecordSink + DictStore + FleetStore + DownlinkStore> Sink for T {}

/// Edge records, exactly once: epochs admitted, records published idempotently, marks raised
/// over what is published.
pub trait RecordSink: Send + Sync + 'static {
    /// Batches of one edge this sink may publish at once. Each waits for its [`Turn`] before
    /// anything it writes becomes visible, so more than one helps only a sink with work to do
    /// before that (staging a batch, preparing messages).
    fn pipeline(&self) -> usize {
        1
    }

    /// What the sink can store of one record of `edge` and `epoch`, as
    /// `shared::proto::record_size` counts it (its own headers taken off), for the Welcome;
    /// `None` when nothing but the protocol limits it.
    fn record_limits(&self, edge: &str, epoch: &str) -> Option<shared::proto::SinkLimits> {
        let _ = (edge, epoch);
        None
    }

    /// Registers `epoch` among `edge`'s epochs, within the sink's [`EdgeQuota`], retiring the
    /// oldest if there are too many: whether a hello of that epoch may go on. Compare-and-set
    /// where bridges share the sink, so two registering at once both count.
    fn admit_epoch(&self, edge: &str, epoch: &str) -> impl Future<Output = Result<EpochVerdict, SinkError>> + Send;

    /// Per lane, the highest seq of `edge` and `epoch` committed.
    fn committed(&self, edge: &str, epoch: &str) -> impl Future<Output = Result<Vec<LaneSeq>, SinkError>> + Send;

    /// Writes `records` durably and idempotently (a record written twice is kept once), once
    /// `turn` came; the mark does not move. The future owns what it needs, so several can run
    /// at once.
    fn publish(
        &self,
        edge: String,
        epoch: String,
        lane: u8,
        records: Vec<WireRecord>,
        turn: Turn,
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'static;

    /// Raises the committed mark of (edge, epoch, lane) to `up_to`, never lowers it. Called only
    /// once every record up to `up_to` was published.
    fn mark(&self, edge: &str, epoch: &str, lane: u8, up_to: u64)
    -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Whether the sink would take a write now, asked without writing anything (the
    /// readiness probe, [`health::run`]): not what the last write found.
    fn probe(&self) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// [`RecordSink::publish`], then [`RecordSink::mark`].
    fn write(
        &self,
        edge: &str,
        epoch: &str,
        lane: u8,
        records: Vec<WireRecord>,
        up_to: u64,
    ) -> impl Future<Output = Result<(), SinkError>> + Send {
        async move {
            self.publish(edge.to_owned(), epoch.to_owned(), lane, records, first_turn()).await?;
            self.mark(edge, epoch, lane, up_to).await
        }
    }
}

/// The edges' compression dictionaries, where every bridge on the sink finds them.
pub trait DictStore: Send + Sync + 'static {
    /// Of `edge`'s dictionaries `ids`, those stored, with their bytes.
    fn load_dicts(
        &self,
        edge: &str,
        ids: &[String],
    ) -> impl Future<Output = Result<Vec<(String, Vec<u8>)>, SinkError>> + Send;

    /// Stores a dictionary of `edge` (by its id, a hash: storing one twice changes nothing)
    /// where every bridge on this sink finds it, evicting the edge's oldest past its quota.
    fn store_dict(&self, edge: &str, dict: &DictAnnounce) -> impl Future<Output = Result<(), SinkError>> + Send;
}

/// What the fleet view shows: each edge's state and TCO report, each bridge's state.
pub trait FleetStore: Send + Sync + 'static {
    /// Keeps `report` as `edge`'s latest TCO classes, replacing the one before.
    fn store_report(&self, report: &StoredReport) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Every edge's latest TCO classes report.
    fn load_reports(&self) -> impl Future<Output = Result<Vec<StoredReport>, SinkError>> + Send;

    /// Stores each state as its edge's, unless it is the end of a session other than the one
    /// stored ([`EdgeState::replaces`]); whether each was stored, in order. Several at once, so
    /// a sink that commits with a sync pays it once for all.
    fn store_edge_states(&self, states: Vec<EdgeState>) -> impl Future<Output = Result<Vec<bool>, SinkError>> + Send;

    /// Replaces this bridge's own state.
    fn store_bridge_state(&self, state: &BridgeState) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Every edge's and bridge's state, edges in id order.
    fn load_fleet(&self) -> impl Future<Output = Result<FleetStates, SinkError>> + Send;
}
