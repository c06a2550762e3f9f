//! The coordinator driving nftables mode's dataplane: the planner, the
//! nftables actor (a kernel actor over [`MemNftables`]) and conntrack. A
//! full sync, then partial syncs of what changed; a refused transaction
//! makes the next sync full; stale chains go a second after the sync that
//! flushed them; the syncPeriod's check finds a deleted table. Each ends
//! with the in-memory table equal to what a fresh full sync of the same
//! objects leaves.

use super::*;
use crate::actors::wiring::start_nftables_actors;
use crate::kernel::mem::MemTable;
use crate::model::Model;
use crate::msgs::nftables::{KeyType, NftOp, SetSpec, TABLE};
use crate::plan::local::LocalDetector;
use crate::plan::nftables::{desired, nftables_context, NftRuleset, NftablesSettings};

const V4: IpFamily = IpFamily::V4;

/// node-a's one address.
fn node_addrs() -> Vec<LocalAddr> {
    vec![LocalAddr { ifname: "eth0".into(), ip: "192.168.50.2".parse().expect("node IP") }]
}

/// The context a daemon on node-a builds: pods in 10.244.0.0/16,
/// NodePorts on every address, the model's ServiceCIDRs.
fn node_a_context() -> NftContextBuilder {
    Box::new(|node, cidrs, addrs| {
        let settings = NftablesSettings {
            family: V4,
            ruleset: NftRuleset::Upstream,
            node_name: "node-a".into(),
            masquerade_all: false,
            masquerade_bit: 14,
            local: LocalDetector::Cidr("10.244.0.0/16".parse().expect("pod CIDR")),
            node_ports: NodePortFilter::All,
            service_cidrs: cidrs.to_vec(),
        };
        nftables_context(&settings, node, addrs)
    })
}

pub(super) struct Nft {
    pub(super) coord: Addr<Coordinator<NftablesDataplane>>,
    pub(super) kernel: MemNftables,
    t0: Instant,
}

/// nftables mode on `node` over `kernel`, the planner's context built by `context`.
pub(super) fn start_nftables(node: &str, kernel: &MemNftables, context: NftContextBuilder) -> Nft {
    let mut settings = unlimited_settings();
    settings.plan.node_name = node.into();
    let addrs: AddrSource = Box::new(node_addrs);
    let nft = kernel.clone();
    let coord = Coordinator::create(|ctx| {
        let conntrack = MemConntrack::new(&nft.journal);
        let targets = start_nftables_actors(nft, V4, conntrack, &StatsRegistry::default(), ctx.address().recipient());
        Coordinator::with_dataplane(settings, NftablesDataplane::new(V4, targets, addrs, context))
    });
    Nft { coord, kernel: kernel.clone(), t0: Instant::now() }
}

impl Nft {
    pub(super) async fn send(&self, events: Vec<SourceEvent>) {
        self.coord.send(SourceBatch(events)).await.expect("coordinator alive");
    }

    /// The table's objects (its handle left out: a table deleted and
    /// written again has another).
    pub(super) fn table(&self) -> MemTable {
        MemTable { handle: 0, ..self.kernel.table(V4, TABLE).expect("the table") }
    }

    async fn syncs(&self) -> Vec<SyncRecord> {
        self.coord.send(GetSyncHistory).await.expect("coordinator alive")
    }

    /// Offsets from t0 of the journal lines containing `needle`.
    fn at(&self, needle: &str) -> Vec<Duration> {
        self.kernel.journal.timed().iter().filter(|(_, l)| l.contains(needle)).map(|(t, _)| *t - self.t0).collect()
    }

    fn lines(&self) -> Vec<String> {
        self.kernel.journal.lines()
    }
}

