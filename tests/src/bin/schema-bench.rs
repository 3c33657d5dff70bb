//! Validation throughput per core, per schema kind (issue 32): the shared trace's telemetry
//! readings (`../shared/data/edge-trace-20k.jsonl`) as JSON text against a JSON Schema, and the
//! same readings encoded as Avro datums and Protobuf messages against the equivalent schemas;
//! also the trace's inference results (nested detections) as JSON. Each case validates its
//! payloads in a loop on one thread for `SECONDS` with the shipped `shared::schema` code and
//! prints one JSON line: validations per second and payload MB/s. Usage:
//! `schema-bench TRACE [SECONDS=2]`.

use std::time::{Duration, Instant};

use anyhow::Context;
use apache_avro::types::Value as AvroValue;
use prost_reflect::{DynamicMessage, Kind as FieldKind, Value as ProtoValue};
use serde_json::Value;
use shared::schema::{Kind, Schema, Source};

const TELEMETRY_JSON: &str = r#"{"type":"object","additionalProperties":false,
 "required":["ts_ns","device","cpu_pct","gpu_temp_c","mem_mb","fps","infer_ms_p99","queue_depth","power_w"],
 "properties":{"ts_ns":{"type":"integer","minimum":0},"device":{"type":"string","maxLength":64},
  "cpu_pct":{"type":"number","minimum":0,"maximum":100},"gpu_temp_c":{"type":"number"},
  "mem_mb":{"type":"integer"},"fps":{"type":"number"},"infer_ms_p99":{"type":"number"},
  "queue_depth":{"type":"integer","minimum":0},"power_w":{"type":"number"}}}"#;

const INFERENCE_JSON: &str = r#"{"type":"object",
 "required":["ts_ns","device","model","version","frame","trace_id","latency_ms","detections"],
 "properties":{"ts_ns":{"type":"integer"},"device":{"type":"string"},"model":{"type":"string"},
  "version":{"type":"string"},"frame":{"type":"integer"},"trace_id":{"type":"string","format":"uuid"},
  "latency_ms":{"type":"number"},
  "detections":{"type":"array","maxItems":64,"items":{"type":"object","required":["cls","conf","bbox"],
   "properties":{"cls":{"type":"string"},"conf":{"type":"number","minimum":0,"maximum":1},
    "bbox":{"type":"array","items":{"type":"integer"},"minItems":4,"maxItems":4}}}}}}"#;

const TELEMETRY_AVRO: &str = r#"{"type":"record","name":"Telemetry","fields":[
 {"name":"ts_ns","type":"long"},{"name":"device","type":"string"},{"name":"cpu_pct","type":"double"},
 {"name":"gpu_temp_c","type":"double"},{"name":"mem_mb","type":"long"},{"name":"fps","type":"double"},
 {"name":"infer_ms_p99","type":"double"},{"name":"queue_depth","type":"long"},{"name":"power_w","type":"double"}]}"#;

const TELEMETRY_PROTO: &str = "syntax = \"proto3\";\npackage edge;\nmessage Telemetry {\n\
  int64 ts_ns = 1; string device = 2; double cpu_pct = 3; double gpu_temp_c = 4; int64 mem_mb = 5;\n\
  double fps = 6; double infer_ms_p99 = 7; int64 queue_depth = 8; double power_w = 9;\n}\n";

fn payloads(trace: &str, prefix: &str) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(trace).with_context(|| trace.to_owned())?;
    let mut out = Vec::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line)?;
        if v["topic"].as_str().is_some_and(|t| t.starts_with(prefix)) {
            out.push(serde_json::from_str(v["payload"].as_str().context("payload")?)?);
        }
    }
    Ok(out)
}

