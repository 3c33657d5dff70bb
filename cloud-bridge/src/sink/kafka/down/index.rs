//! What a bridge knows of the downlink topic without reading it again: per edge, where its
//! messages after its position are, their sizes and send ids; and the news (which edges got
//! messages, in the order they came). Built by following the topic ([`super::super::follow`]),
//! bounded, since any producer may write it:
//!
//! - at most `max_edges` edges (record keys are anyone's to invent); a key past it is not
//!   indexed and counted;
//! - per edge at most `max_indexed_per_edge` messages, and `max_indexed` over all: past them an
//!   edge's messages are only counted (`Over`), from the first not indexed, and found again by
//!   reading its partition from there when the indexed ones run out (`refill`).
//!
//! A message whose key is not in the partition its edge's messages go to (Java's default
//! partitioner: murmur2 of the key) is not the edge's: its seq would not order with theirs. It
//! is counted and logged, never delivered.

use std::collections::{HashMap, VecDeque};

use rdkafka::message::{BorrowedMessage, Headers, Message};

use super::super::follow::Apply;
use super::super::names::partition_of;
use crate::sink::downlink::SEND_IDS;

/// News kept for the watcher, at most: one that falls behind more than this is told every edge
/// it still has (sessions also poll on their own).
const NEWS: usize = 4096;

/// The header a send's id travels in.
pub(crate) const SEND_ID: &str = "Edge-Send-Id";

/// One indexed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub offset: i64,
    pub bytes: u64,
    pub at_ms: u64,
}

/// An edge's messages past what is indexed: how many, their bytes, and where the first is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Over {
    pub from: i64,
    pub count: u64,
    pub bytes: u64,
    /// The edge's position passed `from` (another bridge delivered them): the count is an
    /// upper bound until the partition is read again (`recounted`).
    pub stale: bool,
}

#[derive(Debug, Default)]
pub(crate) struct EdgeIndex {
    /// Its messages at or after `floor`, in offset order.
    pub entries: VecDeque<Entry>,
    pub over: Option<Over>,
    /// The offset of the edge's position (its seq): what lies below is delivered.
    floor: i64,
    /// Send ids seen, newest last, with the offset of the first message that carried each.
    ids: VecDeque<(Box<str>, i64, u64)>,
    /// How many reads of the partition changed `over`: a read is applied only if none was
    /// since it began, since its count of what came meanwhile is taken from `over` as it was.
    pub reads: u64,
}

impl EdgeIndex {
    /// The offset of the first message sent with `id` since `since_ms`.
    pub(crate) fn sent(&self, id: &str, since_ms: u64) -> Option<i64> {
        self.ids.iter().find(|(i, _, at)| &**i == id && *at >= since_ms).map(|(_, o, _)| *o)
    }

    /// Whether the message at `offset` repeats a send id an earlier message carried.
    pub(crate) fn repeats(&self, id: &str, offset: i64) -> Option<i64> {
        self.ids.iter().find(|(i, o, _)| &**i == id && *o < offset).map(|(_, o, _)| *o)
    }
}

/// The index. See the module doc.
#[derive(Debug)]
pub(crate) struct DownIndex {
    partitions: i32,
    max_indexed: usize,
    per_edge: usize,
    max_edges: usize,
    pub edges: HashMap<String, EdgeIndex>,
    indexed: usize,
    /// A count of the messages seen, and which edge each was for: the newest [`NEWS`].
    pub seen: u64,
    news: VecDeque<(u64, String)>,
    /// Messages not indexed since last taken: in another partition than their edge's, or past
    /// `max_edges`.
    misplaced: u64,
    unindexed: u64,
}

impl DownIndex {
    pub(crate) fn new(settings: &super::super::settings::KafkaDown, partitions: i32) -> Self {
        Self {
            partitions,
            max_indexed: settings.max_indexed,
            per_edge: settings.max_indexed_per_edge,
            max_edges: settings.max_edges,
            edges: HashMap::new(),
            indexed: 0,
            seen: 0,
            news: VecDeque::new(),
            misplaced: 0,
            unindexed: 0,
        }
    }

    /// The partition `edge`'s messages are in.
    pub(crate) fn partition(&self, edge: &str) -> i32 {
        partition_of(edge, self.partitions)
    }

    /// The edges that got messages after count `cursor`, and the count now; every edge indexed
    /// if the news of some was let go.
    pub(crate) fn news(&self, cursor: u64) -> Vec<String> {
        if self.news.front().is_some_and(|(n, _)| *n > cursor + 1) {
            return self.edges.keys().cloned().collect();
        }
        let mut edges: Vec<String> = self.news.iter().filter(|(n, _)| *n > cursor).map(|(_, e)| e.clone()).collect();
        edges.sort();
        edges.dedup();
        edges
    }

