//! What every family's proxier takes of a source batch, decided once for
//! all of them (not once per family): the values skipped inside the objects
//! and the objects ignored ([`super::notice`]), in IPVS mode the Services'
//! refused scheduler annotations, and the nodePorts refused because another
//! Service holds them ([`NodePortClaims`]). Pure: [`Intake::take`] returns
//! the events to pass on and a [`Notice`] for each thing left out; the
//! daemon logs and counts the notices, `--dry-run` logs them.

use super::node_ports::{Conflict, NodePortClaims};
use super::notice::{ignored, ignored_values, ipvs_scheduler_refused, Ignored, IgnoredValue};
use crate::msgs::SourceEvent;

/// Something of a source batch that the proxiers leave out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A value inside an object that is taken.
    Value(IgnoredValue),
    /// An object no proxier takes.
    Object(Ignored),
    /// A Service's IPVS scheduler annotations (the Service is taken, with
    /// the default scheduler).
    Scheduler(Ignored),
    /// A nodePort another Service holds (the Service is taken without it).
    NodePort(Conflict),
}

impl Notice {
    /// Says it in the daemon's log.
    pub fn log(&self) {
        match self {
            Notice::Value(v) => tracing::warn!(
                kind = v.kind,
                object = %v.object,
                field = v.value.field,
                reason = %v.value.detail(),
                "ignoring a value"
            ),
            Notice::Object(n) if n.warn => {
                tracing::warn!(kind = n.kind, object = %n.object, reason = %n.detail, "ignoring object")
            }
            Notice::Object(n) => {
                tracing::debug!(kind = n.kind, object = %n.object, reason = %n.detail, "ignoring object")
            }
            Notice::Scheduler(n) => tracing::warn!(
                kind = n.kind,
                object = %n.object,
                reason = %n.detail,
                "refusing a Service's IPVS scheduler"
            ),
            Notice::NodePort(c) => {
                tracing::warn!(kind = "Service", object = %c.service, reason = %nodeport_detail(c), "refusing a nodePort")
            }
        }
    }

    /// The object left out, as `kube_proxy_rs_source_objects_ignored_total`
    /// and the dashboard's refused input name it: kind, object, reason,
    /// detail (`None` for a value: it is counted as one, not as an object).
    pub fn ignored_object(&self) -> Option<(&'static str, &str, &'static str, String)> {
        match self {
            Notice::Value(_) => None,
            Notice::Object(n) | Notice::Scheduler(n) => Some((n.kind, &n.object, n.reason, n.detail.clone())),
            Notice::NodePort(c) => Some(("Service", &c.service, "node_port_conflict", nodeport_detail(c))),
        }
    }
}

fn nodeport_detail(c: &Conflict) -> String {
    format!("port {}: nodePort {} is already used by Service {}", c.port, c.node_port, c.holder)
}

/// The proxiers' intake: the nodePort claims so far, and what decides the
/// notices.
#[derive(Debug)]
pub struct Intake {
    claims: NodePortClaims,
    /// The Node whose values count (the one the proxiers read).
    node_name: String,
    /// Scheduler annotations are read (IPVS mode).
    ipvs_mode: bool,
}

impl Intake {
    pub fn new(node_name: &str, ipvs_mode: bool) -> Intake {
        Intake { claims: NodePortClaims::default(), node_name: node_name.to_string(), ipvs_mode }
    }

    /// The events the proxiers take of `events`, in order, and what they
    /// leave out: values, objects and scheduler annotations first, in event
    /// order, then the nodePorts refused.
    pub fn take(&mut self, events: Vec<SourceEvent>) -> (Vec<SourceEvent>, Vec<Notice>) {
        let mut notices: Vec<Notice> =
            events.iter().flat_map(|ev| ignored_values(ev, &self.node_name)).map(Notice::Value).collect();
        notices.extend(events.iter().filter_map(ignored).map(Notice::Object));
        if self.ipvs_mode {
            notices.extend(events.iter().filter_map(ipvs_scheduler_refused).map(Notice::Scheduler));
        }
        let (events, conflicts) = self.claims.filter(events);
        notices.extend(conflicts.into_iter().map(Notice::NodePort));
        (events, notices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use crate::model::scheduler::ANNOTATION_SCHEDULER;

    fn node_port_service(name: &str, ip: &str, node_port: i32) -> SourceEvent {
        applied_service(service("default", name, ip, &[("http", "TCP", 80, node_port)]))
    }

    #[test]
    fn a_second_service_on_a_held_node_port_is_taken_without_it_and_named() {
        let mut intake = Intake::new("node-a", false);
        let (taken, notices) = intake.take(vec![
            node_port_service("first", "10.96.0.1", 30080),
            node_port_service("second", "10.96.0.2", 30080),
        ]);
        assert_eq!(taken.len(), 2, "both Services are taken");
        assert_eq!(notices.len(), 1, "{notices:?}");
        let (kind, object, reason, detail) = notices[0].ignored_object().expect("an object left out");
        assert_eq!((kind, object, reason), ("Service", "default/second", "node_port_conflict"));
        assert_eq!(detail, "port http: nodePort 30080 is already used by Service default/first");
    }

    #[test]
    fn scheduler_annotations_are_noticed_in_ipvs_mode_only() {
        let svc = annotated(
            service("default", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]),
            &[(ANNOTATION_SCHEDULER, "fastest")],
        );
        let (_, in_ipvs) = Intake::new("n", true).take(vec![applied_service(svc.clone())]);
        assert!(matches!(in_ipvs.as_slice(), [Notice::Scheduler(n)] if n.object == "default/web"), "{in_ipvs:?}");
        let (_, elsewhere) = Intake::new("n", false).take(vec![applied_service(svc)]);
        assert_eq!(elsewhere, []);
    }

    #[test]
    fn values_and_ignored_objects_are_noticed_and_values_are_not_objects() {
        let mut bad_ips = service("default", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]);
        bad_ips.spec.as_mut().unwrap().external_ips = Some(vec!["bogus".into()]);
        let mut unlabelled = slice("default", "web-1", "web", &[("http", "TCP", 80)], &[ep("10.0.0.1", "n")]);
        unlabelled.metadata.labels = None;
        let (taken, notices) = Intake::new("n", false).take(vec![applied_service(bad_ips), applied_slice(unlabelled)]);
        assert_eq!(taken.len(), 2, "the source's events all go on; the model skips what it ignores");
        assert!(matches!(&notices[0], Notice::Value(v) if v.value.field == "spec.externalIPs"), "{notices:?}");
        assert_eq!(notices[0].ignored_object(), None);
        assert!(matches!(&notices[1], Notice::Object(n) if n.reason == "no_service_name_label"), "{notices:?}");
        assert_eq!(notices.len(), 2);
    }
}
