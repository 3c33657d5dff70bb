//! Batch bodies: the records in CBOR, zstd-compressed when that pays, optionally with a
//! dictionary trained on the class's own recent traffic (small telemetry messages share most of
//! their bytes with each other, which plain zstd cannot see within one short message).
//! Decompression reads at most a fixed number of output bytes, so a small malicious body cannot
//! expand into gigabytes.

use std::collections::HashMap;

use super::columns::{Format, NoShapes, Shapes};
use super::{Batch, Codec, Lane, MAX_BATCH_COST, ProtoError, Seq, WireRecord, codec};

mod contexts;

/// Bodies shorter than this are sent as plain CBOR: zstd's frame header would eat the gain.
const MIN_COMPRESS: usize = 128;

/// A zstd dictionary, named by the hash of its bytes so any bridge can tell whether it has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dict {
    /// The full SHA-256 in hex ([`dict_id`]); on a version 1 session, its first 16 digits.
    pub id: String,
    pub class: String,
    pub bytes: Vec<u8>,
}

impl Dict {
    pub(crate) fn new(class: impl Into<String>, bytes: Vec<u8>) -> Self {
        Self { id: dict_id(&bytes), class: class.into(), bytes }
    }

    /// This dictionary as a session of protocol `version` names it.
    pub fn on(&self, version: u16) -> DictRef<'_> {
        DictRef { id: wire_id(&self.id, version), bytes: &self.bytes }
    }
}

/// A dictionary as one session names it, for [`pack`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DictRef<'a> {
    pub id: &'a str,
    pub bytes: &'a [u8],
}

/// Hex digits of a version 1 dictionary id: 64 bits of the hash, which an edge that wants two
/// of its dictionaries to share an id finds in about 2^32 tries.
const V1_ID_DIGITS: usize = 16;

