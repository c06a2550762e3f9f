//! Start-up glue: logging, turning the config into planner settings, and
//! `--dry-run`.

use std::io::IsTerminal;
use std::net::IpAddr;
use std::path::Path;

use tracing_subscriber::EnvFilter;

use crate::actors::source::manifests::ManifestDir;
use crate::config::{KubeProxyConfiguration, LocalMode, ProxyMode};
use crate::kernel::addrs;
use crate::model::{Model, NodeInfo};
use crate::msgs::{Change, SourceEvent};
use crate::net::IpFamily;
use crate::plan::context::{plan_context, LocalAddr, PlanSettings};
use crate::plan::iptables::{iptables_context, HostFeatures, IptablesSettings};
use crate::plan::rules_ipvs::{IpvsRulesConfig, LocalDetector};
use crate::plan::{render, IpvsPlanner};

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
    #[error("{0}")]
    Unsupported(String),
}

/// The log filter, swappable at run time (SIGHUP changes the verbosity).
static LOG_FILTER: std::sync::OnceLock<tracing_subscriber::reload::Handle<EnvFilter, tracing_subscriber::Registry>> =
    std::sync::OnceLock::new();

fn filter_for(verbosity: u32) -> EnvFilter {
    let level = match verbosity {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    };
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(format!("warn,kube_proxy_rs={level}")))
}

/// Sets up tracing: klog-style `--v` verbosity (0-1 info, 2-3 debug, 4+ trace
/// for our own logs), `RUST_LOG` overrides, text or JSON lines on stderr.
pub fn init_logging(verbosity: u32, json: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter_for(verbosity));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = if json { fmt.json().boxed() } else { fmt.with_ansi(std::io::stderr().is_terminal()).boxed() };
    // A second init (tests) keeps the first subscriber.
    if tracing_subscriber::registry().with(filter).with(fmt).try_init().is_ok() {
        let _ = LOG_FILTER.set(handle);
    }
}

/// Changes the log verbosity of the running daemon.
pub fn set_verbosity(verbosity: u32) {
    if let Some(h) = LOG_FILTER.get() {
        if let Err(e) = h.reload(filter_for(verbosity)) {
            tracing::warn!(error = %e, "could not change the log verbosity");
        }
    }
}

/// The family this proxy programs: the bind address's if set, else the
/// Node's primary address's, else IPv4.
pub fn primary_family(cfg: &KubeProxyConfiguration, node: Option<&NodeInfo>) -> IpFamily {
    let bind = cfg.bind_address.parse::<IpAddr>().ok().filter(|ip| !ip.is_unspecified());
    bind.or_else(|| node.and_then(|n| n.addresses.first().copied())).map(|ip| IpFamily::of(&ip)).unwrap_or_default()
}

pub fn plan_settings(cfg: &KubeProxyConfiguration, family: IpFamily, node_name: &str) -> PlanSettings {
    PlanSettings {
        family,
        node_name: node_name.to_string(),
        scheduler: cfg.ipvs_scheduler().to_string(),
        node_ports: cfg.node_port_addresses(),
    }
}

/// How pod traffic is recognised, from detectLocalMode (upstream's
/// NewDetectLocalBy*): the family's cluster CIDR, the Node's pod CIDR, a bridge or a prefix.
pub fn local_detector(cfg: &KubeProxyConfiguration, family: IpFamily, node: &NodeInfo) -> LocalDetector {
    let of_family = |nets: Vec<ipnet::IpNet>| nets.into_iter().find(|n| family.matches(&n.addr()));
    match cfg.local_mode() {
        LocalMode::ClusterCidr => of_family(cfg.cluster_cidrs()).map_or(LocalDetector::None, LocalDetector::Cidr),
        LocalMode::NodeCidr => of_family(node.pod_cidrs.clone()).map_or(LocalDetector::None, LocalDetector::Cidr),
        LocalMode::BridgeInterface => LocalDetector::BridgeInterface(cfg.detect_local.bridge_interface.clone()),
        LocalMode::InterfaceNamePrefix => {
            LocalDetector::InterfacePrefix(cfg.detect_local.interface_name_prefix.clone())
        }
    }
}

pub fn rules_config(
    cfg: &KubeProxyConfiguration,
    family: IpFamily,
    node: &NodeInfo,
    random_fully: bool,
) -> IpvsRulesConfig {
    IpvsRulesConfig {
        family,
        masquerade_all: cfg.masquerade_all(),
        masquerade_bit: cfg.masquerade_bit(),
        local: local_detector(cfg, family, node),
        random_fully,
    }
}

/// This node's Node object among source events, if they carry it (the family
/// and node IPs are needed before the coordinator starts).
pub fn our_node(events: &[SourceEvent], node_name: &str) -> Option<NodeInfo> {
    events.iter().find_map(|e| match e {
        SourceEvent::Node(Change::Applied(n)) if n.metadata.name.as_deref() == Some(node_name) => {
            Some(NodeInfo::from_node(n))
        }
        _ => None,
    })
}

/// `--dry-run`: plan a full sync from an empty kernel and render it.
pub fn dry_run(cfg: &KubeProxyConfiguration, manifests: &Path) -> Result<String, StartError> {
    let scan = ManifestDir::new(manifests).scan();
    for e in &scan.errors {
        tracing::warn!(error = %e, "skipping manifest file");
    }
    let node_name = cfg.hostname()?;
    let node = our_node(&scan.events, &node_name);
    let family = primary_family(cfg, node.as_ref());
    let addrs = addrs::local_addrs().map_err(StartError::Addresses)?;
    Ok(render_dry_run(
        cfg,
        family,
        &node_name,
        &scan.events,
        &addrs,
        crate::kernel::iptables::IptablesHandle::new(family).random_fully(),
    ))
}

/// The pure part of `--dry-run`, for tests.
pub fn render_dry_run(
    cfg: &KubeProxyConfiguration,
    family: IpFamily,
    node_name: &str,
    events: &[SourceEvent],
    addrs: &[LocalAddr],
    random_fully: bool,
) -> String {
    let mut model = Model::new(family, node_name);
    for ev in events {
        if let Err(e) = model.record(ev) {
            tracing::warn!(error = %e, "skipping invalid object");
        }
    }
    model.apply();
    match cfg.proxy_mode() {
        ProxyMode::Ipvs => {
            let settings = plan_settings(cfg, family, node_name);
            let mut planner = IpvsPlanner::new(plan_context(&settings, model.node(), addrs));
            let ports: Vec<_> = model.service_ports().map(|sp| sp.name.clone()).collect();
            planner.update(&model, &ports);
            let rules = planner.rules(&rules_config(cfg, family, model.node(), random_fully));
            render::ipvs_mode(&planner.desired(), family, &rules)
        }
        ProxyMode::Iptables => {
            let local = local_detector(cfg, family, model.node());
            let host = HostFeatures { random_fully, ..HostFeatures::default() };
            let settings = IptablesSettings::from_config(cfg, family, node_name, local, host);
            let ctx = iptables_context(&settings, model.node(), addrs);
            let text = crate::plan::iptables::dry_run(&model, ctx);
            let text = crate::kernel::iptables::restore_input_on_empty_kernel(&crate::plan::iptables::PROFILE, &text);
            format!("# iptables\n{text}")
        }
        ProxyMode::Nftables => "# nftables mode is not supported\n".to_string(),
    }
}
