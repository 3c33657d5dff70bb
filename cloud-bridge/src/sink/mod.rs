//! Where committed edge records go. A batch lands in two steps, not one: [`RecordSink::publish`]
//! (after [`RecordSink::stage`], which may run ahead) writes its records idempotently (a record written twice is kept once, by its
//! `{edge}:{epoch}:{lane}:{seq}` key), then, once every batch before it in the lane published,
//! the session calls [`RecordSink::mark`] to raise the committed mark of (edge, epoch, lane). A crash
//! between the two leaves records with no mark over them: the edge resends them, and the
//! idempotent publish keeps one copy. The bridge acks an edge only after `mark` returned, and
//! answers an edge's hello with `committed`, so any bridge instance can take over any edge.
//! docs/ARCHITECTURE.md follows one record through both steps.
//!
//! A write that fails for the moment (the server away, a full disk, a timeout) is retried by
//! the sink with backoff ([`Retry`]), on the same session: a sink outage costs the edges
//! latency, not their connections (every edge of a bridge reconnecting at once is a storm of
//! its own). A record a sink refuses for itself is the sink's to set aside (JetStream's
//! dead-letter subject, `sink::jetstream`); the SQLite sink refuses nothing a record can carry
//! within the protocol's limits.
//!
//! What an edge makes a sink keep beyond its records, its epochs and dictionaries, is bounded
//! per edge ([`quota`]). The fleet view's states ([`presence`]) are one per edge and one per
//! bridge, replaced, never appended.

pub mod any;
pub mod config;
pub(crate) mod down_headers;
pub mod downlink;
mod error;
pub(crate) mod health;
pub mod inspect;
pub mod jetstream;
pub mod kafka;
mod metrics;
pub mod presence;
pub(crate) mod probe;
pub mod quota;
mod retry;
pub mod schemas;
mod seen;
pub mod sqlite;

use std::future::Future;

use shared::proto::{DictAnnounce, LaneSeq, WireRecord};

pub use downlink::DownlinkStore;
pub use error::SinkError;
pub use metrics::{DeadLetterLabel, OutcomeLabel, SinkMetrics};
pub use presence::{BridgeState, EdgeState, FleetData, FleetStates, LaneState, StoredReport};
pub use quota::{EdgeQuota, EpochVerdict};
pub use retry::Retry;
pub use schemas::SchemaStore;

/// A sink, by concern: edge records and their marks ([`RecordSink`]), the edges' compression
/// dictionaries ([`DictStore`]), what the fleet view shows ([`FleetStore`]) and the downlink
/// ([`DownlinkStore`]). A session takes all four; the fleet writer and `edges list` only
/// [`FleetStore`]. The schema registry ([`SchemaStore`]) is the `schema` commands' alone.
pub trait Sink: RecordSink + DictStore + FleetStore + DownlinkStore {}

impl<T: RecordSink + DictStore + FleetStore + DownlinkStore> Sink for T {}

