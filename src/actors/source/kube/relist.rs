//! What each kind's consumer has been told, and a relist in progress:
//! the source's pure core ([`RelistState`]).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{debug, info};

use super::item::{Item, Refused};
use crate::msgs::source::{Change, ResourceKind, SourceEvent};

/// A kind the source watches.
pub trait Watched:
    Resource<DynamicType = ()> + Clone + Debug + Default + DeserializeOwned + PartialEq + Send + Sync + 'static
{
    const KIND: ResourceKind;
    /// Nothing needs the kind to work: an API server that does not serve
    /// it (404) or does not let us list it (403) is noted once and tried
    /// again every [`UNAVAILABLE_RETRY`], not at the usual backoff.
    const OPTIONAL: bool = false;
    /// The event carrying `change`.
    fn event(change: Change<Self>) -> SourceEvent;

    /// What the source keeps of an object it has sent: its resourceVersion
    /// and uid, which tell a later version apart and, with its key, name it
    /// in a deletion (all the model reads of a deleted Service or
    /// EndpointSlice). At 10,000 services the whole objects were ≈ 55 MB
    /// the model had already turned into its own form, and an identity
    /// object (a default `Service` with four fields set) still ≈ 1 KB. An
    /// object without a resourceVersion is kept whole (it is compared whole).
    fn kept(object: Arc<Self>) -> Kept<Self> {
        match object.resource_version() {
            Some(resource_version) => Kept::Version { resource_version, uid: object.meta().uid.clone() },
            None => Kept::Whole(object),
        }
    }
}

/// A relisted object: as read (`Ok`), or refused when listed and counted
/// as the version known before (`Err`).
type Listed<K> = Result<Arc<K>, Kept<K>>;

/// What the source keeps of an object it has sent ([`Watched::kept`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Kept<K> {
    Version { resource_version: String, uid: Option<String> },
    Whole(Arc<K>),
}

impl<K: Watched> Kept<K> {
    /// `new` is the version this stands for.
    fn same_version(&self, new: &K) -> bool {
        match self {
            Kept::Version { resource_version, .. } => new.resource_version().as_deref() == Some(resource_version),
            Kept::Whole(old) => same_version(old.as_ref(), new),
        }
    }

    /// The object a deletion carries: the whole object, or one carrying
    /// only its identity and last version.
    fn object(&self, (namespace, name): &ObjectKey) -> Arc<K> {
        match self {
            Kept::Whole(object) => object.clone(),
            Kept::Version { resource_version, uid } => Arc::new(identity(&ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()).filter(|ns| !ns.is_empty()),
                resource_version: Some(resource_version.clone()),
                uid: uid.clone(),
                ..ObjectMeta::default()
            })),
        }
    }
}

/// An object carrying only `meta`'s name, namespace, resourceVersion and uid.
fn identity<K: Watched>(meta: &ObjectMeta) -> K {
    let mut identity = K::default();
    let kept = identity.meta_mut();
    kept.name = meta.name.clone();
    kept.namespace = meta.namespace.clone();
    kept.resource_version = meta.resource_version.clone();
    kept.uid = meta.uid.clone();
    identity
}

impl Watched for Service {
    const KIND: ResourceKind = ResourceKind::Service;
    fn event(change: Change<Self>) -> SourceEvent {
        SourceEvent::Service(change)
    }
}

impl Watched for EndpointSlice {
    const KIND: ResourceKind = ResourceKind::EndpointSlice;
    fn event(change: Change<Self>) -> SourceEvent {
        SourceEvent::EndpointSlice(change)
    }
}

impl Watched for Node {
    const KIND: ResourceKind = ResourceKind::Node;
    fn event(change: Change<Self>) -> SourceEvent {
        SourceEvent::Node(change)
    }

    /// Our own Node, kept whole: its deletion marks the node as being
    /// deleted with its last labels and addresses (/healthz).
    fn kept(object: Arc<Self>) -> Kept<Self> {
        Kept::Whole(object)
    }
}

impl Watched for ServiceCIDR {
    const KIND: ResourceKind = ResourceKind::ServiceCidr;
    const OPTIONAL: bool = true;
    fn event(change: Change<Self>) -> SourceEvent {
        SourceEvent::ServiceCidr(change)
    }
}

