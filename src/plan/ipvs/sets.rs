//! The ipsets upstream's IPVS proxier creates (pkg/proxy/ipvs/proxier.go,
//! ipsetInfo): names, types and comments, verbatim.

use crate::msgs::{SetSpec, SetType};
use crate::net::IpFamily;

/// One of upstream's sets. The order is the order they are created in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpvsSet {
    LoopBack,
    ClusterIp,
    ExternalIp,
    ExternalIpLocal,
    LoadBalancer,
    LoadBalancerFw,
    LoadBalancerLocal,
    LoadBalancerSourceIp,
    LoadBalancerSourceCidr,
    NodePortTcp,
    NodePortLocalTcp,
    NodePortUdp,
    NodePortLocalUdp,
    NodePortSctp,
    NodePortLocalSctp,
    HealthCheckNodePort,
    IpvsIps,
}

impl IpvsSet {
    pub const ALL: [IpvsSet; 17] = [
        IpvsSet::LoopBack,
        IpvsSet::ClusterIp,
        IpvsSet::ExternalIp,
        IpvsSet::ExternalIpLocal,
        IpvsSet::LoadBalancer,
        IpvsSet::LoadBalancerFw,
        IpvsSet::LoadBalancerLocal,
        IpvsSet::LoadBalancerSourceIp,
        IpvsSet::LoadBalancerSourceCidr,
        IpvsSet::NodePortTcp,
        IpvsSet::NodePortLocalTcp,
        IpvsSet::NodePortUdp,
        IpvsSet::NodePortLocalUdp,
        IpvsSet::NodePortSctp,
        IpvsSet::NodePortLocalSctp,
        IpvsSet::HealthCheckNodePort,
        IpvsSet::IpvsIps,
    ];

    /// The IPv4 name (upstream's constant).
    pub fn base_name(self) -> &'static str {
        match self {
            IpvsSet::LoopBack => "KUBE-LOOP-BACK",
            IpvsSet::ClusterIp => "KUBE-CLUSTER-IP",
            IpvsSet::ExternalIp => "KUBE-EXTERNAL-IP",
            IpvsSet::ExternalIpLocal => "KUBE-EXTERNAL-IP-LOCAL",
            IpvsSet::LoadBalancer => "KUBE-LOAD-BALANCER",
            IpvsSet::LoadBalancerFw => "KUBE-LOAD-BALANCER-FW",
            IpvsSet::LoadBalancerLocal => "KUBE-LOAD-BALANCER-LOCAL",
            IpvsSet::LoadBalancerSourceIp => "KUBE-LOAD-BALANCER-SOURCE-IP",
            IpvsSet::LoadBalancerSourceCidr => "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            IpvsSet::NodePortTcp => "KUBE-NODE-PORT-TCP",
            IpvsSet::NodePortLocalTcp => "KUBE-NODE-PORT-LOCAL-TCP",
            IpvsSet::NodePortUdp => "KUBE-NODE-PORT-UDP",
            IpvsSet::NodePortLocalUdp => "KUBE-NODE-PORT-LOCAL-UDP",
            IpvsSet::NodePortSctp => "KUBE-NODE-PORT-SCTP-HASH",
            IpvsSet::NodePortLocalSctp => "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
            IpvsSet::HealthCheckNodePort => "KUBE-HEALTH-CHECK-NODE-PORT",
            IpvsSet::IpvsIps => "KUBE-IPVS-IPS",
        }
    }

    pub fn set_type(self) -> SetType {
        match self {
            IpvsSet::LoopBack | IpvsSet::LoadBalancerSourceIp => SetType::HashIpPortIp,
            IpvsSet::LoadBalancerSourceCidr => SetType::HashIpPortNet,
            IpvsSet::NodePortTcp
            | IpvsSet::NodePortLocalTcp
            | IpvsSet::NodePortUdp
            | IpvsSet::NodePortLocalUdp
            | IpvsSet::HealthCheckNodePort => SetType::BitmapPort,
            IpvsSet::IpvsIps => SetType::HashIp,
            _ => SetType::HashIpPort,
        }
    }

    pub fn comment(self) -> &'static str {
        match self {
            IpvsSet::LoopBack => "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
            IpvsSet::ClusterIp => "Kubernetes service cluster ip + port for masquerade purpose",
            IpvsSet::ExternalIp => "Kubernetes service external ip + port for masquerade and filter purpose",
            IpvsSet::ExternalIpLocal => "Kubernetes service external ip + port with externalTrafficPolicy=local",
            IpvsSet::LoadBalancer => "Kubernetes service lb portal",
            IpvsSet::LoadBalancerFw => "Kubernetes service load balancer ip + port for load balancer with sourceRange",
            IpvsSet::LoadBalancerLocal => "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
            IpvsSet::LoadBalancerSourceIp => {
                "Kubernetes service load balancer ip + port + source IP for packet filter purpose"
            }
            IpvsSet::LoadBalancerSourceCidr => {
                "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"
            }
            IpvsSet::NodePortTcp => "Kubernetes nodeport TCP port for masquerade purpose",
            IpvsSet::NodePortLocalTcp => "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
            IpvsSet::NodePortUdp => "Kubernetes nodeport UDP port for masquerade purpose",
            IpvsSet::NodePortLocalUdp => "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
            IpvsSet::NodePortSctp => "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
            IpvsSet::NodePortLocalSctp => {
                "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"
            }
            IpvsSet::HealthCheckNodePort => "Kubernetes health check node port",
            IpvsSet::IpvsIps => "Addresses on the ipvs interface",
        }
    }

    /// The set's name for `family`: IPv6 sets are named `KUBE-6-...`,
    /// truncated to ipset's 31 characters, as upstream's NewIPSet does.
    pub fn name(self, family: IpFamily) -> String {
        let base = self.base_name();
        match family {
            IpFamily::V4 => base.to_string(),
            IpFamily::V6 => {
                let mut n = base.replacen("KUBE-", "KUBE-6-", 1);
                n.truncate(31);
                n
            }
        }
    }

    pub fn spec(self, family: IpFamily) -> SetSpec {
        SetSpec { name: self.name(family), set_type: self.set_type(), family, comment: self.comment() }
    }

    pub fn from_name(name: &str, family: IpFamily) -> Option<IpvsSet> {
        IpvsSet::ALL.into_iter().find(|s| s.name(family) == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v6_names_get_the_kube6_prefix_and_fit_in_31_chars() {
        assert_eq!(IpvsSet::ClusterIp.name(IpFamily::V6), "KUBE-6-CLUSTER-IP");
        let long = IpvsSet::LoadBalancerSourceCidr.name(IpFamily::V6);
        assert_eq!(long, "KUBE-6-LOAD-BALANCER-SOURCE-CID");
        assert_eq!(long.len(), 31);
        for s in IpvsSet::ALL {
            assert!(s.name(IpFamily::V4).len() <= 31, "{s:?}");
            assert_eq!(IpvsSet::from_name(&s.name(IpFamily::V6), IpFamily::V6), Some(s));
        }
    }
}
