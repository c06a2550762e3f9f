//! Upstream's packet-flow tests (pkg/proxy/nftables/proxier_test.go with
//! the tracer of helpers_test.go) through nftables mode's dataplane: the
//! same services sent to the coordinator, synced by the planner and the
//! nftables actor into the in-memory nf_tables, and the same packets traced
//! ([`crate::plan::nftables::trace`]) through what that kernel then holds,
//! with the same expected destinations and masquerading. Every test runs
//! against both rulesets (upstream's and `maps`).

use std::net::IpAddr;

use serde_json::json;

use super::nftables::start_nftables;
use super::*;
use crate::fixtures::{applied_slice, ep, slice, Ep};
use crate::kernel::mem::MemTable;
use crate::net::Protocol;
use crate::plan::local::LocalDetector;
use crate::plan::nftables::tests::{eps, fake_ctx, no_node, svc};
use crate::plan::nftables::trace::{trace, Packet};
use crate::plan::nftables::{NftRuleset, NftablesContext, NodePorts};

/// Upstream's testNodeIPs (IPv4 ones).
const NODE_IPS: [&str; 3] = ["192.168.0.2", "192.168.1.2", "192.168.99.11"];
const NODE: &str = "test-node";
const EXTERNAL_CLIENT: &str = "203.0.113.2";
const EXTERNAL_CLIENT_BLOCKED: &str = "203.0.113.130";

/// The tables the in-memory kernel holds once the coordinator synced
/// `events` on node `test-node` with the planner's context `ctx`, in each
/// ruleset.
fn synced_table(ctx: NftablesContext, events: &[SourceEvent]) -> Vec<(NftRuleset, MemTable)> {
    NftRuleset::ALL
        .into_iter()
        .map(|ruleset| (ruleset, synced_in(NftablesContext { ruleset, ..ctx.clone() }, events)))
        .collect()
}

fn synced_in(ctx: NftablesContext, events: &[SourceEvent]) -> MemTable {
    let mut all = synced();
    all.extend(events.iter().cloned());
    let sys = actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("tokio runtime")
    });
    sys.block_on(async move {
        let h = start_nftables(NODE, &MemNftables::default(), Box::new(move |_, _, _| ctx.clone()));
        h.send(all).await;
        sleep(MS).await;
        h.table()
    })
}

/// The table's rules, a chain at a time, for failure messages.
fn listing(table: &MemTable) -> String {
    let mut out = String::new();
    for (name, chain) in &table.chains {
        out.push_str(&format!("chain {name}\n"));
        chain.rules.iter().for_each(|r| out.push_str(&format!("\t{r}\n")));
    }
    out
}

/// (name, source, protocol, destination, port, output, masqueraded).
type Flow<'a> = (&'a str, &'a str, &'a str, &'a str, u16, &'a str, bool);

fn run_flows(tables: &[(NftRuleset, MemTable)], flows: &[Flow]) {
    run_case("", tables, flows);
}

/// [`run_flows`] for one of a test's cases, named in failures.
fn run_case(case: &str, tables: &[(NftRuleset, MemTable)], flows: &[Flow]) {
    for (ruleset, table) in tables {
        run_in(&format!("{ruleset} ruleset:{case}"), table, flows);
    }
}

fn run_in(case: &str, table: &MemTable, flows: &[Flow]) {
    let node_ips: Vec<IpAddr> = NODE_IPS.iter().map(|ip| ip.parse().expect("node IP")).collect();
    let mut failed = vec![];
    for (name, src, proto, dst, port, want, masq) in flows {
        let packet = Packet {
            src: src.parse().expect("source IP"),
            proto: Protocol::ALL.into_iter().find(|p| p.lower() == *proto).expect("protocol"),
            dst: dst.parse().expect("destination IP"),
            port: *port,
        };
        let got = trace(table, &node_ips, packet);
        if got != (want.to_string(), *masq) {
            failed.push(format!("{case} {name}: {src} -> {dst}:{port}/{proto}: got {got:?}, want ({want:?}, {masq})"));
        }
    }
    assert!(failed.is_empty(), "{}\n\n{}", failed.join("\n"), listing(table));
}

fn local(ip: &str) -> Ep {
    ep(ip, NODE)
}

