//! What the cloud's sink can store of one record, as the last bridge said in its Welcome
//! (protocol version 3): the uplink sets it, the broker checks a cloud-bound PUBLISH against it
//! and refuses what the sink could not store whole, instead of acknowledging a message whose
//! payload would be dead-lettered away. Kept in `<spool>.sink` beside the spool, so a node that
//! restarts while the cloud is away still knows; with no bridge ever heard (or one of an older
//! version, or a sink with no limits of its own) nothing is refused for it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use shared::proto::{SinkLimits, record_size};

/// The limits, shared between the uplink (which learns them) and the broker (which checks).
#[derive(Debug)]
pub struct SinkFit {
    record_bytes: AtomicU64,
    header_bytes: AtomicU64,
    path: PathBuf,
}

/// Why a record would not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misfit {
    /// Payload and headers together pass the sink's limit.
    Record { size: u64, limit: u64 },
    /// Its headers (topic, user properties, ...) pass the sink's limit on headers.
    Headers { size: u64, limit: u64 },
}

impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Misfit::Record { size, limit } => write!(f, "{size} bytes with its headers, the sink stores {limit}"),
            Misfit::Headers { size, limit } => write!(f, "{size} bytes of headers, the sink stores {limit}"),
        }
    }
}

impl SinkFit {
    /// The limits the spool at `spool` last kept; none if it has none or they cannot be read.
    pub fn load(spool: &Path) -> Self {
        let mut path = spool.as_os_str().to_owned();
        path.push(".sink");
        let path = PathBuf::from(path);
        let kept: SinkLimits =
            std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        Self { record_bytes: AtomicU64::new(kept.record_bytes), header_bytes: AtomicU64::new(kept.header_bytes), path }
    }

    /// A bridge's Welcome said `limits` (`None`: it gave none). Kept on disk when they changed.
    pub(crate) fn update(&self, limits: Option<SinkLimits>) {
        let limits = limits.unwrap_or_default();
        let was = self.current();
        if was == limits {
            return;
        }
        self.record_bytes.store(limits.record_bytes, Ordering::Relaxed);
        self.header_bytes.store(limits.header_bytes, Ordering::Relaxed);
        tracing::info!(
            record_bytes = limits.record_bytes,
            header_bytes = limits.header_bytes,
            "the cloud's sink limits changed"
        );
        let bytes = serde_json::to_vec(&limits).unwrap_or_default();
        if let Err(e) = shared::fs::write_durably(&self.path, |f| std::io::Write::write_all(f, &bytes)) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot keep the sink's limits; they hold until the node stops");
        }
    }

    pub(crate) fn current(&self) -> SinkLimits {
        SinkLimits {
            record_bytes: self.record_bytes.load(Ordering::Relaxed),
            header_bytes: self.header_bytes.load(Ordering::Relaxed),
        }
    }

    /// Whether a message of `topic`, `payload` bytes, user properties, correlation data of
    /// `correlation` bytes and content type fits the sink.
    pub fn check(
        &self,
        topic: &str,
        payload: usize,
        user: &[(String, String)],
        correlation: Option<usize>,
        content_type: Option<&str>,
    ) -> Result<(), Misfit> {
        let limits = self.current();
        if limits.record_bytes == 0 && limits.header_bytes == 0 {
            return Ok(());
        }
        let (headers, size) = record_size(topic, payload, user, correlation, content_type);
        if limits.header_bytes > 0 && headers > limits.header_bytes {
            return Err(Misfit::Headers { size: headers, limit: limits.header_bytes });
        }
        if limits.record_bytes > 0 && size > limits.record_bytes {
            return Err(Misfit::Record { size, limit: limits.record_bytes });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_kept_across_a_restart_and_none_refuses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool.db");
        let fit = SinkFit::load(&spool);
        let big = [("k".to_owned(), "v".repeat(70_000))];
        assert_eq!(fit.check("t", 2 << 20, &big, None, None), Ok(()), "no limits known: nothing refused");
        fit.update(Some(SinkLimits { record_bytes: 1 << 20, header_bytes: 64 << 10 }));
        let fit = SinkFit::load(&spool);
        assert!(matches!(fit.check("t", 2 << 20, &[], None, None), Err(Misfit::Record { .. })));
        assert!(matches!(fit.check("t", 10, &big, None, None), Err(Misfit::Headers { .. })));
        assert_eq!(fit.check("t", 1000, &[], Some(20), Some("json")), Ok(()));
        fit.update(None);
        assert_eq!(SinkFit::load(&spool).check("t", 2 << 20, &big, None, None), Ok(()));
    }
}
