//! cloud-bridge's layout rule (`shared::layout`), checked on its source: its top-level modules
//! import each other without a cycle, nothing reaches into the crate root, and only `lib.rs`,
//! `main.rs` and the assemblers (`config`, which holds the file's sections; `metrics`, which
//! holds the registry) put subsystems together, so no subsystem imports another's config or
//! metrics.
//!
//! cloud-bridge grew before the rule: its sections live in `config.rs` and the session server
//! takes the bridge's one `Metrics`. What breaks the rule today is listed in `KNOWN`, exactly:
//! a new break fails this test, and so does a listed one that is gone (take it off the list).
//! Moving each section and metrics family into the subsystem that owns it empties the list.

use std::path::Path;

use shared::layout::{Rules, problems};

const KNOWN: &[&str] = &[
    "fleet imports config in {\"fleet/view.rs\"}: only the crate roots assemble subsystems",
    "models imports config in {\"models/mod.rs\"}: only the crate roots assemble subsystems",
    "server imports config in {\"server/mod.rs\"}: only the crate roots assemble subsystems",
    "server imports metrics in {\"server/mod.rs\", \"server/session.rs\"}: only the crate roots assemble subsystems",
    "tco imports config in {\"tco.rs\"}: only the crate roots assemble subsystems",
    "import cycle: config -> fleet ({\"config.rs\"}), fleet -> config ({\"fleet/view.rs\"})",
    "fleet/view.rs: fleet imports crate::config::SinkConfig, another subsystem's config or metrics",
    "models/mod.rs: models imports crate::config::CloudConfig, another subsystem's config or metrics",
    "models/mod.rs: models imports crate::config::SinkConfig, another subsystem's config or metrics",
    "server/mod.rs: server imports crate::config::ServerConfig, another subsystem's config or metrics",
    "server/mod.rs: server imports crate::limits::LimitsConfig, another subsystem's config or metrics",
    "server/mod.rs: server imports crate::metrics::Metrics, another subsystem's config or metrics",
    "server/session.rs: server imports crate::metrics::Metrics, another subsystem's config or metrics",
    "tco.rs: tco imports crate::config::SinkConfig, another subsystem's config or metrics",
];

#[test]
fn top_level_modules_import_without_cycles_and_only_roots_assemble() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rules = Rules { assembled: &["config", "metrics"], assemblers: &["config", "metrics"], embedded_config: &[] };
    let found = problems(&src, &rules);
    let new: Vec<&String> = found.iter().filter(|p| !KNOWN.contains(&p.as_str())).collect();
    let gone: Vec<&&str> = KNOWN.iter().filter(|k| !found.iter().any(|p| p == *k)).collect();
    assert!(new.is_empty(), "layout rule broken:\n{}", new.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"));
    assert!(gone.is_empty(), "fixed, take them off KNOWN: {gone:?}");
}
