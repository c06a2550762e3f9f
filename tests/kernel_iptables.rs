//! `IptablesHandle` against the real kernel with both flavours of the tools
//! (iptables-legacy and iptables-nft), applying the IPVS-mode rules the
//! planner renders, in a network namespace each test creates (iptables
//! rules and ipsets are per namespace: the host's are never touched).
//!
//! How a test runs in its namespace: the handle's calls run on a thread that
//! entered the namespace with setns(2) (`Netns::block_on`), so the
//! iptables processes it starts are in the namespace too; checks use `ip
//! netns exec NS iptables-*-save`. Needs root, ipset, iptables-legacy and
//! iptables-nft: without them the tests fail, they are never skipped.
//!
//! Not covered here: `-m ipvs` rules (KUBE-IPVS-OUT-FILTER with LB source
//! ranges that exclude the node) need the ip_vs module, which this host's
//! kernel lacks; the VM tests cover IPVS.

mod common;

use common::Netns;
use kube_proxy_rs::kernel::ipset::netlink::NetlinkIpset;
use kube_proxy_rs::kernel::ipset::IpsetHandle;
use kube_proxy_rs::kernel::iptables::fingerprint::{self, Backend};
use kube_proxy_rs::kernel::iptables::{IptablesBinaries, IptablesHandle};
use kube_proxy_rs::kernel::nftables::NetlinkNftables;
use kube_proxy_rs::kernel::{IpsetKernel, Subsystem};
use kube_proxy_rs::msgs::{IptablesOp, RestoreInput};
use kube_proxy_rs::net::IpFamily;
use kube_proxy_rs::plan::ipvs::rules::{render, IpvsRulesConfig, CANARY, FILTER_CHAINS, JUMPS, NAT_CHAINS};
use kube_proxy_rs::plan::ipvs::IpvsSet;
use kube_proxy_rs::plan::local::LocalDetector;

/// The rules of a cluster with ClusterIPs, LoadBalancers with source
/// ranges, NodePorts and hairpin endpoints.
fn rules(family: IpFamily, random_fully: bool) -> String {
    let pods = match family {
        IpFamily::V4 => "10.244.0.0/16",
        IpFamily::V6 => "fd00:10:244::/56",
    };
    let cfg = IpvsRulesConfig {
        family,
        masquerade_all: false,
        masquerade_bit: 14,
        local: LocalDetector::Cidr(pods.parse().expect("cidr")),
        random_fully,
    };
    let non_empty = [
        IpvsSet::LoopBack,
        IpvsSet::ClusterIp,
        IpvsSet::ExternalIp,
        IpvsSet::LoadBalancer,
        IpvsSet::LoadBalancerLocal,
        IpvsSet::LoadBalancerFw,
        IpvsSet::LoadBalancerSourceCidr,
        IpvsSet::NodePortTcp,
        IpvsSet::NodePortUdp,
        IpvsSet::NodePortSctp,
        IpvsSet::HealthCheckNodePort,
        IpvsSet::IpvsIps,
    ];
    render(&cfg, &|s| non_empty.contains(&s), &[])
}

fn restore(text: String) -> IptablesOp {
    IptablesOp::Restore(RestoreInput::new(text))
}

// Every iptables command below waits for the xtables lock (`-w`): the
// legacy tools share one lock file across namespaces, and tests run in
// parallel.

/// `<flavour>-save` in the namespace (all tables).
fn save(ns: &Netns, bins: &IptablesBinaries) -> String {
    ns.ok(&[&bins.save])
}

fn count(haystack: &str, line: &str) -> usize {
    haystack.lines().filter(|l| *l == line).count()
}

/// The built-in chain's rules, in order, as `-S CHAIN` prints them.
fn chain(ns: &Netns, bins: &IptablesBinaries, table: &str, name: &str) -> Vec<String> {
    ns.ok(&[&bins.iptables, "-w", "5", "-t", table, "-S", name]).lines().skip(1).map(str::to_string).collect()
}

fn assert_each_jump_once(saved: &str) {
    for j in JUMPS {
        let rule = j.save_line();
        assert_eq!(count(saved, &rule), 1, "{rule} in\n{saved}");
    }
}

/// Creates upstream's 17 sets of `family` (the rules name them).
fn create_sets(ns: &Netns, family: IpFamily) {
    ns.block_on(|| async {
        let ipset = NetlinkIpset::new().expect("ipset netlink socket");
        for set in IpvsSet::ALL {
            IpsetHandle::new(&ipset, set.spec(family)).ensure().await.unwrap_or_else(|e| panic!("{e}"));
        }
    });
}

