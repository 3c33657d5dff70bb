//! The downlink in JetStream: a stream of its own (`DOWN` by default) with subjects
//! `<prefix>.<edge>.<topic levels>` (`down` by default; tokens as `names` makes them for the
//! uplink), so anyone with a NATS client can send an edge a message:
//! `nats pub down.edge-1.config.threshold 0.7` reaches topic `config/threshold` on edge
//! `edge-1`. The subject alone names the topic, so NATS permissions on subjects bound what
//! topics a publisher reaches (an `Mqtt-Topic` header naming another is refused). What MQTT
//! has beyond topic and payload travels as headers, named as the uplink names them
//! (`Mqtt-Qos`, default 1; `Mqtt-Retain: 1`; `Mqtt-Expires-At`, ms since the Unix epoch;
//! `Mqtt-Response-Topic`; `Mqtt-Correlation-Data`, base64; `Mqtt-Content-Type`;
//! `Mqtt-User-Properties`, a JSON list of `[name, value]` pairs in order; any other header not
//! reserved is a user property too, after those, by name). A message whose subject or headers
//! do not parse (bytes that are not UTF-8 among them) is set aside with the reason, not
//! delivered.
//!
//! - Messages are read only through the JSON API (`raw`): async-nats drops its connection at
//!   a delivered message whose subject or headers are not UTF-8, which any publisher can write.
//! - An edge's position and counts are a JSON document in a KV bucket (`edge-down`), raised
//!   with compare-and-set, never lowered; the messages at or below it are purged.
//! - An edge's seq for a message is the stream's sequence plus a base of the edge's own, kept
//!   in that document with the stream it counts in: a stream deleted and made again starts its
//!   sequence over, and the edges' seqs go on past what they hold (`positions`).
//! - Dead letters go to `<prefix>.%dead.<edge>` in the same stream (no edge token starts with a
//!   bare `%`: `names` encodes it), with the message's payload and headers and the reason.
//! - News: the bridge reads the stream after its cursor (the sequence it read last) and wakes
//!   the sessions of the edges named; while nothing comes, it looks again at a hint of a new
//!   message (a core NATS subscription on a connection of its own: `hints`) or every 100 ms.
//!   What it read is kept a moment for the sessions it wakes (`ahead`), so a message is got
//!   once, not once for the news and again for the edge.
//! - A send's bound is checked against the messages the stream holds for the edge and the
//!   bytes `send` stored for it (JetStream keeps no byte count per subject).
//! - The summary lists the edges the downlink knows (with a position document), not every
//!   edge id a publisher made up.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures_util::StreamExt;

use super::bucket::{self, Cas, edge_key, read_all, read_doc, unavailable, write_doc};
use super::{DownSettings, JetStreamSink, JsDown, header};
use crate::names;
use crate::sink::downlink::{
    Backlog, DownBounds, DownDeadLetter, DownDone, DownLimit, DownState, DownSummary, DownlinkStore, Enqueued,
    EnqueuedMany, Outgoing, Pending, ReadLimit, Reply, SEND_IDS,
};
use crate::sink::error::SinkError;

mod ahead;
mod headers;
mod hints;

pub(in crate::sink) use ahead::ReadAhead;
pub(in crate::sink) use hints::Hints;
mod positions;
mod raw;

use headers::{headers, parse};
use positions::{PositionDoc, StreamNow};

/// The token dead letters go under, after the prefix.
const DEAD: &str = "%dead";

/// How long a scan of the dead letters may take.
const SCAN: Duration = Duration::from_secs(30);

/// The longest subject a send publishes to: nats-server reads a publish's protocol line
/// (subject, sizes, reply inbox) into at most 4096 bytes by default, and drops the connection
/// past it; the publish then only timed out.
const MAX_SUBJECT: usize = 3800;

/// Attempts of a send whose room another message took meanwhile.
const CAS_ATTEMPTS: usize = 10;

/// The bytes a header block takes on the wire.
fn header_bytes(h: &async_nats::HeaderMap) -> u64 {
    let lines: usize = h
        .iter()
        .map(|(k, vs)| {
            let name: &str = k.as_ref();
            vs.iter().map(|v| name.len() + v.as_str().len() + 4).sum::<usize>()
        })
        .sum();
    (lines + "NATS/1.0\r\n\r\n".len()) as u64
}

/// Whether `e` says a message came first (JetStream's "wrong last sequence").
fn is_wrong_last(e: &jetstream::context::PublishError) -> bool {
    e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence
}

/// After a hint, the stream is looked at again after these waits before the next hint or poll.
/// The first at once: a look just after a hint finds nothing about one time in five (the hint
/// came before the stream stored the message, or its message was read already), and a second
/// look at once found the message in about three of ten of those (down-bench at 200 msg/s),
/// 1-2 ms before the 1 ms timer (on tokio's wheel) would have let it look.
const HINT_AGAIN: [Duration; 4] =
    [Duration::ZERO, Duration::from_millis(1), Duration::from_millis(3), Duration::from_millis(10)];

