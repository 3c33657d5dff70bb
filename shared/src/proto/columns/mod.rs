//! Column-wise batch bodies (protocol version 6 on): what `compress` sends zstd-compressed
//! instead of the CBOR array of records, when the session speaks version 6 or later.
//!
//! Records are taken apart into streams, each of one kind of value, so zstd sees runs of alike
//! bytes: seqs and enqueue times, classes and topics as ids into batch tables, and each
//! payload that is compact JSON as a *shape* (its text with every scalar value cut out: keys,
//! brackets and punctuation) plus one column per value slot of the shape. A number column
//! holds each value's decimal scale and its digits; a string column holds an id into the
//! slot's own table of the strings it has seen, the string text (as escaped in the payload)
//! only the first time.
//!
//! Two formats, named by the body's first byte ([`ints::Format`]): 1 (version 6) writes
//! integers as bytes and varints; 2 (version 7) bit-packs each integer column, puts a number
//! column's values at one scale (`14.2` next to `14.25` is 1420 next to 1425), and names the
//! schema each message was validated against through a batch table.
//!
//! Byte for byte: a payload is cut into a shape only if putting it back yields exactly its
//! bytes (compact JSON, numbers without exponents, leading zeros or `-0`, at most 18 digits);
//! any other payload, and the properties and gaps, travel as they are. The decoder checks
//! every length and id against what is there, allocates nothing a count claims before the
//! bytes for it are read, and stops at `max_out` bytes of records.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

mod bin;
mod dict;
mod ints;
mod json;

pub use bin::{Int, Len, NoShapes, Shaper, Shapes};
pub use dict::dictionary;
pub use ints::Format;

use super::varint::put as put_varint;
use super::{ProtoError, RecordBody, SchemaRef, Seq, WireGap, WireMessage, WireRecord};
use ints::{IntsIn, IntsOut, V1};
use json::{SLOT, Val, cut};

/// Shapes one batch keeps; a payload of a shape beyond these travels whole.
const MAX_SHAPES: usize = 256;

const T_NUM: u8 = 0;
const T_STR: u8 = 1;
const T_TRUE: u8 = 2;
const T_FALSE: u8 = 3;
const T_NULL: u8 = 4;

/// A number column whose values could not be put at one scale (one would overflow an i64).
const UNSCALED: u8 = 255;

/// The largest power of ten a number column may be sent relative to its records' enqueue
/// times in ms by (format 2).
const MAX_CLOCK_EXP: u32 = 9;

impl Format {
    fn byte(self) -> u8 {
        match self {
            Format::V1 => 1,
            Format::V2 => 2,
            Format::V3 => 3,
        }
    }

    /// The format a session of protocol `version` sends, if any.
    pub fn of_version(version: u16) -> Option<Format> {
        match version {
            v if v >= super::SHAPES_VERSION => Some(Format::V3),
            v if v >= super::SCHEMA_VERSION => Some(Format::V2),
            v if v >= super::COLUMNS_VERSION => Some(Format::V1),
            _ => None,
        }
    }
}

/// What a record carries beyond class, topic, payload, QoS and enqueue time. In format 1 the
/// schema rides here too (a version 6 bridge skips the field); format 2 has a table for it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Props {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    user_properties: Vec<(String, String)>,
    #[serde(default, with = "serde_bytes", skip_serializing_if = "Option::is_none")]
    correlation_data: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    schema: Option<SchemaRef>,
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A batch-local table of strings: each new one gets the next id.
#[derive(Default)]
struct Table<'a> {
    ids: HashMap<&'a [u8], u64>,
    /// The table's entries, `len bytes` each, in id order.
    entries: Vec<u8>,
    count: u64,
}

impl<'a> Table<'a> {
    fn id(&mut self, s: &'a [u8]) -> u64 {
        *self.ids.entry(s).or_insert_with(|| {
            put_bytes(&mut self.entries, s);
            self.count += 1;
            self.count - 1
        })
    }

    fn bytes(&self) -> Vec<u8> {
        let mut head = Vec::new();
        put_varint(&mut head, self.count);
        head.extend_from_slice(&self.entries);
        head
    }
}

