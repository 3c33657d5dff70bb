//! What the fuzz targets in `shared/fuzz` run (cargo fuzz, libFuzzer; `scripts/fuzz.sh`), kept
//! in the library so the stable test suite replays the committed corpus through exactly the
//! same code. Neither function may panic, hang or allocate past the frame limits, whatever the
//! bytes.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::cloud::{CloudSession, Request};
use super::codec::{self, FrameBuffer};
use super::edge::{EdgeSession, EdgeSessionConfig};
use super::{Control, LaneSeq, MAX_BATCH_FRAME, Seq, compress};

/// Output cap for unpacking in the fuzz targets: small, so a bomb is found fast.
const MAX_RAW: usize = 1 << 20;

/// `data` as a byte stream of frames, each decoded as a control frame, a fetch request, a chunk
/// reply and as a batch of either framing, and each
/// batch unpacked (decompressed with the output cap, checked against its seq range); each body
/// also as a batch's records, which must fit the bound `bound::decoded_bound` reads, and as a
/// column-wise body (version 6), which stops at its output cap and holds no more records than
/// it has bytes.
pub fn frames(data: &[u8]) {
    let mut buf = FrameBuffer::new(MAX_BATCH_FRAME);
    buf.extend(data);
    while let Ok(Some(body)) = buf.next_body() {
        // The bridge walks an edge's control frame for its bound before it decodes it.
        let _ = super::bound::value_bound_up_to(&body, MAX_RAW);
        let _ = codec::decode::<Control>(&body);
        let _ = codec::decode::<super::Fetch>(&body);
        let _ = codec::decode::<super::ChunkReply>(&body);
        // Either framing (the binary head of version 4, or CBOR), as the bridge's ingest reads.
        if let Ok(batch) = super::batch_frame::decode(&body) {
            let _ = compress::unpack(&batch, &HashMap::new(), MAX_RAW);
        }
        // The body as a batch's CBOR: whatever decodes must fit the bound read from its headers.
        if let Ok(bound) = super::bound::decoded_bound(&body)
            && let Ok(records) = codec::decode::<Vec<super::WireRecord>>(&body)
        {
            assert!(bound >= super::bound::decoded_heap(&records), "bound {bound} below what decoding took");
        }
        if let Ok(records) = super::columns::decode(&body, MAX_RAW) {
            assert!(records.len() <= body.len(), "{} records from {} bytes", records.len(), body.len());
        }
    }
}

