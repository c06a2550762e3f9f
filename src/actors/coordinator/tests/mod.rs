//! Coordinator behaviour on in-memory kernels with tokio's paused clock:
//! exact sync instants, ordering between actors, retries, drift repair,
//! fault isolation, and proportional deltas.

use std::future::Future;
use std::time::Duration;

use actix::prelude::*;
use tokio::time::{sleep, Instant};

use super::*;
use crate::actors::wiring::{start_ipvs_actors, IpvsKernels};
use crate::fixtures::*;
use crate::kernel::conntrack::codec::Entry;
use crate::kernel::conntrack::Request;
use crate::kernel::mem::*;
use crate::net::IpFamily;
use crate::plan::context::NodePortFilter;
use crate::plan::ipvs::{IpvsPlanner, IpvsSet};
use crate::stats::StatsRegistry;

mod conntrack;
mod dataplanes;
mod iptables;
mod nftables;
mod nftables_flows;

const MS: Duration = Duration::from_millis(1);

fn run_paused<F: Future<Output = ()>>(f: impl FnOnce() -> F) {
    let sys = actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("tokio runtime")
    });
    sys.block_on(f());
}

struct Harness {
    coord: Addr<Coordinator>,
    k: MemKernels,
    t0: Instant,
    /// The node's interface addresses the coordinator reads.
    addrs: std::sync::Arc<std::sync::Mutex<Vec<LocalAddr>>>,
    stats: StatsRegistry,
}

fn start(min: Duration, max: Duration) -> Harness {
    start_family(IpFamily::V4, min, max)
}

/// One family's proxier (a dual-stack node runs one per family).
fn start_family(family: IpFamily, min: Duration, max: Duration) -> Harness {
    let journal = Journal::default();
    let kernels = IpvsKernels::in_memory(&journal, family);
    let k = MemKernels {
        journal: journal.clone(),
        ipvs: kernels.ipvs.clone(),
        sets: kernels.sets.iter().map(|(s, m)| (s.base_name().to_string(), m.clone())).collect(),
        link: kernels.link.clone(),
        iptables: kernels.iptables.clone(),
        conntrack: kernels.conntrack.clone(),
    };
    let stats = StatsRegistry::default();
    let settings = Settings {
        plan: PlanSettings {
            family,
            node_name: "node-a".into(),
            scheduler: String::new(),
            node_ports: NodePortFilter::All,
        },
        min_sync: min,
        max_sync: max,
        burst: 2,
        model_gates: Default::default(),
    };
    let node_addrs: Vec<LocalAddr> = ["192.168.50.2", "fd00:50::2"]
        .iter()
        .map(|ip| LocalAddr { ifname: "eth0".into(), ip: ip.parse().unwrap() })
        .collect();
    let shared = std::sync::Arc::new(std::sync::Mutex::new(node_addrs));
    let read = shared.clone();
    let addrs: AddrSource = Box::new(move || read.lock().unwrap().clone());
    // A stand-in renderer: the rules name the cluster-IP set once it has members.
    let rules: RulesRenderer = Box::new(|p: &IpvsPlanner, _: &crate::model::NodeInfo| {
        let extra = if p.set_has_members(IpvsSet::ClusterIp) {
            "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst\n"
        } else {
            ""
        };
        format!("*nat\n:KUBE-SERVICES - [0:0]\n{extra}COMMIT\n")
    });
    let registry = stats.clone();
    let coord = Coordinator::create(|ctx| {
        let targets = start_ipvs_actors(kernels, &registry, ctx.address().recipient());
        Coordinator::new(settings, targets, addrs, rules)
    });
    Harness { coord, k, t0: Instant::now(), addrs: shared, stats }
}

impl Harness {
    async fn send(&self, events: Vec<SourceEvent>) {
        self.coord.send(SourceBatch(events)).await.expect("coordinator alive");
    }

    /// Offsets from t0 of the journal lines containing `needle`.
    fn at(&self, needle: &str) -> Vec<Duration> {
        self.k.journal.timed().iter().filter(|(_, l)| l.contains(needle)).map(|(t, _)| *t - self.t0).collect()
    }

