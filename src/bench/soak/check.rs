//! The soak's verdicts, pure: the `--dry-run --diff` summary says nothing
//! to add or remove, the daemon's RSS stayed flat, and every warning or
//! error in its log is one an injected fault explains.

/// The summary lines of `--dry-run --diff` output that are not `0 to add,
/// 0 to remove`; `Err` if there is no summary at all.
pub fn diff_leftovers(preview: &str) -> Result<Vec<String>, String> {
    let summary = preview.split("# summary\n").nth(1).ok_or_else(|| format!("no summary in:\n{preview}"))?;
    let lines: Vec<&str> = summary.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return Err(format!("an empty summary in:\n{preview}"));
    }
    Ok(lines.into_iter().filter(|l| !l.contains(": 0 to add, 0 to remove,")).map(String::from).collect())
}

/// RSS samples (seconds since start, KiB) reduced to what "flat" means:
/// the median of the first quarter after `warmup` seconds and of the last
/// quarter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RssTrend {
    pub first_kib: u64,
    pub last_kib: u64,
    pub samples: usize,
}

impl RssTrend {
    /// `None` with fewer than 8 samples after the warm-up.
    pub fn of(samples: &[(f64, u64)], warmup: f64) -> Option<RssTrend> {
        let after: Vec<u64> = samples.iter().filter(|(t, _)| *t >= warmup).map(|(_, kib)| *kib).collect();
        if after.len() < 8 {
            return None;
        }
        let quarter = after.len() / 4;
        let median = |part: &[u64]| {
            let mut v = part.to_vec();
            v.sort_unstable();
            v[v.len() / 2]
        };
        Some(RssTrend {
            first_kib: median(&after[..quarter]),
            last_kib: median(&after[after.len() - quarter..]),
            samples: after.len(),
        })
    }

    /// The last quarter's median is within `margin` (a fraction, plus
    /// `slack_kib`) above the first's.
    pub fn is_flat(&self, margin: f64, slack_kib: u64) -> bool {
        (self.last_kib as f64) <= self.first_kib as f64 * (1.0 + margin) + slack_kib as f64
    }
}

/// A log line an injected fault (or the environment) explains: a line
/// matches when it contains every one of its parts (the tracing target and
/// message, and where one message has many causes, the cause's words).
pub type Explained<'a> = &'a [&'a str];

/// The `WARN` and `ERROR` lines of a daemon log (tracing's text format)
/// that no entry of `explained` matches.
pub fn unexplained_log_lines<'a>(log: &'a str, explained: &[Explained]) -> Vec<&'a str> {
    log.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .filter(|l| !explained.iter().any(|parts| parts.iter().all(|p| l.contains(p))))
        .collect()
}

/// The sync a daemon log shows under way: the last `sync started` line
/// (the coordinator's, at debug level) with no `sync finished` line of the
/// same family and generation after it; its `ip_family=… generation=…`.
pub fn sync_in_progress(log: &str) -> Option<String> {
    let key = |line: &str| -> Option<String> {
        let field = |name: &str| line.split(&format!(" {name}=")).nth(1)?.split(' ').next();
        Some(format!("ip_family={} generation={}", field("ip_family")?, field("generation")?))
    };
    let mut open: Vec<String> = Vec::new();
    for line in log.lines() {
        if line.contains(": sync started ") {
            open.extend(key(line));
        } else if line.contains(": sync finished ") {
            if let Some(k) = key(line) {
                open.retain(|o| *o != k);
            }
        }
    }
    open.pop()
}

/// The `q` quantile (0..=1) of a Prometheus histogram's cumulative
/// buckets (`le`, count), the bucket's upper bound (as upstream's
/// `histogram_quantile` without interpolation); `None` when empty.
pub fn histogram_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets.iter().find(|(_, count)| *count >= q * total).map(|(le, _)| *le)
}

