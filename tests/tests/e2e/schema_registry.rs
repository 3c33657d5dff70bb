//! The bridge as a Schema Registry for clients no one here wrote (issue 45): confluent-kafka's
//! `SchemaRegistryClient` registers, looks up, checks compatibility and sets modes over the
//! bridge's REST API; its `AvroSerializer` and `JSONSerializer` make payloads (the Confluent
//! framing: magic byte 0, the 4-byte schema id) that a device publishes over MQTT to a real
//! edge-node bound to the subject; its deserializers read the sink's records back into the same
//! objects, with the bridge as their registry (on the SQLite, JetStream and Kafka sinks). A device staying on version 1 through a backward
//! compatible change keeps publishing, its records named version 1.

use std::path::Path;
use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, pki, sink_rows};
use e2e_tests::fixtures::{class, with_spool};
use e2e_tests::kafka::KafkaBroker;
use e2e_tests::nats::{NatsServer, read_stream};
use e2e_tests::node::{EdgeProcess, config_text};
use rumqttc::QoS;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/schema_registry_client.py");
const SECRET: &str = "ops:a-long-enough-secret";

const AVRO_V1: &str = r#"{"type":"record","name":"Reading","namespace":"plant","fields":[
  {"name":"temp","type":"double"},{"name":"unit","type":"string"}]}"#;
/// A field added with a default: backward compatible.
const AVRO_V2: &str = r#"{"type":"record","name":"Reading","namespace":"plant","fields":[
  {"name":"temp","type":"double"},{"name":"unit","type":"string"},{"name":"site","type":"string","default":"none"}]}"#;
/// A field added without a default: version 2 cannot read what version 1 wrote.
const AVRO_BAD: &str = r#"{"type":"record","name":"Reading","namespace":"plant","fields":[
  {"name":"temp","type":"double"},{"name":"unit","type":"string"},{"name":"line","type":"int"}]}"#;
const JSON_V1: &str = r#"{"type":"object","properties":{"label":{"type":"string"},"score":{"type":"number"}},
  "required":["label","score"]}"#;

/// Runs the client script; its JSON answer.
fn sr(args: &[&str]) -> Value {
    let out = std::process::Command::new("python3")
        .arg(SCRIPT)
        .args(args)
        .output()
        .expect("python3 with confluent-kafka (scripts/install-test-deps.sh)");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)))
}

fn file(dir: &Path, name: &str, text: &str) -> String {
    let f = dir.join(name);
    std::fs::write(&f, text).unwrap();
    f.to_str().unwrap().to_owned()
}

/// An edge binding `plant/+/reading` to `reading-value`, `vision/+/box` to `box-value` and
/// `alarm/+/raised` to `alarm-value`.
fn edge(dir: &Path, public: &Path, uplink: &str) -> EdgeProcess {
    std::fs::create_dir_all(dir).unwrap();
    let classes = with_spool(&[
        class("plant", "plant/#", "central"),
        class("vision", "vision/#", "central"),
        class("alarms", "alarm/#", "central"),
    ]);
    let extra = format!(
        "{classes}\n{uplink}\n[models]\ndir = \"models\"\npublic_key = \"{}\"\n\n\
         [[schema]]\ntopic = \"plant/+/reading\"\nsubject = \"reading-value\"\n\
         [[schema]]\ntopic = \"vision/+/box\"\nsubject = \"box-value\"\n\
         [[schema]]\ntopic = \"alarm/+/raised\"\nsubject = \"alarm-value\"\n",
        public.display()
    );
    EdgeProcess::start(dir, &config_text(&extra))
}

