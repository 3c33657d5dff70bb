//! The downlink's storage on a real nats-server with JetStream, where it meets what else
//! writes the `DOWN` stream and its bucket (issue 43): an operator deleting and making the
//! stream again, a bucket that lost an edge's position, and any NATS client that can publish
//! to `down.>`. Driven through the sink's own calls (`DownlinkStore`), as the bridge's sessions
//! and `cloud-bridge send` make them.

use std::time::Duration;

use async_nats::jetstream;
use cloud_bridge::sink::DownlinkStore;
use cloud_bridge::sink::downlink::{DoneCounts, DownBounds, DownDone, Outgoing, Pending, ReadLimit};
use cloud_bridge::sink::jetstream::{BatchPublish, JetStreamSink};
use e2e_tests::nats::{NatsServer, sink_settings};
use shared::proto::down::DownRefusal;

const BOUNDS: DownBounds = DownBounds { messages: 1000, bytes: 1 << 20 };

fn msg(topic: &str, payload: &str) -> Outgoing {
    Outgoing { topic: topic.into(), payload: payload.as_bytes().to_vec(), qos: 1, ..Default::default() }
}

async fn sink(nats: &NatsServer) -> JetStreamSink {
    JetStreamSink::connect(&sink_settings(nats.url(), BatchPublish::Fast)).await.unwrap()
}

/// What an edge's ack through `up_to` records, `refused` among it.
fn acked(up_to: u64, refused: Vec<DownRefusal>) -> DownDone {
    DownDone { up_to, refused, expired: vec![], counts: DoneCounts::default() }
}

fn seqs_and_payloads(read: &[Pending]) -> Vec<(u64, String)> {
    read.iter().map(|p| (p.seq, String::from_utf8_lossy(&p.msg.payload).into_owned())).collect()
}

/// A publisher other than `send`: a NATS client writing the stream directly.
async fn publish_directly(url: &str, subject: &str, payload: &'static str) {
    let js = jetstream::new(async_nats::connect(url).await.unwrap());
    js.publish(subject.to_owned(), payload.into()).await.unwrap().await.unwrap();
}

/// A `DOWN` stream deleted and made again starts its sequence over; the edges' positions in
/// the bucket do not. Its first messages had seqs the edges already held: taken as delivered,
/// never read, and purged by the next ack (and an edge's refusal of an old seq set aside a new
/// message of the same sequence). Now every message of the new stream, sent or published
/// directly, comes after what each edge holds, once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_stream_made_anew_hands_out_seqs_past_what_each_edge_holds() {
    let nats = NatsServer::start();
    let first = sink(&nats).await;
    for i in 0..3 {
        first.enqueue("edge-1", &msg("cmd/a", &format!("old {i}")), BOUNDS).await.unwrap();
    }
    let read = first.down_read("edge-1", 0, ReadLimit::messages(16)).await.unwrap();
    let held = read.last().unwrap().seq;
    first.down_record("edge-1", &acked(held, vec![])).await.unwrap();
    // edge-2 was sent one message and has not acked it when the stream goes.
    first.enqueue("edge-2", &msg("cmd/b", "old"), BOUNDS).await.unwrap();
    let edge2_held = first.down_read("edge-2", 0, ReadLimit::messages(16)).await.unwrap()[0].seq;

    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    js.delete_stream("DOWN").await.unwrap();
    // A bridge starting makes it again; a NATS client and `send` write to it.
    let again = sink(&nats).await;
    publish_directly(&nats.url(), "down.edge-1.cmd.a", "direct").await;
    again.enqueue("edge-1", &msg("cmd/a", "sent"), BOUNDS).await.unwrap();
    again.enqueue("edge-2", &msg("cmd/b", "new"), BOUNDS).await.unwrap();

    // An ack that comes before the session reads again, naming an old seq as refused: the new
    // stream's message of that sequence is not the one refused, and is neither set aside nor
    // purged.
    again.down_record("edge-1", &acked(held, vec![DownRefusal { seq: 1, reason: "old".into() }])).await.unwrap();
    assert_eq!(again.down_dead_letters(Some("edge-1"), 10).await.unwrap(), vec![]);

    let read = again.down_read("edge-1", held, ReadLimit::messages(16)).await.unwrap();
    assert_eq!(seqs_and_payloads(&read), [(held + 1, "direct".to_owned()), (held + 2, "sent".to_owned())]);
    again.down_record("edge-1", &acked(held + 2, vec![])).await.unwrap();
    assert!(again.down_read("edge-1", held + 2, ReadLimit::messages(16)).await.unwrap().is_empty());
    assert_eq!(again.down_backlog("edge-1").await.unwrap().messages, 0);

    // edge-2's session sent up to `edge2_held` (the message lost with the old stream): the
    // new one comes after it, though the bucket's position is 0.
    // (Seqs increase with the stream's sequence, other edges' messages between.)
    let read = again.down_read("edge-2", edge2_held, ReadLimit::messages(16)).await.unwrap();
    assert_eq!((read.len(), read[0].msg.payload.as_slice()), (1, &b"new"[..]));
    assert!(read[0].seq > edge2_held, "{} after {edge2_held}", read[0].seq);

    // The first bridge, still running, counts the same way.
    let later = first.enqueue("edge-1", &msg("cmd/a", "later"), BOUNDS).await.unwrap();
    let read = first.down_read("edge-1", held + 2, ReadLimit::messages(16)).await.unwrap();
    assert_eq!((read.len(), read[0].msg.payload.as_slice()), (1, &b"later"[..]));
    assert_eq!(later, cloud_bridge::sink::downlink::Enqueued::Stored { seq: read[0].seq });
}

