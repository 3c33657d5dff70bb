//! `/healthz` and `/readyz` (`[health]`): whether the node is alive, and whether it is serving
//! and making progress, each with a JSON detail naming every check.
//!
//! - **Alive** (`/healthz`): the local SLO probe delivers (the broker core serves clients). A
//!   watchdog restarts on it, so it says nothing a restart cannot mend.
//! - **Ready** (`/readyz`): alive; the session store committing (no commit failing, and ops
//!   never waiting longer than `max_store_wait` without one: the acknowledgements of durable
//!   sessions wait for it); the spool readable (not damaged), writable (its last
//!   commit succeeded) and within `max_spool_use` of its budget; and the uplink connected, or
//!   its oldest unacknowledged record younger than `max_backlog_age` (a link down for a minute
//!   with nothing waiting is no reason to take the node out of service; hours are).
//!
//! Each check is a [`Check`]; lib.rs hands [`Checks`] the probe, the session store, the spool
//! writer and the link it assembled.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shared::units::{HumanDuration, now_ms};

use crate::broker::store::{SessionStore, StoreHealth};
use crate::probe::Health as Probe;
use crate::spool::SpoolWriter;
use crate::tco::LinkFigures;
use shared::check::Problems;

/// `[health]`: the bounds of readiness.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// With the uplink down, the node stays ready while its oldest record waiting for the
    /// cloud is younger than this. Default: 10m.
    #[serde(default = "default_backlog_age")]
    pub max_backlog_age: HumanDuration,
    /// The share of `spool.budget` the records may fill before the node is not ready (past the
    /// budget the oldest `normal` records are dropped). Default: 0.9.
    #[serde(default = "default_spool_use")]
    pub max_spool_use: f64,
    /// How long ops may wait for the session store without a commit before the node is not
    /// ready: QoS 1/2 acknowledgements, SUBACKs and deliveries to durable sessions wait for it.
    /// Default: 10s.
    #[serde(default = "default_store_wait")]
    pub max_store_wait: HumanDuration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            max_backlog_age: default_backlog_age(),
            max_spool_use: default_spool_use(),
            max_store_wait: default_store_wait(),
        }
    }
}

fn default_store_wait() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

fn default_backlog_age() -> HumanDuration {
    HumanDuration(Duration::from_secs(600))
}
fn default_spool_use() -> f64 {
    0.9
}

impl HealthConfig {
    pub fn check(&self, p: &mut Problems) {
        if !(self.max_spool_use > 0.0 && self.max_spool_use <= 1.0) {
            p.bad("health.max_spool_use", format!("{} is outside (0, 1]", self.max_spool_use));
        }
        if self.max_backlog_age.0.is_zero() {
            p.bad("health.max_backlog_age", "must be more than 0");
        }
        if self.max_store_wait.0.is_zero() {
            p.bad("health.max_store_wait", "must be more than 0");
        }
    }
}

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// Every check of one endpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Report {
    pub status: &'static str,
    pub checks: Vec<Check>,
}

impl Report {
    fn of(checks: Vec<Check>) -> Self {
        let status = if checks.iter().all(|c| c.ok) { "ok" } else { "failing" };
        Self { status, checks }
    }

    pub(crate) fn ok(&self) -> bool {
        self.status == "ok"
    }

    pub(crate) fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }
}

/// What the checks look at.
#[derive(Debug)]
pub(crate) struct Checks {
    pub config: HealthConfig,
    pub probe: Probe,
    /// The broker's session store.
    pub store: SessionStore,
    /// The spool and its budget in bytes, when a class routes to the cloud.
    pub spool: Option<(SpoolWriter, u64)>,
    /// The uplink's link, when `[uplink]` is configured.
    pub link: Option<Arc<LinkFigures>>,
}

impl Checks {
    /// `/healthz`.
    pub(crate) fn alive(&self) -> Report {
        Report::of(vec![self.probe()])
    }

    /// `/readyz`.
    pub(crate) fn ready(&self) -> Report {
        let mut checks = vec![self.probe(), store_check(&self.store.health(), now_ms(), self.config.max_store_wait.0)];
        if let Some((spool, budget)) = &self.spool {
            checks.push(self.spool_check(spool, *budget));
            if let Some(link) = &self.link {
                checks.push(self.uplink_check(spool, link));
            }
        }
        Report::of(checks)
    }

    fn probe(&self) -> Check {
        match self.probe.check() {
            Ok(detail) => Check { name: "probe", ok: true, detail },
            Err(detail) => Check { name: "probe", ok: false, detail },
        }
    }

