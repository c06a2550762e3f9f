//! One proxier per IP family, as upstream's metaproxier: a coordinator
//! over the running mode's kernel actors, reached through one handle,
//! [`Proxier`], whatever the mode.
//!
//! Each mode is one [`Mode`] impl on its coordinator's dataplane
//! ([`ipvs`], [`iptables`], [`nftables`]): what it opens in the kernel at
//! start and sets up on the node, how its actors and coordinator start from
//! a family's settings, what a reload hands its dataplane, and the text
//! `--dry-run` prints for it. [`for_mode`] is the one place a configured
//! [`ProxyMode`] becomes its [`Mode`]; a new mode is one more impl and one
//! more arm there.

pub mod iptables;
pub mod ipvs;
pub mod nfacct;
pub mod nftables;

use std::future::Future;
use std::sync::Arc;

use actix::prelude::*;

use crate::actors::coordinator::{
    AddrSource, Coordinator, Dataplane, IptablesDataplane, IpvsDataplane, NftablesDataplane, Reconfigure, Settings,
    Shutdown, SyncTurns,
};
use crate::config::{KubeProxyConfiguration, ProxyMode};
use crate::kernel::conntrack::{ConntrackError, NetlinkConntrack};
use crate::kernel::iptables::IptablesHandle;
use crate::kernel::ipvs::netlink::IpvsError;
use crate::kernel::{addrs, sysctl, KernelError};
use crate::metrics::ProxyMetrics;
use crate::model::{Model, NodeInfo};
use crate::msgs::SourceBatch;
use crate::net::{IpFamily, LocalAddr};
use crate::observe::SyncHooks;
use crate::plan::iptables::context::SYSCTL_TCP_BE_LIBERAL;
use crate::plan::iptables::HostFeatures;
use crate::settings::FamilySettings;
use crate::stats::StatsRegistry;

use self::nfacct::NfacctRules;

