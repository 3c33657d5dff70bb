//! Records JetStream refuses for themselves, against a real nats-server: a message over the
//! server's `max_payload` (1 MiB, where an edge takes up to 8 MiB) and one over the stream's
//! `max_msg_size` (error 10054). Each is set aside once in `<prefix>.<edge>.%dead` with the
//! reason and its ids, the records around it land in order, and the lane moves on. Before, the
//! batch was refused on every resend and nothing behind it ever landed.

use std::time::Duration;

use cloud_bridge::sink::jetstream::{BatchPublish, JetStreamSink};
use cloud_bridge::sink::{DeadLetterLabel, SinkMetrics};
use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, pki};
use e2e_tests::fixtures::{inference, with_spool};
use e2e_tests::nats::{NatsServer, sink_settings, stream_messages};
use e2e_tests::node::TestNode;
use rumqttc::QoS;
use shared::proto::Seq;

const WAIT: Duration = Duration::from_secs(30);

/// Stream `EDGE` on `edge.>` taking messages of 4 KiB at most.
async fn small_messages_stream(js: &async_nats::jetstream::Context) {
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "EDGE".into(),
        subjects: vec!["edge.>".into()],
        max_message_size: 4096,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .unwrap();
}

fn header(m: &async_nats::jetstream::message::StreamMessage, name: &str) -> Option<String> {
    m.headers.get(name).map(|v| v.as_str().to_owned())
}

/// The edge spools the 1.5 MiB record before it ever heard the bridge (so before it knew what
/// the sink stores of one record, protocol version 3): the bridge sets it aside. Once welcomed,
/// the edge refuses such a publish itself (an MQTT 3.1.1 client hears it as a closed
/// connection, no PUBACK) and it never reaches the bridge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_over_the_servers_max_payload_is_set_aside_and_the_lane_moves_on() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let bind: std::net::SocketAddr = format!("127.0.0.1:{}", e2e_tests::free_port()).parse().unwrap();
    let extra = format!(
        "[broker]\nmax_packet_size = \"2 MiB\"\n{}\n{}",
        with_spool(&[inference()]),
        e2e_tests::cloud::uplink_section(&keys, "edge-1", &[bind], "")
    );
    let edge = TestNode::start(&extra).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    for i in 0..5 {
        publisher.publish("inference/m/v1/cam", QoS::AtLeastOnce, false, format!("before {i}")).await;
    }
    publisher.publish("inference/m/v1/cam", QoS::AtLeastOnce, false, vec![7u8; 1536 << 10]).await;
    for i in 0..5 {
        publisher.publish("inference/m/v1/cam", QoS::AtLeastOnce, false, format!("after {i}")).await;
    }
    let spooled =
        e2e_tests::eventually(WAIT, || edge.metric("edge_spool_class_records{class=\"inference\"}") == 11.0).await;
    assert!(spooled, "{}", edge.metrics());
    let cloud = TestCloud::start_on_jetstream(dir.path(), keys, bind, "", &nats.url()).await;
    assert!(
        e2e_tests::eventually(WAIT, || cloud.committed("edge-1", 1) == 11).await,
        "the lane is stuck: {:?}",
        cloud.fleet()
    );
    // Welcomed: the edge knows what the sink stores, and refuses the next one itself.
    let mut late = Client::anonymous(edge.local(), "late").await;
    late.publish("inference/m/v1/cam", QoS::AtLeastOnce, false, vec![7u8; 1536 << 10]).await;
    assert!(late.closed(WAIT).await.is_some(), "an MQTT 3.1.1 client hears the refusal as a close");
    assert_eq!(edge.metric("edge_mqtt_publish_refused_total{reason=\"too_large_for_sink\"}"), 1.0);
    let messages = stream_messages(&nats.url()).await;
    let normal: Vec<String> = messages
        .iter()
        .filter(|m| m.subject.as_str() != "edge.edge-1.%dead")
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    let expected: Vec<String> =
        (0..5).map(|i| format!("before {i}")).chain((0..5).map(|i| format!("after {i}"))).collect();
    assert_eq!(normal, expected);
    let dead: Vec<_> = messages.iter().filter(|m| m.subject.as_str() == "edge.edge-1.%dead").collect();
    assert_eq!(dead.len(), 1);
    let d = dead[0];
    assert_eq!(header(d, "Edge-Dead-Letter-Reason").as_deref(), Some("too_large"));
    assert_eq!(header(d, "Edge-Dead-Letter-Subject").as_deref(), Some("edge.edge-1.inference.m.v1.cam"));
    assert_eq!(header(d, "Edge-Dead-Letter-Payload-Bytes").as_deref(), Some("1572864"));
    assert!(
        header(d, "Nats-Msg-Id").is_some_and(|id| id.starts_with("edge-1:") && id.ends_with(":1:6")),
        "{:?}",
        d.headers
    );
    assert!(d.payload.is_empty(), "a payload over max_payload cannot go with it");
    assert_eq!(cloud.metric("bridge_dead_letters_total{reason=\"too_large\"}"), 1.0);
    assert_eq!(cloud.metric("bridge_sessions_closed_total{reason=\"sink\"}"), 0.0);
}

