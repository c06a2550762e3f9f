//! `--dry-run --diff`: the migration preview. Reads this node's live kernel
//! state, read-only (IPVS, the ipsets, kube-ipvs0's addresses, iptables of
//! both backends), and prints what the first sync of the chosen mode would
//! change, per section and family, in each tool's syntax with `+`/`-`
//! lines and a summary ([`diff`] compares; this module reads).
//!
//! - The plan is `--dry-run`'s own output (a full sync from an empty
//!   kernel). Sections of the other mode are planned empty when the node
//!   holds that mode's chains (the daemon would clean it up, as upstream's
//!   CleanupLeftovers); otherwise they are left as they are and only noted.
//! - iptables rules are compared in `iptables-save`'s syntax: the planned
//!   input is loaded with the node's own `iptables-restore` into a private
//!   network namespace (its sets and nfacct objects created there first)
//!   and saved back, so both sides are printed by the same tool. The node's
//!   own namespace is only read. Where that cannot be done (no privilege to
//!   make a namespace) the planned text is compared as it is, with a note.
//! - The backend `iptables` does not use is read too: rules of ours there
//!   are named (the daemon would not touch them; both would be active).
//! - nftables mode's table is compared as `nft list table` prints it: the
//!   planned text loaded with `nft -f` into a private network namespace and
//!   listed back, one line per chain, rule, set and element
//!   ([`diff::nft_listing_lines`]). In the other modes a table of ours
//!   that the daemon would delete is listed as removed.
//! - A node holding another mode's state gets the switch's steps first
//!   (`# mode switch`: the new mode's first sync, then each removal;
//!   [`crate::plan::switch`]).
//! - In every mode, the live UDP conntrack entries the first sync's
//!   reconcile would delete ([`FamilyPlan::conntrack`]) are listed as
//!   removed, in `conntrack -L`'s words; the family's other UDP entries
//!   count as kept.

pub mod diff;
mod scratch;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::future::join_all;

use crate::config::ProxyMode;
use crate::kernel::conntrack::codec::Entry;
use crate::kernel::conntrack::filter::is_stale;
use crate::kernel::conntrack::NetlinkConntrack;
use crate::kernel::iptables::chains::{is_service_chain, ChainProfile, CANARY, IPTABLES_PROFILE, IPVS_PROFILE};
use crate::kernel::iptables::IptablesBinaries;
use crate::kernel::ipvs::netlink::{IpvsError, NetlinkIpvs};
use crate::kernel::ipvs::services_agreed;
use crate::kernel::link::DummyLink;
use crate::kernel::tool;
use crate::kernel::LinkKernel;
use crate::msgs::link::DUMMY_LINK;
use crate::msgs::VsKey;
use crate::msgs::{IpvsOp, ReconcileConntrack};
use crate::net::{IpFamily, Protocol};
use crate::plan::ipvs::IpvsSet;
use crate::plan::nftables::names::TABLE as NFT_TABLE;
use crate::plan::nftables::ruleset::nft_family;
use crate::plan::switch::{drain_round, switch_steps, Found, SwitchStep};
use crate::settings::FamilySettings;

use self::diff::{SectionDiff, Tables};
use self::scratch::ScratchError;

