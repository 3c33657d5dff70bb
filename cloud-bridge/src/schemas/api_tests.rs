//! The REST API through its router on the SQLite sink: the answers and error bodies Schema
//! Registry clients read (Confluent's API reference), the access rules, the bounds. The real
//! clients' round trip is `e2e/schema_registry.rs`.

use axum::body::Body;
use axum::http::Request;
use tower::ServiceExt;

use super::*;
use crate::sink::sqlite::SqliteSink;

const AVRO_V1: &str = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"long"}]}"#;
const AVRO_V2: &str =
    r#"{"type":"record","name":"R","fields":[{"name":"a","type":"long"},{"name":"b","type":"long","default":0}]}"#;
/// `b` without a default: version 2 cannot read what version 1 wrote.
const AVRO_BAD: &str =
    r#"{"type":"record","name":"R","fields":[{"name":"a","type":"long"},{"name":"b","type":"long"}]}"#;
/// `ops:0123456789abcdef`.
const BASIC: &str = "Basic b3BzOjAxMjM0NTY3ODlhYmNkZWY=";

struct Fixture {
    _dir: tempfile::TempDir,
    router: axum::Router,
    metrics: Arc<RegistryMetrics>,
}

fn fixture(config: RegistryConfig) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(SqliteSink::open(&dir.path().join("sink.db")).unwrap());
    let creds = dir.path().join("creds");
    std::fs::write(&creds, "ops:0123456789abcdef\n").unwrap();
    let credentials = Some(Credentials::load(&creds).unwrap());
    let metrics = Arc::new(RegistryMetrics::default());
    let router = Api::new(sink, None, config, credentials, metrics.clone()).routes();
    Fixture { _dir: dir, router, metrics }
}

fn writer() -> RegistryConfig {
    RegistryConfig { api: Access::ReadWrite, ..Default::default() }
}

impl Fixture {
    /// (status, body as JSON or as a string)
    async fn ask(
        &self,
        method: &str,
        uri: &str,
        body: Option<serde_json::Value>,
        auth: bool,
    ) -> (u16, serde_json::Value) {
        let mut req = Request::builder().method(method).uri(uri).header("content-type", CONTENT_TYPE);
        if auth {
            req = req.header("authorization", BASIC);
        }
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        let response = self.router.clone().oneshot(req.body(body).unwrap()).await.unwrap();
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), BODY_MAX).await.unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
    }

    async fn register(&self, subject: &str, schema: &str) -> (u16, serde_json::Value) {
        self.ask("POST", &format!("/subjects/{subject}/versions"), Some(json!({ "schema": schema })), true).await
    }

    fn count(&self, outcome: &'static str) -> u64 {
        self.metrics.requests.get_or_create(&OutcomeLabel { outcome }).get()
    }
}

#[tokio::test]
async fn registered_schemas_are_served_as_schema_registry_clients_read_them() {
    let f = fixture(writer());
    let (status, body) = f.register("t-value", AVRO_V1).await;
    assert_eq!(status, 200, "{body}");
    let id = body["id"].as_u64().unwrap();
    let expected = u64::from(shared::schema::registry_id(
        Schema::parse(Source { kind: Kind::Avro, text: AVRO_V1.into(), message: None }).unwrap().id(),
    ));
    assert_eq!(id, expected, "the id is derived from the content");
    assert_eq!(f.register("t-value", AVRO_V1).await.1["id"], id, "the same schema again: the same id");
    let (status, body) = f.register("t-value", AVRO_V2).await;
    assert_eq!((status, body["version"].as_u64()), (200, Some(2)));
    let v2 = body["id"].clone();

    assert_eq!(f.ask("GET", "/subjects", None, false).await, (200, json!(["t-value"])));
    assert_eq!(f.ask("GET", "/subjects/t-value/versions", None, false).await, (200, json!([1, 2])));
    let (_, latest) = f.ask("GET", "/subjects/t-value/versions/latest", None, false).await;
    assert_eq!(
        (latest["version"].clone(), latest["id"].clone(), latest["subject"].clone()),
        (json!(2), v2, json!("t-value"))
    );
    assert!(latest.get("schemaType").is_none(), "AVRO is the default and left out");
    let raw = f.ask("GET", "/subjects/t-value/versions/1/schema", None, false).await.1;
    assert_eq!(raw, serde_json::from_str::<serde_json::Value>(AVRO_V1).unwrap(), "the schema itself");
    let (status, by_id) = f.ask("GET", &format!("/schemas/ids/{id}"), None, false).await;
    assert_eq!((status, by_id), (200, json!({ "schema": AVRO_V1 })));
    assert_eq!(
        f.ask("GET", &format!("/schemas/ids/{id}/versions"), None, false).await.1,
        json!([{ "subject": "t-value", "version": 1 }])
    );
    let (status, found) = f.ask("POST", "/subjects/t-value", Some(json!({ "schema": AVRO_V1 })), false).await;
    assert_eq!((status, found["version"].clone(), found["id"].clone()), (200, json!(1), json!(id)));

    // Confluent's error bodies: HTTP status and error_code.
    let missing = |uri: &'static str| f.ask("GET", uri, None, false);
    assert_eq!(missing("/subjects/nope/versions").await.1["error_code"], 40401);
    assert_eq!(missing("/subjects/t-value/versions/9").await.1["error_code"], 40402);
    let (status, bad) = missing("/subjects/t-value/versions/zero").await;
    assert_eq!((status, bad["error_code"].clone()), (422, json!(42202)));
    assert_eq!(missing("/schemas/ids/7").await.1["error_code"], 40403);
    let (status, unknown) = f.ask("POST", "/subjects/t-value", Some(json!({ "schema": AVRO_BAD })), false).await;
    assert_eq!((status, unknown["error_code"].clone()), (404, json!(40403)));
    assert_eq!((f.count("not_found"), f.count("invalid")), (4, 1));
}

