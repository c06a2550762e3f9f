//! kpr-bench: how much a cluster of N services costs kube-proxy-rs, and how
//! much one change costs.
//!
//! ```sh
//! cargo run --release --bin kpr-bench -- plan      # model + planner, no actors
//! cargo run --release --bin kpr-bench -- actors    # end to end through the actors, in-memory kernels
//! cargo run --release --bin kpr-bench -- rss       # peak RSS after building and planning N = 10,000
//! cargo run --release --bin kpr-bench -- churn --seconds 60
//! cargo run --release --bin kpr-bench -- iptables  # iptables mode on the real kernel, own netns (root)
//! tests/vm/bench-ipvs.sh                           # `ipvs`: IPVS mode on a real kernel, in the VM
//! ```
//!
//! Prints a markdown table, or JSON with `--json`. Clusters come from
//! [`kube_proxy_rs::bench::gen`] (seed 1, 100 nodes, this node is node-0).

use std::time::{Duration, Instant};

use actix::prelude::*;
use clap::{Parser, Subcommand};
use serde::Serialize;

use kube_proxy_rs::actors::coordinator::{
    AddrSource, Coordinator, GetSyncHistory, RulesRenderer, Settings, SyncRecord,
};
use kube_proxy_rs::actors::wiring::{start_ipvs_actors, IpvsKernels};
use kube_proxy_rs::bench::daemon_run;
use kube_proxy_rs::bench::gen::{Cluster, ClusterSpec, THIS_NODE};
use kube_proxy_rs::bench::iptables_kernel;
use kube_proxy_rs::bench::ipvs_kernel;
use kube_proxy_rs::bench::stats::quantile;
use kube_proxy_rs::bench::{dual, local_addrs, local_addrs_dual, plan_settings, plan_settings_for, rules_config};
use kube_proxy_rs::kernel::mem::Journal;
use kube_proxy_rs::model::{Model, NodeInfo};
use kube_proxy_rs::msgs::{SourceBatch, SourceEvent};
use kube_proxy_rs::net::IpFamily;
use kube_proxy_rs::plan::context::LocalAddr;
use kube_proxy_rs::plan::ipvs::context::plan_context;
use kube_proxy_rs::plan::ipvs::IpvsPlanner;
use kube_proxy_rs::plan::nftables::NftRuleset;
use kube_proxy_rs::stats::StatsRegistry;

mod daemon;
mod report;

use self::daemon::start_daemon;
use self::report::{ms, us, Report, Row};

