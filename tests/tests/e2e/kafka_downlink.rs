//! The downlink on the Kafka sink against a real broker, driven through the sink's own calls
//! (`DownlinkStore`) as the bridge's sessions and `cloud-bridge send` make them, beside a
//! producer of someone else's (confluent-kafka, `tests/python/kafka_client.py`) writing the
//! downlink topic directly: messages reach their edge once, in the order stored, with their
//! MQTT properties; a record that is not a message is set aside with its reason; the backlog
//! bound holds for every producer; a second bridge sees the same positions, refusals and
//! set-aside messages; a bridge indexing few messages per edge reads the rest from the topic.

use std::sync::Arc;
use std::time::Duration;

use cloud_bridge::sink::downlink::{DoneCounts, DownBounds, DownDone, Enqueued, Outgoing, Pending, ReadLimit};
use cloud_bridge::sink::kafka::KafkaSink;
use cloud_bridge::sink::kafka::settings::KafkaSettings;
use cloud_bridge::sink::{DeadLetterLabel, DownlinkStore, RecordSink, SinkMetrics};
use e2e_tests::kafka::KafkaBroker;
use serde_json::json;
use shared::proto::down::DownRefusal;

const WAIT: Duration = Duration::from_secs(60);
const BOUNDS: DownBounds = DownBounds { messages: 1000, bytes: 1 << 20 };

async fn sink(broker: &KafkaBroker, tune: impl FnOnce(&mut KafkaSettings)) -> KafkaSink {
    let mut settings = KafkaSettings::new(&broker.bootstrap());
    settings.partitions = 3;
    tune(&mut settings);
    tokio::time::timeout(WAIT, KafkaSink::connect(&settings)).await.expect("connect in time").expect("connect")
}

fn msg(topic: &str, payload: &str) -> Outgoing {
    Outgoing { topic: topic.into(), payload: payload.as_bytes().to_vec(), qos: 1, ..Default::default() }
}

fn payloads(read: &[Pending]) -> Vec<String> {
    read.iter().map(|p| String::from_utf8_lossy(&p.msg.payload).into_owned()).collect()
}

fn acked(up_to: u64, refused: Vec<DownRefusal>) -> DownDone {
    DownDone { up_to, refused, expired: vec![], counts: DoneCounts::default() }
}

/// A record for `edge` as someone else's producer writes it, with `headers`.
fn direct(edge: &str, payload: &str, headers: &[(&str, &str)]) -> serde_json::Value {
    json!({ "key": edge, "value": payload, "headers": headers })
}

