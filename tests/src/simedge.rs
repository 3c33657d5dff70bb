//! A simulated edge for benchmarks and fleet tests: the real uplink's policies
//! (`edge_node::uplink::core`: where and when to connect, what to send and when), its batch
//! packing (`uplink::pack::Packer`, dictionaries included), its probes and its QUIC settings,
//! driven over QUIC in front of a synthetic spool instead of a broker and SQLite: records
//! arrive at a set rate, spread over the lanes in turn, and a record is made again from its seq
//! when it is read, so what the sink holds can be counted exactly. Left out: the probe that
//! gives a degraded connection up early (`Uplink::connection`), recovered spools, models and
//! class reports.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use edge_node::uplink::UplinkConfig;
use edge_node::uplink::core::{Dialer, EndKind, Next, Read, SendPolicy};
use edge_node::uplink::pack::Packer;
use edge_node::uplink::quic::PassWriter;
use edge_node::uplink::reach::Prober;
use rand::Rng;
use shared::proto::Seq;
use shared::proto::down::DownOutcome;
use shared::proto::edge::{EdgeEvent, EdgeSession, SessionError};
use shared::proto::io::{spawn_reader, write_frame};
use shared::proto::{Control, MAX_CONTROL_FRAME, WireMessage, WireRecord};
use tokio_util::sync::CancellationToken;

/// How often the synthetic spool commits what arrived (the real one's `spool.commit_interval`
/// is shorter; at fleet rates a record waits for its linger anyway).
const COMMIT_EVERY: Duration = Duration::from_millis(50);

#[derive(Debug, Clone)]
pub struct SimEdge {
    /// Its bridges (`uplink.servers`), entered at a random place, as the real uplink does.
    pub servers: Vec<SocketAddr>,
    /// The client endpoint it connects from (one endpoint's driver is one task: a fleet spreads
    /// its edges over several).
    pub endpoint: quinn::Endpoint,
    /// Its TLS client configuration, with its own certificate.
    pub client: quinn::ClientConfig,
    /// Records a second arriving in its spool; 0 for an idle edge that only keeps its session
    /// alive.
    pub rate: f64,
    pub payload: usize,
    /// Lanes its records arrive on, in turn (a lane per priority level of its classes).
    pub lanes: u8,
    /// Records each lane holds when it starts (a spool after an outage). Only for an edge with
    /// a rate.
    pub backlog: u64,
    /// The `[uplink]` section it follows (window, keepalive, ack_timeout, batch_records,
    /// linger, lower_lane_share, backoff, probe_interval, zstd, dictionaries); its `servers`
    /// and certificates are not used.
    pub uplink: UplinkConfig,
}

/// `[uplink]` as the product ships it.
pub fn uplink_defaults() -> UplinkConfig {
    serde_json::from_value(serde_json::json!({"server": "127.0.0.1:1", "ca": "", "cert": "", "key": ""}))
        .expect("the uplink's defaults")
}

/// What a fleet of simulated edges saw, together.
#[derive(Debug, Default)]
pub struct FleetStats {
    /// Edges with a welcomed session now.
    pub connected: AtomicUsize,
    pub welcomes: AtomicU64,
    /// Connection attempts the bridge refused (its TLS, a refusal code or frame).
    pub refused: AtomicU64,
    /// Handshakes refused before TLS, the bridge's admission spent.
    pub busy: AtomicU64,
    /// Attempts that failed otherwise, and sessions lost.
    pub failures: AtomicU64,
    /// Records acked.
    pub acked: AtomicU64,
    /// Each batch's time from sent to acked.
    pub latencies: Mutex<Vec<Duration>>,
    /// From losing a session (or starting) to the next welcome.
    pub reconnects: Mutex<Vec<Duration>>,
    /// Set to hold the active edges idle (a bench measuring the idle fleet first).
    pub hold: std::sync::atomic::AtomicBool,
    /// Downlink messages taken (each acked as delivered at once), and for each whose payload
    /// is the ms since the Unix epoch it was sent at, how long it took.
    pub downs: AtomicU64,
    pub down_latencies: Mutex<Vec<Duration>>,
    /// Dictionaries the edges' packers made current (each trained on the generator's cores).
    pub dicts_trained: AtomicU64,
}

/// What one simulated edge saw.
#[derive(Debug, Default)]
pub struct SimReport {
    /// Each batch's time from sent to acked.
    pub latencies: Vec<Duration>,
    /// The highest seq acked, per lane.
    pub acked: Vec<u64>,
}

impl SimReport {
    /// Records acked on all lanes.
    pub fn total_acked(&self) -> u64 {
        self.acked.iter().sum()
    }
}

/// How a connection ended.
enum End {
    Stopped,
    Ended(EndKind, String),
}

