//! The downlink in the sink: messages for edges' local MQTT topics, each edge's position (the
//! last seq it acked: never lowered), and the messages an edge refused or let expire (the
//! downlink's dead letters).
//!
//! - A message is stored once per edge. A send to a group or to every edge is written once for
//!   each of them by `cloud-bridge send`: each edge then reads one place, in order, and its
//!   backlog bound counts what it alone holds.
//! - A message's seq is the sink's own (SQLite's, one space per edge; JetStream's stream
//!   sequence, with other edges' messages between): it increases in the order the edge's
//!   messages were stored, and nothing one edge claims moves another's.
//! - An edge's backlog is what lies after its position. Past [`DownBounds`] a send is refused
//!   with the backlog it met ([`Enqueued::Full`]), never dropped.
//! - A refusal or an expiry is kept only for a message the sink holds for that edge: an edge
//!   cannot invent dead letters.
//!
//! `sink::sqlite::downlink` and `sink::jetstream::downlink` say where each lives.

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shared::proto::USER_PROPERTY_COST;
use shared::proto::down::{Down, DownRefusal};

use super::error::SinkError;

/// A message for an edge's local topic, as `send` stores it and the bridge reads it back.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Outgoing {
    pub topic: String,
    pub payload: Vec<u8>,
    pub qos: u8,
    #[serde(default)]
    pub retain: bool,
    /// When it expires, ms since the Unix epoch; none: never.
    #[serde(default)]
    pub expires_at_ms: Option<u64>,
    #[serde(default)]
    pub user_properties: Vec<(String, String)>,
    #[serde(default)]
    pub response_topic: Option<String>,
    #[serde(default)]
    pub correlation_data: Option<Vec<u8>>,
    #[serde(default)]
    pub content_type: Option<String>,
    /// The sender's id for it (`send --id`): a send with an id the sink holds for the edge
    /// (see [`SEND_IDS`]) is not stored again. Not delivered.
    #[serde(skip)]
    pub id: Option<String>,
}

/// The send ids a sink keeps per edge: at most this many, for at most this long.
pub(crate) const SEND_IDS: (usize, Duration) = (128, Duration::from_secs(24 * 3600));

impl Outgoing {
    /// What it counts for in an edge's backlog bound: its variable bytes, as the session's
    /// window weighs them.
    pub fn bytes(&self) -> u64 {
        let props: usize = self.user_properties.iter().map(|(k, v)| k.len() + v.len() + USER_PROPERTY_COST).sum();
        (self.topic.len()
            + self.payload.len()
            + props
            + self.response_topic.as_ref().map_or(0, String::len)
            + self.correlation_data.as_ref().map_or(0, Vec::len)
            + self.content_type.as_ref().map_or(0, String::len)) as u64
    }

    /// The frame for it at `now_ms`: what is left of its expiry, or, once that ran out, an
    /// empty message expiring at once (the edge reports it expired and its position passes it;
    /// the payload is not worth sending).
    pub(crate) fn to_down(&self, seq: u64, now_ms: u64) -> Down {
        let left = self.expires_at_ms.map(|at| at.saturating_sub(now_ms));
        if left == Some(0) {
            return Down {
                seq,
                topic: self.topic.clone(),
                payload: Vec::new(),
                qos: self.qos,
                retain: false,
                expires_in_ms: Some(0),
                user_properties: Vec::new(),
                response_topic: None,
                correlation_data: None,
                content_type: None,
            };
        }
        Down {
            seq,
            topic: self.topic.clone(),
            payload: self.payload.clone(),
            qos: self.qos,
            retain: self.retain,
            expires_in_ms: left,
            user_properties: self.user_properties.clone(),
            response_topic: self.response_topic.clone(),
            correlation_data: self.correlation_data.clone(),
            content_type: self.content_type.clone(),
        }
    }
}

/// A stored message for one edge, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub seq: u64,
    /// When it was stored, ms since the Unix epoch.
    pub stored_ms: u64,
    pub msg: Outgoing,
    /// Why what was stored is not a message (a header that does not parse, from a publisher
    /// other than `send`): the bridge sets it aside with this reason and lets it expire.
    pub invalid: Option<String>,
}

/// How much one edge may have waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownBounds {
    pub messages: u64,
    pub bytes: u64,
}

