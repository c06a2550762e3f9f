//! The VM's IPVS scenarios (tests/vm/guest/ipvs-scenarios.sh) as
//! millisecond tests: the VM's own manifests and flags, one real
//! coordinator sync through the actors onto the in-memory kernels, then
//! the packet tracer ([`crate::plan::trace`]) over what the sync left. The
//! VM keeps the end-to-end proof with real packets; these say where each
//! scenario's first packet goes, and fail at the rule that changed.
//! `KPR_TRACE=1 cargo test --lib trace_scenarios -- --nocapture` prints
//! every trace.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use actix::prelude::*;

use crate::actors::coordinator::{AddrSource, Coordinator, RulesRenderer};
use crate::actors::source::manifests::ManifestDir;
use crate::actors::wiring::{start_ipvs_actors, IpvsKernels};
use crate::config::{load, Flags};
use crate::fixtures::*;
use crate::kernel::mem::*;
use crate::kernel::IpsetKernel;
use crate::model::NodeInfo;
use crate::msgs::{SourceBatch, SourceEvent};
use crate::net::{IpFamily, Protocol};
use crate::plan::context::LocalAddr;
use crate::plan::iptables::HostFeatures;
use crate::plan::ipvs::{IpvsPlanner, IpvsSet};
use crate::plan::trace::{Kernel, Origin, Packet, Set, Tracer, Verdict};
use crate::stats::StatsRegistry;

/// The daemon's flags in the VM (start_daemon).
const FLAGS: &[&str] = &[
    "kube-proxy-rs",
    "--proxy-mode=ipvs",
    "--hostname-override=node-a",
    "--cluster-cidr=10.244.0.0/16",
    "--ipvs-exclude-cidrs=10.99.0.0/16",
    "--ipvs-sync-period=5s",
    "--ipvs-min-sync-period=0s",
];

/// node-a's interfaces in the VM's topology (dual_topology adds IPv6).
const NODE_ADDRS: [(&str, &str); 8] = [
    ("lo", "127.0.0.1"),
    ("lan0", "192.168.50.2"),
    ("lan1", "192.168.52.2"),
    ("tonodeb", "172.30.0.1"),
    ("vpod1", "10.244.0.1"),
    ("lo", "::1"),
    ("lan0", "fd00:50::2"),
    ("vpod1", "fd00:244::1"),
];

const CPOD: &str = "10.244.0.50";
const POD1: &str = "10.244.0.11";
const CLIENT: &str = "192.168.50.10";
const OUTSIDER: &str = "192.168.52.10";
const NODE: &str = "192.168.50.2";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address literal")
}

/// Beside the VM's manifests: a NodePort service with
/// externalTrafficPolicy Local and one endpoint on each node, a
/// LoadBalancer whose source ranges leave the node out, and two whose
/// source ranges are written with leading zeros and do not parse at all.
fn beside_the_vm() -> Vec<SourceEvent> {
    let mut np = service("default", "np-local", "10.96.0.36", &[("http", "TCP", 80, 30090)]);
    np.spec.as_mut().expect("spec").external_traffic_policy = Some("Local".into());
    let eps = [ep("10.244.0.12", "node-a"), ep("10.244.1.21", "node-b")];
    let np_slice = slice("default", "np-local-1", "np-local", &[("http", "TCP", 8080)], &eps);
    let lb: k8s_openapi::api::core::v1::Service = from_json(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": "lb-far"},
        "spec": {
            "type": "LoadBalancer", "clusterIP": "10.96.0.42", "clusterIPs": ["10.96.0.42"],
            "loadBalancerSourceRanges": ["203.0.113.0/24"],
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30083}],
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "192.168.60.12"}]}},
    }));
    let lb_slice = slice("default", "lb-far-1", "lb-far", &[("http", "TCP", 8080)], &[ep("10.244.1.21", "node-b")]);
    let mut events = vec![applied_service(np), applied_slice(np_slice), applied_service(lb), applied_slice(lb_slice)];
    for (name, ip, ranges, vip, node_port) in [
        ("lb-zeros", "10.96.0.43", "192.168.050.000/024", "192.168.060.013", 30084),
        ("lb-unparseable", "10.96.0.44", "192.168.50.0/240", "192.168.60.14", 30085),
    ] {
        let lb: k8s_openapi::api::core::v1::Service = from_json(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "default", "name": name},
            "spec": {
                "type": "LoadBalancer", "clusterIP": ip, "clusterIPs": [ip], "loadBalancerSourceRanges": [ranges],
                "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": node_port}],
            },
            "status": {"loadBalancer": {"ingress": [{"ip": vip}]}},
        }));
        let eps = [ep("10.244.1.21", "node-b")];
        events.push(applied_service(lb));
        events.push(applied_slice(slice("default", &format!("{name}-1"), name, &[("http", "TCP", 8080)], &eps)));
    }
    events
}

