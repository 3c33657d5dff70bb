//! Loading and validating [`EdgeConfig`](super::EdgeConfig).

use std::fmt;
use std::path::{Path, PathBuf};

use super::{ClientCertMode, EdgeConfig};

/// One thing wrong with a config file, with the key it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file {path}: {}", .problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid { path: PathBuf, problems: Vec<Problem> },
}

impl EdgeConfig {
    /// Reads, parses and validates the file at `path`, resolving relative paths against its
    /// directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::from_toml(&text, base).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse { path: path.to_owned(), message },
            ConfigError::Invalid { problems, .. } => ConfigError::Invalid { path: path.to_owned(), problems },
            other => other,
        })
    }

    /// Parses and validates TOML text; relative paths are resolved against `base`.
    pub fn from_toml(text: &str, base: &Path) -> Result<Self, ConfigError> {
        let mut config: EdgeConfig = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: PathBuf::from("<text>"), message: one_line(&e) })?;
        config.resolve_paths(base);
        let problems = config.problems();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid { path: PathBuf::from("<text>"), problems })
        }
    }

    /// The built-in defaults, as `print-default-config` shows them.
    pub fn default_toml() -> String {
        let config: EdgeConfig = toml::from_str("").unwrap_or_else(|_| unreachable!("empty config is valid"));
        toml::to_string_pretty(&config).unwrap_or_else(|e| format!("# cannot render defaults: {e}\n"))
    }

    fn resolve_paths(&mut self, base: &Path) {
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        for listener in &mut self.listeners {
            if let Some(tls) = &mut listener.tls {
                resolve(&mut tls.cert);
                resolve(&mut tls.key);
                if let Some(ca) = &mut tls.client_ca {
                    resolve(ca);
                }
            }
        }
        if let Some(p) = &mut self.auth.password_file {
            resolve(p);
        }
        if let Some(p) = &mut self.auth.acl_file {
            resolve(p);
        }
        resolve(&mut self.spool.path);
        if let Some(u) = &mut self.uplink {
            resolve(&mut u.ca);
            resolve(&mut u.cert);
            resolve(&mut u.key);
        }
        if let Some(m) = &mut self.models {
            resolve(&mut m.dir);
            resolve(&mut m.public_key);
        }
    }

    /// Every semantic problem in the config; empty when it is usable.
    pub fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let mut bad = |key: String, reason: String| out.push(Problem { key, reason });

        if self.node_id.is_empty() || self.node_id.contains(['/', '+', '#', ' ']) {
            bad("node_id".into(), format!("{:?} must be non-empty without '/', '+', '#' or spaces", self.node_id));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            bad("log.level".into(), format!("{:?} is not a valid filter: {e}", self.log.level));
        }

        let b = &self.broker;
        if b.max_connections == 0 {
            bad("broker.max_connections".into(), "must be at least 1".into());
        }
        if b.max_packet_size.bytes() < 64 || b.max_packet_size.bytes() > 256 * 1024 * 1024 {
            bad(
                "broker.max_packet_size".into(),
                format!("{} is outside 64 B ..= 256 MiB (MQTT's limit)", b.max_packet_size),
            );
        }
        if b.max_inflight == 0 {
            bad("broker.max_inflight".into(), "must be at least 1".into());
        }
        // rumqttd panics on segments under 1 KiB; a segment must also hold the largest packet.
        if b.segment_size.bytes() < 1024 || b.segment_size < b.max_packet_size {
            bad(
                "broker.segment_size".into(),
                format!(
                    "{} must be at least 1 KiB and at least broker.max_packet_size ({})",
                    b.segment_size, b.max_packet_size
                ),
            );
        }
        if b.segment_count == 0 {
            bad("broker.segment_count".into(), "must be at least 1".into());
        }
        if b.connect_timeout.0.is_zero() {
            bad("broker.connect_timeout".into(), "must be more than 0s".into());
        }
        if b.slow_client_timeout.0.is_zero() {
            bad("broker.slow_client_timeout".into(), "must be more than 0s".into());
        }

        if self.listeners.is_empty() {
            bad("listener".into(), "at least one [[listener]] is needed".into());
        }
        for (i, l) in self.listeners.iter().enumerate() {
            let key = format!("listener[{i}]");
            if self.listeners[..i].iter().any(|o| o.name == l.name) {
                bad(format!("{key}.name"), format!("{:?} is used by another listener", l.name));
            }
            if self.listeners[..i].iter().any(|o| o.bind == l.bind && l.bind.port() != 0) {
                bad(format!("{key}.bind"), format!("{} is used by another listener", l.bind));
            }
            if l.anonymous && !l.bind.ip().is_loopback() {
                bad(
                    format!("{key}.anonymous"),
                    format!(
                        "anonymous clients are only served on loopback addresses, and {} is not one; use a password file or client certificates",
                        l.bind
                    ),
                );
            }
            let has_client_certs = l.tls.as_ref().is_some_and(|t| t.client_certs != ClientCertMode::Off);
            if !l.anonymous && self.auth.password_file.is_none() && !has_client_certs {
                bad(
                    key.clone(),
                    "no client could log in: it is not anonymous, auth.password_file is not set and it takes no client certificates".into(),
                );
            }
            if let Some(tls) = &l.tls {
                check_file(&mut bad, format!("{key}.tls.cert"), &tls.cert);
                check_file(&mut bad, format!("{key}.tls.key"), &tls.key);
                match (&tls.client_ca, tls.client_certs) {
                    (Some(ca), _) => check_file(&mut bad, format!("{key}.tls.client_ca"), ca),
                    (None, ClientCertMode::Off) => {}
                    (None, mode) => bad(
                        format!("{key}.tls.client_ca"),
                        format!("required when client_certs = {mode:?}").to_lowercase(),
                    ),
                }
            }
        }
        if let Some(p) = &self.auth.password_file {
            check_file(&mut bad, "auth.password_file".into(), p);
        }
        if let Some(p) = &self.auth.acl_file {
            check_file(&mut bad, "auth.acl_file".into(), p);
        }

        if self.spool.budget.bytes() < 64 * 1024 {
            bad("spool.budget".into(), format!("{} is under the 64 KiB minimum", self.spool.budget));
        }
        if self.spool.commit_batch == 0 {
            bad("spool.commit_batch".into(), "must be at least 1".into());
        }
        for (i, c) in self.classes.iter().enumerate() {
            let key = format!("class[{i}]");
            if c.name.is_empty() || self.classes[..i].iter().any(|o| o.name == c.name) {
                bad(format!("{key}.name"), format!("{:?} must be non-empty and unique", c.name));
            }
            if c.filters.is_empty() {
                bad(format!("{key}.filters"), "needs at least one topic filter".into());
            }
            if c.priority > 7 {
                bad(format!("{key}.priority"), format!("{} is outside 0 ..= 7", c.priority));
            }
            if let Some(quota) = c.quota
                && (quota.bytes() == 0 || quota.bytes() > self.spool.budget.bytes())
            {
                bad(format!("{key}.quota"), format!("{quota} must be above 0 and at most the spool budget"));
            }
            if !c.governance.allows(c.route) {
                bad(format!("{key}.route"), format!("{:?} is not allowed for governance {:?}", c.route, c.governance));
            }
        }
        if let Some(u) = &self.uplink {
            if u.server.rsplit_once(':').is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err()) {
                bad("uplink.server".into(), format!("{:?} is not host:port", u.server));
            }
            if u.window == 0 {
                bad("uplink.window".into(), "must be at least 1".into());
            }
            if u.batch_records == 0 {
                bad("uplink.batch_records".into(), "must be at least 1".into());
            }
            // A message travels in one batch frame, which the bridge takes up to 16 MiB: one
            // that zstd cannot shrink must leave room for the frame's own bytes, or every
            // resend of its batch is refused and the lane never drains.
            let most = (shared::proto::MAX_BATCH_FRAME / 2) as u64;
            if self.broker.max_packet_size.bytes() > most {
                bad(
                    "broker.max_packet_size".into(),
                    format!(
                        "{} is over {} with an [uplink]: a message must fit a batch frame to the cloud bridge",
                        self.broker.max_packet_size,
                        shared::units::ByteSize(most)
                    ),
                );
            }
            if !(1..=19).contains(&u.zstd_level) {
                bad("uplink.zstd_level".into(), format!("{} is outside 1 ..= 19", u.zstd_level));
            }
            let dict = u.dict_size.bytes();
            if dict != 0 && !(1024..=shared::proto::MAX_DICT_BYTES as u64).contains(&dict) {
                bad(
                    "uplink.dict_size".into(),
                    format!(
                        "{} is outside 1KiB ..= {}KiB (or 0 for none)",
                        u.dict_size,
                        shared::proto::MAX_DICT_BYTES >> 10
                    ),
                );
            }
            if dict != 0 && u.dict_samples.bytes() < 4 * dict {
                bad("uplink.dict_samples".into(), format!("{} is below 4 times dict_size", u.dict_samples));
            }
            if u.dict_retrain.0.is_zero() {
                bad("uplink.dict_retrain".into(), "must be more than 0s".into());
            }
            if !(u.lower_lane_share > 0.0 && u.lower_lane_share <= 0.5) {
                bad("uplink.lower_lane_share".into(), format!("{} is outside (0, 0.5]", u.lower_lane_share));
            }
            if u.backoff_min.0 > u.backoff_max.0 {
                bad("uplink.backoff_min".into(), "is above backoff_max".into());
            }
        }
        if self.probe.enabled {
            if self.probe.interval.0.is_zero() {
                bad("probe.interval".into(), "must be more than 0s".into());
            }
            if let Err(e) = shared::topic::validate_name(&self.probe.topic) {
                bad("probe.topic".into(), e.to_string());
            } else if self.probe.topic.starts_with('$') {
                bad("probe.topic".into(), "rumqttd never delivers topics starting with '$'".into());
            }
        }
        if let Some(m) = &self.models {
            match std::fs::read(&m.public_key) {
                Ok(k) if k.len() == 32 => {}
                Ok(k) => bad(
                    "models.public_key".into(),
                    format!("{}: {} bytes, an ed25519 public key has 32", m.public_key.display(), k.len()),
                ),
                Err(e) => bad("models.public_key".into(), format!("{}: {e}", m.public_key.display())),
            }
            if m.keep == 0 {
                bad("models.keep".into(), "must be at least 1".into());
            }
            if !(1..=64).contains(&m.parallel) {
                bad("models.parallel".into(), format!("{} is outside 1..=64", m.parallel));
            }
            for (i, name) in m.follow.iter().enumerate() {
                if let Err(e) = shared::model::valid_name("name", name) {
                    bad(format!("models.follow[{i}]"), e.to_string());
                }
            }
            if let Err(e) = shared::topic::validate_name(&m.topic_prefix) {
                bad("models.topic_prefix".into(), e.to_string());
            }
        }
        if let Some(tco) = &self.tco {
            for (key, reason) in tco.problems(&self.classes) {
                bad(key, reason);
            }
        }
        out
    }
}

