//! The planner's transactions encoded by the codec, against netlink bytes
//! captured from the path that compiled upstream's rule text (the
//! planner's `nft` text, tokenized, compiled; `src/plan/nftables/testdata/
//! nftables-netlink.txt`): the typed path sends the same messages, with
//! the same flags, byte for byte. Each message is a line `FLAGS PAYLOAD`
//! (hex; the payload after the netlink header), under a `# case` heading.

use super::tests::{
    cluster_ip, deleted, eps, fake_ctx, model_with, no_node, overall_events, repeated_events, v6_ctx, v6_model,
};
use super::*;
use crate::kernel::nftables::codec;
use crate::msgs::SourceEvent;
use crate::net::IpFamily;

const CAPTURE: &str = include_str!("testdata/nftables-netlink.txt");

/// `tx`'s messages as the capture writes them (anonymous sets numbered from 1).
fn hex(tx: &Transaction) -> String {
    use netlink_packet_core::NetlinkSerializable;
    let mut out = String::new();
    let requests = codec::requests(tx.family, names::TABLE, &tx.ops, &mut 0).unwrap_or_else(|e| panic!("{e}"));
    for r in requests {
        let mut buf = vec![0; r.msg.buffer_len()];
        r.msg.serialize(&mut buf);
        out.push_str(&format!("{:04x} ", r.flags));
        buf.iter().for_each(|b| out.push_str(&format!("{b:02x}")));
        out.push('\n');
    }
    out
}

/// The capture's cases, rebuilt: full syncs of upstream's overall fixture
/// (over a kernel with stale objects, base chains re-created), of three
/// ServiceCIDRs with NodePorts on every address, of IPv6 with affinity, and
/// the partial syncs of upstream's repeated-sync steps with their stale
/// chains' deletions.
fn cases() -> Vec<(String, Transaction)> {
    let mut out = vec![];
    let rs = desired(&model_with(&overall_events()), &fake_ctx());
    let kernel = KernelObjects {
        chains: vec!["services".into(), "service-OLD00000-ns9/gone/tcp/p80".into()],
        sets: vec!["affinity-OLD00000-ns9/gone/tcp/p80__10.9.9.9/80".into()],
    };
    out.push(("overall: full sync".to_string(), full_sync(&rs, &kernel, true).tx));
    let ctx = NftablesContext {
        node_ports: NodePorts::All,
        service_cidrs: ["172.30.0.0/16", "172.31.0.0/16", "10.99.0.0/24"].iter().map(|c| c.parse().unwrap()).collect(),
        ..fake_ctx()
    };
    let rs = desired(&model_with(&repeated_events()), &ctx);
    out.push((
        "repeated: three ServiceCIDRs, all node ports".to_string(),
        full_sync(&rs, &KernelObjects::default(), false).tx,
    ));
    let affinity = serde_json::json!({"sessionAffinity": "ClientIP"});
    let rs = desired(&v6_model(affinity, &["fd00:10:180::1", "fd00:10:180::2"]), &v6_ctx());
    out.push(("ipv6: full sync".to_string(), full_sync(&rs, &KernelObjects::default(), true).tx));
    let mut model = model_with(&repeated_events());
    let mut rs = desired(&model, &fake_ctx());
    let steps: Vec<Vec<SourceEvent>> = vec![
        vec![cluster_ip("ns3", "svc3", "172.30.0.43", 80), eps("ns3", "svc3", 80, &[no_node("10.0.3.1")])],
        vec![deleted("ns2", "svc2")],
        vec![cluster_ip("ns4", "svc4", "172.30.0.44", 80)],
        vec![eps("ns4", "svc4", 80, &[no_node("10.0.4.1")])],
        vec![eps("ns3", "svc3", 80, &[no_node("10.0.3.2"), no_node("10.0.3.3")])],
        vec![eps("ns3", "svc3", 80, &[])],
    ];
    for (i, events) in steps.iter().enumerate() {
        events.iter().for_each(|e| model.record(e).unwrap());
        let changed = model.apply().ports;
        let old = rs.clone();
        update(&mut rs, &model, &fake_ctx(), &changed);
        let d = partial_sync(&old, &rs);
        out.push((format!("partial {i}"), d.tx));
        if !d.stale_chains.is_empty() {
            out.push((format!("partial {i}: stale chains deleted"), delete_stale(IpFamily::V4, &d.stale_chains)));
        }
    }
    out
}

