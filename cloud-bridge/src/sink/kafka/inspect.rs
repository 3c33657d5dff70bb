//! What reached a Kafka sink, for an operator (`sink::inspect`): records read with
//! `read_committed` from every records topic (what the template made, and the gaps topic),
//! dead letters from the dead-letter topic, and their replay. Read without a running bridge.
//!
//! A dead letter cannot be deleted from its topic (Kafka deletes only a partition's oldest
//! records), so a replay is recorded beside it: the record goes to the topic it was refused on
//! in one transaction with `replayed/<partition>/<offset>` in the state topic, and a letter with that
//! key is neither listed nor replayed again. A letter's `seq` names its partition and offset
//! together (`partition << 40 | offset`): the dead-letter topic has several partitions.

use std::collections::BTreeMap;

use super::fetch::{Fetched, Fetcher, Range};
use super::log::{Keep, StateLog};
use super::names::partition_of;
use super::outgoing::{Outgoing, Topic};
use super::settings::KafkaSettings;
use super::topics::{Kind, Topics};
use crate::sink::SinkError;
use crate::sink::seen::{DeadLetter, Seen};

/// How far back a tail reads, per partition: an edge with few records in a busy partition is
/// looked for in its last 100,000.
const SCAN: i64 = 100_000;
/// Records one read of a count takes at most.
const CHUNK: usize = 200_000;

/// A reader of a Kafka sink's topics.
pub(crate) struct Inspect {
    settings: KafkaSettings,
    topics: Topics,
    fetcher: Fetcher,
}

impl Inspect {
    pub(crate) fn new(settings: &KafkaSettings) -> Result<Self, SinkError> {
        Ok(Self { settings: settings.clone(), topics: Topics::new(settings)?, fetcher: Fetcher::new(settings)? })
    }

    /// The topics records are in: all but the sink's own and Kafka's internal ones.
    async fn records_topics(&self) -> Result<Vec<(String, i32)>, SinkError> {
        let s = &self.settings;
        let own = [
            &s.marks_topic,
            &s.state_topic,
            &s.dicts_topic,
            &s.schemas_topic,
            &s.dead_letter_topic,
            &s.downlink.topic,
            &s.downlink.dead_letter_topic,
        ];
        let mut topics = self.topics.listed().await?;
        topics.retain(|(name, _)| !name.starts_with("__") && !name.starts_with('_') && !own.contains(&name));
        topics.sort();
        Ok(topics)
    }

