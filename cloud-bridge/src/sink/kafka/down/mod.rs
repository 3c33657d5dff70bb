//! The downlink in Kafka: a topic of its own (`edge-down` by default) that any Kafka producer
//! may write: the record key is the edge id, the `Mqtt-Topic` header the MQTT topic, the other
//! headers as `sink::down_headers` names them, the value the payload:
//!
//! ```text
//! kcat -P -b broker:9092 -t edge-down -k edge-1 -H Mqtt-Topic=config/threshold <<< 0.7
//! ```
//!
//! - **Partitioned by edge**: an edge's messages are in the partition Java's default
//!   partitioner picks for its id (murmur2 of the key; librdkafka clients, kcat among them, set
//!   `partitioner=murmur2_random`). A message's seq is its offset there plus one, so it
//!   increases in the order the edge's messages were stored, with other edges' between. A
//!   record in another partition is not the edge's (counted in `downlink_unread`, never
//!   delivered).
//! - **Positions** are `d/<edge>` in the state topic, raised by the bridge serving the edge
//!   through the edge's own producer (the one its epochs are written with: a second bridge
//!   fences it), never lowered.
//! - **The backlog bound** holds for every producer: `send` checks it before it writes, and the
//!   bridge serving an edge sets aside what any producer wrote past it (`down_trim`): the
//!   offsets are kept in the edge's document (`trimmed`), so any bridge skips them, and each is
//!   written to the dead-letter topic.
//! - **Dead letters** (refused, expired, set aside) go to `edge-down-dead` with the message's
//!   payload and headers and `Edge-Outcome`, `Edge-Reason`, `Edge-Down-Seq`, `Edge-At-Ms`.
//! - A bridge learns where each edge's messages are by following the topic into an index
//!   (`index`), which is also the news; a message is read from its partition when delivered.
//! - **Send ids** travel as the `Edge-Send-Id` header: a send with an id the index saw for the
//!   edge within [`SEND_IDS`] is not written again, and a message repeating an earlier one's id
//!   (two sends racing) is set aside, not delivered twice.
//!
//! Not handled: the topic deleted and made anew (its offsets start over below the edges'
//! positions, so its messages are never delivered): delete the edges' `d/` documents with it.

mod index;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shared::units::now_ms;

use super::KafkaSink;
use super::fetch::{Fetched, Fetcher, Range};
use super::follow::Follower;
use super::names::partition_of;
use super::outgoing::Topic;
use super::settings::{KafkaSettings, TOPIC_BYTES};
use super::topics::{Kind, Topics};
use crate::sink::DeadLetterLabel;
use crate::sink::down_headers;
use crate::sink::downlink::{
    Backlog, DownBounds, DownDeadLetter, DownDone, DownLimit, DownState, DownSummary, DownlinkStore, Enqueued,
    EnqueuedMany, Outgoing, Pending, ReadLimit, Reply, SEND_IDS,
};
use crate::sink::error::SinkError;
use index::{DownIndex, Entry, SEND_ID, edge_of, weight};

/// What one message of a batch becomes.
enum Plan<'m> {
    /// A record with these headers.
    Write(Vec<(&'m str, String)>),
    /// Nothing written: this is the answer.
    Answer(Enqueued),
    /// Its id is that of the message at this place in the batch, written once.
    SameAs(usize),
}

/// How far back a listing of dead letters reads, per partition.
const DEAD_SCAN: i64 = 10_000;

/// The downlink's topics, what the bridge knows of them, and its reader.
pub(crate) struct KafkaDownlink {
    topic: Topic,
    dead: Topic,
    index: Follower<DownIndex>,
    fetcher: Fetcher,
    /// `max_indexed_per_edge`: a read finds no more of an edge's messages past its position.
    per_edge: usize,
}

impl KafkaDownlink {
    /// Makes or checks the topics and indexes what the downlink topic holds.
    pub(crate) async fn start(settings: &KafkaSettings, topics: &Topics) -> Result<Self, SinkError> {
        let d = &settings.downlink;
        let partitions = topics.ensure(&d.topic, Kind::Downlink).await?;
        let dead_partitions = topics.ensure(&d.dead_letter_topic, Kind::Records).await?;
        let index = Follower::start(settings, &d.topic, partitions, DownIndex::new(d, partitions))?;
        index.read_to_end().await?;
        Ok(Self {
            topic: Topic { name: d.topic.clone(), partitions },
            dead: Topic { name: d.dead_letter_topic.clone(), partitions: dead_partitions },
            index,
            fetcher: Fetcher::new(settings)?,
            per_edge: d.max_indexed_per_edge,
        })
    }
}

/// An edge's downlink as the state topic keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct DownDoc {
    #[serde(default)]
    state: DownState,
    /// Offset ranges (both ends in) in which the edge's messages were set aside past its
    /// bound; only those after its position are kept.
    #[serde(default)]
    trimmed: Vec<(i64, i64)>,
}

