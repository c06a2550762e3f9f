//! The nftables planner's state between syncs and the transactions it
//! plans: stale chains deleted a second later, a full sync after a failure,
//! partial syncs costing what changed, elements shared by service ports,
//! a full sync staged, a ServiceCIDR change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::json;

use super::tests::{cluster_ips, deleted, eps, fake_ctx, held, model_with, no_node, port, repeated_events, step, svc};
use super::*;
use crate::model::{NamespacedName, ServicePortName};
use crate::net::Protocol;

/// The planner's state: partial syncs only over a confirmed state, stale
/// chains deleted a second after the sync that flushed them (not if used
/// again), a failure forcing a full sync.
#[test]
fn the_planner_deletes_stale_chains_a_second_later_and_goes_full_after_a_failure() {
    let s = |secs: u64| std::time::Duration::from_secs(secs);
    let mut model = model_with(&repeated_events());
    let mut p = NftablesPlanner::new(fake_ctx());
    assert!(p.needs_full() && p.partial(&model, []).is_none());
    let d = p.full(&model, fake_ctx(), &KernelObjects::default());
    assert!(d
        .tx
        .to_string()
        .contains("add chain ip kube-proxy nat-prerouting\ndelete chain ip kube-proxy nat-prerouting\n"));
    p.confirm_applied(s(0));
    assert_eq!(p.applied(), Some(&held(desired(&model, &fake_ctx()))));

    // svc1's endpoint moves: its old endpoint chain is stale.
    model.record(&eps("ns1", "svc1", 80, &[no_node("10.0.1.2")])).unwrap();
    let changed = model.apply().ports;
    let d = p.partial(&model, &changed).unwrap();
    assert_eq!(d.stale_chains, ["endpoint-5TPGNJF2-ns1/svc1/tcp/p80__10.0.1.1/80"]);
    assert!(p.stale_chains().is_empty(), "not before the kernel has it");
    p.confirm_applied(s(10));
    assert_eq!(p.stale_chains(), d.stale_chains);
    assert_eq!(p.next_delete_due(), Some(s(11)));
    assert!(p.delete_due(s(10)).is_none(), "not within a second");
    let del = p.delete_due(s(11)).unwrap();
    assert_eq!(del.to_string(), "delete chain ip kube-proxy endpoint-5TPGNJF2-ns1/svc1/tcp/p80__10.0.1.1/80\n");
    assert!(p.stale_chains().is_empty());
    assert_eq!(p.next_delete_due(), None);

    // Flushed, then used again before it is due: not deleted.
    model.record(&eps("ns1", "svc1", 80, &[no_node("10.0.1.1")])).unwrap();
    let changed = model.apply().ports;
    p.partial(&model, &changed).unwrap();
    p.confirm_applied(s(20));
    model.record(&eps("ns1", "svc1", 80, &[no_node("10.0.1.2")])).unwrap();
    let changed = model.apply().ports;
    p.partial(&model, &changed).unwrap();
    p.confirm_applied(s(20));
    assert_eq!(p.stale_chains(), ["endpoint-5TPGNJF2-ns1/svc1/tcp/p80__10.0.1.1/80"]);
    model.record(&eps("ns1", "svc1", 80, &[no_node("10.0.1.1")])).unwrap();
    let changed = model.apply().ports;
    p.partial(&model, &changed).unwrap();
    p.confirm_applied(s(20));
    assert!(p.delete_due(s(30)).is_some_and(|t| !t.to_string().contains("10.0.1.1/80")));

    assert_eq!(p.applied(), Some(&held(desired(&model, &fake_ctx()))), "partial syncs commit what they wrote");

    // A failure: the next sync must be full, and it does not re-create the base chains.
    p.failed();
    assert!(p.needs_full() && p.partial(&model, &changed).is_none());
    let d = p.full(&model, fake_ctx(), &KernelObjects::default());
    assert!(!d.tx.to_string().contains("delete chain"), "{}", d.tx);
}

