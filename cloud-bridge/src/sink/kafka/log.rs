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
/// How long a read to the end keeps asking for a partition's end offset (a leader elected,
/// the client's metadata catching up), and then waits to have applied up to it, before it
/// fails.
const END_WAIT: Duration = Duration::from_secs(30);

/// What a log keeps of each key's latest record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Its value, in memory.
    Values,
    /// Where it is (partition, offset): values too large to hold for a whole fleet (the
    /// dictionaries) are fetched when asked for ([`StateLog::fetch`]).
    Offsets,
}

#[derive(Default)]
struct State {
    values: BTreeMap<String, Vec<u8>>,
    at: std::collections::HashMap<String, (i32, i64)>,
    /// Per partition, the offset the consumer reads next.
    next: Vec<i64>,
}

/// A compacted topic, materialised.
pub(crate) struct StateLog {
    topic: String,
    settings: KafkaSettings,
    /// Asks for the end offsets: a client of its own, since the follower's connection is
    /// mostly in a fetch that waits for data, and a request sent behind it waits too.
    ends: Arc<BaseConsumer<Context>>,
    state: Arc<Mutex<State>>,
    applied: Arc<tokio::sync::Notify>,
    stop: Arc<AtomicBool>,
}

impl StateLog {
    /// Starts following `topic`, which has `partitions` partitions.
    pub(crate) fn start(settings: &KafkaSettings, topic: &str, partitions: i32, keep: Keep) -> Result<Self, SinkError> {
        let client = || {
            let mut c = settings.client()?;
            // No group: the partitions are assigned by hand and nothing is committed.
            c.set("group.id", format!("cloud-bridge-state-{topic}"))
                .set("enable.auto.commit", "false")
                .set("isolation.level", "read_committed")
                .set("enable.partition.eof", "false")
                // What another bridge writes is seen within this.
                .set("fetch.wait.max.ms", "100");
            c.create_with_context::<_, BaseConsumer<Context>>(Context::default())
                .map_err(|e| kafka_error("state consumer", &e))
        };
        let consumer = client()?;
        let ends = Arc::new(client()?);
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
            .spawn(move || follow(&c, &t, keep, &s, &a, &st))
            .map_err(|e| SinkError::Task { what: "state consumer", reason: e.to_string() })?;
        Ok(Self { topic: topic.to_owned(), settings: settings.clone(), ends, state, applied, stop })
    }

