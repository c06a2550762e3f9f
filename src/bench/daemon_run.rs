//! `kpr-bench daemon`: the real daemon binary on a generated cluster, as an
//! operator runs it. The cluster is written as manifest files ([`Layout`]:
//! one `kind: List` file per 500 objects, one `kind: List` file of them all,
//! or one file per object), or served by the test
//! API server inside the daemon's namespace (`--source api`: the daemon's
//! kube-rs watchers list and watch it through `--master`); the daemon runs in
//! iptables mode (or IPVS mode, in the VM) inside a network namespace of its own (`ip netns exec`,
//! so the host's tables are never touched), and the bench reads what a
//! user sees:
//!
//! - time from start to the first complete sync (every family the daemon
//!   runs: the log's first `sync finished` line with `failed=0` per
//!   family; syncs that failed before it are counted: [`FirstSyncs`]);
//! - the iptables tool's own restore of the same rules (`iptables-save` of
//!   the namespace after the first sync, restored with `--noflush` into a
//!   fresh namespace, as the daemon's restore does), for comparison; on the
//!   nf_tables backend the daemon's `--dry-run` text restored without
//!   `--noflush` (see `run_daemon`);
//! - CPU of the daemon and its children (iptables-restore, iptables-save;
//!   `/proc/PID/stat` utime+stime+cutime+cstime) while nothing changes, over
//!   `idle` seconds after the first sync;
//! - RSS (VmRSS) of the daemon 60 s after the first sync, and its peak RSS
//!   (VmHWM) at the end;
//! - with `--source api`, optionally: endpoint-change latency (one
//!   EndpointSlice update at a time, from the API server's answer to the
//!   log line of the sync that carried it, after its restore), and CPU
//!   during a churn of updates.
//!
//! Needs root and the iptables tools of the chosen flavour.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use serde_json::Value;

use super::gen::{node_ip, Cluster, ClusterSpec, THIS_NODE};
use super::log_field;
use crate::msgs::{Change, SourceEvent};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub spec: ClusterSpec,
    /// The daemon binary.
    pub binary: PathBuf,
    /// `legacy` or `nft`: the iptables the daemon finds first on its PATH.
    pub flavour: String,
    /// The proxy mode: `iptables`, `nftables` or `ipvs` (no tool comparison then).
    pub mode: String,
    /// How long to watch the idle daemon.
    pub idle: Duration,
    /// The cluster's dual-stack twin ([`super::dual`]).
    pub dual_stack: bool,
    /// With `dual_stack`: every this many-th Service is dual-stack (1: all).
    pub dual_every: usize,
    /// How the manifest files hold the objects.
    pub layout: Layout,
    /// The config's syncPeriod.
    pub sync_period: Duration,
    /// Serve the cluster from the test API server (inside the daemon's
    /// namespace) instead of manifest files.
    pub api_source: bool,
    /// After the idle watch: this many EndpointSlice updates a second
    /// through the API server (needs `api_source`), for this long.
    pub churn: Option<(u32, Duration)>,
    /// After the idle watch: this many EndpointSlice updates one at a
    /// time, each timed to the sync that carried it (needs `api_source`).
    pub latency: Option<u32>,
    /// nftables mode's ruleset (`nftables.ruleset`).
    pub nftables_ruleset: crate::plan::nftables::NftRuleset,
    /// Also load the same rules with the tool alone (`nft -f` of
    /// upstream's text at 10,000 services takes minutes).
    pub tool: bool,
    /// How long every family's first sync may take from the start.
    pub first_sync_timeout: Duration,
    /// Copy the daemon's log here once it has stopped (the work directory
    /// is reused by the next run).
    pub keep_log: Option<PathBuf>,
}

/// How the manifest files hold the cluster's objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One `kind: List` file per 500 objects.
    Lists,
    /// One `kind: List` file of every object.
    OneFile,
    /// One file per object.
    PerObject,
}

impl Layout {
    /// The name `--layout` takes.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Lists => "lists",
            Layout::OneFile => "one-file",
            Layout::PerObject => "per-object",
        }
    }

    /// The layout named `name`.
    pub fn named(name: &str) -> Option<Layout> {
        [Layout::Lists, Layout::OneFile, Layout::PerObject].into_iter().find(|l| l.name() == name)
    }
}