/// One endpoint change among 2,000 services is a transaction of a few ops
/// (its service's chains), and the planner renders that service only.
#[test]
fn an_endpoint_change_costs_the_same_at_any_cluster_size() {
    let mut model = cluster_ips(2000, 1);
    let mut p = NftablesPlanner::new(fake_ctx());
    let full = p.full(&model, fake_ctx(), &KernelObjects::default());
    assert!(full.tx.len() > 2000 * 10, "{}", full.tx.len());
    p.confirm_applied(std::time::Duration::ZERO);
    model.record(&eps("ns", "svc7", 80, &[no_node("10.9.9.9")])).unwrap();
    let changed = model.apply().ports;
    let d = p.partial(&model, &changed).unwrap();
    // Service chain and new endpoint chain: add, flush, 2 rules each; the old one flushed.
    assert_eq!(d.tx.len(), 9, "{}", d.tx);
    p.confirm_applied(std::time::Duration::ZERO);
    assert_eq!(p.applied(), Some(&held(desired(&model, &fake_ctx()))));
}

/// A ClusterIP is in `cluster-ips` once, for all the ports of its service,
/// and leaves it with the last of them.
#[test]
fn a_cluster_ip_shared_by_ports_stays_until_the_last_port_goes() {
    let two = json!({"type": "ClusterIP", "clusterIP": "172.30.0.41", "ports": [port(80, 0), port(443, 0)]});
    let one = json!({"type": "ClusterIP", "clusterIP": "172.30.0.41", "ports": [port(80, 0)]});
    let mut model = model_with(&[svc("ns1", "svc1", two, json!({}))]);
    let dump = dry_run(&model, &fake_ctx());
    assert_eq!(dump.matches("add element ip kube-proxy cluster-ips { 172.30.0.41 }").count(), 1, "{dump}");
    let mut p = NftablesPlanner::new(fake_ctx());
    let full = p.full(&model, fake_ctx(), &KernelObjects::default()).tx.to_string();
    assert_eq!(full.matches("add element ip kube-proxy cluster-ips { 172.30.0.41 }").count(), 1, "{full}");
    p.confirm_applied(std::time::Duration::ZERO);
    let mut rs = desired(&model, &fake_ctx());

    // One port goes: its no-endpoint element only.
    let d = step(&mut model, &mut rs, &[svc("ns1", "svc1", one, json!({}))]);
    assert_eq!(d.tx.to_string(), "delete element ip kube-proxy no-endpoint-services { 172.30.0.41 . tcp . 443 }\n");
    let changed: Vec<ServicePortName> = rs
        .services
        .keys()
        .cloned()
        .chain([ServicePortName {
            service: NamespacedName::new("ns1", "svc1"),
            port: "p443".into(),
            protocol: Protocol::Tcp,
        }])
        .collect();
    assert_eq!(p.partial(&model, &changed).unwrap().tx, d.tx);
    p.confirm_applied(std::time::Duration::ZERO);

    // The last one goes: the ClusterIP too.
    let d = step(&mut model, &mut rs, &[deleted("ns1", "svc1")]);
    let text = d.tx.to_string();
    assert!(text.contains("delete element ip kube-proxy cluster-ips { 172.30.0.41 }\n"), "{text}");
    assert_eq!(p.partial(&model, &changed).unwrap().tx, d.tx);
}