    /// The messages not indexed since last asked: (misplaced, past `max_edges`).
    pub(crate) fn take_ignored(&mut self) -> (u64, u64) {
        (std::mem::take(&mut self.misplaced), std::mem::take(&mut self.unindexed))
    }

    /// Lets go of `edge`'s messages below offset `floor` (its position, as a seq, is `floor`).
    pub(crate) fn raise_floor(&mut self, edge: &str, floor: i64) {
        let Some(e) = self.edges.get_mut(edge) else { return };
        if floor <= e.floor {
            return;
        }
        e.floor = floor;
        while e.entries.front().is_some_and(|m| m.offset < floor) {
            e.entries.pop_front();
            self.indexed -= 1;
        }
        // What is over is found again from the floor; its count is an upper bound until then.
        if let Some(over) = &mut e.over
            && floor > over.from
        {
            over.from = floor;
            over.stale = true;
        }
    }

    /// Room for more of `edge`'s messages in the index.
    pub(crate) fn room(&self, edge: &str) -> usize {
        let have = self.edges.get(edge).map_or(0, |e| e.entries.len());
        self.per_edge.saturating_sub(have).min(self.max_indexed.saturating_sub(self.indexed))
    }

    /// Indexes what a read of `edge`'s partition from its `Over` found: `found`, the edge's
    /// messages from `over.from` on, in order, with none of the edge's between them left out.
    /// `whole`: the read went to `until`, the partition's end as the follower had applied it
    /// when `counted` was the over count; what the follower counted since came after. `at`:
    /// `reads` when the read began; false, and nothing changed, if another read was applied
    /// since (it covered this one's stretch).
    pub(crate) fn refilled(
        &mut self,
        edge: &str,
        at: u64,
        found: &[Entry],
        (until, counted): (i64, u64),
        whole: bool,
    ) -> bool {
        let Some(e) = self.edges.get_mut(edge) else { return false };
        let Some(mut over) = e.over else { return false };
        if e.reads != at {
            return false;
        }
        e.reads += 1;
        let (start, floor) = (over.from, e.floor);
        for m in found.iter().filter(|m| m.offset >= start && m.offset >= floor) {
            e.entries.push_back(*m);
            self.indexed += 1;
            over.count = over.count.saturating_sub(1);
            over.bytes = over.bytes.saturating_sub(m.bytes);
            over.from = m.offset + 1;
        }
        if whole {
            // Exactly what came since the read began (a count raised past by a floor was an
            // upper bound).
            over.count = e.over.map_or(0, |o| o.count).saturating_sub(counted);
            over.from = until;
            if over.count == 0 {
                over.bytes = 0;
            }
        }
        e.over = (over.count > 0).then_some(over);
        true
    }

    /// What a read of all of `edge`'s partition from its `Over` to `until` (where the follower
    /// stood when `counted` was the over count) found: `found` indexed, `beyond` what there was
    /// no room for (its first offset, count and bytes). The count is exact again. `at` as for
    /// [`Self::refilled`].
    pub(crate) fn recounted(
        &mut self,
        edge: &str,
        at: u64,
        found: &[Entry],
        beyond: Option<(i64, u64, u64)>,
        (until, counted): (i64, u64),
    ) -> bool {
        let Some(e) = self.edges.get_mut(edge) else { return false };
        let Some(over) = e.over else { return false };
        if e.reads != at {
            return false;
        }
        e.reads += 1;
        let floor = e.floor;
        for m in found.iter().filter(|m| m.offset >= over.from && m.offset >= floor) {
            e.entries.push_back(*m);
            self.indexed += 1;
        }
        // What came after `until` was counted over since the read began.
        let since = over.count.saturating_sub(counted);
        let (from, count, bytes) = match beyond {
            Some((from, count, bytes)) => (from, count + since, bytes),
            None => (until, since, 0),
        };
        e.over = (count > 0).then_some(Over { from, count, bytes, stale: false });
        true
    }

    /// Lets go of `edge`'s messages from offset `from` to `end` (not included), set aside; with
    /// them what was counted over when `end` was where the follower stood (`counted`), and
    /// `reads` was `at`. Where a read was applied since, the count is not known to hold
    /// `counted` any more: it is marked for a recount.
    pub(crate) fn trimmed(&mut self, edge: &str, at: u64, from: i64, (end, counted): (i64, u64)) {
        let Some(e) = self.edges.get_mut(edge) else { return };
        let before = e.entries.len();
        e.entries.retain(|m| m.offset < from || m.offset >= end);
        self.indexed -= before - e.entries.len();
        let read = e.reads != at;
        e.reads += 1;
        if let Some(mut over) = e.over
            && over.from >= from
        {
            if read {
                over.stale = true;
            } else {
                over.count = over.count.saturating_sub(counted);
            }
            over.from = over.from.max(end);
            e.over = (over.count > 0).then_some(over);
        }
    }

