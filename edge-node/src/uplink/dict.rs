//! Zstd dictionaries for the uplink, trained per class on the edge's own recent traffic.
//!
//! Small telemetry messages repeat their keys, units and topic levels from one message to the
//! next; a batch cut short by its linger holds too few of them for plain zstd to learn that,
//! while a dictionary carries it in advance. The rules:
//!
//! - Samples are the CBOR of single records as they go up (the batch body is a CBOR array of
//!   exactly these), taken per class until `samples` bytes are held, then trained off the async
//!   runtime. A class whose samples cannot make a dictionary (too few, too alike) waits for
//!   twice as many before it tries again. After `retrain` a class samples afresh, so a
//!   dictionary follows the traffic as it drifts; the new one has a new id.
//! - A batch uses the dictionary of its most frequent class, and only one the cloud has said it
//!   holds durably: listed in the welcome, or confirmed by `DictStored` after the edge
//!   announced it on this connection. Batches and control frames travel on different streams,
//!   so a batch may never name a dictionary the bridge could still be waiting for, and a
//!   bridge that takes over after a reconnect finds every dictionary in shared storage.
//! - On a session of protocol version 7 or later (column-wise bodies in format 2), a class's
//!   dictionary is made of the table entries its samples repeat (topics, JSON shapes,
//!   strings: `columns::dictionary`), not trained by zstd: the bodies' values are bit-packed
//!   and their tables are what each batch would otherwise send again.
//! - A dictionary's id is the SHA-256 of its bytes; a session of protocol version 1 names it
//!   by the first 16 hex digits. The hello names the full ids (it goes before the version is
//!   chosen), so a version 1 bridge knows none of them and is sent each again.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use shared::proto::columns::Format;
use shared::proto::compress::{self, Dict, DictRef};
use shared::proto::{DictAnnounce, ProtoError, WireRecord};
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy)]
pub(crate) struct DictSettings {
    /// Dictionary size in bytes; 0 turns dictionaries off.
    pub size: usize,
    /// Sample bytes per class before training.
    pub samples: usize,
    /// Age after which a class's dictionary is trained again.
    pub retrain: Duration,
}

/// Sample bytes for a dictionary of table entries (about 50 telemetry records).
const COLUMN_SAMPLES: usize = 8 << 10;

/// Each failed training doubles a class's sample goal, up to this many times the setting.
const MAX_GOAL_FACTOR: usize = 8;

#[derive(Debug, Default)]
struct ClassState {
    samples: Vec<Vec<u8>>,
    sample_bytes: usize,
    goal_factor: usize,
    current: Option<Dict>,
    trained_at: Option<Instant>,
}

#[derive(Debug)]
pub struct DictBook {
    settings: DictSettings,
    classes: HashMap<String, ClassState>,
    training: Option<(String, JoinHandle<Result<Dict, ProtoError>>)>,
    /// Ids the cloud holds, on the current connection, as its version names them.
    confirmed: HashSet<String>,
    /// Ids announced on the current connection and not yet confirmed.
    announced: HashSet<String>,
    /// The protocol version of the current connection.
    version: u16,
}

/// What a batch should be packed with.
#[derive(Debug, Default)]
pub(crate) struct Choice<'a> {
    pub dict: Option<DictRef<'a>>,
    /// A dictionary to announce now; later batches can use it once the cloud confirms it.
    pub announce: Option<DictAnnounce>,
}

impl DictBook {
    pub(crate) fn new(settings: DictSettings) -> Self {
        Self {
            settings,
            classes: HashMap::new(),
            training: None,
            confirmed: HashSet::new(),
            announced: HashSet::new(),
            version: 1,
        }
    }

    fn enabled(&self) -> bool {
        self.settings.size > 0
    }

    /// Sample bytes a class collects before its dictionary is made: on a version 7 session at
    /// most [`COLUMN_SAMPLES`], since a dictionary of repeated table entries needs only enough
    /// records to see them repeat, and the batches before it go without.
    fn goal(&self) -> usize {
        if matches!(Format::of_version(self.version), Some(Format::V2 | Format::V3)) {
            self.settings.samples.min(COLUMN_SAMPLES)
        } else {
            self.settings.samples
        }
    }

