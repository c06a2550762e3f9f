//! Services become service ports, as upstream's ServiceChangeTracker does
//! (pkg/proxy/servicechangetracker.go, serviceport.go).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

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
    let labels = svc.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(LABEL_SERVICE_PROXY_NAME)) {
        return Ok(Err(Skip::ProxyNameLabel));
    }
    if labels.is_some_and(|l| l.contains_key(LABEL_HEADLESS)) {
        return Ok(Err(Skip::HeadlessLabel));
    }
    let Some(spec) = svc.spec.as_ref() else {
        return Ok(Err(Skip::Headless));
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Ok(Err(Skip::ExternalName));
    }
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

/// Upstream's GetClusterIPByFamily, plus ShouldSkipService's headless check.
fn cluster_ip_by_family(
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    family: IpFamily,
    nn: &NamespacedName,
) -> Result<ClusterIp, ModelError> {
    let primary = spec.cluster_ip.as_deref().unwrap_or("");
    if primary.is_empty() || primary == "None" {
        return Ok(ClusterIp::None);
    }
    let candidates: Vec<(String, &str)> = match spec.cluster_ips.as_ref().filter(|v| !v.is_empty()) {
        Some(ips) => ips.iter().enumerate().map(|(i, s)| (format!("spec.clusterIPs[{i}]"), s.as_str())).collect(),
        None => vec![("spec.clusterIP".to_string(), primary)],
    };
    for (field, text) in candidates {
        let ip = parse_ip_sloppy(text).ok_or_else(|| ModelError::field(nn, "Service", &field, text))?;
        if family.matches(&ip) {
            return Ok(ClusterIp::Ip(ip));
        }
    }
    Ok(ClusterIp::OtherFamily)
}

/// The per-Service part of every service port.
struct Common {
    external_ips: Vec<IpAddr>,
    lb_vips: Vec<IpAddr>,
    source_ranges: Vec<IpNet>,
    affinity_timeout: Option<u32>,
    health_check_node_port: u16,
    external_policy_local: bool,
    internal_policy_local: bool,
    traffic_distribution: Option<String>,
    ipvs_scheduler: Option<Scheduler>,
}

impl Common {
    fn from_service(svc: &Service, family: IpFamily, nn: &NamespacedName) -> Result<Common, ModelError> {
        let spec = svc.spec.as_ref().ok_or_else(|| ModelError::field(nn, "Service", "spec", "null"))?;
        let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
        let mut external_ips = Vec::new();
        for (i, s) in spec.external_ips.iter().flatten().enumerate() {
            match parse_ip_sloppy(s) {
                Some(ip) if family.matches(&ip) => external_ips.push(ip),
                Some(_) => {}
                None => {
                    tracing::warn!(service = %nn, field = %format!("spec.externalIPs[{i}]"), value = %s, "ignoring invalid IP")
                }
            }
        }
        let mut source_ranges = Vec::new();
        for (i, s) in spec.load_balancer_source_ranges.iter().flatten().enumerate() {
            match s.trim().parse::<IpNet>() {
                Ok(net) if family.matches(&net.addr()) => source_ranges.push(net.trunc()),
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(service = %nn, field = %format!("spec.loadBalancerSourceRanges[{i}]"), value = %s, "ignoring invalid CIDR")
                }
            }
        }
        let lb_vips = lb_vips(svc, family, nn);
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
            affinity_timeout: self.affinity_timeout,
            health_check_node_port: self.health_check_node_port,
            external_policy_local: self.external_policy_local,
            internal_policy_local: self.internal_policy_local,
            traffic_distribution: self.traffic_distribution.clone(),
            ipvs_scheduler: self.ipvs_scheduler,
        }
    }
}

/// Load-balancer ingress IPs of this family; ipMode Proxy is skipped, as upstream.
fn lb_vips(svc: &Service, family: IpFamily, nn: &NamespacedName) -> Vec<IpAddr> {
    let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
    let mut out = Vec::new();
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        let Some(text) = ing.ip.as_deref().filter(|s| !s.is_empty()) else {
            continue;
        };
        if ing.ip_mode.as_deref() == Some("Proxy") {
            continue;
        }
        match parse_ip_sloppy(text) {
            Some(ip) if family.matches(&ip) => out.push(ip),
            Some(_) => {}
            None => {
                tracing::warn!(service = %nn, field = %format!("status.loadBalancer.ingress[{i}].ip"), value = %text, "ignoring invalid IP")
            }
        }
    }
    out
}
