//! The retained store: the last retained message per topic, bounded in count and bytes.
//!
//! [MQTT-3.3.1-5]: a retained PUBLISH replaces the topic's message; [MQTT-3.3.1-6],
//! [MQTT-3.3.1-7]: one with an empty payload removes it and is not stored itself. A new topic
//! over either bound is refused (the caller answers and counts it); replacing a topic's message
//! is refused only if its larger size would pass the byte bound. An expired message is dropped
//! when a lookup finds it.
//!
//! Topics are also kept in a tree of their levels, so a SUBSCRIBE's lookup walks only the
//! branches its filter can match and stops at the number of messages its caller can take,
//! instead of testing every retained topic under the core's lock (a SUBSCRIBE of thousands of
//! filters scanned the whole store once per filter).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use crate::broker::message::Message;

/// Why a retained message was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetainRefusal {
    /// `max_retained_messages` topics are held already.
    Count,
    /// Storing it would pass `max_retained_bytes`.
    Bytes,
}

#[derive(Debug)]
pub(crate) struct Retained {
    messages: HashMap<Arc<str>, Arc<Message>>,
    tree: Level,
    bytes: usize,
    /// The node's own topics, and their bytes, outside the bounds (see [`Retained::store`]).
    node: HashSet<Arc<str>>,
    node_bytes: usize,
    max_messages: usize,
    max_bytes: usize,
}

impl Retained {
    pub(crate) fn new(max_messages: usize, max_bytes: usize) -> Self {
        Self {
            messages: HashMap::new(),
            tree: Level::default(),
            bytes: 0,
            node: HashSet::new(),
            node_bytes: 0,
            max_messages,
            max_bytes,
        }
    }

    /// Clients' messages and bytes: what the bounds are about.
    fn clients(&self) -> (usize, usize) {
        (self.messages.len() - self.node.len(), self.bytes - self.node_bytes)
    }

    /// Stores (or, with an empty payload, clears) the topic's retained message. `bounded`:
    /// within the bounds; the node's own (model announcements, `$SYS`) are not, so a client
    /// that filled the store cannot keep them from local apps (they are a few topics, fixed).
    pub(crate) fn store(&mut self, msg: &Arc<Message>, bounded: bool) -> Result<(), RetainRefusal> {
        if msg.payload.is_empty() {
            self.remove(&msg.topic);
            return Ok(());
        }
        if bounded && !self.has_room(msg) {
            let new = !self.messages.contains_key(&msg.topic);
            return Err(if new && self.clients().0 >= self.max_messages {
                RetainRefusal::Count
            } else {
                RetainRefusal::Bytes
            });
        }
        // A topic's level path is in the tree once, whatever replaces its message.
        match self.messages.insert(msg.topic.clone(), msg.clone()) {
            Some(old) => self.forget_weight(&msg.topic, old.weight()),
            None => self.tree.insert(&msg.topic),
        }
        self.bytes += msg.weight();
        if !bounded {
            self.node.insert(msg.topic.clone());
            self.node_bytes += msg.weight();
        }
        Ok(())
    }

    fn remove(&mut self, topic: &str) {
        if let Some(old) = self.messages.remove(topic) {
            self.tree.remove(topic);
            self.forget_weight(topic, old.weight());
        }
    }

    /// Takes the bytes of `topic`'s message as it was out of the counts.
    fn forget_weight(&mut self, topic: &str, weight: usize) {
        self.bytes -= weight;
        if self.node.remove(topic) {
            self.node_bytes -= weight;
        }
    }

    /// Whether a client's `msg` would be stored (a new topic within the count, and the bytes
    /// within theirs; the node's own messages count in neither).
    pub(crate) fn has_room(&self, msg: &Message) -> bool {
        let (count, bytes) = self.clients();
        let old = self.messages.get(&msg.topic).filter(|_| !self.node.contains(&msg.topic)).map_or(0, |m| m.weight());
        (old != 0 || count < self.max_messages) && bytes - old + msg.weight() <= self.max_bytes
    }