/// An edge whose position the bucket lost restores it with its hello (the session records the
/// edge's mark first); the stream's sequence is far below it. The SQLite sink's counter goes
/// past a restored position; on JetStream the next message, however published, comes after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_position_past_the_stream_has_the_next_message_after_it() {
    let nats = NatsServer::start();
    let sink = sink(&nats).await;
    sink.enqueue("edge-1", &msg("cmd/a", "other"), BOUNDS).await.unwrap();
    sink.down_record("edge-3", &acked(1000, vec![])).await.unwrap();
    assert_eq!(sink.down_state("edge-3").await.unwrap().position, 1000);
    publish_directly(&nats.url(), "down.edge-3.cmd.x", "direct").await;
    sink.enqueue("edge-3", &msg("cmd/x", "sent"), BOUNDS).await.unwrap();
    let read = sink.down_read("edge-3", 1000, ReadLimit::messages(16)).await.unwrap();
    assert_eq!(seqs_and_payloads(&read), [(1001, "direct".to_owned()), (1002, "sent".to_owned())]);
    assert_eq!(sink.down_backlog("edge-3").await.unwrap().messages, 2);
    // Another edge's seqs are its own.
    assert_eq!(
        seqs_and_payloads(&sink.down_read("edge-1", 0, ReadLimit::messages(16)).await.unwrap()),
        [(1, "other".to_owned())]
    );
}

/// Writes `ops` to nats-server as a plain client would: bytes async-nats will not send (a
/// subject or header that is not UTF-8), which nats-server stores as they are.
async fn publish_raw(port: u16, ops: &[u8]) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut conn = BufReader::new(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    let mut line = String::new();
    conn.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("INFO "), "{line}");
    let mut out = b"CONNECT {\"verbose\":false,\"headers\":true,\"protocol\":1}\r\n".to_vec();
    out.extend_from_slice(ops);
    out.extend_from_slice(b"PING\r\n");
    conn.get_mut().write_all(&out).await.unwrap();
    loop {
        line.clear();
        assert!(conn.read_line(&mut line).await.unwrap() > 0, "nats-server closed the connection");
        assert!(!line.starts_with("-ERR"), "{line}");
        if line.starts_with("PONG") {
            return;
        }
    }
}

/// An HPUB of `payload` on `subject` with the header block `headers` (without its end).
fn hpub(subject: &[u8], headers: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut block = b"NATS/1.0\r\n".to_vec();
    block.extend_from_slice(headers);
    block.extend_from_slice(b"\r\n");
    let mut op = b"HPUB ".to_vec();
    op.extend_from_slice(subject);
    op.extend_from_slice(format!(" {} {}\r\n", block.len(), block.len() + payload.len()).as_bytes());
    op.extend_from_slice(&block);
    op.extend_from_slice(payload);
    op.extend_from_slice(b"\r\n");
    op
}

