//! The configuration, derived once into one IP family's settings: what the
//! coordinator, the planners and the kernel handles of that family's
//! proxier take, so nothing below the start-up code reads the config.
//! Pure: [`derive`] runs at start-up and again on every reload (SIGHUP),
//! with what the host was probed for passed in.

use std::time::Duration;

use ipnet::IpNet;

use crate::config::{FeatureGates, Gate, KubeProxyConfiguration, LocalMode};
use crate::model::{ModelGates, NodeInfo};
use crate::net::IpFamily;
use crate::plan::context::{LocalAddr, PlanSettings};
use crate::plan::iptables::{iptables_context, HostFeatures, IptablesContext, IptablesSettings};
use crate::plan::ipvs::context::plan_context;
use crate::plan::ipvs::rules::IpvsRulesConfig;
use crate::plan::ipvs::PlanContext;
use crate::plan::local::LocalDetector;
use crate::plan::nftables::{nftables_context, NftRuleset, NftablesContext};

/// Syncs the scheduler lets through at once before minSyncPeriod applies
/// (upstream's BoundedFrequencyRunner burst).
pub const BURST: u32 = 2;

/// How pod traffic is recognised (detectLocalMode, upstream's
/// NewDetectLocalBy*): fixed by the configuration, or the Node's pod CIDR of
/// the family, known only once the Node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalDetection {
    /// The family's cluster CIDR (none: [`LocalDetector::None`]), a bridge or
    /// an interface prefix.
    Fixed(LocalDetector),
    /// The Node's first pod CIDR of the family.
    NodeCidr,
}

impl LocalDetection {
    /// The detector for `node`.
    pub fn detector(&self, family: IpFamily, node: &NodeInfo) -> LocalDetector {
        match self {
            LocalDetection::Fixed(d) => d.clone(),
            LocalDetection::NodeCidr => {
                of_family(family, &node.pod_cidrs).map_or(LocalDetector::None, LocalDetector::Cidr)
            }
        }
    }
}

fn of_family(family: IpFamily, nets: &[IpNet]) -> Option<IpNet> {
    nets.iter().copied().find(|n| family.matches(&n.addr()))
}

/// One family's proxier settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilySettings {
    pub family: IpFamily,
    /// The planner's (and the coordinator's): node name, scheduler, nodePortAddresses of the family.
    pub plan: PlanSettings,
    /// minSyncPeriod and syncPeriod of the active mode.
    pub min_sync: Duration,
    pub max_sync: Duration,
    pub burst: u32,
    pub local: LocalDetection,
    pub masquerade_all: bool,
    pub masquerade_bit: u32,
    /// `iptables.localhostNodePorts` (default true).
    pub localhost_node_ports: bool,
    /// `ipvs.excludeCIDRs`: virtual servers there are not ours.
    pub ipvs_exclude_cidrs: Vec<IpNet>,
    /// What the host was probed for.
    pub host: HostFeatures,
    /// What the feature gates change in the model.
    pub model_gates: ModelGates,
    /// Which ruleset nftables mode writes.
    pub nftables_ruleset: NftRuleset,
}

/// `family`'s settings from the configuration, for node `node_name`, on a
/// host with `host`.
pub fn derive(cfg: &KubeProxyConfiguration, family: IpFamily, node_name: &str, host: HostFeatures) -> FamilySettings {
    let local = match cfg.local_mode() {
        LocalMode::ClusterCidr => LocalDetection::Fixed(
            of_family(family, &cfg.cluster_cidrs()).map_or(LocalDetector::None, LocalDetector::Cidr),
        ),
        LocalMode::NodeCidr => LocalDetection::NodeCidr,
        LocalMode::BridgeInterface => {
            LocalDetection::Fixed(LocalDetector::BridgeInterface(cfg.detect_local.bridge_interface.clone()))
        }
        LocalMode::InterfaceNamePrefix => {
            LocalDetection::Fixed(LocalDetector::InterfacePrefix(cfg.detect_local.interface_name_prefix.clone()))
        }
    };
    FamilySettings {
        family,
        plan: PlanSettings {
            family,
            node_name: node_name.to_string(),
            scheduler: cfg.ipvs_scheduler().to_string(),
            node_ports: cfg.node_port_addresses_for(family),
        },
        min_sync: cfg.min_sync_period(),
        max_sync: cfg.sync_period(),
        burst: BURST,
        local,
        masquerade_all: cfg.masquerade_all(),
        masquerade_bit: cfg.masquerade_bit(),
        localhost_node_ports: cfg.iptables.localhost_node_ports.unwrap_or(true),
        ipvs_exclude_cidrs: cfg.ipvs_exclude_cidrs(),
        host,
        model_gates: model_gates(&cfg.gates()),
        nftables_ruleset: NftRuleset::from_name(&cfg.nftables.ruleset).unwrap_or_default(),
    }
}

