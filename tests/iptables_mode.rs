//! iptables mode with real packets: the planner's restore input, applied
//! to a network namespace playing the node, carries TCP and UDP from other
//! namespaces (an off-cluster client, pods) to backends, as upstream's
//! iptables proxier would.
//!
//! The lab, built per test (every name ends in the test process's pid):
//! ```text
//!  client 192.168.50.10 ──veth── 192.168.50.1 node ── 10.244.1.1 ──veth── 10.244.1.2 b1 (local)
//!                                  (rules here)   ── 10.244.2.1 ──veth── 10.244.2.2 b2 (local)
//!                                up0 172.31.0.1   ── 10.244.3.1 ──veth── 10.244.3.2 b3 ("other-node")
//! ```
//! The node forwards; its default route points into a dead-end uplink (a
//! veth pair with nobody behind it), so
//! traffic for service IPs without a DNAT rule is forwarded (and meets the
//! filter rules) rather than unroutable. Every backend runs a TCP and a UDP
//! server on port 8080 (`common::lab`: Rust threads that `setns(2)` into its
//! namespace) answering each line or datagram with `<backend> <source IP it
//! saw>`; a TCP client sends one line, reads one answer and closes. Clients
//! run on threads in the client, node or backend namespaces (`Netns::run`).
//!
//! Applying a sync does what upstream does: on a full sync, each missing
//! jump from a built-in chain is inserted at position 1 with `iptables`
//! ([`JUMPS`], [`KUBELET_JUMPS`]), then `iptables-restore --noflush
//! --counters` reads the planner's text. (The crate's `IptablesHandle`
//! ensures IPVS mode's jumps only, so it is not used here.) Sysctls are set
//! as the runtime must: `net.ipv4.ip_forward=1` (a node's job) and, when the
//! context says so, `net.ipv4.conf.all.route_localnet=1`.
//!
//! Needs root, iproute2 and iptables-legacy/iptables-nft with the
//! statistic, recent, comment, addrtype, conntrack and mark matches; a
//! missing one fails the test, nothing is skipped. Traffic stays inside the
//! namespaces created here.

mod common;

use std::io::ErrorKind;
use std::time::Duration;

use common::lab::{self, endpoints, names, service, set, Answer, Backend, CLIENT_IP, NODE_IP};
use common::Netns;
use kube_proxy_rs::fixtures::node;
use kube_proxy_rs::model::{Model, NodeInfo};
use kube_proxy_rs::msgs::{ResourceKind, SourceEvent};
use kube_proxy_rs::net::IpFamily;
use kube_proxy_rs::plan::context::NodePortFilter;
use kube_proxy_rs::plan::iptables::{
    iptables_context, IptablesContext, IptablesPlanner, IptablesSettings, Jump, JUMPS, KUBELET_JUMPS,
};
use kube_proxy_rs::plan::local::LocalDetector;
use serde_json::{json, Value};

const NODE: &str = "node-a";
/// How long a client waits before calling a connection dropped.
const DROP_WAIT: Duration = Duration::from_millis(800);

fn sh(ns: &Netns, cmd: &str) {
    let args: Vec<&str> = cmd.split_whitespace().collect();
    ns.ok(&args);
}

/// `n` TCP (or UDP) exchanges with `to` from inside `ns`.
fn ask(ns: &Netns, to: &str, n: usize, udp: bool) -> Vec<Answer> {
    lab::ask(ns, to, n, udp, DROP_WAIT)
}

/// The node, an off-cluster client, three backends, and the planner.
struct Lab {
    node: Netns,
    client: Netns,
    /// (name, namespace, servers) of b1, b2 (on this node) and b3 (another node's).
    backends: Vec<Backend>,
    flavour: &'static str,
    model: Model,
    planner: IptablesPlanner,
    ctx: IptablesContext,
}

const BACKENDS: [&str; 3] = ["b1", "b2", "b3"];

impl Lab {
    fn new(tag: &str, flavour: &'static str) -> Lab {
        let (node, client, backends) = lab::topology(&format!("ipm-{tag}"), &BACKENDS);
        let ctx = lab_context();
        let mut model = Model::new(IpFamily::V4, NODE);
        model.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
        model.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
        Lab { node, client, backends, flavour, model, planner: IptablesPlanner::new(ctx.clone()), ctx }
    }

