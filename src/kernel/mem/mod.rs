//! In-memory kernels for actor tests. They behave like the kernel where it
//! matters to us (adding what exists and deleting what is gone are
//! idempotent; a dest needs its service; nf_tables transactions are all or
//! nothing, [`nftables`]), record every op in a journal shared by all of
//! them (so tests can assert cross-actor ordering), and fail ops on request.

mod nftables;

pub use self::nftables::{MemChain, MemNftables, MemSet, MemTable, MemTables};
use crate::mutex::lock;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::*;
use crate::msgs::ipset::SetLine;
use conntrack::codec::Entry;

/// Ops applied by every in-memory kernel, in order, with the (virtual) time.
#[derive(Debug, Clone, Default)]
pub struct Journal {
    entries: Arc<Mutex<Vec<(Instant, String)>>>,
    faults: Arc<Mutex<Vec<(String, u32)>>>,
    /// Ops that take effect but whose reply is lost (outcome unknown).
    lost: Arc<Mutex<Vec<(String, u32)>>>,
}

impl Journal {
    pub fn record(&self, line: String) {
        lock(&self.entries).push((Instant::now(), line));
    }

    pub fn lines(&self) -> Vec<String> {
        lock(&self.entries).iter().map(|(_, l)| l.clone()).collect()
    }

    pub fn timed(&self) -> Vec<(Instant, String)> {
        lock(&self.entries).clone()
    }

    pub fn clear(&self) {
        lock(&self.entries).clear();
    }

    /// Position of the first line containing `needle`.
    pub fn pos(&self, needle: &str) -> Option<usize> {
        lock(&self.entries).iter().position(|(_, l)| l.contains(needle))
    }

    /// The next `times` ops whose journal line contains `pattern` fail.
    pub fn fail(&self, pattern: &str, times: u32) {
        lock(&self.faults).push((pattern.to_string(), times));
    }

    /// The next `times` IPVS ops (or nf_tables transactions, by one of
    /// their ops) whose journal line contains `pattern` take effect, but
    /// their reply is lost: they fail with an unknown outcome.
    pub fn lose(&self, pattern: &str, times: u32) {
        lock(&self.lost).push((pattern.to_string(), times));
    }

    fn reply_lost(&self, line: &str) -> bool {
        let mut lost = lock(&self.lost);
        let hit = lost.iter_mut().find(|(p, n)| *n > 0 && line.contains(p.as_str()));
        hit.map(|f| f.1 -= 1).is_some()
    }

    /// Whether an injected fault matches `line` (it is used up).
    fn faulted(&self, line: &str) -> bool {
        let mut faults = lock(&self.faults);
        let hit = faults.iter_mut().find(|(p, n)| *n > 0 && line.contains(p.as_str()));
        hit.map(|f| f.1 -= 1).is_some()
    }

    /// Checks for an injected fault; records the op if it goes through.
    fn attempt(&self, line: String) -> KResult<()> {
        if self.faulted(&line) {
            self.record(format!("FAILED {line}"));
            return Err(KernelError::errno(line, 5));
        }
        self.record(line);
        Ok(())
    }
}

/// In-memory IPVS table.
#[derive(Debug, Clone, Default)]
pub struct MemIpvs {
    pub journal: Journal,
    pub table: Arc<Mutex<IpvsTable>>,
    /// Full reads of the table (a full resync dumps it).
    pub dumps: Arc<std::sync::atomic::AtomicUsize>,
}

impl MemIpvs {
    pub fn new(journal: &Journal) -> MemIpvs {
        MemIpvs { journal: journal.clone(), table: Arc::default(), dumps: Arc::default() }
    }

    pub fn snapshot(&self) -> IpvsTable {
        lock(&self.table).clone()
    }

    fn apply_one(&self, op: &IpvsOp) -> KResult<()> {
        let line = format!("ipvs {op}");
        self.journal.attempt(line.clone())?;
        self.change(op)?;
        match self.journal.reply_lost(&line) {
            true => Err(KernelError::unknown(op, "reply lost")),
            false => Ok(()),
        }
    }

    fn change(&self, op: &IpvsOp) -> KResult<()> {
        let mut t = lock(&self.table);
        match op {
            IpvsOp::AddService(k, s) | IpvsOp::EditService(k, s) => {
                t.services.insert(*k, s.clone());
            }
            IpvsOp::AddDest(k, d, s) | IpvsOp::EditDest(k, d, s) => {
                if !t.services.contains_key(k) {
                    return Err(KernelError::errno(op, 3)); // ESRCH, as the kernel answers
                }
                let e = t.dests.entry((*k, *d)).or_insert(DestState { spec: *s, active: 0, inactive: 0 });
                e.spec = *s;
            }
            IpvsOp::DelDest(k, d) => {
                t.dests.remove(&(*k, *d));
            }
            IpvsOp::DelService(k) => {
                t.services.remove(k);
                t.dests.retain(|(vs, _), _| vs != k);
            }
        }
        Ok(())
    }
}

