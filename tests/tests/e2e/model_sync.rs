//! Model versions from the cloud's store to a real edge-node process over the QUIC bridge:
//! whole, as a delta, resumed after a blackhole and a SIGKILL, and refused when forged or
//! damaged.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cloud_bridge::models::dir::DirStore;
use cloud_bridge::models::{ModelStore, Store};
use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, pki};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::node::{EdgeProcess, config_text};
use e2e_tests::relay::UdpRelay;
use rumqttc::QoS;
use shared::model::{SignedManifest, SigningKey};
use shared::testing::noise;

const WAIT: Duration = Duration::from_secs(90);
const MODEL: &str = "yolo-edge";

/// A bridge serving a model store, with its signing key; the edge's public key.
struct Setup {
    cloud: TestCloud,
    store: Store,
    key: SigningKey,
    public: PathBuf,
}

/// A bridge serving the directory store in `dir/store`.
async fn setup(dir: &Path) -> Setup {
    setup_with(dir, &format!("dir = \"{}\"", dir.join("store").display())).await
}

/// A bridge whose `[models]` section has `store` (the store's keys) and a fresh signing key.
async fn setup_with(dir: &Path, store: &str) -> Setup {
    setup_limited(dir, store, "").await
}

/// [`setup_with`], the bridge's config starting with `limits` (its `[limits]` section).
async fn setup_limited(dir: &Path, store: &str, limits: &str) -> Setup {
    let keys = dir.join("keys");
    let (private, public, _) = cloud_bridge::models::keygen(&keys).unwrap();
    let extra = format!("{limits}\n[models]\n{store}\nsigning_key = \"{}\"\npoll = \"200ms\"\n", private.display());
    let cloud = TestCloud::start(dir, pki(dir, &[]), "127.0.0.1:0".parse().unwrap(), &extra).await;
    let config = cloud_bridge::config::CloudConfig::load(&dir.join("cloud.toml")).unwrap();
    Setup {
        cloud,
        store: cloud_bridge::models::open(config.models.as_ref(), config.sink.nats_url()).await.unwrap(),
        key: cloud_bridge::models::signing_key(&private).unwrap(),
        public,
    }
}

impl Setup {
    async fn publish(&self, dir: &Path, version: &str, data: &[u8]) {
        let file = dir.join(format!("{version}.bin"));
        std::fs::write(&file, data).unwrap();
        cloud_bridge::models::publish(&self.store, &self.key, MODEL, version, &file, |_| {}).await.unwrap();
    }

    /// An edge in `dir` (created if needed) that follows the model, reaching the bridge at
    /// `server`.
    fn edge(&self, dir: &Path, server: std::net::SocketAddr) -> EdgeProcess {
        std::fs::create_dir_all(dir).unwrap();
        let extra = format!(
            "{}\n{}\n[models]\ndir = \"models\"\npublic_key = \"{}\"\nfollow = [\"{MODEL}\"]\nparallel = 4\n",
            with_spool(&[telemetry()]),
            self.cloud.uplink_section_via("edge-1", server),
            self.public.display()
        );
        EdgeProcess::start(dir, &config_text(&extra))
    }
}

fn current(edge: &EdgeProcess, version: &str) -> f64 {
    edge.metric(&format!("edge_model_current{{model=\"{MODEL}\",version=\"{version}\"}}"))
}

async fn wait_current(edge: &EdgeProcess, version: &str) {
    assert!(e2e_tests::eventually(WAIT, || current(edge, version) == 1.0).await, "{}", edge.stderr());
}

/// The staged file of `version` on the edge in `edge_dir`.
fn staged(edge_dir: &Path, version: &str) -> Vec<u8> {
    std::fs::read(edge_dir.join("models").join(MODEL).join(version)).unwrap()
}

fn fetched(edge: &EdgeProcess) -> f64 {
    edge.metric(&format!("edge_model_fetched_bytes_total{{model=\"{MODEL}\"}}"))
}

/// A fine-tune: three contiguous regions, 5 % of the file in all, rewritten.
fn fine_tune(base: &[u8], seed: u64) -> Vec<u8> {
    let mut out = base.to_vec();
    let region = base.len() / 60;
    for (k, start) in [base.len() / 8, base.len() / 2, base.len() * 7 / 8].into_iter().enumerate() {
        out[start..start + region].copy_from_slice(&noise(region, seed + k as u64));
    }
    out
}

async fn retained_version(edge: &EdgeProcess, id: &str) -> String {
    let mut app = Client::anonymous(edge.addr("local"), id).await;
    app.subscribe("models/+/current", QoS::AtLeastOnce).await;
    let msg = app.recv(Duration::from_secs(10)).await.expect("a retained current-model message");
    assert_eq!(msg.topic, format!("models/{MODEL}/current"));
    let doc: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap();
    doc["version"].as_str().unwrap().to_owned()
}

