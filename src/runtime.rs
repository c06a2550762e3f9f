//! The running daemon, in IPVS, iptables or nftables mode: checks the kernel, sets
//! upstream's sysctls, removes what the other mode left (a node switching
//! modes), builds the kernel handles, starts one actor per subsystem and
//! the coordinator, connects the source, and runs until SIGTERM/SIGINT,
//! leaving the kernel state in place (as upstream, so traffic keeps flowing
//! during a rolling update), or until the Node changes what it started
//! with (exit 1 for a restart, [`crate::model::node_change`]). Also
//! `--init-only` (the node's set-up, then exit) and `--cleanup`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use actix::prelude::*;

use crate::actors::coordinator::{
    AddrSource, ContextBuilder, Coordinator, IptablesDataplane, IpvsDataplane, NftContextBuilder, NftablesDataplane,
    Reconfigure, RulesRenderer, Settings, Shutdown,
};
use crate::actors::source::kube as api;
use crate::actors::source::manifests;
use crate::actors::wiring::{start_iptables_actors, start_ipvs_actors, start_nftables_actors, IpvsKernels};
use crate::config::{KubeProxyConfiguration, LocalMode, ProxyMode};
use crate::daemon::{self, StartError};
use crate::health::{self, ProxyHealth};
use crate::http::{self, ServiceHealthServers, SharedServiceHealth};
use crate::kernel::conntrack::NetlinkConntrack;
use crate::kernel::ipset::netlink::NetlinkIpset;
use crate::kernel::ipset::IpsetHandle;
use crate::kernel::iptables::IptablesHandle;
use crate::kernel::ipvs::graceful::{GracefulIpvs, Ownership};
use crate::kernel::ipvs::netlink::{IpvsError, NetlinkIpvs};
use crate::kernel::link::DummyLink;
use crate::kernel::netlink::Errno;
use crate::kernel::nftables::{self as nft_kernel, NetlinkNftables, TransactionError};
use crate::kernel::{addrs, sysctl};
use crate::metrics::ProxyMetrics;
use crate::model::node_change::{NodeBaseline, NodeRestart};
use crate::model::NodeInfo;
use crate::msgs::SourceBatch;
use crate::net::IpFamily;
use crate::nfacct::{self, Nfacct, NfacctRules};
use crate::observe::SyncHooks;
use crate::plan::iptables::{self as iptables_plan, iptables_context, HostFeatures};
use crate::plan::nftables::names::TABLE as NFT_TABLE;
use crate::plan::nftables::nftables_context;
use crate::plan::{rules_ipvs, IpvsPlanner, IpvsSet};
use crate::reload;
use crate::settings::{self, FamilySettings};
use crate::startup::init_only;
use crate::startup::node_watch::NodeWatch;
use crate::stats::StatsRegistry;
use std::sync::Arc;

/// Test knob: how often terminating real servers are checked (default: upstream's minute).
const ENV_RS_CHECK_INTERVAL: &str = "KUBE_PROXY_RS_RS_CHECK_INTERVAL";

/// Connects to IPVS, or says in one line why it can't.
async fn connect_ipvs() -> Result<NetlinkIpvs, StartError> {
    NetlinkIpvs::connect().await.map_err(StartError::Ipvs)
}

fn kernel_release() -> String {
    nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default()
}

/// Upstream's IPVS sysctls; a failure to set one is fatal for
/// net/ipv4/vs/conntrack (as upstream), logged for the others.
fn set_sysctls(cfg: &KubeProxyConfiguration) -> Result<(), StartError> {
    for (path, value) in sysctl::ipvs_sysctls(cfg.ipvs.strict_arp, &kernel_release()) {
        match sysctl::ensure_sysctl(path, value) {
            Ok(changed) => tracing::debug!(sysctl = path, value, changed, "sysctl"),
            Err(e) if path == "net/ipv4/vs/conntrack" => return Err(StartError::Kernel(e)),
            Err(e) => tracing::warn!(sysctl = path, value, error = %e, "could not set sysctl"),
        }
    }
    Ok(())
}

async fn set_ipvs_timeouts(ipvs: &NetlinkIpvs, cfg: &KubeProxyConfiguration) {
    let Some((tcp, fin, udp)) = cfg.ipvs_timeouts() else { return };
    if let Err(e) = ipvs.set_timeouts(tcp, fin, udp).await {
        tracing::warn!(error = %e, "could not set IPVS timeouts");
    }
}

fn check_interval() -> Option<Duration> {
    let text = std::env::var(ENV_RS_CHECK_INTERVAL).ok()?;
    text.parse::<crate::config::GoDuration>().ok().map(|d| d.get())
}

