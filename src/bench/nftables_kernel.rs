//! `kpr-bench nftables`: the nftables mode's planner and netlink codec on
//! the real kernel, each size in a network namespace of its own: the
//! daemon's path without the actors around it (planner → typed
//! transactions → codec → kernel; the actor only forwards them).
//!
//! Per cluster size N (the generator's services, seed 1):
//! - cold: the planner's full sync from an empty kernel, staged as the
//!   daemon sends it ([`Staged`]: new chains first, in bounded
//!   transactions) and sent ([`NetlinkNftables::apply`]), against `nft -f`
//!   of the same transaction's text in another fresh namespace; both
//!   tables are then listed and compared (`nft list table`), so the
//!   figures are of equal work;
//! - endpoint changes, one at a time: the model's change → the planner's
//!   partial sync → one transaction acked; wall time, its planner and
//!   codec + kernel parts, and ops;
//! - one new Service added among the N, the same way.
//!
//! The ruleset is `--ruleset` (`nftables.ruleset`): the figures are
//! reported under `nftables` (upstream's) or `nftables-maps`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};

use crate::bench::gen::{node_ip, ChurnKind, Cluster, ClusterSpec, THIS_NODE};
use crate::bench::iptables_kernel::{in_new_netns, Figure};
use crate::bench::stats::quantile;
use crate::config::KubeProxyConfiguration;
use crate::kernel::nftables::NetlinkNftables;
use crate::model::Model;
use crate::net::{IpFamily, LocalAddr};
use crate::plan::iptables::HostFeatures;
use crate::plan::nftables::{
    desired, full_sync, nftables_context, KernelObjects, NftRuleset, NftablesPlanner, Staged, Transaction, STAGE_OPS,
};
use crate::settings;

const FAMILY: IpFamily = IpFamily::V4;
const TABLE: &str = "kube-proxy";

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    pub nodes: usize,
    pub endpoints: usize,
    pub services: Vec<usize>,
    pub changes: usize,
    /// The largest size also loaded with `nft -f` for comparison.
    pub tool_max: usize,
    /// The ruleset the planner writes.
    pub ruleset: NftRuleset,
}

pub fn run(opts: &Options, out: &mut Vec<Figure>) -> anyhow::Result<()> {
    ensure!(Command::new("nft").arg("--version").output().is_ok_and(|o| o.status.success()), "nft is not installed");
    let bench = match opts.ruleset {
        NftRuleset::Upstream => "nftables",
        NftRuleset::Maps => "nftables-maps",
    };
    for &n in &opts.services {
        let first = out.len();
        let res = bench_size(opts, n, out);
        out[first..].iter_mut().for_each(|f| f.bench = bench);
        res?;
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn figure(out: &mut Vec<Figure>, n: usize, metric: &str, value: f64, unit: &'static str, limit: Option<f64>) {
    out.push(Figure {
        bench: "nftables",
        services: n,
        metric: metric.into(),
        value: (value * 1e3).round() / 1e3,
        unit,
        limit,
    });
}

/// `nft -f -` with `text`, in this thread's namespace; its wall time.
fn time_nft(text: &str) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes()).context("writing to nft")?;
    }
    let out = child.wait_with_output()?;
    let took = t.elapsed();
    ensure!(out.status.success(), "nft -f failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(took)
}

