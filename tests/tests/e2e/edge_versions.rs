//! A rolling upgrade, this edge's side: a real edge drains into bridges of every version this
//! build speaks and of the next one (`super::bridge_versions` has the bridge's side and says
//! what each version added). The other version's bridge is played by a QUIC server that speaks
//! only the versions given, welcomes with a field this build does not know, and sends control
//! frames it has never seen: the edge negotiates the highest common version, sends batches as
//! that version frames them, names dictionaries by its ids, takes the downlink within the
//! window that version allows, and every record arrives and is acked.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use ciborium::Value;
use e2e_tests::client::Client;
use e2e_tests::cloud::pki;
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::node::TestNode;
use rumqttc::QoS;
use shared::proto::io::{read_frame, read_frame_body};
use shared::proto::{Control, DOWNLINK_VERSION, MAX_BATCH_FRAME, MAX_BATCH_RAW, MAX_CONTROL_FRAME};
use shared::proto::{batch_frame, codec, compress};

use super::bridge_versions::{WAIT, frame, newer, unknown_control};

/// What a bridge of another version received and acked.
#[derive(Debug, Default)]
struct Received {
    hello_versions: Vec<u16>,
    version: u16,
    records: BTreeMap<(u8, u64), String>,
    /// Records received, resends included.
    arrivals: usize,
    /// Ids of the dictionaries the edge announced, as it named them.
    dict_ids: Vec<String>,
    /// Batches that named a dictionary.
    dict_batches: usize,
    /// Batches in the binary framing (version 4 on).
    binary_batches: usize,
    /// Column-wise batches (version 6 on).
    column_batches: usize,
    /// Column-wise bodies in format 2 (version 7).
    format2_batches: usize,
    /// Column-wise bodies in format 3 (version 8 on).
    format3_batches: usize,
    /// Batches with the compact head (version 7 on).
    compact_batches: usize,
    /// The downlink window the edge's hello announced (version 9).
    down_window: Option<shared::proto::down::EdgeWindow>,
    /// Downlink messages this bridge sent at once, and how far the edge acked them.
    downs_sent: u64,
    down_acked: u64,
}

