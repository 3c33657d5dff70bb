//! What the MQTT fuzz target in `edge-node/fuzz` runs (cargo fuzz, libFuzzer;
//! `scripts/fuzz.sh mqtt`), kept in the library so the stable test suite replays the committed
//! corpus through the same code. Nothing here may panic or hang, whatever the bytes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::codec::{self, Version};
use super::core::{Broker, ConnId, ConnectRequest, Identity, Limits};
use super::metrics::BrokerMetrics;
use crate::route::Classes;

/// `data` as what one client sends: its first byte picks the version (even: 3.1.1, odd: 5) and
/// the bytes after it are a stream of frames, the first decoded as a CONNECT (a valid one is
/// supplied when it is not) and the rest as whatever the client may send, every packet of every
/// type, each fed to a broker core with a second client subscribed to everything, whose
/// packets are taken and encoded as the glue would.
pub fn client_bytes(data: &[u8]) {
    let Some((&selector, stream)) = data.split_first() else { return };
    let version = if selector % 2 == 0 { Version::V311 } else { Version::V5 };
    let limits = Limits { max_queued_messages: 16, max_retained_messages: 16, ..Limits::default() };
    let metrics = BrokerMetrics::new(&mut Default::default());
    let mut core = Broker::new(limits, Arc::new(Classes::default()), metrics, super::core::WallClock::read());
    let mut now = Instant::now();
    let identity = || Identity { owner: "fuzz".into(), internal: false, rules: None };

    // A subscriber to everything, so publishes are routed, queued and encoded.
    let watcher = ConnId(1);
    let mut watch = connect_packet(version);
    watch.client_id = "watcher".into();
    let _ = core.connect(ConnectRequest { conn: watcher, connect: watch, identity: identity() }, now);
    let subscribe = codec::Inbound::Subscribe { pkid: 1, filters: vec![sub_all()], id: Some(1) };
    core.handle(watcher, subscribe, now);

    let conn = ConnId(2);
    let mut buf = BytesMut::from(stream);
    let mut first = true;
    loop {
        let len = match codec::frame_len(&buf, 1 << 20) {
            Ok(Some(len)) => len,
            Ok(None) => break,
            Err(e) => {
                core.decode_error(conn, &e, now);
                break;
            }
        };
        let frame = buf.split_to(len).freeze();
        if first {
            first = false;
            let connect = codec::decode_connect(frame).unwrap_or_else(|_| connect_packet(version));
            let version = connect.version;
            if core.connect(ConnectRequest { conn, connect, identity: identity() }, now).is_err() {
                let _ =
                    core.connect(ConnectRequest { conn, connect: connect_packet(version), identity: identity() }, now);
            }
            continue;
        }
        match codec::decode(frame, version, core.limits().max_user_properties) {
            Ok(packet) => core.handle(conn, packet, now),
            Err(e) => core.decode_error(conn, &e, now),
        }
        now += Duration::from_millis(200);
        core.handle_timeout(now);
        core.check_keep_alive(conn, now);
        for c in [conn, watcher] {
            let mut out = BytesMut::new();
            for p in core.poll_transmit(c, now, 1 << 16).packets {
                codec::encode(&p, version, &mut out);
            }
        }
        while core.poll_action().is_some() {}
    }
    core.closed(conn, now);
    core.handle_timeout(now + Duration::from_secs(3600));
}

fn connect_packet(version: Version) -> codec::Connect {
    codec::Connect {
        version,
        client_id: "fuzzed".into(),
        clean_start: false,
        keep_alive: 1,
        session_expiry: 60,
        receive_maximum: 4,
        max_packet_size: Some(4096),
        topic_alias_maximum: 0,
        request_problem_info: true,
        auth_method: None,
        will: None,
        username: None,
        password: None,
    }
}

fn sub_all() -> codec::SubscribeRequest {
    codec::SubscribeRequest {
        filter: "#".into(),
        qos: codec::QoS::ExactlyOnce,
        no_local: false,
        retain_as_published: true,
        retain_handling: 0,
    }
}

#[cfg(test)]
mod tests {
    /// The committed corpus (edge-node/fuzz/corpus/mqtt) goes through the target's body.
    #[test]
    fn the_mqtt_fuzz_corpus_replays_without_a_panic() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/mqtt");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            super::client_bytes(&std::fs::read(entry.unwrap().path()).unwrap());
            n += 1;
        }
        assert!(n >= 20, "only {n} corpus files in {}", dir.display());
    }
}
