//! Dictionaries for column-wise bodies: the table entries a class's batches repeat.
//!
//! Each column-wise batch carries its own tables (topics, shapes, the strings a slot has seen),
//! so a batch cut short by its linger pays for them again: about 250 bytes a batch on the
//! shared trace after zstd. zstd's trainer, given these bodies, learns little from the
//! bit-packed columns around them. A *raw content* dictionary (zstd takes any bytes without
//! its magic number as one) made of exactly those entries, written as the body writes them
//! (length, then bytes), lets zstd copy each from the dictionary for a few bits.
//!
//! Only entries seen at least twice in the samples go in: a topic carrying a trace id, or a
//! string that is a reading, would cost its bytes once on the uplink and never be matched.

use std::collections::HashMap;

use super::json::{Val, cut};
use super::put_bytes;
use crate::proto::{RecordBody, WireRecord};

/// The dictionary for a class whose recent records are `samples`: at most `max` bytes, the
/// most repeated entries last (zstd reaches them with the shortest offsets).
pub fn dictionary(samples: &[WireRecord], max: usize) -> Vec<u8> {
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut count = |b: &[u8]| {
        if let Some(n) = seen.get_mut(b) {
            *n += 1;
        } else {
            seen.insert(b.to_vec(), 1);
        }
    };
    for r in samples {
        let RecordBody::Message(m) = &r.body else { continue };
        count(m.class.as_bytes());
        count(m.topic.as_bytes());
        if let Some((shape, vals)) = cut(&m.payload) {
            count(&shape);
            for v in &vals {
                if let Val::Str(s) = v {
                    count(s);
                }
            }
        }
    }
    let mut entries: Vec<(usize, Vec<u8>)> = seen.into_iter().filter(|(_, n)| *n >= 2).map(|(b, n)| (n, b)).collect();
    // Least repeated first, ties by bytes, so the same samples give the same dictionary.
    entries.sort();
    let (mut taken, mut size) = (Vec::new(), 0);
    for (_, b) in entries.iter().rev() {
        let mut e = Vec::with_capacity(b.len() + 2);
        put_bytes(&mut e, b);
        if size + e.len() > max {
            break;
        }
        size += e.len();
        taken.push(e);
    }
    // The most repeated were taken first; they go last.
    taken.into_iter().rev().flatten().collect()
}