/// [issue 44] `send` and any producer of the downlink topic reach an edge once, in the order
/// stored, seq increasing with the offset; a send repeating an id is stored once; records that
/// are no message (no `Mqtt-Topic`, a QoS of 3) are delivered as set aside with the reason; a
/// record in another partition than its edge's is counted and never delivered. An ack records
/// the position and the refusals, which a second bridge reads as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_downlink_delivers_what_any_producer_stores_once_in_order() {
    let broker = KafkaBroker::start();
    let metrics = Arc::new(SinkMetrics::default());
    let a = sink(&broker, |_| {}).await.with_metrics(metrics.clone());
    // A session's first call: the edge's claim, so this bridge writes its position.
    a.admit_epoch("edge-1", "ep").await.unwrap();
    let news = a.down_news(None, Duration::ZERO).await.unwrap().0;

    let Enqueued::Stored { seq: first } = a.enqueue("edge-1", &msg("cmd/a", "one"), BOUNDS).await.unwrap() else {
        panic!("stored")
    };
    let rich = Outgoing {
        id: Some("order-7".into()),
        retain: true,
        qos: 2,
        expires_at_ms: Some(u64::MAX / 2),
        user_properties: vec![("z".into(), "1".into()), ("a".into(), "2".into())],
        response_topic: Some("reply/7".into()),
        correlation_data: Some(vec![0, 255, 7]),
        content_type: Some("application/json".into()),
        ..msg("cmd/b", "two")
    };
    let Enqueued::Stored { seq: second } = a.enqueue("edge-1", &rich, BOUNDS).await.unwrap() else { panic!("stored") };
    assert!(second > first);
    assert_eq!(a.enqueue("edge-1", &rich, BOUNDS).await.unwrap(), Enqueued::Already { seq: second });

    let stored = broker
        .produce(
            "edge-down",
            &[
                direct("edge-1", "direct", &[("Mqtt-Topic", "config/threshold"), ("unit", "C")]),
                direct("edge-1", "no topic", &[]),
                direct("edge-1", "bad qos", &[("Mqtt-Topic", "cmd/x"), ("Mqtt-Qos", "3")]),
                // Keyed to edge-1 in a partition that is not its own: not edge-1's.
                json!({ "key": "edge-1", "value": "misplaced", "partition": 0,
                        "headers": [["Mqtt-Topic", "cmd/x"]] }),
            ],
        )
        .await;
    assert_eq!(stored[0].0, 5, "murmur2 of edge-1 among 6 partitions");

    let (_, named) = a.down_news(Some(news), WAIT).await.unwrap();
    assert_eq!(named, ["edge-1"]);
    let read = a.down_read("edge-1", 0, ReadLimit::messages(16)).await.unwrap();
    assert_eq!(payloads(&read), ["one", "two", "direct", "no topic", "bad qos"]);
    assert!(read.windows(2).all(|w| w[0].seq < w[1].seq), "{read:?}");
    assert_eq!(read[2].seq, stored[0].1 as u64 + 1);
    let mut back = rich.clone();
    back.id = None;
    assert_eq!((read[1].msg.clone(), read[1].invalid.clone()), (back, None));
    assert_eq!(read[2].msg.topic, "config/threshold");
    assert_eq!(read[2].msg.user_properties, [("unit".to_owned(), "C".to_owned())]);
    assert!(read[3].invalid.as_deref().unwrap().contains("no Mqtt-Topic"), "{:?}", read[3].invalid);
    assert!(read[4].invalid.as_deref().unwrap().contains("Mqtt-Qos"), "{:?}", read[4].invalid);
    a.down_news(Some(news), Duration::ZERO).await.unwrap();
    let misplaced = metrics.downlink_unread.get_or_create(&DeadLetterLabel { reason: "misplaced" }).get();
    assert_eq!(misplaced, 1);

    // The edge delivered through "direct", refusing "two".
    let refusal = DownRefusal { seq: second, reason: "no handler".into() };
    a.down_record("edge-1", &acked(read[2].seq, vec![refusal])).await.unwrap();
    assert_eq!(a.down_state("edge-1").await.unwrap().position, read[2].seq);
    assert_eq!(a.down_backlog("edge-1").await.unwrap().messages, 2);
    // An ack below the position does not lower it.
    a.down_record("edge-1", &acked(first, vec![])).await.unwrap();
    assert_eq!(a.down_state("edge-1").await.unwrap().position, read[2].seq);

    // Another bridge: the same position, what is after it, the refusal.
    let b = sink(&broker, |_| {}).await;
    assert_eq!(b.down_state("edge-1").await.unwrap().position, read[2].seq);
    assert_eq!(
        payloads(&b.down_read("edge-1", read[2].seq, ReadLimit::messages(16)).await.unwrap()),
        ["no topic", "bad qos"]
    );
    let dead = b.down_dead_letters(Some("edge-1"), 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!((dead[0].seq, dead[0].topic.as_str(), dead[0].outcome.as_str()), (second, "cmd/b", "refused"));
    assert_eq!(dead[0].reason, "no handler");
    let summary = b.down_summary().await.unwrap();
    let one = summary.iter().find(|s| s.edge == "edge-1").expect("edge-1 listed");
    assert_eq!((one.state.position, one.waiting), (read[2].seq, 2));
}

