//! IPVS mode end to end on a real kernel (issue 7): `kpr-bench ipvs`, meant
//! to run as root inside the VM (`tests/vm/bench-ipvs.sh`; the host kernel
//! has no IPVS).
//!
//! For each cluster size N (from [`crate::bench::gen`]), each phase in a
//! fresh network namespace of its own (deleted afterwards, and the guest
//! left to go idle), so no phase inherits another's kernel state: IPVS
//! keeps deleted real servers on a trash list for minutes, and every add
//! walks it.
//!
//! 1. the daemon's actors over the real kernel handles, as `runtime.rs`
//!    builds them (graceful IPVS over our netlink client, one ipset handle
//!    per set over one ipset netlink client, `kube-ipvs0` over rtnetlink, `iptables-restore`, ctnetlink),
//!    and the coordinator with minSyncPeriod 0 and a one-hour syncPeriod;
//!    cold full sync: every initial event sent → every actor acked, timed,
//!    with each actor's apply time and the kernel handles' counters; the
//!    guest's idle CPU before and after; then single endpoint changes, one
//!    at a time (generator churn): event → every actor acked, and the
//!    counters' deltas per change (IPVS netlink messages, ipset add/del messages, link
//!    requests, iptables-restore lines, conntrack messages); peak RSS
//!    (VmHWM, reset before each size);
//! 2. the planning alone (no kernel), then the cold state through each
//!    handle alone, one after the other (where the daemon's time goes);
//! 3. the same cold state applied by the tools from files: `ipset restore`,
//!    `ipvsadm -R`, `ip -batch` (kube-ipvs0 and its addresses) and
//!    `iptables-restore --noflush`, each timed; the kernel state they leave
//!    is compared with ours (sorted `ipvsadm -S -n`, `ipset save`,
//!    `ip -o addr`, `iptables-save`).
//!
//! Then, with two sizes or more, every size's daemon at once (one namespace
//! each) gets the endpoint changes in turn, so their latencies are compared
//! under the same host load.
//!
//! A small warm-up size runs first, unreported, so that module loading and
//! first-exec costs land on neither side of the comparison.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::{bail, ensure, Context as _};
use serde::Serialize;

use crate::actors::coordinator::{AddrSource, Coordinator, GetSyncHistory, RulesRenderer, Settings, SyncRecord};
use crate::actors::wiring::{start_ipvs_actors, IpvsKernels};
use crate::bench::gen::{Cluster, ClusterSpec, THIS_NODE};
use crate::bench::stats::quantile;
use crate::bench::{local_addrs, plan_settings, rules_config};
use crate::kernel::conntrack::NetlinkConntrack;
use crate::kernel::ipset::netlink::NetlinkIpset;
use crate::kernel::ipset::IpsetHandle;
use crate::kernel::iptables::{restore_input_on_empty_kernel, IptablesHandle};
use crate::kernel::ipvs::graceful::{GracefulIpvs, Ownership};
use crate::kernel::ipvs::netlink::{IpvsError, NetlinkIpvs};
use crate::kernel::link::DummyLink;
use crate::kernel::sysctl;
use crate::kernel::Subsystem;
use crate::model::{Model, NodeInfo};
use crate::msgs::link::DUMMY_LINK;
use crate::msgs::{IpsetOp, IptablesOp, LinkOp, RestoreInput, SourceBatch, SourceEvent};
use crate::net::IpFamily;
use crate::plan::context::plan_context;
use crate::plan::rules_ipvs;
use crate::plan::{render, IpvsDesired, IpvsPlanner, IpvsSet};
use crate::stats::{StatsRegistry, StatsSnapshot};

const FAMILY: IpFamily = IpFamily::V4;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Cluster sizes (services), measured in this order.
    pub services: Vec<usize>,
    /// Single endpoint changes timed per size.
    pub changes: usize,
    pub seed: u64,
    pub nodes: usize,
    pub endpoints: usize,
    /// Services of the unreported warm-up round (0: none).
    pub warmup: usize,
    /// Where the tools' input files are written.
    pub work_dir: PathBuf,
    /// Compare the kernel state the tools leave with ours.
    pub verify: bool,
    /// Also apply the cold state through each handle alone (where the time goes).
    pub breakdown: bool,
}

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub services: usize,
    pub metric: String,
    pub value: f64,
    pub unit: &'static str,
    /// The target, if it has one.
    pub target: Option<String>,
    pub met: Option<bool>,
}

struct Figures<'a> {
    out: &'a mut Vec<Figure>,
    /// The warm-up round reports nothing.
    quiet: bool,
}

impl Figures<'_> {
    fn add(&mut self, services: usize, metric: &str, value: f64, unit: &'static str) {
        if !self.quiet {
            self.out.push(Figure { services, metric: metric.into(), value, unit, target: None, met: None });
        }
    }

    fn target(&mut self, services: usize, metric: &str, value: f64, unit: &'static str, target: &str, met: bool) {
        if !self.quiet {
            let target = Some(target.to_string());
            self.out.push(Figure { services, metric: metric.into(), value, unit, target, met: Some(met) });
        }
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// A field of /proc/self/status, in kB.
fn status_kb(field: &str) -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resets VmHWM to the current RSS (`clear_refs` 5, Linux ≥ 4.0).
fn reset_hwm() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn mb(kb: f64) -> f64 {
    (kb / 1024.0 * 10.0).round() / 10.0
}

/// The kernel handles' counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counters {
    ipvs_messages: u64,
    ipvs_datagrams: u64,
    ipset_ops: u64,
    link_requests: u64,
    iptables_lines: u64,
    conntrack_messages: u64,
}

impl Counters {
    fn since(self, before: Counters) -> Counters {
        Counters {
            ipvs_messages: self.ipvs_messages - before.ipvs_messages,
            ipvs_datagrams: self.ipvs_datagrams - before.ipvs_datagrams,
            ipset_ops: self.ipset_ops - before.ipset_ops,
            link_requests: self.link_requests - before.link_requests,
            iptables_lines: self.iptables_lines - before.iptables_lines,
            conntrack_messages: self.conntrack_messages - before.conntrack_messages,
        }
    }

