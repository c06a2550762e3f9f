//! nftables mode on the host kernel, in network namespaces of its own: the
//! `--dry-run --proxy-mode nftables` output loads with `nft -f` into an empty
//! namespace as is, and the planner's transactions (a full sync, then
//! partial syncs) carry TCP and UDP from an off-cluster client to backends
//! in other namespaces, as upstream's nftables proxier would.
//!
//! The lab is iptables mode's (`common::lab`): a node namespace (the rules
//! go there) routing between a client on 192.168.50.0/24 and backends b1,
//! b2 (this node's) and b3 ("other-node") on 10.244.N.0/24, each serving
//! TCP and UDP on 8080 and answering with its name and the source it saw.
//! Transactions are applied inside the node namespace with `nft -f -` in
//! upstream's ruleset (the planner alone; the daemon's own netlink path is
//! `nftables_daemon.rs`) and with our netlink codec in the `maps` ruleset:
//! nft 1.0.6 cannot add a rule that names an existing map whose `typeof`
//! data is `ip daddr . th dport` (it reads it back as "conflicting
//! protocols specified: ip vs. th"), which a partial sync of that ruleset
//! does when a count appears. The dry run still loads with `nft -f`.
//!
//! Every test runs in both rulesets (`upstream::…` and `maps::…`, see
//! `common::nft`'s `rulesets!`), with the same packets and expectations, and
//! ruleset-specific checks of what is written where the rulesets differ.
//!
//! Needs root, iproute2 and nft (package nftables); nothing is skipped.
//! Traffic stays inside the namespaces created here.

mod common;

use std::io::ErrorKind;
use std::time::Duration;

use common::lab::{self, endpoints, names, service, set, Answer, Backend, CLIENT_IP, NODE_IP};
use common::nft::{blocks, section};
use common::{bin, Netns};
use kube_proxy_rs::fixtures::{applied_slice, node, slice, Ep};
use kube_proxy_rs::kernel::nftables::NetlinkNftables;
use kube_proxy_rs::model::{Model, NodeInfo};
use kube_proxy_rs::msgs::nftables::Transaction;
use kube_proxy_rs::msgs::{ResourceKind, SourceEvent};
use kube_proxy_rs::net::IpFamily;
use kube_proxy_rs::plan::context::{LocalAddr, NodePortFilter};
use kube_proxy_rs::plan::local::LocalDetector;
use kube_proxy_rs::plan::nftables::{
    delete_stale, desired, desired_keeping, full_sync, nftables_context, KernelObjects, NftRuleset, NftablesContext,
    NftablesPlanner, NftablesSettings, STALE_CHAIN_DELAY,
};
use serde_json::{json, Value};

const NODE: &str = "node-a";
const DROP_WAIT: Duration = Duration::from_millis(800);
const BACKENDS: [&str; 3] = ["b1", "b2", "b3"];
/// The staged full sync's transaction size in the lab: small, so even a
/// few services' chains go in several transactions.
const LAB_STAGE_OPS: usize = 16;

fn demo(path: &str) -> String {
    format!("{}/config/{path}", env!("CARGO_MANIFEST_DIR"))
}

crate::rulesets!(
    dry_run_loads_into_an_empty_namespace_with_nft,
    cluster_ips_spread_reject_without_endpoints_and_drop_unallocated,
    node_ports_load_balancers_and_affinity,
    partial_syncs_change_the_kernel_service_by_service,
    the_daemon_runs_in_nftables_mode,
    traffic_policies_local_use_local_endpoints_or_drop,
    node_ports_and_external_ips_without_endpoints_refuse_connections,
    a_full_sync_over_the_kernels_table_repairs_it,
    ipv6_cluster_ips_use_the_ip6_table,
);

