//! Hostile clients against the broker's bounds, on a real `edge-node` process whose RSS is
//! sampled: topic aliases on 60 KiB topics, 100,000 retained topics, 100,000 filters, 10,000
//! client ids. Each bound answers with its reason code and moves its counter, the process's
//! memory stays within what the bounds allow (docs/ARCHITECTURE.md, "Memory"), and an ordinary
//! client still gets through. These saturate the machine: they run in nextest's `serial` group.

use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::node::{EdgeProcess, config_text};
use e2e_tests::raw::{RawClient, connect_v5, publish_v5, subscribe_v5};
use rumqttc::QoS;

const WAIT: Duration = Duration::from_secs(20);
const MIB: u64 = 1 << 20;

fn start(extra: &str) -> (tempfile::TempDir, EdgeProcess) {
    let dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(dir.path(), &config_text(extra));
    (dir, edge)
}

async fn an_ordinary_client_gets_through(edge: &EdgeProcess) {
    let mut c = Client::anonymous(edge.addr("local"), "ordinary").await;
    c.subscribe("ordinary/x", QoS::AtLeastOnce).await;
    c.publish("ordinary/x", QoS::AtLeastOnce, false, "hi").await;
    assert!(c.recv(WAIT).await.is_some(), "an ordinary client's message did not come back");
}

async fn connected(edge: &EdgeProcess, id: &str, props: &[u8]) -> RawClient {
    let mut c = RawClient::connect(edge.addr("local")).await.unwrap();
    c.send(&connect_v5(id, true, props)).await.unwrap();
    let connack = c.until(2, WAIT).await.expect("CONNACK");
    assert_eq!(connack[3], 0, "{id}: CONNACK {connack:?}");
    c
}

/// Topic aliases cost at most `topic_alias_maximum` x `max_topic_length` per connection: 40
/// clients each register the 16 aliases allowed on 60 KiB topics (max_topic_length raised to
/// 64 KiB, the worst case) and stay connected: the process holds about 40 x 16 x 60 KiB for
/// them. Alias 17 disconnects each with 0x94 (rumqttd granted 4,096: 9.4 GiB here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_aliases_on_60_kib_topics_are_bounded_by_the_alias_maximum() {
    let (_dir, edge) = start("[broker]\nmax_topic_length = 65535\n");
    let before = edge.rss();
    let topic = |n: usize, alias: u16| {
        let mut t = format!("{n}/{alias}/").into_bytes();
        t.resize(60 * 1024, b'x');
        t
    };
    let mut clients = Vec::new();
    for n in 0..40 {
        let mut c = connected(&edge, &format!("alias-{n}"), &[]).await;
        let mut stream = Vec::new();
        for alias in 1..=16u16 {
            stream.extend(publish_v5(&topic(n, alias), 0, 0, false, &[0x23, 0, alias as u8], b"p"));
        }
        c.send(&stream).await.unwrap();
        // A PINGRESP after them: all 16 were taken.
        c.send(&[0xC0, 0]).await.unwrap();
        assert!(c.until(13, WAIT).await.is_some(), "client {n} lost after 16 aliases");
        clients.push(c);
    }
    let grown = edge.rss().saturating_sub(before);
    eprintln!("RSS {} MiB before, grew {} KiB with 640 aliases on 60 KiB topics", before / MIB, grown / 1024);
    assert!(grown < 40 * 16 * 64 * 1024 * 3 / 2 + 16 * MIB, "RSS grew {} MiB", grown / MIB);
    for (n, c) in clients.iter_mut().enumerate() {
        c.send(&publish_v5(&topic(n, 17), 0, 0, false, &[0x23, 0, 17], b"p")).await.unwrap();
        let disconnect = c.until(14, WAIT).await.expect("DISCONNECT for alias 17");
        assert_eq!(disconnect[2], 0x94, "{disconnect:?}");
    }
    assert_eq!(edge.metric("edge_mqtt_disconnects_total{reason=\"topic_alias_invalid\"}"), 40.0);
    an_ordinary_client_gets_through(&edge).await;
}

