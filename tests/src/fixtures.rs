//! Config fragments the tests share, so a topic class is spelled in one place: the `[spool]`
//! section in the test's own directory and the `[[class]]` blocks the tests route by.

use shared::proto::Seq;
use std::fmt;

/// `[spool]` with the database in the test's directory.
pub const SPOOL: &str = "[spool]\npath = \"spool.db\"\n";

/// One `[[class]]` block; only the keys set are written, the rest take the node's defaults.
#[derive(Debug, Clone)]
pub struct Class {
    name: &'static str,
    filter: &'static str,
    route: &'static str,
    governance: Option<&'static str>,
    priority: Option<u8>,
    durability: Option<&'static str>,
}

/// A class of one filter with `route` and nothing else set.
pub fn class(name: &'static str, filter: &'static str, route: &'static str) -> Class {
    Class { name, filter, route, governance: None, priority: None, durability: None }
}

impl Class {
    pub fn governance(self, governance: &'static str) -> Self {
        Self { governance: Some(governance), ..self }
    }

    pub fn priority(self, priority: u8) -> Self {
        Self { priority: Some(priority), ..self }
    }

    pub fn durability(self, durability: &'static str) -> Self {
        Self { durability: Some(durability), ..self }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "[[class]]\nname = \"{}\"\nfilters = [\"{}\"]\nroute = \"{}\"",
            self.name, self.filter, self.route
        )?;
        if let Some(g) = self.governance {
            writeln!(f, "governance = \"{g}\"")?;
        }
        if let Some(p) = self.priority {
            writeln!(f, "priority = {p}")?;
        }
        if let Some(d) = self.durability {
            writeln!(f, "durability = \"{d}\"")?;
        }
        Ok(())
    }
}

/// `telemetry/#` to the cloud only.
pub fn telemetry() -> Class {
    class("telemetry", "telemetry/#", "central")
}

/// `inference/#` to local subscribers and the cloud, lane 1.
pub fn inference() -> Class {
    class("inference", "inference/#", "both").priority(1)
}

/// `audit/#`, central-only (so `full` durability), lane 0.
pub fn audit() -> Class {
    class("audit", "audit/#", "central").governance("central-only").priority(0)
}

/// `feedback/#`, an audit copy of local traffic, lane 1.
pub fn feedback() -> Class {
    class("feedback", "feedback/#", "both").governance("audit-copy").priority(1)
}

/// The class blocks, one after another.
pub fn classes(list: &[Class]) -> String {
    list.iter().map(|c| format!("\n{c}")).collect()
}

/// [`SPOOL`] and the class blocks.
pub fn with_spool(list: &[Class]) -> String {
    format!("{SPOOL}{}", classes(list))
}

/// A `telemetry` QoS 1 record at `seq` as an edge sends it up, with no MQTT properties.
pub fn wire_record(seq: u64, topic: &str, payload: impl Into<Vec<u8>>) -> shared::proto::WireRecord {
    shared::proto::WireRecord::message(
        Seq(seq),
        shared::proto::WireMessage {
            class: "telemetry".into(),
            topic: topic.into(),
            payload: payload.into(),
            qos: 1,
            enqueued_ms: 1_700_000_000_000 + seq,
            expires_ms: None,
            user_properties: vec![],
            correlation_data: None,
            content_type: None,
            schema: None,
        },
    )
}
