//! `/healthz` and `/readyz` (`[health]`): whether the node is alive, and whether it is serving
//! and making progress, each with a JSON detail naming every check.
//!
//! - **Alive** (`/healthz`): the local SLO probe delivers (the broker core serves clients). A
//!   watchdog restarts on it, so it says nothing a restart cannot mend.
//! - **Ready** (`/readyz`): alive, and the spool readable (not damaged), writable (its last
//!   commit succeeded) and within `max_spool_use` of its budget; and the uplink connected, or
//!   its oldest unacknowledged record younger than `max_backlog_age` (a link down for a minute
//!   with nothing waiting is no reason to take the node out of service; hours are).
//!
//! Each check is a [`Check`]; lib.rs hands [`Checks`] the probe, the spool writer and the link
//! it assembled.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shared::units::{HumanDuration, now_ms};

use crate::check::Problems;
use crate::probe::Health as Probe;
use crate::spool::SpoolWriter;
use crate::tco::LinkFigures;

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
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self { max_backlog_age: default_backlog_age(), max_spool_use: default_spool_use() }
    }
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
pub struct Report {
    pub status: &'static str,
    pub checks: Vec<Check>,
}

impl Report {
    fn of(checks: Vec<Check>) -> Self {
        let status = if checks.iter().all(|c| c.ok) { "ok" } else { "failing" };
        Self { status, checks }
    }

    pub fn ok(&self) -> bool {
        self.status == "ok"
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }
}

/// What the checks look at.
#[derive(Debug)]
pub struct Checks {
    pub config: HealthConfig,
    pub probe: Probe,
    /// The spool and its budget in bytes, when a class routes to the cloud.
    pub spool: Option<(SpoolWriter, u64)>,
    /// The uplink's link, when `[uplink]` is configured.
    pub link: Option<Arc<LinkFigures>>,
}

impl Checks {
    /// `/healthz`.
    pub fn alive(&self) -> Report {
        Report::of(vec![self.probe()])
    }

    /// `/readyz`.
    pub fn ready(&self) -> Report {
        let mut checks = vec![self.probe()];
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
        HealthConfig { max_spool_use: 1.5, max_backlog_age: HumanDuration(Duration::ZERO) }.check(&mut p);
        let keys: Vec<_> = p.into_vec().into_iter().map(|p| p.key).collect();
        assert_eq!(keys, ["health.max_spool_use", "health.max_backlog_age"]);
    }
}