/// 100,000 retained topics against the default bound of 10,000: the first 10,000 are kept,
/// the rest refused and counted (QoS 0 cannot hear it), and memory stays near what 10,000 hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_retained_topics_keep_to_the_retained_bound() {
    let (_dir, edge) = start("");
    let before = edge.rss();
    let mut c = connected(&edge, "retainer", &[]).await;
    let mut stream = Vec::new();
    for i in 0..100_000u32 {
        stream.extend(publish_v5(format!("r/{i}").as_bytes(), 0, 0, true, &[], &[b'v'; 100]));
        if stream.len() > 256 * 1024 {
            c.send(&stream).await.unwrap();
            stream.clear();
        }
    }
    c.send(&stream).await.unwrap();
    assert!(
        e2e_tests::eventually(WAIT, || edge.metric("edge_mqtt_publish_refused_total{reason=\"retained_full\"}")
            == 90_000.0)
        .await,
        "refused {}",
        edge.metric("edge_mqtt_publish_refused_total{reason=\"retained_full\"}")
    );
    // The clients' 10,000, and the node's own `$SYS` topics, outside the bound.
    let retained = edge.metric("edge_mqtt_retained_messages");
    assert!((10_000.0..=10_010.0).contains(&retained), "{retained}");
    let grown = edge.rss().saturating_sub(before);
    eprintln!("RSS {} MiB before, grew {} KiB", before / MIB, grown / 1024);
    assert!(grown < 48 * MIB, "RSS grew {} MiB", grown / MIB);
    an_ordinary_client_gets_through(&edge).await;
}

/// 100,000 filters from ten clients against the default 100 per session: each SUBACK grants
/// 100 and answers 0x97 to the rest, the broker holds 1,000 subscriptions, memory stays small.
/// (10,000 distinct filters in one SUBSCRIBE pass `max_subscribe_filters` here, so the session
/// bound is what answers; `broker_trust.rs` has the per-packet one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_filters_keep_to_the_subscription_bound() {
    let (_dir, edge) = start("[broker]\nmax_subscribe_filters = 10000\n");
    let before = edge.rss();
    // The node's own SLO probe holds a subscription too.
    let held = edge.metric("edge_mqtt_subscriptions");
    let mut clients = Vec::new();
    for n in 0..10 {
        let mut c = connected(&edge, &format!("subscriber-{n}"), &[]).await;
        let filters: Vec<String> = (0..10_000).map(|i| format!("f/{n}/{i}/+/#")).collect();
        c.send(&subscribe_v5(1, &filters, 1)).await.unwrap();
        let suback = c.until(9, WAIT).await.expect("SUBACK");
        let codes = &suback[suback.len() - 10_000..];
        assert!(
            codes[..100].iter().all(|c| *c == 1) && codes[100..].iter().all(|c| *c == 0x97),
            "{:?}",
            &codes[95..105]
        );
        clients.push(c);
    }
    assert_eq!(edge.metric("edge_mqtt_subscriptions"), held + 1000.0);
    assert_eq!(edge.metric("edge_mqtt_subscribe_refused_total{reason=\"max_subscriptions\"}"), 99_000.0);
    let grown = edge.rss().saturating_sub(before);
    eprintln!("RSS {} MiB before, grew {} KiB", before / MIB, grown / 1024);
    assert!(grown < 32 * MIB, "RSS grew {} MiB", grown / MIB);
    an_ordinary_client_gets_through(&edge).await;
}

