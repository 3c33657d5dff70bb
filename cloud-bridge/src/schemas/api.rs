//! The Schema Registry REST API on the bridge's HTTP endpoint: the subset Confluent's
//! serializers, deserializers and `SchemaRegistryClient` use, over the same registry as
//! `cloud-bridge schema` (`super::register`, the sink's `SchemaStore`), so ids agree across
//! bridges and sinks (`shared::schema::registry_id`).
//!
//! - Reads: `GET /subjects`, `GET /subjects/{s}/versions`, `GET /subjects/{s}/versions/{v}`
//!   (`latest` or -1 too) and its `/schema`, `POST /subjects/{s}` (lookup), `GET
//!   /schemas/ids/{id}` and its `/schema`, `/versions`, `/subjects`, `GET /schemas/types`,
//!   `POST /compatibility/subjects/{s}/versions[/{v}]`, `GET /config[/{s}]`, `GET /mode`.
//! - Writes (`[registry] api = "read-write"`, HTTP Basic): `POST /subjects/{s}/versions`
//!   (registered, then delivered to edges as `cloud-bridge schema register` does), `PUT
//!   /config[/{s}]`.
//! - Errors as Confluent's: HTTP status and a body `{"error_code", "message"}` (40401 subject,
//!   40402 version, 40403 schema not found, 40408 no subject mode, 409 incompatible, 42201
//!   invalid schema, 42202 invalid version, 40101 unauthorized, 40301 read-only, 50001 the
//!   store).
//! - `?format=serialized` on `GET /schemas/ids/{id}` and `GET /subjects/{s}/versions/{v}`
//!   gives a Protobuf schema as its file's `FileDescriptorProto` in base64, as Confluent's
//!   Protobuf deserializers ask for it; a schema registered so (their serializers') is taken.
//! - Not served: schema references (refused by name), deletes, contexts, metadata and rule
//!   sets (ignored in a request), `normalize` (ids are of the normalised content already).
//! - Bounds: a request body of 1 MiB, `[registry] max_subjects` and `max_versions`; counted in
//!   `bridge_registry_requests_total{outcome}`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Deserialize;
use serde_json::json;
use shared::schema::{Compatibility, Kind, Schema, Source, Version};

use super::cli::Delivery;
use super::config::{Access, Credentials, RegistryConfig};
use super::{Registered, RegistryError};
use crate::sink::SchemaStore;

/// What Schema Registry clients send and expect as the content type.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// The largest request body: a schema is at most 256 KiB, and JSON escaping can double it.
const BODY_MAX: usize = 1 << 20;

/// The subject name of the registry-wide mode in the store; subjects start with a letter or a
/// digit, so none can take it.
pub(crate) const GLOBAL: &str = "_global";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `ok`, `not_found`, `invalid`, `incompatible`, `refused` (credentials, read-only),
    /// `full` (a bound), `failed` (the store).
    pub outcome: &'static str,
}

shared::metrics! {
    /// What the registry's REST API counts.
    #[derive(Debug)]
    pub struct RegistryMetrics {
        pub requests: Family<OutcomeLabel, Counter> => (
            "registry_requests",
            "Schema Registry REST API requests, by outcome"
        ),
    }
}

/// The API's state: the registry's store, where versions are delivered to edges, the config.
pub(crate) struct Api<S> {
    store: Arc<S>,
    delivery: Option<Delivery>,
    config: RegistryConfig,
    credentials: Option<Credentials>,
    metrics: Arc<RegistryMetrics>,
}

