//! EndpointSlices merge into endpoints per service port, as upstream's
//! EndpointSliceCache does (pkg/proxy/endpointslicecache.go).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::addresses::BadValue;
use super::service::{namespaced_name, NamespacedName, ServicePortName, LABEL_HEADLESS};
use super::ModelError;
use crate::net::{join_host_port, parse_ip_sloppy, IpFamily, Protocol};

/// Label naming the Service an EndpointSlice belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Annotation with the time of the change that triggered this slice's update.
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// One backend of a service port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    pub is_local: bool,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub zone_hints: Hints,
    pub node_hints: Hints,
}

impl fmt::Display for Endpoint {
    /// `ip:port`, the endpoint's identity upstream.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&join_host_port(&self.ip, self.port))
    }
}

/// The zone or node names of an endpoint's topology hints. Most endpoints
/// have none, so a set costs one pointer, and the copies of an endpoint
/// (one per service port) share it. Never `Some` of an empty set.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hints(Option<Arc<BTreeSet<String>>>);

impl Hints {
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.as_ref().is_some_and(|s| s.contains(name))
    }

    /// Adds a name; false if it was there already.
    pub fn insert(&mut self, name: String) -> bool {
        Arc::make_mut(self.0.get_or_insert_with(Default::default)).insert(name)
    }

    pub fn clear(&mut self) {
        self.0 = None;
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().flat_map(|s| s.iter().map(String::as_str))
    }
}

impl fmt::Debug for Hints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<String> for Hints {
    fn from_iter<I: IntoIterator<Item = String>>(iter: I) -> Hints {
        let set: BTreeSet<String> = iter.into_iter().collect();
        Hints((!set.is_empty()).then(|| Arc::new(set)))
    }
}

/// An endpoint as read from a slice, before the port is known; its hints
/// are kept beside it (see [`SliceInfo`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawEndpoint {
    ip: IpAddr,
    /// On this proxy's node (the slice's nodeName).
    is_local: bool,
    ready: bool,
    serving: bool,
    terminating: bool,
}

/// The parts of one EndpointSlice the proxy uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    pub name: String,
    ports: Vec<(String, Protocol, u16)>,
    endpoints: Vec<RawEndpoint>,
    /// Zone and node hints of each endpoint, in step with `endpoints`, or
    /// empty when no endpoint has any (the usual case: then they cost nothing).
    hints: Vec<(Hints, Hints)>,
    pub trigger_time: Option<String>,
}

