//! The daemon's start and process edges, with the real binary in network
//! namespaces this test creates: `--init-only` (upstream's privileged
//! initialization, then exit 0 serving nothing), the conntrack sysctls as
//! upstream sets them, `oomScoreAdj`, the exit for a restart when the Node
//! changes what the proxy started with, and what the waits at start say.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::apiserver::Kind;
use common::daemon::{self, wait_for, Daemon};
use common::{bin, Netns};
use serde_json::{json, Value};

const NODE: &str = "node-a";
/// The first sync of a daemon in an empty namespace.
const START_WAIT: Duration = Duration::from_secs(20);
/// A daemon that must exit: the Node change seen, the batch in flight finished.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// A node namespace, the config file and a manifest directory.
struct Setup {
    ns: Netns,
    dir: tempfile::TempDir,
    started: usize,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let ns = Netns::new(&format!("st-{tag}"));
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("manifests")).unwrap();
        Setup { ns, dir, started: 0 }
    }

    fn manifests(&self) -> String {
        self.dir.path().join("manifests").display().to_string()
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    /// The config file: `mode`, this node's name, then `extra` (YAML).
    fn config(&self, mode: &str, extra: &str) {
        let text = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\n\
             hostnameOverride: {NODE}\nclusterCIDR: 10.244.0.0/16\n{extra}"
        );
        std::fs::write(self.config_path(), text).unwrap();
    }

    /// Writes manifest `<name>.json` atomically (written aside, then renamed).
    fn put(&self, name: &str, value: &Value) {
        let tmp = self.dir.path().join(format!("{name}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(value).unwrap()).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("manifests").join(format!("{name}.json"))).unwrap();
    }

    /// Starts `wrapper… kube-proxy-rs --config <config> args…` in the namespace.
    fn start_wrapped(&mut self, wrapper: &[&str], args: &[&str]) -> Daemon {
        self.started += 1;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns.name]).args(wrapper).arg(bin()).arg("--config").arg(self.config_path());
        c.args(args).env("XTABLES_LOCKFILE", self.dir.path().join("xtables.lock"));
        daemon::spawn(c, &self.ns, self.dir.path().join(format!("daemon-{}.log", self.started)))
    }

    fn start(&mut self, args: &[&str]) -> Daemon {
        self.start_wrapped(&[], args)
    }

    /// Starts the daemon on the manifests and waits for its first sync.
    fn start_synced(&mut self, args: &[&str]) -> Daemon {
        let mut d = self.start(args);
        wait_for("the first sync", START_WAIT, || {
            d.assert_running();
            daemon::syncs(&self.ns).and_then(|s| if s.is_empty() { Err("none yet".into()) } else { Ok(()) })
        });
        d
    }

    /// `/proc/sys/<path>` in the namespace.
    fn sysctl(&self, path: &str) -> String {
        self.ns.ok(&["cat", &format!("/proc/sys/{path}")]).trim().to_string()
    }
}

/// This node with `ip` as its InternalIP, in `zone`, with `pod_cidrs`.
fn node(ip: &str, zone: &str, pod_cidrs: &[&str]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, "topology.kubernetes.io/zone": zone}},
        "spec": {"podCIDRs": pod_cidrs},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    })
}

/// Waits until the running daemon's log holds every one of `texts`.
fn wait_log(d: &mut Daemon, texts: &[&str], timeout: Duration) {
    wait_for(&format!("{texts:?} in the log"), timeout, || {
        d.assert_running();
        let log = d.log();
        texts.iter().all(|t| log.contains(t)).then_some(()).ok_or(log)
    });
}

/// The log's lines containing `text`, with their timestamps.
fn lines_with(log: &str, text: &str) -> Vec<(jiff::Timestamp, String)> {
    log.lines()
        .filter(|l| l.contains(text))
        .map(|l| {
            let stamp = l.split_whitespace().next().unwrap_or_default();
            let at = stamp.parse::<jiff::Timestamp>().unwrap_or_else(|e| panic!("timestamp of {l:?}: {e}"));
            (at, l.to_string())
        })
        .collect()
}

/// At least two of `lines`, none more than ten seconds after the one before.
fn assert_said_every_ten_seconds(lines: &[(jiff::Timestamp, String)], what: &str, log: &str) {
    assert!(lines.len() >= 2, "{what}: {lines:?}\n{log}");
    for pair in lines.windows(2) {
        let gap = pair[1].0.duration_since(pair[0].0);
        assert!(gap <= jiff::SignedDuration::from_secs(10), "{what}: {gap:?} between {pair:?}");
    }
}

