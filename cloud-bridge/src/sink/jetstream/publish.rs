//! How a batch's records become JetStream messages and get published, in one of three ways
//! (see [`Publishing`]). Each keeps the order per topic when a publish fails part way: what is
//! stored of a batch is a prefix of it, or, message by message, a prefix per subject.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, IntoHeaderName};
use async_nats::jetstream;
use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use shared::proto::{RecordBody, WireRecord};

use super::header::header_safe;
use super::refused::{self, Failure};
use crate::sink::{SinkError, SinkMetrics, Turn};

/// The server answered, but not as it should have (an unreadable ack, a count that is off).
fn odd(what: &'static str, reason: impl std::fmt::Display) -> SinkError {
    SinkError::JetStream { what, code: None, reason: reason.to_string() }
}

/// How batches are published, from the config's wish and what the server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchPublish {
    /// The fastest the server has: fast ingest, else atomic batches, else message by message.
    #[default]
    Auto,
    /// Fast-ingest batches (nats-server 2.14 or newer).
    Fast,
    /// Atomic batches (nats-server 2.12 or newer).
    Atomic,
    /// Message by message.
    Off,
}

impl BatchPublish {
    /// As the config names it.
    pub fn name(self) -> &'static str {
        match self {
            BatchPublish::Auto => "auto",
            BatchPublish::Fast => "fast",
            BatchPublish::Atomic => "atomic",
            BatchPublish::Off => "off",
        }
    }
}

/// The way a sink publishes, chosen once at connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Publishing {
    /// ADR-50 fast ingest: messages stream with one flow ack every few hundred and a pub ack at
    /// the end; the server stores each as it arrives and, in `fail` gap mode, stops storing a
    /// batch at its first missing sequence. So a connection lost mid-batch (whose queued
    /// messages the client sends after reconnecting) leaves a prefix, never a hole. It costs
    /// the server less than an atomic batch, which it stages and then applies.
    Fast,
    /// ADR-50 atomic batches: stored all together or not at all.
    Atomic,
    /// Per subject one publish in flight.
    Messages,
}

impl Publishing {
    /// As the logs name it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Publishing::Fast => "fast",
            Publishing::Atomic => "atomic",
            Publishing::Messages => "messages",
        }
    }

    /// The best of what `wish` allows that a server of `version` has.
    pub(super) fn choose(wish: BatchPublish, version: &str) -> Self {
        let mut parts = version.split(['.', '-']).map(|p| p.parse::<u64>().unwrap_or(0));
        let at = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        let (fast, atomic) = (at >= (2, 14), at >= (2, 12));
        match wish {
            BatchPublish::Auto | BatchPublish::Fast if fast => Self::Fast,
            BatchPublish::Auto | BatchPublish::Fast | BatchPublish::Atomic if atomic => Self::Atomic,
            _ => Self::Messages,
        }
    }
}

/// Messages in one atomic batch, the server's default `max_msgs`.
const MAX_ATOMIC: usize = 1000;

/// JetStream's error code for an atomic batch holding a `Nats-Msg-Id` it already stored.
const ERR_BATCH_DUPLICATE: u64 = 10201;

/// JetStream's error code for an atomic batch that misses a staged message: the server refused
/// one (too large, say; a staged message gets no reply of its own) or it was lost with the
/// connection. Message by message tells the two apart.
const ERR_BATCH_INCOMPLETE: u64 = 10176;