/// Why a live object could not be read.
#[derive(Debug, thiserror::Error)]
enum LiveReadError {
    #[error(transparent)]
    Tool(#[from] crate::kernel::KernelError),
    /// The tool ran and refused: its message.
    #[error("{0}")]
    Refused(String),
}

/// One family's plan: its settings and its `--dry-run` text (unsuffixed headings).
pub struct FamilyPlan {
    pub settings: FamilySettings,
    pub text: String,
    /// The first sync's conntrack reconcile (none without a UDP Service
    /// with serving endpoints).
    pub conntrack: Option<ReconcileConntrack>,
    /// Appended to the headings (`" ipv6"` for a dual-stack node's secondary family).
    pub suffix: String,
}

/// The preview of every family's first sync in `mode`, after the steps of
/// a mode switch when the node holds another mode's state (IPVS mode's
/// drain limited to `drain_timeout`, with the virtual servers it would
/// wait for now).
pub async fn diff(mode: ProxyMode, drain_timeout: Option<Duration>, plans: &[FamilyPlan]) -> String {
    // The families at once: each one's reads wait on tools and the kernel.
    let families = join_all(plans.iter().map(|p| family_preview(mode, drain_timeout, p))).await;
    let steps: String = families.iter().map(|(steps, _)| steps.as_str()).collect();
    let sections: Vec<SectionDiff> = families.into_iter().flat_map(|(_, sections)| sections).collect();
    format!("{steps}{}", diff::render(&sections))
}

/// One family's switch steps (as text) and its sections.
async fn family_preview(
    mode: ProxyMode,
    drain_timeout: Option<Duration>,
    p: &FamilyPlan,
) -> (String, Vec<SectionDiff>) {
    let family = p.settings.family;
    let found = timed("found the other modes", crate::cleanup::find_other_modes(mode, family)).await;
    let switch = switch_steps(mode, found, drain_timeout);
    let draining = if switch.iter().any(|s| matches!(s, SwitchStep::DrainIpvs { .. })) {
        crate::cleanup::ipvs_connections(family).await
    } else {
        Vec::new()
    };
    (switch_text(&switch, &draining, &p.suffix), family_diff(mode, p, found).await)
}

/// Virtual servers with connections listed under the drain step, at most.
const DRAINING_LISTED: usize = 20;

/// A switch's steps under a `# mode switch` heading (nothing without a
/// switch); under the drain step, what it would wait for now: `draining`,
/// IPVS mode's virtual servers with their connections.
fn switch_text(steps: &[SwitchStep], draining: &[(VsKey, u64)], suffix: &str) -> String {
    if steps.is_empty() {
        return String::new();
    }
    let mut lines = String::new();
    for step in steps {
        lines.push_str(&format!("{step}\n"));
        if matches!(step, SwitchStep::DrainIpvs { .. }) {
            lines.push_str(&drain_now_text(draining));
        }
    }
    format!("# mode switch{suffix}\n{lines}\n")
}

/// The drain as it would start now: the virtual servers that go at once
/// and those that wait, with their connections.
fn drain_now_text(servers: &[(VsKey, u64)]) -> String {
    let round = drain_round(servers, Duration::ZERO, None);
    let mut text = format!(
        "  now: {} virtual servers without connections go at once; {} wait for {} connections\n",
        round.delete.len(),
        round.remaining_servers,
        round.remaining_connections
    );
    for (vs, connections) in servers.iter().filter(|(_, c)| *c > 0).take(DRAINING_LISTED) {
        text.push_str(&format!("  drains: {vs} ({connections} connections)\n"));
    }
    if round.remaining_servers > DRAINING_LISTED {
        text.push_str(&format!("  drains: ... and {} more\n", round.remaining_servers - DRAINING_LISTED));
    }
    text
}

/// The lines of section `heading` of a `--dry-run` text.
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    let mut lines = text.lines().skip_while(|l| *l != heading);
    if lines.next().is_none() {
        return Vec::new();
    }
    lines.take_while(|l| !l.starts_with("# ")).collect()
}

/// The profile of `mode`'s iptables chains, and the other mode's.
fn profiles(mode: ProxyMode) -> (&'static ChainProfile, Option<&'static ChainProfile>) {
    match mode {
        ProxyMode::Ipvs => (&IPVS_PROFILE, Some(&IPTABLES_PROFILE)),
        ProxyMode::Iptables => (&IPTABLES_PROFILE, Some(&IPVS_PROFILE)),
        ProxyMode::Nftables => (&IPTABLES_PROFILE, None),
    }
}

