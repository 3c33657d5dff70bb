//! Backoff for sink writes that fail for the moment.

use std::time::Duration;

use super::error::SinkError;
use super::metrics::SinkMetrics;

/// Backoff for a sink write that failed for the moment: 100 ms doubling to 5 s, with jitter, so
/// the sessions of one bridge do not hit a recovering server in step.
#[derive(Debug)]
pub struct Retry {
    next: Duration,
    attempts: u32,
}

impl Default for Retry {
    fn default() -> Self {
        Self { next: Duration::from_millis(100), attempts: 0 }
    }
}

impl Retry {
    /// Counts the failure, marks the sink unhealthy and waits before the next attempt.
    pub(crate) async fn wait(&mut self, what: &str, error: &SinkError, metrics: &SinkMetrics) {
        use rand::Rng;
        metrics.retries.inc();
        metrics.failed(error);
        if self.attempts == 0 {
            tracing::warn!(what, kind = error.kind(), %error, "sink write failed; retrying");
        } else {
            tracing::debug!(what, kind = error.kind(), %error, attempts = self.attempts, "sink write failed again; retrying");
        }
        self.attempts += 1;
        let wait = self.next.mul_f64(rand::thread_rng().gen_range(0.5..1.0));
        self.next = (self.next * 2).min(Duration::from_secs(5));
        tokio::time::sleep(wait).await;
    }
}
