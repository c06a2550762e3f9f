//! The soak harness (convergence under churn and faults), for the
//! per-mode soak tests on the host (`soak_iptables`, `soak_nftables`).
//!
//! A [`SoakLab`] is the packet lab ([`super::lab::topology`]: node, client,
//! backends b1..b3) with the test API server inside the node namespace and
//! the daemon binary run against it (`clientConnection.kubeconfig`). The
//! cluster is [`SoakCluster`]'s (≥ 300 Services of every kind, probe
//! Services whose endpoints are the lab's backends). [`SoakLab::run`]
//! applies the seeded change stream at a rate for a total time, split into
//! segments; after each segment it injects that segment's [`Fault`], lets
//! the churn go on, then stops the churn and runs the convergence check
//! ([`SoakLab::converge`]):
//!
//! - `kube-proxy-rs --dry-run --diff` in the node (the same config, the
//!   same API server, a fresh process: a fresh full plan compared with the
//!   live kernel) says nothing to add or remove, within [`CONVERGE_WAIT`]
//!   (in IPVS mode, besides real servers of weight 0 that graceful
//!   termination drains while the kernel shows them connections:
//!   [`draining_real_servers`]; there the check first waits
//!   for the daemon to settle, [`SoakLab::settle`]);
//! - every probe Service answers (TCP, each of its addresses) from exactly
//!   the backends its final EndpointSlices make ready.
//!
//! Over the whole run the daemon's RSS is sampled each second
//! (`/proc/PID/status`); at the end its longest-lived instance's last
//! quarter median must be within a small margin of its first quarter's
//! after the warm-up, and every WARN or ERROR line of every instance's log
//! must be explained by a fault that was injected ([`Fault::explains`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_proxy_rs::bench::soak::check::{
    diff_leftovers, draining_real_servers, dry_run_phases, finished_syncs, periodic_sync_ran, real_server_connections,
    sync_in_progress, syncs_in_progress, unexplained_log_lines, DrainingDest, Explained, RssTrend,
};
use kube_proxy_rs::bench::soak::cluster::{SoakCluster, SoakSpec, Write, NODE};
use kube_proxy_rs::kernel::ipvs::graceful::CHECK_INTERVAL;
use serde_json::Value;

use super::apiserver::{ApiServer, Kind};
use super::daemon::{self, wait_for, Daemon};
use super::lab::{self, names, Backend, Conn, NODE_IP, NODE_IP6};
use super::{bin, Netns};

/// How long the kernel may take to equal a fresh plan once the churn
/// stops (times [`slowdown`]).
const CONVERGE_WAIT: Duration = Duration::from_secs(30);
/// How long the daemon may take to start and finish its first sync (times
/// [`slowdown`]: in the VM two labs' first lists from their test API
/// servers took 91-112 s at host load 20-30).
const START_WAIT: Duration = Duration::from_secs(60);
/// How long the daemon must have finished no sync before the convergence
/// check reads the kernel.
const QUIET: Duration = Duration::from_secs(2);
/// How long a probe waits before calling an exchange dropped.
const DROP_WAIT: Duration = Duration::from_millis(700);
/// RSS: seconds of warm-up left out, and the allowed growth.
const RSS_WARMUP: f64 = 20.0;
const RSS_MARGIN: f64 = 0.15;
const RSS_SLACK_KIB: u64 = 4 * 1024;
/// Warnings the test environment causes: the container does not let
/// root lower its OOM score.
const ENVIRONMENT_WARNINGS: [Explained; 1] = [&["kube_proxy_rs::startup::oom: could not set oom_score_adj"]];
/// Upstream's warning at every start in IPVS mode.
const IPVS_DEPRECATED: Explained = &["kube_proxy_rs::proxier::ipvs: The ipvs proxier is now deprecated"];
/// How many rounds of exchanges a probe address gets to reach each of its
/// ready backends (each round three exchanges per backend).
const PROBE_ROUNDS: usize = 8;
/// How many times kill -9 is tried before one lands inside a sync.
const KILL_TRIES: usize = 3;
/// The lab's backends.
const BACKENDS: [&str; 3] = ["b1", "b2", "b3"];

/// How much slower than the host the soak runs: 6 in the VM (TCG: a
/// restarted debug daemon's first sync of the soak cluster takes 80-115 s
/// there, most of it reading the IPVS table back), else 1.
fn slowdown() -> u32 {
    if std::env::var_os("VMTEST").is_some() {
        6
    } else {
        1
    }
}

/// The proxy mode under soak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// iptables mode with iptables-legacy (so the xtables lock applies).
    Iptables,
    Nftables,
    /// IPVS mode (needs a kernel with IPVS: the qemu VM).
    Ipvs,
}

