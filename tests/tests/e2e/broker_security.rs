//! TLS, client certificates, passwords and topic ACLs, with real clients.

use std::time::Duration;

use e2e_tests::certs::Ca;
use e2e_tests::client::{self, Client};
use e2e_tests::node::TestNode;
use rumqttc::{QoS, SubscribeReasonCode};
use tokio::process::Command;

const WAIT: Duration = Duration::from_secs(5);

const ACL: &str = r##"
[anonymous]
subscribe = ["#"]

[users.alice]
publish = ["alice/#"]
subscribe = ["alice/#", "public/+"]

[certs.edge-cam-1]
publish = ["cams/%u/#"]
"##;

/// A node with: the anonymous loopback listener, a password listener, a TLS listener taking
/// passwords or optional client certificates, and a TLS listener requiring client certificates.
async fn secured_node() -> (TestNode, Ca) {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "fleet");
    ca.server(dir.path(), "server");
    ca.client(dir.path(), "edge-cam-1");
    edge_node::auth::PasswordFile::set_password(&dir.path().join("passwd"), "alice", b"wonderland").unwrap();
    std::fs::write(dir.path().join("acl.toml"), ACL).unwrap();
    let extra = r#"
[auth]
password_file = "passwd"
acl_file = "acl.toml"

[[listener]]
name = "password"
bind = "127.0.0.1:0"

[[listener]]
name = "tls"
bind = "127.0.0.1:0"
[listener.tls]
cert = "server.pem"
key = "server.key"
client_ca = "fleet-ca.pem"
client_certs = "optional"

[[listener]]
name = "mtls"
bind = "127.0.0.1:0"
[listener.tls]
cert = "server.pem"
key = "server.key"
client_ca = "fleet-ca.pem"
client_certs = "required"
"#;
    (TestNode::start_in(dir, extra).await, ca)
}

