//! The top-level objects every sync of upstream's nftables proxier sets up
//! (setupNFTables): base chains with their hooks and priorities, the jumps
//! into our regular chains, masquerading, the no-endpoint, firewall and
//! ClusterIP checks, the dispatch maps, and the `nodeport-ips` set.

use super::context::{NftablesContext, NodePorts};
use super::names::*;
use super::ruleset::{addr_type, nft_family, Chain, Element, Hook, Objects, Rule, Set};
use crate::net::IpFamily;

/// dstnat, as knftables numbers it.
const DSTNAT: i32 = -100;
/// srcnat.
const SRCNAT: i32 = 100;
/// filter.
const FILTER: i32 = 0;

/// Upstream's nftablesBaseChains: (name, type, hook, priority).
pub const BASE_CHAINS: [(&str, &str, &str, i32); 8] = [
    (FILTER_PREROUTING_PRE_DNAT, "filter", "prerouting", DSTNAT - 10),
    (FILTER_OUTPUT_PRE_DNAT, "filter", "output", DSTNAT - 10),
    (FILTER_INPUT, "filter", "input", FILTER),
    (FILTER_FORWARD, "filter", "forward", FILTER),
    (FILTER_OUTPUT, "filter", "output", FILTER),
    (NAT_PREROUTING, "nat", "prerouting", DSTNAT),
    (NAT_OUTPUT, "nat", "output", DSTNAT),
    (NAT_POSTROUTING, "nat", "postrouting", SRCNAT),
];

/// Upstream's nftablesJumpChains: (to, from, match), in rule order.
const JUMPS: [(&str, &str, &str); 11] = [
    (NODEPORT_ENDPOINTS_CHECK, FILTER_INPUT, "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, FILTER_INPUT, "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, FILTER_FORWARD, "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, FILTER_OUTPUT, "ct state new"),
    (FIREWALL_CHECK, FILTER_PREROUTING_PRE_DNAT, "ct state new"),
    (FIREWALL_CHECK, FILTER_OUTPUT_PRE_DNAT, "ct state new"),
    (SERVICES, NAT_OUTPUT, ""),
    (SERVICES, NAT_PREROUTING, ""),
    (MASQUERADING, NAT_POSTROUTING, ""),
    (CLUSTER_IPS_CHECK, FILTER_FORWARD, "ct state new"),
    (CLUSTER_IPS_CHECK, FILTER_OUTPUT, "ct state new"),
];

/// Rules matching no destination but loopback (`ip daddr != 127.0.0.0/8`).
fn no_localhost(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip daddr != 127.0.0.0/8",
        IpFamily::V6 => "ip6 daddr != ::1",
    }
}

fn set(name: &str, key_type: String, comment: &str) -> Set {
    Set { name: name.into(), map: false, key_type, flags: vec![], timeout: None, comment: Some(comment.into()) }
}

fn vmap(name: &str, key_type: &str, comment: &str) -> Set {
    Set { map: true, ..set(name, format!("{key_type} : verdict"), comment) }
}

/// The top-level objects for `ctx`.
pub fn top_level(ctx: &NftablesContext) -> Objects {
    let (sets, elements) = containers(ctx);
    Objects { chains: chains(ctx), sets, elements }
}