    /// (name, value, unit) of each counter that goes into the per-change figures.
    fn named(&self) -> [(&'static str, u64, &'static str); 5] {
        [
            ("IPVS netlink messages", self.ipvs_messages, "msgs"),
            ("ipset add/del netlink messages", self.ipset_ops, "msgs"),
            ("kube-ipvs0 rtnetlink requests", self.link_requests, "requests"),
            ("iptables-restore lines", self.iptables_lines, "lines"),
            ("conntrack netlink messages", self.conntrack_messages, "msgs"),
        ]
    }
}

/// Clones of the handles the actors own (clones share the counters).
struct Handles {
    ipvs: NetlinkIpvs,
    sets: Vec<IpsetHandle>,
    link: DummyLink,
    iptables: IptablesHandle,
    conntrack: NetlinkConntrack,
}

impl Handles {
    fn counters(&self) -> Counters {
        Counters {
            ipvs_messages: self.ipvs.messages_sent(),
            ipvs_datagrams: self.ipvs.datagrams_sent(),
            ipset_ops: self.sets.iter().map(IpsetHandle::ops_sent).sum(),
            link_requests: self.link.requests(),
            iptables_lines: self.iptables.lines_written(),
            conntrack_messages: self.conntrack.messages_sent(),
        }
    }
}

/// The IPVS-mode daemon over the real kernel, without a source.
struct Daemon {
    coord: Addr<Coordinator>,
    handles: Handles,
    registry: StatsRegistry,
}

fn not_available(e: IpvsError) -> anyhow::Error {
    match e {
        IpvsError::NotAvailable => anyhow::anyhow!(
            "{e}. This benchmark needs a kernel with IPVS, as root: run it in the VM with tests/vm/bench-ipvs.sh"
        ),
        other => anyhow::anyhow!("connecting to IPVS: {other}"),
    }
}

/// Builds the handles as `runtime::start_ipvs` does and starts the actors
/// and the coordinator. Must run inside the actix system.
async fn start_daemon(random_fully: bool) -> anyhow::Result<Daemon> {
    let ipvs = NetlinkIpvs::connect().await.map_err(not_available)?;
    let graceful = GracefulIpvs::new(ipvs.clone(), Ownership { family: FAMILY, exclude: Vec::new() });
    let ipset = NetlinkIpset::new().context("ipset netlink")?;
    let sets: BTreeMap<IpvsSet, IpsetHandle> =
        IpvsSet::ALL.iter().map(|s| (*s, IpsetHandle::new(&ipset, s.spec(FAMILY)))).collect();
    let link = DummyLink::new().context("rtnetlink")?.with_family(FAMILY);
    let iptables = IptablesHandle::new(FAMILY);
    let conntrack = NetlinkConntrack::new().context("conntrack netlink")?;
    let handles = Handles {
        ipvs,
        sets: sets.values().cloned().collect(),
        link: link.clone(),
        iptables: iptables.clone(),
        conntrack: conntrack.clone(),
    };
    let registry = StatsRegistry::default();
    let kernels = IpvsKernels { ipvs: graceful, sets, link, iptables, conntrack };
    let settings = Settings {
        plan: plan_settings(),
        min_sync: Duration::ZERO,
        max_sync: Duration::from_secs(3600),
        burst: 2,
        model_gates: Default::default(),
    };
    let addrs: AddrSource = Box::new(local_addrs);
    let cfg = rules_config(random_fully);
    let rules: RulesRenderer = Box::new(move |p: &IpvsPlanner, _: &NodeInfo| p.rules(&cfg));
    let coord = Coordinator::create(|ctx| {
        let targets = start_ipvs_actors(kernels, &registry, ctx.address().recipient());
        Coordinator::new(settings, targets, addrs, rules)
    });
    Ok(Daemon { coord, handles, registry })
}

impl Daemon {
    async fn history(&self) -> Vec<SyncRecord> {
        self.coord.send(GetSyncHistory).await.unwrap_or_default()
    }

    /// Sends a batch and waits until a sync that started after it finished
    /// (every actor acked); returns that sync's record. Polls the
    /// coordinator (yielding between polls), as the in-memory benches do.
    async fn send_and_wait(&self, events: Vec<SourceEvent>, limit: Duration) -> anyhow::Result<SyncRecord> {
        let before = self.history().await.last().map_or(0, |s| s.generation);
        self.coord.send(SourceBatch(events)).await?;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(rec) = self.history().await.into_iter().rev().find(|s| s.generation > before) {
                return Ok(rec);
            }
            ensure!(Instant::now() < deadline, "no sync within {limit:?}");
            tokio::task::yield_now().await;
        }
    }

    fn stats(&self) -> BTreeMap<String, StatsSnapshot> {
        self.registry.snapshot().into_iter().map(|s| (s.name.clone(), s)).collect()
    }

    /// Each actor's (batches, total apply seconds) so far.
    fn apply_totals(&self) -> BTreeMap<String, (u64, f64)> {
        self.registry
            .actors()
            .iter()
            .map(|a| {
                let h = a.apply_histogram();
                (a.name.clone(), (h.count, h.sum))
            })
            .collect()
    }
}

/// Upstream's sysctls for IPVS mode, as the daemon sets them at start.
fn set_sysctls() {
    let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    for (path, value) in sysctl::ipvs_sysctls(false, &release) {
        if let Err(e) = sysctl::ensure_sysctl(path, value) {
            eprintln!("kpr-bench ipvs: sysctl {path}={value}: {e}");
        }
    }
}