/// `data` as a conversation: each frame's first body byte says who gets it (even: the cloud
/// session, as a control frame or else a batch; odd: the edge session, as a control frame).
/// The cloud's driver is simulated: hellos are welcomed with committed seqs, dictionaries
/// stored, released batches unpacked and committed; the edge's sends follow its windows.
pub fn session(data: &[u8]) {
    let mut buf = FrameBuffer::new(MAX_BATCH_FRAME);
    buf.extend(data);
    let now = Instant::now();
    // Every version there is, the downlink's too, whether or not the binaries offer it yet.
    let versions: Vec<u16> = (1..=super::DOWN_WINDOW_VERSION).collect();
    let mut cloud = CloudSession::new(8).with_versions(versions.clone());
    let mut edge = EdgeSession::new(EdgeSessionConfig::default(), "e", [(0, 0), (3, 5)]).with_versions(versions);
    edge.connected(now);
    let mut clock = Duration::ZERO;
    let mut dicts: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    while let Ok(Some(body)) = buf.next_body() {
        let Some((&selector, rest)) = body.split_first() else { continue };
        clock += Duration::from_millis(u64::from(selector));
        let at = now + clock;
        if selector % 2 == 0 {
            if let Ok(frame) = codec::decode::<Control>(rest) {
                match cloud.handle(frame) {
                    Ok(Some(Request::Hello(h))) => {
                        let committed =
                            h.lanes.iter().map(|l| LaneSeq { lane: l.lane, seq: Seq(l.seq.0 / 2) }).collect();
                        let known: Vec<String> = h.dicts.into_iter().filter(|d| dicts.contains_key(d)).collect();
                        cloud.welcome(committed, known);
                        cloud.start_down(h.down_mark);
                    }
                    Ok(Some(Request::StoreDict(d))) => {
                        cloud.dict_stored(d.id.clone());
                        dicts.insert(d.id, d.bytes);
                    }
                    Ok(Some(Request::DownAcked(ack))) => cloud.down_marked(ack.up_to),
                    Ok(Some(Request::Classes(_))) | Ok(None) | Err(_) => {}
                }
            } else if let Ok(batch) = super::batch_frame::decode(rest)
                && let Ok(releases) = cloud.handle_batch(batch)
            {
                for r in releases {
                    if compress::unpack(&r.batch, cloud.dicts(), MAX_RAW).is_ok() {
                        cloud.committed(r.batch.lane.0, r.batch.last_seq.0);
                    }
                }
            }
            // The downlink: a message a step while there is room.
            if cloud.down_room() {
                let seq = cloud.down_sent().saturating_add(1 + u64::from(selector % 3));
                let _ = cloud.send_down(super::down::Down {
                    seq,
                    topic: "cmd/x".into(),
                    payload: rest.get(..rest.len().min(64)).unwrap_or_default().to_vec(),
                    qos: selector % 3,
                    retain: false,
                    expires_in_ms: None,
                    user_properties: vec![],
                    response_topic: None,
                    correlation_data: None,
                    content_type: None,
                });
            }
            let _ = cloud.lags();
            while cloud.poll_control().is_some() {}
        } else {
            if let Ok(frame) = codec::decode::<Control>(rest) {
                // Downlink messages are finished at once: delivered, refused or expired by seq.
                for event in edge.handle(frame, at).unwrap_or_default() {
                    if let super::edge::EdgeEvent::Down(d) = event {
                        let outcome = match d.seq % 3 {
                            0 => super::down::DownOutcome::Delivered,
                            1 => super::down::DownOutcome::Refused("x".repeat(d.payload.len() * 8)),
                            _ => super::down::DownOutcome::Expired,
                        };
                        let _ = edge.down_done(d.seq, outcome);
                    }
                }
            }
            let _ = edge.handle_timeout(at);
            for lane in [0u8, 3] {
                if edge.can_send() {
                    let first = edge.next_seq(lane);
                    let _ = edge.sent(lane, first, first.saturating_add(u64::from(selector % 16)), at);
                }
            }
            while edge.poll_control().is_some() {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::proto::Batch;
    use crate::proto::Lane;
    use crate::proto::{Codec, DictAnnounce, Hello, WireMessage, WireRecord};

    fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
    }

    /// The committed corpus (seeds plus what fuzzing runs found interesting) goes through both
    /// targets without a panic: a regression test for every input the fuzzer ever kept.
    #[test]
    fn the_fuzz_corpus_replays_without_a_panic() {
        let (frames_corpus, session_corpus) = (corpus("frames"), corpus("session"));
        assert!(frames_corpus.len() >= 100 && session_corpus.len() >= 100, "corpus missing");
        let seeds = seeds().into_iter().map(|(name, bytes)| (PathBuf::from(name), bytes));
        for (path, data) in frames_corpus.into_iter().chain(session_corpus).chain(seeds) {
            let result = std::panic::catch_unwind(|| {
                frames(&data);
                session(&data);
            });
            assert!(result.is_ok(), "{} panicked", path.display());
        }
    }

    fn frame(selector: Option<u8>, value: &impl serde::Serialize) -> Vec<u8> {
        let mut body: Vec<u8> = selector.into_iter().collect();
        body.extend(&codec::encode(value).unwrap()[codec::HEADER..]);
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend(body);
        out
    }

    /// Valid frames and conversations (the fuzzer's starting points): they must pass too.
    fn seeds() -> Vec<(&'static str, Vec<u8>)> {
        let hello = Control::Hello(Hello {
            versions: vec![1, 2],
            epoch: "e".into(),
            lanes: vec![LaneSeq { lane: Lane(3), seq: Seq(6) }],
            models: vec!["yolo".into()],
            dicts: vec![],
            caps: vec!["zstd".into()],
            down_mark: 0,
            down_window: None,
        });
        let records: Vec<WireRecord> = (1..=40)
            .map(|seq| {
                WireRecord::message(
                    Seq(seq),
                    WireMessage {
                        class: "telemetry".into(),
                        topic: format!("telemetry/cam-{}/metrics", seq % 4),
                        payload: format!("{{\"temp_c\":{}}}", 40 + seq % 7).into_bytes(),
                        qos: 1,
                        enqueued_ms: 1_700_000_000_000 + seq,
                        expires_ms: None,
                        user_properties: vec![("trace-id".into(), format!("t{seq}"))],
                        correlation_data: None,
                        content_type: None,
                        schema: None,
                    },
                )
            })
            .collect();
        let samples: Vec<Vec<u8>> = records.iter().map(compress::sample).collect();
        let dict = compress::train("telemetry", &samples, 1024).unwrap();
        let plain = compress::pack("e", Lane(3), Seq(1), &records[..3], None, 3).unwrap();
        let zstd = compress::pack("", Lane(3), Seq(1), &records, None, 3).unwrap();
        let with_dict = compress::pack("", Lane(3), Seq(1), &records, Some(dict.on(2)), 3).unwrap();
        let announce =
            Control::Dict(DictAnnounce { id: dict.id.clone(), class: dict.class.clone(), bytes: dict.bytes });
        let bomb = Batch {
            epoch: String::new(),
            lane: Lane(0),
            first_seq: Seq(1),
            last_seq: Seq(1),
            codec: Codec::Zstd,
            dict: None,
            raw_len: 10,
            body: zstd::bulk::compress(&vec![0u8; 4 << 20], 19).unwrap(),
        };
        let ack = Control::Ack(crate::proto::Ack { lane: Lane(3), up_to: Seq(40) });
        let seeds: Vec<(&'static str, Vec<u8>)> = vec![
            ("hello", frame(None, &hello)),
            ("ping", frame(None, &Control::Ping { nonce: 7 })),
            ("ack", frame(None, &ack)),
            ("dict", frame(None, &announce)),
            ("batch-cbor", frame(None, &plain)),
            ("batch-zstd", frame(None, &zstd)),
            ("batch-dict", frame(None, &with_dict)),
            ("batch-bomb", frame(None, &bomb)),
            (
                "conversation",
                [
                    frame(Some(0), &hello),
                    frame(Some(0), &announce),
                    frame(Some(2), &with_dict),
                    frame(Some(2), &zstd),
                    frame(
                        Some(1),
                        &Control::Welcome(crate::proto::Welcome {
                            version: 1,
                            committed: vec![],
                            dicts: vec![],
                            sink: None,
                        }),
                    ),
                    frame(Some(3), &ack),
                    frame(Some(0), &Control::Ping { nonce: 1 }),
                ]
                .concat(),
            ),
        ];
        seeds.into_iter().chain(near_max_seeds()).chain(downlink_seeds()).chain([format_3_seed()]).collect()
    }

    /// A format 3 column-wise body with binary shapes (parts, literals, varints, strings), as
    /// one frame's body: what the bridge's column decoder reads after zstd.
    fn format_3_seed() -> (&'static str, Vec<u8>) {
        use crate::proto::columns::tests::{Pairs, msg, with_schema};
        let records: Vec<WireRecord> = (1..=12u8)
            .map(|i| with_schema(msg(u64::from(i), "t", &[2, i, 0xff, 3, 1, 1, b'a' + i % 3, 0xfe, 3, 1, b'z'])))
            .collect();
        let body = crate::proto::columns::encode_with(&records, crate::proto::columns::Format::V3, &Pairs);
        assert_eq!(crate::proto::columns::decode(&body, usize::MAX).unwrap(), records);
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend(body);
        ("columns-format-3", out)
    }

    /// A version 5 conversation with downlink messages, acks and marks.
    fn downlink_seeds() -> Vec<(&'static str, Vec<u8>)> {
        let hello = Control::Hello(Hello {
            versions: vec![4, 5],
            epoch: "e".into(),
            lanes: vec![],
            models: vec![],
            dicts: vec![],
            caps: vec![],
            down_mark: 3,
            down_window: None,
        });
        let down = |seq| {
            Control::Down(Box::new(crate::proto::down::Down {
                seq,
                topic: "cmd/reboot".into(),
                payload: b"now".to_vec(),
                qos: 2,
                retain: true,
                expires_in_ms: Some(60_000),
                user_properties: vec![("k".into(), "v".into())],
                response_topic: Some("reply/1".into()),
                correlation_data: Some(vec![1, 2]),
                content_type: Some("text/plain".into()),
            }))
        };
        let ack = Control::DownAck(crate::proto::down::DownAck {
            up_to: 5,
            refused: vec![crate::proto::down::DownRefusal { seq: 4, reason: "not allowed".into() }],
            expired: vec![5],
        });
        let welcome =
            Control::Welcome(crate::proto::Welcome { version: 5, committed: vec![], dicts: vec![], sink: None });
        vec![(
            "downlink",
            [
                frame(Some(0), &hello),
                frame(Some(1), &welcome),
                frame(Some(1), &down(4)),
                frame(Some(1), &down(5)),
                frame(Some(0), &ack),
                frame(Some(1), &Control::DownMarked { up_to: 5 }),
                frame(Some(1), &down(u64::MAX)),
            ]
            .concat(),
        )]
    }

    /// Seqs at the top of the range, where a peer's `+ 1` would overflow: a hello, a Welcome,
    /// an ack and batches at or past `MAX_SEQ` and at `u64::MAX`. Also in the fuzz corpus
    /// (`seed-max-*`), so fuzzing starts from them.
    fn near_max_seeds() -> Vec<(&'static str, Vec<u8>)> {
        let top = |first_seq: u64, last_seq: u64| Batch {
            epoch: "e".into(),
            lane: Lane(3),
            first_seq: Seq(first_seq),
            last_seq: Seq(last_seq),
            codec: Codec::Cbor,
            dict: None,
            raw_len: 1,
            // An empty CBOR array.
            body: vec![0x80],
        };
        let hello = Control::Hello(Hello {
            versions: vec![1],
            epoch: "e".into(),
            lanes: vec![
                LaneSeq { lane: Lane(3), seq: Seq(u64::MAX) },
                LaneSeq { lane: Lane(0), seq: Seq(crate::proto::MAX_SEQ) },
            ],
            models: vec![],
            dicts: vec![],
            caps: vec![],
            down_mark: 0,
            down_window: None,
        });
        let welcome = |seq| {
            Control::Welcome(crate::proto::Welcome {
                version: 1,
                committed: vec![LaneSeq { lane: Lane(3), seq }],
                dicts: vec![],
                sink: None,
            })
        };
        let ack = Control::Ack(crate::proto::Ack { lane: Lane(3), up_to: Seq(u64::MAX) });
        vec![
            ("max-batch", frame(None, &top(u64::MAX - 1, u64::MAX))),
            (
                "max-conversation",
                [
                    frame(Some(0), &hello),
                    frame(Some(2), &top(1, crate::proto::MAX_SEQ)),
                    frame(Some(2), &top(crate::proto::MAX_SEQ, u64::MAX)),
                    frame(Some(1), &welcome(Seq(crate::proto::MAX_SEQ))),
                    frame(Some(1), &welcome(Seq(u64::MAX))),
                    frame(Some(3), &ack),
                    frame(Some(0), &Control::Ping { nonce: u64::MAX }),
                ]
                .concat(),
            ),
        ]
    }

    /// The near-max seeds are in the committed corpus (`FUZZ_WRITE_SEEDS=1` writes them).
    #[test]
    fn the_corpus_starts_the_fuzzer_at_the_top_of_the_seq_range() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        for (name, bytes) in near_max_seeds() {
            for target in ["frames", "session"] {
                let path = dir.join(target).join(format!("seed-{name}"));
                if std::env::var_os("FUZZ_WRITE_SEEDS").is_some() {
                    std::fs::write(&path, &bytes).unwrap();
                }
                let stored = std::fs::read(&path).unwrap_or_default();
                assert!(stored == bytes, "{} is missing or stale: FUZZ_WRITE_SEEDS=1 writes it", path.display());
            }
        }
    }
}
