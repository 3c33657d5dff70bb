//! Binary payloads (Avro, Protobuf) taken apart by the schema they were validated against:
//! the part of a format 3 body (protocol version 8) that JSON's shapes cannot do, since a
//! binary payload does not say where its values are.
//!
//! The edge walks a payload with its schema ([`Shapes`], done in `shared::schema`) and tells a
//! [`Shaper`] what it meets: structure (a Protobuf field's tag, an Avro union branch or block
//! count) goes into the shape as it is; each value goes to a slot column as an integer, a
//! number or a string, with the way it is written. The shape names the encodings, so the
//! bridge puts a payload back without the schema: it needs no registry, and a schema it never
//! saw costs it nothing.
//!
//! A binary shape is [`BIN`] (never the first byte of a JSON shape, which is `{` or `[`), then
//! ops: [`LIT`] with a length and bytes, a slot encoding, or [`OPEN`] … [`CLOSE`] around a part
//! whose length is written before it as a varint (a Protobuf sub-message or packed field: its
//! length changes with its values, and would split one shape into many).
//!
//! Byte for byte: the encoder puts every cut payload back and compares before it keeps the
//! cut (an overlong varint, a float that is not its shortest decimal, `-0.0` or NaN: the
//! payload goes whole). The decoder checks every op, the nesting (at most [`MAX_OPEN`]), and
//! that each value is of a kind its encoding can write.

use super::ints::zigzag;
use super::json::{self, Val};
use super::{bad, put_varint};
use crate::proto::{ProtoError, SchemaRef};

/// The first byte of a binary shape.
pub(super) const BIN: u8 = 1;

const LIT: u8 = 0;
const OPEN: u8 = 1;
const CLOSE: u8 = 2;
const ZIGZAG: u8 = 3;
const VARINT: u8 = 4;
const FIXED64: u8 = 5;
const FIXED32: u8 = 6;
const F64: u8 = 7;
const F32: u8 = 8;
const BYTES_ZIGZAG: u8 = 9;
const BYTES_VARINT: u8 = 10;
const RAW: u8 = 11;

/// Deepest nesting of length-delimited parts.
pub(super) const MAX_OPEN: usize = 64;

/// How an integer is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int {
    /// A zig-zag varint (Avro int and long, Protobuf sint32 and sint64).
    Zigzag,
    /// A varint of the value's 64 bits (Protobuf's other varints, Avro's boolean byte).
    Varint,
    /// Eight bytes, little-endian.
    Fixed64,
    /// Four bytes, little-endian, of a value in `0..2^32`.
    Fixed32,
}

/// How the length before a string of bytes is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Len {
    /// A zig-zag varint (Avro).
    Zigzag,
    /// A varint (Protobuf).
    Varint,
    /// None: the schema fixes it (Avro's `fixed`).
    Fixed,
}

/// Walks payloads by their schema for format 3 bodies; what the edge's staged schemas do.
pub trait Shapes: std::fmt::Debug {
    /// Tells `out` what `payload`, validated against `schema`, holds; false when this schema
    /// is not at hand or the payload does not walk (it then travels whole).
    fn cut<'p>(&self, schema: &SchemaRef, payload: &'p [u8], out: &mut Shaper<'p>) -> bool;
}

/// No schema at hand: every binary payload travels whole.
#[derive(Debug)]
pub struct NoShapes;

impl Shapes for NoShapes {
    fn cut<'p>(&self, _: &SchemaRef, _: &'p [u8], _: &mut Shaper<'p>) -> bool {
        false
    }
}

/// A binary payload's shape and values as a schema walk finds them.
#[derive(Debug)]
pub struct Shaper<'p> {
    shape: Vec<u8>,
    /// Structure not yet written to the shape: runs of it become one op.
    lit: Vec<u8>,
    vals: Vec<Val<'p>>,
    open: usize,
    ok: bool,
}

impl Default for Shaper<'_> {
    fn default() -> Self {
        Shaper { shape: vec![BIN], lit: Vec::new(), vals: Vec::new(), open: 0, ok: true }
    }
}

