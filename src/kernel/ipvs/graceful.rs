//! The IPVS kernel handle the actor uses: a backend (netlink, or the
//! in-memory table in tests) plus upstream's graceful termination
//! (pkg/proxy/ipvs/graceful_termination.go):
//!
//! - a removed TCP real server with connections gets weight 0 and stays
//!   until it has no active and no inactive connections, checked every
//!   minute (`rsCheckDeleteInterval`); UDP and SCTP real servers are
//!   deleted at once;
//! - a real server that comes back while terminating is deleted and added
//!   again, as upstream's syncEndpoint does;
//! - a full resync never deletes virtual servers we don't own (another
//!   family, `--ipvs-exclude-cidrs`) and treats extra real servers like
//!   removed ones.

use crate::mutex::lock;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;

use super::services_agreed;
use crate::kernel::{
    ipvs_diff, ipvs_services_differ, Applied, Checked, DestState, IpvsKernel, IpvsTable, KResult, KernelError,
    Subsystem,
};
use crate::msgs::{DestKey, DestSpec, IpvsOp, VsKey, VsSpec};
use crate::net::{IpFamily, Protocol};

/// How often terminating real servers are checked (upstream: 1 minute).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(60);

/// The raw IPVS operations graceful termination is built on.
pub trait IpvsBackend: Clone + Unpin + 'static {
    fn apply_raw(&self, ops: Vec<IpvsOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static;
    fn services(&self) -> impl Future<Output = KResult<Vec<(VsKey, VsSpec)>>> + 'static;
    fn dests(&self, vs: VsKey) -> impl Future<Output = KResult<Vec<(DestKey, DestState)>>> + 'static;
}

/// Which virtual servers a full resync may delete.
#[derive(Debug, Clone, Default)]
pub struct Ownership {
    pub family: IpFamily,
    pub exclude: Vec<IpNet>,
}

impl Ownership {
    pub fn owns(&self, vs: &VsKey) -> bool {
        self.family.matches(&vs.addr) && !self.exclude.iter().any(|n| n.contains(&vs.addr))
    }
}

/// Graceful termination over a backend.
#[derive(Clone)]
pub struct GracefulIpvs<B: IpvsBackend> {
    backend: B,
    owned: Arc<Ownership>,
    check_interval: Duration,
    terminating: Arc<Mutex<BTreeSet<(VsKey, DestKey)>>>,
}

/// Ops translated and sent at a time (see `GracefulIpvs::apply_ops`).
const APPLY_CHUNK: usize = 2048;

fn needs_graceful(p: Protocol) -> bool {
    p == Protocol::Tcp
}

impl<B: IpvsBackend> GracefulIpvs<B> {
    pub fn new(backend: B, owned: Ownership) -> Self {
        GracefulIpvs { backend, owned: Arc::new(owned), check_interval: CHECK_INTERVAL, terminating: Arc::default() }
    }

    /// Checks terminating real servers at another interval than upstream's minute.
    pub fn with_check_interval(mut self, every: Duration) -> Self {
        self.check_interval = every;
        self
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Real servers waiting for their connections to end.
    pub fn terminating(&self) -> BTreeSet<(VsKey, DestKey)> {
        lock(&self.terminating).clone()
    }

    /// Turns the coordinator's ops into kernel ops; returns, for each kernel
    /// op, the index of the coordinator op it answers for.
    async fn translate(&self, ops: &[IpvsOp]) -> (Vec<IpvsOp>, Vec<usize>) {
        // None: the dump failed; its real servers count as having connections.
        let mut conns: BTreeMap<VsKey, Option<BTreeMap<DestKey, DestState>>> = BTreeMap::new();
        let mut out = Vec::with_capacity(ops.len());
        let mut owner = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            match op {
                IpvsOp::DelDest(vs, d) if needs_graceful(vs.protocol) => {
                    if !conns.contains_key(vs) {
                        let dump = match self.backend.dests(*vs).await {
                            Ok(dump) => Some(dump.into_iter().collect()),
                            Err(e) => {
                                tracing::warn!(actor = "ipvs", vs = %vs, error = %e,
                                    "reading real servers' connections failed: draining them as if they had some");
                                None
                            }
                        };
                        conns.insert(*vs, dump);
                    }
                    let busy = match conns.get(vs) {
                        Some(Some(m)) => m.get(d).is_some_and(|st| st.active + st.inactive > 0),
                        _ => true,
                    };
                    if busy {
                        lock(&self.terminating).insert((*vs, *d));
                        out.push(IpvsOp::EditDest(*vs, *d, DestSpec { weight: 0 }));
                    } else {
                        lock(&self.terminating).remove(&(*vs, *d));
                        out.push(op.clone());
                    }
                    owner.push(i);
                }
                IpvsOp::AddDest(vs, d, _) | IpvsOp::EditDest(vs, d, _)
                    if lock(&self.terminating).remove(&(*vs, *d)) =>
                {
                    // Back while terminating: upstream deletes it and adds it afresh.
                    out.push(IpvsOp::DelDest(*vs, *d));
                    owner.push(i);
                    out.push(IpvsOp::AddDest(*vs, *d, DestSpec::default()));
                    owner.push(i);
                }
                IpvsOp::DelService(vs) => {
                    lock(&self.terminating).retain(|(v, _)| v != vs);
                    out.push(op.clone());
                    owner.push(i);
                }
                _ => {
                    out.push(op.clone());
                    owner.push(i);
                }
            }
        }
        (out, owner)
    }

