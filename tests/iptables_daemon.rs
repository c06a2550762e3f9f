//! The daemon binary in iptables mode, end to end: `kube-proxy-rs --config
//! FILE --manifests DIR` runs inside a network namespace playing the node,
//! programs that namespace's iptables, and real TCP and UDP packets from a
//! client namespace reach backend namespaces through ClusterIPs. Covers what
//! only the running daemon does: restarts, taking over an earlier run's (or
//! upstream kube-proxy's) rules, the canary, `--cleanup`, switching from IPVS
//! mode, the conntrack reconcile for removed UDP endpoints (and the UDP
//! flows of `common::conntrack`, as in `nftables_daemon`), and partial syncs.
//!
//! The lab, built per test (namespace names end in the test process's pid;
//! every test has its own tag, so tests run in parallel):
//! ```text
//!  client 192.168.50.10 ──veth── 192.168.50.1 node ── 10.244.1.1 ──veth── 10.244.1.2 b1
//!                              (daemon runs here) ── 10.244.2.1 ──veth── 10.244.2.2 b2
//!                            up0 172.31.0.1 (dead-end uplink, default route)
//! ```
//! The node forwards (`ip_forward=1`); its default route points into a
//! veth pair with nobody behind it, so a ClusterIP without DNAT rules is
//! forwarded into nothing (the client times out) rather than unroutable.
//! Each backend runs a TCP and a UDP server on port 8080 (`common::lab`:
//! threads that `setns(2)` into its namespace) answering every line or
//! datagram with `<backend> <source IP it saw>`; TCP connections stay open,
//! so one connection can be used across a daemon restart. Clients run on threads
//! in the client namespace (`Netns::run`); sockets keep their namespace.
//!
//! The daemon: a config file (mode iptables, hostnameOverride `node-a`,
//! clusterCIDR 10.244.0.0/16, minSyncPeriod 0s, the syncPeriod the test
//! needs) and a manifests directory (a temp dir) holding the Node and one
//! JSON file per Service with its EndpointSlice. Files are replaced with
//! `rename(2)` so the daemon's inotify watch never reads half a file. The
//! daemon is started with `ip netns exec NODE kube-proxy-rs ...` (which
//! execs, so the child's pid is the daemon's), stdout and stderr go to a
//! log file that is printed when a test fails, and it is stopped with
//! SIGTERM (exit code 0 asserted); a guard SIGTERMs (then SIGKILLs) a
//! daemon a panicking test left running. Its metrics server keeps the
//! default 127.0.0.1:10249 and healthz 0.0.0.0:10256: each daemon has its
//! own namespace, hence its own loopback, so ports never collide. Tests
//! read `/dashboard/data` (the coordinator's recent syncs: generation,
//! full or partial) and `/metrics` from a thread inside the node namespace.
//!
//! iptables flavour: the daemon runs whatever `iptables` is on its PATH;
//! each lab puts a directory of symlinks first on the daemon's PATH
//! (`iptables` -> `iptables-legacy` or `iptables-nft`, and the -save,
//! -restore and ip6tables ones), and the test reads the kernel with the same
//! flavour's tools. Some tests run with both.
//!
//! Not covered here: IPVS itself and the kube-ipvs0 dummy link (this host
//! has neither the ip_vs module nor dummy links); the IPVS → iptables test
//! creates IPVS mode's iptables chains and ipsets only.
//!
//! Needs root, iproute2, ipset and iptables-legacy/iptables-nft with the
//! statistic, comment, addrtype, conntrack and mark matches; a missing tool
//! fails the test, nothing is skipped. All traffic stays inside the
//! namespaces created here.

mod common;

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{
    self, create_items, http_exchange, http_exchange_with, http_get, status_kb, wait_for, Daemon, SyncRec,
};
use common::lab::{
    self, addr, names, set, udp_exchange, Answer, Backend, Conn, Probe, Probes, BACKEND_PORT, NODE_IP, NODE_IP6,
};
use common::{bin, conntrack, Netns};
use kube_proxy_rs::kernel::iptables::CANARY_INTERVAL;
use kube_proxy_rs::kernel::nfacct::NetlinkNfacct;
use kube_proxy_rs::plan::iptables::{is_service_chain, JUMPS, KUBELET_JUMPS};
use serde_json::{json, Value};

const NODE: &str = "node-a";
/// Upstream's nfacct objects.
const NFACCT_INVALID: &str = "ct_state_invalid_dropped_pkts";
const NFACCT_LOCALHOST: &str = "localhost_nps_accepted_pkts";
/// Upstream's metrics of them.
const METRIC_INVALID: &str = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total";
const METRIC_LOCALHOST: &str = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total";
/// How long a client waits before calling an exchange dropped.
const DROP_WAIT: Duration = Duration::from_millis(700);
/// How long the daemon may take to start and finish its first sync.
const START_WAIT: Duration = Duration::from_secs(15);
/// How long a manifest change may take to show in traffic (inotify
/// debounce of 100 ms, one sync, one iptables-restore).
const CHANGE_WAIT: Duration = Duration::from_secs(5);

// ------------------------------------------------------------------ the lab

/// One `iptables` flavour, for the daemon (through its PATH) and the test.
#[derive(Clone, Copy, Debug)]
enum Flavour {
    Legacy,
    Nft,
}

impl Flavour {
    fn name(self) -> &'static str {
        match self {
            Flavour::Legacy => "legacy",
            Flavour::Nft => "nft",
        }
    }

    fn tool(self, base: &str, suffix: &str) -> String {
        format!("{base}-{}{suffix}", self.name())
    }
}

/// The node, a client, backends, the config file and the manifests.
struct Lab {
    node: Netns,
    client: Netns,
    /// Backend namespaces and their servers, kept running until the lab drops.
    _backends: Vec<Backend>,
    flavour: Flavour,
    dir: tempfile::TempDir,
    /// Daemons started so far (names their log files).
    started: usize,
}

impl Lab {
    fn new(tag: &str, flavour: Flavour, backends: &[&'static str]) -> Lab {
        let (node, client, list) = lab::topology(&format!("ipd-{tag}"), backends);
        let dir = tempfile::tempdir().expect("tempdir");
        let lab = Lab { node, client, _backends: list, flavour, dir, started: 0 };
        std::fs::create_dir(lab.manifests()).unwrap();
        kube_proxy_rs::bench::daemon_run::iptables_shims(&lab.shims(), flavour.name()).expect("iptables shims");
        lab.config("iptables", "30s");
        lab.put("node", &node_manifest());
        lab
    }

    fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    fn shims(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    /// Writes the config file: `mode` with `sync_period` (and minSyncPeriod 0s).
    fn config(&self, mode: &str, sync_period: &str) {
        let text = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\n\
             hostnameOverride: {NODE}\nclusterCIDR: 10.244.0.0/16\n\
             iptables:\n  syncPeriod: {sync_period}\n  minSyncPeriod: 0s\n\
             ipvs:\n  syncPeriod: {sync_period}\n  minSyncPeriod: 0s\n"
        );
        std::fs::write(self.config_path(), text).unwrap();
    }

    /// Adds `featureGates` with `gates` to the config file.
    fn feature_gates(&self, gates: &[(&str, bool)]) {
        let mut text = std::fs::read_to_string(self.config_path()).unwrap();
        text.push_str("featureGates:\n");
        for (name, on) in gates {
            text.push_str(&format!("  {name}: {on}\n"));
        }
        std::fs::write(self.config_path(), text).unwrap();
    }

    /// Writes manifest `<name>.json` atomically (written aside, then renamed).
    fn put(&self, name: &str, value: &Value) {
        let tmp = self.dir.path().join(format!("{name}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(value).unwrap()).unwrap();
        std::fs::rename(&tmp, self.manifests().join(format!("{name}.json"))).unwrap();
    }

    fn remove(&self, name: &str) {
        std::fs::remove_file(self.manifests().join(format!("{name}.json"))).unwrap();
    }

    /// The daemon's PATH: the flavour's shims first.
    fn path_env(&self) -> String {
        format!("{}:{}", self.shims().display(), std::env::var("PATH").unwrap_or_default())
    }

    /// `kube-proxy-rs ARGS` in the node namespace, run to completion.
    fn run_binary(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.node.name, &bin()])
            .args(args)
            .env("PATH", self.path_env())
            .env("XTABLES_LOCKFILE", self.dir.path().join("xtables.lock"))
            .output()
            .expect("run kube-proxy-rs")
    }

    /// Starts the daemon in the node namespace with the lab's config and manifests.
    fn start(&mut self) -> Daemon {
        let manifests = self.manifests();
        self.start_with(&["--manifests".as_ref(), manifests.as_os_str()])
    }

    /// Starts the daemon in the node namespace with the lab's config and `source` arguments.
    fn start_with(&mut self, source: &[&std::ffi::OsStr]) -> Daemon {
        self.started += 1;
        let log = self.dir.path().join(format!("daemon-{}.log", self.started));
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let config = self.config_path();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.node.name, &bin(), "--config"])
            .arg(&config)
            .args(source)
            .env("PATH", self.path_env())
            // A lock of this lab's own: iptables-legacy takes one host-wide
            // lock for every namespace, and the labs run in parallel (one
            // restores 6,000 services); each lab's tables are its own anyway.
            .env("XTABLES_LOCKFILE", self.dir.path().join("xtables.lock"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start kube-proxy-rs");
        Daemon { child: Some(child), log, node: self.node.name.clone() }
    }

    /// `iptables` of the lab's flavour in the node namespace; panics unless it succeeds.
    fn ipt(&self, args: &[&str]) -> String {
        let tool = self.flavour.tool("iptables", "");
        let mut all = vec![tool.as_str(), "-w", "5"];
        all.extend_from_slice(args);
        self.node.ok(&all)
    }

    /// `iptables-save` (all tables, or `-t TABLE`) of the lab's flavour in the node.
    fn save(&self, table: Option<&str>) -> String {
        let tool = self.flavour.tool("iptables", "-save");
        match table {
            Some(t) => self.node.ok(&[&tool, "-t", t]),
            None => self.node.ok(&[&tool]),
        }
    }

    /// `iptables-restore --noflush` of the lab's flavour in the node.
    fn restore(&self, text: &str) {
        let tool = self.flavour.tool("iptables", "-restore");
        self.node.pipe(&[&tool, "-w", "5", "--noflush"], text);
    }

    /// `n` exchanges with `to` from the client, each on a new connection (or socket).
    fn ask(&self, to: &str, n: usize, udp: bool) -> Vec<Answer> {
        lab::ask(&self.client, to, n, udp, DROP_WAIT)
    }

    /// Waits until a round of exchanges with `to` (8 per wanted backend,
    /// each on a new connection or socket) all succeed and, together, reach
    /// exactly the backends `want`.
    fn wait_traffic(&self, to: &str, udp: bool, want: &[&str], timeout: Duration) {
        let n = 8 * want.len();
        wait_for(&format!("{to} ({}) to reach {want:?}", if udp { "udp" } else { "tcp" }), timeout, || {
            let got = self.ask(to, n, udp);
            if got.iter().all(Result::is_ok) && names(&got) == set(want) {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        });
    }

    fn dashboard(&self) -> Result<Value, String> {
        let body = http_get(&self.node, "/dashboard/data")?;
        serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
    }

    /// The daemon's recent syncs, newest first, once the coordinator answers.
    fn syncs(&self) -> Result<Vec<SyncRec>, String> {
        daemon::syncs(&self.node)
    }

    /// Waits for the first sync after generation `after`; returns it.
    /// Panics if it (or any later one) failed, or the daemon exited.
    fn wait_sync(&self, daemon: &mut Daemon, after: u64, timeout: Duration) -> SyncRec {
        wait_for(&format!("a sync after generation {after}"), timeout, || {
            daemon.assert_running();
            let syncs = self.syncs()?;
            let new: Vec<&SyncRec> = syncs.iter().filter(|s| s.generation > after).collect();
            assert!(new.iter().all(|s| s.failed == 0), "a sync failed: {syncs:?}");
            new.into_iter().min_by_key(|s| s.generation).cloned().ok_or_else(|| format!("{syncs:?}"))
        })
    }

    /// Starts the daemon and waits for its first sync (full and successful).
    fn start_synced(&mut self) -> Daemon {
        let mut d = self.start();
        let first = self.wait_sync(&mut d, 0, START_WAIT);
        assert!(first.full, "the first sync is full: {first:?}");
        d
    }

    /// `/metrics`: the sum of `family`'s samples (`ip_family="IPv4"`) named
    /// `name`; `None` if there is none (a metric family without samples yet).
    fn family_metric(&self, name: &str, family: &str) -> Option<f64> {
        daemon::family_metric(&self.node, name, family)
    }

    /// `/metrics`: the value of the unlabelled sample `name`, if any.
    fn plain_metric(&self, name: &str) -> Option<f64> {
        let text = http_get(&self.node, "/metrics").unwrap_or_else(|e| panic!("/metrics: {e}"));
        let line = text.lines().find(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ')))?;
        Some(line.rsplit(' ').next().unwrap().parse().unwrap_or_else(|e| panic!("{line}: {e}")))
    }

    /// The node namespace's nfacct objects `names` (`None`: no such object):
    /// their packet counts.
    fn nfacct_packets(&self, names: &[&'static str]) -> Vec<Option<u64>> {
        let names = names.to_vec();
        self.node.block_on(move || async move {
            let nfacct = NetlinkNfacct::new().expect("netfilter netlink socket");
            let mut out = Vec::new();
            for name in names {
                out.push(nfacct.get(name).await.expect("nfacct get").map(|c| c.packets));
            }
            out
        })
    }

    /// Creates upstream's two nfacct objects in the node (as an earlier
    /// run, ours or upstream's, leaves them).
    fn create_nfacct_objects(&self) {
        let results = self.node.block_on(|| async {
            let nfacct = NetlinkNfacct::new().expect("netfilter netlink socket");
            nfacct.ensure(&[NFACCT_INVALID, NFACCT_LOCALHOST]).await
        });
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }

    /// Makes the daemon's `iptables-restore` and `ip6tables-restore` refuse
    /// every input using the nfacct match, as on a kernel with nfnetlink_acct
    /// but without xt_nfacct (kubernetes issue 142068); other input goes to
    /// the lab flavour's tool.
    fn refuse_nfacct_match(&self) {
        use std::os::unix::fs::PermissionsExt;
        for base in ["iptables", "ip6tables"] {
            let real = which(&self.flavour.tool(base, "-restore"));
            let shim = self.shims().join(format!("{base}-restore"));
            std::fs::remove_file(&shim).unwrap();
            let script = format!(
                "#!/bin/sh\ninput=$(cat)\nif printf '%s\\n' \"$input\" | grep -q -- '-m nfacct'; then\n  \
                 echo \"{base}-restore: line 2 failed (no xt_nfacct)\" >&2\n  exit 1\nfi\n\
                 printf '%s\\n' \"$input\" | exec {} \"$@\"\n",
                real.display()
            );
            std::fs::write(&shim, script).unwrap();
            std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    /// `ip6tables-save` of the lab's flavour in the node.
    fn save6(&self) -> String {
        self.node.ok(&[&self.flavour.tool("ip6tables", "-save")])
    }

    /// A dual-stack Node, and a cluster CIDR per family in the config, as a
    /// dual-stack cluster's kube-proxy is configured.
    fn dual_stack(&self) {
        self.put("node", &dual_stack_node_manifest());
        let config = std::fs::read_to_string(self.config_path()).unwrap();
        let config = config.replace("clusterCIDR: 10.244.0.0/16", "clusterCIDR: 10.244.0.0/16,fd00:244::/48");
        std::fs::write(self.config_path(), config).unwrap();
    }

    /// Asserts each iptables-mode jump from a built-in chain (kubelet's included) is there exactly once.
    fn assert_jumps_once(&self, when: &str) {
        let (nat, filter) = (self.save(Some("nat")), self.save(Some("filter")));
        for j in JUMPS.iter().chain(&KUBELET_JUMPS) {
            let saved = if j.table == "nat" { &nat } else { &filter };
            assert_eq!(count(saved, &j.save_line()), 1, "{when}: {} in\n{saved}", j.save_line());
        }
    }
}

crate::impl_daemon_lab!(Lab);

/// The absolute path of `tool` on PATH.
fn which(tool: &str) -> PathBuf {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{tool} not found on PATH"))
}

fn count(haystack: &str, line: &str) -> usize {
    haystack.lines().filter(|l| *l == line).count()
}

/// The chains `iptables-save` text declares.
fn chains(saved: &str) -> BTreeSet<String> {
    saved.lines().filter_map(|l| l.strip_prefix(':')).filter_map(|l| l.split(' ').next()).map(String::from).collect()
}

// ---------------------------------------------------------------- manifests

fn node_manifest() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]},
    })
}

/// Service `default/<name>` at `cluster_ip`, ports `http` 80/TCP and `dns`
/// 80/UDP to 8080, and its EndpointSlice with the named backends (ready,
/// on this node).
fn service_manifest(name: &str, cluster_ip: &str, backends: &[&str]) -> Value {
    let endpoints: Vec<Value> = backends
        .iter()
        .map(|b| {
            let n: usize = b[1..].parse().unwrap();
            json!({"addresses": [format!("10.244.{n}.2")], "conditions": {"ready": true, "serving": true,
                "terminating": false}, "nodeName": NODE})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
        "items": [
            {
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                    "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                    "ports": [
                        {"name": "http", "protocol": "TCP", "port": 80, "targetPort": BACKEND_PORT},
                        {"name": "dns", "protocol": "UDP", "port": 80, "targetPort": BACKEND_PORT},
                    ],
                },
            },
            {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{name}-abcde"), "namespace": "default",
                    "labels": {"kubernetes.io/service-name": name,
                        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
                "addressType": "IPv4",
                "ports": [
                    {"name": "http", "protocol": "TCP", "port": BACKEND_PORT},
                    {"name": "dns", "protocol": "UDP", "port": BACKEND_PORT},
                ],
                "endpoints": endpoints,
            },
        ],
    })
}