/// `--dry-run --proxy-mode nftables` on the demo cluster loads into a fresh
/// namespace with `nft -f` as one transaction, and `nft list table` shows
/// the ruleset's objects with the demo's services in them (upstream's: the
/// dry run is `tests/golden/demo-nftables.txt`).
fn dry_run_loads_into_an_empty_namespace_with_nft(ruleset: NftRuleset) {
    let ns = Netns::new(&format!("kpr-drynft-{ruleset}"));
    node_address(&ns);
    let args = [
        bin(),
        "--manifests".into(),
        demo("demo"),
        "--dry-run".into(),
        "--proxy-mode".into(),
        "nftables".into(),
        "--hostname-override".into(),
        "demo-node".into(),
        format!("--nftables-ruleset={ruleset}"),
    ];
    let out = ns.exec(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let v4 = section(&stdout, "# nftables").unwrap_or_else(|| panic!("no # nftables section in:\n{stdout}"));
    assert!(v4.starts_with("add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n"), "{v4}");
    if ruleset == NftRuleset::Upstream {
        let golden = std::fs::read_to_string(demo("../tests/golden/demo-nftables.txt")).expect("golden file");
        if v4 != golden {
            let path = std::env::temp_dir().join("demo-nftables.got.txt");
            let _ = std::fs::write(&path, v4.as_bytes());
            panic!("the dry run's IPv4 section differs from tests/golden/demo-nftables.txt; got {}", path.display());
        }
    }
    let target = Netns::new(&format!("kpr-drynft-t-{ruleset}"));
    target.pipe(&["nft", "-f", "-"], v4);
    let listed = target.ok(&["nft", "list", "table", "ip", "kube-proxy"]);
    let dispatch = match ruleset {
        NftRuleset::Upstream => "map service-ips {",
        NftRuleset::Maps => "map maps-cluster-endpoints {",
    };
    for want in [
        "comment \"rules for kube-proxy\"",
        "chain nat-prerouting {",
        "type nat hook prerouting priority dstnat; policy accept;",
        "type filter hook prerouting priority dstnat - 10; policy accept;",
        "chain services {",
        dispatch,
        "map no-endpoint-services {",
        "set cluster-ips {",
        "chain mark-for-masquerade {",
        "masquerade fully-random",
        "numgen random mod ",
        // The node's primary IP accepts NodePorts (nftables mode's default), loopback never.
        "elements = { 192.168.50.2 }",
    ] {
        assert!(listed.contains(want), "{want:?} not in:\n{listed}");
    }
    // Every chain and element of the dry run is in the kernel.
    for line in v4.lines().filter(|l| l.starts_with("add chain")) {
        let name = line.split(' ').nth(4).unwrap();
        assert!(listed.contains(&format!("chain {name} {{")), "{name} not in:\n{listed}");
    }
    let elements = v4.lines().filter(|l| l.starts_with("add element")).count();
    assert!(elements > 10, "the demo's services fill the maps:\n{v4}");
    if let Some(v6) = section(&stdout, "# nftables ipv6") {
        target.pipe(&["nft", "-f", "-"], v6);
        let listed = target.ok(&["nft", "list", "table", "ip6", "kube-proxy"]);
        assert!(listed.contains(dispatch) && listed.contains("ip6 daddr"), "{listed}");
    }
}

/// The demo node's address, on a veth pair inside `ns` (the host is not touched).
fn node_address(ns: &Netns) {
    for cmd in ["ip link add e0 type veth peer name e1", "ip addr add 192.168.50.2/24 dev e0", "ip link set e1 up"] {
        ns.ok(&cmd.split(' ').collect::<Vec<_>>());
    }
    ns.ok(&["ip", "link", "set", "e0", "up"]);
}

/// The node, an off-cluster client, three backends, the model and the
/// planner (on a virtual clock).
struct Lab {
    node: Netns,
    client: Netns,
    backends: Vec<Backend>,
    model: Model,
    ctx: NftablesContext,
    planner: NftablesPlanner,
    clock: Duration,
}

impl Lab {
    fn new(tag: &str, ruleset: NftRuleset) -> Lab {
        let short = &ruleset.name()[..1];
        let (node, client, backends) = lab::topology(&format!("nfm{short}-{tag}"), &BACKENDS);
        let mut model = Model::new(IpFamily::V4, NODE);
        model.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
        model.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
        let ctx = lab_context(ruleset);
        Lab { node, client, backends, model, planner: NftablesPlanner::new(ctx.clone()), ctx, clock: Duration::ZERO }
    }

    fn backend(&self, name: &str) -> &Netns {
        &self.backends.iter().find(|b| b.0 == name).expect("backend").1
    }

    fn change(&mut self, events: &[SourceEvent]) -> Vec<kube_proxy_rs::model::ServicePortName> {
        for e in events {
            self.model.record(e).unwrap_or_else(|e| panic!("{e}"));
        }
        self.model.apply().ports.into_iter().collect()
    }

    fn nft(&self, text: &str) {
        self.node.pipe(&["nft", "-f", "-"], text);
    }

    /// Applies `tx`: as `nft -f` input in upstream's ruleset, through our
    /// codec in the `maps` ruleset (see the module's doc).
    fn apply(&self, tx: &Transaction) {
        match self.ctx.ruleset {
            NftRuleset::Upstream => self.nft(&tx.to_string()),
            NftRuleset::Maps => {
                let (family, ops) = (tx.family, tx.ops.clone());
                self.node
                    .block_on(move || async move {
                        let nft = NetlinkNftables::new().expect("netfilter netlink socket");
                        nft.apply(family, "kube-proxy", &ops).await
                    })
                    .unwrap_or_else(|e| panic!("{e}\n{tx}"));
            }
        }
    }

    /// A full sync as the daemon sends it (the planner's first re-creates
    /// the base chains): staged, in transactions of at least
    /// [`LAB_STAGE_OPS`] ops; once confirmed the planner keeps each
    /// service port's digest and origin only, which the partial syncs
    /// after it render again. Returns every transaction's text.
    fn full_sync(&mut self) -> String {
        let staged = self.planner.full_staged(&self.model, self.ctx.clone(), &KernelObjects::default(), LAB_STAGE_OPS);
        let mut text = String::new();
        for tx in staged {
            self.apply(&tx);
            text.push_str(&tx.to_string());
        }
        self.planner.confirm_applied(self.clock);
        text
    }

    /// A partial sync of `changed`; a second later (virtual) the chains it
    /// left stale are deleted by a transaction of their own, as upstream.
    fn partial_sync(&mut self, changed: &[kube_proxy_rs::model::ServicePortName]) -> (String, Vec<String>) {
        let delta = self.planner.partial(&self.model, changed).expect("a full sync first");
        let text = delta.tx.to_string();
        if !delta.tx.is_empty() {
            self.apply(&delta.tx);
        }
        self.planner.confirm_applied(self.clock);
        self.clock += STALE_CHAIN_DELAY;
        if let Some(tx) = self.planner.delete_due(self.clock) {
            self.apply(&tx);
        }
        (text, delta.stale_chains)
    }

    fn list(&self) -> String {
        self.node.ok(&["nft", "list", "table", "ip", "kube-proxy"])
    }
}

/// What the daemon would compute for the lab's node: pods in 10.244.0.0/16,
/// NodePorts on the node's primary IP, ServiceCIDR 10.96.0.0/16.
fn lab_context(ruleset: NftRuleset) -> NftablesContext {
    let settings = NftablesSettings {
        family: IpFamily::V4,
        ruleset,
        node_name: NODE.into(),
        masquerade_all: false,
        masquerade_bit: 14,
        local: LocalDetector::Cidr("10.244.0.0/16".parse().unwrap()),
        node_ports: NodePortFilter::Primary,
        service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
    };
    let addrs = lab::node_addrs();
    nftables_context(&settings, &NodeInfo::from_node(&node(NODE, NODE_IP, "z1")), &addrs)
}

fn ask(ns: &Netns, to: &str, n: usize, udp: bool) -> Vec<Answer> {
    lab::ask(ns, to, n, udp, DROP_WAIT)
}

fn cluster_ips_spread_reject_without_endpoints_and_drop_unallocated(ruleset: NftRuleset) {
    let mut lab = Lab::new("cip", ruleset);
    lab.change(&[
        service("web", "10.96.0.10", true, json!({}), json!({})),
        endpoints("web", &BACKENDS),
        service("empty", "10.96.0.11", false, json!({}), json!({})),
    ]);
    lab.full_sync();
    let tcp = ask(&lab.client, "10.96.0.10:80", 45, false);
    assert_eq!(names(&tcp), set(&BACKENDS), "{tcp:?}");
    // Off-cluster clients are masqueraded (`ip saddr != 10.244.0.0/16`).
    assert!(tcp.iter().all(|a| a.as_ref().unwrap().1.starts_with("10.244.")), "{tcp:?}");
    let udp = ask(&lab.client, "10.96.0.10:80", 45, true);
    assert_eq!(names(&udp), set(&BACKENDS), "{udp:?}");
    // A pod is not masqueraded, except to itself (hairpin).
    let from_pod = ask(lab.backend("b3"), "10.96.0.10:80", 30, false);
    assert_eq!(names(&from_pod), set(&BACKENDS));
    for a in from_pod.iter().map(|a| a.as_ref().unwrap()) {
        assert_eq!(a.1 == "10.244.3.2", a.0 != "b3", "{a:?}");
    }
    // No endpoints: rejected (reject-chain); an undefined port of a
    // ClusterIP: rejected (cluster-ips-check); an unallocated address of
    // the ServiceCIDR: dropped.
    let empty = ask(&lab.client, "10.96.0.11:80", 2, false);
    assert!(empty.iter().all(|a| *a == Err(ErrorKind::ConnectionRefused)), "{empty:?}");
    let bad_port = ask(&lab.client, "10.96.0.10:81", 2, false);
    assert!(bad_port.iter().all(|a| *a == Err(ErrorKind::ConnectionRefused)), "{bad_port:?}");
    let unallocated = ask(&lab.client, "10.96.0.99:80", 2, false);
    assert!(unallocated.iter().all(|a| *a == Err(ErrorKind::TimedOut)), "{unallocated:?}");
}

fn node_ports_load_balancers_and_affinity(ruleset: NftRuleset) {
    let mut lab = Lab::new("np", ruleset);
    let lb = |node_port: u16, ranges: Value| {
        json!({"type": "LoadBalancer", "loadBalancerSourceRanges": ranges,
        "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": node_port}]})
    };
    let ingress = |ip: &str| json!({"loadBalancer": {"ingress": [{"ip": ip}]}});
    let sticky = json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 300}}});
    lab.change(&[
        service("open", "10.96.0.30", false, lb(30090, json!([])), ingress("203.0.113.10")),
        endpoints("open", &BACKENDS),
        service("allowed", "10.96.0.31", false, lb(30091, json!(["192.168.50.0/24"])), ingress("203.0.113.11")),
        endpoints("allowed", &BACKENDS),
        service("denied", "10.96.0.32", false, lb(30092, json!(["198.51.100.0/24"])), ingress("203.0.113.12")),
        endpoints("denied", &BACKENDS),
        service("sticky", "10.96.0.50", true, sticky, json!({})),
        endpoints("sticky", &BACKENDS),
    ]);
    let text = lab.full_sync();
    let fw_chains = text.lines().filter(|l| l.starts_with("add chain ip kube-proxy firewall-") && l.contains('/'));
    assert_eq!(fw_chains.count(), 2, "{text}");
    let np = ask(&lab.client, &format!("{NODE_IP}:30090"), 30, false);
    assert_eq!(names(&np), set(&BACKENDS), "{np:?}");
    assert!(np.iter().all(|a| a.as_ref().unwrap().1 != CLIENT_IP), "Cluster policy masquerades");
    assert_eq!(names(&ask(&lab.client, "203.0.113.10:80", 30, false)), set(&BACKENDS));
    assert_eq!(names(&ask(&lab.client, "203.0.113.11:80", 30, false)), set(&BACKENDS));
    let denied = ask(&lab.client, "203.0.113.12:80", 2, false);
    assert!(denied.iter().all(|a| *a == Err(ErrorKind::TimedOut)), "dropped by the firewall chain: {denied:?}");
    // NodePorts are not subject to the source ranges (as upstream).
    assert!(ask(&lab.client, &format!("{NODE_IP}:30092"), 3, false).iter().all(Result::is_ok));
    // ClientIP affinity: one backend per client, TCP and UDP.
    assert_eq!(names(&ask(&lab.client, "10.96.0.50:80", 20, false)).len(), 1);
    assert_eq!(names(&ask(&lab.client, "10.96.0.50:80", 20, true)).len(), 1);
    assert_eq!(names(&ask(lab.backend("b2"), "10.96.0.50:80", 10, false)).len(), 1);
    let listed = lab.list();
    let affinity = match ruleset {
        NftRuleset::Upstream => "set affinity-",
        NftRuleset::Maps => "set maps-cluster-affinity-300-slot-2",
    };
    assert!(listed.contains(affinity) && listed.contains("flags dynamic,timeout"), "{listed}");
}