/// Runs every size; figures go to `out` as they are measured.
pub fn run(opts: &Options, out: &mut Vec<Figure>) -> anyhow::Result<()> {
    let euid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:"))?.split_whitespace().nth(2).map(str::to_string));
    ensure!(euid.as_deref() == Some("0"), "kpr-bench ipvs must run as root (in the VM: tests/vm/bench-ipvs.sh)");
    // The actors' warnings (failed kernel ops) on stderr; RUST_LOG overrides.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(NetlinkIpvs::connect()).map_err(not_available)?;
    let random_fully = rt.block_on(IptablesHandle::new(FAMILY).random_fully());
    drop(rt);
    std::fs::create_dir_all(&opts.work_dir).with_context(|| format!("creating {}", opts.work_dir.display()))?;
    if opts.warmup > 0 {
        eprintln!("kpr-bench ipvs: warm-up with {} services (not reported)", opts.warmup);
        let mut ignored = Vec::new();
        let mut f = Figures { out: &mut ignored, quiet: true };
        run_size(opts, opts.warmup, opts.changes.min(20), random_fully, &mut f)?;
    }
    let mut p99 = Vec::new();
    for &n in &opts.services {
        let mut f = Figures { out, quiet: false };
        p99.push((n, run_size(opts, n, opts.changes, random_fully, &mut f)?));
    }
    if let Some((n0, a, n1, b)) = smallest_and_largest(&p99) {
        let ratio = round2(b.as_secs_f64() / a.as_secs_f64());
        let metric = format!("endpoint change → every actor acked: p99 at N={n1} / p99 at N={n0} (minutes apart)");
        out.push(Figure { services: n1, metric, value: ratio, unit: "×", target: None, met: None });
    }
    let mut sizes = opts.services.clone();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.len() > 1 && opts.changes > 0 {
        interleaved(opts, &sizes, random_fully, &mut Figures { out, quiet: false })?;
    }
    Ok(())
}

/// (smallest N, its value, largest N, its value), when they differ.
fn smallest_and_largest(v: &[(usize, Duration)]) -> Option<(usize, Duration, usize, Duration)> {
    let (n0, a) = *v.iter().min_by_key(|x| x.0)?;
    let (n1, b) = *v.iter().max_by_key(|x| x.0)?;
    (n1 > n0 && a > Duration::ZERO).then_some((n0, a, n1, b))
}

/// Every size's daemon at once, each in its own network namespace, and the
/// endpoint changes sent to them in turn (one change to each, the order
/// alternating every round): their latencies are measured under the same
/// load, which in an emulated VM on a shared host drifts by several times
/// within minutes.
fn interleaved(opts: &Options, sizes: &[usize], random_fully: bool, f: &mut Figures) -> anyhow::Result<()> {
    let mut daemons = Vec::new();
    for &n in sizes {
        let spec =
            ClusterSpec { services: n, endpoints_per_service: opts.endpoints, nodes: opts.nodes, seed: opts.seed };
        let mut cluster = Cluster::new(spec)?;
        let events = cluster.initial_events();
        let batches: Vec<Vec<SourceEvent>> = (0..opts.changes).map(|_| cluster.next_endpoint_change().1).collect();
        drop(cluster);
        let (d, cold) = NetnsDaemon::start(&format!("kpr-bench-{n}"), events, random_fully)?;
        eprintln!("kpr-bench ipvs: interleaved: N={n} in netns {}: cold sync {:.1}s", d.name, cold.as_secs_f64());
        f.add(n, "interleaved: cold full sync in a fresh netns, events sent → every actor acked", ms(cold), "ms");
        daemons.push((n, d, batches.into_iter(), Vec::with_capacity(opts.changes)));
    }
    let started = Instant::now();
    for round in 0..opts.changes {
        let order: Vec<usize> =
            if round % 2 == 0 { (0..daemons.len()).collect() } else { (0..daemons.len()).rev().collect() };
        for i in order {
            let (_, d, batches, times) = &mut daemons[i];
            let Some(events) = batches.next() else { continue };
            let (took, rec, ops) = d.change(events)?;
            ensure!(!rec.full, "an endpoint change made a full sync");
            times.push((took, ops));
        }
    }
    eprintln!("kpr-bench ipvs: interleaved: {} rounds in {:.1}s", opts.changes, started.elapsed().as_secs_f64());
    let mut p99 = Vec::new();
    for (n, _, _, times) in &daemons {
        let all: Vec<Duration> = times.iter().map(|t| t.0).collect();
        f.add(*n, "interleaved: endpoint change → every actor acked: p50", ms(quantile(&all, 0.5)), "ms");
        let q = quantile(&all, 0.99);
        f.add(*n, "interleaved: endpoint change → every actor acked: p99", ms(q), "ms");
        f.add(*n, "interleaved: endpoint change → every actor acked: max", ms(quantile(&all, 1.0)), "ms");
        class_figures(*n, "interleaved: ", times, f);
        p99.push((*n, q));
    }
    drop(daemons);
    if let Some((n0, a, n1, b)) = smallest_and_largest(&p99) {
        let ratio = round2(b.as_secs_f64() / a.as_secs_f64());
        let metric = format!("interleaved: endpoint change → every actor acked: p99 at N={n1} / p99 at N={n0}");
        f.target(n1, &metric, ratio, "×", "≤ 1.5 ×", ratio <= 1.5);
    }
    Ok(())
}

type Reply = anyhow::Result<(Duration, SyncRecord, Counters)>;

/// One change for a [`NetnsDaemon`], and where its result goes.
struct Request {
    events: Vec<SourceEvent>,
    reply: std::sync::mpsc::Sender<Reply>,
}