/// The figure [`run_daemon`] reports as the peak RSS.
pub const PEAK_RSS: &str = "peak RSS (VmHWM) of the daemon";
/// The figure [`run_daemon`] reports as the RSS a minute after the first sync.
pub const RSS_AFTER: &str = "RSS (VmRSS) of the daemon 60 s after the first sync";
/// The figure [`run_daemon`] reports as the time to the first sync.
pub const FIRST_SYNC: &str = "start → first complete sync (every family)";
/// The figures [`run_daemon`] reports as the endpoint-change latency.
pub const CHANGE_P50: &str = "endpoint change → its sync finished, p50";
pub const CHANGE_P99: &str = "endpoint change → its sync finished, p99";

/// One figure.
#[derive(Debug, Clone)]
pub struct Figure {
    pub metric: String,
    pub value: f64,
    pub unit: &'static str,
}

/// A network namespace, deleted on drop.
pub(crate) struct Netns(pub(crate) String);

impl Netns {
    pub(crate) fn new(name: String) -> anyhow::Result<Netns> {
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run("ip", &["netns", "add", &name])?;
        let ns = Netns(name);
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub(crate) fn exec(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["netns", "exec", &self.0];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// `args` with `input` on stdin; how long it took.
    fn pipe(&self, args: &[&str], input: &str) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            // A lock of its own: the daemon's periodic checks hold the
            // shared /run/xtables.lock now and then, which is not the tool's cost.
            .env("XTABLES_LOCKFILE", std::env::temp_dir().join("kpr-bench-tool-xtables.lock"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("{args:?}"))?;
        // A tool that fails early closes its stdin: its stderr says why.
        let written = child.stdin.take().context("stdin")?.write_all(input.as_bytes());
        let out = child.wait_with_output()?;
        ensure!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        written.with_context(|| format!("{args:?}: writing its input"))?;
        Ok(t.elapsed())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Makes `dir` hold `iptables`, `ip6tables` and their `-save` and
/// `-restore` as links to `flavour`'s tools (`legacy` or `nft`, found on
/// PATH or in /usr/sbin), for a daemon whose PATH starts with `dir`.
/// Links already there are replaced.
pub fn iptables_shims(dir: &Path, flavour: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = std::env::var("PATH").unwrap_or_default();
    for base in ["iptables", "ip6tables"] {
        for suffix in ["", "-save", "-restore"] {
            let tool = format!("{base}-{flavour}{suffix}");
            let target = (path.split(':').chain(["/usr/sbin"]))
                .map(|d| Path::new(d).join(&tool))
                .find(|p| p.exists())
                .with_context(|| format!("{tool} not found on PATH or in /usr/sbin"))?;
            let link = dir.join(format!("{base}{suffix}"));
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&target, &link).with_context(|| format!("linking {}", link.display()))?;
        }
    }
    Ok(())
}

fn run(bin: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(bin).args(args).output().with_context(|| format!("{bin} {args:?}"))?;
    ensure!(out.status.success(), "{bin} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The object a source event carries, as manifest JSON.
pub fn object(ev: &SourceEvent) -> Option<Value> {
    let applied = |v: Result<Value, serde_json::Error>, api: &str, kind: &str| {
        let mut v = v.ok()?;
        v["apiVersion"] = Value::from(api);
        v["kind"] = Value::from(kind);
        Some(v)
    };
    match ev {
        SourceEvent::Service(Change::Applied(s)) => applied(serde_json::to_value(&**s), "v1", "Service"),
        SourceEvent::EndpointSlice(Change::Applied(s)) => {
            applied(serde_json::to_value(&**s), "discovery.k8s.io/v1", "EndpointSlice")
        }
        SourceEvent::Node(Change::Applied(n)) => applied(serde_json::to_value(&**n), "v1", "Node"),
        _ => None,
    }
}

/// Writes the events' objects as manifest files in `dir`.
pub fn write_manifests(dir: &Path, events: &[SourceEvent], layout: Layout) -> anyhow::Result<usize> {
    let objects: Vec<Value> = events.iter().filter_map(object).collect();
    let per_file = match layout {
        Layout::Lists => 500,
        Layout::OneFile => objects.len().max(1),
        Layout::PerObject => {
            for (i, o) in objects.iter().enumerate() {
                std::fs::write(dir.join(format!("object-{i:06}.json")), serde_json::to_vec(o)?)?;
            }
            return Ok(objects.len());
        }
    };
    for (i, chunk) in objects.chunks(per_file).enumerate() {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": chunk});
        std::fs::write(dir.join(format!("objects-{i:04}.json")), serde_json::to_vec(&list)?)?;
    }
    Ok(objects.len())
}

/// utime + stime + cutime + cstime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("stat format")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14 → index 11.
    let ticks: f64 = f[11..15].iter().map(|v| v.parse::<f64>().unwrap_or(0.0)).sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    Ok(ticks / hz)
}

/// A `/proc/PID/status` memory figure (`VmHWM`, `VmRSS`) in MB.
fn status_mb(pid: u32, field: &str) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':'))).context("field")?;
    let kb: f64 = line.split_whitespace().nth(1).with_context(|| format!("{field} value"))?.parse()?;
    Ok(kb / 1024.0)
}

