//! Schema validation on PUBLISH: `[[schema]]` binds topic filters to subjects of the cloud's
//! registry; a publish to a bound topic is checked against the versions of its subject staged
//! on this edge that producers may write, before it is acknowledged (the broker core asks
//! [`Validator::check`]).
//!
//! - Which versions: the newest staged, and the earlier ones its delivery names as still
//!   written (`shared::schema::Staging::writers`: under `backward` and `full` the one before,
//!   under their transitive forms every one, at most `MAX_WRITERS`; under `none` and the
//!   forward modes the newest alone). A device still on the version before a backward
//!   compatible change keeps publishing, and its messages name the version they match.
//! - A payload in the Confluent framing (magic byte 0, the schema's 4-byte registry id, for
//!   Protobuf the message indexes) whose id is one of those versions is validated against that
//!   version only, and named by it. Any other payload is tried against the versions newest
//!   first and named by the first that matches: binary Avro does not say which schema wrote it,
//!   so where two versions read the same bytes the newer is named (devices that need the exact
//!   version send the framing).
//! - Versions are ordered by their number, never by arrival: the models subsystem refuses to
//!   stage a schema version below the newest staged (`models::Models::admits`).
//!
//! - Versions arrive as signed model versions `schema.<subject>` (the models subsystem follows
//!   them for every bound subject, verifies the fleet key's signature and stages them
//!   atomically); `reload` reads what is staged, so validation works offline and across
//!   restarts with what was last staged.
//! - Unbound topics pay one filter match per binding and nothing else.
//! - A subject with nothing staged yet is a state of its own (`unstaged`, counted): refused
//!   or passed as the binding says.
//! - A staged file that does not parse (a disk that went bad) leaves the version before it in
//!   use, counted and logged.
//!
//! The validator itself is the `schema` feature (on by default): without it the edge-node
//! binary leaves out the JSON Schema, Avro and Protobuf code, the largest part of its size, for
//! gateways that do not validate on the edge, and its config check refuses `[[schema]]`.

mod config;
#[cfg(feature = "schema")]
mod validate;
#[cfg(not(feature = "schema"))]
mod without;

pub use config::{Mode, SchemaBinding, Unstaged, check_schemas};
#[cfg(feature = "schema")]
pub(crate) use validate::Judged;
#[cfg(feature = "schema")]
pub use validate::Validator;
#[cfg(all(test, feature = "schema"))]
pub(crate) use validate::tests;
#[cfg(not(feature = "schema"))]
pub use without::{Judged, Validator};

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use shared::proto::SchemaRef;

/// What a publish to `topic` gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No binding governs the topic.
    Unbound,
    /// It matches this version, which the message names on its way to the sink.
    Valid(Arc<SchemaRef>),
    /// Taken without a match: a `warn` binding, or nothing staged under `unstaged = "pass"`.
    Passed,
    /// Refused, with the reason for the publisher.
    Refused(String),
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CheckLabels {
    pub subject: String,
    /// `valid`, `invalid` (refused), `warned` (invalid, taken), `unstaged_refused`,
    /// `unstaged_passed`.
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SubjectLabel {
    pub subject: String,
}

shared::metrics! {
    #[derive(Debug, Clone)]
    pub struct SchemaMetrics {
        pub checked: Family<CheckLabels, Counter> => (
            "schema_checked",
            "Publishes to schema-bound topics, by subject and outcome"
        ),
        pub staged_version: Family<SubjectLabel, Gauge> => (
            "schema_staged_version",
            "The version of each bound subject validation uses (0: none staged yet)"
        ),
        pub reload_errors: Counter => (
            "schema_reload_errors",
            "Staged schema files that could not be read or parsed (the version before stays in use)"
        ),
        /// Checks whose validation ran on the publisher's connection before the core's lock
        /// ([`Validator::judge`]); the rest (a topic named by alias only, a downlink message) ran
        /// under it.
        pub ahead: Counter => (
            "schema_validated_ahead",
            "Checks of schema_checked_total whose validation ran on the publisher's connection, not under the broker core's lock"
        ),
        /// Binary payloads the uplink walked by their schema (protocol version 8), by subject and
        /// outcome: `apart` (the walk took it apart) or `whole` (the version is no longer the one
        /// staged, or the walk could not hold the payload).
        pub walked: Family<CheckLabels, Counter> => (
            "schema_walked",
            "Avro and Protobuf payloads the uplink walked by their schema for column-wise batches: taken apart, or sent whole"
        ),
    }
}

impl SchemaMetrics {
    /// The schema checks' metrics, registered in `r`.
    pub(crate) fn new(r: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self::default();
        m.register(r);
        m
    }
}
