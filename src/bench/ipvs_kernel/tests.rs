use super::*;
use crate::bench::gen::generate;

fn planned(services: usize) -> (IpvsDesired, String) {
    let events = generate(ClusterSpec { services, endpoints_per_service: 3, nodes: 5, seed: 7 }).unwrap();
    let mut model = Model::new(FAMILY, THIS_NODE);
    for ev in &events {
        model.record(ev).unwrap();
    }
    let changes = model.apply();
    let mut planner = IpvsPlanner::new(plan_context(&plan_settings(), model.node(), &local_addrs()));
    planner.update(&model, &changes.ports);
    (planner.desired(), planner.rules(&rules_config(true)))
}

#[test]
fn tool_files_hold_the_whole_cold_state_in_each_tools_syntax() {
    let (desired, rules) = planned(40);
    let ipvs = ipvsadm_restore(&desired);
    assert_eq!(ipvs.lines().count(), desired.ipvs.len());
    let first_dest = ipvs.lines().position(|l| l.starts_with("-a ")).unwrap();
    assert!(ipvs.lines().take(first_dest).all(|l| l.starts_with("-A ")), "services before destinations");
    assert!(ipvs.lines().all(|l| l.starts_with("-A -") || l.ends_with(" -m -w 1")), "{ipvs}");

    let ipset = ipset_restore(&desired);
    assert_eq!(ipset.lines().filter(|l| l.starts_with("create KUBE-")).count(), 17);
    let members: usize = desired.sets.values().map(Vec::len).sum();
    assert_eq!(ipset.lines().filter(|l| l.starts_with("add KUBE-")).count(), members);

    let ip = ip_batch(&desired);
    assert_eq!(ip.lines().next(), Some("link add kube-ipvs0 type dummy"));
    assert_eq!(ip.lines().filter(|l| l.starts_with("addr add ") && l.ends_with("/32 dev kube-ipvs0")).count(), {
        desired.addresses.len()
    });

    let ipt = iptables_restore(&rules);
    assert_eq!(ipt.lines().count(), rules.lines().count() + ipvs_rules::JUMPS.len());
    for j in ipvs_rules::JUMPS {
        let lines: Vec<&str> = ipt.lines().collect();
        let at = lines.iter().position(|l| *l == j.insert_line()).unwrap();
        let table = lines[..at].iter().rev().find_map(|l| l.strip_prefix('*'));
        assert_eq!(table, Some(j.table), "{} sits in its table's section:\n{ipt}", j.insert_line());
        let commit = lines[at..].iter().position(|l| *l == "COMMIT");
        let next_table = lines[at..].iter().position(|l| l.starts_with('*')).unwrap_or(usize::MAX);
        assert!(commit.is_some_and(|c| c < next_table), "{} comes before its COMMIT", j.insert_line());
    }
}

#[test]
fn digests_ignore_order_only() {
    let a = digest(vec!["b".into(), "a".into()]);
    assert_eq!(a, digest(vec!["a".into(), "b".into()]));
    assert_ne!(a, digest(vec!["a".into(), "c".into()]));
    assert_eq!(a.lines, 2);
}

#[test]
fn counters_subtract() {
    let a = Counters { ipvs_messages: 10, ipset_ops: 3, ..Counters::default() };
    let b = Counters { ipvs_messages: 12, ipset_ops: 3, conntrack_messages: 2, ..Counters::default() };
    let d = b.since(a);
    assert_eq!(d.named().map(|x| x.1), [2, 0, 0, 0, 2]);
}
