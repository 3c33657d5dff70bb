//! An upper bound on the memory a batch's records take once decoded, read from the CBOR
//! headers alone, so a receiver can reserve that memory (or refuse the batch) before it
//! decodes anything.
//!
//! Decoding expands: an empty user property pair is 3 bytes of CBOR and two `String`s (48
//! bytes) in memory, a record with only a seq 6 bytes and a whole `WireRecord`. The raw size
//! alone therefore says little; the number of items does. The bound charges every item
//! [`SLOT`] bytes, every string and byte string its length (twice when sent in chunks, which
//! grow their buffer), and every record of the top-level array twice its struct size (a `Vec`
//! grows by doubling). It over-counts a typical record by about a kilobyte, which is what a
//! reservation can afford, and never under-counts.

use super::{ProtoError, WireRecord};

/// What one CBOR item may cost in memory besides its bytes: the largest slot any of our types
/// gives an item (a `String` or `Vec` header is 24 bytes, a `(String, String)` pair 48), twice
/// for growth.
pub(crate) const SLOT: usize = 96;

/// Nesting deeper than any record has is refused before it is walked.
const MAX_DEPTH: usize = 16;

/// The bound for `cbor`, which must be a CBOR array of records.
pub(crate) fn decoded_bound(cbor: &[u8]) -> Result<usize, ProtoError> {
    decoded_bound_up_to(cbor, usize::MAX)
}

/// [`decoded_bound`], but the walk stops once it passes `limit` and returns what it counted
/// so far (more than `limit`, less than the whole bound): a bomb costs a receiver the walk up
/// to its budget, not through all of it.
pub fn decoded_bound_up_to(cbor: &[u8], limit: usize) -> Result<usize, ProtoError> {
    match walk(cbor, limit) {
        Err(ProtoError::TooCostly { cost, .. }) => Ok(cost),
        other => other,
    }
}

/// The same bound for any one CBOR value (a control frame's body): every item [`SLOT`], every
/// string its length; the walk stops once past `limit`, as in [`decoded_bound_up_to`]. `SLOT`
/// covers serde's buffering of a `flatten`ed struct too (a pair of `Content`s, 64 bytes).
pub fn value_bound_up_to(cbor: &[u8], limit: usize) -> Result<usize, ProtoError> {
    let mut r = Reader { bytes: cbor, at: 0, walked: 0, limit };
    match r.item(0) {
        Err(ProtoError::TooCostly { cost, .. }) => Ok(cost),
        other => other,
    }
}

fn walk(cbor: &[u8], limit: usize) -> Result<usize, ProtoError> {
    let mut r = Reader { bytes: cbor, at: 0, walked: 0, limit };
    let top = r.header()?;
    let records = match top {
        Header::Array(Some(n)) => n,
        Header::Array(None) => u64::MAX,
        _ => return Err(bad("a batch's records are not a CBOR array")),
    };
    let per_record = 2 * size_of::<WireRecord>();
    let mut total: usize = 0;
    let mut seen: u64 = 0;
    while seen < records {
        if records == u64::MAX && r.peek()? == BREAK {
            // Chunked arrays grow their `Vec` without a size hint: count the doubling once more.
            total = total.saturating_add(per_record.saturating_mul(seen as usize));
            break;
        }
        total = total.saturating_add(per_record).saturating_add(r.item(1)?);
        seen += 1;
    }
    Ok(total)
}

const BREAK: u8 = 0xff;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Header {
    Int,
    /// A byte or text string: its length, `None` when sent in chunks.
    Str(Option<u64>),
    Array(Option<u64>),
    Map(Option<u64>),
    Tag,
    Simple,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// What the items walked so far cost: the bound is at least this.
    walked: usize,
    limit: usize,
}

fn bad(what: &str) -> ProtoError {
    ProtoError::Decode(what.to_owned())
}

