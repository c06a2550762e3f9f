//! One service port's objects: the body of upstream's per-service loop in
//! the nftables proxier's syncProxyRules, and writeServiceToEndpointRules
//! (pkg/proxy/nftables/proxier.go). Rule text is upstream's, token for token.

use super::context::{if_local, if_not_local, NftablesContext};
use super::names::*;
use super::ruleset::{addr_type, nft_family, Chain, Element, Objects, Rule, Set};
use crate::model::topology::categorize;
use crate::model::{Endpoint, ServicePort};

/// Endpoints in upstream's order: sorted by their `ip:port` string.
fn by_endpoint_string(mut eps: Vec<&Endpoint>) -> Vec<&Endpoint> {
    eps.sort_by_cached_key(|e| e.to_string());
    eps
}

/// Upstream's per-service decisions, computed once.
struct Plan<'a> {
    ctx: &'a NftablesContext,
    sp: &'a ServicePort,
    spn: String,
    proto: &'static str,
    ip: &'static str,
    chains: ServiceChains,
    cluster: Vec<&'a Endpoint>,
    local: Vec<&'a Endpoint>,
    reachable: Vec<&'a Endpoint>,
    has_endpoints: bool,
    has_internal: bool,
    has_external: bool,
    uses_external_chain: bool,
    uses_fw: bool,
    internal_chain: String,
    external_policy_chain: String,
    internal_verdict: String,
    external_verdict: String,
}

fn plan<'a>(ctx: &'a NftablesContext, sp: &'a ServicePort, endpoints: &'a [Endpoint]) -> Plan<'a> {
    let cat = categorize(endpoints, sp, &ctx.node_name, &ctx.zone);
    let chains = ServiceChains::new(&sp.name);
    let has = cat.has_any;
    let has_internal = has && !(sp.internal_policy_local && cat.local.is_empty());
    let has_external = has && !(sp.external_policy_local && cat.local.is_empty());
    let reject = format!("goto {REJECT_CHAIN}");
    let verdict = |has_eps: bool| {
        if !has {
            reject.clone()
        } else if has_eps {
            String::new()
        } else {
            "drop".into()
        }
    };
    Plan {
        ctx,
        sp,
        spn: sp.name.to_string(),
        proto: sp.protocol().lower(),
        ip: nft_family(ctx.family),
        internal_chain: if sp.internal_policy_local { chains.local.clone() } else { chains.cluster.clone() },
        external_policy_chain: if sp.external_policy_local { chains.local.clone() } else { chains.cluster.clone() },
        internal_verdict: verdict(has_internal),
        external_verdict: verdict(has_external),
        cluster: by_endpoint_string(cat.cluster),
        local: by_endpoint_string(cat.local),
        reachable: by_endpoint_string(cat.all_reachable),
        has_endpoints: has,
        has_internal,
        has_external,
        uses_external_chain: has && sp.externally_accessible(),
        uses_fw: !sp.load_balancer_vips.is_empty() && sp.restricts_sources(),
        chains,
    }
}

/// Whether a service port with a Local policy lacks local endpoints:
/// (internal, external), for `kubeproxy_sync_proxy_rules_no_local_endpoints_total`.
pub fn no_local_endpoints(ctx: &NftablesContext, sp: &ServicePort, endpoints: &[Endpoint]) -> (bool, bool) {
    let p = plan(ctx, sp, endpoints);
    (p.has_endpoints && !p.has_internal, p.has_endpoints && !p.has_external)
}

/// Renders one service port's chains, affinity sets and map elements.
pub fn render_port(ctx: &NftablesContext, sp: &ServicePort, endpoints: &[Endpoint]) -> Objects {
    let p = plan(ctx, sp, endpoints);
    let mut out = Objects::default();
    elements(&p, &mut out.elements);
    if p.uses_fw {
        out.chains.push(firewall_chain(&p));
    }
    if !p.cluster.is_empty() && sp.uses_cluster_endpoints() {
        out.chains.push(policy_chain(&p, &p.chains.cluster, &p.cluster));
    }
    if !p.local.is_empty() && sp.uses_local_endpoints() {
        out.chains.push(policy_chain(&p, &p.chains.local, &p.local));
    }
    if p.uses_external_chain {
        out.chains.push(external_chain(&p));
    }
    for ep in &p.reachable {
        let (chain, affinity) = endpoint_names(&sp.name, ep);
        if let Some(timeout) = sp.affinity_timeout {
            out.sets.push(Set {
                name: affinity.clone(),
                map: false,
                key_type: addr_type(ctx.family).into(),
                flags: vec!["dynamic", "timeout"],
                timeout: Some(timeout),
                comment: None,
            });
        }
        out.chains.push(endpoint_chain(&p, ep, chain, &affinity));
    }
    out
}

fn element(set: &str, key: Vec<String>, value: String, comment: Option<&str>) -> Element {
    Element { set: set.into(), key, value: vec![value], comment: comment.map(str::to_string) }
}

