//! The edge gateway's configuration: a TOML file, parsed into typed values and validated once
//! at load, so a bad file fails at start with the key and the reason.
//!
//! Relative paths in the file are resolved against the file's own directory, so a config and its
//! certificates can be moved together.

mod load;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shared::units::{ByteSize, HumanDuration};

pub use load::{ConfigError, Problem};

/// The whole edge gateway configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeConfig {
    /// Name of this node, used in logs, metrics and the SLO probe's client id. Default: the
    /// host name, or `edge` if it cannot be read.
    #[serde(default = "default_node_id")]
    pub node_id: String,
    /// Logging.
    #[serde(default)]
    pub log: LogConfig,
    /// Limits of the embedded MQTT broker.
    #[serde(default)]
    pub broker: BrokerConfig,
    /// MQTT listeners. Default: one anonymous listener on `127.0.0.1:1883`.
    #[serde(default = "default_listeners", rename = "listener")]
    pub listeners: Vec<ListenerConfig>,
    /// Password file and topic ACLs.
    #[serde(default)]
    pub auth: AuthConfig,
    /// The HTTP endpoint serving `/metrics` and `/healthz`.
    #[serde(default)]
    pub http: HttpConfig,
    /// The built-in SLO probe.
    #[serde(default)]
    pub probe: ProbeConfig,
    /// The store-and-forward spool.
    #[serde(default)]
    pub spool: SpoolConfig,
    /// Topic classes and their routes; first match wins, unmatched topics stay edge-direct.
    #[serde(default, rename = "class")]
    pub classes: Vec<ClassConfig>,
    /// The QUIC bridge to the cloud. Default: none (the spool fills and evicts by its budget).
    pub uplink: Option<UplinkConfig>,
    /// The TCO model: prices, per-class SLA and pins, live routing. Default: none.
    pub tco: Option<crate::tco::TcoConfig>,
    /// Model parameters this edge follows. Default: none.
    pub models: Option<ModelsConfig>,
}

/// `[models]`: which models to follow, where to stage them, and the key their manifests must
/// be signed with.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsConfig {
    /// Staged versions, `current` links and the chunk cache. Default: `models`.
    #[serde(default = "default_models_dir")]
    pub dir: PathBuf,
    /// The fleet's model signing public key (`cloud-bridge model keygen` writes it).
    pub public_key: PathBuf,
    /// Model names to follow; sent to the bridge in the hello.
    #[serde(default)]
    pub follow: Vec<String>,
    /// Versions kept per model, the current one included. Default: 3.
    #[serde(default = "default_keep")]
    pub keep: usize,
    /// Chunks fetched at once, each on its own QUIC stream. Default: 8.
    #[serde(default = "default_models_parallel")]
    pub parallel: usize,
    /// Chunk cache bound. Default: 2 GiB.
    #[serde(default = "default_cache_budget")]
    pub cache_budget: ByteSize,
    /// Local apps learn a model's current version from the retained message on
    /// `<topic_prefix>/<name>/current`. Default: `models`.
    #[serde(default = "default_models_topic")]
    pub topic_prefix: String,
}

fn default_models_dir() -> PathBuf {
    PathBuf::from("models")
}
fn default_models_parallel() -> usize {
    8
}
fn default_keep() -> usize {
    3
}
fn default_cache_budget() -> ByteSize {
    ByteSize::mib(2048)
}
fn default_models_topic() -> String {
    "models".into()
}

