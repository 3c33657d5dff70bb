//! Handshakes per certificate: one edge's certificate may start `edge_handshakes_per_minute`
//! sessions (a token bucket `edge_handshake_burst` deep), and the address that presented it
//! over that rate cools down.
//!
//! The bridge learns who is calling only after the TLS work it meant to ration is done, so a
//! refusal per certificate alone would still let one stolen certificate spend the bridge's
//! whole handshake rate (`handshakes_per_second`) on handshakes that are then refused. The
//! address it came from is what the next first packet shows: for `cooldown` after such a
//! refusal, that address (an IPv6 /64, as one host usually holds one) may start at most
//! `cooldown_handshakes_per_second`, refused before TLS past it. Addresses are not limited
//! otherwise: many edges behind one NAT, or a whole test fleet on loopback, share one, and
//! while one of them misbehaves the others behind it share that rate with it.
//!
//! A cooled address must have completed a handshake with a valid certificate, so a spoofed
//! source cannot cool an address it does not hold. Both tables are bounded: identities by
//! `max_connections` twice over (only those short of a full bucket are kept, and past the bound
//! a new one is admitted untracked), addresses by `cooldown_addresses` (past it, an address is
//! not cooled); each overflow is counted.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{LimitMetrics, LimitsConfig};

/// A token bucket: `rate` a second, `burst` deep.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub(super) fn full(burst: f64, now: Instant) -> Self {
        Self { tokens: burst, last: now }
    }

    fn refill(&mut self, (rate, burst): (f64, f64), now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last = now;
    }

    /// Whether a token is there at `now`; it is not taken.
    pub(super) fn has(&mut self, shape: (f64, f64), now: Instant) -> bool {
        self.refill(shape, now);
        self.tokens >= 1.0
    }

    pub(super) fn take(&mut self) {
        self.tokens -= 1.0;
    }

    #[cfg(test)]
    pub(super) fn tokens(&self) -> f64 {
        self.tokens
    }

    fn is_full(&self, (rate, burst): (f64, f64), now: Instant) -> bool {
        self.tokens + now.saturating_duration_since(self.last).as_secs_f64() * rate >= burst
    }
}

/// An address whose certificate went over its rate, until when, and what it may start.
#[derive(Debug)]
struct Cooling {
    until: Instant,
    bucket: Bucket,
}

/// The handshake rate of each certificate identity, and the addresses cooling down.
#[derive(Debug)]
pub(crate) struct PerEdge {
    edges: HashMap<String, Bucket>,
    cooling: HashMap<IpAddr, Cooling>,
    edge: (f64, f64),
    address: (f64, f64),
    cooldown: Duration,
    max_edges: usize,
    max_cooling: usize,
    /// Not before then is the table of identities swept again (a sweep is a pass over it).
    next_sweep: Instant,
    metrics: Arc<LimitMetrics>,
}

impl PerEdge {
    pub(crate) fn new(config: &LimitsConfig, metrics: Arc<LimitMetrics>, now: Instant) -> Self {
        let per_second = f64::from(config.cooldown_handshakes_per_second);
        Self {
            edges: HashMap::new(),
            cooling: HashMap::new(),
            edge: (f64::from(config.edge_handshakes_per_minute) / 60.0, f64::from(config.edge_handshake_burst)),
            address: (per_second, per_second.max(1.0)),
            cooldown: config.cooldown.0,
            max_edges: config.max_connections.saturating_mul(2),
            max_cooling: config.cooldown_addresses,
            next_sweep: now,
            metrics,
        }
    }

    /// Before the handshake: an address cooling down may start only its own rate
    /// (`address_rate` past it).
    pub(crate) fn admit_address(&mut self, ip: IpAddr, now: Instant) -> Result<(), &'static str> {
        let key = host(ip);
        let Some(cooling) = self.cooling.get_mut(&key) else { return Ok(()) };
        if cooling.until <= now {
            self.cooling.remove(&key);
            self.metrics.cooling_addresses.set(self.cooling.len() as i64);
            return Ok(());
        }
        if !cooling.bucket.has(self.address, now) {
            return Err("address_rate");
        }
        cooling.bucket.take();
        Ok(())
    }

    /// After the handshake, once the certificate named `edge`: within its rate, or refused
    /// (`edge_rate`) and its address `ip` cooled down.
    pub(crate) fn admit_edge(&mut self, edge: &str, ip: IpAddr, now: Instant) -> Result<(), &'static str> {
        if !self.edges.contains_key(edge) && self.edges.len() >= self.max_edges {
            self.sweep(now);
            if self.edges.len() >= self.max_edges {
                self.metrics.untracked.get_or_create(&super::WhatLabel { what: "edge" }).inc();
                return Ok(());
            }
        }
        let bucket = self.edges.entry(edge.to_owned()).or_insert_with(|| Bucket::full(self.edge.1, now));
        if bucket.has(self.edge, now) {
            bucket.take();
            return Ok(());
        }
        self.cool(ip, now);
        Err("edge_rate")
    }

    fn cool(&mut self, ip: IpAddr, now: Instant) {
        let key = host(ip);
        let until = now + self.cooldown;
        if let Some(cooling) = self.cooling.get_mut(&key) {
            cooling.until = until;
            return;
        }
        if self.cooling.len() >= self.max_cooling {
            self.cooling.retain(|_, c| c.until > now);
            if self.cooling.len() >= self.max_cooling {
                self.metrics.untracked.get_or_create(&super::WhatLabel { what: "address" }).inc();
                return;
            }
        }
        // What the address may start begins empty: it just went over.
        let bucket = Bucket { tokens: 0.0, last: now };
        self.cooling.insert(key, Cooling { until, bucket });
        self.metrics.cooling_addresses.set(self.cooling.len() as i64);
    }

    /// Forgets identities whose bucket is full again: they hold nothing to remember. At most
    /// once a second, so a table full of busy identities costs one pass a second, not one a
    /// handshake.
    fn sweep(&mut self, now: Instant) {
        if now < self.next_sweep {
            return;
        }
        self.next_sweep = now + Duration::from_secs(1);
        let shape = self.edge;
        self.edges.retain(|_, b| !b.is_full(shape, now));
    }
}

