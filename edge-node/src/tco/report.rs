//! The TCO report: a table for the terminal, JSON for tools, and an SVG chart of the monthly
//! cost of each route per class with the chosen route marked.

use std::fmt::Write as _;

use shared::tco::{Route, money};

use super::Snapshot;

/// The report as text: per class, then both architectures' totals.
pub fn table(s: &Snapshot) -> String {
    let mut out = String::new();
    if let Some(link) = s.link {
        let _ = writeln!(out, "link: RTT {:.0} ms, commit {:.0} ms", link.rtt_ms, link.commit_ms);
    }
    let _ = writeln!(
        out,
        "{:<18} {:>9} {:>10} {:>13} {:>13} {:>13} {:<12} {:<12} reason",
        "class",
        "msg/s",
        "GB/month",
        format!("edge-direct/mo"),
        "central/mo",
        "both/mo",
        "choice",
        "route now"
    );
    for c in &s.classes {
        let d = &c.decision;
        let cost = |r: Route| {
            let rc = d.cost(r);
            match rc.infeasible {
                Some(_) => format!("({})", money(rc.monthly)),
                None => money(rc.monthly),
            }
        };
        let _ = writeln!(
            out,
            "{:<18} {:>9.1} {:>10.2} {:>13} {:>13} {:>13} {:<12} {:<12} {}",
            d.class,
            d.msg_per_s,
            d.gb_month,
            cost(Route::EdgeDirect),
            cost(Route::Central),
            cost(Route::Both),
            d.chosen.map_or("none", Route::as_str),
            c.route.map_or("-", Route::as_str),
            d.reason
        );
    }
    let _ = writeln!(out, "costs in {} a month; (x): route not allowed", s.currency);
    let _ = writeln!(out);
    let _ = writeln!(out, "architectures over {:.0} months ({}):", s.months, s.currency);
    for a in &s.architectures {
        let _ = writeln!(
            out,
            "  {:<12} hardware {:>10}  uplink {:>10}  operations {:>10}  total {:>10}",
            a.name,
            money(a.hardware),
            money(a.uplink),
            money(a.operations),
            money(a.total)
        );
    }
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A grouped bar chart: one group per class, one bar per route (log-free, linear scale from 0),
/// the chosen route outlined, routes not allowed hatched grey.
pub fn svg(s: &Snapshot) -> String {
    const ROUTES: [(Route, &str); 3] =
        [(Route::EdgeDirect, "#2b8a3e"), (Route::Central, "#1864ab"), (Route::Both, "#e67700")];
    let (bar, gap, left, top, height) = (26.0, 30.0, 90.0, 50.0, 260.0);
    let group = bar * 3.0 + gap;
    // Wide enough for the legend too.
    let width = (left + group * s.classes.len().max(1) as f64 + 40.0).max(left + 640.0);
    let max = s.classes.iter().flat_map(|c| c.decision.costs.iter().map(|r| r.monthly)).fold(0.0f64, f64::max).max(1.0);
    let y = |v: f64| top + height - v / max * height;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" font-family="sans-serif" font-size="12">"#,
        w = width,
        h = top + height + 90.0
    );
    let _ = writeln!(
        out,
        r##"<defs><pattern id="no" width="6" height="6" patternUnits="userSpaceOnUse"><path d="M0,6 L6,0" stroke="#888"/></pattern></defs>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="20" font-size="15">Monthly cost per class and route ({}); outlined: chosen</text>"#,
        escape(&s.currency)
    );
    for i in 0..=4 {
        let v = max * f64::from(i) / 4.0;
        let _ = writeln!(
            out,
            r##"<line x1="{left}" x2="{x2:.0}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{}</text>"##,
            money(v),
            x2 = width - 30.0,
            yy = y(v),
            tx = left - 6.0,
            ty = y(v) + 4.0
        );
    }
    for (i, c) in s.classes.iter().enumerate() {
        let x0 = left + gap / 2.0 + group * i as f64;
        for (k, (route, colour)) in ROUTES.iter().enumerate() {
            let rc = c.decision.cost(*route);
            let x = x0 + bar * k as f64;
            let fill = if rc.infeasible.is_some() { "url(#no)" } else { colour };
            let chosen = c.decision.chosen == Some(*route);
            let stroke = if chosen { r##" stroke="#000" stroke-width="3""## } else { "" };
            let title = match &rc.infeasible {
                Some(why) => format!("{route}: {} (not allowed: {why})", money(rc.monthly)),
                None => format!("{route}: {}", money(rc.monthly)),
            };
            let _ = writeln!(
                out,
                r#"<rect x="{x:.1}" y="{yy:.1}" width="{bw:.1}" height="{bh:.1}" fill="{fill}"{stroke}><title>{}</title></rect>"#,
                escape(&title),
                yy = y(rc.monthly),
                bw = bar - 2.0,
                bh = (top + height - y(rc.monthly)).max(0.5)
            );
        }
        let _ = writeln!(
            out,
            r##"<text x="{cx:.1}" y="{ty:.1}" text-anchor="middle">{}</text><text x="{cx:.1}" y="{ty2:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            escape(&c.decision.class),
            c.decision.chosen.map_or("none", Route::as_str),
            cx = x0 + bar * 1.5,
            ty = top + height + 18.0,
            ty2 = top + height + 34.0
        );
    }
    for (k, (route, colour)) in ROUTES.iter().enumerate() {
        let x = left + 130.0 * k as f64;
        let _ = writeln!(
            out,
            r#"<rect x="{x:.0}" y="{ly:.0}" width="12" height="12" fill="{colour}"/><text x="{tx:.0}" y="{ty:.0}">{route}</text>"#,
            ly = top + height + 50.0,
            tx = x + 16.0,
            ty = top + height + 60.0
        );
    }
    let _ = writeln!(
        out,
        r##"<rect x="{x:.0}" y="{ly:.0}" width="12" height="12" fill="url(#no)" stroke="#888"/><text x="{tx:.0}" y="{ty:.0}">not allowed (SLA or governance)</text>"##,
        x = left + 390.0,
        ly = top + height + 50.0,
        tx = left + 406.0,
        ty = top + height + 60.0
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_groups_thousands() {
        assert_eq!(money(0.4), "0");
        assert_eq!(money(1234.6), "1,235");
        assert_eq!(money(-1_234_567.0), "-1,234,567");
    }

    #[test]
    fn the_chart_marks_the_choice_and_hatches_what_is_not_allowed() {
        let prices: shared::tco::Prices = toml::from_str(
            "months = 36\nuplink_per_gb = 1\nfte_month = 1000\n[edge_direct]\nhardware = 360\nfte = 0\n[central]\nhardware = 0\nfte = 0\n",
        )
        .unwrap();
        let input = |name: &str, governance| shared::tco::ClassInput {
            name: name.into(),
            msg_per_s: 1.0,
            bytes_per_msg: 100.0,
            compression: 1.0,
            sla_ms: None,
            governance,
            pinned: None,
        };
        let tco = super::super::TcoConfig {
            prices,
            live: true,
            interval: shared::units::HumanDuration(std::time::Duration::from_secs(60)),
            hold: shared::units::HumanDuration(std::time::Duration::from_secs(60)),
            threshold: 0.1,
            link: Default::default(),
            classes: Default::default(),
        };
        let inputs = [input("a<b", shared::tco::Governance::None), input("c", shared::tco::Governance::CentralOnly)];
        let link = shared::tco::Link { rtt_ms: 10.0, commit_ms: 20.0 };
        let s = super::super::snapshot(&tco, link, &inputs, &Default::default());
        let svg = svg(&s);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a&lt;b") && !svg.contains("a<b"));
        assert_eq!(svg.matches(r#"stroke-width="3""#).count(), 2, "one chosen bar per class");
        assert_eq!(
            svg.matches("url(#no)").count(),
            3,
            "central-only: edge-direct and both not allowed, and the legend"
        );
        assert!(table(&s).contains("central-only forbids edge-direct"));
    }
}