    /// Full reads of the IPVS table so far.
    fn ipvs_dumps(&self) -> usize {
        self.k.ipvs.dumps.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The IPVS actor's stats now.
    fn ipvs_stats(&self) -> crate::stats::StatsSnapshot {
        self.stats.snapshot().into_iter().find(|s| s.name == "ipvs").expect("the ipvs actor's stats")
    }

    /// Four minutes on: three periodic syncs or more, no full sync after the
    /// first, and the IPVS table read no more than the `dumps` before (`why`).
    async fn four_minutes_of_partial_syncs(&self, dumps: usize, why: &str) {
        sleep(Duration::from_secs(240)).await;
        let syncs = self.syncs().await;
        assert!(syncs.iter().filter(|s| s.periodic).count() >= 3, "{syncs:?}");
        assert!(syncs.iter().skip(1).all(|s| !s.full), "{syncs:?}");
        assert_eq!(self.ipvs_dumps(), dumps, "{why}");
    }

    async fn syncs(&self) -> Vec<SyncRecord> {
        self.coord.send(GetSyncHistory).await.expect("coordinator alive")
    }
}

/// A coordinator that has synced the `web` service (10.96.0.20) without
/// endpoints yet, 1 ms after t0.
async fn with_web_service(min: Duration, max: Duration) -> Harness {
    let h = start(min, max);
    let mut first = synced();
    first.push(web_svc("web", "10.96.0.20"));
    h.send(first).await;
    sleep(MS).await;
    h
}

/// A coordinator that has synced the `web` service (10.96.0.20, one
/// endpoint 10.244.1.1), 1 ms after t0.
async fn with_web(min: Duration, max: Duration) -> Harness {
    let h = start(min, max);
    let mut first = synced();
    first.extend([web_svc("web", "10.96.0.20"), web_slice("web", &["10.244.1.1"])]);
    h.send(first).await;
    sleep(MS).await;
    h
}

fn synced() -> Vec<SourceEvent> {
    vec![SourceEvent::Synced(ResourceKind::Service), SourceEvent::Synced(ResourceKind::EndpointSlice)]
}

fn web_svc(name: &str, ip: &str) -> SourceEvent {
    applied_service(service("default", name, ip, &[("http", "TCP", 80, 0)]))
}

/// Two ClusterIP services, web and api, one endpoint each, with the sources' synced markers.
fn two_services() -> Vec<SourceEvent> {
    let mut ev = synced();
    ev.extend([
        web_svc("web", "10.96.0.20"),
        web_slice("web", &["10.244.1.1"]),
        web_svc("api", "10.96.0.21"),
        web_slice("api", &["10.244.1.2"]),
    ]);
    ev
}

fn web_slice(name: &str, ips: &[&str]) -> SourceEvent {
    let eps: Vec<Ep> = ips.iter().map(|i| ep(i, "node-b")).collect();
    applied_slice(slice("default", &format!("{name}-1"), name, &[("http", "TCP", 8080)], &eps))
}

#[test]
fn no_sync_before_the_initial_lists_then_an_immediate_full_sync() {
    run_paused(|| async {
        let h = start(Duration::from_secs(1), Duration::from_secs(30));
        h.send(vec![web_svc("web", "10.96.0.20"), SourceEvent::Synced(ResourceKind::Service)]).await;
        sleep(Duration::from_secs(10)).await;
        assert!(h.k.journal.lines().is_empty(), "synced before EndpointSlices listed: {:?}", h.k.journal.lines());
        h.send(vec![SourceEvent::Synced(ResourceKind::EndpointSlice)]).await;
        sleep(10 * MS).await;
        assert_eq!(h.at("ipvs -A -t 10.96.0.20:80"), vec![Duration::from_secs(10)]);
        let syncs = h.syncs().await;
        assert_eq!(syncs.len(), 1);
        assert!(syncs[0].full);
    });
}

#[test]
fn bursts_run_at_once_then_no_closer_than_min_sync_period() {
    run_paused(|| async {
        let h = start(Duration::from_secs(1), Duration::from_secs(30));
        let mut first = synced();
        first.push(web_svc("web", "10.96.0.20"));
        h.send(first).await; // sync 1 at t=0 (full), token 1
        sleep(100 * MS).await;
        h.send(vec![web_slice("web", &["10.244.1.1"])]).await; // sync 2 at 100ms, token 2
        sleep(100 * MS).await;
        h.send(vec![web_slice("web", &["10.244.1.1", "10.244.1.2"])]).await; // bucket empty
        sleep(50 * MS).await;
        h.send(vec![web_slice("web", &["10.244.1.1", "10.244.1.2", "10.244.1.3"])]).await; // coalesces
        sleep(Duration::from_secs(3)).await;
        assert_eq!(h.at("-r 10.244.1.1:8080"), vec![100 * MS]);
        assert_eq!(h.at("-r 10.244.1.2:8080"), vec![1000 * MS], "third sync waits for a token");
        assert_eq!(h.at("-r 10.244.1.3:8080"), vec![1000 * MS], "and carries the coalesced change");
        let syncs = h.syncs().await;
        assert_eq!(syncs.iter().map(|s| s.full).collect::<Vec<_>>(), vec![true, false, false]);
    });
}

#[test]
fn drift_is_repaired_by_the_periodic_checks() {
    run_paused(|| async {
        let h = with_web(Duration::from_secs(1), Duration::from_secs(30)).await;
        // Someone runs `ipvsadm -C`, `ipset flush KUBE-CLUSTER-IP` and `ip addr flush dev kube-ipvs0`.
        *h.k.ipvs.table.lock().unwrap() = Default::default();
        *h.k.sets["KUBE-CLUSTER-IP"].members.lock().unwrap() = Some(Default::default());
        h.k.link.addrs.lock().unwrap().clear();
        sleep(Duration::from_secs(31)).await;
        let secs30 = Duration::from_secs(30);
        assert_eq!(h.at("ipvs -A -t 10.96.0.20:80"), vec![Duration::ZERO, secs30]);
        assert_eq!(h.at("add KUBE-CLUSTER-IP 10.96.0.20,tcp:80"), vec![Duration::ZERO, secs30]);
        assert_eq!(h.at("bind 10.96.0.20"), vec![Duration::ZERO, secs30]);
        assert_eq!(h.k.ipvs.snapshot().dests.len(), 1);
        let syncs = h.syncs().await;
        assert!(syncs.iter().skip(1).all(|s| !s.full), "no full resync of every actor: {syncs:?}");
        assert!(syncs[1].periodic, "{syncs:?}");
    });
}

#[test]
fn a_quiet_cluster_writes_nothing_at_the_sync_period() {
    run_paused(|| async {
        let h = with_web(Duration::from_secs(1), Duration::from_secs(30)).await;
        h.k.journal.clear();
        sleep(Duration::from_secs(95)).await;
        assert_eq!(h.k.journal.lines(), Vec::<String>::new(), "periodic syncs only read");
        let syncs = h.syncs().await;
        let kinds: Vec<(bool, bool, usize)> = syncs.iter().map(|s| (s.full, s.periodic, s.ops)).collect();
        assert_eq!(kinds, vec![(true, false, 6), (false, true, 0), (false, true, 0), (false, true, 0)]);
    });
}

#[test]
fn a_removed_virtual_server_makes_only_ipvs_resync_in_full() {
    run_paused(|| async {
        let h = start(Duration::from_secs(1), Duration::from_secs(30));
        let mut first = synced();
        first.extend([web_svc("web", "10.96.0.20"), web_slice("web", &["10.244.1.1"])]);
        first.extend([web_svc("api", "10.96.0.21"), web_slice("api", &["10.244.1.2"])]);
        h.send(first).await;
        sleep(MS).await;
        h.k.ipvs.table.lock().unwrap().services.retain(|vs, _| !vs.to_string().contains("10.96.0.21"));
        h.k.journal.clear();
        sleep(Duration::from_secs(31)).await;
        let lines = h.k.journal.lines();
        assert_eq!(lines, vec!["ipvs -A -t 10.96.0.21:80 -s rr"], "only the missing one is written back");
        let syncs = h.syncs().await;
        assert_eq!(syncs.len(), 3, "the periodic check, then the IPVS actor's resync: {syncs:?}");
        assert!(syncs[1].periodic && !syncs[2].full && !syncs[2].periodic);
    });
}

/// NodePort virtual servers are per node address: an address added to an
/// interface is picked up by the next periodic sync (as upstream's IPVS
/// proxier, which reads the addresses at every sync).
#[test]
fn a_new_node_address_gets_its_node_ports_at_the_next_periodic_sync() {
    run_paused(|| async {
        let h = start(Duration::from_secs(1), Duration::from_secs(30));
        let mut first = synced();
        let svc = service("default", "np", "10.96.0.30", &[("http", "TCP", 80, 30080)]);
        let mut svc = svc;
        svc.spec.as_mut().unwrap().type_ = Some("NodePort".into());
        first.extend([applied_service(svc), web_slice("np", &["10.244.1.1"])]);
        h.send(first).await;
        sleep(MS).await;
        assert_eq!(h.at("ipvs -A -t 192.168.50.2:30080"), vec![Duration::ZERO]);
        h.addrs.lock().unwrap().push(LocalAddr { ifname: "eth1".into(), ip: "192.168.60.2".parse().unwrap() });
        sleep(Duration::from_secs(31)).await;
        assert_eq!(h.at("ipvs -A -t 192.168.60.2:30080"), vec![Duration::from_secs(30)]);
        assert!(h.syncs().await.last().unwrap().full, "an address change is a full resync");
    });
}

/// The Service addresses the dummy link actor binds on kube-ipvs0 are not
/// node addresses: a periodic sync after one was bound stays partial.
#[test]
fn a_service_address_bound_on_kube_ipvs0_brings_no_full_resync() {
    run_paused(|| async {
        let h = with_web(Duration::from_secs(1), Duration::from_secs(30)).await;
        h.addrs.lock().unwrap().push(LocalAddr { ifname: "kube-ipvs0".into(), ip: "10.96.0.20".parse().unwrap() });
        sleep(Duration::from_secs(31)).await;
        let syncs = h.syncs().await;
        assert!(syncs.iter().any(|s| s.periodic), "a periodic sync ran: {syncs:?}");
        assert!(syncs.iter().skip(1).all(|s| !s.full), "{syncs:?}");
    });
}

#[test]
fn a_full_resync_of_every_actor_comes_once_an_hour() {
    run_paused(|| async {
        let h = with_web(Duration::from_secs(1), Duration::from_secs(30)).await;
        let hour = crate::schedule::FULL_SYNC_PERIOD;
        sleep(hour - Duration::from_secs(1)).await;
        h.k.ipvs.table.lock().unwrap().dests.clear();
        assert!(h.syncs().await.iter().skip(1).all(|s| !s.full));
        sleep(Duration::from_secs(2)).await;
        let last = h.syncs().await.pop().unwrap();
        assert!(last.full, "{last:?}");
        assert_eq!(h.at("-a -t 10.96.0.20:80 -r 10.244.1.1:8080"), vec![Duration::ZERO, hour]);
    });
}

#[test]
fn a_refused_op_is_retried_alone_with_backoff_and_no_full_resync() {
    run_paused(|| async {
        let h = with_web_service(Duration::ZERO, Duration::from_secs(30)).await;
        let dumps = h.ipvs_dumps();
        h.k.journal.fail("-r 10.244.1.1:8080", 3);
        h.send(vec![web_slice("web", &["10.244.1.1", "10.244.1.2"])]).await;
        sleep(Duration::from_millis(150)).await;
        let failing = h.ipvs_stats();
        assert_eq!(failing.failing_keys, 1, "{failing:?}");
        assert!(failing.failing[0].op.contains("-r 10.244.1.1:8080"), "{failing:?}");
        assert!(failing.failing[0].error.contains("Input/output error"), "{failing:?}");
        assert_eq!(failing.failing[0].attempts, 2);
        sleep(Duration::from_secs(2)).await;
        let ms = Duration::from_millis;
        // 100 ms, then 200 ms, then 400 ms after each failure.
        assert_eq!(h.at("-a -t 10.96.0.20:80 -r 10.244.1.1:8080"), vec![MS, ms(101), ms(301), ms(701)]);
        assert_eq!(h.at("-r 10.244.1.2:8080").len(), 1, "the other real server is written once");
        assert_eq!(h.k.ipvs.snapshot().dests.len(), 2);
        assert_eq!(h.ipvs_dumps(), dumps, "no full resync: the table is never read");
        let syncs = h.syncs().await;
        assert!(syncs.iter().skip(1).all(|s| !s.full), "{syncs:?}");
        let retries: Vec<usize> = syncs.iter().skip(2).map(|s| s.ops).collect();
        assert_eq!(retries, [1, 1, 1], "each retry carries the refused op alone: {syncs:?}");
        let done = h.ipvs_stats();
        assert_eq!((done.failing_keys, done.retries), (0, 1), "{done:?}");
    });
}

#[test]
fn a_set_member_refused_in_the_first_full_sync_is_retried_alone() {
    run_paused(|| async {
        let h = start(Duration::ZERO, Duration::from_secs(30));
        h.k.journal.fail("add KUBE-CLUSTER-IP 10.96.0.20,tcp:80", 1);
        let mut first = synced();
        first.extend([web_svc("web", "10.96.0.20"), web_slice("web", &["10.244.1.1"])]);
        h.send(first).await;
        sleep(Duration::from_secs(1)).await;
        let ms = Duration::from_millis;
        assert_eq!(h.at("add KUBE-CLUSTER-IP 10.96.0.20,tcp:80"), vec![ms(0), ms(100)], "refused, then retried");
        let syncs = h.syncs().await;
        assert_eq!(syncs.iter().map(|s| (s.full, s.ops)).collect::<Vec<_>>(), [(true, syncs[0].ops), (false, 1)]);
    });
}

#[test]
fn a_newer_delta_for_the_key_ends_its_retries() {
    run_paused(|| async {
        let h = with_web_service(Duration::ZERO, Duration::from_secs(30)).await;
        h.k.journal.fail("-a -t 10.96.0.20:80 -r 10.244.1.1:8080", u32::MAX);
        h.send(vec![web_slice("web", &["10.244.1.1"])]).await;
        sleep(Duration::from_millis(150)).await;
        assert_eq!(h.at("-a -t 10.96.0.20:80 -r 10.244.1.1:8080").len(), 2);
        // The endpoint goes away: its DelDest decides the key.
        h.send(vec![web_slice("web", &["10.244.1.2"])]).await;
        sleep(Duration::from_secs(5)).await;
        assert_eq!(h.at("-a -t 10.96.0.20:80 -r 10.244.1.1:8080").len(), 2, "no retry after the newer delta");
        assert_eq!(h.ipvs_stats().failing_keys, 0);
        let dests: Vec<_> = h.k.ipvs.snapshot().dests.into_keys().map(|(_, d)| d.addr.to_string()).collect();
        assert_eq!(dests, ["10.244.1.2"]);
    });
}

#[test]
fn a_poison_key_never_turns_periodic_checks_into_full_resyncs() {
    run_paused(|| async {
        let h = with_web(Duration::ZERO, Duration::from_secs(30)).await;
        let dumps = h.ipvs_dumps();
        // A virtual server this kernel refuses for good (as SCTP without ip_vs_proto_sctp).
        h.k.journal.fail("-A -t 10.96.0.21:80", u32::MAX);
        h.send(vec![web_svc("web2", "10.96.0.21"), web_slice("web2", &["10.244.1.2"])]).await;
        h.four_minutes_of_partial_syncs(dumps, "the periodic checks leave the refused key out").await;
        // 1 ms, then 100 ms doubling (ten attempts until 51.1 s), then once a minute.
        assert_eq!(h.at("FAILED ipvs -A -t 10.96.0.21:80").len(), 13);
        let stats = h.ipvs_stats();
        assert_eq!(stats.failing_keys, 2, "the virtual server and its real server: {stats:?}");
        // The other service is untouched by it.
        assert_eq!(h.at("-a -t 10.96.0.20:80 -r 10.244.1.1:8080").len(), 1);
    });
}

/// A virtual server whose delete the kernel refuses stays in the kernel,
/// unplanned, while the delete waits for its retries: the periodic checks
/// skip it there too, and never turn it into full resyncs.
#[test]
fn a_refused_delete_never_turns_periodic_checks_into_full_resyncs() {
    run_paused(|| async {
        let h = with_web(Duration::ZERO, Duration::from_secs(30)).await;
        let dumps = h.ipvs_dumps();
        h.k.journal.fail("-D -t 10.96.0.20:80", u32::MAX);
        h.send(vec![deleted_service(service("default", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]))]).await;
        h.four_minutes_of_partial_syncs(dumps, "the periodic checks skip the virtual server in the kernel too").await;
        assert!(h.at("FAILED ipvs -D -t 10.96.0.20:80").len() >= 10, "the delete is retried");
        assert_eq!(h.ipvs_stats().failing_keys, 1);
    });
}

