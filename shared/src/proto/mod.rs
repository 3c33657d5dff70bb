//! The ehb/1 bridge protocol between an edge and the cloud, without I/O.
//!
//! - One QUIC connection per edge (ALPN [`ALPN`], mutual TLS). The edge's identity is its client
//!   certificate, never a field of a frame.
//! - The first bidirectional stream carries [`Control`] frames: `Hello` / `Welcome` (version
//!   negotiation, the cloud's committed seq per lane), then `Ack`, `Ping` / `Pong`, `Dict`.
//! - Each [`Batch`] of spooled records travels on its own unidirectional stream.
//! - Model versions are announced on the control stream ([`Control::Model`]); the edge fetches
//!   the chunks it lacks, one bidirectional stream per chunk ([`Fetch`], [`ChunkReply`]).
//! - Every frame is a 4-byte big-endian length and a CBOR body ([`codec`]); lengths are checked
//!   against a hard limit before anything is allocated. Batch bodies may be zstd-compressed,
//!   with a dictionary announced by id ([`compress`]), and are decompressed under an output cap.
//! - Unknown fields are ignored and unknown control frames decode as [`Control::Unknown`], so
//!   adjacent versions can add to a frame; versions without a common one are refused.
//!
//! Versions (the highest both speak is chosen in the hello):
//! - 1: the first.
//! - 2: dictionary ids are the whole SHA-256 of the bytes in hex (64 digits), not its first 16:
//!   with 64 bits, an edge could make two of its dictionaries share an id in about 2^32 tries.
//!   Nothing else changed meaning. A frame may gain optional fields without a version step (a
//!   field that is absent defaults, one that is unknown is skipped); a step is for a field
//!   whose meaning changes, as the ids did here.
//! - 3: the Welcome says what the cloud's sink can store of one record ([`SinkLimits`], counted
//!   by [`record_size`]), so the edge refuses at PUBLISH what the sink could not store whole
//!   instead of acknowledging it and having it dead-lettered without its payload. A bridge
//!   sends it only in a version 3 session; an edge that has none refuses nothing for it.
//!
//! The session logic of both ends is in [`edge`] and [`cloud`]: state machines fed with decoded
//! frames and the current time, which say what to send and what to do, so tests drive them with
//! a virtual clock and no network.

pub mod backoff;
pub mod batch_frame;
pub mod bound;
pub mod close;
pub mod cloud;
pub mod codec;
pub mod columns;
pub mod compress;
pub mod down;
pub mod edge;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "io")]
pub mod io;
mod position;
pub mod probe;
pub mod record;
pub(crate) mod varint;
pub use position::{Lane, Seq};
pub use record::{GapReason, RecordBody, SchemaRef, WireGap, WireMessage, WireRecord};
#[cfg(test)]
mod down_tests;
#[cfg(test)]
mod robustness_tests;
#[cfg(test)]
mod session_tests;

use serde::{Deserialize, Serialize};

/// The QUIC ALPN of the protocol family; the version inside is negotiated in `Hello`.
pub const ALPN: &[u8] = b"ehb/1";

/// Protocol versions this build speaks: 2 names dictionaries by the whole SHA-256, 3 has the
/// Welcome say what the sink stores of one record, 4 sends batches in one framing level
/// ([`batch_frame`]), 5 carries the downlink ([`down`]), 6 sends batch bodies column-wise
/// ([`columns`]), 7 bit-packs them and names the schema a message was validated against
/// ([`SchemaRef`]), 8 takes binary payloads apart by that schema ([`columns::Shapes`]), 9 has
/// the edge's hello say how much of the downlink it holds ([`Hello::down_window`]).
pub const VERSIONS: &[u16] =
    &[1, 2, 3, 4, DOWNLINK_VERSION, COLUMNS_VERSION, SCHEMA_VERSION, SHAPES_VERSION, DOWN_WINDOW_VERSION];