    fn backend(&self, name: &str) -> &Netns {
        &self.backends.iter().find(|b| b.0 == name).expect("backend").1
    }

    fn tool(&self, suffix: &str) -> String {
        format!("iptables-{}{suffix}", self.flavour)
    }

    /// Records `events` in the model; returns the service ports that changed.
    fn change(&mut self, events: &[SourceEvent]) -> Vec<kube_proxy_rs::model::ServicePortName> {
        for e in events {
            self.model.record(e).unwrap_or_else(|e| panic!("{e}"));
        }
        self.model.apply().ports.into_iter().collect()
    }

    /// A full sync, applied as the runtime must: sysctls, jumps, restore.
    fn full_sync(&mut self) -> String {
        if self.ctx.needs_route_localnet() {
            sh(&self.node, "sysctl -q -w net.ipv4.conf.all.route_localnet=1");
        }
        for j in JUMPS.iter().chain(&KUBELET_JUMPS) {
            self.ensure_jump(j);
        }
        let text = self.planner.full(&self.model, self.ctx.clone());
        self.restore(&text);
        text
    }

    /// A partial sync of the service ports `changed`.
    fn partial_sync(&mut self, changed: &[kube_proxy_rs::model::ServicePortName]) -> String {
        let text = self.planner.partial(&self.model, changed);
        self.restore(&text);
        text
    }

    /// Upstream's EnsureChain + EnsureRule(Prepend).
    fn ensure_jump(&self, j: &Jump) {
        let ipt = self.tool("");
        let _ = self.node.exec(&[&ipt, "-w", "5", "-t", j.table, "-N", j.to]);
        let mut spec: Vec<&str> = j.extra.split_whitespace().collect();
        if !j.comment.is_empty() {
            spec.extend(["-m", "comment", "--comment", j.comment]);
        }
        spec.extend(["-j", j.to]);
        let mut check = vec![ipt.as_str(), "-w", "5", "-t", j.table, "-C", j.from];
        check.extend(&spec);
        if !self.node.exec(&check).status.success() {
            let mut insert = vec![ipt.as_str(), "-w", "5", "-t", j.table, "-I", j.from, "1"];
            insert.extend(&spec);
            self.node.ok(&insert);
        }
    }

    /// `iptables-restore -w 5 --noflush --counters` in the node; then the
    /// planner may forget the chains it deleted.
    fn restore(&mut self, text: &str) {
        self.node.pipe(&[&self.tool("-restore"), "-w", "5", "--noflush", "--counters"], text);
        self.planner.confirm_applied();
    }

    /// `iptables-save` of one table in the node.
    fn save(&self, table: &str) -> String {
        self.node.ok(&[&self.tool("-save"), "-t", table])
    }
}

/// What the daemon would compute for the lab's node.
fn lab_context() -> IptablesContext {
    let settings = IptablesSettings {
        family: IpFamily::V4,
        node_name: NODE.into(),
        masquerade_all: false,
        masquerade_bit: 14,
        local: LocalDetector::Cidr("10.244.0.0/16".parse().unwrap()),
        random_fully: true,
        localhost_node_ports: true,
        node_ports: NodePortFilter::All,
        conntrack_tcp_liberal: false,
        nfacct_ct_state_invalid: false,
        nfacct_localhost_node_ports: false,
    };
    let addrs = lab::node_addrs();
    iptables_context(&settings, &NodeInfo::from_node(&node(NODE, NODE_IP, "z1")), &addrs)
}

#[test]
fn cluster_ip_tcp_and_udp_spread_over_all_backends() {
    let mut lab = Lab::new("spread", "legacy");
    lab.change(&[service("web", "10.96.0.10", true, json!({}), json!({})), endpoints("web", &BACKENDS)]);
    lab.full_sync();
    let tcp = ask(&lab.client, "10.96.0.10:80", 45, false);
    assert_eq!(names(&tcp), set(&BACKENDS), "{tcp:?}");
    // Off-cluster clients of a cluster IP are masqueraded (`! -s 10.244.0.0/16`).
    assert!(tcp.iter().all(|a| a.as_ref().unwrap().1.starts_with("10.244.")), "{tcp:?}");
    let udp = ask(&lab.client, "10.96.0.10:80", 45, true);
    assert_eq!(names(&udp), set(&BACKENDS), "{udp:?}");
    // From a pod: not masqueraded, the backend sees the pod.
    let from_pod = ask(lab.backend("b3"), "10.96.0.10:80", 30, false);
    assert_eq!(names(&from_pod), set(&BACKENDS));
    assert!(from_pod.iter().filter(|a| a.as_ref().unwrap().0 != "b3").all(|a| a.as_ref().unwrap().1 == "10.244.3.2"));
}

