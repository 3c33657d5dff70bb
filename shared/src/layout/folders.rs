//! The no-cycle rule below the top level: in every folder of a crate, its rooms (each file and
//! each subfolder) import each other without a cycle.
//!
//! A file's imports are the paths it names, resolved to the module they reach: `crate::a::b`,
//! `super::x` (from the file's own module), `self::x`, and a module the file declares
//! (`mod x;`, then `x::Y`). A path into a folder's module is an import of the room of its next
//! segment: `crate::sink::jetstream::X` is `sink`'s room `jetstream`, and `crate::sink::Retry`
//! an item of `sink/mod.rs` itself (room `mod`). A re-export (`pub use`) hands a name on and
//! imports nothing. A folder's `mod.rs` is its face: what its children share may live there,
//! so arrows to and from it are not counted, except in the folders named strict, where it is a
//! room like the others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::scan::{code_only, expand, is_ident, without_tests};

/// Every import cycle between the rooms of a folder under `src` (a crate's `src/`), described;
/// `strict` folders (paths under `src`, such as `"sink"`) count their `mod.rs` as a room.
pub fn cycles(src: &Path, strict: &[&str]) -> Vec<String> {
    let mut folders = Vec::new();
    subfolders(src, &mut folders);
    let mut problems = Vec::new();
    for folder in folders {
        let rel = folder.strip_prefix(src).unwrap_or(&folder).to_path_buf();
        let module: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        let shown = rel.display().to_string();
        let strict = strict.contains(&shown.as_str());
        let edges = room_imports(src, &folder, &module, strict);
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges.keys() {
            graph.entry(from.clone()).or_default().insert(to.clone());
        }
        if let Some(cycle) = super::find_cycle(&graph) {
            let hops: Vec<String> = cycle
                .windows(2)
                .map(|w| format!("{} -> {} ({:?})", w[0], w[1], edges[&(w[0].clone(), w[1].clone())]))
                .collect();
            problems.push(format!("import cycle in {shown}/: {}", hops.join(", ")));
        }
    }
    problems
}

fn subfolders(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(read) = std::fs::read_dir(dir) else { return };
    let mut dirs: Vec<PathBuf> = read.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()).collect();
    dirs.sort();
    for d in dirs {
        out.push(d.clone());
        subfolders(&d, out);
    }
}

/// Imports between the rooms of `folder` (whose module path is `module`), with the files that
/// make each.
fn room_imports(src: &Path, folder: &Path, module: &[String], strict: bool) -> super::Edges {
    let mut files = Vec::new();
    super::source_files(folder, &mut files);
    let rooms = rooms(folder);
    let mut edges = super::Edges::new();
    for file in &files {
        let Some(from) = room_of(folder, file) else { continue };
        if is_test_file(file) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        let own = module_of(src, file);
        let code = code_only(without_tests(&text));
        let shown = file.strip_prefix(src).unwrap_or(file).display().to_string();
        for path in imports(&own, &code) {
            let Some(rest) = path.strip_prefix(module).filter(|r| !r.is_empty()) else { continue };
            let to = if rooms.contains(&rest[0]) { rest[0].clone() } else { "mod".to_owned() };
            if to != from && (strict || (from != "mod" && to != "mod")) {
                edges.entry((from.clone(), to)).or_default().insert(shown.clone());
            }
        }
    }
    edges
}

/// A file of unit tests (`tests.rs`, `*_tests.rs`, or under a `tests/` folder): a test may
/// drive any part it tests.
fn is_test_file(file: &Path) -> bool {
    let name = file.file_stem().and_then(|n| n.to_str()).unwrap_or_default();
    name == "tests" || name.ends_with("_tests") || file.components().any(|c| c.as_os_str() == "tests")
}

/// The rooms of `folder`: its files' stems (`mod.rs` is `mod`) and its subfolders' names.
fn rooms(folder: &Path) -> BTreeSet<String> {
    let Ok(read) = std::fs::read_dir(folder) else { return BTreeSet::new() };
    read.filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            if p.is_dir() {
                p.file_name().map(|n| n.to_string_lossy().into_owned())
            } else if p.extension().is_some_and(|e| e == "rs") {
                p.file_stem().map(|n| n.to_string_lossy().into_owned())
            } else {
                None
            }
        })
        .collect()
}

/// The room of `folder` that `file` is in.
fn room_of(folder: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(folder).ok()?.components().next()?.as_os_str().to_str()?.to_owned();
    Some(first.strip_suffix(".rs").unwrap_or(&first).to_owned())
}

/// The module path of `file`: `src/sink/jetstream/records.rs` is `sink::jetstream::records`,
/// `src/sink/mod.rs` is `sink`, the crate roots are empty.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut segments: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if matches!(segments.last().map(String::as_str), Some("mod"))
        || matches!(segments[..], [ref r] if r == "lib" || r == "main")
    {
        segments.pop();
    }
    segments
}

