use std::collections::BTreeSet;
use std::net::IpAddr;

use super::*;
use crate::fixtures::*;
use crate::model::{Model, ServicePortName};
use crate::msgs::{ResourceKind, SourceEvent};
use crate::net::{IpFamily, Protocol};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ctx() -> PlanContext {
    PlanContext {
        family: IpFamily::V4,
        scheduler: "rr".into(),
        node_name: "node-a".into(),
        zone: String::new(),
        node_port_ips: vec![ip("192.168.50.2")],
        node_addresses: [ip("192.168.50.2"), ip("127.0.0.1")].into(),
        node_ip: Some(ip("192.168.50.2")),
    }
}

fn model_with(events: Vec<SourceEvent>) -> Model {
    let mut m = Model::new(IpFamily::V4, "node-a");
    m.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
    m.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
    for e in &events {
        m.record(e).unwrap();
    }
    m.apply();
    m
}

fn all_ports(m: &Model) -> Vec<ServicePortName> {
    m.service_ports().map(|sp| sp.name.clone()).collect()
}

fn lines(d: &IpvsDeltas) -> Vec<String> {
    let mut out: Vec<String> = d.ipvs.iter().map(|o| o.to_string()).collect();
    for (set, ops) in &d.sets {
        for op in ops {
            out.push(crate::msgs::ipset::SetLine(set.base_name(), op).to_string());
        }
    }
    out.extend(d.link.iter().map(|l| l.to_string()));
    out
}

fn web() -> Vec<SourceEvent> {
    vec![
        applied_service(service("default", "web", "10.96.0.20", &[("http", "TCP", 80, 0)])),
        applied_slice(slice(
            "default",
            "web-1",
            "web",
            &[("http", "TCP", 8080)],
            &[ep("10.244.0.5", "node-a"), ep("10.244.1.5", "node-b")],
        )),
    ]
}

#[test]
fn cluster_ip_service_gets_vs_dests_entries_and_address() {
    let m = model_with(web());
    let mut p = IpvsPlanner::new(ctx());
    let d = p.update(&m, &all_ports(&m));
    assert_eq!(
        lines(&d),
        vec![
            "-A -t 10.96.0.20:80 -s rr",
            "-a -t 10.96.0.20:80 -r 10.244.0.5:8080 -m -w 1",
            "-a -t 10.96.0.20:80 -r 10.244.1.5:8080 -m -w 1",
            "add KUBE-LOOP-BACK 10.244.0.5,tcp:8080,10.244.0.5",
            "add KUBE-CLUSTER-IP 10.96.0.20,tcp:80",
            "add KUBE-IPVS-IPS 10.96.0.20",
            "bind 10.96.0.20 dev kube-ipvs0",
        ]
    );
    // Planning the same model again changes nothing.
    assert!(p.update(&m, &all_ports(&m)).is_empty());
}

#[test]
fn deleting_a_service_removes_everything_it_claimed() {
    let mut m = model_with(web());
    let mut p = IpvsPlanner::new(ctx());
    p.update(&m, &all_ports(&m));
    m.record(&deleted_service(service("default", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]))).unwrap();
    let ch = m.apply();
    let d = p.update(&m, &ch.ports);
    assert_eq!(
        lines(&d),
        vec![
            "-d -t 10.96.0.20:80 -r 10.244.0.5:8080",
            "-d -t 10.96.0.20:80 -r 10.244.1.5:8080",
            "-D -t 10.96.0.20:80",
            "del KUBE-LOOP-BACK 10.244.0.5,tcp:8080,10.244.0.5",
            "del KUBE-CLUSTER-IP 10.96.0.20,tcp:80",
            "del KUBE-IPVS-IPS 10.96.0.20",
            "unbind 10.96.0.20 dev kube-ipvs0",
        ]
    );
    assert_eq!(p.sizes(), (0, 0, 0, 0));
}