    /// The ids of the dictionaries in use, for the hello.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> =
            self.classes.values().filter_map(|c| c.current.as_ref().map(|d| d.id.clone())).collect();
        ids.sort();
        ids
    }

    /// A new connection of protocol `version`: the cloud holds `known` (from its welcome),
    /// nothing is announced yet.
    pub fn connected(&mut self, known: &[String], version: u16) {
        self.confirmed = known.iter().cloned().collect();
        self.announced.clear();
        self.version = version;
    }

    /// The cloud stored dictionary `id`.
    pub fn stored(&mut self, id: String) {
        self.announced.remove(&id);
        self.confirmed.insert(id);
    }

    /// Takes samples from records about to be sent.
    pub(crate) fn observe(&mut self, records: &[WireRecord], now: Instant) {
        if !self.enabled() {
            return;
        }
        let goal = self.goal();
        for r in records {
            let Some(m) = r.as_message() else { continue };
            if self.training.as_ref().is_some_and(|(class, _)| *class == m.class) {
                continue;
            }
            // Looked up before inserting: a class name is cloned once, not once per record.
            if !self.classes.contains_key(&m.class) {
                self.classes.insert(m.class.clone(), ClassState::default());
            }
            let Some(state) = self.classes.get_mut(&m.class) else { continue };
            let stale = state.trained_at.is_none_or(|t| now.saturating_duration_since(t) >= self.settings.retrain);
            if !stale || state.sample_bytes >= goal * state.goal_factor.max(1) {
                continue;
            }
            let cbor = compress::sample(r);
            state.sample_bytes += cbor.len();
            state.samples.push(cbor);
        }
    }

    /// Installs a finished training and starts the next one that has its samples. Returns a
    /// dictionary that just became current, for the log.
    pub(crate) async fn poll_training(&mut self, now: Instant) -> Option<Dict> {
        let mut installed = None;
        if let Some((class, handle)) = self.training.take_if(|(_, h)| h.is_finished()) {
            // Finished, so this does not wait.
            let result = handle.await.ok();
            let state = self.classes.entry(class.clone()).or_default();
            match result {
                Some(Ok(dict)) => {
                    state.samples.clear();
                    state.sample_bytes = 0;
                    state.goal_factor = 1;
                    state.trained_at = Some(now);
                    state.current = Some(dict.clone());
                    installed = Some(dict);
                }
                Some(Err(e)) => {
                    state.goal_factor = (state.goal_factor.max(1) * 2).min(MAX_GOAL_FACTOR);
                    // Not trained now; resample after the usual interval if it keeps failing.
                    if state.goal_factor == MAX_GOAL_FACTOR {
                        state.trained_at = Some(now);
                    }
                    tracing::debug!(class, error = %e, "no dictionary from these samples; sampling more");
                }
                None => {}
            }
        }
        if self.training.is_none() {
            let goal = self.goal();
            let ready = self
                .classes
                .iter_mut()
                .find(|(_, s)| !s.samples.is_empty() && s.sample_bytes >= goal * s.goal_factor.max(1));
            if let Some((class, state)) = ready {
                let samples = std::mem::take(&mut state.samples);
                state.sample_bytes = 0;
                let (name, size) = (class.clone(), self.settings.size);
                // Column-wise bodies carry their values bit-packed: what a dictionary can
                // give them is the table entries they repeat, not what zstd's trainer finds.
                let columns = matches!(Format::of_version(self.version), Some(Format::V2 | Format::V3));
                let handle = tokio::task::spawn_blocking(move || {
                    if columns {
                        compress::train_columns(&name, &samples, size)
                    } else {
                        compress::train(&name, &samples, size)
                    }
                });
                self.training = Some((class.clone(), handle));
            }
        }
        installed
    }

    /// The dictionary for a batch of `records`.
    pub(crate) fn choose(&mut self, records: &[WireRecord]) -> Choice<'_> {
        if !self.enabled() {
            return Choice::default();
        }
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for m in records.iter().filter_map(WireRecord::as_message) {
            *counts.entry(m.class.as_str()).or_default() += 1;
        }
        let Some((class, _)) = counts.into_iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0))) else {
            return Choice::default();
        };
        let Some(dict) = self.classes.get(class).and_then(|s| s.current.as_ref()) else {
            return Choice::default();
        };
        let named = dict.on(self.version);
        if self.confirmed.contains(named.id) {
            return Choice { dict: Some(named), announce: None };
        }
        if self.announced.insert(named.id.to_owned()) {
            let announce =
                DictAnnounce { id: named.id.to_owned(), class: dict.class.clone(), bytes: dict.bytes.clone() };
            return Choice { dict: None, announce: Some(announce) };
        }
        Choice::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::proto::WireMessage;
    use shared::proto::{Lane, Seq};

    fn record(seq: u64, class: &str) -> WireRecord {
        let payload = format!(
            r#"{{"camera":"cam-{}","temp_c":{}.{},"fps":{},"dropped":{},"status":"ok"}}"#,
            seq % 7,
            40 + seq % 13,
            seq % 10,
            25 + seq % 6,
            seq % 3
        );
        WireRecord::message(
            Seq(seq),
            WireMessage {
                class: class.into(),
                topic: format!("telemetry/cam-{}/metrics", seq % 7),
                payload: payload.into_bytes(),
                qos: 1,
                enqueued_ms: 1_700_000_000_000 + seq * 37,
                expires_ms: None,
                user_properties: vec![],
                correlation_data: None,
                content_type: None,
                schema: None,
            },
        )
    }

    fn settings(size: usize) -> DictSettings {
        DictSettings { size, samples: 16 << 10, retrain: Duration::from_secs(3600) }
    }

    async fn trained(book: &mut DictBook, now: Instant) -> Dict {
        for _ in 0..500 {
            if let Some(d) = book.poll_training(now).await {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no dictionary trained");
    }

    #[tokio::test]
    async fn a_dictionary_is_used_only_once_the_cloud_holds_it() {
        let now = Instant::now();
        let mut book = DictBook::new(settings(2048));
        book.connected(&[], 2);
        let records: Vec<_> = (1..=400).map(|s| record(s, "telemetry")).collect();
        book.observe(&records, now);
        // Traffic that goes on while it trains is not sampled for a second one.
        book.observe(&records, now);
        let dict = trained(&mut book, now).await;
        assert_eq!(dict.class, "telemetry");
        assert_eq!(book.ids(), std::slice::from_ref(&dict.id));
        book.observe(&records, now);
        assert!(
            book.poll_training(now).await.is_none() && book.training.is_none(),
            "one dictionary per retrain period"
        );

        // Unconfirmed: announce once, pack without it meanwhile.
        let first = book.choose(&records[..20]);
        assert!(first.dict.is_none());
        assert_eq!(first.announce.map(|a| a.id), Some(dict.id.clone()));
        let again = book.choose(&records[..20]);
        assert!(again.dict.is_none() && again.announce.is_none(), "announced once per connection");
        book.stored(dict.id.clone());
        assert_eq!(book.choose(&records[..20]).dict.map(|d| d.id.to_owned()), Some(dict.id.clone()));

        // A new connection whose bridge does not hold it: announced again.
        book.connected(&[], 2);
        assert!(book.choose(&records[..20]).announce.is_some());
        // One that does: used at once.
        book.connected(std::slice::from_ref(&dict.id), 2);
        assert!(book.choose(&records[..20]).dict.is_some());

        // It pays: a short batch is smaller with the dictionary than without.
        let with = compress::pack("e", Lane(0), Seq(1), &records[..20], Some(dict.on(2)), 3).unwrap();
        let without = compress::pack("e", Lane(0), Seq(1), &records[..20], None, 3).unwrap();
        assert!(with.body.len() * 4 < without.body.len() * 3, "{} vs {} bytes", with.body.len(), without.body.len());
    }

    /// On a version 7 session a class's dictionary is its repeated table entries (raw content,
    /// no zstd header), made from fewer samples, and it pays on column-wise batches.
    #[tokio::test]
    async fn a_version_7_session_makes_dictionaries_of_table_entries() {
        let now = Instant::now();
        let mut book = DictBook::new(settings(4096));
        book.connected(&[], 7);
        assert_eq!(book.goal(), COLUMN_SAMPLES);
        let records: Vec<_> = (1..=400).map(|s| record(s, "telemetry")).collect();
        book.observe(&records, now);
        let dict = trained(&mut book, now).await;
        assert_ne!(&dict.bytes[..4], &[0x37, 0xa4, 0x30, 0xec], "not a zstd-trained dictionary");
        let text = String::from_utf8_lossy(&dict.bytes);
        assert!(text.contains("telemetry/cam-3/metrics") && text.contains("cam-5"), "{text:?}");
        let columns = Some(Format::V2);
        let with =
            compress::pack_as("e", Lane(0), Seq(100), &records[99..149], Some(dict.on(7)), (3, columns)).unwrap();
        let without = compress::pack_as("e", Lane(0), Seq(100), &records[99..149], None, (3, columns)).unwrap();
        assert!(with.body.len() < without.body.len(), "{} vs {} bytes", with.body.len(), without.body.len());
        let dicts = HashMap::from([(dict.id.clone(), dict.bytes.clone())]);
        assert_eq!(compress::unpack(&with, &dicts, 1 << 20).unwrap(), &records[99..149]);
    }

    #[tokio::test]
    async fn a_version_1_session_names_a_dictionary_by_the_first_16_digits_of_its_hash() {
        let now = Instant::now();
        let mut book = DictBook::new(settings(2048));
        let records: Vec<_> = (1..=400).map(|s| record(s, "telemetry")).collect();
        book.observe(&records, now);
        let dict = trained(&mut book, now).await;
        assert_eq!(dict.id.len(), 64, "version 2 ids are the whole SHA-256");
        book.connected(&[], 1);
        let short = dict.id[..16].to_owned();
        assert_eq!(book.choose(&records[..20]).announce.map(|a| a.id), Some(short.clone()));
        book.stored(short.clone());
        assert_eq!(book.choose(&records[..20]).dict.map(|d| d.id), Some(short.as_str()));
        // The hello, sent before a version is chosen, names the full id.
        assert_eq!(book.ids(), std::slice::from_ref(&dict.id));
    }

    #[tokio::test]
    async fn a_batch_takes_the_dictionary_of_its_most_frequent_class() {
        let now = Instant::now();
        let mut book = DictBook::new(settings(2048));
        let telemetry: Vec<_> = (1..=400).map(|s| record(s, "telemetry")).collect();
        book.observe(&telemetry, now);
        let dict = trained(&mut book, now).await;
        book.connected(&[], 2);
        book.stored(dict.id.clone());
        let mut mixed: Vec<_> = (1..=3).map(|s| record(s, "telemetry")).collect();
        mixed.extend((4..=10).map(|s| record(s, "feedback")));
        assert!(book.choose(&mixed).dict.is_none(), "feedback has no dictionary yet");
        mixed.truncate(4);
        assert!(book.choose(&mixed).dict.is_some());
    }

    #[tokio::test]
    async fn samples_that_make_no_dictionary_raise_the_goal_and_size_zero_turns_it_off() {
        let now = Instant::now();
        // Far fewer sample bytes than the dictionary would hold: zstd's trainer gives up.
        let mut book = DictBook::new(DictSettings { samples: 64, ..settings(2048) });
        book.observe(&[record(1, "telemetry")], now);
        for _ in 0..100 {
            assert!(book.poll_training(now).await.is_none());
            if book.training.is_none() && book.classes["telemetry"].goal_factor > 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(book.classes["telemetry"].goal_factor, 2, "twice the samples next time");
        assert!(book.ids().is_empty());

        let mut off = DictBook::new(settings(0));
        let records: Vec<_> = (1..=400).map(|s| record(s, "telemetry")).collect();
        off.observe(&records, now);
        assert!(off.poll_training(now).await.is_none());
        assert!(off.classes.is_empty() && off.choose(&records).announce.is_none());
    }
}
