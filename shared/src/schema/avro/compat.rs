//! Whether an Avro reader schema reads everything a writer schema writes: the specification's
//! schema resolution as Java's `SchemaCompatibility` decides it (which Confluent Schema Registry
//! runs), naming the field where it does not.
//!
//! Where the `apache-avro` crate's check differed from it: a writer's union is read only if
//! the reader reads every one of its branches (the crate took one), so widening `int` to
//! `["null","int"]` is not forward compatible; a writer's enum symbol the reader lacks is an
//! error unless the reader's enum has a default. Named types match by their unqualified name
//! or a reader alias of the writer's full name, as Java's do; logical types are read as their
//! underlying types.

use std::collections::HashSet;

use apache_avro::Schema as S;
use apache_avro::schema::{FixedSchema, InnerDecimalSchema, Name, UuidSchema};

use super::super::{Problem, problem};
use super::Avro;

/// Every reason `reader` cannot read what `writer` writes.
pub(in crate::schema) fn reads(reader: &Avro, writer: &Avro) -> Vec<Problem> {
    let mut c = Check { reader, writer, seen: HashSet::new(), out: Vec::new() };
    c.check(&reader.schema, &writer.schema, "");
    c.out
}

struct Check<'a> {
    reader: &'a Avro,
    writer: &'a Avro,
    /// Named pairs under way: a recursive type is checked once.
    seen: HashSet<(String, String)>,
    out: Vec<Problem>,
}

/// What a schema is read as, logical types by their underlying type.
#[derive(Debug, Clone, Copy)]
enum Base<'s> {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Fixed(&'s FixedSchema),
    Complex,
}

fn base(s: &S) -> Base<'_> {
    match s {
        S::Null => Base::Null,
        S::Boolean => Base::Boolean,
        S::Int | S::Date | S::TimeMillis => Base::Int,
        S::Long
        | S::TimeMicros
        | S::TimestampMillis
        | S::TimestampMicros
        | S::TimestampNanos
        | S::LocalTimestampMillis
        | S::LocalTimestampMicros
        | S::LocalTimestampNanos => Base::Long,
        S::Float => Base::Float,
        S::Double => Base::Double,
        S::Bytes | S::BigDecimal | S::Uuid(UuidSchema::Bytes) => Base::Bytes,
        S::String | S::Uuid(UuidSchema::String) => Base::String,
        S::Fixed(f) | S::Duration(f) | S::Uuid(UuidSchema::Fixed(f)) => Base::Fixed(f),
        S::Decimal(d) => match &d.inner {
            InnerDecimalSchema::Bytes => Base::Bytes,
            InnerDecimalSchema::Fixed(f) => Base::Fixed(f),
        },
        _ => Base::Complex,
    }
}

/// A type as a reason names it.
fn describe(s: &S) -> String {
    match s {
        S::Record(r) => format!("record {}", r.name.fullname(None)),
        S::Enum(e) => format!("enum {}", e.name.fullname(None)),
        S::Fixed(f) => format!("fixed {}", f.name.fullname(None)),
        S::Array(_) => "array".into(),
        S::Map(_) => "map".into(),
        S::Union(_) => "union".into(),
        S::Ref { name } => name.fullname(None),
        other => format!("{:?}", base(other)).to_lowercase(),
    }
}

/// Java's `schemaNameEquals`: the same unqualified name, or a reader alias naming the writer.
fn same_name(reader: &Name, aliases: Option<&Vec<apache_avro::schema::Alias>>, writer: &Name) -> bool {
    reader.name() == writer.name()
        || aliases.into_iter().flatten().any(|a| a.fullname(reader.namespace()) == writer.fullname(None))
}

impl<'a> Check<'a> {
    fn resolve<'s>(names: &'s Avro, s: &'s S) -> &'s S {
        match s {
            S::Ref { name } => names.names.get(name).unwrap_or(s),
            other => other,
        }
    }

    /// Whether `r` reads `w` at all (no reason kept).
    fn can(&mut self, r: &S, w: &S) -> bool {
        let before = std::mem::take(&mut self.out);
        self.check(r, w, "");
        let ok = self.out.is_empty();
        self.out = before;
        ok
    }

