//! `--dry-run` output: the state a full sync programs from an empty kernel,
//! in the syntax of the tools operators know (ipvsadm -S -n, ipset save,
//! iptables-restore). Every line of a section is sorted so outputs diff.

use std::fmt::Write;

use super::{IpvsDesired, IpvsSet};
use crate::msgs::link::DUMMY_LINK;
use crate::net::IpFamily;

/// Renders IPVS mode: `# ipvs`, `# ipset`, `# addresses kube-ipvs0`, `# iptables`.
pub fn ipvs_mode(desired: &IpvsDesired, family: IpFamily, iptables: &str) -> String {
    let mut out = String::new();
    out.push_str("# ipvs\n");
    for l in ipvs_lines(desired) {
        let _ = writeln!(out, "{l}");
    }
    out.push_str("# ipset\n");
    for l in ipset_lines(desired, family) {
        let _ = writeln!(out, "{l}");
    }
    let _ = writeln!(out, "# addresses {DUMMY_LINK}");
    let mut addrs: Vec<String> = desired.addresses.iter().map(|a| a.to_string()).collect();
    addrs.sort();
    for a in addrs {
        let _ = writeln!(out, "{a}");
    }
    out.push_str("# iptables\n");
    out.push_str(iptables);
    out
}

/// The virtual and real servers as `ipvsadm -S -n` lines, sorted: every
/// `-A` (service) sorts before every `-a` (destination), so `ipvsadm -R`
/// takes them in this order.
pub fn ipvs_lines(desired: &IpvsDesired) -> Vec<String> {
    let mut lines: Vec<String> = desired.ipvs.iter().map(|op| op.to_string()).collect();
    lines.sort();
    lines
}

/// Every set as `ipset save` lines (what `ipset restore` takes): sets by
/// name, each set's create line before its sorted members.
pub fn ipset_lines(desired: &IpvsDesired, family: IpFamily) -> Vec<String> {
    let mut sets: Vec<(String, IpvsSet)> = IpvsSet::ALL.iter().map(|s| (s.name(family), *s)).collect();
    sets.sort();
    let mut lines = Vec::new();
    for (name, set) in &sets {
        lines.push(set.spec(family).create_line());
        let mut adds: Vec<String> =
            desired.sets.get(set).into_iter().flatten().map(|e| format!("add {name} {e}")).collect();
        adds.sort();
        lines.extend(adds);
    }
    lines
}
