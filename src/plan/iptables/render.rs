//! Assembles one iptables-restore input from per-service-port fragments, in
//! the order upstream's syncProxyRules fills its four line buffers
//! (filterChains, filterRules, natChains, natRules) and writes them: the
//! filter table, then nat; the per-service nat chains are declared in name
//! order (faster for the legacy tool, see `declared_chains`). We add a mangle section, and the canary chain in
//! every table, on full syncs only (upstream's iptables Monitor creates the
//! canary with separate commands; leaving it out of partial syncs keeps an
//! external flush visible until the next full sync).

use std::fmt::Write;

use super::context::{IptablesContext, NodePortDestinations, NFACCT_CT_STATE_INVALID};
use super::{
    CANARY, KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING,
    KUBE_PROXY_FIREWALL, KUBE_SERVICES,
};
use crate::net::IpFamily;

/// The filter chains rewritten on every sync, in upstream's order.
pub const FILTER_TOP: [&str; 5] =
    [KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL];
/// The nat chains rewritten on every sync, in upstream's order.
pub const NAT_TOP: [&str; 4] = [KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ];

/// One service port's part of a sync: its cached top-level lines, and its
/// own chains when they are rewritten this time.
pub struct Fragment<'a> {
    pub filter: &'a str,
    pub nat_top: &'a str,
    /// The chains it owns (declared when `own` is written).
    pub chains: &'a [String],
    /// `Some(rules)` when this port's chains are written; the rules are
    /// moved into the restore input as a part of their own.
    pub own: Option<String>,
}

/// The restore input being written: finished parts and the current one.
#[derive(Default)]
struct Parts {
    done: Vec<String>,
    buf: String,
}

impl Parts {
    /// Moves `text` (whole lines) in as a part of its own, after what is
    /// written so far.
    fn push_part(&mut self, text: String) {
        if !self.buf.is_empty() {
            self.done.push(std::mem::take(&mut self.buf));
        }
        self.done.push(text);
    }

    fn finish(mut self) -> Vec<String> {
        if !self.buf.is_empty() {
            self.done.push(self.buf);
        }
        self.done
    }
}

/// What a sync writes besides the services.
pub struct Frame<'a> {
    pub ctx: &'a IptablesContext,
    /// Full sync: canary chains and the mangle table too.
    pub full: bool,
    /// Stale per-service chains to flush and delete.
    pub stale: &'a [String],
}

/// `:<chain> - [0:0]` (upstream's MakeChainLine).
pub fn chain_line(out: &mut String, chain: &str) {
    let _ = writeln!(out, ":{chain} - [0:0]");
}

/// Bytes of the first part's fixed lines (the mangle table, the filter and
/// nat headers, KUBE-FIREWALL, KUBE-FORWARD, KUBE-POSTROUTING,
/// KUBE-MARK-MASQ), rounded up.
pub(super) const FIXED_LINES: usize = 2048;

/// Renders the restore input, in parts (see [`crate::msgs::RestoreInput`]).
/// `ports` come in emission order.
pub fn restore_input(frame: &Frame, ports: Vec<Fragment>) -> Vec<String> {
    let declared = declared_chains(frame, &ports);
    let mut out = Parts::default();
    // The first part (mangle, filter, nat's chain declarations) is allocated
    // once at its size: grown line by line it would reach up to twice that
    // (at 10,000 services ≈ 5 MB more, held while the restore runs).
    let filter: usize = ports.iter().map(|p| p.filter.len()).sum();
    out.buf.reserve(FIXED_LINES + filter + declared.iter().map(|c| declaration_len(c)).sum::<usize>());
    if frame.full {
        let _ = writeln!(out.buf, "*mangle\n:{CANARY} - [0:0]\nCOMMIT");
    }
    filter_table(&mut out.buf, frame, ports.iter());
    nat_table(&mut out, frame, ports, declared);
    out.finish()
}

