//! Whether the sink can take writes now, as `/readyz` reads it: the newest of two kinds of
//! evidence, a write's outcome and a probe's. Writes alone made readiness a latch: it stayed
//! false after the sink recovered until some edge's record went through, and true with the
//! sink down while nothing wrote. The probe (`sink::probe`) asks the sink every [`PROBE_EVERY`]
//! whether it would take a write ([`super::RecordSink::probe`]: a write lock on SQLite, the
//! streams' leaders on JetStream).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the probe asks the sink.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(2);

/// How long a probe may take before the sink counts as not answering (the probe goes on, and
/// its answer counts when it comes).
pub(crate) const PROBE_WAIT: Duration = Duration::from_secs(2);

/// With no probe answered for this long (the probe itself stuck), the sink is not ready.
const STALE: Duration = Duration::from_secs(15);

/// The newest evidence.
#[derive(Debug)]
pub(crate) struct SinkHealth {
    seen: Mutex<Seen>,
}

#[derive(Debug, Clone)]
struct Seen {
    ok: bool,
    detail: String,
    /// The last probe's answer (or the sink's open, before the first).
    probed: Instant,
}

impl Default for SinkHealth {
    fn default() -> Self {
        let seen = Seen { ok: true, detail: "opened".into(), probed: Instant::now() };
        Self { seen: Mutex::new(seen) }
    }
}

impl SinkHealth {
    fn set(&self, f: impl FnOnce(&mut Seen)) {
        f(&mut self.seen.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// A write went through, or failed with `error`.
    pub(crate) fn wrote(&self, error: Option<String>) {
        self.set(|s| {
            s.ok = error.is_none();
            s.detail = match error {
                None => "the last write succeeded".into(),
                Some(e) => format!("the last write failed: {e} (see bridge_sink_retries_total)"),
            }
        });
    }

    /// A probe answered: the sink would take a write, or not for `error`.
    pub(crate) fn probed(&self, error: Option<String>) {
        self.set(|s| {
            s.ok = error.is_none();
            s.probed = Instant::now();
            s.detail = match error {
                None => "the probe answered".into(),
                Some(e) => format!("the probe failed: {e}"),
            }
        });
    }

    /// A probe has not answered within [`PROBE_WAIT`].
    pub(crate) fn probe_waits(&self) {
        self.set(|s| {
            s.ok = false;
            s.detail = format!("the probe has not answered in {PROBE_WAIT:?}");
        });
    }

    /// Whether the sink is ready, and why.
    pub(crate) fn check(&self) -> (bool, String) {
        let s = self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let quiet = s.probed.elapsed();
        if quiet > STALE {
            return (false, format!("no probe answered for {}s", quiet.as_secs()));
        }
        (s.ok, s.detail)
    }

    /// For the `sink_healthy` gauge.
    pub(crate) fn ok(&self) -> bool {
        self.check().0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_evidence_counts_whichever_kind() {
        let h = SinkHealth::default();
        assert!(h.ok());
        h.wrote(Some("timed out".into()));
        let (ok, detail) = h.check();
        assert!(!ok && detail.contains("timed out"), "{detail}");
        h.probed(None);
        assert!(h.ok(), "a probe that answers after a failed write makes it ready: no latch");
        h.probed(Some("no leader".into()));
        assert!(!h.ok());
        h.wrote(None);
        assert!(h.ok());
        h.probe_waits();
        let (ok, detail) = h.check();
        assert!(!ok && detail.contains("not answered"), "{detail}");
    }
}
