//! Whether a Protobuf reader message reads what a writer message writes, by Confluent Schema
//! Registry's Protobuf rules (its documented checks), by field number: names are not on the
//! wire, so a field renamed is compatible.
//!
//! - Fields added or removed are compatible (unknown fields are skipped), enum values too
//!   (proto3 enums are open); a `required` field added, or removed, is not.
//! - A field's scalar type may change only within the groups the language guide calls wire
//!   compatible (int32, uint32, int64, uint64, bool and enum; sint32 and sint64; fixed32 and
//!   sfixed32; fixed64 and sfixed64); a `string` is read as `bytes`. Stricter than Confluent:
//!   `bytes` read as `string` is refused, as bytes that are not UTF-8 would fail the reader.
//! - A scalar becoming a message or the reverse, or a message or enum field naming another
//!   type, is not compatible; the package must stay the same.
//! - Singular and repeated are interchangeable for strings, bytes and messages (the same
//!   length-delimited encoding), not for numbers (packed or not); a map stays a map.
//! - `oneof`: the reader's oneof must not hold two fields a writer could set together (fields
//!   moved from the top level or from different oneofs into one: the reader would lose one),
//!   and a writer's oneof may not lose a field while others of it remain. One field moved
//!   into a new oneof, a oneof renamed with the same fields, a field moved out to the top
//!   level: compatible. proto3 `optional` fields' synthetic oneofs are not oneofs here.

use std::collections::HashSet;

use prost_reflect::{Cardinality, FieldDescriptor, Kind as FieldKind, MessageDescriptor};

use super::super::{Problem, problem};

/// Every reason `reader` cannot read what `writer` writes.
pub(in crate::schema) fn reads(reader: &MessageDescriptor, writer: &MessageDescriptor) -> Vec<Problem> {
    let mut out = Vec::new();
    if reader.package_name() != writer.package_name() {
        let detail = format!("{:?} after {:?}", reader.package_name(), writer.package_name());
        out.push(problem("", "package changed", detail));
    }
    message(reader, writer, "", &mut HashSet::new(), &mut out);
    out
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

/// The field's real oneof (not proto3 `optional`'s synthetic one).
fn oneof(f: &FieldDescriptor) -> Option<String> {
    f.containing_oneof().filter(|o| !o.is_synthetic()).map(|o| o.name().to_owned())
}

fn message(
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
        let Some(rf) = reader.get_field(wf.number()) else {
            if wf.cardinality() == Cardinality::Required {
                let detail = format!("field {} was required", wf.number());
                out.push(problem(&format!("{path}/{}", wf.name()), "required field removed", detail));
            }
            continue;
        };
        field(&rf, &wf, &format!("{path}/{}", rf.name()), seen, out);
    }
    oneofs(reader, writer, path, out);
}

fn field(
    rf: &FieldDescriptor,
    wf: &FieldDescriptor,
    p: &str,
    seen: &mut HashSet<(String, String)>,
    out: &mut Vec<Problem>,
) {
    let (rk, wk) = (rf.kind(), wf.kind());
    let length_delimited = matches!(rk, FieldKind::String | FieldKind::Bytes | FieldKind::Message(_));
    if rf.is_map() != wf.is_map() || (rf.is_list() != wf.is_list() && !length_delimited) {
        out.push(problem(p, "cardinality changed", format!("field {} was {:?}", wf.number(), wf.cardinality())));
        return;
    }
    match (&rk, &wk) {
        (FieldKind::Message(r), FieldKind::Message(w)) if r.name() != w.name() && !rf.is_map() => {
            let detail = format!("field {}: {} after {}", wf.number(), r.full_name(), w.full_name());
            out.push(problem(p, "named type changed", detail));
        }
        (FieldKind::Message(r), FieldKind::Message(w)) => message(r, w, p, seen, out),
        (FieldKind::Enum(r), FieldKind::Enum(w)) if r.name() != w.name() => {
            let detail = format!("field {}: {} after {}", wf.number(), r.full_name(), w.full_name());
            out.push(problem(p, "named type changed", detail));
        }
        (FieldKind::Bytes, FieldKind::String) => {}
        _ if group(&rk) == group(&wk) => {}
        _ => out.push(problem(
            p,
            "type changed",
            format!("field {}: {} cannot read {}", wf.number(), kind_name(&rk), kind_name(&wk)),
        )),
    }
}

