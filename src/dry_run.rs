//! `--dry-run`: a full sync from an empty kernel, planned and printed for
//! each family the node would run (the primary one where the probes fail,
//! e.g. without privileges), from the manifest directory or from one list
//! of the API server. The events go through the proxiers' intake and each
//! mode's planner as the daemon's do ([`Mode::dry_run`]). With `--diff`,
//! what that sync would change on this node instead ([`crate::preview`]).

use std::path::Path;
use std::time::Instant;

use crate::actors::source::kube::{self as api, KubeSourceError};
use crate::actors::source::manifests::ManifestDir;
use crate::config::{ConfigError, KubeProxyConfiguration};
use crate::kernel::addrs;
use crate::kernel::blocking::on_own_thread;
use crate::model::intake::Intake;
use crate::model::{Model, ModelChanges, NodeInfo};
use crate::msgs::SourceEvent;
use crate::net::{IpFamily, LocalAddr};
use crate::plan::conntrack::ConntrackPlanner;
use crate::plan::iptables::HostFeatures;
use crate::preview::FamilyPlan;
use crate::proxier::{for_mode, host_features, ForMode, Mode};
use crate::settings::{self, FamilySettings};
use crate::startup::families::{detect_families, primary_family, Families};
use crate::startup::sources::our_node_object;

/// Why there is no plan to print.
#[derive(Debug, thiserror::Error)]
pub enum DryRunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] KubeSourceError),
    #[error("reading the node's addresses: {0}")]
    Addresses(#[source] std::io::Error),
    #[error("starting a tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// `--dry-run --manifests DIR`: the plan of the directory's objects.
pub fn dry_run(cfg: &KubeProxyConfiguration, manifests: &Path, diff: bool) -> Result<String, DryRunError> {
    let scan = ManifestDir::new(manifests).scan();
    for e in &scan.errors {
        tracing::warn!(error = %e, "skipping manifest file");
    }
    output(cfg, &scan.events, diff)
}

/// `--dry-run` without `--manifests`: lists the objects once from the API
/// server (`--kubeconfig`, `--master` or the in-cluster configuration, as
/// the daemon would connect) and prints the same plan as for the same
/// objects as files.
pub fn dry_run_from_cluster(
    cfg: &KubeProxyConfiguration,
    master: Option<&str>,
    diff: bool,
) -> Result<String, DryRunError> {
    let node_name = cfg.hostname()?;
    let began = Instant::now();
    let events = runtime()?.block_on(async {
        let client = api::client(api::client_config(&cfg.client_connection, master).await?)?;
        api::list_once(client, &node_name).await
    })?;
    tracing::debug!(ms = millis(began), events = events.len(), "dry-run: listed the API server");
    output(cfg, &events, diff)
}

/// Milliseconds since `began`, for the phases' debug lines.
fn millis(began: Instant) -> u64 {
    began.elapsed().as_millis() as u64
}

fn runtime() -> Result<tokio::runtime::Runtime, DryRunError> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(DryRunError::Runtime)
}

/// The plans of `events`, printed, or diffed against the live kernel.
fn output(cfg: &KubeProxyConfiguration, events: &[SourceEvent], diff: bool) -> Result<String, DryRunError> {
    let began = Instant::now();
    let plans = for_mode(cfg.proxy_mode(), Plans { cfg, events })?;
    tracing::debug!(ms = millis(began), "dry-run: planned");
    if diff {
        let began = Instant::now();
        let text = runtime()?.block_on(crate::preview::diff(cfg.proxy_mode(), cfg.ipvs_switch_drain_timeout(), &plans));
        tracing::debug!(ms = millis(began), "dry-run: read the kernel and compared");
        return Ok(text);
    }
    Ok(plans.iter().map(|p| with_heading_suffix(&p.text, &p.suffix)).collect())
}

/// The plan of every family this node runs for `events` (the objects as a
/// source first reports them).
struct Plans<'a> {
    cfg: &'a KubeProxyConfiguration,
    events: &'a [SourceEvent],
}

impl ForMode for Plans<'_> {
    type Output = Result<Vec<FamilyPlan>, DryRunError>;

    fn with<M: Mode>(self) -> Self::Output {
        plans::<M>(self.cfg, self.events)
    }
}

