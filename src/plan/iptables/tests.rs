//! The iptables-mode planner against upstream's fixtures
//! (docs/upstream/iptables.md section 9) and its partial-sync behaviour.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use serde_json::{json, Value};

use super::service::probability;
use super::*;
use crate::fixtures::*;
use crate::model::{Model, NamespacedName, ServicePortName};
use crate::msgs::{ResourceKind, SourceEvent};
use crate::net::{IpFamily, Protocol};
use crate::plan::local::LocalDetector;

const NODE: &str = "test-node";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Upstream's fake proxier: detect-local 10.0.0.0/8, mark 0x4000 (its
/// fake hard-codes the short form), no --random-fully, nfacct counters
/// present, localhost NodePorts, nodePortAddresses matching all.
fn fake_ctx() -> IptablesContext {
    IptablesContext {
        family: IpFamily::V4,
        node_name: NODE.into(),
        zone: String::new(),
        node_ip: Some(ip("192.168.0.2")),
        masquerade_all: false,
        mark: "0x4000".into(),
        local: LocalDetector::Cidr("10.0.0.0/8".parse().unwrap()),
        random_fully: false,
        localhost_node_ports: true,
        node_ports: NodePortDestinations::All,
        conntrack_tcp_liberal: false,
        nfacct_ct_state_invalid: true,
        nfacct_localhost_node_ports: true,
    }
}

fn model_with(events: &[SourceEvent]) -> Model {
    let mut m = Model::new(IpFamily::V4, NODE);
    m.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
    m.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
    for e in events {
        m.record(e).unwrap();
    }
    m.apply();
    m
}

/// A Service from its spec (and optional status); ports are named p<port>.
fn svc(ns: &str, name: &str, spec: Value, status: Value) -> SourceEvent {
    let s: Service = from_json(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": ns, "name": name},
        "spec": spec, "status": status,
    }));
    applied_service(s)
}

fn port(p: i32, node_port: i32) -> Value {
    let mut v = json!({"name": format!("p{p}"), "protocol": "TCP", "port": p, "targetPort": p});
    if node_port != 0 {
        v["nodePort"] = json!(node_port);
    }
    v
}

/// A slice with port `p80` (80/TCP) and the given endpoints.
fn eps80(ns: &str, svc: &str, eps: &[Ep]) -> SourceEvent {
    applied_slice(slice(ns, &format!("{svc}-1"), svc, &[("p80", "TCP", 80)], eps))
}

fn remote(ipaddr: &str) -> Ep {
    ep(ipaddr, "other-node")
}

fn no_node(ipaddr: &str) -> Ep {
    Ep { node: None, ..ep(ipaddr, "x") }
}

