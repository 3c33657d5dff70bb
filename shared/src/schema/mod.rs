//! Schemas for message payloads: parsing, validation of one payload, and the compatibility of
//! one version with the ones before it. Three kinds, each on a maintained crate:
//!
//! - `json`: JSON Schema (draft 2020-12 unless `$schema` says otherwise; `jsonschema`), with
//!   linear-time regexes and no remote or file references; the compatibility rules are ours
//!   (`json`), after Confluent's published list for JSON Schema, over the keywords that constrain
//!   data shapes; any other keyword that differs between two versions is reported, never assumed
//!   harmless;
//! - `avro`: an Avro schema (`apache-avro`); a payload is one binary-encoded datum, all of its
//!   bytes; compatibility is the Avro specification's schema resolution as Java's
//!   `SchemaCompatibility` (Confluent's) applies it, naming the field (`avro::compat`);
//! - `protobuf`: a `.proto` file and the message a payload holds (`protox` compiles it, no
//!   `protoc`); payloads checked by our walk of the wire format; compatibility is wire
//!   compatibility (ours, `proto`).
//!
//! A schema's id is derived from its content (kind, message and the normalised text), so the
//! same schema registered twice has one id, on every machine.
//!
//! One payload must never cost more than its size: schemas whose validation could loop or
//! recurse without bound on a small payload are refused when parsed (an Avro array of
//! zero-byte items, a recursive Avro type).

mod avro;
mod json;
mod proto;
#[cfg(test)]
mod shape_tests;
#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a schema describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Json,
    Avro,
    Protobuf,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Json => "json",
            Kind::Avro => "avro",
            Kind::Protobuf => "protobuf",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "json" => Ok(Kind::Json),
            "avro" => Ok(Kind::Avro),
            "protobuf" | "proto" => Ok(Kind::Protobuf),
            _ => Err(format!("schema kind {s:?}: use json, avro or protobuf")),
        }
    }
}

/// Which earlier versions a new version must be compatible with, and how. `backward`: the new
/// version reads everything the previous one accepted (consumers upgrade first); `forward`:
/// the previous version reads everything the new one accepts (producers upgrade first);
/// `full`: both. The transitive modes check every earlier version, not only the latest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Compatibility {
    None,
    #[default]
    Backward,
    BackwardTransitive,
    Forward,
    ForwardTransitive,
    Full,
    FullTransitive,
}

impl Compatibility {
    pub(crate) const ALL: [Compatibility; 7] = [
        Compatibility::None,
        Compatibility::Backward,
        Compatibility::BackwardTransitive,
        Compatibility::Forward,
        Compatibility::ForwardTransitive,
        Compatibility::Full,
        Compatibility::FullTransitive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Compatibility::None => "none",
            Compatibility::Backward => "backward",
            Compatibility::BackwardTransitive => "backward-transitive",
            Compatibility::Forward => "forward",
            Compatibility::ForwardTransitive => "forward-transitive",
            Compatibility::Full => "full",
            Compatibility::FullTransitive => "full-transitive",
        }
    }

    /// Earlier versions a producer may still write once a version checked under `self` is the
    /// newest, as indexes into the `earlier` versions before it (oldest first), newest first:
    /// those the check proved the new version reads. `backward` and `full` checked the one
    /// before, their transitive forms every one (at most [`MAX_WRITERS`] of them, the newest);
    /// `none` and the forward modes proved nothing of the kind, so only the new version is
    /// written. A consumer on the newest version reads what any of these producers writes.
    pub fn still_written(self, earlier: usize) -> std::iter::Take<std::iter::Rev<std::ops::Range<usize>>> {
        let reach = match self.directions() {
            (false, _) => 0,
            (true, _) if self.transitive() => earlier,
            (true, _) => earlier.min(1),
        };
        (0..earlier).rev().take(reach.min(MAX_WRITERS))
    }

    /// The same directions, checked against one version only.
    pub fn one_version(self) -> Compatibility {
        match self {
            Compatibility::BackwardTransitive => Compatibility::Backward,
            Compatibility::ForwardTransitive => Compatibility::Forward,
            Compatibility::FullTransitive => Compatibility::Full,
            other => other,
        }
    }

    fn transitive(self) -> bool {
        matches!(
            self,
            Compatibility::BackwardTransitive | Compatibility::ForwardTransitive | Compatibility::FullTransitive
        )
    }

    /// (the new version must read the old, the old must read the new)
    fn directions(self) -> (bool, bool) {
        match self {
            Compatibility::None => (false, false),
            Compatibility::Backward | Compatibility::BackwardTransitive => (true, false),
            Compatibility::Forward | Compatibility::ForwardTransitive => (false, true),
            Compatibility::Full | Compatibility::FullTransitive => (true, true),
        }
    }
}

