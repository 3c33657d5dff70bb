//! What one bridge lets edges take (`[limits]`): connections, the rate of new handshakes,
//! streams, memory for batches in transit, and what one edge may make the sink keep (its
//! epochs and dictionaries, `sink::quota`).
//!
//! Every edge may be hostile, certificate or not, so nothing an edge sends is allocated before
//! it is paid for. Batch memory is reserved against two budgets, the connection's own and the
//! bridge's, before each allocation: the frame as its bytes arrive (a frame that declares 16 MiB
//! and sends nothing holds nothing), the decompressed CBOR at its declared length, the decoded
//! records at their bound from the CBOR headers ([`shared::proto::bound`]). A reservation lives
//! as long as the memory: until the records are in the sink. What QUIC buffers before the
//! bridge reads it is bounded by the connection's flow-control window, `connection_window`.
//!
//! Handshakes cost the bridge TLS work before it knows who is calling, so both the number of
//! connections and the rate of new ones are checked on the first packet and the excess is
//! refused (QUIC CONNECTION_REFUSED) with no TLS done. One certificate's share of that rate is
//! bounded too ([`per_edge`]).

use shared::check::Problems;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use serde::{Deserialize, Serialize};
use shared::proto::{MAX_BATCH_COST, MAX_DICT_BYTES};

use crate::sink::EdgeQuota;
use shared::units::{ByteSize, HumanDuration};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

mod admission;
mod per_edge;
pub use admission::{Admission, Admitted};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Edge connections at once, handshakes included. Default: 12,000.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// New connections admitted per second, on average; the rest are refused before TLS.
    /// Default: 500.
    #[serde(default = "default_handshake_rate")]
    pub handshakes_per_second: u32,
    /// New connections admitted at once above the rate (a token bucket's depth). Default: 500.
    #[serde(default = "default_handshake_rate")]
    pub handshake_burst: u32,
    /// Handshakes in progress at once; past it new connections are refused before TLS like
    /// those over the rate. The rate says how many may start, this how many may wait: a bridge
    /// short of CPU (or behind slow links) finishes fewer a second than it admits, and without
    /// it the admitted ones queue until the edges' 10 s handshake timeout wastes their work.
    /// Default: 512 (500 a second of handshakes taking up to a second).
    #[serde(default = "default_handshakes_in_flight")]
    pub handshakes_in_flight: u32,
    /// Sessions one certificate identity may start a minute, on average (`per_edge`): past it
    /// the handshake is refused with QUIC close code 3, which edges wait out at their
    /// `backoff_max`, and the address it came from cools down. Default: 60.
    #[serde(default = "default_edge_handshakes")]
    pub edge_handshakes_per_minute: u32,
    /// Sessions one identity may start at once above that rate. Default: 30.
    #[serde(default = "default_edge_burst")]
    pub edge_handshake_burst: u32,
    /// How long an address that presented a certificate over its rate is limited to
    /// `cooldown_handshakes_per_second`, every edge behind it together. Default: 60s.
    #[serde(default = "default_cooldown")]
    pub cooldown: HumanDuration,
    /// New connections a cooling address may start a second; the rest are refused before TLS.
    /// Default: 2.
    #[serde(default = "default_cooldown_rate")]
    pub cooldown_handshakes_per_second: u32,
    /// Addresses cooling down at once; past it a further one is not limited (counted in
    /// `bridge_admission_untracked_total{what="address"}`). Default: 4,096.
    #[serde(default = "default_cooldown_addresses")]
    pub cooldown_addresses: usize,
    /// Memory for batches in transit, every edge together. Default: 512 MiB.
    #[serde(default = "default_memory")]
    pub memory: ByteSize,
    /// The same for one connection; at least the protocol's per-batch cost (48 MiB), so every
    /// batch a well-behaved edge sends fits. Default: 64 MiB.
    #[serde(default = "default_connection_memory")]
    pub connection_memory: ByteSize,
    /// What QUIC takes in for one connection before the bridge reads it (its flow-control
    /// window), and what it holds for one connection that the edge has not yet taken.
    /// Default: 4 MiB.
    #[serde(default = "default_connection_window")]
    pub connection_window: ByteSize,
    /// Unidirectional (batch) streams an edge may have open at once, and as many model chunk
    /// fetches (bidirectional, beside the control stream). Default: 16 (an edge keeps
    /// `uplink.window`, 8 by default, batches in flight). QUIC keeps state for each stream the
    /// peer may open, so this is memory per connection too.
    #[serde(default = "default_streams")]
    pub streams_per_connection: u32,
    /// How long a connection may wait for memory of its own, or hold batches ahead of one it
    /// never sends, before it is closed. Default: 60s.
    #[serde(default = "default_stall")]
    pub stall: HumanDuration,
    /// Epochs (spools) of one edge whose marks the sink keeps; a new one past it retires the
    /// oldest, which is refused from then on. Default: 4.
    #[serde(default = "default_epochs")]
    pub epochs_per_edge: usize,
    /// Retired epochs of one edge remembered (to refuse them by name); past it, the edge's new
    /// epochs are refused. Default: 1,024.
    #[serde(default = "default_retired_epochs")]
    pub retired_epochs_per_edge: usize,
    /// zstd dictionaries the sink keeps per edge; a new one past it evicts the oldest.
    /// Default: 64.
    #[serde(default = "default_dicts")]
    pub dicts_per_edge: usize,
    /// Their bytes together, per edge; at least the largest dictionary (256 KiB). Default: 4 MiB.
    #[serde(default = "default_dict_bytes")]
    pub dict_bytes_per_edge: ByteSize,
    /// Log lines about single connections (a handshake failed, an edge connected, hello,
    /// refused, its session ended) a second, every edge together; the rest are counted in
    /// `bridge_log_lines_suppressed_total` and the next line written says how many it follows.
    /// A reconnect storm of 10,000 edges, or a peer failing handshakes on purpose, would
    /// otherwise write several lines each. Default: 50.
    #[serde(default = "default_log_lines")]
    pub log_lines_per_second: u32,
}