/// The `oneof` rules (see the module doc).
fn oneofs(reader: &MessageDescriptor, writer: &MessageDescriptor, path: &str, out: &mut Vec<Problem>) {
    // Which writer "group" could set a field: its oneof, or the field alone.
    let set_by = |n: u32| writer.get_field(n).map(|f| oneof(&f).unwrap_or_else(|| format!("#{n}")));
    for o in reader.oneofs().filter(|o| !o.is_synthetic()) {
        let mut groups: Vec<String> = o.fields().filter_map(|f| set_by(f.number())).collect();
        groups.sort();
        groups.dedup();
        if groups.len() > 1 {
            let names: Vec<String> = o.fields().map(|f| f.name().to_owned()).collect();
            let detail = format!("{} could be set together by the writer; the reader keeps one", names.join(", "));
            out.push(problem(&format!("{path}/{}", o.name()), "fields moved into one oneof", detail));
        }
    }
    for o in writer.oneofs().filter(|o| !o.is_synthetic()) {
        let (kept, lost): (Vec<FieldDescriptor>, Vec<FieldDescriptor>) =
            o.fields().partition(|f| reader.get_field(f.number()).is_some());
        if !kept.is_empty() && !lost.is_empty() {
            let names: Vec<String> = lost.iter().map(|f| f.name().to_owned()).collect();
            let detail = format!("{} removed while the oneof stays", names.join(", "));
            out.push(problem(&format!("{path}/{}", o.name()), "oneof field removed", detail));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> MessageDescriptor {
        let text = format!("syntax = \"proto3\";\npackage p;\n{body}");
        super::super::Proto::parse(&text, Some("p.M")).unwrap_or_else(|e| panic!("{e}: {text}")).message
    }

    /// (the rule, the writer's messages, the reader's, whether the reader reads the writer)
    const CASES: &[(&str, &str, &str, bool)] = &[
        ("field added", "message M { int32 a = 1; }", "message M { int32 a = 1; string b = 2; }", true),
        ("field removed", "message M { int32 a = 1; string b = 2; }", "message M { int32 a = 1; }", true),
        ("field renamed, same number", "message M { int32 a = 1; }", "message M { int32 z = 1; }", true),
        (
            "field number changed: one removed, one added",
            "message M { int32 a = 1; }",
            "message M { int32 a = 2; }",
            true,
        ),
        ("int32 to int64", "message M { int32 a = 1; }", "message M { int64 a = 1; }", true),
        ("uint64 to bool", "message M { uint64 a = 1; }", "message M { bool a = 1; }", true),
        (
            "int32 to enum",
            "message M { int32 a = 1; } enum E { Z = 0; }",
            "message M { E a = 1; } enum E { Z = 0; }",
            true,
        ),
        (
            "enum to int32",
            "message M { E a = 1; } enum E { Z = 0; }",
            "message M { int32 a = 1; } enum E { Z = 0; }",
            true,
        ),
        ("sint32 to sint64", "message M { sint32 a = 1; }", "message M { sint64 a = 1; }", true),
        ("int32 to sint32: zigzag differs", "message M { int32 a = 1; }", "message M { sint32 a = 1; }", false),
        ("fixed32 to sfixed32", "message M { fixed32 a = 1; }", "message M { sfixed32 a = 1; }", true),
        ("fixed32 to fixed64", "message M { fixed32 a = 1; }", "message M { fixed64 a = 1; }", false),
        ("float to double", "message M { float a = 1; }", "message M { double a = 1; }", false),
        ("string read as bytes", "message M { string a = 1; }", "message M { bytes a = 1; }", true),
        (
            "bytes read as string (stricter than Confluent)",
            "message M { bytes a = 1; }",
            "message M { string a = 1; }",
            false,
        ),
        ("int32 to string", "message M { int32 a = 1; }", "message M { string a = 1; }", false),
        (
            "scalar to message",
            "message M { int32 a = 1; } message S { int32 x = 1; }",
            "message M { S a = 1; } message S { int32 x = 1; }",
            false,
        ),
        (
            "message to scalar",
            "message M { S a = 1; } message S { int32 x = 1; }",
            "message M { int32 a = 1; } message S { int32 x = 1; }",
            false,
        ),
        (
            "message type renamed",
            "message M { S a = 1; } message S { int32 x = 1; }",
            "message M { T a = 1; } message T { int32 x = 1; }",
            false,
        ),
        (
            "enum type renamed",
            "message M { E a = 1; } enum E { Z = 0; }",
            "message M { F a = 1; } enum F { Z = 0; }",
            false,
        ),
        (
            "nested message gains a field",
            "message M { S a = 1; } message S { int32 x = 1; }",
            "message M { S a = 1; } message S { int32 x = 1; int32 y = 2; }",
            true,
        ),
        (
            "nested message field type changed",
            "message M { S a = 1; } message S { int32 x = 1; }",
            "message M { S a = 1; } message S { string x = 1; }",
            false,
        ),
        (
            "enum value added",
            "message M { E a = 1; } enum E { Z = 0; }",
            "message M { E a = 1; } enum E { Z = 0; Y = 1; }",
            true,
        ),
        (
            "enum value removed (open enums)",
            "message M { E a = 1; } enum E { Z = 0; Y = 1; }",
            "message M { E a = 1; } enum E { Z = 0; }",
            true,
        ),
        ("string singular to repeated", "message M { string a = 1; }", "message M { repeated string a = 1; }", true),
        ("bytes repeated to singular", "message M { repeated bytes a = 1; }", "message M { bytes a = 1; }", true),
        (
            "message singular to repeated",
            "message M { S a = 1; } message S {}",
            "message M { repeated S a = 1; } message S {}",
            true,
        ),
        ("number singular to repeated", "message M { int32 a = 1; }", "message M { repeated int32 a = 1; }", false),
        ("number repeated to singular", "message M { repeated int64 a = 1; }", "message M { int64 a = 1; }", false),
        (
            "map to repeated entries",
            "message M { map<string, int32> a = 1; }",
            "message M { repeated string a = 1; }",
            false,
        ),
        (
            "map values widened",
            "message M { map<string, int32> a = 1; }",
            "message M { map<string, int64> a = 1; }",
            true,
        ),
        (
            "map values changed",
            "message M { map<string, int32> a = 1; }",
            "message M { map<string, string> a = 1; }",
            false,
        ),
        (
            "one field moved into a new oneof",
            "message M { int32 a = 1; int32 b = 2; }",
            "message M { oneof o { int32 a = 1; } int32 b = 2; }",
            true,
        ),
        (
            "two fields moved into a new oneof",
            "message M { int32 a = 1; int32 b = 2; }",
            "message M { oneof o { int32 a = 1; int32 b = 2; } }",
            false,
        ),
        (
            "a field moved into an existing oneof",
            "message M { int32 a = 1; oneof o { int32 b = 2; } }",
            "message M { oneof o { int32 a = 1; int32 b = 2; } }",
            false,
        ),
        (
            "a field added to a oneof",
            "message M { oneof o { int32 a = 1; } }",
            "message M { oneof o { int32 a = 1; int32 b = 2; } }",
            true,
        ),
        (
            "a field removed from a oneof that stays",
            "message M { oneof o { int32 a = 1; int32 b = 2; } }",
            "message M { oneof o { int32 a = 1; } }",
            false,
        ),
        (
            "a oneof renamed with the same fields",
            "message M { oneof o { int32 a = 1; int32 b = 2; } }",
            "message M { oneof q { int32 a = 1; int32 b = 2; } }",
            true,
        ),
        (
            "two oneofs merged",
            "message M { oneof o { int32 a = 1; } oneof q { int32 b = 2; } }",
            "message M { oneof r { int32 a = 1; int32 b = 2; } }",
            false,
        ),
        (
            "a field moved between oneofs",
            "message M { oneof o { int32 a = 1; int32 c = 3; } oneof q { int32 b = 2; } }",
            "message M { oneof o { int32 c = 3; } oneof q { int32 a = 1; int32 b = 2; } }",
            false,
        ),
        (
            "a field moved out of a oneof to the top level",
            "message M { oneof o { int32 a = 1; int32 b = 2; } }",
            "message M { int32 a = 1; oneof o { int32 b = 2; } }",
            true,
        ),
        (
            "one field into a new singleton oneof from a surviving one",
            "message M { oneof o { int32 a = 1; int32 b = 2; } }",
            "message M { oneof o { int32 a = 1; } oneof q { int32 b = 2; } }",
            true,
        ),
        (
            "a whole oneof removed",
            "message M { int32 x = 9; oneof o { int32 a = 1; int32 b = 2; } }",
            "message M { int32 x = 9; }",
            true,
        ),
        (
            "proto3 optional fields are not a oneof",
            "message M { int32 a = 1; int32 b = 2; }",
            "message M { optional int32 a = 1; optional int32 b = 2; }",
            true,
        ),
        (
            "a recursive message gains a field",
            "message M { M next = 1; }",
            "message M { M next = 1; int32 v = 2; }",
            true,
        ),
    ];

    #[test]
    fn the_rules_case_by_case() {
        for (rule, writer, reader, readable) in CASES {
            let problems = reads(&parse(reader), &parse(writer));
            assert_eq!(problems.is_empty(), *readable, "{rule}: {problems:?}");
        }
    }

    #[test]
    fn a_package_change_and_required_fields_are_refused_by_name() {
        let proto2 = |package: &str, body: &str| {
            let text = format!("syntax = \"proto2\";\npackage {package};\n{body}");
            super::super::Proto::parse(&text, None).unwrap().message
        };
        let base = proto2("p", "message M { required int32 a = 1; optional int32 b = 2; }");
        let moved = proto2("q", "message M { required int32 a = 1; optional int32 b = 2; }");
        assert_eq!(reads(&moved, &base)[0].rule, "package changed");
        let removed = proto2("p", "message M { optional int32 b = 2; }");
        assert_eq!(reads(&removed, &base)[0].rule, "required field removed");
        assert_eq!(reads(&removed, &base)[0].path, "/a");
        let added = proto2("p", "message M { required int32 a = 1; required int32 b = 2; }");
        assert_eq!(reads(&added, &base)[0].rule, "required field added");
        let problems = reads(
            &parse("message M { oneof o { int32 a = 1; int32 b = 2; } }"),
            &parse("message M { int32 a = 1; int32 b = 2; }"),
        );
        assert_eq!((problems[0].path.as_str(), problems[0].rule), ("/o", "fields moved into one oneof"));
    }
}
