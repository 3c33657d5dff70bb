//! What is traced: `max_traced_per_second` bounds each kind of span on its own ([`Window`] per
//! [`Stage`]), and the edge's later stages trace only messages its receive admitted
//! ([`Admitted`]), so a trace past the rate is whole or absent rather than a receive span of
//! one message beside the spool span of another.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// Where a span is made after a message's receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The edge's `spool commit`.
    Spool,
    /// The edge's `uplink send`.
    Uplink,
    /// The bridge's `sink commit`.
    Sink,
}

pub(super) const COUNT_BITS: u32 = 24;

/// Messages admitted in the current second, in one word: the second in the high 40 bits, the
/// count in the low 24 (the rate is capped to fit).
#[derive(Debug, Default)]
pub(super) struct Window(AtomicU64);

impl Window {
    /// Whether one more may go this second, within `max_per_second`.
    pub(super) fn admit(&self, max_per_second: u64) -> bool {
        let second = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut seen = self.0.load(Ordering::Relaxed);
        loop {
            let (at, count) = (seen >> COUNT_BITS, seen & ((1 << COUNT_BITS) - 1));
            let next = if at == second & ((1 << 40) - 1) {
                if count >= max_per_second {
                    return false;
                }
                seen + 1
            } else {
                ((second & ((1 << 40) - 1)) << COUNT_BITS) | 1
            };
            match self.0.compare_exchange_weak(seen, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return max_per_second > 0,
                Err(now) => seen = now,
            }
        }
    }
}

/// The contexts (trace id and parent span id) the receive admitted lately, the newest
/// `capacity`: a record read for the uplink after that many more were admitted (a long outage
/// at the full rate) goes without its `uplink send` span.
#[derive(Debug)]
pub(super) struct Admitted {
    capacity: usize,
    seen: Mutex<Kept>,
}

/// The keys, to look up and in the order they came (the oldest goes first).
type Kept = (HashSet<[u8; 24]>, VecDeque<[u8; 24]>);

/// The contexts kept at most, whatever the rate: 65,536 of 24 bytes.
const MOST_ADMITTED: usize = 65_536;

impl Admitted {
    /// Room for a minute at `max_per_second`, within [1,024, 65,536].
    pub(super) fn new(max_per_second: u64) -> Self {
        let capacity = usize::try_from(max_per_second.saturating_mul(60)).unwrap_or(usize::MAX);
        Self { capacity: capacity.clamp(1024, MOST_ADMITTED), seen: Mutex::default() }
    }

    pub(super) fn insert(&self, key: [u8; 24]) {
        let mut guard = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (set, order) = &mut *guard;
        if set.insert(key) {
            order.push_back(key);
            if order.len() > self.capacity
                && let Some(old) = order.pop_front()
            {
                set.remove(&old);
            }
        }
    }

    pub(super) fn contains(&self, key: &[u8; 24]) -> bool {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).0.contains(key)
    }
}

/// A context's key: its trace id and the publisher's span id.
pub(super) fn key(trace_id: &[u8; 16], span_id: &[u8; 8]) -> [u8; 24] {
    let mut k = [0; 24];
    k[..16].copy_from_slice(trace_id);
    k[16..].copy_from_slice(span_id);
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admitted_contexts_are_kept_to_their_capacity_oldest_out() {
        let a = Admitted::new(1);
        assert_eq!(a.capacity, 1024);
        for i in 0..1100u32 {
            a.insert(key(&[0; 16], &u64::from(i).to_be_bytes()));
        }
        a.insert(key(&[0; 16], &1099u64.to_be_bytes()));
        assert!(!a.contains(&key(&[0; 16], &0u64.to_be_bytes())));
        assert!(a.contains(&key(&[0; 16], &76u64.to_be_bytes())));
        assert!(a.contains(&key(&[0; 16], &1099u64.to_be_bytes())));
        assert_eq!(Admitted::new(1_000_000).capacity, MOST_ADMITTED);
    }
}
