//! Edge records in Kafka: a batch's records addressed (topic, partition, key, headers), its
//! epochs admitted, and the batch written with its mark ([`super::pool`]).

use shared::proto::{Lane, LaneSeq, RecordBody, Seq, WireRecord};

use super::KafkaSink;
use super::names::partition_of;
use super::outgoing::{Outgoing, Staged, Topic};
use super::pool::Work;
use super::settings::RecordKey;
use crate::sink::quota::EpochVerdict;
use crate::sink::retry::Retry;
use crate::sink::{DeadLetterLabel, RecordSink, SinkError};

/// A session's batches staged or publishing at once, all of them publishing if staged: a
/// lane's waiting batches then commit in one transaction, not one after another.
const PIPELINE: usize = 8;

/// Headers the bridge adds to each record besides the MQTT ones: `Edge-Id` and `Edge-Seq`
/// (`<epoch>:<lane>:<seq>`), with Kafka's per-header framing counted high.
fn own_headers(edge: &str, epoch: &str) -> usize {
    ("Edge-Id".len() + edge.len() + 8) + ("Edge-Seq".len() + epoch.len() + 4 + 20 + 8)
}

impl RecordSink for KafkaSink {
    type Staged = Staged;

    fn record_limits(&self, edge: &str, epoch: &str) -> Option<shared::proto::SinkLimits> {
        // The key is the edge id or the MQTT topic: the topic is counted among the headers
        // (`Mqtt-Topic`), so counting it again as key keeps the edge's estimate on the safe side.
        let own = own_headers(edge, epoch) + shared::proto::SCHEMA_HEADERS_MAX + edge.len().max(256);
        let whole = self.settings.max_message_bytes.saturating_sub(own) as u64;
        Some(shared::proto::SinkLimits { record_bytes: whole, header_bytes: whole })
    }

    fn pipeline(&self) -> usize {
        // Staging makes topics and builds records while the batches ahead commit.
        PIPELINE
    }

    async fn admit_epoch(&self, edge: &str, epoch: &str) -> Result<EpochVerdict, SinkError> {
        let verdict = super::epochs::admit(self, edge, epoch).await?;
        if let EpochVerdict::Added { retired } = &verdict {
            self.metrics.epochs_registered.inc();
            for old in retired {
                self.metrics.epochs_retired.inc();
                tracing::info!(edge, epoch = old, "epoch retired: more than limits.epochs_per_edge");
            }
        }
        Ok(verdict)
    }

    async fn committed(&self, edge: &str, epoch: &str) -> Result<Vec<LaneSeq>, SinkError> {
        // To the last stable offset, not settled: a mark behind another lane's open transaction
        // may be missed and the edge resend what it covers, which the lane's producer, reading
        // settled, drops (the module's design note); a hello never waits on another edge.
        self.marks.read_to_end().await?;
        let prefix = &super::marks_prefix(edge, epoch);
        let mut lanes = std::collections::BTreeMap::new();
        for (key, value) in self.marks.scan(prefix) {
            let seq = super::parse_mark(&value).ok_or_else(|| SinkError::corrupt("read mark", &key, "not a number"))?;
            lanes.insert(key, seq);
        }
        // What this bridge committed and the log does not show yet.
        for (key, seq) in self.pool.committed(prefix) {
            let mark = lanes.entry(key).or_insert(0);
            *mark = (*mark).max(seq);
        }
        let mut out = Vec::new();
        for (key, seq) in lanes {
            let Ok(lane) = key[prefix.len()..].parse::<u8>() else { continue };
            out.push(LaneSeq { lane: Lane(lane), seq: Seq(seq) });
        }
        out.sort_by_key(|l| l.lane);
        Ok(out)
    }

