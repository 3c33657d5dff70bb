//! How a batch goes on a stream. Up to version 3 a batch frame's body is the CBOR of
//! [`Batch`], its compressed body a byte string inside it: the sender copies the body into the
//! CBOR, the receiver parses the envelope and copies the body out again before it can
//! decompress. From version 4 it is one framing level: a fixed binary head, then the body as
//! it is, to the end of the frame; the receiver decompresses it where it lies.
//!
//! A version 4 frame body:
//!
//! ```text
//! u8      0x04, never the first byte of a CBOR map (0xa0..=0xbf), so the two tell apart
//! u16 BE  the head's length after this field: a later version may append fields, which
//!         this one skips
//! u8      lane
//! u8      codec: 0 CBOR, 1 zstd
//! u64 BE  first seq, last seq, then the CBOR's length before compression
//! u8 + n  the epoch (empty: the session's)
//! u8 + n  the dictionary id (empty: none)
//! ...     the body
//! ```
//!
//! From version 7 the head is compact (about 30 bytes fewer a batch, which at a second's
//! linger is several records' worth): 0x05, the head's length as a varint, lane, codec, the
//! first seq, the last seq's distance from it and the raw length as varints, the epoch, and
//! the dictionary id, a SHA-256 id as its 32 bytes (read back by its length: no text id is 32
//! bytes), then the fields a later version appends, skipped.
//!
//! A receiver takes either framing from any session: the first byte says which it is. A
//! sender uses this one only once the Welcome chose version 4 or later.

use super::varint::put as put_varint;
use super::{Batch, Codec, Lane, ProtoError, Seq, codec};

/// The first byte of a version 4 batch frame's body.
pub(crate) const BINARY_BATCH: u8 = 0x04;

/// The version from which batches go in this framing.
pub const BINARY_SINCE: u16 = 4;

/// The first byte of a version 7 batch frame's body: the compact head.
pub const COMPACT_BATCH: u8 = 0x05;

/// The version from which batches go with the compact head ([`COMPACT_BATCH`]): seqs and lengths as varints, the
/// last seq as its distance from the first, a dictionary id as the 32 bytes of its hash.
pub const BINARY_DICT_SINCE: u16 = 7;

/// The 32 bytes of an id of 64 lowercase hex digits (as `compress::dict_id` makes it, and as
/// the receiver writes it back).
fn id_bytes(id: &str) -> Option<Vec<u8>> {
    if id.len() != 64 || !id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    (0..32).map(|i| u8::from_str_radix(id.get(2 * i..2 * i + 2)?, 16).ok()).collect()
}

fn codec_byte(codec: Codec) -> u8 {
    match codec {
        Codec::Cbor => 0,
        Codec::Zstd => 1,
        Codec::Columns => 2,
        Codec::ZstdColumns => 3,
    }
}

/// The frame's length prefix and the head of `batch` as a session of `version` sends it: the
/// version 4 framing, or from version 7 the compact one; the body goes right after it, as it
/// is.
pub fn head(batch: &Batch, version: u16) -> Result<Vec<u8>, ProtoError> {
    let short = |what: &str, n: usize| {
        u8::try_from(n).map_err(|_| ProtoError::Encode(format!("{what} of {n} bytes in a batch head")))
    };
    let text = batch.dict.as_deref().unwrap_or("");
    let compact = version >= BINARY_DICT_SINCE;
    let dict_bytes = match id_bytes(text) {
        Some(b) if compact => b,
        _ => text.as_bytes().to_vec(),
    };
    let (epoch, dict) = (short("an epoch", batch.epoch.len())?, short("a dictionary id", dict_bytes.len())?);
    let mut fields = vec![batch.lane.0, codec_byte(batch.codec)];
    if compact {
        let count = batch
            .last_seq
            .0
            .checked_sub(batch.first_seq.0)
            .ok_or_else(|| ProtoError::Encode(format!("batch {}..={}", batch.first_seq, batch.last_seq)))?;
        for n in [batch.first_seq.0, count, batch.raw_len] {
            put_varint(&mut fields, n);
        }
    } else {
        for n in [batch.first_seq.0, batch.last_seq.0, batch.raw_len] {
            fields.extend_from_slice(&n.to_be_bytes());
        }
    }
    fields.push(epoch);
    fields.extend_from_slice(batch.epoch.as_bytes());
    fields.push(dict);
    fields.extend_from_slice(&dict_bytes);
    let mut head_len = Vec::new();
    if compact {
        put_varint(&mut head_len, fields.len() as u64);
    } else {
        head_len.extend_from_slice(&(fields.len() as u16).to_be_bytes());
    }
    let frame = 1 + head_len.len() + fields.len() + batch.body.len();
    let frame = u32::try_from(frame).map_err(|_| ProtoError::Encode("frame over 4 GiB".into()))?;
    let mut out = Vec::with_capacity(codec::HEADER + 1 + head_len.len() + fields.len());
    out.extend_from_slice(&frame.to_be_bytes());
    out.push(if compact { COMPACT_BATCH } else { BINARY_BATCH });
    out.extend_from_slice(&head_len);
    out.extend_from_slice(&fields);
    Ok(out)
}