#[test]
fn node_port_answers_on_the_node_ip_and_on_localhost() {
    let mut lab = Lab::new("np", "legacy");
    let spec = json!({"type": "NodePort", "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080}]});
    lab.change(&[service("np", "10.96.0.20", false, spec, json!({})), endpoints("np", &BACKENDS)]);
    assert!(lab.ctx.needs_route_localnet());
    let text = lab.full_sync();
    assert!(text.contains("-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\""));
    let outside = ask(&lab.client, &format!("{NODE_IP}:30080"), 30, false);
    assert_eq!(names(&outside), set(&BACKENDS));
    assert!(outside.iter().all(|a| a.as_ref().unwrap().1 != CLIENT_IP), "Cluster policy masquerades");
    let on_node = ask(&lab.node, "127.0.0.1:30080", 30, false);
    assert_eq!(names(&on_node), set(&BACKENDS), "{on_node:?}");
    let on_node_ip = ask(&lab.node, &format!("{NODE_IP}:30080"), 5, false);
    assert_eq!(on_node_ip.iter().filter(|a| a.is_ok()).count(), 5);
}

#[test]
fn load_balancer_ips_honour_source_ranges() {
    let mut lab = Lab::new("lb", "legacy");
    let lb = |ranges: Value| {
        json!({"type": "LoadBalancer", "loadBalancerSourceRanges": ranges,
        "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30090}]})
    };
    let ingress = |ip: &str| json!({"loadBalancer": {"ingress": [{"ip": ip}]}});
    let mut lb2 = lb(json!(["192.168.50.0/24"]));
    lb2["ports"][0]["nodePort"] = json!(30091);
    let mut lb3 = lb(json!(["198.51.100.0/24"]));
    lb3["ports"][0]["nodePort"] = json!(30092);
    lab.change(&[
        service("open", "10.96.0.30", false, lb(json!([])), ingress("203.0.113.10")),
        endpoints("open", &BACKENDS),
        service("allowed", "10.96.0.31", false, lb2, ingress("203.0.113.11")),
        endpoints("allowed", &BACKENDS),
        service("denied", "10.96.0.32", false, lb3, ingress("203.0.113.12")),
        endpoints("denied", &BACKENDS),
    ]);
    let text = lab.full_sync();
    assert_eq!(text.matches("\n:KUBE-FW-").count(), 2, "{text}");
    assert_eq!(names(&ask(&lab.client, "203.0.113.10:80", 30, false)), set(&BACKENDS));
    assert_eq!(names(&ask(&lab.client, "203.0.113.11:80", 30, false)), set(&BACKENDS));
    let denied = ask(&lab.client, "203.0.113.12:80", 2, false);
    assert!(denied.iter().all(|a| *a == Err(ErrorKind::TimedOut)), "dropped by KUBE-PROXY-FIREWALL: {denied:?}");
    // NodePorts are not subject to the source ranges (as upstream).
    assert!(ask(&lab.client, &format!("{NODE_IP}:30092"), 3, false).iter().all(Result::is_ok));
}

#[test]
fn external_ips_reach_the_backends() {
    let mut lab = Lab::new("eip", "legacy");
    let spec = json!({"externalIPs": ["198.51.100.20"]});
    lab.change(&[service("ext", "10.96.0.40", true, spec, json!({})), endpoints("ext", &BACKENDS)]);
    lab.full_sync();
    assert_eq!(names(&ask(&lab.client, "198.51.100.20:80", 30, false)), set(&BACKENDS));
    assert_eq!(names(&ask(&lab.client, "198.51.100.20:80", 30, true)), set(&BACKENDS));
}

#[test]
fn client_ip_affinity_sticks_to_one_backend() {
    let mut lab = Lab::new("aff", "legacy");
    let spec = json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 300}}});
    lab.change(&[service("sticky", "10.96.0.50", true, spec, json!({})), endpoints("sticky", &BACKENDS)]);
    lab.full_sync();
    let tcp = ask(&lab.client, "10.96.0.50:80", 20, false);
    assert_eq!(names(&tcp).len(), 1, "one backend for one client: {tcp:?}");
    let udp = ask(&lab.client, "10.96.0.50:80", 20, true);
    assert_eq!(names(&udp).len(), 1, "{udp:?}");
    // Another client (a pod) gets its own stickiness, still one backend.
    assert_eq!(names(&ask(lab.backend("b2"), "10.96.0.50:80", 10, false)).len(), 1);
}

