//! Message tracing: W3C trace context read from MQTT 5 user properties, and the spans both
//! binaries export over OTLP (HTTP, protobuf) for the messages that carry one.
//!
//! A trace starts at the publishing client: a PUBLISH with a `traceparent` user property whose
//! sampled flag is set is traced; the node never starts a trace of its own, so a message with
//! no context costs a scan of its user properties and nothing more. The context itself is part
//! of the message: it travels unchanged through the spool and the bridge into the sink's
//! headers (`traceparent`, `tracestate`), where consumers continue the trace. OpenTelemetry's
//! messaging conventions ask for exactly that: the creation context is not rewritten by
//! intermediaries, whose spans hang under it.
//!
//! The spans are built after the fact, with the times each stage measured, because a message
//! crosses tasks, threads and a process boundary and is handled in batches: a span object
//! carried along would cost every message. One link crosses the process boundary: the edge's
//! `uplink send` span of a record has an id derived from the record's place (trace id, spool
//! epoch, lane, seq: [`uplink_span_id`]), which the bridge knows too, so its `sink commit`
//! span is that span's child without a byte more on the wire.
//!
//! Bounds: what peers make is bounded twice. `max_traced_per_second` messages a second are
//! traced (the rest counted, `*_trace_messages_total{outcome="rate_limited"}`), and each later
//! kind of span is bounded by the same rate on its own (`admit`: counted as
//! `span_rate_limited`), the edge's only for messages its receive traced; and the export
//! queue holds `max_queue` spans (the SDK drops past it). The bridge cannot know which records
//! an edge traced: past the rate its `sink commit` spans may hang under `uplink send` spans
//! the edge did not make. Off by default: no `endpoint`, no
//! exporter thread, nothing read.
//!
//! Built without the `otlp` feature (the smallest gateways' edge-node), the exporter and its
//! HTTP stack are left out: the tracer is always off, and a config that names an `endpoint` is
//! refused at that key. Trace context still travels with every message.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

#[cfg(feature = "otlp")]
use opentelemetry::Context;
pub use opentelemetry::KeyValue;
use opentelemetry::trace::SpanKind;
#[cfg(feature = "otlp")]
use opentelemetry::trace::{
    Span as _, SpanBuilder, SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _,
    TracerProvider as _,
};
#[cfg(feature = "otlp")]
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, IdGenerator, RandomIdGenerator, SdkTracerProvider,
};
use serde::{Deserialize, Serialize};

use crate::units::HumanDuration;

#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
mod admit;

#[cfg(feature = "otlp")]
use admit::COUNT_BITS;
pub use admit::Stage;
use admit::{Admitted, Window};

/// The user property names of W3C Trace Context, as MQTT 5 carries them.
pub(crate) const TRACEPARENT: &str = "traceparent";
pub(crate) const TRACESTATE: &str = "tracestate";

/// A message's trace context, parsed from its `traceparent` (W3C Trace Context, level 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    /// The span the message's creator made it in.
    pub span_id: [u8; 8],
    pub sampled: bool,
    /// The vendor state beside it, when there was one.
    pub state: Option<String>,
}

