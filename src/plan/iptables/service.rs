//! One service port's rules: the body of upstream's per-service loop in
//! syncProxyRules, and writeServiceToEndpointRules
//! (pkg/proxy/iptables/proxier.go). Rule text is upstream's, token for token.

use std::fmt::Write;

use super::context::{IptablesContext, NFACCT_LOCALHOST_NODEPORTS};
use super::names::{endpoint_chain, ServiceChains};
use super::{KUBE_EXTERNAL_SERVICES, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL, KUBE_SERVICES};
use crate::model::topology::categorize;
use crate::model::{Endpoint, ServicePort};
use crate::plan::local::{if_local, if_not_local};

/// One service port's rules, split the way upstream's line buffers are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortRules {
    /// Its lines in the filter chains rewritten every sync (KUBE-SERVICES,
    /// KUBE-EXTERNAL-SERVICES, KUBE-PROXY-FIREWALL, KUBE-NODEPORTS).
    pub filter: String,
    /// Its lines in the nat chains rewritten every sync (KUBE-SERVICES, KUBE-NODEPORTS).
    pub nat_top: String,
    /// Its own nat chains (SVC, SVL, EXT, FW, SEP), in upstream's declaration order.
    pub chains: Vec<String>,
    /// The rules of those chains (and the masquerade rule of the internal chain).
    pub chain_rules: String,
    /// A Local policy without a local endpoint: (internal, external), for
    /// `kubeproxy_sync_proxy_rules_no_local_endpoints_total`.
    pub no_local: (bool, bool),
}

/// REJECT or DROP, with its comment (upstream's *TrafficFilterTarget/Comment).
struct Filter {
    target: &'static str,
    comment: String,
}

/// Upstream's per-service decisions, computed once.
struct Plan<'a> {
    sp: &'a ServicePort,
    spn: String,
    proto: &'static str,
    chains: ServiceChains,
    cluster: Vec<&'a Endpoint>,
    local: Vec<&'a Endpoint>,
    reachable: Vec<&'a Endpoint>,
    has_endpoints: bool,
    internal_chain: &'a str,
    internal_filter: Option<Filter>,
    external_policy_chain: String,
    external_filter: Option<Filter>,
    uses_ext: bool,
    uses_fw: bool,
}

/// Endpoints in upstream's order: sorted by their `ip:port` string.
fn by_endpoint_string(mut eps: Vec<&Endpoint>) -> Vec<&Endpoint> {
    eps.sort_by_cached_key(|e| e.to_string());
    eps
}

fn plan<'a>(
    ctx: &IptablesContext,
    sp: &'a ServicePort,
    endpoints: &'a [Endpoint],
    chains: &'a ServiceChains,
) -> Plan<'a> {
    let cat = categorize(endpoints, sp, &ctx.node_name, &ctx.zone);
    let spn = sp.name.to_string();
    let has = cat.has_any;
    let has_internal = has && !(sp.internal_policy_local && cat.local.is_empty());
    let has_external = has && !(sp.external_policy_local && cat.local.is_empty());
    let (internal_filter, external_filter) = if !has {
        let f = || Some(Filter { target: "REJECT", comment: format!("\"{spn} has no endpoints\"") });
        (f(), f())
    } else {
        let f = |has_eps: bool| {
            (!has_eps).then(|| Filter { target: "DROP", comment: format!("\"{spn} has no local endpoints\"") })
        };
        (f(has_internal), f(has_external))
    };
    Plan {
        sp,
        proto: sp.protocol().lower(),
        internal_chain: if sp.internal_policy_local { &chains.svl } else { &chains.svc },
        external_policy_chain: if sp.external_policy_local { chains.svl.clone() } else { chains.svc.clone() },
        uses_ext: has && sp.externally_accessible(),
        uses_fw: has && !sp.load_balancer_vips.is_empty() && sp.restricts_sources(),
        cluster: by_endpoint_string(cat.cluster),
        local: by_endpoint_string(cat.local),
        reachable: by_endpoint_string(cat.all_reachable),
        has_endpoints: has,
        internal_filter,
        external_filter,
        chains: chains.clone(),
        spn,
    }
}

/// Renders one service port. `large` is upstream's largeClusterMode (more
/// than 1000 endpoints in all): endpoint comments are left out.
pub fn render_port(ctx: &IptablesContext, sp: &ServicePort, endpoints: &[Endpoint], large: bool) -> PortRules {
    let chains = ServiceChains::new(&sp.name);
    let p = plan(ctx, sp, endpoints, &chains);
    let mut out = PortRules {
        no_local: (p.has_endpoints && p.internal_filter.is_some(), p.has_endpoints && p.external_filter.is_some()),
        ..PortRules::default()
    };
    cluster_ip_rules(&p, &mut out);
    external_ip_rules(&p, &mut out);
    load_balancer_rules(&p, &mut out);
    node_port_rules(ctx, &p, &mut out);
    if sp.health_check_node_port != 0 {
        let _ = writeln!(
            out.filter,
            "-A {KUBE_NODEPORTS} -m comment --comment \"{} health check node port\" -m tcp -p tcp --dport {} -j ACCEPT",
            p.spn, sp.health_check_node_port
        );
    }
    internal_masquerade(ctx, &p, &mut out);
    external_chain(ctx, &p, &mut out);
    firewall_chain(ctx, &p, &mut out);
    if !p.cluster.is_empty() && sp.uses_cluster_endpoints() {
        out.chains.push(p.chains.svc.clone());
        service_to_endpoint_rules(&p, &p.chains.svc, &p.cluster, large, &mut out.chain_rules);
    }
    if !p.local.is_empty() && sp.uses_local_endpoints() {
        out.chains.push(p.chains.svl.clone());
        service_to_endpoint_rules(&p, &p.chains.svl, &p.local, large, &mut out.chain_rules);
    }
    for ep in &p.reachable {
        endpoint_chain_rules(&p, ep, large, &mut out);
    }
    out
}

