//! The nftables-mode planner against upstream's fixtures
//! (pkg/proxy/nftables/proxier_test.go): the rendered table and its text
//! (the planner's syncs: [`super::planner_tests`]).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use serde_json::{json, Value};

use super::*;
use crate::fixtures::*;
use crate::model::{Model, NamespacedName, ServicePortName};
use crate::msgs::{ResourceKind, SourceEvent};
use crate::net::{IpFamily, Protocol};
use crate::plan::local::LocalDetector;

const NODE: &str = "test-node";
const BASE: &str = include_str!("testdata/nftables-base.txt");
const OVERALL: &str = include_str!("testdata/nftables-overall.txt");

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Upstream's NewFakeProxier: detect-local 10.0.0.0/8, mark 0x4000 (its
/// fake hard-codes the short form), nodePortAddresses 192.168.0.2/32,
/// ServiceCIDR 172.30.0.0/16.
pub(crate) fn fake_ctx() -> NftablesContext {
    NftablesContext {
        family: IpFamily::V4,
        ruleset: NftRuleset::Upstream,
        node_name: NODE.into(),
        zone: String::new(),
        node_ip: Some(ip("192.168.0.2")),
        masquerade_all: false,
        mark: crate::msgs::nftables::Hex { value: 0x4000, width: 0 },
        local: LocalDetector::Cidr("10.0.0.0/8".parse().unwrap()),
        node_ports: NodePorts::Ips(vec![ip("192.168.0.2")]),
        service_cidrs: vec!["172.30.0.0/16".parse().unwrap()],
    }
}

pub(crate) fn model_with(events: &[SourceEvent]) -> Model {
    let mut m = Model::new(IpFamily::V4, NODE);
    m.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
    m.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
    for e in events {
        m.record(e).unwrap();
    }
    m.apply();
    m
}

/// `n` ClusterIP Services `ns/svc<i>` on 172.30.<i/250>.<i%250>:80, each
/// with `endpoints` endpoints 10.<k+1>.<i/250>.<i%250> on no node.
pub(super) fn cluster_ips(n: usize, endpoints: usize) -> Model {
    let mut events = vec![];
    for i in 0..n {
        let (name, (a, b)) = (format!("svc{i}"), (i / 250, i % 250));
        events.push(cluster_ip("ns", &name, &format!("172.30.{a}.{b}"), 80));
        let eps_of: Vec<Ep> = (1..=endpoints).map(|k| no_node(&format!("10.{k}.{a}.{b}"))).collect();
        events.push(eps("ns", &name, 80, &eps_of));
    }
    model_with(&events)
}

/// A Service from its spec (and optional status); ports are named p<port>.
pub(crate) fn svc(ns: &str, name: &str, spec: Value, status: Value) -> SourceEvent {
    let s: Service = from_json(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": ns, "name": name},
        "spec": spec, "status": status,
    }));
    applied_service(s)
}

pub(super) fn port(p: i32, node_port: i32) -> Value {
    let mut v = json!({"name": format!("p{p}"), "protocol": "TCP", "port": p, "targetPort": p});
    if node_port != 0 {
        v["nodePort"] = json!(node_port);
    }
    v
}

pub(super) fn cluster_ip(ns: &str, name: &str, ip: &str, p: i32) -> SourceEvent {
    svc(ns, name, json!({"type": "ClusterIP", "clusterIP": ip, "ports": [port(p, 0)]}), json!({}))
}

/// A slice with port `p<p>` (TCP) and the given endpoints.
pub(crate) fn eps(ns: &str, svc: &str, p: i32, eps: &[Ep]) -> SourceEvent {
    applied_slice(slice(ns, &format!("{svc}-1"), svc, &[(&format!("p{p}"), "TCP", p)], eps))
}

pub(super) fn remote(ipaddr: &str) -> Ep {
    ep(ipaddr, "other-node")
}

pub(crate) fn no_node(ipaddr: &str) -> Ep {
    Ep { node: None, ..ep(ipaddr, "x") }
}

