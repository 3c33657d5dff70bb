//! ACL changes reach every session at once (issue 29): a reload gives each session the rules of
//! whoever holds it (the connected client's identity, or the identity that made an offline
//! session), drops the subscriptions those rules no longer allow, and discards what was queued
//! for it on topics it may no longer read: the queue, the retained backlog and the messages in
//! flight that were not yet released, so a resume after the reload delivers none of them. A
//! session resumed under other rules than it was queued under gets the same treatment.

use std::sync::Arc;
use std::time::Instant;

use super::{Broker, SessionKey};
use crate::auth::Rules;

impl Broker {
    /// New rules for every client's session, from `rules_of(owner, client_id)`, where `owner`
    /// is [`super::Identity::owner`] of the connected client, or of the session's maker when
    /// none is connected.
    pub(crate) fn reload_rules(&mut self, rules_of: &dyn Fn(&str, &str) -> Arc<Rules>, now: Instant) {
        let keys: Vec<SessionKey> =
            (0..self.sessions.len() as SessionKey).filter(|k| self.session(*k).is_some_and(|s| !s.internal)).collect();
        for key in keys {
            let Some(s) = self.session(key) else { continue };
            let conn = s.conn.filter(|c| self.conns.contains_key(c));
            let owner = conn.and_then(|c| self.conns.get(&c)).map_or_else(|| s.owner.clone(), |c| c.owner.clone());
            let rules = rules_of(&owner, &s.client_id);
            if let Some(c) = conn.and_then(|c| self.conns.get_mut(&c)) {
                c.rules = Some(rules.clone());
            }
            self.prune_subscriptions(key, &rules, now);
            self.drop_unreadable(key, &rules);
        }
    }

    /// Discards the session's messages on topics `rules` no longer lets it read (a topic is
    /// readable where some allowed filter matches it): queued, in the retained backlog, or in
    /// flight and not yet released (a QoS 2 message past its PUBREC is the client's already).
    pub(super) fn drop_unreadable(&mut self, key: SessionKey, rules: &Rules) {
        let Some(s) = self.session_mut(key) else { return };
        let readable = |topic: &str| rules.may_subscribe(topic);
        if s.queue.iter().chain(&s.retained_backlog).all(|d| readable(&d.msg.topic))
            && s.inflight.iter().all(|i| i.released || readable(&i.delivery.msg.topic))
        {
            return;
        }
        let mut gone = Vec::new();
        let mut held = 0;
        for d in std::mem::take(&mut s.queue) {
            if readable(&d.msg.topic) {
                s.queue.push_back(d);
            } else {
                held += d.weight();
                gone.push(d);
            }
        }
        for d in std::mem::take(&mut s.retained_backlog) {
            if readable(&d.msg.topic) {
                s.retained_backlog.push_back(d);
            } else {
                gone.push(d);
            }
        }
        for i in std::mem::take(&mut s.inflight) {
            if i.released || readable(&i.delivery.msg.topic) {
                s.inflight.push_back(i);
            } else {
                if i.held {
                    held += i.delivery.weight();
                }
                gone.push(i.delivery);
            }
        }
        self.release(key, held);
        for d in &gone {
            self.store_done(key, d);
        }
        tracing::info!(
            messages = gone.len(),
            "queued messages discarded: the ACL no longer lets their session read them"
        );
        self.metrics.dropped("acl_revoked", gone.len() as u64);
    }
}
