//! Frames: a 4-byte big-endian body length, then the body in CBOR (ciborium, which writes the
//! same bytes as the archived serde_cbor for the same serde types; a test keeps that true).

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ProtoError;

/// The length prefix.
pub const HEADER: usize = 4;

/// Serializes `value` as one frame: length prefix and CBOR body.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, ProtoError> {
    let mut out = vec![0u8; HEADER];
    ciborium::into_writer(value, &mut out).map_err(|e| ProtoError::Encode(e.to_string()))?;
    let len = u32::try_from(out.len() - HEADER).map_err(|_| ProtoError::Encode("frame over 4 GiB".into()))?;
    out[..HEADER].copy_from_slice(&len.to_be_bytes());
    Ok(out)
}

/// The body length a header announces, refused if over `max`: call it before allocating.
pub fn body_len(header: [u8; HEADER], max: usize) -> Result<usize, ProtoError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(ProtoError::FrameTooLarge { len, max });
    }
    Ok(len)
}

/// Decodes a frame body (without its length prefix).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtoError> {
    // ciborium bounds its recursion depth itself, so nested garbage cannot exhaust the stack.
    ciborium::from_reader(body).map_err(|e| ProtoError::Decode(e.to_string()))
}

/// Decodes one whole frame (prefix and body) from `bytes`, which must hold exactly that.
#[cfg(test)]
pub(crate) fn decode_frame<T: DeserializeOwned>(bytes: &[u8], max: usize) -> Result<T, ProtoError> {
    let header: [u8; HEADER] = bytes
        .get(..HEADER)
        .and_then(|h| h.try_into().ok())
        .ok_or(ProtoError::Truncated { got: bytes.len(), want: HEADER })?;
    let len = body_len(header, max)?;
    let body = &bytes[HEADER..];
    if body.len() < len {
        return Err(ProtoError::Truncated { got: body.len(), want: len });
    }
    decode(&body[..len])
}

/// Splits a byte stream into frame bodies, for readers that get bytes in pieces.
#[derive(Debug)]
pub(crate) struct FrameBuffer {
    buf: Vec<u8>,
    max: usize,
}

impl FrameBuffer {
    pub(crate) fn new(max: usize) -> Self {
        Self { buf: Vec::new(), max }
    }

    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame body, if one has arrived; an error if its length is over the limit
    /// (checked as soon as the prefix is in, before the body is waited for).
    pub(crate) fn next_body(&mut self) -> Result<Option<Vec<u8>>, ProtoError> {
        let Some(header) = self.buf.get(..HEADER).and_then(|h| <[u8; HEADER]>::try_from(h).ok()) else {
            return Ok(None);
        };
        let len = body_len(header, self.max)?;
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let body = self.buf[HEADER..HEADER + len].to_vec();
        self.buf.drain(..HEADER + len);
        Ok(Some(body))
    }

    /// Bytes held that do not yet make a frame.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::*;

    fn hello() -> Control {
        Control::Hello(Hello {
            versions: vec![1, 2],
            epoch: "00ff".into(),
            lanes: vec![LaneSeq { lane: Lane(0), seq: Seq(7) }],
            models: vec!["yolo".into()],
            dicts: vec![],
            caps: vec!["zstd".into()],
            down_mark: 0,
            down_window: None,
        })
    }

    fn batch() -> Batch {
        Batch {
            epoch: "00ff".into(),
            lane: Lane(2),
            first_seq: Seq(10),
            last_seq: Seq(11),
            codec: Codec::Cbor,
            dict: None,
            raw_len: 3,
            body: vec![0, 1, 255],
        }
    }

    #[test]
    fn frames_round_trip() {
        for frame in [
            hello(),
            Control::Ack(Ack { lane: Lane(1), up_to: Seq(99) }),
            Control::Refused { reason: "no".into() },
            Control::Ping { nonce: 5 },
        ] {
            let bytes = encode(&frame).unwrap();
            assert_eq!(decode_frame::<Control>(&bytes, MAX_CONTROL_FRAME).unwrap(), frame);
        }
        let bytes = encode(&batch()).unwrap();
        assert_eq!(decode_frame::<Batch>(&bytes, MAX_BATCH_FRAME).unwrap(), batch());
    }

    /// Peers built on serde_cbor (archived, RUSTSEC-2021-0127) must interoperate: same bytes
    /// both ways for the same serde types.
    #[test]
    fn serde_cbor_writes_the_same_bytes_and_reads_ours() {
        let ours = encode(&hello()).unwrap();
        let theirs = serde_cbor::to_vec(&hello()).unwrap();
        assert_eq!(&ours[HEADER..], &theirs[..]);
        assert_eq!(decode::<Control>(&theirs).unwrap(), hello());
        let back: Control = serde_cbor::from_slice(&ours[HEADER..]).unwrap();
        assert_eq!(back, hello());

        let ours = encode(&batch()).unwrap();
        assert_eq!(&ours[HEADER..], &serde_cbor::to_vec(&batch()).unwrap()[..]);
        let record = WireRecord::message(
            Seq(3),
            WireMessage {
                class: "telemetry".into(),
                topic: "inference/yolo-edge/v3.2.1/cam-03".into(),
                payload: b"{\"p\":0.9}".to_vec(),
                qos: 1,
                enqueued_ms: 1_700_000_000_000,
                expires_ms: None,
                user_properties: vec![("trace-id".into(), "abc".into())],
                correlation_data: Some(vec![1, 2]),
                content_type: Some("application/json".into()),
                schema: None,
            },
        );
        let theirs = serde_cbor::to_vec(&vec![record.clone()]).unwrap();
        assert_eq!(decode::<Vec<WireRecord>>(&theirs).unwrap(), vec![record]);
    }