impl<S> std::fmt::Debug for Api<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<S: SchemaStore + 'static> Api<S> {
    /// `delivery`: none when the bridge has no `[models]` (versions then reach no edge).
    pub(crate) fn new(
        store: Arc<S>,
        delivery: Option<Delivery>,
        config: RegistryConfig,
        credentials: Option<Credentials>,
        metrics: Arc<RegistryMetrics>,
    ) -> Self {
        Self { store, delivery, config, credentials, metrics }
    }

    /// The API's routes, none when `[registry] api = "off"`.
    pub(crate) fn routes(self) -> axum::Router {
        if self.config.api == Access::Off {
            return axum::Router::new();
        }
        axum::Router::new()
            .route("/subjects", get(subjects::<S>))
            .route("/subjects/:subject", axum::routing::post(lookup::<S>))
            .route("/subjects/:subject/versions", get(versions::<S>).post(register::<S>))
            .route("/subjects/:subject/versions/:version", get(version::<S>))
            .route("/subjects/:subject/versions/:version/schema", get(version_text::<S>))
            .route("/schemas/types", get(types::<S>))
            .route("/schemas/ids/:id", get(by_id::<S>))
            .route("/schemas/ids/:id/schema", get(by_id_text::<S>))
            .route("/schemas/ids/:id/versions", get(by_id_versions::<S>))
            .route("/schemas/ids/:id/subjects", get(by_id_subjects::<S>))
            .route("/compatibility/subjects/:subject/versions", axum::routing::post(compatible_all::<S>))
            .route("/compatibility/subjects/:subject/versions/:version", axum::routing::post(compatible::<S>))
            .route("/config", get(global_config::<S>).put(set_global_config::<S>))
            .route("/config/:subject", get(subject_config::<S>).put(set_subject_config::<S>))
            .route("/mode", get(mode::<S>))
            .layer(DefaultBodyLimit::max(BODY_MAX))
            .with_state(Arc::new(self))
    }

    /// Refuses a request the config does not let through.
    fn admit(&self, headers: &HeaderMap, write: bool) -> Result<(), Failure> {
        let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        if write && self.config.api != Access::ReadWrite {
            return Err(Failure::new(
                StatusCode::FORBIDDEN,
                40301,
                "the registry API is read-only ([registry] api = \"read-write\" allows writes)",
            ));
        }
        let needed = write || self.config.auth_reads;
        match &self.credentials {
            Some(c) if needed && !c.admit(authorization) => Err(Failure::new(
                StatusCode::UNAUTHORIZED,
                40101,
                "HTTP Basic credentials of [registry] credentials are needed",
            )),
            _ => Ok(()),
        }
    }

    fn count(&self, response: &Result<Response, Failure>) {
        let outcome = match response {
            Ok(_) => "ok",
            Err(f) => f.outcome(),
        };
        self.metrics.requests.get_or_create(&OutcomeLabel { outcome }).inc();
    }
}

/// An error as Schema Registry clients read it.
#[derive(Debug)]
struct Failure {
    status: StatusCode,
    code: u32,
    message: String,
}

impl Failure {
    fn new(status: StatusCode, code: u32, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }

    fn outcome(&self) -> &'static str {
        match self.code {
            40401..=40499 => "not_found",
            409 => "incompatible",
            40101 | 40301 => "refused",
            42210 => "full",
            50001.. => "failed",
            _ => "invalid",
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = json!({ "error_code": self.code, "message": self.message });
        (self.status, [(header::CONTENT_TYPE, CONTENT_TYPE)], body.to_string()).into_response()
    }
}

impl From<RegistryError> for Failure {
    fn from(e: RegistryError) -> Self {
        let message = e.to_string();
        match e {
            RegistryError::Subject(_) | RegistryError::Schema(_) => {
                Failure::new(StatusCode::UNPROCESSABLE_ENTITY, 42201, message)
            }
            RegistryError::Incompatible { .. } | RegistryError::KindChanged { .. } | RegistryError::IdTaken { .. } => {
                Failure::new(StatusCode::CONFLICT, 409, message)
            }
            RegistryError::NoSubject(_) => Failure::new(StatusCode::NOT_FOUND, 40401, message),
            RegistryError::NoVersion { .. } => Failure::new(StatusCode::NOT_FOUND, 40402, message),
            RegistryError::Stored { .. } | RegistryError::Busy(_) | RegistryError::Sink(_) => {
                Failure::new(StatusCode::INTERNAL_SERVER_ERROR, 50001, message)
            }
        }
    }
}

fn ok(body: serde_json::Value) -> Result<Response, Failure> {
    Ok(([(header::CONTENT_TYPE, CONTENT_TYPE)], body.to_string()).into_response())
}

/// A schema's text as `GET .../schema` answers it.
fn text(body: String) -> Result<Response, Failure> {
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response())
}

/// Runs `answer` for a read (`write` false) or a write, counted.
async fn serve<S: SchemaStore + 'static>(
    api: &Api<S>,
    headers: &HeaderMap,
    write: bool,
    answer: impl Future<Output = Result<Response, Failure>>,
) -> Response {
    let response = match api.admit(headers, write) {
        Ok(()) => answer.await,
        Err(f) => Err(f),
    };
    api.count(&response);
    response.unwrap_or_else(IntoResponse::into_response)
}

/// A schema in a request body (`schema`, `schemaType`, `references`; the rest ignored).
#[derive(Debug, Deserialize)]
struct SchemaBody {
    schema: String,
    #[serde(rename = "schemaType", default)]
    schema_type: Option<String>,
    #[serde(default)]
    references: Option<Vec<serde_json::Value>>,
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Avro => "AVRO",
        Kind::Json => "JSON",
        Kind::Protobuf => "PROTOBUF",
    }
}

