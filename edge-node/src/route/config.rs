//! `[[class]]`: the topic classes, and their own check.

use serde::{Deserialize, Serialize};
use shared::units::{ByteSize, HumanDuration};

use super::{Governance, Route};
use crate::spool::Durability;
use shared::check::Problems;

/// One topic class.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// Name in metrics, logs and gap records. Required.
    pub name: String,
    /// MQTT topic filters. Required, at least one.
    pub filters: Vec<shared::topic::TopicFilter>,
    /// `edge-direct`, `central` or `both`. Required.
    pub route: Route,
    /// `none`, `audit-copy` or `central-only`; limits the routes allowed. Default: `none`.
    #[serde(default)]
    pub governance: Governance,
    /// Spool lane, 0 (drains first) to 7. Default: 4.
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// `normal` (survives a crash; PUBACK before the group commit) or `full` (survives a power
    /// cut; PUBACK after the commit). Default: `full` for `central-only`, else `normal`.
    pub durability: Option<DurabilityConfig>,
    /// Messages older than this are dropped from the spool as an expiry gap. Default: none.
    pub ttl: Option<HumanDuration>,
    /// Most payload and topic bytes the class may hold in the spool. Over it, a `normal` class
    /// loses its oldest records (as eviction gaps); a `full` class is refused (no PUBACK).
    /// Default: none, only the spool's `budget` applies.
    pub quota: Option<ByteSize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityConfig {
    Normal,
    Full,
}

impl ClassConfig {
    pub(crate) fn durability(&self) -> Durability {
        match (self.durability, self.governance) {
            (Some(DurabilityConfig::Full), _) | (None, Governance::CentralOnly) => Durability::Full,
            _ => Durability::Normal,
        }
    }
}

/// Checks every class; `budget` is the spool's, which a class quota may not exceed.
pub fn check_classes(classes: &[ClassConfig], budget: ByteSize, p: &mut Problems) {
    for (i, c) in classes.iter().enumerate() {
        let key = format!("class[{i}]");
        if c.name.is_empty() || classes[..i].iter().any(|o| o.name == c.name) {
            p.bad(format!("{key}.name"), format!("{:?} must be non-empty and unique", c.name));
        }
        if c.filters.is_empty() {
            p.bad(format!("{key}.filters"), "needs at least one topic filter");
        }
        if c.priority > 7 {
            p.bad(format!("{key}.priority"), format!("{} is outside 0 ..= 7", c.priority));
        }
        if let Some(quota) = c.quota
            && (quota.bytes() == 0 || quota.bytes() > budget.bytes())
        {
            p.bad(format!("{key}.quota"), format!("{quota} must be above 0 and at most the spool budget"));
        }
        if !c.governance.allows(c.route) {
            p.bad(format!("{key}.route"), format!("{:?} is not allowed for governance {:?}", c.route, c.governance));
        }
    }
}

fn default_priority() -> u8 {
    4
}