#[test]
fn shared_cluster_ip_stays_bound_until_its_last_port_goes() {
    let dns = service("kube-system", "dns", "10.96.0.10", &[("dns", "UDP", 53, 0), ("dns-tcp", "TCP", 53, 0)]);
    let mut m = model_with(vec![applied_service(dns)]);
    let mut p = IpvsPlanner::new(ctx());
    p.update(&m, &all_ports(&m));
    m.record(&applied_service(service("kube-system", "dns", "10.96.0.10", &[("dns-tcp", "TCP", 53, 0)]))).unwrap();
    let ch = m.apply();
    let d = p.update(&m, &ch.ports);
    assert_eq!(lines(&d), vec!["-D -u 10.96.0.10:53", "del KUBE-CLUSTER-IP 10.96.0.10,udp:53"]);
}

#[test]
fn node_port_gets_a_vs_per_node_ip_and_a_port_entry() {
    let m = model_with(vec![applied_service(service("ns", "np", "10.96.0.30", &[("http", "TCP", 80, 30080)]))]);
    let mut p = IpvsPlanner::new(ctx());
    let l = lines(&p.update(&m, &all_ports(&m)));
    assert!(l.contains(&"-A -t 192.168.50.2:30080 -s rr".to_string()), "{l:?}");
    assert!(l.contains(&"add KUBE-NODE-PORT-TCP 30080".to_string()), "{l:?}");
    assert!(!l.iter().any(|x| x.contains("LOCAL")), "{l:?}");
}

#[test]
fn load_balancer_with_source_ranges_and_local_policy() {
    let mut s = service("ns", "lb", "10.96.0.40", &[("http", "TCP", 80, 30081)]);
    let spec = s.spec.as_mut().unwrap();
    spec.type_ = Some("LoadBalancer".into());
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(32000);
    spec.load_balancer_source_ranges = Some(vec!["192.168.50.0/24".into()]);
    s.status = Some(from_json(serde_json::json!({"loadBalancer": {"ingress": [{"ip": "192.168.60.10"}]}})));
    let sl =
        slice("ns", "lb-1", "lb", &[("http", "TCP", 8080)], &[ep("10.244.0.7", "node-a"), ep("10.244.1.7", "node-b")]);
    let m = model_with(vec![applied_service(s), applied_slice(sl)]);
    let mut p = IpvsPlanner::new(ctx());
    let l: BTreeSet<String> = lines(&p.update(&m, &all_ports(&m))).into_iter().collect();
    for want in [
        "-A -t 192.168.60.10:80 -s rr",
        "-a -t 192.168.60.10:80 -r 10.244.0.7:8080 -m -w 1",
        "-a -t 10.96.0.40:80 -r 10.244.1.7:8080 -m -w 1",
        "-a -t 192.168.50.2:30081 -r 10.244.0.7:8080 -m -w 1",
        "add KUBE-LOAD-BALANCER 192.168.60.10,tcp:80",
        "add KUBE-LOAD-BALANCER-LOCAL 192.168.60.10,tcp:80",
        "add KUBE-LOAD-BALANCER-FW 192.168.60.10,tcp:80",
        "add KUBE-LOAD-BALANCER-SOURCE-CIDR 192.168.60.10,tcp:80,192.168.50.0/24",
        "add KUBE-LOAD-BALANCER-SOURCE-IP 192.168.60.10,tcp:80,192.168.60.10",
        "add KUBE-NODE-PORT-LOCAL-TCP 30081",
        "add KUBE-HEALTH-CHECK-NODE-PORT 32000",
        "bind 192.168.60.10 dev kube-ipvs0",
    ] {
        assert!(l.contains(want), "missing {want:?} in {l:#?}");
    }
    // External traffic (LB, NodePort) only goes to the local endpoint.
    assert!(!l.contains("-a -t 192.168.60.10:80 -r 10.244.1.7:8080 -m -w 1"));
    assert!(!l.contains("-a -t 192.168.50.2:30081 -r 10.244.1.7:8080 -m -w 1"));
}

