//! Where a record stands among an edge's records: its lane and its seq in the lane, as types.
//! On the wire both are plain integers (`#[serde(transparent)]`, so the CBOR is what it was);
//! in the code, a lane number taken for a seq, or an edge's seq for a downlink seq, does not
//! compile.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A priority lane. Lower numbers drain first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Lane(pub u8);

/// A record's position in its lane: the first record is 1, and 0 stands for none yet (a lane
/// nothing of which is committed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Seq(pub u64);

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lane and a seq are encoded as the integers they hold: the newtypes changed no byte
    /// of the protocol.
    #[test]
    fn lanes_and_seqs_are_plain_integers_on_the_wire() {
        fn cbor<T: Serialize>(v: &T) -> Vec<u8> {
            let mut out = Vec::new();
            ciborium::into_writer(v, &mut out).expect("encodes");
            out
        }
        assert_eq!(cbor(&Lane(3)), cbor(&3u8));
        assert_eq!(cbor(&Seq(1 << 40)), cbor(&(1u64 << 40)));
        let back: Seq = ciborium::from_reader(&cbor(&77u64)[..]).expect("decodes");
        assert_eq!(back, Seq(77));
        assert_eq!(format!("{}:{}", Lane(2), Seq(9)), "2:9");
    }
}