/// What a slice means to this proxier.
pub enum SliceKind {
    /// No service-name label, headless, or another address family: ignored.
    Ignored(&'static str),
    /// A slice of `service`.
    Slice { service: NamespacedName, info: SliceInfo },
}

/// Parses a slice for `family`, as seen by the proxy on `node_name`. Bad
/// endpoint IPs are logged and skipped; a slice without a service-name label
/// is ignored as upstream does.
pub fn parse_slice(slice: &EndpointSlice, family: IpFamily, node_name: &str) -> Result<SliceKind, ModelError> {
    let nn = namespaced_name(&slice.metadata);
    let labels = slice.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(LABEL_HEADLESS)) {
        return Ok(SliceKind::Ignored("headless"));
    }
    let Some(svc_name) = labels.and_then(|l| l.get(LABEL_SERVICE_NAME)).filter(|s| !s.is_empty()) else {
        return Ok(SliceKind::Ignored("no kubernetes.io/service-name label"));
    };
    if slice.address_type != family.slice_address_type() {
        return Ok(SliceKind::Ignored("other address type"));
    }
    let service = NamespacedName::new(&nn.namespace, svc_name);
    let mut ports = Vec::with_capacity(slice.ports.as_ref().map_or(0, Vec::len));
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        let Some(name) = p.name.clone() else {
            tracing::warn!(endpointslice = %nn, field = %format!("ports[{i}].name"), "ignoring port with nil name");
            continue;
        };
        let proto_text = p.protocol.as_deref().unwrap_or("TCP");
        let protocol = Protocol::from_k8s(proto_text)
            .ok_or_else(|| ModelError::field(&nn, "EndpointSlice", &format!("ports[{i}].protocol"), proto_text))?;
        match p.port.and_then(|n| u16::try_from(n).ok()).filter(|n| *n != 0) {
            Some(port) => ports.push((name, protocol, port)),
            None => {
                tracing::warn!(endpointslice = %nn, field = %format!("ports[{i}].port"), value = ?p.port, "ignoring invalid endpoint port")
            }
        }
    }
    let mut endpoints = Vec::with_capacity(slice.endpoints.len());
    let mut hints = Vec::with_capacity(slice.endpoints.len());
    for (i, ep) in slice.endpoints.iter().enumerate() {
        let Some(addr) = ep.addresses.first() else {
            tracing::debug!(endpointslice = %nn, index = i, "ignoring endpoint with no addresses");
            continue;
        };
        // `model::notice` names the ones that do not parse, once.
        let Ok(ip) = endpoint_ip(i, addr, family) else {
            continue;
        };
        let c = ep.conditions.as_ref();
        let ready = c.and_then(|c| c.ready).unwrap_or(true);
        endpoints.push(RawEndpoint {
            ip,
            is_local: ep.node_name.as_deref() == Some(node_name),
            ready,
            serving: c.and_then(|c| c.serving).unwrap_or(ready),
            terminating: c.and_then(|c| c.terminating).unwrap_or(false),
        });
        let h = ep.hints.as_ref();
        hints.push((
            h.and_then(|h| h.for_zones.as_ref()).into_iter().flatten().map(|z| z.name.clone()).collect(),
            h.and_then(|h| h.for_nodes.as_ref()).into_iter().flatten().map(|n| n.name.clone()).collect(),
        ));
    }
    if hints.iter().all(|(zones, nodes): &(Hints, Hints)| zones.is_empty() && nodes.is_empty()) {
        hints = Vec::new();
    }
    ports.shrink_to_fit();
    endpoints.shrink_to_fit();
    hints.shrink_to_fit();
    let trigger_time = slice.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_TRIGGER_TIME)).cloned();
    Ok(SliceKind::Slice { service, info: SliceInfo { name: nn.name, ports, endpoints, hints, trigger_time } })
}

/// An endpoint's address (its first), which must be of the slice's
/// family. Upstream takes whatever the first address is, and its rules
/// then fail to load when it is not an IP of the family.
fn endpoint_ip(i: usize, text: &str, family: IpFamily) -> Result<IpAddr, BadValue> {
    let bad = |wanted| BadValue {
        field: "endpoints.addresses",
        path: format!("endpoints[{i}].addresses[0]"),
        value: text.to_string(),
        wanted,
        effect: "the endpoint is skipped",
    };
    match parse_ip_sloppy(text) {
        Some(ip) if family.matches(&ip) => Ok(ip),
        Some(_) if family == IpFamily::V4 => Err(bad("an IPv4 address")),
        Some(_) => Err(bad("an IPv6 address")),
        None => Err(bad("an IP address")),
    }
}

/// The endpoint addresses of a slice the proxy takes that are not IPs of
/// its address type.
pub fn bad_values(slice: &EndpointSlice) -> Vec<BadValue> {
    let labels = slice.metadata.labels.as_ref();
    let labelled = labels.and_then(|l| l.get(LABEL_SERVICE_NAME)).is_some_and(|s| !s.is_empty());
    let family = match slice.address_type.as_str() {
        "IPv4" => IpFamily::V4,
        "IPv6" => IpFamily::V6,
        _ => return Vec::new(),
    };
    if !labelled || labels.is_some_and(|l| l.contains_key(LABEL_HEADLESS)) {
        return Vec::new();
    }
    let firsts = slice.endpoints.iter().enumerate().filter_map(|(i, ep)| Some((i, ep.addresses.first()?)));
    firsts.filter_map(|(i, addr)| endpoint_ip(i, addr, family).err()).collect()
}

/// Endpoints of one service port, sorted by address.
pub type EndpointList = Arc<[Endpoint]>;

/// The endpoints of one port of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortEndpoints {
    pub port: String,
    pub protocol: Protocol,
    pub endpoints: EndpointList,
}

impl PortEndpoints {
    pub fn is_port(&self, spn: &ServicePortName) -> bool {
        self.protocol == spn.protocol && self.port == spn.port
    }

    pub fn same_port(&self, other: &PortEndpoints) -> bool {
        self.protocol == other.protocol && self.port == other.port
    }

    pub fn port_name(&self, service: &NamespacedName) -> ServicePortName {
        ServicePortName { service: service.clone(), port: self.port.clone(), protocol: self.protocol }
    }
}

