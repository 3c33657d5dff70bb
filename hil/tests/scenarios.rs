//! The hardware-in-the-loop scenarios (see `hil/src/lib.rs`). Each asserts correctness: every
//! telemetry message the emulated edge acknowledged is in JetStream exactly once, a model
//! version is staged byte for byte. Latency is a figure in the report, not an assertion:
//! emulation makes the edge several times slower than the hardware it stands for.

use std::time::Duration;

use hil::{Load, LoadResult, Rig, delivery, latency_fields, report, scaled};
use serde_json::json;

/// Inference results per second: the 1,000 in the full run, fewer in CI's smoke run
/// (two shared cores also run the emulator, the bridge and nats-server).
fn rate() -> u64 {
    if hil::full() { 1000 } else { 200 }
}

async fn ready_rig() -> Rig {
    let mut rig = Rig::start().await;
    rig.start_edge();
    let edge = rig.edge();
    assert!(
        e2e_tests::eventually(Duration::from_secs(60), || edge.metric("edge_uplink_connected") == 1.0).await,
        "the emulated edge did not connect:\n{}",
        edge.stderr()
    );
    rig
}

/// Checks delivery, writes the report line, and asserts.
async fn finish(rig: &Rig, name: &str, result: LoadResult, window: Option<(u64, u64)>, extra: serde_json::Value) {
    let d = delivery(rig, &result.telemetry_acked, Duration::from_secs(300)).await;
    let mut fields = latency_fields(&result.latencies, window);
    let f = fields.as_object_mut().unwrap();
    f.insert("inference_sent".into(), json!(result.inference_sent));
    f.insert("telemetry_acked".into(), json!(d.acked));
    f.insert("telemetry_stored".into(), json!(d.stored));
    f.insert("missing".into(), json!(d.missing.len()));
    f.insert("duplicates".into(), json!(d.duplicates.len()));
    if let Some(e) = extra.as_object() {
        f.extend(e.clone());
    }
    report(name, fields);
    assert!(d.acked > 0, "no telemetry was acknowledged");
    assert!(
        d.missing.is_empty(),
        "{} acknowledged messages missing, e.g. {:?}",
        d.missing.len(),
        &d.missing[..d.missing.len().min(5)]
    );
    assert!(d.duplicates.is_empty(), "duplicates in JetStream: {:?}", &d.duplicates[..d.duplicates.len().min(5)]);
    assert!(!result.latencies.is_empty(), "no inference result came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state() {
    let rig = ready_rig().await;
    let load = Load::start(&rig, rate()).await;
    tokio::time::sleep(scaled(Duration::from_secs(10), Duration::from_secs(60))).await;
    let result = load.stop().await;
    finish(&rig, "steady", result, None, json!({})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uplink_outage_then_recovery() {
    let rig = ready_rig().await;
    let load = Load::start(&rig, rate()).await;
    tokio::time::sleep(scaled(Duration::from_secs(3), Duration::from_secs(10))).await;
    let from = rig.now_us();
    rig.relay.impairment.set_blackhole(true);
    tokio::time::sleep(scaled(Duration::from_secs(8), Duration::from_secs(60))).await;
    rig.relay.impairment.set_blackhole(false);
    let to = rig.now_us();
    let backlog = rig.edge().metric("edge_spool_class_records{class=\"telemetry\"}");
    tokio::time::sleep(scaled(Duration::from_secs(3), Duration::from_secs(10))).await;
    let result = load.stop().await;
    finish(&rig, "outage", result, Some((from, to)), json!({ "backlog_at_recovery": backlog })).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flapping_link() {
    let rig = ready_rig().await;
    let load = Load::start(&rig, rate()).await;
    // Down 2 s of every 10 s: for 3 minutes in the full run, 2 cycles in the smoke run.
    let cycles = if hil::full() { 18 } else { 2 };
    let from = rig.now_us();
    for _ in 0..cycles {
        tokio::time::sleep(Duration::from_secs(8)).await;
        rig.relay.impairment.set_blackhole(true);
        tokio::time::sleep(Duration::from_secs(2)).await;
        rig.relay.impairment.set_blackhole(false);
    }
    let to = rig.now_us();
    let reconnects = rig.edge().metric("edge_uplink_reconnects_total");
    let result = load.stop().await;
    finish(&rig, "flapping", result, Some((from, to)), json!({ "cycles": cycles, "reconnects": reconnects })).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_killed_and_restarted() {
    let mut rig = ready_rig().await;
    let load = Load::start(&rig, rate()).await;
    let kills = if hil::full() { 3 } else { 1 };
    for _ in 0..kills {
        tokio::time::sleep(scaled(Duration::from_secs(4), Duration::from_secs(15))).await;
        rig.kill_edge();
        tokio::time::sleep(Duration::from_secs(1)).await;
        rig.start_edge();
    }
    tokio::time::sleep(scaled(Duration::from_secs(4), Duration::from_secs(15))).await;
    let result = load.stop().await;
    finish(&rig, "killed", result, None, json!({ "kills": kills })).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_published_during_the_run_is_staged() {
    let rig = ready_rig().await;
    let load = Load::start(&rig, rate()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let size = if hil::full() { 64 << 20 } else { 8 << 20 };
    let data = shared::testing::noise(size, 77);
    let file = rig.dir().join("model.bin");
    std::fs::write(&file, &data).unwrap();
    let published = std::time::Instant::now();
    cloud_bridge::models::publish(&rig.models, &rig.key, hil::MODEL, "1", &file, |_| {}).await.unwrap();
    let edge = rig.edge();
    let current = format!("edge_model_current{{model=\"{}\",version=\"1\"}}", hil::MODEL);
    let staged = e2e_tests::eventually(Duration::from_secs(300), || edge.metric(&current) == 1.0).await;
    let seconds = published.elapsed().as_secs_f64();
    assert!(staged, "model not staged on the emulated edge:\n{}", edge.stderr());
    let on_disk = std::fs::read(rig.edge_dir.join("models").join(hil::MODEL).join("1")).unwrap();
    assert!(on_disk == data, "staged model differs from the published one");
    let result = load.stop().await;
    finish(&rig, "model", result, None, json!({ "model_bytes": size, "publish_to_staged_s": seconds })).await;
}
