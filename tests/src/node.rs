//! Edge nodes for tests: in-process (`TestNode`) or as a real `edge-node` process
//! (`EdgeProcess`), each with its own temporary directory and loopback ports.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use edge_node::config::EdgeConfig;
use edge_node::{Node, NodeOptions};
use tempfile::TempDir;

/// The base config of test nodes: one anonymous loopback listener on a free port, metrics on a
/// free port, a fast probe. `extra` is appended (more listeners, auth, ...).
pub fn config_text(extra: &str) -> String {
    format!(
        "node_id = \"test-edge\"\n\
         [http]\nbind = \"127.0.0.1:0\"\n\
         [probe]\ninterval = \"50ms\"\n\
         [[listener]]\nname = \"local\"\nbind = \"127.0.0.1:0\"\nanonymous = true\n\
         {extra}\n"
    )
}

pub struct TestNode {
    pub node: Node,
    pub dir: TempDir,
}

impl TestNode {
    /// Starts a node from `config_text(extra)`, with relative paths resolved in `dir`.
    pub async fn start_in(dir: TempDir, extra: &str) -> TestNode {
        Self::start_with(dir, extra, NodeOptions::default()).await
    }

    /// [`TestNode::start_in`] with options (fault injection).
    pub async fn start_with(dir: TempDir, extra: &str, options: NodeOptions) -> TestNode {
        crate::init_tracing();
        let path = dir.path().join("edge.toml");
        std::fs::write(&path, config_text(extra)).expect("write config");
        let config = EdgeConfig::load(&path).unwrap_or_else(|e| panic!("test config: {e}"));
        let node = Node::start_with(config, options).await.unwrap_or_else(|e| panic!("node start: {e}"));
        TestNode { node, dir }
    }

    pub async fn start(extra: &str) -> TestNode {
        Self::start_in(tempfile::tempdir().expect("tempdir"), extra).await
    }

    pub fn local(&self) -> SocketAddr {
        self.node.mqtt_addr("local").expect("local listener")
    }

    pub fn addr(&self, listener: &str) -> SocketAddr {
        self.node.mqtt_addr(listener).unwrap_or_else(|| panic!("no listener {listener}"))
    }

    pub fn metrics(&self) -> String {
        self.node.metrics().encode()
    }

    pub fn metric(&self, name_and_labels: &str) -> f64 {
        crate::metric(&self.metrics(), name_and_labels).unwrap_or(0.0)
    }
}

/// A real `edge-node run` process, stopped (SIGKILL) on drop if still running.
pub struct EdgeProcess {
    pub child: Child,
    pub dir: PathBuf,
    pub mqtt: Vec<(String, SocketAddr)>,
    pub http: Option<SocketAddr>,
    pub stderr_path: PathBuf,
}

impl EdgeProcess {
    /// Starts `edge-node run --config <dir>/edge.toml` and waits for its ready file.
    pub fn start(dir: &Path, config: &str) -> EdgeProcess {
        Self::start_as(dir, config, &[crate::workspace_bin("edge-node").display().to_string()])
    }

    /// Like [`EdgeProcess::start`] with `command` as the program and its first arguments: an
    /// ARM build under qemu-user, for the hardware-in-the-loop tests.
    pub fn start_as(dir: &Path, config: &str, command: &[String]) -> EdgeProcess {
        Self::try_start_as(dir, config, command).unwrap_or_else(|e| panic!("edge-node {e}"))
    }

    /// [`EdgeProcess::start`] for a node that may not start: why it did not (its stderr).
    pub fn try_start(dir: &Path, config: &str) -> Result<EdgeProcess, String> {
        Self::try_start_as(dir, config, &[crate::workspace_bin("edge-node").display().to_string()])
    }

    /// [`EdgeProcess::start`] with `env` set for the process.
    pub fn start_with_env(dir: &Path, config: &str, env: &[(&str, &std::ffi::OsStr)]) -> EdgeProcess {
        let command = [crate::workspace_bin("edge-node").display().to_string()];
        Self::try_start_env(dir, config, &command, env).unwrap_or_else(|e| panic!("edge-node {e}"))
    }

    fn try_start_as(dir: &Path, config: &str, command: &[String]) -> Result<EdgeProcess, String> {
        Self::try_start_env(dir, config, command, &[])
    }

    fn try_start_env(
        dir: &Path,
        config: &str,
        command: &[String],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<EdgeProcess, String> {
        let config_path = dir.join("edge.toml");
        std::fs::write(&config_path, config).expect("write config");
        let stderr_path = dir.join("edge.stderr");
        let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
        let mut program = Command::new(&command[0]);
        program.args(&command[1..]);
        program.envs(env.iter().copied());
        // Emulated builds start slower.
        let ready = dir.join("ready.json");
        let started = crate::run_until_ready(program, &config_path, &ready, stderr, "info", Duration::from_secs(60));
        let (child, doc) =
            started.map_err(|e| format!("{e}:\n{}", std::fs::read_to_string(&stderr_path).unwrap_or_default()))?;
        let mqtt = doc["mqtt"].as_object().map_or_else(Vec::new, |map| {
            map.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().parse().unwrap())).collect()
        });
        let http = doc["http"].as_str().and_then(|s| s.parse().ok());
        Ok(EdgeProcess { child, dir: dir.to_owned(), mqtt, http, stderr_path })
    }

    pub fn addr(&self, listener: &str) -> SocketAddr {
        self.mqtt.iter().find(|(n, _)| n == listener).map(|(_, a)| *a).expect("listener")
    }

    /// The value of a metric from the process's `/metrics`, 0 when absent.
    pub fn metric(&self, name_and_labels: &str) -> f64 {
        let text = crate::http_get(self.http.expect("http endpoint"), "/metrics");
        crate::metric(&text, name_and_labels).unwrap_or(0.0)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The process's resident set size now, bytes.
    pub fn rss(&self) -> u64 {
        crate::rss_of(self.child.id())
    }

    pub fn signal(&self, signal: &str) {
        let status =
            Command::new("kill").arg(format!("-{signal}")).arg(self.child.id().to_string()).status().expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit; `None` if it is still running after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for EdgeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
