//! What one edge can make the cloud keep, bounded per edge, on both sinks: epochs (a new spool
//! names a new one; each has its marks) and zstd dictionaries. Played by a raw client holding a
//! valid edge certificate, since a real edge makes a new epoch only with a new spool.

use std::time::Duration;

use cloud_bridge::certs::Pki;
use e2e_tests::cloud::{TestCloud, pki};
use e2e_tests::nats::NatsServer;
use e2e_tests::quic;
use shared::proto::{Control, DictAnnounce, LaneSeq, codec, compress};
use shared::proto::{Lane, Seq};

const LIMITS: &str = "[limits]\nepochs_per_edge = 2\nretired_epochs_per_edge = 3\ndicts_per_edge = 2\n";

fn edge(keys: &Pki, id: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let (_, cert, key) = keys.edges.iter().find(|(e, _, _)| e == id).expect("edge in the PKI").clone();
    (cert, key)
}

/// Sends one record at seq 1 of lane 0 and waits for its ack.
async fn deliver_one(conn: &quinn::Connection, recv: &mut quinn::RecvStream, topic: &str) {
    let record = e2e_tests::fixtures::wire_record(1, topic, "x");
    let batch = compress::pack("", Lane(0), Seq(1), &[record], None, 3).unwrap();
    let mut uni = conn.open_uni().await.unwrap();
    uni.write_all(&codec::encode(&batch).unwrap()).await.unwrap();
    uni.finish().unwrap();
    loop {
        match quic::next_control(recv).await {
            Some(Control::Ack(a)) if a.lane == Lane(0) && a.up_to == Seq(1) => return,
            Some(_) => continue,
            None => panic!("the bridge closed the control stream before the ack"),
        }
    }
}

/// Three epochs of one edge with room for two: the first is retired (its marks deleted), and a
/// hello of it again, as a spool restored from an old copy would send, is refused naming it
/// and why; the live ones resume from their marks.
async fn epochs_are_bounded_and_a_retired_one_is_refused_by_name(cloud: &TestCloud) {
    let (cert, key) = edge(&cloud.pki, "edge-1");
    let addr = cloud.bridge.quic_addr();
    for epoch in ["epoch-a", "epoch-b", "epoch-c"] {
        let conn = quic::connect(addr, &cloud.pki.ca, &cert, &key).await.unwrap();
        let (_send, mut recv) = quic::welcomed(&conn, epoch).await;
        deliver_one(&conn, &mut recv, &format!("telemetry/{epoch}")).await;
        conn.close(0u32.into(), b"");
    }
    assert_eq!(cloud.metric("bridge_epochs_registered_total"), 3.0, "{}", cloud.bridge.metrics().encode());
    assert_eq!(cloud.metric("bridge_epochs_retired_total"), 1.0);

    let conn = quic::connect(addr, &cloud.pki.ca, &cert, &key).await.unwrap();
    let (_send, _recv, answer) = quic::hello(&conn, quic::hello_for("epoch-a")).await;
    let Control::Refused { reason } = answer else { panic!("a retired epoch was welcomed: {answer:?}") };
    assert!(reason.contains("epoch epoch-a of edge edge-1") && reason.contains("retired"), "{reason}");
    assert!(reason.contains("limits.epochs_per_edge"), "names the limit: {reason}");
    let closed = tokio::time::timeout(Duration::from_secs(10), conn.closed()).await.expect("closed after refusing");
    assert!(closed.to_string().contains("refused"), "{closed}");
    assert_eq!(cloud.metric("bridge_connections_refused_total{reason=\"epoch_retired\"}"), 1.0);

    for epoch in ["epoch-b", "epoch-c"] {
        let conn = quic::connect(addr, &cloud.pki.ca, &cert, &key).await.unwrap();
        let (_send, _recv, answer) = quic::hello(&conn, quic::hello_for(epoch)).await;
        let Control::Welcome(w) = answer else { panic!("live epoch {epoch} refused: {answer:?}") };
        assert_eq!(w.committed, [LaneSeq { lane: Lane(0), seq: Seq(1) }], "{epoch} resumes from its mark");
        conn.close(0u32.into(), b"");
    }
    // Two more retire b and c (three names remembered, the most allowed), so a sixth epoch is
    // refused: the edge has used all its limits allow.
    for epoch in ["epoch-d", "epoch-e"] {
        let conn = quic::connect(addr, &cloud.pki.ca, &cert, &key).await.unwrap();
        let (_send, mut recv) = quic::welcomed(&conn, epoch).await;
        deliver_one(&conn, &mut recv, &format!("telemetry/{epoch}")).await;
        conn.close(0u32.into(), b"");
    }
    let conn = quic::connect(addr, &cloud.pki.ca, &cert, &key).await.unwrap();
    let (_send, _recv, answer) = quic::hello(&conn, quic::hello_for("epoch-f")).await;
    let Control::Refused { reason } = answer else { panic!("{answer:?}") };
    assert!(reason.contains("limits.retired_epochs_per_edge"), "{reason}");
    assert_eq!(cloud.metric("bridge_connections_refused_total{reason=\"epochs_exhausted\"}"), 1.0);
    // Another edge's epochs are its own.
    let (cert2, key2) = edge(&cloud.pki, "edge-2");
    let conn = quic::connect(addr, &cloud.pki.ca, &cert2, &key2).await.unwrap();
    quic::welcomed(&conn, "epoch-a").await;
}

