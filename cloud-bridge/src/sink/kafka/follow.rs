//! A topic read from its start by a thread of its own and applied to something in memory, as
//! Kafka Connect's `KafkaBasedLog` follows its offsets topic: the sink's state logs
//! ([`super::log::StateLog`]) and the downlink's index ([`super::down`]). A `read_committed`
//! consumer polls every partition; [`Follower::read_to_end`] waits until everything committed
//! when it was called is applied, so what a caller reads after it is at least as new as the
//! last commit before the call.
//!
//! That end is the last stable offset: a `read_committed` reader stops at the first open
//! transaction of any producer, so a commit behind it (another lane's mark in the same
//! partition) is not read yet. [`Follower::read_settled`] waits until every transaction open
//! when it was called has ended: what a producer that has just fenced its predecessors reads
//! then is everything that can ever be committed before its own writes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::{Offset, TopicPartitionList};

use super::context::Context;
use super::kafka_error;
use super::settings::KafkaSettings;
use crate::sink::SinkError;

/// How long one poll waits: also how soon a dropped follower's thread ends.
pub(crate) const POLL: Duration = Duration::from_millis(100);
/// How long a read to the end keeps asking for a partition's end offset (a leader elected,
/// the client's metadata catching up), and then waits to have applied up to it, before it
/// fails.
const END_WAIT: Duration = Duration::from_secs(30);

/// What a followed topic is applied to.
pub(crate) trait Apply: Send + 'static {
    fn apply(&mut self, m: &BorrowedMessage<'_>);
}

struct Followed<A> {
    inner: A,
    /// Per partition, the offset the consumer reads next.
    next: Vec<i64>,
}

/// A topic followed into an `A`.
pub(crate) struct Follower<A> {
    topic: String,
    /// Asks for the end offsets: a client of its own, since the follower's connection is
    /// mostly in a fetch that waits for data, and a request sent behind it waits too.
    ends: Arc<BaseConsumer<Context>>,
    /// Asks for the end offsets as written, open transactions' records included
    /// (`read_uncommitted`): made when a settled read first needs it.
    written_ends: std::sync::OnceLock<Arc<BaseConsumer<Context>>>,
    settings: KafkaSettings,
    state: Arc<Mutex<Followed<A>>>,
    applied: Arc<tokio::sync::Notify>,
    stop: Arc<AtomicBool>,
}

/// A consumer of the sink's own: partitions assigned by hand, nothing committed.
pub(crate) fn consumer(settings: &KafkaSettings, group: &str) -> Result<BaseConsumer<Context>, SinkError> {
    isolated(settings, group, "read_committed")
}

fn isolated(settings: &KafkaSettings, group: &str, isolation: &str) -> Result<BaseConsumer<Context>, SinkError> {
    let mut c = settings.client()?;
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .set("enable.partition.eof", "false")
        // A read from an offset retention deleted starts at the oldest kept, not at the end.
        .set("auto.offset.reset", "earliest")
        // What another bridge writes is seen within this.
        .set("fetch.wait.max.ms", "100");
    c.create_with_context::<_, BaseConsumer<Context>>(Context::default()).map_err(|e| kafka_error("consumer", &e))
}

