//! `$SYS/broker/...`: the broker's statistics where MQTT tools look for them, as Mosquitto
//! publishes them: retained, every `broker.sys_interval`, by an in-process client of the node.
//! Clients read them as their ACL allows and never publish there (`$SYS/#` is in the node's
//! reserved namespace). What the figures are is the caller's ([`Stats`]); this module only
//! publishes them.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::client::{ClientError, Connector};

/// The figures, read at each interval.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stats {
    /// Clients connected now (the node's own not counted).
    pub clients_connected: u64,
    /// Client sessions held, connected or not.
    pub clients_total: u64,
    pub subscriptions: u64,
    pub retained: u64,
    /// PUBLISH packets taken from clients and delivered to them, since the start.
    pub messages_received: u64,
    pub messages_sent: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
}

impl Stats {
    /// The topics and payloads, Mosquitto's names.
    fn topics(&self, uptime: Duration) -> Vec<(&'static str, String)> {
        vec![
            ("$SYS/broker/version", format!("edge-node {}", env!("CARGO_PKG_VERSION"))),
            ("$SYS/broker/uptime", format!("{} seconds", uptime.as_secs())),
            ("$SYS/broker/clients/connected", self.clients_connected.to_string()),
            ("$SYS/broker/clients/total", self.clients_total.to_string()),
            ("$SYS/broker/subscriptions/count", self.subscriptions.to_string()),
            ("$SYS/broker/retained messages/count", self.retained.to_string()),
            ("$SYS/broker/messages/received", self.messages_received.to_string()),
            ("$SYS/broker/messages/sent", self.messages_sent.to_string()),
            ("$SYS/broker/bytes/received", self.bytes_received.to_string()),
            ("$SYS/broker/bytes/sent", self.bytes_sent.to_string()),
        ]
    }
}

/// Publishes the statistics every `interval` until `shutdown`, reconnecting after an error.
pub(crate) async fn run(
    connector: Connector,
    interval: Duration,
    client_id: String,
    stats: impl Fn() -> Stats + Send + 'static,
    shutdown: CancellationToken,
) {
    let started = Instant::now();
    crate::client::keep_running("$SYS publisher", &shutdown, || {
        session(&connector, interval, &client_id, &stats, started)
    })
    .await;
}

async fn session(
    connector: &Connector,
    interval: Duration,
    client_id: &str,
    stats: &impl Fn() -> Stats,
    started: Instant,
) -> Result<(), ClientError> {
    let mut client = connector.connect(client_id).await?;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticker.tick().await;
        for (topic, payload) in stats().topics(started.elapsed()) {
            client.publish_acked(topic, payload.as_bytes(), true).await?;
        }
    }
}
