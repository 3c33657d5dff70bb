//! The TCO model at work on the edge: `[tco]` in the config (prices, per-class SLA, pins and
//! declared traffic), live routing that feeds the model the classes' measured traffic and the
//! uplink's RTT and compression on a schedule and moves routes with hysteresis, and the
//! report (`edge-node tco report`, `/tco`).

pub mod report;

use shared::check::Problems;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use shared::tco::{ClassInput, Governance, Hysteresis, Link, Prices, Route, architecture_totals, evaluate};
use shared::units::HumanDuration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::labels::handle;
use crate::route::Classes;

/// `[tco]`: prices, the schedule and per-class figures.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TcoConfig {
    pub prices: Prices,
    /// Move routes at run time by the model. Off: the model only reports. Default: on.
    #[serde(default = "yes")]
    pub live: bool,
    /// How often the model runs; traffic rates are measured over this span. Default: 1min.
    #[serde(default = "default_interval")]
    pub interval: HumanDuration,
    /// How long the model must want a route before a class moves. Default: 15min.
    #[serde(default = "default_hold")]
    pub hold: HumanDuration,
    /// Smallest saving, as a share of the current route's cost, worth a move. Default: 0.1.
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// The link to the central cluster until the uplink has measured it.
    #[serde(default)]
    pub link: LinkConfig,
    /// Per class: SLA, pin, declared traffic. Classes not in `[[class]]` (for example model
    /// parameter sync, which the edge does not route) are priced for the report only.
    #[serde(default, rename = "class")]
    pub classes: BTreeMap<String, TcoClass>,
}

fn yes() -> bool {
    true
}
fn default_interval() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}
fn default_hold() -> HumanDuration {
    HumanDuration(Duration::from_secs(15 * 60))
}
fn default_threshold() -> f64 {
    0.1
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    #[serde(default)]
    pub rtt_ms: f64,
    #[serde(default)]
    pub commit_ms: f64,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TcoClass {
    /// Latency its consumers need, ms.
    pub sla_ms: Option<f64>,
    /// The operator's route: the model reports, never overrides.
    pub pin: Option<Route>,
    /// Only for classes not in `[[class]]`; those take theirs from there.
    pub governance: Option<Governance>,
    /// Declared traffic, used until measured (and always for report-only classes).
    pub msg_per_s: Option<f64>,
    pub bytes_per_msg: Option<f64>,
    /// Wire bytes per byte; default: what the uplink measured, else 1.
    pub compression: Option<f64>,
}

impl TcoConfig {
    /// Semantic problems, each at its key. `routed` is the governance of a class the edge
    /// routes (a `[[class]]`), by name: the check across the two sections is `config`'s to
    /// make, with what it reads from both.
    pub fn check(&self, routed: &dyn Fn(&str) -> Option<Governance>, out: &mut Problems) {
        let p = &self.prices;
        if p.months.is_nan() || p.months <= 0.0 {
            out.bad("tco.prices.months", format!("{} must be more than 0", p.months));
        }
        let prices = [
            ("uplink_per_gb", p.uplink_per_gb),
            ("central_ingest_per_gb", p.central_ingest_per_gb),
            ("central_storage_per_gb_month", p.central_storage_per_gb_month),
            ("retention_months", p.retention_months),
            ("edge_per_gb", p.edge_per_gb),
            ("fte_month", p.fte_month),
            ("edge_direct.hardware", p.edge_direct.hardware),
            ("edge_direct.fte", p.edge_direct.fte),
            ("central.hardware", p.central.hardware),
            ("central.fte", p.central.fte),
        ];
        for (key, v) in prices {
            if !v.is_finite() || v < 0.0 {
                out.bad(format!("tco.prices.{key}"), format!("{v} must be a number of at least 0"));
            }
        }
        if !(0.0..1.0).contains(&self.threshold) {
            out.bad("tco.threshold", format!("{} must be at least 0 and below 1", self.threshold));
        }
        if self.interval.0.is_zero() {
            out.bad("tco.interval", "must be more than 0s");
        }
        for (name, c) in &self.classes {
            let key = |k: &str| format!("tco.class.{name}.{k}");
            let governance = match (routed(name), c.governance) {
                (Some(_), Some(_)) => {
                    out.bad(key("governance"), "set in [[class]] for classes the edge routes");
                    continue;
                }
                (Some(g), None) => g,
                (None, g) => {
                    if c.msg_per_s.is_none() || c.bytes_per_msg.is_none() {
                        out.bad(key("msg_per_s"), "a class not in [[class]] needs msg_per_s and bytes_per_msg");
                    }
                    g.unwrap_or_default()
                }
            };
            if let Some(pin) = c.pin
                && !governance.allows(pin)
            {
                out.bad(key("pin"), format!("governance {} does not allow {pin}", governance.as_str()));
            }
            for (k, v) in [("sla_ms", c.sla_ms), ("msg_per_s", c.msg_per_s), ("bytes_per_msg", c.bytes_per_msg)] {
                if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                    out.bad(key(k), "must be a number of at least 0");
                }
            }
            if c.compression.is_some_and(|v| !v.is_finite() || v <= 0.0) {
                out.bad(key("compression"), "must be more than 0");
            }
        }
    }
}

