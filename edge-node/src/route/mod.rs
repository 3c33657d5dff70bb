//! Topic classes and their routes: which MQTT topics stay local, go to the cloud, or both.
//!
//! A class is a list of filters with a route, a governance need, a priority (its spool lane), a
//! durability and an optional TTL. The first class whose filter matches a topic wins; topics no
//! class matches are `edge-direct`. A class's route is read through [`Class::route`] on every
//! publish, so the TCO model (`tco::run`) moves it at run time with [`Class::set_route`] without
//! touching the front.

mod config;

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use shared::topic::TopicFilter;

use crate::spool::{Durability, Lane};

pub use config::{ClassConfig, DurabilityConfig, check_classes};
pub use shared::tco::{Governance, Route};

/// One class, ready to match.
#[derive(Debug)]
pub struct Class {
    pub name: String,
    pub filters: Vec<TopicFilter>,
    pub governance: Governance,
    pub lane: Lane,
    pub durability: Durability,
    pub ttl_ms: Option<u64>,
    route: RwLock<Route>,
    /// Publishes and their bytes since start: the TCO model's traffic.
    messages: AtomicU64,
    bytes: AtomicU64,
}

impl Class {
    pub fn new(
        name: String,
        filters: Vec<TopicFilter>,
        route: Route,
        governance: Governance,
        lane: Lane,
        durability: Durability,
        ttl_ms: Option<u64>,
    ) -> Self {
        Self {
            name,
            filters,
            governance,
            lane,
            durability,
            ttl_ms,
            route: RwLock::new(route),
            messages: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    pub(crate) fn route(&self) -> Route {
        self.route.read().map_or(Route::EdgeDirect, |r| *r)
    }

    /// Counts one publish of `bytes` (the whole PUBLISH packet: topic, payload and a few bytes
    /// of header, which the model prices as payload).
    pub(crate) fn count(&self, bytes: usize) {
        self.messages.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Publishes and bytes counted so far.
    pub(crate) fn traffic(&self) -> (u64, u64) {
        (self.messages.load(Ordering::Relaxed), self.bytes.load(Ordering::Relaxed))
    }

    /// Changes the route at run time; refused when governance does not allow it.
    pub(crate) fn set_route(&self, route: Route) -> Result<(), String> {
        if !self.governance.allows(route) {
            return Err(format!(
                "class {}: governance {:?} does not allow route {:?}",
                self.name, self.governance, route
            ));
        }
        if let Ok(mut r) = self.route.write() {
            *r = route;
        }
        Ok(())
    }
}

/// All classes, in config order.
#[derive(Debug, Default)]
pub struct Classes {
    classes: Vec<Class>,
}

impl Classes {
    pub fn new(classes: Vec<Class>) -> Self {
        Self { classes }
    }

    /// The classes of `[[class]]`, each starting on its configured route.
    pub fn from_config(classes: &[ClassConfig]) -> Self {
        Self::new(
            classes
                .iter()
                .map(|c| {
                    Class::new(
                        c.name.clone(),
                        c.filters.clone(),
                        c.route,
                        c.governance,
                        Lane(c.priority),
                        c.durability(),
                        c.ttl.map(|t| t.0.as_millis() as u64),
                    )
                })
                .collect(),
        )
    }

    /// The first class matching `topic`, if any.
    #[cfg(test)]
    pub(crate) fn classify(&self, topic: &str) -> Option<&Class> {
        self.classify_at(topic).map(|(_, c)| c)
    }

    /// [`Classes::classify`] with the class's place in [`Classes::iter`].
    pub(crate) fn classify_at(&self, topic: &str) -> Option<(usize, &Class)> {
        self.classes.iter().enumerate().find(|(_, c)| c.filters.iter().any(|f| f.matches(topic)))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Class> {
        self.classes.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, filters: &[&str], route: Route, governance: Governance) -> Class {
        let filters = filters.iter().map(|f| TopicFilter::new(*f).unwrap()).collect();
        Class::new(name.into(), filters, route, governance, Lane(1), Durability::Normal, None)
    }

    #[test]
    fn first_matching_class_wins() {
        let classes = Classes::new(vec![
            class("audit", &["telemetry/+/alarms"], Route::Both, Governance::AuditCopy),
            class("telemetry", &["telemetry/#"], Route::Central, Governance::None),
        ]);
        assert_eq!(classes.classify("telemetry/cam-1/alarms").unwrap().name, "audit");
        assert_eq!(classes.classify("telemetry/cam-1/metrics").unwrap().name, "telemetry");
        assert!(classes.classify("inference/a/b/c").is_none());
    }

    #[test]
    fn governance_limits_routes() {
        let c = class("x", &["x"], Route::Central, Governance::CentralOnly);
        assert!(c.set_route(Route::Both).is_err());
        assert!(c.set_route(Route::EdgeDirect).is_err());
        let c = class("y", &["y"], Route::Both, Governance::AuditCopy);
        assert!(c.set_route(Route::EdgeDirect).is_err());
        assert!(c.set_route(Route::Central).is_ok());
        assert_eq!(c.route(), Route::Central);
    }
}
