//! What the sinks count, and whether the sink takes writes.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use super::health;

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct DeadLetterLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

shared::metrics! {
    /// What the sinks count, and whether the sink takes writes ([`health::SinkHealth`], for
    /// `/readyz`).
    #[derive(Debug)]
    pub struct SinkMetrics {
        pub retries: Counter => ("sink_retries", "Sink writes retried after failing for the moment"),
        pub dead_letters: Family<DeadLetterLabel, Counter> => (
            "dead_letters",
            "Records the sink refused for themselves, set aside in its dead-letter subject, by reason"
        ),
        pub downlink_unread: Family<DeadLetterLabel, Counter> => (
            "downlink_unread",
            "Downlink messages a Kafka sink does not deliver: keyed to no edge or in another partition than their edge's (misplaced), or past sink.downlink.max_edges (unindexed)"
        ),
        pub downlink_reads: Family<OutcomeLabel, Counter> => (
            "downlink_reads",
            "Sessions' downlink reads on a JetStream sink, by where their messages came from (kept: what the news read got; stream: read again)"
        ),
        pub epochs_registered: Counter => ("epochs_registered", "Epochs edges began that the sink registered"),
        pub epochs_retired: Counter => (
            "epochs_retired",
            "Epochs retired, marks deleted, past limits.epochs_per_edge of one edge"
        ),
        pub dicts_evicted: Counter => (
            "dicts_evicted",
            "Dictionaries deleted past limits.dicts_per_edge or limits.dict_bytes_per_edge of one edge"
        ),
        pub kafka_claims: Family<OutcomeLabel, Counter> => (
            "kafka_claims",
            "Edges a Kafka sink claimed for this bridge (won: claim verified; lost: another bridge's claim came last)"
        ),
        pub kafka_fences: Counter => (
            "kafka_fences",
            "Transactional producers of earlier claims of an edge a Kafka sink fenced"
        ),
        pub kafka_transactions: Family<OutcomeLabel, Counter> => (
            "kafka_transactions",
            "Transactions a Kafka sink's producers ended (committed, failed: aborted or producer closed)"
        ),
        pub kafka_transaction_jobs: Counter => (
            "kafka_transaction_jobs",
            "Jobs (batches, state writes, claims) in the Kafka sink's committed transactions: over kafka_transactions, the group commit's size"
        ),
        pub kafka_transaction_seconds: Histogram => (
            "kafka_transaction",
            "A Kafka sink's transaction, begin to commit's answer (a group of jobs on one producer)",
            unit Seconds,
            init Histogram::new(exponential_buckets(0.000_5, 2.0, 14))
        ),
        pub kafka_queue_seconds: Histogram => (
            "kafka_queue",
            "How long a job waited for its Kafka producer (behind the transaction it had open)",
            unit Seconds,
            init Histogram::new(exponential_buckets(0.000_5, 2.0, 14))
        ),
        pub kafka_batches_waiting: Gauge => (
            "kafka_batches_waiting",
            "Batches a Kafka sink's producers hold until the batch before them in their lane is in (at most 8 a session; each let go after sink.transaction_timeout)"
        ),
        pub kafka_producers_open: Gauge => (
            "kafka_producers_open",
            "Transactional producers a Kafka sink has open (at most sink.producers)"
        ),
        /// What `/readyz` reads: the newest write's or probe's outcome.
        pub health: health::SinkHealth => (not exported),
        /// `health` for Prometheus (alerts).
        pub healthy: Gauge => (
            "sink_healthy",
            "1 while the sink's newest write or probe succeeded, 0 while they fail",
            init {
                let g = Gauge::default();
                g.set(1);
                g
            }
        ),
    }
}

impl SinkMetrics {
    pub fn healthy(&self) -> bool {
        self.health.ok()
    }

    /// A write went through.
    pub(crate) fn wrote(&self) {
        self.health.wrote(None);
        self.healthy.set(1);
    }

    /// A write failed with `error`.
    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        self.health.wrote(Some(error.to_string()));
        self.healthy.set(0);
    }

    /// The probe answered ([`super::probe::run`]).
    pub(crate) fn probed(&self, error: Option<String>) {
        self.healthy.set(i64::from(error.is_none()));
        self.health.probed(error);
    }

    /// The probe has not answered in time.
    pub(crate) fn probed_late(&self) {
        self.health.probe_waits();
        self.healthy.set(0);
    }
}