fn partial_syncs_change_the_kernel_service_by_service(ruleset: NftRuleset) {
    let mut lab = Lab::new("part", ruleset);
    lab.change(&[
        service("web", "10.96.0.10", true, json!({}), json!({})),
        endpoints("web", &["b1", "b2"]),
        service("other", "10.96.0.12", false, json!({}), json!({})),
        endpoints("other", &["b3"]),
    ]);
    lab.full_sync();
    assert_eq!(names(&ask(&lab.client, "10.96.0.10:80", 30, false)), set(&["b1", "b2"]));
    // One endpoint swapped: upstream rewrites web's chains and no element;
    // the maps ruleset changes elements only.
    let changed = lab.change(&[endpoints("web", &["b1", "b3"])]);
    let (text, stale) = lab.partial_sync(&changed);
    assert!(!text.contains("other"), "{text}");
    match ruleset {
        NftRuleset::Upstream => {
            assert!(!text.contains("add element"), "{text}");
            assert_eq!(stale.len(), 2, "b2's endpoint chains (TCP and UDP): {stale:?}");
            assert!(!lab.list().contains(&stale[0]), "stale chain deleted");
        }
        NftRuleset::Maps => {
            assert!(!text.contains(" chain ") && !text.contains("add rule"), "{text}");
            assert!(text.contains("add element ip kube-proxy maps-cluster-endpoints { 10.96.0.10 . tcp . 80 . 1 : 10.244.3.2 . 8080 }"), "{text}");
            assert!(stale.is_empty(), "{stale:?}");
        }
    }
    assert_eq!(names(&ask(&lab.client, "10.96.0.10:80", 30, false)), set(&["b1", "b3"]));
    assert_eq!(names(&ask(&lab.client, "10.96.0.10:80", 30, true)), set(&["b1", "b3"]));
    // All endpoints gone: the ClusterIP moves to no-endpoint-services and rejects.
    let changed = lab.change(&[endpoints("web", &[])]);
    let (text, stale) = lab.partial_sync(&changed);
    let dispatch = match ruleset {
        NftRuleset::Upstream => "service-ips",
        NftRuleset::Maps => "maps-service-keys",
    };
    assert!(text.contains(&format!("delete element ip kube-proxy {dispatch} {{ 10.96.0.10 . tcp . 80 }}")), "{text}");
    assert!(text.contains("add element ip kube-proxy no-endpoint-services { 10.96.0.10 . tcp . 80 "), "{text}");
    assert!(!text.contains("cluster-ips"), "the ClusterIP stays: {text}");
    let stale_chains = match ruleset {
        NftRuleset::Upstream => 6,
        NftRuleset::Maps => 0,
    };
    assert_eq!(stale.len(), stale_chains, "upstream: both ports' service chains and endpoint chains: {stale:?}");
    let refused = ask(&lab.client, "10.96.0.10:80", 2, false);
    assert!(refused.iter().all(|a| *a == Err(ErrorKind::ConnectionRefused)), "{refused:?}");
    // Back, and the other service never stopped.
    let changed = lab.change(&[endpoints("web", &["b2"])]);
    lab.partial_sync(&changed);
    assert_eq!(names(&ask(&lab.client, "10.96.0.10:80", 10, false)), set(&["b2"]));
    assert_eq!(names(&ask(&lab.client, "10.96.0.12:80", 10, false)), set(&["b3"]));
    // What the kernel holds is what a full sync from scratch would write.
    let listed = lab.list();
    let fresh = Netns::new(&format!("nfm-part-fresh-{ruleset}"));
    let kept = &lab.planner.applied().expect("confirmed").shared.classes;
    fresh.pipe(&["nft", "-f", "-"], &desired_keeping(&lab.model, &lab.ctx, kept).dump());
    assert_eq!(blocks(&listed), blocks(&fresh.ok(&["nft", "list", "table", "ip", "kube-proxy"])), "{listed}");
}

