use super::*;
use crate::schema::check_schemas;
use shared::schema::{Kind, Source};

const V1: &str = r#"{"type":"object","required":["temp"],"properties":{"temp":{"type":"number"}}}"#;
const V2: &str =
    r#"{"type":"object","required":["temp"],"properties":{"temp":{"type":"number"},"unit":{"type":"string"}}}"#;

/// Stages `text` as version `version` of `subject` the way the models subsystem leaves it: the
/// file, then the `current` link renamed over the old one.
pub(crate) fn stage(dir: &Path, subject: &str, version: u32, text: &str) {
    let source = Source { kind: Kind::Json, text: text.into(), message: None };
    let id = Schema::parse(source.clone()).unwrap().id().to_owned();
    let doc = Version { subject: subject.into(), version, id, source, created_ms: 0, compatibility: None };
    stage_raw(dir, subject, version, &serde_json::to_vec(&doc).unwrap());
}

fn stage_raw(dir: &Path, subject: &str, version: u32, bytes: &[u8]) {
    let d = dir.join(shared::model::schema_model(subject));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(version.to_string()), bytes).unwrap();
    let tmp = d.join(".current.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(version.to_string(), &tmp).unwrap();
    std::fs::rename(&tmp, d.join("current")).unwrap();
}

fn binding(topic: &str, subject: &str, mode: Mode, unstaged: Unstaged) -> SchemaBinding {
    SchemaBinding { topic: topic.into(), subject: subject.into(), mode, unstaged }
}

fn count(m: &SchemaMetrics, subject: &str, outcome: &'static str) -> u64 {
    m.checked.get_or_create(&CheckLabels { subject: subject.into(), outcome }).get()
}

