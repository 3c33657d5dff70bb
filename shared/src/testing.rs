//! Test data shared by the crates' tests and benchmarks.

/// `len` deterministic bytes that neither compress nor repeat (an xorshift stream); different
/// seeds give different streams.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2).wrapping_add(1);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}
