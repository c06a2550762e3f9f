//! The nf_tables netlink client (`kernel::nftables`) against the real
//! kernel, in network namespaces each test creates (the host's ruleset is
//! never touched): what it writes for typed ops is what `nft -f` writes for
//! their text (`nft list table` compared), each adds its objects over a
//! table the other wrote, a transaction carries element deletes and adds
//! and a chain flush at once, and a transaction with a refused op changes
//! nothing and names that op.
//! Needs root and `nft`: without them the tests fail, never skip.

mod common;

use common::Netns;
use kube_proxy_rs::actors::source::manifests::ManifestDir;
use kube_proxy_rs::kernel::nftables::{NetlinkNftables, TransactionError};
use kube_proxy_rs::model::Model;
use kube_proxy_rs::msgs::nftables::{
    BaseChain, ChainHook, ChainType, Element, Expr, Field, KeyPart, KeyType, NftOp, Rule, SetFlag, SetSpec,
    Transaction, Verdict,
};
use kube_proxy_rs::net::{IpFamily, Protocol};
use kube_proxy_rs::plan::local::LocalDetector;
use kube_proxy_rs::plan::nftables::context::mark;
use kube_proxy_rs::plan::nftables::{desired, NftRuleset, NftablesContext, NodePorts};

const TABLE: &str = "kube-proxy";

fn apply(ns: &Netns, family: IpFamily, ops: Vec<NftOp>) -> Result<(), TransactionError> {
    ns.block_on(move || async move {
        let nft = NetlinkNftables::new().expect("netfilter netlink socket");
        nft.apply(family, TABLE, &ops).await
    })
}

/// `nft list table` without the handles' and counters' noise.
fn listed(ns: &Netns, family: &str) -> String {
    ns.ok(&["nft", "list", "table", family, TABLE])
}

fn key(addr: &str, proto: Protocol, port: u16) -> Vec<KeyPart> {
    vec![KeyPart::Addr(addr.parse().expect("test address")), KeyPart::Proto(proto), KeyPart::Port(port)]
}

fn jump(chain: &str) -> Rule {
    Rule::new(vec![Expr::Verdict(Verdict::Jump(chain.into()))])
}

