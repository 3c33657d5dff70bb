//! The `process_*` metrics Prometheus clients conventionally export (CPU seconds, resident and
//! virtual memory, threads, open and maximum file descriptors, start time), read from
//! `/proc/self` at each scrape, and a `<binary>_build_info` gauge. Both binaries register them
//! in their registry's root, beside their own prefixed families.
//!
//! Memory is read from `/proc/self/status` in kB, not from `stat`'s page counts, so the figure
//! holds on ARM kernels with 16 or 64 KiB pages; CPU time and the start time come from `stat`
//! in clock ticks of `USER_HZ`, which Linux fixes at 100 on every architecture it exports to
//! user space.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::{Registry, Unit};

/// `USER_HZ`: clock ticks a second in `/proc` (fixed by the kernel's ABI).
const TICKS_PER_SECOND: f64 = 100.0;

/// What one scrape read of the process; a field that could not be read is `None` and its
/// metric left out.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub threads: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads this process's figures.
    pub(crate) fn read() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let mut stats = Self::parse(&stat, &status, &limits, &boot);
        stats.open_fds = std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64);
        stats
    }

    /// The figures in the text of `/proc/self/stat`, `/proc/self/status`, `/proc/self/limits`
    /// and `/proc/stat`.
    pub(crate) fn parse(stat: &str, status: &str, limits: &str, boot: &str) -> Self {
        // The command name (field 2) is in parentheses and may hold spaces and parentheses:
        // the fields after it start after the last ')'. Field 3 is then index 0.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        let cpu_seconds = field(14).zip(field(15)).map(|(user, system)| (user + system) as f64 / TICKS_PER_SECOND);
        let kb = |key: &str| {
            status.lines().find_map(|l| l.strip_prefix(key)?.split_whitespace().next()?.parse::<u64>().ok())
        };
        let threads = status.lines().find_map(|l| l.strip_prefix("Threads:")?.trim().parse().ok());
        let max_fds = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files")?.split_whitespace().next()?.parse::<u64>().ok());
        let boot_time = boot.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok());
        let start_time_seconds = boot_time.zip(field(22)).map(|(b, ticks)| b as f64 + ticks as f64 / TICKS_PER_SECOND);
        Self {
            cpu_seconds,
            resident_bytes: kb("VmRSS:").map(|k| k * 1024),
            virtual_bytes: kb("VmSize:").map(|k| k * 1024),
            threads,
            open_fds: None,
            max_fds,
            start_time_seconds,
        }
    }
}

/// The collector of [`ProcessStats`], read at each scrape.
#[derive(Debug, Default)]
pub(crate) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = ProcessStats::read();
        if let Some(v) = s.cpu_seconds {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent",
                Some(&Unit::Seconds),
                m.metric_type(),
            )?)?;
        }
        let gauges = [
            ("process_resident_memory", "Resident memory size", Some(Unit::Bytes), s.resident_bytes),
            ("process_virtual_memory", "Virtual memory size", Some(Unit::Bytes), s.virtual_bytes),
            ("process_threads", "OS threads in the process", None, s.threads),
            ("process_open_fds", "Open file descriptors", None, s.open_fds),
            ("process_max_fds", "Maximum open file descriptors (soft limit)", None, s.max_fds),
        ];
        for (name, help, unit, value) in gauges {
            let Some(v) = value else { continue };
            let m = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
            m.encode(encoder.encode_descriptor(name, help, unit.as_ref(), m.metric_type())?)?;
        }
        if let Some(v) = s.start_time_seconds {
            let m = ConstGauge::new(v);
            m.encode(encoder.encode_descriptor(
                "process_start_time",
                "Start time of the process since the Unix epoch",
                Some(&Unit::Seconds),
                m.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// Registers the process collector and `<binary>_build_info{version, protocols} 1` in `root`
/// (a registry without a prefix).
pub fn register(root: &mut Registry, binary: &str, version: &str) {
    root.register_collector(Box::new(ProcessCollector));
    let info: Family<Vec<(String, String)>, Gauge> = Family::default();
    let protocols = crate::proto::VERSIONS.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
    info.get_or_create(&vec![("version".to_owned(), version.to_owned()), ("protocols".to_owned(), protocols)]).set(1);
    root.register(
        format!("{binary}_build_info"),
        "The build: its version and the ehb/1 protocol versions it speaks",
        info,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_text_is_read_as_the_conventional_figures() {
        let stat = "4242 (edge (node) x) S 1 4242 4242 0 -1 4194304 1234 0 0 0 250 50 0 0 20 0 7 0 \
                    1500 123456789 2222 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        let status = "Name:\tedge-node\nVmSize:\t  120000 kB\nVmRSS:\t   20480 kB\nThreads:\t7\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        let boot = "cpu  1 2 3\nbtime 1764700000\n";
        let s = ProcessStats::parse(stat, status, limits, boot);
        assert_eq!(s.cpu_seconds, Some(3.0), "250 + 50 ticks");
        assert_eq!(s.resident_bytes, Some(20480 * 1024));
        assert_eq!(s.virtual_bytes, Some(120000 * 1024));
        assert_eq!(s.threads, Some(7));
        assert_eq!(s.max_fds, Some(1024));
        assert_eq!(s.start_time_seconds, Some(1764700000.0 + 15.0));
        assert_eq!(ProcessStats::parse("", "", "", ""), ProcessStats::default());
    }

    #[test]
    fn this_process_reads_and_encodes() {
        let s = ProcessStats::read();
        assert!(s.resident_bytes.unwrap() > 0 && s.open_fds.unwrap() > 0 && s.threads.unwrap() >= 1);
        let mut root = Registry::default();
        register(&mut root, "edge", "1.2.3");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &root).unwrap();
        for family in ["process_cpu_seconds_total ", "process_resident_memory_bytes ", "process_start_time_seconds "] {
            assert!(out.contains(family), "{family} in {out}");
        }
        assert!(out.contains("edge_build_info{version=\"1.2.3\",protocols=\""), "{out}");
    }
}
