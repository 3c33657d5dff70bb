//! What an operator reads of a stored record and of a dead letter, whichever sink holds it
//! (`inspect`, the backends' `inspect.rs`).

use std::collections::BTreeMap;

use serde::Serialize;

/// One stored record as an operator reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Seen {
    pub edge: String,
    /// `epoch:lane:seq` of the edge's spool.
    pub id: String,
    /// `message` or `gap`.
    pub kind: String,
    pub topic: String,
    /// The payload as text when it is UTF-8, else as hex.
    pub payload: String,
    pub bytes: usize,
    pub headers: BTreeMap<String, String>,
}

impl Seen {
    /// The payload as text when it is UTF-8, else as hex.
    pub(super) fn payload(bytes: &[u8]) -> String {
        match std::str::from_utf8(bytes) {
            Ok(text) => text.to_owned(),
            Err(_) => format!("hex:{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()),
        }
    }

    /// One line for a terminal: the payload cut at 120 characters.
    pub fn line(&self) -> String {
        let mut payload: String = self.payload.chars().take(120).collect();
        if payload.len() < self.payload.len() {
            payload.push('…');
        }
        format!("{} {} {} {} ({} bytes) {payload}", self.edge, self.id, self.kind, self.topic, self.bytes)
    }
}

/// A record the sink refused for itself and set aside (JetStream: on `<prefix>.<edge>.%dead`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// Its sequence in the stream: what `replay` takes.
    pub seq: u64,
    pub reason: String,
    pub error: String,
    /// The subject it was refused on.
    pub subject: String,
    /// Whether its payload was kept (a record too large for the server is kept as its ids).
    pub whole: bool,
    pub record: Seen,
}
