//! Schemas end to end (issue 32), through the shipped binaries: registered with `cloud-bridge
//! schema register`, delivered to a real edge-node as a signed model, staged, and enforced on
//! PUBLISH against paho-mqtt clients; a new compatible version rolled out while a client
//! publishes; the edge restarted with no bridge to reach still enforcing what it staged.
//!
//! MQTT 5.0 §3.4.2.1: a PUBACK reason code of 0x80 or more means the publish was not taken
//! (0x99, Payload format invalid); §3.4.2.2.2: the Reason String is for diagnostics. MQTT 3.1.1
//! §3.4 has no reason code: a refused publish is dropped and counted (README).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, cli, pki, sink_rows};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::node::{EdgeProcess, config_text};
use rumqttc::QoS;
use tokio::io::AsyncWriteExt;

const WAIT: Duration = Duration::from_secs(60);
const PUBLISHER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/paho_publish_v5.py");
const TOPIC: &str = "telemetry/cam-1/reading";

/// Version 1: a reading with a number and a unit of "C"; version 2 widens the unit to "F"
/// (backward compatible: it accepts everything version 1 did).
const V1: &str = r#"{"type":"object","required":["temp","unit"],
  "properties":{"temp":{"type":"number"},"unit":{"enum":["C"]},"n":{"type":"integer"}}}"#;
const V2: &str = r#"{"type":"object","required":["temp","unit"],
  "properties":{"temp":{"type":"number"},"unit":{"enum":["C","F"]},"n":{"type":"integer"}}}"#;

struct Setup {
    cloud: TestCloud,
    config: PathBuf,
    public: PathBuf,
}

async fn setup(dir: &Path) -> Setup {
    let (private, public, _) = cloud_bridge::models::keygen(&dir.join("keys")).unwrap();
    let extra = format!(
        "[models]\ndir = \"{}\"\nsigning_key = \"{}\"\npoll = \"200ms\"\n",
        dir.join("store").display(),
        private.display()
    );
    let cloud = TestCloud::start(dir, pki(dir, &[]), "127.0.0.1:0".parse().unwrap(), &extra).await;
    Setup { cloud, config: dir.join("cloud.toml"), public }
}

impl Setup {
    fn register(&self, dir: &Path, name: &str, text: &str, more: &[&str]) -> (bool, String, String) {
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        let mut args = vec!["schema", "register", "--subject", "reading", "--kind", "json"];
        args.extend_from_slice(more);
        args.push(file.to_str().unwrap());
        cli(&self.config, &args)
    }
}

/// An edge binding `telemetry/+/reading` to subject `reading` (enforce), its telemetry class
/// central, with `uplink` (its `[uplink]` section).
fn edge(dir: &Path, public: &Path, uplink: &str) -> EdgeProcess {
    std::fs::create_dir_all(dir).unwrap();
    let extra = format!(
        "{}\n{uplink}\n[models]\ndir = \"models\"\npublic_key = \"{}\"\n\n\
         [[schema]]\ntopic = \"telemetry/+/reading\"\nsubject = \"reading\"\nmode = \"enforce\"\n",
        with_spool(&[telemetry()]),
        public.display()
    );
    EdgeProcess::start(dir, &config_text(&extra))
}

fn staged(edge: &EdgeProcess) -> f64 {
    edge.metric("edge_schema_staged_version{subject=\"reading\"}")
}

fn checked(edge: &EdgeProcess, outcome: &str) -> f64 {
    edge.metric(&format!("edge_schema_checked_total{{subject=\"reading\",outcome=\"{outcome}\"}}"))
}

