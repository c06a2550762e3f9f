//! Services become service ports, as upstream's ServiceChangeTracker does
//! (pkg/proxy/servicechangetracker.go, serviceport.go).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use super::addresses::{cidr_list, ip_list, BadValue, SKIPPED};
use super::scheduler::{from_annotations, Scheduler};
use super::ModelError;
use crate::net::{parse_ip_sloppy, IpFamily, Protocol};

/// Label that hands a Service to another proxy; upstream's informer excludes it.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label on headless Services and their EndpointSlices; upstream's informer excludes it.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Default ClientIP affinity timeout (v1.DefaultClientIPServiceAffinitySeconds).
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10800;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedName {
    pub namespace: String,
    pub name: String,
}

impl NamespacedName {
    pub fn new(namespace: &str, name: &str) -> Self {
        NamespacedName { namespace: namespace.to_string(), name: name.to_string() }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A service port's identity: `namespace/name:portName` plus protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    pub service: NamespacedName,
    pub port: String,
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    /// Upstream's ServicePortName.String(): `ns/name:port`, or `ns/name` for an unnamed port.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

/// Everything the proxiers need to know about one service port, for one IP family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub cluster_ip: IpAddr,
    pub port: u16,
    pub node_port: u16,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_vips: Vec<IpAddr>,
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// loadBalancerSourceRanges has values that do not parse and none of
    /// this family that does: the load balancer IPs admit no source (where
    /// upstream, with no range left, would admit every one).
    pub source_ranges_fail_closed: bool,
    /// ClientIP affinity timeout in seconds; None for affinity None.
    pub affinity_timeout: Option<u32>,
    pub health_check_node_port: u16,
    pub external_policy_local: bool,
    pub internal_policy_local: bool,
    pub traffic_distribution: Option<String>,
    /// The Service's own IPVS scheduler (its annotations, see
    /// `model::scheduler`); None: the configured one.
    pub ipvs_scheduler: Option<Scheduler>,
}

impl ServicePort {
    pub fn protocol(&self) -> Protocol {
        self.name.protocol
    }

    /// NodePort, externalIPs or load-balancer VIPs: reachable from outside.
    pub fn externally_accessible(&self) -> bool {
        self.node_port != 0 || !self.external_ips.is_empty() || !self.load_balancer_vips.is_empty()
    }

    /// The load balancer IPs admit only some sources (the ranges of this
    /// family; none when [`ServicePort::source_ranges_fail_closed`]).
    pub fn restricts_sources(&self) -> bool {
        !self.load_balancer_source_ranges.is_empty() || self.source_ranges_fail_closed
    }

    /// Upstream's UsesClusterEndpoints: the internal policy is Cluster, or the
    /// port is externally accessible at all (even with externalTrafficPolicy
    /// Local, the short-circuit rules for pod and host traffic to external
    /// destinations go to the cluster endpoints).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Upstream's UsesLocalEndpoints: some traffic policy is Local.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.externally_accessible() && self.external_policy_local)
    }
}

/// The service ports of one Service, sorted by name.
pub type ServicePorts = Vec<Arc<ServicePort>>;

/// The port named `spn` among a Service's ports.
pub fn find_port<'a>(ports: &'a [Arc<ServicePort>], spn: &ServicePortName) -> Option<&'a Arc<ServicePort>> {
    ports.binary_search_by(|sp| sp.name.cmp(spn)).ok().map(|i| &ports[i])
}

/// Why a Service yields no service ports (not an error: upstream skips these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    ProxyNameLabel,
    HeadlessLabel,
    Headless,
    ExternalName,
    NoClusterIpOfFamily,
}

pub fn namespaced_name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> NamespacedName {
    NamespacedName::new(meta.namespace.as_deref().unwrap_or("default"), meta.name.as_deref().unwrap_or(""))
}

/// Converts a Service to its service ports for `family`. Errors name the
/// object and field; a skipped Service yields `Ok(Err(skip))`.
pub fn service_ports(svc: &Service, family: IpFamily) -> Result<Result<ServicePorts, Skip>, ModelError> {
    let nn = namespaced_name(&svc.metadata);
    let spec = match taken(svc) {
        Ok(spec) => spec,
        Err(skip) => return Ok(Err(skip)),
    };
    let cluster_ip_text = cluster_ip_by_family(spec, family, &nn)?;
    let cluster_ip = match cluster_ip_text {
        ClusterIp::None => return Ok(Err(Skip::Headless)),
        ClusterIp::OtherFamily => return Ok(Err(Skip::NoClusterIpOfFamily)),
        ClusterIp::Ip(ip) => ip,
    };
    let common = Common::from_service(svc, family, &nn)?;
    let mut ports = ServicePorts::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let protocol = Protocol::from_k8s(p.protocol.as_deref().unwrap_or("")).ok_or_else(|| {
            ModelError::field(&nn, "Service", &format!("spec.ports[{i}].protocol"), p.protocol.as_deref().unwrap_or(""))
        })?;
        let port = u16::try_from(p.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| ModelError::field(&nn, "Service", &format!("spec.ports[{i}].port"), &p.port.to_string()))?;
        let node_port = u16::try_from(p.node_port.unwrap_or(0)).map_err(|_| {
            ModelError::field(
                &nn,
                "Service",
                &format!("spec.ports[{i}].nodePort"),
                &p.node_port.unwrap_or(0).to_string(),
            )
        })?;
        let name = ServicePortName { service: nn.clone(), port: p.name.clone().unwrap_or_default(), protocol };
        let sp = Arc::new(common.port(name, cluster_ip, port, node_port));
        // A later port of the same name and protocol replaces an earlier one.
        match ports.binary_search_by(|p| p.name.cmp(&sp.name)) {
            Ok(i) => ports[i] = sp,
            Err(i) => ports.insert(i, sp),
        }
    }
    ports.shrink_to_fit();
    Ok(Ok(ports))
}

