//! Protobuf: `protox` compiles the `.proto` text (its own imports of Google's well-known types
//! resolve from protox's copies; no other import), `prost-reflect` describes the messages; a
//! payload is checked by our own walk of the wire format, which names the field.
//!
//! A schema may also be given as Confluent's serializers register it: a `FileDescriptorProto`,
//! base64-encoded (their `format=serialized`); it is compiled as the file it describes.
//!
//! Compatibility (`compat`) follows Confluent Schema Registry's Protobuf rules, by field number.

use prost_reflect::{FieldDescriptor, Kind as FieldKind, MessageDescriptor};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

mod compat;

use super::{Invalid, Problem};
use crate::proto::columns::{Int, Len, Shaper};
use crate::proto::varint;

/// The name the schema's own file has while compiling.
const FILE: &str = "schema.proto";

pub(super) struct Proto {
    pub(super) message: MessageDescriptor,
    /// The subject is the whole file (no message named): a Confluent framing may name any of
    /// its messages, as Schema Registry's serializers take a file's.
    whole_file: bool,
}

/// The schema's own file, by the name it is compiled under.
struct One(File);

impl FileResolver for One {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        if name == self.0.name() { Ok(self.0.clone()) } else { Err(protox::Error::file_not_found(name)) }
    }
}

/// A `FileDescriptorProto` as Confluent's serializers send it: base64 of its bytes (no
/// whitespace, which `.proto` text always has between its declarations).
fn descriptor(text: &str) -> Option<File> {
    use base64::Engine as _;
    use prost_reflect::prost::Message as _;
    let text = text.trim();
    if text.is_empty() || text.contains(char::is_whitespace) {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).ok()?;
    let file = prost_reflect::prost_types::FileDescriptorProto::decode(bytes.as_slice()).ok()?;
    file.name.as_deref().is_some_and(|n| !n.is_empty()).then(|| File::from_file_descriptor_proto(file))
}

impl Proto {
    pub(super) fn parse(text: &str, message: Option<&str>) -> Result<Self, String> {
        let file = match descriptor(text) {
            Some(file) => file,
            None => File::from_source(FILE, text).map_err(|e| e.to_string())?,
        };
        let name = file.name().to_owned();
        let mut chain = ChainFileResolver::new();
        chain.add(One(file));
        chain.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(chain);
        compiler.open_file(&name).map_err(|e| e.to_string())?;
        let pool = compiler.descriptor_pool();
        let whole_file = message.is_none();
        let message = match message {
            Some(name) => pool.get_message_by_name(name).ok_or_else(|| format!("no message {name} in the file"))?,
            None => {
                pool.get_file_by_name(&name).and_then(|f| f.messages().next()).ok_or("the file defines no message")?
            }
        };
        Ok(Proto { message, whole_file })
    }

    pub(super) fn message_name(&self) -> &str {
        self.message.full_name()
    }

    /// Our own walk of the wire format, which names the field where a payload goes wrong
    /// (prost's decoder says "invalid string value" or "buffer underflow", not where) and,
    /// as Protobuf's reference parsers do, keeps a known field sent with another wire type as
    /// an unknown field instead of refusing the message.
    pub(super) fn validate(&self, payload: &[u8]) -> Result<(), Invalid> {
        check(&self.message, payload, &At::ROOT, 0)
    }

    /// The file as a `FileDescriptorProto`, base64-encoded (Confluent's `format=serialized`).
    pub(super) fn serialized(&self) -> String {
        use base64::Engine as _;
        use prost_reflect::prost::Message as _;
        let file = self.message.parent_file().file_descriptor_proto().encode_to_vec();
        base64::engine::general_purpose::STANDARD.encode(file)
    }

    /// Confluent's message indexes of this schema's message: its place among the file's
    /// messages, then among each parent's nested ones, outermost first.
    pub(super) fn indexes(&self) -> Vec<i64> {
        let mut out = Vec::new();
        let mut at = self.message.clone();
        loop {
            let full = at.full_name().to_owned();
            match at.parent_message() {
                Some(parent) => {
                    out.push(parent.child_messages().position(|m| m.full_name() == full).unwrap_or(0) as i64);
                    at = parent;
                }
                None => {
                    let file = at.parent_file();
                    out.push(file.messages().position(|m| m.full_name() == full).unwrap_or(0) as i64);
                    break;
                }
            }
        }
        out.reverse();
        out
    }

