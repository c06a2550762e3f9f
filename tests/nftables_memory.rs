//! The heap an nftables first sync holds, counted exactly by this test
//! binary's allocator (every allocation of the process; the one test here
//! runs alone in it), so the figures do not depend on the machine's load.
//!
//! The planner and the staged sync the daemon runs (upstream's ruleset,
//! 3,000 Services × 10 endpoints, one family), every transaction built
//! and dropped in turn as the nftables actor takes them: what the sync
//! holds at its peak beyond the model is one transaction at a time, not
//! the whole table's rules; what the planner keeps once the sync is
//! confirmed (the held ruleset, the element counts) is each service
//! port's digest and origin, not its objects.

use kube_proxy_rs::bench::gen::{node_ip, Cluster, ClusterSpec, THIS_NODE};
use kube_proxy_rs::config::KubeProxyConfiguration;
use kube_proxy_rs::model::Model;
use kube_proxy_rs::net::IpFamily;
use kube_proxy_rs::plan::context::LocalAddr;
use kube_proxy_rs::plan::iptables::HostFeatures;
use kube_proxy_rs::plan::nftables::{nftables_context, KernelObjects, NftablesPlanner, STAGE_OPS};
use kube_proxy_rs::settings;
use kube_proxy_rs::testkit::counting::{self, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MB: f64 = 1024.0 * 1024.0;

/// 3,000 × 10, upstream's ruleset, 18 transactions: the staged sync of
/// the whole planned table, rules and all (the code before the held
/// ruleset) peaks 26.5 MB above what the planner keeps; rendering each
/// service port's rules again when its chains are written, 6.8 MB (a
/// bounded transaction of 8,192 ops, the last transaction's elements,
/// the order of the chains), 15.2 MB above the model in all. Once the
/// sync is confirmed the planner keeps each service port's digest and
/// origin only: 1.3 MB, where keeping each service port's chain names,
/// sets and elements took 8.4 MB. The bounds sit between: an allocation
/// count does not vary with the machine's load.
#[test]
fn a_staged_first_sync_holds_one_transaction_not_the_whole_tables_rules() {
    let family = IpFamily::V4;
    let spec = ClusterSpec { services: 3000, endpoints_per_service: 10, nodes: 100, seed: 1 };
    let mut model = Model::new(family, THIS_NODE);
    for ev in Cluster::new(spec).expect("cluster").initial_events() {
        model.record(&ev).expect("a generated object");
    }
    model.apply();
    let mut cfg = KubeProxyConfiguration::with_defaults();
    cfg.mode = "nftables".into();
    cfg.cluster_cidr = "10.0.0.0/8".into();
    let derived = settings::derive(&cfg, family, THIS_NODE, HostFeatures::default());
    let addrs = vec![LocalAddr { ifname: "eth0".into(), ip: node_ip(0).into() }];
    let ctx = nftables_context(&derived.nftables_settings(model.node(), model.service_cidrs()), model.node(), &addrs);
    let mut planner = NftablesPlanner::new(ctx.clone());

    let before = counting::mark();
    let staged = planner.full_staged(&model, ctx, &KernelObjects::default(), STAGE_OPS);
    let (mut transactions, mut ops) = (0, 0);
    for tx in staged {
        transactions += 1;
        ops += tx.ops.len();
    }
    planner.confirm_applied(std::time::Duration::ZERO);
    let (peak, kept) = (counting::peak() - before, counting::now() - before);
    let over = peak.saturating_sub(kept);
    eprintln!(
        "{transactions} transactions, {ops} ops: peak {:.1} MB above the model, kept {:.1} MB, the sync's own {:.1} MB",
        peak as f64 / MB,
        kept as f64 / MB,
        over as f64 / MB
    );
    assert!(transactions > 3 && ops > 100_000, "{transactions} transactions, {ops} ops");
    assert!(peak < 24 * 1024 * 1024, "the sync held {:.1} MB above the model at its peak", peak as f64 / MB);
    assert!(kept < 3 * 1024 * 1024, "the planner keeps {:.1} MB of the confirmed sync", kept as f64 / MB);
}
