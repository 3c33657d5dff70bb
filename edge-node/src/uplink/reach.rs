//! Which bridge the uplink connects to next, and, while the link is down, asking the bridges
//! whether they are back.
//!
//! - `core::dial::Servers`: the configured bridges in a ring, entered at a random place so a
//!   fleet spreads over them; the uplink moves one step on whenever a connection ends, and
//!   stays where a session works.
//! - [`Prober`]: the reachability probe of `shared::proto::probe`, a datagram a bridge answers
//!   without a handshake. Once a bridge has answered one (learnt while connected), an edge
//!   that lost its link probes every `probe_interval` instead of spending 10 s handshakes into
//!   a dead path, and reconnects within moments of a probe being answered. Probes back off too
//!   (doubling after each five minutes unanswered, up to `backoff_max`): an outage of up to
//!   five minutes is probed every `probe_interval` (2 s: 150 probes, 180 KB), an hour's costs
//!   about 430 KB.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use rand::Rng;
use shared::proto::probe;
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

/// A bridge's configured name and one of its addresses.
#[derive(Debug, Clone)]
pub struct Target {
    pub server: String,
    pub addr: SocketAddr,
}

/// Every address of every server; a name that does not resolve is left out (the connection
/// attempt names its error).
pub(crate) async fn resolve(servers: &[String]) -> Vec<Target> {
    let mut out = Vec::new();
    for server in servers {
        if let Ok(addrs) = tokio::net::lookup_host(server.as_str()).await {
            out.extend(addrs.map(|addr| Target { server: server.clone(), addr }));
        }
    }
    out
}

shared::metrics! {
    /// What the reachability probes of a link that is down count.
    #[derive(Debug, Clone)]
    pub struct ReachMetrics {
        pub sent: Counter => ("uplink_probes", "Reachability probes sent to bridges while the link was down"),
        pub answered: Counter => ("uplink_probe_answers", "Reachability probes a bridge answered"),
    }
}

/// How long a probe waits for its answer when learning whether a bridge answers probes.
const LEARN_WAIT: Duration = Duration::from_secs(1);
const LEARN_TRIES: u32 = 3;
/// Probes stay at `probe_interval` for this long without an answer, then double.
const PROBE_STEP: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
pub struct Prober {
    interval: Duration,
    max: Duration,
    /// Addresses that have answered a probe: only for those does an unanswered probe mean the
    /// path is down (a firewall or load balancer may drop unknown versions).
    answering: Arc<Mutex<HashSet<SocketAddr>>>,
    /// Since when probes have gone unanswered, across waits: the interval grows with it.
    silent_since: Arc<Mutex<Option<Instant>>>,
    metrics: ReachMetrics,
}

impl Prober {
    pub fn new(interval: Duration, max: Duration, metrics: ReachMetrics) -> Self {
        Self { interval, max: max.max(interval), answering: Arc::default(), silent_since: Arc::default(), metrics }
    }

    pub fn enabled(&self) -> bool {
        !self.interval.is_zero()
    }

    /// The wait after an answer before the handshake: edges behind one link that came back
    /// do not all start in the same instant.
    pub fn jitter(&self) -> Duration {
        self.interval.mul_f64(rand::thread_rng().gen_range(0.0..0.25))
    }

