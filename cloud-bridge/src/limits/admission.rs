//! Admission of new connections (`[limits]`): how many may be open and how fast new ones may
//! start, checked on a connection's first packet, before any TLS work; and, once the handshake
//! named the edge, how fast that one certificate may start them (`super::per_edge`).

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::per_edge::{Bucket, PerEdge};
use super::{LimitMetrics, LimitsConfig};

/// Admission of new connections: a count and a token bucket, checked on a connection's first
/// packet, and the rate per certificate.
#[derive(Debug)]
pub struct Admission {
    open: Arc<Semaphore>,
    handshaking: Arc<Semaphore>,
    shape: (f64, f64),
    bucket: Bucket,
    per_edge: Arc<Mutex<PerEdge>>,
    metrics: Arc<LimitMetrics>,
}

/// Held by an admitted connection until it ends.
#[derive(Debug)]
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
    handshake: Option<OwnedSemaphorePermit>,
    from: IpAddr,
    per_edge: Arc<Mutex<PerEdge>>,
    metrics: Arc<LimitMetrics>,
}

impl Admitted {
    /// The handshake named `edge`: within its certificate's rate, or why not (`edge_rate`).
    pub(crate) fn identified(&self, edge: &str, now: Instant) -> Result<(), &'static str> {
        self.per_edge.lock().unwrap_or_else(|p| p.into_inner()).admit_edge(edge, self.from, now)
    }

    /// The handshake is over (done or failed): its place is free for another.
    pub(crate) fn handshake_done(&mut self) {
        if self.handshake.take().is_some() {
            self.metrics.handshakes.dec();
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.handshake_done();
        self.metrics.connections.dec();
    }
}

impl Admission {
    pub(crate) fn new(config: &LimitsConfig, metrics: Arc<LimitMetrics>, now: Instant) -> Self {
        let burst = f64::from(config.handshake_burst);
        Self {
            open: Arc::new(Semaphore::new(config.max_connections)),
            handshaking: Arc::new(Semaphore::new(config.handshakes_in_flight as usize)),
            shape: (f64::from(config.handshakes_per_second), burst),
            bucket: Bucket::full(burst, now),
            per_edge: Arc::new(Mutex::new(PerEdge::new(config, metrics.clone(), now))),
            metrics,
        }
    }

    /// Admits a new connection from `from` at `now`, or says why not (`rate`, `connections`,
    /// `handshakes`, or `address_rate` for an address cooling down). A refusal takes no token
    /// of the bridge's rate.
    pub(crate) fn admit(&mut self, from: IpAddr, now: Instant) -> Result<Admitted, &'static str> {
        if !self.bucket.has(self.shape, now) {
            return Err("rate");
        }
        let permit = self.open.clone().try_acquire_owned().map_err(|_| "connections")?;
        let handshake = self.handshaking.clone().try_acquire_owned().map_err(|_| "handshakes")?;
        self.per_edge.lock().unwrap_or_else(|p| p.into_inner()).admit_address(from, now)?;
        self.bucket.take();
        self.metrics.connections.inc();
        self.metrics.handshakes.inc();
        let per_edge = self.per_edge.clone();
        Ok(Admitted { _permit: permit, handshake: Some(handshake), from, per_edge, metrics: self.metrics.clone() })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn handshakes_past_the_in_flight_bound_are_refused_without_a_token() {
        let metrics = Arc::new(LimitMetrics::default());
        let t0 = Instant::now();
        let config = LimitsConfig { handshakes_in_flight: 2, handshake_burst: 10, ..Default::default() };
        let mut a = Admission::new(&config, metrics.clone(), t0);
        let mut first = a.admit(LOCAL, t0).unwrap();
        let _second = a.admit(LOCAL, t0).unwrap();
        assert_eq!(a.admit(LOCAL, t0).unwrap_err(), "handshakes");
        assert_eq!(metrics.handshakes.get(), 2);
        first.handshake_done();
        assert_eq!(metrics.handshakes.get(), 1);
        let _third = a.admit(LOCAL, t0).expect("a place came free");
        assert_eq!(a.bucket.tokens() as u32, 7, "three admitted, the refusal took no token");
        assert_eq!(metrics.connections.get(), 3, "the first is connected still");
        drop(first);
        assert_eq!(metrics.connections.get(), 2);
    }

    #[test]
    fn admission_holds_the_rate_and_the_count() {
        let metrics = Arc::new(LimitMetrics::default());
        let limits =
            LimitsConfig { max_connections: 3, handshakes_per_second: 10, handshake_burst: 2, ..Default::default() };
        let t0 = Instant::now();
        let mut admission = Admission::new(&limits, metrics.clone(), t0);
        let a = admission.admit(LOCAL, t0).unwrap();
        let _b = admission.admit(LOCAL, t0).unwrap();
        assert_eq!(admission.admit(LOCAL, t0).unwrap_err(), "rate", "the burst is spent");
        let _c = admission.admit(LOCAL, t0 + Duration::from_millis(100)).unwrap();
        assert_eq!(admission.admit(LOCAL, t0 + Duration::from_secs(5)).unwrap_err(), "connections");
        assert_eq!(metrics.connections.get(), 3);
        drop(a);
        assert!(admission.admit(LOCAL, t0 + Duration::from_secs(5)).is_ok());
    }
}