fn list_table() -> anyhow::Result<String> {
    let out = Command::new("nft").args(["list", "table", "ip", TABLE]).output().context("running nft list")?;
    ensure!(out.status.success(), "nft list table: {}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One change's time from the model's change to the kernel's ack, and the
/// planner's part of it (the rest is the codec, the send and the kernel's
/// commit).
struct Split {
    total: Duration,
    plan: Duration,
    ops: usize,
}

/// `what → acked` p50 and p99 (limit `p99_limit` ms), the planner's and the
/// kernel's p50 and p99 apart, and the slowest change's split and ops.
fn split_figures(out: &mut Vec<Figure>, n: usize, what: &str, changes: &[Split], p99_limit: f64) {
    let sorted = |f: &dyn Fn(&Split) -> Duration| {
        let mut v: Vec<f64> = changes.iter().map(|c| ms(f(c))).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let total = sorted(&|c| c.total);
    let plan = sorted(&|c| c.plan);
    let kernel = sorted(&|c| c.total.saturating_sub(c.plan));
    figure(out, n, &format!("{what} → acked, p50"), quantile(&total, 0.5), "ms", None);
    figure(out, n, &format!("{what} → acked, p99"), quantile(&total, 0.99), "ms", Some(p99_limit));
    for (part, v) in [("planner", &plan), ("codec + kernel", &kernel)] {
        figure(out, n, &format!("{what}: {part}, p50"), quantile(v, 0.5), "ms", None);
        figure(out, n, &format!("{what}: {part}, p99"), quantile(v, 0.99), "ms", None);
    }
    if let Some(slowest) = changes.iter().max_by_key(|c| c.total) {
        figure(out, n, &format!("{what}, the slowest: planner"), ms(slowest.plan), "ms", None);
        figure(out, n, &format!("{what}, the slowest: codec + kernel"), ms(slowest.total - slowest.plan), "ms", None);
        figure(out, n, &format!("{what}, the slowest: ops"), slowest.ops as f64, "ops", None);
    }
}

fn bench_size(opts: &Options, n: usize, out: &mut Vec<Figure>) -> anyhow::Result<()> {
    let spec = ClusterSpec { services: n, endpoints_per_service: opts.endpoints, nodes: opts.nodes, seed: opts.seed };
    let mut cluster = Cluster::new(spec).context("generating the cluster")?;
    let mut model = Model::new(FAMILY, THIS_NODE);
    for ev in cluster.initial_events() {
        model.record(&ev).context("a generated object")?;
    }
    model.apply();
    let mut cfg = KubeProxyConfiguration::with_defaults();
    cfg.mode = "nftables".into();
    cfg.cluster_cidr = "10.0.0.0/8".into();
    cfg.nftables.ruleset = opts.ruleset.name().into();
    let derived = settings::derive(&cfg, FAMILY, THIS_NODE, HostFeatures::default());
    let addrs = vec![LocalAddr { ifname: "eth0".into(), ip: node_ip(0).into() }];
    let ctx = nftables_context(&derived.nftables_settings(model.node(), model.service_cidrs()), model.node(), &addrs);
    let mut planner = NftablesPlanner::new(ctx.clone());

    let t = Instant::now();
    let staged: Staged = planner.full_staged(&model, ctx.clone(), &KernelObjects::default(), STAGE_OPS);
    let plan_time = t.elapsed();
    // The tool, on the same full sync's text as one transaction, in a namespace of its own
    // (not above `tool_max`: one `nft -f` transaction is quadratic in its length).
    let tool = if n <= opts.tool_max {
        let cold_text = full_sync(&desired(&model, &ctx), &KernelObjects::default(), true).tx.to_string();
        Some(in_new_netns(|| {
            let took = time_nft(&cold_text)?;
            Ok((took, list_table()?))
        })?)
    } else {
        None
    };
    // As the daemon sends a full sync: the new chains first, in bounded transactions.
    let t = Instant::now();
    let mut steps: Vec<_> = staged.collect();
    let staging_time = t.elapsed();
    let cold_ops: usize = steps.iter().map(Transaction::op_count).sum();
    let cold_transactions = steps.len();

    let changes = opts.changes;
    let compare = tool.is_some();
    let (apply_time, our_listing, change_times, change_ops, add_times, probes) = in_new_netns(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            let nft = NetlinkNftables::new().context("netfilter netlink socket")?;
            let t = Instant::now();
            // Each sent transaction dropped, as the daemon's actor drops it: the last one shares
            // the planned ruleset, which the planner then holds in place.
            for tx in std::mem::take(&mut steps) {
                nft.apply(FAMILY, TABLE, &tx.ops).await.map_err(|e| anyhow::anyhow!("cold transaction: {e}"))?;
            }
            let apply_time = t.elapsed();
            planner.confirm_applied(Duration::ZERO);
            // `nft list table` of 44,000 services takes minutes: only to compare with `nft -f`.
            let listing = if compare { list_table()? } else { String::new() };
            let mut times = Vec::with_capacity(changes);
            let mut op_counts = Vec::with_capacity(changes);
            let mut adds = Vec::new();
            let mut now = Duration::ZERO;
            let sync = |model: &mut Model, planner: &mut NftablesPlanner, events: Vec<crate::msgs::SourceEvent>| {
                for ev in &events {
                    model.record(ev).context("a generated change")?;
                }
                let changed = model.apply();
                let delta = planner
                    .partial(model, changed.ports.iter())
                    .ok_or_else(|| anyhow::anyhow!("the planner wants a full sync"))?;
                Ok::<_, anyhow::Error>(delta.tx.ops)
            };
            for _ in 0..changes {
                let (_, events) = cluster.next_endpoint_change();
                let t = Instant::now();
                let ops = sync(&mut model, &mut planner, events)?;
                let planned = t.elapsed();
                nft.apply(FAMILY, TABLE, &ops).await.map_err(|e| anyhow::anyhow!("a change: {e}"))?;
                times.push(Split { total: t.elapsed(), plan: planned, ops: ops.len() });
                op_counts.push(ops.len());
                now += Duration::from_millis(100);
                planner.confirm_applied(now);
                if let Some(tx) = planner.delete_due(now) {
                    nft.apply(FAMILY, TABLE, &tx.ops).await.map_err(|e| anyhow::anyhow!("stale chains: {e}"))?;
                }
            }
            for _ in 0..changes.min(50) {
                let events = loop {
                    let (kind, events) = cluster.next_change();
                    if kind == ChurnKind::ServiceAdded {
                        break events;
                    }
                };
                let t = Instant::now();
                let ops = sync(&mut model, &mut planner, events)?;
                let planned = t.elapsed();
                nft.apply(FAMILY, TABLE, &ops).await.map_err(|e| anyhow::anyhow!("a new service: {e}"))?;
                adds.push(Split { total: t.elapsed(), plan: planned, ops: ops.len() });
                now += Duration::from_millis(100);
                planner.confirm_applied(now);
            }
            // Which transactions cost what, at this table size: a plain set
            // element, a verdict-map element with a goto (upstream's ruleset)
            // or a data-map element (the maps ruleset's endpoint), a chain with
            // a rule without a jump (each added, then deleted: two transactions).
            use crate::msgs::nftables::{Element, Expr, Field, KeyPart, NftOp, Rule, Verdict};
            use crate::net::Protocol;
            let addr = |i: u8| KeyPart::Addr(std::net::IpAddr::from([10, 255, 0, i]));
            let service = vec![addr(2), KeyPart::Proto(Protocol::Tcp), KeyPart::Port(80)];
            let element = match opts.ruleset {
                NftRuleset::Upstream => {
                    let target = planner
                        .applied()
                        .and_then(|rs| {
                            rs.services.values().flat_map(|o| o.chains.iter()).map(|c| c.name.clone()).next()
                        })
                        .ok_or_else(|| anyhow::anyhow!("no service chain to point at"))?;
                    let set = "service-ips".to_string();
                    let elements = vec![Element::to(service.clone(), Verdict::Goto(target))];
                    ("a verdict-map element (goto)", set, elements, service)
                }
                NftRuleset::Maps => {
                    let key: Vec<KeyPart> = service.into_iter().chain([KeyPart::Slot(0)]).collect();
                    let set = "maps-cluster-endpoints".to_string();
                    let elements = vec![Element::data(key.clone(), vec![addr(9), KeyPart::Port(8080)])];
                    ("a data-map element (an endpoint's slot)", set, elements, key)
                }
            };
            let (what, set, elements, key) = element;
            let kinds: [(&str, Vec<NftOp>, Vec<NftOp>); 3] = [
                (
                    "a plain set element",
                    vec![NftOp::AddElements { set: "cluster-ips".into(), elements: vec![Element::key(vec![addr(1)])] }],
                    vec![NftOp::DeleteElements { set: "cluster-ips".into(), keys: vec![vec![addr(1)]] }],
                ),
                (
                    what,
                    vec![NftOp::AddElements { set: set.clone(), elements }],
                    vec![NftOp::DeleteElements { set, keys: vec![key] }],
                ),
                (
                    "a chain with a dnat rule (no jump)",
                    vec![
                        NftOp::AddChain { name: "probe".into(), base: None, comment: None },
                        NftOp::AddRule {
                            chain: "probe".into(),
                            rule: Rule::new(vec![
                                Expr::Cmp { field: Field::L4proto, neq: false, value: KeyPart::Proto(Protocol::Tcp) },
                                Expr::Dnat(([10, 255, 0, 9], 80).into()),
                            ]),
                        },
                    ],
                    vec![NftOp::FlushChain("probe".into()), NftOp::DeleteChain("probe".into())],
                ),
            ];
            let mut probes = Vec::new();
            for (what, add, del) in kinds {
                let mut t = Vec::new();
                for _ in 0..20 {
                    let s = Instant::now();
                    nft.apply(FAMILY, TABLE, &add).await.map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
                    t.push(ms(s.elapsed()));
                    nft.apply(FAMILY, TABLE, &del).await.map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
                }
                t.sort_by(f64::total_cmp);
                probes.push((what, quantile(&t, 0.5)));
            }
            Ok((apply_time, listing, times, op_counts, adds, probes))
        })
    })?;
    // The same chains, sets and maps (the staged sync creates them in another order).
    if let Some((_, tool_listing)) = &tool {
        ensure!(
            crate::testkit::listing_blocks(&our_listing) == crate::testkit::listing_blocks(tool_listing),
            "the codec's table differs from nft -f's at N = {n}"
        );
    }

    let ours = plan_time + staging_time + apply_time;
    figure(out, n, "cold: ops", cold_ops as f64, "ops", None);
    figure(
        out,
        n,
        "cold: transactions (declarations, per-service chains in bounded ones, the rest)",
        cold_transactions as f64,
        "transactions",
        None,
    );
    figure(out, n, "cold: plan (full sync)", ms(plan_time), "ms", None);
    figure(out, n, "cold: staged into transactions", ms(staging_time), "ms", None);
    figure(out, n, "cold: the netlink transactions, sent → acked", ms(apply_time), "ms", None);
    if let Some((tool_time, _)) = tool {
        figure(out, n, "cold: `nft -f` of the same text", ms(tool_time), "ms", None);
        figure(
            out,
            n,
            "cold: ours (plan + staging + transactions) / nft -f",
            ours.as_secs_f64() / tool_time.as_secs_f64(),
            "×",
            Some(1.0),
        );
    } else {
        figure(
            out,
            n,
            "cold: ours (plan + staging + transactions), no `nft -f` above --tool-max",
            ms(ours),
            "ms",
            None,
        );
    }
    split_figures(out, n, "endpoint change", &change_times, 5.0);
    let mut o = change_ops.clone();
    o.sort();
    figure(out, n, "ops per endpoint change, p50", quantile(&o, 0.5) as f64, "ops", None);
    figure(out, n, "ops per endpoint change, max", o.last().copied().unwrap_or(0) as f64, "ops", None);
    split_figures(out, n, "new Service", &add_times, 10.0);
    for (what, p50) in probes {
        figure(out, n, &format!("one transaction adding {what}, p50 of 20"), p50, "ms", None);
    }
    Ok(())
}
