//! Subscriptions, as a trie of filter levels: matching a topic walks one path per level plus
//! the `+` branches, never the whole subscription list.
//!
//! - `+` matches one level, a trailing `#` this level and everything below it, the parent
//!   included ([MQTT-4.7.1-2]).
//! - A filter starting with a wildcard does not match a topic starting with `$`
//!   ([MQTT-4.7.2-1]): the walk skips the root's `+` and `#` for such topics.
//! - `$share/<group>/<filter>` subscriptions sit at their filter's node in groups; a matching
//!   message goes to one member of each group (§4.8.2), chosen round robin,
//!   online members first.
//!
//! A node holds no subscription storage until it has a subscriber, and a node left with
//! neither subscribers nor children is removed, so churn does not grow the trie.

use std::collections::HashMap;

use super::SessionKey;
use crate::broker::codec::QoS;

/// A subscription's options (§3.8.3.1) and its identifier (§3.8.2.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubOptions {
    pub qos: QoS,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub retain_handling: u8,
    pub id: Option<u32>,
}

/// A filter as a client wrote it, split into its share group and its topic filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Filter<'a> {
    pub share: Option<&'a str>,
    pub filter: &'a str,
}

impl<'a> Filter<'a> {
    /// Splits `$share/<group>/<filter>`; `None` for a malformed shared subscription: an empty
    /// group, a group holding `+` or `#`, or no filter ([MQTT-4.8.2-1], [MQTT-4.8.2-2]).
    pub(crate) fn parse(full: &'a str) -> Option<Filter<'a>> {
        let Some(rest) = full.strip_prefix("$share/") else {
            return Some(Filter { share: None, filter: full });
        };
        let (group, filter) = rest.split_once('/')?;
        if group.is_empty() || group.contains(['+', '#']) || filter.is_empty() {
            return None;
        }
        Some(Filter { share: Some(group), filter })
    }
}

/// A subscriber a topic reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Match {
    pub session: SessionKey,
    pub opts: SubOptions,
    pub shared: bool,
}

#[derive(Debug, Default)]
struct Node {
    children: HashMap<Box<str>, Node>,
    plus: Option<Box<Node>>,
    subs: Option<Box<NodeSubs>>,
}

#[derive(Debug, Default)]
struct NodeSubs {
    /// Filters ending at this level.
    exact: Subs,
    /// Filters ending with `#` after this level.
    multi: Subs,
}

#[derive(Debug, Default)]
struct Subs {
    plain: Vec<(SessionKey, SubOptions)>,
    shared: Vec<Group>,
}

#[derive(Debug)]
struct Group {
    name: Box<str>,
    members: Vec<(SessionKey, SubOptions)>,
    next: usize,
}

impl Subs {
    fn is_empty(&self) -> bool {
        self.plain.is_empty() && self.shared.is_empty()
    }

    /// Adds or replaces `session`'s entry; whether it was there.
    fn insert(&mut self, share: Option<&str>, session: SessionKey, opts: SubOptions) -> bool {
        let list = match share {
            None => &mut self.plain,
            Some(name) => {
                let at = match self.shared.iter().position(|g| &*g.name == name) {
                    Some(at) => at,
                    None => {
                        self.shared.push(Group { name: name.into(), members: Vec::new(), next: 0 });
                        self.shared.len() - 1
                    }
                };
                &mut self.shared[at].members
            }
        };
        match list.iter_mut().find(|(s, _)| *s == session) {
            Some(entry) => {
                entry.1 = opts;
                true
            }
            None => {
                list.push((session, opts));
                false
            }
        }
    }

    fn remove(&mut self, share: Option<&str>, session: SessionKey) -> bool {
        match share {
            None => remove_from(&mut self.plain, session),
            Some(name) => {
                let Some(at) = self.shared.iter().position(|g| &*g.name == name) else { return false };
                let removed = remove_from(&mut self.shared[at].members, session);
                if self.shared[at].members.is_empty() {
                    self.shared.swap_remove(at);
                }
                removed
            }
        }
    }

    fn collect(&mut self, online: &dyn Fn(SessionKey) -> bool, out: &mut Vec<Match>) {
        out.extend(self.plain.iter().map(|(session, opts)| Match { session: *session, opts: *opts, shared: false }));
        for group in &mut self.shared {
            let n = group.members.len();
            // Round robin from where the last message left off, an online member first.
            let pick =
                (0..n).map(|i| (group.next + i) % n).find(|i| online(group.members[*i].0)).unwrap_or(group.next % n);
            group.next = pick + 1;
            let (session, opts) = group.members[pick];
            out.push(Match { session, opts, shared: true });
        }
    }
}

