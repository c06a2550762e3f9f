//! The top-level objects every sync of upstream's nftables proxier sets up
//! (setupNFTables): base chains with their hooks and priorities, the jumps
//! into our regular chains, masquerading, the no-endpoint, firewall and
//! ClusterIP checks, the dispatch maps, and the `nodeport-ips` set.

use super::context::{NftRuleset, NftablesContext, NodePorts};
use super::maps;
use super::names::*;
use super::ruleset::{Chain, Objects, SetElement};
use crate::msgs::nftables::{
    AnonSet, BaseChain, ChainHook, ChainType, CtState, Element, Expr, FibKey, Field, KeyPart, KeyType, ListSep, MarkOp,
    Rule, SetSpec, Verdict,
};
use crate::net::IpFamily;

/// dstnat, as knftables numbers it.
const DSTNAT: i32 = -100;
/// srcnat.
const SRCNAT: i32 = 100;
/// filter.
const FILTER: i32 = 0;

/// Upstream's nftablesBaseChains: (name, type, hook, priority).
pub const BASE_CHAINS: [(&str, ChainType, ChainHook, i32); 8] = [
    (FILTER_PREROUTING_PRE_DNAT, ChainType::Filter, ChainHook::Prerouting, DSTNAT - 10),
    (FILTER_OUTPUT_PRE_DNAT, ChainType::Filter, ChainHook::Output, DSTNAT - 10),
    (FILTER_INPUT, ChainType::Filter, ChainHook::Input, FILTER),
    (FILTER_FORWARD, ChainType::Filter, ChainHook::Forward, FILTER),
    (FILTER_OUTPUT, ChainType::Filter, ChainHook::Output, FILTER),
    (NAT_PREROUTING, ChainType::Nat, ChainHook::Prerouting, DSTNAT),
    (NAT_OUTPUT, ChainType::Nat, ChainHook::Output, DSTNAT),
    (NAT_POSTROUTING, ChainType::Nat, ChainHook::Postrouting, SRCNAT),
];

/// Upstream's nftablesJumpChains: (to, from, only new connections), in rule order.
const JUMPS: [(&str, &str, bool); 11] = [
    (NODEPORT_ENDPOINTS_CHECK, FILTER_INPUT, true),
    (SERVICE_ENDPOINTS_CHECK, FILTER_INPUT, true),
    (SERVICE_ENDPOINTS_CHECK, FILTER_FORWARD, true),
    (SERVICE_ENDPOINTS_CHECK, FILTER_OUTPUT, true),
    (FIREWALL_CHECK, FILTER_PREROUTING_PRE_DNAT, true),
    (FIREWALL_CHECK, FILTER_OUTPUT_PRE_DNAT, true),
    (SERVICES, NAT_OUTPUT, false),
    (SERVICES, NAT_PREROUTING, false),
    (MASQUERADING, NAT_POSTROUTING, false),
    (CLUSTER_IPS_CHECK, FILTER_FORWARD, true),
    (CLUSTER_IPS_CHECK, FILTER_OUTPUT, true),
];

/// Matching no destination but loopback (`ip daddr != 127.0.0.0/8`, `ip6 daddr != ::1`).
fn no_localhost(family: IpFamily) -> Expr {
    let value = match family {
        IpFamily::V4 => KeyPart::Net(ipnet::Ipv4Net::new_assert(std::net::Ipv4Addr::new(127, 0, 0, 0), 8).into()),
        IpFamily::V6 => KeyPart::Addr(std::net::Ipv6Addr::LOCALHOST.into()),
    };
    Expr::Cmp { field: Field::Daddr(family), neq: true, value }
}

/// The fields the dispatch maps are keyed by: `ip daddr . meta l4proto . th dport`.
pub fn dispatch_key(family: IpFamily) -> Vec<Field> {
    vec![Field::Daddr(family), Field::L4proto, Field::Dport]
}

/// `meta l4proto . th dport`.
fn port_key() -> Vec<Field> {
    vec![Field::L4proto, Field::Dport]
}

fn vmap(key: Vec<Field>, map: &str) -> Expr {
    Expr::Vmap { key, map: map.to_string() }
}

/// `nodeport-ips`: the addresses that accept NodePorts.
pub fn nodeport_ips_set(family: IpFamily) -> SetSpec {
    SetSpec::set(NODEPORT_IPS, vec![KeyType::addr(family)], Some("IPs that accept NodePort traffic"))
}

/// The top-level objects for `ctx`.
pub fn top_level(ctx: &NftablesContext) -> Objects {
    let (sets, elements) = containers(ctx);
    Objects { chains: chains(ctx), sets, elements, ..Objects::default() }
}

