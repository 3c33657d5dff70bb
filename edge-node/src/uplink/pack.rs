//! Packing what the spool read into a batch the bridge can take: a batch that would cost a
//! receiver more than [`shared::proto::MAX_BATCH_COST`] to decode (only messages stuffed with
//! tiny user properties get there) is cut in half until it fits, the rest going in the next
//! batch. One record that cannot fit on its own is sent as a `refused` gap record, so the loss
//! shows in the cloud and the lane moves on instead of stopping at it.

use std::sync::Arc;
use std::time::Instant;

use shared::proto::columns::{NoShapes, Shapes};
use shared::proto::compress::{self, Dict, DictRef};
use shared::proto::edge::EdgeSession;
use shared::proto::{Batch, GapReason, Lane, ProtoError, Seq, WireGap, WireRecord};

use super::core::Read;
use super::dict::{DictBook, DictSettings};

/// Makes batches of what the spool read: samples them for the dictionaries, picks one, packs
/// within the decode cost. The real uplink and the fleet generator both send what it makes.
#[derive(Debug)]
pub struct Packer {
    pub dicts: DictBook,
    pub level: i32,
    /// Walks Avro and Protobuf payloads by their staged schema (protocol version 8).
    pub shapes: Arc<dyn Shapes + Send + Sync>,
}

/// A batch and what went into it.
#[derive(Debug)]
pub struct Packed {
    pub batch: Batch,
    /// Records in it (a costly read is cut short; the rest goes in the next batch).
    pub records: usize,
    /// Of those, sent as `refused` gap records.
    pub refused: u64,
    /// A dictionary that became current while packing, for the log.
    pub trained: Option<Dict>,
    /// Whether a dictionary was announced to the session for later batches.
    pub announced: bool,
    /// Per class, its messages' bytes in the batch as the classes count a publish (topic,
    /// payload and 2), for the TCO model's measured compression.
    pub classes: Vec<(String, u64)>,
}

/// Each class's message bytes in `records`, as `route::Class::count` counts a publish.
fn class_bytes(records: &[WireRecord]) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for m in records.iter().filter_map(WireRecord::as_message) {
        let bytes = (2 + m.topic.len() + m.payload.len()) as u64;
        match out.iter_mut().find(|(c, _)| *c == m.class) {
            Some((_, b)) => *b += bytes,
            None => out.push((m.class.clone(), bytes)),
        }
    }
    out
}

impl Packer {
    /// A packer as `config` says: its zstd level and dictionary settings.
    pub fn new(config: &super::UplinkConfig) -> Self {
        let dicts = DictBook::new(DictSettings {
            size: config.dict_size.as_usize(),
            samples: config.dict_samples.as_usize(),
            retrain: config.dict_retrain.0,
        });
        Self { dicts, level: config.zstd_level, shapes: Arc::new(NoShapes) }
    }

    /// The batch of `wire`, read for `read`; announcements go to `session`.
    pub async fn pack(
        &mut self,
        session: &mut EdgeSession,
        read: Read,
        mut wire: Vec<WireRecord>,
        now: Instant,
    ) -> Result<Packed, ProtoError> {
        self.dicts.observe(&wire, now);
        let trained = self.dicts.poll_training(now).await;
        let choice = self.dicts.choose(&wire);
        let announced = choice.announce.is_some();
        if let Some(announce) = choice.announce {
            session.announce_dict(announce);
        }
        let columns = shared::proto::columns::Format::of_version(session.version());
        let (batch, refused) = pack_within_cost(
            Lane(read.lane),
            Seq(read.after + 1),
            &mut wire,
            choice.dict,
            (self.level, columns),
            &*self.shapes,
        )?;
        let classes = class_bytes(&wire);
        Ok(Packed { batch, records: wire.len(), refused, trained, announced, classes })
    }
}

/// The batch of `wire`'s first records from `first` on; `wire` is cut to what it holds.
/// Returns the batch and how many records went as refused gap records.
pub fn pack_within_cost(
    lane: Lane,
    first: Seq,
    wire: &mut Vec<WireRecord>,
    dict: Option<DictRef<'_>>,
    (level, columns): (i32, Option<shared::proto::columns::Format>),
    shapes: &dyn Shapes,
) -> Result<(Batch, u64), ProtoError> {
    let mut refused = 0;
    loop {
        // The bridge knows the epoch from the hello; an empty one on the wire means that.
        match compress::pack_shaped(("", lane, first), wire, dict, (level, columns), shapes) {
            Err(ProtoError::TooCostly { .. }) if wire.len() > 1 => wire.truncate(wire.len() / 2),
            Err(ProtoError::TooCostly { .. }) if refused == 0 && wire[0].as_message().is_some() => {
                let seq = wire[0].seq;
                let gap = WireGap {
                    class: wire[0].class().to_owned(),
                    reason: GapReason::Refused,
                    ranges: vec![(seq.0, seq.0)],
                    count: 1,
                };
                wire[0] = WireRecord::gap(seq, gap);
                refused = 1;
            }
            other => return other.map(|b| (b, refused)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::proto::WireMessage;

    fn message(seq: u64, empty_properties: usize) -> WireRecord {
        WireRecord::message(
            Seq(seq),
            WireMessage {
                class: "telemetry".into(),
                topic: "t".into(),
                payload: vec![1; 16],
                qos: 1,
                enqueued_ms: 1,
                expires_ms: None,
                user_properties: vec![(String::new(), String::new()); empty_properties],
                correlation_data: None,
                content_type: None,
                schema: None,
            },
        )
    }

    #[test]
    fn a_costly_read_is_split_and_an_impossible_record_becomes_a_refused_gap() {
        // 8 messages of 40,000 empty pairs each: ~1 MB of CBOR, ~35 MB of bound, too much for
        // one batch together.
        let mut wire: Vec<WireRecord> = (1..=8).map(|s| message(s, 40_000)).collect();
        let (batch, refused) = pack_within_cost(Lane(0), Seq(1), &mut wire, None, (1, None), &NoShapes).unwrap();
        assert_eq!(refused, 0);
        assert!(wire.len() < 8 && !wire.is_empty(), "{} records kept", wire.len());
        assert_eq!(batch.last_seq, wire.last().unwrap().seq);

        // One message of 200,000 empty pairs cannot go at all: the cloud gets a gap for it.
        let mut wire = vec![message(9, 200_000), message(10, 0)];
        let (batch, refused) = pack_within_cost(Lane(0), Seq(9), &mut wire, None, (1, None), &NoShapes).unwrap();
        assert_eq!((refused, wire.len(), batch.first_seq, batch.last_seq), (1, 1, Seq(9), Seq(9)));
        let gap = wire[0].as_gap().unwrap();
        assert_eq!(
            (gap.class.as_str(), gap.reason.as_str(), gap.ranges.as_slice()),
            ("telemetry", "refused", &[(9, 9)][..])
        );
    }
}