/// Why a mode's proxier, or what it needs of the node, could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ProxierError {
    #[error("{0}")]
    Ipvs(#[source] IpvsError),
    #[error("conntrack: {0}")]
    Conntrack(#[source] ConntrackError),
    /// A kernel setting or socket the mode needs.
    #[error("{0}")]
    Kernel(#[source] KernelError),
    #[error("nf_tables netlink socket: {0}")]
    Nftables(#[source] std::io::Error),
    /// route_localnet for localhost NodePorts (upstream's `NewProxier`
    /// error, as `createProxier` words it).
    #[error("unable to create proxier: {0}")]
    RouteLocalnet(#[source] KernelError),
}

/// One proxy mode as the daemon runs it, implemented by the mode's
/// coordinator dataplane.
pub trait Mode: Dataplane + Sized {
    /// What the mode opens in the kernel once and its families' proxiers
    /// share (IPVS mode's socket, iptables mode's nfacct counters).
    type Shared: Clone + 'static;

    /// Whether a Service's annotations choose its scheduler (IPVS mode).
    const SERVICE_SCHEDULERS: bool = false;

    /// Before the Node is known: opens what the mode needs of the kernel and
    /// sets it up (IPVS mode: the socket, upstream's sysctls and timeouts),
    /// so a kernel without the mode stops the start at once.
    fn open(cfg: &KubeProxyConfiguration) -> impl Future<Output = Result<Self::Shared, ProxierError>>;

    /// Once the daemon serves `families`: what their proxiers share beyond
    /// [`Mode::open`] (iptables mode's nfacct counters, whose metrics it
    /// hands `metrics`).
    fn prepare_families(
        shared: Self::Shared,
        _families: &[IpFamily],
        _metrics: &ProxyMetrics,
    ) -> impl Future<Output = Self::Shared> {
        async { shared }
    }

    /// What `family`'s settings take of the host.
    fn host(_shared: &Self::Shared, family: IpFamily) -> impl Future<Output = HostFeatures> {
        host_features(family, NfacctRules::default())
    }

    /// The node set-up `s` needs on `node` with the node's addresses `addrs`
    /// (iptables mode: route_localnet for localhost NodePorts), at start and
    /// after a reload.
    fn set_up_family(_s: &FamilySettings, _node: &NodeInfo, _addrs: &[LocalAddr]) -> Result<(), ProxierError> {
        Ok(())
    }

    /// After a reload, what [`Mode::open`] set up, again with `cfg`.
    fn reopen(_cfg: &KubeProxyConfiguration, _shared: &Self::Shared) -> impl Future<Output = ()> {
        async {}
    }

    /// Starts `s.family`'s kernel actors and the coordinator over them,
    /// reporting to `hooks`.
    fn start(
        s: &FamilySettings,
        shared: &Self::Shared,
        registry: &StatsRegistry,
        hooks: SyncHooks,
    ) -> impl Future<Output = Result<Addr<Coordinator<Self>>, ProxierError>>;

    /// The dataplane's part of `s`: what it plans with, replaced on reload.
    fn config(s: &FamilySettings) -> Self::Config;

    /// The nfacct counters `--dry-run` plans `family`'s rules with
    /// (read-only; only iptables mode has any).
    fn dry_run_nfacct(_family: IpFamily) -> impl Future<Output = NfacctRules> {
        async { NfacctRules::default() }
    }

    /// `--dry-run`'s text: the kernel state a first sync of `model`
    /// programs, in the syntax of the mode's tools.
    fn dry_run(s: &FamilySettings, model: &Model, addrs: &[LocalAddr]) -> String;
}

/// What a mode opened once (`opened`), and the turns its families'
/// coordinators take for their large syncs, so that a dual-stack node holds
/// one family's first sync at a time (iptables and IPVS mode).
#[derive(Clone)]
pub struct WithTurns<T> {
    pub opened: T,
    pub turns: SyncTurns,
}

impl<T> WithTurns<T> {
    pub fn new(opened: T) -> WithTurns<T> {
        WithTurns { opened, turns: SyncTurns::default() }
    }
}

/// Something to do with the configured mode's [`Mode`].
pub trait ForMode {
    type Output;
    fn with<M: Mode>(self) -> Self::Output;
}

/// Does `f` with `mode`'s [`Mode`].
pub fn for_mode<F: ForMode>(mode: ProxyMode, f: F) -> F::Output {
    match mode {
        ProxyMode::Ipvs => f.with::<IpvsDataplane>(),
        ProxyMode::Iptables => f.with::<IptablesDataplane>(),
        ProxyMode::Nftables => f.with::<NftablesDataplane>(),
    }
}

/// One family's running proxier: its coordinator.
pub struct Proxier<M: Mode> {
    pub family: IpFamily,
    coordinator: Addr<Coordinator<M>>,
}

impl<M: Mode> Proxier<M> {
    /// Starts `s.family`'s proxier.
    pub async fn start(
        s: &FamilySettings,
        shared: &M::Shared,
        registry: &StatsRegistry,
        hooks: SyncHooks,
    ) -> Result<Proxier<M>, ProxierError> {
        Ok(Proxier { family: s.family, coordinator: M::start(s, shared, registry, hooks).await? })
    }

    /// Where the sources' batches go.
    pub fn events(&self) -> Recipient<SourceBatch> {
        self.coordinator.clone().recipient()
    }

    /// Stops taking events; returns once the sync in flight is done.
    pub async fn shutdown(&self) {
        if let Err(e) = self.coordinator.send(Shutdown).await {
            tracing::warn!(error = %e, "coordinator gone before shutdown");
        }
    }

    /// Hands the coordinator a reloaded configuration's settings (it then
    /// resyncs in full).
    pub fn reconfigure(&self, s: &FamilySettings) {
        self.coordinator.do_send(Reconfigure::<M> { settings: coordinator_settings(s), dataplane: M::config(s) });
    }
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

/// The node's interface addresses, read at each sync (public for `kpr-bench`).
pub fn addr_source() -> AddrSource {
    Box::new(|| {
        addrs::local_addrs().unwrap_or_else(|e| {
            tracing::error!(error = %e, "reading the node's addresses");
            Vec::new()
        })
    })
}

/// What the planners take of the host (upstream's NewProxier probes), with
/// the nfacct counters `nfacct` found at start ([`nfacct::set_up`]).
/// Public for `kpr-bench iptables`, which wires iptables mode as the daemon does.
pub async fn host_features(family: IpFamily, nfacct: NfacctRules) -> HostFeatures {
    let host = HostFeatures {
        random_fully: IptablesHandle::new(family).random_fully().await,
        conntrack_tcp_liberal: sysctl::is_on(SYSCTL_TCP_BE_LIBERAL),
        ..HostFeatures::default()
    };
    nfacct.on(host)
}

/// The conntrack handle of `family`'s proxier, its reconciles fed to
/// upstream's conntrack reconciler metrics.
fn conntrack_handle(family: IpFamily, metrics: &Arc<ProxyMetrics>) -> Result<NetlinkConntrack, ProxierError> {
    let metrics = metrics.clone();
    let report = Arc::new(move |took, deleted| metrics.conntrack_reconciled(family, took, deleted));
    Ok(NetlinkConntrack::new().map_err(ProxierError::Conntrack)?.with_report(report))
}
