//! All cross-process tests in one test binary: each integration-test file would otherwise link
//! its own copy of the whole dependency tree (about 280 MB each with debug info), which is
//! most of the disk a CI build needs. nextest still runs every test in its own process.

mod bridge;
mod bridge_budget;
mod bridge_chaos;
mod bridge_cluster;
mod bridge_crash;
mod bridge_dead_letter;
mod bridge_failover;
mod bridge_impaired;
mod bridge_jetstream;
mod bridge_quota;
mod bridge_security;
mod bridge_versions;
mod broker_backpressure;
mod broker_durable;
mod broker_hostile;
mod broker_interop;
mod broker_robustness;
mod broker_security;
mod broker_sessions;
mod broker_trust;
mod downlink;
mod downlink_chaos;
mod downlink_edge;
mod downlink_jetstream;
mod edge_cli;
mod fleet;
mod fleet_view;
mod kafka_broker;
mod kafka_cluster;
mod kafka_downlink;
mod kafka_security;
mod kafka_sink;
mod model_sync;
mod models;
mod ops_console;
mod ops_health;
mod ops_metrics;
mod ops_tracing;
mod schemas;
mod sim;
mod spool_damage;
mod spool_faults;
mod spool_routes;
mod tco;