    /// A payload in the Confluent framing (what follows the id): checked as the message its
    /// indexes name ([`Self::unframe`]).
    pub(super) fn validate_framed(&self, body: &[u8]) -> Result<(), Invalid> {
        let (payload, message) = self.unframe(body)?;
        check(&message, payload, &At::ROOT, 0)
    }

    /// Confluent's message indexes taken off the front of `body` (see `Schema::unframe`): they
    /// lead through the file's messages and their nested ones to this schema's message, or,
    /// where the subject is the whole file, to any of its messages. Returns the payload and
    /// that message.
    pub(super) fn unframe<'p>(&self, mut body: &'p [u8]) -> Result<(&'p [u8], MessageDescriptor), Invalid> {
        let bad = |reason: String| Invalid { path: String::new(), reason };
        let zigzag = |b: &mut &[u8]| -> Result<i64, Invalid> {
            let v = varint::take(b).map_err(|_| bad("Confluent framing: the message indexes are cut short".into()))?;
            Ok((v >> 1) as i64 ^ -((v & 1) as i64))
        };
        let count = zigzag(&mut body)?;
        // More indexes than a file can nest messages is not a framing but garbage.
        if !(0..=MAX_CUT_DEPTH as i64).contains(&count) {
            return Err(bad(format!("Confluent framing: {count} message indexes")));
        }
        let mut indexes = Vec::with_capacity(count.max(1) as usize);
        for _ in 0..count {
            indexes.push(zigzag(&mut body)?);
        }
        if indexes.is_empty() {
            indexes.push(0);
        }
        let file = self.message.parent_file();
        let mut at: Option<MessageDescriptor> = None;
        for &i in &indexes {
            let next = usize::try_from(i).ok().and_then(|i| match &at {
                None => file.messages().nth(i),
                Some(m) => m.child_messages().nth(i),
            });
            at = Some(
                next.ok_or_else(|| bad(format!("Confluent framing: message indexes {indexes:?} name no message")))?,
            );
        }
        let Some(named) = at else { return Err(bad("Confluent framing names no message".into())) };
        if !self.whole_file && named.full_name() != self.message.full_name() {
            return Err(bad(format!(
                "Confluent framing names message {}, the subject's is {}",
                named.full_name(),
                self.message.full_name()
            )));
        }
        Ok((body, named))
    }

    /// The payload's fields as a shape and values (format 3 bodies): each field's tag kept as
    /// it is, sub-messages and packed fields as parts whose length the bridge writes back.
    pub(super) fn cut<'p>(&self, payload: &'p [u8], out: &mut Shaper<'p>) -> bool {
        cut(&self.message, payload, out, 0).is_some()
    }

    /// Every reason `self` (the reader) cannot read what `writer` writes (`compat`).
    pub(super) fn reads(&self, writer: &Proto) -> Vec<Problem> {
        compat::reads(&self.message, &writer.message)
    }
}

/// Sub-messages a cut walks into; a payload nested deeper travels whole.
const MAX_CUT_DEPTH: usize = 32;

fn take<'p>(b: &mut &'p [u8], n: usize) -> Option<&'p [u8]> {
    let head = b.get(..n)?;
    *b = &b[n..];
    Some(head)
}

fn le<const N: usize>(b: &mut &[u8]) -> Option<[u8; N]> {
    take(b, N)?.try_into().ok()
}

/// One field's value of wire type `wire` as a `kind` field (or an unknown one) holds it.
fn value<'p>(kind: Option<&FieldKind>, wire: u64, b: &mut &'p [u8], out: &mut Shaper<'p>, depth: usize) -> Option<()> {
    match (wire, kind) {
        (0, Some(FieldKind::Sint32 | FieldKind::Sint64)) => {
            let v = varint::take(b).ok()?;
            out.int((v >> 1) as i64 ^ -((v & 1) as i64), Int::Zigzag);
        }
        (0, _) => out.int(varint::take(b).ok()? as i64, Int::Varint),
        (1, Some(FieldKind::Double)) => out.f64(f64::from_le_bytes(le(b)?)),
        (1, _) => out.int(i64::from_le_bytes(le(b)?), Int::Fixed64),
        (5, Some(FieldKind::Float)) => out.f32(f32::from_le_bytes(le(b)?)),
        (5, _) => out.int(i64::from(u32::from_le_bytes(le(b)?)), Int::Fixed32),
        (2, _) => {
            let n = usize::try_from(varint::take(b).ok()?).ok()?;
            let body = take(b, n)?;
            match kind {
                Some(FieldKind::Message(m)) => {
                    out.open();
                    cut(m, body, out, depth + 1)?;
                    out.close();
                }
                // A packed repeated field: values of the field's own wire type, one after another.
                Some(k) if packed_wire(k).is_some() => {
                    let w = packed_wire(k)?;
                    out.open();
                    let mut rest = body;
                    while !rest.is_empty() {
                        value(Some(k), w, &mut rest, out, depth)?;
                    }
                    out.close();
                }
                _ => out.bytes(body, Len::Varint),
            }
        }
        // Groups (3, 4) are deprecated and have no length: the payload travels whole.
        _ => return None,
    }
    Some(())
}

