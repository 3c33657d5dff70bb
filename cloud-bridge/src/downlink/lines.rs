//! `cloud-bridge send --lines FILE`: many messages in one command, one JSON object per line,
//! each with its own target, topic and properties (the keys are `send`'s flags, with `_` for
//! `-`; `payload` as text or `payload_base64`; `edges` for a list of edges):
//!
//! ```text
//! {"edge": "edge-1", "topic": "cmd/reboot", "payload": "now", "id": "reboot-1"}
//! {"group": "line-3", "topic": "config/threshold", "payload": "0.7", "qos": 1, "retain": true}
//! {"edges": ["edge-1", "edge-2"], "topic": "model/meta", "payload_base64": "AAEC", "expiry": "1h"}
//! ```
//!
//! - Every line is checked, and every edge it names, before anything is stored: a bad line
//!   names its number and stores nothing.
//! - Each edge's messages are stored in the order of their lines, a batch at a time
//!   ([`DownlinkStore::enqueue_many`]: the sink's round trips paid once per batch), several
//!   edges at once. Once an edge's backlog refuses one, its later lines are refused too, so
//!   what it gets keeps the order it was given in; other edges go on.
//! - A sink error stops that edge at the line it met; that line and the edge's later ones
//!   may or may not be stored. Lines with an `id` are safe to send again as far as each edge
//!   remembers ids: its last 128, for a day (`SEND_IDS`; a file with more lines per edge stores
//!   again what its older ids no longer name, within the backlog bound).
//! - Memory: the messages as parsed (at most [`MAX_LINES`], [`MAX_TOTAL_BYTES`] in all, each
//!   line at most [`MAX_LINE_BYTES`]), a line number per message and edge (at most
//!   [`MAX_DELIVERIES`]) and, per edge being stored, one batch of copies. Past a bound the
//!   command stores nothing and says which: split the file.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::BufRead;

use base64::Engine;
use futures_util::StreamExt;
use serde::Deserialize;

use super::DownlinkConfig;
use super::send::{EDGES_AT_ONCE, Flags, SendError, Target, message};
use crate::sink::downlink::{Backlog, DownBounds, DownState, Enqueued, EnqueuedMany, Outgoing};
use crate::sink::{DownlinkStore, FleetStore, SinkError};

/// Lines one command reads at most.
pub const MAX_LINES: usize = 1_000_000;
/// The longest line: a downlink message's largest payload in base64, with room for the rest.
pub const MAX_LINE_BYTES: usize = shared::proto::down::MAX_DOWN_BYTES * 4 / 3 + 64 * 1024;
/// The messages' bytes (as an edge's backlog counts them) one command holds, at most.
pub const MAX_TOTAL_BYTES: u64 = 512 << 20;
/// Messages times the edges each is for, at most.
pub const MAX_DELIVERIES: usize = 10_000_000;
/// Messages handed to the sink per call for one edge.
const BATCH: usize = 1024;

/// One line as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    edge: Option<String>,
    edges: Option<Vec<String>>,
    group: Option<String>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    new_edge: bool,
    topic: String,
    payload: Option<String>,
    payload_base64: Option<String>,
    #[serde(default = "qos_one")]
    qos: u8,
    #[serde(default)]
    retain: bool,
    expiry: Option<String>,
    /// `[name, value]` pairs, in order.
    #[serde(default)]
    user_properties: Vec<(String, String)>,
    response_topic: Option<String>,
    correlation_data: Option<String>,
    content_type: Option<String>,
    id: Option<String>,
}

fn qos_one() -> u8 {
    1
}

/// A line's message and whom it is for.
#[derive(Debug)]
pub struct Parsed {
    /// Its line number, from 1.
    pub line: usize,
    pub targets: Vec<Target>,
    pub msg: Outgoing,
}

/// Reads and checks every line of `input` (blank lines skipped); the first bad one is the
/// error, named by its number.
pub fn parse(input: impl BufRead) -> Result<Vec<Parsed>, SendError> {
    parse_within(input, MAX_LINES, MAX_TOTAL_BYTES)
}

