//! A restart of the broker's durable state (scripts/bench-sessions.sh): builds a session store of
//! SESSIONS persistent sessions (MQTT 3.1.1 Clean Session 0, one subscription each) holding
//! MESSAGES queued QoS 1 messages of PAYLOAD bytes among them, through the broker core and the
//! session store the node runs (in process, no sockets), then starts the shipped `edge-node`
//! binary on it ROUNDS times and measures each start: from spawn to ready (listeners bound, every
//! session restored), the store's own open-and-restore time from its log line, and the RSS once
//! ready, against `broker.max_queued_bytes_total`. Prints one JSON line.
//!
//! Usage: session-bench [SESSIONS=10000] [MESSAGES=100000] [PAYLOAD=256] [ROUNDS=3]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use edge_node::broker::BrokerConfig;
use edge_node::broker::codec::{Connect, Inbound, PublishPacket, PublishProps, QoS, SubscribeRequest, Version};
use edge_node::broker::core::{Broker, ConnectRequest, Identity, WallClock};
use edge_node::broker::driver::BrokerHandle;
use edge_node::broker::metrics::BrokerMetrics;
use edge_node::broker::store::SessionStore;
use edge_node::route::Classes;

fn connect(client_id: &str) -> Connect {
    Connect {
        version: Version::V311,
        client_id: client_id.into(),
        clean_start: false,
        keep_alive: 0,
        session_expiry: u32::MAX,
        receive_maximum: 100,
        max_packet_size: None,
        topic_alias_maximum: 0,
        request_problem_info: true,
        auth_method: None,
        will: None,
        username: None,
        password: None,
    }
}

fn broker_config(sessions: usize) -> BrokerConfig {
    BrokerConfig { max_sessions: Some(sessions + 100), ..BrokerConfig::default() }
}

/// The store at `path`, as the node would have left it.
fn build(path: &Path, sessions: usize, messages: usize, payload: usize) -> anyhow::Result<()> {
    let metrics = BrokerMetrics::new(&mut Default::default());
    let (store, _) = SessionStore::open(path, metrics.clone())?;
    let limits = broker_config(sessions).limits(Vec::new(), Vec::new());
    let core = Broker::new(limits, Arc::new(Classes::default()), metrics, WallClock::read());
    let handle = BrokerHandle::new(core, None, Some(store.clone()));
    let identity = || Identity { owner: "anonymous".into(), internal: false, rules: None };
    let now = Instant::now;
    for i in 0..sessions {
        let (conn, _) = handle.register();
        let request = ConnectRequest { conn, connect: connect(&format!("s{i}")), identity: identity() };
        let (admitted, routed) = handle.with(|b| {
            b.connect(request, now()).map_err(|r| format!("{r:?}"))?;
            let filter = SubscribeRequest {
                filter: format!("q/{i}"),
                qos: QoS::AtLeastOnce,
                no_local: false,
                retain_as_published: false,
                retain_handling: 0,
            };
            b.handle(conn, Inbound::Subscribe { pkid: 1, filters: vec![filter], id: None }, now());
            let _ = b.poll_transmit(conn, now(), usize::MAX);
            b.closed(conn, now());
            Ok::<_, String>(())
        });
        drop(routed);
        admitted.map_err(|r| anyhow::anyhow!("session {i} refused: {r}"))?;
    }
    let (publisher, _) = handle.register();
    let mut p = connect("publisher");
    p.clean_start = true;
    p.session_expiry = 0;
    let request = ConnectRequest { conn: publisher, connect: p, identity: identity() };
    handle.with(|b| b.connect(request, now())).0.map_err(|r| anyhow::anyhow!("publisher refused: {r:?}"))?;
    let body = Bytes::from(vec![0x5a; payload]);
    for n in 0..messages {
        let pkid = (n % 60_000) as u16 + 1;
        let packet = PublishPacket {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: Bytes::from(format!("q/{}", n % sessions)),
            pkid,
            topic_alias: None,
            message_expiry: None,
            props: PublishProps::default(),
            excess_user_properties: 0,
            payload: body.clone(),
        };
        // As the front does for an MQTT 3.1.1 client: read no more while its PUBACKs (which
        // wait for the store) are owed past the Receive Maximum.
        while !handle.with(|b| b.wants_input(publisher)).0 {
            store.flush();
        }
        let (_, routed) = handle.with(|b| {
            b.handle(publisher, Inbound::Publish(packet), now());
            // Its PUBACKs, taken as a client would.
            let _ = b.poll_transmit(publisher, now(), usize::MAX);
        });
        drop(routed);
    }
    let _ = handle.with(|b| b.closed(publisher, now()));
    store.flush();
    Ok(())
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok()))
        .unwrap_or(0)
}