/// The Node with an address of each family.
fn dual_stack_node_manifest() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        "spec": {"podCIDRs": ["10.244.0.0/16", "fd00:244::/48"]},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP},
            {"type": "InternalIP", "address": NODE_IP6}]},
    })
}

/// Someone else's rules in the node: a chain of their own in filter and nat,
/// each with a rule, jumped to from a built-in chain. Returns their
/// `iptables-save` lines, which nothing of ours may touch.
fn add_foreign_rules(lab: &Lab) -> Vec<(&'static str, &'static str)> {
    lab.ipt(&["-t", "filter", "-N", "MY-CHAIN"]);
    lab.ipt(&["-t", "filter", "-A", "MY-CHAIN", "-s", "198.51.100.7/32", "-j", "DROP"]);
    lab.ipt(&["-t", "filter", "-A", "INPUT", "-j", "MY-CHAIN"]);
    lab.ipt(&["-t", "nat", "-N", "MY-NAT"]);
    lab.ipt(&["-t", "nat", "-A", "MY-NAT", "-d", "203.0.113.9/32", "-j", "RETURN"]);
    lab.ipt(&["-t", "nat", "-A", "PREROUTING", "-j", "MY-NAT"]);
    vec![
        ("filter", ":MY-CHAIN - [0:0]"),
        ("filter", "-A MY-CHAIN -s 198.51.100.7/32 -j DROP"),
        ("filter", "-A INPUT -j MY-CHAIN"),
        ("nat", ":MY-NAT - [0:0]"),
        ("nat", "-A MY-NAT -d 203.0.113.9/32 -j RETURN"),
        ("nat", "-A PREROUTING -j MY-NAT"),
    ]
}

fn assert_foreign_rules_intact(lab: &Lab, foreign: &[(&str, &str)], when: &str) {
    for (table, line) in foreign {
        let saved = lab.save(Some(table));
        // Chain declarations carry packet counters: compare the name only.
        let n = match line.strip_suffix(" - [0:0]") {
            Some(decl) => saved.lines().filter(|l| l.starts_with(&format!("{decl} "))).count(),
            None => count(&saved, line),
        };
        assert_eq!(n, 1, "{when}: foreign {line:?} once in {table}:\n{saved}");
    }
}