/// One value slot of a shape: its streams.
struct Slot<'a> {
    tags: IntsOut,
    scales: IntsOut,
    /// Mantissas and scales, written at the end (format 2 puts them at one scale first), and
    /// the enqueue time (ms) of the record each is in.
    nums: Vec<(i64, u8, i64)>,
    /// String ids: 0 for a string not seen before in this slot (its text in `lits`), k for the
    /// k-th string the slot has seen.
    ids: IntsOut,
    lits: Vec<u8>,
    seen: HashMap<&'a [u8], u64>,
}

impl Slot<'_> {
    fn new(f: Format) -> Self {
        Slot {
            tags: IntsOut::new(f, V1::Byte),
            scales: IntsOut::new(f, V1::Byte),
            nums: Vec::new(),
            ids: IntsOut::new(f, V1::Varint),
            lits: Vec::new(),
            seen: HashMap::new(),
        }
    }

    fn nums(&self, f: Format) -> Vec<u8> {
        let mut col = IntsOut::new(f, V1::Signed);
        if f == Format::V1 {
            self.nums.iter().for_each(|(m, _, _)| col.push(*m));
            return col.finish();
        }
        let top = self.nums.iter().map(|(_, s, _)| *s).max().unwrap_or(0);
        let scaled: Option<Vec<i64>> =
            self.nums.iter().map(|(m, s, _)| m.checked_mul(10i64.checked_pow(u32::from(top - s))?)).collect();
        let (head, vals) = match scaled {
            Some(v) => (top, v),
            None => (UNSCALED, self.nums.iter().map(|(m, _, _)| *m).collect()),
        };
        // A timestamp in a payload follows the record's enqueue time more closely than the
        // timestamp before it: sent as its difference from that time in ms times 10^k (k up
        // to 9: ms to ps), when that packs smaller. The clock byte says which: 0 for none.
        let mut best = (0u8, ints::pack(&vals));
        for k in 0..=MAX_CLOCK_EXP {
            let unit = 10i64.pow(k);
            let off: Vec<i64> =
                vals.iter().zip(&self.nums).map(|(v, (_, _, ms))| v.wrapping_sub(ms.wrapping_mul(unit))).collect();
            let packed = ints::pack(&off);
            if packed.len() < best.1.len() {
                best = (k as u8 + 1, packed);
            }
        }
        let mut out = vec![head, best.0];
        out.extend(best.1);
        out
    }
}

/// What a format 2 slot holds, its stream's first byte: most slots hold one kind of value,
/// and leave out the tags and the columns of the other kind.
const ONLY_NUMBERS: u8 = 0;
const ONLY_STRINGS: u8 = 1;
const MIXED: u8 = 2;

impl Slot<'_> {
    /// The slot as one format 2 stream: its kind, then the columns it needs, the strings last.
    fn v2(self) -> Vec<u8> {
        let kind = if self.tags.only(i64::from(T_NUM)) {
            ONLY_NUMBERS
        } else if self.tags.only(i64::from(T_STR)) {
            ONLY_STRINGS
        } else {
            MIXED
        };
        let nums = self.nums(Format::V2);
        let mut out = vec![kind];
        if kind == MIXED {
            out.extend(self.tags.finish());
        }
        if kind != ONLY_STRINGS {
            out.extend(self.scales.finish());
            out.extend(nums);
        }
        if kind != ONLY_NUMBERS {
            out.extend(self.ids.finish());
            out.extend(self.lits);
        }
        out
    }
}

/// The column-wise body of `records` in format `f`, binary payloads whole.
pub fn encode(records: &[WireRecord], f: Format) -> Vec<u8> {
    encode_with(records, f, &NoShapes)
}

