//! What a batch becomes for Kafka: records addressed to a topic and partition, ready to go in
//! one transaction.

use std::sync::Arc;

/// A topic with its partition count.
#[derive(Debug, Clone)]
pub(crate) struct Topic {
    pub name: String,
    pub partitions: i32,
}

impl Topic {
    /// `key`'s new value in this compacted topic, in the key's partition.
    pub(crate) fn put(&self, key: String, payload: Vec<u8>) -> Outgoing {
        Outgoing {
            seq: 0,
            topic: self.name.clone(),
            partition: super::names::partition_of(&key, self.partitions),
            key: key.into_bytes(),
            headers: Vec::new(),
            payload,
            tombstone: false,
        }
    }

    /// The deletion of `key` from this compacted topic.
    pub(crate) fn tombstone(&self, key: String) -> Outgoing {
        Outgoing { tombstone: true, ..self.put(key, Vec::new()) }
    }
}

/// One Kafka record of a batch, or a batch's mark.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub seq: u64,
    pub topic: String,
    pub partition: i32,
    pub key: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub payload: Vec<u8>,
    /// A compacted topic's deletion of `key` (no payload at all, not an empty one).
    pub tombstone: bool,
}

impl Outgoing {
    /// What it takes of `max_message_bytes`: key, payload, headers and their framing.
    pub(crate) fn size(&self) -> usize {
        self.key.len() + self.payload.len() + self.headers.iter().map(|(k, v)| k.len() + v.len() + 8).sum::<usize>()
    }
}

/// A batch made ready to write.
#[derive(Debug)]
pub struct Staged {
    pub(crate) edge: String,
    pub(crate) epoch: String,
    pub(crate) lane: u8,
    pub(crate) records: Vec<Outgoing>,
}

/// What one transaction writes: records of its own (state, marks) and the records of batches
/// where they are, not copied (librdkafka copies each as it is sent).
#[derive(Debug, Default)]
pub(crate) struct Writes {
    parts: Vec<Part>,
}

#[derive(Debug)]
enum Part {
    One(Outgoing),
    /// A batch's records from this index on.
    Batch(Arc<Staged>, usize),
}

impl Writes {
    pub(crate) fn push(&mut self, write: Outgoing) {
        self.parts.push(Part::One(write));
    }

    /// `staged`'s records from index `from` on.
    pub(crate) fn batch(&mut self, staged: Arc<Staged>, from: usize) {
        if from < staged.records.len() {
            self.parts.push(Part::Batch(staged, from));
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Every record, in the order added.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Outgoing> {
        self.parts.iter().flat_map(|p| match p {
            Part::One(w) => std::slice::from_ref(w),
            Part::Batch(staged, from) => &staged.records[*from..],
        })
    }
}

impl From<Vec<Outgoing>> for Writes {
    fn from(writes: Vec<Outgoing>) -> Self {
        Self { parts: writes.into_iter().map(Part::One).collect() }
    }
}