    fn check(&mut self, r: &S, w: &S, path: &str) {
        let (r, w) = (Self::resolve(self.reader, r), Self::resolve(self.writer, w));
        if let S::Union(wu) = w {
            // Data may have been written as any branch: each must be readable.
            for branch in wu.variants() {
                if !self.can(r, branch) {
                    let detail = format!("the writer's {} branch is not readable as {}", describe(branch), describe(r));
                    self.out.push(problem(path, "union branch not readable", detail));
                }
            }
            return;
        }
        if let S::Union(ru) = r {
            if !ru.variants().iter().any(|branch| self.can(branch, w)) {
                let detail = format!("no branch of the reader's union reads {}", describe(w));
                self.out.push(problem(path, "not in the reader's union", detail));
            }
            return;
        }
        match (r, w) {
            (S::Record(rr), S::Record(wr)) => {
                if !same_name(&rr.name, rr.aliases.as_ref(), &wr.name) {
                    return self.mismatch(path, r, w);
                }
                if !self.seen.insert((rr.name.fullname(None), wr.name.fullname(None))) {
                    return;
                }
                for rf in &rr.fields {
                    let at = format!("{path}/{}", rf.name);
                    let wf = wr.fields.iter().find(|wf| wf.name == rf.name || rf.aliases.contains(&wf.name));
                    match wf {
                        Some(wf) => self.check(&rf.schema, &wf.schema, &at),
                        None if rf.default.is_none() => self.out.push(problem(
                            &at,
                            "field added without a default",
                            "the writer does not write it and the reader has no default",
                        )),
                        None => {}
                    }
                }
            }
            (S::Enum(re), S::Enum(we)) => {
                if !same_name(&re.name, re.aliases.as_ref(), &we.name) {
                    return self.mismatch(path, r, w);
                }
                let missing: Vec<&str> =
                    we.symbols.iter().filter(|s| !re.symbols.contains(s)).map(String::as_str).collect();
                if !missing.is_empty() && re.default.is_none() {
                    let detail = format!("{} unknown to the reader, which has no default", missing.join(", "));
                    self.out.push(problem(path, "enum symbols missing", detail));
                }
            }
            (S::Array(ra), S::Array(wa)) => self.check(&ra.items, &wa.items, &format!("{path}/[]")),
            (S::Map(rm), S::Map(wm)) => self.check(&rm.types, &wm.types, &format!("{path}/{{}}")),
            _ => match (base(r), base(w)) {
                (Base::Fixed(rf), Base::Fixed(wf)) => {
                    if !same_name(&rf.name, rf.aliases.as_ref(), &wf.name) {
                        self.mismatch(path, r, w);
                    } else if rf.size != wf.size {
                        let detail = format!("{} bytes read as {}", wf.size, rf.size);
                        self.out.push(problem(path, "fixed size changed", detail));
                    }
                }
                (Base::Complex, _) | (_, Base::Complex) | (Base::Fixed(_), _) | (_, Base::Fixed(_)) => {
                    self.mismatch(path, r, w)
                }
                (rb, wb) if std::mem::discriminant(&rb) == std::mem::discriminant(&wb) => {}
                // The specification's promotions.
                (Base::Long, Base::Int)
                | (Base::Float, Base::Int | Base::Long)
                | (Base::Double, Base::Int | Base::Long | Base::Float)
                | (Base::String, Base::Bytes)
                | (Base::Bytes, Base::String) => {}
                _ => self.mismatch(path, r, w),
            },
        }
    }

