//! MQTT over WebSocket (MQTT 5 §6, MQTT 3.1.1 §6): the handshake, with the `mqtt`
//! subprotocol, and a byte stream over binary messages that the connection task reads and
//! writes as it does a socket. MQTT packets may span messages and a message may hold several.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// A stream whose reads stop `cap` bytes in until the cap is lifted. Under a WebSocket it
/// bounds what a client not yet logged in can make the node buffer: tungstenite reads a whole
/// message (up to `max_packet_size`) before the CONNECT in it is looked at, so without it a
/// thousand pending connections held a gigabyte, as plain ones did before `max_connect_size`.
#[derive(Debug)]
pub(super) struct Capped<S> {
    inner: S,
    read: u64,
    cap: Arc<AtomicU64>,
}

impl<S> Capped<S> {
    /// `cap` is shared with whoever lifts it (the connection, once its client is admitted).
    pub(super) fn new(inner: S, cap: Arc<AtomicU64>) -> Self {
        Self { inner, read: 0, cap }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Capped<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let cap = self.cap.load(Ordering::Acquire);
        if cap == u64::MAX {
            // Lifted: the stream as it is, with no window to zero.
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let left = cap.saturating_sub(self.read);
        if left == 0 {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "more than broker.max_connect_size before the login",
            )));
        }
        let room = usize::try_from(left).unwrap_or(usize::MAX).min(buf.remaining());
        // A window of `buf` of at most `room` bytes (initialized, so it can be advanced over
        // without unsafe code; tokio zeroes only what was never initialized).
        let mut window = ReadBuf::new(buf.initialize_unfilled_to(room));
        ready!(Pin::new(&mut self.inner).poll_read(cx, &mut window))?;
        let n = window.filled().len();
        buf.advance(n);
        self.read += n as u64;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Capped<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The browser origins a WebSocket listener serves (`listener.allowed_origins`). A browser
/// sends the page's origin with every WebSocket handshake and lets any page open one to any
/// address, so without this a page from anywhere, opened in a browser on the gateway, has
/// the listener's rights (on an anonymous listener, everything `[anonymous]` may do).
#[derive(Debug, Clone)]
pub(crate) enum Origins {
    /// Pages of this host: `http` or `https` on `localhost`, `127.0.0.1` or `[::1]`, any port.
    ThisHost,
    Any,
    /// Exactly these, compared without case.
    Listed(Vec<String>),
}

impl Origins {
    pub(crate) fn new(configured: Option<Vec<String>>) -> Self {
        match configured {
            None => Origins::ThisHost,
            Some(list) if list.iter().any(|o| o == "*") => Origins::Any,
            Some(list) => Origins::Listed(list),
        }
    }

    /// Whether a handshake with this `Origin` (none: not a browser) is served.
    pub(crate) fn allow(&self, origin: Option<&str>) -> bool {
        let Some(origin) = origin else { return true };
        match self {
            Origins::Any => true,
            Origins::Listed(list) => list.iter().any(|o| o.eq_ignore_ascii_case(origin)),
            Origins::ThisHost => {
                let Some((scheme, rest)) = origin.split_once("://") else { return false };
                // The host, without a port: `[::1]` keeps its brackets.
                let host = match rest.strip_prefix('[') {
                    Some(v6) => v6.split_once(']').map(|(h, _)| h),
                    None => rest.split(':').next(),
                };
                matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https")
                    && host.is_some_and(|h| h.eq_ignore_ascii_case("localhost") || h == "127.0.0.1" || h == "::1")
            }
        }
    }
}

/// Whether the handshake failed on its `Origin` (for the refusal's counter).
pub(super) fn is_origin_refusal(e: &WsError) -> bool {
    matches!(e, WsError::Http(r) if r.status() == StatusCode::FORBIDDEN)
}

/// Completes the WebSocket handshake on `stream`. A browser page of an origin `origins` does
/// not list is refused with 403, a client that does not offer the `mqtt` subprotocol with 400.
/// No message or frame may be larger than `max_message` bytes; [MQTT-6.0.0-2]: packets need
/// not align with messages.
pub(super) async fn accept<S>(stream: S, max_message: usize, origins: &Origins) -> Result<WsStream<S>, WsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let config = WebSocketConfig::default().max_message_size(Some(max_message)).max_frame_size(Some(max_message));
    #[allow(clippy::result_large_err, reason = "the signature is tungstenite's handshake Callback")]
    let check = |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
        let origin = request.headers().get("origin").map(|v| v.to_str().unwrap_or("(not text)"));
        if !origins.allow(origin) {
            let mut refusal = ErrorResponse::new(Some(format!(
                "pages of origin {} may not use this listener (listener.allowed_origins)\n",
                origin.unwrap_or_default()
            )));
            *refusal.status_mut() = StatusCode::FORBIDDEN;
            return Err(refusal);
        }
        choose_subprotocol(request, response)
    };
    let ws = tokio_tungstenite::accept_hdr_async_with_config(stream, check, Some(config)).await?;
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

#[cfg(test)]
mod tests {
    use super::Origins;

    /// By default a page of this host is served and a page from elsewhere is not; a client
    /// with no `Origin` (not a browser) always is; a list is exact, `*` is anything.
    #[test]
    fn origins_default_to_this_host() {
        let default = Origins::new(None);
        for ok in [None, Some("http://localhost:8080"), Some("https://127.0.0.1"), Some("http://[::1]:3000")] {
            assert!(default.allow(ok), "{ok:?}");
        }
        for refused in [
            "https://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example",
            "file://",
            "null",
            "http://192.168.1.10:8080",
        ] {
            assert!(!default.allow(Some(refused)), "{refused}");
        }
        let listed = Origins::new(Some(vec!["http://hmi.plant:8080".into()]));
        assert!(listed.allow(Some("HTTP://hmi.plant:8080")));
        assert!(!listed.allow(Some("http://hmi.plant:8081")));
        assert!(!listed.allow(Some("http://localhost")));
        assert!(Origins::new(Some(vec!["*".into()])).allow(Some("https://anything.example")));
    }
}