/// The synthetic spool: records arrive at `rate` from when the edge is let go (not held),
/// spread over the lanes in turn, on top of `backlog` per lane; a record is made from its seq.
struct SimSpool {
    rate: f64,
    lanes: u8,
    backlog: u64,
    payload: usize,
    started: Option<Instant>,
    /// Arrivals stop here (the edge was told to stop).
    stopped: Option<Instant>,
    heads: Vec<u64>,
}

impl SimSpool {
    fn active(&self) -> bool {
        self.rate > 0.0
    }

    /// Commits what arrived by `now`; the heads per lane.
    fn commit(&mut self, now: Instant, held: bool) -> impl Iterator<Item = (u8, u64)> + '_ {
        if self.active() && !held && self.started.is_none() {
            self.started = Some(now);
        }
        if let Some(start) = self.started {
            let until = self.stopped.map_or(now, |s| s.min(now));
            let arrived = (self.rate * until.saturating_duration_since(start).as_secs_f64()) as u64;
            let lanes = u64::from(self.lanes);
            for (lane, head) in self.heads.iter_mut().enumerate() {
                let on_lane = arrived / lanes + u64::from((lane as u64) < arrived % lanes);
                *head = self.backlog + on_lane;
            }
        }
        self.heads.iter().enumerate().map(|(lane, head)| (lane as u8, *head))
    }

    /// What the policy asked for, as far as it has arrived.
    fn read(&self, read: Read) -> Vec<WireRecord> {
        let head = self.heads.get(usize::from(read.lane)).copied().unwrap_or(0);
        (read.after + 1..=head.min(read.after + read.max as u64)).map(|seq| self.record(seq)).collect()
    }

    fn record(&self, seq: u64) -> WireRecord {
        let mut payload = format!("{{\"seq\":{seq},\"temp_c\":41.{},\"fps\":29.97}}", seq % 10).into_bytes();
        payload.resize(self.payload.max(payload.len()), b' ');
        WireRecord::message(
            Seq(seq),
            WireMessage {
                class: "telemetry".into(),
                topic: format!("telemetry/cam-{}/metrics", seq % 4),
                payload,
                qos: 1,
                enqueued_ms: shared::units::now_ms(),
                expires_ms: None,
                user_properties: Vec::new(),
                correlation_data: None,
                content_type: None,
                schema: None,
            },
        )
    }
}

/// What one connection shares with the next.
struct Edge<'a> {
    session: EdgeSession,
    spool: SimSpool,
    packer: Packer,
    stats: &'a FleetStats,
    report: SimReport,
    down_since: Instant,
}

impl SimEdge {
    /// An edge with its own endpoint, connecting with the certificate in `cert` and `key`.
    pub fn from_files(addr: SocketAddr, ca: &Path, cert: &Path, key: &Path) -> anyhow::Result<Self> {
        let endpoint = quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        Ok(Self {
            servers: vec![addr],
            endpoint,
            client: client_config(ca, cert, key)?,
            rate: 1000.0,
            payload: 1024,
            lanes: 1,
            backlog: 0,
            uplink: uplink_defaults(),
        })
    }

    /// Connects and reconnects until `stop`, records arriving at `rate`; then waits up to 5 s
    /// for the last acks.
    pub async fn run(&self, stop: CancellationToken, stats: &FleetStats) -> SimReport {
        let epoch = format!("{:032x}", rand::random::<u128>());
        let lanes = self.lanes.max(1);
        let spool = SimSpool {
            rate: self.rate,
            lanes,
            backlog: if self.rate > 0.0 { self.backlog } else { 0 },
            payload: self.payload,
            started: None,
            stopped: None,
            heads: vec![0; usize::from(lanes)],
        };
        let mut edge = Edge {
            session: EdgeSession::new(self.uplink.session_config(), epoch, []),
            spool,
            packer: Packer::new(&self.uplink),
            stats,
            report: SimReport { acked: vec![0; usize::from(lanes)], ..Default::default() },
            down_since: Instant::now(),
        };
        let servers: Vec<String> = self.servers.iter().map(ToString::to_string).collect();
        let start = rand::thread_rng().gen_range(0..servers.len().max(1));
        let probes = edge_node::uplink::reach::ReachMetrics::default();
        let prober = Prober::new(self.uplink.probe_interval.0, self.uplink.backoff_max.0, probes);
        let backoff = (self.uplink.backoff_min.0, self.uplink.backoff_max.0);
        let mut dialer = Dialer::new(servers, start, backoff, prober.enabled());
        while !stop.is_cancelled() {
            let welcomes = edge.session.welcomes();
            edge.session.set_dicts(edge.packer.dicts.ids());
            let attempt = dialer.poll_attempt();
            let addr = match attempt.pinned {
                Some(addr) => addr,
                None => attempt.server.parse().expect("servers are addresses"),
            };
            let end = match self.connect(addr).await {
                Ok(conn) => {
                    let _learning = prober.learn(conn.remote_address());
                    let end = self.drive(&conn, &mut edge, &stop).await;
                    edge.session.disconnected();
                    conn.close(0u32.into(), b"");
                    end
                }
                Err(end) => end,
            };
            let welcomed = edge.session.welcomes() > welcomes;
            if welcomed {
                prober.welcomed();
            }
            let End::Ended(kind, why) = end else { break };
            match kind {
                EndKind::Refused => {
                    tracing::debug!(why, "simulated edge refused");
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                }
                EndKind::Busy => {
                    stats.busy.fetch_add(1, Ordering::Relaxed);
                }
                EndKind::Failed => {
                    tracing::debug!(why, "simulated edge lost its connection");
                    stats.failures.fetch_add(1, Ordering::Relaxed);
                }
            }
            let Next::Wait { wait, probe_for } =
                dialer.handle_end(kind, welcomed, rand::thread_rng().gen_range(0.0..1.0))
            else {
                continue;
            };
            tokio::select! {
                answered = prober.wait(dialer.servers(), wait, probe_for) => {
                    if let Some(t) = answered {
                        dialer.handle_answer(&t.server, t.addr);
                        tokio::time::sleep(prober.jitter()).await;
                    }
                }
                _ = stop.cancelled() => break,
            }
        }
        edge.report
    }