/// Measured traffic of one class over the last interval.
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    pub msg_per_s: f64,
    pub bytes_per_msg: f64,
}

/// The model's inputs for every class: the routed classes in config order, then report-only
/// classes. A class's measured traffic wins over its declared traffic once it has any; its
/// compression is the declared one, else its own as the uplink measured it
/// (`compression(Some(class))`: bytes sent per byte of its messages, in the encoding its
/// batches went in), else all classes' (`compression(None)`: the edge-direct classes never went
/// up), else 1.
pub fn inputs(
    tco: &TcoConfig,
    classes: &Classes,
    measured: &BTreeMap<String, Measured>,
    compression: &dyn Fn(Option<&str>) -> Option<f64>,
) -> Vec<ClassInput> {
    let declared = |name: &str| tco.classes.get(name).cloned().unwrap_or_default();
    let mut out: Vec<ClassInput> = classes
        .iter()
        .map(|c| {
            let d = declared(&c.name);
            let m = measured.get(&c.name).filter(|m| m.msg_per_s > 0.0);
            ClassInput {
                name: c.name.clone(),
                msg_per_s: m.map_or(d.msg_per_s.unwrap_or(0.0), |m| m.msg_per_s),
                bytes_per_msg: m.map_or(d.bytes_per_msg.unwrap_or(0.0), |m| m.bytes_per_msg),
                compression: d
                    .compression
                    .or_else(|| compression(Some(&c.name)))
                    .or_else(|| compression(None))
                    .unwrap_or(1.0),
                sla_ms: d.sla_ms,
                governance: c.governance,
                pinned: d.pin,
            }
        })
        .collect();
    for (name, d) in &tco.classes {
        if classes.iter().any(|c| &c.name == name) {
            continue;
        }
        out.push(ClassInput {
            name: name.clone(),
            msg_per_s: d.msg_per_s.unwrap_or(0.0),
            bytes_per_msg: d.bytes_per_msg.unwrap_or(0.0),
            compression: d.compression.or_else(|| compression(None)).unwrap_or(1.0),
            sla_ms: d.sla_ms,
            governance: d.governance.unwrap_or_default(),
            pinned: d.pin,
        });
    }
    out
}

/// What the model said last, and about what: served on `/tco` and by `tco report`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Snapshot {
    pub currency: String,
    pub months: f64,
    pub link: Option<Link>,
    pub classes: Vec<ClassReport>,
    pub architectures: Vec<shared::tco::ArchitectureTotal>,
}

pub use shared::proto::ClassReport;