/// A bridge that speaks `versions`, welcomes with a field this build does not know, sends an
/// unknown control frame after the welcome and after each ack, adds a field to each ack and
/// pong, stores the dictionaries announced under the ids of the version chosen (refusing any
/// other), and acks every batch it reads. On a session with the downlink it sends 20 messages
/// of 600 bytes at once, as a bridge whose window is 20 would; from version 9 no more than the
/// edge's hello announced.
async fn other_version_bridge(
    endpoint: quinn::Endpoint,
    received: std::sync::Arc<std::sync::Mutex<Received>>,
    versions: &[u16],
) -> anyhow::Result<()> {
    let conn = endpoint.accept().await.ok_or_else(|| anyhow::anyhow!("endpoint closed"))?.await?;
    let (mut send, mut recv) = conn.accept_bi().await?;
    let hello: Control = read_frame(&mut recv, MAX_CONTROL_FRAME).await?.ok_or_else(|| anyhow::anyhow!("no hello"))?;
    let Control::Hello(hello) = hello else { anyhow::bail!("{hello:?} instead of a hello") };
    let version = shared::proto::negotiate(versions, &hello.versions).ok_or_else(|| anyhow::anyhow!("no version"))?;
    {
        let mut got = received.lock().unwrap();
        got.hello_versions = hello.versions.clone();
        got.version = version;
        got.down_window = hello.down_window;
    }
    // From version 3 the Welcome says what the sink stores of one record: here 4 KiB.
    let sink = (version >= 3).then_some(shared::proto::SinkLimits { record_bytes: 4096, header_bytes: 2048 });
    let welcome = shared::proto::Welcome { version, committed: vec![], dicts: vec![], sink };
    let welcome = newer(&Control::Welcome(welcome), &[("max_batch", Value::Integer(1000.into()))]);
    send.write_all(&frame(&welcome)).await?;
    send.write_all(&unknown_control("throttle")).await?;
    if version >= DOWNLINK_VERSION {
        let announced = hello.down_window.filter(|_| version >= shared::proto::DOWN_WINDOW_VERSION);
        let n = announced.map_or(20, |w| w.messages.min(20));
        for seq in 1..=n {
            let down = shared::proto::down::Down {
                seq,
                topic: "config/d".into(),
                payload: vec![b'd'; 600],
                qos: 1,
                ..Default::default()
            };
            send.write_all(&codec::encode(&Control::Down(Box::new(down)))?).await?;
        }
        received.lock().unwrap().downs_sent = n;
    }

    let dicts = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let (acks_tx, mut acks) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let reader = {
        let acks_tx = acks_tx.clone();
        let (received, dicts) = (received.clone(), dicts.clone());
        let conn = conn.clone();
        tokio::spawn(async move {
            while let Ok(mut uni) = conn.accept_uni().await {
                let body = read_frame_body(&mut uni, MAX_BATCH_FRAME).await?.ok_or_else(|| anyhow::anyhow!("empty"))?;
                let binary = batch_frame::decode_head(&body)?.is_some();
                let compact = body.first() == Some(&batch_frame::COMPACT_BATCH);
                let batch = batch_frame::decode(&body)?;
                let records = compress::unpack(&batch, &dicts.lock().unwrap(), MAX_BATCH_RAW)?;
                let raw = compress::decompress(
                    &batch,
                    batch.dict.as_ref().and_then(|d| dicts.lock().unwrap().get(d).cloned()).as_deref(),
                    MAX_BATCH_RAW,
                )?;
                let format = batch.codec.columns().then(|| raw.as_deref().unwrap_or(&batch.body).first().copied());
                let (format2, format3) = (format == Some(Some(2)), format == Some(Some(3)));
                let mut got = received.lock().unwrap();
                got.dict_batches += usize::from(batch.dict.is_some());
                got.binary_batches += usize::from(binary);
                got.compact_batches += usize::from(compact);
                got.column_batches += usize::from(batch.codec.columns());
                got.format2_batches += usize::from(format2);
                got.format3_batches += usize::from(format3);
                for r in records {
                    let topic = r.as_message().map_or_else(|| "gap".to_owned(), |m| m.topic.clone());
                    got.records.insert((batch.lane.0, r.seq.0), topic);
                    got.arrivals += 1;
                }
                let ack = shared::proto::Ack { lane: batch.lane, up_to: batch.last_seq };
                let _ = acks_tx.send(frame(&newer(&Control::Ack(ack), &[("stored_in", Value::Text("js".into()))])));
                let _ = acks_tx.send(unknown_control("lane_lag"));
            }
            anyhow::Ok(())
        })
    };
    let mut control = shared::proto::io::spawn_reader::<_, Control>(recv, MAX_CONTROL_FRAME);
    loop {
        tokio::select! {
            out = acks.recv() => send.write_all(&out.expect("sender kept")).await?,
            frame_in = control.0.recv() => match frame_in.map(|f| *f) {
                Some(Ok(Some(Control::Ping { nonce }))) => {
                    let pong = newer(&Control::Pong { nonce }, &[("load", Value::Integer(3.into()))]);
                    send.write_all(&frame(&pong)).await?;
                }
                Some(Ok(Some(Control::Dict(d)))) => {
                    anyhow::ensure!(compress::dict_id_for(version, &d.bytes) == d.id, "dictionary {} is misnamed", d.id);
                    received.lock().unwrap().dict_ids.push(d.id.clone());
                    dicts.lock().unwrap().insert(d.id.clone(), d.bytes);
                    send.write_all(&codec::encode(&Control::DictStored { id: d.id })?).await?;
                }
                Some(Ok(Some(Control::DownAck(ack)))) => {
                    let mut got = received.lock().unwrap();
                    got.down_acked = got.down_acked.max(ack.up_to);
                }
                Some(Ok(Some(_))) => {}
                Some(Err(e)) => anyhow::bail!("control stream: {e}"),
                Some(Ok(None)) | None => break,
            },
        }
    }
    reader.abort();
    Ok(())
}

