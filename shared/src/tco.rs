//! The TCO model: what each route of a topic class costs a month, which routes its latency SLA
//! and governance need rule out, and which one to take. Pure functions; prices come from
//! config (`config/tco-*.toml` name their sources), never from here.
//!
//! Cost of a route, per class and month:
//!
//! - **Fixed**: the route's architecture (hardware amortised over `months`, plus operations
//!   FTE times the cost of an FTE-month), shared equally by the classes priced together. Those
//!   costs do not grow with one class's traffic, and splitting them by traffic would make a
//!   class's choice independent of its own volume, which is the one thing the model must
//!   weigh.
//! - **Variable**: `edge-direct` pays `edge_per_gb` for what it handles locally; `central` pays
//!   the uplink for the bytes on the wire (after compression), the central cluster's ingest per
//!   GB and its storage for `retention_months`. `both` pays both routes.
//!
//! A route is infeasible when the governance table of docs/ARCHITECTURE.md forbids it, or (for `central`)
//! when the SLA is below what a central consumer waits: the measured edge-to-central commit
//! latency, and never less than the RTT. The cheapest feasible route wins; with none feasible
//! there is no choice and the reason says why. A pinned class reports the model's choice and
//! keeps its pin.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where a class's messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Route {
    /// Local subscribers only.
    EdgeDirect,
    /// The cloud only, through the spool; local subscribers do not get it.
    Central,
    /// Local subscribers and the cloud.
    Both,
}

impl Route {
    pub(crate) const ALL: [Route; 3] = [Route::EdgeDirect, Route::Central, Route::Both];

    pub fn as_str(self) -> &'static str {
        match self {
            Route::EdgeDirect => "edge-direct",
            Route::Central => "central",
            Route::Both => "both",
        }
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the class's data must do for governance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Governance {
    #[default]
    None,
    /// A copy must reach the central cluster.
    AuditCopy,
    /// Only the central cluster may serve it.
    CentralOnly,
}

impl Governance {
    /// Whether `route` satisfies this governance need (the table in docs/ARCHITECTURE.md).
    pub fn allows(self, route: Route) -> bool {
        match self {
            Governance::None => true,
            Governance::AuditCopy => route != Route::EdgeDirect,
            Governance::CentralOnly => route == Route::Central,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Governance::None => "none",
            Governance::AuditCopy => "audit-copy",
            Governance::CentralOnly => "central-only",
        }
    }
}

/// One architecture's fleet-wide costs, as a spreadsheet would state them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Architecture {
    /// Hardware bought for the whole period.
    pub hardware: f64,
    /// Uplink traffic a month, GB.
    #[serde(default)]
    pub uplink_gb_month: f64,
    /// Operations effort, FTE a month.
    pub fte: f64,
}

/// Prices: every figure the model multiplies by, each from config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    #[serde(default = "default_currency")]
    pub currency: String,
    /// Amortisation period of the hardware, months (and the period of the totals).
    pub months: f64,
    /// Uplink cost per GB on the wire.
    pub uplink_per_gb: f64,
    /// Central cluster ingest cost per GB.
    #[serde(default)]
    pub central_ingest_per_gb: f64,
    /// Central cluster storage cost per GB-month.
    #[serde(default)]
    pub central_storage_per_gb_month: f64,
    /// How long the central cluster keeps what it ingests, months.
    #[serde(default)]
    pub retention_months: f64,
    /// Edge cost per GB handled locally (storage, wear), if any.
    #[serde(default)]
    pub edge_per_gb: f64,
    /// Cost of one FTE-month of operations.
    pub fte_month: f64,
    pub edge_direct: Architecture,
    pub central: Architecture,
}

fn default_currency() -> String {
    "USD".into()
}

/// What the model knows of one class: its needs and its observed (or declared) traffic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassInput {
    pub name: String,
    pub msg_per_s: f64,
    /// Mean topic plus payload bytes.
    pub bytes_per_msg: f64,
    /// Bytes on the wire per byte of topic plus payload (1.0 = no compression).
    #[serde(default = "one")]
    pub compression: f64,
    /// Latency its consumers need, ms.
    #[serde(default)]
    pub sla_ms: Option<f64>,
    #[serde(default)]
    pub governance: Governance,
    /// Set by the operator: the model reports, never overrides.
    #[serde(default)]
    pub pinned: Option<Route>,
}

