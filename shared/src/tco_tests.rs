use proptest::prelude::*;

use super::*;

fn prices(uplink_per_gb: f64) -> Prices {
    Prices {
        currency: "USD".into(),
        months: 36.0,
        uplink_per_gb,
        central_ingest_per_gb: 0.10,
        central_storage_per_gb_month: 0.10,
        retention_months: 1.0,
        edge_per_gb: 0.0,
        fte_month: 11_090.0,
        edge_direct: Architecture { hardware: 12_800.0, uplink_gb_month: 2.1, fte: 0.3 },
        central: Architecture { hardware: 41_500.0, uplink_gb_month: 87.0, fte: 1.7 },
    }
}

fn class(name: &str, msg_per_s: f64, sla_ms: Option<f64>, governance: Governance) -> ClassInput {
    ClassInput {
        name: name.into(),
        msg_per_s,
        bytes_per_msg: 500.0,
        compression: 0.3,
        sla_ms,
        governance,
        pinned: None,
    }
}

const LINK: Link = Link { rtt_ms: 40.0, commit_ms: 120.0 };

#[test]
fn the_sla_and_governance_rule_routes_out_and_say_why() {
    let d = &evaluate(&prices(1.0), &LINK, &[class("inference", 100.0, Some(50.0), Governance::None)])[0];
    assert_eq!(d.cost(Route::Central).infeasible.as_deref(), Some("SLA 50 ms < central latency 120 ms"));
    assert_eq!(d.chosen, Some(Route::EdgeDirect));
    let d = &evaluate(&prices(1.0), &LINK, &[class("audit", 1.0, None, Governance::AuditCopy)])[0];
    assert!(d.cost(Route::EdgeDirect).infeasible.as_deref().unwrap().contains("audit-copy forbids edge-direct"));
    assert_ne!(d.chosen, Some(Route::EdgeDirect));
    // central-only with an SLA below the link: nothing is feasible, and the report says both.
    let d = &evaluate(&prices(1.0), &LINK, &[class("x", 1.0, Some(10.0), Governance::CentralOnly)])[0];
    assert_eq!(d.chosen, None);
    assert!(d.reason.starts_with("no feasible route"), "{}", d.reason);
}

#[test]
fn costs_add_up_and_both_pays_for_both() {
    let d = &evaluate(&prices(2.0), &LINK, &[class("t", 10.0, None, Governance::None)])[0];
    let (e, c, b) = (d.cost(Route::EdgeDirect), d.cost(Route::Central), d.cost(Route::Both));
    for r in [e, c, b] {
        assert!((r.monthly - (r.fixed + r.uplink + r.central + r.edge)).abs() < 1e-9);
    }
    assert!((b.monthly - (e.monthly + c.monthly)).abs() < 1e-9);
    // 10 msg/s of 500 B is 13.15 GB a month, 3.95 GB on the wire at 0.3.
    assert!((d.gb_month - 13.15).abs() < 0.01, "{}", d.gb_month);
    assert!((c.uplink - 2.0 * d.wire_gb_month).abs() < 1e-9);
}

#[test]
fn a_pin_is_reported_not_overridden() {
    let mut c = class("t", 10.0, Some(50.0), Governance::None);
    c.pinned = Some(Route::Central);
    let d = &evaluate(&prices(1.0), &LINK, &[c])[0];
    assert_eq!(d.chosen, Some(Route::Central));
    assert_eq!(d.best, Some(Route::EdgeDirect));
    assert!(d.reason.starts_with("pinned to central (model: edge-direct"), "{}", d.reason);
}

#[test]
fn architecture_totals_come_from_their_own_table() {
    let t = architecture_totals(&prices(1.0));
    assert_eq!(t[0].name, "edge-direct");
    assert!((t[0].total - (12_800.0 + 2.1 * 36.0 + 0.3 * 36.0 * 11_090.0)).abs() < 1e-6);
    assert!((t[1].total - (41_500.0 + 87.0 * 36.0 + 1.7 * 36.0 * 11_090.0)).abs() < 1e-6);
}

/// Prices where 100 msg/s is cheapest central and ten times that edge-direct: the central
/// cluster is already paid for, the uplink is dear.
fn crossover() -> Prices {
    Prices {
        uplink_per_gb: 20.0,
        central: Architecture { hardware: 0.0, uplink_gb_month: 0.0, fte: 0.0 },
        ..prices(20.0)
    }
}

fn at(d: &Decision) -> Decision {
    d.clone()
}

#[test]
fn hysteresis_ignores_a_short_spike_and_follows_a_sustained_change_once() {
    let p = crossover();
    let small = at(&evaluate(&p, &LINK, &[class("c", 100.0, None, Governance::None)])[0]);
    let large = at(&evaluate(&p, &LINK, &[class("c", 1000.0, None, Governance::None)])[0]);
    assert_eq!(small.best, Some(Route::Central));
    assert_eq!(large.best, Some(Route::EdgeDirect));
    let min = |m: u64| Duration::from_secs(60 * m);
    let mut h = Hysteresis::new(Route::Central, 0.1, min(15));
    let mut switches = Vec::new();
    // A 10-minute spike, then calm: no flip.
    for m in 0..60 {
        let d = if (10..20).contains(&m) { &large } else { &small };
        if let Some(r) = h.update(min(m), d) {
            switches.push((m, r));
        }
    }
    assert!(switches.is_empty(), "{switches:?}");
    // Sustained from minute 60: one flip, 15 minutes later, and no more.
    for m in 60..180 {
        if let Some(r) = h.update(min(m), &large) {
            switches.push((m, r));
        }
    }
    assert_eq!(switches, vec![(75, Route::EdgeDirect)]);
    assert_eq!(h.current(), Route::EdgeDirect);
}

