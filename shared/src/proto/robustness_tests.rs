//! Hostile input for the decoder and the cloud session, as property tests on stable Rust (a
//! `cargo fuzz` target needs a nightly toolchain this project does not assume): random bytes,
//! valid frames with bits flipped, and random frame sequences must give errors, never panics,
//! and never an allocation beyond the limits.

use std::collections::HashMap;

use proptest::prelude::*;

use super::cloud::{CloudSession, Request};
use super::codec::{FrameBuffer, decode, encode};
use super::*;

fn sample_frames() -> Vec<Vec<u8>> {
    let hello = Control::Hello(Hello {
        versions: vec![1],
        epoch: "00ff".into(),
        lanes: vec![LaneSeq { lane: Lane(1), seq: Seq(3) }],
        models: vec!["m".into()],
        dicts: vec![],
        caps: vec![],
        down_mark: 0,
        down_window: None,
    });
    let batch = compress::pack(
        "00ff",
        Lane(1),
        Seq(1),
        &[WireRecord::message(
            Seq(1),
            WireMessage {
                class: "c".into(),
                topic: "a/b".into(),
                payload: vec![7; 300],
                qos: 1,
                enqueued_ms: 5,
                expires_ms: None,
                user_properties: vec![("k".into(), "v".into())],
                correlation_data: None,
                content_type: None,
                schema: None,
            },
        )],
        None,
        3,
    )
    .unwrap();
    vec![
        encode(&hello).unwrap(),
        encode(&Control::Ack(Ack { lane: Lane(1), up_to: Seq(2) })).unwrap(),
        encode(&batch).unwrap(),
    ]
}

proptest! {
    #[test]
    fn random_bytes_never_panic_the_decoders(bytes in proptest::collection::vec(any::<u8>(), 0..2048), split in 1..64usize) {
        let _ = decode::<Control>(&bytes);
        let _ = decode::<Batch>(&bytes);
        let _ = decode::<Vec<WireRecord>>(&bytes);
        let mut buffer = FrameBuffer::new(MAX_CONTROL_FRAME);
        for chunk in bytes.chunks(split) {
            buffer.extend(chunk);
            while let Ok(Some(body)) = buffer.next_body() {
                let _ = decode::<Control>(&body);
            }
        }
    }

    #[test]
    fn flipped_bits_in_valid_frames_give_errors_not_panics(which in 0..3usize, flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut frame = sample_frames()[which].clone();
        for (at, bits) in flips {
            let i = codec::HEADER + at % (frame.len() - codec::HEADER);
            frame[i] ^= bits;
        }
        let _ = codec::decode_frame::<Control>(&frame, MAX_CONTROL_FRAME);
        if let Ok(batch) = codec::decode_frame::<Batch>(&frame, MAX_BATCH_FRAME) {
            let _ = compress::unpack(&batch, &HashMap::new(), 1 << 20);
        }
    }

    #[test]
    fn random_frame_sequences_never_panic_the_cloud_session(
        steps in proptest::collection::vec((0..6u8, any::<u64>(), any::<u64>(), any::<u8>()), 1..64)
    ) {
        let mut session = CloudSession::new(4);
        for (kind, a, b, lane) in steps {
            let _ = match kind {
                0 => session.handle(Control::Hello(Hello {
                    versions: vec![(a % 3) as u16],
                    epoch: if a % 2 == 0 { "e".into() } else { String::new() },
                    lanes: vec![],
                    models: vec![],
                    dicts: vec![],
                    caps: vec![],
                    down_mark: 0,
                    down_window: None,
                })).map(|h| if matches!(h, Some(Request::Hello(_))) { session.welcome(vec![LaneSeq { lane: Lane(lane), seq: Seq(b % 10) }], vec![]) }),
                1 => session.handle(Control::Ack(Ack { lane: Lane(lane), up_to: Seq(a) })).map(|_| ()),
                2 => session.handle(Control::Ping { nonce: a }).map(|_| ()),
                3 => session
                    .handle(Control::Dict(DictAnnounce { id: format!("{a:x}"), class: "c".into(), bytes: vec![lane] }))
                    .map(|_| ()),
                _ => session
                    .handle_batch(Batch {
                        epoch: if a % 5 == 0 { "x".into() } else { "e".into() },
                        lane: Lane(lane),
                        first_seq: Seq(a % 50),
                        last_seq: Seq(b % 50),
                        codec: Codec::Cbor,
                        dict: None,
                        raw_len: 0,
                        body: vec![],
                    })
                    .map(|released| {
                        for r in released {
                            session.committed(r.batch.lane.0, r.batch.last_seq.0);
                        }
                    }),
            };
            while session.poll_control().is_some() {}
        }
    }
}

#[test]
fn a_huge_claimed_length_inside_a_frame_allocates_nothing_large() {
    // A byte string, a text string and an array each claiming 2^62 items, in a tiny frame.
    for head in [0x5bu8, 0x7b, 0x9b, 0xbb] {
        let mut body = vec![head, 0x40, 0, 0, 0, 0, 0, 0, 0];
        body.extend([0u8; 16]);
        assert!(decode::<Control>(&body).is_err());
        assert!(decode::<Vec<WireRecord>>(&body).is_err());
        let mut map = vec![0xa1, 0x64, b't', b'y', b'p', b'e', 0x64, b'd', b'i', b'c', b't', 0x65];
        map.extend(b"bytes");
        map.extend(&body);
        assert!(decode::<Control>(&map).is_err());
    }
}