/// The column-wise body of `records` in format `f`; in format 3, a binary payload that names
/// its schema is taken apart as `walker` walks it.
pub(crate) fn encode_with(records: &[WireRecord], f: Format, walker: &dyn Shapes) -> Vec<u8> {
    let (mut seqs, mut kinds, mut gaps) = (IntsOut::new(f, V1::Delta), IntsOut::new(f, V1::Byte), Vec::new());
    let (mut class_ids, mut topic_ids) = (IntsOut::new(f, V1::Varint), IntsOut::new(f, V1::Varint));
    let (mut qos, mut times, mut props) = (IntsOut::new(f, V1::Byte), IntsOut::new(f, V1::Signed), Vec::new());
    let (mut shape_ids, mut schema_ids, mut raws) =
        (IntsOut::new(f, V1::Varint), IntsOut::new(f, V1::Varint), Vec::new());
    let (mut classes, mut topics, mut shapes, mut schemas) =
        (Table::default(), Table::default(), Table::default(), Table::default());
    let mut schema_cbor: Vec<Vec<u8>> = Vec::new();
    let mut shape_texts: Vec<Vec<u8>> = Vec::new();
    let mut slots: Vec<Vec<Slot<'_>>> = Vec::new();
    let mut cuts = Vec::with_capacity(records.len());
    for r in records {
        cuts.push(match &r.body {
            RecordBody::Message(m) => cut(&m.payload).or_else(|| {
                let schema = m.schema.as_ref().filter(|_| f == Format::V3)?;
                let mut shaper = Shaper::default();
                walker.cut(schema, &m.payload, &mut shaper).then(|| shaper.finish(&m.payload))?
            }),
            RecordBody::Gap(_) => None,
        });
        if let RecordBody::Message(WireMessage { schema: Some(s), .. }) = &r.body
            && f != Format::V1
        {
            let mut cbor = Vec::new();
            let _ = ciborium::into_writer(s, &mut cbor);
            schema_cbor.push(cbor);
        }
    }
    let mut next_schema = schema_cbor.iter();
    for (i, (r, cut)) in records.iter().zip(cuts.iter()).enumerate() {
        seqs.push(r.seq.0 as i64);
        let m = match &r.body {
            RecordBody::Gap(g) => {
                kinds.push(1);
                let mut cbor = Vec::new();
                let _ = ciborium::into_writer(g, &mut cbor);
                put_bytes(&mut gaps, &cbor);
                continue;
            }
            RecordBody::Message(m) => m,
        };
        kinds.push(0);
        class_ids.push(classes.id(m.class.as_bytes()) as i64);
        topic_ids.push(topics.id(m.topic.as_bytes()) as i64);
        qos.push(i64::from(m.qos));
        times.push(m.enqueued_ms as i64);
        let schema_in_props = f == Format::V1 && m.schema.is_some();
        if f != Format::V1 {
            // The CBOR lives in `schema_cbor` for the whole function: the table may borrow it.
            let id = m.schema.as_ref().and_then(|_| next_schema.next()).map_or(0, |c| schemas.id(c) + 1);
            schema_ids.push(id as i64);
        }
        if m.expires_ms.is_some()
            || !m.user_properties.is_empty()
            || m.correlation_data.is_some()
            || m.content_type.is_some()
            || schema_in_props
        {
            let p = Props {
                expires_ms: m.expires_ms,
                user_properties: m.user_properties.clone(),
                correlation_data: m.correlation_data.clone(),
                content_type: m.content_type.clone(),
                schema: m.schema.clone().filter(|_| schema_in_props),
            };
            let mut cbor = Vec::new();
            let _ = ciborium::into_writer(&p, &mut cbor);
            put_varint(&mut props, i as u64);
            put_bytes(&mut props, &cbor);
        }
        let shaped = cut.as_ref().and_then(|(shape, vals)| {
            let known = shapes.ids.contains_key(shape.as_slice());
            (known || shape_texts.len() < MAX_SHAPES).then_some((shape, vals))
        });
        let Some((shape, vals)) = shaped else {
            shape_ids.push(0);
            put_bytes(&mut raws, &m.payload);
            continue;
        };
        let before = shapes.count;
        // The shape's bytes live in `cuts` for the whole function: the table may borrow them.
        let id = shapes.id(shape.as_slice());
        if shapes.count > before {
            shape_texts.push(shape.clone());
            slots.push((0..vals.len()).map(|_| Slot::new(f)).collect());
        }
        shape_ids.push(id as i64 + 1);
        for (slot, v) in slots[id as usize].iter_mut().zip(vals) {
            match v {
                Val::Num { mantissa, scale } => {
                    slot.tags.push(i64::from(T_NUM));
                    slot.scales.push(i64::from(*scale));
                    slot.nums.push((*mantissa, *scale, m.enqueued_ms as i64));
                }
                Val::Str(s) => {
                    slot.tags.push(i64::from(T_STR));
                    let next = slot.seen.len() as u64 + 1;
                    match slot.seen.get(s) {
                        Some(k) => slot.ids.push(*k as i64),
                        None => {
                            slot.ids.push(0);
                            put_bytes(&mut slot.lits, s);
                            slot.seen.insert(s, next);
                        }
                    }
                }
                Val::True => slot.tags.push(i64::from(T_TRUE)),
                Val::False => slot.tags.push(i64::from(T_FALSE)),
                Val::Null => slot.tags.push(i64::from(T_NULL)),
            }
        }
    }
    let mut streams: Vec<(&'static str, Vec<u8>)> = vec![
        ("seqs", seqs.finish()),
        ("kinds", kinds.finish()),
        ("gaps", gaps),
        ("classes", classes.bytes()),
        ("class ids", class_ids.finish()),
        ("topics", topics.bytes()),
        ("topic ids", topic_ids.finish()),
        ("qos", qos.finish()),
        ("times", times.finish()),
        ("props", props),
        ("shapes", shapes.bytes()),
        ("shape ids", shape_ids.finish()),
        ("payloads", raws),
    ];
    if f != Format::V1 {
        streams.push(("schemas", schemas.bytes()));
        streams.push(("schema ids", schema_ids.finish()));
    }
    for shape in slots {
        for slot in shape {
            if f != Format::V1 {
                streams.push(("slot", slot.v2()));
                continue;
            }
            let nums = slot.nums(f);
            streams.extend([
                ("slot tags", slot.tags.finish()),
                ("slot scales", slot.scales.finish()),
                ("slot numbers", nums),
                ("slot string ids", slot.ids.finish()),
                ("slot strings", slot.lits),
            ]);
        }
    }
    let mut out = vec![f.byte()];
    put_varint(&mut out, records.len() as u64);
    for (_, s) in &streams {
        put_bytes(&mut out, s);
    }
    out
}

