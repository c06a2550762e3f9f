//! One service port's objects: the body of upstream's per-service loop in
//! the nftables proxier's syncProxyRules, and writeServiceToEndpointRules
//! (pkg/proxy/nftables/proxier.go). Rules are upstream's, printed token
//! for token.

use std::net::{IpAddr, SocketAddr};

use super::context::{if_local, if_not_local, NftablesContext};
use super::names::*;
use super::ruleset::{Chain, Objects, SetElement};
use crate::model::topology::categorize;
use crate::model::{Endpoint, ServicePort};
use crate::msgs::nftables::{
    AnonSet, ElemValue, Element, Expr, FibKey, Field, KeyPart, KeyType, ListSep, Rule, SetFlag, SetSpec, Verdict,
};
use crate::net::{IpFamily, Protocol};

/// Endpoints in upstream's order: sorted by their `ip:port` string.
fn by_endpoint_string(mut eps: Vec<&Endpoint>) -> Vec<&Endpoint> {
    eps.sort_by_cached_key(|e| e.to_string());
    eps
}

/// Upstream's per-service decisions, computed once (both rulesets use them).
pub(super) struct Plan<'a> {
    pub ctx: &'a NftablesContext,
    pub sp: &'a ServicePort,
    spn: String,
    pub proto: Protocol,
    family: IpFamily,
    chains: ServiceChains,
    pub cluster: Vec<&'a Endpoint>,
    pub local: Vec<&'a Endpoint>,
    reachable: Vec<&'a Endpoint>,
    pub has_endpoints: bool,
    pub has_internal: bool,
    has_external: bool,
    uses_external_chain: bool,
    pub uses_fw: bool,
    internal_chain: String,
    external_policy_chain: String,
    /// The no-endpoint maps' verdict: reject without endpoints, drop
    /// when a Local policy finds none on this node.
    no_endpoints: Verdict,
}

pub(super) fn plan<'a>(ctx: &'a NftablesContext, sp: &'a ServicePort, endpoints: &'a [Endpoint]) -> Plan<'a> {
    let cat = categorize(endpoints, sp, &ctx.node_name, &ctx.zone);
    let chains = ServiceChains::new(&sp.name);
    let has = cat.has_any;
    let has_internal = has && !(sp.internal_policy_local && cat.local.is_empty());
    let has_external = has && !(sp.external_policy_local && cat.local.is_empty());
    Plan {
        ctx,
        sp,
        spn: sp.name.to_string(),
        proto: sp.protocol(),
        family: ctx.family,
        internal_chain: if sp.internal_policy_local { chains.local.clone() } else { chains.cluster.clone() },
        external_policy_chain: if sp.external_policy_local { chains.local.clone() } else { chains.cluster.clone() },
        no_endpoints: if has { Verdict::Drop } else { Verdict::Goto(REJECT_CHAIN.into()) },
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
    elements(&p, true, &mut out.elements);
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
            out.sets.push(SetSpec {
                flags: vec![SetFlag::Dynamic, SetFlag::Timeout],
                timeout: Some(timeout),
                ..SetSpec::set(&affinity, vec![KeyType::addr(ctx.family)], None)
            });
        }
        out.chains.push(endpoint_chain(&p, ep, chain, &affinity));
    }
    out
}

fn element(set: &str, key: Vec<KeyPart>, value: Verdict, comment: Option<&str>) -> SetElement {
    SetElement {
        set: set.into(),
        element: Element { key, value: Some(ElemValue::Verdict(value)), comment: comment.map(str::to_string) },
    }
}

impl Plan<'_> {
    /// The dispatch key of `ip`: `ip . proto . port`.
    pub fn key(&self, ip: IpAddr) -> Vec<KeyPart> {
        vec![KeyPart::Addr(ip), KeyPart::Proto(self.proto), KeyPart::Port(self.sp.port)]
    }

    /// The NodePort's key: `proto . node port`.
    pub fn node_port_key(&self) -> Vec<KeyPart> {
        vec![KeyPart::Proto(self.proto), KeyPart::Port(self.sp.node_port)]
    }

    /// The externalIPs, then the LoadBalancer IPs.
    pub fn external_addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.sp.external_ips.iter().chain(&self.sp.load_balancer_vips).copied()
    }
}

/// The port's elements in cluster-ips and the no-endpoint and firewall maps,
/// and with `dispatch` (upstream's ruleset) in the dispatch maps
/// `service-ips` and `service-nodeports`.
pub(super) fn elements(p: &Plan, dispatch: bool, out: &mut Vec<SetElement>) {
    let sp = p.sp;
    let comment = Some(p.spn.as_str());
    let no_endpoints = || p.no_endpoints.clone();
    let cluster_ip = Element::key(vec![KeyPart::Addr(sp.cluster_ip)]);
    out.push(SetElement { set: CLUSTER_IPS.into(), element: cluster_ip });
    if !p.has_internal {
        out.push(element(NO_ENDPOINT_SERVICES, p.key(sp.cluster_ip), no_endpoints(), comment));
    } else if dispatch {
        out.push(element(SERVICE_IPS, p.key(sp.cluster_ip), Verdict::Goto(p.internal_chain.clone()), None));
    }
    let external = Verdict::Goto(p.chains.external.clone());
    let dispatched = |set: &str, key: Vec<KeyPart>| element(set, key, external.clone(), None);
    for ip in &sp.external_ips {
        if p.has_endpoints && dispatch {
            out.push(dispatched(SERVICE_IPS, p.key(*ip)));
        }
        if !p.has_external {
            out.push(element(NO_ENDPOINT_SERVICES, p.key(*ip), no_endpoints(), comment));
        }
    }
    for ip in &sp.load_balancer_vips {
        if p.has_endpoints && dispatch {
            out.push(dispatched(SERVICE_IPS, p.key(*ip)));
        }
        if p.uses_fw {
            out.push(element(FIREWALL_IPS, p.key(*ip), Verdict::Goto(p.chains.firewall.clone()), None));
        }
    }
    if !p.has_external {
        for ip in &sp.load_balancer_vips {
            out.push(element(NO_ENDPOINT_SERVICES, p.key(*ip), no_endpoints(), comment));
        }
    }
    if sp.node_port != 0 {
        if p.has_endpoints && dispatch {
            out.push(dispatched(SERVICE_NODEPORTS, p.node_port_key()));
        }
        if !p.has_external {
            out.push(element(NO_ENDPOINT_NODEPORTS, p.node_port_key(), no_endpoints(), comment));
        }
    }
}

