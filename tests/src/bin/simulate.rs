//! Runs the whole-system simulation (`e2e_tests::sim`) over many seeds, or replays one.
//!
//! `simulate --seed N [--trace LINES]` replays seed N and prints its trace's end if it fails;
//! `simulate --from N --seeds K [--hours H] [--actions A]` runs seeds N.. until K ran or H hours
//! passed, and stops at the first failure, printing its seed and trace; with `--keep-going` it
//! prints one line per failing seed and goes on (to survey what a change breaks).

use std::time::{Duration, Instant};

use e2e_tests::sim::{self, Config};

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut from, mut seeds, mut hours, mut actions, mut one) = (1u64, u64::MAX, f64::INFINITY, None, None);
    let mut keep_going = false;
    let mut trace = None;
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} takes a value"));
        match arg.as_str() {
            "--seed" => one = Some(value().parse().expect("--seed N")),
            "--from" => from = value().parse().expect("--from N"),
            "--seeds" => seeds = value().parse().expect("--seeds N"),
            "--hours" => hours = value().parse().expect("--hours H"),
            "--actions" => actions = Some(value().parse().expect("--actions N")),
            "--trace" => trace = Some(value().parse().expect("--trace LINES")),
            "--keep-going" => keep_going = true,
            other => panic!("unknown argument {other}; see the doc of tests/src/bin/simulate.rs"),
        }
    }
    let config = |seed| {
        let mut c = Config::new(seed);
        if let Some(a) = actions {
            c.actions = a;
        }
        if let Some(t) = trace {
            c.trace = t;
        }
        c
    };
    if let Some(seed) = one {
        match sim::run(config(seed)) {
            Ok(s) => println!("{}", sim::describe(&s)),
            Err(f) => {
                println!("{f}");
                std::process::exit(1);
            }
        }
        return;
    }
    let started = Instant::now();
    let until = started + Duration::from_secs_f64((hours * 3600.0).min(1e9));
    let (mut ran, mut steps, mut failed) = (0u64, 0u64, 0u64);
    for seed in from.. {
        if ran >= seeds || Instant::now() >= until {
            break;
        }
        match sim::run(config(seed)) {
            Ok(s) => {
                ran += 1;
                steps += s.steps;
                if ran % 50 == 0 {
                    let secs = started.elapsed().as_secs_f64();
                    println!(
                        "{ran} seeds, {steps} steps in {secs:.0}s ({:.0} steps/s); last: {}",
                        steps as f64 / secs,
                        sim::describe(&s)
                    );
                }
            }
            Err(f) if keep_going => {
                ran += 1;
                failed += 1;
                println!("seed {} step {}: {}", f.seed, f.step, f.violation);
            }
            Err(f) => {
                println!("{f}");
                std::process::exit(1);
            }
        }
    }
    if failed > 0 {
        println!("{failed} of {ran} seeds failed");
        std::process::exit(1);
    }
    let secs = started.elapsed().as_secs_f64();
    println!("{ran} seeds from {from} held: {steps} steps in {secs:.1}s ({:.0} steps/s)", steps as f64 / secs);
}