#[test]
fn an_unknown_outcome_resyncs_that_actor_only() {
    run_paused(|| async {
        let h = with_web_service(Duration::ZERO, Duration::from_secs(30)).await;
        let (dumps, restores) = (h.ipvs_dumps(), h.k.iptables.restores.lock().unwrap().len());
        h.k.journal.lose("-r 10.244.1.1:8080", 1);
        h.send(vec![web_slice("web", &["10.244.1.1"])]).await;
        sleep(Duration::from_millis(1500)).await;
        let syncs = h.syncs().await;
        assert!(syncs[1].failed > 0, "{syncs:?}");
        let retry = &syncs[2];
        assert!(!retry.full && retry.failed == 0, "the retry is not a full sync of every actor: {syncs:?}");
        assert_eq!(h.ipvs_dumps(), dumps + 1, "the IPVS actor read the kernel once");
        assert_eq!(h.k.iptables.restores.lock().unwrap().len(), restores, "iptables was not rewritten");
        // The lost op had taken effect: the resync found it, nothing written twice.
        assert_eq!(h.at("-a -t 10.96.0.20:80 -r 10.244.1.1:8080").len(), 1);
        assert_eq!(h.k.ipvs.snapshot().dests.len(), 1);
    });
}

/// A UDP service (conntrack cleanup applies to UDP) and its slice.
fn dns_service() -> k8s_openapi::api::core::v1::Service {
    service("kube-system", "dns", "10.96.0.10", &[("dns", "UDP", 53, 0)])
}