const CONNTRACK_KNOBS: [(&str, &str); 5] = [
    ("net/netfilter/nf_conntrack_tcp_timeout_established", "12345"),
    ("net/netfilter/nf_conntrack_tcp_timeout_close_wait", "321"),
    ("net/netfilter/nf_conntrack_tcp_be_liberal", "1"),
    ("net/netfilter/nf_conntrack_udp_timeout", "33"),
    ("net/netfilter/nf_conntrack_udp_timeout_stream", "123"),
];

/// `--init-only` does upstream's privileged initialization: the conntrack
/// settings (the namespace's own timeouts; `nf_conntrack_max`, read-only
/// in a namespace of its own and larger than asked, not lowered: no write
/// tried, or the read-only file would have failed the start) and, in
/// iptables mode with localhost NodePorts, route_localnet; then it exits 0
/// within seconds, having served nothing and written no rule, chain, table
/// or set.
#[test]
fn init_only_sets_up_the_node_and_exits_without_serving() {
    let mut s = Setup::new("init");
    let conntrack = "conntrack:\n  maxPerCore: 1000\n  min: 0\n  tcpEstablishedTimeout: 12345s\n  \
                     tcpCloseWaitTimeout: 321s\n  tcpBeLiberal: true\n  udpTimeout: 33s\n  udpStreamTimeout: 123s\n";
    s.config("iptables", conntrack);
    s.put("node", &node("192.168.50.2", "z1", &[]));
    for (path, value) in CONNTRACK_KNOBS {
        assert_ne!(s.sysctl(path), value, "{path} before");
    }
    assert_eq!(s.sysctl("net/ipv4/conf/all/route_localnet"), "0");
    let max = s.sysctl("net/netfilter/nf_conntrack_max");
    assert!(max.parse::<i64>().unwrap() > 2 * 1000 * 64, "the namespace's limit is above maxPerCore × CPUs: {max}");

    let started = Instant::now();
    let manifests = s.manifests();
    let mut d = s.start(&["--manifests", &manifests, "--init-only"]);
    let status = d.wait_exit(Duration::from_secs(20));
    let took = started.elapsed();
    let log = d.log();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {log}");
    assert!(log.contains("System initialized and --init-only specified"), "{log}");

    for (path, value) in CONNTRACK_KNOBS {
        assert_eq!(s.sysctl(path), value, "{path}: {log}");
    }
    assert_eq!(s.sysctl("net/netfilter/nf_conntrack_max"), max, "never lowered");
    assert_eq!(s.sysctl("net/ipv4/conf/all/route_localnet"), "1", "{log}");

    for never in ["serving HTTP", "kube-proxy-rs started", "sync finished", "nfacct"] {
        assert!(!log.contains(never), "{never:?} with --init-only: {log}");
    }
    for tool in ["iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft-save", "ip6tables-nft-save"] {
        let saved = s.ns.ok(&[tool]);
        assert!(!saved.contains("KUBE-"), "{tool}: {saved}");
    }
    let tables = s.ns.ok(&["nft", "list", "tables"]);
    assert!(!tables.contains("kube-proxy"), "{tables}");
    let sets = s.ns.ok(&["ipset", "list", "-n"]);
    assert!(sets.trim().is_empty(), "{sets}");
    let listening = s.ns.ok(&["ss", "-Hltn"]);
    assert!(listening.trim().is_empty(), "{listening}");
}

/// `--init-only` on a node that ran another mode removes that mode's state
/// at once, as upstream's platformCleanup (it never syncs, so there is no
/// first sync to wait for): nftables mode's tables, when starting in
/// iptables mode.
#[test]
fn init_only_removes_the_earlier_modes_state_at_once() {
    let mut s = Setup::new("initsw");
    s.config("iptables", "");
    s.put("node", &node("192.168.50.2", "z1", &[]));
    for family in ["ip", "ip6"] {
        s.ns.ok(&["nft", "add", "table", family, "kube-proxy"]);
        s.ns.ok(&["nft", "add", "table", family, "other"]);
    }
    let manifests = s.manifests();
    let mut d = s.start(&["--manifests", &manifests, "--init-only"]);
    let status = d.wait_exit(Duration::from_secs(20));
    let log = d.log();
    assert_eq!(status.code(), Some(0), "{log}");
    let tables = s.ns.ok(&["nft", "list", "tables"]);
    assert!(!tables.contains("kube-proxy"), "nftables mode's tables left: {tables}\n{log}");
    assert_eq!(tables.matches(" other").count(), 2, "other tables stay: {tables}");
}

