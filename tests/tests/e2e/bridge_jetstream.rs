//! The JetStream sink against a real nats-server: subjects and headers as the design names
//! them, a `Nats-Msg-Id` per record, the committed marks in KV, and two bridge instances
//! serving one edge one after the other with nothing lost or duplicated, the second decoding
//! with the zstd dictionary the first stored in KV.

use std::collections::BTreeSet;
use std::time::Duration;

use cloud_bridge::sink::jetstream::BatchPublish;
use e2e_tests::client::Client;
use e2e_tests::cloud::{TestCloud, pki};
use e2e_tests::fixtures::{inference, with_spool};
use e2e_tests::nats::{NatsServer, sink_settings as settings, stream_messages};
use e2e_tests::node::TestNode;
use rumqttc::QoS;
use shared::proto::Seq;

const WAIT: Duration = Duration::from_secs(20);

fn classes_toml() -> String {
    with_spool(&[inference()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bridges_on_one_jetstream_serve_an_edge_exactly_once() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let cloud =
        TestCloud::start_on_jetstream(dir.path(), keys.clone(), "127.0.0.1:0".parse().unwrap(), "", &nats.url()).await;
    let addr = cloud.bridge.quic_addr();
    let extra = format!(
        "{}\n{}linger = \"20ms\"\ndict_size = \"1KiB\"\ndict_samples = \"4KiB\"\n",
        classes_toml(),
        cloud.uplink_section("edge-1")
    );
    let edge = TestNode::start(&extra).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    let payload =
        |tag: &str, i: u32| format!(r#"{{"tag":"{tag}","i":{i},"boxes":[{{"label":"person","score":0.{}}}]}}"#, i % 97);
    // Until batches go out compressed with a dictionary the bridge stored.
    let mut sent = 0u32;
    let deadline = tokio::time::Instant::now() + WAIT;
    while edge.metric("edge_uplink_dict_batches_total") < 1.0 {
        assert!(tokio::time::Instant::now() < deadline, "no dictionary used: {}", edge.metrics());
        for i in sent..sent + 30 {
            publisher
                .publish(&format!("inference/yolo-edge/v3.2.1/cam-{i}"), QoS::AtLeastOnce, false, payload("a", i))
                .await;
        }
        sent += 30;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(e2e_tests::eventually(WAIT, || cloud.committed("edge-1", 1) >= 50).await);
    cloud.bridge.stop().await;
    drop(cloud);
    // The dictionary is in KV under the edge and the hash of its bytes, next to the edge's
    // index of its dictionaries.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let dicts = async_nats::jetstream::new(client).get_key_value("edge-dicts").await.unwrap();
    let mut keys_in_kv = Vec::new();
    let mut listing = dicts.keys().await.unwrap();
    while let Some(k) = futures_util::StreamExt::next(&mut listing).await {
        keys_in_kv.push(k.unwrap());
    }
    keys_in_kv.sort();
    assert_eq!(keys_in_kv.len(), 2, "{keys_in_kv:?}");
    assert_eq!(keys_in_kv[0], "edge-1", "the index");
    let bytes = dicts.get(&keys_in_kv[1]).await.unwrap().unwrap();
    assert_eq!(format!("edge-1.{}", shared::proto::compress::dict_id(&bytes)), keys_in_kv[1]);

    let first_round = sent;
    for i in 0..150 {
        publisher
            .publish(&format!("inference/yolo-edge/v3.2.1/cam-{i}"), QoS::AtLeastOnce, false, payload("b", i))
            .await;
    }
    sent += 150;
    let dict_batches = edge.metric("edge_uplink_dict_batches_total");
    let cloud = TestCloud::start_on_jetstream(dir.path(), keys, addr, "", &nats.url()).await;
    assert!(
        e2e_tests::eventually(WAIT, || cloud.committed("edge-1", 1) == u64::from(sent)).await,
        "{:?}",
        cloud.fleet()
    );
    assert!(edge.metric("edge_uplink_dict_batches_total") > dict_batches, "the second bridge decodes with it");
    assert_eq!(edge.metric("edge_uplink_dicts_announced_total"), 1.0, "found in KV, not announced again");

    let messages = stream_messages(&nats.url()).await;
    assert_eq!(messages.len(), sent as usize, "each record once in the stream");
    let ids: BTreeSet<String> = messages
        .iter()
        .map(|m| m.headers.get("Nats-Msg-Id").map(|v| v.as_str().to_owned()).unwrap_or_default())
        .collect();
    assert_eq!(ids.len(), sent as usize);
    assert!(ids.iter().all(|id| id.starts_with("edge-1:") && id.ends_with(|c: char| c.is_ascii_digit())), "{ids:?}");
    let first = &messages[0];
    assert_eq!(first.subject.as_str(), "edge.edge-1.inference.yolo-edge.v3%2E2%2E1.cam-0");
    assert_eq!(first.headers.get("Mqtt-Topic").map(|v| v.as_str()), Some("inference/yolo-edge/v3.2.1/cam-0"));
    assert_eq!(&first.payload[..], payload("a", 0).as_bytes());
    assert_eq!(&messages[first_round as usize].payload[..], payload("b", 0).as_bytes());
    // The marks bucket holds the committed seq for this edge and epoch.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let kv = async_nats::jetstream::new(client).get_key_value("edge-marks").await.unwrap();
    let epoch = ids.iter().next().unwrap().split(':').nth(1).unwrap().to_owned();
    let mark = kv.get(format!("edge-1.{epoch}")).await.unwrap().unwrap();
    assert_eq!(String::from_utf8_lossy(&mark), format!(r#"{{"1":{sent}}}"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_stream_with_other_subjects_is_refused_by_name() {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    async_nats::jetstream::new(client)
        .create_stream(async_nats::jetstream::stream::Config {
            name: "EDGE".into(),
            subjects: vec!["elsewhere.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let path = dir.path().join("cloud.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nbind = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             [sink]\nkind = \"jetstream\"\nurl = \"{}\"\n",
            keys.server_cert.display(),
            keys.server_key.display(),
            keys.ca.display(),
            nats.url()
        ),
    )
    .unwrap();
    let config = cloud_bridge::config::CloudConfig::load(&path).unwrap();
    let err = cloud_bridge::Bridge::start(config).await.unwrap_err().to_string();
    assert!(err.contains("EDGE") && err.contains("elsewhere.>"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_killed_and_restarted_mid_stream_loses_and_duplicates_nothing() {
    let mut nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cloud = TestCloud::start_on_jetstream(
        dir.path(),
        pki(dir.path(), &[]),
        "127.0.0.1:0".parse().unwrap(),
        "",
        &nats.url(),
    )
    .await;
    let edge = TestNode::start(&format!("{}\n{}", classes_toml(), cloud.uplink_section("edge-1"))).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    for i in 0..200 {
        publisher.publish(&format!("inference/m/v1/cam-{i}"), QoS::AtLeastOnce, false, format!("a{i}")).await;
    }
    assert!(e2e_tests::eventually(WAIT, || cloud.committed("edge-1", 1) >= 1).await);
    nats.restart();
    for i in 0..200 {
        publisher.publish(&format!("inference/m/v1/cam-{i}"), QoS::AtLeastOnce, false, format!("b{i}")).await;
    }
    assert!(
        e2e_tests::eventually(WAIT, || cloud.committed("edge-1", 1) == 400).await,
        "{:?} {}",
        cloud.fleet(),
        cloud.bridge.metrics().encode()
    );
    let messages = stream_messages(&nats.url()).await;
    let payloads: BTreeSet<Vec<u8>> = messages.iter().map(|m| m.payload.to_vec()).collect();
    assert_eq!((messages.len(), payloads.len()), (400, 400), "each record once across the restart");
    // The sink retried on the same session: the edge never lost its connection to the outage.
    assert_eq!(cloud.metric("bridge_sessions_closed_total{reason=\"sink\"}"), 0.0);
    assert_eq!(cloud.metric("bridge_sessions_closed_total{reason=\"connection\"}"), 0.0);
    assert_eq!(edge.metric("edge_uplink_reconnects_total"), 0.0);
}

/// The payloads of the stream `EDGE`, in stream order, as text.
async fn stored_payloads(url: &str) -> Vec<String> {
    stream_messages(url).await.iter().map(|m| String::from_utf8_lossy(&m.payload).into_owned()).collect()
}

fn telemetry(seq: u64) -> shared::proto::WireRecord {
    shared::proto::WireRecord::message(
        Seq(seq),
        shared::proto::WireMessage {
            class: "telemetry".into(),
            topic: "telemetry/one".into(),
            payload: format!("m{seq}").into_bytes(),
            qos: 1,
            enqueued_ms: seq,
            expires_ms: None,
            user_properties: Vec::new(),
            correlation_data: None,
            content_type: None,
            schema: None,
        },
    )
}

/// The resend after a bridge died between publish and mark overlaps records already stored.
/// An atomic batch is refused whole then, and the sink publishes it message by message; a fast
/// batch skips the duplicates. Either way only the new records land, in order. A batch staged
/// and never published lands nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_overlapping_stored_records_lands_only_the_new_ones_in_order() {
    use cloud_bridge::sink::RecordSink;
    for batches in [BatchPublish::Atomic, BatchPublish::Fast] {
        let nats = NatsServer::start();
        let settings = settings(nats.url(), batches);
        let connect = || cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings);
        let sink = connect().await.unwrap();
        let batch = |seqs: std::ops::RangeInclusive<u64>| seqs.map(telemetry).collect::<Vec<_>>();
        e2e_tests::cloud::publish(&sink, "edge-1", "ep", 3, batch(1..=10)).await.unwrap();
        // Another bridge instance, as after a restart, gets the overlapping resend.
        let second = connect().await.unwrap();
        e2e_tests::cloud::publish(&second, "edge-1", "ep", 3, batch(6..=15)).await.unwrap();
        // All of a batch stored before: nothing new, and no error.
        e2e_tests::cloud::publish(&second, "edge-1", "ep", 3, batch(11..=15)).await.unwrap();
        // A batch staged while the one before it failed is never published, and lands nothing
        // (an atomic batch's staged messages are dropped by the server uncommitted).
        let staged = second.stage("edge-1".into(), "ep".into(), 3, batch(21..=25)).await.unwrap();
        drop(staged);
        e2e_tests::cloud::publish(&second, "edge-1", "ep", 3, batch(16..=20)).await.unwrap();
        let payloads = stored_payloads(&nats.url()).await;
        let expected: Vec<String> = (1..=20).map(|s| format!("m{s}")).collect();
        assert_eq!(payloads, expected, "{batches:?}");
    }
}

/// Batches staged ahead, as a session's pipeline stages them while the one before publishes,
/// land in the order they are published, whatever the staging order: atomic batches staged on
/// the server (one over the 1,000 messages of an atomic batch, so its later part is staged at
/// its turn), fast batches with their reply subscription made. A batch staged twice (a retry
/// after the edge's resend) lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_staged_ahead_land_in_publish_order() {
    use cloud_bridge::sink::RecordSink;
    for batches in [BatchPublish::Atomic, BatchPublish::Fast] {
        let nats = NatsServer::start();
        let sink = cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings(nats.url(), batches)).await.unwrap();
        let stage = |seqs: std::ops::RangeInclusive<u64>| {
            sink.stage("edge-1".into(), "ep".into(), 3, seqs.map(telemetry).collect())
        };
        // Staged last to first: the server holds three atomic batches at once.
        let third = stage(1_511..=1_520).await.unwrap();
        let second = stage(11..=1_510).await.unwrap();
        let first = stage(1..=10).await.unwrap();
        let again = stage(1..=10).await.unwrap();
        for staged in [first, second, third, again] {
            sink.publish(staged).await.unwrap();
        }
        let payloads = stored_payloads(&nats.url()).await;
        let expected: Vec<String> = (1..=1_520).map(|s| format!("m{s}")).collect();
        assert_eq!(payloads.len(), expected.len(), "{batches:?}");
        assert!(payloads == expected, "{batches:?}: out of order");
    }
}

/// Many edges draining at once each have a fast batch in flight: the server's limits on batches
/// in flight must not refuse them (a refused batch would cost its edge the connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_edges_publishing_at_once_all_land() {
    const EDGES: u64 = 1_000;
    const RECORDS: u64 = 40;
    let nats = NatsServer::start();
    let sink =
        cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings(nats.url(), BatchPublish::Fast)).await.unwrap();
    let publishes = (0..EDGES).map(|edge| {
        let records = (1..=RECORDS).map(telemetry).collect::<Vec<_>>();
        let sink = &sink;
        async move { e2e_tests::cloud::publish(sink, &format!("edge-{edge}"), "ep", 3, records).await }
    });
    let results = futures_util::future::join_all(publishes).await;
    let failed: Vec<String> = results.into_iter().filter_map(|r| r.err().map(|e| e.to_string())).collect();
    assert!(failed.is_empty(), "{} refused, first: {:?}", failed.len(), failed.first());
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    assert_eq!(js.get_stream("EDGE").await.unwrap().info().await.unwrap().state.messages, EDGES * RECORDS);
}

/// The fast-ingest sink relies on this: in `fail` gap mode the server stops storing a batch at
/// its first missing sequence, so messages a client sends after losing some in a reconnect
/// never land ahead of the lost ones. Messages 1-4 are sent, 5 is not, 6-8 are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_stores_a_fast_batch_only_up_to_its_first_gap() {
    let nats = NatsServer::start();
    let _sink =
        cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings(nats.url(), BatchPublish::Fast)).await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(format!("{inbox}.>")).await.unwrap();
    for seq in (1..=8u64).filter(|s| *s != 5) {
        let op = if seq == 8 { 2 } else { u64::from(seq > 1) };
        let reply = format!("{inbox}.100.fail.{seq}.{op}.$FI");
        client.publish_with_reply("edge.edge-1.gap-test", reply, format!("m{seq}").into()).await.unwrap();
    }
    // Flow acks and the gap carry a "type"; the batch's last reply (its pub ack) does not.
    let mut said: Vec<String> = Vec::new();
    while said.last().is_none_or(|r| r.contains("\"type\"")) {
        let next = tokio::time::timeout(Duration::from_secs(20), futures_util::StreamExt::next(&mut replies)).await;
        let m = next.unwrap_or_else(|_| panic!("no final reply; so far: {said:?}")).unwrap();
        said.push(String::from_utf8_lossy(&m.payload).into_owned());
    }
    let payloads = stored_payloads(&nats.url()).await;
    assert_eq!(payloads, ["m1", "m2", "m3", "m4"], "server replies: {said:?}");
    assert!(said.iter().any(|r| r.contains("\"gap\"")), "the server reports the gap: {said:?}");
}

/// A stream made before the bridge, without batches allowed, is set to allow the kind used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_stream_is_set_to_allow_batches() {
    let nats = NatsServer::start();
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "EDGE".into(),
        subjects: vec!["edge.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let info = || async { js.get_stream("EDGE").await.unwrap().info().await.unwrap().config.clone() };
    let _sink = cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings(nats.url(), BatchPublish::Atomic))
        .await
        .unwrap();
    assert!(info().await.allow_atomic_publish);
    assert!(!info().await.allow_batch_publish);
    let _sink =
        cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings(nats.url(), BatchPublish::Auto)).await.unwrap();
    let config = info().await;
    assert!(config.allow_batch_publish && config.allow_atomic_publish, "the atomic setting is kept");
}