/// The QUIC uplink to a cloud bridge (ehb/1, mutual TLS).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UplinkConfig {
    /// The bridge's UDP address, `host:port`.
    pub server: String,
    /// The name the bridge's certificate must carry. Default: the host part of `server`.
    pub server_name: Option<String>,
    /// The CA that signed the bridge's certificate (PEM).
    pub ca: PathBuf,
    /// This edge's client certificate and key (PEM); the cloud knows the edge by the
    /// certificate's first DNS name.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Batches sent and not yet acked at most. Default: 8.
    #[serde(default = "default_window")]
    pub window: usize,
    /// Records per batch at most (a batch also stops at 8 MiB of messages). Default: 1024. Each
    /// batch costs a spool transaction for its ack, a JetStream batch and a committed mark:
    /// draining a million 1 KiB records on the 2-core test machine, 1024 reached a median 0.74
    /// of raw JetStream publishing over eight drains, 512 a median 0.70 over eleven.
    #[serde(default = "default_batch_records")]
    pub batch_records: usize,
    /// How long records may wait for a batch to fill before it is sent anyway; a full batch
    /// goes at once, so this only matters at low rates. Longer makes fuller batches (better
    /// compression, fewer datagrams) at the cost of up to that much latency to the cloud: on the
    /// shared trace, 1s sends 0.29 of the topic and payload bytes, 100ms about 0.4 (see
    /// docs/BENCHMARKS.md). Default: 1s.
    #[serde(default = "default_linger")]
    pub linger: HumanDuration,
    /// zstd level for batches (1 fast .. 19 small). Default: 3.
    #[serde(default = "default_zstd_level")]
    pub zstd_level: i32,
    /// zstd dictionary per class, trained on the edge's own traffic; 0 turns dictionaries off.
    /// It pays most for short batches (low rates, short linger). Default: 4KiB.
    #[serde(default = "default_dict_size")]
    pub dict_size: ByteSize,
    /// Sample bytes per class a dictionary is trained on. Default: 32KiB.
    #[serde(default = "default_dict_samples")]
    pub dict_samples: ByteSize,
    /// Age after which a class's dictionary is trained again on fresh traffic. Default: 1h.
    #[serde(default = "default_dict_retrain")]
    pub dict_retrain: HumanDuration,
    /// QUIC congestion controller: `bbr` (default), `cubic` or `new-reno`. Loss-based
    /// controllers halve their rate at every random loss: at 50 ms RTT and 1 % loss, cubic
    /// drained 513 msg/s where bbr drains thousands (docs/BENCHMARKS.md), and radio links lose
    /// packets at random.
    #[serde(default)]
    pub congestion: Congestion,
    /// Share of batches reserved for lower-priority lanes while they have records. Default: 0.1.
    #[serde(default = "default_lower_share")]
    pub lower_lane_share: f64,
    /// Ping interval. Default: 5s.
    #[serde(default = "default_keepalive")]
    pub keepalive: HumanDuration,
    /// Connected but no ack or pong for this long: the link is reported degraded. Default: 10s.
    #[serde(default = "default_ack_timeout")]
    pub ack_timeout: HumanDuration,
    /// Reconnect backoff, doubled per failure with jitter, between these bounds.
    #[serde(default = "default_backoff_min")]
    pub backoff_min: HumanDuration,
    #[serde(default = "default_backoff_max")]
    pub backoff_max: HumanDuration,
}

pub use shared::proto::Congestion;

fn default_window() -> usize {
    8
}
fn default_batch_records() -> usize {
    1024
}
fn default_linger() -> HumanDuration {
    HumanDuration(Duration::from_secs(1))
}
fn default_zstd_level() -> i32 {
    3
}
fn default_dict_size() -> ByteSize {
    ByteSize::kib(4)
}
fn default_dict_samples() -> ByteSize {
    ByteSize::kib(32)
}
fn default_dict_retrain() -> HumanDuration {
    HumanDuration(Duration::from_secs(3600))
}
fn default_lower_share() -> f64 {
    0.1
}
fn default_keepalive() -> HumanDuration {
    HumanDuration(Duration::from_secs(5))
}
fn default_ack_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
fn default_backoff_min() -> HumanDuration {
    HumanDuration(Duration::from_millis(200))
}
fn default_backoff_max() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SpoolConfig {
    /// The SQLite database. Default: `spool/spool.db` beside the config file.
    #[serde(default = "default_spool_path")]
    pub path: PathBuf,
    /// Bytes on disk the spool may take (database, index and WAL). Default: 256 MiB.
    #[serde(default = "default_spool_budget")]
    pub budget: ByteSize,
    /// Longest a `normal` message waits for its group commit. Default: 5ms.
    #[serde(default = "default_commit_interval")]
    pub commit_interval: HumanDuration,
    /// Most records in one commit. Default: 1024.
    #[serde(default = "default_commit_batch")]
    pub commit_batch: usize,
}