/// The family's sections; `found` is what the other modes left (read once,
/// for the switch's steps): it says whether the first sync cleans one up.
async fn family_diff(mode: ProxyMode, p: &FamilyPlan, found: Found) -> Vec<SectionDiff> {
    let heading = |h: &str| format!("{h}{}", p.suffix);
    if mode == ProxyMode::Nftables {
        let note = "iptables and IPVS mode's leftovers, which the daemon removes when their chains are there, are not previewed";
        let (nft, conntrack) = futures::join!(
            nftables_section(heading("# nftables"), p, true),
            conntrack_section(heading("# conntrack"), p)
        );
        return vec![nft.note(note), conntrack];
    }
    let (own, other) = profiles(mode);
    // Whether the first sync would clean up the other mode (its marker chains are there).
    let cleans_ipvs = mode == ProxyMode::Iptables && found.ipvs_chains;
    let cleans_iptables = mode == ProxyMode::Ipvs && found.iptables_chains;
    let ipvs_planned = mode == ProxyMode::Ipvs;
    let owned = move |table: &str, chain: &str| {
        let listed = |pr: &ChainProfile| match table {
            "nat" => pr.nat_chains.contains(&chain) || (pr.service_chains && is_service_chain(chain)),
            "filter" => pr.filter_chains.contains(&chain),
            _ => false,
        };
        chain == CANARY || listed(own) || ((cleans_ipvs || cleans_iptables) && other.is_some_and(listed))
    };
    // Our nftables table, which the daemon deletes when it starts in this
    // mode: read only where it is (or where that could not be told).
    let nftables = async {
        if found.nftables_table {
            Some(nftables_section(heading("# nftables"), p, false).await)
        } else {
            None
        }
    };
    // Each section reads on its own (tools, netlink, a scratch namespace): all at once.
    let addresses = address_section(heading(&format!("# addresses {DUMMY_LINK}")), p, ipvs_planned, cleans_ipvs);
    let iptables_heading = heading("# iptables");
    let (ipvs, ipset, addresses, iptables, nft, conntrack) = futures::join!(
        ipvs_section(heading("# ipvs"), p, ipvs_planned, cleans_ipvs),
        timed("read the ipsets", ipset_section(heading("# ipset"), p, ipvs_planned, cleans_ipvs)),
        timed("read the addresses", addresses),
        timed("read iptables", iptables_sections(&iptables_heading, p, mode, owned)),
        timed("read nftables", nftables),
        timed("read conntrack", conntrack_section(heading("# conntrack"), p)),
    );
    let mut out = vec![ipvs, ipset, addresses];
    out.extend(iptables);
    if let Some(nft) = nft.filter(|nft| nft.removed > 0) {
        out.push(nft.note("nftables mode's table: removed by the switch"));
    }
    out.push(conntrack);
    out
}

/// `read` awaited, its time logged as a phase of `--dry-run --diff`
/// (a debug line `dry-run: WHAT ms=N`).
async fn timed<T>(what: &str, read: impl std::future::Future<Output = T>) -> T {
    let began = std::time::Instant::now();
    let out = read.await;
    tracing::debug!(ms = began.elapsed().as_millis() as u64, "dry-run: {what}");
    out
}

/// The family's live UDP conntrack entries the first sync's reconcile
/// would delete, as removed lines; the other UDP entries, as kept.
async fn conntrack_section(heading: String, p: &FamilyPlan) -> SectionDiff {
    let section = SectionDiff::new(&heading);
    let Some(rc) = &p.conntrack else {
        return section.note("no UDP Service has serving endpoints: the first sync reconciles nothing");
    };
    let entries = match NetlinkConntrack::new() {
        Ok(ct) => ct.entries(p.settings.family).await,
        Err(e) => Err(e),
    };
    let entries = match entries {
        Ok(entries) => entries,
        Err(e) => return section.note(format!("the conntrack table could not be read: {e}")),
    };
    let udp: Vec<&Entry> = entries.iter().filter(|e| e.protocol() == Some(Protocol::Udp)).collect();
    let (stale, kept): (Vec<&Entry>, Vec<&Entry>) = udp.into_iter().partition(|e| is_stale(rc, e));
    let mut lines: Vec<String> = stale.iter().map(|e| format!("-{e}")).collect();
    lines.sort();
    SectionDiff { removed: lines.len(), kept: kept.len(), lines, ..section }
}