fn plans<M: Mode>(cfg: &KubeProxyConfiguration, events: &[SourceEvent]) -> Result<Vec<FamilyPlan>, DryRunError> {
    let node_name = cfg.hostname()?;
    let node = our_node_object(events, &node_name).map(|n| NodeInfo::from_node(n));
    let families = detect_families(cfg, node.as_ref()).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "planning the primary family anyway");
        Families::single(primary_family(cfg, node.as_ref()))
    });
    let addrs = addrs::local_addrs().map_err(DryRunError::Addresses)?;
    // Once, not once per family, as the daemon does.
    let events = take::<M>(&node_name, events);
    let mut plans = Vec::new();
    for family in families.all() {
        let began = Instant::now();
        let host = host::<M>(cfg, family);
        tracing::debug!(ms = millis(began), ?family, "dry-run: probed the host");
        let settings = settings::derive(cfg, family, &node_name, host);
        let model = model(&settings, &events);
        let text = M::dry_run(&settings, &model, &addrs);
        // The first sync's conntrack reconcile, which `--diff` previews.
        let conntrack = ConntrackPlanner::new(family).plan(&model, &ModelChanges::default(), 1);
        plans.push(FamilyPlan { settings, text, conntrack, suffix: families.suffix(family) });
    }
    Ok(plans)
}

/// What the planners take of the host, read-only: as the daemon, which
/// sets tcpBeLiberal's sysctl when configured and then reads it. The
/// probes run on a thread of their own with a runtime of their own; where
/// that cannot start, the plan takes none of the host's features.
fn host<M: Mode>(cfg: &KubeProxyConfiguration, family: IpFamily) -> HostFeatures {
    let probe = || async { host_features(family, M::dry_run_nfacct(family).await).await };
    let mut host = on_own_thread(probe).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot probe the host: planning without its features");
        HostFeatures::default()
    });
    host.conntrack_tcp_liberal |= cfg.conntrack.tcp_be_liberal;
    host
}

/// `events` as the daemon's proxiers take them ([`Intake`]), what they
/// leave out logged.
fn take<M: Mode>(node_name: &str, events: &[SourceEvent]) -> Vec<SourceEvent> {
    let (events, notices) = Intake::new(node_name, M::SERVICE_SCHEDULERS).take(events.to_vec());
    for n in &notices {
        n.log();
    }
    events
}

/// The model of `events` for `s`'s family.
fn model(s: &FamilySettings, events: &[SourceEvent]) -> Model {
    let mut model = Model::new(s.family, &s.plan.node_name).with_gates(s.model_gates);
    for ev in events {
        if let Err(e) = model.record(ev) {
            tracing::warn!(error = %e, "skipping invalid object");
        }
    }
    model.apply();
    model
}

/// The pure part of `--dry-run`, for tests: `events` (the objects as a
/// source first reports them) planned in `M` for `s`'s family.
pub fn render<M: Mode>(s: &FamilySettings, events: &[SourceEvent], addrs: &[LocalAddr]) -> String {
    M::dry_run(s, &model(s, &take::<M>(&s.plan.node_name, events)), addrs)
}

/// Appends `suffix` to every section heading (`# ipvs` → `# ipvs ipv6`).
pub fn with_heading_suffix(text: &str, suffix: &str) -> String {
    if suffix.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        match line.strip_suffix('\n').filter(|l| SECTION_HEADINGS.iter().any(|h| l == h)) {
            Some(heading) => {
                out.push_str(heading);
                out.push_str(suffix);
                out.push('\n');
            }
            None => out.push_str(line),
        }
    }
    out
}