impl DownDoc {
    /// The offset of the first message not delivered: seqs are offsets plus one.
    fn floor(&self) -> i64 {
        self.state.position.min(i64::MAX as u64) as i64
    }

    fn is_trimmed(&self, offset: i64) -> bool {
        self.trimmed.iter().any(|(a, b)| (*a..=*b).contains(&offset))
    }

    fn counts(&self, offset: i64) -> bool {
        offset >= self.floor() && !self.is_trimmed(offset)
    }

    /// Adds the set-aside range `from..end`, merged into the last one when `between(last)` says
    /// none of the edge's messages that count lies between that range's end and `from`.
    fn add_trimmed(&mut self, from: i64, end: i64, between: impl FnOnce(i64) -> bool) {
        match self.trimmed.last_mut() {
            Some((_, last)) if *last < from && !between(*last) => *last = end - 1,
            _ => self.trimmed.push((from, end - 1)),
        }
    }
}

fn doc_key(edge: &str) -> String {
    format!("d/{edge}")
}

/// A message as `index` weighs it.
fn entry(f: &Fetched) -> Entry {
    let headers = f.headers.iter().map(|(n, v)| (n.as_str(), v.as_deref()));
    Entry { offset: f.offset, bytes: weight(f.payload_len, headers), at_ms: f.at_ms }
}

fn is_topic_name(t: &str) -> bool {
    !t.is_empty() && !t.contains(['+', '#', '\0'])
}

/// The message a stored record stands for, or why not.
fn parse(f: Fetched) -> (Outgoing, Option<String>) {
    let topic = f.header("Mqtt-Topic").map(str::to_owned);
    let headers = f.headers.iter().map(|(n, v)| (n.as_str(), v.as_deref()));
    let (mut msg, mut problem) = down_headers::parse(headers, f.payload.clone().unwrap_or_default());
    match topic {
        Some(t) if is_topic_name(&t) => msg.topic = t,
        Some(t) => problem = Some(format!("header Mqtt-Topic: {t:?} is not an MQTT topic name")),
        None => problem = Some("no Mqtt-Topic header: it names the message's topic".into()),
    }
    (msg, problem)
}

impl KafkaSink {
    fn down_doc(&self, edge: &str) -> Result<DownDoc, SinkError> {
        let key = doc_key(edge);
        match self.state.get(&key) {
            Some(v) => serde_json::from_slice(&v).map_err(|e| SinkError::corrupt("downlink position", &key, e)),
            None => Ok(DownDoc::default()),
        }
    }

    /// `edge`'s document, its delivered messages let go of in the index.
    fn settled(&self, edge: &str) -> Result<DownDoc, SinkError> {
        let doc = self.down_doc(edge)?;
        self.down.index.with_mut(|i| {
            i.raise_floor(edge, doc.floor());
            if !doc.trimmed.is_empty() {
                i.forget(edge, |o| doc.is_trimmed(o));
            }
        });
        Ok(doc)
    }