/// Where Services, EndpointSlices and the Node come from.
pub enum Source {
    Manifests(PathBuf),
    /// The Kubernetes API, with `--master` if given.
    Api {
        master: Option<String>,
    },
}

/// How far the daemon goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Sets the node up and serves until stopped.
    Serve,
    /// `--init-only`: sets the node up (upstream's privileged
    /// initialization) and exits, serving nothing and writing no rules.
    InitOnly,
}

/// How the daemon ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// SIGTERM or SIGINT, or `--init-only` done: exit code 0.
    Stopped,
    /// The Node changed what the proxy started with: exit code 1, as
    /// upstream, so the DaemonSet restarts it.
    Restart(NodeRestart),
}

/// Runs the configured mode until SIGTERM or SIGINT (or, with
/// [`Purpose::InitOnly`], until the node is set up), with `zpages` on the
/// metrics server.
pub fn run(
    cfg: KubeProxyConfiguration,
    source: Source,
    reload: Reloader,
    purpose: Purpose,
    zpages: http::ZPages,
) -> Result<Exit, StartError> {
    // Before the runtime's threads exist: they inherit the blocked signals.
    let stop = crate::signals::watch().map_err(StartError::Signals)?;
    let system = actix_rt::System::new();
    let result = system.block_on(async move { run_async(cfg, source, reload, stop, purpose, zpages).await });
    // Actors that a late start-up error left behind are dropped with the
    // system, and actix starts them while dropping: inside the runtime's
    // context, or it panics ("there is no reactor running") instead of
    // logging the error.
    let runtime = system.runtime().tokio_runtime().handle().clone();
    let _inside = runtime.enter();
    drop(system);
    result
}

/// A source ready to start.
enum Ready {
    Manifests(PathBuf),
    Api(kube::Client),
}

/// How long to wait for our Node object at start (its IPs decide the family).
const NODE_WAIT: Duration = Duration::from_secs(30);

/// A running source; dropping it stops it.
enum Running {
    Manifests(manifests::ManifestWatcher),
    Api(actix_rt::task::JoinHandle<()>),
}