#[test]
fn a_saving_below_the_threshold_never_flips() {
    let p = crossover();
    let d = at(&evaluate(&p, &LINK, &[class("c", 1000.0, None, Governance::None)])[0]);
    let mut h = Hysteresis::new(Route::Central, 0.99, Duration::ZERO);
    assert_eq!(h.update(Duration::from_secs(1), &d), None);
    let mut h = Hysteresis::new(Route::Central, 0.01, Duration::ZERO);
    assert_eq!(h.update(Duration::from_secs(1), &d), Some(Route::EdgeDirect));
}

#[test]
fn a_route_that_became_infeasible_is_left_at_once() {
    let d = at(&evaluate(&prices(1.0), &LINK, &[class("c", 1.0, None, Governance::CentralOnly)])[0]);
    let mut h = Hysteresis::new(Route::Both, 0.5, Duration::from_secs(3600));
    assert_eq!(h.update(Duration::ZERO, &d), Some(Route::Central));
}

fn governance() -> impl Strategy<Value = Governance> {
    prop_oneof![Just(Governance::None), Just(Governance::AuditCopy), Just(Governance::CentralOnly)]
}

fn any_prices() -> impl Strategy<Value = Prices> {
    (
        0.0..50.0f64,
        0.0..1.0f64,
        0.0..1.0f64,
        0.0..2.0f64,
        0.0..100_000.0f64,
        0.0..100_000.0f64,
        0.0..3.0f64,
        0.0..3.0f64,
    )
        .prop_map(|(up, ingest, store, edge_gb, eh, ch, ef, cf)| Prices {
            currency: "USD".into(),
            months: 36.0,
            uplink_per_gb: up,
            central_ingest_per_gb: ingest,
            central_storage_per_gb_month: store,
            retention_months: 1.0,
            edge_per_gb: edge_gb,
            fte_month: 10_000.0,
            edge_direct: Architecture { hardware: eh, uplink_gb_month: 0.0, fte: ef },
            central: Architecture { hardware: ch, uplink_gb_month: 0.0, fte: cf },
        })
}

fn any_class() -> impl Strategy<Value = ClassInput> {
    (0.0..10_000.0f64, 1.0..100_000.0f64, 0.01..1.0f64, proptest::option::of(1.0..10_000.0f64), governance()).prop_map(
        |(rate, size, compression, sla_ms, governance)| ClassInput {
            name: "c".into(),
            msg_per_s: rate,
            bytes_per_msg: size,
            compression,
            sla_ms,
            governance,
            pinned: None,
        },
    )
}

fn any_link() -> impl Strategy<Value = Link> {
    (1.0..500.0f64, 0.0..2_000.0f64).prop_map(|(rtt_ms, commit_ms)| Link { rtt_ms, commit_ms })
}

proptest! {
    #[test]
    fn a_dearer_uplink_never_moves_edge_direct_to_central(
        p in any_prices(), c in any_class(), link in any_link(), more in 0.0..100.0f64,
    ) {
        let before = &evaluate(&p, &link, std::slice::from_ref(&c))[0];
        let dearer = Prices { uplink_per_gb: p.uplink_per_gb + more, ..p.clone() };
        let after = &evaluate(&dearer, &link, std::slice::from_ref(&c))[0];
        if before.chosen == Some(Route::EdgeDirect) {
            prop_assert_ne!(after.chosen, Some(Route::Central));
        }
    }

    #[test]
    fn an_sla_below_the_rtt_never_yields_central(p in any_prices(), mut c in any_class(), link in any_link(), f in 0.0..1.0f64) {
        c.sla_ms = Some(link.rtt_ms * f);
        let d = &evaluate(&p, &link, &[c])[0];
        prop_assert_ne!(d.chosen, Some(Route::Central));
    }

    #[test]
    fn central_only_never_yields_edge_direct(p in any_prices(), mut c in any_class(), link in any_link()) {
        c.governance = Governance::CentralOnly;
        let d = &evaluate(&p, &link, &[c])[0];
        prop_assert_ne!(d.chosen, Some(Route::EdgeDirect));
        prop_assert_ne!(d.chosen, Some(Route::Both));
    }

    #[test]
    fn the_choice_is_the_cheapest_feasible_route(p in any_prices(), c in any_class(), link in any_link()) {
        let d = &evaluate(&p, &link, &[c])[0];
        if let Some(best) = d.best {
            let cost = d.cost(best).monthly;
            prop_assert!(d.costs.iter().filter(|r| r.infeasible.is_none()).all(|r| r.monthly >= cost));
            prop_assert!(d.saving >= 0.0);
        } else {
            prop_assert!(d.costs.iter().all(|r| r.infeasible.is_some()));
        }
    }
}
