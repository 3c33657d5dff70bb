//! Names in the central cluster (see docs/ARCHITECTURE.md): an MQTT topic becomes the subject
//! `edge.<edge_id>.<levels>`, one NATS token per MQTT level, with the characters a token cannot
//! hold percent-encoded, so the mapping is reversible and a level never splits in two. MQTT 5
//! properties become headers.

use std::borrow::Cow;

use base64::Engine;
use shared::proto::WireMessage;

/// Percent-encodes what a NATS token cannot hold: `.`, `*`, `>`, whitespace, control bytes and
/// `%` itself. An empty MQTT level becomes `%00` (MQTT forbids U+0000 in topics, so it cannot
/// be a real level).
pub fn token(level: &str) -> String {
    let mut out = String::with_capacity(level.len());
    push_token(&mut out, level);
    out
}

/// [`token`], appended to `out` (a subject is built in one string, not a string per level).
fn push_token(out: &mut String, level: &str) {
    if level.is_empty() {
        out.push_str("%00");
        return;
    }
    for c in level.chars() {
        match c {
            '.' | '*' | '>' | '%' => out.push_str(&format!("%{:02X}", c as u32)),
            c if c.is_whitespace() || c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            c => out.push(c),
        }
    }
}

/// The subject of `topic` from `edge`, under `prefix` (`edge` by default).
pub fn subject(prefix: &str, edge: &str, topic: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + edge.len() + topic.len() + 8);
    s.push_str(prefix);
    s.push('.');
    push_token(&mut s, edge);
    for level in topic.split('/') {
        s.push('.');
        push_token(&mut s, level);
    }
    s
}

/// The MQTT topic a subject token list stands for (the inverse of [`subject`] after the
/// prefix and edge tokens).
pub fn topic_of(tokens: &[&str]) -> Option<String> {
    let mut levels = Vec::with_capacity(tokens.len());
    for t in tokens {
        if *t == "%00" {
            levels.push(String::new());
            continue;
        }
        let mut bytes = Vec::with_capacity(t.len());
        let raw = t.as_bytes();
        let mut i = 0;
        while i < raw.len() {
            if raw[i] == b'%' {
                let hex = std::str::from_utf8(raw.get(i + 1..i + 3)?).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                bytes.push(raw[i]);
                i += 1;
            }
        }
        levels.push(String::from_utf8(bytes).ok()?);
    }
    Some(levels.join("/"))
}

/// Headers carrying what MQTT had beyond topic and payload, borrowed from `m` where they can be
/// (they are built for every record a bridge writes).
pub fn headers(m: &WireMessage) -> Vec<(&str, Cow<'_, str>)> {
    let qos = match m.qos {
        0 => Cow::Borrowed("0"),
        1 => Cow::Borrowed("1"),
        2 => Cow::Borrowed("2"),
        q => Cow::Owned(q.to_string()),
    };
    let mut h = Vec::with_capacity(2 + m.user_properties.len() + 2);
    h.extend([("Mqtt-Topic", Cow::Borrowed(m.topic.as_str())), ("Mqtt-Qos", qos)]);
    h.extend(m.user_properties.iter().map(|(name, value)| (name.as_str(), Cow::Borrowed(value.as_str()))));
    if let Some(c) = &m.correlation_data {
        h.push(("Mqtt-Correlation-Data", Cow::Owned(base64::engine::general_purpose::STANDARD.encode(c))));
    }
    if let Some(ct) = &m.content_type {
        h.push(("Mqtt-Content-Type", Cow::Borrowed(ct.as_str())));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_round_trip_through_subjects() {
        assert_eq!(
            subject("edge", "edge-1", "inference/yolo-edge/v3.2.1/cam-03"),
            "edge.edge-1.inference.yolo-edge.v3%2E2%2E1.cam-03"
        );
        for topic in ["inference/yolo-edge/v3.2.1/cam-03", "a//b", "/lead", "x y/*/>/100%", "tab\there/é/"] {
            let s = subject("edge", "e", topic);
            let tokens: Vec<&str> = s.split('.').collect();
            assert!(tokens.iter().all(|t| !t.is_empty() && !t.contains([' ', '*', '>'])), "{s}");
            assert_eq!(topic_of(&tokens[2..]).as_deref(), Some(topic), "{s}");
        }
    }
}
