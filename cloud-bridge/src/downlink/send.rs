//! `cloud-bridge send`: stores a message for one edge, for each edge of a group
//! (`downlink.groups`), or for every edge the fleet view knows, each within its backlog bound.
//! What was stored and where, or why not, is said per edge; a full backlog is refused, never
//! dropped.

use std::time::Duration;

use shared::proto::down::MAX_DOWN_BYTES;
use shared::units::now_ms;

use super::DownlinkConfig;
use crate::sink::downlink::{DownBounds, Enqueued, Outgoing, Reply};
use crate::sink::{DownlinkStore, FleetStore, SinkError};

/// Whom a message is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An edge the downlink knows: the fleet view has seen it, or it has a downlink position
    /// or messages. An id nothing knows is refused (a typo's message waited forever).
    Edge(String),
    /// An edge that may not have connected yet (`send --new-edge`).
    NewEdge(String),
    Group(String),
    /// Every edge the fleet view has seen (as of the send: an edge that first connects later
    /// does not get it).
    All,
}

/// What the command was given beyond the target, as flags.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub topic: String,
    pub qos: u8,
    pub retain: bool,
    pub expiry: Option<Duration>,
    /// `name=value` each.
    pub user_properties: Vec<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<String>,
    pub content_type: Option<String>,
    pub payload: Vec<u8>,
    /// The sender's id for the message (`--id`): a send again with it stores nothing more.
    pub id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// A flag the message cannot be made from.
    #[error("{0}")]
    Invalid(String),
    #[error("no group {0:?} in downlink.groups")]
    NoGroup(String),
    #[error("the fleet view knows no edge yet: nothing to send to")]
    NoEdges,
    #[error(
        "edge {0:?} is not known: it never connected and has no downlink messages; check the id, \
         or pass --new-edge to store the message for an edge yet to connect"
    )]
    UnknownEdge(String),
    #[error(transparent)]
    Sink(#[from] SinkError),
}

/// The message the flags describe, each checked: a topic name MQTT allows, QoS 0 to 2, user
/// properties as `name=value`, a response topic only with correlation data's use in mind.
pub fn message(f: Flags) -> Result<Outgoing, SendError> {
    let invalid = |s: String| SendError::Invalid(s);
    shared::topic::validate_name(&f.topic).map_err(|e| invalid(format!("--topic: {e}")))?;
    if f.topic.len() > u16::MAX as usize {
        return Err(invalid(format!("--topic: {} bytes, more than MQTT's 65535", f.topic.len())));
    }
    if f.qos > 2 {
        return Err(invalid(format!("--qos {}: must be 0, 1 or 2", f.qos)));
    }
    if let Some(t) = &f.response_topic {
        shared::topic::validate_name(t).map_err(|e| invalid(format!("--response-topic: {e}")))?;
    }
    // A line break cannot be a header value (JetStream keeps these as headers); MQTT asks
    // that such control characters not be used in its strings anyway (MQTT 5.0 §1.5.4).
    for (flag, value) in [("--response-topic", &f.response_topic), ("--content-type", &f.content_type)] {
        if value.as_deref().is_some_and(|v| v.contains(['\r', '\n'])) {
            return Err(invalid(format!("{flag}: holds a line break (CR or LF)")));
        }
    }
    if f.correlation_data.is_some() && f.response_topic.is_none() {
        return Err(invalid("--correlation-data needs --response-topic: a reply is matched by both".into()));
    }
    let mut user_properties = Vec::with_capacity(f.user_properties.len());
    for p in &f.user_properties {
        let Some((k, v)) = p.split_once('=') else {
            return Err(invalid(format!("--user-property {p:?}: expected name=value")));
        };
        user_properties.push((k.to_owned(), v.to_owned()));
    }
    let expires_at_ms = match f.expiry {
        Some(d) if d.is_zero() => return Err(invalid("--expiry 0: the message would never be delivered".into())),
        Some(d) => Some(now_ms().saturating_add(d.as_millis().min(u64::MAX as u128) as u64)),
        None => None,
    };
    let msg = Outgoing {
        topic: f.topic,
        payload: f.payload,
        qos: f.qos,
        retain: f.retain,
        expires_at_ms,
        user_properties,
        response_topic: f.response_topic,
        correlation_data: f.correlation_data.map(String::into_bytes),
        content_type: f.content_type,
        id: f.id,
    };
    if let Some(id) = &msg.id
        && (id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b)))
    {
        return Err(invalid(format!("--id {id:?}: 1 to 128 of A-Z a-z 0-9 . _ : -")));
    }
    if msg.bytes() > MAX_DOWN_BYTES as u64 {
        return Err(invalid(format!(
            "the message is {} bytes (topic, payload and properties), more than a downlink message may hold \
             ({MAX_DOWN_BYTES})",
            msg.bytes()
        )));
    }
    Ok(msg)
}

