//! Start-up glue: which IP families run, and `--dry-run`.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use crate::actors::source::manifests::ManifestDir;
use crate::config::{KubeProxyConfiguration, ProxyMode};
use crate::kernel::addrs;
use crate::model::{Model, ModelChanges, NodeInfo};
use crate::msgs::{Change, SourceEvent};
use crate::net::IpFamily;
use crate::plan::conntrack::ConntrackPlanner;
use crate::plan::context::{plan_context, LocalAddr};
use crate::plan::iptables::{iptables_context, HostFeatures};
use crate::plan::{render, IpvsPlanner};
use crate::preview::FamilyPlan;
use crate::settings::{self, FamilySettings};

/// Errors that stop the daemon before it starts.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("reading manifests: {0}")]
    Manifests(#[from] crate::actors::source::manifests::ManifestError),
    #[error("reading the node's addresses: {0}")]
    Addresses(#[source] std::io::Error),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] crate::actors::source::kube::KubeSourceError),
    #[error(transparent)]
    Instance(#[from] crate::instance::InstanceError),
    #[error("--manifests {}: {source}", dir.display())]
    ManifestDir {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Ipvs(#[source] crate::kernel::ipvs::netlink::IpvsError),
    #[error("conntrack: {0}")]
    Conntrack(#[source] crate::kernel::conntrack::ConntrackError),
    /// A kernel setting or socket the mode needs.
    #[error("{0}")]
    Kernel(#[source] crate::kernel::KernelError),
    #[error("watching signals: {0}")]
    Signals(#[source] nix::Error),
    #[error("starting the HTTP servers: {0}")]
    Http(#[source] crate::http::HttpError),
    #[error("writing {}: {source}", path.display())]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no support for primary IP family {family}: {source}")]
    PrimaryFamily {
        family: &'static str,
        #[source]
        source: FamilyUnsupported,
    },
    #[error("nf_tables netlink socket: {0}")]
    Nftables(#[source] std::io::Error),
    /// Flags that do not go together.
    #[error("{0}")]
    Usage(&'static str),
    /// `--cleanup` could not remove everything (each part's error).
    #[error("cleanup incomplete: {}", .0.join("; "))]
    Cleanup(Vec<String>),
    /// Upstream's conntrack settings could not be applied.
    #[error(transparent)]
    ConntrackSetup(#[from] crate::startup::conntrack::ConntrackSetupError),
    /// `--init-only`'s set-up failed.
    #[error(transparent)]
    Init(#[from] crate::startup::init_only::InitError),
}

/// The family this proxy programs: the bind address's if set, else the
/// Node's primary address's, else IPv4.
pub fn primary_family(cfg: &KubeProxyConfiguration, node: Option<&NodeInfo>) -> IpFamily {
    bind_ip(cfg)
        .or_else(|| node.and_then(|n| n.addresses.first().copied()))
        .map(|ip| IpFamily::of(&ip))
        .unwrap_or_default()
}

/// Warns of a value skipped inside an object (the daemon and `--dry-run`).
pub fn warn_ignored_value(v: &crate::model::notice::IgnoredValue) {
    tracing::warn!(kind = v.kind, object = %v.object, field = v.value.field, reason = %v.value.detail(), "ignoring a value");
}

/// The families this daemon runs a proxier for: the primary one, and the
/// other one where the node can do both (upstream's metaproxier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Families {
    pub primary: IpFamily,
    pub secondary: Option<IpFamily>,
}

impl Families {
    pub fn single(primary: IpFamily) -> Families {
        Families { primary, secondary: None }
    }

    pub fn dual(primary: IpFamily) -> Families {
        Families { primary, secondary: Some(primary.other()) }
    }

    /// The primary family first.
    pub fn all(&self) -> impl Iterator<Item = IpFamily> {
        std::iter::once(self.primary).chain(self.secondary)
    }

    pub fn is_dual(&self) -> bool {
        self.secondary.is_some()
    }

    /// What names of `family`'s `--dry-run` sections and actors end with:
    /// nothing for the primary family, ` ipv6` (or ` ipv4`) for the
    /// secondary one, so single-stack names stay as they always were.
    pub fn suffix(&self, family: IpFamily) -> String {
        if family == self.primary {
            String::new()
        } else {
            format!(" {}", family.lower())
        }
    }
}

/// Why `family` cannot be proxied on this node in `mode`, if it cannot: the
/// kernel has it off (IPv6), or the mode's tool does not work for it
/// (iptables and IPVS mode: its iptables; nftables mode: nf_tables, probed
/// by a dump of the family's `kube-proxy` chains, as upstream tries nft).
pub fn family_support(family: IpFamily, mode: ProxyMode) -> Result<(), FamilyUnsupported> {
    if family == IpFamily::V6 {
        if !Path::new("/proc/net/if_inet6").exists() {
            return Err(FamilyUnsupported::Kernel("/proc/net/if_inet6 is missing".into()));
        }
        let disabled =
            std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6").is_ok_and(|v| v.trim() == "1");
        if disabled {
            return Err(FamilyUnsupported::Kernel("net.ipv6.conf.all.disable_ipv6 is 1".into()));
        }
    }
    match mode {
        ProxyMode::Nftables => {
            crate::kernel::nftables::probe(family, "kube-proxy").map_err(|e| FamilyUnsupported::Nftables(e.to_string()))
        }
        ProxyMode::Iptables | ProxyMode::Ipvs => {
            crate::kernel::iptables::present(family).map_err(FamilyUnsupported::Iptables)
        }
    }
}

/// Why a family cannot be proxied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FamilyUnsupported {
    /// Upstream's "No kernel support for family".
    #[error("no kernel support: {0}")]
    Kernel(String),
    /// Upstream's "No iptables support for family".
    #[error("no iptables support: {0}")]
    Iptables(String),
    /// Upstream's "No nftables support for family".
    #[error("no nftables support: {0}")]
    Nftables(String),
}

/// Upstream's platform check, pure: the primary family must work (else the
/// daemon cannot start); the secondary one runs where it works too, and
/// otherwise the daemon runs single-stack, saying why. nodePortAddresses of
/// a family that does not run are ignored, with upstream's message.
pub fn choose_families(
    cfg: &KubeProxyConfiguration,
    primary: IpFamily,
    primary_ok: Result<(), FamilyUnsupported>,
    secondary_ok: Result<(), FamilyUnsupported>,
) -> Result<Families, StartError> {
    let label = crate::net::ip_family_label;
    if let Err(e) = primary_ok {
        return Err(StartError::PrimaryFamily { family: label(primary), source: e });
    }
    let secondary = primary.other();
    match secondary_ok {
        Ok(()) => {
            tracing::info!(primary_ip_family = label(primary), "kube-proxy running in dual-stack mode");
            Ok(Families::dual(primary))
        }
        Err(e) => {
            match &e {
                FamilyUnsupported::Kernel(why) => {
                    tracing::info!(ip_family = label(secondary), reason = %why, "No kernel support for family")
                }
                FamilyUnsupported::Iptables(why) => {
                    tracing::info!(ip_family = label(secondary), error = %why, "No iptables support for family")
                }
                FamilyUnsupported::Nftables(why) => {
                    tracing::info!(ip_family = label(secondary), error = %why, "No nftables support for family")
                }
            }
            tracing::info!(ip_family = label(primary), "kube-proxy running in single-stack mode");
            let wrong: Vec<String> = match cfg.node_port_addresses() {
                crate::config::NodePortAddresses::Cidrs(nets) => {
                    nets.iter().filter(|n| secondary.matches(&n.addr())).map(|n| n.to_string()).collect()
                }
                _ => Vec::new(),
            };
            if !wrong.is_empty() {
                tracing::info!(
                    ip_family = label(secondary),
                    addresses = %wrong.join(","),
                    "Ignoring --nodeport-addresses of the wrong family"
                );
            }
            Ok(Families::single(primary))
        }
    }
}

/// The families to run on this node (probes iptables and the kernel).
pub fn detect_families(cfg: &KubeProxyConfiguration, node: Option<&NodeInfo>) -> Result<Families, StartError> {
    let primary = primary_family(cfg, node);
    let mode = cfg.proxy_mode();
    choose_families(cfg, primary, family_support(primary, mode), family_support(primary.other(), mode))
}

/// This node's Node among source events, if they carry it (the family
/// and node IPs are needed before the coordinator starts).
pub fn our_node(events: &[SourceEvent], node_name: &str) -> Option<NodeInfo> {
    our_node_object(events, node_name).map(|n| NodeInfo::from_node(n))
}

/// This node's Node object among source events, as the source sent it.
pub fn our_node_object<'a>(events: &'a [SourceEvent], node_name: &str) -> Option<&'a Arc<Node>> {
    events.iter().find_map(|e| match e {
        SourceEvent::Node(Change::Applied(n)) if n.metadata.name.as_deref() == Some(node_name) => Some(n),
        _ => None,
    })
}

/// Whether the primary family is IPv4 for want of anything better: no
/// bind address and no Node address (upstream's detectNodeIPs then assumes
/// loopback node IPs).
pub fn primary_family_is_a_fallback(cfg: &KubeProxyConfiguration, node: Option<&NodeInfo>) -> bool {
    bind_ip(cfg).is_none() && node.is_none_or(|n| n.addresses.is_empty())
}

/// `bindAddress` unless unspecified (`0.0.0.0`, `::`).
fn bind_ip(cfg: &KubeProxyConfiguration) -> Option<std::net::IpAddr> {
    crate::net::parse_ip_sloppy(&cfg.bind_address).filter(|ip| !ip.is_unspecified())
}

/// `--manifests DIR` must name a readable directory: checked at start,
/// before anything touches the node.
pub fn check_manifest_dir(dir: &Path) -> Result<(), StartError> {
    let bad = |source: std::io::Error| StartError::ManifestDir { dir: dir.to_path_buf(), source };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => std::fs::read_dir(dir).map(|_| ()).map_err(bad),
        Ok(_) => Err(bad(std::io::Error::other("not a directory"))),
        Err(e) => Err(bad(e)),
    }
}

/// `--dry-run`: plan a full sync from an empty kernel and render it, for
/// each family the node would run (the primary one where the probes fail,
/// e.g. without privileges). With `diff`, what that sync would change on
/// this node instead ([`crate::preview`]).
pub fn dry_run(cfg: &KubeProxyConfiguration, manifests: &Path, diff: bool) -> Result<String, StartError> {
    let scan = ManifestDir::new(manifests).scan();
    for e in &scan.errors {
        tracing::warn!(error = %e, "skipping manifest file");
    }
    dry_run_output(cfg, &scan.events, diff)
}

/// `--dry-run` without `--manifests`: lists the objects once from the API
/// server (`--kubeconfig`, `--master` or the in-cluster configuration, as
/// the daemon would connect) and prints the same plan as for the same
/// objects as files.
pub fn dry_run_from_cluster(
    cfg: &KubeProxyConfiguration,
    master: Option<&str>,
    diff: bool,
) -> Result<String, StartError> {
    use crate::actors::source::kube as api;
    let node_name = cfg.hostname()?;
    let events = dry_run_runtime()?.block_on(async {
        let client = api::client(api::client_config(&cfg.client_connection, master).await?)?;
        api::list_once(client, &node_name).await
    })?;
    dry_run_output(cfg, &events, diff)
}

fn dry_run_runtime() -> Result<tokio::runtime::Runtime, StartError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| StartError::Write { path: "tokio runtime".into(), source })
}

/// The plans of `events`, printed, or diffed against the live kernel.
fn dry_run_output(cfg: &KubeProxyConfiguration, events: &[SourceEvent], diff: bool) -> Result<String, StartError> {
    let plans = dry_run_events(cfg, events)?;
    if diff {
        return Ok(dry_run_runtime()?.block_on(crate::preview::diff(cfg.proxy_mode(), &plans)));
    }
    Ok(plans.iter().map(|p| with_heading_suffix(&p.text, &p.suffix)).collect())
}

/// The plan of every family this node runs for `events` (the objects as a
/// source first reports them).
fn dry_run_events(cfg: &KubeProxyConfiguration, events: &[SourceEvent]) -> Result<Vec<FamilyPlan>, StartError> {
    let node_name = cfg.hostname()?;
    let node = our_node(events, &node_name);
    let families = detect_families(cfg, node.as_ref()).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "planning the primary family anyway");
        Families::single(primary_family(cfg, node.as_ref()))
    });
    let addrs = addrs::local_addrs().map_err(StartError::Addresses)?;
    // Said once, not once per family, as the daemon does.
    for v in events.iter().flat_map(|ev| crate::model::notice::ignored_values(ev, &node_name)) {
        warn_ignored_value(&v);
    }
    let refused = events.iter().filter_map(crate::model::notice::ipvs_scheduler_refused);
    for n in refused.filter(|_| cfg.proxy_mode() == ProxyMode::Ipvs) {
        tracing::warn!(kind = n.kind, object = %n.object, reason = %n.detail, "refusing a Service's IPVS scheduler");
    }
    let mut plans = Vec::new();
    for family in families.all() {
        let probe = || async { crate::kernel::iptables::IptablesHandle::new(family).random_fully().await };
        let random_fully = crate::kernel::blocking::on_own_thread(probe).unwrap_or(false);
        let nfacct = match cfg.proxy_mode() {
            ProxyMode::Iptables => dry_run_nfacct(family),
            ProxyMode::Ipvs | ProxyMode::Nftables => crate::nfacct::NfacctRules::default(),
        };
        // As the daemon: it sets the sysctl when configured, then reads it.
        let liberal = cfg.conntrack.tcp_be_liberal
            || crate::kernel::sysctl::is_on(crate::plan::iptables::context::SYSCTL_TCP_BE_LIBERAL);
        let host = nfacct.on(HostFeatures { random_fully, conntrack_tcp_liberal: liberal, ..HostFeatures::default() });
        let settings = settings::derive(cfg, family, &node_name, host);
        let model = dry_run_model(&settings, events);
        let text = render_model(&settings, cfg.proxy_mode(), &model, &addrs);
        // The first sync's conntrack reconcile, which `--diff` previews.
        let conntrack = ConntrackPlanner::new(family).plan(&model, &ModelChanges::default(), 1);
        plans.push(FamilyPlan { settings, text, conntrack, suffix: families.suffix(family) });
    }
    Ok(plans)
}

/// The nfacct counters iptables mode's rules would name on this host
/// ([`crate::nfacct::dry_run_rules`]: read-only); none when that cannot be
/// asked (no runtime).
fn dry_run_nfacct(family: IpFamily) -> crate::nfacct::NfacctRules {
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt.block_on(crate::nfacct::dry_run_rules(family)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot probe the nfacct counters: planning without them");
            crate::nfacct::NfacctRules::default()
        }
    }
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

/// The pure part of `--dry-run`, for tests.
pub fn render_dry_run(s: &FamilySettings, mode: ProxyMode, events: &[SourceEvent], addrs: &[LocalAddr]) -> String {
    render_model(s, mode, &dry_run_model(s, events), addrs)
}

/// The model of `events` (the objects as a source first reports them) for
/// `s`'s family.
fn dry_run_model(s: &FamilySettings, events: &[SourceEvent]) -> Model {
    let mut model = Model::new(s.family, &s.plan.node_name).with_gates(s.model_gates);
    for ev in events {
        if let Err(e) = model.record(ev) {
            tracing::warn!(error = %e, "skipping invalid object");
        }
    }
    model.apply();
    model
}

/// `--dry-run`'s text for `model`: the kernel state a first sync programs.
fn render_model(s: &FamilySettings, mode: ProxyMode, model: &Model, addrs: &[LocalAddr]) -> String {
    match mode {
        ProxyMode::Ipvs => {
            let mut planner = IpvsPlanner::new(plan_context(&s.plan, model.node(), addrs));
            let ports: Vec<_> = model.service_ports().map(|sp| sp.name.clone()).collect();
            planner.update(model, &ports);
            let rules = planner.rules(&s.rules_config(model.node()));
            render::ipvs_mode(&planner.desired(), s.family, &rules)
        }
        ProxyMode::Iptables => {
            let ctx = iptables_context(&s.iptables_settings(model.node()), model.node(), addrs);
            let text = crate::plan::iptables::dry_run(model, ctx);
            let text = crate::kernel::iptables::restore_input_on_empty_kernel(&crate::plan::iptables::PROFILE, &text);
            format!("# iptables\n{text}")
        }
        ProxyMode::Nftables => {
            let settings = s.nftables_settings(model.node(), model.service_cidrs());
            let ctx = crate::plan::nftables::nftables_context(&settings, model.node(), addrs);
            format!("# nftables\n{}", crate::plan::nftables::dry_run(model, &ctx))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodePortAddresses;

    fn cfg(node_port_addresses: &[&str]) -> KubeProxyConfiguration {
        KubeProxyConfiguration {
            node_port_addresses: node_port_addresses.iter().map(|s| s.to_string()).collect(),
            ..KubeProxyConfiguration::default()
        }
    }

    #[test]
    fn both_families_run_where_both_work_else_the_primary_alone() {
        let c = cfg(&[]);
        let ok = || Ok(());
        assert_eq!(choose_families(&c, IpFamily::V4, ok(), ok()).unwrap(), Families::dual(IpFamily::V4));
        assert_eq!(choose_families(&c, IpFamily::V6, ok(), ok()).unwrap().secondary, Some(IpFamily::V4));
        let no_v6 = Err(FamilyUnsupported::Kernel("net.ipv6.conf.all.disable_ipv6 is 1".into()));
        assert_eq!(choose_families(&c, IpFamily::V4, ok(), no_v6).unwrap(), Families::single(IpFamily::V4));
        let no_ipt = || Err(FamilyUnsupported::Iptables("ip6tables: not found".into()));
        assert_eq!(choose_families(&c, IpFamily::V4, ok(), no_ipt()).unwrap(), Families::single(IpFamily::V4));
        let err = choose_families(&c, IpFamily::V6, no_ipt(), ok()).unwrap_err().to_string();
        assert_eq!(err, "no support for primary IP family IPv6: no iptables support: ip6tables: not found");
    }

    #[test]
    fn ipv4_is_a_fallback_only_without_bind_address_and_node_addresses() {
        let node = |ips: &[&str]| NodeInfo {
            addresses: ips.iter().map(|i| i.parse().unwrap()).collect(),
            ..NodeInfo::default()
        };
        let mut c = cfg(&[]);
        assert!(primary_family_is_a_fallback(&c, None));
        assert!(primary_family_is_a_fallback(&c, Some(&node(&[]))));
        assert!(!primary_family_is_a_fallback(&c, Some(&node(&["fd00::5"]))));
        assert_eq!(primary_family(&c, Some(&node(&["fd00::5"]))), IpFamily::V6);
        c.bind_address = "0.0.0.0".into();
        assert!(primary_family_is_a_fallback(&c, None), "unspecified is no bind address");
        c.bind_address = "fd00::7".into();
        assert!(!primary_family_is_a_fallback(&c, None));
        assert_eq!(primary_family(&c, None), IpFamily::V6);
    }

    #[test]
    fn node_port_addresses_are_split_by_family() {
        let c = cfg(&["10.0.0.0/8", "fd00::/64"]);
        let cidrs = |f| match c.node_port_addresses_for(f) {
            NodePortAddresses::Cidrs(n) => n.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert_eq!(cidrs(IpFamily::V4), ["10.0.0.0/8"]);
        assert_eq!(cidrs(IpFamily::V6), ["fd00::/64"]);
        // No CIDR of a family: every address of it (upstream's zero CIDR).
        let c = cfg(&["10.0.0.0/8"]);
        assert_eq!(c.node_port_addresses_for(IpFamily::V6), NodePortAddresses::All);
    }

    #[test]
    fn the_secondary_familys_headings_name_it() {
        let families = Families::dual(IpFamily::V4);
        assert_eq!(families.suffix(IpFamily::V4), "");
        assert_eq!(families.suffix(IpFamily::V6), " ipv6");
        assert_eq!(Families::dual(IpFamily::V6).suffix(IpFamily::V4), " ipv4");
        let text =
            "# ipvs\n-A -t [fd00::1]:80 -s rr\n# ipset\n# addresses kube-ipvs0\nfd00::1\n# iptables\n*nat\nCOMMIT\n";
        assert_eq!(
            with_heading_suffix(text, " ipv6"),
            "# ipvs ipv6\n-A -t [fd00::1]:80 -s rr\n# ipset ipv6\n# addresses kube-ipvs0 ipv6\nfd00::1\n# iptables ipv6\n*nat\nCOMMIT\n"
        );
        assert_eq!(with_heading_suffix(text, ""), text);
    }

    /// nftables mode's dry run writes the drop rule of the family's
    /// ServiceCIDRs after the reject rule; iptables and IPVS mode ignore
    /// ServiceCIDRs (upstream's `OnServiceCIDRsChanged` is empty there).
    #[test]
    fn dry_run_drops_unallocated_cluster_ips_of_the_service_cidrs_in_nftables_mode_only() {
        use crate::fixtures::{applied_service, applied_service_cidr, service};
        let s = settings::derive(&cfg(&[]), IpFamily::V4, "node-a", HostFeatures::default());
        let web = applied_service(service("default", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]));
        let cidrs = [
            applied_service_cidr("kubernetes", &["10.96.0.0/16", "fd00:96::/112"]),
            applied_service_cidr("extra", &["10.100.0.0/24"]),
        ];
        let with = [vec![web.clone()], cidrs.to_vec()].concat();
        let text = render_dry_run(&s, ProxyMode::Nftables, &with, &[]);
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
        let without = render_dry_run(&s, ProxyMode::Nftables, std::slice::from_ref(&web), &[]);
        assert!(!without.contains("unallocated"), "{without}");
        for mode in [ProxyMode::Iptables, ProxyMode::Ipvs] {
            let plain = render_dry_run(&s, mode, std::slice::from_ref(&web), &[]);
            assert_eq!(render_dry_run(&s, mode, &with, &[]), plain, "{mode:?} ignores ServiceCIDRs");
        }
    }

    /// The daemon's context builder takes the model's ServiceCIDRs into the
    /// planner's context, the family's alone.
    #[test]
    fn the_nftables_context_holds_the_models_service_cidrs_of_its_family() {
        use crate::fixtures::applied_service_cidr;
        for (family, want) in [(IpFamily::V4, "10.96.0.0/16"), (IpFamily::V6, "fd00:96::/112")] {
            let s = settings::derive(&cfg(&[]), family, "node-a", HostFeatures::default());
            let mut model = Model::new(family, "node-a");
            model.record(&applied_service_cidr("kubernetes", &["10.96.0.0/16", "fd00:96::/112"])).unwrap();
            let build = crate::runtime::nft_context_builder(&s);
            assert!(build(model.node(), model.service_cidrs(), &[]).service_cidrs.is_empty(), "not before apply");
            model.apply();
            let ctx = build(model.node(), model.service_cidrs(), &[]);
            assert_eq!(ctx.service_cidrs, [want.parse::<ipnet::IpNet>().unwrap()]);
        }
    }

    #[test]
    fn dry_run_prints_a_services_own_scheduler_in_ipvsadm_syntax() {
        use crate::fixtures::{annotated, applied_service, service};
        use crate::model::scheduler::{ANNOTATION_SCHEDULER, ANNOTATION_SCHEDULER_FLAGS};
        let s = settings::derive(&cfg(&[]), IpFamily::V4, "node-a", HostFeatures::default());
        let svc = |name: &str, ip: &str, a: &[(&str, &str)]| {
            applied_service(annotated(service("default", name, ip, &[("http", "TCP", 80, 0)]), a))
        };
        let events = [
            svc("hashed", "10.96.0.21", &[(ANNOTATION_SCHEDULER, "sh"), (ANNOTATION_SCHEDULER_FLAGS, "port")]),
            svc("least", "10.96.0.22", &[(ANNOTATION_SCHEDULER, "lc")]),
            svc("plain", "10.96.0.23", &[]),
            svc("refused", "10.96.0.24", &[(ANNOTATION_SCHEDULER, "fastest")]),
        ];
        let text = render_dry_run(&s, ProxyMode::Ipvs, &events, &[]);
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