#[derive(Parser)]
#[command(name = "kpr-bench", about = "kube-proxy-rs benchmarks (issue 7)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Print JSON instead of a markdown table.
    #[arg(long, global = true)]
    json: bool,
    /// Generator seed.
    #[arg(long, global = true, default_value_t = 1)]
    seed: u64,
    /// Nodes in the generated cluster.
    #[arg(long, global = true, default_value_t = 100)]
    nodes: usize,
    /// Endpoints per service.
    #[arg(long, global = true, default_value_t = 10)]
    endpoints: usize,
    /// `plan` and `rss`: the cluster's dual-stack twin (every Service
    /// RequireDualStack, every slice with an IPv6 twin), planned by one
    /// proxier per family as the daemon does; rows say which family.
    #[arg(long, global = true)]
    dual_stack: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Cold full plan and single endpoint changes through the model and planner.
    Plan {
        /// Cluster sizes (services).
        #[arg(long, value_delimiter = ',', default_values_t = [1000, 10000])]
        services: Vec<usize>,
        /// Endpoint changes to time.
        #[arg(long, default_value_t = 1000)]
        changes: usize,
    },
    /// Cold sync and single endpoint changes end to end through the actors (in-memory kernels).
    Actors {
        #[arg(long, value_delimiter = ',', default_values_t = [1000, 10000])]
        services: Vec<usize>,
        /// Endpoint changes to time.
        #[arg(long, default_value_t = 1000)]
        changes: usize,
    },
    /// Peak RSS (VmHWM) after building the model and planning a full sync.
    Rss {
        #[arg(long, default_value_t = 10000)]
        services: usize,
    },
    /// CPU used by the in-memory daemon during a steady churn.
    Churn {
        #[arg(long, default_value_t = 10000)]
        services: usize,
        /// Changes per second.
        #[arg(long, default_value_t = 50)]
        rate: u32,
        /// How long to churn.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// The real daemon binary (iptables, nftables or IPVS mode) on a
    /// generated cluster from manifest files or the test API server, in a
    /// network namespace of its own (root): time to first sync, the tool's
    /// own load of the same rules (iptables-restore, nft -f), idle CPU,
    /// CPU during an EndpointSlice churn, VmHWM.
    Daemon {
        #[arg(long, value_delimiter = ',', default_values_t = [1000, 10000])]
        services: Vec<usize>,
        /// iptables flavour the daemon runs.
        #[arg(long, default_value = "legacy", value_parser = ["legacy", "nft"])]
        flavour: String,
        /// The daemon's proxy mode (ipvs needs the ip_vs module: run it in
        /// the VM, README "Performance").
        #[arg(long, default_value = "iptables", value_parser = ["iptables", "nftables", "ipvs", "all"])]
        mode: String,
        /// Seconds of idle watched after the first sync.
        #[arg(long, default_value_t = 60)]
        idle: u64,
        /// The config's syncPeriod, seconds.
        #[arg(long, default_value_t = 30)]
        sync_period: u64,
        /// The daemon binary (default: kube-proxy-rs beside this binary).
        #[arg(long)]
        binary: Option<std::path::PathBuf>,
        /// Where the daemon reads the cluster: manifest files, or the test
        /// API server (in the daemon's namespace; kube-rs watchers, `--master`).
        #[arg(long, default_value = "manifests", value_parser = ["manifests", "api"])]
        source: String,
        /// After the idle watch: EndpointSlice updates a second through the
        /// API server (needs `--source api`; 0: none).
        #[arg(long, default_value_t = 0)]
        churn_rate: u32,
        /// How long the churn lasts, seconds.
        #[arg(long, default_value_t = 20)]
        churn_seconds: u64,
        /// After the idle watch: this many EndpointSlice updates through the
        /// API server one at a time, each timed to the sync that carried it
        /// (needs `--source api`; 0: none): p50 and p99.
        #[arg(long, default_value_t = 0)]
        latency: u32,
        /// How the manifest files hold the objects: one `kind: List` per
        /// 500 objects, one `kind: List` of them all, or one file per object.
        #[arg(long, default_value = "lists", value_parser = ["lists", "one-file", "per-object"])]
        layout: String,
        /// With `--dual-stack`: every this many-th Service is dual-stack (1: all).
        #[arg(long, default_value_t = 1)]
        dual_every: usize,
        /// nftables mode's ruleset (`nftables.ruleset`).
        #[arg(long, default_value = "upstream", value_parser = ["upstream", "maps"])]
        ruleset: String,
        /// Skip loading the same rules with the tool alone.
        #[arg(long)]
        no_tool: bool,
        /// Give up when every family has not synced this many seconds after the start.
        #[arg(long, default_value_t = 600)]
        first_sync_timeout: u64,
        /// Copy the daemon's log here once it has stopped.
        #[arg(long)]
        keep_log: Option<std::path::PathBuf>,
        /// The memory matrix at each size: `--mode` (or
        /// iptables and nftables with `--mode all`) × source (one file,
        /// one file per object, API) × single-stack and dual-stack with
        /// every second Service dual-stack; no tool comparison. Each
        /// cell's daemon log is kept (the path is printed with the cell).
        #[arg(long)]
        matrix: bool,
    },
    /// The long soak (root): the daemon binary against the test API server
    /// serving the soak cluster, a seeded change of every kind `rate` times
    /// a second for `minutes`, then `--dry-run --diff` clean, sync and
    /// network programming p50/p99, RSS over time, WARN/ERROR lines.
    Soak {
        #[arg(long, default_value_t = 300)]
        services: usize,
        #[arg(long, default_value = "iptables", value_parser = ["iptables", "nftables"])]
        mode: String,
        #[arg(long, default_value_t = 10)]
        rate: u32,
        #[arg(long, default_value_t = 30)]
        minutes: u64,
        /// The daemon binary (default: kube-proxy-rs beside this binary).
        #[arg(long)]
        binary: Option<std::path::PathBuf>,
    },
    /// IPVS mode on the real kernel, as root (in the VM: tests/vm/bench-ipvs.sh):
    /// cold sync, endpoint changes, kernel ops, RSS, and the tools from files.
    Ipvs {
        #[arg(long, value_delimiter = ',', default_values_t = [1000, 10000])]
        services: Vec<usize>,
        #[arg(long, default_value_t = 500)]
        changes: usize,
        /// Services of the unreported warm-up round (0: none).
        #[arg(long, default_value_t = 50)]
        warmup: usize,
        /// Where the tools' input files go.
        #[arg(long, default_value = "/tmp/kpr-bench-ipvs")]
        work_dir: std::path::PathBuf,
        /// Skip reading the kernel state back to compare ours with the tools'.
        #[arg(long)]
        no_verify: bool,
        /// Skip applying the cold state through each kernel handle alone.
        #[arg(long)]
        no_breakdown: bool,
        /// Also write the figures as JSON to this file.
        #[arg(long)]
        json_out: Option<std::path::PathBuf>,
    },
    /// nftables mode's planner and netlink codec on the real kernel, as root,
    /// each size in network namespaces of its own: cold transaction vs `nft -f`
    /// of the same text, endpoint changes and new Services, ops per change.
    Nftables {
        #[arg(long, value_delimiter = ',', default_values_t = [1000, 10000])]
        services: Vec<usize>,
        #[arg(long, default_value_t = 200)]
        changes: usize,
        /// Sizes above this skip the `nft -f` comparison (one `nft -f`
        /// transaction is quadratic: 316 s at 10,000 services).
        #[arg(long, default_value_t = 10000)]
        tool_max: usize,
        /// The ruleset the planner writes (`nftables.ruleset`).
        #[arg(long, default_value = "upstream", value_parser = ["upstream", "maps"])]
        ruleset: String,
    },
    /// iptables mode on the real kernel, as root, in a network namespace of its own:
    /// cold sync, endpoint changes vs iptables-restore alone, lines per change, CPU during churn.
    Iptables {
        /// Cluster sizes for the cold sync and the single changes (0: none).
        #[arg(long, value_delimiter = ',', default_values_t = [1000, 10000])]
        services: Vec<usize>,
        /// Single endpoint changes per size, one at a time.
        #[arg(long, default_value_t = 200)]
        changes: usize,
        /// iptables tools: those on PATH (the daemon's), or iptables-legacy-* / iptables-nft-*.
        #[arg(long, default_value = "path", value_parser = ["path", "legacy", "nft"])]
        flavour: String,
        /// Fresh namespaces the cold text is restored in by the tool alone (median reported).
        #[arg(long, default_value_t = 3)]
        cold_tool_runs: usize,
        /// Save the restore inputs (cold, first 5 changes) as DIR/iptables-N-*.txt.
        #[arg(long)]
        save_dir: Option<std::path::PathBuf>,
        /// Cluster size of the churn.
        #[arg(long, default_value_t = 10000)]
        churn_services: usize,
        /// Churn changes per second.
        #[arg(long, default_value_t = 50)]
        rate: u32,
        /// Churn duration (0: no churn).
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// minSyncPeriod during the churn (upstream's iptables default: 1s).
        #[arg(long, default_value_t = 1000)]
        min_sync_ms: u64,
        /// syncPeriod during the churn (upstream's default: 30s).
        #[arg(long, default_value_t = 30)]
        sync_period_s: u64,
    },
}

