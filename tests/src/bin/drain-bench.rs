//! Helpers for the drain benchmark (scripts/bench-drain.sh):
//! - `fill DB COUNT [x|random] [TOPICS]`: a spool database holding COUNT 1 KiB telemetry messages
//!   (lane 3) on TOPICS topics in turn (default 16), the backlog an edge builds while its uplink
//!   is down; `random` makes each payload 1,024 random letters (which zstd cannot shrink much)
//!   instead of 1,024 `x`; with a fifth argument `crash` the spool is left as a power cut
//!   leaves it (not closed cleanly), so the next open checks and counts it;
//! - `raw URL COUNT`: the peer: COUNT 1 KiB messages published with async-nats straight into a
//!   JetStream stream made as the bridge's sink makes it (`EDGE` on `edge.>`, 2 minute dedup
//!   window), on the same subjects, pipelined (4,096 acks outstanding). Prints JSON;
//! - `kafka-broker`: a single-node Kafka 4.x broker (KRaft) on a free loopback port, as the
//!   tests start it; prints its bootstrap address and runs until SIGTERM or SIGINT;
//! - `kafka-raw BOOTSTRAP COUNT`: the Kafka peer: COUNT 1 KiB records written by one
//!   transactional rdkafka producer, 1,024 to a transaction (the edge's default batch), one transaction
//!   after another as a lane's must be, into a topic of 6 partitions made as the sink makes its
//!   own, keyed by the edge id, with the headers the sink writes. Prints JSON.

use std::collections::VecDeque;
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use edge_node::spool::{Durability, Lane, Message, Properties, Spool, SqliteStorage};
use rand::Rng;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("fill") => {
            let path = args.get(1).context("fill DB COUNT")?;
            let count: u64 = args.get(2).context("fill DB COUNT")?.parse()?;
            let random = args.get(3).is_some_and(|a| a == "random");
            let topics: u64 = args.get(4).map_or(Ok(16), |t| t.parse())?;
            let crash = args.get(5).is_some_and(|a| a == "crash");
            let mut spool = Spool::new(SqliteStorage::open(std::path::Path::new(path))?);
            let mut payload = Bytes::from(vec![b'x'; 1024]);
            let mut rng = rand::thread_rng();
            for i in 0..count {
                if random {
                    payload = (0..1024).map(|_| rng.gen_range(b'a'..=b'z')).collect::<Vec<u8>>().into();
                }
                let message = Message {
                    class: "telemetry".into(),
                    topic: format!("telemetry/cam-{:02}/metrics", i % topics.max(1)),
                    payload: payload.clone(),
                    qos: 1,
                    enqueued_ms: i,
                    expires_ms: None,
                    properties: Properties::default(),
                };
                spool.append(Lane(3), message, Durability::Normal);
                if i % 4096 == 4095 {
                    spool.flush()?;
                }
            }
            if crash {
                spool.flush()?;
                // Dropped without `close`: the clean-close note is never written, as after a
                // power cut. The WAL is then checkpointed away, as a running node's checkpointer
                // keeps it near 4 MiB (a forgotten connection held it at the whole backlog).
                drop(spool);
                rusqlite::Connection::open(path)?.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
                println!("{{\"filled\": {count}, \"closed\": false}}");
                return Ok(());
            }
            // As a node stops: closed cleanly, and the WAL (nothing checkpoints it here) moved
            // into the database, so the measured node starts without either job.
            spool.close()?;
            drop(spool);
            rusqlite::Connection::open(path)?.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
            println!("{{\"filled\": {count}}}");
        }
        Some("raw") => {
            let url = args.get(1).context("raw URL COUNT")?;
            let count: u64 = args.get(2).context("raw URL COUNT")?.parse()?;
            let client = async_nats::connect(url).await?;
            let js = async_nats::jetstream::new(client);
            js.get_or_create_stream(async_nats::jetstream::stream::Config {
                name: "EDGE".into(),
                subjects: vec!["edge.>".into()],
                duplicate_window: std::time::Duration::from_secs(120),
                ..Default::default()
            })
            .await?;
            let payload = Bytes::from(vec![b'x'; 1024]);
            let started = Instant::now();
            let mut pending = VecDeque::new();
            for i in 0..count {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", format!("raw:{i}").as_str());
                let subject = format!("edge.edge-1.telemetry.cam-{:02}.metrics", i % 16);
                pending.push_back(js.publish_with_headers(subject, headers, payload.clone()).await?);
                if pending.len() >= 4096
                    && let Some(ack) = pending.pop_front()
                {
                    ack.await?;
                }
            }
            for ack in pending {
                ack.await?;
            }
            let secs = started.elapsed().as_secs_f64();
            println!("{{\"raw_msg_per_s\": {:.0}, \"count\": {count}, \"seconds\": {secs:.2}}}", count as f64 / secs);
        }
        Some("kafka-broker") => {
            let broker = tokio::task::spawn_blocking(e2e_tests::kafka::KafkaBroker::start).await?;
            println!("{}", broker.bootstrap());
            use tokio::signal::unix::{SignalKind, signal};
            let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            drop(broker);
        }
        Some("kafka-raw") => {
            let bootstrap = args.get(1).context("kafka-raw BOOTSTRAP COUNT")?;
            let count: u64 = args.get(2).context("kafka-raw BOOTSTRAP COUNT")?.parse()?;
            println!("{}", kafka_raw(bootstrap, count).await?);
        }
        _ => {
            anyhow::bail!("usage: drain-bench fill DB COUNT | raw URL COUNT | kafka-broker | kafka-raw BOOTSTRAP COUNT")
        }
    }
    Ok(())
}

/// The Kafka peer (see the module doc): what a transactional producer of librdkafka's writes
/// with nothing of the bridge around it.
async fn kafka_raw(bootstrap: &str, count: u64) -> anyhow::Result<String> {
    use rdkafka::ClientConfig;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    use std::time::Duration;

    let topic = "raw.telemetry";
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let new = NewTopic::new(topic, 6, TopicReplication::Fixed(1));
    admin.create_topics([&new], &AdminOptions::new()).await?;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", "raw-bench")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "1")
        .set("partitioner", "murmur2_random")
        .create()?;
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout)?;
    let payload = vec![b'x'; 1024];
    let started = Instant::now();
    let producer = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        for first in (0..count).step_by(1024) {
            producer.begin_transaction()?;
            for i in first..(first + 1024).min(count) {
                let mqtt = format!("telemetry/cam-{:02}/metrics", i % 16);
                let headers = OwnedHeaders::new()
                    .insert(Header { key: "Edge-Id", value: Some("edge-1") })
                    .insert(Header { key: "Edge-Seq", value: Some(&format!("raw:3:{i}")) })
                    .insert(Header { key: "Mqtt-Topic", value: Some(&mqtt) })
                    .insert(Header { key: "Mqtt-Qos", value: Some("1") });
                let mut record = BaseRecord::to(topic).key("edge-1").payload(&payload).headers(headers);
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((
                            rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                            r,
                        )) => {
                            record = r;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err((e, _)) => return Err(e.into()),
                    }
                }
            }
            // Delivered before the commit, whose flush would otherwise poll 100 ms at a time
            // (rdkafka's poll returns at its deadline): the sink does the same, and a peer
            // paying 100 ms a transaction would flatter it.
            while producer.in_flight_count() > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            producer.commit_transaction(timeout)?;
        }
        Ok(())
    });
    producer.await??;
    let secs = started.elapsed().as_secs_f64();
    Ok(format!("{{\"raw_msg_per_s\": {:.0}, \"count\": {count}, \"seconds\": {secs:.2}}}", count as f64 / secs))
}