/// The whole frame of `batch` as a session of `version` sends it.
pub fn encode(batch: &Batch, version: u16) -> Result<Vec<u8>, ProtoError> {
    if version < BINARY_SINCE {
        return codec::encode(batch);
    }
    let mut out = head(batch, version)?;
    out.extend_from_slice(&batch.body);
    Ok(out)
}

/// A version 4 frame body's batch (its `body` left empty) and where its body starts; `None`
/// if the frame is a CBOR batch of an earlier version.
pub fn decode_head(frame: &[u8]) -> Result<Option<(Batch, usize)>, ProtoError> {
    let compact = match frame.first() {
        Some(&BINARY_BATCH) => false,
        Some(&COMPACT_BATCH) => true,
        _ => return Ok(None),
    };
    let bad = |why: &str| ProtoError::Decode(format!("batch head: {why}"));
    let mut r = Cursor { b: frame.get(1..).unwrap_or_default() };
    let head_len = if compact {
        usize::try_from(r.varint().ok_or_else(|| bad("cut short"))?).map_err(|_| bad("longer than the frame"))?
    } else {
        usize::from(u16::from_be_bytes(r.take(2).ok_or_else(|| bad("cut short"))?.try_into().expect("two bytes")))
    };
    let at = frame.len() - r.b.len() + head_len;
    let head = r.take(head_len).ok_or_else(|| bad("longer than the frame"))?;
    let mut h = Cursor { b: head };
    let short = || bad("shorter than its fields");
    let (lane, codec) = (h.byte().ok_or_else(short)?, h.byte().ok_or_else(short)?);
    let codec = match codec {
        0 => Codec::Cbor,
        1 => Codec::Zstd,
        2 => Codec::Columns,
        3 => Codec::ZstdColumns,
        other => return Err(bad(&format!("codec {other}"))),
    };
    let (first_seq, last_seq, raw_len) = if compact {
        let (first, count, raw) = (h.varint(), h.varint(), h.varint());
        let (first, count, raw) = (first.ok_or_else(short)?, count.ok_or_else(short)?, raw.ok_or_else(short)?);
        (first, first.checked_add(count).ok_or_else(|| bad("a last seq past 2^64"))?, raw)
    } else {
        let mut n = || h.take(8).map(|b| u64::from_be_bytes(b.try_into().expect("eight bytes"))).ok_or_else(short);
        (n()?, n()?, n()?)
    };
    let mut field = |what: &str| -> Result<&[u8], ProtoError> {
        let n = h.byte().ok_or_else(|| if compact { short() } else { bad(&format!("no {what}")) })?;
        h.take(usize::from(n)).ok_or_else(|| bad(&format!("{what} longer than the head")))
    };
    let text = |what: &str, s: &[u8]| String::from_utf8(s.to_vec()).map_err(|_| bad(&format!("{what} is not UTF-8")));
    let epoch = text("epoch", field("epoch")?)?;
    let dict = match field("dictionary id")? {
        [] => None,
        b if compact && b.len() == 32 => Some(b.iter().map(|x| format!("{x:02x}")).collect()),
        b => Some(text("dictionary id", b)?),
    };
    // What is left of the head is a later version's: skipped.
    let (lane, first_seq, last_seq) = (Lane(lane), Seq(first_seq), Seq(last_seq));
    let batch = Batch { epoch, lane, first_seq, last_seq, codec, dict, raw_len, body: Vec::new() };
    Ok(Some((batch, at)))
}

/// A reader over a head's bytes; every read checks what is left.
struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.b.get(..n)?, self.b.get(n..)?);
        self.b = rest;
        Some(head)
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn varint(&mut self) -> Option<u64> {
        super::varint::take(&mut self.b).ok()
    }
}