/// The first version whose hello says how much of the downlink the edge holds unanswered
/// ([`down::EdgeWindow`]): the bridge sends within it, and the edge ends a session that passes
/// it. Earlier sessions keep [`down::MAX_DOWN_WINDOW`] messages and the bridge's bytes.
pub const DOWN_WINDOW_VERSION: u16 = 9;

/// The first version whose column-wise bodies are in format 3 ([`columns::Format::V3`]):
/// Avro and Protobuf payloads taken apart by the schema they were validated against.
pub const SHAPES_VERSION: u16 = 8;

/// The first version whose records name their schema ([`WireMessage::schema`]) and whose
/// column-wise bodies are in format 2 ([`columns::Format::V2`]).
pub(crate) const SCHEMA_VERSION: u16 = 7;

/// The first version whose batches may be column-wise ([`Codec::Columns`],
/// [`Codec::ZstdColumns`]): an edge sends them only on such a session.
pub(crate) const COLUMNS_VERSION: u16 = 6;

/// The first version with the downlink ([`down`]): a bridge sends `Down` frames only on such a
/// session, an edge takes them only on one.
pub const DOWNLINK_VERSION: u16 = 5;

/// What the cloud's sink can store of one record (protocol version 3, in the Welcome), both as
/// [`record_size`] counts: 0 is no limit but the protocol's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkLimits {
    /// Its payload and headers together.
    pub record_bytes: u64,
    /// Its headers alone.
    pub header_bytes: u64,
}

/// The most the schema headers of a record take (`Edge-Schema: <subject>/<version>`, a subject
/// of at most 128 bytes, and `Edge-Schema-Id: <16 hex digits>`): a sink announces its limits
/// with this taken off, as it does its own headers, so a record the edge found to fit still
/// fits once it names its schema.
pub const SCHEMA_HEADERS_MAX: usize = ("Edge-Schema".len() + 128 + 1 + 10 + 4) + ("Edge-Schema-Id".len() + 16 + 4);

/// A record's headers and its whole size as a sink stores it (a JetStream message: its
/// payload, and a header per MQTT property as `cloud_bridge::names::headers` writes them), at
/// least what they take: every user property counted as if its name had to be renamed, the
/// correlation data in base64. The bridge's own per-record headers (the message id, the QoS)
/// are its to take off the limits it announces.
pub fn record_size(
    topic: &str,
    payload: usize,
    user: &[(String, String)],
    correlation: Option<usize>,
    content_type: Option<&str>,
) -> (u64, u64) {
    // "Name: value\r\n".
    let header = |name: &str, value: usize| (name.len() + value + 4) as u64;
    let mut headers = header("Mqtt-Topic", topic.len());
    headers += user.iter().map(|(k, v)| header("Mqtt-Prop-", k.len() + v.len())).sum::<u64>();
    headers += correlation.map_or(0, |n| header("Mqtt-Correlation-Data", n.div_ceil(3) * 4));
    headers += content_type.map_or(0, |c| header("Mqtt-Content-Type", c.len()));
    (headers, headers + payload as u64)
}

/// How long an edge gives a QUIC handshake before it tries again later. The bridge gives up its
/// side a little later ([`BRIDGE_HANDSHAKE_TIMEOUT`]), after the edge did, so a handshake the
/// edge abandoned does not hold one of the bridge's `limits.handshakes_in_flight` places until
/// its idle timeout.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// When the bridge gives up a handshake: after the edge's own timeout, counted from the edge's
/// first packet, which the edge sent earlier.
pub const BRIDGE_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(12);

/// What one user property pair costs in memory besides its strings' bytes: two `String`
/// headers (24 bytes each on 64-bit targets), counted at this on every target so a bound never
/// under-counts. Every bound on bytes that may hold user properties counts a pair as this plus
/// its name and value: the edge's queues, retained store and spool reads, the bridge's batch
/// reservations.
pub const USER_PROPERTY_COST: usize = 48;

/// Whether a QUIC transport error code carries a TLS alert (CRYPTO_ERROR, RFC 9000 §20.1): the
/// peer refused the handshake for what was presented (a certificate), as opposed to giving up.
pub fn is_tls_alert(code: u64) -> bool {
    (0x100..0x200).contains(&code)
}

