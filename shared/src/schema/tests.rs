//! The compatibility matrix of each kind (add a field with a default, remove a field, change a
//! type, rename a field, widen an enum) in every mode, and validation of good and bad payloads.
//! Expected outcomes follow each format's published rules: JSON Schema as Confluent lists them
//! for a closed content model, Avro's schema resolution, Protobuf's wire compatibility.

use super::*;

fn schema(kind: Kind, text: &str) -> Schema {
    Schema::parse(Source { kind, text: text.into(), message: None }).unwrap_or_else(|e| panic!("{e}: {text}"))
}

const JSON_BASE: &str = r#"{"type":"object","additionalProperties":false,"required":["id","temp"],
 "properties":{"id":{"type":"string"},"temp":{"type":"number"},"unit":{"enum":["C","F"]}}}"#;

fn json_with(change: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(JSON_BASE).unwrap();
    let props = v["properties"].as_object_mut().unwrap();
    match change {
        "add field with default" => {
            props.insert("site".into(), serde_json::json!({"type":"string","default":"a"}));
        }
        "remove field" => {
            props.remove("unit");
        }
        "change type" => {
            props.insert("temp".into(), serde_json::json!({"type":"string"}));
        }
        "rename field" => {
            let unit = props.remove("unit").unwrap();
            props.insert("units".into(), unit);
        }
        "widen enum" => {
            props.insert("unit".into(), serde_json::json!({"enum":["C","F","K"]}));
        }
        _ => unreachable!(),
    }
    v.to_string()
}

const AVRO_BASE: &str = r#"{"type":"record","name":"Reading","fields":[
 {"name":"id","type":"string"},{"name":"temp","type":"double"},
 {"name":"unit","type":{"type":"enum","name":"Unit","symbols":["C","F"]}}]}"#;

fn avro_with(change: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(AVRO_BASE).unwrap();
    let fields = v["fields"].as_array_mut().unwrap();
    match change {
        "add field with default" => fields.push(serde_json::json!({"name":"site","type":"string","default":"a"})),
        "remove field" => {
            fields.pop();
        }
        "change type" => fields[1] = serde_json::json!({"name":"temp","type":"string"}),
        "rename field" => fields[2]["name"] = "units".into(),
        "widen enum" => fields[2]["type"]["symbols"] = serde_json::json!(["C", "F", "K"]),
        _ => unreachable!(),
    }
    v.to_string()
}

const PROTO_BASE: &str = "syntax = \"proto3\";\npackage demo;\nenum Unit { C = 0; F = 1; }\n\
     message Reading { string id = 1; double temp = 2; Unit unit = 3; }\n";

fn proto_with(change: &str) -> String {
    match change {
        "add field with default" => PROTO_BASE.replace("Unit unit = 3;", "Unit unit = 3; string site = 4;"),
        "remove field" => PROTO_BASE.replace(" Unit unit = 3;", ""),
        "change type" => PROTO_BASE.replace("double temp = 2;", "string temp = 2;"),
        "rename field" => PROTO_BASE.replace("Unit unit = 3;", "Unit units = 3;"),
        "widen enum" => PROTO_BASE.replace("F = 1;", "F = 1; K = 2;"),
        _ => unreachable!(),
    }
}

const CHANGES: [&str; 5] = ["add field with default", "remove field", "change type", "rename field", "widen enum"];

/// (kind, change, new reads old, old reads new)
const MATRIX: [(Kind, &str, bool, bool); 15] = [
    (Kind::Json, "add field with default", true, false),
    (Kind::Json, "remove field", false, true),
    (Kind::Json, "change type", false, false),
    (Kind::Json, "rename field", false, false),
    (Kind::Json, "widen enum", true, false),
    (Kind::Avro, "add field with default", true, true),
    (Kind::Avro, "remove field", true, false),
    (Kind::Avro, "change type", false, false),
    (Kind::Avro, "rename field", false, false),
    (Kind::Avro, "widen enum", true, false),
    (Kind::Protobuf, "add field with default", true, true),
    (Kind::Protobuf, "remove field", true, true),
    (Kind::Protobuf, "change type", false, false),
    (Kind::Protobuf, "rename field", true, true),
    (Kind::Protobuf, "widen enum", true, true),
];