async fn run_async(
    cfg: KubeProxyConfiguration,
    source: Source,
    reload: Reloader,
    mut stop: crate::signals::Stop,
    purpose: Purpose,
    zpages: http::ZPages,
) -> Result<Exit, StartError> {
    // One daemon per network namespace, checked before anything is touched.
    crate::instance::acquire()?;
    let mode = cfg.proxy_mode();
    // Upstream's platformSetup: fatal when a setting cannot be written.
    crate::startup::conntrack::set_sysctls(&cfg.conntrack)?;
    let ipvs = match mode {
        ProxyMode::Ipvs => {
            tracing::warn!("{}", crate::config::IPVS_DEPRECATED);
            let ipvs = connect_ipvs().await?;
            set_sysctls(&cfg)?;
            set_ipvs_timeouts(&ipvs, &cfg).await;
            Some(ipvs)
        }
        ProxyMode::Iptables | ProxyMode::Nftables => None,
    };
    let node_name = cfg.hostname()?;
    let (node, ready) = match source {
        Source::Manifests(dir) => {
            // File by file: one file's objects decoded at a time (a whole scan
            // here was the daemon's peak, ≈ 69 MB at 10,000 services).
            let mut node = None;
            let _ = manifests::ManifestDir::new(&dir).scan_file_by_file(|r| {
                if node.is_none() {
                    node = daemon::our_node_object(&r.events, &node_name).cloned();
                }
            });
            (node, Ready::Manifests(dir))
        }
        Source::Api { master } => {
            let config = api::client_config(&cfg.client_connection, master.as_deref()).await?;
            let client = api::client(config)?;
            let node = api::wait_for_node(client.clone(), &node_name, NODE_WAIT).await?;
            (node.map(Arc::new), Ready::Api(client))
        }
    };
    let watch_pod_cidrs = cfg.local_mode() == LocalMode::NodeCidr;
    let baseline = NodeBaseline::new(&node_name, node.as_deref(), watch_pod_cidrs);
    let node = node.map(|n| NodeInfo::from_node(&n));
    if daemon::primary_family_is_a_fallback(&cfg, node.as_ref()) {
        tracing::warn!(
            node = %node_name,
            "Can't determine this node's IP (no Node address): falling back to IPv4 as the primary IP family; \
             if this is incorrect, please set the --bind-address flag"
        );
    }
    let families = daemon::detect_families(&cfg, node.as_ref())?;
    for family in families.all() {
        clean_other_mode(mode, family).await;
    }
    if purpose == Purpose::InitOnly {
        let runs_ipv4 = families.all().any(|f| f == IpFamily::V4);
        init_only::privileged_init(&cfg, runs_ipv4, &node_name, node.as_ref())?;
        tracing::info!("System initialized and --init-only specified");
        return Ok(Exit::Stopped);
    }
    crate::startup::oom::apply(cfg.oom_score_adj);
    // iptables mode's nfacct objects, before the rules that name them
    // (upstream's NewProxier); whatever fails costs only the counting.
    let nfacct = match mode {
        ProxyMode::Iptables => nfacct::set_up(&families.all().collect::<Vec<_>>(), nfacct::probe_match).await,
        ProxyMode::Ipvs | ProxyMode::Nftables => Nfacct::default(),
    };
    let registry = StatsRegistry::default();
    let (hooks, observe) = observability(&cfg, families, &node_name, node.as_ref(), &registry, zpages)?;
    if let Some(reader) = nfacct.reader() {
        observe.metrics.nfacct_counters(&nfacct.probe.counted(), reader);
    }
    // One proxier per family, as upstream's metaproxier: each its own
    // coordinator (model, schedule, retries) and actors, neither waiting on the other.
    let mut engines = Vec::new();
    for (family, hooks) in hooks {
        let registry = registry.with_suffix(&families.suffix(family));
        let host = host_features(family, nfacct.probe.rules(family)).await;
        let settings = settings::derive(&cfg, family, &node_name, host);
        let engine = match (&ipvs, mode) {
            (Some(ipvs), _) => {
                Engine::Ipvs { coordinator: start_ipvs(&settings, ipvs.clone(), &registry, hooks)?, ipvs: ipvs.clone() }
            }
            (None, ProxyMode::Nftables) => Engine::Nftables(start_nftables(&settings, &registry, hooks)?),
            (None, _) => Engine::Iptables(start_iptables(&settings, &registry, hooks, &nfacct).await?),
        };
        engines.push((family, engine));
    }
    let sinks: Vec<Recipient<SourceBatch>> = engines.iter().map(|(_, e)| e.events()).collect();
    let mut live = Live { cfg, node_name: node_name.clone(), engines, observe, nfacct: nfacct.probe };
    // Every family's coordinator sees every event (objects are shared, not
    // copied) and keeps what is of its family.
    let metrics = live.observe.metrics.clone();
    let ipvs_mode = ipvs.is_some();
    let (restart_tx, mut restart) = tokio::sync::mpsc::unbounded_channel();
    let node_watch = NodeWatch::new(baseline, restart_tx);
    let fanout = Arc::new(Fanout {
        sinks,
        metrics,
        claims: std::sync::Mutex::default(),
        ipvs_mode,
        node_name: node_name.clone(),
        node_watch,
    });
    let source_metrics = live.observe.metrics.clone();
    let running = match ready {
        Ready::Api(client) => {
            let sink = move |b: SourceBatch| fanout.send(b);
            Running::Api(actix_rt::spawn(api::run(client, node_name.clone(), source_metrics, sink)))
        }
        Ready::Manifests(dir) => {
            let metrics = live.observe.metrics.clone();
            let report =
                move |d: &manifests::Duplicate| metrics.object_ignored(&d.kind, &d.object, "duplicate", &d.detail);
            // The watcher's own thread waits until the coordinators took each
            // batch: its first scan then holds one file's objects at a time.
            let sink = move |b: SourceBatch| fanout.send_and_wait(b);
            Running::Manifests(manifests::spawn_reporting(dir, sink, report)?)
        }
    };
    tracing::info!(mode = mode.as_str(), node = %node_name, families = ?families.all().collect::<Vec<_>>(), "kube-proxy-rs started");
    let exit = run_until_stopped(&mut live, &reload, &mut stop, &mut restart).await;
    // Stop taking events, let the batches in flight finish, leave the kernel
    // as it is; a second SIGTERM or SIGINT meanwhile exits at once (crate::signals).
    futures::future::join_all(live.engines.iter().map(|(_, e)| e.shutdown())).await;
    tracing::info!("shutting down; kernel state left in place");
    match running {
        Running::Api(task) => task.abort(),
        Running::Manifests(watcher) => watcher.stop(),
    }
    System::current().stop();
    Ok(exit)
}

/// The sources' batches to every family's coordinator, after the Node
/// check, the metrics of ignored objects and the nodePort claims (shared by
/// the families).
struct Fanout {
    sinks: Vec<Recipient<SourceBatch>>,
    metrics: Arc<ProxyMetrics>,
    claims: std::sync::Mutex<crate::model::node_ports::NodePortClaims>,
    ipvs_mode: bool,
    /// The Node whose values count (the one the proxiers read).
    node_name: String,
    node_watch: NodeWatch,
}