/// Upstream's table skeleton in miniature: the table with its comment, a
/// base chain, regular chains, the `service-ips` verdict map keyed by
/// address . protocol . port, one element and one rule.
fn skeleton(addr: &str, key_type: KeyType) -> Vec<NftOp> {
    vec![
        NftOp::AddTable { comment: Some("rules for kube-proxy".into()) },
        NftOp::AddChain { name: "services".into(), base: None, comment: None },
        NftOp::AddChain {
            name: "nat-prerouting".into(),
            base: Some(BaseChain { kind: ChainType::Nat, hook: ChainHook::Prerouting, priority: -100 }),
            comment: None,
        },
        NftOp::AddChain { name: "service-ULMVA6XW-ns1/svc1/tcp/p80".into(), base: None, comment: None },
        NftOp::AddSet(SetSpec::verdict_map(
            "service-ips",
            vec![key_type, KeyType::InetProto, KeyType::InetService],
            Some("ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        )),
        NftOp::AddElements {
            set: "service-ips".into(),
            elements: vec![Element::to(
                key(addr, Protocol::Tcp, 80),
                Verdict::Goto("service-ULMVA6XW-ns1/svc1/tcp/p80".into()),
            )],
        },
        NftOp::AddRule { chain: "nat-prerouting".into(), rule: jump("services") },
    ]
}

/// The same as `nft -f` input.
fn skeleton_text(family: &str, addr: &str, key_type: &str) -> String {
    format!(
        "add table {family} {TABLE} {{ comment \"rules for kube-proxy\" ; }}\n\
         add chain {family} {TABLE} services\n\
         add chain {family} {TABLE} nat-prerouting {{ type nat hook prerouting priority -100 ; }}\n\
         add chain {family} {TABLE} service-ULMVA6XW-ns1/svc1/tcp/p80\n\
         add map {family} {TABLE} service-ips {{ type {key_type} . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}\n\
         add element {family} {TABLE} service-ips {{ {addr} . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }}\n\
         add rule {family} {TABLE} nat-prerouting jump services\n"
    )
}

#[test]
fn one_transaction_writes_what_nft_writes_for_the_same_text() {
    for (family, nft_family, addr, key_type, name) in [
        (IpFamily::V4, "ip", "10.96.0.10", KeyType::Ipv4Addr, "ipv4_addr"),
        (IpFamily::V6, "ip6", "fd00:96::10", KeyType::Ipv6Addr, "ipv6_addr"),
    ] {
        let ours = Netns::new("kpr-nft-ours");
        apply(&ours, family, skeleton(addr, key_type)).expect("the transaction");
        let tool = Netns::new("kpr-nft-tool");
        tool.pipe(&["nft", "-f", "-"], &skeleton_text(nft_family, addr, name));
        let (a, b) = (listed(&ours, nft_family), listed(&tool, nft_family));
        assert_eq!(a, b, "ours:\n{a}\nnft -f:\n{b}");
        for want in [
            "comment \"rules for kube-proxy\"",
            &format!("type {name} . inet_proto . inet_service : verdict"),
            &format!("{addr} . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80"),
            "type nat hook prerouting priority dstnat; policy accept;",
            "jump services",
        ] {
            assert!(a.contains(want), "no {want:?} in:\n{a}");
        }
    }
}

/// Each adds its objects over the table the other wrote (a take-over of
/// upstream kube-proxy's table, which `nft -f` wrote, and upstream's of
/// ours): the kernel refuses to add a set that exists with another
/// definition (EEXIST), so the maps and the affinity sets must be defined
/// as `nft` defines them (`nft` marks concatenated keys only in interval
/// sets).
#[test]
fn each_writes_over_the_table_the_other_wrote() {
    for (family, nft_family, addr, key_type, name) in [
        (IpFamily::V4, "ip", "10.96.0.10", KeyType::Ipv4Addr, "ipv4_addr"),
        (IpFamily::V6, "ip6", "fd00:96::10", KeyType::Ipv6Addr, "ipv6_addr"),
    ] {
        let mut ops = skeleton(addr, key_type);
        ops.push(NftOp::AddSet(SetSpec {
            flags: vec![SetFlag::Dynamic, SetFlag::Timeout],
            timeout: Some(600),
            ..SetSpec::set("affinity-X", vec![key_type], None)
        }));
        let text = format!(
            "{}add set {nft_family} {TABLE} affinity-X {{ type {name} ; flags dynamic,timeout ; timeout 600s ; }}\n",
            skeleton_text(nft_family, addr, name)
        );
        let theirs = Netns::new("kpr-nft-over-t");
        theirs.pipe(&["nft", "-f", "-"], &text);
        apply(&theirs, family, ops.clone()).expect("our transaction over nft -f's table");
        let ours = Netns::new("kpr-nft-over-o");
        apply(&ours, family, ops).expect("our transaction");
        ours.pipe(&["nft", "-f", "-"], &text);
        let (a, b) = (listed(&ours, nft_family), listed(&theirs, nft_family));
        assert_eq!(a, b, "nft -f over ours:\n{a}\nours over nft -f's:\n{b}");
    }
}

#[test]
fn element_deletes_adds_and_a_chain_flush_go_in_one_transaction() {
    let ns = Netns::new("kpr-nft-delta");
    apply(&ns, IpFamily::V4, skeleton("10.96.0.10", KeyType::Ipv4Addr)).expect("the first transaction");
    let chain = "service-ULMVA6XW-ns1/svc1/tcp/p80".to_string();
    let delta = vec![
        NftOp::DeleteElements { set: "service-ips".into(), keys: vec![key("10.96.0.10", Protocol::Tcp, 80)] },
        NftOp::AddElements {
            set: "service-ips".into(),
            elements: vec![
                Element::to(key("10.96.0.11", Protocol::Udp, 53), Verdict::Goto(chain.clone())),
                Element::to(key("10.96.0.12", Protocol::Sctp, 9000), Verdict::Jump(chain.clone())),
            ],
        },
        NftOp::FlushChain("nat-prerouting".into()),
    ];
    apply(&ns, IpFamily::V4, delta).expect("the delta");
    // A map flushed: its elements go, the map stays (and takes new ones in the same transaction).
    let flush = vec![
        NftOp::FlushSet { name: "service-ips".into(), map: true },
        NftOp::AddElements {
            set: "service-ips".into(),
            elements: vec![Element::to(key("10.96.0.11", Protocol::Udp, 53), Verdict::Goto(chain.clone()))],
        },
    ];
    apply(&ns, IpFamily::V4, flush).expect("the flush");
    let t = listed(&ns, "ip");
    assert!(!t.contains("10.96.0.12 . sctp . 9000"), "{t}");
    apply(
        &ns,
        IpFamily::V4,
        vec![NftOp::AddElements {
            set: "service-ips".into(),
            elements: vec![Element::to(key("10.96.0.12", Protocol::Sctp, 9000), Verdict::Jump(chain.clone()))],
        }],
    )
    .expect("the element back");
    let t = listed(&ns, "ip");
    assert!(!t.contains("10.96.0.10 . tcp . 80"), "{t}");
    assert!(t.contains("10.96.0.11 . udp . 53 : goto service-ULMVA6XW-ns1/svc1/tcp/p80"), "{t}");
    assert!(t.contains("10.96.0.12 . sctp . 9000 : jump service-ULMVA6XW-ns1/svc1/tcp/p80"), "{t}");
    assert!(!t.contains("jump services"), "the chain is flushed:\n{t}");
    assert!(t.contains("chain nat-prerouting"), "and kept:\n{t}");

    // A stale chain: flushed and deleted, with the element pointing at it, at once.
    let gone = vec![
        NftOp::DeleteElements {
            set: "service-ips".into(),
            keys: vec![key("10.96.0.11", Protocol::Udp, 53), key("10.96.0.12", Protocol::Sctp, 9000)],
        },
        NftOp::FlushChain(chain.clone()),
        NftOp::DeleteChain(chain),
    ];
    apply(&ns, IpFamily::V4, gone).expect("the removal");
    let t = listed(&ns, "ip");
    assert!(!t.contains("service-ULMVA6XW"), "{t}");
}

#[test]
fn a_transaction_with_a_refused_op_changes_nothing_and_names_it() {
    let ns = Netns::new("kpr-nft-abort");
    apply(&ns, IpFamily::V4, skeleton("10.96.0.10", KeyType::Ipv4Addr)).expect("the first transaction");
    let before = listed(&ns, "ip");
    let names = ns.block_on(|| async {
        let nft = NetlinkNftables::new().expect("netfilter netlink socket");
        (nft.list(IpFamily::V4, TABLE).await, nft.list(IpFamily::V6, TABLE).await)
    });
    let (v4, v6) = (names.0.expect("listed"), names.1.expect("listed"));
    let mut chains = v4.chains.clone();
    chains.sort();
    assert_eq!(chains, ["nat-prerouting", "service-ULMVA6XW-ns1/svc1/tcp/p80", "services"]);
    assert_eq!(v4.sets, ["service-ips"]);
    assert!(v6.chains.is_empty() && v6.sets.is_empty(), "no ip6 table: {v6:?}");
    let bad = vec![
        NftOp::AddElements {
            set: "service-ips".into(),
            elements: vec![Element::to(key("10.96.0.20", Protocol::Tcp, 443), Verdict::Goto("services".into()))],
        },
        NftOp::FlushChain("nat-prerouting".into()),
        NftOp::AddElements {
            set: "no-such-map".into(),
            elements: vec![Element::key(key("10.96.0.21", Protocol::Tcp, 80))],
        },
    ];
    match apply(&ns, IpFamily::V4, bad) {
        Err(TransactionError::Refused { index, op, errno }) => {
            assert_eq!(index, 2, "{op}: {errno}");
            assert!(op.contains("no-such-map"), "{op}");
            assert_eq!(errno.0, 2, "ENOENT: {errno}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(listed(&ns, "ip"), before, "nothing of the aborted transaction applied");
}

/// The demo's whole table of one family as the planner types it: the demo
/// manifests, the demo node (its primary IP, no interface address: an
/// empty `nodeport-ips` in IPv4, NodePorts on every local address in IPv6),
/// no local-traffic detector, and the ServiceCIDRs given.
fn demo_table(family: IpFamily, node_ports: NodePorts, service_cidrs: &[&str]) -> Transaction {
    demo_table_in(NftRuleset::Upstream, family, node_ports, service_cidrs)
}

/// [`demo_table`] in `ruleset`.
fn demo_table_in(ruleset: NftRuleset, family: IpFamily, node_ports: NodePorts, service_cidrs: &[&str]) -> Transaction {
    let dir = format!("{}/config/demo", env!("CARGO_MANIFEST_DIR"));
    let scan = ManifestDir::new(dir).with_settle(std::time::Duration::ZERO).scan();
    assert!(scan.errors.is_empty(), "{:?}", scan.errors);
    let mut model = Model::new(family, "demo-node");
    for ev in &scan.events {
        model.record(ev).expect("a demo object");
    }
    model.apply();
    let ctx = NftablesContext {
        family,
        ruleset,
        node_name: "demo-node".into(),
        zone: "zone-a".into(),
        node_ip: Some("192.168.50.2".parse().expect("node IP")),
        masquerade_all: false,
        mark: mark(14),
        local: LocalDetector::None,
        node_ports,
        service_cidrs: service_cidrs.iter().map(|c| c.parse().expect("test CIDR")).collect(),
    };
    desired(&model, &ctx).dump_transaction()
}

/// The whole demo ruleset as upstream's proxier writes it (the planner's
/// typed table, whose text is `tests/golden/nftables-codec-ruleset.nft`):
/// every rule form upstream uses (concatenated vmaps, `numgen random mod N
/// vmap`, affinity `update`, `dnat to`, `masquerade fully-random`, `ct
/// state`, `fib`, marks, anonymous interval sets of source ranges and of
/// the ServiceCIDRs' ranges (the drop of unallocated ClusterIPs), comments)
/// in one transaction per family, listed by `nft` exactly as `nft -f` of
/// the same text leaves it.
#[test]
fn the_demo_ruleset_in_one_transaction_lists_as_nft_f_of_the_same_text() {
    let v4 = demo_table(IpFamily::V4, NodePorts::Ips(vec![]), &["10.96.0.0/12", "10.200.0.0/16"]);
    let v6 = demo_table(IpFamily::V6, NodePorts::All, &["fd00:96::/112"]);
    let text = format!("{v4}{v6}");
    let fixture =
        std::fs::read_to_string(format!("{}/tests/golden/nftables-codec-ruleset.nft", env!("CARGO_MANIFEST_DIR")))
            .expect("the fixture");
    assert_eq!(text, fixture, "the planner's text is the fixture's");
    let ours = Netns::new("kpr-nft-demo");
    let tool = Netns::new("kpr-nft-demof");
    tool.pipe(&["nft", "-f", "-"], &text);
    for (tx, name) in [(v4, "ip"), (v6, "ip6")] {
        assert!(tx.ops.len() > 20, "{name}: {} ops", tx.ops.len());
        apply(&ours, tx.family, tx.ops).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (a, b) = (listed(&ours, name), listed(&tool, name));
        if std::env::var_os("KPR_SHOW").is_some() {
            eprintln!("{a}");
        }
        assert_eq!(a, b, "{name}: ours:\n{a}\nnft -f:\n{b}");
    }
}

/// The demo's whole table in the `maps` ruleset (data maps keyed with a
/// `numgen` slot and their `typeof` user data, `dnat ip to ... map`, the
/// slot constants, `update` with a concatenated key, `ct status dnat`, the
/// hairpin pairs, per-slot affinity sets) in one transaction per family,
/// listed by `nft` exactly as `nft -f` of the planner's text leaves it.
#[test]
fn the_maps_demo_ruleset_lists_as_nft_f_of_the_same_text() {
    let v4 = demo_table_in(NftRuleset::Maps, IpFamily::V4, NodePorts::Ips(vec![]), &["10.96.0.0/12"]);
    let v6 = demo_table_in(NftRuleset::Maps, IpFamily::V6, NodePorts::All, &["fd00:96::/112"]);
    let text = format!("{v4}{v6}");
    let v4_text = v4.to_string();
    for want in [
        "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod",
        "ct status dnat",
        "update @maps-",
        "add element ip kube-proxy maps-cluster-endpoints",
    ] {
        assert!(v4_text.contains(want), "no {want:?} in:\n{v4_text}");
    }
    let ours = Netns::new("kpr-nft-maps");
    let tool = Netns::new("kpr-nft-mapsf");
    tool.pipe(&["nft", "-f", "-"], &text);
    for (tx, name) in [(v4, "ip"), (v6, "ip6")] {
        apply(&ours, tx.family, tx.ops).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (a, b) = (listed(&ours, name), listed(&tool, name));
        assert_eq!(a, b, "{name}: ours:\n{a}\nnft -f:\n{b}");
        assert!(a.contains("typeof "), "{name}:\n{a}");
    }
}

/// masqueradeAll's rule (`ip daddr <ClusterIP> tcp dport <port> jump
/// mark-for-masquerade`) lists as `nft -f` of the same text leaves it.
#[test]
fn a_masquerade_all_rule_lists_as_nft_f_of_the_same_text() {
    let masq_all = Rule::new(vec![
        Expr::Cmp {
            field: Field::Daddr(IpFamily::V4),
            neq: false,
            value: KeyPart::Addr("10.96.0.10".parse().expect("IP")),
        },
        Expr::ProtoDport { proto: Protocol::Udp, port: 53 },
        Expr::Verdict(Verdict::Jump("mark-for-masquerade".into())),
    ]);
    let tx = Transaction {
        family: IpFamily::V4,
        ops: vec![
            NftOp::add_table(),
            NftOp::AddChain { name: "mark-for-masquerade".into(), base: None, comment: None },
            NftOp::AddChain { name: "service".into(), base: None, comment: None },
            NftOp::AddRule { chain: "service".into(), rule: masq_all },
        ],
    };
    let (ours, tool) = (Netns::new("kpr-nft-masq"), Netns::new("kpr-nft-masqf"));
    tool.pipe(&["nft", "-f", "-"], &tx.to_string());
    apply(&ours, IpFamily::V4, tx.ops).expect("the transaction");
    let (a, b) = (listed(&ours, "ip"), listed(&tool, "ip"));
    assert_eq!(a, b, "ours:\n{a}\nnft -f:\n{b}");
    assert!(a.contains("ip daddr 10.96.0.10 udp dport 53 jump mark-for-masquerade"), "{a}");
}

/// The periodic drift check's two gets: the ruleset generation moves with
/// every commit, anybody's; the table's handle and use count move only when
/// somebody deletes or re-creates the table or adds or removes a chain or set.
#[test]
fn the_generation_and_the_tables_handle_and_use_count_tell_who_changed_what() {
    let ns = Netns::new("kpr-nft-gen");
    apply(&ns, IpFamily::V4, skeleton("10.96.0.10", KeyType::Ipv4Addr)).expect("the first transaction");
    let read = |ns: &Netns| {
        ns.block_on(|| async {
            let nft = NetlinkNftables::new().expect("netfilter netlink socket");
            let generation = nft.generation().await.expect("generation");
            (generation, nft.table_info(IpFamily::V4, TABLE).await.expect("table"))
        })
    };
    let (g0, t0) = read(&ns);
    let t0 = t0.expect("the table is there");
    // 3 chains and 1 set.
    assert_eq!(t0.use_count, 4, "{t0:?}");
    assert_eq!(read(&ns), (g0, Some(t0)), "nothing committed, nothing moves");
    // Somebody else's table: the generation moves, our table does not.
    ns.ok(&["nft", "add", "table", "ip", "somebody-else"]);
    let (g1, t1) = read(&ns);
    assert_ne!(g1, g0);
    assert_eq!(t1, Some(t0));
    // An element of ours deleted: invisible to this check (the hourly full sync's part).
    ns.ok(&["nft", "delete", "element", "ip", TABLE, "service-ips", "{ 10.96.0.10 . tcp . 80 }"]);
    assert_eq!(read(&ns).1, Some(t0));
    // A chain of ours deleted (nothing points to it any more): the use count moves.
    ns.ok(&["nft", "delete", "chain", "ip", TABLE, "service-ULMVA6XW-ns1/svc1/tcp/p80"]);
    let t2 = read(&ns).1.expect("the table is there");
    assert_eq!((t2.handle, t2.use_count), (t0.handle, 3));
    // The table deleted and created again: gone, then a new handle.
    ns.ok(&["nft", "delete", "table", "ip", TABLE]);
    assert_eq!(read(&ns).1, None);
    apply(&ns, IpFamily::V4, skeleton("10.96.0.10", KeyType::Ipv4Addr)).expect("again");
    let t3 = read(&ns).1.expect("the table is there");
    assert_ne!(t3.handle, t0.handle);
    assert_eq!(t3.use_count, t0.use_count);
}

/// A dump of 30,000 chains, as the iptables handle reads iptables-nft's
/// nat table at 10,000 services: every name comes back, and it runs on the
/// blocking pool: the runtime's only thread keeps running other tasks (a
/// ticker here, the actors in the daemon) while it lasts.
#[test]
fn a_dump_of_many_chains_lists_them_all_and_leaves_the_runtime_thread_free() {
    const CHAINS: usize = 30_000;
    let ns = Netns::new("kpr-nft-dump");
    let mut text = String::from("add table ip nat\n");
    text.extend((0..CHAINS).map(|i| format!("add chain ip nat KUBE-SEP-{i:016}\n")));
    ns.pipe(&["nft", "-f", "-"], &text);
    let (names, ticks, took) = ns.block_on(|| async {
        let nft = NetlinkNftables::new().expect("netfilter netlink socket");
        let dump = nft.chain_names(IpFamily::V4, "nat");
        let (done, ticks) = (std::cell::Cell::new(false), std::cell::Cell::new(0u32));
        let ticker = async {
            while !done.get() {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                ticks.set(ticks.get() + 1);
            }
        };
        let started = std::time::Instant::now();
        let listed = async {
            let names = dump.await;
            done.set(true);
            names
        };
        let (names, ()) = tokio::join!(listed, ticker);
        (names.expect("the dump"), ticks.get(), started.elapsed())
    });
    assert_eq!(names.len(), CHAINS);
    assert!(names.contains("KUBE-SEP-0000000000029999"));
    assert!(ticks >= 3, "the runtime thread ticked {ticks} times during a dump of {took:?}");
}
