//! Which lane the uplink reads its next window from. Lanes drain by priority (lane 0 first),
//! but a backlog in a high lane must not starve the lower ones forever: every `1 / share`-th
//! window goes to the lower lanes that have records, in turn, so together they get at least
//! `share` of the windows while they are backlogged, and all of the uplink when the higher
//! lanes are empty.

use crate::spool::Lane;

#[derive(Debug, Clone)]
pub(crate) struct DrainOrder {
    /// Every `every`-th pick goes to a lower lane.
    every: u32,
    picks: u32,
    /// The lower lane served last, for the round robin among them.
    last_low: Option<Lane>,
}

impl DrainOrder {
    /// `share` of the windows reserved for lower lanes while they have records; 0 < share ≤ 0.5.
    pub(crate) fn new(share: f64) -> Self {
        let share = share.clamp(0.01, 0.5);
        Self { every: (1.0 / share).round() as u32, picks: 0, last_low: None }
    }

    /// The lane to read next, among `ready` (lanes with records to send, any order); `None` if
    /// none is ready.
    pub(crate) fn next(&mut self, ready: &[Lane]) -> Option<Lane> {
        let top = *ready.iter().min()?;
        self.picks = self.picks.wrapping_add(1);
        if !self.picks.is_multiple_of(self.every) {
            return Some(top);
        }
        let mut lower: Vec<Lane> = ready.iter().copied().filter(|l| *l != top).collect();
        if lower.is_empty() {
            return Some(top);
        }
        lower.sort_unstable();
        lower.dedup();
        // Round robin: the first lower lane after the one served last, wrapping around.
        let pick = match self.last_low {
            Some(last) => lower.iter().copied().find(|l| *l > last).unwrap_or(lower[0]),
            None => lower[0],
        };
        self.last_low = Some(pick);
        Some(pick)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(order: &mut DrainOrder, ready: &[Lane], picks: usize) -> std::collections::BTreeMap<u8, usize> {
        let mut count = std::collections::BTreeMap::new();
        for _ in 0..picks {
            *count.entry(order.next(ready).unwrap().0).or_default() += 1;
        }
        count
    }

    #[test]
    fn priority_first_with_a_guaranteed_share_for_lower_lanes() {
        let mut order = DrainOrder::new(0.1);
        let count = shares(&mut order, &[Lane(3), Lane(0), Lane(7)], 1000);
        assert_eq!(count[&0], 900, "{count:?}");
        assert_eq!((count[&3], count[&7]), (50, 50), "lower lanes share in turn: {count:?}");
    }

    #[test]
    fn a_lone_lane_gets_everything_and_nothing_ready_is_none() {
        let mut order = DrainOrder::new(0.2);
        assert_eq!(shares(&mut order, &[Lane(5)], 100)[&5], 100);
        assert_eq!(order.next(&[]), None);
    }

    #[test]
    fn the_round_robin_survives_lanes_coming_and_going() {
        let mut order = DrainOrder::new(0.5);
        let mut low = Vec::new();
        for ready in [&[Lane(0), Lane(2), Lane(4)][..], &[Lane(0), Lane(2), Lane(4)], &[Lane(0), Lane(2)]] {
            assert_eq!(order.next(ready), Some(Lane(0)));
            low.push(order.next(ready).unwrap());
        }
        assert_eq!(low, [Lane(2), Lane(4), Lane(2)]);
    }
}
