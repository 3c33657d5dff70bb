//! The two relays of an admitted connection. Upstream (client to broker) parses every packet
//! and decides on PUBLISH and SUBSCRIBE; downstream (broker to client) only frames, counts, and
//! rebuilds trimmed SUBACKs. Both run in the connection's task; a packet the front answers
//! itself (a refused PUBLISH's PUBACK, a SUBACK) goes to the client through the downstream side,
//! so writes to the client never interleave mid-packet.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rumqttd::protocol::{Packet, Protocol, v4::V4, v5::V5};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::FrontContext;
use super::acks::AckOrder;
use super::compat;
use super::connect::Admitted;
use super::packet::{self, PacketError, Version, reason};
use crate::auth::{Identity, Rules};
use crate::labels::{self, class_label, handle};
use crate::route::{Class, Route};
use crate::spool::{AppendError, Message, Properties, Seq};

/// rumqttd's limit for client topic aliases (it advertises it in CONNACK).
const TOPIC_ALIAS_MAX: u16 = 4096;

/// Why a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    ClientClosed,
    BrokerClosed,
    Shutdown,
    SlowClient,
    /// The client broke a rule; the label is the metric reason, the code the MQTT 5 reason.
    Violation(&'static str, u8),
}

/// Read-only state both relays use.
pub(super) struct Shared<'a> {
    version: Version,
    /// The connection is the node's own SLO probe. Every other connection has probe messages
    /// filtered out, so a `#` subscriber does not see them.
    internal: bool,
    ctx: &'a FrontContext,
    counters: Counters,
    inflight: Inflight,
    /// SUBACKs to rebuild, by packet id: `None` where the filter was forwarded.
    suback_merges: Mutex<HashMap<u16, Vec<Option<u8>>>>,
    acks: Mutex<AckOrder>,
    /// PUBACKs were queued by the front since the downstream relay was last woken.
    acks_queued: AtomicBool,
}

/// Metric handles resolved once per connection.
struct Counters {
    publish_in: Counter,
    publish_in_probe: Counter,
    publish_out: Counter,
    publish_out_probe: Counter,
    refused_acl: Counter,
    refused_invalid: Counter,
    sub_refused_acl: Counter,
    sub_refused_invalid: Counter,
    bytes_in: Counter,
    bytes_out: Counter,
}

/// QoS1 messages this connection has in flight, so the shared gauge is corrected when it ends.
struct Inflight {
    gauge: Gauge,
    mine: AtomicI64,
}

impl Inflight {
    fn add(&self, n: i64) {
        self.gauge.inc_by(n);
        self.mine.fetch_add(n, Ordering::Relaxed);
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.gauge.dec_by(self.mine.load(Ordering::Relaxed));
    }
}

impl<'a> Shared<'a> {
    pub(super) fn new(version: Version, internal: bool, ctx: &'a FrontContext) -> Self {
        let m = &ctx.metrics;
        let class = class_label;
        let counters = Counters {
            publish_in: handle(&m.publish_in, &class("default")),
            publish_in_probe: handle(&m.publish_in, &class("probe")),
            publish_out: handle(&m.publish_out, &class("default")),
            publish_out_probe: handle(&m.publish_out, &class("probe")),
            refused_acl: handle(&m.publish_refused, &labels::reason("acl")),
            refused_invalid: handle(&m.publish_refused, &labels::reason("invalid_topic")),
            sub_refused_acl: handle(&m.subscribe_refused, &labels::reason("acl")),
            sub_refused_invalid: handle(&m.subscribe_refused, &labels::reason("invalid_filter")),
            bytes_in: m.bytes_in.clone(),
            bytes_out: m.bytes_out.clone(),
        };
        Self {
            version,
            internal,
            ctx,
            counters,
            inflight: Inflight { gauge: m.qos1_inflight.clone(), mine: AtomicI64::new(0) },
            suback_merges: Mutex::new(HashMap::new()),
            acks: Mutex::new(AckOrder::default()),
            acks_queued: AtomicBool::new(false),
        }
    }

    /// A PUBACK the front gives itself, queued in publish order. The downstream relay sends it
    /// when [`Shared::wake_for_acks`] wakes it, once per read buffer rather than once per
    /// PUBACK: a burst of publishes answered by the front costs one wake-up and one write.
    fn front_puback(&self, pkid: u16, code: u8) {
        if let Ok(mut acks) = self.acks.lock() {
            acks.ready(pkid, ack(packet::PUBACK, pkid, code, self.version));
        }
        self.acks_queued.store(true, Ordering::Release);
    }

