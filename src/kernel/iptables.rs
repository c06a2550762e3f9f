//! [`IptablesHandle`]: iptables of one family, through `iptables-restore`,
//! as upstream's IPVS proxier drives it (docs/upstream/ipvs.md d.2, d.3, e.5).
//!
//! - A `Restore` op is one `iptables-restore -w 5 -W 100000 --noflush
//!   --counters` with the text on stdin (the wait flags only where the
//!   installed iptables has them: >= 1.6.2, as upstream decides).
//! - The handle serves one proxy mode, whose [`ChainProfile`] says which
//!   jumps and chains are ours (IPVS mode by default, [`IptablesHandle::for_mode`]).
//! - Before the first restore, and on every full resync, the mode's jumps
//!   from the built-in chains to ours are checked with one `iptables-save`
//!   of nat and one of filter; each missing jump is inserted at position 1
//!   (`-I CHAIN 1 ...`) by lines added to that same restore (declaring its
//!   target chain if neither the kernel nor the input has it), so jumps
//!   exist exactly once and never point at a missing chain.
//! - [`IptablesHandle::canary_present`] tells whether `KUBE-PROXY-CANARY`
//!   still exists in mangle, nat and filter (an external flush removes it).
//! - The periodic drift check (every [`CANARY_INTERVAL`]) first compares a
//!   fingerprint of the tables ([`super::xtables_gen`]: a syscall or one
//!   netlink message) with the one taken after our last restore; only when
//!   something changed does it look for the canary and our jumps from the
//!   built-in chains (`iptables -S`, two `iptables-save`), so a quiet node
//!   pays microseconds, not a read of a 500,000-rule table.
//! - Nothing here blocks the thread the actors share: the tools run as
//!   child processes awaited asynchronously ([`super::tool`]), netlink
//!   reads and the fingerprint's syscall run on the blocking pool, and so
//!   does the parse of an `iptables-save` output (tens of MB at 10,000
//!   services).
//! - [`IptablesHandle::cleanup`] removes the mode's jumps and chains
//!   (`--cleanup`, switching modes); [`IptablesHandle::has_leftovers`]
//!   tells whether a mode's own chains are there.
//! - On the nf_tables backend, a large input is restored as several
//!   transactions ([`super::nft_split`]), and a table is never read with
//!   `iptables-save` (minutes at 10,000 services): its chains come from a
//!   netlink dump ([`NetlinkNftables::chain_names`]), the built-in chains'
//!   rules from `iptables -S CHAIN`.
//! - iptables mode: before each full resync the nfacct objects the rules
//!   name are created again when missing ([`IptablesHandle::ensuring_nfacct`]);
//!   [`IptablesHandle::probe_match`] tells whether a match can be written.
//! - Every restore line written is counted ([`IptablesHandle::lines_written`]).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::OnceCell;
use tracing::{debug, info, warn};

use super::nft_split;
use super::tool::{self, ToolOutput};
use super::xtables_gen::{self, Backend, Fingerprint};
use super::{Applied, IptablesKernel, KResult, KernelError, Subsystem};
use crate::kernel::blocking::off_thread;
use crate::kernel::iptables_probe;
use crate::kernel::nfacct::NetlinkNfacct;
use crate::kernel::nftables::{table::transaction_error, NetlinkNftables};
use crate::msgs::chains::{is_service_chain, ChainProfile, Jump, CANARY, IPVS_PROFILE};
use crate::msgs::{IptablesOp, RestoreInput};
use crate::net::IpFamily;

/// The three tools of one iptables flavour and family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesBinaries {
    pub iptables: String,
    pub save: String,
    pub restore: String,
}

impl IptablesBinaries {
    /// `iptables`, `iptables-save`, `iptables-restore` (or the `ip6tables` ones).
    pub fn for_family(family: IpFamily) -> IptablesBinaries {
        IptablesBinaries::named(family, "")
    }

    /// One flavour: `variant` "legacy" gives `iptables-legacy`,
    /// `iptables-legacy-save`, `iptables-legacy-restore`; "nft" the nft ones.
    pub fn variant(family: IpFamily, variant: &str) -> IptablesBinaries {
        IptablesBinaries::named(family, &format!("-{variant}"))
    }

    fn named(family: IpFamily, suffix: &str) -> IptablesBinaries {
        let base = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        IptablesBinaries {
            iptables: format!("{base}{suffix}"),
            save: format!("{base}{suffix}-save"),
            restore: format!("{base}{suffix}-restore"),
        }
    }
}