impl Reader<'_> {
    fn peek(&self) -> Result<u8, ProtoError> {
        self.bytes.get(self.at).copied().ok_or(ProtoError::Truncated { got: self.at, want: self.at + 1 })
    }

    fn take(&mut self, n: usize) -> Result<&[u8], ProtoError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(ProtoError::Truncated { got: self.bytes.len(), want: self.at.saturating_add(n) });
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn header(&mut self) -> Result<Header, ProtoError> {
        let initial = self.take(1)?[0];
        let (major, info) = (initial >> 5, initial & 0x1f);
        let arg = match info {
            0..=23 => Some(info as u64),
            24..=27 => {
                let n = 1usize << (info - 24);
                Some(self.take(n)?.iter().fold(0u64, |v, b| (v << 8) | *b as u64))
            }
            31 if matches!(major, 2..=5) => None,
            _ => return Err(bad("reserved CBOR additional information")),
        };
        Ok(match major {
            0 | 1 => Header::Int,
            2 | 3 => Header::Str(arg),
            4 => Header::Array(arg),
            5 => Header::Map(arg),
            6 => Header::Tag,
            _ => Header::Simple,
        })
    }

    /// Counts `cost` as walked; stops the walk once past the limit.
    fn charge(&mut self, cost: usize) -> Result<usize, ProtoError> {
        self.walked = self.walked.saturating_add(cost);
        if self.walked > self.limit {
            return Err(ProtoError::TooCostly { cost: self.walked, max: self.limit });
        }
        Ok(cost)
    }

    /// Walks one item and what it holds; its bound.
    fn item(&mut self, depth: usize) -> Result<usize, ProtoError> {
        if depth > MAX_DEPTH {
            return Err(bad("CBOR nested deeper than any record"));
        }
        let cost = match self.header()? {
            Header::Int | Header::Simple => self.charge(SLOT)?,
            Header::Tag => return self.item(depth + 1),
            Header::Str(Some(n)) => {
                let n = usize::try_from(n).map_err(|_| bad("CBOR string longer than memory"))?;
                self.take(n)?;
                self.charge(SLOT + n)?
            }
            Header::Str(None) => {
                let mut len = 0usize;
                while self.peek()? != BREAK {
                    let Header::Str(Some(n)) = self.header()? else {
                        return Err(bad("a chunked CBOR string holds something else"));
                    };
                    let n = usize::try_from(n).map_err(|_| bad("CBOR string longer than memory"))?;
                    self.take(n)?;
                    len = len.saturating_add(n);
                }
                self.at += 1;
                self.charge(SLOT.saturating_add(len.saturating_mul(2)))?
            }
            Header::Array(n) => self.charge(SLOT)?.saturating_add(self.items(n, 1, depth)?),
            Header::Map(n) => self.charge(SLOT)?.saturating_add(self.items(n, 2, depth)?),
        };
        Ok(cost)
    }

    /// The items of an array (`per` 1) or map (`per` 2) of `n` entries, or up to a break.
    fn items(&mut self, n: Option<u64>, per: u64, depth: usize) -> Result<usize, ProtoError> {
        let mut total = 0usize;
        match n {
            Some(n) => {
                let items = n.checked_mul(per).ok_or_else(|| bad("CBOR map too long"))?;
                // Every item takes at least a byte: a count past the end is refused before it
                // is walked.
                if items > (self.bytes.len() - self.at) as u64 {
                    return Err(ProtoError::Truncated { got: self.bytes.len(), want: self.at + items as usize });
                }
                for _ in 0..items {
                    total = total.saturating_add(self.item(depth + 1)?);
                }
            }
            None => {
                let mut count = 0usize;
                while self.peek()? != BREAK {
                    total = total.saturating_add(self.item(depth + 1)?);
                    count += 1;
                }
                self.at += 1;
                // Without a length the container grows by doubling: its slots once more.
                total = total.saturating_add(count.saturating_mul(SLOT));
            }
        }
        Ok(total)
    }
}

