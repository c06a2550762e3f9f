//! NodePorts are unique on a node, as the API server's allocator makes them:
//! a Service asking for a nodePort another Service holds would be refused
//! there. A manifest file (or an API server behind a webhook or a version
//! skew) can still hand us two; without this both would be programmed and
//! whichever rule comes first would win, silently.
//!
//! [`NodePortClaims`] sits between the source and the proxiers (once, not
//! per family): the Service that held a nodePort first keeps it; a later
//! one gets that port without its nodePort (its ClusterIP and other ports
//! still work) and a [`Conflict`] naming both. When the holder lets the
//! port go (deleted, or changed to another port), the refused Service is
//! passed on again, whole if nothing else conflicts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;

use super::service::namespaced_name;
use crate::msgs::{Change, SourceEvent};

/// A nodePort refused to a Service because another one holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// `namespace/name` of the refused Service.
    pub service: String,
    /// The refused port's name (or its number, when unnamed).
    pub port: String,
    pub node_port: i32,
    /// `namespace/name` of the Service holding the nodePort.
    pub holder: String,
}

/// Who holds which nodePort; see the module doc.
#[derive(Debug, Default)]
pub struct NodePortClaims {
    holders: HashMap<i32, String>,
    held: HashMap<String, Vec<i32>>,
    /// Services with a refused nodePort, as the source sent them.
    refused: BTreeMap<String, Arc<Service>>,
}

/// The nodePorts `svc` asks for (NodePort and LoadBalancer Services).
fn wanted(svc: &Service) -> Vec<i32> {
    let Some(spec) = &svc.spec else { return Vec::new() };
    if !matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer")) {
        return Vec::new();
    }
    let mut ports: Vec<i32> = spec.ports.iter().flatten().filter_map(|p| p.node_port).filter(|n| *n > 0).collect();
    // One Service may use a nodePort for several protocols.
    ports.sort_unstable();
    ports.dedup();
    ports
}

impl NodePortClaims {
    /// Passes `events` on, in order, with refused nodePorts cleared, plus
    /// Services passed on again because a port they were refused is free.
    /// Returns the events and the conflicts found; the events are the
    /// same objects when nothing conflicts.
    pub fn filter(&mut self, events: Vec<SourceEvent>) -> (Vec<SourceEvent>, Vec<Conflict>) {
        let mut out = Vec::with_capacity(events.len());
        let mut conflicts = Vec::new();
        for ev in events {
            match &ev {
                SourceEvent::Service(Change::Applied(svc)) => {
                    let key = namespaced_name(&svc.metadata).to_string();
                    let freed = self.release(&key);
                    let svc = svc.clone();
                    out.push(SourceEvent::Service(Change::Applied(self.admit(key, svc, &mut conflicts))));
                    self.readmit(freed, &mut out, &mut conflicts);
                }
                SourceEvent::Service(Change::Deleted(svc)) => {
                    let key = namespaced_name(&svc.metadata).to_string();
                    self.refused.remove(&key);
                    let freed = self.release(&key);
                    out.push(ev);
                    self.readmit(freed, &mut out, &mut conflicts);
                }
                _ => out.push(ev),
            }
        }
        (out, conflicts)
    }

    /// Drops `key`'s claims; true if it held any.
    fn release(&mut self, key: &str) -> bool {
        let Some(ports) = self.held.remove(key) else { return false };
        for p in &ports {
            self.holders.remove(p);
        }
        !ports.is_empty()
    }