#[test]
fn external_traffic_policy_local_uses_local_endpoints_and_keeps_the_client_ip() {
    let mut lab = Lab::new("etp", "legacy");
    let np = |port: u16| {
        json!({"type": "NodePort", "externalTrafficPolicy": "Local",
        "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": port}]})
    };
    lab.change(&[
        service("local", "10.96.0.60", false, np(30060), json!({})),
        endpoints("local", &["b1", "b3"]),
        service("remote", "10.96.0.61", false, np(30061), json!({})),
        endpoints("remote", &["b3"]),
    ]);
    let text = lab.full_sync();
    assert!(text.contains("\"default/remote:http has no local endpoints\""), "{text}");
    let local = ask(&lab.client, &format!("{NODE_IP}:30060"), 20, false);
    assert_eq!(names(&local), set(&["b1"]));
    assert!(local.iter().all(|a| a.as_ref().unwrap().1 == CLIENT_IP), "source kept: {local:?}");
    let remote = ask(&lab.client, &format!("{NODE_IP}:30061"), 2, false);
    assert!(remote.iter().all(|a| *a == Err(ErrorKind::TimedOut)), "no local endpoint: dropped: {remote:?}");
    // Traffic from the node itself short-circuits to all endpoints.
    let from_node = ask(&lab.node, &format!("{NODE_IP}:30061"), 5, false);
    assert_eq!(names(&from_node), set(&["b3"]));
}

#[test]
fn internal_traffic_policy_local_uses_local_endpoints_or_drops() {
    let mut lab = Lab::new("itp", "legacy");
    let spec = json!({"internalTrafficPolicy": "Local"});
    lab.change(&[
        service("local", "10.96.0.70", false, spec.clone(), json!({})),
        endpoints("local", &["b1", "b3"]),
        service("remote", "10.96.0.71", false, spec, json!({})),
        endpoints("remote", &["b3"]),
    ]);
    lab.full_sync();
    assert_eq!(names(&ask(lab.backend("b2"), "10.96.0.70:80", 20, false)), set(&["b1"]));
    let dropped = ask(lab.backend("b2"), "10.96.0.71:80", 2, false);
    assert!(dropped.iter().all(|a| *a == Err(ErrorKind::TimedOut)), "{dropped:?}");
}