fn versions(kind: Kind, change: &str) -> (Schema, Schema) {
    match kind {
        Kind::Json => (schema(kind, JSON_BASE), schema(kind, &json_with(change))),
        Kind::Avro => (schema(kind, AVRO_BASE), schema(kind, &avro_with(change))),
        Kind::Protobuf => (schema(kind, PROTO_BASE), schema(kind, &proto_with(change))),
    }
}

#[test]
fn every_change_of_every_kind_is_judged_as_its_format_rules_say_in_every_mode() {
    assert_eq!(MATRIX.len(), 3 * CHANGES.len());
    for (kind, change, backward, forward) in MATRIX {
        let (old, new) = versions(kind, change);
        for mode in Compatibility::ALL {
            let (b, f) = mode.directions();
            let expected = (!b || backward) && (!f || forward);
            let got = check(mode, &new, std::slice::from_ref(&old));
            assert_eq!(got.is_ok(), expected, "{kind} {change} in {mode}: {got:?}");
            if let Err(e) = got {
                assert!(!e.problems.is_empty());
                assert!(e.to_string().contains("not "), "{e}");
            }
        }
    }
}

#[test]
fn a_refusal_names_the_field_and_the_rule() {
    let (old, new) = versions(Kind::Json, "change type");
    let e = check(Compatibility::Backward, &new, &[old]).unwrap_err();
    assert_eq!(e.problems[0].path, "/temp");
    assert_eq!(e.problems[0].rule, "type narrowed");
    let (old, new) = versions(Kind::Protobuf, "change type");
    let e = check(Compatibility::Backward, &new, &[old]).unwrap_err();
    assert_eq!((e.problems[0].path.as_str(), e.problems[0].rule), ("/temp", "type changed"));
    let (old, new) = versions(Kind::Avro, "rename field");
    let e = check(Compatibility::Backward, &new, &[old]).unwrap_err();
    assert!(e.to_string().contains("units"), "{e}");
}

