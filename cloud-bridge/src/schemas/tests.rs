//! The registry on the SQLite sink: versions numbered in order, refused with the reason when
//! incompatible, registering the same schema twice changes nothing, one kind per subject, and
//! delivery into the model store as a signed version the edges can verify.

use super::*;
use crate::models::ModelStore;
use crate::sink::sqlite::SqliteSink;
use shared::schema::Kind;

fn json(text: &str) -> Source {
    Source { kind: Kind::Json, text: text.into(), message: None }
}

const V1: &str = r#"{"type":"object","properties":{"temp":{"type":"number"}},"additionalProperties":false}"#;
const V2: &str = r#"{"type":"object","properties":{"temp":{"type":"number"},"unit":{"type":"string"}},"additionalProperties":false}"#;
const V3_NARROWED: &str = r#"{"type":"object","properties":{"temp":{"type":"integer"}},"additionalProperties":false}"#;

#[tokio::test]
async fn versions_are_numbered_checked_and_never_stored_twice() {
    let dir = tempfile::tempdir().unwrap();
    let sink = SqliteSink::open(&dir.path().join("sink.db")).unwrap();
    let r1 = register(&sink, "t", json(V1), None).await.unwrap();
    assert!(matches!(&r1, Registered::New(v) if v.version == 1));
    // The same schema laid out differently is the same content.
    let spaced = register(&sink, "t", json(&V1.replace(',', ", ")), None).await.unwrap();
    assert_eq!(spaced, Registered::Exists(r1.version().clone()));
    let r2 = register(&sink, "t", json(V2), None).await.unwrap();
    assert!(matches!(&r2, Registered::New(v) if v.version == 2));
    let same = register(&sink, "t", json(V2), None).await.unwrap();
    assert_eq!(same, Registered::Exists(r2.version().clone()));
    let refused = register(&sink, "t", json(V3_NARROWED), None).await.unwrap_err();
    let text = refused.to_string();
    assert!(text.contains("version 2") && text.contains("/temp") && text.contains("type narrowed"), "{text}");
    // Under `none` the same change is taken, and the mode sticks.
    let r3 = register(&sink, "t", json(V3_NARROWED), Some(Compatibility::None)).await.unwrap();
    assert_eq!(r3.version().version, 3);
    assert_eq!(sink.schema_mode("t").await.unwrap(), Some(Compatibility::None));
    let avro = Source { kind: Kind::Avro, text: r#""string""#.into(), message: None };
    assert!(matches!(register(&sink, "t", avro, None).await, Err(RegistryError::KindChanged { .. })));
    let subjects = sink.schema_subjects().await.unwrap();
    assert_eq!((subjects.len(), subjects[0].versions, subjects[0].latest.version), (1, 3, 3));
    assert_eq!(show(&sink, "t", Some(1)).await.unwrap().id, r1.version().id);
    assert!(matches!(show(&sink, "t", Some(9)).await, Err(RegistryError::NoVersion { .. })));
    assert!(matches!(register(&sink, "bad name", json(V1), None).await, Err(RegistryError::Subject(_))));
}

#[tokio::test]
async fn two_registrations_racing_for_one_version_cannot_both_take_it() {
    let dir = tempfile::tempdir().unwrap();
    let sink = SqliteSink::open(&dir.path().join("sink.db")).unwrap();
    register(&sink, "t", json(V1), None).await.unwrap();
    let v = |text: &str| Version {
        subject: "t".into(),
        version: 2,
        id: Schema::parse(json(text)).unwrap().id().into(),
        source: json(text),
        created_ms: 0,
        compatibility: None,
    };
    assert!(sink.schema_put(&v(V2)).await.unwrap());
    assert!(!sink.schema_put(&v(V3_NARROWED)).await.unwrap(), "version 2 is taken");
    assert_eq!(show(&sink, "t", Some(2)).await.unwrap().source.text, V2);
}

#[tokio::test]
async fn a_version_is_delivered_as_a_signed_model_once() {
    let dir = tempfile::tempdir().unwrap();
    let sink = SqliteSink::open(&dir.path().join("sink.db")).unwrap();
    let models = crate::models::dir::DirStore::open(&dir.path().join("models")).unwrap();
    let (private, public, _) = crate::models::keygen(&dir.path().join("keys")).unwrap();
    let key = crate::models::signing_key(&private).unwrap();
    let v = register(&sink, "t", json(V1), None).await.unwrap().version().clone();
    let staged_v1 = staging(&sink, &v).await.unwrap();
    let p = deliver(&models, &key, &staged_v1, dir.path()).await.unwrap().unwrap();
    assert_eq!((p.name.as_str(), p.version.as_str()), ("schema.t", "1"));
    assert!(deliver(&models, &key, &staged_v1, dir.path()).await.unwrap().is_none());
    let signed = models.get_manifest("schema.t", "1").await.unwrap().unwrap();
    let manifest = signed.verify(&std::fs::read(public).unwrap()).unwrap();
    let mut file = Vec::new();
    crate::models::assemble(&models, &manifest, &mut file).await.unwrap();
    let staged: Staging = serde_json::from_slice(&file).unwrap();
    assert_eq!((&staged.version, staged.writers.len()), (&v, 0));
}

const V4_SITE: &str = r#"{"type":"object","properties":{"temp":{"type":"number"},"unit":{"type":"string"},"site":{"type":"string"}},"additionalProperties":false}"#;

/// Issue 45: a delivery carries the earlier versions producers may still write, as the mode its
/// version was checked under proved the new version reads them.
#[tokio::test]
async fn a_delivery_names_the_earlier_versions_its_mode_lets_producers_write() {
    let dir = tempfile::tempdir().unwrap();
    let sink = SqliteSink::open(&dir.path().join("sink.db")).unwrap();
    let writers = |s: &Staging| s.writers.iter().map(|w| w.version).collect::<Vec<_>>();
    let v1 = register(&sink, "t", json(V1), None).await.unwrap().version().clone();
    assert_eq!(v1.compatibility, Some(Compatibility::Backward), "the mode it was checked under is kept");
    assert!(staging(&sink, &v1).await.unwrap().writers.is_empty());
    let v2 = register(&sink, "t", json(V2), None).await.unwrap().version().clone();
    assert_eq!(writers(&staging(&sink, &v2).await.unwrap()), [1], "backward: the one before");
    let v3 = register(&sink, "t", json(V4_SITE), Some(Compatibility::BackwardTransitive)).await.unwrap();
    let s3 = staging(&sink, v3.version()).await.unwrap();
    assert_eq!(writers(&s3), [2, 1], "transitive: every earlier one, newest first");
    assert_eq!(s3.writers[1], v1);
    // Forward proves nothing of what the new version reads: it alone is written.
    let dir2 = tempfile::tempdir().unwrap();
    let sink2 = SqliteSink::open(&dir2.path().join("sink.db")).unwrap();
    register(&sink2, "f", json(V2), Some(Compatibility::Forward)).await.unwrap();
    let f2 = register(&sink2, "f", json(V1), None).await.unwrap();
    assert!(staging(&sink2, f2.version()).await.unwrap().writers.is_empty());
}

/// Issue 45: registry ids are derived from the content; a schema whose id another content holds
/// (a collision) is refused, naming the holder, instead of two schemas sharing one id.
#[tokio::test]
async fn a_schema_whose_registry_id_is_taken_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sink = SqliteSink::open(&dir.path().join("sink.db")).unwrap();
    let id = Schema::parse(json(V1)).unwrap().id().to_owned();
    let squatter = Version {
        subject: "other".into(),
        version: 1,
        // The same first 32 bits, another content.
        id: format!("{}00000000", &id[..8]),
        source: json(V2),
        created_ms: 0,
        compatibility: None,
    };
    assert!(sink.schema_put(&squatter).await.unwrap());
    let e = register(&sink, "t", json(V1), None).await.unwrap_err();
    assert!(matches!(&e, RegistryError::IdTaken { subject, version: 1, .. } if subject == "other"), "{e}");
    assert_eq!(by_number(&sink, shared::schema::registry_id(&id)).await.unwrap(), Some(squatter));
}