/// A cursor over one stream; every read checks what is left.
struct Rd<'a> {
    b: &'a [u8],
    what: &'static str,
}

fn bad(what: &str, detail: impl std::fmt::Display) -> ProtoError {
    ProtoError::Decode(format!("column batch, {what}: {detail}"))
}

impl<'a> Rd<'a> {
    fn new(b: &'a [u8], what: &'static str) -> Self {
        Rd { b, what }
    }

    fn byte(&mut self) -> Result<u8, ProtoError> {
        let (&x, rest) = self.b.split_first().ok_or_else(|| bad(self.what, "ends early"))?;
        self.b = rest;
        Ok(x)
    }

    fn varint(&mut self) -> Result<u64, ProtoError> {
        super::varint::take(&mut self.b)
            .map_err(|cut| bad(self.what, if cut { "ends early" } else { "a varint longer than 10 bytes" }))
    }

    fn bytes(&mut self) -> Result<&'a [u8], ProtoError> {
        let n = self.varint()?;
        if n > self.b.len() as u64 {
            return Err(bad(self.what, format!("{n} bytes claimed, {} left", self.b.len())));
        }
        let (head, rest) = self.b.split_at(n as usize);
        self.b = rest;
        Ok(head)
    }

    fn done(&self) -> Result<(), ProtoError> {
        if self.b.is_empty() { Ok(()) } else { Err(bad(self.what, format!("{} bytes left over", self.b.len()))) }
    }
}

/// A table's entries, each checked to be there (a count above the bytes is a lie found before
/// anything is kept).
fn table<'a>(b: &'a [u8], what: &'static str) -> Result<Vec<&'a [u8]>, ProtoError> {
    let mut r = Rd::new(b, what);
    let n = r.varint()?;
    if n > r.b.len() as u64 {
        return Err(bad(what, format!("{n} entries in {} bytes", r.b.len())));
    }
    let out = (0..n).map(|_| r.bytes()).collect::<Result<Vec<_>, _>>()?;
    r.done()?;
    Ok(out)
}

fn utf8(b: &[u8], what: &'static str) -> Result<String, ProtoError> {
    String::from_utf8(b.to_vec()).map_err(|e| bad(what, e))
}

/// Bytes of records decoded so far, against the most a batch may give.
struct Budget {
    used: usize,
    max: usize,
}

