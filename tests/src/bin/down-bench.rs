//! Cloud to edge (issue 31): a message published in the cloud until a local QoS 1 subscriber on
//! the edge has it, ours against a Mosquitto bridge, in one run.
//! - Ours: `downlink::send` (the code `cloud-bridge send` runs) into a nats-server with
//!   JetStream, a cloud-bridge process, an edge-node process with `[[downlink]] filter = "#"`,
//!   a subscriber on the edge. Each send returns once JetStream stored the message and the
//!   edge's backlog bound was checked. Two more runs publish into the downlink's stream with a
//!   plain NATS client instead (as any cloud app may): at RATE, each ack awaited (latency
//!   without `send`'s round trips), and acks pipelined (throughput): the delivery path alone.
//! - Mosquitto: a publisher (QoS 1) on a cloud Mosquitto, an edge Mosquitto bridged to it with
//!   `topic # in 1`, a subscriber on the edge Mosquitto.
//!
//! Two runs each: COUNT messages at RATE a second (latency: p50, p99, max from publish to
//! delivery), and COUNT messages as fast as the publisher goes (throughput: from the first
//! publish to the last delivery). Payloads carry the send time. Prints one JSON line per run.
//!
//! A fourth run of ours stores LINES messages in one `cloud-bridge send --lines` (the code the
//! command runs, in process): the rate they are stored at, then delivered; a fifth stores LINES
//! messages spread over 100 edges not connected (stored only).
//!
//! Usage: down-bench [COUNT=2000] [RATE=200] [PAYLOAD=256] [LINES=10000]; BRIDGE_CONFIG adds
//! to the bridge's config (`\n` for a line break), e.g. `[downlink]\nwindow_messages = 256`;
//! PUBLISH_COUNT (default COUNT) is the count of the NATS publisher's run and of the Mosquitto
//! bridge's throughput run (2,000 go by in a fifth of a second, too short to tell builds apart).
//! After the NATS publisher's run, a line says where the bridge's reads took their messages
//! from so far (`bridge_downlink_reads_total`: what the news read kept, or the stream).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cloud_bridge::downlink::DownlinkConfig;
use cloud_bridge::downlink::send::{self, Flags};
use e2e_tests::cloud::uplink_section;
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::fleet::BridgeProcess;
use e2e_tests::nats::NatsServer;
use e2e_tests::node::EdgeProcess;
use e2e_tests::simedge::quantile;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::json;

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos()
}

/// A payload of `size` bytes that starts with the send time.
fn payload(size: usize) -> Vec<u8> {
    let mut p = format!("{} ", now_ns()).into_bytes();
    p.resize(size.max(p.len()), b'x');
    p
}

/// A QoS 1 subscriber to `#` on `addr`: each delivery's latency and when it came.
struct Subscriber {
    got: Arc<Mutex<Vec<(Duration, Instant)>>>,
}

async fn subscriber(addr: SocketAddr, id: &str) -> anyhow::Result<Subscriber> {
    let mut options = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    options.set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut events) = AsyncClient::new(options, 1000);
    client.subscribe("#", QoS::AtLeastOnce).await?;
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = got.clone();
    let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _client = client;
        let mut subscribed_tx = Some(subscribed_tx);
        while let Ok(event) = events.poll().await {
            match event {
                Event::Incoming(Packet::Publish(p)) => {
                    let sent = std::str::from_utf8(&p.payload)
                        .ok()
                        .and_then(|s| s.split(' ').next())
                        .and_then(|t| t.parse::<u128>().ok());
                    if let Some(sent) = sent {
                        let took = Duration::from_nanos(now_ns().saturating_sub(sent) as u64);
                        seen.lock().unwrap().push((took, Instant::now()));
                    }
                }
                Event::Incoming(Packet::SubAck(_)) => {
                    if let Some(s) = subscribed_tx.take() {
                        let _ = s.send(());
                    }
                }
                _ => {}
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(10), subscribed).await??;
    Ok(Subscriber { got })
}

