//! The `maps` ruleset's planning: an endpoint change is elements only, a
//! count above those a full sync writes brings its chain (one rule reading
//! the endpoints map) and stays, and in both
//! rulesets partial syncs (and a switch between them) leave the kernel as a
//! full sync of the same model leaves a fresh one.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use super::tests::{cluster_ip, cluster_ips, deleted, eps, fake_ctx, model_with, no_node, port, svc};
use super::*;
use crate::fixtures::{ep, Ep};
use crate::kernel::mem::{MemNftables, MemTable};
use crate::model::Model;
use crate::msgs::nftables::{Rule, TABLE};
use crate::msgs::SourceEvent;

fn maps_ctx() -> NftablesContext {
    NftablesContext { ruleset: NftRuleset::Maps, ..fake_ctx() }
}

fn ops_of_kind(tx: &Transaction) -> Vec<&'static str> {
    let mut kinds: Vec<&'static str> = tx
        .ops
        .iter()
        .map(|op| match op {
            NftOp::AddElements { .. } => "add element",
            NftOp::DeleteElements { .. } => "delete element",
            NftOp::AddRule { .. } => "add rule",
            NftOp::AddChain { .. } | NftOp::FlushChain(_) | NftOp::DeleteChain(_) => "chain",
            _ => "other",
        })
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

/// How many rules `tx` adds that read an endpoints map (each costs the
/// kernel a walk of the map's elements).
fn map_readers(tx: &Transaction) -> usize {
    let reads_map = |r: &Rule| r.sets().any(maps_names::is_maps_map);
    tx.ops.iter().filter(|op| matches!(op, NftOp::AddRule { rule, .. } if reads_map(rule))).count()
}

/// What a full sync of `model` writes with the shared objects of the
/// classes `p`'s kernel holds (which serve every class in use).
fn kept_desired(model: &Model, p: &NftablesPlanner) -> Ruleset {
    let kept: BTreeSet<_> = p.applied().expect("a confirmed sync").shared.classes.iter().copied().collect();
    let mut rs = desired(model, p.context());
    assert!(maps::classes(rs.services.values()).is_subset(&kept), "{kept:?}");
    rs.shared = shared(p.context(), &kept);
    rs
}

/// A partial sync of `event`, confirmed.
fn sync(p: &mut NftablesPlanner, model: &mut Model, event: &SourceEvent) -> Transaction {
    model.record(event).unwrap();
    let changed = model.apply().ports;
    let d = p.partial(model, &changed).unwrap();
    p.confirm_applied(Duration::ZERO);
    d.tx
}

/// One endpoint added to a Service among 2,000, or replaced: element deletes
/// and adds only (no chain, no rule), a few of them, also when the count is
/// one no Service had below the power of two above the largest (its chain
/// is there since the full sync); a count above that brings one rule that
/// reads the endpoints map, once.
#[test]
fn an_endpoint_change_is_elements_only() {
    let mut model = cluster_ips(2000, 2);
    let mut p = NftablesPlanner::new(maps_ctx());
    p.full(&model, maps_ctx(), &KernelObjects::default());
    p.confirm_applied(Duration::ZERO);
    // svc<i>'s first `n` endpoints.
    let first = |svc: &str, n: usize| {
        let ips: Vec<String> = (1..=n).map(|a| format!("10.{a}.0.{}", &svc[3..])).collect();
        eps("ns", svc, 80, &ips.iter().map(|ip| no_node(ip)).collect::<Vec<Ep>>())
    };
    // Added: a count no Service has, below 4.
    let tx = sync(&mut p, &mut model, &first("svc8", 3));
    assert_eq!(ops_of_kind(&tx), ["add element", "delete element"], "{tx}");
    // Replaced: the same count, one slot's endpoint and the hairpin pair.
    let tx = sync(&mut p, &mut model, &eps("ns", "svc7", 80, &[no_node("10.1.0.7"), no_node("10.9.9.9")]));
    assert_eq!(ops_of_kind(&tx), ["add element", "delete element"], "{tx}");
    assert_eq!(tx.len(), 4, "{tx}");
    // A count above 4: its chain, one rule reading the map.
    let tx = sync(&mut p, &mut model, &first("svc9", 5));
    assert!(ops_of_kind(&tx).contains(&"chain"), "a count above the precreated ones: its chain\n{tx}");
    assert_eq!(map_readers(&tx), 1, "{tx}");
    // The same count again, and a Service leaving it: elements only.
    for (svc, n) in [("svc10", 5), ("svc9", 2)] {
        let tx = sync(&mut p, &mut model, &first(svc, n));
        assert_eq!(ops_of_kind(&tx), ["add element", "delete element"], "{svc} to {n}\n{tx}");
    }
    assert_eq!(p.applied(), Some(&kept_desired(&model, &p)));
}