impl TraceParent {
    /// Parses a `traceparent` value: `version-traceid-parentid-flags` in lowercase hex.
    /// Version `ff` and all-zero ids are invalid; a later version may append fields after a
    /// dash, which are ignored, as the recommendation asks of a level 1 reader.
    pub(crate) fn parse(value: &str) -> Option<Self> {
        let b = value.as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = hex_byte(&b[0..2])?;
        if version == 0xff || (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        for (i, out) in trace_id.iter_mut().enumerate() {
            *out = hex_byte(&b[3 + 2 * i..5 + 2 * i])?;
        }
        for (i, out) in span_id.iter_mut().enumerate() {
            *out = hex_byte(&b[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&b[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self { trace_id, span_id, sampled: flags & 1 == 1, state: None })
    }

    /// The context in `user` properties: the first `traceparent` that parses, with the first
    /// `tracestate`. Names compare exactly, as the W3C header's lowercase name.
    pub(crate) fn of_properties(user: &[(String, String)]) -> Option<Self> {
        let mut found = user.iter().filter(|(k, _)| k == TRACEPARENT).find_map(|(_, v)| Self::parse(v))?;
        found.state = user.iter().find(|(k, _)| k == TRACESTATE).map(|(_, v)| v.clone());
        Some(found)
    }

    /// The same trace, under another span of it.
    pub fn child(&self, span_id: [u8; 8]) -> Self {
        Self { span_id, ..self.clone() }
    }

    /// The `traceparent` value.
    #[cfg(test)]
    pub(crate) fn header(&self) -> String {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        format!("00-{}-{}-{:02x}", hex(&self.trace_id), hex(&self.span_id), u8::from(self.sampled))
    }

    #[cfg(feature = "otlp")]
    fn context(&self) -> Context {
        let state = self.state.as_deref().and_then(|s| s.parse::<TraceState>().ok()).unwrap_or_default();
        let flags = if self.sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
        let sc =
            SpanContext::new(TraceId::from_bytes(self.trace_id), SpanId::from_bytes(self.span_id), flags, true, state);
        Context::new().with_remote_span_context(sc)
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(two[0])? << 4 | digit(two[1])?)
}

/// The id of the edge's `uplink send` span of one record: a hash of the record's trace and
/// place, so the bridge, which knows the place too, can make its span that span's child.
pub fn uplink_span_id(trace_id: &[u8; 16], epoch: &str, lane: u8, seq: u64) -> [u8; 8] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"ehb uplink span\0");
    ctx.update(trace_id);
    ctx.update(epoch.as_bytes());
    ctx.update(&[0, lane]);
    ctx.update(&seq.to_be_bytes());
    let digest = ctx.finish();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest.as_ref()[..8]);
    // An all-zero span id is invalid; one in 2^64.
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

/// `[tracing]`: span export over OTLP.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP address: a base (`http://127.0.0.1:4318`, to which
    /// `/v1/traces` is added) or the full traces URL. None (the default): tracing is off.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The share of sampled traces to export, decided on the trace id so the edge and the
    /// bridge decide alike. Default 1.
    #[serde(default = "default_ratio")]
    pub sample_ratio: f64,
    /// Messages traced a second at most; the rest pass untraced and are counted. Default 1000.
    #[serde(default = "default_rate")]
    pub max_traced_per_second: u64,
    /// Spans waiting for export at most; past it the newest are dropped. Default 4096.
    #[serde(default = "default_queue")]
    pub max_queue: usize,
    /// How long one export may take. Default 10s.
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    /// `service.name` of the spans; default the binary's name.
    #[serde(default)]
    pub service_name: Option<String>,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            sample_ratio: default_ratio(),
            max_traced_per_second: default_rate(),
            max_queue: default_queue(),
            timeout: default_timeout(),
            service_name: None,
        }
    }
}

fn default_ratio() -> f64 {
    1.0
}
fn default_rate() -> u64 {
    1000
}
fn default_queue() -> usize {
    4096
}
fn default_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

impl TracingConfig {
    /// What is wrong with the section, each at its key.
    pub fn check(&self, p: &mut crate::check::Problems) {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            p.bad("tracing.sample_ratio", format!("{} is outside [0, 1]", self.sample_ratio));
        }
        if self.max_queue == 0 {
            p.bad("tracing.max_queue", "must be at least 1");
        }
        if self.timeout.0.is_zero() {
            p.bad("tracing.timeout", "must be more than 0");
        }
        if let Some(e) = &self.endpoint
            && let Err(why) = traces_url(e)
        {
            p.bad("tracing.endpoint", why);
        }
        if self.endpoint.is_some() && !cfg!(feature = "otlp") {
            p.bad("tracing.endpoint", NO_EXPORTER);
        }
    }
}