/// The element counts know an element by its set and key (not its
/// value), count each group holding it, and forget it with the last; a
/// ruleset's counts are those of its groups.
#[test]
fn element_counts_follow_the_groups_holding_each_element() {
    use crate::msgs::nftables::{Element, KeyPart, Verdict};
    let key = |ip: &str| vec![KeyPart::Addr(ip.parse().unwrap())];
    let member = |set: &str, ip: &str| SetElement { set: set.into(), element: Element::key(key(ip)) };
    let to = |set: &str, ip: &str, c: &str| SetElement {
        set: set.into(),
        element: Element::to(key(ip), Verdict::Goto(c.into())),
    };
    let a =
        Objects { elements: vec![member("cluster-ips", "10.0.0.1"), to("m", "10.0.0.1", "x")], ..Objects::default() };
    let b =
        Objects { elements: vec![member("cluster-ips", "10.0.0.1"), to("m", "10.0.0.2", "y")], ..Objects::default() };
    let c = Objects { elements: vec![to("m", "10.0.0.1", "z")], ..Objects::default() };
    let mut refs = ElementRefs::new();
    [&a, &b, &c].into_iter().for_each(|o| refs.add(o));
    let counts = |refs: &ElementRefs| {
        [("cluster-ips", "10.0.0.1"), ("m", "10.0.0.1"), ("m", "10.0.0.2"), ("cluster-ips", "10.0.0.2")]
            .map(|(set, ip)| refs.get(set, &key(ip)))
    };
    assert_eq!((counts(&refs), refs.len()), ([2, 2, 1, 0], 3));
    refs.remove(&a);
    assert_eq!((counts(&refs), refs.len()), ([1, 1, 1, 0], 3));
    refs.remove(&b);
    refs.remove(&b);
    assert_eq!((counts(&refs), refs.len()), ([0, 1, 0, 0], 1));
    refs.remove(&c);
    assert!(refs.is_empty());

    let rs = desired(&model_with(&repeated_events()), &fake_ctx());
    let all = element_refs(&rs);
    let ids: BTreeSet<(&str, &[KeyPart])> = rs.elements().map(|e| (e.set.as_str(), e.element.key.as_slice())).collect();
    assert_eq!(all.len(), ids.len());
    for (set, k) in ids {
        let holding = rs.groups().filter(|g| g.elements.iter().any(|e| e.set == set && e.element.key == k)).count();
        assert_eq!(all.get(set, k), holding, "{set} {k:?}");
    }
}