fn parse_within(input: impl BufRead, max_lines: usize, max_bytes: u64) -> Result<Vec<Parsed>, SendError> {
    let mut out = Vec::new();
    let mut total = 0u64;
    let mut input = input.take(u64::MAX);
    let mut buf = Vec::new();
    for n in 1.. {
        buf.clear();
        input.set_limit(MAX_LINE_BYTES as u64 + 1);
        let read = input.read_until(b'\n', &mut buf).map_err(|e| SendError::Invalid(format!("line {n}: {e}")))?;
        if read == 0 {
            break;
        }
        if buf.len() > MAX_LINE_BYTES {
            return Err(SendError::Invalid(format!("line {n}: longer than {MAX_LINE_BYTES} bytes")));
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if out.len() == max_lines {
            return Err(SendError::Invalid(format!("line {n}: more than {max_lines} messages in one send")));
        }
        let invalid = |e: String| SendError::Invalid(format!("line {n}: {e}"));
        let line: Line = serde_json::from_slice(&buf).map_err(|e| invalid(e.to_string()))?;
        let (targets, msg) = line.into_message().map_err(invalid)?;
        total += msg.bytes();
        if total > max_bytes {
            return Err(invalid(format!("the messages so far hold more than {max_bytes} bytes; split the file")));
        }
        out.push(Parsed { line: n, targets, msg });
    }
    Ok(out)
}

impl Line {
    fn into_message(self) -> Result<(Vec<Target>, Outgoing), String> {
        let named = [self.edge.is_some(), self.edges.is_some(), self.group.is_some(), self.all];
        if named.iter().filter(|n| **n).count() != 1 {
            return Err("exactly one of edge, edges, group and all".into());
        }
        if self.new_edge && self.edge.is_none() && self.edges.is_none() {
            return Err("new_edge only with edge or edges".into());
        }
        let one = |e: String| match self.new_edge {
            true => Target::NewEdge(e),
            false => Target::Edge(e),
        };
        let targets = match (self.edge, self.edges, self.group) {
            (Some(e), _, _) => vec![one(e)],
            (_, Some(es), _) if es.is_empty() => return Err("edges: an empty list".into()),
            (_, Some(es), _) => es.into_iter().map(one).collect(),
            (_, _, Some(g)) => vec![Target::Group(g)],
            _ => vec![Target::All],
        };
        let payload = match (self.payload, self.payload_base64) {
            (Some(p), None) => p.into_bytes(),
            (None, Some(b)) => {
                base64::engine::general_purpose::STANDARD.decode(b).map_err(|e| format!("payload_base64: {e}"))?
            }
            (None, None) => Vec::new(),
            (Some(_), Some(_)) => return Err("payload and payload_base64 both".into()),
        };
        let expiry = self
            .expiry
            .map(|e| e.parse::<shared::units::HumanDuration>().map(|d| d.0).map_err(|e| format!("expiry: {e}")))
            .transpose()?;
        let mut user_properties = Vec::with_capacity(self.user_properties.len());
        for (k, v) in self.user_properties {
            // `message` takes them as the flag does, split at the first `=`.
            if k.contains('=') {
                return Err(format!("user_properties: name {k:?} holds '=' (neither can --user-property)"));
            }
            user_properties.push(format!("{k}={v}"));
        }
        let msg = message(Flags {
            topic: self.topic,
            qos: self.qos,
            retain: self.retain,
            expiry,
            user_properties,
            response_topic: self.response_topic,
            correlation_data: self.correlation_data,
            content_type: self.content_type,
            payload,
            id: self.id,
        })
        .map_err(|e| e.to_string())?;
        Ok((targets, msg))
    }
}

/// What the lines did for one edge.
#[derive(Debug, Default)]
pub struct EdgeOutcome {
    pub edge: String,
    pub stored: u64,
    /// Lines whose id was stored before.
    pub already: u64,
    /// Lines the backlog refused, from the first: its line and the backlog it met.
    pub refused: Option<(usize, u64, Backlog)>,
    /// The line a sink error stopped at, and the error: it and the edge's later lines may not
    /// be stored.
    pub failed: Option<(usize, SinkError)>,
}

impl EdgeOutcome {
    /// Whether every line for the edge is stored.
    pub fn all_stored(&self) -> bool {
        self.refused.is_none() && self.failed.is_none()
    }

    /// One line for the operator.
    pub fn describe(&self, config: &DownlinkConfig) -> String {
        let mut s = format!("{}: {} stored", self.edge, self.stored);
        if self.already > 0 {
            s += &format!(", {} already stored (a send with their id)", self.already);
        }
        if let Some((line, n, b)) = &self.refused {
            s += &format!(
                "; {n} refused from line {line}: its backlog held {} messages, {} bytes; one more passes \
                 downlink.max_backlog_messages {} or downlink.max_backlog_bytes {}",
                b.messages,
                b.bytes,
                config.max_backlog_messages,
                config.max_backlog_bytes.bytes()
            );
        }
        if let Some((line, e)) = &self.failed {
            s += &format!("; stopped at line {line} ({e}): it and the edge's later lines may or may not be stored");
        }
        s
    }
}

/// Stores every parsed line for the edges it names, each edge's in line order: what happened
/// per edge, in edge id order. Nothing is stored if a line names a group or an edge that is
/// not there, or a message `config` refuses.
pub async fn send<S: FleetStore + DownlinkStore>(
    sink: &S,
    config: &DownlinkConfig,
    lines: &[Parsed],
) -> Result<Vec<EdgeOutcome>, SendError> {
    config.fits(sink.down_limit()).map_err(SendError::Invalid)?;
    let mut resolve = Resolver::default();
    let mut per_edge: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut deliveries = 0usize;
    for (i, p) in lines.iter().enumerate() {
        let invalid = |e: String| SendError::Invalid(format!("line {}: {e}", p.line));
        if let Some(why) = config.refuses(&p.msg) {
            return Err(invalid(why));
        }
        let mut edges = Vec::new();
        for t in &p.targets {
            edges.extend(resolve.edges(sink, config, t).await.map_err(|e| match e {
                SendError::Sink(e) => SendError::Sink(e),
                other => invalid(other.to_string()),
            })?);
        }
        edges.sort();
        edges.dedup();
        deliveries += edges.len();
        if deliveries > MAX_DELIVERIES {
            return Err(invalid(format!(
                "more than {MAX_DELIVERIES} messages to store (a message per edge it is for); split the file"
            )));
        }
        for e in edges {
            per_edge.entry(e).or_default().push(i);
        }
    }
    if per_edge.is_empty() {
        return Err(SendError::NoEdges);
    }
    let bounds = DownBounds { messages: config.max_backlog_messages, bytes: config.max_backlog_bytes.bytes() };
    let mut out: Vec<EdgeOutcome> = futures_util::stream::iter(per_edge)
        .map(|(edge, idx)| store_edge(sink, bounds, lines, edge, idx))
        .buffer_unordered(EDGES_AT_ONCE)
        .collect()
        .await;
    out.sort_by(|a, b| a.edge.cmp(&b.edge));
    Ok(out)
}

/// Stores the lines `idx` of `lines` for `edge`, a batch at a time.
async fn store_edge<S: DownlinkStore>(
    sink: &S,
    bounds: DownBounds,
    lines: &[Parsed],
    edge: String,
    idx: Vec<usize>,
) -> EdgeOutcome {
    let mut out = EdgeOutcome { edge, ..Default::default() };
    let edge = out.edge.as_str();
    let many = EnqueuedMany::in_chunks(&idx, BATCH, |batch| {
        let msgs: Vec<Outgoing> = batch.iter().map(|i| lines[*i].msg.clone()).collect();
        async move { sink.enqueue_many(edge, &msgs, bounds).await }
    })
    .await;
    for (i, what) in idx.iter().zip(&many.done) {
        match what {
            Enqueued::Stored { .. } => out.stored += 1,
            Enqueued::Already { .. } => out.already += 1,
            Enqueued::Full(b) => match &mut out.refused {
                Some((_, n, _)) => *n += 1,
                None => out.refused = Some((lines[*i].line, 1, *b)),
            },
        }
    }
    if let Some(e) = many.error {
        let at = idx.get(many.done.len()).map_or(0, |i| lines[*i].line);
        out.failed = Some((at, e));
    }
    out
}

/// The edges targets name, the fleet view read once and each edge checked once.
#[derive(Default)]
struct Resolver {
    fleet: Option<BTreeSet<String>>,
    known: HashMap<String, bool>,
}

impl Resolver {
    async fn fleet<S: FleetStore>(&mut self, sink: &S) -> Result<&BTreeSet<String>, SendError> {
        if self.fleet.is_none() {
            self.fleet = Some(sink.load_fleet().await?.edges.into_iter().map(|e| e.edge).collect());
        }
        Ok(self.fleet.get_or_insert_default())
    }

    /// As [`super::send::edges`] has them, but for the reads done once.
    async fn edges<S: FleetStore + DownlinkStore>(
        &mut self,
        sink: &S,
        config: &DownlinkConfig,
        target: &Target,
    ) -> Result<Vec<String>, SendError> {
        match target {
            Target::Edge(e) if e.is_empty() => Err(SendError::Invalid("edge: an empty edge id".into())),
            Target::Edge(e) => {
                let known = match self.known.get(e) {
                    Some(k) => *k,
                    None => {
                        let k = self.fleet(sink).await?.contains(e)
                            || sink.down_state(e).await? != DownState::default()
                            || sink.down_backlog(e).await?.messages > 0;
                        self.known.insert(e.clone(), k);
                        k
                    }
                };
                match known {
                    true => Ok(vec![e.clone()]),
                    false => Err(SendError::UnknownEdge(e.clone())),
                }
            }
            Target::All => {
                let fleet = self.fleet(sink).await?;
                if fleet.is_empty() {
                    return Err(SendError::NoEdges);
                }
                Ok(fleet.iter().cloned().collect())
            }
            other => super::send::edges(sink, config, other).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::downlink::ReadLimit;

    fn parse_str(s: &str) -> Result<Vec<Parsed>, String> {
        parse(s.as_bytes()).map_err(|e| e.to_string())
    }

    #[test]
    fn each_bad_line_is_named_by_its_number() {
        let good = r#"{"edge": "e1", "topic": "cmd/a", "payload": "x"}"#;
        let bad = [
            (r#"{"topic": "cmd/a"}"#, "exactly one of edge, edges, group and all"),
            (r#"{"edge": "e1", "group": "g", "topic": "cmd/a"}"#, "exactly one of"),
            (r#"{"edge": "e1", "topic": "cmd/+"}"#, "--topic"),
            (r#"{"edge": "e1", "topic": "cmd/a", "qos": 3}"#, "--qos 3"),
            (r#"{"edge": "e1", "topic": "cmd/a", "colour": "red"}"#, "unknown field `colour`"),
            (r#"{"edge": "e1", "topic": "cmd/a", "payload": "x", "payload_base64": "eA=="}"#, "both"),
            (r#"{"edge": "e1", "topic": "cmd/a", "payload_base64": "!!"}"#, "payload_base64"),
            (r#"{"edge": "e1", "topic": "cmd/a", "expiry": "soon"}"#, "expiry"),
            (r#"{"edges": [], "topic": "cmd/a"}"#, "edges: an empty list"),
            (r#"{"group": "g", "new_edge": true, "topic": "cmd/a"}"#, "new_edge only with"),
            (r#"{"edge": "e1", "topic": "cmd/a", "user_properties": [["a=b", "c"]]}"#, "holds '='"),
            (r#"{"edge": "e1", "topic": "cmd/a", "id": "no spaces"}"#, "--id"),
            ("not json", "expected"),
        ];
        for (line, named) in bad {
            let e = parse_str(&format!("{good}\n\n{line}\n{good}\n")).unwrap_err();
            assert!(e.starts_with("line 3: ") && e.contains(named), "{line}: {e}");
        }
        let long = format!("{good}\n{}\n", " ".repeat(MAX_LINE_BYTES + 1));
        assert!(parse_str(&long).unwrap_err().starts_with("line 2: longer than"));
        // The whole is bounded too: in lines, and in the messages' bytes.
        let three = format!("{good}\n{good}\n{good}\n");
        let e = parse_within(three.as_bytes(), 2, u64::MAX).unwrap_err().to_string();
        assert!(e.starts_with("line 3: more than 2 messages"), "{e}");
        let e = parse_within(three.as_bytes(), 10, 12).unwrap_err().to_string();
        assert!(e.starts_with("line 3: the messages so far hold more than 12 bytes"), "{e}");
    }

    #[test]
    fn a_line_is_the_message_its_flags_would_make() {
        let lines = parse_str(concat!(
            r#"{"edges": ["e1", "e2"], "new_edge": true, "topic": "cmd/a", "payload_base64": "AAEC", "qos": 0,"#,
            r#" "retain": true, "expiry": "1h", "user_properties": [["b", "1"], ["a", "x=y"], ["b", "2"]],"#,
            r#" "response_topic": "r/1", "correlation_data": "c", "content_type": "bin", "id": "a-1"}"#,
            "\n",
            r#"{"all": true, "topic": "cmd/b"}"#,
        ))
        .unwrap();
        assert_eq!(lines.len(), 2);
        let (a, b) = (&lines[0], &lines[1]);
        assert_eq!((a.line, b.line), (1, 2));
        assert_eq!(a.targets, [Target::NewEdge("e1".into()), Target::NewEdge("e2".into())]);
        assert_eq!((a.msg.payload.as_slice(), a.msg.qos, a.msg.retain), (&[0u8, 1, 2][..], 0, true));
        let props: Vec<(&str, &str)> = a.msg.user_properties.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(props, [("b", "1"), ("a", "x=y"), ("b", "2")], "in order, repeats kept");
        assert_eq!(a.msg.correlation_data.as_deref(), Some(&b"c"[..]));
        assert_eq!((a.msg.content_type.as_deref(), a.msg.id.as_deref()), (Some("bin"), Some("a-1")));
        assert!(a.msg.expires_at_ms.unwrap() > shared::units::now_ms() + 3_590_000);
        assert_eq!((b.targets.as_slice(), b.msg.qos, b.msg.payload.len()), (&[Target::All][..], 1, 0));
    }

    /// More lines for one edge than one sink call takes: the bound holds across batches, the
    /// refusal counts from the first line refused, and an id repeated across batches is
    /// stored once.
    #[tokio::test]
    async fn an_edges_lines_go_in_batches_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let sink = crate::sink::sqlite::SqliteSink::open(&dir.path().join("sink.db")).unwrap();
        let mut text = String::new();
        for n in 1..=2100 {
            let id = if n == 2000 { "first".to_owned() } else { format!("m-{n}") };
            text += &format!(
                "{{\"edge\": \"e1\", \"new_edge\": true, \"topic\": \"cmd/a\", \"payload\": \"{n}\", \"id\": \"{id}\"}}\n"
            );
        }
        text += "{\"edge\": \"e2\", \"new_edge\": true, \"topic\": \"cmd/a\", \"payload\": \"x\", \"id\": \"first\"}\n";
        for n in 1..=100 {
            text += &format!(
                "{{\"edge\": \"e3\", \"new_edge\": true, \"topic\": \"cmd/a\", \"payload\": \"{n}\", \"id\": \"r-{n}\"}}\n"
            );
        }
        let lines = parse(text.as_bytes()).unwrap();
        let config = DownlinkConfig { max_backlog_messages: 1500, ..DownlinkConfig::default() };
        let out = send(&sink, &config, &lines).await.unwrap();
        assert_eq!(out.len(), 3);
        let e1 = &out[0];
        assert_eq!((e1.edge.as_str(), e1.stored, e1.already), ("e1", 1500, 0));
        let (line, n, backlog) = e1.refused.unwrap();
        assert_eq!((line, n, backlog.messages), (1501, 600, 1500));
        assert_eq!((out[1].stored, out[1].all_stored()), (1, true), "another edge's ids are its own");
        let stored = sink.down_read("e1", 0, ReadLimit::messages(2000)).await.unwrap();
        let payloads: Vec<String> =
            stored.iter().map(|p| String::from_utf8_lossy(&p.msg.payload).into_owned()).collect();
        assert_eq!(payloads, (1..=1500).map(|n| n.to_string()).collect::<Vec<_>>(), "in line order");
        // The same file again: an edge's last 128 ids are remembered (`SEND_IDS`), so e3's 100
        // lines are stored once; e1's bound refuses what its older ids no longer name.
        let again = send(&sink, &config, &lines).await.unwrap();
        assert_eq!((again[2].stored, again[2].already), (0, 100));
        assert_eq!((again[0].stored, again[0].refused.is_some()), (0, true));
        assert_eq!(sink.down_read("e1", 0, ReadLimit::messages(2000)).await.unwrap().len(), 1500);
    }
}