    /// Lets go of `edge`'s messages at the offsets `gone` names (the topic no longer holds
    /// them, or they were set aside).
    pub(crate) fn forget(&mut self, edge: &str, gone: impl Fn(i64) -> bool) {
        let Some(e) = self.edges.get_mut(edge) else { return };
        let before = e.entries.len();
        e.entries.retain(|m| !gone(m.offset));
        self.indexed -= before - e.entries.len();
    }

    fn note(&mut self, edge: &str, offset: i64, bytes: u64, at_ms: u64, id: Option<&str>) {
        self.seen += 1;
        self.news.push_back((self.seen, edge.to_owned()));
        if self.news.len() > NEWS {
            self.news.pop_front();
        }
        let room = self.room(edge);
        let Some(e) = self.edges.get_mut(edge) else { return };
        if let Some(id) = id {
            e.ids.push_back((id.into(), offset, at_ms));
            if e.ids.len() > SEND_IDS.0 {
                e.ids.pop_front();
            }
        }
        if offset < e.floor {
            return;
        }
        match &mut e.over {
            Some(over) => {
                over.count += 1;
                over.bytes += bytes;
            }
            None if room > 0 => {
                e.entries.push_back(Entry { offset, bytes, at_ms });
                self.indexed += 1;
            }
            None => e.over = Some(Over { from: offset, count: 1, bytes, stale: false }),
        }
    }
}

/// What a downlink record weighs in a backlog: as [`crate::sink::downlink::Outgoing::bytes`]
/// weighs the message it stands for, so a bound counts alike whoever wrote it.
pub(crate) fn weight<'a>(payload: usize, headers: impl Iterator<Item = (&'a str, Option<&'a str>)> + Clone) -> u64 {
    let topic = headers.clone().find(|(n, _)| *n == "Mqtt-Topic").and_then(|(_, v)| v).unwrap_or_default();
    let (mut msg, _) = crate::sink::down_headers::parse(headers, Vec::new());
    msg.topic = topic.to_owned();
    msg.bytes() + payload as u64
}

/// The edge a record is for: its key, if that can be an edge id.
pub(crate) fn edge_of(key: Option<&[u8]>) -> Option<&str> {
    std::str::from_utf8(key?).ok().filter(|k| !k.is_empty() && k.len() <= 253)
}