/// Edge records, exactly once: epochs admitted, records published idempotently, marks raised
/// over what is published.
pub trait RecordSink: Send + Sync + 'static {
    /// A batch made ready by [`RecordSink::stage`], for [`RecordSink::publish`].
    type Staged: Send + 'static;

    /// Batches of one edge this sink may stage at once while the one ahead of them publishes:
    /// more than one helps only a sink with work to do before a batch's turn comes (staging it
    /// with the server, preparing its messages).
    fn pipeline(&self) -> usize {
        1
    }

    /// What the sink can store of one record of `edge` and `epoch`, as
    /// `shared::proto::record_size` counts it (its own headers taken off), for the Welcome;
    /// `None` when nothing but the protocol limits it.
    fn record_limits(&self, edge: &str, epoch: &str) -> Option<shared::proto::SinkLimits> {
        let _ = (edge, epoch);
        None
    }

    /// Registers `epoch` among `edge`'s epochs, within the sink's [`EdgeQuota`], retiring the
    /// oldest if there are too many: whether a hello of that epoch may go on. Compare-and-set
    /// where bridges share the sink, so two registering at once both count.
    fn admit_epoch(&self, edge: &str, epoch: &str) -> impl Future<Output = Result<EpochVerdict, SinkError>> + Send;

    /// Per lane, the highest seq of `edge` and `epoch` committed.
    fn committed(&self, edge: &str, epoch: &str) -> impl Future<Output = Result<Vec<LaneSeq>, SinkError>> + Send;

    /// Makes `records` ready to publish: what may be done before the batches ahead of them
    /// are in the sink (their messages built; staged with a server that keeps them apart until
    /// committed). Nothing staged is visible, and a staged batch dropped unpublished never
    /// becomes so. A moment's failure is not an error here: what could not be staged is done by
    /// the publish. The future owns what it needs, so several run at once, beside a publish.
    fn stage(
        &self,
        edge: String,
        epoch: String,
        lane: u8,
        records: Vec<WireRecord>,
    ) -> impl Future<Output = Result<Self::Staged, SinkError>> + Send + 'static;

    /// Writes a staged batch durably and idempotently (a record written twice is kept once);
    /// the mark does not move. The caller publishes one batch at a time, in order, each once
    /// the one before it is in (`server::core` keeps that order): a failure of the batch before
    /// must not land this one's records first and the earlier one's after the edge's resend.
    fn publish(&self, staged: Self::Staged) -> impl Future<Output = Result<(), SinkError>> + Send + 'static;

    /// Of a session's batches, how many may be publishing at once ([`RecordSink::publish_after`]):
    /// 1 unless the sink keeps a lane's order itself.
    fn publish_ahead(&self) -> usize {
        1
    }

    /// [`RecordSink::publish`] of a batch called while batches before it may still be
    /// publishing (at most `publish_ahead` at once, called in the lane's order): `after` is the
    /// last record of the latest one before it in its lane still publishing. A sink taking
    /// more than one at a time must take them in the order of these calls (the work is queued
    /// by the call, not by the future) and must not land this batch before the record `after`
    /// is in: were the batch before to fail, this one would otherwise be visible ahead of the
    /// edge's resend of it.
    fn publish_after(
        &self,
        staged: Self::Staged,
        after: Option<u64>,
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        debug_assert!(after.is_none() || self.publish_ahead() > 1, "one at a time: nothing before it publishes");
        self.publish(staged)
    }

    /// Raises the committed mark of (edge, epoch, lane) to `up_to`, never lowers it. Called only
    /// once every record up to `up_to` was published.
    fn mark(&self, edge: &str, epoch: &str, lane: u8, up_to: u64)
    -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Whether the sink would take a write now, asked without writing anything (the
    /// readiness probe, [`probe::run`]): not what the last write found.
    fn probe(&self) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// [`RecordSink::stage`], [`RecordSink::publish`], then [`RecordSink::mark`].
    fn write(
        &self,
        edge: &str,
        epoch: &str,
        lane: u8,
        records: Vec<WireRecord>,
        up_to: u64,
    ) -> impl Future<Output = Result<(), SinkError>> + Send {
        async move {
            let staged = self.stage(edge.to_owned(), epoch.to_owned(), lane, records).await?;
            self.publish(staged).await?;
            self.mark(edge, epoch, lane, up_to).await
        }
    }
}

/// The edges' compression dictionaries, where every bridge on the sink finds them.
pub trait DictStore: Send + Sync + 'static {
    /// Of `edge`'s dictionaries `ids`, those stored, with their bytes.
    fn load_dicts(
        &self,
        edge: &str,
        ids: &[String],
    ) -> impl Future<Output = Result<Vec<(String, Vec<u8>)>, SinkError>> + Send;

    /// Stores a dictionary of `edge` (by its id, a hash: storing one twice changes nothing)
    /// where every bridge on this sink finds it, evicting the edge's oldest past its quota.
    fn store_dict(&self, edge: &str, dict: &DictAnnounce) -> impl Future<Output = Result<(), SinkError>> + Send;
}

/// What the fleet view shows: each edge's state and TCO report, each bridge's state.
pub trait FleetStore: Send + Sync + 'static {
    /// Keeps `report` as `edge`'s latest TCO classes, replacing the one before.
    fn store_report(&self, report: &StoredReport) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Every edge's latest TCO classes report.
    fn load_reports(&self) -> impl Future<Output = Result<Vec<StoredReport>, SinkError>> + Send;

    /// Stores each state as its edge's, unless it is the end of a session other than the one
    /// stored ([`EdgeState::replaces`]); whether each was stored, in order. Several at once, so
    /// a sink that commits with a sync pays it once for all.
    fn store_edge_states(&self, states: Vec<EdgeState>) -> impl Future<Output = Result<Vec<bool>, SinkError>> + Send;

    /// Replaces this bridge's own state.
    fn store_bridge_state(&self, state: &BridgeState) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Every edge's and bridge's state, edges in id order.
    fn load_fleet(&self) -> impl Future<Output = Result<FleetStates, SinkError>> + Send;
}
