//! ADR-50 fast ingest (nats-server 2.14 or newer): a batch's messages stream with one flow ack
//! every few hundred and a pub ack at the end; the server stores each as it arrives and, in
//! `fail` gap mode, stops storing a batch at its first missing sequence. So a connection lost
//! mid-batch (whose queued messages the client sends after reconnecting) leaves a prefix, never
//! a hole.

use std::time::Duration;

use futures_util::StreamExt;
use serde::Deserialize;

use super::outgoing::Outgoing;
use super::refused::{Failure, odd};
use crate::sink::SinkError;

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

/// A fast batch's reply subscription, made before its turn comes. Its second token is the
/// batch id; the subscription ends when this drops.
pub(super) struct Replies {
    inbox: String,
    replies: async_nats::Subscriber,
}

impl std::fmt::Debug for Replies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replies").field("inbox", &self.inbox).finish_non_exhaustive()
    }
}

/// Subscribes to a fresh batch's replies.
pub(super) async fn subscribe(client: &async_nats::Client) -> Result<Replies, SinkError> {
    let inbox = client.new_inbox();
    let replies = client.subscribe(format!("{inbox}.>")).await.map_err(|e| SinkError::nats("fast batch", "", &e))?;
    Ok(Replies { inbox, replies })
}

/// Publishes `messages` as one fast-ingest batch, on `replies` if they were subscribed to
/// ahead, and returns after the server acked the whole batch. The server stores each message as
/// it arrives, so this is called only once the batch ahead is in. Subjects and headers move out
/// of `messages`.
pub(super) async fn publish(
    client: &async_nats::Client,
    messages: &mut [Outgoing],
    replies: Option<Replies>,
) -> Result<(), Failure> {
    let n = messages.len() as u64;
    if n == 0 {
        return Ok(());
    }
    let Replies { inbox, mut replies } = match replies {
        Some(replies) => replies,
        None => subscribe(client).await?,
    };
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
