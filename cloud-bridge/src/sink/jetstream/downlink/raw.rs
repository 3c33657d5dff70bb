//! Reading a stream's messages whatever bytes a publisher gave them.
//!
//! nats-server keeps a subject's and a header's bytes as they came, UTF-8 or not, and any NATS
//! client that can write `down.>` can write them. async-nats drops its whole connection when the
//! server delivers it a message whose subject or headers are not UTF-8 (as a consumer's or a
//! direct get's message), so every request on that connection, the uplink's included, fails
//! until it is back: one raw publish knocked every bridge over each time it was read. So the
//! downlink reads messages only through the JSON API (`STREAM.MSG.GET`), where nats-server
//! puts U+FFFD for a byte that is not UTF-8 in the subject and base64 of the headers as they
//! are, and parses those headers here: what does not parse names its problem, for the bridge
//! to set the message aside.

use async_nats::jetstream::response::Response;
use async_nats::jetstream::{self, stream};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::sink::SinkError;

/// A stream message as the JSON API gives it.
#[derive(Debug)]
pub(super) struct RawDown {
    pub seq: u64,
    /// Its subject, U+FFFD where a byte was not UTF-8.
    pub subject: String,
    pub time_ms: u64,
    /// Its headers, or why they do not parse.
    pub headers: Result<HeaderMap, String>,
    pub payload: Vec<u8>,
}

impl RawDown {
    /// Why this message cannot be an MQTT message, as far as its bytes go.
    pub(crate) fn problem(&self) -> Option<String> {
        if self.subject.contains(char::REPLACEMENT_CHARACTER) {
            return Some("its subject is not UTF-8 (or holds U+FFFD, which `send` never writes)".into());
        }
        self.headers.as_ref().err().cloned()
    }
}

#[derive(Serialize)]
struct Request<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_by_subj: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_by_subj: Option<&'a str>,
}