    #[test]
    fn oversized_lengths_are_refused_before_allocation() {
        let mut frame = encode(&hello()).unwrap();
        frame[..HEADER].copy_from_slice(&u32::MAX.to_be_bytes());
        let err = decode_frame::<Control>(&frame, MAX_CONTROL_FRAME).unwrap_err();
        assert_eq!(err, ProtoError::FrameTooLarge { len: u32::MAX as usize, max: MAX_CONTROL_FRAME });
        let mut buffer = FrameBuffer::new(MAX_CONTROL_FRAME);
        buffer.extend(&frame[..HEADER]);
        assert!(buffer.next_body().is_err(), "refused on the prefix alone");
    }

    #[test]
    fn truncated_and_garbage_frames_are_errors_that_name_the_problem() {
        let frame = encode(&hello()).unwrap();
        let err = decode_frame::<Control>(&frame[..frame.len() - 1], MAX_CONTROL_FRAME).unwrap_err();
        assert!(matches!(err, ProtoError::Truncated { .. }), "{err}");
        let err = decode::<Control>(&[0xff, 0x00, 0x13]).unwrap_err();
        assert!(err.to_string().starts_with("malformed CBOR frame"), "{err}");
        // Deep nesting is refused, not a stack overflow.
        let deep = vec![0x81u8; 100_000];
        assert!(decode::<Control>(&deep).is_err());
    }

    #[test]
    fn unknown_fields_and_frames_from_a_newer_peer_are_tolerated() {
        #[derive(serde::Serialize)]
        struct NewerAck {
            r#type: &'static str,
            lane: u8,
            up_to: u64,
            added_in_v2: &'static str,
        }
        let bytes = encode(&NewerAck { r#type: "ack", lane: 1, up_to: 5, added_in_v2: "x" }).unwrap();
        assert_eq!(decode_frame::<Control>(&bytes, 1024).unwrap(), Control::Ack(Ack { lane: Lane(1), up_to: Seq(5) }));
        #[derive(serde::Serialize)]
        struct Future {
            r#type: &'static str,
            what: u8,
        }
        let bytes = encode(&Future { r#type: "teleport", what: 1 }).unwrap();
        assert_eq!(decode_frame::<Control>(&bytes, 1024).unwrap(), Control::Unknown);
    }

    #[test]
    fn heads_with_and_without_the_spool_report_read_on_both_sides() {
        // What an edge of the first versions sends: no spool report.
        #[derive(serde::Serialize)]
        struct OldHeads {
            r#type: &'static str,
            lanes: Vec<LaneSeq>,
        }
        let lanes = vec![LaneSeq { lane: Lane(2), seq: Seq(9) }];
        let bytes = encode(&OldHeads { r#type: "heads", lanes: lanes.clone() }).unwrap();
        assert_eq!(
            decode_frame::<Control>(&bytes, 1024).unwrap(),
            Control::Heads { lanes: lanes.clone(), spool: None }
        );
        // What this edge sends, read by a bridge that knows only the lanes.
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct OldHeadsIn {
            lanes: Vec<LaneSeq>,
        }
        let spool = Some(SpoolReport { oldest_unacked_ms: 10, dropped: 3, gaps: 1 });
        let bytes = encode(&Control::Heads { lanes: lanes.clone(), spool }).unwrap();
        assert_eq!(decode_frame::<OldHeadsIn>(&bytes, 1024).unwrap(), OldHeadsIn { lanes: lanes.clone() });
        assert_eq!(decode_frame::<Control>(&bytes, 1024).unwrap(), Control::Heads { lanes, spool });
    }

    #[test]
    fn the_buffer_yields_frames_split_anywhere() {
        let mut stream = encode(&hello()).unwrap();
        stream.extend(encode(&Control::Ping { nonce: 1 }).unwrap());
        let mut buffer = FrameBuffer::new(MAX_CONTROL_FRAME);
        let mut got = Vec::new();
        for chunk in stream.chunks(3) {
            buffer.extend(chunk);
            while let Some(body) = buffer.next_body().unwrap() {
                got.push(decode::<Control>(&body).unwrap());
            }
        }
        assert_eq!(got, vec![hello(), Control::Ping { nonce: 1 }]);
        assert_eq!(buffer.pending(), 0);
    }

    #[test]
    fn version_negotiation_picks_the_highest_common_one() {
        assert_eq!(negotiate(&[1, 2], &[1]), Some(1));
        assert_eq!(negotiate(&[1, 2, 3], &[2, 3, 4]), Some(3));
        assert_eq!(negotiate(&[2], &[1]), None);
    }
}
