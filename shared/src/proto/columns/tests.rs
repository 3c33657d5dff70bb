//! Column-wise bodies give back exactly the records they were made of: payloads byte for byte
//! (the shared trace's, JSON edge cases, and any bytes at all), properties, gaps; and a body a
//! peer made up fails with an error within its bound, never a panic or an allocation it claims.

use proptest::prelude::*;

use super::*;
use crate::proto::record::GapReason;

fn msg(seq: u64, topic: &str, payload: &[u8]) -> WireRecord {
    WireRecord::message(
        seq,
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
        },
    )
}

fn round_trip(records: &[WireRecord]) -> Vec<u8> {
    let raw = encode(records);
    assert_eq!(decode(&raw, usize::MAX).unwrap(), records);
    raw
}

/// The shared trace's cloud-bound payloads (telemetry, counters, feedback).
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
        out.push(msg(out.len() as u64 + 1, &topic, field("payload").as_bytes()));
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
        // 500 records: about 0.51 of the rows' size after zstd, 0.12 of topic and payload bytes.
        assert!(z(&raw) * 10 < z(&cbor) * 6, "columns {} vs rows {} after zstd", z(&raw), z(&cbor));
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
        7,
        WireGap { class: "telemetry".into(), reason: GapReason::Evicted, ranges: vec![(4, 6)], count: 3 },
    );
    round_trip(&[msg(1, "a/b", br#"{"v":2}"#), a, gap, msg(9, "a/c", b"raw")]);
}

#[test]
fn a_made_up_body_is_refused_within_its_bound() {
    let records: Vec<WireRecord> =
        (1..=50).map(|i| msg(i, "t/x", format!(r#"{{"v":{i},"s":"{}"}}"#, "x".repeat(100)).as_bytes())).collect();
    let raw = encode(&records);
    assert!(matches!(decode(&raw, 1000), Err(ProtoError::TooLargeDecompressed { .. })));
    for cut in 0..raw.len() {
        assert!(decode(&raw[..cut], usize::MAX).is_err(), "a body cut at {cut} is refused");
    }
    // A head claiming a billion records in a few bytes.
    let mut lie = vec![FORMAT];
    put_varint(&mut lie, 1 << 30);
    assert!(decode(&lie, usize::MAX).is_err());
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
        let raw = encode(&records);
        prop_assert_eq!(decode(&raw, usize::MAX).unwrap(), records);
    }

    /// Bytes a peer made up: an error or records, never a panic.
    #[test]
    fn made_up_bytes_never_panic(raw in prop::collection::vec(any::<u8>(), 0..512), flip in any::<(usize, u8)>()) {
        let _ = decode(&raw, 1 << 20);
        let records: Vec<WireRecord> = (1..=20).map(|i| msg(i, "t", format!(r#"{{"v":{i},"s":"ab"}}"#).as_bytes())).collect();
        let mut good = encode(&records);
        let at = flip.0 % good.len();
        good[at] ^= flip.1 | 1;
        let _ = decode(&good, 1 << 20);
    }
}
