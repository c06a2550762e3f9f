//! `IpsetHandle` against the real kernel, over our ip_set netlink client,
//! in a network namespace each test creates (ipsets are per namespace: the
//! host's sets are never touched).
//!
//! How a test runs in its namespace: the handle's calls run on a thread that
//! entered the namespace with setns(2) (`Netns::block_on`), and the netlink
//! socket is opened there, so it speaks to the namespace's sets; checks use
//! the `ipset` tool (`ip netns exec NS ipset save`), which also proves the
//! tool reads what we programmed. Needs root and the `ipset` tool: without
//! them the tests fail, they are never skipped.

mod common;

use std::collections::BTreeSet;
use std::net::IpAddr;

use common::Netns;
use kube_proxy_rs::kernel::ipset::netlink::NetlinkIpset;
use kube_proxy_rs::kernel::ipset::IpsetHandle;
use kube_proxy_rs::kernel::{IpsetKernel, KResult, Subsystem};
use kube_proxy_rs::msgs::{IpsetOp, SetEntry, SetSpec, SetType};
use kube_proxy_rs::net::{IpFamily, Protocol};
use kube_proxy_rs::plan::ipvs::IpvsSet;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn spec(name: &str, set_type: SetType, family: IpFamily) -> SetSpec {
    SetSpec { name: name.into(), set_type, family, comment: "" }
}

/// A handle for `s` over a client of its own: call it inside
/// `Netns::block_on` (the socket is opened in the calling thread's namespace
/// and its connection task runs on that call's runtime).
fn handle(s: &SetSpec) -> IpsetHandle {
    IpsetHandle::new(&NetlinkIpset::new().expect("ipset netlink socket"), s.clone())
}

/// `ipset save NAME` in the namespace: its `add` lines, sorted.
fn saved(ns: &Netns, name: &str) -> Vec<String> {
    let mut lines: Vec<String> =
        ns.ok(&["ipset", "save", name]).lines().filter(|l| l.starts_with("add ")).map(str::to_string).collect();
    lines.sort();
    lines
}

