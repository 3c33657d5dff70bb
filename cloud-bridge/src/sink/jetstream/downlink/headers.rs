//! The MQTT side of a downlink message in JetStream: the headers of `sink::down_headers`, the
//! topic from the subject.

use async_nats::HeaderMap;

use crate::names;
use crate::sink::down_headers;
use crate::sink::downlink::Outgoing;

pub(super) fn headers(msg: &Outgoing) -> HeaderMap {
    // No `Mqtt-Topic`: the subject names the topic, and only the subject (see `parse`).
    let mut h = HeaderMap::new();
    for (name, value) in down_headers::headers(msg) {
        h.insert(name, value.as_str());
    }
    h
}

/// The message `headers` and `payload` stand for on the topic `topic_tokens` (a subject's,
/// after the prefix and the edge) name; or why not. The subject alone names the topic: NATS
/// permissions on `down.<edge>.<levels>` then bound what topics a publisher reaches, which a
/// topic header would get around, so an `Mqtt-Topic` naming another topic is refused.
pub(super) fn parse(topic_tokens: &[&str], headers: &HeaderMap, payload: Vec<u8>) -> (Outgoing, Option<String>) {
    let pairs = headers.iter().flat_map(|(name, values)| {
        let name: &str = name.as_ref();
        values.iter().map(move |v| (name, Some(v.as_str())))
    });
    let (mut msg, mut problem) = down_headers::parse(pairs, payload);
    match names::topic_of(topic_tokens) {
        Some(topic) => msg.topic = topic,
        None => {
            problem = Some(format!("header subject: {:?} does not parse", topic_tokens.join(".")));
        }
    }
    if let Some(t) = headers.get("Mqtt-Topic").filter(|t| t.as_str() != msg.topic) {
        problem.get_or_insert_with(|| {
            format!("header Mqtt-Topic {:?} names another topic than its subject ({:?})", t.as_str(), msg.topic)
        });
    }
    (msg, problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_a_bad_one_is_named() {
        let m = Outgoing {
            topic: "cmd/a.b".into(),
            payload: b"x".to_vec(),
            qos: 2,
            retain: true,
            expires_at_ms: Some(1_700_000_000_000),
            user_properties: vec![("Nats-Rollup".into(), "sub".into()), ("k".into(), "v".into())],
            response_topic: Some("reply/1".into()),
            correlation_data: Some(vec![0, 255]),
            content_type: Some("application/json".into()),
            id: None,
        };
        let (back, problem) = parse(&["cmd", "a%2Eb"], &headers(&m), b"x".to_vec());
        assert_eq!((back, problem), (m, None));
        // In order, whatever the names.
        let many: Vec<_> = (0..20).rev().map(|i| (format!("p{i}"), i.to_string())).collect();
        let m = Outgoing { user_properties: many.clone(), ..Default::default() };
        assert_eq!(parse(&["t"], &headers(&m), Vec::new()).0.user_properties, many);
        let mut raw = HeaderMap::new();
        raw.insert("zeta", "1");
        raw.insert("alpha", "2");
        assert_eq!(
            parse(&["t"], &raw, Vec::new()).0.user_properties,
            [("alpha".to_owned(), "2".to_owned()), ("zeta".to_owned(), "1".to_owned())]
        );

        // A publisher other than `send`: topic from the subject, QoS 1 by default.
        let (raw, problem) = parse(&["config", "threshold%2Ehigh"], &HeaderMap::new(), b"0.7".to_vec());
        assert_eq!((raw.topic.as_str(), raw.qos, problem), ("config/threshold.high", 1, None));

        let mut h = HeaderMap::new();
        h.insert("Mqtt-Qos", "3");
        let (_, problem) = parse(&["t"], &h, Vec::new());
        assert_eq!(problem.as_deref(), Some("header Mqtt-Qos: \"3\" does not parse"));

        // The subject alone names the topic: a publisher allowed `down.edge-1.status.>` cannot
        // reach `cmd/reboot` with a header.
        let mut h = HeaderMap::new();
        h.insert("Mqtt-Topic", "cmd/reboot");
        let (msg, problem) = parse(&["status", "x"], &h, Vec::new());
        assert_eq!(msg.topic, "status/x");
        assert!(problem.unwrap().contains("names another topic than its subject"));
        h.insert("Mqtt-Topic", "status/x");
        assert_eq!(parse(&["status", "x"], &h, Vec::new()).1, None);
    }
}