/// Whether `family`'s iptables works on this host (upstream's `Present()`:
/// the nat table's POSTROUTING chain can be listed). Blocking: one short
/// process, run once at start.
pub fn present(family: IpFamily) -> Result<(), String> {
    let bin = IptablesBinaries::for_family(family).iptables;
    let out = std::process::Command::new(&bin)
        .args(["-w", "5", "-t", "nat", "-S", "POSTROUTING"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {bin}: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        return Ok(());
    }
    if stderr.contains("xtables lock") {
        // The tool works; another process held the host-wide lock longer than
        // our wait. That says nothing about the family's support.
        info!(binary = %bin, "xtables lock busy while probing; taking the family as supported");
        return Ok(());
    }
    Err(format!("{bin} -t nat -S POSTROUTING: {}", stderr.trim()))
}

/// What the installed iptables' `iptables --version` tells: the wait
/// flags it understands (upstream's getIPTablesWaitFlag and
/// getIPTablesRestoreWaitFlag), its backend, and whether MASQUERADE takes
/// `--random-fully` (upstream's HasRandomFully).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ToolVersion {
    iptables: Vec<&'static str>,
    restore: Vec<&'static str>,
    backend: Backend,
    random_fully: bool,
}

/// iptables of one family. Cheap to clone; clones share state and counters.
#[derive(Debug, Clone)]
pub struct IptablesHandle {
    bins: Arc<IptablesBinaries>,
    profile: &'static ChainProfile,
    shared: Arc<Shared>,
    /// nfacct objects the rules count into, created again before each full
    /// resync (as upstream's full syncs ensure them): someone may have
    /// deleted one while no rule used it, and a restore naming a missing
    /// object fails.
    nfacct: Option<Arc<(NetlinkNfacct, Vec<&'static str>)>>,
}

#[derive(Debug, Default)]
struct Shared {
    /// The jumps were checked (and the missing ones inserted) by a restore
    /// that succeeded; cleared by every full resync.
    jumps_checked: AtomicBool,
    lines_written: AtomicU64,
    version: OnceCell<ToolVersion>,
    /// The tables' fingerprint after our last restore or drift check.
    fingerprint: std::sync::Mutex<Option<Fingerprint>>,
    /// The nf_tables socket (the nf_tables backend's chain listings, the
    /// fingerprint), opened on first use in the user's network namespace.
    nft: OnceCell<NetlinkNftables>,
}

impl IptablesHandle {
    /// The plain tools for `family` (`iptables*` or `ip6tables*` on `PATH`).
    pub fn new(family: IpFamily) -> IptablesHandle {
        IptablesHandle::with_binaries(IptablesBinaries::for_family(family))
    }

    /// Other tools: a flavour ([`IptablesBinaries::variant`]) or paths.
    pub fn with_binaries(bins: IptablesBinaries) -> IptablesHandle {
        IptablesHandle { bins: Arc::new(bins), profile: &IPVS_PROFILE, shared: Arc::default(), nfacct: None }
    }

    /// Serves another mode (its jumps and chains): `msgs::chains::IPTABLES_PROFILE`
    /// for iptables mode.
    pub fn for_mode(mut self, profile: &'static ChainProfile) -> IptablesHandle {
        self.profile = profile;
        self
    }

    /// Creates the nfacct `objects` again (when missing) before each full
    /// resync: the rules name them.
    pub fn ensuring_nfacct(mut self, client: NetlinkNfacct, objects: Vec<&'static str>) -> IptablesHandle {
        self.nfacct = (!objects.is_empty()).then(|| Arc::new((client, objects)));
        self
    }

    pub fn binaries(&self) -> &IptablesBinaries {
        &self.bins
    }

    fn family(&self) -> IpFamily {
        if self.bins.iptables.contains("ip6tables") {
            IpFamily::V6
        } else {
            IpFamily::V4
        }
    }

