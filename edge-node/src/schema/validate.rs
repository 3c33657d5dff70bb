//! The validator: the versions staged for each bound subject, parsed, and the checks of
//! publishes against them (the `schema` feature).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use shared::proto::SchemaRef;
use shared::schema::{Schema, Staging, Version};
use tokio_util::sync::CancellationToken;

use super::{CheckLabels, Mode, SchemaBinding, SchemaMetrics, SubjectLabel, Unstaged, Verdict};

/// How often the staged versions are looked at again.
pub(crate) const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// The longest Reason String a refusal carries; longer reasons are cut at a character.
pub(crate) const MAX_REASON_BYTES: usize = 256;

/// The newest staged version of a subject, parsed, with the earlier versions its delivery says
/// producers may still write.
#[derive(Debug)]
pub(crate) struct Staged {
    pub version: u32,
    pub schema: Schema,
    /// The version's file name, to see a newer one without parsing it again.
    file: String,
    /// What a message validated against it carries to the sink.
    tag: Arc<SchemaRef>,
    /// Its id for Schema Registry clients (`shared::schema::registry_id`).
    number: u32,
    /// Earlier versions still written, newest first.
    writers: Vec<Writer>,
}

/// An earlier version a producer may still write.
#[derive(Debug)]
struct Writer {
    version: u32,
    schema: Schema,
    tag: Arc<SchemaRef>,
    number: u32,
}

impl Staged {
    /// Each accepted version as (version, schema, tag, registry id), newest first.
    fn accepted(&self) -> impl Iterator<Item = (u32, &Schema, &Arc<SchemaRef>, u32)> {
        std::iter::once((self.version, &self.schema, &self.tag, self.number))
            .chain(self.writers.iter().map(|w| (w.version, &w.schema, &w.tag, w.number)))
    }

    /// The accepted version whose content id (as registered) is `id`.
    fn by_id(&self, id: &str) -> Option<&Schema> {
        self.accepted().find(|(_, _, tag, _)| tag.id == id).map(|(_, schema, ..)| schema)
    }

    fn judge(&self, subject: &str, payload: &[u8]) -> Outcome {
        if let Some((number, body)) = shared::schema::confluent_frame(payload) {
            if let Some((version, schema, tag, _)) = self.accepted().find(|(.., n)| *n == number) {
                return match schema.validate_framed(body) {
                    Ok(()) => Outcome::Valid(tag.clone()),
                    Err(invalid) => Outcome::Invalid { version, reason: invalid.to_string() },
                };
            }
            // JSON text never starts with a zero byte: this is a framing naming a version
            // producers may not write (any longer, or yet).
            if self.schema.kind() == shared::schema::Kind::Json {
                let accepted: Vec<String> = self.accepted().map(|(v, .., n)| format!("v{v} id {n}")).collect();
                return Outcome::Invalid {
                    version: self.version,
                    reason: format!(
                        "Confluent framing names schema id {number}, not one {subject} accepts here ({})",
                        accepted.join(", ")
                    ),
                };
            }
            // Binary Avro or Protobuf may start with a zero byte of its own: tried unframed.
        }
        let mut newest = None;
        for (version, schema, tag, _) in self.accepted() {
            match schema.validate(payload) {
                Ok(()) => return Outcome::Valid(tag.clone()),
                Err(invalid) if newest.is_none() => newest = Some((version, invalid.to_string())),
                Err(_) => {}
            }
        }
        let (version, mut reason) = newest.unwrap_or_default();
        if !self.writers.is_empty() {
            let older: Vec<String> = self.writers.iter().map(|w| format!("v{}", w.version)).collect();
            reason.push_str(&format!(" (nor does it match {})", older.join(", ")));
        }
        Outcome::Invalid { version, reason }
    }
}

/// One binding's counters, resolved once: a check never builds a label set.
#[derive(Debug)]
struct Counts {
    valid: Counter,
    invalid: Counter,
    warned: Counter,
    unstaged_refused: Counter,
    unstaged_passed: Counter,
}

impl Counts {
    fn of(metrics: &SchemaMetrics, subject: &str) -> Self {
        let c = |outcome| metrics.checked.get_or_create(&CheckLabels { subject: subject.to_owned(), outcome }).clone();
        Counts {
            valid: c("valid"),
            invalid: c("invalid"),
            warned: c("warned"),
            unstaged_refused: c("unstaged_refused"),
            unstaged_passed: c("unstaged_passed"),
        }
    }
}

pub struct Validator {
    bindings: Vec<SchemaBinding>,
    /// Each binding's counters, in the same order.
    counts: Vec<Counts>,
    /// `<models.dir>`: each subject's versions are in `schema.<subject>/`.
    dir: PathBuf,
    staged: ArcSwap<HashMap<String, Arc<Staged>>>,
    /// The file of each subject that last failed to load: not tried again until it changes.
    failed: std::sync::Mutex<HashMap<String, String>>,
    metrics: SchemaMetrics,
}