/// A daemon in a network namespace of its own (`ip netns add`), on a
/// thread of its own that entered it: its netlink sockets and the tools it
/// runs (ipset, iptables-restore) act on that namespace only.
struct NetnsDaemon {
    name: String,
    tx: Option<tokio::sync::mpsc::UnboundedSender<Request>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NetnsDaemon {
    /// Creates the namespace, starts the daemon in it and runs its cold
    /// sync; returns the cold sync's time (events sent → every actor acked).
    fn start(name: &str, events: Vec<SourceEvent>, random_fully: bool) -> anyhow::Result<(NetnsDaemon, Duration)> {
        let path = netns_add(name)?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Request>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<Duration>>();
        let thread = std::thread::spawn(move || {
            if let Err(e) = enter_netns(&path) {
                let _ = ready_tx.send(Err(e));
                return;
            }
            let sys = actix_rt::System::new();
            sys.block_on(async move {
                let d = match start_daemon(random_fully).await {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let t = Instant::now();
                let cold = match d.send_and_wait(events, Duration::from_secs(3600)).await {
                    Ok(rec) if rec.failed == 0 => Ok(t.elapsed()),
                    Ok(rec) => Err(anyhow::anyhow!("the cold sync failed {} ops", rec.failed)),
                    Err(e) => Err(e),
                };
                let failed = cold.is_err();
                let _ = ready_tx.send(cold);
                if failed {
                    return;
                }
                while let Some(req) = rx.recv().await {
                    let (c0, t) = (d.handles.counters(), Instant::now());
                    let res = d.send_and_wait(req.events, Duration::from_secs(120)).await;
                    let res = res.map(|rec| (t.elapsed(), rec, d.handles.counters().since(c0)));
                    let _ = req.reply.send(res);
                }
            });
        });
        // Dropped on error: stops the thread, deletes the namespace.
        let d = NetnsDaemon { name: name.to_string(), tx: Some(tx), thread: Some(thread) };
        let cold = ready_rx.recv().map_err(|_| anyhow::anyhow!("the daemon in {name} stopped"))??;
        Ok((d, cold))
    }

    /// Sends one change; its time (event → every actor acked) and sync record.
    fn change(&self, events: Vec<SourceEvent>) -> Reply {
        let (reply, rx) = std::sync::mpsc::channel();
        let tx = self.tx.as_ref().ok_or_else(|| anyhow::anyhow!("stopped"))?;
        tx.send(Request { events, reply }).map_err(|_| anyhow::anyhow!("the daemon in {} stopped", self.name))?;
        rx.recv().map_err(|_| anyhow::anyhow!("the daemon in {} stopped", self.name))?
    }
}

impl Drop for NetnsDaemon {
    /// Stops the daemon (its actors and sockets go with its system) and
    /// deletes the namespace with everything in it.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        netns_del(&self.name);
    }
}

/// Creates network namespace `name` (deleting a leftover one first) with
/// lo up, as on a node: without a local routing table IPVS refuses real
/// servers (EINVAL) until some address exists. Returns its path.
fn netns_add(name: &str) -> anyhow::Result<PathBuf> {
    netns_del(name);
    let (ok, _) = stdout_of("ip", &["netns", "add", name])?;
    ensure!(ok, "ip netns add {name} failed");
    let (ok, _) = stdout_of("ip", &["-n", name, "link", "set", "lo", "up"])?;
    ensure!(ok, "ip -n {name} link set lo up failed");
    Ok(PathBuf::from("/run/netns").join(name))
}

fn netns_del(name: &str) {
    let _ = Command::new("ip").args(["netns", "del", name]).stderr(Stdio::null()).status();
}

/// Moves the calling thread into the namespace at `path` (sockets it opens
/// and processes it starts from then on live there) and sets upstream's
/// sysctls in it, as the daemon does at start.
fn enter_netns(path: &Path) -> anyhow::Result<()> {
    let fd = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("entering {}", path.display()))?;
    set_sysctls();
    Ok(())
}