    /// The tables' fingerprint now (None when it cannot be read: then the
    /// periodic check always looks).
    async fn fingerprint(&self) -> Option<Fingerprint> {
        let backend = self.version().await.backend;
        let read = match self.nft().await {
            Ok(nft) => xtables_gen::fingerprint(self.family(), backend, nft).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        read.map_err(|error| debug!(binary = %self.bins.iptables, %error, "cannot read the tables' fingerprint")).ok()
    }

    /// The nf_tables socket, opened on first use.
    async fn nft(&self) -> KResult<&NetlinkNftables> {
        let open =
            || async { NetlinkNftables::new().map_err(|e| KernelError::io("open an nf_tables netlink socket", e)) };
        self.shared.nft.get_or_try_init(open).await
    }

    /// The names of the chains of nf_tables table `table` of this family.
    async fn nft_chains(&self, table: &str) -> KResult<BTreeSet<String>> {
        let listed = self.nft().await?.chain_names(self.family(), table).await;
        listed.map_err(|e| transaction_error(format!("list the chains of nf_tables table {table}"), e))
    }

    async fn remember_fingerprint(&self) {
        let f = self.fingerprint().await;
        *crate::sync::lock(&self.shared.fingerprint) = f;
    }

    /// The periodic check: drift when the canary or one of our jumps from
    /// the built-in chains is gone, looked for only when the tables'
    /// fingerprint changed since our last restore or check.
    async fn drifted(&self) -> KResult<bool> {
        let now = self.fingerprint().await;
        if now.is_some() && *crate::sync::lock(&self.shared.fingerprint) == now {
            return Ok(false);
        }
        if !self.canary_present().await? {
            info!(binary = %self.bins.iptables, "our canary chain is gone");
            return Ok(true);
        }
        let (nat, filter) = tokio::join!(self.save("nat"), self.save("filter"));
        let missing = missing_jumps(self.profile, &nat?, &filter?);
        if !missing.is_empty() {
            info!(binary = %self.bins.iptables, jumps = missing.len(), "jumps to our chains are gone");
            return Ok(true);
        }
        // Someone else's change: look again only after the next one.
        *crate::sync::lock(&self.shared.fingerprint) = now;
        Ok(false)
    }

    /// Lines written to `iptables-restore` so far (jumps and cleanup included).
    pub fn lines_written(&self) -> u64 {
        self.shared.lines_written.load(Ordering::Relaxed)
    }

    /// Whether MASQUERADE `--random-fully` is supported (iptables >= 1.6.2;
    /// `iptables --version` runs once per handle).
    pub async fn random_fully(&self) -> bool {
        self.version().await.random_fully
    }

    async fn version(&self) -> &ToolVersion {
        self.shared
            .version
            .get_or_init(|| async {
                let op = format!("{} --version", self.bins.iptables);
                match tool::run(&op, &self.bins.iptables, &["--version"], None).await {
                    Ok(out) => tool_version(&out.stdout),
                    Err(e) => {
                        warn!(error = %e, "cannot read the iptables version; using no wait flags");
                        tool_version("")
                    }
                }
            })
            .await
    }

    /// Applies one restore input, first adding the missing jumps if they
    /// have not been checked since the last full resync.
    async fn apply_restore(&self, input: &RestoreInput) -> KResult<()> {
        let check = !self.shared.jumps_checked.load(Ordering::Acquire);
        let given: Vec<&str> = input.parts().collect();
        let parts =
            if check { self.with_missing_jumps(&given).await? } else { given.into_iter().map(Cow::Borrowed).collect() };
        let parts: Vec<&str> = parts.iter().map(|p| p.as_ref()).filter(|p| !p.is_empty()).collect();
        if !parts.is_empty() {
            self.restore(&parts).await?;
        }
        if check {
            self.shared.jumps_checked.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// `text` plus `-I CHAIN 1 ...` lines for the jumps `iptables-save` lacks,
    /// as parts of the input (the text itself is not copied).
    async fn with_missing_jumps<'a>(&self, parts: &[&'a str]) -> KResult<Vec<Cow<'a, str>>> {
        let (nat, filter) = tokio::join!(self.save("nat"), self.save("filter"));
        let (nat, filter) = (nat?, filter?);
        let missing = missing_jumps(self.profile, &nat, &filter);
        if !missing.is_empty() {
            info!(binary = %self.bins.restore, jumps = missing.len(), "inserting missing jumps to our chains");
        }
        Ok(jump_parts(parts, &missing, &nat, &filter))
    }