/// Upstream's TestNoEndpointsReject.
#[test]
fn upstream_no_endpoints_reject() {
    let s = svc(
        "ns1",
        "svc1",
        json!({"type": "LoadBalancer", "clusterIP": "172.30.0.41", "externalIPs": ["192.168.99.11"],
               "ports": [{"name": "p80", "protocol": "TCP", "port": 80, "nodePort": 3001}]}),
        json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}),
    );
    let table = synced_table(fake_ctx(), &[s]);
    run_flows(
        &table,
        &[
            ("pod to cluster IP with no endpoints", "10.0.0.2", "tcp", "172.30.0.41", 80, "REJECT", false),
            ("external to external IP with no endpoints", EXTERNAL_CLIENT, "tcp", "192.168.99.11", 80, "REJECT", false),
            ("pod to NodePort with no endpoints", "10.0.0.2", "tcp", "192.168.0.2", 3001, "REJECT", false),
            ("external to NodePort with no endpoints", EXTERNAL_CLIENT, "tcp", "192.168.0.2", 3001, "REJECT", false),
            ("pod to LoadBalancer IP with no endpoints", "10.0.0.2", "tcp", "1.2.3.4", 80, "REJECT", false),
            ("external to LoadBalancer IP with no endpoints", EXTERNAL_CLIENT, "tcp", "1.2.3.4", 80, "REJECT", false),
        ],
    );
}

/// Upstream's TestClusterIPGeneral.
#[test]
fn upstream_cluster_ip_general() {
    let port = |name: &str, proto: &str, p: u16, target: u16| json!({"name": name, "protocol": proto, "port": p, "targetPort": target});
    let events = [
        svc("ns1", "svc1", json!({"clusterIP": "172.30.0.41", "ports": [port("http", "TCP", 80, 80)]}), json!({})),
        svc(
            "ns2",
            "svc2",
            json!({"clusterIP": "172.30.0.42", "ports": [
                port("http", "TCP", 80, 80), port("https", "TCP", 443, 8443), port("dns-udp", "UDP", 53, 53),
                port("dns-tcp", "TCP", 53, 5353), port("dns-sctp", "SCTP", 53, 53)]}),
            json!({}),
        ),
        applied_slice(slice("ns1", "svc1-1", "svc1", &[("http", "TCP", 80)], &[local("10.180.0.1")])),
        applied_slice(slice(
            "ns2",
            "svc2-1",
            "svc2",
            &[
                ("http", "TCP", 80),
                ("https", "TCP", 8443),
                ("dns-udp", "UDP", 53),
                ("dns-tcp", "TCP", 5353),
                ("dns-sctp", "SCTP", 53),
            ],
            &[local("10.180.0.1"), ep("10.180.2.1", "node2")],
        )),
    ];
    let table = synced_table(fake_ctx(), &events);
    run_flows(
        &table,
        &[
            ("simple clusterIP", "10.180.0.2", "tcp", "172.30.0.41", 80, "10.180.0.1:80", false),
            ("hairpin to cluster IP", "10.180.0.1", "tcp", "172.30.0.41", 80, "10.180.0.1:80", true),
            (
                "clusterIP with multiple endpoints",
                "10.180.0.2",
                "tcp",
                "172.30.0.42",
                80,
                "10.180.0.1:80, 10.180.2.1:80",
                false,
            ),
            (
                "clusterIP with TargetPort",
                "10.180.0.2",
                "tcp",
                "172.30.0.42",
                443,
                "10.180.0.1:8443, 10.180.2.1:8443",
                false,
            ),
            ("same port (TCP)", "10.180.0.2", "tcp", "172.30.0.42", 53, "10.180.0.1:5353, 10.180.2.1:5353", false),
            ("same port (UDP)", "10.180.0.2", "udp", "172.30.0.42", 53, "10.180.0.1:53, 10.180.2.1:53", false),
            ("same port (SCTP)", "10.180.0.2", "sctp", "172.30.0.42", 53, "10.180.0.1:53, 10.180.2.1:53", false),
            ("TCP-only port does not match UDP traffic", "10.180.0.2", "udp", "172.30.0.42", 80, "REJECT", false),
            ("svc1 does not accept svc2's ports", "10.180.0.2", "tcp", "172.30.0.41", 443, "REJECT", false),
            ("packet to unallocated cluster ip", "10.180.0.2", "tcp", "172.30.0.50", 80, "DROP", false),
        ],
    );
}

