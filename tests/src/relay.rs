//! A UDP impairment relay for QUIC links (this kernel has no netem): the edge talks to the
//! relay, the relay to the bridge. Loss, delay with jitter (which reorders), a rate limit (a
//! bottleneck with a 100 ms tail-drop queue, each way) and a blackhole can be changed while it
//! runs. Each client address gets its own upstream socket, as behind a NAT.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::net::UdpSocket;

#[derive(Debug, Default)]
pub struct Impairment {
    /// Drop everything, both ways.
    pub blackhole: AtomicBool,
    /// Per-mille of datagrams dropped, each way.
    pub loss_permille: AtomicU32,
    /// One-way delay and its jitter (uniform, ±), in microseconds.
    pub delay_us: AtomicU64,
    pub jitter_us: AtomicU64,
    /// Datagrams forwarded and dropped, for the test's own checks.
    pub forwarded: AtomicU64,
    pub dropped: AtomicU64,
    /// UDP payload bytes forwarded from the edge to the bridge, and back.
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
    pub datagrams_up: AtomicU64,
    /// Bottleneck rate, bytes per second each way; 0 for none.
    pub rate_bytes_per_s: AtomicU64,
    /// Per direction (up, down), when the bottleneck is free again.
    busy_until: std::sync::Mutex<[Option<std::time::Instant>; 2]>,
}

/// The bottleneck's queue: a datagram that would wait longer is dropped.
const QUEUE: Duration = Duration::from_millis(100);

impl Impairment {
    pub fn set_loss(&self, permille: u32) {
        self.loss_permille.store(permille, Ordering::Relaxed);
    }
    pub fn set_delay(&self, delay: Duration, jitter: Duration) {
        self.delay_us.store(delay.as_micros() as u64, Ordering::Relaxed);
        self.jitter_us.store(jitter.as_micros() as u64, Ordering::Relaxed);
    }
    pub fn set_blackhole(&self, on: bool) {
        self.blackhole.store(on, Ordering::Relaxed);
    }
    pub fn set_rate(&self, bytes_per_s: u64) {
        self.rate_bytes_per_s.store(bytes_per_s, Ordering::Relaxed);
    }

    /// How long a datagram of `len` bytes waits for and crosses the bottleneck in direction
    /// `dir`, or `None` when the queue is full.
    fn bottleneck(&self, dir: usize, len: usize) -> Option<Duration> {
        let rate = self.rate_bytes_per_s.load(Ordering::Relaxed);
        if rate == 0 {
            return Some(Duration::ZERO);
        }
        let now = std::time::Instant::now();
        let mut busy = self.busy_until.lock().unwrap_or_else(|p| p.into_inner());
        let start = busy[dir].map_or(now, |b| b.max(now));
        if start - now > QUEUE {
            return None;
        }
        let done = start + Duration::from_secs_f64(len as f64 / rate as f64);
        busy[dir] = Some(done);
        Some(done - now)
    }

    /// The delay for the next datagram, or `None` to drop it.
    fn verdict(&self) -> Option<Duration> {
        if self.blackhole.load(Ordering::Relaxed) {
            return None;
        }
        let mut rng = rand::thread_rng();
        if rng.gen_range(0..1000) < self.loss_permille.load(Ordering::Relaxed) {
            return None;
        }
        let delay = self.delay_us.load(Ordering::Relaxed) as i64;
        let jitter = self.jitter_us.load(Ordering::Relaxed) as i64;
        let d = if jitter > 0 { delay + rng.gen_range(-jitter..=jitter) } else { delay };
        Some(Duration::from_micros(d.max(0) as u64))
    }
}

pub struct UdpRelay {
    pub addr: SocketAddr,
    pub impairment: Arc<Impairment>,
    task: tokio::task::JoinHandle<()>,
}

impl UdpRelay {
    /// A relay on a free loopback port forwarding to `target`.
    pub async fn start(target: SocketAddr) -> UdpRelay {
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("relay socket"));
        let addr = front.local_addr().expect("relay addr");
        let impairment = Arc::new(Impairment::default());
        let imp = impairment.clone();
        let task = tokio::spawn(async move {
            // One upstream socket per client address, as a NAT would keep: the edge's QUIC
            // socket and its probe socket are different clients.
            let mut clients: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
            let mut downs = tokio::task::JoinSet::new();
            let mut up = vec![0u8; 65_536];
            loop {
                let Ok((n, from)) = front.recv_from(&mut up).await else { return };
                let back = match clients.get(&from) {
                    Some(b) => b.clone(),
                    None => {
                        let Ok(back) = UdpSocket::bind("127.0.0.1:0").await else { continue };
                        if back.connect(target).await.is_err() {
                            continue;
                        }
                        let back = Arc::new(back);
                        clients.insert(from, back.clone());
                        let (front, down_socket, imp) = (front.clone(), back.clone(), imp.clone());
                        downs.spawn(async move {
                            let back = down_socket;
                            let mut down = vec![0u8; 65_536];
                            loop {
                                // An ICMP unreachable from the target surfaces as an error here.
                                let Ok(n) = back.recv(&mut down).await else { continue };
                                forward(&imp, down[..n].to_vec(), front.clone(), Some(from));
                            }
                        });
                        back
                    }
                };
                forward(&imp, up[..n].to_vec(), back, None);
            }
        });
        UdpRelay { addr, impairment, task }
    }
}

fn forward(imp: &Arc<Impairment>, datagram: Vec<u8>, socket: Arc<UdpSocket>, to: Option<SocketAddr>) {
    let dir = usize::from(to.is_some());
    let Some(delay) = imp.verdict().and_then(|d| Some(d + imp.bottleneck(dir, datagram.len())?)) else {
        imp.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    };
    imp.forwarded.fetch_add(1, Ordering::Relaxed);
    if to.is_none() {
        imp.datagrams_up.fetch_add(1, Ordering::Relaxed);
    }
    let bytes = if to.is_none() { &imp.bytes_up } else { &imp.bytes_down };
    bytes.fetch_add(datagram.len() as u64, Ordering::Relaxed);
    let send = async move {
        let _ = match to {
            Some(to) => socket.send_to(&datagram, to).await,
            None => socket.send(&datagram).await,
        };
    };
    if delay.is_zero() {
        tokio::spawn(send);
    } else {
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            send.await;
        });
    }
}

impl Drop for UdpRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
