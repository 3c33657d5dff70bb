//! A budget of log lines a second for what peers can make happen (a refused connection, a bad
//! packet): past it lines are held back and counted, and the next line written says how many
//! were, so a flood of bad peers neither fills the disk nor hides the lines that matter. The
//! bridge and the edge each keep one; what they count held-back lines with is theirs.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct LogBudget {
    per_second: u32,
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    start: Instant,
    used: u32,
    held_back: u64,
}

impl LogBudget {
    pub fn new(per_second: u32, now: Instant) -> Self {
        Self { per_second, window: Mutex::new(Window { start: now, used: 0, held_back: 0 }) }
    }

    /// Whether a line may be written at `now`; if so, how many were held back since the last
    /// one written.
    pub fn allow_at(&self, now: Instant) -> Option<u64> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if now.saturating_duration_since(w.start) >= Duration::from_secs(1) {
            (w.start, w.used) = (now, 0);
        }
        if w.used < self.per_second {
            w.used += 1;
            return Some(std::mem::take(&mut w.held_back));
        }
        w.held_back += 1;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `per_second` lines a second, the rest held back and told with the next line written.
    #[test]
    fn lines_past_the_budget_are_held_back_and_told() {
        let t0 = Instant::now();
        let b = LogBudget::new(2, t0);
        let at = |ms| b.allow_at(t0 + Duration::from_millis(ms));
        assert_eq!([at(0), at(1), at(2), at(3)], [Some(0), Some(0), None, None]);
        assert_eq!([at(1000), at(1001), at(1002)], [Some(2), Some(0), None]);
    }
}
