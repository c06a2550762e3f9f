//! `kpr-bench iptables`: iptables mode on the real kernel, in a network
//! namespace of its own on the host.
//!
//! Each run starts a thread that unshares a fresh network namespace (the
//! kernel deletes it when the thread and the processes it started are gone,
//! also after an error, a panic or a kill), and runs there an actix system
//! with iptables mode's actors and coordinator wired as the daemon wires
//! them (`runtime::start_iptables`: the real [`IptablesHandle`] for
//! iptables mode, [`NetlinkConntrack`], the daemon's context builder and
//! host probes, its sync hooks). The `iptables-restore` processes the
//! handle starts inherit the thread's namespace; the host's tables are
//! never touched.
//!
//! Two thin wrappers observe without changing what runs: [`Probed`] wraps
//! the coordinator's dataplane (planning time, time to the acks, a signal
//! when a sync finished) and [`Recording`] wraps the iptables handle (the
//! exact restore text, and how long the handle took).
//!
//! Measured, per cluster size:
//! - the cold full sync: all events (Synced markers included) sent → the
//!   sync acked, with minSyncPeriod 0 and syncPeriod 1h;
//! - single endpoint changes, one at a time, each waited for: event → acked,
//!   iptables-restore lines per change (total, and the per-service part),
//!   and `iptables-restore` alone on the same text in the same state (run
//!   again right after the ack: the input is idempotent);
//! - the cold text restored by the tool alone in a fresh namespace;
//! - CPU (ours, and the tools we started) during a steady churn.

use std::future::Future;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::{bail, ensure, Context as _};
use futures::FutureExt;
use tokio::sync::watch;

use crate::actors::coordinator::{Coordinator, Dataplane, Finished, IptablesDataplane, Planned};
use crate::actors::wiring::start_iptables_actors;
use crate::bench::gen::{node_ip, Cluster, ClusterSpec, THIS_NODE};
use crate::bench::stats::quantile;
use crate::config::KubeProxyConfiguration;
use crate::health::{self, ProxyHealth};
use crate::kernel::conntrack::NetlinkConntrack;
use crate::kernel::iptables::{IptablesBinaries, IptablesHandle};
use crate::kernel::{Applied, IptablesKernel, KResult, Subsystem};
use crate::metrics::ProxyMetrics;
use crate::model::{Model, ModelChanges};
use crate::msgs::{IptablesOp, SourceBatch, SourceEvent};
use crate::mutex::lock;
use crate::net::IpFamily;
use crate::observe::SyncHooks;
use crate::plan::iptables::{self as iptables_plan, is_service_chain, ServiceChains};
use crate::proxier::{addr_source, coordinator_settings, host_features, Mode};
use crate::schedule::SyncKind;
use crate::settings;
use crate::stats::StatsRegistry;

mod observed;

pub use self::observed::{Captured, Probed, Recording, SyncSignal};

/// Which iptables tools the handle runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// `iptables-restore` etc. as found on `PATH` (what the daemon runs).
    Path,
    /// `iptables-legacy-restore` etc.
    Legacy,
    /// `iptables-nft-restore` etc.
    Nft,
}

impl Flavour {
    pub fn binaries(self) -> IptablesBinaries {
        match self {
            Flavour::Path => IptablesBinaries::for_family(IpFamily::V4),
            Flavour::Legacy => IptablesBinaries::variant(IpFamily::V4, "legacy"),
            Flavour::Nft => IptablesBinaries::variant(IpFamily::V4, "nft"),
        }
    }
}

/// The steady churn whose CPU cost is measured.
#[derive(Debug, Clone)]
pub struct ChurnOptions {
    pub services: usize,
    /// Changes per second.
    pub rate: u32,
    pub seconds: u64,
    /// minSyncPeriod and syncPeriod of the daemon during the churn.
    pub min_sync: Duration,
    pub sync_period: Duration,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    pub nodes: usize,
    pub endpoints: usize,
    /// Cluster sizes for the cold sync and the single changes (empty: none).
    pub services: Vec<usize>,
    /// Single endpoint changes per size.
    pub changes: usize,
    /// Fresh namespaces the cold text is restored in by the tool alone.
    pub cold_tool_runs: usize,
    pub flavour: Flavour,
    /// Where to save the restore inputs (cold, and the first changes'), for
    /// running the tool on them by hand.
    pub save_dir: Option<std::path::PathBuf>,
    pub churn: Option<ChurnOptions>,
}

