//! IPVS mode: one IPVS socket for both families, opened and set up at start
//! (upstream's sysctls and timeouts); per family the IPVS, ipset,
//! kube-ipvs0, iptables and conntrack actors under the coordinator.

use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;

use super::{addr_source, conntrack_handle, coordinator_settings, Mode, ProxierError, WithTurns};
use crate::actors::coordinator::{Coordinator, IpvsDataplane, RulesRenderer};
use crate::actors::wiring::{start_ipvs_actors, IpvsKernels};
use crate::config::{GoDuration, KubeProxyConfiguration, IPVS_DEPRECATED};
use crate::kernel::ipset::netlink::NetlinkIpset;
use crate::kernel::ipset::IpsetHandle;
use crate::kernel::iptables::{restore_input_on_empty_kernel, IptablesHandle};
use crate::kernel::ipvs::graceful::{GracefulIpvs, Ownership};
use crate::kernel::ipvs::netlink::NetlinkIpvs;
use crate::kernel::link::DummyLink;
use crate::kernel::sysctl;
use crate::model::{Model, NodeInfo};
use crate::net::LocalAddr;
use crate::observe::SyncHooks;
use crate::plan::context::PlanSettings;
use crate::plan::ipvs::{render, rules, IpvsPlanner, IpvsSet};
use crate::settings::FamilySettings;
use crate::stats::StatsRegistry;

/// Test knob: how often terminating real servers are checked (default: upstream's minute).
const ENV_RS_CHECK_INTERVAL: &str = "KUBE_PROXY_RS_RS_CHECK_INTERVAL";

impl Mode for IpvsDataplane {
    type Shared = WithTurns<NetlinkIpvs>;

    const SERVICE_SCHEDULERS: bool = true;

    async fn open(cfg: &KubeProxyConfiguration) -> Result<WithTurns<NetlinkIpvs>, ProxierError> {
        tracing::warn!("{IPVS_DEPRECATED}");
        let ipvs = NetlinkIpvs::connect().await.map_err(ProxierError::Ipvs)?;
        set_sysctls(cfg)?;
        set_timeouts(&ipvs, cfg).await;
        Ok(WithTurns::new(ipvs))
    }

    async fn reopen(cfg: &KubeProxyConfiguration, shared: &WithTurns<NetlinkIpvs>) {
        if let Err(e) = set_sysctls(cfg) {
            tracing::warn!(error = %e, "sysctls after reload");
        }
        set_timeouts(&shared.opened, cfg).await;
    }

    async fn start(
        s: &FamilySettings,
        shared: &WithTurns<NetlinkIpvs>,
        registry: &StatsRegistry,
        hooks: SyncHooks,
    ) -> Result<Addr<Coordinator<IpvsDataplane>>, ProxierError> {
        let (family, ipvs, turns) = (s.family, &shared.opened, shared.turns.clone());
        let owned = Ownership { family, exclude: s.ipvs_exclude_cidrs.clone() };
        let mut graceful = GracefulIpvs::new(ipvs.clone(), owned);
        if let Some(every) = check_interval() {
            graceful = graceful.with_check_interval(every);
        }
        let ipset = NetlinkIpset::new().map_err(ProxierError::Kernel)?;
        let sets: BTreeMap<IpvsSet, IpsetHandle> =
            IpvsSet::ALL.iter().map(|s| (*s, IpsetHandle::new(&ipset, s.spec(family)))).collect();
        let conntrack = conntrack_handle(family, hooks.metrics())?;
        let iptables = IptablesHandle::new(family);
        let link = DummyLink::new().map_err(ProxierError::Kernel)?.with_family(family);
        let kernels = IpvsKernels { ipvs: graceful, sets, link, iptables, conntrack };
        let settings = coordinator_settings(s);
        let rules = rules_renderer(s);
        Ok(Coordinator::create(move |ctx| {
            // Drift an actor finds between syncs (the iptables canary vanished) makes the coordinator resync in full.
            let targets = start_ipvs_actors(kernels, registry, ctx.address().recipient());
            Coordinator::new(settings, targets, addr_source(), rules).with_observer(hooks).with_turns(turns)
        }))
    }

    fn config(s: &FamilySettings) -> (PlanSettings, RulesRenderer) {
        (s.plan.clone(), rules_renderer(s))
    }

    fn dry_run(s: &FamilySettings, model: &Model, addrs: &[LocalAddr]) -> String {
        let mut planner = IpvsPlanner::new(s.ipvs_context(model.node(), addrs));
        let ports: Vec<_> = model.service_ports().map(|sp| sp.name.clone()).collect();
        planner.update(model, &ports);
        let rules = planner.rules(&s.rules_config(model.node()));
        let rules = restore_input_on_empty_kernel(&rules::PROFILE, &rules);
        render::ipvs_mode(&planner.desired(), s.family, &rules)
    }
}

/// IPVS mode's iptables rules for the current Node.
fn rules_renderer(s: &FamilySettings) -> RulesRenderer {
    let s = s.clone();
    Box::new(move |p: &IpvsPlanner, node: &NodeInfo| p.rules(&s.rules_config(node)))
}

fn kernel_release() -> String {
    nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default()
}

/// Upstream's IPVS sysctls; a failure to set one is fatal for
/// net/ipv4/vs/conntrack (as upstream), logged for the others.
fn set_sysctls(cfg: &KubeProxyConfiguration) -> Result<(), ProxierError> {
    for (path, value) in sysctl::ipvs_sysctls(cfg.ipvs.strict_arp, &kernel_release()) {
        match sysctl::ensure_sysctl(path, value) {
            Ok(changed) => tracing::debug!(sysctl = path, value, changed, "sysctl"),
            Err(e) if path == "net/ipv4/vs/conntrack" => return Err(ProxierError::Kernel(e)),
            Err(e) => tracing::warn!(sysctl = path, value, error = %e, "could not set sysctl"),
        }
    }
    Ok(())
}

async fn set_timeouts(ipvs: &NetlinkIpvs, cfg: &KubeProxyConfiguration) {
    let Some((tcp, fin, udp)) = cfg.ipvs_timeouts() else { return };
    if let Err(e) = ipvs.set_timeouts(tcp, fin, udp).await {
        tracing::warn!(error = %e, "could not set IPVS timeouts");
    }
}

fn check_interval() -> Option<Duration> {
    let text = std::env::var(ENV_RS_CHECK_INTERVAL).ok()?;
    text.parse::<GoDuration>().ok().map(|d| d.get())
}

/// How often draining IPVS state is read: graceful termination's interval
/// (upstream's minute, or `KUBE_PROXY_RS_RS_CHECK_INTERVAL`).
pub fn drain_check_interval() -> Duration {
    check_interval().unwrap_or(crate::kernel::ipvs::graceful::CHECK_INTERVAL)
}