impl Fanout {
    /// `b` as the coordinators take it; `None` once the daemon is restarting.
    fn filter(&self, b: SourceBatch) -> Option<SourceBatch> {
        if !self.node_watch.admit(&b) {
            return None;
        }
        report_ignored(&b, &self.metrics, self.ipvs_mode, &self.node_name);
        let (events, conflicts) = crate::sync::lock(&self.claims).filter(b.0);
        report_conflicts(&conflicts, &self.metrics);
        Some(SourceBatch(events))
    }

    /// From the actors' own thread: queued, not waited for.
    fn send(&self, b: SourceBatch) {
        let Some(b) = self.filter(b) else { return };
        for s in &self.sinks {
            s.do_send(b.clone());
        }
    }

    /// From another thread (never the actors'): returns once every
    /// coordinator handled the batch (or is gone).
    fn send_and_wait(&self, b: SourceBatch) {
        let Some(b) = self.filter(b) else { return };
        for s in &self.sinks {
            if futures::executor::block_on(s.send(b.clone())).is_err() {
                tracing::debug!("a coordinator is gone; its source batch is dropped");
            }
        }
    }
}

/// Logs and counts the objects every proxier ignores and the values they
/// skip inside the objects they take, once each (not once per family), and
/// in IPVS mode the Services' refused scheduler annotations.
fn report_ignored(batch: &SourceBatch, metrics: &ProxyMetrics, ipvs_mode: bool, node_name: &str) {
    use crate::model::notice::{ignored, ignored_values, ipvs_scheduler_refused};
    for v in batch.0.iter().flat_map(|ev| ignored_values(ev, node_name)) {
        daemon::warn_ignored_value(&v);
        metrics.value_ignored(v.kind, &v.object, v.value.field, &v.value.path, &v.value.detail());
    }
    for n in batch.0.iter().filter_map(ignored) {
        if n.warn {
            tracing::warn!(kind = n.kind, object = %n.object, reason = %n.detail, "ignoring object");
        } else {
            tracing::debug!(kind = n.kind, object = %n.object, reason = %n.detail, "ignoring object");
        }
        metrics.object_ignored(n.kind, &n.object, n.reason, &n.detail);
    }
    let annotated = if ipvs_mode { batch.0.as_slice() } else { &[] };
    for n in annotated.iter().filter_map(ipvs_scheduler_refused) {
        tracing::warn!(kind = n.kind, object = %n.object, reason = %n.detail, "refusing a Service's IPVS scheduler");
        metrics.object_ignored(n.kind, &n.object, n.reason, &n.detail);
    }
}

/// Logs and counts the nodePorts refused because another Service holds them.
fn report_conflicts(conflicts: &[crate::model::node_ports::Conflict], metrics: &ProxyMetrics) {
    for c in conflicts {
        let detail = format!("port {}: nodePort {} is already used by Service {}", c.port, c.node_port, c.holder);
        tracing::warn!(kind = "Service", object = %c.service, reason = %detail, "refusing a nodePort");
        metrics.object_ignored("Service", &c.service, "node_port_conflict", &detail);
    }
}

/// The running mode's coordinator.
enum Engine {
    Ipvs { coordinator: Addr<Coordinator<IpvsDataplane>>, ipvs: NetlinkIpvs },
    Iptables(Addr<Coordinator<IptablesDataplane>>),
    Nftables(Addr<Coordinator<NftablesDataplane>>),
}

impl Engine {
    fn events(&self) -> Recipient<SourceBatch> {
        match self {
            Engine::Ipvs { coordinator, .. } => coordinator.clone().recipient(),
            Engine::Iptables(c) => c.clone().recipient(),
            Engine::Nftables(c) => c.clone().recipient(),
        }
    }

    async fn shutdown(&self) {
        let done = match self {
            Engine::Ipvs { coordinator, .. } => coordinator.send(Shutdown).await,
            Engine::Iptables(c) => c.send(Shutdown).await,
            Engine::Nftables(c) => c.send(Shutdown).await,
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, "coordinator gone before shutdown");
        }
    }

    /// Applies a reloaded configuration's live part: `family`'s settings,
    /// derived anew (the host probed again; the nfacct counters as found at
    /// start, since the objects and rules stay).
    async fn reconfigure(&self, cfg: &KubeProxyConfiguration, family: IpFamily, node_name: &str, nfacct: NfacctRules) {
        let derived = settings::derive(cfg, family, node_name, host_features(family, nfacct).await);
        let settings = coordinator_settings(&derived);
        match self {
            Engine::Ipvs { coordinator, ipvs } => {
                if let Err(e) = set_sysctls(cfg) {
                    tracing::warn!(error = %e, "sysctls after reload");
                }
                set_ipvs_timeouts(ipvs, cfg).await;
                let dataplane = (settings.plan.clone(), rules_renderer(&derived));
                coordinator.do_send(Reconfigure::<IpvsDataplane> { settings, dataplane });
            }
            Engine::Iptables(c) => {
                let dataplane = context_builder(&derived);
                c.do_send(Reconfigure::<IptablesDataplane> { settings, dataplane });
            }
            Engine::Nftables(c) => {
                let dataplane = nft_context_builder(&derived);
                c.do_send(Reconfigure::<NftablesDataplane> { settings, dataplane });
            }
        }
    }
}