    async fn connect(&self, server: SocketAddr) -> Result<quinn::Connection, End> {
        let connecting = self
            .endpoint
            .connect_with(self.client.clone(), server, "localhost")
            .map_err(|e| End::Ended(EndKind::Failed, e.to_string()))?;
        match tokio::time::timeout(shared::proto::HANDSHAKE_TIMEOUT, connecting).await {
            Err(_) => Err(End::Ended(EndKind::Failed, "handshake timed out".into())),
            Ok(Err(e)) => Err(End::Ended(edge_node::uplink::quic::end_of_handshake(&e), e.to_string())),
            Ok(Ok(conn)) => Ok(conn),
        }
    }

    async fn drive(&self, conn: &quinn::Connection, edge: &mut Edge<'_>, stop: &CancellationToken) -> End {
        let mut ready = false;
        let end = self.exchange(conn, edge, stop, &mut ready).await;
        if ready {
            edge.stats.connected.fetch_sub(1, Ordering::Relaxed);
            edge.down_since = Instant::now();
        }
        match end {
            Ok(()) => End::Stopped,
            Err(e) => {
                let kind = match (e.downcast_ref::<SessionError>(), e.downcast_ref::<quinn::ConnectionError>()) {
                    (Some(SessionError::Refused(_)), _) => EndKind::Refused,
                    (_, Some(c)) => edge_node::uplink::quic::end_of_connection(c),
                    _ => EndKind::Failed,
                };
                End::Ended(kind, e.to_string())
            }
        }
    }