/// Largest control frame body accepted: a model announcement carries a whole manifest.
pub const MAX_CONTROL_FRAME: usize = crate::model::MAX_MANIFEST_BYTES + (64 << 10);
/// Largest control frame body a bridge accepts from an edge: a dictionary ([`MAX_DICT_BYTES`])
/// is the largest an edge sends, a hello or a TCO report of the most classes a few KiB.
pub const MAX_EDGE_CONTROL_FRAME: usize = 1 << 20;
/// Largest batch frame body accepted (compressed).
pub const MAX_BATCH_FRAME: usize = 16 << 20;
/// The highest seq either side accepts from the other (the edge's spool keys hold 56 bits):
/// below it, a peer's seq plus one never overflows.
pub const MAX_SEQ: u64 = (1 << 56) - 1;
/// Largest message (payload and topic) an edge may accept for the cloud: half a batch frame, so
/// a message zstd cannot shrink still fits one frame with the batch's own bytes around it.
pub const MAX_MESSAGE_BYTES: usize = MAX_BATCH_FRAME / 2;
/// Largest decompressed batch accepted: the output cap against decompression bombs.
pub const MAX_BATCH_RAW: usize = 64 << 20;
/// Most memory one batch may take at its receiver while it is decoded: the body, the
/// decompressed CBOR and the decoded records' bound ([`bound`]). Senders split batches that
/// would cost more ([`compress::pack`] refuses them); a bridge's per-connection memory budget is
/// at least this, so every batch a well-behaved edge sends fits.
pub const MAX_BATCH_COST: usize = 48 << 20;
/// Largest dictionary a bridge accepts.
pub const MAX_DICT_BYTES: usize = 256 << 10;
/// Most dictionaries one edge may name in a hello or announce on one connection: each costs
/// the bridge memory and shared storage.
pub(crate) const MAX_DICTS: usize = 64;

/// The highest version both sides speak.
pub fn negotiate(ours: &[u16], theirs: &[u16]) -> Option<u16> {
    ours.iter().filter(|v| theirs.contains(v)).max().copied()
}

/// Frames of the control stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Control {
    Hello(Hello),
    Welcome(Welcome),
    /// The cloud will not serve this edge; the connection closes after it.
    Refused {
        reason: String,
    },
    /// The cloud committed `lane` up to and including `up_to` (cumulative).
    Ack(Ack),
    Ping {
        nonce: u64,
    },
    Pong {
        nonce: u64,
    },
    /// A zstd dictionary, sent once before the first batch that uses it.
    Dict(DictAnnounce),
    /// The cloud holds dictionary `id` where any bridge finds it: batches may use it now.
    DictStored {
        id: String,
    },
    /// The edge's last committed seq per lane, sent with each ping, so the cloud can report
    /// how far behind each edge is. A bridge that does not know it ignores it.
    Heads {
        lanes: Vec<LaneSeq>,
        /// How the edge's spool fares, for the fleet view; optional (an older edge sends
        /// none, an older bridge skips it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spool: Option<SpoolReport>,
    },
    /// The edge's TCO model per class (its last decisions), for the fleet report. A bridge
    /// that does not know it ignores it.
    Classes(ClassesReport),
    /// A model version the edge follows (cloud to edge): right after the welcome the latest
    /// of each model named in the hello, then each new version as it is published. The edge
    /// trusts nothing in it before the signature checks against its fleet key.
    Model(ModelAnnounce),
    /// A message for a local topic (version 5, cloud to edge), in downlink order.
    Down(Box<down::Down>),
    /// Downlink messages done on the edge (version 5, edge to cloud), cumulative.
    DownAck(down::DownAck),
    /// The sink recorded the edge's downlink position and its refusals through `up_to`
    /// (version 5, cloud to edge): the edge may forget them.
    DownMarked {
        up_to: u64,
    },
    /// A frame of a newer version this build does not know; ignored.
    #[serde(other)]
    Unknown,
}

