//! The soak's verdicts, pure: the `--dry-run --diff` summary says nothing
//! to add or remove, the daemon's RSS stayed flat, and every warning or
//! error in its log is one an injected fault explains.

use crate::bench::log_field;

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

/// A real server a `--dry-run --diff` preview removes at weight 0: its
/// virtual server as `ipvsadm` names one (`-t 10.96.0.5:80`) and its
/// address (`10.244.1.2:8080`, `[fd00::2]:8080`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainingDest {
    pub service: String,
    pub real: String,
}

/// The real servers a `--dry-run --diff` preview removes when that is all
/// it changes and each has weight 0: what graceful termination keeps while
/// they have connections (as upstream, a removed TCP real server keeps
/// weight 0 until its connections end, TIME_WAIT ones after two minutes;
/// the daemon then deletes it). A fresh plan lacks them, and they take no
/// new connections. They count as converged only while the kernel shows
/// them connections ([`real_server_connections`]). `None` when the
/// preview changes anything else.
pub fn draining_real_servers(preview: &str) -> Option<Vec<DrainingDest>> {
    let changed: Vec<&str> = preview.lines().filter(|l| l.starts_with('+') || l.starts_with('-')).collect();
    let draining = |l: &str| -> Option<DrainingDest> {
        // --a -t VIP:PORT -r RIP:PORT -m -w 0
        let words: Vec<&str> = l.strip_prefix("--a ")?.strip_suffix(" -w 0")?.split_whitespace().collect();
        match words.as_slice() {
            [flag, vs, "-r", real, ..] => {
                Some(DrainingDest { service: format!("{flag} {vs}"), real: real.to_string() })
            }
            _ => None,
        }
    };
    let dests: Option<Vec<DrainingDest>> = changed.iter().map(|l| draining(l)).collect();
    dests.filter(|d| !d.is_empty())
}

/// A real server's connections, active and inactive, in `ipvsadm -L -n`
/// output (`  -> 10.244.1.2:8080  Masq  0  1  2`); `None` when the listing
/// has no such real server.
pub fn real_server_connections(listing: &str, real: &str) -> Option<u64> {
    listing.lines().find_map(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        match words.as_slice() {
            ["->", addr, _forward, _weight, active, inactive, ..] if *addr == real => {
                Some(active.parse::<u64>().ok()? + inactive.parse::<u64>().ok()?)
            }
            _ => None,
        }
    })
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

/// The syncs a daemon log shows under way: each `sync started` line (the
/// coordinator's, at debug level) with no `sync finished` line of the same
/// family and generation after it, as `ip_family=… generation=…`, oldest
/// first.
pub fn syncs_in_progress(log: &str) -> Vec<String> {
    let key = |line: &str| -> Option<String> {
        Some(format!("ip_family={} generation={}", log_field(line, "ip_family")?, log_field(line, "generation")?))
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
    open
}

/// Whether `log` shows a syncPeriod sync (the one with the drift checks)
/// of `family` (`IPv4`, `IPv6`) both started and finished: the repair of
/// drift made before `log` begins (a daemon log's tail from the moment of
/// the drift) has been looked for.
pub fn periodic_sync_ran(log: &str, family: &str) -> bool {
    let family = format!("\"{family}\"");
    let mut started: Vec<&str> = Vec::new();
    for line in log.lines() {
        if log_field(line, "ip_family") != Some(family.as_str()) {
            continue;
        }
        let Some(generation) = log_field(line, "generation") else { continue };
        if line.contains(": sync started ") && log_field(line, "periodic") == Some("true") {
            started.push(generation);
        } else if line.contains(": sync finished ") && started.contains(&generation) {
            return true;
        }
    }
    false
}

/// The newest of [`syncs_in_progress`].
pub fn sync_in_progress(log: &str) -> Option<String> {
    syncs_in_progress(log).pop()
}

/// A sync a daemon log shows finished (the coordinator's `sync finished` line).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FinishedSync {
    pub full: bool,
    /// The syncPeriod's sync (with its drift checks).
    pub periodic: bool,
    pub ms: f64,
}

/// The syncs a daemon log shows finished, in log order.
pub fn finished_syncs(log: &str) -> Vec<FinishedSync> {
    log.lines()
        .filter(|l| l.contains(": sync finished "))
        .filter_map(|l| {
            Some(FinishedSync {
                full: log_field(l, "full")? == "true",
                periodic: log_field(l, "periodic")? == "true",
                ms: log_field(l, "ms")?.parse().ok()?,
            })
        })
        .collect()
}

