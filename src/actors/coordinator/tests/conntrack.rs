//! IPVS mode's conntrack cleanup through the coordinator: after the real
//! server's removal, at the first sync, for a deleted Service, and retried.

use super::*;

#[test]
fn conntrack_waits_for_a_failed_real_server_removal() {
    run_paused(|| async {
        let (h, flow) = dns_with_a_flow().await;
        remove_endpoint_with_a_failure(&h, "-d -u 10.96.0.10:53 -r 10.244.1.5:53").await;
        assert!(h.at(&deletion(&flow)).is_empty(), "no deletion while the real server may still be there");
        assert_eq!(h.at("conntrack -L").len(), 1, "the first sync's dump only");
        sleep(Duration::from_secs(2)).await;
        let j = &h.k.journal;
        let del = j.lines().iter().rposition(|l| l == "ipvs -d -u 10.96.0.10:53 -r 10.244.1.5:53").expect("retried");
        let flush = j.pos(&deletion(&flow)).expect("deleted after the retry");
        assert!(del < flush);
        assert!(h.k.conntrack.snapshot().is_empty());
    });
}

/// Entries a stopped daemon left (an endpoint removed meanwhile) go at the
/// first sync; later syncs dump the table only after a UDP change.
#[test]
fn the_first_sync_reconciles_conntrack_and_later_ones_only_after_udp_changes() {
    run_paused(|| async {
        let h = start(Duration::ZERO, Duration::from_secs(30));
        let to_removed = udp_flow(40001, "10.96.0.10:53", "10.244.9.9:53");
        let to_serving = udp_flow(40002, "10.96.0.10:53", "10.244.1.5:53");
        let other_port = udp_flow(40003, "10.96.0.10:54", "10.244.9.9:53");
        for e in [to_removed, to_serving, other_port] {
            h.k.conntrack.insert(e);
        }
        let mut first = synced();
        first.extend([applied_service(dns_service()), dns_slice(&["10.244.1.5"]), web_svc("web", "10.96.0.20")]);
        h.send(first).await;
        sleep(MS).await;
        assert_eq!(flows_left(&h.k.conntrack), [40002, 40003]);
        assert_eq!(h.at("conntrack -L -f ipv4").len(), 1);
        h.send(vec![web_slice("web", &["10.244.1.1"])]).await;
        sleep(Duration::from_secs(65)).await;
        assert_eq!(h.at("conntrack -L").len(), 1, "a TCP change and periodic syncs dump nothing");
        h.send(vec![dns_slice(&["10.244.1.5", "10.244.2.5"])]).await;
        sleep(MS).await;
        assert_eq!(h.at("conntrack -L").len(), 2, "a UDP endpoint change does");
    });
}

/// A deleted UDP NodePort Service: its DNATed entries go, to the ClusterIP
/// and to the NodePort on any node address; entries it did not DNAT and
/// another Service's stay.
#[test]
fn a_deleted_udp_services_entries_go() {
    run_paused(|| async {
        let h = start(Duration::ZERO, Duration::from_secs(30));
        let dns = service("kube-system", "dns", "10.96.0.10", &[("dns", "UDP", 53, 30053)]);
        let other = service("default", "syslog", "10.96.0.11", &[("dns", "UDP", 53, 0)]);
        let eps = [ep("10.244.1.5", "node-b")];
        let mut first = synced();
        first.extend([
            applied_service(dns.clone()),
            dns_slice(&["10.244.1.5"]),
            applied_service(other),
            applied_slice(slice("default", "syslog-1", "syslog", &[("dns", "UDP", 53)], &eps)),
        ]);
        h.send(first).await;
        sleep(MS).await;
        let flows = [
            udp_flow(40001, "10.96.0.10:53", "10.244.1.5:53"),
            udp_flow(40002, "192.168.50.2:30053", "10.244.1.5:53"),
            udp_flow(40003, "10.0.0.5:30053", "10.244.1.5:53"),
            udp_flow(40004, "10.0.0.5:30053", "10.0.0.5:30053"),
            udp_flow(40005, "10.96.0.11:53", "10.244.1.5:53"),
        ];
        for e in flows {
            h.k.conntrack.insert(e);
        }
        h.send(vec![deleted_service(dns), deleted_slice(slice("kube-system", "dns-1", "dns", &[], &[]))]).await;
        sleep(MS).await;
        assert_eq!(flows_left(&h.k.conntrack), [40004, 40005]);
        assert!(h.syncs().await.iter().all(|s| s.failed == 0));
    });
}

/// A reconcile whose delete failed is counted and done again by the retry.
#[test]
fn a_failed_conntrack_reconcile_is_retried() {
    run_paused(|| async {
        let (h, flow) = dns_with_a_flow().await;
        remove_endpoint_with_a_failure(&h, "conntrack -D").await;
        assert_eq!(h.syncs().await[1].failed, 1);
        assert_eq!(h.k.conntrack.snapshot(), [flow], "kept by the failed delete");
        sleep(Duration::from_secs(2)).await;
        assert!(h.k.conntrack.snapshot().is_empty(), "{:?}", h.k.journal.lines());
    });
}