    /// Wakes the downstream relay (an empty injection) if the front queued PUBACKs.
    async fn wake_for_acks(&self, inject: &mpsc::Sender<Bytes>) -> Result<(), End> {
        if self.acks_queued.swap(false, Ordering::AcqRel) {
            send(inject, Bytes::new()).await?;
        }
        Ok(())
    }

    /// A `full` message the spool could not take is never acknowledged and never delivered.
    /// MQTT 5 gets a PUBACK with this code: 0x97 (no room) or 0x80 (the commit failed).
    /// MQTT 3.1.1 has no such codes (`None`): the connection closes without a PUBACK and the
    /// client will resend.
    fn spool_refusal(&self, class: &str, e: AppendError) -> Option<u8> {
        tracing::warn!(class, error = %e, "publish refused by the spool");
        let code = if e == AppendError::Refused { reason::QUOTA_EXCEEDED } else { reason::UNSPECIFIED };
        (self.version == Version::V5).then_some(code)
    }

    fn drain_acks(&self) -> BytesMut {
        let mut out = BytesMut::new();
        if let Ok(mut acks) = self.acks.lock() {
            acks.drain(&mut out);
        }
        out
    }

    fn is_probe(&self, topic: &[u8]) -> bool {
        topic == self.ctx.probe_topic.as_bytes()
    }
}

/// State only the upstream relay touches.
pub(super) struct Upstream {
    identity: Identity,
    pub(super) client_id: String,
    rules: Arc<Rules>,
    rules_generation: u64,
    /// Topic aliases the client set: the topic, and whether rumqttd holds the same mapping
    /// (it does not when the publish that set it was refused).
    aliases: HashMap<u16, (Bytes, bool)>,
    /// QoS2 publishes the front answered itself (refused on MQTT 3.1.1, or spooled for the
    /// cloud only), whose PUBREL it also answers.
    answered_qos2: HashSet<u16>,
    /// `full` QoS1 publishes for the cloud only whose PUBACK waits for their commit, oldest
    /// first (the spool commits in order). The client's next publishes are read meanwhile, so
    /// one connection's publishes share group commits instead of taking one commit each.
    commits: VecDeque<PendingCommit>,
}

struct PendingCommit {
    pkid: u16,
    class: String,
    done: oneshot::Receiver<Result<Seq, AppendError>>,
}

/// Most commits one connection may wait for before the front stops reading it.
const MAX_PENDING_COMMITS: usize = 4096;

impl Upstream {
    pub(super) fn new(admitted: Admitted, ctx: &FrontContext) -> Self {
        Self {
            identity: admitted.identity,
            client_id: admitted.client_id,
            rules: admitted.rules,
            rules_generation: ctx.auth_generation.load(Ordering::Acquire),
            aliases: HashMap::new(),
            answered_qos2: HashSet::new(),
            commits: VecDeque::new(),
        }
    }
}

/// Relays until either side closes, a rule is broken, or the node shuts down.
pub(super) async fn relay<R, W, BR, BW>(
    sh: &Shared<'_>,
    up: &mut Upstream,
    rd: &mut R,
    wr: &mut W,
    mut brd: BR,
    mut bwr: BW,
    leftover: BytesMut,
) -> End
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    BR: AsyncRead + Unpin,
    BW: AsyncWrite + Unpin,
{
    let (inject_tx, mut inject_rx) = mpsc::channel::<Bytes>(64);
    let (to_broker_tx, mut to_broker_rx) = mpsc::channel::<Bytes>(64);
    let end = {
        let upstream = upstream(sh, up, rd, &mut bwr, leftover, inject_tx, &mut to_broker_rx);
        let downstream = downstream(sh, &mut brd, wr, &mut inject_rx, to_broker_tx);
        tokio::select! {
            biased;
            _ = sh.ctx.shutdown.cancelled() => End::Shutdown,
            end = upstream => end,
            end = downstream => end,
        }
    };
    // rumqttd sees the client leave (and fires its will unless it sent DISCONNECT).
    let _ = bwr.shutdown().await;
    end
}