/// A UDP flow from 10.0.0.1:`sport` to `dst`, DNATed to `ep` (or not, when
/// `ep` is `dst`): a conntrack entry.
fn udp_flow(sport: u16, dst: &str, ep: &str) -> Entry {
    let client = std::net::SocketAddr::new([10, 0, 0, 1].into(), sport);
    Entry::connection(crate::net::Protocol::Udp, client, dst.parse().unwrap(), ep.parse().unwrap())
}

/// The journal line of `e`'s deletion.
fn deletion(e: &Entry) -> String {
    format!("conntrack {}", Request::Delete(e.orig))
}

/// A coordinator that has synced the DNS Service with endpoints
/// 10.244.1.5 and 10.244.2.5, and a UDP flow to it DNATed to 10.244.1.5.
async fn dns_with_a_flow() -> (Harness, Entry) {
    let h = start(Duration::ZERO, Duration::from_secs(30));
    let mut first = synced();
    first.extend([applied_service(dns_service()), dns_slice(&["10.244.1.5", "10.244.2.5"])]);
    h.send(first).await;
    sleep(MS).await;
    let flow = udp_flow(40001, "10.96.0.10:53", "10.244.1.5:53");
    h.k.conntrack.insert(flow);
    (h, flow)
}

/// Makes the next op whose journal line holds `failing` fail, then removes
/// 10.244.1.5 from the DNS Service's endpoints (a sync, 10 ms).
async fn remove_endpoint_with_a_failure(h: &Harness, failing: &str) {
    h.k.journal.fail(failing, 1);
    h.send(vec![dns_slice(&["10.244.2.5"])]).await;
    sleep(10 * MS).await;
}

