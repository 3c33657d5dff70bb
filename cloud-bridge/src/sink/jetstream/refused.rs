//! Which publish failures are the record's own and which the moment's, and where a record
//! JetStream will never take goes.
//!
//! A record is refused for itself when it is too large for the server (`max_payload`, 1 MiB by
//! default, where an edge takes messages up to 8 MiB) or for the stream (`max_msg_size`,
//! headers over 64 KiB), or when a header asks for something the stream refuses (the
//! `Nats-Expected-*` checks, rollups, per-message TTLs, counters, schedules; `names` keeps user
//! properties from naming those, so only a stream configured for it gets there). Sending it
//! again can never succeed, and a batch is refused whole, so the lane would stop at it. So the
//! batch goes again message by message, per subject in order, and each refused record goes to
//! `<prefix>.<edge>.%dead` with its headers, its subject and the reason, under its own
//! `Nats-Msg-Id` (a resend is deduplicated like any record, and it is stored once, here or
//! there). The mark rises over it only once that publish is acked, as over any record.
//!
//! Everything else (no responders, the cluster or stream offline, storage full, too many
//! requests, timeouts, a lost connection) is the moment's: the batch is retried with backoff on
//! the same session ([`crate::sink::Retry`]).

use async_nats::HeaderMap;
use async_nats::header::HeaderName;
use async_nats::jetstream;
use bytes::Bytes;

use crate::sink::{DeadLetterLabel, SinkError, SinkMetrics};

/// The server answered, but not as it should have (an unreadable ack, a count that is off).
pub(super) fn odd(what: &'static str, reason: impl std::fmt::Display) -> SinkError {
    SinkError::JetStream { what, code: None, reason: reason.to_string() }
}

/// Why a publish did not go through.
#[derive(Debug)]
pub(super) enum Failure {
    /// JetStream refuses a record for itself: `reason` is the metric label.
    Record { reason: &'static str, detail: String },
    /// The moment's: try again.
    Transient(SinkError),
}

impl From<SinkError> for Failure {
    fn from(e: SinkError) -> Self {
        Failure::Transient(e)
    }
}

impl Failure {
    /// From a JetStream error code (`err_code` of an API error).
    pub(super) fn coded(what: &'static str, code: Option<u64>, detail: String) -> Self {
        match code.and_then(record_reason) {
            Some(reason) => Failure::Record { reason, detail },
            None => Failure::Transient(SinkError::JetStream { what, code, reason: detail }),
        }
    }

    /// From a core NATS publish (the client checks size and subject before sending).
    pub(super) fn client(what: &'static str, e: async_nats::PublishError) -> Self {
        use async_nats::client::PublishErrorKind as Kind;
        match e.kind() {
            Kind::MaxPayloadExceeded => Failure::Record { reason: "too_large", detail: e.to_string() },
            Kind::InvalidSubject => Failure::Record { reason: "subject", detail: e.to_string() },
            Kind::Send => Failure::Transient(SinkError::Unavailable { what, reason: e.to_string() }),
        }
    }

    /// From a JetStream publish or its ack.
    pub(super) fn js(what: &'static str, e: jetstream::context::PublishError) -> Self {
        use jetstream::context::PublishErrorKind as Kind;
        let detail = e.to_string();
        match e.kind() {
            Kind::MaxPayloadExceeded => Failure::Record { reason: "too_large", detail },
            Kind::WrongLastMessageId | Kind::WrongLastSequence => Failure::Record { reason: "expectation", detail },
            Kind::Other => {
                let code = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<jetstream::Error>())
                    .map(|j| j.error_code().0);
                Self::coded(what, code, detail)
            }
            _ => Failure::Transient(SinkError::nats(what, "", &e)),
        }
    }

    pub(super) fn into_error(self) -> SinkError {
        match self {
            Failure::Record { reason, detail } => SinkError::Refused { reason, detail },
            Failure::Transient(e) => e,
        }
    }
}

/// The metric label of a JetStream error code a record causes by itself, `None` for the
/// moment's (nats-server's `errors.json`).
pub(super) fn record_reason(code: u64) -> Option<&'static str> {
    match code {
        // Message size exceeds the stream's maximum; headers over 64 KiB.
        10054 | 10097 => Some("too_large"),
        // Expected stream, stream sequence, last msg id, last sequence (also per subject).
        10060 | 10063 | 10070 | 10071 | 10164 | 10193 => Some("expectation"),
        // Rollup refused, per-message TTL invalid or disabled, counters, an atomic batch's
        // unsupported header, message schedules.
        10111 | 10165 | 10166 | 10168..=10172 | 10177 | 10188..=10192 | 10203 | 10212 | 10223 => Some("header"),
        _ => None,
    }
}

const REASON: HeaderName = HeaderName::from_static("Edge-Dead-Letter-Reason");
const ERROR: HeaderName = HeaderName::from_static("Edge-Dead-Letter-Error");
const SUBJECT: HeaderName = HeaderName::from_static("Edge-Dead-Letter-Subject");
const BYTES: HeaderName = HeaderName::from_static("Edge-Dead-Letter-Payload-Bytes");