/// Source ranges that all fail to parse put the VIP in KUBE-LOAD-BALANCER-FW
/// with no source to accept (KUBE-FIREWALL then drops every packet); one
/// with leading zeros is read as upstream reads it.
#[test]
fn unparseable_source_ranges_fail_closed_and_leading_zeros_parse() {
    for (ranges, sources) in [(vec!["bogus"], vec![]), (vec!["192.168.050.000/024"], vec!["192.168.50.0/24"])] {
        let mut s = service("ns", "lb", "10.96.0.40", &[("http", "TCP", 80, 30081)]);
        let spec = s.spec.as_mut().unwrap();
        spec.type_ = Some("LoadBalancer".into());
        spec.load_balancer_source_ranges = Some(ranges.iter().map(|r| r.to_string()).collect());
        s.status = Some(from_json(serde_json::json!({"loadBalancer": {"ingress": [{"ip": "192.168.60.10"}]}})));
        let m = model_with(vec![applied_service(s)]);
        let mut p = IpvsPlanner::new(ctx());
        let l = lines(&p.update(&m, &all_ports(&m)));
        assert!(l.contains(&"add KUBE-LOAD-BALANCER-FW 192.168.60.10,tcp:80".to_string()), "{ranges:?}: {l:#?}");
        let accepted: Vec<&str> = l
            .iter()
            .filter_map(|x| x.strip_prefix("add KUBE-LOAD-BALANCER-SOURCE-CIDR 192.168.60.10,tcp:80,"))
            .collect();
        assert_eq!(accepted, sources, "{l:#?}");
    }
}

#[test]
fn external_ip_on_a_node_address_is_not_bound() {
    let mut s = service("ns", "ext", "10.96.0.50", &[("http", "TCP", 80, 0)]);
    s.spec.as_mut().unwrap().external_ips = Some(vec!["192.168.50.2".into(), "192.168.60.20".into()]);
    let m = model_with(vec![applied_service(s)]);
    let mut p = IpvsPlanner::new(ctx());
    let l = lines(&p.update(&m, &all_ports(&m)));
    assert!(l.contains(&"bind 192.168.60.20 dev kube-ipvs0".to_string()));
    assert!(!l.contains(&"bind 192.168.50.2 dev kube-ipvs0".to_string()));
    assert!(l.contains(&"add KUBE-EXTERNAL-IP 192.168.50.2,tcp:80".to_string()));
    assert!(l.contains(&"-A -t 192.168.50.2:80 -s rr".to_string()));
}

#[test]
fn client_ip_affinity_sets_persistence() {
    let mut s = service("ns", "sticky", "10.96.0.60", &[("http", "TCP", 80, 0)]);
    let spec = s.spec.as_mut().unwrap();
    spec.session_affinity = Some("ClientIP".into());
    spec.session_affinity_config = Some(from_json(serde_json::json!({"clientIP": {"timeoutSeconds": 600}})));
    let m = model_with(vec![applied_service(s)]);
    let mut p = IpvsPlanner::new(ctx());
    assert_eq!(lines(&p.update(&m, &all_ports(&m)))[0], "-A -t 10.96.0.60:80 -s rr -p 600");
}

