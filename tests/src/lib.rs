//! Support code for the cross-process tests: certificates, edge nodes started in-process or as
//! a real process, and MQTT clients. Every server binds port 0 on loopback and every file lives
//! in a temporary directory.

pub mod certs;
pub mod client;
pub mod cloud;
pub mod fixtures;
pub mod fleet;
pub mod kafka;
pub mod nats;
pub mod node;
pub mod quic;
pub mod raw;
pub mod relay;
pub mod sim;
pub mod simedge;

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The workspace's top directory.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Path of a binary of this workspace (`edge-node`, `cloud-bridge`), built by `cargo build
/// --bins` before the tests run (the test script does this).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>; a benchmark binary is in
    // target/<profile> itself.
    let parent = exe.parent().expect("target dir");
    let profile_dir = if parent.ends_with("deps") { parent.parent().expect("target dir") } else { parent };
    let bin = profile_dir.join(name);
    assert!(bin.exists(), "{} is missing: run `cargo build --bins` first (scripts/test.sh does)", bin.display());
    bin
}

/// A loopback TCP port free right now, for processes that must be found on the same port after
/// a restart (an OS-chosen port 0 would change).
///
/// Chosen at random below the kernel's ephemeral range, not by binding port 0: a port 0 gives
/// out is an ephemeral one, which the kernel hands to the next outgoing connection as readily,
/// and with the suite's hundreds of loopback connections a process started on it a moment
/// later found it taken (an edge's listener, a Kafka node restarted in a chaos test).
pub fn free_port() -> u16 {
    use rand::Rng;
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = if low > 12_000 { (10_000, low) } else { (49_152, 65_535) };
    let mut rng = rand::thread_rng();
    for _ in 0..1000 {
        let port = rng.gen_range(from..to);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free loopback port in {from}..{to}")
}

/// The resident set size of process `pid`, bytes (0 if it is gone).
pub fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Samples a process's RSS every 10 ms on a thread of its own until dropped; the peak.
pub struct PeakRss {
    peak: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl PeakRss {
    pub fn start(pid: u32) -> Self {
        use std::sync::atomic::Ordering;
        let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss_of(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        PeakRss { peak, stop }
    }

    /// The highest RSS seen so far, bytes.
    pub fn peak(&self) -> u64 {
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for PeakRss {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
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
/// `GET path` over plain HTTP/1.0; the body, or an empty string if the endpoint is down.
/// Runs `command run --config <config> --ready-file <ready>` (edge-node and cloud-bridge take
/// both), its stdout dropped and its stderr to `stderr`, with `RUST_LOG` as the command or the
/// test's environment sets it, or `log`, and
/// waits up to `timeout` for the ready file; the child and the file's JSON.
pub fn run_until_ready(
    mut command: std::process::Command,
    config: &std::path::Path,
    ready: &std::path::Path,
    stderr: std::fs::File,
    log: &str,
    timeout: Duration,
) -> anyhow::Result<(std::process::Child, serde_json::Value)> {
    let _ = std::fs::remove_file(ready);
    // A caller that set RUST_LOG for the process (even empty: unset) keeps it.
    if !command.get_envs().any(|(k, _)| k == "RUST_LOG") {
        command.env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| log.into()));
    }
    let mut child = command
        .args(["run", "--config"])
        .arg(config)
        .arg("--ready-file")
        .arg(ready)
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()?;
    let deadline = Instant::now() + timeout;
    loop {
        // Parsed until it parses: a reader may see the file before it is all written.
        if let Ok(text) = std::fs::read_to_string(ready)
            && let Ok(doc) = serde_json::from_str(&text)
        {
            return Ok((child, doc));
        }
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("exited with {status} before it was ready");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            anyhow::bail!("not ready in {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

/// A health endpoint's status code and its JSON (`/healthz`, `/readyz`); `(0, Null)` if it
/// cannot be reached.
pub fn health(addr: std::net::SocketAddr, path: &str) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return (0, serde_json::Value::Null);
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
}

/// The check named `name` in a health endpoint's JSON: whether it passed, and its detail.
pub fn health_check(json: &serde_json::Value, name: &str) -> Option<(bool, String)> {
    let check = json["checks"].as_array()?.iter().find(|c| c["name"] == name)?;
    Some((check["ok"].as_bool()?, check["detail"].as_str()?.to_owned()))
}

pub fn metric(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The sum of a metric family's samples over every label set (`name{...} value` lines).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{')?.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .sum()
}

/// PUBLISH packets an edge took from clients, every class together (not the node's own).
pub fn client_publishes(text: &str) -> f64 {
    let internal = metric(text, "edge_mqtt_publish_in_total{class=\"internal\"}").unwrap_or(0.0);
    metric_sum(text, "edge_mqtt_publish_in_total") - internal
}

/// Sets up tracing once for a test binary; `RUST_LOG` controls the output.
pub fn init_tracing() {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    let captured = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(|| CapturedLogs)
        .with_filter(tracing_subscriber::filter::LevelFilter::WARN);
    let _ = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_test_writer().with_filter(filter))
        .with(captured)
        .try_init();
}

static LOGS: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

/// Warnings and errors logged by in-process nodes so far (each test runs in its own process
/// under nextest, so these are this test's).
pub fn captured_logs() -> String {
    String::from_utf8_lossy(&LOGS.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

struct CapturedLogs;

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
