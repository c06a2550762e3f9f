//! The `maps` ruleset (`--nftables-ruleset=maps`, docs/nftables-scalable.md):
//! upstream's behaviour with the per-Service state held as elements, so an
//! endpoint or a Service added, removed or changed is element deletes and
//! adds in plain sets and data maps, which the kernel neither validates nor
//! looks up in a list of per-Service sets.
//!
//! - Top level ([`chains`], [`sets`]): upstream's base chains, checks,
//!   masquerading and no-endpoint and firewall maps; `services` sends the
//!   keys in `maps-service-keys` / `maps-nodeport-keys` to the dispatch
//!   chains, which apply the traffic policies through class sets
//!   (`maps-external-cluster-keys`, ...) and go to a family's pick chain;
//!   `masquerading` masquerades hairpin connections (`maps-hairpin`).
//! - Shared ([`shared`]): what the endpoint classes served need, one
//!   [`PickClass`] (family, number of endpoints, affinity timeout) each: its
//!   set, its rule in the family's pick chain (`KEY @maps-<family>-<N> goto
//!   maps-<family>-pick-<N>`) and its chain (`dnat ip to KEY . numgen random
//!   mod N map @maps-<family>-endpoints`), and with affinity its chain, slot
//!   chains and per-slot affinity sets. A full sync serves the classes in
//!   use and the counts below them ([`served`]); a partial sync adds the
//!   classes it meets and removes none.
//! - Per service port ([`render_port`]): elements only (besides upstream's
//!   `firewall-…` chain of loadBalancerSourceRanges): its keys in the
//!   class sets, each key's endpoints in slots `0..N` of its family's
//!   endpoints map, its endpoints in `maps-hairpin`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::context::{if_local, if_not_local, NftablesContext};
use super::maps_names::*;
use super::names::{CLUSTER_IPS, MARK_MASQ};
use super::ruleset::{Chain, Objects, SetElement};
use super::service;
use crate::model::{Endpoint, ServicePort};
use crate::msgs::nftables::{Element, Expr, FibKey, Field, KeyPart, KeyType, Rule, SetFlag, SetSpec, Verdict};
use crate::net::IpFamily;

fn types(fields: &[Field]) -> Vec<KeyType> {
    fields.iter().map(|f| f.key_type()).collect()
}

fn lookup(key: Vec<Field>, set: &str) -> Expr {
    Expr::Lookup { key, set: set.to_string() }
}

fn jump(chain: &str) -> Expr {
    Expr::Verdict(Verdict::Jump(chain.to_string()))
}

fn goto(chain: &str) -> Expr {
    Expr::Verdict(Verdict::Goto(chain.to_string()))
}

/// `services`' rules: to the dispatch chains (`node_ports` matches the
/// destinations that take NodePorts).
pub fn services_rules(family: IpFamily, node_ports: Vec<Expr>) -> Vec<Rule> {
    let mut np = node_ports;
    np.extend([lookup(node_port_key(), NODEPORT_KEYS), goto(NODEPORT_DISPATCH)]);
    vec![Rule::new(vec![lookup(address_key(family), SERVICE_KEYS), goto(DISPATCH)]), Rule::new(np)]
}

/// `masquerading`'s first rule: hairpin connections are masqueraded.
pub fn hairpin_rule(family: IpFamily) -> Rule {
    let pair = vec![Field::Saddr(family), Field::Daddr(family)];
    Rule::new(vec![Expr::CtStatus(crate::msgs::nftables::CtStatus::Dnat), lookup(pair, HAIRPIN), jump(MARK_MASQ)])
}

