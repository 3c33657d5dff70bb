//! Apache Kafka as the sink, exactly once through Kafka's transactions.
//!
//! # Records, exactly once
//!
//! A bridge has a few transactional producers of its own ([`pool`], `producers`, ids
//! `<prefix>.<instance>.<n>`), each writing the edges that hash to it. A batch is written in
//! one transaction with its lane's new mark in the compacted marks topic (its records in the
//! topics the `topic` template names, partitioned by the edge id, so a lane's records keep
//! their order in one partition per topic); the batches waiting when a transaction ends go in
//! the next one together (a group commit). Marks are read back with `read_committed`
//! ([`log::StateLog`]), so a mark is seen exactly when the records it covers are. This is how
//! Kafka Connect's exactly-once source connectors (KIP-618) keep their offsets, with the edge's
//! sequence numbers as the offsets.
//!
//! Who may write an edge is its claim ([`claims`]): a bridge taking an edge commits its claim,
//! then fences the producers of the bridges that held the edge before (opening a producer of
//! each of their ids), then reads the marks settled and checks the log shows its claim last.
//! That is what a `transactional.id` per edge lane would do by itself, without a librdkafka
//! client (threads, connections) per lane: a thousand edges on a bridge took 45 s to connect
//! and half a GiB idle that way.
//!
//! Why nothing is written twice or lost:
//! - **A bridge killed mid-batch**: its open transaction is aborted when the edge's next
//!   bridge claims the edge (fencing the dead bridge's producers settles the transaction), or
//!   by the brokers after `transaction_timeout`. Neither its records nor its mark were ever
//!   visible; the edge resends from the mark it hears.
//! - **A bridge that lives on, cut off** (a zombie): once another claimed the edge, its
//!   producers are fenced; it opens them again, but writes for an edge only while the log shows
//!   its own verified claim, and the claim that fenced it is in the log it reads settled after
//!   opening. Its session ends ([`SinkError::Fenced`]).
//! - **A commit that is late while the edge moves**: the new bridge reads the marks only after
//!   fencing, and `init_transactions` of a fenced id first completes a commit the coordinator
//!   had begun. A batch the edge resends that was committed after all is found at or below the
//!   mark and dropped before writing.
//! - **A mark behind another producer's open transaction**: the marks of many lanes share a
//!   partition, and a `read_committed` reader stops at the first open transaction in it (the
//!   last stable offset), which a bridge killed mid-batch leaves until its producers are
//!   fenced or `transaction_timeout` passes. A lane's mark committed behind it is not read
//!   yet. So a claim reads the marks *settled*: past every transaction open at that moment
//!   ([`follow::Follower::read_settled`]), waiting for them to end. The welcome's
//!   `committed` reads only to the last stable offset and may say less than is committed:
//!   the edge then resends, and the lane's producer drops what its mark covers; a hello never
//!   waits on another edge's transaction.
//! - **A commit whose answer was lost** (a broker killed, a leader election): the producer is
//!   closed; it opens again under the same id, which settles what the old one left, reads the
//!   marks settled before its next write, and writes only what is above them.
//! - **Broker kills and elections** under `acks=all` with `min_insync_replicas`: a committed
//!   transaction is on that many replicas; the idempotent producer's sequence numbers keep a
//!   retried produce request from appending twice.
//!
//! Where it is not: a consumer with `read_uncommitted` (Kafka's default isolation level) also
//! sees the records of transactions that were aborted, so a resent batch can appear twice to
//! it. Read the records topics with `isolation.level=read_committed`.
//!
//! # Other state
//!
//! Everything else the bridges share is in Kafka too, so a bridge keeps nothing of its own:
//! each edge's dictionaries (`dicts`), the fleet view's states and TCO reports (`fleet`), the
//! schema registry (`schemas`), all
//! in compacted topics read back whole at start and followed.
//!
//! The marks topic also holds each edge's claim (`o/<edge>`, `v/<edge>` once verified) and its
//! epochs (`e/<edge>`), written only by the bridge holding the claim: Kafka's stand-in for
//! compare-and-set. A schema version is written by a producer opened for its subject alone
//! (`<prefix>.schemas.<subject>`), which fences any other writer of it.

