//! One type for whichever sink `[sink]` names ([`super::config::SinkConfig::open`]): the bridge
//! and every command run on it, so each is compiled once, not once per backend, and a backend
//! is added here as one variant and one arm of [`each!`].
//!
//! Every call is the backend's own, passed through; nothing here decides anything.

use std::future::Future;
use std::time::Duration;

use futures_util::TryFutureExt;
use futures_util::future::BoxFuture;

use shared::proto::{DictAnnounce, LaneSeq, SinkLimits, WireRecord};
use shared::schema::{Compatibility, Version};

use super::downlink::{
    Backlog, DownBounds, DownDeadLetter, DownDone, DownLimit, DownState, DownSummary, DownlinkStore, EnqueuedMany,
    Outgoing, Pending, ReadLimit, Reply,
};
use super::error::SinkError;
use super::jetstream::JetStreamSink;
use super::kafka::KafkaSink;
use super::presence::{BridgeState, EdgeState, FleetStates, StoredReport};
use super::quota::EpochVerdict;
use super::schemas::{SchemaStore, Subject};
use super::sqlite::SqliteSink;
use super::{DictStore, FleetStore, RecordSink};

/// The sink a bridge or a command opened.
#[derive(Debug, Clone)]
pub enum AnySink {
    Sqlite(SqliteSink),
    /// Boxed: its streams' and buckets' cached infos are kilobytes.
    JetStream(Box<JetStreamSink>),
    /// Shared: its clients and followers are one per process.
    Kafka(std::sync::Arc<KafkaSink>),
}

/// `$body` with `$s` bound to the backend, whichever it is.
macro_rules! each {
    ($self:expr, $s:ident => $body:expr) => {
        match $self {
            AnySink::Sqlite($s) => $body,
            AnySink::JetStream($s) => $body,
            AnySink::Kafka($s) => $body,
        }
    };
}

/// A batch staged by an [`AnySink`], for the same one.
#[derive(Debug)]
pub enum AnyStaged {
    Sqlite(super::sqlite::Staged),
    /// Boxed: it holds the batch's messages and its staging.
    JetStream(Box<super::jetstream::Staged>),
    Kafka(super::kafka::Staged),
}

impl RecordSink for AnySink {
    type Staged = AnyStaged;

    fn pipeline(&self) -> usize {
        each!(self, s => s.pipeline())
    }

    fn record_limits(&self, edge: &str, epoch: &str) -> Option<SinkLimits> {
        each!(self, s => s.record_limits(edge, epoch))
    }

    async fn admit_epoch(&self, edge: &str, epoch: &str) -> Result<EpochVerdict, SinkError> {
        each!(self, s => s.admit_epoch(edge, epoch).await)
    }

    async fn committed(&self, edge: &str, epoch: &str) -> Result<Vec<LaneSeq>, SinkError> {
        each!(self, s => s.committed(edge, epoch).await)
    }

    fn stage(
        &self,
        edge: String,
        epoch: String,
        lane: u8,
        records: Vec<WireRecord>,
    ) -> impl Future<Output = Result<AnyStaged, SinkError>> + Send + 'static {
        // One allocation per batch, beside the batch's own.
        let stage: BoxFuture<'static, _> = match self {
            AnySink::Sqlite(s) => Box::pin(s.stage(edge, epoch, lane, records).map_ok(AnyStaged::Sqlite)),
            AnySink::JetStream(s) => {
                Box::pin(s.stage(edge, epoch, lane, records).map_ok(|s| AnyStaged::JetStream(Box::new(s))))
            }
            AnySink::Kafka(s) => Box::pin(s.stage(edge, epoch, lane, records).map_ok(AnyStaged::Kafka)),
        };
        stage
    }

    fn publish(&self, staged: AnyStaged) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        let publish: BoxFuture<'static, _> = match (self, staged) {
            (AnySink::Sqlite(s), AnyStaged::Sqlite(staged)) => Box::pin(s.publish(staged)),
            (AnySink::JetStream(s), AnyStaged::JetStream(staged)) => Box::pin(s.publish(*staged)),
            (AnySink::Kafka(s), AnyStaged::Kafka(staged)) => Box::pin(s.publish(staged)),
            _ => Box::pin(std::future::ready(Err(SinkError::Invalid {
                what: "publish",
                reason: "a batch staged by another kind of sink".into(),
            }))),
        };
        publish
    }

    fn publish_ahead(&self) -> usize {
        each!(self, s => s.publish_ahead())
    }

    fn publish_after(
        &self,
        staged: AnyStaged,
        after: Option<u64>,
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        let publish: BoxFuture<'static, _> = match (self, staged) {
            (AnySink::Kafka(s), AnyStaged::Kafka(staged)) => Box::pin(s.publish_after(staged, after)),
            (_, staged) => Box::pin(self.publish(staged)),
        };
        publish
    }

    async fn mark(&self, edge: &str, epoch: &str, lane: u8, up_to: u64) -> Result<(), SinkError> {
        each!(self, s => s.mark(edge, epoch, lane, up_to).await)
    }

    async fn probe(&self) -> Result<(), SinkError> {
        each!(self, s => s.probe().await)
    }
}