/// The services of upstream's TestOverallNFTablesRules.
pub(super) fn overall_events() -> Vec<SourceEvent> {
    vec![
        cluster_ip("ns1", "svc1", "172.30.0.41", 80),
        eps("ns1", "svc1", 80, &[no_node("10.180.0.1")]),
        svc(
            "ns2",
            "svc2",
            json!({"type": "LoadBalancer", "clusterIP": "172.30.0.42", "ports": [port(80, 3001)],
                   "externalIPs": ["192.168.99.22"], "externalTrafficPolicy": "Local", "healthCheckNodePort": 30000}),
            json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}),
        ),
        eps("ns2", "svc2", 80, &[no_node("10.180.0.2")]),
        svc(
            "ns3",
            "svc3",
            json!({"type": "NodePort", "clusterIP": "172.30.0.43", "ports": [port(80, 3003)]}),
            json!({}),
        ),
        eps("ns3", "svc3", 80, &[no_node("10.180.0.3")]),
        svc(
            "ns4",
            "svc4",
            json!({"type": "NodePort", "clusterIP": "172.30.0.44", "ports": [port(80, 0)], "externalIPs": ["192.168.99.33"]}),
            json!({}),
        ),
        eps("ns4", "svc4", 80, &[no_node("10.180.0.4"), ep("10.180.0.5", NODE)]),
        svc(
            "ns5",
            "svc5",
            json!({"type": "LoadBalancer", "clusterIP": "172.30.0.45", "ports": [port(80, 3002)],
                   "externalTrafficPolicy": "Cluster", "healthCheckNodePort": 30000,
                   "loadBalancerSourceRanges": [" 203.0.113.0/25"], "sessionAffinity": "ClientIP",
                   "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}}}),
            json!({"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}]}}),
        ),
        eps("ns5", "svc5", 80, &[no_node("10.180.0.3")]),
        cluster_ip("ns6", "svc6", "172.30.0.46", 80),
    ]
}

/// Upstream's sortNFTablesTransaction (helpers_test.go): blank lines and
/// comments dropped; lines ordered by object type (table, chain, rule, set,
/// map, element), then object name, rules kept in order, else by line.
fn sort_like_upstream(text: &str) -> Vec<String> {
    let order = |t: &str| match t {
        "table" => 10,
        "chain" => 9,
        "rule" => 8,
        "set" => 7,
        "map" => 6,
        "element" => 5,
        _ => 0,
    };
    let mut lines: Vec<&str> = text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    lines.sort_by(|a, b| {
        let (wa, wb): (Vec<&str>, Vec<&str>) = (a.split(' ').collect(), b.split(' ').collect());
        if wa.len() < 5 || wb.len() < 5 {
            return std::cmp::Ordering::Equal;
        }
        order(wb[1]).cmp(&order(wa[1])).then_with(|| wa[4].cmp(wb[4])).then_with(|| {
            if wa[1] == "rule" {
                std::cmp::Ordering::Equal
            } else {
                a.cmp(b)
            }
        })
    });
    lines.into_iter().map(str::to_string).collect()
}

/// Upstream's expected text put in knftables' `Fake.Dump()` order: the
/// table, chains, sets, maps (each by name), rules (by chain, in order),
/// elements of sets then maps (by name, then line).
fn fake_dump_order(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let word = |l: &str, i: usize| l.split(' ').nth(i).unwrap_or("").to_string();
    let maps: Vec<String> = lines.iter().filter(|l| word(l, 1) == "map").map(|l| word(l, 4)).collect();
    let rank = |l: &str| match word(l, 1).as_str() {
        "table" => 0,
        "chain" => 1,
        "set" => 2,
        "map" => 3,
        "rule" => 4,
        _ if maps.contains(&word(l, 4)) => 6,
        _ => 5,
    };
    let mut keyed: Vec<(usize, String, usize, &str)> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let within = if word(l, 1) == "rule" { i } else { 0 };
            (rank(l), word(l, 4), within, *l)
        })
        .collect();
    keyed.sort_by(|a, b| {
        (a.0, &a.1, a.2).cmp(&(b.0, &b.1, b.2)).then_with(|| {
            if a.0 >= 5 {
                a.3.cmp(b.3)
            } else {
                std::cmp::Ordering::Equal
            }
        })
    });
    keyed.into_iter().map(|k| format!("{}\n", k.3)).collect()
}

