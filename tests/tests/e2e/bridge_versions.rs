//! A rolling upgrade: edges and bridges one protocol version apart keep working together. This
//! build speaks 1 to 9 (2 names dictionaries by the whole SHA-256, 3 has the Welcome say what
//! the sink stores of one record, 4 sends batches as a binary head and the body as it is,
//! `shared::proto::batch_frame`, 5 carries the downlink, 6 sends batch bodies column-wise,
//! `shared::proto::columns`, 7 bit-packs them (format 2), names a record's schema and a
//! dictionary in a batch head by its 32 bytes, 8 takes Avro and Protobuf payloads apart by their
//! schema, format 3, 9 has the edge's hello say how much of the downlink it holds). The next
//! version is played by peers that offer 1 to 10 and add what a newer build may add: fields this
//! build does not know in every frame and in the batch head, control frames it has never seen;
//! the previous one by peers that speak 1 to 8 (no announced window: the bridge's own, and an
//! edge holds 256 messages), version 7 by peers that speak 1 to 7 (format 2, binary payloads
//! whole), version 6 by peers that speak 1 to 6 (column-wise bodies in format 1
//! only, dictionary ids as hex), version 5 by
//! peers that speak 1 to 5 (rows: an edge never sends one a column-wise batch), version 4 by peers that speak 1 to 4 (no
//! downlink: a bridge never sends one a downlink frame, though a message waits for it), older
//! ones by peers that speak 1 to 3 (batches in a CBOR envelope) or
//! 1 and 2 (no sink limits in their Welcome), and the first by peers that speak only 1 and name
//! dictionaries by 16 hex digits. A real bridge against such an edge (a real edge against
//! such a bridge: `super::edge_versions`): they negotiate the highest common version, ignore
//! the rest, use dictionaries by that version's ids, and every record arrives and is acked.

use std::time::Duration;

use ciborium::Value;
use cloud_bridge::sink::DownlinkStore;
use cloud_bridge::sink::downlink::{DownBounds, Enqueued, Outgoing};
use cloud_bridge::sink::kafka::KafkaSink;
use cloud_bridge::sink::kafka::settings::KafkaSettings;
use e2e_tests::cloud::{TestCloud, pki, sink_rows};
use e2e_tests::fixtures::wire_record;
use e2e_tests::kafka::KafkaBroker;
use e2e_tests::quic;
use serde::Serialize;
use shared::proto::columns::{Format, Shaper, Shapes};
use shared::proto::io::read_frame;
use shared::proto::{
    Batch, Codec, Control, DOWNLINK_VERSION, DictAnnounce, Hello, MAX_BATCH_RAW, MAX_CONTROL_FRAME, WireRecord,
};
use shared::proto::{Lane, Seq};
use shared::proto::{SHAPES_VERSION, SchemaRef, batch_frame, codec, compress};

pub(crate) const WAIT: Duration = Duration::from_secs(20);

const AVRO: &str = r#"{"type":"record","name":"Reading","fields":[{"name":"camera","type":"string"},
 {"name":"at","type":"long"},{"name":"temp_c","type":"double"},{"name":"status","type":["null","string"]}]}"#;

fn avro_schema() -> shared::schema::Schema {
    let source = shared::schema::Source { kind: shared::schema::Kind::Avro, text: AVRO.into(), message: None };
    shared::schema::Schema::parse(source).unwrap()
}

/// The staged version an edge of version 8 walks payloads with.
#[derive(Debug)]
struct OneSchema(shared::schema::Schema);

impl Shapes for OneSchema {
    fn cut<'p>(&self, schema: &SchemaRef, payload: &'p [u8], out: &mut Shaper<'p>) -> bool {
        schema.id == self.0.id() && self.0.cut(payload, out)
    }
}