enum ClusterIp {
    None,
    OtherFamily,
    Ip(IpAddr),
}

/// The spec of a Service the proxy takes, or why it skips it (upstream's
/// informer selectors and ShouldSkipService, but for the family).
fn taken(svc: &Service) -> Result<&ServiceSpec, Skip> {
    let labels = svc.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(LABEL_SERVICE_PROXY_NAME)) {
        return Err(Skip::ProxyNameLabel);
    }
    if labels.is_some_and(|l| l.contains_key(LABEL_HEADLESS)) {
        return Err(Skip::HeadlessLabel);
    }
    let spec = svc.spec.as_ref().ok_or(Skip::Headless)?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return Err(Skip::ExternalName);
    }
    Ok(spec)
}

/// Upstream's GetClusterIPByFamily, plus ShouldSkipService's headless check.
fn cluster_ip_by_family(spec: &ServiceSpec, family: IpFamily, nn: &NamespacedName) -> Result<ClusterIp, ModelError> {
    let Some(candidates) = cluster_ip_texts(spec) else {
        return Ok(ClusterIp::None);
    };
    for (path, text) in candidates {
        let ip = parse_ip_sloppy(text).ok_or_else(|| ModelError::field(nn, "Service", &path, text))?;
        if family.matches(&ip) {
            return Ok(ClusterIp::Ip(ip));
        }
    }
    Ok(ClusterIp::OtherFamily)
}

/// The cluster IPs with their paths: clusterIPs, else clusterIP; `None`
/// for a headless Service (clusterIP empty or `None`).
fn cluster_ip_texts(spec: &ServiceSpec) -> Option<Vec<(String, &str)>> {
    let primary = spec.cluster_ip.as_deref().unwrap_or("");
    if primary.is_empty() || primary == "None" {
        return None;
    }
    Some(match spec.cluster_ips.as_ref().filter(|v| !v.is_empty()) {
        Some(ips) => ips.iter().enumerate().map(|(i, s)| (format!("spec.clusterIPs[{i}]"), s.as_str())).collect(),
        None => vec![("spec.clusterIP".to_string(), primary)],
    })
}

/// A loadBalancerSourceRanges value that does not parse: the ranges that do
/// are used; a family with none of them closes its load balancer IPs.
const SOURCE_RANGE_SKIPPED: &str =
    "skipped (a family with no range that parses admits no source to its load balancer IPs)";

/// The values of a Service the proxy takes that do not parse (every
/// family's): cluster IPs (the Service is then skipped, where upstream's
/// rules would fail to load), externalIPs, loadBalancerSourceRanges and
/// the load balancer ingress IPs (skipped, as upstream).
pub fn bad_values(svc: &Service) -> Vec<BadValue> {
    let Ok(spec) = taken(svc) else { return Vec::new() };
    let mut bad: Vec<BadValue> = cluster_ip_texts(spec)
        .into_iter()
        .flatten()
        .filter(|(_, text)| parse_ip_sloppy(text).is_none())
        .map(|(path, text)| BadValue {
            field: if spec.cluster_ips.as_ref().is_some_and(|v| !v.is_empty()) {
                "spec.clusterIPs"
            } else {
                "spec.clusterIP"
            },
            path,
            value: text.to_string(),
            wanted: "an IP address",
            effect: "the Service is skipped",
        })
        .collect();
    bad.extend(external_ips(spec).1);
    bad.extend(source_ranges(spec).1);
    bad.extend(ingress_ips(svc).1);
    bad
}

fn external_ips(spec: &ServiceSpec) -> (Vec<IpAddr>, Vec<BadValue>) {
    ip_list("spec.externalIPs", spec.external_ips.as_deref().unwrap_or_default())
}