/// What one full sync of the VM's cluster (with its dual-stack scenario's
/// services) leaves in one family's in-memory kernels.
fn synced(family: IpFamily) -> &'static Kernel {
    static V4: OnceLock<Kernel> = OnceLock::new();
    static V6: OnceLock<Kernel> = OnceLock::new();
    let once = if family == IpFamily::V4 { &V4 } else { &V6 };
    once.get_or_init(|| {
        let mut events = beside_the_vm();
        for dir in ["manifests", "dual"] {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm/scenarios").join(dir);
            let scan = ManifestDir::new(dir).with_settle(Duration::ZERO).scan();
            assert!(scan.errors.is_empty(), "{:?}", scan.errors);
            events.extend(scan.events);
        }
        let sys = actix_rt::System::with_tokio_rt(|| {
            tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("runtime")
        });
        sys.block_on(sync(family, events))
    })
}

/// The daemon's wiring on in-memory kernels: its actors, its coordinator
/// settings and rules renderer from the VM's flags.
async fn sync(family: IpFamily, events: Vec<SourceEvent>) -> Kernel {
    let cfg = load(&Flags::try_parse_args(FLAGS.iter().copied()).expect("flags")).expect("config");
    let journal = Journal::default();
    let sets: BTreeMap<IpvsSet, MemIpset> =
        IpvsSet::ALL.iter().map(|s| (*s, MemIpset::new(&journal, s.spec(family)))).collect();
    let (ipvs, link, iptables) = (MemIpvs::new(&journal), MemLink::new(&journal), MemIptables::new(&journal));
    let kernels = IpvsKernels {
        ipvs: ipvs.clone(),
        sets: sets.clone(),
        link: link.clone(),
        iptables: iptables.clone(),
        conntrack: MemConntrack::new(&journal),
    };
    let addrs: AddrSource =
        Box::new(|| NODE_ADDRS.iter().map(|(ifname, a)| LocalAddr { ifname: ifname.to_string(), ip: ip(a) }).collect());
    let host = HostFeatures { random_fully: true, ..HostFeatures::default() };
    let family_settings = crate::settings::derive(&cfg, family, "node-a", host);
    let settings = crate::proxier::coordinator_settings(&family_settings);
    let rules: RulesRenderer =
        Box::new(move |p: &IpvsPlanner, node: &NodeInfo| p.rules(&family_settings.rules_config(node)));
    let coord = Coordinator::create(|ctx| {
        let targets = start_ipvs_actors(kernels, &StatsRegistry::default(), ctx.address().recipient());
        Coordinator::new(settings, targets, addrs, rules)
    });
    coord.send(SourceBatch(events)).await.expect("coordinator alive");
    tokio::time::sleep(Duration::from_millis(10)).await;
    let sets = sets
        .values()
        .filter_map(|m| Some((m.spec().name.clone(), Set { set_type: m.spec().set_type, members: m.snapshot()? })))
        .collect();
    let restores = iptables.restores.lock().expect("restores").clone();
    assert!(!restores.is_empty(), "no iptables restore: {:?}", journal.lines());
    assert!(journal.pos("FAILED").is_none(), "{:?}", journal.lines());
    Kernel {
        restores,
        sets,
        ipvs: ipvs.snapshot(),
        ipvs0: link.snapshot(),
        node: NODE_ADDRS.iter().map(|(_, a)| ip(a)).collect(),
    }
}

