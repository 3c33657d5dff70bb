//! The Kafka sink against a real Apache Kafka broker (KRaft): records land once, with the
//! headers the JetStream sink gives them, in the partition of their edge; a resend of what is
//! committed is dropped; a bridge that dies mid-transaction leaves nothing a `read_committed`
//! consumer sees; a bridge that takes an edge over fences the one before; what Kafka could
//! never take is set aside with its reason. Read back by confluent-kafka, as a user's consumer
//! would (`tests/python/kafka_client.py`).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use cloud_bridge::sink::inspect;
use cloud_bridge::sink::kafka::KafkaSink;
use cloud_bridge::sink::kafka::settings::KafkaSettings;
use cloud_bridge::sink::schemas::SchemaStore;
use cloud_bridge::sink::{
    BridgeState, DictStore, EdgeQuota, EdgeState, EpochVerdict, FleetStore, OutcomeLabel, RecordSink, SinkError,
    SinkMetrics, StoredReport,
};
use e2e_tests::fixtures::wire_record;
use e2e_tests::kafka::{KafkaBroker, seqs};
use serde_json::Value;
use shared::proto::{DictAnnounce, GapReason, LaneSeq, SchemaRef, Seq, WireGap, WireRecord};
use shared::schema::{Compatibility, Kind, Source, Version};
use tokio::io::AsyncBufReadExt;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/kafka_client.py");
const WAIT: Duration = Duration::from_secs(60);

async fn sink(broker: &KafkaBroker, tune: impl FnOnce(&mut KafkaSettings)) -> KafkaSink {
    let mut settings = KafkaSettings::new(&broker.bootstrap());
    settings.partitions = 3;
    tune(&mut settings);
    tokio::time::timeout(WAIT, KafkaSink::connect(&settings)).await.expect("connect in time").expect("connect")
}