fn default_max_connections() -> usize {
    12_000
}
fn default_handshake_rate() -> u32 {
    500
}
fn default_handshakes_in_flight() -> u32 {
    512
}
fn default_edge_handshakes() -> u32 {
    60
}
fn default_edge_burst() -> u32 {
    30
}
fn default_cooldown() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}
fn default_cooldown_rate() -> u32 {
    2
}
fn default_cooldown_addresses() -> usize {
    4096
}
fn default_memory() -> ByteSize {
    ByteSize(512 << 20)
}
fn default_connection_memory() -> ByteSize {
    ByteSize(64 << 20)
}
fn default_connection_window() -> ByteSize {
    ByteSize(4 << 20)
}
fn default_streams() -> u32 {
    16
}
fn default_stall() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}
fn default_epochs() -> usize {
    EdgeQuota::default().epochs
}
fn default_retired_epochs() -> usize {
    EdgeQuota::default().retired_epochs
}
fn default_dicts() -> usize {
    EdgeQuota::default().dicts
}
fn default_log_lines() -> u32 {
    50
}
fn default_dict_bytes() -> ByteSize {
    ByteSize(EdgeQuota::default().dict_bytes)
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_connections: default_max_connections(),
            handshakes_per_second: default_handshake_rate(),
            handshake_burst: default_handshake_rate(),
            handshakes_in_flight: default_handshakes_in_flight(),
            edge_handshakes_per_minute: default_edge_handshakes(),
            edge_handshake_burst: default_edge_burst(),
            cooldown: default_cooldown(),
            cooldown_handshakes_per_second: default_cooldown_rate(),
            cooldown_addresses: default_cooldown_addresses(),
            memory: default_memory(),
            connection_memory: default_connection_memory(),
            connection_window: default_connection_window(),
            streams_per_connection: default_streams(),
            stall: default_stall(),
            epochs_per_edge: default_epochs(),
            retired_epochs_per_edge: default_retired_epochs(),
            dicts_per_edge: default_dicts(),
            dict_bytes_per_edge: default_dict_bytes(),
            log_lines_per_second: default_log_lines(),
        }
    }
}

