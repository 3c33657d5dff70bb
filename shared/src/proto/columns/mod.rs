//! Column-wise batch bodies (protocol version 6): what `compress` sends zstd-compressed instead
//! of the CBOR array of records, when the session speaks version 6.
//!
//! Records are taken apart into streams, each of one kind of value, so zstd sees runs of alike
//! bytes: seqs and enqueue times as deltas, classes and topics as ids into batch tables, and
//! each payload that is compact JSON as a *shape* (its text with every scalar value cut out:
//! keys, brackets and punctuation) plus one column per value slot of the shape. A number
//! column holds each value's decimal scale and its digits as a delta from the slot's value
//! before; a string column holds an id into the slot's own table of the strings it has seen,
//! the string text (as escaped in the payload) only the first time.
//!
//! Byte for byte: a payload is cut into a shape only if putting it back yields exactly its
//! bytes (compact JSON, numbers without exponents, leading zeros or `-0`, at most 18 digits);
//! any other payload, and the properties and gaps, travel as they are. The decoder checks
//! every length and id against what is there, allocates nothing a count claims before the
//! bytes for it are read, and stops at `max_out` bytes of records.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

mod json;

use super::{ProtoError, RecordBody, WireGap, WireMessage, WireRecord};
use json::{SLOT, Val, cut, render};

const FORMAT: u8 = 1;
/// Shapes one batch keeps; a payload of a shape beyond these travels whole.
const MAX_SHAPES: usize = 256;

const T_NUM: u8 = 0;
const T_STR: u8 = 1;
const T_TRUE: u8 = 2;
const T_FALSE: u8 = 3;
const T_NULL: u8 = 4;

/// What a record carries beyond class, topic, payload, QoS and enqueue time.
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
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_signed(out: &mut Vec<u8>, v: i64) {
    put_varint(out, ((v << 1) ^ (v >> 63)) as u64);
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
}

/// One value slot of a shape: its streams, and what the next value is a delta from.
#[derive(Default)]
struct Slot<'a> {
    tags: Vec<u8>,
    scales: Vec<u8>,
    nums: Vec<u8>,
    /// String ids: 0 for a string not seen before in this slot (its text in `lits`), k for the
    /// k-th string the slot has seen.
    ids: Vec<u8>,
    lits: Vec<u8>,
    last: i64,
    seen: HashMap<&'a [u8], u64>,
}