pub(crate) mod claims;
pub(crate) mod context;
pub(crate) mod dicts;
pub(crate) mod down;
pub(crate) mod epochs;
pub(crate) mod fetch;
pub(crate) mod fleet;
pub(crate) mod follow;
pub(crate) mod inspect;
pub(crate) mod log;
pub(crate) mod names;
pub(crate) mod outgoing;
pub(crate) mod plain;
pub(crate) mod pool;
pub(crate) mod records;
pub(crate) mod schemas;
pub mod settings;
pub(crate) mod topics;
pub(crate) mod txn;

use std::sync::Arc;

use rdkafka::error::KafkaError;

use crate::sink::{EdgeQuota, SinkError, SinkMetrics};
use log::{Keep, StateLog};
use names::Template;
use outgoing::Topic;
use pool::Pool;
use records::Stager;
use settings::KafkaSettings;
use topics::{Kind, Topics};

pub use outgoing::Staged;

/// How long the readiness probe, and each attempt of a starting bridge, gives the brokers.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The Kafka sink: brokers, topics, the marks followed, the lane producers.
pub struct KafkaSink {
    settings: KafkaSettings,
    template: Template,
    topics: Arc<Topics>,
    marks: Arc<StateLog>,
    marks_topic: Topic,
    /// Fleet states, reports, dictionary indexes.
    state: Arc<StateLog>,
    state_topic: Topic,
    /// The dictionaries' bytes, by offset.
    dicts: Arc<StateLog>,
    dicts_topic: Topic,
    /// The schema registry's versions and modes.
    schemas: Arc<StateLog>,
    schemas_topic: Topic,
    plain: plain::Plain,
    down: down::KafkaDownlink,
    gaps: Topic,
    dead: Topic,
    pool: Arc<Pool>,
    metrics: Arc<SinkMetrics>,
    quota: EdgeQuota,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink").field("bootstrap", &self.settings.bootstrap).finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// Connects to the brokers, makes or checks the sink's own topics, and reads the marks.
    /// The brokers are tried for `startup_retry` before it gives up.
    pub async fn connect(settings: &KafkaSettings) -> Result<Self, SinkError> {
        let mut problems = shared::check::Problems::default();
        settings.check(&mut problems);
        if let Some(p) = problems.first() {
            return Err(SinkError::invalid("kafka settings", p));
        }
        let template = Template::parse(&settings.topic).map_err(|e| SinkError::invalid("kafka settings", e))?;
        let topics = Arc::new(Topics::new(settings)?);
        let deadline = tokio::time::Instant::now() + settings.startup_retry.0;
        let brokers = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match topics.brokers(left.clamp(std::time::Duration::from_millis(500), PROBE_TIMEOUT)).await {
                Ok(n) => break n,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(error = %e, "kafka: brokers not answering yet; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        };
        if brokers > 1 && settings.replication_factor.is_none() {
            return Err(SinkError::invalid(
                "kafka settings",
                format!(
                    "sink.replication_factor is required on a cluster ({brokers} brokers): 3 keeps every committed record through the loss of one"
                ),
            ));
        }
        let topic = |name: &str, partitions| Topic { name: name.to_owned(), partitions };
        let marks_partitions = topics.ensure(&settings.marks_topic, Kind::Compacted).await?;
        let gaps = topic(&settings.gaps_topic, topics.ensure(&settings.gaps_topic, Kind::Records).await?);
        let dead = topic(&settings.dead_letter_topic, topics.ensure(&settings.dead_letter_topic, Kind::Records).await?);
        let marks_topic = topic(&settings.marks_topic, marks_partitions);
        let marks = Arc::new(StateLog::start(settings, &settings.marks_topic, marks_partitions, Keep::Values)?);
        let state_topic = topic(&settings.state_topic, topics.ensure(&settings.state_topic, Kind::Compacted).await?);
        let state = Arc::new(StateLog::start(settings, &state_topic.name, state_topic.partitions, Keep::Values)?);
        let dicts_topic = topic(&settings.dicts_topic, topics.ensure(&settings.dicts_topic, Kind::Compacted).await?);
        let dicts = Arc::new(StateLog::start(settings, &dicts_topic.name, dicts_topic.partitions, Keep::Offsets)?);
        let schemas_topic =
            topic(&settings.schemas_topic, topics.ensure(&settings.schemas_topic, Kind::Compacted).await?);
        let schemas = Arc::new(StateLog::start(settings, &schemas_topic.name, schemas_topic.partitions, Keep::Values)?);
        for log in [&marks, &state, &dicts, &schemas] {
            log.read_to_end().await?;
        }
        let down = down::KafkaDownlink::start(settings, &topics).await?;
        let pool = Arc::new(Pool::start(settings, marks.clone(), marks_topic.clone()));
        tracing::info!(bootstrap = settings.bootstrap, brokers, "sink: kafka");
        Ok(Self {
            settings: settings.clone(),
            template,
            topics,
            marks,
            marks_topic,
            state,
            state_topic,
            dicts,
            dicts_topic,
            schemas,
            schemas_topic,
            plain: plain::Plain::new(settings)?,
            down,
            gaps,
            dead,
            pool,
            metrics: Arc::new(SinkMetrics::default()),
            quota: EdgeQuota::default(),
        })
    }

    /// Counts into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<SinkMetrics>) -> Self {
        self.pool.count_into(metrics.clone());
        self.metrics = metrics;
        self
    }

    /// Keeps each edge within `quota`.
    pub fn with_quota(mut self, quota: EdgeQuota) -> Self {
        self.quota = quota;
        self
    }

    /// Transactional producers open now (at most `producers`).
    pub fn producers(&self) -> usize {
        self.pool.open()
    }

    /// The `transactional.id`s of this bridge's producers.
    pub fn producer_ids(&self) -> Vec<String> {
        self.pool.shared().claims.ids().to_vec()
    }

    fn stager(&self) -> Stager {
        Stager {
            topics: self.topics.clone(),
            template: self.template.clone(),
            settings: self.settings.clone(),
            gaps: self.gaps.clone(),
            dead: self.dead.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The marks topic's key of (edge, epoch, lane). Edge ids are DNS names and epochs hex, so
/// `/` parts them unambiguously.
pub(crate) fn mark_key(edge: &str, epoch: &str, lane: u8) -> String {
    format!("{}{lane}", marks_prefix(edge, epoch))
}

/// What every [`mark_key`] of (edge, epoch) starts with.
pub(crate) fn marks_prefix(edge: &str, epoch: &str) -> String {
    format!("m/{edge}/{epoch}/")
}

/// The marks topic's key of an edge's epochs.
pub(crate) fn epochs_key(edge: &str) -> String {
    format!("e/{edge}")
}

/// A stored mark's value.
pub(crate) fn parse_mark(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// From a librdkafka error: its code where it has one.
pub(crate) fn kafka_error(what: &'static str, e: &KafkaError) -> SinkError {
    match e {
        KafkaError::MessageProduction(_) | KafkaError::Transaction(_) | KafkaError::AdminOp(_) => {
            SinkError::Kafka { what, code: e.rdkafka_error_code().map(|c| c as i32), reason: e.to_string() }
        }
        _ if e.rdkafka_error_code().is_some_and(transport) => SinkError::Unavailable { what, reason: e.to_string() },
        _ => SinkError::Kafka { what, code: e.rdkafka_error_code().map(|c| c as i32), reason: e.to_string() },
    }
}

/// Whether a code means the brokers are out of reach (the moment's), not that they refused.
fn transport(code: rdkafka::types::RDKafkaErrorCode) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        code,
        C::BrokerTransportFailure | C::AllBrokersDown | C::OperationTimedOut | C::RequestTimedOut | C::Resolve
    )
}

/// The brokers answered, but not as they should have.
pub(crate) fn odd(what: &'static str, reason: impl std::fmt::Display) -> SinkError {
    SinkError::Kafka { what, code: None, reason: reason.to_string() }
}
