use super::*;
use shared::schema::{Kind, Source};

const V1: &str = r#"{"type":"object","required":["temp"],"properties":{"temp":{"type":"number"}}}"#;
const V2: &str =
    r#"{"type":"object","required":["temp"],"properties":{"temp":{"type":"number"},"unit":{"type":"string"}}}"#;

/// Stages `text` as version `version` of `subject` the way the models subsystem leaves it: the
/// file, then the `current` link renamed over the old one.
pub(crate) fn stage(dir: &Path, subject: &str, version: u32, text: &str) {
    let source = Source { kind: Kind::Json, text: text.into(), message: None };
    let id = Schema::parse(source.clone()).unwrap().id().to_owned();
    let doc = Version { subject: subject.into(), version, id, source, created_ms: 0 };
    stage_raw(dir, subject, version, &serde_json::to_vec(&doc).unwrap());
}

fn stage_raw(dir: &Path, subject: &str, version: u32, bytes: &[u8]) {
    let d = dir.join(shared::schema::model_name(subject));
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
    check_schemas(&bad, false, &mut p);
    let keys: Vec<String> = p.into_vec().into_iter().map(|p| p.key).collect();
    assert_eq!(keys, ["schema", "schema[0].topic", "schema[0].subject"]);
    let mut p = shared::check::Problems::default();
    check_schemas(&[binding("a/#", "ok", Mode::Enforce, Unstaged::Refuse)], true, &mut p);
    assert!(p.is_empty(), "{p:?}");
}
