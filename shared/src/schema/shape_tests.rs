//! Format 3 bodies: Avro and Protobuf payloads taken apart by the schema they were validated
//! against come back byte for byte, from payloads the formats' own encoders wrote (`apache-avro`,
//! `prost`) and from any bytes at all; and they pay on the uplink.

use proptest::prelude::*;
use prost::Message as _;
use prost_reflect::{DynamicMessage, Value as PbValue};

use super::*;
use crate::proto::Seq;
use crate::proto::columns::{self, Format, Shaper, Shapes};
use crate::proto::{SchemaRef, WireMessage, WireRecord};

/// The edge's staged versions, as far as a body needs them: the one schema, by its id.
#[derive(Debug)]
struct Staged(Schema);

impl Shapes for Staged {
    fn cut<'p>(&self, schema: &SchemaRef, payload: &'p [u8], out: &mut Shaper<'p>) -> bool {
        schema.id == self.0.id() && self.0.cut(payload, out)
    }
}

fn parse(kind: Kind, text: &str) -> Staged {
    Staged(Schema::parse(Source { kind, text: text.into(), message: None }).unwrap())
}

fn records(s: &Staged, payloads: &[Vec<u8>]) -> Vec<WireRecord> {
    let schema = SchemaRef { subject: "reading".into(), version: 1, id: s.0.id().to_owned() };
    payloads
        .iter()
        .enumerate()
        .map(|(i, p)| {
            WireRecord::message(
                Seq(i as u64 + 1),
                WireMessage {
                    class: "telemetry".into(),
                    topic: "plant/line-1/reading".into(),
                    payload: p.clone(),
                    qos: 1,
                    enqueued_ms: 1_700_000_000_000 + i as u64 * 100,
                    expires_ms: None,
                    user_properties: Vec::new(),
                    correlation_data: None,
                    content_type: None,
                    schema: Some(schema.clone()),
                },
            )
        })
        .collect()
}

/// `payloads` through a format 3 body and back; how many went as a binary shape, and the body.
fn round_trip(s: &Staged, payloads: &[Vec<u8>]) -> (usize, Vec<u8>) {
    let recs = records(s, payloads);
    let body = columns::encode_with(&recs, Format::V3, s);
    assert_eq!(columns::decode(&body, usize::MAX).unwrap(), recs);
    let cut = payloads
        .iter()
        .filter(|p| {
            let mut out = Shaper::default();
            s.0.cut(p, &mut out) && out.holds(p)
        })
        .count();
    (cut, body)
}

const AVRO: &str = r#"{"type":"record","name":"Reading","fields":[
 {"name":"id","type":"string"},
 {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"temp","type":"double"},
 {"name":"gain","type":"float"},
 {"name":"count","type":"int"},
 {"name":"ok","type":"boolean"},
 {"name":"unit","type":{"type":"enum","name":"Unit","symbols":["C","F","K"]}},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"samples","type":{"type":"array","items":"double"}},
 {"name":"tags","type":{"type":"map","values":"long"}},
 {"name":"mac","type":{"type":"fixed","name":"Mac","size":6}},
 {"name":"blob","type":"bytes"}]}"#;

type AvroRow = (String, i64, f64, f32, i32, bool, u32, Option<String>, Vec<f64>, Vec<(String, i64)>, [u8; 6], Vec<u8>);

#[allow(deprecated)] // the datum functions are the shortest way to the crate's encoding of a value
fn avro(r: &AvroRow) -> Vec<u8> {
    use apache_avro::types::Value as V;
    let schema = apache_avro::Schema::parse_str(AVRO).unwrap();
    let (id, at, temp, gain, count, ok, unit, note, samples, tags, mac, blob) = r.clone();
    let value = V::Record(vec![
        ("id".into(), V::String(id)),
        ("at".into(), V::TimestampMillis(at)),
        ("temp".into(), V::Double(temp)),
        ("gain".into(), V::Float(gain)),
        ("count".into(), V::Int(count)),
        ("ok".into(), V::Boolean(ok)),
        ("unit".into(), V::Enum(unit, ["C", "F", "K"][unit as usize].into())),
        ("note".into(), V::Union(u32::from(note.is_some()), Box::new(note.map_or(V::Null, V::String)))),
        ("samples".into(), V::Array(samples.into_iter().map(V::Double).collect())),
        ("tags".into(), V::Map(tags.into_iter().map(|(k, v)| (k, V::Long(v))).collect())),
        ("mac".into(), V::Fixed(6, mac.to_vec())),
        ("blob".into(), V::Bytes(blob)),
    ]);
    apache_avro::to_avro_datum(&schema, value).unwrap()
}