/// TCO classes reports live in a KV bucket: the latest per edge, readable without the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tco_reports_are_kept_per_edge_in_kv() {
    use cloud_bridge::sink::{FleetStore, StoredReport};
    let nats = NatsServer::start();
    assert!(cloud_bridge::sink::jetstream::fleet::load_reports_from(&nats.url(), "edge-tco").await.unwrap().is_empty());
    let sink =
        cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings(nats.url(), BatchPublish::Auto)).await.unwrap();
    let report = |edge: &str, currency: &str| StoredReport {
        edge: edge.into(),
        received_ms: 1,
        report: shared::proto::ClassesReport { currency: currency.into(), classes: Vec::new() },
    };
    sink.store_report(&report("edge.b", "USD")).await.unwrap();
    sink.store_report(&report("edge-a", "USD")).await.unwrap();
    sink.store_report(&report("edge-a", "EUR")).await.unwrap();
    let stored = cloud_bridge::sink::jetstream::fleet::load_reports_from(&nats.url(), "edge-tco").await.unwrap();
    assert_eq!(stored, vec![report("edge-a", "EUR"), report("edge.b", "USD")]);
}

/// A user property named like a JetStream header (`Nats-Expected-Last-Sequence: 1` made the
/// server refuse every batch it was in, and the edge resent that batch forever) or like one of
/// ours lands renamed `Mqtt-Prop-<name>`, and the records behind it land too. Our own headers
/// keep their one value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_properties_named_like_reserved_headers_neither_stop_a_lane_nor_spoof_ours() {
    const POISON: [(&str, &str); 6] = [
        ("Nats-Expected-Last-Sequence", "1"),
        ("Nats-Rollup", "all"),
        ("Nats-Expected-Stream", "OTHER"),
        ("Nats-Msg-Id", "edge-1:ep:3:1"),
        ("Edge-Id", "someone-else"),
        ("Mqtt-Topic", "not/the/topic"),
    ];
    for batches in [BatchPublish::Atomic, BatchPublish::Fast] {
        let nats = NatsServer::start();
        let sink = cloud_bridge::sink::jetstream::JetStreamSink::connect(&settings(nats.url(), batches)).await.unwrap();
        let mut records: Vec<_> = (1..=11).map(telemetry).collect();
        let first = records[0].as_message_mut().unwrap();
        first.user_properties = POISON.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        let stored = tokio::time::timeout(WAIT, e2e_tests::cloud::publish(&sink, "edge-1", "ep", 3, records));
        stored.await.expect("the sink answers").expect("the batch is stored");
        let messages = stream_messages(&nats.url()).await;
        assert_eq!(messages.len(), 11, "{batches:?}: the poisoned record and all behind it");
        let headers = &messages[0].headers;
        for (name, value) in POISON {
            let renamed = format!("Mqtt-Prop-{name}");
            assert_eq!(headers.get(renamed.as_str()).map(|v| v.as_str()), Some(value), "{batches:?}: {renamed}");
        }
        let all = |name: &str| headers.get_all(name).map(|v| v.as_str().to_owned()).collect::<Vec<_>>();
        assert_eq!(all("Edge-Id"), ["edge-1"], "{batches:?}");
        assert_eq!(all("Mqtt-Topic"), ["telemetry/one"], "{batches:?}");
        assert_eq!(all("Nats-Msg-Id"), ["edge-1:ep:3:1"], "{batches:?}");
    }
}