/// The edges `target` names, in order, each once.
pub async fn edges<S: FleetStore + DownlinkStore>(
    sink: &S,
    config: &DownlinkConfig,
    target: &Target,
) -> Result<Vec<String>, SendError> {
    let mut edges = match target {
        Target::Edge(e) | Target::NewEdge(e) if e.is_empty() => {
            return Err(SendError::Invalid("--edge: an empty edge id".into()));
        }
        Target::Edge(e) => {
            let known = sink.load_fleet().await?.edges.iter().any(|s| s.edge == *e)
                || sink.down_state(e).await? != crate::sink::downlink::DownState::default()
                || sink.down_backlog(e).await?.messages > 0;
            if !known {
                return Err(SendError::UnknownEdge(e.clone()));
            }
            vec![e.clone()]
        }
        Target::NewEdge(e) => vec![e.clone()],
        Target::Group(g) => config.groups.get(g).cloned().ok_or_else(|| SendError::NoGroup(g.clone()))?,
        Target::All => sink.load_fleet().await?.edges.into_iter().map(|e| e.edge).collect(),
    };
    edges.sort();
    edges.dedup();
    if edges.is_empty() {
        return Err(SendError::NoEdges);
    }
    Ok(edges)
}

/// Stores `msg` for each of `edges`, each within the bounds of `config`, several edges at once
/// (a send to a thousand edges waited for each one's round trips in turn): what happened for
/// each, in order. One refused does not stop the others.
pub async fn send<S: DownlinkStore>(
    sink: &S,
    config: &DownlinkConfig,
    edges: &[String],
    msg: &Outgoing,
) -> Result<Vec<(String, Enqueued)>, SendError> {
    use futures_util::StreamExt;
    if let Some(why) = config.refuses(msg) {
        return Err(SendError::Invalid(why));
    }
    config.fits(sink.down_limit()).map_err(SendError::Invalid)?;
    let bounds = DownBounds { messages: config.max_backlog_messages, bytes: config.max_backlog_bytes.bytes() };
    // Every store under way finishes (one cut short could leave its message uncounted), then
    // the first failure, if any, is the answer.
    let done: Vec<Result<Enqueued, SinkError>> = futures_util::stream::iter(edges)
        .map(|edge| sink.enqueue(edge, msg, bounds))
        .buffered(EDGES_AT_ONCE)
        .collect()
        .await;
    let mut out = Vec::with_capacity(edges.len());
    for (edge, what) in edges.iter().zip(done) {
        out.push((edge.clone(), what?));
    }
    Ok(out)
}

/// Edges a send stores to at once.
pub(crate) const EDGES_AT_ONCE: usize = 32;

/// Makes `msg` a request: its response topic and correlation data as given, or made up
/// (`reply/<edge>/<random>`, 16 random hex digits), so a reply can be told from any other.
pub fn as_request(edge: &str, msg: &mut Outgoing) -> Result<(String, Vec<u8>), SendError> {
    let topic =
        msg.response_topic.get_or_insert_with(|| format!("reply/{edge}/{:016x}", rand::random::<u64>())).clone();
    shared::topic::validate_name(&topic).map_err(|e| SendError::Invalid(format!("response topic: {e}")))?;
    let correlation =
        msg.correlation_data.get_or_insert_with(|| format!("{:016x}", rand::random::<u64>()).into_bytes()).clone();
    Ok((topic, correlation))
}