    /// Claims what `svc` asks for; returns it, or a copy without the
    /// nodePorts others hold.
    fn admit(&mut self, key: String, svc: Arc<Service>, conflicts: &mut Vec<Conflict>) -> Arc<Service> {
        let mut refused = Vec::new();
        let mut claimed = Vec::new();
        for p in wanted(&svc) {
            match self.holders.get(&p) {
                Some(holder) if *holder != key => refused.push((p, holder.clone())),
                _ => {
                    self.holders.insert(p, key.clone());
                    claimed.push(p);
                }
            }
        }
        if !claimed.is_empty() {
            self.held.insert(key.clone(), claimed);
        }
        if refused.is_empty() {
            self.refused.remove(&key);
            return svc;
        }
        let mut copy = (*svc).clone();
        for port in copy.spec.iter_mut().flat_map(|s| s.ports.iter_mut().flatten()) {
            if let Some((n, holder)) = refused.iter().find(|(n, _)| Some(*n) == port.node_port) {
                conflicts.push(Conflict {
                    service: key.clone(),
                    port: port.name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| port.port.to_string()),
                    node_port: *n,
                    holder: holder.clone(),
                });
                port.node_port = None;
            }
        }
        self.refused.insert(key, svc);
        Arc::new(copy)
    }

    /// After ports were freed: the refused Services again, each passed on
    /// if it now gets more of its ports.
    fn readmit(&mut self, freed: bool, out: &mut Vec<SourceEvent>, conflicts: &mut Vec<Conflict>) {
        if !freed || self.refused.is_empty() {
            return;
        }
        let waiting: Vec<(String, Arc<Service>)> = self.refused.iter().map(|(k, s)| (k.clone(), s.clone())).collect();
        for (key, svc) in waiting {
            let free = wanted(&svc).iter().any(|p| !self.holders.contains_key(p));
            if free {
                self.release(&key);
                let admitted = self.admit(key, svc, conflicts);
                out.push(SourceEvent::Service(Change::Applied(admitted)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn svc(name: &str, node_ports: &[i32]) -> Arc<Service> {
        Arc::new(Service {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some("default".into()), ..Default::default() },
            spec: Some(ServiceSpec {
                type_: Some("NodePort".into()),
                ports: Some(
                    node_ports
                        .iter()
                        .enumerate()
                        .map(|(i, n)| ServicePort {
                            name: Some(format!("p{i}")),
                            port: 80 + i as i32,
                            node_port: Some(*n),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn applied(s: Arc<Service>) -> SourceEvent {
        SourceEvent::Service(Change::Applied(s))
    }

    fn node_ports(ev: &SourceEvent) -> (String, Vec<Option<i32>>) {
        let SourceEvent::Service(Change::Applied(s)) = ev else { panic!("{ev:?}") };
        let ports = s.spec.iter().flat_map(|s| s.ports.iter().flatten()).map(|p| p.node_port).collect();
        (s.metadata.name.clone().unwrap_or_default(), ports)
    }

    #[test]
    fn the_first_holder_keeps_a_node_port_and_the_later_service_loses_only_that_port() {
        let mut claims = NodePortClaims::default();
        let (out, conflicts) = claims.filter(vec![applied(svc("a", &[30080])), applied(svc("b", &[30080, 30081]))]);
        assert_eq!(node_ports(&out[0]), ("a".into(), vec![Some(30080)]));
        assert_eq!(node_ports(&out[1]), ("b".into(), vec![None, Some(30081)]));
        assert_eq!(
            conflicts,
            [Conflict { service: "default/b".into(), port: "p0".into(), node_port: 30080, holder: "default/a".into() }]
        );
        // The holder changing its own Service keeps the port; no new conflict.
        let (out, conflicts) = claims.filter(vec![applied(svc("a", &[30080]))]);
        assert_eq!((out.len(), conflicts.len()), (1, 0));
    }

    #[test]
    fn a_freed_port_goes_to_the_service_that_was_refused_it() {
        let mut claims = NodePortClaims::default();
        claims.filter(vec![applied(svc("a", &[30080])), applied(svc("b", &[30080]))]);
        // a moves to another port: b is passed on again, whole.
        let (out, conflicts) = claims.filter(vec![applied(svc("a", &[30090]))]);
        assert!(conflicts.is_empty());
        assert_eq!(
            out.iter().map(node_ports).collect::<Vec<_>>(),
            [("a".into(), vec![Some(30090)]), ("b".into(), vec![Some(30080)])]
        );
        // Now b holds it: a asking again is refused.
        let (out, conflicts) = claims.filter(vec![applied(svc("a", &[30080]))]);
        assert_eq!(node_ports(&out[0]), ("a".into(), vec![None]));
        assert_eq!(conflicts[0].holder, "default/b");
        // b deleted: a gets it.
        let (out, _) = claims.filter(vec![SourceEvent::Service(Change::Deleted(svc("b", &[])))]);
        assert_eq!(node_ports(&out[1]), ("a".into(), vec![Some(30080)]));
    }

    #[test]
    fn services_without_node_ports_pass_as_they_are() {
        let mut claims = NodePortClaims::default();
        let mut cluster_ip = (*svc("c", &[30080])).clone();
        cluster_ip.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        let cluster_ip = Arc::new(cluster_ip);
        let (out, conflicts) = claims.filter(vec![applied(svc("a", &[30080])), applied(cluster_ip.clone())]);
        assert!(conflicts.is_empty());
        let SourceEvent::Service(Change::Applied(passed)) = &out[1] else { panic!() };
        assert!(Arc::ptr_eq(passed, &cluster_ip), "not copied");
    }
}