/// Any NATS client can write `down.>`, and nats-server keeps a subject's or a header's bytes
/// as they came. async-nats drops its whole connection at a message whose subject or headers
/// are not UTF-8: one raw publish knocked every bridge's connection over each time it was read
/// (its news, its reads), and every sink request on it, uplink included, timed out, until the
/// message was delivered on a rewritten topic. Now such a message is read through the JSON
/// API, set aside with the reason, and nothing else notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_or_header_that_is_not_utf8_is_set_aside_and_knocks_nothing_over() {
    let nats = NatsServer::start();
    let sink = sink(&nats).await;
    let (mut cursor, _) = sink.down_news(None, Duration::ZERO).await.unwrap();
    let mut ops = b"PUB down.edge-1.cmd.bad\xff\xfe 2\r\nhi\r\n".to_vec();
    ops.extend(hpub(b"down.edge-1.cmd.header", b"Mqtt-Qos: 1\r\nZone: \xff\r\n", b"hi"));
    ops.extend(hpub(b"down.edge-1.cmd.folded", b"bad header line\r\n", b"hi"));
    // A publisher allowed `down.edge-1.status.>` only, naming another topic in a header.
    ops.extend(hpub(b"down.edge-1.status.x", b"Mqtt-Topic: cmd/reboot\r\n", b"hi"));
    publish_raw(nats.port, &ops).await;
    sink.enqueue("edge-1", &msg("cmd/good", "ok"), BOUNDS).await.unwrap();

    let news = async {
        loop {
            let (next, edges) = sink.down_news(Some(cursor), Duration::from_secs(1)).await.unwrap();
            cursor = next;
            if edges.iter().any(|e| e == "edge-1") {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), news).await.expect("news of edge-1's messages");
    let read = tokio::time::timeout(Duration::from_secs(5), sink.down_read("edge-1", 0, ReadLimit::messages(16)))
        .await
        .expect("a read in time")
        .expect("a read");
    let outcome: Vec<_> = read.iter().map(|p| (p.msg.topic.clone(), p.invalid.clone())).collect();
    assert_eq!(read.len(), 5, "{outcome:?}");
    let reason = |i: usize| read[i].invalid.clone().unwrap_or_else(|| panic!("message {i} not set aside: {outcome:?}"));
    assert!(reason(0).contains("subject") && reason(0).contains("UTF-8"), "{}", reason(0));
    assert!(reason(1).contains("headers") && reason(1).contains("UTF-8"), "{}", reason(1));
    assert!(reason(2).contains("headers"), "{}", reason(2));
    assert!(reason(3).contains("Mqtt-Topic") && read[3].msg.topic == "status/x", "{}", reason(3));
    assert_eq!((read[4].msg.topic.as_str(), read[4].invalid.as_deref()), ("cmd/good", None));
    // Set aside, they are dead letters; the edge's status and backlog read as before.
    for p in &read[..4] {
        sink.down_set_aside("edge-1", p.seq, "invalid", p.invalid.as_deref().unwrap()).await.unwrap();
    }
    assert_eq!(sink.down_dead_letters(Some("edge-1"), 10).await.unwrap().len(), 4);
    assert_eq!(sink.down_backlog("edge-1").await.unwrap().messages, 5);
    assert_eq!(sink.connects(), 1, "the sink's connection to nats-server was dropped");
}

/// The news a bridge wakes its sessions with goes on through a nats-server restart: a message
/// stored once the server is back wakes the edge's session at once (the first one after a
/// server or bridge kill used to wait for the session's `downlink.poll`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn news_of_a_message_reaches_the_session_after_a_nats_server_restart() {
    use cloud_bridge::downlink::{Downlink, DownlinkConfig, DownlinkMetrics};
    use std::sync::Arc;

    let mut nats = NatsServer::start();
    let sink = Arc::new(sink(&nats).await);
    let downlink = Arc::new(Downlink::new(DownlinkConfig::default(), Arc::new(DownlinkMetrics::default())));
    let stop = tokio_util::sync::CancellationToken::new();
    let _watch = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(downlink.clone().watch(sink.clone(), stop)));
    let session = downlink.register("edge-1");
    tokio::time::sleep(Duration::from_millis(500)).await;
    sink.enqueue("edge-1", &msg("cmd/a", "before"), BOUNDS).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), session.wake.notified()).await.expect("news before the restart");

    nats.restart();
    let back = async {
        while sink.enqueue("edge-2", &msg("cmd/a", "other"), BOUNDS).await.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), back).await.expect("the sink back after the restart");
    // Back, the watch wakes every session once (a crashed server may have given lost
    // messages' sequences to new ones); that wake is not the one looked for.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _ = tokio::time::timeout(Duration::from_millis(10), session.wake.notified()).await;
    sink.enqueue("edge-1", &msg("cmd/a", "after"), BOUNDS).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), session.wake.notified())
        .await
        .expect("news of the first message after the restart, before the session's own poll");
}

