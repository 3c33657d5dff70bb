//! What the news read got, kept a moment for the sessions it wakes.
//!
//! The news read gets every downlink message after its cursor to learn whose it is, and the
//! session it then wakes got the same message again: two JSON API gets per message, the
//! second a search of the stream on the edge's subjects. So the news read keeps what it got
//! here (at most `read_ahead_bytes`, and for at most [`KEEP`]), and a session's read takes its
//! messages from here when what is kept for its edge is complete from where the read starts.
//!
//! - **Complete.** The news read's runs leave no message out (`raw::get_run`), so for every
//!   edge the messages kept are all of its messages in the stream after `from` (the kept
//!   range's start, raised past what was dropped) up to `upto` (the news read's cursor),
//!   less what was forgotten for that edge (its own `from`). A read that starts below that,
//!   or counts in another stream than the one kept, reads the stream as before; so does a read
//!   that finds nothing kept. A read served here stops at `upto`: the news read finds what
//!   came later, and wakes the session again.
//! - **Not stale.** A message kept was in the stream at most [`KEEP`] before, on the same
//!   connection to the servers: a server that crashed may have lost its last messages and given
//!   their sequences to new ones, so what was kept before a reconnect is dropped and never
//!   taken (the news watch wakes every session after it lost the sink). The bridge's own
//!   trim forgets an edge's messages before it deletes one (what it set aside is never
//!   delivered from here). Another writer's purge within that moment races the read as it
//!   always did: the message was there when it was read.
//! - **Bounded.** Past `read_ahead_bytes` (as the window weighs messages) the oldest go; past
//!   [`MAX_EDGES`] edges with something forgotten, all of it goes. `0` keeps nothing.
//! - A subject that is not UTF-8 is never kept: its edge reads the stream, which sets the
//!   message aside as before.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::sink::downlink::{Pending, ReadLimit};
use crate::sink::metrics::{OutcomeLabel, SinkMetrics};

/// How long a message is kept for a session's read.
pub(super) const KEEP: Duration = Duration::from_secs(2);

/// Edges with an entry of their own (something forgotten) past which everything is dropped: a
/// publisher writing subjects that are not UTF-8 under many edge tokens would grow it.
const MAX_EDGES: usize = 65_536;

/// The news read's messages, for the sessions' reads.
#[derive(Debug)]
pub(in crate::sink) struct ReadAhead {
    /// At most this many bytes kept; 0: none.
    cap: u64,
    kept: Mutex<Kept>,
    metrics: OnceLock<Arc<SinkMetrics>>,
}

#[derive(Debug, Default)]
struct Kept {
    /// The stream (its creation) the sequences count in; none: nothing can be taken.
    stream: Option<String>,
    /// The client's connects when it was read: a reconnect may find the sequences reused.
    connects: u64,
    /// Every edge's messages in `(from, upto]` are kept, but for what `edges` forgot.
    from: u64,
    upto: u64,
    edges: HashMap<String, EdgeKept>,
    /// Every message kept, in stream order: (sequence, when kept, edge token, weight).
    order: VecDeque<(u64, Instant, String, u64)>,
    bytes: u64,
}

#[derive(Debug, Default)]
struct EdgeKept {
    /// This edge's messages kept are complete after this (and after `Kept::from`).
    from: u64,
    /// Its messages, `seq` the stream's sequence, in order.
    msgs: VecDeque<Pending>,
}

impl ReadAhead {
    pub(in crate::sink) fn new(cap: u64) -> Self {
        Self { cap, kept: Mutex::default(), metrics: OnceLock::new() }
    }

    /// Counts its reads into `metrics` from now on.
    pub(in crate::sink) fn count_into(&self, metrics: Arc<SinkMetrics>) {
        let _ = self.metrics.set(metrics);
    }

