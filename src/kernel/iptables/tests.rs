use super::saved::insert_jumps;
use super::*;
use crate::kernel::iptables::chains::Jump;
use crate::kernel::iptables::chains::{IPTABLES_PROFILE, IPVS_JUMPS};

const FRESH_NAT: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                         :POSTROUTING ACCEPT [0:0]\nCOMMIT\n";

fn saved(text: &str) -> SavedTable {
    SavedTable::parse(text)
}

#[test]
fn every_jump_is_missing_from_fresh_tables_and_none_once_present() {
    let nat = saved(FRESH_NAT);
    let filter = saved("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n");
    let ipvs = &IPVS_PROFILE;
    assert_eq!(missing_jumps(ipvs, &nat, &filter).len(), ipvs.jumps.len());
    let all: String = ipvs.jumps.iter().map(|j| format!("{}\n", j.save_line())).collect();
    let t = saved(&all);
    assert!(missing_jumps(ipvs, &t, &t).is_empty());
    // The modes share four jumps (nat OUTPUT, PREROUTING, POSTROUTING; filter FORWARD to KUBE-FORWARD).
    let iptables = &IPTABLES_PROFILE;
    assert_eq!(missing_jumps(iptables, &t, &t).len(), iptables.jumps.len() + iptables.kept_jumps.len() - 4);
}

#[test]
fn missing_jumps_go_before_the_commit_of_their_table() {
    let nat = saved(FRESH_NAT);
    let filter = saved("*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FORWARD - [0:0]\nCOMMIT\n");
    let missing: Vec<Jump> = IPVS_JUMPS.into_iter().filter(|j| j.from == "OUTPUT" || j.to == "KUBE-FORWARD").collect();
    let text = "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n";
    let got = insert_jumps(text, &missing, &nat, &filter);
    let want = "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\n\
                -I OUTPUT 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n\
                *filter\n:KUBE-IPVS-OUT-FILTER - [0:0]\n\
                -I FORWARD 1 -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
                -I OUTPUT 1 -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-OUT-FILTER\nCOMMIT\n";
    assert_eq!(got, want);
    assert_eq!(insert_jumps(text, &[], &nat, &filter), text);
    assert_eq!(insert_jumps("", &[], &nat, &filter), "");
}

#[test]
fn jumps_go_into_an_input_in_parts_as_into_the_whole() {
    let nat = saved(FRESH_NAT);
    let filter = saved("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n");
    let missing = missing_jumps(&IPTABLES_PROFILE, &nat, &filter);
    let parts = [
        "*filter\n:KUBE-SERVICES - [0:0]\n",
        "-A KUBE-SERVICES -j RETURN\nCOMMIT\n*nat\n",
        ":KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\n",
        "COMMIT\n",
    ];
    let whole = parts.concat();
    let got: String = jump_parts(&parts, &missing, &nat, &filter).concat();
    assert_eq!(got, insert_jumps(&whole, &missing, &nat, &filter));
    assert!(got.contains("-I PREROUTING 1"), "{got}");
    // The parts themselves are borrowed, not copied.
    let out = jump_parts(&parts, &missing, &nat, &filter);
    assert!(out.iter().any(|p| matches!(p, Cow::Borrowed(b) if *b == parts[2])), "{out:?}");
}

#[test]
fn cleanup_deletes_only_what_is_ours_and_there() {
    let nat = saved(
        "*nat\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-PROXY-CANARY - [0:0]\n:FOREIGN - [0:0]\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A OUTPUT -j FOREIGN\nCOMMIT\n",
    );
    let empty = saved("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n");
    let got = cleanup_input(&[&IPVS_PROFILE], None, &empty, &nat, &empty);
    let jump = "-D OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n";
    let want = format!(
        "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-PROXY-CANARY - [0:0]\n{jump}{jump}-X KUBE-SERVICES\n-X KUBE-PROXY-CANARY\nCOMMIT\n"
    );
    assert_eq!(got, want);
    assert_eq!(cleanup_input(&[&IPVS_PROFILE], None, &empty, &empty, &empty), "");
}

