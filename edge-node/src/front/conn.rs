//! One client connection after accept (and TLS): its CONNECT read and authenticated, then, in
//! one task, a reader that feeds every packet to the broker core and a writer that sends what
//! the core has for the client. Bytes are framed here (the size limit checked from the fixed
//! header, before the body is buffered) and decoded once; nothing else is parsed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use shared::trace::{KeyValue, Kind as SpanKind, SpanRecord, TraceParent, Tracer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::either::Either;

use super::FrontContext;
use super::connect::{self, Refusal};
use super::direct;
use crate::auth::Identity;
use crate::broker::codec::{self, DecodeError, Inbound, Outbound, Version, reason};
use crate::broker::core::{ConnId, ConnectRequest};
use crate::broker::driver::Wakers;
use crate::labels::{self, RefusedLabels};
use crate::schema::Judged;

/// How a connection came in.
/// A verified client certificate: who it says the client is, and until when.
pub(super) struct CertIdentity {
    pub identity: Identity,
    pub expires: Option<SystemTime>,
}

pub(super) struct Entry<'a> {
    pub listener: &'a str,
    pub anonymous: bool,
    pub cert: Option<CertIdentity>,
    pub peer: SocketAddr,
    /// Held until the client is admitted or refused.
    pub pending: tokio::sync::OwnedSemaphorePermit,
    /// The TCP socket underneath, for quick acks (see [`Reader::run`]).
    pub quickack: Option<socket2::Socket>,
    /// What a WebSocket client may send before its login (`ws::Capped`), lifted once it is
    /// admitted.
    pub lift: Option<Arc<AtomicU64>>,
}

/// What the writer sends at a time, at most (and at least one message).
const WRITE_BATCH: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The client closed or the socket failed.
    Lost,
    /// The core closed it and its last packets are written.
    Closed,
    SlowClient,
    Shutdown,
    /// The client's certificate, its identity, expired.
    Expired,
}

