//! A transactional producer's calls, blocking ones on threads of their own: opening one (which
//! fences every earlier producer of its id), one transaction, closing; and a read-then-write
//! through a producer opened for it alone.

use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

use super::context::Context;
use super::kafka_error;
use super::log::StateLog;
use super::outgoing::{Outgoing, Writes};
use super::settings::KafkaSettings;
use crate::sink::SinkError;

/// How long opening a producer may take: finding the transaction coordinator and settling what
/// the fenced producer left.
const INIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Polled by whoever calls it ([`transact`]; an idle one by its owner, [`poll_idle`]), not by a
/// thread of the crate's: one thread fewer per producer.
pub(crate) type TxProducer = BaseProducer<Context>;

/// Serves what an idle producer's queue holds (its errors), not waiting.
pub(crate) fn poll_idle(producer: &TxProducer) {
    producer.poll(Duration::ZERO);
}

/// What a committed transaction wrote, to wait for in the logs that follow it: a commit
/// returns once the coordinator decided it, and the markers that make it readable follow; the
/// next read-then-write of that state must see it.
pub(crate) struct Shown(Vec<(String, String, Option<Vec<u8>>)>);

impl Shown {
    pub(crate) fn of(writes: &[Outgoing]) -> Self {
        Self(
            writes
                .iter()
                .map(|w| {
                    let key = String::from_utf8_lossy(&w.key).into_owned();
                    (w.topic.clone(), key, (!w.tombstone).then(|| w.payload.clone()))
                })
                .collect(),
        )
    }

    /// Waits until each of `logs` shows what was written to its topic (fails after `within`).
    pub(crate) async fn awaited(&self, logs: &[&StateLog], within: Duration) -> Result<(), SinkError> {
        for (topic, key, value) in &self.0 {
            if let Some(log) = logs.iter().find(|l| l.topic() == topic) {
                log.await_shows(key, value.as_deref(), within).await?;
            }
        }
        Ok(())
    }
}

/// A read-then-write of state no edge owns (a schema subject's versions), by whoever asks, as
/// compare-and-set would do it: a producer of `id` is opened for it (fencing every other of
/// that id, so nobody else writes these keys meanwhile), `logs` are read settled, `decide`
/// reads them and says what to write, which is committed in one transaction and closed; the
/// logs are then read until they show it. Rare (an operator's command): a client each time.
pub(crate) async fn exclusive_write<T>(
    settings: &KafkaSettings,
    id: &str,
    logs: &[&StateLog],
    decide: impl FnOnce() -> Result<(Vec<Outgoing>, T), SinkError>,
) -> Result<T, SinkError> {
    let producer = open_producer(producer_config(settings, id)?, id).await?;
    for log in logs {
        if let Err(e) = log.read_settled().await {
            close(producer);
            return Err(e);
        }
    }
    let (writes, out) = match decide() {
        Ok(d) => d,
        Err(e) => {
            close(producer);
            return Err(e);
        }
    };
    if writes.is_empty() {
        close(producer);
        return Ok(out);
    }
    let timeout = settings.transaction_timeout.0;
    let expected = Shown::of(&writes);
    let writes = Writes::from(writes);
    let (producer, result) = tokio::task::spawn_blocking(move || attempt(producer, &writes, timeout))
        .await
        .map_err(|e| SinkError::Task { what: "write", reason: e.to_string() })?;
    if let Some(p) = producer {
        close(p);
    }
    result.map_err(|e| txn_error("write", id, &e))?;
    expected.awaited(logs, timeout).await?;
    Ok(out)
}

pub(crate) fn producer_config(settings: &KafkaSettings, id: &str) -> Result<rdkafka::ClientConfig, SinkError> {
    let mut c = settings.client()?;
    c.set("transactional.id", id)
        .set("transaction.timeout.ms", settings.transaction_timeout.0.as_millis().to_string())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "1")
        .set("message.max.bytes", (settings.max_message_bytes + 4096).to_string());
    Ok(c)
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

/// One transaction; the producer back if it can go on.
pub(crate) fn attempt(
    producer: TxProducer,
    writes: &Writes,
    timeout: Duration,
) -> (Option<TxProducer>, Result<(), KafkaError>) {
    match transact(&producer, writes, timeout) {
        Ok(()) => (Some(producer), Ok(())),
        Err(e) => {
            let fatal = matches!(&e, KafkaError::Transaction(t) if t.is_fatal());
            if !fatal {
                match producer.abort_transaction(timeout) {
                    Ok(()) => {
                        tracing::info!(error = %e, "kafka transaction failed; aborted, producer kept");
                        return (Some(producer), Err(e));
                    }
                    Err(abort) => tracing::info!(error = %e, %abort, "kafka transaction failed, and its abort"),
                }
            }
            tracing::info!(error = %e, fatal, "kafka producer closed after a failed transaction");
            close(producer);
            (None, Err(e))
        }
    }
}

/// Closes a producer on a thread of its own, not waited for: destroying a client waits until
/// its requests to every broker ended, minutes for one that is down, and the next producer of
/// its id need not wait for that.
pub(crate) fn close(producer: TxProducer) {
    let closing = std::thread::Builder::new().name("kafka-close".into()).spawn(move || drop(producer));
    if let Err(e) = closing {
        tracing::warn!(error = %e, "no thread to close a Kafka producer on");
    }
}

/// One transaction: the records, then the marks, committed.
fn transact(producer: &TxProducer, records: &Writes, timeout: Duration) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    producer.begin_transaction()?;
    for r in records.iter() {
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
                    // The queue drains as the brokers take it and their delivery reports are
                    // served, or as its messages time out.
                    if Instant::now() > deadline {
                        return Err(e);
                    }
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
    // The commit flushes first, through rdkafka's `flush`, which polls 100 ms at a time, and a
    // poll returns at its deadline, not when the delivery reports are in: every commit took
    // 100 ms more. Served here every millisecond (a poll not waiting, then a sleep: a poll of
    // 1 ms spins through its last fraction of one), the commit's flush finds nothing left.
    loop {
        producer.poll(Duration::ZERO);
        if producer.in_flight_count() == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    producer.commit_transaction(timeout)
}

/// A transactional call's error: [`SinkError::Fenced`] when another producer took the id.
pub(crate) fn txn_error(what: &'static str, id: &str, e: &KafkaError) -> SinkError {
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
