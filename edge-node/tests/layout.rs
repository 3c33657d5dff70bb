//! The layout rule, checked on the source: edge-node's top-level modules import each other
//! without a cycle, and only `lib.rs` and `main.rs` assemble subsystems, so no subsystem reaches
//! into another's config or metrics, nor into the crate root. Every `crate::` path counts: `use`
//! lines, grouped imports (`crate::{a, b::c}`), inline paths in code and in doc links.
//! docs/ARCHITECTURE.md states the rule; this test keeps it true.

// A test: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules only the assemblers may import: `lib.rs`, `main.rs`, and `config`, which assembles
/// the file from the sections each subsystem owns (`[http]` is the metrics endpoint's).
const ASSEMBLED: &[&str] = &["config", "metrics"];

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
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
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    match first.strip_suffix(".rs") {
        Some("lib" | "main") => None,
        Some(name) => Some(name.to_owned()),
        None => Some(first),
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first segment of every path that follows `crate::` in `text`, groups expanded.
fn crate_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        // `edge_node::crate::` does not occur; `foo_crate::x` would be another crate's path.
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(is_ident) {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // The group's top-level items, up to its closing brace.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.push(first_segment(&item));
        } else {
            out.push(first_segment(rest));
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

fn first_segment(path: &str) -> String {
    path.trim_start().chars().take_while(|c| is_ident(*c)).collect()
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
        let text = std::fs::read_to_string(file).unwrap();
        let shown = file.strip_prefix(src).unwrap().display().to_string();
        for to in crate_paths(&text) {
            // Anything that is not a module is an item of the crate root.
            let to = if modules.contains(&to) { to } else { format!("<root>::{to}") };
            if to != from {
                edges.entry((from.clone(), to)).or_default().insert(shown.clone());
            }
        }
    }
    (modules, edges)
}

#[test]
fn top_level_modules_import_without_cycles_and_only_roots_assemble() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (modules, edges) = imports(&src);
    assert!(modules.contains("spool") && modules.contains("uplink"), "found modules {modules:?}");

    let mut problems = Vec::new();
    for ((from, to), files) in &edges {
        if to.starts_with("<root>") {
            problems.push(format!("{from} reaches into the crate root ({to}) in {files:?}"));
        } else if ASSEMBLED.contains(&to.as_str()) && from != "config" {
            problems.push(format!("{from} imports {to} in {files:?}: only lib.rs and main.rs assemble subsystems"));
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
    assert!(problems.is_empty(), "layout rule broken:\n{}", problems.join("\n"));
}

#[test]
fn the_checker_sees_grouped_inline_and_doc_paths_and_cycles() {
    let text =
        "use crate::{a::X, b, c::{d, e}};\nfn f() { crate::f::g(); }\n/// See [`crate::h::I`].\nuse foo_crate::z;";
    assert_eq!(crate_paths(text), ["a", "b", "c", "f", "h"]);
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