/// A fault injected during the churn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL while a sync is under way (its `sync started` line logged,
    /// its `sync finished` not), then a new daemon.
    Kill9,
    /// The xtables lock (the lab's `XTABLES_LOCKFILE`) held for 10 s.
    XtablesLock,
    /// Another writer flushes one of our chains: iptables `KUBE-SERVICES`
    /// in nat, nftables the `services` chain.
    FlushChain,
    /// Another writer deletes one element of ours: nftables a
    /// `service-ips` map element (a Service's cluster IP); iptables a
    /// rule in a Service's `KUBE-SVC-` chain; IPVS a `KUBE-CLUSTER-IP`
    /// ipset member.
    DeleteElement,
    /// IPVS: another writer removes a real server (`ipvsadm -d`).
    RemoveRealServer,
    /// IPVS: another writer deletes a Service address from kube-ipvs0.
    DeleteServiceAddress,
    /// Kernel ops refused for a while: nftables our table deleted (every
    /// transaction that touches it is refused until a full sync writes
    /// it again); iptables the xtables lock (restores time out).
    RefuseOps,
    /// The API server unreachable for 5 s, its watch history gone after
    /// (as a restarted watch cache: resumed watches get 410).
    ApiRestart,
    /// Lists and watches of every kind answer 500 for 10 s, open watches cut.
    Api500,
    /// Every open watch closed mid-stream.
    CloseWatches,
    /// History compacted and watches cut: resuming gets 410 Gone.
    Gone410,
    /// 1,000 changes within one second.
    Burst,
}

impl Fault {
    /// Drift the daemon's checks leave to the hourly full resync (the
    /// drift table of docs/operations.md): a rule inside one of our
    /// iptables chains, and in nftables mode a flushed chain or a deleted
    /// element (the table's generation moves, its handle, flags and use
    /// count do not), and in IPVS mode a removed real server (the
    /// syncPeriod's check reads the virtual servers, not their real
    /// servers). The soak cannot wait an hour: after such a fault it
    /// restarts the daemon (its first sync is full) before the
    /// convergence check.
    fn waits_for_full_resync(self, mode: Mode) -> bool {
        matches!(
            (self, mode),
            (Fault::DeleteElement, Mode::Iptables | Mode::Nftables)
                | (Fault::FlushChain, Mode::Nftables)
                | (Fault::RemoveRealServer, _)
        )
    }

    /// Drift the syncPeriod's checks repair in IPVS mode (an ipset's
    /// member count, kube-ipvs0's addresses): the convergence check waits
    /// for such a sync first.
    fn repaired_by_periodic_check(self, mode: Mode) -> bool {
        matches!((self, mode), (Fault::DeleteElement | Fault::DeleteServiceAddress, Mode::Ipvs))
    }

    /// The WARN/ERROR lines this fault causes, each as the tracing target
    /// and message, and the cause's own words where a message has others.
    fn explains(self, mode: Mode) -> &'static [Explained<'static>] {
        match (self, mode) {
            (Fault::Kill9 | Fault::Burst, _) => &[],
            (Fault::XtablesLock | Fault::RefuseOps, Mode::Iptables | Mode::Ipvs) => &[
                &[KERNEL_OP_FAILED, "Another app is currently holding the xtables lock"],
                &["kube_proxy_rs::actors::coordinator::iptables: partial iptables restore failed: the next sync is a full one"],
            ],
            // Our table gone: every transaction naming it is refused (ENOENT),
            // or the syncPeriod's check sees it first (it runs under churn too).
            (Fault::RefuseOps, Mode::Nftables) => &[
                &[DRIFT_IN_SYNC, "actor=\"nftables\""],
                &[KERNEL_OP_FAILED, NFT_ENOENT],
                &[NFT_SYNC_FAILED, NFT_ENOENT],
                &["kube_proxy_rs::actors::coordinator::nftables: deleting stale chains failed", NFT_ENOENT],
            ],
            // A partial sync deleting the element another writer deleted.
            (Fault::DeleteElement, Mode::Nftables) => &[
                &[KERNEL_OP_FAILED, "(delete element ", NFT_ENOENT],
                &[NFT_SYNC_FAILED, "(delete element ", NFT_ENOENT],
            ],
            // The 10 s check running between the flush and the next restore.
            (Fault::FlushChain, Mode::Iptables) => &[&[DRIFT_FOUND]],
            (Fault::XtablesLock, Mode::Nftables) | (Fault::FlushChain, Mode::Nftables) => &[],
            (Fault::DeleteElement, Mode::Iptables) | (Fault::RemoveRealServer, _) => &[],
            // The syncPeriod's checks: an ipset's member count, kube-ipvs0's addresses.
            (Fault::DeleteElement | Fault::DeleteServiceAddress, Mode::Ipvs) => &[&[DRIFT_FOUND]],
            (Fault::DeleteServiceAddress, _) | (Fault::FlushChain, Mode::Ipvs) => &[],
            // A 410 relists at INFO; the cut itself is the only warning.
            (Fault::CloseWatches | Fault::Gone410, _) => &[WATCH_CUT],
            (Fault::ApiRestart, _) => &[
                WATCH_CUT,
                &["kube_client::client::builder: failed with error client error (SendRequest)"],
                &[WATCH_FAILED, "ServiceError: client error (SendRequest)"],
                // A request on a connection the unreachable server dropped.
                &["kube_client::client::builder: failed with error client error (Canceled)"],
                &[WATCH_FAILED, "ServiceError: client error (Canceled)"],
            ],
            (Fault::Api500, _) => &[
                WATCH_CUT,
                &["kube_client::client::builder: failed with status 500 Internal Server Error"],
                &[WATCH_FAILED, "ApiError: Internal error occurred: the test API server fails "],
            ],
        }
    }
}