/// News goes on past what the edge acked: each ack purges the edge's messages up to it, and
/// the watch (on the bridge's own connection, as `send` runs elsewhere) hears of each next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn news_of_each_message_reaches_the_session_after_acks_purged_the_ones_before() {
    use cloud_bridge::downlink::{Downlink, DownlinkConfig, DownlinkMetrics};
    use std::sync::Arc;

    let nats = NatsServer::start();
    let sink = Arc::new(sink(&nats).await);
    let downlink = Arc::new(Downlink::new(DownlinkConfig::default(), Arc::new(DownlinkMetrics::default())));
    let stop = tokio_util::sync::CancellationToken::new();
    // The bridge's own connection, as `send` runs in another process.
    let bridge = Arc::new(JetStreamSink::connect(&sink_settings(nats.url(), BatchPublish::Auto)).await.unwrap());
    let _watch = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(downlink.clone().watch(bridge, stop)));
    let session = downlink.register("edge-1");
    // The watch hears of what is stored after it took its cursor: stored until it hears.
    let started = async {
        loop {
            sink.enqueue("edge-1", &msg("cmd/a", "first"), BOUNDS).await.unwrap();
            if tokio::time::timeout(Duration::from_millis(200), session.wake.notified()).await.is_ok() {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), started).await.expect("the watch hears of a message");
    let mut position = sink.down_read("edge-1", 0, ReadLimit::messages(1000)).await.unwrap().last().unwrap().seq;
    sink.down_record("edge-1", &acked(position, vec![])).await.unwrap();
    for n in 0..3 {
        sink.enqueue("edge-1", &msg("cmd/a", "x"), BOUNDS).await.unwrap();
        tokio::time::timeout(Duration::from_secs(2), session.wake.notified())
            .await
            .unwrap_or_else(|_| panic!("news of message {n}"));
        let read = sink.down_read("edge-1", position, ReadLimit::messages(16)).await.unwrap();
        position = read.last().unwrap().seq;
        sink.down_record("edge-1", &acked(position, vec![])).await.unwrap();
    }
}

/// A read takes several gets at once (the JSON API gets one message each), guessing the next
/// sequences: an edge's messages are read whole and in order whether they lie together or
/// between another edge's, and while more are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_find_every_message_of_an_edge_in_order_among_another_edges() {
    let nats = NatsServer::start();
    let sink = std::sync::Arc::new(sink(&nats).await);
    let mut want = Vec::new();
    for i in 0..60 {
        sink.enqueue("edge-1", &msg("cmd/a", &format!("a{i}")), BOUNDS).await.unwrap();
        want.push(format!("a{i}"));
        if i % 3 == 0 {
            sink.enqueue("edge-2", &msg("cmd/b", "other"), BOUNDS).await.unwrap();
        }
    }
    // More stored while the edge reads.
    let more = {
        let sink = sink.clone();
        tokio::spawn(async move {
            for i in 60..120 {
                sink.enqueue("edge-1", &msg("cmd/a", &format!("a{i}")), BOUNDS).await.unwrap();
                sink.enqueue("edge-2", &msg("cmd/b", "other"), BOUNDS).await.unwrap();
            }
        })
    };
    want.extend((60..120).map(|i| format!("a{i}")));
    let mut got = Vec::new();
    let mut after = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got.len() < want.len() {
        assert!(tokio::time::Instant::now() < deadline, "{} of {}", got.len(), want.len());
        let read = sink.down_read("edge-1", after, ReadLimit::messages(16)).await.unwrap();
        assert!(read.windows(2).all(|w| w[0].seq < w[1].seq));
        if let Some(last) = read.last() {
            after = last.seq;
        }
        got.extend(read.into_iter().map(|p| String::from_utf8_lossy(&p.msg.payload).into_owned()));
    }
    more.await.unwrap();
    assert_eq!(got, want);
}

