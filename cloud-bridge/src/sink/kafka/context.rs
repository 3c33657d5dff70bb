//! What librdkafka tells the bridge besides results: its log lines, into `tracing`, and its
//! errors, the last of which a failed connect quotes (a result says "all brokers down"; the
//! error before it says why: a refused password, a certificate the broker did not take).

use std::sync::Mutex;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::ProducerContext;

/// Distinct errors kept: the reason ("SASL authentication error: ...") comes before its
/// consequence ("1/1 brokers are down"), and both are worth quoting.
const KEPT: usize = 3;

#[derive(Debug, Default)]
pub(crate) struct Context {
    errors: Mutex<Vec<String>>,
}

impl Context {
    /// The newest distinct errors librdkafka reported, oldest first, if any.
    pub(crate) fn last_error(&self) -> Option<String> {
        let errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        (!errors.is_empty()).then(|| errors.join("; "))
    }
}

impl Context {
    fn remember(&self, text: &str) {
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        errors.retain(|e| e != text);
        errors.push(text.to_owned());
        if errors.len() > KEPT {
            errors.remove(0);
        }
    }
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        use RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                // A broker connection that failed (facility FAIL: a refused password, a TLS
                // handshake, a broker down) is logged here, not always reported through
                // `error`. A warning: the client retries, and what it means for a write is
                // the write's error.
                tracing::warn!(facility, "librdkafka: {message}");
                self.remember(message);
            }
            L::Warning => tracing::warn!(facility, "librdkafka: {message}"),
            L::Notice | L::Info => tracing::info!(facility, "librdkafka: {message}"),
            L::Debug => tracing::debug!(facility, "librdkafka: {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // The same failure was logged above; kept for a failed connect to quote.
        tracing::debug!(%error, "librdkafka: {reason}");
        let text = if reason.is_empty() { error.to_string() } else { reason.to_owned() };
        self.remember(&text);
    }
}

impl ConsumerContext for Context {}

impl ProducerContext for Context {
    type DeliveryOpaque = ();

    // A transaction's commit reports what failed of its records; nothing to do per record.
    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}