    /// Indexes `edge`'s messages the index only counted, as many as there is room for (those
    /// set aside, per `doc`, are not). Where the count is stale (another bridge delivered past
    /// it), the rest of the partition is read to count them again. Of two reads at once (an
    /// edge's old session reading as its new one starts), the one that ends later is dropped.
    async fn refill(&self, edge: &str, doc: &DownDoc) -> Result<(), SinkError> {
        use std::sync::Mutex;
        let d = &self.down;
        let partition = partition_of(edge, d.topic.partitions);
        let Some((over, until, room, at)) = d.index.with_ends(|i, ends| {
            let e = i.edges.get(edge)?;
            Some((e.over?, ends.get(partition as usize).copied().unwrap_or(0), i.room(edge), e.reads))
        }) else {
            return Ok(());
        };
        if room == 0 && !over.stale {
            return Ok(());
        }
        let max = if over.stale { usize::MAX } else { room };
        let range = Range { topic: d.topic.name.clone(), partition, from: over.from, end: until, max, payloads: false };
        let (mine, trimmed) = (edge.to_owned(), doc.clone());
        // Past the room: counted, not kept.
        let beyond: std::sync::Arc<Mutex<Option<(i64, u64, u64)>>> = std::sync::Arc::default();
        let (kept, counter) = (std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0)), beyond.clone());
        let found = d
            .fetcher
            .read(range, move |f| {
                if edge_of(f.key.as_deref()) != Some(mine.as_str()) || trimmed.is_trimmed(f.offset) {
                    return false;
                }
                if kept.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < room {
                    return true;
                }
                let mut b = counter.lock().unwrap_or_else(|e| e.into_inner());
                let (_, count, bytes) = b.get_or_insert((f.offset, 0, 0));
                *count += 1;
                *bytes += entry(f).bytes;
                false
            })
            .await?;
        let found: Vec<Entry> = found.iter().map(entry).collect();
        if over.stale {
            let beyond = *beyond.lock().unwrap_or_else(|e| e.into_inner());
            d.index.with_mut(|i| i.recounted(edge, at, &found, beyond, (until, over.count)));
        } else {
            let whole = found.len() < room;
            d.index.with_mut(|i| i.refilled(edge, at, &found, (until, over.count), whole));
        }
        Ok(())
    }

    /// `edge`'s document, its index brought up to it (counted again where it was stale).
    async fn settle(&self, edge: &str) -> Result<DownDoc, SinkError> {
        let doc = self.settled(edge)?;
        if self.down.index.with(|i| i.edges.get(edge).and_then(|e| e.over).is_some_and(|o| o.stale)) {
            self.refill(edge, &doc).await?;
        }
        Ok(doc)
    }

    /// `edge`'s messages from offset `from` that count for it, as many as `max` lets a read take.
    async fn entries(&self, edge: &str, doc: &DownDoc, from: i64, max: ReadLimit) -> Result<Vec<Entry>, SinkError> {
        let pick = || {
            self.down.index.with(|i| {
                let Some(e) = i.edges.get(edge) else { return (Vec::new(), 0, false) };
                let (mut picked, mut bytes) = (Vec::new(), 0);
                for m in e.entries.iter().filter(|m| m.offset >= from && doc.counts(m.offset)) {
                    if max.reached(picked.len(), bytes) {
                        break;
                    }
                    picked.push(*m);
                    bytes += m.bytes;
                }
                (picked, bytes, e.over.is_some())
            })
        };
        let (picked, bytes, over) = pick();
        if max.reached(picked.len(), bytes) || !over {
            return Ok(picked);
        }
        self.refill(edge, doc).await?;
        Ok(pick().0)
    }

    /// What each of `msgs` becomes for `edge` (see `enqueue_many`), and where they are written.
    async fn plan<'m>(
        &self,
        edge: &str,
        msgs: &'m [Outgoing],
        bounds: DownBounds,
    ) -> Result<((&str, i32), Vec<Plan<'m>>), SinkError> {
        let d = &self.down;
        d.index.read_to_end().await?;
        let doc = self.settle(edge).await?;
        let since = now_ms().saturating_sub(SEND_IDS.1.as_millis() as u64);
        let mut waiting = self.backlog_of(edge, &doc);
        let limit = self.down_limit();
        let mut plan: Vec<Plan<'m>> = Vec::with_capacity(msgs.len());
        // The ids this call writes, by the place of their first message.
        let mut ids: HashMap<&str, usize> = HashMap::new();
        for msg in msgs {
            if let Some(Plan::Answer(Enqueued::Full(b))) = plan.last() {
                plan.push(Plan::Answer(Enqueued::Full(*b)));
                continue;
            }
            let sent = |id: &str| d.index.with(|i| i.edges.get(edge).and_then(|e| e.sent(id, since)));
            if let Some(offset) = msg.id.as_deref().and_then(sent) {
                plan.push(Plan::Answer(Enqueued::Already { seq: offset as u64 + 1 }));
                continue;
            }
            if let Some(first) = msg.id.as_deref().and_then(|id| ids.get(id)) {
                plan.push(Plan::SameAs(*first));
                continue;
            }
            if waiting.messages + 1 > bounds.messages || waiting.bytes + msg.bytes() > bounds.bytes {
                plan.push(Plan::Answer(Enqueued::Full(waiting)));
                continue;
            }
            let mut headers = vec![("Mqtt-Topic", msg.topic.clone())];
            headers.extend(down_headers::headers(msg));
            if let Some(id) = &msg.id {
                ids.insert(id, plan.len());
                headers.push((SEND_ID, id.clone()));
            }
            let size =
                edge.len() + msg.payload.len() + headers.iter().map(|(n, v)| n.len() + v.len() + 8).sum::<usize>();
            if size as u64 > limit.bytes {
                return Err(SinkError::invalid(
                    "downlink enqueue",
                    format!("the message and its headers are {size} bytes, more than {} ({})", limit.of, limit.bytes),
                ));
            }
            waiting.messages += 1;
            waiting.bytes += msg.bytes();
            plan.push(Plan::Write(headers));
        }
        Ok(((d.topic.name.as_str(), partition_of(edge, d.topic.partitions)), plan))
    }

    fn backlog_of(&self, edge: &str, doc: &DownDoc) -> Backlog {
        self.down.index.with(|i| {
            let Some(e) = i.edges.get(edge) else { return Backlog::default() };
            let counted: Vec<&Entry> = e.entries.iter().filter(|m| doc.counts(m.offset)).collect();
            let over = e.over.map_or((0, 0), |o| (o.count, o.bytes));
            Backlog {
                messages: counted.len() as u64 + over.0,
                bytes: counted.iter().map(|m| m.bytes).sum::<u64>() + over.1,
                oldest_ms: counted.first().map(|m| m.at_ms),
            }
        })
    }

    /// Writes `edge`'s document as the bridge holding the edge's claim: `change` says what
    /// becomes of it (nothing, if it returns false).
    async fn write_doc<T>(&self, edge: &str, change: impl FnOnce(&mut DownDoc) -> (bool, T)) -> Result<T, SinkError> {
        self.pool
            .owned_write(edge, &[&*self.state], || {
                let mut doc = self.down_doc(edge)?;
                let (changed, out) = change(&mut doc);
                if !changed {
                    return Ok((Vec::new(), out));
                }
                let floor = doc.floor();
                doc.trimmed.retain(|(_, last)| *last >= floor);
                let value = serde_json::to_vec(&doc).map_err(|e| SinkError::invalid("downlink position", e))?;
                Ok((vec![self.state_topic.put(doc_key(edge), value)], out))
            })
            .await
    }

    /// Writes the message `f` of `edge` to the dead letters as `outcome`.
    async fn dead_letter(&self, edge: &str, f: &Fetched, outcome: &str, reason: &str) -> Result<(), SinkError> {
        let d = &self.down;
        let topic = f.header("Mqtt-Topic").unwrap_or_default().to_owned();
        let bytes = entry(f).bytes;
        let mut headers: Vec<(&str, String)> = f
            .headers
            .iter()
            .filter(|(n, _)| !n.starts_with("Edge-"))
            .filter_map(|(n, v)| Some((n.as_str(), v.clone()?)))
            .collect();
        headers.extend([
            ("Edge-Id", edge.to_owned()),
            ("Edge-Down-Seq", (f.offset + 1).to_string()),
            ("Edge-Outcome", outcome.to_owned()),
            ("Edge-Reason", reason.to_owned()),
            ("Edge-At-Ms", now_ms().to_string()),
            ("Edge-Bytes", bytes.to_string()),
        ]);
        if !headers.iter().any(|(n, _)| *n == "Mqtt-Topic") {
            headers.push(("Mqtt-Topic", topic));
        }
        let at = (d.dead.name.as_str(), partition_of(edge, d.dead.partitions));
        self.plain.send(at, edge, &headers, f.payload.as_deref().unwrap_or_default()).await?;
        Ok(())
    }

    /// Sets aside `edge`'s message `seq` as `outcome`, if the topic holds it for that edge.
    async fn set_aside(&self, edge: &str, seq: u64, outcome: &str, reason: &str) -> Result<(), SinkError> {
        let d = &self.down;
        let Some(offset) = seq.checked_sub(1).map(|o| o.min(i64::MAX as u64 - 1) as i64) else { return Ok(()) };
        let partition = partition_of(edge, d.topic.partitions);
        let range =
            Range { topic: d.topic.name.clone(), partition, from: offset, end: offset + 1, max: 1, payloads: true };
        let mine = edge.to_owned();
        let found = d.fetcher.read(range, move |f| edge_of(f.key.as_deref()) == Some(mine.as_str())).await?;
        // Only a message the sink holds for this edge: an edge cannot set aside another's.
        match found.first() {
            Some(f) => self.dead_letter(edge, f, outcome, reason).await,
            None => Ok(()),
        }
    }

    /// Counts what the index let go unread into the metrics.
    fn count_unread(&self) {
        let (misplaced, unindexed) = self.down.index.with_mut(DownIndex::take_ignored);
        for (reason, n) in [("misplaced", misplaced), ("unindexed", unindexed)] {
            if n > 0 {
                self.metrics.downlink_unread.get_or_create(&DeadLetterLabel { reason }).inc_by(n);
                tracing::warn!(
                    reason,
                    messages = n,
                    topic = self.down.topic.name,
                    "downlink messages not delivered: keyed to no edge or in another partition than their \
                     edge's (murmur2 of the key), or past sink.downlink.max_edges"
                );
            }
        }
    }
}