/// Which message to get.
#[derive(Debug, Clone, Copy)]
pub(super) enum At<'a> {
    Seq(u64),
    /// The first at or after a sequence on a subject filter.
    Next(u64, &'a str),
    /// The last on a subject filter.
    Last(&'a str),
}

#[derive(Deserialize)]
struct Got {
    message: stream::RawMessage,
}

/// JetStream's error code for "no message found".
const NO_MESSAGE_FOUND: u64 = 10037;

/// The message of `stream` `at`; none if there is none.
pub(super) async fn get(js: &jetstream::Context, stream: &str, at: At<'_>) -> Result<Option<RawDown>, SinkError> {
    let what = "downlink read";
    let request = match at {
        At::Seq(seq) => Request { seq: Some(seq), next_by_subj: None, last_by_subj: None },
        At::Next(seq, filter) => Request { seq: Some(seq), next_by_subj: Some(filter), last_by_subj: None },
        At::Last(filter) => Request { seq: None, next_by_subj: None, last_by_subj: Some(filter) },
    };
    let response: Response<Got> = js
        .request(format!("STREAM.MSG.GET.{stream}"), &request)
        .await
        .map_err(|e| SinkError::nats(what, stream, &e))?;
    let m = match response {
        Response::Ok(got) => got.message,
        Response::Err { error } if error.error_code().0 == NO_MESSAGE_FOUND => return Ok(None),
        Response::Err { error } => return Err(SinkError::nats(what, stream, &error)),
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let payload = b64.decode(&m.payload).map_err(|e| SinkError::corrupt(what, stream, e))?;
    let headers = match m.headers.as_deref().filter(|h| !h.is_empty()) {
        None => Ok(HeaderMap::new()),
        Some(h) => b64.decode(h).map_err(|e| SinkError::corrupt(what, stream, e)).map(|raw| parse_headers(&raw))?,
    };
    let time_ms = u64::try_from(m.time.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    Ok(Some(RawDown { seq: m.sequence, subject: m.subject, time_ms, headers, payload }))
}

/// The messages of `stream` on `filter` from sequence `from` on, in order, as many as `want`
/// gets at once find (the JSON API has no batched get; the gets go together): get `i` asks for
/// the first at or after `from + i`. Every message from `from` up to the last one kept is
/// there, none missed:
///
/// - a message at `from + i` is what get `i` finds, if it was stored when that get ran;
/// - one stored later came after every message then stored (the stream's sequence is the
///   order of storing), so the gets that ran before it found none at or after its sequence:
///   only what lies below the lowest get that found nothing is kept.
///
/// Past the gets' reach, what the last one found is the first after it, so nothing lies
/// between.
///
/// Also whether a get found nothing: the run then holds everything stored when it ran, and
/// what comes later is news (a read need not look again to know).
pub(super) async fn get_run(
    js: &jetstream::Context,
    stream: &str,
    from: u64,
    want: usize,
    filter: &str,
) -> Result<(Vec<RawDown>, bool), SinkError> {
    let gets = (0..want as u64).map(|i| get(js, stream, At::Next(from + i, filter)));
    let got = futures_util::future::try_join_all(gets).await?;
    let below = got.iter().position(Option::is_none).map(|i| from + i as u64);
    let mut run: Vec<RawDown> = got.into_iter().flatten().filter(|m| below.is_none_or(|b| m.seq < b)).collect();
    run.sort_by_key(|m| m.seq);
    run.dedup_by_key(|m| m.seq);
    Ok((run, below.is_some()))
}

#[derive(Serialize)]
struct InfoRequest<'a> {
    subjects_filter: &'a str,
}

#[derive(Deserialize)]
struct Info {
    state: InfoState,
    #[serde(default)]
    total: u64,
}

#[derive(Deserialize)]
struct InfoState {
    #[serde(default)]
    subjects: Option<std::collections::HashMap<String, u64>>,
}

/// How many messages `stream` holds on the subjects `filter` matches, in one request: none
/// if they span more subjects than one answer lists (100,000). async-nats's paging asks again
/// from an offset into an unordered map while subjects are added, and counted some twice
/// (sends then saw a full backlog that was not).
pub(super) async fn count(js: &jetstream::Context, stream: &str, filter: &str) -> Result<Option<u64>, SinkError> {
    let what = "downlink count";
    let response: Response<Info> = js
        .request(format!("STREAM.INFO.{stream}"), &InfoRequest { subjects_filter: filter })
        .await
        .map_err(|e| SinkError::nats(what, filter, &e))?;
    let info = match response {
        Response::Ok(info) => info,
        Response::Err { error } => return Err(SinkError::nats(what, filter, &error)),
    };
    let subjects = info.state.subjects.unwrap_or_default();
    Ok((info.total <= subjects.len() as u64).then(|| subjects.values().sum()))
}

/// A header block (`NATS/1.0` and `Name: value` lines) as a map, or what is wrong with it.
pub(super) fn parse_headers(raw: &[u8]) -> Result<HeaderMap, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "its headers are not UTF-8".to_owned())?;
    let mut lines = text.split("\r\n");
    if !lines.next().is_some_and(|l| l.starts_with("NATS/1.0")) {
        return Err("its headers do not start with NATS/1.0".into());
    }
    let mut map = HeaderMap::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let bad = || format!("its headers hold a line that is not a header: {line:?}");
        let (name, value) = line.split_once(':').ok_or_else(bad)?;
        let name: HeaderName = name.trim().parse().map_err(|_| bad())?;
        let value: HeaderValue = value.trim().parse().map_err(|_| bad())?;
        map.append(name, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_or_name_their_problem() {
        let h = parse_headers(b"NATS/1.0\r\nMqtt-Qos: 2\r\nZone: b\r\nZone: c\r\n\r\n").unwrap();
        assert_eq!(h.get("Mqtt-Qos").map(|v| v.as_str()), Some("2"));
        assert_eq!(h.get_all("Zone").map(|v| v.as_str().to_owned()).collect::<Vec<_>>(), ["b", "c"]);
        assert_eq!(parse_headers(b"NATS/1.0\r\nZone: \xff\r\n\r\n").unwrap_err(), "its headers are not UTF-8");
        assert!(parse_headers(b"NATS/1.0\r\nno colon\r\n\r\n").unwrap_err().contains("not a header"));
        assert!(parse_headers(b"HTTP/1.1\r\n\r\n").unwrap_err().contains("NATS/1.0"));
    }
}