    /// Waits until everything committed to the topic when called is applied.
    pub(crate) async fn read_to_end(&self) -> Result<(), SinkError> {
        let (consumer, topic) = (self.ends.clone(), self.topic.clone());
        let partitions = self.lock().next.len() as i32;
        // With read_committed, a consumer's "latest" is the last stable offset: what follows
        // is an open transaction's, which no reader may see before its end.
        let ends = tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + END_WAIT;
            (0..partitions)
                .map(|p| {
                    loop {
                        match consumer.fetch_watermarks(&topic, p, Duration::from_secs(5)) {
                            Ok((_, high)) => return Ok(high),
                            Err(e) if std::time::Instant::now() < deadline => {
                                // The leader went away, and this client, which only ever asks for
                                // offsets, has not heard who leads now: asking for the topic's
                                // metadata tells it.
                                tracing::debug!(topic, partition = p, error = %e, "end offsets; asking again");
                                let _ = consumer.fetch_metadata(Some(&topic), Duration::from_secs(5));
                                std::thread::sleep(Duration::from_millis(200));
                            }
                            Err(e) => return Err(kafka_error("state end offsets", &e)),
                        }
                    }
                })
                .collect::<Result<Vec<i64>, SinkError>>()
        })
        .await
        .map_err(|e| SinkError::Task { what: "state end offsets", reason: e.to_string() })??;
        let deadline = tokio::time::Instant::now() + END_WAIT;
        loop {
            let notified = self.applied.notified();
            {
                let state = self.lock();
                if state.next.iter().zip(&ends).all(|(next, end)| next >= end) {
                    return Ok(());
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(SinkError::Unavailable {
                        what: "state read",
                        reason: format!("{}: at {:?} of {ends:?} after {END_WAIT:?}", self.topic, state.next),
                    });
                }
            }
            // The thread notifies after each poll; the timeout only bounds a missed wake-up.
            let _ = tokio::time::timeout(POLL * 5, notified).await;
        }
    }

    /// Waits, reading to the end, until what is applied of `key` is `value` ([`Self::shows`]):
    /// a commit of this bridge's, which is readable a moment after it returns (its markers
    /// follow), seen before the next read that must see it. Fails after `within`.
    pub(crate) async fn await_shows(&self, key: &str, value: Option<&[u8]>, within: Duration) -> Result<(), SinkError> {
        let deadline = tokio::time::Instant::now() + within;
        while !self.shows(key, value) {
            if tokio::time::Instant::now() > deadline {
                return Err(SinkError::Unavailable {
                    what: "state read",
                    reason: format!("{key} committed in {}, not readable after {within:?}", self.topic),
                });
            }
            self.read_to_end().await?;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// The topic it follows.
    pub(crate) fn topic(&self) -> &str {
        &self.topic
    }

    /// Whether what is applied of `key` is `value` (`None`: deleted). A log that keeps offsets
    /// says whether the key is there.
    pub(crate) fn shows(&self, key: &str, value: Option<&[u8]>) -> bool {
        let state = self.lock();
        match (state.values.get(key), value) {
            (None, None) => true,
            (Some(_), Some(_)) if state.at.contains_key(key) => true,
            (Some(have), Some(want)) => have == want,
            _ => false,
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

    /// The value of `key` in a log that keeps offsets: read from the brokers where the log last
    /// saw it.
    pub(crate) async fn fetch(&self, key: &str) -> Result<Option<Vec<u8>>, SinkError> {
        let Some((partition, offset)) = self.lock().at.get(key).copied() else { return Ok(None) };
        let (settings, topic, key) = (self.settings.clone(), self.topic.clone(), key.to_owned());
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer<Context> = settings
                .client()?
                .set("group.id", format!("cloud-bridge-fetch-{topic}"))
                .set("enable.auto.commit", "false")
                .set("isolation.level", "read_committed")
                .create_with_context(Context::default())
                .map_err(|e| kafka_error("fetch", &e))?;
            let mut assignment = TopicPartitionList::new();
            assignment
                .add_partition_offset(&topic, partition, Offset::Offset(offset))
                .map_err(|e| kafka_error("fetch", &e))?;
            consumer.assign(&assignment).map_err(|e| kafka_error("fetch", &e))?;
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                match consumer.poll(POLL) {
                    Some(Ok(m)) if m.offset() == offset => return Ok(m.payload().map(<[u8]>::to_vec)),
                    // Compacted away meanwhile (a newer value or a deletion came).
                    Some(Ok(m)) if m.offset() > offset => return Ok(None),
                    Some(Err(e)) => return Err(kafka_error("fetch", &e)),
                    _ => {}
                }
            }
            Err(SinkError::Unavailable { what: "fetch", reason: format!("{key}: no answer in 10s") })
        })
        .await
        .map_err(|e| SinkError::Task { what: "fetch", reason: e.to_string() })?
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
    keep: Keep,
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
                match (m.payload(), keep) {
                    (Some(value), Keep::Values) => {
                        s.values.insert(key, value.to_vec());
                    }
                    (Some(_), Keep::Offsets) => {
                        s.values.insert(key.clone(), Vec::new());
                        s.at.insert(key, (m.partition(), m.offset()));
                    }
                    // A tombstone.
                    (None, _) => {
                        s.values.remove(&key);
                        s.at.remove(&key);
                    }
                }
                if let Some(next) = s.next.get_mut(m.partition() as usize) {
                    *next = (*next).max(m.offset() + 1);
                }
            }
            // The client logs why and retries (a broker down, a leader moving).
            Some(Err(e)) => tracing::debug!(topic, error = %e, "kafka state consumer"),
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
