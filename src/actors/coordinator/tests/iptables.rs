//! The same coordinator driving iptables mode's dataplane.

use super::*;
use crate::actors::wiring::start_iptables_actors;
use crate::plan::iptables::iptables_context;

struct Ipt {
    coord: Addr<Coordinator<IptablesDataplane>>,
    iptables: MemIptables,
    conntrack: MemConntrack,
    journal: Journal,
}

fn start_iptables(kernel_chains: &[String]) -> Ipt {
    let journal = Journal::default();
    let iptables = MemIptables::new(&journal);
    let settings = crate::fixtures::iptables_settings(IpFamily::V4, "node-a", NodePortFilter::All);
    let context: ContextBuilder = Box::new(move |node, addrs| iptables_context(&settings, node, addrs));
    let addrs: AddrSource = Box::new(Vec::new);
    let settings = unlimited_settings();
    let conntrack = MemConntrack::new(&journal);
    let coord = Coordinator::create(|ctx| {
        let targets = start_iptables_actors(
            iptables.clone(),
            conntrack.clone(),
            &StatsRegistry::default(),
            ctx.address().recipient(),
        );
        Coordinator::with_dataplane(settings, IptablesDataplane::new(targets, addrs, context, kernel_chains))
    });
    Ipt { coord, iptables, conntrack, journal }
}

impl Ipt {
    async fn send(&self, events: Vec<SourceEvent>) {
        self.coord.send(SourceBatch(events)).await.expect("coordinator alive");
    }

    fn restores(&self) -> Vec<String> {
        self.iptables.restores.lock().unwrap().clone()
    }

    async fn syncs(&self) -> Vec<SyncRecord> {
        self.coord.send(GetSyncHistory).await.expect("coordinator alive")
    }
}

/// The per-service chains a restore writes (declared and filled).
fn service_chains(text: &str) -> Vec<&str> {
    text.lines().filter_map(|l| l.strip_prefix(":KUBE-SVC-").map(|_| &l[1..l.find(' ').unwrap_or(l.len())])).collect()
}

#[test]
fn full_sync_first_then_a_change_rewrites_only_its_services_chains() {
    run_paused(|| async {
        let h = start_iptables(&[]);
        h.send(two_services()).await;
        sleep(MS).await;
        h.send(vec![web_slice("web", &["10.244.1.1", "10.244.1.3"])]).await;
        sleep(MS).await;
        let r = h.restores();
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(service_chains(&r[0]).len(), 2, "both services in the full sync:\n{}", r[0]);
        assert!(r[0].contains(":KUBE-PROXY-CANARY"), "the full sync declares the canary");
        assert_eq!(service_chains(&r[1]).len(), 1, "only web's chain:\n{}", r[1]);
        assert!(r[1].contains("10.244.1.3") && !r[1].contains("-j DNAT --to-destination 10.244.1.2:8080"));
        assert!(!r[1].contains(":KUBE-PROXY-CANARY"), "partial syncs leave the canary alone");
        let full: Vec<bool> = h.syncs().await.iter().map(|s| s.full).collect();
        assert_eq!(full, vec![true, false]);
    });
}

#[test]
fn a_failed_restore_defers_conntrack_and_makes_the_next_sync_full() {
    run_paused(|| async {
        let h = start_iptables(&[]);
        let mut first = synced();
        first.extend([
            applied_service(dns_service()),
            dns_slice(&["10.244.1.5", "10.244.2.5"]),
            web_svc("web", "10.96.0.20"),
        ]);
        h.send(first).await;
        sleep(MS).await;
        let flow = udp_flow(40001, "10.96.0.10:53", "10.244.1.5:53");
        h.conntrack.insert(flow);
        h.journal.clear();
        h.journal.fail("iptables-restore", 1);
        h.send(vec![dns_slice(&["10.244.2.5"])]).await;
        sleep(10 * MS).await;
        assert!(h.journal.pos("conntrack").is_none(), "no reconcile after a failed restore: {:?}", h.journal.lines());
        sleep(Duration::from_secs(2)).await;
        let restore = h.journal.lines().iter().rposition(|l| l.starts_with("iptables-restore")).expect("retried");
        let flush = h.journal.pos(&deletion(&flow)).expect("deleted after the retry");
        assert!(restore < flush, "{:?}", h.journal.lines());
        let syncs = h.syncs().await;
        assert!(syncs[1].failed > 0 && !syncs[1].full);
        assert!(syncs[2].full && syncs[2].failed == 0, "the retry is a full sync: {syncs:?}");
        let last = h.restores().pop().unwrap();
        assert!(last.contains(":KUBE-PROXY-CANARY") && last.contains("has no endpoints"), "a full sync:\n{last}");
        assert_eq!(last.matches("\n-X KUBE-SEP-").count(), 1, "the removed endpoint's chain, still stale:\n{last}");
    });
}

#[test]
fn the_sync_period_writes_no_restore_on_a_quiet_cluster_and_the_hour_brings_a_full_one() {
    run_paused(|| async {
        let h = start_iptables(&[]);
        h.send(two_services()).await;
        sleep(Duration::from_secs(95)).await;
        assert_eq!(h.restores().len(), 1, "only the first, full, restore");
        let syncs = h.syncs().await;
        assert_eq!(syncs.iter().map(|s| s.periodic).collect::<Vec<_>>(), vec![false, true, true, true]);
        assert!(syncs.iter().skip(1).all(|s| !s.full && s.ops == 0));
        sleep(crate::schedule::FULL_SYNC_PERIOD).await;
        let r = h.restores();
        assert_eq!(r.len(), 2, "one full restore in the hour");
        assert_eq!(service_chains(&r[1]).len(), 2, "every service's chains:\n{}", r[1]);
        assert!(h.syncs().await.iter().any(|s| s.full && s.generation > 1));
    });
}

#[test]
fn large_cluster_mode_has_no_hourly_full_sync() {
    run_paused(|| async {
        let h = start_iptables(&[]);
        let mut first = synced();
        for i in 0..11u32 {
            let name = format!("svc-{i}");
            first.push(web_svc(&name, &format!("10.96.1.{i}")));
            let ips: Vec<String> = (0..100u32).map(|j| format!("10.244.{i}.{j}")).collect();
            first.push(web_slice(&name, &ips.iter().map(String::as_str).collect::<Vec<_>>()));
        }
        h.send(first).await;
        sleep(crate::schedule::FULL_SYNC_PERIOD * 2).await;
        assert_eq!(h.restores().len(), 1, "1,100 endpoints: large-cluster mode, no periodic full restore");
        h.send(vec![web_slice("svc-0", &["10.244.0.1"])]).await;
        sleep(MS).await;
        assert_eq!(h.restores().len(), 2, "a change is still written");
    });
}

#[test]
fn chains_found_in_the_kernel_at_start_are_deleted_once() {
    run_paused(|| async {
        let stale = "KUBE-SVC-AAAAAAAAAAAAAAAA".to_string();
        let h = start_iptables(&[stale.clone(), "KUBE-SERVICES".into(), "MY-CHAIN".into()]);
        h.send(two_services()).await;
        sleep(MS).await;
        h.send(vec![web_slice("web", &["10.244.1.9"])]).await;
        sleep(MS).await;
        let r = h.restores();
        assert!(r[0].contains(&format!("-X {stale}")), "{}", r[0]);
        assert!(!r[0].contains("MY-CHAIN"), "a foreign chain is not ours");
        assert!(!r[1].contains(&stale), "gone after the first restore:\n{}", r[1]);
    });
}
