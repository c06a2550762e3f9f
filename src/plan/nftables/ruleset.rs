//! The desired content of one family's `kube-proxy` table as typed data:
//! chains (with their rules), sets and verdict maps, and elements. The
//! top-level objects and each service port's objects are kept apart, so a
//! change to one service port touches only its own piece (see
//! [`super::transactions`]).
//!
//! [`Ruleset::dump`] lists the whole table in `nft -f` syntax as knftables
//! writes it, in the order of knftables' `Fake.Dump()`, which upstream's
//! tests compare against.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::context::NftablesContext;
use super::maps_names::PickClass;
use crate::model::{EndpointList, ServicePort, ServicePortName};
pub use crate::msgs::nftables::nft_family;
use crate::msgs::nftables::{BaseChain, Element, KeyPart, NftOp, Rule, SetSpec, Transaction};
use crate::net::IpFamily;

/// A chain and its rules, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
    pub comment: Option<String>,
    pub rules: Vec<Rule>,
}

impl Chain {
    pub fn regular(name: impl Into<String>, rules: Vec<Rule>) -> Chain {
        Chain { name: name.into(), base: None, comment: None, rules }
    }

    /// `add chain` of this chain (its rules are ops of their own).
    pub fn add_op(&self) -> NftOp {
        NftOp::AddChain { name: self.name.clone(), base: self.base, comment: self.comment.clone() }
    }
}

/// An element of a named set or map.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetElement {
    /// The set or map.
    pub set: String,
    pub element: Element,
}

impl SetElement {
    /// `(set, key)`: what identifies an element in the kernel.
    pub fn id(&self) -> (String, Vec<KeyPart>) {
        (self.set.clone(), self.element.key.clone())
    }

    /// `add element` of this element.
    pub fn add_op(&self) -> NftOp {
        NftOp::AddElements { set: self.set.clone(), elements: vec![self.element.clone()] }
    }
}

/// What a service port's objects are rendered from: the context and the
/// model's service port and endpoints (shared with the model, which
/// replaces them rather than changing them). Rendering is a pure function
/// of these, so a held group ([`Objects::hold`]) keeps them instead of its
/// objects and renders them again when a sync needs them.
#[derive(Debug, Clone)]
pub struct Origin {
    ctx: Arc<NftablesContext>,
    port: Arc<ServicePort>,
    endpoints: Option<EndpointList>,
}

impl Origin {
    pub fn new(ctx: Arc<NftablesContext>, port: Arc<ServicePort>, endpoints: Option<EndpointList>) -> Origin {
        Origin { ctx, port, endpoints }
    }

    /// The service port's objects, rendered.
    pub fn render(&self) -> Objects {
        super::render_port(&self.ctx, &self.port, self.endpoints.as_deref().unwrap_or_default())
    }
}

/// A group of objects: the top-level ones, the shared ones, or one
/// service port's.
#[derive(Debug, Default, Clone)]
pub struct Objects {
    pub chains: Vec<Chain>,
    pub sets: Vec<SetSpec>,
    /// Elements, of this group's sets or of the top-level maps.
    pub elements: Vec<SetElement>,
    /// The `maps` ruleset: the endpoint classes a service port's elements
    /// use, which the shared objects serve ([`super::maps::shared`]).
    pub classes: Vec<PickClass>,
    /// `Some(digest)` when the chains' rules are dropped ([`Objects::hold`]):
    /// the digest of the objects as they were rendered.
    pub held: Option<u64>,
    /// What a service port's objects were rendered from, when known.
    pub origin: Option<Origin>,
    /// Whether only the digest, the classes and the origin are kept
    /// ([`Objects::hold`]): the rest is rendered again ([`Objects::again`]).
    pub shed: bool,
}

/// Two held groups are equal when their digests are (whatever each still
/// holds of its objects); otherwise the objects are compared.
impl PartialEq for Objects {
    fn eq(&self, other: &Objects) -> bool {
        match (self.held, other.held) {
            (Some(a), Some(b)) => a == b,
            _ => {
                (&self.chains, &self.sets, &self.elements, &self.classes, self.held)
                    == (&other.chains, &other.sets, &other.elements, &other.classes, other.held)
            }
        }
    }
}

impl Eq for Objects {}

impl Objects {
    /// The same objects with no spare capacity in their vectors: a
    /// service port's objects are held for as long as the kernel has
    /// them, and a vector grown by pushes keeps up to twice the room it uses.
    pub fn compact(mut self) -> Objects {
        for c in &mut self.chains {
            c.rules.shrink_to_fit();
        }
        self.chains.shrink_to_fit();
        self.sets.shrink_to_fit();
        self.elements.shrink_to_fit();
        self.classes.shrink_to_fit();
        self
    }