fn jump(chain: &str) -> Expr {
    Expr::Verdict(Verdict::Jump(chain.to_string()))
}

fn goto(chain: &str) -> Expr {
    Expr::Verdict(Verdict::Goto(chain.to_string()))
}

fn addr_is(field: Field, ip: IpAddr) -> Expr {
    Expr::Cmp { field, neq: false, value: KeyPart::Addr(ip) }
}

/// Masquerade off-cluster traffic to the ClusterIP (the first rule of the
/// internal policy chain), when there are internal endpoints.
fn internal_masquerade(p: &Plan) -> Option<Rule> {
    if !p.has_internal {
        return None;
    }
    let head = addr_is(Field::Daddr(p.family), p.sp.cluster_ip);
    if p.ctx.masquerade_all {
        // Upstream's text before and (as far as its PR 131492 says: it
        // simplified the masqueradeAll=false rule only) after that change.
        Some(Rule::new(vec![head, Expr::ProtoDport { proto: p.proto, port: p.sp.port }, jump(MARK_MASQ)]))
    } else {
        if_not_local(p.family, &p.ctx.local).map(|m| Rule::new(vec![head, m, jump(MARK_MASQ)]))
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
            let seen = Expr::Lookup { key: vec![Field::Saddr(p.family)], set: affinity.clone() };
            rules.push(Rule::new(vec![seen, goto(chain)]));
        }
    }
    let arms = names.into_iter().map(|(chain, _)| Verdict::Goto(chain)).collect();
    rules.push(Rule::new(vec![Expr::NumgenVmap(arms)]));
    Chain::regular(name, rules)
}

/// The `external-…` chain: masquerade, or the Local-policy short circuits,
/// then the external policy chain when it has endpoints.
fn external_chain(p: &Plan) -> Chain {
    let mut rules = vec![];
    let cluster = &p.chains.cluster;
    if !p.sp.external_policy_local {
        rules.push(Rule::new(vec![jump(MARK_MASQ)]));
    } else {
        if let Some(local) = if_local(p.family, &p.ctx.local) {
            rules.push(Rule::commented(vec![local, goto(cluster)], "short-circuit pod traffic"));
        }
        let from_node = || Expr::FibLocal(FibKey::Saddr);
        rules.push(Rule::commented(vec![from_node(), jump(MARK_MASQ)], "masquerade local traffic"));
        rules.push(Rule::commented(vec![from_node(), goto(cluster)], "short-circuit local traffic"));
    }
    if p.has_external {
        rules.push(Rule::new(vec![goto(&p.external_policy_chain)]));
    }
    Chain::regular(p.chains.external.clone(), rules)
}

/// The `firewall-…` chain for loadBalancerSourceRanges; without a range
/// (fail closed, see `ServicePort::source_ranges_fail_closed`) it drops all.
pub(super) fn firewall_chain(p: &Plan) -> Chain {
    let ranges = &p.sp.load_balancer_source_ranges;
    let mut items: Vec<KeyPart> = ranges.iter().map(|c| KeyPart::Net(*c)).collect();
    let from_node = p.ctx.node_ip.is_some_and(|ip| ranges.iter().any(|c| c.contains(&ip)));
    if from_node {
        items.extend(p.sp.load_balancer_vips.iter().map(|ip| KeyPart::Addr(*ip)));
    }
    let mut exprs = Vec::with_capacity(2);
    if !items.is_empty() {
        let set = AnonSet { items, sep: ListSep::SpacedComma };
        exprs.push(Expr::InAnon { field: Field::Saddr(p.family), neq: true, set });
    }
    exprs.push(Expr::Verdict(Verdict::Drop));
    Chain::regular(p.chains.firewall.clone(), vec![Rule::new(exprs)])
}

/// An `endpoint-…` chain: hairpin masquerade, affinity update, DNAT.
fn endpoint_chain(p: &Plan, ep: &Endpoint, name: String, affinity: &str) -> Chain {
    let saddr = Field::Saddr(p.family);
    let mut rules = vec![Rule::new(vec![addr_is(saddr, ep.ip), jump(MARK_MASQ)])];
    if p.sp.affinity_timeout.is_some() {
        rules.push(Rule::new(vec![Expr::Update { set: affinity.to_string(), key: vec![saddr] }]));
    }
    let proto = Expr::Cmp { field: Field::L4proto, neq: false, value: KeyPart::Proto(p.proto) };
    rules.push(Rule::new(vec![proto, Expr::Dnat(SocketAddr::new(ep.ip, ep.port))]));
    Chain::regular(name, rules)
}