    fn stage(
        &self,
        edge: String,
        epoch: String,
        lane: u8,
        records: Vec<WireRecord>,
    ) -> impl Future<Output = Result<Staged, SinkError>> + Send + 'static {
        let stager = self.stager();
        async move { stager.stage(edge, epoch, lane, records).await }
    }

    fn publish(&self, staged: Staged) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        self.publish_after(staged, None)
    }

    /// A lane's batches wait in order in their producer's queue, each until the lane's mark
    /// covers `after` ([`super::pool`]): several at once go in one transaction.
    fn publish_ahead(&self) -> usize {
        PIPELINE
    }

    fn publish_after(
        &self,
        staged: Staged,
        after: Option<u64>,
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        let (pool, metrics) = (self.pool.clone(), self.metrics.clone());
        let staged = std::sync::Arc::new(staged);
        // Queued now, in the order of the calls.
        let first = pool.submit_now(&staged.edge, Work::Batch { staged: staged.clone(), after });
        async move {
            let mut retry = Retry::default();
            let mut answer = first.await;
            loop {
                // A batch is written whole or not at all, so trying again is always safe.
                match answer {
                    Ok(_) => {
                        metrics.wrote();
                        return Ok(());
                    }
                    Err(e @ SinkError::Fenced { .. }) => return Err(e),
                    Err(e) => retry.wait("publish", &e, &metrics).await,
                }
                answer = pool.submit(&staged.edge, Work::Batch { staged: staged.clone(), after }).await;
            }
        }
    }

    /// The batch's transaction raised the mark with its records: here the mark is only
    /// checked. A mark past what was written is the caller's error, never written.
    async fn mark(&self, edge: &str, epoch: &str, lane: u8, up_to: u64) -> Result<(), SinkError> {
        // Asked right after the batch's commit: its mark is known without waiting in the
        // producer's queue behind the next group's transaction.
        if self.pool.known_mark(edge, epoch, lane).is_some_and(|m| m >= up_to) {
            return Ok(());
        }
        let mut retry = Retry::default();
        loop {
            match self.pool.submit(edge, Work::Mark { epoch: epoch.to_owned(), lane }).await {
                Ok(m) if m >= up_to => return Ok(()),
                Ok(m) => {
                    return Err(SinkError::invalid(
                        "mark",
                        format!("lane {lane} asked to be marked to {up_to}, its records written to {m}"),
                    ));
                }
                Err(e @ SinkError::Fenced { .. }) => return Err(e),
                Err(e) => retry.wait("mark", &e, &self.metrics).await,
            }
        }
    }

    async fn probe(&self) -> Result<(), SinkError> {
        self.topics.brokers(super::PROBE_TIMEOUT).await.map(|_| ())
    }
}

/// What staging needs of the sink, owned, so stagings run beside a publish.
pub(crate) struct Stager {
    pub(crate) topics: std::sync::Arc<super::topics::Topics>,
    pub(crate) template: super::names::Template,
    pub(crate) settings: super::settings::KafkaSettings,
    pub(crate) gaps: Topic,
    pub(crate) dead: Topic,
    pub(crate) metrics: std::sync::Arc<crate::sink::SinkMetrics>,
}

impl Stager {
    /// The batch's records addressed; those Kafka could never take set aside to the dead-letter
    /// topic with the reason (a lane would otherwise stop at them).
    async fn stage(
        &self,
        edge: String,
        epoch: String,
        lane: u8,
        records: Vec<WireRecord>,
    ) -> Result<Staged, SinkError> {
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            let seq = r.seq.0;
            let mut headers: Vec<(String, Vec<u8>)> = vec![
                ("Edge-Id".into(), edge.clone().into_bytes()),
                ("Edge-Seq".into(), format!("{epoch}:{lane}:{seq}").into_bytes()),
            ];
            let (topic, key, payload) = match r.body {
                RecordBody::Message(m) => {
                    headers.extend(
                        crate::names::headers(&m)
                            .into_iter()
                            .map(|(n, v)| (n.into_owned(), v.into_owned().into_bytes())),
                    );
                    let name = self.template.expand(&m.class, &edge, &m.topic);
                    let key = match self.settings.key {
                        RecordKey::Edge => edge.clone().into_bytes(),
                        RecordKey::Topic => m.topic.clone().into_bytes(),
                    };
                    let topic = match self.topics.records_topic(&name).await? {
                        Some(partitions) => Topic { name, partitions },
                        None => {
                            self.dead_letter(&mut headers, "topics", &name);
                            self.dead.clone()
                        }
                    };
                    (topic, key, m.payload)
                }
                RecordBody::Gap(g) => {
                    let payload = serde_json::to_vec(&g).map_err(|e| SinkError::invalid("gap record", e))?;
                    (self.gaps.clone(), edge.clone().into_bytes(), payload)
                }
            };
            let partition = partition_of(&edge, topic.partitions);
            let mut o = Outgoing { seq, topic: topic.name, partition, key, headers, payload, tombstone: false };
            if o.size() > self.settings.max_message_bytes {
                // Kept: what it was and where it came from; gone: the payload that cannot fit.
                let wanted = std::mem::take(&mut o.topic);
                o.payload = Vec::new();
                self.dead_letter(&mut o.headers, "too_large", &wanted);
                o.headers.retain(|(n, v)| n.starts_with("Edge-") || n.starts_with("Mqtt-Topic") || v.len() < 1024);
                o.topic = self.dead.name.clone();
                o.partition = partition_of(&edge, self.dead.partitions);
            }
            out.push(o);
        }
        Ok(Staged { edge, epoch, lane, records: out })
    }

    fn dead_letter(&self, headers: &mut Vec<(String, Vec<u8>)>, reason: &'static str, topic: &str) {
        self.metrics.dead_letters.get_or_create(&DeadLetterLabel { reason }).inc();
        headers.push(("Edge-Refused".into(), reason.as_bytes().to_vec()));
        headers.push(("Edge-Topic".into(), topic.as_bytes().to_vec()));
    }
}