/// The column-wise body of `records`.
pub fn encode(records: &[WireRecord]) -> Vec<u8> {
    let (mut seqs, mut kinds, mut gaps, mut class_ids, mut topic_ids) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut qos, mut times, mut props, mut shape_ids, mut raws) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut classes, mut topics, mut shapes) = (Table::default(), Table::default(), Table::default());
    let mut shape_texts: Vec<Vec<u8>> = Vec::new();
    let mut slots: Vec<Vec<Slot<'_>>> = Vec::new();
    let (mut last_seq, mut last_ms) = (0u64, 0i64);
    let mut cuts = Vec::with_capacity(records.len());
    for r in records {
        cuts.push(match &r.body {
            RecordBody::Message(m) => cut(&m.payload),
            RecordBody::Gap(_) => None,
        });
    }
    for (i, (r, cut)) in records.iter().zip(cuts.iter()).enumerate() {
        put_varint(&mut seqs, r.seq.wrapping_sub(last_seq));
        last_seq = r.seq;
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
        put_varint(&mut class_ids, classes.id(m.class.as_bytes()));
        put_varint(&mut topic_ids, topics.id(m.topic.as_bytes()));
        qos.push(m.qos);
        put_signed(&mut times, (m.enqueued_ms as i64).wrapping_sub(last_ms));
        last_ms = m.enqueued_ms as i64;
        if m.expires_ms.is_some()
            || !m.user_properties.is_empty()
            || m.correlation_data.is_some()
            || m.content_type.is_some()
        {
            let p = Props {
                expires_ms: m.expires_ms,
                user_properties: m.user_properties.clone(),
                correlation_data: m.correlation_data.clone(),
                content_type: m.content_type.clone(),
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
            put_varint(&mut shape_ids, 0);
            put_bytes(&mut raws, &m.payload);
            continue;
        };
        let before = shapes.count;
        // The shape's bytes live in `cuts` for the whole function: the table may borrow them.
        let id = shapes.id(shape.as_slice());
        if shapes.count > before {
            shape_texts.push(shape.clone());
            slots.push((0..vals.len()).map(|_| Slot::default()).collect());
        }
        put_varint(&mut shape_ids, id + 1);
        for (slot, v) in slots[id as usize].iter_mut().zip(vals) {
            match v {
                Val::Num { mantissa, scale } => {
                    slot.tags.push(T_NUM);
                    slot.scales.push(*scale);
                    put_signed(&mut slot.nums, mantissa.wrapping_sub(slot.last));
                    slot.last = *mantissa;
                }
                Val::Str(s) => {
                    slot.tags.push(T_STR);
                    let next = slot.seen.len() as u64 + 1;
                    match slot.seen.get(s) {
                        Some(k) => put_varint(&mut slot.ids, *k),
                        None => {
                            put_varint(&mut slot.ids, 0);
                            put_bytes(&mut slot.lits, s);
                            slot.seen.insert(s, next);
                        }
                    }
                }
                Val::True => slot.tags.push(T_TRUE),
                Val::False => slot.tags.push(T_FALSE),
                Val::Null => slot.tags.push(T_NULL),
            }
        }
    }
    let mut out = vec![FORMAT];
    put_varint(&mut out, records.len() as u64);
    let mut stream = |s: &[u8]| put_bytes(&mut out, s);
    for s in [&seqs, &kinds, &gaps] {
        stream(s);
    }
    let table = |t: &Table<'_>| {
        let mut head = Vec::new();
        put_varint(&mut head, t.count);
        head.extend_from_slice(&t.entries);
        head
    };
    let (ct, tt, st) = (table(&classes), table(&topics), table(&shapes));
    for s in [&ct, &class_ids, &tt, &topic_ids, &qos, &times, &props, &st, &shape_ids, &raws] {
        stream(s);
    }
    for shape in &slots {
        for slot in shape {
            for s in [&slot.tags, &slot.scales, &slot.nums, &slot.ids, &slot.lits] {
                stream(s);
            }
        }
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
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad(self.what, "a varint longer than 10 bytes"))
    }

    fn signed(&mut self) -> Result<i64, ProtoError> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
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
    tags: Rd<'a>,
    scales: Rd<'a>,
    nums: Rd<'a>,
    ids: Rd<'a>,
    lits: Rd<'a>,
    last: i64,
    seen: Vec<&'a [u8]>,
}