async fn upstream<R, BW>(
    sh: &Shared<'_>,
    st: &mut Upstream,
    rd: &mut R,
    bwr: &mut BW,
    mut buf: BytesMut,
    inject: mpsc::Sender<Bytes>,
    to_broker: &mut mpsc::Receiver<Bytes>,
) -> End
where
    R: AsyncRead + Unpin,
    BW: AsyncWrite + Unpin,
{
    let mut out = BytesMut::with_capacity(16 * 1024);
    loop {
        loop {
            let len = match packet::frame_len(&buf, sh.ctx.max_packet_size) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(PacketError::TooLarge { size, max }) => {
                    tracing::info!(client_id = %st.client_id, size, max, "packet over broker.max_packet_size");
                    return End::Violation("packet_too_large", reason::PACKET_TOO_LARGE);
                }
                Err(_) => return End::Violation("malformed", reason::MALFORMED),
            };
            let frame = buf.split_to(len);
            if let Err(end) = st.on_frame(sh, &frame, &mut out, &inject).await {
                return end;
            }
        }
        if let Err(end) = sh.wake_for_acks(&inject).await {
            return end;
        }
        if !out.is_empty() {
            if bwr.write_all(&out).await.is_err() {
                return End::BrokerClosed;
            }
            out.clear();
        }
        let reading = st.commits.len() < MAX_PENDING_COMMITS;
        let next_commit = async {
            match st.commits.front_mut() {
                Some(c) => (&mut c.done).await.unwrap_or(Err(AppendError::Stopped)),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            committed = next_commit => {
                // This commit and any after it that finished too (a group commit answers many).
                let mut committed = Some(committed);
                while let Some(result) = committed.take() {
                    let Some(c) = st.commits.pop_front() else { break };
                    let code = match result {
                        Ok(_) => 0,
                        Err(e) => match sh.spool_refusal(&c.class, e) {
                            Some(code) => code,
                            None => return End::Violation("spool_refused", reason::UNSPECIFIED),
                        },
                    };
                    sh.front_puback(c.pkid, code);
                    committed = st.commits.front_mut().and_then(|c| match c.done.try_recv() {
                        Ok(r) => Some(r),
                        Err(oneshot::error::TryRecvError::Empty) => None,
                        Err(oneshot::error::TryRecvError::Closed) => Some(Err(AppendError::Stopped)),
                    });
                }
            }
            read = rd.read_buf(&mut buf), if reading => match read {
                Ok(0) | Err(_) => return End::ClientClosed,
                Ok(n) => {
                    sh.counters.bytes_in.inc_by(n as u64);
                }
            },
            // Acks for probe messages the downstream relay filtered out.
            Some(ack) = to_broker.recv() => {
                if bwr.write_all(&ack).await.is_err() {
                    return End::BrokerClosed;
                }
            }
        }
    }
}

impl Upstream {
    async fn on_frame(
        &mut self,
        sh: &Shared<'_>,
        frame: &[u8],
        out: &mut BytesMut,
        inject: &mpsc::Sender<Bytes>,
    ) -> Result<(), End> {
        match packet::packet_type(frame) {
            packet::PUBLISH => self.on_publish(sh, frame, out, inject).await,
            packet::SUBSCRIBE => self.on_subscribe(sh, frame, out, inject).await,
            packet::PUBREL => {
                match packet::ack_pkid(frame) {
                    Some(pkid) if self.answered_qos2.remove(&pkid) => {
                        send(inject, ack(packet::PUBCOMP, pkid, 0, sh.version)).await?;
                    }
                    _ => sh.forward(frame, out)?,
                }
                Ok(())
            }
            packet::PUBACK => {
                sh.inflight.add(-1);
                sh.forward(frame, out)?;
                Ok(())
            }
            packet::CONNECT => Err(End::Violation("protocol_error", reason::PROTOCOL_ERROR)),
            _ => {
                sh.forward(frame, out)?;
                Ok(())
            }
        }
    }

    /// Picks up ACL changes from a reload.
    fn refresh_rules(&mut self, ctx: &FrontContext) {
        let generation = ctx.auth_generation.load(Ordering::Acquire);
        if generation != self.rules_generation {
            self.rules = ctx.auth.load().rules_for(&self.identity, &self.client_id);
            self.rules_generation = generation;
        }
    }

