//! Types and pure logic shared by `edge-node` and `cloud-bridge`.
//!
//! Nothing here does I/O: config value types, MQTT topic and filter rules, the ehb/1 wire
//! protocol with its session state machines, and the TCO model. Both binaries and the
//! tests build on it.

pub mod check;
#[cfg(feature = "metrics")]
pub mod exposition;
#[cfg(feature = "fs")]
pub mod fs;
#[cfg(feature = "fs")]
pub mod layout;
pub mod log_budget;
#[cfg(feature = "metrics")]
pub mod metric;
pub mod model;
#[cfg(feature = "metrics")]
pub mod process;
pub mod proto;
#[cfg(feature = "schema")]
pub mod schema;
#[cfg(feature = "fs")]
pub mod service;
pub mod tco;
pub mod testing;
#[cfg(feature = "tls")]
pub mod tls;
pub mod topic;
#[cfg(feature = "trace")]
pub mod trace;
pub mod units;
