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
//!   fingerprint of the tables ([`fingerprint`]: a syscall or one
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
//!   transactions ([`split_restore`]), and a table is never read with
//!   `iptables-save` (minutes at 10,000 services): its chains come from a
//!   netlink dump ([`NetlinkNftables::chain_names`]), the built-in chains'
//!   rules from `iptables -S CHAIN`.
//! - iptables mode: before each full resync the nfacct objects the rules
//!   name are created again when missing ([`IptablesHandle::ensuring_nfacct`]);
//!   [`IptablesHandle::probe_match`] tells whether a match can be written.
//! - Every restore line written is counted ([`IptablesHandle::lines_written`]).
//! - What each proxy mode owns in iptables, which the planners render rules
//!   into and this handle ensures, watches and cleans up: [`chains`].

pub mod chains;
pub mod fingerprint;
pub mod probe;
mod saved;
pub mod split_restore;

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::OnceCell;
use tracing::{debug, info, warn};

use self::chains::{ChainProfile, CANARY, IPVS_PROFILE};

use self::fingerprint::{Backend, Fingerprint};
use self::saved::{builtin_chains, cleanup_input, has_markers, jump_parts, missing_jumps, table_unavailable};
pub use self::saved::{restore_input_on_empty_kernel, SavedTable};
use super::tool::{self, ToolOutput};
use super::{Applied, IptablesKernel, KResult, KernelError, Subsystem};
use crate::kernel::blocking::off_thread;
use crate::kernel::nfacct::NetlinkNfacct;
use crate::kernel::nftables::{table::transaction_error, NetlinkNftables};
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
pub fn present(family: IpFamily) -> Result<(), NotPresent> {
    let bin = IptablesBinaries::for_family(family).iptables;
    let out = std::process::Command::new(&bin)
        .args(["-w", "5", "-t", "nat", "-S", "POSTROUTING"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| NotPresent::Run { bin: bin.clone(), source })?;
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
    Err(NotPresent::Refused { stderr: stderr.trim().to_string(), bin })
}

/// Why a family's iptables does not work on this host.
#[derive(Debug, thiserror::Error)]
pub enum NotPresent {
    #[error("cannot run {bin}: {source}")]
    Run {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    /// The listing failed: the tool's standard error.
    #[error("{bin} -t nat -S POSTROUTING: {stderr}")]
    Refused { bin: String, stderr: String },
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

    /// Serves another mode (its jumps and chains): `chains::IPTABLES_PROFILE`
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
            Ok(nft) => fingerprint::fingerprint(self.family(), backend, nft).await.map_err(|e| e.to_string()),
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
        *crate::mutex::lock(&self.shared.fingerprint) = f;
    }

    /// The periodic check: drift when the canary or one of our jumps from
    /// the built-in chains is gone, looked for only when the tables'
    /// fingerprint changed since our last restore or check.
    async fn drifted(&self) -> KResult<bool> {
        let now = self.fingerprint().await;
        if now.is_some() && *crate::mutex::lock(&self.shared.fingerprint) == now {
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
        *crate::mutex::lock(&self.shared.fingerprint) = now;
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
        if self.version().await.backend == Backend::Nft && lines >= split_restore::SPLIT_FROM {
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
    /// [`split_restore`] (one transaction would take minutes).
    async fn restore_split(&self, parts: &[&str], lines: usize) -> KResult<()> {
        let existing = self.nft_chains("nat").await?;
        let split = split_restore::Split::new(parts.iter().flat_map(|p| p.lines()), &existing);
        drop(existing);
        let mut transactions = 0;
        for text in split.transactions(split_restore::MAX_LINES) {
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
        self.cleanup_modes(&[self.profile], None).await
    }

    /// Like [`cleanup`](Self::cleanup), for several modes at once, in one
    /// restore (the modes share chains, KUBE-MARK-MASQ, ..., that the other
    /// mode's chains may still reference, so one mode at a time can fail),
    /// keeping the jumps and chains `keep` (the mode now running) writes
    /// too: after a switch, the earlier mode's rules go and the new mode's,
    /// written first, stay.
    pub async fn cleanup_modes(&self, profiles: &[&ChainProfile], keep: Option<&ChainProfile>) -> KResult<()> {
        let (mangle, nat, filter) =
            tokio::join!(self.saved_or_absent("mangle"), self.saved_or_absent("nat"), self.saved_or_absent("filter"));
        let text = cleanup_input(profiles, keep, &mangle?, &nat?, &filter?);
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
    let random_fully = probe::random_fully(version_text);
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
mod tests;
