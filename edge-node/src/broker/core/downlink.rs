//! Messages from the cloud's downlink (protocol version 5) entering the broker, and the marks
//! that make their delivery exactly once across a crash.
//!
//! The downlink's driver hands the core a message with the downlink's new position (a
//! [`StoreOp::Mark`]): the mark is made in the same call as the queue entries and the retained
//! copy the message makes, so they reach the session store in one commit, and a restart finds
//! both or neither, and its deliveries go out only once they are committed. A resend after a
//! crash is then told by the position, never delivered twice.
//! Such a message is delivered locally only: it came from the cloud, and a class routing its
//! topic up would send it straight back.

use std::sync::Arc;
use std::time::Instant;

use super::Broker;
use super::durable::StoreOp;
use super::inbound::Refused;
use crate::auth::Rules;
use crate::broker::codec::reason;
use crate::broker::message::Message;

impl Broker {
    /// Delivers `msg` as a client holding `rules` may publish it, held to everything a local
    /// publish is (`Broker::admit`: the topic's length, the user-property cap, the node's
    /// reserved namespace and the ACL (`None`: no ACL), a Response Topic that is a topic name,
    /// the schema the topic is bound to), with `mark` under `key` in the same commit. Returns
    /// the last op made, which the caller waits for before it acknowledges the message
    /// upstream; or why the message was refused (nothing made, the mark neither).
    pub(crate) fn publish_downlink(
        &mut self,
        rules: Option<&Rules>,
        mut msg: Message,
        key: &'static str,
        mark: String,
        now: Instant,
    ) -> Result<u64, Refused> {
        msg.schema = self.admit(rules, false, &msg.topic, &msg.props, 0, (&msg.payload, None))?;
        if msg.retain && !msg.payload.is_empty() && !self.retained.has_room(&msg) {
            return Err(Refused { label: "retained_full", code: reason::QUOTA_EXCEEDED, text: None });
        }
        // Its deliveries go out once the mark is committed: a crash before that forgets it was
        // delivered at all, and the cloud's resend is then its only copy ([MQTT-3.3.1-1]: a
        // second copy would carry no DUP).
        let mark = self.store(StoreOp::Mark { key, value: mark });
        let msg = Arc::new(msg);
        self.accept_local_after(None, &msg, msg.retain, mark, now);
        Ok(self.last_op)
    }

    /// Stores `mark` under `key` alone (a message refused or expired moves the position too);
    /// returns its op.
    pub(crate) fn store_mark(&mut self, key: &'static str, mark: String) -> u64 {
        self.store(StoreOp::Mark { key, value: mark })
    }
}