    /// One `iptables-save -t TABLE`, parsed; on the nf_tables backend the
    /// same from [`nft_listing`](Self::nft_listing).
    async fn save(&self, table: &str) -> KResult<SavedTable> {
        if self.version().await.backend == Backend::Nft {
            return self.nft_listing(table).await;
        }
        let op = format!("{} -t {table}", self.bins.save);
        let out = tool::run(&op, &self.bins.save, &["-t", table], None).await?;
        if !out.success() {
            return Err(KernelError::refused(op, out.message()));
        }
        let parsed = off_thread("parse iptables-save", move || SavedTable::parse(&out.stdout)).await;
        parsed.map_err(|e| KernelError::library(op, true, None, e))
    }

    /// What this handle reads of a table on the nf_tables backend: its
    /// chains from one netlink dump, and the rules of its built-in chains
    /// (where our jumps are) from one `iptables -S CHAIN` each. Everything
    /// [`SavedTable`] is used for, without `iptables-nft-save`, which lists
    /// a table of 134,000 chains (10,000 services) in more than 15 minutes
    /// (iptables 1.8.9).
    async fn nft_listing(&self, table: &str) -> KResult<SavedTable> {
        let chains = self.nft_chains(table).await?;
        let mut rules = Vec::new();
        for chain in builtin_chains(table).iter().filter(|c| chains.contains(**c)) {
            let mut args: Vec<&str> = self.version().await.iptables.clone();
            args.extend(["-t", table, "-S", chain]);
            let op = format!("{} {}", self.bins.iptables, args.join(" "));
            let out = tool::run(&op, &self.bins.iptables, &args, None).await?;
            if !out.success() {
                return Err(KernelError::refused(op, out.message()));
            }
            rules.extend(out.stdout.lines().filter(|l| l.starts_with("-A ")).map(|l| l.trim_end().to_string()));
        }
        Ok(SavedTable { chains, rules })
    }

    /// Like [`save`](Self::save), but a table this kernel cannot provide
    /// (e.g. no IPv6 netfilter) is empty: nothing of ours can be in it.
    async fn saved_or_absent(&self, table: &str) -> KResult<SavedTable> {
        match self.save(table).await {
            Err(e) if table_unavailable(&e.cause().to_string()) => {
                info!(binary = %self.bins.save, table, error = %e, "table not available: nothing to clean");
                Ok(SavedTable::default())
            }
            other => other,
        }
    }

    /// One `iptables-restore --noflush --counters`. One at a time in this
    /// process, whichever family: every iptables process takes the same
    /// host-wide xtables lock and gives up after `-w 5`, so on a dual-stack
    /// node the families' restores queue here instead of failing each
    /// other's (a cold restore at 10,000 services holds the lock ≈ 20 s).
    async fn restore(&self, parts: &[&str]) -> KResult<()> {
        static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let _turn = ONE_AT_A_TIME.lock().await;
        let lines: usize = parts.iter().map(|p| p.lines().count()).sum();
        self.shared.lines_written.fetch_add(lines as u64, Ordering::Relaxed);
        if self.version().await.backend == Backend::Nft && lines >= nft_split::SPLIT_FROM {
            return self.restore_split(parts, lines).await;
        }
        self.restore_once(parts, lines).await
    }

    /// One `iptables-restore --noflush --counters` of `parts` (`lines` long).
    async fn restore_once(&self, parts: &[&str], lines: usize) -> KResult<()> {
        let mut args: Vec<&str> = self.version().await.restore.clone();
        args.extend(["--noflush", "--counters"]);
        let op = format!("{} {} ({lines} lines)", self.bins.restore, args.join(" "));
        debug!(%op, "restoring");
        let bytes: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
        let out = tool::run_with_input(&op, &self.bins.restore, &args, Some(&bytes)).await?;
        if out.success() {
            self.remember_fingerprint().await;
            return Ok(());
        }
        Err(KernelError::refused(op, restore_message(&out, parts)))
    }

    /// A large input on the nf_tables backend, as the transactions of
    /// [`nft_split`] (one transaction would take minutes).
    async fn restore_split(&self, parts: &[&str], lines: usize) -> KResult<()> {
        let existing = self.nft_chains("nat").await?;
        let split = nft_split::Split::new(parts.iter().flat_map(|p| p.lines()), &existing);
        drop(existing);
        let mut transactions = 0;
        for text in split.transactions(nft_split::MAX_LINES) {
            let n = text.lines().count();
            self.restore_once(&[&text], n).await?;
            transactions += 1;
        }
        info!(binary = %self.bins.restore, lines, transactions, "restored in several transactions (nf_tables backend)");
        Ok(())
    }

