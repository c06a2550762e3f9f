//! iptables mode's nfacct counters, as upstream's iptables proxier sets them
//! up: the accounting objects `ct_state_invalid_dropped_pkts` (packets the
//! INVALID-state rule drops) and `localhost_nps_accepted_pkts` (packets to
//! NodePorts on 127.0.0.0/8) are created at start, the rules count into
//! the ones that exist (`-m nfacct --nfacct-name ...`), and the metrics read
//! them at each scrape.
//!
//! Upstream decides per counter from the netlink subsystem alone; on a
//! kernel with nfnetlink_acct but without the iptables `nfacct` match
//! (`xt_nfacct`) every restore then fails and the node has no service
//! rules at all (kubernetes/kubernetes#142068). Here the match is tried too
//! ([`IptablesHandle::probe_match`], per family), and whatever fails —
//! no subsystem, no privilege, no match — costs only the counting: one
//! warning, the rules without the match, no metric.

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;

use crate::kernel::iptables::IptablesHandle;
use crate::kernel::nfacct::{NetlinkNfacct, NfacctError};
use crate::kernel::KernelError;
use crate::metrics::{NfacctReadError, NfacctReader};
use crate::net::IpFamily;
use crate::plan::iptables::context::{NFACCT_CT_STATE_INVALID, NFACCT_LOCALHOST_NODEPORTS};
use crate::plan::iptables::HostFeatures;

/// The objects iptables mode counts into.
pub const OBJECTS: [&str; 2] = [NFACCT_CT_STATE_INVALID, NFACCT_LOCALHOST_NODEPORTS];

/// Which counters one family's rules count into.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NfacctRules {
    pub ct_state_invalid: bool,
    pub localhost_node_ports: bool,
}

impl NfacctRules {
    /// `host` with these switches.
    pub fn on(self, host: HostFeatures) -> HostFeatures {
        HostFeatures {
            nfacct_ct_state_invalid: self.ct_state_invalid,
            nfacct_localhost_node_ports: self.localhost_node_ports,
            ..host
        }
    }

    /// The objects these rules name.
    pub fn objects(self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.ct_state_invalid {
            out.push(NFACCT_CT_STATE_INVALID);
        }
        if self.localhost_node_ports {
            out.push(NFACCT_LOCALHOST_NODEPORTS);
        }
        out
    }
}

/// What the start-up found: each object's creation, and for each family
/// whether a rule with the match could be written (not tried when no
/// object exists to name).
#[derive(Debug, Clone, Default)]
pub struct Probe {
    pub objects: Vec<(&'static str, Result<(), NfacctError>)>,
    pub matches: Vec<(IpFamily, Result<(), KernelError>)>,
}

impl Probe {
    /// The objects that exist.
    pub fn ready(&self) -> Vec<&'static str> {
        self.objects.iter().filter(|(_, r)| r.is_ok()).map(|(o, _)| *o).collect()
    }

    /// `family`'s counters: its match works and the object exists.
    pub fn rules(&self, family: IpFamily) -> NfacctRules {
        let matched = self.matches.iter().any(|(f, r)| *f == family && r.is_ok());
        let ready = self.ready();
        NfacctRules {
            ct_state_invalid: matched && ready.contains(&NFACCT_CT_STATE_INVALID),
            localhost_node_ports: matched && ready.contains(&NFACCT_LOCALHOST_NODEPORTS),
        }
    }

    /// The objects some family's rules count into (the metrics served).
    pub fn counted(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for (family, _) in &self.matches {
            for o in self.rules(*family).objects() {
                if !out.contains(&o) {
                    out.push(o);
                }
            }
        }
        out
    }

    /// What to tell the operator, each said once: no object at all (one
    /// line, whatever the reason), an object that could not be created, a
    /// family whose iptables refuses the match.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let failed: Vec<(&str, &NfacctError)> =
            self.objects.iter().filter_map(|(o, r)| r.as_ref().err().map(|e| (*o, e))).collect();
        if !failed.is_empty() && failed.len() == self.objects.len() {
            out.push(format!(
                "nfacct counters unavailable ({}): iptables rules without -m nfacct, no \
                 kubeproxy_iptables_*_packets_total metrics",
                failed[0].1
            ));
        } else {
            for (object, e) in failed {
                out.push(format!("nfacct counter {object} unavailable ({e}): its rules do not count"));
            }
        }
        for (family, r) in &self.matches {
            if let Err(e) = r {
                out.push(format!(
                    "the iptables nfacct match is unusable for {family:?} ({e}): rules without -m nfacct"
                ));
            }
        }
        out
    }
}

/// The daemon's nfacct state: the client (the metrics read the counters
/// with it, the iptables actor recreates objects on full resyncs) and what
/// the start-up found.
#[derive(Debug, Clone, Default)]
pub struct Nfacct {
    pub client: Option<NetlinkNfacct>,
    pub probe: Probe,
}

