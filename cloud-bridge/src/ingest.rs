//! Taking one connection's batches in: its unidirectional streams are read in the order the
//! edge opened them, each frame paid for from the connection's memory budget as it arrives,
//! then decompressed and decoded here, off the session task, under reservations made before
//! each allocation ([`crate::limits`]). The session gets records ready to publish and the
//! reservation that pays for them.
//!
//! The control stream's frames are paid for the same way ([`spawn_control_reader`]): an edge's
//! dictionary or hello is small, but the bridge reads whatever an edge sends.
//!
//! Reading streams in order costs nothing for an edge that sends in order (it does), and it
//! means a connection's memory goes to its earliest batch first: later batches cannot take all
//! of it while the one the session waits for cannot get any.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use shared::proto::codec::{self, HEADER};
use shared::proto::io::FrameIoError;
use shared::proto::{
    Batch, Codec, Control, MAX_BATCH_FRAME, MAX_BATCH_RAW, MAX_EDGE_CONTROL_FRAME, ProtoError, WireRecord, batch_frame,
    bound, compress,
};
use tokio::sync::{Notify, mpsc};

use crate::limits::{BudgetError, ConnectionBudget, Reservation};
use crate::schemas::frame::Framer;

/// Batches with more bytes than this (compressed or not) are decoded off the runtime.
const INLINE_DECODE: usize = 256 << 10;

/// A frame's memory is reserved in steps as its bytes arrive, from this size up, doubling.
const FIRST_STEP: usize = 64 << 10;

/// How long a batch may wait for the dictionary it names: the announcement travels on the
/// control stream and may arrive a moment after the batch.
const DICT_WAIT: Duration = Duration::from_secs(5);