impl DownlinkStore for KafkaSink {
    fn down_limit(&self) -> DownLimit {
        DownLimit {
            bytes: (TOPIC_BYTES - 1024) as u64,
            of: "the downlink topic's max.message.bytes",
            reach: Some((self.down.per_edge, "sink.downlink.max_indexed_per_edge")),
        }
    }

    /// The index read to the topic's end and the edge settled once, each message checked
    /// against the backlog as indexed plus what this call writes before it, then every record
    /// written at once (the idempotent producer keeps their order in the edge's partition).
    async fn enqueue_many(&self, edge: &str, msgs: &[Outgoing], bounds: DownBounds) -> EnqueuedMany {
        let mut out = EnqueuedMany::default();
        let (at, plan) = match self.plan(edge, msgs, bounds).await {
            Ok(p) => p,
            Err(e) => return EnqueuedMany { error: Some(e), ..out },
        };
        let writes = plan.iter().zip(msgs).filter_map(|(p, msg)| match p {
            Plan::Write(headers) => Some(self.plain.send(at, edge, headers, &msg.payload)),
            _ => None,
        });
        let mut written = futures_util::future::join_all(writes).await.into_iter();
        // The seq each message of the plan was written as, by its place.
        let mut seqs: Vec<Option<u64>> = Vec::with_capacity(plan.len());
        for p in plan {
            let (done, seq) = match p {
                Plan::Answer(a) => (a, None),
                Plan::Write(_) => match written.next() {
                    Some(Ok(offset)) => (Enqueued::Stored { seq: offset as u64 + 1 }, Some(offset as u64 + 1)),
                    Some(Err(e)) => {
                        out.error = Some(e);
                        break;
                    }
                    None => break,
                },
                Plan::SameAs(first) => match seqs.get(first).copied().flatten() {
                    Some(seq) => (Enqueued::Already { seq }, None),
                    None => break,
                },
            };
            out.done.push(done);
            seqs.push(seq);
        }
        out
    }