/// [issue 44] The backlog bound holds for every producer: `send` refuses past it; what another
/// producer wrote past it is set aside by the bridge serving the edge (each one a dead letter),
/// and no bridge delivers it, a bridge that took the edge over included. A bridge that indexes
/// only 4 messages per edge still delivers the whole backlog in order, reading the rest from
/// the topic. A read stops at its byte budget as at its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_downlink_bounds_every_producer_and_reads_past_its_index() {
    let broker = KafkaBroker::start();
    let a = sink(&broker, |_| {}).await;
    let bound = DownBounds { messages: 10, bytes: 1 << 20 };
    let flood: Vec<_> = (0..30).map(|i| direct("edge-2", &format!("m{i}"), &[("Mqtt-Topic", "cmd/f")])).collect();
    let stored = broker.produce("edge-down", &flood).await;
    assert!(stored.iter().all(|(p, _)| *p == stored[0].0));
    let Enqueued::Full(met) = a.enqueue("edge-2", &msg("cmd/f", "one more"), bound).await.unwrap() else {
        panic!("past the bound")
    };
    assert_eq!(met.messages, 30);

    a.admit_epoch("edge-2", "ep").await.unwrap();
    assert_eq!(a.down_trim("edge-2", bound, 1000).await.unwrap(), 20);
    assert_eq!(a.down_trim("edge-2", bound, 1000).await.unwrap(), 0, "nothing left past the bound");
    let kept: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    assert_eq!(payloads(&a.down_read("edge-2", 0, ReadLimit::messages(100)).await.unwrap()), kept);
    assert_eq!(a.down_backlog("edge-2").await.unwrap().messages, 10);
    let dead = a.down_dead_letters(Some("edge-2"), 100).await.unwrap();
    assert_eq!(dead.len(), 20);
    assert!(dead.iter().all(|d| d.outcome == "refused" && d.reason.contains("max_backlog_messages")), "{dead:?}");

    // A message stored after the trim is within the bound once the edge acks.
    let small = sink(&broker, |s| s.downlink.max_indexed_per_edge = 4).await;
    small.admit_epoch("edge-2", "ep").await.unwrap();
    let read = small.down_read("edge-2", 0, ReadLimit::messages(100)).await.unwrap();
    assert_eq!(payloads(&read), kept[..4]);
    // Delivered in windows of 4, each acked: the index fills from the topic each time.
    let mut got = Vec::new();
    let mut position = 0;
    loop {
        let window = small.down_read("edge-2", position, ReadLimit::messages(4)).await.unwrap();
        let Some(last) = window.last() else { break };
        position = last.seq;
        got.extend(payloads(&window));
        small.down_record("edge-2", &acked(position, vec![])).await.unwrap();
    }
    assert_eq!(got, kept);
    let later = broker.produce("edge-down", &[direct("edge-2", "later", &[("Mqtt-Topic", "cmd/f")])]).await;
    // The bridge's follower applies it a moment after the write.
    let deadline = tokio::time::Instant::now() + WAIT;
    let read = loop {
        let read = small.down_read("edge-2", position, ReadLimit::messages(4)).await.unwrap();
        if !read.is_empty() || tokio::time::Instant::now() > deadline {
            break read;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(payloads(&read), ["later"]);
    assert_eq!(read[0].seq, later[0].1 as u64 + 1);
    assert_eq!(a.down_state("edge-2").await.unwrap().position, position);

    // The bridge indexing 4 per edge trims at the bound all the same: it reads on to find it.
    let flood: Vec<_> = (0..30).map(|i| direct("edge-3", &format!("n{i}"), &[("Mqtt-Topic", "cmd/f")])).collect();
    broker.produce("edge-down", &flood).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while small.down_backlog("edge-3").await.unwrap().messages < 30 {
        assert!(tokio::time::Instant::now() < deadline, "the flood never indexed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    small.admit_epoch("edge-3", "ep").await.unwrap();
    assert_eq!(small.down_trim("edge-3", bound, 1000).await.unwrap(), 20);
    let kept: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
    // Another bridge, as a session that takes the edge over starts: its state read to the end.
    a.down_state("edge-3").await.unwrap();
    assert_eq!(payloads(&a.down_read("edge-3", 0, ReadLimit::messages(100)).await.unwrap()), kept);

    // Messages the topic no longer holds (retention, or records deleted) are let go of once
    // read back below the partition's start; the rest is delivered.
    let stored = broker.produce("edge-down", &flood_of("edge-4", 3)).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while a.down_backlog("edge-4").await.unwrap().messages < 3 {
        assert!(tokio::time::Instant::now() < deadline, "never indexed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    broker.delete_records("edge-down", stored[2].0, stored[2].1);
    assert_eq!(payloads(&a.down_read("edge-4", 0, ReadLimit::messages(100)).await.unwrap()), ["k2"]);
    assert_eq!(a.down_backlog("edge-4").await.unwrap().messages, 1);

    // A read stops at its byte budget as at its count: what a bridge holds of an edge's
    // downlink between read and window is bounded in bytes whatever a producer wrote.
    a.admit_epoch("edge-5", "ep").await.unwrap();
    e2e_tests::cloud::check_reads_stop_at_their_byte_budget(&a, "edge-5").await;
}

fn flood_of(edge: &str, n: usize) -> Vec<serde_json::Value> {
    (0..n).map(|i| direct(edge, &format!("k{i}"), &[("Mqtt-Topic", "cmd/f")])).collect()
}