/// Runs `f` on a thread inside a fresh network namespace `name`, then
/// deletes the namespace and waits for the kernel to finish tearing it
/// down. Each phase gets a kernel of its own: IPVS keeps a deleted real
/// server on a trash list for minutes and every add walks that list, so a
/// flushed table would slow whatever runs next.
fn in_netns<T: Send>(name: &str, f: impl FnOnce() -> anyhow::Result<T> + Send) -> anyhow::Result<T> {
    let path = netns_add(name)?;
    let res = std::thread::scope(|s| {
        s.spawn(|| {
            enter_netns(&path)?;
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the thread in netns {name} panicked"))?
    });
    netns_del(name);
    if res.is_ok() {
        wait_quiet();
    }
    res
}

/// (idle, total) jiffies summed over the CPUs, and the CPU count (/proc/stat).
fn cpu_jiffies() -> Option<(u64, u64, usize)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let first = text.lines().next()?;
    let v: Vec<u64> = first.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal
    let total = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    let cpus = text.lines().filter(|l| l.starts_with("cpu") && !l.starts_with("cpu ")).count().max(1);
    Some((idle, total, cpus))
}

/// The guest's busy time between two readings, in % of one CPU.
fn busy_between(a: (u64, u64, usize), b: (u64, u64, usize)) -> f64 {
    let total = b.1.saturating_sub(a.1) as f64;
    if total <= 0.0 {
        return 0.0;
    }
    let busy = total - b.0.saturating_sub(a.0) as f64;
    (busy / (total / a.2 as f64) * 1000.0).round() / 10.0
}

/// The guest's busy time over `window` (the caller idle meanwhile).
async fn busy_percent(window: Duration) -> f64 {
    let a = cpu_jiffies();
    tokio::time::sleep(window).await;
    match (a, cpu_jiffies()) {
        (Some(a), Some(b)) => busy_between(a, b),
        _ => f64::NAN,
    }
}

/// Waits (at most 5 minutes) until the guest was nearly idle for a second.
fn wait_quiet() {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(300) {
        let a = cpu_jiffies();
        std::thread::sleep(Duration::from_secs(1));
        match (a, cpu_jiffies()) {
            (Some(a), Some(b)) if busy_between(a, b) > 10.0 => continue,
            _ => break,
        }
    }
    if t.elapsed() > Duration::from_secs(2) {
        eprintln!("kpr-bench ipvs: waited {:.0}s for the kernel to tear the namespace down", t.elapsed().as_secs_f64());
    }
}

/// One size: our daemon (cold sync, changes, RSS), then the tools. Returns
/// the p99 of the changes.
fn run_size(opts: &Options, n: usize, changes: usize, random_fully: bool, f: &mut Figures) -> anyhow::Result<Duration> {
    let spec = ClusterSpec { services: n, endpoints_per_service: opts.endpoints, nodes: opts.nodes, seed: opts.seed };
    let t = Instant::now();
    let mut cluster = Cluster::new(spec)?;
    let events = cluster.initial_events();
    let batches: Vec<Vec<SourceEvent>> = (0..changes).map(|_| cluster.next_endpoint_change().1).collect();
    drop(cluster);
    eprintln!("kpr-bench ipvs: N={n}: generated in {:.1}s", t.elapsed().as_secs_f64());
    let hwm_reset = reset_hwm();
    let rss0 = status_kb("VmRSS:").unwrap_or(0.0);
    let ours = Ours { n, events, batches, verify: opts.verify, random_fully };
    let measured = in_netns(&format!("kpr-bench-{n}-daemon"), || {
        let sys = actix_rt::System::new();
        let measured = sys.block_on(ours.run(f));
        // Closes the daemon's sockets before the namespace goes.
        drop(sys);
        measured
    })?;
    f.add(n, "RSS before the daemon (generated events and changes included)", mb(rss0), "MB");
    let label = if hwm_reset { "peak RSS (VmHWM) of the bench process" } else { "peak RSS (VmHWM, not reset)" };
    f.add(n, label, mb(measured.hwm_kb), "MB");

    // The same cold state, planned alone, then applied through each handle
    // alone, then through the tools from files.
    let (desired, rules, plan) = plan_cold(spec, random_fully)?;
    f.add(n, "cold: planning alone (record + apply + plan + desired state), no kernel", ms(plan), "ms");
    if opts.breakdown {
        in_netns(&format!("kpr-bench-{n}-handles"), || handles_one_at_a_time(n, &desired, &rules, f))?;
    }
    let files = write_tool_files(&desired, &rules, &opts.work_dir)?;
    drop(desired);
    let verify = measured.state.is_some();
    let (total, without_addrs, tools_state) = in_netns(&format!("kpr-bench-{n}-tools"), || {
        let mut total = Duration::ZERO;
        let mut without_addrs = Duration::ZERO;
        for (tool, args, file) in [
            ("ipset", vec!["restore"], &files.ipset),
            ("ipvsadm", vec!["-R"], &files.ipvs),
            ("ip", vec!["-batch", "-"], &files.ip),
            ("iptables-restore", vec!["-w", "--noflush"], &files.iptables),
        ] {
            let took = run_tool(tool, &args, file)?;
            total += took;
            if tool != "ip" {
                without_addrs += took;
            }
            let what = format!("tools: {tool} {} < file ({} lines)", args.join(" "), files.lines(file));
            f.add(n, &what, ms(took), "ms");
        }
        let tools_state = if verify { Some(KernelState::read()?) } else { None };
        anyhow::Ok((total, without_addrs, tools_state))
    })?;
    f.add(n, "tools: total (ipset + ipvsadm + ip -batch + iptables-restore, one after the other)", ms(total), "ms");
    eprintln!("kpr-bench ipvs: N={n}: tools {:.1}s (ours {:.1}s)", total.as_secs_f64(), measured.cold.as_secs_f64());
    if let (Some(our_state), Some(tools_state)) = (&measured.state, tools_state) {
        for (what, a, b) in our_state.compare(&tools_state) {
            f.add(n, &format!("state check: {what} lines, ours"), a.lines as f64, "lines");
            f.target(
                n,
                &format!("state check: {what}, the tools' state equals ours"),
                f64::from(u8::from(a == b)),
                "bool",
                "= 1",
                a == b,
            );
        }
    }
    let ratio = round2(measured.cold.as_secs_f64() / total.as_secs_f64());
    f.target(n, "cold: ours / tools' total", ratio, "×", "≤ 1.5 ×", ratio <= 1.5);
    let ratio = round2(measured.cold.as_secs_f64() / without_addrs.as_secs_f64());
    f.add(n, "cold: ours / tools' total without ip -batch (addresses)", ratio, "×");
    Ok(measured.p99)
}

/// What [`Ours::run`] hands back.
struct Measured {
    cold: Duration,
    p99: Duration,
    hwm_kb: f64,
    /// The kernel state right after the cold sync (with `verify`).
    state: Option<KernelState>,
}

/// Our daemon's part of one size.
struct Ours {
    n: usize,
    events: Vec<SourceEvent>,
    batches: Vec<Vec<SourceEvent>>,
    verify: bool,
    random_fully: bool,
}

impl Ours {
    async fn run(self, f: &mut Figures<'_>) -> anyhow::Result<Measured> {
        let Ours { n, events, batches, verify, random_fully } = self;
        let d = start_daemon(random_fully).await?;
        let idle_empty = busy_percent(Duration::from_secs(3)).await;
        let c0 = d.handles.counters();
        let t = Instant::now();
        let rec = d.send_and_wait(events, Duration::from_secs(3600)).await?;
        let cold = t.elapsed();
        let c = d.handles.counters().since(c0);
        eprintln!("kpr-bench ipvs: N={n}: cold sync {:.1}s, {} failed ops", cold.as_secs_f64(), rec.failed);
        f.add(n, "cold full sync, events sent → every actor acked", ms(cold), "ms");
        f.add(n, "cold: coordinator's sync (sync start → every actor acked)", round2(rec.duration_ms), "ms");
        f.add(n, "cold: kernel ops planned", rec.ops as f64, "ops");
        f.add(n, "cold: failed ops", rec.failed as f64, "ops");
        // The warm-up loads the kernel modules: its ops may fail while they
        // load (ipset's bitmap:port when 17 sets are created at once).
        ensure!(
            f.quiet || (rec.failed == 0 && rec.full),
            "the cold sync failed {} ops (full: {})",
            rec.failed,
            rec.full
        );
        cold_actor_figures(n, &d.stats(), f);
        f.add(n, "cold: IPVS netlink messages", c.ipvs_messages as f64, "msgs");
        f.add(n, "cold: IPVS netlink datagrams", c.ipvs_datagrams as f64, "datagrams");
        f.add(n, "cold: ipset add/del netlink messages", c.ipset_ops as f64, "msgs");
        f.add(n, "cold: kube-ipvs0 rtnetlink requests", c.link_requests as f64, "requests");
        f.add(n, "cold: iptables-restore lines", c.iptables_lines as f64, "lines");
        let state = if verify { Some(KernelState::read()?) } else { None };
        let idle_full = busy_percent(Duration::from_secs(5)).await;
        f.add(n, "guest CPU busy, daemon idle, before the cold sync", idle_empty, "% of a vCPU");
        f.add(
            n,
            "guest CPU busy, daemon idle, holding the cold state (IPVS estimators, timers)",
            idle_full,
            "% of a vCPU",
        );

        let totals0 = d.apply_totals();
        let mut times = Vec::with_capacity(batches.len());
        let mut sync_times = Vec::with_capacity(batches.len());
        let mut per_change: Vec<(Duration, Counters)> = Vec::with_capacity(batches.len());
        let (mut partial, mut failed) = (0, 0);
        let started = Instant::now();
        for evs in batches {
            let c0 = d.handles.counters();
            let t = Instant::now();
            let rec = d.send_and_wait(evs, Duration::from_secs(120)).await?;
            let took = t.elapsed();
            times.push(took);
            per_change.push((took, d.handles.counters().since(c0)));
            sync_times.push(Duration::from_secs_f64(rec.duration_ms / 1000.0));
            partial += usize::from(!rec.full);
            failed += rec.failed;
        }
        eprintln!("kpr-bench ipvs: N={n}: {} changes in {:.1}s", times.len(), started.elapsed().as_secs_f64());
        let hwm_kb = status_kb("VmHWM:").unwrap_or(0.0);
        let p99 = quantile(&times, 0.99);
        f.add(n, "endpoint changes timed", times.len() as f64, "changes");
        f.add(n, "endpoint change → every actor acked: p50", ms(quantile(&times, 0.5)), "ms");
        f.add(n, "endpoint change → every actor acked: p99", ms(p99), "ms");
        f.add(n, "endpoint change → every actor acked: max", ms(quantile(&times, 1.0)), "ms");
        let (s50, s99) = (quantile(&sync_times, 0.5), quantile(&sync_times, 0.99));
        f.add(n, "endpoint change: sync start → every actor acked: p50", ms(s50), "ms");
        f.add(n, "endpoint change: sync start → every actor acked: p99", ms(s99), "ms");
        f.add(n, "endpoint change: incremental syncs", partial as f64, "syncs");
        f.add(n, "endpoint change: failed ops", failed as f64, "ops");
        change_op_figures(n, &per_change, f);
        class_figures(n, "", &per_change, f);
        change_actor_figures(n, &totals0, &d.apply_totals(), f);
        Ok(Measured { cold, p99, hwm_kb, state })
    }
}

/// What an endpoint change had to do besides IPVS netlink messages: start
/// an `iptables-restore` process, send ipset messages (a local endpoint:
/// KUBE-LOOP-BACK; in-process since the netlink client, a process before),
/// reconcile conntrack (a UDP endpoint changed), or none of these.
fn change_class(c: &Counters) -> &'static str {
    if c.iptables_lines > 0 {
        "with an iptables-restore process"
    } else if c.ipset_ops > 0 {
        "with ipset messages"
    } else if c.conntrack_messages > 0 {
        "with a conntrack reconcile"
    } else {
        "IPVS messages only"
    }
}