/// The model's side of the feature gates.
fn model_gates(gates: &FeatureGates) -> ModelGates {
    ModelGates { service_cidrs: gates.enabled(Gate::MultiCIDRServiceAllocator) }
}

impl FamilySettings {
    /// How pod traffic is recognised on `node`.
    pub fn local_detector(&self, node: &NodeInfo) -> LocalDetector {
        self.local.detector(self.family, node)
    }

    /// IPVS mode's iptables rules on `node`.
    pub fn rules_config(&self, node: &NodeInfo) -> IpvsRulesConfig {
        IpvsRulesConfig {
            family: self.family,
            masquerade_all: self.masquerade_all,
            masquerade_bit: self.masquerade_bit,
            local: self.local_detector(node),
            random_fully: self.host.random_fully,
        }
    }

    /// iptables mode's planner settings on `node` (as upstream's NewProxier reads them).
    pub fn iptables_settings(&self, node: &NodeInfo) -> IptablesSettings {
        IptablesSettings {
            family: self.family,
            node_name: self.plan.node_name.clone(),
            masquerade_all: self.masquerade_all,
            masquerade_bit: self.masquerade_bit,
            local: self.local_detector(node),
            random_fully: self.host.random_fully,
            localhost_node_ports: self.localhost_node_ports,
            node_ports: self.plan.node_ports.clone(),
            conntrack_tcp_liberal: self.host.conntrack_tcp_liberal,
            nfacct_ct_state_invalid: self.host.nfacct_ct_state_invalid,
            nfacct_localhost_node_ports: self.host.nfacct_localhost_node_ports,
        }
    }
}

/// The planners' contexts: what each mode plans a sync with, for the
/// current Node and the node's addresses (read by the caller).
impl FamilySettings {
    /// IPVS mode's planner context.
    pub fn ipvs_context(&self, node: &NodeInfo, addrs: &[LocalAddr]) -> PlanContext {
        plan_context(&self.plan, node, addrs)
    }

    /// iptables mode's planner context.
    pub fn iptables_context(&self, node: &NodeInfo, addrs: &[LocalAddr]) -> IptablesContext {
        iptables_context(&self.iptables_settings(node), node, addrs)
    }

    /// nftables mode's planner context, with the ServiceCIDRs the model
    /// holds.
    pub fn nftables_context(&self, node: &NodeInfo, service_cidrs: &[IpNet], addrs: &[LocalAddr]) -> NftablesContext {
        nftables_context(&self.nftables_settings(node, service_cidrs), node, addrs)
    }
}