/// What an edge's spool says of itself with its heads (an optional field, added without a
/// version step).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpoolReport {
    /// Age of the oldest record the cloud has not acked, in ms; 0 when there is none.
    #[serde(default)]
    pub oldest_unacked_ms: u64,
    /// Records the spool dropped before the cloud had them (evicted, expired, refused), since
    /// the edge started.
    #[serde(default)]
    pub dropped: u64,
    /// Gap records written for them, since the edge started.
    #[serde(default)]
    pub gaps: u64,
}

/// A signed manifest (`shared::model::SignedManifest` bytes) with the name and version it
/// claims, for logs before it is verified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelAnnounce {
    pub name: String,
    pub version: String,
    #[serde(with = "serde_bytes")]
    pub manifest: Vec<u8>,
}

/// Model names a hello may follow, at most.
pub(crate) const MAX_MODELS: usize = 64;

/// The first frame of every bidirectional stream the edge opens after the control stream: what
/// it asks for. One request per stream, so each fetch fails or succeeds on its own and the edge
/// chooses how many run at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Fetch {
    /// A chunk of a manifest the cloud announced on this connection.
    Chunk { hash: String },
    #[serde(other)]
    Unknown,
}

/// The answer to [`Fetch::Chunk`]: the bytes, or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkReply {
    pub hash: String,
    #[serde(default, with = "serde_bytes", skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Largest fetch request accepted.
pub const MAX_FETCH_FRAME: usize = 1024;
/// Largest chunk reply accepted: the largest chunk and a little framing.
pub const MAX_CHUNK_FRAME: usize = crate::model::CHUNK_MAX as usize + 1024;

/// QUIC congestion controller, for either end's sending side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Congestion {
    #[default]
    Bbr,
    Cubic,
    NewReno,
}

#[cfg(feature = "quic")]
impl Congestion {
    pub fn factory(self) -> std::sync::Arc<dyn quinn::congestion::ControllerFactory + Send + Sync> {
        match self {
            Congestion::Bbr => std::sync::Arc::new(quinn::congestion::BbrConfig::default()),
            Congestion::Cubic => std::sync::Arc::new(quinn::congestion::CubicConfig::default()),
            Congestion::NewReno => std::sync::Arc::new(quinn::congestion::NewRenoConfig::default()),
        }
    }
}

/// Classes per report, at most: more is refused as a protocol error.
pub(crate) const MAX_REPORT_CLASSES: usize = 256;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassesReport {
    pub currency: String,
    pub classes: Vec<ClassReport>,
}

/// Longest class name a classes report may carry.
pub(crate) const MAX_REPORT_CLASS_NAME: usize = 256;

/// What is wrong with one class of an edge's report, if anything: the bridge keeps reports and
/// sums them for the fleet (`cloud-bridge tco report`, the console), so a class must name its
/// routes' costs and carry finite numbers, or one edge's report would break the fleet's.
pub(crate) fn report_problem(c: &ClassReport) -> Option<String> {
    let d = &c.decision;
    if d.class.is_empty() || d.class.len() > MAX_REPORT_CLASS_NAME {
        return Some(format!("a class name of {} bytes (1 ..= {MAX_REPORT_CLASS_NAME})", d.class.len()));
    }
    let numbers = [d.msg_per_s, d.gb_month, d.wire_gb_month, d.saving];
    let costs = d.costs.iter().flat_map(|r| [r.monthly, r.fixed, r.uplink, r.central, r.edge]);
    if numbers.into_iter().chain(costs).any(|v| !v.is_finite() || v < 0.0) {
        return Some(format!("class {:?}: a figure that is negative or not a number", d.class));
    }
    let priced = |r: crate::tco::Route| d.costs.iter().any(|c| c.route == r);
    if let Some(r) = [d.best, d.chosen, c.route].into_iter().flatten().find(|r| !priced(*r)) {
        return Some(format!("class {:?}: route {r:?} named but not priced", d.class));
    }
    None
}