fn spec(cli: &Cli, services: usize) -> ClusterSpec {
    ClusterSpec { services, endpoints_per_service: cli.endpoints, nodes: cli.nodes, seed: cli.seed }
}

fn record_all(model: &mut Model, events: &[SourceEvent]) -> anyhow::Result<()> {
    for ev in events {
        model.record(ev)?;
    }
    Ok(())
}

/// A model and a planner holding a full plan of `cluster`, with timings.
struct Planned {
    model: Model,
    planner: IpvsPlanner,
    record: Duration,
    apply: Duration,
    plan: Duration,
    desired: Duration,
    ops: usize,
}

fn build_and_plan(events: &[SourceEvent]) -> anyhow::Result<Planned> {
    build_and_plan_family(events, IpFamily::V4, &local_addrs())
}

/// [`build_and_plan`] for one family's proxier on a dual-stack cluster.
fn build_and_plan_family(events: &[SourceEvent], family: IpFamily, addrs: &[LocalAddr]) -> anyhow::Result<Planned> {
    let t = Instant::now();
    let mut model = Model::new(family, THIS_NODE);
    record_all(&mut model, events)?;
    let record = t.elapsed();
    let t = Instant::now();
    let changes = model.apply();
    let apply = t.elapsed();
    let t = Instant::now();
    let mut planner = IpvsPlanner::new(plan_context(&plan_settings_for(family), model.node(), addrs));
    let d = planner.update(&model, &changes.ports);
    let plan = t.elapsed();
    let t = Instant::now();
    let desired = planner.desired();
    let desired_t = t.elapsed();
    let ops = desired.ipvs.len() + desired.sets.values().map(Vec::len).sum::<usize>() + desired.addresses.len();
    debug_assert_eq!(ops, d.len());
    Ok(Planned { model, planner, record, apply, plan, desired: desired_t, ops })
}