/// Upstream's TestLoadBalancer.
#[test]
fn upstream_load_balancer() {
    let s = svc(
        "ns1",
        "svc1",
        json!({"type": "LoadBalancer", "clusterIP": "172.30.0.41",
               "ports": [{"name": "p80", "protocol": "TCP", "port": 80, "targetPort": 80, "nodePort": 3001}],
               "loadBalancerSourceRanges": ["192.168.0.0/24", " 203.0.113.0/25"]}),
        json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}, {"ip": "5.6.7.8"}]}}),
    );
    let table = synced_table(fake_ctx(), &[s, eps("ns1", "svc1", 80, &[no_node("10.180.0.1")])]);
    let ep = "10.180.0.1:80";
    run_flows(
        &table,
        &[
            ("pod to cluster IP", "10.0.0.2", "tcp", "172.30.0.41", 80, ep, false),
            ("external to nodePort", EXTERNAL_CLIENT, "tcp", "192.168.0.2", 3001, ep, true),
            (
                "nodePort bypasses LoadBalancerSourceRanges",
                EXTERNAL_CLIENT_BLOCKED,
                "tcp",
                "192.168.0.2",
                3001,
                ep,
                true,
            ),
            ("accepted external to LB1", EXTERNAL_CLIENT, "tcp", "1.2.3.4", 80, ep, true),
            ("accepted external to LB2", EXTERNAL_CLIENT, "tcp", "5.6.7.8", 80, ep, true),
            ("blocked external to LB1", EXTERNAL_CLIENT_BLOCKED, "tcp", "1.2.3.4", 80, "DROP", false),
            ("blocked external to LB2", EXTERNAL_CLIENT_BLOCKED, "tcp", "5.6.7.8", 80, "DROP", false),
            ("pod to LB1 (blocked by LoadBalancerSourceRanges)", "10.0.0.2", "tcp", "1.2.3.4", 80, "DROP", false),
            ("pod to LB2 (blocked by LoadBalancerSourceRanges)", "10.0.0.2", "tcp", "5.6.7.8", 80, "DROP", false),
            ("node to LB1 (allowed by LoadBalancerSourceRanges)", "192.168.0.2", "tcp", "1.2.3.4", 80, ep, true),
            ("node to LB2 (allowed by LoadBalancerSourceRanges)", "192.168.0.2", "tcp", "5.6.7.8", 80, ep, true),
            ("same node to LB1, SNATted to LB1 (implicitly allowed)", "1.2.3.4", "tcp", "1.2.3.4", 80, ep, true),
            ("same node to LB2, SNATted to LB2 (implicitly allowed)", "5.6.7.8", "tcp", "5.6.7.8", 80, ep, true),
        ],
    );
}

fn lb_service(policy: &str) -> Vec<crate::msgs::SourceEvent> {
    let s = svc(
        "ns1",
        "svc1",
        json!({"type": "LoadBalancer", "clusterIP": "172.30.0.41", "externalIPs": ["192.168.99.11"],
               "externalTrafficPolicy": policy, "healthCheckNodePort": 30000,
               "ports": [{"name": "p80", "protocol": "TCP", "port": 80, "targetPort": 80, "nodePort": 3001}]}),
        json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}),
    );
    vec![s, eps("ns1", "svc1", 80, &[no_node("10.180.0.1"), local("10.180.2.1")])]
}

/// Upstream's TestExternalTrafficPolicyLocal.
#[test]
fn upstream_external_traffic_policy_local() {
    let table = synced_table(fake_ctx(), &lb_service("Local"));
    let (both, one) = ("10.180.0.1:80, 10.180.2.1:80", "10.180.2.1:80");
    run_flows(
        &table,
        &[
            ("pod to cluster IP hits both endpoints, unmasqueraded", "10.0.0.2", "tcp", "172.30.0.41", 80, both, false),
            (
                "pod to external IP hits both endpoints, unmasqueraded",
                "10.0.0.2",
                "tcp",
                "192.168.99.11",
                80,
                both,
                false,
            ),
            (
                "external to external IP hits only local endpoint",
                EXTERNAL_CLIENT,
                "tcp",
                "192.168.99.11",
                80,
                one,
                false,
            ),
            ("pod to LB IP hits only both endpoints, unmasqueraded", "10.0.0.2", "tcp", "1.2.3.4", 80, both, false),
            (
                "external to LB IP hits only local endpoint, unmasqueraded",
                EXTERNAL_CLIENT,
                "tcp",
                "1.2.3.4",
                80,
                one,
                false,
            ),
            ("pod to NodePort hits both endpoints, unmasqueraded", "10.0.0.2", "tcp", "192.168.0.2", 3001, both, false),
            ("external to NodePort hits only local endpoint", EXTERNAL_CLIENT, "tcp", "192.168.0.2", 3001, one, false),
        ],
    );
}