impl FamilySettings {
    /// nftables mode's settings on `node`, with the ServiceCIDRs the model
    /// holds (`Model::service_cidrs`; the context keeps this family's):
    /// their unallocated addresses are dropped.
    pub fn nftables_settings(
        &self,
        node: &NodeInfo,
        service_cidrs: &[ipnet::IpNet],
    ) -> crate::plan::nftables::NftablesSettings {
        crate::plan::nftables::NftablesSettings {
            family: self.family,
            ruleset: self.nftables_ruleset,
            node_name: self.plan.node_name.clone(),
            masquerade_all: self.masquerade_all,
            masquerade_bit: self.masquerade_bit,
            local: self.local_detector(node),
            node_ports: self.plan.node_ports.clone(),
            service_cidrs: service_cidrs.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodePortAddresses;

    fn node(pod_cidrs: &[&str]) -> NodeInfo {
        NodeInfo { pod_cidrs: pod_cidrs.iter().map(|c| c.parse().unwrap()).collect(), ..NodeInfo::default() }
    }

    fn cidr(c: &str) -> LocalDetector {
        LocalDetector::Cidr(c.parse().unwrap())
    }

    #[test]
    fn feature_gates_reach_the_model() {
        // MultiCIDRServiceAllocator is locked on (since 1.34): ServiceCIDRs are read.
        let cfg = KubeProxyConfiguration::with_defaults();
        let s = derive(&cfg, IpFamily::V4, "node-a", HostFeatures::default());
        assert_eq!(s.model_gates, ModelGates { service_cidrs: true });
    }

    /// `nftables.ruleset` (each name validation takes) picks the ruleset
    /// the nftables planner writes; blank is upstream's.
    #[test]
    fn the_nftables_ruleset_field_picks_the_ruleset() {
        let mut cfg = KubeProxyConfiguration::with_defaults();
        let ruleset = |cfg: &KubeProxyConfiguration| {
            let s = derive(cfg, IpFamily::V6, "node-a", HostFeatures::default());
            s.nftables_settings(&NodeInfo::default(), &[]).ruleset
        };
        assert_eq!(ruleset(&cfg), NftRuleset::Upstream);
        for name in crate::config::NFTABLES_RULESETS {
            cfg.nftables.ruleset = name.into();
            assert_eq!(ruleset(&cfg).name(), name);
        }
    }

    #[test]
    fn defaults_give_upstreams_settings() {
        let cfg = KubeProxyConfiguration::with_defaults();
        let s = derive(&cfg, IpFamily::V4, "node-a", HostFeatures::default());
        assert_eq!(
            s.plan,
            PlanSettings {
                family: IpFamily::V4,
                node_name: "node-a".into(),
                scheduler: "rr".into(),
                node_ports: NodePortAddresses::All
            }
        );
        assert_eq!((s.min_sync, s.max_sync, s.burst), (cfg.min_sync_period(), cfg.sync_period(), 2));
        assert_eq!(s.local, LocalDetection::Fixed(LocalDetector::None));
        assert_eq!(s.model_gates, ModelGates::default());
        assert!(!s.masquerade_all && s.localhost_node_ports);
        assert_eq!(s.masquerade_bit, 14);
    }

    #[test]
    fn the_active_modes_periods_and_the_scheduler_are_taken() {
        let mut cfg = KubeProxyConfiguration::with_defaults();
        cfg.mode = "ipvs".into();
        cfg.ipvs.scheduler = "wrr".into();
        cfg.ipvs.min_sync_period = Duration::from_secs(3).into();
        cfg.ipvs.sync_period = Duration::from_secs(45).into();
        cfg.ipvs.exclude_cidrs = vec!["10.9.0.0/16".into()];
        let s = derive(&cfg, IpFamily::V4, "n", HostFeatures::default());
        assert_eq!((s.min_sync, s.max_sync), (Duration::from_secs(3), Duration::from_secs(45)));
        assert_eq!(s.plan.scheduler, "wrr");
        assert_eq!(s.ipvs_exclude_cidrs, vec!["10.9.0.0/16".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn each_family_gets_its_own_cluster_cidr_and_node_port_addresses() {
        let mut cfg = KubeProxyConfiguration::with_defaults();
        cfg.cluster_cidr = "10.244.0.0/16,fd00:244::/56".into();
        cfg.node_port_addresses = vec!["192.168.0.0/16".into()];
        let v4 = derive(&cfg, IpFamily::V4, "n", HostFeatures::default());
        let v6 = derive(&cfg, IpFamily::V6, "n", HostFeatures::default());
        assert_eq!(v4.local_detector(&NodeInfo::default()), cidr("10.244.0.0/16"));
        assert_eq!(v6.local_detector(&NodeInfo::default()), cidr("fd00:244::/56"));
        assert_eq!(v4.plan.node_ports, NodePortAddresses::Cidrs(vec!["192.168.0.0/16".parse().unwrap()]));
        assert_eq!(v6.plan.node_ports, NodePortAddresses::All);
    }

    #[test]
    fn node_cidr_detection_waits_for_the_node() {
        let mut cfg = KubeProxyConfiguration::with_defaults();
        cfg.detect_local_mode = "NodeCIDR".into();
        let s = derive(&cfg, IpFamily::V6, "n", HostFeatures::default());
        assert_eq!(s.local, LocalDetection::NodeCidr);
        assert_eq!(s.local_detector(&NodeInfo::default()), LocalDetector::None);
        assert_eq!(s.local_detector(&node(&["10.244.1.0/24", "fd00:1::/64"])), cidr("fd00:1::/64"));
        cfg.detect_local_mode = "BridgeInterface".into();
        cfg.detect_local.bridge_interface = "cbr0".into();
        let s = derive(&cfg, IpFamily::V4, "n", HostFeatures::default());
        assert_eq!(s.local_detector(&node(&["10.244.1.0/24"])), LocalDetector::BridgeInterface("cbr0".into()));
        cfg.detect_local_mode = "InterfaceNamePrefix".into();
        cfg.detect_local.interface_name_prefix = "veth".into();
        let s = derive(&cfg, IpFamily::V4, "n", HostFeatures::default());
        assert_eq!(s.local_detector(&NodeInfo::default()), LocalDetector::InterfacePrefix("veth".into()));
    }

    #[test]
    fn iptables_settings_follow_the_configuration_and_the_host() {
        let mut cfg = KubeProxyConfiguration::default();
        cfg.iptables.localhost_node_ports = Some(false);
        cfg.iptables.masquerade_all = true;
        let host = HostFeatures { random_fully: true, ..HostFeatures::default() };
        let s = derive(&cfg, IpFamily::V4, "n", host).iptables_settings(&NodeInfo::default());
        assert!(!s.localhost_node_ports && s.masquerade_all && s.random_fully && !s.conntrack_tcp_liberal);
        assert_eq!(s.node_ports, NodePortAddresses::All);
        assert_eq!((s.node_name.as_str(), s.local), ("n", LocalDetector::None));
    }

    #[test]
    fn each_modes_planning_context_follows_the_settings() {
        let mut cfg = KubeProxyConfiguration::with_defaults();
        cfg.ipvs.scheduler = "lc".into();
        let v4 = derive(&cfg, IpFamily::V4, "n", HostFeatures::default());
        let v6 = derive(&cfg, IpFamily::V6, "n", HostFeatures::default());
        let node = NodeInfo::default();
        assert_eq!(v4.ipvs_context(&node, &[]).scheduler, "lc");
        assert!(v4.iptables_context(&node, &[]).needs_route_localnet(), "localhost NodePorts, IPv4");
        assert!(!v6.iptables_context(&node, &[]).needs_route_localnet(), "no localhost NodePorts in IPv6");
        cfg.iptables.localhost_node_ports = Some(false);
        let off = derive(&cfg, IpFamily::V4, "n", HostFeatures::default());
        assert!(!off.iptables_context(&node, &[]).needs_route_localnet());
        let cidrs: Vec<IpNet> = vec!["10.96.0.0/16".parse().unwrap(), "fd00:96::/112".parse().unwrap()];
        assert_eq!(v6.nftables_context(&node, &cidrs, &[]).service_cidrs, cidrs[1..]);
    }

    #[test]
    fn ipvs_rules_take_the_probed_random_fully() {
        let mut cfg = KubeProxyConfiguration::with_defaults();
        cfg.cluster_cidr = "10.244.0.0/16".into();
        let host = HostFeatures { random_fully: true, ..HostFeatures::default() };
        let r = derive(&cfg, IpFamily::V4, "n", host).rules_config(&NodeInfo::default());
        assert_eq!(
            r,
            IpvsRulesConfig {
                family: IpFamily::V4,
                masquerade_all: false,
                masquerade_bit: 14,
                local: cidr("10.244.0.0/16"),
                random_fully: true
            }
        );
    }
}