#[test]
fn full_sync_matches_upstreams_overall_fixture() {
    let got = dry_run(&model_with(&overall_events()), &fake_ctx());
    let want = format!("{BASE}{OVERALL}");
    assert_eq!(sort_like_upstream(&got), sort_like_upstream(&want), "got:\n{got}");
    // And byte for byte as knftables' Fake.Dump() lists that table.
    assert_eq!(got, fake_dump_order(&want));
}

#[test]
fn an_empty_model_is_upstreams_base_rules() {
    let got = dry_run(&model_with(&[]), &fake_ctx());
    assert_eq!(got, fake_dump_order(BASE));
}

/// The first state of upstream's TestSyncProxyRulesRepeated.
pub(super) fn repeated_events() -> Vec<SourceEvent> {
    vec![
        cluster_ip("ns1", "svc1", "172.30.0.41", 80),
        svc(
            "ns2",
            "svc2",
            json!({"type": "ClusterIP", "clusterIP": "172.30.0.42", "ports": [port(8080, 0)]}),
            json!({}),
        ),
        eps("ns1", "svc1", 80, &[no_node("10.0.1.1")]),
        eps("ns2", "svc2", 8080, &[no_node("10.0.2.1")]),
    ]
}

const REPEATED: &str = "\
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 8080 : goto service-MHHHYRWA-ns2/svc2/tcp/p8080 }
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5TPGNJF2-ns1/svc1/tcp/p80__10.0.1.1/80 }
add chain ip kube-proxy endpoint-5TPGNJF2-ns1/svc1/tcp/p80__10.0.1.1/80
add rule ip kube-proxy endpoint-5TPGNJF2-ns1/svc1/tcp/p80__10.0.1.1/80 ip saddr 10.0.1.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5TPGNJF2-ns1/svc1/tcp/p80__10.0.1.1/80 meta l4proto tcp dnat to 10.0.1.1:80
add chain ip kube-proxy service-MHHHYRWA-ns2/svc2/tcp/p8080
add rule ip kube-proxy service-MHHHYRWA-ns2/svc2/tcp/p8080 ip daddr 172.30.0.42 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-MHHHYRWA-ns2/svc2/tcp/p8080 numgen random mod 1 vmap { 0 : goto endpoint-7RVP4LUQ-ns2/svc2/tcp/p8080__10.0.2.1/8080 }
add chain ip kube-proxy endpoint-7RVP4LUQ-ns2/svc2/tcp/p8080__10.0.2.1/8080
add rule ip kube-proxy endpoint-7RVP4LUQ-ns2/svc2/tcp/p8080__10.0.2.1/8080 ip saddr 10.0.2.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-7RVP4LUQ-ns2/svc2/tcp/p8080__10.0.2.1/8080 meta l4proto tcp dnat to 10.0.2.1:8080
";

#[test]
fn full_sync_matches_upstreams_repeated_sync_start() {
    let got = dry_run(&model_with(&repeated_events()), &fake_ctx());
    assert_eq!(got, fake_dump_order(&format!("{BASE}{REPEATED}")));
}

/// Applies `events`, re-renders the changed ports, and returns the partial
/// sync from the previous state.
pub(super) fn step(model: &mut Model, rs: &mut Ruleset, events: &[SourceEvent]) -> Delta {
    for e in events {
        model.record(e).unwrap();
    }
    let changed = model.apply().ports;
    let old = rs.clone();
    update(rs, model, &fake_ctx(), &changed);
    assert_eq!(*rs, desired(model, &fake_ctx()), "an update equals a whole render");
    partial_sync(&old, rs)
}