    /// At most `limit` of the retained messages `filter` matches, level by level in topic order;
    /// drops the expired ones it finds. Its cost is the branches of the tree the filter
    /// reaches, and it stops once it has `limit`.
    pub(crate) fn matching(&mut self, filter: &str, now: Instant, limit: usize) -> Vec<Arc<Message>> {
        let mut topics = Vec::new();
        if limit > 0 {
            // [MQTT-4.7.2-1]: a filter starting with a wildcard matches no `$` topic.
            let skip_dollar = filter.starts_with(['+', '#']);
            let levels: Vec<&str> = filter.split('/').collect();
            self.tree.collect(&levels, skip_dollar, limit, &mut topics);
        }
        let mut out = Vec::with_capacity(topics.len());
        for topic in topics {
            let Some(msg) = self.messages.get(&*topic) else { continue };
            if msg.expired(now) {
                self.remove(&topic);
            } else {
                out.push(msg.clone());
            }
        }
        out
    }

    pub(crate) fn len(&self) -> usize {
        self.messages.len()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A level of the topic tree: the topic ending here, if one is retained, and the next levels,
/// in order: what a SUBSCRIBE gets, and which of them when it is capped, is the same on every
/// run (a hash map's order differed by process, so the simulation's seeds did not replay).
#[derive(Debug, Default)]
struct Level {
    topic: Option<Arc<str>>,
    next: BTreeMap<Box<str>, Level>,
}

impl Level {
    fn insert(&mut self, topic: &Arc<str>) {
        let mut at = self;
        for level in topic.split('/') {
            at = at.next.entry(level.into()).or_default();
        }
        at.topic = Some(topic.clone());
    }

    /// Removes the topic and the levels only it held.
    fn remove(&mut self, topic: &str) {
        self.remove_levels(&topic.split('/').collect::<Vec<_>>());
    }

    /// Whether this level is empty afterwards.
    fn remove_levels(&mut self, levels: &[&str]) -> bool {
        match levels.split_first() {
            None => self.topic = None,
            Some((first, rest)) => {
                if let Some(child) = self.next.get_mut(*first)
                    && child.remove_levels(rest)
                {
                    self.next.remove(*first);
                }
            }
        }
        self.topic.is_none() && self.next.is_empty()
    }

    /// The topics `filter` (split into levels) matches below this level, until `out` holds
    /// `limit`. `skip_dollar`: at the first level, `$` topics are not the wildcards'.
    fn collect(&self, filter: &[&str], skip_dollar: bool, limit: usize, out: &mut Vec<Arc<str>>) {
        if out.len() >= limit {
            return;
        }
        let Some((first, rest)) = filter.split_first() else {
            if let Some(t) = &self.topic {
                out.push(t.clone());
            }
            return;
        };
        match *first {
            "#" => {
                // [MQTT-4.7.1-2]: `#` matches its parent level too (`a/#` matches `a`).
                if let Some(t) = &self.topic {
                    out.push(t.clone());
                }
                for (name, child) in &self.next {
                    if !(skip_dollar && name.starts_with('$')) {
                        child.collect_all(limit, out);
                    }
                }
            }
            "+" => {
                for (name, child) in &self.next {
                    if !(skip_dollar && name.starts_with('$')) {
                        child.collect(rest, false, limit, out);
                    }
                }
            }
            name => {
                if let Some(child) = self.next.get(name) {
                    child.collect(rest, false, limit, out);
                }
            }
        }
    }

    fn collect_all(&self, limit: usize, out: &mut Vec<Arc<str>>) {
        if out.len() >= limit {
            return;
        }
        if let Some(t) = &self.topic {
            out.push(t.clone());
        }
        for child in self.next.values() {
            child.collect_all(limit, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::broker::codec::QoS;

    fn msg(topic: &str, payload: &str) -> Arc<Message> {
        Arc::new(Message {
            topic: topic.into(),
            payload: bytes::Bytes::copy_from_slice(payload.as_bytes()),
            qos: QoS::AtLeastOnce,
            retain: true,
            props: Default::default(),
            expires_at: None,
            origin: None,
            schema: None,
        })
    }

    fn topics(found: Vec<Arc<Message>>) -> BTreeSet<String> {
        found.iter().map(|m| m.topic.to_string()).collect()
    }

    /// The tree's answer is the one `shared::topic::matches` gives topic by topic: `#` takes
    /// its parent level ([MQTT-4.7.1-2]), `+` one level, empty levels are levels, and a filter
    /// starting with a wildcard takes no `$` topic ([MQTT-4.7.2-1]); removed topics are gone.
    #[test]
    fn the_tree_finds_what_topic_matching_finds() {
        let level = prop::sample::select(vec!["a", "b", "", "$SYS", "x"]);
        let topic = prop::collection::vec(level.clone(), 1..4).prop_map(|l| l.join("/"));
        let filter_level = prop::sample::select(vec!["a", "b", "", "$SYS", "+", "#"]);
        let filter = prop::collection::vec(filter_level, 1..4)
            .prop_map(|l| l.join("/"))
            .prop_filter("a valid filter", |f| shared::topic::validate_filter(f).is_ok());
        let case = (prop::collection::vec(topic, 0..20), prop::collection::vec(0usize..20, 0..5), filter);
        proptest!(ProptestConfig::with_cases(2000), |((stored, removed, filter) in case)| {
            let mut r = Retained::new(1000, 1 << 20);
            for t in &stored {
                r.store(&msg(t, "x"), true).unwrap();
            }
            let mut kept: BTreeSet<String> = stored.iter().cloned().collect();
            for i in removed {
                if let Some(t) = stored.get(i) {
                    r.store(&msg(t, ""), true).unwrap();
                    kept.remove(t);
                }
            }
            let want: BTreeSet<String> = kept.into_iter().filter(|t| shared::topic::matches(&filter, t)).collect();
            prop_assert_eq!(topics(r.matching(&filter, Instant::now(), usize::MAX)), want);
        });
    }

    /// A lookup stops at what its caller can take, and takes nothing when that is 0.
    #[test]
    fn a_lookup_stops_at_its_limit() {
        let mut r = Retained::new(10_000, 64 << 20);
        for i in 0..1000 {
            r.store(&msg(&format!("t/{i}/v"), "x"), true).unwrap();
        }
        assert_eq!(r.matching("t/#", Instant::now(), 10).len(), 10);
        assert_eq!(r.matching("t/+/v", Instant::now(), 7).len(), 7);
        assert_eq!(r.matching("#", Instant::now(), 0).len(), 0);
        assert_eq!(r.matching("#", Instant::now(), usize::MAX).len(), 1000);
        assert_eq!(r.matching("t/5/v", Instant::now(), 1).len(), 1);
    }

    /// The node's own messages (model announcements, `$SYS`) go in whatever clients filled,
    /// and take nothing from the clients' bounds.
    #[test]
    fn the_nodes_own_messages_are_outside_the_bounds() {
        let mut r = Retained::new(2, 1 << 20);
        r.store(&msg("$SYS/broker/uptime", "1 seconds"), false).unwrap();
        r.store(&msg("a", "x"), true).unwrap();
        r.store(&msg("b", "x"), true).unwrap();
        assert_eq!(r.store(&msg("c", "x"), true), Err(RetainRefusal::Count));
        r.store(&msg("models/m/current", "v2"), false).unwrap();
        r.store(&msg("$SYS/broker/uptime", "2 seconds"), false).unwrap();
        assert_eq!(r.len(), 4);
        r.store(&msg("a", ""), true).unwrap();
        r.store(&msg("c", "x"), true).unwrap();
        assert_eq!(r.store(&msg("d", "x"), true), Err(RetainRefusal::Count));
        let weights: usize = ["$SYS/broker/uptime", "models/m/current", "b", "c"]
            .iter()
            .map(|t| r.matching(t, Instant::now(), 1)[0].weight())
            .sum();
        assert_eq!(r.bytes(), weights);
    }

    /// An expired message found by a lookup is dropped with its bytes and its branch.
    #[test]
    fn an_expired_message_is_dropped_when_found() {
        let mut r = Retained::new(10, 1 << 20);
        let now = Instant::now();
        let mut old = (*msg("a/b", "x")).clone();
        old.expires_at = Some(now);
        r.store(&Arc::new(old), true).unwrap();
        r.store(&msg("a/c", "y"), true).unwrap();
        assert_eq!(topics(r.matching("a/+", now + Duration::from_secs(1), 10)), BTreeSet::from(["a/c".to_owned()]));
        assert_eq!(r.len(), 1);
        assert_eq!(r.bytes(), msg("a/c", "y").weight());
        assert!(!r.tree.next["a"].next.contains_key("b"), "its level went with it");
    }
}