/// A full sync staged: per-service chains declared first (new ones, in
/// bounded transactions after the sets and top-level chains), then
/// written in bounded transactions, endpoint chains before the chains that
/// jump to them, each chain whole in one transaction (flushed first if the
/// kernel holds it); everything else last. No op is lost.
#[test]
fn a_full_sync_is_staged_leaves_first_in_bounded_transactions() {
    let rs = desired(&model_with(&repeated_events()), &fake_ctx());
    let tx = full_sync(&rs, &KernelObjects::default(), true).tx;
    let service_chain = |w: &str| names::is_service_chain(w) && w.starts_with(|c: char| c.is_ascii_alphabetic());
    let chain_of = |op: &NftOp| match op {
        NftOp::AddRule { chain, .. } | NftOp::FlushChain(chain) => Some(chain.clone()),
        _ => None,
    };
    let all_chains: BTreeSet<String> = tx
        .ops
        .iter()
        .filter_map(|op| match op {
            NftOp::AddChain { name, .. } if service_chain(name) => Some(name.clone()),
            _ => None,
        })
        .collect();
    for existing in [BTreeSet::new(), all_chains.clone()] {
        let kernel = KernelObjects { chains: existing.iter().cloned().collect(), sets: vec![] };
        let steps: Vec<Transaction> =
            Staged::new(Arc::new(rs.clone()), &kernel, true, 3).map(Transaction::expanded).collect();
        assert!(steps.len() > 3, "{}", steps.len());
        let rest = &steps[steps.len() - 1];
        let writes_from = steps.iter().position(|t| t.ops.iter().any(|op| chain_of(op).is_some())).expect("writes");
        let (declares, middle) = (&steps[..writes_from], &steps[writes_from..steps.len() - 1]);
        // The per-service chains are declared after the rest, in transactions of at most 3 ops.
        for t in &declares[1..] {
            assert!(t.len() <= 3, "{t}");
            assert!(t.ops.iter().all(|op| matches!(op, NftOp::AddChain { name, .. } if service_chain(name))), "{t}");
        }
        assert!(!declares[0].ops.iter().any(|op| matches!(op, NftOp::AddChain { name, .. } if service_chain(name))));
        let declared: BTreeSet<String> = declares
            .iter()
            .flat_map(|t| &t.ops)
            .filter_map(|op| match op {
                NftOp::AddChain { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(declares.len() > 1, existing.is_empty(), "new chains only are declared");
        let exists = |c: &str| declared.contains(c) || existing.contains(c);
        // Where each chain's ops are, and that a chain is whole in one transaction.
        let mut at: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        let mut largest: BTreeMap<String, usize> = BTreeMap::new();
        for (i, t) in middle.iter().enumerate() {
            for (j, op) in t.ops.iter().enumerate() {
                let chain = chain_of(op).unwrap_or_else(|| panic!("only flushes and rules: {op:?}"));
                assert!(service_chain(&chain) && exists(&chain), "{chain}");
                let first = *at.entry(chain.clone()).or_insert((i, j));
                assert_eq!(first.0, i, "{chain} split between transactions");
                *largest.entry(chain.clone()).or_default() += 1;
                if matches!(op, NftOp::FlushChain(_)) {
                    assert!(existing.contains(&chain), "only chains the kernel holds are flushed: {chain}");
                }
            }
        }
        // Bounded: a transaction closes once it holds 3 ops, at a chain's end.
        let biggest_chain = largest.values().copied().max().unwrap_or(0);
        assert!(
            middle.iter().all(|t| t.len() <= 3 + biggest_chain),
            "{:?}",
            middle.iter().map(|t| t.len()).collect::<Vec<_>>()
        );
        // Leaves first: a chain a rule jumps to is written before the rule.
        for (i, t) in middle.iter().enumerate() {
            for (j, op) in t.ops.iter().enumerate() {
                let NftOp::AddRule { rule, .. } = op else { continue };
                for target in rule.chains().filter(|c| service_chain(c)) {
                    assert!(at.get(target).is_some_and(|w| *w < (i, j)), "{target} after {rule}");
                }
                if rule.chains().any(|c| c == "mark-for-masquerade") {
                    assert!(exists("mark-for-masquerade"));
                }
            }
        }
        // Nothing of the per-service chains is left for the last transaction, and nothing else is lost.
        assert!(!rest.ops.iter().any(|op| match op {
            NftOp::AddChain { name, .. } => service_chain(name),
            NftOp::AddRule { chain, .. } => service_chain(chain),
            NftOp::FlushChain(c) => all_chains.contains(c),
            _ => false,
        }));
        let sent: Vec<&NftOp> = steps.iter().flat_map(|t| &t.ops).collect();
        for op in &tx.ops {
            let dropped = matches!(op, NftOp::FlushChain(c) if all_chains.contains(c) && !existing.contains(c))
                || matches!(op, NftOp::AddChain { name, .. } if existing.contains(name));
            assert!(dropped || sent.contains(&op), "{op:?} lost");
        }
    }
    // Nothing per-service: the transaction as it was.
    let rs = desired(&model_with(&[]), &fake_ctx());
    let empty = full_sync(&rs, &KernelObjects::default(), false).tx;
    let staged = Staged::new(Arc::new(rs), &KernelObjects::default(), false, 3);
    assert_eq!(staged.map(Transaction::expanded).collect::<Vec<_>>(), vec![empty]);
}

/// The staged sync, built one transaction at a time from the ruleset,
/// sends the ops of the whole full-sync transaction cut after it is built
/// ([`cut_whole`]), the same transactions in the same order: both
/// rulesets, both families, a kernel without the table and one holding
/// every chain and some stale ones, small and large chunks. Its op and
/// transaction counts are those it sends. So does the staged sync of the
/// held ruleset ([`desired_held`]: no service port's rules held, each
/// rendered again from the model when its chains are written), and the
/// planner's.
#[test]
fn a_staged_sync_built_as_it_is_sent_equals_the_whole_transaction_cut() {
    let maps = NftablesContext { ruleset: NftRuleset::Maps, ..fake_ctx() };
    let v6 = NftablesContext { family: crate::net::IpFamily::V6, node_ip: None, ..fake_ctx() };
    let v6_model = super::tests::v6_model(json!({}), &["fd00:10:180::1", "fd00:10:180::2"]);
    for (model, ctx) in
        [(model_with(&repeated_events()), fake_ctx()), (model_with(&repeated_events()), maps), (v6_model, v6)]
    {
        let rs = desired(&model, &ctx);
        let mut listed: Vec<String> = rs.chains().map(|c| c.name.clone()).collect();
        listed.push("service-OLD00000-ns9/gone/tcp/p80".into());
        let sets = vec!["affinity-OLD00000-ns9/gone/tcp/p80__10.9.9.9/80".to_string()];
        for kernel in [KernelObjects::default(), KernelObjects { chains: listed, sets }] {
            for (chunk, recreate) in [(1, true), (3, false), (STAGE_OPS, true)] {
                let whole = full_sync(&rs, &kernel, recreate).tx;
                let want = cut_whole(whole, &kernel.chains.iter().cloned().collect(), chunk);
                let (held_rs, sources) = desired_held(&model, &ctx);
                assert_eq!(held_rs, held(rs.clone()));
                assert!(held_rs.services.values().flat_map(|o| &o.chains).all(|c| c.rules.is_empty()));
                let mut planner = NftablesPlanner::new(ctx.clone());
                if !recreate {
                    planner.full(&model, ctx.clone(), &kernel);
                }
                for staged in [
                    Staged::new(Arc::new(rs.clone()), &kernel, recreate, chunk),
                    Staged::held(Arc::new(held_rs), sources, &kernel, recreate, chunk),
                    planner.full_staged(&model, ctx.clone(), &kernel, chunk),
                ] {
                    assert_eq!(staged.ops(), want.iter().map(|t| t.len()).sum::<usize>());
                    assert_eq!(staged.transactions(), want.len());
                    let got: Vec<Transaction> = staged.map(Transaction::expanded).collect();
                    assert_eq!(got, want, "{:?} chunk {chunk}", ctx.ruleset);
                }
                planner.confirm_applied(std::time::Duration::ZERO);
                assert_eq!(planner.applied(), Some(&held(rs.clone())));
                // The maps ruleset has no per-service chains here (no firewall, no affinity).
                let cut = ctx.ruleset == NftRuleset::Maps || chunk == STAGE_OPS || want.len() > 3;
                assert!(cut, "{} transactions", want.len());
            }
        }
    }
}

/// A full sync's whole transaction cut into the staged transactions after
/// it is built: what [`Staged`] sends, written the direct way as the
/// reference it is checked against.
fn cut_whole(tx: Transaction, existing: &BTreeSet<String>, chunk: usize) -> Vec<Transaction> {
    let base: BTreeSet<String> = tx
        .ops
        .iter()
        .filter_map(|op| match op {
            NftOp::AddChain { name, base: Some(_), .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    let mut declare = vec![NftOp::add_table()];
    let mut new_chains: Vec<NftOp> = Vec::new();
    let mut order: Vec<String> = Vec::new();
    let mut per_chain: HashMap<String, Vec<NftOp>> = HashMap::new();
    let mut rest = Vec::new();
    for op in tx.ops {
        match &op {
            NftOp::AddSet(_) => {
                declare.push(op.clone());
                rest.push(op);
            }
            NftOp::AddChain { name, .. } if names::is_service_chain(name) => {
                if !per_chain.contains_key(name) {
                    per_chain.insert(name.clone(), Vec::new());
                    order.push(name.clone());
                }
                if !existing.contains(name) {
                    new_chains.push(op);
                }
            }
            NftOp::AddChain { name, .. } if !base.contains(name) => {
                declare.push(op.clone());
                rest.push(op);
            }
            NftOp::FlushChain(name) if per_chain.contains_key(name) => {
                if existing.contains(name) {
                    per_chain.entry(name.clone()).or_default().push(op);
                }
            }
            NftOp::AddRule { chain, .. } if per_chain.contains_key(chain) => {
                per_chain.entry(chain.clone()).or_default().push(op);
            }
            _ => rest.push(op),
        }
    }
    let rank = |name: &str| {
        let prefixes = [names::ENDPOINT_PREFIX, names::SERVICE_PREFIX, names::EXTERNAL_PREFIX, names::FIREWALL_PREFIX];
        prefixes.iter().position(|p| name.starts_with(p)).unwrap_or(4)
    };
    let mut chains: Vec<(String, Vec<NftOp>)> =
        order.into_iter().map(|name| (name.clone(), per_chain.remove(&name).unwrap_or_default())).collect();
    let family = tx.family;
    let staged_ops: usize = chains.iter().map(|(_, ops)| ops.len()).sum();
    if staged_ops == 0 {
        return vec![Transaction { family, ops: rest }];
    }
    chains.sort_by_key(|(name, _)| rank(name));
    let size = chunk.max(staged_ops / STAGES).max(1);
    let mut out = vec![Transaction { family, ops: declare }];
    let declare_size = chunk.max(new_chains.len() / STAGES).max(1);
    let mut pieces = new_chains.into_iter().peekable();
    while pieces.peek().is_some() {
        out.push(Transaction { family, ops: pieces.by_ref().take(declare_size).collect() });
    }
    let mut current: Vec<NftOp> = Vec::new();
    for (_, ops) in chains {
        if current.len() >= size {
            out.push(Transaction { family, ops: std::mem::take(&mut current) });
        }
        current.extend(ops);
    }
    if !current.is_empty() {
        out.push(Transaction { family, ops: current });
    }
    out.push(Transaction { family, ops: rest });
    out
}

/// A ServiceCIDR change after a confirmed full sync: a partial sync that
/// rewrites the top level's chains (the drop rule in `cluster-ips-check`)
/// and no service port's, then, confirmed, nothing more to do.
#[test]
fn a_service_cidr_change_rewrites_the_top_level_only() {
    let model = model_with(&repeated_events());
    let mut planner = NftablesPlanner::new(fake_ctx());
    let ctx = NftablesContext { service_cidrs: vec![], ..fake_ctx() };
    planner.full(&model, ctx.clone(), &KernelObjects::default());
    planner.confirm_applied(std::time::Duration::ZERO);
    let with = NftablesContext { service_cidrs: vec!["172.30.0.0/16".parse().unwrap()], ..ctx };
    let delta = planner.partial_with(&model, with.clone()).expect("a confirmed state");
    let text = delta.tx.to_string();
    assert!(
        text.contains("add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment \"Drop traffic to unallocated ClusterIPs\"\n"),
        "{text}"
    );
    // No per-service chain (their names hold the service's namespace/name).
    let chain_names = text.lines().filter_map(|l| l.strip_prefix("add chain ip kube-proxy "));
    assert!(!chain_names.map(|c| c.split(' ').next().unwrap_or(c)).any(names::is_service_chain), "{text}");
    assert!(delta.stale_chains.is_empty());
    planner.confirm_applied(std::time::Duration::ZERO);
    let again = planner.partial_with(&model, with).expect("a confirmed state");
    assert!(again.tx.is_empty(), "{}", again.tx);
}

/// What the planner keeps of a confirmed sync: each service port's chain
/// names, sets and elements, its rules only as a digest. A changed rule
/// changes the digest; a partial sync over the held ruleset sends what one
/// over the whole ruleset sends (both rulesets).
#[test]
fn a_held_ruleset_keeps_digests_of_the_rules_and_syncs_as_the_whole_one() {
    let maps = NftablesContext { ruleset: NftRuleset::Maps, ..fake_ctx() };
    let events = repeated_events();
    for ctx in [fake_ctx(), maps] {
        let old = desired(&model_with(&events), &ctx);
        let kept = held(old.clone());
        assert_eq!(kept.top, old.top);
        for (spn, o) in &old.services {
            let h = &kept.services[spn];
            assert!(h.held.is_some() && h.chains.iter().all(|c| c.rules.is_empty()), "{spn}");
            assert_eq!(
                h.chains.iter().map(|c| &c.name).collect::<Vec<_>>(),
                o.chains.iter().map(|c| &c.name).collect::<Vec<_>>()
            );
            assert_eq!((&h.sets, &h.elements), (&o.sets, &o.elements));
            assert!(h.same_as(o), "{spn}");
            let Some(c) = o.chains.iter().position(|c| !c.rules.is_empty()) else { continue };
            let mut changed = o.clone();
            changed.chains[c].rules.pop();
            assert_ne!(changed.digest(), o.digest(), "{spn}");
            assert!(!h.same_as(&changed), "{spn}");
        }
        for n in [1, events.len() / 2, events.len() - 1] {
            let new = desired(&model_with(&events[..n]), &ctx);
            assert_eq!(partial_sync(&kept, &new), partial_sync(&old, &new), "{:?} {n} events", ctx.ruleset);
            assert!(!partial_sync(&kept, &new).tx.is_empty());
        }
        assert!(partial_sync(&kept, &old).tx.is_empty());
    }
}