/// 10,000 client ids, each leaving a session with an expiry, against the default 1,000
/// sessions: new ids past the bound are refused with CONNACK 0x97, the broker holds 1,000
/// sessions, and memory stays small. (All are anonymous, one identity: the per-identity bound
/// is raised here so that the global one answers; `broker::core::tests::namespace` has that one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_client_ids_keep_to_the_session_bound() {
    let (_dir, edge) = start("[broker]\nmax_stored_sessions_per_identity = 20000\n");
    let before = edge.rss();
    // The node's own SLO probe holds a session too, outside the bound.
    let held = edge.metric("edge_mqtt_sessions");
    let addr = edge.addr("local");
    let mut workers = Vec::new();
    for w in 0..20 {
        workers.push(tokio::spawn(async move {
            let (mut accepted, mut refused) = (0, 0);
            for i in 0..500 {
                let mut c = RawClient::connect(addr).await.unwrap();
                // Session Expiry Interval 3600 s: the session outlives the connection.
                c.send(&connect_v5(&format!("id-{w}-{i}"), true, &[0x11, 0, 0, 0x0E, 0x10])).await.unwrap();
                let connack = c.until(2, WAIT).await.expect("CONNACK");
                match connack[3] {
                    0 => accepted += 1,
                    0x97 => refused += 1,
                    other => panic!("CONNACK reason {other:#x}"),
                }
            }
            (accepted, refused)
        }));
    }
    let (mut accepted, mut refused) = (0, 0);
    for w in workers {
        let (a, r) = w.await.unwrap();
        accepted += a;
        refused += r;
    }
    assert_eq!((accepted, refused), (1000, 9000));
    assert_eq!(edge.metric("edge_mqtt_sessions"), held + 1000.0);
    assert_eq!(edge.metric("edge_mqtt_connects_refused_total{listener=\"local\",reason=\"max_sessions\"}"), 9000.0);
    let grown = edge.rss().saturating_sub(before);
    eprintln!("RSS {} MiB before, grew {} KiB", before / MIB, grown / 1024);
    assert!(grown < 32 * MIB, "RSS grew {} MiB", grown / MIB);
}

/// Concurrent CONNECTs with made-up credentials (argon2 costs about 19 MiB each; 400 of them
/// once took the gateway past 4 GiB): with the default config the checks run two at a time,
/// connections still logging in are capped apart from admitted ones, RSS stays under 100 MB,
/// and a legitimate user whose login is not cached still gets in while the flood goes on.
/// `FLOOD_LOGINS` sets how many run at once (200 in CI; the benchmark uses 1,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bogus_logins_keeps_memory_bounded_and_lets_a_real_user_in() {
    use e2e_tests::raw::connect_v311_login;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let flood: usize = std::env::var("FLOOD_LOGINS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    edge_node::auth::PasswordFile::set_password(&dir.path().join("passwd"), "alice", b"wonderland").unwrap();
    let extra = "[auth]\npassword_file = \"passwd\"\n[[listener]]\nname = \"password\"\nbind = \"127.0.0.1:0\"\n";
    let edge = EdgeProcess::start(dir.path(), &config_text(extra));
    let addr = edge.addr("password");
    let before = edge.rss();
    let stop = Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = (0..flood)
        .map(|n| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut tries = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    tries += 1;
                    let Ok(mut c) = RawClient::connect(addr).await else { continue };
                    let user = format!("nobody-{n}-{tries}");
                    if c.send(&connect_v311_login(&user, &user, format!("guess-{tries}").as_bytes())).await.is_ok() {
                        let _ = c.packet(Duration::from_secs(10)).await;
                    }
                }
            })
        })
        .collect();
    let sampler = {
        let stop = stop.clone();
        let pid = edge.child.id();
        tokio::spawn(async move {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(e2e_tests::rss_of(pid));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            peak
        })
    };
    // Let the flood fill every queue first.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = std::time::Instant::now();
    let mut attempts = 0;
    let admitted = loop {
        attempts += 1;
        if let Ok(mut c) = RawClient::connect(addr).await
            && c.send(&connect_v311_login("alice-client", "alice", b"wonderland")).await.is_ok()
            && let Some(connack) = c.until(2, Duration::from_secs(10)).await
            && connack[3] == 0
        {
            break true;
        }
        if started.elapsed() > Duration::from_secs(60) {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.await.unwrap();
    for a in attackers {
        let _ = a.await;
    }
    let refused = |reason: &str| {
        edge.metric(&format!("edge_mqtt_connects_refused_total{{listener=\"password\",reason=\"{reason}\"}}"))
    };
    let (bad, busy, pending) = (refused("bad_credentials"), refused("login_busy"), refused("max_pending"));
    eprintln!(
        "{flood} flooding: RSS {} MiB before, peak {} MiB; real login after {took:?} ({attempts} attempts); refused: {bad} bad credentials, {busy} busy, {pending} pending",
        before / MIB,
        peak / MIB
    );
    assert!(admitted, "the real user never got in: {}", edge.stderr());
    assert!(peak < 100 * MIB, "RSS peaked at {} MiB", peak / MIB);
    assert!(bad >= 1.0, "the flood's logins were checked and refused");
    an_ordinary_client_gets_through(&edge).await;
}
