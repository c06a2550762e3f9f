//! The test API server's storage: objects, a global resourceVersion, the
//! event history since the compaction point, and the open watches.
//!
//! As etcd behind the API server: every write bumps the one global
//! resourceVersion and is recorded; a watch from resourceVersion R replays
//! the recorded events after R, then follows new ones; a watch from before
//! the compaction point gets 410 Expired.

use std::collections::BTreeMap;

use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use serde_json::{json, Map, Value};

use super::selector::{FieldSelector, LabelSelector};

/// The kinds this server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    /// `networking.k8s.io/v1` ServiceCIDR, cluster-scoped.
    ServiceCidr,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Service, Kind::EndpointSlice, Kind::Node, Kind::ServiceCidr];

    /// The kind of an object with this `apiVersion` and `kind`.
    pub fn of(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.api_version() == api_version && k.kind() == kind)
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Service | Kind::Node => "v1",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::ServiceCidr => "networking.k8s.io/v1",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::ServiceCidr => "ServiceCIDR",
        }
    }

    /// The resource name in URLs.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Service => "services",
            Kind::EndpointSlice => "endpointslices",
            Kind::Node => "nodes",
            Kind::ServiceCidr => "servicecidrs",
        }
    }

    /// The URL path segments before the resource: `api/v1` or `apis/<group>/<version>`.
    pub fn prefix(self) -> &'static [&'static str] {
        match self {
            Kind::Service | Kind::Node => &["api", "v1"],
            Kind::EndpointSlice => &["apis", "discovery.k8s.io", "v1"],
            Kind::ServiceCidr => &["apis", "networking.k8s.io", "v1"],
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::Node | Kind::ServiceCidr)
    }

    /// Field selectors the real API server accepts for this kind (a subset).
    pub fn field_labels(self) -> &'static [&'static str] {
        match self {
            Kind::Service => &["metadata.name", "metadata.namespace", "spec.clusterIP", "spec.type"],
            Kind::EndpointSlice => &["metadata.name", "metadata.namespace", "addressType"],
            Kind::Node => &["metadata.name", "metadata.namespace", "spec.unschedulable"],
            Kind::ServiceCidr => &["metadata.name", "metadata.namespace"],
        }
    }
}

/// Where an object lives: kind, namespace (empty when cluster-scoped), name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

/// A write the store refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("not an object of a served kind: {0}")]
    BadObject(String),
    #[error("{0:?} already exists")]
    AlreadyExists(Key),
    #[error("{0:?} not found")]
    NotFound(Key),
}