fn tracer() -> Tracer {
    Tracer::new(synced(IpFamily::V4)).expect("the tracer understands every rule")
}

fn tcp(origin: Origin, src: &str, dst: &str, dport: u16) -> Packet {
    Packet { origin, src: ip(src), dst: ip(dst), proto: Protocol::Tcp, dport }
}

fn delivered(to: &[&str], masqueraded: bool) -> Vec<Verdict> {
    let mut v: Vec<Verdict> =
        to.iter().map(|t| Verdict::Delivered { to: t.parse::<SocketAddr>().expect("ip:port"), masqueraded }).collect();
    v.sort();
    v
}

/// web, np, lb, ext and echo's endpoints: pod1, pod2, remote1.
const EVERY_BACKEND: [&str; 3] = ["10.244.0.11:8080", "10.244.0.12:8080", "10.244.1.21:8080"];

fn verdicts(t: &Tracer, p: Packet) -> Vec<Verdict> {
    let got = t.verdicts(&p).expect("trace");
    if std::env::var_os("KPR_TRACE").is_some() {
        t.trace(&p).expect("trace").iter().for_each(|tr| eprintln!("{p:?}\n{tr}"));
    }
    got
}

/// clusterip-tcp-every-backend, clusterip-udp-every-backend.
#[test]
fn a_pod_reaches_every_backend_of_a_cluster_ip_unmasqueraded() {
    let t = tracer();
    assert_eq!(verdicts(&t, tcp(Origin::Pod, CPOD, "10.96.0.20", 80)), delivered(&EVERY_BACKEND, false));
    let udp = Packet { proto: Protocol::Udp, ..tcp(Origin::Pod, CPOD, "10.96.0.30", 5000) };
    let echo = ["10.244.0.11:5000", "10.244.0.12:5000", "10.244.1.21:5000"];
    assert_eq!(verdicts(&t, udp), delivered(&echo, false));
}

/// The node's own connection to a cluster IP (the dual-stack scenario's
/// "from node"): its source is the cluster IP, outside the cluster CIDR, so
/// it is marked and masqueraded.
#[test]
fn the_node_reaches_a_cluster_ip_masqueraded() {
    let t = tracer();
    assert_eq!(verdicts(&t, tcp(Origin::Node, "10.96.0.20", "10.96.0.20", 80)), delivered(&EVERY_BACKEND, true));
}

/// hairpin: pod1 through its own service lands on itself, masqueraded
/// (KUBE-LOOP-BACK), else its reply would not come back through IPVS.
#[test]
fn hairpin_a_pod_reaching_itself_is_masqueraded() {
    let want = [
        Verdict::Delivered { to: "10.244.0.11:8080".parse().unwrap(), masqueraded: true },
        Verdict::Delivered { to: "10.244.0.12:8080".parse().unwrap(), masqueraded: false },
        Verdict::Delivered { to: "10.244.1.21:8080".parse().unwrap(), masqueraded: false },
    ];
    assert_eq!(verdicts(&tracer(), tcp(Origin::Pod, POD1, "10.96.0.20", 80)), want);
}

/// nodeport-on-node-ip; and a NodePort on the node's other addresses.
#[test]
fn a_node_port_from_outside_reaches_every_backend_masqueraded() {
    let t = tracer();
    for node_ip in [NODE, "192.168.52.2", "172.30.0.1"] {
        assert_eq!(verdicts(&t, tcp(Origin::Outside, CLIENT, node_ip, 30080)), delivered(&EVERY_BACKEND, true));
    }
    assert_eq!(verdicts(&t, tcp(Origin::Outside, CLIENT, "127.0.0.1", 30080)), vec![Verdict::NotAService]);
}