/// The dispatch chains.
pub fn chains(ctx: &NftablesContext) -> Vec<Chain> {
    let family = ctx.family;
    let key = || address_key(family);
    let cluster_ips = || lookup(vec![Field::Daddr(family)], CLUSTER_IPS);
    let mut dispatch = vec![];
    if ctx.masquerade_all {
        dispatch.push(Rule::new(vec![cluster_ips(), jump(MARK_MASQ)]));
    } else if let Some(off_cluster) = if_not_local(family, &ctx.local) {
        dispatch.push(Rule::new(vec![cluster_ips(), off_cluster, jump(MARK_MASQ)]));
    }
    dispatch.extend([
        Rule::new(vec![lookup(key(), EXTERNAL_CLUSTER_KEYS), jump(MARK_MASQ)]),
        Rule::new(vec![lookup(key(), EXTERNAL_LOCAL_KEYS), goto(EXTERNAL_LOCAL)]),
        Rule::new(vec![lookup(key(), INTERNAL_LOCAL_KEYS), goto(&EndpointFamily::Local.pick())]),
        Rule::new(vec![goto(&EndpointFamily::Cluster.pick())]),
    ]);
    let node_ports = vec![
        Rule::new(vec![lookup(node_port_key(), NODEPORT_EXTERNAL_LOCAL_KEYS), goto(NODEPORT_EXTERNAL_LOCAL)]),
        Rule::new(vec![jump(MARK_MASQ)]),
        Rule::new(vec![goto(&EndpointFamily::NodePortCluster.pick())]),
    ];
    vec![
        Chain::regular(DISPATCH, dispatch),
        external_local(ctx, EXTERNAL_LOCAL, EndpointFamily::Cluster, EndpointFamily::Local),
        Chain::regular(NODEPORT_DISPATCH, node_ports),
        external_local(ctx, NODEPORT_EXTERNAL_LOCAL, EndpointFamily::NodePortCluster, EndpointFamily::NodePortLocal),
    ]
}

/// externalTrafficPolicy Local (upstream's external chain of such a
/// Service): pods and the node itself go to all endpoints, the rest to this
/// node's.
fn external_local(ctx: &NftablesContext, name: &str, cluster: EndpointFamily, local: EndpointFamily) -> Chain {
    let mut rules = vec![];
    if let Some(pods) = if_local(ctx.family, &ctx.local) {
        rules.push(Rule::commented(vec![pods, goto(&cluster.pick())], "short-circuit pod traffic"));
    }
    let from_node = || Expr::FibLocal(FibKey::Saddr);
    rules.push(Rule::commented(vec![from_node(), jump(MARK_MASQ)], "masquerade local traffic"));
    rules.push(Rule::commented(vec![from_node(), goto(&cluster.pick())], "short-circuit local traffic"));
    rules.push(Rule::new(vec![goto(&local.pick())]));
    Chain::regular(name, rules)
}

/// The key sets, the endpoints maps and `maps-hairpin`.
pub fn sets(family: IpFamily) -> Vec<SetSpec> {
    let addresses = types(&address_key(family));
    let node_ports = types(&node_port_key());
    let mut sets = vec![
        SetSpec::set(SERVICE_KEYS, addresses.clone(), None),
        SetSpec::set(NODEPORT_KEYS, node_ports.clone(), None),
        SetSpec::set(EXTERNAL_CLUSTER_KEYS, addresses.clone(), None),
        SetSpec::set(EXTERNAL_LOCAL_KEYS, addresses.clone(), None),
        SetSpec::set(INTERNAL_LOCAL_KEYS, addresses, None),
        SetSpec::set(NODEPORT_EXTERNAL_LOCAL_KEYS, node_ports, None),
        SetSpec::set(HAIRPIN, vec![KeyType::addr(family); 2], None),
    ];
    for f in EndpointFamily::ALL {
        let key = [f.key(family), vec![Field::constant(0)]].concat();
        sets.push(SetSpec::data_map(&f.endpoints(), key, vec![Field::Daddr(family), Field::Dport]));
    }
    sets
}

/// The pick chains, and what `classes` need: a set, a rule in the pick
/// chain and a chain each (with affinity, its affinity chain), and per
/// (family, timeout) the slot chains and affinity sets of the most
/// endpoints a class has. The group's `classes` are `classes`, sorted.
///
/// Each chain that DNATs from an endpoints map (a class's chain, a slot
/// chain) is a rule of its own that no other class changes: adding a rule
/// that reads a map makes the kernel walk every element of the map
/// (`nf_tables_bind_set`), so such a rule is written only when its class or
/// slot is new; the pick chain's rules read small plain sets.
pub fn shared(family: IpFamily, classes: &BTreeSet<PickClass>) -> Objects {
    let mut out = Objects { classes: classes.iter().copied().collect(), ..Objects::default() };
    for f in EndpointFamily::ALL {
        let key = f.key(family);
        let mut picks = vec![];
        for c in classes.iter().filter(|c| c.family == f) {
            out.sets.push(SetSpec::set(&c.set(), types(&key), None));
            let member = lookup(key.clone(), &c.set());
            let to = match c.affinity {
                None => {
                    let slot = Field::Numgen { modulus: c.endpoints, offset: 0 };
                    out.chains.push(Chain::regular(c.chain(), vec![Rule::new(vec![dnat(family, &key, slot, f)])]));
                    c.chain()
                }
                Some(t) => {
                    out.chains.push(affinity_chain(family, c, t));
                    c.affinity_chain(t)
                }
            };
            picks.push(Rule::new(vec![member, goto(&to)]));
        }
        out.chains.push(Chain::regular(f.pick(), picks));
    }
    let slots = largest(classes, |c| c.affinity.map(|t| (c.family, t)));
    for ((f, t), most) in slots {
        for slot in 0..most {
            out.chains.push(slot_chain(family, f, t, slot));
            let clients = [f.key(family), vec![Field::Saddr(family)]].concat();
            out.sets.push(SetSpec {
                flags: vec![SetFlag::Dynamic, SetFlag::Timeout],
                timeout: Some(t),
                ..SetSpec::set(&f.affinity_set(t, slot), types(&clients), None)
            });
        }
    }
    out
}

