//! The whole-system simulation (`e2e_tests::sim`, docs/ARCHITECTURE.md "The simulation"): the
//! shipped cores of the edge, the bridge and the sink in one process on a virtual clock, over
//! simulated clients, links, disks and outages, a seed per run. Here a few hundred seeds, split
//! so nextest runs them on every core; `scripts/simulate.sh` searches longer, and replays one.

use e2e_tests::sim::{self, Config};

/// Actions per seed here: a run covers a few minutes of virtual time.
const ACTIONS: usize = 250;

/// Runs the seeds; about two in five write their records into the Kafka-like sink
/// (`sim::kafka`). [issue 44] Across a range, that model's hard paths were taken: transactions
/// producers of a dead bridge fenced by the claims of the next (aborts and waits for settled
/// marks are counted and printed, and taken by the model's own tests each time). Each run's checks are the same
/// for both sinks: every acknowledged record once, and in a Kafka run each lane's records in
/// seq order as a `read_committed` consumer reads them.
fn seeds(from: u64, count: u64) {
    let mut kafka = (0, sim::kafka::Counts::default());
    for seed in from..from + count {
        let config = Config { actions: ACTIONS, ..Config::new(seed) };
        match sim::run(config) {
            Err(failure) => panic!("{failure}"),
            Ok(s) => {
                if let Some(k) = s.kafka {
                    kafka.0 += 1;
                    kafka.1.aborted += k.aborted;
                    kafka.1.unsettled += k.unsettled;
                    kafka.1.late_committed += k.late_committed;
                    kafka.1.fenced += k.fenced;
                    kafka.1.fences += k.fences;
                }
            }
        }
    }
    let (runs, k) = kafka;
    // Aborts, waits for settled marks, late commits and fenced writes are rarer since a claim
    // fences a dead bridge's producers at once (a crash within a transaction's few
    // milliseconds): most ranges take them, and the model's own tests take each every time.
    assert!(
        runs > 0 && k.fences > 0,
        "seeds {from}..{}: {runs} Kafka runs, {k:?}: the model's hard paths were not taken",
        from + count
    );
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