/// A read's gets at once: at first, and at most.
const READ_FIRST: usize = 4;
const READ_MAX: usize = 64;

/// How often news is looked for while it waits, and how many messages one look reads at most.
const NEWS_POLL: Duration = Duration::from_millis(100);
const NEWS_MAX: usize = 256;
/// What one run of the news read's gets may fetch at most, as far as it knows the sizes.
const NEWS_BYTES: u64 = 4 << 20;

/// Which stream `stream` is now, and where its sequence is.
async fn stream_now(stream: &stream::Stream) -> Result<StreamNow, SinkError> {
    let info = stream
        .get_info()
        .await
        .map_err(|e| SinkError::nats("downlink stream", &stream.cached_info().config.name, &e))?;
    Ok(StreamNow { id: info.created.unix_timestamp_nanos().to_string(), last_seq: info.state.last_sequence })
}

/// Every edge's position and counts (the positions bucket) and what waits for it (the stream's
/// message count per subject: what an edge acked is purged; the oldest's time read per edge
/// that has one).
///
/// Only edges the downlink knows are listed (those with a position document: sent to by
/// `send`, or connected): any NATS client can publish to `down.<anything>`, and a listing of
/// whatever edge ids it made up would grow without bound (with a read per id for its oldest).
/// Messages for an edge the downlink does not know wait until its first session, or expire.
async fn summary(
    js: &jetstream::Context,
    stream: &stream::Stream,
    positions: &kv::Store,
    prefix: &str,
) -> Result<Vec<DownSummary>, SinkError> {
    let what = "downlink summary";
    let mut edges: std::collections::BTreeMap<String, DownSummary> = std::collections::BTreeMap::new();
    let blank = |edge: &str| DownSummary {
        edge: edge.to_owned(),
        state: DownState::default(),
        waiting: 0,
        waiting_bytes: None,
        oldest_ms: None,
    };
    let now = stream_now(stream).await?;
    let mut docs = std::collections::BTreeMap::new();
    for (_, value) in read_all(positions, what).await? {
        let Ok(mut doc) = serde_json::from_slice::<PositionDoc>(&value) else { continue };
        // As its session would count it, without writing: this is a view.
        doc.settle(&now, None);
        edges.entry(doc.edge.clone()).or_insert_with(|| blank(&doc.edge)).state = doc.state;
        docs.insert(doc.edge.clone(), doc);
    }
    let skip = prefix.split('.').count();
    let mut subjects =
        stream.info_with_subjects(format!("{prefix}.*.>")).await.map_err(|e| SinkError::nats(what, prefix, &e))?;
    while let Some(entry) = subjects.next().await {
        let (subject, count) = entry.map_err(|e| SinkError::nats(what, prefix, &e))?;
        let Some(token) = subject.split('.').nth(skip).filter(|t| *t != DEAD) else { continue };
        let Some(edge) = names::topic_of(&[token]) else { continue };
        if let Some(s) = edges.get_mut(&edge) {
            s.waiting += count as u64;
        }
    }
    let name = &stream.cached_info().config.name;
    for s in edges.values_mut().filter(|s| s.waiting > 0) {
        let filter = format!("{prefix}.{}.>", names::token(&s.edge));
        let from =
            docs.get(&s.edge).map_or(1, |d| if d.counts_in(&now) { d.stream_after(s.state.position) } else { 1 });
        match raw::get(js, name, raw::At::Next(from, &filter)).await? {
            Some(m) => s.oldest_ms = Some(m.time_ms),
            None => s.waiting = 0,
        }
    }
    Ok(edges.into_values().collect())
}

/// The downlink summary of the sink at `url`, read without creating anything (for `edges
/// list`): empty where no bridge made the downlink's stream yet.
pub(crate) async fn summary_from(url: &str, s: &DownSettings) -> Result<Vec<DownSummary>, SinkError> {
    let client = super::client(url, Duration::from_secs(10)).await?;
    let js = jetstream::new(client);
    let (Ok(stream), Ok(positions)) = (js.get_stream(&s.stream).await, js.get_key_value(&s.bucket).await) else {
        return Ok(Vec::new());
    };
    summary(&js, &stream, &positions, &s.subject_prefix).await
}

/// The newest `limit` dead letters on `stream` (of `edge`, or of all), oldest first.
async fn dead_letters(
    stream: &stream::Stream,
    prefix: &str,
    edge: Option<&str>,
    limit: usize,
) -> Result<Vec<DownDeadLetter>, SinkError> {
    let what = "downlink dead letters";
    let filter = match edge {
        Some(e) => format!("{}.{DEAD}.{}", prefix, names::token(e)),
        None => format!("{}.{DEAD}.*", prefix),
    };
    let consumer = stream
        .create_consumer(OrderedConfig { filter_subject: filter.clone(), headers_only: true, ..Default::default() })
        .await
        .map_err(|e| SinkError::nats(what, &filter, &e))?;
    let mut out = VecDeque::new();
    if consumer.cached_info().num_pending == 0 {
        return Ok(Vec::new());
    }
    let mut messages = consumer.messages().await.map_err(|e| SinkError::nats(what, &filter, &e))?;
    let scan = async {
        while let Some(m) = messages.next().await {
            let m = m.map_err(|e| SinkError::nats(what, &filter, &e))?;
            let pending = m.info().map_err(|e| unavailable(what, e))?.pending;
            let h = m.headers.clone().unwrap_or_default();
            out.push_back(DownDeadLetter::from_headers(|k| {
                h.get(k).map(|v| v.as_str().to_owned()).unwrap_or_default()
            }));
            if out.len() > limit {
                out.pop_front();
            }
            if pending == 0 {
                break;
            }
        }
        Ok::<_, SinkError>(())
    };
    tokio::time::timeout(SCAN, scan).await.map_err(|_| unavailable(what, "timed out"))??;
    Ok(out.into())
}