fn source_of(body: &Bytes) -> Result<Source, Failure> {
    let invalid = |m: String| Failure::new(StatusCode::UNPROCESSABLE_ENTITY, 42201, m);
    let b: SchemaBody = serde_json::from_slice(body).map_err(|e| invalid(format!("the request body: {e}")))?;
    if b.references.as_ref().is_some_and(|r| !r.is_empty()) {
        return Err(invalid("schema references are not supported: register the schema with its types inline".into()));
    }
    let kind = match b.schema_type.as_deref().unwrap_or("AVRO") {
        "AVRO" => Kind::Avro,
        "JSON" => Kind::Json,
        "PROTOBUF" => Kind::Protobuf,
        other => return Err(invalid(format!("schemaType {other:?}: AVRO, JSON or PROTOBUF"))),
    };
    Ok(Source { kind, text: b.schema, message: None })
}

fn parse(body: &Bytes) -> Result<Schema, Failure> {
    Schema::parse(source_of(body)?).map_err(|e| Failure::new(StatusCode::UNPROCESSABLE_ENTITY, 42201, e.to_string()))
}

/// A version's schema as asked for: `format=serialized` gives a Protobuf schema as its
/// `FileDescriptorProto` in base64 (Confluent's Protobuf deserializers ask so), else the text
/// as registered.
fn shown(v: &Version, query: &Option<String>) -> String {
    let serialized = query.as_deref().unwrap_or_default().split('&').any(|kv| kv == "format=serialized");
    if serialized && v.source.kind == Kind::Protobuf {
        // A stored version parsed when it was registered: it parses now.
        if let Some(s) = Schema::parse(v.source.clone()).ok().and_then(|s| s.serialized()) {
            return s;
        }
    }
    v.source.text.clone()
}

/// A version as `GET /subjects/{s}/versions/{v}` answers it.
fn described(v: &Version, query: &Option<String>) -> serde_json::Value {
    let mut d = json!({ "subject": v.subject, "version": v.version, "id": v.registry_id(), "schema": shown(v, query) });
    if v.source.kind != Kind::Avro {
        d["schemaType"] = json!(kind_name(v.source.kind));
    }
    d
}

fn level_name(mode: Compatibility) -> String {
    mode.name().replace('-', "_").to_uppercase()
}

fn parse_level(body: &Bytes) -> Result<Compatibility, Failure> {
    #[derive(Deserialize)]
    struct Level {
        compatibility: String,
    }
    let invalid = |m: String| Failure::new(StatusCode::UNPROCESSABLE_ENTITY, 42203, m);
    let l: Level = serde_json::from_slice(body).map_err(|e| invalid(format!("the request body: {e}")))?;
    l.compatibility.to_lowercase().replace('_', "-").parse().map_err(invalid)
}

/// The subject's versions, 40401 when it has none.
async fn held<S: SchemaStore>(api: &Api<S>, subject: &str) -> Result<Vec<Version>, Failure> {
    let versions = api.store.schema_versions(subject).await.map_err(RegistryError::from)?;
    if versions.is_empty() {
        return Err(Failure::new(StatusCode::NOT_FOUND, 40401, format!("Subject '{subject}' not found.")));
    }
    Ok(versions)
}

/// Version `which` (a number, `latest` or -1) of `versions`.
fn pick<'v>(versions: &'v [Version], subject: &str, which: &str) -> Result<&'v Version, Failure> {
    let found = match which {
        "latest" | "-1" => versions.last(),
        n => {
            let n: u32 = n.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                Failure::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    42202,
                    format!("version {which:?}: a positive number, latest or -1"),
                )
            })?;
            versions.iter().find(|v| v.version == n)
        }
    };
    found
        .ok_or_else(|| Failure::new(StatusCode::NOT_FOUND, 40402, format!("Version {which} of '{subject}' not found.")))
}

/// Every version holding registry id `id`, 40403 when none does.
async fn with_id<S: SchemaStore>(api: &Api<S>, id: &str) -> Result<Vec<Version>, Failure> {
    let not_found = || Failure::new(StatusCode::NOT_FOUND, 40403, format!("Schema {id} not found"));
    let number: u32 = id.parse().map_err(|_| not_found())?;
    let all = super::all_versions(&*api.store).await?;
    let holding: Vec<Version> = all.into_iter().filter(|v| v.registry_id() == number).collect();
    if holding.is_empty() { Err(not_found()) } else { Ok(holding) }
}

/// The registry-wide mode: set, or the default.
async fn global<S: SchemaStore>(api: &Api<S>) -> Result<Compatibility, Failure> {
    Ok(api.store.schema_mode(GLOBAL).await.map_err(RegistryError::from)?.unwrap_or_default())
}