/// `nf_conntrack_max` is maxPerCore × CPUs capped at 1,048,576 (upstream
/// 1.36); when that is above the namespace's read-only limit, the write
/// fails and so does the start, with upstream's message naming the capped
/// value. (A host whose limit is at the cap already is left alone.)
#[test]
fn a_conntrack_max_it_cannot_raise_stops_the_start_naming_the_capped_value() {
    let mut s = Setup::new("ctmax");
    s.config("iptables", "conntrack:\n  maxPerCore: 2000000\n  min: 0\n");
    s.put("node", &node("192.168.50.2", "z1", &[]));
    let before: i64 = s.sysctl("net/netfilter/nf_conntrack_max").parse().unwrap();
    let manifests = s.manifests();
    let mut d = s.start(&["--manifests", &manifests, "--init-only"]);
    let status = d.wait_exit(Duration::from_secs(20));
    let log = d.log();
    if before < 1_048_576 {
        assert_eq!(status.code(), Some(1), "{log}");
        assert!(log.contains("could not set conntrack parameters from kube-proxy configuration"), "{log}");
        assert!(log.contains("net/netfilter/nf_conntrack_max=1048576"), "capped: {log}");
        assert!(!log.contains("System initialized"), "{log}");
    } else {
        assert_eq!(status.code(), Some(0), "{log}");
    }
    assert_eq!(s.sysctl("net/netfilter/nf_conntrack_max").parse::<i64>().unwrap(), before);
}

/// `oomScoreAdj` from the config file, and `--oom-score-adj` without one,
/// is the process's once it runs (raised here: lowering it needs
/// CAP_SYS_RESOURCE). Without that capability the default (-999) is
/// refused: a warning names the value, and the daemon runs on.
#[test]
fn oom_score_adj_is_written_at_start() {
    let mut s = Setup::new("oom");
    s.put("node", &node("192.168.50.2", "z1", &[]));
    let manifests = s.manifests();
    let score = |d: &Daemon| {
        let pid = d.child.as_ref().expect("running").id();
        std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap_or_default().trim().to_string()
    };
    let started = |d: &mut Daemon| wait_log(d, &["kube-proxy-rs started"], START_WAIT);

    s.config(
        "nftables",
        "oomScoreAdj: 500
",
    );
    let mut d = s.start(&["--manifests", &manifests]);
    started(&mut d);
    assert_eq!(score(&d), "500", "{}", d.log());
    d.stop();

    s.started += 1;
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &s.ns.name, &bin(), "--manifests", &manifests, "--proxy-mode", "nftables"]);
    c.args(["--hostname-override", NODE, "--oom-score-adj", "600"]);
    let mut d = daemon::spawn(c, &s.ns, s.dir.path().join(format!("daemon-{}.log", s.started)));
    started(&mut d);
    assert_eq!(score(&d), "600", "{}", d.log());
    d.stop();

    s.config("nftables", "");
    let ours = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap().trim().to_string();
    let mut d = s.start_wrapped(&["setpriv", "--bounding-set=-sys_resource"], &["--manifests", &manifests]);
    started(&mut d);
    let log = d.log();
    let warned = lines_with(&log, "could not set oom_score_adj to -999");
    assert!(warned.len() == 1 && warned[0].1.contains("WARN"), "{log}");
    assert_eq!(score(&d), ours, "unchanged");
    d.stop();
}

/// Upstream 1.37's NodeManager: a change of the Node's IPs (not of its
/// labels) makes the daemon log old and new and exit 1 for the DaemonSet
/// to restart it.
#[test]
fn a_node_ip_change_exits_for_a_restart() {
    let mut s = Setup::new("nodeip");
    s.config("nftables", "");
    s.put("node", &node("192.168.50.2", "z1", &[]));
    let manifests = s.manifests();
    let mut d = s.start_synced(&["--manifests", &manifests]);
    let first = daemon::syncs(&s.ns).unwrap().iter().map(|r| r.generation).max().unwrap();
    s.put("node", &node("192.168.50.2", "z2", &[]));
    wait_for("the sync of the zone change", START_WAIT, || {
        d.assert_running();
        let syncs = daemon::syncs(&s.ns)?;
        syncs.iter().any(|r| r.generation > first).then_some(()).ok_or_else(|| format!("{syncs:?}"))
    });
    d.assert_running();

    s.put("node", &node("192.168.50.3", "z2", &[]));
    let status = d.wait_exit(EXIT_WAIT);
    let log = d.log();
    assert_eq!(status.code(), Some(1), "{log}");
    let said = lines_with(&log, "NodeIPs changed for the node");
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].1.contains("old_node_ips=192.168.50.2") && said[0].1.contains("new_node_ips=192.168.50.3"),
        "{log}"
    );
    assert!(log.contains("kernel state left in place"), "{log}");
}