fn staged(edge: &EdgeProcess, subject: &str) -> f64 {
    edge.metric(&format!("edge_schema_staged_version{{subject=\"{subject}\"}}"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(h: &Value) -> Vec<u8> {
    let h = h.as_str().unwrap();
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect()
}

/// The `Edge-Schema` header of the sink's row holding `payload`.
fn named(sink: &Path, payload: &[u8]) -> Option<String> {
    let row = sink_rows(sink).into_iter().find(|r| r.payload == payload)?;
    let headers: Vec<(String, String)> = serde_json::from_str(row.headers.as_deref()?).ok()?;
    headers.into_iter().find(|(k, _)| k == "Edge-Schema").map(|(_, v)| v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_clients_register_serialize_through_the_edge_and_deserialize_from_the_sink() {
    round_trip(Sink::Sqlite).await;
}

/// The same on the Kafka sink: a `DeserializingConsumer` (`read_committed`) reads the records
/// topics with the bridge as its registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_deserializers_read_the_kafka_sinks_records_with_the_bridge_as_registry() {
    let broker = KafkaBroker::start();
    round_trip(Sink::Kafka(&broker)).await;
}

/// The same on the JetStream sink: the stream's messages decoded by Confluent's deserializers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_deserializers_read_the_jetstream_sinks_records_with_the_bridge_as_registry() {
    let nats = NatsServer::start();
    round_trip(Sink::Jetstream(&nats)).await;
}

enum Sink<'a> {
    Sqlite,
    Kafka(&'a KafkaBroker),
    Jetstream(&'a NatsServer),
}

async fn round_trip(sink_kind: Sink<'_>) {
    let dir = tempfile::tempdir().unwrap();
    let (private, public, _) = cloud_bridge::models::keygen(&dir.path().join("keys")).unwrap();
    std::fs::write(dir.path().join("registry-creds"), format!("{SECRET}\n")).unwrap();
    let extra = format!(
        "[models]\ndir = \"{}\"\nsigning_key = \"{}\"\npoll = \"200ms\"\n\
         [registry]\napi = \"read-write\"\ncredentials = \"registry-creds\"\nframe_classes = [\"plant\"]\n",
        dir.path().join("store").display(),
        private.display()
    );
    let (keys, bind) = (pki(dir.path(), &[]), "127.0.0.1:0".parse().unwrap());
    let cloud = match &sink_kind {
        Sink::Kafka(k) => {
            let section = format!("kind = \"kafka\"\nbootstrap = \"{}\"\npartitions = 1\n", k.bootstrap());
            TestCloud::start_with_sink(dir.path(), keys, bind, &extra, &section, dir.path().join("unused")).await
        }
        Sink::Jetstream(n) => TestCloud::start_on_jetstream(dir.path(), keys, bind, &extra, &n.url()).await,
        Sink::Sqlite => TestCloud::start(dir.path(), keys, bind, &extra).await,
    };
    let url = format!("http://{}", cloud.bridge.http_addr().unwrap());
    let d = dir.path();
    let (v1, v2, bad, jv1) = (
        file(d, "v1.avsc", AVRO_V1),
        file(d, "v2.avsc", AVRO_V2),
        file(d, "bad.avsc", AVRO_BAD),
        file(d, "j.json", JSON_V1),
    );

    // Writes need the credentials (Confluent's 40101); with them the schema gets its id.
    let refused = sr(&["register", &url, "ops:wrong-secret-of-length", "reading-value", "AVRO", &v1]);
    assert_eq!(
        (refused["http_status"].clone(), refused["error_code"].clone()),
        (json!(401), json!(40101)),
        "{refused}"
    );
    let id1 = sr(&["register", &url, SECRET, "reading-value", "AVRO", &v1])["id"].as_u64().expect("an id");
    assert_eq!(sr(&["lookup", &url, "reading-value", "AVRO", &v1]), json!({ "id": id1, "version": 1 }));
    let jid = sr(&["register", &url, SECRET, "box-value", "JSON", &jv1])["id"].as_u64().expect("an id");

    let edge_dir = d.join("edge");
    let edge = edge(&edge_dir, &public, &cloud.uplink_section_via("edge-1", cloud.bridge.quic_addr()));
    assert!(
        e2e_tests::eventually(WAIT, || staged(&edge, "reading-value") == 1.0 && staged(&edge, "box-value") == 1.0)
            .await,
        "registered over the REST API, delivered to the edge: {}",
        edge.stderr()
    );

    // A device on version 1 publishes what the Avro serializer makes.
    let first = json!([{ "temp": 21.5, "unit": "C" }, { "temp": -3.25, "unit": "F" }]);
    let framed = sr(&["serialize", &url, "reading", "AVRO", &v1, &first.to_string()]);
    let framed: Vec<Vec<u8>> = framed.as_array().unwrap().iter().map(unhex).collect();
    assert!(framed.iter().all(|p| p[0] == 0 && p[1..5] == (id1 as u32).to_be_bytes()), "the Confluent framing");
    let boxes = json!([{ "label": "cat", "score": 0.93 }]);
    let box_payloads: Vec<Vec<u8>> = sr(&["serialize", &url, "box", "JSON", &jv1, &boxes.to_string()])
        .as_array()
        .unwrap()
        .iter()
        .map(unhex)
        .collect();
    assert_eq!(box_payloads[0][1..5], (jid as u32).to_be_bytes());

    // The backward compatible version 2, checked and registered; the bad one refused (409).
    assert_eq!(sr(&["compatible", &url, "reading-value", "AVRO", &bad]), json!({ "is_compatible": false }));
    assert_eq!(sr(&["compatible", &url, "reading-value", "AVRO", &v2]), json!({ "is_compatible": true }));
    assert_eq!(sr(&["register", &url, SECRET, "reading-value", "AVRO", &bad])["error_code"], 409);
    let id2 = sr(&["register", &url, SECRET, "reading-value", "AVRO", &v2])["id"].as_u64().expect("an id");
    assert_ne!(id1, id2);
    assert!(e2e_tests::eventually(WAIT, || staged(&edge, "reading-value") == 2.0).await, "{}", edge.stderr());
    assert_eq!(sr(&["config", &url, SECRET, "reading-value", "FULL"]), json!({ "set": "FULL", "read": "FULL" }));
    // The device still on version 1, and one on version 2.
    let later_v1 = json!([{ "temp": 7.0, "unit": "C" }]);
    let v1_again = unhex(&sr(&["serialize", &url, "reading", "AVRO", &v1, &later_v1.to_string()])[0]);
    let on_v2 = json!([{ "temp": 8.5, "unit": "C", "site": "north" }]);
    let v2_payload = unhex(&sr(&["serialize", &url, "reading", "AVRO", &v2, &on_v2.to_string()])[0]);
    // A device without a serializer: a bare Avro datum of version 1 (temp 9.5, unit "C"), which
    // the bridge writes in the Confluent framing (`frame_classes`), the others as they came.
    let plain: Vec<u8> = [&9.5f64.to_le_bytes()[..], &[0x02, b'C']].concat();
    let plain_object = json!({ "temp": 9.5, "unit": "C" });
    let plain_framed: Vec<u8> = [&[0u8][..], &(id1 as u32).to_be_bytes(), &plain].concat();

    let mut c = Client::anonymous(edge.addr("local"), "devices").await;
    let sends: Vec<(&str, &Vec<u8>)> = framed
        .iter()
        .map(|p| ("plant/line-1/reading", p))
        .chain([
            ("vision/cam-1/box", &box_payloads[0]),
            ("plant/line-1/reading", &v1_again),
            ("plant/line-1/reading", &v2_payload),
            ("plant/line-1/reading", &plain),
        ])
        .collect();
    for (topic, payload) in &sends {
        c.publish(topic, QoS::AtLeastOnce, false, (*payload).clone()).await;
    }
    assert!(c.acked(sends.len(), WAIT).await);
    let valid = |s: &str| edge.metric(&format!("edge_schema_checked_total{{subject=\"{s}\",outcome=\"valid\"}}"));
    assert_eq!((valid("reading-value"), valid("box-value")), (5.0, 1.0), "{}", edge.stderr());

    // Protobuf: the serializer registers its file itself (a base64 FileDescriptorProto, with
    // an import of Google's Timestamp), for both of the file's messages (indexes [0] and [1]).
    let alarms =
        json!([{ "reason": "overheat", "level": 3, "tags": ["line-1", "oven"], "at": "2026-12-06T10:00:00Z" }]);
    let alarm = unhex(&sr(&["proto-serialize", &url, SECRET, "alarm", "Alarm", &alarms.to_string()])[0]);
    let acks = json!([{ "by": "operator-7" }]);
    let ack = unhex(&sr(&["proto-serialize", &url, SECRET, "alarm", "Ack", &acks.to_string()])[0]);
    assert_eq!((alarm[0], &alarm[1..5]), (0, &ack[1..5]), "one subject, one file, one id");
    assert_eq!((alarm[5], &ack[5..7]), (0, &[2u8, 2][..]), "message indexes [0] (a lone 0) and [1]");
    assert!(e2e_tests::eventually(WAIT, || staged(&edge, "alarm-value") == 1.0).await, "{}", edge.stderr());
    // The same framing with a tag that is no UTF-8 is refused (the reason naming the field is
    // `schema::tests`'s and `schemas.rs`'s to check).
    let mut broken = alarm.clone();
    let at = broken.windows(6).position(|w| w == b"line-1").unwrap();
    broken[at] = 0xff;
    for p in [&alarm, &ack, &broken] {
        c.publish("alarm/line-1/raised", QoS::AtLeastOnce, false, p.clone()).await;
    }
    let invalid = || edge.metric("edge_schema_checked_total{subject=\"alarm-value\",outcome=\"invalid\"}");
    assert!(e2e_tests::eventually(WAIT, || valid("alarm-value") == 2.0 && invalid() == 1.0).await, "{}", edge.stderr());

    if let Sink::Jetstream(n) = &sink_kind {
        // Stream EDGE's messages on `edge.edge-1.plant.>`, in order, each with its headers.
        let readings = |messages: &[async_nats::Message]| -> Vec<(String, String)> {
            messages
                .iter()
                .filter(|m| m.subject.contains(".plant."))
                .map(|m| {
                    let schema = m.headers.as_ref().and_then(|h| h.get("Edge-Schema")).map(|v| v.to_string());
                    (hex(&m.payload), schema.unwrap_or_default())
                })
                .collect()
        };
        let deadline = tokio::time::Instant::now() + WAIT;
        let stored = loop {
            let got = readings(&read_stream(&n.url(), "EDGE").await);
            if got.len() >= 5 || tokio::time::Instant::now() > deadline {
                break got;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let schemas: Vec<&str> = stored.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(
            schemas,
            ["reading-value/1", "reading-value/1", "reading-value/1", "reading-value/2", "reading-value/1"]
        );
        assert_eq!(stored[4].0, hex(&plain_framed));
        let mut args = vec!["deserialize", &url, "AVRO"];
        args.extend(stored.iter().map(|(h, _)| h.as_str()));
        assert_eq!(sr(&args), json!([first[0], first[1], later_v1[0], on_v2[0], plain_object]));
        return;
    }
    if let Sink::Kafka(k) = &sink_kind {
        // Confluent's deserializing consumer on the records topics, named by the headers.
        let read = sr(&["consume", &url, &k.bootstrap(), "edge.plant", "AVRO", "5"]);
        let values: Vec<Value> = read.as_array().unwrap().iter().map(|r| r["value"].clone()).collect();
        let want = [first[0].clone(), first[1].clone(), later_v1[0].clone(), on_v2[0].clone(), plain_object];
        assert_eq!(values, want, "{read}");
        let schemas: Vec<&str> = read.as_array().unwrap().iter().map(|r| r["schema"].as_str().unwrap()).collect();
        assert_eq!(
            schemas,
            ["reading-value/1", "reading-value/1", "reading-value/1", "reading-value/2", "reading-value/1"]
        );
        let read = sr(&["consume", &url, &k.bootstrap(), "edge.vision", "JSON", "1"]);
        assert_eq!(read, json!([{ "value": boxes[0], "schema": "box-value/1" }]));
        return;
    }
    // In the sink byte for byte, each named by the version that wrote it.
    let sink = cloud.sink.clone();
    let stored_as = |p: &Vec<u8>| if *p == plain { plain_framed.clone() } else { p.clone() };
    assert!(e2e_tests::eventually(WAIT, || sends.iter().all(|(_, p)| named(&sink, &stored_as(p)).is_some())).await);
    for p in framed.iter().chain([&v1_again]) {
        assert_eq!(named(&sink, p).as_deref(), Some("reading-value/1"));
    }
    assert_eq!(named(&sink, &v2_payload).as_deref(), Some("reading-value/2"));
    assert_eq!(named(&sink, &box_payloads[0]).as_deref(), Some("box-value/1"));

    // Confluent's deserializers read the records with the bridge as their registry.
    assert_eq!(named(&sink, &plain).as_deref(), None, "the bare datum is stored framed");
    let rows: Vec<String> =
        [&framed[0], &framed[1], &v1_again, &v2_payload, &plain_framed].iter().map(|p| hex(p)).collect();
    let mut args = vec!["deserialize", &url, "AVRO"];
    args.extend(rows.iter().map(String::as_str));
    let read = sr(&args);
    assert_eq!(read, json!([first[0], first[1], later_v1[0], on_v2[0], plain_object]));
    let read = sr(&["deserialize", &url, "JSON", &hex(&box_payloads[0])]);
    assert_eq!(read, boxes);
    // Protobuf's deserializer reads the writer's file from the bridge (format=serialized).
    // The alarms are not among `sends` waited for above: the uplink may not have stored them yet.
    assert!(e2e_tests::eventually(WAIT, || named(&sink, &alarm).is_some()).await);
    assert_eq!(named(&sink, &alarm).as_deref(), Some("alarm-value/1"));
    assert_eq!(sr(&["proto-deserialize", &url, "Alarm", &hex(&alarm)]), alarms);
    assert_eq!(sr(&["proto-deserialize", &url, "Ack", &hex(&ack)]), acks);
}