    /// Sets aside what lies past the bound: from the `bounds.messages + 1`th message counting
    /// for the edge to the partition's end as indexed, recorded in the edge's document; up to
    /// `max` of them are written to the dead letters one by one (the rest are counted in the
    /// log line). Where the index holds fewer of the edge's messages than the bound
    /// (`max_indexed_per_edge` below it), the partition is read on to find where it ends.
    async fn down_trim(&self, edge: &str, bounds: DownBounds, max: usize) -> Result<u64, SinkError> {
        let d = &self.down;
        let doc = self.settle(edge).await?;
        if self.backlog_of(edge, &doc).messages <= bounds.messages {
            return Ok(0);
        }
        // The bound's last message is among the indexed ones where there is room for it.
        self.refill(edge, &doc).await?;
        let waiting = self.backlog_of(edge, &doc);
        if waiting.messages <= bounds.messages {
            return Ok(0);
        }
        let partition = partition_of(edge, d.topic.partitions);
        let keep = bounds.messages.min(usize::MAX as u64) as usize;
        // Where the bound ends: among the indexed messages, or past them, found by reading on.
        let cut = d.index.with_ends(|i, ends| {
            let e = i.edges.get(edge)?;
            let indexed: Vec<i64> = e.entries.iter().filter(|m| doc.counts(m.offset)).map(|m| m.offset).collect();
            let end = ends.get(partition as usize).copied().unwrap_or(0);
            let at = match indexed.get(keep) {
                Some(o) => Ok(*o),
                None => Err((e.over?.from, keep - indexed.len())),
            };
            Some((at, end, e.over.map_or(0, |o| o.count), e.reads))
        });
        let Some((at, end, counted, reads)) = cut else { return Ok(0) };
        let from = match at {
            Ok(from) => from,
            Err((over, past)) => {
                let range =
                    Range { topic: d.topic.name.clone(), partition, from: over, end, max: past + 1, payloads: false };
                let (mine, trimmed) = (edge.to_owned(), doc.clone());
                let read = d.fetcher.read(range, move |f| {
                    edge_of(f.key.as_deref()) == Some(mine.as_str()) && !trimmed.is_trimmed(f.offset)
                });
                match read.await?.get(past) {
                    Some(f) => f.offset,
                    None => return Ok(0),
                }
            }
        };
        if from >= end {
            return Ok(0);
        }
        let beyond = waiting.messages - bounds.messages;
        let reason =
            format!("published past downlink.max_backlog_messages ({}) by a client other than send", bounds.messages);
        let range = Range { topic: d.topic.name.clone(), partition, from, end, max, payloads: true };
        let mine = edge.to_owned();
        let found = d.fetcher.read(range, move |f| edge_of(f.key.as_deref()) == Some(mine.as_str())).await?;
        for f in &found {
            self.dead_letter(edge, f, "refused", &reason).await?;
        }
        // Merged with the range before when none of the edge's messages that count lies between:
        // an edge flooded while away then keeps one range, not one per trim.
        let between = |last: i64| {
            d.index.with(|i| {
                i.edges.get(edge).is_none_or(|e| {
                    e.over.is_some_and(|o| o.from <= from)
                        || e.entries.iter().any(|m| m.offset > last && m.offset < from && doc.counts(m.offset))
                })
            })
        };
        self.write_doc(edge, |doc| {
            doc.add_trimmed(from, end, between);
            (true, ())
        })
        .await?;
        d.index.with_mut(|i| i.trimmed(edge, reads, from, (end, counted)));
        if beyond > found.len() as u64 {
            tracing::warn!(
                edge,
                beyond,
                written = found.len(),
                "downlink: set aside past the bound, not all as dead letters"
            );
        }
        Ok(beyond)
    }

