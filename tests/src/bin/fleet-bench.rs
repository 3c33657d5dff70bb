//! Many edges on one cloud-bridge (issue 19): N simulated edges, each with its own certificate
//! from a test CA, spread over several client endpoints, against a bridge in its own process.
//! Connects them (paced at RAMP a second, or all at once with 0), holds them idle (measured), runs the
//! first ACTIVE of them at RATE records a second each, optionally kills the bridge and starts
//! it again (a reconnect storm), and prints JSON lines: connect time, the bridge's RSS and CPU
//! idle and active, ack latency, acks a second, the generator's and nats-server's CPU beside the
//! bridge's, the storm's recovery.
//!
//! Usage: fleet-bench [EDGES=1000] [ACTIVE=100] [RATE=10] [SECONDS=20] [SINK=jetstream]
//!        [STORM=0] [RAMP=400] [ENDPOINTS=8] [LANES=1] [BACKLOG=0]
//! SINK is `jetstream` (a nats-server of its own), `kafka` (a single-node Kafka broker of its
//! own, KRaft; its JVM's CPU is reported as `nats_cpu`) or `sqlite`. BRIDGE_CONFIG (env) is appended to
//! the bridge's config, e.g. `BRIDGE_CONFIG='[limits]\nhandshakes_per_second = 300'`; EDGE_UPLINK
//! (env, TOML) overrides keys of every edge's `[uplink]`, e.g. `EDGE_UPLINK='dict_size = 0'`.
//! BRIDGE_BIN (env) runs another cloud-bridge binary, or a script that execs one: a build
//! without mimalloc (`cargo build --release -p cloud-bridge --no-default-features`) under
//! heaptrack's preload, for where an idle edge's memory goes.
//! SINK_CONFIG (env) is appended to the `[sink]` section, e.g. `SINK_CONFIG='batches = "off"'`.
//! WARMUP (env, seconds, default 60; 0 for none): before the measured active phase, the active
//! edges send until each has trained its first dictionary (at most WARMUP), and 2 s more.
//! METRICS_OUT (env, a path) keeps the bridge's `/metrics` as it is after the active phase. Each edge drives
//! the shipped uplink's policies with its default `[uplink]` (`e2e_tests::simedge`): RATE
//! records of 1 KiB a second arrive on LANES lanes in turn and go as its linger and batch size
//! say; each active edge's lanes hold BACKLOG records each when the active phase begins.
//! BROADCAST (env, a count) adds a phase after the idle one: that many downlink messages to
//! every edge the fleet view knows, stored one after another through `downlink::send` (the code
//! `cloud-bridge send --all` runs), each edge taking each at once; it prints how long storing
//! took, when every edge had every message, the per-message latency and the bridge's CPU and
//! RSS meanwhile.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use e2e_tests::fleet::{BridgeProcess, Fleet, FleetSpec, client_configs, cpu_of};
use e2e_tests::simedge::quantile;
use serde_json::json;

// The bridge's allocator: with glibc's, malloc was a seventh of the generator's CPU in a storm,
// taken from the two cores it shares with the bridge.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn rss_mib(pid: u32) -> f64 {
    e2e_tests::rss_of(pid) as f64 / (1 << 20) as f64
}

/// The shipped `[uplink]` defaults with EDGE_UPLINK's keys on top.
fn uplink() -> anyhow::Result<edge_node::uplink::UplinkConfig> {
    let over = std::env::var("EDGE_UPLINK").unwrap_or_default().replace("\\n", "\n");
    if over.is_empty() {
        return Ok(e2e_tests::simedge::uplink_defaults());
    }
    let mut base = toml::Table::try_from(e2e_tests::simedge::uplink_defaults())?;
    base.extend(over.parse::<toml::Table>().map_err(|e| anyhow::anyhow!("EDGE_UPLINK: {e}"))?);
    Ok(base.try_into()?)
}

