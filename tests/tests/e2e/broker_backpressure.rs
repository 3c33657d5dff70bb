//! Publisher backpressure (`broker::core::backpressure`) with real clients: an unthrottled
//! publisher (rumqttc) and a subscriber that reads at a fraction of its pace. Without it the
//! subscriber's queue (1,000 here) fills within milliseconds and the slow-subscriber policy
//! disconnects it, most messages lost (the unthrottled case of `scripts/bench-local.sh` lost
//! them in two rounds of three); with it the publisher goes at the subscriber's pace.

use std::collections::BTreeSet;
use std::time::Duration;

use e2e_tests::client::Client;
use e2e_tests::node::TestNode;
use e2e_tests::raw::{self, RawClient};
use rumqttc::QoS;

const MESSAGES: usize = 5000;

/// The packet id and payload of an MQTT 5 QoS 1 PUBLISH (fixed header included).
fn publish_parts(p: &[u8]) -> (u16, Vec<u8>) {
    let mut i = 1;
    while p[i] & 0x80 != 0 {
        i += 1;
    }
    i += 1;
    let topic_len = usize::from(u16::from_be_bytes([p[i], p[i + 1]]));
    i += 2 + topic_len;
    let pkid = u16::from_be_bytes([p[i], p[i + 1]]);
    i += 2;
    let (mut props, mut shift) = (0usize, 0);
    loop {
        let b = p[i];
        i += 1;
        props |= usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            break;
        }
    }
    (pkid, p[i + props..].to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_faster_than_its_subscriber_is_slowed_down_and_nothing_is_lost() {
    let edge = TestNode::start("[broker]\nmax_queued_messages = 1000\n").await;
    let wait = Duration::from_secs(10);
    let mut sub = RawClient::connect(edge.local()).await.unwrap();
    sub.send(&raw::connect_v5("slow", true, &[])).await.unwrap();
    assert!(sub.until(2, wait).await.is_some(), "CONNACK");
    sub.send(&raw::subscribe_v5(1, &["bp/t".to_owned()], 1)).await.unwrap();
    assert!(sub.until(9, wait).await.is_some(), "SUBACK");

    let publisher = Client::anonymous(edge.local(), "fast").await;
    let publishing = tokio::spawn(async move {
        for i in 0..MESSAGES {
            publisher.publish("bp/t", QoS::AtLeastOnce, false, i.to_string()).await;
        }
        publisher
    });
    // About 10,000 messages a second at most: a pause of 5 ms every 50.
    let mut got = BTreeSet::new();
    let mut packets = 0;
    while got.len() < MESSAGES {
        let Some(p) = sub.packet(wait).await else { break };
        if p[0] >> 4 != 3 {
            continue;
        }
        let (pkid, payload) = publish_parts(&p);
        got.insert(String::from_utf8(payload).unwrap());
        let [hi, lo] = pkid.to_be_bytes();
        if sub.send(&[0x40, 2, hi, lo]).await.is_err() {
            break; // disconnected
        }
        packets += 1;
        if packets % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let _publisher = publishing.await.unwrap();
    let metrics = edge.metrics();
    assert_eq!(got.len(), MESSAGES, "every message reached the slow subscriber\n{metrics}");
    assert_eq!(edge.metric("edge_mqtt_disconnects_total{reason=\"slow_subscriber\"}"), 0.0, "{metrics}");
    assert!(edge.metric("edge_mqtt_publishers_held_total") > 0.0, "the publisher was held\n{metrics}");
}