/// One measured figure; `limit` is the target (met when below).
#[derive(Debug, Clone)]
pub struct Figure {
    pub bench: &'static str,
    pub services: usize,
    pub metric: String,
    pub value: f64,
    pub unit: &'static str,
    pub limit: Option<f64>,
}

/// Collects figures; the caller prints them (also those of a run that failed later).
pub struct Figures<'a> {
    out: &'a mut Vec<Figure>,
    bench: &'static str,
    services: usize,
}

impl Figures<'_> {
    fn add(&mut self, metric: &str, value: f64, unit: &'static str) {
        let (bench, services) = (self.bench, self.services);
        self.out.push(Figure { bench, services, metric: metric.into(), value: round3(value), unit, limit: None });
    }

    fn target(&mut self, metric: &str, value: f64, unit: &'static str, limit: f64) {
        let (bench, services) = (self.bench, self.services);
        let value = round3(value);
        self.out.push(Figure { bench, services, metric: metric.into(), value, unit, limit: Some(limit) });
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Runs every measurement `opts` asks for, appending figures to `out`.
pub fn run(opts: &Options, out: &mut Vec<Figure>) -> anyhow::Result<()> {
    check_tools(opts.flavour)?;
    for &n in &opts.services {
        bench_size(opts, n, out)?;
    }
    if let Some(churn) = &opts.churn {
        bench_churn(opts, churn, out)?;
    }
    Ok(())
}

fn spec(opts: &Options, services: usize) -> ClusterSpec {
    ClusterSpec { services, endpoints_per_service: opts.endpoints, nodes: opts.nodes, seed: opts.seed }
}

/// The tools exist (creating the namespace needs root: unshare says so).
fn check_tools(flavour: Flavour) -> anyhow::Result<()> {
    let bins = flavour.binaries();
    let out = Command::new(&bins.restore).arg("--version").output().with_context(|| bins.restore.clone())?;
    ensure!(out.status.success(), "{} --version failed", bins.restore);
    Ok(())
}

// ---------------------------------------------------------------------------
// The namespace.

/// Runs `f` on a new thread in a new network namespace: `lo` up and an
/// `eth0` with node-0's address (the node's InternalIP, as a real node has).
/// The namespace has no name; it goes away with the thread (and whatever it
/// started), whatever `f` does.
pub(crate) fn in_new_netns<T: Send>(f: impl FnOnce() -> anyhow::Result<T> + Send) -> anyhow::Result<T> {
    std::thread::scope(|s| {
        let inner = s.spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET); needs root")?;
            let ip = format!("{}/16", node_ip(0));
            for args in [
                &["link", "set", "lo", "up"][..],
                // A veth pair with both ends inside (this host's kernel has no dummy driver).
                &["link", "add", "eth0", "type", "veth", "peer", "name", "eth0-peer"],
                &["addr", "add", &ip, "dev", "eth0"],
                &["link", "set", "eth0", "up"],
            ] {
                let out = Command::new("ip").args(args).output().context("running ip")?;
                ensure!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            f()
        });
        inner.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// [`in_new_netns`] with an actix system on that thread.
fn system_in_new_netns<T: Send, F: std::future::Future<Output = anyhow::Result<T>>>(
    f: impl FnOnce() -> F + Send,
) -> anyhow::Result<T> {
    in_new_netns(|| actix_rt::System::new().block_on(f()))
}

/// `iptables-restore -w 5 -W 100000 --noflush --counters` (the handle's
/// command) with `text` on stdin, from this thread's namespace; its wall time.
fn time_tool_restore(restore: &str, text: &str) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let mut child = Command::new(restore)
        .args(["-w", "5", "-W", "100000", "--noflush", "--counters"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {restore}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes()).with_context(|| format!("writing to {restore}"))?;
    }
    let out = child.wait_with_output()?;
    let took = t.elapsed();
    ensure!(out.status.success(), "{restore} alone failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(took)
}

/// CPU time of this process and of its waited-for children (the tools),
/// from /proc/self/stat: (utime + stime, cutime + cstime).
fn cpu_times() -> (Duration, Duration) {
    let read = || -> Option<(u64, u64)> {
        let text = std::fs::read_to_string("/proc/self/stat").ok()?;
        let rest = &text[text.rfind(')')? + 2..];
        let f: Vec<u64> = rest.split_whitespace().skip(11).take(4).filter_map(|x| x.parse().ok()).collect();
        (f.len() == 4).then(|| (f[0] + f[1], f[2] + f[3]))
    };
    let tick = 1000 / clock_ticks();
    let (own, children) = read().unwrap_or((0, 0));
    (Duration::from_millis(own * tick), Duration::from_millis(children * tick))
}

/// USER_HZ.
fn clock_ticks() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as u64,
        _ => 100,
    }
}

