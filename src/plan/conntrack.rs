//! The conntrack reconciler's plan: which UDP frontends a reconcile checks
//! the family's entries against, and when one is due. Upstream's
//! `conntrack.CleanStaleEntries` (pkg/proxy/conntrack/cleanup.go, as in
//! 1.36) builds the same maps from its service and endpoints maps, and its
//! proxiers (iptables, IPVS, nftables) call it after a sync whose endpoint
//! update touched a Service with a UDP port (`ConntrackCleanupRequired`).
//!
//! - [`serving_frontends`]: every UDP service port with at least one
//!   serving endpoint (ready or not, terminating or not, local or not:
//!   traffic policies and topology are not looked at, as upstream) gives
//!   its ClusterIP, externalIPs and LoadBalancer IPs with the service port,
//!   and its NodePort, each mapped to those endpoints' addresses and target
//!   ports. A port without serving endpoints is left out, as upstream.
//! - [`ConntrackPlanner`]: a reconcile is due at the first sync, after a
//!   sync that changed a UDP service port (its Service or its endpoints),
//!   and after a reconcile that failed or was not sent (the dataplane
//!   failed first: it follows the next successful one). Otherwise nothing
//!   is dumped.
//! - Frontends an earlier reconcile checked and this one does not (the
//!   Service, the port or the address went, or every endpoint stopped
//!   serving) are passed as gone: their DNATed entries are stale too. This
//!   goes beyond upstream 1.36, which only looks at the frontends that exist
//!   now, so a deleted UDP Service's flows (NodePort and LoadBalancer ones
//!   included) kept reaching its old endpoints while their senders kept
//!   the entries alive.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::model::{Model, ModelChanges};
use crate::msgs::{Backends, Frontends, ReconcileConntrack, ServingFrontends};
use crate::net::{IpFamily, Protocol};

/// The family's UDP frontends with serving endpoints, with those endpoints.
pub fn serving_frontends(model: &Model) -> ServingFrontends {
    let mut out = ServingFrontends::default();
    for sp in model.service_ports().filter(|sp| sp.protocol() == Protocol::Udp) {
        let serving: BTreeSet<SocketAddr> =
            model.endpoints(&sp.name).iter().filter(|e| e.serving).map(|e| SocketAddr::new(e.ip, e.port)).collect();
        if serving.is_empty() {
            continue;
        }
        let backends: Backends = Arc::new(serving);
        let ips = std::iter::once(&sp.cluster_ip).chain(&sp.external_ips).chain(&sp.load_balancer_vips);
        for ip in ips {
            insert(&mut out.ips, SocketAddr::new(*ip, sp.port), &backends);
        }
        if sp.node_port != 0 {
            insert(&mut out.node_ports, sp.node_port, &backends);
        }
    }
    out
}

/// Maps `key` to `backends`; a frontend two service ports share (an
/// externalIP two Services list) keeps the endpoints of both.
fn insert<K: Eq + Hash>(map: &mut HashMap<K, Backends>, key: K, backends: &Backends) {
    match map.entry(key) {
        MapEntry::Vacant(v) => {
            v.insert(backends.clone());
        }
        MapEntry::Occupied(mut o) if !Arc::ptr_eq(o.get(), backends) => {
            let union: BTreeSet<SocketAddr> = o.get().union(backends).copied().collect();
            o.insert(Arc::new(union));
        }
        MapEntry::Occupied(_) => {}
    }
}

/// When a reconcile is due and which frontends are gone; kept by each
/// family's dataplane across syncs.
#[derive(Debug)]
pub struct ConntrackPlanner {
    family: IpFamily,
    /// The next sync reconciles (the first one, or a UDP port changed, or
    /// the last reconcile did not go through).
    due: bool,
    /// The frontends the last successful reconcile checked, and those of
    /// every reconcile planned since: what may still have entries.
    checked: Frontends,
    /// The frontends of the reconcile planned and not yet finished.
    in_flight: Option<Frontends>,
}

impl ConntrackPlanner {
    pub fn new(family: IpFamily) -> ConntrackPlanner {
        ConntrackPlanner { family, due: true, checked: Frontends::default(), in_flight: None }
    }