/// A count above the precreated ones adds its set and chain and rewrites
/// the pick chain (rules reading plain sets) and nothing else of the shared
/// objects; its last Service leaving writes no shared object; the next full
/// sync removes it (the set at once, the chain flushed and left stale).
#[test]
fn a_new_count_stays_until_a_full_sync() {
    let mut model = model_with(&[cluster_ip("ns", "a", "172.30.0.1", 80), eps("ns", "a", 80, &[no_node("10.1.0.1")])]);
    let mut p = NftablesPlanner::new(maps_ctx());
    p.full(&model, maps_ctx(), &KernelObjects::default());
    p.confirm_applied(Duration::ZERO);
    let three = [no_node("10.1.0.1"), no_node("10.1.0.2"), no_node("10.1.0.3")];
    let tx = sync(&mut p, &mut model, &eps("ns", "a", 80, &three));
    let text = tx.to_string();
    let at = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s:?} in\n{text}"));
    assert!(at("add set ip kube-proxy maps-cluster-3 ") < at("add rule ip kube-proxy maps-cluster-pick "), "{text}");
    assert!(at("add rule ip kube-proxy maps-cluster-pick-3 ") > at("add chain ip kube-proxy maps-cluster-pick-3"));
    for written in ["chain ip kube-proxy maps-cluster-pick-", "rule ip kube-proxy maps-cluster-pick-"] {
        assert!(!text.contains(&format!("{written}1")) && !text.contains(&format!("{written}2")), "{text}");
    }
    assert_eq!(map_readers(&tx), 1, "{text}");
    let tx = sync(&mut p, &mut model, &eps("ns", "a", 80, &three[..1]));
    assert_eq!(ops_of_kind(&tx), ["add element", "delete element"], "{tx}");
    let applied = p.applied().expect("confirmed");
    let listed = KernelObjects {
        chains: applied.chains().map(|c| c.name.clone()).collect(),
        sets: applied.sets().map(|s| s.name.clone()).collect(),
    };
    let d = p.full(&model, maps_ctx(), &listed);
    let text = d.tx.to_string();
    assert!(text.contains("delete set ip kube-proxy maps-cluster-3\n"), "{text}");
    assert_eq!(d.stale_chains, ["maps-cluster-pick-3"]);
}

/// The events of the changes [`partial_syncs_and_switches_leave_what_a_full_sync_leaves`] makes.
fn changes() -> Vec<Vec<SourceEvent>> {
    let local = |ip: &str| ep(ip, "test-node");
    let lb = |policy: &str, affinity: bool| {
        let mut spec = json!({"type": "LoadBalancer", "clusterIP": "172.30.0.42", "ports": [port(80, 3001)],
                              "externalIPs": ["192.168.99.22"], "externalTrafficPolicy": policy});
        if affinity {
            spec["sessionAffinity"] = json!("ClientIP");
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 300}});
        }
        svc("ns", "lb", spec, json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}))
    };
    let local_only = json!({"type": "ClusterIP", "clusterIP": "172.30.0.43", "ports": [port(80, 0)],
                            "internalTrafficPolicy": "Local"});
    let some: [Ep; 3] = [no_node("10.1.0.1"), local("10.1.0.2"), no_node("10.1.0.3")];
    vec![
        vec![cluster_ip("ns", "a", "172.30.0.41", 80), eps("ns", "a", 80, &some[..2])],
        vec![eps("ns", "a", 80, &some)],
        vec![lb("Cluster", false), eps("ns", "lb", 80, &some[1..])],
        vec![lb("Local", true)],
        vec![eps("ns", "lb", 80, &some[..1])],
        vec![svc("ns", "local", local_only, json!({})), eps("ns", "local", 80, &some)],
        vec![eps("ns", "a", 80, &some[2..])],
        vec![lb("Local", false), eps("ns", "lb", 80, &some)],
        vec![deleted("ns", "a")],
        vec![eps("ns", "local", 80, &[])],
    ]
}