impl Subscriber {
    async fn wait_for(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.got.lock().unwrap().len() < n {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    fn take(&self) -> Vec<(Duration, Instant)> {
        std::mem::take(&mut *self.got.lock().unwrap())
    }
}

/// Publishes `count` messages with `publish`, at `rate` a second (0: as fast as it returns), and
/// waits for the subscriber to have them: the run's JSON line.
async fn run<F, Fut>(
    system: &str,
    mode: &str,
    count: usize,
    rate: u64,
    sub: &Subscriber,
    mut publish: F,
) -> serde_json::Value
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    sub.take();
    let start = Instant::now();
    for i in 0..count {
        if rate > 0 {
            let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
            tokio::time::sleep_until(due.into()).await;
        }
        if let Err(e) = publish().await {
            return json!({"system": system, "mode": mode, "error": e.to_string()});
        }
    }
    let published = start.elapsed();
    let all = sub.wait_for(count, Duration::from_secs(120)).await;
    let got = sub.take();
    let last = got.iter().map(|(_, at)| *at).max().unwrap_or(start);
    let mut latencies: Vec<Duration> = got.iter().map(|(l, _)| *l).collect();
    let span = last.duration_since(start).as_secs_f64();
    json!({"system": system, "mode": mode, "count": count, "delivered": got.len(), "all": all,
           "rate": rate, "publish_s": published.as_secs_f64(), "span_s": span,
           "msgs_per_s": got.len() as f64 / span.max(1e-9),
           "p50_ms": quantile(&mut latencies, 0.5).as_secs_f64() * 1e3,
           "p99_ms": quantile(&mut latencies, 0.99).as_secs_f64() * 1e3,
           "max_ms": quantile(&mut latencies, 1.0).as_secs_f64() * 1e3})
}

/// One send of `n` messages for edge-1 (`cloud-bridge send --lines`): the lines parsed and
/// stored by the code the command runs, timed to stored, then to the subscriber's last.
async fn send_lines(
    sink: &cloud_bridge::sink::jetstream::JetStreamSink,
    sub: &Subscriber,
    n: usize,
    size: usize,
) -> serde_json::Value {
    use cloud_bridge::downlink::lines;
    sub.take();
    // A bound that holds them all: the rate of storing, not of refusing.
    let down = DownlinkConfig { max_backlog_messages: n as u64 * 2, ..Default::default() };
    let start = Instant::now();
    let text: String = (0..n)
        .map(|_| {
            let p = String::from_utf8(payload(size)).unwrap_or_default();
            format!("{{\"edge\": \"edge-1\", \"topic\": \"cmd/bench\", \"payload\": \"{p}\"}}\n")
        })
        .collect();
    let stored = async {
        let parsed = lines::parse(text.as_bytes())?;
        let outcomes = lines::send(sink, &down, &parsed).await?;
        anyhow::ensure!(outcomes.iter().all(|o| o.all_stored() && o.stored == n as u64), "{outcomes:?}");
        Ok(())
    };
    if let Err(e) = stored.await {
        return json!({"system": "ours-send-lines", "mode": "throughput", "error": e.to_string()});
    }
    let stored = start.elapsed().as_secs_f64();
    let all = sub.wait_for(n, Duration::from_secs(120)).await;
    let got = sub.take();
    let last = got.iter().map(|(_, at)| *at).max().unwrap_or(start);
    let span = last.duration_since(start).as_secs_f64();
    json!({"system": "ours-send-lines", "mode": "throughput", "count": n, "delivered": got.len(), "all": all,
           "stored_s": stored, "stored_per_s": n as f64 / stored.max(1e-9), "span_s": span,
           "msgs_per_s": got.len() as f64 / span.max(1e-9)})
}

/// One send of `n` messages spread over `edges` edges that are not connected
/// (`"new_edge": true`): the rate they are stored at, several edges at once.
async fn send_lines_to_many(
    sink: &cloud_bridge::sink::jetstream::JetStreamSink,
    n: usize,
    size: usize,
    edges: usize,
) -> serde_json::Value {
    use cloud_bridge::downlink::lines;
    let down = DownlinkConfig::default();
    let p = "x".repeat(size);
    let text: String = (0..n)
        .map(|i| {
            let e = i % edges;
            format!("{{\"edge\": \"far-{e}\", \"new_edge\": true, \"topic\": \"cmd/bench\", \"payload\": \"{p}\"}}\n")
        })
        .collect();
    let start = Instant::now();
    let stored = async {
        let parsed = lines::parse(text.as_bytes())?;
        let outcomes = lines::send(sink, &down, &parsed).await?;
        anyhow::ensure!(outcomes.len() == edges && outcomes.iter().all(|o| o.all_stored()), "{outcomes:?}");
        Ok(())
    };
    if let Err(e) = stored.await {
        return json!({"system": "ours-send-lines-fleet", "mode": "throughput", "error": e.to_string()});
    }
    let stored = start.elapsed().as_secs_f64();
    json!({"system": "ours-send-lines-fleet", "mode": "throughput", "count": n, "edges": edges,
           "stored_s": stored, "stored_per_s": n as f64 / stored.max(1e-9)})
}

fn mosquitto(dir: &std::path::Path, name: &str, port: u16, extra: &str) -> anyhow::Result<Child> {
    let conf = dir.join(format!("{name}.conf"));
    std::fs::write(
        &conf,
        format!("listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 100000\n{extra}"),
    )?;
    let child = Command::new("mosquitto").arg("-c").arg(&conf).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(Instant::now() < deadline, "mosquitto {name} did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (count, rate, size) = (arg(0, 2000) as usize, arg(1, 200), arg(2, 256) as usize);
    let lines = arg(3, 10_000) as usize;
    let publish_count = std::env::var("PUBLISH_COUNT").ok().and_then(|c| c.parse().ok()).unwrap_or(count);
    let dir = tempfile::tempdir()?;

    // Ours.
    let pki = cloud_bridge::certs::init(&dir.path().join("pki"), &[], &["edge-1".to_owned()], false)?;
    let nats = NatsServer::start();
    let sink_section = format!("kind = \"jetstream\"\nurl = \"{}\"\n", nats.url());
    let bridge_dir = dir.path().join("bridge");
    std::fs::create_dir_all(&bridge_dir)?;
    // BRIDGE_CONFIG: more of the bridge's config (a `[downlink]` window, say), to see what moves.
    let bridge_config = std::env::var("BRIDGE_CONFIG").unwrap_or_default().replace("\\n", "\n");
    let bridge = BridgeProcess::start(&bridge_dir, &pki, &sink_section, &bridge_config)?;
    let edge_dir = dir.path().join("edge");
    std::fs::create_dir_all(&edge_dir)?;
    let port = e2e_tests::free_port();
    let config = format!(
        "node_id = \"edge-1\"\n[http]\nbind = \"127.0.0.1:0\"\n[[listener]]\nname = \"local\"\nbind = \"127.0.0.1:{port}\"\n\
         anonymous = true\n{}\n{}\n[[downlink]]\nfilter = \"#\"\nmax_qos = 1\n",
        with_spool(&[telemetry()]),
        uplink_section(&pki, "edge-1", &[bridge.quic], "")
    );
    let edge = EdgeProcess::start(&edge_dir, &config);
    let settings = e2e_tests::nats::sink_settings(nats.url(), cloud_bridge::sink::jetstream::BatchPublish::Auto);
    let sink = cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings).await?;
    let sub = subscriber(edge.addr("local"), "bench-sub").await?;
    let down = DownlinkConfig::default();
    let to = vec!["edge-1".to_owned()];
    let send_one = || {
        let (sink, down, to) = (&sink, &down, &to);
        async move {
            let msg = send::message(Flags {
                topic: "cmd/bench".into(),
                qos: 1,
                payload: payload(size),
                ..Default::default()
            })?;
            send::send(sink, down, to, &msg).await?;
            Ok(())
        }
    };
    // The session is up once a first message comes through.
    send_one().await?;
    anyhow::ensure!(sub.wait_for(1, Duration::from_secs(30)).await, "the edge never got the first message");
    println!("{}", run("ours", "latency", count, rate, &sub, send_one).await);
    println!("{}", run("ours", "throughput", count, 0, &sub, send_one).await);
    // A cloud app publishing into the downlink's stream with its own NATS client, acks awaited
    // 256 at a time as a JetStream publisher pipelines them: the delivery path's own rate.
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await?);
    let acks = Mutex::new(Vec::new());
    let publish_nats = || {
        let (js, acks) = (&js, &acks);
        async move {
            let ack = js.publish("down.edge-1.cmd.bench", payload(size).into()).await?;
            let full = {
                let mut a = acks.lock().unwrap();
                a.push(ack);
                (a.len() >= 256).then(|| std::mem::take(&mut *a))
            };
            for ack in full.into_iter().flatten() {
                ack.await?;
            }
            Ok(())
        }
    };
    // The same publisher at RATE, each publish's ack awaited: the delivery path's latency
    // without `send`'s own round trips (the bound's checks, the edge's document).
    let publish_stored = || {
        let js = &js;
        async move {
            js.publish("down.edge-1.cmd.bench", payload(size).into()).await?.await?;
            Ok(())
        }
    };
    println!("{}", run("ours-nats-publisher", "latency", count, rate, &sub, publish_stored).await);
    println!("{}", run("ours-nats-publisher", "throughput", publish_count, 0, &sub, publish_nats).await);
    let reads = |outcome: &str| bridge.metric(&format!("bridge_downlink_reads_total{{outcome=\"{outcome}\"}}"));
    println!("{}", json!({"system": "ours-downlink-reads", "kept": reads("kept"), "stream": reads("stream")}));
    let left = std::mem::take(&mut *acks.lock().unwrap());
    for ack in left {
        ack.await?;
    }
    // Last: what these store stays in the stream (the far edges never connect), and a stream
    // holding many other edges' messages makes every filtered get slower (the publisher's
    // delivery above: 900 msg/s after them, 2,900 before).
    println!("{}", send_lines(&sink, &sub, lines, size).await);
    println!("{}", send_lines_to_many(&sink, lines, size, 100).await);
    drop(edge);
    drop(bridge);
    drop(nats);