impl Nfacct {
    /// Reads an object's packet count for the metrics.
    pub fn reader(&self) -> Option<NfacctReader> {
        let client = self.client.clone()?;
        Some(Arc::new(move |object: &'static str| {
            let client = client.clone();
            async move {
                match client.get(object).await {
                    Ok(Some(c)) => Ok(c.packets),
                    Ok(None) => Err(NfacctReadError::Gone(object)),
                    Err(e) => Err(NfacctReadError::Read(Box::new(e))),
                }
            }
            .boxed()
        }))
    }
}

/// At start, in iptables mode: creates the objects (an existing one keeps
/// its counts) and, with one that exists, writes a rule with the match for
/// each of `families` (`try_match`: the daemon's is
/// [`IptablesHandle::probe_match`]). Logs one warning per thing that failed.
pub async fn set_up<F, Fut>(families: &[IpFamily], try_match: F) -> Nfacct
where
    F: Fn(IpFamily, String) -> Fut,
    Fut: Future<Output = Result<(), KernelError>>,
{
    let mut probe = Probe::default();
    let client = match NetlinkNfacct::new() {
        Ok(client) => {
            let results = client.ensure(&OBJECTS).await;
            probe.objects = OBJECTS.iter().copied().zip(results).collect();
            Some(client)
        }
        Err(e) => {
            probe.objects = OBJECTS.iter().map(|o| (*o, Err(e.clone()))).collect();
            None
        }
    };
    if let Some(object) = probe.ready().first() {
        for family in families {
            let r = try_match(*family, format!("-m nfacct --nfacct-name {object}")).await;
            probe.matches.push((*family, r));
        }
    }
    for w in probe.warnings() {
        tracing::warn!("{w}");
    }
    tracing::info!(counted = ?probe.counted(), "nfacct counters");
    Nfacct { client, probe }
}

/// The daemon's match test: a rule in a scratch chain of `family`'s iptables.
pub async fn probe_match(family: IpFamily, matcher: String) -> Result<(), KernelError> {
    IptablesHandle::new(family).probe_match(&matcher).await
}

/// What `--dry-run` shows, touching nothing: an object that exists or that
/// the daemon could create (the subsystem answers: the object or `ENOENT`),
/// and a match the kernel knows or could load (see [`match_known`]).
/// Without privileges (`EPERM`) the subsystem does not answer: no counters.
pub async fn dry_run_rules(family: IpFamily) -> NfacctRules {
    let Ok(client) = NetlinkNfacct::new() else { return NfacctRules::default() };
    let mut usable = Vec::new();
    for object in OBJECTS {
        if client.get(object).await.is_ok() {
            usable.push(object);
        }
    }
    if usable.is_empty() || match_known(family) == Some(false) {
        return NfacctRules::default();
    }
    NfacctRules {
        ct_state_invalid: usable.contains(&NFACCT_CT_STATE_INVALID),
        localhost_node_ports: usable.contains(&NFACCT_LOCALHOST_NODEPORTS),
    }
}

/// Whether the kernel has the `nfacct` match, read-only: `Some(true)` when
/// registered (`/proc/net/ip_tables_matches`) or a module of this kernel
/// (`modules.builtin` / `modules.dep`), `Some(false)` when neither lists it,
/// `None` when the module lists cannot be read (a container without
/// `/lib/modules`): the daemon's probe would then decide.
pub fn match_known(family: IpFamily) -> Option<bool> {
    let proc = match family {
        IpFamily::V4 => "/proc/net/ip_tables_matches",
        IpFamily::V6 => "/proc/net/ip6_tables_matches",
    };
    let registered = std::fs::read_to_string(proc).ok();
    let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    let lists: Vec<Option<String>> = ["modules.builtin", "modules.dep"]
        .iter()
        .map(|f| std::fs::read_to_string(format!("/lib/modules/{release}/{f}")).ok())
        .collect();
    match_listed(registered.as_deref(), &lists)
}