fn check_file(bad: &mut impl FnMut(String, String), key: String, path: &Path) {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => bad(key, format!("{} is not a file", path.display())),
        Err(e) => bad(key, format!("{}: {e}", path.display())),
    }
}

/// toml's errors span several lines with a source excerpt; keep the first line plus the message.
fn one_line(e: &toml::de::Error) -> String {
    let msg = e.message().trim();
    match e.span() {
        Some(span) => format!("{msg} (at byte {})", span.start),
        None => msg.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<EdgeConfig, ConfigError> {
        EdgeConfig::from_toml(text, Path::new("/nonexistent"))
    }

    #[test]
    fn empty_file_is_the_default() {
        let c = parse("").unwrap();
        assert_eq!(c.listeners.len(), 1);
        assert!(c.listeners[0].anonymous);
        assert!(c.listeners[0].bind.ip().is_loopback());
    }

    #[test]
    fn default_toml_round_trips() {
        let text = EdgeConfig::default_toml();
        let c = parse(&text).unwrap();
        assert_eq!(c.broker.max_inflight, 100);
    }

    #[test]
    fn unknown_key_names_the_key() {
        let err = parse("[broker]\nmax_conections = 3\n").unwrap_err().to_string();
        assert!(err.contains("max_conections"), "{err}");
    }

    #[test]
    fn anonymous_on_network_is_refused() {
        let err =
            parse("[[listener]]\nname = \"lan\"\nbind = \"0.0.0.0:1883\"\nanonymous = true\n").unwrap_err().to_string();
        assert!(err.contains("listener[0].anonymous"), "{err}");
    }

    #[test]
    fn missing_cert_names_key_and_path() {
        let text = "[[listener]]\nname = \"tls\"\nbind = \"127.0.0.1:0\"\nanonymous = true\n[listener.tls]\ncert = \"nope.pem\"\nkey = \"nope.key\"\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("listener[0].tls.cert: /nonexistent/nope.pem"), "{err}");
        assert!(err.contains("listener[0].tls.key"), "{err}");
    }

    #[test]
    fn bad_units_and_addresses_are_reported() {
        let err = parse("[broker]\nconnect_timeout = \"10\"\n").unwrap_err().to_string();
        assert!(err.contains("with a unit"), "{err}");
        let err = parse("[[listener]]\nname = \"x\"\nbind = \"localhost\"\n").unwrap_err().to_string();
        assert!(err.contains("invalid socket address"), "{err}");
    }

    #[test]
    fn classes_are_checked() {
        let text = "[[class]]\nname = \"a\"\nfilters = [\"x/#\"]\nroute = \"edge-direct\"\ngovernance = \"central-only\"\npriority = 9\nquota = \"0 B\"\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("class[0].priority") && err.contains("class[0].route"), "{err}");
        assert!(err.contains("class[0].quota"), "{err}");
        let err =
            parse("[[class]]\nname = \"a\"\nfilters = [\"x/#/y\"]\nroute = \"central\"\n").unwrap_err().to_string();
        assert!(err.contains("'#' must be the last level"), "{err}");
        let c =
            parse("[[class]]\nname = \"a\"\nfilters = [\"x\"]\nroute = \"central\"\ngovernance = \"central-only\"\n")
                .unwrap();
        assert_eq!(c.classes[0].durability(), crate::spool::Durability::Full);
    }

    #[test]
    fn uplink_settings_are_checked_by_key() {
        let text = "[uplink]\nserver = \"cloud\"\nca = \"ca.pem\"\ncert = \"c.pem\"\nkey = \"k.pem\"\nwindow = 0\n\
                    batch_records = 0\nzstd_level = 30\nlower_lane_share = 0.9\nbackoff_min = \"1m\"\nbackoff_max = \"1s\"\n\
                    dict_size = 100\ndict_samples = 1\ndict_retrain = \"0s\"\n\
                    [broker]\nmax_packet_size = \"9 MiB\"\nsegment_size = \"100 MiB\"\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("with an [uplink]: a message must fit a batch frame"), "{err}");
        for key in [
            "broker.max_packet_size",
            "uplink.server",
            "uplink.window",
            "uplink.batch_records",
            "uplink.zstd_level",
            "uplink.lower_lane_share",
            "uplink.backoff_min",
            "uplink.dict_size",
            "uplink.dict_samples",
            "uplink.dict_retrain",
        ] {
            assert!(err.contains(key), "{key} missing from: {err}");
        }
    }

    #[test]
    fn every_problem_is_listed() {
        let text = "[broker]\nmax_connections = 0\nmax_inflight = 0\n";
        match parse(text).unwrap_err() {
            ConfigError::Invalid { problems, .. } => {
                let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
                assert_eq!(keys, ["broker.max_connections", "broker.max_inflight"]);
            }
            other => panic!("unexpected {other}"),
        }
    }
}
