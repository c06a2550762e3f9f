use super::*;

#[test]
fn lines_split_into_service_chains_and_the_rest() {
    let text = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABCDEFGHIJKLMNOP - [0:0]\n\
                :KUBE-SEP-ABCDEFGHIJKLMNOP - [0:0]\n-A KUBE-SERVICES -j KUBE-SVC-ABCDEFGHIJKLMNOP\n\
                -A KUBE-SVC-ABCDEFGHIJKLMNOP -j KUBE-SEP-ABCDEFGHIJKLMNOP\n-X KUBE-SEP-ABCDEFGHIJKLMNOP\nCOMMIT\n";
    assert_eq!(count_lines(text), Lines { total: 8, service: 4 });
    assert_eq!(foreign_chains(text, &["KUBE-SVC-ABCDEFGHIJKLMNOP".to_string()]), 0);
    assert_eq!(foreign_chains(text, &[]), 1);
}

/// Every chain a rule of the generated cluster's full sync jumps to is
/// declared in the same table (or is a built-in target): otherwise the
/// kernel refuses the whole restore. (A NodePort with both traffic
/// policies Local once jumped to a cluster chain it never declared.)
#[test]
fn every_jump_target_of_a_generated_cluster_is_declared() {
    use crate::plan::context::NodePortFilter;
    use crate::plan::iptables::iptables_context;
    use crate::plan::local::LocalDetector;
    let cluster = Cluster::new(ClusterSpec { services: 1000, endpoints_per_service: 10, nodes: 100, seed: 1 });
    let mut model = Model::new(IpFamily::V4, THIS_NODE);
    for ev in cluster.expect("cluster").initial_events() {
        model.record(&ev).expect("valid object");
    }
    model.apply();
    let mut settings = crate::fixtures::iptables_settings(IpFamily::V4, THIS_NODE, NodePortFilter::All);
    settings.local = LocalDetector::Cidr("10.0.0.0/8".parse().expect("cidr"));
    let text = iptables_plan::dry_run(&model, iptables_context(&settings, model.node(), &crate::bench::local_addrs()));
    // Chains declared per table, then each rule's KUBE- target checked against its table's.
    let mut declared: std::collections::HashMap<&str, std::collections::HashSet<&str>> = Default::default();
    let mut table = "";
    for line in text.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t;
        } else if let Some(d) = line.strip_prefix(':') {
            declared.entry(table).or_default().insert(d.split_whitespace().next().unwrap_or_default());
        }
    }
    let mut missing = Vec::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        for w in words.windows(2).filter(|w| w[0] == "-j" || w[0] == "-g") {
            if w[1].starts_with("KUBE-") && !declared.get(table).is_some_and(|d| d.contains(w[1])) {
                missing.push(line);
            }
        }
    }
    assert!(missing.is_empty(), "{} rules jump to undeclared chains, e.g. {:?}", missing.len(), missing.first());
}