/// Upstream's TestSyncProxyRulesRepeated: the same changes cost the same
/// number of operations, and stale chains are flushed, then deleted.
#[test]
fn partial_syncs_cost_what_upstreams_do() {
    let mut model = model_with(&repeated_events());
    let mut rs = desired(&model, &fake_ctx());
    let svc3 = cluster_ip("ns3", "svc3", "172.30.0.43", 80);
    // Add a service and its endpoints: 2 elements, 2 chains (add, flush, 2 rules each).
    let d = step(&mut model, &mut rs, &[svc3, eps("ns3", "svc3", 80, &[no_node("10.0.3.1")])]);
    assert_eq!(d.tx.len(), 10, "{}", d.tx);
    assert!(d.stale_chains.is_empty());

    // Delete a service: 2 elements deleted, 2 chains flushed and left stale.
    let svc2 = from_json::<Service>(json!({"metadata": {"namespace": "ns2", "name": "svc2"}, "spec": {}}));
    let d = step(&mut model, &mut rs, &[deleted_service(svc2)]);
    assert_eq!(d.tx.len(), 4, "{}", d.tx);
    let stale = vec![
        "endpoint-7RVP4LUQ-ns2/svc2/tcp/p8080__10.0.2.1/8080".to_string(),
        "service-MHHHYRWA-ns2/svc2/tcp/p8080".to_string(),
    ];
    assert_eq!(d.stale_chains, stale);
    assert_eq!(
        delete_stale(IpFamily::V4, &d.stale_chains).to_string(),
        "delete chain ip kube-proxy endpoint-7RVP4LUQ-ns2/svc2/tcp/p8080__10.0.2.1/8080\n\
         delete chain ip kube-proxy service-MHHHYRWA-ns2/svc2/tcp/p8080\n"
    );

    // A service without endpoints: its ClusterIP and a reject element.
    let d = step(&mut model, &mut rs, &[cluster_ip("ns4", "svc4", "172.30.0.44", 80)]);
    assert_eq!(d.tx.len(), 2, "{}", d.tx);
    assert!(d.tx.to_string().contains(
        "add element ip kube-proxy no-endpoint-services { 172.30.0.44 . tcp . 80 comment \"ns4/svc4:p80\" : goto reject-chain }"
    ));
    // Its endpoints arrive: one element added, one deleted, 2 chains.
    let d = step(&mut model, &mut rs, &[eps("ns4", "svc4", 80, &[no_node("10.0.4.1")])]);
    assert_eq!(d.tx.len(), 10, "{}", d.tx);
    assert!(d.tx.to_string().contains("delete element ip kube-proxy no-endpoint-services { 172.30.0.44 . tcp . 80 }"));

    // An endpoint changes: 2 chains rewritten, the old endpoint chain flushed.
    let d = step(&mut model, &mut rs, &[eps("ns3", "svc3", 80, &[no_node("10.0.3.2")])]);
    assert_eq!(d.tx.len(), 9, "{}", d.tx);
    assert_eq!(d.stale_chains, ["endpoint-2OCDJSZQ-ns3/svc3/tcp/p80__10.0.3.1/80"]);
    // An endpoint is added: 3 chains.
    let two = [no_node("10.0.3.2"), no_node("10.0.3.3")];
    let d = step(&mut model, &mut rs, &[eps("ns3", "svc3", 80, &two)]);
    assert_eq!(d.tx.len(), 12, "{}", d.tx);
    // Endpoints emptied: element moved, 3 chains flushed.
    let d = step(&mut model, &mut rs, &[eps("ns3", "svc3", 80, &[])]);
    assert_eq!(d.tx.len(), 5, "{}", d.tx);
    assert_eq!(d.stale_chains.len(), 3);
    // Restored: element moved back, 3 chains rewritten.
    let d = step(&mut model, &mut rs, &[eps("ns3", "svc3", 80, &two)]);
    assert_eq!(d.tx.len(), 14, "{}", d.tx);
    // Nothing changed: nothing to send.
    let d = partial_sync(&rs.clone(), &rs);
    assert!(d.tx.is_empty() && d.stale_chains.is_empty());
}

