//! What reached JetStream, for an operator's commands (`sink::inspect`): records read back
//! from the stream `EDGE`, the dead letters on `<prefix>.<edge>.%dead`, and their replay.

use std::collections::BTreeMap;

use async_nats::jetstream;
use futures_util::StreamExt;

use crate::sink::SinkError;
use crate::sink::seen::{DeadLetter, Seen};

/// Where the records are: the servers, the stream and its subject prefix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Records<'a> {
    pub url: &'a str,
    pub stream: &'a str,
    pub subject_prefix: &'a str,
}

impl Records<'_> {
    async fn js(&self) -> Result<jetstream::Context, SinkError> {
        Ok(jetstream::new(super::client(self.url, CONNECT).await?))
    }
}

/// The last `n` records stored (of `edge`, if given), oldest first.
pub(crate) async fn tail(at: Records<'_>, edge: Option<&str>, n: usize) -> Result<Vec<Seen>, SinkError> {
    let Records { stream, subject_prefix, .. } = at;
    let js = at.js().await?;
    let filter = match edge {
        Some(e) => format!("{subject_prefix}.{}.>", crate::names::token(e)),
        None => format!("{subject_prefix}.>"),
    };
    let mut s = js.get_stream(stream).await.map_err(|e| SinkError::nats("records", stream, &e))?;
    let last = s.info().await.map_err(|e| SinkError::nats("records", stream, &e))?.state.last_sequence;
    let mut out = Vec::new();
    // Backwards from the last, within a bound: an edge with few records in a large
    // stream is looked for in its last 100,000 messages.
    let mut seq = last;
    while seq > 0 && out.len() < n && last - seq < SCAN {
        if let Ok(m) = s.get_raw_message(seq).await
            && subject_matches(&m.subject, &filter)
            && !m.subject.ends_with(".%dead")
        {
            out.push(from_stream(&m));
        }
        seq -= 1;
    }
    out.reverse();
    Ok(out)
}

/// Records stored per edge (messages and gap records together).
pub(crate) async fn count(at: Records<'_>) -> Result<BTreeMap<String, u64>, SinkError> {
    let Records { stream, subject_prefix, .. } = at;
    let js = at.js().await?;
    let s = js.get_stream(stream).await.map_err(|e| SinkError::nats("records", stream, &e))?;
    let info = s
        .info_with_subjects(format!("{subject_prefix}.>"))
        .await
        .map_err(|e| SinkError::nats("records", stream, &e))?;
    let mut subjects = info;
    let mut out = BTreeMap::new();
    while let Some(next) = subjects.next().await {
        let (subject, n) = next.map_err(|e| SinkError::nats("records", stream, &e))?;
        if subject.ends_with(".%dead") {
            continue;
        }
        let edge = subject.split('.').nth(1).unwrap_or_default().to_owned();
        *out.entry(edge).or_default() += n as u64;
    }
    Ok(out)
}

/// Every dead letter (of `edge`, if given), oldest first.
pub(crate) async fn dead_letters(at: Records<'_>, edge: Option<&str>) -> Result<Vec<DeadLetter>, SinkError> {
    let Records { stream, subject_prefix, .. } = at;
    let js = at.js().await?;
    let filter = format!("{subject_prefix}.{}.%dead", edge.map_or("*".to_owned(), crate::names::token));
    let s = js.get_stream(stream).await.map_err(|e| SinkError::nats("dead letters", stream, &e))?;
    let mut consumer = s
        .create_consumer(jetstream::consumer::pull::OrderedConfig { filter_subject: filter, ..Default::default() })
        .await
        .map_err(|e| SinkError::nats("dead letters", stream, &e))?;
    // Exactly as many as the filter matched when the consumer was made: the read neither stops
    // at a pause of a slow server nor waits for letters set aside since.
    let pending = consumer.info().await.map_err(|e| SinkError::nats("dead letters", stream, &e))?.num_pending;
    let mut out = Vec::new();
    if pending == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await.map_err(|e| SinkError::nats("dead letters", stream, &e))?;
    while (out.len() as u64) < pending {
        let m = match tokio::time::timeout(CONNECT, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(SinkError::nats("dead letters", stream, &e)),
            Ok(None) | Err(_) => return Err(unavailable(format!("{} of {pending} dead letters read", out.len()))),
        };
        let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
        let header = |name: &str| m.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().to_owned());
        let bytes = header("Edge-Dead-Letter-Payload-Bytes").and_then(|b| b.parse::<usize>().ok()).unwrap_or(0);
        let mut record = from_message(&m.subject, m.headers.as_ref(), &m.payload);
        record.bytes = bytes;
        out.push(DeadLetter {
            seq,
            reason: header("Edge-Dead-Letter-Reason").unwrap_or_default(),
            error: header("Edge-Dead-Letter-Error").unwrap_or_default(),
            subject: header("Edge-Dead-Letter-Subject").unwrap_or_default(),
            whole: m.payload.len() == bytes,
            record,
        });
    }
    Ok(out)
}