/// Upstream's TestExternalTrafficPolicyCluster.
#[test]
fn upstream_external_traffic_policy_cluster() {
    let table = synced_table(fake_ctx(), &lb_service("Cluster"));
    let both = "10.180.0.1:80, 10.180.2.1:80";
    run_flows(
        &table,
        &[
            ("pod to cluster IP hits both endpoints, unmasqueraded", "10.0.0.2", "tcp", "172.30.0.41", 80, both, false),
            ("pod to external IP hits both endpoints, masqueraded", "10.0.0.2", "tcp", "192.168.99.11", 80, both, true),
            (
                "external to external IP hits both endpoints, masqueraded",
                EXTERNAL_CLIENT,
                "tcp",
                "192.168.99.11",
                80,
                both,
                true,
            ),
            ("pod to LB IP hits both endpoints, masqueraded", "10.0.0.2", "tcp", "1.2.3.4", 80, both, true),
            ("external to LB IP hits both endpoints, masqueraded", EXTERNAL_CLIENT, "tcp", "1.2.3.4", 80, both, true),
            ("pod to NodePort hits both endpoints, masqueraded", "10.0.0.2", "tcp", "192.168.0.2", 3001, both, true),
            (
                "external to NodePort hits both endpoints, masqueraded",
                EXTERNAL_CLIENT,
                "tcp",
                "192.168.0.2",
                3001,
                both,
                true,
            ),
        ],
    );
}

/// Upstream's TestNodePorts (IPv4): the node IP accepts NodePorts, the
/// secondary IP only when nodePortAddresses names it.
#[test]
fn upstream_node_ports() {
    let s = svc(
        "ns1",
        "svc1",
        json!({"type": "NodePort", "clusterIP": "172.30.0.41",
               "ports": [{"name": "p80", "protocol": "TCP", "port": 80, "targetPort": 80, "nodePort": 3001}]}),
        json!({}),
    );
    let events = [s, eps("ns1", "svc1", 80, &[no_node("10.180.0.1"), local("10.180.2.1")])];
    let both = "10.180.0.1:80, 10.180.2.1:80";
    for (node_ports, alt) in [
        (NodePorts::Ips(vec!["192.168.0.2".parse().unwrap()]), ""),
        (NodePorts::Ips(vec!["192.168.0.2".parse().unwrap(), "192.168.1.2".parse().unwrap()]), both),
    ] {
        let ctx = NftablesContext { node_ports, ..fake_ctx() };
        let table = synced_table(ctx, &events);
        run_flows(
            &table,
            &[
                ("pod to cluster IP", "10.0.0.2", "tcp", "172.30.0.41", 80, both, false),
                ("external to nodePort", EXTERNAL_CLIENT, "tcp", "192.168.0.2", 3001, both, true),
                ("node to nodePort", "192.168.0.2", "tcp", "192.168.0.2", 3001, both, true),
                (
                    "external to nodePort on secondary IP",
                    EXTERNAL_CLIENT,
                    "tcp",
                    "192.168.1.2",
                    3001,
                    alt,
                    !alt.is_empty(),
                ),
            ],
        );
    }
}

