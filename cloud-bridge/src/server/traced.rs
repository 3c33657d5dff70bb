//! `sink commit` spans: from a publish starting to the sink having its records, one span per
//! traced record, each the child of the edge's `uplink send` span of that record (whose id
//! both ends derive from the record's place, [`shared::trace::uplink_span_id`]).

use std::time::SystemTime;

use shared::proto::{RecordBody, WireRecord};
use shared::trace::{KeyValue, Kind as SpanKind, SpanRecord, Stage, TraceParent, Tracer, uplink_span_id};

/// The traced records of one publish.
pub(crate) struct SinkSpans {
    edge: String,
    epoch: String,
    lane: u8,
    start: SystemTime,
    /// Per record: its context, seq and topic.
    records: Vec<(TraceParent, u64, String)>,
}

impl SinkSpans {
    /// The traced records among `records`, if tracing is on and there are any.
    pub(crate) fn of(tracer: &Tracer, edge: &str, epoch: &str, lane: u8, records: &[WireRecord]) -> Option<Self> {
        if !tracer.is_on() {
            return None;
        }
        let traced: Vec<_> = records
            .iter()
            .filter_map(|r| match &r.body {
                RecordBody::Message(m) if !m.user_properties.is_empty() => {
                    tracer.continued(Stage::Sink, &m.user_properties).map(|p| (p, r.seq.0, m.topic.clone()))
                }
                _ => None,
            })
            .collect();
        (!traced.is_empty()).then(|| Self {
            edge: edge.to_owned(),
            epoch: epoch.to_owned(),
            lane,
            start: SystemTime::now(),
            records: traced,
        })
    }

    /// The publish is done: `ok` if the sink has the records.
    pub(crate) fn record(self, tracer: &Tracer, ok: bool) {
        let end = SystemTime::now();
        for (parent, seq, topic) in self.records {
            let uplink = parent.child(uplink_span_id(&parent.trace_id, &self.epoch, self.lane, seq));
            tracer.record(SpanRecord {
                name: "sink commit",
                kind: SpanKind::Consumer,
                parent: &uplink,
                start: self.start,
                end,
                attributes: vec![
                    KeyValue::new("messaging.destination.name", topic),
                    KeyValue::new("edge.id", self.edge.clone()),
                    KeyValue::new("edge.lane", i64::from(self.lane)),
                    KeyValue::new("edge.seq", i64::try_from(seq).unwrap_or(i64::MAX)),
                    KeyValue::new("sink.outcome", if ok { "committed" } else { "failed" }),
                ],
                id: None,
            });
        }
    }
}
