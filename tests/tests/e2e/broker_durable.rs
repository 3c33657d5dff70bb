//! Broker state across restarts of a real `edge-node` process, clean (SIGTERM) and not
//! (SIGKILL): retained messages, a pending delayed will, and a persistent paho subscriber's
//! queue filled by a paho publisher while the node is killed under it. What is acknowledged is
//! never lost (docs/ARCHITECTURE.md, "Broker state across restarts").

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use e2e_tests::client::Client;
use e2e_tests::node::{EdgeProcess, config_text};
use e2e_tests::raw::{self, RawClient};
use rumqttc::QoS;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const WAIT: Duration = Duration::from_secs(10);
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/paho_durable.py");

/// A node config on a fixed port, so clients find it again after a restart.
fn fixed_port_config(extra: &str) -> String {
    let port = e2e_tests::free_port();
    config_text(extra).replace("bind = \"127.0.0.1:0\"\nanonymous", &format!("bind = \"127.0.0.1:{port}\"\nanonymous"))
}

/// Stops the node with `signal` and starts it again on the same directory and config.
fn restart(edge: &mut EdgeProcess, dir: &Path, config: &str, signal: &str) {
    edge.signal(signal);
    let status = edge.wait_exit(WAIT).unwrap_or_else(|| panic!("no exit after SIG{signal}: {}", edge.stderr()));
    if signal == "TERM" {
        assert!(status.success(), "{}", edge.stderr());
    }
    *edge = EdgeProcess::start(dir, config);
}

async fn retained(addr: std::net::SocketAddr, id: &str) -> BTreeSet<String> {
    let mut sub = Client::anonymous(addr, id).await;
    sub.subscribe("state/#", QoS::AtLeastOnce).await;
    let mut got = BTreeSet::new();
    while let Some(p) = sub.recv(Duration::from_millis(500)).await {
        assert!(p.retain, "sent because of the subscription: RETAIN set");
        got.insert(String::from_utf8_lossy(&p.payload).into_owned());
    }
    got
}

/// [MQTT-3.3.1-5] across restarts of the process: five retained messages (QoS 1, so each was
/// acknowledged after it was stored) are all served after a SIGTERM and after a SIGKILL; a
/// cleared one stays cleared. A delayed will pending when the node is killed is published at
/// its time after the restart ([MQTT-3.1.3-9]; Mosquitto with `persistence true` loses what
/// came since its last autosave).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_messages_and_a_pending_will_survive_sigterm_and_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let config = fixed_port_config("");
    let mut edge = EdgeProcess::start(dir.path(), &config);
    let addr = edge.addr("local");
    let mut publisher = Client::anonymous(addr, "retainer").await;
    for i in 0..6 {
        publisher.publish(&format!("state/{i}"), QoS::AtLeastOnce, true, format!("v{i}")).await;
    }
    publisher.publish("state/5", QoS::AtLeastOnce, true, "").await;
    // Acknowledged, so stored: a subscriber from here on gets them as retained messages, not
    // live (a race that failed 2 runs in 8 under load).
    assert!(publisher.acked(7, WAIT).await, "PUBACKs for the retained publishes");
    let want: BTreeSet<String> = (0..5).map(|i| format!("v{i}")).collect();
    assert_eq!(retained(addr, "before").await, want);

    restart(&mut edge, dir.path(), &config, "TERM");
    assert_eq!(retained(addr, "after-term").await, want, "kept across a clean stop");

    // A client with a will delayed 3 s and a session of 60 s loses its connection, and the node
    // is killed before the will is due.
    // Will Delay Interval 3 s (0x18); Session Expiry 60 s (0x11).
    let will_delay = [&[0x18][..], &3u32.to_be_bytes()].concat();
    let connect = raw::connect_v5_will("dying", true, &[0x11, 0, 0, 0, 60], &will_delay, "wills/dying", b"gone");
    let mut dying = RawClient::connect(addr).await.unwrap();
    dying.send(&connect).await.unwrap();
    assert!(dying.until(2, WAIT).await.is_some(), "CONNACK");
    drop(dying);
    tokio::time::sleep(Duration::from_millis(300)).await;
    restart(&mut edge, dir.path(), &config, "KILL");
    assert_eq!(retained(addr, "after-kill").await, want, "kept across a kill");
    let mut watcher = Client::anonymous(addr, "watcher").await;
    watcher.subscribe("wills/#", QoS::AtLeastOnce).await;
    let will = watcher.recv(WAIT).await.expect("the pending will is published after the restart");
    assert_eq!(&will.payload[..], b"gone");
}

/// Runs `paho_durable.py` to the end; its last line as JSON.
async fn paho(args: &[&str]) -> serde_json::Value {
    let out = Command::new("python3").arg(SCRIPT).args(args).output().await.expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
    let last = text.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|_| serde_json::Value::String(last.to_owned()))
}