/// Latency per class of change ([`change_class`]): the p99 over all changes
/// is set by the few slow ones.
fn class_figures(n: usize, prefix: &str, per_change: &[(Duration, Counters)], f: &mut Figures) {
    let mut by_class: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for (t, c) in per_change {
        by_class.entry(change_class(c)).or_default().push(*t);
    }
    for (class, times) in by_class {
        let (count, p50, p99) = (times.len(), quantile(&times, 0.5), quantile(&times, 0.99));
        f.add(n, &format!("{prefix}endpoint changes {class}: count"), count as f64, "changes");
        f.add(n, &format!("{prefix}endpoint changes {class}: p50"), ms(p50), "ms");
        f.add(n, &format!("{prefix}endpoint changes {class}: p99"), ms(p99), "ms");
    }
}

fn cold_actor_figures(n: usize, stats: &BTreeMap<String, StatsSnapshot>, f: &mut Figures) {
    // One batch each so far: p50 is that batch's apply time.
    let took = |name: &str| stats.get(name).map_or(0.0, |s| s.p50_ms);
    for name in ["ipvs", "dummy-link", "iptables"] {
        f.add(n, &format!("cold: {name} actor apply (reconcile)"), round2(took(name)), "ms");
    }
    let sets: Vec<f64> = stats.values().filter(|s| s.name.starts_with("ipset/")).map(|s| s.p50_ms).collect();
    f.add(n, "cold: slowest ipset actor apply", round2(sets.iter().copied().fold(0.0, f64::max)), "ms");
    f.add(n, "cold: ipset actors' apply, summed over the 17", round2(sets.iter().sum()), "ms");
}

fn change_op_figures(n: usize, per_change: &[(Duration, Counters)], f: &mut Figures) {
    let count = per_change.len().max(1) as f64;
    for i in 0..5 {
        let values: Vec<u64> = per_change.iter().map(|c| c.1.named()[i].1).collect();
        let (name, _, unit) = Counters::default().named()[i];
        let mean = values.iter().sum::<u64>() as f64 / count;
        let max = values.iter().copied().max().unwrap_or(0);
        f.add(n, &format!("endpoint change: {name}, mean"), round2(mean), unit);
        f.add(n, &format!("endpoint change: {name}, max"), max as f64, unit);
    }
}

fn change_actor_figures(
    n: usize,
    before: &BTreeMap<String, (u64, f64)>,
    after: &BTreeMap<String, (u64, f64)>,
    f: &mut Figures,
) {
    let mut sets = (0, 0.0);
    for (name, (count, sum)) in after {
        let (c0, s0) = before.get(name).copied().unwrap_or_default();
        let (batches, secs) = (count - c0, sum - s0);
        if name.starts_with("ipset/") {
            sets = (sets.0 + batches, sets.1 + secs);
            continue;
        }
        if batches > 0 {
            let mean = secs * 1000.0 / batches as f64;
            f.add(n, &format!("endpoint change: {name} actor, {batches} batches, mean apply"), round2(mean), "ms");
        }
    }
    if sets.0 > 0 {
        let mean = sets.1 * 1000.0 / sets.0 as f64;
        f.add(n, &format!("endpoint change: ipset actors, {} batches, mean apply", sets.0), round2(mean), "ms");
    }
}

// ------------------------------------------------------------------ tools --

/// The tools' input files for one size.
struct ToolFiles {
    ipvs: PathBuf,
    ipset: PathBuf,
    ip: PathBuf,
    iptables: PathBuf,
    lines: BTreeMap<PathBuf, usize>,
}

impl ToolFiles {
    fn lines(&self, file: &Path) -> usize {
        self.lines.get(file).copied().unwrap_or(0)
    }
}