/// externalTrafficPolicy Local with a local endpoint: only the local one,
/// with the client's own address (KUBE-NODE-PORT-LOCAL-TCP returns before
/// the mark).
#[test]
fn a_local_policy_node_port_reaches_only_the_local_endpoint_unmasqueraded() {
    let got = verdicts(&tracer(), tcp(Origin::Outside, CLIENT, NODE, 30090));
    assert_eq!(got, delivered(&["10.244.0.12:8080"], false));
}

/// local-policy-no-local-endpoint-drops: as upstream (kubernetes PR 97081)
/// the cluster's endpoints serve, unmasqueraded; the remote pod's reply
/// goes straight to the client, which drops it, so the VM sees nothing.
/// Its cluster IP, policy Cluster for a pod, serves normally.
#[test]
fn a_local_policy_without_local_endpoint_forwards_unmasqueraded_so_the_reply_is_lost() {
    let t = tracer();
    let remote2 = delivered(&["10.244.1.22:8080"], false);
    assert_eq!(verdicts(&t, tcp(Origin::Outside, CLIENT, "192.168.60.11", 80)), remote2);
    assert_eq!(verdicts(&t, tcp(Origin::Outside, CLIENT, NODE, 30082)), remote2);
    assert_eq!(verdicts(&t, tcp(Origin::Pod, CPOD, "10.96.0.41", 80)), remote2);
}

/// lb-ingress-ip, lb-source-ranges; and the node itself, inside the ranges
/// (KUBE-LOAD-BALANCER-SOURCE-IP: its source is the VIP).
#[test]
fn load_balancer_source_ranges_admit_the_range_and_drop_the_rest() {
    let t = tracer();
    assert_eq!(verdicts(&t, tcp(Origin::Outside, CLIENT, "192.168.60.10", 80)), delivered(&EVERY_BACKEND, true));
    let dropped = verdicts(&t, tcp(Origin::Outside, OUTSIDER, "192.168.60.10", 80));
    let rule = "filter KUBE-SOURCE-RANGES-FIREWALL: -A KUBE-SOURCE-RANGES-FIREWALL -j DROP".to_string();
    assert_eq!(dropped, vec![Verdict::Dropped { rule }]);
    let node = tcp(Origin::Node, "192.168.60.10", "192.168.60.10", 80);
    assert_eq!(verdicts(&t, node), delivered(&EVERY_BACKEND, true));
}

/// Source ranges without the node: the node's own connection to the VIP
/// (its source is the VIP) is dropped on its way in, like an outsider's;
/// a client in the ranges gets through. (Without that DROP,
/// KUBE-IPVS-OUT-FILTER still stops it: see `mutated`.)
#[test]
fn load_balancer_source_ranges_without_the_node_keep_the_node_out() {
    let t = tracer();
    let rule = "filter KUBE-SOURCE-RANGES-FIREWALL: -A KUBE-SOURCE-RANGES-FIREWALL -j DROP".to_string();
    let got = verdicts(&t, tcp(Origin::Node, "192.168.60.12", "192.168.60.12", 80));
    assert_eq!(got, vec![Verdict::Dropped { rule }]);
    let inside = verdicts(&t, tcp(Origin::Outside, "203.0.113.7", "192.168.60.12", 80));
    assert_eq!(inside, delivered(&["10.244.1.21:8080"], true));
}