/// `-m <p> -p <p> -d <ip> --dport <port>`.
fn dest(p: &Plan, ip: &dyn std::fmt::Display, port: u16) -> String {
    format!("-m {0} -p {0} -d {ip} --dport {port}", p.proto)
}

/// Section 6.1: the cluster IP, to the internal chain or REJECT/DROP.
fn cluster_ip_rules(p: &Plan, out: &mut PortRules) {
    let d = dest(p, &p.sp.cluster_ip, p.sp.port);
    match &p.internal_filter {
        None => {
            let _ = writeln!(
                out.nat_top,
                "-A {KUBE_SERVICES} -m comment --comment \"{} cluster IP\" {d} -j {}",
                p.spn, p.internal_chain
            );
        }
        Some(f) => {
            let _ = writeln!(out.filter, "-A {KUBE_SERVICES} -m comment --comment {} {d} -j {}", f.comment, f.target);
        }
    }
}

/// Section 6.2: externalIPs.
fn external_ip_rules(p: &Plan, out: &mut PortRules) {
    for ip in &p.sp.external_ips {
        let d = dest(p, ip, p.sp.port);
        if p.has_endpoints {
            let _ = writeln!(
                out.nat_top,
                "-A {KUBE_SERVICES} -m comment --comment \"{} external IP\" {d} -j {}",
                p.spn, p.chains.ext
            );
        }
        if let Some(f) = &p.external_filter {
            let _ = writeln!(
                out.filter,
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {} {d} -j {}",
                f.comment, f.target
            );
        }
    }
}

/// Section 6.3: load-balancer VIPs, through the FW chain when source ranges apply.
fn load_balancer_rules(p: &Plan, out: &mut PortRules) {
    let lb_target = if p.uses_fw { &p.chains.fw } else { &p.chains.ext };
    for ip in &p.sp.load_balancer_vips {
        let d = dest(p, ip, p.sp.port);
        if p.has_endpoints {
            let _ = writeln!(
                out.nat_top,
                "-A {KUBE_SERVICES} -m comment --comment \"{} loadbalancer IP\" {d} -j {lb_target}",
                p.spn
            );
        }
        if p.uses_fw {
            let _ = writeln!(
                out.filter,
                "-A {KUBE_PROXY_FIREWALL} -m comment --comment \"{} traffic not accepted by {}\" {d} -j DROP",
                p.spn, p.chains.fw
            );
        }
    }
    if let Some(f) = &p.external_filter {
        for ip in &p.sp.load_balancer_vips {
            let d = dest(p, ip, p.sp.port);
            let _ = writeln!(
                out.filter,
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {} {d} -j {}",
                f.comment, f.target
            );
        }
    }
}

/// Section 6.4: the NodePort (with the localhost rule when counted by nfacct).
fn node_port_rules(ctx: &IptablesContext, p: &Plan, out: &mut PortRules) {
    let np = p.sp.node_port;
    if np == 0 {
        return;
    }
    let proto = p.proto;
    if p.has_endpoints {
        if ctx.localhost_node_ports && ctx.nfacct_localhost_node_ports {
            let _ = writeln!(
                out.nat_top,
                "-A {KUBE_NODEPORTS} -m comment --comment {} -m {proto} -p {proto} -d 127.0.0.0/8 --dport {np} \
                 -m nfacct --nfacct-name {NFACCT_LOCALHOST_NODEPORTS} -j {}",
                p.spn, p.chains.ext
            );
        }
        let _ = writeln!(
            out.nat_top,
            "-A {KUBE_NODEPORTS} -m comment --comment {} -m {proto} -p {proto} --dport {np} -j {}",
            p.spn, p.chains.ext
        );
    }
    if let Some(f) = &p.external_filter {
        let _ = writeln!(
            out.filter,
            "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {} -m addrtype --dst-type LOCAL -m {proto} -p {proto} \
             --dport {np} -j {}",
            f.comment, f.target
        );
    }
}