/// The capture's text of each case.
fn captured() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vec![];
    for line in CAPTURE.lines() {
        match line.strip_prefix("# ") {
            Some(case) => out.push((case.to_string(), String::new())),
            None => {
                let (_, text) = out.last_mut().expect("a case heading first");
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    out
}

#[test]
fn typed_transactions_encode_to_the_captured_bytes() {
    let want = captured();
    let got: Vec<(String, String)> = cases().iter().map(|(case, tx)| (case.clone(), hex(tx))).collect();
    assert_eq!(got.iter().map(|c| &c.0).collect::<Vec<_>>(), want.iter().map(|c| &c.0).collect::<Vec<_>>());
    for ((case, got), (_, want)) in got.iter().zip(&want) {
        let first = got.lines().zip(want.lines()).position(|(a, b)| a != b);
        assert!(
            got == want,
            "{case}: {} messages, {} captured; first difference at message {first:?}:\n{}\n{}",
            got.lines().count(),
            want.lines().count(),
            first.and_then(|i| got.lines().nth(i)).unwrap_or(""),
            first.and_then(|i| want.lines().nth(i)).unwrap_or(""),
        );
    }
}

/// A full sync's elements listed from the ruleset when they are encoded
/// ([`full_sync_of`]: the staged sync's last transaction) are the messages
/// of the same sync with every element copied into its ops
/// ([`full_sync`]): the same bytes and flags in the same order, and the
/// same text, in both rulesets and both families, over an empty kernel and
/// one with stale objects, with elements that several groups hold.
#[test]
fn elements_listed_from_the_ruleset_encode_as_elements_copied_into_ops() {
    use std::sync::Arc;
    let maps = |ctx: NftablesContext| NftablesContext { ruleset: NftRuleset::Maps, ..ctx };
    let affinity = serde_json::json!({"sessionAffinity": "ClientIP"});
    let v6 = || v6_model(affinity.clone(), &["fd00:10:180::1", "fd00:10:180::2"]);
    let stale = KernelObjects {
        chains: vec!["services".into(), "service-OLD00000-ns9/gone/tcp/p80".into(), "maps-cluster-pick-9".into()],
        sets: vec!["affinity-OLD00000-ns9/gone/tcp/p80__10.9.9.9/80".into(), "maps-cluster-9".into()],
    };
    let cases = [
        (model_with(&overall_events()), fake_ctx()),
        (model_with(&overall_events()), maps(fake_ctx())),
        (model_with(&repeated_events()), maps(fake_ctx())),
        (v6(), v6_ctx()),
        (v6(), maps(v6_ctx())),
    ];
    let mut shared = 0;
    for (model, ctx) in cases {
        let rs = desired(&model, &ctx);
        let ids: std::collections::BTreeSet<_> = rs.elements().map(|e| (&e.set, &e.element.key)).collect();
        shared += rs.elements().count() - ids.len();
        let listed = Arc::new(rs.clone());
        for (kernel, recreate) in [(KernelObjects::default(), false), (stale.clone(), true)] {
            let copied = full_sync(&rs, &kernel, recreate).tx;
            let from_ruleset = full_sync_of(&listed, &kernel, recreate, |_| true).tx;
            let case = format!("{:?} {:?} {} chains held", ctx.ruleset, ctx.family, kernel.chains.len());
            assert!(from_ruleset.ops.iter().any(|op| matches!(op, NftOp::AddElementsOf(_))), "{case}");
            assert!(from_ruleset.ops.len() < copied.ops.len(), "{case}");
            assert_eq!(hex(&from_ruleset), hex(&copied), "{case}");
            assert_eq!(from_ruleset.to_string(), copied.to_string(), "{case}");
            assert_eq!(from_ruleset.len(), copied.len(), "{case}");
            assert_eq!(from_ruleset.op_count(), copied.ops.len(), "{case}");
            assert_eq!(from_ruleset.expanded(), copied, "{case}");
        }
    }
    assert!(shared > 0, "no element held by several groups");
}
