//! `[downlink]`: how much of an edge's downlink may be unanswered on its session, how much may
//! wait for it in the sink, how often a session looks for messages no news told it of, and the
//! groups `cloud-bridge send --group` addresses.

use shared::check::Problems;
use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shared::proto::down::{MAX_DOWN_BYTES, MAX_DOWN_WINDOW};
use shared::units::{ByteSize, HumanDuration};

use crate::sink::downlink::{DOWN_HEADERS, DownLimit, Outgoing};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DownlinkConfig {
    /// Messages sent to an edge and not yet acked, at most. Delivery is bound by round trips per
    /// window (a read, the edge's commit and ack, the record); `window_bytes` bounds what the
    /// edge holds meanwhile whatever the count. At most 256, what an edge holds unanswered
    /// (past it the edge ends the session). Default: 256.
    pub window_messages: usize,
    /// Their bytes, at most (one message is sent whatever its size). Default: 4 MiB.
    pub window_bytes: ByteSize,
    /// Messages waiting in the sink for one edge, at most: `send` refuses the next one with a
    /// clear error. Default: 10,000.
    pub max_backlog_messages: u64,
    /// Their bytes (topic, payload and properties), at most. Default: 64 MiB.
    pub max_backlog_bytes: ByteSize,
    /// One message's bytes (topic, payload and properties), at most, on every sink alike: `send`
    /// refuses a larger one, and the bridge sets aside a larger one another publisher stored.
    /// At most 4 MiB (a downlink frame's limit); the bridge refuses to start when its sink holds
    /// less (a JetStream sink: nats-server's `max_payload`, 1 MiB unless raised, less 16 KiB
    /// for headers). Default: 1000 KiB.
    pub max_message_bytes: ByteSize,
    /// A message's topic, at most, in bytes: `send` refuses a longer one. An edge refuses a
    /// topic past its own `broker.max_topic_length` (1024 by default). Default: 1024.
    pub max_topic_bytes: usize,
    /// How often a connected edge's session reads the sink without news of a message for it.
    /// News comes at once, and the bridge's news reader wakes every session after it lost the
    /// sink, so this is a safety net only; each of it costs a sink read per connected edge
    /// (10,000 edges at 5s: 2,000 reads a second). An edge's first one falls due between half
    /// of it and all of it, by its id, so edges that connected together poll apart.
    /// Default: 60s.
    pub poll: HumanDuration,
    /// How often the bridge reads the fleet's downlink summary for its backlog gauges.
    /// Default: 15s.
    pub summary_interval: HumanDuration,
    /// Named groups of edges for `cloud-bridge send --group NAME`: `name = ["edge-1", ...]`.
    /// Kept here, in the config of the bridge (and of `send`), not in the sink: a group is an
    /// operator's decision, reviewed like the rest of the config.
    pub groups: BTreeMap<String, Vec<String>>,
}

impl Default for DownlinkConfig {
    fn default() -> Self {
        Self {
            window_messages: 256,
            window_bytes: ByteSize::mib(4),
            max_backlog_messages: 10_000,
            max_backlog_bytes: ByteSize::mib(64),
            max_message_bytes: ByteSize(1000 << 10),
            max_topic_bytes: 1024,
            poll: HumanDuration(Duration::from_secs(60)),
            summary_interval: HumanDuration(Duration::from_secs(15)),
            groups: BTreeMap::new(),
        }
    }
}

impl DownlinkConfig {
    /// Every problem, at its key.
    pub(crate) fn check(&self, p: &mut Problems) {
        let zero = [
            ("downlink.window_messages", self.window_messages as u64),
            ("downlink.window_bytes", self.window_bytes.bytes()),
            ("downlink.max_backlog_messages", self.max_backlog_messages),
            ("downlink.max_backlog_bytes", self.max_backlog_bytes.bytes()),
            ("downlink.max_message_bytes", self.max_message_bytes.bytes()),
            ("downlink.max_topic_bytes", self.max_topic_bytes as u64),
        ];
        for (key, v) in zero {
            if v == 0 {
                p.bad(key, "must be at least 1");
            }
        }
        if self.window_messages > MAX_DOWN_WINDOW {
            p.bad(
                "downlink.window_messages",
                format!(
                    "{} is more than an edge holds unanswered ({MAX_DOWN_WINDOW}): past it the edge ends its session",
                    self.window_messages
                ),
            );
        }
        if self.max_message_bytes.bytes() > MAX_DOWN_BYTES as u64 {
            p.bad(
                "downlink.max_message_bytes",
                format!(
                    "{} is more than a downlink message may hold ({})",
                    self.max_message_bytes,
                    ByteSize(MAX_DOWN_BYTES as u64)
                ),
            );
        }
        if self.max_topic_bytes > u16::MAX as usize {
            p.bad("downlink.max_topic_bytes", format!("{} is over MQTT's 65535", self.max_topic_bytes));
        }
        if self.poll.0.is_zero() {
            p.bad("downlink.poll", "must be more than 0");
        }
        if self.summary_interval.0.is_zero() {
            p.bad("downlink.summary_interval", "must be more than 0");
        }
        for (name, edges) in &self.groups {
            if edges.is_empty() {
                p.bad(format!("downlink.groups.{name}"), "names no edge");
            }
            if let Some(e) = edges.iter().find(|e| e.is_empty()) {
                p.bad(format!("downlink.groups.{name}"), format!("{e:?} is not an edge id"));
            }
        }
    }