/// The table a full sync of `events` from an empty kernel leaves.
fn fresh(events: &[SourceEvent]) -> MemTable {
    let mut model = Model::new(V4, "node-a");
    for e in events {
        model.record(e).expect("a test object");
    }
    model.apply();
    let ctx = node_a_context()(model.node(), model.service_cidrs(), &node_addrs());
    let tx = desired(&model, &ctx).dump_transaction();
    let kernel = MemNftables::default();
    kernel.apply(V4, TABLE, &tx.ops).unwrap_or_else(|e| panic!("{e}"));
    MemTable { handle: 0, ..kernel.table(V4, TABLE).expect("the table") }
}

/// nftables mode on node-a that has synced [`two_services`], 1 ms ago, and those events.
async fn with_two_services() -> (Nft, Vec<SourceEvent>) {
    let h = start_nftables("node-a", &MemNftables::default(), node_a_context());
    let events = two_services();
    h.send(events.clone()).await;
    sleep(MS).await;
    (h, events)
}

/// `name`'s chains (per-service chains hold `default/<name>/`).
fn chains_of<'a>(t: &'a MemTable, name: &str) -> Vec<&'a String> {
    t.chains.keys().filter(|c| c.contains(&format!("default/{name}/"))).collect()
}

#[test]
fn a_full_sync_then_a_partial_one_writing_the_changed_service_only() {
    run_paused(|| async {
        let (h, mut events) = with_two_services().await;
        assert_eq!(h.table(), fresh(&events));
        assert_eq!(chains_of(&h.table(), "web").len(), 2, "service and endpoint chain");
        h.kernel.journal.clear();
        let change = web_slice("web", &["10.244.1.1", "10.244.1.3"]);
        h.send(vec![change.clone()]).await;
        sleep(MS).await;
        events.push(change);
        assert_eq!(h.table(), fresh(&events));
        let lines = h.lines();
        assert!(lines.iter().any(|l| l.starts_with("nft ip add chain endpoint-") && l.contains("10.244.1.3")));
        assert!(lines.iter().all(|l| !l.contains("default/api/")), "api's chains are not written: {lines:?}");
        let syncs = h.syncs().await;
        assert_eq!(syncs.iter().map(|s| s.full).collect::<Vec<_>>(), [true, false]);
        assert!(syncs[1].ops < 20, "a few ops: {:?}", syncs[1]);
    });
}

#[test]
fn a_refused_transaction_changes_nothing_and_the_next_sync_is_full() {
    run_paused(|| async {
        let (h, mut events) = with_two_services().await;
        let before = h.table();
        h.kernel.journal.fail("add chain endpoint-", 1);
        let change = web_slice("web", &["10.244.1.1", "10.244.1.3"]);
        h.send(vec![change.clone()]).await;
        sleep(10 * MS).await;
        assert_eq!(h.table(), before, "nothing of the refused transaction");
        assert_eq!(h.at("FAILED nft ip add chain endpoint-").len(), 1);
        sleep(Duration::from_secs(2)).await;
        let syncs = h.syncs().await;
        assert!(!syncs[1].full && syncs[1].failed > 0, "{syncs:?}");
        assert!(syncs[2].full && syncs[2].failed == 0, "the retry is a full sync: {syncs:?}");
        events.push(change);
        assert_eq!(h.table(), fresh(&events));
    });
}

#[test]
fn stale_chains_are_flushed_at_once_and_deleted_a_second_later() {
    run_paused(|| async {
        let (h, mut events) = with_two_services().await;
        let change = web_slice("web", &["10.244.1.3"]);
        h.send(vec![change.clone()]).await;
        sleep(MS).await;
        let old = chains_of(&h.table(), "web").into_iter().find(|c| c.contains("10.244.1.1")).cloned();
        let old = old.expect("the old endpoint chain is still there");
        assert!(h.table().chains[&old].rules.is_empty(), "flushed");
        sleep(Duration::from_secs(2)).await;
        let (flushed, deleted) = (h.at(&format!("flush chain {old}")), h.at(&format!("delete chain {old}")));
        assert_eq!(flushed.len(), 1, "{:?}", h.lines());
        assert_eq!(deleted, [flushed[0] + crate::plan::nftables::STALE_CHAIN_DELAY], "a second later");
        events.push(change);
        assert_eq!(h.table(), fresh(&events));
    });
}

