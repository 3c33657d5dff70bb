//! Topic ACLs: which filters each user may publish to and subscribe to.
//!
//! The file is TOML:
//!
//! ```toml
//! [anonymous]                       # clients without credentials (loopback listeners)
//! publish = ["#"]
//! subscribe = ["#"]
//!
//! [default]                         # authenticated users without a section of their own
//! subscribe = ["models/#"]
//!
//! [users.camera-01]                 # a user of the password file
//! publish = ["inference/+/+/%u", "telemetry/%u/#"]
//! subscribe = ["models/#"]
//!
//! [certs.camera-02]                 # a client certificate, by its name (DNS SAN or CN)
//! publish = ["inference/+/+/%u"]
//! ```
//!
//! With an ACL file, a client whose section is missing may do nothing: deny by default. `%u`
//! stands for the user name and `%c` for the client id, as whole levels; a name holding `/`,
//! `+` or `#` never matches a pattern that uses it. A publish is allowed when its topic matches
//! a publish filter; a subscription when an allowed subscribe filter covers the whole of it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use shared::topic::{self, TopicFilter};

use super::{AuthError, Identity};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    #[serde(default)]
    publish: Vec<String>,
    #[serde(default)]
    subscribe: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AclFile {
    anonymous: Option<Section>,
    default: Option<Section>,
    #[serde(default)]
    users: BTreeMap<String, Section>,
    /// Client certificates by name (first DNS SAN, or CN): apart from the password users, so
    /// a certificate named like a user never gets that user's rights.
    #[serde(default)]
    certs: BTreeMap<String, Section>,
}

#[derive(Debug, Clone)]
pub struct Acl {
    file: AclFile,
}

/// One connection's resolved rules.
#[derive(Debug, Clone)]
pub struct Rules {
    publish: Vec<TopicFilter>,
    subscribe: Vec<TopicFilter>,
}

impl Rules {
    /// Everything: with no ACL file, any topic, and `$SYS/#` too (a `#` does not cover `$`
    /// topics, [MQTT-4.7.2-1], and the broker's statistics are there).
    pub(crate) fn allow_all() -> Self {
        let filter = |f: &str| TopicFilter::new(f).unwrap_or_else(|_| unreachable!("{f} is a valid filter"));
        Self { publish: vec![filter("#")], subscribe: vec![filter("#"), filter("$SYS/#")] }
    }

    pub(crate) fn deny_all() -> Self {
        Self { publish: Vec::new(), subscribe: Vec::new() }
    }

    pub(crate) fn may_publish(&self, topic: &str) -> bool {
        self.publish.iter().any(|f| f.matches(topic))
    }

    pub(crate) fn may_subscribe(&self, filter: &str) -> bool {
        self.subscribe.iter().any(|f| f.covers(filter))
    }
}

impl Acl {
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read { path: path.to_owned(), source })?;
        Self::parse(&text).map_err(|reason| AuthError::AclFile { path: path.to_owned(), reason })
    }

    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let file: AclFile = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        let sections = file
            .anonymous
            .iter()
            .map(|s| ("anonymous".to_owned(), s))
            .chain(file.default.iter().map(|s| ("default".to_owned(), s)))
            .chain(file.users.iter().map(|(u, s)| (format!("users.{u}"), s)))
            .chain(file.certs.iter().map(|(c, s)| (format!("certs.{c}"), s)));
        for (name, section) in sections {
            for (kind, list) in [("publish", &section.publish), ("subscribe", &section.subscribe)] {
                for pattern in list {
                    // Check with placeholders filled by a plain level.
                    let probe = pattern.replace("%u", "u").replace("%c", "c");
                    topic::validate_filter(&probe).map_err(|e| format!("[{name}] {kind}: {e}"))?;
                }
            }
        }
        Ok(Self { file })
    }

    /// Whether the file has a `[users.<user>]` section.
    pub(crate) fn names_user(&self, user: &str) -> bool {
        self.file.users.contains_key(user)
    }

    pub(crate) fn rules_for(&self, identity: &Identity, client_id: &str) -> Rules {
        let section = match identity {
            Identity::Anonymous => self.file.anonymous.as_ref(),
            Identity::User(u) => self.file.users.get(u).or(self.file.default.as_ref()),
            Identity::Certificate(c) => self.file.certs.get(c).or(self.file.default.as_ref()),
            Identity::Internal => return Rules::allow_all(),
        };
        let Some(section) = section else {
            return Rules { publish: Vec::new(), subscribe: Vec::new() };
        };
        let user = identity.name();
        let resolve = |list: &[String]| {
            list.iter()
                .filter_map(|p| substitute(p, user, client_id))
                .filter_map(|p| TopicFilter::new(p).ok())
                .collect()
        };
        Rules { publish: resolve(&section.publish), subscribe: resolve(&section.subscribe) }
    }
}