#[tokio::test]
async fn compatibility_is_checked_and_incompatible_or_invalid_schemas_are_refused() {
    let f = fixture(writer());
    f.register("t", AVRO_V1).await;
    let check = |uri: &'static str, schema: &'static str| f.ask("POST", uri, Some(json!({ "schema": schema })), false);
    let (status, body) = check("/compatibility/subjects/t/versions/latest?verbose=true", AVRO_BAD).await;
    assert_eq!(status, 200);
    assert_eq!(body["is_compatible"], false);
    assert!(
        body["messages"][0].as_str().unwrap().contains("/b: field added without a default"),
        "the field is named: {body}"
    );
    assert_eq!(check("/compatibility/subjects/t/versions/1", AVRO_V2).await.1, json!({ "is_compatible": true }));
    assert_eq!(check("/compatibility/subjects/t/versions", AVRO_V2).await.1["is_compatible"], true);
    assert_eq!(check("/compatibility/subjects/new/versions/latest", AVRO_BAD).await.1["is_compatible"], true);
    let (status, body) = f.register("t", AVRO_BAD).await;
    assert_eq!((status, body["error_code"].clone()), (409, json!(409)), "{body}");
    let (status, body) = f.register("t", "{not avro").await;
    assert_eq!((status, body["error_code"].clone()), (422, json!(42201)), "{body}");
    let (status, body) = f
        .ask("POST", "/subjects/t/versions", Some(json!({ "schema": AVRO_V2, "references": [{"name": "x"}] })), true)
        .await;
    assert!(status == 422 && body["message"].as_str().unwrap().contains("references"), "{body}");
    let json_kind = json!({ "schema": "{\"type\":\"object\"}", "schemaType": "JSON" });
    let (status, body) = f.ask("POST", "/subjects/t/versions", Some(json_kind), true).await;
    assert_eq!(status, 409, "one kind per subject: {body}");
}

#[tokio::test]
async fn modes_are_set_per_subject_and_registry_wide() {
    let f = fixture(writer());
    assert_eq!(f.ask("GET", "/config", None, false).await.1, json!({ "compatibilityLevel": "BACKWARD" }));
    let (status, body) = f.ask("PUT", "/config", Some(json!({ "compatibility": "NONE" })), true).await;
    assert_eq!((status, body), (200, json!({ "compatibility": "NONE" })));
    f.register("t", AVRO_V1).await;
    // NONE registry-wide: what BACKWARD refuses is taken.
    assert_eq!(f.register("t", AVRO_BAD).await.0, 200);
    assert_eq!(f.ask("GET", "/config/t", None, false).await.1["error_code"], 40408);
    assert_eq!(f.ask("GET", "/config/t?defaultToGlobal=true", None, false).await.1["compatibilityLevel"], "NONE");
    let (status, _) = f.ask("PUT", "/config/t", Some(json!({ "compatibility": "FULL_TRANSITIVE" })), true).await;
    assert_eq!(status, 200);
    assert_eq!(f.ask("GET", "/config/t", None, false).await.1, json!({ "compatibilityLevel": "FULL_TRANSITIVE" }));
    let (status, body) = f.ask("PUT", "/config/t", Some(json!({ "compatibility": "SIDEWAYS" })), true).await;
    assert_eq!((status, body["error_code"].clone()), (422, json!(42203)));
}