impl LimitsConfig {
    /// Every key that cannot work, with why.
    pub(crate) fn check(&self, p: &mut Problems) {
        let positive = [
            ("limits.max_connections", self.max_connections as u64),
            ("limits.handshakes_per_second", self.handshakes_per_second.into()),
            ("limits.handshake_burst", self.handshake_burst.into()),
            ("limits.handshakes_in_flight", self.handshakes_in_flight.into()),
            ("limits.edge_handshakes_per_minute", self.edge_handshakes_per_minute.into()),
            ("limits.edge_handshake_burst", self.edge_handshake_burst.into()),
            ("limits.cooldown_handshakes_per_second", self.cooldown_handshakes_per_second.into()),
            ("limits.streams_per_connection", self.streams_per_connection.into()),
            ("limits.stall", self.stall.0.as_millis() as u64),
            ("limits.epochs_per_edge", self.epochs_per_edge as u64),
            ("limits.dicts_per_edge", self.dicts_per_edge as u64),
            ("limits.log_lines_per_second", self.log_lines_per_second.into()),
        ];
        for (key, v) in positive {
            if v == 0 {
                p.bad(key, "must be more than 0");
            }
        }
        if (self.connection_memory.0 as usize) < MAX_BATCH_COST {
            p.bad(
                "limits.connection_memory",
                format!("must be at least {} (the most one batch may cost to decode)", ByteSize(MAX_BATCH_COST as u64)),
            );
        }
        if self.memory.0 < self.connection_memory.0 {
            p.bad("limits.memory", "must be at least limits.connection_memory");
        }
        if self.memory.0 > u32::MAX as u64 * 1024 {
            p.bad("limits.memory", "must be at most 4 TiB");
        }
        if self.connection_window.0 < 64 << 10 {
            p.bad("limits.connection_window", "must be at least 64 KiB");
        }
        if self.dict_bytes_per_edge.0 < MAX_DICT_BYTES as u64 {
            p.bad(
                "limits.dict_bytes_per_edge",
                format!("must be at least {} (the largest dictionary)", ByteSize(MAX_DICT_BYTES as u64)),
            );
        }
    }

    /// What one edge may make the sink keep.
    pub fn quota(&self) -> EdgeQuota {
        EdgeQuota {
            epochs: self.epochs_per_edge,
            retired_epochs: self.retired_epochs_per_edge,
            dicts: self.dicts_per_edge,
            dict_bytes: self.dict_bytes_per_edge.0,
        }
    }