    /// Applies `ops` in order, [`APPLY_CHUNK`] at a time: a full resync at
    /// 10,000 services (≈ 110,000 ops) holds the kernel ops, replies and
    /// errors of one chunk at once besides its ops and results (all of
    /// them at once were ≈ 45 MB of the daemon's peak).
    async fn apply_ops(&self, ops: &[IpvsOp]) -> Vec<KResult<()>> {
        let mut out: Vec<KResult<()>> = Vec::with_capacity(ops.len());
        for chunk in ops.chunks(APPLY_CHUNK) {
            let (kernel_ops, owner) = self.translate(chunk).await;
            let results = self.backend.apply_raw(kernel_ops).await;
            let base = out.len();
            out.resize(base + chunk.len(), Ok(()));
            for (i, r) in owner.into_iter().zip(results) {
                if let Err(e) = r {
                    out[base + i] = Err(e);
                }
            }
        }
        out
    }

    /// Every virtual server, and the real servers of those this handle
    /// owns (a full resync never changes the others: reading theirs would
    /// be a dump per virtual server for nothing, the other family's
    /// proxier reads them).
    async fn dump_table(&self) -> KResult<IpvsTable> {
        let mut table = IpvsTable::default();
        for (vs, spec) in self.services_agreed(None).await? {
            if self.owned.owns(&vs) {
                for (d, st) in self.backend.dests(vs).await? {
                    table.dests.insert((vs, d), st);
                }
            }
            table.services.insert(vs, spec);
        }
        Ok(table)
    }

    /// The virtual servers as two dumps in a row saw them ([`services_agreed`]).
    async fn services_agreed(&self, first: Option<Vec<(VsKey, VsSpec)>>) -> KResult<Vec<(VsKey, VsSpec)>> {
        services_agreed(first, || self.backend.services()).await
    }

    /// Deletes terminating real servers whose connections are gone.
    pub async fn check_terminating(&self) -> Vec<KResult<()>> {
        let pending = self.terminating();
        let mut by_vs: BTreeMap<VsKey, Vec<DestKey>> = BTreeMap::new();
        for (vs, d) in pending {
            by_vs.entry(vs).or_default().push(d);
        }
        let mut dels = Vec::new();
        for (vs, ds) in by_vs {
            let Ok(dump) = self.backend.dests(vs).await else { continue };
            let live: BTreeMap<DestKey, DestState> = dump.into_iter().collect();
            for d in ds {
                if live.get(&d).is_none_or(|st| st.active + st.inactive == 0) {
                    dels.push((vs, d));
                }
            }
        }
        if dels.is_empty() {
            return Vec::new();
        }
        let ops: Vec<IpvsOp> = dels.iter().map(|(vs, d)| IpvsOp::DelDest(*vs, *d)).collect();
        let results = self.backend.apply_raw(ops).await;
        let mut t = lock(&self.terminating);
        for ((vs, d), r) in dels.iter().zip(&results) {
            if r.is_ok() {
                t.remove(&(*vs, *d));
                tracing::debug!(vs = %vs, dest = %d, "terminated real server deleted");
            }
        }
        results
    }
}

impl<B: IpvsBackend> Subsystem for GracefulIpvs<B> {
    type Op = IpvsOp;

    fn apply(&self, ops: Vec<IpvsOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move { me.apply_ops(&ops).await }
    }