fn rules_apply_reconcile_detect_flush_and_clean_up(family: IpFamily, flavour: &str) {
    let ns = Netns::new(&format!("kpr-ipt-{flavour}-{}", family.ipset_family()));
    let bins = IptablesBinaries::variant(family, flavour);
    create_sets(&ns, family);
    let (foreign_src, foreign_rule) = match family {
        IpFamily::V4 => ("192.0.2.1", "-A INPUT -s 192.0.2.1/32 -j DROP"),
        IpFamily::V6 => ("2001:db8::1", "-A INPUT -s 2001:db8::1/128 -j DROP"),
    };
    // Something of someone else's, which must survive everything below.
    ns.ok(&[&bins.iptables, "-w", "5", "-t", "filter", "-A", "INPUT", "-s", foreign_src, "-j", "DROP"]);
    ns.ok(&[&bins.iptables, "-w", "5", "-t", "nat", "-N", "FOREIGN"]);
    ns.ok(&[&bins.iptables, "-w", "5", "-t", "nat", "-A", "OUTPUT", "-j", "FOREIGN"]);

    let h = IptablesHandle::with_binaries(bins.clone());
    let text = rules(family, ns.block_on(|| h.random_fully()));
    let (first, second, third, canary_before) = ns.block_on(|| async {
        let first = h.reconcile(vec![restore(text.clone())]).await.expect("reconcile");
        let second = h.reconcile(vec![restore(text.clone())]).await.expect("reconcile again");
        let third = h.apply(vec![restore(text.clone())]).await;
        (first, second, third, h.canary_present().await.expect("canary check"))
    });
    assert_eq!(first.1, [Ok(())]);
    assert_eq!(second.1, [Ok(())]);
    assert_eq!(third, [Ok(())]);
    assert!(canary_before, "canary present after a restore");

    let saved = save(&ns, &bins);
    assert_each_jump_once(&saved);
    for c in NAT_CHAINS.iter().chain(&FILTER_CHAINS) {
        assert!(saved.contains(&format!(":{c} - [0:0]")), "{c} in\n{saved}");
    }
    assert_eq!(count(&saved, ":KUBE-PROXY-CANARY - [0:0]"), 3, "canary in mangle, nat and filter");
    assert!(saved.contains("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000"), "{saved}");
    let sctp = format!("--match-set {} dst,dst -j KUBE-MARK-MASQ", IpvsSet::NodePortSctp.name(family));
    assert!(saved.contains(&sctp), "{saved}");
    // Jumps were prepended in upstream's order; ours come before the foreign rule.
    let input = chain(&ns, &bins, "filter", "INPUT");
    assert!(input[0].ends_with("-j KUBE-IPVS-FILTER"), "{input:?}");
    assert!(input[1].ends_with("-j KUBE-PROXY-FIREWALL"), "{input:?}");
    assert!(input[2].ends_with("-j KUBE-NODE-PORT"), "{input:?}");
    assert_eq!(input[3], foreign_rule);
    assert!(h.lines_written() >= 3 * text.lines().count() as u64);

    // Someone flushes and deletes the canary: detected.
    ns.ok(&[&bins.iptables, "-w", "5", "-t", "nat", "-F", CANARY]);
    ns.ok(&[&bins.iptables, "-w", "5", "-t", "nat", "-X", CANARY]);
    let canary_after = ns.block_on(|| async { h.canary_present().await.expect("canary check") });
    assert!(!canary_after, "canary gone from nat");

    // --cleanup: everything of ours goes, the foreign rules stay; twice is fine.
    ns.block_on(|| async {
        h.cleanup().await.expect("cleanup");
        h.cleanup().await.expect("cleanup again");
    });
    let saved = save(&ns, &bins);
    assert!(!saved.contains("KUBE-"), "left over:\n{saved}");
    assert_eq!(count(&saved, foreign_rule), 1, "{saved}");
    assert_eq!(count(&saved, "-A OUTPUT -j FOREIGN"), 1, "{saved}");
    // And the sets are free to go: no rule references them any more.
    ns.block_on(|| async {
        let ipset = NetlinkIpset::new().expect("ipset netlink socket");
        for set in IpvsSet::ALL {
            ipset.destroy(&set.name(family)).await.unwrap_or_else(|e| panic!("{e}"));
        }
    });
}

#[test]
fn ipvs_rules_with_iptables_legacy() {
    rules_apply_reconcile_detect_flush_and_clean_up(IpFamily::V4, "legacy");
}