#[tokio::test]
async fn writes_need_read_write_and_the_credentials_and_are_bounded() {
    let read_only = fixture(RegistryConfig::default());
    let (status, body) = read_only.register("t", AVRO_V1).await;
    assert_eq!((status, body["error_code"].clone()), (403, json!(40301)));
    assert_eq!(read_only.ask("GET", "/mode", None, false).await.1, json!({ "mode": "READONLY" }));
    assert_eq!(read_only.ask("GET", "/subjects", None, false).await, (200, json!([])), "reads are open");

    let f = fixture(RegistryConfig { api: Access::ReadWrite, max_subjects: 1, max_versions: 1, ..Default::default() });
    let anonymous = f.ask("POST", "/subjects/t/versions", Some(json!({ "schema": AVRO_V1 })), false).await;
    assert_eq!((anonymous.0, anonymous.1["error_code"].clone()), (401, json!(40101)));
    assert_eq!(f.count("refused"), 1);
    assert_eq!(f.register("t", AVRO_V1).await.0, 200);
    let (status, body) = f.register("t", AVRO_V2).await;
    assert!(status == 422 && body["message"].as_str().unwrap().contains("registry.max_versions"), "{body}");
    let (status, body) = f.register("u", AVRO_V1).await;
    assert!(status == 422 && body["message"].as_str().unwrap().contains("registry.max_subjects"), "{body}");
    assert_eq!(f.count("full"), 2);

    let locked = fixture(RegistryConfig { auth_reads: true, ..writer() });
    assert_eq!(locked.ask("GET", "/subjects", None, false).await.0, 401);
    assert_eq!(locked.ask("GET", "/subjects", None, true).await.0, 200);
    let off = fixture(RegistryConfig { api: Access::Off, ..Default::default() });
    assert_eq!(off.ask("GET", "/subjects", None, false).await.0, 404);
}

/// Confluent's Protobuf deserializers ask for the writer's schema with `format=serialized`:
/// a schema registered as `.proto` text is then its file's `FileDescriptorProto` in base64,
/// which registers as another form of the same file; without the parameter, the text as given.
#[tokio::test]
async fn a_protobuf_schema_is_given_in_serialized_form_when_asked() {
    let f = fixture(writer());
    let text = "syntax = \"proto3\";\npackage p;\nmessage M { string s = 1; }\n";
    let body = json!({ "schema": text, "schemaType": "PROTOBUF" });
    let (status, id) = f.ask("POST", "/subjects/m-value/versions", Some(body), true).await;
    assert_eq!(status, 200, "{id}");
    let id = id["id"].as_u64().unwrap();
    let (_, plain) = f.ask("GET", &format!("/schemas/ids/{id}"), None, false).await;
    assert_eq!(plain["schema"], text);
    let (_, serialized) = f.ask("GET", &format!("/schemas/ids/{id}?format=serialized"), None, false).await;
    let base64 = serialized["schema"].as_str().unwrap();
    assert!(!base64.contains(char::is_whitespace) && base64 != text, "{serialized}");
    assert_eq!(serialized["schemaType"], "PROTOBUF");
    let (_, version) = f.ask("GET", "/subjects/m-value/versions/1?format=serialized", None, false).await;
    assert_eq!(version["schema"], base64);
    // Registered in that form: the same file (compatible under any mode), another version.
    let body = json!({ "schema": base64, "schemaType": "PROTOBUF" });
    let (_, ok) = f.ask("POST", "/compatibility/subjects/m-value/versions/latest", Some(body.clone()), false).await;
    assert_eq!(ok["is_compatible"], true, "{ok}");
    let (status, again) = f.ask("POST", "/subjects/m-value/versions", Some(body), true).await;
    assert_eq!(status, 200, "{again}");
    // Avro has no serialized form but its text.
    let (_, avro) = f.ask("POST", "/subjects/r-value/versions", Some(json!({ "schema": AVRO_V1 })), true).await;
    let (_, read) = f.ask("GET", &format!("/schemas/ids/{}?format=serialized", avro["id"]), None, false).await;
    assert_eq!(read["schema"], AVRO_V1);
}
