//! Hardware-in-the-loop harness: the aarch64 `edge-node` under qemu-user, an x86 `cloud-bridge`
//! (in process) on a real nats-server's JetStream, the QUIC link between them through the test
//! UDP relay, and local MQTT load on the emulated edge:
//!
//! - inference results, QoS1, published at a steady rate (1,000 msg/s in the full run) and
//!   received back by a local subscriber, which measures publish-to-deliver latency;
//! - telemetry, QoS1 on a `full` class (PUBACK after the spool commit), published one after
//!   another; every acknowledged message must end up in JetStream exactly once.
//!
//! `HIL_SCALE=full` runs the scenarios at the lengths (`hil/run.sh`); anything else is
//! the short smoke version CI runs. Each scenario appends a JSON line to the report file
//! (`HIL_REPORT`, default `hil/reports/last.jsonl`). The emulated binary is `HIL_EDGE_BIN`, or
//! built with `scripts/cross-build.sh <target> hil`. `HIL_TARGET` picks the device
//! architecture: `aarch64-unknown-linux-gnu` (the default, and CI's) or
//! `armv7-unknown-linux-gnueabihf` (run on demand: a second cold cross build does not fit CI's
//! budget).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cloud_bridge::models::dir::DirStore;
use e2e_tests::cloud::{TestCloud, pki};
use e2e_tests::fixtures::{class, telemetry, with_spool};
use e2e_tests::nats::NatsServer;
use e2e_tests::node::EdgeProcess;
use e2e_tests::relay::UdpRelay;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use shared::model::SigningKey;
use tokio::task::JoinHandle;

pub const MODEL: &str = "hil-model";

/// Whether this is the full run (`HIL_SCALE=full`) rather than the CI smoke run.
pub fn full() -> bool {
    std::env::var("HIL_SCALE").is_ok_and(|s| s == "full")
}

/// `smoke` in the CI run, `full` in the full one.
pub fn scaled(smoke: Duration, full_length: Duration) -> Duration {
    if full() { full_length } else { smoke }
}

/// A device architecture the edge is emulated as.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Rust's name for it.
    pub triple: &'static str,
    /// The qemu-user emulator.
    pub qemu: &'static str,
    /// Debian's name for it (the .deb's architecture).
    pub debian: &'static str,
    /// The OCI image config's name for it (Go's GOARCH).
    pub oci: &'static str,
    /// GNU's name: the cross sysroot is `/usr/<gnu>`, an image's libraries are in `lib/<gnu>`.
    pub gnu: &'static str,
}

const TARGETS: [Target; 2] = [
    Target {
        triple: "aarch64-unknown-linux-gnu",
        qemu: "qemu-aarch64",
        debian: "arm64",
        oci: "arm64",
        gnu: "aarch64-linux-gnu",
    },
    Target {
        triple: "armv7-unknown-linux-gnueabihf",
        qemu: "qemu-arm",
        debian: "armhf",
        oci: "arm",
        gnu: "arm-linux-gnueabihf",
    },
];

/// The target of this run: `HIL_TARGET`, aarch64 without it.
pub fn target() -> Target {
    let wanted = std::env::var("HIL_TARGET").unwrap_or_else(|_| TARGETS[0].triple.into());
    let names: Vec<&str> = TARGETS.iter().map(|t| t.triple).collect();
    TARGETS
        .into_iter()
        .find(|t| t.triple == wanted)
        .unwrap_or_else(|| panic!("HIL_TARGET={wanted} is not one of {names:?}"))
}