    fn spool_check(&self, spool: &SpoolWriter, budget: u64) -> Check {
        let f = spool.figures();
        let share = f.bytes as f64 / budget.max(1) as f64;
        let (ok, detail) = if let Some(problem) = spool.problem() {
            (false, problem)
        } else if let Some(kind) = f.failing {
            (false, format!("commits failing ({kind}); messages wait in memory"))
        } else if share > self.config.max_spool_use {
            (false, format!("{:.0} % of spool.budget used, over health.max_spool_use", share * 100.0))
        } else {
            (true, format!("{:.1} % of spool.budget used", share * 100.0))
        };
        Check { name: "spool", ok, detail }
    }

    fn uplink_check(&self, spool: &SpoolWriter, link: &LinkFigures) -> Check {
        let (up, since) = link.up();
        if up {
            return Check { name: "uplink", ok: true, detail: "connected".into() };
        }
        let now = now_ms();
        let down = match since {
            Some(ms) => format!("down for {}", secs(now.saturating_sub(ms))),
            None => "not connected yet".into(),
        };
        match spool.figures().oldest_unacked_ms {
            None => Check { name: "uplink", ok: true, detail: format!("{down}; nothing waiting for the cloud") },
            Some(oldest) => {
                let age = Duration::from_millis(now.saturating_sub(oldest));
                let ok = age <= self.config.max_backlog_age.0;
                let bound = if ok { "within" } else { "over" };
                let detail = format!(
                    "{down}; oldest record waiting {}, {bound} health.max_backlog_age",
                    secs(age.as_millis() as u64)
                );
                Check { name: "uplink", ok, detail }
            }
        }
    }
}

/// The session store's check: failing commits, or ops waiting past `bound` with no commit, make
/// the node not ready. `now` in ms since the Unix epoch (the simulation's virtual one).
pub fn store_check(h: &StoreHealth, now: u64, bound: Duration) -> Check {
    let waiting = format!("{} ops ({} bytes) waiting", h.ops, h.bytes);
    let (ok, detail) = match (&h.failing, h.stalled_since_ms) {
        (Some(error), _) => (false, format!("commits failing ({error}); {waiting}, their acknowledgements with them")),
        (None, Some(since)) => {
            let stalled = Duration::from_millis(now.saturating_sub(since));
            let ok = stalled <= bound;
            let over = if ok { "within" } else { "over" };
            (ok, format!("{waiting}, no commit for {}, {over} health.max_store_wait", secs(stalled.as_millis() as u64)))
        }
        (None, None) => (true, "nothing waiting".into()),
    };
    Check { name: "session store", ok, detail }
}

fn secs(ms: u64) -> String {
    HumanDuration(Duration::from_secs(ms / 1000)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_fails_with_any_check_and_names_each() {
        let ok = Check { name: "probe", ok: true, detail: "delivered 0.1s ago".into() };
        let bad = Check { name: "uplink", ok: false, detail: "down for 2h".into() };
        let report = Report::of(vec![ok.clone(), bad]);
        assert!(!report.ok());
        let json: serde_json::Value = serde_json::from_str(&report.json()).unwrap();
        assert_eq!(json["status"], "failing");
        assert_eq!(json["checks"][1]["name"], "uplink");
        assert_eq!(json["checks"][1]["detail"], "down for 2h");
        assert!(Report::of(vec![ok]).ok());
    }

    #[test]
    fn bounds_that_cannot_work_are_named() {
        let mut p = Problems::default();
        let zero = HumanDuration(Duration::ZERO);
        HealthConfig { max_spool_use: 1.5, max_backlog_age: zero, max_store_wait: zero }.check(&mut p);
        let keys: Vec<_> = p.into_vec().into_iter().map(|p| p.key).collect();
        assert_eq!(keys, ["health.max_spool_use", "health.max_backlog_age", "health.max_store_wait"]);
    }

    #[test]
    fn a_store_failing_or_stalled_past_its_bound_is_not_ready() {
        let bound = Duration::from_secs(10);
        let idle = StoreHealth { ops: 0, bytes: 0, stalled_since_ms: None, failing: None };
        assert!(store_check(&idle, 50_000, bound).ok);
        let waiting = StoreHealth { ops: 4, bytes: 900, stalled_since_ms: Some(45_000), ..idle.clone() };
        let c = store_check(&waiting, 50_000, bound);
        assert!(c.ok, "{c:?}");
        let c = store_check(&waiting, 56_000, bound);
        assert!(!c.ok);
        assert!(c.detail.contains("4 ops") && c.detail.contains("over health.max_store_wait"), "{}", c.detail);
        let failing = StoreHealth { failing: Some("database is locked".into()), ..waiting };
        let c = store_check(&failing, 45_001, bound);
        assert!(!c.ok && c.detail.contains("database is locked"), "{}", c.detail);
    }
}
