//! The daemon binary in nftables mode, end to end: `kube-proxy-rs --config
//! FILE --manifests DIR` with `mode: nftables` runs inside a network
//! namespace playing the node, programs that namespace's `ip kube-proxy`
//! (and `ip6 kube-proxy`) table through its own nf_tables netlink client,
//! and real TCP and UDP packets from a client namespace reach backend
//! namespaces through ClusterIPs. Covers: endpoint changes (partial syncs,
//! stale chains deleted a second later), a deleted Service, a restart
//! keeping an established connection, taking over a table upstream
//! kube-proxy wrote (`nft -f` of the dry run's text, watched with `nft
//! monitor`), `--cleanup`, switching between iptables and nftables mode,
//! dual-stack, the Kubernetes API source (`--master`, the test API
//! server in the node namespace), and the conntrack reconciler's UDP flows
//! (`common::conntrack`, as in `iptables_daemon`).
//!
//! The lab is `iptables_daemon`'s (`common::lab`): a node namespace routing
//! between a client on 192.168.50.0/24 (fd00:50::/64) and backends b1, b2
//! on 10.244.N.0/24 (fd00:244:N::/64), each answering TCP and UDP on 8080
//! with its name and the source it saw. The daemon is started with `ip
//! netns exec NODE kube-proxy-rs ...`, stopped with SIGTERM (exit 0
//! asserted), and a guard kills one a panicking test left running; its log
//! is printed when a test fails. The test reads the kernel with `nft list`.
//!
//! Needs root, iproute2, nft and iptables (the daemon looks for the other
//! modes' leftovers with the host's `iptables`); nothing is skipped. All
//! traffic stays inside the namespaces created here.

mod common;

use std::io::ErrorKind;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{self, create_items, wait_for, Daemon, SyncRec};
use common::lab::{self, addr, names, set, Answer, Backend, Conn, Probe, Probes, NODE_IP, NODE_IP6};
use common::nft::{self, blocks, Monitor};
use common::{bin, conntrack, Netns};
use kube_proxy_rs::plan::nftables::names::hash_and_truncate;
use kube_proxy_rs::plan::nftables::NftRuleset;
use serde_json::{json, Value};

const NODE: &str = "node-a";
const DROP_WAIT: Duration = Duration::from_millis(700);
/// How long the daemon may take to start and finish its first sync.
const START_WAIT: Duration = Duration::from_secs(15);
/// How long a manifest change may take to show (inotify settle time, one
/// sync, one transaction; stale chains a second later).
const CHANGE_WAIT: Duration = Duration::from_secs(6);
const WEB: &str = "10.96.0.10:80";

// ------------------------------------------------------------------ the lab

struct Lab {
    node: Netns,
    client: Netns,
    _backends: Vec<Backend>,
    dir: tempfile::TempDir,
    started: usize,
    /// The daemon's PATH, when not the tests' own.
    path: Option<PathBuf>,
    /// The nftables ruleset the config file asks for (`nftables.ruleset`).
    ruleset: NftRuleset,
}

impl Lab {
    fn new(tag: &str, backends: &[&'static str]) -> Lab {
        Lab::in_ruleset(tag, backends, NftRuleset::Upstream)
    }

    /// A lab whose config file asks for `ruleset`.
    fn in_ruleset(tag: &str, backends: &[&'static str], ruleset: NftRuleset) -> Lab {
        let short = &ruleset.name()[..1];
        let (node, client, list) = lab::topology(&format!("nfd{short}-{tag}"), backends);
        let dir = tempfile::tempdir().expect("tempdir");
        let lab = Lab { node, client, _backends: list, dir, started: 0, path: None, ruleset };
        std::fs::create_dir(lab.manifests()).unwrap();
        lab.config("nftables", "30s");
        lab.put("node", &node_manifest(false));
        lab
    }

    fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    /// Writes the config file: `mode` with `sync_period` (minSyncPeriod 0s)
    /// and the lab's nftables ruleset.
    fn config(&self, mode: &str, sync_period: &str) {
        let ruleset = self.ruleset;
        let text = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\n\
             hostnameOverride: {NODE}\nclusterCIDR: 10.244.0.0/16,fd00:244::/48\n\
             iptables:\n  syncPeriod: {sync_period}\n  minSyncPeriod: 0s\n\
             nftables:\n  syncPeriod: {sync_period}\n  minSyncPeriod: 0s\n  ruleset: {ruleset}\n"
        );
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

    fn command(&self) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.node.name, &bin()])
            .env("XTABLES_LOCKFILE", self.dir.path().join("xtables.lock"))
            .env_remove("RUST_LOG");
        if let Some(path) = &self.path {
            c.env("PATH", path);
        }
        c
    }

    /// Runs the daemon with no iptables, ip6tables, nft or conntrack tool
    /// on its PATH (only `ip`, which enters the namespace): nftables mode
    /// needs none of them.
    fn without_tools(&mut self) {
        let bin = self.dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink("/usr/sbin/ip", bin.join("ip")).unwrap();
        self.path = Some(bin);
    }

    /// `kube-proxy-rs ARGS` in the node namespace, run to completion.
    fn run_binary(&self, args: &[&str]) -> std::process::Output {
        self.command().args(args).output().expect("run kube-proxy-rs")
    }

    /// Starts the daemon on the lab's config and manifests.
    fn start(&mut self) -> Daemon {
        let manifests = self.manifests();
        self.start_with(&["--manifests".as_ref(), manifests.as_os_str()])
    }

    /// Starts the daemon on the lab's config and the `source` arguments.
    fn start_with(&mut self, source: &[&std::ffi::OsStr]) -> Daemon {
        self.started += 1;
        let log = self.dir.path().join(format!("daemon-{}.log", self.started));
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let child = self
            .command()
            .arg("--config")
            .arg(self.config_path())
            .args(source)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start kube-proxy-rs");
        Daemon { child: Some(child), log, node: self.node.name.clone() }
    }

    /// A dual-stack Node (the config has a cluster CIDR per family).
    fn dual_stack(&self) {
        self.put("node", &node_manifest(true));
    }

    /// Starts the daemon and waits for its first sync (full and successful).
    fn start_synced(&mut self) -> Daemon {
        let mut d = self.start();
        let first = self.wait_sync(&mut d, 0, START_WAIT);
        assert!(first.full, "the first sync is full: {first:?}");
        d
    }

    fn ask(&self, to: &str, n: usize, udp: bool) -> Vec<Answer> {
        lab::ask(&self.client, to, n, udp, DROP_WAIT)
    }

    /// Waits until a round of exchanges with `to` all succeed and together
    /// reach exactly the backends `want`.
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

    /// `nft list table FAMILY kube-proxy`; `None` if there is no such table.
    fn table(&self, family: &str) -> Option<String> {
        let out = self.node.exec(&["nft", "list", "table", family, "kube-proxy"]);
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn tables(&self) -> String {
        self.node.ok(&["nft", "list", "tables"])
    }

    /// The handle of table `FAMILY kube-proxy` (`nft -a`): a table deleted
    /// and added again gets a new one.
    fn table_handle(&self, family: &str) -> String {
        let listed = self.node.ok(&["nft", "-a", "list", "table", family, "kube-proxy"]);
        let first = listed.lines().next().unwrap_or_default();
        let handle = first.split_once("# handle ").map(|(_, h)| h.trim().to_string());
        handle.unwrap_or_else(|| panic!("no handle in {first:?}"))
    }

    /// `--dry-run --proxy-mode nftables` on the lab's config and manifests:
    /// per family (`ip`, then `ip6` if the node runs it) the transaction a
    /// full sync from an empty kernel writes, as `nft -f` takes it.
    fn dry_run(&self) -> Vec<(&'static str, String)> {
        let (config, manifests) = (self.config_path(), self.manifests());
        let out = self
            .command()
            .arg("--config")
            .arg(&config)
            .arg("--manifests")
            .arg(&manifests)
            .args(["--dry-run", "--proxy-mode", "nftables"])
            .output()
            .expect("run kube-proxy-rs --dry-run");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "--dry-run: {}", String::from_utf8_lossy(&out.stderr));
        let sections: Vec<(&'static str, String)> = [("ip", "# nftables"), ("ip6", "# nftables ipv6")]
            .into_iter()
            .filter_map(|(family, heading)| nft::section(&text, heading).map(|s| (family, s.to_string())))
            .collect();
        assert_eq!(sections.first().map(|s| s.0), Some("ip"), "{text}");
        sections
    }

    /// Waits until `pred` holds for the IPv4 table's listing.
    fn wait_table(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        wait_for(what, CHANGE_WAIT, || {
            let t = self.table("ip").unwrap_or_default();
            if pred(&t) {
                Ok(t)
            } else {
                Err(t)
            }
        })
    }

    /// Both families' nat and filter tables (`iptables-save`, `ip6tables-save`),
    /// without kubelet's KUBE-FIREWALL (which iptables mode keeps).
    fn iptables_rules(&self) -> String {
        let save = |tool: &str, table: &str| self.node.ok(&[tool, "-t", table]);
        let saved: Vec<String> = ["iptables-save", "ip6tables-save"]
            .iter()
            .flat_map(|t| ["nat", "filter"].map(|table| save(t, table)))
            .collect();
        saved
            .iter()
            .flat_map(|s| s.lines())
            .filter(|l| !l.contains("KUBE-FIREWALL"))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// Waits until `there` no longer holds: what a mode switch removes after the new mode's first sync.
    fn wait_gone(&self, what: &str, there: impl Fn(&Lab) -> bool) {
        wait_for(what, CHANGE_WAIT, || if there(self) { Err("still there".to_string()) } else { Ok(()) })
    }

    /// The daemon's recent syncs, newest first, once the coordinator answers.
    fn syncs(&self) -> Result<Vec<SyncRec>, String> {
        daemon::syncs(&self.node)
    }

    /// Waits for the first sync after generation `after`. Panics if a sync failed or the daemon exited.
    fn wait_sync(&self, daemon: &mut Daemon, after: u64, timeout: Duration) -> SyncRec {
        wait_for(&format!("a sync after generation {after}"), timeout, || {
            daemon.assert_running();
            let syncs = self.syncs()?;
            let new: Vec<&SyncRec> = syncs.iter().filter(|s| s.generation > after).collect();
            assert!(new.iter().all(|s| s.failed == 0), "a sync failed: {syncs:?}\n{}", daemon.log());
            new.into_iter().min_by_key(|s| s.generation).cloned().ok_or_else(|| format!("{syncs:?}"))
        })
    }

    /// `/metrics`: the sum of `family`'s samples named `name`.
    fn family_metric(&self, name: &str, family: &str) -> Option<f64> {
        daemon::family_metric(&self.node, name, family)
    }
}

crate::impl_daemon_lab!(Lab);

// ---------------------------------------------------------------- manifests

fn node_manifest(dual: bool) -> Value {
    let mut addresses = vec![json!({"type": "InternalIP", "address": NODE_IP})];
    if dual {
        addresses.push(json!({"type": "InternalIP", "address": NODE_IP6}));
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        "spec": {"podCIDRs": ["10.244.0.0/16", "fd00:244::/48"]},
        "status": {"addresses": addresses},
    })
}