/// [`match_known`]'s decision from what it read.
fn match_listed(registered: Option<&str>, module_lists: &[Option<String>]) -> Option<bool> {
    if registered.is_some_and(|t| t.lines().any(|l| l.trim() == "nfacct")) {
        return Some(true);
    }
    let mut read_any = false;
    for list in module_lists.iter().flatten() {
        read_any = true;
        if list
            .lines()
            .any(|l| l.split(':').next().is_some_and(|m| m.ends_with("/xt_nfacct.ko") || m.contains("/xt_nfacct.ko.")))
        {
            return Some(true);
        }
    }
    read_any.then_some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok<E>() -> Result<(), E> {
        Ok(())
    }

    /// An object the kernel refused, with `e` as the cause.
    fn err(e: &str) -> Result<(), NfacctError> {
        Err(NfacctError::Socket(Arc::new(std::io::Error::other(e.to_string()))))
    }

    /// A match iptables refused with `message`.
    fn refused(message: &str) -> Result<(), KernelError> {
        Err(KernelError::refused("iptables-restore", message))
    }

    fn probe(
        ct: Result<(), NfacctError>,
        lh: Result<(), NfacctError>,
        matches: Vec<(IpFamily, Result<(), KernelError>)>,
    ) -> Probe {
        Probe { objects: vec![(NFACCT_CT_STATE_INVALID, ct), (NFACCT_LOCALHOST_NODEPORTS, lh)], matches }
    }

    const BOTH: NfacctRules = NfacctRules { ct_state_invalid: true, localhost_node_ports: true };

    #[test]
    fn both_objects_and_the_match_count_everything() {
        let p = probe(ok(), ok(), vec![(IpFamily::V4, ok()), (IpFamily::V6, ok())]);
        assert_eq!(p.rules(IpFamily::V4), BOTH);
        assert_eq!(p.rules(IpFamily::V6), BOTH);
        assert_eq!(p.counted(), OBJECTS.to_vec());
        assert!(p.warnings().is_empty());
        let host = p.rules(IpFamily::V4).on(HostFeatures { random_fully: true, ..HostFeatures::default() });
        assert!(host.random_fully && host.nfacct_ct_state_invalid && host.nfacct_localhost_node_ports);
    }

    #[test]
    fn a_kernel_without_nfnetlink_acct_gives_plain_rules_and_one_warning() {
        let e = "nfacct add x: Invalid argument (os error 22)";
        let p = probe(err(e), err(e), Vec::new());
        assert_eq!(p.rules(IpFamily::V4), NfacctRules::default());
        assert!(p.counted().is_empty());
        let w = p.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("Invalid argument") && w[0].contains("without -m nfacct"), "{w:?}");
        let host = p.rules(IpFamily::V4).on(HostFeatures::default());
        assert!(!host.nfacct_ct_state_invalid && !host.nfacct_localhost_node_ports);
    }

    /// kubernetes/kubernetes#142068: nfnetlink_acct without xt_nfacct. Upstream
    /// writes the match and every restore fails; here the rules stay plain.
    #[test]
    fn objects_without_the_iptables_match_give_plain_rules() {
        let p = probe(ok(), ok(), vec![(IpFamily::V4, refused("iptables-restore: line 2 failed"))]);
        assert_eq!(p.rules(IpFamily::V4), NfacctRules::default());
        assert!(p.counted().is_empty(), "no metric for a counter no rule feeds");
        let w = p.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("V4") && w[0].contains("line 2 failed"), "{w:?}");
    }

    #[test]
    fn each_counter_stands_alone() {
        let p = probe(
            ok(),
            err("nfacct add localhost_nps_accepted_pkts: Cannot allocate memory"),
            vec![(IpFamily::V4, ok())],
        );
        assert_eq!(p.rules(IpFamily::V4), NfacctRules { ct_state_invalid: true, localhost_node_ports: false });
        assert_eq!(p.counted(), vec![NFACCT_CT_STATE_INVALID]);
        assert_eq!(p.warnings().len(), 1);
    }

    #[test]
    fn a_family_whose_match_fails_loses_only_its_own_counting() {
        let p = probe(ok(), ok(), vec![(IpFamily::V4, ok()), (IpFamily::V6, refused("ip6tables-restore failed"))]);
        assert_eq!(p.rules(IpFamily::V4), BOTH);
        assert_eq!(p.rules(IpFamily::V6), NfacctRules::default());
        assert_eq!(p.counted(), OBJECTS.to_vec());
    }

    #[test]
    fn the_match_is_known_from_proc_or_the_module_lists() {
        assert_eq!(match_listed(Some("nfacct\nconntrack\n"), &[]), Some(true));
        let dep = Some("kernel/net/netfilter/xt_nfacct.ko.xz: kernel/net/netfilter/nfnetlink_acct.ko.xz\n".into());
        assert_eq!(match_listed(Some("conntrack\n"), &[None, dep]), Some(true));
        let builtin = Some("kernel/net/netfilter/xt_nfacct.ko\n".to_string());
        assert_eq!(match_listed(None, &[builtin, None]), Some(true));
        let without = Some("kernel/net/netfilter/xt_mark.ko:\n".to_string());
        assert_eq!(match_listed(Some("conntrack\n"), &[without, None]), Some(false));
        assert_eq!(match_listed(Some("conntrack\n"), &[None, None]), None, "nothing to tell: the probe decides");
    }
}