/// Each family's first `sync finished` line without a failed kernel op,
/// in the order they came: (family, the sync's own `ms=`), and how many
/// syncs failed before them. A first sync can fail for reasons outside the
/// daemon (another process holding the xtables lock longer than `-w 5` on a
/// shared machine), and the daemon retries it: timing the failed one would
/// report a sync that wrote nothing.
#[derive(Debug, Default, PartialEq)]
pub struct FirstSyncs {
    pub complete: Vec<(String, f64)>,
    pub failed_before: usize,
}

impl FirstSyncs {
    /// Reads a daemon's log text.
    pub fn of_log(text: &str) -> FirstSyncs {
        let mut out = FirstSyncs::default();
        for line in text.lines().filter(|l| l.contains("sync finished")) {
            let field = |name| log_field(line, name);
            let family = field("ip_family").unwrap_or_default().trim_matches('"').to_string();
            if out.complete.iter().any(|(f, _)| *f == family) {
                continue;
            }
            match field("failed") {
                Some("0") => out.complete.push((family, field("ms").and_then(|v| v.parse().ok()).unwrap_or(f64::NAN))),
                _ => out.failed_before += 1,
            }
        }
        out
    }

    fn of(log: &Path) -> FirstSyncs {
        FirstSyncs::of_log(&std::fs::read_to_string(log).unwrap_or_default())
    }
}

struct Running {
    child: Child,
    log: PathBuf,
    /// Where the log is copied once the daemon has stopped.
    keep: Option<PathBuf>,
}

impl Running {
    /// The log's path to name in an error: where it is kept, if it is.
    fn log_path(&self) -> &Path {
        self.keep.as_deref().unwrap_or(&self.log)
    }

    fn stop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
        if let Some(keep) = &self.keep {
            if let Err(e) = std::fs::copy(&self.log, keep) {
                eprintln!("kpr-bench daemon: cannot keep the log at {}: {e}", keep.display());
            }
        }
    }
}

