//! Loading and validating [`EdgeConfig`](super::EdgeConfig).

use std::path::{Path, PathBuf};

use super::EdgeConfig;
use shared::check::{Problem, Problems};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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

    /// Every semantic problem in the config; empty when it is usable. Each section checks
    /// itself; the checks here are the ones that span sections.
    /// A `[[downlink]]` entry's user must be one `[auth]` knows (its password file or a
    /// `[users.<name>]` section of its ACL): a misspelt one would have every message refused.
    /// The files are read here; one that cannot be is `auth`'s problem, named there.
    fn check_downlink_users(&self, p: &mut Problems) {
        let named: Vec<(usize, &str)> =
            self.downlink.iter().enumerate().filter_map(|(i, e)| Some((i, e.user.as_deref()?))).collect();
        if named.is_empty() {
            return;
        }
        let Ok(auth) = crate::auth::AuthState::load(&self.auth) else { return };
        for (i, user) in named {
            if auth.rules_of_user(user, crate::downlink::CLIENT_ID).is_none() {
                p.bad(
                    format!("downlink[{i}].user"),
                    format!(
                        "{user:?} is no user of [auth] (its password file or the ACL's [users.{user}]): every message \
                         for this entry would be refused"
                    ),
                );
            }
        }
    }

    pub(crate) fn problems(&self) -> Vec<Problem> {
        let mut p = Problems::default();
        if self.node_id.is_empty() || self.node_id.contains(['/', '+', '#', ' ']) {
            p.bad("node_id", format!("{:?} must be non-empty without '/', '+', '#' or spaces", self.node_id));
        }
        if let Err(e) = super::parse_log_filter(&self.log.level) {
            p.bad("log.level", format!("{:?} is not a valid filter: {e}", self.log.level));
        }
        self.runtime.check(&mut p);
        self.broker.check(&mut p);
        crate::front::check_listeners(&self.listeners, self.auth.password_file.is_some(), &mut p);
        self.auth.check(&mut p);
        self.spool.check(&mut p);
        crate::route::check_classes(&self.classes, self.spool.budget, &mut p);
        if let Some(u) = &self.uplink {
            u.check(&mut p);
            // A message travels in one batch frame, which the bridge takes up to 16 MiB: one
            // that zstd cannot shrink must leave room for the frame's own bytes, or every
            // resend of its batch is refused and the lane never drains.
            let most = shared::proto::MAX_MESSAGE_BYTES as u64;
            if self.broker.max_packet_size.bytes() > most {
                p.bad(
                    "broker.max_packet_size",
                    format!(
                        "{} is over {} with an [uplink]: a message must fit a batch frame to the cloud bridge",
                        self.broker.max_packet_size,
                        shared::units::ByteSize(most)
                    ),
                );
            }
        }
        self.probe.check(&mut p);
        self.health.check(&mut p);
        self.tracing.check(&mut p);
        crate::downlink::check_downlink(&self.downlink, &mut p);
        self.check_downlink_users(&mut p);
        if let Some(m) = &self.models {
            m.check(&mut p);
        }
        crate::schema::check_schemas(&self.schemas, self.models.is_some(), cfg!(feature = "schema"), &mut p);
        if let Some(tco) = &self.tco {
            let routed = |name: &str| self.classes.iter().find(|c| c.name == name).map(|c| c.governance);
            tco.check(&routed, &mut p);
        }
        p.into_vec()
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
    fn log_filters_take_levels_and_module_paths_and_refuse_bare_words() {
        for ok in ["info", "edge_node=debug,info", "warn,edge_node::broker=trace", "off", ""] {
            assert!(crate::config::parse_log_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["verbose", "[[[", "edge_node=loud", "=info", "a b=info"] {
            let err = parse(&format!("[log]\nlevel = {bad:?}\n")).unwrap_err().to_string();
            assert!(err.contains("log.level"), "{bad}: {err}");
        }
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

    /// A `[[downlink]]` user `[auth]` does not know is a problem at `check-config`, and the
    /// production lookup the downlink uses refuses it (it once fell back to the `[default]`
    /// rules, or to every topic without an ACL).
    #[test]
    fn a_downlink_user_auth_does_not_know_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let hash = crate::auth::hash_password(b"pw").unwrap();
        std::fs::write(dir.path().join("passwd"), format!("ops:{hash}\n")).unwrap();
        std::fs::write(dir.path().join("acl.toml"), "[default]\npublish = [\"#\"]\n[users.acl-only]\npublish = []\n")
            .unwrap();
        let text = |user: &str| {
            format!(
                "[auth]\npassword_file = \"passwd\"\nacl_file = \"acl.toml\"\n\
                 [[downlink]]\nfilter = \"cmd/#\"\nuser = \"{user}\"\n"
            )
        };
        let parse_in = |t: &str| EdgeConfig::from_toml(t, dir.path());
        assert!(parse_in(&text("ops")).is_ok());
        assert!(parse_in(&text("acl-only")).is_ok());
        let err = parse_in(&text("opps")).unwrap_err().to_string();
        assert!(err.contains("downlink[0].user") && err.contains("\"opps\" is no user of [auth]"), "{err}");
        let err = parse("[[downlink]]\nfilter = \"cmd/#\"\nuser = \"ops\"\n").unwrap_err().to_string();
        assert!(err.contains("downlink[0].user"), "no [auth] at all: {err}");
        let auth = crate::auth::AuthState::load(&parse_in(&text("ops")).unwrap().auth).unwrap();
        assert!(auth.rules_of_user("ops", crate::downlink::CLIENT_ID).is_some());
        assert!(auth.rules_of_user("opps", crate::downlink::CLIENT_ID).is_none());
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
                    [broker]\nmax_packet_size = \"9 MiB\"\nmax_queued_bytes = \"100 MiB\"\n";
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
    fn bridges_are_given_as_server_or_servers_and_each_is_checked() {
        let uplink =
            |servers: &str| format!("[uplink]\n{servers}\nca = \"ca.pem\"\ncert = \"c.pem\"\nkey = \"k.pem\"\n");
        let err = |servers: &str| parse(&uplink(servers)).unwrap_err().to_string();
        assert!(err("server = \"a:1\"\nservers = [\"b:1\"]").contains("uplink.servers: give either server or servers"));
        assert!(err("").contains("uplink.servers: no bridge"));
        assert!(err("servers = []").contains("uplink.servers: no bridge"));
        let bad = err("servers = [\"a:1\", \"b\", \"c:x\"]");
        assert!(bad.contains("\"b\" is not host:port") && bad.contains("\"c:x\" is not host:port"), "{bad}");
        let config = parse(&uplink("servers = [\"a:1\", \"b:2\"]")).unwrap();
        assert_eq!(config.uplink.unwrap().server_list(), ["a:1", "b:2"]);
        let config = parse(&uplink("server = \"a:1\"")).unwrap();
        assert_eq!(config.uplink.unwrap().server_list(), ["a:1"], "the one-bridge spelling still works");
    }

    #[test]
    fn keys_of_the_rumqttd_broker_are_refused_by_name() {
        let err = parse("[broker]\nsegment_size = \"1 MiB\"\nsegment_count = 4\n").unwrap_err().to_string();
        assert!(err.contains("broker.segment_size: is no longer used"), "{err}");
        assert!(err.contains("broker.segment_count: is no longer used"), "{err}");
        assert!(err.contains("max_queued_messages"), "the message names what replaced them: {err}");
    }

    #[test]
    fn the_worker_count_is_taken_or_refused_at_its_key() {
        assert_eq!(parse("").unwrap().runtime.worker_threads, None, "unset: tokio's default");
        assert_eq!(parse("[runtime]\nworker_threads = 1\n").unwrap().runtime.worker_threads, Some(1));
        for bad in ["0", "1025"] {
            let err = parse(&format!("[runtime]\nworker_threads = {bad}\n")).unwrap_err().to_string();
            assert!(err.contains(&format!("runtime.worker_threads: {bad} must be 1 to 1024")), "{err}");
        }
        // Refused by its type, where it stands in the file (as every count key is).
        let err = parse("[runtime]\nworker_threads = -1\n").unwrap_err().to_string();
        assert!(err.contains("`-1`") && err.contains("at byte 27"), "{err}");
    }

    #[test]
    fn every_problem_is_listed() {
        let text = "[broker]\nmax_connections = 0\nmax_inflight = 0\nmax_connect_size = 100\n";
        match parse(text).unwrap_err() {
            ConfigError::Invalid { problems, .. } => {
                let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
                assert_eq!(keys, ["broker.max_connections", "broker.max_inflight", "broker.max_connect_size"]);
            }
            other => panic!("unexpected {other}"),
        }
    }
}