pub(super) async fn serve<S>(stream: S, entry: Entry<'_>, ctx: &Arc<FrontContext>)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    // A plain TCP socket is split into halves a routing task can write to (`direct`); TLS and
    // WebSocket streams are not.
    let mut slot = Some(stream);
    let tcp =
        (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<tokio::net::TcpStream>>().and_then(Option::take);
    let (mut rd, mut wr) = match (tcp, slot) {
        (Some(tcp), _) => {
            let (rd, wr) = tcp.into_split();
            (Either::Left(rd), Either::Left(wr))
        }
        (None, Some(stream)) => {
            let (rd, wr) = tokio::io::split(stream);
            (Either::Right(rd), Either::Right(wr))
        }
        (None, None) => unreachable!("the stream is in one of the two"),
    };
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let refused = |label: &'static str| {
        ctx.metrics
            .connects_refused
            .get_or_create(&RefusedLabels { listener: entry.listener.to_owned(), reason: label })
            .inc();
    };

    // Before the login the client is nobody: its CONNECT gets `max_connect_size`, not
    // `max_packet_size` (1,000 pending connections at 1 MiB each held a gigabyte).
    let first = tokio::time::timeout(ctx.connect_timeout, read_first(&mut rd, &mut buf, ctx.max_connect_size)).await;
    let frame = match first {
        Ok(Ok(Some(frame))) => frame,
        Ok(Ok(None)) => return refused("closed_before_connect"),
        Ok(Err(e)) => {
            if let Some(held_back) = ctx.peer_line() {
                tracing::info!(listener = entry.listener, peer = %entry.peer, error = %e, held_back, "bad first packet");
            }
            return refused(if matches!(e, DecodeError::TooLarge { .. }) { "connect_too_large" } else { "malformed" });
        }
        Err(_) => return refused("timeout"),
    };
    let connect = match codec::decode_connect(frame) {
        Ok(c) => c,
        Err(e) => {
            if let Some(held_back) = ctx.peer_line() {
                tracing::info!(listener = entry.listener, peer = %entry.peer, error = %e, held_back, "CONNECT refused");
            }
            // [MQTT-3.1.2-2]: an unsupported level is answered before the close: a level below
            // 4 (MQTT 3.1) with MQTT 3.1.1's return code 1 in the form those clients read, a
            // later one than 5 with MQTT 5's 0x84 in MQTT 5's form. Anything else malformed is
            // closed without an answer.
            if let DecodeError::UnsupportedVersion(level) = e {
                let form = if level > 5 { Version::V5 } else { Version::V311 };
                let _ = write_connack(&mut wr, form, e.reason()).await;
            }
            return refused(e.label());
        }
    };
    let version = connect.version;
    let refuse = |refusal: Refusal| {
        refused(refusal.label);
        refusal.code
    };

    let cert_identity = entry.cert.as_ref().map(|c| c.identity.clone());
    let identity = match connect::authenticate(&connect, cert_identity, entry.anonymous, ctx).await {
        Ok(id) => id,
        Err(refusal) => {
            if let Some(held_back) = ctx.peer_line() {
                tracing::info!(listener = entry.listener, peer = %entry.peer, reason = refusal.label, held_back, "CONNECT refused");
            }
            let _ = write_connack(&mut wr, version, refuse(refusal)).await;
            return;
        }
    };
    // Admitted connections count against max_connections from here on, and only they do.
    let Ok(permit) = ctx.permits.clone().try_acquire_owned() else {
        if let Some(held_back) = ctx.peer_line() {
            tracing::warn!(listener = entry.listener, peer = %entry.peer, held_back, "connection refused: broker.max_connections reached");
        }
        let _ = write_connack(&mut wr, version, refuse(connect::MAX_CONNECTIONS)).await;
        return;
    };
    drop(entry.pending);
    if let Some(cap) = &entry.lift {
        cap.store(u64::MAX, Ordering::Release);
    }
    let generation = ctx.auth_generation.load(Ordering::Acquire);
    let rules = ctx.auth.load().rules_for(&identity, &connect.client_id);
    let client_id = connect.client_id.clone();
    let (conn, wakers) = ctx.broker.register();
    let request = ConnectRequest { conn, connect, identity: connect::core_identity(&identity, rules) };
    let (admitted, spool) = ctx.broker.with(|b| b.connect(request, Instant::now()));
    if let Err(refusal) = admitted {
        if let Some(held_back) = ctx.peer_line() {
            tracing::info!(listener = entry.listener, peer = %entry.peer, reason = refusal.label, held_back, "CONNECT refused");
        }
        let _ = write_connack(&mut wr, version, refuse(Refusal { code: refusal.code, label: refusal.label })).await;
        ctx.broker.unregister(conn).await;
        return;
    }
    ctx.broker.run_spool(spool).await;

    tracing::debug!(listener = entry.listener, peer = %entry.peer, user = ?identity.name(), ?client_id, ?version, "connected");
    let label = labels::listener_label(entry.listener);
    ctx.metrics.connections_total.get_or_create(&label).inc();
    let open = ctx.metrics.connections.get_or_create(&label).clone();
    open.inc();

    let mut reader = Reader {
        conn,
        version,
        identity,
        client_id: client_id.clone(),
        generation,
        buf,
        ctx,
        quickack: entry.quickack,
        split: 0,
        ahead: 0,
        judged: std::collections::VecDeque::new(),
    };
    let (direct, mut wr) = match wr {
        Either::Left(half) => {
            let d = direct::Direct::new(half, version, ctx.metrics.bytes_out.clone());
            let _ = wakers.outlet.set(d.clone());
            (Some(d), None)
        }
        other => (None, Some(other)),
    };
    let writing = async {
        match (&direct, wr.as_mut()) {
            (Some(d), _) => match direct::writer(d, conn, &wakers, ctx, WRITE_BATCH).await {
                direct::Ended::Lost => End::Lost,
                direct::Ended::Closed => End::Closed,
                direct::Ended::SlowClient => End::SlowClient,
            },
            (None, Some(w)) => writer(w, conn, version, &wakers, ctx).await,
            (None, None) => unreachable!("a connection writes one way or the other"),
        }
    };
    // A client logged in by its certificate (a verified one always is: `authenticate`) is
    // served until the certificate expires: TLS checks the dates only at the handshake (and
    // there is no resumption to skip that).
    let expires = entry.cert.as_ref().and_then(|c| c.expires);
    let expiry = async {
        match expires {
            Some(at) => tokio::time::sleep(at.duration_since(SystemTime::now()).unwrap_or_default()).await,
            None => std::future::pending().await,
        }
    };
    let end = tokio::select! {
        biased;
        _ = ctx.shutdown.cancelled() => End::Shutdown,
        _ = expiry => End::Expired,
        end = writing => end,
        end = reader.run(&mut rd, &wakers) => end,
    };
    match end {
        End::Shutdown | End::Expired => {
            // MQTT 5 clients hear 0x8B at a shutdown, 0x87 (not authorized) when their
            // certificate expired; the core fires no will for either.
            let code = if end == End::Shutdown { reason::SERVER_SHUTTING_DOWN } else { reason::NOT_AUTHORIZED };
            if end == End::Expired {
                tracing::info!(listener = entry.listener, peer = %entry.peer, ?client_id, "client certificate expired: disconnected");
                ctx.broker.count_disconnect("certificate_expired");
            }
            let (t, _) = ctx.broker.with(|b| {
                b.disconnect(conn, code, Instant::now());
                b.poll_transmit(conn, Instant::now(), WRITE_BATCH)
            });
            match (&direct, wr.as_mut()) {
                (Some(d), _) => direct::write_last(d, &t.packets, Duration::from_secs(1)).await,
                (None, Some(w)) => {
                    let mut out = BytesMut::new();
                    t.packets.iter().for_each(|p| codec::encode(p, version, &mut out));
                    let _ = tokio::time::timeout(Duration::from_secs(1), write_flush(w, &out)).await;
                }
                (None, None) => {}
            }
        }
        End::SlowClient => {
            tracing::warn!(listener = entry.listener, peer = %entry.peer, ?client_id, "slow client disconnected: accepted no data for broker.slow_client_timeout");
            ctx.broker.count_slow_client();
        }
        End::Lost | End::Closed => {}
    }
    if let Some(w) = wr.as_mut() {
        let _ = w.shutdown().await;
    }
    // A direct socket closes once the broker forgets it (its last reference goes).
    ctx.broker.unregister(conn).await;
    drop(direct);
    tracing::debug!(listener = entry.listener, ?client_id, ?end, "connection closed");
    open.dec();
    drop(permit);
}

