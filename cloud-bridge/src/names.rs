//! Names in the central cluster (see docs/ARCHITECTURE.md): an MQTT topic becomes the subject
//! `edge.<edge_id>.<levels>`, one NATS token per MQTT level, with the characters a token cannot
//! hold percent-encoded, so the mapping is reversible and a level never splits in two. MQTT 5
//! properties become headers, and the schema version the edge validated a message against
//! `Edge-Schema` (`subject/version`) and `Edge-Schema-Id` (its content id); a user property whose name the sink or this bridge gives meaning
//! to is renamed on the way ([`user_property_header`]), the same way for every sink.

use std::borrow::Cow;

use base64::Engine;
use shared::proto::WireMessage;

/// Percent-encodes what a NATS token cannot hold: `.`, `*`, `>`, whitespace, control bytes and
/// `%` itself. An empty MQTT level becomes `%00` (MQTT forbids U+0000 in topics, so it cannot
/// be a real level).
pub(crate) fn token(level: &str) -> String {
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
pub(crate) fn subject(prefix: &str, edge: &str, topic: &str) -> String {
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
pub(crate) fn topic_of(tokens: &[&str]) -> Option<String> {
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

/// Header name prefixes with a meaning: `Nats-` is JetStream's (`Nats-Expected-Last-Sequence`,
/// `Nats-Rollup`, `Nats-Msg-Id`, ... change what the server does with a message), `Mqtt-` and
/// `Edge-` are this bridge's own. Compared without regard to case, as HTTP-style headers are.
const RESERVED_PREFIXES: [&str; 3] = ["Nats-", "Mqtt-", "Edge-"];

/// What a user property's name is prefixed with when it starts with a reserved prefix (or is
/// empty, which no header name may be).
pub(crate) const USER_PROPERTY_PREFIX: &str = "Mqtt-Prop-";

fn has_prefix(name: &str, prefix: &str) -> bool {
    name.len() >= prefix.len() && name.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// The header name a user property named `name` is stored under: `name` itself unless it is
/// empty or starts with a reserved prefix, then `Mqtt-Prop-` + `name`. A user property can then
/// neither steer the sink (one named `Nats-Expected-Last-Sequence` made JetStream refuse every
/// batch it was in, which stopped its lane) nor pass for a header of ours. Reversible by
/// [`user_property_name`], since a name that already started with `Mqtt-Prop-` is reserved
/// too and gets a second prefix.
pub(crate) fn user_property_header(name: &str) -> Cow<'_, str> {
    if name.is_empty() || RESERVED_PREFIXES.iter().any(|p| has_prefix(name, p)) {
        Cow::Owned(format!("{USER_PROPERTY_PREFIX}{name}"))
    } else {
        Cow::Borrowed(name)
    }
}

/// The user property a header stands for (the inverse of [`user_property_header`]), or `None`
/// for a header of the sink's or ours.
pub(crate) fn user_property_name(header: &str) -> Option<&str> {
    if has_prefix(header, USER_PROPERTY_PREFIX) {
        return Some(&header[USER_PROPERTY_PREFIX.len()..]);
    }
    (!RESERVED_PREFIXES.iter().any(|p| has_prefix(header, p))).then_some(header)
}

/// The `Mqtt-Correlation-Data` header value of `data`.
pub(crate) fn correlation_header(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Headers carrying what MQTT had beyond topic and payload, borrowed from `m` where they can be
/// (they are built for every record a bridge writes).
pub(crate) fn headers(m: &WireMessage) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    let qos = match m.qos {
        0 => Cow::Borrowed("0"),
        1 => Cow::Borrowed("1"),
        2 => Cow::Borrowed("2"),
        q => Cow::Owned(q.to_string()),
    };
    let mut h = Vec::with_capacity(2 + m.user_properties.len() + 2);
    h.extend([(Cow::Borrowed("Mqtt-Topic"), Cow::Borrowed(m.topic.as_str())), (Cow::Borrowed("Mqtt-Qos"), qos)]);
    h.extend(m.user_properties.iter().map(|(name, value)| (user_property_header(name), Cow::Borrowed(value.as_str()))));
    if let Some(c) = &m.correlation_data {
        h.push((Cow::Borrowed("Mqtt-Correlation-Data"), Cow::Owned(correlation_header(c))));
    }
    if let Some(ct) = &m.content_type {
        h.push((Cow::Borrowed("Mqtt-Content-Type"), Cow::Borrowed(ct.as_str())));
    }
    if let Some(s) = &m.schema {
        h.push((Cow::Borrowed("Edge-Schema"), Cow::Owned(format!("{}/{}", s.subject, s.version))));
        h.push((Cow::Borrowed("Edge-Schema-Id"), Cow::Borrowed(s.id.as_str())));
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

    #[test]
    fn user_properties_with_reserved_names_are_renamed_reversibly() {
        let cases = [
            ("Nats-Expected-Last-Sequence", "Mqtt-Prop-Nats-Expected-Last-Sequence"),
            ("nats-rollup", "Mqtt-Prop-nats-rollup"),
            ("NATS-EXPECTED-STREAM", "Mqtt-Prop-NATS-EXPECTED-STREAM"),
            ("Nats-Msg-Id", "Mqtt-Prop-Nats-Msg-Id"),
            ("Edge-Id", "Mqtt-Prop-Edge-Id"),
            ("Mqtt-Topic", "Mqtt-Prop-Mqtt-Topic"),
            ("Mqtt-Prop-x", "Mqtt-Prop-Mqtt-Prop-x"),
            ("", "Mqtt-Prop-"),
            ("model", "model"),
            ("Natsx", "Natsx"),
            ("é-Nats-", "é-Nats-"),
        ];
        for (name, header) in cases {
            assert_eq!(user_property_header(name), header, "{name:?}");
            assert_eq!(user_property_name(header), Some(name), "{header:?}");
        }
        for ours in ["Mqtt-Topic", "Edge-Id", "Nats-Msg-Id", "Edge-Seq"] {
            assert_eq!(user_property_name(ours), None, "{ours}");
        }
        let m = WireMessage {
            class: "c".into(),
            topic: "t".into(),
            payload: Vec::new(),
            qos: 1,
            enqueued_ms: 0,
            expires_ms: None,
            user_properties: vec![("Mqtt-Topic".into(), "spoof".into()), ("k".into(), "v".into())],
            correlation_data: None,
            content_type: None,
            schema: None,
        };
        let names: Vec<String> = headers(&m).into_iter().map(|(n, _)| n.into_owned()).collect();
        assert_eq!(names, ["Mqtt-Topic", "Mqtt-Qos", "Mqtt-Prop-Mqtt-Topic", "k"]);
        // The schema the edge validated against is ours; a user property of that name is not.
        let m = WireMessage {
            user_properties: vec![("Edge-Schema".into(), "spoof".into())],
            schema: Some("telemetry/3/0123456789abcdef".parse().unwrap()),
            ..m
        };
        let h: Vec<(String, String)> = headers(&m).into_iter().map(|(n, v)| (n.into_owned(), v.into_owned())).collect();
        assert_eq!(h[2], ("Mqtt-Prop-Edge-Schema".into(), "spoof".into()));
        assert_eq!(
            h[3..],
            [("Edge-Schema".into(), "telemetry/3".into()), ("Edge-Schema-Id".into(), "0123456789abcdef".into())]
        );
    }
}