// The walk's side: the schema walker (feature `schema`) calls it.
#[cfg_attr(not(feature = "schema"), allow(dead_code))]
impl<'p> Shaper<'p> {
    /// Structure, kept in the shape as it is.
    pub(crate) fn lit(&mut self, b: &[u8]) {
        self.lit.extend_from_slice(b);
    }

    fn flush(&mut self) {
        if !self.lit.is_empty() {
            self.shape.push(LIT);
            put_varint(&mut self.shape, self.lit.len() as u64);
            self.shape.append(&mut self.lit);
        }
    }

    fn op(&mut self, op: u8) {
        self.flush();
        self.shape.push(op);
    }

    pub(crate) fn int(&mut self, v: i64, how: Int) {
        let op = match how {
            Int::Zigzag => ZIGZAG,
            Int::Varint => VARINT,
            Int::Fixed64 => FIXED64,
            Int::Fixed32 => FIXED32,
        };
        self.op(op);
        self.vals.push(Val::Num { mantissa: v, scale: 0 });
    }

    /// A double, kept as its shortest decimal (Rust prints it so, without an exponent).
    pub(crate) fn f64(&mut self, x: f64) {
        self.number(F64, x.is_finite() && !(x == 0.0 && x.is_sign_negative()), || x.to_string());
    }

    pub(crate) fn f32(&mut self, x: f32) {
        self.number(F32, x.is_finite() && !(x == 0.0 && x.is_sign_negative()), || x.to_string());
    }

    fn number(&mut self, op: u8, finite: bool, text: impl FnOnce() -> String) {
        match json::decimal(text().as_bytes()).filter(|_| finite) {
            Some((mantissa, scale)) => {
                self.op(op);
                self.vals.push(Val::Num { mantissa, scale });
            }
            None => self.ok = false,
        }
    }

    pub(crate) fn bytes(&mut self, b: &'p [u8], len: Len) {
        self.op(match len {
            Len::Zigzag => BYTES_ZIGZAG,
            Len::Varint => BYTES_VARINT,
            Len::Fixed => RAW,
        });
        self.vals.push(Val::Str(b));
    }

    /// A part whose varint length goes before it begins.
    pub(crate) fn open(&mut self) {
        self.op(OPEN);
        self.open += 1;
        if self.open > MAX_OPEN {
            self.ok = false;
        }
    }

    pub(crate) fn close(&mut self) {
        self.op(CLOSE);
        self.ok &= self.open > 0;
        self.open = self.open.saturating_sub(1);
    }

    /// The walk met something a shape cannot hold (an Avro block with a byte size).
    pub(crate) fn fail(&mut self) {
        self.ok = false;
    }

    /// Whether the walk's shape and values put `payload` back exactly (so it goes as a shape).
    #[cfg(test)]
    pub(crate) fn holds(self, payload: &[u8]) -> bool {
        self.finish(payload).is_some()
    }

    /// The shape and values, if they put `payload` back exactly.
    pub(super) fn finish(mut self, payload: &[u8]) -> Option<(Vec<u8>, Vec<Val<'p>>)> {
        if !self.ok || self.open != 0 {
            return None;
        }
        self.flush();
        let ops = ops(&self.shape).ok()?;
        let mut back = Vec::with_capacity(payload.len());
        let mut vals = self.vals.iter();
        render(&ops, &mut back, (usize::MAX, usize::MAX), || vals.next().copied().ok_or_else(|| bad("slot", "none")))
            .ok()
            .filter(|()| back == payload && vals.next().is_none())?;
        Some((self.shape, self.vals))
    }
}

/// One op of a binary shape.
#[derive(Debug, Clone, Copy)]
pub(super) enum Op<'a> {
    Lit(&'a [u8]),
    Open,
    Close,
    Slot(u8),
}