/// Publishes the dead letters at `seqs` again on their subjects, with their headers (the
/// `Nats-Msg-Id` as `<id>:replay`, so a repeated replay is stored once) and, once JetStream
/// acked each, deletes it; one connection for all. What JetStream still refuses stays where
/// it is, and its error says why (raise the limit it names first). Each letter's outcome: the
/// subject it went to, or why not.
pub(crate) async fn replay(at: Records<'_>, seqs: &[u64]) -> Result<Vec<(u64, Result<String, SinkError>)>, SinkError> {
    let stream = at.stream;
    let js = at.js().await?;
    let s = js.get_stream(stream).await.map_err(|e| SinkError::nats("replay", stream, &e))?;
    let mut out = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        out.push((seq, replay_one(&js, &s, seq).await));
    }
    Ok(out)
}

async fn replay_one(js: &jetstream::Context, s: &jetstream::stream::Stream, seq: u64) -> Result<String, SinkError> {
    let m = s.get_raw_message(seq).await.map_err(|e| SinkError::nats("replay", &seq.to_string(), &e))?;
    if !m.subject.ends_with(".%dead") {
        return Err(SinkError::Invalid { what: "replay", reason: format!("message {seq} is not a dead letter") });
    }
    let subject = m.headers.get("Edge-Dead-Letter-Subject").map(|v| v.as_str().to_owned()).unwrap_or_default();
    let bytes = m.headers.get("Edge-Dead-Letter-Payload-Bytes").and_then(|v| v.as_str().parse::<usize>().ok());
    if subject.is_empty() || bytes != Some(m.payload.len()) {
        return Err(SinkError::Invalid {
            what: "replay",
            reason: format!("dead letter {seq} kept only the record's ids (its payload was too large to keep)"),
        });
    }
    let mut headers = async_nats::HeaderMap::new();
    for (name, values) in m.headers.iter() {
        let name: &str = name.as_ref();
        if name.starts_with("Edge-Dead-Letter-") || name.eq_ignore_ascii_case("Nats-Msg-Id") {
            continue;
        }
        for v in values {
            headers.append(name, v.as_str());
        }
    }
    // The dead letter took the record's own `Nats-Msg-Id`: published again under it inside
    // the duplicate window, JetStream would drop the record as the dead letter's duplicate. A
    // replay has its own, so a replay repeated (a crash before the delete) is stored once.
    if let Some(id) = m.headers.get(async_nats::header::NATS_MESSAGE_ID) {
        headers.insert(async_nats::header::NATS_MESSAGE_ID, format!("{}:replay", id.as_str()).as_str());
    }
    js.publish_with_headers(subject.clone(), headers, m.payload.clone())
        .await
        .map_err(|e| SinkError::nats("replay", &subject, &e))?
        .await
        .map_err(|e| SinkError::nats("replay", &subject, &e))?;
    s.delete_message(seq).await.map_err(|e| SinkError::nats("replay: delete the dead letter", &seq.to_string(), &e))?;
    Ok(subject)
}

/// How long a command tries the servers.
const CONNECT: std::time::Duration = std::time::Duration::from_secs(10);

fn unavailable(reason: String) -> SinkError {
    SinkError::Unavailable { what: "dead letters", reason }
}

/// Messages `tail` looks back through at most.
const SCAN: u64 = 100_000;

fn subject_matches(subject: &str, filter: &str) -> bool {
    subject.starts_with(filter.trim_end_matches('>'))
}

fn from_stream(m: &jetstream::message::StreamMessage) -> Seen {
    from_message(&m.subject, Some(&m.headers), &m.payload)
}

fn from_message(subject: &str, headers: Option<&async_nats::HeaderMap>, payload: &[u8]) -> Seen {
    let mut map = BTreeMap::new();
    if let Some(h) = headers {
        for (name, values) in h.iter() {
            if let Some(v) = values.first() {
                map.insert(name.to_string(), v.as_str().to_owned());
            }
        }
    }
    let kind = if subject.ends_with(".%gap") { "gap" } else { "message" };
    Seen {
        edge: map.get("Edge-Id").cloned().unwrap_or_else(|| subject.split('.').nth(1).unwrap_or_default().to_owned()),
        id: map.get("Edge-Seq").cloned().unwrap_or_default(),
        kind: kind.into(),
        topic: map.get("Mqtt-Topic").cloned().unwrap_or_else(|| subject.to_owned()),
        payload: Seen::payload(payload),
        bytes: payload.len(),
        headers: map,
    }
}