impl fmt::Display for Compatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Compatibility {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Compatibility::ALL.into_iter().find(|c| c.name() == s).ok_or_else(|| {
            let names: Vec<_> = Compatibility::ALL.iter().map(|c| c.name()).collect();
            format!("compatibility {s:?}: use one of {}", names.join(", "))
        })
    }
}

/// Earlier versions an edge accepts besides the newest (`Compatibility::still_written`): each is
/// one more validation of a payload none of the newer ones matched, so one publish costs at
/// most this many more walks of its bytes.
pub const MAX_WRITERS: usize = 8;

/// A schema as registered and as edges stage it: what it is parsed from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    pub kind: Kind,
    pub text: String,
    /// Protobuf: the message type a payload holds (`package.Name`); the file's first message
    /// when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The longest schema text taken: schemas travel to every edge and are parsed there.
pub(crate) const MAX_SOURCE_BYTES: usize = 256 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} schema: {reason}")]
pub struct SchemaError {
    pub kind: Kind,
    pub reason: String,
}

/// Why a payload does not match: where (a JSON pointer, or a field path) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub path: String,
    pub reason: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() { f.write_str(&self.reason) } else { write!(f, "{}: {}", self.path, self.reason) }
    }
}

/// One reason a reader cannot read everything a writer accepts: where, and which rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub path: String,
    pub rule: &'static str,
    pub detail: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() { "/" } else { &self.path };
        write!(f, "{path}: {} ({})", self.rule, self.detail)
    }
}

/// A new version refused by a compatibility mode: against which earlier version (its index,
/// oldest first), in which direction, and every problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incompatible {
    pub mode: Compatibility,
    pub against: usize,
    /// "new reads old" or "old reads new".
    pub direction: &'static str,
    pub problems: Vec<Problem>,
}

impl fmt::Display for Incompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not {} compatible with version {} ({}): ", self.mode, self.against + 1, self.direction)?;
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Incompatible {}

enum Compiled {
    Json(json::Json),
    Avro(avro::Avro),
    Protobuf(proto::Proto),
}

/// A parsed schema, ready to validate payloads.
pub struct Schema {
    source: Source,
    id: String,
    /// The id an earlier build derived (Avro: from the Parsing Canonical Form alone), when it
    /// differs: versions registered then keep it.
    legacy_id: Option<String>,
    compiled: Compiled,
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schema").field("kind", &self.source.kind).field("id", &self.id).finish_non_exhaustive()
    }
}

impl Schema {
    pub fn parse(source: Source) -> Result<Self, SchemaError> {
        let kind = source.kind;
        let err = |reason: String| SchemaError { kind, reason };
        if source.text.len() > MAX_SOURCE_BYTES {
            return Err(err(format!("{} bytes, at most {MAX_SOURCE_BYTES} are taken", source.text.len())));
        }
        if source.message.is_some() && kind != Kind::Protobuf {
            return Err(err("a message type is given only for protobuf".into()));
        }
        let (compiled, normal) = match kind {
            Kind::Json => {
                let j = json::Json::parse(&source.text).map_err(err)?;
                let normal = j.normal();
                (Compiled::Json(j), normal)
            }
            Kind::Avro => {
                let a = avro::Avro::parse(&source.text).map_err(err)?;
                (Compiled::Avro(a), avro::Avro::normal(&source.text))
            }
            Kind::Protobuf => {
                let p = proto::Proto::parse(&source.text, source.message.as_deref()).map_err(err)?;
                let normal = format!("{}\n{}", p.message_name(), source.text);
                (Compiled::Protobuf(p), normal)
            }
        };
        let id = content_id(kind, &normal);
        let legacy_id = match &compiled {
            Compiled::Avro(a) => Some(content_id(kind, &a.canonical_form())).filter(|l| *l != id),
            _ => None,
        };
        Ok(Schema { source, id, legacy_id, compiled })
    }

