//! Load generator for the local-latency benchmark (scripts/bench-local.sh): one QoS1 publisher
//! and one or more QoS1 subscribers (`--subscribers`, the fan-out case) on the same broker,
//! 1 KiB payloads carrying a sequence number and a send time, at a fixed rate or as fast as the
//! broker takes them. Prints one JSON line: latencies over every subscriber's deliveries, loss
//! as deliveries missing from what every subscriber should have got. With `--persistent 1` the
//! subscribers keep a persistent session (MQTT 3.1.1 Clean Session 0), so the broker stores
//! what it queues for them. The same binary runs against every broker compared, so client
//! overhead cancels out.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};

struct Args {
    host: String,
    port: u16,
    /// Messages per second; 0 = as fast as the broker acknowledges (max throughput).
    rate: u64,
    duration: Duration,
    warmup: Duration,
    payload: usize,
    subscribers: usize,
    label: String,
    persistent: bool,
    /// `--topic`: the topic published to (default `bench/<pid>`).
    topic: Option<String>,
    /// `--json 1`: JSON payloads (`{"seq":..,"sent":..,"device":..,"cpu_pct":..,"pad":".."}`,
    /// padded to `--payload` bytes), for topics a schema governs; `--json 2`: the same filled
    /// with a `detections` array of small objects instead of the pad (what costs a validator:
    /// structure, not a long string).
    json: u8,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        host: "127.0.0.1".into(),
        port: 1883,
        rate: 1000,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(1),
        payload: 1024,
        subscribers: 1,
        label: "broker".into(),
        persistent: false,
        topic: None,
        json: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--host" => a.host = value,
            "--port" => a.port = value.parse()?,
            "--rate" => a.rate = value.parse()?,
            "--seconds" => a.duration = Duration::from_secs_f64(value.parse()?),
            "--warmup" => a.warmup = Duration::from_secs_f64(value.parse()?),
            "--payload" => a.payload = value.parse()?,
            "--subscribers" => a.subscribers = value.parse()?,
            "--label" => a.label = value,
            "--persistent" => a.persistent = value == "1",
            "--topic" => a.topic = Some(value),
            "--json" => a.json = value.parse()?,
            other => bail!("unknown flag {other}"),
        }
    }
    anyhow::ensure!(a.payload >= 16, "--payload must be at least 16 bytes");
    Ok(a)
}

