//! The edge broker: our own MQTT 3.1.1 and 5 sessions and router, in process.
//!
//! - `core`: the sans-IO state machine (sessions, connections, router, retained store, the
//!   ingest every message goes through). Everything MQTT says a server does is decided there,
//!   driven by tests without sockets.
//! - `codec`: packets on the wire, through rumqttd's protocol codecs where they serve and our
//!   own PUBLISH codec where they cannot; rumqttd's router, server and links are not used.
//! - `driver`: the tokio side: the core behind one mutex, a wake-up per connection, the spool
//!   appends and the timers.
//! - `store`: what a restart must find again (durable sessions with their queues and messages in
//!   flight, QoS 2 ids, delayed wills, retained messages), written in group commits on a thread
//!   of its own; `core/durable.rs` says what and when.
//! - `message`, `metrics`, `config` (`[broker]`).
//!
//! The front (`front`) owns the sockets and feeds the core; the node's own clients (`client`)
//! talk to it directly. docs/ARCHITECTURE.md has the path of a message through it.

pub mod codec;
mod config;
pub mod core;
pub mod driver;
pub mod fuzzing;
pub mod message;
pub mod metrics;
pub mod store;

pub use config::BrokerConfig;
