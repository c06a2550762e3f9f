//! iptables mode: per family the iptables and conntrack actors under the
//! coordinator, one restore per sync; the nfacct counters its rules name,
//! set up once the families are known ([`super::nfacct`]); route_localnet
//! for localhost NodePorts.

use actix::prelude::*;

use super::nfacct::{self, Nfacct, NfacctRules};
use super::{addr_source, conntrack_handle, coordinator_settings, host_features, Mode, ProxierError, WithTurns};
use crate::actors::coordinator::{ContextBuilder, Coordinator, IptablesDataplane};
use crate::actors::wiring::start_iptables_actors;
use crate::config::KubeProxyConfiguration;
use crate::kernel::iptables::{restore_input_on_empty_kernel, IptablesHandle};
use crate::kernel::{sysctl, KernelError};
use crate::metrics::ProxyMetrics;
use crate::model::{Model, NodeInfo};
use crate::net::{IpFamily, LocalAddr};
use crate::observe::SyncHooks;
use crate::plan::iptables::context::SYSCTL_ROUTE_LOCALNET;
use crate::plan::iptables::{self as plan, HostFeatures};
use crate::settings::FamilySettings;
use crate::stats::StatsRegistry;

impl Mode for IptablesDataplane {
    type Shared = WithTurns<Nfacct>;

    async fn open(_cfg: &KubeProxyConfiguration) -> Result<WithTurns<Nfacct>, ProxierError> {
        Ok(WithTurns::new(Nfacct::default()))
    }

    /// The nfacct objects, before the rules that name them (upstream's
    /// NewProxier); whatever fails costs only the counting.
    async fn prepare_families(
        shared: WithTurns<Nfacct>,
        families: &[IpFamily],
        metrics: &ProxyMetrics,
    ) -> WithTurns<Nfacct> {
        let nfacct = nfacct::set_up(families, nfacct::probe_match).await;
        if let Some(reader) = nfacct.reader() {
            metrics.nfacct_counters(&nfacct.probe.counted(), reader);
        }
        WithTurns { opened: nfacct, ..shared }
    }

    /// With the nfacct counters found at start (the objects and rules stay
    /// across reloads).
    async fn host(shared: &WithTurns<Nfacct>, family: IpFamily) -> HostFeatures {
        host_features(family, shared.opened.probe.rules(family)).await
    }

    fn set_up_family(s: &FamilySettings, node: &NodeInfo, addrs: &[LocalAddr]) -> Result<(), ProxierError> {
        if s.iptables_context(node, addrs).needs_route_localnet() {
            ensure_route_localnet().map_err(ProxierError::RouteLocalnet)?;
        }
        Ok(())
    }

    /// The first sync adopts (or deletes) the per-service chains already
    /// in the kernel.
    async fn start(
        s: &FamilySettings,
        shared: &WithTurns<Nfacct>,
        registry: &StatsRegistry,
        hooks: SyncHooks,
    ) -> Result<Addr<Coordinator<IptablesDataplane>>, ProxierError> {
        let (family, nfacct, turns) = (s.family, &shared.opened, shared.turns.clone());
        let mut iptables = IptablesHandle::new(family).for_mode(&plan::PROFILE);
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
        let context = Self::config(s);
        let settings = coordinator_settings(s);
        Ok(Coordinator::create(move |ctx| {
            // A vanished canary (someone flushed our tables) makes the iptables
            // actor tell the coordinator, which resyncs in full.
            let targets = start_iptables_actors(iptables, conntrack, registry, ctx.address().recipient());
            let dataplane = IptablesDataplane::new(targets, addr_source(), context, &kernel_chains);
            Coordinator::with_dataplane(settings, dataplane).with_observer(hooks).with_turns(turns)
        }))
    }

    /// The planner's context for the current Node and addresses.
    fn config(s: &FamilySettings) -> ContextBuilder {
        let s = s.clone();
        Box::new(move |node: &NodeInfo, addrs: &[LocalAddr]| s.iptables_context(node, addrs))
    }

    async fn dry_run_nfacct(family: IpFamily) -> NfacctRules {
        nfacct::dry_run_rules(family).await
    }

    fn dry_run(s: &FamilySettings, model: &Model, addrs: &[LocalAddr]) -> String {
        let text = plan::dry_run(model, s.iptables_context(model.node(), addrs));
        format!("# iptables\n{}", restore_input_on_empty_kernel(&plan::PROFILE, &text))
    }
}

/// Sets route_localnet to 1, which localhost NodePorts need (upstream's
/// NewProxier), if it is not.
pub fn ensure_route_localnet() -> Result<(), KernelError> {
    if sysctl::ensure_sysctl(SYSCTL_ROUTE_LOCALNET, 1)? {
        tracing::info!(
            sysctl = SYSCTL_ROUTE_LOCALNET,
            "Setting route_localnet=1 to allow node-ports on localhost; to change this either disable \
             iptables.localhostNodePorts (--iptables-localhost-nodeports) or set nodePortAddresses \
             (--nodeport-addresses) to filter loopback addresses"
        );
    }
    Ok(())
}