fn options(args: &Args, id: &str) -> MqttOptions {
    let mut o = MqttOptions::new(format!("{id}-{}", std::process::id()), &args.host, args.port);
    o.set_keep_alive(Duration::from_secs(30));
    o.set_inflight(100);
    o.set_max_packet_size(1 << 20, 1 << 20);
    o
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let topic = args.topic.clone().unwrap_or_else(|| format!("bench/{}", std::process::id()));
    let base = Instant::now();

    // Subscribers first, each waiting for its SUBACK, so nothing published is missed.
    let total = args.warmup + args.duration;
    let mut receivers = Vec::new();
    for n in 0..args.subscribers {
        let mut o = options(&args, &format!("bench-sub{n}"));
        o.set_clean_session(!args.persistent);
        let (sub, mut sub_loop) = AsyncClient::new(o, 10_000);
        sub.subscribe(&topic, QoS::AtLeastOnce).await?;
        loop {
            if let Event::Incoming(Packet::SubAck(_)) = sub_loop.poll().await.context("subscriber connect")? {
                break;
            }
        }
        let warmup = args.warmup;
        let json = args.json;
        receivers.push(tokio::spawn(async move {
            let _keep = sub;
            let mut latencies_us: Vec<u32> = Vec::new();
            let mut seen = HashSet::new();
            let mut duplicates = 0u64;
            let mut first_measured: Option<Instant> = None;
            let mut last_measured = Instant::now();
            loop {
                let event = tokio::time::timeout(Duration::from_secs(3), sub_loop.poll()).await;
                let Ok(Ok(event)) = event else { break };
                if let Event::Incoming(Packet::Publish(p)) = event {
                    let now = base.elapsed().as_nanos() as u64;
                    let (seq, sent) = match json != 0 {
                        true => read_json(&p.payload),
                        false => (
                            u64::from_be_bytes(p.payload[0..8].try_into().unwrap_or_default()),
                            u64::from_be_bytes(p.payload[8..16].try_into().unwrap_or_default()),
                        ),
                    };
                    if !seen.insert(seq) {
                        duplicates += 1;
                        continue;
                    }
                    // Messages sent during the warm-up are not measured.
                    if Duration::from_nanos(sent) >= warmup {
                        first_measured.get_or_insert_with(Instant::now);
                        last_measured = Instant::now();
                        latencies_us.push(((now.saturating_sub(sent)) / 1000) as u32);
                    }
                }
            }
            let window = first_measured.map(|f| last_measured - f).unwrap_or_default();
            (latencies_us, seen.len() as u64, duplicates, window)
        }));
    }

    let (publisher, mut pub_loop) = AsyncClient::new(options(&args, "bench-pub"), 10_000);
    let pub_driver = tokio::spawn(async move {
        loop {
            if pub_loop.poll().await.is_err() {
                return;
            }
        }
    });
    let mut payload = vec![0xA5u8; args.payload];
    let mut seq: u64 = 0;
    let mut measured_sent: u64 = 0;
    let start = Instant::now();
    while start.elapsed() < total {
        let due = if args.rate == 0 { seq + 1 } else { (start.elapsed().as_secs_f64() * args.rate as f64) as u64 };
        while seq < due {
            let sent_at = base.elapsed();
            if args.json != 0 {
                payload = json_payload(seq, sent_at.as_nanos() as u64, args.payload, args.json == 2);
            } else {
                payload[0..8].copy_from_slice(&seq.to_be_bytes());
                payload[8..16].copy_from_slice(&(sent_at.as_nanos() as u64).to_be_bytes());
            }
            // With rate 0 this awaits the client's queue, which drains as PUBACKs return: the
            // broker's QoS1 acknowledgement rate sets the pace.
            publisher.publish(&topic, QoS::AtLeastOnce, false, payload.clone()).await?;
            if sent_at >= args.warmup {
                measured_sent += 1;
            }
            seq += 1;
        }
        if args.rate != 0 {
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    }
    let (mut lat, mut received_total, mut duplicates, mut window) = (Vec::new(), 0, 0, Duration::ZERO);
    for r in receivers {
        let (l, received, dups, w) = r.await?;
        lat.extend(l);
        received_total += received;
        duplicates += dups;
        window = window.max(w);
    }
    pub_driver.abort();
    lat.sort_unstable();
    let pct =
        |q: f64| lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0);
    let measured_received = lat.len() as u64;
    let expected = measured_sent * args.subscribers as u64;
    println!(
        "{}",
        serde_json::json!({
            "label": args.label,
            "rate": args.rate,
            "payload": args.payload,
            "subscribers": args.subscribers,
            "persistent": args.persistent,
            "sent": measured_sent,
            "received": measured_received,
            "lost": expected.saturating_sub(measured_received),
            "received_total": received_total,
            "sent_total": seq,
            "duplicates": duplicates,
            "p50_us": pct(0.50),
            "p99_us": pct(0.99),
            "max_us": lat.last().copied().unwrap_or(0),
            // Publishes a second, whatever the fan-out.
            "achieved_rate": if window.is_zero() { 0.0 } else { measured_received as f64 / args.subscribers as f64 / window.as_secs_f64() },
        })
    );
    Ok(())
}

/// A JSON reading carrying `seq` and `sent`, padded to about `size` bytes.
fn json_payload(seq: u64, sent: u64, size: usize, structured: bool) -> Vec<u8> {
    if structured {
        let mut out = format!(r#"{{"seq":{seq},"sent":{sent},"device":"cam-01","cpu_pct":61.5,"detections":["#);
        let mut n = 0u64;
        while out.len() + 64 < size {
            if n > 0 {
                out.push(',');
            }
            out.push_str(&format!(r#"{{"label":"person","score":0.{:02},"x":{},"y":{}}}"#, n % 100, n % 640, n % 480));
            n += 1;
        }
        out.push_str("]}");
        return out.into_bytes();
    }
    let head = format!(r#"{{"seq":{seq},"sent":{sent},"device":"cam-01","cpu_pct":61.5,"pad":""#);
    let pad = size.saturating_sub(head.len() + 2);
    let mut out = head.into_bytes();
    out.resize(out.len() + pad, b'a');
    out.extend_from_slice(b"\"}");
    out
}

fn read_json(payload: &[u8]) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
    (v["seq"].as_u64().unwrap_or_default(), v["sent"].as_u64().unwrap_or_default())
}
