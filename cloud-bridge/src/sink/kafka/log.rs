//! A compacted topic read whole into memory and followed ([`super::follow`]): the sink's state
//! (marks, epochs, the fleet view, the schema registry), each key's latest value.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::message::{BorrowedMessage, Message};

use super::fetch::{Fetcher, Range};
use super::follow::{Apply, Follower};
use super::settings::KafkaSettings;
use crate::sink::SinkError;

/// What a log keeps of each key's latest record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Its value, in memory.
    Values,
    /// Where it is (partition, offset): values too large to hold for a whole fleet (the
    /// dictionaries) are fetched when asked for ([`StateLog::fetch`]).
    Offsets,
}

/// Each key's latest value (or where it is).
struct Latest {
    keep: Keep,
    values: BTreeMap<String, Vec<u8>>,
    at: std::collections::HashMap<String, (i32, i64)>,
}

impl Apply for Latest {
    fn apply(&mut self, m: &BorrowedMessage<'_>) {
        let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) else { return };
        match (m.payload(), self.keep) {
            (Some(value), Keep::Values) => {
                self.values.insert(key, value.to_vec());
            }
            (Some(_), Keep::Offsets) => {
                self.values.insert(key.clone(), Vec::new());
                self.at.insert(key, (m.partition(), m.offset()));
            }
            // A tombstone.
            (None, _) => {
                self.values.remove(&key);
                self.at.remove(&key);
            }
        }
    }
}

/// A compacted topic, materialised.
pub(crate) struct StateLog {
    follower: Follower<Latest>,
    /// Reads values by offset, for a log that keeps offsets.
    fetcher: Option<Fetcher>,
}

impl StateLog {
    /// Starts following `topic`, which has `partitions` partitions.
    pub(crate) fn start(settings: &KafkaSettings, topic: &str, partitions: i32, keep: Keep) -> Result<Self, SinkError> {
        let latest = Latest { keep, values: BTreeMap::new(), at: std::collections::HashMap::new() };
        let fetcher = match keep {
            Keep::Offsets => Some(Fetcher::new(settings)?),
            Keep::Values => None,
        };
        Ok(Self { follower: Follower::start(settings, topic, partitions, latest)?, fetcher })
    }

    /// Waits until everything committed to the topic when called is applied.
    pub(crate) async fn read_to_end(&self) -> Result<(), SinkError> {
        self.follower.read_to_end().await
    }

    /// Waits until every transaction open on the topic when called has ended, and what was
    /// committed up to there is applied ([`Follower::read_settled`]).
    pub(crate) async fn read_settled(&self) -> Result<(), SinkError> {
        self.follower.read_settled().await
    }

    /// Waits, reading to the end, until what is applied of `key` is `value` ([`Self::shows`]):
    /// a commit of this bridge's, which is readable a moment after it returns (its markers
    /// follow), seen before the next read that must see it. Fails after `within`.
    pub(crate) async fn await_shows(&self, key: &str, value: Option<&[u8]>, within: Duration) -> Result<(), SinkError> {
        let deadline = tokio::time::Instant::now() + within;
        while !self.shows(key, value) {
            if tokio::time::Instant::now() > deadline {
                return Err(SinkError::Unavailable {
                    what: "state read",
                    reason: format!("{key} committed in {}, not readable after {within:?}", self.topic()),
                });
            }
            self.read_to_end().await?;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// The topic it follows.
    pub(crate) fn topic(&self) -> &str {
        self.follower.topic()
    }

    /// Whether what is applied of `key` is `value` (`None`: deleted). A log that keeps offsets
    /// says whether the key is there.
    pub(crate) fn shows(&self, key: &str, value: Option<&[u8]>) -> bool {
        self.follower.with(|l| match (l.values.get(key), value) {
            (None, None) => true,
            (Some(_), Some(_)) if l.at.contains_key(key) => true,
            (Some(have), Some(want)) => have == want,
            _ => false,
        })
    }

    /// Whether `key`'s value as applied so far is `value` (compared where it is, not copied).
    pub(crate) fn is(&self, key: &str, value: &[u8]) -> bool {
        self.follower.with(|l| l.values.get(key).is_some_and(|v| v.as_slice() == value))
    }

    /// The value of `key`, as applied so far.
    pub(crate) fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.follower.with(|l| l.values.get(key).cloned())
    }

    /// The keys starting with `prefix` and their values, as applied so far.
    pub(crate) fn scan(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        self.follower.with(|l| {
            l.values
                .range(prefix.to_owned()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
    }

    /// The value of `key` in a log that keeps offsets: read from the brokers where the log last
    /// saw it (none if compacted away meanwhile: a newer value or a deletion came).
    pub(crate) async fn fetch(&self, key: &str) -> Result<Option<Vec<u8>>, SinkError> {
        let Some((partition, offset)) = self.follower.with(|l| l.at.get(key).copied()) else { return Ok(None) };
        let Some(fetcher) = &self.fetcher else { return Ok(self.get(key)) };
        let range =
            Range { topic: self.topic().to_owned(), partition, from: offset, end: offset + 1, max: 1, payloads: true };
        let found = fetcher.read(range, move |f| f.offset == offset).await?;
        Ok(found.into_iter().next().and_then(|f| f.payload))
    }
}