impl<A: Apply> Follower<A> {
    /// Starts following `topic`, which has `partitions` partitions, into `inner`.
    pub(crate) fn start(settings: &KafkaSettings, topic: &str, partitions: i32, inner: A) -> Result<Self, SinkError> {
        let group = format!("cloud-bridge-follow-{topic}");
        let ends = Arc::new(consumer(settings, &group)?);
        let consumer = consumer(settings, &group)?;
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions {
            assignment.add_partition_offset(topic, p, Offset::Beginning).map_err(|e| kafka_error("follow", &e))?;
        }
        consumer.assign(&assignment).map_err(|e| kafka_error("follow", &e))?;
        let state = Arc::new(Mutex::new(Followed { inner, next: vec![0; partitions as usize] }));
        let applied = Arc::new(tokio::sync::Notify::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (s, a, st, t) = (state.clone(), applied.clone(), stop.clone(), topic.to_owned());
        std::thread::Builder::new()
            .name(format!("kafka-follow-{topic}"))
            .spawn(move || follow(&consumer, &t, &s, &a, &st))
            .map_err(|e| SinkError::Task { what: "follow", reason: e.to_string() })?;
        Ok(Self {
            topic: topic.to_owned(),
            ends,
            written_ends: std::sync::OnceLock::new(),
            settings: settings.clone(),
            state,
            applied,
            stop,
        })
    }

    /// The topic it follows.
    pub(crate) fn topic(&self) -> &str {
        &self.topic
    }

    /// Reads what is applied so far.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&A) -> R) -> R {
        f(&self.lock().inner)
    }

    /// Reads what is applied so far, with the offset each partition is applied up to.
    pub(crate) fn with_ends<R>(&self, f: impl FnOnce(&A, &[i64]) -> R) -> R {
        let s = self.lock();
        f(&s.inner, &s.next)
    }

    /// Changes what is applied so far (what the caller knows that the topic does not say, such
    /// as an edge's position).
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(&mut A) -> R) -> R {
        f(&mut self.lock().inner)
    }

    /// Waits for the next poll's end (or a moment, whichever comes first).
    pub(crate) async fn polled(&self) {
        let _ = tokio::time::timeout(POLL * 5, self.applied.notified()).await;
    }

    /// Waits until everything committed to the topic when called is applied: up to each
    /// partition's last stable offset (with read_committed, a consumer's "latest" is that;
    /// what follows is an open transaction's, or behind one).
    pub(crate) async fn read_to_end(&self) -> Result<(), SinkError> {
        self.read_to(self.ends.clone()).await
    }

    /// Waits until every transaction open when called has ended and what it committed, and
    /// everything committed behind it, is applied: the consumer passes each partition's end
    /// as written (its position passes aborted records and transaction markers too). Up to a
    /// dead producer's `transaction.timeout.ms` (and the coordinator's check for it) when one
    /// left a transaction open, unless its id is opened again before.
    pub(crate) async fn read_settled(&self) -> Result<(), SinkError> {
        let ends = match self.written_ends.get() {
            Some(c) => c.clone(),
            None => {
                let group = format!("cloud-bridge-follow-{}", self.topic);
                let made = Arc::new(isolated(&self.settings, &group, "read_uncommitted")?);
                self.written_ends.get_or_init(|| made).clone()
            }
        };
        self.read_to(ends).await
    }

    /// Waits until the follower is past the end offsets `consumer` gives.
    async fn read_to(&self, consumer: Arc<BaseConsumer<Context>>) -> Result<(), SinkError> {
        let topic = self.topic.clone();
        let partitions = self.lock().next.len() as i32;
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
                            Err(e) => return Err(kafka_error("end offsets", &e)),
                        }
                    }
                })
                .collect::<Result<Vec<i64>, SinkError>>()
        })
        .await
        .map_err(|e| SinkError::Task { what: "end offsets", reason: e.to_string() })??;
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Followed<A>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<A> Drop for Follower<A> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The thread: applies what comes, and after each poll the consumer's positions (which pass
/// the transactions' control records, which no message shows).
fn follow<A: Apply>(
    consumer: &BaseConsumer<Context>,
    topic: &str,
    state: &Mutex<Followed<A>>,
    applied: &tokio::sync::Notify,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Relaxed) {
        let polled = consumer.poll(POLL);
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        match polled {
            Some(Ok(m)) => {
                s.inner.apply(&m);
                if let Some(next) = s.next.get_mut(rdkafka::Message::partition(&m) as usize) {
                    *next = (*next).max(rdkafka::Message::offset(&m) + 1);
                }
            }
            // The client logs why and retries (a broker down, a leader moving).
            Some(Err(e)) => tracing::debug!(topic, error = %e, "kafka follower"),
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
