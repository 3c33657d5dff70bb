//! `[sink] kind = "kafka"`: the brokers, how the bridge authenticates to them, where records
//! and marks go, and the bounds on what edges can make the bridge hold (topics, producers).

use std::path::PathBuf;
use std::time::Duration;

use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};
use shared::units::HumanDuration;

use crate::sink::SinkError;

/// The Kafka sink's settings, as `[sink]` holds them.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// Brokers to start from, `host:port` each: a list, or one comma-separated string.
    #[serde(deserialize_with = "crate::sink::config::one_or_several")]
    pub bootstrap: String,
    /// Where a record goes: a template of `{class}`, `{edge}` and `{1}`..`{9}` (the record's
    /// MQTT topic levels, from 1). Characters Kafka does not allow in a topic name become `_`.
    /// Default: `edge.{class}`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// What a record's key is: `edge` (default) or `topic` (its MQTT topic). Either way the
    /// partition is chosen by the edge id, so each edge lane's records keep their order.
    #[serde(default)]
    pub key: RecordKey,
    /// The compacted topic of the committed marks and each edge's epochs. Default: `edge-marks`.
    #[serde(default = "default_marks_topic")]
    pub marks_topic: String,
    /// The compacted topic of what the fleet view shows (each edge's and bridge's state, each
    /// edge's TCO report) and each edge's dictionary index. Default: `edge-state`.
    #[serde(default = "default_state_topic")]
    pub state_topic: String,
    /// The compacted topic of the edges' compression dictionaries. Default: `edge-dicts`.
    #[serde(default = "default_dicts_topic")]
    pub dicts_topic: String,
    /// The compacted topic of the schema registry (`cloud-bridge schema`). Default:
    /// `edge-schemas`.
    #[serde(default = "default_schemas_topic")]
    pub schemas_topic: String,
    /// Where gap records (what an edge lost, and why) go. Default: `edge-gaps`.
    #[serde(default = "default_gaps_topic")]
    pub gaps_topic: String,
    /// Where a record Kafka could never take goes (over `max_message_bytes`, or a topic past
    /// `max_topics`), with its headers and the reason. Default: `edge-dead`.
    #[serde(default = "default_dead_topic")]
    pub dead_letter_topic: String,
    /// Partitions of a records topic the bridge creates. Default: 6.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Copies of each topic the bridge creates. Required on a cluster (3 keeps every committed
    /// record through the loss of one broker); 1 on a single broker when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_factor: Option<i32>,
    /// The topics' `min.insync.replicas`: a commit waits for this many copies. Required with
    /// `replication_factor` above 1 (2 of 3 is the usual).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_insync_replicas: Option<i32>,
    /// The largest record (payload and headers) the bridge writes; the edges hear what is left
    /// of it after the bridge's own headers. At most the brokers' `message.max.bytes`.
    /// Default: 1000000.
    #[serde(default = "default_max_message")]
    pub max_message_bytes: usize,
    /// At most this many topics from the `topic` template: an edge's topics (and classes) are
    /// its own to invent, so a record whose topic would pass the bound is set aside to the
    /// dead-letter topic. Default: 1000.
    #[serde(default = "default_max_topics")]
    pub max_topics: usize,
    /// What the bridge's producers' `transactional.id`s start with: `<prefix>.<instance>.<n>`
    /// (the instance new at each start; a schema subject's writer is
    /// `<prefix>.schemas.<subject>`). Default: `edge-bridge`.
    #[serde(default = "default_txn_prefix")]
    pub transactional_id_prefix: String,
    /// How long the brokers keep a transaction of a bridge that went away open before they abort
    /// it (readers with `read_committed` wait behind it). Default: 10s.
    #[serde(default = "default_txn_timeout")]
    pub transaction_timeout: HumanDuration,
    /// Transactional producers of one bridge (each a librdkafka client with its threads and
    /// connections); each writes the batches of the edges that hash to it, those waiting all
    /// in one transaction. Default: 4.
    #[serde(default = "default_producers")]
    pub producers: usize,
    /// How long a starting bridge keeps trying the brokers before it gives up. Default: 60s.
    #[serde(default = "default_startup_retry")]
    pub startup_retry: HumanDuration,
    /// The downlink's topics and the bounds on what the bridge indexes of them.
    #[serde(default)]
    pub downlink: KafkaDown,
    /// TLS to the brokers (`ca`, and `cert` with `key` for mutual TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<KafkaTls>,
    /// SASL: `mechanism` (`SCRAM-SHA-256`, `SCRAM-SHA-512` or `PLAIN`), `username`, and
    /// `password_file` (its first line) or `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl: Option<KafkaSasl>,
}