/// Records `first..first + n` of Avro readings, each naming the schema it was validated against.
fn avro_batch(first: u64, n: u64) -> Vec<WireRecord> {
    let id = avro_schema().id().to_owned();
    (first..first + n)
        .map(|seq| {
            let mut payload = Vec::new();
            let camera = format!("cam-{}", seq % 3);
            payload.push((camera.len() * 2) as u8);
            payload.extend_from_slice(camera.as_bytes());
            let at = 1_700_000_000_000i64 + seq as i64 * 250;
            let mut z = ((at << 1) ^ (at >> 63)) as u64;
            while z >= 0x80 {
                payload.push(z as u8 | 0x80);
                z >>= 7;
            }
            payload.push(z as u8);
            payload.extend_from_slice(&(20.0 + (seq % 9) as f64 / 4.0).to_le_bytes());
            payload.extend_from_slice(if seq % 2 == 0 { &[2, 4, b'o', b'k'] } else { &[0] });
            let mut r = wire_record(seq, &format!("telemetry/avro/{}", seq % 2), String::new());
            let m = match &mut r.body {
                shared::proto::RecordBody::Message(m) => m,
                shared::proto::RecordBody::Gap(_) => unreachable!(),
            };
            m.payload = payload;
            m.schema = Some(SchemaRef { subject: "reading".into(), version: 1, id: id.clone() });
            r
        })
        .collect()
}
const EPOCH: &str = "00112233445566778899aabbccddeeff";

/// `value` as the next version would send it: its CBOR map with `extra` fields added.
pub(crate) fn newer(value: &impl Serialize, extra: &[(&str, Value)]) -> Value {
    let mut v = Value::serialized(value).expect("to a CBOR value");
    let Value::Map(entries) = &mut v else { panic!("{v:?} is not a map") };
    entries.extend(extra.iter().map(|(k, x)| (Value::Text((*k).into()), x.clone())));
    v
}

pub(crate) fn frame(value: &Value) -> Vec<u8> {
    codec::encode(value).expect("encode")
}

/// A control frame this build has never heard of.
pub(crate) fn unknown_control(kind: &str) -> Vec<u8> {
    frame(&Value::Map(vec![
        (Value::Text("type".into()), Value::Text(kind.into())),
        (Value::Text("rate".into()), Value::Integer(500.into())),
    ]))
}

/// An edge of the next version: welcomed at 9, its batch in the binary framing with a longer
/// head than this build writes, records with fields this build does not know (a row batch,
/// which version 8 still takes); the message waiting for it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_bridge_serves_an_edge_of_the_next_version() {
    serve_an_edge_offering(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 9, None).await;
}

/// [issue 44] On the Kafka sink, edges of the next and the previous version alike: welcomed at
/// 8 and 7 with the sink's record limits, the waiting message (in `edge-down`) delivered, the
/// records read back by a `read_committed` consumer as they were sent. The protocol did not
/// change with the Kafka sink; this shows the sink does not depend on which version carried a
/// record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_bridge_on_kafka_serves_edges_of_the_next_and_the_previous_version() {
    let broker = KafkaBroker::start();
    serve_an_edge_offering(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 9, Some(&broker)).await;
    serve_an_edge_offering(&[1, 2, 3, 4, 5, 6, 7, 8], 8, Some(&broker)).await;
}

/// An edge of the previous version: welcomed at 8, the downlink, format 3 batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_bridge_serves_an_edge_of_the_previous_version() {
    serve_an_edge_offering(&[1, 2, 3, 4, 5, 6, 7, 8], 8, None).await;
}

/// An edge of version 7: welcomed at 7, the downlink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_bridge_serves_an_edge_of_version_7() {
    serve_an_edge_offering(&[1, 2, 3, 4, 5, 6, 7], 7, None).await;
}

/// An edge of version 6: welcomed at 6, the downlink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_bridge_serves_an_edge_of_version_6() {
    serve_an_edge_offering(&[1, 2, 3, 4, 5, 6], 6, None).await;
}

/// An edge of version 5: welcomed at 5, row batches, the downlink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_bridge_serves_an_edge_of_version_5() {
    serve_an_edge_offering(&[1, 2, 3, 4, 5], 5, None).await;
}

/// An edge of version 4: welcomed at 4, batches in the binary framing, and no downlink frame
/// though a message waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_bridge_serves_an_edge_of_version_4() {
    serve_an_edge_offering(&[1, 2, 3, 4], 4, None).await;
}