/// Source ranges with leading zeros admit the range they mean (the
/// client) and drop the rest; ranges that do not parse admit no one
/// (fail closed), not everyone.
#[test]
fn source_ranges_with_leading_zeros_apply_and_unparseable_ones_admit_no_one() {
    let t = tracer();
    let dropped = vec![Verdict::Dropped {
        rule: "filter KUBE-SOURCE-RANGES-FIREWALL: -A KUBE-SOURCE-RANGES-FIREWALL -j DROP".to_string(),
    }];
    assert_eq!(verdicts(&t, tcp(Origin::Outside, CLIENT, "192.168.60.13", 80)), delivered(&["10.244.1.21:8080"], true));
    assert_eq!(verdicts(&t, tcp(Origin::Outside, OUTSIDER, "192.168.60.13", 80)), dropped);
    assert_eq!(verdicts(&t, tcp(Origin::Outside, CLIENT, "192.168.60.14", 80)), dropped);
    assert_eq!(verdicts(&t, tcp(Origin::Outside, OUTSIDER, "192.168.60.14", 80)), dropped);
    // Their NodePorts are open, as upstream's are.
    assert_eq!(verdicts(&t, tcp(Origin::Outside, OUTSIDER, NODE, 30085)), delivered(&["10.244.1.21:8080"], true));
}

/// external-ip.
#[test]
fn an_external_ip_from_outside_reaches_every_backend_masqueraded() {
    let got = verdicts(&tracer(), tcp(Origin::Outside, CLIENT, "192.168.60.20", 80));
    assert_eq!(got, delivered(&EVERY_BACKEND, true));
}

/// no-endpoints-refused: the virtual server exists without real servers;
/// IPVS answers ICMP port unreachable (the VM sees a quick refusal).
#[test]
fn a_service_without_endpoints_is_rejected() {
    let by = "ipvs: no real server for -t 10.96.0.70:80".to_string();
    assert_eq!(verdicts(&tracer(), tcp(Origin::Pod, CPOD, "10.96.0.70", 80)), vec![Verdict::Rejected { by }]);
}

/// A service address on a port no service has: KUBE-IPVS-FILTER rejects
/// it, rather than the host answering on kube-ipvs0's address.
#[test]
fn a_service_address_on_another_port_is_rejected_by_the_ipvs_filter() {
    let got = verdicts(&tracer(), tcp(Origin::Pod, CPOD, "10.96.0.20", 81));
    assert!(matches!(&got[..], [Verdict::Rejected { by }] if by.starts_with("filter KUBE-IPVS-FILTER:")), "{got:?}");
    let host = verdicts(&tracer(), tcp(Origin::Outside, CLIENT, NODE, 22));
    assert_eq!(host, vec![Verdict::NotAService], "the node's own address is the host's");
}

/// client-ip-affinity: a persistent virtual server (which real server
/// persistence picks is IPVS's state, not modelled).
#[test]
fn client_ip_affinity_is_a_persistent_virtual_server() {
    let traces = tracer().trace(&tcp(Origin::Pod, CPOD, "10.96.0.60", 80)).expect("trace");
    assert_eq!(traces.len(), 3);
    assert!(traces[0].steps.contains(&"ipvs: -A -t 10.96.0.60:80 -s rr -p 600".to_string()), "{}", traces[0]);
}

/// dual-stack-both-families, IPv6 side: its own proxier's sync (KUBE-6-
/// sets, ip6tables rules). The VM gives no IPv6 cluster CIDR, so, as
/// upstream without a local detector, a cluster IP masquerades only
/// connections whose source is a service address (the node's own).
#[test]
fn ipv6_cluster_ip_node_port_and_an_ipv6_only_service() {
    let t = Tracer::new(synced(IpFamily::V6)).expect("the tracer understands every rule");
    let pods = ["[fd00:244::11]:9090", "[fd00:244::12]:9090"];
    let client = "fd00:50::10";
    assert_eq!(verdicts(&t, tcp(Origin::Outside, client, "fd00:96::30", 80)), delivered(&pods, false));
    assert_eq!(verdicts(&t, tcp(Origin::Node, "fd00:96::30", "fd00:96::30", 80)), delivered(&pods, true));
    assert_eq!(verdicts(&t, tcp(Origin::Outside, client, "fd00:50::2", 30300)), delivered(&pods, true));
    let udp = Packet { proto: Protocol::Udp, ..tcp(Origin::Outside, client, "fd00:50::2", 30301) };
    assert_eq!(verdicts(&t, udp), delivered(&["[fd00:244::11]:9091", "[fd00:244::12]:9091"], true));
    assert_eq!(verdicts(&t, tcp(Origin::Outside, client, "fd00:96::31", 80)), delivered(&pods[..1], false));
    assert_eq!(verdicts(&t, tcp(Origin::Outside, client, "10.96.0.130", 80)), vec![Verdict::Forwarded], "not IPv6's");
}

