//! Avro: parsing and canonical form by `apache-avro`; schema resolution by our `compat` (the
//! specification as Java's `SchemaCompatibility` applies it); payload validation by
//! our own walk of the binary encoding.
//!
//! Why not the crate's decoder for validation: it allocates what a length prefix claims before
//! reading the bytes (up to its process-wide limit, 512 MiB by default), and an array block may
//! claim any number of items that take no bytes. A ten-byte PUBLISH could cost seconds or
//! gigabytes. The walk here allocates nothing, checks every length against the bytes left,
//! bounds nesting, and names the field where a payload goes wrong.

use std::collections::HashMap;

use apache_avro::Schema as AvroSchema;
use apache_avro::schema::{Name, UuidSchema};

mod compat;

use super::{Invalid, Problem};
use crate::proto::columns::{Int, Len, Shaper};

/// Deepest nesting a payload may reach (records in records, arrays in arrays, recursive types).
const MAX_DEPTH: usize = 64;

/// Items of a zero-byte type (null, an empty record) one payload may hold beyond one item per
/// byte: such an array could otherwise claim 2^63 items in a few bytes.
const MAX_EMPTY_ITEMS: u64 = 65_536;

pub(super) struct Avro {
    schema: AvroSchema,
    names: HashMap<Name, AvroSchema>,
}

impl Avro {
    pub(super) fn parse(text: &str) -> Result<Self, String> {
        let schema = AvroSchema::parse_str(text).map_err(|e| e.to_string())?;
        let mut names = HashMap::new();
        collect(&schema, &mut names);
        let avro = Avro { schema, names };
        avro.resolves(&avro.schema, &mut Vec::new())?;
        Ok(avro)
    }

