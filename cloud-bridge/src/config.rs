//! The cloud bridge's configuration (`config/cloud.toml`). Relative paths are resolved against
//! the config file's directory; every problem is reported with its key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CloudConfig {
    pub server: ServerConfig,
    #[serde(default)]
    pub http: HttpConfig,
    pub sink: SinkConfig,
    #[serde(default)]
    pub log: LogConfig,
    /// Model parameters the bridge serves to edges. Default: none.
    pub models: Option<ModelsConfig>,
    /// What edges may take: connections, handshake rate, streams, memory.
    #[serde(default)]
    pub limits: crate::limits::LimitsConfig,
    /// The fleet view: this bridge's name, how often edge states are written.
    #[serde(default)]
    pub fleet: crate::fleet::FleetConfig,
}

/// `[models]`: where model versions are kept and the key that signs their manifests.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsConfig {
    /// `dir` (default: a directory) or `jetstream` (an object store bucket).
    #[serde(default)]
    pub store: ModelStoreKind,
    /// The directory store: content-addressed chunks and signed manifests. Default: `models`.
    #[serde(default = "default_models_dir")]
    pub dir: PathBuf,
    /// The JetStream store's bucket. Default: `edge-models`.
    #[serde(default = "default_models_bucket")]
    pub bucket: String,
    /// The JetStream store's server. Default: the jetstream sink's.
    pub url: Option<String>,
    /// The bucket's replicas when it is created. Default: 1.
    #[serde(default = "default_models_replicas")]
    pub replicas: usize,
    /// The fleet's ed25519 model signing key, PKCS#8 (`cloud-bridge model keygen`). Edges hold
    /// its public half.
    pub signing_key: PathBuf,
    /// How often connected edges' models are checked for a newer version. Default: 2s.
    #[serde(default = "default_models_poll")]
    pub poll: shared::units::HumanDuration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelStoreKind {
    #[default]
    Dir,
    Jetstream,
}

fn default_models_dir() -> PathBuf {
    PathBuf::from("models")
}
fn default_models_bucket() -> String {
    "edge-models".into()
}
fn default_models_replicas() -> usize {
    1
}

fn default_models_poll() -> shared::units::HumanDuration {
    shared::units::HumanDuration(std::time::Duration::from_secs(2))
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// UDP address of the QUIC listener.
    pub bind: SocketAddr,
    /// The bridge's certificate chain and key (PEM).
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The fleet CA: edges must present a client certificate it signed.
    pub client_ca: PathBuf,
    /// Serial numbers (hex) of edge certificates refused even though the CA signed them, as
    /// `openssl x509 -serial` prints them or with colons; compared by value, so leading zeros
    /// do not matter.
    #[serde(default)]
    pub deny_serials: Vec<String>,
    /// Batches one connection may send ahead of a missing one. Default: 64.
    #[serde(default = "default_max_held")]
    pub max_held: usize,
    /// QUIC congestion controller for what the bridge sends (model chunks): `bbr` (default),
    /// `cubic` or `new-reno`. At 50 ms RTT and 1 % random loss cubic halves its rate at every
    /// loss (docs/BENCHMARKS.md compares them on a model transfer).
    #[serde(default)]
    pub congestion: shared::proto::Congestion,
    /// UDP receive and send buffer of the QUIC socket. A fleet reconnecting at once arrives as
    /// bursts of 1,200-byte Initial packets; the kernel's default (208 KiB) drops them and their
    /// handshakes time out. The kernel caps it at `net.core.rmem_max` and `wmem_max` (the bridge
    /// warns when it got less). Default: 4 MiB.
    #[serde(default = "default_socket_buffer")]
    pub socket_buffer: shared::units::ByteSize,
}

fn default_max_held() -> usize {
    64
}