struct Reader<'a> {
    conn: ConnId,
    version: Version,
    identity: Identity,
    client_id: String,
    /// The ACL generation the core has this connection's rules from.
    generation: u64,
    buf: BytesMut,
    ctx: &'a Arc<FrontContext>,
    quickack: Option<socket2::Socket>,
    /// Frames taken out of `buf` so far, and the first not yet judged ([`Reader::judge_ahead`]).
    split: u64,
    ahead: u64,
    /// The schema judgments of buffered PUBLISH frames, by frame number, oldest first.
    judged: std::collections::VecDeque<(u64, Judged)>,
}

impl Reader<'_> {
    /// Feeds the core until the client goes; once the core closes the connection it only waits
    /// (the writer ends the task after the last packets).
    async fn run<R: AsyncRead + Unpin>(&mut self, rd: &mut R, wakers: &Wakers) -> End {
        let ctx = self.ctx;
        let mut deadline = ctx.broker.with(|b| next_deadline(b, self.conn)).0;
        // One timer for the connection's life, re-armed only when the deadline moves earlier: a
        // keep-alive moves later with every packet, and a timer made per read (registered in
        // the wheel, then dropped) was a tenth of what a delivered message cost the reader. A
        // timer that fires before the deadline it stood for only has the core look again.
        let timer = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(timer);
        let mut armed = None;
        loop {
            let fed = self.feed().await;
            if fed.closing {
                return std::future::pending().await;
            }
            if fed.paused {
                // MQTT 3.1.1 has no Receive Maximum to announce: past ours, the client is read
                // no further until its acknowledgements went out.
                wakers.reader.notified().await;
                continue;
            }
            if let Some(until) = fed.held {
                // A subscriber it reached is behind (`broker::core::backpressure`): read on once
                // that queue drained, or the wait is over.
                tokio::select! {
                    _ = wakers.reader.notified() => {}
                    _ = tokio::time::sleep_until(until.into()) => {
                        let (_, routed) = ctx.broker.with(|b| b.hold_expired(self.conn, Instant::now()));
                        ctx.broker.run_spool(routed).await;
                    }
                }
                continue;
            }
            deadline = fed.deadline.or(deadline);
            if let Some(at) = deadline.filter(|at| armed.is_none_or(|armed| at < &armed)) {
                timer.as_mut().reset(at.into());
                armed = Some(at);
            }
            let read = tokio::select! {
                read = rd.read_buf(&mut self.buf) => read,
                _ = &mut timer, if armed.is_some() => {
                    let (_, spool) = ctx.broker.with(|b| {
                        let now = Instant::now();
                        b.check_keep_alive(self.conn, now);
                        b.hold_expired(self.conn, now);
                    });
                    ctx.broker.run_spool(spool).await;
                    deadline = ctx.broker.with(|b| next_deadline(b, self.conn)).0;
                    armed = None;
                    continue;
                }
            };
            match read {
                Ok(0) | Err(_) => return End::Lost,
                Ok(n) => {
                    ctx.metrics.bytes_in.inc_by(n as u64);
                    // What was read is acked at once, not with our next write: an answer may wait
                    // (a PUBACK for the session store, a PUBREC for the spool) or never come (the
                    // client's own PUBACK), and a client with Nagle on holds its next packets
                    // until its last ones are acked, 40 ms behind a delayed ack.
                    #[cfg(target_os = "linux")]
                    if let Some(socket) = &self.quickack {
                        let _ = socket.set_quickack(true);
                    }
                }
            }
        }
    }

    /// Validates the payloads of the whole PUBLISH frames buffered and not yet judged whose
    /// topic a `[[schema]]` binds, before the core's lock is taken: a payload's validation
    /// costs what the payload does (a large JSON document, a deep Avro record), and under the
    /// lock every client's packets waited for it (other clients' p99 went from 10.9 to 25.8 ms
    /// under a flood of large bound publishes). The judgments wait beside their frames.
    fn judge_ahead(&mut self) {
        let Some(schemas) = &self.ctx.schemas else { return };
        let (mut at, mut frame) = (0, self.split);
        while let Ok(Some(len)) = codec::frame_len(&self.buf[at..], self.ctx.max_packet_size) {
            if frame >= self.ahead {
                if let Some((topic, payload)) = codec::publish::peek(&self.buf[at..at + len], self.version)
                    && !topic.is_empty()
                    && let Some(judged) = judge(schemas, topic, payload)
                {
                    self.judged.push_back((frame, judged));
                }
                self.ahead = frame + 1;
            }
            at += len;
            frame += 1;
        }
    }

    /// Hands every whole frame buffered to the core.
    async fn feed(&mut self) -> Fed {
        self.judge_ahead();
        let ctx = self.ctx;
        let reload = ctx.auth_generation.load(Ordering::Acquire);
        let rules = (reload != self.generation).then(|| {
            self.generation = reload;
            ctx.auth.load().rules_for(&self.identity, &self.client_id)
        });
        let (conn, version, max) = (self.conn, self.version, ctx.max_packet_size);
        let (buf, split, judged) = (&mut self.buf, &mut self.split, &mut self.judged);
        // The judgment made ahead of frame number `n`, if one was.
        let mut judgment = |n: u64| {
            while judged.front().is_some_and(|(f, _)| *f < n) {
                judged.pop_front();
            }
            judged.front().is_some_and(|(f, _)| *f == n).then(|| judged.pop_front().map(|(_, j)| j)).flatten()
        };
        let tracer = &ctx.tracer;
        let (mut fed, spool) = ctx.broker.with(|b| {
            let now = Instant::now();
            let max_user_properties = b.limits().max_user_properties;
            if let Some(rules) = rules {
                b.set_rules(conn, rules, now);
            }
            let mut fed = Fed::default();
            loop {
                if b.is_closing(conn) {
                    fed.closing = true;
                    return fed;
                }
                if version == Version::V311 && !b.wants_input(conn) {
                    fed.paused = true;
                    return fed;
                }
                if let Some(until) = b.held_until(conn) {
                    fed.held = Some(until);
                    return fed;
                }
                match codec::frame_len(buf, max) {
                    Ok(Some(len)) => {
                        let frame: Bytes = buf.split_to(len).freeze();
                        let judged = judgment(*split);
                        *split += 1;
                        // Read only with tracing on: a message with a trace context gets spans.
                        let start = tracer.is_on().then(SystemTime::now);
                        match codec::decode(frame, version, max_user_properties) {
                            Ok(Inbound::Publish(p)) if start.is_some() && !p.props.user.is_empty() => {
                                let Some(parent) = tracer.message(&p.props.user) else {
                                    b.handle_publish(conn, p, judged, now);
                                    continue;
                                };
                                let (topic, qos) = (p.topic_str().to_owned(), p.qos as u8);
                                let decoded = SystemTime::now();
                                b.handle_publish(conn, p, judged, now);
                                let start = start.unwrap_or(decoded);
                                fed.traced.push(Received {
                                    parent,
                                    topic,
                                    qos,
                                    start,
                                    decoded,
                                    handled: SystemTime::now(),
                                });
                            }
                            Ok(Inbound::Publish(p)) => b.handle_publish(conn, p, judged, now),
                            Ok(packet) => b.handle(conn, packet, now),
                            Err(e) => b.decode_error(conn, &e, now),
                        }
                    }
                    Ok(None) => {
                        fed.deadline = next_deadline(b, conn);
                        return fed;
                    }
                    Err(e) => b.decode_error(conn, &e, now),
                }
            }
        });
        for r in std::mem::take(&mut fed.traced) {
            r.record(tracer, &self.client_id);
        }
        ctx.broker.run_spool(spool).await;
        ctx.broker.store_room().await;
        fed
    }
}

