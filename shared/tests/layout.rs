//! shared's layout rule (`shared::layout`), checked on its own source: its top-level modules
//! import each other without a cycle, nothing reaches into the crate root, and no folder's
//! files import each other in a cycle. It has no config or metrics to assemble.

#![cfg(feature = "fs")]

use std::path::Path;

use shared::layout::{Rules, folder_cycles, problems};

#[test]
fn modules_and_folders_import_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rules = Rules { assembled: &[], assemblers: &[], embedded_config: &[] };
    let mut found = problems(&src, &rules);
    found.extend(folder_cycles(&src, &[]));
    assert!(found.is_empty(), "layout rule broken:\n{}", found.join("\n"));
}
