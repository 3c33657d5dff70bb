//! Integer columns of a column-wise body, in either format.
//!
//! - Format 1 (protocol version 6) writes each value as it comes: a byte, a varint, or a varint
//!   of its difference from the value before, and leaves the rest to zstd.
//! - Format 2 (version 7) holds a column's values until the body is done, then writes them
//!   bit-packed at the fewest bits that hold them: either each value above the column's least
//!   (frame of reference), or the first value and each difference above the least difference,
//!   whichever takes fewer bytes. A column of one repeated value takes no bits per value; a
//!   reading that wanders in a range of 750 steps takes 10 bits, where a varint of its delta
//!   took 16 and zstd could not find the pattern in them. Arithmetic wraps, so any `i64` comes
//!   back, whatever its range.
//!
//! A format 2 column: `n` (varint), the mode (bit 0: deltas, bit 1: a step follows), the base
//! (zigzag varint), the step if any (varint), for deltas the first value (zigzag varint), the
//! width in bits (a byte, at most 64), then exactly
//! `ceil(n * width / 8)` bytes of values, least significant bit first. The reader checks the
//! byte count against `n` and `width` before it reads a value, and allocates nothing.

use super::{ProtoError, bad, put_varint};

/// The layout of a body's integer columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Bytes and varints, deltas where they help (protocol version 6).
    V1,
    /// Bit-packed with a frame of reference or of deltas (protocol version 7).
    V2,
    /// As format 2, and binary payloads taken apart by their schema (protocol version 8).
    V3,
}

/// How a column's values are written in format 1.
#[derive(Debug, Clone, Copy)]
pub(super) enum V1 {
    Byte,
    Varint,
    /// A varint of the wrapping difference from the value before (seqs, which only grow).
    Delta,
    /// A zigzag varint of the wrapping difference from the value before.
    Signed,
}

pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// One column being written.
pub(super) struct IntsOut {
    format: Format,
    v1: V1,
    bytes: Vec<u8>,
    vals: Vec<i64>,
    last: i64,
}

impl IntsOut {
    pub(super) fn new(format: Format, v1: V1) -> Self {
        IntsOut { format, v1, bytes: Vec::new(), vals: Vec::new(), last: 0 }
    }

    pub(super) fn push(&mut self, v: i64) {
        if self.format != Format::V1 {
            self.vals.push(v);
            return;
        }
        match self.v1 {
            // Callers give a byte column only values below 256.
            V1::Byte => self.bytes.push(v as u8),
            V1::Varint => put_varint(&mut self.bytes, v as u64),
            V1::Delta => put_varint(&mut self.bytes, (v as u64).wrapping_sub(self.last as u64)),
            V1::Signed => put_varint(&mut self.bytes, zigzag(v.wrapping_sub(self.last))),
        }
        self.last = v;
    }

    /// Whether every value is `v` (format 2, which holds them).
    pub(super) fn only(&self, v: i64) -> bool {
        self.format != Format::V1 && self.vals.iter().all(|x| *x == v)
    }

    /// The column's bytes.
    pub(super) fn finish(self) -> Vec<u8> {
        match self.format {
            Format::V1 => self.bytes,
            Format::V2 | Format::V3 => pack(&self.vals),
        }
    }
}

/// Bits that hold `span`.
fn width(span: u64) -> u32 {
    64 - span.leading_zeros()
}

fn packed_len(n: u64, width: u32) -> u128 {
    (u128::from(n) * u128::from(width)).div_ceil(8)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Values as offsets above their least: (the least, the step all offsets are multiples of,
/// the greatest offset in steps).
fn frame(vals: impl Iterator<Item = i64> + Clone) -> (i64, u64, u64) {
    let lo = vals.clone().min().unwrap_or(0);
    let (mut step, mut top) = (0u64, 0u64);
    for v in vals {
        let off = (v as u64).wrapping_sub(lo as u64);
        step = gcd(step, off);
        top = top.max(off);
    }
    let step = step.max(1);
    (lo, step, top / step)
}

/// Mode bits of a packed column.
const DELTAS: u8 = 1;
const STEPPED: u8 = 2;

/// A format 2 column of `vals`.
pub(super) fn pack(vals: &[i64]) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, vals.len() as u64);
    let Some(&first) = vals.first() else { return out };
    // Differences as i64 wrap: a column spanning more than 2^63 may not be smaller as deltas,
    // and is then sent plain (the comparison below is on the true sizes of both).
    let deltas = || vals.windows(2).map(|w| w[1].wrapping_sub(w[0]));
    let head = |mode: u8, base: i64, step: u64, first: Option<i64>| {
        let mut h = vec![mode | if step > 1 { STEPPED } else { 0 }];
        put_varint(&mut h, zigzag(base));
        if step > 1 {
            put_varint(&mut h, step);
        }
        if let Some(f) = first {
            put_varint(&mut h, zigzag(f));
        }
        h
    };
    let (lo, step, top) = frame(vals.iter().copied());
    let plain = head(0, lo, step, None);
    let plain_len = packed_len(vals.len() as u64, width(top)) + plain.len() as u128;
    let (dlo, dstep, dtop) = frame(deltas());
    let delta = head(DELTAS, dlo, dstep, Some(first));
    let delta_len = packed_len(vals.len() as u64 - 1, width(dtop)) + delta.len() as u128;
    if vals.len() > 1 && delta_len < plain_len {
        out.extend_from_slice(&delta);
        bits(&mut out, deltas().map(|d| (d.wrapping_sub(dlo) as u64) / dstep), width(dtop));
    } else {
        out.extend_from_slice(&plain);
        bits(&mut out, vals.iter().map(|v| (v.wrapping_sub(lo) as u64) / step), width(top));
    }
    out
}