/// The proportionality requirement: one endpoint added to one of
/// 10,000 services is one real-server add (plus the set entries it implies).
#[test]
fn one_endpoint_added_among_10000_services_is_one_dest_add() {
    let mut events = Vec::new();
    for i in 0..10_000u32 {
        let name = format!("svc-{i}");
        let cip = format!("10.{}.{}.{}", 96 + i / 65536, (i / 256) % 256, i % 256);
        events.push(applied_service(service("ns", &name, &cip, &[("http", "TCP", 80, 0)])));
        let eps = [ep(&format!("10.244.{}.{}", i / 256 % 256, i % 256), "node-b")];
        events.push(applied_slice(slice("ns", &format!("{name}-1"), &name, &[("http", "TCP", 8080)], &eps)));
    }
    let mut m = model_with(events);
    let mut p = IpvsPlanner::new(ctx());
    let cold = p.update(&m, &all_ports(&m));
    assert_eq!(cold.ipvs.len(), 20_000);

    let remote = [ep("10.244.16.146", "node-b"), ep("10.250.0.1", "node-b")];
    m.record(&applied_slice(slice("ns", "svc-4242-1", "svc-4242", &[("http", "TCP", 8080)], &remote))).unwrap();
    let ch = m.apply();
    assert_eq!(ch.ports.len(), 1);
    let d = p.update(&m, &ch.ports);
    assert_eq!(lines(&d), vec!["-a -t 10.96.16.146:80 -r 10.250.0.1:8080 -m -w 1"]);

    // A local endpoint also implies its KUBE-LOOP-BACK entry, nothing more.
    let local = [ep("10.244.16.146", "node-b"), ep("10.250.0.1", "node-b"), ep("10.244.0.9", "node-a")];
    m.record(&applied_slice(slice("ns", "svc-4242-1", "svc-4242", &[("http", "TCP", 8080)], &local))).unwrap();
    let ch = m.apply();
    let d = p.update(&m, &ch.ports);
    assert_eq!(
        lines(&d),
        vec!["-a -t 10.96.16.146:80 -r 10.244.0.9:8080 -m -w 1", "add KUBE-LOOP-BACK 10.244.0.9,tcp:8080,10.244.0.9"]
    );
}

#[test]
fn replan_all_with_new_node_ips_moves_only_node_port_servers() {
    let m = model_with(vec![
        applied_service(service("ns", "np", "10.96.0.30", &[("http", "TCP", 80, 30080)])),
        applied_service(service("ns", "c", "10.96.0.31", &[("http", "TCP", 80, 0)])),
    ]);
    let mut p = IpvsPlanner::new(ctx());
    p.update(&m, &all_ports(&m));
    let mut c = ctx();
    c.node_port_ips = vec![ip("192.168.50.3")];
    let l = lines(&p.replan_all(&m, c));
    assert_eq!(l, vec!["-A -t 192.168.50.3:30080 -s rr", "-D -t 192.168.50.2:30080"]);
}

#[test]
fn desired_state_lists_every_set_even_empty_ones() {
    let m = model_with(web());
    let mut p = IpvsPlanner::new(ctx());
    p.update(&m, &all_ports(&m));
    let d = p.desired();
    assert_eq!(d.sets.len(), IpvsSet::ALL.len());
    assert_eq!(d.addresses, vec![ip("10.96.0.20")]);
    assert_eq!(d.ipvs.len(), 3);
    assert!(p.set_has_members(IpvsSet::ClusterIp));
    assert!(!p.set_has_members(IpvsSet::NodePortTcp));
}

#[test]
fn local_policy_without_local_endpoints_falls_back_to_cluster_endpoints() {
    let mut s = service("ns", "np", "10.96.0.70", &[("http", "TCP", 80, 30070)]);
    s.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
    let sl = slice("ns", "np-1", "np", &[("http", "TCP", 8080)], &[ep("10.244.1.7", "node-b")]);
    let m = model_with(vec![applied_service(s), applied_slice(sl)]);
    let mut p = IpvsPlanner::new(ctx());
    let l = lines(&p.update(&m, &all_ports(&m)));
    assert!(l.contains(&"-a -t 192.168.50.2:30070 -r 10.244.1.7:8080 -m -w 1".to_string()), "{l:?}");
    assert!(l.contains(&"add KUBE-NODE-PORT-LOCAL-TCP 30070".to_string()), "{l:?}");
}

#[test]
fn replan_all_with_the_same_context_moves_nothing_and_the_plan_still_follows() {
    let mut m = model_with(web());
    let mut p = IpvsPlanner::new(ctx());
    p.update(&m, &all_ports(&m));
    assert!(p.replan_all(&m, ctx()).is_empty());
    let one_left = slice("default", "web-1", "web", &[("http", "TCP", 8080)], &[ep("10.244.0.5", "node-a")]);
    m.record(&applied_slice(one_left)).unwrap();
    let ch = m.apply();
    assert_eq!(lines(&p.update(&m, &ch.ports)), vec!["-d -t 10.96.0.20:80 -r 10.244.1.5:8080"]);
}

