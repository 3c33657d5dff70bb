//! A compacted topic read whole into memory and followed: the sink's state (marks, epochs) as
//! Kafka Connect's `KafkaBasedLog` keeps its offsets. A thread polls a `read_committed`
//! consumer over every partition from the start; [`StateLog::read_to_end`] waits until it has
//! applied everything committed when it was called, so what a caller reads after it is at
//! least as new as the last commit before the call (and, after fencing a producer, as new as
//! anything that producer could still commit).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::context::Context;
use super::kafka_error;
use super::settings::KafkaSettings;
use crate::sink::SinkError;

/// How long one poll waits: also how soon a dropped log's thread ends.
const POLL: Duration = Duration::from_millis(100);

#[derive(Default)]
struct State {
    values: BTreeMap<String, Vec<u8>>,
    /// Per partition, the offset the consumer reads next.
    next: Vec<i64>,
}

/// A compacted topic, materialised.
pub(crate) struct StateLog {
    topic: String,
    consumer: Arc<BaseConsumer<Context>>,
    state: Arc<Mutex<State>>,
    applied: Arc<tokio::sync::Notify>,
    stop: Arc<AtomicBool>,
}

impl StateLog {
    /// Starts following `topic`, which has `partitions` partitions.
    pub(crate) fn start(settings: &KafkaSettings, topic: &str, partitions: i32) -> Result<Self, SinkError> {
        let consumer: BaseConsumer<Context> = settings
            .client()?
            // No group: the partitions are assigned by hand and nothing is committed.
            .set("group.id", format!("cloud-bridge-state-{topic}"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "false")
            .create_with_context(Context::default())
            .map_err(|e| kafka_error("state consumer", &e))?;
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions {
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .map_err(|e| kafka_error("state consumer", &e))?;
        }
        consumer.assign(&assignment).map_err(|e| kafka_error("state consumer", &e))?;
        let consumer = Arc::new(consumer);
        let state = Arc::new(Mutex::new(State { next: vec![0; partitions as usize], ..State::default() }));
        let applied = Arc::new(tokio::sync::Notify::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s, a, st, t) = (consumer.clone(), state.clone(), applied.clone(), stop.clone(), topic.to_owned());
        std::thread::Builder::new()
            .name(format!("kafka-state-{topic}"))
            .spawn(move || follow(&c, &t, &s, &a, &st))
            .map_err(|e| SinkError::Task { what: "state consumer", reason: e.to_string() })?;
        Ok(Self { topic: topic.to_owned(), consumer, state, applied, stop })
    }

    /// Waits until everything committed to the topic when called is applied.
    pub(crate) async fn read_to_end(&self) -> Result<(), SinkError> {
        let (consumer, topic) = (self.consumer.clone(), self.topic.clone());
        let partitions = self.lock().next.len() as i32;
        // With read_committed, a consumer's "latest" is the last stable offset: what follows
        // is an open transaction's, which no reader may see before its end.
        let ends = tokio::task::spawn_blocking(move || {
            (0..partitions)
                .map(|p| {
                    consumer
                        .fetch_watermarks(&topic, p, Duration::from_secs(10))
                        .map(|(_, high)| high)
                        .map_err(|e| kafka_error("state end offsets", &e))
                })
                .collect::<Result<Vec<i64>, SinkError>>()
        })
        .await
        .map_err(|e| SinkError::Task { what: "state end offsets", reason: e.to_string() })??;
        loop {
            let notified = self.applied.notified();
            {
                let state = self.lock();
                if state.next.iter().zip(&ends).all(|(next, end)| next >= end) {
                    return Ok(());
                }
            }
            // The thread notifies after each poll; the timeout only bounds a missed wake-up.
            let _ = tokio::time::timeout(POLL * 5, notified).await;
        }
    }

    /// The value of `key`, as applied so far.
    pub(crate) fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.lock().values.get(key).cloned()
    }

    /// The keys starting with `prefix` and their values, as applied so far.
    pub(crate) fn scan(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        self.lock()
            .values
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for StateLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The thread: applies what comes, and after each poll the consumer's positions (which pass
/// the transactions' control records, which no message shows).
fn follow(
    consumer: &BaseConsumer<Context>,
    topic: &str,
    state: &Mutex<State>,
    applied: &tokio::sync::Notify,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Relaxed) {
        let polled = consumer.poll(POLL);
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        match polled {
            Some(Ok(m)) => {
                let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) else { continue };
                match m.payload() {
                    Some(value) => s.values.insert(key, value.to_vec()),
                    // A tombstone.
                    None => s.values.remove(&key),
                };
                if let Some(next) = s.next.get_mut(m.partition() as usize) {
                    *next = (*next).max(m.offset() + 1);
                }
            }
            Some(Err(e)) => tracing::warn!(topic, error = %e, "kafka state consumer"),
            None => {}
        }
        if let Ok(positions) = consumer.position() {
            for e in positions.elements() {
                if let (Offset::Offset(o), Some(next)) = (e.offset(), s.next.get_mut(e.partition() as usize)) {
                    *next = (*next).max(o);
                }
            }
        }
        drop(s);
        applied.notify_waiters();
    }
}
