//! Upstream's conntrack settings at start (`pkg/proxy/conntrack/sysctls.go`,
//! called from `platformSetup`): which sysctls are written, with what, and
//! in what order ([`plan`], pure), then written ([`set_sysctls`]); the first
//! one that cannot be read or written stops the daemon, as upstream's
//! "could not set conntrack parameters from kube-proxy configuration".
//!
//! - `nf_conntrack_max`: maxPerCore × CPUs (the node's online CPUs), capped
//!   at [`MAX_CAP`], or `min` when that is larger than the uncapped product;
//!   nothing when maxPerCore is 0 or unset. Written only when the current
//!   value is lower (or unreadable): a larger value an administrator set
//!   stays.
//! - the module's `hashsize`: raised to max / 4 when it is smaller (whether or
//!   not `nf_conntrack_max` was written); it must be readable then.
//! - the TCP established and close-wait timeouts when set and non-zero,
//!   `nf_conntrack_tcp_be_liberal=1` with `tcpBeLiberal`, the UDP timeouts
//!   when non-zero: each written only when it differs.

use std::path::Path;

use crate::config::KubeProxyConntrackConfiguration;
use crate::kernel::sysctl::{self, PROC_SYS};
use crate::kernel::KernelError;

/// The most `nf_conntrack_max` is scaled to (upstream's `maxLimit`).
pub const MAX_CAP: i64 = 1_048_576;

/// Where the conntrack module's parameters are.
pub const MODULE_PARAMETERS: &str = "/sys/module/nf_conntrack/parameters";

/// The node's online CPUs, as listed there (upstream counts them, not the
/// CPUs this process may run on: the table is the node's).
const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// One conntrack setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    Max,
    Hashsize,
    TcpEstablishedTimeout,
    TcpCloseWaitTimeout,
    TcpBeLiberal,
    UdpTimeout,
    UdpStreamTimeout,
}

impl Knob {
    /// The directory its file is in, and the file's path there.
    pub fn file(self) -> (&'static str, &'static str) {
        let sysctl = |name| (PROC_SYS, name);
        match self {
            Knob::Max => sysctl("net/netfilter/nf_conntrack_max"),
            Knob::Hashsize => (MODULE_PARAMETERS, "hashsize"),
            Knob::TcpEstablishedTimeout => sysctl("net/netfilter/nf_conntrack_tcp_timeout_established"),
            Knob::TcpCloseWaitTimeout => sysctl("net/netfilter/nf_conntrack_tcp_timeout_close_wait"),
            Knob::TcpBeLiberal => sysctl("net/netfilter/nf_conntrack_tcp_be_liberal"),
            Knob::UdpTimeout => sysctl("net/netfilter/nf_conntrack_udp_timeout"),
            Knob::UdpStreamTimeout => sysctl("net/netfilter/nf_conntrack_udp_timeout_stream"),
        }
    }
}

/// A setting to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write {
    pub knob: Knob,
    pub value: i64,
}

/// `nf_conntrack_max` as upstream's `getConntrackMax` computes it; 0 leaves
/// the table size alone. The cap applies to the scaled value before `min`
/// is considered, as upstream's.
pub fn conntrack_max(ct: &KubeProxyConntrackConfiguration, cpus: i64) -> i64 {
    let per_core = i64::from(ct.max_per_core.unwrap_or(0));
    if per_core <= 0 {
        return 0;
    }
    let floor = i64::from(ct.min.unwrap_or(0));
    let scaled = per_core.saturating_mul(cpus);
    if scaled > MAX_CAP {
        tracing::debug!(scaled, limit = MAX_CAP, "capping the scaled conntrack-max-per-core");
        MAX_CAP
    } else if scaled > floor {
        scaled
    } else {
        floor
    }
}