/// `dnat ip to KEY . SLOT map @maps-<family>-endpoints`.
fn dnat(family: IpFamily, key: &[Field], slot: Field, f: EndpointFamily) -> Expr {
    Expr::DnatMap { family, key: [key, &[slot]].concat(), map: f.endpoints() }
}

/// A class with affinity: a client remembered for a slot goes there, any
/// other to a slot at random.
fn affinity_chain(family: IpFamily, c: &PickClass, timeout: u32) -> Chain {
    let f = c.family;
    let clients = [f.key(family), vec![Field::Saddr(family)]].concat();
    let mut rules: Vec<Rule> = (0..c.endpoints)
        .map(|slot| {
            Rule::new(vec![lookup(clients.clone(), &f.affinity_set(timeout, slot)), goto(&f.slot_chain(timeout, slot))])
        })
        .collect();
    let arms = (0..c.endpoints).map(|slot| Verdict::Goto(f.slot_chain(timeout, slot))).collect();
    rules.push(Rule::new(vec![Expr::NumgenVmap(arms)]));
    Chain::regular(c.affinity_chain(timeout), rules)
}

/// Slot `slot` with affinity: the client remembered (a rule of its own: a
/// full set breaks its rule), then DNAT.
fn slot_chain(family: IpFamily, f: EndpointFamily, timeout: u32, slot: u32) -> Chain {
    let clients = [f.key(family), vec![Field::Saddr(family)]].concat();
    let remember = Expr::Update { set: f.affinity_set(timeout, slot), key: clients };
    let to = dnat(family, &f.key(family), Field::constant(slot), f);
    Chain::regular(f.slot_chain(timeout, slot), vec![Rule::new(vec![remember]), Rule::new(vec![to])])
}

/// One service port's objects: upstream's check elements and firewall
/// chain, and its keys, classes, slots and hairpin elements.
pub fn render_port(ctx: &NftablesContext, sp: &ServicePort, endpoints: &[Endpoint]) -> Objects {
    let p = service::plan(ctx, sp, endpoints);
    let mut out = Objects::default();
    service::elements(&p, false, &mut out.elements);
    if p.uses_fw {
        out.chains.push(service::firewall_chain(&p));
    }
    let none: &[&Endpoint] = &[];
    let cluster = if sp.uses_cluster_endpoints() { p.cluster.as_slice() } else { none };
    let local = if sp.uses_local_endpoints() { p.local.as_slice() } else { none };
    let mut port = PortElements { out: &mut out, affinity: sp.affinity_timeout, used: BTreeSet::new() };
    if p.has_internal {
        let (f, eps) = match sp.internal_policy_local {
            true => (EndpointFamily::Local, local),
            false => (EndpointFamily::Cluster, cluster),
        };
        let kc = p.key(sp.cluster_ip);
        if !eps.is_empty() {
            port.member(SERVICE_KEYS, &kc);
            if sp.internal_policy_local {
                port.member(INTERNAL_LOCAL_KEYS, &kc);
            }
            port.pick(f, &kc, eps);
        }
    }
    if p.has_endpoints {
        let policy = ExternalPolicy { local: sp.external_policy_local, cluster, local_endpoints: local };
        for ip in p.external_addresses().collect::<Vec<IpAddr>>() {
            let ke = p.key(ip);
            port.member(SERVICE_KEYS, &ke);
            port.external(&ke, &policy, ADDRESS_KEYS);
        }
        if sp.node_port != 0 {
            let kn = p.node_port_key();
            port.member(NODEPORT_KEYS, &kn);
            port.external(&kn, &policy, NODE_PORT_KEYS);
        }
    }
    let used = std::mem::take(&mut port.used);
    out.elements.extend(used.into_iter().map(|ip| SetElement {
        set: HAIRPIN.into(),
        element: Element::key(vec![KeyPart::Addr(ip), KeyPart::Addr(ip)]),
    }));
    out
}