    async fn apply_ops(&self, ops: &[IptablesOp]) -> Vec<KResult<()>> {
        let mut results = Vec::with_capacity(ops.len());
        for IptablesOp::Restore(r) in ops {
            results.push(self.apply_restore(r).await);
        }
        results
    }

    async fn reconcile_ops(&self, desired: Vec<IptablesOp>) -> Applied<IptablesOp> {
        self.shared.jumps_checked.store(false, Ordering::Release);
        if let Some(nfacct) = &self.nfacct {
            let (client, objects) = nfacct.as_ref();
            for (object, r) in objects.iter().zip(client.ensure(objects).await) {
                if let Err(e) = r {
                    warn!(object, error = %e, "cannot create an nfacct object the rules name");
                }
            }
        }
        if desired.is_empty() {
            self.apply_restore(&RestoreInput::default()).await?;
        }
        let results = self.apply_ops(&desired).await;
        Ok((desired, results))
    }

    /// Whether rules with `matcher` (e.g. `-m nfacct --nfacct-name NAME`)
    /// can be written: a scratch chain in filter gets one such rule, and is
    /// deleted again (two restores, before the first sync). The kernel
    /// checks a match only when a rule using it is committed (its module may
    /// be missing while the rest of netfilter is there), so writing one is
    /// the sure test. `Err` carries the restore's complaint.
    pub async fn probe_match(&self, matcher: &str) -> KResult<()> {
        let add = format!("*filter\n:{MATCH_PROBE} - [0:0]\n-A {MATCH_PROBE} {matcher} -j RETURN\nCOMMIT\n");
        let del = format!("*filter\n:{MATCH_PROBE} - [0:0]\n-X {MATCH_PROBE}\nCOMMIT\n");
        let added = self.restore(&[&add]).await;
        if let Err(e) = self.restore(&[&del]).await {
            warn!(binary = %self.bins.restore, chain = MATCH_PROBE, error = %e, "cannot delete the probe chain");
        }
        added
    }

    /// Whether `KUBE-PROXY-CANARY` exists in mangle, nat and filter (three
    /// `iptables -S` runs). False means someone flushed our rules.
    pub fn canary_present(&self) -> impl Future<Output = KResult<bool>> + 'static {
        let me = self.clone();
        async move {
            let (m, n, f) = tokio::join!(
                me.chain_exists("mangle", CANARY),
                me.chain_exists("nat", CANARY),
                me.chain_exists("filter", CANARY)
            );
            Ok(m? && n? && f?)
        }
    }

    async fn chain_exists(&self, table: &str, chain: &str) -> KResult<bool> {
        let mut args: Vec<&str> = self.version().await.iptables.clone();
        args.extend(["-t", table, "-S", chain]);
        let op = format!("{} {}", self.bins.iptables, args.join(" "));
        let out = tool::run(&op, &self.bins.iptables, &args, None).await?;
        match out.code() {
            Some(0) => Ok(true),
            // "No chain/target/match by that name" (iptables-nft 1.8 says
            // "chain ... is incompatible" for a missing chain; same exit code).
            Some(1) => Ok(false),
            _ => Err(KernelError::refused(op, out.message())),
        }
    }

    /// Removes what this proxy installed (for `--cleanup`): the jumps from
    /// the built-in chains, our chains in nat and filter, and the canary in
    /// mangle, nat and filter. What is not there is skipped; nothing else is
    /// touched. One `iptables-save` per table and one restore.
    pub async fn cleanup(&self) -> KResult<()> {
        self.cleanup_modes(&[self.profile]).await
    }

    /// Like [`cleanup`](Self::cleanup), for several modes at once, in one
    /// restore: the modes share chains (KUBE-MARK-MASQ, ...) that the other
    /// mode's chains may still reference, so one mode at a time can fail.
    pub async fn cleanup_modes(&self, profiles: &[&ChainProfile]) -> KResult<()> {
        let (mangle, nat, filter) =
            tokio::join!(self.saved_or_absent("mangle"), self.saved_or_absent("nat"), self.saved_or_absent("filter"));
        let text = cleanup_input(profiles, &mangle?, &nat?, &filter?);
        self.shared.jumps_checked.store(false, Ordering::Release);
        if text.is_empty() {
            return Ok(());
        }
        let modes: Vec<&str> = profiles.iter().map(|p| p.mode).collect();
        info!(binary = %self.bins.restore, modes = %modes.join(","), "removing iptables chains and jumps");
        self.restore(&[&text]).await
    }