/// [version 9] This bridge sends an edge of version 9 no more downlink messages at once than its
/// hello announced (here 1), the next once it acks; an edge of version 8 announces nothing this
/// bridge takes (the same field, skipped): the bridge's own window, all 3 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_bridge_holds_to_the_window_an_edge_of_version_9_announces() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2", "edge-3"]);
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), "").await;
    let sink = cloud_bridge::sink::sqlite::SqliteSink::open(&cloud.sink).unwrap();
    let bounds = DownBounds { messages: 10, bytes: 1 << 20 };
    for (edge, versions, at_once) in [("edge-2", 9u16, 1usize), ("edge-3", 8, 3)] {
        for i in 0..3 {
            let msg = Outgoing { topic: "config/x".into(), payload: vec![b'0' + i], qos: 1, ..Default::default() };
            assert!(matches!(sink.enqueue(edge, &msg, bounds).await.unwrap(), Enqueued::Stored { .. }));
        }
        let (_, cert, key) = keys.edges.iter().find(|(id, _, _)| id == edge).unwrap().clone();
        let conn = quic::connect(cloud.bridge.quic_addr(), &keys.ca, &cert, &key).await.unwrap();
        let (mut send, recv) = conn.open_bi().await.unwrap();
        let hello = Control::Hello(Hello {
            versions: (1..=versions).collect(),
            epoch: EPOCH.into(),
            down_window: Some(shared::proto::down::EdgeWindow { messages: 1, bytes: 1 << 20 }),
            ..Hello::default()
        });
        send.write_all(&frame(&newer(&hello, &[]))).await.unwrap();
        // Frames read on a task of their own: a read cut short by a timeout would lose bytes.
        let (mut frames, _reader) = shared::proto::io::spawn_reader::<_, Control>(recv, MAX_CONTROL_FRAME);
        let mut next_down = async |within: Duration| {
            tokio::time::timeout(within, async {
                loop {
                    match *frames.recv().await.expect("the reader ended") {
                        Ok(Some(Control::Down(d))) => break d.seq,
                        Ok(Some(_)) => continue,
                        other => panic!("the control stream ended: {other:?}"),
                    }
                }
            })
            .await
            .ok()
        };
        let mut downs = Vec::new();
        for _ in 0..at_once {
            downs.push(next_down(WAIT).await.expect("a downlink message"));
        }
        let more = next_down(Duration::from_millis(500)).await;
        assert_eq!(more, None, "{edge} on version {versions}: more than {at_once} at once after {downs:?}");
        if at_once == 1 {
            let ack = Control::DownAck(shared::proto::down::DownAck { up_to: downs[0], ..Default::default() });
            send.write_all(&frame(&newer(&ack, &[]))).await.unwrap();
            assert!(next_down(WAIT).await.expect("the next once acked") > downs[0]);
        }
        conn.close(0u32.into(), b"done");
    }
    cloud.bridge.stop().await;
}

/// An edge of version 3: its batch a CBOR envelope (with a field this build does not know, as
/// such an edge's peers of its next version would add).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_bridge_serves_an_edge_of_version_3() {
    serve_an_edge_offering(&[1, 2, 3], 3, None).await;
}