/// The `took` of the node's "session store open" log line, ms.
fn restore_ms(log: &str) -> Option<f64> {
    let line = log.lines().find(|l| l.contains("session store open"))?;
    let took = line.split("took=").nth(1)?.split_whitespace().next()?;
    let (n, unit) = took.split_at(took.find(|c: char| c.is_ascii_alphabetic() || c == 'µ')?);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "s" => n * 1000.0,
        "ms" => n,
        "µs" | "us" => n / 1000.0,
        _ => return None,
    })
}

/// `text` without ANSI colour sequences (the node colours its log even into a file).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut arg = |default: usize| -> anyhow::Result<usize> {
        Ok(args.next().map(|a| a.parse()).transpose()?.unwrap_or(default))
    };
    let (sessions, messages, payload, rounds) = (arg(10_000)?, arg(100_000)?, arg(256)?, arg(3)?);
    let dir = tempfile::tempdir_in(std::env::var("SESSION_BENCH_DIR").unwrap_or_else(|_| "target".into()))?;
    let store = dir.path().join("sessions.db");
    let built = Instant::now();
    build(&store, sessions, messages, payload).context("building the store")?;
    let build_s = built.elapsed().as_secs_f64();
    let file_mb = std::fs::metadata(&store)?.len() as f64 / 1e6;

    let config = dir.path().join("edge.toml");
    std::fs::write(
        &config,
        format!(
            "node_id = \"bench\"\n[probe]\nenabled = false\n[broker]\nmax_sessions = {}\nsession_store = \"{}\"\n\
             [[listener]]\nname = \"local\"\nbind = \"127.0.0.1:0\"\nanonymous = true\n",
            sessions + 100,
            store.display()
        ),
    )?;
    let bin = e2e_tests::workspace_bin("edge-node");
    let (mut ready_ms, mut store_ms, mut rss) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let ready = dir.path().join(format!("ready-{round}.json"));
        let log = dir.path().join(format!("edge-{round}.log"));
        let started = Instant::now();
        let mut child = Command::new(&bin)
            .args(["run", "--config"])
            .arg(&config)
            .arg("--ready-file")
            .arg(&ready)
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        while !ready.exists() {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(120), "not ready in 120 s");
            anyhow::ensure!(child.try_wait()?.is_none(), "edge-node exited: {}", std::fs::read_to_string(&log)?);
            std::thread::sleep(Duration::from_millis(2));
        }
        ready_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        std::thread::sleep(Duration::from_millis(500));
        rss.push(rss_kb(child.id()) as f64 / 1024.0);
        child.kill()?;
        child.wait()?;
        let text = plain(&std::fs::read_to_string(&log)?);
        let sessions_line = text.lines().find(|l| l.contains("session store open")).unwrap_or_default();
        anyhow::ensure!(
            sessions_line.contains(&format!("sessions={sessions}")),
            "not every session restored: {sessions_line}"
        );
        anyhow::ensure!(
            sessions_line.contains(&format!("queued={messages}")),
            "not every message restored: {sessions_line}"
        );
        store_ms.push(restore_ms(&text).context("no restore time in the log")?);
    }
    println!(
        "{}",
        serde_json::json!({
            "sessions": sessions,
            "messages": messages,
            "payload": payload,
            "rounds": rounds,
            "store_mb": file_mb,
            "build_s": build_s,
            "start_to_ready_ms": median(ready_ms),
            "store_open_and_restore_ms": median(store_ms),
            "rss_mib": median(rss),
            "max_queued_bytes_total_mib": BrokerConfig::default().max_queued_bytes_total.bytes() as f64 / (1 << 20) as f64,
        })
    );
    Ok(())
}
