//! Spool commit rate at the spool's own API (scripts/bench-spool.sh): 1 KiB messages appended
//! in group commits of `batch` records, for each durability level, into a fresh database on the
//! same disk the tests use. Prints one JSON line per durability.

use std::time::Instant;

use bytes::Bytes;
use edge_node::spool::{Durability, Lane, Message, Properties, Spool, SqliteStorage};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let count: u64 = args.next().unwrap_or_else(|| "200000".into()).parse()?;
    let batch: u64 = args.next().unwrap_or_else(|| "1024".into()).parse()?;
    let dir = tempfile::tempdir_in(std::env::var("SPOOL_BENCH_DIR").unwrap_or_else(|_| "target".into()))?;
    let payload = Bytes::from(vec![b'x'; 1024]);
    for durability in [Durability::Normal, Durability::Full] {
        let path = dir.path().join(format!("{durability:?}.db"));
        let mut spool = Spool::new(SqliteStorage::open(&path)?).with_budget(8 << 30);
        let started = Instant::now();
        let mut commit_us = Vec::new();
        for i in 0..count {
            let message = Message {
                class: "telemetry".into(),
                topic: "telemetry/cam-01/metrics".into(),
                payload: payload.clone(),
                qos: 1,
                enqueued_ms: i,
                expires_ms: None,
                properties: Properties::default(),
            };
            spool.append(Lane(1), message, durability);
            if (i + 1) % batch == 0 {
                let t = Instant::now();
                spool.flush()?;
                commit_us.push(t.elapsed().as_micros() as u64);
            }
        }
        spool.flush()?;
        let secs = started.elapsed().as_secs_f64();
        commit_us.sort_unstable();
        let p = |q: f64| commit_us.get((commit_us.len() as f64 * q) as usize).copied().unwrap_or(0);
        println!(
            "{}",
            serde_json::json!({
                "durability": format!("{durability:?}").to_lowercase(),
                "messages": count,
                "batch": batch,
                "msg_per_s": (count as f64 / secs).round(),
                "commit_p50_us": p(0.5),
                "commit_p99_us": p(0.99),
                "db_bytes": std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
            })
        );
    }
    Ok(())
}