/// The cumulative buckets of histogram `name` in `/metrics` text, summed
/// over its label sets (families), sorted by `le`.
pub fn histogram_buckets(metrics: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    let mut by_le: std::collections::BTreeMap<u64, (f64, f64)> = std::collections::BTreeMap::new();
    for line in metrics.lines().filter(|l| l.starts_with(&prefix)) {
        let le = line.split("le=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or_default();
        let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
        let count: f64 = line.rsplit(' ').next().and_then(|c| c.parse().ok()).unwrap_or(0.0);
        if le.is_nan() {
            continue;
        }
        let entry = by_le.entry(le.to_bits()).or_insert((le, 0.0));
        entry.1 += count;
    }
    let mut out: Vec<(f64, f64)> = by_le.into_values().collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_summary_has_no_leftovers_and_a_changed_one_names_them() {
        let clean =
            "# iptables\n+x\n# summary\nnat: 0 to add, 0 to remove, 10 kept\nfilter: 0 to add, 0 to remove, 3 kept\n";
        assert_eq!(diff_leftovers(clean), Ok(vec![]));
        let dirty = "# summary\nnat: 2 to add, 0 to remove, 10 kept\nfilter: 0 to add, 0 to remove, 3 kept\n";
        assert_eq!(diff_leftovers(dirty), Ok(vec!["nat: 2 to add, 0 to remove, 10 kept".to_string()]));
        assert!(diff_leftovers("nothing").is_err());
        assert!(diff_leftovers("# summary\n").is_err());
    }

    #[test]
    fn rss_is_flat_when_the_last_quarter_stays_near_the_first() {
        let flat: Vec<(f64, u64)> = (0..40).map(|i| (i as f64, 50_000 + (i % 3) * 100)).collect();
        let t = RssTrend::of(&flat, 5.0).unwrap();
        assert!(t.is_flat(0.1, 0), "{t:?}");
        let growing: Vec<(f64, u64)> = (0..40).map(|i| (i as f64, 50_000 + i * 1_000)).collect();
        let t = RssTrend::of(&growing, 5.0).unwrap();
        assert!(!t.is_flat(0.1, 0), "{t:?}");
        assert_eq!(RssTrend::of(&flat[..10], 5.0), None, "too few samples after the warm-up");
    }

    #[test]
    fn warnings_an_injected_fault_explains_are_left_out() {
        let log = "2026-01-01T00:00:00Z  INFO a: ok\n\
                   2026-01-01T00:00:00Z  WARN a: kernel op failed error=restore: Can't lock /run/xtables.lock\n\
                   2026-01-01T00:00:01Z  WARN a: kernel op failed error=restore: line 3 failed\n\
                   2026-01-01T00:00:01Z ERROR b: something else\n";
        assert_eq!(
            unexplained_log_lines(log, &[&["a: kernel op failed", "Can't lock"]]),
            vec![
                "2026-01-01T00:00:01Z  WARN a: kernel op failed error=restore: line 3 failed",
                "2026-01-01T00:00:01Z ERROR b: something else"
            ]
        );
    }

    #[test]
    fn a_sync_is_under_way_from_its_start_line_until_its_finish_line() {
        let started =
            |f: &str, g: u32| format!("T DEBUG c: sync started ip_family=\"{f}\" generation={g} full=false\n");
        let finished = |f: &str, g: u32| format!("T  INFO c: sync finished ip_family=\"{f}\" generation={g} ms=3\n");
        let log = [started("IPv4", 1), finished("IPv4", 1), started("IPv4", 2)].concat();
        assert_eq!(sync_in_progress(&log).as_deref(), Some("ip_family=\"IPv4\" generation=2"));
        let log = [log, started("IPv6", 2), finished("IPv4", 2)].concat();
        assert_eq!(sync_in_progress(&log).as_deref(), Some("ip_family=\"IPv6\" generation=2"), "per family");
        let log = [log, finished("IPv6", 2)].concat();
        assert_eq!(sync_in_progress(&log), None);
        assert_eq!(sync_in_progress(""), None);
    }

    #[test]
    fn histogram_quantiles_sum_families_and_take_the_bucket_bound() {
        let m = "x_bucket{le=\"0.1\",ip_family=\"IPv4\"} 5\nx_bucket{le=\"1.0\",ip_family=\"IPv4\"} 9\n\
                 x_bucket{le=\"+Inf\",ip_family=\"IPv4\"} 10\nx_bucket{le=\"0.1\",ip_family=\"IPv6\"} 5\n\
                 x_bucket{le=\"1.0\",ip_family=\"IPv6\"} 10\nx_bucket{le=\"+Inf\",ip_family=\"IPv6\"} 10\n";
        let b = histogram_buckets(m, "x");
        assert_eq!(b, vec![(0.1, 10.0), (1.0, 19.0), (f64::INFINITY, 20.0)]);
        assert_eq!(histogram_quantile(&b, 0.5), Some(0.1));
        assert_eq!(histogram_quantile(&b, 0.99), Some(f64::INFINITY));
        assert_eq!(histogram_quantile(&b, 0.9), Some(1.0));
        assert_eq!(histogram_quantile(&[], 0.5), None);
    }
}