/// Upstream's terminating-endpoints flow test: ready endpoints win, else
/// serving terminating ones (local or remote), else REJECT; and REJECT
/// once the slice is gone.
#[test]
fn upstream_terminating_endpoints() {
    let service = || {
        svc(
            "ns1",
            "svc1",
            json!({"type": "LoadBalancer", "clusterIP": "172.30.1.1", "externalTrafficPolicy": "Cluster",
                   "healthCheckNodePort": 30000, "ports": [{"name": "", "protocol": "TCP", "port": 80, "targetPort": 80}]}),
            json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}),
        )
    };
    let gone = |ip: &str, node: &str| Ep { serving: Some(false), ..ep(ip, node).terminating() };
    let cases: [(&str, Vec<Ep>, &str); 4] = [
        (
            "ready endpoints exist",
            vec![
                local("10.0.1.1"),
                local("10.0.1.2"),
                ep("10.0.1.3", "another-node").terminating(),
                gone("10.0.1.4", "another-node"),
                ep("10.0.1.5", "another-node"),
            ],
            "10.0.1.1:80, 10.0.1.2:80, 10.0.1.5:80",
        ),
        (
            "only terminating endpoints exist",
            vec![
                local("10.0.1.2").terminating(),
                local("10.0.1.3").terminating(),
                gone("10.0.1.4", "another-node"),
                ep("10.0.1.5", "another-node").terminating(),
            ],
            "10.0.1.2:80, 10.0.1.3:80, 10.0.1.5:80",
        ),
        ("terminating endpoints on remote node", vec![ep("10.0.1.5", "node-1").terminating()], "10.0.1.5:80"),
        ("no usable endpoints on any node", vec![gone("10.0.1.5", NODE), gone("10.0.1.5", "node-1")], "REJECT"),
    ];
    for (name, endpoints, want) in cases {
        let slice = applied_slice(slice("ns1", "svc1-1", "svc1", &[("", "TCP", 80)], &endpoints));
        let table = synced_table(fake_ctx(), &[service(), slice]);
        let masq = want != "REJECT";
        run_flows(
            &table,
            &[
                (name, "10.0.0.2", "tcp", "172.30.1.1", 80, want, false),
                (name, EXTERNAL_CLIENT, "tcp", "1.2.3.4", 80, want, masq),
            ],
        );
        let table = synced_table(fake_ctx(), &[service()]);
        run_flows(
            &table,
            &[
                ("pod to clusterIP after endpoints deleted", "10.0.0.2", "tcp", "172.30.1.1", 80, "REJECT", false),
                ("external to LB after endpoints deleted", EXTERNAL_CLIENT, "tcp", "1.2.3.4", 80, "REJECT", false),
            ],
        );
    }
}

/// (name, masqueradeAll, local detector, flows whose masq flips, flows
/// reaching the local eTP endpoint only).
type Case<'a> = (&'a str, bool, bool, Vec<&'a str>, Vec<&'a str>);

