//! cloud-bridge's layout rule (`shared::layout`), checked on its source: its top-level modules
//! import each other without a cycle, nothing reaches into the crate root, and only `lib.rs`,
//! `main.rs` and the assemblers (`config`, which holds the file's sections; `metrics`, which
//! holds the registry) put subsystems together, so no subsystem imports another's config or
//! metrics.
//!
//! Each subsystem owns its section (`server::config`, `sink::config`, `models::config`,
//! `limits`, `fleet`) and its metrics (`server::metrics`, `sink::SinkMetrics`, ...); `config`
//! and `metrics` only assemble them, and the crate roots hand each subsystem its own.

use std::path::Path;

use shared::layout::{Rules, folder_cycles, problems};

#[test]
fn top_level_modules_import_without_cycles_and_only_roots_assemble() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rules = Rules { assembled: &["config", "metrics"], assemblers: &["config", "metrics"], embedded_config: &[] };
    let found = problems(&src, &rules);
    assert!(found.is_empty(), "layout rule broken:\n{}", found.join("\n"));
}

/// Below the top level, each folder's files and subfolders import each other without a cycle;
/// in `sink/` its `mod.rs` too, since the concern traits there stand above every backend.
#[test]
fn every_folder_imports_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = folder_cycles(&src, &["sink"]);
    assert!(found.is_empty(), "layout rule broken:\n{}", found.join("\n"));
}