/// The end-to-end run: a persistent paho subscriber (QoS 2, MQTT 5) is offline (or, with
/// `live`, connected and reconnecting) while a paho publisher with a persistent session sends
/// 10,000 messages, half QoS 1 and half QoS 2, and the node is stopped with `signal` three
/// times during the run and started again. Every message the publisher had acknowledged reaches
/// the subscriber (Session Present 1 when it resumes): QoS 2 exactly once ([MQTT-4.3.3-9] on
/// both sides of the broker; a message in flight to the subscriber at a kill goes again with its
/// packet id, [MQTT-4.4.0-1]), QoS 1 at least once ([MQTT-4.3.2]).
async fn every_acknowledged_message_reaches_a_persistent_subscriber(signal: &str, live: bool) {
    const COUNT: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let config = fixed_port_config(
        "[broker]\nmax_queued_messages = 30000\nmax_queued_bytes = \"64 MiB\"\nmax_queued_bytes_total = \"128 MiB\"\n",
    );
    let mut edge = EdgeProcess::start(dir.path(), &config);
    let addr = edge.addr("local");
    let (host, port) = ("127.0.0.1".to_owned(), addr.port().to_string());
    assert_eq!(paho(&["subscribe", &host, &port]).await, serde_json::Value::String("ok".into()));
    let listening = live.then(|| {
        let args = ["collect".to_owned(), host.clone(), port.clone(), "4".to_owned()];
        tokio::spawn(async move { paho(&args.iter().map(String::as_str).collect::<Vec<_>>()).await })
    });

    let mut publisher = Command::new("python3")
        .arg(SCRIPT)
        .args(["publish", &host, &port, &COUNT.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut lines = BufReader::new(publisher.stdout.take().unwrap()).lines();
    let mut kills = 0;
    let mut result = None;
    let deadline = Instant::now() + Duration::from_secs(240);
    while let Some(line) =
        tokio::time::timeout_at(deadline.into(), lines.next_line()).await.expect("publisher stalled").unwrap()
    {
        if let Some(n) = line.strip_prefix("progress ").and_then(|n| n.parse::<usize>().ok()) {
            // Stopped at about a quarter, a half and three quarters of the run.
            if kills < 3 && n >= (kills + 1) * COUNT / 4 {
                restart(&mut edge, dir.path(), &config, signal);
                kills += 1;
            }
        } else {
            result = Some(line);
        }
    }
    let status = publisher.wait().await.unwrap();
    assert!(status.success(), "publisher failed");
    assert_eq!(kills, 3, "the node was stopped three times during the run");
    let result: serde_json::Value = serde_json::from_str(&result.expect("publisher result")).unwrap();
    let acked: BTreeSet<u64> = result["acked"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(
        acked.len(),
        COUNT,
        "paho resends until each is acknowledged; unacked: {}, refused: {}",
        result["unacked"],
        result["failed"]
    );

    let collected = match listening {
        Some(task) => task.await.unwrap(),
        None => paho(&["collect", &host, &port, "4"]).await,
    };
    assert_eq!(collected["present"], true, "Session Present after the restarts");
    let mut seen: BTreeMap<u64, Vec<(u64, bool)>> = BTreeMap::new();
    for g in collected["got"].as_array().unwrap() {
        let (id, qos, dup) = (g[0].as_u64().unwrap(), g[1].as_u64().unwrap(), g[2].as_bool().unwrap());
        seen.entry(id).or_default().push((qos, dup));
    }
    let missing: Vec<&u64> = acked.iter().filter(|id| !seen.contains_key(id)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged messages never arrived: {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    for (id, copies) in &seen {
        let qos = if id % 2 == 0 { 1 } else { 2 };
        assert!(copies.iter().all(|(q, _)| *q == qos), "message {id} arrived at {copies:?}");
        if qos == 2 {
            assert_eq!(copies.len(), 1, "QoS 2 message {id} arrived {} times (qos, dup): {copies:?}", copies.len());
        }
    }
    let extra = seen.values().map(|c| c.len() - 1).sum::<usize>();
    let resent = seen.values().flatten().filter(|(_, dup)| *dup).count();
    eprintln!(
        "{signal}, live {live}: {} acked, {} received, {extra} QoS 1 duplicates, {resent} with DUP",
        acked.len(),
        seen.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_reaches_an_offline_persistent_subscriber_across_three_sigkills() {
    every_acknowledged_message_reaches_a_persistent_subscriber("KILL", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_reaches_an_offline_persistent_subscriber_across_three_clean_restarts() {
    every_acknowledged_message_reaches_a_persistent_subscriber("TERM", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_reaches_a_connected_persistent_subscriber_across_three_sigkills() {
    every_acknowledged_message_reaches_a_persistent_subscriber("KILL", true).await;
}
