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
    let mut lines: Vec<String> = desired.ipvs.iter().map(|op| op.to_string()).collect();
    lines.sort();
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    out.push_str("# ipset\n");
    let mut sets: Vec<(String, IpvsSet)> = IpvsSet::ALL.iter().map(|s| (s.name(family), *s)).collect();
    sets.sort();
    for (name, set) in &sets {
        let _ = writeln!(out, "{}", set.spec(family).create_line());
        let mut adds: Vec<String> =
            desired.sets.get(set).into_iter().flatten().map(|e| format!("add {name} {e}")).collect();
        adds.sort();
        for a in adds {
            let _ = writeln!(out, "{a}");
        }
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
