//! `uplink send` spans: from reading a traced record out of the spool to the cloud's ack of it.
//!
//! Each span's id is derived from the record's place ([`shared::trace::uplink_span_id`]), so
//! the bridge's `sink commit` span of the same record is its child.

use std::collections::BTreeMap;
use std::time::SystemTime;

use shared::trace::{KeyValue, Kind as SpanKind, SpanRecord, Stage, TraceParent, Tracer, uplink_span_id};

use crate::spool::Record;

/// Traced records tracked at most: each holds its context and class until acked. Past it a
/// record goes untraced on the uplink (its other spans are kept).
const MAX_TRACKED: usize = 16_384;

/// Traced records read for sending and not yet acked, of one spool epoch.
#[derive(Debug)]
pub(crate) struct InFlight {
    tracer: Tracer,
    epoch: String,
    /// By (lane, seq): the context, the class and when the record was first read to send.
    pending: BTreeMap<(u8, u64), (TraceParent, String, SystemTime)>,
}

impl InFlight {
    pub(crate) fn new(tracer: Tracer, epoch: String) -> Self {
        Self { tracer, epoch, pending: BTreeMap::new() }
    }

    /// Records read to be sent: a resent one keeps the time it was first read.
    pub(crate) fn reading(&mut self, records: &[Record]) {
        if !self.tracer.is_on() {
            return;
        }
        let now = SystemTime::now();
        for r in records {
            let Some(m) = r.message() else { continue };
            let at = (r.lane.0, r.seq.0);
            if m.properties.user.is_empty() || self.pending.len() >= MAX_TRACKED || self.pending.contains_key(&at) {
                continue;
            }
            if let Some(parent) = self.tracer.admitted(Stage::Uplink, &m.properties.user) {
                self.pending.insert(at, (parent, m.class.clone(), now));
            }
        }
    }

    /// The cloud acked `lane` through `up_to`: those records' spans end now.
    pub(crate) fn acked(&mut self, lane: u8, up_to: u64) {
        if self.pending.is_empty() {
            return;
        }
        // Split into below this lane (kept), this lane through `up_to` (ending), the rest (kept).
        let above = self.pending.split_off(&(lane, up_to.saturating_add(1)));
        let mut below = std::mem::replace(&mut self.pending, above);
        let ending = below.split_off(&(lane, 0));
        self.pending.extend(below);
        let end = SystemTime::now();
        for ((lane, seq), (parent, class, start)) in ending {
            self.tracer.record(SpanRecord {
                name: "uplink send",
                kind: SpanKind::Producer,
                parent: &parent,
                start,
                end,
                attributes: vec![
                    KeyValue::new("edge.class", class),
                    KeyValue::new("edge.lane", i64::from(lane)),
                    KeyValue::new("edge.seq", i64::try_from(seq).unwrap_or(i64::MAX)),
                    KeyValue::new("edge.epoch", self.epoch.clone()),
                ],
                id: Some(uplink_span_id(&parent.trace_id, &self.epoch, lane, seq)),
            });
        }
    }

    #[cfg(test)]
    fn pending(&self) -> Vec<(u8, u64)> {
        self.pending.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::{Body, Durability, Lane, Message, Properties, Seq};

    fn record(lane: u8, seq: u64, traced: bool) -> Record {
        let user = if traced {
            vec![("traceparent".into(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into())]
        } else {
            Vec::new()
        };
        let message = Message {
            class: "c".into(),
            topic: "t".into(),
            payload: Default::default(),
            qos: 1,
            enqueued_ms: 0,
            expires_ms: None,
            properties: Properties { user, ..Default::default() },
        };
        Record { lane: Lane(lane), seq: Seq(seq), durability: Durability::Normal, body: Body::Message(message) }
    }

    #[test]
    fn an_ack_ends_its_lanes_spans_through_its_seq_and_no_others() {
        let config = shared::trace::TracingConfig { endpoint: Some("http://127.0.0.1:9".into()), ..Default::default() };
        let tracer = Tracer::start(&config, "test", "0", Default::default()).unwrap();
        let mut f = InFlight::new(tracer.clone(), "e".into());
        f.reading(&[record(0, 1, true)]);
        assert_eq!(f.pending(), [], "not traced at its receive: no uplink span");
        let received = record(0, 1, true);
        assert!(tracer.message(&received.message().unwrap().properties.user).is_some());
        f.reading(&[record(0, 1, true), record(0, 2, false), record(0, 3, true), record(1, 1, true)]);
        f.reading(&[record(2, 5, true)]);
        assert_eq!(f.pending(), [(0, 1), (0, 3), (1, 1), (2, 5)]);
        f.acked(1, 9);
        assert_eq!(f.pending(), [(0, 1), (0, 3), (2, 5)]);
        f.acked(0, 1);
        assert_eq!(f.pending(), [(0, 3), (2, 5)]);
        tracer.shutdown();
    }

    /// Issue 43, finding 10: `max_traced_per_second` bounds the uplink's spans too, however many
    /// records carry a context the receive admitted.
    #[test]
    fn the_rate_bounds_uplink_spans() {
        let config = shared::trace::TracingConfig {
            endpoint: Some("http://127.0.0.1:9".into()),
            max_traced_per_second: 5,
            ..Default::default()
        };
        let tracer = Tracer::start(&config, "test", "0", Default::default()).unwrap();
        assert!(tracer.message(&record(0, 1, true).message().unwrap().properties.user).is_some());
        let mut f = InFlight::new(tracer.clone(), "e".into());
        f.reading(&(1..=2000).map(|seq| record(0, seq, true)).collect::<Vec<_>>());
        // Five a second; a second boundary while reading may admit five more.
        assert!((5..=10).contains(&f.pending().len()), "{}", f.pending().len());
        assert!(tracer.counts().messages("span_rate_limited") >= 1990);
        tracer.shutdown();
    }
}
