//! The conntrack reconciler through the daemon binary, with real UDP flows:
//! scenarios that `iptables_daemon` and `nftables_daemon` each run on their
//! own lab (the client, node and backend namespaces of [`super::lab`]).
//! Every scenario makes the node dual-stack and carries each flow in both
//! families, so both proxiers' reconciles are seen.
//!
//! A flow is one connected UDP socket in the client namespace: one source
//! port, one conntrack entry in the node, refreshed by every datagram, so
//! without a reconcile it keeps reaching the endpoint it was DNATed to
//! whatever the rules say now. The entry is read with `conntrack -L -o id`
//! (its original destination, reply source and id: an entry deleted and
//! made again by the next datagram has a new id).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::daemon::{family_metric, service_manifest, wait_for, Daemon, PortSpec};
use super::lab::{addr, serve_port, udp_exchange, Answer, NODE_IP, NODE_IP6};
use super::Netns;

/// What the scenarios need of a test file's lab.
pub trait DaemonLab {
    fn node(&self) -> &Netns;
    fn client(&self) -> &Netns;
    /// Backend `name`'s namespace (`b1`, `b2`).
    fn backend(&self, name: &str) -> &Netns;
    /// Writes manifest `<name>.json`.
    fn put(&self, name: &str, value: &Value);
    fn remove(&self, name: &str);
    /// Makes the node dual-stack: its Node's addresses and the daemon's cluster CIDRs.
    fn dual_stack(&self);
    /// Starts the daemon and waits for its first sync.
    fn start_synced(&mut self) -> Daemon;
}

/// Implements [`DaemonLab`] for a test file's `Lab` type, by its fields
/// `node`, `client` and `_backends` and its methods `put`, `remove`,
/// `dual_stack` and `start_synced`.
#[macro_export]
macro_rules! impl_daemon_lab {
    ($lab:ty) => {
        impl $crate::common::conntrack::DaemonLab for $lab {
            fn node(&self) -> &$crate::common::Netns {
                &self.node
            }

            fn client(&self) -> &$crate::common::Netns {
                &self.client
            }

            fn backend(&self, name: &str) -> &$crate::common::Netns {
                let found = self._backends.iter().find(|b| b.0 == name);
                &found.unwrap_or_else(|| panic!("no backend {name}")).1
            }

            fn put(&self, name: &str, value: &serde_json::Value) {
                <$lab>::put(self, name, value)
            }

            fn remove(&self, name: &str) {
                <$lab>::remove(self, name)
            }

            fn dual_stack(&self) {
                <$lab>::dual_stack(self)
            }

            fn start_synced(&mut self) -> $crate::common::daemon::Daemon {
                <$lab>::start_synced(self)
            }
        }
    };
}

/// How long a change may take to show in the conntrack table (inotify's
/// settle time, one sync, the reconcile).
const CHANGE_WAIT: Duration = Duration::from_secs(6);
/// How long a flow waits for an answer before calling it dropped.
const ANSWER_WAIT: Duration = Duration::from_millis(700);
/// How long flows that must keep working are watched after a change.
const WATCH: Duration = Duration::from_secs(2);

/// Backend `bN`'s address in the family of `like`.
fn backend_ip(name: &str, like: &SocketAddr) -> IpAddr {
    let n = &name[1..];
    let ip = if like.is_ipv4() { format!("10.244.{n}.2") } else { format!("fd00:244:{n}::2") };
    ip.parse().expect("backend address")
}

/// A long-lived UDP flow from the client.
pub struct Flow {
    pub to: SocketAddr,
    sock: UdpSocket,
}

impl Flow {
    fn open(client: &Netns, to: &str) -> Flow {
        let to = addr(to);
        let sock = client.run(|| {
            let s = UdpSocket::bind(if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }).expect("bind");
            s.connect(to).expect("connect");
            s.set_read_timeout(Some(ANSWER_WAIT)).expect("read timeout");
            s
        });
        Flow { to, sock }
    }

    fn exchange(&self) -> Answer {
        udp_exchange(&self.sock)
    }

    /// Waits until the flow is answered by `backend`.
    fn wait_answer(&self, backend: &str) {
        wait_for(&format!("{} to be answered by {backend}", self.to), CHANGE_WAIT, || match self.exchange() {
            Ok((name, _)) if name == backend => Ok(()),
            other => Err(format!("{other:?}")),
        });
    }

    /// The flow's conntrack entry DNATed to `backend` (any port), if any.
    fn entry_to(&self, node: &Netns, backend: &str) -> Option<CtEntry> {
        let ip = backend_ip(backend, &self.to);
        self.entries(node).into_iter().find(|e| e.reply_src.ip() == ip)
    }

    /// The node's UDP entries of this flow (its source port, its family).
    fn entries(&self, node: &Netns) -> Vec<CtEntry> {
        let sport = self.sock.local_addr().expect("local address").port().to_string();
        let family = if self.to.is_ipv4() { "ipv4" } else { "ipv6" };
        let out = node.ok(&["conntrack", "-L", "-f", family, "-p", "udp", "--sport", &sport, "-o", "id"]);
        out.lines().filter_map(CtEntry::parse).filter(|e| e.orig_dst == self.to).collect()
    }
}