/// iptables mode's actors and coordinator, as the daemon starts them.
struct Daemon {
    coord: Addr<Coordinator<Probed<IptablesDataplane>>>,
    /// A clone of the actor's handle (shares its line counter).
    handle: IptablesHandle,
    recording: Recording,
    done: watch::Receiver<SyncSignal>,
}

/// As `runtime::start_iptables` (with `--cluster-cidr 10.0.0.0/8`, the
/// generator's pod range; otherwise upstream's defaults), in this thread's
/// namespace.
async fn start_daemon(flavour: Flavour, min_sync: Duration, sync_period: Duration) -> anyhow::Result<Daemon> {
    let family = IpFamily::V4;
    let mut cfg = KubeProxyConfiguration::with_defaults();
    cfg.mode = "iptables".into();
    cfg.cluster_cidr = "10.0.0.0/8".into();
    cfg.iptables.min_sync_period = min_sync.into();
    cfg.iptables.sync_period = sync_period.into();
    let handle = IptablesHandle::with_binaries(flavour.binaries()).for_mode(&iptables_plan::PROFILE);
    let kernel_chains: Vec<String> = handle.chains("nat").await?.into_iter().collect();
    let conntrack = NetlinkConntrack::new().map_err(|e| anyhow::anyhow!("conntrack: {e}"))?;
    let recording =
        Recording { inner: handle.clone(), capture: Arc::default(), log: Arc::default(), canary: Arc::default() };
    let registry = StatsRegistry::default();
    let derived = settings::derive(&cfg, family, THIS_NODE, host_features(family, Default::default()).await);
    let context = IptablesDataplane::config(&derived);
    let settings = coordinator_settings(&derived);
    // The daemon's hooks (metrics, health), without the HTTP servers.
    let metrics = Arc::new(ProxyMetrics::new(cfg.proxy_mode(), registry.clone()));
    let proxy_health = Arc::new(ProxyHealth::new(health::health_timeout(&cfg)).with_metrics(metrics.clone()));
    let hooks = SyncHooks::new(family, metrics, proxy_health, registry.clone());
    let (tx, done) = watch::channel(SyncSignal::default());
    let actors = recording.clone();
    let registry_ref = &registry;
    let coord = Coordinator::create(move |ctx| {
        let targets = start_iptables_actors(actors, conntrack, registry_ref, ctx.address().recipient());
        let dataplane = IptablesDataplane::new(targets, addr_source(), context, &kernel_chains);
        let probed = Probed { inner: dataplane, done: tx, totals: SyncSignal::default() };
        Coordinator::with_dataplane(settings, probed).with_observer(hooks)
    });
    Ok(Daemon { coord, handle, recording, done })
}

impl Daemon {
    /// Sends `events` and waits for a sync that started after they were
    /// sent to finish; returns the time from the send to the acks.
    async fn send_and_wait(&mut self, events: Vec<SourceEvent>, timeout: Duration) -> anyhow::Result<SyncSignal> {
        self.done.borrow_and_update();
        let sent = Instant::now();
        self.coord.send(SourceBatch(events)).await?;
        self.wait_sync_after(sent, timeout).await
    }

    /// Waits for a sync that started at or after `after` to finish.
    async fn wait_sync_after(&mut self, after: Instant, timeout: Duration) -> anyhow::Result<SyncSignal> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            {
                let sig = self.done.borrow_and_update();
                if sig.started.is_some_and(|s| s >= after) {
                    return Ok(sig.clone());
                }
            }
            match tokio::time::timeout_at(deadline, self.done.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => bail!("the coordinator is gone"),
                Err(_) => bail!("no sync within {timeout:?}"),
            }
        }
    }
}

