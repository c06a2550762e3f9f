//! The ServiceCIDRs (`networking.k8s.io/v1`): the ranges ClusterIPs are
//! allocated from. Upstream's ServiceCIDRConfig hands the union of every
//! object's `spec.cidrs` to each proxier (`OnServiceCIDRsChanged`), which
//! keeps its family's; nftables mode drops traffic to the addresses of
//! those ranges that no Service holds. iptables and IPVS mode ignore them
//! (upstream's `OnServiceCIDRsChanged` is empty there).
//!
//! Kept by object name, so that a deletion (which carries only the name)
//! removes exactly that object's ranges, and a range two objects share
//! stays while either is there (upstream's set of strings loses it when
//! one of the two goes).

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;

use super::ModelError;
use crate::msgs::Change;
use crate::net::{parse_cidr_sloppy, IpFamily};

const KIND: &str = "ServiceCIDR";

/// Every ServiceCIDR's ranges, by object name.
#[derive(Debug, Default)]
pub struct ServiceCidrs {
    by_name: BTreeMap<String, Vec<IpNet>>,
}

impl ServiceCidrs {
    /// Records one event. A range that does not parse refuses the whole
    /// object (its earlier ranges, if any, stay), as the model does with
    /// any bad object.
    pub fn record(&mut self, change: &Change<ServiceCIDR>) -> Result<(), ModelError> {
        let object = change.object();
        let name = object.metadata.name.clone().unwrap_or_default();
        match change {
            Change::Deleted(_) => {
                self.by_name.remove(&name);
            }
            Change::Applied(_) => {
                let texts = object.spec.as_ref().and_then(|s| s.cidrs.as_deref()).unwrap_or_default();
                let mut nets = Vec::with_capacity(texts.len());
                for (i, text) in texts.iter().enumerate() {
                    let net = parse_cidr_sloppy(text.trim()).ok_or_else(|| ModelError {
                        kind: KIND,
                        object: name.clone(),
                        field: format!("spec.cidrs[{i}]"),
                        value: text.clone(),
                    })?;
                    nets.push(net);
                }
                self.by_name.insert(name, nets);
            }
        }
        Ok(())
    }

    /// The union of every object's ranges of `family`, sorted, each once.
    pub fn of_family(&self, family: IpFamily) -> Vec<IpNet> {
        let mut nets: Vec<IpNet> =
            self.by_name.values().flatten().copied().filter(|n| family.matches(&n.addr())).collect();
        nets.sort();
        nets.dedup();
        nets
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::networking::v1::ServiceCIDRSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn object(name: &str, cidrs: &[&str]) -> Arc<ServiceCIDR> {
        Arc::new(ServiceCIDR {
            metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
            spec: Some(ServiceCIDRSpec { cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()) }),
            status: None,
        })
    }

    fn nets(texts: &[&str]) -> Vec<IpNet> {
        texts.iter().map(|t| t.parse().unwrap()).collect()
    }

    #[test]
    fn the_union_of_every_object_per_family() {
        let mut c = ServiceCidrs::default();
        c.record(&Change::Applied(object("kubernetes", &["10.96.0.0/16", "fd00:96::/112"]))).unwrap();
        c.record(&Change::Applied(object("extra", &["10.100.0.0/24", "10.96.0.0/16"]))).unwrap();
        assert_eq!(c.of_family(IpFamily::V4), nets(&["10.96.0.0/16", "10.100.0.0/24"]));
        assert_eq!(c.of_family(IpFamily::V6), nets(&["fd00:96::/112"]));
        // A range both objects hold stays while one of them is there.
        c.record(&Change::Deleted(object("extra", &[]))).unwrap();
        assert_eq!(c.of_family(IpFamily::V4), nets(&["10.96.0.0/16"]));
        c.record(&Change::Deleted(object("kubernetes", &[]))).unwrap();
        assert_eq!(c.of_family(IpFamily::V4), Vec::<IpNet>::new());
    }

    #[test]
    fn an_update_replaces_the_objects_ranges() {
        let mut c = ServiceCidrs::default();
        c.record(&Change::Applied(object("a", &["10.96.0.0/16"]))).unwrap();
        c.record(&Change::Applied(object("a", &["10.97.0.0/16"]))).unwrap();
        assert_eq!(c.of_family(IpFamily::V4), nets(&["10.97.0.0/16"]));
    }

    #[test]
    fn a_bad_range_refuses_the_object_and_keeps_its_last_ranges() {
        let mut c = ServiceCidrs::default();
        c.record(&Change::Applied(object("a", &["10.96.0.0/16"]))).unwrap();
        let e = c.record(&Change::Applied(object("a", &["10.97.0.0/16", "10.300.0.0/16"]))).unwrap_err();
        assert_eq!(e.to_string(), "ServiceCIDR a: invalid spec.cidrs[1]: \"10.300.0.0/16\"");
        assert_eq!(c.of_family(IpFamily::V4), nets(&["10.96.0.0/16"]));
        // Host bits are cleared: the range is what nft's interval set holds.
        c.record(&Change::Applied(object("b", &["10.98.1.2/16"]))).unwrap();
        assert_eq!(c.of_family(IpFamily::V4), nets(&["10.96.0.0/16", "10.98.0.0/16"]));
        // Leading zeros are decimal, as upstream's sloppy parser reads them.
        c.record(&Change::Applied(object("c", &["010.099.000.000/016"]))).unwrap();
        assert_eq!(c.of_family(IpFamily::V4), nets(&["10.96.0.0/16", "10.98.0.0/16", "10.99.0.0/16"]));
    }
}