#[test]
fn a_new_scheduler_edits_every_virtual_server_and_later_plans_start_from_it() {
    let mut m = model_with(web());
    let mut p = IpvsPlanner::new(ctx());
    p.update(&m, &all_ports(&m));
    let mut c = ctx();
    c.scheduler = "lc".into();
    assert_eq!(lines(&p.replan_all(&m, c)), vec!["-E -t 10.96.0.20:80 -s lc"]);
    // What the port claims is now what it was planned with under the new context.
    m.record(&deleted_service(service("default", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]))).unwrap();
    let ch = m.apply();
    let l = lines(&p.update(&m, &ch.ports));
    assert!(l.contains(&"-D -t 10.96.0.20:80".to_string()), "{l:?}");
    assert_eq!(p.sizes(), (0, 0, 0, 0));
}

/// Two LoadBalancer Services `a` and `b` (b with ClientIP affinity) on one
/// VIP and port and on `node_port` (0: none), their endpoints overlapping
/// in one; and their port names.
fn shared_vip(node_port: i32) -> (Model, ServicePortName, ServicePortName) {
    let lb = |name: &str, cluster_ip: &str, affinity: bool| {
        let mut s = service("ns", name, cluster_ip, &[("http", "TCP", 80, node_port)]);
        let spec = s.spec.as_mut().unwrap();
        spec.type_ = Some("LoadBalancer".into());
        if affinity {
            spec.session_affinity = Some("ClientIP".into());
        }
        s.status = Some(from_json(serde_json::json!({"loadBalancer": {"ingress": [{"ip": "192.168.60.10"}]}})));
        applied_service(s)
    };
    let eps = |name: &str, svc: &str, ips: &[&str]| {
        let eps: Vec<Ep> = ips.iter().map(|ip| ep(ip, "node-b")).collect();
        applied_slice(slice("ns", name, svc, &[("http", "TCP", 8080)], &eps))
    };
    let m = model_with(vec![
        lb("a", "10.96.0.40", false),
        eps("a-1", "a", &["10.244.1.1", "10.244.1.2"]),
        lb("b", "10.96.0.41", true),
        eps("b-1", "b", &["10.244.1.2", "10.244.1.3"]),
    ]);
    let port = |svc: &str| ServicePortName {
        service: crate::model::NamespacedName::new("ns", svc),
        port: "http".into(),
        protocol: Protocol::Tcp,
    };
    (m, port("a"), port("b"))
}

/// The desired state's lines for the shared VIP.
fn vip_lines(p: &IpvsPlanner) -> Vec<String> {
    p.desired().ipvs.iter().map(|o| o.to_string()).filter(|l| l.contains("192.168.60.10")).collect()
}

#[test]
fn two_ports_claiming_one_virtual_server_share_its_real_servers() {
    // Two Services with the same LB VIP and port: the lower owner's scheduler
    // settings win; real servers are the union, each kept while any claims it.
    let (mut m, a, b) = shared_vip(0);
    let mut p = IpvsPlanner::new(ctx());
    p.update(&m, [&a, &b]);
    assert_eq!(
        vip_lines(&p),
        vec![
            "-A -t 192.168.60.10:80 -s rr",
            "-a -t 192.168.60.10:80 -r 10.244.1.1:8080 -m -w 1",
            "-a -t 192.168.60.10:80 -r 10.244.1.2:8080 -m -w 1",
            "-a -t 192.168.60.10:80 -r 10.244.1.3:8080 -m -w 1",
        ]
    );
    // a goes: b's settings take over, a's own real server goes, the shared one stays.
    m.record(&deleted_service(service("ns", "a", "10.96.0.40", &[("http", "TCP", 80, 0)]))).unwrap();
    let ch = m.apply();
    let l: Vec<String> = lines(&p.update(&m, &ch.ports)).into_iter().filter(|l| l.contains("192.168.60.10")).collect();
    assert_eq!(l, vec!["-E -t 192.168.60.10:80 -s rr -p 10800", "-d -t 192.168.60.10:80 -r 10.244.1.1:8080"]);
}