    fn reconcile(&self, desired: Vec<IpvsOp>) -> impl Future<Output = Applied<IpvsOp>> + 'static {
        let me = self.clone();
        async move {
            let have = me.dump_table().await?;
            let owned = me.owned.clone();
            let ops = ipvs_diff(desired, &have, |vs| owned.owns(vs));
            let results = me.apply_ops(&ops).await;
            Ok((ops, results))
        }
    }

    /// The virtual servers only (one dump; no real servers read): drift
    /// when one is missing, extra or changed in dumps that agree (a dump
    /// that differs is read again: a write anywhere during a dump can make
    /// it skip or repeat one).
    fn verify(&self, desired: Vec<IpvsOp>) -> impl Future<Output = KResult<Checked<IpvsOp>>> + 'static {
        let me = self.clone();
        async move {
            let owns = |vs: &VsKey| me.owned.owns(vs);
            let first = me.backend.services().await?;
            let mut drift = ipvs_services_differ(&desired, first.iter().cloned(), owns);
            if drift.is_some() {
                let have = me.services_agreed(Some(first)).await?;
                drift = ipvs_services_differ(&desired, have, owns);
            }
            if let Some(what) = &drift {
                tracing::info!(actor = "ipvs", family = ?me.owned.family, drift = %what, "the virtual servers differ from the plan");
            }
            Ok(Checked { applied: Vec::new(), results: Vec::new(), drift: drift.is_some() })
        }
    }

    fn periodic(&self) -> Option<Duration> {
        Some(self.check_interval)
    }

    fn run_periodic(&self) -> impl Future<Output = bool> + 'static {
        let me = self.clone();
        async move {
            for r in me.check_terminating().await {
                if let Err(e) = r {
                    tracing::warn!(actor = "ipvs", error = %e, "deleting a terminated real server failed");
                }
            }
            false
        }
    }
}

impl<B: IpvsBackend> IpvsKernel for GracefulIpvs<B> {
    fn dump(&self) -> impl Future<Output = KResult<IpvsTable>> + 'static {
        let me = self.clone();
        async move { me.dump_table().await }
    }
}

#[cfg(any(test, feature = "testkit"))]
impl IpvsBackend for crate::kernel::mem::MemIpvs {
    fn apply_raw(&self, ops: Vec<IpvsOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        Subsystem::apply(self, ops)
    }

    fn services(&self) -> impl Future<Output = KResult<Vec<(VsKey, VsSpec)>>> + 'static {
        let t = self.snapshot();
        async move { Ok(t.services.into_iter().collect()) }
    }

    fn dests(&self, vs: VsKey) -> impl Future<Output = KResult<Vec<(DestKey, DestState)>>> + 'static {
        let t = self.snapshot();
        async move {
            if !t.services.contains_key(&vs) {
                return Err(KernelError::errno(format!("-L -n {vs}"), 3));
            }
            Ok(t.dests.into_iter().filter(|((v, _), _)| *v == vs).map(|((_, d), st)| (d, st)).collect())
        }
    }
}

impl IpvsBackend for super::netlink::NetlinkIpvs {
    fn apply_raw(&self, ops: Vec<IpvsOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move {
            let results = me.apply(&ops).await;
            // The op is named (`ipvsadm ...`) only when it failed.
            results
                .into_iter()
                .zip(&ops)
                .map(|(r, op)| r.map_err(|e| kernel_error(format!("ipvsadm {op}"), &e)))
                .collect()
        }
    }

    fn services(&self) -> impl Future<Output = KResult<Vec<(VsKey, VsSpec)>>> + 'static {
        let me = self.clone();
        async move { me.services().await.map_err(|e| kernel_error("ipvsadm -L -n", &e)) }
    }

    fn dests(&self, vs: VsKey) -> impl Future<Output = KResult<Vec<(DestKey, DestState)>>> + 'static {
        let me = self.clone();
        async move {
            let dump = me.dests(&vs).await.map_err(|e| kernel_error(format!("ipvsadm -L -n {vs}"), &e))?;
            Ok(dump.into_iter().map(|(d, spec, active, inactive)| (d, DestState { spec, active, inactive })).collect())
        }
    }
}

