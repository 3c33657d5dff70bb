//! Model sync benchmark (scripts/bench-model-sync.sh): time from publish to staged on a real
//! `edge-node` process, for a whole model of MIB MiB and then a fine-tune of it (5 % rewritten
//! in three regions), and the peer: the same number of bytes on one quinn stream between the
//! same endpoint settings over the same link.
//!
//! `model-sync-bench MIB LINK CC TIMEOUT_S`: LINK is `loopback` (direct) or `impaired` (the UDP
//! relay, 25 ms each way, 1 % loss each way); CC the bridge's congestion controller (`bbr`,
//! `cubic`). A transfer still running after TIMEOUT_S is reported with the rate it reached (a
//! whole model that did not make it is then completed on a clean link, so the fine-tune is
//! still measured).
//! Prints one JSON object.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use cloud_bridge::models::dir::DirStore;
use e2e_tests::cloud::{TestCloud, pki};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::node::{EdgeProcess, config_text};
use e2e_tests::relay::UdpRelay;
use shared::testing::noise;

const MODEL: &str = "bench-model";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "model-sync-bench MIB loopback|impaired bbr|cubic TIMEOUT_S";
    let mib: usize = args.first().context(usage)?.parse()?;
    let impaired = args.get(1).context(usage)? == "impaired";
    let cc = args.get(2).context(usage)?.clone();
    let timeout = Duration::from_secs(args.get(3).context(usage)?.parse()?);
    let dir = tempfile::tempdir()?;
    let (private, public, _) = cloud_bridge::models::keygen(&dir.path().join("keys"))?;
    let extra = format!(
        "congestion = \"{cc}\"\n\n[models]\ndir = \"{}\"\nsigning_key = \"{}\"\npoll = \"100ms\"\n",
        dir.path().join("store").display(),
        private.display()
    );
    let cloud = TestCloud::start(dir.path(), pki(dir.path(), &[]), "127.0.0.1:0".parse()?, &extra).await;
    let impair = |relay: &UdpRelay| {
        if impaired {
            relay.impairment.set_delay(Duration::from_millis(25), Duration::ZERO);
            relay.impairment.set_loss(10);
        }
    };
    let relay = UdpRelay::start(cloud.bridge.quic_addr()).await;
    impair(&relay);
    let server = if impaired { relay.addr } else { cloud.bridge.quic_addr() };
    let edge_dir = dir.path().join("edge");
    std::fs::create_dir_all(&edge_dir)?;
    let edge_text = config_text(&format!(
        "{}\n{}\n[models]\ndir = \"models\"\npublic_key = \"{}\"\nfollow = [\"{MODEL}\"]\n",
        with_spool(&[telemetry()]),
        cloud.uplink_section_via("edge-1", server),
        public.display()
    ));
    let edge = EdgeProcess::start(&edge_dir, &edge_text);
    anyhow::ensure!(
        e2e_tests::eventually(Duration::from_secs(30), || edge.metric("edge_uplink_connected") == 1.0).await,
        "the edge did not connect"
    );

    let store = DirStore::open(&dir.path().join("store"))?;
    let key = cloud_bridge::models::signing_key(&private)?;
    let v1 = noise(mib << 20, 1);
    let mut v2 = v1.clone();
    let region = v1.len() / 60;
    for (k, start) in [v1.len() / 8, v1.len() / 2, v1.len() * 7 / 8].into_iter().enumerate() {
        v2[start..start + region].copy_from_slice(&noise(region, 100 + k as u64));
    }
    let mut results = serde_json::Map::new();
    for (version, data) in [("1", &v1), ("2", &v2)] {
        let file = dir.path().join(format!("{version}.bin"));
        std::fs::write(&file, data)?;
        let before = edge.metric(&format!("edge_model_fetched_bytes_total{{model=\"{MODEL}\"}}"));
        let started = Instant::now();
        cloud_bridge::models::publish(&store, &key, MODEL, version, &file, |_| {}).await?;
        let published = started.elapsed();
        let current = format!("edge_model_current{{model=\"{MODEL}\",version=\"{version}\"}}");
        let staged = e2e_tests::eventually(timeout, || edge.metric(&current) == 1.0).await;
        let seconds = started.elapsed().as_secs_f64() - published.as_secs_f64();
        let fetched = edge.metric(&format!("edge_model_fetched_bytes_total{{model=\"{MODEL}\"}}")) - before;
        if staged {
            let on_disk = std::fs::read(edge_dir.join("models").join(MODEL).join(version))?;
            anyhow::ensure!(on_disk == *data, "version {version} staged with different bytes");
        }
        let name = if version == "1" { "full" } else { "delta" };
        results.insert(
            name.into(),
            serde_json::json!({
                "publish_s": published.as_secs_f64(),
                "staged": staged,
                "publish_to_staged_s": seconds,
                "fetched_bytes": fetched,
                "size_bytes": data.len(),
                "fetched_mb_per_s": fetched / seconds / 1e6,
            }),
        );
        if !staged {
            // The fine-tune is measured on its own: lift the impairment until the whole
            // version is in, then put it back.
            relay.impairment.set_loss(0);
            relay.impairment.set_delay(Duration::ZERO, Duration::ZERO);
            anyhow::ensure!(
                e2e_tests::eventually(Duration::from_secs(300), || edge.metric(&current) == 1.0).await,
                "version {version} not staged even on a clean link"
            );
            impair(&relay);
        }
    }
    drop(edge);

    // The peer: one stream of the same bytes, same endpoint settings, same link.
    let peer = one_stream(dir.path(), &edge_dir, impaired, v1.len(), timeout, &impair).await?;
    let full_rate = results["full"]["fetched_mb_per_s"].as_f64().unwrap_or(0.0);
    let ratio = full_rate / peer["mb_per_s"].as_f64().unwrap_or(f64::NAN);
    let out = serde_json::json!({
        "mib": mib,
        "link": if impaired { "impaired" } else { "loopback" },
        "cc": cc,
        "full": results.get("full"),
        "delta": results.get("delta"),
        "one_stream": peer,
        "full_vs_one_stream": ratio,
    });
    println!("{out}");
    cloud.bridge.stop().await;
    Ok(())
}