#[test]
fn a_service_without_endpoints_refuses_connections() {
    let mut lab = Lab::new("rej", "legacy");
    let spec = json!({"type": "NodePort", "externalIPs": ["198.51.100.30"],
        "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30070}]});
    lab.change(&[service("empty", "10.96.0.80", false, spec, json!({}))]);
    let text = lab.full_sync();
    assert!(!text.contains("KUBE-SVC-"), "{text}");
    for to in ["10.96.0.80:80", "198.51.100.30:80", &format!("{NODE_IP}:30070")] {
        let a = ask(&lab.client, to, 1, false);
        assert_eq!(a, [Err(ErrorKind::ConnectionRefused)], "{to}");
    }
    assert_eq!(ask(lab.backend("b1"), "10.96.0.80:80", 1, false), [Err(ErrorKind::ConnectionRefused)]);
}

#[test]
fn a_backend_reaches_itself_through_its_service_with_masquerade() {
    let mut lab = Lab::new("hair", "legacy");
    lab.change(&[service("self", "10.96.0.90", true, json!({}), json!({})), endpoints("self", &["b1"])]);
    lab.full_sync();
    for udp in [false, true] {
        let a = ask(lab.backend("b1"), "10.96.0.90:80", 5, udp);
        // The hairpin rule masquerades: b1 sees the node's address, not itself.
        assert!(a.iter().all(|a| *a == Ok(("b1".into(), "10.244.1.1".into()))), "udp={udp}: {a:?}");
    }
}

/// A partial sync applied on top of a full one: the new endpoint takes the
/// traffic, the old endpoint's chain is deleted from the kernel, and a
/// removed service's chains are gone.
fn partial_syncs_move_traffic_and_delete_chains(flavour: &'static str) {
    let mut lab = Lab::new(&format!("part{}", &flavour[..3]), flavour);
    lab.change(&[
        service("moving", "10.96.0.100", false, json!({}), json!({})),
        endpoints("moving", &["b1"]),
        service("going", "10.96.0.101", false, json!({}), json!({})),
        endpoints("going", &["b2"]),
    ]);
    lab.full_sync();
    assert_eq!(names(&ask(&lab.client, "10.96.0.100:80", 5, false)), set(&["b1"]));
    let before = lab.save("nat");
    let changed = lab.change(&[endpoints("moving", &["b2"])]);
    let text = lab.partial_sync(&changed);
    assert_eq!(text.matches("\n-X KUBE-SEP-").count(), 1, "{text}");
    assert_eq!(names(&ask(&lab.client, "10.96.0.100:80", 10, false)), set(&["b2"]));
    let after = lab.save("nat");
    let seps = |t: &str| t.lines().filter(|l| l.starts_with(":KUBE-SEP-")).count();
    assert_eq!((seps(&before), seps(&after)), (2, 2), "one SEP replaced:\n{after}");
    assert!(after.contains("default/going:http"), "unchanged service untouched:\n{after}");

    let SourceEvent::Service(kube_proxy_rs::msgs::Change::Applied(going)) =
        service("going", "10.96.0.101", false, json!({}), json!({}))
    else {
        unreachable!()
    };
    let changed = lab.change(&[kube_proxy_rs::fixtures::deleted_service((*going).clone())]);
    lab.partial_sync(&changed);
    let after = lab.save("nat");
    assert!(!after.contains("default/going"), "{after}");
    assert_eq!(after.lines().filter(|l| l.starts_with(":KUBE-SVC-")).count(), 1, "{after}");
    assert_eq!(ask(&lab.client, "10.96.0.101:80", 1, false), [Err(ErrorKind::TimedOut)]);
    // A second full sync changes nothing that works.
    lab.full_sync();
    assert_eq!(names(&ask(&lab.client, "10.96.0.100:80", 5, false)), set(&["b2"]));
    let filter = lab.save("filter");
    for j in JUMPS.iter().chain(&KUBELET_JUMPS).filter(|j| j.table == "filter") {
        assert_eq!(filter.lines().filter(|l| *l == j.save_line()).count(), 1, "{} in\n{filter}", j.save_line());
    }
}

#[test]
fn partial_syncs_move_traffic_and_delete_chains_with_iptables_legacy() {
    partial_syncs_move_traffic_and_delete_chains("legacy");
}

#[test]
fn partial_syncs_move_traffic_and_delete_chains_with_iptables_nft() {
    partial_syncs_move_traffic_and_delete_chains("nft");
}

/// The demo cluster's full sync (what `--dry-run` prints in iptables mode)
/// restores into an empty node, with both flavours, and a partial sync
/// without changes restores on top.
#[test]
fn the_demo_clusters_full_sync_restores_into_an_empty_node() {
    let mut scan = kube_proxy_rs::actors::source::manifests::ManifestDir::new("config/demo").scan();
    assert!(scan.errors.is_empty(), "{:?}", scan.errors);
    let mut model = Model::new(IpFamily::V4, "demo-node");
    model.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
    model.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
    for e in scan.events.drain(..) {
        model.record(&e).unwrap_or_else(|e| panic!("{e}"));
    }
    model.apply();
    assert!(model.service_ports().count() > 5);
    let text = kube_proxy_rs::plan::iptables::dry_run(&model, lab_context());
    for flavour in ["legacy", "nft"] {
        let ns = Netns::new(&format!("ipm-demo-{flavour}"));
        let restore = |text: &str| ns.pipe(&[&format!("iptables-{flavour}-restore"), "-w", "5", "--noflush"], text);
        restore(&text);
        let mut planner = IptablesPlanner::new(lab_context());
        planner.full(&model, lab_context());
        restore(&planner.partial(&model, &[]));
        let saved = ns.ok(&[&format!("iptables-{flavour}-save")]);
        assert_eq!(saved.matches(":KUBE-PROXY-CANARY").count(), 3, "{saved}");
        assert!(saved.contains(":KUBE-SVC-"), "{saved}");
    }
}