/// A telemetry record with the MQTT 5 properties and the schema a record can carry.
fn rich(seq: u64) -> WireRecord {
    let mut r = wire_record(seq, &format!("sensors/line-1/temp-{seq}"), format!("{{\"t\":{seq}}}"));
    let m = r.as_message_mut().unwrap();
    m.user_properties = vec![("traceparent".into(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into())];
    m.content_type = Some("application/json".into());
    m.correlation_data = Some(vec![1, 2, 3]);
    m.schema = Some(SchemaRef { subject: "temp".into(), version: 2, id: "00000000000000a1".into() });
    r
}

fn gap(seq: u64) -> WireRecord {
    WireRecord::gap(
        Seq(seq),
        WireGap { class: "telemetry".into(), reason: GapReason::Evicted, ranges: vec![(40, 41)], count: 2 },
    )
}

fn lane0(seq: u64) -> Vec<LaneSeq> {
    vec![LaneSeq { lane: shared::proto::Lane(0), seq: Seq(seq) }]
}

/// [issue 44] A batch is one transaction with its mark: a `read_committed` reader sees the
/// records once, in the edge's partition, in seq order, with the headers the JetStream sink
/// gives (edge, epoch:lane:seq, MQTT 5 properties, traceparent, schema); the gap goes to the gap
/// topic; the mark reads back; a resend overlapping what is committed lands only what is new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_lands_once_with_its_mark_and_a_resend_lands_only_what_is_new() {
    let broker = KafkaBroker::start();
    let sink = sink(&broker, |_| {}).await;
    assert!(matches!(sink.admit_epoch("edge-1", "ep1").await.unwrap(), EpochVerdict::Added { .. }));
    assert_eq!(sink.admit_epoch("edge-1", "ep1").await.unwrap(), EpochVerdict::Known);
    assert!(sink.committed("edge-1", "ep1").await.unwrap().is_empty());

    let first: Vec<WireRecord> = (1..=5).map(rich).chain([gap(6)]).collect();
    sink.write("edge-1", "ep1", 0, first, 6).await.unwrap();
    assert_eq!(sink.committed("edge-1", "ep1").await.unwrap(), lane0(6));

    let records = broker.read("edge.telemetry", "read_committed").await;
    assert_eq!(seqs(&records), ["ep1:0:1", "ep1:0:2", "ep1:0:3", "ep1:0:4", "ep1:0:5"]);
    let partitions: std::collections::BTreeSet<u64> =
        records.iter().map(|r| r["partition"].as_u64().unwrap()).collect();
    assert_eq!(partitions.len(), 1, "one edge, one partition: {partitions:?}");
    let r = &records[0];
    assert_eq!(r["key"], "edge-1");
    assert_eq!(r["value"], "{\"t\":1}");
    let h = &r["headers"];
    assert_eq!(h["Edge-Id"], "edge-1");
    assert_eq!(h["Mqtt-Topic"], "sensors/line-1/temp-1");
    assert_eq!(h["Mqtt-Qos"], "1");
    assert_eq!(h["traceparent"], "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    assert_eq!(h["Mqtt-Content-Type"], "application/json");
    assert_eq!(h["Mqtt-Correlation-Data"], "AQID");
    assert_eq!(h["Edge-Schema"], "temp/2");
    assert_eq!(h["Edge-Schema-Id"], "00000000000000a1");
    let gaps = broker.read("edge-gaps", "read_committed").await;
    assert_eq!(seqs(&gaps), ["ep1:0:6"]);
    let lost: Value = serde_json::from_str(gaps[0]["value"].as_str().unwrap()).unwrap();
    assert_eq!(lost["ranges"], serde_json::json!([[40, 41]]));

    // The edge did not hear the ack and sends 4..=8 again with two new records.
    let resent: Vec<WireRecord> = (4..=5).map(rich).chain([gap(6)]).chain((7..=8).map(rich)).collect();
    sink.write("edge-1", "ep1", 0, resent, 8).await.unwrap();
    assert_eq!(sink.committed("edge-1", "ep1").await.unwrap(), lane0(8));
    let records = broker.read("edge.telemetry", "read_committed").await;
    assert_eq!(seqs(&records), ["ep1:0:1", "ep1:0:2", "ep1:0:3", "ep1:0:4", "ep1:0:5", "ep1:0:7", "ep1:0:8"]);
    assert_eq!(sink.producers(), 1, "the producer edge-1 hashes to, for its epochs and its lane");
    assert_eq!(broker.read("edge-gaps", "read_committed").await.len(), 1);

    // One producer for a whole bridge: a second bridge takes edge-1 (its claim fences the first
    // one's producers) and writes two lanes through it, each lane in order, from the marks.
    let small = self::sink(&broker, |s: &mut KafkaSettings| s.producers = 1).await;
    assert_eq!(small.admit_epoch("edge-1", "ep1").await.unwrap(), EpochVerdict::Known);
    small.write("edge-1", "ep1", 1, (1..=2).map(rich).collect(), 2).await.unwrap();
    small.write("edge-1", "ep1", 0, (8..=9).map(rich).collect(), 9).await.unwrap();
    small.write("edge-1", "ep1", 1, (2..=3).map(rich).collect(), 3).await.unwrap();
    assert_eq!(small.producers(), 1);
    let lanes = small.committed("edge-1", "ep1").await.unwrap();
    assert_eq!(
        lanes,
        [LaneSeq { lane: shared::proto::Lane(0), seq: Seq(9) }, LaneSeq { lane: shared::proto::Lane(1), seq: Seq(3) }]
    );
    let records = broker.read("edge.telemetry", "read_committed").await;
    let lane1: Vec<String> = seqs(&records).into_iter().filter(|s| s.starts_with("ep1:1:")).collect();
    assert_eq!(lane1, ["ep1:1:1", "ep1:1:2", "ep1:1:3"]);
    let fenced = sink.write("edge-1", "ep1", 0, (10..=10).map(rich).collect(), 10).await;
    assert!(matches!(fenced, Err(SinkError::Fenced { .. })), "the first bridge lost edge-1: {fenced:?}");

    // A bridge started afresh reads the marks back from the compacted topic.
    let again = sink_again(&broker).await;
    let lanes = again.committed("edge-1", "ep1").await.unwrap();
    assert_eq!(lanes[0], lane0(9)[0]);
    let lane0: Vec<String> = seqs(&broker.read("edge.telemetry", "read_committed").await)
        .into_iter()
        .filter(|s| s.starts_with("ep1:0:"))
        .collect();
    assert_eq!(lane0, ["ep1:0:1", "ep1:0:2", "ep1:0:3", "ep1:0:4", "ep1:0:5", "ep1:0:7", "ep1:0:8", "ep1:0:9"]);
    assert_eq!(again.admit_epoch("edge-1", "ep1").await.unwrap(), EpochVerdict::Known);
}

async fn sink_again(broker: &KafkaBroker) -> KafkaSink {
    sink(broker, |_| {}).await
}

/// [issue 44] A bridge killed mid-batch, and one cut off that lives on. A "zombie" (a real
/// client with the first bridge's producer id, killed with SIGKILL after sending records
/// 4..=6 and the mark 6, uncommitted) leaves nothing a `read_committed` reader sees and no
/// mark: the next bridge hears 3 committed, claims the edge (fencing the first bridge's
/// producers, which aborts the zombie's transaction) and writes 4..=6 once. The first bridge
/// has its next write refused as fenced and writes nothing. A `read_uncommitted` reader does see the aborted records: the
/// caveat the design note states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_killed_mid_batch_leaves_nothing_and_a_fenced_one_writes_nothing() {
    let broker = KafkaBroker::start();
    let first = sink(&broker, |_| {}).await;
    first.admit_epoch("edge-1", "ep1").await.unwrap();
    first.write("edge-1", "ep1", 0, (1..=3).map(rich).collect(), 3).await.unwrap();
    let written = broker.read("edge.telemetry", "read_committed").await;
    assert_eq!(seqs(&written), ["ep1:0:1", "ep1:0:2", "ep1:0:3"]);
    let partition = written[0]["partition"].as_u64().unwrap();

    assert_eq!(first.producer_ids().len(), 4);
    let mut zombies = Vec::new();
    for id in first.producer_ids() {
        let (zombie, _) = open_transaction(&broker, &id, partition, "m/edge-1/ep1/0", (4, 6), None).await;
        zombies.push(zombie);
    }
    for zombie in &mut zombies {
        zombie.kill().await.unwrap();
    }

    let metrics = std::sync::Arc::new(SinkMetrics::default());
    let second = sink(&broker, |_| {}).await.with_metrics(metrics.clone());
    assert_eq!(second.committed("edge-1", "ep1").await.unwrap(), lane0(3), "the zombie's mark is not seen");
    // Its claim fences the first bridge's producers: without that, the hello would wait out the
    // zombies' transactions (60 s).
    let admitted = tokio::time::timeout(Duration::from_secs(20), second.admit_epoch("edge-1", "ep1")).await;
    assert_eq!(admitted.expect("admitted without waiting the zombies out").unwrap(), EpochVerdict::Known);
    second.write("edge-1", "ep1", 0, (4..=6).map(rich).collect(), 6).await.unwrap();
    assert_eq!(second.committed("edge-1", "ep1").await.unwrap(), lane0(6));
    // What the operator sees of it: one claim won, the first bridge's four producers fenced,
    // the claim's and the batch's transactions committed on the producer edge-1 hashes to.
    let outcome = |outcome| OutcomeLabel { outcome };
    assert_eq!(metrics.kafka_claims.get_or_create(&outcome("won")).get(), 1);
    assert_eq!(metrics.kafka_claims.get_or_create(&outcome("lost")).get(), 0);
    assert_eq!(metrics.kafka_fences.get(), 4);
    assert!(metrics.kafka_transactions.get_or_create(&outcome("committed")).get() >= 2);
    assert!(metrics.kafka_transaction_jobs.get() >= 2);
    assert_eq!(metrics.kafka_producers_open.get(), 1);

    let late = tokio::time::timeout(WAIT, first.write("edge-1", "ep1", 0, (7..=7).map(rich).collect(), 7))
        .await
        .expect("a fenced write ends, not retried forever");
    assert!(matches!(late, Err(SinkError::Fenced { .. })), "{late:?}");

    let committed = broker.read("edge.telemetry", "read_committed").await;
    assert_eq!(seqs(&committed), ["ep1:0:1", "ep1:0:2", "ep1:0:3", "ep1:0:4", "ep1:0:5", "ep1:0:6"]);
    assert!(committed.iter().all(|r| r["key"] == "edge-1"));
    let everything = broker.read("edge.telemetry", "read_uncommitted").await;
    let zombies = everything.iter().filter(|r| r["key"] == "zombie").count();
    assert_eq!(zombies, 12, "read_uncommitted sees the aborted batches: {:?}", seqs(&everything));
    assert_eq!(second.committed("edge-1", "ep1").await.unwrap(), lane0(6));
}