/// The port's elements in cluster-ips and the dispatch, no-endpoint and firewall maps.
fn elements(p: &Plan, out: &mut Vec<Element>) {
    let sp = p.sp;
    let key = |ip: &dyn ToString| vec![ip.to_string(), p.proto.to_string(), sp.port.to_string()];
    let comment = Some(p.spn.as_str());
    out.push(Element { set: CLUSTER_IPS.into(), key: vec![sp.cluster_ip.to_string()], value: vec![], comment: None });
    if p.has_internal {
        out.push(element(SERVICE_IPS, key(&sp.cluster_ip), format!("goto {}", p.internal_chain), None));
    } else {
        out.push(element(NO_ENDPOINT_SERVICES, key(&sp.cluster_ip), p.internal_verdict.clone(), comment));
    }
    let external = format!("goto {}", p.chains.external);
    for ip in &sp.external_ips {
        if p.has_endpoints {
            out.push(element(SERVICE_IPS, key(ip), external.clone(), None));
        }
        if !p.has_external {
            out.push(element(NO_ENDPOINT_SERVICES, key(ip), p.external_verdict.clone(), comment));
        }
    }
    for ip in &sp.load_balancer_vips {
        if p.has_endpoints {
            out.push(element(SERVICE_IPS, key(ip), external.clone(), None));
        }
        if p.uses_fw {
            out.push(element(FIREWALL_IPS, key(ip), format!("goto {}", p.chains.firewall), None));
        }
    }
    if !p.has_external {
        for ip in &sp.load_balancer_vips {
            out.push(element(NO_ENDPOINT_SERVICES, key(ip), p.external_verdict.clone(), comment));
        }
    }
    if sp.node_port != 0 {
        let np = vec![p.proto.to_string(), sp.node_port.to_string()];
        if p.has_endpoints {
            out.push(element(SERVICE_NODEPORTS, np.clone(), external, None));
        }
        if !p.has_external {
            out.push(element(NO_ENDPOINT_NODEPORTS, np, p.external_verdict.clone(), comment));
        }
    }
}

/// Masquerade off-cluster traffic to the ClusterIP (the first rule of the
/// internal policy chain), when there are internal endpoints.
fn internal_masquerade(p: &Plan) -> Option<Rule> {
    if !p.has_internal {
        return None;
    }
    let head = format!("{} daddr {}", p.ip, p.sp.cluster_ip);
    if p.ctx.masquerade_all {
        // Upstream's text before and (as far as its PR 131492 says: it
        // simplified the masqueradeAll=false rule only) after that change.
        Some(Rule::new(format!("{head} {} dport {} jump {MARK_MASQ}", p.proto, p.sp.port)))
    } else {
        if_not_local(p.ctx.family, &p.ctx.local).map(|m| Rule::new(format!("{head} {m} jump {MARK_MASQ}")))
    }
}

/// A policy chain (`service-…` or `local-…`): masquerading when it is the
/// internal chain, affinity lookups, then `numgen random mod N vmap`.
fn policy_chain(p: &Plan, name: &str, eps: &[&Endpoint]) -> Chain {
    let mut rules: Vec<Rule> = Vec::with_capacity(eps.len() + 2);
    if name == p.internal_chain {
        rules.extend(internal_masquerade(p));
    }
    let names: Vec<(String, String)> = eps.iter().map(|ep| endpoint_names(&p.sp.name, ep)).collect();
    if p.sp.affinity_timeout.is_some() {
        for (chain, affinity) in &names {
            rules.push(Rule::new(format!("{} saddr @{affinity} goto {chain}", p.ip)));
        }
    }
    let arms: Vec<String> = names.iter().enumerate().map(|(i, (chain, _))| format!("{i} : goto {chain}")).collect();
    rules.push(Rule::new(format!("numgen random mod {} vmap {{ {} }}", eps.len(), arms.join(" , "))));
    Chain::regular(name, rules)
}

/// The `external-…` chain: masquerade, or the Local-policy short circuits,
/// then the external policy chain when it has endpoints.
fn external_chain(p: &Plan) -> Chain {
    let mut rules = vec![];
    let cluster = &p.chains.cluster;
    if !p.sp.external_policy_local {
        rules.push(Rule::new(format!("jump {MARK_MASQ}")));
    } else {
        if let Some(local) = if_local(p.ctx.family, &p.ctx.local) {
            rules.push(Rule::commented(format!("{local} goto {cluster}"), "short-circuit pod traffic"));
        }
        rules.push(Rule::commented(format!("fib saddr type local jump {MARK_MASQ}"), "masquerade local traffic"));
        rules.push(Rule::commented(format!("fib saddr type local goto {cluster}"), "short-circuit local traffic"));
    }
    if p.has_external {
        rules.push(Rule::new(format!("goto {}", p.external_policy_chain)));
    }
    Chain::regular(p.chains.external.clone(), rules)
}

/// The `firewall-…` chain for loadBalancerSourceRanges; without a range
/// (fail closed, see `ServicePort::source_ranges_fail_closed`) it drops all.
fn firewall_chain(p: &Plan) -> Chain {
    let mut sources: Vec<String> = p.sp.load_balancer_source_ranges.iter().map(|c| c.to_string()).collect();
    let from_node = p.ctx.node_ip.is_some_and(|ip| p.sp.load_balancer_source_ranges.iter().any(|c| c.contains(&ip)));
    if from_node {
        sources.extend(p.sp.load_balancer_vips.iter().map(|ip| ip.to_string()));
    }
    let rule = if sources.is_empty() {
        "drop".to_string()
    } else {
        format!("{} saddr != {{ {} }} drop", p.ip, sources.join(" , "))
    };
    Chain::regular(p.chains.firewall.clone(), vec![Rule::new(rule)])
}

/// An `endpoint-…` chain: hairpin masquerade, affinity update, DNAT.
fn endpoint_chain(p: &Plan, ep: &Endpoint, name: String, affinity: &str) -> Chain {
    let mut rules = vec![Rule::new(format!("{} saddr {} jump {MARK_MASQ}", p.ip, ep.ip))];
    if p.sp.affinity_timeout.is_some() {
        rules.push(Rule::new(format!("update @{affinity} {{ {} saddr }}", p.ip)));
    }
    rules.push(Rule::new(format!("meta l4proto {} dnat to {ep}", p.proto)));
    Chain::regular(name, rules)
}