    /// One connection, driven as `Uplink::drive` drives the real one: a pass of the send
    /// policy, then whatever comes first of a control frame, a commit, a linger, a timeout.
    async fn exchange(
        &self,
        conn: &quinn::Connection,
        edge: &mut Edge<'_>,
        stop: &CancellationToken,
        ready: &mut bool,
    ) -> anyhow::Result<()> {
        let (mut send, recv) = conn.open_bi().await?;
        edge.session.connected(Instant::now());
        let (mut control, _reader) = spawn_reader::<_, Control>(recv, MAX_CONTROL_FRAME);
        let u = &self.uplink;
        let mut policy = SendPolicy::new(u.linger.0, u.batch_records, u.lower_lane_share);
        let mut commits = tokio::time::interval(COMMIT_EVERY);
        commits.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut draining: Option<tokio::time::Instant> = None;
        loop {
            while let Some(frame) = edge.session.poll_control() {
                write_frame(&mut send, &frame).await?;
            }
            let session = &edge.session;
            let all_acked = (0..edge.spool.lanes).all(|l| session.acked(l) + 1 >= session.next_seq(l));
            if draining.is_some_and(|d| tokio::time::Instant::now() > d || all_acked) {
                return Ok(());
            }
            if *ready && draining.is_none() {
                self.send_pass(conn, edge, &mut policy).await?;
                while let Some(frame) = edge.session.poll_control() {
                    write_frame(&mut send, &frame).await?;
                }
            }
            let timeout = edge.session.poll_timeout().map(tokio::time::Instant::from_std);
            let linger = policy.poll_timeout().map(tokio::time::Instant::from_std);
            let far = tokio::time::Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                _ = stop.cancelled(), if draining.is_none() => {
                    draining = Some(tokio::time::Instant::now() + Duration::from_secs(5));
                    edge.spool.stopped = Some(Instant::now());
                }
                _ = commits.tick(), if edge.spool.active() => refresh(edge, &mut policy),
                frame = control.recv() => {
                    let frame = (*frame.context("control stream ended")?)?.context("the bridge closed the control stream")?;
                    for event in edge.session.handle(frame, Instant::now())? {
                        self.event(event, edge, ready);
                    }
                    if *ready {
                        refresh(edge, &mut policy);
                    }
                }
                e = conn.closed() => return Err(e.into()),
                _ = tokio::time::sleep_until(timeout.unwrap_or(far)), if timeout.is_some() => {
                    edge.session.handle_timeout(Instant::now());
                }
                _ = tokio::time::sleep_until(linger.unwrap_or(far)), if linger.is_some() => {}
            }
        }
    }

    fn event(&self, event: EdgeEvent, edge: &mut Edge<'_>, ready: &mut bool) {
        let stats = edge.stats;
        match event {
            EdgeEvent::Ready { version, dicts, .. } => {
                *ready = true;
                edge.packer.dicts.connected(&dicts, version);
                stats.connected.fetch_add(1, Ordering::Relaxed);
                stats.welcomes.fetch_add(1, Ordering::Relaxed);
                stats.reconnects.lock().unwrap_or_else(|e| e.into_inner()).push(edge.down_since.elapsed());
            }
            EdgeEvent::DictStored(id) => edge.packer.dicts.stored(id),
            EdgeEvent::Down(d) => {
                // A simulated app takes it at once: its durable hand-over is the real edge's.
                if edge.session.down_done(d.seq, DownOutcome::Delivered).is_ok() {
                    stats.downs.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(sent) = std::str::from_utf8(&d.payload).ok().and_then(|p| p.parse::<u64>().ok()) {
                    let took = Duration::from_millis(shared::units::now_ms().saturating_sub(sent));
                    stats.down_latencies.lock().unwrap_or_else(|e| e.into_inner()).push(took);
                }
            }
            EdgeEvent::Committed { latency, .. } => {
                edge.report.latencies.push(latency);
                stats.latencies.lock().unwrap_or_else(|e| e.into_inner()).push(latency);
            }
            EdgeEvent::Acked { lane, up_to } => {
                if let Some(acked) = edge.report.acked.get_mut(usize::from(lane)) {
                    stats.acked.fetch_add(up_to.saturating_sub(*acked), Ordering::Relaxed);
                    *acked = (*acked).max(up_to);
                }
            }
            _ => {}
        }
    }

    /// The reads the policy asks for now, packed and sent as the real uplink sends them: full
    /// batches on a stream each, partial ones together on one.
    async fn send_pass(
        &self,
        conn: &quinn::Connection,
        edge: &mut Edge<'_>,
        policy: &mut SendPolicy,
    ) -> anyhow::Result<()> {
        let mut writer = PassWriter::new(edge.session.version());
        policy.begin();
        while let Some(read) = policy.poll_read(&edge.session, Instant::now()) {
            let records = edge.spool.read(read);
            if records.is_empty() {
                policy.handle_empty_read(read.lane, read.after);
                continue;
            }
            let packed = edge.packer.pack(&mut edge.session, read, records, Instant::now()).await?;
            if packed.trained.is_some() {
                edge.stats.dicts_trained.fetch_add(1, Ordering::Relaxed);
            }
            let batch = &packed.batch;
            writer.batch(conn, batch, policy.is_full(packed.records)).await?;
            edge.session.sent(read.lane, batch.first_seq.0, batch.last_seq.0, Instant::now())?;
        }
        writer.finish(conn).await?;
        Ok(())
    }
}

/// The synthetic spool's commit: its heads to the policy and the session (which reports them
/// to the fleet view).
fn refresh(edge: &mut Edge<'_>, policy: &mut SendPolicy) {
    let held = edge.stats.hold.load(Ordering::Relaxed);
    let now = Instant::now();
    for (lane, head) in edge.spool.commit(now, held) {
        policy.set_head(lane, head, now);
        edge.session.set_head(lane, head);
    }
}

/// The real edge's QUIC client configuration for the certificate in `cert` and `key`.
pub fn client_config(ca: &Path, cert: &Path, key: &Path) -> anyhow::Result<quinn::ClientConfig> {
    let uplink: UplinkConfig = serde_json::from_value(serde_json::json!({
        "server": "127.0.0.1:1", "ca": ca, "cert": cert, "key": key,
    }))?;
    Ok(edge_node::uplink::quic::client_config(&uplink)?)
}

/// The `q` quantile (0..=1) of `values`, sorting them.
pub fn quantile(values: &mut [Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort();
    values[((values.len() - 1) as f64 * q).round() as usize]
}
