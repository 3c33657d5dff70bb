//! Where and when the uplink connects: the ring of bridges, the backoff, the probe's answer.
//!
//! A round tries every bridge once before it waits (a dead or busy bridge is no reason to
//! wait before the next one); a refusal waits at once (every bridge refuses a certificate
//! alike). After a failed round the wait may be spent probing the bridges (`reach::Prober`):
//! a probe's answer cuts one wait short per welcomed session, so a bridge that answers probes
//! but whose handshakes time out (saturated) is then retried on backoff alone, not as fast as
//! it answers; the attempt after an answer goes to the address that answered.

use std::net::SocketAddr;
use std::time::Duration;

use shared::proto::backoff::Backoff;

/// What a connection's end means for the next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndKind {
    /// The bridge turned this edge away (a denied or unusable certificate, a refused hello):
    /// retried at `backoff_max` only.
    Refused,
    /// The bridge refused the handshake before TLS, its admission spent: it is up and takes
    /// the edge soon (`shared::proto::backoff`).
    Busy,
    /// The link or the session failed.
    Failed,
}

/// The next connection attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The configured `host:port`.
    pub server: String,
    /// The address that answered a probe, to connect to instead of resolving `server`.
    pub pinned: Option<SocketAddr>,
    /// Attempts so far, this one included: a name with several addresses names several
    /// bridges, taken in turn by this count.
    pub number: usize,
}

/// What to do after a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Try the next bridge at once.
    Now,
    /// Wait `wait` before the next attempt. With `probe_for`, probe the bridges known to answer
    /// instead, for that long at most (never less than `wait`); an answer goes to
    /// [`Dialer::answered`] and the attempt follows it.
    Wait { wait: Duration, probe_for: Option<Duration> },
}

/// The uplink's connect policy, without I/O or a clock.
#[derive(Debug)]
pub struct Dialer {
    servers: Servers,
    backoff: Backoff,
    backoff_max: Duration,
    probing: bool,
    /// A probe's answer may still cut a wait short in this welcomed session's outage.
    armed: bool,
    /// Attempts since the last wait: a round tries every bridge once before waiting.
    tried: usize,
    pinned: Option<SocketAddr>,
    attempts: usize,
}

impl Dialer {
    /// `servers` entered at `start` (a fleet spreads over them), with the backoff bounds and
    /// whether probes are on.
    pub fn new(servers: Vec<String>, start: usize, backoff: (Duration, Duration), probing: bool) -> Self {
        Self {
            servers: Servers::new(servers, start),
            backoff: Backoff::new(backoff.0, backoff.1),
            backoff_max: backoff.1,
            probing,
            armed: true,
            tried: 0,
            pinned: None,
            attempts: 0,
        }
    }

    /// The attempt to make now.
    pub fn poll_attempt(&mut self) -> Attempt {
        self.attempts += 1;
        Attempt { server: self.servers.current().to_owned(), pinned: self.pinned.take(), number: self.attempts }
    }

    /// Every configured bridge (what a probe round asks).
    pub fn servers(&self) -> &[String] {
        self.servers.all()
    }

    /// The step the next failure's wait draws from (for the log).
    #[cfg(test)]
    pub(crate) fn step(&self) -> Duration {
        self.backoff.step()
    }

    /// The connection of the last attempt ended as `kind`; `welcomed` when the bridge welcomed a
    /// session on it. `jitter` is drawn uniformly from `0..1`.
    pub fn handle_end(&mut self, kind: EndKind, welcomed: bool, jitter: f64) -> Next {
        // Only a session the bridge welcomed resets the backoff: a bridge that completes the
        // handshake and then closes (a denied certificate) made every retry look like a
        // success, and a refused edge came back six times a second.
        if welcomed {
            self.backoff.welcomed();
            self.armed = true;
            self.tried = 0;
        }
        self.tried += 1;
        self.servers.advance();
        match kind {
            EndKind::Refused => self.backoff.refused(),
            EndKind::Busy => self.backoff.busy(),
            EndKind::Failed => self.backoff.failed(),
        }
        if self.tried < self.servers.len() && kind != EndKind::Refused {
            return Next::Now;
        }
        self.tried = 0;
        let wait = self.backoff.wait(jitter);
        let probe = self.probing && self.armed && kind == EndKind::Failed;
        Next::Wait { wait, probe_for: probe.then(|| wait.max(self.backoff_max)) }
    }

    /// A session ended by this edge's choice, not the link's (a recovered spool sent whole, or
    /// one waiting to go first): the next attempt goes at once to the same bridge, from the
    /// start of the backoff.
    pub(crate) fn handle_switch(&mut self) {
        self.backoff.welcomed();
    }

    /// `server` answered a probe at `addr`: the next attempt goes there, and no later answer
    /// cuts a wait short until a session is welcomed again.
    pub fn handle_answer(&mut self, server: &str, addr: SocketAddr) {
        self.armed = false;
        self.servers.prefer(server);
        self.pinned = Some(addr);
    }
}

/// The configured bridges in the order they are tried.
#[derive(Debug)]
pub struct Servers {
    list: Vec<String>,
    next: usize,
}

impl Servers {
    /// `list` entered at `start` (modulo its length).
    pub(crate) fn new(list: Vec<String>, start: usize) -> Self {
        let next = start % list.len().max(1);
        Self { list, next }
    }

    pub(crate) fn current(&self) -> &str {
        &self.list[self.next]
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    pub(crate) fn advance(&mut self) {
        self.next = (self.next + 1) % self.list.len().max(1);
    }

    /// Makes `server` the next one tried.
    pub(crate) fn prefer(&mut self, server: &str) {
        if let Some(i) = self.list.iter().position(|s| s == server) {
            self.next = i;
        }
    }

    pub(crate) fn all(&self) -> &[String] {
        &self.list
    }
}