/// The source ports of the conntrack entries left.
fn flows_left(ct: &MemConntrack) -> Vec<u16> {
    ct.snapshot().iter().filter_map(|e| e.orig.src_port).collect()
}

fn dns_slice(ips: &[&str]) -> SourceEvent {
    let eps: Vec<Ep> = ips.iter().map(|i| ep(i, "node-b")).collect();
    applied_slice(slice("kube-system", "dns-1", "dns", &[("dns", "UDP", 53)], &eps))
}

#[test]
fn ordering_between_actors() {
    run_paused(|| async {
        let h = start(Duration::ZERO, Duration::from_secs(30));
        let dns = dns_service();
        let mut first = synced();
        first.extend([applied_service(dns.clone()), dns_slice(&["10.244.1.5", "10.244.2.5"])]);
        h.send(first).await;
        sleep(MS).await;
        let j = &h.k.journal;
        // A set exists before a rule naming it; a virtual server before its real servers.
        assert!(j.pos("create KUBE-CLUSTER-IP").unwrap() < j.pos("iptables-restore").unwrap());
        assert!(j.pos("ipvs -A -u 10.96.0.10:53").unwrap() < j.pos("ipvs -a -u 10.96.0.10:53").unwrap());
        let flow = udp_flow(40001, "10.96.0.10:53", "10.244.1.5:53");
        h.k.conntrack.insert(flow);
        h.send(vec![dns_slice(&["10.244.2.5"])]).await;
        sleep(MS).await;
        let del = j.pos("ipvs -d -u 10.96.0.10:53 -r 10.244.1.5:53").expect("DelDest");
        let flush = j.pos(&deletion(&flow)).expect("the stale entry deleted");
        assert!(del < flush, "real-server removal before its conntrack entries go: {:?}", j.lines());
        h.send(vec![deleted_service(dns)]).await;
        sleep(MS).await;
        let del_vs = j.pos("ipvs -D -u 10.96.0.10:53").expect("DelService");
        let unbind = j.pos("unbind 10.96.0.10").expect("unbind");
        assert!(del_vs < unbind, "address unbound after its virtual server is gone");
    });
}

