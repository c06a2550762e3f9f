//! What one service port wants from the kernel in IPVS mode: virtual
//! servers, real servers, ipset entries and kube-ipvs0 addresses. Follows
//! upstream's IPVS proxier syncProxyRules/syncService/syncEndpoint
//! (pkg/proxy/ipvs/proxier.go), one constructor per kind of object.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::sets::IpvsSet;
use crate::model::topology::categorize;
use crate::model::{Endpoint, ServicePort};
use crate::msgs::ipvs::{FLAG_PERSISTENT, FLAG_SCHED_FALLBACK, FLAG_SCHED_PORT};
use crate::msgs::{DestKey, DestSpec, SetEntry, VsKey, VsSpec};
use crate::net::{IpFamily, Protocol};

/// What the planner knows besides the model: config and node facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanContext {
    pub family: IpFamily,
    /// IPVS scheduler ("" in the config already resolved to "rr").
    pub scheduler: String,
    pub node_name: String,
    pub zone: String,
    /// Addresses that get NodePort virtual servers: the node's addresses
    /// filtered by nodePortAddresses, without loopback and without kube-ipvs0's.
    pub node_port_ips: Vec<IpAddr>,
    /// Every local address except kube-ipvs0's: an externalIP that is one of
    /// these is not bound to kube-ipvs0 (upstream's nodeAddressSet).
    pub node_addresses: BTreeSet<IpAddr>,
    /// The node's primary IP (LB source ranges that contain it allow the node itself).
    pub node_ip: Option<IpAddr>,
}

/// Everything one service port claims, each list sorted and deduplicated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contribution {
    pub services: Vec<(VsKey, VsSpec)>,
    pub dests: Vec<((VsKey, DestKey), DestSpec)>,
    pub entries: Vec<((IpvsSet, SetEntry), ())>,
    pub addresses: Vec<(IpAddr, ())>,
    /// LB (vip, protocol, port) whose source ranges exclude the node: the
    /// node itself must not reach them (KUBE-IPVS-OUT-FILTER DROP).
    pub lb_no_node_access: Vec<((IpAddr, Protocol, u16), ())>,
}

impl Contribution {
    fn finish(mut self) -> Self {
        self.services.sort();
        self.services.dedup_by(|a, b| a.0 == b.0);
        self.dests.sort();
        self.dests.dedup_by(|a, b| a.0 == b.0);
        self.entries.sort();
        self.entries.dedup();
        self.addresses.sort();
        self.addresses.dedup();
        self.lb_no_node_access.sort();
        self.lb_no_node_access.dedup();
        self
    }
}

/// The virtual-server settings for a service port.
pub fn vs_spec(ctx: &PlanContext, sp: &ServicePort) -> VsSpec {
    let mut flags = 0;
    let mut timeout = 0;
    if let Some(t) = sp.affinity_timeout {
        flags |= FLAG_PERSISTENT;
        timeout = t;
    }
    let scheduler = match sp.ipvs_scheduler {
        // The Service's own (its annotations): exactly the flags it names.
        Some(s) => {
            flags |= if s.fallback { FLAG_SCHED_FALLBACK } else { 0 } | if s.port { FLAG_SCHED_PORT } else { 0 };
            s.name.to_string()
        }
        None => {
            // Upstream sets the source-hash port flag for the "mh" scheduler.
            if ctx.scheduler == "mh" {
                flags |= FLAG_SCHED_PORT;
            }
            ctx.scheduler.clone()
        }
    };
    VsSpec { scheduler, flags, timeout }
}

/// Builds one service port's contribution.
pub fn contribution(ctx: &PlanContext, sp: &ServicePort, endpoints: &[Endpoint]) -> Contribution {
    let mut c = Contribution::default();
    let cat = categorize(endpoints, sp, &ctx.node_name, &ctx.zone);
    // Upstream's syncEndpoint(onlyNodeLocalEndpoints): local endpoints if
    // there are any, else the cluster ones (kubernetes PR 97081: local pods
    // keep working; external replies come from the pod IP and are dropped).
    let pick = |local_policy: bool| if local_policy && !cat.local.is_empty() { &cat.local } else { &cat.cluster };
    let internal = pick(sp.internal_policy_local);
    let external = pick(sp.external_policy_local);
    let spec = vs_spec(ctx, sp);

    cluster_ip(&mut c, sp, &spec, internal);
    loop_back(&mut c, sp, endpoints);
    for ip in &sp.external_ips {
        external_ip(&mut c, ctx, sp, *ip, &spec, external);
    }
    for vip in &sp.load_balancer_vips {
        load_balancer(&mut c, ctx, sp, *vip, &spec, external);
    }
    // Upstream skips NodePorts entirely (sets too) when no node IP qualifies.
    if sp.node_port != 0 && !ctx.node_port_ips.is_empty() {
        node_port(&mut c, ctx, sp, &spec, external);
    }
    if sp.health_check_node_port != 0 {
        c.entries.push(((IpvsSet::HealthCheckNodePort, SetEntry::Port(sp.health_check_node_port)), ()));
    }
    c.finish()
}