/// In NodeCIDR detect-local mode a change of the Node's podCIDRs, through
/// the API server, also exits 1 for a restart.
#[test]
fn a_pod_cidr_change_in_node_cidr_mode_exits_for_a_restart() {
    let mut s = Setup::new("podcidr");
    let (api, _serving) = s.ns.api_server();
    s.config("nftables", "detectLocalMode: NodeCIDR\n");
    api.create(&node("192.168.50.2", "z1", &["10.244.1.0/24"])).unwrap();
    let mut d = s.start_synced(&["--master", &api.url()]);
    api.update(&node("192.168.50.2", "z1", &["10.244.2.0/24"])).unwrap();
    let status = d.wait_exit(EXIT_WAIT);
    let log = d.log();
    assert_eq!(status.code(), Some(1), "{log}");
    let said = lines_with(&log, "PodCIDRs changed for the node");
    assert_eq!(said.len(), 1, "{log}");
    assert!(said[0].1.contains("old_pod_cidrs=10.244.1.0/24") && said[0].1.contains("new_pod_cidrs=10.244.2.0/24"));
}

/// Without its Node the daemon says, at the default verbosity and at most
/// ten seconds apart, that it waits for it; after 30 s it says it falls
/// back to IPv4, and starts.
#[test]
fn the_node_wait_says_what_it_waits_for_and_that_it_falls_back_to_ipv4() {
    let mut s = Setup::new("nowait");
    let (api, _serving) = s.ns.api_server();
    s.config("nftables", "");
    let mut d = s.start(&["--master", &api.url()]);
    wait_log(&mut d, &["falling back to IPv4"], Duration::from_secs(45));
    let log = d.log();
    let waiting = lines_with(&log, "waiting for the Node to exist");
    assert_said_every_ten_seconds(&waiting, "the Node wait", &log);
    let timed_out = lines_with(&log, "Timed out waiting for node to exist");
    assert_eq!(timed_out.len(), 1, "{log}");
    let fallback = lines_with(&log, "falling back to IPv4");
    assert!(fallback[0].1.contains("WARN"), "{log}");
    let last = waiting.last().unwrap().0;
    assert!(fallback[0].0.duration_since(last) <= jiff::SignedDuration::from_secs(10), "{log}");
    wait_log(&mut d, &["kube-proxy-rs started", "initial lists of Services, EndpointSlices"], START_WAIT);
    d.stop();
}

/// While the API server does not answer the EndpointSlice list, the daemon
/// says, at most ten seconds apart, which initial lists it waits for
/// before its first sync; once they come, it says so and syncs.
#[test]
fn the_wait_for_the_initial_lists_says_what_it_waits_for() {
    let mut s = Setup::new("lists");
    let (api, _serving) = s.ns.api_server();
    s.config("nftables", "");
    api.create(&node("192.168.50.2", "z1", &[])).unwrap();
    api.fail_kind(Kind::EndpointSlice, true);
    let mut d = s.start(&["--master", &api.url()]);
    let note = "waiting for the API server's initial lists before the first sync";
    wait_for("two notes of the wait", Duration::from_secs(30), || {
        d.assert_running();
        let n = lines_with(&d.log(), note).len();
        if n >= 2 {
            Ok(())
        } else {
            Err(format!("{n} notes"))
        }
    });
    assert!(daemon::syncs(&s.ns).unwrap().is_empty(), "no sync before the lists");
    api.fail_kind(Kind::EndpointSlice, false);
    wait_for("the first sync", Duration::from_secs(60), || {
        d.assert_running();
        daemon::syncs(&s.ns).and_then(|s| if s.is_empty() { Err("none yet".into()) } else { Ok(()) })
    });
    let log = d.log();
    let notes = lines_with(&log, note);
    assert_said_every_ten_seconds(&notes, "the lists wait", &log);
    assert!(notes.iter().all(|(_, l)| l.contains("EndpointSlice")), "{notes:?}");
    assert!(notes.last().unwrap().1.contains("waiting_for=EndpointSlice waited_secs="), "{notes:?}");
    let done = lines_with(&log, "initial lists of Services, EndpointSlices and the Node complete");
    assert_eq!(done.len(), 1, "{log}");
    let last = notes.last().unwrap().0;
    assert!(done[0].0.duration_since(last) <= jiff::SignedDuration::from_secs(10), "said until the end: {log}");
    d.stop();
}