#[test]
fn a_missing_target_chain_is_declared_unless_the_kernel_or_the_input_has_it() {
    let profile = &IPTABLES_PROFILE;
    let nat = saved(FRESH_NAT);
    let filter = saved("*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n");
    let missing = missing_jumps(profile, &nat, &filter);
    let text = "*filter\n:KUBE-SERVICES - [0:0]\nCOMMIT\n";
    let got = insert_jumps(text, &missing, &nat, &filter);
    // Declared once, right after `*filter`: the targets neither side has.
    for c in ["KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL"] {
        assert_eq!(got.matches(&format!(":{c} - [0:0]")).count(), 1, "{c} in\n{got}");
    }
    assert_eq!(got.matches(":KUBE-SERVICES - [0:0]").count(), 2, "once per table:\n{got}");
    assert!(!got.contains(":KUBE-FIREWALL"), "kubelet's chain exists: not flushed\n{got}");
    assert!(got.contains("-I INPUT 1 -j KUBE-FIREWALL\n"), "{got}");
    let filter_part = &got[got.find("*filter").unwrap()..];
    assert!(filter_part.find(":KUBE-NODEPORTS").unwrap() < filter_part.find("-I INPUT 1").unwrap());
}

#[test]
fn iptables_mode_cleanup_takes_service_chains_and_leaves_kubelets_jumps() {
    let profile = &IPTABLES_PROFILE;
    let nat = saved(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABCDEFGHIJKLMNOP - [0:0]\n\
         :KUBE-SEP-ABCDEFGHIJKLMNOP - [0:0]\n:KUBE-NODE-PORT - [0:0]\n\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n",
    );
    let filter = saved(
        "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n:KUBE-NODEPORTS - [0:0]\n\
         -A INPUT -j KUBE-FIREWALL\n\
         -A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS\nCOMMIT\n",
    );
    let got = cleanup_input(&[profile], None, &SavedTable::default(), &nat, &filter);
    for want in [
        "-X KUBE-SVC-ABCDEFGHIJKLMNOP",
        "-X KUBE-SEP-ABCDEFGHIJKLMNOP",
        "-X KUBE-SERVICES",
        "-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-X KUBE-NODEPORTS",
    ] {
        assert!(got.contains(want), "{want} missing from\n{got}");
    }
    assert!(!got.contains("KUBE-FIREWALL") && !got.contains("KUBE-NODE-PORT "), "not ours:\n{got}");
    assert!(has_markers(profile, &nat, &filter));
    // Both modes at once: IPVS mode's KUBE-NODE-PORT goes too, in the same restore.
    let both = cleanup_input(&[profile, &IPVS_PROFILE], None, &SavedTable::default(), &nat, &filter);
    assert!(both.contains("-X KUBE-NODE-PORT\n") && both.contains("-X KUBE-SVC-ABCDEFGHIJKLMNOP"), "{both}");
    assert_eq!(both.matches("-X KUBE-SERVICES").count(), 1, "shared chains once:\n{both}");
    let deletes = both.lines().filter(|l| l.starts_with("-D PREROUTING")).count();
    assert_eq!(deletes, 1, "a jump both modes use is deleted once:\n{both}");
    assert!(has_markers(&IPVS_PROFILE, &nat, &filter), "KUBE-NODE-PORT is IPVS mode's");
    let empty = SavedTable::default();
    assert!(!has_markers(profile, &empty, &empty) && !has_markers(&IPVS_PROFILE, &empty, &empty));
}