/// `len` bytes on one quinn stream from an endpoint built like the bridge's to a client built
/// like the edge's uplink, through a relay impaired like the bridge's.
async fn one_stream(
    dir: &Path,
    edge_dir: &Path,
    impaired: bool,
    len: usize,
    timeout: Duration,
    impair: &impl Fn(&UdpRelay),
) -> anyhow::Result<serde_json::Value> {
    let mut cloud_config = cloud_bridge::config::CloudConfig::load(&dir.join("cloud.toml"))?;
    cloud_config.server.bind = "127.0.0.1:0".parse()?;
    let endpoint = cloud_bridge::server::endpoint(&cloud_config.server, |t| cloud_config.limits.apply(t))?;
    let addr = endpoint.local_addr()?;
    let server = tokio::spawn(async move {
        let conn = endpoint.accept().await.context("endpoint closed")?.await?;
        let (mut send, mut recv) = conn.accept_bi().await?;
        let mut request = [0u8; 1];
        recv.read_exact(&mut request).await?;
        let block = noise(1 << 20, 9);
        let mut left = len;
        while left > 0 {
            let n = left.min(block.len());
            send.write_all(&block[..n]).await?;
            left -= n;
        }
        send.finish()?;
        conn.closed().await;
        anyhow::Ok(())
    });
    let relay = UdpRelay::start(addr).await;
    impair(&relay);
    let target: SocketAddr = if impaired { relay.addr } else { addr };
    let edge_config = edge_node::config::EdgeConfig::load(&edge_dir.join("edge.toml"))?;
    let uplink = edge_config.uplink.context("uplink section")?;
    let mut client = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    client.set_default_client_config(edge_node::uplink::quic::client_config(&uplink)?);
    let conn = client.connect(target, "localhost")?.await?;
    let started = Instant::now();
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(&[1]).await?;
    send.finish()?;
    let mut got = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    let done = tokio::time::timeout(timeout, async {
        while let Some(n) = recv.read(&mut buf).await? {
            got += n as u64;
        }
        anyhow::Ok(())
    })
    .await;
    let seconds = started.elapsed().as_secs_f64();
    conn.close(0u32.into(), b"done");
    server.abort();
    Ok(serde_json::json!({
        "finished": matches!(done, Ok(Ok(()))),
        "seconds": seconds,
        "bytes": got,
        "mb_per_s": got as f64 / seconds / 1e6,
    }))
}