/// Any NATS client can publish to `down.<anything>`: the fleet view and the summary behind the
/// backlog gauges listed every edge id a publisher made up (each with a read of its oldest
/// message, every `summary_interval`). Now they list the edges the downlink knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_publisher_cannot_add_edges_to_the_downlink_summary() {
    let nats = NatsServer::start();
    let sink = sink(&nats).await;
    sink.enqueue("edge-1", &msg("cmd/a", "x"), BOUNDS).await.unwrap();
    let mut ops = Vec::new();
    for i in 0..200 {
        ops.extend(format!("PUB down.ghost-{i}.cmd 1\r\nx\r\n").into_bytes());
    }
    publish_raw(nats.port, &ops).await;
    let summary = sink.down_summary().await.unwrap();
    let edges: Vec<_> = summary.iter().map(|s| (s.edge.as_str(), s.waiting)).collect();
    assert_eq!(edges, [("edge-1", 1)]);
}

/// One message's bounds are the downlink's, the same on every sink: a 2 MiB message was
/// delivered on SQLite and failed on JetStream (nats-server's default 1 MiB `max_payload`) with
/// a NATS error; a 65,000-byte topic was stored on SQLite and refused by the edge, and "timed
/// out" on JetStream (its subject passed nats-server's protocol line). Now `send` refuses both
/// on both, naming the key, a message at the bound is stored on both, and a bridge whose
/// `max_message_bytes` its sink cannot hold does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_is_bounded_alike_on_every_sink_and_a_bound_the_sink_cannot_hold_stops_the_start() {
    use cloud_bridge::downlink::DownlinkConfig;
    use cloud_bridge::downlink::send::{SendError, send};
    use shared::units::ByteSize;

    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = cloud_bridge::sink::sqlite::SqliteSink::open(&dir.path().join("central.db")).unwrap();
    let js = sink(&nats).await;
    let config = DownlinkConfig::default();
    let edge = ["edge-1".to_owned()];
    let big = Outgoing { payload: vec![b'x'; 2 << 20], ..msg("cmd/a", "") };
    let long = msg(&"a".repeat(65_000), "x");
    let at_bound = Outgoing { payload: vec![b'x'; (1000 << 10) - 5], ..msg("cmd/a", "") };
    assert_eq!(at_bound.bytes(), 1000 << 10);
    let refused = |r: Result<_, SendError>| match r {
        Err(SendError::Invalid(why)) => why,
        other => panic!("not refused: {other:?}"),
    };
    for why in [refused(send(&sqlite, &config, &edge, &big).await), refused(send(&js, &config, &edge, &big).await)] {
        assert!(why.contains("more than downlink.max_message_bytes (1000"), "{why}");
    }
    for why in [refused(send(&sqlite, &config, &edge, &long).await), refused(send(&js, &config, &edge, &long).await)] {
        assert!(why.contains("more than downlink.max_topic_bytes (1024)"), "{why}");
    }
    for stored in [send(&sqlite, &config, &edge, &at_bound).await, send(&js, &config, &edge, &at_bound).await] {
        assert!(matches!(stored.unwrap()[0].1, cloud_bridge::sink::downlink::Enqueued::Stored { .. }));
    }

    let wide = DownlinkConfig { max_message_bytes: ByteSize::mib(4), ..Default::default() };
    assert_eq!(wide.fits(sqlite.down_limit()), Ok(()));
    let why = wide.fits(js.down_limit()).unwrap_err();
    assert!(why.contains("nats-server's max_payload") && why.contains("downlink.max_message_bytes (4.0 MiB)"), "{why}");
    let keys = e2e_tests::cloud::pki(dir.path(), &[]);
    let text = format!(
        "[server]\nbind = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
         [sink]\nkind = \"jetstream\"\nurl = \"{}\"\n[downlink]\nmax_message_bytes = \"4MiB\"\n",
        keys.server_cert.display(),
        keys.server_key.display(),
        keys.ca.display(),
        nats.url()
    );
    std::fs::write(dir.path().join("cloud.toml"), text).unwrap();
    let config = cloud_bridge::config::CloudConfig::load(&dir.path().join("cloud.toml")).unwrap();
    let e = cloud_bridge::Bridge::start(config).await.expect_err("a bound the sink cannot hold");
    assert!(e.to_string().contains("max_payload"), "{e}");
}