#[test]
fn a_shared_virtual_servers_real_servers_follow_a_new_context() {
    // Both Services also have NodePort 30080: one virtual server per node IP,
    // shared. A new node IP replans every port in name order, a then b:
    // while a is replanned, b still claims the old IP's virtual server as it
    // was planned (with the old context), so each real server there goes
    // exactly once, the shared one too.
    let (mut m, a, b) = shared_vip(30080);
    let mut p = IpvsPlanner::new(ctx());
    p.update(&m, [&b, &a]);
    let held = 3 + 3 + 2 + 2;
    assert_eq!(p.sizes().1, held, "the VIP's three, the node port's three, each cluster IP's two");
    let mut c = ctx();
    c.node_port_ips = vec![ip("192.168.50.3")];
    let mut l: Vec<String> = lines(&p.replan_all(&m, c)).into_iter().filter(|l| l.contains(":30080 -r ")).collect();
    l.sort();
    let ops = |op: &str, node: &str, tail: &str| {
        ["1", "2", "3"].map(|e| format!("{op} -t 192.168.50.{node}:30080 -r 10.244.1.{e}:8080{tail}"))
    };
    assert_eq!(l, [ops("-a", "3", " -m -w 1"), ops("-d", "2", "")].concat());
    assert_eq!(p.sizes().1, held);
    // b goes (the lower owner): a's settings take over, b's own real servers go.
    m.record(&deleted_service(service("ns", "b", "10.96.0.41", &[("http", "TCP", 80, 30080)]))).unwrap();
    let ch = m.apply();
    let mut l: Vec<String> = lines(&p.update(&m, &ch.ports)).into_iter().filter(|l| l.contains("10.244.1.3")).collect();
    l.sort();
    assert_eq!(
        l,
        vec![
            "-d -t 10.96.0.41:80 -r 10.244.1.3:8080",
            "-d -t 192.168.50.3:30080 -r 10.244.1.3:8080",
            "-d -t 192.168.60.10:80 -r 10.244.1.3:8080",
        ]
    );
    assert_eq!(p.sizes().1, 2 + 2 + 2);
}

fn scheduled(name: &str, cluster_ip: &str, annotations: &[(&str, &str)]) -> SourceEvent {
    applied_service(annotated(service("default", name, cluster_ip, &[("http", "TCP", 80, 0)]), annotations))
}

const SCHED: &str = crate::model::scheduler::ANNOTATION_SCHEDULER;
const SCHED_FLAGS: &str = crate::model::scheduler::ANNOTATION_SCHEDULER_FLAGS;

#[test]
fn a_services_scheduler_annotation_sets_its_virtual_servers_scheduler_and_flags() {
    let m = model_with(vec![
        scheduled("hashed", "10.96.0.21", &[(SCHED, "sh"), (SCHED_FLAGS, "fallback,port")]),
        scheduled("maglev", "10.96.0.22", &[(SCHED, "mh")]),
        scheduled("plain", "10.96.0.23", &[]),
        scheduled("typo", "10.96.0.24", &[(SCHED, "round-robin")]),
        scheduled("rr-flags", "10.96.0.25", &[(SCHED, "rr"), (SCHED_FLAGS, "port")]),
    ]);
    let mut p = IpvsPlanner::new(ctx());
    let l = lines(&p.update(&m, &all_ports(&m)));
    let services: Vec<&str> = l.iter().filter(|l| l.starts_with("-A ")).map(String::as_str).collect();
    assert_eq!(
        services,
        [
            "-A -t 10.96.0.21:80 -s sh -b sh-fallback,sh-port",
            // The annotation's flags exactly: mh without `port` hashes the source address only.
            "-A -t 10.96.0.22:80 -s mh",
            "-A -t 10.96.0.23:80 -s rr",
            // Refused annotations: the default scheduler, no flags.
            "-A -t 10.96.0.24:80 -s rr",
            "-A -t 10.96.0.25:80 -s rr",
        ]
    );
    // The configured mh keeps upstream's port flag; an annotated Service keeps its own.
    let mut c = ctx();
    c.scheduler = "mh".into();
    let l = lines(&p.replan_all(&m, c));
    assert_eq!(
        l,
        [
            "-E -t 10.96.0.23:80 -s mh -b mh-port",
            "-E -t 10.96.0.24:80 -s mh -b mh-port",
            "-E -t 10.96.0.25:80 -s mh -b mh-port",
        ]
    );
}

