//! One spooled record on the wire: its seq and either a message or a gap. On the wire it is a
//! CBOR map `{seq, message}` or `{seq, gap}`, as since version 1: a record that is both or
//! neither is refused when decoded, naming its seq, so no later stage has to guess which it
//! is.

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize};

use super::Seq;

/// One spooled record: its seq in its lane, and what it is.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Repr")]
pub struct WireRecord {
    pub seq: Seq,
    pub body: RecordBody,
}

/// What a record is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordBody {
    Message(WireMessage),
    Gap(WireGap),
}

impl WireRecord {
    pub fn message(seq: Seq, message: WireMessage) -> Self {
        Self { seq, body: RecordBody::Message(message) }
    }

    pub fn gap(seq: Seq, gap: WireGap) -> Self {
        Self { seq, body: RecordBody::Gap(gap) }
    }

    /// The message, if the record is one.
    pub fn as_message(&self) -> Option<&WireMessage> {
        match &self.body {
            RecordBody::Message(m) => Some(m),
            RecordBody::Gap(_) => None,
        }
    }

    pub fn as_message_mut(&mut self) -> Option<&mut WireMessage> {
        match &mut self.body {
            RecordBody::Message(m) => Some(m),
            RecordBody::Gap(_) => None,
        }
    }

    /// The gap, if the record is one.
    pub fn as_gap(&self) -> Option<&WireGap> {
        match &self.body {
            RecordBody::Gap(g) => Some(g),
            RecordBody::Message(_) => None,
        }
    }

    /// The class of the message or of the records the gap stands for.
    pub fn class(&self) -> &str {
        match &self.body {
            RecordBody::Message(m) => &m.class,
            RecordBody::Gap(g) => &g.class,
        }
    }
}

// By hand, not `#[serde(into)]`: that would clone every payload to encode it.
impl Serialize for WireRecord {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_struct("WireRecord", 2)?;
        map.serialize_field("seq", &self.seq)?;
        match &self.body {
            RecordBody::Message(m) => map.serialize_field("message", m)?,
            RecordBody::Gap(g) => map.serialize_field("gap", g)?,
        }
        map.end()
    }
}

/// The wire's shape: both optional, checked into a [`WireRecord`].
#[derive(Deserialize)]
struct Repr {
    seq: Seq,
    #[serde(default)]
    message: Option<WireMessage>,
    #[serde(default)]
    gap: Option<WireGap>,
}

impl TryFrom<Repr> for WireRecord {
    type Error = String;

    fn try_from(r: Repr) -> Result<Self, String> {
        match (r.message, r.gap) {
            (Some(m), None) => Ok(WireRecord::message(r.seq, m)),
            (None, Some(g)) => Ok(WireRecord::gap(r.seq, g)),
            (Some(_), Some(_)) => Err(format!("record {} is both a message and a gap", r.seq)),
            (None, None) => Err(format!("record {} is neither a message nor a gap", r.seq)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireMessage {
    pub class: String,
    pub topic: String,
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    pub qos: u8,
    pub enqueued_ms: u64,
    // Absent fields cost nothing on the wire: most messages carry no properties.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_properties: Vec<(String, String)>,
    #[serde(default, with = "serde_bytes", skip_serializing_if = "Option::is_none")]
    pub correlation_data: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// The schema the edge validated the payload against (protocol version 7; an older bridge
    /// skips the field, an older edge sends none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<SchemaRef>,
}

/// A version of a subject in the cloud's schema registry, as a record names it. Checked as it
/// is decoded ([`SchemaRef::check`]): it becomes headers in the sink, where a line break or a
/// name of any length would be a header of the edge's making.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "SchemaRefRepr")]
pub struct SchemaRef {
    pub subject: String,
    pub version: u32,
    /// The version's content id (16 hex digits).
    pub id: String,
}

#[derive(Deserialize)]
struct SchemaRefRepr {
    subject: String,
    version: u32,
    id: String,
}

impl TryFrom<SchemaRefRepr> for SchemaRef {
    type Error = String;

    fn try_from(r: SchemaRefRepr) -> Result<Self, String> {
        let s = SchemaRef { subject: r.subject, version: r.version, id: r.id };
        s.check()?;
        Ok(s)
    }
}

impl std::fmt::Display for SchemaRef {
    /// `subject/version/id`: the form the edge's spool keeps.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.subject, self.version, self.id)
    }
}

impl std::str::FromStr for SchemaRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split('/');
        let (Some(subject), Some(version), Some(id), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("schema {s:?} is not subject/version/id"));
        };
        let version = version.parse().map_err(|_| format!("schema {s:?}: version {version:?}"))?;
        let r = SchemaRef { subject: subject.to_owned(), version, id: id.to_owned() };
        r.check()?;
        Ok(r)
    }
}