/// A real edge drains 200 messages and more into a bridge speaking `versions`, with
/// dictionaries; what that bridge received, and the PUBACK reason code of an MQTT 5 publish
/// of 5,000 bytes the bridge's sink (version 3: 4 KiB) could not store.
async fn drain_into_a_bridge_speaking(versions: &'static [u16]) -> (Received, u8) {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let server = cloud_bridge::config::ServerConfig {
        bind: SocketAddr::from(([127, 0, 0, 1], 0)),
        cert: keys.server_cert.clone(),
        key: keys.server_key.clone(),
        client_ca: keys.ca.clone(),
        deny_serials: vec![],
        max_held: 64,
        congestion: Default::default(),
        socket_buffer: shared::units::ByteSize(1 << 20),
    };
    let endpoint =
        cloud_bridge::server::endpoint(&server, |t| cloud_bridge::limits::LimitsConfig::default().apply(t)).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let received = std::sync::Arc::new(std::sync::Mutex::new(Received::default()));
    let bridge = tokio::spawn(other_version_bridge(endpoint, received.clone(), versions));

    let (_, cert, key) = keys.edges.iter().find(|(id, _, _)| id == "edge-1").unwrap().clone();
    let uplink = format!(
        "[uplink]\nserver = \"{addr}\"\nserver_name = \"localhost\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
         keepalive = \"300ms\"\nlinger = \"20ms\"\ndict_size = \"1KiB\"\ndict_samples = \"4KiB\"\n\
         down_window_messages = 4\n",
        keys.ca.display(),
        cert.display(),
        key.display()
    );
    let classes = with_spool(&[telemetry()]);
    let edge = TestNode::start(&format!("{classes}\n{uplink}")).await;
    let publisher = Client::anonymous(edge.local(), "pub").await;
    let payload = |i: u32| format!(r#"{{"camera":"cam-{}","temp_c":{}.{},"status":"ok"}}"#, i % 7, 40 + i % 13, i % 10);
    let mut sent = 0;
    for i in 0..200 {
        publisher.publish(&format!("telemetry/up/{i}"), QoS::AtLeastOnce, false, payload(i)).await;
        sent += 1;
    }
    // Until a batch went out compressed with a dictionary the bridge stored.
    let deadline = tokio::time::Instant::now() + WAIT;
    while received.lock().unwrap().dict_batches == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no dictionary used: {}", edge.metrics());
        for i in sent..sent + 30 {
            publisher.publish(&format!("telemetry/up/{i}"), QoS::AtLeastOnce, false, payload(i)).await;
        }
        sent += 30;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let telemetry = |r: &Received| r.records.values().filter(|t| t.starts_with("telemetry/up/")).count();
    let all = e2e_tests::eventually(WAIT, || telemetry(&received.lock().unwrap()) == sent as usize).await;
    assert!(all, "{:?}\n{}", received.lock().unwrap(), edge.metrics());
    // Every lane acked up to what the bridge holds, and the spool kept nothing of it.
    let drained = e2e_tests::eventually(WAIT, || {
        let got = received.lock().unwrap();
        let mut last: BTreeMap<u8, u64> = BTreeMap::new();
        for &(lane, seq) in got.records.keys() {
            last.insert(lane, seq);
        }
        last.iter().all(|(lane, seq)| edge.metric(&format!("edge_uplink_acked_seq{{lane=\"{lane}\"}}")) == *seq as f64)
            && edge.metric("edge_spool_class_records{class=\"telemetry\"}") == 0.0
    })
    .await;
    assert!(drained, "{:?}\n{}", received.lock().unwrap(), edge.metrics());
    {
        let got = received.lock().unwrap();
        assert!(got.hello_versions.contains(&1), "{:?}", got.hello_versions);
        assert_eq!(got.arrivals, got.records.len(), "no record sent twice over one session");
    }
    // A ping answered by the newer pong (it set the RTT), unknown frames ignored: one session,
    // never cut.
    let ponged = e2e_tests::eventually(WAIT, || edge.metric("edge_uplink_rtt_seconds") > 0.0).await;
    assert!(ponged, "no pong accepted: {}", edge.metrics());
    // Every downlink message the bridge sent at once taken and acked, within one session.
    let downs = e2e_tests::eventually(WAIT, || {
        let got = received.lock().unwrap();
        got.down_acked == got.downs_sent
    })
    .await;
    assert!(downs, "{:?}\n{}", received.lock().unwrap(), edge.metrics());
    assert_eq!(edge.metric("edge_uplink_connected"), 1.0, "{}", edge.metrics());
    assert_eq!(edge.metric("edge_uplink_reconnects_total"), 0.0, "{}", edge.metrics());
    let mut raw = e2e_tests::raw::RawClient::connect(edge.local()).await.unwrap();
    raw.send(&e2e_tests::raw::connect_v5("big", true, &[])).await.unwrap();
    raw.until(2, WAIT).await.expect("CONNACK");
    raw.send(&e2e_tests::raw::publish_v5(b"telemetry/big", 1, 7, false, &[], &[b'x'; 5000])).await.unwrap();
    let puback = raw.until(4, WAIT).await.expect("PUBACK");
    let code = puback.get(4).copied().unwrap_or(0);
    assert!(!bridge.is_finished(), "{:?}", bridge.await);
    (std::mem::take(&mut *received.lock().unwrap()), code)
}

/// The next version's bridge (this edge speaks up to 9) says its sink stores 4 KiB a record:
/// the edge sends column-wise batches in format 3, and refuses a larger publish with 0x83
/// rather than acknowledge what the sink would not take. Its hello announces the 4 downlink
/// messages it is configured to hold, and the bridge sends no more at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_edge_drains_into_a_bridge_of_the_next_version() {
    let (got, big) = drain_into_a_bridge_speaking(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).await;
    assert_eq!(got.version, 9, "the highest version both speak");
    let window = got.down_window.expect("announced");
    assert_eq!((window.messages, window.bytes), (4, 4 << 20));
    assert_eq!(got.downs_sent, 4);
    assert!(got.binary_batches > 0, "version 4 batches go in the binary framing");
    assert!(got.format3_batches > 0 && got.format2_batches == 0, "version 8 batches go column-wise in format 3");
    assert!(got.compact_batches > 0 && got.compact_batches == got.binary_batches, "version 7 heads are compact");
    assert!(!got.dict_ids.is_empty() && got.dict_ids.iter().all(|id| id.len() == 64), "{:?}", got.dict_ids);
    assert_eq!(big, 0x83, "refused: the sink could not store it whole");
}