/// The newest `limit` downlink dead letters of the sink at `url`, read without creating anything.
pub(crate) async fn dead_letters_from(
    url: &str,
    s: &DownSettings,
    limit: usize,
) -> Result<Vec<DownDeadLetter>, SinkError> {
    let client = super::client(url, Duration::from_secs(10)).await?;
    let Ok(stream) = jetstream::new(client).get_stream(&s.stream).await else { return Ok(Vec::new()) };
    dead_letters(&stream, &s.subject_prefix, None, limit).await
}

/// How many messages of a batch share one read of the edge's document and one write of it.
/// Bytes stored in a chunk a crash cut short are not counted in the edge's byte bound (its
/// message count is the stream's own).
const BATCH: usize = 256;

/// A message of a chunk, stored or not: its stream sequence where it was.
enum Done {
    Stored(u64),
    /// Its id was stored before, as this stream sequence (the stream's duplicate window).
    Already(u64),
    /// Its id was stored before, as this edge seq (the edge's document).
    Kept(u64),
    Full(Backlog),
}

/// An edge's last message (stream sequence) and its count, as a publish knows them.
#[derive(Debug, Clone, Copy)]
struct Known {
    last: u64,
    count: u64,
    /// Just read, not carried over from a publish: a full backlog by it is full.
    fresh: bool,
}

impl JsDown {
    /// The hints of new messages, heard from the first look for news on.
    fn hints(&self) -> &Hints {
        self.hints.get_or_init(|| Hints::start(self.url.clone(), format!("{}.*.>", self.prefix)))
    }