/// Why a build without the `otlp` feature takes no `endpoint`.
const NO_EXPORTER: &str = "this edge-node was built without the OTLP exporter (cargo feature `otlp`); \
    remove the endpoint, or use a build with it";

/// The traces URL of an endpoint: `/v1/traces` added to a bare base.
fn traces_url(endpoint: &str) -> Result<String, String> {
    let Some(rest) = endpoint.strip_prefix("http://").or_else(|| endpoint.strip_prefix("https://")) else {
        return Err(format!("{endpoint:?} is not an http:// or https:// URL"));
    };
    if endpoint.starts_with("https://") {
        // The exporter is built without a TLS stack: a collector agent beside the node, or
        // one reached through a local proxy, takes plain HTTP.
        return Err(format!("{endpoint:?}: https is not supported; export to a local collector over http"));
    }
    match rest.find('/') {
        None => Ok(format!("{endpoint}/v1/traces")),
        Some(at) if at + 1 == rest.len() => Ok(format!("{endpoint}v1/traces")),
        Some(_) => Ok(endpoint.to_owned()),
    }
}

/// Span ids handed to the SDK: the one set for the next span on this thread, else random.
/// The SDK's span builder takes no id, and the `uplink send` span needs its derived one.
#[cfg(feature = "otlp")]
#[derive(Debug, Default)]
struct Ids(RandomIdGenerator);

#[cfg(feature = "otlp")]
thread_local! {
    static NEXT_SPAN_ID: std::cell::Cell<Option<[u8; 8]>> = const { std::cell::Cell::new(None) };
}

