//! A fleet of simulated edges ([`crate::simedge`]) in one process against a cloud-bridge in a
//! process of its own, so the bridge's RSS and CPU are its own and the generator's CPU is seen
//! apart (a run the generator cannot keep up with shows as one).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloud_bridge::certs::Pki;
use tokio_util::sync::CancellationToken;

use crate::simedge::{FleetStats, SimEdge, SimReport};

/// A `cloud-bridge run` process on a fixed UDP port, so it can be killed and started again
/// where its edges look for it.
pub struct BridgeProcess {
    child: Child,
    dir: PathBuf,
    config: String,
    pub quic: SocketAddr,
    pub http: SocketAddr,
}

impl BridgeProcess {
    /// Starts a bridge with this PKI, `sink` as its `[sink]` section and `extra` appended to
    /// its config (a `[limits]` section, say), on any free port.
    pub fn start(dir: &Path, pki: &Pki, sink: &str, extra: &str) -> anyhow::Result<Self> {
        let config = format!(
            "[server]\nbind = \"127.0.0.1:{{port}}\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             [http]\nbind = \"127.0.0.1:0\"\n[sink]\n{sink}\n{extra}\n",
            pki.server_cert.display(),
            pki.server_key.display(),
            pki.ca.display(),
        );
        let (child, quic, http) = spawn(dir, &config.replace("{port}", "0"))?;
        Ok(Self { child, dir: dir.to_owned(), config, quic, http })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a crash or a host going down would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same UDP port.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        // Its stderr tells why a restart failed (another process may have taken the freed port).
        let (child, quic, http) = spawn(&self.dir, &self.config.replace("{port}", &self.quic.port().to_string()))
            .map_err(|e| {
                let stderr = self.stderr();
                let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
                anyhow::anyhow!("{e}; its stderr ends: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" | "))
            })?;
        (self.child, self.quic, self.http) = (child, quic, http);
        Ok(())
    }

    /// The value of a metric from its `/metrics`, 0 when absent.
    pub fn metric(&self, name_and_labels: &str) -> f64 {
        crate::metric(&crate::http_get(self.http, "/metrics"), name_and_labels).unwrap_or(0.0)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("cloud.stderr")).unwrap_or_default()
    }

    /// Its config file, for the CLI's commands (`edges list`).
    pub fn config(&self) -> PathBuf {
        self.dir.join("cloud.toml")
    }
}

/// `cloud-bridge edges list --json` against the bridge config at `config`: the fleet view of
/// every bridge on its sink.
pub fn edges_list(config: &Path) -> cloud_bridge::fleet::view::FleetView {
    let out = Command::new(crate::workspace_bin("cloud-bridge"))
        .args(["edges", "list", "--json", "--config"])
        .arg(config)
        .output()
        .expect("run cloud-bridge edges list");
    assert!(out.status.success(), "edges list: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("edges list --json is the view")
}

impl Drop for BridgeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(dir: &Path, config: &str) -> anyhow::Result<(Child, SocketAddr, SocketAddr)> {
    let config_path = dir.join("cloud.toml");
    std::fs::write(&config_path, config)?;
    let stderr = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("cloud.stderr"))?;
    // BRIDGE_BIN (env): another cloud-bridge binary, or a script that execs one (a heap
    // profiler's preload, say).
    let bin = std::env::var_os("BRIDGE_BIN").map_or_else(|| crate::workspace_bin("cloud-bridge"), Into::into);
    let command = Command::new(bin);
    let ready = dir.join("cloud-ready.json");
    let (child, doc) = crate::run_until_ready(command, &config_path, &ready, stderr, "warn", Duration::from_secs(30))
        .map_err(|e| anyhow::anyhow!("cloud-bridge {e}"))?;
    let addr = |k: &str| doc[k].as_str().and_then(|s| s.parse().ok());
    match (addr("quic"), addr("http")) {
        (Some(quic), Some(http)) => Ok((child, quic, http)),
        _ => anyhow::bail!("cloud-bridge's ready file has no quic and http addresses: {doc}"),
    }
}

/// CPU time a process has used (user and system).
pub fn cpu_of(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return Duration::ZERO };
    // Fields after the command (which may hold spaces) start after its closing parenthesis;
    // utime and stime are fields 14 and 15, in clock ticks of 1/100 s.
    let Some((_, rest)) = stat.rsplit_once(')') else { return Duration::ZERO };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    Duration::from_millis(ticks * 10)
}