/// DESIGN's order holds in full syncs too: a virtual server found in the
/// kernel but not desired is deleted before its address is unbound, and
/// when the delete fails the address stays.
#[test]
fn full_syncs_delete_virtual_servers_before_unbinding_and_keep_the_address_when_that_fails() {
    for fail in [false, true] {
        run_paused(|| async move {
            let h = start(Duration::ZERO, Duration::from_secs(30));
            let stale: crate::msgs::VsKey =
                VsKey { addr: "10.96.0.99".parse().unwrap(), protocol: crate::net::Protocol::Tcp, port: 80 };
            let spec = VsSpec { scheduler: "rr".into(), flags: 0, timeout: 0 };
            h.k.ipvs.table.lock().unwrap().services.insert(stale, spec);
            h.k.link.addrs.lock().unwrap().insert("10.96.0.99".parse().unwrap());
            if fail {
                h.k.journal.fail("ipvs -D -t 10.96.0.99:80", 1);
            }
            let mut first = synced();
            first.push(web_svc("web", "10.96.0.20"));
            h.send(first).await;
            sleep(MS).await;
            let j = &h.k.journal;
            if fail {
                assert!(j.pos("FAILED ipvs -D -t 10.96.0.99:80").is_some(), "{:?}", j.lines());
                assert!(
                    j.pos("unbind 10.96.0.99").is_none(),
                    "unbound though its virtual server may remain: {:?}",
                    j.lines()
                );
                assert!(h.k.link.snapshot().contains(&"10.96.0.99".parse().unwrap()));
            } else {
                let del = j.pos("ipvs -D -t 10.96.0.99:80").expect("stale virtual server deleted");
                let unbind = j.pos("unbind 10.96.0.99").expect("stale address unbound");
                assert!(del < unbind, "{:?}", j.lines());
            }
        });
    }
}