/// Namespace (empty for cluster-scoped objects) and name.
type ObjectKey = (String, String);

fn key_of<K: Resource>(object: &K) -> ObjectKey {
    (object.namespace().unwrap_or_default(), object.name_any())
}

fn refused_key(refused: &Refused) -> ObjectKey {
    let text = |field: &Option<String>| field.clone().unwrap_or_default();
    (text(&refused.meta.namespace), text(&refused.meta.name))
}

/// The same version of an object: equal resourceVersions, or equal
/// objects when either has none.
fn same_version<K: Watched>(a: &K, b: &K) -> bool {
    match (a.resource_version(), b.resource_version()) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

/// Objects of a kind's first list passed on together, before the list is
/// complete ([`RelistState`]): the size of kube-rs's list pages.
pub const FIRST_LIST_CHUNK: usize = 500;

/// What one kind's consumer has been told, and the relist in progress: the
/// pure core of the source. Feed it watcher events; it returns the source
/// events to send, logs the objects it refuses and counts them
/// ([`RelistState::take_refusals`]).
///
/// Until the kind's first list completes, its objects are passed on as
/// they are listed, [`FIRST_LIST_CHUNK`] at a time, and only their
/// identities kept: nothing syncs before the kind's `Synced`, so there is
/// nothing to swap at once, and the whole list is never held decoded (at
/// 10,000 services, dual-stack, ≈ 80 MB that stayed alive into the first
/// sync). A later relist is buffered and swapped in whole.
#[derive(Debug)]
pub struct RelistState<K> {
    /// The objects as last sent, as [`Watched::kept`] keeps them.
    known: BTreeMap<ObjectKey, Kept<K>>,
    /// Objects listed since `Init`, until `InitDone`: as read, or (refused
    /// when listed, or already passed on in the first list) as known.
    relisting: Option<BTreeMap<ObjectKey, Listed<K>>>,
    /// First-list objects not passed on yet.
    chunk: Vec<SourceEvent>,
    /// First-list objects passed on since `Init` (for the log).
    passed_on: usize,
    synced: bool,
    /// Objects refused since the last [`RelistState::take_refusals`].
    refusals: Vec<Refused>,
}

impl<K: Watched> Default for RelistState<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Watched> RelistState<K> {
    /// Nothing known, nothing listed yet.
    pub fn new() -> Self {
        Self {
            known: BTreeMap::new(),
            relisting: None,
            chunk: Vec::new(),
            passed_on: 0,
            synced: false,
            refusals: Vec::new(),
        }
    }

    /// The first list has completed.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// How many objects the consumer knows.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// The consumer knows no object.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// The objects refused (and logged) since the last call, for the
    /// metric and the dashboard.
    pub fn take_refusals(&mut self) -> Vec<Refused> {
        std::mem::take(&mut self.refusals)
    }

    /// The source events `event` implies, in order.
    pub fn handle(&mut self, event: Event<K>) -> Vec<SourceEvent> {
        self.handle_item(match event {
            Event::Init => Event::Init,
            Event::InitApply(object) => Event::InitApply(object.into()),
            Event::InitDone => Event::InitDone,
            Event::Apply(object) => Event::Apply(object.into()),
            Event::Delete(object) => Event::Delete(object.into()),
        })
    }

    /// [`RelistState::handle`] of objects as read, some maybe refused.
    pub fn handle_item(&mut self, event: Event<Item<K>>) -> Vec<SourceEvent> {
        match event {
            Event::Init => {
                self.relisting = Some(BTreeMap::new());
                self.passed_on = 0;
                // A first list starting over: what it passed on is known.
                std::mem::take(&mut self.chunk)
            }
            Event::InitApply(item) => {
                match item.0 {
                    Ok(object) if !self.synced => return self.pass_on_listed(object),
                    Ok(object) => {
                        let listed = self.relisting.get_or_insert_default();
                        listed.insert(key_of(&object), Ok(Arc::new(object)));
                    }
                    Err(refused) => self.refuse_listed(refused),
                }
                Vec::new()
            }
            Event::InitDone => {
                let mut events = std::mem::take(&mut self.chunk);
                events.extend(self.swap());
                events
            }
            Event::Apply(item) => match item.0 {
                Ok(object) => self.apply(object).into_iter().collect(),
                Err(refused) => {
                    let known = self.known.contains_key(&refused_key(&refused));
                    self.refuse(refused, known);
                    Vec::new()
                }
            },
            Event::Delete(item) => {
                let object = match item.0 {
                    Ok(object) => object,
                    // The identity is all a deletion needs.
                    Err(refused) => {
                        debug!(kind = %K::KIND, object = %refused.object(), field = %refused.field,
                            "deletion of an object that does not decode, by its identity");
                        identity(&refused.meta)
                    }
                };
                self.delete(object).into_iter().collect()
            }
        }
    }

    /// An object of the first list: known and counted as listed at once,
    /// passed on with the chunk it fills.
    fn pass_on_listed(&mut self, object: K) -> Vec<SourceEvent> {
        let key = key_of(&object);
        let object = Arc::new(object);
        let kept = K::kept(object.clone());
        self.relisting.get_or_insert_default().insert(key.clone(), Err(kept.clone()));
        self.known.insert(key, kept);
        self.passed_on += 1;
        self.chunk.push(K::event(Change::Applied(object)));
        match self.chunk.len() >= FIRST_LIST_CHUNK {
            true => std::mem::take(&mut self.chunk),
            false => Vec::new(),
        }
    }

    /// Logs a refusal and keeps it for [`RelistState::take_refusals`];
    /// `known`: the consumer keeps the version it was sent before.
    fn refuse(&mut self, refused: Refused, known: bool) {
        refused.log(K::KIND, if known { "keeping the version read before" } else { "skipped" });
        self.refusals.push(refused);
    }

    /// A listed object that does not decode: the version known before (if
    /// any) counts as listed, so the relist neither deletes nor changes it.
    fn refuse_listed(&mut self, refused: Refused) {
        let key = refused_key(&refused);
        let last = self.known.get(&key).cloned();
        self.refuse(refused, last.is_some());
        if let Some(last) = last {
            self.relisting.get_or_insert_default().insert(key, Err(last));
        }
    }

    /// Replaces what is known by the completed list; the differences.
    fn swap(&mut self) -> Vec<SourceEvent> {
        let listed = self.relisting.take().unwrap_or_default();
        let gone = (self.known.iter()).filter(|(key, _)| !listed.contains_key(*key));
        let mut events: Vec<SourceEvent> = gone.map(|(key, old)| K::event(Change::Deleted(old.object(key)))).collect();
        let deleted = events.len();
        let read = listed.iter().filter_map(|(key, l)| l.as_ref().ok().map(|new| (key, new)));
        let changed = read.filter(|(key, new)| self.known.get(*key).is_none_or(|old| !old.same_version(new)));
        events.extend(changed.map(|(_, new)| K::event(Change::Applied(new.clone()))));
        let first = !self.synced;
        info!(
            kind = %K::KIND,
            objects = listed.len(),
            applied = events.len() - deleted + std::mem::take(&mut self.passed_on),
            deleted,
            first,
            "list complete"
        );
        self.known = listed.into_iter().map(|(key, l)| (key, l.map_or_else(|kept| kept, K::kept))).collect();
        if first {
            self.synced = true;
            events.push(SourceEvent::Synced(K::KIND));
        }
        events
    }

    fn apply(&mut self, object: K) -> Option<SourceEvent> {
        let key = key_of(&object);
        if self.known.get(&key).is_some_and(|old| old.same_version(&object)) {
            debug!(kind = %K::KIND, object = ?key, "repeated watch event ignored");
            return None;
        }
        let object = Arc::new(object);
        self.known.insert(key, K::kept(object.clone()));
        Some(K::event(Change::Applied(object)))
    }

    fn delete(&mut self, object: K) -> Option<SourceEvent> {
        let key = key_of(&object);
        if let Some(listed) = &mut self.relisting {
            listed.remove(&key);
        }
        if self.known.remove(&key).is_none() {
            debug!(kind = %K::KIND, object = ?key, "deletion of an unknown object ignored");
            return None;
        }
        Some(K::event(Change::Deleted(Arc::new(object))))
    }
}