/// The records of a column-wise body; at most `max_out` bytes of topics, classes, payloads and
/// properties in all.
pub fn decode(raw: &[u8], max_out: usize) -> Result<Vec<WireRecord>, ProtoError> {
    let mut r = Rd::new(raw, "head");
    if r.byte()? != FORMAT {
        return Err(bad("head", "an unknown format"));
    }
    let n = r.varint()?;
    // Every record takes a byte in the kinds stream at least.
    if n > raw.len() as u64 {
        return Err(bad("head", format!("{n} records in {} bytes", raw.len())));
    }
    let mut stream = |what| r.bytes().map(|b| Rd::new(b, what));
    let (mut seqs, mut kinds, mut gaps) = (stream("seqs")?, stream("kinds")?, stream("gaps")?);
    let classes = table(stream("classes")?.b, "classes")?;
    let mut class_ids = stream("class ids")?;
    let topics = table(stream("topics")?.b, "topics")?;
    let mut topic_ids = stream("topic ids")?;
    let (mut qos, mut times, mut props) = (stream("qos")?, stream("times")?, stream("props")?);
    let shapes = table(stream("shapes")?.b, "shapes")?;
    let (mut shape_ids, mut raws) = (stream("shape ids")?, stream("payloads")?);
    let mut slots: Vec<Vec<SlotRd<'_>>> = Vec::with_capacity(shapes.len());
    for s in &shapes {
        let count = s.iter().filter(|b| **b == SLOT).count();
        let mut these = Vec::with_capacity(count.min(raw.len()));
        for _ in 0..count {
            these.push(SlotRd {
                tags: stream("slot tags")?,
                scales: stream("slot scales")?,
                nums: stream("slot numbers")?,
                ids: stream("slot string ids")?,
                lits: stream("slot strings")?,
                last: 0,
                seen: Vec::new(),
            });
        }
        slots.push(these);
    }
    r.done()?;
    let mut budget = Budget { used: 0, max: max_out };
    let mut next_props = if props.b.is_empty() { None } else { Some(props.varint()?) };
    let (mut seq, mut ms) = (0u64, 0i64);
    let mut records = Vec::with_capacity(n as usize);
    for i in 0..n {
        seq = seq.wrapping_add(seqs.varint()?);
        if kinds.byte()? == 1 {
            let g: WireGap = ciborium::from_reader(gaps.bytes()?).map_err(|e| bad("gaps", e))?;
            budget.spend(g.ranges.len() * 16 + g.class.len())?;
            records.push(WireRecord::gap(seq, g));
            continue;
        }
        let class = pick(&classes, class_ids.varint()?, "class ids")?;
        let topic = pick(&topics, topic_ids.varint()?, "topic ids")?;
        budget.spend(class.len() + topic.len())?;
        let q = qos.byte()?;
        ms = ms.wrapping_add(times.signed()?);
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
        };
        if next_props == Some(i) {
            let cbor = props.bytes()?;
            budget.spend(cbor.len())?;
            let p: Props = ciborium::from_reader(cbor).map_err(|e| bad("props", e))?;
            (m.expires_ms, m.user_properties, m.correlation_data, m.content_type) =
                (p.expires_ms, p.user_properties, p.correlation_data, p.content_type);
            next_props = if props.b.is_empty() { None } else { Some(props.varint()?) };
        }
        match shape_ids.varint()? {
            0 => {
                let p = raws.bytes()?;
                budget.spend(p.len())?;
                m.payload = p.to_vec();
            }
            id => {
                let shape = pick(&shapes, id - 1, "shape ids")?;
                let these = &mut slots[id as usize - 1];
                let mut k = 0;
                // What is left of `max_out` bounds the payload while it is put together: a shape
                // of many slots repeating one long string would otherwise grow it first.
                let room = budget.max.saturating_sub(budget.used);
                for &b in shape {
                    if m.payload.len() > room {
                        return Err(ProtoError::TooLargeDecompressed { max: max_out });
                    }
                    if b != SLOT {
                        m.payload.push(b);
                        continue;
                    }
                    let s = &mut these[k];
                    k += 1;
                    match s.tags.byte()? {
                        T_NUM => {
                            s.last = s.last.wrapping_add(s.nums.signed()?);
                            render(s.last, s.scales.byte()?, &mut m.payload)
                                .ok_or_else(|| bad("slot scales", "over 18"))?;
                        }
                        T_STR => {
                            let text = match s.ids.varint()? {
                                0 => {
                                    let t = s.lits.bytes()?;
                                    s.seen.push(t);
                                    t
                                }
                                k => s.seen.get(k as usize - 1).copied().ok_or_else(|| bad("slot string ids", k))?,
                            };
                            m.payload.push(b'"');
                            m.payload.extend_from_slice(text);
                            m.payload.push(b'"');
                        }
                        T_TRUE => m.payload.extend_from_slice(b"true"),
                        T_FALSE => m.payload.extend_from_slice(b"false"),
                        T_NULL => m.payload.extend_from_slice(b"null"),
                        t => return Err(bad("slot tags", format!("tag {t}"))),
                    }
                }
                budget.spend(m.payload.len())?;
            }
        }
        records.push(WireRecord::message(seq, m));
    }
    for s in [&seqs, &kinds, &gaps, &class_ids, &topic_ids, &qos, &times, &props, &shape_ids, &raws] {
        s.done()?;
    }
    for s in slots.iter().flatten() {
        for r in [&s.tags, &s.scales, &s.nums, &s.ids, &s.lits] {
            r.done()?;
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests;
