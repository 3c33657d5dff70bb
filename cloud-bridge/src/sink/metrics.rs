//! What the sinks count, and whether the sink takes writes.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::health;

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct DeadLetterLabel {
    pub reason: &'static str,
}

/// What the sinks count, and whether the sink takes writes ([`health::SinkHealth`], for
/// `/readyz`).
#[derive(Debug)]
pub struct SinkMetrics {
    pub retries: Counter,
    pub dead_letters: Family<DeadLetterLabel, Counter>,
    pub epochs_registered: Counter,
    pub epochs_retired: Counter,
    pub dicts_evicted: Counter,
    /// What `/readyz` reads: the newest write's or probe's outcome.
    pub health: health::SinkHealth,
    /// `health` for Prometheus (alerts).
    pub healthy: Gauge,
}

impl Default for SinkMetrics {
    fn default() -> Self {
        Self {
            retries: Counter::default(),
            dead_letters: Family::default(),
            epochs_registered: Counter::default(),
            epochs_retired: Counter::default(),
            dicts_evicted: Counter::default(),
            health: health::SinkHealth::default(),
            healthy: {
                let g = Gauge::default();
                g.set(1);
                g
            },
        }
    }
}

impl SinkMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register("sink_retries", "Sink writes retried after failing for the moment", self.retries.clone());
        r.register(
            "sink_healthy",
            "1 while the sink's newest write or probe succeeded, 0 while they fail",
            self.healthy.clone(),
        );
        r.register(
            "dead_letters",
            "Records the sink refused for themselves, set aside in its dead-letter subject, by reason",
            self.dead_letters.clone(),
        );
        r.register("epochs_registered", "Epochs edges began that the sink registered", self.epochs_registered.clone());
        r.register(
            "epochs_retired",
            "Epochs retired, marks deleted, past limits.epochs_per_edge of one edge",
            self.epochs_retired.clone(),
        );
        r.register(
            "dicts_evicted",
            "Dictionaries deleted past limits.dicts_per_edge or limits.dict_bytes_per_edge of one edge",
            self.dicts_evicted.clone(),
        );
    }

    pub fn healthy(&self) -> bool {
        self.health.ok()
    }

    /// A write went through.
    pub fn wrote(&self) {
        self.health.wrote(None);
        self.healthy.set(1);
    }

    /// A write failed with `error`.
    pub fn failed(&self, error: &dyn std::fmt::Display) {
        self.health.wrote(Some(error.to_string()));
        self.healthy.set(0);
    }

    /// The probe answered ([`super::probe::run`]).
    pub fn probed(&self, error: Option<String>) {
        self.healthy.set(i64::from(error.is_none()));
        self.health.probed(error);
    }

    /// The probe has not answered in time.
    pub fn probed_late(&self) {
        self.health.probe_waits();
        self.healthy.set(0);
    }
}