#[test]
fn a_scheduler_annotation_change_edits_the_virtual_server_and_keeps_its_real_servers() {
    let mut events = web();
    let mut m = model_with(events.clone());
    let mut p = IpvsPlanner::new(ctx());
    p.update(&m, &all_ports(&m));
    // rr -> sh: one edit, nothing deleted or re-added.
    events[0] = scheduled("web", "10.96.0.20", &[(SCHED, "sh")]);
    m.record(&events[0]).unwrap();
    let ch = m.apply();
    assert_eq!(lines(&p.update(&m, &ch.ports)), vec!["-E -t 10.96.0.20:80 -s sh"]);
    // sh -> sh with flags, then back to the default: edits again.
    m.record(&scheduled("web", "10.96.0.20", &[(SCHED, "sh"), (SCHED_FLAGS, "sh-port")])).unwrap();
    let ch = m.apply();
    assert_eq!(lines(&p.update(&m, &ch.ports)), vec!["-E -t 10.96.0.20:80 -s sh -b sh-port"]);
    m.record(&scheduled("web", "10.96.0.20", &[])).unwrap();
    let ch = m.apply();
    assert_eq!(lines(&p.update(&m, &ch.ports)), vec!["-E -t 10.96.0.20:80 -s rr"]);
    // An unchanged annotation plans nothing.
    m.record(&scheduled("web", "10.96.0.20", &[])).unwrap();
    let ch = m.apply();
    assert!(p.update(&m, &ch.ports).is_empty());
}

#[test]
fn a_full_resyncs_replan_leaves_the_plan_replan_all_leaves() {
    let mut m = model_with(
        [web(), vec![applied_service(service("ns", "np", "10.96.0.30", &[("http", "TCP", 80, 30080)]))]].concat(),
    );
    let mut moved_ctx = ctx();
    moved_ctx.node_port_ips = vec![ip("192.168.50.3")];
    let (mut with_deltas, mut without) = (IpvsPlanner::new(ctx()), IpvsPlanner::new(ctx()));
    // A first sync, then a full resync on new node addresses.
    with_deltas.replan_all(&m, ctx());
    without.replan_for_full_sync(&m, ctx());
    assert_eq!(without.desired(), with_deltas.desired());
    with_deltas.replan_all(&m, moved_ctx.clone());
    without.replan_for_full_sync(&m, moved_ctx);
    assert_eq!(without.desired(), with_deltas.desired());
    assert!(without.desired().ipvs.iter().any(|o| o.to_string() == "-A -t 192.168.50.3:30080 -s rr"));
    for set in IpvsSet::ALL {
        assert_eq!(without.set_has_members(set), with_deltas.set_has_members(set), "{set:?}");
    }
    assert!(without.set_has_members(IpvsSet::NodePortTcp));
    // The next change plans from there alike.
    m.record(&deleted_service(service("ns", "np", "10.96.0.30", &[("http", "TCP", 80, 30080)]))).unwrap();
    let ch = m.apply();
    assert_eq!(lines(&without.update(&m, &ch.ports)), lines(&with_deltas.update(&m, &ch.ports)));
    assert!(!without.set_has_members(IpvsSet::NodePortTcp));
}