/// A batch ready to publish: its header fields (the body is gone), its records, and the memory
/// they hold until they are in the sink.
#[derive(Debug)]
pub(crate) struct Ingested {
    pub batch: Batch,
    pub records: Vec<WireRecord>,
    pub reservation: Reservation,
    /// The frame's length on the wire.
    pub frame_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum IngestError {
    #[error("batch stream: {0}")]
    Frame(#[from] FrameIoError),
    #[error("bad batch: {0}")]
    Batch(#[from] ProtoError),
    #[error("batch memory: {0}")]
    Budget(#[from] BudgetError),
}

impl From<std::io::Error> for IngestError {
    fn from(e: std::io::Error) -> Self {
        IngestError::Frame(e.into())
    }
}

/// The dictionaries this connection's session has accepted, shared with its ingest.
#[derive(Debug, Default)]
pub(crate) struct Dicts {
    known: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    added: Notify,
}

impl Dicts {
    pub(crate) fn add(&self, id: String, bytes: Vec<u8>) {
        self.known.lock().unwrap_or_else(PoisonError::into_inner).insert(id, Arc::new(bytes));
        self.added.notify_waiters();
    }

    async fn get(&self, id: &str) -> Result<Arc<Vec<u8>>, ProtoError> {
        let wait = async {
            loop {
                let added = self.added.notified();
                if let Some(d) = self.known.lock().unwrap_or_else(PoisonError::into_inner).get(id) {
                    return d.clone();
                }
                added.await;
            }
        };
        tokio::time::timeout(DICT_WAIT, wait).await.map_err(|_| ProtoError::UnknownDict(id.to_owned()))
    }
}

/// Reads `conn`'s batch streams until it ends or a batch is bad; each batch, or the error
/// that ends the connection, goes to `tx` (boxed: a channel allocates room for 32 up front).
pub(crate) async fn run(
    conn: quinn::Connection,
    budget: ConnectionBudget,
    dicts: Arc<Dicts>,
    framer: Option<Arc<Framer>>,
    tx: mpsc::Sender<Box<Result<Ingested, IngestError>>>,
) {
    while let Ok(mut stream) = conn.accept_uni().await {
        // A stream carries one batch, or several small ones that went out together.
        loop {
            match next(&mut stream, &budget, &dicts).await {
                Ok(Some(mut batch)) => {
                    // The framing some records get is paid for as what they decoded to is.
                    if let Some(framer) = &framer {
                        let added = framer.frame(&mut batch.records).await;
                        match budget.reserve(added).await {
                            Ok(more) => batch.reservation.merge(more),
                            Err(e) => {
                                let _ = tx.send(Box::new(Err(e.into()))).await;
                                return;
                            }
                        }
                    }
                    if tx.send(Box::new(Ok(batch))).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = tx.send(Box::new(Err(e))).await;
                    return;
                }
            }
        }
    }
}

/// The next batch on `stream`; `None` at its clean end.
async fn next(
    stream: &mut quinn::RecvStream,
    budget: &ConnectionBudget,
    dicts: &Dicts,
) -> Result<Option<Ingested>, IngestError> {
    let Some((body, mut reservation)) = read_body(stream, budget, MAX_BATCH_FRAME).await? else { return Ok(None) };
    let frame_bytes = body.len();
    // Version 4 frames: the body is decompressed (or decoded) where it lies, after the head.
    // Earlier ones: decoding the envelope copies the body out of the frame; pay for the copy,
    // then give the frame back.
    let (mut batch, mut body, at) = match batch_frame::decode_head(&body)? {
        Some((batch, at)) => (batch, body, at),
        None => {
            reservation.merge(budget.reserve(body.len()).await?);
            let mut batch: Batch = codec::decode(&body)?;
            drop(body);
            reservation.shrink_to(batch.body.len());
            let body = std::mem::take(&mut batch.body);
            (batch, body, 0)
        }
    };

    // A large batch takes tens of milliseconds to decompress, bound and decode: on a blocking
    // thread, or it would hold up every connection on this worker.
    let big = body.len().max(batch.raw_len as usize) > INLINE_DECODE;
    let raw = match batch.codec {
        Codec::Cbor | Codec::Columns => {
            // In place: no second buffer.
            body.drain(..at);
            body
        }
        Codec::Zstd | Codec::ZstdColumns => {
            if batch.raw_len > MAX_BATCH_RAW as u64 {
                return Err(ProtoError::TooLargeDecompressed { max: MAX_BATCH_RAW }.into());
            }
            let dict = match &batch.dict {
                Some(id) => Some(dicts.get(id).await?),
                None => None,
            };
            reservation.merge(budget.reserve(batch.raw_len as usize).await?);
            let (b, raw) = off_runtime(big, move || {
                let dict = dict.as_deref().map(Vec::as_slice);
                let raw = compress::decompress_body(&batch, &body[at..], dict, MAX_BATCH_RAW);
                (batch, raw)
            })
            .await;
            let raw = raw?.expect("a zstd batch decompresses");
            batch = b;
            reservation.shrink_to(raw.len());
            raw
        }
    };
    let limit = budget.limit();
    if batch.codec.columns() {
        // Column-wise (version 6): the decoder stops at the connection's budget, whatever the
        // body claims; what the records take is then paid for before they go on.
        let (batch, records) = off_runtime(big, move || {
            let records = compress::decode_columns(&batch, &raw, limit);
            (batch, records)
        })
        .await;
        let records = records?;
        let decoded = compress::records_cost(&records);
        reservation.merge(budget.reserve(decoded).await?);
        reservation.shrink_to(decoded);
        return Ok(Some(Ingested { batch, records, reservation, frame_bytes }));
    }
    // A bomb is walked only as far as the connection's budget.
    let (raw, decoded) = off_runtime(big, move || {
        let bound = bound::decoded_bound_up_to(&raw, limit);
        (raw, bound)
    })
    .await;
    let decoded = decoded?;
    reservation.merge(budget.reserve(decoded).await?);
    let (batch, records) = off_runtime(big, move || {
        let records = compress::decode_records(&batch, &raw);
        (batch, records)
    })
    .await;
    let records = records?;
    reservation.shrink_to(decoded);
    Ok(Some(Ingested { batch, records, reservation, frame_bytes }))
}

/// Runs `work` on a blocking thread if `big`, else here.
async fn off_runtime<T: Send + 'static>(big: bool, work: impl FnOnce() -> T + Send + 'static) -> T {
    if big {
        match tokio::task::spawn_blocking(work).await {
            Ok(t) => t,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: the runtime is shutting down and drops this task too.
            Err(_) => std::future::pending().await,
        }
    } else {
        work()
    }
}

/// What the control stream's reader hands on: a frame and the memory it holds until the
/// session handled it, the end of the stream, or the error that ended it.
pub(crate) type ControlRead = Box<Result<Option<(Control, Reservation)>, IngestError>>;

/// Reads the edge's control frames on a task of its own (a read cut short by `select!` would
/// lose the bytes it had taken), each paid for from `budget`: its bytes as they arrive, then
/// what decoding them may take ([`bound::value_bound_up_to`]: a megabyte of empty strings
/// decodes to tens). Two frames wait at most besides the one being read. Abort the handle to
/// stop reading.
pub(crate) fn spawn_control_reader(
    mut stream: quinn::RecvStream,
    budget: ConnectionBudget,
) -> (mpsc::Receiver<ControlRead>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(2);
    let task = tokio::spawn(async move {
        loop {
            let frame = read_control(&mut stream, &budget).await;
            let end = !matches!(frame, Ok(Some(_)));
            if tx.send(Box::new(frame)).await.is_err() || end {
                return;
            }
        }
    });
    (rx, task)
}

async fn read_control(
    stream: &mut quinn::RecvStream,
    budget: &ConnectionBudget,
) -> Result<Option<(Control, Reservation)>, IngestError> {
    let Some((body, mut reservation)) = read_body(stream, budget, MAX_EDGE_CONTROL_FRAME).await? else {
        return Ok(None);
    };
    let bound = bound::value_bound_up_to(&body, budget.limit())?;
    reservation.merge(budget.reserve(bound).await?);
    let control = codec::decode(&body)?;
    drop(body);
    reservation.shrink_to(bound);
    Ok(Some((control, reservation)))
}

/// One frame's body of at most `max` bytes, with the memory it holds; `None` at a clean end of
/// stream.
async fn read_body(
    stream: &mut quinn::RecvStream,
    budget: &ConnectionBudget,
    max: usize,
) -> Result<Option<(Vec<u8>, Reservation)>, IngestError> {
    let mut header = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        match stream.read(&mut header[got..]).await.map_err(std::io::Error::from)? {
            Some(0) => continue,
            Some(n) => got += n,
            None if got == 0 => return Ok(None),
            None => return Err(ProtoError::Truncated { got, want: HEADER }.into()),
        }
    }
    let len = codec::body_len(header, max)?;
    let mut reservation = budget.reserve(len.min(FIRST_STEP)).await?;
    let mut body = Vec::with_capacity(len.min(FIRST_STEP));
    while body.len() < len {
        if body.len() == body.capacity() {
            let step = body.len().min(len - body.len());
            reservation.merge(budget.reserve(step).await?);
            body.reserve_exact(step);
        }
        let start = body.len();
        let end = body.capacity().min(len);
        body.resize(end, 0);
        if let Err(e) = stream.read_exact(&mut body[start..end]).await {
            return Err(match e {
                quinn::ReadExactError::FinishedEarly(n) => ProtoError::Truncated { got: start + n, want: len }.into(),
                quinn::ReadExactError::ReadError(e) => std::io::Error::from(e).into(),
            });
        }
    }
    Ok(Some((body, reservation)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dictionary_announced_a_moment_after_its_batch_is_waited_for() {
        let dicts = Arc::new(Dicts::default());
        let later = dicts.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            later.add("d1".into(), vec![1, 2, 3]);
        });
        assert_eq!(*dicts.get("d1").await.unwrap(), vec![1, 2, 3]);
        tokio::time::pause();
        assert_eq!(dicts.get("nope").await.unwrap_err(), ProtoError::UnknownDict("nope".into()));
    }
}