/// Applies each batch to the model and planner: per batch, the time taken
/// (record + apply + plan) and the kernel ops planned.
fn time_changes(
    model: &mut Model,
    planner: &mut IpvsPlanner,
    batches: &[Vec<SourceEvent>],
) -> anyhow::Result<(Vec<Duration>, Vec<usize>)> {
    let mut times = Vec::with_capacity(batches.len());
    let mut ops = Vec::with_capacity(batches.len());
    for evs in batches {
        let t = Instant::now();
        record_all(model, evs)?;
        let c = model.apply();
        let d = planner.update(model, &c.ports);
        times.push(t.elapsed());
        ops.push(d.len());
    }
    Ok((times, ops))
}

/// `plan --dual-stack`: each family's proxier on the dual-stack twin of
/// the cluster, the same figures per family.
fn bench_plan_dual(cli: &Cli, sizes: &[usize], changes: usize, r: &mut Report) -> anyhow::Result<()> {
    for &n in sizes {
        let mut cluster = Cluster::new(spec(cli, n))?;
        let events = dual::dual_stack(&cluster.initial_events());
        let batches: Vec<Vec<SourceEvent>> =
            (0..changes).map(|_| dual::dual_stack(&cluster.next_endpoint_change().1)).collect();
        for family in [IpFamily::V4, IpFamily::V6] {
            let label = kube_proxy_rs::metrics::ip_family_label(family);
            let p = build_and_plan_family(&events, family, &local_addrs_dual())?;
            let (mut model, mut planner) = (p.model, p.planner);
            let total = p.record + p.apply + p.plan;
            let cold = format!("dual-stack {label}: cold full plan (record + apply + plan)");
            r.target("plan", n, &cold, ms(total), "ms", 500.0);
            r.add("plan", n, &format!("dual-stack {label}: cold: planned kernel objects"), p.ops as f64, "ops");
            let (times, ops) = time_changes(&mut model, &mut planner, &batches)?;
            let p50 = format!("dual-stack {label}: endpoint change: p50 (record + apply + plan)");
            r.add("plan", n, &p50, us(quantile(&times, 0.5)), "µs");
            r.add("plan", n, &format!("dual-stack {label}: endpoint change: p99"), us(quantile(&times, 0.99)), "µs");
            let mean = ops.iter().sum::<usize>() as f64 / ops.len().max(1) as f64;
            let m = format!("dual-stack {label}: endpoint change: kernel ops, mean");
            r.add("plan", n, &m, (mean * 100.0).round() / 100.0, "ops");
        }
    }
    Ok(())
}

fn bench_plan(cli: &Cli, sizes: &[usize], changes: usize, r: &mut Report) -> anyhow::Result<()> {
    if cli.dual_stack {
        return bench_plan_dual(cli, sizes, changes, r);
    }
    for &n in sizes {
        let mut cluster = Cluster::new(spec(cli, n))?;
        let events = cluster.initial_events();
        let p = build_and_plan(&events)?;
        let (mut model, mut planner) = (p.model, p.planner);
        r.add("plan", n, "cold: record events into the model", ms(p.record), "ms");
        r.add("plan", n, "cold: model apply", ms(p.apply), "ms");
        r.add("plan", n, "cold: planner update over all ports", ms(p.plan), "ms");
        r.add("plan", n, "cold: desired state (full batch)", ms(p.desired), "ms");
        let total = p.record + p.apply + p.plan;
        r.target("plan", n, "cold full plan (record + apply + plan)", ms(total), "ms", 500.0);
        r.add("plan", n, "cold: planned kernel objects", p.ops as f64, "ops");
        let batches: Vec<Vec<SourceEvent>> = (0..changes).map(|_| cluster.next_endpoint_change().1).collect();
        let (times, ops) = time_changes(&mut model, &mut planner, &batches)?;
        r.add("plan", n, "endpoint change: p50 (record + apply + plan)", us(quantile(&times, 0.5)), "µs");
        r.add("plan", n, "endpoint change: p99", us(quantile(&times, 0.99)), "µs");
        r.add("plan", n, "endpoint change: max", us(quantile(&times, 1.0)), "µs");
        let mean = ops.iter().sum::<usize>() as f64 / ops.len().max(1) as f64;
        r.add("plan", n, "endpoint change: kernel ops, mean", (mean * 100.0).round() / 100.0, "ops");
        r.add("plan", n, "endpoint change: kernel ops, max", ops.iter().copied().max().unwrap_or(0) as f64, "ops");
    }
    Ok(())
}

