//! Types and pure logic shared by `edge-node` and `cloud-bridge`.
//!
//! Nothing here does I/O: config value types, MQTT topic and filter rules, and (in later
//! modules) the wire protocol and the TCO model. Both binaries and the tests build on it.

pub mod topic;
pub mod units;
