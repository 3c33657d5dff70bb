//! What reached a Kafka sink, for an operator (`sink::inspect`): records read with
//! `read_committed` from every records topic (what the template made, and the gaps topic),
//! dead letters from the dead-letter topic. Read without a running bridge.

use std::collections::BTreeMap;

use super::fetch::{Fetched, Fetcher, Range};
use super::names::partition_of;
use super::settings::KafkaSettings;
use super::topics::Topics;
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

    /// Every dead letter (of `edge`, if given) in the dead-letter topic's last 100,000 per
    /// partition, oldest first. `seq` is the letter's offset.
    pub(crate) async fn dead_letters(&self, edge: Option<&str>) -> Result<Vec<DeadLetter>, SinkError> {
        let topic = self.settings.dead_letter_topic.clone();
        let partitions =
            self.topics.listed().await?.into_iter().find(|(n, _)| *n == topic).map_or(0, |(_, partitions)| partitions);
        let mut all = Vec::new();
        for p in 0..partitions {
            if edge.is_some_and(|e| partition_of(e, partitions) != p) {
                continue;
            }
            let only = edge.map(str::to_owned);
            let keep = move |f: &Fetched| only.as_deref().is_none_or(|e| f.header("Edge-Id") == Some(e));
            for f in self.read((&topic, p), Some(SCAN), true, keep).await? {
                all.push(f);
            }
        }
        all.sort_by_key(|f| (f.at_ms, f.offset));
        Ok(all
            .into_iter()
            .map(|f| {
                let header = |k: &str| f.header(k).unwrap_or_default().to_owned();
                let (reason, subject, whole) =
                    (header("Edge-Refused"), header("Edge-Topic"), f.payload.as_ref().is_some_and(|p| !p.is_empty()));
                let seq = f.offset as u64;
                DeadLetter { seq, reason, error: String::new(), subject, whole, record: self.seen(&topic, f) }
            })
            .collect())
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