/// On `kafka`, each call serves an edge of its own (`edge-<chosen>`) on a bridge of its own.
async fn serve_an_edge_offering(versions: &[u16], chosen: u16, kafka: Option<&KafkaBroker>) {
    let dir = tempfile::tempdir().unwrap();
    let edge = if kafka.is_some() { format!("edge-{chosen}") } else { "edge-2".to_owned() };
    let edge = edge.as_str();
    let keys = pki(dir.path(), &[edge]);
    let bind = "127.0.0.1:0".parse().unwrap();
    let cloud = match kafka {
        Some(k) => {
            let section = format!("kind = \"kafka\"\nbootstrap = \"{}\"\npartitions = 3\n", k.bootstrap());
            TestCloud::start_with_sink(dir.path(), keys.clone(), bind, "", &section, dir.path().join("unused")).await
        }
        None => TestCloud::start(dir.path(), keys.clone(), bind, "").await,
    };
    // A message waits for this edge: only a session of the downlink's version may carry it.
    let waiting = Outgoing { topic: "config/x".into(), payload: b"v".to_vec(), qos: 1, ..Default::default() };
    let bounds = DownBounds { messages: 10, bytes: 1 << 20 };
    let stored = match kafka {
        Some(k) => {
            let mut settings = KafkaSettings::new(&k.bootstrap());
            settings.partitions = 3;
            let sink = KafkaSink::connect(&settings).await.unwrap();
            sink.enqueue(edge, &waiting, bounds).await.unwrap()
        }
        None => {
            let sink = cloud_bridge::sink::sqlite::SqliteSink::open(&cloud.sink).unwrap();
            sink.enqueue(edge, &waiting, bounds).await.unwrap()
        }
    };
    assert!(matches!(stored, Enqueued::Stored { .. }));
    let (_, cert, key) = keys.edges.iter().find(|(id, _, _)| id == edge).unwrap().clone();
    let conn = quic::connect(cloud.bridge.quic_addr(), &keys.ca, &cert, &key).await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();

    let hello = Control::Hello(Hello {
        versions: versions.to_vec(),
        epoch: EPOCH.into(),
        lanes: vec![],
        models: vec![],
        dicts: vec![],
        caps: vec!["lane-stats".into()],
        down_mark: 0,
        down_window: None,
    });
    let hello = newer(&hello, &[("region", Value::Text("eu-west".into()))]);
    send.write_all(&frame(&hello)).await.unwrap();
    let welcome: Control = read_frame(&mut recv, MAX_CONTROL_FRAME).await.unwrap().unwrap();
    let Control::Welcome(welcome) = welcome else { panic!("{welcome:?}") };
    assert_eq!(welcome.version, chosen, "the highest version both speak");
    if kafka.is_some() {
        assert!(welcome.sink.is_some(), "the Kafka sink's record limits");
    } else {
        assert_eq!(welcome.sink, None, "the SQLite sink stores whatever the protocol carries");
    }
    send.write_all(&unknown_control("lane_stats")).await.unwrap();

    // Three records, each with a field this build does not know, in a batch with one too.
    let records: Vec<Value> = (1..=3u64)
        .map(|seq| {
            let record = wire_record(seq, &format!("telemetry/next/{seq}"), format!("v2-{seq}"));
            newer(&record, &[("trace_id", Value::Bytes(vec![seq as u8; 8]))])
        })
        .collect();
    let mut body = Vec::new();
    ciborium::into_writer(&Value::Array(records), &mut body).unwrap();
    let batch = Batch {
        epoch: String::new(),
        lane: Lane(0),
        first_seq: Seq(1),
        last_seq: Seq(3),
        codec: Codec::Cbor,
        dict: None,
        raw_len: body.len() as u64,
        body,
    };
    let bytes = if chosen >= batch_frame::BINARY_DICT_SINCE {
        // A compact head two bytes longer than this build writes: a field it does not know.
        let mut head = batch_frame::head(&batch, chosen).unwrap();
        assert_eq!(head[4], batch_frame::COMPACT_BATCH);
        assert!(head[5] < 0x7e, "a one-byte varint");
        head[5] += 2;
        head.extend_from_slice(&[0xee, 0xee]);
        let len = u32::from_be_bytes(head[..4].try_into().unwrap()) + 2;
        head[..4].copy_from_slice(&len.to_be_bytes());
        head.extend_from_slice(&batch.body);
        head
    } else if chosen >= batch_frame::BINARY_SINCE {
        // A head two bytes longer than this build writes: a field it does not know.
        let mut head = batch_frame::head(&batch, 4).unwrap();
        let head_len = u16::from_be_bytes([head[5], head[6]]) + 2;
        head[5..7].copy_from_slice(&head_len.to_be_bytes());
        head.extend_from_slice(&[0xee, 0xee]);
        let len = u32::from_be_bytes(head[..4].try_into().unwrap()) + 2;
        head[..4].copy_from_slice(&len.to_be_bytes());
        head.extend_from_slice(&batch.body);
        head
    } else {
        frame(&newer(&batch, &[("sent_at_ms", Value::Integer(12345.into()))]))
    };
    let mut uni = conn.open_uni().await.unwrap();
    uni.write_all(&bytes).await.unwrap();
    uni.finish().unwrap();

    let mut downs = Vec::new();
    let acked = tokio::time::timeout(WAIT, async {
        let mut acked = false;
        // On the downlink's version, until both the ack and the waiting message came.
        while !acked || (chosen >= DOWNLINK_VERSION && downs.is_empty()) {
            match read_frame::<_, Control>(&mut recv, MAX_CONTROL_FRAME).await.unwrap() {
                Some(Control::Ack(a)) if a.lane == Lane(0) && a.up_to == Seq(3) => acked = true,
                Some(Control::Down(d)) => downs.push(d.topic),
                Some(_) => continue,
                None => panic!("the bridge closed the control stream"),
            }
        }
    })
    .await;
    assert!(acked.is_ok(), "no ack for the batch: {}", cloud.bridge.metrics().encode());
    if chosen < DOWNLINK_VERSION {
        // Whatever the bridge would send comes within its poll; none may be a downlink frame.
        let more =
            tokio::time::timeout(Duration::from_millis(500), read_frame::<_, Control>(&mut recv, MAX_CONTROL_FRAME))
                .await;
        if let Ok(Ok(Some(frame))) = &more {
            assert!(!matches!(frame, Control::Down(_)), "a downlink frame on version {chosen}: {frame:?}");
        }
        assert!(downs.is_empty(), "a downlink frame on version {chosen}: {downs:?}");
    } else {
        assert_eq!(downs, ["config/x"]);
    }
    let mut want: Vec<_> = (1..=3u64)
        .map(|s| (edge.to_owned(), s, Some(format!("telemetry/next/{s}")), format!("v2-{s}").into_bytes()))
        .collect();
    if chosen >= SHAPES_VERSION {
        // Version 8: Avro payloads taken apart by their schema (format 3) reach the sink as
        // they were published.
        let avro = avro_batch(4, 70);
        want.extend(avro.iter().filter_map(|r| {
            let m = r.as_message()?;
            Some((edge.to_owned(), r.seq.0, Some(m.topic.clone()), m.payload.clone()))
        }));
        let batch =
            compress::pack_shaped(("", Lane(0), Seq(4)), &avro, None, (3, Some(Format::V3)), &OneSchema(avro_schema()))
                .unwrap();
        let raw = compress::decompress(&batch, None, MAX_BATCH_RAW).unwrap().unwrap();
        assert_eq!(raw[0], 3, "a format 3 body");
        let whole = shared::proto::columns::encode(&avro, Format::V2);
        assert!(
            raw.len() * 2 < whole.len(),
            "taken apart: {} bytes, {} with the payloads whole",
            raw.len(),
            whole.len()
        );
        let mut uni = conn.open_uni().await.unwrap();
        uni.write_all(&batch_frame::encode(&batch, chosen).unwrap()).await.unwrap();
        uni.finish().unwrap();
        let acked = tokio::time::timeout(WAIT, async {
            loop {
                match read_frame::<_, Control>(&mut recv, MAX_CONTROL_FRAME).await.unwrap() {
                    Some(Control::Ack(a)) if a.lane == Lane(0) && a.up_to == Seq(73) => break,
                    Some(_) => continue,
                    None => panic!("the bridge closed the control stream"),
                }
            }
        })
        .await;
        assert!(acked.is_ok(), "no ack for the format 3 batch: {}", cloud.bridge.metrics().encode());
    }
    if let Some(k) = kafka {
        let read: Vec<_> = k
            .read("edge.telemetry", "read_committed")
            .await
            .into_iter()
            .filter(|r| r["key"] == edge)
            .map(|r| {
                let seq =
                    r["headers"]["Edge-Seq"].as_str().unwrap().rsplit(':').next().unwrap().parse::<u64>().unwrap();
                let topic = r["headers"]["Mqtt-Topic"].as_str().map(str::to_owned);
                (seq, topic, r["value"].as_str().unwrap_or_default().to_owned())
            })
            .collect();
        // Read as text by the consumer (binary payloads with their invalid bytes replaced).
        let want: Vec<_> =
            want.into_iter().map(|(_, seq, topic, p)| (seq, topic, String::from_utf8_lossy(&p).into_owned())).collect();
        assert_eq!(read, want);
    } else {
        let rows: Vec<_> = sink_rows(&cloud.sink).into_iter().map(|r| (r.edge, r.seq, r.topic, r.payload)).collect();
        assert_eq!(rows, want);
    }
    assert!(conn.close_reason().is_none(), "the session is still up: {:?}", conn.close_reason());
}