/// The `maps` ruleset: a Service's endpoint count that no Service has but
/// the full sync wrote (every count up to the power of two above the
/// largest) is elements only; one above gets its chain, whose one rule is
/// the only one written that reads the endpoints map; a count left by its
/// last Service stays; the kernel sends the Service's connections to all
/// its endpoints throughout.
#[test]
fn maps_a_new_endpoint_count_is_elements_or_one_chain() {
    let mut lab = Lab::new("count", NftRuleset::Maps);
    lab.change(&[service("web", "10.96.0.10", false, json!({}), json!({})), endpoints("web", &["b1"])]);
    lab.full_sync();
    let changed = lab.change(&[endpoints("web", &["b1", "b2"])]);
    let (text, _) = lab.partial_sync(&changed);
    assert!(!text.contains("add rule") && !text.contains(" chain "), "counts 1 and 2 were written\n{text}");
    assert_eq!(names(&ask(&lab.client, "10.96.0.10:80", 30, false)), set(&["b1", "b2"]));
    let changed = lab.change(&[endpoints("web", &BACKENDS)]);
    let (text, _) = lab.partial_sync(&changed);
    assert!(text.contains("add chain ip kube-proxy maps-cluster-pick-3\n"), "{text}");
    assert_eq!(text.matches("map @maps-cluster-endpoints").count(), 1, "{text}");
    assert_eq!(names(&ask(&lab.client, "10.96.0.10:80", 40, false)), set(&BACKENDS));
    let changed = lab.change(&[endpoints("web", &["b3"])]);
    let (text, stale) = lab.partial_sync(&changed);
    assert!(!text.contains("add rule") && !text.contains(" chain ") && stale.is_empty(), "{text}");
    assert_eq!(names(&ask(&lab.client, "10.96.0.10:80", 10, false)), set(&["b3"]));
    assert!(lab.list().contains("chain maps-cluster-pick-3 {"), "{}", lab.list());
}