/// nftables mode's `kube-proxy` table of the family: the live one (`nft
/// list table`) against the planned one (`planned`: the dry run's text
/// loaded with `nft -f` into a private network namespace and listed back,
/// so both sides are printed by `nft`; else an empty table), as lines of
/// [`diff::nft_listing_lines`].
async fn nftables_section(heading: String, p: &FamilyPlan, planned: bool) -> SectionDiff {
    let family = nft_family(p.settings.family);
    let s = SectionDiff::new(&heading);
    let args = ["list", "table", family, NFT_TABLE];
    let live = match tool::run("nft list table", "nft", &args, None).await {
        Ok(out) if out.success() => diff::nft_listing_lines(&out.stdout),
        Ok(out) if out.stderr.contains("No such file") => Vec::new(),
        Ok(out) => return s.note(format!("cannot read the table: nft list table: {}", out.message())),
        Err(e) => return s.note(format!("cannot read the table: {e}")),
    };
    let desired = if planned {
        let text: String = section(&p.text, "# nftables").iter().map(|l| format!("{l}\n")).collect();
        let family = family.to_string();
        match scratch::in_thread(move || scratch::nft_listed(&text, &family)).await {
            Ok(listing) => diff::nft_listing_lines(&listing),
            Err(e) => return s.note(format!("cannot list the planned table in a private namespace: {e}")),
        }
    } else {
        Vec::new()
    };
    s.compare(&desired, &live)
}

/// The section of the other mode's objects: removed when the daemon would
/// clean that mode up, else left as they are and noted.
fn unplanned(heading: String, what: &str, live: Vec<String>, cleans: bool) -> SectionDiff {
    if cleans {
        SectionDiff::new(&heading).note(format!("IPVS mode's {what}: removed by the switch")).compare(&[], &live)
    } else {
        left_alone(heading, live.len())
    }
}

/// `n` lines of the other mode's that the first sync leaves as they are.
fn left_alone(heading: String, n: usize) -> SectionDiff {
    let mut s = SectionDiff::new(&heading).note(format!("not this mode's; left as they are ({n} lines)"));
    s.kept = n;
    s
}

async fn ipvs_section(heading: String, p: &FamilyPlan, planned: bool, cleans: bool) -> SectionDiff {
    let ipvs = match NetlinkIpvs::connect().await {
        Ok(ipvs) => ipvs,
        Err(IpvsError::NotAvailable) => {
            let s = SectionDiff::new(&heading).note("no IPVS in this kernel");
            let desired = if planned { owned_lines(section(&p.text, "# ipvs")) } else { Vec::new() };
            return s.compare(&desired, &[]);
        }
        Err(e) => return SectionDiff::new(&heading).note(format!("cannot read IPVS: {e}")),
    };
    let family = p.settings.family;
    let exclude = &p.settings.ipvs_exclude_cidrs;
    let mut live = Vec::new();
    let began = std::time::Instant::now();
    // Two dumps that agree: a write in any namespace during a dump can make it skip or repeat one.
    match services_agreed(None, || ipvs.services()).await {
        Ok(services) => {
            for (vs, spec) in services {
                // Upstream's ownership: the family's servers outside excludeCIDRs
                // (a cleanup flushes every one of the family's).
                if !family.matches(&vs.addr) || (planned && exclude.iter().any(|n| n.contains(&vs.addr))) {
                    continue;
                }
                live.push(IpvsOp::AddService(vs, spec).to_string());
                match ipvs.dests(&vs).await {
                    Ok(dests) => {
                        live.extend(dests.into_iter().map(|(d, ds, _, _)| IpvsOp::AddDest(vs, d, ds).to_string()))
                    }
                    Err(e) => return SectionDiff::new(&heading).note(format!("cannot read the servers of {vs}: {e}")),
                }
            }
        }
        Err(e) => return SectionDiff::new(&heading).note(format!("cannot read IPVS: {e}")),
    }
    tracing::debug!(ms = began.elapsed().as_millis() as u64, lines = live.len(), "dry-run: read IPVS");
    if planned {
        SectionDiff::new(&heading).compare(&owned_lines(section(&p.text, "# ipvs")), &live)
    } else {
        unplanned(heading, "virtual servers", live, cleans)
    }
}

