//! IPVS mode end to end on a real kernel: `kpr-bench ipvs`, meant
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
use crate::plan::ipvs::context::plan_context;
use crate::plan::ipvs::rules as ipvs_rules;
use crate::plan::ipvs::{render, IpvsDesired, IpvsPlanner, IpvsSet};
use crate::stats::{StatsRegistry, StatsSnapshot};

mod netns;
mod tools;

use self::netns::*;
use self::tools::*;

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

#[cfg(test)]
mod tests;