/// A binary shape's ops (after its [`BIN`] byte), checked: known ops, literals within the
/// shape, nesting balanced and at most [`MAX_OPEN`] deep.
pub(super) fn ops(shape: &[u8]) -> Result<Vec<Op<'_>>, String> {
    let mut b = shape.strip_prefix(&[BIN]).ok_or("not a binary shape")?;
    let mut out = Vec::new();
    let mut depth = 0usize;
    while let Some((&op, rest)) = b.split_first() {
        b = rest;
        out.push(match op {
            LIT => {
                let n = crate::proto::varint::take(&mut b).map_err(|_| "a literal's length is cut")?;
                if n > b.len() as u64 {
                    return Err(format!("a literal of {n} bytes, {} left", b.len()));
                }
                let (lit, rest) = b.split_at(n as usize);
                b = rest;
                Op::Lit(lit)
            }
            OPEN => {
                depth += 1;
                if depth > MAX_OPEN {
                    return Err(format!("parts nested deeper than {MAX_OPEN}"));
                }
                Op::Open
            }
            CLOSE => {
                depth = depth.checked_sub(1).ok_or("a part closed that was not open")?;
                Op::Close
            }
            ZIGZAG..=RAW => Op::Slot(op),
            other => return Err(format!("op {other}")),
        });
    }
    if depth != 0 {
        return Err(format!("{depth} parts left open"));
    }
    Ok(out)
}

/// How many values a binary shape takes.
pub(super) fn slots(ops: &[Op<'_>]) -> usize {
    ops.iter().filter(|o| matches!(o, Op::Slot(_))).count()
}

/// Puts a payload together from `ops`, taking each slot's value from `next`; stops once `out`
/// passes `room` bytes (`TooLargeDecompressed`, naming `max`).
pub(super) fn render<'v>(
    ops: &[Op<'_>],
    out: &mut Vec<u8>,
    (room, max): (usize, usize),
    mut next: impl FnMut() -> Result<Val<'v>, ProtoError>,
) -> Result<(), ProtoError> {
    let mut starts: Vec<usize> = Vec::new();
    for op in ops {
        if out.len() > room {
            return Err(ProtoError::TooLargeDecompressed { max });
        }
        match *op {
            Op::Lit(b) => out.extend_from_slice(b),
            Op::Open => starts.push(out.len()),
            Op::Close => {
                // `ops` checked the nesting; a close always has its open.
                let start = starts.pop().unwrap_or(out.len());
                let mut len = Vec::new();
                put_varint(&mut len, (out.len() - start) as u64);
                out.splice(start..start, len);
            }
            Op::Slot(enc) => {
                let v = next()?;
                put(enc, &v, out)
                    .ok_or_else(|| bad("slot", format!("a value of a kind encoding {enc} does not write")))?;
            }
        }
    }
    Ok(())
}

/// `v` as encoding `enc` writes it; none if it cannot.
fn put(enc: u8, v: &Val<'_>, out: &mut Vec<u8>) -> Option<()> {
    match (enc, v) {
        (ZIGZAG, Val::Num { mantissa, scale: 0 }) => put_varint(out, zigzag(*mantissa)),
        (VARINT, Val::Num { mantissa, scale: 0 }) => put_varint(out, *mantissa as u64),
        (FIXED64, Val::Num { mantissa, scale: 0 }) => out.extend_from_slice(&mantissa.to_le_bytes()),
        (FIXED32, Val::Num { mantissa, scale: 0 }) => {
            out.extend_from_slice(&u32::try_from(*mantissa).ok()?.to_le_bytes())
        }
        (F64 | F32, Val::Num { mantissa, scale }) => {
            let mut text = Vec::new();
            json::render(*mantissa, *scale, &mut text)?;
            let text = std::str::from_utf8(&text).ok()?;
            if enc == F64 {
                out.extend_from_slice(&text.parse::<f64>().ok()?.to_le_bytes());
            } else {
                out.extend_from_slice(&text.parse::<f32>().ok()?.to_le_bytes());
            }
        }
        (BYTES_ZIGZAG, Val::Str(b)) => {
            put_varint(out, zigzag(b.len() as i64));
            out.extend_from_slice(b);
        }
        (BYTES_VARINT, Val::Str(b)) => {
            put_varint(out, b.len() as u64);
            out.extend_from_slice(b);
        }
        (RAW, Val::Str(b)) => out.extend_from_slice(b),
        _ => return None,
    }
    Some(())
}