fn query_flag(query: &Option<String>, name: &str) -> bool {
    query.as_deref().unwrap_or_default().split('&').any(|kv| kv.eq_ignore_ascii_case(&format!("{name}=true")))
}

async fn subjects<S: SchemaStore + 'static>(State(api): State<Arc<Api<S>>>, headers: HeaderMap) -> Response {
    let answer = async {
        let subjects = api.store.schema_subjects().await.map_err(RegistryError::from)?;
        ok(json!(subjects.iter().map(|s| &s.subject).collect::<Vec<_>>()))
    };
    serve(&api, &headers, false, answer).await
}

async fn versions<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(subject): Path<String>,
    headers: HeaderMap,
) -> Response {
    let answer = async {
        let versions = held(&api, &subject).await?;
        ok(json!(versions.iter().map(|v| v.version).collect::<Vec<_>>()))
    };
    serve(&api, &headers, false, answer).await
}

async fn version<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path((subject, which)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let answer = async { ok(described(pick(&held(&api, &subject).await?, &subject, &which)?, &query)) };
    serve(&api, &headers, false, answer).await
}

async fn version_text<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path((subject, which)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let answer = async { text(pick(&held(&api, &subject).await?, &subject, &which)?.source.text.clone()) };
    serve(&api, &headers, false, answer).await
}

async fn lookup<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = async {
        let schema = parse(&body)?;
        let versions = held(&api, &subject).await?;
        let same = |v: &&Version| Schema::parse(v.source.clone()).is_ok_and(|p| p.id() == schema.id());
        match versions.iter().find(same) {
            Some(v) => ok(described(v, &None)),
            None => Err(Failure::new(StatusCode::NOT_FOUND, 40403, "Schema not found")),
        }
    };
    serve(&api, &headers, false, answer).await
}

async fn register<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = async {
        let source = source_of(&body)?;
        bounded(&api, &subject).await?;
        let registered = super::register(&*api.store, &subject, source, None).await?;
        let v = registered.version();
        if let (Registered::New(_), Some(d)) = (&registered, &api.delivery) {
            deliver(&*api.store, d, v).await?;
        }
        ok(json!({ "id": v.registry_id(), "version": v.version, "subject": v.subject }))
    };
    serve(&api, &headers, true, answer).await
}

/// Refuses a new subject or version past `[registry]`'s bounds.
async fn bounded<S: SchemaStore>(api: &Api<S>, subject: &str) -> Result<(), Failure> {
    let subjects = api.store.schema_subjects().await.map_err(RegistryError::from)?;
    let full = |m: String| Failure::new(StatusCode::UNPROCESSABLE_ENTITY, 42210, m);
    match subjects.iter().find(|s| s.subject == subject) {
        Some(s) if s.versions >= api.config.max_versions => Err(full(format!(
            "subject {subject} has {} versions, registry.max_versions allows {}",
            s.versions, api.config.max_versions
        ))),
        None if subjects.len() >= api.config.max_subjects => {
            Err(full(format!("{} subjects, registry.max_subjects allows {}", subjects.len(), api.config.max_subjects)))
        }
        _ => Ok(()),
    }
}

/// Publishes a new version for the edges; a failure is the request's (the version is
/// registered: registering it again repairs the delivery).
async fn deliver<S: SchemaStore>(store: &S, d: &Delivery, v: &Version) -> Result<(), Failure> {
    let failed = |e: String| {
        Failure::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            50001,
            format!("version {} registered, its delivery to edges failed (register it again to retry): {e}", v.version),
        )
    };
    let staging = super::staging(store, v).await?;
    let scratch = tempfile::tempdir().map_err(|e| failed(e.to_string()))?;
    super::deliver(&d.store, &d.key, &staging, scratch.path()).await.map_err(|e| failed(e.to_string()))?;
    tracing::info!(
        subject = v.subject,
        version = v.version,
        "schema version registered over the REST API and delivered"
    );
    Ok(())
}

async fn types<S: SchemaStore + 'static>(State(api): State<Arc<Api<S>>>, headers: HeaderMap) -> Response {
    serve(&api, &headers, false, async { ok(json!(["AVRO", "JSON", "PROTOBUF"])) }).await
}

async fn by_id<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let answer = async {
        let v = with_id(&api, &id).await?.swap_remove(0);
        let mut d = json!({ "schema": shown(&v, &query) });
        if v.source.kind != Kind::Avro {
            d["schemaType"] = json!(kind_name(v.source.kind));
        }
        ok(d)
    };
    serve(&api, &headers, false, answer).await
}

