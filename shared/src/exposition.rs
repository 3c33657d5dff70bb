//! Both exposition formats from one encoding. The registry encodes OpenMetrics, which a
//! Prometheus server asks for; `curl`, `promtool check metrics` and older scrapers read the
//! Prometheus text format 0.0.4, where a counter's `# HELP` and `# TYPE` name its `_total`
//! samples, there are no `# UNIT` lines or `# EOF`, and `info` is a gauge. [`respond`] picks by
//! the request's `Accept` header, as Prometheus clients do.

/// The content type of OpenMetrics text.
pub(crate) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the Prometheus text format.
pub(crate) const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The body and content type for a scrape that sent `accept`: OpenMetrics when it asks for
/// it, the Prometheus text format otherwise.
pub fn respond(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (OPENMETRICS, openmetrics)
    } else {
        (PROMETHEUS_TEXT, to_prometheus_text(&openmetrics))
    }
}

/// OpenMetrics text as the Prometheus text format 0.0.4.
pub(crate) fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's `# HELP` comes before its `# TYPE`, which decides the name both must carry.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, help.take(), None);
            help = rest.split_once(' ').or(Some((rest, "")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "unknown" => (name.to_owned(), "untyped"),
                other => (name.to_owned(), other),
            };
            flush_help(&mut out, help.take(), Some(&name));
            out.push_str(&format!("# TYPE {name} {kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
        } else {
            flush_help(&mut out, help.take(), None);
            out.push_str(line);
            out.push('\n');
        }
    }
    flush_help(&mut out, help, None);
    out
}

/// Writes a held `# HELP` line, under `name` when its `# TYPE` renamed the family.
fn flush_help(out: &mut String, help: Option<(&str, &str)>, name: Option<&str>) {
    if let Some((family, text)) = help {
        out.push_str(&format!("# HELP {} {text}\n", name.unwrap_or(family)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_info_and_units_read_as_the_prometheus_text_format() {
        let open = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total{x=\"1\"} 3\n\
                    # HELP a_rtt Round trip.\n# TYPE a_rtt gauge\n# UNIT a_rtt seconds\na_rtt_seconds 0.5\n\
                    # HELP a_build Build.\n# TYPE a_build info\na_build_info{version=\"1\"} 1\n\
                    # HELP a_lat Latency.\n# TYPE a_lat histogram\na_lat_bucket{le=\"+Inf\"} 1\na_lat_sum 2\na_lat_count 1\n\
                    # EOF\n";
        let text = to_prometheus_text(open);
        assert_eq!(
            text,
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total{x=\"1\"} 3\n\
             # HELP a_rtt Round trip.\n# TYPE a_rtt gauge\na_rtt_seconds 0.5\n\
             # HELP a_build_info Build.\n# TYPE a_build_info gauge\na_build_info{version=\"1\"} 1\n\
             # HELP a_lat Latency.\n# TYPE a_lat histogram\na_lat_bucket{le=\"+Inf\"} 1\na_lat_sum 2\na_lat_count 1\n"
        );
        assert_eq!(respond(Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"), open.into()).1, open);
        assert_eq!(respond(None, open.into()), (PROMETHEUS_TEXT, text));
    }
}