    /// As the state topic has it now: a session that takes the edge over starts from it.
    async fn down_state(&self, edge: &str) -> Result<DownState, SinkError> {
        self.state.read_to_end().await?;
        Ok(self.down_doc(edge)?.state)
    }

    async fn down_read(&self, edge: &str, after: u64, max: ReadLimit) -> Result<Vec<Pending>, SinkError> {
        let d = &self.down;
        let doc = self.settle(edge).await?;
        let wanted = self.entries(edge, &doc, after.min(i64::MAX as u64) as i64, max).await?;
        let (Some(first), Some(last)) = (wanted.first(), wanted.last()) else { return Ok(Vec::new()) };
        let partition = partition_of(edge, d.topic.partitions);
        let range = Range {
            topic: d.topic.name.clone(),
            partition,
            from: first.offset,
            end: last.offset + 1,
            max: wanted.len(),
            payloads: true,
        };
        let offsets: HashSet<i64> = wanted.iter().map(|m| m.offset).collect();
        let mine = edge.to_owned();
        let found = d
            .fetcher
            .read(range, move |f| offsets.contains(&f.offset) && edge_of(f.key.as_deref()) == Some(mine.as_str()))
            .await?;
        // What the index knew of and the topic no longer holds (its retention deleted it): only
        // below the partition's first offset. A read that missed any other is no proof of it
        // (the session reads again), and what follows it must not be sent ahead of it.
        let got: HashSet<i64> = found.iter().map(|f| f.offset).collect();
        let missed: Vec<i64> = wanted.iter().map(|m| m.offset).filter(|o| !got.contains(o)).collect();
        if !missed.is_empty() {
            let start = d.fetcher.start(&d.topic.name, partition).await?;
            if let Some(kept) = missed.iter().find(|o| **o >= start) {
                return Err(SinkError::Unavailable {
                    what: "downlink read",
                    reason: format!(
                        "{}/{partition}: {edge}'s message at offset {kept} not read back (the partition starts at {start})",
                        d.topic.name
                    ),
                });
            }
            tracing::debug!(edge, gone = missed.len(), "downlink messages deleted before delivery");
            d.index.with_mut(|i| i.forget(edge, |o| missed.contains(&o)));
        }
        let mut out = Vec::with_capacity(found.len());
        for f in found {
            let repeats = f.header(SEND_ID).and_then(|id| d.index.with(|i| i.edges.get(edge)?.repeats(id, f.offset)));
            let (seq, stored_ms) = (f.offset as u64 + 1, f.at_ms);
            let (msg, mut invalid) = parse(f);
            if let Some(first) = repeats {
                invalid = Some(format!("a repeat of seq {}, sent with the same id", first + 1));
            }
            out.push(Pending { seq, stored_ms, msg, invalid });
        }
        Ok(out)
    }