/// Runs the measurement; figures in the order measured.
pub fn run_daemon(opts: &Options) -> anyhow::Result<Vec<Figure>> {
    let mut out = Vec::new();
    let mut fig = |metric: &str, value: f64, unit: &'static str| {
        out.push(Figure { metric: metric.to_string(), value: (value * 1000.0).round() / 1000.0, unit })
    };
    let work = tempfile_dir("daemon")?;
    let manifests = work.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let cluster = Cluster::new(opts.spec)?;
    let events = cluster.initial_events();
    let events = if opts.dual_stack { super::dual::dual_stack_every(&events, opts.dual_every) } else { events };
    drop(cluster);
    let objects = write_manifests(&manifests, &events, opts.layout)?;
    fig("objects in the manifest files", objects as f64, "objects");

    let pid = std::process::id();
    let node = Netns::new(format!("kpr-bd-{pid}"))?;
    let mut api = match opts.api_source {
        true => Some(ApiInNetns::start(&node.0, &events)?),
        false => None,
    };
    drop(events);
    // The node's address (NodePorts are planned on it), and its IPv6 twin.
    node.exec(&["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"])?;
    node.exec(&["ip", "addr", "add", &format!("{}/16", node_ip(0)), "dev", "eth0"])?;
    if opts.dual_stack {
        let v6 = super::dual::v6_of(node_ip(0));
        node.exec(&["ip", "addr", "add", &format!("{v6}/64"), "dev", "eth0", "nodad"])?;
    }
    if !opts.dual_stack {
        // Single-stack as measured before dual-stack existed: no IPv6 proxier.
        node.exec(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])?;
    }
    node.exec(&["ip", "link", "set", "eth0", "up"])?;
    node.exec(&["ip", "link", "set", "eth1", "up"])?;
    // The flavour first on the daemon's PATH.
    let shims = work.join("bin");
    iptables_shims(&shims, &opts.flavour)?;
    let cidr = if opts.dual_stack { "10.0.0.0/8,fd00::/16" } else { "10.0.0.0/8" };
    let config = work.join("config.yaml");
    let period = format!("{}s", opts.sync_period.as_secs());
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\n\
             hostnameOverride: {THIS_NODE}\nclusterCIDR: {cidr}\n{mode}:\n  syncPeriod: {period}\n  minSyncPeriod: 1s\n{ruleset}",
            mode = opts.mode,
            ruleset = if opts.mode == "nftables" { format!("  ruleset: {}\n", opts.nftables_ruleset) } else { String::new() },
        ),
    )?;
    let log = work.join("daemon.log");
    let path = format!("{}:{}", shims.display(), std::env::var("PATH").unwrap_or_default());
    let t0 = Instant::now();
    let source: [std::ffi::OsString; 2] = match &api {
        Some(api) => ["--master".into(), api.url.clone().into()],
        None => ["--manifests".into(), manifests.clone().into()],
    };
    let child = Command::new("ip")
        .args(["netns", "exec", &node.0])
        .arg(&opts.binary)
        .arg("--config")
        .arg(&config)
        .args(&source)
        .env("PATH", &path)
        // A lock of its own: the daemon's rules live in its own namespace,
        // and the host-wide /run/xtables.lock is held by whatever else runs
        // iptables meanwhile (other benches, tests), whose restores would
        // make the daemon's fail after `-w 5` and resync.
        .env("XTABLES_LOCKFILE", work.join("xtables.lock"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting {}", opts.binary.display()))?;
    let mut daemon = Running { child, log: log.clone(), keep: opts.keep_log.clone() };
    let families = if opts.dual_stack { 2 } else { 1 };
    let deadline = t0 + opts.first_sync_timeout;
    while FirstSyncs::of(&log).complete.len() < families {
        if let Ok(Some(status)) = daemon.child.try_wait() {
            bail!("the daemon exited ({status}); log {}", daemon.log_path().display());
        }
        if Instant::now() > deadline {
            let secs = opts.first_sync_timeout.as_secs();
            bail!("no first sync in {secs} s; log {}", daemon.log_path().display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let synced = Instant::now();
    fig(FIRST_SYNC, t0.elapsed().as_secs_f64(), "s");
    let first = FirstSyncs::of(&log);
    for (_, ms) in &first.complete {
        fig("of which the first sync itself (its log line)", ms / 1000.0, "s");
    }
    // Not 0: the figures above include syncs retried after a kernel op
    // failed (the log says why: e.g. the xtables lock held by another
    // process on a shared machine).
    fig("syncs with a failed kernel op before the first complete one", first.failed_before as f64, "syncs");

    // The tool alone, on the same rules. On the nf_tables backend
    // `iptables-nft-save` of 10,000 services takes more than 15 minutes and
    // a `--noflush` restore of it longer still, so the rules are the
    // daemon's own `--dry-run` text, restored plainly (flushing the tables);
    // nftables mode's text is what upstream pipes to `nft -f`.
    let nftables = opts.mode == "nftables";
    let dry = if opts.tool && ((opts.flavour == "nft" && opts.mode == "iptables") || nftables) {
        let out = Command::new("ip")
            .args(["netns", "exec", &node.0])
            .arg(&opts.binary)
            .arg("--dry-run")
            .arg("--config")
            .arg(&config)
            .arg("--manifests")
            .arg(&manifests)
            .env("PATH", &path)
            .stderr(Stdio::null())
            .output()
            .context("kube-proxy-rs --dry-run")?;
        ensure!(out.status.success(), "kube-proxy-rs --dry-run failed");
        let headings: &[&str] = if nftables { &["# nftables"] } else { &["# iptables", "# ip6tables"] };
        dry_run_sections(&String::from_utf8_lossy(&out.stdout), headings)
    } else {
        Vec::new()
    };
    let compared = if opts.mode == "ipvs" || !opts.tool { 0 } else { families };
    for (i, (tool, label)) in [("iptables", "IPv4"), ("ip6tables", "IPv6")].iter().take(compared).enumerate() {
        let fresh = Netns::new(format!("kpr-bdt-{pid}"))?;
        if nftables {
            let text = dry.get(i).context("no # nftables section in the dry run")?;
            let took = fresh.pipe(&["nft", "-f", "-"], text)?;
            fig(&format!("{label}: nft -f of the same text alone"), took.as_secs_f64(), "s");
            let count = text.lines().filter(|l| l.starts_with("add rule")).count();
            fig(&format!("{label}: rules"), count as f64, "rules");
            continue;
        }
        let restore = format!("{tool}-{}-restore", opts.flavour);
        let (rules, took, how) = match dry.get(i) {
            Some(text) => (text.clone(), fresh.pipe(&[&restore, "-w", "5"], text)?, "plain"),
            None => {
                let saved = without_nfacct(&node.exec(&[&format!("{tool}-{}-save", opts.flavour)])?);
                let took = fresh.pipe(&[&restore, "-w", "5", "--noflush"], &saved)?;
                (saved, took, "--noflush")
            }
        };
        fig(&format!("{label}: {restore} ({how}) of the same rules alone"), took.as_secs_f64(), "s");
        let count = rules.lines().filter(|l| l.starts_with("-A") || l.starts_with("-I")).count();
        fig(&format!("{label}: rules"), count as f64, "rules");
    }

    let daemon_pid = daemon.child.id();
    let (c0, w0) = (cpu_seconds(daemon_pid)?, Instant::now());
    std::thread::sleep(opts.idle);
    let (c1, wall) = (cpu_seconds(daemon_pid)?, w0.elapsed());
    let pct = 100.0 * (c1 - c0) / wall.as_secs_f64();
    fig(&format!("idle CPU over {} s (daemon + its children)", wall.as_secs()), pct, "% of a core");
    if let Some(wait) = (synced + Duration::from_secs(60)).checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
    fig(RSS_AFTER, status_mb(daemon_pid, "VmRSS")?, "MB");
    let syncs = |log: &Path| std::fs::read_to_string(log).unwrap_or_default().matches("sync finished").count();
    if let Some(changes) = opts.latency {
        let api = api.as_mut().context("--latency needs --source api")?;
        let mut took = Vec::new();
        for n in 0..changes {
            // Clear of minSyncPeriod (1 s) since the last sync: the change
            // starts its sync at once.
            std::thread::sleep(Duration::from_millis(1100));
            let seen = std::fs::metadata(&log)?.len();
            let t = Instant::now();
            api.flip(n as usize)?;
            took.push(wait_for_change_sync(&log, seen, t)?.as_secs_f64() * 1000.0);
        }
        fig("endpoint changes timed (one at a time)", changes as f64, "changes");
        fig(CHANGE_P50, super::stats::quantile(&took, 0.5), "ms");
        fig(CHANGE_P99, super::stats::quantile(&took, 0.99), "ms");
    }
    if let Some((rate, seconds)) = opts.churn {
        let api = api.as_mut().context("--churn needs --source api")?;
        let before = syncs(&log);
        let (c0, w0) = (cpu_seconds(daemon_pid)?, Instant::now());
        let updates = api.churn(rate, seconds)?;
        // The last updates' syncs: minSyncPeriod (1 s) and the sync itself.
        std::thread::sleep(Duration::from_secs(2));
        let (c1, wall) = (cpu_seconds(daemon_pid)?, w0.elapsed());
        let pct = 100.0 * (c1 - c0) / wall.as_secs_f64();
        fig(&format!("EndpointSlice updates through the API server ({rate}/s)"), updates as f64, "updates");
        fig(
            &format!("CPU during the churn and 2 s after, {} s (daemon + kernel work in its syscalls)", wall.as_secs()),
            pct,
            "% of a core",
        );
        fig("syncs during the churn (every family)", (syncs(&log) - before) as f64, "syncs");
    }
    fig("syncs logged by the end (every family)", syncs(&log) as f64, "syncs");
    fig(PEAK_RSS, status_mb(daemon_pid, "VmHWM")?, "MB");
    drop(daemon);
    drop(api);
    let _ = std::fs::remove_dir_all(&work);
    Ok(out)
}

/// How long after `t` the first `sync finished` line of a sync with
/// changed service ports appears in `log` beyond its first `seen` bytes.
fn wait_for_change_sync(log: &Path, seen: u64, t: Instant) -> anyhow::Result<Duration> {
    let deadline = t + Duration::from_secs(60);
    loop {
        let text = std::fs::read(log)?;
        let new = String::from_utf8_lossy(text.get(seen as usize..).unwrap_or_default());
        if new.lines().any(carries_a_change) {
            return Ok(t.elapsed());
        }
        ensure!(Instant::now() < deadline, "no sync carried the change in 60 s; log {}", log.display());
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A log line of a finished sync that wrote changed service ports.
fn carries_a_change(line: &str) -> bool {
    line.contains("sync finished") && log_field(line, "ports").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) > 0
}

/// The tool inputs of a `--dry-run`, one per family: the sections whose
/// heading starts with one of `headings` (`# iptables` / `# ip6tables`;
/// `# nftables` / `# nftables ipv6`).
fn dry_run_sections(text: &str, headings: &[&str]) -> Vec<String> {
    let mut sections: Vec<String> = Vec::new();
    for line in text.lines() {
        if headings.iter().any(|h| line.starts_with(h)) {
            sections.push(String::new());
        } else if let Some(section) = sections.last_mut() {
            section.push_str(line);
            section.push('\n');
        }
    }
    sections
}

/// The test API server serving the cluster on 127.0.0.1 inside a network
/// namespace, until dropped.
struct ApiInNetns {
    url: String,
    /// Dropping the server stops it.
    server: crate::testkit::apiserver::ApiServer,
    _serving: std::sync::mpsc::Sender<()>,
    /// EndpointSlices the churn updates, as last written.
    slices: Vec<Value>,
}

impl ApiInNetns {
    fn start(netns: &str, events: &[SourceEvent]) -> anyhow::Result<ApiInNetns> {
        let (server, serving) = crate::testkit::apiserver::ApiServer::start_in_netns(netns);
        let mut slices = Vec::new();
        for (ev, o) in events.iter().filter_map(|e| Some((e, object(e)?))) {
            server.create(&o).map_err(|e| anyhow::anyhow!("creating an object in the test API server: {e:?}"))?;
            if matches!(ev, SourceEvent::EndpointSlice(_)) && slices.len() < CHURN_SLICES {
                slices.push(o);
            }
        }
        Ok(ApiInNetns { url: server.url(), server, _serving: serving, slices })
    }

    /// `rate` EndpointSlice updates a second for `seconds`, each flipping
    /// the first endpoint's `ready` of the next slice in turn (a partial
    /// sync's worth of work per service: its endpoint left, or came back).
    /// How many were made.
    fn churn(&mut self, rate: u32, seconds: Duration) -> anyhow::Result<u64> {
        let every = Duration::from_secs(1) / rate.max(1);
        let start = Instant::now();
        let mut n: u64 = 0;
        while start.elapsed() < seconds {
            self.flip(n as usize)?;
            n += 1;
            if let Some(wait) = (every * n as u32).checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        Ok(n)
    }

    /// Update `n` of the churn: flips the first endpoint's `ready` of the
    /// `n`-th slice (in turn).
    fn flip(&mut self, n: usize) -> anyhow::Result<()> {
        let slices = &mut self.slices;
        ensure!(!slices.is_empty(), "no EndpointSlice to churn");
        let len = slices.len();
        let slice = &mut slices[n % len];
        let ready = &mut slice["endpoints"][0]["conditions"]["ready"];
        *ready = Value::Bool(!ready.as_bool().unwrap_or(true));
        self.server.update(&*slice).map_err(|e| anyhow::anyhow!("updating an EndpointSlice: {e:?}"))?;
        Ok(())
    }
}

/// The EndpointSlices the churn cycles through (each update touches one).
const CHURN_SLICES: usize = 1000;

/// The saved rules without their nfacct matches: the fresh namespace the
/// tool restores into has no nfacct objects (the daemon creates them in its
/// own), and the counters are not what is compared.
fn without_nfacct(saved: &str) -> String {
    use crate::plan::iptables::context::{NFACCT_CT_STATE_INVALID, NFACCT_LOCALHOST_NODEPORTS};
    let mut out = saved.to_string();
    for name in [NFACCT_CT_STATE_INVALID, NFACCT_LOCALHOST_NODEPORTS] {
        // iptables-save prints the name after two spaces.
        for spaces in ["  ", " "] {
            out = out.replace(&format!(" -m nfacct --nfacct-name{spaces}{name}"), "");
        }
    }
    out
}

/// The file name of a `--matrix` cell's kept daemon log, e.g.
/// `10000-iptables-file-per-object-dual.log`.
pub fn cell_log_name(services: usize, mode: &str, source: &str, dual: bool) -> String {
    let source = source.to_lowercase().replace(' ', "-");
    format!("{services}-{mode}-{source}-{}.log", if dual { "dual" } else { "single" })
}

pub fn tempfile_dir(what: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("kpr-bench-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::{cell_log_name, FirstSyncs};

    #[test]
    fn a_matrix_cells_log_is_named_by_its_cell() {
        assert_eq!(
            cell_log_name(10_000, "iptables", "file per object", true),
            "10000-iptables-file-per-object-dual.log"
        );
        assert_eq!(cell_log_name(1000, "nftables", "API", false), "1000-nftables-api-single.log");
    }

    #[test]
    fn the_first_complete_sync_per_family_counts_not_a_failed_one() {
        let log = "\
x INFO kube_proxy_rs::actors::coordinator: sync finished ip_family=\"IPv4\" generation=1 full=true periodic=false ms=11811.5 ports=12344 failed=1
x WARN kube_proxy_rs::actors::kernel_actor: kernel op failed actor=\"iptables\" generation=1 error=Can't lock /run/xtables.lock
x INFO kube_proxy_rs::actors::coordinator: sync finished ip_family=\"IPv6\" generation=1 full=true periodic=false ms=12715.4 ports=6207 failed=0
x INFO kube_proxy_rs::actors::coordinator: sync finished ip_family=\"IPv4\" generation=2 full=true periodic=false ms=44522.5 ports=0 failed=0
x INFO kube_proxy_rs::actors::coordinator: sync finished ip_family=\"IPv4\" generation=3 full=false periodic=true ms=0.1 ports=0 failed=0
";
        let first = FirstSyncs::of_log(log);
        assert_eq!(first.complete, vec![("IPv6".to_string(), 12715.4), ("IPv4".to_string(), 44522.5)]);
        assert_eq!(first.failed_before, 1);
        assert_eq!(FirstSyncs::of_log("").complete.len(), 0);
    }

    #[test]
    fn a_sync_carries_a_change_when_it_wrote_changed_service_ports() {
        let line = |ports| {
            format!("INFO sync finished ip_family=\"IPv4\" generation=7 full=false ms=3.1 ports={ports} failed=0")
        };
        assert!(super::carries_a_change(&line(1)));
        assert!(super::carries_a_change(&line(12)));
        assert!(!super::carries_a_change(&line(0)), "a periodic sync of a quiet cluster");
        assert!(!super::carries_a_change("INFO sync started generation=7 ports=1"));
    }
}