/// A node switching modes: removes what the other modes left (upstream's
/// CleanupLeftovers of the inactive proxiers: iptables and IPVS mode's
/// rules, sets and IPVS state when switching to nftables mode; our
/// nftables table when switching to iptables or IPVS mode). Only what is
/// there, so a plain restart touches nothing.
async fn clean_other_mode(mode: ProxyMode, family: IpFamily) {
    let others: &[&'static crate::msgs::chains::ChainProfile] = match mode {
        ProxyMode::Iptables => &[&rules_ipvs::PROFILE],
        ProxyMode::Ipvs => &[&iptables_plan::PROFILE],
        ProxyMode::Nftables => &[&iptables_plan::PROFILE, &rules_ipvs::PROFILE],
    };
    let mut found: Vec<&'static crate::msgs::chains::ChainProfile> = Vec::new();
    for other in others {
        match IptablesHandle::new(family).for_mode(other).has_leftovers().await {
            Ok(false) => {}
            Ok(true) => found.push(other),
            Err(e) => tracing::warn!(error = %e, mode = other.mode, "cannot check for the other mode's rules"),
        }
    }
    for other in &found {
        tracing::info!(mode = other.mode, "removing what the node's earlier proxy mode left");
    }
    let errors = match (mode, found.as_slice()) {
        (_, []) => Vec::new(),
        (ProxyMode::Iptables, _) => cleanup_ipvs_mode(family).await,
        (ProxyMode::Ipvs, _) => cleanup_iptables_mode(family).await,
        (ProxyMode::Nftables, found) => {
            // Both modes' chains in one restore when both are there: they share chains.
            let mut errors = match IptablesHandle::new(family).cleanup_modes(found).await {
                Ok(()) => Vec::new(),
                Err(e) => vec![format!("iptables ({family:?}): {e}")],
            };
            if found.iter().any(|p| p.mode == rules_ipvs::PROFILE.mode) {
                errors.extend(cleanup_ipvs_state(family).await);
            }
            errors
        }
    };
    for e in errors {
        tracing::warn!(error = %e, "cleaning up the other mode");
    }
    if mode != ProxyMode::Nftables {
        match delete_nftables_table(family).await {
            Ok(true) => tracing::info!(table = NFT_TABLE, "removed what the node's earlier nftables mode left"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "cleaning up nftables mode's table"),
        }
    }
}

/// Deletes nftables mode's `kube-proxy` table of `family` (upstream's
/// nftables CleanupLeftovers): `Ok(false)` when there was none.
async fn delete_nftables_table(family: IpFamily) -> Result<bool, String> {
    let nft = NetlinkNftables::new().map_err(|e| format!("nf_tables netlink socket: {e}"))?;
    match nft.apply(family, NFT_TABLE, &[nft_kernel::NftOp::DeleteTable]).await {
        Ok(()) => Ok(true),
        Err(TransactionError::Refused { errno, .. }) if errno == Errno::ENOENT => Ok(false),
        Err(e) => Err(format!("deleting table {} {NFT_TABLE}: {e}", nft_family_name(family))),
    }
}

fn nft_family_name(family: IpFamily) -> &'static str {
    crate::plan::nftables::ruleset::nft_family(family)
}

fn start_ipvs(
    s: &FamilySettings,
    ipvs: NetlinkIpvs,
    registry: &StatsRegistry,
    hooks: SyncHooks,
) -> Result<Addr<Coordinator<IpvsDataplane>>, StartError> {
    let family = s.family;
    let owned = Ownership { family, exclude: s.ipvs_exclude_cidrs.clone() };
    let mut graceful = GracefulIpvs::new(ipvs, owned);
    if let Some(every) = check_interval() {
        graceful = graceful.with_check_interval(every);
    }
    let ipset = NetlinkIpset::new().map_err(StartError::Kernel)?;
    let sets: BTreeMap<IpvsSet, IpsetHandle> =
        IpvsSet::ALL.iter().map(|s| (*s, IpsetHandle::new(&ipset, s.spec(family)))).collect();
    let conntrack = conntrack_handle(family, hooks.metrics())?;
    let iptables = IptablesHandle::new(family);
    let link = DummyLink::new().map_err(StartError::Kernel)?.with_family(family);
    let kernels = IpvsKernels { ipvs: graceful, sets, link, iptables, conntrack };
    let settings = coordinator_settings(s);
    let rules = rules_renderer(s);
    Ok(Coordinator::create(move |ctx| {
        // Drift an actor finds between syncs (the iptables canary vanished) makes the coordinator resync in full.
        let targets = start_ipvs_actors(kernels, registry, ctx.address().recipient());
        Coordinator::new(settings, targets, addr_source(), rules).with_observer(hooks)
    }))
}