fn kernel_error(op: impl std::fmt::Display, e: &super::netlink::IpvsError) -> KernelError {
    KernelError::library(op, !e.is_unknown_outcome(), e.errno().map(|n| n.0), e.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::mem::{Journal, MemIpvs};
    use std::sync::atomic::Ordering::SeqCst;

    fn vs(p: Protocol) -> VsKey {
        VsKey { addr: "10.96.0.1".parse().unwrap(), protocol: p, port: 80 }
    }

    fn dest(n: u8) -> DestKey {
        DestKey { addr: format!("10.244.0.{n}").parse().unwrap(), port: 8080 }
    }

    fn spec() -> VsSpec {
        VsSpec { scheduler: "rr".into(), flags: 0, timeout: 0 }
    }

    async fn setup(p: Protocol) -> (GracefulIpvs<MemIpvs>, MemIpvs) {
        let mem = MemIpvs::new(&Journal::default());
        let g = GracefulIpvs::new(mem.clone(), Ownership { family: IpFamily::V4, exclude: vec![] });
        let ops = vec![
            IpvsOp::AddService(vs(p), spec()),
            IpvsOp::AddDest(vs(p), dest(1), DestSpec::default()),
            IpvsOp::AddDest(vs(p), dest(2), DestSpec::default()),
        ];
        assert!(g.apply(ops).await.iter().all(|r| r.is_ok()));
        (g, mem)
    }

    fn set_conns(mem: &MemIpvs, p: Protocol, d: DestKey, active: u32, inactive: u32) {
        let mut t = mem.table.lock().unwrap();
        let st = t.dests.get_mut(&(vs(p), d)).expect("dest exists");
        st.active = active;
        st.inactive = inactive;
    }

    fn weight(mem: &MemIpvs, p: Protocol, d: DestKey) -> Option<i32> {
        mem.snapshot().dests.get(&(vs(p), d)).map(|s| s.spec.weight)
    }

    #[tokio::test]
    async fn a_batch_larger_than_a_chunk_keeps_its_order_and_each_result_in_place() {
        let mem = MemIpvs::new(&Journal::default());
        let g = GracefulIpvs::new(mem.clone(), Ownership { family: IpFamily::V4, exclude: vec![] });
        let p = Protocol::Tcp;
        let many = |i: usize| DestKey { addr: std::net::Ipv4Addr::from(0x0af4_0000 + i as u32).into(), port: 8080 };
        let mut ops = vec![IpvsOp::AddService(vs(p), spec())];
        ops.extend((0..APPLY_CHUNK + 10).map(|i| IpvsOp::AddDest(vs(p), many(i), DestSpec::default())));
        // A real server of a virtual server that does not exist, in the second chunk.
        let orphan = VsKey { port: 81, ..vs(p) };
        let bad = APPLY_CHUNK + 5;
        ops.insert(bad, IpvsOp::AddDest(orphan, dest(1), DestSpec::default()));
        let results = g.apply(ops.clone()).await;
        assert_eq!(results.len(), ops.len());
        let failed: Vec<usize> = results.iter().enumerate().filter(|(_, r)| r.is_err()).map(|(i, _)| i).collect();
        assert_eq!(failed, [bad]);
        assert_eq!(mem.snapshot().dests.len(), APPLY_CHUNK + 10, "every other real server went in");
    }

    #[tokio::test]
    async fn tcp_real_server_with_connections_gets_weight_0_until_they_end() {
        let (g, mem) = setup(Protocol::Tcp).await;
        set_conns(&mem, Protocol::Tcp, dest(1), 1, 0);
        let r = g
            .apply(vec![IpvsOp::DelDest(vs(Protocol::Tcp), dest(1)), IpvsOp::DelDest(vs(Protocol::Tcp), dest(2))])
            .await;
        assert!(r.iter().all(|r| r.is_ok()));
        assert_eq!(weight(&mem, Protocol::Tcp, dest(1)), Some(0), "kept with weight 0");
        assert_eq!(weight(&mem, Protocol::Tcp, dest(2)), None, "no connections: deleted at once");
        assert!(g.check_terminating().await.is_empty(), "still has a connection");
        set_conns(&mem, Protocol::Tcp, dest(1), 0, 1);
        g.check_terminating().await;
        assert_eq!(weight(&mem, Protocol::Tcp, dest(1)), Some(0), "inactive connections count too");
        set_conns(&mem, Protocol::Tcp, dest(1), 0, 0);
        assert_eq!(g.check_terminating().await.len(), 1);
        assert_eq!(weight(&mem, Protocol::Tcp, dest(1)), None);
        assert!(g.terminating().is_empty());
    }

    /// MemIpvs whose real-server dumps fail while `lost` is set, and whose
    /// service dumps, while `skewed` counts down, read as a positional dump
    /// does while a service elsewhere is added or deleted: the first
    /// service skipped and the last one returned twice.
    #[derive(Clone, Default)]
    struct Faulty {
        mem: MemIpvs,
        lost: Arc<std::sync::atomic::AtomicBool>,
        skewed: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl IpvsBackend for Faulty {
        fn apply_raw(&self, ops: Vec<IpvsOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
            self.mem.apply_raw(ops)
        }
        fn services(&self) -> impl Future<Output = KResult<Vec<(VsKey, VsSpec)>>> + 'static {
            let skewed = self.skewed.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok();
            let services = self.mem.services();
            async move {
                let mut list = services.await?;
                if skewed {
                    list.remove(0);
                    list.extend(list.last().cloned());
                }
                Ok(list)
            }
        }
        fn dests(&self, vs: VsKey) -> impl Future<Output = KResult<Vec<(DestKey, DestState)>>> + 'static {
            let lost = self.lost.load(SeqCst);
            let dests = self.mem.dests(vs);
            async move {
                match lost {
                    true => Err(KernelError::unknown("-L -n", "reply lost")),
                    false => dests.await,
                }
            }
        }
    }

    #[tokio::test]
    async fn a_failed_connection_dump_drains_instead_of_deleting() {
        let (_, mem) = setup(Protocol::Tcp).await;
        let faulty = Faulty { mem: mem.clone(), lost: Arc::new(true.into()), ..Faulty::default() };
        let failing = faulty.lost.clone();
        let g = GracefulIpvs::new(faulty, Ownership { family: IpFamily::V4, exclude: vec![] });
        let r = g.apply(vec![IpvsOp::DelDest(vs(Protocol::Tcp), dest(1))]).await;
        assert!(r.iter().all(|r| r.is_ok()));
        assert_eq!(weight(&mem, Protocol::Tcp, dest(1)), Some(0), "kept with weight 0: connections unknown");
        assert!(g.check_terminating().await.is_empty(), "still unknown: kept");
        failing.store(false, SeqCst);
        assert_eq!(g.check_terminating().await.len(), 1, "no connections once it can read them: deleted");
        assert_eq!(weight(&mem, Protocol::Tcp, dest(1)), None);
    }

    fn skewed(mem: &MemIpvs, reads: usize) -> GracefulIpvs<Faulty> {
        let faulty = Faulty { mem: mem.clone(), skewed: Arc::new(reads.into()), ..Faulty::default() };
        GracefulIpvs::new(faulty, Ownership { family: IpFamily::V4, exclude: vec![] })
    }

    fn two_services() -> Vec<IpvsOp> {
        let other = VsKey { port: 81, ..vs(Protocol::Tcp) };
        vec![
            IpvsOp::AddService(vs(Protocol::Tcp), spec()),
            IpvsOp::AddDest(vs(Protocol::Tcp), dest(1), DestSpec::default()),
            IpvsOp::AddService(other, spec()),
        ]
    }

    #[tokio::test]
    async fn the_check_reads_a_skewed_service_dump_again_before_calling_it_drift() {
        let mem = MemIpvs::new(&Journal::default());
        let desired = two_services();
        assert!(skewed(&mem, 0).apply(desired.clone()).await.iter().all(|r| r.is_ok()));
        let checked = skewed(&mem, 1).verify(desired.clone()).await.expect("read");
        assert!(!checked.drift, "one skewed dump is no drift");
        // Two skewed dumps that agree, and drift that stays, are drift.
        assert!(skewed(&mem, 2).verify(desired.clone()).await.expect("read").drift);
        mem.table.lock().unwrap().services.remove(&vs(Protocol::Tcp));
        assert!(skewed(&mem, 0).verify(desired).await.expect("read").drift);
    }

    #[tokio::test]
    async fn a_full_resync_reads_the_services_until_two_dumps_agree() {
        let mem = MemIpvs::new(&Journal::default());
        let mut desired = two_services();
        let g = skewed(&mem, 0);
        g.apply(desired.clone()).await;
        g.apply(vec![IpvsOp::AddDest(vs(Protocol::Tcp), dest(2), DestSpec::default())]).await;
        // The first dump skips the service whose extra real server is to go.
        desired.sort();
        let (ops, _) = skewed(&mem, 1).reconcile(desired).await.expect("read");
        assert_eq!(ops, vec![IpvsOp::DelDest(vs(Protocol::Tcp), dest(2))]);
    }

    #[tokio::test]
    async fn udp_and_sctp_real_servers_are_deleted_at_once() {
        for p in [Protocol::Udp, Protocol::Sctp] {
            let (g, mem) = setup(p).await;
            set_conns(&mem, p, dest(1), 3, 3);
            g.apply(vec![IpvsOp::DelDest(vs(p), dest(1))]).await;
            assert_eq!(weight(&mem, p, dest(1)), None, "{p}");
        }
    }

    #[tokio::test]
    async fn a_terminating_real_server_that_comes_back_is_re_added_with_weight_1() {
        let (g, mem) = setup(Protocol::Tcp).await;
        set_conns(&mem, Protocol::Tcp, dest(1), 1, 0);
        g.apply(vec![IpvsOp::DelDest(vs(Protocol::Tcp), dest(1))]).await;
        let r = g.apply(vec![IpvsOp::AddDest(vs(Protocol::Tcp), dest(1), DestSpec::default())]).await;
        assert_eq!(r.len(), 1);
        assert!(r[0].is_ok());
        assert_eq!(weight(&mem, Protocol::Tcp, dest(1)), Some(1));
        assert!(g.terminating().is_empty());
    }

    #[tokio::test]
    async fn a_full_resync_reads_the_real_servers_of_its_own_virtual_servers_only() {
        let (_, mem) = setup(Protocol::Tcp).await;
        // Every real-server dump fails: a handle that reads only its own
        // family's finds nothing to read in an IPv4 table.
        let faulty = Faulty { mem: mem.clone(), lost: Arc::new(true.into()), ..Faulty::default() };
        let v6 = GracefulIpvs::new(faulty, Ownership { family: IpFamily::V6, exclude: vec![] });
        let (ops, _) = v6.reconcile(Vec::new()).await.expect("no IPv4 real servers read");
        assert!(ops.is_empty(), "{ops:?}");
        assert_eq!(weight(&mem, Protocol::Tcp, dest(1)), Some(1), "the other family's left alone");
    }

    #[tokio::test]
    async fn full_resync_keeps_virtual_servers_it_does_not_own() {
        let mem = MemIpvs::new(&Journal::default());
        let g = GracefulIpvs::new(
            mem.clone(),
            Ownership { family: IpFamily::V4, exclude: vec!["172.16.0.0/12".parse().unwrap()] },
        );
        let foreign = VsKey { addr: "172.16.0.1".parse().unwrap(), protocol: Protocol::Tcp, port: 80 };
        let v6 = VsKey { addr: "fd00::1".parse().unwrap(), protocol: Protocol::Tcp, port: 80 };
        let stale = VsKey { addr: "10.96.9.9".parse().unwrap(), protocol: Protocol::Tcp, port: 80 };
        g.apply(vec![
            IpvsOp::AddService(foreign, spec()),
            IpvsOp::AddService(v6, spec()),
            IpvsOp::AddService(stale, spec()),
        ])
        .await;
        let (ops, results) = g.reconcile(vec![IpvsOp::AddService(vs(Protocol::Tcp), spec())]).await.unwrap();
        assert!(results.iter().all(|r| r.is_ok()));
        assert_eq!(ops, vec![IpvsOp::AddService(vs(Protocol::Tcp), spec()), IpvsOp::DelService(stale)]);
        let have = mem.snapshot();
        assert!(have.services.contains_key(&foreign) && have.services.contains_key(&v6));
    }

    #[tokio::test]
    async fn full_resync_terminates_extra_real_servers_gracefully() {
        let (g, mem) = setup(Protocol::Tcp).await;
        set_conns(&mem, Protocol::Tcp, dest(2), 2, 0);
        let desired = vec![
            IpvsOp::AddService(vs(Protocol::Tcp), spec()),
            IpvsOp::AddDest(vs(Protocol::Tcp), dest(1), DestSpec::default()),
        ];
        g.reconcile(desired.clone()).await.unwrap();
        assert_eq!(weight(&mem, Protocol::Tcp, dest(2)), Some(0));
        // The next full resync leaves it alone while it drains.
        let (ops, _) = g.reconcile(desired).await.unwrap();
        assert_eq!(ops, vec![IpvsOp::DelDest(vs(Protocol::Tcp), dest(2))]);
        assert_eq!(weight(&mem, Protocol::Tcp, dest(2)), Some(0));
    }
}