/// The host an address stands for: IPv4 as it is, IPv6 by its /64 (IPv4-mapped ones as IPv4).
fn host(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> LimitsConfig {
        LimitsConfig {
            edge_handshakes_per_minute: 60,
            edge_handshake_burst: 3,
            cooldown_handshakes_per_second: 2,
            cooldown: shared::units::HumanDuration(Duration::from_secs(10)),
            ..Default::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_certificate_over_its_rate_is_refused_and_its_address_cools_down() {
        let metrics = Arc::new(LimitMetrics::default());
        let t0 = Instant::now();
        let mut per = PerEdge::new(&limits(), metrics.clone(), t0);
        let (bad, good) = (ip("192.0.2.7"), ip("192.0.2.8"));
        for _ in 0..3 {
            per.admit_address(bad, t0).unwrap();
            per.admit_edge("stolen", bad, t0).unwrap();
        }
        assert_eq!(per.admit_edge("stolen", bad, t0), Err("edge_rate"), "the burst is spent");
        assert_eq!(metrics.cooling_addresses.get(), 1);
        // Its address now starts nothing until its own rate has refilled a token (2 a second).
        assert_eq!(per.admit_address(bad, t0), Err("address_rate"));
        assert_eq!(per.admit_address(bad, t0 + Duration::from_millis(400)), Err("address_rate"));
        assert_eq!(per.admit_address(bad, t0 + Duration::from_millis(500)), Ok(()));
        assert_eq!(per.admit_address(bad, t0 + Duration::from_millis(600)), Err("address_rate"));
        // Other addresses and other certificates are untouched.
        assert_eq!(per.admit_address(good, t0), Ok(()));
        assert_eq!(per.admit_edge("honest", good, t0), Ok(()));
        // A second later the certificate has one token back.
        assert_eq!(per.admit_edge("stolen", bad, t0 + Duration::from_secs(1)), Ok(()));
        assert_eq!(per.admit_edge("stolen", bad, t0 + Duration::from_secs(1)), Err("edge_rate"));
        // The cooldown runs from the last refusal; after it the address is free again.
        let later = t0 + Duration::from_secs(11);
        for _ in 0..10 {
            assert_eq!(per.admit_address(bad, later), Ok(()));
        }
        assert_eq!(metrics.cooling_addresses.get(), 0);
    }

    #[test]
    fn an_ipv6_host_cools_down_by_its_64() {
        let metrics = Arc::new(LimitMetrics::default());
        let t0 = Instant::now();
        let mut per = PerEdge::new(&limits(), metrics, t0);
        for _ in 0..3 {
            per.admit_edge("stolen", ip("2001:db8:1:2::5"), t0).unwrap();
        }
        assert!(per.admit_edge("stolen", ip("2001:db8:1:2::5"), t0).is_err());
        assert_eq!(per.admit_address(ip("2001:db8:1:2:ffff::9"), t0), Err("address_rate"), "same /64");
        assert_eq!(per.admit_address(ip("2001:db8:1:3::5"), t0), Ok(()), "another /64");
        assert_eq!(host(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
    }

    #[test]
    fn both_tables_are_bounded_and_their_overflow_counted() {
        let metrics = Arc::new(LimitMetrics::default());
        let t0 = Instant::now();
        let config = LimitsConfig { max_connections: 2, cooldown_addresses: 1, ..limits() };
        let mut per = PerEdge::new(&config, metrics.clone(), t0);
        per.admit_edge("a", ip("192.0.2.1"), t0).unwrap();
        per.admit_edge("b", ip("192.0.2.1"), t0).unwrap();
        per.admit_edge("c", ip("192.0.2.1"), t0).unwrap();
        per.admit_edge("d", ip("192.0.2.1"), t0).unwrap();
        assert_eq!(per.edges.len(), 4);
        // Full: a fifth is admitted untracked while the four are short of a full bucket.
        for _ in 0..5 {
            per.admit_edge("e", ip("192.0.2.1"), t0).unwrap();
        }
        assert_eq!(metrics.untracked.get_or_create(&crate::limits::WhatLabel { what: "edge" }).get(), 5);
        // Three seconds on, their buckets are full again and a sweep makes room.
        let later = t0 + Duration::from_secs(3);
        per.admit_edge("e", ip("192.0.2.1"), later).unwrap();
        assert_eq!(per.edges.len(), 1);
        // One address cools down at most: a second over-rate certificate's is not remembered.
        for edge in ["x", "y"] {
            let from = if edge == "x" { ip("192.0.2.10") } else { ip("192.0.2.11") };
            while per.admit_edge(edge, from, later).is_ok() {}
        }
        assert_eq!(per.cooling.len(), 1);
        assert_eq!(per.admit_address(ip("192.0.2.11"), later), Ok(()));
        assert_eq!(metrics.untracked.get_or_create(&crate::limits::WhatLabel { what: "address" }).get(), 1);
    }
}