fn add_vs(c: &mut Contribution, key: VsKey, spec: &VsSpec, eps: &[&Endpoint]) {
    c.services.push((key, spec.clone()));
    for ep in eps {
        c.dests.push(((key, DestKey { addr: ep.ip, port: ep.port }), DestSpec::default()));
    }
}

fn cluster_ip(c: &mut Contribution, sp: &ServicePort, spec: &VsSpec, eps: &[&Endpoint]) {
    let key = VsKey { addr: sp.cluster_ip, protocol: sp.protocol(), port: sp.port };
    c.entries.push(((IpvsSet::ClusterIp, SetEntry::IpPort(sp.cluster_ip, sp.protocol(), sp.port)), ()));
    c.entries.push(((IpvsSet::IpvsIps, SetEntry::Ip(sp.cluster_ip)), ()));
    c.addresses.push((sp.cluster_ip, ()));
    add_vs(c, key, spec, eps);
}

/// KUBE-LOOP-BACK: every local endpoint, for hairpin masquerade.
fn loop_back(c: &mut Contribution, sp: &ServicePort, endpoints: &[Endpoint]) {
    for ep in endpoints.iter().filter(|e| e.is_local) {
        let entry = SetEntry::IpPortIp(ep.ip, sp.protocol(), ep.port, ep.ip);
        c.entries.push(((IpvsSet::LoopBack, entry), ()));
    }
}

fn external_ip(
    c: &mut Contribution,
    ctx: &PlanContext,
    sp: &ServicePort,
    ip: IpAddr,
    spec: &VsSpec,
    eps: &[&Endpoint],
) {
    let set = if sp.external_policy_local { IpvsSet::ExternalIpLocal } else { IpvsSet::ExternalIp };
    c.entries.push(((set, SetEntry::IpPort(ip, sp.protocol(), sp.port)), ()));
    bind_unless_node_address(c, ctx, ip);
    add_vs(c, VsKey { addr: ip, protocol: sp.protocol(), port: sp.port }, spec, eps);
}

/// An address that is already on another interface must not be bound to
/// the dummy device (upstream's shouldBind); KUBE-IPVS-IPS holds the bound ones.
fn bind_unless_node_address(c: &mut Contribution, ctx: &PlanContext, ip: IpAddr) {
    if !ctx.node_addresses.contains(&ip) {
        c.addresses.push((ip, ()));
        c.entries.push(((IpvsSet::IpvsIps, SetEntry::Ip(ip)), ()));
    }
}

fn load_balancer(
    c: &mut Contribution,
    ctx: &PlanContext,
    sp: &ServicePort,
    vip: IpAddr,
    spec: &VsSpec,
    eps: &[&Endpoint],
) {
    let proto = sp.protocol();
    let entry = SetEntry::IpPort(vip, proto, sp.port);
    c.entries.push(((IpvsSet::LoadBalancer, entry), ()));
    if sp.external_policy_local {
        c.entries.push(((IpvsSet::LoadBalancerLocal, entry), ()));
    }
    if sp.restricts_sources() {
        c.entries.push(((IpvsSet::LoadBalancerFw, entry), ()));
        let mut allow_from_node = false;
        for net in &sp.load_balancer_source_ranges {
            c.entries.push(((IpvsSet::LoadBalancerSourceCidr, SetEntry::IpPortNet(vip, proto, sp.port, *net)), ()));
            allow_from_node |= ctx.node_ip.is_some_and(|ip| net.contains(&ip));
        }
        // Upstream: traffic from the node to its own LB VIP loops back
        // locally, so allow it when the ranges include the node.
        if allow_from_node {
            c.entries.push(((IpvsSet::LoadBalancerSourceIp, SetEntry::IpPortIp(vip, proto, sp.port, vip)), ()));
        } else {
            c.lb_no_node_access.push(((vip, proto, sp.port), ()));
        }
    }
    bind_unless_node_address(c, ctx, vip);
    add_vs(c, VsKey { addr: vip, protocol: proto, port: sp.port }, spec, eps);
}

fn node_port(c: &mut Contribution, ctx: &PlanContext, sp: &ServicePort, spec: &VsSpec, eps: &[&Endpoint]) {
    let np = sp.node_port;
    let local = sp.external_policy_local;
    match sp.protocol() {
        Protocol::Tcp | Protocol::Udp => {
            let (all, loc) = if sp.protocol() == Protocol::Tcp {
                (IpvsSet::NodePortTcp, IpvsSet::NodePortLocalTcp)
            } else {
                (IpvsSet::NodePortUdp, IpvsSet::NodePortLocalUdp)
            };
            c.entries.push(((all, SetEntry::Port(np)), ()));
            if local {
                c.entries.push(((loc, SetEntry::Port(np)), ()));
            }
        }
        Protocol::Sctp => {
            for ip in &ctx.node_port_ips {
                let e = SetEntry::IpPort(*ip, Protocol::Sctp, np);
                c.entries.push(((IpvsSet::NodePortSctp, e), ()));
                if local {
                    c.entries.push(((IpvsSet::NodePortLocalSctp, e), ()));
                }
            }
        }
    }
    for ip in &ctx.node_port_ips {
        add_vs(c, VsKey { addr: *ip, protocol: sp.protocol(), port: np }, spec, eps);
    }
}