async fn announce(send: &mut quinn::SendStream, recv: &mut quinn::RecvStream, id: &str, bytes: &[u8]) {
    let dict = DictAnnounce { id: id.to_owned(), class: "telemetry".into(), bytes: bytes.to_vec() };
    send.write_all(&codec::encode(&Control::Dict(dict)).unwrap()).await.unwrap();
    loop {
        match quic::next_control(recv).await {
            Some(Control::DictStored { id: stored }) if stored == id => return,
            Some(_) => continue,
            None => panic!("the bridge closed the control stream: dictionary {id} not stored"),
        }
    }
}

/// Dictionaries are kept per edge, at most two here: a third evicts the oldest, the next
/// welcome lists only what is kept, and no edge can use another's.
async fn dictionaries_are_kept_per_edge_within_the_quota(cloud: &TestCloud) {
    let (cert, key) = edge(&cloud.pki, "edge-1");
    let addr = cloud.bridge.quic_addr();
    let dicts: Vec<Vec<u8>> = (0..3).map(|i| format!("dictionary {i} of edge-1").into_bytes()).collect();
    let ids: Vec<String> = dicts.iter().map(|d| compress::dict_id(d)).collect();
    assert!(ids.iter().all(|id| id.len() == 64), "version 2 ids are the whole hash");
    let conn = quic::connect(addr, &cloud.pki.ca, &cert, &key).await.unwrap();
    let (mut send, mut recv) = quic::welcomed(&conn, "epoch-a").await;
    for (id, bytes) in ids.iter().zip(&dicts) {
        announce(&mut send, &mut recv, id, bytes).await;
    }
    conn.close(0u32.into(), b"");
    assert_eq!(cloud.metric("bridge_dicts_evicted_total"), 1.0, "{}", cloud.bridge.metrics().encode());

    let conn = quic::connect(addr, &cloud.pki.ca, &cert, &key).await.unwrap();
    let (_send, _recv, answer) =
        quic::hello(&conn, shared::proto::Hello { dicts: ids.clone(), ..quic::hello_for("epoch-a") }).await;
    let Control::Welcome(w) = answer else { panic!("{answer:?}") };
    assert_eq!(w.dicts, &ids[1..], "the oldest was evicted");
    conn.close(0u32.into(), b"");

    let (cert2, key2) = edge(&cloud.pki, "edge-2");
    let conn = quic::connect(addr, &cloud.pki.ca, &cert2, &key2).await.unwrap();
    let (_send, _recv, answer) =
        quic::hello(&conn, shared::proto::Hello { dicts: ids.clone(), ..quic::hello_for("epoch-a") }).await;
    let Control::Welcome(w) = answer else { panic!("{answer:?}") };
    assert!(w.dicts.is_empty(), "edge-2 named edge-1's dictionaries and got {:?}", w.dicts);
    conn.close(0u32.into(), b"");

    // A version 1 session names a dictionary by 16 digits of its hash; the full id is refused.
    let conn = quic::connect(addr, &cloud.pki.ca, &cert, &key).await.unwrap();
    let v1 = shared::proto::Hello { versions: vec![1], ..quic::hello_for("epoch-a") };
    let (mut send, mut recv, answer) = quic::hello(&conn, v1.clone()).await;
    assert!(matches!(answer, Control::Welcome(ref w) if w.version == 1), "{answer:?}");
    announce(&mut send, &mut recv, &ids[0][..16], &dicts[0]).await;
    conn.close(0u32.into(), b"");
    let conn = quic::connect(addr, &cloud.pki.ca, &cert, &key).await.unwrap();
    let (mut send, _recv, _) = quic::hello(&conn, v1).await;
    let dict = DictAnnounce { id: ids[2].clone(), class: "telemetry".into(), bytes: dicts[2].clone() };
    send.write_all(&codec::encode(&Control::Dict(dict)).unwrap()).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(10), conn.closed()).await.expect("closed");
    assert!(closed.to_string().contains("does not hash to its id"), "{closed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_epochs_are_bounded_and_a_retired_one_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let cloud = TestCloud::start(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), LIMITS).await;
    epochs_are_bounded_and_a_retired_one_is_refused_by_name(&cloud).await;
    let conn = rusqlite::Connection::open(&cloud.sink).unwrap();
    let marks: Vec<String> = conn
        .prepare("SELECT DISTINCT epoch FROM marks WHERE edge_id = 'edge-1' ORDER BY epoch")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(marks, ["epoch-d", "epoch-e"], "only the live epochs have marks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_jetstream_epochs_are_bounded_and_a_retired_one_is_refused_by_name() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let cloud =
        TestCloud::start_on_jetstream(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), LIMITS, &nats.url()).await;
    epochs_are_bounded_and_a_retired_one_is_refused_by_name(&cloud).await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let kv = async_nats::jetstream::new(client).get_key_value("edge-marks").await.unwrap();
    let mut keys = Vec::new();
    let mut listing = kv.keys().await.unwrap();
    while let Some(k) = futures_util::StreamExt::next(&mut listing).await {
        keys.push(k.unwrap());
    }
    keys.sort();
    // Each edge's register, and marks only for edge-1's live epochs.
    assert_eq!(keys, ["edge-1", "edge-1.epoch-d", "edge-1.epoch-e", "edge-2"], "retired epochs' marks are purged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_dictionaries_are_kept_per_edge_within_the_quota() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let cloud = TestCloud::start(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), LIMITS).await;
    dictionaries_are_kept_per_edge_within_the_quota(&cloud).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_jetstream_dictionaries_are_kept_per_edge_within_the_quota() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &["edge-2"]);
    let cloud =
        TestCloud::start_on_jetstream(dir.path(), keys, "127.0.0.1:0".parse().unwrap(), LIMITS, &nats.url()).await;
    dictionaries_are_kept_per_edge_within_the_quota(&cloud).await;
}