/// The services of upstream's TestOverallIPTablesRules.
fn overall_events() -> Vec<SourceEvent> {
    vec![
        svc("ns1", "svc1", json!({"type": "ClusterIP", "clusterIP": "172.30.0.41", "ports": [port(80, 0)]}), json!({})),
        eps80("ns1", "svc1", &[remote("10.180.0.1")]),
        svc(
            "ns2",
            "svc2",
            json!({"type": "LoadBalancer", "clusterIP": "172.30.0.42", "ports": [port(80, 3001)],
                   "externalIPs": ["192.168.99.22"], "externalTrafficPolicy": "Local", "healthCheckNodePort": 30000}),
            json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}),
        ),
        eps80("ns2", "svc2", &[no_node("10.180.0.2")]),
        svc(
            "ns3",
            "svc3",
            json!({"type": "NodePort", "clusterIP": "172.30.0.43", "ports": [port(80, 3003)]}),
            json!({}),
        ),
        eps80("ns3", "svc3", &[remote("10.180.0.3")]),
        svc(
            "ns4",
            "svc4",
            json!({"type": "ClusterIP", "clusterIP": "172.30.0.44", "ports": [port(80, 0)], "externalIPs": ["192.168.99.33"]}),
            json!({}),
        ),
        eps80("ns4", "svc4", &[remote("10.180.0.4"), ep("10.180.0.5", NODE)]),
        svc(
            "ns5",
            "svc5",
            json!({"type": "LoadBalancer", "clusterIP": "172.30.0.45", "ports": [port(80, 3002)],
                   "externalTrafficPolicy": "Cluster", "healthCheckNodePort": 30000,
                   "loadBalancerSourceRanges": [" 203.0.113.0/25"], "sessionAffinity": "ClientIP",
                   "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}}}),
            json!({"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}]}}),
        ),
        eps80("ns5", "svc5", &[remote("10.180.0.3")]),
        svc("ns6", "svc6", json!({"type": "ClusterIP", "clusterIP": "172.30.0.46", "ports": [port(80, 0)]}), json!({})),
    ]
}

/// What upstream's assertIPTablesRulesEqual compares: per table, the set of
/// declared chains, each chain's rules in order, and the deleted chains.
/// Our canary (not in upstream's restore input) is left out.
type Canon = BTreeMap<String, (BTreeSet<String>, BTreeMap<String, Vec<String>>, BTreeSet<String>)>;

fn canonical(text: &str) -> Canon {
    let mut out = Canon::new();
    let mut table = String::new();
    for line in text.lines().filter(|l| !l.contains(CANARY)) {
        if let Some(t) = line.strip_prefix('*') {
            table = t.to_string();
            continue;
        }
        let entry = out.entry(table.clone()).or_default();
        if let Some(decl) = line.strip_prefix(':') {
            entry.0.insert(decl.split(' ').next().unwrap().to_string());
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split(' ').next().unwrap().to_string();
            entry.1.entry(chain).or_default().push(line.to_string());
        } else if let Some(c) = line.strip_prefix("-X ") {
            entry.2.insert(c.to_string());
        }
    }
    out.retain(|t, _| t != "mangle");
    out
}

#[test]
fn full_sync_matches_upstreams_overall_fixture() {
    let model = model_with(&overall_events());
    let got = dry_run(&model, fake_ctx());
    let want = include_str!("testdata/overall.txt");
    assert_eq!(canonical(&got), canonical(want), "got:\n{got}");
}

#[test]
fn full_sync_writes_upstreams_rule_order_sorted_chain_declarations_and_our_canary() {
    let events = [
        svc("ns1", "svc1", json!({"type": "ClusterIP", "clusterIP": "172.30.0.41", "ports": [port(80, 0)]}), json!({})),
        eps80("ns1", "svc1", &[remote("10.180.0.1"), remote("10.180.0.2")]),
        svc("ns6", "svc6", json!({"type": "ClusterIP", "clusterIP": "172.30.0.46", "ports": [port(80, 0)]}), json!({})),
    ];
    let got = dry_run(&model_with(&events), fake_ctx());
    assert_eq!(got, include_str!("testdata/ordered.txt"), "got:\n{got}");
}

fn spn(ns: &str, name: &str) -> ServicePortName {
    ServicePortName { service: NamespacedName::new(ns, name), port: "p80".into(), protocol: Protocol::Tcp }
}

/// `count` ClusterIP services `ns/svc<i>`, each with one endpoint.
fn many(count: usize) -> Vec<SourceEvent> {
    let mut ev = Vec::new();
    for i in 0..count {
        let (a, b) = (i / 250, i % 250);
        let name = format!("svc{i}");
        let spec = json!({"type": "ClusterIP", "clusterIP": format!("172.30.{a}.{b}"), "ports": [port(80, 0)]});
        ev.push(svc("ns", &name, spec, json!({})));
        ev.push(eps80("ns", &name, &[remote(&format!("10.1.{a}.{b}"))]));
    }
    ev
}

fn apply(model: &mut Model, events: &[SourceEvent]) -> BTreeSet<ServicePortName> {
    for e in events {
        model.record(e).unwrap();
    }
    model.apply().ports
}

fn count_lines(text: &str, pat: &str) -> usize {
    text.lines().filter(|l| l.contains(pat)).count()
}

#[test]
fn one_endpoint_change_among_1000_services_rewrites_only_that_services_chains() {
    let mut model = model_with(&many(1000));
    let mut p = IptablesPlanner::new(fake_ctx());
    let full = p.full(&model, fake_ctx());
    p.confirm_applied();
    assert_eq!(count_lines(&full, ":KUBE-SVC-"), 1000);
    assert_eq!(count_lines(&full, ":KUBE-SEP-"), 1000);

    let s7 = spn("ns", "svc7");
    let old_sep = endpoint_chain(&s7, &model.endpoints(&s7)[0]);
    let changed = apply(&mut model, &[eps80("ns", "svc7", &[remote("10.9.9.9")])]);
    assert_eq!(changed, [s7.clone()].into());
    let text = p.partial(&model, &changed);
    let new_sep = endpoint_chain(&s7, &model.endpoints(&s7)[0]);
    let declared: Vec<&str> = text.lines().filter(|l| l.starts_with(":KUBE-S")).collect();
    // filter and nat KUBE-SERVICES, then, in name order, svc7's SVC, new SEP, and old SEP (to delete).
    let svc = ServiceChains::new(&s7).svc;
    let mut own_chains = [svc.as_str(), &new_sep, &old_sep];
    own_chains.sort_unstable();
    let want: Vec<String> =
        ["KUBE-SERVICES", "KUBE-SERVICES"].iter().chain(&own_chains).map(|c| format!(":{c} - [0:0]")).collect();
    assert_eq!(declared, want);
    // Every per-service rule is svc7's; the top-level chains still list all 1000.
    let own: Vec<&str> =
        text.lines().filter(|l| l.starts_with("-A KUBE-S") && !l.starts_with("-A KUBE-SERVICES")).collect();
    assert_eq!(own.len(), 1 + 1 + 2, "{own:?}"); // masquerade, the endpoint, its two SEP rules
    assert!(own.iter().all(|l| l.contains("ns/svc7:p80")), "{own:?}");
    assert_eq!(count_lines(&text, "-A KUBE-SERVICES -m comment --comment \"ns/svc"), 1000);
    assert_eq!(text.lines().filter(|l| l.starts_with("-X ")).collect::<Vec<_>>(), [format!("-X {old_sep}")]);
    assert!(!text.contains(CANARY) && !text.contains("*mangle"));
    assert!(text.lines().count() < 1050, "{} lines", text.lines().count());
    // The rule counts (kubeproxy_sync_proxy_rules_iptables_total/_last): the
    // endpoint was swapped for another, so the totals stay; only svc7's
    // chains and the top-level chains were written.
    let c = p.rule_counts();
    let nat_full = full.lines().skip_while(|l| *l != "*nat").filter(|l| l.starts_with("-A ")).count();
    assert_eq!(c.nat_total, nat_full);
    assert_eq!(c.nat_last, text.lines().skip_while(|l| *l != "*nat").filter(|l| l.starts_with("-A ")).count());
    assert!(c.nat_last + 3 * 999 <= c.nat_total, "{c:?}");
    assert_eq!(c.filter_total, c.filter_last);
}

/// The full sync's first part (mangle, filter, nat's declarations) is
/// allocated at its size, not grown to up to twice it while written.
#[test]
fn a_full_syncs_first_part_is_allocated_at_its_size() {
    // 3,500 services: grown line by line, this first part had 180 kB spare.
    let model = model_with(&many(3500));
    let mut p = IptablesPlanner::new(fake_ctx());
    let input = p.full_input(&model, fake_ctx());
    let first = input.parts().next().unwrap();
    assert!(first.lines().filter(|l| l.starts_with(":KUBE-SEP-")).count() == 3500, "the declarations are in it");
    let len: usize = input.parts().map(str::len).sum();
    let spare = input.allocated() - len;
    assert!(spare <= render::FIXED_LINES + 1024, "{spare} bytes spare in parts of {len} (the first {})", first.len());
}

#[test]
fn an_endpoint_replaced_deletes_its_old_chain() {
    let mut model = model_with(&many(3));
    let mut p = IptablesPlanner::new(fake_ctx());
    p.full(&model, fake_ctx());
    p.confirm_applied();
    let old_sep = endpoint_chain(&spn("ns", "svc1"), &model.endpoints(&spn("ns", "svc1"))[0]);
    let changed = apply(&mut model, &[eps80("ns", "svc1", &[remote("10.9.9.9")])]);
    let text = p.partial(&model, &changed);
    assert_eq!(p.stale_chains(), vec![old_sep.clone()]);
    assert!(text.contains(&format!(":{old_sep} - [0:0]\n")), "{text}");
    assert!(text.contains(&format!("\n-X {old_sep}\n")), "{text}");
    assert!(!text.contains(&format!("-A {old_sep}")));
    // Deleted once applied; retried until then.
    let again = p.partial(&model, &BTreeSet::new());
    assert!(again.contains(&format!("-X {old_sep}")), "not confirmed: deleted again");
    p.confirm_applied();
    assert!(p.stale_chains().is_empty());
    assert!(!p.partial(&model, &BTreeSet::new()).contains("-X "));
}

#[test]
fn a_removed_service_has_its_chains_deleted_and_leaves_the_top_level_chains() {
    let mut events = many(2);
    let mut model = model_with(&events);
    let mut p = IptablesPlanner::new(fake_ctx());
    p.full(&model, fake_ctx());
    p.confirm_applied();
    let gone = spn("ns", "svc1");
    let sep = endpoint_chain(&gone, &model.endpoints(&gone)[0]);
    let SourceEvent::Service(crate::msgs::Change::Applied(s)) = events.remove(2) else { panic!() };
    let changed = apply(&mut model, &[deleted_service((*s).clone())]);
    assert_eq!(changed, [gone.clone()].into());
    let text = p.partial(&model, &changed);
    let svc_chain = ServiceChains::new(&gone).svc;
    let mut deleted: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("-X ")).collect();
    deleted.sort();
    let mut want = vec![svc_chain.as_str(), sep.as_str()];
    want.sort();
    assert_eq!(deleted, want);
    assert!(!text.contains("ns/svc1:p80"), "{text}");
    assert!(text.contains("ns/svc0:p80 cluster IP"));
}

#[test]
fn a_service_losing_its_endpoints_rejects_and_drops_its_chains() {
    let mut model = model_with(&many(1));
    let mut p = IptablesPlanner::new(fake_ctx());
    p.full(&model, fake_ctx());
    p.confirm_applied();
    let changed = apply(&mut model, &[eps80("ns", "svc0", &[])]);
    let text = p.partial(&model, &changed);
    let want = "-A KUBE-SERVICES -m comment --comment \"ns/svc0:p80 has no endpoints\" -m tcp -p tcp -d 172.30.0.0 \
                --dport 80 -j REJECT\n";
    assert!(text.contains(want), "{text}");
    assert_eq!(count_lines(&text, "-X KUBE-S"), 2, "{text}");
}

#[test]
fn a_partial_sync_without_changes_writes_only_the_top_level_chains() {
    let model = model_with(&overall_events());
    let mut p = IptablesPlanner::new(fake_ctx());
    let full = p.full(&model, fake_ctx());
    p.confirm_applied();
    let text = p.partial(&model, &BTreeSet::new());
    let top: Vec<&str> =
        full.lines().filter(|l| !l.contains("KUBE-SVC-") || l.starts_with("-A KUBE-SERVICES")).collect();
    assert!(text.lines().all(|l| top.contains(&l)), "{text}");
    let declared: BTreeSet<&str> = text.lines().filter(|l| l.starts_with(':')).collect();
    let want: BTreeSet<&str> = [
        ":KUBE-SERVICES - [0:0]",
        ":KUBE-EXTERNAL-SERVICES - [0:0]",
        ":KUBE-FORWARD - [0:0]",
        ":KUBE-NODEPORTS - [0:0]",
        ":KUBE-PROXY-FIREWALL - [0:0]",
        ":KUBE-FIREWALL - [0:0]",
        ":KUBE-POSTROUTING - [0:0]",
        ":KUBE-MARK-MASQ - [0:0]",
    ]
    .into();
    assert_eq!(declared, want);
    // The top-level chains are the same as the full sync's.
    let canon_full = canonical(&full);
    let canon_part = canonical(&text);
    for (table, (_, rules, _)) in &canon_part {
        for (chain, lines) in rules {
            assert_eq!(Some(lines), canon_full[table].1.get(chain), "{table} {chain}");
        }
    }
}

#[test]
fn chains_left_in_the_kernel_are_deleted_by_the_first_sync() {
    let model = model_with(&many(1));
    let mut p = IptablesPlanner::new(fake_ctx());
    let active = ServiceChains::new(&spn("ns", "svc0")).svc;
    p.note_kernel_chains(["KUBE-SVC-LEFTOVER0000000", "KUBE-MARK-DROP", "FOREIGN", active.as_str()]);
    assert!(p.stale_chains().contains(&"KUBE-SVC-LEFTOVER0000000".to_string()));
    let text = p.full(&model, fake_ctx());
    assert_eq!(p.stale_chains(), vec!["KUBE-SVC-LEFTOVER0000000".to_string()]);
    assert!(text.contains("-X KUBE-SVC-LEFTOVER0000000\n"));
    assert_eq!(count_lines(&text, "-X "), 1);
}

#[test]
fn more_than_1000_endpoints_drop_endpoint_comments_only() {
    let mut eps = Vec::new();
    for i in 0..1001 {
        eps.push(remote(&format!("10.2.{}.{}", i / 250, i % 250)));
    }
    let events = [
        svc("ns", "big", json!({"type": "ClusterIP", "clusterIP": "172.30.9.9", "ports": [port(80, 0)]}), json!({})),
        eps80("ns", "big", &eps),
    ];
    let model = model_with(&events);
    let mut p = IptablesPlanner::new(fake_ctx());
    let text = p.full(&model, fake_ctx());
    assert!(p.large_cluster_mode());
    assert!(text.contains("-A KUBE-SERVICES -m comment --comment \"ns/big:p80 cluster IP\""));
    let chains = ServiceChains::new(&spn("ns", "big"));
    assert!(text.contains(&format!("-A {} -m comment --comment \"ns/big:p80 cluster IP\"", chains.svc)));
    assert_eq!(count_lines(&text, "-> "), 0);
    let sep_rules: Vec<&str> = text.lines().filter(|l| l.starts_with("-A KUBE-SEP-")).collect();
    assert_eq!(sep_rules.len(), 2002);
    assert!(sep_rules.iter().all(|l| !l.contains("--comment")));
    assert!(text.contains(" -m statistic --mode random --probability 0.0009990010 -j KUBE-SEP-"));
}

#[test]
fn probabilities_are_formatted_as_upstreams_percent_0_10f() {
    assert_eq!(probability(2), "0.5000000000");
    assert_eq!(probability(3), "0.3333333333");
    assert_eq!(probability(4), "0.2500000000");
    assert_eq!(probability(6), "0.1666666667");
    assert_eq!(probability(7), "0.1428571429");
    assert_eq!(probability(1000), "0.0010000000");
    // An exact tie at the 11th digit rounds to even, as Go's strconv does.
    assert_eq!(probability(2048), "0.0004882812");
}

/// Service `ns/p` (with LB ingress 1.2.3.4 if it is a LoadBalancer) and its endpoints.
fn policy_events(spec: Value, eps: &[Ep]) -> Vec<SourceEvent> {
    let status = if spec["type"] == "LoadBalancer" {
        json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}})
    } else {
        json!({})
    };
    vec![svc("ns", "p", spec, status), eps80("ns", "p", eps)]
}