const PROTO: &str = r#"syntax = "proto3";
package demo;
message Reading {
  string id = 1;
  double temp = 2;
  float gain = 3;
  sint64 delta = 4;
  int64 at = 5;
  fixed32 flags = 6;
  sfixed64 offset = 7;
  bool ok = 8;
  Unit unit = 9;
  repeated double samples = 10;
  repeated sint32 steps = 11;
  map<string, int64> tags = 12;
  Where where = 13;
  bytes blob = 14;
}
enum Unit { C = 0; F = 1; K = 2; }
message Where { string site = 1; int32 line = 2; Where inner = 3; }
"#;

type PbRow =
    (String, f64, f32, i64, i64, u32, i64, bool, i32, Vec<f64>, Vec<i32>, Vec<(String, i64)>, Option<(String, i32)>);

fn protobuf(s: &Staged, r: &PbRow) -> Vec<u8> {
    let Compiled::Protobuf(p) = &s.0.compiled else { unreachable!() };
    let (id, temp, gain, delta, at, flags, offset, ok, unit, samples, steps, tags, place) = r.clone();
    let mut m = DynamicMessage::new(p.message.clone());
    m.set_field_by_name("id", PbValue::String(id));
    m.set_field_by_name("temp", PbValue::F64(temp));
    m.set_field_by_name("gain", PbValue::F32(gain));
    m.set_field_by_name("delta", PbValue::I64(delta));
    m.set_field_by_name("at", PbValue::I64(at));
    m.set_field_by_name("flags", PbValue::U32(flags));
    m.set_field_by_name("offset", PbValue::I64(offset));
    m.set_field_by_name("ok", PbValue::Bool(ok));
    m.set_field_by_name("unit", PbValue::EnumNumber(unit));
    m.set_field_by_name("samples", PbValue::List(samples.into_iter().map(PbValue::F64).collect()));
    m.set_field_by_name("steps", PbValue::List(steps.into_iter().map(PbValue::I32).collect()));
    m.set_field_by_name(
        "tags",
        PbValue::Map(tags.into_iter().map(|(k, v)| (prost_reflect::MapKey::String(k), PbValue::I64(v))).collect()),
    );
    if let Some((site, line)) = place {
        let desc = p.message.parent_pool().get_message_by_name("demo.Where").unwrap();
        let mut w = DynamicMessage::new(desc.clone());
        w.set_field_by_name("site", PbValue::String(site));
        w.set_field_by_name("line", PbValue::I32(line));
        let mut inner = DynamicMessage::new(desc);
        inner.set_field_by_name("line", PbValue::I32(line.wrapping_add(1)));
        w.set_field_by_name("inner", PbValue::Message(inner));
        m.set_field_by_name("where", PbValue::Message(w));
    }
    m.encode_to_vec()
}

/// A reading as a sensor gives one: a few sites and units, temperatures to a tenth.
fn avro_reading(i: u64) -> AvroRow {
    (
        format!("cam-{}", i % 4),
        1_700_000_000_000 + i as i64 * 100,
        20.0 + (i % 37) as f64 / 10.0,
        0.5,
        (i % 1000) as i32,
        !i.is_multiple_of(5),
        (i % 2) as u32,
        i.is_multiple_of(10).then(|| "recalibrated".to_owned()),
        vec![1.5, 2.25, (i % 9) as f64],
        vec![("line".into(), 3), ("shift".into(), (i / 100) as i64)],
        [0xde, 0xad, 0xbe, 0xef, 0, (i % 3) as u8],
        vec![],
    )
}

