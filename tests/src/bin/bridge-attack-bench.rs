//! A well-behaved edge's ack latency on a bridge, alone and while two edges with valid
//! certificates attack it (issue 18): one holds 16 batch streams that announce 16 MiB each and
//! send 1 KiB, reconnecting whenever it is closed; the other sends decode bombs (30 MB of CBOR
//! that is nothing but empty user properties, 480 MB decoded) one connection after another.
//! Rounds alternate quiet and attacked; prints each round and the medians as JSON lines, and
//! the peak RSS of this process (the bridge, the edges and the attackers run in it).
//!
//! Usage: bridge-attack-bench [ROUNDS=3] [SECONDS=10] [RATE=2000]  (records a second, batches
//! of 100 records of 1 KiB; SQLite sink, default `[limits]`).

use std::time::Duration;

use e2e_tests::cloud::{TestCloud, pki};
use e2e_tests::quic;
use e2e_tests::simedge::{SimEdge, quantile};
use shared::proto::codec;
use tokio_util::sync::CancellationToken;

const EPOCH: &str = "00112233445566778899aabbccddeeff";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: f64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (rounds, seconds, rate) = (arg(0, 3.0) as usize, arg(1, 10.0), arg(2, 2000.0));
    let dir = tempfile::tempdir()?;
    let keys = pki(dir.path(), &["edge-2", "edge-3"]);
    let cloud = TestCloud::start(dir.path(), keys.clone(), "127.0.0.1:0".parse()?, "").await;
    let addr = cloud.bridge.quic_addr();
    let cert = |id: &str| keys.edges.iter().find(|(e, _, _)| e == id).expect("edge in the PKI").clone();
    let (_, c1, k1) = cert("edge-1");
    let mut edge = SimEdge { rate, payload: 1024, ..SimEdge::from_files(addr, &keys.ca, &c1, &k1)? };
    // Batches of about 100 records at 1,000 a second.
    edge.uplink.linger = shared::units::HumanDuration(Duration::from_millis(100));
    let bomb = codec::encode(&quic::zstd_batch(&quic::empty_pairs_record(10_000_000)))?;
    let rss = e2e_tests::PeakRss::start(std::process::id());
    let (mut quiet, mut attacked) = (Vec::new(), Vec::new());
    for round in 0..rounds * 2 {
        let attack = round % 2 == 1;
        let stop = CancellationToken::new();
        let mut attackers = Vec::new();
        if attack {
            let (_, c, k) = cert("edge-2");
            attackers.push(tokio::spawn(hold_streams(addr, keys.ca.clone(), c, k, stop.clone())));
            let (_, c, k) = cert("edge-3");
            attackers.push(tokio::spawn(bombs(addr, keys.ca.clone(), c, k, bomb.clone(), stop.clone())));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let running = tokio::spawn({
            let (edge, stop) = (edge.clone(), stop.clone());
            async move { edge.run(stop, &Default::default()).await }
        });
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        stop.cancel();
        let mut report = running.await?;
        let mut bombs_sent = 0;
        for a in attackers {
            bombs_sent += a.await.unwrap_or(0);
        }
        let (p50, p99) = (quantile(&mut report.latencies, 0.5), quantile(&mut report.latencies, 0.99));
        let line = serde_json::json!({
            "round": round / 2 + 1, "attack": attack, "batches": report.latencies.len(), "acked": report.total_acked(),
            "p50_ms": p50.as_secs_f64() * 1e3, "p99_ms": p99.as_secs_f64() * 1e3, "bombs": bombs_sent,
            "peak_rss_mib": rss.peak() >> 20,
        });
        println!("{line}");
        if attack { &mut attacked } else { &mut quiet }.push((p50, p99));
    }
    let median = |v: &mut Vec<(Duration, Duration)>, i: usize| {
        let mut xs: Vec<Duration> = v.iter().map(|p| if i == 0 { p.0 } else { p.1 }).collect();
        quantile(&mut xs, 0.5).as_secs_f64() * 1e3
    };
    println!(
        "{}",
        serde_json::json!({
            "summary": true, "rounds": rounds, "rate": rate,
            "quiet_p50_ms": median(&mut quiet, 0), "quiet_p99_ms": median(&mut quiet, 1),
            "attacked_p50_ms": median(&mut attacked, 0), "attacked_p99_ms": median(&mut attacked, 1),
            "p99_ratio": median(&mut attacked, 1) / median(&mut quiet, 1).max(1e-9),
            "peak_rss_mib": rss.peak() >> 20,
            "bridge_memory_reserved_peak_note": "limits.memory 512 MiB, connection_memory 64 MiB",
        })
    );
    cloud.bridge.stop().await;
    Ok(())
}

/// Holds 16 batch streams that announce 16 MiB and send 1 KiB, on one connection after
/// another until `stop`.
async fn hold_streams(
    addr: std::net::SocketAddr,
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    stop: CancellationToken,
) -> u64 {
    while !stop.is_cancelled() {
        let Ok(conn) = quic::connect(addr, &ca, &cert, &key).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let _control = quic::welcomed(&conn, EPOCH).await;
        let mut streams = Vec::new();
        while let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_millis(300), conn.open_uni()).await {
            let _ = s.write_all(&(16u32 << 20).to_be_bytes()).await;
            let _ = s.write_all(&[0u8; 1024]).await;
            streams.push(s);
        }
        tokio::select! {
            _ = conn.closed() => {}
            _ = stop.cancelled() => {}
        }
    }
    0
}

/// Sends `bomb` (one encoded batch frame) on one connection after another until `stop`; how
/// many went.
async fn bombs(
    addr: std::net::SocketAddr,
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    bomb: Vec<u8>,
    stop: CancellationToken,
) -> u64 {
    let mut sent = 0;
    while !stop.is_cancelled() {
        let Ok(conn) = quic::connect(addr, &ca, &cert, &key).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let _control = quic::welcomed(&conn, EPOCH).await;
        if let Ok(mut uni) = conn.open_uni().await
            && uni.write_all(&bomb).await.is_ok()
        {
            let _ = uni.finish();
            sent += 1;
        }
        tokio::select! {
            _ = conn.closed() => {}
            _ = stop.cancelled() => {}
        }
    }
    sent
}