    /// Why `msg` is not one to store, by this config's per-message bounds.
    pub(crate) fn refuses(&self, msg: &Outgoing) -> Option<String> {
        if msg.topic.len() > self.max_topic_bytes {
            return Some(format!(
                "--topic: {} bytes, more than downlink.max_topic_bytes ({})",
                msg.topic.len(),
                self.max_topic_bytes
            ));
        }
        (msg.bytes() > self.max_message_bytes.bytes()).then(|| {
            format!(
                "the message is {} bytes (topic, payload and properties), more than downlink.max_message_bytes ({})",
                msg.bytes(),
                self.max_message_bytes
            )
        })
    }

    /// Whether a sink that holds `limit` per message (and says why in `of`) can keep every
    /// message this config lets through, and its reads find a window's worth past an edge's
    /// position.
    pub fn fits(&self, limit: DownLimit) -> Result<(), String> {
        let need = self.max_message_bytes.bytes() + DOWN_HEADERS;
        if need > limit.bytes {
            return Err(format!(
                "downlink.max_message_bytes ({}) and 16 KiB for headers is more than the sink holds per message \
                 ({}, {}): lower downlink.max_message_bytes or raise the sink's limit",
                self.max_message_bytes,
                ByteSize(limit.bytes),
                limit.of
            ));
        }
        if let Some((reach, of)) = limit.reach.filter(|(reach, _)| self.window_messages > *reach) {
            return Err(format!(
                "downlink.window_messages ({}) is more than the sink finds of an edge's messages past its position \
                 ({reach}, {of}): a read would come back short whenever a window was out; raise {of} or lower the window",
                self.window_messages
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window the sink's reads cannot fill past an edge's position is refused, naming both
    /// keys: with the Kafka sink indexing fewer per edge than the window, a backlog waited for
    /// `downlink.poll` after every read that came back short.
    #[test]
    fn a_window_past_what_the_sinks_reads_find_is_refused() {
        let limit = |reach| DownLimit { bytes: 10 << 20, of: "test", reach };
        let c = DownlinkConfig::default();
        assert_eq!(c.fits(limit(None)), Ok(()));
        assert_eq!(c.fits(limit(Some((256, "sink.downlink.max_indexed_per_edge")))), Ok(()));
        let why = c.fits(limit(Some((255, "sink.downlink.max_indexed_per_edge")))).unwrap_err();
        assert!(
            why.contains("downlink.window_messages (256)") && why.contains("(255, sink.downlink.max_indexed_per_edge)"),
            "{why}"
        );
    }

    #[test]
    fn sizes_take_units_and_each_problem_is_named_by_its_key() {
        let c: DownlinkConfig =
            toml::from_str("window_bytes = \"1MiB\"\nmax_backlog_bytes = 4096\n[groups]\nlab = [\"a\", \"b\"]\n")
                .unwrap();
        assert_eq!((c.window_bytes.bytes(), c.max_backlog_bytes.bytes()), (1 << 20, 4096));
        assert_eq!(c.groups["lab"], ["a", "b"]);
        let mut p = Problems::default();
        c.check(&mut p);
        assert!(p.is_empty(), "{p:?}");
        let bad = [
            ("window_messages = 0", "downlink.window_messages"),
            ("window_messages = 257", "downlink.window_messages"),
            ("max_backlog_bytes = \"0B\"", "downlink.max_backlog_bytes"),
            ("max_message_bytes = \"5MiB\"", "downlink.max_message_bytes"),
            ("max_topic_bytes = 65536", "downlink.max_topic_bytes"),
            ("poll = \"0s\"", "downlink.poll"),
            ("[groups]\nnone = []", "downlink.groups.none"),
            ("[groups]\nblank = [\"\"]", "downlink.groups.blank"),
        ];
        for (text, key) in bad {
            let c: DownlinkConfig = toml::from_str(text).unwrap();
            let mut p = Problems::default();
            c.check(&mut p);
            assert_eq!(p.first().map(|p| p.key).as_deref(), Some(key), "{text}");
        }
        assert!(toml::from_str::<DownlinkConfig>("windows = 3").is_err(), "unknown keys are refused");
    }
}