/// The SHA-256 of a dictionary in hex, the id of protocol version 2 on.
pub fn dict_id(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The id of a dictionary in protocol `version`: the full hash from version 2, its first 16 hex
/// digits in version 1.
pub fn dict_id_for(version: u16, bytes: &[u8]) -> String {
    let mut id = dict_id(bytes);
    id.truncate(wire_id(&id, version).len());
    id
}

/// A full dictionary id (`dict_id`) as protocol `version` names it.
pub(crate) fn wire_id(full: &str, version: u16) -> &str {
    if version >= 2 { full } else { full.get(..V1_ID_DIGITS).unwrap_or(full) }
}

/// A training sample: one record as it appears inside a batch body (a CBOR array of records).
pub fn sample(record: &WireRecord) -> Vec<u8> {
    let mut cbor = Vec::new();
    // Writing into a Vec fails only for types serde cannot express; a record is not one.
    let _ = ciborium::into_writer(record, &mut cbor);
    cbor
}

/// Trains a dictionary of at most `max_size` bytes on sample payloads of one class.
pub fn train(class: &str, samples: &[Vec<u8>], max_size: usize) -> Result<Dict, ProtoError> {
    let bytes = zstd::dict::from_samples(samples, max_size).map_err(|e| ProtoError::Encode(e.to_string()))?;
    Ok(Dict::new(class, bytes))
}

/// A dictionary of at most `max_size` bytes for the column-wise bodies of one class
/// ([`super::columns::dictionary`]: the table entries its records repeat), from samples as
/// [`sample`] takes them; an error when nothing in them repeats.
pub fn train_columns(class: &str, samples: &[Vec<u8>], max_size: usize) -> Result<Dict, ProtoError> {
    let records = samples
        .iter()
        .map(|s| ciborium::from_reader::<WireRecord, _>(s.as_slice()).map_err(|e| ProtoError::Encode(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let bytes = super::columns::dictionary(&records, max_size);
    if bytes.is_empty() {
        return Err(ProtoError::Encode("nothing repeats in these samples".into()));
    }
    Ok(Dict::new(class, bytes))
}

/// Builds the batch of `lane` covering seqs `first ..= ` the last record's: `records` in seq
/// order, seqs missing in between only where the spool dropped records (a gap record with a
/// later seq accounts for them).
pub fn pack(
    epoch: &str,
    lane: Lane,
    first: Seq,
    records: &[WireRecord],
    dict: Option<DictRef<'_>>,
    level: i32,
) -> Result<Batch, ProtoError> {
    pack_as(epoch, lane, first, records, dict, (level, None))
}

/// Batches of at most this many records are packed both ways when columns are allowed, and the
/// smaller goes: a column-wise body carries its tables (topics, classes, shapes) in every batch,
/// which a handful of records does not pay back, while a dictionary trained on rows does.
const BOTH_WAYS_UP_TO: usize = 64;

/// [`pack`], the records column-wise in format `columns` (for a session's version,
/// [`Format::of_version`]) unless rows come out smaller.
pub fn pack_as(
    epoch: &str,
    lane: Lane,
    first: Seq,
    records: &[WireRecord],
    dict: Option<DictRef<'_>>,
    (level, columns): (i32, Option<Format>),
) -> Result<Batch, ProtoError> {
    pack_shaped((epoch, lane, first), records, dict, (level, columns), &NoShapes)
}

/// [`pack_as`], binary payloads taken apart as `shapes` walks them in format 3.
pub fn pack_shaped(
    (epoch, lane, first): (&str, Lane, Seq),
    records: &[WireRecord],
    dict: Option<DictRef<'_>>,
    (level, columns): (i32, Option<Format>),
    shapes: &dyn Shapes,
) -> Result<Batch, ProtoError> {
    let packed = pack_one((epoch, lane, first), records, dict, (level, columns), shapes)?;
    if columns.is_some() && records.len() <= BOTH_WAYS_UP_TO {
        let rows = pack_one((epoch, lane, first), records, dict, (level, None), shapes)?;
        if rows.body.len() < packed.body.len() {
            return Ok(rows);
        }
    }
    Ok(packed)
}

/// One body of `records`: (epoch, lane, first seq), (zstd level, the column format or rows).
fn pack_one(
    (epoch, lane, first): (&str, Lane, Seq),
    records: &[WireRecord],
    dict: Option<DictRef<'_>>,
    (level, columns): (i32, Option<Format>),
    shapes: &dyn Shapes,
) -> Result<Batch, ProtoError> {
    let Some(last) = records.last() else {
        return Err(ProtoError::Encode("an empty batch".into()));
    };
    check_range(first, last.seq, records)?;
    let (raw, bound) = if let Some(format) = columns {
        (super::columns::encode_with(records, format, shapes), records_cost(records))
    } else {
        let mut raw = Vec::new();
        ciborium::into_writer(&records, &mut raw).map_err(|e| ProtoError::Encode(e.to_string()))?;
        let bound = super::bound::decoded_bound(&raw)?;
        (raw, bound)
    };
    let mut batch = Batch {
        epoch: epoch.to_owned(),
        lane,
        first_seq: first,
        last_seq: last.seq,
        codec: if columns.is_some() { Codec::Columns } else { Codec::Cbor },
        dict: None,
        raw_len: raw.len() as u64,
        body: Vec::new(),
    };
    if raw.len() >= MIN_COMPRESS {
        let packed = contexts::compress(&raw, level, dict.map(|d| d.bytes))?;
        if packed.len() < raw.len() {
            batch.codec = if columns.is_some() { Codec::ZstdColumns } else { Codec::Zstd };
            batch.dict = dict.map(|d| d.id.to_owned());
            within_cost(packed.len() + raw.len() + bound)?;
            batch.body = packed;
            return Ok(batch);
        }
    }
    within_cost(raw.len() + bound)?;
    batch.body = raw;
    Ok(batch)
}

/// The records of a batch, decompressed with at most `max_raw` bytes of output, and checked to
/// lie in the range the batch claims, in order, ending at its last seq.
pub fn unpack(batch: &Batch, dicts: &HashMap<String, Vec<u8>>, max_raw: usize) -> Result<Vec<WireRecord>, ProtoError> {
    let dict = match &batch.dict {
        Some(id) => Some(dicts.get(id).ok_or_else(|| ProtoError::UnknownDict(id.clone()))?.as_slice()),
        None => None,
    };
    match decompress(batch, dict, max_raw)? {
        Some(raw) => decode_any(batch, &raw, max_raw),
        None => decode_any(batch, &batch.body, max_raw),
    }
}

fn decode_any(batch: &Batch, raw: &[u8], max_out: usize) -> Result<Vec<WireRecord>, ProtoError> {
    if batch.codec.columns() { decode_columns(batch, raw, max_out) } else { decode_records(batch, raw) }
}

/// Decodes a column-wise batch's records (at most `max_out` bytes of them) and checks them
/// against the range the batch claims.
pub fn decode_columns(batch: &Batch, raw: &[u8], max_out: usize) -> Result<Vec<WireRecord>, ProtoError> {
    let records = super::columns::decode(raw, max_out)?;
    check_range(batch.first_seq, batch.last_seq, &records)?;
    Ok(records)
}

/// What decoded records take in memory: each record's struct and the bytes it owns.
pub fn records_cost(records: &[WireRecord]) -> usize {
    records
        .iter()
        .map(|r| {
            size_of::<WireRecord>()
                + match &r.body {
                    super::RecordBody::Message(m) => {
                        m.class.len()
                            + m.topic.len()
                            + m.payload.len()
                            + m.user_properties.iter().map(|(k, v)| k.len() + v.len() + 48).sum::<usize>()
                            + m.correlation_data.as_ref().map_or(0, Vec::len)
                            + m.content_type.as_ref().map_or(0, String::len)
                            + m.schema.as_ref().map_or(0, |s| s.subject.len() + s.id.len())
                    }
                    super::RecordBody::Gap(g) => g.class.len() + g.ranges.len() * 16,
                }
        })
        .sum()
}

/// A zstd batch's CBOR, exactly the `raw_len` bytes it declares (at most `max_raw`), so a
/// receiver can reserve the output before it decompresses; `None` for a plain CBOR batch,
/// whose body is its CBOR. `dict` is the dictionary the batch names.
pub fn decompress(batch: &Batch, dict: Option<&[u8]>, max_raw: usize) -> Result<Option<Vec<u8>>, ProtoError> {
    decompress_body(batch, &batch.body, dict, max_raw)
}

/// [`decompress`] of a body that lies elsewhere than in `batch` (a version 4 frame's, after
/// its head).
pub fn decompress_body(
    batch: &Batch,
    body: &[u8],
    dict: Option<&[u8]>,
    max_raw: usize,
) -> Result<Option<Vec<u8>>, ProtoError> {
    if !batch.codec.compressed() {
        return Ok(None);
    }
    if batch.raw_len > max_raw as u64 {
        return Err(ProtoError::TooLargeDecompressed { max: max_raw });
    }
    // Into exactly the declared length: zstd stops with "too small" at the first byte past it.
    let mut raw = Vec::with_capacity(batch.raw_len as usize);
    if let Err(e) = contexts::decompress(body, dict, &mut raw) {
        return Err(ProtoError::Decompress(match e.to_string() {
            m if m.contains("Destination buffer is too small") => {
                format!("more bytes of output where the batch declares {}", batch.raw_len)
            }
            m => m,
        }));
    }
    if raw.len() as u64 != batch.raw_len {
        return Err(ProtoError::Decompress(format!(
            "{} bytes of output where the batch declares {}",
            if raw.len() as u64 > batch.raw_len { "more".to_owned() } else { raw.len().to_string() },
            batch.raw_len
        )));
    }
    Ok(Some(raw))
}

/// Decodes a batch's CBOR (from [`decompress`], or the body of a plain batch) and checks the
/// records against the range the batch claims.
pub fn decode_records(batch: &Batch, raw: &[u8]) -> Result<Vec<WireRecord>, ProtoError> {
    let records: Vec<WireRecord> = codec::decode(raw)?;
    check_range(batch.first_seq, batch.last_seq, &records)?;
    Ok(records)
}

/// Refuses a batch a receiver could not take within [`MAX_BATCH_COST`]: the sender splits it.
fn within_cost(cost: usize) -> Result<(), ProtoError> {
    if cost > MAX_BATCH_COST {
        return Err(ProtoError::TooCostly { cost, max: MAX_BATCH_COST });
    }
    Ok(())
}

fn check_range(first: Seq, last: Seq, records: &[WireRecord]) -> Result<(), ProtoError> {
    let (first, last) = (first.0, last.0);
    let mismatch = |detail: String| ProtoError::BatchMismatch { first, last, records: records.len(), detail };
    if first == 0 || last < first || records.is_empty() || records.len() as u64 > last - first + 1 {
        return Err(mismatch("count".into()));
    }
    if records.last().map(|r| r.seq.0) != Some(last) {
        return Err(mismatch("the last record is not the batch's last seq".into()));
    }
    let mut previous = first - 1;
    for (i, r) in records.iter().enumerate() {
        if r.seq.0 <= previous {
            return Err(mismatch(format!("record {i} has seq {}", r.seq)));
        }
        previous = r.seq.0;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{GapReason, WireGap, WireMessage};

    fn telemetry(seq: u64) -> WireRecord {
        WireRecord::message(
            Seq(seq),
            WireMessage {
                class: "telemetry".into(),
                topic: format!("telemetry/cam-{}/metrics", seq % 4),
                payload: format!(
                    "{{\"cpu\":0.{seq},\"temp_c\":41.{},\"fps\":29.97,\"model\":\"yolo-edge\"}}",
                    seq % 10
                )
                .into_bytes(),
                qos: 1,
                enqueued_ms: 1_700_000_000_000 + seq,
                expires_ms: None,
                user_properties: vec![],
                correlation_data: None,
                content_type: None,
                schema: None,
            },
        )
    }

    #[test]
    fn batches_round_trip_with_and_without_a_dictionary() {
        let records: Vec<WireRecord> = (1..=200).map(telemetry).collect();
        let plain = pack("e", Lane(3), Seq(1), &records, None, 3).unwrap();
        assert_eq!(plain.codec, Codec::Zstd);
        assert_eq!(unpack(&plain, &HashMap::new(), 1 << 20).unwrap(), records);

        let samples: Vec<Vec<u8>> = (1000..1400).map(|s| codec::encode(&telemetry(s)).unwrap()).collect();
        let dict = train("telemetry", &samples, 4096).unwrap();
        let small: Vec<WireRecord> = (1..=4).map(telemetry).collect();
        let with = pack("e", Lane(3), Seq(1), &small, Some(dict.on(2)), 3).unwrap();
        let without = pack("e", Lane(3), Seq(1), &small, None, 3).unwrap();
        assert!(with.body.len() < without.body.len(), "{} vs {}", with.body.len(), without.body.len());
        let dicts = HashMap::from([(dict.id.clone(), dict.bytes.clone())]);
        assert_eq!(unpack(&with, &dicts, 1 << 20).unwrap(), small);
        assert_eq!(unpack(&with, &HashMap::new(), 1 << 20), Err(ProtoError::UnknownDict(dict.id.clone())));
    }

    /// Each thread keeps its zstd contexts with the dictionary last loaded: batches of several
    /// dictionaries, and none, packed and unpacked in turn on one thread each read back, and a
    /// batch read with the wrong dictionary loaded fails rather than decoding as something else.
    #[test]
    fn batches_of_several_dictionaries_in_turn_on_one_thread_each_read_back() {
        let samples =
            |from: u64| -> Vec<Vec<u8>> { (from..from + 400).map(|s| codec::encode(&telemetry(s)).unwrap()).collect() };
        let (a, b) = (train("a", &samples(1000), 4096).unwrap(), train("b", &samples(5000), 2048).unwrap());
        assert_ne!(a.bytes, b.bytes);
        let dicts = HashMap::from([(a.id.clone(), a.bytes.clone()), (b.id.clone(), b.bytes.clone())]);
        let small: Vec<WireRecord> = (1..=4).map(telemetry).collect();
        let mut packed = Vec::new();
        for (i, dict) in [Some(&a), None, Some(&b), Some(&a), Some(&a), None, Some(&b)].into_iter().enumerate() {
            let batch = pack("e", Lane(0), Seq(1), &small, dict.map(|d| d.on(2)), 1 + (i % 2) as i32).unwrap();
            assert_eq!(batch.dict, dict.map(|d| d.id.clone()));
            packed.push(batch);
        }
        for batch in packed.iter().chain(packed.iter().rev()) {
            assert_eq!(unpack(batch, &dicts, 1 << 20).unwrap(), small);
        }
        let mut wrong = packed[0].clone();
        wrong.dict = Some(b.id.clone());
        assert!(unpack(&wrong, &dicts, 1 << 20).is_err(), "read with another dictionary");
        assert_eq!(unpack(&packed[0], &dicts, 1 << 20).unwrap(), small, "and the right one after it");
    }

    #[test]
    fn a_decompression_bomb_is_stopped_at_the_cap() {
        let huge = vec![0u8; 32 << 20];
        let body = zstd::bulk::compress(&huge, 19).unwrap();
        assert!(body.len() < 64 << 10);
        let batch = Batch {
            epoch: "e".into(),
            lane: Lane(0),
            first_seq: Seq(1),
            last_seq: Seq(1),
            codec: Codec::Zstd,
            dict: None,
            raw_len: 100, // lies
            body,
        };
        // Output past the declared length stops there: a receiver reserves `raw_len`, no more.
        let err = unpack(&batch, &HashMap::new(), 1 << 20).unwrap_err();
        assert_eq!(err, ProtoError::Decompress("more bytes of output where the batch declares 100".into()));
        let honest = Batch { raw_len: 32 << 20, ..batch };
        assert_eq!(unpack(&honest, &HashMap::new(), 1 << 20), Err(ProtoError::TooLargeDecompressed { max: 1 << 20 }));
    }

    #[test]
    fn a_batch_too_costly_to_decode_is_refused_by_its_sender() {
        // 600,000 records of nothing but a seq and an empty gap: small on the wire, large decoded.
        let records: Vec<WireRecord> = (1..=600_000)
            .map(|seq| {
                WireRecord::gap(
                    Seq(seq),
                    WireGap { class: String::new(), reason: GapReason::Evicted, ranges: vec![], count: 0 },
                )
            })
            .collect();
        let err = pack("e", Lane(0), Seq(1), &records, None, 1).unwrap_err();
        assert!(matches!(err, ProtoError::TooCostly { max: MAX_BATCH_COST, .. }), "{err}");
        assert!(pack("e", Lane(0), Seq(1), &records[..1000], None, 1).is_ok());
    }

    #[test]
    fn batches_must_hold_exactly_the_seqs_they_claim() {
        let mut records: Vec<WireRecord> = (5..=7).map(telemetry).collect();
        let mut batch = pack("e", Lane(0), Seq(5), &records, None, 1).unwrap();
        batch.last_seq = Seq(8);
        assert!(matches!(unpack(&batch, &HashMap::new(), 1 << 20), Err(ProtoError::BatchMismatch { .. })));
        // Seqs the spool dropped leave holes: allowed, in order, inside the range.
        let holes = vec![telemetry(3), telemetry(6), telemetry(7)];
        let batch = pack("e", Lane(0), Seq(2), &holes, None, 1).unwrap();
        assert_eq!((batch.first_seq, batch.last_seq), (Seq(2), Seq(7)));
        assert_eq!(unpack(&batch, &HashMap::new(), 1 << 20).unwrap(), holes);
        assert!(pack("e", Lane(0), Seq(4), &holes, None, 1).is_err(), "a record before the range");
        records[1].seq = Seq(9);
        assert!(pack("e", Lane(0), Seq(5), &records, None, 1).is_err(), "out of order");
    }

    #[test]
    fn garbage_bodies_are_errors() {
        let batch = Batch {
            epoch: "e".into(),
            lane: Lane(0),
            first_seq: Seq(1),
            last_seq: Seq(1),
            codec: Codec::Zstd,
            dict: None,
            raw_len: 10,
            body: b"not zstd at all".to_vec(),
        };
        assert!(matches!(unpack(&batch, &HashMap::new(), 1 << 20), Err(ProtoError::Decompress(_))));
    }
}