/// Which objects a list or watch wants.
#[derive(Debug, Clone)]
pub struct Query {
    pub kind: Kind,
    /// `None`: all namespaces.
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Query {
    pub fn matches(&self, object: &Value) -> bool {
        let namespace = object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
        self.namespace.as_deref().is_none_or(|ns| ns == namespace)
            && self.labels.matches(object)
            && self.fields.matches(object)
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFrom {
    /// `resourceVersion` unset or `0`: the current objects as ADDED events first.
    Now { send_initial_events: bool },
    /// After this resourceVersion: the recorded events since, then new ones.
    After(u64),
}

/// A write, as recorded for watches.
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    kind: Kind,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    verb: &'static str,
    /// The object after the write; for a deletion, the last state with the
    /// deletion's resourceVersion.
    object: Value,
    /// The object before the write (`MODIFIED` only).
    prev: Option<Value>,
}

/// One open watch.
#[derive(Debug)]
struct Subscription {
    query: Query,
    bookmarks: bool,
    events: UnboundedSender<Value>,
}

/// All state of the test API server.
#[derive(Debug, Default)]
pub struct Store {
    rv: u64,
    /// Watches from a resourceVersion below this get 410.
    compacted: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Change>,
    watches: Vec<Subscription>,
    /// Watches cut off: kept (open) until their connection is gone, so the
    /// client sees a dropped connection rather than a clean end.
    severed: Vec<Subscription>,
    next_uid: u64,
}

impl Store {
    /// The current (last written) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Watches followed by a live stream (not yet dropped by their client).
    pub fn open_watches(&mut self) -> usize {
        self.watches.retain(|w| !w.events.is_closed());
        self.watches.len()
    }

    /// Stops sending to every open watch (their connections are being cut):
    /// nothing written from now on reaches them.
    pub fn sever_watches(&mut self) {
        self.severed.retain(|w| !w.events.is_closed());
        self.severed.append(&mut self.watches);
    }

    /// Stores a new object; its resourceVersion.
    pub fn create(&mut self, object: Value) -> Result<u64, StoreError> {
        let (key, mut object) = normalize(object)?;
        if self.objects.contains_key(&key) {
            return Err(StoreError::AlreadyExists(key));
        }
        self.next_uid += 1;
        object["metadata"]["uid"] = json!(format!("00000000-0000-0000-0000-{:012}", self.next_uid));
        Ok(self.write(key, "ADDED", object, None))
    }

    /// Replaces an existing object (no resourceVersion precondition); its
    /// new resourceVersion.
    pub fn update(&mut self, object: Value) -> Result<u64, StoreError> {
        let (key, mut object) = normalize(object)?;
        let Some(prev) = self.objects.get(&key).cloned() else {
            return Err(StoreError::NotFound(key));
        };
        object["metadata"]["uid"] = prev["metadata"]["uid"].clone();
        Ok(self.write(key, "MODIFIED", object, Some(prev)))
    }

    /// Deletes an object; the deletion's resourceVersion.
    pub fn delete(&mut self, key: Key) -> Result<u64, StoreError> {
        let Some(last) = self.objects.get(&key).cloned() else {
            return Err(StoreError::NotFound(key));
        };
        Ok(self.write(key, "DELETED", last, None))
    }

    /// Drops the history: watches from any resourceVersion before the
    /// current one now get 410 Expired.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
    }

    /// Sends a BOOKMARK at the current resourceVersion to every watch that
    /// allowed bookmarks.
    pub fn bookmark(&mut self) {
        let rv = self.rv;
        self.watches.retain(|w| !w.bookmarks || w.events.unbounded_send(bookmark(w.query.kind, rv, false)).is_ok());
    }

    fn write(&mut self, key: Key, verb: &'static str, mut object: Value, prev: Option<Value>) -> u64 {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        match verb {
            "DELETED" => self.objects.remove(&key),
            _ => self.objects.insert(key.clone(), object.clone()),
        };
        let change = Change { rv: self.rv, kind: key.kind, verb, object, prev };
        self.watches.retain(|w| match watch_event(&w.query, &change) {
            Some(event) => w.events.unbounded_send(event).is_ok(),
            None => !w.events.is_closed(),
        });
        self.history.push(change);
        self.rv
    }

    /// One object.
    pub fn get(&self, key: &Key) -> Option<Value> {
        self.objects.get(key).cloned()
    }

    /// The matching objects after `after` (a continue position), in key
    /// order: at most `limit` of them, and whether more follow.
    pub fn list(&self, query: &Query, after: Option<&Key>, limit: Option<usize>) -> (Vec<Value>, Option<Key>) {
        let mut matching = (self.objects.iter())
            .filter(|(key, _)| key.kind == query.kind && after.is_none_or(|a| *key > a))
            .filter(|(_, object)| query.matches(object));
        let limit = limit.unwrap_or(usize::MAX);
        let page: Vec<(&Key, &Value)> = matching.by_ref().take(limit).collect();
        let more = matching.next().is_some();
        let next = page.last().filter(|_| more).map(|(key, _)| (*key).clone());
        (page.into_iter().map(|(_, object)| object.clone()).collect(), next)
    }

    /// A resourceVersion before the compaction point is gone.
    pub fn is_expired(&self, rv: u64) -> bool {
        rv < self.compacted
    }

