//! What the proxy ignores in its input, said once per object (not once per
//! family's proxier): upstream ignores an EndpointSlice without the
//! `kubernetes.io/service-name` label (we say so at debug level) and one of
//! an address type it does not know (we warn). The runtime logs these and
//! counts them in `kube_proxy_rs_source_objects_ignored_total{kind,reason}`.
//! In IPVS mode the same goes for a Service's scheduler annotations that are
//! refused ([`ipvs_scheduler_refused`]): the Service itself is taken, with
//! the default scheduler.

use crate::msgs::{Change, SourceEvent};

use super::endpoints::LABEL_SERVICE_NAME;
use super::scheduler::from_annotations;
use super::service::namespaced_name;

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
