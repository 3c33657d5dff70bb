//! Edge records in JetStream: epochs registered, batches published (`publish`), marks raised
//! with compare-and-set.

use std::collections::BTreeMap;

use bytes::Bytes;
use shared::proto::{Lane, LaneSeq, Seq, WireRecord};
use shared::units::now_ms;

use super::JetStreamSink;
use super::bucket::{CAS_ATTEMPTS, Cas, edge_key, mark_key, read_doc, write_doc};
use super::publish::{Publisher, Publishing, Staged};
use crate::sink::RecordSink;
use crate::sink::error::SinkError;
use crate::sink::quota::{EpochVerdict, Epochs};
use crate::sink::retry::Retry;

/// JetStream refuses a message whose headers pass this (error 10097).
const MAX_HEADERS: usize = 64 << 10;

impl RecordSink for JetStreamSink {
    type Staged = Staged;

    /// The server's `max_payload` and the stream's `max_msg_size` bound the whole message, and
    /// JetStream bounds its headers; the bridge's own headers (the message id, the QoS) and the
    /// header block's framing are taken off, as `outgoing::Outgoing::size` counts them.
    fn record_limits(&self, edge: &str, epoch: &str) -> Option<shared::proto::SinkLimits> {
        let id = format!("{edge}:{epoch}:255:{}", shared::proto::MAX_SEQ);
        let own = ("Nats-Msg-Id".len() + id.len() + 4)
            + ("Mqtt-Qos".len() + 1 + 4)
            + shared::proto::SCHEMA_HEADERS_MAX
            + "NATS/1.0\r\n\r\n".len()
            + 16;
        let whole = self.max_msg_size.map_or(self.max_payload, |m| m.min(self.max_payload));
        Some(shared::proto::SinkLimits {
            record_bytes: whole.saturating_sub(own) as u64,
            header_bytes: MAX_HEADERS.saturating_sub(own) as u64,
        })
    }

    fn pipeline(&self) -> usize {
        // Atomic batches stage while the ones before commit; otherwise only the building of the
        // next batch's messages overlaps, since what is sent is stored at once.
        if self.publishing == Publishing::Atomic { 4 } else { 2 }
    }

    async fn admit_epoch(&self, edge: &str, epoch: &str) -> Result<EpochVerdict, SinkError> {
        let key = edge_key(edge);
        for _ in 0..CAS_ATTEMPTS {
            let (mut epochs, revision): (Epochs, _) = read_doc(&self.marks, &key, "read epochs").await?;
            let verdict = epochs.admit(epoch, now_ms(), &self.quota);
            let EpochVerdict::Added { retired } = &verdict else { return Ok(verdict) };
            match write_doc(&self.marks, &key, &epochs, revision).await {
                Ok(_) => {}
                Err(Cas::Changed) => {
                    tracing::debug!(key, "epochs changed under us; retrying");
                    continue;
                }
                Err(Cas::Failed(e)) => return Err(e),
            }
            self.metrics.epochs_registered.inc();
            for old in retired {
                let marks = mark_key(edge, old);
                // Registered as retired first: a purge that fails leaves marks no hello reads.
                if let Err(e) = self.marks.purge(&marks).await {
                    tracing::warn!(key = marks, error = %e, "marks of a retired epoch not deleted");
                }
                self.last_marks.lock().unwrap_or_else(|e| e.into_inner()).remove(&marks);
                self.metrics.epochs_retired.inc();
                tracing::info!(edge, epoch = old, "epoch retired: more than limits.epochs_per_edge");
            }
            return Ok(verdict);
        }
        Err(SinkError::Conflict { what: "register epoch", key: key.to_string(), attempts: CAS_ATTEMPTS as u32 })
    }