/// Payloads from this size are validated with the worker handed over to the runtime's other
/// tasks (`block_in_place`): a large document takes milliseconds, and the connections queued
/// on the same worker would wait for it.
const BLOCKING_JUDGE: usize = 64 << 10;

/// [`crate::schema::Validator::judge`], off the worker's other tasks for a large payload.
fn judge(schemas: &crate::schema::Validator, topic: &str, payload: &[u8]) -> Option<Judged> {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if payload.len() >= BLOCKING_JUDGE && multi_thread {
        tokio::task::block_in_place(|| schemas.judge(topic, payload))
    } else {
        schemas.judge(topic, payload)
    }
}

/// A traced PUBLISH as the reader handled it: when its frame was taken, decoded, and handed
/// to the core (which checked it against the ACL, delivered it locally and routed it).
#[derive(Debug)]
struct Received {
    parent: TraceParent,
    topic: String,
    qos: u8,
    start: SystemTime,
    decoded: SystemTime,
    handled: SystemTime,
}

impl Received {
    /// `receive` (the frame to the core's answer) and its child `route` (the core's part),
    /// under the publisher's span.
    fn record(self, tracer: &Tracer, client_id: &str) {
        let topic = KeyValue::new("messaging.destination.name", self.topic);
        let receive_id = tracer.new_span_id();
        tracer.record(SpanRecord {
            name: "route",
            kind: SpanKind::Internal,
            parent: &self.parent.child(receive_id),
            start: self.decoded,
            end: self.handled,
            attributes: vec![topic.clone()],
            id: None,
        });
        tracer.record(SpanRecord {
            name: "receive",
            kind: SpanKind::Consumer,
            parent: &self.parent,
            start: self.start,
            end: self.handled,
            attributes: vec![
                KeyValue::new("messaging.system", "mqtt"),
                KeyValue::new("messaging.operation.type", "receive"),
                topic,
                KeyValue::new("messaging.client.id", client_id.to_owned()),
                KeyValue::new("mqtt.qos", i64::from(self.qos)),
            ],
            id: Some(receive_id),
        });
    }
}

