//! The Kafka sink on a three-node KRaft cluster: exactly once while brokers are killed under
//! it (partition leaders and transaction coordinators move), and a cluster refused without
//! `replication_factor`.

use std::collections::BTreeMap;
use std::time::Duration;

use cloud_bridge::sink::kafka::KafkaSink;
use cloud_bridge::sink::kafka::settings::KafkaSettings;
use cloud_bridge::sink::{RecordSink, SinkError};
use e2e_tests::fixtures::wire_record;
use e2e_tests::kafka::{KafkaBroker, seqs};
use shared::proto::{Lane, LaneSeq, Seq};

/// A batch may wait out a leader election and a coordinator moving.
const BATCH: Duration = Duration::from_secs(120);

/// [issue 44] Two lanes of an edge write 30 batches each while node 1 is killed (SIGKILL),
/// started again, and node 2 killed: with `acks=all`, 3 copies and 2 in sync, every batch's
/// transaction either commits or is retried whole, and a `read_committed` consumer reads
/// every record of each lane exactly once, in order; the marks read back say where each ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_land_exactly_once_while_brokers_are_killed() {
    let mut cluster = KafkaBroker::cluster();
    let mut settings = KafkaSettings::new(&cluster.bootstrap());
    settings.partitions = 3;
    let refused = KafkaSink::connect(&settings).await;
    assert!(
        matches!(&refused, Err(SinkError::Invalid { reason, .. }) if reason.contains("sink.replication_factor is required")),
        "{refused:?}"
    );
    settings.replication_factor = Some(3);
    settings.min_insync_replicas = Some(2);
    let sink = KafkaSink::connect(&settings).await.expect("connect");
    sink.admit_epoch("edge-c", "ep").await.unwrap();

    const PER_BATCH: u64 = 40;
    let mut next = [1u64; 2];
    for round in 0..30 {
        match round {
            10 => cluster.kill(0),
            17 => cluster.restart(0),
            // One node at a time, as a rolling restart goes: with 2 copies in sync required,
            // losing a second node before the first caught up would rightly stop the writes.
            20 => {
                cluster.wait_replicated(Duration::from_secs(90));
                cluster.kill(1);
            }
            _ => {}
        }
        for lane in 0..2u8 {
            let first = next[lane as usize];
            let last = first + PER_BATCH - 1;
            let records =
                (first..=last).map(|s| wire_record(s, &format!("line/{lane}/m"), format!("{lane}-{s}"))).collect();
            tokio::time::timeout(BATCH, sink.write("edge-c", "ep", lane, records, last))
                .await
                .unwrap_or_else(|_| panic!("batch {first}..={last} of lane {lane} in round {round}: stuck"))
                .unwrap_or_else(|e| panic!("batch {first}..={last} of lane {lane} in round {round}: {e}"));
            next[lane as usize] = last + 1;
        }
    }
    let want = 30 * PER_BATCH;
    let committed = sink.committed("edge-c", "ep").await.unwrap();
    let lane = |l, s| LaneSeq { lane: Lane(l), seq: Seq(s) };
    assert_eq!(committed, [lane(0, want), lane(1, want)]);

    let records = cluster.read("edge.telemetry", "read_committed").await;
    let mut per_lane: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for s in seqs(&records) {
        let mut parts = s.split(':');
        let (_, l, seq) = (parts.next(), parts.next().unwrap().to_owned(), parts.next().unwrap().parse().unwrap());
        per_lane.entry(l).or_default().push(seq);
    }
    let expected: Vec<u64> = (1..=want).collect();
    for l in ["0", "1"] {
        let got = per_lane.get(l).cloned().unwrap_or_default();
        let extra = got.len() as i64 - want as i64;
        assert!(
            got == expected,
            "lane {l}: {} records for {want} ({extra:+}); first out of order at {:?}",
            got.len(),
            got.iter().zip(&expected).position(|(a, b)| a != b)
        );
    }
    // Marks are in the marks topic, compacted per key: the latest of each lane reads back.
    let again = KafkaSink::connect(&settings).await.expect("connect again");
    assert_eq!(again.committed("edge-c", "ep").await.unwrap(), [lane(0, want), lane(1, want)]);
}
