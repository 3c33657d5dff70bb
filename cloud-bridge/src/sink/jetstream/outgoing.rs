//! A batch's records as JetStream messages: subject, headers (the message id that makes a
//! resend a duplicate, the edge's sequence, the MQTT properties) and payload.

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, IntoHeaderName};
use bytes::Bytes;
use shared::proto::{RecordBody, WireRecord};

use super::header::header_safe;
use crate::sink::SinkError;

#[derive(Debug, Clone)]
pub(super) struct Outgoing {
    pub(super) subject: String,
    pub(super) headers: HeaderMap,
    pub(super) payload: Bytes,
}

impl Outgoing {
    /// At least what the message takes of the server's `max_payload`: the payload and the
    /// headers as the client writes them.
    pub(super) fn size(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, values)| {
                values
                    .iter()
                    .map(|v| <HeaderName as AsRef<str>>::as_ref(name).len() + v.as_str().len() + 4)
                    .sum::<usize>()
            })
            .sum();
        self.payload.len() + headers + 16
    }
}

/// `messages` addressed again from `records` (a publish moves subjects and headers out).
pub(super) fn readdress(
    messages: &mut [Outgoing],
    records: &[WireRecord],
    address: impl Fn(&WireRecord) -> (String, HeaderMap),
) {
    for (m, r) in messages.iter_mut().zip(records) {
        (m.subject, m.headers) = address(r);
    }
}

/// `messages` as (subject, headers, payload), moved out.
pub(super) fn triples(messages: &mut [Outgoing]) -> Vec<(String, HeaderMap, Bytes)> {
    messages
        .iter_mut()
        .map(|m| (std::mem::take(&mut m.subject), std::mem::take(&mut m.headers), m.payload.clone()))
        .collect()
}

/// The JetStream messages of `records`, one per record: subject, headers, payload. Message
/// payloads move out of `records` (the rest of each record stays, for [`addressed`]). Records
/// with neither a message nor a gap must have been dropped before.
pub(super) fn outgoing(
    prefix: &str,
    edge: &str,
    epoch: &str,
    lane: u8,
    records: &mut [WireRecord],
) -> Result<Vec<Outgoing>, SinkError> {
    let mut messages = Vec::with_capacity(records.len());
    for r in records {
        let payload = match &mut r.body {
            RecordBody::Message(m) => Bytes::from(std::mem::take(&mut m.payload)),
            RecordBody::Gap(g) => Bytes::from(serde_json::to_vec(g).map_err(|e| SinkError::invalid("gap record", e))?),
        };
        let (subject, headers) = addressed(prefix, edge, epoch, lane, r);
        messages.push(Outgoing { subject, headers, payload });
    }
    Ok(messages)
}

// Header names as constants, so a record's headers do not allocate them.
const EDGE_ID: HeaderName = HeaderName::from_static("Edge-Id");
const EDGE_SEQ: HeaderName = HeaderName::from_static("Edge-Seq");
/// The names `names::headers` gives besides user properties.
const MQTT_HEADERS: [HeaderName; 4] = [
    HeaderName::from_static("Mqtt-Topic"),
    HeaderName::from_static("Mqtt-Qos"),
    HeaderName::from_static("Mqtt-Correlation-Data"),
    HeaderName::from_static("Mqtt-Content-Type"),
];

fn header_name(name: &str) -> HeaderName {
    match MQTT_HEADERS.iter().find(|h| <HeaderName as AsRef<str>>::as_ref(h) == name) {
        Some(known) => known.clone(),
        None => header_safe(name, true).into_owned().into_header_name(),
    }
}

/// A record's subject and headers.
pub(super) fn addressed(prefix: &str, edge: &str, epoch: &str, lane: u8, r: &WireRecord) -> (String, HeaderMap) {
    let mut headers = HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, format!("{edge}:{epoch}:{lane}:{}", r.seq));
    headers.insert(EDGE_ID, edge);
    headers.insert(EDGE_SEQ, format!("{epoch}:{lane}:{}", r.seq));
    let subject = match r.as_message() {
        Some(m) => {
            for (name, value) in crate::names::headers(m) {
                headers.append(header_name(&name), header_safe(&value, false).into_owned());
            }
            crate::names::subject(prefix, edge, &m.topic)
        }
        None => format!("{prefix}.{}.%gap", crate::names::token(edge)),
    };
    (subject, headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::proto::Seq;

    #[test]
    fn a_record_is_addressed_with_its_headers() {
        let record = WireRecord::message(
            Seq(7),
            shared::proto::WireMessage {
                class: "inference".into(),
                topic: "inference/yolo/v3.2/cam 1".into(),
                payload: b"p".to_vec(),
                qos: 1,
                enqueued_ms: 1,
                expires_ms: None,
                user_properties: vec![("trace id:x".into(), "a\r\nb".into()), ("trace-id".into(), "t-1".into())],
                correlation_data: Some(vec![0, 1, 2]),
                content_type: Some("text/plain".into()),
                schema: None,
            },
        );
        let (subject, headers) = addressed("edge", "edge-1", "ep", 3, &record);
        assert_eq!(subject, "edge.edge-1.inference.yolo.v3%2E2.cam%201");
        let get = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
        assert_eq!(get("Nats-Msg-Id").as_deref(), Some("edge-1:ep:3:7"));
        assert_eq!(get("Edge-Id").as_deref(), Some("edge-1"));
        assert_eq!(get("Edge-Seq").as_deref(), Some("ep:3:7"));
        assert_eq!(get("Mqtt-Topic").as_deref(), Some("inference/yolo/v3.2/cam 1"));
        assert_eq!(get("Mqtt-Qos").as_deref(), Some("1"));
        assert_eq!(get("trace%20id%3Ax").as_deref(), Some("a%0D%0Ab"));
        assert_eq!(get("trace-id").as_deref(), Some("t-1"));
        assert_eq!(get("Mqtt-Correlation-Data").as_deref(), Some("AAEC"));
        assert_eq!(get("Mqtt-Content-Type").as_deref(), Some("text/plain"));
        let lost = shared::proto::WireGap {
            class: "t".into(),
            reason: shared::proto::GapReason::Evicted,
            ranges: vec![(1, 2)],
            count: 2,
        };
        let gap = WireRecord::gap(Seq(8), lost);
        assert_eq!(addressed("edge", "a.b", "ep", 3, &gap).0, "edge.a%2Eb.%gap");
    }
}