/// What one [`Reader::feed`] left.
#[derive(Debug, Default)]
struct Fed {
    /// The core is closing the connection.
    closing: bool,
    /// Reading is paused (MQTT 3.1.1 past our Receive Maximum).
    paused: bool,
    /// Reading is held until then by a subscriber's queue (`broker::core::backpressure`).
    held: Option<Instant>,
    /// When the client's keep-alive runs out, if it has one: read under the same lock as the
    /// frames, which saves taking it once more per read.
    deadline: Option<Instant>,
    /// Traced PUBLISHes, whose spans are recorded once the core's lock is released.
    traced: Vec<Received>,
}

/// Sends what the core has for the client whenever it says there is some; returns once the
/// core closed the connection and its last packets are written.
async fn writer<W: AsyncWrite + Unpin>(
    wr: &mut W,
    conn: ConnId,
    version: Version,
    wakers: &Wakers,
    ctx: &FrontContext,
) -> End {
    let mut out = BytesMut::with_capacity(16 * 1024);
    loop {
        wakers.writer.notified().await;
        loop {
            let (t, _) = ctx.broker.with(|b| b.poll_transmit(conn, Instant::now(), WRITE_BATCH));
            for packet in &t.packets {
                codec::encode(packet, version, &mut out);
            }
            if !out.is_empty() {
                match tokio::time::timeout(ctx.slow_client_timeout, write_flush(wr, &out)).await {
                    Ok(Ok(())) => {
                        ctx.metrics.bytes_out.inc_by(out.len() as u64);
                    }
                    Ok(Err(_)) => return End::Lost,
                    Err(_) => return End::SlowClient,
                }
                out.clear();
                // The writer's memory stays small whatever one batch held.
                if out.capacity() > 4 * WRITE_BATCH {
                    out = BytesMut::with_capacity(16 * 1024);
                }
            }
            if t.closing {
                return End::Closed;
            }
            // The reader may be paused waiting for these acknowledgements to go out.
            wakers.reader.notify_one();
            if !t.more {
                break;
            }
        }
    }
}