#[test]
fn wait_flags_backend_and_random_fully_follow_the_iptables_version() {
    let full = vec!["-w", "5", "-W", "100000"];
    assert_eq!(
        tool_version("iptables v1.8.9 (nf_tables)"),
        ToolVersion { iptables: full.clone(), restore: full.clone(), backend: Backend::Nft, random_fully: true }
    );
    assert_eq!(
        tool_version("iptables v1.6.1"),
        ToolVersion { iptables: full, restore: vec![], backend: Backend::Legacy, random_fully: false }
    );
    assert_eq!(
        tool_version("iptables v1.4.21"),
        ToolVersion { iptables: vec!["-w"], restore: vec![], backend: Backend::Legacy, random_fully: false }
    );
    let nothing = ToolVersion { iptables: vec![], restore: vec![], backend: Backend::Legacy, random_fully: false };
    assert_eq!(tool_version("garbage"), nothing);
    assert_eq!(parse_version("iptables v1.8.10 (legacy)"), Some((1, 8, 10)));
}

#[test]
fn restore_errors_name_the_failing_input_line() {
    let out = ToolOutput {
        status: std::os::unix::process::ExitStatusExt::from_raw(2 << 8),
        stdout: String::new(),
        stderr: "iptables-restore v1.8.9 (legacy): Couldn't load target `NOPE':No such file or directory\n\n\
                 Error occurred at line: 2\nTry `iptables-restore -h' for more information.\n"
            .into(),
    };
    let msg = restore_message(&out, &["*nat\n-A X -j NOPE\nCOMMIT\n"]);
    assert!(msg.ends_with("[line 2: -A X -j NOPE]"), "{msg}");
    assert!(msg.starts_with("iptables-restore v1.8.9 (legacy): Couldn't load target"), "{msg}");
}

#[test]
fn a_table_the_kernel_cannot_provide_is_recognised() {
    assert!(table_unavailable(
        "ip6tables-save v1.8.9 (legacy): Cannot initialize: iptables who? (do you need to insmod?)"
    ));
    assert!(table_unavailable("iptables-save: Table does not exist (do you need to insmod?)"));
    assert!(!table_unavailable("iptables-restore: line 3 failed"));
}

#[test]
fn after_a_switch_the_earlier_modes_cleanup_keeps_what_the_new_mode_writes_too() {
    // IPVS mode's state after iptables mode's first sync: shared chains and jumps are iptables mode's now.
    let nat = saved(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-PROXY-CANARY - [0:0]\n\
         :KUBE-NODE-PORT - [0:0]\n:KUBE-LOAD-BALANCER - [0:0]\n:KUBE-SVC-ABCDEFGHIJKLMNOP - [0:0]\n\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n",
    );
    let filter = saved(
        "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FORWARD - [0:0]\n:KUBE-IPVS-FILTER - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n\
         -A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER\n\
         -A INPUT -m comment --comment \"kube-proxy firewall rules\" -j KUBE-PROXY-FIREWALL\n\
         -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         COMMIT\n",
    );
    let got = cleanup_input(&[&IPVS_PROFILE], Some(&IPTABLES_PROFILE), &SavedTable::default(), &nat, &filter);
    for want in [
        "-X KUBE-NODE-PORT\n",
        "-X KUBE-LOAD-BALANCER\n",
        "-X KUBE-IPVS-FILTER\n",
        "-D INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER\n",
        "-D INPUT -m comment --comment \"kube-proxy firewall rules\" -j KUBE-PROXY-FIREWALL\n",
    ] {
        assert!(got.contains(want), "{want} missing from\n{got}");
    }
    for kept in
        ["KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY", "KUBE-FORWARD", "KUBE-SVC-", "-X KUBE-PROXY-FIREWALL"]
    {
        assert!(!got.contains(kept), "{kept} is iptables mode's too:\n{got}");
    }
    assert!(!got.contains("load balancer firewall"), "iptables mode's jump stays:\n{got}");
    // nftables mode keeps nothing of iptables mode's.
    let all = cleanup_input(&[&IPVS_PROFILE], None, &SavedTable::default(), &nat, &filter);
    assert!(all.contains("-X KUBE-SERVICES\n") && all.contains("-X KUBE-PROXY-CANARY\n"), "{all}");
}