#[test]
fn ipvs_rules_with_iptables_nft() {
    rules_apply_reconcile_detect_flush_and_clean_up(IpFamily::V4, "nft");
}

#[test]
fn ipv6_rules_with_ip6tables_legacy() {
    rules_apply_reconcile_detect_flush_and_clean_up(IpFamily::V6, "legacy");
}

#[test]
fn ipv6_rules_with_ip6tables_nft() {
    rules_apply_reconcile_detect_flush_and_clean_up(IpFamily::V6, "nft");
}

/// The iptables actor's periodic check: a fingerprint of the tables (one
/// syscall or netlink message) says whether anything changed; only then are
/// the canary and our jumps looked for.
fn periodic_check_finds_a_flushed_table(family: IpFamily, flavour: &str) {
    let ns = Netns::new(&format!("kpr-ipt-chk-{flavour}-{}", family.ipset_family()));
    let bins = IptablesBinaries::variant(family, flavour);
    let backend = if flavour == "nft" { Backend::Nft } else { Backend::Legacy };
    create_sets(&ns, family);
    let h = IptablesHandle::with_binaries(bins.clone());
    let text = rules(family, ns.block_on(|| h.random_fully()));
    let foreign = match family {
        IpFamily::V4 => "192.0.2.9",
        IpFamily::V6 => "2001:db8::9",
    };
    let fingerprint = || {
        ns.block_on(|| async {
            let nft = NetlinkNftables::new().expect("an nf_tables socket");
            fingerprint::fingerprint(family, backend, &nft).await.expect("fingerprint")
        })
    };
    let (quiet, quiet_again) = ns.block_on(|| async {
        h.reconcile(vec![restore(text.clone())]).await.expect("reconcile");
        (h.run_periodic().await, h.run_periodic().await)
    });
    assert!(!quiet && !quiet_again, "nothing changed");
    let before = fingerprint();
    assert_eq!(fingerprint(), before, "stable while nobody writes");
    ns.ok(&[&bins.iptables, "-w", "5", "-t", "filter", "-A", "INPUT", "-s", foreign, "-j", "DROP"]);
    assert_ne!(fingerprint(), before, "someone else's rule changes it");
    let foreign_change = ns.block_on(|| async { h.run_periodic().await });
    assert!(!foreign_change, "someone else's rule is not drift");
    ns.ok(&[&bins.iptables, "-w", "5", "-t", "nat", "-F"]);
    let flushed = ns.block_on(|| async { h.run_periodic().await });
    assert!(flushed, "a flushed nat table (canary chain still there, jumps gone) is drift");
    // The full resync puts it back, and the check is quiet again.
    let repaired = ns.block_on(|| async {
        h.reconcile(vec![restore(text.clone())]).await.expect("reconcile");
        h.run_periodic().await
    });
    assert!(!repaired);
    assert_each_jump_once(&save(&ns, &bins));
    ns.block_on(|| async { h.cleanup().await.expect("cleanup") });
}

#[test]
fn periodic_check_with_iptables_legacy() {
    periodic_check_finds_a_flushed_table(IpFamily::V4, "legacy");
}

#[test]
fn periodic_check_with_iptables_nft() {
    periodic_check_finds_a_flushed_table(IpFamily::V4, "nft");
}

#[test]
fn periodic_check_with_ip6tables_legacy() {
    periodic_check_finds_a_flushed_table(IpFamily::V6, "legacy");
}

#[test]
fn a_jump_deleted_by_someone_comes_back_at_the_next_full_resync_only() {
    let ns = Netns::new("kpr-ipt-jumps");
    let bins = IptablesBinaries::variant(IpFamily::V4, "legacy");
    create_sets(&ns, IpFamily::V4);
    let h = IptablesHandle::with_binaries(bins.clone());
    let text = rules(IpFamily::V4, true);
    ns.block_on(|| async { h.apply(vec![restore(text.clone())]).await });
    assert_each_jump_once(&save(&ns, &bins));
    let portals = JUMPS[0].spec();
    assert_eq!(portals, "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES");
    let args = [
        bins.iptables.as_str(),
        "-w",
        "5",
        "-t",
        "nat",
        "-D",
        "PREROUTING",
        "-m",
        "comment",
        "--comment",
        "kubernetes service portals",
        "-j",
        "KUBE-SERVICES",
    ];
    ns.ok(&args);
    // An incremental apply trusts the jumps it checked before.
    let results = ns.block_on(|| async { h.apply(vec![restore(text.clone())]).await });
    assert_eq!(results, [Ok(())]);
    let rule = format!("-A PREROUTING {portals}");
    assert_eq!(count(&save(&ns, &bins), &rule), 0);
    // A full resync checks again.
    let (_, results) = ns.block_on(|| async { h.reconcile(vec![restore(text.clone())]).await }).expect("reconcile");
    assert_eq!(results, [Ok(())]);
    assert_each_jump_once(&save(&ns, &bins));
    // A full resync with nothing to restore still puts the jumps back.
    ns.ok(&args);
    ns.block_on(|| async { h.reconcile(Vec::new()).await }).expect("reconcile without rules");
    assert_each_jump_once(&save(&ns, &bins));
}

