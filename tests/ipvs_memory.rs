//! The heap IPVS mode's planner keeps once a dual-stack first sync is
//! planned, counted exactly by this test binary's allocator (every
//! allocation of the process; the one test here runs alone in it), so the
//! figure does not depend on the machine's load.
//!
//! 10,000 Services × 10 endpoints, every second Service dual-stack (as
//! `kpr-bench daemon --dual-every 2`), one planner per family as the
//! daemon runs them, each replanned for its full first sync.

use kube_proxy_rs::bench::dual::{dual_stack_every, v6_of};
use kube_proxy_rs::bench::gen::{node_ip, Cluster, ClusterSpec, THIS_NODE};
use kube_proxy_rs::config::KubeProxyConfiguration;
use kube_proxy_rs::model::Model;
use kube_proxy_rs::net::{IpFamily, LocalAddr};
use kube_proxy_rs::plan::iptables::HostFeatures;
use kube_proxy_rs::plan::ipvs::IpvsPlanner;
use kube_proxy_rs::settings;
use kube_proxy_rs::testkit::counting::{self, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MB: f64 = 1024.0 * 1024.0;

/// What the two families' planners keep after planning their full first
/// syncs at 10,000 × 10 with every second Service dual-stack (≈ 14,900 +
/// 7,500 virtual servers, 145,000 + 73,000 real servers): 8.9 MB, where
/// keeping every real server with its claimant took 16.2 MB.
#[test]
fn the_ipvs_planners_keep_little_beside_the_model_after_a_dual_stack_first_sync() {
    let spec = ClusterSpec { services: 10_000, endpoints_per_service: 10, nodes: 100, seed: 1 };
    let events = dual_stack_every(&Cluster::new(spec).expect("cluster").initial_events(), 2);
    let mut cfg = KubeProxyConfiguration::with_defaults();
    cfg.mode = "ipvs".into();
    cfg.cluster_cidr = "10.0.0.0/8,fd00::/16".into();
    let (mut models, mut planners) = (Vec::new(), Vec::new());
    let mut kept = 0;
    let mut counts = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        let mut model = Model::new(family, THIS_NODE);
        for ev in &events {
            model.record(ev).expect("a generated object");
        }
        model.apply();
        let derived = settings::derive(&cfg, family, THIS_NODE, HostFeatures::default());
        let ip = match family {
            IpFamily::V4 => node_ip(0).into(),
            IpFamily::V6 => v6_of(node_ip(0)).into(),
        };
        let addrs = vec![LocalAddr { ifname: "eth0".into(), ip }];
        let ctx = derived.ipvs_context(model.node(), &addrs);
        let before = counting::now();
        let mut planner = IpvsPlanner::new(ctx.clone());
        planner.replan_for_full_sync(&model, ctx);
        kept += counting::now() - before;
        counts.push(planner.sizes());
        models.push(model);
        planners.push(planner);
    }
    eprintln!("planned (virtual servers, real servers, set entries, addresses) per family: {counts:?}");
    eprintln!("the planners keep {:.1} MB", kept as f64 / MB);
    let (v4, v6) = (counts[0], counts[1]);
    assert!(v4.0 > 10_000 && v4.1 > 100_000 && v6.0 > 5_000 && v6.1 > 50_000, "{counts:?}");
    // The full sync's desired state still lists every real server.
    for (planner, (services, dests, ..)) in planners.iter().zip(&counts) {
        assert_eq!(planner.desired().ipvs.len(), services + dests);
    }
    assert!(kept < 11 * 1024 * 1024, "the planners keep {:.1} MB", kept as f64 / MB);
}
