//! The nftables-mode planner: upstream's nftables proxier
//! (pkg/proxy/nftables/proxier.go, syncProxyRules) as a pure function of
//! the model, with upstream's table, chain, set and map names, rule text and
//! hashed per-service names, so a node can switch between upstream and us.
//!
//! - [`desired`] renders one family's whole `kube-proxy` table as typed
//!   data ([`Ruleset`]: chains of typed rules, sets with typed keys,
//!   elements; the values of [`crate::msgs::nftables`]): the top-level
//!   objects apart from each service port's, so [`update`] re-renders only
//!   the service ports that changed.
//! - [`transactions::full_sync`], [`transactions::partial_sync`] and
//!   [`transactions::groups_sync`] turn desired states into one
//!   transaction ([`Transaction`]: add/flush/delete chain, add rule,
//!   add/delete set and element) with
//!   upstream's partial-sync semantics: a changed service port's chains are
//!   rewritten whole, map elements are added and deleted one by one (an
//!   element several service ports hold, a ClusterIP, goes with the last),
//!   unused chains are flushed now and deleted by a later
//!   transaction ([`transactions::delete_stale`], upstream waits at least
//!   1 s), stale affinity sets are deleted at once; [`Staged`] cuts a full
//!   sync into the bounded transactions the actor sends, building each
//!   as it is sent.
//! - [`NftablesPlanner`] keeps the state between syncs: what the kernel
//!   holds once a transaction is acknowledged, whether the next sync must be
//!   full, and when stale chains are due for deletion (time is an
//!   argument); a partial sync costs what changed, not the cluster.
//! - [`dry_run`] prints the table a full sync from an empty kernel leaves,
//!   in the order of knftables' `Fake.Dump()` (what upstream's tests
//!   compare), which `nft -f` takes as one transaction.
//!
//! As upstream: no localhost NodePorts (loopback is never a NodePort
//! address), masquerading by mark with `masquerade fully-random`, a
//! `cluster-ips-check` rejecting undefined ports of ClusterIPs and dropping
//! unallocated addresses of the ServiceCIDRs, `numgen random mod N vmap`
//! load balancing, affinity through dynamic sets with a timeout.
//!
//! Unlike upstream: service ports are rendered in name order and elements
//! listed sorted (upstream: Go map order; the kernel does not care).
//! Upstream's later rework (kubernetes PRs 135800 and 136499: the
//! `mark-for-masquerade` chain inlined, a hairpin set) is not followed yet:
//! this is the ruleset of upstream's tests with `mark-for-masquerade`.

pub mod base;
pub mod context;
pub mod maps;
pub mod maps_names;
pub mod names;
pub mod planner;
pub mod ruleset;
pub mod service;
pub mod staging;
pub mod transactions;

#[cfg(test)]
mod encoding_tests;
#[cfg(test)]
mod maps_tests;
#[cfg(test)]
mod planner_tests;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
pub(crate) mod trace;

pub use context::{nftables_context, NftRuleset, NftablesContext, NftablesSettings, NodePorts};
pub use planner::{NftablesPlanner, STALE_CHAIN_DELAY};
pub use ruleset::{Chain, Objects, Ruleset, SetElement};
pub use staging::{PortSource, PortSources, Staged, STAGES, STAGE_OPS};
pub use transactions::{
    changed_parts, delete_stale, element_refs, full_sync, full_sync_of, groups_sync, partial_sync, stale_chains, Delta,
    ElementRefs, KernelObjects,
};

pub use crate::msgs::nftables::{NftOp, Transaction};

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Endpoint, Model, ServicePort, ServicePortName};

/// One family's whole desired table for `model`.
pub fn desired(model: &Model, ctx: &NftablesContext) -> Ruleset {
    desired_keeping(model, ctx, &[])
}