/// A real transactional producer (`tests/python/kafka_client.py zombie`) with `txn_id`, its
/// transaction open when this returns: records `seqs` in `edge.telemetry` partition `partition`
/// and a mark under `mark_key` in `edge-marks`. With `hold`, it aborts the transaction itself
/// after that many seconds (a producer slow, not dead) and says so on the lines returned.
async fn open_transaction(
    broker: &KafkaBroker,
    txn_id: &str,
    partition: u64,
    mark_key: &str,
    seqs: (u64, u64),
    hold: Option<u64>,
) -> (tokio::process::Child, tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>) {
    let mut zombie = tokio::process::Command::new("python3")
        .args([SCRIPT, "zombie", &broker.bootstrap(), txn_id, "edge.telemetry"])
        .arg(partition.to_string())
        .args(["edge-marks", mark_key, &seqs.0.to_string(), &seqs.1.to_string()])
        .args(hold.map(|h| h.to_string()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3");
    let mut lines = tokio::io::BufReader::new(zombie.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(WAIT, lines.next_line()).await.expect("zombie in time").unwrap();
    if line.as_deref() != Some("open") {
        let mut why = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut zombie.stderr.take().unwrap(), &mut why).await;
        panic!("the zombie did not open its transaction: {line:?}\n{why}");
    }
    (zombie, lines)
}

/// [issue 44] A lane's mark committed behind another producer's open transaction in the same
/// marks partition. A `read_committed` reader stops at the first open transaction (the last
/// stable offset), so it does not see the mark yet. A bridge that opens the lane must not take
/// that for the lane's mark, or it writes a resend of what is committed a second time.
/// Here: records 1..=6 of edge-1 are committed (mark 6), the last three behind edge-2's open
/// transaction; the bridge that wrote them goes away before the edge heard the ack, and the
/// next bridge gets the batch 4..=6 again. It waits until the other transaction ends (aborted
/// by its producer after a few seconds), sees mark 6, and writes nothing.
/// A welcome may still hear the lower mark: that is safe (the edge resends, and the lane's
/// producer drops what its mark covers) and keeps a session from waiting on another's
/// transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_behind_another_lanes_open_transaction_is_waited_for_before_a_resend() {
    let broker = KafkaBroker::start();
    let first = sink(&broker, |s| s.partitions = 1).await;
    first.admit_epoch("edge-1", "ep1").await.unwrap();
    first.write("edge-1", "ep1", 0, (1..=3).map(rich).collect(), 3).await.unwrap();

    // One partition for the marks: every lane's mark shares it.
    let (_other, mut said) =
        open_transaction(&broker, "edge-bridge.edge-2.0", 0, "m/edge-2/ep1/0", (1, 2), Some(6)).await;
    first.write("edge-1", "ep1", 0, (4..=6).map(rich).collect(), 6).await.unwrap();
    drop(first);

    let second = sink(&broker, |s| s.partitions = 1).await;
    let heard = second.committed("edge-1", "ep1").await.unwrap();
    assert!(heard == lane0(3) || heard == lane0(6), "a welcome hears a mark the lane had: {heard:?}");
    second.admit_epoch("edge-1", "ep1").await.unwrap();
    second.write("edge-1", "ep1", 0, (4..=6).map(rich).collect(), 6).await.unwrap();
    let ended = tokio::time::timeout(WAIT, said.next_line()).await.expect("the other transaction ends").unwrap();
    assert_eq!(ended.as_deref(), Some("aborted"));

    let committed = broker.read("edge.telemetry", "read_committed").await;
    let edge1: Vec<&Value> = committed.iter().filter(|r| r["key"] == "edge-1").collect();
    let seqs: Vec<&str> = edge1.iter().map(|r| r["headers"]["Edge-Seq"].as_str().unwrap()).collect();
    assert_eq!(seqs, ["ep1:0:1", "ep1:0:2", "ep1:0:3", "ep1:0:4", "ep1:0:5", "ep1:0:6"], "each record once");
    assert!(committed.iter().all(|r| r["key"] != "zombie"), "the aborted transaction is not read");
    assert_eq!(second.committed("edge-1", "ep1").await.unwrap(), lane0(6));
}

/// [issue 44] What Kafka could never take stops no lane: a record over `max_message_bytes` goes
/// to the dead-letter topic without its payload, and one whose topic would pass `max_topics`
/// with it, each with `Edge-Refused` and the topic it was for; the mark passes both. Epochs past
/// `limits.epochs_per_edge` retire the oldest and its marks. `dead-letters replay` refuses the
/// letter without a payload, and the other while `max_topics` still refuses its topic; once
/// raised, the record goes to its topic with its headers, once however often it is asked, and
/// the letter is no longer listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_kafka_cannot_take_is_set_aside_and_the_lane_goes_on() {
    let broker = KafkaBroker::start();
    let sink = sink(&broker, |s| {
        s.topic = "edge.{1}".into();
        s.max_topics = 1;
        s.max_message_bytes = 4096;
    })
    .await
    .with_quota(EdgeQuota { epochs: 1, ..Default::default() });
    sink.admit_epoch("edge-2", "ep1").await.unwrap();
    let records = vec![
        wire_record(1, "line/a", "small"),
        wire_record(2, "line/b", vec![b'x'; 8000]),
        wire_record(3, "other/a", "a third topic"),
        wire_record(4, "line/c", "small again"),
    ];
    sink.write("edge-2", "ep1", 0, records, 4).await.unwrap();
    assert_eq!(sink.committed("edge-2", "ep1").await.unwrap(), lane0(4));
    assert_eq!(seqs(&broker.read("edge.line", "read_committed").await), ["ep1:0:1", "ep1:0:4"]);
    let dead = broker.read("edge-dead", "read_committed").await;
    let by_seq: BTreeMap<String, &Value> =
        dead.iter().map(|r| (r["headers"]["Edge-Seq"].as_str().unwrap().to_owned(), r)).collect();
    assert_eq!(by_seq.keys().collect::<Vec<_>>(), ["ep1:0:2", "ep1:0:3"]);
    let large = &by_seq["ep1:0:2"];
    assert_eq!(large["headers"]["Edge-Refused"], "too_large");
    assert_eq!(large["headers"]["Edge-Topic"], "edge.line");
    assert_eq!(large["value"], "");
    let third = &by_seq["ep1:0:3"];
    assert_eq!(third["headers"]["Edge-Refused"], "topics");
    assert_eq!(third["headers"]["Edge-Topic"], "edge.other");
    assert_eq!(third["value"], "a third topic");

    let config = |max_topics| {
        let mut s = KafkaSettings::new(&broker.bootstrap());
        s.partitions = 3;
        s.topic = "edge.{1}".into();
        s.max_topics = max_topics;
        cloud_bridge::sink::config::SinkConfig::Kafka(s)
    };
    let letters = inspect::dead_letters(&config(1), None).await.unwrap();
    let seq_of = |reason: &str| letters.iter().find(|l| l.reason == reason).unwrap().seq;
    let (large, topics) = (seq_of("too_large"), seq_of("topics"));
    let outcome = |r: Vec<(u64, Result<String, SinkError>)>| r.into_iter().map(|(_, o)| o).collect::<Vec<_>>();
    let refused = outcome(inspect::replay(&config(1), &[large, topics]).await.unwrap());
    assert!(matches!(&refused[0], Err(e) if e.to_string().contains("too large")), "{refused:?}");
    assert!(matches!(&refused[1], Err(e) if e.to_string().contains("max_topics")), "{refused:?}");
    let replayed = outcome(inspect::replay(&config(2), &[topics]).await.unwrap());
    assert_eq!(replayed[0].as_deref().ok(), Some("edge.other"), "{replayed:?}");
    let again = outcome(inspect::replay(&config(2), &[topics]).await.unwrap());
    assert!(matches!(&again[0], Err(e) if e.to_string().contains("replayed already")), "{again:?}");
    let other = broker.read("edge.other", "read_committed").await;
    assert_eq!(seqs(&other), ["ep1:0:3"], "once");
    assert_eq!(other[0]["value"], "a third topic");
    assert_eq!(other[0]["headers"]["Mqtt-Topic"], "other/a");
    assert!(other[0]["headers"].get("Edge-Refused").is_none(), "{other:?}");
    let left = inspect::dead_letters(&config(2), None).await.unwrap();
    assert_eq!(left.iter().map(|l| l.seq).collect::<Vec<_>>(), [large], "the replayed letter is not listed");

    // One epoch per edge: a second retires the first and deletes its marks.
    assert_eq!(sink.admit_epoch("edge-2", "ep2").await.unwrap(), EpochVerdict::Added { retired: vec!["ep1".into()] });
    assert!(sink.committed("edge-2", "ep1").await.unwrap().is_empty(), "the retired epoch's marks went");
    assert_eq!(sink.admit_epoch("edge-2", "ep1").await.unwrap(), EpochVerdict::Retired);
}