fn run_system<F: std::future::Future<Output = anyhow::Result<()>>>(f: impl FnOnce() -> F) -> anyhow::Result<()> {
    let sys = actix_rt::System::new();
    sys.block_on(f())
}

fn bench_actors(cli: &Cli, sizes: &[usize], changes: usize, r: &mut Report) -> anyhow::Result<()> {
    for &n in sizes {
        let mut cluster = Cluster::new(spec(cli, n))?;
        let events = cluster.initial_events();
        let batches: Vec<Vec<SourceEvent>> = (0..changes).map(|_| cluster.next_endpoint_change().1).collect();
        run_system(|| async {
            let d = start_daemon(Duration::from_secs(3600));
            let t = Instant::now();
            let rec = d.send_and_wait(events).await?;
            let cold = t.elapsed();
            r.add("actors", n, "cold full sync, events sent → every actor acked", ms(cold), "ms");
            r.add("actors", n, "cold full sync, coordinator's sync duration", rec.duration_ms, "ms");
            d.journal.clear();
            let mut times = Vec::with_capacity(changes);
            let mut sync_times = Vec::with_capacity(changes);
            let mut partial = 0;
            let mut lines = 0;
            for evs in batches {
                let t = Instant::now();
                let rec = d.send_and_wait(evs).await?;
                times.push(t.elapsed());
                sync_times.push(Duration::from_secs_f64(rec.duration_ms / 1000.0));
                partial += usize::from(!rec.full);
                lines += d.journal.lines().len();
                d.journal.clear();
            }
            let p99 = quantile(&times, 0.99);
            r.add("actors", n, "endpoint change → every actor acked: p50", us(quantile(&times, 0.5)), "µs");
            r.target("actors", n, "endpoint change → every actor acked: p99", us(p99), "µs", 1000.0);
            r.add("actors", n, "endpoint change → every actor acked: max", us(quantile(&times, 1.0)), "µs");
            let (s50, s99) = (quantile(&sync_times, 0.5), quantile(&sync_times, 0.99));
            r.add("actors", n, "endpoint change: sync start → every actor acked: p50", us(s50), "µs");
            r.add("actors", n, "endpoint change: sync start → every actor acked: p99", us(s99), "µs");
            r.add("actors", n, "endpoint change: incremental syncs", partial as f64, "syncs");
            let mean = lines as f64 / times.len().max(1) as f64;
            r.add("actors", n, "endpoint change: kernel ops applied, mean", (mean * 100.0).round() / 100.0, "ops");
            Ok(())
        })?;
    }
    Ok(())
}

/// A field of /proc/self/status, in kB.
fn status_kb(field: &str) -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn bench_rss(cli: &Cli, n: usize, r: &mut Report) -> anyhow::Result<()> {
    let base = status_kb("VmRSS:").unwrap_or(0.0);
    let cluster = Cluster::new(spec(cli, n))?;
    let events = cluster.initial_events();
    let events = if cli.dual_stack { dual::dual_stack(&events) } else { events };
    drop(cluster);
    let with_events = status_kb("VmRSS:").unwrap_or(0.0);
    let p = build_and_plan(&events)?;
    // Dual-stack: the second family's proxier too, as the daemon runs it.
    let p6 = match cli.dual_stack {
        true => Some(build_and_plan_family(&events, IpFamily::V6, &local_addrs_dual())?),
        false => None,
    };
    let planned = status_kb("VmRSS:").unwrap_or(0.0);
    let desired = p.planner.desired();
    let desired6 = p6.as_ref().map(|p| p.planner.desired());
    let hwm = status_kb("VmHWM:").unwrap_or(0.0);
    drop(events);
    drop(desired);
    drop(desired6);
    let after = status_kb("VmRSS:").unwrap_or(0.0);
    r.add("rss", n, "RSS at start", (base / 1024.0 * 10.0).round() / 10.0, "MB");
    r.add(
        "rss",
        n,
        "RSS with the generated objects (as a source's cache holds them)",
        (with_events / 1024.0 * 10.0).round() / 10.0,
        "MB",
    );
    let growth = ((planned - with_events) / 1024.0 * 10.0).round() / 10.0;
    r.add("rss", n, "RSS growth from model + planner (before the full batch)", growth, "MB");
    r.target(
        "rss",
        n,
        "peak RSS (VmHWM) after building and planning",
        (hwm / 1024.0 * 10.0).round() / 10.0,
        "MB",
        150.0,
    );
    r.add(
        "rss",
        n,
        "RSS after dropping objects and full batch (malloc keeps freed pages)",
        (after / 1024.0 * 10.0).round() / 10.0,
        "MB",
    );
    drop(p.model);
    Ok(())
}

