//! The daemon's run ([`run`]), step by step in upstream's order (its
//! server start-up and `NewProxier`), in the configured mode ([`Mode`]):
//!
//! 1. one daemon per network namespace ([`crate::instance`]);
//! 2. upstream's conntrack settings ([`conntrack`]);
//! 3. what the mode needs of the kernel, opened and set up
//!    ([`Mode::open`]: IPVS mode's socket, sysctls and timeouts);
//! 4. this node's Node, from the source ([`sources::find_node`]), and the
//!    families it runs ([`families`]);
//! 5. the node's set-up per family ([`Mode::set_up_family`]: route_localnet
//!    for localhost NodePorts); `--init-only` removes what the node's
//!    earlier mode left at once, as upstream, and ends here;
//! 6. the OOM score ([`oom`]), metrics, health and the HTTP servers
//!    ([`observability`]), what the families share ([`Mode::prepare_families`]:
//!    iptables mode's nfacct counters), one proxier per family
//!    ([`Proxier`]), and the source ([`sources::start`]);
//! 7. what the node's earlier mode left, removed once the family's first
//!    sync succeeded, so the new mode's state is complete before the old
//!    one's goes, IPVS mode's virtual servers once their connections ended
//!    (or `ipvs.switchDrainTimeout` passed; [`crate::cleanup::switch_modes`]);
//! 8. serving until SIGTERM/SIGINT, leaving the kernel state in place (as
//!    upstream, so traffic keeps flowing during a rolling update), or until
//!    the Node changes what it started with (exit 1 for a restart,
//!    [`node_watch`]); SIGHUP reloads the configuration
//!    ([`crate::reload::live`]).

pub mod conntrack;
mod error;
pub mod families;
pub mod node_watch;
mod observability;
pub mod oom;
pub mod process;
pub mod sources;

use std::sync::Arc;

use futures::future::LocalBoxFuture;
use k8s_openapi::api::core::v1::Node;

use crate::cleanup::SwitchPolicy;
use crate::config::{KubeProxyConfiguration, LocalMode};
use crate::http::ZPages;
use crate::kernel::addrs;
use crate::model::intake::Intake;
use crate::model::node_change::{NodeBaseline, NodeRestart};
use crate::model::NodeInfo;
use crate::proxier::{for_mode, ForMode, Mode, Proxier};
use crate::reload::live::{Live, Reloader};
use crate::settings;
use crate::signals::Stop;
use crate::stats::StatsRegistry;

pub use self::error::StartError;
use self::families::Families;
use self::node_watch::NodeWatch;
pub use self::sources::{check_manifest_dir, Source};
use self::sources::{Fanout, Ready};

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
    zpages: ZPages,
) -> Result<Exit, StartError> {
    // Before the runtime's threads exist: they inherit the blocked signals.
    let stop = crate::signals::watch().map_err(StartError::Signals)?;
    let system = actix_rt::System::new();
    let mode = cfg.proxy_mode();
    let result = system.block_on(for_mode(mode, Run { cfg, source, reload, stop, purpose, zpages }));
    // Actors that a late start-up error left behind are dropped with the
    // system, and actix starts them while dropping: inside the runtime's
    // context, or it panics ("there is no reactor running") instead of
    // logging the error.
    let runtime = system.runtime().tokio_runtime().handle().clone();
    let _inside = runtime.enter();
    let code = match &result {
        Ok(Exit::Stopped) => 0,
        Ok(Exit::Restart(_)) | Err(_) => 1,
    };
    let deadline = process::ExitDeadline::arm(RUNTIME_DROP_WAIT, move || std::process::exit(code));
    drop(system);
    drop(deadline);
    result
}

/// How long the runtime's drop may wait for its blocking pool's jobs.
const RUNTIME_DROP_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// [`run`]'s arguments, for the configured mode.
struct Run {
    cfg: KubeProxyConfiguration,
    source: Source,
    reload: Reloader,
    stop: Stop,
    purpose: Purpose,
    zpages: ZPages,
}

impl ForMode for Run {
    type Output = LocalBoxFuture<'static, Result<Exit, StartError>>;

    fn with<M: Mode>(self) -> Self::Output {
        Box::pin(run_mode::<M>(self))
    }
}

/// What the start found before serving: this node's Node and families, the
/// source ready to start, and what the mode opened.
struct SetUp<M: Mode> {
    node_name: String,
    /// The Node object, if the source has it.
    node: Option<Arc<Node>>,
    /// What the proxiers read of it (a Node with this node's name alone
    /// when there is none).
    info: NodeInfo,
    families: Families,
    ready: Ready,
    shared: M::Shared,
}

async fn run_mode<M: Mode>(run: Run) -> Result<Exit, StartError> {
    let Run { cfg, source, reload, stop, purpose, zpages } = run;
    let set_up = set_up::<M>(&cfg, source).await?;
    match purpose {
        Purpose::InitOnly => {
            // As upstream's platformCleanup: without a sync to wait for,
            // what the node's earlier mode left goes at once.
            let families: Vec<_> = set_up.families.all().collect();
            let policy = SwitchPolicy::at_once(families.len());
            for family in families {
                crate::cleanup::switch_modes(cfg.proxy_mode(), family, std::future::ready(true), policy.clone()).await;
            }
            tracing::info!("System initialized and --init-only specified");
            Ok(Exit::Stopped)
        }
        Purpose::Serve => serve::<M>(cfg, set_up, reload, stop, zpages).await,
    }
}