    async fn down_record(&self, edge: &str, done: &DownDone) -> Result<(), SinkError> {
        for r in &done.refused {
            self.set_aside(edge, r.seq, "refused", &r.reason).await?;
        }
        for seq in &done.expired {
            self.set_aside(edge, *seq, "expired", "its expiry ran out before the edge could deliver it").await?;
        }
        self.write_doc(edge, |doc| {
            if doc.state.position >= done.up_to {
                return (false, ());
            }
            let s = &mut doc.state;
            s.position = done.up_to;
            s.delivered += done.counts.delivered;
            s.refused += done.counts.refused;
            s.expired += done.counts.expired;
            (true, ())
        })
        .await?;
        self.down.index.with_mut(|i| i.raise_floor(edge, done.up_to.min(i64::MAX as u64) as i64));
        Ok(())
    }

    async fn down_set_aside(&self, edge: &str, seq: u64, outcome: &'static str, reason: &str) -> Result<(), SinkError> {
        self.set_aside(edge, seq, outcome, reason).await
    }

    async fn down_backlog(&self, edge: &str) -> Result<Backlog, SinkError> {
        let doc = self.settle(edge).await?;
        Ok(self.backlog_of(edge, &doc))
    }

    async fn down_dead_letters(&self, edge: Option<&str>, limit: usize) -> Result<Vec<DownDeadLetter>, SinkError> {
        let d = &self.down;
        let partitions: Vec<i32> = match edge {
            Some(e) => vec![partition_of(e, d.dead.partitions)],
            None => (0..d.dead.partitions).collect(),
        };
        let mut seen = BTreeMap::new();
        for p in partitions {
            let (low, high) = d.fetcher.offset_at(&d.dead.name, p, 0).await?;
            let range = Range {
                topic: d.dead.name.clone(),
                partition: p,
                from: low.max(high - DEAD_SCAN),
                end: high,
                max: usize::MAX,
                payloads: false,
            };
            let only = edge.map(str::to_owned);
            let found = d
                .fetcher
                .read(range, move |f| only.as_deref().is_none_or(|e| edge_of(f.key.as_deref()) == Some(e)))
                .await?;
            for f in found {
                let letter = DownDeadLetter::from_headers(|k| f.header(k).unwrap_or_default().to_owned());
                // A dead letter written twice (a bridge that died before hearing it was) is
                // listed once.
                seen.entry((letter.edge.clone(), letter.seq, letter.outcome.clone())).or_insert(letter);
            }
        }
        let mut out: Vec<DownDeadLetter> = seen.into_values().collect();
        out.sort_by_key(|l| (l.at_ms, l.seq));
        let skip = out.len().saturating_sub(limit);
        Ok(out.split_off(skip))
    }