impl std::fmt::Debug for Validator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validator").field("bindings", &self.bindings.len()).finish_non_exhaustive()
    }
}

impl Validator {
    /// Bindings switched `off` are dropped here; what is staged is read at once.
    pub fn new(bindings: &[SchemaBinding], dir: &Path, metrics: SchemaMetrics) -> Self {
        let bindings: Vec<SchemaBinding> = bindings.iter().filter(|b| b.mode != Mode::Off).cloned().collect();
        for b in &bindings {
            metrics.staged_version.get_or_create(&SubjectLabel { subject: b.subject.clone() }).set(0);
        }
        let counts = bindings.iter().map(|b| Counts::of(&metrics, &b.subject)).collect();
        let v = Validator {
            bindings,
            counts,
            dir: dir.to_owned(),
            staged: ArcSwap::default(),
            failed: Default::default(),
            metrics,
        };
        v.reload();
        v
    }

    /// [`Validator::new`] counting into metrics no registry holds (other subsystems' tests).
    #[cfg(test)]
    pub(crate) fn uncounted(bindings: &[SchemaBinding], dir: &Path) -> Self {
        Self::new(bindings, dir, SchemaMetrics::default())
    }

    /// The subjects the bindings name, each once: the models to follow.
    pub(crate) fn subjects(&self) -> Vec<String> {
        let mut out: Vec<String> = self.bindings.iter().map(|b| b.subject.clone()).collect();
        out.sort();
        out.dedup();
        out
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }

    /// Reads each subject's current staged version where it changed; returns the subjects
    /// whose version changed.
    pub(crate) fn reload(&self) -> Vec<String> {
        let before = self.staged.load_full();
        let mut now = (*before).clone();
        let mut changed = Vec::new();
        for subject in self.subjects() {
            let dir = self.dir.join(shared::model::schema_model(&subject));
            let Ok(file) = std::fs::read_link(dir.join("current")) else { continue };
            let file = file.to_string_lossy().into_owned();
            let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
            if before.get(&subject).is_some_and(|s| s.file == file) || failed.get(&subject) == Some(&file) {
                continue;
            }
            match load(&dir.join(&file), &subject, file.clone()) {
                Ok(staged) => {
                    let writers: Vec<u32> = staged.writers.iter().map(|w| w.version).collect();
                    tracing::info!(
                        subject,
                        version = staged.version,
                        id = staged.schema.id(),
                        ?writers,
                        "schema staged for validation"
                    );
                    self.metrics
                        .staged_version
                        .get_or_create(&SubjectLabel { subject: subject.clone() })
                        .set(i64::from(staged.version));
                    now.insert(subject.clone(), Arc::new(staged));
                    changed.push(subject);
                }
                Err(reason) => {
                    self.metrics.reload_errors.inc();
                    failed.insert(subject.clone(), file.clone());
                    tracing::warn!(subject, file, %reason, "a staged schema version cannot be used; the one before stays");
                }
            }
        }
        if !changed.is_empty() {
            self.staged.store(Arc::new(now));
        }
        changed
    }

    /// Reloads as soon as `staged` is told a version was staged (the models subsystem does),
    /// and every [`RELOAD_EVERY`] (`edge-node models rollback` runs in another process), until
    /// shutdown.
    pub(crate) async fn run(self: Arc<Self>, staged: Arc<tokio::sync::Notify>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
                _ = staged.notified() => {}
            }
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || me.reload()).await;
        }
    }

    /// The staged version of `subject`, if any.
    pub(crate) fn staged(&self, subject: &str) -> Option<Arc<Staged>> {
        self.staged.load().get(subject).cloned()
    }

    /// What a publish of `payload` to `topic` gets: [`Validator::judge`], then
    /// [`Validator::settle`].
    pub fn check(&self, topic: &str, payload: &[u8]) -> Verdict {
        match self.judge(topic, payload) {
            Some(judged) => self.settle(judged),
            None => Verdict::Unbound,
        }
    }

    /// Validates `payload` against the version staged for `topic`'s binding, counting nothing:
    /// `None` when no binding governs the topic. The front judges a PUBLISH before it takes the
    /// broker core's lock, which every client's packets wait for, so a large payload's
    /// validation holds up only its own connection; the core settles the judgment if the
    /// publish gets that far (the ACL and the other checks come first).
    pub(crate) fn judge(&self, topic: &str, payload: &[u8]) -> Option<Judged> {
        let binding = self.bindings.iter().position(|b| shared::topic::matches(&b.topic, topic))?;
        let subject = &self.bindings[binding].subject;
        let outcome = match self.staged.load().get(subject) {
            None => Outcome::Unstaged,
            Some(s) => s.judge(subject, payload),
        };
        Some(Judged { topic: topic.into(), len: payload.len(), binding, outcome })
    }

    /// [`Validator::settle`] of a judgment made before the core's lock, counted as such.
    pub(crate) fn settle_ahead(&self, judged: Judged) -> Verdict {
        self.metrics.ahead.inc();
        self.settle(judged)
    }

    /// What a [`Judged`] publish gets under its binding's mode, counted.
    pub(crate) fn settle(&self, judged: Judged) -> Verdict {
        let (b, counts) = (&self.bindings[judged.binding], &self.counts[judged.binding]);
        match judged.outcome {
            Outcome::Unstaged => match (b.unstaged, b.mode) {
                (Unstaged::Pass, _) | (_, Mode::Warn) => {
                    counts.unstaged_passed.inc();
                    Verdict::Passed
                }
                _ => {
                    counts.unstaged_refused.inc();
                    Verdict::Refused(format!("schema {} is not staged on this edge yet", b.subject))
                }
            },
            Outcome::Valid(tag) => {
                counts.valid.inc();
                Verdict::Valid(tag)
            }
            Outcome::Invalid { reason, .. } if b.mode == Mode::Warn => {
                counts.warned.inc();
                tracing::debug!(topic = &*judged.topic, subject = b.subject, %reason, "payload does not match its schema (warn)");
                Verdict::Passed
            }
            Outcome::Invalid { version, reason } => {
                counts.invalid.inc();
                let mut reason = format!("schema {} v{version}: {reason}", b.subject);
                truncate(&mut reason, MAX_REASON_BYTES);
                Verdict::Refused(reason)
            }
        }
    }
}