    async fn enqueue_chunk(&self, limit: DownLimit, edge: &str, msgs: &[Outgoing], bounds: DownBounds) -> EnqueuedMany {
        // The document and the edge's last message and count side by side: two round trips
        // before the first publish instead of four. Each pair keeps its own order (`update`,
        // `last_and_count`); neither reads what the other writes.
        let (settled, first) = tokio::join!(self.settled(edge, None), self.last_and_count(edge));
        let (doc, now) = match settled {
            Ok(d) => d,
            Err(e) => return EnqueuedMany { done: Vec::new(), error: Some(e) },
        };
        let (ids_kept, ids_for) = SEND_IDS;
        let since = shared::units::now_ms().saturating_sub(ids_for.as_millis() as u64);
        let mut done: Vec<Done> = Vec::with_capacity(msgs.len());
        let mut error = None;
        // The edge's last message and its count, as just read or as the last publish left
        // them (a failed read is made again by the publish that needs it).
        let mut known = first.ok().map(|(last, count)| Known { last, count, fresh: true });
        let mut added_bytes = 0;
        let mut last_seq = now.last_seq;
        for msg in msgs {
            if let Some(Done::Full(b)) = done.last() {
                done.push(Done::Full(*b));
                continue;
            }
            if let Some(seq) = msg.id.as_deref().and_then(|id| doc.sent(id, since)) {
                done.push(Done::Kept(seq));
                continue;
            }
            if doc.counts_in(&now) && doc.past_max(last_seq + 1) {
                error = Some(SinkError::invalid(
                    "downlink enqueue",
                    format!(
                        "edge {edge} has used its downlink seqs up (its next would be past {})",
                        shared::proto::MAX_SEQ
                    ),
                ));
                break;
            }
            match self.publish_one(limit, edge, (&doc, added_bytes), msg, bounds, &mut known).await {
                Ok(d) => {
                    if let Done::Stored(q) = d {
                        added_bytes += msg.bytes();
                        last_seq = last_seq.max(q);
                    }
                    done.push(d);
                }
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        let counted = self
            .update(edge, None, |doc| {
                doc.stored_bytes = doc.stored_bytes.saturating_add(added_bytes);
                let now_ms = shared::units::now_ms();
                for (msg, d) in msgs.iter().zip(&done) {
                    if let (Some(id), Done::Stored(q) | Done::Already(q)) = (&msg.id, d) {
                        let seq = doc.edge_seq(*q);
                        doc.keep_id(id, seq, now_ms, since, ids_kept);
                    }
                }
                added_bytes > 0 || msgs.iter().zip(&done).any(|(m, d)| m.id.is_some() && !matches!(d, Done::Kept(_)))
            })
            .await;
        let counted = match counted {
            Ok(Some((doc, now))) => doc.counts_in(&now).then_some(doc),
            _ => {
                tracing::warn!(
                    edge,
                    messages = done.len(),
                    "downlink messages stored but their bytes not counted in the backlog"
                );
                None
            }
        };
        let edge_seq = |q: u64| counted.as_ref().map_or(q, |doc| doc.edge_seq(q));
        let out = done
            .into_iter()
            .map(|d| match d {
                Done::Stored(q) => Enqueued::Stored { seq: edge_seq(q) },
                Done::Already(q) => Enqueued::Already { seq: edge_seq(q) },
                Done::Kept(seq) => Enqueued::Already { seq },
                Done::Full(b) => Enqueued::Full(b),
            })
            .collect();
        EnqueuedMany { done: out, error }
    }

    /// Publishes `msg` for `edge` if its backlog has room, only while the edge's last message
    /// is still `known` (read when it is not, and again when a racing send took the room).
    async fn publish_one(
        &self,
        limit: DownLimit,
        edge: &str,
        (doc, added_bytes): (&PositionDoc, u64),
        msg: &Outgoing,
        bounds: DownBounds,
        known: &mut Option<Known>,
    ) -> Result<Done, SinkError> {
        let subject = names::subject(&self.prefix, edge, &msg.topic);
        if subject.len() > MAX_SUBJECT {
            return Err(SinkError::invalid(
                "downlink enqueue",
                format!(
                    "the topic makes a {}-byte subject, more than nats-server takes in one protocol line \
                     ({MAX_SUBJECT} bytes with room for the rest of it)",
                    subject.len()
                ),
            ));
        }
        let filter = self.filter(edge);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let cached = known.is_some_and(|k| !k.fresh);
            let (last, count) = match *known {
                Some(k) => (k.last, k.count),
                None => self.last_and_count(edge).await?,
            };
            *known = Some(Known { last, count, fresh: false });
            let waiting = Backlog {
                messages: count,
                bytes: doc.stored_bytes.saturating_sub(doc.done_bytes).saturating_add(added_bytes),
                oldest_ms: None,
            };
            if waiting.messages + 1 > bounds.messages || waiting.bytes + msg.bytes() > bounds.bytes {
                // The count as this batch left it is no less than the stream's (the edge's
                // acks purge meanwhile): looked at again before the batch's rest is refused.
                if cached {
                    *known = None;
                    continue;
                }
                return Ok(Done::Full(waiting));
            }
            let mut h = headers(msg);
            // A retried publish of this send is stored once; so is a send with an id the
            // document has not heard of yet, within the stream's duplicate window.
            let msg_id = match &msg.id {
                Some(id) => format!("send:{}:id:{id}", names::token(edge)),
                None => format!("send:{}:{:032x}", names::token(edge), rand::random::<u128>()),
            };
            h.insert("Nats-Msg-Id", msg_id.as_str());
            if self.guarded {
                // Stored only if no other message for the edge was since the count: sends
                // racing for an edge's last room cannot both get in.
                h.insert("Nats-Expected-Last-Subject-Sequence", last.to_string().as_str());
                h.insert("Nats-Expected-Last-Subject-Sequence-Subject", filter.as_str());
            }
            let size = header_bytes(&h) + msg.payload.len() as u64;
            if size > limit.bytes {
                return Err(SinkError::invalid(
                    "downlink enqueue",
                    format!("the message and its headers are {size} bytes, more than {} ({})", limit.of, limit.bytes),
                ));
            }
            let stored = self
                .js
                .publish_with_headers(subject.clone(), h, Bytes::from(msg.payload.clone()))
                .await
                .map_err(|e| SinkError::nats("downlink enqueue", edge, &e))?
                .await;
            match stored {
                // What an id stored before: the edge's last message is as it was.
                Ok(ack) if ack.duplicate => return Ok(Done::Already(ack.sequence)),
                Ok(ack) => {
                    *known = Some(Known { last: ack.sequence, count: count + 1, fresh: false });
                    return Ok(Done::Stored(ack.sequence));
                }
                Err(e) if attempts < CAS_ATTEMPTS && is_wrong_last(&e) => *known = None,
                Err(e) => {
                    *known = None;
                    return Err(SinkError::nats("downlink enqueue", edge, &e));
                }
            }
        }
    }

    /// The stream sequence of `edge`'s last message (0 if none, or unguarded: not needed), then
    /// how many messages the stream holds for it. Last read first: a message stored after it
    /// makes a publish that expects it fail, and the bound is checked again with it counted.
    async fn last_and_count(&self, edge: &str) -> Result<(u64, u64), SinkError> {
        let last = match self.guarded {
            true => raw::get(&self.js, &self.name, raw::At::Last(&self.filter(edge))).await?.map_or(0, |m| m.seq),
            false => 0,
        };
        Ok((last, self.count(edge).await?))
    }

    fn filter(&self, edge: &str) -> String {
        format!("{}.{}.>", self.prefix, names::token(edge))
    }

    fn topic_tokens<'a>(&self, subject: &'a str) -> Vec<&'a str> {
        subject.split('.').skip(self.prefix.split('.').count() + 1).collect()
    }

    /// How many times the client connected: what the news read kept on one connection is not
    /// taken on the next (`ahead`).
    fn connects(&self) -> u64 {
        self.js.client().statistics().connects.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stream message `m` as an edge's message, `seq` still the stream's sequence.
    fn pending(&self, m: raw::RawDown) -> Pending {
        let problem = m.problem();
        let headers = m.headers.unwrap_or_default();
        let (msg, invalid) = parse(&self.topic_tokens(&m.subject), &headers, m.payload);
        Pending { seq: m.seq, stored_ms: m.time_ms, msg, invalid: problem.or(invalid) }
    }

    /// Whether stream sequence `q` is within `edge`'s seqs; past them, an error if the read
    /// has nothing to hand over (`out`), or else the read ends before it.
    fn past_max(&self, doc: &PositionDoc, edge: &str, q: u64, out: &[Pending]) -> Result<bool, SinkError> {
        match doc.past_max(q) {
            false => Ok(true),
            true if out.is_empty() => Err(SinkError::invalid(
                "downlink read",
                format!("edge {edge} has used its downlink seqs up (past {})", shared::proto::MAX_SEQ),
            )),
            true => Ok(false),
        }
    }

    async fn doc(&self, edge: &str) -> Result<(PositionDoc, Option<u64>), SinkError> {
        let key = edge_key(edge);
        let (doc, revision): (Option<PositionDoc>, _) = read_doc(&self.positions, &key, "downlink position").await?;
        Ok((doc.unwrap_or_else(|| PositionDoc { edge: edge.to_owned(), ..Default::default() }), revision))
    }

    /// Applies `change` to `edge`'s document, then counts its seqs in the stream as it is now
    /// ([`PositionDoc::settle`], with `held` if the session knows it), by compare-and-set: the
    /// document as written, with the stream it was counted in; none if another writer kept
    /// changing it. A new edge's document is written only once it holds something.
    async fn update(
        &self,
        edge: &str,
        held: Option<u64>,
        change: impl Fn(&mut PositionDoc) -> bool,
    ) -> Result<Option<(PositionDoc, StreamNow)>, SinkError> {
        let key = edge_key(edge);
        for _ in 0..bucket::CAS_ATTEMPTS {
            let (mut doc, revision) = self.doc(edge).await?;
            // Read after the document: a sequence the edge was handed is at most this.
            let now = stream_now(&self.stream).await?;
            let changed = change(&mut doc);
            let settled = doc.settle(&now, held);
            let blank = revision.is_none() && doc.base == 0 && doc.state == DownState::default();
            if !changed && (!settled || blank) {
                return Ok(Some((doc, now)));
            }
            match write_doc(&self.positions, &key, &doc, revision).await {
                Ok(_) => return Ok(Some((doc, now))),
                Err(Cas::Changed) => continue,
                Err(Cas::Failed(e)) => return Err(e),
            }
        }
        Ok(None)
    }

    /// `edge`'s document, counted in the stream as it is now (written if that changed it).
    async fn settled(&self, edge: &str, held: Option<u64>) -> Result<(PositionDoc, StreamNow), SinkError> {
        self.update(edge, held, |_| false).await?.ok_or_else(|| SinkError::Conflict {
            what: "downlink position",
            key: edge.to_owned(),
            attempts: bucket::CAS_ATTEMPTS as u32,
        })
    }

    /// How many messages the stream holds for `edge`: what it acked is purged, so this is its
    /// backlog (and what a purge has not reached yet). More subjects than one answer lists
    /// count as a full backlog.
    async fn count(&self, edge: &str) -> Result<u64, SinkError> {
        Ok(raw::count(&self.js, &self.name, &self.filter(edge)).await?.unwrap_or(u64::MAX / 2))
    }

    /// What `edge` has waiting from stream sequence `from`: the messages the stream holds for
    /// it (what it acked is purged), the bytes `send` stored and its acks have not covered
    /// (see [`PositionDoc`]), and when the oldest was stored. Read through the JSON API only
    /// (see `raw`): a consumer's messages carry their subject, which any publisher may have
    /// made unreadable to the client.
    async fn backlog(&self, doc: &PositionDoc, from: u64) -> Result<Backlog, SinkError> {
        let messages = self.count(&doc.edge).await?;
        let oldest = match messages {
            0 => None,
            _ => raw::get(&self.js, &self.name, raw::At::Next(from, &self.filter(&doc.edge))).await?,
        };
        Ok(Backlog {
            messages: if oldest.is_some() { messages } else { 0 },
            bytes: doc.stored_bytes.saturating_sub(doc.done_bytes),
            oldest_ms: oldest.map(|m| m.time_ms),
        })
    }

    /// Sets aside `edge`'s message `seq`, if the stream `doc` counts in holds it (`now`: a
    /// stream made anew holds none of the seqs an edge names before its session moved it on).
    async fn set_aside(
        &self,
        (doc, now): (&PositionDoc, &StreamNow),
        seq: u64,
        outcome: &str,
        reason: &str,
    ) -> Result<(), SinkError> {
        let what = "downlink dead letter";
        let edge = doc.edge.as_str();
        let Some(q) = doc.stream_seq(seq).filter(|_| doc.counts_in(now)) else { return Ok(()) };
        let Some(m) = raw::get(&self.js, &self.name, raw::At::Seq(q)).await? else { return Ok(()) };
        // Only a message the sink holds for this edge: an edge cannot set aside another's.
        if !m.subject.starts_with(&self.filter(edge)[..self.filter(edge).len() - 1]) {
            return Ok(());
        }
        let headers = m.headers.clone().unwrap_or_default();
        let (msg, _) = parse(&self.topic_tokens(&m.subject), &headers, Vec::new());
        // Its own headers where they parse, but for the server's (`Nats-Expected-*` of a send
        // would fail the copy's publish, forever); ours with values any edge or publisher may
        // have made (a reason, a topic decoded from the subject) made safe for a header.
        let safe = |v: &str, max| header::header_value(v, max);
        let mut h = async_nats::HeaderMap::new();
        for (name, values) in headers.iter() {
            let text: &str = name.as_ref();
            if text.len() >= 5 && text[..5].eq_ignore_ascii_case("nats-") {
                continue;
            }
            for v in values {
                h.append(name.clone(), v.clone());
            }
        }
        h.insert("Mqtt-Topic", safe(&msg.topic, 4096).as_str());
        h.insert("Edge-Id", safe(edge, 1024).as_str());
        h.insert("Edge-Down-Seq", seq.to_string().as_str());
        h.insert("Edge-Outcome", outcome);
        h.insert("Edge-Reason", safe(reason, 512).as_str());
        h.insert("Edge-At-Ms", shared::units::now_ms().to_string().as_str());
        h.insert("Edge-Bytes", (msg.bytes() + m.payload.len() as u64).to_string().as_str());
        h.insert("Nats-Msg-Id", format!("dead:{}:{seq}", names::token(edge)).as_str());
        let subject = format!("{}.{DEAD}.{}", self.prefix, names::token(edge));
        self.js
            .publish_with_headers(subject, h, Bytes::from(m.payload))
            .await
            .map_err(|e| SinkError::nats(what, edge, &e))?
            .await
            .map_err(|e| SinkError::nats(what, edge, &e))?;
        Ok(())
    }
}

