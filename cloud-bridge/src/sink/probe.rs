//! The readiness probe: asks the sink every [`PROBE_EVERY`] whether it would take a write
//! ([`RecordSink::probe`]), so `/readyz` follows the sink with nothing writing
//! ([`super::health`]).

use tokio_util::sync::CancellationToken;

use super::RecordSink;
use super::health::{PROBE_EVERY, PROBE_WAIT};
use super::metrics::SinkMetrics;

/// Probes `sink` every [`PROBE_EVERY`] until `stop`, one probe at a time.
pub(crate) async fn run<S: RecordSink>(
    sink: std::sync::Arc<S>,
    metrics: std::sync::Arc<SinkMetrics>,
    stop: CancellationToken,
) {
    loop {
        let probe = sink.probe();
        tokio::pin!(probe);
        let answer = tokio::select! {
            _ = stop.cancelled() => return,
            answer = tokio::time::timeout(PROBE_WAIT, &mut probe) => match answer {
                Ok(answer) => answer,
                Err(_) => {
                    metrics.probed_late();
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        answer = probe => answer,
                    }
                }
            },
        };
        metrics.probed(answer.err().map(|e| e.to_string()));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
}
