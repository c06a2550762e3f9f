//! What the proxy ignores in its input, said once per object (not once per
//! family's proxier): upstream ignores an EndpointSlice without the
//! `kubernetes.io/service-name` label (we say so at debug level) and one of
//! an address type it does not know (we warn). The runtime logs these and
//! counts them in `kube_proxy_rs_source_objects_ignored_total{kind,reason}`.
//! In IPVS mode the same goes for a Service's scheduler annotations that are
//! refused ([`ipvs_scheduler_refused`]): the Service itself is taken, with
//! the default scheduler. Inside the objects it takes, the IP and CIDR
//! values that do not parse ([`ignored_values`], see `model::addresses`)
//! are skipped; the runtime warns and counts them in
//! `kube_proxy_rs_ignored_values_total{kind,field}`.

use crate::msgs::{Change, SourceEvent};

use super::addresses::BadValue;
use super::endpoints::{self, LABEL_SERVICE_NAME};
use super::node;
use super::scheduler::from_annotations;
use super::service::{self, namespaced_name};

/// An input object the proxy ignores, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ignored {
    pub kind: &'static str,
    /// `namespace/name`.
    pub object: String,
    /// The metric's `reason` label.
    pub reason: &'static str,
    pub detail: String,
    /// Worth a warning (else debug).
    pub warn: bool,
}

/// Why `ev`'s object is ignored by every proxier, if it is.
pub fn ignored(ev: &SourceEvent) -> Option<Ignored> {
    let SourceEvent::EndpointSlice(Change::Applied(slice)) = ev else { return None };
    let object = namespaced_name(&slice.metadata).to_string();
    let labelled =
        slice.metadata.labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME)).is_some_and(|s| !s.is_empty());
    if !labelled {
        return Some(Ignored {
            kind: "EndpointSlice",
            object,
            reason: "no_service_name_label",
            detail: format!("no {LABEL_SERVICE_NAME} label"),
            warn: false,
        });
    }
    match slice.address_type.as_str() {
        "IPv4" | "IPv6" | "FQDN" => None,
        other => Some(Ignored {
            kind: "EndpointSlice",
            object,
            reason: "unknown_address_type",
            detail: format!("addressType {other:?} is not IPv4, IPv6 or FQDN"),
            warn: true,
        }),
    }
}

/// Why `ev`'s Service scheduler annotations are refused (IPVS mode), if
/// they are: the Service then gets the default scheduler.
pub fn ipvs_scheduler_refused(ev: &SourceEvent) -> Option<Ignored> {
    let SourceEvent::Service(Change::Applied(svc)) = ev else { return None };
    let refused = from_annotations(svc.metadata.annotations.as_ref()).err()?;
    Some(Ignored {
        kind: "Service",
        object: namespaced_name(&svc.metadata).to_string(),
        reason: "invalid_ipvs_scheduler",
        detail: refused.to_string(),
        warn: true,
    })
}

/// A value skipped inside an object the proxy takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredValue {
    pub kind: &'static str,
    /// `namespace/name` (a Node's name).
    pub object: String,
    pub value: BadValue,
}