fn one() -> f64 {
    1.0
}

/// The measured link to the central cluster.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub rtt_ms: f64,
    /// Edge publish to central commit, ms.
    pub commit_ms: f64,
}

impl Link {
    /// What a consumer of the central cluster waits for a message.
    pub(crate) fn central_latency_ms(&self) -> f64 {
        self.commit_ms.max(self.rtt_ms)
    }
}

/// One route's monthly cost for one class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteCost {
    pub route: Route,
    pub monthly: f64,
    pub fixed: f64,
    pub uplink: f64,
    pub central: f64,
    pub edge: f64,
    /// Why the route cannot be taken.
    pub infeasible: Option<String>,
}

/// The model's answer for one class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub class: String,
    pub msg_per_s: f64,
    pub gb_month: f64,
    pub wire_gb_month: f64,
    pub costs: Vec<RouteCost>,
    /// The cheapest feasible route, if any.
    pub best: Option<Route>,
    /// What the class takes: its pin, else the best route.
    pub chosen: Option<Route>,
    /// Monthly saving of the best route against the next cheapest feasible one.
    pub saving: f64,
    pub reason: String,
}

impl Decision {
    pub fn cost(&self, route: Route) -> &RouteCost {
        self.costs.iter().find(|c| c.route == route).expect("every route is priced")
    }

    /// Saving as a share of the runner-up's cost, 0 when there is no runner-up.
    pub(crate) fn saving_share(&self) -> f64 {
        let Some(best) = self.best else { return 0.0 };
        let runner_up = self.cost(best).monthly + self.saving;
        if runner_up > 0.0 { self.saving / runner_up } else { 0.0 }
    }
}

const SECONDS_PER_MONTH: f64 = 30.44 * 24.0 * 3600.0;
const GB: f64 = 1e9;

/// Prices `classes` together (they share the fixed costs equally).
pub fn evaluate(prices: &Prices, link: &Link, classes: &[ClassInput]) -> Vec<Decision> {
    let n = classes.len().max(1) as f64;
    classes.iter().map(|c| decide(prices, link, c, n)).collect()
}

fn fixed_monthly(prices: &Prices, a: &Architecture) -> f64 {
    let months = if prices.months > 0.0 { prices.months } else { 1.0 };
    a.hardware / months + a.fte * prices.fte_month
}

fn decide(prices: &Prices, link: &Link, class: &ClassInput, n: f64) -> Decision {
    let gb_month = (class.msg_per_s * class.bytes_per_msg * SECONDS_PER_MONTH / GB).max(0.0);
    let wire_gb_month = gb_month * class.compression.max(0.0);
    let edge_fixed = fixed_monthly(prices, &prices.edge_direct) / n;
    let central_fixed = fixed_monthly(prices, &prices.central) / n;
    let edge_var = gb_month * prices.edge_per_gb;
    let uplink = wire_gb_month * prices.uplink_per_gb;
    let central_var = gb_month * prices.central_ingest_per_gb
        + gb_month * prices.retention_months * prices.central_storage_per_gb_month;
    let central_latency = link.central_latency_ms();
    let costs: Vec<RouteCost> = Route::ALL
        .iter()
        .map(|&route| {
            let (fixed, up, central, edge) = match route {
                Route::EdgeDirect => (edge_fixed, 0.0, 0.0, edge_var),
                Route::Central => (central_fixed, uplink, central_var, 0.0),
                Route::Both => (edge_fixed + central_fixed, uplink, central_var, edge_var),
            };
            let infeasible = if !class.governance.allows(route) {
                Some(format!("governance {} forbids {route}", class.governance.as_str()))
            } else if route == Route::Central
                && let Some(sla) = class.sla_ms
                && sla < central_latency
            {
                Some(format!("SLA {sla} ms < central latency {central_latency:.0} ms"))
            } else {
                None
            };
            RouteCost { route, monthly: fixed + up + central + edge, fixed, uplink: up, central, edge, infeasible }
        })
        .collect();
    let mut feasible: Vec<&RouteCost> = costs.iter().filter(|c| c.infeasible.is_none()).collect();
    feasible.sort_by(|a, b| a.monthly.total_cmp(&b.monthly).then(a.route.cmp(&b.route)));
    let best = feasible.first().map(|c| c.route);
    let saving = match (feasible.first(), feasible.get(1)) {
        (Some(a), Some(b)) => b.monthly - a.monthly,
        _ => 0.0,
    };
    let reason = match (feasible.first(), feasible.get(1)) {
        (None, _) => {
            let why: Vec<&str> = costs.iter().filter_map(|c| c.infeasible.as_deref()).collect();
            format!("no feasible route: {}", why.join("; "))
        }
        (Some(_), None) => {
            let why: Vec<&str> = costs.iter().filter_map(|c| c.infeasible.as_deref()).collect();
            format!("only feasible route ({})", why.join("; "))
        }
        (Some(a), Some(b)) => {
            let mut r =
                format!("{} {} a month cheaper than {}", money(b.monthly - a.monthly), prices.currency, b.route);
            let ruled_out: Vec<&str> = costs.iter().filter_map(|c| c.infeasible.as_deref()).collect();
            if !ruled_out.is_empty() {
                r.push_str(&format!("; {}", ruled_out.join("; ")));
            }
            r
        }
    };
    let (chosen, reason) = match class.pinned {
        Some(pin) => (Some(pin), format!("pinned to {pin} (model: {}; {reason})", best.map_or("none", Route::as_str))),
        None => (best, reason),
    };
    Decision {
        class: class.name.clone(),
        msg_per_s: class.msg_per_s,
        gb_month,
        wire_gb_month,
        costs,
        best,
        chosen,
        saving,
        reason,
    }
}