fn host_sets() -> String {
    let out = std::process::Command::new("ipset").args(["list", "-n"]).output().expect("ipset must be installed");
    assert!(out.status.success(), "ipset list -n: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Entries of one set type with tcp, udp and sctp ports.
fn entries_for(t: SetType, family: IpFamily) -> Vec<SetEntry> {
    let (a, b) = match family {
        IpFamily::V4 => (ip("10.96.0.10"), ip("10.244.1.5")),
        IpFamily::V6 => (ip("fd00::10"), ip("fd00:1::5")),
    };
    let net = match family {
        IpFamily::V4 => "198.51.100.0/24".parse().expect("net"),
        IpFamily::V6 => "2001:db8::/64".parse().expect("net"),
    };
    match t {
        SetType::HashIp => vec![SetEntry::Ip(a), SetEntry::Ip(b)],
        SetType::BitmapPort => vec![SetEntry::Port(30080), SetEntry::Port(30053), SetEntry::Port(0)],
        SetType::HashIpPort => Protocol::ALL.iter().map(|p| SetEntry::IpPort(a, *p, 80)).collect(),
        SetType::HashIpPortIp => Protocol::ALL.iter().map(|p| SetEntry::IpPortIp(b, *p, 8080, b)).collect(),
        SetType::HashIpPortNet => Protocol::ALL.iter().map(|p| SetEntry::IpPortNet(a, *p, 443, net)).collect(),
    }
}

fn all_ok(results: &[KResult<()>]) {
    for r in results {
        assert!(r.is_ok(), "{results:?}");
    }
}

#[test]
fn sets_of_every_type_hold_tcp_udp_and_sctp_members() {
    let before = host_sets();
    let ns = Netns::new("kpr-ipset-types");
    let types =
        [SetType::HashIp, SetType::HashIpPort, SetType::HashIpPortIp, SetType::HashIpPortNet, SetType::BitmapPort];
    let mut specs = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        for t in types {
            let name = format!("KPR-{}-{}", t.as_str().replace([':', ','], "-"), family.ipset_family());
            specs.push((spec(&name, t, family), entries_for(t, family)));
        }
    }
    let got: Vec<(Vec<KResult<()>>, BTreeSet<SetEntry>, u64)> = ns.block_on(|| async {
        let mut out = Vec::new();
        for (s, entries) in &specs {
            let h = handle(s);
            h.ensure().await.unwrap_or_else(|e| panic!("ensure {}: {e}", s.name));
            h.ensure().await.unwrap_or_else(|e| panic!("ensure again {}: {e}", s.name));
            let results = h.apply(entries.iter().map(|e| IpsetOp::Add(*e)).collect()).await;
            let members = h.members().await.unwrap_or_else(|e| panic!("members {}: {e}", s.name));
            out.push((results, members, h.ops_sent()));
        }
        out
    });
    for ((s, entries), (results, members, lines)) in specs.iter().zip(got) {
        all_ok(&results);
        assert_eq!(members, entries.iter().copied().collect::<BTreeSet<_>>(), "{}", s.name);
        assert_eq!(lines, entries.len() as u64);
        // The kernel holds them with the right protocol, as `ipset save` shows.
        let mut want: Vec<String> = entries.iter().map(|e| format!("add {} {e}", s.name)).collect();
        want.sort();
        assert_eq!(saved(&ns, &s.name), want, "{}", s.name);
    }
    let header = ns.ok(&["ipset", "save", "KPR-bitmap-port-inet"]);
    assert!(header.starts_with("create KPR-bitmap-port-inet bitmap:port range 0-65535"), "{header}");
    let header = ns.ok(&["ipset", "save", "KPR-hash-ip-port-inet6"]);
    assert!(header.contains("hash:ip,port family inet6 hashsize 1024 maxelem 65536"), "{header}");
    assert_eq!(host_sets(), before, "the host's sets changed");
}

#[test]
fn upstreams_sets_are_created_with_upstreams_parameters() {
    let ns = Netns::new("kpr-ipset-upstream");
    ns.block_on(|| async {
        for family in [IpFamily::V4, IpFamily::V6] {
            for set in IpvsSet::ALL {
                let h = handle(&set.spec(family));
                h.ensure().await.unwrap_or_else(|e| panic!("ensure {}: {e}", set.name(family)));
            }
        }
    });
    let names = ns.ok(&["ipset", "list", "-n"]);
    assert_eq!(names.lines().count(), 34, "{names}");
    let save = ns.ok(&["ipset", "save", "KUBE-6-LOAD-BALANCER-SOURCE-CID"]);
    assert!(save.starts_with("create KUBE-6-LOAD-BALANCER-SOURCE-CID hash:ip,port,net family inet6"), "{save}");
    // The revision of each type is the one the tool creates.
    let revision = |name: &str| {
        let header = ns.ok(&["ipset", "list", "-t", name]);
        header.lines().find(|l| l.starts_with("Revision:")).map(str::to_string).expect("a revision")
    };
    for set in IpvsSet::ALL {
        let spec = set.spec(IpFamily::V4);
        let mut create: Vec<String> = spec.create_line().split_whitespace().map(str::to_string).collect();
        create[1] = "KPR-BY-THE-TOOL".into();
        create.insert(0, "ipset".into());
        ns.ok(&create.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(revision(&spec.name), revision("KPR-BY-THE-TOOL"), "{}", spec.name);
        ns.ok(&["ipset", "destroy", "KPR-BY-THE-TOOL"]);
    }
}

#[test]
fn reconcile_removes_extras_and_adds_what_is_missing() {
    let ns = Netns::new("kpr-ipset-reconcile");
    let s = spec("KUBE-CLUSTER-IP", SetType::HashIpPort, IpFamily::V4);
    ns.ok(&[
        "ipset",
        "create",
        "KUBE-CLUSTER-IP",
        "hash:ip,port",
        "family",
        "inet",
        "hashsize",
        "1024",
        "maxelem",
        "65536",
    ]);
    for extra in ["10.96.0.1,tcp:443", "10.96.0.10,udp:53", "10.96.0.99,sctp:9"] {
        ns.ok(&["ipset", "add", "KUBE-CLUSTER-IP", extra]);
    }
    let desired: Vec<IpsetOp> = [
        SetEntry::IpPort(ip("10.96.0.1"), Protocol::Tcp, 443),
        SetEntry::IpPort(ip("10.96.0.10"), Protocol::Tcp, 53),
        SetEntry::IpPort(ip("10.96.0.10"), Protocol::Sctp, 53),
    ]
    .into_iter()
    .map(IpsetOp::Add)
    .collect();
    let (first, second) = ns.block_on(|| async {
        let h = handle(&s);
        let first = h.reconcile(desired.clone()).await.expect("reconcile");
        let second = h.reconcile(desired.clone()).await.expect("reconcile again");
        (first, second)
    });
    let shown: Vec<String> = first.0.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        ["del 10.96.0.10,udp:53", "del 10.96.0.99,sctp:9", "add 10.96.0.10,tcp:53", "add 10.96.0.10,sctp:53"]
    );
    all_ok(&first.1);
    assert!(second.0.is_empty(), "nothing left to do: {:?}", second.0);
    assert_eq!(
        saved(&ns, "KUBE-CLUSTER-IP"),
        [
            "add KUBE-CLUSTER-IP 10.96.0.1,tcp:443",
            "add KUBE-CLUSTER-IP 10.96.0.10,sctp:53",
            "add KUBE-CLUSTER-IP 10.96.0.10,tcp:53"
        ]
    );
}

/// The syncPeriod's check: the member count from the set's header when it
/// matches (nothing written), a reconcile when the set was flushed or
/// destroyed.
#[test]
fn verify_repairs_a_flushed_or_destroyed_set_and_writes_nothing_otherwise() {
    let ns = Netns::new("kpr-ipset-verify");
    let s = spec("KUBE-CLUSTER-IP", SetType::HashIpPort, IpFamily::V4);
    let desired: Vec<IpsetOp> =
        (1..=20u16).map(|p| IpsetOp::Add(SetEntry::IpPort(ip("10.96.0.1"), Protocol::Tcp, p))).collect();
    let (quiet, after_flush) = ns.block_on(|| async {
        let h = handle(&s);
        h.reconcile(desired.clone()).await.expect("reconcile");
        let sent = h.ops_sent();
        let quiet = h.verify(desired.clone()).await.expect("verify");
        assert_eq!(h.ops_sent(), sent, "a quiet check sends no op");
        ns_flush();
        (quiet, h.verify(desired.clone()).await.expect("verify after flush"))
    });
    assert!(quiet.applied.is_empty() && !quiet.drift, "nothing to do: {:?}", quiet.applied);
    assert_eq!(after_flush.applied.len(), 20, "every member added back");
    all_ok(&after_flush.results);
    assert!(!after_flush.drift, "repaired in place");
    ns.ok(&["ipset", "destroy", "KUBE-CLUSTER-IP"]);
    let after_destroy =
        ns.block_on(|| async { handle(&s).verify(desired.clone()).await.expect("verify after destroy") });
    assert_eq!(after_destroy.applied.len(), 20);
    assert_eq!(saved(&ns, "KUBE-CLUSTER-IP").len(), 20);
}

/// `ipset flush KUBE-CLUSTER-IP` from inside the namespace's thread.
fn ns_flush() {
    let out = std::process::Command::new("ipset").args(["flush", "KUBE-CLUSTER-IP"]).output().expect("ipset");
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_bad_entry_in_the_middle_of_a_batch_fails_only_its_op() {
    let ns = Netns::new("kpr-ipset-bad");
    let s = spec("KUBE-LOAD-BALANCER", SetType::HashIpPort, IpFamily::V4);
    let ops = vec![
        IpsetOp::Add(SetEntry::IpPort(ip("10.0.0.1"), Protocol::Tcp, 80)),
        IpsetOp::Del(SetEntry::IpPort(ip("10.0.0.9"), Protocol::Udp, 53)), // not there: fine
        IpsetOp::Add(SetEntry::IpPort(ip("fd00::1"), Protocol::Tcp, 80)),  // IPv6 in an inet set
        IpsetOp::Add(SetEntry::IpPort(ip("10.0.0.2"), Protocol::Sctp, 80)),
        IpsetOp::Add(SetEntry::Ip(ip("10.0.0.3"))), // wrong type for the set
        IpsetOp::Add(SetEntry::IpPort(ip("10.0.0.4"), Protocol::Udp, 80)),
    ];
    let (results, lines) = ns.block_on(|| async {
        let h = handle(&s);
        h.ensure().await.expect("ensure");
        let results = h.apply(ops.clone()).await;
        (results, h.ops_sent())
    });
    let failed: Vec<usize> = results.iter().enumerate().filter(|(_, r)| r.is_err()).map(|(i, _)| i).collect();
    assert_eq!(failed, [2, 4], "{results:?}");
    let err = results[2].as_ref().expect_err("ipv6 entry");
    assert_eq!(err.op(), "add KUBE-LOAD-BALANCER fd00::1,tcp:80");
    assert_eq!(err.cause().to_string(), "fd00::1 is not an address of set KUBE-LOAD-BALANCER's family inet");
    let err = results[4].as_ref().expect_err("wrong type");
    assert_eq!(err.op(), "add KUBE-LOAD-BALANCER 10.0.0.3");
    assert_eq!(
        saved(&ns, "KUBE-LOAD-BALANCER"),
        [
            "add KUBE-LOAD-BALANCER 10.0.0.1,tcp:80",
            "add KUBE-LOAD-BALANCER 10.0.0.2,sctp:80",
            "add KUBE-LOAD-BALANCER 10.0.0.4,udp:80"
        ]
    );
    // The two that cannot be members were never sent; the 4 others went
    // in one datagram.
    assert_eq!(lines, 4);
}

#[test]
fn ops_on_a_missing_set_fail_alike_without_a_retry_per_op() {
    let ns = Netns::new("kpr-ipset-missing");
    let s = spec("KUBE-NOT-CREATED", SetType::BitmapPort, IpFamily::V4);
    let (results, lines) = ns.block_on(|| async {
        let h = handle(&s);
        let ops = (30000..30010).map(|p| IpsetOp::Add(SetEntry::Port(p))).collect();
        (h.apply(ops).await, h.ops_sent())
    });
    assert_eq!(results.len(), 10);
    for r in &results {
        let err = r.as_ref().expect_err("no such set");
        assert!(err.cause().to_string().contains("does not exist"), "{err}");
    }
    assert_eq!(lines, 10, "one request each, no retry");
}

#[test]
fn a_set_of_another_type_or_family_is_a_clear_error() {
    let ns = Netns::new("kpr-ipset-mismatch");
    ns.ok(&["ipset", "create", "KUBE-CLUSTER-IP", "hash:ip"]);
    ns.ok(&["ipset", "create", "KUBE-EXTERNAL-IP", "hash:ip,port", "family", "inet6"]);
    let (ensure_err, members_err) = ns.block_on(|| async {
        let a = handle(&spec("KUBE-CLUSTER-IP", SetType::HashIpPort, IpFamily::V4));
        let b = handle(&spec("KUBE-EXTERNAL-IP", SetType::HashIpPort, IpFamily::V4));
        (a.ensure().await.expect_err("type differs"), b.reconcile(Vec::new()).await.expect_err("family differs"))
    });
    assert_eq!(ensure_err.cause().to_string(), "set KUBE-CLUSTER-IP exists with type hash:ip, want hash:ip,port");
    assert_eq!(members_err.cause().to_string(), "set KUBE-EXTERNAL-IP exists with family inet6, want inet");
}

#[test]
fn destroy_removes_a_set_and_a_missing_one_is_fine() {
    let ns = Netns::new("kpr-ipset-destroy");
    ns.ok(&["ipset", "create", "KUBE-IPVS-IPS", "hash:ip"]);
    let (first, second) = ns.block_on(|| async {
        let ipset = NetlinkIpset::new().expect("ipset netlink socket");
        (ipset.destroy("KUBE-IPVS-IPS").await.ok(), ipset.destroy("KUBE-IPVS-IPS").await.ok())
    });
    assert_eq!(first, Some(true));
    assert_eq!(second, Some(false));
    assert_eq!(ns.ok(&["ipset", "list", "-n"]), "");
}

/// A set an iptables rule still names cannot go (why `--cleanup` removes
/// the rules first): the error says so, and the set stays.
#[test]
fn destroying_a_set_a_rule_names_is_refused_in_ipsets_words() {
    let ns = Netns::new("kpr-ipset-busy");
    ns.ok(&["ipset", "create", "KUBE-IPVS-IPS", "hash:ip"]);
    ns.ok(&["iptables", "-A", "INPUT", "-m", "set", "--match-set", "KUBE-IPVS-IPS", "dst", "-j", "ACCEPT"]);
    let err = ns.block_on(|| async {
        NetlinkIpset::new().expect("ipset netlink socket").destroy("KUBE-IPVS-IPS").await.expect_err("in use")
    });
    assert_eq!(err.errno(), Some(4100), "IPSET_ERR_BUSY");
    assert_eq!(
        err.to_string(),
        "destroy KUBE-IPVS-IPS: the set is in use by a kernel component (an iptables rule or another set)"
    );
    assert_eq!(ns.ok(&["ipset", "list", "-n"]), "KUBE-IPVS-IPS\n");
}

/// A set upstream (or an operator) created with other parameters is used as
/// it is; the kernel's refusals (here: the set is full) fail only their op,
/// in the middle of one pipelined batch, and the later ops still apply in
/// order.
#[test]
fn kernel_refusals_fail_only_their_op_and_order_is_kept() {
    let ns = Netns::new("kpr-ipset-full");
    ns.ok(&["ipset", "create", "KUBE-LOOP-BACK", "hash:ip,port,ip", "maxelem", "2"]);
    let s = spec("KUBE-LOOP-BACK", SetType::HashIpPortIp, IpFamily::V4);
    let e = |n: &str| SetEntry::IpPortIp(ip(n), Protocol::Tcp, 80, ip(n));
    let ops = vec![
        IpsetOp::Add(e("10.244.0.1")),
        IpsetOp::Add(e("10.244.0.2")),
        IpsetOp::Add(e("10.244.0.3")), // full
        IpsetOp::Del(e("10.244.0.1")),
        IpsetOp::Add(e("10.244.0.4")), // room again
    ];
    let results = ns.block_on(|| async {
        let h = handle(&s);
        h.ensure().await.expect("the existing set is used");
        h.apply(ops.clone()).await
    });
    let failed: Vec<usize> = results.iter().enumerate().filter(|(_, r)| r.is_err()).map(|(i, _)| i).collect();
    assert_eq!(failed, [2], "{results:?}");
    let err = results[2].as_ref().expect_err("full");
    assert_eq!(err.op(), "add KUBE-LOOP-BACK 10.244.0.3,tcp:80,10.244.0.3");
    assert!(err.outcome_known());
    assert!(err.cause().to_string().ends_with("the set is full (maxelem reached)"), "{err}");
    assert_eq!(
        saved(&ns, "KUBE-LOOP-BACK"),
        ["add KUBE-LOOP-BACK 10.244.0.2,tcp:80,10.244.0.2", "add KUBE-LOOP-BACK 10.244.0.4,tcp:80,10.244.0.4"]
    );
    let header = ns.ok(&["ipset", "save", "KUBE-LOOP-BACK"]);
    assert!(header.contains("maxelem 2"), "left as it was: {header}");
}

/// Sets far larger than one datagram of requests or one dump message of
/// members: every op is acked, the listing is read to its end, and the
/// header's count matches.
#[test]
fn thousands_of_members_go_in_batches_and_list_completely() {
    let ns = Netns::new("kpr-ipset-large");
    let s = spec("KUBE-CLUSTER-IP", SetType::HashIpPort, IpFamily::V4);
    let desired: Vec<IpsetOp> = (0..5000u32)
        .map(|i| {
            let addr = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 96, 0, 0)) + i);
            IpsetOp::Add(SetEntry::IpPort(IpAddr::V4(addr), Protocol::ALL[i as usize % 3], 80))
        })
        .collect();
    let (applied, members, quiet) = ns.block_on(|| async {
        let h = handle(&s);
        let (ops, results) = h.reconcile(desired.clone()).await.expect("reconcile");
        all_ok(&results);
        let members = h.members().await.expect("members");
        let quiet = h.verify(desired.clone()).await.expect("verify");
        (ops.len(), members, quiet)
    });
    assert_eq!(applied, 5000);
    assert_eq!(members.len(), 5000);
    assert!(quiet.applied.is_empty(), "the header's count matches");
    assert_eq!(saved(&ns, "KUBE-CLUSTER-IP").len(), 5000);
}