fn pb_reading(i: u64) -> PbRow {
    (
        format!("cam-{}", i % 4),
        20.0 + (i % 37) as f64 / 10.0,
        0.5,
        (i % 7) as i64 - 3,
        1_700_000_000_000 + i as i64 * 100,
        (i % 4) as u32,
        -5,
        !i.is_multiple_of(5),
        (i % 3) as i32,
        vec![1.5, (i % 9) as f64],
        vec![-1, 2, (i % 5) as i32],
        vec![("line".into(), 3)],
        Some(("plant-a".into(), 7)),
    )
}

/// Whether a float has a decimal a shape holds: finite, not `-0.0`, at most 18 digits.
fn fits(text: String, finite: bool, minus_zero: bool) -> bool {
    finite && !minus_zero && text.trim_start_matches('-').replace('.', "").len() <= 18
}

fn f64_fits(x: f64) -> bool {
    fits(x.to_string(), x.is_finite(), x == 0.0 && x.is_sign_negative())
}

fn f32_fits(x: f32) -> bool {
    fits(x.to_string(), x.is_finite(), x == 0.0 && x.is_sign_negative())
}

/// Doubles as readings are (a few decimals) and as anything at all.
fn double() -> impl Strategy<Value = f64> {
    prop_oneof![any::<i32>().prop_map(|i| f64::from(i) / 100.0), any::<f64>()]
}

fn single() -> impl Strategy<Value = f32> {
    prop_oneof![(-10_000i32..10_000).prop_map(|i| i as f32 / 8.0), any::<f32>()]
}

fn compressed(body: &[u8]) -> usize {
    zstd::bulk::compress(body, 3).unwrap().len()
}

#[test]
fn readings_go_as_shapes_and_take_fewer_bytes_than_whole_payloads() {
    let s = parse(Kind::Avro, AVRO);
    let payloads: Vec<Vec<u8>> = (0..200).map(|i| avro(&avro_reading(i))).collect();
    let (cut, v3) = round_trip(&s, &payloads);
    assert_eq!(cut, payloads.len(), "every canonical Avro reading is taken apart");
    let v2 = columns::encode(&records(&s, &payloads), Format::V2);
    let (a, b) = (compressed(&v3), compressed(&v2));
    let raw: usize = payloads.iter().map(Vec::len).sum();
    eprintln!("Avro, 200 readings of {raw} bytes: format 3 {a} bytes after zstd, format 2 {b}");
    assert!(a * 10 < b * 8, "Avro: format 3 {a} bytes, format 2 {b}");

    let s = Staged(
        Schema::parse(Source { kind: Kind::Protobuf, text: PROTO.into(), message: Some("demo.Reading".into()) })
            .unwrap(),
    );
    let payloads: Vec<Vec<u8>> = (0..200).map(|i| protobuf(&s, &pb_reading(i))).collect();
    let (cut, v3) = round_trip(&s, &payloads);
    assert_eq!(cut, payloads.len(), "every Protobuf reading is taken apart");
    let v2 = columns::encode(&records(&s, &payloads), Format::V2);
    let (a, b) = (compressed(&v3), compressed(&v2));
    let raw: usize = payloads.iter().map(Vec::len).sum();
    eprintln!("Protobuf, 200 readings of {raw} bytes: format 3 {a} bytes after zstd, format 2 {b}");
    assert!(a * 10 < b * 8, "Protobuf: format 3 {a} bytes, format 2 {b}");
}