impl DownlinkStore for JetStreamSink {
    fn down_limit(&self) -> DownLimit {
        let d = self.down();
        match d.max_msg_size.filter(|m| *m < d.max_payload) {
            Some(bytes) => DownLimit { bytes, of: "the downlink stream's max_msg_size", reach: None },
            None => DownLimit { bytes: d.max_payload, of: "nats-server's max_payload", reach: None },
        }
    }

    /// Each chunk of a batch: the edge's document read once, the count and the edge's last
    /// message read once, then one publish per message, each stored only if the one before
    /// it is still the edge's last (the chain a racing send breaks: it is then counted
    /// again); then the bytes and ids written to the document once.
    async fn enqueue_many(&self, edge: &str, msgs: &[Outgoing], bounds: DownBounds) -> EnqueuedMany {
        let limit = self.down_limit();
        EnqueuedMany::in_chunks(msgs, BATCH, |chunk| self.down().enqueue_chunk(limit, edge, chunk, bounds)).await
    }

    async fn down_trim(&self, edge: &str, bounds: DownBounds, max: usize) -> Result<u64, SinkError> {
        let d = self.down();
        let filter = d.filter(edge);
        let mut trimmed = 0;
        while trimmed < max as u64 && d.count(edge).await? > bounds.messages {
            let Some(newest) = raw::get(&d.js, &d.name, raw::At::Last(&filter)).await? else { break };
            // Before it is set aside: a read must not take it from what the news read kept.
            d.ahead.forget(&names::token(edge), newest.seq);
            let (doc, now) = d.settled(edge, None).await?;
            let reason = format!(
                "published past downlink.max_backlog_messages ({}) by a client other than send",
                bounds.messages
            );
            if doc.counts_in(&now) {
                d.set_aside((&doc, &now), doc.edge_seq(newest.seq), "refused", &reason).await?;
            }
            match d.stream.delete_message(newest.seq).await {
                Ok(_) => trimmed += 1,
                // Another trim took it first.
                Err(e) if matches!(e.kind(), stream::DeleteMessageErrorKind::JetStream(j) if j.error_code().0 == 10037) =>
                    {}
                Err(e) => return Err(SinkError::nats("downlink trim", edge, &e)),
            }
        }
        Ok(trimmed)
    }