/// A read stops at its byte budget as well as at its count, on SQLite and on JetStream: a
/// session's read was bounded by count alone, so with messages as large as the cluster allows
/// (any NATS client can write them) a bridge held up to a window's count of them per edge
/// between its read and the window, 256 MiB and more. Now it holds at most the window's bytes
/// and one message more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_stops_at_its_byte_budget_on_every_sink() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = cloud_bridge::sink::sqlite::SqliteSink::open(&dir.path().join("central.db")).unwrap();
    e2e_tests::cloud::check_reads_stop_at_their_byte_budget(&sqlite, "edge-1").await;
    let js = sink(&nats).await;
    // Another edge's message first: edge-1's seqs are not the stream's counted from 1.
    js.enqueue("edge-2", &msg("cmd/a", "other"), BOUNDS).await.unwrap();
    e2e_tests::cloud::check_reads_stop_at_their_byte_budget(&js, "edge-1").await;
}

/// Sends racing for an edge's last room: the bound was checked and the message stored in two
/// steps, and 10,002 were stored for a bound of 10,000. Now the publish is stored only if no
/// other message for the edge came since the count (nats-server 2.11's expected last sequence
/// on a subject filter), and is counted again otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_racing_for_the_last_room_do_not_pass_the_bound() {
    use std::sync::Arc;

    let nats = NatsServer::start();
    let sink = Arc::new(sink(&nats).await);
    let bounds = DownBounds { messages: 10, bytes: 1 << 20 };
    for _ in 0..5 {
        sink.enqueue("edge-1", &msg("cmd/a", "x"), bounds).await.unwrap();
    }
    let racers: Vec<_> = (0..24)
        .map(|i| {
            let sink = sink.clone();
            tokio::spawn(async move { sink.enqueue("edge-1", &msg(&format!("cmd/{i}"), "x"), bounds).await.unwrap() })
        })
        .collect();
    let mut stored = 0;
    let mut outcomes = Vec::new();
    for r in racers {
        let what = r.await.unwrap();
        stored += usize::from(matches!(what, cloud_bridge::sink::downlink::Enqueued::Stored { .. }));
        outcomes.push(what);
    }
    let _ = outcomes;
    assert_eq!((stored, sink.down_backlog("edge-1").await.unwrap().messages), (5, 10));
}

/// `send` keeps an edge's backlog within its bound; any other NATS client could publish past
/// it (10,020 waited for a bound of 10,000). The bridge holding the edge's session sets aside
/// what passed it, newest first, as refused dead letters with the reason; the oldest stay, in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_another_publisher_stored_past_the_bound_is_set_aside_newest_first() {
    let nats = NatsServer::start();
    let sink = sink(&nats).await;
    let bounds = DownBounds { messages: 10, bytes: 1 << 20 };
    sink.enqueue("edge-1", &msg("cmd/a", "sent"), bounds).await.unwrap();
    let mut ops = Vec::new();
    for i in 0..29 {
        ops.extend(format!("PUB down.edge-1.cmd.b {}\r\n{i}\r\n", i.to_string().len()).into_bytes());
    }
    publish_raw(nats.port, &ops).await;
    assert_eq!(sink.down_backlog("edge-1").await.unwrap().messages, 30);
    assert_eq!(sink.down_trim("edge-1", bounds, 5).await.unwrap(), 5, "at most as many as asked");
    assert_eq!(sink.down_trim("edge-1", bounds, 100).await.unwrap(), 15);
    assert_eq!(sink.down_trim("edge-1", bounds, 100).await.unwrap(), 0);
    let read = sink.down_read("edge-1", 0, ReadLimit::messages(100)).await.unwrap();
    let payloads: Vec<String> = read.iter().map(|p| String::from_utf8_lossy(&p.msg.payload).into_owned()).collect();
    let want: Vec<String> = std::iter::once("sent".to_owned()).chain((0..9).map(|i| i.to_string())).collect();
    assert_eq!(payloads, want);
    let dead = sink.down_dead_letters(Some("edge-1"), 100).await.unwrap();
    assert_eq!(dead.len(), 20);
    assert!(dead.iter().all(|d| d.outcome == "refused" && d.reason.contains("max_backlog_messages (10)")), "{dead:?}");
}

