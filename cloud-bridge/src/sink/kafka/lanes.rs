//! One transactional producer per edge lane, and the transaction that writes a batch with its
//! lane's mark.
//!
//! A lane's producer has `transactional.id` `<prefix>.<edge>.<lane>`. Opening it
//! (`init_transactions`) fences every earlier producer of that id, on this bridge or another,
//! and ends (aborts, or completes if its commit had begun) the transaction it left open. Only
//! then are the lane's marks read, settled ([`StateLog::read_settled`]: past every transaction
//! open at that moment, since a `read_committed` reader stops at the first one and a mark
//! committed behind another lane's open transaction would not be read): nothing can commit
//! behind them any more, so the marks are the truth for as long as this producer lives, and
//! the producer keeps them itself from there on. A batch's records at or below its lane's mark are dropped
//! before writing (a resend of what a fenced bridge committed after the edge heard `committed`);
//! the rest go in one transaction with the lane's new mark, so a `read_committed` reader sees
//! the records and the mark together or neither.
//!
//! Any failure drops the producer: the next attempt opens another under the same id, which
//! settles the transaction the failed one may have left, and reads the mark again, so a
//! commit whose answer was lost is found committed, not written twice. A fenced producer is the
//! end of the session ([`SinkError::Fenced`]): another bridge has the edge.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;

use super::context::Context;
use super::log::StateLog;
use super::outgoing::{Outgoing, Staged, Topic};

/// How long opening a producer may take: finding the transaction coordinator and settling what
/// the fenced producer left.
const INIT_TIMEOUT: Duration = Duration::from_secs(30);
use super::settings::KafkaSettings;
use super::{kafka_error, mark_key};
use crate::sink::SinkError;

type TxProducer = ThreadedProducer<Context>;

/// An open lane producer and the marks it keeps, per epoch.
struct Lane {
    producer: TxProducer,
    marks: HashMap<String, u64>,
}

/// A lane's slot: its producer while open, and when it was last used (for eviction).
struct Slot {
    lane: tokio::sync::Mutex<Option<Lane>>,
    used: Mutex<Instant>,
}

/// The transactional producers of this bridge (a lane's, an edge's), by `transactional.id`,
/// at most `max_producers`.
pub(crate) struct Lanes {
    settings: KafkaSettings,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// The marks this bridge committed, by mark key: a commit is readable only once its
    /// markers are written, a moment after it returns, and a hello to this bridge right after
    /// an ack must hear the mark the ack promised.
    committed: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Lanes {
    pub(crate) fn new(settings: &KafkaSettings) -> Self {
        Self { settings: settings.clone(), slots: Mutex::default(), committed: Mutex::default() }
    }

    fn slot(&self, id: &str) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slots.get(id) {
            *s.used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            return s.clone();
        }
        if slots.len() >= self.settings.max_producers {
            // The least recently used goes; a publish holding it finishes first (it holds the
            // slot's Arc), and its lane opens a producer again when it next writes.
            let oldest = slots
                .iter()
                .min_by_key(|(_, s)| *s.used.lock().unwrap_or_else(|e| e.into_inner()))
                .map(|(k, _)| k.clone());
            if let Some(evicted) = oldest.and_then(|k| slots.remove(&k)) {
                // Closing a client blocks its thread (a flush, then its brokers' threads).
                let closing = std::thread::Builder::new().name("kafka-close".into()).spawn(move || drop(evicted));
                if let Err(e) = closing {
                    tracing::warn!(error = %e, "no thread to close a Kafka producer on");
                }
            }
        }
        let slot = Arc::new(Slot { lane: tokio::sync::Mutex::new(None), used: Mutex::new(Instant::now()) });
        slots.insert(id.to_owned(), slot.clone());
        slot
    }