impl Default for SpoolConfig {
    fn default() -> Self {
        Self {
            path: default_spool_path(),
            budget: default_spool_budget(),
            commit_interval: default_commit_interval(),
            commit_batch: default_commit_batch(),
        }
    }
}

/// One topic class.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// Name in metrics, logs and gap records. Required.
    pub name: String,
    /// MQTT topic filters. Required, at least one.
    pub filters: Vec<shared::topic::TopicFilter>,
    /// `edge-direct`, `central` or `both`. Required.
    pub route: crate::route::Route,
    /// `none`, `audit-copy` or `central-only`; limits the routes allowed. Default: `none`.
    #[serde(default)]
    pub governance: crate::route::Governance,
    /// Spool lane, 0 (drains first) to 7. Default: 4.
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// `normal` (survives a crash; PUBACK before the group commit) or `full` (survives a power
    /// cut; PUBACK after the commit). Default: `full` for `central-only`, else `normal`.
    pub durability: Option<DurabilityConfig>,
    /// Messages older than this are dropped from the spool as an expiry gap. Default: none.
    pub ttl: Option<HumanDuration>,
    /// Most payload and topic bytes the class may hold in the spool. Over it, a `normal` class
    /// loses its oldest records (as eviction gaps); a `full` class is refused (no PUBACK).
    /// Default: none, only the spool's `budget` applies.
    pub quota: Option<ByteSize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityConfig {
    Normal,
    Full,
}

impl ClassConfig {
    pub fn durability(&self) -> crate::spool::Durability {
        match (self.durability, self.governance) {
            (Some(DurabilityConfig::Full), _) | (None, crate::route::Governance::CentralOnly) => {
                crate::spool::Durability::Full
            }
            _ => crate::spool::Durability::Normal,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// Level filter in `tracing` syntax (`info`, `edge_node=debug,info`). `RUST_LOG`, when set,
    /// takes precedence. Default: `info`.
    #[serde(default = "default_log_level")]
    pub level: String,
    /// `text` or `json`. Default: `text`.
    #[serde(default)]
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { level: default_log_level(), format: LogFormat::Text }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Broker limits. Every one bounds memory or work per client; exceeding one disconnects the
/// client with a stated reason or drops and counts, never grows without bound.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Most client connections at once, over all listeners. Further clients are refused at
    /// CONNECT (CONNACK "server unavailable" / MQTT 5 0x97 quota exceeded). Default: 1000.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Largest MQTT packet accepted from a client, header included. Larger ones disconnect the
    /// client (MQTT 5 reason 0x95 packet too large). Default: 1 MiB.
    #[serde(default = "default_max_packet_size")]
    pub max_packet_size: ByteSize,
    /// QoS1 messages in flight to one subscriber before the broker waits for its PUBACKs.
    /// Default: 100.
    #[serde(default = "default_max_inflight")]
    pub max_inflight: u16,
    /// Size of one in-memory log segment per subscribed filter. Default: 1 MiB.
    #[serde(default = "default_segment_size")]
    pub segment_size: ByteSize,
    /// Segments kept per subscribed filter; with `segment_size` this bounds the memory a filter's
    /// backlog can take (a subscriber that falls further behind skips the oldest). Default: 4.
    #[serde(default = "default_segment_count")]
    pub segment_count: usize,
    /// Time a new connection has to send its CONNECT (and finish TLS). Default: 10s.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: HumanDuration,
    /// A client that accepts no bytes for this long while the broker has data for it is
    /// disconnected and counted as a slow client. Default: 30s.
    #[serde(default = "default_slow_client_timeout")]
    pub slow_client_timeout: HumanDuration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            max_connections: default_max_connections(),
            max_packet_size: default_max_packet_size(),
            max_inflight: default_max_inflight(),
            segment_size: default_segment_size(),
            segment_count: default_segment_count(),
            connect_timeout: default_connect_timeout(),
            slow_client_timeout: default_slow_client_timeout(),
        }
    }
}