/// One class as the edge's TCO model saw it last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassReport {
    #[serde(flatten)]
    pub decision: crate::tco::Decision,
    /// The route it has now; absent for classes the edge prices but does not route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<crate::tco::Route>,
    #[serde(default)]
    pub switches: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Hello {
    /// Versions the edge speaks.
    pub versions: Vec<u16>,
    /// The spool's epoch: seqs are only comparable within one epoch.
    pub epoch: String,
    /// Per lane, the lowest seq the edge still holds (the one after its last ack).
    #[serde(default)]
    pub lanes: Vec<LaneSeq>,
    /// Model names the edge follows.
    #[serde(default)]
    pub models: Vec<String>,
    /// Dictionary ids the edge may use.
    #[serde(default)]
    pub dicts: Vec<String>,
    /// Optional features the edge supports.
    #[serde(default)]
    pub caps: Vec<String>,
    /// The edge's downlink position (version 5): every message for it through this one is
    /// delivered or refused and durable on the edge. Absent (0) from older edges.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub down_mark: u64,
    /// How much of the downlink the edge holds unanswered (version 9; taken only on a session
    /// of that version, so an older bridge that skips it meets an edge that holds what every
    /// edge before it held).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_window: Option<down::EdgeWindow>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The version chosen.
    pub version: u16,
    /// Per lane, the highest seq of this edge and epoch the cloud has committed.
    #[serde(default)]
    pub committed: Vec<LaneSeq>,
    /// Dictionary ids the cloud already holds.
    #[serde(default)]
    pub dicts: Vec<String>,
    /// What the sink can store of one record (version 3), when it has limits of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<SinkLimits>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneSeq {
    pub lane: Lane,
    pub seq: Seq,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub lane: Lane,
    pub up_to: Seq,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DictAnnounce {
    pub id: String,
    pub class: String,
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

/// How a batch body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Codec {
    /// CBOR of the records.
    Cbor,
    /// zstd of the CBOR, with the dictionary named in the batch if any.
    Zstd,
    /// The records column-wise ([`columns`], version 6 on).
    Columns,
    /// zstd of the column-wise records, with the dictionary named in the batch if any.
    ZstdColumns,
}

impl Codec {
    pub(crate) fn compressed(self) -> bool {
        matches!(self, Codec::Zstd | Codec::ZstdColumns)
    }

    pub fn columns(self) -> bool {
        matches!(self, Codec::Columns | Codec::ZstdColumns)
    }
}

/// Records of one lane covering `first_seq ..= last_seq`, in seq order, the last one at
/// `last_seq`. Seqs may be missing only where the edge dropped records; its gap records
/// (later in the lane) account for them.
///
/// Small batches are most of the traffic at low rates, so what is implied is left out: an
/// empty `epoch` means the session's (from the hello), no `dict` means none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub epoch: String,
    pub lane: Lane,
    pub first_seq: Seq,
    pub last_seq: Seq,
    pub codec: Codec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dict: Option<String>,
    /// Length of the CBOR before compression.
    pub raw_len: u64,
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// Protocol errors, each naming what was wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    #[error("frame of {len} bytes is over the {max} byte limit")]
    FrameTooLarge { len: usize, max: usize },
    #[error("frame ends after {got} of {want} bytes")]
    Truncated { got: usize, want: usize },
    #[error("malformed CBOR frame: {0}")]
    Decode(String),
    #[error("cannot encode frame: {0}")]
    Encode(String),
    #[error("batch decompresses past the {max} byte limit")]
    TooLargeDecompressed { max: usize },
    #[error("frame would take {cost} bytes of memory to decode, over the {max} byte limit")]
    TooCostly { cost: usize, max: usize },
    #[error("batch body is not valid zstd: {0}")]
    Decompress(String),
    #[error("batch uses dictionary {0}, which was never announced")]
    UnknownDict(String),
    #[error("batch claims seqs {first}..={last} but holds {records} records ({detail})")]
    BatchMismatch { first: u64, last: u64, records: usize, detail: String },
}