    /// Opens a watch: the events to send first, and the live ones. `Err`:
    /// the ERROR event to send instead (410 Expired).
    pub fn watch(
        &mut self,
        query: Query,
        from: WatchFrom,
        bookmarks: bool,
    ) -> Result<(Vec<Value>, UnboundedReceiver<Value>), Value> {
        let backlog = match from {
            WatchFrom::After(rv) if self.is_expired(rv) => {
                let message = format!("too old resource version: {rv} ({})", self.compacted);
                return Err(json!({"type": "ERROR", "object": status(410, "Expired", &message)}));
            }
            WatchFrom::After(rv) => self.replay(&query, rv),
            WatchFrom::Now { send_initial_events } => self.initial_events(&query, send_initial_events && bookmarks),
        };
        let (events, receiver) = unbounded();
        self.watches.push(Subscription { query, bookmarks, events });
        Ok((backlog, receiver))
    }

    fn replay(&self, query: &Query, after: u64) -> Vec<Value> {
        let changes = self.history.iter().filter(|c| c.rv > after && c.kind == query.kind);
        changes.filter_map(|change| watch_event(query, change)).collect()
    }

    fn initial_events(&self, query: &Query, end_bookmark: bool) -> Vec<Value> {
        let (objects, _) = self.list(query, None, None);
        let mut events: Vec<Value> = objects.into_iter().map(|o| json!({"type": "ADDED", "object": o})).collect();
        if end_bookmark {
            events.push(bookmark(query.kind, self.rv, true));
        }
        events
    }
}

/// The event a watch with `query` sees for `change`, as the API server's
/// watch cache filters it: an object that starts matching is ADDED, one
/// that stops matching is DELETED (its previous state, new resourceVersion).
fn watch_event(query: &Query, change: &Change) -> Option<Value> {
    if change.kind != query.kind {
        return None;
    }
    let now = query.matches(&change.object);
    let before = change.prev.as_ref().is_some_and(|prev| query.matches(prev));
    let (verb, object) = match (change.verb, before, now) {
        ("MODIFIED", true, true) => ("MODIFIED", change.object.clone()),
        ("MODIFIED", false, true) => ("ADDED", change.object.clone()),
        ("MODIFIED", true, false) => {
            let mut prev = change.prev.clone().unwrap_or_default();
            prev["metadata"]["resourceVersion"] = change.object["metadata"]["resourceVersion"].clone();
            ("DELETED", prev)
        }
        ("MODIFIED", false, false) | (_, _, false) => return None,
        (verb, _, true) => (verb, change.object.clone()),
    };
    Some(json!({"type": verb, "object": object}))
}

fn bookmark(kind: Kind, rv: u64, initial_events_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"type": "BOOKMARK", "object": {"apiVersion": kind.api_version(), "kind": kind.kind(), "metadata": metadata}})
}

/// A `Status` object, as the API server sends for errors.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// Checks type and name, defaults the namespace of namespaced kinds to
/// `default` and drops it from cluster-scoped ones; the object's key.
fn normalize(object: Value) -> Result<(Key, Value), StoreError> {
    let Value::Object(mut map) = object else {
        return Err(StoreError::BadObject("not a JSON object".into()));
    };
    let field = |map: &Map<String, Value>, name: &str| map.get(name).and_then(Value::as_str).map(str::to_owned);
    let (api_version, kind) = (field(&map, "apiVersion").unwrap_or_default(), field(&map, "kind").unwrap_or_default());
    let kind = Kind::of(&api_version, &kind).ok_or_else(|| StoreError::BadObject(format!("{api_version} {kind}")))?;
    let Some(Value::Object(metadata)) = map.get_mut("metadata") else {
        return Err(StoreError::BadObject(format!("{} without metadata", kind.kind())));
    };
    let name = field(metadata, "name").unwrap_or_default();
    if name.is_empty() {
        return Err(StoreError::BadObject(format!("{} without metadata.name", kind.kind())));
    }
    let namespace = match kind.namespaced() {
        true => field(metadata, "namespace").filter(|ns| !ns.is_empty()).unwrap_or_else(|| "default".into()),
        false => String::new(),
    };
    match namespace.as_str() {
        "" => metadata.remove("namespace"),
        ns => metadata.insert("namespace".into(), json!(ns)),
    };
    Ok((Key { kind, namespace, name }, Value::Object(map)))
}