/// What the kernel holds after `before` and then `d`'s ops, each actor's
/// in the order it applies them: the addresses, the set members, the
/// virtual servers with their real servers.
fn applied_in_order(before: &IpvsDesired, d: &IpvsDeltas) -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<String>) {
    let mut addrs: BTreeSet<String> = before.addresses.iter().map(|a| a.to_string()).collect();
    for op in &d.link {
        match op {
            LinkOp::Bind(a) => addrs.insert(a.to_string()),
            LinkOp::Unbind(a) => addrs.remove(&a.to_string()),
        };
    }
    let member = |set: &IpvsSet, e: &SetEntry| format!("{} {e}", set.base_name());
    let mut members: BTreeSet<String> =
        before.sets.iter().flat_map(|(set, es)| es.iter().map(move |e| member(set, e))).collect();
    for (set, ops) in &d.sets {
        for op in ops {
            match op {
                IpsetOp::Add(e) => members.insert(member(set, e)),
                IpsetOp::Del(e) => members.remove(&member(set, e)),
            };
        }
    }
    let key = |op: &IpvsOp| match op {
        IpvsOp::AddService(k, _) | IpvsOp::EditService(k, _) | IpvsOp::DelService(k) => format!("{k:?}"),
        IpvsOp::AddDest(k, d, _) | IpvsOp::EditDest(k, d, _) | IpvsOp::DelDest(k, d) => format!("{k:?} {d:?}"),
    };
    let mut ipvs: BTreeSet<String> = before.ipvs.iter().map(key).collect();
    for op in &d.ipvs {
        match op {
            IpvsOp::AddService(..) | IpvsOp::AddDest(..) => assert!(ipvs.insert(key(op)), "{op} adds what is there"),
            IpvsOp::EditService(..) | IpvsOp::EditDest(..) => assert!(ipvs.contains(&key(op)), "{op} edits nothing"),
            IpvsOp::DelService(k) => {
                let vs = format!("{k:?}");
                ipvs.retain(|x| x != &vs && !x.starts_with(&format!("{vs} ")));
            }
            IpvsOp::DelDest(..) => {
                ipvs.remove(&key(op));
            }
        }
    }
    (addrs, members, ipvs)
}

/// A Service's only port replaced by one with another name or protocol
/// (a new service port, planned after the old one: its name or protocol
/// sorts later) on the same cluster IP, and one renamed on the same port
/// number: applied in order, the deltas leave the kernel as the plan
/// wants it (the address and `KUBE-IPVS-IPS` member stay, the virtual
/// server is edited, not deleted after its add).
#[test]
fn a_key_one_port_releases_and_another_claims_in_one_update_stays() {
    let eps = [ep("10.244.0.5", "node-a"), ep("10.244.1.5", "node-b")];
    let web = |port: (&str, &str, i32)| {
        vec![
            applied_service(service("default", "web", "10.96.0.20", &[(port.0, port.1, port.2, 0)])),
            applied_slice(slice("default", "web-1", "web", &[(port.0, port.1, 8080)], &eps)),
        ]
    };
    for (from, to) in [
        (("http", "TCP", 80), ("http", "UDP", 80)),
        (("http", "TCP", 80), ("www", "TCP", 80)),
        (("http", "TCP", 80), ("www", "TCP", 81)),
    ] {
        let mut m = model_with(web(from));
        let mut p = IpvsPlanner::new(ctx());
        p.update(&m, &all_ports(&m));
        let before = p.desired();
        for e in web(to) {
            m.record(&e).unwrap();
        }
        let ch = m.apply();
        let d = p.update(&m, &ch.ports);
        let after = p.desired();
        let want = applied_in_order(&after, &IpvsDeltas::default());
        assert_eq!(applied_in_order(&before, &d), want, "{from:?} -> {to:?}: {:#?}", lines(&d));
        assert!(want.0.contains("10.96.0.20"), "{want:?}");
    }
}