fn owned_lines(lines: Vec<&str>) -> Vec<String> {
    lines.into_iter().map(str::to_string).collect()
}

/// A set's create line reduced to what the daemon checks (name, type,
/// family or range): the kernel adds `bucketsize` and a random `initval`.
fn create_key(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut key: Vec<&str> = words.iter().take(3).copied().collect();
    for pair in words.get(3..).unwrap_or(&[]).windows(2) {
        if pair[0] == "family" || pair[0] == "range" {
            key.extend_from_slice(pair);
        }
    }
    key.join(" ")
}

async fn ipset_section(heading: String, p: &FamilyPlan, planned: bool, cleans: bool) -> SectionDiff {
    let family = p.settings.family;
    let desired = section(&p.text, "# ipset");
    let mut out = SectionDiff::new(&heading);
    let saved = match saved_sets().await {
        Ok(text) => text,
        Err(e) => return out.note(format!("cannot read the ipsets: {e}")),
    };
    let mut by_set = lines_by_set(&saved);
    let mut left = 0;
    for set in IpvsSet::ALL {
        let name = set.name(family);
        let live: Vec<String> = by_set.remove(name.as_str()).map_or_else(Vec::new, owned_lines);
        if !planned && !cleans {
            left += live.len();
            continue;
        }
        let want: Vec<&str> =
            desired.iter().copied().filter(|l| planned && l.split_whitespace().nth(1) == Some(name.as_str())).collect();
        // The create line first (compared on what the daemon checks, printed
        // whole), then the members.
        let create = |l: &&str| l.starts_with("create ");
        let (want_create, want_adds): (Vec<&str>, Vec<&str>) = want.into_iter().partition(create);
        let (live_create, live_adds): (Vec<&str>, Vec<&str>) = live.iter().map(String::as_str).partition(create);
        let keys = |v: &[&str]| v.iter().map(|l| create_key(l)).collect::<Vec<_>>();
        if keys(&want_create) == keys(&live_create) {
            out.kept += want_create.len();
        } else {
            out = out.compare(&owned_lines(want_create), &owned_lines(live_create));
        }
        out = out.compare(&owned_lines(want_adds), &owned_lines(live_adds));
    }
    match (planned, cleans) {
        (true, _) => out,
        (false, true) => out.note("IPVS mode's sets: removed by the switch"),
        (false, false) => left_alone(heading, left),
    }
}

/// `ipset save`: every set of the node, in one run of the tool.
async fn saved_sets() -> Result<String, LiveReadError> {
    let out = tool::run("ipset save", "ipset", &["save"], None).await?;
    if out.success() {
        Ok(out.stdout)
    } else {
        Err(LiveReadError::Refused(out.message()))
    }
}

/// `ipset save`'s lines grouped by the set they name (each line's second
/// word: `create NAME …`, `add NAME …`), in order.
fn lines_by_set(saved: &str) -> BTreeMap<&str, Vec<&str>> {
    let mut sets: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for line in saved.lines() {
        if let Some(name) = line.split_whitespace().nth(1) {
            sets.entry(name).or_default().push(line);
        }
    }
    sets
}

async fn address_section(heading: String, p: &FamilyPlan, planned: bool, cleans: bool) -> SectionDiff {
    let family = p.settings.family;
    let live = match DummyLink::new() {
        Ok(link) => link.with_family(family).addresses().await,
        Err(e) => Err(e),
    };
    let live: Vec<String> = match live {
        Ok(addrs) => addrs.iter().map(ToString::to_string).collect(),
        Err(e) => return SectionDiff::new(&heading).note(format!("cannot read {DUMMY_LINK}'s addresses: {e}")),
    };
    if planned {
        let desired = owned_lines(section(&p.text, &format!("# addresses {DUMMY_LINK}")));
        SectionDiff::new(&heading).compare(&desired, &live)
    } else {
        unplanned(heading, "addresses", live, cleans)
    }
}