/// How much one read of an edge's downlink takes at most: messages, and bytes as
/// [`Outgoing::bytes`] counts them. The message that reaches `bytes` is the last one taken, so
/// a read takes at least one: a message past the budget is read alone, never stuck.
///
/// The bytes bound what a bridge holds of an edge's downlink between its read and its window
/// (`downlink.window_bytes`): any NATS or Kafka client that can write the stream can make each
/// message as large as the cluster allows, and a read bounded by count alone held a window's
/// count of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimit {
    pub messages: usize,
    pub bytes: u64,
}

impl ReadLimit {
    /// Up to `n` messages, whatever they weigh.
    pub fn messages(n: usize) -> Self {
        Self { messages: n, bytes: u64::MAX }
    }

    /// Whether a read that took `count` messages of `bytes` in all takes no more.
    pub fn reached(&self, count: usize, bytes: u64) -> bool {
        count >= self.messages || bytes >= self.bytes
    }
}

/// What an edge has waiting after its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Backlog {
    pub messages: u64,
    pub bytes: u64,
    /// When the oldest was stored, ms since the Unix epoch.
    pub oldest_ms: Option<u64>,
}

/// What a send did for one edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    Stored {
        seq: u64,
    },
    /// A send with this message's id stored it already, as `seq`.
    Already {
        seq: u64,
    },
    /// Refused: the edge's backlog was this, and one more would pass its bound.
    Full(Backlog),
}

/// What a batch of sends to one edge did ([`DownlinkStore::enqueue_many`]).
#[derive(Debug, Default)]
pub struct EnqueuedMany {
    /// One outcome per message, in order, from the first.
    pub done: Vec<Enqueued>,
    /// What stopped the batch, if something did. The messages after `done` may or may not be
    /// stored (the one it stopped at, or, where a sink writes a batch at once, later ones): a
    /// send with ids is safe to repeat.
    pub error: Option<SinkError>,
}

impl EnqueuedMany {
    /// `items` through `store` a chunk of `size` at a time, in order, as
    /// [`DownlinkStore::enqueue_many`] has it: once a message is refused as full the rest are
    /// refused with the same backlog without being tried (a later chunk stored past it would be
    /// out of order), and a failure stops it.
    pub(crate) async fn in_chunks<'a, T, F, Fut>(items: &'a [T], size: usize, mut store: F) -> Self
    where
        F: FnMut(&'a [T]) -> Fut,
        Fut: Future<Output = Self>,
    {
        let mut out = Self::default();
        for chunk in items.chunks(size) {
            if let Some(full @ Enqueued::Full(_)) = out.done.last().copied() {
                out.done.extend(std::iter::repeat_n(full, chunk.len()));
                continue;
            }
            let Self { done, error } = store(chunk).await;
            out.done.extend(done);
            if error.is_some() {
                out.error = error;
                break;
            }
        }
        out
    }
}

/// An edge's downlink as the sink keeps it: its position and what it did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DownState {
    pub position: u64,
    pub delivered: u64,
    pub refused: u64,
    pub expired: u64,
}

/// What an edge's ack finished: the position, the refusals and expiries it names (an edge names
/// them again until it hears they were recorded), and how many of the messages it newly covers
/// ended each way.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DownDone {
    pub up_to: u64,
    pub refused: Vec<DownRefusal>,
    pub expired: Vec<u64>,
    pub counts: DoneCounts,
}

/// Messages an ack newly covers, by outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DoneCounts {
    pub delivered: u64,
    pub refused: u64,
    pub expired: u64,
    /// Their bytes ([`Outgoing::bytes`]), all outcomes.
    pub bytes: u64,
}

/// A message an edge did not deliver, kept where an operator finds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownDeadLetter {
    pub edge: String,
    pub seq: u64,
    pub topic: String,
    /// `refused`, `expired` or `invalid` (set aside by the bridge).
    pub outcome: String,
    pub reason: String,
    /// When it was set aside, ms since the Unix epoch.
    pub at_ms: u64,
    pub bytes: u64,
}

impl DownDeadLetter {
    /// A dead letter as the sinks that keep headers store it (`Edge-Id`, `Edge-Down-Seq`,
    /// `Mqtt-Topic`, `Edge-Outcome`, `Edge-Reason`, `Edge-At-Ms`, `Edge-Bytes`), read through
    /// `header` (empty where missing).
    pub(crate) fn from_headers(header: impl Fn(&str) -> String) -> Self {
        Self {
            edge: header("Edge-Id"),
            seq: header("Edge-Down-Seq").parse().unwrap_or(0),
            topic: header("Mqtt-Topic"),
            outcome: header("Edge-Outcome"),
            reason: header("Edge-Reason"),
            at_ms: header("Edge-At-Ms").parse().unwrap_or(0),
            bytes: header("Edge-Bytes").parse().unwrap_or(0),
        }
    }
}

