//! The cloud bridge's configuration (`config/cloud.toml`). Relative paths are resolved against
//! the config file's directory; every problem is reported with its key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shared::check::{Problem, Problems};

pub use crate::models::config::{ModelStoreKind, ModelsConfig};
pub use crate::server::config::ServerConfig;
pub use crate::sink::config::SinkConfig;

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
    /// Span export over OTLP for messages that carry a trace context. Default: off.
    #[serde(default)]
    pub tracing: shared::trace::TracingConfig,
    /// Messages to edges: windows, backlog bounds, groups.
    #[serde(default)]
    pub downlink: crate::downlink::DownlinkConfig,
    /// The Schema Registry REST API on the HTTP endpoint. Default: read-only.
    #[serde(default)]
    pub registry: crate::schemas::config::RegistryConfig,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// `/metrics` and `/healthz`. Default: off.
    pub bind: Option<SocketAddr>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    #[serde(default = "default_level")]
    pub level: String,
    /// `text` (colour only on a terminal) or `json` (one object a line). Default: text.
    #[serde(default)]
    pub format: LogFormat,
}

pub use shared::units::LogFormat;

impl Default for LogConfig {
    fn default() -> Self {
        Self { level: default_level(), format: LogFormat::Text }
    }
}

fn default_level() -> String {
    "info".into()
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// Every problem found, each with its key.
    #[error("{path}: {}", .problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid { path: PathBuf, problems: Vec<Problem> },
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
        match &mut config.sink {
            SinkConfig::Sqlite { path } => resolve(path),
            SinkConfig::Kafka(k) => {
                let files = k.tls.iter_mut().flat_map(|t| [&mut t.ca, &mut t.cert, &mut t.key]);
                for path in files.chain(k.sasl.iter_mut().map(|s| &mut s.password_file)).flatten() {
                    resolve(path);
                }
            }
            SinkConfig::Jetstream { .. } => {}
        }
        if let Some(models) = &mut config.models {
            resolve(&mut models.dir);
            resolve(&mut models.signing_key);
        }
        config.registry.resolve(base);
        // Every problem of the file at once: fixing one to be told of the next is a slow loop.
        let mut problems = Problems::default();
        for (i, serial) in config.server.deny_serials.iter_mut().enumerate() {
            match shared::tls::canonical_serial(serial) {
                Some(clean) => *serial = clean,
                None => {
                    problems.bad(format!("server.deny_serials[{i}]"), format!("{serial:?} is not a hex serial number"))
                }
            }
        }
        if config.server.max_held == 0 {
            problems.bad("server.max_held", "must be at least 1");
        }
        config.limits.check(&mut problems);
        config.fleet.check(&mut problems);
        config.downlink.check(&mut problems);
        config.tracing.check(&mut problems);
        config.registry.check(&mut problems);
        match &config.sink {
            SinkConfig::Jetstream { url, .. } => {
                if let Err(e) = crate::sink::jetstream::check_url(url) {
                    problems.bad("sink.url", e.to_string());
                }
            }
            SinkConfig::Kafka(k) => k.check(&mut problems),
            SinkConfig::Sqlite { .. } => {}
        }
        if config.models.as_ref().is_some_and(|m| m.poll.0.is_zero()) {
            problems.bad("models.poll", "must be more than 0");
        }
        if let Some(m) = &config.models
            && m.store == ModelStoreKind::Jetstream
            && m.url.is_none()
            && !matches!(config.sink, SinkConfig::Jetstream { .. })
        {
            problems.bad("models.url", "the jetstream model store needs a NATS url when the sink is not jetstream");
        }
        if !problems.is_empty() {
            return Err(ConfigError::Invalid { path: path.to_owned(), problems: problems.into_vec() });
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
        // Every problem of the file in one answer, each with its key, in the file's order.
        std::fs::write(
            &bad,
            "[server]\nbind = \"127.0.0.1:0\"\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
             deny_serials = [\"zz\", \"0a\", \"yy\"]\nmax_held = 0\n\
             [sink]\nkind = \"sqlite\"\npath = \"x.db\"\n[models]\nsigning_key = \"k\"\npoll = \"0s\"\n",
        )
        .unwrap();
        let Err(ConfigError::Invalid { problems, .. }) = CloudConfig::load(&bad) else { panic!("not refused") };
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["server.deny_serials[0]", "server.deny_serials[2]", "server.max_held", "models.poll"]);
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
        // One server or several, as a string or a list; a bad one named before the start.
        std::fs::write(&bad, jetstream("url = \"nats://a:4222, nats://b:4223\"")).unwrap();
        assert!(
            matches!(CloudConfig::load(&bad).unwrap().sink, SinkConfig::Jetstream { url, .. } if url.contains("b:4223"))
        );
        std::fs::write(&bad, jetstream("url = [\"nats://a:4222\", \"nats://b:4223\"]\nreplicas = 3")).unwrap();
        let config = CloudConfig::load(&bad).unwrap();
        assert!(
            matches!(config.sink, SinkConfig::Jetstream { ref url, replicas: Some(3), .. } if url == "nats://a:4222,nats://b:4223")
        );
        std::fs::write(&bad, jetstream("url = \"nats://a:4222,nats://b:port\"")).unwrap();
        let err = CloudConfig::load(&bad).unwrap_err().to_string();
        assert!(err.contains("sink.url") && err.contains("\"nats://b:port\""), "{err}");
        std::fs::write(&bad, "[server]\nbind = \"nowhere\"\n").unwrap();
        let err = CloudConfig::load(&bad).unwrap_err().to_string();
        assert!(err.contains("bind"), "{err}");
    }
}