/// What a fleet is made of.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    /// The bridges; each edge enters the list at a random place.
    pub servers: Vec<SocketAddr>,
    /// One client configuration per edge, each with its own certificate.
    pub edges: Vec<quinn::ClientConfig>,
    /// Client endpoints the edges are spread over.
    pub endpoints: usize,
    /// Edges that publish (the first ones); the rest only keep their sessions alive.
    pub active: usize,
    /// Records a second arriving at each active edge.
    pub rate: f64,
    pub payload: usize,
    /// Lanes each active edge's records arrive on, and records each lane holds at start.
    pub lanes: u8,
    pub backlog: u64,
    /// The `[uplink]` every edge follows (`simedge::uplink_defaults()`: as shipped).
    pub uplink: edge_node::uplink::UplinkConfig,
    /// Edges started per second (0: all at once).
    pub ramp: f64,
}

/// A running fleet.
pub struct Fleet {
    pub stats: Arc<FleetStats>,
    stop: CancellationToken,
    edges: Vec<tokio::task::JoinHandle<SimReport>>,
}

impl Fleet {
    pub async fn start(spec: FleetSpec) -> anyhow::Result<Fleet> {
        Self::start_with(spec, false).await
    }

    /// A fleet whose active edges hold until `stats.hold` is cleared.
    pub async fn start_held(spec: FleetSpec) -> anyhow::Result<Fleet> {
        Self::start_with(spec, true).await
    }

    async fn start_with(spec: FleetSpec, hold: bool) -> anyhow::Result<Fleet> {
        let endpoints = (0..spec.endpoints.max(1)).map(|_| client_endpoint()).collect::<Result<Vec<_>, _>>()?;
        let (stats, stop) = (Arc::new(FleetStats::default()), CancellationToken::new());
        stats.hold.store(hold, std::sync::atomic::Ordering::Relaxed);
        let started = Instant::now();
        let mut edges = Vec::with_capacity(spec.edges.len());
        for (i, client) in spec.edges.into_iter().enumerate() {
            if spec.ramp > 0.0 {
                let due = started + Duration::from_secs_f64(i as f64 / spec.ramp);
                tokio::time::sleep_until(due.into()).await;
            }
            let active = i < spec.active;
            let edge = SimEdge {
                servers: spec.servers.clone(),
                endpoint: endpoints[i % endpoints.len()].clone(),
                client,
                rate: if active { spec.rate } else { 0.0 },
                payload: spec.payload,
                lanes: spec.lanes,
                backlog: if active { spec.backlog } else { 0 },
                uplink: spec.uplink.clone(),
            };
            let (stats, stop) = (stats.clone(), stop.clone());
            edges.push(tokio::spawn(async move { edge.run(stop, &stats).await }));
        }
        Ok(Fleet { stats, stop, edges })
    }

    /// Waits until `n` edges are connected, or `timeout`; how long it took, if they did.
    pub async fn connected(&self, n: usize, timeout: Duration) -> Option<Duration> {
        let start = Instant::now();
        while self.stats.connected.load(std::sync::atomic::Ordering::Relaxed) < n {
            if start.elapsed() > timeout {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(start.elapsed())
    }

    /// Stops every edge (each waits up to 5 s for its last acks); their reports.
    pub async fn stop(self) -> Vec<SimReport> {
        self.stop.cancel();
        let mut reports = Vec::with_capacity(self.edges.len());
        for e in self.edges {
            reports.push(e.await.unwrap_or_default());
        }
        reports
    }
}

/// A client endpoint with 4 MiB socket buffers: one serves thousands of simulated edges, whose
/// datagrams the kernel's default buffer would drop in bursts (a bridge restart's resets and
/// handshakes), and the bench would measure its own losses.
fn client_endpoint() -> anyhow::Result<quinn::Endpoint> {
    let socket = std::net::UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let sock = socket2::SockRef::from(&socket);
    sock.set_recv_buffer_size(4 << 20)?;
    sock.set_send_buffer_size(4 << 20)?;
    let runtime = quinn::default_runtime().ok_or_else(|| anyhow::anyhow!("no async runtime"))?;
    Ok(quinn::Endpoint::new(quinn::EndpointConfig::default(), None, socket, runtime)?)
}

/// The fleet's client configurations, one per edge certificate of `pki`.
pub fn client_configs(pki: &Pki) -> anyhow::Result<Vec<quinn::ClientConfig>> {
    pki.edges.iter().map(|(_, cert, key)| crate::simedge::client_config(&pki.ca, cert, key)).collect()
}
