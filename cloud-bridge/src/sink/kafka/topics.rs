//! Kafka topics: the names a record's template gives, the partition an edge's records go to,
//! and the topics made if missing or checked if present.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::types::RDKafkaErrorCode;

use super::context::Context;
use super::settings::KafkaSettings;
use super::{kafka_error, odd};
use crate::sink::SinkError;

/// How long an admin request may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What a topic is for: records (deleted by retention) or state (compacted: the latest value
/// per key is what counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Records,
    Compacted,
    /// The downlink's messages: records, with partitions of their own (`downlink.partitions`).
    Downlink,
}

/// The topics this sink knows, with their partition counts; made if missing, checked if
/// present, at most `max_topics` from the records template.
pub(crate) struct Topics {
    admin: std::sync::Arc<AdminClient<Context>>,
    /// Asks for metadata: a client whose poll serves librdkafka's main queue, where its logs
    /// and errors wait (an admin client's does not), so a failure can quote the reason.
    meta: std::sync::Arc<BaseProducer<Context>>,
    settings: KafkaSettings,
    known: Mutex<HashMap<String, i32>>,
    /// Records topics known: bounded by `max_topics`.
    templated: Mutex<usize>,
}

impl Topics {
    pub(crate) fn new(settings: &KafkaSettings) -> Result<Self, SinkError> {
        let admin =
            settings.client()?.create_with_context(Context::default()).map_err(|e| kafka_error("admin client", &e))?;
        let meta = settings
            .client()?
            .create_with_context(Context::default())
            .map_err(|e| kafka_error("metadata client", &e))?;
        Ok(Self {
            admin: std::sync::Arc::new(admin),
            meta: std::sync::Arc::new(meta),
            settings: settings.clone(),
            known: Mutex::default(),
            templated: Mutex::new(0),
        })
    }

    /// The brokers of the cluster, as its metadata lists them. A failure quotes the last error
    /// librdkafka reported, which says why the brokers could not be reached.
    pub(crate) async fn brokers(&self, timeout: Duration) -> Result<usize, SinkError> {
        let meta = self.meta.clone();
        tokio::task::spawn_blocking(move || match meta.client().fetch_metadata(None, timeout) {
            Ok(metadata) => Ok(metadata.brokers().len()),
            Err(e) => {
                let mut error = kafka_error("metadata", &e);
                meta.poll(Duration::from_millis(100));
                if let (SinkError::Unavailable { reason, .. } | SinkError::Kafka { reason, .. }, Some(last)) =
                    (&mut error, meta.context().last_error())
                {
                    reason.push_str(&format!(" (librdkafka: {last})"));
                }
                Err(error)
            }
        })
        .await
        .map_err(|e| SinkError::Task { what: "metadata", reason: e.to_string() })?
    }

    /// Every topic of the cluster, with its partition count.
    pub(crate) async fn listed(&self) -> Result<Vec<(String, i32)>, SinkError> {
        let meta = self.meta.clone();
        tokio::task::spawn_blocking(move || {
            let metadata =
                meta.client().fetch_metadata(None, ADMIN_TIMEOUT).map_err(|e| kafka_error("metadata", &e))?;
            Ok(metadata.topics().iter().map(|t| (t.name().to_owned(), t.partitions().len() as i32)).collect())
        })
        .await
        .map_err(|e| SinkError::Task { what: "metadata", reason: e.to_string() })?
    }