    async fn on_publish(
        &mut self,
        sh: &Shared<'_>,
        frame: &[u8],
        out: &mut BytesMut,
        inject: &mpsc::Sender<Bytes>,
    ) -> Result<(), End> {
        let view =
            packet::parse_publish(frame, sh.version).map_err(|_| End::Violation("malformed", reason::MALFORMED))?;
        if view.topic_alias.is_some_and(|a| a > TOPIC_ALIAS_MAX) {
            return Err(End::Violation("topic_alias_invalid", reason::TOPIC_ALIAS_INVALID));
        }
        // Borrowed from the frame on the common path; only alias use and alias setting copy.
        let aliased: Bytes;
        let topic: &[u8] = if view.topic.is_empty() {
            let alias = view.topic_alias.ok_or(End::Violation("invalid_topic", reason::TOPIC_NAME_INVALID))?;
            match self.aliases.get(&alias) {
                Some((t, _)) => {
                    aliased = t.clone();
                    &aliased
                }
                None => return Err(End::Violation("topic_alias_invalid", reason::TOPIC_ALIAS_INVALID)),
            }
        } else {
            view.topic
        };
        let Some(topic_str) = std::str::from_utf8(topic).ok().filter(|t| shared::topic::validate_name(t).is_ok())
        else {
            sh.counters.refused_invalid.inc();
            return Err(End::Violation("invalid_topic", reason::TOPIC_NAME_INVALID));
        };
        self.refresh_rules(sh.ctx);
        let allowed = self.rules.may_publish(topic_str);

        if !allowed {
            if let (Some(alias), false) = (view.topic_alias, view.topic.is_empty()) {
                self.aliases.insert(alias, (Bytes::copy_from_slice(topic), false));
            }
            sh.counters.refused_acl.inc();
            tracing::debug!(user = self.identity.name(), client_id = %self.client_id, topic = topic_str, "publish refused by ACL");
            match view.qos {
                1 => sh.front_puback(view.pkid, reason::NOT_AUTHORIZED),
                2 => {
                    send(inject, ack(packet::PUBREC, view.pkid, reason::NOT_AUTHORIZED, sh.version)).await?;
                    if sh.version == Version::V311 {
                        self.answered_qos2.insert(view.pkid);
                    }
                }
                _ => {}
            }
            return Ok(());
        }

        let class = sh.ctx.classes.classify(topic_str);
        if let Some(class) = class {
            class.count(frame.len());
        }
        let route = class.map_or(Route::EdgeDirect, Class::route);
        if let (Some(class), Some(spool), Route::Central | Route::Both) = (class, &sh.ctx.spool, route) {
            let message = spooled_message(frame, sh.version, topic_str, class, view.qos)?;
            let appended = spool.append(class.lane, message, class.durability).await;
            let committed = match appended {
                // Not for local subscribers and QoS1: the PUBACK waits for the commit, in
                // publish order, while the publishes behind it are read.
                Ok(Some(done)) if route == Route::Central && view.qos == 1 => {
                    if let Ok(mut acks) = sh.acks.lock() {
                        acks.expect(view.pkid);
                    }
                    self.commits.push_back(PendingCommit { pkid: view.pkid, class: class.name.clone(), done });
                    if let (Some(alias), false) = (view.topic_alias, view.topic.is_empty()) {
                        self.aliases.insert(alias, (Bytes::copy_from_slice(topic), false));
                    }
                    sh.counters.publish_in.inc();
                    return Ok(());
                }
                Ok(Some(done)) => done.await.unwrap_or(Err(AppendError::Stopped)).map(|_| ()),
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = committed {
                return match (view.qos, sh.spool_refusal(&class.name, e)) {
                    (0, _) => Ok(()),
                    (_, Some(code)) => {
                        sh.front_puback(view.pkid, code);
                        Ok(())
                    }
                    (_, None) => Err(End::Violation("spool_refused", reason::UNSPECIFIED)),
                };
            }
            if route == Route::Central {
                // Not for local subscribers: the front answers for the broker.
                if let (Some(alias), false) = (view.topic_alias, view.topic.is_empty()) {
                    self.aliases.insert(alias, (Bytes::copy_from_slice(topic), false));
                }
                sh.counters.publish_in.inc();
                return match view.qos {
                    1 => {
                        sh.front_puback(view.pkid, 0);
                        Ok(())
                    }
                    2 => {
                        send(inject, ack(packet::PUBREC, view.pkid, 0, sh.version)).await?;
                        self.answered_qos2.insert(view.pkid);
                        Ok(())
                    }
                    _ => Ok(()),
                };
            }
        }

        match view.topic_alias {
            Some(alias) if !view.topic.is_empty() => {
                self.aliases.insert(alias, (Bytes::copy_from_slice(topic), true));
                sh.forward(frame, out)?;
            }
            Some(alias) if !self.aliases.get(&alias).is_some_and(|(_, known)| *known) => {
                // rumqttd maps this alias to an older topic: send the topic in full once.
                let topic = Bytes::copy_from_slice(topic);
                rewrite_with_topic(frame, topic.clone(), out)?;
                self.aliases.insert(alias, (topic, true));
            }
            _ => sh.forward(frame, out)?,
        }
        if sh.is_probe(topic) {
            sh.counters.publish_in_probe.inc();
        } else {
            sh.counters.publish_in.inc();
        }
        if view.qos == 1 {
            sh.inflight.add(1);
            if let Ok(mut acks) = sh.acks.lock() {
                acks.expect(view.pkid);
            }
        }
        Ok(())
    }

    async fn on_subscribe(
        &mut self,
        sh: &Shared<'_>,
        frame: &[u8],
        out: &mut BytesMut,
        inject: &mpsc::Sender<Bytes>,
    ) -> Result<(), End> {
        let mut copy = BytesMut::from(frame);
        let decoded = match sh.version {
            Version::V311 => V4.read_mut(&mut copy, usize::MAX),
            Version::V5 => V5.read_mut(&mut copy, usize::MAX),
        };
        let Ok(Packet::Subscribe(mut subscribe, props)) = decoded else {
            return Err(End::Violation("malformed", reason::MALFORMED));
        };
        self.refresh_rules(sh.ctx);
        let (acl_code, invalid_code) = match sh.version {
            Version::V311 => (reason::V4_SUBACK_FAILURE, reason::V4_SUBACK_FAILURE),
            Version::V5 => (reason::NOT_AUTHORIZED, reason::TOPIC_FILTER_INVALID),
        };
        let refusals: Vec<Option<u8>> = subscribe
            .filters
            .iter()
            .map(|f| {
                if shared::topic::validate_filter(&f.path).is_err() {
                    sh.counters.sub_refused_invalid.inc();
                    Some(invalid_code)
                } else if !self.rules.may_subscribe(&f.path) {
                    sh.counters.sub_refused_acl.inc();
                    tracing::debug!(user = self.identity.name(), client_id = %self.client_id, filter = %f.path, "subscription refused by ACL");
                    Some(acl_code)
                } else {
                    None
                }
            })
            .collect();

        if refusals.iter().all(Option::is_none) {
            sh.forward(frame, out)?;
            return Ok(());
        }
        if refusals.iter().all(Option::is_some) {
            let codes: Vec<u8> = refusals.iter().flatten().copied().collect();
            let mut suback = BytesMut::new();
            packet::write_suback(&mut suback, subscribe.pkid, &codes, sh.version);
            return send(inject, suback.freeze()).await;
        }
        let mut kept = refusals.iter();
        subscribe.filters.retain(|_| kept.next().is_some_and(Option::is_none));
        let pkid = subscribe.pkid;
        if let Ok(mut merges) = sh.suback_merges.lock() {
            merges.insert(pkid, refusals);
        }
        // MQTT 5 towards the broker either way (a 3.1.1 SUBSCRIBE has no properties).
        let written = V5.write(Packet::Subscribe(subscribe, props), out);
        written.map(|_| ()).map_err(|_| End::Violation("malformed", reason::MALFORMED))
    }
}

/// The spool record for an allowed publish: payload and MQTT 5 properties from the frame, the
/// expiry from the class TTL or the message expiry interval, whichever is sooner.
fn spooled_message(frame: &[u8], version: Version, topic: &str, class: &Class, qos: u8) -> Result<Message, End> {
    const MALFORMED: End = End::Violation("malformed", reason::MALFORMED);
    let mut copy = BytesMut::from(frame);
    let (payload, props) = match version {
        Version::V311 => match V4.read_mut(&mut copy, usize::MAX) {
            Ok(Packet::Publish(p, _)) => (p.payload, None),
            _ => return Err(MALFORMED),
        },
        Version::V5 => match V5.read_mut(&mut copy, usize::MAX) {
            Ok(Packet::Publish(p, props)) => (p.payload, props),
            _ => return Err(MALFORMED),
        },
    };
    let now = shared::units::now_ms();
    let from_message = props.as_ref().and_then(|p| p.message_expiry_interval).map(|s| now + u64::from(s) * 1000);
    let from_class = class.ttl_ms.map(|t| now + t);
    let expires_ms = match (from_message, from_class) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let properties = props
        .map(|p| Properties {
            user: p.user_properties,
            correlation_data: p.correlation_data,
            content_type: p.content_type,
        })
        .unwrap_or_default();
    Ok(Message {
        class: class.name.clone(),
        topic: topic.to_owned(),
        payload,
        qos,
        enqueued_ms: now,
        expires_ms,
        properties,
    })
}

fn rewrite_with_topic(frame: &[u8], topic: Bytes, out: &mut BytesMut) -> Result<(), End> {
    let mut copy = BytesMut::from(frame);
    match V5.read_mut(&mut copy, usize::MAX) {
        Ok(Packet::Publish(mut publish, props)) => {
            publish.topic = topic;
            V5.write(Packet::Publish(publish, props), out)
                .map(|_| ())
                .map_err(|_| End::Violation("malformed", reason::MALFORMED))
        }
        _ => Err(End::Violation("malformed", reason::MALFORMED)),
    }
}

fn ack(kind: u8, pkid: u16, code: u8, version: Version) -> Bytes {
    let mut b = BytesMut::with_capacity(4);
    packet::write_ack(&mut b, kind, pkid, code, version);
    b.freeze()
}

async fn send(inject: &mpsc::Sender<Bytes>, bytes: Bytes) -> Result<(), End> {
    inject.send(bytes).await.map_err(|_| End::ClientClosed)
}

async fn downstream<BR, W>(
    sh: &Shared<'_>,
    brd: &mut BR,
    wr: &mut W,
    inject: &mut mpsc::Receiver<Bytes>,
    to_broker: mpsc::Sender<Bytes>,
) -> End
where
    BR: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(16 * 1024);
    // Offsets of the frames in a batch that do not go to the client as they are (held PUBACKs,
    // filtered probe messages); reused across batches.
    let mut dropped: Vec<usize> = Vec::new();
    loop {
        tokio::select! {
            biased;
            Some(bytes) = inject.recv() => {
                let mut out = BytesMut::from(&bytes[..]);
                out.extend_from_slice(&sh.drain_acks());
                if !out.is_empty()
                    && let Err(end) = write_client(sh, wr, &out).await
                {
                    return end;
                }
                continue;
            }
            read = brd.read_buf(&mut buf) => match read {
                Ok(0) | Err(_) => return End::BrokerClosed,
                Ok(_) => {}
            },
        }
        let mut complete = 0;
        let mut rewrite = false;
        dropped.clear();
        while let Ok(Some(len)) = packet::frame_len(&buf[complete..], usize::MAX) {
            let frame = &buf[complete..complete + len];
            match packet::packet_type(frame) {
                packet::PUBLISH => match sh.count_out(frame) {
                    Delivery::Forward => {}
                    Delivery::Filter { ack } => {
                        rewrite = true;
                        dropped.push(complete);
                        if let Some(ack) = ack
                            && to_broker.send(ack).await.is_err()
                        {
                            return End::BrokerClosed;
                        }
                    }
                },
                packet::PUBACK => {
                    // Goes out through the ack order, translated for MQTT 3.1.1 clients.
                    sh.inflight.add(-1);
                    sh.hold_puback(frame);
                    rewrite = true;
                    dropped.push(complete);
                }
                packet::SUBACK => rewrite |= sh.has_merge(frame),
                _ => {}
            }
            complete += len;
        }
        if complete == 0 {
            continue;
        }
        let frames = buf.split_to(complete);
        // MQTT 3.1.1 clients always get rebuilt (translated) frames.
        let result = if rewrite || sh.version == Version::V311 {
            let mut out = sh.rebuild(&frames, &dropped);
            out.extend_from_slice(&sh.drain_acks());
            write_client(sh, wr, &out).await
        } else {
            write_client(sh, wr, &frames).await
        };
        if let Err(end) = result {
            return end;
        }
    }
}