    /// Every reference names a type the schema defines (the crate checks this too; the walk
    /// relies on it).
    fn resolves(&self, s: &AvroSchema, seen: &mut Vec<Name>) -> Result<(), String> {
        match s {
            AvroSchema::Ref { name } if !self.names.contains_key(name) => {
                return Err(format!("{name} is referenced but not defined"));
            }
            AvroSchema::Record(r) => {
                if seen.contains(&r.name) {
                    return Ok(());
                }
                seen.push(r.name.clone());
                for f in &r.fields {
                    self.resolves(&f.schema, seen)?;
                }
            }
            AvroSchema::Array(a) => self.resolves(&a.items, seen)?,
            AvroSchema::Map(m) => self.resolves(&m.types, seen)?,
            AvroSchema::Union(u) => {
                for v in u.variants() {
                    self.resolves(v, seen)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// What identifies the schema: its JSON with keys sorted, no spaces and no `doc`. Not the
    /// Parsing Canonical Form alone, which drops what changes how data is read: two schemas
    /// differing in a field's default (or an alias, a logical type, a sort order) are two
    /// schemas, as Confluent Schema Registry keeps them (issue 45).
    pub(super) fn normal(text: &str) -> String {
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap_or(serde_json::Value::String(text.into()));
        strip_docs(&mut v);
        let mut out = String::new();
        super::json::canonical(&v, &mut out);
        out
    }

    /// The Parsing Canonical Form of the Avro specification: what ids were derived from before
    /// identity took defaults in (`Schema::legacy_id`).
    pub(super) fn canonical_form(&self) -> String {
        self.schema.canonical_form()
    }

    pub(super) fn validate(&self, payload: &[u8]) -> Result<(), Invalid> {
        self.walk(payload, None)
    }

    /// The same walk, telling `out` each value and the structure around it.
    pub(super) fn cut<'p>(&self, payload: &'p [u8], out: &mut Shaper<'p>) -> bool {
        self.walk(payload, Some(out)).is_ok()
    }

    fn walk<'p>(&self, payload: &'p [u8], out: Option<&mut Shaper<'p>>) -> Result<(), Invalid> {
        let mut w = Walk { rest: payload, items: payload.len() as u64 + MAX_EMPTY_ITEMS, names: &self.names, out };
        let mut path = String::new();
        w.value(&self.schema, &mut path, 0).map_err(|reason| Invalid { path: path.clone(), reason })?;
        if !w.rest.is_empty() {
            return Err(Invalid {
                path: String::new(),
                reason: format!("{} bytes after the datum (a payload is one datum)", w.rest.len()),
            });
        }
        Ok(())
    }

    /// Every reason `self` (the reader) cannot read what `writer` writes (`compat`).
    pub(super) fn reads(&self, writer: &Avro) -> Vec<Problem> {
        compat::reads(self, writer)
    }
}

fn collect(s: &AvroSchema, names: &mut HashMap<Name, AvroSchema>) {
    if let Some(n) = s.name()
        && !matches!(s, AvroSchema::Ref { .. })
    {
        names.insert(n.clone(), s.clone());
    }
    match s {
        AvroSchema::Record(r) => r.fields.iter().for_each(|f| collect(&f.schema, names)),
        AvroSchema::Array(a) => collect(&a.items, names),
        AvroSchema::Map(m) => collect(&m.types, names),
        AvroSchema::Union(u) => u.variants().iter().for_each(|v| collect(v, names)),
        _ => {}
    }
}

struct Walk<'a, 'w> {
    rest: &'a [u8],
    /// Array and map items the payload may still hold: every item but a zero-byte one takes a
    /// byte, so a valid payload never runs out; a lying block count does, before its items
    /// are walked.
    items: u64,
    names: &'w HashMap<Name, AvroSchema>,
    /// Where a cut goes (`Avro::cut`); none when only validating.
    out: Option<&'w mut Shaper<'a>>,
}

impl<'a> Walk<'a, '_> {
    fn emit(&mut self, f: impl FnOnce(&mut Shaper<'a>)) {
        if let Some(out) = self.out.as_deref_mut() {
            f(out);
        }
    }

    /// A zig-zag varint kept in the shape as it is (a union branch, a block count).
    fn structure(&mut self, what: &str) -> Result<i64, String> {
        let before = self.rest;
        let v = self.int(what)?;
        let raw = &before[..before.len() - self.rest.len()];
        self.emit(|s| s.lit(raw));
        Ok(v)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.rest.len() < n {
            return Err(format!("{what} needs {n} bytes, {} left", self.rest.len()));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    /// A zig-zag varint of at most `max_bytes` (5 for int, 10 for long).
    fn varint(&mut self, max_bytes: usize, what: &str) -> Result<i64, String> {
        let mut v: u64 = 0;
        for i in 0..max_bytes {
            let Some((&b, tail)) = self.rest.split_first() else {
                return Err(format!("{what} ends early"));
            };
            self.rest = tail;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok((v >> 1) as i64 ^ -((v & 1) as i64));
            }
        }
        Err(format!("{what} is longer than {max_bytes} bytes"))
    }

    fn int(&mut self, what: &str) -> Result<i64, String> {
        self.varint(10, what)
    }

    fn fixed(&mut self, n: usize, what: &str) -> Result<(), String> {
        let b = self.take(n, what)?;
        self.emit(|s| s.bytes(b, Len::Fixed));
        Ok(())
    }

    fn len(&mut self, what: &str) -> Result<usize, String> {
        let n = self.int(what)?;
        usize::try_from(n).map_err(|_| format!("{what} has a negative length {n}"))
    }

    fn value(&mut self, s: &AvroSchema, path: &mut String, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH}"));
        }
        match s {
            AvroSchema::Null => Ok(()),
            AvroSchema::Boolean => match self.take(1, "a boolean")?[0] {
                b @ (0 | 1) => {
                    self.emit(|s| s.int(i64::from(b), Int::Varint));
                    Ok(())
                }
                b => Err(format!("a boolean is 0 or 1, not {b}")),
            },
            AvroSchema::Int | AvroSchema::Date | AvroSchema::TimeMillis => {
                let v = self.varint(5, "an int")?;
                self.emit(|s| s.int(v, Int::Zigzag));
                i32::try_from(v).map(|_| ()).map_err(|_| format!("{v} does not fit an int"))
            }
            AvroSchema::Long
            | AvroSchema::TimeMicros
            | AvroSchema::TimestampMillis
            | AvroSchema::TimestampMicros
            | AvroSchema::TimestampNanos
            | AvroSchema::LocalTimestampMillis
            | AvroSchema::LocalTimestampMicros
            | AvroSchema::LocalTimestampNanos => {
                let v = self.varint(10, "a long")?;
                self.emit(|s| s.int(v, Int::Zigzag));
                Ok(())
            }
            AvroSchema::Float => {
                let b = self.take(4, "a float")?;
                self.emit(|s| s.f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
                Ok(())
            }
            AvroSchema::Double => {
                let b = self.take(8, "a double")?;
                self.emit(|s| s.f64(f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])));
                Ok(())
            }
            AvroSchema::Bytes | AvroSchema::BigDecimal | AvroSchema::Uuid(UuidSchema::Bytes) => {
                let n = self.len("bytes")?;
                let b = self.take(n, "bytes")?;
                self.emit(|s| s.bytes(b, Len::Zigzag));
                Ok(())
            }
            AvroSchema::String | AvroSchema::Uuid(UuidSchema::String) => {
                let n = self.len("a string")?;
                let bytes = self.take(n, "a string")?;
                self.emit(|s| s.bytes(bytes, Len::Zigzag));
                std::str::from_utf8(bytes).map(|_| ()).map_err(|e| format!("a string that is not UTF-8: {e}"))
            }
            AvroSchema::Fixed(f) | AvroSchema::Duration(f) | AvroSchema::Uuid(UuidSchema::Fixed(f)) => {
                self.fixed(f.size, "a fixed")
            }
            AvroSchema::Decimal(d) => match &d.inner {
                apache_avro::schema::InnerDecimalSchema::Bytes => self.value(&AvroSchema::Bytes, path, depth),
                apache_avro::schema::InnerDecimalSchema::Fixed(f) => self.fixed(f.size, "a decimal"),
            },
            AvroSchema::Enum(e) => {
                let i = self.int("an enum index")?;
                self.emit(|s| s.int(i, Int::Zigzag));
                if i < 0 || i as u64 >= e.symbols.len() as u64 {
                    return Err(format!("enum index {i}, {} has {} symbols", e.name, e.symbols.len()));
                }
                Ok(())
            }
            AvroSchema::Union(u) => {
                let i = self.structure("a union index")?;
                let variants = u.variants();
                match usize::try_from(i).ok().and_then(|i| variants.get(i)) {
                    Some(v) => self.value(v, path, depth + 1),
                    None => Err(format!("union index {i}, the union has {} branches", variants.len())),
                }
            }
            AvroSchema::Record(r) => {
                for f in &r.fields {
                    let len = path.len();
                    path.push('/');
                    path.push_str(&f.name);
                    self.value(&f.schema, path, depth + 1)?;
                    path.truncate(len);
                }
                Ok(())
            }
            AvroSchema::Array(a) => self.blocks(&a.items, false, path, depth),
            AvroSchema::Map(m) => self.blocks(&m.types, true, path, depth),
            AvroSchema::Ref { name } => match self.names.get(name) {
                Some(s) => self.value(s, path, depth + 1),
                None => Err(format!("{name} is not defined")),
            },
        }
    }