/// [`desired`], its shared objects also serving the endpoint classes
/// `kept` (those the kernel holds: a partial sync never removes one).
pub fn desired_keeping(model: &Model, ctx: &NftablesContext, kept: &[maps_names::PickClass]) -> Ruleset {
    let services: BTreeMap<ServicePortName, Objects> =
        model.service_ports().map(|sp| (sp.name.clone(), render_port(ctx, sp, model.endpoints(&sp.name)))).collect();
    with_services(ctx, services, kept)
}

/// [`desired`] for a staged full sync: each service port's objects held
/// ([`Objects::hold`]) as soon as they are rendered, so the rules of the
/// whole table are never held at once, and the model's service ports
/// and endpoints [`Staged`] renders their rules from again when their
/// chains are written.
pub fn desired_held(model: &Model, ctx: &NftablesContext) -> (Ruleset, PortSources) {
    let mut ports: Vec<(ServicePortName, Objects, PortSource)> = model
        .service_ports()
        .map(|sp| {
            let endpoints = model.endpoint_list(&sp.name).cloned();
            let objects = render_port(ctx, sp, endpoints.as_deref().unwrap_or_default());
            let source = PortSource::new(sp.clone(), endpoints, &objects);
            (sp.name.clone(), objects.hold(), source)
        })
        .collect();
    ports.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let (services, sources): (Vec<(ServicePortName, Objects)>, Vec<PortSource>) =
        ports.into_iter().map(|(name, objects, source)| ((name, objects), source)).unzip();
    // Collected whole (not inserted one by one): the map's nodes full, as [`desired`]'s.
    let services: BTreeMap<ServicePortName, Objects> = services.into_iter().collect();
    (with_services(ctx, services, &[]), PortSources::new(ctx.clone(), sources))
}

/// The ruleset of `services` (rendered with `ctx`), its shared objects
/// serving their endpoint classes and `kept`.
fn with_services(
    ctx: &NftablesContext,
    services: BTreeMap<ServicePortName, Objects>,
    kept: &[maps_names::PickClass],
) -> Ruleset {
    let mut classes = maps::served(&maps::classes(services.values()));
    classes.extend(kept);
    let shared = shared(ctx, &classes);
    Ruleset { family: ctx.family, top: base::top_level(ctx), shared, services }
}

/// One service port's objects in `ctx`'s ruleset.
pub fn render_port(ctx: &NftablesContext, sp: &ServicePort, endpoints: &[Endpoint]) -> Objects {
    let objects = match ctx.ruleset {
        NftRuleset::Upstream => service::render_port(ctx, sp, endpoints),
        NftRuleset::Maps => maps::render_port(ctx, sp, endpoints),
    };
    objects.compact()
}

/// The shared objects serving `classes` (none in upstream's ruleset).
pub fn shared(ctx: &NftablesContext, classes: &BTreeSet<maps_names::PickClass>) -> Objects {
    match ctx.ruleset {
        NftRuleset::Upstream => Objects::default(),
        NftRuleset::Maps => maps::shared(ctx.family, classes),
    }
}

/// Renders `changed` service ports again into `rs` (removing those
/// missing from the model); the rest of `rs` is kept as it is. `ctx` must be
/// the context `rs` was rendered with (else render it whole: [`desired`]).
pub fn update<'a>(
    rs: &mut Ruleset,
    model: &Model,
    ctx: &NftablesContext,
    changed: impl IntoIterator<Item = &'a ServicePortName>,
) {
    for spn in changed {
        match model.service_port(spn) {
            Some(sp) => {
                rs.services.insert(spn.clone(), render_port(ctx, sp, model.endpoints(spn)));
            }
            None => {
                rs.services.remove(spn);
            }
        }
    }
    rs.shared = shared(ctx, &maps::served(&maps::classes(rs.services.values())));
}

/// `--dry-run` in nftables mode: the table a full sync from an empty kernel
/// leaves (the caller prints it after a `# nftables` line).
pub fn dry_run(model: &Model, ctx: &NftablesContext) -> String {
    desired(model, ctx).dump()
}