/// kube-rs's line when the API server cuts a watch's stream.
const WATCH_CUT: Explained = &["kube_client::client: eof in poll", "unexpected EOF during chunk size line"];
/// The API source's line when a list or watch fails (the error says why).
const WATCH_FAILED: &str = "kube_proxy_rs::actors::source::kube: watching the API server failed; retrying with backoff";
/// The kernel actors' line for a failed op (the error says why).
const KERNEL_OP_FAILED: &str = "kube_proxy_rs::actors::kernel_actor: kernel op failed";
/// The nftables coordinator's line when a transaction is refused.
const NFT_SYNC_FAILED: &str =
    "kube_proxy_rs::actors::coordinator::nftables: nftables sync failed: the next sync is a full one";
/// nf_tables refusing an op on an object that is not there.
const NFT_ENOENT: &str = "No such file or directory (os error 2); nothing of the transaction applied";
/// The kernel actors' line when their periodic check finds drift.
const DRIFT_FOUND: &str = "kube_proxy_rs::actors::kernel_actor: kernel state changed behind our back; full resync";
/// The kernel actors' line when the syncPeriod's check in a sync's batch finds drift.
const DRIFT_IN_SYNC: &str =
    "kube_proxy_rs::actors::kernel_actor: the kernel changed behind our back: this actor resyncs in full";

/// A soak run: how long it churns, how fast, and the faults (one per
/// segment; the churn time is split evenly over the segments, a final
/// segment without a fault included).
#[derive(Debug, Clone)]
pub struct SoakPlan {
    pub churn: Duration,
    pub rate: u32,
    pub faults: Vec<Fault>,
}

impl SoakPlan {
    /// `faults` over `SOAK_SECONDS` (default 120) at 10 changes a second.
    pub fn ci(faults: &[Fault]) -> SoakPlan {
        let seconds = std::env::var("SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
        SoakPlan { churn: Duration::from_secs(seconds), rate: 10, faults: faults.to_vec() }
    }
}

/// The lab, the API server, the cluster and the running daemon.
pub struct SoakLab {
    /// First, so it stops (and its log is printed) before the namespaces
    /// and the directory holding its log go.
    daemon: Option<Daemon>,
    pub node: Netns,
    pub client: Netns,
    _backends: Vec<Backend>,
    dir: tempfile::TempDir,
    api: ApiServer,
    _serving: std::sync::mpsc::Sender<()>,
    pub cluster: SoakCluster,
    tag: String,
    mode: Mode,
    /// Every daemon started: its log and RSS samples (s since the run began, KiB).
    instances: Vec<(PathBuf, Vec<(f64, u64)>)>,
    began: Instant,
    injected: Vec<Fault>,
    /// The running daemon's `sync finished` lines already reported.
    syncs_reported: usize,
    /// Changes applied, and checks passed.
    pub changes: u64,
    pub checks: usize,
    /// Time spent churning (the faults' own churn included).
    churned: Duration,
    /// The watches the first daemon had open at its first sync.
    watches: usize,
    /// The running daemon's log length when the last fault was injected.
    injected_at: usize,
    /// IPVS mode: a TCP connection held open through each probe address
    /// to each backend it answered from, by address and backend.
    held: BTreeMap<(String, String), Conn>,
}

impl SoakLab {
    /// The lab in `mode`, dual-stack or not, with the seeded cluster in the
    /// API server and the daemon started and synced.
    pub fn start(tag: &str, mode: Mode, dual_stack: bool, seed: u64) -> SoakLab {
        let (node, client, backends) = lab::topology(&format!("soak-{tag}"), &BACKENDS);
        let dir = tempfile::tempdir().expect("tempdir");
        let (api, serving) = node.api_server();
        let spec = SoakSpec { seed, services: 300, probes: 6, backends: BACKENDS.len(), dual_stack };
        let cluster = SoakCluster::new(spec);
        api.create(&SoakCluster::node(NODE_IP, dual_stack.then_some(NODE_IP6))).expect("the Node");
        for o in cluster.objects() {
            api.create(&o).unwrap_or_else(|e| panic!("create {o}: {e:?}"));
        }
        let mut lab = SoakLab {
            daemon: None,
            node,
            client,
            _backends: backends,
            dir,
            api,
            _serving: serving,
            cluster,
            tag: tag.to_string(),
            mode,
            instances: Vec::new(),
            began: Instant::now(),
            injected: Vec::new(),
            syncs_reported: 0,
            changes: 0,
            checks: 0,
            churned: Duration::ZERO,
            watches: 0,
            injected_at: 0,
            held: BTreeMap::new(),
        };
        lab.write_config(dual_stack);
        lab.start_daemon();
        lab
    }