/// Plans the cluster's cold state as the coordinator's first sync does:
/// the desired state, the iptables rules, and how long planning took
/// (generating the events not included).
fn plan_cold(spec: ClusterSpec, random_fully: bool) -> anyhow::Result<(IpvsDesired, String, Duration)> {
    let events = Cluster::new(spec)?.initial_events();
    let t = Instant::now();
    let mut model = Model::new(FAMILY, THIS_NODE);
    for ev in &events {
        model.record(ev)?;
    }
    let changes = model.apply();
    let mut planner = IpvsPlanner::new(plan_context(&plan_settings(), model.node(), &local_addrs()));
    planner.update(&model, &changes.ports);
    let desired = planner.desired();
    let rules = planner.rules(&rules_config(random_fully));
    let took = t.elapsed();
    Ok((desired, rules, took))
}

/// The cold state through each real handle alone, one after the other, as
/// its actor applies a full batch (`reconcile`): where our cold time goes,
/// without the actors running concurrently on one thread.
fn handles_one_at_a_time(n: usize, desired: &IpvsDesired, rules: &str, f: &mut Figures) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let ipvs = NetlinkIpvs::connect().await.map_err(not_available)?;
        let graceful = GracefulIpvs::new(ipvs.clone(), Ownership { family: FAMILY, exclude: Vec::new() });
        let t = Instant::now();
        let (ops, results) = graceful.reconcile(desired.ipvs.clone()).await?;
        let took = t.elapsed();
        ensure!(results.iter().all(Result::is_ok), "IPVS handle alone: failed ops");
        let what = format!("handle alone: IPVS, {} ops in {} datagrams", ops.len(), ipvs.datagrams_sent());
        f.add(n, &what, ms(took), "ms");

        let mut sets = Duration::ZERO;
        let mut slowest = (Duration::ZERO, String::new());
        let ipset = NetlinkIpset::new().context("ipset netlink")?;
        for set in IpvsSet::ALL {
            let handle = IpsetHandle::new(&ipset, set.spec(FAMILY));
            let adds: Vec<IpsetOp> = desired.sets.get(&set).into_iter().flatten().map(|e| IpsetOp::Add(*e)).collect();
            let t = Instant::now();
            let (_, results) = handle.reconcile(adds).await?;
            let took = t.elapsed();
            ensure!(results.iter().all(Result::is_ok), "ipset handle alone {}: failed ops", set.name(FAMILY));
            sets += took;
            if took > slowest.0 {
                slowest = (took, set.name(FAMILY));
            }
        }
        f.add(n, "handle alone: the 17 ipset handles, one after the other", ms(sets), "ms");
        f.add(n, &format!("handle alone: slowest ipset handle ({})", slowest.1), ms(slowest.0), "ms");

        let link = DummyLink::new().context("rtnetlink")?.with_family(FAMILY);
        let binds: Vec<LinkOp> = desired.addresses.iter().map(|a| LinkOp::Bind(*a)).collect();
        let t = Instant::now();
        let (_, results) = link.reconcile(binds).await?;
        let took = t.elapsed();
        ensure!(results.iter().all(Result::is_ok), "link handle alone: failed ops");
        f.add(n, &format!("handle alone: kube-ipvs0, {} requests", link.requests()), ms(took), "ms");

        let iptables = IptablesHandle::new(FAMILY);
        let t = Instant::now();
        let (_, results) = iptables.reconcile(vec![IptablesOp::Restore(RestoreInput::new(rules.to_string()))]).await?;
        let took = t.elapsed();
        ensure!(results.iter().all(Result::is_ok), "iptables handle alone: failed");
        f.add(n, "handle alone: iptables (2 iptables-save, 1 iptables-restore)", ms(took), "ms");
        anyhow::Ok(())
    })
}

/// Writes the cold state in each tool's input syntax.
fn write_tool_files(desired: &IpvsDesired, rules: &str, dir: &Path) -> anyhow::Result<ToolFiles> {
    let texts = [
        ("ipvs.rules", ipvsadm_restore(desired)),
        ("ipset.restore", ipset_restore(desired)),
        ("ip.batch", ip_batch(desired)),
        ("iptables.restore", iptables_restore(rules)),
    ];
    let mut lines = BTreeMap::new();
    let mut paths = Vec::new();
    for (name, text) in texts {
        let path = dir.join(name);
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
        lines.insert(path.clone(), text.lines().count());
        paths.push(path);
    }
    let [ipvs, ipset, ip, iptables]: [PathBuf; 4] = paths.try_into().map_err(|_| anyhow::anyhow!("four files"))?;
    Ok(ToolFiles { ipvs, ipset, ip, iptables, lines })
}

/// `ipvsadm -R` input: the `--dry-run` section, `-A` lines before `-a` lines.
pub fn ipvsadm_restore(desired: &IpvsDesired) -> String {
    render::ipvs_lines(desired).into_iter().map(|l| l + "\n").collect()
}

/// `ipset restore` input: the `--dry-run` section, each set's create line before its members.
pub fn ipset_restore(desired: &IpvsDesired) -> String {
    render::ipset_lines(desired, FAMILY).into_iter().map(|l| l + "\n").collect()
}

/// `ip -batch` input: the dummy link, then one `addr add` per service address.
pub fn ip_batch(desired: &IpvsDesired) -> String {
    let mut out = format!("link add {DUMMY_LINK} type dummy\n");
    for a in &desired.addresses {
        let prefix = if a.is_ipv4() { 32 } else { 128 };
        let _ = writeln!(out, "addr add {a}/{prefix} dev {DUMMY_LINK}");
    }
    out
}

/// `iptables-restore --noflush` input: what the iptables handle restores on
/// a fresh node (the rendered rules plus the jumps from the built-in chains).
pub fn iptables_restore(rules: &str) -> String {
    restore_input_on_empty_kernel(&rules_ipvs::PROFILE, rules)
}

/// Runs `tool args < file`; its time, or why it failed.
fn run_tool(tool: &str, args: &[&str], file: &Path) -> anyhow::Result<Duration> {
    let input = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let t = Instant::now();
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::from(input))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {tool}"))?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!("{tool} {} < {} failed ({}): {}", args.join(" "), file.display(), out.status, stderr_tail(&out.stderr));
    }
    Ok(took)
}

fn stderr_tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("; ")
}

// ------------------------------------------------------------ kernel state --

/// A sorted list of lines, as a count and a hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Digest {
    lines: usize,
    hash: u64,
}

