//! The edge's side of the downlink (issue 31), against a bridge stand-in that speaks protocol
//! version 5 through the protocol's own session (`CloudSession`), on the bridge's QUIC endpoint
//! with the fleet's certificates, so the test chooses what is sent and when (`downlink.rs` runs
//! the real bridge).
//! An allowed message reaches a local MQTT 5 subscriber with its properties; a topic no
//! `[[downlink]]` entry allows and an expired message are refused back with their reasons; the
//! acks come only for what is done; after a restart the edge's hello carries its position, and a
//! stale bridge resending from the start gets acks, not a second delivery.

use std::time::Duration;

use cloud_bridge::config::ServerConfig;
use e2e_tests::client::durable_v5_subscriber;
use e2e_tests::cloud::{pki, uplink_section};
use e2e_tests::fixtures::{telemetry, with_spool};
use e2e_tests::node::TestNode;
use shared::proto::cloud::{CloudSession, Request};
use shared::proto::down::{Down, DownAck};
use shared::proto::io::{read_frame, write_frame};
use shared::proto::{Control, DOWNLINK_VERSION, MAX_EDGE_CONTROL_FRAME};

const WAIT: Duration = Duration::from_secs(20);

fn down(seq: u64, topic: &str) -> Down {
    Down {
        seq,
        topic: topic.into(),
        payload: format!("value {seq}").into_bytes(),
        qos: 1,
        retain: false,
        expires_in_ms: None,
        user_properties: vec![("origin".into(), "central".into())],
        response_topic: Some("reply/edge-1".into()),
        correlation_data: Some(vec![seq as u8]),
        content_type: Some("text/plain".into()),
    }
}

/// One session of the stand-in: takes the edge's hello, welcomes it at version 5, sends
/// `messages` from `start` (or from the hello's position when `start` is `None`) and reads
/// until the edge acked the last one. Returns the hello's position and the acks.
async fn serve_once(endpoint: &quinn::Endpoint, start: Option<u64>, messages: Vec<Down>) -> (u64, Vec<DownAck>) {
    let incoming = tokio::time::timeout(WAIT, endpoint.accept()).await.expect("the edge connects").unwrap();
    let conn = incoming.await.expect("handshake");
    let (mut send, mut recv) = conn.accept_bi().await.unwrap();
    let versions: Vec<u16> = (1..=DOWNLINK_VERSION).collect();
    let mut session = CloudSession::new(8).with_versions(versions);
    let last = messages.last().map_or(0, |d| d.seq);
    let mut position = 0;
    let mut acks = Vec::new();
    let mut queue = messages.into_iter();
    loop {
        let frame: Control = tokio::time::timeout(WAIT, read_frame(&mut recv, MAX_EDGE_CONTROL_FRAME))
            .await
            .expect("the edge answers")
            .unwrap()
            .expect("the control stream stays open");
        match session.handle(frame).expect("a frame the session takes") {
            Some(Request::Hello(h)) => {
                assert_eq!(h.version, DOWNLINK_VERSION, "the edge offers the downlink");
                position = h.down_mark;
                session.welcome(vec![], vec![]);
                assert!(session.start_down(start.unwrap_or(h.down_mark)));
            }
            Some(Request::DownAcked(ack)) => {
                session.down_marked(ack.up_to);
                let done = ack.up_to >= last;
                acks.push(ack);
                if done {
                    while let Some(f) = session.poll_control() {
                        write_frame(&mut send, &f).await.unwrap();
                    }
                    conn.close(0u32.into(), b"done");
                    return (position, acks);
                }
            }
            _ => {}
        }
        while session.down_room() {
            let Some(d) = queue.next() else { break };
            session.send_down(d).unwrap();
        }
        while let Some(f) = session.poll_control() {
            write_frame(&mut send, &f).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_delivers_refuses_and_expires_downlink_messages_once_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let keys = pki(dir.path(), &[]);
    let server: ServerConfig = toml::from_str(&format!(
        "bind = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n",
        keys.server_cert.display(),
        keys.server_key.display(),
        keys.ca.display()
    ))
    .unwrap();
    let endpoint = cloud_bridge::server::endpoint(&server, |_| {}).unwrap();
    let bridge = endpoint.local_addr().unwrap();
    let extra = format!(
        "{}\n{}\n[[downlink]]\nfilter = \"config/#\"\n",
        with_spool(&[telemetry()]),
        uplink_section(&keys, "edge-1", &[bridge], "")
    );
    let edge_dir = tempfile::tempdir().unwrap();
    let edge = TestNode::start_in(edge_dir, &extra).await;
    // The subscriber's session outlives its connection: what comes meanwhile is queued for it.
    let (client, _) = durable_v5_subscriber(edge.local(), "config/#").await;
    client.disconnect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let expired = Down { expires_in_ms: Some(0), ..down(7, "config/late") };
    let messages = vec![down(2, "config/threshold"), down(5, "cmd/reboot"), expired, down(9, "config/mode")];
    let (position, acks) = serve_once(&endpoint, None, messages.clone()).await;
    assert_eq!(position, 0, "a new edge starts at 0");
    let refused: Vec<_> = acks.iter().flat_map(|a| a.refused.clone()).collect();
    assert_eq!(refused.iter().map(|r| r.seq).collect::<Vec<_>>(), [5]);
    assert!(refused[0].reason.contains("not allowed by this edge's [[downlink]]"), "{refused:?}");
    assert_eq!(acks.iter().flat_map(|a| a.expired.clone()).collect::<Vec<_>>(), [7]);
    assert_eq!(acks.last().unwrap().up_to, 9);

    // The edge restarts (the queued messages and the position were committed before the acks);
    // a bridge whose sink lost the position sends everything again.
    let TestNode { node, dir: edge_dir } = edge;
    node.shutdown(Duration::from_secs(5)).await;
    let edge = TestNode::start_in(edge_dir, &extra).await;
    let (position, acks) = serve_once(&endpoint, Some(0), messages).await;
    assert_eq!(position, 9, "the hello carries the stored position");
    assert_eq!(acks.last().unwrap().up_to, 9);
    assert!(acks.iter().all(|a| a.refused.is_empty() || a.refused.iter().all(|r| r.seq == 5)), "{acks:?}");

    // The subscriber comes back: each allowed message once, with its properties.
    let (_client, mut got) = durable_v5_subscriber(edge.local(), "config/#").await;
    let first = tokio::time::timeout(WAIT, got.recv()).await.expect("delivered").unwrap();
    assert_eq!(&first.topic[..], b"config/threshold");
    assert_eq!(&first.payload[..], b"value 2");
    let props = first.properties.expect("MQTT 5 properties");
    assert_eq!(props.user_properties, [("origin".to_owned(), "central".to_owned())]);
    assert_eq!(props.response_topic.as_deref(), Some("reply/edge-1"));
    assert_eq!(props.correlation_data.as_deref(), Some(&[2u8][..]));
    let second = tokio::time::timeout(WAIT, got.recv()).await.expect("delivered").unwrap();
    assert_eq!(&second.topic[..], b"config/mode");
    let again = tokio::time::timeout(Duration::from_millis(700), got.recv()).await;
    assert!(again.is_err(), "nothing delivered twice: {again:?}");
}
