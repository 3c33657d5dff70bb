//! `[registry]`: the Schema Registry REST API on the bridge's HTTP endpoint (`[http] bind`).
//!
//! The endpoint has one authentication choice for everything it serves: none, bound to
//! loopback by default, as `/metrics`, `/edges` and the console are. So the registry is
//! read-only unless configured otherwise; writing (registering, setting modes) takes
//! `api = "read-write"` and HTTP Basic credentials, which `auth_reads` extends to reads.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shared::check::Problems;

/// What the REST API allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Not served.
    Off,
    /// Lookups, schemas by id, compatibility checks: what deserializers and operators read.
    #[default]
    ReadOnly,
    /// Also registration and modes, with the credentials.
    ReadWrite,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// `off`, `read-only` or `read-write`. Default: read-only.
    #[serde(default)]
    pub api: Access,
    /// A file holding one line `user:secret`: the HTTP Basic credentials (Schema Registry
    /// clients' `basic.auth.user.info`) that writes need. Required by `read-write`.
    #[serde(default)]
    pub credentials: Option<PathBuf>,
    /// Reads need the credentials too. Default: false.
    #[serde(default)]
    pub auth_reads: bool,
    /// Subjects the API registers at most. Default: 1,000.
    #[serde(default = "default_max_subjects")]
    pub max_subjects: usize,
    /// Versions of one subject the API registers at most. Default: 1,000.
    #[serde(default = "default_max_versions")]
    pub max_versions: u32,
    /// Classes whose records validated against a schema version are written with the Confluent
    /// framing before their payload (magic byte 0, the version's id, Protobuf's message
    /// indexes), so Confluent's deserializers read them with this registry; `"*"` for every
    /// class. Default: none (payloads as the devices sent them).
    #[serde(default)]
    pub frame_classes: Vec<String>,
}

fn default_max_subjects() -> usize {
    1000
}
fn default_max_versions() -> u32 {
    1000
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            api: Access::default(),
            credentials: None,
            auth_reads: false,
            max_subjects: default_max_subjects(),
            max_versions: default_max_versions(),
            frame_classes: Vec::new(),
        }
    }
}

impl RegistryConfig {
    pub(crate) fn resolve(&mut self, base: &Path) {
        if let Some(p) = &mut self.credentials
            && p.is_relative()
        {
            *p = base.join(&*p);
        }
    }

    pub(crate) fn check(&self, p: &mut Problems) {
        if self.api == Access::ReadWrite && self.credentials.is_none() {
            p.bad("registry.credentials", "api = \"read-write\" needs credentials (a file holding user:secret)");
        }
        if self.auth_reads && self.credentials.is_none() {
            p.bad("registry.auth_reads", "needs registry.credentials");
        }
        if let Some(path) = &self.credentials
            && let Err(e) = Credentials::load(path)
        {
            p.bad("registry.credentials", e);
        }
        if self.max_subjects == 0 {
            p.bad("registry.max_subjects", "must be at least 1");
        }
        if self.max_versions == 0 {
            p.bad("registry.max_versions", "must be at least 1");
        }
        if self.frame_classes.iter().any(|c| c.is_empty()) {
            p.bad("registry.frame_classes", "a class name, or \"*\" for every class, not an empty string");
        }
    }
}

/// The credentials requests must carry, kept as a SHA-256 of `user:secret` so that a check
/// compares digests, not the secret byte by byte.
#[derive(Clone)]
pub(crate) struct Credentials {
    digest: [u8; 32],
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(..)")
    }
}

impl Credentials {
    pub(crate) fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let line = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#'));
        let Some(line) = line else { return Err(format!("{}: no user:secret line", path.display())) };
        match line.split_once(':') {
            Some((user, secret)) if !user.is_empty() && secret.len() >= 16 => Ok(Self::of(line)),
            Some(_) => Err(format!("{}: the secret must be at least 16 characters", path.display())),
            None => Err(format!("{}: expected user:secret", path.display())),
        }
    }

    fn of(user_secret: &str) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, user_secret.as_bytes());
        let mut out = [0; 32];
        out.copy_from_slice(digest.as_ref());
        Self { digest: out }
    }

    /// Whether an `Authorization` header value carries them (`Basic base64(user:secret)`).
    pub(crate) fn admit(&self, authorization: Option<&str>) -> bool {
        use base64::Engine;
        let Some(encoded) = authorization.and_then(|a| a.strip_prefix("Basic ")) else { return false };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else { return false };
        let Ok(text) = std::str::from_utf8(&decoded) else { return false };
        Self::of(text).digest == self.digest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_admit_only_their_basic_header() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("creds");
        std::fs::write(&file, "# the registry's writer\nops:0123456789abcdef\n").unwrap();
        let c = Credentials::load(&file).unwrap();
        assert!(c.admit(Some("Basic b3BzOjAxMjM0NTY3ODlhYmNkZWY=")));
        assert!(!c.admit(Some("Basic b3BzOjAxMjM0NTY3ODlhYmNkZWc=")), "another secret");
        assert!(!c.admit(Some("Bearer b3BzOjAxMjM0NTY3ODlhYmNkZWY=")));
        assert!(!c.admit(None));
        std::fs::write(&file, "ops:short\n").unwrap();
        assert!(Credentials::load(&file).unwrap_err().contains("at least 16"));
        let mut p = Problems::default();
        RegistryConfig { api: Access::ReadWrite, ..Default::default() }.check(&mut p);
        let keys: Vec<String> = p.into_vec().into_iter().map(|p| p.key).collect();
        assert_eq!(keys, ["registry.credentials"]);
    }
}