/// The IP and CIDR values of `ev`'s object that do not parse, whatever the
/// family; of Nodes only `node_name`'s, the one the proxy reads.
pub fn ignored_values(ev: &SourceEvent, node_name: &str) -> Vec<IgnoredValue> {
    let (kind, object, values) = match ev {
        SourceEvent::Service(Change::Applied(svc)) => {
            ("Service", namespaced_name(&svc.metadata).to_string(), service::bad_values(svc))
        }
        SourceEvent::EndpointSlice(Change::Applied(slice)) => {
            ("EndpointSlice", namespaced_name(&slice.metadata).to_string(), endpoints::bad_values(slice))
        }
        SourceEvent::Node(Change::Applied(n)) if n.metadata.name.as_deref() == Some(node_name) => {
            ("Node", node_name.to_string(), node::bad_values(n))
        }
        _ => return Vec::new(),
    };
    values.into_iter().map(|value| IgnoredValue { kind, object: object.clone(), value }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;

    #[test]
    fn unlabelled_and_unknown_address_type_slices_are_named() {
        let good = slice("default", "web-1", "web", &[("http", "TCP", 80)], &[ep("10.0.0.1", "n")]);
        assert_eq!(ignored(&applied_slice(good.clone())), None);
        let mut bogus = good.clone();
        bogus.address_type = "Bogus".into();
        let n = ignored(&applied_slice(bogus)).expect("bogus addressType");
        assert_eq!((n.object.as_str(), n.reason, n.warn), ("default/web-1", "unknown_address_type", true));
        assert!(n.detail.contains("\"Bogus\""), "{}", n.detail);
        let mut unlabelled = good.clone();
        unlabelled.metadata.labels = None;
        let n = ignored(&applied_slice(unlabelled.clone())).expect("no label");
        assert_eq!((n.reason, n.warn), ("no_service_name_label", false));
        // Deletions say nothing.
        assert_eq!(ignored(&deleted_slice(unlabelled)), None);
    }

    #[test]
    fn values_that_do_not_parse_are_named_once_per_object() {
        let mut web = service("shop", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]);
        let spec = web.spec.as_mut().unwrap();
        spec.external_ips = Some(vec!["010.0.0.1".into(), "bogus".into(), " ".into()]);
        spec.load_balancer_source_ranges = Some(vec!["203.0.113.000/025".into(), "203.0.113.0/99".into()]);
        web.status = Some(from_json(serde_json::json!({"loadBalancer": {"ingress": [
            {"ip": "192.168.60.010"}, {"ip": "x"}, {"ip": "y", "ipMode": "Proxy"}, {"hostname": "lb.example"}
        ]}})));
        let got: Vec<(String, &str, String)> = ignored_values(&applied_service(web.clone()), "n")
            .into_iter()
            .map(|v| (v.object, v.value.field, v.value.detail()))
            .collect();
        let want = [
            ("spec.externalIPs", "spec.externalIPs[1] \"bogus\" is not an IP address: skipped"),
            (
                "spec.loadBalancerSourceRanges",
                "spec.loadBalancerSourceRanges[1] \"203.0.113.0/99\" is not a CIDR: skipped (a family with no \
                 range that parses admits no source to its load balancer IPs)",
            ),
            ("status.loadBalancer.ingress.ip", "status.loadBalancer.ingress[1].ip \"x\" is not an IP address: skipped"),
        ];
        let want: Vec<(String, &str, String)> =
            want.iter().map(|(f, d)| ("shop/web".to_string(), *f, d.to_string())).collect();
        assert_eq!(got, want);
        assert_eq!(ignored_values(&deleted_service(web.clone()), "n"), [], "deletions say nothing");
        let mut external = web;
        external.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
        assert_eq!(ignored_values(&applied_service(external), "n"), [], "a Service the proxy skips says nothing");

        let bad_ip = service("shop", "odd", "10.96.0.300", &[("http", "TCP", 80, 0)]);
        let n = ignored_values(&applied_service(bad_ip), "n");
        assert_eq!(n.len(), 1);
        assert_eq!(
            n[0].value.detail(),
            "spec.clusterIPs[0] \"10.96.0.300\" is not an IP address: the Service is skipped"
        );
    }

    #[test]
    fn endpoint_and_node_values_that_do_not_parse_are_named() {
        let eps = [ep("10.0.0.1", "n"), ep("10.0.0.x", "n"), ep("fd00::1", "n"), ep("010.0.0.2", "n")];
        let s = slice("default", "web-1", "web", &[("http", "TCP", 80)], &eps);
        let got: Vec<String> =
            ignored_values(&applied_slice(s.clone()), "n").iter().map(|v| v.value.detail()).collect();
        assert_eq!(
            got,
            [
                "endpoints[1].addresses[0] \"10.0.0.x\" is not an IP address: the endpoint is skipped",
                "endpoints[2].addresses[0] \"fd00::1\" is not an IPv4 address: the endpoint is skipped",
            ]
        );
        let mut unlabelled = s;
        unlabelled.metadata.labels = None;
        assert_eq!(ignored_values(&applied_slice(unlabelled), "n"), [], "an ignored slice says no more");

        let mut ours = node("n", "192.168.50.300", "z");
        ours.spec.as_mut().unwrap().pod_cidrs = Some(vec!["10.244.0.0/33".into()]);
        ours.spec.as_mut().unwrap().pod_cidr = Some("10.244.0.0/33".into());
        let event = |n: k8s_openapi::api::core::v1::Node| SourceEvent::Node(Change::Applied(std::sync::Arc::new(n)));
        let got: Vec<(String, String)> =
            ignored_values(&event(ours.clone()), "n").into_iter().map(|v| (v.object, v.value.path)).collect();
        let want = [("n", "status.addresses[0].address"), ("n", "spec.podCIDRs[0]"), ("n", "spec.podCIDR")];
        assert_eq!(got, want.map(|(o, p)| (o.to_string(), p.to_string())));
        assert_eq!(ignored_values(&event(ours), "other-node"), [], "only the proxy's own Node counts");
    }

    #[test]
    fn a_refused_scheduler_annotation_names_the_service_and_the_annotation() {
        use crate::model::scheduler::{ANNOTATION_SCHEDULER, ANNOTATION_SCHEDULER_FLAGS};
        let web = service("shop", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]);
        assert_eq!(ipvs_scheduler_refused(&applied_service(web.clone())), None);
        let good = annotated(web.clone(), &[(ANNOTATION_SCHEDULER, "sh"), (ANNOTATION_SCHEDULER_FLAGS, "port")]);
        assert_eq!(ipvs_scheduler_refused(&applied_service(good)), None);
        let bad = annotated(web.clone(), &[(ANNOTATION_SCHEDULER, "fastest")]);
        let n = ipvs_scheduler_refused(&applied_service(bad.clone())).expect("refused");
        assert_eq!(
            (n.kind, n.object.as_str(), n.reason, n.warn),
            ("Service", "shop/web", "invalid_ipvs_scheduler", true)
        );
        assert!(
            n.detail.starts_with(&format!("annotation {ANNOTATION_SCHEDULER} \"fastest\": not an IPVS scheduler")),
            "{}",
            n.detail
        );
        assert!(n.detail.ends_with("the default scheduler is used"), "{}", n.detail);
        let flags_on_rr = annotated(web, &[(ANNOTATION_SCHEDULER, "rr"), (ANNOTATION_SCHEDULER_FLAGS, "port")]);
        let n = ipvs_scheduler_refused(&applied_service(flags_on_rr)).expect("refused");
        assert!(n.detail.contains(ANNOTATION_SCHEDULER_FLAGS), "{}", n.detail);
        assert_eq!(ipvs_scheduler_refused(&deleted_service(bad)), None, "deletions say nothing");
    }
}