    /// Whether it keeps anything (the news read need not parse for it otherwise).
    pub(super) fn on(&self) -> bool {
        self.cap > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops everything: what comes after `at` in `stream`, on the client's `connects`th
    /// connection, is kept from now on.
    pub(super) fn restart(&self, stream: Option<String>, connects: u64, at: u64) {
        *self.lock() = Kept { stream, connects, from: at, upto: at, ..Kept::default() };
    }

    /// The news read goes on from `cursor`, in `stream` when it knows which, on the client's
    /// `connects`th connection: a gap after what is kept, another stream or a reconnect starts
    /// over.
    pub(super) fn resume(&self, stream: Option<&str>, connects: u64, cursor: u64) {
        let mut k = self.lock();
        let other = stream.is_some_and(|s| k.stream.as_deref() != Some(s));
        if other || connects != k.connects || cursor > k.upto {
            let stream = stream.map(str::to_owned).or(k.stream.take());
            *k = Kept { stream, connects, from: cursor, upto: cursor, ..Kept::default() };
        }
    }

    /// The news read got message `seq`: edge `token`'s (none: no edge's) as `make` gives it,
    /// `seq` its stream sequence. Called in stream order, with no message left out since the
    /// last call (or the last `resume`); what came before is ignored.
    pub(super) fn keep(&self, seq: u64, token: Option<&str>, make: impl FnOnce() -> Option<Pending>) {
        if !self.on() {
            return;
        }
        let mut k = self.lock();
        if seq <= k.upto {
            return;
        }
        k.upto = seq;
        let Some(token) = token else { return };
        match make().map(|p| (p.msg.bytes(), p)) {
            Some((weight, p)) if weight <= self.cap => {
                let from = k.from;
                let e = k.edges.entry(token.to_owned()).or_insert_with(|| EdgeKept { from, msgs: VecDeque::new() });
                // Forgotten up to past it (a trim is deleting it): not kept.
                if seq <= e.from {
                    return;
                }
                e.msgs.push_back(p);
                k.order.push_back((seq, Instant::now(), token.to_owned(), weight));
                k.bytes += weight;
            }
            // Not kept, so this edge's messages are complete only after it.
            _ => forget_in(&mut k, token, seq),
        }
        self.evict(&mut k, Instant::now());
    }

    /// Forgets what is kept of edge `token` up to `seq` and to what the news read got (the trim
    /// deletes `seq` next: a news read under way may still bring it).
    pub(super) fn forget(&self, token: &str, seq: u64) {
        if self.on() {
            forget_in(&mut self.lock(), token, seq);
        }
    }

    /// Edge `token`'s messages from stream sequence `next` on, within `max`, as `stream` counts
    /// them on the client's `connects`th connection: none if what is kept is not complete from
    /// there, or holds nothing from there.
    pub(super) fn take(
        &self,
        token: &str,
        (stream, connects): (&str, u64),
        next: u64,
        max: ReadLimit,
    ) -> Option<Vec<Pending>> {
        // Counted when it keeps nothing too: every read then reads the stream.
        let taken = if !self.on() {
            None
        } else {
            let mut k = self.lock();
            self.evict(&mut k, Instant::now());
            let edge = k.edges.get(token);
            let from = edge.map_or(k.from, |e| e.from.max(k.from));
            match edge {
                Some(e) if k.stream.as_deref() == Some(stream) && k.connects == connects && next > from => {
                    let start = e.msgs.partition_point(|p| p.seq < next);
                    let (mut out, mut bytes) = (Vec::new(), 0);
                    for p in e.msgs.range(start..) {
                        if max.reached(out.len(), bytes) {
                            break;
                        }
                        bytes += p.msg.bytes();
                        out.push(p.clone());
                    }
                    Some(out).filter(|o| !o.is_empty())
                }
                _ => None,
            }
        };
        if let Some(m) = self.metrics.get() {
            let outcome = if taken.is_some() { "kept" } else { "stream" };
            m.downlink_reads.get_or_create(&OutcomeLabel { outcome }).inc();
        }
        taken
    }

    /// Drops the oldest past the bytes or [`KEEP`], and everything past [`MAX_EDGES`].
    fn evict(&self, k: &mut Kept, now: Instant) {
        while let Some((seq, at, _, _)) = k.order.front()
            && (k.bytes > self.cap || now.duration_since(*at) > KEEP)
        {
            let seq = *seq;
            let (_, _, token, weight) = k.order.pop_front().expect("a front");
            // All before it went before it: every edge's messages are complete after it at most.
            k.from = k.from.max(seq);
            let Some(e) = k.edges.get_mut(&token) else { continue };
            // Forgotten before (its bytes went then) if it is not the edge's first.
            if e.msgs.front().is_some_and(|p| p.seq == seq) {
                e.msgs.pop_front();
                k.bytes -= weight;
            }
            if e.msgs.is_empty() && e.from <= k.from {
                k.edges.remove(&token);
            }
        }
        if k.edges.len() > MAX_EDGES {
            let (stream, connects, at) = (k.stream.take(), k.connects, k.upto);
            *k = Kept { stream, connects, from: at, upto: at, ..Kept::default() };
        }
    }
}

fn forget_in(k: &mut Kept, token: &str, seq: u64) {
    let (from, upto) = (k.from, k.upto);
    let e = k.edges.entry(token.to_owned()).or_insert_with(|| EdgeKept { from, msgs: VecDeque::new() });
    let freed: u64 = e.msgs.drain(..).map(|p| p.msg.bytes()).sum();
    e.from = e.from.max(seq).max(upto);
    k.bytes -= freed;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::downlink::Outgoing;

    fn msg(seq: u64, bytes: usize) -> Option<Pending> {
        let msg = Outgoing { topic: String::new(), payload: vec![7; bytes], qos: 1, ..Default::default() };
        Some(Pending { seq, stored_ms: seq, msg, invalid: None })
    }

    fn seqs(got: Option<Vec<Pending>>) -> Option<Vec<u64>> {
        got.map(|v| v.into_iter().map(|p| p.seq).collect())
    }

    fn ahead(cap: u64) -> ReadAhead {
        let a = ReadAhead::new(cap);
        a.restart(Some("s1".into()), 1, 10);
        a
    }

    const ALL: ReadLimit = ReadLimit { messages: 100, bytes: u64::MAX };

    #[test]
    fn a_read_takes_what_is_kept_from_where_it_starts_within_its_limit() {
        let a = ahead(1 << 20);
        for seq in 11..=16 {
            a.keep(seq, Some(if seq % 2 == 0 { "e" } else { "f" }), || msg(seq, 100));
        }
        assert_eq!(seqs(a.take("e", ("s1", 1), 11, ALL)), Some(vec![12, 14, 16]));
        assert_eq!(seqs(a.take("e", ("s1", 1), 13, ALL)), Some(vec![14, 16]), "what a read took stays for the next");
        assert_eq!(seqs(a.take("f", ("s1", 1), 11, ReadLimit::messages(2))), Some(vec![11, 13]));
        // The message reaching the bytes is the last one taken, as a stream read does.
        assert_eq!(seqs(a.take("e", ("s1", 1), 11, ReadLimit { messages: 9, bytes: 150 })), Some(vec![12, 14]));
        assert_eq!(a.take("e", ("s1", 1), 17, ALL).map(|v| v.len()), None, "nothing kept from there: the stream");
        assert_eq!(a.take("g", ("s1", 1), 11, ALL).map(|v| v.len()), None);
    }

    #[test]
    fn a_read_from_before_what_is_complete_or_in_another_stream_reads_the_stream() {
        let a = ahead(1 << 20);
        a.keep(11, Some("e"), || msg(11, 10));
        // Message 10 and before were never seen: a read from them cannot be answered here.
        assert!(a.take("e", ("s1", 1), 10, ALL).is_none());
        assert_eq!(seqs(a.take("e", ("s1", 1), 11, ALL)), Some(vec![11]));
        assert!(a.take("e", ("s2", 1), 11, ALL).is_none(), "a stream made anew counts its sequences over");
        // A gap in what the news read saw (it failed and went on further) starts over.
        a.resume(Some("s1"), 1, 20);
        assert!(a.take("e", ("s1", 1), 11, ALL).is_none());
        a.keep(21, Some("e"), || msg(21, 10));
        assert_eq!(seqs(a.take("e", ("s1", 1), 21, ALL)), Some(vec![21]));
        a.resume(Some("s2"), 1, 21);
        assert!(a.take("e", ("s1", 1), 21, ALL).is_none() && a.take("e", ("s2", 1), 21, ALL).is_none());
    }

    #[test]
    fn what_was_kept_before_a_reconnect_is_never_taken() {
        let a = ahead(1 << 20);
        a.keep(11, Some("e"), || msg(11, 10));
        // A server back from a crash may hold another message as 11: until the news read goes
        // on, reads on the new connection look in the stream.
        assert!(a.take("e", ("s1", 2), 11, ALL).is_none());
        a.resume(None, 2, 11);
        assert!(a.take("e", ("s1", 2), 11, ALL).is_none(), "dropped when the news read goes on");
        a.keep(12, Some("e"), || msg(12, 10));
        assert_eq!(seqs(a.take("e", ("s1", 2), 12, ALL)), Some(vec![12]));
    }

    #[test]
    fn what_is_read_again_or_not_an_edges_moves_on_without_being_kept() {
        let a = ahead(1 << 20);
        a.keep(11, Some("e"), || msg(11, 10));
        a.keep(11, Some("e"), || panic!("read again: not made again"));
        a.keep(12, None, || panic!("no edge's: not made"));
        a.keep(13, Some("e"), || msg(13, 10));
        assert_eq!(seqs(a.take("e", ("s1", 1), 11, ALL)), Some(vec![11, 13]));
    }

    #[test]
    fn a_trim_forgets_the_edge_up_to_what_it_deletes_and_what_was_read() {
        let a = ahead(1 << 20);
        for seq in 11..=14 {
            a.keep(seq, Some("e"), || msg(seq, 10));
        }
        a.keep(15, Some("f"), || msg(15, 10));
        a.forget("e", 14);
        assert!(a.take("e", ("s1", 1), 12, ALL).is_none());
        assert_eq!(seqs(a.take("f", ("s1", 1), 15, ALL)), Some(vec![15]), "other edges keep theirs");
        // A news read under way brings the deleted one: it is not kept.
        a.forget("e", 17);
        a.keep(16, Some("e"), || msg(16, 10));
        a.keep(17, Some("e"), || msg(17, 10));
        assert!(a.take("e", ("s1", 1), 16, ALL).is_none());
        a.keep(18, Some("e"), || msg(18, 10));
        assert_eq!(seqs(a.take("e", ("s1", 1), 18, ALL)), Some(vec![18]));
        // A message that cannot be kept (no UTF-8 subject) is forgotten so.
        a.keep(19, Some("e"), || None);
        a.keep(20, Some("e"), || msg(20, 10));
        assert!(a.take("e", ("s1", 1), 18, ALL).is_none());
        assert_eq!(seqs(a.take("e", ("s1", 1), 20, ALL)), Some(vec![20]));
    }

    #[test]
    fn past_its_bytes_the_oldest_go_and_reads_from_them_read_the_stream() {
        let a = ahead(300);
        for seq in 11..=15 {
            a.keep(seq, Some(if seq == 13 { "f" } else { "e" }), || msg(seq, 100));
        }
        // 11 and 12 went (500 bytes kept past 300): every edge's messages complete after 12.
        assert_eq!(a.lock().bytes, 300);
        assert!(a.take("e", ("s1", 1), 11, ALL).is_none());
        assert_eq!(seqs(a.take("e", ("s1", 1), 13, ALL)), Some(vec![14, 15]));
        assert_eq!(seqs(a.take("f", ("s1", 1), 13, ALL)), Some(vec![13]));
        // One larger than all it holds is not kept; its edge reads the stream from before it.
        a.keep(16, Some("e"), || msg(16, 301));
        assert!(a.take("e", ("s1", 1), 14, ALL).is_none());
        assert!(ahead(0).take("e", ("s1", 1), 11, ALL).is_none(), "0 keeps nothing");
    }

    #[test]
    fn what_was_kept_longer_than_keep_goes() {
        let a = ahead(1 << 20);
        a.keep(11, Some("e"), || msg(11, 10));
        let later = Instant::now() + KEEP + Duration::from_millis(1);
        a.evict(&mut a.lock(), later);
        assert!(a.take("e", ("s1", 1), 11, ALL).is_none());
        let k = a.lock();
        assert_eq!((k.from, k.bytes, k.edges.len()), (11, 0, 0));
    }

    #[test]
    fn edges_forgotten_past_the_bound_drop_everything() {
        let a = ahead(1 << 20);
        a.keep(11, Some("e"), || msg(11, 10));
        for i in 0..MAX_EDGES as u64 {
            a.keep(12 + i, Some(&format!("x{i}")), || None);
        }
        let k = a.lock();
        assert!(k.edges.is_empty() && k.order.is_empty() && k.from == k.upto);
    }
}
