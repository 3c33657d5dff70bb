//! The schema registry: subjects, their immutable versions and compatibility modes, kept in the
//! sink (`sink::schemas`), and the delivery of each version to the edges that bind its subject.
//!
//! - A version is registered only if it is compatible with the subject's earlier versions under
//!   the subject's mode (`backward` unless set); the refusal names the version, the field and
//!   the rule.
//! - Registering what a subject already has (the same content id) changes nothing and says so.
//! - A subject keeps one kind: a JSON subject never gets an Avro version.
//! - Delivery: each version is published into the model store as model `schema.<subject>`,
//!   version `<n>`, a JSON file signed by the fleet key like any model; edges that bind the
//!   subject follow that model, verify and stage it atomically, and validate offline with it.
//!   The file carries the earlier versions producers may still write beside it
//!   (`shared::schema::Staging`: what the mode the version was checked under proved it reads).
//! - Ids: besides its content id, a schema has the 31-bit number Schema Registry clients know it
//!   by, derived from that content id (`shared::schema::registry_id`), the same on every
//!   bridge and sink; a schema whose number another schema holds is refused.

pub(crate) mod api;
pub mod cli;
pub mod config;
pub(crate) mod frame;

use std::path::Path;

use shared::schema::{Compatibility, Incompatible, Schema, SchemaError, Source, Staging, Version};

use crate::models::{ModelStore, Published, StoreError};
use crate::sink::{SchemaStore, SinkError};

#[derive(Debug, thiserror::Error)]
pub(crate) enum RegistryError {
    #[error("subject: {0}")]
    Subject(String),
    #[error(transparent)]
    Schema(#[from] SchemaError),
    #[error("subject {subject} holds {had} schemas; this one is {kind}")]
    KindChanged { subject: String, had: shared::schema::Kind, kind: shared::schema::Kind },
    #[error("subject {subject}: {e}")]
    Incompatible { subject: String, e: Incompatible },
    #[error(
        "schema id {number} is held by {subject} version {version} (content {held}); this schema (content {id}) cannot take it"
    )]
    IdTaken { number: u32, subject: String, version: u32, held: String, id: String },
    #[error("subject {subject} version {version} in the sink does not parse: {e}")]
    Stored { subject: String, version: u32, e: SchemaError },
    #[error("subject {0}: other registrations kept taking the next version; try again")]
    Busy(String),
    #[error("no subject {0}")]
    NoSubject(String),
    #[error("subject {subject} has no version {version}")]
    NoVersion { subject: String, version: u32 },
    #[error(transparent)]
    Sink(#[from] SinkError),
}

/// What `register` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Registered {
    New(Version),
    /// The subject already had this schema, as this version.
    Exists(Version),
}

impl Registered {
    pub(crate) fn version(&self) -> &Version {
        match self {
            Registered::New(v) | Registered::Exists(v) => v,
        }
    }
}

