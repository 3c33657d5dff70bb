//! An edge's downlink position in JetStream, and how its seqs map onto the `DOWN` stream's.
//!
//! An edge's seq for a message is `base` + the stream's sequence, counted in the stream the
//! edge's document names (its creation time). The stream's sequence starts over when the
//! stream is deleted and made again, and the edges' positions do not: without a base, the new
//! stream's first messages would take seqs the edges already hold, be taken as delivered and
//! purged. So:
//!
//! - A document naming another stream (the stream was made anew) is moved onto the new one by
//!   the edge's session, the one party that knows the furthest seq the edge holds: every
//!   message of the new stream then comes after it. Until then, nothing of the new stream is
//!   purged or set aside for the edge by what an old seq says.
//! - A position past everything the stream ever stored (an edge's hello restoring a position
//!   the bucket lost, or a stream made anew while no message was waiting) has the stream's
//!   next message after it, as the SQLite sink's counter goes past a restored position.
//! - A document without a stream (written before bases, or new) takes the stream as it is.

use shared::proto::MAX_SEQ;

use crate::sink::downlink::DownState;

/// The stream as the sink just read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StreamNow {
    /// Its creation time, in ns since the Unix epoch: a stream made anew has another.
    pub id: String,
    /// The last sequence it handed out.
    pub last_seq: u64,
}

/// An edge's entry in the positions bucket: its id (the key is made safe from it), state, and
/// the bytes `send` stored for it and its acks covered, whose difference is its backlog's bytes
/// (JetStream keeps no byte count per subject, and reading the backlog per send costs as much
/// as the backlog). Messages another publisher stored are not in `stored_bytes`: their bytes
/// are not bounded, their count is.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct PositionDoc {
    pub edge: String,
    #[serde(flatten)]
    pub state: DownState,
    #[serde(default)]
    pub stored_bytes: u64,
    #[serde(default)]
    pub done_bytes: u64,
    /// The stream the edge's seqs are counted in ([`StreamNow::id`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// What the stream's sequence is offset by in the edge's seqs.
    #[serde(default)]
    pub base: u64,
    /// The last send ids stored for the edge: id, seq, when (ms since the Unix epoch); see
    /// [`crate::sink::downlink::SEND_IDS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<(String, u64, u64)>,
}

impl PositionDoc {
    /// Whether the edge's seqs are counted in `now` (a document without a stream takes it).
    pub(crate) fn counts_in(&self, now: &StreamNow) -> bool {
        self.stream.as_ref().is_none_or(|s| *s == now.id)
    }

    /// The edge's seq of the stream's sequence `q`.
    pub(crate) fn edge_seq(&self, q: u64) -> u64 {
        self.base.saturating_add(q)
    }

    /// The stream's sequence of the edge's seq `seq`, if the stream can hold it.
    pub(crate) fn stream_seq(&self, seq: u64) -> Option<u64> {
        seq.checked_sub(self.base).filter(|q| *q > 0)
    }

    /// The first stream sequence after the edge's seq `seq`.
    pub(crate) fn stream_after(&self, seq: u64) -> u64 {
        seq.saturating_sub(self.base) + 1
    }

    /// Counts the edge's seqs in `now`; `held`: the furthest seq the edge holds, known only to
    /// its session. True if the document changed (and must be written before any seq it
    /// maps is handed out). See the module doc.
    pub(crate) fn settle(&mut self, now: &StreamNow, held: Option<u64>) -> bool {
        let mut changed = false;
        match (&self.stream, held) {
            (None, _) => {
                self.stream = Some(now.id.clone());
                changed = true;
            }
            (Some(s), Some(held)) if *s != now.id => {
                self.base = self.state.position.max(held);
                self.stream = Some(now.id.clone());
                changed = true;
            }
            // Another stream, and what the edge holds unknown: left to its session.
            (Some(_), _) => {}
        }
        let top = self.state.position.max(held.unwrap_or(0));
        if self.counts_in(now) && top > self.base.saturating_add(now.last_seq) {
            self.base = top - now.last_seq;
            changed = true;
        }
        changed
    }

    /// The seq a send with `id` stored, if it is among those kept and not older than `since_ms`.
    pub(crate) fn sent(&self, id: &str, since_ms: u64) -> Option<u64> {
        self.ids.iter().find(|(i, _, at)| i == id && *at >= since_ms).map(|(_, seq, _)| *seq)
    }

    /// Keeps `id` as stored at `seq`, forgetting ids older than `since_ms` and past `keep`.
    pub(crate) fn keep_id(&mut self, id: &str, seq: u64, now_ms: u64, since_ms: u64, keep: usize) {
        self.ids.retain(|(i, _, at)| i != id && *at >= since_ms);
        self.ids.push((id.to_owned(), seq, now_ms));
        let over = self.ids.len().saturating_sub(keep);
        self.ids.drain(..over);
    }

    /// Whether the stream's sequence `q` is past the seqs an edge may have.
    pub(crate) fn past_max(&self, q: u64) -> bool {
        self.edge_seq(q) > MAX_SEQ
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now(id: &str, last_seq: u64) -> StreamNow {
        StreamNow { id: id.into(), last_seq }
    }

    fn at(position: u64) -> PositionDoc {
        PositionDoc { edge: "e".into(), state: DownState { position, ..Default::default() }, ..Default::default() }
    }

    #[test]
    fn a_stream_made_anew_counts_after_what_the_edge_holds() {
        let mut doc = at(30);
        assert!(doc.settle(&now("a", 40), None));
        assert_eq!((doc.stream.as_deref(), doc.base), (Some("a"), 0));
        assert!(!doc.settle(&now("a", 45), Some(40)));

        // Made anew with two messages in it: a read of the session, which sent up to 40,
        // counts them after 40; an ack or a send alone does not move the base.
        assert!(!doc.settle(&now("b", 2), None));
        assert!(!doc.counts_in(&now("b", 2)));
        assert!(doc.settle(&now("b", 2), Some(40)));
        assert_eq!((doc.base, doc.edge_seq(1), doc.stream_after(40)), (40, 41, 1));
        assert_eq!((doc.stream_seq(41), doc.stream_seq(40)), (Some(1), None));
        assert!(!doc.settle(&now("b", 9), Some(43)));
    }

    #[test]
    fn a_position_past_all_the_stream_stored_has_the_next_message_after_it() {
        // The bucket lost the edge's entry; its hello restores position 1000 on a stream at 7.
        let mut doc = at(1000);
        assert!(doc.settle(&now("a", 7), None));
        assert_eq!((doc.base, doc.edge_seq(8)), (993, 1001));
        // Everything it stored is at or below the position; later acks within the stream do
        // not move the base.
        assert_eq!(doc.stream_after(1000), 8);
        doc.state.position = 1001;
        assert!(!doc.settle(&now("a", 8), None));
        assert!(doc.past_max(MAX_SEQ) && !doc.past_max(1));
    }

    #[test]
    fn a_document_of_a_bridge_before_bases_reads_as_it_was() {
        let old =
            r#"{"edge":"e","position":5,"delivered":5,"refused":0,"expired":0,"stored_bytes":50,"done_bytes":50}"#;
        let mut doc: PositionDoc = serde_json::from_str(old).unwrap();
        assert_eq!((doc.stream.as_deref(), doc.base), (None, 0));
        assert!(doc.counts_in(&now("x", 9)));
        assert!(doc.settle(&now("x", 9), None));
        assert_eq!((doc.stream.as_deref(), doc.base, doc.edge_seq(6)), (Some("x"), 0, 6));
    }
}