    // A Mosquitto bridge.
    let (cloud_port, edge_port) = (e2e_tests::free_port(), e2e_tests::free_port());
    let mut cloud = mosquitto(dir.path(), "cloud", cloud_port, "")?;
    let bridge_conf = format!(
        "connection cloud\naddress 127.0.0.1:{cloud_port}\ntopic # in 1\ncleansession true\nrestart_timeout 1\n"
    );
    let mut edge = mosquitto(dir.path(), "edge", edge_port, &bridge_conf)?;
    let sub = subscriber(SocketAddr::from(([127, 0, 0, 1], edge_port)), "bench-sub").await?;
    let mut options = MqttOptions::new("bench-pub", "127.0.0.1", cloud_port);
    options.set_max_packet_size(1 << 20, 1 << 20);
    let (publisher, mut events) = AsyncClient::new(options, 1000);
    tokio::spawn(async move { while events.poll().await.is_ok() {} });
    let publish_one = || {
        let publisher = &publisher;
        async move {
            publisher.publish("cmd/bench", QoS::AtLeastOnce, false, payload(size)).await?;
            Ok(())
        }
    };
    // The bridge is up once a first message comes through.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        publish_one().await?;
        if sub.wait_for(1, Duration::from_millis(500)).await {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the Mosquitto bridge never delivered");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("{}", run("mosquitto-bridge", "latency", count, rate, &sub, publish_one).await);
    println!("{}", run("mosquitto-bridge", "throughput", publish_count, 0, &sub, publish_one).await);
    let _ = edge.kill();
    let _ = cloud.kill();
    let _ = (edge.wait(), cloud.wait());
    Ok(())
}