/// The sections of `--dry-run` output (`# name` headings), by heading.
fn dry_run_sections(out: &str) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in out.lines() {
        if let Some(head) = line.strip_prefix("# ") {
            sections.push((head.to_string(), String::new()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    sections
}

fn dry_run(lab: &Lab) -> Vec<(String, String)> {
    let config = lab.config_path();
    let manifests = lab.manifests();
    let out = lab.run_binary(&[
        "--config",
        config.to_str().unwrap(),
        "--manifests",
        manifests.to_str().unwrap(),
        "--dry-run",
    ]);
    assert!(out.status.success(), "--dry-run: {}", String::from_utf8_lossy(&out.stderr));
    dry_run_sections(&String::from_utf8_lossy(&out.stdout))
}

fn section<'a>(sections: &'a [(String, String)], head: &str) -> &'a str {
    &sections.iter().find(|(h, _)| h.starts_with(head)).unwrap_or_else(|| panic!("no # {head} in {sections:?}")).1
}

/// The node's conntrack entries of UDP flows to `service_ip` from source
/// port `sport`: the address each one's replies come from (its endpoint).
fn udp_flows(lab: &Lab, service_ip: &str, sport: u16) -> Vec<String> {
    let out = lab.node.ok(&["conntrack", "-L", "-p", "udp", "--orig-dst", service_ip]);
    out.lines()
        .filter(|l| l.split_whitespace().find(|w| w.starts_with("sport=")) == Some(&format!("sport={sport}")))
        .filter_map(|l| l.split_whitespace().filter_map(|w| w.strip_prefix("src=")).nth(1))
        .map(String::from)
        .collect()
}

// -------------------------------------------------------------------- tests

const WEB: &str = "10.96.0.10:80";

/// (1) SIGTERM leaves the kernel as it is and a new daemon adopts it: an
/// established TCP connection through a ClusterIP keeps exchanging data
/// while no daemon runs and after the new one's first (full) sync; new
/// connections work throughout, and an endpoint added while no daemon ran
/// is picked up by the new one.
#[test]
fn an_established_connection_survives_a_daemon_restart() {
    let mut lab = Lab::new("rst", Flavour::Nft, &["b1", "b2"]);
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1"]));
    let daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let mut conn = lab.client.run(|| Conn::open(addr(WEB), DROP_WAIT)).expect("connect through the ClusterIP");
    let first = conn.exchange().expect("first exchange");
    // Off-cluster clients are masqueraded to the node's address toward b1.
    assert_eq!(first, ("b1".to_string(), "10.244.1.1".to_string()));

    daemon.stop();
    assert_eq!(conn.exchange(), Ok(first.clone()), "no daemon: the connection still works");
    assert_eq!(names(&lab.ask(WEB, 3, false)), set(&["b1"]), "no daemon: new connections still work");
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1", "b2"]));

    let mut second = lab.start_synced();
    assert_eq!(conn.exchange(), Ok(first.clone()), "after the new daemon's full sync");
    lab.wait_traffic(WEB, false, &["b1", "b2"], CHANGE_WAIT);
    assert_eq!(conn.exchange(), Ok(first), "after the new daemon's full sync and traffic");
    lab.assert_jumps_once("after a restart");
    second.assert_running();
    second.stop();
}

/// (2) Take-over: the node has an earlier run's rules (those upstream
/// kube-proxy writes: our `--dry-run` output for a service `gone` that no
/// longer exists — a full sync on an empty node, jumps from the built-in
/// chains included — restored with `iptables-restore --noflush`) and
/// someone else's chains and rules. The daemon's first sync deletes gone's
/// KUBE-SVC/KUBE-SEP chains and its KUBE-SERVICES rule, leaves the foreign
/// ones as they were, and every jump to our chains exists exactly once —
/// also after a restart.
fn take_over(flavour: Flavour, tag: &str) {
    let mut lab = Lab::new(tag, flavour, &["b1", "b2"]);
    lab.put("gone", &service_manifest("gone", "10.96.0.99", &["b2"]));
    let earlier = section(&dry_run(&lab), "iptables").to_string();
    assert!(earlier.contains("--nfacct-name"), "the dry run counts as the daemon will: {earlier}");
    lab.create_nfacct_objects();
    let stale: BTreeSet<String> = chains(&earlier).into_iter().filter(|c| is_service_chain(c)).collect();
    assert!(stale.iter().any(|c| c.starts_with("KUBE-SVC-")) && stale.iter().any(|c| c.starts_with("KUBE-SEP-")));
    lab.restore(&earlier);
    lab.assert_jumps_once("the earlier run's state");
    lab.wait_traffic("10.96.0.99:80", false, &["b2"], CHANGE_WAIT);
    let foreign = add_foreign_rules(&lab);

    lab.remove("gone");
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1"]));
    let daemon = lab.start_synced();
    let nat = lab.save(Some("nat"));
    let left: Vec<&String> = stale.iter().filter(|c| chains(&nat).contains(*c)).collect();
    assert!(left.is_empty(), "stale chains {left:?} left in\n{nat}");
    assert!(!nat.contains("default/gone"), "{nat}");
    assert!(chains(&nat).iter().any(|c| c.starts_with("KUBE-SVC-")), "web's chain: {nat}");
    assert_foreign_rules_intact(&lab, &foreign, "after the first sync");
    lab.assert_jumps_once("after the first sync");
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let dropped = lab.ask("10.96.0.99:80", 1, false);
    assert_eq!(dropped, [Err(ErrorKind::TimedOut)], "gone's ClusterIP has no DNAT any more");
    daemon.stop();

    let daemon = lab.start_synced();
    assert_foreign_rules_intact(&lab, &foreign, "after a restart");
    lab.assert_jumps_once("after a restart");
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    daemon.stop();
}

#[test]
fn take_over_removes_stale_chains_keeps_foreign_ones_with_iptables_legacy() {
    take_over(Flavour::Legacy, "tkl");
}

#[test]
fn take_over_removes_stale_chains_keeps_foreign_ones_with_iptables_nft() {
    take_over(Flavour::Nft, "tkn");
}

/// (3) Canary: with a syncPeriod (60 s) far longer than the canary interval
/// (10 s), someone flushes and deletes `tables` (a firewalld restart does
/// this). The canary check notices within its interval, the full resync
/// that follows puts everything back (jumps included), and new connections
/// through the ClusterIP work again — all within the canary interval plus
/// a little. `delete`: the chains are deleted too (`-X`); without it only
/// flushed (the canary chains stay; the check finds our jumps gone).
fn canary(flavour: Flavour, tag: &str, tables: &[&str], delete: bool) {
    let mut lab = Lab::new(tag, flavour, &["b1"]);
    lab.config("iptables", "60s");
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1"]));
    let mut daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let before = lab.syncs().expect("syncs");
    let last = before[0].generation;

    let tool = flavour.tool("iptables", "");
    let x = if delete { "-X" } else { "-Z" };
    let mut script: Vec<String> =
        tables.iter().map(|t| format!("{tool} -w 5 -t {t} -F && {tool} -w 5 -t {t} {x}")).collect();
    script.extend(tables.iter().map(|t| format!("{tool}-save -t {t}")));
    let flushed = Instant::now();
    let after_flush = lab.node.ok(&["sh", "-c", &script.join(" && ")]);
    let ours = if delete { "KUBE-" } else { "-j KUBE-" };
    assert!(!after_flush.contains(ours), "flushed: {after_flush}");

    let bound = CANARY_INTERVAL + Duration::from_secs(3);
    let resync = lab.wait_sync(&mut daemon, last, bound);
    assert!(resync.full, "drift gives a full resync: {resync:?}");
    lab.wait_traffic(WEB, false, &["b1"], bound.saturating_sub(flushed.elapsed()).max(Duration::from_millis(1)));
    let took = flushed.elapsed();
    assert!(took <= bound, "repaired after {took:?}, more than {bound:?}");
    lab.assert_jumps_once("after the repair");
    assert_eq!(count(&lab.save(None), ":KUBE-PROXY-CANARY - [0:0]"), 3);
    let log = daemon.stop();
    assert!(log.contains("drift detected"), "{log}");
}

#[test]
fn a_flushed_nat_table_is_repaired_by_the_canary_with_iptables_nft() {
    canary(Flavour::Nft, "cnn", &["nat"], true);
}

#[test]
fn a_nat_table_flushed_without_deleting_chains_is_repaired_with_iptables_legacy() {
    canary(Flavour::Legacy, "cnf", &["nat"], false);
}

#[test]
fn flushed_mangle_nat_and_filter_tables_are_repaired_by_the_canary_with_iptables_legacy() {
    canary(Flavour::Legacy, "cnl", &["mangle", "nat", "filter"], true);
}

/// A manifest file rewritten in place in two writes, the first of which is
/// valid on its own and lacks the second Service (issue 15's half-written
/// file): the daemon reads the file only once it has been quiet for the
/// settle time, so the second Service keeps answering throughout and no
/// sync deletes it.
#[test]
fn a_manifest_rewritten_in_place_in_two_writes_deletes_nothing() {
    let mut lab = Lab::new("hlf", Flavour::Legacy, &["b1", "b2"]);
    lab.config("iptables", "60s");
    let web = service_manifest("web", "10.96.0.10", &["b1"]);
    let api = service_manifest("api", "10.96.0.11", &["b2"]);
    let text =
        |parts: &[&Value]| parts.iter().map(|v| serde_json::to_string_pretty(v).unwrap() + "\n").collect::<String>();
    let file = lab.manifests().join("both.json");
    let tmp = lab.dir.path().join("both.json.tmp");
    std::fs::write(&tmp, text(&[&web, &api])).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    lab.wait_traffic("10.96.0.11:80", false, &["b2"], CHANGE_WAIT);
    let last = lab.syncs().expect("syncs")[0].generation;
    // The first write (web only), then the rest 300 ms later, in place.
    std::fs::write(&file, text(&[&web])).unwrap();
    let half_written = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let during = lab.ask("10.96.0.11:80", 4, false);
    std::fs::write(&file, text(&[&web, &api])).unwrap();
    assert!(during.iter().all(Result::is_ok), "api answered while the file was half written: {during:?}");
    std::thread::sleep(Duration::from_secs(2));
    lab.wait_traffic("10.96.0.11:80", false, &["b2"], CHANGE_WAIT);
    let syncs = lab.syncs().expect("syncs");
    let new: Vec<&SyncRec> = syncs.iter().filter(|s| s.generation > last).collect();
    assert!(new.iter().all(|s| s.ports_changed == 0), "no sync changed a service: {new:?}");
    assert!(half_written.elapsed() >= Duration::from_secs(2));
    daemon.stop();
}

/// A quiet cluster: each syncPeriod brings a periodic partial sync that
/// writes nothing (no restore: the rules are as the last one left them).
#[test]
fn the_sync_period_writes_nothing_while_the_cluster_is_quiet() {
    let mut lab = Lab::new("qui", Flavour::Legacy, &["b1"]);
    lab.config("iptables", "2s");
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1"]));
    let mut daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let first = lab.syncs().expect("syncs")[0].generation;
    // The counters of the rules the traffic above went through (the test's
    // own /dashboard polls only pass OUTPUT and POSTROUTING): a restore
    // rewriting them would have reset them.
    let counters = |lab: &Lab| -> Vec<String> {
        let saved = lab.node.ok(&["iptables-legacy-save", "-c", "-t", "nat"]);
        let hit = ["-A PREROUTING ", "-A KUBE-SVC-", "-A KUBE-SEP-", "-A KUBE-SERVICES -d "];
        saved.lines().filter(|l| hit.iter().any(|h| l.contains(h))).map(str::to_string).collect()
    };
    let before = counters(&lab);
    assert!(before.iter().any(|l| !l.starts_with("[0:0]")), "the traffic shows in the counters: {before:?}");
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.push(lab.wait_sync(&mut daemon, seen.last().map_or(first, |s: &SyncRec| s.generation), CHANGE_WAIT));
    }
    assert!(seen.iter().all(|s| s.periodic && !s.full && s.ops == 0), "{seen:?}");
    assert_eq!(counters(&lab), before, "no restore touched the nat table (its counters are as they were)");
    daemon.stop();
}

/// (4) `kube-proxy-rs --cleanup` after the daemon ran: no chain of ours is
/// left in any table — except kubelet's KUBE-FIREWALL and its jumps from
/// INPUT and OUTPUT, which upstream's cleanup keeps too — no rule jumps to
/// one of ours, and the foreign chains and rules are untouched. A second
/// cleanup finds nothing and succeeds.
#[test]
fn cleanup_removes_our_chains_and_jumps_and_nothing_else() {
    let mut lab = Lab::new("cln", Flavour::Legacy, &["b1"]);
    let foreign = add_foreign_rules(&lab);
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1"]));
    let daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    daemon.stop();
    let before = lab.save(None);
    assert!(before.contains(":KUBE-SVC-") && before.contains(":KUBE-PROXY-CANARY"), "{before}");

    for round in ["first", "second"] {
        let out = lab.run_binary(&["--cleanup"]);
        assert!(out.status.success(), "{round} --cleanup: {}", String::from_utf8_lossy(&out.stderr));
        let saved = lab.save(None);
        let ours: Vec<String> =
            chains(&saved).into_iter().filter(|c| c.starts_with("KUBE-") && c != "KUBE-FIREWALL").collect();
        assert!(ours.is_empty(), "{round} cleanup left {ours:?}:\n{saved}");
        let jumps: Vec<&str> = saved
            .lines()
            .filter(|l| l.contains("-j KUBE-"))
            .filter(|l| !KUBELET_JUMPS.iter().any(|j| *l == j.save_line()))
            .collect();
        assert!(jumps.is_empty(), "{round} cleanup left jumps {jumps:?}:\n{saved}");
        for j in KUBELET_JUMPS {
            assert_eq!(count(&saved, &j.save_line()), 1, "kubelet's jump kept: {}\n{saved}", j.save_line());
        }
        assert_foreign_rules_intact(&lab, &foreign, &format!("after the {round} cleanup"));
    }
    assert_eq!(lab.ask(WEB, 1, false), [Err(ErrorKind::TimedOut)], "no DNAT after cleanup");
}

/// (5) A node switching from IPVS mode: the node has what IPVS mode leaves
/// in iptables and ipset (restored from `--dry-run` of the same cluster in
/// IPVS mode, written by the tools: its sets with members, its rules, and
/// its jumps from the built-in chains, each once). The daemon in
/// iptables mode removes IPVS mode's chains, jumps and sets after its
/// first sync (keeping the chains and jumps both modes write), and
/// ClusterIP traffic works. (IPVS virtual servers and
/// kube-ipvs0 cannot exist on this host: no ip_vs module, no dummy links.)
#[test]
fn switching_from_ipvs_mode_removes_its_chains_and_sets() {
    let mut lab = Lab::new("sw", Flavour::Nft, &["b1", "b2"]);
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1", "b2"]));
    lab.config("ipvs", "30s");
    let sections = dry_run(&lab);
    lab.node.pipe(&["ipset", "restore"], section(&sections, "ipset"));
    lab.restore(section(&sections, "iptables"));
    let ipvs_only = [
        ("nat", "KUBE-NODE-PORT"),
        ("nat", "KUBE-LOAD-BALANCER"),
        ("filter", "KUBE-NODE-PORT"),
        ("filter", "KUBE-SOURCE-RANGES-FIREWALL"),
        ("filter", "KUBE-IPVS-FILTER"),
        ("filter", "KUBE-IPVS-OUT-FILTER"),
    ];
    let ipvs_jumps: Vec<String> = kube_proxy_rs::plan::ipvs::rules::JUMPS
        .iter()
        .filter(|j| !JUMPS.contains(j))
        .map(|j| format!("{} {}", j.table, j.save_line()))
        .collect();
    assert!(ipvs_jumps.len() >= 4, "{ipvs_jumps:?}");
    let has = |lab: &Lab, table: &str, what: &str| {
        let saved = lab.save(Some(table));
        chains(&saved).contains(what) || saved.lines().any(|l| l == what)
    };
    for (table, chain) in ipvs_only {
        assert!(has(&lab, table, chain), "IPVS mode's {table} {chain} before the switch");
    }
    for j in &ipvs_jumps {
        let (table, line) = j.split_once(' ').unwrap();
        assert!(has(&lab, table, line), "IPVS mode's jump before the switch: {j}");
    }
    let sets = lab.node.ok(&["ipset", "list", "-n"]);
    assert!(sets.lines().any(|s| s == "KUBE-CLUSTER-IP"), "{sets}");

    lab.config("iptables", "30s");
    let daemon = lab.start_synced();
    wait_for("IPVS mode's sets removed after the first sync", CHANGE_WAIT, || {
        let sets = lab.node.ok(&["ipset", "list", "-n"]);
        if sets.trim().is_empty() {
            Ok(())
        } else {
            Err(sets)
        }
    });
    for (table, chain) in ipvs_only {
        assert!(!has(&lab, table, chain), "IPVS mode's {table} {chain} left:\n{}", lab.save(Some(table)));
    }
    for j in &ipvs_jumps {
        let (table, line) = j.split_once(' ').unwrap();
        assert!(!has(&lab, table, line), "IPVS mode's jump left: {j}");
    }
    let sets = lab.node.ok(&["ipset", "list", "-n"]);
    assert!(sets.trim().is_empty(), "IPVS mode's sets left: {sets}");
    lab.assert_jumps_once("after the switch");
    lab.wait_traffic(WEB, false, &["b1", "b2"], CHANGE_WAIT);
    lab.wait_traffic(WEB, true, &["b1", "b2"], CHANGE_WAIT);
    let log = daemon.stop();
    assert!(log.contains("removing what the node's earlier proxy mode left"), "{log}");
}