/// `v` rounded to whole units with thousands separated: `1,234`.
pub fn money(v: f64) -> String {
    let n = v.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// An architecture's total over the amortisation period, and its parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchitectureTotal {
    pub name: String,
    pub hardware: f64,
    pub uplink: f64,
    pub operations: f64,
    pub total: f64,
}

/// Both architectures' totals over `prices.months`, from their own table.
pub fn architecture_totals(prices: &Prices) -> Vec<ArchitectureTotal> {
    [("edge-direct", &prices.edge_direct), ("central", &prices.central)]
        .into_iter()
        .map(|(name, a)| {
            let uplink = a.uplink_gb_month * prices.months * prices.uplink_per_gb;
            let operations = a.fte * prices.months * prices.fte_month;
            ArchitectureTotal {
                name: name.into(),
                hardware: a.hardware,
                uplink,
                operations,
                total: a.hardware + uplink + operations,
            }
        })
        .collect()
}

/// Route changes only when the model has wanted the same other route, saving at least
/// `threshold` of the runner-up's cost, for `hold` without a break. A pin, or a current route
/// that became infeasible, applies at the next update. Time is a monotonic offset the caller
/// counts (tests drive it by hand).
#[derive(Debug, Clone)]
pub struct Hysteresis {
    pub threshold: f64,
    pub hold: Duration,
    current: Route,
    candidate: Option<(Route, Duration)>,
}

impl Hysteresis {
    pub fn new(current: Route, threshold: f64, hold: Duration) -> Self {
        Self { threshold, hold, current, candidate: None }
    }

    #[cfg(test)]
    pub(crate) fn current(&self) -> Route {
        self.current
    }

    /// Feeds one decision at `now`; returns the new route when the class switches.
    pub fn update(&mut self, now: Duration, decision: &Decision) -> Option<Route> {
        let pinned = decision.chosen.is_some() && decision.chosen != decision.best;
        let stuck = decision.cost(self.current).infeasible.is_some();
        let wanted = if pinned {
            decision.chosen
        } else if stuck || decision.saving_share() >= self.threshold {
            decision.best
        } else {
            None
        };
        let Some(wanted) = wanted.filter(|w| *w != self.current) else {
            self.candidate = None;
            return None;
        };
        let since = match self.candidate {
            Some((route, since)) if route == wanted => since,
            _ => now,
        };
        self.candidate = Some((wanted, since));
        if pinned || stuck || now.saturating_sub(since) >= self.hold {
            self.current = wanted;
            self.candidate = None;
            return Some(wanted);
        }
        None
    }
}

#[cfg(test)]
#[path = "tco_tests.rs"]
mod tests;