/// A batch frame body of either framing, its body copied out.
pub fn decode(frame: &[u8]) -> Result<Batch, ProtoError> {
    match decode_head(frame)? {
        Some((mut batch, at)) => {
            batch.body = frame[at..].to_vec();
            Ok(batch)
        }
        None => codec::decode(frame),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> Batch {
        Batch {
            epoch: "00112233445566778899aabbccddeeff".into(),
            lane: Lane(7),
            first_seq: Seq(1 << 40),
            last_seq: Seq((1 << 40) + 99),
            codec: Codec::Zstd,
            dict: Some("ab".repeat(32)),
            raw_len: 123_456,
            body: (0..=255u8).cycle().take(5000).collect(),
        }
    }

    /// A batch goes and comes back whole in either framing; version 3 sends the CBOR it always
    /// did, version 4 the binary head, and the receiver tells which by the first byte.
    #[test]
    fn either_framing_decodes_to_the_batch_sent() {
        for b in [batch(), Batch { epoch: String::new(), dict: None, codec: Codec::Cbor, body: vec![], ..batch() }] {
            let old = encode(&b, 3).unwrap();
            assert_eq!(old, codec::encode(&b).unwrap());
            assert_eq!(decode(&old[codec::HEADER..]).unwrap(), b);
            let new = encode(&b, 4).unwrap();
            assert_eq!(new[codec::HEADER], BINARY_BATCH);
            // Version 7's compact head: varints, the id's 32 bytes; every version reads all.
            let v7 = encode(&b, 7).unwrap();
            assert_eq!(v7[codec::HEADER], COMPACT_BATCH);
            assert!(
                new.len() - v7.len() >= if b.dict.is_some() { 32 + 14 } else { 14 },
                "{} vs {}",
                v7.len(),
                new.len()
            );
            assert_eq!(decode(&v7[codec::HEADER..]).unwrap(), b);
            let (_, at) = decode_head(&v7[codec::HEADER..]).unwrap().unwrap();
            assert_eq!(&v7[codec::HEADER + at..], &b.body[..]);
            let len = u32::from_be_bytes(new[..4].try_into().unwrap()) as usize;
            assert_eq!(len, new.len() - codec::HEADER, "the prefix counts head and body");
            assert_eq!(decode(&new[codec::HEADER..]).unwrap(), b);
            let (_, at) = decode_head(&new[codec::HEADER..]).unwrap().unwrap();
            assert_eq!(&new[codec::HEADER + at..], &b.body[..], "the body lies as it is after the head");
        }
    }

    /// A head a later version made longer is read, its extra bytes skipped; a head cut short,
    /// longer than its frame, of an unknown codec or with a string past its end is an error
    /// naming it, never a panic.
    #[test]
    fn a_longer_head_is_read_and_a_broken_one_named() {
        let b = batch();
        let mut newer = head(&b, 4).unwrap()[codec::HEADER..].to_vec();
        let head_len = u16::from_be_bytes([newer[1], newer[2]]) + 3;
        newer[1..3].copy_from_slice(&head_len.to_be_bytes());
        newer.extend_from_slice(&[9, 9, 9]);
        newer.extend_from_slice(&b.body);
        assert_eq!(decode(&newer).unwrap(), b);

        let good = encode(&b, 4).unwrap()[codec::HEADER..].to_vec();
        let err = |frame: &[u8]| decode(frame).unwrap_err().to_string();
        assert!(err(&good[..2]).contains("cut short"));
        assert!(err(&good[..20]).contains("longer than the frame"));
        let mut short = good.clone();
        short[1..3].copy_from_slice(&5u16.to_be_bytes());
        assert!(err(&short).contains("shorter than its fields"));
        let mut codec = good.clone();
        codec[4] = 9;
        assert!(err(&codec).contains("codec 9"));
        let mut epoch = good.clone();
        epoch[29] = 200;
        assert!(err(&epoch).contains("longer than the head"), "{}", err(&epoch));
        for cut in 0..good.len().min(120) {
            let _ = decode(&good[..cut]);
        }

        // The compact head: cut anywhere, an error; a last seq past 2^64, named.
        let compact = encode(&b, 7).unwrap()[codec::HEADER..].to_vec();
        let (_, at) = decode_head(&compact).unwrap().unwrap();
        for cut in 1..at {
            assert!(decode_head(&compact[..cut]).is_err(), "a head cut at {cut}");
        }
        let far = Batch { first_seq: Seq(u64::MAX - 1), last_seq: Seq(u64::MAX), ..b.clone() };
        let mut over = encode(&far, 7).unwrap()[codec::HEADER..].to_vec();
        let count_at = 2 + 2 + 10;
        assert_eq!(over[count_at], 1, "the distance to the last seq");
        over[count_at] = 5;
        assert!(err(&over).contains("past 2^64"), "{}", err(&over));
    }
}