/// The wire type a packed field of `k` holds its values in; none for a kind never packed.
fn packed_wire(k: &FieldKind) -> Option<u64> {
    match k {
        FieldKind::Double | FieldKind::Fixed64 | FieldKind::Sfixed64 => Some(1),
        FieldKind::Float | FieldKind::Fixed32 | FieldKind::Sfixed32 => Some(5),
        FieldKind::String | FieldKind::Bytes | FieldKind::Message(_) => None,
        _ => Some(0),
    }
}

fn cut<'p>(desc: &MessageDescriptor, mut b: &'p [u8], out: &mut Shaper<'p>, depth: usize) -> Option<()> {
    if depth > MAX_CUT_DEPTH {
        return None;
    }
    while !b.is_empty() {
        let before = b;
        let key = varint::take(&mut b).ok()?;
        out.lit(&before[..before.len() - b.len()]);
        let field = u32::try_from(key >> 3).ok().and_then(|n| desc.get_field(n));
        value(field.map(|f| f.kind()).as_ref(), key & 7, &mut b, out, depth)?;
    }
    Some(())
}

/// Deepest nesting of sub-messages and groups a payload may reach (prost's own limit is 100).
pub(crate) const MAX_DEPTH: usize = 100;

/// The largest field number the language allows (2^29 - 1).
const MAX_FIELD: u64 = 536_870_911;

/// Where a walk is: a field under its parent, rendered (`/boxes/1/label`) only for a refusal, so
/// a valid payload's walk allocates nothing for its path.
struct At<'a> {
    up: Option<&'a At<'a>>,
    name: &'a str,
    /// A repeated field's value, numbered.
    index: Option<usize>,
}

impl At<'_> {
    const ROOT: At<'static> = At { up: None, name: "", index: None };

    fn render(&self) -> String {
        let mut out = self.up.map(At::render).unwrap_or_default();
        if self.up.is_some() {
            out.push('/');
            out.push_str(self.name);
        }
        if let Some(i) = self.index {
            out.push_str(&format!("/{i}"));
        }
        out
    }
}

fn invalid(path: &At<'_>, reason: impl Into<String>) -> Invalid {
    Invalid { path: path.render(), reason: reason.into() }
}

/// Whether a known field `f` is sent as the wire type its declaration writes (or, repeated and
/// packable, packed).
fn fits(f: &FieldDescriptor, wire: u64) -> bool {
    let kind = f.kind();
    match packed_wire(&kind) {
        _ if f.is_group() => wire == 3,
        Some(w) => wire == w || (wire == 2 && f.is_list()),
        None => wire == 2,
    }
}

/// `n` bytes off the front of `b`, or why not, at `path`.
fn bytes<'p>(b: &mut &'p [u8], n: usize, path: &At<'_>, what: &str) -> Result<&'p [u8], Invalid> {
    let left = b.len();
    take(b, n).ok_or_else(|| invalid(path, format!("{what} of {n} bytes runs past the end ({left} left)")))
}

fn varint_at(b: &mut &[u8], path: &At<'_>) -> Result<u64, Invalid> {
    varint::take(b)
        .map_err(|short| invalid(path, if short { "a varint is cut short" } else { "a varint runs past ten bytes" }))
}