fn web(backends: &[&str]) -> Value {
    daemon::dual_stack_service_manifest("web", &["10.96.0.10"], 30010, backends)
}

/// The chain names of an `nft list table` listing.
fn chains(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("chain "))
        .map(|l| l.trim_end_matches(" {").to_string())
        .collect()
}

// -------------------------------------------------------------------- tests

crate::rulesets!(
    source_ranges_with_leading_zeros_apply_and_unparseable_ones_admit_no_one,
    traffic_follows_endpoints_and_deleted_services_leave_nothing,
    an_established_connection_survives_a_daemon_restart,
    the_api_source_programs_a_dual_stack_service,
    cleanup_removes_the_tables,
    switching_between_iptables_and_nftables_mode_removes_the_other_modes_state,
    a_dual_stack_service_answers_on_both_families,
    a_failed_transaction_makes_the_next_sync_full_and_repairs_the_table,
    the_sync_period_writes_nothing_while_the_cluster_is_quiet,
    the_sync_period_repairs_a_deleted_table_and_ignores_other_tables,
    service_cidrs_drop_unallocated_cluster_ips_until_deleted,
    conntrack_a_deleted_services_node_port_and_load_balancer_flows_are_cleared,
    conntrack_a_flow_to_another_port_of_the_same_endpoint_survives,
    conntrack_an_entry_created_while_the_daemon_was_stopped_is_cleared_at_its_first_sync,
);

/// loadBalancerSourceRanges as upstream's sloppy parser reads them, by
/// packets (see `daemon::SOURCE_RANGE_CASES`): `192.168.050.000/024`
/// admits the client, `198.051.100.000/024` drops it, and a range that
/// does not parse at all drops everyone rather than admitting everyone;
/// `--dry-run` shows the same firewall chains.
fn source_ranges_with_leading_zeros_apply_and_unparseable_ones_admit_no_one(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("lbsr", &["b1"], ruleset);
    for case in &daemon::SOURCE_RANGE_CASES {
        lab.put(case.name, &daemon::source_range_manifest(case));
    }
    let planned = lab.dry_run();
    let text = &planned[0].1;
    let firewall = |name: &str| -> Option<&str> {
        let chain = format!("-default/{name}/tcp/http ");
        text.lines()
            .filter(|l| l.starts_with("add rule ip kube-proxy firewall-"))
            .find_map(|l| l.split_once(&chain).map(|(_, rule)| rule))
    };
    // A range holding the node's IP lets the node reach the VIP (upstream's allowFromNode).
    assert_eq!(firewall("lb-in"), Some("ip saddr != { 192.168.50.0/24 , 203.0.113.10 } drop"), "{text}");
    assert_eq!(firewall("lb-out"), Some("ip saddr != { 198.51.100.0/24 } drop"), "{text}");
    assert_eq!(firewall("lb-bogus"), Some("drop"), "{text}");
    assert_eq!(firewall("lb-mixed"), Some("ip saddr != { 192.168.50.0/24 , 203.0.113.13 } drop"), "{text}");
    for case in &daemon::SOURCE_RANGE_CASES {
        let element = format!("add element ip kube-proxy firewall-ips {{ {} . tcp . 80 : goto firewall-", case.vip);
        assert!(text.contains(&element), "{element} not in\n{text}");
    }
    // lb-in's endpoint, written 010.244.001.002: its endpoint chain, or its slot.
    let lb_in_endpoint = match ruleset {
        NftRuleset::Upstream => "-default/lb-in/tcp/http__10.244.1.2/8080 ",
        NftRuleset::Maps => {
            "add element ip kube-proxy maps-cluster-endpoints { 203.0.113.10 . tcp . 80 . 0 : 10.244.1.2 . 8080 }"
        }
    };
    assert!(text.lines().any(|l| l.contains(lb_in_endpoint)), "{text}");
    let daemon = lab.start_synced();
    daemon::assert_source_ranges(&lab.node, &lab.client, DROP_WAIT, CHANGE_WAIT);
    daemon::assert_source_ranges_logged(&daemon.stop());
}

