//! The broker core through real clients: paho-mqtt's MQTT 5 features (sessions, shared
//! subscriptions, No Local, Retain Handling, expiry, delayed wills, bounds), sessions that
//! survive a restart, a client id that belongs to its identity, and the bounds' counters.

use std::time::Duration;

use e2e_tests::client::{self, Client};
use e2e_tests::node::{EdgeProcess, TestNode, config_text};
use rumqttc::QoS;
use tokio::process::Command;

const WAIT: Duration = Duration::from_secs(10);

async fn paho_features(addr: std::net::SocketAddr, transport: &[&str]) -> (bool, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/paho_features.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["127.0.0.1", &addr.port().to_string()])
        .args(transport)
        .output()
        .await
        .expect("python3");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// paho-mqtt MQTT 5: a persistent session resumed with Session Present [MQTT-3.2.2-3] and its
/// message; a `$share` group splitting ten messages (§4.8.2); No Local [MQTT-3.8.3-3]; Retain
/// Handling 0, 1, 2 [MQTT-3.3.1-9..11]; Message Expiry counted down and an expired message not
/// sent [MQTT-3.3.2-5, -6]; a will after its delay [MQTT-3.1.2-8]; a fifth subscription refused
/// 0x97 and an over-long topic refused 0x90, each counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_mqtt5_sessions_shared_subscriptions_options_expiry_wills_and_bounds() {
    let t = TestNode::start("[broker]\nmax_subscriptions = 4\nmax_topic_length = 64\n").await;
    let (ok, text) = paho_features(t.local(), &[]).await;
    assert!(ok, "{text}");
    assert!(t.metric("edge_mqtt_subscribe_refused_total{reason=\"max_subscriptions\"}") >= 1.0, "{}", t.metrics());
    assert!(t.metric("edge_mqtt_publish_refused_total{reason=\"topic_too_long\"}") >= 1.0);
    assert!(t.metric("edge_mqtt_wills_total") >= 1.0);
}

/// The same through paho's WebSocket transport, on a `ws` and a `wss` listener (subprotocol
/// `mqtt`, [MQTT-6.0.0-3], [MQTT-6.0.0-4]; binary messages, [MQTT-6.0.0-1]), with the same
/// authentication and limits; a client offering no `mqtt` subprotocol is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_over_websocket_and_tls_websocket() {
    let dir = tempfile::tempdir().unwrap();
    let ca = e2e_tests::certs::Ca::new(dir.path(), "ws-ca");
    ca.server(dir.path(), "server");
    let ca_file = dir.path().join("ws-ca-ca.pem");
    let extra = "[broker]\nmax_subscriptions = 4\nmax_topic_length = 64\n\
                 [[listener]]\nname = \"ws\"\nbind = \"127.0.0.1:0\"\nanonymous = true\nwebsocket = true\n\
                 [[listener]]\nname = \"wss\"\nbind = \"127.0.0.1:0\"\nanonymous = true\nwebsocket = true\n\
                 [listener.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n";
    let t = TestNode::start_in(dir, extra).await;
    let (ok, text) = paho_features(t.addr("ws"), &["websockets", "/mqtt"]).await;
    assert!(ok, "ws: {text}");
    let ca = ca_file.display().to_string();
    let (ok, text) = paho_features(t.addr("wss"), &["websockets", "/", &ca]).await;
    assert!(ok, "wss: {text}");
    // A plain HTTP upgrade without the subprotocol.
    let mut raw = tokio::net::TcpStream::connect(t.addr("ws")).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    raw.write_all(b"GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").await.unwrap();
    let mut answer = vec![0u8; 256];
    let n = raw.read(&mut answer).await.unwrap();
    assert!(
        String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    assert_eq!(t.metric("edge_mqtt_connects_refused_total{listener=\"ws\",reason=\"websocket\"}"), 1.0);
}

/// Sessions with an expiry outlive the process: subscriptions made before a SIGTERM are there
/// after the restart, the session is resumed (Session Present), and a message published after
/// the restart reaches it ([MQTT-3.1.2-23] across a restart; queued messages: `broker_durable.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_session_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = e2e_tests::free_port();
    let config = config_text("")
        .replace("bind = \"127.0.0.1:0\"\nanonymous", &format!("bind = \"127.0.0.1:{port}\"\nanonymous"));
    let mut edge = EdgeProcess::start(dir.path(), &config);
    let mut options = client::options(edge.addr("local"), "durable");
    options.set_clean_session(false);
    let mut sub = Client::connect(options.clone()).await.unwrap();
    sub.subscribe("restart/#", QoS::AtLeastOnce).await;
    drop(sub);
    edge.signal("TERM");
    assert!(edge.wait_exit(WAIT).is_some_and(|s| s.success()), "{}", edge.stderr());

    let edge = EdgeProcess::start(dir.path(), &config);
    let publisher = Client::anonymous(edge.addr("local"), "pub").await;
    publisher.publish("restart/x", QoS::AtLeastOnce, false, "after the restart").await;
    let mut sub = Client::connect(options).await.unwrap();
    let got = sub.recv(WAIT).await.expect("the restored subscription delivers");
    assert_eq!(&got.payload[..], b"after the restart");
    assert!(dir.path().join("spool/sessions.db").exists());
}

/// A client id belongs to the identity that made its session: another user presenting it is
/// refused with CONNACK return code 2 (MQTT 3.1.1) and never sees the session's messages; the
/// owner resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identity_cannot_take_over_a_session() {
    let dir = tempfile::tempdir().unwrap();
    edge_node::auth::PasswordFile::set_password(&dir.path().join("passwd"), "alice", b"a-pw").unwrap();
    edge_node::auth::PasswordFile::set_password(&dir.path().join("passwd"), "mallory", b"m-pw").unwrap();
    let extra = "[auth]\npassword_file = \"passwd\"\n[[listener]]\nname = \"password\"\nbind = \"127.0.0.1:0\"\n";
    let t = TestNode::start_in(dir, extra).await;
    let login = |user: &str, pw: &str| {
        let mut o = client::options(t.addr("password"), "alice-phone");
        o.set_credentials(user, pw);
        o.set_clean_session(false);
        o
    };
    let mut alice = Client::connect(login("alice", "a-pw")).await.unwrap();
    alice.subscribe("private/#", QoS::AtLeastOnce).await;
    drop(alice);
    let Err(refused) = Client::connect(login("mallory", "m-pw")).await else { panic!("mallory took alice's session") };
    assert!(
        refused.contains("BadClientId")
            || refused.contains("ClientIdentifierNotValid")
            || refused.contains("Identifier"),
        "{refused}"
    );
    assert_eq!(t.metric("edge_mqtt_connects_refused_total{listener=\"password\",reason=\"client_id_owned\"}"), 1.0);
    let publisher = Client::anonymous(t.local(), "pub").await;
    publisher.publish("private/x", QoS::AtLeastOnce, false, "for alice").await;
    let mut alice = Client::connect(login("alice", "a-pw")).await.unwrap();
    assert_eq!(&alice.recv(WAIT).await.expect("alice gets her message").payload[..], b"for alice");
}