/// A value of wire type `wire` skipped (an unknown field), its bytes checked to be there.
fn skip(wire: u64, number: u64, b: &mut &[u8], path: &At<'_>, depth: usize) -> Result<(), Invalid> {
    match wire {
        0 => varint_at(b, path).map(|_| ()),
        1 => bytes(b, 8, path, "a fixed64").map(|_| ()),
        5 => bytes(b, 4, path, "a fixed32").map(|_| ()),
        2 => {
            let n = usize::try_from(varint_at(b, path)?).unwrap_or(usize::MAX);
            bytes(b, n, path, "a length-delimited value").map(|_| ())
        }
        3 => in_group(None, number, b, path, depth + 1),
        4 => Err(invalid(path, format!("an end of group {number} that no group opened"))),
        w => Err(invalid(path, format!("field {number} has wire type {w}, which does not exist"))),
    }
}

/// A group's fields up to its end tag (`desc`: its message when the group is a known field).
fn in_group(
    desc: Option<&MessageDescriptor>,
    number: u64,
    b: &mut &[u8],
    path: &At<'_>,
    depth: usize,
) -> Result<(), Invalid> {
    if depth > MAX_DEPTH {
        return Err(invalid(path, format!("nested deeper than {MAX_DEPTH}")));
    }
    loop {
        if b.is_empty() {
            return Err(invalid(path, format!("group {number} has no end")));
        }
        let key = varint_at(b, path)?;
        if key & 7 == 4 {
            return if key >> 3 == number {
                Ok(())
            } else {
                Err(invalid(path, format!("group {number} ended by the end of group {}", key >> 3)))
            };
        }
        field(desc, key, b, path, depth, &mut Vec::new())?;
    }
}

/// One field after its tag `key`: checked as its declaration says, or skipped as unknown.
fn field(
    desc: Option<&MessageDescriptor>,
    key: u64,
    b: &mut &[u8],
    path: &At<'_>,
    depth: usize,
    seen: &mut Vec<(u32, usize)>,
) -> Result<(), Invalid> {
    let (number, wire) = (key >> 3, key & 7);
    if number == 0 || number > MAX_FIELD {
        return Err(invalid(path, format!("field number {number} is out of range")));
    }
    let known = desc.and_then(|d| d.get_field(number as u32)).filter(|f| fits(f, wire));
    let Some(f) = known else { return skip(wire, number, b, path, depth) };
    // A repeated field's values are numbered in the path, as JSON's items are.
    let at = if f.is_list() || f.is_map() {
        let i = match seen.iter_mut().find(|(n, _)| *n == f.number()) {
            Some((_, i)) => {
                *i += 1;
                *i
            }
            None => {
                seen.push((f.number(), 0));
                0
            }
        };
        Some(i)
    } else {
        None
    };
    let at = At { up: Some(path), name: f.name(), index: at };
    let kind = f.kind();
    match (wire, &kind) {
        (3, FieldKind::Message(m)) => in_group(Some(m), number, b, &at, depth + 1),
        (2, FieldKind::String) => {
            let n = usize::try_from(varint_at(b, &at)?).unwrap_or(usize::MAX);
            let body = bytes(b, n, &at, "a string")?;
            std::str::from_utf8(body).map(|_| ()).map_err(|e| invalid(&at, format!("not valid UTF-8: {e}")))
        }
        (2, FieldKind::Message(m)) => {
            let n = usize::try_from(varint_at(b, &at)?).unwrap_or(usize::MAX);
            check(m, bytes(b, n, &at, "a sub-message")?, &at, depth + 1)
        }
        (2, k) if packed_wire(k).is_some() => {
            let n = usize::try_from(varint_at(b, &at)?).unwrap_or(usize::MAX);
            let mut body = bytes(b, n, &at, "packed values")?;
            let w = packed_wire(k).unwrap_or_default();
            while !body.is_empty() {
                skip(w, number, &mut body, &at, depth)?;
            }
            Ok(())
        }
        _ => skip(wire, number, b, &at, depth),
    }
}

/// Checks that `b` is one message of `desc`, naming the field where it is not.
fn check(desc: &MessageDescriptor, mut b: &[u8], path: &At<'_>, depth: usize) -> Result<(), Invalid> {
    if depth > MAX_DEPTH {
        return Err(invalid(path, format!("nested deeper than {MAX_DEPTH}")));
    }
    let mut seen = Vec::new();
    while !b.is_empty() {
        let key = varint_at(&mut b, path)?;
        if key & 7 == 4 {
            return Err(invalid(path, format!("an end of group {} that no group opened", key >> 3)));
        }
        field(Some(desc), key, &mut b, path, depth, &mut seen)?;
    }
    Ok(())
}