/// BROADCAST messages to every edge the fleet view knows, through `downlink::send`; the phase's
/// JSON line.
async fn broadcast<S: cloud_bridge::sink::DownlinkStore + cloud_bridge::sink::FleetStore>(
    sink: &S,
    fleet: &Fleet,
    bridge: &BridgeProcess,
    edges: usize,
    count: usize,
    nats_cpu: &dyn Fn() -> Duration,
) -> anyhow::Result<serde_json::Value> {
    use cloud_bridge::downlink::send::{self, Flags, Target};
    let config = cloud_bridge::downlink::DownlinkConfig::default();
    // The fleet view has every edge once the bridge wrote their states (paced writes).
    let deadline = Instant::now() + Duration::from_secs(120);
    let all = loop {
        let known = send::edges(sink, &config, &Target::All).await.unwrap_or_default();
        if known.len() >= edges || Instant::now() > deadline {
            break known;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    fleet.stats.down_latencies.lock().unwrap().clear();
    let (downs0, cpu0, nats0, t0) =
        (fleet.stats.downs.load(Ordering::Relaxed), cpu_of(bridge.pid()), nats_cpu(), Instant::now());
    let mut stored = 0;
    for _ in 0..count {
        let payload = shared::units::now_ms().to_string().into_bytes();
        let msg = send::message(Flags { topic: "config/fleet".into(), qos: 1, payload, ..Default::default() })?;
        let sent = send::send(sink, &config, &all, &msg).await?;
        stored +=
            sent.iter().filter(|(_, e)| matches!(e, cloud_bridge::sink::downlink::Enqueued::Stored { .. })).count();
    }
    let store_s = t0.elapsed().as_secs_f64();
    let want = (all.len() * count) as u64;
    let mut rss_peak = 0f64;
    let done = loop {
        rss_peak = rss_peak.max(rss_mib(bridge.pid()));
        if fleet.stats.downs.load(Ordering::Relaxed) - downs0 >= want {
            break Some(t0.elapsed());
        }
        if t0.elapsed() > Duration::from_secs(300) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let wall = t0.elapsed().as_secs_f64();
    let mut latencies = std::mem::take(&mut *fleet.stats.down_latencies.lock().unwrap());
    Ok(json!({"phase": "broadcast", "edges": all.len(), "messages": count, "stored": stored,
              "store_s": store_s, "all_have_s": done.map(|d| d.as_secs_f64()),
              "taken": fleet.stats.downs.load(Ordering::Relaxed) - downs0,
              "latency_p50_ms": quantile(&mut latencies, 0.5).as_secs_f64() * 1e3,
              "latency_p99_ms": quantile(&mut latencies, 0.99).as_secs_f64() * 1e3,
              "latency_max_ms": quantile(&mut latencies, 1.0).as_secs_f64() * 1e3,
              "bridge_cpu": (cpu_of(bridge.pid()) - cpu0).as_secs_f64() / wall,
              "nats_cpu": (nats_cpu() - nats0).as_secs_f64() / wall,
              "bridge_rss_peak_mib": rss_peak}))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: f64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (edges, active, rate, seconds) = (arg(0, 1000.0) as usize, arg(1, 100.0) as usize, arg(2, 10.0), arg(3, 20.0));
    let sink = args.get(4).map_or("jetstream", String::as_str).to_owned();
    let (storm, ramp, endpoints) = (arg(5, 0.0) != 0.0, arg(6, 400.0), arg(7, 8.0) as usize);
    let (lanes, backlog) = (arg(8, 1.0).clamp(1.0, 255.0) as u8, arg(9, 0.0) as u64);
    let dir = tempfile::tempdir()?;
    let t = Instant::now();
    let ids: Vec<String> = (0..edges).map(|i| format!("edge-{i:05}")).collect();
    let pki = cloud_bridge::certs::init(&dir.path().join("pki"), &[], &ids, false)?;
    let clients = client_configs(&pki)?;
    eprintln!("{edges} certificates in {:.1} s", t.elapsed().as_secs_f64());

    let nats = (sink == "jetstream").then(e2e_tests::nats::NatsServer::start);
    let kafka = (sink == "kafka").then(e2e_tests::kafka::KafkaBroker::start);
    let sink_section = match (&nats, &kafka) {
        (Some(n), _) => format!("kind = \"jetstream\"\nurl = \"{}\"\n", n.url()),
        (_, Some(k)) => format!("kind = \"kafka\"\nbootstrap = \"{}\"\n", k.bootstrap()),
        _ => format!("kind = \"sqlite\"\npath = \"{}\"\n", dir.path().join("central.db").display()),
    };
    // SINK_CONFIG (env) is appended to the `[sink]` section: `batches = "off"`, say.
    let sink_section = sink_section + &std::env::var("SINK_CONFIG").unwrap_or_default().replace("\\n", "\n");
    // BRIDGE_CONFIG is appended to the bridge's config: a `[limits]` section, say.
    let extra = std::env::var("BRIDGE_CONFIG").unwrap_or_default().replace("\\n", "\n");
    let mut bridge = BridgeProcess::start(dir.path(), &pki, &sink_section, &extra)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_empty = rss_mib(bridge.pid());
    let (own, bridge_cpu) = (std::process::id(), |b: &BridgeProcess| cpu_of(b.pid()));
    // The sink's server shares the cores too; zero without one.
    let nats_cpu = || {
        let kafka = kafka.as_ref().and_then(|k| k.pid(0)).map_or(Duration::ZERO, cpu_of);
        nats.as_ref().map_or(kafka, |n| cpu_of(n.pid()))
    };

    let uplink = uplink()?;
    let spec_dicts = uplink.dict_size.bytes() > 0;
    let spec = FleetSpec {
        servers: vec![bridge.quic],
        edges: clients,
        endpoints,
        active,
        rate,
        payload: 1024,
        lanes,
        backlog,
        uplink,
        ramp,
    };
    let t = Instant::now();
    let fleet = Fleet::start_held(spec).await?;
    let connected = fleet.connected(edges, Duration::from_secs(600)).await;
    println!(
        "{}",
        json!({"phase": "connect", "edges": edges, "ramp_per_s": ramp, "all_connected_s": connected.map(|d| d.as_secs_f64()),
               "since_first_start_s": t.elapsed().as_secs_f64(), "refused": fleet.stats.refused.load(Ordering::Relaxed),
               "busy": fleet.stats.busy.load(Ordering::Relaxed), "failures": fleet.stats.failures.load(Ordering::Relaxed)})
    );

    // Idle: every edge connected, keep-alives only, nobody sending yet.
    let (cpu0, own0, t0) = (bridge_cpu(&bridge), cpu_of(own), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(seconds.min(20.0))).await;
    let wall = t0.elapsed().as_secs_f64();
    let rss_idle = rss_mib(bridge.pid());
    println!(
        "{}",
        json!({"phase": "idle", "edges": edges, "connected": fleet.stats.connected.load(Ordering::Relaxed),
               "bridge_rss_mib": rss_idle, "bridge_rss_empty_mib": rss_empty,
               "bridge_kib_per_idle_edge": (rss_idle - rss_empty) * 1024.0 / edges as f64,
               "bridge_cpu": (bridge_cpu(&bridge) - cpu0).as_secs_f64() / wall,
               "generator_cpu": (cpu_of(own) - own0).as_secs_f64() / wall})
    );

    let broadcasts: usize = std::env::var("BROADCAST").ok().and_then(|b| b.parse().ok()).unwrap_or(0);
    if broadcasts > 0 {
        let store_url = nats.as_ref().map(|n| n.url());
        let db = dir.path().join("central.db");
        let phase = match store_url {
            None if kafka.is_some() => {
                let bootstrap = kafka.as_ref().map(|k| k.bootstrap()).unwrap_or_default();
                let settings = cloud_bridge::sink::kafka::settings::KafkaSettings::new(&bootstrap);
                let sink = cloud_bridge::sink::kafka::KafkaSink::connect(&settings).await?;
                broadcast(&sink, &fleet, &bridge, edges, broadcasts, &nats_cpu).await?
            }
            Some(url) => {
                let settings = e2e_tests::nats::sink_settings(url, cloud_bridge::sink::jetstream::BatchPublish::Auto);
                let sink = cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings).await?;
                broadcast(&sink, &fleet, &bridge, edges, broadcasts, &nats_cpu).await?
            }
            None => {
                let sink = cloud_bridge::sink::sqlite::SqliteSink::open(&db)?;
                broadcast(&sink, &fleet, &bridge, edges, broadcasts, &nats_cpu).await?
            }
        };
        println!("{phase}");
    }

    // Active: the first ACTIVE edges send. A real edge trains its first dictionaries on its own
    // CPU when its traffic starts and again once every `dict_retrain`; here every active edge
    // starts at once and trains on the two cores the bridge shares, so the steady phase is
    // measured only after each has made its first one current (the warm-up).
    fleet.stats.hold.store(false, Ordering::Relaxed);
    let warmup = Duration::from_secs_f64(std::env::var("WARMUP").ok().and_then(|w| w.parse().ok()).unwrap_or(60.0));
    if !warmup.is_zero() {
        let (own0, t0) = (cpu_of(own), Instant::now());
        let trains = spec_dicts && active > 0;
        while trains && fleet.stats.dicts_trained.load(Ordering::Relaxed) < active as u64 && t0.elapsed() < warmup {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The last trainings' batches acked, and a second of the rate settled.
        tokio::time::sleep(Duration::from_secs(2)).await;
        println!(
            "{}",
            json!({"phase": "warmup", "seconds": t0.elapsed().as_secs_f64(), "active": active,
                   "dicts_trained": fleet.stats.dicts_trained.load(Ordering::Relaxed),
                   "generator_cpu": (cpu_of(own) - own0).as_secs_f64() / t0.elapsed().as_secs_f64()})
        );
    }
    fleet.stats.latencies.lock().unwrap().clear();
    let (acked0, cpu0, own0, nats0, t0) =
        (fleet.stats.acked.load(Ordering::Relaxed), bridge_cpu(&bridge), cpu_of(own), nats_cpu(), Instant::now());
    let mut rss_peak = 0f64;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < deadline {
        rss_peak = rss_peak.max(rss_mib(bridge.pid()));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let wall = t0.elapsed().as_secs_f64();
    let mut latencies = std::mem::take(&mut *fleet.stats.latencies.lock().unwrap());
    let acked = fleet.stats.acked.load(Ordering::Relaxed) - acked0;
    let rss_now = rss_mib(bridge.pid());
    println!(
        "{}",
        json!({"phase": "steady", "edges": edges, "active": active, "rate_per_edge": rate, "sink": sink,
               "connected": fleet.stats.connected.load(Ordering::Relaxed),
               "bridge_rss_mib": rss_now, "bridge_rss_peak_mib": rss_peak, "bridge_rss_empty_mib": rss_empty,
               "bridge_kib_per_edge": (rss_now - rss_empty) * 1024.0 / edges as f64,
               "bridge_cpu": (bridge_cpu(&bridge) - cpu0).as_secs_f64() / wall,
               "generator_cpu": (cpu_of(own) - own0).as_secs_f64() / wall,
               "nats_cpu": (nats_cpu() - nats0).as_secs_f64() / wall,
               "acks_per_s": acked as f64 / wall, "batches": latencies.len(),
               "ack_p50_ms": quantile(&mut latencies, 0.5).as_secs_f64() * 1e3,
               "ack_p99_ms": quantile(&mut latencies, 0.99).as_secs_f64() * 1e3})
    );

    // METRICS_OUT (env, a path): the bridge's /metrics after the active phase, for what the
    // sink's histograms say of where an ack's time went.
    if let Ok(path) = std::env::var("METRICS_OUT") {
        std::fs::write(&path, e2e_tests::http_get(bridge.http, "/metrics"))?;
    }

    if storm {
        fleet.stats.reconnects.lock().unwrap().clear();
        let failures_before = fleet.stats.failures.load(Ordering::Relaxed);
        let (own0, nats0, t) = (cpu_of(own), nats_cpu(), Instant::now());
        bridge.restart()?;
        let restarted = t.elapsed();
        let mut rss_peak = 0f64;
        let mut curve = Vec::new();
        let back = loop {
            rss_peak = rss_peak.max(rss_mib(bridge.pid()));
            let n = fleet.stats.connected.load(Ordering::Relaxed);
            if curve.len() < (t.elapsed().as_secs() as usize) {
                curve.push(n);
            }
            let all = n == edges && fleet.stats.reconnects.lock().unwrap().len() >= edges;
            if all || t.elapsed() > Duration::from_secs(300) {
                break all.then(|| t.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // The restarted bridge is a new process: all its CPU time is the storm's. Per handshake
        // it is an upper bound (it also served the active edges meanwhile).
        let (storm_cpu, own_cpu, nats_storm) = (bridge_cpu(&bridge), cpu_of(own) - own0, nats_cpu() - nats0);
        let wall = t.elapsed().as_secs_f64();
        let mut times = std::mem::take(&mut *fleet.stats.reconnects.lock().unwrap());
        let bridge_says = |m: &str| bridge.metric(m);
        let refused_by_bridge = json!({
            "rate": bridge_says("bridge_connections_refused_total{reason=\"rate\"}"),
            "connections": bridge_says("bridge_connections_refused_total{reason=\"connections\"}"),
            "handshakes_in_flight": bridge_says("bridge_connections_refused_total{reason=\"handshakes\"}"),
            "handshake_failed": bridge_says("bridge_connections_refused_total{reason=\"handshake\"}"),
        });
        println!(
            "{}",
            json!({"phase": "storm", "edges": edges, "bridge_restart_s": restarted.as_secs_f64(),
                   "all_reconnected_s": back.map(|d| d.as_secs_f64()),
                   "reconnect_p50_s": quantile(&mut times, 0.5).as_secs_f64(),
                   "reconnect_p99_s": quantile(&mut times, 0.99).as_secs_f64(),
                   "refused": fleet.stats.refused.load(Ordering::Relaxed),
                   "busy": fleet.stats.busy.load(Ordering::Relaxed),
                   "failures": fleet.stats.failures.load(Ordering::Relaxed) - failures_before,
                   "bridge_refused": refused_by_bridge,
                   "bridge_cpu": storm_cpu.as_secs_f64() / wall, "generator_cpu": own_cpu.as_secs_f64() / wall,
                   "nats_cpu": nats_storm.as_secs_f64() / wall,
                   "bridge_cpu_ms_per_edge": storm_cpu.as_secs_f64() * 1e3 / edges as f64,
                   "connected_each_second": curve, "bridge_rss_peak_mib": rss_peak})
        );
    }
    let reports = fleet.stop().await;
    let acked: u64 = reports.iter().map(|r| r.total_acked()).sum();
    println!(
        "{}",
        json!({"phase": "end", "records_acked": acked, "bridge_stderr_lines": bridge.stderr().lines().count()})
    );
    drop(bridge);
    drop(nats);
    drop(kafka);
    Ok(())
}