/// Prices `inputs` and puts the result in a snapshot; `routes` are the classes' current routes.
pub fn snapshot(
    tco: &TcoConfig,
    link: Link,
    inputs: &[ClassInput],
    routes: &BTreeMap<String, (Route, u64)>,
) -> Snapshot {
    let decisions = evaluate(&tco.prices, &link, inputs);
    Snapshot {
        currency: tco.prices.currency.clone(),
        months: tco.prices.months,
        link: Some(link),
        classes: decisions
            .into_iter()
            .map(|decision| {
                let (route, switches) = routes.get(&decision.class).map_or((None, 0), |(r, n)| (Some(*r), *n));
                ClassReport { decision, route, switches }
            })
            .collect(),
        architectures: architecture_totals(&tco.prices),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClassRouteLabels {
    pub class: String,
    pub route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClassOnly {
    pub class: String,
}

shared::metrics! {
    /// `edge_tco_*` metrics.
    #[derive(Debug, Clone)]
    pub(crate) struct TcoMetrics {
        /// 1 for the route a class has, 0 for the others.
        pub route: Family<ClassRouteLabels, Gauge> => ("tco_route", "Route each topic class has (1) and has not (0)"),
        /// Monthly cost of each route per class, in the config's currency, rounded.
        pub monthly_cost: Family<ClassRouteLabels, Gauge> => (
            "tco_monthly_cost",
            "Monthly cost of each route per class, by the TCO model"
        ),
        pub switches: Family<ClassOnly, Counter> => ("tco_route_switches", "Route changes the TCO model made, by class"),
    }
}

impl TcoMetrics {
    /// The TCO model's metrics, registered in `r`.
    pub(crate) fn new(r: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self::default();
        m.register(r);
        m
    }
}

/// What the uplink measured of the link, for the model: RTT, commit latency and compression so
/// far. The uplink writes it, [`run`] reads it; `lib.rs` hands both the same one.
#[derive(Debug, Default)]
pub(crate) struct LinkFigures {
    rtt_micros: AtomicU64,
    commit_micros: AtomicU64,
    /// Whether a session is up, and since when it is up or down (ms since the Unix epoch; 0:
    /// never connected), for readiness (`health`).
    up: std::sync::atomic::AtomicBool,
    since_ms: AtomicU64,
    /// Per class: its messages' bytes as the classes count them (topic, payload and 2) and
    /// the batch body bytes they took on the wire, their share of each batch's.
    classes: Mutex<BTreeMap<String, (u64, u64)>>,
}

impl LinkFigures {
    /// A session came up (`true`) or ended.
    pub(crate) fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
        self.since_ms.store(shared::units::now_ms(), Ordering::Relaxed);
    }

    /// Whether a session is up, and since when (ms since the Unix epoch; `None`: never was).
    pub(crate) fn up(&self) -> (bool, Option<u64>) {
        let since = self.since_ms.load(Ordering::Relaxed);
        (self.up.load(Ordering::Relaxed), (since > 0).then_some(since))
    }

    pub(crate) fn rtt(&self, rtt: Duration) {
        self.rtt_micros.store(rtt.as_micros() as u64, Ordering::Relaxed);
    }

    pub(crate) fn committed(&self, latency: Duration) {
        self.commit_micros.store(latency.as_micros() as u64, Ordering::Relaxed);
    }

    /// A batch body of `sent` bytes carried `classes`' messages, each class's bytes as
    /// [`crate::route`] counts a publish: each class is charged its share of `sent`.
    pub(crate) fn sent(&self, classes: &[(String, u64)], sent: u64) {
        let total: u64 = classes.iter().map(|(_, b)| *b).sum();
        if total == 0 {
            return;
        }
        if let Ok(mut figures) = self.classes.lock() {
            for (class, bytes) in classes {
                let share = (u128::from(sent) * u128::from(*bytes) / u128::from(total)) as u64;
                // Looked up before inserting: a class name is cloned once, not once a batch.
                match figures.get_mut(class) {
                    Some((m, s)) => {
                        *m += bytes;
                        *s += share;
                    }
                    None => {
                        figures.insert(class.clone(), (*bytes, share));
                    }
                }
            }
        }
    }

    /// The link as measured, once a ping has come back.
    pub(crate) fn link(&self) -> Option<Link> {
        let (rtt, commit) = (self.rtt_micros.load(Ordering::Relaxed), self.commit_micros.load(Ordering::Relaxed));
        (rtt > 0).then(|| Link { rtt_ms: rtt as f64 / 1000.0, commit_ms: commit as f64 / 1000.0 })
    }

    /// Batch bytes sent per message byte so far, of `class` or of all classes.
    pub(crate) fn compression(&self, class: Option<&str>) -> Option<f64> {
        let figures = self.classes.lock().ok()?;
        let (raw, sent) = match class {
            Some(class) => figures.get(class).copied().unwrap_or_default(),
            None => figures.values().fold((0, 0), |(r, s), (lr, ls)| (r + lr, s + ls)),
        };
        (raw > 0).then(|| sent as f64 / raw as f64)
    }
}

/// Runs the model every `interval` on the classes' measured traffic and moves routes; each
/// answer goes to `latest` (the uplink reports it to the bridge, `/tco` serves it).
pub(crate) async fn run(
    tco: TcoConfig,
    classes: Arc<Classes>,
    link: Arc<LinkFigures>,
    metrics: TcoMetrics,
    latest: watch::Sender<Snapshot>,
    shutdown: CancellationToken,
) {
    let started = Instant::now();
    let mut holds: BTreeMap<String, Hysteresis> =
        classes.iter().map(|c| (c.name.clone(), Hysteresis::new(c.route(), tco.threshold, tco.hold.0))).collect();
    let mut switches: BTreeMap<String, u64> = BTreeMap::new();
    let mut last: BTreeMap<String, (u64, u64)> = classes.iter().map(|c| (c.name.clone(), c.traffic())).collect();
    let mut last_at = Instant::now();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + tco.interval.0, tco.interval.0);
    publish(&tco, &classes, &link, &BTreeMap::new(), &switches, &metrics, &latest);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let now = Instant::now();
        let span = now.duration_since(last_at).as_secs_f64().max(1e-3);
        last_at = now;
        let mut measured = BTreeMap::new();
        for c in classes.iter() {
            let (messages, bytes) = c.traffic();
            let (m0, b0) = last.insert(c.name.clone(), (messages, bytes)).unwrap_or((0, 0));
            let (dm, db) = (messages.saturating_sub(m0), bytes.saturating_sub(b0));
            let bytes_per_msg = if dm > 0 { db as f64 / dm as f64 } else { 0.0 };
            measured.insert(c.name.clone(), Measured { msg_per_s: dm as f64 / span, bytes_per_msg });
        }
        let snap = publish(&tco, &classes, &link, &measured, &switches, &metrics, &latest);
        if !tco.live {
            continue;
        }
        for report in &snap.classes {
            let (Some(class), Some(hold)) =
                (classes.iter().find(|c| c.name == report.decision.class), holds.get_mut(&report.decision.class))
            else {
                continue;
            };
            let Some(to) = hold.update(started.elapsed(), &report.decision) else { continue };
            let from = class.route();
            match class.set_route(to) {
                Ok(()) => {
                    *switches.entry(class.name.clone()).or_default() += 1;
                    handle(&metrics.switches, &ClassOnly { class: class.name.clone() }).inc();
                    tracing::info!(class = class.name, %from, %to, reason = report.decision.reason, "TCO route change");
                }
                Err(e) => tracing::warn!(error = e, "TCO route change refused"),
            }
        }
        publish(&tco, &classes, &link, &measured, &switches, &metrics, &latest);
    }
}

