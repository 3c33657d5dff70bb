//! Messages from the cloud's downlink (protocol version 5) entering the broker, and the marks
//! that make their delivery exactly once across a crash.
//!
//! The downlink's driver hands the core a message with the downlink's new position (a
//! [`StoreOp::Mark`]): the mark is made in the same call as the queue entries and the retained
//! copy the message makes, so they reach the session store in one commit, and a restart finds
//! both or neither. A resend after a crash is then told by the position, never delivered twice.
//! Such a message is delivered locally only: it came from the cloud, and a class routing its
//! topic up would send it straight back.

use std::sync::Arc;
use std::time::Instant;

use super::Broker;
use super::durable::StoreOp;
use crate::auth::Rules;
use crate::broker::message::Message;

impl Broker {
    /// Delivers `msg` as a client holding `rules` may publish it (its ACL and the node's
    /// reserved namespace apply; `None`: no ACL), with `mark` under `key` in the same commit.
    /// Returns the last op made, which the caller waits for before it acknowledges the
    /// message upstream; or why the message was refused (nothing made, the mark neither).
    pub fn publish_downlink(
        &mut self,
        rules: Option<&Rules>,
        msg: Message,
        key: &'static str,
        mark: String,
        now: Instant,
    ) -> Result<u64, &'static str> {
        if msg.topic.len() > self.limits.max_topic_length {
            return Err("topic_too_long");
        }
        if let Some(label) = self.publish_refusal(rules, false, &msg.topic) {
            return Err(label);
        }
        if msg.retain && !msg.payload.is_empty() && !self.retained.has_room(&msg) {
            return Err("retained_full");
        }
        self.store(StoreOp::Mark { key, value: mark });
        let msg = Arc::new(msg);
        self.accept_local(None, &msg, msg.retain, now);
        Ok(self.last_op)
    }

    /// Stores `mark` under `key` alone (a message refused or expired moves the position too);
    /// returns its op.
    pub fn store_mark(&mut self, key: &'static str, mark: String) -> u64 {
        self.store(StoreOp::Mark { key, value: mark })
    }
}
