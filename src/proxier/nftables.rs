//! nftables mode: per family the nftables actor (the family's `kube-proxy`
//! table) and the conntrack actor under the coordinator; its first sync
//! lists the table and adopts (or flushes and deletes) what an earlier run
//! left. The families' large syncs take turns ([`WithTurns`]).

use actix::prelude::*;

use super::{addr_source, conntrack_handle, coordinator_settings, Mode, ProxierError, WithTurns};
use crate::actors::coordinator::{Coordinator, NftContextBuilder, NftablesDataplane};
use crate::actors::wiring::start_nftables_actors;
use crate::config::KubeProxyConfiguration;
use crate::kernel::nftables::NetlinkNftables;
use crate::model::{Model, NodeInfo};
use crate::net::LocalAddr;
use crate::observe::SyncHooks;
use crate::settings::FamilySettings;
use crate::stats::StatsRegistry;

impl Mode for NftablesDataplane {
    /// The turns the families' coordinators take for their large syncs.
    type Shared = WithTurns<()>;

    async fn open(_cfg: &KubeProxyConfiguration) -> Result<WithTurns<()>, ProxierError> {
        Ok(WithTurns::new(()))
    }

    async fn start(
        s: &FamilySettings,
        shared: &WithTurns<()>,
        registry: &StatsRegistry,
        hooks: SyncHooks,
    ) -> Result<Addr<Coordinator<NftablesDataplane>>, ProxierError> {
        let family = s.family;
        let nft = NetlinkNftables::new().map_err(ProxierError::Nftables)?;
        let conntrack = conntrack_handle(family, hooks.metrics())?;
        let context = Self::config(s);
        let settings = coordinator_settings(s);
        let turns = shared.turns.clone();
        Ok(Coordinator::create(move |ctx| {
            let targets = start_nftables_actors(nft, family, conntrack, registry, ctx.address().recipient());
            let dataplane = NftablesDataplane::new(family, targets, addr_source(), context);
            Coordinator::with_dataplane(settings, dataplane).with_observer(hooks).with_turns(turns)
        }))
    }

    /// The planner's context for the current Node, ServiceCIDRs and addresses.
    fn config(s: &FamilySettings) -> NftContextBuilder {
        let s = s.clone();
        Box::new(move |node: &NodeInfo, cidrs: &[ipnet::IpNet], addrs: &[LocalAddr]| {
            s.nftables_context(node, cidrs, addrs)
        })
    }

    fn dry_run(s: &FamilySettings, model: &Model, addrs: &[LocalAddr]) -> String {
        let ctx = s.nftables_context(model.node(), model.service_cidrs(), addrs);
        format!("# nftables\n{}", crate::plan::nftables::dry_run(model, &ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::IpFamily;
    use crate::plan::iptables::HostFeatures;
    use crate::settings;

    /// The dataplane's context builder takes the model's ServiceCIDRs into the
    /// planner's context, the family's alone.
    #[test]
    fn the_nftables_context_holds_the_models_service_cidrs_of_its_family() {
        use crate::fixtures::applied_service_cidr;
        for (family, want) in [(IpFamily::V4, "10.96.0.0/16"), (IpFamily::V6, "fd00:96::/112")] {
            let s = settings::derive(&KubeProxyConfiguration::default(), family, "node-a", HostFeatures::default());
            let mut model = Model::new(family, "node-a");
            model.record(&applied_service_cidr("kubernetes", &["10.96.0.0/16", "fd00:96::/112"])).unwrap();
            let build = NftablesDataplane::config(&s);
            assert!(build(model.node(), model.service_cidrs(), &[]).service_cidrs.is_empty(), "not before apply");
            model.apply();
            let ctx = build(model.node(), model.service_cidrs(), &[]);
            assert_eq!(ctx.service_cidrs, [want.parse::<ipnet::IpNet>().unwrap()]);
        }
    }
}
