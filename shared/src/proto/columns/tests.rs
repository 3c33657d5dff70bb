//! Column-wise bodies give back exactly the records they were made of: payloads byte for byte
//! (the shared trace's, JSON edge cases, and any bytes at all), properties, gaps; and a body a
//! peer made up fails with an error within its bound, never a panic or an allocation it claims.

use proptest::prelude::*;

use super::*;
use crate::proto::record::GapReason;

pub(crate) fn msg(seq: u64, topic: &str, payload: &[u8]) -> WireRecord {
    WireRecord::message(
        Seq(seq),
        WireMessage {
            class: "telemetry".into(),
            topic: topic.into(),
            payload: payload.to_vec(),
            qos: 1,
            enqueued_ms: 1_700_000_000_000 + seq * 7,
            expires_ms: None,
            user_properties: Vec::new(),
            correlation_data: None,
            content_type: None,
            schema: None,
        },
    )
}

const FORMATS: [Format; 3] = [Format::V1, Format::V2, Format::V3];

/// Both formats give `records` back; the format 2 body.
fn round_trip(records: &[WireRecord]) -> Vec<u8> {
    let raw = encode(records, Format::V1);
    assert_eq!(decode(&raw, usize::MAX).unwrap(), records);
    let raw = encode(records, Format::V2);
    assert_eq!(decode(&raw, usize::MAX).unwrap(), records);
    raw
}

/// The shared trace's cloud-bound payloads (telemetry, counters, feedback), each enqueued at
/// its trace time (`t`, ns) after a start in ms, as a replay at the trace's pace has them.
fn trace() -> Vec<WireRecord> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/edge-trace-20k.jsonl");
    let text = std::fs::read_to_string(path).expect("the shared trace");
    let mut out = Vec::new();
    for line in text.lines() {
        let field = |name: &str| -> String {
            let at = line.find(&format!("\"{name}\":\"")).unwrap() + name.len() + 4;
            let mut end = at;
            let b = line.as_bytes();
            while b[end] != b'"' {
                end += if b[end] == b'\\' { 2 } else { 1 };
            }
            line[at..end].replace("\\\"", "\"")
        };
        let topic = field("topic");
        if topic.starts_with("inference/") {
            continue;
        }
        let t: u64 = line[5..line.find(',').unwrap()].parse().unwrap();
        let mut r = msg(out.len() as u64 + 1, &topic, field("payload").as_bytes());
        if let RecordBody::Message(m) = &mut r.body {
            m.enqueued_ms = 1_764_800_000_000 + t / 1_000_000;
        }
        out.push(r);
    }
    out
}

#[test]
fn the_shared_traces_payloads_come_back_byte_for_byte_and_much_smaller() {
    let records = trace();
    assert!(records.len() > 5000);
    for batch in records.chunks(500) {
        let raw = round_trip(batch);
        let mut cbor = Vec::new();
        ciborium::into_writer(batch, &mut cbor).unwrap();
        let z = |b: &[u8]| zstd::bulk::compress(b, 3).unwrap().len();
        // 500 records: about 0.51 of the rows' size after zstd in format 1, 0.42 in format 2.
        let v1 = z(&encode(batch, Format::V1));
        assert!(v1 * 10 < z(&cbor) * 6, "format 1 {v1} vs rows {} after zstd", z(&cbor));
        assert!(z(&raw) * 10 < v1 * 9, "format 2 {} vs format 1 {v1} after zstd", z(&raw));
    }
}

#[test]
fn json_that_would_not_come_back_exactly_travels_whole() {
    let cases: &[&[u8]] = &[
        br#"{"a":1}"#,
        br#"{"a":-0.05,"b":0.0,"c":10,"d":-7,"e":123456789012345678}"#,
        br#"{"a":1e5}"#,
        br#"{"a":-0}"#,
        br#"{"a":01}"#,
        br#"{"a":1234567890123456789}"#,
        br#"{"a": 1}"#,
        br#"{"a":1} "#,
        br#"{"k\"ey":"v\\\"al\u00e9","t":true,"f":false,"n":null,"x":[1,[2,{}],[]]}"#,
        "{\"s\":\"é😀\"}".as_bytes(),
        b"[]",
        b"{}",
        b"42",
        b"\"just a string\"",
        b"",
        b"\x00\xff{",
        br#"{"a":"unterminated}"#,
        br#"{"a":1,}"#,
        br#"{"a":1.}"#,
        br#"{"a":.5}"#,
    ];
    let records: Vec<WireRecord> = cases.iter().enumerate().map(|(i, p)| msg(i as u64 + 1, "t/x", p)).collect();
    round_trip(&records);
}