/// Complete chunks in the edge's cache (temporary files have other names) and their bytes.
fn cached(edge_dir: &Path) -> (usize, u64) {
    std::fs::read_dir(edge_dir.join("models/cache"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().len() == 64)
                .fold((0, 0), |(n, b), e| (n + 1, b + e.metadata().map_or(0, |m| m.len())))
        })
        .unwrap_or((0, 0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_arrives_whole_then_a_fine_tune_fetches_a_fraction() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    let v1 = noise(64 << 20, 1);
    s.publish(dir.path(), "1", &v1).await;
    let edge_dir = dir.path().join("edge");
    let edge = s.edge(&edge_dir, s.cloud.bridge.quic_addr());
    wait_current(&edge, "1").await;
    assert!(staged(&edge_dir, "1") == v1, "staged file differs");
    assert_eq!(retained_version(&edge, "app-1").await, "1");
    let whole = fetched(&edge);
    assert!(whole <= v1.len() as f64 && whole >= 0.99 * v1.len() as f64, "fetched {whole}");
    assert!(edge.metric("edge_model_chunks_verified_total") >= 100.0);
    assert_eq!(edge.metric("edge_model_chunks_failed_total"), 0.0);

    // A fine-tune published while the edge is connected: announced, and only what changed
    // crosses the link.
    let v2 = fine_tune(&v1, 100);
    s.publish(dir.path(), "2", &v2).await;
    wait_current(&edge, "2").await;
    let delta = fetched(&edge) - whole;
    assert!(delta <= 0.15 * v2.len() as f64, "the 5 % fine-tune fetched {delta} bytes");
    assert!(delta >= 0.05 * v2.len() as f64, "fetched {delta}: less than what changed");
    assert!(staged(&edge_dir, "2") == v2, "staged file differs");
    assert_eq!(retained_version(&edge, "app-2").await, "2");
    assert_eq!(current(&edge, "1"), 0.0, "one current version per model");
    let ratio = edge.metric(&format!("edge_model_last_delta_ratio{{model=\"{MODEL}\"}}"));
    assert!((ratio - delta / v2.len() as f64).abs() < 1e-6, "ratio {ratio}");
    assert!(s.cloud.metric("bridge_models_announced_total") >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_sync_resumes_without_fetching_verified_chunks_again() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    let relay = UdpRelay::start(s.cloud.bridge.quic_addr()).await;
    // 4 MB/s: 24 MiB takes about 6 s, time to cut it in the middle.
    relay.impairment.set_rate(4_000_000);
    let v1 = noise(24 << 20, 7);
    s.publish(dir.path(), "1", &v1).await;
    let edge_dir = dir.path().join("edge");
    let mut edge = s.edge(&edge_dir, relay.addr);

    // Blackholed halfway: the connection dies, the chunks verified so far stay.
    assert!(e2e_tests::eventually(WAIT, || cached(&edge_dir).1 >= v1.len() as u64 / 3).await, "{}", edge.stderr());
    relay.impairment.set_blackhole(true);
    let before = cached(&edge_dir).1;
    assert!(before < v1.len() as u64, "already complete before the blackhole");
    let dropped = e2e_tests::eventually(WAIT, || edge.metric("edge_uplink_connected") == 0.0).await;
    assert!(dropped, "the connection outlived the blackhole");
    relay.impairment.set_blackhole(false);
    wait_current(&edge, "1").await;
    assert!(staged(&edge_dir, "1") == v1);
    // Chunks cut off mid-reply are not counted; every complete one was fetched once.
    assert_eq!(fetched(&edge), v1.len() as f64, "a verified chunk was fetched again");

    // SIGKILLed halfway through the next version: the restarted edge fetches only the rest.
    let v2 = noise(24 << 20, 8);
    let (chunks_v1, _) = cached(&edge_dir);
    s.publish(dir.path(), "2", &v2).await;
    assert!(e2e_tests::eventually(WAIT, || cached(&edge_dir).0 >= chunks_v1 + 12).await, "{}", edge.stderr());
    edge.signal("KILL");
    edge.wait_exit(Duration::from_secs(10)).expect("killed");
    let (after_kill, bytes_after_kill) = cached(&edge_dir);
    let v1_bytes: u64 = v1.len() as u64;
    let have = bytes_after_kill - v1_bytes;
    assert!(after_kill > chunks_v1 && have < v2.len() as u64, "not cut in the middle: {have} bytes cached");
    relay.impairment.set_rate(0);
    let edge = s.edge(&edge_dir, relay.addr);
    wait_current(&edge, "2").await;
    assert!(staged(&edge_dir, "2") == v2);
    assert_eq!(fetched(&edge), (v2.len() as u64 - have) as f64, "the restarted edge fetched cached chunks again");
    assert_eq!(retained_version(&edge, "app").await, "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_or_damaged_versions_are_refused_and_the_current_one_stays() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    let v1 = noise(3 << 20, 11);
    s.publish(dir.path(), "1", &v1).await;
    let edge_dir = dir.path().join("edge");
    let edge = s.edge(&edge_dir, s.cloud.bridge.quic_addr());
    wait_current(&edge, "1").await;
    let mut app = Client::anonymous(edge.addr("local"), "app").await;
    app.subscribe("models/+/current", QoS::AtLeastOnce).await;
    assert!(app.recv(Duration::from_secs(10)).await.is_some(), "the retained message of version 1");
    let refused = |reason: &str| edge.metric(&format!("edge_model_versions_refused_total{{reason=\"{reason}\"}}"));

    // A chunk damaged in the store: fetched, refused ATTEMPTS times, never used.
    let staging = DirStore::open(&dir.path().join("staging")).unwrap();
    let file = dir.path().join("2.bin");
    std::fs::write(&file, noise(3 << 20, 12)).unwrap();
    cloud_bridge::models::publish(&staging, &s.key, MODEL, "2", &file, |_| {}).await.unwrap();
    let m2 = staging.get_manifest(MODEL, "2").await.unwrap().unwrap().unverified().unwrap();
    for c in &m2.chunks {
        let mut bytes = staging.get_chunk(&c.hash).await.unwrap().unwrap();
        if c == &m2.chunks[2] {
            bytes[10] ^= 0x55;
        }
        // Straight into the directory: the store itself would refuse bytes that do not hash.
        let path = dir.path().join("store/chunks").join(&c.hash[..2]).join(&c.hash);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    let signed2 = staging.get_manifest(MODEL, "2").await.unwrap().unwrap();
    s.store.put_manifest(&m2, &signed2).await.unwrap();
    assert!(e2e_tests::eventually(WAIT, || refused("fetch") == 1.0).await, "{}", edge.stderr());
    assert_eq!(edge.metric("edge_model_chunks_failed_total"), 3.0);
    assert!(edge.stderr().contains("bytes did not match the hash in 3 attempts"), "{}", edge.stderr());

    // Manifests the fleet key did not sign as they are: each refused before any fetch.
    let manifest =
        |version: &str, created_ms: u64| shared::model::Manifest { version: version.into(), created_ms, ..m2.clone() };
    let mut bad_sig = s.key.sign(&manifest("3", m2.created_ms + 1));
    bad_sig.signature[0] ^= 1;
    let other = SigningKey::from_pkcs8(&SigningKey::generate().unwrap()).unwrap();
    let other_key = other.sign(&manifest("4", m2.created_ms + 2));
    let cases: [(&str, SignedManifest, &str); 2] =
        [("3", bad_sig, "the signature does not check"), ("4", other_key, "not by the fleet's key")];
    let verified = edge.metric("edge_model_chunks_verified_total");
    for (n, (version, signed, error)) in cases.into_iter().enumerate() {
        let path = dir.path().join("store/manifests").join(MODEL).join(format!("{version}.manifest"));
        std::fs::write(path, signed.to_bytes()).unwrap();
        assert!(
            e2e_tests::eventually(WAIT, || refused("manifest") == n as f64 + 1.0).await,
            "version {version}: {}",
            edge.stderr()
        );
        assert!(edge.stderr().contains(error), "version {version}: {}", edge.stderr());
    }
    assert_eq!(edge.metric("edge_model_chunks_verified_total"), verified, "a forged manifest led to a fetch");
    // A truncated manifest file names no version: the bridge skips it, saying which file, and
    // goes on serving the others.
    let good = s.key.sign(&manifest("5", m2.created_ms + 3)).to_bytes();
    let path = dir.path().join("store/manifests").join(MODEL).join("5.manifest");
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    assert!(
        e2e_tests::eventually(WAIT, || e2e_tests::captured_logs().contains("5.manifest")).await,
        "{}",
        e2e_tests::captured_logs()
    );
    assert!(e2e_tests::captured_logs().contains("manifest unreadable"), "{}", e2e_tests::captured_logs());
    assert_eq!(current(&edge, "1"), 1.0, "version 1 stays current");
    assert_eq!(std::fs::read_link(edge_dir.join("models").join(MODEL).join("current")).unwrap(), Path::new("1"));
    assert!(app.recv(Duration::from_secs(2)).await.is_none(), "the retained message changed");
    assert_eq!(retained_version(&edge, "late-app").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jetstream_object_store_serves_versions_and_the_cli_manages_them() {
    let nats = e2e_tests::nats::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let s =
        setup_with(dir.path(), &format!("store = \"jetstream\"\nurl = \"{}\"\nbucket = \"models-test\"", nats.url()))
            .await;
    assert!(matches!(s.store, Store::Jetstream(_)));
    let v1 = noise(32 << 20, 31);
    s.publish(dir.path(), "1", &v1).await;
    let edge_dir = dir.path().join("edge");
    let edge = s.edge(&edge_dir, s.cloud.bridge.quic_addr());
    wait_current(&edge, "1").await;
    assert!(staged(&edge_dir, "1") == v1);
    let whole = fetched(&edge);
    let v2 = fine_tune(&v1, 200);
    s.publish(dir.path(), "2", &v2).await;
    wait_current(&edge, "2").await;
    assert!(staged(&edge_dir, "2") == v2);
    let delta = fetched(&edge) - whole;
    assert!(delta <= 0.25 * v2.len() as f64, "the fine-tune fetched {delta} bytes");

    // The operator's commands work on the bucket as on a directory.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(e2e_tests::workspace_bin("cloud-bridge")).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let cfg = dir.path().join("cloud.toml");
    let cfg = cfg.to_str().unwrap();
    let list: serde_json::Value = serde_json::from_str(&cli(&["model", "list", "--json", "--config", cfg])).unwrap();
    assert_eq!(list.as_array().unwrap().iter().map(|m| m["version"].as_str().unwrap()).collect::<Vec<_>>(), ["1", "2"]);
    let out = cli(&["model", "rm", "--config", cfg, "--name", MODEL, "--version", "1"]);
    let removed: usize = out.split(" and ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(removed > 0 && removed < 20, "{out}");
    let m2 =
        s.store.get_manifest(MODEL, "2").await.unwrap().unwrap().verify(&std::fs::read(&s.public).unwrap()).unwrap();
    let mut back = Vec::new();
    cloud_bridge::models::assemble(&s.store, &m2, &mut back).await.unwrap();
    assert!(back == v2, "version 2 damaged by removing version 1");
    assert!(s.store.get_manifest(MODEL, "1").await.unwrap().is_none());
}

/// An edge that asks for chunks and does not read them (issue 29) holds its connection's
/// memory, not the bridge's, and for `limits.stall` at most: each chunk is paid from the
/// connection's budget until written, and reset when the edge has not taken it by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_an_edge_does_not_take_are_paid_for_and_reset_after_the_stall() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("dir = \"{}\"", dir.path().join("store").display());
    let s = setup_limited(dir.path(), &store, "[limits]\nstall = \"3s\"\n").await;
    s.publish(dir.path(), "1", &noise(40 << 20, 7)).await;
    let pki = &s.cloud.pki;
    let (_, cert, key) = pki.edges.iter().find(|(id, _, _)| id == "edge-1").unwrap().clone();
    let conn = e2e_tests::quic::connect_tight(s.cloud.bridge.quic_addr(), &pki.ca, &cert, &key).await.unwrap();
    let mut hello = e2e_tests::quic::hello_for("00112233445566778899aabbccddeeff");
    hello.models = vec![MODEL.into()];
    let (_control, mut control_rx, welcome) = e2e_tests::quic::hello(&conn, hello).await;
    assert!(matches!(welcome, shared::proto::Control::Welcome(_)), "{welcome:?}");
    let Some(shared::proto::Control::Model(announce)) = e2e_tests::quic::next_control(&mut control_rx).await else {
        panic!("no announcement")
    };
    let manifest = SignedManifest::from_bytes(&announce.manifest).unwrap().unverified().unwrap();
    assert!(manifest.chunks.len() >= 16, "{}", manifest.chunks.len());

    // Sixteen fetches (the most streams an edge may open), none read.
    let mut fetches = Vec::new();
    for c in manifest.chunks.iter().take(16) {
        let (mut send, recv) = conn.open_bi().await.unwrap();
        let fetch = shared::proto::Fetch::Chunk { hash: c.hash.clone() };
        send.write_all(&shared::proto::codec::encode(&fetch).unwrap()).await.unwrap();
        fetches.push((send, recv));
    }
    let reserved = || s.cloud.metric("bridge_batch_memory_reserved_bytes");
    // QUIC takes limits.connection_window (4 MiB) of what the edge does not read (it lets 16
    // KiB a stream through); the rest waits, paid for (a chunk's most, 2 MiB, each), inside
    // the connection's 64 MiB.
    let held = (10u64 << 20) as f64;
    assert!(e2e_tests::eventually(WAIT, || reserved() >= held).await, "{} bytes reserved", reserved());
    assert!(reserved() <= (64u64 << 20) as f64, "{}", reserved());
    // The stall passes: every chunk not taken is reset and its memory given back, while the
    // connection stays up.
    assert!(e2e_tests::eventually(Duration::from_secs(15), || reserved() == 0.0).await, "{}", reserved());
    assert!(s.cloud.metric("bridge_model_fetches_refused_total") >= 10.0);
    assert!(conn.close_reason().is_none(), "{:?}", conn.close_reason());
}
