//! `[sink]`: where edge records go, the embedded SQLite file, a JetStream server (and the
//! buckets beside the stream) or a Kafka cluster.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::any::AnySink;
use super::error::SinkError;
use super::jetstream::{JetStreamSettings, JetStreamSink};
use super::kafka::KafkaSink;
use super::kafka::settings::KafkaSettings;
use super::metrics::SinkMetrics;
use super::quota::EdgeQuota;
use super::sqlite::SqliteSink;

/// How long a command (not a bridge) gives a JetStream cluster to answer.
const COMMAND_RETRY: Duration = Duration::from_secs(10);

// One per process, read at start: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum SinkConfig {
    /// An embedded SQLite file: zero setup, one machine.
    Sqlite { path: PathBuf },
    /// NATS JetStream (2.10 or newer): the stream and the marks bucket are created if missing.
    Jetstream {
        /// One server, or several of a cluster: comma-separated, or a list. Default:
        /// `nats://127.0.0.1:4222`.
        #[serde(default = "default_nats_url", deserialize_with = "one_or_several")]
        url: String,
        /// Default: `EDGE`.
        #[serde(default = "default_stream")]
        stream: String,
        /// Subjects are `<prefix>.<edge>.<topic levels>`. Default: `edge`.
        #[serde(default = "default_prefix")]
        subject_prefix: String,
        /// KV bucket of the committed marks per (edge, epoch). Default: `edge-marks`.
        #[serde(default = "default_bucket")]
        marks_bucket: String,
        /// KV bucket of the zstd dictionaries edges announced, so any bridge can decode their
        /// batches. Default: `edge-dicts`.
        #[serde(default = "default_dicts_bucket")]
        dicts_bucket: String,
        /// KV bucket of each edge's latest TCO classes report, for `cloud-bridge tco report`.
        /// Default: `edge-tco`.
        #[serde(default = "default_tco_bucket")]
        tco_bucket: String,
        /// KV bucket of the fleet view: each edge's last session state and each bridge's, for
        /// `cloud-bridge edges list` and `GET /edges`. Default: `edge-fleet`.
        #[serde(default = "default_fleet_bucket")]
        fleet_bucket: String,
        /// KV bucket of the schema registry (`cloud-bridge schema`). Default: `edge-schemas`.
        #[serde(default = "default_schemas_bucket")]
        schemas_bucket: String,
        /// JetStream's Nats-Msg-Id dedup window. Default: 2m.
        #[serde(default = "default_dup_window")]
        duplicate_window: shared::units::HumanDuration,
        /// Copies of the stream and the buckets. Required on a clustered server (3 keeps every
        /// acknowledged record through the loss of one); 1 on a single server when absent.
        /// An existing stream or bucket with other replicas is scaled to it at start.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replicas: Option<usize>,
        /// How long a starting bridge keeps trying the servers and JetStream's first requests
        /// (a server down, a cluster electing its leader) before it gives up. Default: 60s.
        #[serde(default = "default_startup_retry")]
        startup_retry: shared::units::HumanDuration,
        /// How batches are published: `auto` (default) takes fast ingest on nats-server 2.14
        /// or newer, atomic batches on 2.12 and 2.13, message by message before; `fast` and
        /// `atomic` go no further than the kind named; `off` publishes message by message. The
        /// stream is set to allow the kind used. Each keeps the order per topic across
        /// failures.
        #[serde(default)]
        batches: crate::sink::jetstream::BatchPublish,
        /// The downlink's stream (`stream`, default `DOWN`), its subjects'
        /// `subject_prefix` (default `down`: `down.<edge>.<topic levels>`), the KV `bucket` of
        /// each edge's position (default `edge-down`), and `max_age`, after which what was not
        /// delivered is deleted (default 7d).
        #[serde(default)]
        downlink: crate::sink::jetstream::DownSettings,
    },
    /// Apache Kafka (3.0 or newer; tested on 4.x in KRaft mode): exactly once through
    /// transactions; topics created if missing, checked if present (`sink::kafka::settings`).
    Kafka(KafkaSettings),
}

fn default_nats_url() -> String {
    "nats://127.0.0.1:4222".into()
}
fn default_stream() -> String {
    "EDGE".into()
}
fn default_prefix() -> String {
    "edge".into()
}
fn default_bucket() -> String {
    "edge-marks".into()
}
fn default_dicts_bucket() -> String {
    "edge-dicts".into()
}
fn default_tco_bucket() -> String {
    "edge-tco".into()
}
fn default_schemas_bucket() -> String {
    "edge-schemas".into()
}
fn default_fleet_bucket() -> String {
    "edge-fleet".into()
}
fn default_dup_window() -> shared::units::HumanDuration {
    shared::units::HumanDuration(Duration::from_secs(120))
}
fn default_startup_retry() -> shared::units::HumanDuration {
    shared::units::HumanDuration(Duration::from_secs(60))
}

/// A server list given as one string (comma-separated) or as a TOML list, kept as the string.
pub(crate) fn one_or_several<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Servers {
        One(String),
        Several(Vec<String>),
    }
    Ok(match Servers::deserialize(d)? {
        Servers::One(s) => s,
        Servers::Several(list) => list.join(","),
    })
}

