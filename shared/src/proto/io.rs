//! Reading and writing frames on async streams (QUIC streams on both ends). The only part of
//! the protocol that touches I/O, behind the `io` feature.

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::ProtoError;
use super::codec::{self, HEADER};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameIoError {
    #[error(transparent)]
    Proto(#[from] ProtoError),
    #[error("stream: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads one frame and decodes it; `None` at a clean end of stream before a frame starts.
/// The length is checked against `max` before the body is read or allocated.
pub async fn read_frame<R, T>(r: &mut R, max: usize) -> Result<Option<T>, FrameIoError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    match read_frame_body(r, max).await? {
        Some(body) => Ok(Some(codec::decode(&body)?)),
        None => Ok(None),
    }
}

/// What a frame's buffer starts at; it grows with the bytes that arrive.
const FIRST_READ: usize = 64 << 10;

/// One frame's body; `None` at a clean end of stream before a frame starts.
pub async fn read_frame_body<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> Result<Option<Vec<u8>>, FrameIoError> {
    let mut header = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        let n = r.read(&mut header[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(ProtoError::Truncated { got, want: HEADER }.into());
        }
        got += n;
    }
    let len = codec::body_len(header, max)?;
    // Grown as the bytes come, not allocated at the declared length: a peer that announces
    // 4 MiB and sends nothing holds what it sent.
    let mut body = Vec::with_capacity(len.min(FIRST_READ));
    (&mut *r).take(len as u64).read_to_end(&mut body).await?;
    if body.len() < len {
        return Err(ProtoError::Truncated { got: body.len(), want: len }.into());
    }
    Ok(Some(body))
}

/// What [`spawn_reader`] hands on: a frame, the end of the stream, or the error that ended it.
pub(crate) type FrameRead<T> = Box<Result<Option<T>, FrameIoError>>;

/// Reads frames on a task of its own and hands them over a channel, ending with the first
/// `None` (end of stream) or error. Callers that wait on several things at once select on the
/// channel: a read cut short by `select!` would lose the bytes it had taken. Abort the handle
/// to stop reading.
pub fn spawn_reader<R, T>(
    mut r: R,
    max: usize,
) -> (tokio::sync::mpsc::Receiver<FrameRead<T>>, tokio::task::JoinHandle<()>)
where
    R: AsyncRead + Unpin + Send + 'static,
    T: DeserializeOwned + Send + 'static,
{
    // Boxed: a channel allocates room for its messages up front, and a control frame is
    // usually a few hundred bytes; a bridge holds one channel per connection.
    // Two decoded frames waiting at most, besides the one being read: a control frame may be
    // a few MiB (a model manifest), and an edge that sends them faster than its session takes
    // them holds three, not seventeen.
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    let task = tokio::spawn(async move {
        loop {
            let frame = read_frame::<_, T>(&mut r, max).await;
            let end = !matches!(frame, Ok(Some(_)));
            if tx.send(Box::new(frame)).await.is_err() || end {
                return;
            }
        }
    });
    (rx, task)
}

/// Encodes `value` and writes it as one frame.
pub async fn write_frame<W, T>(w: &mut W, value: &T) -> Result<(), FrameIoError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let frame = codec::encode(value)?;
    w.write_all(&frame).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Control, MAX_CONTROL_FRAME};

    #[tokio::test]
    async fn frames_cross_a_pipe_and_limits_hold() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            write_frame(&mut a, &Control::Ping { nonce: 7 }).await.unwrap();
            a.write_all(&(u32::MAX).to_be_bytes()).await.unwrap();
        });
        assert_eq!(
            read_frame::<_, Control>(&mut b, MAX_CONTROL_FRAME).await.unwrap(),
            Some(Control::Ping { nonce: 7 })
        );
        let err = read_frame::<_, Control>(&mut b, MAX_CONTROL_FRAME).await.unwrap_err();
        assert!(err.to_string().contains(&format!("over the {MAX_CONTROL_FRAME} byte limit")), "{err}");
        writer.await.unwrap();
        let (a, mut b) = tokio::io::duplex(64);
        drop(a);
        assert_eq!(read_frame::<_, Control>(&mut b, MAX_CONTROL_FRAME).await.unwrap(), None);
    }

    /// A frame that announces more than it sends ends as truncated, saying how much came; its
    /// buffer grew with what came (the body is read as it arrives, not allocated at the
    /// announced length).
    #[tokio::test]
    async fn a_frame_shorter_than_announced_is_truncated() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let mut frame = codec::encode(&Control::Ping { nonce: 7 }).unwrap();
        let announced = MAX_CONTROL_FRAME as u32;
        frame[..HEADER].copy_from_slice(&announced.to_be_bytes()[4 - HEADER..]);
        a.write_all(&frame).await.unwrap();
        drop(a);
        let err = read_frame_body(&mut b, MAX_CONTROL_FRAME).await.unwrap_err();
        let sent = frame.len() - HEADER;
        assert!(
            matches!(err, FrameIoError::Proto(ProtoError::Truncated { got, want }) if got == sent && want == MAX_CONTROL_FRAME),
            "{err}"
        );
    }
}