fn publish(
    tco: &TcoConfig,
    classes: &Classes,
    link: &LinkFigures,
    measured: &BTreeMap<String, Measured>,
    switches: &BTreeMap<String, u64>,
    metrics: &TcoMetrics,
    latest: &watch::Sender<Snapshot>,
) -> Snapshot {
    let measured_link = link.link().unwrap_or(Link { rtt_ms: tco.link.rtt_ms, commit_ms: tco.link.commit_ms });
    let inputs = inputs(tco, classes, measured, &|class| link.compression(class));
    let routes: BTreeMap<String, (Route, u64)> =
        classes.iter().map(|c| (c.name.clone(), (c.route(), switches.get(&c.name).copied().unwrap_or(0)))).collect();
    let snap = snapshot(tco, measured_link, &inputs, &routes);
    for report in &snap.classes {
        let class = report.decision.class.clone();
        for cost in &report.decision.costs {
            let labels = ClassRouteLabels { class: class.clone(), route: cost.route.as_str() };
            handle(&metrics.monthly_cost, &labels).set(cost.monthly.round() as i64);
            if let Some(route) = report.route {
                handle(&metrics.route, &labels).set(i64::from(route == cost.route));
            }
        }
    }
    latest.send_replace(snap.clone());
    snap
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::ClassConfig;

    /// The two sections the model reads, without the rest of a node's config.
    #[derive(Deserialize)]
    struct Sections {
        #[serde(rename = "class")]
        classes: Vec<ClassConfig>,
        tco: TcoConfig,
    }

    #[test]
    fn measured_traffic_and_class_compression_win_over_defaults() {
        let config: Sections = toml::from_str(
            r#"
[[class]]
name = "a"
filters = ["a/#"]
route = "central"
priority = 3
[[class]]
name = "b"
filters = ["b/#"]
route = "central"
priority = 4
[tco.prices]
months = 36
uplink_per_gb = 1
fte_month = 1
[tco.prices.edge_direct]
hardware = 1
fte = 0
[tco.prices.central]
hardware = 1
fte = 0
[tco.class.a]
msg_per_s = 5
bytes_per_msg = 10
[tco.class.b]
compression = 0.9
[tco.class.sync]
governance = "central-only"
msg_per_s = 1
bytes_per_msg = 1
"#,
        )
        .unwrap();
        let (tco, classes) = (config.tco.clone(), Classes::from_config(&config.classes));
        let routed = |n: &str| config.classes.iter().find(|c| c.name == n).map(|c| c.governance);
        let mut p = Problems::default();
        tco.check(&routed, &mut p);
        assert!(p.is_empty(), "{p:?}");
        // As the uplink measures them: class a's 4000 message bytes took 1000 body bytes, b's
        // none yet; all classes together 0.25 of theirs.
        let link = LinkFigures::default();
        link.sent(&[("a".into(), 3000)], 750);
        link.sent(&[("a".into(), 1000), ("other".into(), 1000)], 500);
        assert_eq!(link.compression(Some("a")), Some(0.25));
        assert_eq!(link.compression(Some("b")), None);
        let declared = inputs(&tco, &classes, &BTreeMap::new(), &|c| link.compression(c));
        assert_eq!(declared.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["a", "b", "sync"]);
        assert_eq!((declared[0].msg_per_s, declared[0].compression), (5.0, 0.25), "declared rate, a's measured ratio");
        assert_eq!(declared[1].compression, 0.9, "declared compression wins");
        assert_eq!((declared[2].compression, declared[2].governance), (0.25, Governance::CentralOnly));
        let measured = BTreeMap::from([("a".to_owned(), Measured { msg_per_s: 50.0, bytes_per_msg: 100.0 })]);
        let live = inputs(&tco, &classes, &measured, &|_| None);
        assert_eq!((live[0].msg_per_s, live[0].bytes_per_msg, live[0].compression), (50.0, 100.0, 1.0));
    }
}