impl SinkConfig {
    /// Opens the sink this names for a bridge: counting into `metrics`, each edge kept within
    /// `quota`, a JetStream cluster given its `startup_retry` to answer.
    pub(crate) async fn open(&self, metrics: Arc<SinkMetrics>, quota: EdgeQuota) -> Result<AnySink, SinkError> {
        let sink = match self {
            SinkConfig::Sqlite { path } => {
                tracing::info!(path = %path.display(), "sink: sqlite");
                AnySink::Sqlite(SqliteSink::open(path)?.with_metrics(metrics).with_quota(quota))
            }
            SinkConfig::Jetstream { url, stream, marks_bucket, .. } => {
                let sink = Box::pin(JetStreamSink::connect(&self.jetstream_settings(None)?)).await?;
                tracing::info!(url, stream, marks_bucket, "sink: jetstream");
                AnySink::JetStream(Box::new(sink.with_metrics(metrics).with_quota(quota)))
            }
            SinkConfig::Kafka(settings) => {
                let sink = Box::pin(KafkaSink::connect(settings)).await?;
                AnySink::Kafka(Arc::new(sink.with_metrics(metrics).with_quota(quota)))
            }
        };
        Ok(sink)
    }

    /// Opens the sink this names for a command: nothing counted, a JetStream cluster given
    /// 10 s to answer.
    pub async fn open_for_command(&self) -> Result<AnySink, SinkError> {
        Ok(match self {
            SinkConfig::Sqlite { path } => AnySink::Sqlite(SqliteSink::open(path)?),
            SinkConfig::Jetstream { .. } => AnySink::JetStream(Box::new(
                Box::pin(JetStreamSink::connect(&self.jetstream_settings(Some(COMMAND_RETRY))?)).await?,
            )),
            SinkConfig::Kafka(settings) => {
                let settings =
                    KafkaSettings { startup_retry: shared::units::HumanDuration(COMMAND_RETRY), ..settings.clone() };
                AnySink::Kafka(Arc::new(Box::pin(KafkaSink::connect(&settings)).await?))
            }
        })
    }

    /// Every edge's latest TCO report in the sink this names, without running a bridge.
    pub async fn load_reports(&self) -> Result<Vec<super::StoredReport>, SinkError> {
        use super::FleetStore;
        match self {
            SinkConfig::Sqlite { path } => SqliteSink::open(path)?.load_reports().await,
            SinkConfig::Jetstream { url, tco_bucket, .. } => {
                super::jetstream::fleet::load_reports_from(url, tco_bucket).await
            }
            SinkConfig::Kafka(_) => self.open_for_command().await?.load_reports().await,
        }
    }

    /// Everything the fleet view shows of the sink this names (states, reports, the downlink),
    /// read without running a bridge.
    pub async fn load_fleet(&self) -> Result<super::FleetData, SinkError> {
        use super::{DownlinkStore, FleetStore};
        let shown = crate::sink::downlink::REFUSED_SHOWN;
        match self {
            SinkConfig::Sqlite { path } => {
                let sink = SqliteSink::open(path)?;
                Ok(super::FleetData {
                    states: sink.load_fleet().await?,
                    reports: sink.load_reports().await?,
                    downlink: sink.down_summary().await?,
                    downlink_refused: sink.down_dead_letters(None, shown).await?,
                })
            }
            SinkConfig::Jetstream { url, tco_bucket, fleet_bucket, downlink, .. } => Ok(super::FleetData {
                states: super::jetstream::fleet::load_fleet_from(url, fleet_bucket).await?,
                reports: super::jetstream::fleet::load_reports_from(url, tco_bucket).await?,
                downlink: super::jetstream::downlink::summary_from(url, downlink).await?,
                downlink_refused: super::jetstream::downlink::dead_letters_from(url, downlink, shown).await?,
            }),
            SinkConfig::Kafka(_) => {
                let sink = self.open_for_command().await?;
                Ok(super::FleetData {
                    states: sink.load_fleet().await?,
                    reports: sink.load_reports().await?,
                    downlink: sink.down_summary().await?,
                    downlink_refused: sink.down_dead_letters(None, shown).await?,
                })
            }
        }
    }

    /// What a JetStream sink connects with, `startup_retry` overridden by `retry`.
    fn jetstream_settings(&self, retry: Option<Duration>) -> Result<JetStreamSettings, SinkError> {
        match self {
            SinkConfig::Sqlite { .. } | SinkConfig::Kafka(_) => Err(SinkError::invalid("open", "not a JetStream sink")),
            SinkConfig::Jetstream {
                url,
                stream,
                subject_prefix,
                marks_bucket,
                dicts_bucket,
                tco_bucket,
                fleet_bucket,
                schemas_bucket,
                duplicate_window,
                replicas,
                batches,
                startup_retry,
                downlink,
            } => Ok(JetStreamSettings {
                url: url.clone(),
                stream: stream.clone(),
                subject_prefix: subject_prefix.clone(),
                marks_bucket: marks_bucket.clone(),
                dicts_bucket: dicts_bucket.clone(),
                tco_bucket: tco_bucket.clone(),
                fleet_bucket: fleet_bucket.clone(),
                schemas_bucket: schemas_bucket.clone(),
                duplicate_window: duplicate_window.0,
                replicas: *replicas,
                batches: *batches,
                startup_retry: retry.unwrap_or(startup_retry.0),
                down: downlink.clone(),
            }),
        }
    }

    /// The nats-server of a JetStream sink, for what else lives beside it (the models' bucket).
    pub fn nats_url(&self) -> Option<&str> {
        match self {
            SinkConfig::Jetstream { url, .. } => Some(url),
            SinkConfig::Sqlite { .. } | SinkConfig::Kafka(_) => None,
        }
    }
}