#[test]
fn transitive_modes_check_every_earlier_version_and_the_plain_ones_only_the_latest() {
    let v1 = schema(Kind::Avro, r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}"#);
    let v2 = schema(Kind::Avro, r#"{"type":"record","name":"R","fields":[]}"#);
    let v3 = schema(Kind::Avro, r#"{"type":"record","name":"R","fields":[{"name":"a","type":"string","default":""}]}"#);
    assert!(check(Compatibility::Backward, &v2, std::slice::from_ref(&v1)).is_ok());
    let earlier = [v1, v2];
    assert!(check(Compatibility::Backward, &v3, &earlier).is_ok());
    let e = check(Compatibility::BackwardTransitive, &v3, &earlier).unwrap_err();
    assert_eq!(e.against, 0);
}

#[test]
fn a_json_open_content_model_refuses_a_new_typed_property_backward() {
    let old = schema(Kind::Json, r#"{"type":"object","properties":{"a":{"type":"number"}}}"#);
    let new = schema(Kind::Json, r#"{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"string"}}}"#);
    let e = check(Compatibility::Backward, &new, std::slice::from_ref(&old)).unwrap_err();
    assert_eq!(e.problems[0].rule, "property added to an open content model");
    assert!(check(Compatibility::Forward, &new, &[old]).is_ok());
}

#[test]
fn a_json_keyword_the_rules_do_not_model_is_reported_when_it_changes() {
    let old = schema(Kind::Json, r#"{"type":"string","pattern":"^a"}"#);
    let new = schema(Kind::Json, r#"{"type":"string","pattern":"^a","if":{"maxLength":3}}"#);
    let e = check(Compatibility::Backward, &new, std::slice::from_ref(&old)).unwrap_err();
    assert_eq!(e.problems[0].rule, "keyword not checked");
    let other = schema(Kind::Json, r#"{"type":"string","pattern":"^b"}"#);
    let e = check(Compatibility::Backward, &other, std::slice::from_ref(&old)).unwrap_err();
    assert_eq!(e.problems[0].rule, "pattern added or changed");
    let same = schema(Kind::Json, r#"{"pattern":"^a","type":"string","title":"x"}"#);
    assert!(check(Compatibility::Full, &same, &[old]).is_ok());
}

#[test]
fn ids_come_from_content_not_layout() {
    let a = schema(Kind::Json, r#"{"type":"object","properties":{"a":{"type":"number"}}}"#);
    let b = schema(Kind::Json, "{ \"properties\": {\"a\": {\"type\": \"number\"}},\n \"type\": \"object\" }");
    assert_eq!(a.id(), b.id());
    assert_eq!(a.id().len(), 16);
    let c = schema(Kind::Json, r#"{"type":"object","properties":{"a":{"type":"string"}}}"#);
    assert_ne!(a.id(), c.id());
    let x = schema(Kind::Avro, AVRO_BASE);
    let y = schema(Kind::Avro, &AVRO_BASE.replace('\n', "  "));
    assert_eq!(x.id(), y.id());
}

#[test]
fn json_payloads_are_checked_and_the_reason_names_the_field() {
    let s = schema(Kind::Json, JSON_BASE);
    assert!(s.validate(br#"{"id":"a","temp":21.5,"unit":"C"}"#).is_ok());
    let e = s.validate(br#"{"id":"a","temp":"hot"}"#).unwrap_err();
    assert_eq!(e.path, "/temp");
    assert!(e.to_string().starts_with("/temp: "), "{e}");
    let e = s.validate(br#"{"id":"a"}"#).unwrap_err();
    assert!(e.reason.contains("temp"), "{e}");
    let e = s.validate(b"{not json").unwrap_err();
    assert!(e.reason.starts_with("not JSON"), "{e}");
}

fn zigzag(v: i64) -> Vec<u8> {
    let mut n = ((v << 1) ^ (v >> 63)) as u64;
    let mut out = vec![];
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

fn avro_reading(id: &str, temp: f64, unit: i64) -> Vec<u8> {
    let mut out = zigzag(id.len() as i64);
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(&temp.to_le_bytes());
    out.extend(zigzag(unit));
    out
}

#[test]
// The plain datum functions, deprecated for reader and writer objects, are the shortest way to
// ask the crate for the encoding of one value.
#[allow(deprecated)]
fn avro_payloads_are_one_whole_datum() {
    let s = schema(Kind::Avro, AVRO_BASE);
    let good = avro_reading("cam-1", 21.5, 1);
    assert!(s.validate(&good).is_ok());
    // The crate's own encoder agrees with ours, and its decoder with our walk.
    let parsed = apache_avro::Schema::parse_str(AVRO_BASE).unwrap();
    let value = apache_avro::from_avro_datum(&parsed, &mut good.as_slice(), None).unwrap();
    assert_eq!(apache_avro::to_avro_datum(&parsed, value).unwrap(), good);
    let e = s.validate(&avro_reading("cam-1", 21.5, 2)).unwrap_err();
    assert_eq!(e.path, "/unit");
    let e = s.validate(&good[..good.len() - 3]).unwrap_err();
    assert_eq!(e.path, "/temp");
    let mut long = good.clone();
    long.push(0);
    assert!(s.validate(&long).unwrap_err().reason.contains("after the datum"));
}

#[test]
fn an_avro_payload_cannot_claim_more_than_its_bytes_hold() {
    let nulls = schema(Kind::Avro, r#"{"type":"array","items":"null"}"#);
    // One block claiming 2^62 nulls in nine bytes: refused at once, nothing walked.
    let mut p = zigzag(1 << 62);
    p.push(0);
    let t = std::time::Instant::now();
    assert!(nulls.validate(&p).unwrap_err().reason.contains("items claimed"));
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    // A string claiming a gigabyte in a few bytes allocates nothing.
    let s = schema(Kind::Avro, r#""string""#);
    let e = s.validate(&zigzag(1 << 30)).unwrap_err();
    assert!(e.reason.contains("left"), "{e}");
    // A recursive type nests only so deep, whatever the payload.
    let list =
        schema(Kind::Avro, r#"{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"]}]}"#);
    assert!(list.validate(&[2, 2, 0]).is_ok());
    let deep = vec![2u8; 10_000];
    assert!(list.validate(&deep).unwrap_err().reason.contains("deeper"));
}

#[test]
fn protobuf_payloads_decode_as_the_message() {
    let s = schema(Kind::Protobuf, PROTO_BASE);
    // id = "a" (field 1, wire type 2), temp = 1.0 (field 2, wire type 1).
    let mut good = vec![0x0a, 1, b'a', 0x11];
    good.extend_from_slice(&1.0f64.to_le_bytes());
    assert!(s.validate(&good).is_ok());
    // temp sent as a varint, not the double it is: an unknown field, as the reference parsers
    // keep it (issue 45; it was refused).
    assert_eq!(s.validate(&[0x10, 1]), Ok(()));
    // A length that runs past the end, named.
    assert!(s.validate(&[0x0a, 50, b'a']).unwrap_err().to_string().starts_with("/id: "));
    let named =
        Schema::parse(Source { kind: Kind::Protobuf, text: PROTO_BASE.into(), message: Some("demo.Missing".into()) })
            .unwrap_err();
    assert!(named.reason.contains("demo.Missing"));
}

#[test]
fn bad_schemas_are_refused_with_the_cause() {
    let e = Schema::parse(Source { kind: Kind::Json, text: "{".into(), message: None }).unwrap_err();
    assert!(e.to_string().starts_with("json schema: not JSON"), "{e}");
    let e = Schema::parse(Source { kind: Kind::Json, text: r#"{"type":"nope"}"#.into(), message: None }).unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
    let e = Schema::parse(Source { kind: Kind::Avro, text: r#"{"type":"record"}"#.into(), message: None });
    assert!(e.is_err());
    let e = Schema::parse(Source { kind: Kind::Protobuf, text: "message {".into(), message: None }).unwrap_err();
    assert!(e.to_string().starts_with("protobuf schema: "), "{e}");
    let e = Schema::parse(Source {
        kind: Kind::Json,
        text: r#"{"$ref":"http://example.com/s.json"}"#.into(),
        message: None,
    });
    assert!(e.is_err(), "a remote reference is never fetched");
    assert_eq!("full-transitive".parse::<Compatibility>(), Ok(Compatibility::FullTransitive));
    assert!("sideways".parse::<Compatibility>().unwrap_err().contains("backward"));
}

/// Issue 45: what Schema Registry serializers put before a payload. Confluent's wire format:
/// magic byte 0, the schema id as a 4-byte big-endian integer, then (Protobuf only) the message
/// indexes as zigzag varints, a count and then each index, with `[0]` written as a lone 0.
#[test]
fn the_confluent_framing_is_read_and_protobuf_message_indexes_name_the_message() {
    assert_eq!(confluent_frame(&[0, 0, 0, 1, 2, 9, 9]), Some((258, &[9u8, 9][..])));
    assert_eq!(confluent_frame(&[0, 0, 0, 1]), None, "cut short");
    assert_eq!(confluent_frame(&[1, 0, 0, 1, 2]), None, "another magic byte");
    let ids = ["00000001aaaaaaaa", "ffffffffffffffff", "0000000000000000"];
    assert_eq!(ids.map(registry_id), [1, 0x7fff_ffff, 1], "31 bits, never 0");

    let text = r#"syntax = "proto3";
        message A { int32 x = 1; }
        message B { message C { string s = 1; } C c = 1; }"#;
    let c = Schema::parse(Source { kind: Kind::Protobuf, text: text.into(), message: Some("B.C".into()) }).unwrap();
    let payload = [0x0a, 0x02, b'h', b'i'];
    // [1, 0]: count 2, then 1 and 0, each zigzag.
    let framed = [&[4u8, 2, 0][..], &payload].concat();
    assert_eq!(c.unframe(&framed).unwrap(), payload);
    let first = c.unframe(&[&[0u8][..], &payload].concat()).unwrap_err();
    assert!(first.reason.contains("names message A, the subject's is B.C"), "{first}");
    assert!(c.unframe(&[4, 2]).unwrap_err().reason.contains("cut short"));
    assert!(c.unframe(&[4, 2, 8]).unwrap_err().reason.contains("name no message"));
    let a = Schema::parse(Source { kind: Kind::Protobuf, text: text.into(), message: None }).unwrap();
    assert_eq!(a.unframe(&[0, 8, 1]).unwrap(), [8, 1], "[0] as a lone zero: the file's first message");
    let json = schema(Kind::Json, JSON_BASE);
    assert_eq!(json.unframe(b"{}").unwrap(), b"{}", "no indexes but Protobuf's");

    // A subject that is the whole file takes any of its messages the indexes name, checked as
    // that message: bytes that are no UTF-8 in field 1 are a bad B.C (a string there) and a
    // good A (an int32 there: another wire type, kept as an unknown field).
    assert_eq!(a.unframe(&framed).unwrap(), payload);
    assert_eq!(a.validate_framed(&framed), Ok(()));
    let not_utf8 = [0x0a, 0x02, 0xff, 0xfe];
    let as_c = a.validate_framed(&[&[4u8, 2, 0][..], &not_utf8].concat()).unwrap_err();
    assert!(as_c.to_string().contains("/s"), "{as_c}");
    assert_eq!(a.validate_framed(&[&[0u8][..], &not_utf8].concat()), Ok(()));
    assert!(c.validate_framed(&[&[0u8][..], &payload].concat()).is_err(), "a named message takes no other");
}

/// Issue 45: the framing the bridge writes before a record's payload (`[registry]
/// frame_classes`) is the one Confluent's serializers write, and reads back as the same
/// message: for Protobuf with the indexes of the subject's message (nested B.C is [1, 0]).
#[test]
fn the_confluent_prefix_is_what_the_serializers_write() {
    let text = r#"syntax = "proto3";
        message A { int32 x = 1; }
        message B { message C { string s = 1; } C c = 1; }"#;
    let proto = |message: Option<&str>| {
        Schema::parse(Source { kind: Kind::Protobuf, text: text.into(), message: message.map(Into::into) }).unwrap()
    };
    assert_eq!(proto(None).confluent_prefix(258), [0, 0, 0, 1, 2, 0]);
    assert_eq!(proto(Some("B")).confluent_prefix(1), [0, 0, 0, 0, 1, 2, 2]);
    let c = proto(Some("B.C"));
    let prefix = c.confluent_prefix(7);
    assert_eq!(prefix, [0, 0, 0, 0, 7, 4, 2, 0]);
    let payload = [0x0a, 0x02, b'h', b'i'];
    let framed = [&prefix[..], &payload].concat();
    let (id, body) = confluent_frame(&framed).unwrap();
    assert_eq!((id, c.unframe(body).unwrap()), (7, &payload[..]));
    assert_eq!(schema(Kind::Json, JSON_BASE).confluent_prefix(9), [0, 0, 0, 0, 9], "no indexes but Protobuf's");
}

/// Issue 45: Confluent's Protobuf serializers register a schema as its file's
/// `FileDescriptorProto` in base64 and read it back so (`format=serialized`): such a schema
/// compiles as the file it describes, validates alike, and gives the same back.
#[test]
fn a_protobuf_schema_in_base64_descriptor_form_is_the_file_it_describes() {
    let text = r#"syntax = "proto3";
        package shop;
        import "google/protobuf/timestamp.proto";
        message Order { string id = 1; repeated Line lines = 2; google.protobuf.Timestamp at = 3; }
        message Line { string sku = 1; int32 count = 2; }"#;
    let from_text = Schema::parse(Source { kind: Kind::Protobuf, text: text.into(), message: None }).unwrap();
    let serialized = from_text.serialized().expect("Protobuf has a serialized form");
    assert!(!serialized.contains(char::is_whitespace));
    let from_descriptor =
        Schema::parse(Source { kind: Kind::Protobuf, text: serialized.clone(), message: None }).unwrap();
    assert_eq!(from_descriptor.serialized().as_deref(), Some(serialized.as_str()));
    // Order { id: "7", lines: [{ sku: "a", count: 2 }] }, then one with a line's count a string.
    let good = [0x0a, 1, b'7', 0x12, 5, 0x0a, 1, b'a', 0x10, 2];
    let bad = [0x0a, 1, b'7', 0x12, 4, 0x0a, 1, 0xff, 0x10];
    for s in [&from_text, &from_descriptor] {
        assert_eq!(s.validate(&good), Ok(()));
        let refused = s.validate(&bad).unwrap_err();
        assert!(refused.to_string().contains("lines"), "{refused}");
    }
    let again = Schema::parse(Source { kind: Kind::Protobuf, text: text.into(), message: None }).unwrap();
    assert!(check(Compatibility::Full, &from_descriptor, &[again]).is_ok());
    assert_eq!(schema(Kind::Json, JSON_BASE).serialized(), None);
    // Base64 that is no descriptor is taken as text, and named as such.
    let junk = Schema::parse(Source { kind: Kind::Protobuf, text: "bm90IGEgZGVzY3JpcHRvcg==".into(), message: None });
    assert!(junk.is_err());
}

/// Issue 45: the earlier versions a producer may still write under each mode.
#[test]
fn each_mode_says_which_earlier_versions_are_still_written() {
    let still = |m: Compatibility, n| m.still_written(n).collect::<Vec<_>>();
    assert_eq!(still(Compatibility::Backward, 3), [2]);
    assert_eq!(still(Compatibility::Full, 3), [2]);
    assert_eq!(still(Compatibility::BackwardTransitive, 3), [2, 1, 0]);
    assert_eq!(still(Compatibility::FullTransitive, 20).len(), MAX_WRITERS, "bounded, the newest kept");
    assert_eq!(still(Compatibility::FullTransitive, 20)[0], 19);
    for m in [Compatibility::None, Compatibility::Forward, Compatibility::ForwardTransitive] {
        assert!(still(m, 3).is_empty(), "{m}");
    }
    assert!(still(Compatibility::Backward, 0).is_empty());
}

/// Issue 45: an Avro schema differing only in a field's default is another schema (Confluent
/// keeps it as another version; the Parsing Canonical Form drops defaults, and the usual
/// add-a-default-then-remove-the-field path was blocked by "already version 1"). Documentation
/// is not identity. Versions registered before keep the id derived then (`Schema::is`).
#[test]
fn avro_identity_takes_defaults_in_and_leaves_docs_out() {
    let text =
        |extra: &str| format!(r#"{{"type":"record","name":"R","fields":[{{"name":"a","type":"long"{extra}}}]}}"#);
    let plain = schema(Kind::Avro, &text(""));
    let defaulted = schema(Kind::Avro, &text(r#","default":0"#));
    let documented = schema(Kind::Avro, &text(r#","doc":"metres""#));
    assert_ne!(plain.id(), defaulted.id(), "a default makes another schema");
    assert_eq!(plain.id(), documented.id(), "a doc does not");
    let pcf = content_id(Kind::Avro, r#"{"name":"R","type":"record","fields":[{"name":"a","type":"long"}]}"#);
    assert!(plain.is(&pcf) && defaulted.is(&pcf), "the earlier derivation is still recognised");
    assert!(!plain.is(defaulted.id()));
}

/// Issue 45: a Protobuf refusal names the field, as JSON's and Avro's do; a known field sent
/// with another wire type is kept as an unknown field, as Protobuf's reference parsers keep it
/// (the encoding guide: a parser skips what it cannot read as the declared type).
#[test]
fn protobuf_refusals_name_the_field_and_another_wire_type_is_an_unknown_field() {
    let text = r#"syntax = "proto3";
        message Detection { string label = 1; float score = 2; }
        message Frame { string text = 1; repeated Detection boxes = 2; int32 n = 3; repeated sint32 xs = 4; }
        message Node { Node child = 1; }"#;
    let frame =
        Schema::parse(Source { kind: Kind::Protobuf, text: text.into(), message: Some("Frame".into()) }).unwrap();
    let refused = |payload: &[u8]| frame.validate(payload).unwrap_err().to_string();
    let bad_text = refused(&[0x0a, 2, 0xff, 0xfe]);
    assert!(bad_text.starts_with("/text: not valid UTF-8"), "{bad_text}");
    let boxes = [0x12, 3, 0x0a, 1, b'a', 0x12, 3, 0x0a, 5, b'b'];
    assert_eq!(refused(&boxes), "/boxes/1/label: a string of 5 bytes runs past the end (1 left)");
    assert!(refused(&[0x0a, 9, b'x']).starts_with("/text: a string of 9 bytes runs past the end"));
    assert!(refused(&[0x27]).contains("wire type 7, which does not exist"));
    assert!(refused(&[0x22, 2, 0x80]).starts_with("/xs/0: "), "packed values cut short");
    assert!(refused(&[0x1c]).contains("end of group 3"));
    // `n` (int32) sent length-delimited: an unknown field, taken.
    assert_eq!(frame.validate(&[0x1a, 1, 5, 0x0a, 2, b'o', b'k']), Ok(()));
    assert_eq!(frame.validate(&[0x22, 2, 2, 3, 0x20, 4]), Ok(()), "packed and not");
    // Nesting bounded (prost's limit too).
    let node = Schema::parse(Source { kind: Kind::Protobuf, text: text.into(), message: Some("Node".into()) }).unwrap();
    let nested = |depth: usize| {
        let mut inner: Vec<u8> = Vec::new();
        for _ in 0..depth {
            let mut next = vec![0x0a];
            crate::proto::varint::put(&mut next, inner.len() as u64);
            next.extend_from_slice(&inner);
            inner = next;
        }
        inner
    };
    assert_eq!(node.validate(&nested(90)), Ok(()));
    assert!(node.validate(&nested(150)).unwrap_err().reason.contains("nested deeper than 100"));
}

proptest::proptest! {
    /// Our Protobuf walk never refuses what prost's decoder (a maintained implementation of the
    /// wire format) takes: over arbitrary bytes and mutated valid frames, prost's yes is ours.
    #[test]
    fn the_protobuf_walk_takes_whatever_prost_takes(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        flip in 0usize..64,
        to in proptest::prelude::any::<u8>(),
    ) {
        let text = r#"syntax = "proto3";
            message Detection { string label = 1; float score = 2; map<string, int64> tags = 3; }
            message Frame { string text = 1; repeated Detection boxes = 2; int32 n = 3; repeated sint32 xs = 4;
                            bytes raw = 5; fixed64 at = 6; Detection top = 7; }"#;
        let schema = Schema::parse(Source { kind: Kind::Protobuf, text: text.into(), message: Some("Frame".into()) })
            .unwrap();
        let Compiled::Protobuf(p) = &schema.compiled else { unreachable!() };
        let mut valid = vec![0x0a, 2, b'h', b'i', 0x12, 7, 0x0a, 1, b'a', 0x15, 0, 0, 0x80, 0x3f, 0x18, 5];
        valid.extend_from_slice(&[0x22, 2, 3, 4, 0x2a, 1, 9, 0x31, 1, 2, 3, 4, 5, 6, 7, 8, 0x3a, 0]);
        let at = flip % valid.len();
        valid[at] = to;
        for payload in [bytes, valid] {
            let prost = prost_reflect::DynamicMessage::decode(p.message.clone(), &payload[..]).is_ok();
            if prost {
                proptest::prop_assert_eq!(schema.validate(&payload), Ok(()), "{:?}", payload);
            }
        }
    }
}
