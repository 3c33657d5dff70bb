//! LEB128 varints, as the column-wise bodies and the compact batch head write them: seven bits
//! a byte, least significant first, at most ten bytes.

/// Appends `v`.
pub(crate) fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Takes a varint off the front of `b`; `Err(true)` if `b` ends inside it, `Err(false)` if it
/// runs past ten bytes. `b` is left as it was on an error.
pub(crate) fn take(b: &mut &[u8]) -> Result<u64, bool> {
    let mut v = 0u64;
    for (i, &x) in b.iter().take(10).enumerate() {
        v |= u64::from(x & 0x7f) << (7 * i);
        if x & 0x80 == 0 {
            *b = &b[i + 1..];
            return Ok(v);
        }
    }
    Err(b.len() < 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_bad_ones_are_told_apart() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            put(&mut out, v);
            let mut b = &out[..];
            assert_eq!(take(&mut b), Ok(v));
            assert!(b.is_empty());
            let mut cut = &out[..out.len() - 1];
            assert_eq!(take(&mut cut), Err(true));
        }
        let mut long: &[u8] = &[0x80; 11];
        assert_eq!(take(&mut long), Err(false));
    }
}