impl Subsystem for MemIpvs {
    type Op = IpvsOp;

    fn apply(&self, ops: Vec<IpvsOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move { ops.iter().map(|op| me.apply_one(op)).collect() }
    }

    fn reconcile(&self, desired: Vec<IpvsOp>) -> impl Future<Output = Applied<IpvsOp>> + 'static {
        let me = self.clone();
        async move {
            let have = me.dump().await?;
            let ops = ipvs_diff(desired, &have, |_| true);
            let results = me.apply(ops.clone()).await;
            Ok((ops, results))
        }
    }

    /// As the real handle: the virtual servers only, drift when they differ.
    fn verify(&self, desired: Vec<IpvsOp>) -> impl Future<Output = KResult<Checked<IpvsOp>>> + 'static {
        let me = self.clone();
        async move {
            let have = me.snapshot().services;
            let drift = ipvs_services_differ(&desired, have, |_| true).is_some();
            Ok(Checked { applied: Vec::new(), results: Vec::new(), drift })
        }
    }
}

impl IpvsKernel for MemIpvs {
    fn dump(&self) -> impl Future<Output = KResult<IpvsTable>> + 'static {
        self.dumps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = self.snapshot();
        async move { Ok(t) }
    }
}

/// In-memory ipset: one set.
#[derive(Debug, Clone)]
pub struct MemIpset {
    pub journal: Journal,
    spec: SetSpec,
    pub members: Arc<Mutex<Option<BTreeSet<SetEntry>>>>,
}

impl MemIpset {
    pub fn new(journal: &Journal, spec: SetSpec) -> MemIpset {
        MemIpset { journal: journal.clone(), spec, members: Arc::default() }
    }

    pub fn snapshot(&self) -> Option<BTreeSet<SetEntry>> {
        lock(&self.members).clone()
    }

    fn apply_one(&self, op: &IpsetOp) -> KResult<()> {
        let line = SetLine(&self.spec.name, op).to_string();
        self.journal.attempt(format!("ipset {line}"))?;
        let mut m = lock(&self.members);
        let Some(set) = m.as_mut() else {
            return Err(KernelError::refused(line, "The set with the given name does not exist"));
        };
        match op {
            IpsetOp::Add(e) => set.insert(*e),
            IpsetOp::Del(e) => set.remove(e),
        };
        Ok(())
    }
}

impl Subsystem for MemIpset {
    type Op = IpsetOp;

    fn apply(&self, ops: Vec<IpsetOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move { ops.iter().map(|op| me.apply_one(op)).collect() }
    }

    fn reconcile(&self, desired: Vec<IpsetOp>) -> impl Future<Output = Applied<IpsetOp>> + 'static {
        let me = self.clone();
        async move {
            me.ensure().await?;
            let have = me.members().await?;
            let want: BTreeSet<SetEntry> =
                desired.iter().filter_map(|op| if let IpsetOp::Add(e) = op { Some(*e) } else { None }).collect();
            let ops = set_diff(&want, &have, IpsetOp::Add, IpsetOp::Del);
            let results = me.apply(ops.clone()).await;
            Ok((ops, results))
        }
    }
}

impl IpsetKernel for MemIpset {
    fn spec(&self) -> &SetSpec {
        &self.spec
    }

    fn ensure(&self) -> impl Future<Output = KResult<()>> + 'static {
        let me = self.clone();
        async move {
            if lock(&me.members).is_none() {
                me.journal.attempt(me.spec.create_line())?;
                *lock(&me.members) = Some(BTreeSet::new());
            }
            Ok(())
        }
    }

    fn members(&self) -> impl Future<Output = KResult<BTreeSet<SetEntry>>> + 'static {
        let m = self.snapshot();
        let name = self.spec.name.clone();
        async move { m.ok_or_else(|| KernelError::refused(format!("list {name}"), "no such set")) }
    }
}

/// In-memory kube-ipvs0 and its addresses.
#[derive(Debug, Clone, Default)]
pub struct MemLink {
    pub journal: Journal,
    pub addrs: Arc<Mutex<BTreeSet<IpAddr>>>,
}

impl MemLink {
    pub fn new(journal: &Journal) -> MemLink {
        MemLink { journal: journal.clone(), addrs: Arc::default() }
    }

    pub fn snapshot(&self) -> BTreeSet<IpAddr> {
        lock(&self.addrs).clone()
    }
}

impl Subsystem for MemLink {
    type Op = LinkOp;

    fn apply(&self, ops: Vec<LinkOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move {
            ops.iter()
                .map(|op| {
                    me.journal.attempt(format!("link {op}"))?;
                    let mut a = lock(&me.addrs);
                    match op {
                        LinkOp::Bind(ip) => a.insert(*ip),
                        LinkOp::Unbind(ip) => a.remove(ip),
                    };
                    Ok(())
                })
                .collect()
        }
    }