/// Reads the news from `cursor` until it has read every message stored: what it got is then
/// kept for the reads (`sink::jetstream::downlink::ahead`).
async fn read_news(sink: &JetStreamSink, mut cursor: u64, through: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while cursor < through {
        assert!(tokio::time::Instant::now() < deadline, "news read to {cursor} of {through}");
        cursor = sink.down_news(Some(cursor), Duration::from_millis(100)).await.unwrap().0;
    }
    cursor
}

/// The news read gets every message to learn whose it is; a session's read used to get it
/// again. Now the read takes what the news read kept, and must read exactly as the stream does:
/// the same messages, seqs, properties, times and reasons to set aside, within the same limits,
/// from any position (a session that came back reads from its last ack again). An edge whose
/// subject is not UTF-8 reads the stream (which names it), and so does an edge read from
/// before what the news read saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_from_what_the_news_read_kept_reads_as_the_stream_does() {
    use cloud_bridge::sink::{OutcomeLabel, SinkMetrics};

    let nats = NatsServer::start();
    let metrics = std::sync::Arc::new(SinkMetrics::default());
    let bridge = sink(&nats).await.with_metrics(metrics.clone());
    let mut settings = sink_settings(nats.url(), BatchPublish::Fast);
    settings.down.read_ahead_bytes = shared::units::ByteSize(0);
    let stream_only = JetStreamSink::connect(&settings).await.unwrap();
    // Stored before the news read began: never kept.
    bridge.enqueue("edge-1", &msg("cmd/a", "early"), BOUNDS).await.unwrap();
    let (cursor, _) = bridge.down_news(None, Duration::ZERO).await.unwrap();
    for i in 0..30 {
        let mut m = msg("cmd/a", &"x".repeat(1 + i * 37 % 200));
        m.user_properties = vec![("n".into(), i.to_string())];
        m.expires_at_ms = (i % 4 == 0).then_some(4_000_000_000_000);
        bridge.enqueue("edge-1", &m, BOUNDS).await.unwrap();
        if i % 3 == 0 {
            bridge.enqueue("edge-2", &msg("cmd/b", &format!("b{i}")), BOUNDS).await.unwrap();
        }
        if i == 10 {
            let mut ops = hpub(b"down.edge-1.cmd.header", b"Zone: \xff\r\n", b"bad header");
            ops.extend(b"PUB down.edge-2.cmd.bad\xff 3\r\nbad\r\n");
            publish_raw(nats.port, &ops).await;
        }
    }
    read_news(&bridge, cursor, 43).await;
    let kept = || metrics.downlink_reads.get_or_create(&OutcomeLabel { outcome: "kept" }).get();
    let all = ReadLimit::messages(256);
    let limits = [all, ReadLimit::messages(3), ReadLimit { messages: 256, bytes: 250 }];
    let edge1 = stream_only.down_read("edge-1", 0, all).await.unwrap();
    assert_eq!(edge1.len(), 32, "every message of edge-1");
    assert!(edge1[12].invalid.as_deref().is_some_and(|r| r.contains("headers")), "{:?}", edge1[12]);
    // From 0: the first was stored before the news read began. From each of its messages: kept.
    let afters: Vec<u64> = std::iter::once(0).chain(edge1.iter().map(|p| p.seq)).collect();
    for &after in &afters {
        for limit in limits {
            let ours = bridge.down_read("edge-1", after, limit).await.unwrap();
            assert_eq!(ours, stream_only.down_read("edge-1", after, limit).await.unwrap(), "after {after}, {limit:?}");
        }
    }
    assert_eq!(kept(), 3 * (afters.len() as u64 - 2), "every read but from 0 and from the last");
    let edge2 = stream_only.down_read("edge-2", 0, all).await.unwrap();
    let bad = edge2.iter().find(|p| p.invalid.as_deref().is_some_and(|r| r.contains("subject"))).expect("set aside");
    let before = kept();
    for after in std::iter::once(0).chain(edge2.iter().map(|p| p.seq)) {
        let ours = bridge.down_read("edge-2", after, all).await.unwrap();
        assert_eq!(ours, stream_only.down_read("edge-2", after, all).await.unwrap(), "edge-2 after {after}");
    }
    let past_bad = edge2.iter().filter(|p| p.seq > bad.seq).count() as u64;
    assert_eq!(kept() - before, past_bad, "edge-2 reads the stream up to its message with a bad subject");
}

