//! What the manifest source's tests share: manifests, a scratch
//! directory's files, and events summed up as readable lines.

use std::fs;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;

use super::decode::Object;
use super::scan::{ManifestDir, ScanResult};
use crate::msgs::source::{Change, SourceEvent};

pub(super) const WEB_SERVICE: &str = "\
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 10.96.0.20
  ports:
    - name: http
      protocol: TCP
      port: 80
      targetPort: 8080
";

pub(super) const WEB_SLICE: &str = "\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abcde
  namespace: default
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
  - name: http
    protocol: TCP
    port: 8080
endpoints:
  - addresses: [10.244.0.11]
    conditions: {ready: true}
    nodeName: demo-node
";

pub(super) const NODE: &str = "\
apiVersion: v1
kind: Node
metadata:
  name: demo-node
spec:
  podCIDR: 10.244.0.0/24
";

pub(super) const SERVICE_CIDR: &str = "\
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata:
  name: kubernetes
spec:
  cidrs: [10.96.0.0/16, fd00:96::/112]
";

pub(super) fn service(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\n\
         spec:\n  clusterIP: {ip}\n  ports:\n    - port: 80\n"
    )
}

pub(super) fn write(dir: &TempDir, name: &str, text: &str) {
    fs::write(dir.path().join(name), text).expect("write test file");
}

/// The clusterIP of each applied Service, in order.
pub(super) fn applied_cluster_ips(events: &[SourceEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Service(Change::Applied(s)) => s.spec.as_ref().and_then(|s| s.cluster_ip.clone()),
            _ => None,
        })
        .collect()
}

/// A readable line per event: `applied Service default/web`.
pub(super) fn summary(events: &[SourceEvent]) -> Vec<String> {
    events.iter().map(describe_event).collect()
}

pub(super) fn describe_event(event: &SourceEvent) -> String {
    let (verb, object) = match event {
        SourceEvent::Service(change) => verb_and_object(change, Object::Service),
        SourceEvent::EndpointSlice(change) => verb_and_object(change, Object::EndpointSlice),
        SourceEvent::Node(change) => verb_and_object(change, Object::Node),
        SourceEvent::ServiceCidr(change) => verb_and_object(change, Object::ServiceCidr),
        SourceEvent::Synced(kind) => return format!("synced {kind}"),
    };
    let key = object.key().map_or("?".to_owned(), |key| key.to_string());
    format!("{verb} {key}")
}

pub(super) fn verb_and_object<T>(change: &Change<T>, wrap: fn(Arc<T>) -> Object) -> (&'static str, Object) {
    match change {
        Change::Applied(o) => ("applied", wrap(o.clone())),
        Change::Deleted(o) => ("deleted", wrap(o.clone())),
    }
}

/// The object events of a scan, `Synced` left out; panics on errors.
pub(super) fn changes(result: ScanResult) -> Vec<String> {
    assert!(result.errors.is_empty(), "unexpected errors: {:?}", result.errors);
    let mut lines = summary(&result.events);
    lines.retain(|line| !line.starts_with("synced"));
    lines
}

/// The first scan, with no settle time (these tests write in place and
/// scan at once; the settle tests set their own).
pub(super) fn first_scan(dir: &TempDir) -> (ManifestDir, ScanResult) {
    let mut manifests = ManifestDir::new(dir.path()).with_settle(Duration::ZERO);
    let result = manifests.scan();
    (manifests, result)
}
