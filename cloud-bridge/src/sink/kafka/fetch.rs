//! Reads of stored records by offset (a dictionary's bytes, an edge's downlink messages, a
//! reply among the records) through one consumer kept for them: a librdkafka client per read
//! would cost a thread, a connection per broker and a metadata round trip each time.
//!
//! Reads take turns on the consumer (each assigns the partition it reads at the offset it
//! starts from) on a blocking thread, each bounded by [`READ_WAIT`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::context::Context;
use super::kafka_error;
use super::settings::KafkaSettings;
use crate::sink::SinkError;

/// How long one read may take.
const READ_WAIT: Duration = Duration::from_secs(10);

/// A record read back.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub payload_len: usize,
    /// Header values that are not UTF-8 are kept as `None` (any producer may write them).
    pub headers: Vec<(String, Option<String>)>,
    /// The record's timestamp, ms since the Unix epoch.
    pub at_ms: u64,
}

impl Fetched {
    /// The first value of header `name`.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).and_then(|(_, v)| v.as_deref())
    }
}

/// The consumer reads take turns on.
pub(crate) struct Fetcher {
    consumer: Arc<Mutex<BaseConsumer<Context>>>,
}

/// What a read looks for, between offsets `from` and `end` (not included).
pub(crate) struct Range {
    pub topic: String,
    pub partition: i32,
    pub from: i64,
    pub end: i64,
    /// At most this many kept.
    pub max: usize,
    /// Whether the payloads are kept (else only their sizes: a scan that counts).
    pub payloads: bool,
}

impl Fetcher {
    pub(crate) fn new(settings: &KafkaSettings) -> Result<Self, SinkError> {
        let consumer = super::follow::consumer(settings, "cloud-bridge-fetch")?;
        Ok(Self { consumer: Arc::new(Mutex::new(consumer)) })
    }

    /// The records of `range` that `keep` keeps, in offset order: up to `range.max` of them,
    /// or those before the range's end. A compacted topic may hold none at an offset asked for.
    pub(crate) async fn read(
        &self,
        range: Range,
        keep: impl Fn(&Fetched) -> bool + Send + 'static,
    ) -> Result<Vec<Fetched>, SinkError> {
        if range.from >= range.end || range.max == 0 {
            return Ok(Vec::new());
        }
        let consumer = self.consumer.clone();
        tokio::task::spawn_blocking(move || {
            let consumer = consumer.lock().unwrap_or_else(|e| e.into_inner());
            let mut assignment = TopicPartitionList::new();
            assignment
                .add_partition_offset(&range.topic, range.partition, Offset::Offset(range.from))
                .map_err(|e| kafka_error("fetch", &e))?;
            consumer.assign(&assignment).map_err(|e| kafka_error("fetch", &e))?;
            let position = || match consumer.position().ok()?.elements().first()?.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            // Until librdkafka stops the old assignment's fetcher (on another thread), the
            // position is still where an earlier read of this partition left it: taken as this
            // read's, it would skip records this read is for.
            let earlier = position();
            let deadline = Instant::now() + READ_WAIT;
            let mut out = Vec::new();
            let mut next = range.from;
            // Whether a record of this read came: the position is then this read's.
            let mut started = false;
            while next < range.end && out.len() < range.max {
                if Instant::now() > deadline {
                    return Err(SinkError::Unavailable {
                        what: "fetch",
                        reason: format!(
                            "{}/{}: at offset {next} of {}..{} after {READ_WAIT:?}",
                            range.topic, range.partition, range.from, range.end
                        ),
                    });
                }
                match consumer.poll(super::follow::POLL) {
                    // A record of an earlier read's assignment, delivered late.
                    Some(Ok(m)) if m.topic() != range.topic || m.partition() != range.partition => {}
                    Some(Ok(m)) if m.offset() < next => {}
                    Some(Ok(m)) => {
                        started = true;
                        next = m.offset() + 1;
                        if m.offset() >= range.end {
                            break;
                        }
                        let mut fetched = owned(&m);
                        if !range.payloads {
                            fetched.payload_len = fetched.payload.take().map_or(0, |p| p.len());
                        }
                        if keep(&fetched) {
                            out.push(fetched);
                        }
                    }
                    Some(Err(e)) => tracing::debug!(topic = range.topic, error = %e, "fetch"),
                    None => {
                        // Transactions' control records take offsets no message shows: the
                        // position says where they end.
                        if let Some(o) = position()
                            && (started || Some(o) != earlier)
                        {
                            next = next.max(o);
                        }
                    }
                }
            }
            Ok(out)
        })
        .await
        .map_err(|e| SinkError::Task { what: "fetch", reason: e.to_string() })?
    }

