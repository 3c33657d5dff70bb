//! `[[schema]]`: which local topics a registered schema governs, and how.

use serde::{Deserialize, Serialize};
use shared::check::Problems;

/// What a binding does with a payload that does not match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Refused: PUBACK/PUBREC 0x99 with a Reason String for MQTT 5; for MQTT 3.1.1, which has
    /// no way to hear a refusal, dropped and counted (the connection stays up).
    #[default]
    Enforce,
    /// Taken as if it matched, counted and logged.
    Warn,
    /// Not checked (the binding is kept in the config, switched off).
    Off,
}

/// What a binding does while its subject has no version staged on this edge yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unstaged {
    /// Refused as an invalid payload would be (enforce) or counted (warn).
    #[default]
    Refuse,
    /// Taken unchecked, counted.
    Pass,
}

/// One `[[schema]]` entry: publishes to topics `topic` matches must match the newest staged
/// version of `subject`. The first entry whose filter matches governs a topic.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaBinding {
    /// An MQTT topic filter.
    pub topic: String,
    /// A subject of the cloud's registry (`cloud-bridge schema register --subject`).
    pub subject: String,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default)]
    pub unstaged: Unstaged,
}

/// Each binding's problems, at its config path; `models` says whether `[models]` is set
/// (schemas reach the edge as signed model versions), `built` whether this build has the
/// validator (`cfg!(feature = "schema")`).
pub fn check_schemas(bindings: &[SchemaBinding], models: bool, built: bool, p: &mut Problems) {
    if !bindings.is_empty() && !built {
        p.bad("schema", "this edge-node was built without schema validation (the `schema` feature): remove [[schema]] or run a build with it");
    }
    if !bindings.is_empty() && !models {
        p.bad("schema", "schemas reach the edge as versions signed by the fleet key: [models] (public_key) is needed");
    }
    for (i, b) in bindings.iter().enumerate() {
        if let Err(e) = shared::topic::validate_filter(&b.topic) {
            p.bad(format!("schema[{i}].topic"), e.to_string());
        }
        if let Err(e) = shared::model::valid_subject(&b.subject) {
            p.bad(format!("schema[{i}].subject"), e);
        }
    }
}