/// A Service's scheduler annotation changed live: the virtual server is
/// edited in place (IPVS_CMD_SET_SERVICE), so its real servers and the
/// connections through them stay; a restart that finds the old scheduler
/// in the kernel edits it too.
#[test]
fn a_scheduler_annotation_change_edits_the_virtual_server_in_place() {
    use crate::model::scheduler::{ANNOTATION_SCHEDULER, ANNOTATION_SCHEDULER_FLAGS};
    run_paused(|| async {
        let h = with_web(Duration::ZERO, Duration::from_secs(30)).await;
        let before = h.k.journal.lines().len();
        let sh = [(ANNOTATION_SCHEDULER, "sh"), (ANNOTATION_SCHEDULER_FLAGS, "fallback")];
        let web = annotated(service("default", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]), &sh);
        h.send(vec![applied_service(web.clone())]).await;
        sleep(10 * MS).await;
        let lines = h.k.journal.lines();
        let ipvs: Vec<&String> = lines[before..].iter().filter(|l| l.starts_with("ipvs ")).collect();
        assert_eq!(ipvs, ["ipvs -E -t 10.96.0.20:80 -s sh -b sh-fallback"], "{lines:?}");
        let table = h.k.ipvs.snapshot();
        let vs = VsKey { addr: "10.96.0.20".parse().unwrap(), protocol: crate::net::Protocol::Tcp, port: 80 };
        assert_eq!(table.services[&vs].scheduler, "sh");
        assert_eq!(table.dests.keys().filter(|(k, _)| *k == vs).count(), 1, "the real server stays");

        // A new daemon over that kernel, with the annotation gone: one edit back to rr.
        let again = start(Duration::ZERO, Duration::from_secs(30));
        *again.k.ipvs.table.lock().unwrap() = table;
        let mut first = synced();
        first.extend([web_svc("web", "10.96.0.20"), web_slice("web", &["10.244.1.1"])]);
        again.send(first).await;
        sleep(10 * MS).await;
        let lines = again.k.journal.lines();
        let ipvs: Vec<&String> = lines.iter().filter(|l| l.starts_with("ipvs -") && l.contains("10.96.0.20")).collect();
        assert_eq!(ipvs, ["ipvs -E -t 10.96.0.20:80 -s rr"], "{lines:?}");
    });
}

#[test]
fn a_failing_ipset_does_not_block_ipvs() {
    run_paused(|| async {
        let h = start(Duration::ZERO, Duration::from_secs(30));
        h.k.journal.fail("add KUBE-CLUSTER-IP", 100);
        let mut first = synced();
        first.extend([web_svc("web", "10.96.0.20"), web_slice("web", &["10.244.1.1"])]);
        h.send(first).await;
        sleep(MS).await;
        assert_eq!(h.k.ipvs.snapshot().services.len(), 1);
        assert_eq!(h.k.link.snapshot().len(), 1);
        assert!(h.syncs().await[0].failed > 0);
    });
}

#[test]
fn one_endpoint_change_among_many_services_is_one_kernel_op() {
    run_paused(|| async {
        let h = start(Duration::ZERO, Duration::from_secs(300));
        let mut first = synced();
        for i in 0..2000u32 {
            let name = format!("svc-{i}");
            first.push(web_svc(&name, &format!("10.96.{}.{}", i / 256, i % 256)));
            first.push(web_slice(&name, &[&format!("10.244.{}.{}", i / 256, i % 256)]));
        }
        h.send(first).await;
        sleep(MS).await;
        h.k.journal.clear();
        h.send(vec![web_slice("svc-1234", &["10.244.4.210", "10.250.0.1"])]).await;
        sleep(MS).await;
        assert_eq!(h.k.journal.lines(), vec!["ipvs -a -t 10.96.4.210:80 -r 10.250.0.1:8080 -m -w 1"]);
        assert_eq!(h.syncs().await.last().map(|s| s.ops), Some(1), "the sync record counts that one op");
    });
}