#[test]
fn a_failing_restore_names_the_line_and_changes_nothing() {
    let ns = Netns::new("kpr-ipt-fail");
    let bins = IptablesBinaries::variant(IpFamily::V4, "legacy");
    let h = IptablesHandle::with_binaries(bins.clone());
    let bad = "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\n-A KUBE-SERVICES -j NO-SUCH-CHAIN\nCOMMIT\n";
    let results = ns.block_on(|| async { h.apply(vec![restore(bad.to_string())]).await });
    let err = results[0].as_ref().expect_err("bad rule");
    assert!(err.op().starts_with("iptables-legacy-restore -w 5 -W 100000 --noflush --counters"), "{err}");
    assert!(err.cause().to_string().contains("-A KUBE-SERVICES -j NO-SUCH-CHAIN"), "{err}");
    assert!(!save(&ns, &bins).contains("KUBE-SERVICES"), "nothing committed");
}

/// Two handles' restores (a dual-stack node's IPv4 and IPv6 iptables) never
/// overlap in one process: every iptables process takes the same
/// host-wide xtables lock and gives up after `-w 5`, so the daemon queues
/// its own restores instead. Fake tools record when each restore runs.
#[test]
fn restores_of_both_families_take_turns() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("restores.log");
    let tool = |name: &str, body: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    };
    let bins = IptablesBinaries {
        iptables: tool("iptables", "echo 'iptables v1.8.9 (legacy)'\n".into()),
        save: tool("iptables-save", "exit 0\n".into()),
        restore: tool(
            "iptables-restore",
            format!(
                "cat >/dev/null\necho \"start $1$$\" >>{log}\nsleep 0.3\necho \"end $1$$\" >>{log}\n",
                log = log.display()
            ),
        ),
    };
    let (v4, v6) = (IptablesHandle::with_binaries(bins.clone()), IptablesHandle::with_binaries(bins));
    let op = || vec![restore("*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n".into())];
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (a, b) = rt.block_on(async { tokio::join!(v4.apply(op()), v6.apply(op())) });
    assert!(a.iter().chain(&b).all(Result::is_ok), "{a:?} {b:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    let kinds: Vec<&str> = text.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(kinds, ["start", "end", "start", "end"], "overlapping restores:\n{text}");
}

/// iptables-mode rules of `services` services with five endpoints each, in
/// upstream's form (KUBE-SERVICES → KUBE-SVC → KUBE-SEP), as one restore;
/// `stale` chains are deleted.
fn many_services(services: usize, tag: &str, stale: &[&str]) -> String {
    let sep = |s: usize, e: usize| format!("KUBE-SEP-{tag}{s:05}X{e}");
    let svc = |s: usize| format!("KUBE-SVC-{s:05}");
    let mut t = String::from("*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n");
    t += "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-PROXY-CANARY - [0:0]\n";
    for s in 0..services {
        t += &format!(":{} - [0:0]\n", svc(s));
        for e in 0..5 {
            t += &format!(":{} - [0:0]\n", sep(s, e));
        }
    }
    for c in stale {
        t += &format!(":{c} - [0:0]\n");
    }
    t += "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n";
    for s in 0..services {
        let ip = format!("10.96.{}.{}", s / 250, s % 250 + 1);
        t += &format!("-A KUBE-SERVICES -d {ip}/32 -p tcp -m tcp --dport 80 -j {}\n", svc(s));
        for e in 0..5 {
            let rest = 5 - e;
            if rest > 1 {
                t += &format!(
                    "-A {} -m statistic --mode random --probability {:.11} -j {}\n",
                    svc(s),
                    1.0 / rest as f64,
                    sep(s, e)
                );
            } else {
                t += &format!("-A {} -j {}\n", svc(s), sep(s, e));
            }
            let pod = format!("10.244.{}.{}", s / 50, (s % 50) * 5 + e + 1);
            t += &format!("-A {} -s {pod}/32 -j KUBE-MARK-MASQ\n", sep(s, e));
            t += &format!("-A {} -p tcp -m tcp -j DNAT --to-destination {pod}:8080\n", sep(s, e));
        }
    }
    t += "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n";
    for c in stale {
        t += &format!("-X {c}\n");
    }
    t + "COMMIT\n"
}

