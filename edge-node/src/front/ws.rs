//! MQTT over WebSocket (MQTT 5 §6, MQTT 3.1.1 §6): the handshake, with the `mqtt`
//! subprotocol, and a byte stream over binary messages that the connection task reads and
//! writes as it does a socket. MQTT packets may span messages and a message may hold several.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

/// [MQTT-6.0.0-3]: clients offer `mqtt`; [MQTT-6.0.0-4]: the server selects it.
const SUBPROTOCOL: &str = "mqtt";

/// Completes the WebSocket handshake on `stream`. A client that does not offer the `mqtt`
/// subprotocol is refused with 400. No message or frame may be larger than `max_message`
/// bytes; [MQTT-6.0.0-2]: packets need not align with messages.
pub(super) async fn accept<S>(stream: S, max_message: usize) -> Result<WsStream<S>, WsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let config = WebSocketConfig::default().max_message_size(Some(max_message)).max_frame_size(Some(max_message));
    let ws = tokio_tungstenite::accept_hdr_async_with_config(stream, choose_subprotocol, Some(config)).await?;
    Ok(WsStream { ws, read: Bytes::new(), write: BytesMut::new() })
}

#[allow(clippy::result_large_err, reason = "the signature is tungstenite's handshake Callback")]
fn choose_subprotocol(request: &Request, mut response: Response) -> Result<Response, ErrorResponse> {
    let offered = request
        .headers()
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(str::trim))
        .any(|p| p.eq_ignore_ascii_case(SUBPROTOCOL));
    match offered {
        true => {
            response.headers_mut().insert("sec-websocket-protocol", HeaderValue::from_static(SUBPROTOCOL));
            Ok(response)
        }
        false => {
            let mut refusal = ErrorResponse::new(Some("MQTT over WebSocket needs the 'mqtt' subprotocol\n".into()));
            *refusal.status_mut() = StatusCode::BAD_REQUEST;
            Err(refusal)
        }
    }
}

/// A WebSocket connection as a byte stream: reads take the bytes of binary messages as they
/// come, writes are collected and sent as one binary message at each flush.
#[derive(Debug)]
pub(super) struct WsStream<S> {
    ws: WebSocketStream<S>,
    /// What is left of the message being read.
    read: Bytes,
    write: BytesMut,
}

fn io_error(e: WsError) -> io::Error {
    match e {
        WsError::Io(e) => e,
        other => io::Error::other(other),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            if !self.read.is_empty() {
                let n = self.read.len().min(buf.remaining());
                buf.put_slice(&self.read[..n]);
                self.read.advance(n);
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(bytes))) => self.read = bytes,
                // [MQTT-6.0.0-1]: MQTT goes in binary messages; anything else closes.
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, "text WebSocket message")));
                }
                // Pings are answered by tungstenite; a close or the end is EOF.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Close(_))) | None => return Poll::Ready(Ok(())),
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.write.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.write.is_empty() {
            ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(io_error)?;
            let message = Message::Binary(self.write.split().freeze());
            Pin::new(&mut self.ws).start_send(message).map_err(io_error)?;
        }
        Pin::new(&mut self.ws).poll_flush(cx).map_err(io_error)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.as_mut().poll_flush(cx))?;
        Pin::new(&mut self.ws).poll_close(cx).map_err(io_error)
    }
}
