//! The fleet TCO report: each edge's latest classes report, as the sink keeps it, summed per
//! class across the fleet (`cloud-bridge tco report`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use shared::tco::{Route, money};

use crate::sink::StoredReport;

/// One class summed over the edges reporting it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetClass {
    pub class: String,
    pub edges: usize,
    pub msg_per_s: f64,
    pub gb_month: f64,
    /// Summed monthly cost of each route, over the edges where it is allowed.
    pub route_costs: BTreeMap<Route, f64>,
    /// Edges per route the class has now, and per route the model chose.
    pub routes_now: BTreeMap<Route, usize>,
    pub model_choice: BTreeMap<Route, usize>,
    /// Monthly cost of the routes the class has now, and if every edge followed the model.
    pub cost_now: f64,
    pub cost_model: f64,
    pub switches: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Fleet {
    pub currency: String,
    pub edges: Vec<EdgeSeen>,
    pub classes: Vec<FleetClass>,
    pub cost_now: f64,
    pub cost_model: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct EdgeSeen {
    pub edge: String,
    pub received_ms: u64,
    pub classes: usize,
}

/// Sums `reports` per class. Currencies are not converted: edges on another currency than the
/// first one are listed but left out of the sums, and named in `edges`.
pub fn fleet(reports: &[StoredReport]) -> Fleet {
    let currency = reports.first().map_or_else(|| "USD".to_owned(), |r| r.report.currency.clone());
    let mut classes: BTreeMap<String, FleetClass> = BTreeMap::new();
    let mut edges = Vec::new();
    for r in reports {
        edges.push(EdgeSeen { edge: r.edge.clone(), received_ms: r.received_ms, classes: r.report.classes.len() });
        if r.report.currency != currency {
            continue;
        }
        for c in &r.report.classes {
            let d = &c.decision;
            let f = classes
                .entry(d.class.clone())
                .or_insert_with(|| FleetClass { class: d.class.clone(), ..Default::default() });
            f.edges += 1;
            f.msg_per_s += d.msg_per_s;
            f.gb_month += d.gb_month;
            f.switches += c.switches;
            for cost in d.costs.iter().filter(|c| c.infeasible.is_none()) {
                *f.route_costs.entry(cost.route).or_default() += cost.monthly;
            }
            // Reports are checked when they arrive (`proto::report_problem`); one stored by an
            // older bridge is summed without the routes it does not price, not a panic.
            let monthly = |route: Route| d.costs.iter().find(|c| c.route == route).map_or(0.0, |c| c.monthly);
            let now = c.route.or(d.chosen);
            if let Some(route) = now {
                *f.routes_now.entry(route).or_default() += 1;
                f.cost_now += monthly(route);
            }
            if let Some(best) = d.best {
                *f.model_choice.entry(best).or_default() += 1;
                f.cost_model += monthly(best);
            }
        }
    }
    let classes: Vec<FleetClass> = classes.into_values().collect();
    Fleet {
        cost_now: classes.iter().map(|c| c.cost_now).sum(),
        cost_model: classes.iter().map(|c| c.cost_model).sum(),
        currency,
        edges,
        classes,
    }
}

fn counts(m: &BTreeMap<Route, usize>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter().map(|(r, n)| format!("{r} x{n}")).collect::<Vec<_>>().join(", ")
}

pub fn table(f: &Fleet) -> String {
    let mut out = String::new();
    let now_ms = shared::units::now_ms();
    let _ = writeln!(out, "edges reporting: {}", f.edges.len());
    for e in &f.edges {
        let age = now_ms.saturating_sub(e.received_ms) / 1000;
        let _ = writeln!(out, "  {:<24} {} classes, reported {age} s ago", e.edge, e.classes);
    }
    let _ = writeln!(
        out,
        "{:<18} {:>5} {:>9} {:>10} {:>13} {:>13} {:>13} {:<28} {:<28}",
        "class", "edges", "msg/s", "GB/month", "edge-direct", "central", "both", "routes now", "model"
    );
    for c in &f.classes {
        let cost = |r: Route| c.route_costs.get(&r).map_or("-".to_owned(), |v| money(*v));
        let _ = writeln!(
            out,
            "{:<18} {:>5} {:>9.1} {:>10.2} {:>13} {:>13} {:>13} {:<28} {:<28}",
            c.class,
            c.edges,
            c.msg_per_s,
            c.gb_month,
            cost(Route::EdgeDirect),
            cost(Route::Central),
            cost(Route::Both),
            counts(&c.routes_now),
            counts(&c.model_choice)
        );
    }
    let _ = writeln!(
        out,
        "fleet, {} a month: {} with the routes now, {} if every edge followed the model",
        f.currency,
        money(f.cost_now),
        money(f.cost_model)
    );
    out
}

#[cfg(test)]
mod tests {
    use shared::proto::{ClassReport, ClassesReport};
    use shared::tco::{Architecture, ClassInput, Governance, Link, Prices, evaluate};

    use super::*;

    fn report(edge: &str, currency: &str, rate: f64, route: Route) -> StoredReport {
        let prices = Prices {
            currency: currency.into(),
            months: 36.0,
            uplink_per_gb: 3.0,
            central_ingest_per_gb: 0.0,
            central_storage_per_gb_month: 0.0,
            retention_months: 0.0,
            edge_per_gb: 0.0,
            fte_month: 1.0,
            edge_direct: Architecture { hardware: 3600.0, uplink_gb_month: 0.0, fte: 0.0 },
            central: Architecture { hardware: 0.0, uplink_gb_month: 0.0, fte: 0.0 },
        };
        let input = ClassInput {
            name: "counters".into(),
            msg_per_s: rate,
            bytes_per_msg: 100.0,
            compression: 1.0,
            sla_ms: None,
            governance: Governance::None,
            pinned: None,
        };
        let decision = evaluate(&prices, &Link { rtt_ms: 1.0, commit_ms: 1.0 }, &[input])[0].clone();
        StoredReport {
            edge: edge.into(),
            received_ms: 0,
            report: ClassesReport {
                currency: currency.into(),
                classes: vec![ClassReport { decision, route: Some(route), switches: 1 }],
            },
        }
    }

    #[test]
    fn classes_are_summed_across_edges_in_one_currency() {
        let reports = [
            report("a", "USD", 10.0, Route::Central),
            report("b", "USD", 1000.0, Route::Central),
            report("c", "EUR", 1000.0, Route::EdgeDirect),
        ];
        let f = fleet(&reports);
        assert_eq!(f.edges.len(), 3, "every edge is listed");
        let c = &f.classes[0];
        assert_eq!((c.edges, c.switches), (2, 2), "the EUR edge is not summed");
        assert!((c.msg_per_s - 1010.0).abs() < 1e-9);
        assert_eq!(c.routes_now.get(&Route::Central), Some(&2));
        assert_eq!(c.model_choice.get(&Route::Central), Some(&1));
        assert_eq!(c.model_choice.get(&Route::EdgeDirect), Some(&1));
        let d0 = &reports[0].report.classes[0].decision;
        let d1 = &reports[1].report.classes[0].decision;
        let now = d0.cost(Route::Central).monthly + d1.cost(Route::Central).monthly;
        let model = d0.cost(Route::Central).monthly + d1.cost(Route::EdgeDirect).monthly;
        assert!((f.cost_now - now).abs() < 1e-9 && (f.cost_model - model).abs() < 1e-9);
        assert!(f.cost_model < f.cost_now);
        assert!(table(&f).contains("central x2"));
    }
}