/// (6) A UDP client keeps sending from one socket (one source port, one
/// conntrack entry) to a ClusterIP whose only endpoint is b1; the
/// EndpointSlice is rewritten so b2 replaces b1. The new rules only see
/// new flows: without the daemon's conntrack reconcile the entry (DNAT to
/// b1, refreshed by every datagram, "assured" once b1 answered: a 120 s
/// timeout) would keep carrying the flow to b1, which still runs and
/// answers. With the reconcile (upstream's CleanStaleEntries: the entries
/// to the ClusterIP and port not DNATed to a serving endpoint) the next
/// datagram after the sync creates a new entry through the new rules, and
/// b2 answers within seconds; `conntrack -L` shows the entry replaced.
///
/// The control, over the same period: a second service (`ctl`, only b1)
/// whose rules are redirected to b2 by hand (a DNAT rule of ours first in
/// PREROUTING). Fresh sockets reach b2 at once, while its long-lived flow
/// keeps being answered by b1 all along — which is what the first flow
/// would do without the reconcile. (The reconcile keeps `ctl`'s entry: it
/// goes to b1, `ctl`'s serving endpoint.)
#[test]
fn a_replaced_udp_endpoint_takes_over_the_same_flow_after_the_conntrack_reconcile() {
    const CTL: &str = "10.96.0.11:80";
    let mut lab = Lab::new("udp", Flavour::Nft, &["b1", "b2"]);
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1"]));
    lab.put("ctl", &service_manifest("ctl", "10.96.0.11", &["b1"]));
    let daemon = lab.start_synced();
    lab.wait_traffic(WEB, true, &["b1"], CHANGE_WAIT);
    lab.wait_traffic(CTL, true, &["b1"], CHANGE_WAIT);
    let open = |to: &str| {
        let to = addr(to);
        lab.client.run(|| {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            s.connect(to).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            s
        })
    };
    let backend = |sock: &UdpSocket| udp_exchange(sock).map(|a| a.0);
    let (flow, control) = (open(WEB), open(CTL));
    for _ in 0..5 {
        assert_eq!(backend(&flow), Ok("b1".to_string()), "the flow goes to b1");
        assert_eq!(backend(&control), Ok("b1".to_string()), "the control flow goes to b1");
    }
    let sport = flow.local_addr().unwrap().port();
    assert_eq!(udp_flows(&lab, "10.96.0.10", sport), ["10.244.1.2"], "one conntrack entry, to b1");

    let redirect = "-t nat -I PREROUTING 1 -d 10.96.0.11/32 -p udp --dport 80 -j DNAT --to-destination 10.244.2.2:8080";
    lab.ipt(&redirect.split(' ').collect::<Vec<_>>());
    let redirected = Instant::now();
    lab.wait_traffic(CTL, true, &["b2"], CHANGE_WAIT);
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b2"]));
    let changed = Instant::now();
    let mut seen = Vec::new();
    wait_for("the same UDP flow to be answered by b2", CHANGE_WAIT, || {
        assert_eq!(backend(&control), Ok("b1".to_string()), "the control flow stays on b1");
        let a = backend(&flow);
        seen.push(a.clone());
        match a {
            Ok(name) if name == "b2" => Ok(()),
            other => Err(format!("{other:?} ({} exchanges since the change)", seen.len())),
        }
    });
    let took = changed.elapsed();
    // At least 5 more exchanges, and the control watched for 2 s at least.
    let mut more = 0;
    while more < 5 || redirected.elapsed() < Duration::from_secs(2) {
        assert_eq!(backend(&flow), Ok("b2".to_string()), "the flow stays on b2; before: {seen:?}");
        assert_eq!(backend(&control), Ok("b1".to_string()), "the control flow stays on b1");
        more += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(took <= CHANGE_WAIT, "{took:?}");
    assert_eq!(udp_flows(&lab, "10.96.0.10", sport), ["10.244.2.2"], "b1's entry deleted, a new one to b2");
    daemon.stop();
}

/// (7) After the first (full) sync, an endpoint change gives a partial sync
/// (the dashboard's sync list says so, with one service port changed per
/// protocol, and `/metrics` counts it in the partial histogram, not the
/// full one) and the traffic follows the change.
#[test]
fn an_endpoint_change_is_a_partial_sync_and_traffic_follows() {
    let mut lab = Lab::new("part", Flavour::Legacy, &["b1", "b2"]);
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1"]));
    lab.put("other", &service_manifest("other", "10.96.0.11", &["b1"]));
    let mut daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let first = lab.syncs().expect("syncs");
    assert_eq!(first.len(), 1, "{first:?}");
    let full_syncs = lab.family_metric("kubeproxy_sync_full_proxy_rules_duration_seconds_count", "IPv4");
    let partial_syncs = lab.family_metric("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", "IPv4");
    assert_eq!(full_syncs, Some(1.0), "one full sync so far");
    assert!(partial_syncs.unwrap_or(0.0) == 0.0, "no partial sync yet: {partial_syncs:?}");

    lab.put("web", &service_manifest("web", "10.96.0.10", &["b2"]));
    let sync = lab.wait_sync(&mut daemon, first[0].generation, CHANGE_WAIT);
    assert!(!sync.full, "an endpoint change is a partial sync: {sync:?}");
    assert_eq!(sync.ports_changed, 2, "web's TCP and UDP ports only: {sync:?}");
    lab.wait_traffic(WEB, false, &["b2"], CHANGE_WAIT);
    lab.wait_traffic(WEB, true, &["b2"], CHANGE_WAIT);
    lab.wait_traffic("10.96.0.11:80", false, &["b1"], CHANGE_WAIT);
    assert_eq!(lab.family_metric("kubeproxy_sync_full_proxy_rules_duration_seconds_count", "IPv4"), Some(1.0));
    let partial = lab.family_metric("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", "IPv4");
    assert!(partial.is_some_and(|n| n >= 1.0), "partial syncs counted: {partial:?}");
    let syncs = lab.syncs().expect("syncs");
    assert!(syncs.iter().filter(|s| s.generation > first[0].generation).all(|s| !s.full), "{syncs:?}");
    daemon.stop();
}

/// (dual-stack) One daemon serves both families, as upstream's metaproxier:
/// a RequireDualStack NodePort Service spreads over its endpoints on its
/// IPv4 and IPv6 ClusterIPs and on both node IPs' NodePorts, TCP and UDP,
/// from the client and from the node itself; an IPv6-only Service answers
/// on its ClusterIP; ip6tables holds the IPv6 service chains (none of them
/// in iptables), and an endpoint change in one family is a sync of that
/// family that the other family's traffic does not notice.
#[test]
fn a_dual_stack_service_answers_on_both_families() {
    let mut lab = Lab::new("ds", Flavour::Nft, &["b1", "b2"]);
    lab.dual_stack();
    lab.put("web", &daemon::dual_stack_service_manifest("web", &["10.96.0.40", "fd00:96::40"], 30040, &["b1", "b2"]));
    lab.put("v6only", &daemon::dual_stack_service_manifest("v6only", &["fd00:96::41"], 30041, &["b2"]));
    let daemon = lab.start_synced();
    let both = ["b1", "b2"];
    for to in ["10.96.0.40:80", "[fd00:96::40]:80", "192.168.50.1:30040", "[fd00:50::1]:30040"] {
        lab.wait_traffic(to, false, &both, CHANGE_WAIT);
        lab.wait_traffic(to, true, &both, CHANGE_WAIT);
    }
    lab.wait_traffic("[fd00:96::41]:80", false, &["b2"], CHANGE_WAIT);
    lab.wait_traffic("[fd00:50::1]:30041", false, &["b2"], CHANGE_WAIT);
    // Off-cluster IPv6 clients are masqueraded too (to the node's address toward the backend).
    let seen = lab.ask("[fd00:96::40]:80", 8, false);
    assert!(seen.iter().all(|a| a.as_ref().is_ok_and(|(_, src)| src.starts_with("fd00:244:"))), "{seen:?}");
    // From the node itself: both ClusterIPs and both node IPs' NodePorts.
    for to in ["10.96.0.40:80", "[fd00:96::40]:80", "192.168.50.1:30040", "[fd00:50::1]:30040"] {
        let got = lab::ask(&lab.node, to, 16, false, DROP_WAIT);
        assert_eq!(names(&got), set(&both), "from the node to {to}: {got:?}");
    }
    // Each family's rules in its own tool.
    let (v4, v6) = (lab.save(None), lab.save6());
    assert!(v6.contains("-d fd00:96::40/128") && v6.contains("-d fd00:96::41/128"), "{v6}");
    assert!(v4.contains("-d 10.96.0.40/32") && !v4.contains("fd00:"), "{v4}");
    assert!(!v6.contains("127.0.0.0/8") && !v6.contains("route_localnet"), "no localhost NodePorts in IPv6: {v6}");
    assert!(v6.contains(":KUBE-PROXY-CANARY"), "a canary per family: {v6}");
    // Per-family metrics, as upstream's ip_family label.
    for fam in ["IPv4", "IPv6"] {
        let n = lab.family_metric("kubeproxy_sync_proxy_rules_duration_seconds_count", fam);
        assert!(n.is_some_and(|n| n >= 1.0), "{fam}: {n:?}");
    }

    // The IPv6 slice alone changes: IPv6 traffic follows, IPv4 keeps both backends.
    let mut web = daemon::dual_stack_service_manifest("web", &["10.96.0.40", "fd00:96::40"], 30040, &["b1", "b2"]);
    let v6_only_b1 = daemon::dual_stack_service_manifest("x", &["fd00:96::40"], 30040, &["b1"]);
    web["items"][2]["endpoints"] = v6_only_b1["items"][1]["endpoints"].clone();
    lab.put("web", &web);
    lab.wait_traffic("[fd00:96::40]:80", false, &["b1"], CHANGE_WAIT);
    lab.wait_traffic("10.96.0.40:80", false, &both, CHANGE_WAIT);
    let log = daemon.stop();
    assert!(log.contains("kube-proxy running in dual-stack mode"), "{log}");
}

/// (dual-stack) A node with IPv6 switched off runs the primary family alone
/// and says why, with upstream's log lines; ip6tables gets nothing of ours.
#[test]
fn a_node_without_ipv6_runs_single_stack_and_says_why() {
    let mut lab = Lab::new("no6", Flavour::Legacy, &["b1"]);
    lab.put("web", &daemon::dual_stack_service_manifest("web", &["10.96.0.40", "fd00:96::40"], 30040, &["b1"]));
    lab.node.ok(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
    let daemon = lab.start_synced();
    lab.wait_traffic("10.96.0.40:80", false, &["b1"], CHANGE_WAIT);
    let v6 = lab.node.ok(&[&lab.flavour.tool("ip6tables", "-save")]);
    assert!(!v6.contains("KUBE-"), "{v6}");
    let log = daemon.stop();
    assert!(log.contains("No kernel support for family") && log.contains("IPv6"), "{log}");
    assert!(log.contains("kube-proxy running in single-stack mode"), "{log}");
}

/// (dual-stack) The Kubernetes API source end to end: the daemon with a
/// kubeconfig pointing at the test API server (real list/watch, kube-rs's
/// watcher) programs a RequireDualStack Service in both families, follows
/// an update of its IPv6 EndpointSlice, and removes both families' rules
/// when the Service is deleted.
#[test]
fn the_api_source_programs_a_dual_stack_service() {
    let mut lab = Lab::new("dsapi", Flavour::Nft, &["b1", "b2"]);
    let (api, _serving) = lab.node.api_server();
    use_api_server(&lab, &api);
    api.create(&dual_stack_node_manifest()).unwrap();
    let web = daemon::dual_stack_service_manifest("web", &["10.96.0.40", "fd00:96::40"], 30040, &["b1", "b2"]);
    create_items(&api, &web);
    let mut daemon = lab.start_with(&[]);
    lab.wait_sync(&mut daemon, 0, START_WAIT);
    lab.wait_traffic("10.96.0.40:80", false, &["b1", "b2"], CHANGE_WAIT);
    lab.wait_traffic("[fd00:96::40]:80", false, &["b1", "b2"], CHANGE_WAIT);
    lab.wait_traffic("[fd00:50::1]:30040", true, &["b1", "b2"], CHANGE_WAIT);

    let mut v6_slice = web["items"][2].clone();
    assert_eq!(v6_slice["addressType"], "IPv6");
    v6_slice["endpoints"] = json!([v6_slice["endpoints"][1].clone()]);
    api.update(&v6_slice).unwrap();
    lab.wait_traffic("[fd00:96::40]:80", false, &["b2"], CHANGE_WAIT);
    lab.wait_traffic("10.96.0.40:80", false, &["b1", "b2"], CHANGE_WAIT);

    api.delete(&web["items"][0]).unwrap();
    wait_for("both families' rules for web gone", CHANGE_WAIT, || {
        let (v4, v6) = (lab.save(Some("nat")), lab.save6());
        if v4.contains("10.96.0.40") || v6.contains("fd00:96::40") {
            Err("still there".to_string())
        } else {
            Ok(())
        }
    });
    daemon.stop();
}

/// (dual-stack) SIGHUP applies a reloaded config to both families:
/// `iptables.masqueradeAll` turned on makes both families' ClusterIP rules
/// mark every packet for masquerade, not only the off-cluster ones.
#[test]
fn sighup_reconfigures_both_families() {
    let mut lab = Lab::new("dshup", Flavour::Legacy, &["b1"]);
    lab.dual_stack();
    let dual = std::fs::read_to_string(lab.config_path()).unwrap();
    lab.put("web", &daemon::dual_stack_service_manifest("web", &["10.96.0.40", "fd00:96::40"], 30040, &["b1"]));
    let mut daemon = lab.start_synced();
    lab.wait_traffic("[fd00:96::40]:80", false, &["b1"], CHANGE_WAIT);
    // The cluster IP rules that mark for masquerade, per family.
    let marks = |saved: &str, ip: &str| -> Vec<String> {
        saved
            .lines()
            .filter(|l| l.contains(&format!("-d {ip}")) && l.contains("cluster IP") && l.ends_with("-j KUBE-MARK-MASQ"))
            .map(String::from)
            .collect()
    };
    let before = (marks(&lab.save(Some("nat")), "10.96.0.40/32"), marks(&lab.save6(), "fd00:96::40/128"));
    assert!(before.0.iter().chain(&before.1).all(|l| l.contains("! -s ")), "only off-cluster traffic: {before:?}");
    assert!(!before.0.is_empty() && !before.1.is_empty(), "{before:?}");

    std::fs::write(lab.config_path(), dual.replace("iptables:\n", "iptables:\n  masqueradeAll: true\n")).unwrap();
    daemon.reload();
    wait_for("masqueradeAll in both families", CHANGE_WAIT, || {
        daemon.assert_running();
        let after = (marks(&lab.save(Some("nat")), "10.96.0.40/32"), marks(&lab.save6(), "fd00:96::40/128"));
        let all = |v: &Vec<String>| !v.is_empty() && v.iter().all(|l| !l.contains("! -s "));
        if all(&after.0) && all(&after.1) {
            Ok(())
        } else {
            Err(format!("{after:?}"))
        }
    });
    lab.wait_traffic("10.96.0.40:80", false, &["b1"], CHANGE_WAIT);
    let log = daemon.stop();
    assert!(log.contains("config reloaded: applying"), "{log}");
}

/// Issue 27: a SIGHUP whose file asks for nftables mode (which needs a
/// restart, so it is refused) and a higher verbosity (live). The verbosity
/// applies and `mode` is named as needing a restart; nftables mode's
/// default `nodePortAddresses: [primary]` does not reach the running
/// iptables proxier: 127.0.0.1:<nodePort> answers TCP and UDP before,
/// across and after the reload, and the NodePort rules after the reload's
/// full resync are the ones before it.
#[test]
fn a_refused_mode_change_keeps_localhost_node_ports_answering() {
    let mut lab = Lab::new("hupmode", Flavour::Legacy, &["b1"]);
    lab.put("web", &daemon::dual_stack_service_manifest("web", &["10.96.0.10"], 30080, &["b1"]));
    let mut daemon = lab.start_synced();
    let node_port_rules = |lab: &Lab| -> Vec<String> {
        lab.save(Some("nat")).lines().filter(|l| l.contains("KUBE-NODEPORTS")).map(String::from).collect()
    };
    let before = node_port_rules(&lab);
    assert!(before.iter().any(|l| l.starts_with("-A KUBE-NODEPORTS -d 127.0.0.0/8 ")), "{before:#?}");
    let last = lab.syncs().expect("syncs")[0].generation;
    let probes = Probes::start(&lab.node, "127.0.0.1:30080", DROP_WAIT);
    std::thread::sleep(Duration::from_millis(300));

    let config = std::fs::read_to_string(lab.config_path()).unwrap();
    let asked = config.replace("mode: iptables\n", "mode: nftables\nlogging:\n  verbosity: 2\n");
    assert_ne!(asked, config);
    std::fs::write(lab.config_path(), asked).unwrap();
    let hup = Instant::now();
    daemon.reload();
    let resync = lab.wait_sync(&mut daemon, last, CHANGE_WAIT);
    assert!(resync.full, "an applied reload is followed by a full resync: {resync:?}");
    let synced = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let probes = probes.stop();

    let failed: Vec<&Probe> = probes.iter().filter(|(_, tcp, udp)| tcp.is_err() || udp.is_err()).collect();
    assert!(failed.is_empty(), "{} of {} probes failed: {failed:?}", failed.len(), probes.len());
    let tcp: Vec<Answer> = probes.iter().map(|p| p.1.clone()).collect();
    assert_eq!(names(&tcp), set(&["b1"]));
    let when = |from: Instant, to: Instant| probes.iter().filter(|p| p.0 > from && p.0 < to).count();
    assert!(when(hup - Duration::from_secs(1), hup) > 0 && when(synced, Instant::now()) > 0, "{probes:?}");
    assert_eq!(node_port_rules(&lab), before, "the NodePort rules after the reload");
    let log = daemon.stop();
    let line = |text: &str| log.lines().find(|l| l.contains(text)).unwrap_or_else(|| panic!("{text:?}:\n{log}"));
    assert!(line("config changes need a restart and were not applied").ends_with("fields=mode"), "{log}");
    assert!(line("config reloaded: applying").ends_with("fields=logging.verbosity"), "{log}");
}

/// `--dry-run --diff` over the running daemon's rules while the kernel
/// holds a ClientIP-affinity entry: the `recent` match's client list lives
/// in `/proc/net/xt_recent`, not in `iptables-save`'s output, so the
/// preview has nothing to add or remove, and says so the same way a second
/// later.
#[test]
fn the_preview_is_not_changed_by_the_kernels_recent_lists() {
    let mut lab = Lab::new("rcnt", Flavour::Legacy, &["b1", "b2"]);
    lab.put("sticky", &daemon::sticky_service_manifest("sticky", &["10.96.0.12"], 30012, &["b1", "b2"], 600));
    let daemon = lab.start_synced();
    let answers = lab.ask("10.96.0.12:80", 8, false);
    assert_eq!(names(&answers).len(), 1, "one backend for the client: {answers:?}");
    let lists = lab.node.ok(&["sh", "-c", "grep -H . /proc/net/xt_recent/*"]);
    assert!(lists.contains(&format!("src={}", lab::CLIENT_IP)), "the client in a recent list:\n{lists}");
    let run = |args: &[&str]| lab.run_binary(args);
    let preview = daemon::preview_twice_unchanged(run, &lab.config_path(), &lab.manifests());
    assert!(preview.contains("iptables legacy: 0 to add, 0 to remove, "), "{preview}");
    daemon.stop();
}

/// (dual-stack) A dual-stack LoadBalancer service with
/// `externalTrafficPolicy: Local`: its healthCheckNodePort answers on both
/// node IPs, with the local endpoint count (the families' larger one).
#[test]
fn health_check_node_port_answers_on_both_families() {
    let mut lab = Lab::new("dshc", Flavour::Nft, &["b1", "b2"]);
    lab.put("node", &dual_stack_node_manifest());
    let mut web = daemon::dual_stack_service_manifest("web", &["10.96.0.40", "fd00:96::40"], 30040, &["b1", "b2"]);
    web["items"][0]["spec"]["type"] = json!("LoadBalancer");
    web["items"][0]["spec"]["externalTrafficPolicy"] = json!("Local");
    web["items"][0]["spec"]["healthCheckNodePort"] = json!(32040);
    lab.put("web", &web);
    let daemon = lab.start_synced();
    for to in ["192.168.50.1:32040", "[fd00:50::1]:32040"] {
        let body = wait_for(&format!("health check on {to}"), CHANGE_WAIT, || {
            lab.client.run(|| {
                let mut s = TcpStream::connect_timeout(&addr(to), Duration::from_secs(1)).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                write!(s, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
                let mut text = String::new();
                s.read_to_string(&mut text).map_err(|e| e.to_string())?;
                if text.starts_with("HTTP/1.1 200") {
                    Ok(text)
                } else {
                    Err(text)
                }
            })
        });
        let compact: String = body.chars().filter(|c| !c.is_whitespace()).collect();
        // Two local endpoints × two ports, counted per port as upstream's
        // LocalReadyEndpoints does; one family's count, not both added.
        assert!(compact.contains("\"localEndpoints\":4"), "{to}: {body}");
    }
    daemon.stop();
}

/// A second SIGTERM while the first waits for the sync in flight exits at
/// once (exit code 1, one warning), leaving the kernel as it is. The sync
/// is kept in flight by an `iptables-restore` on the daemon's PATH that
/// writes its PID and sleeps (a restore that takes a minute).
#[test]
fn a_second_sigterm_during_a_long_sync_exits_at_once() {
    let mut lab = Lab::new("sig2", Flavour::Nft, &["b1"]);
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1"]));
    lab.start_synced().stop();
    let before = lab.save(Some("nat"));
    let started = lab.dir.path().join("restore.pid");
    let shim = lab.shims().join("iptables-restore");
    std::fs::remove_file(&shim).unwrap();
    std::fs::write(&shim, format!("#!/bin/sh\necho $$ > {}\nexec sleep 60\n", started.display())).unwrap();
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut daemon = lab.start();
    let restore_pid = wait_for("the first sync's restore", START_WAIT, || {
        daemon.assert_running();
        let pid = std::fs::read_to_string(&started).unwrap_or_default();
        Some(pid.trim().to_string()).filter(|p| !p.is_empty()).ok_or_else(|| daemon.log())
    });
    // The shim outlives the daemon (nothing kills a running restore): ended here, whatever happens.
    struct Kill(String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = Command::new("kill").args(["-KILL", &self.0]).status();
        }
    }
    let _restore = Kill(restore_pid);
    let pid = daemon.child.as_ref().unwrap().id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    daemon.assert_running(); // the first SIGTERM waits for the sync in flight
    let sent = Instant::now();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let status = daemon.wait_exit(Duration::from_secs(3));
    let waited = sent.elapsed();
    let log = daemon.log();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    let warned: Vec<&str> = log.lines().filter(|l| l.contains("second signal")).collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(
        warned[0].contains("WARN") && warned[0].contains("second signal: exiting now, leaving the kernel as it is")
    );
    assert!(!log.contains("kernel state left in place"), "no orderly shutdown:\n{log}");
    let strip = |s: &str| s.lines().filter(|l| !l.starts_with('#')).map(String::from).collect::<Vec<_>>();
    assert_eq!(strip(&lab.save(Some("nat"))), strip(&before), "the kernel is as the first run left it");
}

/// One daemon per network namespace: a second one refuses to start (exit
/// 1, one line naming the first one's PID) and writes nothing, while the
/// first keeps running and serving; `--dry-run` and `--cleanup` in the same
/// namespace are not blocked; a daemon in another namespace starts.
#[test]
fn a_second_daemon_in_the_namespace_refuses_to_start() {
    let mut lab = Lab::new("inst", Flavour::Nft, &["b1"]);
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1"]));
    let mut first = lab.start_synced();
    let pid = first.child.as_ref().unwrap().id();
    let before = lab.save(Some("nat"));
    let mut second = lab.start();
    let status = second.wait_exit(START_WAIT);
    let err = second.log();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("another kube-proxy-rs (pid {pid}) already runs in this network namespace")),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let strip = |s: &str| s.lines().filter(|l| !l.starts_with('#')).map(String::from).collect::<Vec<_>>();
    assert_eq!(strip(&lab.save(Some("nat"))), strip(&before), "the second daemon wrote nothing");
    first.assert_running();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);

    let dry = dry_run(&lab);
    assert!(dry.iter().any(|(_, text)| text.contains("10.96.0.10")), "{dry:?}");

    // Another namespace is another instance: its daemon starts and syncs.
    let mut other = Lab::new("inst2", Flavour::Nft, &[]);
    other.start_synced().stop();

    let cleanup = lab.run_binary(&["--cleanup"]);
    assert!(cleanup.status.success(), "--cleanup: {}", String::from_utf8_lossy(&cleanup.stderr));
    assert!(!lab.save(Some("nat")).contains("KUBE-SERVICES"), "--cleanup removed the rules");
    first.stop();
}