    /// QUIC flow control and stream limits for each edge connection.
    pub fn apply(&self, transport: &mut quinn::TransportConfig) {
        let window = quinn::VarInt::from_u64(self.connection_window.0).unwrap_or(quinn::VarInt::MAX);
        transport.receive_window(window);
        transport.stream_receive_window(window);
        // What the bridge buffers for the edge: quinn's default is 10 MB a connection, outside
        // any budget, for an edge that asks for model chunks and does not read them.
        transport.send_window(self.connection_window.0);
        transport.max_concurrent_uni_streams(self.streams_per_connection.into());
        // quinn's default of 100 costs about 6 KiB a connection in stream state alone.
        transport.max_concurrent_bidi_streams((self.streams_per_connection + 1).into());
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WhatLabel {
    pub what: &'static str,
}

shared::metrics! {
    /// The bridge's limit counters and gauges.
    #[derive(Debug)]
    pub struct LimitMetrics {
        pub memory_reserved: Gauge => (
            "batch_memory_reserved",
            "Memory reserved for batches in transit, every edge together (limits.memory)",
            unit Bytes
        ),
        pub memory_waits: Counter => (
            "batch_memory_waits",
            "Times a connection waited for batch memory (its own or the bridge's)"
        ),
        pub connections: Gauge => ("connections", "Edge connections open, handshakes included"),
        pub handshakes: Gauge => ("handshakes_in_flight", "Edge handshakes in progress (limits.handshakes_in_flight)"),
        pub log_suppressed: Counter => (
            "log_lines_suppressed",
            "Log lines about single connections not written, over limits.log_lines_per_second"
        ),
        pub cooling_addresses: Gauge => (
            "cooling_addresses",
            "Addresses limited to limits.cooldown_handshakes_per_second after a certificate from them went over its rate"
        ),
        pub untracked: Family<WhatLabel, Counter> => (
            "admission_untracked",
            "Identities admitted unlimited (what=edge) or addresses not cooled (what=address), their table full"
        ),
    }
}

/// The lines a second the bridge writes about single connections (`limits.log_lines_per_second`),
/// those held back counted.
#[derive(Debug)]
pub(crate) struct LogBudget {
    lines: shared::log_budget::LogBudget,
    metrics: Arc<LimitMetrics>,
}

impl LogBudget {
    pub(crate) fn new(config: &LimitsConfig, metrics: Arc<LimitMetrics>, now: Instant) -> Self {
        Self { lines: shared::log_budget::LogBudget::new(config.log_lines_per_second, now), metrics }
    }

    /// Whether a line may be written now; if so, how many were held back since the last one.
    pub(crate) fn allow(&self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    fn allow_at(&self, now: Instant) -> Option<u64> {
        let allowed = self.lines.allow_at(now);
        if allowed.is_none() {
            self.metrics.log_suppressed.inc();
        }
        allowed
    }
}

/// Budgets count kibibytes: a semaphore takes at most 2^32 permits at once.
const UNIT: u64 = 1024;

fn units(bytes: usize) -> u32 {
    (bytes as u64).div_ceil(UNIT).min(u32::MAX as u64) as u32
}

/// The bridge's batch memory, shared by its connections.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    global: Arc<Semaphore>,
    connection_units: u32,
    stall: Duration,
    metrics: Arc<LimitMetrics>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum BudgetError {
    #[error("needs {bytes} bytes or more at once, more than the connection's memory budget of {budget}")]
    TooLarge { bytes: usize, budget: ByteSize },
    #[error("waited {0:?} for memory the connection's own batches hold")]
    Stalled(Duration),
}

impl Budget {
    pub(crate) fn new(config: &LimitsConfig, metrics: Arc<LimitMetrics>) -> Self {
        Self {
            global: Arc::new(Semaphore::new((config.memory.0 / UNIT) as usize)),
            connection_units: (config.connection_memory.0 / UNIT) as u32,
            stall: config.stall.0,
            metrics,
        }
    }

    /// A new connection's share.
    pub(crate) fn connection(&self) -> ConnectionBudget {
        ConnectionBudget { own: Arc::new(Semaphore::new(self.connection_units as usize)), bridge: self.clone() }
    }
}

/// One connection's batch memory, drawn from the bridge's.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionBudget {
    own: Arc<Semaphore>,
    bridge: Budget,
}

impl ConnectionBudget {
    /// How long a connection may hold memory it does not move on with (`limits.stall`).
    pub(crate) fn stall(&self) -> Duration {
        self.bridge.stall
    }

    /// The most one reservation may take.
    pub(crate) fn limit(&self) -> usize {
        (u64::from(self.bridge.connection_units) * UNIT) as usize
    }

    /// Reserves `bytes`: first from the connection's own budget, waiting at most `stall` for
    /// its earlier batches to reach the sink, then from the bridge's, waiting as long as it
    /// takes (every connection's batches move on, and a stalled one is closed in turn).
    pub(crate) async fn reserve(&self, bytes: usize) -> Result<Reservation, BudgetError> {
        let n = units(bytes);
        if n > self.bridge.connection_units {
            let budget = ByteSize(u64::from(self.bridge.connection_units) * UNIT);
            return Err(BudgetError::TooLarge { bytes, budget });
        }
        let own = match self.own.clone().try_acquire_many_owned(n) {
            Ok(p) => p,
            Err(_) => {
                self.bridge.metrics.memory_waits.inc();
                let wait = tokio::time::timeout(self.bridge.stall, self.own.clone().acquire_many_owned(n));
                wait.await.map_err(|_| BudgetError::Stalled(self.bridge.stall))?.expect("never closed")
            }
        };
        let global = match self.bridge.global.clone().try_acquire_many_owned(n) {
            Ok(p) => p,
            Err(_) => {
                self.bridge.metrics.memory_waits.inc();
                self.bridge.global.clone().acquire_many_owned(n).await.expect("never closed")
            }
        };
        self.bridge.metrics.memory_reserved.inc_by(i64::from(n) * UNIT as i64);
        Ok(Reservation { own: Some(own), global: Some(global), metrics: self.bridge.metrics.clone() })
    }
}

/// Reserved batch memory, given back when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    own: Option<OwnedSemaphorePermit>,
    global: Option<OwnedSemaphorePermit>,
    metrics: Arc<LimitMetrics>,
}

impl Reservation {
    /// Adds `other` to this one.
    pub(crate) fn merge(&mut self, mut other: Reservation) {
        if let (Some(a), Some(b)) = (self.own.as_mut(), other.own.take()) {
            a.merge(b);
        }
        if let (Some(a), Some(b)) = (self.global.as_mut(), other.global.take()) {
            a.merge(b);
        }
    }