/// The node's interface addresses, read at each sync (public for `kpr-bench`).
pub fn addr_source() -> AddrSource {
    Box::new(|| {
        addrs::local_addrs().unwrap_or_else(|e| {
            tracing::error!(error = %e, "reading the node's addresses");
            Vec::new()
        })
    })
}

/// iptables mode: the iptables and conntrack actors and the coordinator;
/// the first sync adopts (or deletes) the per-service chains already in
/// the kernel.
async fn start_iptables(
    s: &FamilySettings,
    registry: &StatsRegistry,
    hooks: SyncHooks,
    nfacct: &Nfacct,
) -> Result<Addr<Coordinator<IptablesDataplane>>, StartError> {
    let family = s.family;
    let mut iptables = IptablesHandle::new(family).for_mode(&iptables_plan::PROFILE);
    if let Some(client) = &nfacct.client {
        iptables = iptables.ensuring_nfacct(client.clone(), nfacct.probe.rules(family).objects());
    }
    let kernel_chains: Vec<String> = match iptables.chains("nat").await {
        Ok(chains) => chains.into_iter().collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the nat chains; stale service chains stay until found");
            Vec::new()
        }
    };
    let conntrack = conntrack_handle(family, hooks.metrics())?;
    let context = context_builder(s);
    let settings = coordinator_settings(s);
    Ok(Coordinator::create(move |ctx| {
        // A vanished canary (someone flushed our tables) makes the iptables
        // actor tell the coordinator, which resyncs in full.
        let targets = start_iptables_actors(iptables, conntrack, registry, ctx.address().recipient());
        let dataplane = IptablesDataplane::new(targets, addr_source(), context, &kernel_chains);
        Coordinator::with_dataplane(settings, dataplane).with_observer(hooks)
    }))
}

/// nftables mode: the nftables actor (this family's `kube-proxy` table) and
/// the conntrack actor, and the coordinator; its first sync lists the table
/// and adopts (or flushes and deletes) what an earlier run left.
fn start_nftables(
    s: &FamilySettings,
    registry: &StatsRegistry,
    hooks: SyncHooks,
) -> Result<Addr<Coordinator<NftablesDataplane>>, StartError> {
    let family = s.family;
    let nft = NetlinkNftables::new().map_err(StartError::Nftables)?;
    let conntrack = conntrack_handle(family, hooks.metrics())?;
    let context = nft_context_builder(s);
    let settings = coordinator_settings(s);
    Ok(Coordinator::create(move |ctx| {
        let targets = start_nftables_actors(nft, family, conntrack, registry, ctx.address().recipient());
        let dataplane = NftablesDataplane::new(family, targets, addr_source(), context);
        Coordinator::with_dataplane(settings, dataplane).with_observer(hooks)
    }))
}

/// The nftables planner's context for the current Node, ServiceCIDRs and addresses.
pub fn nft_context_builder(s: &FamilySettings) -> NftContextBuilder {
    let s = s.clone();
    Box::new(move |node: &NodeInfo, cidrs: &[ipnet::IpNet], addrs: &[crate::net::LocalAddr]| {
        nftables_context(&s.nftables_settings(node, cidrs), node, addrs)
    })
}

/// What iptables mode probes on the host (upstream's NewProxier), with the
/// nfacct counters `nfacct` found at start ([`crate::nfacct::set_up`]).
/// Public for `kpr-bench iptables`, which wires iptables mode as the daemon does.
pub async fn host_features(family: IpFamily, nfacct: NfacctRules) -> HostFeatures {
    let host = HostFeatures {
        random_fully: IptablesHandle::new(family).random_fully().await,
        conntrack_tcp_liberal: sysctl::is_on(iptables_plan::context::SYSCTL_TCP_BE_LIBERAL),
        ..HostFeatures::default()
    };
    nfacct.on(host)
}

/// The iptables planner's context for the current Node and addresses;
/// sets route_localnet when localhost NodePorts need it (upstream sets it
/// once at start; here also when a reload turns them on). Public for
/// `kpr-bench iptables`.
pub fn context_builder(s: &FamilySettings) -> ContextBuilder {
    let s = s.clone();
    Box::new(move |node: &NodeInfo, addrs: &[crate::net::LocalAddr]| {
        let ctx = iptables_context(&s.iptables_settings(node), node, addrs);
        if ctx.needs_route_localnet() {
            if let Err(e) = init_only::ensure_route_localnet() {
                tracing::warn!(error = %e, "cannot enable localhost NodePorts");
            }
        }
        ctx
    })
}