    /// A digest of every chain (rules included), set, element and class:
    /// what a held group is compared by ([`Objects::same_as`]).
    pub fn digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        (&self.chains, &self.sets, &self.elements, &self.classes).hash(&mut h);
        h.finish()
    }

    /// The objects as a staged full sync keeps them while it writes
    /// them: the chains' rules dropped (a change rewrites a chain whole,
    /// so only its name is needed), their digest kept; the names, sets and
    /// elements (a partial sync deletes and adds by them) as they are.
    pub fn hold_rules(mut self) -> Objects {
        if self.held.is_none() {
            self.held = Some(self.digest());
            for c in &mut self.chains {
                c.rules = Vec::new();
            }
        }
        self
    }

    /// The objects as the planner keeps what the kernel holds between
    /// syncs: with an [`Origin`], its digest, classes and origin only (the
    /// rest rendered again when a sync needs it: [`Objects::again`]);
    /// without one, as [`Objects::hold_rules`] keeps them.
    pub fn hold(self) -> Objects {
        let mut held = self.hold_rules();
        if held.origin.is_some() {
            held.chains = Vec::new();
            held.sets = Vec::new();
            held.elements = Vec::new();
            held.shed = true;
        }
        held
    }

    /// The same objects with `origin` as what they were rendered from.
    pub fn with_origin(self, origin: Origin) -> Objects {
        Objects { origin: Some(origin), ..self }
    }

    /// The objects of a group held with only its origin
    /// ([`Objects::hold`]), rendered again; `None` when the group holds
    /// them itself.
    pub fn again(&self) -> Option<Objects> {
        self.origin.as_ref().filter(|_| self.shed).map(Origin::render)
    }

    /// Whether `new` (rendered) has what these objects have: the same
    /// digest when these are held, else equal.
    pub fn same_as(&self, new: &Objects) -> bool {
        match (self.held, new.held) {
            (Some(d), None) => d == new.digest(),
            _ => self == new,
        }
    }
}

/// One family's desired `kube-proxy` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    pub family: IpFamily,
    /// Base chains, top-level chains, sets and maps, `nodeport-ips` members.
    pub top: Objects,
    /// The `maps` ruleset: the chains and sets of the endpoint classes
    /// some service port uses (empty in upstream's).
    pub shared: Objects,
    /// Each service port's chains, affinity sets, and its elements in the top-level maps.
    pub services: BTreeMap<ServicePortName, Objects>,
}

impl Ruleset {
    /// Holds each service port's objects ([`Objects::hold`]): what the
    /// planner keeps of what the kernel holds.
    pub fn hold(&mut self) {
        for objects in self.services.values_mut() {
            *objects = std::mem::take(objects).hold();
        }
    }

    /// Every group: the top level, the shared objects, each service port's.
    pub fn groups(&self) -> impl Iterator<Item = &Objects> {
        [&self.top, &self.shared].into_iter().chain(self.services.values())
    }

    /// Every chain, top-level and per service port.
    pub fn chains(&self) -> impl Iterator<Item = &Chain> {
        self.groups().flat_map(|o| o.chains.iter())
    }

    /// Every set and map.
    pub fn sets(&self) -> impl Iterator<Item = &SetSpec> {
        self.groups().flat_map(|o| o.sets.iter())
    }

    /// Every element.
    pub fn elements(&self) -> impl Iterator<Item = &SetElement> {
        self.groups().flat_map(|o| o.elements.iter())
    }

    /// The whole table as one transaction in knftables' `Fake.Dump()`
    /// order: the table; chains, sets, then maps, each sorted by name;
    /// every chain's rules (chains by name, rules in order); the elements
    /// of the sets, then of the maps (each set's sorted by their text, an
    /// element several groups hold listed once). Objects come before
    /// anything naming them, so it applies to an empty kernel.
    pub fn dump_transaction(&self) -> Transaction {
        let chains: BTreeMap<&str, &Chain> = self.chains().map(|c| (c.name.as_str(), c)).collect();
        let sets: BTreeMap<(bool, &str), &SetSpec> = self.sets().map(|s| ((s.is_map(), s.name.as_str()), s)).collect();
        let is_map: BTreeMap<&str, bool> = sets.keys().map(|(m, n)| (*n, *m)).collect();
        let mut elements: BTreeMap<(bool, &str), BTreeMap<String, &Element>> = BTreeMap::new();
        for e in self.elements() {
            let map = is_map.get(e.set.as_str()).copied().unwrap_or(false);
            elements.entry((map, e.set.as_str())).or_default().entry(e.element.to_string()).or_insert(&e.element);
        }
        let mut tx = Transaction::new(self.family);
        tx.push(NftOp::add_table());
        chains.values().for_each(|c| tx.push(c.add_op()));
        sets.values().for_each(|s| tx.push(NftOp::AddSet((*s).clone())));
        for c in chains.values() {
            c.rules.iter().for_each(|r| tx.push(NftOp::AddRule { chain: c.name.clone(), rule: r.clone() }));
        }
        for ((_, set), listed) in elements {
            let elements = listed.into_values().cloned().collect();
            tx.push(NftOp::AddElements { set: set.to_string(), elements });
        }
        tx
    }

    /// The whole table as `nft -f` input ([`Self::dump_transaction`]).
    pub fn dump(&self) -> String {
        self.dump_transaction().to_string()
    }
}

impl fmt::Display for Ruleset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.dump())
    }
}