    async fn down_state(&self, edge: &str) -> Result<DownState, SinkError> {
        Ok(self.down().doc(edge).await?.0.state)
    }

    async fn down_read(&self, edge: &str, after: u64, max: ReadLimit) -> Result<Vec<Pending>, SinkError> {
        let d = self.down();
        // The session holds everything up to `after`: a stream made anew counts after it.
        let (doc, now) = d.settled(edge, Some(after)).await?;
        let mut next = doc.stream_after(after);
        let mut out = Vec::new();
        if let Some(kept) = d.ahead.take(&names::token(edge), (&now.id, d.connects()), next, max) {
            for p in kept {
                if !d.past_max(&doc, edge, p.seq, &out)? {
                    return Ok(out);
                }
                out.push(Pending { seq: doc.edge_seq(p.seq), ..p });
            }
            return Ok(out);
        }
        let filter = d.filter(edge);
        let mut width = READ_FIRST;
        // The bytes taken, and the largest message seen: a run is no wider than the budget
        // left holds of messages that large, so what a run fetches past it stays small.
        let (mut bytes, mut largest) = (0u64, 1u64);
        while !max.reached(out.len(), bytes) {
            let room = usize::try_from((max.bytes - bytes) / largest).unwrap_or(usize::MAX).max(1);
            let want = (max.messages - out.len()).min(width).min(room);
            let (found, ended) = raw::get_run(&d.js, &d.name, next, want, &filter).await?;
            if found.is_empty() {
                break;
            }
            // As many at once next time as there were this time, and more while they come
            // one after another (an edge's messages sent together are stored so).
            width = match found.len() == want {
                true => (width * 2).min(READ_MAX),
                false => found.len().max(READ_FIRST),
            };
            for m in found {
                if !d.past_max(&doc, edge, m.seq, &out)? {
                    return Ok(out);
                }
                next = m.seq + 1;
                let p = d.pending(m);
                let weight = p.msg.bytes();
                (bytes, largest) = (bytes + weight, largest.max(weight));
                out.push(Pending { seq: doc.edge_seq(p.seq), ..p });
                // The rest of the run is read again by the next read.
                if max.reached(out.len(), bytes) {
                    return Ok(out);
                }
            }
            // The stream held no more: another round would find none (a round trip more on
            // every read that reaches the end, which at a low rate is every read).
            if ended {
                break;
            }
        }
        Ok(out)
    }