/// `[sink.downlink]`: where messages for edges are written (by `send`, or by any Kafka
/// producer: the record key is the edge id, the `Mqtt-Topic` header the topic), where those an
/// edge did not deliver go, and how much of the topic a bridge indexes in memory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaDown {
    /// Default: `edge-down`.
    pub topic: String,
    /// Partitions of it, if the bridge creates it. Default: 6.
    pub partitions: i32,
    /// Messages edges refused or let expire, and those set aside. Default: `edge-down-dead`.
    pub dead_letter_topic: String,
    /// Messages a bridge indexes (where each is, for whom, its size: about 48 bytes each), at
    /// most; past it an edge's newer messages are found by reading its partition. Default:
    /// 1,000,000.
    pub max_indexed: usize,
    /// Of them, per edge at most. Default: 256.
    pub max_indexed_per_edge: usize,
    /// Edges a bridge indexes, at most: record keys are any producer's to invent, and a key
    /// past it is not indexed (counted, and logged) until one goes. Default: 100,000.
    pub max_edges: usize,
}

impl Default for KafkaDown {
    fn default() -> Self {
        Self {
            topic: "edge-down".into(),
            partitions: 6,
            dead_letter_topic: "edge-down-dead".into(),
            max_indexed: 1_000_000,
            max_indexed_per_edge: 256,
            max_edges: 100_000,
        }
    }
}

/// The downlink topic's `max.message.bytes`: a downlink message's most, its headers, and
/// Kafka's framing.
pub(crate) const TOPIC_BYTES: usize =
    shared::proto::down::MAX_DOWN_BYTES + crate::sink::downlink::DOWN_HEADERS as usize + 1024;

