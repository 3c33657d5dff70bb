//! Where committed edge records go. A sink writes a batch's records and advances the committed
//! mark of (edge, epoch, lane) in one atomic step, idempotently: writing a record it already
//! has changes nothing. The bridge acks an edge only after `write` returned, and answers an
//! edge's hello with `committed`, so any bridge instance can take over any edge.

pub mod jetstream;
pub mod sqlite;

use std::future::Future;

use shared::proto::{LaneSeq, WireRecord};

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("sink {what}: {reason}")]
    Failed { what: &'static str, reason: String },
}

pub trait Sink: Send + Sync + 'static {
    /// Per lane, the highest seq of `edge` and `epoch` committed.
    fn committed(&self, edge: &str, epoch: &str) -> impl Future<Output = Result<Vec<LaneSeq>, SinkError>> + Send;

    /// Writes `records` (seqs above the lane's mark, in order) and sets the mark to `up_to`.
    fn write(
        &self,
        edge: &str,
        epoch: &str,
        lane: u8,
        records: Vec<WireRecord>,
        up_to: u64,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;
}