/// The base chains and the top-level regular chains, with their rules.
fn chains(ctx: &NftablesContext) -> Vec<Chain> {
    let family = ctx.family;
    let daddr = Field::Daddr(family);
    let mut chains: Vec<Chain> = BASE_CHAINS
        .iter()
        .map(|(name, kind, hook, priority)| Chain {
            name: name.to_string(),
            base: Some(BaseChain { kind: *kind, hook: *hook, priority: *priority }),
            comment: None,
            rules: vec![],
        })
        .collect();
    let mut regular = |name: &str, rules: Vec<Rule>| chains.push(Chain::regular(name, rules));
    let mut cluster_ips_check = vec![Rule::commented(
        vec![Expr::Lookup { key: vec![daddr], set: CLUSTER_IPS.into() }, Expr::Reject],
        "Reject traffic to invalid ports of ClusterIPs",
    )];
    if !ctx.service_cidrs.is_empty() {
        let items = ctx.service_cidrs.iter().map(|c| KeyPart::Net(*c)).collect();
        let unallocated = Expr::InAnon { field: daddr, neq: false, set: AnonSet { items, sep: ListSep::Comma } };
        cluster_ips_check.push(Rule::commented(
            vec![unallocated, Expr::Verdict(Verdict::Drop)],
            "Drop traffic to unallocated ClusterIPs",
        ));
    }
    regular(CLUSTER_IPS_CHECK, cluster_ips_check);
    regular(FIREWALL_CHECK, vec![Rule::new(vec![vmap(dispatch_key(family), FIREWALL_IPS)])]);
    regular(MARK_MASQ, vec![Rule::new(vec![Expr::MarkSet { op: MarkOp::Or, bits: ctx.mark }])]);
    let mut masquerading = vec![
        Rule::new(vec![Expr::MarkTest { mask: ctx.mark, value: 0 }, Expr::Verdict(Verdict::Return)]),
        Rule::new(vec![Expr::MarkSet { op: MarkOp::Xor, bits: ctx.mark }]),
        Rule::new(vec![Expr::Masquerade { fully_random: true }]),
    ];
    if ctx.ruleset == NftRuleset::Maps {
        masquerading.insert(0, maps::hairpin_rule(family));
    }
    regular(MASQUERADING, masquerading);
    let (np_check, np_dispatch) = match ctx.node_ports {
        NodePorts::All => (vec![no_localhost(family)], vec![Expr::FibLocal(FibKey::Daddr), no_localhost(family)]),
        NodePorts::Ips(_) => {
            let m = Expr::Lookup { key: vec![daddr], set: NODEPORT_IPS.into() };
            (vec![m.clone()], vec![m])
        }
    };
    let with_vmap = |mut matches: Vec<Expr>, map: &str| {
        matches.push(vmap(port_key(), map));
        Rule::new(matches)
    };
    regular(NODEPORT_ENDPOINTS_CHECK, vec![with_vmap(np_check, NO_ENDPOINT_NODEPORTS)]);
    let services = match ctx.ruleset {
        NftRuleset::Upstream => {
            vec![Rule::new(vec![vmap(dispatch_key(family), SERVICE_IPS)]), with_vmap(np_dispatch, SERVICE_NODEPORTS)]
        }
        NftRuleset::Maps => maps::services_rules(family, np_dispatch),
    };
    regular(SERVICES, services);
    regular(SERVICE_ENDPOINTS_CHECK, vec![Rule::new(vec![vmap(dispatch_key(family), NO_ENDPOINT_SERVICES)])]);
    chains.push(Chain {
        name: REJECT_CHAIN.into(),
        base: None,
        comment: Some("helper for @no-endpoint-services / @no-endpoint-nodeports".into()),
        rules: vec![Rule::new(vec![Expr::Reject])],
    });
    for (to, from, new_only) in JUMPS {
        let mut exprs = Vec::with_capacity(2);
        if new_only {
            exprs.push(Expr::CtState(CtState::New));
        }
        exprs.push(Expr::Verdict(Verdict::Jump(to.to_string())));
        if let Some(c) = chains.iter_mut().find(|c| c.name == from) {
            c.rules.push(Rule::new(exprs));
        }
    }
    if ctx.ruleset == NftRuleset::Maps {
        chains.extend(maps::chains(ctx));
    }
    chains
}

/// The sets and maps, and the members of `nodeport-ips`.
fn containers(ctx: &NftablesContext) -> (Vec<SetSpec>, Vec<SetElement>) {
    let addr = KeyType::addr(ctx.family);
    let dispatch = vec![addr, KeyType::InetProto, KeyType::InetService];
    let ports = vec![KeyType::InetProto, KeyType::InetService];
    let mut sets = vec![
        SetSpec::set(CLUSTER_IPS, vec![addr], Some("Active ClusterIPs")),
        SetSpec::verdict_map(
            NO_ENDPOINT_SERVICES,
            dispatch.clone(),
            Some("vmap to drop or reject packets to services with no endpoints"),
        ),
        SetSpec::verdict_map(
            NO_ENDPOINT_NODEPORTS,
            ports.clone(),
            Some("vmap to drop or reject packets to service nodeports with no endpoints"),
        ),
        SetSpec::verdict_map(
            FIREWALL_IPS,
            dispatch.clone(),
            Some("destinations that are subject to LoadBalancerSourceRanges"),
        ),
        SetSpec::verdict_map(SERVICE_IPS, dispatch, Some("ClusterIP, ExternalIP and LoadBalancer IP traffic")),
        SetSpec::verdict_map(SERVICE_NODEPORTS, ports, Some("NodePort traffic")),
    ];
    if ctx.ruleset == NftRuleset::Maps {
        sets.retain(|s| s.name != SERVICE_IPS && s.name != SERVICE_NODEPORTS);
        sets.extend(maps::sets(ctx.family));
    }
    let mut elements = vec![];
    if let NodePorts::Ips(ips) = &ctx.node_ports {
        sets.push(nodeport_ips_set(ctx.family));
        elements = ips
            .iter()
            .map(|ip| SetElement { set: NODEPORT_IPS.into(), element: Element::key(vec![KeyPart::Addr(*ip)]) })
            .collect();
    }
    (sets, elements)
}