/// The command that runs the target's edge-node under qemu-user. Without `LD_LIBRARY_PATH`
/// the loader mixes the host's and the target's glibc and any program that starts a thread
/// hangs.
pub fn edge_command() -> Vec<String> {
    let target = target();
    let bin = match std::env::var("HIL_EDGE_BIN") {
        Ok(b) => PathBuf::from(b),
        Err(_) => {
            let root = e2e_tests::workspace_root();
            let out = std::process::Command::new(root.join("scripts/cross-build.sh"))
                .args([target.triple, "hil", "edge-node"])
                .current_dir(&root)
                .output()
                .expect("run scripts/cross-build.sh");
            assert!(out.status.success(), "cross build failed:\n{}", String::from_utf8_lossy(&out.stderr));
            root.join(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    assert!(bin.exists(), "{} does not exist", bin.display());
    let sysroot = format!("/usr/{}", target.gnu);
    [target.qemu.to_owned(), "-L".into(), sysroot.clone(), "-E".into(), format!("LD_LIBRARY_PATH={sysroot}/lib")]
        .into_iter()
        .chain([bin.display().to_string()])
        .collect()
}

/// Everything a scenario runs against.
pub struct Rig {
    pub nats: NatsServer,
    pub cloud: TestCloud,
    pub relay: UdpRelay,
    pub edge: Option<EdgeProcess>,
    pub edge_dir: PathBuf,
    pub mqtt: SocketAddr,
    pub models: DirStore,
    pub key: SigningKey,
    pub started: Instant,
    config: String,
    command: Vec<String>,
    dir: tempfile::TempDir,
}

impl Rig {
    pub async fn start() -> Rig {
        let command = edge_command();
        let nats = NatsServer::start();
        let dir = tempfile::tempdir().expect("tempdir");
        let keys = pki(dir.path(), &[]);
        let (private, public, _) = cloud_bridge::models::keygen(&dir.path().join("keys")).expect("model key");
        let store_dir = dir.path().join("model-store");
        let extra = format!(
            "\n[models]\ndir = \"{}\"\nsigning_key = \"{}\"\npoll = \"500ms\"\n",
            store_dir.display(),
            private.display()
        );
        let sink = format!("kind = \"jetstream\"\nurl = \"{}\"\n", nats.url());
        let cloud = TestCloud::start_with_sink(
            dir.path(),
            keys,
            "127.0.0.1:0".parse().unwrap(),
            &extra,
            &sink,
            dir.path().join("unused"),
        )
        .await;
        let relay = UdpRelay::start(cloud.bridge.quic_addr()).await;
        let edge_dir = dir.path().join("edge");
        std::fs::create_dir_all(&edge_dir).expect("edge dir");
        let mqtt: SocketAddr = format!("127.0.0.1:{}", e2e_tests::free_port()).parse().unwrap();
        let http = e2e_tests::free_port();
        // Fixed ports: a restarted edge is found where the load generators left it.
        let config = format!(
            "node_id = \"hil-edge\"\n[http]\nbind = \"127.0.0.1:{http}\"\n\
             [[listener]]\nname = \"local\"\nbind = \"{mqtt}\"\nanonymous = true\n\
             {}\n{}\n[models]\ndir = \"models\"\npublic_key = \"{}\"\nfollow = [\"{MODEL}\"]\n",
            with_spool(
                &[class("inference", "inference/#", "edge-direct"), telemetry().priority(3).durability("full"),]
            ),
            cloud.uplink_section_via("edge-1", relay.addr),
            public.display()
        );
        Rig {
            nats,
            cloud,
            relay,
            edge: None,
            edge_dir,
            mqtt,
            models: DirStore::open(&store_dir).expect("model store"),
            key: cloud_bridge::models::signing_key(&private).expect("signing key"),
            started: Instant::now(),
            config,
            command,
            dir,
        }
    }

    pub fn start_edge(&mut self) {
        self.edge = Some(EdgeProcess::start_as(&self.edge_dir, &self.config, &self.command));
    }

    pub fn edge(&self) -> &EdgeProcess {
        self.edge.as_ref().expect("edge running")
    }

    /// SIGKILLs the emulated edge (qemu and the program in it are one process).
    pub fn kill_edge(&mut self) {
        if let Some(mut edge) = self.edge.take() {
            edge.signal("KILL");
            edge.wait_exit(Duration::from_secs(10)).expect("edge killed");
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Microseconds since the rig started: the clock payloads carry.
    pub fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }
}

/// Local load on the emulated edge until [`Load::stop`].
pub struct Load {
    stop: Arc<AtomicBool>,
    inference: JoinHandle<u64>,
    subscriber: JoinHandle<Vec<(u64, u64)>>,
    telemetry: JoinHandle<Vec<String>>,
    pub telemetry_acked: Arc<AtomicU64>,
}

/// What the load saw.
#[derive(Debug, Default)]
pub struct LoadResult {
    pub inference_sent: u64,
    /// (sent at, latency), microseconds on the rig's clock.
    pub latencies: Vec<(u64, u64)>,
    /// Telemetry payloads the edge acknowledged (after its spool commit).
    pub telemetry_acked: Vec<String>,
}

impl Load {
    /// Inference at `rate` msg/s and telemetry as fast as it is acknowledged.
    pub async fn start(rig: &Rig, rate: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let started = rig.started;
        let (subscribed, suback) = tokio::sync::oneshot::channel();
        let subscriber = tokio::spawn(subscribe(rig.mqtt, started, stop.clone(), subscribed));
        // The subscription is in place before the first result.
        tokio::time::timeout(Duration::from_secs(10), suback)
            .await
            .expect("no SUBACK for the inference subscriber in 10 s")
            .expect("the inference subscriber stopped");
        let inference = tokio::spawn(publish_inference(rig.mqtt, rate, started, stop.clone()));
        let telemetry_acked = Arc::new(AtomicU64::new(0));
        let telemetry = tokio::spawn(publish_telemetry(rig.mqtt, stop.clone(), telemetry_acked.clone()));
        Load { stop, inference, subscriber, telemetry, telemetry_acked }
    }

    pub async fn stop(self) -> LoadResult {
        self.stop.store(true, Ordering::Relaxed);
        LoadResult {
            inference_sent: self.inference.await.unwrap_or(0),
            telemetry_acked: self.telemetry.await.unwrap_or_default(),
            latencies: self.subscriber.await.unwrap_or_default(),
        }
    }
}

fn options(addr: SocketAddr, id: &str) -> MqttOptions {
    let mut o = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    o.set_keep_alive(Duration::from_secs(5));
    o.set_inflight(100);
    o
}

async fn publish_inference(addr: SocketAddr, rate: u64, started: Instant, stop: Arc<AtomicBool>) -> u64 {
    let (client, mut eventloop) = AsyncClient::new(options(addr, "hil-inference-pub"), 10_000);
    // The event loop reconnects on its next poll after an error.
    let driver = tokio::spawn(async move {
        loop {
            if eventloop.poll().await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let per_tick = (rate / 100).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        for _ in 0..per_tick {
            let now = started.elapsed().as_micros() as u64;
            // Results that cannot be queued (edge down, queue full) are not sent: a camera
            // drops frames rather than waiting.
            if client.try_publish("inference/yolo/v1/cam-1", QoS::AtLeastOnce, false, now.to_string()).is_ok() {
                sent += 1;
            }
        }
    }
    driver.abort();
    sent
}

/// Collects inference results until `stop`; `subscribed` fires at the first SUBACK.
async fn subscribe(
    addr: SocketAddr,
    started: Instant,
    stop: Arc<AtomicBool>,
    subscribed: tokio::sync::oneshot::Sender<()>,
) -> Vec<(u64, u64)> {
    let (client, mut eventloop) = AsyncClient::new(options(addr, "hil-inference-sub"), 100);
    let mut subscribed = Some(subscribed);
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(Duration::from_millis(200), eventloop.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => {
                // A restarted broker has no subscriptions.
                let _ = client.try_subscribe("inference/#", QoS::AtLeastOnce);
            }
            Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => {
                if let Some(tx) = subscribed.take() {
                    let _ = tx.send(());
                }
            }
            Ok(Ok(Event::Incoming(Packet::Publish(p)))) => {
                let now = started.elapsed().as_micros() as u64;
                if let Some(sent) = std::str::from_utf8(&p.payload).ok().and_then(|s| s.parse::<u64>().ok()) {
                    out.push((sent, now.saturating_sub(sent)));
                }
            }
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    out
}

async fn publish_telemetry(addr: SocketAddr, stop: Arc<AtomicBool>, progress: Arc<AtomicU64>) -> Vec<String> {
    let mut acked = Vec::new();
    let mut round = 0u32;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        // Each connection gets its own payload tag, so a message published again after a lost
        // PUBACK is another payload, and a payload seen twice in the sink is a real duplicate.
        let tag = format!("t{round}");
        // Rounds of 100 on one connection: a round ends in about a second, so `stop` is seen
        // soon and nothing acknowledged is left out of the result.
        let id = format!("hil-telemetry-{round}");
        let got = e2e_tests::client::publish_range(addr, &id, "telemetry/hil/gw", &tag, 0..100, &progress).await;
        acked.extend(got.into_iter().map(|i| format!("{tag}-{i}")));
        if round_cut_short(&acked, &tag) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    acked
}

/// Whether the round `tag` ended early (the edge went away): wait before the next.
fn round_cut_short(acked: &[String], tag: &str) -> bool {
    acked.iter().filter(|p| p.starts_with(&format!("{tag}-"))).count() < 100
}

/// Percentile `p` (0-100) of `values` in milliseconds, from microseconds.
pub fn percentile_ms(values: &mut [u64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let i = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    Some(values[i] as f64 / 1000.0)
}

/// What JetStream holds of the acknowledged telemetry.
#[derive(Debug)]
pub struct Delivery {
    pub acked: usize,
    pub stored: usize,
    pub missing: Vec<String>,
    pub duplicates: Vec<String>,
}

/// Waits until the edge's spool has sent everything, then reads the stream.
pub async fn delivery(rig: &Rig, acked: &[String], timeout: Duration) -> Delivery {
    let edge = rig.edge();
    let drained =
        e2e_tests::eventually(timeout, || edge.metric("edge_spool_class_records{class=\"telemetry\"}") == 0.0).await;
    assert!(drained, "the spool did not drain in {timeout:?}:\n{}", edge.stderr());
    let messages = e2e_tests::nats::read_stream(&rig.nats.url(), "EDGE").await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut ids = std::collections::HashSet::new();
    for m in &messages {
        if let Some(id) = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")) {
            assert!(ids.insert(id.to_string()), "Nats-Msg-Id {id} stored twice");
        }
        *seen.entry(String::from_utf8_lossy(&m.payload).into_owned()).or_default() += 1;
    }
    Delivery {
        acked: acked.len(),
        stored: messages.len(),
        missing: acked.iter().filter(|p| !seen.contains_key(*p)).cloned().collect(),
        duplicates: seen.iter().filter(|(_, n)| **n > 1).map(|(p, _)| p.clone()).collect(),
    }
}

/// One scenario's line in the report.
pub fn report(name: &str, fields: serde_json::Value) {
    let path = std::env::var("HIL_REPORT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| e2e_tests::workspace_root().join("hil/reports/last.jsonl"));
    let mut line = serde_json::json!({ "scenario": name, "scale": if full() { "full" } else { "smoke" } });
    if let (Some(l), Some(f)) = (line.as_object_mut(), fields.as_object()) {
        l.extend(f.clone());
    }
    use std::io::Write;
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("report file");
    writeln!(f, "{line}").expect("write report");
    eprintln!("{line}");
}

/// Latency figures over the whole run and over `window` (a fault), in ms.
pub fn latency_fields(latencies: &[(u64, u64)], window: Option<(u64, u64)>) -> serde_json::Value {
    let mut all: Vec<u64> = latencies.iter().map(|(_, l)| *l).collect();
    let mut during: Vec<u64> = window
        .map(|(from, to)| latencies.iter().filter(|(s, _)| (from..to).contains(s)).map(|(_, l)| *l).collect())
        .unwrap_or_default();
    serde_json::json!({
        "inference_received": all.len(),
        "p50_ms": percentile_ms(&mut all, 50.0),
        "p99_ms": percentile_ms(&mut all, 99.0),
        "p99_during_fault_ms": percentile_ms(&mut during, 99.0),
        "received_during_fault": during.len(),
    })
}