/// Waits up to `timeout` for `edge`'s reply on `topic` with `correlation`, stored after
/// `cursor` (taken before the request was stored).
pub async fn wait_reply<S: DownlinkStore>(
    sink: &S,
    edge: &str,
    (topic, correlation): (&str, &[u8]),
    cursor: u64,
    timeout: Duration,
) -> Result<Option<Reply>, SinkError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(reply) = sink.find_reply(edge, topic, correlation, cursor).await? {
            return Ok(Some(reply));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One line per edge for the operator.
pub fn describe(config: &DownlinkConfig, topic: &str, edge: &str, what: &Enqueued) -> String {
    match what {
        Enqueued::Stored { seq } => format!("{edge}: stored as downlink message {seq} for {topic}"),
        Enqueued::Already { seq } => {
            format!("{edge}: already stored as downlink message {seq} for {topic} (a send with this --id)")
        }
        Enqueued::Full(b) => format!(
            "{edge}: refused: its backlog holds {} messages, {} bytes; one more passes downlink.max_backlog_messages \
             {} or downlink.max_backlog_bytes {}",
            b.messages,
            b.bytes,
            config.max_backlog_messages,
            config.max_backlog_bytes.bytes()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> Flags {
        Flags { topic: "cmd/reboot".into(), qos: 1, payload: b"now".to_vec(), ..Default::default() }
    }

    #[test]
    fn each_bad_flag_is_named() {
        let bad = [
            (Flags { topic: "cmd/+".into(), ..flags() }, "--topic"),
            (Flags { topic: String::new(), ..flags() }, "--topic"),
            (Flags { qos: 3, ..flags() }, "--qos 3"),
            (Flags { user_properties: vec!["novalue".into()], ..flags() }, "--user-property \"novalue\""),
            (Flags { correlation_data: Some("c".into()), ..flags() }, "--correlation-data needs --response-topic"),
            (Flags { response_topic: Some("r/#".into()), ..flags() }, "--response-topic"),
            (Flags { expiry: Some(Duration::ZERO), ..flags() }, "--expiry 0"),
            (Flags { response_topic: Some("r/1\r\nX: y".into()), ..flags() }, "--response-topic: holds a line break"),
            (Flags { content_type: Some("a\nb".into()), ..flags() }, "--content-type: holds a line break"),
            (Flags { payload: vec![0; MAX_DOWN_BYTES], ..flags() }, "more than a downlink message may hold"),
        ];
        for (f, named) in bad {
            let e = message(f).unwrap_err().to_string();
            assert!(e.contains(named), "{e} should name {named}");
        }
        let ok = message(Flags {
            user_properties: vec!["k=v=w".into()],
            response_topic: Some("reply/1".into()),
            correlation_data: Some("abc".into()),
            expiry: Some(Duration::from_secs(60)),
            ..flags()
        })
        .unwrap();
        assert_eq!(ok.user_properties, [("k".to_string(), "v=w".to_string())]);
        assert_eq!(ok.correlation_data.as_deref(), Some(&b"abc"[..]));
        assert!(ok.expires_at_ms.unwrap() > now_ms() + 59_000);
    }

    #[test]
    fn a_request_keeps_what_was_given_and_makes_up_the_rest() {
        let mut m = message(flags()).unwrap();
        let (topic, correlation) = as_request("edge-1", &mut m).unwrap();
        assert!(topic.starts_with("reply/edge-1/") && topic.len() == "reply/edge-1/".len() + 16, "{topic}");
        assert_eq!((m.response_topic.as_deref(), correlation.len()), (Some(topic.as_str()), 16));
        let mut given = Outgoing { response_topic: Some("r/1".into()), correlation_data: Some(b"c".to_vec()), ..m };
        assert_eq!(as_request("edge-1", &mut given).unwrap(), ("r/1".to_owned(), b"c".to_vec()));
        let mut bad = message(flags()).unwrap();
        assert!(as_request("edge+1", &mut bad).is_err(), "an id that makes no topic name");
    }
}
