//! The uplink: drains the spool to a cloud bridge over QUIC (ehb/1) and deletes what the cloud
//! acknowledged. The protocol rules live in `shared::proto::edge::EdgeSession`; this module
//! does the I/O around it: connecting with jittered exponential backoff, reading windows from
//! the spool lane by lane ([`DrainOrder`]), sending each batch on its own unidirectional stream,
//! and applying acks to the spool.

mod config;
pub mod core;
pub(crate) mod dict;
pub(crate) mod drain;
pub mod pack;
pub mod quic;
pub mod reach;
mod traced;

pub use config::{Congestion, DEFAULT_BATCH_RECORDS, UplinkConfig};

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use rand::Rng;
use shared::proto::edge::{EdgeSession, SessionError};
use shared::proto::io::{FrameIoError, spawn_reader, write_frame};
use shared::proto::{Control, MAX_CONTROL_FRAME, ProtoError, WireGap, WireMessage, WireRecord};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use self::core::{Attempt, Conn, ConnError, Dialer, EndKind, Io, Next, SendPolicy};
use self::pack::{Packed, Packer};
use self::quic::{PassWriter, SendError};
use self::reach::{Prober, ReachMetrics, Target};
use crate::downlink::{DownCore, Live};
use crate::labels::handle;
use crate::models::sync::ModelJob;
use crate::spool::{Body, Lane, ReadError, Record, Seq, SpoolWriter};
use crate::tco::{LinkFigures, Snapshot};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LaneLabel {
    pub lane: u8,
}

shared::metrics! {
    /// The uplink's metrics.
    #[derive(Debug, Clone)]
    pub(crate) struct UplinkMetrics {
        pub connected: Gauge => ("uplink_connected", "1 while a session with the cloud bridge is up"),
        pub degraded: Gauge => (
            "uplink_degraded",
            "1 while connected but a batch or ping waits longer than ack_timeout for its answer"
        ),
        pub rtt: Gauge<f64, std::sync::atomic::AtomicU64> => (
            "uplink_rtt",
            "Last ping round trip to the cloud bridge",
            unit Seconds
        ),
        pub in_flight: Gauge => ("uplink_batches_in_flight", "Batches sent and not yet acked"),
        pub batches: Counter => ("uplink_batches", "Batches sent"),
        pub records: Counter => ("uplink_records", "Records sent (resends included)"),
        pub bytes_raw: Counter => ("uplink_raw_bytes", "Batch bytes before compression"),
        pub bytes_sent: Counter => ("uplink_sent_bytes", "Batch bytes sent, after compression"),
        pub frame_bytes: Counter => ("uplink_frame_bytes", "Batch frames sent: head and compressed body"),
        pub lane_raw: Family<LaneLabel, Counter> => (
            "uplink_lane_raw_bytes",
            "Batch bytes before compression, by lane"
        ),
        pub lane_sent: Family<LaneLabel, Counter> => (
            "uplink_lane_sent_bytes",
            "Batch bytes sent, after compression, by lane"
        ),
        pub acked: Family<LaneLabel, Gauge> => ("uplink_acked_seq", "Highest seq the cloud acked, by lane"),
        pub reconnects: Counter => ("uplink_reconnects", "Connection attempts after the first, failed or lost"),
        pub records_refused: Counter => (
            "uplink_records_refused",
            "Records sent as refused gap records because alone they would cost a bridge more than the protocol's per-batch memory limit to decode"
        ),
        pub refused: Counter => (
            "uplink_refused",
            "Times the cloud bridge turned this edge away (certificate denied or not accepted, hello refused); retried at backoff_max"
        ),
        pub busy: Counter => (
            "uplink_busy",
            "Handshakes the cloud bridge refused before TLS, its admission spent; retried within a window that starts at 2s and doubles up to backoff_max"
        ),
        pub probes: ReachMetrics => (nested),
        pub dicts_trained: Counter => ("uplink_dicts_trained", "zstd dictionaries trained from this edge's traffic"),
        pub dicts_announced: Counter => (
            "uplink_dicts_announced",
            "Dictionaries sent to a bridge that did not hold them yet"
        ),
        pub dict_batches: Counter => ("uplink_dict_batches", "Batches compressed with a dictionary"),
        pub commit_latency: Histogram => (
            "uplink_commit_latency",
            "From sending a batch to the bridge's ack, which follows the sink's commit: edge-to-central commit latency",
            unit Seconds,
            // 1 ms .. ~33 s
            init Histogram::new(exponential_buckets(0.001, 2.0, 16))
        ),
    }
}