#[test]
fn a_partial_sync_orders_objects_before_their_users() {
    let mut model = model_with(&repeated_events());
    let mut rs = desired(&model, &fake_ctx());
    let affinity = svc(
        "ns7",
        "svc7",
        json!({"type": "ClusterIP", "clusterIP": "172.30.0.47", "ports": [port(80, 0)], "sessionAffinity": "ClientIP"}),
        json!({}),
    );
    let d = step(&mut model, &mut rs, &[affinity, eps("ns7", "svc7", 80, &[no_node("10.0.7.1")])]);
    let text = d.tx.to_string();
    let pos = |pat: &str| text.find(pat).unwrap_or_else(|| panic!("{pat} not in\n{text}"));
    assert!(pos("add set ip kube-proxy affinity-") < pos("add chain ip kube-proxy endpoint-"));
    assert!(pos("add chain ip kube-proxy service-") < pos("add rule"));
    assert!(pos("add rule") < pos("add element"));
    assert!(text.contains("timeout 10800s"), "default affinity timeout:\n{text}");
    // The service goes: its chains flushed, its set deleted after them.
    let gone = from_json::<Service>(json!({"metadata": {"namespace": "ns7", "name": "svc7"}, "spec": {}}));
    let d = step(&mut model, &mut rs, &[deleted_service(gone)]);
    let text = d.tx.to_string();
    let pos = |pat: &str| text.find(pat).unwrap_or_else(|| panic!("{pat} not in\n{text}"));
    assert!(pos("flush chain ip kube-proxy endpoint-") < pos("delete set ip kube-proxy affinity-"));
}

#[test]
fn a_full_sync_from_the_kernel_resets_containers_and_flushes_stale_chains() {
    let rs = desired(&model_with(&repeated_events()), &fake_ctx());
    let kernel = KernelObjects {
        chains: vec!["services".into(), "service-OLD00000-ns9/gone/tcp/p80".into()],
        sets: vec!["affinity-OLD00000-ns9/gone/tcp/p80__10.9.9.9/80".into()],
    };
    let d = full_sync(&rs, &kernel, true);
    let text = d.tx.to_string();
    assert!(text.starts_with("add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n"));
    assert!(text.contains("add chain ip kube-proxy nat-prerouting\ndelete chain ip kube-proxy nat-prerouting\n"));
    assert!(text.contains("flush map ip kube-proxy service-ips\n"));
    assert!(text.contains("flush chain ip kube-proxy service-OLD00000-ns9/gone/tcp/p80\n"));
    assert!(text.ends_with("delete set ip kube-proxy affinity-OLD00000-ns9/gone/tcp/p80__10.9.9.9/80\n"));
    assert_eq!(d.stale_chains, ["service-OLD00000-ns9/gone/tcp/p80"]);
    // Match-all nodePortAddresses: the set goes (add, then delete) and the
    // dispatch matches local addresses but loopback.
    let ctx = NftablesContext { node_ports: NodePorts::All, ..fake_ctx() };
    let rs = desired(&model_with(&[]), &ctx);
    let dump = rs.dump();
    assert!(!dump.contains("nodeport-ips"));
    assert!(dump.contains(
        "add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n"
    ));
    assert!(dump.contains(
        "add rule ip kube-proxy nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports\n"
    ));
    let text = full_sync(&rs, &KernelObjects::default(), false).tx.to_string();
    assert!(text.ends_with("delete set ip kube-proxy nodeport-ips\n"), "{text}");
}

#[test]
fn masquerade_all_and_other_local_detectors() {
    let events = repeated_events();
    let ctx = NftablesContext { masquerade_all: true, ..fake_ctx() };
    let dump = dry_run(&model_with(&events), &ctx);
    assert!(dump.contains(
        "add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 tcp dport 80 jump mark-for-masquerade\n"
    ));
    let ctx = NftablesContext { local: LocalDetector::None, ..fake_ctx() };
    let dump = dry_run(&model_with(&events), &ctx);
    assert!(!dump.contains("ip daddr 172.30.0.41"), "{dump}");
    let ctx = NftablesContext { local: LocalDetector::InterfacePrefix("veth".into()), ..fake_ctx() };
    let dump = dry_run(&model_with(&events), &ctx);
    assert!(dump.contains("ip daddr 172.30.0.41 iif != veth* jump mark-for-masquerade"), "{dump}");
}