/// Upstream's TestInternalExternalMasquerade: three LoadBalancers (Cluster,
/// eTP Local, iTP Local), 27 packets, with and without a local-traffic
/// detector and masqueradeAll.
#[test]
fn upstream_internal_external_masquerade() {
    let lb = |ns: &str, cip: &str, np: u16, extra: serde_json::Value, ingress: &str| {
        let mut spec = json!({"type": "LoadBalancer", "clusterIP": cip,
            "ports": [{"name": "p80", "protocol": "TCP", "port": 80, "nodePort": np}]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            spec[k] = v.clone();
        }
        let name = ns.replace("ns", "svc");
        svc(ns, &name, spec, json!({"loadBalancer": {"ingress": [{"ip": ingress}]}}))
    };
    let events = [
        lb("ns1", "172.30.0.41", 3001, json!({"healthCheckNodePort": 30001}), "1.2.3.4"),
        lb(
            "ns2",
            "172.30.0.42",
            3002,
            json!({"healthCheckNodePort": 30002, "externalTrafficPolicy": "Local"}),
            "5.6.7.8",
        ),
        lb(
            "ns3",
            "172.30.0.43",
            3003,
            json!({"healthCheckNodePort": 30003, "internalTrafficPolicy": "Local"}),
            "9.10.11.12",
        ),
        eps("ns1", "svc1", 80, &[local("10.180.0.1"), ep("10.180.1.1", "remote")]),
        eps("ns2", "svc2", 80, &[local("10.180.0.2"), ep("10.180.1.2", "remote")]),
        eps("ns3", "svc3", 80, &[local("10.180.0.3"), ep("10.180.1.3", "remote")]),
    ];
    let (n, pod, ext) = ("192.168.0.2", "10.0.0.2", EXTERNAL_CLIENT);
    let (a1, a2, a3) = ("10.180.0.1:80, 10.180.1.1:80", "10.180.0.2:80, 10.180.1.2:80", "10.180.0.3:80, 10.180.1.3:80");
    let (l2, l3) = ("10.180.0.2:80", "10.180.0.3:80");
    let flows: Vec<Flow> = vec![
        ("pod to ClusterIP", pod, "tcp", "172.30.0.41", 80, a1, false),
        ("pod to NodePort", pod, "tcp", n, 3001, a1, true),
        ("pod to LB", pod, "tcp", "1.2.3.4", 80, a1, true),
        ("node to ClusterIP", n, "tcp", "172.30.0.41", 80, a1, true),
        ("node to NodePort", n, "tcp", n, 3001, a1, true),
        ("node to LB", n, "tcp", "1.2.3.4", 80, a1, true),
        ("external to ClusterIP", ext, "tcp", "172.30.0.41", 80, a1, true),
        ("external to NodePort", ext, "tcp", n, 3001, a1, true),
        ("external to LB", ext, "tcp", "1.2.3.4", 80, a1, true),
        ("pod to ClusterIP with eTP:Local", pod, "tcp", "172.30.0.42", 80, a2, false),
        ("pod to NodePort with eTP:Local", pod, "tcp", n, 3002, a2, false),
        ("pod to LB with eTP:Local", pod, "tcp", "5.6.7.8", 80, a2, false),
        ("node to ClusterIP with eTP:Local", n, "tcp", "172.30.0.42", 80, a2, true),
        ("node to NodePort with eTP:Local", n, "tcp", n, 3001, a1, true),
        ("node to LB with eTP:Local", n, "tcp", "5.6.7.8", 80, a2, true),
        ("external to ClusterIP with eTP:Local", ext, "tcp", "172.30.0.42", 80, a2, true),
        ("external to NodePort with eTP:Local", ext, "tcp", n, 3002, l2, false),
        ("external to LB with eTP:Local", ext, "tcp", "5.6.7.8", 80, l2, false),
        ("pod to ClusterIP with iTP:Local", pod, "tcp", "172.30.0.43", 80, l3, false),
        ("pod to NodePort with iTP:Local", pod, "tcp", n, 3003, a3, true),
        ("pod to LB with iTP:Local", pod, "tcp", "9.10.11.12", 80, a3, true),
        ("node to ClusterIP with iTP:Local", n, "tcp", "172.30.0.43", 80, l3, true),
        ("node to NodePort with iTP:Local", n, "tcp", n, 3003, a3, true),
        ("node to LB with iTP:Local", n, "tcp", "9.10.11.12", 80, a3, true),
        ("external to ClusterIP with iTP:Local", ext, "tcp", "172.30.0.43", 80, l3, true),
        ("external to NodePort with iTP:Local", ext, "tcp", n, 3003, a3, true),
        ("external to LB with iTP:Local", ext, "tcp", "9.10.11.12", 80, a3, true),
    ];
    // Upstream's overrides per case: (masqueradeAll, detector, masq overrides, output overrides).
    let no_detector_masq = [
        "node to ClusterIP",
        "node to ClusterIP with eTP:Local",
        "node to ClusterIP with iTP:Local",
        "external to ClusterIP",
        "external to ClusterIP with eTP:Local",
        "external to ClusterIP with iTP:Local",
    ];
    let pods_to_cluster_ip = ["pod to ClusterIP", "pod to ClusterIP with eTP:Local", "pod to ClusterIP with iTP:Local"];
    let pods_to_etp = ["pod to NodePort with eTP:Local", "pod to LB with eTP:Local"];
    let cases: [Case; 4] = [
        ("base", false, true, vec![], vec![]),
        ("no LocalTrafficDetector", false, false, no_detector_masq.to_vec(), pods_to_etp.to_vec()),
        ("masqueradeAll", true, true, pods_to_cluster_ip.to_vec(), vec![]),
        ("masqueradeAll, no LocalTrafficDetector", true, false, pods_to_cluster_ip.to_vec(), pods_to_etp.to_vec()),
    ];
    for (case, masquerade_all, detector, flip_masq, local_only) in cases {
        let local = if detector { fake_ctx().local } else { LocalDetector::None };
        let ctx = NftablesContext { masquerade_all, local, ..fake_ctx() };
        let table = synced_table(ctx, &events);
        let case_flows: Vec<Flow> = flows
            .iter()
            .map(|f| {
                let mut f = *f;
                if flip_masq.contains(&f.0) {
                    f.6 = !f.6;
                }
                if local_only.contains(&f.0) {
                    f.5 = l2;
                }
                f
            })
            .collect();
        run_case(case, &table, &case_flows);
    }
}