#[test]
fn drift_reported_by_an_actor_triggers_an_immediate_full_resync() {
    run_paused(|| async {
        let h = start(Duration::from_secs(1), Duration::from_secs(30));
        let mut first = synced();
        first.extend([web_svc("web", "10.96.0.20"), web_slice("web", &["10.244.1.1"])]);
        h.send(first).await;
        sleep(Duration::from_secs(5)).await;
        *h.k.ipvs.table.lock().unwrap() = Default::default();
        h.coord.send(DriftDetected { actor: "iptables".into() }).await.unwrap();
        sleep(MS).await;
        assert_eq!(h.at("ipvs -A -t 10.96.0.20:80"), vec![Duration::ZERO, Duration::from_secs(5)]);
        assert!(h.syncs().await.last().unwrap().full);
    });
}

#[test]
fn shutdown_waits_for_the_sync_in_flight_and_then_takes_no_events() {
    run_paused(|| async {
        let h = start(Duration::ZERO, Duration::from_secs(30));
        let mut first = synced();
        first.push(web_svc("web", "10.96.0.20"));
        h.send(first).await;
        h.coord.send(Shutdown).await.unwrap();
        assert_eq!(h.syncs().await.len(), 1, "the first sync finished before the answer");
        h.send(vec![web_svc("late", "10.96.0.21")]).await;
        sleep(Duration::from_secs(60)).await;
        assert!(h.at("10.96.0.21").is_empty(), "no sync after shutdown");
        assert_eq!(h.syncs().await.len(), 1, "not even the periodic one");
    });
}

/// Dual-stack: the two families' proxiers get the same events; the IPv6
/// one's IPVS refuses everything, and the IPv4 one syncs on time regardless
/// (its own schedule, no waiting on the other family's acks or retries).
#[test]
fn a_failing_family_does_not_hold_back_the_other() {
    run_paused(|| async {
        let v4 = start_family(IpFamily::V4, Duration::ZERO, Duration::from_secs(30));
        let v6 = start_family(IpFamily::V6, Duration::ZERO, Duration::from_secs(30));
        v6.k.journal.fail("ipvs", u32::MAX);
        let dual = |name: &str, ips: [&str; 2]| {
            let mut svc = service("default", name, ips[0], &[("http", "TCP", 80, 0)]);
            let spec = svc.spec.as_mut().unwrap();
            spec.cluster_ips = Some(ips.iter().map(|s| s.to_string()).collect());
            spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
            applied_service(svc)
        };
        let mut first = synced();
        first.push(dual("web", ["10.96.0.20", "fd00::20"]));
        for h in [&v4, &v6] {
            h.send(first.clone()).await;
        }
        sleep(Duration::from_secs(5)).await;
        for h in [&v4, &v6] {
            h.send(vec![dual("api", ["10.96.0.21", "fd00::21"])]).await;
        }
        sleep(10 * MS).await;
        assert_eq!(v4.at("ipvs -A -t 10.96.0.20:80"), vec![Duration::ZERO]);
        assert_eq!(v4.at("ipvs -A -t 10.96.0.21:80"), vec![Duration::from_secs(5)], "on time despite IPv6");
        assert!(v4.syncs().await.iter().all(|s| s.failed == 0));
        let v6_syncs = v6.syncs().await;
        assert!(v6_syncs.len() >= 2 && v6_syncs.iter().all(|s| s.failed > 0), "{v6_syncs:?}");
        assert!(v6.at("FAILED ipvs -A -t [fd00::20]:80").len() >= 2, "IPv6 retried on its own schedule");
        assert!(v4.k.journal.lines().iter().all(|l| !l.contains("fd00::")), "nothing of IPv6 in IPv4's kernels");
    });
}

/// IPv4 on node-a, every NodePort address, no minSyncPeriod, syncPeriod 30 s.
fn unlimited_settings() -> Settings {
    let plan = PlanSettings {
        family: IpFamily::V4,
        node_name: "node-a".into(),
        scheduler: String::new(),
        node_ports: NodePortFilter::All,
    };
    Settings {
        plan,
        min_sync: Duration::ZERO,
        max_sync: Duration::from_secs(30),
        burst: 2,
        model_gates: Default::default(),
    }
}

/// A coordinator over `dataplane` (unlimited settings) that has been sent
/// the sources' synced markers and Service web, 5 ms ago.
async fn started_with_web<D: Dataplane + 'static>(dataplane: D) -> Addr<Coordinator<D>> {
    let coord = Coordinator::with_dataplane(unlimited_settings(), dataplane).start();
    let mut first = synced();
    first.push(web_svc("web", "10.96.0.20"));
    coord.send(SourceBatch(first)).await.unwrap();
    sleep(5 * MS).await;
    coord
}