/// Nothing dropped silently: an EndpointSlice of an unknown address type is
/// warned about once (not once per family) and counted; one without the
/// service-name label is counted (debug log, as upstream ignores it); the
/// other services keep working.
#[test]
fn ignored_slices_are_logged_once_and_counted() {
    let mut lab = Lab::new("ign", Flavour::Nft, &["b1"]);
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1"]));
    let mut bogus = service_manifest("odd", "10.96.0.11", &["b1"]);
    bogus["items"][1]["addressType"] = json!("Bogus");
    lab.put("odd", &bogus);
    let mut unlabelled = service_manifest("nolabel", "10.96.0.12", &["b1"]);
    unlabelled["items"][1]["metadata"]["labels"] = json!({});
    lab.put("nolabel", &unlabelled);
    let daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let text = http_get(&lab.node, "/metrics").unwrap();
    let sample = |reason: &str| {
        text.lines()
            .find(|l| l.starts_with("kube_proxy_rs_source_objects_ignored_total{") && l.contains(reason))
            .and_then(|l| l.rsplit(' ').next())
            .map(String::from)
    };
    assert_eq!(sample("unknown_address_type").as_deref(), Some("1"), "{text}");
    assert_eq!(sample("no_service_name_label").as_deref(), Some("1"), "{text}");
    let log = daemon.stop();
    let warned: Vec<&str> =
        log.lines().filter(|l| l.contains("ignoring object") && l.contains("default/odd-abcde")).collect();
    assert_eq!(warned.len(), 1, "one warning, whatever the families:\n{log}");
    assert!(warned[0].contains("WARN") && warned[0].contains("Bogus"), "{log}");
}