fn lines_of(text: &str, chain: &str) -> Vec<String> {
    text.lines().filter(|l| l.starts_with(&format!("-A {chain} "))).map(str::to_string).collect()
}

#[test]
fn external_policy_local_with_a_local_endpoint_goes_to_the_local_chain() {
    let spec = json!({"type": "LoadBalancer", "clusterIP": "172.30.1.1", "ports": [port(80, 3100)],
                      "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000});
    let model = model_with(&policy_events(spec, &[ep("10.0.0.1", NODE), remote("10.0.0.2")]));
    let text = dry_run(&model, fake_ctx());
    let c = ServiceChains::new(&spn("ns", "p"));
    let ext = lines_of(&text, &c.ext);
    assert_eq!(ext.last().unwrap(), &format!("-A {} -j {}", c.ext, c.svl));
    assert_eq!(lines_of(&text, &c.svl).len(), 1, "one local endpoint");
    assert_eq!(lines_of(&text, &c.svc).len(), 3, "masquerade + two cluster endpoints");
    assert!(text.contains("-A KUBE-NODEPORTS -m comment --comment \"ns/p:p80 health check node port\" -m tcp -p tcp --dport 31000 -j ACCEPT"));
    assert!(!text.contains("has no local endpoints"));
}

#[test]
fn internal_policy_local_without_local_endpoints_drops_cluster_ip_traffic() {
    let spec = json!({"type": "ClusterIP", "clusterIP": "172.30.1.1", "ports": [port(80, 0)], "internalTrafficPolicy": "Local"});
    let model = model_with(&policy_events(spec, &[remote("10.0.0.2")]));
    let mut p = IptablesPlanner::new(fake_ctx());
    let text = p.full(&model, fake_ctx());
    let want = "-A KUBE-SERVICES -m comment --comment \"ns/p:p80 has no local endpoints\" -m tcp -p tcp -d 172.30.1.1 \
                --dport 80 -j DROP\n";
    assert!(text.contains(want), "{text}");
    assert!(!text.contains("KUBE-SVC-") && !text.contains("KUBE-SVL-") && !text.contains("KUBE-SEP-"), "{text}");
    assert_eq!(p.no_local_endpoints(), (1, 0));
}

#[test]
fn terminating_endpoints_are_used_when_none_is_ready() {
    let spec = json!({"type": "ClusterIP", "clusterIP": "172.30.1.1", "ports": [port(80, 0)]});
    let model = model_with(&policy_events(spec, &[remote("10.0.0.2").terminating(), remote("10.0.0.3").not_ready()]));
    let text = dry_run(&model, fake_ctx());
    assert!(text.contains("--to-destination 10.0.0.2:80"), "{text}");
    assert!(!text.contains("10.0.0.3"));
}

#[test]
fn source_ranges_holding_the_node_ip_let_the_node_reach_the_vip() {
    let spec = json!({"type": "LoadBalancer", "clusterIP": "172.30.1.1", "ports": [port(80, 3100)],
                      "loadBalancerSourceRanges": ["192.168.0.0/24", "198.51.100.0/24"]});
    let model = model_with(&policy_events(spec, &[remote("10.0.0.2")]));
    let text = dry_run(&model, fake_ctx());
    let fw = ServiceChains::new(&spn("ns", "p")).fw;
    let ext = ServiceChains::new(&spn("ns", "p")).ext;
    let head = format!("-A {fw} -m comment --comment \"ns/p:p80 loadbalancer IP\"");
    assert_eq!(
        lines_of(&text, &fw),
        vec![
            format!("{head} -s 192.168.0.0/24 -j {ext}"),
            format!("{head} -s 198.51.100.0/24 -j {ext}"),
            format!("{head} -s 1.2.3.4 -j {ext}"),
            format!(
                "-A {fw} -m comment --comment \"other traffic to ns/p:p80 will be dropped by KUBE-PROXY-FIREWALL\""
            ),
        ]
    );
}

/// Ranges with leading zeros are read as upstream reads them; ranges that
/// all fail to parse leave the FW chain without a source to accept, so
/// KUBE-PROXY-FIREWALL drops every packet to the load balancer IP.
#[test]
fn source_ranges_with_leading_zeros_apply_and_unparseable_ones_fail_closed() {
    let (c, head) = (ServiceChains::new(&spn("ns", "p")), "-m comment --comment \"ns/p:p80 loadbalancer IP\"");
    let drop_rest = format!(
        "-A {} -m comment --comment \"other traffic to ns/p:p80 will be dropped by KUBE-PROXY-FIREWALL\"",
        c.fw
    );
    let filter = "-A KUBE-PROXY-FIREWALL -m comment --comment \"ns/p:p80 traffic not accepted by";
    for (ranges, accepted) in [
        (json!(["203.0.113.000/025"]), vec![format!("-A {} {head} -s 203.0.113.0/25 -j {}", c.fw, c.ext)]),
        (json!(["bogus", "10.0.0.0/33"]), vec![]),
        (json!(["bogus", " 203.0.113.0/25 "]), vec![format!("-A {} {head} -s 203.0.113.0/25 -j {}", c.fw, c.ext)]),
    ] {
        let spec = json!({"type": "LoadBalancer", "clusterIP": "172.30.1.1", "ports": [port(80, 3100)],
                          "loadBalancerSourceRanges": ranges});
        let text = dry_run(&model_with(&policy_events(spec, &[remote("10.0.0.2")])), fake_ctx());
        let mut want = accepted;
        want.push(drop_rest.clone());
        assert_eq!(lines_of(&text, &c.fw), want, "{ranges}");
        assert!(text.lines().any(|l| l.starts_with(filter) && l.ends_with("-d 1.2.3.4 --dport 80 -j DROP")), "{text}");
        assert!(text.contains(&format!("-d 1.2.3.4 --dport 80 -j {}", c.fw)), "{ranges}: the VIP goes to the FW chain");
    }
    // Blank ranges restrict nothing, as upstream.
    let spec = json!({"type": "LoadBalancer", "clusterIP": "172.30.1.1", "ports": [port(80, 3100)],
                      "loadBalancerSourceRanges": ["", " "]});
    let text = dry_run(&model_with(&policy_events(spec, &[remote("10.0.0.2")])), fake_ctx());
    assert!(!text.contains(&c.fw) && !text.contains(filter), "{text}");
}

#[test]
fn local_detectors_and_masquerade_all_shape_the_masquerade_rules() {
    let spec = json!({"type": "NodePort", "clusterIP": "172.30.1.1", "ports": [port(80, 3100)], "externalTrafficPolicy": "Local"});
    let model = model_with(&policy_events(spec, &[ep("10.0.0.1", NODE)]));
    let c = ServiceChains::new(&spn("ns", "p"));
    let cases = [
        (LocalDetector::BridgeInterface("cbr0".into()), false, "! -i cbr0 -j KUBE-MARK-MASQ", Some("-i cbr0 -j")),
        (LocalDetector::InterfacePrefix("veth".into()), false, "! -i veth+ -j KUBE-MARK-MASQ", Some("-i veth+ -j")),
        (LocalDetector::None, true, "--dport 80 -j KUBE-MARK-MASQ", None),
    ];
    for (local, all, masq, pod) in cases {
        let ctx = IptablesContext { local: local.clone(), masquerade_all: all, ..fake_ctx() };
        let text = dry_run(&model, ctx);
        assert!(lines_of(&text, &c.svc)[0].ends_with(masq), "{local:?}: {text}");
        let ext = lines_of(&text, &c.ext);
        match pod {
            Some(m) => {
                assert!(ext[0].contains(&format!("\"pod traffic for ns/p:p80 external destinations\" {m} {}", c.svc)))
            }
            None => assert!(!text.contains("pod traffic")),
        }
    }
    let ctx = IptablesContext { local: LocalDetector::None, ..fake_ctx() };
    let text = dry_run(&model, ctx);
    assert_eq!(lines_of(&text, &c.svc).len(), 1, "no masquerade rule without a detector: {text}");
}

#[test]
fn the_node_ports_tail_follows_node_port_addresses_and_localhost_setting() {
    let model = model_with(&many(1));
    let tail = |ctx: IptablesContext| -> Vec<String> {
        dry_run(&model, ctx).lines().filter(|l| l.contains("this must be the last rule")).map(str::to_string).collect()
    };
    let head = "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\"";
    assert_eq!(tail(fake_ctx()), vec![format!("{head} -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS")]);
    let no_lo = IptablesContext { localhost_node_ports: false, ..fake_ctx() };
    assert_eq!(
        tail(no_lo.clone()),
        vec![format!("{head} -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS")]
    );
    let ips = NodePortDestinations::Ips(vec![ip("127.0.0.1"), ip("192.168.0.2")]);
    let with_ips = IptablesContext { node_ports: ips, ..no_lo };
    assert_eq!(tail(with_ips.clone()), vec![format!("{head} -d 192.168.0.2 -j KUBE-NODEPORTS")]);
    let with_lo = IptablesContext { localhost_node_ports: true, ..with_ips };
    assert_eq!(tail(with_lo).len(), 2);
    assert!(!dry_run(&model, IptablesContext { localhost_node_ports: false, ..fake_ctx() }).contains("KUBE-FIREWALL"));
}

#[test]
fn ipv6_rules_use_brackets_and_never_localhost_node_ports() {
    let mut m = Model::new(IpFamily::V6, NODE);
    m.record(&svc(
        "ns",
        "v6",
        json!({"type": "NodePort", "clusterIP": "fd00::10", "clusterIPs": ["fd00::10"],
                                      "ipFamilies": ["IPv6"], "ports": [port(80, 3100)]}),
        json!({}),
    ))
    .unwrap();
    let mut s = slice("ns", "v6-1", "v6", &[("p80", "TCP", 80)], &[remote("fd00:1::5")]);
    s.address_type = "IPv6".into();
    m.record(&applied_slice(s)).unwrap();
    m.apply();
    let ctx = IptablesContext {
        family: IpFamily::V6,
        localhost_node_ports: false,
        local: LocalDetector::Cidr("fd00:1::/64".parse().unwrap()),
        ..fake_ctx()
    };
    let text = dry_run(&m, ctx);
    assert!(text.contains("-j DNAT --to-destination [fd00:1::5]:80\n"), "{text}");
    assert!(text.contains("-s fd00:1::5 -j KUBE-MARK-MASQ\n"));
    assert!(text.contains("-m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS\n"));
    assert!(!text.contains("KUBE-FIREWALL") && !text.contains("127.0.0.0/8"));
}

#[test]
fn random_fully_liberal_conntrack_and_no_nfacct() {
    let model = model_with(&overall_events());
    let ctx = IptablesContext {
        random_fully: true,
        conntrack_tcp_liberal: true,
        nfacct_localhost_node_ports: false,
        mark: crate::plan::context::mark(14),
        ..fake_ctx()
    };
    let text = dry_run(&model, ctx);
    assert!(text.contains("\"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n"));
    assert!(!text.contains("INVALID") && !text.contains("nfacct"), "{text}");
    assert!(text.contains("-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000\n"));
}

#[test]
fn jumps_are_upstreams_rules() {
    let lines: Vec<String> = JUMPS.iter().chain(&KUBELET_JUMPS).map(Jump::save_line).collect();
    assert_eq!(lines[0], "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES");
    assert_eq!(lines[2], "-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS");
    assert_eq!(lines[11], "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING");
    assert_eq!(lines[12], "-A INPUT -j KUBE-FIREWALL");
    assert_eq!(KUBELET_JUMPS[1].insert_line(), "-I OUTPUT 1 -j KUBE-FIREWALL");
}

#[test]
fn client_ip_affinity_checks_recent_lists_first() {
    let spec = json!({"type": "ClusterIP", "clusterIP": "172.30.1.1", "ports": [port(80, 0)], "sessionAffinity": "ClientIP",
                      "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}});
    let model = model_with(&policy_events(spec, &[remote("10.0.0.2"), remote("10.0.0.10")]));
    let text = dry_run(&model, fake_ctx());
    let s = spn("ns", "p");
    let c = ServiceChains::new(&s);
    // Upstream's order is by `ip:port` string: 10.0.0.10 before 10.0.0.2.
    let eps = model.endpoints(&s);
    let (e10, e2) = (endpoint_chain(&s, &eps[1]), endpoint_chain(&s, &eps[0]));
    assert_eq!(
        lines_of(&text, &c.svc)[1..],
        [
            format!("-A {} -m comment --comment \"ns/p:p80 -> 10.0.0.10:80\" -m recent --name {e10} --rcheck --seconds 60 --reap -j {e10}", c.svc),
            format!("-A {} -m comment --comment \"ns/p:p80 -> 10.0.0.2:80\" -m recent --name {e2} --rcheck --seconds 60 --reap -j {e2}", c.svc),
            format!("-A {} -m comment --comment \"ns/p:p80 -> 10.0.0.10:80\" -m statistic --mode random --probability 0.5000000000 -j {e10}", c.svc),
            format!("-A {} -m comment --comment \"ns/p:p80 -> 10.0.0.2:80\" -j {e2}", c.svc),
        ]
    );
    assert!(text.contains(&format!("-A {e2} -m comment --comment ns/p:p80 -m recent --name {e2} --set -m tcp -p tcp -j DNAT --to-destination 10.0.0.2:80\n")));
}

/// The nat table's (declared chains, rules per chain, deleted chains).
fn nat(text: &str) -> (BTreeSet<String>, BTreeMap<String, Vec<String>>, BTreeSet<String>) {
    canonical(text).remove("nat").unwrap()
}

/// Upstream's TestSyncProxyRulesRepeated (docs/upstream/iptables.md 9.2).
#[test]
fn repeated_partial_syncs_follow_upstreams_fixture() {
    let cluster_ip = |ns: &str, name: &str, ip: &str, p: i32| {
        svc(ns, name, json!({"type": "ClusterIP", "clusterIP": ip, "ports": [port(p, 0)]}), json!({}))
    };
    let eps = |ns: &str, name: &str, p: i32, ipaddr: &str| {
        let pn = format!("p{p}");
        applied_slice(slice(ns, &format!("{name}-1"), name, &[(&pn, "TCP", p)], &[remote(ipaddr)]))
    };
    let mut model = model_with(&[
        cluster_ip("ns1", "svc1", "172.30.0.41", 80),
        eps("ns1", "svc1", 80, "10.0.1.1"),
        cluster_ip("ns2", "svc2", "172.30.0.42", 8080),
        eps("ns2", "svc2", 8080, "10.0.2.1"),
    ]);
    let mut p = IptablesPlanner::new(fake_ctx());
    p.full(&model, fake_ctx());
    p.confirm_applied();

    let changed =
        apply(&mut model, &[cluster_ip("ns3", "svc3", "172.30.0.43", 80), eps("ns3", "svc3", 80, "10.0.3.1")]);
    let text = p.partial(&model, &changed);
    p.confirm_applied();
    let s = include_str!("../../../docs/upstream/iptables.md");
    let start = s.find("### 9.2").unwrap();
    let block = &s[start..];
    let fixture = &block[block.find("```\n").unwrap() + 4..];
    let fixture = &fixture[..fixture.find("```").unwrap()];
    assert_eq!(nat(&text), nat(fixture), "{text}");

    let SourceEvent::Service(crate::msgs::Change::Applied(s2)) = cluster_ip("ns2", "svc2", "172.30.0.42", 8080) else {
        panic!()
    };
    let changed = apply(&mut model, &[deleted_service((*s2).clone())]);
    let (_, _, deleted) = nat(&p.partial(&model, &changed));
    p.confirm_applied();
    assert_eq!(deleted, ["KUBE-SEP-UHEGFW77JX3KXTOV".to_string(), "KUBE-SVC-2VJB64SDSIJUP5T6".to_string()].into());

    let changed = apply(&mut model, &[cluster_ip("ns4", "svc4", "172.30.0.44", 80)]);
    let text = p.partial(&model, &changed);
    assert!(text.contains("-A KUBE-SERVICES -m comment --comment \"ns4/svc4:p80 has no endpoints\" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j REJECT\n"));
    let changed = apply(&mut model, &[eps("ns4", "svc4", 80, "10.0.4.1")]);
    let (declared, _, _) = nat(&p.partial(&model, &changed));
    assert!(declared.contains("KUBE-SEP-AYCN5HPXMIRJNJXU") && declared.contains("KUBE-SVC-4SW47YFZTEDKD3PK"));
    p.confirm_applied();

    let changed = apply(&mut model, &[eps("ns3", "svc3", 80, "10.0.3.2")]);
    let (declared, rules, deleted) = nat(&p.partial(&model, &changed));
    assert!(declared.contains("KUBE-SEP-DKCFIS26GWF2WLWC") && rules.contains_key("KUBE-SVC-X27LE4BHSL4DOUIK"));
    assert_eq!(deleted, ["KUBE-SEP-BSWRHOQ77KEXZLNL".to_string()].into());
}