    /// A session was welcomed: the next outage's probes start at `probe_interval` again.
    pub fn welcomed(&self) {
        *self.silent_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Whether any of `targets` is known to answer probes.
    /// How long a round waits for an answer from a bridge `rtt` away before it counts as
    /// unanswered: four round trips, at least 200 ms, at most the probe interval. A bridge on
    /// the path the session measured answers in one; waiting the whole interval (2 s) made a
    /// dead bridge cost three of them before the edge moved on.
    pub(crate) fn round_wait(&self, rtt: Duration) -> Duration {
        let floor = Duration::from_millis(200);
        (rtt * 4).max(floor).min(self.interval.max(floor))
    }

    pub(crate) fn trusted(&self, targets: &[Target]) -> bool {
        let answering = self.answering.lock().unwrap_or_else(|e| e.into_inner());
        targets.iter().any(|t| answering.contains(&t.addr))
    }

    /// Learns in the background whether the bridge at `addr` answers probes (a few probes, a
    /// second apart); dropping the handle stops it.
    pub fn learn(&self, addr: SocketAddr) -> Option<AbortOnDropHandle<()>> {
        if !self.enabled() || self.answering.lock().unwrap_or_else(|e| e.into_inner()).contains(&addr) {
            return None;
        }
        let this = self.clone();
        Some(AbortOnDropHandle::new(tokio::spawn(async move {
            let target = [Target { server: String::new(), addr }];
            for _ in 0..LEARN_TRIES {
                if this.round(&target, Instant::now() + LEARN_WAIT).await.is_some() {
                    return;
                }
            }
            tracing::debug!(%addr, "bridge does not answer reachability probes; reconnecting on backoff alone");
        })))
    }

    /// Waits `wait` before the next attempt (`core::Next::Wait`); with `probe_for`, and a
    /// bridge among `servers` known to answer, probes them for that long instead and returns
    /// the one that answered.
    pub async fn wait(&self, servers: &[String], wait: Duration, probe_for: Option<Duration>) -> Option<Target> {
        let targets = match probe_for {
            Some(_) if self.enabled() => resolve(servers).await,
            _ => Vec::new(),
        };
        let Some(most) = probe_for.filter(|_| self.trusted(&targets)) else {
            tokio::time::sleep(wait).await;
            return None;
        };
        self.until_answer(&targets, Instant::now() + most).await
    }

    /// Probes `targets` until one answers (it is returned) or `deadline` passes.
    pub(crate) async fn until_answer(&self, targets: &[Target], deadline: Instant) -> Option<Target> {
        let started = *self.silent_since.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(Instant::now);
        loop {
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let silent = now - started;
            let doublings = (silent.as_secs() / PROBE_STEP.as_secs()).min(16) as u32;
            let interval = (self.interval * 2u32.pow(doublings)).min(self.max);
            if let Some(server) = self.round(targets, (now + interval).min(deadline)).await {
                return Some(server);
            }
        }
    }

    /// Whether any of `targets` answers within `rounds` rounds of `per_round` each.
    pub(crate) async fn answers_within(&self, targets: &[Target], rounds: u32, per_round: Duration) -> bool {
        for _ in 0..rounds {
            if self.round(targets, Instant::now() + per_round).await.is_some() {
                return true;
            }
        }
        false
    }

    /// One probe to each target, then answers until `until`.
    async fn round(&self, targets: &[Target], until: Instant) -> Option<Target> {
        let id: [u8; 8] = rand::thread_rng().r#gen();
        let datagram = probe::datagram(id);
        let (v4, v6) = (targets.iter().any(|t| t.addr.is_ipv4()), targets.iter().any(|t| t.addr.is_ipv6()));
        let bind = |any: SocketAddr| async move { UdpSocket::bind(any).await.ok() };
        let s4 = if v4 { bind(SocketAddr::from(([0, 0, 0, 0], 0))).await } else { None };
        let s6 = if v6 { bind(SocketAddr::from(([0u16; 8], 0))).await } else { None };
        for t in targets {
            let socket = if t.addr.is_ipv4() { &s4 } else { &s6 };
            if let Some(s) = socket
                && s.send_to(&datagram, t.addr).await.is_ok()
            {
                self.metrics.sent.inc();
            }
        }
        let answer = async {
            let mut b4 = [0u8; 256];
            let mut b6 = [0u8; 256];
            loop {
                let got = tokio::select! {
                    r = recv(&s4, &mut b4) => r.map(|(n, from)| (b4[..n].to_vec(), from)),
                    r = recv(&s6, &mut b6) => r.map(|(n, from)| (b6[..n].to_vec(), from)),
                };
                let Some((bytes, from)) = got else { continue };
                if !probe::answers(&bytes, id) {
                    continue;
                }
                if let Some(t) = targets.iter().find(|t| t.addr == from) {
                    return t.clone();
                }
            }
        };
        let t = tokio::time::timeout_at(until, answer).await.ok()?;
        self.metrics.answered.inc();
        self.answering.lock().unwrap_or_else(|e| e.into_inner()).insert(t.addr);
        *self.silent_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Some(t)
    }
}

/// A datagram from `socket`, or never when there is none; errors (an ICMP unreachable from an
/// earlier send) are passed over as `None`.
async fn recv(socket: &Option<UdpSocket>, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
    match socket {
        Some(s) => s.recv_from(buf).await.ok(),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real bridge endpoint answers the probe without a connection: quinn sends the Version
    /// Negotiation from its endpoint (RFC 9000 §6.1: a server that does not support the
    /// client's version sends one), and a port with nothing on it does not.
    #[tokio::test]
    async fn a_quic_server_answers_the_probe_and_a_closed_port_does_not() {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
        let config = quinn::ServerConfig::with_single_cert(vec![cert.cert.der().clone()], key).unwrap();
        let endpoint = quinn::Endpoint::server(config, "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = endpoint.local_addr().unwrap();
        let prober = Prober::new(Duration::from_millis(100), Duration::from_secs(1), ReachMetrics::default());
        let target = |addr| vec![Target { server: "bridge".into(), addr }];
        let deadline = Instant::now() + Duration::from_secs(5);
        let answered = prober.until_answer(&target(addr), deadline).await.expect("answered");
        assert_eq!((answered.server.as_str(), answered.addr), ("bridge", addr));
        assert!(prober.trusted(&target(addr)));
        let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let closed_addr = closed.local_addr().unwrap();
        drop(closed);
        let deadline = Instant::now() + Duration::from_millis(400);
        assert!(prober.until_answer(&target(closed_addr), deadline).await.is_none());
        assert!(!prober.trusted(&target(closed_addr)));
        assert!(prober.metrics.sent.get() >= 4, "a probe every 100 ms: {}", prober.metrics.sent.get());
    }
}