async fn iptables_sections(
    heading: &str,
    p: &FamilyPlan,
    mode: ProxyMode,
    owned: impl Fn(&str, &str) -> bool + Copy,
) -> Vec<SectionDiff> {
    let family = p.settings.family;
    let planned = section(&p.text, "# iptables").join("\n") + "\n";
    let used = used_backend(family).await;
    let mut out = Vec::new();
    for backend in ["legacy", "nft"] {
        let bins = IptablesBinaries::variant(family, backend);
        let live = match saved_tables(&bins).await {
            Ok(t) => t,
            Err(e) => {
                out.push(SectionDiff::new(&format!("{heading} {backend}")).note(format!("cannot read: {e}")));
                continue;
            }
        };
        let name = format!("{heading} {backend}");
        if used.as_deref() != Some(backend) {
            let ours = diff::iptables_diff(&name, &Tables::new(), &live, owned);
            let mut s = SectionDiff::new(&name);
            s.kept = ours.removed;
            let what = used.as_deref().map_or("unknown".to_string(), |u| format!("iptables-{u}"));
            if ours.removed > 0 {
                s = s.note(format!(
                    "`iptables` here is {what}: these {} chains and rules of kube-proxy's in iptables-{backend} \
                     are not touched and stay active beside ours",
                    ours.removed
                ));
            } else {
                s = s.note(format!("`iptables` here is {what}; nothing of kube-proxy's in iptables-{backend}"));
            }
            out.push(s);
            continue;
        }
        let (desired, note) =
            match timed("saved the plan's rules in a scratch namespace", canonical(&bins, &planned, &p.text, mode))
                .await
            {
                Ok(saved) => (diff::parse_tables(&saved), None),
                Err(e) => (
                    diff::parse_tables(&planned),
                    Some(format!("planned rules compared as written, not as saved: {e}")),
                ),
            };
        let mut s = diff::iptables_diff(&name, &desired, &live, owned);
        if let Some(n) = note {
            s.notes.insert(0, n);
        }
        out.push(s);
    }
    out
}

/// "legacy" or "nft": the backend `iptables` (`ip6tables`) runs here.
async fn used_backend(family: IpFamily) -> Option<String> {
    let bin = IptablesBinaries::for_family(family).iptables;
    let out = tool::run(&format!("{bin} --version"), &bin, &["--version"], None).await.ok()?;
    if out.stdout.contains("nf_tables") {
        Some("nft".into())
    } else if out.stdout.contains("legacy") || out.success() {
        Some("legacy".into())
    } else {
        None
    }
}

/// The live tables of one backend: one `iptables-save`, every table the
/// kernel has (a table it lacks is empty; none where the backend has no
/// tables at all).
async fn saved_tables(bins: &IptablesBinaries) -> Result<Tables, LiveReadError> {
    let out = tool::run(&bins.save, &bins.save, &[], None).await?;
    let absent = ["does not exist", "initialize", "Can't open"];
    if out.success() {
        Ok(diff::parse_tables(&out.stdout))
    } else if absent.iter().any(|a| out.stderr.contains(a)) {
        Ok(Tables::new())
    } else {
        Err(LiveReadError::Refused(format!("{}: {}", bins.save, out.message())))
    }
}