    /// Derived from the content: 16 hex digits of SHA-256 over the kind and the normalised
    /// schema (JSON with sorted keys and no spaces; Avro's likewise, without `doc`; Protobuf's
    /// message name and file text).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether `id` is this schema's: its id, or the one earlier builds derived for it
    /// (Avro's Parsing Canonical Form), which versions registered then keep.
    pub fn is(&self, id: &str) -> bool {
        self.id == id || self.legacy_id.as_deref() == Some(id)
    }

    pub fn kind(&self) -> Kind {
        self.source.kind
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Whether `payload` matches, and if not, where and why.
    pub fn validate(&self, payload: &[u8]) -> Result<(), Invalid> {
        match &self.compiled {
            Compiled::Json(j) => j.validate(payload),
            Compiled::Avro(a) => a.validate(payload),
            Compiled::Protobuf(p) => p.validate(payload),
        }
    }

    /// What follows the Confluent framing's id ([`confluent_frame`]) as this schema's payload:
    /// for Protobuf the message indexes come first (a zigzag varint count, then each index;
    /// a lone 0 for the file's first message), which must name this schema's message (any of
    /// the file's where no message was named: Confluent's subjects are files).
    pub fn unframe<'p>(&self, body: &'p [u8]) -> Result<&'p [u8], Invalid> {
        match &self.compiled {
            Compiled::Protobuf(p) => p.unframe(body).map(|(payload, _)| payload),
            _ => Ok(body),
        }
    }

    /// Whether what follows a Confluent framing's id matches: for Protobuf as the message its
    /// indexes name.
    pub fn validate_framed(&self, body: &[u8]) -> Result<(), Invalid> {
        match &self.compiled {
            Compiled::Protobuf(p) => p.validate_framed(body),
            _ => self.validate(body),
        }
    }

    /// What Confluent's serializers write before a payload of this schema registered as
    /// `registry_id`: magic byte 0, the id (4 bytes, big-endian), and for Protobuf the message
    /// indexes (zigzag varints: a count, then each; `[0]` as a lone 0).
    pub fn confluent_prefix(&self, registry_id: u32) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&registry_id.to_be_bytes());
        if let Compiled::Protobuf(p) = &self.compiled {
            let zigzag = |v: i64| ((v << 1) ^ (v >> 63)) as u64;
            match p.indexes().as_slice() {
                [0] => out.push(0),
                indexes => {
                    crate::proto::varint::put(&mut out, zigzag(indexes.len() as i64));
                    for i in indexes {
                        crate::proto::varint::put(&mut out, zigzag(*i));
                    }
                }
            }
        }
        out
    }

    /// The schema as Confluent's `format=serialized` gives it: for Protobuf the file's
    /// `FileDescriptorProto`, base64-encoded; none for the other kinds (their text is it).
    pub fn serialized(&self) -> Option<String> {
        match &self.compiled {
            Compiled::Protobuf(p) => Some(p.serialized()),
            _ => None,
        }
    }

    /// Tells `out` the shape and values of `payload`, which this schema validated (format 3
    /// column-wise bodies); false for JSON (its text is cut without a schema) and for a
    /// payload the walk cannot hold.
    pub fn cut<'p>(&self, payload: &'p [u8], out: &mut crate::proto::columns::Shaper<'p>) -> bool {
        match &self.compiled {
            Compiled::Json(_) => false,
            Compiled::Avro(a) => a.cut(payload, out),
            Compiled::Protobuf(p) => p.cut(payload, out),
        }
    }

    /// Every reason `self` (the reader) could not read a payload `writer` accepts; empty when
    /// it reads them all. Schemas of different kinds never read each other.
    pub(crate) fn reads(&self, writer: &Schema) -> Vec<Problem> {
        match (&self.compiled, &writer.compiled) {
            (Compiled::Json(r), Compiled::Json(w)) => r.reads(w),
            (Compiled::Avro(r), Compiled::Avro(w)) => r.reads(w),
            (Compiled::Protobuf(r), Compiled::Protobuf(w)) => r.reads(w),
            _ => vec![Problem {
                path: String::new(),
                rule: "kind changed",
                detail: format!("{} after {}", self.kind(), writer.kind()),
            }],
        }
    }
}