/// What to write, in upstream's order, given `ct`, the node's CPU count and
/// what the node holds now: `nf_conntrack_max` (`None`: unreadable) and the
/// module's hashsize, read only when a table size is configured (its read
/// error is then the result).
pub fn plan<E>(
    ct: &KubeProxyConntrackConfiguration,
    cpus: i64,
    current_max: Option<i64>,
    current_hashsize: impl FnOnce() -> Result<i64, E>,
) -> Result<Vec<Write>, E> {
    let mut out = Vec::new();
    let max = conntrack_max(ct, cpus);
    if max > 0 {
        if current_max.is_none_or(|now| now < max) {
            out.push(Write { knob: Knob::Max, value: max });
        }
        if current_hashsize()? < max / 4 {
            out.push(Write { knob: Knob::Hashsize, value: max / 4 });
        }
    }
    let secs = |d: std::time::Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let timeout = |d: Option<&crate::config::GoDuration>| d.map(|d| secs(d.get())).filter(|s| *s > 0);
    let mut push = |knob, value: Option<i64>| out.extend(value.map(|value| Write { knob, value }));
    push(Knob::TcpEstablishedTimeout, timeout(ct.tcp_established_timeout.as_ref()));
    push(Knob::TcpCloseWaitTimeout, timeout(ct.tcp_close_wait_timeout.as_ref()));
    push(Knob::TcpBeLiberal, ct.tcp_be_liberal.then_some(1));
    push(Knob::UdpTimeout, timeout(Some(&ct.udp_timeout)));
    push(Knob::UdpStreamTimeout, timeout(Some(&ct.udp_stream_timeout)));
    Ok(out)
}