/// The phases a `--dry-run --diff --v=2` run logged (its `dry-run: …`
/// debug lines with `ms=`), each as its message and seconds, in order.
pub fn dry_run_phases(log: &str) -> Vec<(String, f64)> {
    log.lines()
        .filter_map(|l| {
            let message = l.split(" dry-run: ").nth(1)?.split(" ms=").next()?;
            let ms: f64 = log_field(l, "ms")?.parse().ok()?;
            Some((message.to_string(), ms / 1000.0))
        })
        .collect()
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
    fn a_periodic_sync_counts_once_it_started_and_finished_in_the_log() {
        let line = |what: &str, family: &str, generation: u32, periodic: bool| {
            format!(
                "2026-11-28T07:22:06.1Z DEBUG kube_proxy_rs::actors::coordinator: {what} ip_family=\"{family}\" \
                 generation={generation} full=false periodic={periodic} ports=0\n"
            )
        };
        let finished_before = line("sync finished", "IPv4", 7, true);
        let started = line("sync started", "IPv4", 8, true);
        let finished = line("sync finished", "IPv4", 8, true);
        assert!(!periodic_sync_ran(&finished_before, "IPv4"), "started before the log began");
        assert!(!periodic_sync_ran(&started, "IPv4"), "still under way");
        assert!(periodic_sync_ran(&format!("{started}{finished}"), "IPv4"));
        assert!(!periodic_sync_ran(&format!("{started}{finished}"), "IPv6"), "the other family's");
        let other = format!("{}{}", line("sync started", "IPv4", 9, false), line("sync finished", "IPv4", 9, false));
        assert!(!periodic_sync_ran(&other, "IPv4"), "not the syncPeriod's");
    }

    #[test]
    fn the_dry_runs_phases_are_read_from_its_debug_lines() {
        let log =
            "2026-11-28T07:22:06.1Z DEBUG kube_proxy_rs::dry_run: dry-run: listed the API server ms=12345 events=900\n\
                   2026-11-28T07:22:07.1Z  INFO kube_proxy_rs::x: something else ms=5\n\
                   2026-11-28T07:22:09.1Z DEBUG kube_proxy_rs::preview: dry-run: read IPVS ms=800 lines=3900\n";
        assert_eq!(
            dry_run_phases(log),
            [("listed the API server".to_string(), 12.345), ("read IPVS".to_string(), 0.8)]
        );
    }

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
    fn only_weight_0_real_servers_removed_is_draining() {
        let draining = "# ipvs\n--a -t 10.96.0.5:80 -r 10.244.1.2:8080 -m -w 0\n\
                        --a --sctp-service [fd00::6]:80 -r [fd00:244::3]:8080 -m -w 0\n# ipset\n\
                        # summary\nipvs: 0 to add, 2 to remove, 900 kept\nipset: 0 to add, 0 to remove, 5 kept\n";
        let dest = |service: &str, real: &str| DrainingDest { service: service.into(), real: real.into() };
        assert_eq!(
            draining_real_servers(draining),
            Some(vec![
                dest("-t 10.96.0.5:80", "10.244.1.2:8080"),
                dest("--sctp-service [fd00::6]:80", "[fd00:244::3]:8080")
            ])
        );
        let weighted = draining.replace("8080 -m -w 0\n--a", "8080 -m -w 1\n--a");
        assert_eq!(draining_real_servers(&weighted), None, "a real server with weight is not draining");
        let added = format!("{draining}+-a -t 10.96.0.5:80 -r 10.244.1.2:8080 -m -w 1\n");
        assert_eq!(draining_real_servers(&added), None, "a real server to add");
        assert_eq!(draining_real_servers("# ipset\n-add KUBE-CLUSTER-IP 10.96.0.1,tcp:80 -w 0\n"), None);
        let nothing = "# summary\nipvs: 0 to add, 0 to remove, 9 kept\n";
        assert_eq!(draining_real_servers(nothing), None, "nothing changed");
    }

    #[test]
    fn a_real_servers_connections_are_read_from_ipvsadm_list() {
        let listing = "IP Virtual Server version 1.2.1 (size=4096)\n\
                       Prot LocalAddress:Port Scheduler Flags\n\
                       \x20 -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n\
                       TCP  10.96.0.5:80 rr\n\
                       \x20 -> 10.244.1.2:8080              Masq    0      0          3\n\
                       \x20 -> 10.244.1.3:8080              Masq    1      2          1\n\
                       \x20 -> 10.244.1.4:8080              Masq    0      0          0\n\
                       TCP  [fd00::5]:80 rr\n\
                       \x20 -> [fd00:244::2]:8080           Masq    0      1          0\n";
        assert_eq!(real_server_connections(listing, "10.244.1.2:8080"), Some(3));
        assert_eq!(real_server_connections(listing, "10.244.1.3:8080"), Some(3));
        assert_eq!(real_server_connections(listing, "10.244.1.4:8080"), Some(0), "drained: the daemon deletes it");
        assert_eq!(real_server_connections(listing, "[fd00:244::2]:8080"), Some(1));
        assert_eq!(real_server_connections(listing, "10.244.1.9:8080"), None);
        assert_eq!(real_server_connections(listing, "RemoteAddress:Port"), None, "the header");
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
        let both = [started("IPv4", 7), started("IPv6", 8)].concat();
        let open = ["ip_family=\"IPv4\" generation=7", "ip_family=\"IPv6\" generation=8"];
        assert_eq!(syncs_in_progress(&both), open, "oldest first");
        assert_eq!(sync_in_progress(&both).as_deref(), Some(open[1]));
        let log = [log, finished("IPv6", 2)].concat();
        assert_eq!(sync_in_progress(&log), None);
        assert_eq!(sync_in_progress(""), None);
    }

    #[test]
    fn finished_syncs_are_read_with_their_kind_and_time() {
        let log = "T DEBUG c: sync started ip_family=\"IPv4\" generation=1 full=true\n\
                   T  INFO c: sync finished ip_family=\"IPv4\" generation=1 full=true periodic=false ms=812.5 ports=3\n\
                   T  INFO c: sync finished ip_family=\"IPv6\" generation=2 full=false periodic=true ms=4 ports=0\n\
                   T  INFO c: sync finished ip_family=\"IPv6\" generation=3 full=false periodic=false ms=x\n";
        let sync = |full, periodic, ms| FinishedSync { full, periodic, ms };
        assert_eq!(finished_syncs(log), vec![sync(true, false, 812.5), sync(false, true, 4.0)]);
        assert!(finished_syncs("").is_empty());
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