/// Section 6.6.1: masquerade off-cluster traffic to the cluster IP.
fn internal_masquerade(ctx: &IptablesContext, p: &Plan, out: &mut PortRules) {
    if p.internal_filter.is_some() {
        return;
    }
    let head = format!(
        "-A {} -m comment --comment \"{} cluster IP\" {}",
        p.internal_chain,
        p.spn,
        dest(p, &p.sp.cluster_ip, p.sp.port)
    );
    if ctx.masquerade_all {
        let _ = writeln!(out.chain_rules, "{head} -j {KUBE_MARK_MASQ}");
    } else if let Some(not_local) = if_not_local(&ctx.local) {
        let _ = writeln!(out.chain_rules, "{head} {not_local} -j {KUBE_MARK_MASQ}");
    }
}

/// Section 6.6.2: the EXT chain (masquerade, or the Local-policy short circuits).
fn external_chain(ctx: &IptablesContext, p: &Plan, out: &mut PortRules) {
    if !p.uses_ext {
        return;
    }
    let (ext, spn, r) = (&p.chains.ext, &p.spn, &mut out.chain_rules);
    out.chains.push(ext.clone());
    if !p.sp.external_policy_local {
        let _ = writeln!(
            r,
            "-A {ext} -m comment --comment \"masquerade traffic for {spn} external destinations\" -j {KUBE_MARK_MASQ}"
        );
    } else {
        let svc = &p.chains.svc;
        if let Some(local) = if_local(&ctx.local) {
            let _ = writeln!(
                r,
                "-A {ext} -m comment --comment \"pod traffic for {spn} external destinations\" {local} -j {svc}"
            );
        }
        let _ = writeln!(
            r,
            "-A {ext} -m comment --comment \"masquerade LOCAL traffic for {spn} external destinations\" \
             -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}"
        );
        let _ = writeln!(
            r,
            "-A {ext} -m comment --comment \"route LOCAL traffic for {spn} external destinations\" \
             -m addrtype --src-type LOCAL -j {svc}"
        );
    }
    if p.external_filter.is_none() {
        let _ = writeln!(r, "-A {ext} -j {}", p.external_policy_chain);
    }
}

/// Section 6.6.3: the FW chain for loadBalancerSourceRanges.
fn firewall_chain(ctx: &IptablesContext, p: &Plan, out: &mut PortRules) {
    if !p.uses_fw {
        return;
    }
    let (fw, ext, spn) = (&p.chains.fw, &p.chains.ext, &p.spn);
    out.chains.push(fw.clone());
    let head = format!("-A {fw} -m comment --comment \"{spn} loadbalancer IP\"");
    let mut allow_from_node = false;
    for cidr in &p.sp.load_balancer_source_ranges {
        let _ = writeln!(out.chain_rules, "{head} -s {cidr} -j {ext}");
        allow_from_node |= ctx.node_ip.is_some_and(|ip| cidr.contains(&ip));
    }
    if allow_from_node {
        for ip in &p.sp.load_balancer_vips {
            let _ = writeln!(out.chain_rules, "{head} -s {ip} -j {ext}");
        }
    }
    let _ = writeln!(
        out.chain_rules,
        "-A {fw} -m comment --comment \"other traffic to {spn} will be dropped by {KUBE_PROXY_FIREWALL}\""
    );
}

/// Upstream's computeProbability: `%0.10f` of 1/n.
pub fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

/// Upstream's writeServiceToEndpointRules: affinity checks first, then one
/// rule per endpoint with probability 1/(n-i), the last one unconditional.
fn service_to_endpoint_rules(p: &Plan, chain: &str, eps: &[&Endpoint], large: bool, out: &mut String) {
    let comment = |ep: &Endpoint| {
        if large {
            String::new()
        } else {
            format!(" -m comment --comment \"{} -> {ep}\"", p.spn)
        }
    };
    if let Some(seconds) = p.sp.affinity_timeout {
        for ep in eps {
            let sep = endpoint_chain(&p.sp.name, ep);
            let _ = writeln!(
                out,
                "-A {chain}{} -m recent --name {sep} --rcheck --seconds {seconds} --reap -j {sep}",
                comment(ep)
            );
        }
    }
    let n = eps.len();
    for (i, ep) in eps.iter().enumerate() {
        let sep = endpoint_chain(&p.sp.name, ep);
        let stat = if i + 1 < n {
            format!(" -m statistic --mode random --probability {}", probability(n - i))
        } else {
            String::new()
        };
        let _ = writeln!(out, "-A {chain}{}{stat} -j {sep}", comment(ep));
    }
}

/// Section 6.6.6: one endpoint's chain: hairpin masquerade, then DNAT.
fn endpoint_chain_rules(p: &Plan, ep: &Endpoint, large: bool, out: &mut PortRules) {
    let sep = endpoint_chain(&p.sp.name, ep);
    let head = if large { format!("-A {sep}") } else { format!("-A {sep} -m comment --comment {}", p.spn) };
    let _ = writeln!(out.chain_rules, "{head} -s {} -j {KUBE_MARK_MASQ}", ep.ip);
    let recent = if p.sp.affinity_timeout.is_some() { format!(" -m recent --name {sep} --set") } else { String::new() };
    let _ = writeln!(out.chain_rules, "{head}{recent} -m {0} -p {0} -j DNAT --to-destination {ep}", p.proto);
    out.chains.push(sep);
}