fn record(seq: u64, payload: Vec<u8>) -> shared::proto::WireRecord {
    shared::proto::WireRecord::message(
        Seq(seq),
        shared::proto::WireMessage {
            class: "telemetry".into(),
            topic: "telemetry/one".into(),
            payload,
            qos: 1,
            enqueued_ms: seq,
            expires_ms: None,
            user_properties: vec![("trace".into(), format!("t{seq}"))],
            correlation_data: None,
            content_type: None,
            schema: None,
        },
    )
}

/// JetStream's own refusal (10054, the stream's `max_msg_size`) in every publishing mode, and
/// a resend of the same batch: set aside once, counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_over_the_streams_max_msg_size_is_set_aside_once_through_resends() {
    e2e_tests::init_tracing();
    for batches in [BatchPublish::Fast, BatchPublish::Atomic, BatchPublish::Off] {
        let nats = NatsServer::start();
        let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        small_messages_stream(&js).await;
        let settings = sink_settings(nats.url(), batches);
        let metrics = std::sync::Arc::new(SinkMetrics::default());
        let sink = JetStreamSink::connect(&settings).await.unwrap().with_metrics(metrics.clone());
        let batch = || {
            (1..=5u64)
                .map(|s| record(s, if s == 3 { vec![1u8; 8192] } else { format!("m{s}").into_bytes() }))
                .collect::<Vec<_>>()
        };
        e2e_tests::cloud::publish(&sink, "edge-1", "ep", 0, batch()).await.unwrap();
        // The resend of a bridge that died before its mark: nothing new anywhere.
        e2e_tests::cloud::publish(&sink, "edge-1", "ep", 0, batch()).await.unwrap();
        let messages = stream_messages(&nats.url()).await;
        let subjects: Vec<&str> = messages.iter().map(|m| m.subject.as_str()).collect();
        let normal: Vec<_> = messages.iter().filter(|m| m.subject.as_str() == "edge.edge-1.telemetry.one").collect();
        let payloads: Vec<String> = normal.iter().map(|m| String::from_utf8_lossy(&m.payload).into_owned()).collect();
        assert_eq!(payloads, ["m1", "m2", "m4", "m5"], "{batches:?}: {subjects:?}");
        let dead: Vec<_> = messages.iter().filter(|m| m.subject.as_str() == "edge.edge-1.%dead").collect();
        assert_eq!(dead.len(), 1, "{batches:?}: {subjects:?}");
        assert_eq!(header(dead[0], "Nats-Msg-Id").as_deref(), Some("edge-1:ep:0:3"));
        assert_eq!(header(dead[0], "Edge-Dead-Letter-Reason").as_deref(), Some("too_large"), "{batches:?}");
        assert!(header(dead[0], "Edge-Dead-Letter-Error").is_some_and(|e| !e.is_empty()));
        assert_eq!(
            metrics.dead_letters.get_or_create(&DeadLetterLabel { reason: "too_large" }).get(),
            1,
            "{batches:?}"
        );
        assert!(metrics.healthy());
    }
}