/// Checks `new` against the earlier versions of its subject (oldest first) under `mode`.
pub fn check(mode: Compatibility, new: &Schema, earlier: &[Schema]) -> Result<(), Incompatible> {
    let (new_reads_old, old_reads_new) = mode.directions();
    let against: Vec<usize> = match (mode.transitive(), earlier.len()) {
        (_, 0) => vec![],
        (true, n) => (0..n).rev().collect(),
        (false, n) => vec![n - 1],
    };
    for i in against {
        let old = &earlier[i];
        if new_reads_old {
            let problems = new.reads(old);
            if !problems.is_empty() {
                return Err(Incompatible { mode, against: i, direction: "new reads old", problems });
            }
        }
        if old_reads_new {
            let problems = old.reads(new);
            if !problems.is_empty() {
                return Err(Incompatible { mode, against: i, direction: "old reads new", problems });
            }
        }
    }
    Ok(())
}

fn content_id(kind: Kind, normal: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(kind.name().as_bytes());
    ctx.update(b"\0");
    ctx.update(normal.as_bytes());
    crate::model::hex(&ctx.finish().as_ref()[..8])
}

fn problem(path: &str, rule: &'static str, detail: impl Into<String>) -> Problem {
    Problem { path: path.to_owned(), rule, detail: detail.into() }
}

/// One registered version, as the registry keeps it and as edges stage it (the file of the
/// signed model version `schema.<subject>` / `<version>`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    pub subject: String,
    pub version: u32,
    pub id: String,
    pub source: Source,
    /// When it was registered, ms since the Unix epoch.
    pub created_ms: u64,
    /// The mode its registration was checked under (none: registered before the mode was kept,
    /// treated as proving nothing about earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compatibility: Option<Compatibility>,
}

impl Version {
    /// The id Schema Registry clients know it by ([`registry_id`]).
    pub fn registry_id(&self) -> u32 {
        registry_id(&self.id)
    }
}

/// A version as delivered to edges (the file of model `schema.<subject>` / `<version>`): the
/// version, and the earlier ones producers may still write beside it
/// ([`Compatibility::still_written`] of the mode it was checked under), newest first. Each
/// delivery carries its writers, so an edge that missed versions needs only the newest, and an
/// edge that stages it needs nothing else. Edges before this field read the version alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staging {
    #[serde(flatten)]
    pub version: Version,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writers: Vec<Version>,
}

/// The 31-bit number Schema Registry clients name a schema by, derived from its content id
/// (the first 32 bits of the hex id, top bit cleared; 0 is taken as 1, which clients treat as
/// no id): the same schema has the same number on every bridge and in every sink, with no
/// counter to share. Two schemas whose numbers collide cannot both be registered (the
/// registry refuses the second, naming the first); at 1,000 schemas the chance of any
/// collision is about 1 in 4,000.
pub fn registry_id(content_id: &str) -> u32 {
    let head = content_id.get(..8).and_then(|h| u32::from_str_radix(h, 16).ok()).unwrap_or(0);
    (head & 0x7fff_ffff).max(1)
}

/// The Confluent wire framing Schema Registry serializers write before a payload: magic byte 0,
/// then the schema's id as 4 bytes big-endian. Returns the id and what follows (for Protobuf
/// still the message indexes, [`Schema::unframe`]).
pub fn confluent_frame(payload: &[u8]) -> Option<(u32, &[u8])> {
    match payload {
        [0, a, b, c, d, rest @ ..] => Some((u32::from_be_bytes([*a, *b, *c, *d]), rest)),
        _ => None,
    }
}