/// What decoded `records` occupy on the heap, counted from the values: each record's slot in
/// the `Vec`, every string, byte string and vector with its slots. The bound must never be
/// below it (tests and the fuzz targets check that).
#[doc(hidden)]
pub(crate) fn decoded_heap(records: &[WireRecord]) -> usize {
    let strings = |s: &str| s.len();
    records.iter().fold(size_of_val(records), |acc, r| {
        let m = r.as_message().map_or(0, |m| {
            strings(&m.class)
                + strings(&m.topic)
                + m.payload.len()
                + m.user_properties.iter().map(|(k, v)| super::USER_PROPERTY_COST + k.len() + v.len()).sum::<usize>()
                + m.correlation_data.as_ref().map_or(0, Vec::len)
                + m.content_type.as_deref().map_or(0, strings)
        });
        let g = r.as_gap().map_or(0, |g| strings(&g.class) + 16 * g.ranges.len());
        acc + m + g
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{GapReason, RecordBody, Seq, WireGap, WireMessage};
    use proptest::prelude::*;

    fn cbor<T: serde::Serialize>(value: &T) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::into_writer(value, &mut out).unwrap();
        out
    }

    fn record() -> impl Strategy<Value = WireRecord> {
        let props = prop::collection::vec((".{0,3}", ".{0,3}"), 0..40);
        let message = (".{0,8}", ".{0,20}", prop::collection::vec(any::<u8>(), 0..64), props, any::<bool>()).prop_map(
            |(class, topic, payload, user_properties, extra)| WireMessage {
                class,
                topic,
                payload,
                qos: 1,
                enqueued_ms: 1,
                expires_ms: extra.then_some(5),
                user_properties,
                correlation_data: extra.then(|| vec![1, 2]),
                content_type: extra.then(|| "a".into()),
                schema: None,
            },
        );
        let gap = prop::collection::vec((any::<u64>(), any::<u64>()), 0..20).prop_map(|ranges| WireGap {
            class: "c".into(),
            reason: GapReason::Evicted,
            count: ranges.len() as u64,
            ranges,
        });
        let body = prop_oneof![message.prop_map(RecordBody::Message), gap.prop_map(RecordBody::Gap)];
        (any::<u64>(), body).prop_map(|(seq, body)| WireRecord { seq: Seq(seq), body })
    }

    #[test]
    fn a_control_frame_of_empty_strings_is_bounded_by_its_items_not_its_bytes() {
        let mut hello = crate::proto::Hello {
            versions: vec![],
            epoch: String::new(),
            lanes: vec![],
            models: vec![String::new(); 100_000],
            dicts: vec![],
            caps: vec![],
            down_mark: 0,
            down_window: None,
        };
        let raw = cbor(&crate::proto::Control::Hello(hello.clone()));
        assert!(raw.len() < 110_000, "a byte an empty name");
        let bound = value_bound_up_to(&raw, usize::MAX).unwrap();
        assert!(bound >= 100_000 * 2 * size_of::<String>(), "{bound}: the names' headers, grown by doubling");
        // The walk stops past its limit, having counted more than it.
        let stopped = value_bound_up_to(&raw, 1 << 20).unwrap();
        assert!(stopped > 1 << 20 && stopped < bound);
        hello.models.clear();
        let small = value_bound_up_to(&cbor(&crate::proto::Control::Hello(hello)), usize::MAX).unwrap();
        assert!(small < 2048, "{small}");
    }

    proptest! {
        #[test]
        fn the_bound_is_never_below_what_decoding_takes(records in prop::collection::vec(record(), 0..30)) {
            let raw = cbor(&records);
            let bound = decoded_bound(&raw).unwrap();
            let decoded: Vec<WireRecord> = ciborium::from_reader(&raw[..]).unwrap();
            prop_assert!(bound >= decoded_heap(&decoded), "bound {bound} < heap {}", decoded_heap(&decoded));
        }

        #[test]
        fn garbage_is_refused_or_bounded_never_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decoded_bound(&bytes);
        }
    }

    #[test]
    fn empty_user_property_pairs_are_charged_for_what_they_decode_to() {
        let pairs = vec![(String::new(), String::new()); 10_000];
        let records = vec![WireRecord::message(
            Seq(1),
            WireMessage {
                class: "c".into(),
                topic: "t".into(),
                payload: Vec::new(),
                qos: 0,
                enqueued_ms: 0,
                expires_ms: None,
                user_properties: pairs,
                correlation_data: None,
                content_type: None,
                schema: None,
            },
        )];
        let raw = cbor(&records);
        assert!(raw.len() < 31_000, "{} bytes on the wire", raw.len());
        // 480 KB of Strings from 30 KB of CBOR: the bound sees it.
        assert!(decoded_bound(&raw).unwrap() >= 10_000 * 48);
    }

    #[test]
    fn a_walk_with_a_limit_stops_past_it() {
        let records = vec![
            WireRecord::gap(
                Seq(1),
                WireGap { class: "c".into(), reason: GapReason::Refused, ranges: vec![(1, 1); 1000], count: 1 }
            );
            50
        ];
        let raw = cbor(&records);
        let whole = decoded_bound(&raw).unwrap();
        assert_eq!(decoded_bound_up_to(&raw, whole).unwrap(), whole);
        let stopped = decoded_bound_up_to(&raw, whole / 10).unwrap();
        assert!(stopped > whole / 10 && stopped < whole / 5, "{stopped} of {whole}");
    }

    #[test]
    fn counts_past_the_end_and_deep_nesting_are_refused_cheaply() {
        // An array claiming 2^32 records in 9 bytes.
        let huge = [0x9b, 0, 0, 0, 1, 0, 0, 0, 0];
        assert!(matches!(decoded_bound(&huge), Err(ProtoError::Truncated { .. })));
        let mut deep = vec![0x81u8; 40];
        deep.push(0x00);
        assert!(decoded_bound(&deep).unwrap_err().to_string().contains("nested deeper"));
        assert!(decoded_bound(&[0x01]).unwrap_err().to_string().contains("not a CBOR array"));
    }
}