/// Our table deleted by another writer while a stale chain waits for its
/// deletion: the syncPeriod's check finds the table gone and a full sync
/// writes it back; the stale chain went with the table, and the cleanup
/// does not delete it again (that transaction would be refused whole).
#[test]
fn stale_chains_the_deleted_table_took_are_not_deleted_again() {
    run_paused(|| async {
        let (h, mut events) = with_two_services().await;
        sleep(Duration::from_secs(29)).await;
        let change = web_slice("web", &["10.244.1.3"]);
        h.send(vec![change.clone()]).await;
        sleep(MS).await;
        let old = chains_of(&h.table(), "web").into_iter().find(|c| c.contains("10.244.1.1")).cloned();
        let old = old.expect("the old endpoint chain, flushed and waiting");
        h.kernel.tamper(|tables| {
            tables.remove(&(V4, TABLE.to_string()));
        });
        sleep(Duration::from_secs(3)).await;
        let syncs = h.syncs().await;
        assert!(syncs.iter().any(|s| s.periodic && s.full), "the check found the table gone: {syncs:?}");
        assert!(syncs.iter().all(|s| s.failed == 0), "{syncs:?}");
        assert!(h.at(&format!("delete chain {old}")).is_empty(), "{:?}", h.lines());
        events.push(change);
        assert_eq!(h.table(), fresh(&events));
    });
}

/// A table an earlier run left: its chains nobody uses are flushed by the
/// first (full) sync and deleted a second later, its unused affinity sets
/// deleted at once; nothing else of it is lost on the way.
#[test]
fn a_table_an_earlier_run_left_is_adopted_and_its_leftovers_go() {
    run_paused(|| async {
        let kernel = MemNftables::default();
        let leftover = "service-OLD00000-default/gone/tcp/http";
        let affinity = "affinity-OLD00000-default/gone/tcp/http__10.244.9.9/80";
        let earlier = [
            NftOp::add_table(),
            NftOp::AddChain { name: leftover.into(), base: None, comment: None },
            NftOp::AddSet(SetSpec::set(affinity, vec![KeyType::Ipv4Addr], None)),
        ];
        kernel.apply(V4, TABLE, &earlier).expect("the earlier run's table");
        let h = start_nftables("node-a", &kernel, node_a_context());
        let events = two_services();
        h.send(events.clone()).await;
        sleep(MS).await;
        assert!(h.table().chains[leftover].rules.is_empty() && !h.table().sets.contains_key(affinity));
        sleep(Duration::from_secs(2)).await;
        assert_eq!(h.at(&format!("delete chain {leftover}")).len(), 1);
        assert_eq!(h.table(), fresh(&events));
    });
}

/// The syncPeriod's sync of a quiet cluster sends no transaction and lists
/// nothing; a table deleted behind our back is found by its check and
/// written back by a full sync.
#[test]
fn the_sync_period_checks_for_drift_and_writes_a_deleted_table_back() {
    run_paused(|| async {
        let (h, events) = with_two_services().await;
        let listings = || h.kernel.listings.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(listings(), 1, "the first full sync's");
        h.kernel.journal.clear();
        sleep(Duration::from_secs(65)).await;
        assert!(h.lines().is_empty(), "nothing written: {:?}", h.lines());
        assert_eq!(listings(), 1, "and nothing listed");
        let syncs = h.syncs().await;
        assert_eq!(syncs.iter().map(|s| s.periodic).collect::<Vec<_>>(), [false, true, true]);
        h.kernel.tamper(|tables| {
            tables.remove(&(V4, TABLE.to_string()));
        });
        sleep(Duration::from_secs(30)).await;
        assert_eq!(listings(), 2, "drift: a listing, then a full sync");
        assert!(h.syncs().await.last().is_some_and(|s| s.full && s.failed == 0));
        assert_eq!(h.table(), fresh(&events));
    });
}
