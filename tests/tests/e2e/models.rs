//! Model publishing as an operator runs it: `cloud-bridge model keygen`, `publish`, `list`,
//! `rm`, on the directory store; manifests that verify against the public key only, chunks
//! shared between versions, files that come back byte for byte.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cloud_bridge::models::ModelStore;
use cloud_bridge::models::dir::DirStore;
use e2e_tests::cloud::pki;
use e2e_tests::workspace_bin;
use shared::model::SignedManifest;
use shared::testing::noise;

fn bridge(args: &[&str]) -> Output {
    Command::new(workspace_bin("cloud-bridge")).args(args).output().expect("run cloud-bridge")
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn setup(dir: &Path) -> (PathBuf, PathBuf) {
    let keys = pki(dir, &[]);
    ok(bridge(&["model", "keygen", "--dir", dir.join("keys").to_str().unwrap()]));
    let config = dir.join("cloud.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nbind = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             [sink]\nkind = \"sqlite\"\npath = \"central.db\"\n\
             [models]\ndir = \"models\"\nsigning_key = \"keys/model-signing.pk8\"\n",
            keys.server_cert.display(),
            keys.server_key.display(),
            keys.ca.display()
        ),
    )
    .unwrap();
    (config, dir.join("keys/model-signing.pub"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_versions_verify_share_chunks_and_come_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (config, public) = setup(dir.path());
    let cfg = config.to_str().unwrap();
    let v1 = noise(64 << 20, 21);
    let mut v2 = v1.clone();
    let region = v1.len() / 60;
    for (k, start) in [v1.len() / 8, v1.len() / 2, v1.len() * 7 / 8].into_iter().enumerate() {
        v2[start..start + region].copy_from_slice(&noise(region, 300 + k as u64));
    }
    std::fs::write(dir.path().join("v1.bin"), &v1).unwrap();
    std::fs::write(dir.path().join("v2.bin"), &v2).unwrap();
    let file = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();

    let out =
        ok(bridge(&["model", "publish", "--config", cfg, "--name", "yolo-edge", "--version", "1", &file("v1.bin")]));
    assert!(out.contains("published yolo-edge 1: 67108864 bytes"), "{out}");
    let out =
        ok(bridge(&["model", "publish", "--config", cfg, "--name", "yolo-edge", "--version", "2", &file("v2.bin")]));
    // "... N new (B bytes) ...": the 5 % change costs at most 15 % of the file.
    let new_bytes: u64 = out.split(" new (").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(new_bytes as f64 <= 0.15 * v2.len() as f64, "{out}");
    assert!(new_bytes as f64 >= 0.05 * v2.len() as f64, "{out}");

    let again =
        bridge(&["model", "publish", "--config", cfg, "--name", "yolo-edge", "--version", "2", &file("v2.bin")]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("yolo-edge 2 is already published"));
    let bad = bridge(&["model", "publish", "--config", cfg, "--name", "../x", "--version", "1", &file("v1.bin")]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("name \"../x\""));

    let list: serde_json::Value =
        serde_json::from_str(&ok(bridge(&["model", "list", "--json", "--config", cfg]))).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2);

    // Each manifest verifies against the public key, and the file comes back whole.
    let store = DirStore::open(&dir.path().join("models")).unwrap();
    let public = std::fs::read(public).unwrap();
    for (version, data) in [("1", &v1), ("2", &v2)] {
        let signed: SignedManifest = store.get_manifest("yolo-edge", version).await.unwrap().unwrap();
        let manifest = signed.verify(&public).unwrap();
        let mut back = Vec::new();
        cloud_bridge::models::assemble(&store, &manifest, &mut back).await.unwrap();
        assert!(back == *data, "version {version} differs");
    }

    // Removing version 1 drops only the chunks version 2 does not use.
    let out = ok(bridge(&["model", "rm", "--config", cfg, "--name", "yolo-edge", "--version", "1"]));
    assert!(out.starts_with("removed yolo-edge 1 and "), "{out}");
    let m2 = store.get_manifest("yolo-edge", "2").await.unwrap().unwrap().verify(&public).unwrap();
    let mut back = Vec::new();
    cloud_bridge::models::assemble(&store, &m2, &mut back).await.unwrap();
    assert!(back == v2);
    assert!(store.get_manifest("yolo-edge", "1").await.unwrap().is_none());

    // A chunk damaged in the store is caught on the way out, by index and hash.
    let victim = &m2.chunks[3].hash;
    let path = dir.path().join("models/chunks").join(&victim[..2]).join(victim);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    let err = cloud_bridge::models::assemble(&store, &m2, &mut Vec::new()).await.unwrap_err();
    assert!(err.to_string().contains("chunk 3 should hash to"), "{err}");

    // A second keygen into the same place refuses to replace the key.
    let again = bridge(&["model", "keygen", "--dir", dir.path().join("keys").to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
}

/// Versions published by the cloud, staged on an edge from its chunk cache (the transfer
/// between them is the next step of this issue), listed and rolled back with `edge-node models`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_stages_published_versions_lists_them_and_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let (config, public) = setup(dir.path());
    let cfg = config.to_str().unwrap();
    for v in 1..=2u64 {
        let path = dir.path().join(format!("v{v}.bin"));
        std::fs::write(&path, noise(3 << 20, 40 + 2 * v)).unwrap();
        ok(bridge(&[
            "model",
            "publish",
            "--config",
            cfg,
            "--name",
            "yolo-edge",
            "--version",
            &v.to_string(),
            path.to_str().unwrap(),
        ]));
    }
    let edge_config = dir.path().join("edge.toml");
    std::fs::write(
        &edge_config,
        format!("[models]\ndir = \"edge-models\"\npublic_key = \"{}\"\nfollow = [\"yolo-edge\"]\n", public.display()),
    )
    .unwrap();
    let store = DirStore::open(&dir.path().join("models")).unwrap();
    let models =
        edge_node::models::Models::open(&dir.path().join("edge-models"), std::fs::read(&public).unwrap(), 3).unwrap();
    let cache = models.cache().unwrap();
    for v in ["1", "2"] {
        let signed = store.get_manifest("yolo-edge", v).await.unwrap().unwrap();
        let manifest = models.verify(&signed).unwrap();
        for (i, c) in cache.missing(&manifest) {
            cache.put(i, c, &store.get_chunk(&c.hash).await.unwrap().unwrap()).unwrap();
        }
        models.stage(&signed, &cache).unwrap();
    }
    let edge = |args: &[&str]| Command::new(workspace_bin("edge-node")).args(args).output().unwrap();
    let list: serde_json::Value =
        serde_json::from_str(&ok(edge(&["models", "list", "--config", edge_config.to_str().unwrap()]))).unwrap();
    assert_eq!(list[0]["name"], "yolo-edge");
    assert_eq!(list[0]["current"]["version"], "2");
    assert_eq!(list[0]["current"]["sha256"], shared::model::chunk_hash(&noise(3 << 20, 44)));
    assert_eq!(list[0]["versions"], serde_json::json!(["1", "2"]));
    let out = ok(edge(&["models", "rollback", "--config", edge_config.to_str().unwrap(), "yolo-edge"]));
    assert!(out.starts_with("yolo-edge: 1 is current"), "{out}");
    let again = edge(&["models", "rollback", "--config", edge_config.to_str().unwrap(), "yolo-edge"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("no version before the current one"));

    // A node started over that directory tells local apps the current version, retained.
    let run_dir = dir.path().join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let extra = format!(
        "[models]\ndir = \"{}\"\npublic_key = \"{}\"\n",
        dir.path().join("edge-models").display(),
        public.display()
    );
    let node = e2e_tests::node::EdgeProcess::start(&run_dir, &e2e_tests::node::config_text(&extra));
    let mut first = e2e_tests::client::Client::anonymous(node.addr("local"), "early-app").await;
    first.subscribe("models/+/current", rumqttc::QoS::AtLeastOnce).await;
    first.recv(std::time::Duration::from_secs(10)).await.expect("the announcement");
    // An app that subscribes afterwards gets it as a retained message.
    let mut app = e2e_tests::client::Client::anonymous(node.addr("local"), "inference-app").await;
    app.subscribe("models/+/current", rumqttc::QoS::AtLeastOnce).await;
    let retained = app.recv(std::time::Duration::from_secs(10)).await.expect("a retained current-model message");
    assert_eq!(retained.topic, "models/yolo-edge/current");
    assert!(retained.retain);
    let current: serde_json::Value = serde_json::from_slice(&retained.payload).unwrap();
    assert_eq!(current["version"], "1");
    assert_eq!(current["sha256"], shared::model::chunk_hash(&noise(3 << 20, 42)));
    assert_eq!(std::fs::read(current["path"].as_str().unwrap()).unwrap(), noise(3 << 20, 42));

    // The announcements are the node's word alone (issue 29): an anonymous client's retained
    // forgery pointing at an unsigned file is refused, and the next app still gets the signed
    // version.
    let forger = e2e_tests::client::Client::anonymous(node.addr("local"), "forger").await;
    let forged = serde_json::json!({"name": "yolo-edge", "version": "9", "path": "/tmp/evil.onnx"}).to_string();
    forger.publish("models/yolo-edge/current", rumqttc::QoS::AtLeastOnce, true, forged).await;
    assert!(
        e2e_tests::eventually(std::time::Duration::from_secs(5), || {
            node.metric("edge_mqtt_publish_refused_total{reason=\"reserved_topic\"}") == 1.0
        })
        .await
    );
    let mut later = e2e_tests::client::Client::anonymous(node.addr("local"), "later-app").await;
    later.subscribe("models/+/current", rumqttc::QoS::AtLeastOnce).await;
    let retained = later.recv(std::time::Duration::from_secs(10)).await.expect("the retained announcement");
    let current: serde_json::Value = serde_json::from_slice(&retained.payload).unwrap();
    assert_eq!(current["version"], "1", "{current}");
    assert!(first.recv(std::time::Duration::from_millis(300)).await.is_none(), "nothing forged went live");
}