fn edge_state(edge: &str, bridge: &str, session: u64, connected: bool) -> EdgeState {
    EdgeState {
        edge: edge.into(),
        bridge: bridge.into(),
        session,
        connected,
        version: 9,
        epoch: "ep".into(),
        remote: "127.0.0.1:1".into(),
        connected_ms: 1,
        seen_ms: 2,
        lanes: Vec::new(),
        spool: None,
    }
}

/// [issue 44] What bridges share besides records is in Kafka, so a bridge keeps nothing of its
/// own: dictionaries one bridge stored are read by another (the oldest evicted past the edge's
/// quota, deleted in the same transaction), the fleet's states and reports likewise, and a late
/// end of a session another bridge took over does not replace that bridge's live state; a
/// schema version number is taken once, whichever bridge asks second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dictionaries_fleet_states_and_schemas_one_bridge_stores_another_reads() {
    let broker = KafkaBroker::start();
    let quota = EdgeQuota { dicts: 2, ..EdgeQuota::default() };
    let first = sink(&broker, |_| {}).await.with_quota(quota);
    let dict =
        |id: &str, fill: u8| DictAnnounce { id: id.into(), class: "telemetry".into(), bytes: vec![fill; 40_000] };
    first.admit_epoch("edge-1", "ep1").await.unwrap();
    for (id, fill) in [("a1", 1), ("b2", 2), ("c3", 3)] {
        first.store_dict("edge-1", &dict(id, fill)).await.unwrap();
    }
    first.store_edge_states(vec![edge_state("edge-1", "bridge-a", 11, true)]).await.unwrap();
    first
        .store_report(&StoredReport {
            edge: "edge-1".into(),
            received_ms: 5,
            report: shared::proto::ClassesReport { currency: "EUR".into(), classes: Vec::new() },
        })
        .await
        .unwrap();
    first
        .store_bridge_state(&BridgeState {
            name: "bridge-a".into(),
            quic: "127.0.0.1:2".into(),
            started_ms: 1,
            seen_ms: 2,
            interval_ms: 1000,
            edges: 1,
            stopped: false,
        })
        .await
        .unwrap();

    let second = sink(&broker, |_| {}).await;
    let ids: Vec<String> = ["a1", "b2", "c3", "d4", "not-hex"].map(String::from).to_vec();
    let loaded = second.load_dicts("edge-1", &ids).await.unwrap();
    assert_eq!(loaded, [("b2".to_owned(), vec![2; 40_000]), ("c3".to_owned(), vec![3; 40_000])], "a1 evicted");
    assert!(second.load_dicts("edge-2", &ids).await.unwrap().is_empty(), "another edge's are not its");
    // Only the bridge holding an edge's claim writes its state.
    second.admit_epoch("edge-1", "ep1").await.unwrap();
    let late = first.store_dict("edge-1", &dict("e5", 5)).await;
    assert!(matches!(late, Err(SinkError::Fenced { .. })), "{late:?}");
    second.store_dict("edge-1", &dict("e5", 5)).await.unwrap();

    // The edge moves to the second bridge; the first one's end of the old session comes late.
    assert_eq!(second.store_edge_states(vec![edge_state("edge-1", "bridge-b", 22, true)]).await.unwrap(), [true]);
    assert_eq!(first.store_edge_states(vec![edge_state("edge-1", "bridge-a", 11, false)]).await.unwrap(), [false]);
    let fleet = sink(&broker, |_| {}).await.load_fleet().await.unwrap();
    assert_eq!(fleet.edges, [edge_state("edge-1", "bridge-b", 22, true)]);
    assert_eq!(fleet.bridges.len(), 1);
    assert_eq!(second.load_reports().await.unwrap().len(), 1);
    // Its own end replaces it.
    assert_eq!(second.store_edge_states(vec![edge_state("edge-1", "bridge-b", 22, false)]).await.unwrap(), [true]);

    let version = |n: u32, text: &str| Version {
        subject: "temp".into(),
        version: n,
        id: format!("{n:016x}"),
        source: Source { kind: Kind::Json, text: text.into(), message: None },
        created_ms: 1,
        compatibility: None,
    };
    assert!(first.schema_put(&version(1, r#"{"type":"object"}"#)).await.unwrap());
    assert!(!second.schema_put(&version(1, r#"{"type":"string"}"#)).await.unwrap(), "version 1 is taken");
    assert!(second.schema_put(&version(2, r#"{"type":"string"}"#)).await.unwrap());
    second.schema_set_mode("temp", Compatibility::Full).await.unwrap();
    let third = sink(&broker, |_| {}).await;
    let versions = third.schema_versions("temp").await.unwrap();
    assert_eq!(versions, [version(1, r#"{"type":"object"}"#), version(2, r#"{"type":"string"}"#)]);
    assert_eq!(third.schema_mode("temp").await.unwrap(), Some(Compatibility::Full));
    let subjects = third.schema_subjects().await.unwrap();
    assert_eq!((subjects.len(), subjects[0].versions), (1, 2));
}

/// [issue 44] Batches of a lane given to the sink ahead (`publish_after`, as the session core
/// does for a sink whose `publish_ahead` is more than one) never land before the batch before
/// them: 4..=6, given with "after 3" while nothing is written, waits in its producer (no
/// transaction for it; `bridge_kafka_batches_waiting` shows it) until 1..=3 is in, and then
/// both are, in order. A batch whose caller went away
/// while it waited (its session ended) is never written: the edge resends it on the next
/// session. Each of these is what a failed transaction of the batch before would leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_given_ahead_waits_for_the_one_before_it_and_one_abandoned_is_not_written() {
    let broker = KafkaBroker::start();
    let metrics = std::sync::Arc::new(SinkMetrics::default());
    let sink = sink(&broker, |_| {}).await.with_metrics(metrics.clone());
    assert!(sink.publish_ahead() > 1, "the Kafka sink takes batches ahead");
    sink.admit_epoch("edge-1", "ep1").await.unwrap();
    let stage =
        |range: std::ops::RangeInclusive<u64>| sink.stage("edge-1".into(), "ep1".into(), 0, range.map(rich).collect());
    let committed = || metrics.kafka_transactions.get_or_create(&OutcomeLabel { outcome: "committed" }).get();
    // Until the producer holds `n` batches waiting (it took them and decided they wait).
    let waiting = |n: i64| {
        let metrics = metrics.clone();
        async move {
            let deadline = tokio::time::Instant::now() + WAIT;
            while metrics.kafka_batches_waiting.get() != n {
                assert!(tokio::time::Instant::now() < deadline, "{n} batches waiting in time");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };

    let before = committed();
    let second = tokio::spawn(sink.publish_after(stage(4..=6).await.unwrap(), Some(3)));
    waiting(1).await;
    assert!(!second.is_finished(), "the batch after 3 waits while 3 is not in");
    assert_eq!(committed(), before, "no transaction for it");
    let first = sink.publish_after(stage(1..=3).await.unwrap(), None);
    first.await.unwrap();
    tokio::time::timeout(WAIT, second).await.expect("the waiting batch goes once 3 is in").unwrap().unwrap();
    waiting(0).await;
    sink.mark("edge-1", "ep1", 0, 6).await.unwrap();
    let records = broker.read("edge.telemetry", "read_committed").await;
    assert_eq!(seqs(&records), ["ep1:0:1", "ep1:0:2", "ep1:0:3", "ep1:0:4", "ep1:0:5", "ep1:0:6"]);

    // 10..=12 waits for 9; its session ends (the future dropped) before 7..=9 comes.
    let abandoned = sink.publish_after(stage(10..=12).await.unwrap(), Some(9));
    waiting(1).await;
    drop(abandoned);
    sink.publish_after(stage(7..=9).await.unwrap(), None).await.unwrap();
    // The group that wrote 7..=9 let the abandoned batch go (had it written it, it would be in
    // that transaction, read back below).
    waiting(0).await;
    let written: Vec<String> = seqs(&broker.read("edge.telemetry", "read_committed").await)
        .into_iter()
        .filter(|s| s.starts_with("ep1:0:"))
        .collect();
    assert_eq!(written, (1..=9).map(|s| format!("ep1:0:{s}")).collect::<Vec<_>>(), "10..=12 was abandoned");
    assert_eq!(sink.committed("edge-1", "ep1").await.unwrap()[0], lane0(9)[0]);
}
