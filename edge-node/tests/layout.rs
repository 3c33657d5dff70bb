//! edge-node's layout rule (`shared::layout`), checked on its source: its top-level modules
//! import each other without a cycle, and only `lib.rs` and `main.rs` assemble subsystems, so
//! no subsystem reaches into another's config or metrics, nor into the crate root.
//! docs/ARCHITECTURE.md states the rule; this test keeps it true.

use std::path::Path;

use shared::layout::{Rules, folder_cycles, problems};

#[test]
fn top_level_modules_import_without_cycles_and_only_roots_assemble() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rules = Rules {
        // `config` assembles the file from the sections each subsystem owns (`[http]` is the
        // metrics endpoint's).
        assembled: &["config", "metrics"],
        assemblers: &["config"],
        // `tls` is `[listener.tls]` inside a listener's section.
        embedded_config: &["tls"],
    };
    let problems = problems(&src, &rules);
    assert!(problems.is_empty(), "layout rule broken:\n{}", problems.join("\n"));
}

/// Below the top level, each folder's files and subfolders import each other without a cycle;
/// in `sink/` its `mod.rs` too, since the concern traits there stand above every backend.
#[test]
fn every_folder_imports_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = folder_cycles(&src, &[]);
    assert!(found.is_empty(), "layout rule broken:\n{}", found.join("\n"));
}