/// Downlink dead letters the fleet view lists: the newest.
pub(crate) const REFUSED_SHOWN: usize = 20;

/// One edge's downlink in the fleet view: its state and what waits for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownSummary {
    pub edge: String,
    pub state: DownState,
    pub waiting: u64,
    /// Their bytes, where the sink counts them cheaply (SQLite; JetStream keeps no byte count
    /// per subject, and `downlink status` reads one edge's).
    pub waiting_bytes: Option<u64>,
    /// When the oldest waiting was stored, ms since the Unix epoch.
    pub oldest_ms: Option<u64>,
}

/// A local app's reply to a message, as it reached the sink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub payload: Vec<u8>,
    /// Its headers as the uplink stored them (`Mqtt-Topic`, user properties, ...).
    pub headers: Vec<(String, String)>,
}

/// What a sink needs per message beyond a message's own bytes ([`Outgoing::bytes`]): its
/// headers and encoding, at most.
pub(crate) const DOWN_HEADERS: u64 = 16 << 10;

/// The most one stored message may weigh in a sink (payload and headers), and whose limit it is;
/// and how many of an edge's messages past its position one read finds, if the sink has a limit
/// there, and whose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownLimit {
    pub bytes: u64,
    pub of: &'static str,
    /// A window past it would find its reads short while the edge has not acked, and wait for
    /// news or `downlink.poll` after every window.
    pub reach: Option<(usize, &'static str)>,
}

