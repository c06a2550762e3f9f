//! `kpr-bench soak`: the long soak, outside CI. The daemon binary in a
//! network namespace of its own (one mode), the test API server inside it
//! serving the soak's cluster ([`super::cluster`]), the seeded change
//! stream at a rate for a long time; then the convergence check (`--dry-run
//! --diff` of a fresh process clean) and what a user would read: changes
//! applied, syncs, p50/p99 sync time and network programming latency
//! (the daemon's `/metrics` histograms), RSS over time, WARN/ERROR lines.
//!
//! Needs root, iproute2, curl, and the mode's tools (iptables-legacy is
//! put first on the daemon's PATH in iptables mode).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::check::{diff_leftovers, histogram_buckets, histogram_quantile, unexplained_log_lines};
use super::cluster::{SoakCluster, SoakSpec, Write};
use crate::bench::daemon_run::{tempfile_dir, Figure, Netns};
use crate::testkit::apiserver::ApiServer;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub spec: SoakSpec,
    pub binary: PathBuf,
    /// `iptables` or `nftables`.
    pub mode: String,
    /// Changes a second.
    pub rate: u32,
    pub duration: Duration,
    /// Seconds between RSS figures.
    pub rss_every: Duration,
}

const NODE_IP: &str = "192.168.50.1";
const NODE_IP6: &str = "fd00:50::1";

/// Runs the soak; figures in the order measured.
pub fn run_soak(opts: &Options) -> anyhow::Result<Vec<Figure>> {
    let mut out = Vec::new();
    let mut fig = |metric: String, value: f64, unit: &'static str| {
        out.push(Figure { metric, value: (value * 1000.0).round() / 1000.0, unit })
    };
    let work = tempfile_dir("soak")?;
    let node = Netns::new(format!("kpr-soak-{}", std::process::id()))?;
    node.exec(&["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"])?;
    node.exec(&["ip", "addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"])?;
    node.exec(&["ip", "addr", "add", &format!("{NODE_IP6}/64"), "dev", "eth0", "nodad"])?;
    node.exec(&["ip", "link", "set", "eth0", "up"])?;
    node.exec(&["ip", "link", "set", "eth1", "up"])?;
    let (api, _serving) = ApiServer::start_in_netns(&node.0);
    let mut cluster = SoakCluster::new(opts.spec.clone());
    let dual = opts.spec.dual_stack;
    api.create(&SoakCluster::node(NODE_IP, dual.then_some(NODE_IP6))).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for o in cluster.objects() {
        api.create(&o).map_err(|e| anyhow::anyhow!("creating {o}: {e:?}"))?;
    }
    fig("Services at the start".into(), cluster.service_count() as f64, "");

    let cidr = if dual { "10.244.0.0/16,fd00:244::/48" } else { "10.244.0.0/16" };
    let config = work.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\n\
             hostnameOverride: {node}\nclusterCIDR: {cidr}\n{mode}:\n  syncPeriod: 30s\n  minSyncPeriod: 1s\n",
            mode = opts.mode,
            node = super::cluster::NODE,
        ),
    )?;
    let shims = work.join("bin");
    crate::bench::daemon_run::iptables_shims(&shims, "legacy")?;
    let path = format!("{}:{}", shims.display(), std::env::var("PATH").unwrap_or_default());
    let daemon_args = |extra: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &node.0]).arg(&opts.binary).arg("--config").arg(&config);
        c.args(["--master", &api.url()]).args(extra).env("PATH", &path);
        c
    };
    let log = work.join("daemon.log");
    let mut child = daemon_args(&[])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting the daemon")?;
    let pid = child.id();
    std::thread::sleep(Duration::from_secs(5));

    let start = Instant::now();
    let every = Duration::from_secs(1) / opts.rate.max(1);
    let mut next_rss = start;
    let mut changes: u32 = 0;
    while start.elapsed() < opts.duration {
        if let Some(status) = child.try_wait()? {
            bail!("the daemon exited ({status}); log {}", log.display());
        }
        let trigger = jiff::Timestamp::now().to_string();
        for w in cluster.next_change(Some(&trigger)).1 {
            let r = match &w {
                Write::Create(o) => api.create(o),
                Write::Update(o) => api.update(o),
                Write::Delete(o) => api.delete(o),
            };
            r.map_err(|e| anyhow::anyhow!("{w:?}: {e:?}"))?;
        }
        changes += 1;
        if Instant::now() >= next_rss {
            fig(format!("RSS at {:.0} min", start.elapsed().as_secs_f64() / 60.0), rss_mib(pid)?, "MiB");
            next_rss += opts.rss_every;
        }
        if let Some(wait) = (every * changes).checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    fig("changes applied".into(), f64::from(changes), "");
    fig("RSS at the end".into(), rss_mib(pid)?, "MiB");

    let settled = Instant::now();
    loop {
        let preview = daemon_args(&["--dry-run", "--diff"]).output()?;
        let text = String::from_utf8_lossy(&preview.stdout);
        match diff_leftovers(&text) {
            Ok(left) if left.is_empty() => break,
            other if settled.elapsed() > Duration::from_secs(120) => bail!("not converged after 120 s: {other:?}"),
            _ => std::thread::sleep(Duration::from_secs(2)),
        }
    }
    fig("the churn stopped → --dry-run --diff clean".into(), settled.elapsed().as_secs_f64(), "s");

    let metrics = node.exec(&["curl", "-sf", "http://127.0.0.1:10249/metrics"])?;
    let syncs = histogram_buckets(&metrics, "kubeproxy_sync_proxy_rules_duration_seconds");
    fig("syncs".into(), syncs.last().map_or(0.0, |b| b.1), "");
    for (name, metric) in [
        ("sync time", "kubeproxy_sync_proxy_rules_duration_seconds"),
        ("network programming latency", "kubeproxy_network_programming_duration_seconds"),
    ] {
        let buckets = histogram_buckets(&metrics, metric);
        for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
            let v = histogram_quantile(&buckets, q).unwrap_or(f64::NAN);
            fig(format!("{name} {label} (histogram bucket bound)"), v * 1000.0, "ms");
        }
    }
    let text = std::fs::read_to_string(&log)?;
    let errors = unexplained_log_lines(&text, &[&["kube_proxy_rs::startup::oom: could not set oom_score_adj"]]);
    fig("WARN/ERROR log lines".into(), errors.len() as f64, "");
    for line in errors.iter().take(5) {
        eprintln!("{line}");
    }
    let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    let _ = child.wait();
    Ok(out)
}

fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmRSS")?;
    Ok(kib / 1024.0)
}