/// ClusterIP and NodePort traffic reaches the endpoints; an endpoint
/// removed is a partial sync after which traffic avoids it and, a second
/// later, its chains are gone from the table; a deleted Service's chains
/// and map elements go too, and another Service never stops answering.
fn traffic_follows_endpoints_and_deleted_services_leave_nothing(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("flow", &["b1", "b2"], ruleset);
    lab.put("web", &web(&["b1", "b2"]));
    lab.put("api", &daemon::dual_stack_service_manifest("api", &["10.96.0.11"], 30011, &["b1"]));
    let mut daemon = lab.start_synced();
    let both = ["b1", "b2"];
    lab.wait_traffic(WEB, false, &both, CHANGE_WAIT);
    lab.wait_traffic(WEB, true, &both, CHANGE_WAIT);
    lab.wait_traffic(&format!("{NODE_IP}:30010"), false, &both, CHANGE_WAIT);
    lab.wait_traffic("10.96.0.11:80", false, &["b1"], CHANGE_WAIT);
    // Off-cluster clients are masqueraded (to the node's address toward the backend).
    let seen = lab.ask(WEB, 8, false);
    assert!(seen.iter().all(|a| a.as_ref().is_ok_and(|(_, src)| src.starts_with("10.244."))), "{seen:?}");
    let table = lab.table("ip").expect("the ip kube-proxy table");
    let b2_chains: Vec<String> = chains(&table).into_iter().filter(|c| c.contains("10.244.2.2")).collect();
    match ruleset {
        NftRuleset::Upstream => {
            assert!(table.contains("10.244.2.2") && table.contains("default/web/tcp/http"), "{table}");
            assert_eq!(b2_chains.len(), 2, "b2's endpoint chains (http and dns): {table}");
        }
        NftRuleset::Maps => {
            assert!(table.contains(": 10.244.2.2 . 8080") && table.contains("10.244.2.2 . 10.244.2.2"), "{table}");
            assert!(b2_chains.is_empty() && !table.contains("default/web"), "no chain per Service: {table}");
        }
    }

    // b2 goes: a partial sync, then its endpoint chains are deleted.
    let last = lab.syncs().expect("syncs")[0].generation;
    lab.put("web", &web(&["b1"]));
    let sync = lab.wait_sync(&mut daemon, last, CHANGE_WAIT);
    assert!(!sync.full && sync.ops > 0, "an endpoint change is a partial sync: {sync:?}");
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    lab.wait_traffic(WEB, true, &["b1"], CHANGE_WAIT);
    let flushed_at = Instant::now();
    lab.wait_table("b2's chains or elements deleted", |t| !t.contains("10.244.2.2"));
    assert!(flushed_at.elapsed() < Duration::from_secs(4), "deleted about a second later, not at the syncPeriod");

    // web is deleted: its chains and elements go; api keeps answering.
    lab.remove("web");
    lab.wait_table("web's objects gone", |t| !t.contains("default/web") && !t.contains("10.96.0.10"));
    assert_eq!(lab.ask(WEB, 1, false), [Err(ErrorKind::TimedOut)], "no DNAT for a deleted Service");
    lab.wait_traffic("10.96.0.11:80", false, &["b1"], CHANGE_WAIT);

    // Metrics per family, as upstream's.
    let n = lab.family_metric("kubeproxy_sync_proxy_rules_duration_seconds_count", "IPv4");
    assert!(n.is_some_and(|n| n >= 3.0), "{n:?}");
    let failed = lab.family_metric("kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "IPv4");
    assert_eq!(failed, Some(0.0));
    let log = daemon.stop();
    assert!(log.contains("mode=\"nftables\"") || log.contains("mode=nftables"), "{log}");
}

/// SIGTERM leaves the table as it is and a new daemon adopts it: an
/// established TCP connection through a ClusterIP keeps exchanging data
/// while no daemon runs and after the new one's first (full) sync; an
/// endpoint added meanwhile is picked up.
fn an_established_connection_survives_a_daemon_restart(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("rst", &["b1", "b2"], ruleset);
    lab.put("web", &web(&["b1"]));
    let daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let mut conn = lab.client.run(|| Conn::open(addr(WEB), DROP_WAIT)).expect("connect through the ClusterIP");
    let first = conn.exchange().expect("first exchange");
    assert_eq!(first, ("b1".to_string(), "10.244.1.1".to_string()));

    daemon.stop();
    assert_eq!(conn.exchange(), Ok(first.clone()), "no daemon: the connection still works");
    assert_eq!(names(&lab.ask(WEB, 3, false)), set(&["b1"]), "no daemon: new connections still work");
    lab.put("web", &web(&["b1", "b2"]));

    let second = lab.start_synced();
    assert_eq!(conn.exchange(), Ok(first.clone()), "after the new daemon's full sync");
    lab.wait_traffic(WEB, false, &["b1", "b2"], CHANGE_WAIT);
    assert_eq!(conn.exchange(), Ok(first), "after the new daemon's full sync and traffic");
    second.stop();
}

/// Taking over the table upstream kube-proxy's nftables mode wrote: `nft -f`
/// of its transaction text (our dry run's, byte for byte) for the current
/// objects, plus what an earlier run wrote for a Service deleted while no
/// kube-proxy ran (the lines of a dry run with that Service that the
/// current one lacks: its `service-`, `external-` and `endpoint-` chains
/// and its `cluster-ips`, `service-ips` and `service-nodeports` elements).
/// The daemon's first sync adopts the table in place: it is never deleted
/// (no `delete table` event, the same handle); an established connection
/// keeps working and new TCP and UDP connections are answered all through
/// the start; the per-service chains are rewritten in place first (each in
/// one transaction), then the sync's last transaction resets the maps: the
/// deleted Service's elements go there and its chains are flushed there,
/// and a transaction of their own deletes them about a second later
/// (upstream's order); and the table ends as the dry run's text loads it.
#[test]
fn a_table_upstream_wrote_is_taken_over_in_place() {
    let mut lab = Lab::new("tko", &["b1", "b2"]);
    lab.put("web", &web(&["b1", "b2"]));
    let current = lab.dry_run();
    lab.put("gone", &daemon::dual_stack_service_manifest("gone", &["10.96.0.99"], 30099, &["b1"]));
    let earlier = lab.dry_run();
    lab.remove("gone");
    for (_, text) in &current {
        lab.node.pipe(&["nft", "-f", "-"], text);
    }
    let loaded: Vec<(&str, String)> =
        current.iter().map(|(f, _)| (*f, lab.table(f).expect("the table nft -f loaded"))).collect();
    let gone = format!("service-{}", hash_and_truncate("default/gone/tcp/http"));
    let leftovers: String =
        earlier[0].1.lines().filter(|l| !current[0].1.lines().any(|c| c == *l)).map(|l| format!("{l}\n")).collect();
    for want in [
        format!("add chain ip kube-proxy {gone}\n"),
        format!("add element ip kube-proxy service-ips {{ 10.96.0.99 . tcp . 80 : goto {gone} }}\n"),
    ] {
        assert!(leftovers.contains(&want), "{want:?} not in:\n{leftovers}");
    }
    lab.node.pipe(&["nft", "-f", "-"], &leftovers);
    let handle = lab.table_handle("ip");
    lab.wait_traffic(WEB, false, &["b1", "b2"], CHANGE_WAIT);
    lab.wait_traffic("10.96.0.99:80", false, &["b1"], CHANGE_WAIT);
    let mut conn = lab.client.run(|| Conn::open(addr(WEB), DROP_WAIT)).expect("connect through the ClusterIP");
    let first = conn.exchange().expect("first exchange");

    let monitor = Monitor::start(&lab.node);
    let started = Instant::now();
    let probes = Probes::start(&lab.client, WEB, DROP_WAIT);
    std::thread::sleep(Duration::from_millis(200));
    let mut daemon = lab.start();
    let sync = lab.wait_sync(&mut daemon, 0, START_WAIT);
    assert!(sync.full, "{sync:?}");
    assert_eq!(conn.exchange(), Ok(first.clone()), "after the daemon's first sync");
    lab.wait_table("the deleted Service's chains deleted", |t| !t.contains("default/gone"));
    std::thread::sleep(Duration::from_millis(500));
    let probes = probes.stop();
    assert_eq!(conn.exchange(), Ok(first), "after the stale chains' deletion");

    // The daemon's transactions on the ip table: the full sync's (the last
    // one resets the maps), then the deletion.
    let ours: Vec<nft::MonitoredTx> =
        monitor.transactions().into_iter().filter(|t| t.events.iter().any(|e| e.contains(" ip kube-proxy "))).collect();
    let [syncs @ .., sync_tx, delete_tx] = ours.as_slice() else { panic!("the sync's, then the deletion: {ours:#?}") };
    let has = |t: &nft::MonitoredTx, prefix: &str| t.events.iter().any(|e| e.starts_with(prefix));
    let element = format!("delete element ip kube-proxy service-ips {{ 10.96.0.99 . tcp . 80 : goto {gone} }}");
    assert!(has(sync_tx, &element), "the element goes in the full sync's last transaction: {sync_tx:#?}");
    assert!(has(sync_tx, &format!("delete rule ip kube-proxy {gone} handle ")), "flushed: {sync_tx:#?}");
    for t in syncs.iter().chain([sync_tx]) {
        assert!(!has(t, &format!("delete chain ip kube-proxy {gone}")), "not deleted yet: {t:#?}");
        assert!(!has(t, "add element ip kube-proxy cluster-ips { 10.96.0.99 }"), "{t:#?}");
    }
    // The chains rewritten in place before: the web Service's endpoint chain among them.
    assert!(syncs.iter().any(|t| has(t, "add rule ip kube-proxy endpoint-")), "per-service chains first: {syncs:#?}");
    assert!(delete_tx.events.iter().all(|e| e.starts_with("delete chain ip kube-proxy ")), "{delete_tx:#?}");
    assert!(has(delete_tx, &format!("delete chain ip kube-proxy {gone}")), "{delete_tx:#?}");
    // A second between the commits: the monitor reads each transaction's
    // events a little after its commit, the big first one later than the
    // small second, hence 0.1 s of slack.
    let delay = delete_tx.at - sync_tx.at;
    assert!(delay >= Duration::from_millis(900) && delay < Duration::from_secs(4), "{delay:?}");
    let all = monitor.transactions();
    let mut events = all.iter().flat_map(|t| &t.events);
    assert!(!events.any(|e| e.starts_with("delete table") && e.ends_with(" kube-proxy")), "{all:#?}");
    assert_eq!(lab.table_handle("ip"), handle, "the same table, never deleted");

    // New connections were answered before, during and after the take-over.
    let failed: Vec<&Probe> = probes.iter().filter(|(_, tcp, udp)| tcp.is_err() || udp.is_err()).collect();
    assert!(failed.is_empty(), "{} of {} probes failed: {failed:?}", failed.len(), probes.len());
    let when = |from: Instant, to: Instant| probes.iter().filter(|p| p.0 > from && p.0 < to).count();
    let first_tx = syncs.first().unwrap_or(sync_tx).at;
    assert!(when(started, first_tx) > 0, "probes before the daemon's first transaction: {probes:?}");
    assert!(when(sync_tx.at, delete_tx.at) > 0 && when(delete_tx.at, Instant::now()) > 0, "{probes:?}");
    let tcp: Vec<Answer> = probes.iter().map(|p| p.1.clone()).collect();
    assert_eq!(names(&tcp), set(&["b1", "b2"]));

    // The table is the dry run's, the deleted Service's objects gone.
    for (family, listing) in &loaded {
        let now = lab.table(family).expect("the table");
        assert_eq!(blocks(&now), blocks(listing), "{family}: now\n{now}\nloaded\n{listing}");
        assert_eq!(now.lines().count(), listing.lines().count(), "{family}: now\n{now}\nloaded\n{listing}");
    }
    assert_eq!(lab.ask("10.96.0.99:80", 1, false), [Err(ErrorKind::TimedOut)], "no DNAT for the deleted Service");
    daemon.stop();
}

/// How a node moves from one ruleset to the other.
#[derive(Clone, Copy, PartialEq)]
enum Switch {
    /// The daemon stopped and started with the other ruleset; the first
    /// table is upstream's own (`nft -f` of its text, as upstream
    /// kube-proxy leaves it).
    Restart,
    /// `nftables.ruleset` changed in the file and SIGHUP: the reload's full
    /// resync; the first table is the daemon's upstream ruleset.
    Reload,
}

/// Whether the listing `table` holds `ruleset`'s objects and none of the other's.
fn holds_only(ruleset: NftRuleset, table: &str) -> bool {
    // Upstream's per-Service chains are named `…-<hash>-<namespace>/<name>/…`.
    let per_service = chains(table).iter().any(|c| c.contains('/'));
    match ruleset {
        NftRuleset::Upstream => !table.contains("maps-") && table.contains("map service-ips {") && per_service,
        NftRuleset::Maps => {
            !table.contains("map service-ips {") && table.contains("maps-cluster-endpoints") && !per_service
        }
    }
}

/// A node switching from upstream's ruleset to `maps`, back, and to `maps`
/// again, by `how`. An established TCP connection keeps exchanging, and a
/// new TCP and UDP connection every 0.1 s (`Probes`) is answered
/// throughout, including while no daemon runs; after each switch the table
/// holds the running ruleset's objects only (the other's go in the first
/// sync, its chains a second later).
fn switching_rulesets_drops_no_connection(tag: &str, how: Switch) {
    let mut lab = Lab::new(tag, &["b1", "b2"]);
    let both = ["b1", "b2"];
    lab.put("web", &web(&both));
    let mut running = match how {
        Switch::Restart => {
            for (_, text) in lab.dry_run() {
                lab.node.pipe(&["nft", "-f", "-"], &text);
            }
            None
        }
        Switch::Reload => Some(lab.start_synced()),
    };
    lab.wait_traffic(WEB, false, &both, CHANGE_WAIT);
    let mut conn = lab.client.run(|| Conn::open(addr(WEB), DROP_WAIT)).expect("connect through the ClusterIP");
    let first = conn.exchange().expect("first exchange");
    let probes = Probes::start(&lab.client, WEB, DROP_WAIT);
    for ruleset in [NftRuleset::Maps, NftRuleset::Upstream, NftRuleset::Maps] {
        lab.ruleset = ruleset;
        lab.config("nftables", "30s");
        let daemon = match running.take() {
            Some(mut daemon) => {
                let last = lab.syncs().expect("syncs")[0].generation;
                daemon.reload();
                let resync = lab.wait_sync(&mut daemon, last, CHANGE_WAIT);
                assert!(resync.full, "the reload is followed by a full resync: {resync:?}");
                daemon
            }
            None => lab.start_synced(),
        };
        lab.wait_table(&format!("the {ruleset} ruleset's objects only"), |t| holds_only(ruleset, t));
        lab.wait_traffic(WEB, false, &both, CHANGE_WAIT);
        lab.wait_traffic(WEB, true, &both, CHANGE_WAIT);
        assert_eq!(conn.exchange(), Ok(first.clone()), "after switching to {ruleset}");
        match how {
            Switch::Restart => {
                daemon.stop();
                std::thread::sleep(Duration::from_millis(300));
            }
            Switch::Reload => running = Some(daemon),
        }
    }
    if let Some(daemon) = running {
        let log = daemon.stop();
        let applied = log.lines().filter(|l| l.contains("config reloaded: applying") && l.contains("nftables.ruleset"));
        assert_eq!(applied.count(), 3, "{log}");
    }
    let probes = probes.stop();
    let failed: Vec<&Probe> = probes.iter().filter(|(_, tcp, udp)| tcp.is_err() || udp.is_err()).collect();
    assert!(failed.is_empty(), "{} of {} probes failed: {failed:?}", failed.len(), probes.len());
    assert!(probes.len() > 30, "{probes:?}");
    let tcp: Vec<Answer> = probes.iter().map(|p| p.1.clone()).collect();
    assert_eq!(names(&tcp), set(&both));
}

/// Upstream's table → `maps` → `upstream` → `maps` by restarts.
#[test]
fn switching_between_the_rulesets_drops_no_connection() {
    switching_rulesets_drops_no_connection("rsw", Switch::Restart);
}

/// The same by SIGHUP: `nftables.ruleset` applies live.
#[test]
fn a_reload_switches_the_ruleset_and_drops_no_connection() {
    switching_rulesets_drops_no_connection("rhup", Switch::Reload);
}

/// Issue 27: `--dry-run --diff` over a table holding the kernel's affinity
/// entries. The dry run's table loaded with `nft -f` (a ClientIP-affinity
/// Service with two endpoints), a client's connections through its
/// ClusterIP all reach one backend, and the kernel has added the client
/// to an `affinity-…` set (`... expires 9m59s`). The preview has nothing to
/// add or remove, and says so the same way a second later.
#[test]
fn the_preview_leaves_the_kernels_affinity_entries_out() {
    let lab = Lab::new("aff", &["b1", "b2"]);
    lab.put("sticky", &daemon::sticky_service_manifest("sticky", &["10.96.0.12"], 30012, &["b1", "b2"], 600));
    for (_, text) in lab.dry_run() {
        lab.node.pipe(&["nft", "-f", "-"], &text);
    }
    let answers = lab.ask("10.96.0.12:80", 8, false);
    assert_eq!(names(&answers).len(), 1, "one backend for the client: {answers:?}");
    let table = lab.table("ip").expect("the table");
    let entries: Vec<&str> = table.lines().filter(|l| l.contains(lab::CLIENT_IP) && l.contains(" expires ")).collect();
    assert_eq!(entries.len(), 1, "the client in one affinity set:\n{table}");

    let run = |args: &[&str]| lab.run_binary(args);
    let preview = daemon::preview_twice_unchanged(run, &lab.config_path(), &lab.manifests());
    assert!(!preview.contains("affinity-"), "no affinity line to change:\n{preview}");
    assert!(lab.table("ip").expect("the table").contains(" expires "), "the entry is still there");
}

/// The Kubernetes API source in nftables mode, end to end: the daemon
/// started with `--master` (the test API server: real list and watch,
/// kube-rs's watcher) programs a RequireDualStack Service in both tables;
/// an endpoint removed from its IPv4 EndpointSlice through the API server
/// arrives as a partial sync, after which IPv4 traffic avoids it (IPv6
/// still reaches both) and its chains leave the table; the Service deleted
/// through the API server leaves nothing of it in either table.
fn the_api_source_programs_a_dual_stack_service(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("api", &["b1", "b2"], ruleset);
    let (api, _serving) = lab.node.api_server();
    api.create(&node_manifest(true)).unwrap();
    let web = daemon::dual_stack_service_manifest("web", &["10.96.0.40", "fd00:96::40"], 30040, &["b1", "b2"]);
    create_items(&api, &web);
    let mut daemon = lab.start_with(&["--master".as_ref(), api.url().as_ref()]);
    let first = lab.wait_sync(&mut daemon, 0, START_WAIT);
    assert!(first.full, "{first:?}");
    let both = ["b1", "b2"];
    for to in ["10.96.0.40:80", "[fd00:96::40]:80", "192.168.50.1:30040", "[fd00:50::1]:30040"] {
        lab.wait_traffic(to, false, &both, CHANGE_WAIT);
        lab.wait_traffic(to, true, &both, CHANGE_WAIT);
    }

    // b1 leaves the IPv4 slice: a partial sync of web's two ports.
    let last = lab.syncs().expect("syncs")[0].generation;
    let partial = "kubeproxy_sync_partial_proxy_rules_duration_seconds_count";
    let partials = lab.family_metric(partial, "IPv4").unwrap_or(0.0);
    let mut v4_slice = web["items"][1].clone();
    assert_eq!(v4_slice["addressType"], "IPv4");
    v4_slice["endpoints"] = json!([v4_slice["endpoints"][1].clone()]);
    api.update(&v4_slice).expect("update the IPv4 EndpointSlice");
    let sync = lab.wait_sync(&mut daemon, last, CHANGE_WAIT);
    assert!(!sync.full && sync.ops > 0 && sync.ports_changed == 2, "a partial sync of http and dns: {sync:?}");
    assert!(lab.family_metric(partial, "IPv4").is_some_and(|n| n > partials), "{partial} counted it");
    lab.wait_traffic("10.96.0.40:80", false, &["b2"], CHANGE_WAIT);
    lab.wait_traffic("10.96.0.40:80", true, &["b2"], CHANGE_WAIT);
    lab.wait_traffic("[fd00:96::40]:80", false, &both, CHANGE_WAIT);
    lab.wait_table("b1's endpoint chains deleted", |t| !t.contains("10.244.1.2"));

    // The Service deleted: nothing of it in either table.
    let last = lab.syncs().expect("syncs")[0].generation;
    api.delete(&web["items"][0]).expect("delete the Service");
    let sync = lab.wait_sync(&mut daemon, last, CHANGE_WAIT);
    assert!(!sync.full, "{sync:?}");
    wait_for("web's chains and elements gone from both tables", CHANGE_WAIT, || {
        let (v4, v6) = (lab.table("ip").unwrap_or_default(), lab.table("ip6").unwrap_or_default());
        let left = [(&v4, "default/web"), (&v4, "10.96.0.40"), (&v6, "default/web"), (&v6, "fd00:96::40")];
        match left.iter().find(|(t, what)| t.contains(what)) {
            Some((t, what)) => Err(format!("{what} in\n{t}")),
            None => Ok(()),
        }
    });
    assert_eq!(lab.ask("10.96.0.40:80", 1, false), [Err(ErrorKind::TimedOut)], "no DNAT for a deleted Service");
    let failed = lab.family_metric("kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "IPv6");
    assert_eq!(failed, Some(0.0));
    let log = daemon.stop();
    assert!(log.contains("kube-proxy running in dual-stack mode"), "{log}");
}

/// `kube-proxy-rs --cleanup` after the daemon ran: no `kube-proxy` table is
/// left in either family, someone else's table is untouched, and a second
/// cleanup (nothing to delete) succeeds.
fn cleanup_removes_the_tables(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("cln", &["b1"], ruleset);
    lab.node.pipe(&["nft", "-f", "-"], "add table ip mine\nadd chain ip mine c\n");
    lab.put("web", &web(&["b1"]));
    let daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    daemon.stop();
    assert!(lab.table("ip").is_some(), "{}", lab.tables());
    for round in ["first", "second"] {
        let out = lab.run_binary(&["--cleanup"]);
        assert!(out.status.success(), "{round} --cleanup: {}", String::from_utf8_lossy(&out.stderr));
        let tables = lab.tables();
        assert!(!tables.contains("kube-proxy"), "{round}: {tables}");
        assert!(tables.contains("table ip mine"), "{round}: {tables}");
    }
    assert_eq!(lab.ask(WEB, 1, false), [Err(ErrorKind::TimedOut)], "no DNAT after cleanup");
}

/// Switching modes, both ways: iptables mode after nftables mode deletes
/// our tables; nftables mode after iptables mode removes iptables mode's
/// chains; traffic works in each.
fn switching_between_iptables_and_nftables_mode_removes_the_other_modes_state(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("sw", &["b1", "b2"], ruleset);
    lab.put("web", &web(&["b1", "b2"]));
    let daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1", "b2"], CHANGE_WAIT);
    daemon.stop();
    assert!(lab.table("ip").is_some());

    lab.config("iptables", "30s");
    let daemon = lab.start_synced();
    lab.wait_gone("nftables mode's tables deleted after the first sync", |lab| lab.tables().contains("kube-proxy"));
    assert!(lab.node.ok(&["iptables-save", "-t", "nat"]).contains(":KUBE-SERVICES"));
    lab.wait_traffic(WEB, false, &["b1", "b2"], CHANGE_WAIT);
    let log = daemon.stop();
    assert!(log.contains("removed what the node's earlier nftables mode left"), "{log}");

    lab.config("nftables", "30s");
    let daemon = lab.start_synced();
    lab.wait_gone("iptables mode's chains removed after the first sync", |lab| lab.iptables_rules().contains("KUBE-"));
    lab.wait_traffic(WEB, false, &["b1", "b2"], CHANGE_WAIT);
    lab.wait_traffic(WEB, true, &["b1", "b2"], CHANGE_WAIT);
    let log = daemon.stop();
    assert!(log.contains("removing what the node's earlier proxy mode left"), "{log}");
}

/// A switch between iptables and nftables mode, both ways and with each
/// nftables ruleset (upstream's, then maps), on a
/// dual-stack node, as a DaemonSet rollout after a ConfigMap change does
/// (the daemon stopped, started again in the other mode): a client holding
/// an established TCP flow and a UDP flow through each family's ClusterIP,
/// and opening new TCP and UDP connections to each every 10 ms throughout,
/// sees no failure. The new mode's first sync comes before the old mode's
/// state goes, and the log says the switch's steps.
#[test]
fn switching_between_iptables_and_nftables_mode_drops_no_connection() {
    const ADDRS: [&str; 2] = ["10.96.0.40:80", "[fd00:96::40]:80"];
    let mut lab = Lab::new("zd", &["b1", "b2"]);
    lab.put("node", &node_manifest(true));
    lab.put("web", &daemon::dual_stack_service_manifest("web", &["10.96.0.40", "fd00:96::40"], 30040, &["b1", "b2"]));
    lab.config("iptables", "30s");
    let daemon = lab.start_synced();
    for to in ADDRS {
        lab.wait_traffic(to, false, &["b1", "b2"], CHANGE_WAIT);
        lab.wait_traffic(to, true, &["b1", "b2"], CHANGE_WAIT);
    }
    let mut flows: Vec<(Conn, std::net::UdpSocket)> = ADDRS
        .iter()
        .map(|to| {
            let tcp = lab.client.run(|| Conn::open(addr(to), DROP_WAIT)).expect("an established TCP flow");
            let udp = lab.client.run(|| {
                let s = std::net::UdpSocket::bind(if addr(to).is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }).unwrap();
                s.connect(addr(to)).unwrap();
                s.set_read_timeout(Some(DROP_WAIT)).unwrap();
                s
            });
            (tcp, udp)
        })
        .collect();
    let mut first = Vec::new();
    for (tcp, udp) in &mut flows {
        first.push((tcp.exchange().expect("tcp"), lab::udp_exchange(udp).expect("udp")));
    }
    let probes: Vec<Probes> = ADDRS.iter().map(|to| Probes::start(&lab.client, to, DROP_WAIT)).collect();
    let mut logs = vec![daemon.stop()];

    let (to_iptables, to_nftables) = ("nftables mode's tables", "iptables mode's chains");
    for (mode, ruleset, gone) in [
        ("nftables", NftRuleset::Upstream, to_nftables),
        ("iptables", NftRuleset::Upstream, to_iptables),
        ("nftables", NftRuleset::Maps, to_nftables),
        ("iptables", NftRuleset::Maps, to_iptables),
    ] {
        lab.ruleset = ruleset;
        lab.config(mode, "30s");
        let daemon = lab.start_synced();
        lab.wait_gone(gone, |lab| match mode {
            "nftables" => lab.iptables_rules().contains("KUBE-"),
            _ => lab.tables().contains("kube-proxy"),
        });
        for ((tcp, udp), (t, u)) in flows.iter_mut().zip(&first) {
            assert_eq!(tcp.exchange().as_ref(), Ok(t), "the TCP flow after the switch to {mode} mode ({ruleset})");
            assert_eq!(
                lab::udp_exchange(udp).as_ref(),
                Ok(u),
                "the UDP flow after the switch to {mode} mode ({ruleset})"
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        logs.push(daemon.stop());
    }
    for (to, probes) in ADDRS.iter().zip(probes) {
        let probes = probes.stop();
        let failed: Vec<&Probe> = probes.iter().filter(|(_, tcp, udp)| tcp.is_err() || udp.is_err()).collect();
        assert!(failed.is_empty(), "{to}: {} of {} probes failed: {failed:?}", failed.len(), probes.len());
        assert!(probes.len() > 50, "{to}: {} probes", probes.len());
    }
    let (chains, table) =
        ("then: remove iptables mode's iptables jumps and chains", "then: delete nftables mode's kube-proxy table");
    for (log, step) in logs[1..].iter().zip([chains, table, chains, table]) {
        assert!(log.contains("first: ") && log.contains(step), "{step}: {log}");
    }
}

/// Dual-stack: one proxier per family, each its own table (`ip kube-proxy`,
/// `ip6 kube-proxy`); a dual-stack Service answers on both ClusterIPs and
/// both node IPs' NodePorts, and per-family metrics count each family's syncs.
/// The families are probed through nf_tables, not iptables: the daemon runs
/// with no iptables tool on its PATH.
fn a_dual_stack_service_answers_on_both_families(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("ds", &["b1", "b2"], ruleset);
    lab.without_tools();
    lab.put("node", &node_manifest(true));
    lab.put("web", &daemon::dual_stack_service_manifest("web", &["10.96.0.40", "fd00:96::40"], 30040, &["b1", "b2"]));
    let daemon = lab.start_synced();
    let both = ["b1", "b2"];
    for to in ["10.96.0.40:80", "[fd00:96::40]:80", "192.168.50.1:30040", "[fd00:50::1]:30040"] {
        lab.wait_traffic(to, false, &both, CHANGE_WAIT);
        lab.wait_traffic(to, true, &both, CHANGE_WAIT);
    }
    let v6 = lab.table("ip6").expect("the ip6 kube-proxy table");
    assert!(v6.contains("fd00:96::40 . tcp . 80") && !v6.contains("10.96.0.40"), "{v6}");
    let v4 = lab.table("ip").expect("the ip kube-proxy table");
    assert!(v4.contains("10.96.0.40 . tcp . 80") && !v4.contains("fd00:"), "{v4}");
    for fam in ["IPv4", "IPv6"] {
        let n = lab.family_metric("kubeproxy_sync_proxy_rules_duration_seconds_count", fam);
        assert!(n.is_some_and(|n| n >= 1.0), "{fam}: {n:?}");
    }
    let log = daemon.stop();
    assert!(log.contains("kube-proxy running in dual-stack mode"), "{log}");
}

/// The table deleted behind the daemon's back (`nft delete table`): the
/// next partial sync's transaction is refused (its chains have no table),
/// counted in `..._nftables_sync_failures_total`, and the retry a second
/// later is a full sync that lists the (missing) table and writes it whole.
/// (In a quiet cluster the syncPeriod's drift check notices: see
/// `the_sync_period_repairs_a_deleted_table_and_ignores_other_tables`.)
fn a_failed_transaction_makes_the_next_sync_full_and_repairs_the_table(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("fail", &["b1", "b2"], ruleset);
    lab.put("web", &web(&["b1"]));
    let mut daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let last = lab.syncs().expect("syncs")[0].generation;
    lab.node.ok(&["nft", "delete", "table", "ip", "kube-proxy"]);
    lab.put("web", &web(&["b1", "b2"]));
    let (failed, repaired) = wait_for("a failed sync, then a full one", CHANGE_WAIT, || {
        daemon.assert_running();
        let syncs = lab.syncs()?;
        let mut new: Vec<&SyncRec> = syncs.iter().filter(|s| s.generation > last).collect();
        new.sort_by_key(|s| s.generation);
        match new.as_slice() {
            [first, second, ..] => Ok(((*first).clone(), (*second).clone())),
            _ => Err(format!("{syncs:?}")),
        }
    });
    assert!(!failed.full && failed.failed == 1, "the partial sync over no table fails: {failed:?}");
    assert!(repaired.full && repaired.failed == 0, "then a full one: {repaired:?}");
    lab.wait_traffic(WEB, false, &["b1", "b2"], CHANGE_WAIT);
    let n = lab.family_metric("kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "IPv4");
    assert_eq!(n, Some(1.0));
    let log = daemon.stop();
    assert!(log.contains("nftables sync failed: the next sync is a full one"), "{log}");
}

/// 1,000 Services (≈ 14,000 ops in the first sync: its new chains in
/// transactions of at most 8,192 ops, then the rest in one, MBs in one
/// datagram, more than a socket's default 208 KiB send buffer, which made
/// the kernel refuse it with EMSGSIZE before the codec sized the buffer to
/// the batch) are written by one full sync, and each answers.
#[test]
fn a_thousand_services_are_written_by_one_full_sync() {
    let mut lab = Lab::new("big", &["b1", "b2"]);
    let mut items = Vec::new();
    for i in 0..1000 {
        let ip = format!("10.96.{}.{}", 100 + i / 250, i % 250 + 1);
        let m = daemon::dual_stack_service_manifest(
            &format!("s{i}"),
            &[&ip],
            0,
            if i % 2 == 0 { &["b1"] } else { &["b2"] },
        );
        items.extend(m["items"].as_array().unwrap().iter().cloned().map(|mut item| {
            if item["kind"] == "Service" {
                item["spec"]["type"] = json!("ClusterIP");
                for p in item["spec"]["ports"].as_array_mut().unwrap() {
                    p.as_object_mut().unwrap().remove("nodePort");
                }
            }
            item
        }));
    }
    lab.put("many", &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}));
    let mut d = lab.start();
    let first = lab.wait_sync(&mut d, 0, Duration::from_secs(60));
    // Its ops: the nftables ones (≈ 14,100) and one conntrack reconcile.
    assert!(first.full && first.ops > 14_000, "{first:?}");
    for (to, want) in [("10.96.100.1:80", "b1"), ("10.96.103.250:80", "b2")] {
        lab.wait_traffic(to, false, &[want], CHANGE_WAIT);
        lab.wait_traffic(to, true, &[want], CHANGE_WAIT);
    }
    d.stop();
}

/// Issues 29 and 33: nftables mode's first sync builds each of its staged
/// transactions (the declaring ones bounded too) as it sends it and
/// encodes it straight into its datagram, so its peak RSS is the planned
/// ruleset and one bounded transaction, not every op of the sync at once.
/// 3,000 Services × 10 endpoints (upstream's ruleset, manifest files of 500
/// objects), this debug binary: VmHWM about 100 MB; the code before the
/// bounded declarations and the direct encoding: 136 MB. The bound sits
/// between, with room for a loaded machine.
#[test]
fn a_first_sync_of_three_thousand_services_holds_one_transaction_at_a_time() {
    use kube_proxy_rs::bench::daemon_run::{write_manifests, Layout};
    use kube_proxy_rs::bench::gen::{Cluster, ClusterSpec};
    let spec = ClusterSpec { services: 3000, endpoints_per_service: 10, nodes: 100, seed: 1 };
    let events = Cluster::new(spec).expect("cluster").initial_events();
    let mut lab = Lab::new("mem", &[]);
    write_manifests(&lab.manifests(), &events, Layout::Lists).expect("manifests");
    let mut d = lab.start();
    let first = lab.wait_sync(&mut d, 0, Duration::from_secs(300));
    assert!(first.full && first.failed == 0 && first.ops > 100_000, "{first:?}");
    let pid = d.child.as_ref().expect("running").id();
    let (hwm, rss) = (daemon::status_kb(pid, "VmHWM"), daemon::status_kb(pid, "VmRSS"));
    eprintln!("VmHWM {hwm} kB, VmRSS after the first sync {rss} kB");
    assert!(hwm < 120 * 1024, "VmHWM {hwm} kB");
    d.stop();
}

/// A lab with a 2 s syncPeriod and `web` on b1, its daemon started and
/// past the sync after the first (the start's stale chains, none here, and
/// the first syncs settled): the lab, the daemon, that sync's generation.
fn settled(tag: &str, ruleset: NftRuleset) -> (Lab, Daemon, u64) {
    let mut lab = Lab::in_ruleset(tag, &["b1"], ruleset);
    lab.config("nftables", "2s");
    lab.put("web", &web(&["b1"]));
    let mut daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let settled = lab.wait_sync(&mut daemon, lab.syncs().expect("syncs")[0].generation, CHANGE_WAIT).generation;
    (lab, daemon, settled)
}

/// A quiet cluster: each syncPeriod (2 s here) brings a periodic partial
/// sync that sends nothing: the namespace's nf_tables generation (which
/// every transaction increments) stays as it was.
fn the_sync_period_writes_nothing_while_the_cluster_is_quiet(ruleset: NftRuleset) {
    let (lab, mut daemon, first) = settled("qui", ruleset);
    // The namespace's nf_tables generation: every transaction increments it.
    let generation = |lab: &Lab| {
        lab.node.block_on(|| async {
            let nft = kube_proxy_rs::kernel::nftables::NetlinkNftables::new().expect("an nf_tables socket");
            nft.generation().await.expect("genid")
        })
    };
    let (before, listed) = (generation(&lab), lab.table("ip"));
    let mut seen: Vec<SyncRec> = Vec::new();
    while seen.len() < 2 {
        let after = seen.last().map_or(first, |s| s.generation);
        seen.push(lab.wait_sync(&mut daemon, after, CHANGE_WAIT));
    }
    assert!(seen.iter().all(|s| s.periodic && !s.full && s.ops == 0), "{seen:?}");
    assert_eq!(generation(&lab), before, "no transaction over two syncPeriods");
    assert_eq!(lab.table("ip"), listed);
    daemon.stop();
}

/// The syncPeriod's cheap drift check (the ruleset's generation, then our
/// table's handle and use count): somebody else's commit (another table)
/// costs two gets and changes nothing; our table deleted is written again
/// by the next periodic sync, a full one, not an hour later.
fn the_sync_period_repairs_a_deleted_table_and_ignores_other_tables(ruleset: NftRuleset) {
    let (lab, mut daemon, mut last) = settled("dri", ruleset);
    let mut next = |lab: &Lab, daemon: &mut Daemon| {
        let s = lab.wait_sync(daemon, last, CHANGE_WAIT);
        last = s.generation;
        s
    };
    lab.node.ok(&["nft", "add", "table", "ip", "somebody-else"]);
    // The sync in flight may have started before that commit: two more.
    let quiet = [next(&lab, &mut daemon), next(&lab, &mut daemon)];
    assert!(quiet.iter().all(|s| s.periodic && !s.full && s.ops == 0), "{quiet:?}");
    lab.node.ok(&["nft", "delete", "table", "ip", "kube-proxy"]);
    let repaired = wait_for("a periodic full sync", CHANGE_WAIT, || {
        let s = next(&lab, &mut daemon);
        if s.full {
            Ok(s)
        } else {
            Err(format!("{s:?}"))
        }
    });
    assert!(repaired.periodic && repaired.ops > 0, "{repaired:?}");
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let log = daemon.stop();
    assert!(log.contains("the nftables table drifted: full resync"), "{log}");
    assert!(log.contains("the table was deleted"), "{log}");
}

/// ServiceCIDRs (`networking.k8s.io/v1`, upstream since 1.33): with one of
/// 10.96.0.0/16 in the manifests, a connection to an unallocated ClusterIP
/// of it is dropped (times out: no RST, no ICMP), while an allocated
/// ClusterIP on a port it does not serve is rejected at once (the reject
/// rule comes first). The ServiceCIDR's manifest deleted: a partial sync
/// writes `cluster-ips-check` without the drop rule. So that the drop can
/// be told from a packet lost on the way, the node routes 10.96.0.0/16 to
/// b1, which answers every address of it itself (RST: refused) once
/// nothing drops them.
fn service_cidrs_drop_unallocated_cluster_ips_until_deleted(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("scidr", &["b1"], ruleset);
    lab.node.ok(&["ip", "route", "add", "10.96.0.0/16", "via", "10.244.1.2"]);
    lab._backends[0].1.ok(&["ip", "route", "add", "local", "10.96.0.0/16", "dev", "lo"]);
    lab.put("web", &web(&["b1"]));
    let cidr = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": "kubernetes"},
        "spec": {"cidrs": ["10.96.0.0/16", "fd00:96::/112"]},
    });
    lab.put("cidr", &cidr);
    let daemon = lab.start_synced();
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    let table = lab.table("ip").expect("the ip kube-proxy table");
    // Listed as `nft` lists its own `ip daddr { 10.96.0.0/16 } drop`: a
    // one-element set is written as a plain match.
    let drop = "ip daddr 10.96.0.0/16 drop comment \"Drop traffic to unallocated ClusterIPs\"";
    assert!(table.contains(drop), "{table}");
    assert!(!table.contains("fd00:96::"), "the IPv4 table holds the IPv4 range only: {table}");
    let v6 = lab.table("ip6").expect("the ip6 kube-proxy table (the node runs both families)");
    assert!(v6.contains("ip6 daddr fd00:96::/112 drop") && !v6.contains("10.96.0.0"), "{v6}");
    let dropped = lab.ask("10.96.0.99:80", 2, false);
    assert!(dropped.iter().all(|a| *a == Err(ErrorKind::TimedOut)), "unallocated: dropped: {dropped:?}");
    let started = Instant::now();
    let rejected = lab.ask("10.96.0.10:81", 2, false);
    assert!(rejected.iter().all(|a| *a == Err(ErrorKind::ConnectionRefused)), "allocated: rejected: {rejected:?}");
    assert!(started.elapsed() < DROP_WAIT, "refused at once: {:?}", started.elapsed());

    let last = lab.syncs().expect("syncs")[0].generation;
    lab.remove("cidr");
    let table = lab.wait_table("the drop rule gone", |t| !t.contains("unallocated"));
    assert!(table.contains("Reject traffic to invalid ports of ClusterIPs"), "{table}");
    let syncs = lab.syncs().expect("syncs");
    let new: Vec<&SyncRec> = syncs.iter().filter(|s| s.generation > last).collect();
    assert!(!new.is_empty() && new.iter().all(|s| !s.full), "a partial sync rewrote the chain: {syncs:?}");
    // Nothing drops them now: b1 answers them itself.
    assert_eq!(lab.ask("10.96.0.99:80", 1, false), [Err(ErrorKind::ConnectionRefused)], "no longer dropped");
    lab.wait_traffic(WEB, false, &["b1"], CHANGE_WAIT);
    daemon.stop();
}

/// (conntrack) A deleted UDP Service's flows to its NodePort and
/// LoadBalancer IPs lose their entries; see `common::conntrack`.
fn conntrack_a_deleted_services_node_port_and_load_balancer_flows_are_cleared(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("ctdel", &["b1"], ruleset);
    conntrack::a_deleted_services_node_port_and_load_balancer_flows_are_cleared(&mut lab);
}

/// (conntrack) One of a Service's two UDP ports to one endpoint removed:
/// the other port's flows keep their entries and answers.
fn conntrack_a_flow_to_another_port_of_the_same_endpoint_survives(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("ctport", &["b1"], ruleset);
    conntrack::a_flow_to_another_port_of_the_same_endpoint_survives(&mut lab);
}

/// (conntrack) Entries made while the daemon was stopped, to an endpoint
/// removed meanwhile, go at its first sync; others stay.
fn conntrack_an_entry_created_while_the_daemon_was_stopped_is_cleared_at_its_first_sync(ruleset: NftRuleset) {
    let mut lab = Lab::in_ruleset("ctstop", &["b1", "b2"], ruleset);
    conntrack::an_entry_created_while_the_daemon_was_stopped_is_cleared_at_its_first_sync(&mut lab);
}
