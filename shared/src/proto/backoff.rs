//! How an edge waits between connection attempts, without I/O or a clock. The real edge's
//! uplink and the fleet generator both follow it.
//!
//! - A failure (the link, a timeout, a session lost): exponential from `min` to `max`, each wait
//!   between half the step and all of it, so a fleet that lost the same bridge does not come
//!   back in step.
//! - Busy (the bridge refused the handshake before TLS: its admission rate or connection count
//!   is spent): the bridge is up and will take the edge soon. The first wait is drawn from all
//!   of a window of [`BUSY_WINDOW`]; each further one from the next window, which starts where
//!   the last ended and is half as wide again, up to [`BUSY_WINDOW_MAX`]. Refused edges move on
//!   to time no one has tried yet instead of drawing again from now, where the ones refused
//!   later would pile up: ten thousand edges at a bridge admitting 500 a second are all in after
//!   about 25 s (a draw from now, doubling, takes 41 s; the test below plays it). The cap keeps
//!   the last edges from waiting in ever wider windows while the bridge has room again: the
//!   10,000-edge storm on the test machine, where the bridge finished about 320 handshakes a
//!   second, had its last edges in 48 s with windows growing to 30 s.
//! - Refused (the bridge turned this edge away: a denied certificate, a refused hello): `max`.
//! - Only a session the bridge welcomed starts it all from the beginning again: a bridge that
//!   completes the handshake and then closes would otherwise make every retry look like a
//!   success.

use std::time::Duration;

/// The first window a busy bridge's refusal spreads its edges over.
pub(crate) const BUSY_WINDOW: Duration = Duration::from_secs(2);

/// How much wider each busy window is than the one before.
const BUSY_GROWTH: f64 = 1.5;

/// The widest busy window.
pub(crate) const BUSY_WINDOW_MAX: Duration = Duration::from_secs(6);

#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    /// The width of the next busy window, and what was left of the last one after the attempt
    /// drawn from it.
    busy_width: Duration,
    busy_rest: Duration,
    last: Outcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Failed,
    Busy,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        let max = max.max(min);
        Self { min, max, next: min, busy_width: BUSY_WINDOW.min(max), busy_rest: Duration::ZERO, last: Outcome::Failed }
    }

    /// The bridge welcomed a session: every wait starts from the beginning again.
    pub fn welcomed(&mut self) {
        self.next = self.min;
        self.busy_width = BUSY_WINDOW.min(self.max);
        self.busy_rest = Duration::ZERO;
    }

    /// The bridge turned this edge away: the next wait is the longest.
    pub fn refused(&mut self) {
        self.next = self.max;
        self.last = Outcome::Failed;
    }

    /// The bridge was too busy to take the handshake: the next wait is drawn from the next busy
    /// window.
    pub fn busy(&mut self) {
        self.last = Outcome::Busy;
    }

    /// Any other failure.
    pub fn failed(&mut self) {
        self.last = Outcome::Failed;
    }

    /// The wait before the next attempt, for `jitter` drawn uniformly from `0..1`.
    pub fn wait(&mut self, jitter: f64) -> Duration {
        let jitter = jitter.clamp(0.0, 1.0);
        match self.last {
            Outcome::Busy => {
                let into = self.busy_width.mul_f64(jitter);
                let wait = self.busy_rest + into;
                self.busy_rest = self.busy_width - into;
                self.busy_width = self.busy_width.mul_f64(BUSY_GROWTH).min(BUSY_WINDOW_MAX).min(self.max);
                wait
            }
            Outcome::Failed => {
                let wait = self.next.mul_f64(0.5 + 0.5 * jitter);
                self.next = (self.next * 2).min(self.max);
                wait
            }
        }
    }

    /// The step the next failure's wait draws from.
    pub fn step(&self) -> Duration {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_with_jitter_and_only_a_welcome_resets_them() {
        let (min, max) = (Duration::from_millis(200), Duration::from_secs(30));
        let mut b = Backoff::new(min, max);
        assert_eq!(b.wait(1.0), min);
        assert_eq!(b.wait(0.0), Duration::from_millis(200), "half of 400 ms");
        for _ in 0..20 {
            b.wait(0.5);
        }
        assert_eq!(b.step(), max, "capped");
        b.welcomed();
        assert_eq!(b.step(), min);
        b.refused();
        assert_eq!(b.wait(1.0), max, "a refusal waits the longest");
        assert!(b.wait(0.0) >= max / 2);
    }

    #[test]
    fn a_busy_bridge_sends_its_edges_on_to_later_and_wider_windows() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
        b.busy();
        assert_eq!(b.wait(0.0), Duration::ZERO, "anywhere in the first window, its start included");
        b.busy();
        // The first window (0..2 s) is passed over whole: 2 s left of it, then 3 s of the next.
        assert_eq!(b.wait(1.0), Duration::from_secs(5));
        b.busy();
        assert_eq!(b.wait(0.0), Duration::ZERO, "the next window starts where that one ended");
        b.busy();
        assert_eq!(
            b.wait(0.5),
            Duration::from_millis(4500 + 3000),
            "the rest of 4.5 s, half of 6 s (not 6.75: capped)"
        );
        for _ in 0..20 {
            b.busy();
            b.wait(1.0);
        }
        b.busy();
        assert_eq!(b.wait(1.0), BUSY_WINDOW_MAX, "windows are at most BUSY_WINDOW_MAX wide");
        let mut short = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        for _ in 0..5 {
            short.busy();
            short.wait(1.0);
        }
        short.busy();
        assert_eq!(short.wait(1.0), Duration::from_secs(1), "and at most max");
        // Busy waits leave the failure steps alone, and a welcome resets both.
        b.failed();
        assert_eq!(b.wait(1.0), Duration::from_millis(200));
        b.welcomed();
        b.busy();
        assert_eq!(b.wait(1.0), BUSY_WINDOW);
    }

    /// Ten thousand edges at once at a bridge that admits 500 a second (a burst of 500): with
    /// the busy windows they are all in within 30 s, the admission rate's 20 s at best.
    #[test]
    fn a_storm_of_ten_thousand_at_five_hundred_a_second_is_in_within_thirty_seconds() {
        let (rate, burst) = (500.0, 500.0);
        let mut edges: Vec<Backoff> =
            (0..10_000).map(|_| Backoff::new(Duration::from_millis(200), Duration::from_secs(30))).collect();
        // A deterministic jitter sequence (an LCG) stands for the edges' random draws.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut jitter = move || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let (mut tokens, mut now, mut last_in) = (burst, 0.0f64, 0.0f64);
        // Attempts by time (in microseconds), earliest first.
        let mut due: std::collections::BinaryHeap<std::cmp::Reverse<(u64, usize)>> =
            (0..edges.len()).map(|i| std::cmp::Reverse((0, i))).collect();
        while let Some(std::cmp::Reverse((at, i))) = due.pop() {
            let at = at as f64 / 1e6;
            tokens = (tokens + (at - now) * rate).min(burst);
            now = at;
            if tokens >= 1.0 {
                tokens -= 1.0;
                last_in = now;
            } else {
                let b = &mut edges[i];
                b.busy();
                let next = now + b.wait(jitter()).as_secs_f64();
                due.push(std::cmp::Reverse(((next * 1e6) as u64, i)));
            }
        }
        assert!(last_in < 30.0, "the last edge came in after {last_in:.1} s");
        assert!(last_in > 10_000.0 / rate, "faster than the admission rate allows: {last_in:.1} s");
    }
}