/// Publishes `payloads` to [`TOPIC`] at `qos` with paho; each acknowledgement's reason code and
/// Reason String.
async fn paho(edge: &EdgeProcess, qos: u8, v311: bool, payloads: &[&str]) -> Vec<(u64, Option<String>)> {
    let addr = edge.addr("local");
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(PUBLISHER).args(["127.0.0.1", &addr.port().to_string(), &qos.to_string()]);
    if v311 {
        cmd.arg("--v311");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with paho-mqtt (scripts/install-test-deps.sh)");
    let mut stdin = child.stdin.take().unwrap();
    for p in payloads {
        stdin.write_all(format!("{}\n", serde_json::json!([TOPIC, p])).as_bytes()).await.unwrap();
    }
    drop(stdin);
    let out = tokio::time::timeout(WAIT, child.wait_with_output()).await.expect("paho finished").unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            (v[0].as_u64().unwrap_or_else(|| panic!("{l}")), v[1].as_str().map(str::to_owned))
        })
        .collect()
}

/// How many sink rows carry exactly `payload`.
/// The id a `schema register` output names: "... (id 0123456789abcdef, ...".
fn id_in(out: &str) -> String {
    let at = out.find("(id ").expect("an id in the output") + 4;
    out[at..at + 16].to_owned()
}

/// The schema headers of the sink's row of `payload`: `Edge-Schema` and `Edge-Schema-Id`.
fn schema_headers(s: &Setup, payload: &str) -> Option<(String, String)> {
    let row = sink_rows(&s.cloud.sink).into_iter().find(|r| r.payload == payload.as_bytes())?;
    let headers: Vec<(String, String)> = serde_json::from_str(row.headers.as_deref()?).ok()?;
    let get = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    Some((get("Edge-Schema")?, get("Edge-Schema-Id")?))
}

/// `Edge-Schema` of the sink's row holding exactly `payload`.
fn named_in_sink(s: &Setup, payload: &[u8]) -> Option<String> {
    let row = sink_rows(&s.cloud.sink).into_iter().find(|r| r.payload == payload)?;
    let headers: Vec<(String, String)> = serde_json::from_str(row.headers.as_deref()?).ok()?;
    headers.into_iter().find(|(k, _)| k == "Edge-Schema").map(|(_, v)| v)
}