/// Fills `%u` and `%c` levels; `None` when a value would change the filter's structure.
fn substitute(pattern: &str, user: &str, client_id: &str) -> Option<String> {
    let unsafe_value = |v: &str| v.is_empty() || v.contains(['/', '+', '#']);
    let mut out = Vec::new();
    for level in pattern.split('/') {
        let value = match level {
            "%u" if unsafe_value(user) => return None,
            "%c" if unsafe_value(client_id) => return None,
            "%u" => user,
            "%c" => client_id,
            other => other,
        };
        out.push(value);
    }
    Some(out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
        [anonymous]
        subscribe = ["public/#"]
        [default]
        subscribe = ["models/#"]
        [users.cam]
        publish = ["inference/+/+/%u", "telemetry/%c/#"]
        subscribe = ["models/+"]
    "#;

    #[test]
    fn rules_per_identity() {
        let acl = Acl::parse(FILE).unwrap();
        let cam = acl.rules_for(&Identity::User("cam".into()), "cid-1");
        assert!(cam.may_publish("inference/yolo/v1/cam"));
        assert!(!cam.may_publish("inference/yolo/v1/other"));
        assert!(cam.may_publish("telemetry/cid-1/cpu"));
        assert!(!cam.may_publish("telemetry/cid-2/cpu"));
        assert!(cam.may_subscribe("models/yolo"));
        assert!(!cam.may_subscribe("models/#"));

        let other = acl.rules_for(&Identity::Certificate("edge-9".into()), "x");
        assert!(other.may_subscribe("models/a/b"));
        assert!(!other.may_publish("models/a"));

        let anon = acl.rules_for(&Identity::Anonymous, "x");
        assert!(anon.may_subscribe("public/a"));
        assert!(!anon.may_subscribe("#"));
        assert!(!anon.may_publish("public/a"));
    }

    /// A certificate named like a password user got that user's section: certificates have
    /// their own (`[certs.NAME]`), and fall back to `[default]`, never to `[users.NAME]`.
    #[test]
    fn a_certificate_never_gets_a_users_section() {
        let acl = Acl::parse("[users.admin]\npublish = [\"#\"]\n[certs.cam]\npublish = [\"cams/%u/#\"]\n").unwrap();
        let cert_admin = acl.rules_for(&Identity::Certificate("admin".into()), "c");
        assert!(!cert_admin.may_publish("anything"));
        let cam = acl.rules_for(&Identity::Certificate("cam".into()), "c");
        assert!(cam.may_publish("cams/cam/x") && !cam.may_publish("cams/other/x"));
        assert!(!acl.rules_for(&Identity::User("cam".into()), "c").may_publish("cams/cam/x"));
    }

    #[test]
    fn missing_section_denies() {
        let acl = Acl::parse("[users.a]\npublish = [\"x\"]\n").unwrap();
        let anon = acl.rules_for(&Identity::Anonymous, "c");
        assert!(!anon.may_publish("x") && !anon.may_subscribe("x"));
        let b = acl.rules_for(&Identity::User("b".into()), "c");
        assert!(!b.may_publish("x"));
    }

    #[test]
    fn wildcard_names_never_widen_access() {
        let acl = Acl::parse(FILE).unwrap();
        let evil = acl.rules_for(&Identity::User("cam".into()), "#");
        assert!(!evil.may_publish("telemetry/anything/cpu"));
    }

    #[test]
    fn bad_filters_are_reported_with_section() {
        let err = Acl::parse("[users.a]\npublish = [\"a/#/b\"]\n").unwrap_err();
        assert!(err.contains("[users.a] publish"), "{err}");
        assert!(Acl::parse("[user.a]\n").is_err());
    }
}
