//! The MQTT side of a stored downlink message, as headers beside its payload: what `send`
//! writes and what a sink reads back from any publisher's headers, on every sink that keeps
//! headers (JetStream, Kafka). Named as the uplink names them: `Mqtt-Qos` (default 1),
//! `Mqtt-Retain: 1`, `Mqtt-Expires-At` (ms since the Unix epoch), `Mqtt-Response-Topic`,
//! `Mqtt-Correlation-Data` (base64), `Mqtt-Content-Type`, `Mqtt-User-Properties` (a JSON list
//! of `[name, value]` pairs, in order); any other header not reserved is a user property too,
//! after those, by name. Where the topic comes from is the sink's (a subject, a header).

use base64::Engine;

use crate::names::user_property_name;
use crate::sink::downlink::Outgoing;

/// `msg`'s headers, topic aside.
pub(crate) fn headers(msg: &Outgoing) -> Vec<(&'static str, String)> {
    let mut h = vec![("Mqtt-Qos", msg.qos.to_string())];
    if msg.retain {
        h.push(("Mqtt-Retain", "1".into()));
    }
    if let Some(at) = msg.expires_at_ms {
        h.push(("Mqtt-Expires-At", at.to_string()));
    }
    if let Some(t) = &msg.response_topic {
        h.push(("Mqtt-Response-Topic", t.clone()));
    }
    if let Some(c) = &msg.correlation_data {
        h.push(("Mqtt-Correlation-Data", base64::engine::general_purpose::STANDARD.encode(c)));
    }
    if let Some(c) = &msg.content_type {
        h.push(("Mqtt-Content-Type", c.clone()));
    }
    // One header, in order: MQTT keeps user properties in order (MQTT 5.0 §3.3.2.3.7), and a
    // header map does not.
    if !msg.user_properties.is_empty() {
        h.push(("Mqtt-User-Properties", serde_json::to_string(&msg.user_properties).unwrap_or_default()));
    }
    h
}

/// The message `headers` and `payload` stand for, its topic left empty; or why not (the first
/// header that does not parse; `None` for a value that is not UTF-8). `Mqtt-Topic` is the
/// caller's.
pub(crate) fn parse<'a>(
    headers: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    payload: Vec<u8>,
) -> (Outgoing, Option<String>) {
    let mut msg = Outgoing { payload, qos: 1, ..Default::default() };
    let (mut ordered, mut plain) = (Vec::new(), Vec::new());
    let mut problem = None;
    let mut bad = |what: &str, value: &str| {
        problem.get_or_insert_with(|| format!("header {what}: {value:?} does not parse"));
    };
    for (name, value) in headers {
        if name == "Mqtt-Topic" {
            continue;
        }
        let Some(v) = value else {
            bad(name, "<not UTF-8>");
            continue;
        };
        match name {
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
    fn a_value_that_is_not_utf8_is_named() {
        let (msg, problem) = parse([("Mqtt-Qos", Some("2")), ("Mqtt-Content-Type", None)], b"x".to_vec());
        assert_eq!(msg.qos, 2);
        assert_eq!(problem.as_deref(), Some("header Mqtt-Content-Type: \"<not UTF-8>\" does not parse"));
    }
}