#[test]
fn a_bound_topic_is_checked_against_the_staged_version_and_others_are_not() {
    let dir = tempfile::tempdir().unwrap();
    stage(dir.path(), "telemetry", 1, V1);
    let metrics = SchemaMetrics::default();
    let v = Validator::new(
        &[binding("telemetry/+/metrics", "telemetry", Mode::Enforce, Unstaged::Refuse)],
        dir.path(),
        metrics.clone(),
    );
    assert!(matches!(v.check("telemetry/cam-1/metrics", br#"{"temp":1}"#), Verdict::Valid(_)));
    let Verdict::Refused(reason) = v.check("telemetry/cam-1/metrics", br#"{"temp":"hot"}"#) else { panic!() };
    assert!(reason.starts_with("schema telemetry v1: /temp: "), "{reason}");
    assert_eq!(v.check("inference/x", b"not json at all"), Verdict::Unbound);
    assert_eq!((count(&metrics, "telemetry", "valid"), count(&metrics, "telemetry", "invalid")), (1, 1));
}

#[test]
fn nothing_staged_is_refused_or_passed_as_the_binding_says() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = SchemaMetrics::default();
    let v = Validator::new(
        &[
            binding("a/#", "a", Mode::Enforce, Unstaged::Refuse),
            binding("b/#", "b", Mode::Enforce, Unstaged::Pass),
            binding("c/#", "c", Mode::Off, Unstaged::Refuse),
        ],
        dir.path(),
        metrics.clone(),
    );
    assert!(matches!(v.check("a/1", b"{}"), Verdict::Refused(r) if r.contains("not staged")));
    assert_eq!(v.check("b/1", b"{}"), Verdict::Passed);
    assert_eq!(v.check("c/1", b"x"), Verdict::Unbound, "a binding switched off governs nothing");
    assert_eq!(count(&metrics, "a", "unstaged_refused"), 1);
    assert_eq!(count(&metrics, "b", "unstaged_passed"), 1);
    assert_eq!(v.subjects(), ["a", "b"]);
}

#[test]
fn warn_takes_an_invalid_payload_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    stage(dir.path(), "t", 1, V1);
    let metrics = SchemaMetrics::default();
    let v = Validator::new(&[binding("t/#", "t", Mode::Warn, Unstaged::Refuse)], dir.path(), metrics.clone());
    assert_eq!(v.check("t/x", b"{}"), Verdict::Passed);
    assert_eq!(count(&metrics, "t", "warned"), 1);
}

#[test]
fn a_newer_staged_version_is_used_after_a_reload_and_a_bad_file_keeps_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    stage(dir.path(), "t", 1, V1);
    let metrics = SchemaMetrics::default();
    let v = Validator::new(&[binding("t/#", "t", Mode::Enforce, Unstaged::Refuse)], dir.path(), metrics.clone());
    assert_eq!(v.staged("t").unwrap().version, 1);
    assert!(v.reload().is_empty(), "nothing changed");
    stage(dir.path(), "t", 2, V2);
    assert_eq!(v.reload(), ["t"]);
    assert_eq!(v.staged("t").unwrap().version, 2);
    assert!(matches!(v.check("t/x", br#"{"temp":1,"unit":3}"#), Verdict::Refused(r) if r.contains("v2: /unit")));
    stage_raw(dir.path(), "t", 3, b"{not a version");
    assert!(v.reload().is_empty());
    assert!(v.reload().is_empty());
    assert_eq!(v.staged("t").unwrap().version, 2);
    assert_eq!(metrics.reload_errors.get(), 1, "a bad file is counted once, not at every reload");
    assert_eq!(metrics.staged_version.get_or_create(&SubjectLabel { subject: "t".into() }).get(), 2);
}

#[test]
fn a_long_reason_is_cut_at_a_character() {
    let mut s = "é".repeat(200);
    truncate(&mut s, MAX_REASON_BYTES);
    assert!(s.len() <= MAX_REASON_BYTES && s.is_char_boundary(s.len()));
}

#[test]
fn bindings_without_models_or_with_bad_names_are_config_errors() {
    let bad = [binding("a/#/b", "x y", Mode::Enforce, Unstaged::Refuse)];
    let mut p = shared::check::Problems::default();
    check_schemas(&bad, false, true, &mut p);
    let keys: Vec<String> = p.into_vec().into_iter().map(|p| p.key).collect();
    assert_eq!(keys, ["schema", "schema[0].topic", "schema[0].subject"]);
    let mut p = shared::check::Problems::default();
    check_schemas(&[binding("a/#", "ok", Mode::Enforce, Unstaged::Refuse)], true, true, &mut p);
    assert!(p.is_empty(), "{p:?}");
}

/// A build without the validator (no `schema` feature) refuses a binding at its key instead of
/// starting with the topic unchecked: whoever bound it counts on the check.
#[test]
fn a_build_without_the_validator_refuses_bindings() {
    let mut p = shared::check::Problems::default();
    check_schemas(&[binding("a/#", "ok", Mode::Enforce, Unstaged::Refuse)], true, false, &mut p);
    let problems = p.into_vec();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].key, "schema");
    assert!(problems[0].reason.contains("without schema validation"), "{}", problems[0]);
    let mut p = shared::check::Problems::default();
    check_schemas(&[], true, false, &mut p);
    assert!(p.is_empty(), "no binding, nothing to refuse: {p:?}");
}

/// Stages version `version` of `subject` with earlier versions producers may still write
/// (newest first), as the registry delivers it (`shared::schema::Staging`).
fn stage_with(dir: &Path, subject: &str, version: u32, text: &str, writers: &[(u32, &str)]) {
    let doc = |version: u32, text: &str| {
        let source = Source { kind: Kind::Json, text: text.into(), message: None };
        let id = Schema::parse(source.clone()).unwrap().id().to_owned();
        Version { subject: subject.into(), version, id, source, created_ms: 0, compatibility: None }
    };
    let staging = Staging { version: doc(version, text), writers: writers.iter().map(|(v, t)| doc(*v, t)).collect() };
    stage_raw(dir, subject, version, &serde_json::to_vec(&staging).unwrap());
}

const CLOSED_V1: &str =
    r#"{"type":"object","required":["temp"],"additionalProperties":false,"properties":{"temp":{"type":"number"}}}"#;
const CLOSED_V2: &str = r#"{"type":"object","required":["temp","unit"],"additionalProperties":false,"properties":{"temp":{"type":"number"},"unit":{"type":"string"}}}"#;

fn framed(version_text: &str, body: &[u8]) -> Vec<u8> {
    let id = Schema::parse(Source { kind: Kind::Json, text: version_text.into(), message: None }).unwrap();
    let number = shared::schema::registry_id(id.id());
    [&[0u8][..], &number.to_be_bytes(), body].concat()
}

/// Issue 45: a device still on the version before a change keeps publishing: each payload is
/// tried against the versions producers may write, newest first, and names the one it matched.
#[test]
fn earlier_versions_still_written_are_accepted_and_named() {
    let dir = tempfile::tempdir().unwrap();
    stage_with(dir.path(), "t", 2, CLOSED_V2, &[(1, CLOSED_V1)]);
    let v = Validator::uncounted(&[binding("t/#", "t", Mode::Enforce, Unstaged::Refuse)], dir.path());
    let named = |payload: &[u8]| match v.check("t/x", payload) {
        Verdict::Valid(tag) => Ok(tag.version),
        Verdict::Refused(reason) => Err(reason),
        other => panic!("{other:?}"),
    };
    assert_eq!(named(br#"{"temp":1,"unit":"C"}"#), Ok(2));
    assert_eq!(named(br#"{"temp":1}"#), Ok(1), "the old device's message is named v1");
    let reason = named(br#"{"temp":"hot"}"#).unwrap_err();
    assert!(reason.starts_with("schema t v2: ") && reason.ends_with("(nor does it match v1)"), "{reason}");
    assert_eq!(v.staged("t").unwrap().version, 2);
}

/// Issue 45: a payload in the Confluent framing is validated against exactly the version its id
/// names; a JSON framing naming no version accepted here is refused with the id.
#[test]
fn a_confluent_framed_payload_is_validated_against_the_version_it_names() {
    let dir = tempfile::tempdir().unwrap();
    stage_with(dir.path(), "t", 2, CLOSED_V2, &[(1, CLOSED_V1)]);
    let v = Validator::uncounted(&[binding("t/#", "t", Mode::Enforce, Unstaged::Refuse)], dir.path());
    assert!(matches!(v.check("t/x", &framed(CLOSED_V1, br#"{"temp":1}"#)), Verdict::Valid(t) if t.version == 1));
    // Valid under v2, but it says v1: checked as v1 only.
    let Verdict::Refused(reason) = v.check("t/x", &framed(CLOSED_V1, br#"{"temp":1,"unit":"C"}"#)) else { panic!() };
    assert!(reason.starts_with("schema t v1: "), "{reason}");
    let Verdict::Refused(reason) = v.check("t/x", &framed(V1, br#"{"temp":1}"#)) else { panic!() };
    assert!(reason.contains("Confluent framing names schema id"), "{reason}");
}

/// A staged file naming its earlier versions out of order, or more than the bound, is not used.
#[test]
fn a_delivery_with_writers_out_of_order_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    stage_with(dir.path(), "t", 2, CLOSED_V2, &[(3, CLOSED_V1)]);
    let metrics = SchemaMetrics::default();
    let v = Validator::new(&[binding("t/#", "t", Mode::Enforce, Unstaged::Refuse)], dir.path(), metrics.clone());
    assert!(v.staged("t").is_none());
    assert_eq!(metrics.reload_errors.get(), 1);
}