fn avro(schema_text: &str, readings: &[Value]) -> anyhow::Result<Vec<Vec<u8>>> {
    let schema = apache_avro::Schema::parse_str(schema_text)?;
    let apache_avro::Schema::Record(r) = &schema else { anyhow::bail!("a record") };
    readings
        .iter()
        .map(|v| {
            let fields = r
                .fields
                .iter()
                .map(|f| {
                    let x = &v[&f.name];
                    let value = match f.schema {
                        apache_avro::Schema::Long => AvroValue::Long(x.as_i64().unwrap_or_default()),
                        apache_avro::Schema::Double => AvroValue::Double(x.as_f64().unwrap_or_default()),
                        _ => AvroValue::String(x.as_str().unwrap_or_default().to_owned()),
                    };
                    (f.name.clone(), value)
                })
                .collect();
            // The one-value encoder, deprecated for writer objects, is all this needs.
            #[allow(deprecated)]
            let bytes = apache_avro::to_avro_datum(&schema, AvroValue::Record(fields))?;
            Ok(bytes)
        })
        .collect()
}

fn protobuf(readings: &[Value]) -> anyhow::Result<Vec<Vec<u8>>> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("telemetry.proto"), TELEMETRY_PROTO)?;
    let set = protox::compile(["telemetry.proto"], [dir.path()])?;
    let pool = prost_reflect::DescriptorPool::from_file_descriptor_set(set)?;
    let desc = pool.get_message_by_name("edge.Telemetry").context("message")?;
    Ok(readings
        .iter()
        .map(|v| {
            let mut m = DynamicMessage::new(desc.clone());
            for f in desc.fields() {
                let x = &v[f.name()];
                let value = match f.kind() {
                    FieldKind::Int64 => ProtoValue::I64(x.as_i64().unwrap_or_default()),
                    FieldKind::Double => ProtoValue::F64(x.as_f64().unwrap_or_default()),
                    _ => ProtoValue::String(x.as_str().unwrap_or_default().to_owned()),
                };
                m.set_field(&f, value);
            }
            prost_reflect::prost::Message::encode_to_vec(&m)
        })
        .collect())
}

fn run(
    case: &str,
    kind: Kind,
    text: &str,
    message: Option<&str>,
    payloads: &[Vec<u8>],
    seconds: f64,
) -> anyhow::Result<()> {
    let schema = Schema::parse(Source { kind, text: text.into(), message: message.map(str::to_owned) })?;
    // Every payload must be valid: a benchmark of refusals would measure the wrong thing.
    for p in payloads {
        schema.validate(p).map_err(|e| anyhow::anyhow!("{case}: {e}"))?;
    }
    let (mut n, mut bytes) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs_f64(seconds) {
        for p in payloads {
            std::hint::black_box(schema.validate(std::hint::black_box(p)).is_ok());
            bytes += p.len() as u64;
        }
        n += payloads.len() as u64;
    }
    let took = start.elapsed().as_secs_f64();
    let avg = bytes as f64 / n as f64;
    println!(
        "{}",
        serde_json::json!({"case": case, "kind": kind.name(), "validations_per_s": n as f64 / took,
            "mb_per_s": bytes as f64 / took / 1e6, "avg_payload_bytes": avg, "payloads": payloads.len()})
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let trace = args.next().context("usage: schema-bench TRACE [SECONDS]")?;
    let seconds: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2.0);
    let telemetry = payloads(&trace, "telemetry/")?;
    let inference = payloads(&trace, "inference/")?;
    let as_json = |v: &[Value]| v.iter().map(|x| serde_json::to_vec(x).unwrap_or_default()).collect::<Vec<_>>();
    run("telemetry", Kind::Json, TELEMETRY_JSON, None, &as_json(&telemetry), seconds)?;
    run("inference", Kind::Json, INFERENCE_JSON, None, &as_json(&inference), seconds)?;
    run("telemetry", Kind::Avro, TELEMETRY_AVRO, None, &avro(TELEMETRY_AVRO, &telemetry)?, seconds)?;
    run("telemetry", Kind::Protobuf, TELEMETRY_PROTO, Some("edge.Telemetry"), &protobuf(&telemetry)?, seconds)?;
    Ok(())
}