    /// The marks this bridge committed under `prefix` (a [`mark_key`] prefix), with the key.
    pub(crate) fn committed(&self, prefix: &str) -> Vec<(String, u64)> {
        let committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        committed
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Forgets the marks this bridge committed under `prefix` (an epoch retired, its marks
    /// deleted).
    pub(crate) fn forget(&self, prefix: &str) {
        let mut committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        committed.retain(|k, _| !k.starts_with(prefix));
    }

    /// Lane producers open now.
    pub(crate) fn open(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The lane's mark for `epoch` as its producer knows it, opening the producer if needed.
    pub(crate) async fn mark(&self, marks: &StateLog, edge: &str, epoch: &str, lane: u8) -> Result<u64, SinkError> {
        let id = self.settings.transactional_id(edge, lane);
        let slot = self.slot(&id);
        let mut open = slot.lane.lock().await;
        let l = self.ensure_open(&mut open, &[marks], &id).await?;
        Ok(known_mark(l, marks, edge, epoch, lane))
    }

    /// Writes `staged` and its lane's mark in one transaction (once: the caller retries).
    pub(crate) async fn write(&self, marks: &StateLog, marks_topic: &Topic, staged: &Staged) -> Result<(), SinkError> {
        let id = self.settings.transactional_id(&staged.edge, staged.lane);
        let slot = self.slot(&id);
        let mut open = slot.lane.lock().await;
        let l = self.ensure_open(&mut open, &[marks], &id).await?;
        let mark = known_mark(l, marks, &staged.edge, &staged.epoch, staged.lane);
        let fresh: Vec<&Outgoing> = staged.records.iter().filter(|r| r.seq > mark).collect();
        let Some(up_to) = fresh.last().map(|r| r.seq) else { return Ok(()) };
        let key = mark_key(&staged.edge, &staged.epoch, staged.lane);
        let mark_record = Outgoing { seq: up_to, ..marks_topic.put(key, up_to.to_string().into_bytes()) };
        let timeout = self.settings.transaction_timeout.0;
        // The producer moves into the blocking task and back: librdkafka's transaction calls
        // block their thread.
        let Some(lane) = open.take() else { return Err(SinkError::invalid("publish", "no producer")) };
        let records: Vec<Outgoing> = fresh.into_iter().cloned().collect();
        let (lane, result) = tokio::task::spawn_blocking(move || {
            let mut records = records;
            records.push(mark_record);
            attempt(lane, &records, timeout)
        })
        .await
        .map_err(|e| SinkError::Task { what: "publish", reason: e.to_string() })?;
        *open = lane;
        match result {
            Ok(()) => {
                if let Some(lane) = open.as_mut() {
                    lane.marks.insert(staged.epoch.clone(), up_to);
                }
                let mut committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
                // Bounded by the lanes this bridge writes; the log has them all a moment later.
                if committed.len() > 100_000 {
                    committed.clear();
                }
                committed.insert(mark_key(&staged.edge, &staged.epoch, staged.lane), up_to);
                Ok(())
            }
            Err(e) => Err(txn_error("publish", &id, &e)),
        }
    }

    /// A read-then-write of state only producer `id` writes (an edge's epochs, its dictionary
    /// index), as compare-and-set would do it: the producer is opened if it is not (fencing
    /// every other of its id, so nobody else writes these keys meanwhile), `logs` are read to
    /// their ends, `decide` reads them and says what to write, and that is committed in one
    /// transaction; the logs are then read to their ends again, so the next read sees it.
    pub(crate) async fn owned_write<T>(
        &self,
        id: &str,
        logs: &[&StateLog],
        decide: impl FnOnce() -> Result<(Vec<Outgoing>, T), SinkError>,
    ) -> Result<T, SinkError> {
        let slot = self.slot(id);
        let mut open = slot.lane.lock().await;
        self.ensure_open(&mut open, logs, id).await?;
        for log in logs {
            log.read_to_end().await?;
        }
        let (writes, out) = decide()?;
        if writes.is_empty() {
            return Ok(out);
        }
        let Some(owner) = open.take() else { return Err(SinkError::invalid("write", "no producer")) };
        let timeout = self.settings.transaction_timeout.0;
        let expected: Vec<(String, String, Option<Vec<u8>>)> = writes
            .iter()
            .map(|w| {
                let key = String::from_utf8_lossy(&w.key).into_owned();
                (w.topic.clone(), key, (!w.tombstone).then(|| w.payload.clone()))
            })
            .collect();
        let (owner, result) = tokio::task::spawn_blocking(move || attempt(owner, &writes, timeout))
            .await
            .map_err(|e| SinkError::Task { what: "write", reason: e.to_string() })?;
        *open = owner;
        result.map_err(|e| txn_error("write", id, &e))?;
        // A commit returns once the coordinator decided it; the markers that make it readable
        // follow. The next read-then-write of this state must see this one: wait until the
        // logs show it.
        for (topic, key, value) in &expected {
            if let Some(log) = logs.iter().find(|l| l.topic() == topic) {
                log.await_shows(key, value.as_deref(), timeout).await?;
            }
        }
        Ok(out)
    }

    /// The open producer of the slot, opened (and the earlier ones fenced) if there is none.
    async fn ensure_open<'a>(
        &self,
        open: &'a mut Option<Lane>,
        logs: &[&StateLog],
        id: &str,
    ) -> Result<&'a mut Lane, SinkError> {
        if open.is_none() {
            let producer = open_producer(self.producer_config(id)?, id).await?;
            // Settled, not only to the last stable offset: this id's mark may sit behind
            // another producer's open transaction, and a mark not read is a resend written
            // twice.
            for log in logs {
                log.read_settled().await?;
            }
            *open = Some(Lane { producer, marks: HashMap::new() });
        }
        open.as_mut().ok_or_else(|| SinkError::invalid("publish", "no producer"))
    }

    fn producer_config(&self, id: &str) -> Result<rdkafka::ClientConfig, SinkError> {
        let mut c = self.settings.client()?;
        c.set("transactional.id", id)
            .set("transaction.timeout.ms", self.settings.transaction_timeout.0.as_millis().to_string())
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "1")
            .set("message.max.bytes", (self.settings.max_message_bytes + 4096).to_string());
        Ok(c)
    }
}