async fn by_id_text<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let answer = async { text(with_id(&api, &id).await?.swap_remove(0).source.text) };
    serve(&api, &headers, false, answer).await
}

async fn by_id_versions<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let answer = async {
        let held = with_id(&api, &id).await?;
        ok(json!(held.iter().map(|v| json!({ "subject": v.subject, "version": v.version })).collect::<Vec<_>>()))
    };
    serve(&api, &headers, false, answer).await
}

async fn by_id_subjects<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let answer = async {
        let mut subjects: Vec<String> = with_id(&api, &id).await?.into_iter().map(|v| v.subject).collect();
        subjects.dedup();
        ok(json!(subjects))
    };
    serve(&api, &headers, false, answer).await
}

/// `{"is_compatible": ..}`, with the reasons when `verbose=true`.
fn verdict(result: Result<(), RegistryError>, verbose: bool) -> Result<Response, Failure> {
    let messages: Vec<String> = match result {
        Ok(()) => Vec::new(),
        Err(e @ (RegistryError::Incompatible { .. } | RegistryError::KindChanged { .. })) => vec![e.to_string()],
        Err(e) => return Err(e.into()),
    };
    let mut body = json!({ "is_compatible": messages.is_empty() });
    if verbose {
        body["messages"] = json!(messages);
    }
    ok(body)
}

async fn compatible<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path((subject, which)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = async {
        let schema = parse(&body)?;
        let verbose = query_flag(&query, "verbose");
        let versions = api.store.schema_versions(&subject).await.map_err(RegistryError::from)?;
        if versions.is_empty() && matches!(which.as_str(), "latest" | "-1") {
            return verdict(Ok(()), verbose);
        }
        if versions.is_empty() {
            return Err(Failure::new(StatusCode::NOT_FOUND, 40401, format!("Subject '{subject}' not found.")));
        }
        let against = pick(&versions, &subject, &which)?;
        let mode = subject_mode(&api, &subject).await?;
        verdict(super::check_one(&subject, &schema, against, mode), verbose)
    };
    serve(&api, &headers, false, answer).await
}

async fn compatible_all<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(subject): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = async {
        let schema = parse(&body)?;
        let checked = super::check(&*api.store, &subject, &schema, None).await.map(|_| ());
        verdict(checked, query_flag(&query, "verbose"))
    };
    serve(&api, &headers, false, answer).await
}

/// The subject's mode, or the registry-wide one.
async fn subject_mode<S: SchemaStore>(api: &Api<S>, subject: &str) -> Result<Compatibility, Failure> {
    match api.store.schema_mode(subject).await.map_err(RegistryError::from)? {
        Some(m) => Ok(m),
        None => global(api).await,
    }
}

async fn global_config<S: SchemaStore + 'static>(State(api): State<Arc<Api<S>>>, headers: HeaderMap) -> Response {
    let answer = async { ok(json!({ "compatibilityLevel": level_name(global(&api).await?) })) };
    serve(&api, &headers, false, answer).await
}

async fn set_global_config<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = async {
        let mode = parse_level(&body)?;
        api.store.schema_set_mode(GLOBAL, mode).await.map_err(RegistryError::from)?;
        ok(json!({ "compatibility": level_name(mode) }))
    };
    serve(&api, &headers, true, answer).await
}

async fn subject_config<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(subject): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let answer = async {
        let mode = match api.store.schema_mode(&subject).await.map_err(RegistryError::from)? {
            Some(m) => m,
            None if query_flag(&query, "defaultToGlobal") => global(&api).await?,
            None => {
                return Err(Failure::new(
                    StatusCode::NOT_FOUND,
                    40408,
                    format!("Subject '{subject}' does not have subject-level compatibility configured"),
                ));
            }
        };
        ok(json!({ "compatibilityLevel": level_name(mode) }))
    };
    serve(&api, &headers, false, answer).await
}

async fn set_subject_config<S: SchemaStore + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(subject): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = async {
        shared::model::valid_subject(&subject).map_err(RegistryError::Subject)?;
        let mode = parse_level(&body)?;
        api.store.schema_set_mode(&subject, mode).await.map_err(RegistryError::from)?;
        ok(json!({ "compatibility": level_name(mode) }))
    };
    serve(&api, &headers, true, answer).await
}

async fn mode<S: SchemaStore + 'static>(State(api): State<Arc<Api<S>>>, headers: HeaderMap) -> Response {
    let mode = if api.config.api == Access::ReadWrite { "READWRITE" } else { "READONLY" };
    serve(&api, &headers, false, async { ok(json!({ "mode": mode })) }).await
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