/// `restore` loaded into a private network namespace with `bins` and saved
/// back (`iptables-save` syntax). The sets (IPVS mode) and nfacct objects
/// the rules name are created there first.
async fn canonical(
    bins: &IptablesBinaries,
    restore: &str,
    plan: &str,
    mode: ProxyMode,
) -> Result<String, ScratchError> {
    let creates: Vec<String> = match mode {
        ProxyMode::Ipvs => {
            section(plan, "# ipset").into_iter().filter(|l| l.starts_with("create ")).map(str::to_string).collect()
        }
        _ => Vec::new(),
    };
    let nfacct: BTreeSet<&'static str> = crate::proxier::nfacct::OBJECTS
        .iter()
        .copied()
        .filter(|o| restore.contains(&format!("--nfacct-name {o}")))
        .collect();
    let (bins, restore) = (bins.clone(), restore.to_string());
    scratch::in_thread(move || scratch::saved_after_restore(&bins, &restore, &creates, &nfacct)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::switch::Found;

    #[test]
    fn a_switch_reads_as_its_steps_under_a_heading() {
        let steps = switch_steps(ProxyMode::Nftables, Found { iptables_chains: true, ..Found::default() }, None);
        assert_eq!(
            switch_text(&steps, &[], " ipv6"),
            "# mode switch ipv6\nfirst: nftables mode's first sync, complete and committed\n\
             then: remove iptables mode's iptables jumps and chains\n\n"
        );
        assert_eq!(switch_text(&[], &[], ""), "");
    }

    #[test]
    fn leaving_ipvs_mode_the_drain_step_lists_the_servers_it_waits_for() {
        let timeout = Some(Duration::from_secs(600));
        let steps = switch_steps(ProxyMode::Iptables, Found { ipvs_chains: true, ..Found::default() }, timeout);
        let vs = |last: u8, protocol| VsKey { addr: [10, 96, 0, last].into(), protocol, port: 80 };
        let now = [(vs(1, Protocol::Tcp), 0), (vs(2, Protocol::Tcp), 3), (vs(3, Protocol::Udp), 1)];
        assert_eq!(
            switch_text(&steps, &now, ""),
            "# mode switch\n\
             first: iptables mode's first sync, complete and committed\n\
             then: drain IPVS mode's virtual servers, each removed when IPVS has no connection through it, \
             all after 10m0s; kube-ipvs0, IPVS mode's chains and ipsets stay until then\n\
             \x20 now: 1 virtual servers without connections go at once; 2 wait for 4 connections\n\
             \x20 drains: -t 10.96.0.2:80 (3 connections)\n\
             \x20 drains: -u 10.96.0.3:80 (1 connections)\n\
             then: remove ipvs mode's iptables jumps and chains (keeping those iptables mode writes too)\n\
             then: remove IPVS mode's ipsets, virtual servers and kube-ipvs0\n\n"
        );
    }

    #[test]
    fn a_section_is_the_lines_under_its_heading() {
        let text =
            "# ipvs\n-A -t 1.2.3.4:80 -s rr\n# ipset\ncreate X hash:ip family inet hashsize 1024 maxelem 65536\n";
        assert_eq!(section(text, "# ipvs"), ["-A -t 1.2.3.4:80 -s rr"]);
        assert_eq!(section(text, "# ipset").len(), 1);
        assert!(section(text, "# iptables").is_empty());
    }

    #[test]
    fn saved_sets_split_by_the_set_each_line_names() {
        let saved = "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n\
                     add KUBE-CLUSTER-IP 10.96.0.1,tcp:443\n\
                     create KUBE-6-CLUSTER-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536\n\
                     add KUBE-CLUSTER-IP 10.96.0.10,udp:53\n\n";
        let sets = lines_by_set(saved);
        assert_eq!(
            sets["KUBE-CLUSTER-IP"],
            [
                "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536",
                "add KUBE-CLUSTER-IP 10.96.0.1,tcp:443",
                "add KUBE-CLUSTER-IP 10.96.0.10,udp:53"
            ]
        );
        assert_eq!(sets["KUBE-6-CLUSTER-IP"].len(), 1);
        assert_eq!(sets.len(), 2, "blank lines name no set");
    }

    #[test]
    fn create_lines_compare_on_name_type_and_family() {
        let ours = "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536";
        let live = "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1f2e3d4c";
        assert_eq!(create_key(ours), create_key(live));
        assert_ne!(create_key(ours), create_key("create KUBE-CLUSTER-IP hash:ip family inet hashsize 1024"));
        assert_eq!(
            create_key("create KUBE-NODE-PORT-TCP bitmap:port range 0-65535"),
            "create KUBE-NODE-PORT-TCP bitmap:port range 0-65535"
        );
    }
}