    /// The partitions of records topic `name`, made if missing; `None` when it would be a topic
    /// past `max_topics`.
    pub(crate) async fn records_topic(&self, name: &str) -> Result<Option<i32>, SinkError> {
        if let Some(n) = self.lock().get(name) {
            return Ok(Some(*n));
        }
        {
            let mut templated = self.templated.lock().unwrap_or_else(|e| e.into_inner());
            if *templated >= self.settings.max_topics {
                return Ok(None);
            }
            *templated += 1;
        }
        let made = self.ensure(name, Kind::Records).await;
        if made.is_err() {
            // Not made: it does not count against the bound (a retry may make it).
            let mut templated = self.templated.lock().unwrap_or_else(|e| e.into_inner());
            *templated = templated.saturating_sub(1);
        }
        made.map(Some)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, i32>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The partitions of `name`, which is made with the sink's settings if missing, or checked
    /// against them if present.
    pub(crate) async fn ensure(&self, name: &str, kind: Kind) -> Result<i32, SinkError> {
        if let Some(n) = self.lock().get(name) {
            return Ok(*n);
        }
        let s = &self.settings;
        let replication = s.replication_factor.unwrap_or(1);
        let partitions = match kind {
            Kind::Records => s.partitions,
            Kind::Downlink => s.downlink.partitions,
            // State is read whole at start; a few partitions spread it over the brokers.
            Kind::Compacted => s.partitions.min(3),
        };
        let insync = s.min_insync_replicas.map(|m| m.to_string());
        let max_bytes = match kind {
            Kind::Downlink => super::settings::TOPIC_BYTES,
            _ => s.max_message_bytes + 1024,
        }
        .to_string();
        let mut topic =
            NewTopic::new(name, partitions, TopicReplication::Fixed(replication)).set("max.message.bytes", &max_bytes);
        if kind == Kind::Compacted {
            topic = topic.set("cleanup.policy", "compact");
        }
        if let Some(m) = &insync {
            topic = topic.set("min.insync.replicas", m);
        }
        let results = self
            .admin
            .create_topics([&topic], &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)))
            .await
            .map_err(|e| kafka_error("create topic", &e))?;
        let created = match results.into_iter().next() {
            Some(Ok(_)) => {
                tracing::info!(topic = name, partitions, replication, "kafka: topic created");
                true
            }
            Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => false,
            Some(Err((_, code))) => {
                return Err(SinkError::Kafka {
                    what: "create topic",
                    code: Some(code as i32),
                    reason: format!("{name}: {code}"),
                });
            }
            None => return Err(odd("create topic", format!("{name}: no result"))),
        };
        let partitions = self.check(name, kind, created).await?;
        self.lock().insert(name.to_owned(), partitions);
        Ok(partitions)
    }

    /// Checks a topic against the settings; its partition count.
    /// One this sink just `created` has the configs it was made with: a broker asked right
    /// after may not know them yet (they spread through the metadata log), so only its
    /// partitions are waited for.
    async fn check(&self, name: &str, kind: Kind, created: bool) -> Result<i32, SinkError> {
        let admin = self.admin.clone();
        let topic = name.to_owned();
        // A topic just made is known to its controller before every broker has its metadata
        // and its partitions have leaders: asked again until they do, for ADMIN_TIMEOUT.
        let (partitions, replicas) = tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + ADMIN_TIMEOUT;
            loop {
                let metadata = admin
                    .inner()
                    .fetch_metadata(Some(&topic), ADMIN_TIMEOUT)
                    .map_err(|e| kafka_error("metadata", &e))?;
                let t = metadata.topics().first().ok_or_else(|| odd("metadata", format!("{topic}: not listed")))?;
                let failed = match t.error().map(RDKafkaErrorCode::from) {
                    Some(code) => Some(code),
                    None if t.partitions().is_empty() => Some(RDKafkaErrorCode::UnknownTopicOrPartition),
                    None if t.partitions().iter().any(|p| p.leader() < 0) => Some(RDKafkaErrorCode::LeaderNotAvailable),
                    None => None,
                };
                match failed {
                    None => {
                        let replicas = t.partitions().iter().map(|p| p.replicas().len()).min().unwrap_or(0);
                        return Ok((t.partitions().len() as i32, replicas as i32));
                    }
                    Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::LeaderNotAvailable)
                        if std::time::Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(200))
                    }
                    Some(code) => {
                        return Err(SinkError::Kafka {
                            what: "metadata",
                            code: Some(code as i32),
                            reason: format!("{topic}: {code}"),
                        });
                    }
                }
            }
        })
        .await
        .map_err(|e| SinkError::Task { what: "metadata", reason: e.to_string() })??;
        let s = &self.settings;
        let mismatch = |what: String| SinkError::Invalid { what: "topic", reason: format!("{name}: {what}") };
        if let Some(want) = s.replication_factor
            && replicas < want
        {
            return Err(mismatch(format!("{replicas} replicas, sink.replication_factor asks for {want}")));
        }
        if created {
            return Ok(partitions);
        }
        let configs = self
            .admin
            .describe_configs([&ResourceSpecifier::Topic(name)], &AdminOptions::new())
            .await
            .map_err(|e| kafka_error("describe topic", &e))?;
        let config = match configs.into_iter().next() {
            Some(Ok(c)) => c,
            Some(Err(code)) => {
                return Err(SinkError::Kafka {
                    what: "describe topic",
                    code: Some(code as i32),
                    reason: format!("{name}: {code}"),
                });
            }
            None => return Err(odd("describe topic", format!("{name}: no result"))),
        };
        let value = |key: &str| config.get(key).and_then(|e| e.value.clone()).unwrap_or_default();
        if kind == Kind::Compacted && !value("cleanup.policy").contains("compact") {
            return Err(mismatch(format!(
                "cleanup.policy is {:?}: state topics must be compacted (retention would delete marks, and \
                 edges' resends would then be written twice)",
                value("cleanup.policy")
            )));
        }
        let max_bytes: usize = value("max.message.bytes").parse().unwrap_or(0);
        if kind == Kind::Downlink && max_bytes < super::settings::TOPIC_BYTES {
            return Err(mismatch(format!(
                "max.message.bytes is {max_bytes}: a downlink message may take {} with its headers",
                super::settings::TOPIC_BYTES
            )));
        }
        if let Some(want) = s.min_insync_replicas {
            let have: i32 = value("min.insync.replicas").parse().unwrap_or(1);
            if have < want {
                return Err(mismatch(format!(
                    "min.insync.replicas is {have}, sink.min_insync_replicas asks for {want}"
                )));
            }
        }
        Ok(partitions)
    }
}