/// The coordinator's settings (public for `kpr-bench`).
pub fn coordinator_settings(s: &FamilySettings) -> Settings {
    Settings {
        plan: s.plan.clone(),
        min_sync: s.min_sync,
        max_sync: s.max_sync,
        burst: s.burst,
        model_gates: s.model_gates,
    }
}

/// IPVS mode's iptables rules for the current Node.
fn rules_renderer(s: &FamilySettings) -> RulesRenderer {
    let s = s.clone();
    Box::new(move |p: &IpvsPlanner, node: &NodeInfo| p.rules(&s.rules_config(node)))
}

/// The metrics and health servers; dropped on shutdown.
struct Observability {
    metrics: Arc<ProxyMetrics>,
    configz: http::Configz,
    _servers: http::HttpServers,
}

/// The conntrack handle of `family`'s proxier, its reconciles fed to
/// upstream's conntrack reconciler metrics.
fn conntrack_handle(family: IpFamily, metrics: &Arc<ProxyMetrics>) -> Result<NetlinkConntrack, StartError> {
    let metrics = metrics.clone();
    let report = Arc::new(move |took, deleted| metrics.conntrack_reconciled(family, took, deleted));
    Ok(NetlinkConntrack::new().map_err(StartError::Conntrack)?.with_report(report))
}

/// Metrics, health, the HTTP servers and the service health checks.
fn observability(
    cfg: &KubeProxyConfiguration,
    families: daemon::Families,
    node_name: &str,
    node: Option<&NodeInfo>,
    registry: &StatsRegistry,
    zpages: http::ZPages,
) -> Result<(Vec<(IpFamily, SyncHooks)>, Observability), StartError> {
    let metrics = Arc::new(ProxyMetrics::new(cfg.proxy_mode(), registry.clone()));
    metrics.families_started(&families.all().collect::<Vec<_>>());
    let health = Arc::new(ProxyHealth::new(health::health_timeout(cfg)).with_metrics(metrics.clone()));
    let configz = http::Configz::new(cfg);
    let about = http::dashboard::About {
        mode: cfg.proxy_mode(),
        node: node_name.to_string(),
        families: families.all().collect(),
    };
    let dashboard = http::dashboard::dashboard_routes(about, registry.clone(), health.clone());
    let extra = dashboard.merge(zpages.routes());
    let servers = http::start_http_servers(cfg, &metrics, &health, &configz, extra).map_err(StartError::Http)?;
    let local: Vec<std::net::IpAddr> = addrs::local_addrs().unwrap_or_default().into_iter().map(|a| a.ip).collect();
    let node_ips: Vec<std::net::IpAddr> = node.map(|n| n.addresses.clone()).unwrap_or_default();
    let ips = http::health_check_listen_ips(&cfg.node_port_addresses(), &local, &node_ips);
    // One set of health-check servers: a dual-stack service's healthCheckNodePort is one port.
    let service_health: SharedServiceHealth =
        ServiceHealthServers::new(ips, health.clone()).with_metrics(metrics.clone()).into();
    let ipvs_mode = cfg.proxy_mode() == crate::config::ProxyMode::Ipvs;
    let hooks = families
        .all()
        .map(|f| {
            let hooks = SyncHooks::new(f, metrics.clone(), health.clone(), registry.clone())
                .with_service_health(service_health.clone());
            (f, if ipvs_mode { hooks.with_scheduler_list() } else { hooks })
        })
        .collect();
    Ok((hooks, Observability { metrics, configz, _servers: servers }))
}

/// Re-reads the configuration (SIGHUP), with the same flags as at start:
/// merged, not yet finished ([`reload::plan`] finishes it).
pub type Reloader = Box<dyn Fn() -> Result<crate::config::Merged, crate::config::ConfigError>>;

/// What SIGHUP needs to apply a new configuration.
struct Live {
    cfg: KubeProxyConfiguration,
    node_name: String,
    /// The primary family's first.
    engines: Vec<(IpFamily, Engine)>,
    observe: Observability,
    /// What the start found of the nfacct counters (kept across reloads).
    nfacct: nfacct::Probe,
}

