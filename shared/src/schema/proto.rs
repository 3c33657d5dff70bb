//! Protobuf: `protox` compiles the `.proto` text (its own imports of Google's well-known types
//! resolve from protox's copies; no other import), `prost-reflect` decodes a payload as the
//! chosen message (prost's recursion limit bounds nesting).
//!
//! Compatibility is wire compatibility, by field number (names are not on the wire, so a rename
//! is compatible): a field's type may change only within the groups the Protobuf language guide
//! calls compatible (int32, uint32, int64, uint64, bool and enum; sint32 and sint64; fixed32 and
//! sfixed32; fixed64 and sfixed64; a `string` read as `bytes`), a field must stay singular,
//! repeated or a map, and a reader's `required` field must be required in the writer too.
//! Adding and removing fields is compatible (unknown fields are skipped), as enum values are
//! (proto3 enums are open).

use std::collections::HashSet;

use prost_reflect::{Cardinality, DynamicMessage, Kind as FieldKind, MessageDescriptor};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

use super::{Invalid, Problem, problem};

/// The name the schema's own file has while compiling.
const FILE: &str = "schema.proto";

pub(super) struct Proto {
    message: MessageDescriptor,
}

struct One(String);

impl FileResolver for One {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        if name == FILE { File::from_source(FILE, &self.0) } else { Err(protox::Error::file_not_found(name)) }
    }
}

impl Proto {
    pub(super) fn parse(text: &str, message: Option<&str>) -> Result<Self, String> {
        let mut chain = ChainFileResolver::new();
        chain.add(One(text.to_owned()));
        chain.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(chain);
        compiler.open_file(FILE).map_err(|e| e.to_string())?;
        let pool = compiler.descriptor_pool();
        let message = match message {
            Some(name) => pool.get_message_by_name(name).ok_or_else(|| format!("no message {name} in the file"))?,
            None => {
                pool.get_file_by_name(FILE).and_then(|f| f.messages().next()).ok_or("the file defines no message")?
            }
        };
        Ok(Proto { message })
    }

    pub(super) fn message_name(&self) -> &str {
        self.message.full_name()
    }

    pub(super) fn validate(&self, payload: &[u8]) -> Result<(), Invalid> {
        DynamicMessage::decode(self.message.clone(), payload)
            .map(|_| ())
            .map_err(|e| Invalid { path: String::new(), reason: e.to_string() })
    }

    pub(super) fn reads(&self, writer: &Proto) -> Vec<Problem> {
        let mut out = Vec::new();
        reads(&self.message, &writer.message, "", &mut HashSet::new(), &mut out);
        out
    }
}

/// Wire-compatible groups; a reader's type reads a writer's within one group.
fn group(k: &FieldKind) -> u8 {
    match k {
        FieldKind::Int32 | FieldKind::Uint32 | FieldKind::Int64 | FieldKind::Uint64 | FieldKind::Bool => 1,
        FieldKind::Enum(_) => 1,
        FieldKind::Sint32 | FieldKind::Sint64 => 2,
        FieldKind::Fixed32 | FieldKind::Sfixed32 => 3,
        FieldKind::Fixed64 | FieldKind::Sfixed64 => 4,
        FieldKind::Float => 5,
        FieldKind::Double => 6,
        FieldKind::String => 7,
        FieldKind::Bytes => 8,
        FieldKind::Message(_) => 9,
    }
}

fn kind_name(k: &FieldKind) -> String {
    match k {
        FieldKind::Message(m) => m.full_name().to_owned(),
        FieldKind::Enum(e) => e.full_name().to_owned(),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn reads(
    reader: &MessageDescriptor,
    writer: &MessageDescriptor,
    path: &str,
    seen: &mut HashSet<(String, String)>,
    out: &mut Vec<Problem>,
) {
    if !seen.insert((reader.full_name().to_owned(), writer.full_name().to_owned())) {
        return;
    }
    for rf in reader.fields() {
        let wf = writer.get_field(rf.number());
        if rf.cardinality() == Cardinality::Required
            && wf.as_ref().is_none_or(|w| w.cardinality() != Cardinality::Required)
        {
            out.push(problem(
                &format!("{path}/{}", rf.name()),
                "required field added",
                format!("field {} could be absent before", rf.number()),
            ));
        }
    }
    for wf in writer.fields() {
        let Some(rf) = reader.get_field(wf.number()) else { continue };
        let p = format!("{path}/{}", rf.name());
        if (rf.is_list(), rf.is_map()) != (wf.is_list(), wf.is_map()) {
            out.push(problem(&p, "cardinality changed", format!("field {} was {:?}", wf.number(), wf.cardinality())));
            continue;
        }
        let (rk, wk) = (rf.kind(), wf.kind());
        match (&rk, &wk) {
            (FieldKind::Message(r), FieldKind::Message(w)) => reads(r, w, &p, seen, out),
            (FieldKind::Bytes, FieldKind::String) => {}
            _ if group(&rk) == group(&wk) => {}
            _ => out.push(problem(
                &p,
                "type changed",
                format!("field {}: {} cannot read {}", wf.number(), kind_name(&rk), kind_name(&wk)),
            )),
        }
    }
}
