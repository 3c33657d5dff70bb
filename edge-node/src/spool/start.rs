//! Opening the spool at the node's start: the database (salvaged or moved aside if it must
//! be), the receipts the session store still holds, the budget and class quotas, then the
//! writer's thread.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{SpoolConfig, SpoolError, SpoolWriter, WriterMetrics};

/// Why the spool did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error("cannot start the spool thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Opens the spool `config` names and starts its writer: `quotas` per class, `receipts` the QoS 2
/// receipts the session store holds (the spool forgets any other before it takes a message: a
/// release whose forgetting a crash cut short), its storage's writes failing as `faults` say
/// (tests).
pub fn start(
    config: &SpoolConfig,
    quotas: impl IntoIterator<Item = (String, u64)>,
    receipts: &BTreeSet<u64>,
    faults: Option<super::fault::Faults>,
    metrics: Arc<WriterMetrics>,
) -> Result<SpoolWriter, StartError> {
    let sqlite = super::SqliteStorage::open(&config.path)?;
    let opened = super::Storage::opened(&sqlite);
    if opened.moved_aside.is_some() {
        metrics.moved_aside.inc();
    }
    if let Some(salvaged) = &opened.salvaged {
        metrics.unreadable.inc_by(salvaged.unreadable_count());
    }
    for orphan in super::recovery::orphans(&config.path) {
        tracing::warn!(
            path = %orphan.display(),
            "a spool an earlier version moved aside without sending it; `edge-node spool recover --config <edge.toml> <path>` sends what it holds"
        );
    }
    let (integrity_checked, usage_counted) = (opened.checked, opened.counted);
    let storage: Box<dyn super::Storage + Send> = match faults {
        Some(faults) => {
            Box::new(super::fault::FaultyStorage { inner: sqlite, faults, path: config.path.display().to_string() })
        }
        None => Box::new(sqlite),
    };
    let mut spool = super::Spool::new(storage)
        .with_budget(config.budget.bytes())
        .with_quotas(quotas)
        .with_max_pending_bytes(config.max_pending_bytes.bytes());
    spool.keep_receipts(receipts)?;
    tracing::info!(path = %config.path.display(), epoch = spool.epoch(), integrity_checked, usage_counted, "spool open");
    SpoolWriter::start(spool, config.commit_interval.0, config.commit_batch, metrics).map_err(StartError::Thread)
}