    async fn down_record(&self, edge: &str, done: &DownDone) -> Result<(), SinkError> {
        let d = self.down();
        // The document as counted now, for the set-asides only: the update below counts it
        // again itself (two round trips on every record that sets nothing aside).
        if !done.refused.is_empty() || !done.expired.is_empty() {
            let (doc, now) = d.settled(edge, None).await?;
            for r in &done.refused {
                d.set_aside((&doc, &now), r.seq, "refused", &r.reason).await?;
            }
            for seq in &done.expired {
                d.set_aside((&doc, &now), *seq, "expired", "its expiry ran out before the edge could deliver it")
                    .await?;
            }
        }
        let updated = d
            .update(edge, None, |doc| {
                if doc.state.position >= done.up_to {
                    return false;
                }
                let s = &mut doc.state;
                s.position = done.up_to;
                s.delivered += done.counts.delivered;
                s.refused += done.counts.refused;
                s.expired += done.counts.expired;
                doc.done_bytes = doc.done_bytes.saturating_add(done.counts.bytes);
                true
            })
            .await?;
        let Some((doc, now)) = updated else {
            return Err(SinkError::Conflict {
                what: "downlink position",
                key: edge.to_owned(),
                attempts: bucket::CAS_ATTEMPTS as u32,
            });
        };
        // What the edge has is storage no one needs; the stream's max_age frees it otherwise.
        // Not in a stream made anew that the edge's session has not counted in yet: its
        // messages are all after the position, whatever their sequence.
        if doc.counts_in(&now)
            && let Err(e) = d.stream.purge().filter(d.filter(edge)).sequence(doc.stream_after(done.up_to)).await
        {
            tracing::debug!(edge, error = %e, "delivered downlink messages not purged");
        }
        Ok(())
    }

    async fn down_set_aside(&self, edge: &str, seq: u64, outcome: &'static str, reason: &str) -> Result<(), SinkError> {
        let d = self.down();
        let (doc, now) = d.settled(edge, None).await?;
        d.set_aside((&doc, &now), seq, outcome, reason).await
    }

    async fn down_backlog(&self, edge: &str) -> Result<Backlog, SinkError> {
        let d = self.down();
        let (doc, now) = d.settled(edge, None).await?;
        let from = if doc.counts_in(&now) { doc.stream_after(doc.state.position) } else { 1 };
        d.backlog(&doc, from).await
    }

    async fn down_summary(&self) -> Result<Vec<DownSummary>, SinkError> {
        let d = self.down();
        summary(&d.js, &d.stream, &d.positions, &d.prefix).await
    }

    async fn reply_cursor(&self) -> Result<u64, SinkError> {
        let info = self.down().uplink.get_info().await.map_err(|e| SinkError::nats("reply cursor", "", &e))?;
        Ok(info.state.last_sequence)
    }