#[test]
fn properties_gaps_and_classes_come_back() {
    let mut a = msg(3, "a/b", br#"{"v":1}"#);
    if let RecordBody::Message(m) = &mut a.body {
        m.expires_ms = Some(9);
        m.user_properties = vec![("traceparent".into(), "00-ab-cd-01".into()), ("k".into(), String::new())];
        m.correlation_data = Some(vec![0, 1, 2]);
        m.content_type = Some("application/json".into());
        m.class = "replies".into();
        m.qos = 0;
    }
    let gap = WireRecord::gap(
        Seq(7),
        WireGap { class: "telemetry".into(), reason: GapReason::Evicted, ranges: vec![(4, 6)], count: 3 },
    );
    round_trip(&[msg(1, "a/b", br#"{"v":2}"#), a, gap, msg(9, "a/c", b"raw")]);
}

/// The schema each message was validated against comes back with it, whichever of its
/// neighbours name one (a batch table in format 2, the properties in format 1).
#[test]
fn schemas_come_back_with_their_messages() {
    let named = |seq: u64, schema: Option<&str>| {
        let mut r = msg(seq, "t/x", format!(r#"{{"v":{seq}}}"#).as_bytes());
        if let RecordBody::Message(m) = &mut r.body {
            m.schema = schema.map(|s| s.parse().unwrap());
        }
        r
    };
    let records = [
        named(1, None),
        named(2, Some("telemetry/1/0123456789abcdef")),
        named(3, None),
        named(4, Some("telemetry/2/fedcba9876543210")),
        named(5, Some("telemetry/1/0123456789abcdef")),
        named(6, None),
    ];
    round_trip(&records);
    // An id a made-up body names beyond its table, or a table entry that is no schema, is refused.
    let mut bad = records.clone();
    if let RecordBody::Message(m) = &mut bad[1].body {
        m.schema.as_mut().unwrap().subject = "tele\r\nX-Injected: 1".into();
    }
    assert!(decode(&encode(&bad, Format::V2), usize::MAX).is_err());
    assert!(decode(&encode(&bad, Format::V1), usize::MAX).is_err());
}

#[test]
fn a_made_up_body_is_refused_within_its_bound() {
    let records: Vec<WireRecord> =
        (1..=50).map(|i| msg(i, "t/x", format!(r#"{{"v":{i},"s":"{}"}}"#, "x".repeat(100)).as_bytes())).collect();
    for f in FORMATS {
        let raw = encode(&records, f);
        assert!(matches!(decode(&raw, 1000), Err(ProtoError::TooLargeDecompressed { .. })));
        for cut in 0..raw.len() {
            assert!(decode(&raw[..cut], usize::MAX).is_err(), "a body cut at {cut} is refused");
        }
        // A head claiming a billion records in a few bytes.
        let mut lie = vec![f.byte()];
        put_varint(&mut lie, 1 << 30);
        assert!(decode(&lie, usize::MAX).is_err());
    }
}

fn json_value(depth: u32) -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        (any::<i32>(), 0u32..6).prop_map(|(m, s)| format!(
            "{}.{:0width$}",
            m / 10,
            (m % 10).unsigned_abs(),
            width = s as usize + 1
        )),
        "[a-z\\\\\"é ]{0,8}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
        Just("true".to_owned()),
        Just("null".to_owned()),
        any::<f64>().prop_map(|f| serde_json::to_string(&f).unwrap_or_default()),
    ];
    if depth == 0 {
        return leaf.boxed();
    }
    prop_oneof![
        leaf,
        prop::collection::vec(("[a-z]{1,4}", json_value(depth - 1)), 0..5).prop_map(|kv| {
            let body: Vec<String> = kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", body.join(","))
        }),
        prop::collection::vec(json_value(depth - 1), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any payload, JSON or not, comes back exactly.
    #[test]
    fn any_payloads_round_trip(
        payloads in prop::collection::vec(prop_oneof![
            json_value(3).prop_map(String::into_bytes),
            prop::collection::vec(any::<u8>(), 0..64),
        ], 1..40),
        steps in prop::collection::vec(1u64..5, 40),
    ) {
        let mut seq = 0;
        let records: Vec<WireRecord> = payloads.iter().zip(steps).map(|(p, s)| {
            seq += s;
            msg(seq, if seq % 2 == 0 { "a/b" } else { "a/c" }, p)
        }).collect();
        for f in FORMATS {
            let raw = encode(&records, f);
            prop_assert_eq!(&decode(&raw, usize::MAX).unwrap(), &records);
        }
    }

    /// Bytes a peer made up: an error or records, never a panic.
    #[test]
    fn made_up_bytes_never_panic(raw in prop::collection::vec(any::<u8>(), 0..512), flip in any::<(usize, u8)>()) {
        let _ = decode(&raw, 1 << 20);
        let records: Vec<WireRecord> = (1..=20).map(|i| msg(i, "t", format!(r#"{{"v":{i},"s":"ab"}}"#).as_bytes())).collect();
        for f in FORMATS {
            let mut good = encode(&records, f);
            let at = flip.0 % good.len();
            good[at] ^= flip.1 | 1;
            let _ = decode(&good, 1 << 20);
        }
        let pairs: Vec<WireRecord> =
            (1..=8).map(|i| with_schema(msg(i, "t", &[2, i as u8, 0xff, 3, 1, 1, b'a', 0xfe, 3, 1, b'z']))).collect();
        let mut good = encode_with(&pairs, Format::V3, &Pairs);
        let at = flip.0 % good.len();
        good[at] ^= flip.1 | 1;
        let _ = decode(&good, 1 << 20);
    }
}

/// A walk by a made-up schema: pairs of a tag byte and a varint (even tags) or a string with a
/// one-byte length (odd tags); tag 0xff opens a part (its varint length after it), 0xfe closes
/// it. Enough to exercise every op without a real schema.
#[derive(Debug)]
pub(crate) struct Pairs;

impl Shapes for Pairs {
    fn cut<'p>(&self, _: &SchemaRef, mut p: &'p [u8], out: &mut Shaper<'p>) -> bool {
        while let Some((&tag, rest)) = p.split_first() {
            p = rest;
            match tag {
                0xff => {
                    let Ok(_) = crate::proto::varint::take(&mut p) else { return false };
                    out.open();
                }
                0xfe => out.close(),
                t if t % 2 == 0 => {
                    out.lit(&[t]);
                    let Ok(v) = crate::proto::varint::take(&mut p) else { return false };
                    out.int(v as i64, Int::Varint);
                }
                t => {
                    out.lit(&[t]);
                    let Some((&n, rest)) = p.split_first() else { return false };
                    let Some(s) = rest.get(..usize::from(n)) else { return false };
                    p = &rest[usize::from(n)..];
                    out.bytes(s, Len::Varint);
                }
            }
        }
        true
    }
}

pub(crate) fn with_schema(mut r: WireRecord) -> WireRecord {
    if let RecordBody::Message(m) = &mut r.body {
        m.schema = Some(SchemaRef { subject: "pairs".into(), version: 1, id: "0123456789abcdef".into() });
    }
    r
}

#[test]
fn binary_shapes_come_back_and_a_made_up_one_is_refused() {
    let payloads: Vec<Vec<u8>> = vec![
        vec![2, 0x96, 0x01, 3, 2, b'h', b'i'],
        vec![2, 7, 3, 2, b'y', b'o'],
        // A part: its length (here 4) is written back from what it holds.
        vec![4, 1, 0xff, 4, 6, 9, 5, 0, 0xfe],
        // An overlong varint: would come back shorter, so it goes whole.
        vec![2, 0x81, 0x00],
        b"not pairs at all".to_vec(),
    ];
    let records: Vec<WireRecord> =
        payloads.iter().enumerate().map(|(i, p)| with_schema(msg(i as u64 + 1, "t", p))).collect();
    let raw = encode_with(&records, Format::V3, &Pairs);
    assert_eq!(decode(&raw, usize::MAX).unwrap(), records);
    assert!(matches!(decode(&raw, 300), Err(ProtoError::TooLargeDecompressed { .. })));
    for cut in 0..raw.len() {
        assert!(decode(&raw[..cut], usize::MAX).is_err(), "a body cut at {cut} is refused");
    }
    // Formats 1 and 2 never take a binary payload apart.
    assert_eq!(encode_with(&records, Format::V2, &Pairs), encode(&records, Format::V2));

    // Shapes a peer made up.
    let mut open = vec![bin::BIN];
    open.extend(std::iter::repeat_n(1u8, bin::MAX_OPEN + 1));
    open.extend(std::iter::repeat_n(2u8, bin::MAX_OPEN + 1));
    assert!(bin::ops(&open).unwrap_err().contains("deeper"));
    assert!(bin::ops(&[bin::BIN, 1]).unwrap_err().contains("left open"));
    assert!(bin::ops(&[bin::BIN, 2]).unwrap_err().contains("not open"));
    assert!(bin::ops(&[bin::BIN, 0, 5, 1]).unwrap_err().contains("literal"));
    assert!(bin::ops(&[bin::BIN, 99]).unwrap_err().contains("op 99"));
    // A string where the shape writes an integer.
    let mut out = Vec::new();
    let ops = bin::ops(&[bin::BIN, 4]).unwrap();
    assert!(bin::render(&ops, &mut out, (100, 100), || Ok(Val::Str(b"x"))).is_err());
}

/// The trace as the uplink sends it by default: per class, batches of about 50 records (a
/// second's linger), each its own zstd frame. Format 2 with a dictionary of the table entries
/// the class's first 150 records repeat comes to about 0.115 of topic and payload bytes (the
/// dictionary's bytes counted), format 2 alone 0.127, format 1 0.153.
#[test]
fn short_batches_of_the_trace_shrink_with_format_2_and_a_dictionary_of_their_tables() {
    let mut by_class: std::collections::BTreeMap<String, Vec<WireRecord>> = Default::default();
    let mut raw = 0;
    for mut r in trace() {
        let RecordBody::Message(m) = &mut r.body else { continue };
        raw += m.topic.len() + m.payload.len();
        m.class = m.topic.split('/').next().unwrap_or_default().to_owned();
        by_class.entry(m.class.clone()).or_default().push(r);
    }
    let (mut v1, mut v2, mut with_dict) = (0, 0, 0);
    for records in by_class.values() {
        let dict = dictionary(&records[..150.min(records.len())], 4096);
        with_dict += dict.len();
        let mut packer = zstd::bulk::Compressor::with_dictionary(3, &dict).unwrap();
        for b in records.chunks(50) {
            v1 += zstd::bulk::compress(&encode(b, Format::V1), 3).unwrap().len();
            let body = encode(b, Format::V2);
            v2 += zstd::bulk::compress(&body, 3).unwrap().len();
            let packed = packer.compress(&body).unwrap();
            let mut back = zstd::bulk::Decompressor::with_dictionary(&dict).unwrap();
            assert_eq!(decode(&back.decompress(&packed, 1 << 20).unwrap(), usize::MAX).unwrap(), b);
            with_dict += packed.len();
        }
    }
    let ratio = |n: usize| n as f64 / raw as f64;
    println!("{} {} {}", ratio(v1), ratio(v2), ratio(with_dict));
    assert!(
        ratio(v1) < 0.16 && ratio(v2) < 0.133 && ratio(with_dict) < 0.12,
        "{} {} {}",
        ratio(v1),
        ratio(v2),
        ratio(with_dict)
    );
    assert!(with_dict < v2 && v2 < v1);
}

#[test]
fn a_dictionary_holds_what_repeats_most_last_and_fits_its_size() {
    let records: Vec<WireRecord> = (1..=40)
        .map(|i| {
            msg(i, &format!("t/{}", i % 4), format!(r#"{{"dev":"cam-{}","trace":"u{i}","v":{i}}}"#, i % 3).as_bytes())
        })
        .collect();
    let d = dictionary(&records, 4096);
    let text = String::from_utf8_lossy(&d);
    assert!(text.contains("cam-0") && text.contains("t/1") && text.contains("telemetry"), "{text:?}");
    assert!(!text.contains("u7"), "a string seen once is left out: {text:?}");
    // The class and the shape are in every record: the most repeated, last.
    assert!(d.ends_with(b"telemetry") || d.ends_with(b"}"), "{text:?}");
    assert!(text.find("cam-0") < text.find("telemetry"), "{text:?}");
    assert!(dictionary(&records, 20).len() <= 20);
    assert!(dictionary(&records[..1], 4096).is_empty(), "nothing repeats in one record");
}
