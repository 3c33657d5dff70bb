//! Spool commit rate at the spool's own API (scripts/bench-spool.sh): 1 KiB messages appended
//! in group commits of `batch` records, for each durability level, into a fresh database on the
//! same disk the tests use. Prints one JSON line per durability. Then the normal spool is
//! drained as the uplink drains it (reads of `batch` records, a window of 8 ahead, each acked
//! oldest first): its rate and the process's CPU per drained record, checkpointer included.

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
        if durability == Durability::Normal {
            drain(&mut spool, count, batch as usize)?;
        }
    }
    Ok(())
}

/// Reads and acks everything in lane 1 the way the uplink does, 8 reads ahead of the acks.
fn drain(spool: &mut Spool<SqliteStorage>, count: u64, batch: usize) -> anyhow::Result<()> {
    const WINDOW: usize = 8;
    let (cpu_before, started) = (process_cpu_seconds(), Instant::now());
    let mut sent = std::collections::VecDeque::new();
    let mut after = 0;
    let mut drained = 0u64;
    loop {
        let records = spool.read(Lane(1), edge_node::spool::Seq(after), batch)?;
        if let Some(last) = records.last() {
            after = last.seq.0;
            sent.push_back(after);
        }
        if sent.len() >= WINDOW || (records.is_empty() && !sent.is_empty()) {
            let up_to = sent.pop_front().unwrap_or(after);
            drained += spool.ack(Lane(1), edge_node::spool::Seq(up_to))?;
        } else if records.is_empty() {
            break;
        }
    }
    anyhow::ensure!(drained == count, "drained {drained} of {count}");
    let (secs, cpu) = (started.elapsed().as_secs_f64(), process_cpu_seconds() - cpu_before);
    println!(
        "{}",
        serde_json::json!({
            "drain": count,
            "batch": batch,
            "drain_msg_per_s": (count as f64 / secs).round(),
            "drain_cpu_us_per_record": (cpu * 1e6 / count as f64 * 100.0).round() / 100.0,
        })
    );
    Ok(())
}

/// User and system CPU seconds this process has used, all threads (the checkpointer's too).
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum());
    // USER_HZ, fixed at 100 by the kernel's ABI.
    ticks / 100.0
}