impl DictStore for AnySink {
    async fn load_dicts(&self, edge: &str, ids: &[String]) -> Result<Vec<(String, Vec<u8>)>, SinkError> {
        each!(self, s => s.load_dicts(edge, ids).await)
    }

    async fn store_dict(&self, edge: &str, dict: &DictAnnounce) -> Result<(), SinkError> {
        each!(self, s => s.store_dict(edge, dict).await)
    }
}

impl FleetStore for AnySink {
    async fn store_report(&self, report: &StoredReport) -> Result<(), SinkError> {
        each!(self, s => s.store_report(report).await)
    }

    async fn load_reports(&self) -> Result<Vec<StoredReport>, SinkError> {
        each!(self, s => s.load_reports().await)
    }

    async fn store_edge_states(&self, states: Vec<EdgeState>) -> Result<Vec<bool>, SinkError> {
        each!(self, s => s.store_edge_states(states).await)
    }

    async fn store_bridge_state(&self, state: &BridgeState) -> Result<(), SinkError> {
        each!(self, s => s.store_bridge_state(state).await)
    }

    async fn load_fleet(&self) -> Result<FleetStates, SinkError> {
        each!(self, s => s.load_fleet().await)
    }
}

impl DownlinkStore for AnySink {
    fn down_limit(&self) -> DownLimit {
        each!(self, s => s.down_limit())
    }

    async fn enqueue_many(&self, edge: &str, msgs: &[Outgoing], bounds: DownBounds) -> EnqueuedMany {
        each!(self, s => s.enqueue_many(edge, msgs, bounds).await)
    }

    async fn down_trim(&self, edge: &str, bounds: DownBounds, max: usize) -> Result<u64, SinkError> {
        each!(self, s => s.down_trim(edge, bounds, max).await)
    }

    async fn down_state(&self, edge: &str) -> Result<DownState, SinkError> {
        each!(self, s => s.down_state(edge).await)
    }

    async fn down_read(&self, edge: &str, after: u64, max: ReadLimit) -> Result<Vec<Pending>, SinkError> {
        each!(self, s => s.down_read(edge, after, max).await)
    }

    async fn down_record(&self, edge: &str, done: &DownDone) -> Result<(), SinkError> {
        each!(self, s => s.down_record(edge, done).await)
    }

    async fn down_set_aside(&self, edge: &str, seq: u64, outcome: &'static str, reason: &str) -> Result<(), SinkError> {
        each!(self, s => s.down_set_aside(edge, seq, outcome, reason).await)
    }

    async fn down_backlog(&self, edge: &str) -> Result<Backlog, SinkError> {
        each!(self, s => s.down_backlog(edge).await)
    }

    async fn down_dead_letters(&self, edge: Option<&str>, limit: usize) -> Result<Vec<DownDeadLetter>, SinkError> {
        each!(self, s => s.down_dead_letters(edge, limit).await)
    }

    async fn down_summary(&self) -> Result<Vec<DownSummary>, SinkError> {
        each!(self, s => s.down_summary().await)
    }

    async fn reply_cursor(&self) -> Result<u64, SinkError> {
        each!(self, s => s.reply_cursor().await)
    }

    async fn find_reply(
        &self,
        edge: &str,
        topic: &str,
        correlation: &[u8],
        cursor: u64,
    ) -> Result<Option<Reply>, SinkError> {
        each!(self, s => s.find_reply(edge, topic, correlation, cursor).await)
    }

    async fn down_news(&self, cursor: Option<u64>, wait: Duration) -> Result<(u64, Vec<String>), SinkError> {
        each!(self, s => s.down_news(cursor, wait).await)
    }
}

impl SchemaStore for AnySink {
    async fn schema_versions(&self, subject: &str) -> Result<Vec<Version>, SinkError> {
        each!(self, s => s.schema_versions(subject).await)
    }

    async fn schema_put(&self, v: &Version) -> Result<bool, SinkError> {
        each!(self, s => s.schema_put(v).await)
    }

    async fn schema_mode(&self, subject: &str) -> Result<Option<Compatibility>, SinkError> {
        each!(self, s => s.schema_mode(subject).await)
    }

    async fn schema_set_mode(&self, subject: &str, mode: Compatibility) -> Result<(), SinkError> {
        each!(self, s => s.schema_set_mode(subject, mode).await)
    }

    async fn schema_subjects(&self) -> Result<Vec<Subject>, SinkError> {
        each!(self, s => s.schema_subjects().await)
    }

    async fn schema_all(&self) -> Result<Vec<Version>, SinkError> {
        each!(self, s => s.schema_all().await)
    }
}
