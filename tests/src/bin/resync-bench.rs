//! Resync after an outage (issue 19, item 5): a real edge-node process with the default
//! `[uplink]` settings, reaching a cloud-bridge process (SQLite sink) through a UDP relay,
//! publishing 20 QoS1 messages a second to a `full` class. The relay drops everything for
//! OUTAGE seconds and a random part of ten more (an outage of fixed length would end at the
//! same phase of the edge's backoff every round, which flatters or punishes it by luck), then
//! forwards again; the time from that moment to the edge's next ack
//! (`edge_uplink_commit_latency_seconds_count` rising, polled every 10 ms) is one round. Each
//! mode gets a fresh edge: `probes` (the default `probe_interval` of 2 s) and `off`
//! (`probe_interval = "0s"`: backoff alone, as before probes). Prints a JSON line per round and
//! one per mode with the median.
//!
//! Usage: resync-bench [ROUNDS=5] [OUTAGE=60] [MODES=probes,off]

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use e2e_tests::fleet::BridgeProcess;
use e2e_tests::node::{EdgeProcess, config_text};
use e2e_tests::relay::UdpRelay;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.to_owned());
    let rounds: usize = arg(1, "5").parse()?;
    let outage = Duration::from_secs(arg(2, "60").parse()?);
    let modes = arg(3, "probes,off");

    let dir = tempfile::tempdir()?;
    let pki = cloud_bridge::certs::init(&dir.path().join("pki"), &[], &["edge-1".to_owned()], false)?;
    let sink = format!("kind = \"sqlite\"\npath = \"{}\"\n", dir.path().join("central.db").display());
    let bridge = BridgeProcess::start(dir.path(), &pki, &sink, "")?;
    let relay = UdpRelay::start(bridge.quic).await;
    let (_, cert, key) = &pki.edges[0];

    for mode in modes.split(',') {
        let probe = if mode == "off" { "probe_interval = \"0s\"\n" } else { "" };
        // Only what names the bridge and the certificates: every timing is the default.
        let uplink = format!(
            "[uplink]\nserver = \"{}\"\nserver_name = \"localhost\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n{probe}",
            relay.addr,
            pki.ca.display(),
            cert.display(),
            key.display()
        );
        let classes = e2e_tests::fixtures::with_spool(&[e2e_tests::fixtures::audit()]);
        let edge_dir = tempfile::tempdir()?;
        let edge = EdgeProcess::start(edge_dir.path(), &config_text(&format!("{classes}\n{uplink}")));
        let progress = Arc::new(AtomicU64::new(0));
        let load = tokio::spawn({
            let (addr, tag) = (edge.addr("local"), mode.to_owned());
            async move {
                for start in (0u32..).step_by(20) {
                    e2e_tests::client::publish_range(addr, "load", "audit/door", &tag, start..start + 20, &progress)
                        .await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        });
        let commits = || edge.metric("edge_uplink_commit_latency_seconds_count");
        let mut times = Vec::new();
        for round in 0..rounds {
            // Connected and acked before each outage.
            let start = commits();
            let ready = Instant::now();
            while commits() <= start || edge.metric("edge_uplink_connected") < 1.0 {
                anyhow::ensure!(ready.elapsed() < Duration::from_secs(120), "{mode}: not acked before round {round}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            relay.impairment.set_blackhole(true);
            let outage = outage + Duration::from_secs_f64(rand::Rng::gen_range(&mut rand::thread_rng(), 0.0..10.0));
            tokio::time::sleep(outage).await;
            let down = edge.metric("edge_uplink_connected") < 1.0;
            let before = commits();
            relay.impairment.set_blackhole(false);
            let restored = Instant::now();
            while commits() <= before {
                anyhow::ensure!(restored.elapsed() < Duration::from_secs(120), "{mode}: no ack after round {round}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let took = restored.elapsed().as_secs_f64();
            println!(
                "{}",
                serde_json::json!({"mode": mode, "round": round, "outage_s": outage.as_secs_f64(),
                    "edge_saw_it_down": down, "first_ack_after_restore_s": took})
            );
            times.push(took);
        }
        load.abort();
        times.sort_by(f64::total_cmp);
        let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
        let probes = edge.metric("edge_uplink_probes_total");
        println!(
            "{}",
            serde_json::json!({"mode": mode, "rounds": rounds, "median_s": median, "min_s": times.first(),
                "max_s": times.last(), "probes_sent": probes})
        );
    }
    drop(bridge);
    Ok(())
}