impl Apply for DownIndex {
    fn apply(&mut self, m: &BorrowedMessage<'_>) {
        let Some(edge) = edge_of(m.key()) else {
            self.misplaced += 1;
            return;
        };
        if m.partition() != self.partition(edge) {
            self.misplaced += 1;
            return;
        }
        if !self.edges.contains_key(edge) {
            if self.edges.len() >= self.max_edges {
                self.unindexed += 1;
                return;
            }
            self.edges.insert(edge.to_owned(), EdgeIndex::default());
        }
        let headers = m.headers();
        let pairs: Vec<(&str, Option<&str>)> = headers
            .iter()
            .flat_map(|h| h.iter())
            .map(|h| (h.key, h.value.and_then(|v| std::str::from_utf8(v).ok())))
            .collect();
        let bytes = weight(m.payload_len(), pairs.iter().copied());
        let id = headers
            .and_then(|h| h.iter().find(|h| h.key == SEND_ID))
            .and_then(|h| h.value)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned);
        let at = m.timestamp().to_millis().unwrap_or(0).max(0) as u64;
        self.note(edge, m.offset(), bytes, at, id.as_deref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::kafka::settings::KafkaDown;

    fn index(per_edge: usize, max_edges: usize) -> DownIndex {
        let s = KafkaDown { max_indexed_per_edge: per_edge, max_edges, ..KafkaDown::default() };
        DownIndex::new(&s, 1)
    }

    fn add(i: &mut DownIndex, edge: &str, offset: i64) {
        if !i.edges.contains_key(edge) {
            i.edges.insert(edge.into(), EdgeIndex::default());
        }
        i.note(edge, offset, 10, 0, None);
    }

    #[test]
    fn past_its_bound_an_edge_is_counted_and_refilled_from_its_partition() {
        let mut i = index(3, 10);
        for o in 0..5 {
            add(&mut i, "a", o * 2);
        }
        let e = &i.edges["a"];
        assert_eq!(e.entries.iter().map(|m| m.offset).collect::<Vec<_>>(), [0, 2, 4]);
        assert_eq!(e.over, Some(Over { from: 6, count: 2, bytes: 20, stale: false }));
        // Delivered through seq 5 (offset 4): room for the two read again.
        i.raise_floor("a", 5);
        assert_eq!(i.room("a"), 3);
        let found = [Entry { offset: 6, bytes: 10, at_ms: 0 }, Entry { offset: 8, bytes: 10, at_ms: 0 }];
        assert!(i.refilled("a", 0, &found, (10, 2), true));
        let e = &i.edges["a"];
        assert_eq!(e.entries.iter().map(|m| m.offset).collect::<Vec<_>>(), [6, 8]);
        assert_eq!(e.over, None);
        // Later ones are indexed again.
        add(&mut i, "a", 11);
        assert_eq!(i.edges["a"].entries.len(), 3);
    }

    #[test]
    fn a_count_another_bridge_delivered_past_is_stale_until_read_again() {
        let mut i = index(2, 10);
        for o in 0..6 {
            add(&mut i, "a", o);
        }
        // Another bridge delivered through offset 3: this one's count of 4 over is too high.
        i.raise_floor("a", 4);
        let over = i.edges["a"].over.unwrap();
        assert!(over.stale && over.from == 4 && over.count == 4, "{over:?}");
        // Read again to offset 6: two left, both indexed; one more came meanwhile.
        add(&mut i, "a", 7);
        let found = [Entry { offset: 4, bytes: 10, at_ms: 0 }, Entry { offset: 5, bytes: 10, at_ms: 0 }];
        assert!(i.recounted("a", 0, &found, None, (6, 4)));
        let e = &i.edges["a"];
        assert_eq!(e.entries.iter().map(|m| m.offset).collect::<Vec<_>>(), [4, 5]);
        assert_eq!(e.over, Some(Over { from: 6, count: 1, bytes: 0, stale: false }));
    }

    /// Two reads of the same stretch (an edge's old session still reading as its new one
    /// starts, or the summary's beside a session's): the second one's result comes after the
    /// first was applied. Applied too, it took away what came since from the count, and those
    /// messages were in neither the entries nor the count: never delivered, the position
    /// passing them (a Kafka chaos run lost 10 so).
    #[test]
    fn a_second_read_of_the_same_stretch_is_not_applied() {
        let mut i = index(4, 10);
        for o in 0..6 {
            add(&mut i, "a", o);
        }
        i.raise_floor("a", 4);
        assert_eq!(i.edges["a"].over, Some(Over { from: 4, count: 2, bytes: 20, stale: false }));
        // Both read 4..6 (the end as indexed) and find 4 and 5 (fewer than the room: whole);
        // 6 and 7 come meanwhile.
        let at = i.edges["a"].reads;
        let found: Vec<Entry> = (4..6).map(|offset| Entry { offset, bytes: 10, at_ms: 0 }).collect();
        add(&mut i, "a", 6);
        add(&mut i, "a", 7);
        assert!(i.refilled("a", at, &found, (6, 2), true));
        assert!(!i.refilled("a", at, &found, (6, 2), true), "a read of what another read applied is dropped");
        let e = &i.edges["a"];
        assert_eq!(e.entries.iter().map(|m| m.offset).collect::<Vec<_>>(), [4, 5]);
        assert_eq!(e.over, Some(Over { from: 6, count: 2, bytes: 20, stale: false }), "6 and 7 still to come");

        // Another bridge delivered through 6: the count is stale; two recounts of 6..8 find 7.
        i.raise_floor("a", 7);
        let at = i.edges["a"].reads;
        let found = [Entry { offset: 7, bytes: 10, at_ms: 0 }];
        add(&mut i, "a", 8);
        assert!(i.recounted("a", at, &found, None, (8, 2)));
        assert!(!i.recounted("a", at, &found, None, (8, 2)));
        let e = &i.edges["a"];
        assert_eq!(e.entries.iter().map(|m| m.offset).collect::<Vec<_>>(), [7]);
        assert_eq!(e.over, Some(Over { from: 8, count: 1, bytes: 0, stale: false }), "8 is still to come");
    }

    #[test]
    fn news_names_edges_once_and_everyone_when_it_was_let_go() {
        let mut i = index(10, 10);
        add(&mut i, "b", 0);
        add(&mut i, "a", 1);
        add(&mut i, "b", 2);
        assert_eq!(i.news(0), ["a", "b"]);
        assert_eq!(i.news(2), ["b"]);
        assert!(i.news(3).is_empty());
        for o in 3..(NEWS as i64 + 10) {
            add(&mut i, "c", o);
        }
        let mut all = i.news(0);
        all.sort();
        assert_eq!(all, ["a", "b", "c"]);
    }
}
