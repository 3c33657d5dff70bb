//! Who a client is and what it may do: the password file, the topic ACL, and the identity a
//! connection ends up with. Owns no sockets; the front asks it at CONNECT, SUBSCRIBE and
//! PUBLISH. Both files are reloaded as a unit on SIGHUP.

mod acl;
mod login;
mod passwd;

use std::path::PathBuf;
use std::sync::Arc;

pub use acl::{Acl, Rules};
pub use login::{Login, LoginPool};
pub use passwd::{PasswordFile, hash_password};

use serde::{Deserialize, Serialize};

use shared::check::Problems;
use shared::units::HumanDuration;

/// `[auth]`: where the password file and the ACL are.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Password file written by `edge-node passwd`: one `user:argon2-hash` per line. Absent: no
    /// username/password logins (anonymous loopback clients and client certificates only).
    pub password_file: Option<PathBuf>,
    /// ACL file (TOML, see `config/acl.toml`). Absent: every authenticated client may publish
    /// and subscribe to every topic.
    pub acl_file: Option<PathBuf>,
    /// Password checks (argon2, about 19 MiB and tens of milliseconds each) run at once; the
    /// rest wait in turn. Default: 2.
    #[serde(default = "default_max_concurrent_logins")]
    pub max_concurrent_logins: usize,
    /// How long a password check may wait for its turn before the CONNECT is refused as
    /// server busy (MQTT 5 0x89, 3.1.1 return code 3). Default: 5s.
    #[serde(default = "default_login_wait")]
    pub login_wait: HumanDuration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            password_file: None,
            acl_file: None,
            max_concurrent_logins: default_max_concurrent_logins(),
            login_wait: default_login_wait(),
        }
    }
}

fn default_max_concurrent_logins() -> usize {
    2
}
fn default_login_wait() -> HumanDuration {
    HumanDuration(std::time::Duration::from_secs(5))
}

impl AuthConfig {
    pub fn check(&self, p: &mut Problems) {
        if let Some(path) = &self.password_file {
            p.file("auth.password_file", path);
        }
        if let Some(path) = &self.acl_file {
            p.file("auth.acl_file", path);
        }
        if self.max_concurrent_logins == 0 {
            p.bad("auth.max_concurrent_logins", "must be at least 1");
        }
        if self.login_wait.0.is_zero() {
            p.bad("auth.login_wait", "must be more than 0s");
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}, line {line}: {reason}")]
    PasswordLine { path: PathBuf, line: usize, reason: String },
    #[error("{path}: {reason}")]
    AclFile { path: PathBuf, reason: String },
    #[error("user name {0:?} must be non-empty and hold no ':' or whitespace")]
    BadUserName(String),
    #[error("cannot hash password: {0}")]
    Hash(String),
}

/// How a connection authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// No credentials, on a listener that allows it (loopback only).
    Anonymous,
    /// A user from the password file.
    User(String),
    /// A verified client certificate; the name is its first DNS SAN, or CN.
    Certificate(String),
    /// The node's own SLO probe; bypasses the ACL.
    Internal,
}

impl Identity {
    /// The name used for ACL lookup and in the internal broker CONNECT.
    pub(crate) fn name(&self) -> &str {
        match self {
            Identity::Anonymous => "anonymous",
            Identity::User(n) | Identity::Certificate(n) => n,
            Identity::Internal => "_internal",
        }
    }
}

/// The current password file and ACL, swapped whole on reload.
#[derive(Debug, Default)]
pub struct AuthState {
    pub passwords: Option<Arc<PasswordFile>>,
    pub acl: Option<Acl>,
}

impl AuthState {
    pub fn load(config: &AuthConfig) -> Result<Self, AuthError> {
        let passwords = config.password_file.as_deref().map(PasswordFile::load).transpose()?.map(Arc::new);
        let acl = config.acl_file.as_deref().map(Acl::load).transpose()?;
        Ok(Self { passwords, acl })
    }

    /// The rules of `user` as the node itself acts for them (a `[[downlink]]` entry's user),
    /// with `%c` as `client_id`: `None` unless the password file or the ACL's `[users.<user>]`
    /// names them, so a misspelt user is refused rather than given the `[default]` rules (or,
    /// without an ACL, every topic).
    pub fn rules_of_user(&self, user: &str, client_id: &str) -> Option<Arc<Rules>> {
        let known = self.passwords.as_ref().is_some_and(|p| p.has_user(user))
            || self.acl.as_ref().is_some_and(|a| a.names_user(user));
        known.then(|| self.rules_for(&Identity::User(user.to_owned()), client_id))
    }

    /// The rules for one connection, with `%u` and `%c` substituted.
    pub(crate) fn rules_for(&self, identity: &Identity, client_id: &str) -> Arc<Rules> {
        match (identity, &self.acl) {
            (Identity::Internal, _) | (_, None) => Arc::new(Rules::allow_all()),
            (identity, Some(acl)) => Arc::new(acl.rules_for(identity, client_id)),
        }
    }
}