fn default_socket_buffer() -> shared::units::ByteSize {
    shared::units::ByteSize(4 << 20)
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// `/metrics` and `/healthz`. Default: off.
    pub bind: Option<SocketAddr>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum SinkConfig {
    /// An embedded SQLite file: zero setup, one machine.
    Sqlite { path: PathBuf },
    /// NATS JetStream (2.10 or newer): the stream and the marks bucket are created if missing.
    Jetstream {
        /// Default: `nats://127.0.0.1:4222`.
        #[serde(default = "default_nats_url")]
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
        /// JetStream's Nats-Msg-Id dedup window. Default: 2m.
        #[serde(default = "default_dup_window")]
        duplicate_window: shared::units::HumanDuration,
        /// Default: 1.
        #[serde(default = "default_replicas")]
        replicas: usize,
        /// How batches are published: `auto` (default) takes fast ingest on nats-server 2.14
        /// or newer, atomic batches on 2.12 and 2.13, message by message before; `fast` and
        /// `atomic` go no further than the kind named; `off` publishes message by message. The
        /// stream is set to allow the kind used. Each keeps the order per topic across
        /// failures.
        #[serde(default)]
        batches: crate::sink::jetstream::BatchPublish,
    },
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
fn default_fleet_bucket() -> String {
    "edge-fleet".into()
}
fn default_dup_window() -> shared::units::HumanDuration {
    shared::units::HumanDuration(std::time::Duration::from_secs(120))
}
fn default_replicas() -> usize {
    1
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    #[serde(default = "default_level")]
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { level: default_level() }
    }
}

fn default_level() -> String {
    "info".into()
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {key}: {problem}")]
    Invalid { path: PathBuf, key: String, problem: String },
}

impl CloudConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let mut config: CloudConfig =
            toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.to_owned(), message: e.to_string() })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        resolve(&mut config.server.cert);
        resolve(&mut config.server.key);
        resolve(&mut config.server.client_ca);
        if let SinkConfig::Sqlite { path } = &mut config.sink {
            resolve(path);
        }
        if let Some(models) = &mut config.models {
            resolve(&mut models.dir);
            resolve(&mut models.signing_key);
        }
        for (i, serial) in config.server.deny_serials.iter_mut().enumerate() {
            let Some(clean) = shared::tls::canonical_serial(serial) else {
                return Err(ConfigError::Invalid {
                    path: path.to_owned(),
                    key: format!("server.deny_serials[{i}]"),
                    problem: format!("{serial:?} is not a hex serial number"),
                });
            };
            *serial = clean;
        }
        if config.server.max_held == 0 {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                key: "server.max_held".into(),
                problem: "must be at least 1".into(),
            });
        }
        if let Err((key, problem)) = config.limits.check().and_then(|()| config.fleet.check()) {
            return Err(ConfigError::Invalid { path: path.to_owned(), key: key.into(), problem });
        }
        if config.models.as_ref().is_some_and(|m| m.poll.0.is_zero()) {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                key: "models.poll".into(),
                problem: "must be more than 0".into(),
            });
        }
        if let Some(m) = &config.models
            && m.store == ModelStoreKind::Jetstream
            && m.url.is_none()
            && !matches!(config.sink, SinkConfig::Jetstream { .. })
        {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                key: "models.url".into(),
                problem: "the jetstream model store needs a NATS url when the sink is not jetstream".into(),
            });
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_loads_and_bad_keys_are_named() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/cloud.toml");
        let config = CloudConfig::load(&path).unwrap();
        assert!(config.server.cert.is_absolute() || config.server.cert.starts_with(".."));
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("cloud.toml");
        std::fs::write(
            &bad,
            "[server]\nbind = \"127.0.0.1:0\"\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\ndeny_serials = [\"zz\"]\n\
             [sink]\nkind = \"sqlite\"\npath = \"x.db\"\n",
        )
        .unwrap();
        let err = CloudConfig::load(&bad).unwrap_err().to_string();
        assert!(err.contains("server.deny_serials[0]") && err.contains("not a hex serial"), "{err}");
        std::fs::write(
            &bad,
            "[server]\nbind = \"127.0.0.1:0\"\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
             [sink]\nkind = \"sqlite\"\npath = \"x.db\"\n[models]\nstore = \"jetstream\"\nsigning_key = \"k\"\n",
        )
        .unwrap();
        let err = CloudConfig::load(&bad).unwrap_err().to_string();
        assert!(err.contains("models.url") && err.contains("needs a NATS url"), "{err}");
        // A zero poll would panic every session's timer.
        std::fs::write(
            &bad,
            "[server]\nbind = \"127.0.0.1:0\"\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
             [sink]\nkind = \"sqlite\"\npath = \"x.db\"\n[models]\nsigning_key = \"k\"\npoll = \"0s\"\n",
        )
        .unwrap();
        let err = CloudConfig::load(&bad).unwrap_err().to_string();
        assert!(err.contains("models.poll") && err.contains("more than 0"), "{err}");
        // The key that `batches` replaced is named, not ignored.
        let jetstream = |sink_keys: &str| {
            format!(
                "[server]\nbind = \"127.0.0.1:0\"\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
                 [sink]\nkind = \"jetstream\"\n{sink_keys}\n"
            )
        };
        std::fs::write(&bad, jetstream("atomic_batches = true")).unwrap();
        let err = CloudConfig::load(&bad).unwrap_err().to_string();
        assert!(err.contains("unknown field `atomic_batches`") && err.contains("`batches`"), "{err}");
        std::fs::write(&bad, jetstream("batches = \"quick\"")).unwrap();
        let err = CloudConfig::load(&bad).unwrap_err().to_string();
        assert!(err.contains("unknown variant `quick`"), "{err}");
        std::fs::write(&bad, jetstream("batches = \"atomic\"")).unwrap();
        let config = CloudConfig::load(&bad).unwrap();
        assert!(matches!(
            config.sink,
            SinkConfig::Jetstream { batches: crate::sink::jetstream::BatchPublish::Atomic, .. }
        ));
        std::fs::write(&bad, "[server]\nbind = \"nowhere\"\n").unwrap();
        let err = CloudConfig::load(&bad).unwrap_err().to_string();
        assert!(err.contains("bind"), "{err}");
    }
}