fn digest(mut lines: Vec<String>) -> Digest {
    lines.sort();
    let mut h = DefaultHasher::new();
    lines.hash(&mut h);
    Digest { lines: lines.len(), hash: h.finish() }
}

/// What IPVS mode programmed, read back with the tools (normalised: sorted;
/// no counters; ipset create lines without their random initval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KernelState {
    ipvs: Digest,
    ipset: Digest,
    addresses: Digest,
    iptables: Digest,
}

fn stdout_of(tool: &str, args: &[&str]) -> anyhow::Result<(bool, String)> {
    let out = Command::new(tool).args(args).stdin(Stdio::null()).output().with_context(|| format!("running {tool}"))?;
    Ok((out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned()))
}

impl KernelState {
    fn read() -> anyhow::Result<KernelState> {
        let (ok, text) = stdout_of("ipvsadm", &["-S", "-n"])?;
        ensure!(ok, "ipvsadm -S -n failed");
        let ipvs = digest(text.lines().filter(|l| !l.is_empty()).map(str::to_string).collect());
        let (ok, text) = stdout_of("ipset", &["save"])?;
        ensure!(ok, "ipset save failed");
        let ipset = digest(
            text.lines()
                .filter(|l| l.split_whitespace().nth(1).is_some_and(|s| s.starts_with("KUBE-")))
                .map(|l| {
                    if l.starts_with("create ") {
                        l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
                    } else {
                        l.to_string()
                    }
                })
                .collect(),
        );
        // No link: no addresses.
        let (_, text) = stdout_of("ip", &["-o", "addr", "show", "dev", DUMMY_LINK])?;
        let addresses = digest(text.lines().filter_map(|l| l.split_whitespace().nth(3)).map(str::to_string).collect());
        let (ok, text) = stdout_of("iptables-save", &[])?;
        ensure!(ok, "iptables-save failed");
        let mut table = String::new();
        let mut lines = Vec::new();
        for l in text.lines() {
            if let Some(t) = l.strip_prefix('*') {
                table = t.to_string();
            } else if let Some(c) = l.strip_prefix(':') {
                lines.push(format!("{table} :{}", c.split_whitespace().next().unwrap_or("")));
            } else if l.starts_with("-A") {
                lines.push(format!("{table} {l}"));
            }
        }
        let iptables = digest(lines);
        Ok(KernelState { ipvs, ipset, addresses, iptables })
    }

    fn compare(&self, other: &KernelState) -> [(&'static str, Digest, Digest); 4] {
        [
            ("ipvsadm -S -n", self.ipvs, other.ipvs),
            ("ipset save (our sets)", self.ipset, other.ipset),
            ("kube-ipvs0 addresses", self.addresses, other.addresses),
            ("iptables-save (rules and chains)", self.iptables, other.iptables),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::gen::generate;

    fn planned(services: usize) -> (IpvsDesired, String) {
        let events = generate(ClusterSpec { services, endpoints_per_service: 3, nodes: 5, seed: 7 }).unwrap();
        let mut model = Model::new(FAMILY, THIS_NODE);
        for ev in &events {
            model.record(ev).unwrap();
        }
        let changes = model.apply();
        let mut planner = IpvsPlanner::new(plan_context(&plan_settings(), model.node(), &local_addrs()));
        planner.update(&model, &changes.ports);
        (planner.desired(), planner.rules(&rules_config(true)))
    }

    #[test]
    fn tool_files_hold_the_whole_cold_state_in_each_tools_syntax() {
        let (desired, rules) = planned(40);
        let ipvs = ipvsadm_restore(&desired);
        assert_eq!(ipvs.lines().count(), desired.ipvs.len());
        let first_dest = ipvs.lines().position(|l| l.starts_with("-a ")).unwrap();
        assert!(ipvs.lines().take(first_dest).all(|l| l.starts_with("-A ")), "services before destinations");
        assert!(ipvs.lines().all(|l| l.starts_with("-A -") || l.ends_with(" -m -w 1")), "{ipvs}");

        let ipset = ipset_restore(&desired);
        assert_eq!(ipset.lines().filter(|l| l.starts_with("create KUBE-")).count(), 17);
        let members: usize = desired.sets.values().map(Vec::len).sum();
        assert_eq!(ipset.lines().filter(|l| l.starts_with("add KUBE-")).count(), members);

        let ip = ip_batch(&desired);
        assert_eq!(ip.lines().next(), Some("link add kube-ipvs0 type dummy"));
        assert_eq!(ip.lines().filter(|l| l.starts_with("addr add ") && l.ends_with("/32 dev kube-ipvs0")).count(), {
            desired.addresses.len()
        });

        let ipt = iptables_restore(&rules);
        assert_eq!(ipt.lines().count(), rules.lines().count() + rules_ipvs::JUMPS.len());
        for j in rules_ipvs::JUMPS {
            let lines: Vec<&str> = ipt.lines().collect();
            let at = lines.iter().position(|l| *l == j.insert_line()).unwrap();
            let table = lines[..at].iter().rev().find_map(|l| l.strip_prefix('*'));
            assert_eq!(table, Some(j.table), "{} sits in its table's section:\n{ipt}", j.insert_line());
            let commit = lines[at..].iter().position(|l| *l == "COMMIT");
            let next_table = lines[at..].iter().position(|l| l.starts_with('*')).unwrap_or(usize::MAX);
            assert!(commit.is_some_and(|c| c < next_table), "{} comes before its COMMIT", j.insert_line());
        }
    }

    #[test]
    fn digests_ignore_order_only() {
        let a = digest(vec!["b".into(), "a".into()]);
        assert_eq!(a, digest(vec!["a".into(), "b".into()]));
        assert_ne!(a, digest(vec!["a".into(), "c".into()]));
        assert_eq!(a.lines, 2);
    }

    #[test]
    fn counters_subtract() {
        let a = Counters { ipvs_messages: 10, ipset_ops: 3, ..Counters::default() };
        let b = Counters { ipvs_messages: 12, ipset_ops: 3, conntrack_messages: 2, ..Counters::default() };
        let d = b.since(a);
        assert_eq!(d.named().map(|x| x.1), [2, 0, 0, 0, 2]);
    }
}