/// An external key's endpoints: with a Local policy, this node's, and all
/// of them for pods and the node itself.
struct ExternalPolicy<'a> {
    local: bool,
    cluster: &'a [&'a Endpoint],
    local_endpoints: &'a [&'a Endpoint],
}

/// Where an external key of a kind goes: its families (all endpoints, this
/// node's), the set of the keys of a Local policy, and of those masqueraded
/// by their key (NodePorts are all masqueraded by their dispatch chain).
struct ExternalKeys {
    cluster: EndpointFamily,
    local: EndpointFamily,
    local_keys: &'static str,
    masquerade_keys: Option<&'static str>,
}

const ADDRESS_KEYS: ExternalKeys = ExternalKeys {
    cluster: EndpointFamily::Cluster,
    local: EndpointFamily::Local,
    local_keys: EXTERNAL_LOCAL_KEYS,
    masquerade_keys: Some(EXTERNAL_CLUSTER_KEYS),
};

const NODE_PORT_KEYS: ExternalKeys = ExternalKeys {
    cluster: EndpointFamily::NodePortCluster,
    local: EndpointFamily::NodePortLocal,
    local_keys: NODEPORT_EXTERNAL_LOCAL_KEYS,
    masquerade_keys: None,
};

/// A service port's elements being collected.
struct PortElements<'a> {
    out: &'a mut Objects,
    affinity: Option<u32>,
    /// The endpoint addresses some key goes to.
    used: BTreeSet<IpAddr>,
}

impl PortElements<'_> {
    fn member(&mut self, set: &str, key: &[KeyPart]) {
        self.out.elements.push(SetElement { set: set.into(), element: Element::key(key.to_vec()) });
    }

    /// `key`'s class and its endpoints in slots `0..N` of `f`'s map.
    fn pick(&mut self, f: EndpointFamily, key: &[KeyPart], eps: &[&Endpoint]) {
        if eps.is_empty() {
            return;
        }
        let class = PickClass { family: f, affinity: self.affinity, endpoints: eps.len() as u32 };
        self.member(&class.set(), key);
        for (slot, ep) in eps.iter().enumerate() {
            let slot_key = [key, &[KeyPart::Slot(slot as u32)]].concat();
            let to = Element::data(slot_key, vec![KeyPart::Addr(ep.ip), KeyPart::Port(ep.port)]);
            self.out.elements.push(SetElement { set: f.endpoints(), element: to });
            self.used.insert(ep.ip);
        }
        self.out.classes.push(class);
    }

    /// An external key (an address or a NodePort) and its endpoints.
    fn external(&mut self, key: &[KeyPart], policy: &ExternalPolicy, kind: ExternalKeys) {
        if policy.local {
            self.member(kind.local_keys, key);
            self.pick(kind.cluster, key, policy.cluster);
            self.pick(kind.local, key, policy.local_endpoints);
        } else {
            if let Some(masquerade) = kind.masquerade_keys {
                self.member(masquerade, key);
            }
            self.pick(kind.cluster, key, policy.cluster);
        }
    }
}

/// The classes `groups` use.
pub fn classes<'a>(groups: impl IntoIterator<Item = &'a Objects>) -> BTreeSet<PickClass> {
    groups.into_iter().flat_map(|o| o.classes.iter().copied()).collect()
}

/// The classes a full sync writes for the classes `in_use`: for each
/// family and affinity in use, every count from 1 to the power of two above
/// the largest in use (a count that appears later within that range costs
/// no rule: its chain is there).
pub fn served(in_use: &BTreeSet<PickClass>) -> BTreeSet<PickClass> {
    let groups = largest(in_use, |c| Some((c.family, c.affinity)));
    let precreated = groups.into_iter().flat_map(|((family, affinity), most)| {
        (1..=(most + 1).next_power_of_two()).map(move |endpoints| PickClass { family, affinity, endpoints })
    });
    in_use.iter().copied().chain(precreated).collect()
}

/// The largest count of `classes` per `group` (classes without one left out).
fn largest<K: Ord>(classes: &BTreeSet<PickClass>, group: impl Fn(&PickClass) -> Option<K>) -> BTreeMap<K, u32> {
    let mut most = BTreeMap::new();
    for c in classes {
        if let Some(k) = group(c) {
            let n: &mut u32 = most.entry(k).or_default();
            *n = (*n).max(c.endpoints);
        }
    }
    most
}