    /// Array or map blocks: a count (negative: followed by the block's byte size), items, and
    /// a zero count at the end.
    fn blocks(&mut self, item: &AvroSchema, map: bool, path: &mut String, depth: usize) -> Result<(), String> {
        let mut index = 0u64;
        loop {
            let mut count = self.structure("a block count")?;
            if count == 0 {
                return Ok(());
            }
            if count < 0 {
                // The byte size that follows changes with the values: no shape holds it.
                self.emit(Shaper::fail);
                count = count.checked_neg().ok_or("a block count out of range")?;
                let size = self.len("a block size")?;
                if size > self.rest.len() {
                    return Err(format!("a block of {size} bytes, {} left", self.rest.len()));
                }
            }
            let count = count as u64;
            self.items = self
                .items
                .checked_sub(count)
                .ok_or_else(|| format!("{count} items claimed, more than {} bytes can hold", self.rest.len()))?;
            for _ in 0..count {
                let len = path.len();
                if map {
                    let n = self.len("a map key")?;
                    let key = self.take(n, "a map key")?;
                    self.emit(|s| s.bytes(key, Len::Zigzag));
                    let key = String::from_utf8_lossy(key).into_owned();
                    path.push('/');
                    path.push_str(&key);
                } else {
                    path.push_str(&format!("/{index}"));
                }
                self.value(item, path, depth + 1)?;
                path.truncate(len);
                index += 1;
            }
        }
    }
}

/// Removes every `doc` attribute: documentation does not change what data means.
fn strip_docs(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.remove("doc");
            m.values_mut().for_each(strip_docs);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_docs),
        _ => {}
    }
}