    /// The records of `topic`'s `partition` from `back` before its end (all: `None`) that
    /// `keep` keeps.
    async fn read(
        &self,
        (topic, partition): (&str, i32),
        back: Option<i64>,
        payloads: bool,
        keep: impl Fn(&Fetched) -> bool + Send + Clone + 'static,
    ) -> Result<Vec<Fetched>, SinkError> {
        let (low, end) = self.fetcher.offset_at(topic, partition, 0).await?;
        let mut from = back.map_or(low, |b| low.max(end - b));
        let mut out = Vec::new();
        while from < end {
            // Chunks, each read within the fetcher's bound; `next` passes what one read saw.
            let range = Range { topic: topic.to_owned(), partition, from, end, max: CHUNK, payloads };
            let seen = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(from));
            let (k, s) = (keep.clone(), seen.clone());
            let got = self
                .fetcher
                .read(range, move |f| {
                    s.store(f.offset + 1, std::sync::atomic::Ordering::Relaxed);
                    k(f)
                })
                .await?;
            out.extend(got);
            let next = seen.load(std::sync::atomic::Ordering::Relaxed);
            if next <= from || out.len() >= CHUNK * 50 {
                break;
            }
            from = next;
        }
        Ok(out)
    }

    /// The last `n` records stored (of `edge`, if given), oldest first.
    pub(crate) async fn tail(&self, edge: Option<&str>, n: usize) -> Result<Vec<Seen>, SinkError> {
        let mut all = Vec::new();
        for (topic, partitions) in self.records_topics().await? {
            let parts: Vec<i32> = match edge {
                Some(e) => vec![partition_of(e, partitions)],
                None => (0..partitions).collect(),
            };
            for p in parts {
                let only = edge.map(str::to_owned);
                let keep = move |f: &Fetched| only.as_deref().is_none_or(|e| f.header("Edge-Id") == Some(e));
                let back = match edge {
                    Some(_) => SCAN,
                    None => n as i64,
                };
                for f in self.read((&topic, p), Some(back), true, keep).await? {
                    all.push((f.at_ms, topic.clone(), f));
                }
            }
        }
        all.sort_by_key(|(at, topic, f)| (*at, topic.clone(), f.offset));
        let skip = all.len().saturating_sub(n);
        Ok(all.into_iter().skip(skip).map(|(_, topic, f)| self.seen(&topic, f)).collect())
    }

    /// Records stored per edge (messages and gap records together).
    pub(crate) async fn count(&self) -> Result<BTreeMap<String, u64>, SinkError> {
        let mut out = BTreeMap::new();
        for (topic, partitions) in self.records_topics().await? {
            for p in 0..partitions {
                for f in self.read((&topic, p), None, false, |_| true).await? {
                    if let Some(edge) = f.header("Edge-Id") {
                        *out.entry(edge.to_owned()).or_default() += 1;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every dead letter not replayed (of `edge`, if given) in the dead-letter topic's last
    /// 100,000 per partition, oldest first.
    pub(crate) async fn dead_letters(&self, edge: Option<&str>) -> Result<Vec<DeadLetter>, SinkError> {
        let topic = self.settings.dead_letter_topic.clone();
        let mut all = self.letters(edge).await?;
        // The state topic is read whole for its replay notes: only when there is a letter to
        // check (the console asks every few seconds, and most sinks have none).
        if !all.is_empty() {
            let state = self.state().await?;
            all.retain(|(p, f)| state.as_ref().is_none_or(|s| s.get(&replayed_key(*p, f.offset)).is_none()));
        }
        all.sort_by_key(|(_, f)| (f.at_ms, f.offset));
        Ok(all
            .into_iter()
            .map(|(p, f)| {
                let header = |k: &str| f.header(k).unwrap_or_default().to_owned();
                let (reason, subject, whole) =
                    (header("Edge-Refused"), header("Edge-Topic"), f.payload.as_ref().is_some_and(|p| !p.is_empty()));
                let seq = letter_seq(p, f.offset);
                DeadLetter { seq, reason, error: String::new(), subject, whole, record: self.seen(&topic, f) }
            })
            .collect())
    }

    /// The dead-letter topic's letters (of `edge`, if given) with their partitions.
    async fn letters(&self, edge: Option<&str>) -> Result<Vec<(i32, Fetched)>, SinkError> {
        let topic = self.settings.dead_letter_topic.clone();
        let partitions = self.partitions(&topic).await?;
        let mut all = Vec::new();
        for p in 0..partitions {
            if edge.is_some_and(|e| partition_of(e, partitions) != p) {
                continue;
            }
            let only = edge.map(str::to_owned);
            let keep = move |f: &Fetched| only.as_deref().is_none_or(|e| f.header("Edge-Id") == Some(e));
            for f in self.read((&topic, p), Some(SCAN), true, keep).await? {
                all.push((p, f));
            }
        }
        Ok(all)
    }

    /// `topic`'s partitions; 0 when it does not exist.
    async fn partitions(&self, topic: &str) -> Result<i32, SinkError> {
        Ok(self.topics.listed().await?.into_iter().find(|(n, _)| n == topic).map_or(0, |(_, partitions)| partitions))
    }

    /// The state topic read to its end, if it exists (what says which letters were replayed).
    async fn state(&self) -> Result<Option<StateLog>, SinkError> {
        let topic = &self.settings.state_topic;
        let partitions = self.partitions(topic).await?;
        if partitions == 0 {
            return Ok(None);
        }
        let log = StateLog::start(&self.settings, topic, partitions, Keep::Values)?;
        log.read_settled().await?;
        Ok(Some(log))
    }

    /// Produces the dead letters at `seqs` again, each to the topic it was refused on with its
    /// headers (but the refusal's), in one transaction with the note that it was replayed, so a
    /// letter goes once however often it is asked for. A letter without its payload (too large
    /// to keep), or whose topic is still one past `max_topics`, stays. Each letter's outcome: the
    /// topic it went to, or why not.
    pub(crate) async fn replay(&self, seqs: &[u64]) -> Result<Vec<(u64, Result<String, SinkError>)>, SinkError> {
        let s = &self.settings;
        let state_partitions = self.topics.ensure(&s.state_topic, Kind::Compacted).await?;
        let state_topic = Topic { name: s.state_topic.clone(), partitions: state_partitions };
        let state = StateLog::start(s, &s.state_topic, state_partitions, Keep::Values)?;
        let dead = (s.dead_letter_topic.clone(), self.partitions(&s.dead_letter_topic).await?);
        let mut out = Vec::with_capacity(seqs.len());
        for &seq in seqs {
            // One letter in memory at a time: each may be up to `max_message_bytes`.
            let (partition, offset) = ((seq >> 40) as i32, (seq & ((1 << 40) - 1)) as i64);
            let mut found = None;
            if partition < dead.1 {
                let (low, end) = self.fetcher.offset_at(&dead.0, partition, 0).await?;
                if (low..end).contains(&offset) {
                    let (topic, payloads) = (dead.0.clone(), true);
                    let range = Range { topic, partition, from: offset, end: offset + 1, max: 1, payloads };
                    found = self.fetcher.read(range, |_| true).await?.into_iter().find(|f| f.offset == offset);
                }
            }
            let outcome = match found {
                Some(f) => self.replay_one(seq, f, &state, &state_topic).await,
                None => Err(SinkError::invalid("replay", format!("no dead letter {seq}"))),
            };
            out.push((seq, outcome));
        }
        Ok(out)
    }

    async fn replay_one(
        &self,
        seq: u64,
        f: Fetched,
        state: &StateLog,
        state_topic: &Topic,
    ) -> Result<String, SinkError> {
        let refused = |reason: String| Err(SinkError::Invalid { what: "replay", reason });
        let (Some(topic), Some(edge)) = (f.header("Edge-Topic"), f.header("Edge-Id")) else {
            return refused(format!("dead letter {seq} does not say where it was refused (no Edge-Topic or Edge-Id)"));
        };
        let (topic, edge) = (topic.to_owned(), edge.to_owned());
        let payload = f.payload.clone().unwrap_or_default();
        // An empty payload may be the record's own (an empty MQTT message): the reason says.
        if f.header("Edge-Refused") == Some("too_large") {
            return refused(format!(
                "dead letter {seq} kept only the record's ids (its payload was too large to keep)"
            ));
        }
        // The bound the letter met: the topics the template made, taken as those that start as
        // its expansions do (a bridge counts those it made itself, which a command cannot).
        let s = &self.settings;
        let partitions = match self.partitions(&topic).await? {
            0 => {
                let prefix = s.topic.split('{').next().unwrap_or_default();
                let made = self
                    .records_topics()
                    .await?
                    .iter()
                    .filter(|(n, _)| *n != s.gaps_topic && n.starts_with(prefix))
                    .count();
                if made >= s.max_topics {
                    return refused(format!(
                        "dead letter {seq}: topic {topic} would still be one past max_topics ({}); raise it first",
                        s.max_topics
                    ));
                }
                self.topics.ensure(&topic, Kind::Records).await?
            }
            n => n,
        };
        let headers = f
            .headers
            .iter()
            .filter(|(n, _)| n != "Edge-Refused" && n != "Edge-Topic")
            .filter_map(|(n, v)| Some((n.clone(), v.clone()?.into_bytes())))
            .collect();
        let record = Outgoing {
            seq: 0,
            topic: topic.clone(),
            partition: partition_of(&edge, partitions),
            key: f.key.clone().unwrap_or_default(),
            headers,
            payload,
            tombstone: false,
        };
        let key = replayed_key((seq >> 40) as i32, f.offset);
        // One replayer at a time: a second opening the same id fences the first.
        let id = format!("{}.dead-letters", s.transactional_id_prefix);
        let done = super::txn::exclusive_write(s, &id, &[state], || {
            if state.get(&key).is_some() {
                return Ok((Vec::new(), false));
            }
            Ok((vec![record, state_topic.put(key.clone(), topic.clone().into_bytes())], true))
        })
        .await?;
        if !done {
            return refused(format!("dead letter {seq} was replayed already"));
        }
        Ok(topic)
    }

    fn seen(&self, topic: &str, f: Fetched) -> Seen {
        let header = |k: &str| f.header(k).unwrap_or_default().to_owned();
        let payload = f.payload.clone().unwrap_or_default();
        Seen {
            edge: header("Edge-Id"),
            id: header("Edge-Seq"),
            kind: if topic == self.settings.gaps_topic { "gap" } else { "message" }.into(),
            topic: header("Mqtt-Topic"),
            payload: Seen::payload(&payload),
            bytes: payload.len(),
            headers: f.headers.into_iter().filter_map(|(k, v)| Some((k, v?))).collect(),
        }
    }
}

/// A dead letter's `seq`: its partition and offset in one number.
fn letter_seq(partition: i32, offset: i64) -> u64 {
    ((partition as u64) << 40) | offset as u64
}

/// The state topic's note that the letter at `partition`, `offset` was replayed.
fn replayed_key(partition: i32, offset: i64) -> String {
    format!("replayed/{partition}/{offset}")
}