/// loadBalancerSourceRanges as upstream's sloppy parser reads them, by
/// packets (see `daemon::SOURCE_RANGE_CASES`): `192.168.050.000/024`
/// admits the client, `198.051.100.000/024` drops it, and a range that
/// does not parse at all drops everyone rather than admitting everyone;
/// `--dry-run` shows the same rules.
#[test]
fn source_ranges_with_leading_zeros_apply_and_unparseable_ones_admit_no_one() {
    let mut lab = Lab::new("lbsr", Flavour::Legacy, &["b1"]);
    for case in &daemon::SOURCE_RANGE_CASES {
        lab.put(case.name, &daemon::source_range_manifest(case));
    }
    let planned = dry_run(&lab);
    let text = section(&planned, "iptables");
    let accepts = |name: &str| -> Vec<&str> {
        let head = format!("--comment \"default/{name}:http loadbalancer IP\" -s ");
        text.lines().filter_map(|l| l.split_once(&head)).map(|(_, rest)| rest.split(' ').next().unwrap_or("")).collect()
    };
    // A range holding the node's IP lets the node reach the VIP (upstream's allowFromNode).
    assert_eq!(accepts("lb-in"), ["192.168.50.0/24", "203.0.113.10"], "{text}");
    assert_eq!(accepts("lb-out"), ["198.51.100.0/24"], "{text}");
    assert_eq!(accepts("lb-bogus"), Vec::<&str>::new(), "{text}");
    assert_eq!(accepts("lb-mixed"), ["192.168.50.0/24", "203.0.113.13"], "{text}");
    for case in &daemon::SOURCE_RANGE_CASES {
        let dropped = format!("-m tcp -p tcp -d {} --dport 80 -j DROP", case.vip);
        let rule = text.lines().find(|l| l.starts_with("-A KUBE-PROXY-FIREWALL") && l.ends_with(&dropped));
        assert!(
            rule.is_some_and(|l| l.contains(&format!("\"default/{}:http traffic not accepted by KUBE-FW-", case.name))),
            "{text}"
        );
    }
    // lb-in's endpoint, written 010.244.001.002.
    assert!(text.contains("default/lb-in:http -m tcp -p tcp -j DNAT --to-destination 10.244.1.2:8080"), "{text}");
    let daemon = lab.start_synced();
    daemon::assert_source_ranges(&lab.node, &lab.client, DROP_WAIT, CHANGE_WAIT);
    daemon::assert_source_ranges_logged(&daemon.stop());
}

/// Two Services asking for one nodePort (the API server would refuse the
/// second; a manifest file can hold both): the first read keeps it, the
/// other loses only that port (its ClusterIP still answers), with a warning
/// naming both, a count in /metrics and a line on the dashboard; when the
/// holder goes, the other gets the port.
#[test]
fn a_node_port_held_by_another_service_is_refused_and_named() {
    let mut lab = Lab::new("npc", Flavour::Legacy, &["b1", "b2"]);
    lab.put("a", &daemon::dual_stack_service_manifest("a", &["10.96.0.50"], 30050, &["b1"]));
    lab.put("b", &daemon::dual_stack_service_manifest("b", &["10.96.0.51"], 30050, &["b2"]));
    let daemon = lab.start_synced();
    let node_port = format!("{NODE_IP}:30050");
    lab.wait_traffic(&node_port, false, &["b1"], CHANGE_WAIT);
    lab.wait_traffic(&node_port, true, &["b1"], CHANGE_WAIT);
    lab.wait_traffic("10.96.0.51:80", false, &["b2"], CHANGE_WAIT);
    let log = daemon.log();
    let line =
        log.lines().find(|l| l.contains("refusing a nodePort")).unwrap_or_else(|| panic!("no warning in\n{log}"));
    assert!(
        line.contains("default/b") && line.contains("nodePort 30050 is already used by Service default/a"),
        "{line}"
    );
    let metrics = http_get(&lab.node, "/metrics").expect("/metrics");
    let sample = "kube_proxy_rs_source_objects_ignored_total{kind=\"Service\",reason=\"node_port_conflict\"}";
    let counted: Vec<&str> = metrics.lines().filter(|l| l.starts_with(sample)).collect();
    // Each Service's two ports (TCP and UDP) share the nodePort: two refusals.
    assert_eq!(counted, [format!("{sample} 2")], "{metrics}");
    let refused = lab.dashboard().expect("dashboard")["refused"].clone();
    assert_eq!(refused[0]["object"], "default/b", "{refused}");
    assert_eq!(refused[0]["reason"], "node_port_conflict", "{refused}");

    // The holder goes: the port is the other Service's.
    lab.remove("a");
    lab.wait_traffic(&node_port, false, &["b2"], CHANGE_WAIT);
    daemon.stop();
}