    async fn find_reply(
        &self,
        edge: &str,
        topic: &str,
        correlation: &[u8],
        cursor: u64,
    ) -> Result<Option<Reply>, SinkError> {
        let d = self.down();
        // The response topic is the request's own: the last record on its subject is the reply.
        let subject = names::subject(&d.uplink_prefix, edge, topic);
        let m = match d.uplink.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => m,
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(SinkError::nats("find reply", &subject, &e)),
        };
        let want = names::correlation_header(correlation);
        let matches = m.headers.get("Mqtt-Correlation-Data").is_some_and(|v| v.as_str() == want);
        if m.sequence <= cursor || !matches {
            return Ok(None);
        }
        let headers = m
            .headers
            .iter()
            .flat_map(|(k, vs)| vs.iter().map(move |v| (k.to_string(), v.as_str().to_owned())))
            .collect();
        Ok(Some(Reply { payload: m.payload.to_vec(), headers }))
    }

    async fn down_dead_letters(&self, edge: Option<&str>, limit: usize) -> Result<Vec<DownDeadLetter>, SinkError> {
        let d = self.down();
        dead_letters(&d.stream, &d.prefix, edge, limit).await
    }

    /// The cursor is the stream's sequence. News is read through the JSON API, one message
    /// after the cursor at a time, looked for every [`NEWS_POLL`] while it waits: a consumer
    /// would deliver messages with their subjects, which any publisher may have made
    /// unreadable to the client (see `raw`), and its state was lost with a server restart,
    /// when sessions then waited for their own poll.
    async fn down_news(&self, cursor: Option<u64>, wait: Duration) -> Result<(u64, Vec<String>), SinkError> {
        let d = self.down();
        // Each request bounded as the reads below are: one sent as the server went down waits for
        // the client's whole request timeout, and news would be that late after a restart (a
        // test saw more than 3 s on loaded cores).
        let now = || async {
            tokio::time::timeout(NEWS_POLL * 5, stream_now(&d.stream))
                .await
                .map_err(|_| unavailable("downlink news", "timed out"))?
        };
        let Some(mut cursor) = cursor else {
            let now = now().await?;
            d.ahead.restart(Some(now.id), d.connects(), now.last_seq);
            return Ok((now.last_seq, Vec::new()));
        };
        d.ahead.resume(None, d.connects(), cursor);
        let filter = format!("{}.*.>", d.prefix);
        let skip = d.prefix.split('.').count();
        let deadline = tokio::time::Instant::now() + wait;
        let mut looked_back = false;
        let mut edges = Vec::new();
        // Where in HINT_AGAIN the looks after a hint are (none after none).
        let mut early = HINT_AGAIN.len();
        loop {
            // Several gets at once, as a session's read makes them: one message's news took a
            // round trip to find it and another to find nothing after it. Wider while they come
            // one after another: the news read is the one that gets every message (`ahead`), and
            // runs of 4 held a publisher's burst to 4 messages a round trip. No wider than
            // NEWS_BYTES holds of the largest message seen.
            let (mut read, mut width, mut largest) = (0, READ_FIRST, 1u64);
            while read < NEWS_MAX {
                let room = usize::try_from(NEWS_BYTES / largest).unwrap_or(usize::MAX).max(1);
                let want = width.min(NEWS_MAX - read).min(room);
                // A request under way when the connection drops waits for its whole timeout:
                // news is late by that much at most.
                let run = raw::get_run(&d.js, &d.name, cursor + 1, want, &filter);
                let (found, ended) = tokio::time::timeout(NEWS_POLL * 5, run)
                    .await
                    .map_err(|_| unavailable("downlink news", "timed out"))??;
                read += found.len();
                width = match found.len() == want {
                    true => (width * 2).min(READ_MAX),
                    false => found.len().max(READ_FIRST),
                };
                for m in found {
                    largest = largest.max((m.payload.len() + m.subject.len()) as u64);
                    cursor = m.seq;
                    let token = m.subject.split('.').nth(skip).filter(|t| *t != DEAD).map(str::to_owned);
                    if let Some(edge) = token.as_deref().and_then(|t| names::topic_of(&[t])) {
                        edges.push(edge);
                    }
                    // A subject that is not UTF-8 is the stream read's to set aside.
                    let readable = !m.subject.contains(char::REPLACEMENT_CHARACTER);
                    d.ahead.keep(m.seq, token.as_deref(), || readable.then(|| d.pending(m)));
                }
                // A run that found nothing ended too.
                if ended {
                    break;
                }
            }
            if !edges.is_empty() {
                edges.sort();
                edges.dedup();
                return Ok((cursor, edges));
            }
            // A stream made anew starts its sequence over: its messages are all news.
            if !looked_back {
                looked_back = true;
                let now = now().await?;
                if now.last_seq < cursor {
                    cursor = 0;
                    d.ahead.restart(Some(now.id), d.connects(), 0);
                    continue;
                }
                d.ahead.resume(Some(&now.id), d.connects(), cursor);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok((cursor, edges));
            }
            // A hint may come before the stream stored its message: looked for again shortly.
            if let Some(again) = HINT_AGAIN.get(early) {
                early += 1;
                if !again.is_zero() {
                    tokio::time::sleep(*again).await;
                }
            } else if d.hints().wait(NEWS_POLL.min(left)).await {
                early = 0;
            }
        }
    }
}
