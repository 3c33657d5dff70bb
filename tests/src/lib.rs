//! Support code for the cross-process tests: certificates, edge nodes started in-process or as
//! a real process, and MQTT clients. Every server binds port 0 on loopback and every file lives
//! in a temporary directory.

pub mod certs;
pub mod client;
pub mod node;

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Path of a binary of this workspace (`edge-node`, `cloud-bridge`), built by `cargo build
/// --bins` before the tests run (the test script does this).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = profile_dir.join(name);
    assert!(bin.exists(), "{} is missing: run `cargo build --bins` first (scripts/test.sh does)", bin.display());
    bin
}

/// Polls `check` until it is true or `timeout` passes; returns whether it became true.
pub async fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of one metric line (exact name and labels) in Prometheus text.
pub fn metric(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Sets up tracing once for a test binary; `RUST_LOG` controls it.
/// Sets up tracing once for a test binary as `edge-node run` does (with the layer that counts
/// rumqttd's slow-subscriber skips); `RUST_LOG` controls the output.
pub fn init_tracing() {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_test_writer().with_filter(filter))
        .with(edge_node::broker_log::layer())
        .try_init();
}