    /// Gives back all but `bytes`.
    pub(crate) fn shrink_to(&mut self, bytes: usize) {
        let keep = units(bytes) as usize;
        let held = self.own.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        if held > keep {
            let excess = held - keep;
            drop(self.own.as_mut().and_then(|p| p.split(excess)));
            drop(self.global.as_mut().and_then(|p| p.split(excess)));
            self.metrics.memory_reserved.dec_by((excess as u64 * UNIT) as i64);
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.own.as_ref().map_or(0, OwnedSemaphorePermit::num_permits) * UNIT as usize
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.metrics.memory_reserved.dec_by(self.bytes() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_past_the_rate_are_held_back_and_counted() {
        let metrics = Arc::new(LimitMetrics::default());
        let t0 = Instant::now();
        let config = LimitsConfig { log_lines_per_second: 3, ..Default::default() };
        let log = LogBudget::new(&config, metrics.clone(), t0);
        let second = |at: u64| (0..10).map(|i| log.allow_at(t0 + Duration::from_millis(at + i))).collect::<Vec<_>>();
        assert_eq!(second(0), [Some(0), Some(0), Some(0), None, None, None, None, None, None, None]);
        assert_eq!(metrics.log_suppressed.get(), 7);
        let next = second(1000);
        assert_eq!(next[0], Some(7), "the next line written says how many it follows");
        assert_eq!(next.iter().filter(|l| l.is_some()).count(), 3);
        assert_eq!(metrics.log_suppressed.get(), 14);
    }

    fn config(memory: u64, connection: u64) -> LimitsConfig {
        LimitsConfig {
            memory: ByteSize(memory),
            connection_memory: ByteSize(connection),
            stall: HumanDuration(Duration::from_millis(200)),
            ..LimitsConfig::default()
        }
    }

    #[tokio::test]
    async fn reservations_draw_on_both_budgets_and_give_back_on_drop() {
        let metrics = Arc::new(LimitMetrics::default());
        let budget = Budget::new(&config(100 << 20, 64 << 20), metrics.clone());
        let (a, b) = (budget.connection(), budget.connection());
        let mut r1 = a.reserve(60 << 20).await.unwrap();
        assert_eq!(metrics.memory_reserved.get(), 60 << 20);
        // The connection's own 64 MiB are nearly gone: it waits, then is told it stalled.
        assert_eq!(a.reserve(8 << 20).await.unwrap_err(), BudgetError::Stalled(Duration::from_millis(200)));
        assert!(matches!(a.reserve(65 << 20).await, Err(BudgetError::TooLarge { .. })));
        // Another connection gets the rest of the bridge's 100 MiB, then waits for it.
        let r2 = b.reserve(40 << 20).await.unwrap();
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.reserve(10 << 20).await.map(|r| r.bytes()) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the bridge's budget is spent");
        r1.shrink_to(50 << 20);
        assert_eq!(waiting.await.unwrap(), Ok(10 << 20));
        assert_eq!(metrics.memory_reserved.get(), (50 + 40) << 20);
        let mut r3 = b.reserve(1).await.unwrap();
        r3.merge(r2);
        assert_eq!(r3.bytes(), (40 << 20) + 1024);
        drop((r1, r3));
        assert_eq!(metrics.memory_reserved.get(), 0);
        assert!(metrics.memory_waits.get() >= 2);
    }

    /// The key of the first problem `c` has.
    fn first(c: &LimitsConfig) -> Option<String> {
        let mut p = Problems::default();
        c.check(&mut p);
        p.first().map(|p| p.key)
    }

    #[test]
    fn limits_that_cannot_work_are_named() {
        assert_eq!(first(&LimitsConfig::default()), None);
        let small = LimitsConfig { connection_memory: ByteSize(1 << 20), ..Default::default() };
        assert_eq!(first(&small).unwrap(), "limits.connection_memory");
        let inverted =
            LimitsConfig { memory: ByteSize(48 << 20), connection_memory: ByteSize(64 << 20), ..Default::default() };
        assert_eq!(first(&inverted).unwrap(), "limits.memory");
        let none = LimitsConfig { streams_per_connection: 0, ..Default::default() };
        assert_eq!(first(&none).unwrap(), "limits.streams_per_connection");
        let no_epochs = LimitsConfig { epochs_per_edge: 0, ..Default::default() };
        assert_eq!(first(&no_epochs).unwrap(), "limits.epochs_per_edge");
        let tiny = LimitsConfig { dict_bytes_per_edge: ByteSize(64 << 10), ..Default::default() };
        assert_eq!(first(&tiny).unwrap(), "limits.dict_bytes_per_edge", "the largest dictionary must fit");
        assert_eq!(LimitsConfig::default().quota(), EdgeQuota::default());
    }
}
