//! Publish-only QoS1 load for the end-to-end spool benchmark (scripts/bench-spool-e2e.sh):
//! `--clients` connections publish 1 KiB messages on `--topic`/<client>, together at `--rate`
//! msg/s (0: as fast as PUBACKs return), and time each PUBLISH to its PUBACK. For a `full` class
//! that is the cost of acknowledging after the commit. Prints one JSON line.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};

struct Args {
    port: u16,
    topic: String,
    rate: u64,
    clients: u64,
    seconds: f64,
    payload: usize,
    label: String,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        port: 1883,
        topic: "telemetry/bench".into(),
        rate: 0,
        clients: 2,
        seconds: 5.0,
        payload: 1024,
        label: "load".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--port" => a.port = value.parse()?,
            "--topic" => a.topic = value,
            "--rate" => a.rate = value.parse()?,
            "--clients" => a.clients = value.parse()?,
            "--seconds" => a.seconds = value.parse()?,
            "--payload" => a.payload = value.parse()?,
            "--label" => a.label = value,
            other => bail!("unknown flag {other}"),
        }
    }
    anyhow::ensure!(a.clients >= 1, "--clients must be at least 1");
    Ok(a)
}

/// One connection: publishes until `until`, returns (acked, PUBACK latencies in µs).
async fn client(args: &Args, n: u64, until: Instant) -> anyhow::Result<(u64, Vec<u32>)> {
    let mut o = MqttOptions::new(format!("spool-load-{}-{n}", std::process::id()), "127.0.0.1", args.port);
    o.set_keep_alive(Duration::from_secs(30));
    o.set_inflight(100);
    o.set_max_packet_size(1 << 20, 1 << 20);
    let (publisher, mut events) = AsyncClient::new(o, 1_000);
    let topic = format!("{}/{n}", args.topic);
    let rate = args.rate as f64 / args.clients as f64;
    let payload = vec![0x5Au8; args.payload];
    let sender = tokio::spawn(async move {
        let start = Instant::now();
        let mut sent = 0u64;
        while Instant::now() < until {
            let due = if rate == 0.0 { sent + 1 } else { (start.elapsed().as_secs_f64() * rate) as u64 };
            while sent < due && Instant::now() < until {
                if publisher.publish(&topic, QoS::AtLeastOnce, false, payload.clone()).await.is_err() {
                    return;
                }
                sent += 1;
            }
            if rate != 0.0 {
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
        }
    });
    let mut in_flight: HashMap<u16, Instant> = HashMap::new();
    let mut latencies = Vec::new();
    let drain_until = until + Duration::from_secs(3);
    loop {
        let left = drain_until.saturating_duration_since(Instant::now());
        if left.is_zero() || (sender.is_finished() && in_flight.is_empty() && Instant::now() > until) {
            break;
        }
        match tokio::time::timeout(left.min(Duration::from_millis(200)), events.poll()).await {
            Ok(Ok(Event::Outgoing(Outgoing::Publish(pkid)))) => {
                in_flight.insert(pkid, Instant::now());
            }
            Ok(Ok(Event::Incoming(Packet::PubAck(ack)))) => {
                if let Some(t) = in_flight.remove(&ack.pkid) {
                    latencies.push(t.elapsed().as_micros() as u32);
                }
            }
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(e)) => bail!("client {n}: {e}"),
        }
    }
    sender.abort();
    Ok((latencies.len() as u64, latencies))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = std::sync::Arc::new(parse_args()?);
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(args.seconds);
    let mut tasks = Vec::new();
    for n in 0..args.clients {
        let args = args.clone();
        tasks.push(tokio::spawn(async move { client(&args, n, until).await }));
    }
    let mut acked = 0;
    let mut lat = Vec::new();
    for t in tasks {
        let (a, l) = t.await??;
        acked += a;
        lat.extend(l);
    }
    lat.sort_unstable();
    let pct =
        |q: f64| lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0);
    println!(
        "{}",
        serde_json::json!({
            "label": args.label,
            "rate": args.rate,
            "clients": args.clients,
            "acked": acked,
            "acked_rate": acked as f64 / args.seconds,
            "puback_p50_us": pct(0.50),
            "puback_p99_us": pct(0.99),
        })
    );
    Ok(())
}