#[test]
fn ipv6_uses_ip6_matches_and_bracketed_dnat() {
    let m = v6_model(json!({}), &["fd00:10:180::1"]);
    let ctx = NftablesContext {
        family: IpFamily::V6,
        node_ip: Some(ip("2001:db8::1")),
        local: LocalDetector::Cidr("fd00:10::/64".parse().unwrap()),
        node_ports: NodePorts::All,
        service_cidrs: vec!["fd00:10:96::/112".parse().unwrap()],
        ..fake_ctx()
    };
    let dump = dry_run(&m, &ctx);
    for want in [
        "add table ip6 kube-proxy { comment \"rules for kube-proxy\" ; }",
        "add set ip6 kube-proxy cluster-ips { type ipv6_addr ; comment \"Active ClusterIPs\" ; }",
        "add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:10:96::/112 } drop comment \"Drop traffic to unallocated ClusterIPs\"",
        "add rule ip6 kube-proxy services fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports",
        "ip6 daddr fd00:172:30::41 ip6 saddr != fd00:10::/64 jump mark-for-masquerade",
        "meta l4proto tcp dnat to [fd00:10:180::1]:80",
        "add element ip6 kube-proxy service-nodeports { tcp . 3001 : goto external-",
    ] {
        assert!(dump.contains(want), "{want} not in\n{dump}");
    }
}

#[test]
fn local_policies_without_local_endpoints_are_counted_and_dropped() {
    let spec = json!({"type": "NodePort", "clusterIP": "172.30.1.1", "ports": [port(80, 3001)],
                      "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Local"});
    let events = [svc("ns1", "svc1", spec, json!({})), eps("ns1", "svc1", 80, &[remote("10.0.1.2")])];
    let model = model_with(&events);
    let spn =
        ServicePortName { service: NamespacedName::new("ns1", "svc1"), port: "p80".into(), protocol: Protocol::Tcp };
    let sp = model.service_port(&spn).unwrap();
    assert_eq!(service::no_local_endpoints(&fake_ctx(), sp, model.endpoints(&spn)), (true, true));
    let dump = dry_run(&model, &fake_ctx());
    assert!(dump.contains("no-endpoint-services { 172.30.1.1 . tcp . 80 comment \"ns1/svc1:p80\" : drop }"), "{dump}");
    assert!(dump.contains("no-endpoint-nodeports { tcp . 3001 comment \"ns1/svc1:p80\" : drop }"), "{dump}");
}

/// Ranges with leading zeros are read as upstream reads them; ranges that
/// all fail to parse give the load balancer IP a firewall chain that drops
/// every source.
#[test]
fn source_ranges_with_leading_zeros_apply_and_unparseable_ones_fail_closed() {
    let lb = |name: &str, ranges: Value, vip: &str| {
        let spec = json!({"type": "LoadBalancer", "clusterIP": "172.30.1.1", "ports": [port(80, 3001)],
                          "loadBalancerSourceRanges": ranges});
        [
            svc("ns", name, spec, json!({"loadBalancer": {"ingress": [{"ip": vip}]}})),
            eps("ns", name, 80, &[remote("10.0.1.2")]),
        ]
    };
    let mut events = lb("zeros", json!(["203.0.113.000/025"]), "5.6.7.8").to_vec();
    events.extend(lb("bogus", json!(["bogus", "10.0.0.0/33"]), "5.6.7.9"));
    events.extend(lb("blank", json!([" "]), "5.6.7.10"));
    let dump = dry_run(&model_with(&events), &fake_ctx());
    let firewall_rule = |name: &str| {
        let chain = format!("ns/{name}/tcp/p80 ");
        dump.lines()
            .find(|l| l.starts_with("add rule ip kube-proxy firewall-") && l.contains(&chain))
            .map(|l| l.split_once(&chain).map_or("", |(_, rule)| rule).to_string())
    };
    assert_eq!(firewall_rule("zeros").as_deref(), Some("ip saddr != { 203.0.113.0/25 } drop"), "{dump}");
    assert_eq!(firewall_rule("bogus").as_deref(), Some("drop"), "{dump}");
    assert_eq!(firewall_rule("blank"), None, "blank ranges restrict nothing, as upstream: {dump}");
    for vip in ["5.6.7.8", "5.6.7.9"] {
        let element = format!("add element ip kube-proxy firewall-ips {{ {vip} . tcp . 80 : goto firewall-");
        assert!(dump.contains(&element), "{element} not in\n{dump}");
    }
}