/// A publish validated ahead of the core ([`Validator::judge`]), not yet counted.
#[derive(Debug)]
pub(crate) struct Judged {
    topic: Box<str>,
    len: usize,
    binding: usize,
    outcome: Outcome,
}

impl Judged {
    /// Whether it was made of this topic and a payload this long (the core settles a judgment
    /// only for the publish it was made of).
    pub(crate) fn is_of(&self, topic: &str, payload: &[u8]) -> bool {
        &*self.topic == topic && self.len == payload.len()
    }
}

#[derive(Debug)]
enum Outcome {
    Unstaged,
    Valid(Arc<SchemaRef>),
    Invalid { version: u32, reason: String },
}

/// A staged delivery read back: the version and its writers, each parsed and its id checked.
fn load(path: &Path, subject: &str, file: String) -> Result<Staged, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let doc: Staging = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let parse = |v: Version| -> Result<(u32, Schema, Arc<SchemaRef>, u32), String> {
        if v.subject != subject {
            return Err(format!("{} holds subject {}, not {subject}", path.display(), v.subject));
        }
        let number = v.registry_id();
        let schema = Schema::parse(v.source).map_err(|e| e.to_string())?;
        if !schema.is(&v.id) {
            return Err(format!("{}: the schema's id is {}, the file says {}", path.display(), schema.id(), v.id));
        }
        let tag = Arc::new(SchemaRef { subject: subject.to_owned(), version: v.version, id: v.id });
        Ok((v.version, schema, tag, number))
    };
    let (version, schema, tag, number) = parse(doc.version)?;
    let kind = schema.kind();
    if doc.writers.len() > shared::schema::MAX_WRITERS {
        return Err(format!(
            "{}: {} earlier versions, at most {}",
            path.display(),
            doc.writers.len(),
            shared::schema::MAX_WRITERS
        ));
    }
    let mut writers: Vec<Writer> = Vec::with_capacity(doc.writers.len());
    for w in doc.writers {
        let (v, schema, tag, number) = parse(w)?;
        if v >= writers.last().map_or(version, |w| w.version) {
            return Err(format!("{}: earlier version {v} out of order", path.display()));
        }
        if schema.kind() != kind {
            return Err(format!("{}: version {v} is of another kind", path.display()));
        }
        writers.push(Writer { version: v, schema, tag, number });
    }
    Ok(Staged { version, schema, file, tag, number, writers })
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
}

/// The uplink takes a binary payload apart by the version it was validated against, while that
/// version is the one staged (a message validated before a rollout goes whole).
impl shared::proto::columns::Shapes for Validator {
    fn cut<'p>(&self, schema: &SchemaRef, payload: &'p [u8], out: &mut shared::proto::columns::Shaper<'p>) -> bool {
        let staged = self.staged(&schema.subject);
        let Some(staged) = staged.as_ref() else { return false };
        if staged.schema.kind() == shared::schema::Kind::Json {
            // JSON text is cut by its own shape; what does not cut goes whole, not walked.
            return false;
        }
        // A payload in the Confluent framing validated as what follows it: its head is not
        // the schema's, so it goes whole.
        let framed = shared::schema::confluent_frame(payload)
            .is_some_and(|(n, _)| staged.accepted().any(|(.., number)| number == n));
        let apart = !framed && staged.by_id(&schema.id).is_some_and(|s| s.cut(payload, out));
        let outcome = if apart { "apart" } else { "whole" };
        self.metrics.walked.get_or_create(&CheckLabels { subject: schema.subject.clone(), outcome }).inc();
        apart
    }
}

#[cfg(test)]
#[path = "tests.rs"]
pub(crate) mod tests;