    /// The reconcile that follows sync `generation` (once its dataplane
    /// acked), given the model after `changes`; `None` when none is due, or
    /// when there is nothing to check (no UDP frontend now or before).
    pub fn plan(&mut self, model: &Model, changes: &ModelChanges, generation: u64) -> Option<ReconcileConntrack> {
        self.due |= changes.ports.iter().any(|p| p.protocol == Protocol::Udp);
        if !self.due {
            return None;
        }
        let serving = serving_frontends(model);
        let now = serving.keys();
        let gone = self.checked.without(&now);
        if serving.is_empty() && gone.is_empty() {
            self.checked = now;
            self.due = false;
            return None;
        }
        self.in_flight = Some(now);
        Some(ReconcileConntrack { generation, family: self.family, serving: Arc::new(serving), gone: Arc::new(gone) })
    }

    /// How the planned reconcile went: `ok` if it was sent and every stale
    /// entry went. Otherwise the next sync reconciles again, its gone
    /// frontends still counting this one's.
    pub fn finished(&mut self, ok: bool) {
        let Some(planned) = self.in_flight.take() else {
            return;
        };
        if ok {
            self.checked = planned;
            self.due = false;
        } else {
            self.checked.extend(planned);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::fixtures::*;
    use crate::kernel::conntrack::codec::Entry;
    use crate::kernel::conntrack::filter::is_stale;
    use crate::msgs::{ResourceKind, SourceEvent};
    use serde_json::json;

    const TCP: Protocol = Protocol::Tcp;
    const UDP: Protocol = Protocol::Udp;
    const SCTP: Protocol = Protocol::Sctp;

    // Upstream's cleanup_test.go names.
    const CLUSTER_IP: &str = "172.30.1.1";
    const EXTERNAL_IP: &str = "192.168.99.100";
    const LOAD_BALANCER_IP: &str = "1.2.3.4";
    const SERVING_EP: &str = "10.240.0.4";
    const NON_SERVING_EP: &str = "10.240.1.5";
    const DELETED_EP: &str = "10.240.2.6";
    const OLD_EP_PORT: u16 = 8080;
    const EP_PORT: u16 = 9090;
    const SERVICE_PORT: u16 = 8000;
    const NODE_PORT: u16 = 32000;
    const NON_SERVICE_PORT: u16 = 3000;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    /// Upstream's `cleanup-test` Service: ClusterIP, an externalIP and a
    /// LoadBalancer IP; ports test-tcp, test-udp and test-sctp on 8000, the
    /// UDP and SCTP ones with NodePort 32000.
    fn cleanup_test_service() -> SourceEvent {
        let port = |name: &str, proto: &str, node_port: Option<u16>| {
            let mut p = json!({"name": name, "protocol": proto, "port": SERVICE_PORT, "targetPort": EP_PORT});
            if let Some(np) = node_port {
                p["nodePort"] = json!(np);
            }
            p
        };
        applied_service(from_json(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "test", "name": "cleanup-test"},
            "spec": {
                "type": "LoadBalancer", "clusterIP": CLUSTER_IP, "clusterIPs": [CLUSTER_IP],
                "externalIPs": [EXTERNAL_IP],
                "ports": [port("test-tcp", "TCP", None), port("test-udp", "UDP", Some(NODE_PORT)),
                    port("test-sctp", "SCTP", Some(NODE_PORT))],
            },
            "status": {"loadBalancer": {"ingress": [{"ip": LOAD_BALANCER_IP}]}},
        })))
    }

    /// Its slice (of `service`): a serving and a non-serving endpoint on 9090.
    fn cleanup_test_slice(service: &str) -> SourceEvent {
        let ports = [("test-tcp", "TCP", 9090), ("test-udp", "UDP", 9090), ("test-sctp", "SCTP", 9090)];
        let eps = [ep(SERVING_EP, "test-worker"), ep(NON_SERVING_EP, "test-worker").not_ready()];
        applied_slice(slice("test", "cleanup-test-0", service, &ports, &eps))
    }

    fn model(events: &[SourceEvent]) -> Model {
        let mut m = Model::new(IpFamily::V4, "test-worker");
        m.record(&SourceEvent::Synced(ResourceKind::Service)).expect("synced");
        m.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).expect("synced");
        for e in events {
            m.record(e).expect("valid object");
        }
        m.apply();
        m
    }

    /// Upstream's generateConntrackEntry: to `dst:dport` (a node address
    /// when `dst` is empty: a NodePort), answered from `reply_src:reply_port`.
    fn flow(dst: &str, dport: u16, reply_src: &str, reply_port: u16, protocol: Protocol) -> Entry {
        let dst = if dst.is_empty() { ip("192.168.50.2") } else { ip(dst) };
        let client = SocketAddr::new(ip("10.0.0.1"), 40000);
        Entry::connection(protocol, client, SocketAddr::new(dst, dport), SocketAddr::new(ip(reply_src), reply_port))
    }

    /// The entries `rc` keeps.
    fn kept(rc: &ReconcileConntrack, entries: &[Entry]) -> Vec<Entry> {
        entries.iter().filter(|e| !is_stale(rc, e)).copied().collect()
    }

    fn first_reconcile(m: &Model) -> ReconcileConntrack {
        let mut p = ConntrackPlanner::new(IpFamily::V4);
        p.plan(m, &ModelChanges::default(), 1).expect("the first sync reconciles")
    }

    /// Upstream's TestCleanStaleEntries: of 72 entries, the UDP ones to the
    /// service's IPs on its port or to its NodePort whose reply source is
    /// not the serving endpoint on its current port go (an old target port,
    /// a non-serving or deleted endpoint, no DNAT at all); TCP and SCTP
    /// entries and those to other ports stay.
    #[test]
    fn upstream_clean_stale_entries() {
        let m = model(&[cleanup_test_service(), cleanup_test_slice("cleanup-test")]);
        let rc = first_reconcile(&m);
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for dst in [CLUSTER_IP, LOAD_BALANCER_IP, EXTERNAL_IP] {
            before.push(flow(dst, SERVICE_PORT, SERVING_EP, OLD_EP_PORT, UDP));
        }
        for ep in [SERVING_EP, NON_SERVING_EP, DELETED_EP] {
            for proto in [TCP, UDP, SCTP] {
                for dst in [CLUSTER_IP, LOAD_BALANCER_IP, EXTERNAL_IP] {
                    for port in [SERVICE_PORT, NON_SERVICE_PORT] {
                        let e = flow(dst, port, ep, EP_PORT, proto);
                        before.push(e);
                        if !(proto == UDP && port == SERVICE_PORT && ep != SERVING_EP) {
                            after.push(e);
                        }
                    }
                }
                let e = flow("", NODE_PORT, ep, EP_PORT, proto);
                before.push(e);
                if !(proto == UDP && ep != SERVING_EP) {
                    after.push(e);
                }
            }
        }
        for dst in [CLUSTER_IP, LOAD_BALANCER_IP, EXTERNAL_IP] {
            for port in [SERVICE_PORT, NON_SERVICE_PORT] {
                let e = flow(dst, port, dst, port, UDP);
                before.push(e);
                if port != SERVICE_PORT {
                    after.push(e);
                }
            }
        }
        assert_eq!((before.len(), after.len()), (72, 58));
        assert_eq!(kept(&rc, &before), after);
    }

    /// Upstream's TestServiceWithoutEndpoints: a UDP Service whose only
    /// slice belongs to another Service has no serving endpoints; its
    /// entries stay.
    #[test]
    fn upstream_service_without_endpoints() {
        let m = model(&[cleanup_test_service(), cleanup_test_slice("non-existing-service")]);
        let entries = [
            flow(EXTERNAL_IP, SERVICE_PORT, SERVING_EP, EP_PORT, UDP),
            flow(EXTERNAL_IP, SERVICE_PORT, DELETED_EP, EP_PORT, UDP),
        ];
        let mut p = ConntrackPlanner::new(IpFamily::V4);
        assert!(p.plan(&m, &ModelChanges::default(), 1).is_none(), "nothing to check: no dump");
        let rc = ReconcileConntrack {
            generation: 1,
            family: IpFamily::V4,
            serving: Arc::new(serving_frontends(&m)),
            gone: Arc::default(),
        };
        assert_eq!(kept(&rc, &entries), entries);
    }

    #[test]
    fn frontends_are_the_udp_ports_ips_and_node_ports_with_their_serving_endpoints() {
        let m = model(&[cleanup_test_service(), cleanup_test_slice("cleanup-test")]);
        let f = serving_frontends(&m);
        let eps: BTreeSet<SocketAddr> = [SocketAddr::new(ip(SERVING_EP), EP_PORT)].into();
        let mut ips: Vec<SocketAddr> = f.ips.keys().copied().collect();
        ips.sort();
        let want: Vec<SocketAddr> =
            [LOAD_BALANCER_IP, CLUSTER_IP, EXTERNAL_IP].iter().map(|a| SocketAddr::new(ip(a), SERVICE_PORT)).collect();
        assert_eq!(ips, want);
        assert!(f.ips.values().chain(f.node_ports.values()).all(|b| **b == eps));
        assert_eq!(f.node_ports.keys().copied().collect::<Vec<_>>(), [NODE_PORT]);
    }

    /// Two Services listing one externalIP on one port: its entries may go
    /// to the endpoints of either.
    #[test]
    fn a_shared_frontend_keeps_the_endpoints_of_every_service() {
        let svc = |name: &str, cluster_ip: &str| {
            applied_service(from_json(json!({
                "apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "default", "name": name},
                "spec": {"clusterIP": cluster_ip, "clusterIPs": [cluster_ip], "externalIPs": ["192.0.2.1"],
                    "ports": [{"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 53}]},
            })))
        };
        let sl = |name: &str, ep_ip: &str| {
            applied_slice(slice("default", &format!("{name}-1"), name, &[("dns", "UDP", 53)], &[ep(ep_ip, "n")]))
        };
        let m = model(&[svc("a", "10.96.0.1"), sl("a", "10.244.0.1"), svc("b", "10.96.0.2"), sl("b", "10.244.0.2")]);
        let f = serving_frontends(&m);
        let shared = &f.ips[&"192.0.2.1:53".parse().unwrap()];
        assert_eq!(shared.len(), 2, "{shared:?}");
        assert_eq!(f.ips[&"10.96.0.1:53".parse().unwrap()].len(), 1);
    }

    /// A UDP DNS Service with NodePort 30053 and the given endpoints.
    fn dns(eps: &[&str]) -> Vec<SourceEvent> {
        let svc = service("kube-system", "dns", "10.96.0.10", &[("dns", "UDP", 53, 30053), ("tcp", "TCP", 53, 0)]);
        let eps: Vec<Ep> = eps.iter().map(|i| ep(i, "node-b")).collect();
        let ports = [("dns", "UDP", 5353), ("tcp", "TCP", 5353)];
        vec![applied_service(svc), applied_slice(slice("kube-system", "dns-1", "dns", &ports, &eps))]
    }

    fn web() -> Vec<SourceEvent> {
        let svc = service("default", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]);
        vec![applied_service(svc), applied_slice(slice("default", "web-1", "web", &[("http", "TCP", 80)], &[]))]
    }

    fn sync(m: &mut Model, events: &[SourceEvent]) -> ModelChanges {
        for e in events {
            m.record(e).expect("valid object");
        }
        m.apply()
    }

    #[test]
    fn a_reconcile_is_due_at_start_and_after_udp_changes_only() {
        let mut m = model(&[]);
        let mut p = ConntrackPlanner::new(IpFamily::V4);
        let ch = sync(&mut m, &dns(&["10.244.1.1"]));
        let rc = p.plan(&m, &ch, 1).expect("the first sync");
        assert_eq!(rc.serving.ips.len(), 1);
        assert_eq!(rc.serving.node_ports.len(), 1);
        assert!(rc.gone.is_empty());
        p.finished(true);
        let ch = sync(&mut m, &web());
        assert!(p.plan(&m, &ch, 2).is_none(), "a TCP-only change: no dump");
        assert!(p.plan(&m, &ModelChanges::default(), 3).is_none(), "nothing changed: no dump");
        let ch = sync(&mut m, &dns(&["10.244.1.2"]));
        let rc = p.plan(&m, &ch, 4).expect("a UDP endpoint change");
        let backends: Vec<SocketAddr> = rc.serving.ips.values().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(backends, [SocketAddr::new(ip("10.244.1.2"), 5353)]);
        p.finished(true);
        assert!(p.plan(&m, &ModelChanges::default(), 5).is_none());
    }

    #[test]
    fn nothing_to_check_sends_nothing() {
        let mut m = model(&[]);
        let mut p = ConntrackPlanner::new(IpFamily::V4);
        let ch = sync(&mut m, &web());
        assert!(p.plan(&m, &ch, 1).is_none(), "no UDP frontend: the first sync dumps nothing");
    }

    /// A model with the DNS Service (one endpoint) and a planner whose
    /// first reconcile went (`ok`) or did not.
    fn first_reconcile_done(ok: bool) -> (Model, ConntrackPlanner) {
        let mut m = model(&[]);
        let mut p = ConntrackPlanner::new(IpFamily::V4);
        let ch = sync(&mut m, &dns(&["10.244.1.1"]));
        p.plan(&m, &ch, 1).expect("first");
        p.finished(ok);
        (m, p)
    }

    /// A Service deleted, one scaled to zero: their frontends are gone.
    #[test]
    fn frontends_that_stop_serving_are_gone_once() {
        let (mut m, mut p) = first_reconcile_done(true);
        let ch = sync(&mut m, &dns(&[]));
        let rc = p.plan(&m, &ch, 2).expect("the endpoints went");
        assert!(rc.serving.is_empty());
        assert_eq!(rc.gone.ips, [SocketAddr::new(ip("10.96.0.10"), 53)].into());
        assert_eq!(rc.gone.node_ports, [30053].into());
        p.finished(true);
        let ch = sync(&mut m, &[deleted_service(service("kube-system", "dns", "10.96.0.10", &[]))]);
        assert!(p.plan(&m, &ch, 3).is_none(), "already reconciled as gone, nothing left to check");
    }

    /// A reconcile that failed (or was never sent) leaves its frontends to
    /// be checked again: one that goes before the next success is gone then.
    #[test]
    fn a_failed_reconcile_is_planned_again_with_its_frontends() {
        let (mut m, mut p) = first_reconcile_done(false);
        let rc = p.plan(&m, &ModelChanges::default(), 2).expect("due again after a failure");
        assert_eq!(rc.serving.ips.len(), 1);
        p.finished(false);
        let dns_svc = service("kube-system", "dns", "10.96.0.10", &[]);
        let ch = sync(&mut m, &[deleted_service(dns_svc)]);
        let rc = p.plan(&m, &ch, 3).expect("the Service went");
        assert_eq!(rc.gone.ips.len(), 1, "{rc:?}");
        assert_eq!(rc.gone.node_ports.len(), 1, "{rc:?}");
        p.finished(true);
        assert!(p.plan(&m, &ModelChanges::default(), 4).is_none());
    }

    /// Of a Service's two UDP ports to one endpoint, one removed: that
    /// port's frontend is gone, the other's entries stay.
    #[test]
    fn a_removed_port_is_gone_and_the_other_ports_entries_stay() {
        let two = |ports: &[(&str, i32, i32)]| {
            let spec: Vec<PortSpec> = ports.iter().map(|(n, p, _)| (*n, "UDP", *p, 0)).collect();
            let svc = service("default", "game", "10.96.0.30", &spec);
            let sp: Vec<(&str, &str, i32)> = ports.iter().map(|(n, _, t)| (*n, "UDP", *t)).collect();
            vec![applied_service(svc), applied_slice(slice("default", "game-1", "game", &sp, &[ep("10.244.1.1", "n")]))]
        };
        let mut m = model(&[]);
        let mut p = ConntrackPlanner::new(IpFamily::V4);
        let ch = sync(&mut m, &two(&[("a", 80, 8080), ("b", 81, 8081)]));
        p.plan(&m, &ch, 1).expect("first");
        p.finished(true);
        let ch = sync(&mut m, &two(&[("a", 80, 8080)]));
        let rc = p.plan(&m, &ch, 2).expect("a port went");
        let a = flow("10.96.0.30", 80, "10.244.1.1", 8080, UDP);
        let b = flow("10.96.0.30", 81, "10.244.1.1", 8081, UDP);
        assert_eq!(kept(&rc, &[a, b]), [a]);
    }
}