/// The headings of `--dry-run`'s sections.
const SECTION_HEADINGS: [&str; 5] = ["# ipvs", "# ipset", "# addresses kube-ipvs0", "# iptables", "# nftables"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::coordinator::{IptablesDataplane, IpvsDataplane, NftablesDataplane};
    use crate::fixtures::{applied_service, service};

    fn cfg() -> KubeProxyConfiguration {
        KubeProxyConfiguration::default()
    }

    #[test]
    fn the_secondary_familys_headings_name_it() {
        let text =
            "# ipvs\n-A -t [fd00::1]:80 -s rr\n# ipset\n# addresses kube-ipvs0\nfd00::1\n# iptables\n*nat\nCOMMIT\n";
        assert_eq!(
            with_heading_suffix(text, " ipv6"),
            "# ipvs ipv6\n-A -t [fd00::1]:80 -s rr\n# ipset ipv6\n# addresses kube-ipvs0 ipv6\nfd00::1\n# iptables ipv6\n*nat\nCOMMIT\n"
        );
        assert_eq!(with_heading_suffix(text, ""), text);
    }

    /// As the daemon's proxiers, `--dry-run` plans a nodePort for the
    /// Service that holds it, not for a later one asking for it too.
    #[test]
    fn dry_run_gives_a_held_node_port_to_its_holder_only() {
        let s = settings::derive(&cfg(), IpFamily::V4, "node-a", HostFeatures::default());
        let events = [
            applied_service(service("default", "first", "10.96.0.21", &[("http", "TCP", 80, 30080)])),
            applied_service(service("default", "second", "10.96.0.22", &[("http", "TCP", 80, 30080)])),
        ];
        let text = render::<IptablesDataplane>(&s, &events, &[]);
        let node_ports: Vec<&str> = text.lines().filter(|l| l.contains("--dport 30080")).collect();
        assert!(!node_ports.is_empty(), "{text}");
        assert!(node_ports.iter().all(|l| l.contains("default/first:http")), "{node_ports:#?}");
    }

    /// nftables mode's dry run writes the drop rule of the family's
    /// ServiceCIDRs after the reject rule; iptables and IPVS mode ignore
    /// ServiceCIDRs (upstream's `OnServiceCIDRsChanged` is empty there).
    #[test]
    fn dry_run_drops_unallocated_cluster_ips_of_the_service_cidrs_in_nftables_mode_only() {
        use crate::fixtures::{applied_service, applied_service_cidr, service};
        let s = settings::derive(&cfg(), IpFamily::V4, "node-a", HostFeatures::default());
        let web = applied_service(service("default", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]));
        let cidrs = [
            applied_service_cidr("kubernetes", &["10.96.0.0/16", "fd00:96::/112"]),
            applied_service_cidr("extra", &["10.100.0.0/24"]),
        ];
        let with = [vec![web.clone()], cidrs.to_vec()].concat();
        let text = render::<NftablesDataplane>(&s, &with, &[]);
        let check: Vec<&str> =
            text.lines().filter(|l| l.starts_with("add rule ip kube-proxy cluster-ips-check ")).collect();
        assert_eq!(
            check,
            [
                "add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"",
                "add rule ip kube-proxy cluster-ips-check ip daddr { 10.96.0.0/16,10.100.0.0/24 } drop comment \"Drop traffic to unallocated ClusterIPs\"",
            ],
            "{text}"
        );
        let without = render::<NftablesDataplane>(&s, std::slice::from_ref(&web), &[]);
        assert!(!without.contains("unallocated"), "{without}");
        let plain = render::<IptablesDataplane>(&s, std::slice::from_ref(&web), &[]);
        assert_eq!(render::<IptablesDataplane>(&s, &with, &[]), plain, "iptables mode ignores ServiceCIDRs");
        let plain = render::<IpvsDataplane>(&s, std::slice::from_ref(&web), &[]);
        assert_eq!(render::<IpvsDataplane>(&s, &with, &[]), plain, "IPVS mode ignores ServiceCIDRs");
    }

    #[test]
    fn ipvs_dry_run_inserts_the_jumps_to_its_chains_as_on_an_empty_kernel() {
        use crate::fixtures::{applied_service, service};
        let s = settings::derive(&cfg(), IpFamily::V4, "node-a", HostFeatures::default());
        let events = [applied_service(service("default", "web", "10.96.0.21", &[("http", "TCP", 80, 0)]))];
        let text = render::<IpvsDataplane>(&s, &events, &[]);
        let profile = &crate::plan::ipvs::rules::PROFILE;
        for jump in profile.jumps.iter().chain(profile.kept_jumps) {
            assert!(text.contains(&jump.insert_line()), "{}: {text}", jump.insert_line());
        }
    }

    #[test]
    fn dry_run_prints_a_services_own_scheduler_in_ipvsadm_syntax() {
        use crate::fixtures::{annotated, applied_service, service};
        use crate::model::scheduler::{ANNOTATION_SCHEDULER, ANNOTATION_SCHEDULER_FLAGS};
        let s = settings::derive(&cfg(), IpFamily::V4, "node-a", HostFeatures::default());
        let svc = |name: &str, ip: &str, a: &[(&str, &str)]| {
            applied_service(annotated(service("default", name, ip, &[("http", "TCP", 80, 0)]), a))
        };
        let events = [
            svc("hashed", "10.96.0.21", &[(ANNOTATION_SCHEDULER, "sh"), (ANNOTATION_SCHEDULER_FLAGS, "port")]),
            svc("least", "10.96.0.22", &[(ANNOTATION_SCHEDULER, "lc")]),
            svc("plain", "10.96.0.23", &[]),
            svc("refused", "10.96.0.24", &[(ANNOTATION_SCHEDULER, "fastest")]),
        ];
        let text = render::<IpvsDataplane>(&s, &events, &[]);
        let ipvs: Vec<&str> = text.lines().skip(1).take_while(|l| !l.starts_with('#')).collect();
        assert_eq!(
            ipvs,
            [
                "-A -t 10.96.0.21:80 -s sh -b sh-port",
                "-A -t 10.96.0.22:80 -s lc",
                "-A -t 10.96.0.23:80 -s rr",
                "-A -t 10.96.0.24:80 -s rr",
            ],
            "{text}"
        );
    }
}