    /// The edges with a document (sent to and connected since) and those the index holds
    /// messages for (at most `sink.downlink.max_edges`).
    async fn down_summary(&self) -> Result<Vec<DownSummary>, SinkError> {
        // Each document is read (and a corrupt one named) by `settle`.
        let mut edges: std::collections::BTreeSet<String> =
            self.state.scan("d/").into_iter().map(|(key, _)| key["d/".len()..].to_owned()).collect();
        self.down.index.with(|i| {
            let waiting = i.edges.iter().filter(|(_, e)| !e.entries.is_empty() || e.over.is_some());
            edges.extend(waiting.map(|(k, _)| k.clone()));
        });
        let mut out = Vec::with_capacity(edges.len());
        for edge in edges {
            let doc = self.settle(&edge).await?;
            let backlog = self.backlog_of(&edge, &doc);
            out.push(DownSummary {
                edge,
                state: doc.state,
                waiting: backlog.messages,
                waiting_bytes: Some(backlog.bytes),
                oldest_ms: backlog.oldest_ms,
            });
        }
        Ok(out)
    }

    /// Records' timestamps are their producers' clocks: the cursor is the time now.
    async fn reply_cursor(&self) -> Result<u64, SinkError> {
        Ok(now_ms())
    }

    /// Looks in each records topic that could hold the reply (whatever its class), in the
    /// edge's partition, at the records stored since the cursor.
    async fn find_reply(
        &self,
        edge: &str,
        topic: &str,
        correlation: &[u8],
        cursor: u64,
    ) -> Result<Option<Reply>, SinkError> {
        let want = crate::names::correlation_header(correlation);
        for (name, partitions) in self.topics.listed().await? {
            if !self.template.could_hold(&name, edge, topic) || partitions < 1 {
                continue;
            }
            let partition = partition_of(edge, partitions);
            let (from, end) = self.down.fetcher.offset_at(&name, partition, cursor).await?;
            let range = Range { topic: name, partition, from, end, max: 1, payloads: true };
            let (edge, topic, want) = (edge.to_owned(), topic.to_owned(), want.clone());
            let found = self
                .down
                .fetcher
                .read(range, move |f| {
                    f.header("Edge-Id") == Some(edge.as_str())
                        && f.header("Mqtt-Topic") == Some(topic.as_str())
                        && f.header("Mqtt-Correlation-Data") == Some(want.as_str())
                })
                .await?;
            if let Some(f) = found.into_iter().next() {
                let headers = f.headers.into_iter().filter_map(|(k, v)| Some((k, v?))).collect();
                return Ok(Some(Reply { payload: f.payload.unwrap_or_default(), headers }));
            }
        }
        Ok(None)
    }

    /// The cursor counts the messages the index saw; news is what it saw since.
    async fn down_news(&self, cursor: Option<u64>, wait: Duration) -> Result<(u64, Vec<String>), SinkError> {
        self.count_unread();
        let index = &self.down.index;
        let Some(cursor) = cursor else { return Ok((index.with(|i| i.seen), Vec::new())) };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let (seen, edges) = index.with(|i| (i.seen, i.news(cursor)));
            if !edges.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok((seen, edges));
            }
            index.polled().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DownDoc;

    /// [issue 44] An edge flooded while away is trimmed again and again: each trim with nothing
    /// of the edge's that counts between it and the last range extends that range, so the
    /// document keeps one range, not one per trim; a message that counts between keeps them
    /// apart, and so does a range that does not follow the last.
    #[test]
    fn trims_with_nothing_between_merge_into_one_range() {
        let mut doc = DownDoc::default();
        doc.add_trimmed(10, 20, |_| panic!("nothing to merge with"));
        doc.add_trimmed(25, 30, |last| {
            assert_eq!(last, 19);
            false
        });
        doc.add_trimmed(30, 41, |_| false);
        assert_eq!(doc.trimmed, [(10, 40)]);
        assert!(doc.is_trimmed(27) && doc.is_trimmed(22), "what lay between was the edge's to skip too");

        doc.add_trimmed(50, 60, |last| {
            assert_eq!(last, 40);
            true
        });
        assert_eq!(doc.trimmed, [(10, 40), (50, 59)]);
        assert!(!doc.is_trimmed(45));
        // A range at or before the last one's end (a stale follower) is kept on its own.
        doc.add_trimmed(55, 70, |_| false);
        assert_eq!(doc.trimmed, [(10, 40), (50, 59), (55, 69)]);
    }
}