fn remove_from(list: &mut Vec<(SessionKey, SubOptions)>, session: SessionKey) -> bool {
    match list.iter().position(|(s, _)| *s == session) {
        Some(at) => {
            list.swap_remove(at);
            true
        }
        None => false,
    }
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.plus.is_none() && self.subs.is_none()
    }

    /// The subscriptions a filter ending at this node with `multi` (a trailing `#`) goes to.
    fn subs_mut(&mut self, multi: bool) -> &mut Subs {
        let subs = self.subs.get_or_insert_with(Default::default);
        if multi { &mut subs.multi } else { &mut subs.exact }
    }

    /// Drops the subscription storage once it is empty.
    fn tidy(&mut self) {
        if self.subs.as_ref().is_some_and(|s| s.exact.is_empty() && s.multi.is_empty()) {
            self.subs = None;
        }
    }

    fn insert(&mut self, levels: &[&str], share: Option<&str>, session: SessionKey, opts: SubOptions) -> bool {
        match levels {
            [] => self.subs_mut(false).insert(share, session, opts),
            ["#"] => self.subs_mut(true).insert(share, session, opts),
            ["+", rest @ ..] => self.plus.get_or_insert_with(Default::default).insert(rest, share, session, opts),
            [level, rest @ ..] => self.children.entry((*level).into()).or_default().insert(rest, share, session, opts),
        }
    }

    fn remove(&mut self, levels: &[&str], share: Option<&str>, session: SessionKey) -> bool {
        match levels {
            [] | ["#"] => {
                let multi = levels == ["#"];
                let removed = self.subs.as_mut().is_some_and(|s| {
                    if multi { s.multi.remove(share, session) } else { s.exact.remove(share, session) }
                });
                self.tidy();
                removed
            }
            ["+", rest @ ..] => {
                let Some(plus) = self.plus.as_mut() else { return false };
                let removed = plus.remove(rest, share, session);
                if plus.is_empty() {
                    self.plus = None;
                }
                removed
            }
            [level, rest @ ..] => {
                let Some(child) = self.children.get_mut(*level) else { return false };
                let removed = child.remove(rest, share, session);
                if child.is_empty() {
                    self.children.remove(*level);
                }
                removed
            }
        }
    }

    fn matches(&mut self, levels: &[&str], skip_wild: bool, online: &dyn Fn(SessionKey) -> bool, out: &mut Vec<Match>) {
        if let Some(subs) = self.subs.as_mut()
            && !skip_wild
        {
            subs.multi.collect(online, out);
        }
        let Some((level, rest)) = levels.split_first() else {
            if let Some(subs) = self.subs.as_mut() {
                subs.exact.collect(online, out);
            }
            return;
        };
        if let Some(child) = self.children.get_mut(*level) {
            child.matches(rest, false, online, out);
        }
        if let Some(plus) = self.plus.as_mut()
            && !skip_wild
        {
            plus.matches(rest, false, online, out);
        }
    }
}

/// Every subscription of every session.
#[derive(Debug, Default)]
pub(crate) struct Router {
    root: Node,
    count: usize,
}

impl Router {
    /// Adds or replaces `session`'s subscription to `filter` (valid, see `shared::topic`);
    /// whether it already existed ([MQTT-3.8.4-3]).
    pub(crate) fn subscribe(&mut self, filter: Filter<'_>, session: SessionKey, opts: SubOptions) -> bool {
        let levels: Vec<&str> = filter.filter.split('/').collect();
        let existed = self.root.insert(&levels, filter.share, session, opts);
        if !existed {
            self.count += 1;
        }
        existed
    }

    /// Removes it; whether there was one.
    pub(crate) fn unsubscribe(&mut self, filter: Filter<'_>, session: SessionKey) -> bool {
        let levels: Vec<&str> = filter.filter.split('/').collect();
        let removed = self.root.remove(&levels, filter.share, session);
        if removed {
            self.count -= 1;
        }
        removed
    }

    /// Appends the subscriptions `topic` reaches to `out`: every plain one, and one member per
    /// shared group, preferring members `online` says are connected.
    pub(crate) fn matches(&mut self, topic: &str, online: &dyn Fn(SessionKey) -> bool, out: &mut Vec<Match>) {
        let levels: Vec<&str> = topic.split('/').collect();
        self.root.matches(&levels, topic.starts_with('$'), online, out);
    }

    /// Subscriptions held, over all sessions.
    pub(crate) fn len(&self) -> usize {
        self.count
    }
}