/// `mode: nftables` takes the `nftables:` section (masqueradeBit,
/// masqueradeAll, sync periods), not `iptables:`, and nodePortAddresses
/// defaults to the node's primary IP.
#[test]
fn the_nftables_config_section_shapes_the_ruleset() {
    use crate::config::KubeProxyConfiguration;
    use crate::plan::iptables::HostFeatures;
    use std::time::Duration;
    let mut cfg = KubeProxyConfiguration::with_defaults();
    cfg.mode = "nftables".into();
    cfg.cluster_cidr = "10.244.0.0/16".into();
    cfg.iptables.masquerade_bit = Some(3);
    cfg.iptables.masquerade_all = false;
    cfg.nftables.masquerade_bit = Some(10);
    cfg.nftables.masquerade_all = true;
    cfg.nftables.sync_period = Duration::from_secs(40).into();
    cfg.nftables.min_sync_period = Duration::from_secs(2).into();
    let s = crate::settings::derive(&cfg, IpFamily::V4, NODE, HostFeatures::default());
    assert_eq!((s.min_sync, s.max_sync), (Duration::from_secs(2), Duration::from_secs(40)));
    let node = crate::model::NodeInfo::from_node(&node(NODE, "192.168.0.2", "z1"));
    let addrs = [
        crate::net::LocalAddr { ifname: "lo".into(), ip: ip("127.0.0.1") },
        crate::net::LocalAddr { ifname: "eth0".into(), ip: ip("192.168.0.2") },
        crate::net::LocalAddr { ifname: "eth0".into(), ip: ip("192.168.1.2") },
    ];
    let ctx = nftables_context(&s.nftables_settings(&node, &[]), &node, &addrs);
    assert_eq!(ctx.mark.to_string(), "0x000400");
    assert!(ctx.masquerade_all);
    assert_eq!(ctx.local, LocalDetector::Cidr("10.244.0.0/16".parse().unwrap()));
    assert_eq!(ctx.node_ports, NodePorts::Ips(vec![ip("192.168.0.2")]));
    assert_eq!(ctx.zone, "z1");
    let dump = dry_run(&model_with(&repeated_events()), &ctx);
    assert!(dump.contains("add rule ip kube-proxy mark-for-masquerade mark set mark or 0x000400\n"), "{dump}");
    assert!(dump.contains("add element ip kube-proxy nodeport-ips { 192.168.0.2 }\n"), "{dump}");
}

#[test]
fn the_secondary_familys_section_is_named_after_it() {
    let text = "# nftables\nadd table ip6 kube-proxy { comment \"rules for kube-proxy\" ; }\n";
    assert_eq!(
        crate::dry_run::with_heading_suffix(text, " ipv6"),
        "# nftables ipv6\nadd table ip6 kube-proxy { comment \"rules for kube-proxy\" ; }\n"
    );
}

pub(super) fn deleted(ns: &str, name: &str) -> SourceEvent {
    deleted_service(from_json::<Service>(json!({"metadata": {"namespace": ns, "name": name}, "spec": {}})))
}

/// An IPv6 model: NodePort Service ns1/svc1 (its spec extended by `extra`)
/// with the endpoints `ips`, on no node.
pub(super) fn v6_model(extra: Value, ips: &[&str]) -> Model {
    let mut m = Model::new(IpFamily::V6, NODE);
    m.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
    m.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
    let mut spec = json!({"type": "NodePort", "clusterIP": "fd00:172:30::41", "ipFamilies": ["IPv6"],
                          "ports": [port(80, 3001)]});
    for (k, v) in extra.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    let endpoints: Vec<Ep> = ips.iter().map(|ip| no_node(ip)).collect();
    let mut sl = slice("ns1", "svc1-1", "svc1", &[("p80", "TCP", 80)], &endpoints);
    sl.address_type = "IPv6".into();
    m.record(&svc("ns1", "svc1", spec, json!({}))).unwrap();
    m.record(&applied_slice(sl)).unwrap();
    m.apply();
    m
}

pub(super) fn v6_ctx() -> NftablesContext {
    NftablesContext {
        family: IpFamily::V6,
        node_ip: Some(ip("2001:db8::1")),
        local: LocalDetector::Cidr("fd00:10::/64".parse().unwrap()),
        node_ports: NodePorts::All,
        service_cidrs: vec!["fd00:10:96::/112".parse().unwrap(), "fd00:10:97::/112".parse().unwrap()],
        ..fake_ctx()
    }
}