impl SchemaRef {
    /// Refuses what no registry gives: an empty or overlong subject, a subject or id with
    /// characters a header value or subject may not hold, or an id that is not 16 hex digits.
    pub(crate) fn check(&self) -> Result<(), String> {
        crate::model::valid_name("subject", &format!("schema.{}", self.subject)).map_err(|e| e.to_string())?;
        if self.id.len() != 16 || !self.id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("schema id {:?} is not 16 hex digits", self.id));
        }
        Ok(())
    }
}

/// Records the edge dropped before the cloud had them, so loss is visible here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireGap {
    pub class: String,
    pub reason: GapReason,
    /// Inclusive seq ranges.
    pub ranges: Vec<(u64, u64)>,
    pub count: u64,
}

/// Why records were dropped before the cloud acknowledged them: the same word in the edge's
/// spool, on the wire (a CBOR text, as when it was a string) and in the sink's JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GapReason {
    /// Removed to keep the spool inside its byte budget.
    Evicted,
    /// Older than its class's TTL.
    Expired,
    /// Never committed: a `full` message whose commit failed (its client got no PUBACK and will
    /// resend), a `normal` one dropped while commits kept failing and the pending cap was hit,
    /// or one larger than the cloud's sink can store.
    Refused,
    /// In a damaged page of the spool that a salvage could not read: an upper bound, some of
    /// the seqs may never have been used.
    Unreadable,
    /// A reason this build does not know (a newer edge's): kept as a gap, not refused.
    #[serde(other)]
    Unknown,
}

impl GapReason {
    pub fn as_str(self) -> &'static str {
        match self {
            GapReason::Evicted => "evicted",
            GapReason::Expired => "expired",
            GapReason::Refused => "refused",
            GapReason::Unreadable => "unreadable",
            GapReason::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for GapReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape the record had when it was a struct of two options, to compare bytes with.
    #[derive(Serialize)]
    struct Before {
        seq: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<WireMessage>,
        #[serde(skip_serializing_if = "Option::is_none")]
        gap: Option<Before2>,
    }

    #[derive(Serialize)]
    struct Before2 {
        class: String,
        reason: String,
        ranges: Vec<(u64, u64)>,
        count: u64,
    }

    fn cbor(v: &impl Serialize) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::into_writer(v, &mut out).unwrap();
        out
    }

    fn message() -> WireMessage {
        WireMessage {
            class: "telemetry".into(),
            topic: "t/1".into(),
            payload: b"x".to_vec(),
            qos: 1,
            enqueued_ms: 7,
            expires_ms: None,
            user_properties: vec![],
            correlation_data: None,
            content_type: None,
            schema: None,
        }
    }

    /// The enum is a change of the types, not of the wire: a message and a gap of every reason
    /// encode to the bytes the two-option struct with a string reason made, and decode back.
    #[test]
    fn the_wire_is_what_it_was_when_records_were_two_options() {
        let m = WireRecord::message(Seq(5), message());
        assert_eq!(cbor(&m), cbor(&Before { seq: 5, message: Some(message()), gap: None }));
        for reason in [GapReason::Evicted, GapReason::Expired, GapReason::Refused, GapReason::Unreadable] {
            let g = WireRecord::gap(Seq(9), WireGap { class: "c".into(), reason, ranges: vec![(3, 9)], count: 7 });
            let before = Before2 { class: "c".into(), reason: reason.as_str().into(), ranges: vec![(3, 9)], count: 7 };
            assert_eq!(cbor(&g), cbor(&Before { seq: 9, message: None, gap: Some(before) }));
            assert_eq!(ciborium::from_reader::<WireRecord, _>(&cbor(&g)[..]).unwrap(), g);
        }
        assert_eq!(ciborium::from_reader::<WireRecord, _>(&cbor(&m)[..]).unwrap(), m);
    }

    /// A record that is both or neither is refused naming its seq; a reason this build does not
    /// know is a gap of an unknown reason, not a refused batch.
    #[test]
    fn a_record_that_is_both_or_neither_is_refused_and_an_unknown_reason_kept() {
        let gap = Before2 { class: "c".into(), reason: "evicted".into(), ranges: vec![(1, 1)], count: 1 };
        let both = cbor(&Before { seq: 4, message: Some(message()), gap: Some(gap) });
        let e = ciborium::from_reader::<WireRecord, _>(&both[..]).unwrap_err();
        assert!(e.to_string().contains("record 4 is both"), "{e}");
        let neither = cbor(&Before { seq: 6, message: None, gap: None });
        let e = ciborium::from_reader::<WireRecord, _>(&neither[..]).unwrap_err();
        assert!(e.to_string().contains("record 6 is neither"), "{e}");
        let newer = Before2 { class: "c".into(), reason: "quarantined".into(), ranges: vec![(2, 2)], count: 1 };
        let r: WireRecord =
            ciborium::from_reader(&cbor(&Before { seq: 2, message: None, gap: Some(newer) })[..]).unwrap();
        assert_eq!(r.as_gap().map(|g| g.reason), Some(GapReason::Unknown));
    }
}