impl Budget {
    fn spend(&mut self, n: usize) -> Result<(), ProtoError> {
        self.used = self.used.saturating_add(n);
        if self.used > self.max {
            return Err(ProtoError::TooLargeDecompressed { max: self.max });
        }
        Ok(())
    }
}

fn pick<'a>(t: &[&'a [u8]], id: u64, what: &'static str) -> Result<&'a [u8], ProtoError> {
    t.get(id as usize).copied().ok_or_else(|| bad(what, format!("id {id} of {}", t.len())))
}

struct SlotRd<'a> {
    tags: IntsIn<'a>,
    scales: IntsIn<'a>,
    /// The column's scale in format 2 ([`UNSCALED`] if none), 0 in format 1.
    top: u8,
    /// Format 2: 0, or k + 1 when the column holds each value less its record's enqueue time
    /// in ms times 10^k.
    clock: u8,
    nums: IntsIn<'a>,
    ids: IntsIn<'a>,
    lits: Rd<'a>,
    seen: Vec<&'a [u8]>,
}

impl<'a> SlotRd<'a> {
    /// A format 2 slot's stream.
    fn v2(mut r: Rd<'a>) -> Result<Self, ProtoError> {
        let kind = r.byte()?;
        if kind > MIXED {
            return Err(bad("slot", format!("kind {kind}")));
        }
        let mixed = (kind == MIXED).then(|| IntsIn::packed(&mut r)).transpose()?;
        let (scales, top, nums) = if kind == ONLY_STRINGS {
            (IntsIn::constant("slot scales", 0, 0), (0, 0), IntsIn::constant("slot numbers", 0, 0))
        } else {
            r.what = "slot scales";
            let scales = IntsIn::packed(&mut r)?;
            r.what = "slot numbers";
            let top = r.byte()?;
            let clock = r.byte()?;
            if u32::from(clock) > MAX_CLOCK_EXP + 1 {
                return Err(bad("slot numbers", format!("clock {clock}")));
            }
            (scales, (top, clock), IntsIn::packed(&mut r)?)
        };
        let ids = if kind == ONLY_NUMBERS {
            IntsIn::constant("slot string ids", 0, 0)
        } else {
            r.what = "slot string ids";
            IntsIn::packed(&mut r)?
        };
        let tags = match (kind, mixed) {
            (_, Some(tags)) => tags,
            (ONLY_NUMBERS, None) => IntsIn::constant("slot tags", i64::from(T_NUM), nums.len()),
            _ => IntsIn::constant("slot tags", i64::from(T_STR), ids.len()),
        };
        r.what = "slot strings";
        Ok(SlotRd { tags, scales, top: top.0, clock: top.1, nums, ids, lits: r, seen: Vec::new() })
    }

    /// The next number's mantissa and scale, in a record enqueued at `ms`.
    fn number(&mut self, f: Format, ms: i64) -> Result<(i64, u8), ProtoError> {
        let (mut v, scale) = (self.nums.next()?, self.scales.byte()?);
        if self.clock > 0 {
            v = v.wrapping_add(ms.wrapping_mul(10i64.pow(u32::from(self.clock) - 1)));
        }
        if f == Format::V1 || self.top == UNSCALED {
            return Ok((v, scale));
        }
        let pow = self
            .top
            .checked_sub(scale)
            .and_then(|d| 10i64.checked_pow(u32::from(d)))
            .ok_or_else(|| bad("slot scales", format!("scale {scale} above the column's {}", self.top)))?;
        if v % pow != 0 {
            return Err(bad("slot numbers", format!("{v} is not at scale {scale}")));
        }
        Ok((v / pow, scale))
    }
}

impl<'a> SlotRd<'a> {
    /// The slot's next value, in a record enqueued at `ms`.
    fn val(&mut self, f: Format, ms: i64) -> Result<Val<'a>, ProtoError> {
        Ok(match self.tags.byte()? {
            T_NUM => {
                let (mantissa, scale) = self.number(f, ms)?;
                Val::Num { mantissa, scale }
            }
            T_STR => Val::Str(match self.ids.next()? as u64 {
                0 => {
                    let t = self.lits.bytes()?;
                    self.seen.push(t);
                    t
                }
                k => self.seen.get(k as usize - 1).copied().ok_or_else(|| bad("slot string ids", k))?,
            }),
            T_TRUE => Val::True,
            T_FALSE => Val::False,
            T_NULL => Val::Null,
            t => return Err(bad("slot tags", format!("tag {t}"))),
        })
    }
}

