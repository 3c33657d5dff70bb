//! The whole-system simulation (`e2e_tests::sim`, docs/ARCHITECTURE.md "The simulation"): the
//! shipped cores of the edge, the bridge and the sink in one process on a virtual clock, over
//! simulated clients, links, disks and outages, a seed per run. Here a few hundred seeds, split
//! so nextest runs them on every core; `scripts/simulate.sh` searches longer, and replays one.

use e2e_tests::sim::{self, Config};

/// Actions per seed here: a run covers a few minutes of virtual time.
const ACTIONS: usize = 250;

fn seeds(from: u64, count: u64) {
    for seed in from..from + count {
        let config = Config { actions: ACTIONS, ..Config::new(seed) };
        if let Err(failure) = sim::run(config) {
            panic!("{failure}");
        }
    }
}

#[test]
fn seeds_1_to_30() {
    seeds(1, 30);
}

#[test]
fn seeds_31_to_60() {
    seeds(31, 30);
}

#[test]
fn seeds_61_to_90() {
    seeds(61, 30);
}

#[test]
fn seeds_91_to_120() {
    seeds(91, 30);
}

#[test]
fn seeds_121_to_150() {
    seeds(121, 30);
}

#[test]
fn seeds_151_to_180() {
    seeds(151, 30);
}

#[test]
fn seeds_181_to_210() {
    seeds(181, 30);
}

#[test]
fn seeds_211_to_240() {
    seeds(211, 30);
}

/// A seed replays identically: the same run, twice in one process (where every `HashMap` gets
/// keys of its own), gives the same trace, so a failing seed's trace is the one to read.
#[test]
fn a_seed_replays_identically() {
    for seed in [1, 2, 3, 4, 5, 6] {
        let config = Config { actions: 120, ..Config::new(seed) };
        let first = sim::run(config.clone()).unwrap_or_else(|f| panic!("{f}"));
        let again = sim::run(config).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(
            (first.trace_hash, first.steps),
            (again.trace_hash, again.steps),
            "seed {seed} ran two ways: {} / {}",
            sim::describe(&first),
            sim::describe(&again)
        );
    }
}
