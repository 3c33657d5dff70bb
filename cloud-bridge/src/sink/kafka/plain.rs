//! Writes where the latest value is what counts and one writer per key (a bridge's own state,
//! an edge's report, the state of a session the writer holds): an idempotent producer without
//! transactions, each put waited for until the brokers have it.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::context::Context;
use super::outgoing::Topic;
use super::settings::KafkaSettings;
use super::{kafka_error, names::partition_of};
use crate::sink::SinkError;

/// How long a put may wait in the producer's queue for a broker.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct Plain {
    producer: FutureProducer<Context>,
}

impl Plain {
    pub(crate) fn new(settings: &KafkaSettings) -> Result<Self, SinkError> {
        let producer = settings
            .client()?
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "1")
            // Room for a downlink message's headers besides its bytes.
            .set(
                "message.max.bytes",
                (settings.max_message_bytes.max(super::settings::TOPIC_BYTES) + 65536).to_string(),
            )
            .create_with_context(Context::default())
            .map_err(|e| kafka_error("producer", &e))?;
        Ok(Self { producer })
    }

    /// Stores `value` as `key`'s in compacted `topic`, in the key's partition.
    pub(crate) async fn put(&self, topic: &Topic, key: &str, value: &[u8]) -> Result<(), SinkError> {
        let record =
            FutureRecord::to(&topic.name).partition(partition_of(key, topic.partitions)).key(key).payload(value);
        self.producer.send(record, QUEUE_TIMEOUT).await.map(|_| ()).map_err(|(e, _)| kafka_error("put", &e))
    }

    /// Writes a record to `partition` of `topic`; its offset once the brokers have it.
    pub(crate) async fn send(
        &self,
        (topic, partition): (&str, i32),
        key: &str,
        headers: &[(&str, String)],
        payload: &[u8],
    ) -> Result<i64, SinkError> {
        let mut h = OwnedHeaders::new_with_capacity(headers.len());
        for (name, value) in headers {
            h = h.insert(Header { key: name, value: Some(value.as_bytes()) });
        }
        let record = FutureRecord::to(topic).partition(partition).key(key).headers(h).payload(payload);
        self.producer.send(record, QUEUE_TIMEOUT).await.map(|d| d.offset).map_err(|(e, _)| kafka_error("send", &e))
    }
}