    fn write_config(&self, dual_stack: bool) {
        let kubeconfig = self.dir.path().join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: {}\n\
             contexts:\n- name: t\n  context:\n    cluster: t\n    user: t\ncurrent-context: t\n\
             users:\n- name: t\n  user: {{}}\n",
            self.api.url()
        );
        std::fs::write(&kubeconfig, text).unwrap();
        let mode = match self.mode {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Ipvs => "ipvs",
        };
        let cidr = if dual_stack { "10.244.0.0/16,fd00:244::/48" } else { "10.244.0.0/16" };
        // IPVS writes a virtual server per NodePort and node address: the
        // client-facing addresses only (not the backends' links), a quarter
        // of the work for the TCG VM.
        let node_ports = match (self.mode, dual_stack) {
            (Mode::Ipvs, false) => "nodePortAddresses: [192.168.50.0/24]\n",
            (Mode::Ipvs, true) => "nodePortAddresses: [192.168.50.0/24, fd00:50::/64]\n",
            _ => "",
        };
        let config = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\n\
             hostnameOverride: {NODE}\nclusterCIDR: {cidr}\n{node_ports}\
             iptables:\n  syncPeriod: 10s\n  minSyncPeriod: 1s\n\
             nftables:\n  syncPeriod: 10s\n  minSyncPeriod: 1s\n\
             ipvs:\n  syncPeriod: 10s\n  minSyncPeriod: 1s\n\
             conntrack:\n  maxPerCore: 0\n\
             clientConnection:\n  kubeconfig: {}\n",
            kubeconfig.display()
        );
        std::fs::write(self.config_path(), config).unwrap();
        kube_proxy_rs::bench::daemon_run::iptables_shims(&self.shims(), "legacy").expect("iptables-legacy shims");
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    fn shims(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    fn lock_path(&self) -> PathBuf {
        self.dir.path().join("xtables.lock")
    }

    /// `XTABLES_LOCKFILE=` the lab's lock, for `env`: another writer of
    /// iptables takes the lock the daemon takes, as on a node (without it
    /// iptables-legacy's commit and the daemon's restore race, and one of
    /// them fails with EAGAIN).
    fn lock_env(&self) -> String {
        format!("XTABLES_LOCKFILE={}", self.lock_path().display())
    }

    /// `kube-proxy-rs ARGS` (or the daemon) in the node namespace: iptables
    /// mode runs iptables-legacy (shims first on PATH) with the lab's own
    /// xtables lock.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.node.name, &bin()]).args(args);
        if self.mode == Mode::Iptables {
            c.env("PATH", format!("{}:{}", self.shims().display(), std::env::var("PATH").unwrap_or_default()));
        }
        c.env("XTABLES_LOCKFILE", self.lock_path());
        c
    }

    fn start_daemon(&mut self) {
        let log = self.dir.path().join(format!("daemon-{}.log", self.instances.len() + 1));
        let config = self.config_path();
        // Debug lines: the coordinator's `sync started` (for kill -9 in a sync).
        let command = self.command(&["--config", config.to_str().expect("utf-8"), "--v=2"]);
        let started = Instant::now();
        let mut d = daemon::spawn(command, &self.node, log.clone());
        self.instances.push((log, Vec::new()));
        self.syncs_reported = 0;
        let node = &self.node;
        wait_for("the daemon's first sync", START_WAIT * slowdown(), || {
            d.assert_running();
            let syncs = daemon::syncs(node)?;
            syncs.iter().any(|s| s.full && s.failed == 0).then_some(()).ok_or(format!("{syncs:?}"))
        });
        self.say(format_args!(
            "daemon {} synced {:.1} s after its start",
            self.instances.len(),
            started.elapsed().as_secs_f64()
        ));
        if self.instances.len() == 1 {
            self.watches = self.api.open_watches();
        }
        self.daemon = Some(d);
    }

    /// A line of the soak's progress: the lab's tag and the seconds since
    /// it began (the VM test's summary picks the `soak:` lines).
    fn say(&self, what: std::fmt::Arguments) {
        eprintln!("soak: {} {:.1} s: {what}", self.tag, self.began.elapsed().as_secs_f64());
    }

    fn pid(&self) -> Option<u32> {
        self.daemon.as_ref().and_then(|d| d.child.as_ref()).map(Child::id)
    }

    /// One RSS sample of the running daemon.
    fn sample_rss(&mut self) {
        let Some(pid) = self.pid() else { return };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
        let t = self.began.elapsed().as_secs_f64();
        if let (Some(kib), Some(last)) = (kib, self.instances.last_mut()) {
            last.1.push((t, kib));
        }
    }

    /// Applies one write to the API server.
    fn write(&self, w: &Write) {
        let result = match w {
            Write::Create(o) => self.api.create(o),
            Write::Update(o) => self.api.update(o),
            Write::Delete(o) => self.api.delete(o),
        };
        result.unwrap_or_else(|e| panic!("{w:?}: {e:?}"));
    }

    /// The next change of the stream, written.
    fn change(&mut self) {
        let trigger = jiff::Timestamp::now().to_string();
        let (_, writes) = self.cluster.next_change(Some(&trigger));
        for w in &writes {
            self.write(w);
        }
        self.changes += 1;
    }

