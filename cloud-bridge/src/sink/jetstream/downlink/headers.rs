//! The MQTT side of a downlink message in JetStream: what `send` writes as headers beside the
//! payload, and what the bridge reads back from any publisher's headers and subject.

use async_nats::HeaderMap;
use base64::Engine;

use crate::names::{self, user_property_name};
use crate::sink::downlink::Outgoing;

pub(super) fn headers(msg: &Outgoing) -> HeaderMap {
    // No `Mqtt-Topic`: the subject names the topic, and only the subject (see `parse`).
    let mut h = HeaderMap::new();
    h.insert("Mqtt-Qos", msg.qos.to_string().as_str());
    if msg.retain {
        h.insert("Mqtt-Retain", "1");
    }
    if let Some(at) = msg.expires_at_ms {
        h.insert("Mqtt-Expires-At", at.to_string().as_str());
    }
    if let Some(t) = &msg.response_topic {
        h.insert("Mqtt-Response-Topic", t.as_str());
    }
    if let Some(c) = &msg.correlation_data {
        h.insert("Mqtt-Correlation-Data", base64::engine::general_purpose::STANDARD.encode(c).as_str());
    }
    if let Some(c) = &msg.content_type {
        h.insert("Mqtt-Content-Type", c.as_str());
    }
    // One header, in order: MQTT keeps user properties in order (MQTT 5.0 §3.3.2.3.7), and a
    // header map does not.
    if !msg.user_properties.is_empty() {
        h.insert("Mqtt-User-Properties", serde_json::to_string(&msg.user_properties).unwrap_or_default().as_str());
    }
    h
}

/// The message `headers` and `payload` stand for on the topic `topic_tokens` (a subject's,
/// after the prefix and the edge) name; or why not. The subject alone names the topic: NATS
/// permissions on `down.<edge>.<levels>` then bound what topics a publisher reaches, which a
/// topic header would get around, so an `Mqtt-Topic` naming another topic is refused.
pub(super) fn parse(topic_tokens: &[&str], headers: &HeaderMap, payload: Vec<u8>) -> (Outgoing, Option<String>) {
    let mut msg = Outgoing { payload, qos: 1, ..Default::default() };
    let (mut ordered, mut plain) = (Vec::new(), Vec::new());
    let mut problem = None;
    let mut bad = |what: &str, value: &str| {
        problem.get_or_insert_with(|| format!("header {what}: {value:?} does not parse"));
    };
    msg.topic = names::topic_of(topic_tokens).unwrap_or_else(|| {
        bad("subject", &topic_tokens.join("."));
        String::new()
    });
    for (name, values) in headers.iter() {
        let name: &str = name.as_ref();
        for value in values {
            let v = value.as_str();
            match name {
                "Mqtt-Topic" => {}
                "Mqtt-Qos" => match v {
                    "0" | "1" | "2" => msg.qos = v.as_bytes()[0] - b'0',
                    _ => bad(name, v),
                },
                "Mqtt-Retain" => match v {
                    "1" | "true" => msg.retain = true,
                    "0" | "false" => msg.retain = false,
                    _ => bad(name, v),
                },
                "Mqtt-Expires-At" => match v.parse() {
                    Ok(at) => msg.expires_at_ms = Some(at),
                    Err(_) => bad(name, v),
                },
                "Mqtt-Response-Topic" => msg.response_topic = Some(v.to_owned()),
                "Mqtt-Correlation-Data" => match base64::engine::general_purpose::STANDARD.decode(v) {
                    Ok(c) => msg.correlation_data = Some(c),
                    Err(_) => bad(name, v),
                },
                "Mqtt-Content-Type" => msg.content_type = Some(v.to_owned()),
                "Mqtt-User-Properties" => match serde_json::from_str::<Vec<(String, String)>>(v) {
                    Ok(props) => ordered = props,
                    Err(_) => bad(name, v),
                },
                _ => {
                    if let Some(prop) = user_property_name(name) {
                        plain.push((prop.to_owned(), v.to_owned()));
                    }
                }
            }
        }
    }
    if let Some(t) = headers.get("Mqtt-Topic").filter(|t| t.as_str() != msg.topic) {
        problem.get_or_insert_with(|| {
            format!("header Mqtt-Topic {:?} names another topic than its subject ({:?})", t.as_str(), msg.topic)
        });
    }
    // Headers of another publisher come in no order: by name, after the ordered ones.
    plain.sort();
    msg.user_properties = ordered;
    msg.user_properties.extend(plain);
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