/// A bridge of the previous version (8), which knows no announced window: it sends 20 downlink
/// messages at once, and this edge, configured to hold 4, takes them all in one session, as
/// every edge before version 9 held 256. Format 3 batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_edge_drains_into_a_bridge_of_the_previous_version() {
    let (got, big) = drain_into_a_bridge_speaking(&[1, 2, 3, 4, 5, 6, 7, 8]).await;
    assert_eq!(got.version, 8);
    assert_eq!(got.downs_sent, 20);
    assert!(got.format3_batches > 0, "version 8 batches go column-wise in format 3");
    assert_eq!(big, 0x83, "refused: the sink could not store it whole");
}

/// A bridge of version 7: format 2, compact heads, no format 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_edge_drains_into_a_bridge_of_version_7() {
    let (got, big) = drain_into_a_bridge_speaking(&[1, 2, 3, 4, 5, 6, 7]).await;
    assert_eq!(got.version, 7);
    assert!(got.format2_batches > 0 && got.format3_batches == 0, "version 7 batches go in format 2");
    assert!(got.compact_batches > 0 && got.compact_batches == got.binary_batches, "version 7 heads are compact");
    assert!(!got.dict_ids.is_empty() && got.dict_ids.iter().all(|id| id.len() == 64), "{:?}", got.dict_ids);
    assert_eq!(big, 0x83, "refused: the sink could not store it whole");
}

/// A bridge of version 6: column-wise batches, in format 1 only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_edge_drains_into_a_bridge_of_version_6() {
    let (got, big) = drain_into_a_bridge_speaking(&[1, 2, 3, 4, 5, 6]).await;
    assert_eq!(got.version, 6);
    assert!(got.column_batches > 0, "version 6 batches go column-wise");
    assert_eq!(got.format2_batches + got.format3_batches, 0, "formats 2 and 3 only from versions 7 and 8");
    assert_eq!(got.compact_batches, 0, "the compact head only from version 7");
    assert!(!got.dict_ids.is_empty() && got.dict_ids.iter().all(|id| id.len() == 64), "{:?}", got.dict_ids);
    assert_eq!(big, 0x83, "refused: the sink could not store it whole");
}

/// A bridge of version 5: row batches only, in the binary framing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_edge_drains_into_a_bridge_of_version_5() {
    let (got, big) = drain_into_a_bridge_speaking(&[1, 2, 3, 4, 5]).await;
    assert_eq!(got.version, 5);
    assert_eq!(got.column_batches, 0, "no column-wise batch before version 6");
    assert!(got.binary_batches > 0, "version 4 batches go in the binary framing");
    assert_eq!(big, 0x83, "refused: the sink could not store it whole");
}

/// A bridge of version 4 (no downlink): batches in the binary framing, and its sink's 4 KiB
/// limit honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_edge_drains_into_a_bridge_of_version_4() {
    let (got, big) = drain_into_a_bridge_speaking(&[1, 2, 3, 4]).await;
    assert_eq!(got.version, 4);
    assert!(got.binary_batches > 0, "version 4 batches go in the binary framing");
    assert_eq!(big, 0x83, "refused: the sink could not store it whole");
}

/// A bridge of version 3: batches in the CBOR envelope, and its sink's 4 KiB limit honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_edge_drains_into_a_bridge_of_version_3() {
    let (got, big) = drain_into_a_bridge_speaking(&[1, 2, 3]).await;
    assert_eq!(got.version, 3);
    assert_eq!(got.binary_batches, 0, "no binary framing before version 4");
    assert_eq!(big, 0x83, "refused: the sink could not store it whole");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_edge_drains_into_a_bridge_of_version_2() {
    let (got, big) = drain_into_a_bridge_speaking(&[1, 2]).await;
    assert_eq!(got.version, 2);
    assert!(!got.dict_ids.is_empty() && got.dict_ids.iter().all(|id| id.len() == 64), "{:?}", got.dict_ids);
    assert_eq!(big, 0, "a version 2 bridge says nothing of its sink: taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_edge_drains_into_a_bridge_of_the_first_version() {
    let (got, big) = drain_into_a_bridge_speaking(&[1]).await;
    assert_eq!(got.version, 1);
    assert!(!got.dict_ids.is_empty() && got.dict_ids.iter().all(|id| id.len() == 16), "{:?}", got.dict_ids);
    assert_eq!(big, 0);
}