/// An edge of the first version: it speaks only 1, and names its dictionary by the first 16
/// hex digits of its hash. This bridge welcomes it at 1, stores the dictionary under that id,
/// decodes a batch compressed with it, and acks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_bridge_serves_an_edge_of_the_first_version_and_its_dictionary() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), "").await;
    // A message waits for this edge: only a session of the downlink's version may carry it.
    let sink = cloud_bridge::sink::sqlite::SqliteSink::open(&cloud.sink).unwrap();
    let waiting = Outgoing { topic: "config/x".into(), payload: b"v".to_vec(), qos: 1, ..Default::default() };
    let bounds = DownBounds { messages: 10, bytes: 1 << 20 };
    assert!(matches!(sink.enqueue("edge-2", &waiting, bounds).await.unwrap(), Enqueued::Stored { .. }));
    let (_, cert, key) = keys.edges.iter().find(|(id, _, _)| id == "edge-2").unwrap().clone();
    let conn = quic::connect(cloud.bridge.quic_addr(), &keys.ca, &cert, &key).await.unwrap();
    let hello = Hello { versions: vec![1], ..quic::hello_for(EPOCH) };
    let (mut send, mut recv, welcome) = quic::hello(&conn, hello).await;
    assert!(matches!(welcome, Control::Welcome(ref w) if w.version == 1), "{welcome:?}");

    let records: Vec<WireRecord> = (1..=20u64).map(|seq| telemetry_record(seq, "old")).collect();
    let samples: Vec<Vec<u8>> = (100..600u64).map(|s| compress::sample(&telemetry_record(s, "old"))).collect();
    let dict = compress::train("telemetry", &samples, 1024).unwrap();
    let old_id = compress::dict_id_for(1, &dict.bytes);
    assert_eq!(old_id.len(), 16);
    let announce = DictAnnounce { id: old_id.clone(), class: dict.class.clone(), bytes: dict.bytes.clone() };
    send.write_all(&codec::encode(&Control::Dict(announce)).unwrap()).await.unwrap();
    loop {
        match quic::next_control(&mut recv).await {
            Some(Control::DictStored { id }) => break assert_eq!(id, old_id),
            Some(_) => continue,
            None => panic!("no DictStored: {}", cloud.bridge.metrics().encode()),
        }
    }
    let batch = compress::pack("", Lane(0), Seq(1), &records, Some(dict.on(1)), 3).unwrap();
    assert_eq!(batch.dict.as_deref(), Some(old_id.as_str()), "the batch names the 16-digit id");
    let mut uni = conn.open_uni().await.unwrap();
    uni.write_all(&codec::encode(&batch).unwrap()).await.unwrap();
    uni.finish().unwrap();
    loop {
        match quic::next_control(&mut recv).await {
            Some(Control::Ack(a)) if a.up_to == Seq(20) => break,
            Some(_) => continue,
            None => panic!("no ack: {}", cloud.bridge.metrics().encode()),
        }
    }
    let rows: Vec<_> = sink_rows(&cloud.sink).into_iter().map(|r| (r.seq, r.topic)).collect();
    let want: Vec<_> = (1..=20u64).map(|s| (s, Some(format!("telemetry/old/{s}")))).collect();
    assert_eq!(rows, want);
}

fn telemetry_record(seq: u64, tag: &str) -> WireRecord {
    let payload = format!(r#"{{"camera":"cam-{}","temp_c":{}.{},"status":"ok"}}"#, seq % 7, 40 + seq % 13, seq % 10);
    wire_record(seq, &format!("telemetry/{tag}/{seq}"), payload)
}