/// The base chains and the top-level regular chains, with their rules.
fn chains(ctx: &NftablesContext) -> Vec<Chain> {
    let ip = nft_family(ctx.family);
    let mut chains: Vec<Chain> = BASE_CHAINS
        .iter()
        .map(|(name, kind, hook, priority)| Chain {
            name: name.to_string(),
            hook: Some(Hook { kind, hook, priority: *priority }),
            comment: None,
            rules: vec![],
        })
        .collect();
    let mut regular = |name: &str, rules: Vec<Rule>| chains.push(Chain::regular(name, rules));
    let mut cluster_ips_check = vec![Rule::commented(
        format!("{ip} daddr @{CLUSTER_IPS} reject"),
        "Reject traffic to invalid ports of ClusterIPs",
    )];
    if !ctx.service_cidrs.is_empty() {
        let cidrs: Vec<String> = ctx.service_cidrs.iter().map(|c| c.to_string()).collect();
        cluster_ips_check.push(Rule::commented(
            format!("{ip} daddr {{ {} }} drop", cidrs.join(",")),
            "Drop traffic to unallocated ClusterIPs",
        ));
    }
    regular(CLUSTER_IPS_CHECK, cluster_ips_check);
    regular(FIREWALL_CHECK, vec![Rule::new(format!("{ip} daddr . meta l4proto . th dport vmap @{FIREWALL_IPS}"))]);
    regular(MARK_MASQ, vec![Rule::new(format!("mark set mark or {}", ctx.mark))]);
    regular(
        MASQUERADING,
        vec![
            Rule::new(format!("mark and {} == 0 return", ctx.mark)),
            Rule::new(format!("mark set mark xor {}", ctx.mark)),
            Rule::new("masquerade fully-random"),
        ],
    );
    let (np_check, np_dispatch) = match ctx.node_ports {
        NodePorts::All => {
            let nl = no_localhost(ctx.family);
            (format!("{nl} meta l4proto . th dport"), format!("fib daddr type local {nl} meta l4proto . th dport"))
        }
        NodePorts::Ips(_) => {
            let m = format!("{ip} daddr @{NODEPORT_IPS} meta l4proto . th dport");
            (m.clone(), m)
        }
    };
    regular(NODEPORT_ENDPOINTS_CHECK, vec![Rule::new(format!("{np_check} vmap @{NO_ENDPOINT_NODEPORTS}"))]);
    regular(
        SERVICES,
        vec![
            Rule::new(format!("{ip} daddr . meta l4proto . th dport vmap @{SERVICE_IPS}")),
            Rule::new(format!("{np_dispatch} vmap @{SERVICE_NODEPORTS}")),
        ],
    );
    regular(
        SERVICE_ENDPOINTS_CHECK,
        vec![Rule::new(format!("{ip} daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}"))],
    );
    chains.push(Chain {
        name: REJECT_CHAIN.into(),
        hook: None,
        comment: Some("helper for @no-endpoint-services / @no-endpoint-nodeports".into()),
        rules: vec![Rule::new("reject")],
    });
    for (to, from, m) in JUMPS {
        let text = if m.is_empty() { format!("jump {to}") } else { format!("{m} jump {to}") };
        if let Some(c) = chains.iter_mut().find(|c| c.name == from) {
            c.rules.push(Rule::new(text));
        }
    }
    chains
}

/// The sets and maps, and the members of `nodeport-ips`.
fn containers(ctx: &NftablesContext) -> (Vec<Set>, Vec<Element>) {
    let addr = addr_type(ctx.family);
    let dispatch = format!("{addr} . inet_proto . inet_service");
    let mut sets = vec![
        set(CLUSTER_IPS, addr.to_string(), "Active ClusterIPs"),
        vmap(NO_ENDPOINT_SERVICES, &dispatch, "vmap to drop or reject packets to services with no endpoints"),
        vmap(
            NO_ENDPOINT_NODEPORTS,
            "inet_proto . inet_service",
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        vmap(FIREWALL_IPS, &dispatch, "destinations that are subject to LoadBalancerSourceRanges"),
        vmap(SERVICE_IPS, &dispatch, "ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        vmap(SERVICE_NODEPORTS, "inet_proto . inet_service", "NodePort traffic"),
    ];
    let mut elements = vec![];
    if let NodePorts::Ips(ips) = &ctx.node_ports {
        sets.push(set(NODEPORT_IPS, addr.to_string(), "IPs that accept NodePort traffic"));
        elements = ips
            .iter()
            .map(|ip| Element { set: NODEPORT_IPS.into(), key: vec![ip.to_string()], value: vec![], comment: None })
            .collect();
    }
    (sets, elements)
}