fn source_ranges(spec: &ServiceSpec) -> (Vec<IpNet>, Vec<BadValue>) {
    let texts = spec.load_balancer_source_ranges.as_deref().unwrap_or_default();
    cidr_list("spec.loadBalancerSourceRanges", texts, SOURCE_RANGE_SKIPPED)
}

/// The load balancer's ingress IPs: those of ipMode VIP (unset means VIP),
/// as upstream; an empty one is skipped without a word.
fn ingress_ips(svc: &Service) -> (Vec<IpAddr>, Vec<BadValue>) {
    let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        let Some(text) = ing.ip.as_deref().filter(|s| !s.is_empty()) else {
            continue;
        };
        if ing.ip_mode.as_deref() == Some("Proxy") {
            continue;
        }
        match parse_ip_sloppy(text) {
            Some(ip) => good.push(ip),
            None => bad.push(BadValue {
                field: "status.loadBalancer.ingress.ip",
                path: format!("status.loadBalancer.ingress[{i}].ip"),
                value: text.to_string(),
                wanted: "an IP address",
                effect: SKIPPED,
            }),
        }
    }
    (good, bad)
}

/// The per-Service part of every service port.
struct Common {
    external_ips: Vec<IpAddr>,
    lb_vips: Vec<IpAddr>,
    source_ranges: Vec<IpNet>,
    source_ranges_fail_closed: bool,
    affinity_timeout: Option<u32>,
    health_check_node_port: u16,
    external_policy_local: bool,
    internal_policy_local: bool,
    traffic_distribution: Option<String>,
    ipvs_scheduler: Option<Scheduler>,
}

impl Common {
    /// The values that do not parse are left out here, for every family;
    /// `model::notice` names them once.
    fn from_service(svc: &Service, family: IpFamily, nn: &NamespacedName) -> Result<Common, ModelError> {
        let spec = svc.spec.as_ref().ok_or_else(|| ModelError::field(nn, "Service", "spec", "null"))?;
        let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
        let external_ips = of_family(external_ips(spec).0, family, |ip| *ip);
        let (ranges, bad_ranges) = source_ranges(spec);
        let source_ranges = of_family(ranges, family, IpNet::addr);
        let source_ranges_fail_closed = source_ranges.is_empty() && !bad_ranges.is_empty();
        let lb_vips = of_family(ingress_ips(svc).0, family, |ip| *ip);
        if source_ranges_fail_closed && !lb_vips.is_empty() {
            tracing::warn!(
                service = %nn,
                field = "spec.loadBalancerSourceRanges",
                ip_family = family.lower(),
                "no source range of this family parses: its load balancer IPs admit no source (fail closed)"
            );
        }
        let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .and_then(|t| u32::try_from(t).ok())
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
        });
        let externally_accessible = type_ == "LoadBalancer" || type_ == "NodePort" || !external_ips.is_empty();
        let etp_local = spec.external_traffic_policy.as_deref() == Some("Local");
        let external_policy_local = externally_accessible && etp_local;
        let internal_policy_local = spec.internal_traffic_policy.as_deref() == Some("Local");
        let mut health_check_node_port = 0;
        if type_ == "LoadBalancer" && etp_local {
            let p = spec.health_check_node_port.unwrap_or(0);
            match u16::try_from(p) {
                Ok(p) if p != 0 => health_check_node_port = p,
                _ => {
                    tracing::warn!(service = %nn, field = "spec.healthCheckNodePort", value = p, "service has no valid healthcheck nodeport")
                }
            }
        }
        Ok(Common {
            external_ips,
            lb_vips,
            source_ranges,
            source_ranges_fail_closed,
            affinity_timeout,
            health_check_node_port,
            external_policy_local,
            internal_policy_local,
            traffic_distribution: spec.traffic_distribution.clone(),
            // Refused annotations mean the default; `model::notice` says why.
            ipvs_scheduler: from_annotations(svc.metadata.annotations.as_ref()).ok().flatten(),
        })
    }

    fn port(&self, name: ServicePortName, cluster_ip: IpAddr, port: u16, node_port: u16) -> ServicePort {
        ServicePort {
            name,
            cluster_ip,
            port,
            node_port,
            external_ips: self.external_ips.clone(),
            load_balancer_vips: self.lb_vips.clone(),
            load_balancer_source_ranges: self.source_ranges.clone(),
            source_ranges_fail_closed: self.source_ranges_fail_closed,
            affinity_timeout: self.affinity_timeout,
            health_check_node_port: self.health_check_node_port,
            external_policy_local: self.external_policy_local,
            internal_policy_local: self.internal_policy_local,
            traffic_distribution: self.traffic_distribution.clone(),
            ipvs_scheduler: self.ipvs_scheduler,
        }
    }
}

/// The values of `family` among `all` (`addr` gives each one's address).
fn of_family<T>(all: Vec<T>, family: IpFamily, addr: impl Fn(&T) -> IpAddr) -> Vec<T> {
    all.into_iter().filter(|v| family.matches(&addr(v))).collect()
}