    fn mismatch(&mut self, path: &str, r: &S, w: &S) {
        let detail = format!("{} cannot read {}", describe(r), describe(w));
        self.out.push(problem(path, "type changed", detail));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avro(text: &str) -> Avro {
        Avro::parse(text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    fn record(fields: &str) -> String {
        format!(r#"{{"type":"record","name":"R","namespace":"n","fields":[{fields}]}}"#)
    }

    /// (the rule, the writer, the reader, whether the reader reads what the writer writes):
    /// the specification's schema resolution as Java's `SchemaCompatibility` applies it.
    const CASES: &[(&str, &str, &str, bool)] = &[
        ("same primitive", r#""int""#, r#""int""#, true),
        ("int promoted to long", r#""int""#, r#""long""#, true),
        ("int promoted to float", r#""int""#, r#""float""#, true),
        ("int promoted to double", r#""int""#, r#""double""#, true),
        ("long promoted to float", r#""long""#, r#""float""#, true),
        ("long promoted to double", r#""long""#, r#""double""#, true),
        ("float promoted to double", r#""float""#, r#""double""#, true),
        ("string read as bytes", r#""string""#, r#""bytes""#, true),
        ("bytes read as string", r#""bytes""#, r#""string""#, true),
        ("long not narrowed to int", r#""long""#, r#""int""#, false),
        ("double not narrowed to float", r#""double""#, r#""float""#, false),
        ("float not read as long", r#""float""#, r#""long""#, false),
        ("int not read as string", r#""int""#, r#""string""#, false),
        ("boolean not read as int", r#""boolean""#, r#""int""#, false),
        ("null only as null", r#""null""#, r#""int""#, false),
        ("a date is read as its int", r#"{"type":"int","logicalType":"date"}"#, r#""int""#, true),
        ("a timestamp is read as its long", r#"{"type":"long","logicalType":"timestamp-millis"}"#, r#""long""#, true),
        ("an int read as a date", r#""int""#, r#"{"type":"int","logicalType":"date"}"#, true),
        ("a uuid is read as its string", r#"{"type":"string","logicalType":"uuid"}"#, r#""string""#, true),
        ("union widened: the old reader of int cannot read null", r#"["null","int"]"#, r#""int""#, false),
        ("union narrowed to the branch the reader has", r#""int""#, r#"["null","int"]"#, true),
        ("a branch added to the writer's union", r#"["null","int","string"]"#, r#"["null","int"]"#, false),
        ("a branch added to the reader's union", r#"["null","int"]"#, r#"["null","int","string"]"#, true),
        ("union branches reordered", r#"["null","int"]"#, r#"["int","null"]"#, true),
        ("a writer's branch read by promotion", r#"["null","int"]"#, r#"["null","long"]"#, true),
        ("a writer's union read by one promoting type", r#"["int","long"]"#, r#""long""#, true),
        ("array items promoted", r#"{"type":"array","items":"int"}"#, r#"{"type":"array","items":"long"}"#, true),
        ("array items narrowed", r#"{"type":"array","items":"long"}"#, r#"{"type":"array","items":"int"}"#, false),
        ("map values promoted", r#"{"type":"map","values":"float"}"#, r#"{"type":"map","values":"double"}"#, true),
        ("map not read as array", r#"{"type":"map","values":"int"}"#, r#"{"type":"array","items":"int"}"#, false),
        (
            "fixed of the same size",
            r#"{"type":"fixed","name":"F","size":4}"#,
            r#"{"type":"fixed","name":"F","size":4}"#,
            true,
        ),
        ("fixed resized", r#"{"type":"fixed","name":"F","size":4}"#, r#"{"type":"fixed","name":"F","size":8}"#, false),
        ("fixed renamed", r#"{"type":"fixed","name":"F","size":4}"#, r#"{"type":"fixed","name":"G","size":4}"#, false),
        (
            "fixed renamed with an alias",
            r#"{"type":"fixed","name":"F","size":4}"#,
            r#"{"type":"fixed","name":"G","aliases":["F"],"size":4}"#,
            true,
        ),
        (
            "enum symbol added to the reader",
            r#"{"type":"enum","name":"E","symbols":["A"]}"#,
            r#"{"type":"enum","name":"E","symbols":["A","B"]}"#,
            true,
        ),
        (
            "enum symbol the reader lacks",
            r#"{"type":"enum","name":"E","symbols":["A","B"]}"#,
            r#"{"type":"enum","name":"E","symbols":["A"]}"#,
            false,
        ),
        (
            "enum symbol the reader lacks, with its default",
            r#"{"type":"enum","name":"E","symbols":["A","B"]}"#,
            r#"{"type":"enum","name":"E","symbols":["A"],"default":"A"}"#,
            true,
        ),
        (
            "enum renamed",
            r#"{"type":"enum","name":"E","symbols":["A"]}"#,
            r#"{"type":"enum","name":"X","symbols":["A"]}"#,
            false,
        ),
        (
            "enum namespace changed: names match unqualified",
            r#"{"type":"enum","name":"a.E","symbols":["A"]}"#,
            r#"{"type":"enum","name":"b.E","symbols":["A"]}"#,
            true,
        ),
    ];

    #[test]
    fn resolution_follows_the_specification_case_by_case() {
        for (rule, writer, reader, readable) in CASES {
            let problems = reads(&avro(reader), &avro(writer));
            assert_eq!(problems.is_empty(), *readable, "{rule}: {problems:?}");
        }
    }

    /// (the rule, the writer's fields, the reader's fields, readable)
    const RECORD_CASES: &[(&str, &str, &str, bool)] = &[
        (
            "field added with a default",
            r#"{"name":"a","type":"int"}"#,
            r#"{"name":"a","type":"int"},{"name":"b","type":"int","default":0}"#,
            true,
        ),
        (
            "field added without a default",
            r#"{"name":"a","type":"int"}"#,
            r#"{"name":"a","type":"int"},{"name":"b","type":"int"}"#,
            false,
        ),
        (
            "field removed (the reader skips it)",
            r#"{"name":"a","type":"int"},{"name":"b","type":"int"}"#,
            r#"{"name":"a","type":"int"}"#,
            true,
        ),
        ("field renamed", r#"{"name":"a","type":"int"}"#, r#"{"name":"b","type":"int"}"#, false),
        (
            "field renamed with an alias",
            r#"{"name":"a","type":"int"}"#,
            r#"{"name":"b","aliases":["a"],"type":"int"}"#,
            true,
        ),
        (
            "field renamed with a default",
            r#"{"name":"a","type":"int"}"#,
            r#"{"name":"b","type":"int","default":1}"#,
            true,
        ),
        ("field type promoted", r#"{"name":"a","type":"int"}"#, r#"{"name":"a","type":"long"}"#, true),
        ("field type narrowed", r#"{"name":"a","type":"long"}"#, r#"{"name":"a","type":"int"}"#, false),
        ("field made nullable", r#"{"name":"a","type":"int"}"#, r#"{"name":"a","type":["null","int"]}"#, true),
        (
            "nullable field made required",
            r#"{"name":"a","type":["null","int"]}"#,
            r#"{"name":"a","type":"int"}"#,
            false,
        ),
        (
            "fields reordered",
            r#"{"name":"a","type":"int"},{"name":"b","type":"string"}"#,
            r#"{"name":"b","type":"string"},{"name":"a","type":"int"}"#,
            true,
        ),
        (
            "a default changed",
            r#"{"name":"a","type":"int","default":1}"#,
            r#"{"name":"a","type":"int","default":2}"#,
            true,
        ),
        (
            "a default removed from a field the writer writes",
            r#"{"name":"a","type":"int","default":1}"#,
            r#"{"name":"a","type":"int"}"#,
            true,
        ),
        (
            "nested field added without a default",
            r#"{"name":"s","type":{"type":"record","name":"S","fields":[]}}"#,
            r#"{"name":"s","type":{"type":"record","name":"S","fields":[{"name":"x","type":"int"}]}}"#,
            false,
        ),
    ];

    #[test]
    fn records_resolve_field_by_field_and_a_refusal_names_the_field() {
        for (rule, writer, reader, readable) in RECORD_CASES {
            let problems = reads(&avro(&record(reader)), &avro(&record(writer)));
            assert_eq!(problems.is_empty(), *readable, "{rule}: {problems:?}");
        }
        let problems = reads(&avro(&record(RECORD_CASES[13].2)), &avro(&record(RECORD_CASES[13].1)));
        assert_eq!(problems[0].path, "/s/x");
        assert_eq!(problems[0].rule, "field added without a default");
        let renamed = r#"{"type":"record","name":"Q","fields":[]}"#;
        assert!(!reads(&avro(renamed), &avro(&record(""))).is_empty(), "a record renamed");
        let aliased = r#"{"type":"record","name":"Q","aliases":["n.R"],"fields":[]}"#;
        assert!(reads(&avro(aliased), &avro(&record(""))).is_empty(), "renamed with an alias of the full name");
        let moved = r#"{"type":"record","name":"R","namespace":"other","fields":[]}"#;
        assert!(reads(&avro(moved), &avro(&record(""))).is_empty(), "a namespace change: names match unqualified");
        let list =
            r#"{"type":"record","name":"L","fields":[{"name":"v","type":"int"},{"name":"next","type":["null","L"]}]}"#;
        let wider = list.replace(r#""type":"int""#, r#""type":"long""#);
        assert!(reads(&avro(&wider), &avro(list)).is_empty(), "a recursive type, checked once");
        assert!(!reads(&avro(list), &avro(&wider)).is_empty());
    }
}