/// The traces can fail: the same state with one rule taken out.
mod mutated {
    use super::*;

    fn without(rule: &str) -> Tracer {
        let mut k = synced(IpFamily::V4).clone();
        let before: usize = k.restores.iter().map(|r| r.matches(rule).count()).sum();
        assert!(before > 0, "no rule {rule}");
        for r in &mut k.restores {
            *r = r.lines().filter(|l| !l.contains(rule)).map(|l| format!("{l}\n")).collect();
        }
        Tracer::new(&k).expect("still understood")
    }

    #[test]
    fn without_the_masquerade_rule_a_node_port_is_not_masqueraded() {
        let t = without("kubernetes service traffic requiring SNAT");
        assert_eq!(verdicts(&t, tcp(Origin::Outside, CLIENT, NODE, 30080)), delivered(&EVERY_BACKEND, false));
    }

    #[test]
    fn without_the_loop_back_rule_hairpin_is_not_masqueraded() {
        let t = without("--match-set KUBE-LOOP-BACK");
        let got = verdicts(&t, tcp(Origin::Pod, POD1, "10.96.0.20", 80));
        assert_eq!(got, delivered(&EVERY_BACKEND, false));
    }

    #[test]
    fn without_the_source_ranges_drop_anyone_reaches_the_load_balancer() {
        let t = without("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP");
        let got = verdicts(&t, tcp(Origin::Outside, OUTSIDER, "192.168.60.10", 80));
        assert_eq!(got, delivered(&EVERY_BACKEND, true));
    }

    /// The second line: once IPVS forwarded the node's packet, `-m ipvs`
    /// names the virtual server and KUBE-IPVS-OUT-FILTER drops it.
    #[test]
    fn without_the_source_ranges_drop_the_out_filter_keeps_the_node_out() {
        let t = without("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP");
        let got = verdicts(&t, tcp(Origin::Node, "192.168.60.12", "192.168.60.12", 80));
        let out_filter =
            "-A KUBE-IPVS-OUT-FILTER -s 192.168.60.12 -m ipvs --vaddr 192.168.60.12 --vproto tcp --vport 80 -j DROP";
        assert_eq!(got, vec![Verdict::Dropped { rule: format!("filter KUBE-IPVS-OUT-FILTER: {out_filter}") }]);
    }

    #[test]
    fn without_the_local_return_a_local_policy_node_port_is_masqueraded() {
        let t = without("--match-set KUBE-NODE-PORT-LOCAL-TCP");
        let got = verdicts(&t, tcp(Origin::Outside, CLIENT, NODE, 30090));
        assert_eq!(got, delivered(&["10.244.0.12:8080"], true));
    }

    #[test]
    fn without_the_ipvs_filter_reject_the_host_gets_a_service_address() {
        let t = without("-j REJECT");
        assert_eq!(verdicts(&t, tcp(Origin::Pod, CPOD, "10.96.0.20", 81)), vec![Verdict::NotAService]);
    }

    #[test]
    fn without_its_kube_ipvs0_address_a_cluster_ip_is_not_served() {
        let mut k = synced(IpFamily::V4).clone();
        assert!(k.ipvs0.remove(&ip("10.96.0.20")));
        let t = Tracer::new(&k).expect("tracer");
        assert_eq!(verdicts(&t, tcp(Origin::Pod, CPOD, "10.96.0.20", 80)), vec![Verdict::Forwarded]);
    }
}