/// The reader's next timer: the keep-alive, or the end of a hold on its acknowledgements
/// (`broker::core::backpressure`).
fn next_deadline(b: &crate::broker::core::Broker, conn: ConnId) -> Option<Instant> {
    let keep_alive = b.keep_alive_deadline(conn);
    b.hold_deadline(conn).into_iter().chain(keep_alive).min()
}

/// Reads until `buf` holds the first frame and splits it off; `Ok(None)` on EOF. Anything that
/// does not start like a CONNECT is refused at its first byte, not after a timeout.
async fn read_first<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    max: usize,
) -> Result<Option<Bytes>, DecodeError> {
    loop {
        if buf.first().is_some_and(|&b| b != 0x10) {
            return Err(DecodeError::Protocol("the first packet is not a CONNECT"));
        }
        if let Some(len) = codec::frame_len(buf, max)? {
            return Ok(Some(buf.split_to(len).freeze()));
        }
        match rd.read_buf(buf).await {
            Ok(0) | Err(_) => return Ok(None),
            Ok(_) => {}
        }
    }
}

async fn write_connack<W: AsyncWrite + Unpin>(wr: &mut W, version: Version, code: u8) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    codec::encode(&Outbound::ConnAck { session_present: false, code, props: Box::default() }, version, &mut out);
    write_flush(wr, &out).await
}

async fn write_flush<W: AsyncWrite + Unpin>(wr: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    wr.write_all(bytes).await?;
    wr.flush().await
}