#[cfg(feature = "otlp")]
impl IdGenerator for Ids {
    fn new_trace_id(&self) -> TraceId {
        self.0.new_trace_id()
    }
    fn new_span_id(&self) -> SpanId {
        NEXT_SPAN_ID.with(std::cell::Cell::take).map_or_else(|| self.0.new_span_id(), SpanId::from_bytes)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

crate::metrics! {
    /// Counts of what tracing did, registered in each binary's metrics (`TraceCounts::register`):
    /// `trace_messages_total{outcome}` (`traced`, `rate_limited`, `span_rate_limited`, each
    /// shown from the start) and `trace_spans_total`.
    #[derive(Debug)]
    pub struct TraceCounts {
        messages: Family<OutcomeLabel, Counter> => (
            "trace_messages",
            "Messages with a sampled trace context: traced, or passed untraced past tracing.max_traced_per_second (rate_limited at the receive, span_rate_limited at a later stage)",
            init {
                let f: Family<OutcomeLabel, Counter> = Family::default();
                for outcome in ["traced", "rate_limited", "span_rate_limited"] {
                    drop(f.get_or_create(&OutcomeLabel { outcome }));
                }
                f
            }
        ),
        spans: Counter => ("trace_spans", "Spans handed to the OTLP exporter"),
    }
}

impl TraceCounts {
    fn count(&self, outcome: &'static str) {
        self.messages.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Messages counted with `outcome` so far.
    pub fn messages(&self, outcome: &'static str) -> u64 {
        self.messages.get_or_create(&OutcomeLabel { outcome }).get()
    }
}

/// Where spans go; cheap to clone. [`Tracer::off`] does nothing and reads nothing.
#[derive(Debug, Clone, Default)]
pub struct Tracer {
    inner: Option<Arc<Inner>>,
    counts: Arc<TraceCounts>,
}

/// Made only by the exporter: without it (no `otlp` feature) a tracer is always off.
#[derive(Debug)]
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
struct Inner {
    #[cfg(feature = "otlp")]
    provider: SdkTracerProvider,
    #[cfg(feature = "otlp")]
    tracer: opentelemetry_sdk::trace::Tracer,
    /// Sampled trace ids whose low 63 bits are under this are exported.
    ratio_bound: u64,
    max_per_second: u64,
    /// Messages traced this second at their receive.
    window: Window,
    /// Spans made this second of each [`Stage`].
    stages: [Window; 3],
    /// The contexts the receive admitted lately.
    admitted: Admitted,
}

/// One span to export, with the times its stage measured.
#[derive(Debug)]
pub struct SpanRecord<'a> {
    pub name: &'static str,
    pub kind: SpanKind,
    /// The span it hangs under.
    pub parent: &'a TraceParent,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<KeyValue>,
    /// Its id, when it must be a known one ([`uplink_span_id`]).
    pub id: Option<[u8; 8]>,
}

pub use opentelemetry::trace::SpanKind as Kind;

impl Tracer {
    /// A tracer that traces nothing.
    pub fn off() -> Self {
        Self::default()
    }

    /// Starts exporting to `config.endpoint` (off without one), as `service` at `version`.
    /// Must be called within a Tokio runtime or not: the exporter runs on a thread of its own.
    pub fn start(
        config: &TracingConfig,
        service: &str,
        version: &str,
        counts: Arc<TraceCounts>,
    ) -> Result<Self, String> {
        let Some(endpoint) = &config.endpoint else { return Ok(Self { inner: None, counts }) };
        let url = traces_url(endpoint)?;
        #[cfg(not(feature = "otlp"))]
        {
            let _ = (url, service, version);
            Err(format!("tracing.endpoint: {NO_EXPORTER}"))
        }
        #[cfg(feature = "otlp")]
        Self::export(config, url, service, version, counts)
    }

    #[cfg(feature = "otlp")]
    fn export(
        config: &TracingConfig,
        url: String,
        service: &str,
        version: &str,
        counts: Arc<TraceCounts>,
    ) -> Result<Self, String> {
        use opentelemetry_otlp::WithExportConfig;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url)
            .with_timeout(config.timeout.0)
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build()
            .map_err(|e| format!("tracing exporter: {e}"))?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(config.max_queue)
            .with_max_export_batch_size(config.max_queue.clamp(1, 512))
            .with_scheduled_delay(Duration::from_millis(500))
            .build();
        let name = config.service_name.clone().unwrap_or_else(|| service.to_owned());
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(name)
            .with_attribute(KeyValue::new("service.version", version.to_owned()))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).with_batch_config(batch).build())
            .with_id_generator(Ids::default())
            .with_resource(resource)
            .build();
        let tracer = provider.tracer(service.to_owned());
        let ratio_bound = (config.sample_ratio.clamp(0.0, 1.0) * (1u64 << 63) as f64) as u64;
        let max_per_second = config.max_traced_per_second.min((1 << COUNT_BITS) - 1);
        let inner = Inner {
            provider,
            tracer,
            ratio_bound,
            max_per_second,
            window: Window::default(),
            stages: Default::default(),
            admitted: Admitted::new(max_per_second),
        };
        Ok(Self { inner: Some(Arc::new(inner)), counts })
    }

    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    pub fn counts(&self) -> &TraceCounts {
        &self.counts
    }

    /// The context of a message with `user` properties if it is to be traced: tracing is on,
    /// the message carries a sampled context, the ratio takes its trace, and the rate has room.
    pub fn message(&self, user: &[(String, String)]) -> Option<TraceParent> {
        let (inner, parent) = self.sampled(user)?;
        if !inner.window.admit(inner.max_per_second) {
            self.counts.count("rate_limited");
            return None;
        }
        inner.admitted.insert(admit::key(&parent.trace_id, &parent.span_id));
        self.counts.count("traced");
        Some(parent)
    }

    /// The context of a message this process's receive traced ([`Tracer::message`]), for a
    /// later `stage`'s span, while that stage has room this second.
    pub fn admitted(&self, stage: Stage, user: &[(String, String)]) -> Option<TraceParent> {
        let (inner, parent) = self.sampled(user)?;
        if !inner.admitted.contains(&admit::key(&parent.trace_id, &parent.span_id)) {
            return None;
        }
        self.stage_room(inner, stage).then_some(parent)
    }

    /// The context of a record another process traced (the bridge's view of an edge's record,
    /// whose admission it cannot know), for `stage`'s span, while that stage has room this
    /// second: the same ratio, so the edge and the bridge choose alike under the rate.
    pub fn continued(&self, stage: Stage, user: &[(String, String)]) -> Option<TraceParent> {
        let (inner, parent) = self.sampled(user)?;
        self.stage_room(inner, stage).then_some(parent)
    }

    fn stage_room(&self, inner: &Inner, stage: Stage) -> bool {
        let room = inner.stages[stage as usize].admit(inner.max_per_second);
        if !room {
            self.counts.count("span_rate_limited");
        }
        room
    }

    /// Tracing is on, `user` carries a sampled context, and the ratio takes its trace.
    fn sampled(&self, user: &[(String, String)]) -> Option<(&Inner, TraceParent)> {
        let inner = self.inner.as_deref()?;
        let parent = TraceParent::of_properties(user).filter(|p| p.sampled)?;
        let low = u64::from_be_bytes(parent.trace_id[8..].try_into().expect("8 bytes")) >> 1;
        (low < inner.ratio_bound || inner.ratio_bound >= (1 << 63)).then_some((inner, parent))
    }

    /// A new random span id, for a span whose children are recorded before it.
    #[cfg(feature = "otlp")]
    pub fn new_span_id(&self) -> [u8; 8] {
        Ids::default().0.new_span_id().to_bytes()
    }

    /// A new span id: without the exporter no span is recorded, so any id not zero does.
    #[cfg(not(feature = "otlp"))]
    pub fn new_span_id(&self) -> [u8; 8] {
        [1; 8]
    }

    /// Exports one span; returns its id.
    #[cfg(not(feature = "otlp"))]
    pub fn record(&self, _span: SpanRecord<'_>) -> Option<[u8; 8]> {
        None
    }

    /// Exports one span; returns its id.
    #[cfg(feature = "otlp")]
    pub fn record(&self, span: SpanRecord<'_>) -> Option<[u8; 8]> {
        let inner = self.inner.as_ref()?;
        let builder = SpanBuilder::from_name(span.name)
            .with_kind(span.kind)
            .with_start_time(span.start)
            .with_attributes(span.attributes);
        NEXT_SPAN_ID.with(|c| c.set(span.id));
        let mut s = inner.tracer.build_with_context(builder, &span.parent.context());
        // Taken by the SDK unless it made no span (shut down): never left for the next one.
        NEXT_SPAN_ID.with(std::cell::Cell::take);
        let id = s.span_context().span_id().to_bytes();
        s.end_with_timestamp(span.end.max(span.start));
        self.counts.spans.inc();
        Some(id)
    }

    /// Exports what is queued and stops the exporter.
    pub fn shutdown(&self) {
        #[cfg(feature = "otlp")]
        if let Some(inner) = &self.inner {
            let _ = inner.provider.force_flush();
            let _ = inner.provider.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_parses_as_the_w3c_recommendation_says() {
        let p = TraceParent::parse(VALID).expect("valid");
        assert_eq!(p.trace_id[0], 0x4b);
        assert_eq!(p.span_id[7], 0xb7);
        assert!(p.sampled);
        assert_eq!(p.header(), VALID);
        assert!(!TraceParent::parse(&VALID.replace("-01", "-00")).unwrap().sampled);
        // Uppercase hex, version ff, all-zero ids, a version 00 with more fields, short input.
        for bad in [
            VALID.to_uppercase().as_str(),
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
        // A later version may carry more, after a dash.
        assert!(TraceParent::parse(&format!("{}-more", VALID.replacen("00", "01", 1))).is_some());
    }

    #[test]
    fn the_context_is_read_from_user_properties_with_its_state() {
        let user = vec![
            ("tracestate".to_owned(), "vendor=1".to_owned()),
            ("traceparent".to_owned(), "garbage".to_owned()),
            ("traceparent".to_owned(), VALID.to_owned()),
        ];
        let p = TraceParent::of_properties(&user).expect("the valid one");
        assert_eq!(p.state.as_deref(), Some("vendor=1"));
        assert_eq!(TraceParent::of_properties(&user[..2]), None);
    }

    #[test]
    fn uplink_span_ids_differ_by_place_and_agree_on_both_ends() {
        let t = TraceParent::parse(VALID).unwrap().trace_id;
        let a = uplink_span_id(&t, "e1", 0, 7);
        assert_eq!(a, uplink_span_id(&t, "e1", 0, 7));
        assert_ne!(a, uplink_span_id(&t, "e1", 0, 8));
        assert_ne!(a, uplink_span_id(&t, "e1", 1, 7));
        assert_ne!(a, uplink_span_id(&t, "e2", 0, 7));
    }

    #[test]
    fn endpoints_get_the_traces_path_and_bad_ones_are_named() {
        assert_eq!(traces_url("http://c:4318").unwrap(), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/").unwrap(), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c/otlp/v1/traces").unwrap(), "http://c/otlp/v1/traces");
        assert!(traces_url("c:4318").unwrap_err().contains("not an http"));
        assert!(traces_url("https://c").unwrap_err().contains("https is not supported"));
        let bad = TracingConfig { sample_ratio: 2.0, max_queue: 0, ..Default::default() };
        let mut p = crate::check::Problems::default();
        bad.check(&mut p);
        let keys: Vec<_> = p.into_vec().into_iter().map(|p| p.key).collect();
        assert_eq!(keys, ["tracing.sample_ratio", "tracing.max_queue"]);
    }

    /// The smallest gateways' build: an `endpoint` is refused at its key, by the check and by
    /// a start, and a message's context still parses (it travels with the message).
    #[cfg(not(feature = "otlp"))]
    #[test]
    fn without_the_exporter_an_endpoint_is_refused_and_the_context_still_parses() {
        let config = TracingConfig { endpoint: Some("http://127.0.0.1:4318".into()), ..Default::default() };
        let mut p = crate::check::Problems::default();
        config.check(&mut p);
        let problems = p.into_vec();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].key, "tracing.endpoint");
        assert!(problems[0].reason.contains("without the OTLP exporter"), "{}", problems[0].reason);
        let err = Tracer::start(&config, "test", "0", Arc::default()).unwrap_err();
        assert!(err.contains("tracing.endpoint") && err.contains("`otlp`"), "{err}");
        let off = Tracer::start(&TracingConfig::default(), "test", "0", Arc::default()).unwrap();
        assert!(!off.is_on());
        let user = vec![("traceparent".to_owned(), VALID.to_owned())];
        assert_eq!(off.message(&user), None);
        assert!(TraceParent::of_properties(&user).is_some_and(|p| p.sampled));
    }

    #[cfg(feature = "otlp")]
    #[test]
    fn off_traces_nothing_and_the_rate_bounds_what_is_traced() {
        let user = vec![("traceparent".to_owned(), VALID.to_owned())];
        assert_eq!(Tracer::off().message(&user), None);
        let config = TracingConfig {
            endpoint: Some("http://127.0.0.1:9".into()),
            max_traced_per_second: 3,
            ..Default::default()
        };
        let t = Tracer::start(&config, "test", "0", Arc::default()).expect("starts");
        let traced = (0..10).filter(|_| t.message(&user).is_some()).count();
        // Three a second; a second boundary during the loop may admit three more.
        assert!((3..=6).contains(&traced), "{traced}");
        assert_eq!(t.counts().messages("rate_limited"), 10 - traced as u64);
        let unsampled = vec![("traceparent".to_owned(), VALID.replace("-01", "-00"))];
        assert_eq!(t.message(&unsampled), None);
        let none = Tracer::start(&TracingConfig { sample_ratio: 0.0, ..config }, "test", "0", Arc::default()).unwrap();
        assert_eq!(none.message(&user), None);
        t.shutdown();
        none.shutdown();
    }
}