/// Saves the input of a failed restore for a look (its path goes to stderr).
fn keep_failed_input(caps: &[Captured]) {
    if let Some(c) = caps.iter().find(|c| c.error.is_some()) {
        let path = std::env::temp_dir().join(format!("kpr-bench-iptables-failed-{}.txt", std::process::id()));
        match std::fs::write(&path, &c.text) {
            Ok(()) => eprintln!("kpr-bench: the failed restore input is in {}", path.display()),
            Err(e) => eprintln!("kpr-bench: cannot save the failed restore input: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Lines of a restore input.

/// A restore input's lines: those of per-service chains (declarations,
/// rules, deletions of KUBE-SVC/SVL/EXT/FW/SEP chains) and the rest (the
/// top-level chains, `*table`, `COMMIT`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Lines {
    total: usize,
    service: usize,
}

fn chain_of(line: &str) -> Option<&str> {
    let rest =
        line.strip_prefix(':').or_else(|| ["-A ", "-X ", "-I ", "-F "].iter().find_map(|p| line.strip_prefix(p)))?;
    rest.split_whitespace().next()
}

fn count_lines(text: &str) -> Lines {
    let mut l = Lines::default();
    for line in text.lines() {
        l.total += 1;
        l.service += usize::from(chain_of(line).is_some_and(is_service_chain));
    }
    l
}

/// Service-level chains (not SEP) declared by `text` but not named in `expected`.
fn foreign_chains(text: &str, expected: &[String]) -> usize {
    text.lines()
        .filter_map(|l| l.strip_prefix(':').and_then(|d| d.split_whitespace().next()))
        .filter(|c| is_service_chain(c) && !c.starts_with("KUBE-SEP-"))
        .filter(|c| !expected.iter().any(|e| e == c))
        .count()
}

// ---------------------------------------------------------------------------
// Cold sync and single changes.

/// What the cold sync and the single changes of one size measured.
struct SizeRun {
    cold: SyncSignal,
    cold_latency: Duration,
    cold_capture: Captured,
    cold_lines: u64,
    changes: Vec<ChangeRun>,
}

/// Inputs saved per size: the cold one and this many changes'.
const SAVED_CHANGES: usize = 5;

fn save_inputs(dir: &std::path::Path, n: usize, run: &SizeRun) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let texts = std::iter::once(("cold".to_string(), &run.cold_capture.text))
        .chain(run.changes.iter().take(SAVED_CHANGES).enumerate().map(|(i, c)| (format!("change-{i}"), &c.text)));
    for (name, text) in texts {
        let path = dir.join(format!("iptables-{n}-{name}.txt"));
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

struct ChangeRun {
    /// The restore input (kept for the first [`SAVED_CHANGES`] only).
    text: String,
    latency: Duration,
    /// Canary checks that ran while the change waited.
    canary: Duration,
    sig: SyncSignal,
    apply: Duration,
    copy: Duration,
    tool: Duration,
    lines_written: u64,
    lines: Lines,
    foreign: usize,
}

fn bench_size(opts: &Options, n: usize, out: &mut Vec<Figure>) -> anyhow::Result<()> {
    let mut cluster = Cluster::new(spec(opts, n))?;
    let events = cluster.initial_events();
    let batches: Vec<Vec<SourceEvent>> = (0..opts.changes).map(|_| cluster.next_endpoint_change().1).collect();
    drop(cluster);
    let flavour = opts.flavour;
    let restore = flavour.binaries().restore;
    let tool = restore.clone();
    let run = system_in_new_netns(move || async move {
        let mut d = start_daemon(flavour, Duration::ZERO, Duration::from_secs(3600)).await?;
        d.recording.capture.store(true, Ordering::Relaxed);
        let lines0 = d.handle.lines_written();
        let t = Instant::now();
        let cold = d.send_and_wait(events, Duration::from_secs(900)).await?;
        let cold_latency = cold.finished.map_or(t.elapsed(), |f| f - t);
        let mut caps = d.recording.take();
        let errors: Vec<String> = caps.iter().filter_map(|c| c.error.clone()).collect();
        if !errors.is_empty() {
            keep_failed_input(&caps);
        }
        ensure!(cold.full && cold.failed == 0, "cold sync: full {}, failed {}: {errors:?}", cold.full, cold.failed);
        let cold_lines = d.handle.lines_written() - lines0;
        ensure!(caps.len() == 1, "cold sync: {} restores", caps.len());
        let cold_capture = caps.remove(0);
        d.recording.take_canary();
        let mut changes = Vec::with_capacity(batches.len());
        for evs in batches {
            ensure!(!evs.is_empty(), "the generator made an empty change");
            let before = d.handle.lines_written();
            let t = Instant::now();
            let sig = d.send_and_wait(evs, Duration::from_secs(300)).await?;
            let latency = sig.finished.map_or(t.elapsed(), |f| f - t);
            let end = t + latency;
            let canary = d.recording.take_canary().iter().filter(|(s, _)| *s >= t && *s < end).map(|(_, d)| *d).sum();
            let lines_written = d.handle.lines_written() - before;
            let caps = d.recording.take();
            let errors: Vec<String> = caps.iter().filter_map(|c| c.error.clone()).collect();
            if !errors.is_empty() {
                keep_failed_input(&caps);
            }
            ensure!(!sig.full && sig.failed == 0, "change: full {}, failed {}: {errors:?}", sig.full, sig.failed);
            ensure!(caps.len() == 1 && caps[0].ok, "change: {} restores", caps.len());
            let c = &caps[0];
            // The tool alone, same text, same state (the change is in: applying it again is idempotent).
            let tool = time_tool_restore(&tool, &c.text)?;
            let (lines, foreign) = (count_lines(&c.text), foreign_chains(&c.text, &sig.expected_chains));
            let text = if changes.len() < SAVED_CHANGES { c.text.clone() } else { String::new() };
            changes.push(ChangeRun {
                text,
                latency,
                canary,
                apply: c.apply,
                copy: c.copy,
                tool,
                lines_written,
                lines,
                foreign,
                sig,
            });
        }
        Ok(SizeRun { cold, cold_latency, cold_capture, cold_lines, changes })
    })?;
    if let Some(dir) = &opts.save_dir {
        save_inputs(dir, n, &run)?;
    }
    let mut f = Figures { out, bench: "iptables", services: n };
    report_cold(&mut f, &run, opts.cold_tool_runs, &restore)?;
    report_changes(&mut f, n, &run.changes);
    Ok(())
}

fn report_cold(f: &mut Figures, run: &SizeRun, tool_runs: usize, restore: &str) -> anyhow::Result<()> {
    let c = &run.cold_capture;
    f.add("cold full sync, events sent → acked", ms(run.cold_latency), "ms");
    f.add("cold: planning (dataplane sync)", ms(run.cold.plan), "ms");
    f.add("cold: iptables actor + conntrack actor, send → acked", ms(run.cold.run), "ms");
    f.add("cold: handle apply (iptables --version, 2 × iptables-save, restore)", ms(c.apply), "ms");
    let other = run.cold_latency.saturating_sub(run.cold.plan + run.cold.run);
    f.add("cold: recording events, model apply, scheduling", ms(other), "ms");
    f.add("cold: restore lines written", run.cold_lines as f64, "lines");
    f.add("cold: restore input size", c.text.len() as f64 / 1e6, "MB");
    // The tool alone, each time in a namespace of its own.
    let mut tool = Vec::new();
    for _ in 0..tool_runs.max(1) {
        tool.push(in_new_netns(|| time_tool_restore(restore, &c.text))?);
    }
    let t = quantile(&tool, 0.5);
    f.add("cold: iptables-restore alone, same text, fresh namespace (median)", ms(t), "ms");
    f.add("cold: ours / tool alone", run.cold_latency.as_secs_f64() / t.as_secs_f64(), "×");
    Ok(())
}

fn report_changes(f: &mut Figures, n: usize, runs: &[ChangeRun]) {
    if runs.is_empty() {
        return;
    }
    let lat: Vec<Duration> = runs.iter().map(|r| r.latency).collect();
    let tool: Vec<Duration> = runs.iter().map(|r| r.tool).collect();
    f.add("endpoint changes (one at a time)", runs.len() as f64, "changes");
    f.add("endpoint change, event → acked: p50", ms(quantile(&lat, 0.5)), "ms");
    f.add("endpoint change, event → acked: p99", ms(quantile(&lat, 0.99)), "ms");
    f.add("endpoint change: iptables-restore alone, same text and state: p50", ms(quantile(&tool, 0.5)), "ms");
    f.add("endpoint change: iptables-restore alone: p99", ms(quantile(&tool, 0.99)), "ms");
    // A change that arrives while the iptables actor runs its canary check
    // (every 10 s) waits for it; the sync itself is the rest.
    let sync: Vec<Duration> = runs.iter().map(|r| r.latency.saturating_sub(r.canary)).collect();
    f.add("endpoint change, event → acked, less canary-check waits: p50", ms(quantile(&sync, 0.5)), "ms");
    f.add("endpoint change, event → acked, less canary-check waits: p99", ms(quantile(&sync, 0.99)), "ms");
    let ratios: Vec<f64> = sync.iter().zip(&tool).map(|(s, t)| s.as_secs_f64() / t.as_secs_f64()).collect();
    let metric = "endpoint change: ours (less canary waits) / tool alone, median of per-change ratios";
    if n >= 10_000 {
        f.target(metric, quantile(&ratios, 0.5), "×", 1.2);
    } else {
        f.add(metric, quantile(&ratios, 0.5), "×");
    }
    f.add("endpoint change: same, p99 of per-change ratios", quantile(&ratios, 0.99), "×");
    let raw: Vec<f64> = runs.iter().map(|r| r.latency.as_secs_f64() / r.tool.as_secs_f64()).collect();
    f.add("endpoint change: ours (with canary waits) / tool alone, median", quantile(&raw, 0.5), "×");
    f.add("endpoint change: ours (with canary waits) / tool alone, p99", quantile(&raw, 0.99), "×");
    // Where our time goes, medians over the changes.
    let med = |g: &dyn Fn(&ChangeRun) -> Duration| ms(quantile(&runs.iter().map(g).collect::<Vec<_>>(), 0.5));
    f.add("  breakdown p50: planning (dataplane sync)", med(&|r| r.sig.plan), "ms");
    f.add("  breakdown p50: handle apply (spawn + restore + wait)", med(&|r| r.apply), "ms");
    f.add("  breakdown p50: handle apply − tool alone", med(&|r| r.apply.saturating_sub(r.tool)), "ms");
    f.add(
        "  breakdown p50: actors' messaging (send → acked − handle − canary waits)",
        med(&|r| r.sig.run.saturating_sub(r.apply + r.canary)),
        "ms",
    );
    f.add(
        "  breakdown p50: record, model apply, schedule (rest)",
        med(&|r| r.latency.saturating_sub(r.sig.plan + r.sig.run)),
        "ms",
    );
    f.add("  breakdown p50: bench's text copy (inside handle apply)", med(&|r| r.copy), "ms");
    let delayed: Vec<Duration> = runs.iter().map(|r| r.canary).filter(|d| !d.is_zero()).collect();
    f.add(
        "changes that waited for the handle's canary check (3 × iptables -S, every 10 s)",
        delayed.len() as f64,
        "changes",
    );
    f.add("  canary check time in those changes: p50", ms(quantile(&delayed, 0.5)), "ms");
    let written: Vec<f64> = runs.iter().map(|r| r.lines_written as f64).collect();
    let total: Vec<f64> = runs.iter().map(|r| r.lines.total as f64).collect();
    let service: Vec<f64> = runs.iter().map(|r| r.lines.service as f64).collect();
    f.add("lines per change (lines_written delta): mean", mean(&written), "lines");
    f.add("lines per change: max", written.iter().copied().fold(0.0, f64::max), "lines");
    f.add("  of which per-service chains: mean", mean(&service), "lines");
    f.add("  of which per-service chains: max", service.iter().copied().fold(0.0, f64::max), "lines");
    let top: Vec<f64> = total.iter().zip(&service).map(|(t, s)| t - s).collect();
    f.add("  of which top-level chains + framing: mean", mean(&top), "lines");
    let foreign: usize = runs.iter().map(|r| r.foreign).sum();
    f.add("  service chains written not of the changed service", foreign as f64, "chains");
}

// ---------------------------------------------------------------------------
// CPU during a steady churn.

fn bench_churn(opts: &Options, c: &ChurnOptions, out: &mut Vec<Figure>) -> anyhow::Result<()> {
    let mut cluster = Cluster::new(spec(opts, c.services))?;
    let events = cluster.initial_events();
    let total = (u64::from(c.rate) * c.seconds) as usize;
    let changes: Vec<Vec<SourceEvent>> = (0..total).map(|_| cluster.next_change().1).collect();
    drop(cluster);
    let (flavour, rate, min_sync, sync_period) = (opts.flavour, c.rate.max(1), c.min_sync, c.sync_period);
    struct Churned {
        wall: Duration,
        own: Duration,
        children: Duration,
        syncs: u64,
        full: u64,
        plan: Duration,
        run: Duration,
        lines: u64,
        restores: usize,
        apply: Duration,
        canary_checks: usize,
        canary: Duration,
    }
    let r = system_in_new_netns(move || async move {
        let mut d = start_daemon(flavour, min_sync, sync_period).await?;
        d.send_and_wait(events, Duration::from_secs(900)).await?;
        d.recording.take();
        d.recording.take_canary();
        let (own0, children0) = cpu_times();
        let s0 = d.done.borrow().clone();
        let lines0 = d.handle.lines_written();
        let t0 = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = t0;
        for evs in changes {
            tick.tick().await;
            last = Instant::now();
            d.coord.send(SourceBatch(evs)).await?;
        }
        // Until the last change is in the kernel.
        let s1 = d.wait_sync_after(last, Duration::from_secs(300)).await?;
        let wall = t0.elapsed();
        let (own1, children1) = cpu_times();
        let caps = d.recording.take();
        let canary = d.recording.take_canary();
        Ok(Churned {
            canary_checks: canary.len(),
            canary: canary.iter().map(|(_, d)| *d).sum(),
            wall,
            own: own1.saturating_sub(own0),
            children: children1.saturating_sub(children0),
            syncs: s1.syncs - s0.syncs,
            full: s1.full_syncs - s0.full_syncs,
            plan: s1.plan_total - s0.plan_total,
            run: s1.run_total - s0.run_total,
            lines: d.handle.lines_written() - lines0,
            restores: caps.len(),
            apply: caps.iter().map(|c| c.apply).sum(),
        })
    })?;
    let mut f = Figures { out, bench: "iptables-churn", services: c.services };
    f.add("changes sent (generator's churn mix)", total as f64, "changes");
    f.add("rate", f64::from(c.rate), "changes/s");
    f.add("minSyncPeriod", ms(c.min_sync), "ms");
    f.add("syncPeriod", c.sync_period.as_secs_f64(), "s");
    f.add("wall time (until the last change was acked)", r.wall.as_secs_f64(), "s");
    f.add("syncs", r.syncs as f64, "syncs");
    f.add("  of which full (syncPeriod)", r.full as f64, "syncs");
    f.add("restores", r.restores as f64, "restores");
    f.add("restore lines written", r.lines as f64, "lines");
    f.add("planning time, total", ms(r.plan), "ms");
    f.add("iptables handle apply time, total (wall)", ms(r.apply), "ms");
    f.add("sync send → acked time, total (wall)", ms(r.run), "ms");
    f.add("canary checks (3 × iptables -S each)", r.canary_checks as f64, "checks");
    f.add("canary check time, total (wall)", ms(r.canary), "ms");
    let wall = r.wall.as_secs_f64();
    f.add("CPU of kube-proxy-rs itself (utime + stime)", ms(r.own), "ms");
    f.add("CPU of the tools it ran (iptables-restore/-save/iptables; cutime + cstime)", ms(r.children), "ms");
    f.add("CPU, % of one core, ours only", r.own.as_secs_f64() / wall * 100.0, "%");
    f.target("CPU, % of one core, children included", (r.own + r.children).as_secs_f64() / wall * 100.0, "%", 10.0);
    Ok(())
}

#[cfg(test)]
mod tests;