    /// The records' stream and the marks' bucket answer their leaders' info: what a write to
    /// either needs (a server down, a stream without a leader or quorum, a lost connection
    /// fail it).
    async fn probe(&self) -> Result<(), SinkError> {
        self.js.get_stream(&self.stream).await.map_err(|e| SinkError::nats("stream", &self.stream, &e))?;
        let mut marks = self.marks.stream.clone();
        marks.info().await.map_err(|e| SinkError::nats("marks", "", &e))?;
        Ok(())
    }

    async fn committed(&self, edge: &str, epoch: &str) -> Result<Vec<LaneSeq>, SinkError> {
        let (marks, _) = self.read_marks(&mark_key(edge, epoch)).await?;
        Ok(marks.into_iter().map(|(lane, seq)| LaneSeq { lane: Lane(lane), seq: Seq(seq) }).collect())
    }

    fn stage(
        &self,
        edge: String,
        epoch: String,
        lane: u8,
        records: Vec<WireRecord>,
    ) -> impl Future<Output = Result<Staged, SinkError>> + Send + 'static {
        let publisher = self.publisher();
        async move { publisher.stage(edge, epoch, lane, records).await }
    }

    fn publish(&self, staged: Staged) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        let publisher = self.publisher();
        async move { publisher.publish(staged).await }
    }

    async fn mark(&self, edge: &str, epoch: &str, lane: u8, up_to: u64) -> Result<(), SinkError> {
        let mut retry = Retry::default();
        loop {
            match self.mark_once(edge, epoch, lane, up_to).await {
                Ok(()) => return Ok(()),
                Err(e) => retry.wait("mark", &e, &self.metrics).await,
            }
        }
    }
}

impl JetStreamSink {
    fn publisher(&self) -> Publisher {
        Publisher {
            client: self.client.clone(),
            js: self.js.clone(),
            publishing: self.publishing,
            prefix: self.prefix.clone(),
            metrics: self.metrics.clone(),
            max_payload: self.max_payload,
        }
    }

    async fn read_marks(&self, key: &str) -> Result<(BTreeMap<u8, u64>, Option<u64>), SinkError> {
        read_doc(&self.marks, key, "read mark").await
    }

    async fn mark_once(&self, edge: &str, epoch: &str, lane: u8, up_to: u64) -> Result<(), SinkError> {
        // Compare-and-set; a concurrent bridge's higher mark wins.
        let key = mark_key(edge, epoch);
        let cached = self.last_marks.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
        if let Some((mut marks, revision)) = cached {
            marks.insert(lane, up_to.max(marks.get(&lane).copied().unwrap_or(0)));
            let value = Bytes::from(serde_json::to_vec(&marks).map_err(|e| SinkError::invalid("mark", e))?);
            if let Ok(revision) = self.marks.update(&key, value, revision).await {
                self.remember(key, marks, revision);
                return Ok(());
            }
            // Another bridge wrote since: read, then compare-and-set as below.
        }
        for _ in 0..CAS_ATTEMPTS {
            let (mut marks, revision) = self.read_marks(&key).await?;
            if marks.get(&lane).is_some_and(|m| *m >= up_to) {
                if let Some(revision) = revision {
                    self.remember(key, marks, revision);
                }
                return Ok(());
            }
            marks.insert(lane, up_to);
            match write_doc(&self.marks, &key, &marks, revision).await {
                Ok(revision) => {
                    self.remember(key, marks, revision);
                    return Ok(());
                }
                Err(Cas::Changed) => tracing::debug!(key, "mark changed under us; retrying"),
                Err(Cas::Failed(e)) => return Err(e),
            }
        }
        Err(SinkError::Conflict { what: "mark", key: key.to_string(), attempts: CAS_ATTEMPTS as u32 })
    }

    fn remember(&self, key: String, marks: BTreeMap<u8, u64>, revision: u64) {
        let mut last = self.last_marks.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded by the edges this bridge serves; an edge's old epochs are not worth keeping.
        if last.len() > 10_000 {
            last.clear();
        }
        last.insert(key, (marks, revision));
    }
}