/// The records of a column-wise body; at most `max_out` bytes of records in all, as
/// `compress::records_cost` counts them (each record's struct, its strings and payload).
pub(crate) fn decode<'a>(raw: &'a [u8], max_out: usize) -> Result<Vec<WireRecord>, ProtoError> {
    let mut r = Rd::new(raw, "head");
    let f = match r.byte()? {
        1 => Format::V1,
        2 => Format::V2,
        3 => Format::V3,
        other => return Err(bad("head", format!("format {other}, not one this build knows"))),
    };
    let n = r.varint()?;
    // Every record takes a byte in the kinds stream at least (a bit, in format 2).
    if n > (raw.len() as u64).saturating_mul(8) {
        return Err(bad("head", format!("{n} records in {} bytes", raw.len())));
    }
    let mut stream = |what| r.bytes().map(|b| Rd::new(b, what));
    let ints = |rd: Rd<'a>, v1| IntsIn::new(rd.b, rd.what, f, v1);
    let mut seqs = ints(stream("seqs")?, V1::Delta)?;
    let mut kinds = ints(stream("kinds")?, V1::Byte)?;
    let mut gaps = stream("gaps")?;
    let classes = table(stream("classes")?.b, "classes")?;
    let mut class_ids = ints(stream("class ids")?, V1::Varint)?;
    let topics = table(stream("topics")?.b, "topics")?;
    let mut topic_ids = ints(stream("topic ids")?, V1::Varint)?;
    let mut qos = ints(stream("qos")?, V1::Byte)?;
    let mut times = ints(stream("times")?, V1::Signed)?;
    let mut props = stream("props")?;
    let shapes = table(stream("shapes")?.b, "shapes")?;
    let mut shape_ids = ints(stream("shape ids")?, V1::Varint)?;
    let mut raws = stream("payloads")?;
    let (schemas, mut schema_ids) = match f {
        Format::V1 => (Vec::new(), None),
        Format::V2 | Format::V3 => {
            let t = table(stream("schemas")?.b, "schemas")?;
            let refs = t
                .iter()
                .map(|c| {
                    let s: SchemaRef = ciborium::from_reader(*c).map_err(|e| bad("schemas", e))?;
                    s.check().map_err(|e| bad("schemas", e))?;
                    Ok(s)
                })
                .collect::<Result<Vec<_>, ProtoError>>()?;
            (refs, Some(ints(stream("schema ids")?, V1::Varint)?))
        }
    };
    // A shape is JSON text with slots, or in format 3 a binary shape's ops.
    let mut binary: Vec<Option<Vec<bin::Op<'_>>>> = Vec::with_capacity(shapes.len().min(MAX_SHAPES));
    let mut slots: Vec<Vec<SlotRd<'_>>> = Vec::with_capacity(shapes.len().min(MAX_SHAPES));
    for s in &shapes {
        let ops = match s.first() {
            Some(&bin::BIN) if f == Format::V3 => Some(bin::ops(s).map_err(|e| bad("shapes", e))?),
            _ => None,
        };
        let count = match &ops {
            Some(ops) => bin::slots(ops),
            None => s.iter().filter(|b| **b == SLOT).count(),
        };
        binary.push(ops);
        let mut these = Vec::with_capacity(count.min(raw.len()));
        for _ in 0..count {
            if f != Format::V1 {
                these.push(SlotRd::v2(stream("slot")?)?);
                continue;
            }
            let tags = ints(stream("slot tags")?, V1::Byte)?;
            let scales = ints(stream("slot scales")?, V1::Byte)?;
            these.push(SlotRd {
                tags,
                scales,
                top: 0,
                clock: 0,
                nums: ints(stream("slot numbers")?, V1::Signed)?,
                ids: ints(stream("slot string ids")?, V1::Varint)?,
                lits: stream("slot strings")?,
                seen: Vec::new(),
            });
        }
        slots.push(these);
    }
    r.done()?;
    let mut budget = Budget { used: 0, max: max_out };
    let mut next_props = if props.b.is_empty() { None } else { Some(props.varint()?) };
    let each = size_of::<WireRecord>();
    let mut records = Vec::with_capacity((n as usize).min(max_out / each));
    for i in 0..n {
        // As `compress::records_cost` counts: a record's struct, then the bytes it owns.
        budget.spend(each)?;
        let seq = Seq(seqs.next()? as u64);
        if kinds.byte()? == 1 {
            let g: WireGap = ciborium::from_reader(gaps.bytes()?).map_err(|e| bad("gaps", e))?;
            budget.spend(g.ranges.len() * 16 + g.class.len())?;
            records.push(WireRecord::gap(seq, g));
            continue;
        }
        let class = pick(&classes, class_ids.next()? as u64, "class ids")?;
        let topic = pick(&topics, topic_ids.next()? as u64, "topic ids")?;
        budget.spend(class.len() + topic.len())?;
        let q = qos.byte()?;
        let ms = times.next()?;
        let mut m = WireMessage {
            class: utf8(class, "classes")?,
            topic: utf8(topic, "topics")?,
            payload: Vec::new(),
            qos: q,
            enqueued_ms: ms as u64,
            expires_ms: None,
            user_properties: Vec::new(),
            correlation_data: None,
            content_type: None,
            schema: None,
        };
        if let Some(ids) = schema_ids.as_mut() {
            m.schema = match ids.next()? as u64 {
                0 => None,
                k => Some(schemas.get(k as usize - 1).cloned().ok_or_else(|| bad("schema ids", k))?),
            };
            budget.spend(m.schema.as_ref().map_or(0, |s| s.subject.len() + s.id.len()))?;
        }
        if next_props == Some(i) {
            let cbor = props.bytes()?;
            budget.spend(cbor.len())?;
            let p: Props = ciborium::from_reader(cbor).map_err(|e| bad("props", e))?;
            (m.expires_ms, m.user_properties, m.correlation_data, m.content_type) =
                (p.expires_ms, p.user_properties, p.correlation_data, p.content_type);
            if let Some(s) = p.schema {
                s.check().map_err(|e| bad("props", e))?;
                m.schema = Some(s);
            }
            next_props = if props.b.is_empty() { None } else { Some(props.varint()?) };
        }
        match shape_ids.next()? as u64 {
            0 => {
                let p = raws.bytes()?;
                budget.spend(p.len())?;
                m.payload = p.to_vec();
            }
            id => {
                let shape = pick(&shapes, id - 1, "shape ids")?;
                let these = &mut slots[id as usize - 1];
                // What is left of `max_out` bounds the payload while it is put together: a shape
                // of many slots repeating one long string would otherwise grow it first.
                let room = budget.max.saturating_sub(budget.used);
                let too_large = || ProtoError::TooLargeDecompressed { max: max_out };
                if let Some(ops) = &binary[id as usize - 1] {
                    let mut k = 0;
                    bin::render(ops, &mut m.payload, (room, max_out), || {
                        k += 1;
                        these[k - 1].val(f, ms)
                    })?;
                } else {
                    let mut k = 0;
                    for &b in shape {
                        if m.payload.len() > room {
                            return Err(too_large());
                        }
                        if b != SLOT {
                            m.payload.push(b);
                            continue;
                        }
                        let v = these[k].val(f, ms)?;
                        k += 1;
                        json::put(&v, &mut m.payload).ok_or_else(|| bad("slot scales", "over 18"))?;
                    }
                }
                budget.spend(m.payload.len())?;
            }
        }
        records.push(WireRecord::message(seq, m));
    }
    for s in [&seqs, &kinds, &class_ids, &topic_ids, &qos, &times, &shape_ids] {
        s.done()?;
    }
    for s in [&gaps, &props, &raws] {
        s.done()?;
    }
    if let Some(ids) = &schema_ids {
        ids.done()?;
    }
    for s in slots.iter().flatten() {
        for r in [&s.tags, &s.scales, &s.nums, &s.ids] {
            r.done()?;
        }
        s.lits.done()?;
    }
    Ok(records)
}

#[cfg(test)]
pub(crate) mod tests;