impl Live {
    /// Applies what can change live, names what can't; a bad file changes nothing.
    async fn reload(&mut self, load: &Reloader) {
        let loaded = match load() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "config reload refused; the running configuration stays");
                self.observe.metrics.config_reload_failed();
                return;
            }
        };
        let plan = match reload::plan(&self.cfg, loaded) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "config reload refused; the running configuration stays");
                self.observe.metrics.config_reload_failed();
                return;
            }
        };
        if !plan.needs_restart.is_empty() {
            tracing::warn!(fields = %plan.needs_restart.join(", "), "config changes need a restart and were not applied");
        }
        if plan.applied.is_empty() {
            tracing::info!("config reloaded: nothing to apply");
            return;
        }
        tracing::info!(fields = %plan.applied.join(", "), "config reloaded: applying");
        self.cfg = plan.effective;
        self.observe.configz.set(&self.cfg);
        crate::logging::apply(&self.cfg.logging);
        for (family, engine) in &self.engines {
            engine.reconfigure(&self.cfg, *family, &self.node_name, self.nfacct.rules(*family)).await;
        }
    }
}

/// Serves SIGHUP (reload) until SIGTERM or SIGINT, or a Node change that
/// needs a restart.
async fn run_until_stopped(
    live: &mut Live,
    reload: &Reloader,
    stop: &mut crate::signals::Stop,
    restart: &mut tokio::sync::mpsc::UnboundedReceiver<NodeRestart>,
) -> Exit {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(hup) => Some(hup),
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGHUP; no reloads");
            None
        }
    };
    loop {
        tokio::select! {
            signal = stop.recv() => {
                tracing::info!(signal = signal.unwrap_or("signal watcher gone"), "stopping");
                return Exit::Stopped;
            }
            Some(r) = restart.recv() => return Exit::Restart(r),
            () = hangup(&mut hup) => {
                tracing::info!("SIGHUP: reloading the configuration");
                live.reload(reload).await;
            }
        }
    }
}

/// The next SIGHUP; never without a watcher.
async fn hangup(hup: &mut Option<tokio::signal::unix::Signal>) {
    match hup {
        Some(h) => {
            h.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// `--cleanup`: removes what any mode installed, in both families:
/// every virtual server, set, rule and address of ours, and nftables
/// mode's `kube-proxy` tables.
pub fn cleanup() -> Result<(), StartError> {
    let system = actix_rt::System::new();
    system.block_on(async {
        let mut errors = Vec::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            // Both modes' chains in one restore: they share chains that the other's may reference.
            let both = [&iptables_plan::PROFILE, &rules_ipvs::PROFILE];
            if let Err(e) = IptablesHandle::new(family).cleanup_modes(&both).await {
                errors.push(format!("iptables ({family:?}): {e}"));
            }
            errors.extend(cleanup_ipvs_mode(family).await);
            if let Err(e) = delete_nftables_table(family).await {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            tracing::info!("cleanup done");
            Ok(())
        } else {
            Err(StartError::Cleanup(errors))
        }
    })
}

/// iptables mode's jumps and chains (per-service ones included).
async fn cleanup_iptables_mode(family: IpFamily) -> Vec<String> {
    match IptablesHandle::new(family).for_mode(&iptables_plan::PROFILE).cleanup().await {
        Ok(()) => Vec::new(),
        Err(e) => vec![format!("iptables mode's rules ({family:?}): {e}")],
    }
}

/// IPVS mode's state: its iptables rules first (they name the sets), then
/// the sets, IPVS (flushed, as upstream) and kube-ipvs0.
async fn cleanup_ipvs_mode(family: IpFamily) -> Vec<String> {
    let mut errors = Vec::new();
    if let Err(e) = IptablesHandle::new(family).cleanup().await {
        errors.push(format!("IPVS mode's rules ({family:?}): {e}"));
    }
    errors.extend(cleanup_ipvs_state(family).await);
    errors
}

/// IPVS mode's state besides its rules: the sets, IPVS (flushed, as
/// upstream) and kube-ipvs0.
async fn cleanup_ipvs_state(family: IpFamily) -> Vec<String> {
    let mut errors = Vec::new();
    match NetlinkIpset::new() {
        Ok(ipset) => {
            for set in IpvsSet::ALL {
                if let Err(e) = ipset.destroy(&set.name(family)).await {
                    errors.push(format!("ipset {}: {e}", set.name(family)));
                }
            }
        }
        Err(e) => errors.push(format!("ipsets ({family:?}): {e}")),
    }
    if family == IpFamily::V4 {
        match NetlinkIpvs::connect().await {
            Ok(ipvs) => {
                if let Err(e) = ipvs.flush().await {
                    errors.push(format!("flushing IPVS: {e}"));
                }
            }
            Err(IpvsError::NotAvailable) => tracing::debug!("no IPVS in this kernel: nothing to flush"),
            Err(e) => errors.push(format!("IPVS: {e}")),
        }
        match DummyLink::new() {
            Ok(link) => {
                if let Err(e) = link.delete_link().await {
                    errors.push(format!("kube-ipvs0: {e}"));
                }
            }
            Err(e) => errors.push(format!("rtnetlink: {e}")),
        }
    }
    errors
}