/// What happens to a PUBLISH on its way to the client.
enum Delivery {
    Forward,
    /// Dropped (a probe message for a client); a QoS1 one is acknowledged to the broker here.
    Filter {
        ack: Option<Bytes>,
    },
}

impl Shared<'_> {
    /// Counts a PUBLISH going to the client and decides whether it goes.
    fn count_out(&self, frame: &[u8]) -> Delivery {
        // The topic and packet id sit at the same place in MQTT 3.1.1 and 5 frames.
        let Ok(view) = packet::parse_publish(frame, Version::V311) else {
            self.counters.publish_out.inc();
            return Delivery::Forward;
        };
        if self.is_probe(view.topic) {
            self.counters.publish_out_probe.inc();
            if !self.internal {
                let ack = (view.qos == 1).then(|| ack(packet::PUBACK, view.pkid, 0, self.version));
                return Delivery::Filter { ack };
            }
        } else {
            self.counters.publish_out.inc();
        }
        if view.qos == 1 {
            self.inflight.add(1);
        }
        Delivery::Forward
    }

    /// Queues a broker PUBACK in the ack order, in the client's protocol version.
    fn hold_puback(&self, frame: &[u8]) {
        let Some(pkid) = packet::ack_pkid(frame) else { return };
        let client_frame = match self.version {
            Version::V5 => Bytes::copy_from_slice(frame),
            Version::V311 => {
                let mut out = BytesMut::with_capacity(4);
                if compat::downstream(frame, &mut out).is_err() {
                    return;
                }
                out.freeze()
            }
        };
        if let Ok(mut acks) = self.acks.lock() {
            acks.ready(pkid, client_frame);
        }
    }

    fn has_merge(&self, frame: &[u8]) -> bool {
        let Some(pkid) = packet::ack_pkid(frame) else {
            return false;
        };
        self.suback_merges.lock().is_ok_and(|m| m.contains_key(&pkid))
    }

    /// Forwards a client packet to the broker, translated for MQTT 3.1.1 clients.
    fn forward(&self, frame: &[u8], out: &mut BytesMut) -> Result<(), End> {
        match self.version {
            Version::V5 => {
                out.extend_from_slice(frame);
                Ok(())
            }
            Version::V311 => compat::upstream(frame, out).map_err(|_| End::Violation("malformed", reason::MALFORMED)),
        }
    }

    /// The broker's frames as the client gets them: the frames starting at `dropped` (sorted
    /// offsets the scan decided on) left out, trimmed SUBACKs rebuilt, and everything translated
    /// for MQTT 3.1.1 clients.
    fn rebuild(&self, frames: &[u8], dropped: &[usize]) -> BytesMut {
        let mut out = BytesMut::with_capacity(frames.len() + 16);
        let mut at = 0;
        let mut dropped = dropped.iter().peekable();
        while let Ok(Some(len)) = packet::frame_len(&frames[at..], usize::MAX) {
            let frame = &frames[at..at + len];
            let start = at;
            at += len;
            if dropped.next_if(|d| **d == start).is_some() {
                continue;
            }
            let merged = (packet::packet_type(frame) == packet::SUBACK)
                .then(|| packet::ack_pkid(frame))
                .flatten()
                .and_then(|pkid| self.suback_merges.lock().ok()?.remove(&pkid))
                .and_then(|refusals| packet::merge_suback(frame, Version::V5, &refusals));
            let frame = merged.as_deref().unwrap_or(frame);
            match self.version {
                Version::V5 => out.extend_from_slice(frame),
                Version::V311 => {
                    if let Err(e) = compat::downstream(frame, &mut out) {
                        tracing::warn!(error = %e, "broker packet not translatable for an MQTT 3.1.1 client; dropped");
                    }
                }
            }
        }
        out
    }
}

async fn write_client<W: AsyncWrite + Unpin>(sh: &Shared<'_>, wr: &mut W, bytes: &[u8]) -> Result<(), End> {
    // TLS streams buffer records until flushed; for TCP the flush is free.
    let write = async {
        wr.write_all(bytes).await?;
        wr.flush().await
    };
    match tokio::time::timeout(sh.ctx.slow_client_timeout, write).await {
        Ok(Ok(())) => {
            sh.counters.bytes_out.inc_by(bytes.len() as u64);
            Ok(())
        }
        Ok(Err(_)) => Err(End::ClientClosed),
        Err(_) => Err(End::SlowClient),
    }
}
