//! The schema registry's storage in the sink: every version of every subject (immutable once
//! stored: a version number is taken by create-if-absent, so two registrations racing for it
//! cannot both win) and each subject's compatibility mode.
//!
//! - SQLite: tables `schema_versions` (subject, version, id, the version as JSON) and
//!   `schema_subjects` (subject, compatibility).
//! - JetStream: the KV bucket `sink.schemas_bucket` (default `edge-schemas`), keys
//!   `v.<subject>.<version>` (the version as JSON) and `m.<subject>` (the mode).
//!
//! What a version means, and whether one may follow another, is the registry's business
//! (`cloud-bridge schema`).

use std::future::Future;

use serde::Serialize;
use shared::schema::{Compatibility, Version};

use super::error::SinkError;

/// A subject as `schema list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Subject {
    pub subject: String,
    /// The subject's mode; none set: the registry's default.
    pub compatibility: Option<Compatibility>,
    pub versions: u32,
    pub latest: Version,
}

pub trait SchemaStore: Send + Sync {
    /// Every version of `subject`, oldest first.
    fn schema_versions(&self, subject: &str) -> impl Future<Output = Result<Vec<Version>, SinkError>> + Send;
    /// Stores `v` unless its subject already has version `v.version`: then false, and nothing
    /// changes.
    fn schema_put(&self, v: &Version) -> impl Future<Output = Result<bool, SinkError>> + Send;
    fn schema_mode(&self, subject: &str) -> impl Future<Output = Result<Option<Compatibility>, SinkError>> + Send;
    fn schema_set_mode(&self, subject: &str, mode: Compatibility)
    -> impl Future<Output = Result<(), SinkError>> + Send;
    /// Every subject that has a version, by name.
    fn schema_subjects(&self) -> impl Future<Output = Result<Vec<Subject>, SinkError>> + Send;
    /// Every version of every subject, by subject then version, in one read (a lookup by
    /// registry id needs them all: a read per subject would cost subjects times the store).
    fn schema_all(&self) -> impl Future<Output = Result<Vec<Version>, SinkError>> + Send;
}

pub(super) fn to_json(v: &Version) -> Result<String, SinkError> {
    serde_json::to_string(v).map_err(|e| SinkError::invalid("schema version", e))
}

pub(super) fn from_json(key: &str, bytes: &[u8]) -> Result<Version, SinkError> {
    serde_json::from_slice(bytes).map_err(|e| SinkError::corrupt("schema version", key, e))
}

pub(super) fn parse_mode(key: &str, s: &str) -> Result<Compatibility, SinkError> {
    s.parse().map_err(|e: String| SinkError::corrupt("schema mode", key, e))
}

/// Sorts versions by subject, then version.
pub(super) fn sorted(mut all: Vec<Version>) -> Vec<Version> {
    all.sort_by(|a, b| (&a.subject, a.version).cmp(&(&b.subject, b.version)));
    all
}

/// Groups versions (sorted by subject, then version) into subjects.
pub(super) fn subjects(mut all: Vec<Version>, mode: impl Fn(&str) -> Option<Compatibility>) -> Vec<Subject> {
    all.sort_by(|a, b| (&a.subject, a.version).cmp(&(&b.subject, b.version)));
    let mut out: Vec<Subject> = Vec::new();
    for v in all {
        match out.last_mut() {
            Some(s) if s.subject == v.subject => {
                s.versions += 1;
                s.latest = v;
            }
            _ => out.push(Subject {
                subject: v.subject.clone(),
                compatibility: mode(&v.subject),
                versions: 1,
                latest: v,
            }),
        }
    }
    out
}