    /// Whether chains only this handle's mode writes are in the kernel (a
    /// node that ran that mode). Two `iptables-save` runs.
    pub async fn has_leftovers(&self) -> KResult<bool> {
        let (nat, filter) = tokio::join!(self.saved_or_absent("nat"), self.saved_or_absent("filter"));
        Ok(has_markers(self.profile, &nat?, &filter?))
    }

    /// The chains of one table (`iptables-save -t TABLE`); empty when the
    /// kernel cannot provide the table.
    pub async fn chains(&self, table: &str) -> KResult<BTreeSet<String>> {
        Ok(self.saved_or_absent(table).await?.chains)
    }
}

impl Subsystem for IptablesHandle {
    type Op = IptablesOp;

    fn apply(&self, ops: Vec<IptablesOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move { me.apply_ops(&ops).await }
    }

    fn reconcile(&self, desired: Vec<IptablesOp>) -> impl Future<Output = Applied<IptablesOp>> + 'static {
        let me = self.clone();
        async move { me.reconcile_ops(desired).await }
    }

    fn periodic(&self) -> Option<std::time::Duration> {
        Some(CANARY_INTERVAL)
    }

    /// Drift when our canary chain or a jump to our chains vanished after
    /// we had written them (firewalld-style `-F`/`-X` of whole tables, a
    /// flushed nat table).
    fn run_periodic(&self) -> impl Future<Output = bool> + 'static {
        let me = self.clone();
        async move {
            if !me.shared.jumps_checked.load(Ordering::Acquire) {
                return false;
            }
            match me.drifted().await {
                Ok(drifted) => drifted,
                Err(e) => {
                    tracing::warn!(actor = "iptables", error = %e, "checking our chains failed");
                    false
                }
            }
        }
    }
}

/// The filter chain [`IptablesHandle::probe_match`] writes and deletes.
pub const MATCH_PROBE: &str = "KUBE-PROXY-MATCH-PROBE";

/// How often the canary chains are checked.
pub const CANARY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

impl IptablesKernel for IptablesHandle {}

/// The built-in chains of an iptables table.
fn builtin_chains(table: &str) -> &'static [&'static str] {
    match table {
        "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        "filter" => &["INPUT", "FORWARD", "OUTPUT"],
        "mangle" => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
        "raw" => &["PREROUTING", "OUTPUT"],
        _ => &[],
    }
}

/// One table as `iptables-save -t TABLE` printed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedTable {
    /// Every chain, built-in or not.
    pub chains: BTreeSet<String>,
    /// The `-A ...` lines, in order.
    pub rules: Vec<String>,
}

impl SavedTable {
    pub fn parse(text: &str) -> SavedTable {
        let mut t = SavedTable::default();
        for line in text.lines().map(str::trim_end) {
            if let Some(decl) = line.strip_prefix(':') {
                if let Some(name) = decl.split_whitespace().next() {
                    t.chains.insert(name.to_string());
                }
            } else if line.starts_with("-A ") {
                t.rules.push(line.to_string());
            }
        }
        t
    }

    /// How many times `rule` (an `-A ...` line) appears.
    pub fn count(&self, rule: &str) -> usize {
        self.rules.iter().filter(|r| *r == rule).count()
    }
}

/// What the handle restores for `text` on a kernel with none of our chains
/// or jumps: `text` plus every jump of `profile` (`--dry-run` prints this).
pub fn restore_input_on_empty_kernel(profile: &ChainProfile, text: &str) -> String {
    let empty = SavedTable::default();
    insert_jumps(text, &missing_jumps(profile, &empty, &empty), &empty, &empty)
}

/// The mode's jumps (kept ones last) that the saved tables lack, in order.
fn missing_jumps(profile: &ChainProfile, nat: &SavedTable, filter: &SavedTable) -> Vec<Jump> {
    profile
        .jumps
        .iter()
        .chain(profile.kept_jumps)
        .filter(|j| {
            let saved = if j.table == "nat" { nat } else { filter };
            saved.count(&j.save_line()) == 0
        })
        .copied()
        .collect()
}