/// The per-service nat chains a sync declares: those of the ports it
/// rewrites and the stale ones it deletes, in name order. Legacy
/// iptables-restore inserts each new chain into its sorted chain list, and
/// at 10,000 services took 14.9 s on upstream's (encounter) order against
/// 9.9 s on this one (the same input otherwise). The order has no meaning
/// to the kernel; the rules keep upstream's.
fn declared_chains<'a>(frame: &Frame<'a>, ports: &[Fragment<'a>]) -> Vec<&'a str> {
    let mut declared: Vec<&str> =
        ports.iter().filter(|p| p.own.is_some()).flat_map(|p| p.chains.iter().map(String::as_str)).collect();
    declared.extend(frame.stale.iter().map(String::as_str));
    declared.sort_unstable();
    declared
}

/// The length of [`chain_line`]'s line for `chain`.
fn declaration_len(chain: &str) -> usize {
    chain.len() + ": - [0:0]\n".len()
}

/// Upstream's localhost-NodePort guard (KUBE-FIREWALL; a copy of kubelet's rule).
fn localhost_guard(ctx: &IptablesContext) -> bool {
    ctx.family == IpFamily::V4 && ctx.localhost_node_ports
}

fn filter_table<'a, 'b: 'a>(out: &mut String, frame: &Frame, ports: impl Iterator<Item = &'a Fragment<'b>>) {
    let ctx = frame.ctx;
    out.push_str("*filter\n");
    for c in FILTER_TOP {
        chain_line(out, c);
    }
    if localhost_guard(ctx) {
        chain_line(out, KUBE_FIREWALL);
    }
    if frame.full {
        chain_line(out, CANARY);
    }
    if localhost_guard(ctx) {
        let _ = writeln!(
            out,
            "-A {KUBE_FIREWALL} -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 \
             ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
        );
    }
    for p in ports {
        out.push_str(p.filter);
    }
    if !ctx.conntrack_tcp_liberal {
        let nfacct = if ctx.nfacct_ct_state_invalid {
            format!(" -m nfacct --nfacct-name {NFACCT_CT_STATE_INVALID}")
        } else {
            String::new()
        };
        let _ = writeln!(out, "-A {KUBE_FORWARD} -m conntrack --ctstate INVALID{nfacct} -j DROP");
    }
    let m = &ctx.mark;
    let _ = writeln!(
        out,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {m}/{m} -j ACCEPT"
    );
    let _ = writeln!(
        out,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack \
         --ctstate RELATED,ESTABLISHED -j ACCEPT"
    );
    out.push_str("COMMIT\n");
}

fn nat_table(parts: &mut Parts, frame: &Frame, ports: Vec<Fragment>, declared: Vec<&str>) {
    let ctx = frame.ctx;
    let out = &mut parts.buf;
    out.push_str("*nat\n");
    for c in NAT_TOP {
        chain_line(out, c);
    }
    if frame.full {
        chain_line(out, CANARY);
    }
    for c in declared {
        chain_line(out, c);
    }
    let m = &ctx.mark;
    let _ = writeln!(out, "-A {KUBE_POSTROUTING} -m mark ! --mark {m}/{m} -j RETURN");
    let _ = writeln!(out, "-A {KUBE_POSTROUTING} -j MARK --xor-mark {m}");
    let random = if ctx.random_fully { " --random-fully" } else { "" };
    let _ = writeln!(
        out,
        "-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{random}"
    );
    let _ = writeln!(out, "-A {KUBE_MARK_MASQ} -j MARK --or-mark {m}");
    for p in ports {
        parts.buf.push_str(p.nat_top);
        if let Some(rules) = p.own {
            parts.push_part(rules);
        }
    }
    let out = &mut parts.buf;
    for c in frame.stale {
        let _ = writeln!(out, "-X {c}");
    }
    node_ports_tail(out, ctx);
    out.push_str("COMMIT\n");
}

/// Section 6.7: the last rules of nat KUBE-SERVICES, to KUBE-NODEPORTS.
fn node_ports_tail(out: &mut String, ctx: &IptablesContext) {
    let head = format!(
        "-A {KUBE_SERVICES} -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in \
         this chain\""
    );
    match &ctx.node_ports {
        NodePortDestinations::All => {
            let not_loopback = match ctx.family {
                IpFamily::V6 => " ! -d ::1/128",
                IpFamily::V4 if !ctx.localhost_node_ports => " ! -d 127.0.0.0/8",
                IpFamily::V4 => "",
            };
            let _ = writeln!(out, "{head} -m addrtype --dst-type LOCAL{not_loopback} -j {KUBE_NODEPORTS}");
        }
        NodePortDestinations::Ips(ips) => {
            for ip in ips {
                if ip.is_loopback() && (ctx.family == IpFamily::V6 || !ctx.localhost_node_ports) {
                    continue;
                }
                let _ = writeln!(out, "{head} -d {ip} -j {KUBE_NODEPORTS}");
            }
        }
    }
}