fn bits(out: &mut Vec<u8>, vals: impl Iterator<Item = u64>, width: u32) {
    out.push(width as u8);
    if width == 0 {
        return;
    }
    let (mut acc, mut held) = (0u128, 0u32);
    for v in vals {
        acc |= u128::from(v) << held;
        held += width;
        while held >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            held -= 8;
        }
    }
    if held > 0 {
        out.push(acc as u8);
    }
}

/// A cursor over one column.
pub(super) enum IntsIn<'a> {
    V1 { b: &'a [u8], v1: V1, last: i64, what: &'static str },
    V2(Packed<'a>),
}

pub(super) struct Packed<'a> {
    what: &'static str,
    n: u64,
    read: u64,
    deltas: bool,
    base: i64,
    /// What each packed value is multiplied by.
    step: u64,
    last: i64,
    width: u32,
    bits: &'a [u8],
    at: u64,
}

impl<'a> IntsIn<'a> {
    pub(super) fn new(b: &'a [u8], what: &'static str, format: Format, v1: V1) -> Result<Self, ProtoError> {
        if format == Format::V1 {
            return Ok(IntsIn::V1 { b, v1, last: 0, what });
        }
        let mut r = super::Rd::new(b, what);
        let column = Self::packed(&mut r)?;
        r.done()?;
        Ok(column)
    }

    /// A format 2 column read from `r`, which is left after its last byte.
    pub(super) fn packed(r: &mut super::Rd<'a>) -> Result<Self, ProtoError> {
        let what = r.what;
        let n = r.varint()?;
        if n == 0 {
            return Ok(Self::constant(what, 0, 0));
        }
        let mode = r.byte()?;
        if mode & !(DELTAS | STEPPED) != 0 {
            return Err(bad(what, format!("packing mode {mode}")));
        }
        let deltas = mode & DELTAS != 0;
        let base = unzigzag(r.varint()?);
        let step = if mode & STEPPED != 0 { r.varint()? } else { 1 };
        let first = if deltas { unzigzag(r.varint()?) } else { 0 };
        let width = u32::from(r.byte()?);
        if width > 64 {
            return Err(bad(what, format!("{width} bits a value")));
        }
        let values = if deltas { n - 1 } else { n };
        let len = packed_len(values, width);
        if len > r.b.len() as u128 {
            return Err(bad(what, format!("{n} values of {width} bits in {} bytes", r.b.len())));
        }
        let (bits, rest) = r.b.split_at(len as usize);
        r.b = rest;
        Ok(IntsIn::V2(Packed { what, n, read: 0, deltas, base, step, last: first, width, bits, at: 0 }))
    }

    /// `n` times `value`, for a column a body leaves out because it says so once.
    pub(super) fn constant(what: &'static str, value: i64, n: u64) -> Self {
        IntsIn::V2(Packed {
            what,
            n,
            read: 0,
            deltas: false,
            base: value,
            step: 1,
            last: 0,
            width: 0,
            bits: &[],
            at: 0,
        })
    }

    /// How many values the column holds (format 2).
    pub(super) fn len(&self) -> u64 {
        match self {
            IntsIn::V1 { .. } => 0,
            IntsIn::V2(p) => p.n,
        }
    }

    pub(super) fn next(&mut self) -> Result<i64, ProtoError> {
        match self {
            IntsIn::V1 { b, v1, last, what } => {
                let mut r = super::Rd::new(b, what);
                let v = match v1 {
                    V1::Byte => i64::from(r.byte()?),
                    V1::Varint => r.varint()? as i64,
                    V1::Delta => (*last as u64).wrapping_add(r.varint()?) as i64,
                    V1::Signed => last.wrapping_add(unzigzag(r.varint()?)),
                };
                *b = r.b;
                *last = v;
                Ok(v)
            }
            IntsIn::V2(p) => p.next(),
        }
    }