/// Adds `-I FROM 1 ...` for each missing jump before the `COMMIT` of its
/// table's section in `text` (a table `text` lacks gets a section of its
/// own), declaring target chains that neither the kernel nor `text` has.
fn insert_jumps(text: &str, missing: &[Jump], nat: &SavedTable, filter: &SavedTable) -> String {
    jump_parts(&[text], missing, nat, filter).concat()
}

/// A place in an input given in parts: (part, byte offset in it).
type At = (usize, usize);

/// The input `parts` with the missing jumps' lines inserted, as parts in
/// input order: slices of `parts` and the inserted lines (declarations of
/// target chains neither the kernel nor the input has, right after
/// `*table`; the `-I` lines before its `COMMIT`; a section of its own for a
/// table the input lacks). At 10,000 services the input is ≈ 55 MB: it is
/// not copied. Each part must end at a line end.
fn jump_parts<'a>(parts: &[&'a str], missing: &[Jump], nat: &SavedTable, filter: &SavedTable) -> Vec<Cow<'a, str>> {
    let mut at: Vec<(At, String)> = Vec::new();
    let mut tail = String::new();
    for (table, saved) in [("nat", nat), ("filter", filter)] {
        let jumps: Vec<Jump> = missing.iter().copied().filter(|j| j.table == table).collect();
        if jumps.is_empty() {
            continue;
        }
        let mut targets: BTreeSet<&str> = jumps.iter().map(|j| j.to).filter(|c| !saved.chains.contains(*c)).collect();
        let section = section_bounds(parts, table, &mut targets);
        let decls: String = targets.iter().map(|c| format!(":{c} - [0:0]\n")).collect();
        let inserts: String = jumps.iter().map(|j| format!("{}\n", j.insert_line())).collect();
        match section {
            Some((start, commit)) => {
                at.push((start, decls));
                at.push((commit, inserts));
            }
            None => tail.push_str(&format!("*{table}\n{decls}{inserts}COMMIT\n")),
        }
    }
    at.sort_by_key(|(place, _)| *place);
    let mut out = Vec::with_capacity(parts.len() + 2 * at.len() + 2);
    let mut inserts = at.into_iter().peekable();
    for (i, part) in parts.iter().enumerate() {
        let mut pos = 0;
        while let Some(((_, offset), lines)) = inserts.next_if(|((p, _), _)| *p == i) {
            out.push(Cow::Borrowed(&part[pos..offset]));
            out.push(Cow::Owned(lines));
            pos = offset;
        }
        out.push(Cow::Borrowed(&part[pos..]));
    }
    if !tail.is_empty() {
        if parts.iter().rev().find(|p| !p.is_empty()).is_some_and(|p| !p.ends_with('\n')) {
            out.push(Cow::Borrowed("\n"));
        }
        out.push(Cow::Owned(tail));
    }
    out.retain(|p| !p.is_empty());
    out
}

/// Where `*table`'s section of the input starts (after its header line) and
/// its `COMMIT` line begins; removes from `targets` the chains the section
/// declares.
fn section_bounds(parts: &[&str], table: &str, targets: &mut BTreeSet<&str>) -> Option<(At, At)> {
    let header = format!("*{table}");
    let mut start = None;
    for (i, part) in parts.iter().enumerate() {
        let mut offset = 0;
        for line in part.split_inclusive('\n') {
            let next = offset + line.len();
            match start {
                None if line.trim() == header => start = Some((i, next)),
                Some(s) if line.trim() == "COMMIT" => return Some((s, (i, offset))),
                Some(_) => {
                    if let Some(decl) = line.strip_prefix(':') {
                        targets.remove(decl.split(' ').next().unwrap_or(""));
                    }
                }
                None => {}
            }
            offset = next;
        }
    }
    None
}

/// Whether the saved tables hold a chain only `profile`'s mode writes.
fn has_markers(profile: &ChainProfile, nat: &SavedTable, filter: &SavedTable) -> bool {
    let table = |t: &str| if t == "nat" { nat } else { filter };
    profile.markers.iter().any(|(t, c)| table(t).chains.contains(*c))
        || (profile.service_chains && nat.chains.iter().any(|c| is_service_chain(c)))
}

/// iptables' answers when a table cannot exist in this kernel.
fn table_unavailable(message: &str) -> bool {
    ["Cannot initialize", "can't initialize", "Table does not exist"].iter().any(|m| message.contains(m))
}

