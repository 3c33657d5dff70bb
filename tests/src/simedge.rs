//! A simulated edge for benchmarks: one QUIC connection speaking ehb/1 through the same
//! sans-IO `EdgeSession` the real edge's uplink drives, sending synthetic telemetry batches at
//! a set rate (no broker, no spool), and recording every batch's ack latency as the session
//! reports it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use shared::proto::edge::{EdgeEvent, EdgeSession, EdgeSessionConfig};
use shared::proto::io::{spawn_reader, write_frame};
use shared::proto::{Control, MAX_CONTROL_FRAME, WireMessage, WireRecord, compress};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct SimEdge {
    pub addr: SocketAddr,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Records a second.
    pub rate: f64,
    /// Records a batch.
    pub batch: usize,
    pub payload: usize,
}

/// What one simulated edge saw.
#[derive(Debug, Default)]
pub struct SimReport {
    /// Each batch's time from sent to acked.
    pub latencies: Vec<Duration>,
    pub acked: u64,
}

impl SimEdge {
    /// Connects, sends at `rate` until `stop`, then waits up to 5 s for the last acks.
    pub async fn run(&self, stop: CancellationToken) -> anyhow::Result<SimReport> {
        let conn = crate::quic::connect(self.addr, &self.ca, &self.cert, &self.key)
            .await
            .map_err(|e| anyhow::anyhow!("connect: {e}"))?;
        let (mut send, recv) = conn.open_bi().await?;
        let epoch = format!("{:032x}", rand::random::<u128>());
        let mut session = EdgeSession::new(EdgeSessionConfig::default(), epoch, []);
        session.connected(Instant::now());
        let (mut control, _reader) = spawn_reader::<_, Control>(recv, MAX_CONTROL_FRAME);
        let mut report = SimReport::default();
        let mut tick = tokio::time::interval(Duration::from_secs_f64(self.batch as f64 / self.rate));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sent = 0u64;
        let mut draining: Option<tokio::time::Instant> = None;
        loop {
            while let Some(frame) = session.poll_control() {
                write_frame(&mut send, &frame).await?;
            }
            if draining.is_some_and(|d| tokio::time::Instant::now() > d) || (draining.is_some() && report.acked == sent)
            {
                break;
            }
            let timeout = session.poll_timeout().map(tokio::time::Instant::from_std);
            tokio::select! {
                _ = stop.cancelled(), if draining.is_none() => {
                    draining = Some(tokio::time::Instant::now() + Duration::from_secs(5));
                }
                _ = tick.tick(), if draining.is_none() && session.can_send() => {
                    let first = session.next_seq(0);
                    let records: Vec<WireRecord> = (first..first + self.batch as u64).map(|seq| self.record(seq)).collect();
                    let batch = compress::pack("", 0, first, &records, None, 3)?;
                    let mut stream = conn.open_uni().await?;
                    write_frame(&mut stream, &batch).await?;
                    stream.finish()?;
                    session.sent(0, first, batch.last_seq, Instant::now())?;
                    sent = batch.last_seq;
                }
                frame = control.recv() => {
                    let frame = frame.context("control stream ended")??.context("the bridge closed the control stream")?;
                    for event in session.handle(frame, Instant::now())? {
                        match event {
                            EdgeEvent::Committed { latency, .. } => report.latencies.push(latency),
                            EdgeEvent::Acked { up_to, .. } => report.acked = up_to,
                            _ => {}
                        }
                    }
                }
                _ = tokio::time::sleep_until(timeout.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600))), if timeout.is_some() => {
                    session.handle_timeout(Instant::now());
                }
            }
        }
        conn.close(0u32.into(), b"done");
        Ok(report)
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

/// The `q` quantile (0..=1) of `values`, sorting them.
pub fn quantile(values: &mut [Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort();
    values[((values.len() - 1) as f64 * q).round() as usize]
}