    /// A value that must fit a byte.
    pub(super) fn byte(&mut self) -> Result<u8, ProtoError> {
        let v = self.next()?;
        u8::try_from(v).map_err(|_| bad(self.what(), format!("{v} is not a byte")))
    }

    fn what(&self) -> &'static str {
        match self {
            IntsIn::V1 { what, .. } => what,
            IntsIn::V2(p) => p.what,
        }
    }

    pub(super) fn done(&self) -> Result<(), ProtoError> {
        match self {
            IntsIn::V1 { b, what, .. } if !b.is_empty() => Err(bad(what, format!("{} bytes left over", b.len()))),
            IntsIn::V2(p) if p.read != p.n => Err(bad(p.what, format!("{} of {} values read", p.read, p.n))),
            _ => Ok(()),
        }
    }
}

impl Packed<'_> {
    fn next(&mut self) -> Result<i64, ProtoError> {
        if self.read == self.n {
            return Err(bad(self.what, "more values read than it holds"));
        }
        self.read += 1;
        if self.deltas && self.read == 1 {
            return Ok(self.last);
        }
        let raw = self.take().wrapping_mul(self.step);
        let v = if self.deltas {
            self.last.wrapping_add(self.base.wrapping_add(raw as i64))
        } else {
            self.base.wrapping_add(raw as i64)
        };
        self.last = v;
        Ok(v)
    }

    /// The next `width` bits; the length was checked against the count when the column opened.
    fn take(&mut self) -> u64 {
        let mut v = 0u64;
        let mut got = 0u32;
        while got < self.width {
            let byte = self.bits[(self.at / 8) as usize];
            let offset = (self.at % 8) as u32;
            let take = (8 - offset).min(self.width - got);
            let chunk = (u64::from(byte) >> offset) & ((1u64 << take) - 1);
            v |= chunk << got;
            got += take;
            self.at += u64::from(take);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn round_trip(vals: &[i64]) -> usize {
        let mut out = IntsOut::new(Format::V2, V1::Varint);
        vals.iter().for_each(|v| out.push(*v));
        let bytes = out.finish();
        let mut r = IntsIn::new(&bytes, "t", Format::V2, V1::Varint).unwrap();
        let back: Vec<i64> = (0..vals.len()).map(|_| r.next().unwrap()).collect();
        assert_eq!(back, vals);
        r.done().unwrap();
        assert!(r.next().is_err());
        bytes.len()
    }

    #[test]
    fn columns_take_the_bits_their_values_need() {
        assert_eq!(round_trip(&[]), 1);
        // One repeated value: the head only.
        assert_eq!(round_trip(&[7; 1000]), 2 + 1 + 1 + 1);
        // Seqs one apart: deltas of no bits.
        let seqs: Vec<i64> = (1_000_000..1_001_000).collect();
        assert!(round_trip(&seqs) < 12);
        // Multiples of one step: the factors only.
        let sizes: Vec<i64> = (0..100).map(|i| (1 + i % 32) * 602_112).collect();
        assert!(round_trip(&sizes) <= 8 + 63, "5 bits each");
        // Readings in a range of 750: 10 bits each.
        let r: Vec<i64> = (0..100).map(|i| 200 + (i * 7919) % 750).collect();
        assert!(round_trip(&r) <= 6 + 125);
        round_trip(&[i64::MIN, i64::MAX, 0, -1, i64::MAX, i64::MIN]);
    }

    #[test]
    fn a_column_that_lies_is_refused() {
        // 100 values of 10 bits in 3 bytes.
        let lie = [100, 0, 0, 10, 1, 2, 3];
        assert!(IntsIn::new(&lie, "t", Format::V2, V1::Varint).is_err());
        // Bytes after the column's own.
        assert!(IntsIn::new(&[1, 0, 0, 8, 1, 2], "t", Format::V2, V1::Varint).is_err());
        assert!(IntsIn::new(&[1, 0, 0, 65], "t", Format::V2, V1::Varint).is_err());
        assert!(IntsIn::new(&[1, 2, 0, 1], "t", Format::V2, V1::Varint).is_err());
        // A count of 2^63 values of no bits costs nothing until they are read, one at a time.
        let mut many = Vec::new();
        put_varint(&mut many, 1 << 63);
        many.extend_from_slice(&[0, 0, 0]);
        let r = IntsIn::new(&many, "t", Format::V2, V1::Varint).unwrap();
        assert!(r.done().is_err());
    }

    proptest! {
        #[test]
        fn any_values_come_back(vals in prop::collection::vec(any::<i64>(), 0..200), small in prop::collection::vec(-50i64..50, 0..200)) {
            round_trip(&vals);
            round_trip(&small);
        }

        #[test]
        fn made_up_columns_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(mut r) = IntsIn::new(&bytes, "t", Format::V2, V1::Varint) {
                for _ in 0..100 {
                    if r.next().is_err() { break; }
                }
            }
        }
    }
}