/// mosquitto_pub over TLS; returns whether it succeeded (QoS1: it waits for the PUBACK).
async fn mosquitto_pub_tls(port: u16, cafile: &std::path::Path, extra: &[&str], topic: &str) -> (bool, String) {
    let out = Command::new("mosquitto_pub")
        .args(["-h", "localhost", "-p", &port.to_string(), "-q", "1", "-t", topic, "-m", "x", "--cafile"])
        .arg(cafile)
        .args(extra)
        .output()
        .await
        .expect("mosquitto_pub");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_right_ca_connects_and_another_ca_fails() {
    let (t, ca) = secured_node().await;
    let dir = t.dir.path();
    let port = t.addr("tls").port();
    let (ok, err) = mosquitto_pub_tls(port, &ca.cert_path, &["-u", "alice", "-P", "wonderland"], "alice/tls").await;
    assert!(ok, "TLS client with the fleet CA refused: {err}");

    let other = Ca::new(dir, "other");
    let (ok, _) = mosquitto_pub_tls(port, &other.cert_path, &["-u", "alice", "-P", "wonderland"], "alice/tls").await;
    assert!(!ok, "client trusting another CA connected");
    assert!(t.metric("edge_mqtt_connections_total{listener=\"tls\"}") == 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_required_and_used_as_identity() {
    let (t, ca) = secured_node().await;
    let dir = t.dir.path().to_owned();
    let port = t.addr("mtls").port();
    let mut watcher = Client::anonymous(t.local(), "watcher").await;
    watcher.subscribe("cams/#", QoS::AtLeastOnce).await;

    let (ok, _) = mosquitto_pub_tls(port, &ca.cert_path, &[], "cams/edge-cam-1/x").await;
    assert!(!ok, "client without a certificate was served on the mtls listener");
    assert!(t.metric("edge_mqtt_connects_refused_total{listener=\"mtls\",reason=\"tls\"}") >= 1.0);

    let cert = dir.join("edge-cam-1.pem");
    let key = dir.join("edge-cam-1.key");
    let with_cert = ["--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()];
    let (ok, err) = mosquitto_pub_tls(port, &ca.cert_path, &with_cert, "cams/edge-cam-1/frame").await;
    assert!(ok, "client with a fleet certificate refused: {err}");
    let p = watcher.recv(WAIT).await.expect("publish by certificate identity delivered");
    assert_eq!(p.topic, "cams/edge-cam-1/frame");

    // The ACL applies to the certificate's name: another camera's topic is refused.
    let (ok, _) = mosquitto_pub_tls(port, &ca.cert_path, &with_cert, "cams/edge-cam-2/frame").await;
    assert!(ok, "QoS1 refusal on MQTT 3.1.1 is still acknowledged");
    assert!(watcher.recv(Duration::from_millis(500)).await.is_none(), "publish outside the ACL was delivered");
    assert_eq!(t.metric("edge_mqtt_publish_refused_total{reason=\"acl\"}"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_and_missing_credentials_are_refused() {
    let (t, _ca) = secured_node().await;
    let addr = t.addr("password");
    let mut opts = client::options(addr, "bad");
    opts.set_credentials("alice", "guess");
    let err = Client::connect(opts).await.err().expect("wrong password accepted");
    assert!(err.contains("BadUserNamePassword"), "{err}");

    let err =
        Client::connect(client::options(addr, "anon")).await.err().expect("anonymous accepted on a network listener");
    assert!(err.contains("NotAuthorized"), "{err}");

    let mut opts = client::options(addr, "nobody");
    opts.set_credentials("mallory", "wonderland");
    assert!(Client::connect(opts).await.is_err(), "unknown user accepted");

    let mut opts = client::options(addr, "good");
    opts.set_credentials("alice", "wonderland");
    Client::connect(opts).await.expect("right password refused");
    assert_eq!(t.metric("edge_mqtt_connects_refused_total{listener=\"password\",reason=\"bad_credentials\"}"), 2.0);
    assert_eq!(t.metric("edge_mqtt_connects_refused_total{listener=\"password\",reason=\"not_authorized\"}"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_refuses_publish_and_subscribe_outside_the_rules() {
    let (t, _ca) = secured_node().await;
    let mut everything = Client::anonymous(t.local(), "everything").await;
    everything.subscribe("#", QoS::AtLeastOnce).await;

    let mut opts = client::options(t.addr("password"), "alice");
    opts.set_credentials("alice", "wonderland");
    let mut alice = Client::connect(opts).await.unwrap();
    // Allowed, refused, allowed in one SUBSCRIBE: the SUBACK has a code for each, in order.
    let codes = alice
        .subscribe_many(&[
            ("alice/inbox", QoS::AtLeastOnce),
            ("secret/#", QoS::AtLeastOnce),
            ("public/+", QoS::AtMostOnce),
        ])
        .await;
    assert_eq!(
        codes,
        [
            SubscribeReasonCode::Success(QoS::AtLeastOnce),
            SubscribeReasonCode::Failure,
            SubscribeReasonCode::Success(QoS::AtMostOnce)
        ]
    );
    assert_eq!(alice.subscribe("alice/#", QoS::AtLeastOnce).await, [SubscribeReasonCode::Success(QoS::AtLeastOnce)]);
    assert_eq!(alice.subscribe("#", QoS::AtLeastOnce).await, [SubscribeReasonCode::Failure]);
    assert_eq!(t.metric("edge_mqtt_subscribe_refused_total{reason=\"acl\"}"), 2.0);

    alice.publish("secret/plans", QoS::AtLeastOnce, false, "no").await;
    alice.publish("secret/plans", QoS::AtMostOnce, false, "no").await;
    alice.publish("alice/ok", QoS::AtLeastOnce, false, "yes").await;
    let p = everything.recv(WAIT).await.expect("allowed publish delivered");
    assert_eq!(p.topic, "alice/ok", "only the allowed publish may arrive");
    assert!(everything.recv(Duration::from_millis(300)).await.is_none());
    assert_eq!(t.metric("edge_mqtt_publish_refused_total{reason=\"acl\"}"), 2.0);

    // Alice stays connected after refusals and still gets what she may see.
    let p = alice.recv(WAIT).await.expect("own allowed publish delivered back");
    assert_eq!(p.topic, "alice/ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn will_topic_outside_the_acl_is_refused_at_connect() {
    let (t, _ca) = secured_node().await;
    let mut opts = client::options(t.addr("password"), "alice-will");
    opts.set_credentials("alice", "wonderland");
    opts.set_last_will(rumqttc::LastWill::new("secret/will", "bye", QoS::AtLeastOnce, false));
    let err = Client::connect(opts).await.err().expect("forbidden will accepted");
    assert!(err.contains("NotAuthorized"), "{err}");
}

/// An MQTT 5 PUBLISH, QoS1, with a topic alias property; `topic` may be empty.
fn publish_v5_with_alias(topic: &str, pkid: u16, alias: u16, payload: &[u8]) -> Vec<u8> {
    let mut body = (topic.len() as u16).to_be_bytes().to_vec();
    body.extend(topic.as_bytes());
    body.extend(pkid.to_be_bytes());
    body.extend([3, 0x23]);
    body.extend(alias.to_be_bytes());
    body.extend(payload);
    let mut frame = vec![0x32, body.len() as u8];
    frame.extend(body);
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_aliases_cannot_bypass_the_acl() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (t, _ca) = secured_node().await;
    let mut everything = Client::anonymous(t.local(), "everything").await;
    everything.subscribe("#", QoS::AtLeastOnce).await;

    // A raw MQTT 5 client, so every PUBACK reason is read in order.
    let mut alice = tokio::net::TcpStream::connect(t.addr("password")).await.unwrap();
    let mut connect = vec![0, 4, b'M', b'Q', b'T', b'T', 5, 0xC2, 0, 60, 0];
    for field in ["alice-v5", "alice", "wonderland"] {
        connect.extend((field.len() as u16).to_be_bytes());
        connect.extend(field.as_bytes());
    }
    let mut frame = vec![0x10, connect.len() as u8];
    frame.extend(connect);
    alice.write_all(&frame).await.unwrap();
    let mut header = [0u8; 2];
    alice.read_exact(&mut header).await.unwrap();
    let mut connack = vec![0u8; header[1] as usize];
    alice.read_exact(&mut connack).await.unwrap();
    assert_eq!((header[0], connack[1]), (0x20, 0), "CONNACK refused");

    // Alias 1 -> alice/a (allowed), re-pointed at secret/x (refused), used bare (still
    // secret/x: refused), re-pointed at alice/b and used bare (delivered as alice/b).
    let steps =
        [("alice/a", "1", 0x00), ("secret/x", "2", 0x87), ("", "3", 0x87), ("alice/b", "4", 0x00), ("", "5", 0x00)];
    for (pkid, (topic, payload, reason)) in steps.iter().enumerate() {
        let pkid = pkid as u16 + 1;
        alice.write_all(&publish_v5_with_alias(topic, pkid, 1, payload.as_bytes())).await.unwrap();
        let mut head = [0u8; 2];
        tokio::time::timeout(WAIT, alice.read_exact(&mut head)).await.expect("PUBACK").unwrap();
        let mut ack = vec![0u8; head[1] as usize];
        alice.read_exact(&mut ack).await.unwrap();
        assert_eq!(head[0], 0x40, "step {pkid}: not a PUBACK");
        assert_eq!(u16::from_be_bytes([ack[0], ack[1]]), pkid);
        assert_eq!(ack.get(2).copied().unwrap_or(0), *reason, "step {pkid} ({topic:?}): reason code");
    }

    let mut got = Vec::new();
    while let Some(p) = everything.recv(Duration::from_millis(700)).await {
        got.push((p.topic.clone(), String::from_utf8_lossy(&p.payload).into_owned()));
    }
    let want: Vec<(String, String)> = [("alice/a", "1"), ("alice/b", "4"), ("alice/b", "5")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(got, want);
}