/// One port's endpoints while slices are merged.
type ByAddress = BTreeMap<(IpAddr, u16), Endpoint>;

/// All current slices, grouped by service (each service's in name order),
/// with an index from slice to the name of its service, which is in the
/// slice's namespace.
#[derive(Debug, Default)]
pub struct SliceCache {
    by_service: HashMap<NamespacedName, Vec<SliceInfo>>,
    owner: HashMap<NamespacedName, String>,
    /// Per service, the trigger times of its slices written since the last
    /// [`SliceCache::take_trigger_times`] (as upstream's endpoints change
    /// tracker: the changed slice's own annotation, not its siblings').
    triggers: HashMap<NamespacedName, Vec<String>>,
}

impl SliceCache {
    /// Stores (or replaces) the slice `slice` of `service`. Returns the
    /// services whose endpoints may have changed: its service, and the one
    /// it was filed under before if its service-name label changed.
    pub fn upsert(&mut self, slice: NamespacedName, service: NamespacedName, info: SliceInfo) -> Vec<NamespacedName> {
        debug_assert_eq!(slice.namespace, service.namespace);
        let mut dirty = vec![service.clone()];
        if self.owner.get(&slice).is_some_and(|old| *old != service.name) {
            dirty.extend(self.remove(&slice));
        }
        let slices = self.by_service.entry(service.clone()).or_default();
        let at = slices.binary_search_by(|s| s.name.cmp(&info.name));
        let unchanged = at.is_ok_and(|i| slices[i] == info);
        if let (false, Some(t)) = (unchanged, &info.trigger_time) {
            self.triggers.entry(service.clone()).or_default().push(t.clone());
        }
        match at {
            Ok(i) => slices[i] = info,
            Err(i) => {
                // Most services have one slice, a few have several: no spare room.
                slices.reserve_exact(1);
                slices.insert(i, info);
            }
        }
        self.owner.insert(slice, service.name);
        dirty
    }

    /// Removes a slice by its namespace/name. Returns the service it belonged to.
    pub fn remove(&mut self, slice: &NamespacedName) -> Option<NamespacedName> {
        let svc = NamespacedName { namespace: slice.namespace.clone(), name: self.owner.remove(slice)? };
        // A deleted slice's annotation dates from its last update, not from
        // the deletion: upstream drops the service's pending times.
        self.triggers.remove(&svc);
        if let Some(slices) = self.by_service.get_mut(&svc) {
            slices.retain(|s| s.name != slice.name);
            if slices.is_empty() {
                self.by_service.remove(&svc);
            }
        }
        Some(svc)
    }

    /// Merges every slice of `svc` into endpoints per service port (upstream's
    /// endpointInfoByServicePort + addEndpoints): slices in name order; the same
    /// ip:port in two slices is kept once, a local copy winning. Sorted by
    /// port name and protocol.
    pub fn endpoints_for(&self, svc: &NamespacedName) -> Vec<PortEndpoints> {
        let mut by_port: BTreeMap<(&str, Protocol), ByAddress> = BTreeMap::new();
        for slice in self.by_service.get(svc).into_iter().flatten() {
            for (port_name, protocol, port) in &slice.ports {
                let set = by_port.entry((port_name.as_str(), *protocol)).or_default();
                for (i, raw) in slice.endpoints.iter().enumerate() {
                    let key = (raw.ip, *port);
                    if set.contains_key(&key) && !raw.is_local {
                        continue;
                    }
                    let (zone_hints, node_hints) = slice.hints.get(i).cloned().unwrap_or_default();
                    set.insert(
                        key,
                        Endpoint {
                            ip: raw.ip,
                            port: *port,
                            is_local: raw.is_local,
                            ready: raw.ready,
                            serving: raw.serving,
                            terminating: raw.terminating,
                            zone_hints,
                            node_hints,
                        },
                    );
                }
            }
        }
        by_port
            .into_iter()
            .map(|((port, protocol), eps)| PortEndpoints {
                port: port.to_string(),
                protocol,
                endpoints: eps.into_values().collect(),
            })
            .collect()
    }

    /// The trigger-time annotations of the slices of `svc` written (with
    /// a change) since the last call; cleared.
    pub fn take_trigger_times(&mut self, svc: &NamespacedName) -> Vec<String> {
        self.triggers.remove(svc).unwrap_or_default()
    }
}