/// CPU time (user + system) of this process, from /proc/self/stat.
fn cpu_time() -> Duration {
    let ticks = || -> Option<u64> {
        let text = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces) start at ")".
        let rest = &text[text.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 (1-based), 12 and 13 after the name and state.
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    };
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks().unwrap_or(0) * 10)
}

fn bench_churn(cli: &Cli, n: usize, rate: u32, seconds: u64, r: &mut Report) -> anyhow::Result<()> {
    let mut cluster = Cluster::new(spec(cli, n))?;
    let events = cluster.initial_events();
    let total = (u64::from(rate) * seconds) as usize;
    let changes: Vec<Vec<SourceEvent>> = (0..total).map(|_| cluster.next_change().1).collect();
    run_system(|| async {
        // Upstream's defaults for IPVS mode: minSyncPeriod 0, syncPeriod 30s.
        let d = start_daemon(Duration::from_secs(30));
        d.send_and_wait(events).await?;
        d.journal.clear();
        let syncs_before = d.last_generation().await;
        let cpu0 = cpu_time();
        let t0 = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for (i, evs) in changes.into_iter().enumerate() {
            tick.tick().await;
            d.coord.send(SourceBatch(evs)).await?;
            if i % rate.max(1) as usize == 0 {
                d.journal.clear();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let wall = t0.elapsed();
        let cpu = cpu_time().saturating_sub(cpu0);
        let hist = d.history().await;
        let syncs = hist.last().map_or(0, |s| s.generation) - syncs_before;
        let full = hist.iter().filter(|s| s.generation > syncs_before && s.full).count();
        r.add("churn", n, "changes sent", total as f64, "changes");
        r.add("churn", n, "wall time", (wall.as_secs_f64() * 100.0).round() / 100.0, "s");
        r.add("churn", n, "syncs during the churn", syncs as f64, "syncs");
        r.add("churn", n, "full syncs among the last 64 (history window; syncPeriod 30s)", full as f64, "syncs");
        r.add("churn", n, "CPU time (user + system)", ms(cpu), "ms");
        let pct = cpu.as_secs_f64() / wall.as_secs_f64() * 100.0;
        r.target("churn", n, "CPU, % of one core", (pct * 100.0).round() / 100.0, "%", 10.0);
        Ok(())
    })
}

/// `kpr-bench ipvs`: the figures of [`ipvs_kernel::run`], also when it stops early.
fn bench_ipvs_kernel(
    opts: &ipvs_kernel::Options,
    json_out: Option<&std::path::Path>,
    r: &mut Report,
) -> anyhow::Result<()> {
    let mut figures = Vec::new();
    let res = ipvs_kernel::run(opts, &mut figures);
    for f in figures {
        let ipvs_kernel::Figure { services, metric, value, unit, target, met } = f;
        r.rows.push(Row { bench: "ipvs", services, metric, value, unit, target, met });
    }
    if let Some(path) = json_out {
        std::fs::write(path, serde_json::to_string_pretty(&r.rows)?)?;
    }
    res
}

/// `kpr-bench daemon --matrix`: one daemon run per cell of the
/// memory matrix; every run's figures go to the report, and a table of the
/// cells (first sync, peak RSS, RSS 60 s after the first sync) is printed
/// to stderr as each cell finishes and in the report at the end, with the
/// path of the cell's daemon log (kept in one directory per matrix run).
fn bench_daemon_matrix(
    services: &[usize],
    mode: &str,
    base: impl Fn(usize) -> daemon_run::Options,
    r: &mut Report,
) -> anyhow::Result<()> {
    let modes: Vec<&str> = match mode {
        "all" => vec!["iptables", "nftables"],
        one => vec![one],
    };
    let sources = [
        (Some(daemon_run::Layout::OneFile), "one file"),
        (Some(daemon_run::Layout::PerObject), "file per object"),
        (None, "API"),
    ];
    let families = [(false, "single-stack"), (true, "dual-stack (every 2nd Service)")];
    let logs = daemon_run::tempfile_dir("matrix-logs")?;
    eprintln!("kpr-bench daemon --matrix: the daemons' logs go to {}", logs.display());
    for &n in services {
        for &mode in &modes {
            for (layout, source) in sources {
                for (dual, family) in families {
                    let opts = daemon_run::Options {
                        mode: mode.to_string(),
                        dual_stack: dual,
                        dual_every: 2,
                        layout: layout.unwrap_or(daemon_run::Layout::Lists),
                        api_source: layout.is_none(),
                        tool: false,
                        churn: None,
                        latency: None,
                        keep_log: Some(logs.join(daemon_run::cell_log_name(n, mode, source, dual))),
                        ..base(n)
                    };
                    let log = opts.keep_log.clone().unwrap_or_default();
                    let figures = daemon_run::run_daemon(&opts)?;
                    let get = |metric: &str| figures.iter().find(|f| f.metric == metric).map_or(f64::NAN, |f| f.value);
                    let cell = format!("{mode} · {source} · {family}");
                    for metric in [daemon_run::FIRST_SYNC, daemon_run::PEAK_RSS, daemon_run::RSS_AFTER] {
                        let unit = if metric == daemon_run::FIRST_SYNC { "s" } else { "MB" };
                        let limit = match metric {
                            daemon_run::PEAK_RSS => Some(150.0),
                            daemon_run::RSS_AFTER => Some(100.0),
                            _ => None,
                        };
                        let text = format!("{cell}: {metric}");
                        match limit {
                            Some(limit) if n == 10_000 => r.target("daemon matrix", n, &text, get(metric), unit, limit),
                            _ => r.add("daemon matrix", n, &text, get(metric), unit),
                        }
                    }
                    eprintln!(
                        "| {n} | {cell} | {:.1} s | {:.1} MB | {:.1} MB | {} |",
                        get(daemon_run::FIRST_SYNC),
                        get(daemon_run::PEAK_RSS),
                        get(daemon_run::RSS_AFTER),
                        log.display()
                    );
                }
            }
        }
    }
    Ok(())
}

/// `kpr-bench iptables`: the figures of [`iptables_kernel::run`], also when it stops early.
fn bench_iptables_kernel(opts: &iptables_kernel::Options, r: &mut Report) -> anyhow::Result<()> {
    let mut figures = Vec::new();
    let res = iptables_kernel::run(opts, &mut figures);
    for f in figures {
        match f.limit {
            Some(limit) => r.target(f.bench, f.services, &f.metric, f.value, f.unit, limit),
            None => r.add(f.bench, f.services, &f.metric, f.value, f.unit),
        }
    }
    res
}

/// The ruleset `name` (`--ruleset`).
fn nft_ruleset(name: &str) -> anyhow::Result<NftRuleset> {
    NftRuleset::from_name(name).ok_or_else(|| anyhow::anyhow!("no nftables ruleset named {name:?}"))
}

/// jemalloc for every thread (src/heap.rs).
#[global_allocator]
static ALLOCATOR: kube_proxy_rs::heap::Allocator = tikv_jemallocator::Jemalloc;

fn main() {
    let cli = Cli::parse();
    let mut r = Report { rows: Vec::new() };
    let res = match &cli.cmd {
        Cmd::Plan { services, changes } => bench_plan(&cli, services, *changes, &mut r),
        Cmd::Actors { services, changes } => bench_actors(&cli, services, *changes, &mut r),
        Cmd::Rss { services } => bench_rss(&cli, *services, &mut r),
        Cmd::Daemon {
            services,
            flavour,
            mode,
            idle,
            sync_period,
            binary,
            source,
            churn_rate,
            churn_seconds,
            latency,
            layout,
            dual_every,
            ruleset,
            no_tool,
            first_sync_timeout,
            keep_log,
            matrix,
        } => {
            let binary = match binary {
                Some(b) => b.clone(),
                None => std::env::current_exe()
                    .map(|p| p.with_file_name("kube-proxy-rs"))
                    .unwrap_or_else(|_| "kube-proxy-rs".into()),
            };
            nft_ruleset(ruleset).and_then(|nftables_ruleset| {
                let base = |n: usize| daemon_run::Options {
                    spec: spec(&cli, n),
                    binary: binary.clone(),
                    flavour: flavour.clone(),
                    mode: mode.clone(),
                    idle: Duration::from_secs(*idle),
                    dual_stack: cli.dual_stack,
                    dual_every: *dual_every,
                    layout: daemon_run::Layout::named(layout).unwrap_or(daemon_run::Layout::Lists),
                    tool: !no_tool,
                    nftables_ruleset,
                    sync_period: Duration::from_secs(*sync_period),
                    api_source: source == "api",
                    churn: (*churn_rate > 0).then(|| (*churn_rate, Duration::from_secs(*churn_seconds))),
                    latency: (*latency > 0).then_some(*latency),
                    first_sync_timeout: Duration::from_secs(*first_sync_timeout),
                    keep_log: keep_log.clone(),
                };
                if *matrix {
                    bench_daemon_matrix(services, mode, base, &mut r)
                } else {
                    services.iter().try_for_each(|&n| {
                        for f in daemon_run::run_daemon(&base(n))? {
                            r.add("daemon", n, &f.metric, f.value, f.unit);
                        }
                        Ok(())
                    })
                }
            })
        }
        Cmd::Soak { services, mode, rate, minutes, binary } => {
            let binary = binary.clone().unwrap_or_else(|| {
                std::env::current_exe()
                    .map(|p| p.with_file_name("kube-proxy-rs"))
                    .unwrap_or_else(|_| "kube-proxy-rs".into())
            });
            let spec = kube_proxy_rs::bench::soak::cluster::SoakSpec {
                seed: cli.seed,
                services: *services,
                probes: 6,
                backends: 3,
                dual_stack: cli.dual_stack,
            };
            let opts = kube_proxy_rs::bench::soak::run::Options {
                spec,
                binary,
                mode: mode.clone(),
                rate: *rate,
                duration: Duration::from_secs(minutes * 60),
                rss_every: Duration::from_secs(300),
            };
            kube_proxy_rs::bench::soak::run::run_soak(&opts).map(|figures| {
                for f in figures {
                    r.add("soak", *services, &f.metric, f.value, f.unit);
                }
            })
        }
        Cmd::Churn { services, rate, seconds } => bench_churn(&cli, *services, *rate, *seconds, &mut r),
        Cmd::Ipvs { services, changes, warmup, work_dir, no_verify, no_breakdown, json_out } => {
            let opts = ipvs_kernel::Options {
                services: services.clone(),
                changes: *changes,
                seed: cli.seed,
                nodes: cli.nodes,
                endpoints: cli.endpoints,
                warmup: *warmup,
                work_dir: work_dir.clone(),
                verify: !no_verify,
                breakdown: !no_breakdown,
            };
            bench_ipvs_kernel(&opts, json_out.as_deref(), &mut r)
        }
        Cmd::Nftables { services, changes, tool_max, ruleset } => nft_ruleset(ruleset).and_then(|ruleset| {
            let opts = kube_proxy_rs::bench::nftables_kernel::Options {
                ruleset,
                seed: cli.seed,
                nodes: cli.nodes,
                endpoints: cli.endpoints,
                services: services.clone(),
                changes: *changes,
                tool_max: *tool_max,
            };
            let mut figures = Vec::new();
            let res = kube_proxy_rs::bench::nftables_kernel::run(&opts, &mut figures);
            for f in figures {
                match f.limit {
                    Some(limit) => r.target(f.bench, f.services, &f.metric, f.value, f.unit, limit),
                    None => r.add(f.bench, f.services, &f.metric, f.value, f.unit),
                }
            }
            res
        }),
        Cmd::Iptables {
            services,
            changes,
            flavour,
            cold_tool_runs,
            save_dir,
            churn_services,
            rate,
            seconds,
            min_sync_ms,
            sync_period_s,
        } => {
            let opts = iptables_kernel::Options {
                seed: cli.seed,
                nodes: cli.nodes,
                endpoints: cli.endpoints,
                services: services.iter().copied().filter(|n| *n > 0).collect(),
                changes: *changes,
                cold_tool_runs: *cold_tool_runs,
                save_dir: save_dir.clone(),
                flavour: match flavour.as_str() {
                    "legacy" => iptables_kernel::Flavour::Legacy,
                    "nft" => iptables_kernel::Flavour::Nft,
                    _ => iptables_kernel::Flavour::Path,
                },
                churn: (*seconds > 0).then(|| iptables_kernel::ChurnOptions {
                    services: *churn_services,
                    rate: *rate,
                    seconds: *seconds,
                    min_sync: Duration::from_millis(*min_sync_ms),
                    sync_period: Duration::from_secs(*sync_period_s),
                }),
            };
            bench_iptables_kernel(&opts, &mut r)
        }
    };
    r.print(cli.json);
    if let Err(e) = res {
        eprintln!("kpr-bench: {e:#}");
        std::process::exit(1);
    }
}
