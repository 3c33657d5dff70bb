//! ADR-50 atomic batches (nats-server 2.12 and 2.13): a batch's messages are stored all
//! together or not at all. Every message but the last is sent without a reply and staged by the
//! server under the batch's id; the last commits. So a batch can be staged while the one ahead
//! of it is still committing ([`stage`]), and it still lands after that one or not at all: one
//! never committed is dropped by the server.

use async_nats::HeaderMap;
use async_nats::jetstream;
use shared::proto::WireRecord;

use super::outgoing::{Outgoing, readdress, triples};
use super::refused::{self, Failure, odd};
use crate::sink::{SinkError, SinkMetrics};

/// Messages in one atomic batch, the server's default `max_msgs`.
pub(super) const MAX_ATOMIC: usize = 1000;

/// JetStream's error code for an atomic batch holding a `Nats-Msg-Id` it already stored.
const ERR_BATCH_DUPLICATE: u64 = 10201;

/// JetStream's error code for an atomic batch that misses a staged message: the server refused
/// one (too large, say; a staged message gets no reply of its own) or it was lost with the
/// connection. Message by message tells the two apart.
const ERR_BATCH_INCOMPLETE: u64 = 10176;

#[derive(Debug)]
enum Atomic {
    Stored,
    /// Refused whole: some of its messages were stored before.
    Duplicate,
}

/// A fresh batch id: at most 64 characters, unique among the batches in flight on the server.
fn batch_id() -> String {
    use rand::Rng;
    format!("{:032x}", rand::thread_rng().r#gen::<u128>())
}

/// Sends every message of `messages` but the last as part of a fresh atomic batch, whose id it
/// returns: the server stages them, and nothing is visible before [`commit`] sends the last.
///
/// Subjects and headers move out of `messages` into the publishes (copying a header map per
/// message was a tenth of the bridge's time); payloads are shared.
pub(super) async fn stage(client: &async_nats::Client, messages: &mut [Outgoing]) -> Result<String, Failure> {
    let id = batch_id();
    let Some((_, staged)) = messages.split_last_mut() else { return Ok(id) };
    for (i, m) in staged.iter_mut().enumerate() {
        let (subject, headers) = with_batch(m, &id, i + 1);
        client
            .publish_with_headers(subject, headers, m.payload.clone())
            .await
            .map_err(|e| Failure::client("publish", e))?;
    }
    Ok(id)
}

/// Commits the atomic batch `id` that [`stage`] sent all of `messages` but the last of, with
/// the last, and waits for the batch's ack.
async fn commit(client: &async_nats::Client, messages: &mut [Outgoing], id: &str) -> Result<Atomic, Failure> {
    let n = messages.len();
    let Some(last) = messages.last_mut() else { return Ok(Atomic::Stored) };
    let (subject, mut headers) = with_batch(last, id, n);
    headers.insert("Nats-Batch-Commit", "1");
    let reply = client
        .request_with_headers(subject, headers, last.payload.clone())
        .await
        .map_err(|e| SinkError::nats("publish batch", "", &e))?;
    batch_ack(&reply.payload, n)
}

/// A message's subject and headers, moved out, with the batch's headers added.
fn with_batch(m: &mut Outgoing, id: &str, seq: usize) -> (String, HeaderMap) {
    let mut headers = std::mem::take(&mut m.headers);
    headers.insert("Nats-Batch-Id", id);
    headers.insert("Nats-Batch-Sequence", seq.to_string().as_str());
    (std::mem::take(&mut m.subject), headers)
}

/// Publishes `messages` (those of `records`, in order) as atomic batches of up to
/// [`MAX_ATOMIC`]; the first was staged already if `staged` names its id. A batch JetStream
/// refuses whole as a duplicate (a resend overlapping records already stored) goes message by
/// message, addressed again with `address`, so dedup drops just the duplicates.
pub(super) async fn publish(
    client: &async_nats::Client,
    js: &jetstream::Context,
    messages: &mut [Outgoing],
    records: &[WireRecord],
    address: impl Fn(&WireRecord) -> (String, HeaderMap),
    mut staged: Option<String>,
    aside: (&str, &SinkMetrics),
) -> Result<(), Failure> {
    for (chunk, records) in messages.chunks_mut(MAX_ATOMIC).zip(records.chunks(MAX_ATOMIC)) {
        let id = match staged.take() {
            Some(id) => id,
            None => stage(client, chunk).await?,
        };
        if let Atomic::Duplicate = commit(client, chunk, &id).await? {
            // The atomic publish took the subjects and headers.
            readdress(chunk, records, &address);
            refused::publish_setting_aside(js, triples(chunk), aside.0, aside.1).await?;
        }
    }
    Ok(())
}

/// Reads a batch commit's reply: `{"stream":..,"seq":..,"batch":..,"count":N}` or an error.
fn batch_ack(reply: &[u8], sent: usize) -> Result<Atomic, Failure> {
    let v: serde_json::Value = serde_json::from_slice(reply)
        .map_err(|e| odd("publish batch", format!("unreadable ack {:?}: {e}", String::from_utf8_lossy(reply))))?;
    if let Some(err) = v.get("error") {
        let code = err.get("err_code").and_then(serde_json::Value::as_u64);
        if code == Some(ERR_BATCH_DUPLICATE) {
            return Ok(Atomic::Duplicate);
        }
        if code == Some(ERR_BATCH_INCOMPLETE) {
            return Err(Failure::Record { reason: "incomplete", detail: err.to_string() });
        }
        return Err(Failure::coded("publish batch", code, err.to_string()));
    }
    match v.get("count").and_then(serde_json::Value::as_u64) {
        Some(count) if count == sent as u64 => Ok(Atomic::Stored),
        _ => Err(odd("publish batch", format!("ack {v} does not count the {sent} messages sent")).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_acks_are_checked() {
        assert!(matches!(batch_ack(br#"{"stream":"T","seq":5,"batch":"b","count":5}"#, 5), Ok(Atomic::Stored)));
        assert!(batch_ack(br#"{"stream":"T","seq":5,"batch":"b","count":4}"#, 5).is_err());
        let dup = br#"{"error":{"code":400,"err_code":10201,"description":"atomic publish batch contains duplicate message id"}}"#;
        assert!(matches!(batch_ack(dup, 5), Ok(Atomic::Duplicate)));
        let e = batch_ack(br#"{"error":{"code":400,"err_code":10174,"description":"atomic publish is disabled"}}"#, 5);
        assert!(e.unwrap_err().into_error().to_string().contains("atomic publish is disabled"));
        let big = br#"{"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"}}"#;
        assert!(matches!(batch_ack(big, 5), Err(Failure::Record { reason: "too_large", .. })));
        assert!(batch_ack(b"", 1).is_err());
    }
}