/// A conntrack entry as `conntrack -L -o id` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtEntry {
    pub orig_dst: SocketAddr,
    pub reply_src: SocketAddr,
    pub id: String,
}

impl CtEntry {
    /// `udp 17 29 src=A dst=B sport=P dport=Q [UNREPLIED] src=C dst=A
    /// sport=R dport=P mark=0 use=1 id=N`: the first src/dst/sport/dport are
    /// the original direction, the second ones the reply.
    fn parse(line: &str) -> Option<CtEntry> {
        let values = |key: &str| -> Vec<&str> { line.split_whitespace().filter_map(|t| t.strip_prefix(key)).collect() };
        let (src, dst, sport, dport) = (values("src="), values("dst="), values("sport="), values("dport="));
        let at = |ip: &str, port: &str| Some(SocketAddr::new(ip.parse().ok()?, port.parse().ok()?));
        Some(CtEntry {
            orig_dst: at(dst.first()?, dport.first()?)?,
            reply_src: at(src.get(1)?, sport.get(1)?)?,
            id: values("id=").first()?.to_string(),
        })
    }
}

/// The node's address and `port`, as a flow's destination, per family.
fn node_ports(port: u16) -> [String; 2] {
    [format!("{NODE_IP}:{port}"), format!("[{NODE_IP6}]:{port}")]
}

/// Opens a flow to each of `to` and waits until `backend` answers each.
fn flows_to(lab: &impl DaemonLab, to: &[String], backend: &str) -> Vec<Flow> {
    let flows: Vec<Flow> = to.iter().map(|t| Flow::open(lab.client(), t)).collect();
    for f in &flows {
        f.wait_answer(backend);
    }
    flows
}

/// The entries of `flows` DNATed to `backend`; panics if one has none.
fn entries_to(lab: &impl DaemonLab, flows: &[Flow], backend: &str) -> Vec<CtEntry> {
    let entry = |f: &Flow| f.entry_to(lab.node(), backend);
    flows.iter().map(|f| entry(f).unwrap_or_else(|| panic!("{}: no entry to {backend}", f.to))).collect()
}

/// Waits until none of `flows` has an entry DNATed to `backend` any more.
fn wait_entries_gone(lab: &impl DaemonLab, flows: &[Flow], backend: &str, what: &str) {
    wait_for(what, CHANGE_WAIT, || {
        let left: Vec<CtEntry> = flows.iter().filter_map(|f| f.entry_to(lab.node(), backend)).collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("still there: {left:?}"))
        }
    });
}