/// The subject's versions parsed, oldest first, with the mode a new one is checked under
/// (`mode` when given, else the subject's, else the default).
async fn earlier<S: SchemaStore>(
    store: &S,
    subject: &str,
    mode: Option<Compatibility>,
) -> Result<(Vec<Version>, Vec<Schema>, Compatibility), RegistryError> {
    shared::model::valid_subject(subject).map_err(RegistryError::Subject)?;
    let versions = store.schema_versions(subject).await?;
    let parsed = versions
        .iter()
        .map(|v| {
            Schema::parse(v.source.clone()).map_err(|e| RegistryError::Stored {
                subject: subject.into(),
                version: v.version,
                e,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mode = match mode {
        Some(m) => m,
        None => match store.schema_mode(subject).await? {
            Some(m) => m,
            // The registry-wide mode (`PUT /config`), or the default.
            None => store.schema_mode(api::GLOBAL).await?.unwrap_or_default(),
        },
    };
    Ok((versions, parsed, mode))
}

/// Whether `schema` could be registered under `subject`: the version it would become, or the
/// version that already holds it.
pub(crate) async fn check<S: SchemaStore>(
    store: &S,
    subject: &str,
    schema: &Schema,
    mode: Option<Compatibility>,
) -> Result<Registered, RegistryError> {
    let (versions, parsed, mode) = earlier(store, subject, mode).await?;
    judge(subject, schema, &versions, &parsed, mode)
}

/// Whether `schema` is compatible with version `against` of `subject` under `mode`'s
/// directions (`POST /compatibility/subjects/{s}/versions/{v}`: one version, whatever the mode's
/// reach).
pub(crate) fn check_one(
    subject: &str,
    schema: &Schema,
    against: &Version,
    mode: Compatibility,
) -> Result<(), RegistryError> {
    let old = Schema::parse(against.source.clone()).map_err(|e| RegistryError::Stored {
        subject: subject.into(),
        version: against.version,
        e,
    })?;
    if old.kind() != schema.kind() {
        return Err(RegistryError::KindChanged { subject: subject.into(), had: old.kind(), kind: schema.kind() });
    }
    shared::schema::check(mode.one_version(), schema, std::slice::from_ref(&old)).map_err(|mut e| {
        e.against = against.version.saturating_sub(1) as usize;
        RegistryError::Incompatible { subject: subject.into(), e }
    })
}

fn judge(
    subject: &str,
    schema: &Schema,
    versions: &[Version],
    parsed: &[Schema],
    mode: Compatibility,
) -> Result<Registered, RegistryError> {
    // By the content as parsed now, not the id kept: a version registered by an earlier build
    // keeps the id derived then (`Schema::is`).
    if let Some((v, _)) = versions.iter().zip(parsed).find(|(_, p)| p.id() == schema.id()) {
        return Ok(Registered::Exists(v.clone()));
    }
    if let Some(first) = versions.first()
        && first.source.kind != schema.kind()
    {
        return Err(RegistryError::KindChanged {
            subject: subject.into(),
            had: first.source.kind,
            kind: schema.kind(),
        });
    }
    shared::schema::check(mode, schema, parsed)
        .map_err(|e| RegistryError::Incompatible { subject: subject.into(), e })?;
    Ok(Registered::New(Version {
        subject: subject.into(),
        version: versions.last().map_or(1, |v| v.version + 1),
        id: schema.id().into(),
        source: schema.source().clone(),
        created_ms: shared::units::now_ms(),
        compatibility: Some(mode),
    }))
}

/// Every version of every subject, by subject then version.
pub(crate) async fn all_versions<S: SchemaStore>(store: &S) -> Result<Vec<Version>, RegistryError> {
    Ok(store.schema_all().await?)
}

/// The version that holds registry id `number`, if any.
pub(crate) async fn by_number<S: SchemaStore>(store: &S, number: u32) -> Result<Option<Version>, RegistryError> {
    Ok(all_versions(store).await?.into_iter().find(|v| v.registry_id() == number))
}

/// Refuses `schema` if another schema's content holds its registry id.
async fn id_free<S: SchemaStore>(store: &S, schema: &Schema) -> Result<(), RegistryError> {
    let number = shared::schema::registry_id(schema.id());
    match by_number(store, number).await? {
        Some(v) if v.id != schema.id() => Err(RegistryError::IdTaken {
            number,
            subject: v.subject,
            version: v.version,
            held: v.id,
            id: schema.id().into(),
        }),
        _ => Ok(()),
    }
}

/// What an edge stages for `v`: it, and the earlier versions of its subject producers may still
/// write (newest first), as the mode it was checked under says.
pub(crate) async fn staging<S: SchemaStore>(store: &S, v: &Version) -> Result<Staging, RegistryError> {
    let versions = store.schema_versions(&v.subject).await?;
    let earlier: Vec<&Version> = versions.iter().filter(|e| e.version < v.version).collect();
    let writers = match v.compatibility {
        Some(mode) => mode.still_written(earlier.len()).map(|i| earlier[i].clone()).collect(),
        None => Vec::new(),
    };
    Ok(Staging { version: v.clone(), writers })
}

/// Registers `source` under `subject`; `mode`, when given, becomes the subject's mode (and is
/// what this version is checked under).
pub(crate) async fn register<S: SchemaStore>(
    store: &S,
    subject: &str,
    source: Source,
    mode: Option<Compatibility>,
) -> Result<Registered, RegistryError> {
    let schema = Schema::parse(source)?;
    // A version number is taken by create-if-absent: a registration that loses the race reads
    // the subject again and is checked against the winner too.
    for _ in 0..16 {
        let (versions, parsed, effective) = earlier(store, subject, mode).await?;
        let outcome = judge(subject, &schema, &versions, &parsed, effective)?;
        let stored = match &outcome {
            Registered::Exists(_) => true,
            Registered::New(v) => {
                id_free(store, &schema).await?;
                store.schema_put(v).await?
            }
        };
        if stored {
            if let Some(m) = mode {
                store.schema_set_mode(subject, m).await?;
            }
            return Ok(outcome);
        }
    }
    Err(RegistryError::Busy(subject.into()))
}

/// One version of a subject (the newest when `version` is none).
pub(crate) async fn show<S: SchemaStore>(
    store: &S,
    subject: &str,
    version: Option<u32>,
) -> Result<Version, RegistryError> {
    let versions = store.schema_versions(subject).await?;
    match version {
        None => versions.last().cloned().ok_or_else(|| RegistryError::NoSubject(subject.into())),
        Some(n) => versions
            .into_iter()
            .find(|v| v.version == n)
            .ok_or(RegistryError::NoVersion { subject: subject.into(), version: n }),
    }
}

/// Publishes `staging` for the edges: model `schema.<subject>`, version `<n>`, signed by `key`.
/// A version already in the model store is left as it is (registering again repairs a delivery
/// that failed half way; edges order a schema's versions by number, so one made late does not
/// pass a newer one).
pub(crate) async fn deliver<M: ModelStore>(
    models: &M,
    key: &shared::model::SigningKey,
    staging: &Staging,
    scratch: &Path,
) -> Result<Option<Published>, StoreError> {
    let v = &staging.version;
    let name = shared::model::schema_model(&v.subject);
    let version = v.version.to_string();
    if models.get_manifest(&name, &version).await?.is_some() {
        return Ok(None);
    }
    let file = scratch.join(format!("{name}-{version}.json"));
    let doc = serde_json::to_vec_pretty(staging).map_err(|e| crate::models::failed("schema file", e))?;
    std::fs::write(&file, doc).map_err(|e| crate::models::failed("schema file", format!("{}: {e}", file.display())))?;
    let published = crate::models::publish(models, key, &name, &version, &file, |_| {}).await;
    let _ = std::fs::remove_file(&file);
    published.map(Some)
}

#[cfg(test)]
mod tests;