/// One MQTT listener (plain TCP or TLS; MQTT 3.1.1 and 5 on the same port).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Name used in logs and metrics labels. Required.
    pub name: String,
    /// Address to bind, e.g. `127.0.0.1:1883`; port 0 picks a free port. Required.
    pub bind: SocketAddr,
    /// Serve clients that send no credentials. Only allowed on a loopback `bind`, as in
    /// Mosquitto 2. Default: false.
    #[serde(default)]
    pub anonymous: bool,
    /// TLS for this listener. Absent: plain TCP.
    pub tls: Option<TlsConfig>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the server certificate chain, leaf first. Required.
    pub cert: PathBuf,
    /// PEM file with the server private key (PKCS#8, PKCS#1 or SEC1). Required.
    pub key: PathBuf,
    /// PEM file with the CA certificates client certificates are checked against. Required when
    /// `client_certs` is not `off`.
    pub client_ca: Option<PathBuf>,
    /// `off`: no client certificates; `optional`: verified when sent, and a verified certificate
    /// authenticates the client as its first DNS name (or CN); `required`: clients without a
    /// valid certificate fail the handshake. Default: `off`.
    #[serde(default)]
    pub client_certs: ClientCertMode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientCertMode {
    #[default]
    Off,
    Optional,
    Required,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Password file written by `edge-node passwd`: one `user:argon2-hash` per line. Absent: no
    /// username/password logins (anonymous loopback clients and client certificates only).
    pub password_file: Option<PathBuf>,
    /// ACL file (TOML, see `config/acl.toml`). Absent: every authenticated client may publish
    /// and subscribe to every topic.
    pub acl_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Address for `/metrics` and `/healthz`; absent disables the endpoint.
    /// Default: `127.0.0.1:9464`.
    #[serde(default = "default_http_bind")]
    pub bind: Option<SocketAddr>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self { bind: default_http_bind() }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeConfig {
    /// Run the probe. Default: true.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Time between probe messages. Default: 100ms (10 msg/s).
    #[serde(default = "default_probe_interval")]
    pub interval: HumanDuration,
    /// Topic the probe publishes on and subscribes to (QoS1). rumqttd never delivers `$`
    /// topics, so this is an ordinary topic: a `#` subscriber sees the probe's messages.
    /// Default: `_edge/probe`.
    #[serde(default = "default_probe_topic")]
    pub topic: String,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self { enabled: true, interval: default_probe_interval(), topic: default_probe_topic() }
    }
}

fn default_spool_path() -> PathBuf {
    PathBuf::from("spool/spool.db")
}
fn default_spool_budget() -> ByteSize {
    ByteSize::mib(256)
}
fn default_commit_interval() -> HumanDuration {
    HumanDuration::from_millis(5)
}
fn default_commit_batch() -> usize {
    1024
}
fn default_priority() -> u8 {
    4
}
fn default_node_id() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "edge".to_owned())
}
fn default_log_level() -> String {
    "info".to_owned()
}
fn default_listeners() -> Vec<ListenerConfig> {
    vec![ListenerConfig {
        name: "local".to_owned(),
        bind: SocketAddr::from(([127, 0, 0, 1], 1883)),
        anonymous: true,
        tls: None,
    }]
}
fn default_max_connections() -> usize {
    1000
}
fn default_max_packet_size() -> ByteSize {
    ByteSize::mib(1)
}
fn default_max_inflight() -> u16 {
    100
}
fn default_segment_size() -> ByteSize {
    ByteSize::mib(1)
}
fn default_segment_count() -> usize {
    4
}
fn default_connect_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_slow_client_timeout() -> HumanDuration {
    HumanDuration::from_secs(30)
}
fn default_http_bind() -> Option<SocketAddr> {
    Some(SocketAddr::from(([127, 0, 0, 1], 9464)))
}
fn default_true() -> bool {
    true
}
fn default_probe_interval() -> HumanDuration {
    HumanDuration::from_millis(100)
}
fn default_probe_topic() -> String {
    "_edge/probe".to_owned()
}