    fn reconcile(&self, desired: Vec<LinkOp>) -> impl Future<Output = Applied<LinkOp>> + 'static {
        let me = self.clone();
        async move {
            let have = me.addresses().await?;
            let want: BTreeSet<IpAddr> =
                desired.iter().filter_map(|op| if let LinkOp::Bind(a) = op { Some(*a) } else { None }).collect();
            let ops = set_diff(&want, &have, LinkOp::Bind, LinkOp::Unbind);
            let results = me.apply(ops.clone()).await;
            Ok((ops, results))
        }
    }
}

impl LinkKernel for MemLink {
    fn addresses(&self) -> impl Future<Output = KResult<BTreeSet<IpAddr>>> + 'static {
        let a = self.snapshot();
        async move { Ok(a) }
    }
}

/// In-memory iptables: keeps the last restore input per call.
#[derive(Debug, Clone, Default)]
pub struct MemIptables {
    pub journal: Journal,
    pub restores: Arc<Mutex<Vec<String>>>,
    /// How long a full resync's read of the tables takes (the real
    /// handle's `iptables-save` or chain dump): a blocking wait, made where
    /// the real handle makes its reads, on the blocking pool.
    read_time: Arc<Mutex<std::time::Duration>>,
}

impl MemIptables {
    pub fn new(journal: &Journal) -> MemIptables {
        MemIptables { journal: journal.clone(), ..MemIptables::default() }
    }

    /// Full resyncs from now on read the tables for `time` (journal
    /// `iptables read started`, `iptables read done`).
    pub fn slow_reads(&self, time: std::time::Duration) {
        *lock(&self.read_time) = time;
    }

    /// A full resync's read of the tables.
    async fn read_tables(&self) -> KResult<()> {
        let time = *lock(&self.read_time);
        if time.is_zero() {
            return Ok(());
        }
        self.journal.record("iptables read started".into());
        let read = crate::kernel::blocking::off_thread("iptables read", move || std::thread::sleep(time)).await;
        read.map_err(|e| KernelError::library("iptables read", true, None, e))?;
        self.journal.record("iptables read done".into());
        Ok(())
    }
}

impl Subsystem for MemIptables {
    type Op = IptablesOp;

    fn apply(&self, ops: Vec<IptablesOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move {
            ops.iter()
                .map(|IptablesOp::Restore(r)| {
                    let lines = r.lines().count();
                    me.journal.attempt(format!("iptables-restore {lines} lines"))?;
                    lock(&me.restores).push(r.text());
                    Ok(())
                })
                .collect()
        }
    }

    fn reconcile(&self, desired: Vec<IptablesOp>) -> impl Future<Output = Applied<IptablesOp>> + 'static {
        let me = self.clone();
        async move {
            me.read_tables().await?;
            let results = me.apply(desired.clone()).await;
            Ok((desired, results))
        }
    }
}

impl IptablesKernel for MemIptables {}

/// In-memory conntrack: a table of entries (both families) that a
/// reconcile dumps (journal `conntrack -L -f FAMILY`) and deletes from
/// (journal `conntrack -D ...`, the entry's original tuple).
#[derive(Debug, Clone, Default)]
pub struct MemConntrack {
    pub journal: Journal,
    pub table: Arc<Mutex<Vec<Entry>>>,
}

impl MemConntrack {
    pub fn new(journal: &Journal) -> MemConntrack {
        MemConntrack { journal: journal.clone(), table: Arc::default() }
    }

    /// Adds an entry, as a connection through the node would.
    pub fn insert(&self, entry: Entry) {
        lock(&self.table).push(entry);
    }

    pub fn snapshot(&self) -> Vec<Entry> {
        lock(&self.table).clone()
    }
}

impl ConntrackKernel for MemConntrack {
    fn reconcile(&self, rc: ReconcileConntrack) -> impl Future<Output = KResult<Reconciled>> + 'static {
        let me = self.clone();
        async move {
            let dump = conntrack::Request::Dump(rc.family);
            me.journal.attempt(format!("conntrack {dump}"))?;
            let udp = crate::net::Protocol::Udp.number();
            let mut table = lock(&me.table);
            let mut out = Reconciled::default();
            let mut failed = None;
            table.retain(|e| {
                if e.orig.family() != rc.family || e.orig.protocol != udp {
                    return true;
                }
                out.udp_entries += 1;
                if !conntrack::filter::is_stale(&rc, e) {
                    return true;
                }
                match me.journal.attempt(format!("conntrack {}", conntrack::Request::Delete(e.orig))) {
                    Ok(()) => {
                        out.deleted += 1;
                        false
                    }
                    Err(err) => {
                        failed.get_or_insert(err);
                        true
                    }
                }
            });
            failed.map_or(Ok(out), Err)
        }
    }
}

/// A snapshot of every in-memory kernel, for assertions.
#[derive(Debug, Clone)]
pub struct MemKernels {
    pub journal: Journal,
    pub ipvs: MemIpvs,
    pub sets: BTreeMap<String, MemIpset>,
    pub link: MemLink,
    pub iptables: MemIptables,
    pub conntrack: MemConntrack,
}