    /// `rate` changes a second for `length`, sampling RSS each second and
    /// checking the daemon still runs.
    fn churn(&mut self, length: Duration, rate: u32) {
        let start = Instant::now();
        let every = Duration::from_secs(1) / rate.max(1);
        let mut n: u32 = 0;
        let mut next_sample = Instant::now();
        while start.elapsed() < length {
            self.change();
            n += 1;
            if Instant::now() >= next_sample {
                self.sample_rss();
                if let Some(d) = self.daemon.as_mut() {
                    d.assert_running();
                }
                next_sample += Duration::from_secs(1);
            }
            if let Some(wait) = (every * n).checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        self.churned += start.elapsed();
    }

    /// The whole run: per segment churn, the fault, more churn, the
    /// convergence check; then the RSS and log verdicts. One segment per
    /// fault (one without faults): the last fault's check is the check at
    /// the end of the churn. The fault comes a quarter into its segment,
    /// so that the daemon's recovery (watches backing off and coming
    /// back, the syncPeriod's drift checks) runs under churn, not while
    /// the check waits. A fault's own churn (the API server away or
    /// answering 500s) is part of its segment's.
    pub fn run(&mut self, plan: &SoakPlan) {
        let faults: Vec<Option<Fault>> = match plan.faults.as_slice() {
            [] => vec![None],
            faults => faults.iter().copied().map(Some).collect(),
        };
        let segment = plan.churn / faults.len() as u32;
        for fault in faults {
            let began = self.churned;
            self.churn(segment / 4, plan.rate);
            if let Some(f) = fault {
                self.say(format_args!("{f:?} after {} changes", self.changes));
                self.inject(f, plan.rate);
            }
            self.churn(segment.saturating_sub(self.churned - began), plan.rate);
            if fault.is_some_and(|f| f.repaired_by_periodic_check(self.mode)) {
                // Under churn no sync waits a syncPeriod: one still carries the checks.
                let log = self.instances.last().map(|(l, _)| std::fs::read_to_string(l).unwrap_or_default());
                let checked = log.is_some_and(|l| self.checked_since_fault(&l));
                assert!(checked, "no IPv4 syncPeriod sync (the drift checks) in the churn after {fault:?}");
            }
            if fault.is_some_and(|f| f.waits_for_full_resync(self.mode)) {
                // A new daemon's first sync is full (a SIGHUP with the same
                // config applies nothing).
                self.daemon.take().expect("a daemon runs").stop();
                self.start_daemon();
            }
            self.converge(fault);
        }
        self.assert_rss_flat();
        self.assert_logs_explained();
    }

    /// Injects `fault` (churning on where the fault lasts a while).
    pub fn inject(&mut self, fault: Fault, rate: u32) {
        self.injected.push(fault);
        self.injected_at =
            self.instances.last().map_or(0, |(log, _)| std::fs::metadata(log).map_or(0, |m| m.len())) as usize;
        match fault {
            Fault::Kill9 => {
                let landed = (0..KILL_TRIES).any(|_| self.kill_in_a_sync(rate));
                assert!(landed, "none of {KILL_TRIES} kills landed while a sync was under way");
            }
            Fault::XtablesLock => self.hold_xtables_lock(rate),
            Fault::RefuseOps => match self.mode {
                Mode::Iptables | Mode::Ipvs => self.hold_xtables_lock(rate),
                Mode::Nftables => {
                    self.node.ok(&["nft", "delete", "table", "ip", "kube-proxy"]);
                }
            },
            Fault::FlushChain => match self.mode {
                Mode::Iptables | Mode::Ipvs => {
                    let tool = if self.mode == Mode::Iptables { "iptables-legacy" } else { "iptables" };
                    let lock = self.lock_env();
                    self.node.ok(&["env", &lock, tool, "-w", "5", "-t", "nat", "-F", "KUBE-SERVICES"]);
                }
                Mode::Nftables => {
                    self.node.ok(&["nft", "flush", "chain", "ip", "kube-proxy", "services"]);
                }
            },
            Fault::DeleteElement => self.delete_element(),
            Fault::RemoveRealServer => {
                let saved = self.node.ok(&["ipvsadm", "-S", "-n"]);
                let line = saved.lines().find(|l| l.starts_with("-a ")).expect("a real server");
                let words: Vec<&str> = line.split_whitespace().collect();
                // -a -t VIP:PORT -r RIP:PORT ...
                self.node.ok(&["ipvsadm", "-d", words[1], words[2], words[3], words[4]]);
            }
            Fault::DeleteServiceAddress => {
                let addrs = self.node.ok(&["ip", "-o", "-4", "addr", "show", "dev", "kube-ipvs0"]);
                let addr = addrs.split_whitespace().skip_while(|w| *w != "inet").nth(1).expect("an address");
                self.node.ok(&["ip", "addr", "del", addr, "dev", "kube-ipvs0"]);
            }
            Fault::ApiRestart => {
                self.api.set_reachable(false);
                self.churn(Duration::from_secs(5), rate);
                self.api.compact();
                self.api.set_reachable(true);
            }
            Fault::Api500 => {
                for kind in Kind::ALL {
                    self.api.fail_kind(kind, true);
                }
                self.api.cut_watches();
                self.churn(Duration::from_secs(10), rate);
                for kind in Kind::ALL {
                    self.api.fail_kind(kind, false);
                }
            }
            Fault::CloseWatches => {
                let cut = self.api.cut_watches();
                assert!(cut > 0, "watches were open");
            }
            Fault::Gone410 => {
                self.churn(Duration::from_secs(1), rate);
                self.api.compact();
                self.api.cut_watches();
            }
            Fault::Burst => {
                // Generated first, so that the API server sees them within the second.
                let trigger = jiff::Timestamp::now().to_string();
                let burst: Vec<Write> = (0..1000).flat_map(|_| self.cluster.next_change(Some(&trigger)).1).collect();
                let start = Instant::now();
                for w in &burst {
                    self.write(w);
                }
                self.changes += 1000;
                // Written as fast as the test API server takes them: well within
                // a second on a quiet machine; a loaded one may take longer,
                // which is the host's pace, not the daemon's, so it is reported.
                self.say(format_args!("the burst of 1,000 changes written in {:?}", start.elapsed()));
            }
        }
    }

    /// A burst of 50 changes; SIGKILL as soon as the log shows an IPv4
    /// sync under way (the family every soak cluster has Services of: a
    /// single-stack cluster's IPv6 syncs on a dual-stack node carry nothing
    /// and end at once); churn, then a new daemon. Whether the kill landed
    /// in that sync (the killed daemon's log has no `sync finished` for it).
    fn kill_in_a_sync(&mut self, rate: u32) -> bool {
        for _ in 0..50 {
            self.change();
        }
        let mut d = self.daemon.take().expect("a daemon runs");
        let log_path = d.log.clone();
        let before = syncs_in_progress(&std::fs::read_to_string(&log_path).unwrap_or_default());
        let deadline = Instant::now() + START_WAIT * slowdown();
        let under_way = loop {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let new = syncs_in_progress(&log).into_iter().find(|s| s.contains("IPv4") && !before.contains(s));
            match new {
                Some(sync) => break sync,
                None if Instant::now() >= deadline => {
                    panic!("no IPv4 sync started within {:?} of 50 changes", START_WAIT * slowdown())
                }
                None => std::thread::sleep(Duration::from_millis(2)),
            }
        };
        let mut child = d.child.take().expect("its child");
        child.kill().expect("SIGKILL");
        let status = child.wait().expect("wait");
        assert!(status.code().is_none(), "killed by a signal: {status}");
        drop(d);
        let landed = syncs_in_progress(&std::fs::read_to_string(&log_path).unwrap_or_default()).contains(&under_way);
        self.say(format_args!(
            "SIGKILL with {under_way} under way: {}",
            if landed { "in the sync" } else { "it had finished" }
        ));
        self.churn(Duration::from_secs(2), rate);
        self.start_daemon();
        landed
    }

    /// `flock` on the lab's xtables lock for 10 s while the churn goes on.
    fn hold_xtables_lock(&mut self, rate: u32) {
        let lock = self.lock_path();
        let mut holder =
            Command::new("flock").arg(&lock).args(["sleep", "10"]).stdout(Stdio::null()).spawn().expect("flock");
        self.churn(Duration::from_secs(10), rate);
        holder.wait().expect("flock ends");
    }

    /// One element of ours deleted by another writer.
    fn delete_element(&mut self) {
        match self.mode {
            Mode::Ipvs => {
                let set = self.node.ok(&["ipset", "list", "KUBE-CLUSTER-IP"]);
                let member = set
                    .lines()
                    .skip_while(|l| !l.starts_with("Members:"))
                    .nth(1)
                    .and_then(|l| l.split_whitespace().next())
                    .expect("a KUBE-CLUSTER-IP member");
                self.node.ok(&["ipset", "del", "KUBE-CLUSTER-IP", member]);
            }
            Mode::Nftables => {
                let map = self.node.ok(&["nft", "-j", "list", "map", "ip", "kube-proxy", "service-ips"]);
                let json: Value = serde_json::from_str(&map).expect("nft -j");
                let elem = json["nftables"]
                    .as_array()
                    .and_then(|a| a.iter().find_map(|o| o["map"]["elem"].as_array().cloned()))
                    .and_then(|e| e.first().cloned())
                    .expect("a service-ips element");
                let key = &elem[0]["concat"];
                let key: Vec<String> = key.as_array().expect("concat").iter().map(value_text).collect();
                let spec = format!("{{ {} }}", key.join(" . "));
                self.node.ok(&["nft", "delete", "element", "ip", "kube-proxy", "service-ips", &spec]);
            }
            Mode::Iptables => {
                let saved = self.node.ok(&["iptables-legacy-save", "-t", "nat"]);
                let rule = saved
                    .lines()
                    .find(|l| l.starts_with("-A KUBE-SVC-") && l.contains("-j KUBE-SEP-"))
                    .expect("a KUBE-SVC- rule");
                let lock = self.lock_env();
                let mut args = vec!["env", &lock, "iptables-legacy", "-w", "5", "-t", "nat", "-D"];
                args.extend(rule.trim_start_matches("-A ").split_whitespace());
                self.node.ok(&args);
            }
        }
    }

    /// The convergence check: `--dry-run --diff` clean and the probes
    /// answering from the right backends, within [`CONVERGE_WAIT`].
    pub fn converge(&mut self, fault: Option<Fault>) {
        let when = format!("after {fault:?}");
        let start = Instant::now();
        self.report_syncs();
        if self.mode == Mode::Ipvs {
            self.settle(fault.is_some_and(|f| f.repaired_by_periodic_check(self.mode)));
        }
        let config = self.config_path();
        let mut attempts: Vec<String> = Vec::new();
        wait_for(&format!("{when}: the kernel equal to a fresh full plan"), CONVERGE_WAIT * slowdown(), || {
            if let Some(d) = self.daemon.as_mut() {
                d.assert_running();
            }
            let began = Instant::now();
            // --v=2: its phases' debug lines (how long the list, the plan and the kernel read took).
            let args = ["--config", config.to_str().expect("utf-8"), "--dry-run", "--diff", "--v=2"];
            let out = self.command(&args).output().map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!("--dry-run --diff: {}", String::from_utf8_lossy(&out.stderr)));
            }
            let phases: Vec<String> = dry_run_phases(&String::from_utf8_lossy(&out.stderr))
                .into_iter()
                .map(|(what, s)| format!("{what} {s:.1} s"))
                .collect();
            let text = String::from_utf8_lossy(&out.stdout);
            let left = diff_leftovers(&text)?;
            let draining = if left.is_empty() || self.mode != Mode::Ipvs { None } else { draining_real_servers(&text) };
            let drained = draining.as_deref().map(|d| self.without_connections(d)).unwrap_or_default();
            let what = match (left.is_empty(), &draining) {
                (true, _) => "clean".to_string(),
                (false, Some(d)) if drained.is_empty() => format!("{} real servers of weight 0 draining", d.len()),
                (false, Some(d)) => {
                    format!("{} real servers of weight 0, {} without connections", d.len(), drained.len())
                }
                (false, None) => format!("{}; {}", left.join("; "), changed_lines(&text, 8).replace('\n', " | ")),
            };
            attempts.push(format!("{:.1} s ({what}; {})", began.elapsed().as_secs_f64(), phases.join(", ")));
            match left {
                left if left.is_empty() || (draining.is_some() && drained.is_empty()) => Ok(()),
                _ if !drained.is_empty() => {
                    let waited = self.wait_deleted(&drained);
                    attempts.push(format!("{waited:.1} s for graceful termination's check"));
                    Err(format!("real servers of weight 0 the kernel shows no connection through: {drained:?}"))
                }
                left => Err(format!("{left:?}\n{}", changed_lines(&text, 40))),
            }
        });
        self.say(format_args!("--dry-run --diff {when}: {}", attempts.join(", ")));
        let probing = Instant::now();
        for (addrs, want) in self.cluster.probe_expectations() {
            for to in &addrs {
                // iptables and nftables pick an endpoint at random: ask until
                // each ready backend answered (18 random picks missed one of
                // three one time in 500), at most 8 rounds.
                let mut got = Vec::new();
                for _ in 0..PROBE_ROUNDS {
                    got.extend(lab::ask(&self.client, to, 3 * want.len(), false, DROP_WAIT));
                    if !got.iter().all(Result::is_ok) || names(&got).is_superset(&want) {
                        break;
                    }
                }
                assert!(got.iter().all(Result::is_ok), "{when}: {to} answers: {got:?}");
                assert_eq!(names(&got), want, "{when}: {to} reaches its ready backends");
            }
        }
        if self.mode == Mode::Ipvs {
            self.hold_connections();
        }
        self.checks += 1;
        self.report_syncs();
        self.say(format_args!(
            "converged {when} in {:.1} s (probes {:.1} s)",
            start.elapsed().as_secs_f64(),
            probing.elapsed().as_secs_f64()
        ));
    }

    /// Opens and holds a TCP connection through each probe address to each
    /// of its backends that has none yet, as a node's long-lived clients
    /// do. A real server graceful termination drains then keeps a
    /// connection, and the check counts it as draining: without one, IPVS
    /// forgets the probes' closed connections two minutes after they close
    /// (TIME_WAIT), and the check waits up to a minute for graceful
    /// termination's next pass to delete it (vm_ipvs's
    /// `graceful-termination` proves that pass). A connection that fails to
    /// open is not a verdict (the probes just were).
    fn hold_connections(&mut self) {
        for (addrs, want) in self.cluster.probe_expectations() {
            for to in addrs {
                let missing = |held: &BTreeMap<(String, String), Conn>| {
                    want.iter().filter(|b| !held.contains_key(&(to.clone(), b.to_string()))).count()
                };
                for _ in 0..2 * missing(&self.held) {
                    let opened = self.client.run(|| {
                        let mut c = Conn::open(lab::addr(&to), DROP_WAIT).ok()?;
                        let (backend, _) = c.exchange().ok()?;
                        Some((backend, c))
                    });
                    if let Some((backend, c)) = opened {
                        self.held.entry((to.clone(), backend)).or_insert(c);
                    }
                    if missing(&self.held) == 0 {
                        break;
                    }
                }
            }
        }
    }

    /// Whether the daemon's `log` shows an IPv4 syncPeriod sync (its drift
    /// checks; the periodic-check faults are IPv4 objects) started and
    /// finished since the last fault was injected.
    fn checked_since_fault(&self, log: &str) -> bool {
        periodic_sync_ran(whole_lines_from(log, self.injected_at), "IPv4")
    }

    /// Of real servers at weight 0, those the kernel shows no connection
    /// through (`ipvsadm -L -n` of their virtual server): graceful
    /// termination deletes them at its next check, so they count as
    /// converged no longer.
    fn without_connections<'a>(&self, draining: &'a [DrainingDest]) -> Vec<&'a DrainingDest> {
        draining.iter().filter(|d| self.connections(d).unwrap_or(0) == 0).collect()
    }

    /// A real server's connections as `ipvsadm -L -n` of its virtual
    /// server shows them (None: it is not there).
    fn connections(&self, d: &DrainingDest) -> Option<u64> {
        let mut args = vec!["ipvsadm", "-L", "-n"];
        args.extend(d.service.split_whitespace());
        real_server_connections(&self.node.ok(&args), &d.real)
    }

    /// Waits until graceful termination has deleted each of `drained` (or
    /// it has connections again), polling `ipvsadm -L -n` (one virtual
    /// server each, cheap), for at most its check interval and a margin: a
    /// `--dry-run --diff` before that finds them still there and costs
    /// 15-40 s in the VM. Returns the seconds waited.
    fn wait_deleted(&self, drained: &[&DrainingDest]) -> f64 {
        let start = Instant::now();
        while start.elapsed() < CHECK_INTERVAL + Duration::from_secs(15) {
            if drained.iter().all(|d| self.connections(d).is_none_or(|n| n > 0)) {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        start.elapsed().as_secs_f64()
    }

    /// Waits until the running daemon has gone quiet (no sync under way
    /// and none finished for [`QUIET`]) with as many watches open as the
    /// first daemon had (after an API server fault it is quiet while its
    /// watches wait to come back, behind on the churn) and, when
    /// `periodic`, has run a syncPeriod sync since the fault
    /// ([`Self::checked_since_fault`]). In IPVS mode a
    /// `--dry-run --diff` before that would find the repair still to come,
    /// and each one costs 15-40 s in the VM (a second on the host, where
    /// the retries are cheaper than waiting).
    /// Gives up after [`CONVERGE_WAIT`] (times [`slowdown`]): the diff
    /// stays the verdict.
    fn settle(&self, periodic: bool) {
        let Some((log, _)) = self.instances.last() else { return };
        let read = || std::fs::read_to_string(log).unwrap_or_default();
        let start = Instant::now();
        let (mut seen, mut quiet_since) = (finished_syncs(&read()).len(), Instant::now());
        while start.elapsed() < CONVERGE_WAIT * slowdown() {
            let text = read();
            let syncs = finished_syncs(&text);
            let checked = !periodic || self.checked_since_fault(&text);
            if syncs.len() != seen || sync_in_progress(&text).is_some() || self.api.open_watches() < self.watches {
                (seen, quiet_since) = (syncs.len(), Instant::now());
            } else if checked && quiet_since.elapsed() >= QUIET {
                let watches = self.watches;
                self.say(format_args!(
                    "the daemon settled in {:.1} s ({watches} watches)",
                    start.elapsed().as_secs_f64()
                ));
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.say(format_args!("the daemon did not settle within {:?}", CONVERGE_WAIT * slowdown()));
    }

    /// The running daemon's syncs finished since the last report: how
    /// many, how many full, their total and longest time.
    fn report_syncs(&mut self) {
        let Some((log, _)) = self.instances.last() else { return };
        let syncs = finished_syncs(&std::fs::read_to_string(log).unwrap_or_default());
        let new = syncs.get(self.syncs_reported..).unwrap_or_default();
        let total: f64 = new.iter().map(|s| s.ms).sum();
        let longest = new.iter().map(|s| s.ms).fold(0.0, f64::max);
        let full = new.iter().filter(|s| s.full).count();
        self.say(format_args!(
            "daemon {}: {} syncs ({full} full) in {:.1} s, the longest {:.0} ms",
            self.instances.len(),
            new.len(),
            total / 1000.0,
            longest
        ));
        self.syncs_reported = syncs.len();
    }

    fn assert_rss_flat(&self) {
        let (log, samples) = self.instances.iter().max_by_key(|(_, s)| s.len()).expect("a daemon ran");
        let start = samples.first().map_or(0.0, |s| s.0);
        let rebased: Vec<(f64, u64)> = samples.iter().map(|(t, k)| (t - start, *k)).collect();
        let trend = RssTrend::of(&rebased, RSS_WARMUP)
            .unwrap_or_else(|| panic!("too few RSS samples of {}: {}", log.display(), samples.len()));
        self.say(format_args!("RSS {trend:?}"));
        assert!(trend.is_flat(RSS_MARGIN, RSS_SLACK_KIB), "RSS grew: {trend:?} {rebased:?}");
    }

    fn assert_logs_explained(&self) {
        let faults = self.injected.iter().flat_map(|f| f.explains(self.mode).iter().copied());
        let mode = (self.mode == Mode::Ipvs).then_some(IPVS_DEPRECATED);
        let mut explained: Vec<Explained> = ENVIRONMENT_WARNINGS.iter().copied().chain(mode).chain(faults).collect();
        explained.sort_unstable();
        explained.dedup();
        for (path, _) in &self.instances {
            let log = std::fs::read_to_string(path).unwrap_or_default();
            let bad = unexplained_log_lines(&log, &explained);
            assert!(bad.is_empty(), "{} logged what no injected fault explains:\n{}", path.display(), bad.join("\n"));
            let all = unexplained_log_lines(&log, &[]);
            for parts in &explained {
                let n = all.iter().filter(|l| parts.iter().all(|p| l.contains(p))).count();
                if n > 0 {
                    self.say(format_args!("{}: {n} × {parts:?}", path.display()));
                }
            }
        }
    }

    /// Stops the daemon (SIGTERM, exit 0).
    pub fn stop(mut self) {
        if let Some(d) = self.daemon.take() {
            d.stop();
        }
        self.say(format_args!(
            "{} changes in {:.0} s of churn, {} checks",
            self.changes,
            self.churned.as_secs_f64(),
            self.checks
        ));
    }
}

/// `text` from byte `at` on, from the first whole line there: a daemon log
/// read from the length it had (a line may have been half written then).
fn whole_lines_from(text: &str, at: usize) -> &str {
    if at == 0 {
        return text;
    }
    match text.as_bytes().get(at - 1) {
        None => "",
        Some(b'\n') => &text[at..],
        Some(_) => {
            let next = text.as_bytes()[at..].iter().position(|b| *b == b'\n');
            next.map_or("", |i| &text[at + i + 1..])
        }
    }
}

/// An nft JSON value as `nft` reads it back (a string or a number).
fn value_text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), String::from)
}

/// The `+`/`-` lines of a preview, at most `most`.
fn changed_lines(preview: &str, most: usize) -> String {
    let lines: Vec<&str> = preview.lines().filter(|l| l.starts_with('+') || l.starts_with('-')).take(most).collect();
    lines.join("\n")
}
