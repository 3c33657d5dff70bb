//! The edge gateway's configuration file: parsed into the sections each subsystem owns
//! (`[broker]` in `broker`, `[[listener]]` in `front`, `[[class]]` in `route`, ...), assembled
//! into [`EdgeConfig`], and checked once at load, so a bad file fails at start with the key and
//! the reason. Each section checks itself; this module keeps only the checks that span sections.
//!
//! Relative paths in the file are resolved against the file's own directory, so a config and its
//! certificates can be moved together.

mod diff;
mod load;

use serde::{Deserialize, Serialize};

use crate::auth::AuthConfig;
use crate::broker::BrokerConfig;
use crate::front::ListenerConfig;
use crate::metrics::HttpConfig;
use crate::models::ModelsConfig;
use crate::probe::ProbeConfig;
use crate::route::ClassConfig;
use crate::spool::SpoolConfig;
use crate::tco::TcoConfig;
use crate::uplink::UplinkConfig;

pub use load::ConfigError;
pub use shared::check::Problem;

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
    /// The async runtime's threads.
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// Limits of the embedded MQTT broker.
    #[serde(default)]
    pub broker: BrokerConfig,
    /// MQTT listeners. Default: one anonymous listener on `127.0.0.1:1883`.
    #[serde(default = "crate::front::default_listeners", rename = "listener")]
    pub listeners: Vec<ListenerConfig>,
    /// Password file and topic ACLs.
    #[serde(default)]
    pub auth: AuthConfig,
    /// The HTTP endpoint serving `/metrics`, `/healthz` and `/readyz`.
    #[serde(default)]
    pub http: HttpConfig,
    /// The built-in SLO probe.
    #[serde(default)]
    pub probe: ProbeConfig,
    /// What `/readyz` holds the node to.
    #[serde(default)]
    pub health: crate::health::HealthConfig,
    /// The store-and-forward spool.
    #[serde(default)]
    pub spool: SpoolConfig,
    /// Topic classes and their routes; first match wins, unmatched topics stay edge-direct.
    #[serde(default, rename = "class")]
    pub classes: Vec<ClassConfig>,
    /// The QUIC bridge to the cloud. Default: none (the spool fills and evicts by its budget).
    pub uplink: Option<UplinkConfig>,
    /// The TCO model: prices, per-class SLA and pins, live routing. Default: none.
    pub tco: Option<TcoConfig>,
    /// Model parameters this edge follows. Default: none.
    pub models: Option<ModelsConfig>,
    /// Span export over OTLP for messages that carry a trace context. Default: off.
    #[serde(default)]
    pub tracing: shared::trace::TracingConfig,
    /// Local topics the cloud may publish to (protocol version 5). Default: none.
    #[serde(default, rename = "downlink", skip_serializing_if = "Vec::is_empty")]
    pub downlink: Vec<crate::downlink::DownlinkEntry>,
    /// Topic filters bound to schema subjects, checked on PUBLISH. Default: none.
    #[serde(default, rename = "schema", skip_serializing_if = "Vec::is_empty")]
    pub schemas: Vec<crate::schema::SchemaBinding>,
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
    /// Lines a second about what clients not yet logged in make happen (refused connections,
    /// bad first packets, failed handshakes); past it they are held back, counted
    /// (`edge_log_lines_suppressed_total`), and the next line says how many. Default: 20.
    #[serde(default = "default_peer_lines_per_second")]
    pub peer_lines_per_second: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: default_log_level(),
            format: LogFormat::Text,
            peer_lines_per_second: default_peer_lines_per_second(),
        }
    }
}

fn default_peer_lines_per_second() -> u32 {
    20
}

/// Parses a level filter: comma-separated `level` or `target=level` directives. A bare word
/// that is not a level is refused: `tracing` would take it for a target and log nothing else.
pub fn parse_log_filter(text: &str) -> Result<tracing_subscriber::filter::Targets, String> {
    for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let (target, level) = directive.split_once('=').map_or((None, directive), |(t, l)| (Some(t), l));
        if level.parse::<tracing_subscriber::filter::LevelFilter>().is_err() {
            return Err(format!("{level:?} is not a level (off, error, warn, info, debug, trace)"));
        }
        if target.is_some_and(|t| t.is_empty() || !t.chars().all(|c| c.is_ascii_alphanumeric() || "_:-".contains(c))) {
            return Err(format!("{directive:?} does not start with a module path"));
        }
    }
    text.parse().map_err(|e| format!("{e}"))
}

pub use shared::units::LogFormat;

/// The async runtime (`main` builds it before anything else starts).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Worker threads of the runtime the broker, the uplink and the HTTP endpoint share (the
    /// spool and the session store have threads of their own). Default: one per core, or
    /// `TOKIO_WORKER_THREADS` when set. One worker spent 20-25 % less CPU per delivered message
    /// than two on a 2-core host (paho fan-out, docs/BENCHMARKS.md): two workers hand each
    /// other wake-ups. With one, the uplink's batch packing shares it with local delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_threads: Option<usize>,
}

/// Past this, a worker count is a typo: each worker is a thread with its own stack and queue.
pub const MAX_WORKER_THREADS: usize = 1024;

impl RuntimeConfig {
    pub(crate) fn check(&self, p: &mut shared::check::Problems) {
        if let Some(n) = self.worker_threads
            && !(1..=MAX_WORKER_THREADS).contains(&n)
        {
            p.bad("runtime.worker_threads", format!("{n} must be 1 to {MAX_WORKER_THREADS}"));
        }
    }
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
