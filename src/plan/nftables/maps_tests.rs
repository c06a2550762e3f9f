//! The `maps` ruleset's planning: an endpoint change is elements only, a
//! count no Service had brings the shared pick chains, and in both
//! rulesets partial syncs (and a switch between them) leave the kernel as a
//! full sync of the same model leaves a fresh one.

use std::time::Duration;

use serde_json::json;

use super::tests::{cluster_ip, cluster_ips, deleted, eps, fake_ctx, model_with, no_node, port, svc};
use super::*;
use crate::fixtures::{ep, Ep};
use crate::kernel::mem::{MemNftables, MemTable};
use crate::model::Model;
use crate::msgs::nftables::TABLE;
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

/// One endpoint added to a Service among 2,000, or replaced: element deletes
/// and adds only (no chain, no rule), a few of them, and the planner's
/// state is the model's.
#[test]
fn an_endpoint_change_is_elements_only() {
    let mut model = cluster_ips(2000, 2);
    let mut p = NftablesPlanner::new(maps_ctx());
    p.full(&model, maps_ctx(), &KernelObjects::default());
    p.confirm_applied(Duration::ZERO);
    // Replaced: the same count, one slot's endpoint and the hairpin pair.
    model.record(&eps("ns", "svc7", 80, &[no_node("10.1.0.7"), no_node("10.9.9.9")])).unwrap();
    let changed = model.apply().ports;
    let d = p.partial(&model, &changed).unwrap();
    assert_eq!(ops_of_kind(&d.tx), ["add element", "delete element"], "{}", d.tx);
    assert_eq!(d.tx.len(), 4, "{}", d.tx);
    p.confirm_applied(Duration::ZERO);
    // Added: a count another Service has (svc8 goes to 3 first).
    model.record(&eps("ns", "svc8", 80, &[no_node("10.1.0.8"), no_node("10.2.0.8"), no_node("10.3.0.8")])).unwrap();
    let changed = model.apply().ports;
    let d = p.partial(&model, &changed).unwrap();
    assert!(ops_of_kind(&d.tx).contains(&"chain"), "a count no Service had: the pick chain\n{}", d.tx);
    p.confirm_applied(Duration::ZERO);
    model.record(&eps("ns", "svc9", 80, &[no_node("10.1.0.9"), no_node("10.2.0.9"), no_node("10.3.0.9")])).unwrap();
    let changed = model.apply().ports;
    let d = p.partial(&model, &changed).unwrap();
    assert_eq!(ops_of_kind(&d.tx), ["add element", "delete element"], "{}", d.tx);
    p.confirm_applied(Duration::ZERO);
    assert_eq!(p.applied(), Some(&desired(&model, &maps_ctx())));
}

/// A count that appears rewrites the pick chain and adds the count's set;
/// the last Service with a count going deletes it, after the chain no
/// longer names it.
#[test]
fn a_count_comes_with_its_first_service_and_goes_with_its_last() {
    let mut model = model_with(&[cluster_ip("ns", "a", "172.30.0.1", 80), eps("ns", "a", 80, &[no_node("10.1.0.1")])]);
    let mut p = NftablesPlanner::new(maps_ctx());
    p.full(&model, maps_ctx(), &KernelObjects::default());
    p.confirm_applied(Duration::ZERO);
    model.record(&eps("ns", "a", 80, &[no_node("10.1.0.1"), no_node("10.1.0.2")])).unwrap();
    let changed = model.apply().ports;
    let text = p.partial(&model, &changed).unwrap().tx.to_string();
    let at = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s:?} in\n{text}"));
    assert!(at("add set ip kube-proxy maps-cluster-2 ") < at("add rule ip kube-proxy maps-cluster-pick"), "{text}");
    assert!(at("add rule ip kube-proxy maps-cluster-pick") < at("delete set ip kube-proxy maps-cluster-1\n"), "{text}");
    assert!(at("delete element ip kube-proxy maps-cluster-1 ") < at("delete set ip kube-proxy maps-cluster-1\n"));
    assert!(!text.contains("maps-cluster-pick ip daddr . meta l4proto . th dport @maps-cluster-1 "), "{text}");
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
    let k = MemNftables::default();
    let mut p = NftablesPlanner::new(ctx.clone());
    let d = p.full(model, ctx.clone(), &KernelObjects::default());
    k.apply(ctx.family, TABLE, &d.tx.ops).expect("a full sync of a fresh kernel");
    k.table(ctx.family, TABLE).expect("the table")
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
            assert_eq!(k.table(ctx.family, TABLE), Some(fresh(&model, &ctx)), "{ruleset} after change {i}");
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