    /// The first offset `topic`/`partition` still holds: what lies below, retention (or a
    /// deletion of records) took away.
    pub(crate) async fn start(&self, topic: &str, partition: i32) -> Result<i64, SinkError> {
        let (consumer, topic) = (self.consumer.clone(), topic.to_owned());
        tokio::task::spawn_blocking(move || {
            let consumer = consumer.lock().unwrap_or_else(|e| e.into_inner());
            let (low, _) =
                consumer.fetch_watermarks(&topic, partition, READ_WAIT).map_err(|e| kafka_error("offsets", &e))?;
            Ok(low)
        })
        .await
        .map_err(|e| SinkError::Task { what: "offsets", reason: e.to_string() })?
    }

    /// The offset of the first record of `topic`/`partition` stored at or after `at_ms`, and
    /// the partition's end; none where no record is that new.
    pub(crate) async fn offset_at(&self, topic: &str, partition: i32, at_ms: u64) -> Result<(i64, i64), SinkError> {
        let (consumer, topic) = (self.consumer.clone(), topic.to_owned());
        tokio::task::spawn_blocking(move || {
            let consumer = consumer.lock().unwrap_or_else(|e| e.into_inner());
            let deadline = Instant::now() + READ_WAIT;
            loop {
                match offsets(&consumer, &topic, partition, at_ms) {
                    Ok(found) => return Ok(found),
                    // A topic just made, a leader moving: this client's metadata catches up when
                    // asked for.
                    Err(e) if Instant::now() < deadline => {
                        tracing::debug!(topic, partition, error = %e, "offsets; asking again");
                        let _ = consumer.fetch_metadata(Some(&topic), Duration::from_secs(5));
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(e) => return Err(kafka_error("offsets", &e)),
                }
            }
        })
        .await
        .map_err(|e| SinkError::Task { what: "offsets", reason: e.to_string() })?
    }
}

/// The offset of the first record of `topic`/`partition` at or after `at_ms` (the end if
/// none), and the end.
fn offsets(
    consumer: &BaseConsumer<Context>,
    topic: &str,
    partition: i32,
    at_ms: u64,
) -> Result<(i64, i64), rdkafka::error::KafkaError> {
    let (_, high) = consumer.fetch_watermarks(topic, partition, READ_WAIT)?;
    let mut at = TopicPartitionList::new();
    at.add_partition_offset(topic, partition, Offset::Offset(at_ms.min(i64::MAX as u64) as i64))?;
    let found = consumer.offsets_for_times(at, READ_WAIT)?;
    let from = match found.elements().first().map(|e| (e.offset(), e.error())) {
        Some((_, Err(e))) => return Err(e),
        Some((Offset::Offset(o), _)) => o,
        _ => high,
    };
    Ok((from, high))
}

/// A record as the sink keeps it after the consumer moves on.
pub(crate) fn owned(m: &rdkafka::message::BorrowedMessage<'_>) -> Fetched {
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_owned(), h.value.and_then(|v| std::str::from_utf8(v).ok()).map(str::to_owned)))
                .collect()
        })
        .unwrap_or_default();
    Fetched {
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        payload: m.payload().map(<[u8]>::to_vec),
        payload_len: m.payload_len(),
        headers,
        at_ms: m.timestamp().to_millis().unwrap_or(0).max(0) as u64,
    }
}
