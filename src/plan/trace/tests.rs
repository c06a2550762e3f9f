//! The parser's strictness and the walk's rules, on small hand-written
//! inputs; the VM's scenarios over a real sync are in `trace_scenarios`.

use super::*;
use crate::msgs::{DestKey, DestSpec, SetEntry, SetType, VsSpec};

fn kernel(rules: &str) -> Kernel {
    Kernel { restores: vec![rules.to_string()], ..Kernel::default() }
}

fn parse_error(rules: &str) -> String {
    match Tracer::with_jumps(&kernel(rules), &[]) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted:\n{rules}"),
    }
}

#[test]
fn what_the_tracer_does_not_understand_is_an_error() {
    let cases = [
        ("-A KUBE-SERVICES -m recent --rcheck -j DROP", "unknown match -m recent"),
        ("-A KUBE-SERVICES -p tcp -j DNAT --to-destination 10.0.0.1:80", "unknown target -j DNAT"),
        ("-A KUBE-SERVICES --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT", "unknown option --match-set"),
        ("-A KUBE-SERVICES -i eth0 -j ACCEPT", "unknown option -i"),
        ("-A KUBE-SERVICES -j LOG", "no chain or target LOG"),
        ("-A KUBE-MISSING -j ACCEPT", "no such chain"),
        ("-A KUBE-SERVICES -m addrtype --dst-type UNICAST -j ACCEPT", "only address type LOCAL"),
    ];
    for (rule, want) in cases {
        let got = parse_error(&format!("*nat\n:KUBE-SERVICES - [0:0]\n{rule}\nCOMMIT\n"));
        assert!(got.contains(want), "{rule}: {got}");
    }
    assert!(parse_error("*nat\n:PREROUTING DROP [0:0]\nCOMMIT\n").contains("built-in"));
    assert!(parse_error("*nat\n:KUBE-SERVICES - [0:0]\n").contains("no COMMIT"));
}

/// A missing set, or a set matched with the wrong number of directions, is
/// an error when a packet reaches the rule (as iptables refuses the rule).
#[test]
fn a_missing_or_misused_set_is_an_error() {
    let rules =
        "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst -j ACCEPT\nCOMMIT\n";
    let jumps = [crate::kernel::iptables::chains::jump("nat", "PREROUTING", "", "", "KUBE-SERVICES")];
    let p = Packet {
        origin: Origin::Pod,
        src: "10.244.0.5".parse().unwrap(),
        dst: "10.96.0.1".parse().unwrap(),
        proto: Protocol::Tcp,
        dport: 443,
    };
    let mut k = kernel(rules);
    let e = Tracer::with_jumps(&k, &jumps).unwrap().trace(&p).unwrap_err();
    assert!(e.to_string().contains("no set KUBE-CLUSTER-IP"), "{e}");
    k.sets.insert("KUBE-CLUSTER-IP".into(), Set { set_type: SetType::HashIpPort, members: Default::default() });
    let e = Tracer::with_jumps(&k, &jumps).unwrap().trace(&p).unwrap_err();
    assert!(e.to_string().contains("1 directions for a hash:ip,port set"), "{e}");
}

/// Marks, RETURN against ACCEPT, the built-in chains' order, and real
/// servers of weight 0 (draining: IPVS schedules none of them).
#[test]
fn marks_returns_and_weights() {
    let rules = "*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:SUB - [0:0]
-A KUBE-SERVICES -j SUB
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A SUB -s 10.244.0.0/16 -j RETURN
-A SUB -j ACCEPT
-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000
-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
COMMIT
";
    let vip: IpAddr = "10.96.0.1".parse().unwrap();
    let vs = VsKey { addr: vip, protocol: Protocol::Tcp, port: 443 };
    let mut k = kernel(rules);
    k.sets.insert(
        "KUBE-CLUSTER-IP".into(),
        Set { set_type: SetType::HashIpPort, members: [SetEntry::IpPort(vip, Protocol::Tcp, 443)].into() },
    );
    k.ipvs.services.insert(vs, VsSpec { scheduler: "rr".into(), flags: 0, timeout: 0 });
    for (addr, weight) in [("10.244.1.1", 1), ("10.244.1.2", 0)] {
        let d = crate::kernel::DestState { spec: DestSpec { weight }, active: 0, inactive: 0 };
        k.ipvs.dests.insert((vs, DestKey { addr: addr.parse().unwrap(), port: 6443 }), d);
    }
    k.ipvs0.insert(vip);
    let nat_jumps: Vec<_> = JUMPS.iter().copied().filter(|j| j.table == "nat").collect();
    let t = Tracer::with_jumps(&k, &nat_jumps).unwrap();
    let from = |src: &str| Packet {
        origin: Origin::Pod,
        src: src.parse().unwrap(),
        dst: vip,
        proto: Protocol::Tcp,
        dport: 443,
    };
    let to = "10.244.1.1:6443".parse().unwrap();
    // A pod returns from SUB and is marked; anyone else is accepted in SUB, before the mark.
    assert_eq!(t.verdicts(&from("10.244.0.5")).unwrap(), vec![Verdict::Delivered { to, masqueraded: true }]);
    assert_eq!(t.verdicts(&from("192.168.1.1")).unwrap(), vec![Verdict::Delivered { to, masqueraded: false }]);
    let off = Packet { dst: "10.96.0.2".parse().unwrap(), ..from("10.244.0.5") };
    assert_eq!(t.verdicts(&off).unwrap(), vec![Verdict::Forwarded], "not on kube-ipvs0: routed away");
}