/// What a record's key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordKey {
    #[default]
    Edge,
    Topic,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaTls {
    /// CA certificates the brokers' certificates are checked against (PEM); the system's when
    /// absent.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// The bridge's certificate (PEM), for brokers that ask for one.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[serde(default)]
    pub key: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSasl {
    pub mechanism: String,
    pub username: String,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

fn default_topic() -> String {
    "edge.{class}".into()
}
fn default_marks_topic() -> String {
    "edge-marks".into()
}
fn default_state_topic() -> String {
    "edge-state".into()
}
fn default_dicts_topic() -> String {
    "edge-dicts".into()
}
fn default_schemas_topic() -> String {
    "edge-schemas".into()
}
fn default_gaps_topic() -> String {
    "edge-gaps".into()
}
fn default_dead_topic() -> String {
    "edge-dead".into()
}
fn default_partitions() -> i32 {
    6
}
fn default_max_message() -> usize {
    1_000_000
}
fn default_max_topics() -> usize {
    1000
}
fn default_txn_prefix() -> String {
    "edge-bridge".into()
}
fn default_txn_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
fn default_producers() -> usize {
    4
}
fn default_startup_retry() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}

const MECHANISMS: [&str; 3] = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"];

impl KafkaSettings {
    /// Settings with the defaults and these brokers.
    pub fn new(bootstrap: &str) -> Self {
        toml::from_str(&format!("bootstrap = {bootstrap:?}")).expect("the defaults parse")
    }

    /// What is wrong with these settings, each under its key.
    pub(crate) fn check(&self, problems: &mut shared::check::Problems) {
        let mut bad = |key: &str, reason: String| problems.bad(format!("sink.{key}"), reason);
        if self.bootstrap.split(',').all(|b| b.trim().is_empty()) {
            bad("bootstrap", "no broker: give at least one host:port".into());
        }
        if let Err(e) = super::names::Template::parse(&self.topic) {
            bad("topic", e);
        }
        for (key, name) in [
            ("marks_topic", &self.marks_topic),
            ("state_topic", &self.state_topic),
            ("dicts_topic", &self.dicts_topic),
            ("schemas_topic", &self.schemas_topic),
            ("gaps_topic", &self.gaps_topic),
            ("dead_letter_topic", &self.dead_letter_topic),
            ("downlink.topic", &self.downlink.topic),
            ("downlink.dead_letter_topic", &self.downlink.dead_letter_topic),
        ] {
            if let Err(e) = super::names::valid_name(name) {
                bad(key, e);
            }
        }
        for (key, n) in [
            ("partitions", self.partitions as i64),
            ("downlink.partitions", self.downlink.partitions as i64),
            ("downlink.max_indexed", self.downlink.max_indexed as i64),
            ("downlink.max_indexed_per_edge", self.downlink.max_indexed_per_edge as i64),
            ("downlink.max_edges", self.downlink.max_edges as i64),
        ] {
            if n < 1 {
                bad(key, "must be at least 1".into());
            }
        }
        match (self.replication_factor, self.min_insync_replicas) {
            (Some(r), _) if r < 1 => bad("replication_factor", "must be at least 1".into()),
            (Some(r), Some(m)) if m < 1 || m > r => {
                bad("min_insync_replicas", format!("must be between 1 and replication_factor ({r})"))
            }
            (Some(r), None) if r > 1 => bad(
                "min_insync_replicas",
                format!("required with replication_factor {r}: else a commit may rest on one copy"),
            ),
            _ => {}
        }
        if self.max_message_bytes < 1024 {
            bad("max_message_bytes", "must be at least 1024".into());
        }
        if self.max_topics == 0 {
            bad("max_topics", "must be at least 1".into());
        }
        if !(1..=64).contains(&self.producers) {
            bad("producers", format!("must be 1 to 64, not {}", self.producers));
        }
        if self.transaction_timeout.0 < Duration::from_secs(1) {
            bad("transaction_timeout", "must be at least 1s".into());
        }
        if let Some(tls) = &self.tls
            && tls.cert.is_some() != tls.key.is_some()
        {
            bad("tls", "cert and key go together".into());
        }
        if let Some(sasl) = &self.sasl {
            if !MECHANISMS.contains(&sasl.mechanism.as_str()) {
                bad("sasl.mechanism", format!("{:?} is none of {}", sasl.mechanism, MECHANISMS.join(", ")));
            }
            if sasl.password.is_some() == sasl.password_file.is_some() {
                bad("sasl", "give one of password and password_file".into());
            }
        }
        let files = self.tls.iter().flat_map(|t| [("tls.ca", &t.ca), ("tls.cert", &t.cert), ("tls.key", &t.key)]);
        let password = self.sasl.iter().map(|s| ("sasl.password_file", &s.password_file));
        for (key, path) in files.chain(password) {
            if let Some(path) = path {
                problems.file(format!("sink.{key}"), path);
            }
        }
    }

    /// The librdkafka settings every client of this sink shares: the brokers and security.
    pub(crate) fn client(&self) -> Result<ClientConfig, SinkError> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", self.bootstrap.replace(' ', ""));
        c.set("client.id", "cloud-bridge");
        // librdkafka logs through its own callback; its errors come back to us as results.
        c.set("log_level", "3");
        let protocol = match (self.tls.is_some(), self.sasl.is_some()) {
            (false, false) => "plaintext",
            (true, false) => "ssl",
            (false, true) => "sasl_plaintext",
            (true, true) => "sasl_ssl",
        };
        c.set("security.protocol", protocol);
        if let Some(tls) = &self.tls {
            let path = |p: &PathBuf| p.to_string_lossy().into_owned();
            if let Some(ca) = &tls.ca {
                c.set("ssl.ca.location", path(ca));
            }
            if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
                c.set("ssl.certificate.location", path(cert));
                c.set("ssl.key.location", path(key));
            }
        }
        if let Some(sasl) = &self.sasl {
            let password = match (&sasl.password, &sasl.password_file) {
                (Some(p), _) => p.clone(),
                (None, Some(file)) => std::fs::read_to_string(file)
                    .map_err(|source| SinkError::Io { what: "sasl password_file", path: file.clone(), source })?
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
                (None, None) => String::new(),
            };
            c.set("sasl.mechanism", &sasl.mechanism);
            c.set("sasl.username", &sasl.username);
            c.set("sasl.password", password);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        let settings: KafkaSettings = toml::from_str(text).unwrap();
        let mut p = shared::check::Problems::default();
        settings.check(&mut p);
        p.into_vec().into_iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn bad_settings_are_named_by_key() {
        assert!(problems("bootstrap = \"k:9092\"").is_empty());
        let found = problems(
            "bootstrap = []\ntopic = \"x.{nope}\"\nreplication_factor = 3\n\
             [sasl]\nmechanism = \"GSSAPI\"\nusername = \"u\"\n",
        );
        let text = found.join("\n");
        for key in ["sink.bootstrap", "sink.topic", "sink.min_insync_replicas", "sink.sasl.mechanism", "sink.sasl:"] {
            assert!(text.contains(key), "{key} in {text}");
        }
        assert_eq!(found.len(), 5, "{text}");
    }
}