/// The nat table as chain → its rules in order (`iptables-save -t nat`).
fn nat_chains(ns: &Netns, bins: &IptablesBinaries) -> std::collections::BTreeMap<String, Vec<String>> {
    let saved = ns.ok(&[&bins.save, "-t", "nat"]);
    let mut chains = std::collections::BTreeMap::new();
    for line in saved.lines() {
        if let Some(decl) = line.strip_prefix(':') {
            chains.entry(decl.split_whitespace().next().unwrap_or_default().to_string()).or_insert_with(Vec::new);
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split_whitespace().next().unwrap_or_default().to_string();
            chains.entry(chain).or_insert_with(Vec::new).push(line.to_string());
        }
    }
    chains
}

/// A restore too large for one iptables-nft transaction (README,
/// "iptables-nft at scale") is written in several, and leaves the same
/// rules as iptables-legacy's single restore of the same input: a node
/// taken over (old rules in some service chains, a stale chain KUBE-SERVICES
/// jumps to, someone else's chain) ends with the new rules, the stale chain
/// gone and the foreign one kept.
#[test]
fn a_large_restore_on_iptables_nft_is_split_into_transactions_with_the_same_result() {
    let mut results = Vec::new();
    for flavour in ["legacy", "nft"] {
        let ns = Netns::new(&format!("kpr-ipt-split-{flavour}"));
        let bins = IptablesBinaries::variant(IpFamily::V4, flavour);
        ns.ok(&[&bins.iptables, "-w", "5", "-t", "nat", "-N", "FOREIGN"]);
        ns.ok(&[&bins.iptables, "-w", "5", "-t", "nat", "-A", "OUTPUT", "-j", "FOREIGN"]);
        let h = IptablesHandle::with_binaries(bins.clone()).for_mode(&kube_proxy_rs::plan::iptables::PROFILE);
        // The earlier run: 20 services, their endpoints under other names, and a chain that goes.
        let old = many_services(20, "OLD", &[])
            .replace(":KUBE-NODEPORTS - [0:0]\n", ":KUBE-NODEPORTS - [0:0]\n:KUBE-SVC-STALE - [0:0]\n");
        let old =
            old.replace("-A KUBE-MARK-MASQ", "-A KUBE-SERVICES -d 10.96.99.1/32 -j KUBE-SVC-STALE\n-A KUBE-MARK-MASQ");
        let mut stale: Vec<String> =
            (0..20).flat_map(|s| (0..5).map(move |e| format!("KUBE-SEP-OLD{s:05}X{e}"))).collect();
        stale.push("KUBE-SVC-STALE".into());
        let new = many_services(1_500, "NEW", &stale.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            new.lines().count() > kube_proxy_rs::kernel::iptables::split_restore::SPLIT_FROM,
            "{} lines",
            new.lines().count()
        );
        let generations = ns.block_on(|| async {
            let (_, r) = h.reconcile(vec![restore(old)]).await.expect("the earlier run");
            assert_eq!(r, [Ok(())]);
            let nft = NetlinkNftables::new().expect("an nf_tables socket");
            let before = nft.generation().await.ok();
            let (_, r) = h.reconcile(vec![restore(new.clone())]).await.expect("take-over");
            assert_eq!(r, [Ok(())]);
            before.zip(nft.generation().await.ok()).map(|(b, a)| a.wrapping_sub(b))
        });
        if flavour == "nft" {
            let transactions = generations.expect("nftables generation");
            assert!(transactions > 5, "{transactions} nftables transactions for {} lines", new.lines().count());
        }
        let chains = nat_chains(&ns, &bins);
        assert!(!chains.contains_key("KUBE-SVC-STALE"), "stale chain deleted");
        assert!(!chains.keys().any(|c| c.contains("OLD")), "the earlier endpoints' chains deleted");
        assert_eq!(chains["KUBE-SVC-00007"].len(), 5, "refilled");
        let output = &chains["OUTPUT"];
        assert!(output[0].ends_with("-j KUBE-SERVICES") && output[1] == "-A OUTPUT -j FOREIGN", "{output:?}");
        results.push(chains);
    }
    let (legacy, nft) = (&results[0], &results[1]);
    assert_eq!(legacy.len(), nft.len());
    for (chain, rules) in legacy {
        assert_eq!(Some(rules), nft.get(chain), "{chain}");
    }
}