/// Issue 15's flood, on the daemon: 800 connections to the healthz port
/// (more than three times the server's cap), half idle and half
/// slowloris-style (a header that never ends), each replaced as soon as
/// the daemon drops it, for 12 s. Meanwhile a manifest change is
/// programmed on time and /metrics answers; /healthz answers within a
/// second of the flood's end and the daemon's RSS comes back within 20 %
/// of what it was before.
#[test]
fn a_connection_flood_on_healthz_delays_nothing_and_leaves_no_memory_behind() {
    const FLOOD: usize = 800;
    let mut lab = Lab::new("flood", Flavour::Legacy, &["b1", "b2"]);
    lab.put("web", &service_manifest("web", "10.96.0.60", &["b1"]));
    let mut daemon = lab.start_synced();
    lab.wait_traffic("10.96.0.60:80", false, &["b1"], CHANGE_WAIT);
    let pid = daemon.child.as_ref().expect("running").id();
    assert!(http_status(&lab.node, 10256, "/healthz").is_ok_and(|(code, _)| code == 200));
    let rss_before = status_kb(pid, "VmRSS");

    let stop = std::sync::atomic::AtomicBool::new(false);
    let opened = std::sync::atomic::AtomicUsize::new(0);
    let flood_end = std::thread::scope(|s| {
        s.spawn(|| {
            lab.node.run(|| {
                let open = |slow: bool| -> Option<TcpStream> {
                    let mut c =
                        TcpStream::connect_timeout(&addr("127.0.0.1:10256"), Duration::from_millis(200)).ok()?;
                    if slow {
                        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").ok()?;
                    }
                    c.set_nonblocking(true).ok()?;
                    opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Some(c)
                };
                let mut conns: Vec<(bool, Option<TcpStream>)> = (0..FLOOD).map(|i| (i % 2 == 0, None)).collect();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (slow, c) in conns.iter_mut() {
                        // Closed by the daemon (EOF or reset): open another.
                        let gone = match c {
                            None => true,
                            Some(s) => {
                                matches!(s.peek(&mut [0u8; 1]), Ok(0))
                                    || matches!(s.peek(&mut [0u8; 1]), Err(e) if e.kind() != ErrorKind::WouldBlock)
                            }
                        };
                        if gone {
                            *c = open(*slow);
                        } else if *slow {
                            let _ = c.as_mut().map(|s| s.write(b"a"));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
        });
        std::thread::sleep(Duration::from_secs(2));
        // A change during the flood is programmed on time (1 s settle + a sync).
        lab.put("web", &service_manifest("web", "10.96.0.60", &["b1", "b2"]));
        lab.wait_traffic("10.96.0.60:80", false, &["b1", "b2"], CHANGE_WAIT);
        http_get(&lab.node, "/metrics").expect("/metrics during the flood");
        std::thread::sleep(Duration::from_secs(8));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        Instant::now()
    });
    let opened = opened.into_inner();
    assert!(opened > FLOOD, "the daemon dropped connections and they were replaced: {opened} opened");
    wait_for("/healthz after the flood", Duration::from_secs(1), || http_status(&lab.node, 10256, "/healthz"));
    let answered = flood_end.elapsed();
    assert!(answered < Duration::from_secs(1), "/healthz answered {answered:?} after the flood");
    daemon.assert_running();
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = status_kb(pid, "VmRSS");
    eprintln!(
        "flood: {opened} connections opened; /healthz answered {answered:?} after; RSS {rss_before} -> {rss_after} kB"
    );
    assert!(rss_after * 5 <= rss_before * 6, "RSS {rss_before} kB before, {rss_after} kB after");
    let log = daemon.log();
    assert!(!log.contains("Too many open files"), "{log}");
    daemon.stop();
}

/// The same Service in two manifest files: the first file's copy is used,
/// the other refused with a warning naming both files, counted in /metrics
/// and listed on the dashboard.
#[test]
fn a_service_in_two_manifest_files_is_refused_once_counted_and_listed() {
    let mut lab = Lab::new("dup", Flavour::Legacy, &["b1"]);
    lab.put("a-web", &service_manifest("web", "10.96.0.70", &["b1"]));
    lab.put("b-web", &service_manifest("web", "10.96.0.71", &["b1"]));
    let daemon = lab.start_synced();
    lab.wait_traffic("10.96.0.70:80", false, &["b1"], CHANGE_WAIT);
    assert!(!lab.save(Some("nat")).contains("10.96.0.71"), "the refused copy is not programmed");
    let metrics = http_get(&lab.node, "/metrics").expect("/metrics");
    let sample = "kube_proxy_rs_source_objects_ignored_total{kind=\"Service\",reason=\"duplicate\"}";
    assert!(metrics.lines().any(|l| l == format!("{sample} 1")), "{metrics}");
    let refused = lab.dashboard().expect("dashboard")["refused"].clone();
    let listed = refused
        .as_array()
        .expect("refused list")
        .iter()
        .find(|r| r["reason"] == "duplicate" && r["kind"] == "Service")
        .cloned();
    let listed = listed.unwrap_or_else(|| panic!("no duplicate in {refused}"));
    assert_eq!(listed["object"], "default/web");
    assert!(listed["detail"].as_str().is_some_and(|d| d.contains("b-web") && d.contains("a-web")), "{listed}");
    daemon.stop();
}

/// Points the lab's config at `api` (a kubeconfig in the lab's directory,
/// `clientConnection.kubeconfig` in the config file): the daemon started
/// with no source argument reads the API server. Call after `Lab::config`.
fn use_api_server(lab: &Lab, api: &common::apiserver::ApiServer) {
    let kubeconfig = lab.dir.path().join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: {}\n\
         contexts:\n- name: t\n  context:\n    cluster: t\n    user: t\ncurrent-context: t\n\
         users:\n- name: t\n  user: {{}}\n",
        api.url()
    );
    std::fs::write(&kubeconfig, text).unwrap();
    let mut config = std::fs::read_to_string(lab.config_path()).unwrap();
    config.push_str(&format!("clientConnection:\n  kubeconfig: {}\n", kubeconfig.display()));
    std::fs::write(lab.config_path(), config).unwrap();
}

/// `GET path` on `127.0.0.1:port` in `ns`: the status code and body.
fn http_status(ns: &Netns, port: u16, path: &str) -> Result<(u16, String), String> {
    let (head, body) = http_exchange(ns, port, path)?;
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("status line: {head}"))?;
    Ok((code, body))
}

/// One Service the API server serves with a string where an integer goes
/// (`"port": "abc"`, as a conversion webhook or a version skew may serve
/// it): the daemon refuses that one object with one log line naming it and
/// the field, counts it, programs every other Service, and goes on
/// following the watch. (On the previous code the whole ServiceList failed
/// to decode and the daemon never synced.)
#[test]
fn a_service_that_does_not_decode_is_refused_and_the_others_are_programmed() {
    let mut lab = Lab::new("undec", Flavour::Nft, &["b1", "b2"]);
    let (api, _serving) = lab.node.api_server();
    use_api_server(&lab, &api);
    api.create(&node_manifest()).unwrap();
    create_items(&api, &service_manifest("web", "10.96.0.10", &["b1"]));
    let mut bad = service_manifest("bad", "10.96.0.11", &["b2"]);
    bad["items"][0]["spec"]["ports"][0]["port"] = json!("abc");
    create_items(&api, &bad);
    let mut daemon = lab.start_with(&[]);
    lab.wait_sync(&mut daemon, 0, START_WAIT);
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let refused = || {
        let text = http_get(&lab.node, "/metrics").unwrap();
        let prefix = "kube_proxy_rs_source_objects_refused_total{kind=\"Service\"} ";
        text.lines().find_map(|l| l.strip_prefix(prefix)).map(String::from)
    };
    assert_eq!(refused().as_deref(), Some("1"));
    // A later watch event of a good Service still arrives.
    create_items(&api, &service_manifest("later", "10.96.0.12", &["b2"]));
    lab.wait_traffic("10.96.0.12:80", false, &["b2"], CHANGE_WAIT);
    assert!(!lab.save(Some("nat")).contains("10.96.0.11"), "no rules for the refused Service");
    assert_eq!(refused().as_deref(), Some("1"));
    let listed = lab.dashboard().unwrap()["refused"].clone();
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(
        (&listed[0]["kind"], &listed[0]["object"], &listed[0]["reason"]),
        (&json!("Service"), &json!("default/bad"), &json!("does_not_decode")),
        "{listed}"
    );
    assert!(listed[0]["detail"].as_str().is_some_and(|d| d.starts_with("spec.ports[0].port: ")), "{listed}");
    let log = daemon.stop();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("object refused")).collect();
    assert_eq!(lines.len(), 1, "one line for the one refusal:\n{log}");
    for part in ["WARN", "kind=Service", "object=default/bad", "field=spec.ports[0].port", "\"abc\""] {
        assert!(lines[0].contains(part), "{part} in {}", lines[0]);
    }
    assert!(lines[0].len() < 400, "{}", lines[0]);
    assert!(!log.contains("clusterIP"), "no object's JSON in the log:\n{log}");
}

/// Restarted while the API server fails every EndpointSlice list (a
/// broken webhook or aggregated API): no first sync can happen, and once
/// the health timeout (2 × syncPeriod, 2 s here) has passed /healthz and
/// /livez answer 503 instead of 200, until the lists work and the first
/// sync is done. (On the previous code they answered 200 throughout.)
#[test]
fn healthz_is_503_while_a_restarted_daemon_cannot_sync() {
    let mut lab = Lab::new("nosync", Flavour::Nft, &["b1"]);
    lab.config("iptables", "1s");
    let (api, _serving) = lab.node.api_server();
    use_api_server(&lab, &api);
    api.create(&node_manifest()).unwrap();
    create_items(&api, &service_manifest("web", "10.96.0.10", &["b1"]));
    let healthz = |lab: &Lab, path: &str| http_status(&lab.node, 10256, path).map(|(code, _)| code);
    let mut daemon = lab.start_with(&[]);
    lab.wait_sync(&mut daemon, 0, START_WAIT);
    wait_for("healthz 200 after the first sync", CHANGE_WAIT, || match healthz(&lab, "/healthz") {
        Ok(200) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    daemon.stop();

    api.fail_kind(common::apiserver::Kind::EndpointSlice, true);
    let mut daemon = lab.start_with(&[]);
    let unhealthy = wait_for("healthz 503 without a first sync", START_WAIT, || {
        daemon.assert_running();
        match http_status(&lab.node, 10256, "/healthz") {
            Ok((503, body)) => Ok(body),
            other => Err(format!("{other:?}")),
        }
    });
    let body: Value = serde_json::from_str(&unhealthy).unwrap();
    assert_eq!(body["healthy"], json!(false), "{body}");
    for _ in 0..5 {
        assert_eq!(healthz(&lab, "/healthz"), Ok(503));
        assert_eq!(healthz(&lab, "/livez"), Ok(503));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(lab.syncs().map(|s| s.len()), Ok(0), "no sync at all");
    api.fail_kind(common::apiserver::Kind::EndpointSlice, false);
    lab.wait_sync(&mut daemon, 0, Duration::from_secs(40));
    wait_for("healthz 200 after the first sync", CHANGE_WAIT, || match healthz(&lab, "/healthz") {
        Ok(200) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    daemon.stop();
}

/// Upstream's conntrack settings: `tcpBeLiberal` sets
/// `nf_conntrack_tcp_be_liberal` and drops the INVALID-drop rule (upstream
/// reads the sysctl when its proxier starts), the UDP timeouts set theirs;
/// in this namespace only (the host keeps its own).
#[test]
fn conntrack_settings_are_applied_and_tcp_be_liberal_drops_the_invalid_rule() {
    let mut lab = Lab::new("ctl", Flavour::Legacy, &["b1"]);
    lab.config("iptables", "30s");
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1"]));
    let sysctl = |lab: &Lab, name: &str| lab.node.ok(&["cat", &format!("/proc/sys/net/netfilter/{name}")]);
    let invalid_drops = |lab: &Lab| {
        let saved = lab.node.ok(&["iptables-legacy-save", "-t", "filter"]);
        saved.lines().filter(|l| l.contains("INVALID") && l.ends_with("-j DROP")).count()
    };
    let daemon = lab.start_synced();
    assert_eq!(invalid_drops(&lab), 1, "upstream's rule, without tcpBeLiberal");
    assert_eq!(sysctl(&lab, "nf_conntrack_tcp_be_liberal").trim(), "0");
    daemon.stop();
    let mut text = std::fs::read_to_string(lab.config_path()).unwrap();
    text.push_str("conntrack:\n  tcpBeLiberal: true\n  udpTimeout: 31s\n  udpStreamTimeout: 121s\n");
    std::fs::write(lab.config_path(), text).unwrap();
    let daemon = lab.start_synced();
    assert_eq!(sysctl(&lab, "nf_conntrack_tcp_be_liberal").trim(), "1");
    assert_eq!(sysctl(&lab, "nf_conntrack_udp_timeout").trim(), "31");
    assert_eq!(sysctl(&lab, "nf_conntrack_udp_timeout_stream").trim(), "121");
    assert_eq!(invalid_drops(&lab), 0, "no INVALID-drop rule with a liberal conntrack");
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    daemon.stop();
}

/// A TCP segment with SYN and FIN set and a zero checksum, from the client
/// (a raw socket: the kernel adds the IP header) to `dst`:8080 through the
/// node, whose conntrack calls it INVALID.
fn send_invalid_tcp(lab: &Lab, dst: [u8; 4]) {
    use nix::sys::socket::{sendto, socket, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    lab.client.run(|| {
        let fd = socket(AddressFamily::Inet, SockType::Raw, SockFlag::empty(), SockProtocol::Tcp).expect("raw socket");
        let port = BACKEND_PORT.to_be_bytes();
        #[rustfmt::skip]
        let segment = [
            0x9c, 0x40, port[0], port[1], // sport 40000, dport
            0, 0, 0, 1, 0, 0, 0, 0,       // seq, ack
            0x50, 0x03,                   // data offset 5, SYN | FIN
            0x20, 0x00, 0, 0, 0, 0,       // window, checksum 0, urgent pointer
        ];
        let to = SockaddrIn::new(dst[0], dst[1], dst[2], dst[3], 0);
        sendto(fd.as_raw_fd(), &segment, &to, MsgFlags::empty()).expect("send the segment");
    });
}

/// Issue 16: upstream's nfacct counters. The daemon creates the objects
/// in its namespace, its rules count into them (the INVALID-state drop and
/// a localhost NodePort rule per NodePort), and `/metrics` serves their
/// packet counts from the start: a connection to 127.0.0.1:<nodePort> from
/// the node and an INVALID segment forwarded by the node each show.
#[test]
fn nfacct_counters_count_invalid_drops_and_localhost_node_ports() {
    let mut lab = Lab::new("nfa", Flavour::Legacy, &["b1"]);
    lab.put("web", &daemon::dual_stack_service_manifest("web", &["10.96.0.10"], 30080, &["b1"]));
    let daemon = lab.start_synced();
    assert_eq!(lab.nfacct_packets(&[NFACCT_INVALID, NFACCT_LOCALHOST]).iter().filter(|p| p.is_some()).count(), 2);
    // iptables-save prints the nfacct match with two spaces before the name.
    let filter = lab.save(Some("filter")).replace("--nfacct-name  ", "--nfacct-name ");
    let drop =
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP";
    assert_eq!(count(&filter, drop), 1, "{filter}");
    let nat = lab.save(Some("nat")).replace("--nfacct-name  ", "--nfacct-name ");
    let localhost = nat
        .lines()
        .filter(|l| {
            l.starts_with("-A KUBE-NODEPORTS -d 127.0.0.0/8") && l.contains("--nfacct-name localhost_nps_accepted_pkts")
        })
        .count();
    assert_eq!(localhost, 2, "one per NodePort port (tcp, udp):\n{nat}");
    assert_eq!(lab.plain_metric(METRIC_LOCALHOST), Some(0.0), "present from the start");
    let invalid_before = lab.plain_metric(METRIC_INVALID).expect("the INVALID counter's metric");

    let answers = lab::ask(&lab.node, "127.0.0.1:30080", 1, false, DROP_WAIT);
    assert_eq!(names(&answers), set(&["b1"]), "a localhost NodePort reaches the endpoint");
    let kernel = lab.nfacct_packets(&[NFACCT_LOCALHOST])[0].expect("object");
    assert!(kernel >= 1, "the connection's first packet counted: {kernel}");
    assert_eq!(lab.plain_metric(METRIC_LOCALHOST), Some(kernel as f64), "the metric is the kernel's count");

    send_invalid_tcp(&lab, [10, 244, 1, 2]);
    wait_for("the INVALID segment counted", CHANGE_WAIT, || match lab.plain_metric(METRIC_INVALID) {
        Some(v) if v > invalid_before => Ok(()),
        other => Err(format!("{other:?}, was {invalid_before}")),
    });
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let log = daemon.stop();
    assert!(!log.contains("unavailable") && !log.contains("unusable"), "no nfacct warning:\n{log}");
}

/// A firewalld-style flush of filter and nat, then the nfacct objects
/// deleted (`nfacct flush`: possible once no rule names them): the canary
/// sees the flush, and the full resync that follows creates the objects
/// again before its restore, so the counting rules come back and no sync
/// fails on a missing object.
#[test]
fn nfacct_objects_deleted_with_the_rules_are_created_again_by_the_full_resync() {
    let mut lab = Lab::new("nfr", Flavour::Legacy, &["b1"]);
    lab.config("iptables", "60s");
    lab.put("web", &daemon::dual_stack_service_manifest("web", &["10.96.0.10"], 30080, &["b1"]));
    let mut daemon = lab.start_synced();
    assert!(lab.nfacct_packets(&[NFACCT_INVALID, NFACCT_LOCALHOST]).iter().all(Option::is_some));
    let last = lab.syncs().expect("syncs")[0].generation;

    let tool = Flavour::Legacy.tool("iptables", "");
    let tool6 = Flavour::Legacy.tool("ip6tables", "");
    let flush: Vec<String> = [&tool, &tool6]
        .iter()
        .flat_map(|t| ["filter", "nat"].map(|table| format!("{t} -w 5 -t {table} -F && {t} -w 5 -t {table} -X")))
        .collect();
    lab.node.ok(&["sh", "-c", &flush.join(" && ")]);
    let deleted = lab.node.block_on(|| async {
        let nfacct = NetlinkNfacct::new().expect("netfilter netlink socket");
        let mut out = Vec::new();
        for name in [NFACCT_INVALID, NFACCT_LOCALHOST] {
            out.push(nfacct.delete(name).await);
        }
        out
    });
    assert!(deleted.iter().all(|d| matches!(d, Ok(true))), "{deleted:?}");
    assert!(lab.nfacct_packets(&[NFACCT_INVALID, NFACCT_LOCALHOST]).iter().all(Option::is_none));

    let bound = CANARY_INTERVAL + Duration::from_secs(3);
    let resync = lab.wait_sync(&mut daemon, last, bound);
    assert!(resync.full, "drift gives a full resync (wait_sync: none failed): {resync:?}");
    assert!(lab.nfacct_packets(&[NFACCT_INVALID, NFACCT_LOCALHOST]).iter().all(Option::is_some), "created again");
    let filter = lab.save(Some("filter")).replace("--nfacct-name  ", "--nfacct-name ");
    assert!(filter.contains("-m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"), "{filter}");
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let log = daemon.stop();
    assert!(!log.contains("unavailable") && !log.contains("unusable"), "no nfacct warning:\n{log}");
}

/// Kubernetes issue 142068: a kernel with nfnetlink_acct but without the
/// iptables nfacct match (here: `iptables-restore` refusing the match, as
/// it does there). Upstream writes the match anyway and every restore
/// fails, leaving the node without service rules; here the match is tried
/// first, the objects stay unused, one warning says so, and the rules are
/// the plain ones: the first sync succeeds and traffic flows.
#[test]
fn a_kernel_without_the_nfacct_match_keeps_its_service_rules() {
    let mut lab = Lab::new("nfm", Flavour::Legacy, &["b1"]);
    lab.refuse_nfacct_match();
    lab.put("web", &daemon::dual_stack_service_manifest("web", &["10.96.0.10"], 30080, &["b1"]));
    let daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let saved = lab.save(None);
    assert!(!saved.contains("nfacct"), "{saved}");
    assert_eq!(count(&saved, "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"), 1, "{saved}");
    assert!(!saved.contains("KUBE-PROXY-MATCH-PROBE"), "the probe chain is gone: {saved}");
    assert_eq!(lab.plain_metric(METRIC_INVALID), None, "no rule counts: no metric");
    assert_eq!(lab.plain_metric(METRIC_LOCALHOST), None);
    let answers = lab::ask(&lab.node, "127.0.0.1:30080", 1, false, DROP_WAIT);
    assert_eq!(names(&answers), set(&["b1"]), "localhost NodePorts work without counting");
    let log = daemon.stop();
    assert_eq!(log.matches("the iptables nfacct match is unusable").count(), 2, "one warning per family:\n{log}");
}

/// The z-pages on the running daemon's metrics server, as upstream 1.36
/// serves them: on by default (ComponentFlagz and ComponentStatusz are beta
/// and on since 1.36). `/flagz` lists every flag with the value it was
/// started with (or its default), `/statusz` the start, uptime, versions
/// and the server's paths, as plain text (also with no `Accept` at all);
/// a `config.k8s.io` `Statusz`/`Flagz` object as JSON for a client that
/// asks for one (the deprecated `v1alpha1` with a warning); a client that
/// accepts neither gets upstream's 406 `Status`. With the gates off in the
/// file's featureGates, both are 404.
#[test]
fn zpages_are_served_on_the_metrics_server_behind_their_gates() {
    let mut lab = Lab::new("zpg", Flavour::Nft, &[]);
    let plain = "Accept: text/plain\r\n";
    let d = lab.start_synced();
    let (head, flagz) = http_exchange_with(&lab.node, 10249, "/flagz", plain).unwrap();
    assert!(head.starts_with("HTTP/1.1 200") && head.contains("text/plain; charset=utf-8"), "{head}");
    let lines: Vec<&str> = flagz.lines().collect();
    assert_eq!(lines[1], "kube-proxy flagz", "{flagz}");
    let value = |name: &str| {
        let line = lines
            .iter()
            .find(|l| l.starts_with(name) && !l[name.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '-'));
        let rest = &line.unwrap_or_else(|| panic!("no {name} in {flagz}"))[name.len()..];
        [": ", ":", "=", " "].iter().find_map(|d| rest.strip_prefix(d)).unwrap_or(rest).to_string()
    };
    assert_eq!(value("config"), lab.config_path().display().to_string(), "given: {flagz}");
    assert_eq!(value("manifests"), lab.manifests().display().to_string(), "{flagz}");
    assert_eq!(value("iptables-sync-period"), "30s", "a default: {flagz}");
    assert_eq!(value("cleanup"), "false", "{flagz}");
    let (head, statusz) = http_exchange_with(&lab.node, 10249, "/statusz", "").unwrap();
    assert!(head.starts_with("HTTP/1.1 200") && head.contains("text/plain; charset=utf-8"), "no Accept: {head}");
    assert!(statusz.contains("kube-proxy statusz"), "{statusz}");
    assert!(statusz.lines().any(|l| l.starts_with("Up") && l.ends_with(" sec")), "{statusz}");
    let line = |key: &str| statusz.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key}: {statusz}"));
    assert!(line("Binary version").ends_with(env!("CARGO_PKG_VERSION")), "{statusz}");
    assert!(line("Emulation version").ends_with(" 1.36"), "{statusz}");
    assert!(line("Paths").ends_with(" /configz /dashboard /flagz /healthz /metrics /proxyMode"), "{statusz}");
    let json = "Accept: application/json;g=config.k8s.io;v=v1beta1;as=Statusz\r\n";
    let (head, body) = http_exchange_with(&lab.node, 10249, "/statusz", json).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("content-type: application/json;g=config.k8s.io;v=v1beta1;as=Statusz"), "{head}");
    let status: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(
        (status["kind"].as_str(), status["apiVersion"].as_str()),
        (Some("Statusz"), Some("config.k8s.io/v1beta1"))
    );
    assert_eq!(status["binaryVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(status["emulationVersion"], "1.36");
    assert!(status["paths"].as_array().unwrap().contains(&json!("/flagz")), "{body}");
    let old = "Accept: application/json;g=config.k8s.io;v=v1alpha1;as=Flagz\r\n";
    let (head, body) = http_exchange_with(&lab.node, 10249, "/flagz", old).unwrap();
    assert!(head.starts_with("HTTP/1.1 200") && head.contains("endpoint is deprecated"), "{head}");
    let flags: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(flags["flags"]["cleanup"], "false", "{body}");
    let (head, body) = http_exchange_with(&lab.node, 10249, "/statusz", "Accept: application/json\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 406"), "{head}");
    let refusal: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!((refusal["kind"].as_str(), refusal["code"].as_u64()), (Some("Status"), Some(406)), "{body}");
    d.stop();
    lab.feature_gates(&[("ComponentFlagz", false), ("ComponentStatusz", false)]);
    let d = lab.start_synced();
    for path in ["/flagz", "/statusz"] {
        let (head, _) = http_exchange_with(&lab.node, 10249, path, plain).unwrap();
        assert!(head.starts_with("HTTP/1.1 404"), "{path} is off with its gate: {head}");
    }
    d.stop();
}

/// Node hints (`trafficDistribution: PreferSameNode`) steer this node's
/// traffic to the endpoint hinted for it: PreferSameTrafficDistribution is
/// GA and locked on (since 1.35), so a file that turns it off is refused at
/// start with upstream's message, exit 1.
#[test]
fn node_hints_steer_traffic_and_prefer_same_traffic_distribution_is_locked_on() {
    let mut lab = Lab::new("hint", Flavour::Nft, &["b1", "b2"]);
    let mut web = service_manifest("web", "10.96.0.10", &["b1", "b2"]);
    let endpoints = web["items"][1]["endpoints"].as_array_mut().unwrap();
    endpoints[0]["hints"] = json!({"forNodes": [{"name": NODE}]});
    endpoints[1]["hints"] = json!({"forNodes": [{"name": "node-b"}]});
    lab.put("web", &web);
    let d = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let answers = lab.ask(WEB, 64, false);
    assert_eq!(names(&answers), set(&["b1"]), "64 connections, all to the endpoint hinted for this node");
    // Without the hints, both endpoints serve.
    lab.put("web", &service_manifest("web", "10.96.0.10", &["b1", "b2"]));
    lab.wait_traffic(WEB, false, &["b1", "b2"], CHANGE_WAIT);
    d.stop();
    lab.feature_gates(&[("PreferSameTrafficDistribution", false)]);
    let mut refused = lab.start();
    let status = refused.wait_exit(START_WAIT);
    let log = refused.log();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("failed complete: cannot set feature gate PreferSameTrafficDistribution to false, feature is locked to true"),
        "{log}"
    );
}

/// (conntrack) A deleted UDP Service's flows to its NodePort and
/// LoadBalancer IPs lose their entries; see `common::conntrack`.
#[test]
fn conntrack_a_deleted_services_node_port_and_load_balancer_flows_are_cleared() {
    let mut lab = Lab::new("ctdel", Flavour::Nft, &["b1"]);
    conntrack::a_deleted_services_node_port_and_load_balancer_flows_are_cleared(&mut lab);
}

/// (conntrack) One of a Service's two UDP ports to one endpoint removed:
/// the other port's flows keep their entries and answers.
#[test]
fn conntrack_a_flow_to_another_port_of_the_same_endpoint_survives() {
    let mut lab = Lab::new("ctport", Flavour::Legacy, &["b1"]);
    conntrack::a_flow_to_another_port_of_the_same_endpoint_survives(&mut lab);
}

/// (conntrack) Entries made while the daemon was stopped, to an endpoint
/// removed meanwhile, go at its first sync; others stay.
#[test]
fn conntrack_an_entry_created_while_the_daemon_was_stopped_is_cleared_at_its_first_sync() {
    let mut lab = Lab::new("ctstop", Flavour::Nft, &["b1", "b2"]);
    conntrack::an_entry_created_while_the_daemon_was_stopped_is_cleared_at_its_first_sync(&mut lab);
}

/// One manifest file holding a whole cluster as one `kind: List` is read
/// item by item, and on the first scan handed over 1,000 objects
/// at a time after a first reading found the file good. The same 3,000
/// Services × 10 endpoints (the benchmark's generated cluster) as one List
/// file and as List files of 500 objects: the daemon's peak RSS with the
/// one file stays within 50 MB of its peak with the small files. This
/// debug binary (jemalloc): 32.5–33.5 MB more (73.2–73.6 against
/// 106.1–106.8 MB), the same when the first scan holds the file's decoded
/// objects instead of handing them over in chunks (at this size that gain
/// is within the allocator's slack; it shows at 10,000 services, release:
/// docs/performance.md); a whole-file value tree costs 116 MB more
/// (release).
#[test]
fn one_large_list_file_costs_little_more_memory_than_small_files() {
    use kube_proxy_rs::bench::daemon_run::{write_manifests, Layout};
    use kube_proxy_rs::bench::gen::{Cluster, ClusterSpec, THIS_NODE};
    let spec = ClusterSpec { services: 3000, endpoints_per_service: 10, nodes: 100, seed: 1 };
    let events = Cluster::new(spec).expect("cluster").initial_events();
    let mut lab = Lab::new("bigfile", Flavour::Legacy, &[]);
    let config = format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n\
         hostnameOverride: {THIS_NODE}\nclusterCIDR: 10.0.0.0/8\niptables:\n  minSyncPeriod: 0s\n"
    );
    std::fs::write(lab.config_path(), config).unwrap();
    let mut peak = |layout: Layout| {
        let dir = lab.manifests();
        for entry in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        write_manifests(&dir, &events, layout).expect("manifests");
        let mut daemon = lab.start();
        let first = lab.wait_sync(&mut daemon, 0, Duration::from_secs(180));
        assert!(first.full && first.failed == 0, "{first:?}");
        let pid = daemon.child.as_ref().expect("running").id();
        let (hwm, rss) = (status_kb(pid, "VmHWM"), status_kb(pid, "VmRSS"));
        eprintln!("{layout:?}: VmHWM {hwm} kB, VmRSS after the first sync {rss} kB");
        daemon.stop();
        hwm
    };
    let small = peak(Layout::Lists);
    let one = peak(Layout::OneFile);
    assert!(one < small + 50 * 1024, "one file: VmHWM {one} kB; files of 500 objects: {small} kB");
}
