//! `DummyLink` against the real kernel over rtnetlink, in a network
//! namespace each test creates.
//!
//! How a test runs in its namespace: the handle is created, and its calls
//! run, on a thread that entered the namespace with setns(2)
//! (`Netns::block_on`), so its rtnetlink socket is bound there; checks use
//! `ip -n NS`. Needs root.
//!
//! Upstream uses whatever link is named `kube-ipvs0`, so these tests make it
//! one end of a veth pair: this host's kernel has no dummy links. Creating
//! the dummy link is checked where the kernel has them (the VM tests); here
//! `ensure` on a fresh namespace must either create a DOWN dummy link or fail
//! naming the missing support.

mod common;

use std::collections::BTreeSet;
use std::net::IpAddr;

use common::Netns;
use kube_proxy_rs::kernel::link::DummyLink;
use kube_proxy_rs::kernel::{LinkKernel, Subsystem};
use kube_proxy_rs::msgs::LinkOp;
use kube_proxy_rs::net::IpFamily;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

/// A namespace whose `kube-ipvs0` is a veth (its peer `kpr-peer`).
fn ns_with_veth(prefix: &str) -> Netns {
    let ns = Netns::new(prefix);
    ns.ok(&["ip", "link", "add", "name", "kube-ipvs0", "type", "veth", "peer", "name", "kpr-peer"]);
    ns
}

/// `ip -br addr show dev kube-ipvs0`: the addresses with their prefixes.
fn shown(ns: &Netns) -> Vec<String> {
    let out = ns.ok(&["ip", "-br", "addr", "show", "dev", "kube-ipvs0"]);
    out.split_whitespace().skip(2).map(str::to_string).collect()
}

#[test]
fn binds_and_unbinds_on_an_existing_link_of_another_type() {
    let ns = ns_with_veth("kpr-link-bind");
    let (results, unbound, addrs, requests) = ns.block_on(|| async {
        let link = DummyLink::new().expect("rtnetlink");
        link.ensure().await.expect("ensure uses the veth");
        let ops = vec![
            LinkOp::Bind(ip("10.96.0.10")),
            LinkOp::Bind(ip("fd00::10")),
            LinkOp::Bind(ip("10.96.0.11")),
            LinkOp::Bind(ip("10.96.0.10")), // again: fine
        ];
        let results = link.apply(ops).await;
        let unbound = link.apply(vec![LinkOp::Unbind(ip("10.96.0.11")), LinkOp::Unbind(ip("10.96.0.99"))]).await;
        let addrs = link.addresses().await.expect("addresses");
        (results, unbound, addrs, link.requests())
    });
    assert_eq!(results, [Ok(()), Ok(()), Ok(()), Ok(())]);
    assert_eq!(unbound, [Ok(()), Ok(())], "unbinding a gone address is fine");
    assert_eq!(addrs, BTreeSet::from([ip("10.96.0.10"), ip("fd00::10")]));
    assert_eq!(shown(&ns), ["10.96.0.10/32", "fd00::10/128"]);
    // One lookup, four binds, two unbinds, one lookup and one dump.
    assert_eq!(requests, 9);
    let state = ns.ok(&["ip", "-br", "link", "show", "dev", "kube-ipvs0"]);
    assert!(state.contains("DOWN"), "never set up: {state}");
}

#[test]
fn reconcile_unbinds_extras_of_its_family_and_binds_what_is_missing() {
    let ns = ns_with_veth("kpr-link-reconcile");
    // Leftovers: a service address, one with another prefix, one of the other family.
    ns.ok(&["ip", "addr", "add", "10.96.0.20/32", "dev", "kube-ipvs0"]);
    ns.ok(&["ip", "addr", "add", "10.96.5.5/24", "dev", "kube-ipvs0"]);
    ns.ok(&["ip", "addr", "add", "fd00::20/128", "dev", "kube-ipvs0"]);
    let desired = vec![LinkOp::Bind(ip("10.96.0.10")), LinkOp::Bind(ip("10.96.0.20"))];
    let (first, second) = ns.block_on(|| async {
        let link = DummyLink::new().expect("rtnetlink").with_family(IpFamily::V4);
        let first = link.reconcile(desired.clone()).await.expect("reconcile");
        let second = link.reconcile(desired.clone()).await.expect("reconcile again");
        (first, second)
    });
    assert_eq!(first.0, [LinkOp::Bind(ip("10.96.0.10")), LinkOp::Unbind(ip("10.96.5.5"))]);
    assert_eq!(first.1, [Ok(()), Ok(())]);
    assert!(second.0.is_empty(), "{:?}", second.0);
    assert_eq!(shown(&ns), ["10.96.0.20/32", "10.96.0.10/32", "fd00::20/128"]);
}

#[test]
fn a_link_that_is_not_a_dummy_is_never_deleted() {
    let ns = ns_with_veth("kpr-link-delete");
    let err = ns.block_on(|| async {
        let link = DummyLink::new().expect("rtnetlink");
        link.delete_link().await.expect_err("a veth")
    });
    assert_eq!(err.op(), "delete link kube-ipvs0");
    assert_eq!(err.cause().to_string(), "kube-ipvs0 is a veth, not a dummy: not deleting it");
    ns.ok(&["ip", "link", "show", "dev", "kube-ipvs0"]);
}

#[test]
fn ensure_creates_a_down_dummy_link_or_names_the_missing_support() {
    let ns = Netns::new("kpr-link-create");
    let created = ns.block_on(|| async { DummyLink::new().expect("rtnetlink").ensure().await });
    match created {
        Ok(_) => {
            eprintln!("this kernel has dummy links: checking the one created");
            let detail = ns.ok(&["ip", "-d", "link", "show", "dev", "kube-ipvs0"]);
            assert!(detail.contains("dummy"), "{detail}");
            assert!(detail.contains("state DOWN"), "never set up: {detail}");
            let deleted = ns.block_on(|| async {
                let link = DummyLink::new().expect("rtnetlink");
                (link.delete_link().await, link.delete_link().await)
            });
            assert_eq!(deleted, (Ok(true), Ok(false)));
        }
        Err(e) => {
            eprintln!("this kernel has no dummy links: {e}");
            assert_eq!(e.op(), "create kube-ipvs0 type dummy");
            assert_eq!(e.errno_value(), Some(95), "EOPNOTSUPP: {e}");
            assert!(!ns.exec(&["ip", "link", "show", "dev", "kube-ipvs0"]).status.success());
        }
    }
}