/// The downlink's storage. See the module doc.
pub trait DownlinkStore: Send + Sync + 'static {
    /// What one message may weigh here.
    fn down_limit(&self) -> DownLimit;

    /// Stores `msg` for `edge` after what it has waiting, unless that would pass `bounds`: a
    /// batch of one.
    fn enqueue(
        &self,
        edge: &str,
        msg: &Outgoing,
        bounds: DownBounds,
    ) -> impl Future<Output = Result<Enqueued, SinkError>> + Send {
        async move {
            let mut many = self.enqueue_many(edge, std::slice::from_ref(msg), bounds).await;
            match (many.error, many.done.pop()) {
                (Some(e), _) => Err(e),
                (None, Some(done)) => Ok(done),
                (None, None) => Err(SinkError::invalid("downlink enqueue", "the sink answered nothing (a bug)")),
            }
        }
    }

    /// Stores `msgs` for `edge` in their order, each after what the edge has waiting unless
    /// that would pass `bounds`, paying the sink's round trips once per batch where it can.
    /// Once one is refused as full the rest are too, without being tried: a smaller later
    /// message stored past a refused one would reach the edge out of the order it was given in.
    fn enqueue_many(
        &self,
        edge: &str,
        msgs: &[Outgoing],
        bounds: DownBounds,
    ) -> impl Future<Output = EnqueuedMany> + Send;

    /// Sets aside `edge`'s newest messages while more than `bounds.messages` wait for it, at
    /// most `max` of them: messages another publisher stored past the bound `send` keeps. How
    /// many it set aside.
    fn down_trim(
        &self,
        edge: &str,
        bounds: DownBounds,
        max: usize,
    ) -> impl Future<Output = Result<u64, SinkError>> + Send;

    /// `edge`'s position and counts (all zero for an edge never written).
    fn down_state(&self, edge: &str) -> impl Future<Output = Result<DownState, SinkError>> + Send;

    /// `edge`'s messages after seq `after`, in order, as many as `max` lets one read take.
    fn down_read(
        &self,
        edge: &str,
        after: u64,
        max: ReadLimit,
    ) -> impl Future<Output = Result<Vec<Pending>, SinkError>> + Send;

    /// Records `done`: the dead letters it names (of messages stored for `edge` only), then the
    /// position and counts, unless a position as far or further is there already.
    fn down_record(&self, edge: &str, done: &DownDone) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Sets aside message `seq` of `edge` as `outcome` with `reason`, if the sink holds it.
    fn down_set_aside(
        &self,
        edge: &str,
        seq: u64,
        outcome: &'static str,
        reason: &str,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// What `edge` has waiting after its position.
    fn down_backlog(&self, edge: &str) -> impl Future<Output = Result<Backlog, SinkError>> + Send;

    /// The newest `limit` dead letters of the downlink, of `edge` or of all, oldest first.
    fn down_dead_letters(
        &self,
        edge: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DownDeadLetter>, SinkError>> + Send;

    /// Every edge with a downlink position or a message waiting, in id order.
    fn down_summary(&self) -> impl Future<Output = Result<Vec<DownSummary>, SinkError>> + Send;

    /// Where the sink's records end now: [`DownlinkStore::find_reply`] looks only after it.
    fn reply_cursor(&self) -> impl Future<Output = Result<u64, SinkError>> + Send;

    /// A record of `edge` on `topic`, stored after `cursor`, whose correlation data is
    /// `correlation`: a local app's reply to a message sent with that response topic.
    fn find_reply(
        &self,
        edge: &str,
        topic: &str,
        correlation: &[u8],
        cursor: u64,
    ) -> impl Future<Output = Result<Option<Reply>, SinkError>> + Send;

    /// The edges that got messages since `cursor` (none: since now), and the cursor to ask
    /// with next; waits up to `wait` for some. Wakes the sessions of those edges; a session
    /// also reads on a timer of its own, so news a sink misses is late, not lost.
    fn down_news(
        &self,
        cursor: Option<u64>,
        wait: Duration,
    ) -> impl Future<Output = Result<(u64, Vec<String>), SinkError>> + Send;
}

/// What to record of an ack through `up_to` that newly covers `count` messages of `bytes`
/// after `from`: those of its refusals and expiries after `from` are new, the rest were
/// delivered. Refusals and expiries at or below `from` are kept only with `catch_up` (the
/// first ack of a connection, naming what an earlier bridge may have failed to record); an
/// edge repeats them in every ack until told they are recorded, and recording them again would
/// let one frame cost thousands of sink calls. `None`: nothing new to record.
pub(crate) fn done(
    from: u64,
    (count, bytes): (u64, u64),
    up_to: u64,
    (mut refused, mut expired): (Vec<DownRefusal>, Vec<u64>),
    catch_up: bool,
) -> Option<DownDone> {
    if !catch_up {
        refused.retain(|r| r.seq > from);
        expired.retain(|s| *s > from);
    }
    if up_to == from && refused.is_empty() && expired.is_empty() {
        return None;
    }
    let new_refused = refused.iter().filter(|r| r.seq > from).count() as u64;
    let new_expired = expired.iter().filter(|s| **s > from).count() as u64;
    let counts = DoneCounts {
        delivered: count.saturating_sub(new_refused + new_expired),
        refused: new_refused,
        expired: new_expired,
        bytes,
    };
    Some(DownDone { up_to, refused, expired, counts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ack_records_only_what_is_new_after_the_first_of_its_connection() {
        let refusal = |seq| DownRefusal { seq, reason: "no".into() };
        let old: Vec<DownRefusal> = (1..=4096).map(refusal).collect();
        // The first ack of a connection catches up what an earlier bridge may not have recorded.
        let first = done(5000, (0, 0), 5000, (old.clone(), vec![4097]), true).expect("old ones to record");
        assert_eq!((first.refused.len(), first.expired, first.counts), (4096, vec![4097], DoneCounts::default()));
        // Later acks repeating them cost nothing.
        assert_eq!(done(5000, (0, 0), 5000, (old.clone(), vec![4097]), false), None);
        // New messages: only what lies after the position is recorded and counted.
        let mut listed = old;
        listed.push(refusal(5002));
        let next = done(5000, (3, 30), 5003, (listed, vec![4097, 5003]), false).unwrap();
        assert_eq!(next.refused, [refusal(5002)]);
        assert_eq!(next.expired, [5003]);
        assert_eq!(next.counts, DoneCounts { delivered: 1, refused: 1, expired: 1, bytes: 30 });
    }

    #[test]
    fn an_expired_message_goes_as_an_empty_one_that_expires_at_once() {
        let m = Outgoing {
            topic: "cmd/x".into(),
            payload: vec![1; 100],
            qos: 2,
            retain: true,
            expires_at_ms: Some(10_000),
            user_properties: vec![("k".into(), "v".into())],
            ..Default::default()
        };
        let live = m.to_down(7, 9_000);
        assert_eq!((live.seq, live.expires_in_ms, live.payload.len(), live.retain), (7, Some(1_000), 100, true));
        let dead = m.to_down(7, 10_000);
        assert_eq!((dead.expires_in_ms, dead.payload.len(), dead.retain), (Some(0), 0, false));
        assert_eq!(m.bytes(), 5 + 100 + 2 + USER_PROPERTY_COST as u64);
        assert_eq!(Outgoing { expires_at_ms: None, ..m }.to_down(1, u64::MAX).expires_in_ms, None);
    }
}