/// The mark of (edge, epoch, lane) as the open producer knows it, else as the log has it (the
/// producer read the log to its end when it opened, and nobody else writes this key since).
fn known_mark(l: &mut Lane, marks: &StateLog, edge: &str, epoch: &str, lane: u8) -> u64 {
    if let Some(m) = l.marks.get(epoch) {
        return *m;
    }
    let stored = marks.get(&mark_key(edge, epoch, lane)).and_then(|v| super::parse_mark(&v)).unwrap_or(0);
    l.marks.insert(epoch.to_owned(), stored);
    stored
}

/// A transactional producer of `config`, opened: every earlier producer of its id is fenced
/// and the transaction it left is settled before this returns.
pub(crate) async fn open_producer(config: rdkafka::ClientConfig, id: &str) -> Result<TxProducer, SinkError> {
    let id = id.to_owned();
    tokio::task::spawn_blocking(move || -> Result<TxProducer, SinkError> {
        let producer: TxProducer =
            config.create_with_context(Context::default()).map_err(|e| kafka_error("producer", &e))?;
        producer.init_transactions(INIT_TIMEOUT).map_err(|e| txn_error("init transactions", &id, &e))?;
        Ok(producer)
    })
    .await
    .map_err(|e| SinkError::Task { what: "init transactions", reason: e.to_string() })?
}

/// One transaction of `lane`'s producer; the producer back if it can go on. After a failure
/// that is not fatal the transaction is aborted and the producer kept (nothing of it was
/// committed: its marks still hold); otherwise it is closed ([`close`]). A commit that timed
/// out and cannot be aborted is settled by the next producer of the id, which reads the mark
/// again.
fn attempt(lane: Lane, writes: &[Outgoing], timeout: Duration) -> (Option<Lane>, Result<(), KafkaError>) {
    match transact(&lane.producer, writes, timeout) {
        Ok(()) => (Some(lane), Ok(())),
        Err(e) => {
            let fatal = matches!(&e, KafkaError::Transaction(t) if t.is_fatal());
            if !fatal {
                match lane.producer.abort_transaction(timeout) {
                    Ok(()) => {
                        tracing::info!(error = %e, "kafka transaction failed; aborted, producer kept");
                        return (Some(lane), Err(e));
                    }
                    Err(abort) => tracing::info!(error = %e, %abort, "kafka transaction failed, and its abort"),
                }
            }
            tracing::info!(error = %e, fatal, "kafka producer closed after a failed transaction");
            close(lane.producer);
            (None, Err(e))
        }
    }
}

/// Closes a producer on a thread of its own, not waited for: destroying a client waits until
/// its requests to every broker ended, minutes for one that is down, and the next producer of
/// its id need not wait for that.
fn close(producer: TxProducer) {
    let closing = std::thread::Builder::new().name("kafka-close".into()).spawn(move || drop(producer));
    if let Err(e) = closing {
        tracing::warn!(error = %e, "no thread to close a Kafka producer on");
    }
}

/// One transaction: the records, then the mark, committed.
fn transact(producer: &TxProducer, records: &[Outgoing], timeout: Duration) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    producer.begin_transaction()?;
    for r in records {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&r.topic).partition(r.partition).key(&r.key[..]);
        if !r.tombstone {
            record = record.payload(&r.payload[..]);
        }
        if !r.headers.is_empty() {
            let mut headers = rdkafka::message::OwnedHeaders::new_with_capacity(r.headers.len());
            for (name, value) in &r.headers {
                headers = headers.insert(rdkafka::message::Header { key: name, value: Some(&value[..]) });
            }
            record = record.headers(headers);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e @ KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // The queue drains as the brokers take it, or its messages time out.
                    if Instant::now() > deadline {
                        return Err(e);
                    }
                    record = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
    producer.commit_transaction(timeout)
}

/// A transactional call's error: [`SinkError::Fenced`] when another producer took the id.
fn txn_error(what: &'static str, id: &str, e: &KafkaError) -> SinkError {
    match e.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::TransactionCoordinatorFenced,
        ) => SinkError::Fenced { what, key: id.to_owned() },
        _ => kafka_error(what, e),
    }
}