/// What an operator runs (issue 30): `cloud-bridge records count|tail` and `dead-letters
/// list|replay` against a real nats-server. A record over the stream's `max_msg_size` is set
/// aside with its ids only, listed, and its replay refused naming why; a dead letter kept whole
/// (as the sink writes one a stream refused for a header) is published again on its subject
/// and deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lists_and_replays_dead_letters_and_reads_what_reached_the_sink() {
    let nats = NatsServer::start();
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    small_messages_stream(&js).await;
    let sink = JetStreamSink::connect(&sink_settings(nats.url(), BatchPublish::Off)).await.unwrap();
    let batch = (1..=5u64)
        .map(|s| record(s, if s == 3 { vec![1u8; 8192] } else { format!("m{s}").into_bytes() }))
        .collect::<Vec<_>>();
    e2e_tests::cloud::publish(&sink, "edge-1", "ep", 0, batch).await.unwrap();
    // A dead letter kept whole, with the headers the sink sets.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "edge-1:ep:0:9");
    headers.insert("Edge-Id", "edge-1");
    headers.insert("Edge-Seq", "ep:0:9");
    headers.insert("Mqtt-Topic", "telemetry/one");
    headers.insert("Edge-Dead-Letter-Reason", "header");
    headers.insert("Edge-Dead-Letter-Error", "a header the stream refused");
    headers.insert("Edge-Dead-Letter-Subject", "edge.edge-1.telemetry.one");
    headers.insert("Edge-Dead-Letter-Payload-Bytes", "6");
    js.publish_with_headers("edge.edge-1.%dead", headers, "kept!!".into()).await.unwrap().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloud.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nbind = \"127.0.0.1:0\"\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
             [sink]\nkind = \"jetstream\"\nurl = \"{}\"\n",
            nats.url()
        ),
    )
    .unwrap();
    let bridge = |args: &[&str]| e2e_tests::cloud::cli(&config, args);
    let (ok, out, err) = bridge(&["records", "count"]);
    assert!(ok, "{err}");
    assert!(out.contains("edge-1 4\n") && out.contains("total 4"), "{out}");
    let (ok, out, err) = bridge(&["records", "tail", "-n", "2"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("edge-1 ep:0:4 message telemetry/one (2 bytes) m4"), "{out}");
    assert!(lines[1].contains("ep:0:5") && lines[1].ends_with("m5"), "{out}");

    let (ok, out, err) = bridge(&["dead-letters", "list", "--json"]);
    assert!(ok, "{err}");
    let letters: serde_json::Value = serde_json::from_str(&out).unwrap();
    let letters = letters.as_array().unwrap();
    assert_eq!(letters.len(), 2, "{out}");
    assert_eq!(letters[0]["reason"], "too_large");
    assert_eq!(letters[0]["whole"], false, "a record over max_msg_size keeps its ids only");
    assert_eq!(letters[0]["record"]["bytes"], 8192);
    assert_eq!(letters[1]["whole"], true);
    let (first, second) = (letters[0]["seq"].to_string(), letters[1]["seq"].to_string());
    let (ok, _, err) = bridge(&["dead-letters", "replay", &first]);
    assert!(!ok && err.contains("kept only the record's ids"), "{err}");
    let (ok, out, err) = bridge(&["dead-letters", "replay", &second]);
    assert!(ok, "{err}");
    assert!(out.contains("published again on edge.edge-1.telemetry.one"), "{out}");
    // Read in order through a consumer: the deleted dead letter leaves a hole in the sequence.
    let messages = e2e_tests::nats::read_stream(&nats.url(), "EDGE").await;
    let replayed: Vec<_> = messages.iter().filter(|m| &m.payload[..] == b"kept!!").collect();
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0].subject.as_str(), "edge.edge-1.telemetry.one");
    let got = |name: &str| replayed[0].headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().to_owned());
    assert_eq!(
        got("Nats-Msg-Id").as_deref(),
        Some("edge-1:ep:0:9:replay"),
        "not the dead letter's own, or it is dropped as its duplicate"
    );
    assert!(got("Edge-Dead-Letter-Reason").is_none());
    let (_, out, _) = bridge(&["dead-letters", "list"]);
    assert!(out.ends_with("1 dead letters\n"), "the replayed one is gone: {out}");
}
