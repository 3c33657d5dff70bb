//! The downlink's storage on a real nats-server with JetStream, where it meets what else
//! writes the `DOWN` stream and its bucket (issue 43): an operator deleting and making the
//! stream again, a bucket that lost an edge's position, and any NATS client that can publish
//! to `down.>`. Driven through the sink's own calls (`DownlinkStore`), as the bridge's sessions
//! and `cloud-bridge send` make them.

use async_nats::jetstream;
use cloud_bridge::sink::DownlinkStore;
use cloud_bridge::sink::downlink::{DoneCounts, DownBounds, DownDone, Outgoing, Pending};
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
    let read = first.down_read("edge-1", 0, 16).await.unwrap();
    let held = read.last().unwrap().seq;
    first.down_record("edge-1", &acked(held, vec![])).await.unwrap();
    // edge-2 was sent one message and has not acked it when the stream goes.
    first.enqueue("edge-2", &msg("cmd/b", "old"), BOUNDS).await.unwrap();
    let edge2_held = first.down_read("edge-2", 0, 16).await.unwrap()[0].seq;

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

    let read = again.down_read("edge-1", held, 16).await.unwrap();
    assert_eq!(seqs_and_payloads(&read), [(held + 1, "direct".to_owned()), (held + 2, "sent".to_owned())]);
    again.down_record("edge-1", &acked(held + 2, vec![])).await.unwrap();
    assert!(again.down_read("edge-1", held + 2, 16).await.unwrap().is_empty());
    assert_eq!(again.down_backlog("edge-1").await.unwrap().messages, 0);

    // edge-2's session sent up to `edge2_held` (the message lost with the old stream): the
    // new one comes after it, though the bucket's position is 0.
    // (Seqs increase with the stream's sequence, other edges' messages between.)
    let read = again.down_read("edge-2", edge2_held, 16).await.unwrap();
    assert_eq!((read.len(), read[0].msg.payload.as_slice()), (1, &b"new"[..]));
    assert!(read[0].seq > edge2_held, "{} after {edge2_held}", read[0].seq);

    // The first bridge, still running, counts the same way.
    let later = first.enqueue("edge-1", &msg("cmd/a", "later"), BOUNDS).await.unwrap();
    let read = first.down_read("edge-1", held + 2, 16).await.unwrap();
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
    let read = sink.down_read("edge-3", 1000, 16).await.unwrap();
    assert_eq!(seqs_and_payloads(&read), [(1001, "direct".to_owned()), (1002, "sent".to_owned())]);
    assert_eq!(sink.down_backlog("edge-3").await.unwrap().messages, 2);
    // Another edge's seqs are its own.
    assert_eq!(seqs_and_payloads(&sink.down_read("edge-1", 0, 16).await.unwrap()), [(1, "other".to_owned())]);
}