/// The bridge's trim sets aside what another publisher stored past an edge's bound; the news
/// read may have read and kept those messages a moment before. They are set aside, never
/// delivered from what was kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_trim_sets_aside_is_not_read_from_what_the_news_read_kept() {
    let nats = NatsServer::start();
    let sink = sink(&nats).await;
    let bounds = DownBounds { messages: 4, bytes: 1 << 20 };
    let (cursor, _) = sink.down_news(None, Duration::ZERO).await.unwrap();
    sink.enqueue("edge-1", &msg("cmd/a", "sent"), bounds).await.unwrap();
    let mut ops = Vec::new();
    for i in 0..9 {
        ops.extend(format!("PUB down.edge-1.cmd.b 1\r\n{i}\r\n").into_bytes());
    }
    publish_raw(nats.port, &ops).await;
    read_news(&sink, cursor, 10).await;
    assert_eq!(sink.down_read("edge-1", 0, ReadLimit::messages(100)).await.unwrap().len(), 10, "all kept");
    assert_eq!(sink.down_trim("edge-1", bounds, 100).await.unwrap(), 6);
    let read = sink.down_read("edge-1", 0, ReadLimit::messages(100)).await.unwrap();
    assert_eq!(seqs_and_payloads(&read), [(1, "sent"), (2, "0"), (3, "1"), (4, "2")].map(|(s, p)| (s, p.to_owned())));
    assert_eq!(sink.down_dead_letters(Some("edge-1"), 100).await.unwrap().len(), 6);
}

/// A server that crashed may come back without its last messages (not yet synced) and hand
/// their sequences to new ones: the stream keeps its identity, and the news read may have kept
/// a lost message under the sequence a new one now has. A read after the reconnect must get
/// the new message from the stream, never the lost one from what was kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_kept_before_the_server_went_back_in_time_is_not_read_for_its_sequence() {
    let mut nats = NatsServer::start();
    let bridge = sink(&nats).await;
    let (cursor, _) = bridge.down_news(None, Duration::ZERO).await.unwrap();
    bridge.enqueue("edge-1", &msg("cmd/a", "first"), BOUNDS).await.unwrap();
    let before = nats.copy_store();
    let stored = async {
        loop {
            match bridge.enqueue("edge-1", &msg("cmd/a", "lost"), BOUNDS).await {
                Ok(_) => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), stored).await.expect("the sink back after the copy");
    // The news read goes on after the reconnect and keeps "lost".
    read_news(&bridge, cursor, 2).await;
    let kept = bridge.down_read("edge-1", 1, ReadLimit::messages(16)).await.unwrap();
    assert_eq!(seqs_and_payloads(&kept), [(2, "lost".to_owned())]);

    nats.go_back_to(before.path());
    let stored = async {
        loop {
            match bridge.enqueue("edge-1", &msg("cmd/a", "new"), BOUNDS).await {
                Ok(seq) => return seq,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    };
    let seq = tokio::time::timeout(Duration::from_secs(30), stored).await.expect("the sink back in the past");
    assert!(
        matches!(seq, cloud_bridge::sink::downlink::Enqueued::Stored { seq: 2 }),
        "the stream hands the lost message's sequence to the new one: {seq:?}"
    );
    let read = bridge.down_read("edge-1", 1, ReadLimit::messages(16)).await.unwrap();
    assert_eq!(seqs_and_payloads(&read), [(2, "new".to_owned())]);
    // And once the news read goes on, it keeps the new one.
    read_news(&bridge, 0, 2).await;
    let read = bridge.down_read("edge-1", 1, ReadLimit::messages(16)).await.unwrap();
    assert_eq!(seqs_and_payloads(&read), [(2, "new".to_owned())]);
}