/// The conntrack settings could not be applied (upstream's fatal error).
#[derive(Debug, thiserror::Error)]
#[error("could not set conntrack parameters from kube-proxy configuration: {0}")]
pub struct ConntrackSetupError(#[source] pub KernelError);

/// Reads what [`plan`] needs, then writes its settings in order; the first
/// failure stops.
pub fn set_sysctls(ct: &KubeProxyConntrackConfiguration) -> Result<(), ConntrackSetupError> {
    let read = |knob: Knob| {
        let (root, path) = knob.file();
        sysctl::read_sysctl_at(Path::new(root), path)
    };
    let cpus = node_cpus();
    let writes = plan(ct, cpus, read(Knob::Max).ok(), || read(Knob::Hashsize)).map_err(ConntrackSetupError)?;
    for w in writes {
        let (root, path) = w.knob.file();
        if w.knob == Knob::Max {
            tracing::info!(nf_conntrack_max = w.value, cpus, "setting nf_conntrack_max");
        }
        sysctl::ensure_sysctl_at(Path::new(root), path, w.value).map_err(ConntrackSetupError)?;
    }
    Ok(())
}

/// The node's online CPUs ([`ONLINE_CPUS`]), else the CPUs this process
/// may use.
fn node_cpus() -> i64 {
    let online = std::fs::read_to_string(ONLINE_CPUS).ok().and_then(|list| count_cpu_list(&list));
    let n = online.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// How many CPUs a kernel CPU list (`0-3,8,10-11`) names; `None` if it is
/// not one or names none.
pub fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.trim().split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi) = (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?);
        n += hi.checked_sub(lo)? + 1;
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GoDuration;
    use std::time::Duration;

    fn ct(max_per_core: Option<i32>, min: Option<i32>) -> KubeProxyConntrackConfiguration {
        KubeProxyConntrackConfiguration { max_per_core, min, ..KubeProxyConntrackConfiguration::default() }
    }

    fn secs(s: u64) -> GoDuration {
        GoDuration(Duration::from_secs(s))
    }

    /// Upstream's `TestGetConntrackMax` and `TestGetConntrackMax_Capped`.
    #[test]
    fn the_table_size_scales_per_core_with_a_floor_and_a_cap() {
        let cases = [
            (None, None, 8, 0),
            (Some(67890), Some(1), 8, 67890 * 8),
            (Some(67890), Some(1), 16, MAX_CAP),
            (Some(1), Some(123456), 8, 123456),
            (Some(0), Some(123456), 8, 0),
            (Some(32768), Some(0), 512, MAX_CAP),
            // The cap is on the scaled value; a larger min still wins over a smaller product.
            (Some(32768), Some(2_000_000), 2, 2_000_000),
            (Some(1_000_000), Some(2_000_000), 4, MAX_CAP),
        ];
        for (per_core, min, cpus, want) in cases {
            assert_eq!(conntrack_max(&ct(per_core, min), cpus), want, "{per_core:?} {min:?} {cpus}");
        }
    }

    fn calls(c: &KubeProxyConntrackConfiguration, max: Option<i64>, hashsize: i64) -> Vec<String> {
        let writes = plan(c, 8, max, || Ok::<_, ()>(hashsize)).expect("plan");
        writes.iter().map(|w| format!("{:?}({})", w.knob, w.value)).collect()
    }

    /// Upstream's `TestSetupConntrack` table (a fake with 8 CPUs; a current
    /// `nf_conntrack_max` and hashsize of 0 stand for unset).
    #[test]
    fn writes_follow_upstreams_setup_table() {
        let twelve = ct(Some(12), None);
        let cases: Vec<(&str, KubeProxyConntrackConfiguration, i64, i64, Vec<&str>)> = vec![
            ("nothing when the config is empty", KubeProxyConntrackConfiguration::default(), 0, 0, vec![]),
            ("max and hashsize when unset", twelve.clone(), 0, 0, vec!["Max(96)", "Hashsize(24)"]),
            ("nothing when already right", twelve.clone(), 96, 24, vec![]),
            ("never lowered", twelve.clone(), 192, 48, vec![]),
            ("raised when too low", twelve.clone(), 48, 12, vec!["Max(96)", "Hashsize(24)"]),
            ("nothing with maxPerCore 0", ct(Some(0), None), 0, 0, vec![]),
            ("hashsize alone when max is right", twelve.clone(), 96, 0, vec!["Hashsize(24)"]),
            ("max alone when hashsize is right", twelve.clone(), 48, 24, vec!["Max(96)"]),
        ];
        for (name, c, max, hashsize, want) in cases {
            assert_eq!(calls(&c, Some(max), hashsize), want, "{name}");
        }
        assert_eq!(calls(&twelve, None, 24), ["Max(96)"], "an unreadable max is written");
    }

    #[test]
    fn timeouts_and_liberal_are_written_when_set_and_non_zero() {
        let with = |f: &dyn Fn(&mut KubeProxyConntrackConfiguration)| {
            let mut c = KubeProxyConntrackConfiguration::default();
            f(&mut c);
            calls(&c, Some(0), 0)
        };
        assert_eq!(with(&|c| c.tcp_established_timeout = Some(secs(5))), ["TcpEstablishedTimeout(5)"]);
        assert!(with(&|c| c.tcp_established_timeout = Some(secs(0))).is_empty());
        assert_eq!(with(&|c| c.tcp_close_wait_timeout = Some(secs(5))), ["TcpCloseWaitTimeout(5)"]);
        assert!(with(&|c| c.tcp_close_wait_timeout = Some(secs(0))).is_empty());
        assert_eq!(with(&|c| c.tcp_be_liberal = true), ["TcpBeLiberal(1)"]);
        assert_eq!(with(&|c| c.udp_timeout = secs(5)), ["UdpTimeout(5)"]);
        assert!(with(&|c| c.udp_timeout = secs(0)).is_empty());
        assert_eq!(with(&|c| c.udp_stream_timeout = secs(5)), ["UdpStreamTimeout(5)"]);
        // Sub-second parts are dropped, as upstream's integer division.
        assert_eq!(with(&|c| c.udp_timeout = GoDuration(Duration::from_millis(30_900))), ["UdpTimeout(30)"]);
    }

    #[test]
    fn upstreams_defaults_in_order() {
        let mut c = ct(Some(32768), Some(131072));
        c.tcp_established_timeout = Some(secs(86400));
        c.tcp_close_wait_timeout = Some(secs(3600));
        c.tcp_be_liberal = true;
        c.udp_timeout = secs(30);
        c.udp_stream_timeout = secs(120);
        let got = plan(&c, 2, Some(65536), || Ok::<_, ()>(16384)).unwrap();
        let knobs: Vec<(Knob, i64)> = got.iter().map(|w| (w.knob, w.value)).collect();
        assert_eq!(
            knobs,
            [
                (Knob::Max, 131072),
                (Knob::Hashsize, 32768),
                (Knob::TcpEstablishedTimeout, 86400),
                (Knob::TcpCloseWaitTimeout, 3600),
                (Knob::TcpBeLiberal, 1),
                (Knob::UdpTimeout, 30),
                (Knob::UdpStreamTimeout, 120),
            ]
        );
    }

    #[test]
    fn an_unreadable_hashsize_fails_only_when_a_table_size_is_configured() {
        assert_eq!(plan(&ct(Some(12), None), 8, Some(96), || Err::<i64, _>("no module")), Err("no module"));
        let c = KubeProxyConntrackConfiguration { tcp_be_liberal: true, ..ct(Some(0), None) };
        let read = || -> Result<i64, &str> { panic!("hashsize read without a table size") };
        assert_eq!(plan(&c, 8, None, read).unwrap(), [Write { knob: Knob::TcpBeLiberal, value: 1 }]);
    }

    #[test]
    fn counts_kernel_cpu_lists() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("a-b"), None);
    }
}