#[derive(Debug, Clone)]
pub(super) struct Outgoing {
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
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

#[derive(Debug)]
enum Atomic {
    Stored,
    /// Refused whole: some of its messages were stored before.
    Duplicate,
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

/// A fresh batch id: at most 64 characters, unique among the batches in flight on the server.
fn batch_id() -> String {
    use rand::Rng;
    format!("{:032x}", rand::thread_rng().r#gen::<u128>())
}

/// Publishes `messages` as one atomic batch: every message but the last goes at once without a
/// reply, staged by the server; the last, sent once `turn` came, commits and waits for the
/// batch's ack. So a batch is on its way while the one before it is still committing, and
/// still lands after it or not at all: if the one before failed, this one is never committed
/// and the server drops it.
///
/// Subjects and headers move out of `messages` into the publishes (copying a header map per
/// message was a tenth of the bridge's time); payloads are shared.
async fn publish_atomic(
    client: &async_nats::Client,
    messages: &mut [Outgoing],
    turn: Option<Turn>,
) -> Result<Atomic, Failure> {
    let id = batch_id();
    let n = messages.len();
    let Some((last, staged)) = messages.split_last_mut() else { return Ok(Atomic::Stored) };
    let with_batch = |m: &mut Outgoing, seq: usize| {
        let mut headers = std::mem::take(&mut m.headers);
        headers.insert("Nats-Batch-Id", id.as_str());
        headers.insert("Nats-Batch-Sequence", seq.to_string().as_str());
        (std::mem::take(&mut m.subject), headers)
    };
    for (i, m) in staged.iter_mut().enumerate() {
        let (subject, headers) = with_batch(m, i + 1);
        client
            .publish_with_headers(subject, headers, m.payload.clone())
            .await
            .map_err(|e| Failure::client("publish", e))?;
    }
    if let Some(turn) = turn
        && !turn.await
    {
        return Err(Failure::Turn);
    }
    let (subject, mut headers) = with_batch(last, n);
    headers.insert("Nats-Batch-Commit", "1");
    let reply = client
        .request_with_headers(subject, headers, last.payload.clone())
        .await
        .map_err(|e| SinkError::nats("publish batch", "", &e))?;
    batch_ack(&reply.payload, n)
}

/// Publishes `messages` (those of `records`, in order) as atomic batches of up to
/// [`MAX_ATOMIC`], the first once `turn` came. A batch JetStream refuses whole as a duplicate (a
/// resend overlapping records already stored) goes message by message, addressed again with
/// `address`, so dedup drops just the duplicates.
pub(super) async fn publish_atomic_batches(
    client: &async_nats::Client,
    js: &jetstream::Context,
    messages: &mut [Outgoing],
    records: &[WireRecord],
    address: impl Fn(&WireRecord) -> (String, HeaderMap),
    turn: Turn,
    aside: (&str, &SinkMetrics),
) -> Result<(), Failure> {
    let mut turn = Some(turn);
    for (chunk, records) in messages.chunks_mut(MAX_ATOMIC).zip(records.chunks(MAX_ATOMIC)) {
        if let Atomic::Duplicate = publish_atomic(client, chunk, turn.take()).await? {
            // The atomic publish took the subjects and headers.
            readdress(chunk, records, &address);
            refused::publish_setting_aside(js, triples(chunk), aside.0, aside.1).await?;
        }
    }
    Ok(())
}

/// Publishes `messages` message by message once `turn` came, per subject one at a time (a
/// failure leaves a prefix per subject), setting aside what JetStream refuses for itself.
pub(super) async fn publish_messages(
    js: &jetstream::Context,
    messages: &mut [Outgoing],
    turn: Turn,
    aside: (&str, &SinkMetrics),
) -> Result<(), Failure> {
    if !turn.await {
        return Err(Failure::Turn);
    }
    refused::publish_setting_aside(js, triples(messages), aside.0, aside.1).await
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

/// Flow acks the server may owe before the publisher waits for one (ADR-50 advises 2).
const FAST_OUTSTANDING: u64 = 2;

/// The flow asked for: a flow ack every this many messages at most (the server may choose
/// fewer). Two of them cover a whole edge batch, so a batch streams without waiting.
const FAST_FLOW: u64 = 500;

/// How long a fast batch waits for the server's next reply before it counts as failed.
const FAST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the server says on a fast batch's reply subjects.
#[derive(Debug, PartialEq)]
pub(super) enum FastReply {
    /// Messages up to `seq` are stored; flow acks come every `msgs` messages from now.
    Flow { seq: u64, msgs: u64 },
    /// The batch ended: `count` messages taken.
    Done { count: u64 },
    /// A gap, a refused message or a refused batch: the batch stopped there; the JetStream
    /// error code if the server gave one.
    Failed { code: Option<u64>, why: String },
}

impl FastReply {
    fn failed(why: String) -> Self {
        FastReply::Failed { code: None, why }
    }
}

pub(super) fn fast_reply(payload: &[u8]) -> FastReply {
    #[derive(Deserialize)]
    struct Reply {
        #[serde(rename = "type")]
        kind: Option<String>,
        seq: Option<u64>,
        msgs: Option<u64>,
        last_seq: Option<u64>,
        count: Option<u64>,
        error: Option<serde_json::Value>,
    }
    let text = || String::from_utf8_lossy(payload).into_owned();
    let Ok(r) = serde_json::from_slice::<Reply>(payload) else {
        return FastReply::failed(format!("unreadable reply {:?}", text()));
    };
    match (r.kind.as_deref(), r.error) {
        (_, Some(error)) => FastReply::Failed {
            code: error.get("err_code").and_then(serde_json::Value::as_u64),
            why: error.to_string(),
        },
        (Some("ack"), None) => match (r.seq, r.msgs) {
            (Some(seq), Some(msgs)) if msgs > 0 => FastReply::Flow { seq, msgs },
            _ => FastReply::failed(format!("flow ack without a sequence or flow: {}", text())),
        },
        (Some("gap"), None) => FastReply::failed(format!(
            "the server missed messages {} to {}",
            r.last_seq.map_or(0, |s| s + 1),
            r.seq.map_or(0, |s| s.saturating_sub(1))
        )),
        (Some(_), None) => FastReply::failed(text()),
        (None, None) => match r.count {
            Some(count) => FastReply::Done { count },
            None => FastReply::failed(format!("pub ack without a count: {}", text())),
        },
    }
}

/// Publishes `messages` as one fast-ingest batch, once `turn` came (the server stores each
/// message as it arrives, so nothing may go before the batch ahead is in), and returns after
/// the server acked the whole batch. Subjects and headers move out of `messages`.
pub(super) async fn publish_fast(
    client: &async_nats::Client,
    messages: &mut [Outgoing],
    turn: Turn,
) -> Result<(), Failure> {
    let n = messages.len() as u64;
    if n == 0 {
        return Ok(());
    }
    // The inbox's second token is the batch id; the subscription ends when `replies` drops.
    let inbox = client.new_inbox();
    let mut replies =
        client.subscribe(format!("{inbox}.>")).await.map_err(|e| SinkError::nats("fast batch", "", &e))?;
    if !turn.await {
        return Err(Failure::Turn);
    }
    let (mut stored, mut flow) = (0u64, FAST_FLOW);
    for (i, m) in messages.iter_mut().enumerate() {
        let seq = i as u64 + 1;
        while stored + flow * FAST_OUTSTANDING <= seq {
            match next_reply(&mut replies).await? {
                FastReply::Flow { seq, msgs } => (stored, flow) = (stored.max(seq), msgs),
                FastReply::Done { count } => {
                    return Err(odd("fast batch", format!("ended after {count} of {n} messages")).into());
                }
                FastReply::Failed { code, why } => return Err(Failure::coded("fast batch", code, why)),
            }
        }
        // Operations: 0 starts the batch, 1 appends, 2 appends and commits.
        let op = if seq == n { 2 } else { u64::from(seq > 1) };
        let reply = format!("{inbox}.{flow}.fail.{seq}.{op}.$FI");
        client
            .publish_with_reply_and_headers(
                std::mem::take(&mut m.subject),
                reply,
                std::mem::take(&mut m.headers),
                m.payload.clone(),
            )
            .await
            .map_err(|e| Failure::client("fast batch", e))?;
    }
    loop {
        match next_reply(&mut replies).await? {
            FastReply::Flow { .. } => {}
            // Duplicates count as taken: the server keeps the first copy.
            FastReply::Done { count } if count == n => return Ok(()),
            FastReply::Done { count } => {
                return Err(odd("fast batch", format!("ack counts {count} of the {n} messages sent")).into());
            }
            FastReply::Failed { code, why } => return Err(Failure::coded("fast batch", code, why)),
        }
    }
}

async fn next_reply(replies: &mut async_nats::Subscriber) -> Result<FastReply, SinkError> {
    match tokio::time::timeout(FAST_TIMEOUT, replies.next()).await {
        Ok(Some(message)) => Ok(fast_reply(&message.payload)),
        Ok(None) => Err(SinkError::Unavailable { what: "fast batch", reason: "the reply subscription ended".into() }),
        Err(_) => Err(SinkError::Unavailable {
            what: "fast batch",
            reason: format!("no reply from the server in {FAST_TIMEOUT:?}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_addressed_with_its_headers() {
        let record = WireRecord::message(
            7,
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
        let gap = WireRecord::gap(8, lost);
        assert_eq!(addressed("edge", "a.b", "ep", 3, &gap).0, "edge.a%2Eb.%gap");
    }

    #[test]
    fn the_publishing_follows_the_server_version() {
        use BatchPublish::*;
        assert_eq!(Publishing::choose(Auto, "2.15.1"), Publishing::Fast);
        assert_eq!(Publishing::choose(Auto, "2.14.0"), Publishing::Fast);
        assert_eq!(Publishing::choose(Auto, "3.0.0-beta"), Publishing::Fast);
        assert_eq!(Publishing::choose(Auto, "2.12.3"), Publishing::Atomic);
        assert_eq!(Publishing::choose(Fast, "2.13.0"), Publishing::Atomic);
        assert_eq!(Publishing::choose(Atomic, "2.15.1"), Publishing::Atomic);
        assert_eq!(Publishing::choose(Atomic, "2.11.9"), Publishing::Messages);
        assert_eq!(Publishing::choose(Auto, "2.10.22"), Publishing::Messages);
        assert_eq!(Publishing::choose(Off, "2.15.1"), Publishing::Messages);
        assert_eq!(Publishing::choose(Auto, "garbage"), Publishing::Messages);
    }

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

    #[test]
    fn fast_replies_are_read() {
        assert_eq!(fast_reply(br#"{"type":"ack","seq":0,"msgs":100}"#), FastReply::Flow { seq: 0, msgs: 100 });
        assert_eq!(fast_reply(br#"{"stream":"T","seq":9,"batch":"b","count":512}"#), FastReply::Done { count: 512 });
        // Every message a duplicate: nothing stored, the batch still counted whole.
        assert_eq!(fast_reply(br#"{"stream":"T","seq":0,"batch":"b","count":3}"#), FastReply::Done { count: 3 });
        let FastReply::Failed { code: None, why } = fast_reply(br#"{"type":"gap","last_seq":4,"seq":9}"#) else {
            panic!()
        };
        assert_eq!(why, "the server missed messages 5 to 8");
        let err = br#"{"type":"err","seq":3,"error":{"code":400,"err_code":10205,"description":"batch publish is disabled"}}"#;
        assert!(
            matches!(fast_reply(err), FastReply::Failed { code: Some(10205), why } if why.contains("batch publish is disabled"))
        );
        let refused = br#"{"error":{"code":400,"err_code":10211,"description":"too many inflight"}}"#;
        assert!(
            matches!(fast_reply(refused), FastReply::Failed { code: Some(10211), why } if why.contains("too many inflight"))
        );
        assert!(matches!(fast_reply(br#"{"type":"ack","seq":3,"msgs":0}"#), FastReply::Failed { .. }));
        assert!(matches!(fast_reply(b"not json"), FastReply::Failed { .. }));
    }
}