/// Steps 1 to 5: what `--init-only` does, and a serving daemon first.
async fn set_up<M: Mode>(cfg: &KubeProxyConfiguration, source: Source) -> Result<SetUp<M>, StartError> {
    // One daemon per network namespace, checked before anything is touched.
    crate::instance::acquire()?;
    // Upstream's platformSetup: fatal when a setting cannot be written.
    conntrack::set_sysctls(&cfg.conntrack)?;
    let shared = M::open(cfg).await?;
    let node_name = cfg.hostname()?;
    let (node, ready) = sources::find_node(cfg, source, &node_name).await?;
    let info = node.as_deref().map(NodeInfo::from_node);
    if families::primary_family_is_a_fallback(cfg, info.as_ref()) {
        tracing::warn!(
            node = %node_name,
            "Can't determine this node's IP (no Node address): falling back to IPv4 as the primary IP family; \
             if this is incorrect, please set the --bind-address flag"
        );
    }
    let families = families::detect_families(cfg, info.as_ref())?;
    let info = info.unwrap_or_else(|| NodeInfo { name: node_name.clone(), ..NodeInfo::default() });
    let addrs = addrs::local_addrs().map_err(StartError::Addresses)?;
    for family in families.all() {
        let s = settings::derive(cfg, family, &node_name, M::host(&shared, family).await);
        M::set_up_family(&s, &info, &addrs)?;
    }
    Ok(SetUp { node_name, node, info, families, ready, shared })
}

/// Steps 6 to 8.
async fn serve<M: Mode>(
    cfg: KubeProxyConfiguration,
    set_up: SetUp<M>,
    reload: Reloader,
    mut stop: Stop,
    zpages: ZPages,
) -> Result<Exit, StartError> {
    let SetUp { node_name, node, info, families, ready, shared } = set_up;
    oom::apply(cfg.oom_score_adj);
    let registry = StatsRegistry::default();
    let (hooks, observe) =
        observability::start(&cfg, families, &node_name, &info, &registry, zpages, M::SERVICE_SCHEDULERS)?;
    let all: Vec<_> = families.all().collect();
    let shared = M::prepare_families(shared, &all, &observe.metrics).await;
    let drain_every = crate::proxier::ipvs::drain_check_interval();
    let switch = SwitchPolicy::draining(all.len(), cfg.ipvs_switch_drain_timeout(), drain_every, registry.clone());
    // One proxier per family, as upstream's metaproxier: each its own
    // coordinator (model, schedule, retries) and actors, neither waiting on the other.
    let mut proxiers = Vec::new();
    for (family, hooks) in hooks {
        let registry = registry.with_suffix(&families.suffix(family));
        let s = settings::derive(&cfg, family, &node_name, M::host(&shared, family).await);
        // What the node's earlier mode left goes once this mode's first sync is in.
        let (first_sync, synced) = tokio::sync::oneshot::channel();
        let synced = async { synced.await.is_ok() };
        actix_rt::spawn(crate::cleanup::switch_modes(cfg.proxy_mode(), family, synced, switch.clone()));
        proxiers.push(Proxier::<M>::start(&s, &shared, &registry, hooks.on_first_sync(first_sync)).await?);
    }
    let (restart_tx, mut restart) = tokio::sync::mpsc::unbounded_channel();
    let watch_pod_cidrs = cfg.local_mode() == LocalMode::NodeCidr;
    let node_watch = NodeWatch::new(NodeBaseline::new(&node_name, node.as_deref(), watch_pod_cidrs), restart_tx);
    let intake = Intake::new(&node_name, M::SERVICE_SCHEDULERS);
    let fanout =
        Fanout::new(proxiers.iter().map(Proxier::events).collect(), observe.metrics.clone(), intake, node_watch);
    let running = sources::start(ready, &node_name, fanout, &observe.metrics)?;
    tracing::info!(mode = cfg.proxy_mode().as_str(), node = %node_name, families = ?all, "kube-proxy-rs started");
    let metrics = observe.metrics.clone();
    let mut live = Live { cfg, node_name, node: info, proxiers, shared, configz: observe.configz.clone(), metrics };
    let exit = serve_until_stopped(&mut live, &reload, &mut stop, &mut restart).await;
    // Stop taking events, let the batches in flight finish, leave the kernel
    // as it is; a second SIGTERM or SIGINT meanwhile exits at once (crate::signals).
    futures::future::join_all(live.proxiers.iter().map(Proxier::shutdown)).await;
    tracing::info!("shutting down; kernel state left in place");
    running.stop();
    drop(observe);
    actix::System::current().stop();
    Ok(exit)
}

/// Serves SIGHUP (reload) until SIGTERM or SIGINT, or a Node change that
/// needs a restart.
async fn serve_until_stopped<M: Mode>(
    live: &mut Live<M>,
    reload: &Reloader,
    stop: &mut Stop,
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