/// What a fresh kernel holds after a full sync of `model` in `ctx`.
fn fresh(model: &Model, ctx: &NftablesContext) -> MemTable {
    fresh_of(&desired(model, ctx))
}

/// What a fresh kernel holds after a full sync writing `rs`.
fn fresh_of(rs: &Ruleset) -> MemTable {
    let k = MemNftables::default();
    let d = full_sync(rs, &KernelObjects::default(), true);
    k.apply(rs.family, TABLE, &d.tx.ops).expect("a full sync of a fresh kernel");
    k.table(rs.family, TABLE).expect("the table")
}

/// Applies `tx` to `k`, and a second later what it left stale.
fn apply(k: &MemNftables, p: &mut NftablesPlanner, tx: &Transaction, at: &mut Duration) {
    k.apply(tx.family, TABLE, &tx.ops).unwrap_or_else(|e| panic!("{e}\n{tx}"));
    p.confirm_applied(*at);
    *at += STALE_CHAIN_DELAY;
    if let Some(del) = p.delete_due(*at) {
        k.apply(del.family, TABLE, &del.ops).unwrap_or_else(|e| panic!("{e}\n{del}"));
    }
}

/// In each ruleset, every partial sync of a run of changes (counts
/// appearing and going, policies and affinity turned on and off, Services
/// deleted) leaves the kernel as a full sync of the same model leaves a
/// fresh one; and a full sync of either ruleset over a table the other
/// wrote does too.
#[test]
fn partial_syncs_and_switches_leave_what_a_full_sync_leaves() {
    for ruleset in NftRuleset::ALL {
        let ctx = NftablesContext { ruleset, ..fake_ctx() };
        let other =
            NftablesContext { ruleset: NftRuleset::ALL.into_iter().find(|r| *r != ruleset).unwrap(), ..fake_ctx() };
        let (k, mut at) = (MemNftables::default(), Duration::ZERO);
        let mut model = model_with(&[]);
        let mut p = NftablesPlanner::new(ctx.clone());
        let d = p.full(&model, ctx.clone(), &KernelObjects::default());
        apply(&k, &mut p, &d.tx, &mut at);
        for (i, events) in changes().iter().enumerate() {
            events.iter().for_each(|e| model.record(e).expect("an event"));
            let changed = model.apply().ports;
            let d = p.partial(&model, &changed).expect("a partial sync");
            apply(&k, &mut p, &d.tx, &mut at);
            let kept = kept_desired(&model, &p);
            assert_eq!(k.table(ctx.family, TABLE), Some(fresh_of(&kept)), "{ruleset} after change {i}");
        }
        // The other ruleset writes over this one, then this one over it.
        for (c, over) in [(&other, ruleset), (&ctx, other.ruleset)] {
            let t = k.table(c.family, TABLE).expect("the table");
            let listed =
                KernelObjects { chains: t.chains.keys().cloned().collect(), sets: t.sets.keys().cloned().collect() };
            let mut p = NftablesPlanner::new(c.clone());
            let d = p.full(&model, c.clone(), &listed);
            apply(&k, &mut p, &d.tx, &mut at);
            assert_eq!(k.table(c.family, TABLE), Some(fresh(&model, c)), "{} over {over}", c.ruleset);
        }
    }
}