/// The daemon runs in nftables mode (`--proxy-mode nftables`): on the demo
/// cluster it writes the `ip kube-proxy` table through its netlink client
/// (the demo's services in it), and SIGTERM leaves it in place. The packet
/// tests of the running daemon are `tests/nftables_daemon.rs`.
fn the_daemon_runs_in_nftables_mode(ruleset: NftRuleset) {
    let ns = Netns::new(&format!("kpr-nftrun-{ruleset}"));
    node_address(&ns);
    let log = tempfile::NamedTempFile::new().expect("log file");
    let flag = format!("--nftables-ruleset={ruleset}");
    let args = ["--manifests", &demo("demo"), "--proxy-mode", "nftables", "--hostname-override", "demo-node", &flag];
    let dispatch = match ruleset {
        NftRuleset::Upstream => "map service-ips",
        NftRuleset::Maps => "map maps-cluster-endpoints",
    };
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, &bin()])
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(log.reopen().expect("log"))
        .stderr(log.reopen().expect("log"))
        .spawn()
        .expect("start kube-proxy-rs");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let listed = loop {
        let out = ns.exec(&["nft", "list", "table", "ip", "kube-proxy"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && text.contains(dispatch) && text.contains("elements = {") {
            break Some(text);
        }
        if std::time::Instant::now() > deadline || child.try_wait().expect("try_wait").is_some() {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let status = child.wait().expect("wait");
    let text = std::fs::read_to_string(log.path()).unwrap_or_default();
    let listed = listed.unwrap_or_else(|| panic!("no ip kube-proxy table with the demo's services; log:\n{text}"));
    assert!(listed.contains("comment \"rules for kube-proxy\""), "{listed}");
    assert!(status.success(), "SIGTERM: clean exit; log:\n{text}");
    assert!(!text.contains("not supported"), "{text}");
    assert!(ns.exec(&["nft", "list", "table", "ip", "kube-proxy"]).status.success(), "left in place");
}

fn traffic_policies_local_use_local_endpoints_or_drop(ruleset: NftRuleset) {
    let mut lab = Lab::new("pol", ruleset);
    let np = |port: u16| {
        json!({"type": "NodePort", "externalTrafficPolicy": "Local",
        "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": port}]})
    };
    let itp = json!({"internalTrafficPolicy": "Local"});
    lab.change(&[
        service("local", "10.96.0.60", false, np(30060), json!({})),
        endpoints("local", &["b1", "b3"]),
        service("remote", "10.96.0.61", false, np(30061), json!({})),
        endpoints("remote", &["b3"]),
        service("ilocal", "10.96.0.70", false, itp.clone(), json!({})),
        endpoints("ilocal", &["b1", "b3"]),
        service("iremote", "10.96.0.71", false, itp, json!({})),
        endpoints("iremote", &["b3"]),
    ]);
    let text = lab.full_sync();
    assert!(text.contains("no-endpoint-nodeports { tcp . 30061 comment \"default/remote:http\" : drop }"), "{text}");
    // eTP Local: outside clients reach the local endpoint only, unmasqueraded.
    let local = ask(&lab.client, &format!("{NODE_IP}:30060"), 20, false);
    assert_eq!(names(&local), set(&["b1"]));
    assert!(local.iter().all(|a| a.as_ref().unwrap().1 == CLIENT_IP), "source kept: {local:?}");
    let remote = ask(&lab.client, &format!("{NODE_IP}:30061"), 2, false);
    assert!(remote.iter().all(|a| *a == Err(ErrorKind::TimedOut)), "no local endpoint: dropped: {remote:?}");
    // Pods and the node itself short-circuit to every endpoint.
    assert_eq!(names(&ask(lab.backend("b2"), &format!("{NODE_IP}:30061"), 5, false)), set(&["b3"]));
    assert_eq!(names(&ask(&lab.node, &format!("{NODE_IP}:30061"), 5, false)), set(&["b3"]));
    // iTP Local: pods reach local endpoints only; none: dropped.
    assert_eq!(names(&ask(lab.backend("b2"), "10.96.0.70:80", 20, false)), set(&["b1"]));
    let dropped = ask(lab.backend("b2"), "10.96.0.71:80", 2, false);
    assert!(dropped.iter().all(|a| *a == Err(ErrorKind::TimedOut)), "{dropped:?}");
}

fn node_ports_and_external_ips_without_endpoints_refuse_connections(ruleset: NftRuleset) {
    let mut lab = Lab::new("rej", ruleset);
    let spec = json!({"type": "NodePort", "externalIPs": ["198.51.100.30"],
        "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30070}]});
    lab.change(&[service("empty", "10.96.0.80", false, spec, json!({}))]);
    let text = lab.full_sync();
    let service_chain = |l: &str| l.starts_with("add chain") && l.split(' ').nth(4).is_some_and(|n| n.contains('/'));
    assert!(!text.lines().any(service_chain), "no service chains: {text}");
    for to in ["10.96.0.80:80", "198.51.100.30:80", &format!("{NODE_IP}:30070")] {
        assert_eq!(ask(&lab.client, to, 1, false), [Err(ErrorKind::ConnectionRefused)], "{to}");
    }
    assert_eq!(ask(lab.backend("b1"), "10.96.0.80:80", 1, false), [Err(ErrorKind::ConnectionRefused)]);
}

/// A second full sync over the table in the kernel (as after a restart:
/// base chains re-created, containers reset, an unknown per-service chain
/// flushed) keeps traffic flowing.
fn a_full_sync_over_the_kernels_table_repairs_it(ruleset: NftRuleset) {
    let mut lab = Lab::new("full", ruleset);
    lab.change(&[service("web", "10.96.0.10", true, json!({}), json!({})), endpoints("web", &BACKENDS)]);
    lab.full_sync();
    lab.nft("add chain ip kube-proxy service-XXXXXXXX-gone/svc/tcp/http\n");
    let listed = lab.list();
    let names_of = |kind: &str| -> Vec<String> {
        let head = format!("\t{kind} ");
        listed
            .lines()
            .filter_map(|l| l.strip_prefix(head.as_str()))
            .map(|l| l.trim_end_matches(" {").to_string())
            .collect()
    };
    let kernel = KernelObjects { chains: names_of("chain"), sets: names_of("set") };
    assert!(kernel.chains.iter().any(|c| c.contains("gone")), "{kernel:?}");
    // The planner keeps what the kernel holds without its rules: a full sync renders the model again.
    let delta = full_sync(&desired(&lab.model, &lab.ctx), &kernel, true);
    assert_eq!(delta.stale_chains, ["service-XXXXXXXX-gone/svc/tcp/http"]);
    lab.apply(&delta.tx);
    lab.apply(&delete_stale(IpFamily::V4, &delta.stale_chains));
    assert!(!lab.list().contains("gone"));
    assert_eq!(names(&ask(&lab.client, "10.96.0.10:80", 30, false)), set(&BACKENDS));
    assert_eq!(names(&ask(&lab.client, "10.96.0.10:80", 30, true)), set(&BACKENDS));
}

/// The ip6 table: an IPv6 ClusterIP spread over the backends' IPv6
/// addresses, masquerading the off-cluster client.
fn ipv6_cluster_ips_use_the_ip6_table(ruleset: NftRuleset) {
    let (node_ns, client, backends) = lab::topology(&format!("nfm{}-v6", &ruleset.name()[..1]), &BACKENDS);
    let mut model = Model::new(IpFamily::V6, NODE);
    model.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
    model.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
    let spec = json!({"ipFamilies": ["IPv6"], "clusterIPs": ["fd00:96::10"]});
    model.record(&service("web", "fd00:96::10", true, spec, json!({}))).unwrap();
    let eps: Vec<Ep> = (1..=3).map(|n| kube_proxy_rs::fixtures::ep(&format!("fd00:244:{n}::2"), NODE)).collect();
    let mut sl = slice("default", "web-1", "web", &[("http", "TCP", 8080), ("dns", "UDP", 8080)], &eps);
    sl.address_type = "IPv6".into();
    model.record(&applied_slice(sl)).unwrap();
    model.apply();
    let settings = NftablesSettings {
        family: IpFamily::V6,
        ruleset,
        node_name: NODE.into(),
        masquerade_all: false,
        masquerade_bit: 14,
        local: LocalDetector::Cidr("fd00:244::/48".parse().unwrap()),
        node_ports: NodePortFilter::Primary,
        service_cidrs: vec!["fd00:96::/112".parse().unwrap()],
    };
    let addrs = [LocalAddr { ifname: "nc0".into(), ip: lab::NODE_IP6.parse().unwrap() }];
    let ctx = nftables_context(&settings, &NodeInfo::default(), &addrs);
    let rs = desired(&model, &ctx);
    node_ns.pipe(&["nft", "-f", "-"], &full_sync(&rs, &KernelObjects::default(), false).tx.to_string());
    assert!(ruleset == NftRuleset::Upstream || rs.dump().contains("dnat ip6 to ip6 daddr"), "{}", rs.dump());
    let tcp = lab::ask(&client, "[fd00:96::10]:80", 45, false, DROP_WAIT);
    assert_eq!(names(&tcp), set(&BACKENDS), "{tcp:?}");
    assert!(tcp.iter().all(|a| a.as_ref().unwrap().1.starts_with("fd00:244:")), "masqueraded: {tcp:?}");
    assert_eq!(names(&lab::ask(&client, "[fd00:96::10]:80", 45, true, DROP_WAIT)), set(&BACKENDS));
    let unallocated = lab::ask(&client, "[fd00:96::99]:80", 1, false, DROP_WAIT);
    assert_eq!(unallocated, [Err(ErrorKind::TimedOut)]);
    drop(backends);
}