/// The restore input that removes the mode's jumps, chains and canaries
/// from the saved tables; empty if there is nothing of its.
fn cleanup_input(profiles: &[&ChainProfile], mangle: &SavedTable, nat: &SavedTable, filter: &SavedTable) -> String {
    let mut out = String::new();
    let service_chains = profiles.iter().any(|p| p.service_chains);
    for (table, saved) in [("mangle", mangle), ("nat", nat), ("filter", filter)] {
        let mut ours: Vec<&str> = Vec::new();
        let listed = profiles.iter().flat_map(|p| match table {
            "nat" => p.nat_chains,
            "filter" => p.filter_chains,
            _ => &[],
        });
        let service =
            saved.chains.iter().map(String::as_str).filter(|c| service_chains && table == "nat" && is_service_chain(c));
        for c in listed.copied().chain(service).chain([CANARY]) {
            if saved.chains.contains(c) && !ours.contains(&c) {
                ours.push(c);
            }
        }
        let mut deletes: Vec<String> = Vec::new();
        for j in profiles.iter().flat_map(|p| p.jumps).filter(|j| j.table == table) {
            let delete = format!("-D {} {}", j.from, j.spec());
            if !deletes.contains(&delete) {
                let n = saved.count(&j.save_line());
                deletes.extend(std::iter::repeat_n(delete, n));
            }
        }
        if ours.is_empty() && deletes.is_empty() {
            continue;
        }
        out.push_str(&format!("*{table}\n"));
        ours.iter().for_each(|c| out.push_str(&format!(":{c} - [0:0]\n")));
        deletes.iter().for_each(|d| out.push_str(&format!("{d}\n")));
        ours.iter().for_each(|c| out.push_str(&format!("-X {c}\n")));
        out.push_str("COMMIT\n");
    }
    out
}

/// Parses `iptables vX.Y.Z ...` into (X, Y, Z).
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let mut parts = v.split('.').map(|p| p.trim_end_matches(|c: char| !c.is_ascii_digit()).parse::<u32>());
    Some((parts.next()?.ok()?, parts.next()?.ok()?, parts.next().and_then(Result::ok).unwrap_or(0)))
}

/// What an `iptables --version` output tells (upstream's reading of it).
fn tool_version(version_text: &str) -> ToolVersion {
    let v = parse_version(version_text).unwrap_or((0, 0, 0));
    let iptables = if v >= (1, 6, 0) {
        vec!["-w", "5", "-W", "100000"]
    } else if v >= (1, 4, 22) {
        vec!["-w", "5"]
    } else if v >= (1, 4, 20) {
        vec!["-w"]
    } else {
        vec![]
    };
    let restore = if v >= (1, 6, 2) { vec!["-w", "5", "-W", "100000"] } else { vec![] };
    let random_fully = iptables_probe::random_fully(version_text);
    ToolVersion { iptables, restore, backend: Backend::from_version(version_text), random_fully }
}

/// The tool's message, plus the input line it names ("Error occurred at
/// line: N" or "line N failed").
fn restore_message(out: &ToolOutput, input: &[&str]) -> String {
    let message = out.message();
    let n = out
        .stderr
        .split("Error occurred at line: ")
        .nth(1)
        .or_else(|| out.stderr.split("line ").nth(1))
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|d| d.parse::<usize>().ok());
    let mut lines = input.iter().flat_map(|p| p.lines());
    match n.and_then(|n| Some((n, lines.nth(n.checked_sub(1)?)?))) {
        Some((n, line)) => format!("{message} [line {n}: {line}]"),
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs::chains::{IPTABLES_PROFILE, IPVS_JUMPS};

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
        let missing: Vec<Jump> =
            IPVS_JUMPS.into_iter().filter(|j| j.from == "OUTPUT" || j.to == "KUBE-FORWARD").collect();
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
        let got = cleanup_input(&[&IPVS_PROFILE], &empty, &nat, &empty);
        let jump = "-D OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n";
        let want = format!(
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-PROXY-CANARY - [0:0]\n{jump}{jump}-X KUBE-SERVICES\n-X KUBE-PROXY-CANARY\nCOMMIT\n"
        );
        assert_eq!(got, want);
        assert_eq!(cleanup_input(&[&IPVS_PROFILE], &empty, &empty, &empty), "");
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
        let got = cleanup_input(&[profile], &SavedTable::default(), &nat, &filter);
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
        let both = cleanup_input(&[profile, &IPVS_PROFILE], &SavedTable::default(), &nat, &filter);
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
}