fn in_sink(s: &Setup, payload: &str) -> usize {
    sink_rows(&s.cloud.sink).iter().filter(|r| r.payload == payload.as_bytes()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_schema_reaches_the_edge_and_refuses_invalid_publishes_with_0x99_and_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    let (ok, out, err) = s.register(dir.path(), "v1.json", V1, &[]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("registered reading version 1") && out.contains("delivered to edges"), "{out}");
    let v1_id = id_in(&out);
    let edge_dir = dir.path().join("edge");
    let edge = edge(&edge_dir, &s.public, &s.cloud.uplink_section_via("edge-1", s.cloud.bridge.quic_addr()));
    assert!(e2e_tests::eventually(WAIT, || staged(&edge) == 1.0).await, "{}", edge.stderr());

    let valid = r#"{"temp":21.5,"unit":"C","n":1}"#;
    let acks = paho(&edge, 1, false, &[r#"{"temp":"hot","unit":"C"}"#, valid, r#"{"temp":3,"unit":"F"}"#]).await;
    assert_eq!(acks.len(), 3, "{acks:?}");
    assert_eq!(acks[0].0, 0x99, "{acks:?}");
    let reason = acks[0].1.as_deref().unwrap_or_default();
    assert!(reason.starts_with("schema reading v1: /temp: "), "the reason names the field: {reason}");
    assert_eq!(acks[1], (0, None));
    assert_eq!(acks[2].0, 0x99);
    assert!(acks[2].1.as_deref().unwrap_or_default().contains("/unit"), "{acks:?}");
    // QoS 2: refused at the PUBREC (0x99, the core's unit tests read it). paho 2 ignores a
    // PUBREC's reason code and sends PUBREL anyway; the exchange is over, so the broker answers
    // PUBCOMP 0x92, Packet Identifier not found (MQTT 5.0 §4.3.3), which paho reports.
    let acks = paho(&edge, 2, false, &["[]"]).await;
    assert_eq!(acks[0].0, 0x92, "{acks:?}");
    // MQTT 3.1.1 cannot hear a refusal: acknowledged, dropped, counted.
    let dropped = r#"{"temp":"v311"}"#;
    assert_eq!(paho(&edge, 1, true, &[dropped]).await, [(0, None)]);
    assert_eq!(checked(&edge, "invalid"), 4.0);
    assert_eq!(edge.metric("edge_mqtt_publish_refused_total{reason=\"schema\"}"), 4.0);
    // Issue 43, finding 11: each was validated on its connection before the broker core's
    // lock, which every client's packets wait for, and counted once.
    assert_eq!(checked(&edge, "valid"), 1.0);
    assert_eq!(edge.metric("edge_schema_validated_ahead_total"), 5.0);
    assert!(e2e_tests::eventually(WAIT, || in_sink(&s, valid) == 1).await, "the valid reading reaches the sink");
    // With the version it was validated against, as headers (protocol version 7).
    assert_eq!(schema_headers(&s, valid), Some(("reading/1".into(), v1_id.clone())));
    let rows = sink_rows(&s.cloud.sink);
    assert!(rows.iter().all(|r| !String::from_utf8_lossy(&r.payload).contains("hot")), "nothing refused was stored");
    assert_eq!(in_sink(&s, dropped), 0);

    // An incompatible version is refused by the registry, with the rule it breaks.
    let narrowed = V1.replace(r#""temp":{"type":"number"}"#, r#""temp":{"type":"string"}"#);
    let (ok, _, err) = s.register(dir.path(), "bad.json", &narrowed, &[]);
    assert!(!ok && err.contains("/temp") && err.contains("type narrowed"), "{err}");

    // Version 2 rolled out while a client publishes: every reading valid under both is taken,
    // and once version 2 is staged "F" is too.
    let publisher = {
        let addr = edge.addr("local");
        tokio::spawn(async move {
            let mut c = Client::anonymous(addr, "rollout").await;
            for n in 0..300 {
                c.publish(TOPIC, QoS::AtLeastOnce, false, format!(r#"{{"temp":1,"unit":"C","n":{n}}}"#)).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(c.acked(300, WAIT).await, "every rollout publish acknowledged");
        })
    };
    // The new version is registered once the rollout publisher is under way.
    assert!(e2e_tests::eventually(WAIT, || checked(&edge, "valid") >= 21.0).await, "{}", edge.stderr());
    let (ok, out, err) = s.register(dir.path(), "v2.json", V2, &[]);
    assert!(ok && out.contains("version 2"), "{out}{err}");
    let v2_id = id_in(&out);
    assert!(e2e_tests::eventually(WAIT, || staged(&edge) == 2.0).await, "{}", edge.stderr());
    publisher.await.unwrap();
    assert_eq!(checked(&edge, "invalid"), 4.0, "nothing valid was refused during the rollout");
    let f = r#"{"temp":3,"unit":"F"}"#;
    assert_eq!(paho(&edge, 1, false, &[f]).await, [(0, None)]);
    assert!(
        e2e_tests::eventually(WAIT, || (0..300)
            .all(|n| in_sink(&s, &format!(r#"{{"temp":1,"unit":"C","n":{n}}}"#)) == 1))
        .await,
        "every rollout reading in the sink once"
    );
    assert!(e2e_tests::eventually(WAIT, || in_sink(&s, f) == 1).await);
    assert_eq!(schema_headers(&s, f), Some(("reading/2".into(), v2_id)), "taken under version 2, named so");

    // The edge restarted with no bridge to reach: validation goes on with what it staged.
    let mut edge = edge;
    edge.signal("TERM");
    edge.wait_exit(WAIT).expect("edge stopped");
    let offline = s.cloud.uplink_section_via("edge-1", "127.0.0.1:9".parse().unwrap());
    drop(s.cloud);
    let edge = self::edge(&edge_dir, &s.public, &offline);
    assert!(e2e_tests::eventually(WAIT, || staged(&edge) == 2.0).await, "{}", edge.stderr());
    let acks = paho(&edge, 1, false, &[r#"{"temp":"offline","unit":"C"}"#, f]).await;
    assert_eq!((acks[0].0, acks[1].0), (0x99, 0), "{acks:?}");
}

const FRAME: &str = r#"syntax = "proto3";
package vision;
message Detection { string label = 1; float score = 2; sint32 x = 3; sint32 y = 4; }
message Frame { string camera = 1; int64 at = 2; double temp = 3; repeated Detection boxes = 4; bool ok = 5; }
"#;

/// A `vision.Frame`, written field by field as protobuf's encoding says (fields in number
/// order, defaults left out, sub-messages length-delimited).
fn frame(n: u64) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let camera = format!("cam-{}", n % 3);
    let mut p = vec![0x0a, camera.len() as u8];
    p.extend_from_slice(camera.as_bytes());
    p.push(0x10);
    varint(&mut p, 1_700_000_000_000 + n * 40);
    p.push(0x19);
    p.extend_from_slice(&(36.5 + (n % 20) as f64 / 10.0).to_le_bytes());
    for b in 0..(n % 3) {
        let mut d = vec![0x0a, 6];
        d.extend_from_slice(if b == 0 { b"person" } else { b"forklf" });
        d.push(0x15);
        d.extend_from_slice(&(0.5f32 + (n % 4) as f32 / 8.0).to_le_bytes());
        d.push(0x18);
        varint(&mut d, (n % 640) << 1);
        d.push(0x20);
        varint(&mut d, ((n % 480) << 1) | 1);
        p.push(0x22);
        varint(&mut p, d.len() as u64);
        p.extend(d);
    }
    if !n.is_multiple_of(5) {
        p.extend_from_slice(&[0x28, 1]);
    }
    p
}

/// A Protobuf subject through the shipped binaries: registered, staged, invalid bytes refused,
/// and valid frames taken apart by their schema on the uplink (protocol version 8) arriving in
/// the sink exactly as they were published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_frames_are_enforced_and_reach_the_sink_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    let file = dir.path().join("frame.proto");
    std::fs::write(&file, FRAME).unwrap();
    let (ok, out, err) = cli(
        &s.config,
        &[
            "schema",
            "register",
            "--subject",
            "reading",
            "--kind",
            "protobuf",
            "--message",
            "vision.Frame",
            file.to_str().unwrap(),
        ],
    );
    assert!(ok, "{out}{err}");
    let edge_dir = dir.path().join("edge");
    let edge = edge(&edge_dir, &s.public, &s.cloud.uplink_section_via("edge-1", s.cloud.bridge.quic_addr()));
    assert!(e2e_tests::eventually(WAIT, || staged(&edge) == 1.0).await, "{}", edge.stderr());

    let mut c = Client::anonymous(edge.addr("local"), "frames").await;
    // A length running past the end: not a Frame.
    c.publish(TOPIC, QoS::AtLeastOnce, false, vec![0x0a, 50, b'x']).await;
    let frames: Vec<Vec<u8>> = (0..400).map(frame).collect();
    for f in &frames {
        c.publish(TOPIC, QoS::AtLeastOnce, false, f.clone()).await;
    }
    assert!(c.acked(401, WAIT).await, "every publish answered");
    assert_eq!(checked(&edge, "invalid"), 1.0);
    assert_eq!(checked(&edge, "valid"), 400.0);
    assert!(
        e2e_tests::eventually(WAIT, || {
            let rows = sink_rows(&s.cloud.sink);
            frames.iter().all(|f| rows.iter().filter(|r| &r.payload == f).count() == 1)
        })
        .await,
        "every frame in the sink once, byte for byte"
    );
    assert_eq!(sink_rows(&s.cloud.sink).len(), 400, "nothing refused was stored");
    let walked =
        |outcome: &str| edge.metric(&format!("edge_schema_walked_total{{subject=\"reading\",outcome=\"{outcome}\"}}"));
    assert!(walked("apart") >= 400.0, "taken apart by the schema: {}", walked("apart"));
    assert_eq!(walked("whole"), 0.0);
}

/// The registry on a real nats-server (JetStream KV): versions numbered, the same schema twice
/// stored once, an incompatible one refused, and `list`/`show` reading what is there. A second
/// bridge config on the same server sees the same registry (bridges are stateless).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_lives_in_jetstream_when_the_sink_does() {
    let dir = tempfile::tempdir().unwrap();
    let nats = e2e_tests::nats::NatsServer::start();
    let p = pki(dir.path(), &[]);
    let config = dir.path().join("cloud.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nbind = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             [sink]\nkind = \"jetstream\"\nurl = \"{}\"\n",
            p.server_cert.display(),
            p.server_key.display(),
            p.ca.display(),
            nats.url()
        ),
    )
    .unwrap();
    let file = |name: &str, text: &str| {
        let f = dir.path().join(name);
        std::fs::write(&f, text).unwrap();
        f.to_str().unwrap().to_owned()
    };
    let (v1, v2) = (file("v1.json", V1), file("v2.json", V2));
    let register = |f: &str| cli(&config, &["schema", "register", "--subject", "reading", "--kind", "json", f]);
    let (ok, out, err) = register(&v1);
    assert!(ok && out.contains("version 1") && out.contains("no [models] section"), "{out}{err}");
    let (ok, out, _) = register(&v1);
    assert!(ok && out.contains("already has this schema as version 1"), "{out}");
    let (ok, out, _) = cli(&config, &["schema", "check", "--subject", "reading", "--kind", "json", &v2]);
    assert!(ok && out.contains("would be reading version 2"), "{out}");
    let (ok, out, _) = register(&v2);
    assert!(ok && out.contains("version 2"), "{out}");
    let narrowed = file("bad.json", &V2.replace(r#"["C","F"]"#, r#"["F"]"#));
    let (ok, _, err) = register(&narrowed);
    assert!(!ok && err.contains("enum narrowed") && err.contains("/unit"), "{err}");
    let (ok, out, _) = cli(&config, &["schema", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(ok && list[0]["versions"] == 2 && list[0]["latest"]["version"] == 2, "{out}");
    let (ok, out, _) = cli(&config, &["schema", "show", "--subject", "reading", "--version", "1"]);
    assert!(ok && out.contains(r#""enum":["C"]"#), "{out}");
    // Full compatibility from now on: widening the enum again is one-way, so it is refused.
    let wider = file("v3.json", &V2.replace(r#"["C","F"]"#, r#"["C","F","K"]"#));
    let (ok, _, err) = cli(
        &config,
        &["schema", "register", "--subject", "reading", "--kind", "json", "--compatibility", "full", &wider],
    );
    assert!(!ok && err.contains("old reads new") && err.contains("enum narrowed"), "{err}");
}

const AVRO_V1: &str =
    r#"{"type":"record","name":"R","fields":[{"name":"a","type":"long"},{"name":"b","type":"long"}]}"#;
/// A field added with a default: backward compatible, and a version 1 payload (two longs) is
/// too short to be a version 2 one.
const AVRO_V2: &str = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"long"},{"name":"b","type":"long"},{"name":"c","type":"long","default":0}]}"#;

/// Longs as Avro writes them (zigzag varints), each under 64: one byte.
fn longs(values: &[u8]) -> Vec<u8> {
    values.iter().map(|v| v << 1).collect()
}

/// Issue 45: a device still on version 1 keeps publishing through a backward compatible change
/// and its records name version 1; a payload in the Confluent framing names the version its id
/// says; a version delivered late (its first delivery failed) is not announced over the newer
/// one (the edge's own refusal of a lower version is `models::tests`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_on_the_version_before_a_backward_change_keeps_publishing_named_by_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path()).await;
    let register = |config: &Path, name: &str, text: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        cli(config, &["schema", "register", "--subject", "reading", "--kind", "avro", file.to_str().unwrap()])
    };
    // Version 1 registered from a config without [models]: its delivery to the edges is missed.
    let text = std::fs::read_to_string(&s.config).unwrap();
    let (head, rest) = text.split_once("[models]").unwrap();
    let undelivered = dir.path().join("undelivered.toml");
    std::fs::write(&undelivered, format!("{head}{}", &rest[rest.find("[http]").unwrap()..])).unwrap();
    let (ok, out, err) = register(&undelivered, "v1.avsc", AVRO_V1);
    assert!(ok && out.contains("not delivered"), "{out}{err}");
    let (ok, out, err) = register(&s.config, "v2.avsc", AVRO_V2);
    assert!(ok && out.contains("version 2") && out.contains("also accept what producers on version 1"), "{out}{err}");
    let v1_number = {
        let (_, out, _) = cli(&s.config, &["schema", "show", "--subject", "reading", "--version", "1", "--json"]);
        let v: shared::schema::Version = serde_json::from_str(&out).unwrap();
        v.registry_id()
    };

    let edge_dir = dir.path().join("edge");
    let edge = edge(&edge_dir, &s.public, &s.cloud.uplink_section_via("edge-1", s.cloud.bridge.quic_addr()));
    assert!(e2e_tests::eventually(WAIT, || staged(&edge) == 2.0).await, "{}", edge.stderr());
    let old_device = longs(&[1, 2]);
    let new_device = longs(&[1, 2, 3]);
    let framed_v1 = [&[0u8][..], &v1_number.to_be_bytes(), &longs(&[4, 5])].concat();
    let mut c = Client::anonymous(edge.addr("local"), "devices").await;
    for p in [&old_device, &new_device, &framed_v1] {
        c.publish(TOPIC, QoS::AtLeastOnce, false, p.clone()).await;
    }
    assert!(c.acked(3, WAIT).await);
    assert_eq!((checked(&edge, "valid"), checked(&edge, "invalid")), (3.0, 0.0));
    for (payload, version) in [(&old_device, "reading/1"), (&new_device, "reading/2"), (&framed_v1, "reading/1")] {
        assert!(e2e_tests::eventually(WAIT, || named_in_sink(&s, payload).is_some()).await, "{payload:?} in the sink");
        assert_eq!(named_in_sink(&s, payload).as_deref(), Some(version), "{payload:?}");
    }

    // Version 1 registered again, now delivered: made after version 2, still older. An edge
    // that connects now, with nothing staged, is announced the latest: version 2, not 1.
    let (ok, out, err) = register(&s.config, "v1.avsc", AVRO_V1);
    assert!(ok && out.contains("delivered to edges as model schema.reading version 1"), "{out}{err}");
    drop(c);
    let mut edge = edge;
    edge.signal("TERM");
    edge.wait_exit(WAIT).expect("edge stopped");
    let fresh = self::edge(
        &dir.path().join("fresh"),
        &s.public,
        &s.cloud.uplink_section_via("edge-1", s.cloud.bridge.quic_addr()),
    );
    assert!(e2e_tests::eventually(WAIT, || staged(&fresh) > 0.0).await, "{}", fresh.stderr());
    assert_eq!(staged(&fresh), 2.0, "the highest version, not the newest delivery: {}", fresh.stderr());
    let mut c = Client::anonymous(fresh.addr("local"), "devices").await;
    c.publish(TOPIC, QoS::AtLeastOnce, false, new_device.clone()).await;
    assert!(c.acked(1, WAIT).await);
    assert_eq!(checked(&fresh, "valid"), 1.0, "version 2 validates");
}
