//! The standard `process_*` metrics Go's client exports for every upstream
//! component (CPU, memory, file descriptors, start time), read from
//! `/proc/self` at scrape time. A value that can't be read is left out.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// Reads `/proc/self` on scrape.
#[derive(Debug)]
pub(super) struct ProcessCollector;

/// What `/proc/self/stat` and friends say, in Prometheus units.
#[derive(Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: Option<f64>,
    start_time: Option<f64>,
    virtual_bytes: Option<f64>,
    resident_bytes: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let p = read_process_stats();
        let series = [
            (
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                MetricType::Counter,
                p.cpu_seconds,
            ),
            ("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, p.open_fds),
            ("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge, p.max_fds),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge, p.virtual_bytes),
            ("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge, p.resident_bytes),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                MetricType::Gauge,
                p.start_time,
            ),
        ];
        for (name, help, kind, value) in series {
            let Some(v) = value else { continue };
            let counter = matches!(kind, MetricType::Counter);
            let mut m = encoder.encode_descriptor(name, help, None, kind)?;
            if counter {
                m.encode_counter::<NoLabelSet, _, u64>(&v, None)?;
            } else {
                m.encode_gauge(&v)?;
            }
        }
        Ok(())
    }
}

fn read_process_stats() -> ProcessStats {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096) as f64;
    let boot = read("/proc/stat").and_then(|s| boot_time(&s));
    let mut stats = read("/proc/self/stat").map(|s| parse_stat(&s, ticks, page, boot)).unwrap_or_default();
    stats.open_fds = std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as f64);
    stats.max_fds = read("/proc/self/limits").and_then(|s| max_open_files(&s));
    stats
}

/// `btime` from `/proc/stat`: boot time, seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<f64> {
    proc_stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

/// Fields of `/proc/self/stat` (after the parenthesised command name, which
/// may hold spaces): utime, stime, starttime, vsize, rss.
fn parse_stat(stat: &str, ticks: f64, page: f64, boot: Option<f64>) -> ProcessStats {
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    // Field 3 (state) is the first after the name; field n is at index n - 3.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let num = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    let cpu = num(14).zip(num(15)).map(|(u, s)| (u + s) / ticks);
    ProcessStats {
        cpu_seconds: cpu,
        start_time: num(22).zip(boot).map(|(start, boot)| boot + start / ticks),
        virtual_bytes: num(23),
        resident_bytes: num(24).map(|pages| pages * page),
        ..ProcessStats::default()
    }
}

/// The soft "Max open files" limit from `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files").split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_spaces() {
        let stat = "42 (kube proxy) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 8192000 300 18446744073709551615";
        let p = parse_stat(stat, 100.0, 4096.0, Some(1_700_000_000.0));
        assert_eq!(p.cpu_seconds, Some(3.0));
        assert_eq!(p.start_time, Some(1_700_000_010.0));
        assert_eq!(p.virtual_bytes, Some(8_192_000.0));
        assert_eq!(p.resident_bytes, Some(300.0 * 4096.0));
    }

    #[test]
    fn limits_and_boot_time() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1048576              1048576              files\n";
        assert_eq!(max_open_files(limits), Some(1_048_576.0));
        assert_eq!(boot_time("cpu 1 2 3\nbtime 1700000000\n"), Some(1_700_000_000.0));
    }

    #[test]
    fn this_process_reads() {
        let p = read_process_stats();
        assert!(p.resident_bytes.is_some_and(|b| b > 0.0), "{p:?}");
        assert!(p.open_fds.is_some_and(|n| n >= 1.0), "{p:?}");
    }
}