/// For [`WATCH`]: each of `flows` keeps being answered by `backend` and
/// keeps its entry (the same id) in `kept`.
fn assert_flows_kept(lab: &impl DaemonLab, flows: &[Flow], backend: &str, kept: &[CtEntry]) {
    let since = Instant::now();
    while since.elapsed() < WATCH {
        for (f, e) in flows.iter().zip(kept) {
            assert_eq!(f.exchange().map(|a| a.0), Ok(backend.to_string()), "{} keeps reaching {backend}", f.to);
            assert_eq!(f.entry_to(lab.node(), backend).as_ref(), Some(e), "{} keeps its entry", f.to);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every one of `flows` goes unanswered now.
fn assert_unanswered(flows: &[Flow]) {
    for f in flows {
        assert!(f.exchange().is_err(), "{}: answered without a Service", f.to);
    }
}

fn udp_port(port: u16, target: u16, node_port: u16) -> PortSpec<'static> {
    ("dns", "UDP", port, target, node_port)
}

/// A UDP LoadBalancer Service (NodePort 30050, LoadBalancer IPs
/// 203.0.113.50 and 2001:db8::50) is deleted: its flows to the NodePort and
/// the LoadBalancer IPs, in both families, lose their entries to b1 at the
/// sync that deletes its rules, and go unanswered. Another Service's flows
/// to the same endpoint keep theirs. (Upstream 1.36's reconciler only looks
/// at the Services that exist, so it leaves those entries, and the flows
/// reach b1 for as long as they keep sending.)
pub fn a_deleted_services_node_port_and_load_balancer_flows_are_cleared(lab: &mut impl DaemonLab) {
    lab.dual_stack();
    let lb_ips = ["203.0.113.50", "2001:db8::50"];
    let gone = [udp_port(80, 8080, 30050)];
    lab.put("gone", &service_manifest("gone", "LoadBalancer", &["10.96.0.50", "fd00:96::50"], &gone, &lb_ips, &["b1"]));
    let keep = [udp_port(80, 8080, 0)];
    lab.put("keep", &service_manifest("keep", "ClusterIP", &["10.96.0.51", "fd00:96::51"], &keep, &[], &["b1"]));
    let daemon = lab.start_synced();
    let mut to = node_ports(30050).to_vec();
    to.extend(["203.0.113.50:80".to_string(), "[2001:db8::50]:80".to_string()]);
    let doomed = flows_to(lab, &to, "b1");
    let kept = flows_to(lab, &["10.96.0.51:80".to_string(), "[fd00:96::51]:80".to_string()], "b1");
    entries_to(lab, &doomed, "b1");
    let kept_entries = entries_to(lab, &kept, "b1");

    lab.remove("gone");
    wait_entries_gone(lab, &doomed, "b1", "the deleted Service's entries to go");
    assert_unanswered(&doomed);
    assert_flows_kept(lab, &kept, "b1", &kept_entries);
    daemon.stop();
}

/// A Service with two UDP ports to one endpoint (80 to b1:8080, 81 to
/// b1:8081), in both families; port 81 is removed. The flows to port 80
/// keep their entries (the same ids) and their answers, through the sync
/// and after it; the flows to port 81 lose theirs and go unanswered.
pub fn a_flow_to_another_port_of_the_same_endpoint_survives(lab: &mut impl DaemonLab) {
    lab.dual_stack();
    let _second = serve_port(lab.backend("b1"), "b1", 8081);
    let ips = ["10.96.0.60", "fd00:96::60"];
    let (a, b) = (("a", "UDP", 80, 8080, 0), ("b", "UDP", 81, 8081, 0));
    lab.put("game", &service_manifest("game", "ClusterIP", &ips, &[a, b], &[], &["b1"]));
    let daemon = lab.start_synced();
    let port_a = flows_to(lab, &["10.96.0.60:80".to_string(), "[fd00:96::60]:80".to_string()], "b1");
    let port_b = flows_to(lab, &["10.96.0.60:81".to_string(), "[fd00:96::60]:81".to_string()], "b1");
    let kept = entries_to(lab, &port_a, "b1");
    entries_to(lab, &port_b, "b1");

    lab.put("game", &service_manifest("game", "ClusterIP", &ips, &[a], &[], &["b1"]));
    wait_entries_gone(lab, &port_b, "b1", "the removed port's entries to go");
    assert_flows_kept(lab, &port_a, "b1", &kept);
    assert_unanswered(&port_b);
    daemon.stop();
}

/// The daemon is stopped (its rules stay), the Service `web` moves from b1
/// to b2 in the manifests, and flows to it are opened: the old rules DNAT
/// them to b1. The next daemon's first sync reconciles: those entries go
/// and the same flows reach b2; the flows of a Service that did not change
/// keep their entries (as upstream 1.36, which keeps UDP flows across a
/// restart: its first sync flushes no Service's entries wholesale). Both
/// families' reconciler metrics count the deletions.
pub fn an_entry_created_while_the_daemon_was_stopped_is_cleared_at_its_first_sync(lab: &mut impl DaemonLab) {
    lab.dual_stack();
    let web = |backend: &str| {
        service_manifest("web", "ClusterIP", &["10.96.0.70", "fd00:96::70"], &[udp_port(80, 8080, 0)], &[], &[backend])
    };
    lab.put("web", &web("b1"));
    let ctl =
        service_manifest("ctl", "ClusterIP", &["10.96.0.71", "fd00:96::71"], &[udp_port(80, 8080, 0)], &[], &["b1"]);
    lab.put("ctl", &ctl);
    let first = lab.start_synced();
    let control = flows_to(lab, &["10.96.0.71:80".to_string(), "[fd00:96::71]:80".to_string()], "b1");
    let control_entries = entries_to(lab, &control, "b1");
    first.stop();

    lab.put("web", &web("b2"));
    let stale = flows_to(lab, &["10.96.0.70:80".to_string(), "[fd00:96::70]:80".to_string()], "b1");
    entries_to(lab, &stale, "b1");
    let second = lab.start_synced();
    wait_entries_gone(lab, &stale, "b1", "the entries to the removed endpoint to go");
    for f in &stale {
        f.wait_answer("b2");
    }
    assert_flows_kept(lab, &control, "b1", &control_entries);
    for family in ["IPv4", "IPv6"] {
        let deleted = family_metric(lab.node(), "kubeproxy_conntrack_reconciler_deleted_entries_total", family);
        assert!(deleted.is_some_and(|n| n >= 1.0), "{family}: deleted entries counted: {deleted:?}");
        let runs = family_metric(lab.node(), "kubeproxy_conntrack_reconciler_sync_duration_seconds_count", family);
        assert!(runs.is_some_and(|n| n >= 1.0), "{family}: reconciles timed: {runs:?}");
    }
    second.stop();
}