/// Every path `code` (of the module `own`) names, resolved from the crate root. Re-exports are
/// left out.
fn imports(own: &[String], code: &str) -> Vec<Vec<String>> {
    let declared = declared_modules(code);
    let reexports = reexport_spans(code);
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let starts_token = i == 0 || !(is_ident(bytes[i - 1] as char) || bytes[i - 1] == b':');
        let ident: String = code[i..].chars().take_while(|c| is_ident(*c)).collect();
        if ident.is_empty() || !starts_token {
            i += ident.len().max(1);
            while i < code.len() && !code.is_char_boundary(i) {
                i += 1;
            }
            continue;
        }
        let after = i + ident.len();
        let base: Option<(Vec<String>, usize)> = if !code[after..].starts_with("::") {
            None
        } else if ident == "crate" {
            Some((Vec::new(), after + 2))
        } else if ident == "self" {
            Some((own.to_vec(), after + 2))
        } else if ident == "super" {
            let mut base = own.to_vec();
            let mut at = i;
            while code[at..].starts_with("super::") {
                base.pop();
                at += "super::".len();
            }
            Some((base, at))
        } else if declared.contains(&ident) {
            Some((own.to_vec(), i))
        } else {
            None
        };
        let Some((base, at)) = base else {
            i = after;
            continue;
        };
        let mut items = Vec::new();
        let read = if code[at..].starts_with('{') {
            expand("", &code[at - 2..], &mut items)
        } else {
            expand("", &code[at..], &mut items)
        };
        if !reexports.iter().any(|r| r.contains(&i)) {
            for item in items {
                let mut path = base.clone();
                path.extend(item.split("::").filter(|s| !s.is_empty() && *s != "self").map(str::to_owned));
                out.push(path);
            }
        }
        i = at + read.max(1);
    }
    out
}

/// The modules `code` declares (`mod x;`, any visibility).
fn declared_modules(code: &str) -> BTreeSet<String> {
    code.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l
                .strip_prefix("pub")
                .map_or(l, |r| r.trim_start().strip_prefix('(').map_or(r, |r| r.split_once(')').map_or(r, |(_, r)| r)));
            l.trim_start().strip_prefix("mod ")?.strip_suffix(';').map(|m| m.trim().to_owned())
        })
        .collect()
}

/// Where the re-exports (`pub use ...;`, `pub(...) use ...;`) of `code` stand.
fn reexport_spans(code: &str) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("pub") {
        let start = from + at;
        from = start + 3;
        if start > 0 && is_ident(code.as_bytes()[start - 1] as char) {
            continue;
        }
        let mut rest = code[from..].trim_start();
        if rest.starts_with('(') {
            rest = rest.split_once(')').map_or("", |(_, r)| r).trim_start();
        }
        if rest.starts_with("use ") {
            let end = code[start..].find(';').map_or(code.len(), |e| start + e);
            out.push(start..end);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, files: &[(&str, &str)]) {
        for (path, text) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    #[test]
    fn a_cycle_between_rooms_of_a_folder_is_found_at_any_depth_and_reexports_are_not_imports() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        write(
            src,
            &[
                ("lib.rs", "pub mod sink;"),
                ("sink/mod.rs", "mod a;\npub mod b;\npub use a::A;\nuse std::fmt;\npub trait T {}"),
                ("sink/a.rs", "use super::T;\npub struct A;"),
                ("sink/b/mod.rs", "mod c;\nmod d;\nfn f() { c::C; }"),
                ("sink/b/c.rs", "use super::d::D;\npub struct C;"),
                ("sink/b/d.rs", "/// Not [`super::c::C`].\npub struct D;\nconst S: &str = \"crate::sink::b::c\";"),
            ],
        );
        assert_eq!(
            cycles(src, &["sink"]),
            Vec::<String>::new(),
            "a re-export, a doc link and a literal import nothing"
        );
        write(src, &[("sink/b/d.rs", "pub struct D;\nfn g() { crate::sink::b::c::C; }")]);
        let found = cycles(src, &["sink"]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("import cycle in sink/b/: c -> d"), "{found:?}");
        // In a strict folder, mod.rs is a room: an item of it taken by a room it imports.
        write(
            src,
            &[("sink/b/d.rs", "pub struct D;"), ("sink/mod.rs", "mod a;\npub mod b;\nuse a::A;\npub trait T {}")],
        );
        let found = cycles(src, &["sink"]);
        assert!(found.len() == 1 && found[0].starts_with("import cycle in sink/: a -> mod"), "{found:?}");
        assert_eq!(cycles(src, &[]), Vec::<String>::new(), "elsewhere mod.rs is the folder's face");
    }
}