#[test]
fn what_would_not_come_back_exactly_goes_whole() {
    let s = parse(Kind::Avro, AVRO);
    let good = avro(&avro_reading(1));
    // The id's length written as an overlong varint (0x0a as 0x8a 0x00): valid Avro, but put
    // back it would be one byte shorter.
    let mut overlong = vec![0x8a, 0x00];
    overlong.extend_from_slice(&good[1..]);
    assert!(s.0.validate(&overlong).is_ok());
    // -0.0 and NaN have no decimal that gives them back.
    let mut row = avro_reading(2);
    row.2 = -0.0;
    let minus_zero = avro(&row);
    row.2 = f64::NAN;
    let nan = avro(&row);
    let (cut, _) = round_trip(&s, &[good, overlong, minus_zero, nan]);
    assert_eq!(cut, 1);
    // A schema this side does not hold: whole.
    let other = parse(Kind::Avro, r#""long""#);
    let recs = records(&other, &[vec![2]]);
    let body = columns::encode_with(&recs, Format::V3, &s);
    assert_eq!(columns::decode(&body, usize::MAX).unwrap(), recs);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_avro_reading_comes_back_byte_for_byte(
        rows in prop::collection::vec(((
            "[a-z0-9-]{0,12}", any::<i64>(), double(), single(), any::<i32>(), any::<bool>()), (0u32..3,
            prop::option::of(".{0,8}"), prop::collection::vec(double(), 0..4),
            prop::collection::vec(("[a-z]{1,4}", any::<i64>()), 0..3), any::<[u8; 6]>(),
            prop::collection::vec(any::<u8>(), 0..8)),
        ), 1..12)
    ) {
        let s = parse(Kind::Avro, AVRO);
        let rows: Vec<AvroRow> = rows
            .into_iter()
            .map(|((a, b, c, d, e, f), (g, h, i, j, k, l))| (a, b, c, d, e, f, g, h, i, j, k, l))
            .collect();
        let payloads: Vec<Vec<u8>> = rows.iter().map(avro).collect();
        let (cut, _) = round_trip(&s, &payloads);
        // Every payload the crate wrote is taken apart, unless a float has no decimal for it.
        let fitting = rows.iter().filter(|r| f64_fits(r.2) && f32_fits(r.3) && r.8.iter().all(|x| f64_fits(*x))).count();
        prop_assert_eq!(cut, fitting);
    }

    #[test]
    fn any_protobuf_reading_comes_back_byte_for_byte(
        rows in prop::collection::vec(((
            "[a-z0-9-]{0,12}", double(), single(), any::<i64>(), any::<i64>(), any::<u32>(), any::<i64>()), (
            any::<bool>(), 0i32..3, prop::collection::vec(double(), 0..4),
            prop::collection::vec(any::<i32>(), 0..4), prop::collection::vec(("[a-z]{1,4}", any::<i64>()), 0..3),
            prop::option::of(("[a-z]{0,6}", any::<i32>()))),
        ), 1..12)
    ) {
        let s = Staged(
            Schema::parse(Source { kind: Kind::Protobuf, text: PROTO.into(), message: Some("demo.Reading".into()) })
                .unwrap(),
        );
        let rows: Vec<PbRow> = rows
            .into_iter()
            .map(|((a, b, c, d, e, f, g), (h, i, j, k, l, m))| (a, b, c, d, e, f, g, h, i, j, k, l, m))
            .collect();
        let payloads: Vec<Vec<u8>> = rows.iter().map(|r| protobuf(&s, r)).collect();
        let (cut, _) = round_trip(&s, &payloads);
        // proto3 leaves a singular field equal to zero out, -0.0 too; in a list it is written.
        let fitting = rows
            .iter()
            .filter(|r| (r.1 == 0.0 || f64_fits(r.1)) && (r.2 == 0.0 || f32_fits(r.2)) && r.9.iter().all(|x| f64_fits(*x)))
            .count();
        prop_assert_eq!(cut, fitting);
    }

    /// Bytes that merely claim a schema (the edge validated them, so a walk may still stop
    /// anywhere once a later staged version shares the id) come back as they were.
    #[test]
    fn any_bytes_under_either_schema_come_back(payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..8)) {
        round_trip(&parse(Kind::Avro, AVRO), &payloads);
        let pb = Staged(
            Schema::parse(Source { kind: Kind::Protobuf, text: PROTO.into(), message: Some("demo.Reading".into()) })
                .unwrap(),
        );
        round_trip(&pb, &payloads);
    }
}