impl UplinkMetrics {
    /// The uplink's metrics, registered in `r`.
    pub(crate) fn new(r: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self::default();
        m.register(r);
        m
    }
}

#[derive(Debug, thiserror::Error)]
enum ConnEnd {
    #[error("connect: {0}")]
    Connect(String),
    #[error("handshake: {0}")]
    Handshake(quinn::ConnectionError),
    #[error("connection lost: {0}")]
    Connection(#[from] quinn::ConnectionError),
    #[error("stream: {0}")]
    Write(#[from] quinn::WriteError),
    #[error("stream closed: {0}")]
    Closed(#[from] quinn::ClosedStream),
    #[error(transparent)]
    Frame(#[from] FrameIoError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error("batch: {0}")]
    Batch(#[from] ProtoError),
    #[error("spool: {0}")]
    Spool(#[from] ReadError),
    #[error("the bridge closed the control stream")]
    ControlClosed,
    /// A spool of another epoch (`spool::recovery`) was sent whole: its session is done.
    #[error("a recovered spool was sent whole")]
    Drained,
    /// A spool of another epoch waits to be sent: the running session makes way for it.
    #[error("a recovered spool waits to be sent")]
    Recover,
    #[error("no ack, no pong and no answer to probes: the path to the bridge is down")]
    Unreachable,
    #[error("shutting down")]
    Shutdown,
}

impl From<SendError> for ConnEnd {
    fn from(e: SendError) -> Self {
        match e {
            SendError::Connection(e) => ConnEnd::Connection(e),
            SendError::Write(e) => ConnEnd::Write(e),
            SendError::Closed(e) => ConnEnd::Closed(e),
            SendError::Frame(e) => ConnEnd::Frame(e),
            SendError::Encode(e) => ConnEnd::Batch(e),
        }
    }
}

impl From<ConnError> for ConnEnd {
    fn from(e: ConnError) -> Self {
        match e {
            ConnError::Session(e) => ConnEnd::Session(e),
        }
    }
}

impl ConnEnd {
    fn kind(&self) -> EndKind {
        match self {
            ConnEnd::Session(SessionError::Refused(_)) => EndKind::Refused,
            ConnEnd::Connection(e) => quic::end_of_connection(e),
            ConnEnd::Handshake(e) => quic::end_of_handshake(e),
            _ => EndKind::Failed,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Uplink {
    pub config: UplinkConfig,
    pub client: quinn::ClientConfig,
    pub spool: SpoolWriter,
    pub metrics: UplinkMetrics,
    /// What the link measures, for the TCO model.
    pub link: Arc<LinkFigures>,
    pub models: Vec<String>,
    /// Where announced model versions go to be fetched and staged.
    pub model_jobs: Option<tokio::sync::mpsc::Sender<ModelJob>>,
    /// The TCO model's latest answer and how often to send its classes to the bridge's fleet
    /// report.
    pub tco: Option<(tokio::sync::watch::Receiver<Snapshot>, Duration)>,
    /// The spool's database, whose `recover/` directory holds spools of other epochs to send
    /// first (`spool::recovery`).
    pub spool_path: Option<std::path::PathBuf>,
    /// Where what the cloud's sink stores of one record goes, as each Welcome says it.
    pub sink_fit: Option<Arc<crate::spool::SinkFit>>,
    /// `uplink send` spans of traced records.
    pub tracer: shared::trace::Tracer,
    /// The broker downlink messages go into (protocol version 5).
    pub broker: Arc<crate::broker::driver::BrokerHandle>,
    /// The staged schemas that take binary payloads apart (protocol version 8); none without
    /// `[[schema]]` bindings.
    pub shapes: Option<Arc<dyn shared::proto::columns::Shapes + Send + Sync>>,
}

/// A spool being sent and its session with the cloud (one per epoch).
struct Source {
    spool: SpoolWriter,
    session: EdgeSession,
    /// Traced records sent and not yet acked.
    traced: traced::InFlight,
    /// A spool of another epoch, sent whole and then deleted: its path.
    recovering: Option<std::path::PathBuf>,
}

/// What one connection's driver carries the core's [`Io`] out with.
struct Driving<'a> {
    conn: &'a quinn::Connection,
    send: quinn::SendStream,
    spool: &'a SpoolWriter,
    /// The spool is one of another epoch, sent whole and then deleted.
    recovering: bool,
    traced: &'a mut traced::InFlight,
    packer: &'a mut Packer,
    degraded: &'a tokio::sync::watch::Sender<bool>,
}

/// How often a running session looks for a recovered spool waiting to be sent.
const RECOVERY_CHECK: Duration = Duration::from_secs(5);

impl Uplink {
    /// A session for `spool`, from its epoch and acked seqs.
    async fn source(&self, spool: SpoolWriter, recovering: Option<std::path::PathBuf>) -> Option<Source> {
        let heads = match spool.heads().await {
            Ok(h) => h,
            Err(e) => {
                tracing::error!(error = %e, "uplink cannot read the spool");
                return None;
            }
        };
        let session_config = self.config.session_config();
        let acked = heads.lanes.iter().map(|(l, a, _)| (l.0, a.0));
        let session = EdgeSession::new(session_config, heads.epoch.clone(), acked).with_models(self.models.clone());
        let traced = traced::InFlight::new(self.tracer.clone(), heads.epoch);
        Some(Source { spool, session, traced, recovering })
    }

    /// The next recovered spool waiting to be sent, opened, if there is one.
    async fn recovery(&self) -> Option<Source> {
        let path = crate::spool::recovery::next(self.spool_path.as_deref()?)?;
        match crate::spool::recovery::open(&path) {
            Ok(spool) => {
                let source = self.source(spool, Some(path.clone())).await?;
                tracing::warn!(path = %path.display(), "uplink sends a recovered spool first");
                Some(source)
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "a recovered spool cannot be opened; setting it apart");
                let _ = crate::spool::recovery::refuse(&path);
                None
            }
        }
    }

    /// Runs until `shutdown`: connects, drains, reconnects. Recovered spools of other epochs
    /// go first, each in a session of its own epoch.
    pub(crate) async fn run(self, mut down: DownCore, shutdown: CancellationToken) {
        let Some(mut main) = self.source(self.spool.clone(), None).await else {
            tracing::error!("uplink cannot read the spool; not starting");
            return;
        };
        let mut recovery: Option<Source> = None;
        let mut endpoint = match quinn::Endpoint::client(std::net::SocketAddr::from(([0, 0, 0, 0], 0))) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "uplink cannot open a UDP socket; not starting");
                return;
            }
        };
        endpoint.set_default_client_config(self.client.clone());
        let mut packer = Packer::new(&self.config);
        if let Some(shapes) = &self.shapes {
            packer.shapes = shapes.clone();
        }
        let list = self.config.server_list();
        let start = rand::thread_rng().gen_range(0..list.len().max(1));
        let backoff = (self.config.backoff_min.0, self.config.backoff_max.0);
        let prober = Prober::new(self.config.probe_interval.0, self.config.backoff_max.0, self.metrics.probes.clone());
        let mut dialer = Dialer::new(list, start, backoff, prober.enabled());
        let mut first = true;
        loop {
            if !first {
                self.metrics.reconnects.inc();
            }
            first = false;
            if recovery.is_none() {
                recovery = self.recovery().await;
            }
            let source = recovery.as_mut().unwrap_or(&mut main);
            let session = &mut source.session;
            session.set_dicts(packer.dicts.ids());
            let welcomed = session.welcomes();
            let attempt = dialer.poll_attempt();
            let server = attempt.server.clone();
            let end = match self.connect(&endpoint, &attempt).await {
                Ok(conn) => {
                    self.metrics.connected.set(1);
                    self.link.set_up(true);
                    tracing::info!(server, "uplink connected");
                    let _learning = prober.learn(conn.remote_address());
                    let end = self.connection(&conn, source, &prober, (&mut packer, &mut down), &shutdown).await;
                    let session = &mut source.session;
                    session.disconnected();
                    self.metrics.connected.set(0);
                    self.link.set_up(false);
                    self.metrics.in_flight.set(0);
                    self.metrics.degraded.set(0);
                    conn.close(0u32.into(), end.to_string().as_bytes());
                    end
                }
                Err(end) => end,
            };
            if matches!(end, ConnEnd::Shutdown) || shutdown.is_cancelled() {
                if let Some(r) = recovery.take() {
                    r.spool.shutdown().await;
                }
                endpoint.wait_idle().await;
                return;
            }
            match &end {
                // The recovered spool is in the cloud: on to the next, or to the running one, at
                // once.
                ConnEnd::Drained => {
                    if let Some(r) = recovery.take() {
                        r.spool.shutdown().await;
                        let path = r.recovering.unwrap_or_default();
                        tracing::warn!(path = %path.display(), "recovered spool sent whole; deleting it");
                        if let Err(e) = crate::spool::recovery::finish(&path) {
                            tracing::error!(path = %path.display(), error = %e, "a sent recovered spool cannot be deleted");
                        }
                    }
                    dialer.handle_switch();
                    continue;
                }
                ConnEnd::Recover => {
                    dialer.handle_switch();
                    continue;
                }
                // The cloud will not take this epoch (retired there): set apart, or it would hold
                // the running spool back for ever.
                ConnEnd::Session(SessionError::Refused(reason)) if recovery.is_some() && reason.contains("epoch") => {
                    if let Some(r) = recovery.take() {
                        r.spool.shutdown().await;
                        let path = r.recovering.unwrap_or_default();
                        let apart = crate::spool::recovery::refuse(&path);
                        match apart {
                            Ok(to) => {
                                tracing::error!(path = %path.display(), reason, apart = %to.display(), "the cloud refuses a recovered spool's epoch; set apart")
                            }
                            Err(e) => {
                                tracing::error!(path = %path.display(), reason, error = %e, "the cloud refuses a recovered spool's epoch; it could not be set apart")
                            }
                        }
                    }
                    continue;
                }
                _ => {}
            }
            let session = &mut recovery.as_mut().unwrap_or(&mut main).session;
            let welcomed = session.welcomes() > welcomed;
            if welcomed {
                prober.welcomed();
            }
            let kind = end.kind();
            match kind {
                EndKind::Refused => {
                    tracing::error!(server, error = %end, "uplink refused by the cloud bridge; retrying slowly");
                    self.metrics.refused.inc();
                }
                EndKind::Busy => {
                    tracing::warn!(server, error = %end, "cloud bridge busy; retrying within a widening window");
                    self.metrics.busy.inc();
                }
                EndKind::Failed => {}
            }
            let next = dialer.handle_end(kind, welcomed, rand::thread_rng().gen_range(0.0..1.0));
            if kind == EndKind::Failed {
                let retry_in = match next {
                    Next::Now => Duration::ZERO,
                    Next::Wait { wait, .. } => wait,
                };
                tracing::warn!(server, error = %end, retry_in = %shared::units::HumanDuration(retry_in), "uplink down");
            }
            let Next::Wait { wait, probe_for } = next else { continue };
            let resumed = tokio::select! {
                r = prober.wait(dialer.servers(), wait, probe_for) => r,
                _ = shutdown.cancelled() => return,
            };
            if let Some(answered) = resumed {
                dialer.handle_answer(&answered.server, answered.addr);
                tracing::info!(server = answered.server, addr = %answered.addr, "bridge answered a probe; reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(prober.jitter()) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
        }
    }

    /// Connects to `server` at `pinned` if given, else at one of its addresses in turn (a name
    /// with several addresses names several bridges).
    async fn connect(&self, endpoint: &quinn::Endpoint, attempt: &Attempt) -> Result<quinn::Connection, ConnEnd> {
        let Attempt { server, pinned, number } = attempt;
        let addr = match *pinned {
            Some(addr) => addr,
            None => {
                let addrs: Vec<_> = tokio::net::lookup_host(server)
                    .await
                    .map_err(|e| ConnEnd::Connect(format!("{server}: {e}")))?
                    .collect();
                *addrs
                    .get(number % addrs.len().max(1))
                    .ok_or_else(|| ConnEnd::Connect(format!("{server}: no address")))?
            }
        };
        let name = quic::server_name(&self.config, server);
        let connecting = endpoint.connect(addr, &name).map_err(|e| ConnEnd::Connect(e.to_string()))?;
        tokio::time::timeout(shared::proto::HANDSHAKE_TIMEOUT, connecting)
            .await
            .map_err(|_| ConnEnd::Connect(format!("{addr}: handshake timed out")))?
            .map_err(ConnEnd::Handshake)
    }

    /// Drives a session until it ends. While it is degraded (no ack or pong for
    /// `ack_timeout`), a bridge known to answer probes is probed: when none of three rounds
    /// (each four round trips, `Prober::round_wait`) is answered the path is taken for dead and
    /// the connection given up, before QUIC's 15 s idle timeout would, so the edge moves to
    /// another bridge or waits for this one's answer. A slow bridge that answers its probes is
    /// only reported degraded.
    async fn connection(
        &self,
        conn: &quinn::Connection,
        source: &mut Source,
        prober: &Prober,
        io: (&mut Packer, &mut DownCore),
        shutdown: &CancellationToken,
    ) -> ConnEnd {
        let (degraded, mut watch) = tokio::sync::watch::channel(false);
        let target = [Target { server: String::new(), addr: conn.remote_address() }];
        // `degraded` outlives this future, so the waits below cannot fail.
        let dead = async {
            if !prober.enabled() {
                return std::future::pending().await;
            }
            loop {
                let _ = watch.wait_for(|d| *d).await;
                if prober.trusted(&target) && !prober.answers_within(&target, 3, prober.round_wait(conn.rtt())).await {
                    return;
                }
                // Alive: look again once acks have flowed and stopped, or after ack_timeout.
                let _ = tokio::time::timeout(self.config.ack_timeout.0, watch.wait_for(|d| !*d)).await;
            }
        };
        tokio::select! {
            r = self.drive(conn, source, io, &degraded, shutdown) => match r {
                Ok(()) => ConnEnd::Shutdown,
                Err(e) => e,
            },
            _ = dead => ConnEnd::Unreachable,
        }
    }

    async fn drive(
        &self,
        conn: &quinn::Connection,
        source: &mut Source,
        (packer, down): (&mut Packer, &mut DownCore),
        degraded: &tokio::sync::watch::Sender<bool>,
        shutdown: &CancellationToken,
    ) -> Result<(), ConnEnd> {
        let Source { spool, session, traced, recovering } = source;
        let mut recovery_check = tokio::time::interval_at(tokio::time::Instant::now() + RECOVERY_CHECK, RECOVERY_CHECK);
        let (send, recv) = conn.open_bi().await?;
        let policy = SendPolicy::new(self.config.linger.0, self.config.batch_records, self.config.lower_lane_share);
        let mut core = Conn::start(session, down, self.broker.stored_through(), policy, Instant::now());
        let (mut control_rx, reader) = spawn_reader::<_, Control>(recv, MAX_CONTROL_FRAME);
        let _reader = AbortOnDropHandle::new(reader);
        let notify = spool.committed_notify();
        let report_every = self.tco.as_ref().map_or(Duration::from_secs(3600), |(_, every)| *every);
        let mut report_tick = tokio::time::interval(report_every);
        report_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut io = Driving { conn, send, spool, recovering: recovering.is_some(), traced, packer, degraded };
        loop {
            // What the last input asked for, in order, then the control frames it made.
            self.carry_out(&mut core, session, &mut io).await?;
            let mut writer = PassWriter::new(session.version());
            core.begin_pass();
            while let Some(read) = core.poll_read(session, Instant::now()) {
                let records = io.spool.read(Lane(read.lane), Seq(read.after), read.max).await?;
                if records.is_empty() {
                    core.handle_empty_read(read.lane, read.after);
                    continue;
                }
                io.traced.reading(&records);
                let wire: Vec<WireRecord> = records.into_iter().map(into_wire).collect();
                let packed = io.packer.pack(session, read, wire, Instant::now()).await?;
                self.count_packed(&packed);
                let batch = &packed.batch;
                let frame = writer.batch(conn, batch, core.is_full(packed.records)).await?;
                self.metrics.frame_bytes.inc_by(frame as u64);
                core.handle_sent(session, read.lane, batch.first_seq.0, batch.last_seq.0, Instant::now())?;
                self.metrics.in_flight.set(session.in_flight() as i64);
            }
            writer.finish(conn).await?;
            self.carry_out(&mut core, session, &mut io).await?;
            let timeout = core.poll_timeout(session).map(tokio::time::Instant::from_std);
            let waiting = down.waiting_for();
            tokio::select! {
                frame = control_rx.recv() => {
                    let Some(frame) = frame.map(|f| *f).transpose()?.flatten() else { return Err(ConnEnd::ControlClosed) };
                    core.handle_control(session, down, &mut Live(&self.broker), frame, Instant::now())?;
                }
                _ = notify.notified() => refresh(io.spool, session, &mut core).await?,
                _ = self.broker.wait_stored(waiting.unwrap_or(0)), if waiting.is_some() => {
                    core.handle_stored(session, down, self.broker.stored_through())?;
                }
                _ = sleep_until(timeout) => {
                    // What the spool says of itself rides with the next heads, for the fleet view.
                    session.set_spool_report(spool_report(io.spool.figures()));
                    core.handle_timeout(session, Instant::now())?;
                }
                _ = recovery_check.tick(), if !io.recovering => {
                    if self.spool_path.as_deref().and_then(crate::spool::recovery::next).is_some() {
                        return Err(ConnEnd::Recover);
                    }
                }
                _ = report_tick.tick(), if self.tco.is_some() => self.report_classes(session),
                e = conn.closed() => return Err(e.into()),
                _ = shutdown.cancelled() => return Ok(()),
            }
            self.metrics.in_flight.set(session.in_flight() as i64);
        }
    }

    /// Does what the connection's core asked for, in order.
    async fn carry_out(&self, core: &mut Conn, session: &mut EdgeSession, io: &mut Driving<'_>) -> Result<(), ConnEnd> {
        while let Some(next) = core.poll_io(session) {
            match next {
                Io::Control(frame) => write_frame(&mut io.send, &frame).await?,
                Io::CheckMark { lane, committed } => {
                    io.spool.check_mark(Lane(lane), Seq(committed)).await?;
                }
                Io::Ack { lane, up_to } => {
                    io.spool.ack(Lane(lane), Seq(up_to)).await?;
                    io.traced.acked(lane, up_to);
                    self.metrics.acked.get_or_create(&LaneLabel { lane }).set(up_to as i64);
                    if io.recovering && sent_whole(io.spool).await? {
                        return Err(ConnEnd::Drained);
                    }
                }
                Io::Ready { version, dicts: known, sink } => {
                    // After every Mark of this Welcome (they come first).
                    io.spool.welcomed().await?;
                    if let Some(fit) = self.sink_fit.as_ref().filter(|_| !io.recovering) {
                        fit.update(sink);
                    }
                    tracing::info!(version, dicts = known.len(), "uplink session ready");
                    if io.recovering && sent_whole(io.spool).await? {
                        return Err(ConnEnd::Drained);
                    }
                    io.packer.dicts.connected(&known, version);
                    self.report_classes(session);
                    refresh(io.spool, session, core).await?;
                }
                Io::DictStored(id) => io.packer.dicts.stored(id),
                Io::Model(announce) => {
                    let job = ModelJob { conn: io.conn.clone(), announce, received: Instant::now() };
                    match &self.model_jobs {
                        // A full queue drops the announcement: the next connection repeats it.
                        Some(jobs) => {
                            if let Err(e) = jobs.try_send(job) {
                                tracing::warn!(error = %e, "model announcement dropped");
                            }
                        }
                        None => {
                            tracing::warn!(model = job.announce.name, "model announced, but this node has no [models]")
                        }
                    }
                }
                Io::Committed(latency) => {
                    self.metrics.commit_latency.observe(latency.as_secs_f64());
                    self.link.committed(latency);
                }
                Io::Rtt(rtt) => {
                    self.metrics.rtt.set(rtt.as_secs_f64());
                    self.link.rtt(rtt);
                }
                Io::Degraded(d) => {
                    self.metrics.degraded.set(i64::from(d));
                    io.degraded.send_replace(d);
                    if d {
                        tracing::warn!("uplink degraded: connected, but the bridge does not ack");
                    } else {
                        tracing::info!("uplink acks flow again");
                    }
                }
            }
        }
        Ok(())
    }

    /// Counts a batch about to be sent.
    fn count_packed(&self, packed: &Packed) {
        let batch = &packed.batch;
        if let Some(d) = &packed.trained {
            tracing::info!(class = d.class, id = d.id, bytes = d.bytes.len(), "uplink dictionary trained");
            self.metrics.dicts_trained.inc();
        }
        if packed.announced {
            self.metrics.dicts_announced.inc();
        }
        if packed.refused > 0 {
            tracing::warn!(
                lane = batch.lane.0,
                seq = batch.first_seq.0,
                "record too costly to decode for any bridge; sent as a refused gap"
            );
            self.metrics.records_refused.inc_by(packed.refused);
        }
        if batch.dict.is_some() {
            self.metrics.dict_batches.inc();
        }
        self.metrics.batches.inc();
        self.metrics.records.inc_by(packed.records as u64);
        self.metrics.bytes_raw.inc_by(batch.raw_len);
        self.metrics.bytes_sent.inc_by(batch.body.len() as u64);
        let label = LaneLabel { lane: batch.lane.0 };
        handle(&self.metrics.lane_raw, &label).inc_by(batch.raw_len);
        handle(&self.metrics.lane_sent, &label).inc_by(batch.body.len() as u64);
        self.link.sent(&packed.classes, batch.body.len() as u64);
    }

    fn report_classes(&self, session: &mut EdgeSession) {
        let Some((latest, _)) = &self.tco else { return };
        let snapshot = latest.borrow().clone();
        if !snapshot.classes.is_empty() {
            session.report_classes(shared::proto::ClassesReport {
                currency: snapshot.currency,
                classes: snapshot.classes,
            });
        }
    }
}

async fn refresh(spool: &SpoolWriter, session: &mut EdgeSession, core: &mut Conn) -> Result<(), ConnEnd> {
    let h = spool.heads().await.map_err(ReadError::from)?;
    core.set_heads(session, h.lanes.into_iter().map(|(lane, _, last)| (lane.0, last.0)), Instant::now());
    Ok(())
}

/// Whether the cloud acknowledged everything `spool` holds.
async fn sent_whole(spool: &SpoolWriter) -> Result<bool, ConnEnd> {
    let h = spool.heads().await.map_err(ReadError::from)?;
    Ok(h.lanes.iter().all(|(_, acked, last)| acked >= last))
}

fn spool_report(f: crate::spool::SpoolFigures) -> shared::proto::SpoolReport {
    let age = f.oldest_unacked_ms.map_or(0, |at| shared::units::now_ms().saturating_sub(at).max(1));
    shared::proto::SpoolReport { oldest_unacked_ms: age, dropped: f.dropped, gaps: f.gaps }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A spool record as it travels. By value: the payload moves instead of being copied (a
/// `Bytes` made from a `Vec` gives the `Vec` back).
pub fn into_wire(r: Record) -> WireRecord {
    match r.body {
        Body::Message(m) => WireRecord::message(
            r.seq,
            WireMessage {
                class: m.class,
                topic: m.topic,
                payload: m.payload.into(),
                qos: m.qos,
                enqueued_ms: m.enqueued_ms,
                expires_ms: m.expires_ms,
                user_properties: m.properties.user,
                correlation_data: m.properties.correlation_data.map(Into::into),
                content_type: m.properties.content_type,
                schema: m.properties.schema,
            },
        ),
        Body::Gap(g) => {
            WireRecord::gap(r.seq, WireGap { class: g.class, reason: g.reason, ranges: g.ranges, count: g.count })
        }
    }
}
