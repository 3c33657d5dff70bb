//! The SLO probe: an in-process MQTT client that publishes timestamped QoS1 messages on a
//! reserved topic through the broker core, as every client's messages go, and records how long
//! each takes to come back. Its histogram is the core's publish-to-deliver latency, without the
//! sockets and codecs a network client adds. The first message of each probe session is a
//! warm-up and is not recorded.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use shared::units::HumanDuration;
use tokio_util::sync::CancellationToken;

use crate::client::{ClientError, Connector, Event};
use shared::check::Problems;

/// `[probe]`: the built-in SLO probe.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeConfig {
    /// Run the probe. Default: true.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Time between probe messages. Default: 100ms (10 msg/s).
    #[serde(default = "default_probe_interval")]
    pub interval: HumanDuration,
    /// Topic the probe publishes on and subscribes to (QoS1). Only the node's own clients
    /// publish and receive on it: other clients' subscriptions never see it, and their
    /// publishes to it are refused. Default: `_edge/probe`.
    #[serde(default = "default_probe_topic")]
    pub topic: String,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self { enabled: true, interval: default_probe_interval(), topic: default_probe_topic() }
    }
}

impl ProbeConfig {
    pub fn check(&self, p: &mut Problems) {
        if !self.enabled {
            return;
        }
        if self.interval.0.is_zero() {
            p.bad("probe.interval", "must be more than 0s");
        }
        if let Err(e) = shared::topic::validate_name(&self.topic) {
            p.bad("probe.topic", e.to_string());
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_probe_interval() -> HumanDuration {
    HumanDuration::from_millis(100)
}
fn default_probe_topic() -> String {
    "_edge/probe".to_owned()
}

/// A probe message not back within this time is counted lost.
const LOST_AFTER: Duration = Duration::from_secs(5);

shared::metrics! {
    /// The probe's metrics, and what `/healthz` decides on.
    #[derive(Debug, Clone)]
    pub(crate) struct ProbeMetrics {
        latency: Histogram => (
            "probe_latency",
            "SLO probe publish-to-deliver latency through the front and the broker",
            unit Seconds,
            // 50 µs .. ~1.6 s
            init Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
        ),
        sent: Counter => ("probe_sent", "SLO probe messages published"),
        received: Counter => ("probe_received", "SLO probe messages delivered back"),
        lost: Counter => ("probe_lost", "SLO probe messages not delivered within 5 s"),
        /// Milliseconds after `started` of the last probe delivery; 0 before the first.
        last_ok_ms: Arc<AtomicU64> => (not exported),
        started: Instant => (not exported, init Instant::now()),
    }
}

impl ProbeMetrics {
    /// The probe's metrics, registered in `r`.
    pub(crate) fn new(r: &mut Registry) -> Self {
        let m = Self::default();
        m.register(r);
        m
    }

    pub(crate) fn delivered(&self, latency: Duration) {
        self.latency.observe(latency.as_secs_f64());
        self.received.inc();
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX).max(1);
        self.last_ok_ms.store(ms, Ordering::Relaxed);
    }

    /// Time since the probe last saw a delivery, `None` if it never has.
    pub(crate) fn since_delivery(&self) -> Option<Duration> {
        match self.last_ok_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(self.started.elapsed().saturating_sub(Duration::from_millis(ms))),
        }
    }
}

/// What `/healthz` decides on.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    pub metrics: ProbeMetrics,
    /// None when the probe is disabled: health then only says the process serves HTTP.
    pub interval: Option<Duration>,
}

impl Health {
    /// What the probe saw, or `Err(reason)` when the node should be taken out of service.
    pub fn check(&self) -> Result<String, String> {
        let Some(interval) = self.interval else {
            return Ok("probe off ([probe] enabled = false)".into());
        };
        // Allow a start-up grace and a few missed probes before calling the broker unhealthy.
        let limit = interval * 10 + Duration::from_secs(2);
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
        match self.metrics.since_delivery() {
            Some(age) if age > limit => Err(format!("no probe message delivered for {}", ms(age))),
            Some(age) => Ok(format!("last probe message delivered {} ago", ms(age))),
            None if self.metrics.started.elapsed() > limit => Err("no probe message delivered yet".into()),
            None => Ok("starting: no probe message delivered yet".into()),
        }
    }
}

/// Runs the probe until `shutdown`, reconnecting after a failure.
pub(crate) async fn run(
    connector: Connector,
    config: ProbeConfig,
    node_id: String,
    metrics: ProbeMetrics,
    shutdown: CancellationToken,
) {
    crate::client::keep_running("SLO probe session", &shutdown, || session(&connector, &config, &node_id, &metrics))
        .await;
}

async fn session(
    connector: &Connector,
    config: &ProbeConfig,
    node_id: &str,
    metrics: &ProbeMetrics,
) -> Result<(), ClientError> {
    let mut client =
        connector.connect(&format!("{}probe-{node_id}", crate::broker::core::INTERNAL_CLIENT_ID_PREFIX)).await?;
    client.subscribe(&config.topic).await?;
    let mut ticker = tokio::time::interval(config.interval.0);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut seq: u64 = 0;
    let mut outstanding: VecDeque<(u64, Instant)> = VecDeque::new();
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                seq += 1;
                outstanding.push_back((seq, Instant::now()));
                client.publish(&config.topic, &seq.to_be_bytes(), false).await?;
                metrics.sent.inc();
                while outstanding.front().is_some_and(|(_, at)| at.elapsed() > LOST_AFTER) {
                    outstanding.pop_front();
                    metrics.lost.inc();
                }
            }
            event = client.next() => {
                let Event::Message(message) = event? else { continue };
                // The payload is the sequence number.
                let Ok(bytes) = <[u8; 8]>::try_from(&message.payload[..]) else { continue };
                let got = u64::from_be_bytes(bytes);
                if let Some(i) = outstanding.iter().position(|(s, _)| *s == got) {
                    let (_, sent) = outstanding.remove(i).unwrap_or((got, message.received));
                    if got > 1 {
                        metrics.delivered(message.received - sent);
                    }
                }
            }
        }
    }
}
