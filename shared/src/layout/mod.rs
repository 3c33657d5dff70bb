//! The layout rule of a crate, checked on its source (`fs` feature; the crates' `tests/layout.rs`
//! call it): its top-level modules import each other without a cycle, nothing reaches into the
//! crate root, the assembled modules (config, metrics) are imported only by the crate roots and
//! the assemblers, and no subsystem imports another's config or metrics. Every `crate::` path
//! counts: `use` lines, grouped imports (`crate::{a, b::c}`) and inline paths in code; comments
//! (doc links too), string literals and a file's unit tests (`#[cfg(test)] mod tests`, at its
//! end) do not. Below the top level, every folder's rooms import each other without a cycle
//! ([`folder_cycles`]).

mod folders;
mod scan;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub use folders::cycles as folder_cycles;
use scan::{code_only, crate_items, crate_paths, without_tests};

/// What a crate's layout allows.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// Modules only the crate roots and `assemblers` may import.
    pub assembled: &'a [&'a str],
    /// Modules that assemble others' sections (they may import config and metrics).
    pub assemblers: &'a [&'a str],
    /// Leaves whose config types other sections embed.
    pub embedded_config: &'a [&'a str],
}

/// Every way `src` (a crate's `src/` directory) breaks `rules`, described.
pub fn problems(src: &Path, rules: &Rules<'_>) -> Vec<String> {
    let (modules, edges) = imports(src);
    let mut problems = Vec::new();
    if modules.is_empty() {
        problems.push(format!("no modules found under {}", src.display()));
    }
    for ((from, to), files) in &edges {
        if to.starts_with("<root>") {
            problems.push(format!("{from} reaches into the crate root ({to}) in {files:?}"));
        } else if rules.assembled.contains(&to.as_str()) && !rules.assemblers.contains(&from.as_str()) {
            problems.push(format!("{from} imports {to} in {files:?}: only the crate roots assemble subsystems"));
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        if modules.contains(to) {
            graph.entry(from.clone()).or_default().insert(to.clone());
        }
    }
    if let Some(cycle) = find_cycle(&graph) {
        let hops: Vec<String> = cycle
            .windows(2)
            .map(|w| format!("{} -> {} ({:?})", w[0], w[1], edges[&(w[0].clone(), w[1].clone())]))
            .collect();
        problems.push(format!("import cycle: {}", hops.join(", ")));
    }
    let mut files = Vec::new();
    source_files(src, &mut files);
    for file in &files {
        let Some(from) = top_module(src, file) else { continue };
        if rules.assemblers.contains(&from.as_str()) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        for item in crate_items(&code_only(without_tests(&text))) {
            let to = item.split("::").next().unwrap_or_default();
            if to != from && !rules.embedded_config.contains(&to) && is_config_or_metrics(&item) {
                let shown = file.strip_prefix(src).unwrap_or(file).display();
                problems.push(format!("{shown}: {from} imports crate::{item}, another subsystem's config or metrics"));
            }
        }
    }
    problems
}

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(read) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = read.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to: `src/spool/writer.rs` is `spool`, `src/tls.rs` is
/// `tls`; `None` for the crate roots.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    match first.strip_suffix(".rs") {
        Some("lib" | "main") => None,
        Some(name) => Some(name.to_owned()),
        None => Some(first),
    }
}

/// Whether `item` (a path under another top-level module) is that module's config or metrics:
/// a `config` or `metrics` module of it, or a type named `...Config` or `...Metrics`.
fn is_config_or_metrics(item: &str) -> bool {
    let segments: Vec<&str> = item.split("::").collect();
    let last = segments.last().copied().unwrap_or_default();
    segments[1..].iter().any(|s| *s == "config" || *s == "metrics")
        || last.ends_with("Config")
        || last.ends_with("Metrics")
}

/// A cycle in `graph`, as the modules along it, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

/// Imports between top-level modules: (from, to), with the files that make each.
type Edges = BTreeMap<(String, String), BTreeSet<String>>;

/// The top-level modules, and every import between them.
fn imports(src: &Path) -> (BTreeSet<String>, Edges) {
    let mut files = Vec::new();
    source_files(src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(src, f)).collect();
    let mut edges = Edges::new();
    for file in &files {
        let Some(from) = top_module(src, file) else { continue };
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        let shown = file.strip_prefix(src).unwrap_or(file).display().to_string();
        for to in crate_paths(&code_only(&text)) {
            // Anything that is not a module is an item of the crate root.
            let to = if modules.contains(&to) { to } else { format!("<root>::{to}") };
            if to != from {
                edges.entry((from.clone(), to)).or_default().insert(shown.clone());
            }
        }
    }
    (modules, edges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_item_checker_expands_groups_and_knows_config_and_metrics() {
        let text = "use crate::broker::metrics::BrokerMetrics;\nuse crate::route::{ClassConfig, Classes, x::{Y, z::W}};\nfn f() { crate::spool::Lane(1); }";
        assert_eq!(
            crate_items(text),
            [
                "broker::metrics::BrokerMetrics",
                "route::ClassConfig",
                "route::Classes",
                "route::x::Y",
                "route::x::z::W",
                "spool::Lane"
            ]
        );
        let flagged: Vec<String> = crate_items(text).into_iter().filter(|i| is_config_or_metrics(i)).collect();
        assert_eq!(flagged, ["broker::metrics::BrokerMetrics", "route::ClassConfig"]);
        assert_eq!(without_tests("a\n#[cfg(test)]\nmod tests {\n use crate::x::YConfig;\n}"), "a\n");
    }

    #[test]
    fn the_checker_sees_grouped_and_inline_paths_not_comments_or_literals_and_cycles() {
        let text = "use crate::{a::X, b, c::{d, e}};\nfn f() { crate::f::g(); }\n/// See [`crate::h::I`].\nuse foo_crate::z;\nconst S: &str = \"crate::i::J\";\nconst R: &str = r#\"crate::k \"q\" \"#;\nfn l<'a>(x: &'a str) -> char { '\"' }\nuse crate::m;\ncrate::metrics! { }";
        assert_eq!(crate_paths(&code_only(text)), ["a", "b", "c", "f", "m"]);
        let graph: BTreeMap<String, BTreeSet<String>> = [
            ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
            ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
            ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
        ]
        .into();
        assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
        let mut acyclic = graph.clone();
        acyclic.remove("c");
        assert_eq!(find_cycle(&acyclic), None);
    }
}
