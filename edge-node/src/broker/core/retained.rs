//! The retained store: the last retained message per topic, bounded in count and bytes.
//!
//! [MQTT-3.3.1-5]: a retained PUBLISH replaces the topic's message; [MQTT-3.3.1-6],
//! [MQTT-3.3.1-7]: one with an empty payload removes it and is not stored itself. A new topic
//! over either bound is refused (the caller answers and counts it); replacing a topic's message
//! is refused only if its larger size would pass the byte bound. An expired message is dropped
//! when a lookup finds it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::broker::message::Message;

/// Why a retained message was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainRefusal {
    /// `max_retained_messages` topics are held already.
    Count,
    /// Storing it would pass `max_retained_bytes`.
    Bytes,
}

#[derive(Debug)]
pub struct Retained {
    messages: HashMap<Arc<str>, Arc<Message>>,
    bytes: usize,
    max_messages: usize,
    max_bytes: usize,
}

impl Retained {
    pub fn new(max_messages: usize, max_bytes: usize) -> Self {
        Self { messages: HashMap::new(), bytes: 0, max_messages, max_bytes }
    }

    /// Stores (or, with an empty payload, clears) the topic's retained message.
    pub fn store(&mut self, msg: &Arc<Message>) -> Result<(), RetainRefusal> {
        if msg.payload.is_empty() {
            if let Some(old) = self.messages.remove(&msg.topic) {
                self.bytes -= old.weight();
            }
            return Ok(());
        }
        let old = self.messages.get(&msg.topic).map_or(0, |m| m.weight());
        if old == 0 && self.messages.len() >= self.max_messages {
            return Err(RetainRefusal::Count);
        }
        if self.bytes - old + msg.weight() > self.max_bytes {
            return Err(RetainRefusal::Bytes);
        }
        self.bytes = self.bytes - old + msg.weight();
        self.messages.insert(msg.topic.clone(), msg.clone());
        Ok(())
    }

    /// Whether `msg` would be stored (a new topic within the count, and the bytes within
    /// theirs).
    pub fn has_room(&self, msg: &Message) -> bool {
        let old = self.messages.get(&msg.topic).map_or(0, |m| m.weight());
        (old != 0 || self.messages.len() < self.max_messages) && self.bytes - old + msg.weight() <= self.max_bytes
    }

    /// The retained messages `filter` matches, in no particular order; drops expired ones.
    pub fn matching(&mut self, filter: &str, now: Instant) -> Vec<Arc<Message>> {
        let wild = filter.contains(['+', '#']);
        let mut expired = Vec::new();
        let mut out = Vec::new();
        if wild {
            for (topic, msg) in &self.messages {
                if shared::topic::matches(filter, topic) {
                    if msg.expired(now) { expired.push(topic.clone()) } else { out.push(msg.clone()) }
                }
            }
        } else if let Some(msg) = self.messages.get(filter) {
            if msg.expired(now) { expired.push(msg.topic.clone()) } else { out.push(msg.clone()) }
        }
        for topic in expired {
            if let Some(old) = self.messages.remove(&topic) {
                self.bytes -= old.weight();
            }
        }
        out
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
