//! A simulated edge for benchmarks and fleet tests: QUIC connections speaking ehb/1 through the
//! same sans-IO `EdgeSession` the real edge's uplink drives, with the real edge's QUIC settings
//! (`edge_node::uplink::quic`) and reconnect policy (`shared::proto::backoff`), sending
//! synthetic telemetry batches at a set rate. There is no broker and no spool: a record is made
//! again from its seq when it must be resent, so what the sink holds can be counted exactly.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::Rng;
use shared::proto::backoff::Backoff;
use shared::proto::edge::{EdgeEvent, EdgeSession, EdgeSessionConfig, SessionError};
use shared::proto::io::{spawn_reader, write_frame};
use shared::proto::{Control, MAX_CONTROL_FRAME, WireMessage, WireRecord, compress};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct SimEdge {
    /// Its bridges (`uplink.servers`): it enters the list at a random place and moves one step
    /// on whenever a connection ends, as the real uplink does. Simpler than the real one: it
    /// waits its backoff before each next attempt, not only after a whole round failed, and
    /// does not probe, so a dead bridge is left at QUIC's idle timeout.
    pub servers: Vec<SocketAddr>,
    /// The client endpoint it connects from (one endpoint's driver is one task: a fleet spreads
    /// its edges over several).
    pub endpoint: quinn::Endpoint,
    /// Its TLS client configuration, with its own certificate.
    pub client: quinn::ClientConfig,
    /// Records a second; 0 for an idle edge that only keeps its session alive.
    pub rate: f64,
    /// Records a batch.
    pub batch: usize,
    pub payload: usize,
    /// Lanes it sends on, batch by batch in turn (a lane per priority level of its classes).
    pub lanes: u8,
    /// Records each lane holds at start (a spool after an outage): sent as fast as the session's
    /// window allows, then the rate. Only for an edge with a rate.
    pub backlog: u64,
    pub session: EdgeSessionConfig,
    /// `uplink.backoff_min` and `backoff_max`.
    pub backoff: (Duration, Duration),
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
    Refused(String),
    /// Refused before TLS: the bridge's admission was spent.
    Busy,
    Lost(anyhow::Error),
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
            batch: 100,
            payload: 1024,
            lanes: 1,
            backlog: 0,
            session: EdgeSessionConfig::default(),
            backoff: (Duration::from_millis(200), Duration::from_secs(30)),
        })
    }

    /// Connects and reconnects until `stop`, sending at `rate`; then waits up to 5 s for the
    /// last acks.
    pub async fn run(&self, stop: CancellationToken, stats: &FleetStats) -> SimReport {
        let epoch = format!("{:032x}", rand::random::<u128>());
        let mut session = EdgeSession::new(self.session.clone(), epoch, []);
        let mut backoff = Backoff::new(self.backoff.0, self.backoff.1);
        let mut report = SimReport { acked: vec![0; usize::from(self.lanes.max(1))], ..Default::default() };
        let mut down_since = Instant::now();
        let mut at = rand::thread_rng().gen_range(0..self.servers.len().max(1));
        while !stop.is_cancelled() {
            let welcomes = session.welcomes();
            let end = match self.connect(self.servers[at % self.servers.len()]).await {
                Ok(conn) => {
                    let end = self.drive(&conn, &mut session, &stop, stats, &mut report, &mut down_since).await;
                    session.disconnected();
                    conn.close(0u32.into(), b"");
                    end
                }
                Err(end) => end,
            };
            if session.welcomes() > welcomes {
                backoff.welcomed();
            }
            at += 1;
            match end {
                End::Stopped => break,
                End::Refused(why) => {
                    tracing::debug!(why, "simulated edge refused");
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                    backoff.refused();
                }
                End::Busy => {
                    stats.busy.fetch_add(1, Ordering::Relaxed);
                    backoff.busy();
                }
                End::Lost(e) => {
                    tracing::debug!(error = %e, "simulated edge lost its connection");
                    stats.failures.fetch_add(1, Ordering::Relaxed);
                    backoff.failed();
                }
            }
            let wait = backoff.wait(rand::thread_rng().gen_range(0.0..1.0));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => break,
            }
        }
        report
    }

    async fn connect(&self, server: SocketAddr) -> Result<quinn::Connection, End> {
        let connecting =
            self.endpoint.connect_with(self.client.clone(), server, "localhost").map_err(|e| End::Lost(e.into()))?;
        match tokio::time::timeout(shared::proto::HANDSHAKE_TIMEOUT, connecting).await {
            Err(_) => Err(End::Lost(anyhow::anyhow!("handshake timed out"))),
            Ok(Err(e)) if is_busy(&e) => Err(End::Busy),
            Ok(Err(e)) if is_refusal(&e) => Err(End::Refused(e.to_string())),
            Ok(Err(e)) => Err(End::Lost(e.into())),
            Ok(Ok(conn)) => Ok(conn),
        }
    }

    async fn drive(
        &self,
        conn: &quinn::Connection,
        session: &mut EdgeSession,
        stop: &CancellationToken,
        stats: &FleetStats,
        report: &mut SimReport,
        down_since: &mut Instant,
    ) -> End {
        let mut ready = false;
        let end = self.exchange(conn, session, stop, stats, report, down_since, &mut ready).await;
        if ready {
            stats.connected.fetch_sub(1, Ordering::Relaxed);
            *down_since = Instant::now();
        }
        match end {
            Ok(()) => End::Stopped,
            Err(e) => match e.downcast_ref::<SessionError>() {
                Some(SessionError::Refused(why)) => End::Refused(why.clone()),
                _ => match e.downcast_ref::<quinn::ConnectionError>() {
                    Some(c) if is_refusal(c) => End::Refused(c.to_string()),
                    _ => End::Lost(e),
                },
            },
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn exchange(
        &self,
        conn: &quinn::Connection,
        session: &mut EdgeSession,
        stop: &CancellationToken,
        stats: &FleetStats,
        report: &mut SimReport,
        down_since: &Instant,
        ready: &mut bool,
    ) -> anyhow::Result<()> {
        let (mut send, recv) = conn.open_bi().await?;
        session.connected(Instant::now());
        let (mut control, _reader) = spawn_reader::<_, Control>(recv, MAX_CONTROL_FRAME);
        let period = if self.rate > 0.0 { self.batch as f64 / self.rate } else { 3600.0 };
        let mut tick = tokio::time::interval(Duration::from_secs_f64(period));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let lanes = self.lanes.max(1);
        let mut turn = 0u8;
        let mut draining: Option<tokio::time::Instant> = None;
        loop {
            while let Some(frame) = session.poll_control() {
                write_frame(&mut send, &frame).await?;
            }
            let all_acked = (0..lanes).all(|l| session.acked(l) + 1 >= session.next_seq(l));
            if draining.is_some_and(|d| tokio::time::Instant::now() > d) || (draining.is_some() && all_acked) {
                return Ok(());
            }
            let sending = self.rate > 0.0 && *ready && draining.is_none() && !stats.hold.load(Ordering::Relaxed);
            let behind = (0..lanes).find(|l| session.next_seq(*l) <= self.backlog);
            let timeout = session.poll_timeout().map(tokio::time::Instant::from_std);
            let far = tokio::time::Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                _ = stop.cancelled(), if draining.is_none() => {
                    draining = Some(tokio::time::Instant::now() + Duration::from_secs(5));
                }
                _ = std::future::ready(()), if sending && session.can_send() && behind.is_some() => {
                    // In batches as large as the real uplink makes from a backlog.
                    let lane = behind.unwrap_or(0);
                    let left = self.backlog + 1 - session.next_seq(lane);
                    let most = edge_node::uplink::DEFAULT_BATCH_RECORDS as u64;
                    self.send_batch(conn, session, lane, left.min(most)).await?;
                }
                _ = tick.tick(), if sending && session.can_send() && behind.is_none() => {
                    self.send_batch(conn, session, turn, self.batch as u64).await?;
                    turn = (turn + 1) % lanes;
                }
                frame = control.recv() => {
                    let frame = (*frame.context("control stream ended")?)?.context("the bridge closed the control stream")?;
                    for event in session.handle(frame, Instant::now())? {
                        match event {
                            EdgeEvent::Ready { .. } => {
                                *ready = true;
                                stats.connected.fetch_add(1, Ordering::Relaxed);
                                stats.welcomes.fetch_add(1, Ordering::Relaxed);
                                stats.reconnects.lock().unwrap_or_else(|e| e.into_inner()).push(down_since.elapsed());
                            }
                            EdgeEvent::Committed { latency, .. } => {
                                report.latencies.push(latency);
                                stats.latencies.lock().unwrap_or_else(|e| e.into_inner()).push(latency);
                            }
                            EdgeEvent::Acked { lane, up_to } => {
                                if let Some(acked) = report.acked.get_mut(usize::from(lane)) {
                                    stats.acked.fetch_add(up_to.saturating_sub(*acked), Ordering::Relaxed);
                                    *acked = (*acked).max(up_to);
                                }
                            }
                            _ => {}
                        }
                    }
                }
                e = conn.closed() => return Err(e.into()),
                _ = tokio::time::sleep_until(timeout.unwrap_or(far)), if timeout.is_some() => {
                    session.handle_timeout(Instant::now());
                }
            }
        }
    }

    /// `count` records on `lane`, from its next seq, as one batch.
    async fn send_batch(
        &self,
        conn: &quinn::Connection,
        session: &mut EdgeSession,
        lane: u8,
        count: u64,
    ) -> anyhow::Result<()> {
        let first = session.next_seq(lane);
        let records: Vec<WireRecord> = (first..first + count).map(|seq| self.record(seq)).collect();
        let batch = compress::pack("", lane, first, &records, None, 3)?;
        let mut stream = conn.open_uni().await?;
        write_frame(&mut stream, &batch).await?;
        stream.finish()?;
        session.sent(lane, first, batch.last_seq, Instant::now())?;
        Ok(())
    }

    fn record(&self, seq: u64) -> WireRecord {
        let mut payload = format!("{{\"seq\":{seq},\"temp_c\":41.{},\"fps\":29.97}}", seq % 10).into_bytes();
        payload.resize(self.payload.max(payload.len()), b' ');
        WireRecord {
            seq,
            message: Some(WireMessage {
                class: "telemetry".into(),
                topic: format!("telemetry/cam-{}/metrics", seq % 4),
                payload,
                qos: 1,
                enqueued_ms: shared::units::now_ms(),
                expires_ms: None,
                user_properties: Vec::new(),
                correlation_data: None,
                content_type: None,
            }),
            gap: None,
        }
    }
}

/// The bridge refused the handshake before TLS: its admission was spent.
fn is_busy(e: &quinn::ConnectionError) -> bool {
    matches!(e, quinn::ConnectionError::ConnectionClosed(c) if c.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED)
}

/// The bridge turned the edge away: a TLS refusal, or one of its refusal codes (1 no
/// identity, 2 denied, 3 replaced), as the real edge's uplink reads them.
fn is_refusal(e: &quinn::ConnectionError) -> bool {
    match e {
        quinn::ConnectionError::ConnectionClosed(c) => shared::proto::is_tls_alert(c.error_code.into()),
        quinn::ConnectionError::ApplicationClosed(c) => matches!(u64::from(c.error_code), 1..=3),
        _ => false,
    }
}

/// The real edge's QUIC client configuration for the certificate in `cert` and `key`.
pub fn client_config(ca: &Path, cert: &Path, key: &Path) -> anyhow::Result<quinn::ClientConfig> {
    let uplink: edge_node::uplink::UplinkConfig = serde_json::from_value(serde_json::json!({
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