/// The dead-letter subject of `edge`: a token no topic produces, as `%gap`.
pub(super) fn dead_subject(prefix: &str, edge: &str) -> String {
    format!("{prefix}.{}.%dead", crate::names::token(edge))
}

/// Publishes one message and waits for its ack; whether it was new.
async fn publish_acked(
    js: &jetstream::Context,
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
) -> Result<bool, Failure> {
    let ack = js.publish_with_headers(subject, headers, payload).await.map_err(|e| Failure::js("publish", e))?;
    let ack = ack.await.map_err(|e| Failure::js("publish ack", e))?;
    Ok(!ack.duplicate)
}

/// Publishes `messages` (subject, headers, payload) message by message, per subject one at a
/// time in order, setting aside in `dead` each one refused for itself.
pub(super) async fn publish_setting_aside(
    js: &jetstream::Context,
    messages: Vec<(String, HeaderMap, Bytes)>,
    dead: &str,
    metrics: &SinkMetrics,
) -> Result<(), Failure> {
    use futures_util::StreamExt;
    let mut chains: Vec<(String, Vec<(HeaderMap, Bytes)>)> = Vec::new();
    let mut chain_of = std::collections::HashMap::new();
    for (subject, headers, payload) in messages {
        let i = *chain_of.entry(subject.clone()).or_insert_with(|| {
            chains.push((subject, Vec::new()));
            chains.len() - 1
        });
        chains[i].1.push((headers, payload));
    }
    let mut running: futures_util::stream::FuturesUnordered<_> = chains
        .into_iter()
        .map(|(subject, messages)| async move {
            for (headers, payload) in messages {
                match publish_acked(js, subject.clone(), headers.clone(), payload.clone()).await {
                    Ok(_) => {}
                    Err(Failure::Record { reason, detail }) => {
                        set_aside(js, dead, &subject, headers, payload, reason, &detail, metrics).await?;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok::<(), Failure>(())
        })
        .collect();
    while let Some(result) = running.next().await {
        result?;
    }
    Ok(())
}

/// Stores a refused record in `dead`: with its headers and payload if JetStream takes them,
/// else with only its ids and the reason (the payload's size said in a header).
#[allow(clippy::too_many_arguments)]
async fn set_aside(
    js: &jetstream::Context,
    dead: &str,
    subject: &str,
    headers: HeaderMap,
    payload: Bytes,
    reason: &'static str,
    detail: &str,
    metrics: &SinkMetrics,
) -> Result<(), Failure> {
    let mut ids = HeaderMap::new();
    for name in [async_nats::header::NATS_MESSAGE_ID.as_ref(), "Edge-Id", "Edge-Seq"] {
        if let Some(v) = headers.get(name) {
            ids.insert(name, v.as_str());
        }
    }
    let mark = |mut h: HeaderMap| {
        h.insert(REASON, reason);
        h.insert(ERROR, super::header::header_value(detail, 256).as_str());
        h.insert(SUBJECT, subject);
        h.insert(BYTES, payload.len().to_string().as_str());
        h
    };
    tracing::warn!(
        subject,
        reason,
        error = detail,
        "record refused by JetStream; set aside in the dead-letter subject"
    );
    let new = match publish_acked(js, dead.to_owned(), mark(headers), payload.clone()).await {
        Ok(new) => new,
        Err(Failure::Record { .. }) => {
            publish_acked(js, dead.to_owned(), mark(ids), Bytes::new()).await.map_err(|e| {
                Failure::Transient(match e {
                    Failure::Record { reason, detail } => SinkError::Refused {
                        reason,
                        detail: format!("not even the record's ids are taken as a dead letter: {detail}"),
                    },
                    other => other.into_error(),
                })
            })?
        }
        Err(e) => return Err(e),
    };
    // A resend's copy is a duplicate, dropped by JetStream: counted once.
    if new {
        metrics.dead_letters.get_or_create(&DeadLetterLabel { reason }).inc();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_are_the_records_or_the_moments() {
        for (code, reason) in [(10054, "too_large"), (10097, "too_large"), (10071, "expectation"), (10165, "header")] {
            assert_eq!(record_reason(code), Some(reason), "{code}");
        }
        // Storage full, no responders, offline, too many requests, store failed, not enabled.
        for code in [10047, 10023, 10008, 10118, 10167, 10077, 10076, 10059, 10211] {
            assert_eq!(record_reason(code), None, "{code}");
        }
        assert!(matches!(Failure::coded("p", Some(10054), "x".into()), Failure::Record { reason: "too_large", .. }));
        assert!(matches!(Failure::coded("p", Some(10047), "x".into()), Failure::Transient(_)));
        assert!(matches!(Failure::coded("p", None, "x".into()), Failure::Transient(_)));
    }
}
