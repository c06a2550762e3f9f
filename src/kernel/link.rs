//! [`DummyLink`]: the `kube-ipvs0` device and the service addresses bound to
//! it, over rtnetlink, as upstream's IPVS proxier does (docs/upstream/ipvs.md e.4).
//!
//! - `ensure` uses a link named `kube-ipvs0` whatever its type; if there is
//!   none it creates a `dummy` one. It never sets the link up: upstream leaves
//!   it DOWN, and the local routes of its addresses still make them local.
//! - Bind adds `addr/32` (`/128`); an address already there is fine. Unbind
//!   deletes it; an address already gone is fine.
//! - `addresses` is one address dump, filtered to the link (and to one
//!   family, if the handle has one), never a request per service.
//! - Every netlink request is counted ([`DummyLink::requests`]).
//!
//! The socket lives in the network namespace of the thread that called
//! [`DummyLink::new`].

use crate::mutex::lock;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use nix::errno::Errno;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage};
use rtnetlink::packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use rtnetlink::{AddressMessageBuilder, Handle, LinkDummy};
use tracing::{debug, info};

use super::{set_diff, Applied, KResult, KernelError, LinkKernel, Subsystem};
use crate::msgs::link::DUMMY_LINK;
use crate::msgs::LinkOp;
use crate::net::IpFamily;

/// Netlink requests in flight at once while applying a batch (the acks of
/// a much larger burst could overflow the socket's receive buffer).
const IN_FLIGHT: usize = 32;

/// The dummy link and its addresses. Cheap to clone; clones share the
/// socket, the cached link index and the counter.
#[derive(Debug, Clone)]
pub struct DummyLink {
    handle: Handle,
    name: Arc<str>,
    family: Option<IpFamily>,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// The link's index, once found or created.
    index: Mutex<Option<u32>>,
    /// Prefix lengths seen in the last dump: a delete must name the right one.
    prefixes: Mutex<HashMap<IpAddr, u8>>,
    requests: AtomicU64,
}

impl DummyLink {
    /// Opens an rtnetlink socket (in the calling thread's network namespace)
    /// and spawns its connection task on the current Tokio runtime (outside
    /// one, this is an error). Touches nothing yet.
    pub fn new() -> KResult<DummyLink> {
        const OP: &str = "open rtnetlink socket";
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| KernelError::refused(OP, e.to_string()))?;
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| KernelError::io(OP, e))?;
        runtime.spawn(conn);
        Ok(DummyLink { handle, name: Arc::from(DUMMY_LINK), family: None, shared: Arc::default() })
    }

    /// Uses another link name (tests).
    pub fn with_name(mut self, name: &str) -> DummyLink {
        self.name = Arc::from(name);
        self
    }

    /// Sees and reconciles only `family`'s addresses (one proxier per
    /// family, as upstream): the other family's are left alone.
    pub fn with_family(mut self, family: IpFamily) -> DummyLink {
        self.family = Some(family);
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Netlink requests sent so far (lookups, dumps, adds and deletes).
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.shared.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Finds the link, creating a dummy one if there is none; returns its index.
    pub async fn ensure(&self) -> KResult<u32> {
        if let Some(link) = self.find().await? {
            return self.remember(&link);
        }
        self.create().await?;
        let link = self.find().await?.ok_or_else(|| {
            KernelError::refused(format!("create {} type dummy", self.name), "link gone after creation")
        })?;
        self.remember(&link)
    }

    fn remember(&self, link: &LinkMessage) -> KResult<u32> {
        let index = link.header.index;
        *lock(&self.shared.index) = Some(index);
        Ok(index)
    }

    /// The link named like ours, if any.
    async fn find(&self) -> KResult<Option<LinkMessage>> {
        self.count();
        let mut links = self.handle.link().get().match_name(self.name.to_string()).execute();
        match links.try_next().await {
            Ok(link) => Ok(link),
            Err(e) if errno_of(&e) == Some(Errno::ENODEV as i32) => Ok(None),
            Err(e) => Err(nl_error(format!("get link {}", self.name), e)),
        }
    }

    async fn create(&self) -> KResult<()> {
        let op = format!("create {} type dummy", self.name);
        self.count();
        match self.handle.link().add(LinkDummy::new(&self.name).build()).execute().await {
            Ok(()) => {
                info!(link = %self.name, "created dummy link");
                Ok(())
            }
            // Created by someone else meanwhile: use it.
            Err(e) if errno_of(&e) == Some(Errno::EEXIST as i32) => Ok(()),
            Err(e) => Err(nl_error(op, e)),
        }
    }

    /// Deletes the link if it exists and is a dummy (for `--cleanup`);
    /// returns whether it existed. A link of another type is an error and
    /// is left alone, as upstream.
    pub async fn delete_link(&self) -> KResult<bool> {
        let Some(link) = self.find().await? else { return Ok(false) };
        let op = format!("delete link {}", self.name);
        match link_kind(&link) {
            Some(InfoKind::Dummy) => {}
            kind => {
                let kind = kind.map_or_else(|| "device".to_string(), |k| k.to_string());
                return Err(KernelError::refused(
                    op,
                    format!("{} is a {kind}, not a dummy: not deleting it", self.name),
                ));
            }
        }
        self.count();
        match self.handle.link().del(link.header.index).execute().await {
            Ok(()) => {
                *lock(&self.shared.index) = None;
                info!(link = %self.name, "deleted dummy link");
                Ok(true)
            }
            Err(e) if errno_of(&e) == Some(Errno::ENODEV as i32) => Ok(false),
            Err(e) => Err(nl_error(op, e)),
        }
    }

    /// The cached index, or the link found (or created) now.
    async fn index(&self) -> KResult<u32> {
        let cached = *lock(&self.shared.index);
        match cached {
            Some(i) => Ok(i),
            None => self.ensure().await,
        }
    }

    async fn apply_ops(&self, ops: &[LinkOp]) -> Vec<KResult<()>> {
        if ops.is_empty() {
            return Vec::new();
        }
        let index = match self.index().await {
            Ok(i) => i,
            Err(e) => return ops.iter().map(|op| Err(KernelError::refused(op, e.to_string()))).collect(),
        };
        let results: Vec<KResult<()>> =
            futures::stream::iter(ops).map(|op| self.apply_one(index, *op)).buffered(IN_FLIGHT).collect().await;
        if results.iter().any(|r| matches!(r, Err(e) if e.errno_value() == Some(Errno::ENODEV as i32))) {
            // The link went away: look it up again next time.
            *lock(&self.shared.index) = None;
        }
        results
    }

    async fn apply_one(&self, index: u32, op: LinkOp) -> KResult<()> {
        self.count();
        let result = match op {
            LinkOp::Bind(ip) => {
                let mut req = self.handle.address().add(index, ip, host_prefix(ip));
                if ip.is_ipv6() {
                    // kube-ipvs0 stays down: without NODAD an IPv6 address would
                    // stay tentative, and the kernel would not take it as local.
                    let msg = req.message_mut();
                    msg.header.flags |= AddressHeaderFlags::Nodad;
                    msg.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
                }
                req.execute().await
            }
            LinkOp::Unbind(ip) => {
                let prefix = lock(&self.shared.prefixes).get(&ip).copied().unwrap_or_else(|| host_prefix(ip));
                self.handle.address().del(address_message(index, ip, prefix)).execute().await
            }
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) if is_idempotent(op, errno_of(&e)) => {
                debug!(%op, error = %e, "already done");
                Ok(())
            }
            Err(e) => Err(nl_error(op, e)),
        }
    }

    /// The link's addresses (of this handle's family), from one dump. No
    /// link, no addresses.
    async fn dump(&self) -> KResult<BTreeSet<IpAddr>> {
        let Some(link) = self.find().await? else { return Ok(BTreeSet::new()) };
        let index = self.remember(&link)?;
        self.count();
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(|e| nl_error(format!("dump addresses of {}", self.name), e))?;
        let mut prefixes = HashMap::new();
        let addrs = msgs
            .iter()
            .filter_map(|m| local_address(m).map(|ip| (ip, m.header.prefix_len)))
            .filter(|(ip, _)| self.owns(ip))
            .map(|(ip, prefix)| {
                prefixes.insert(ip, prefix);
                ip
            })
            .collect();
        *lock(&self.shared.prefixes) = prefixes;
        Ok(addrs)
    }

    /// Whether reconcile may touch `ip`: this family, and not an IPv6
    /// link-local address (never a service address).
    fn owns(&self, ip: &IpAddr) -> bool {
        let family_ok = match self.family {
            None => true,
            Some(IpFamily::V4) => ip.is_ipv4(),
            Some(IpFamily::V6) => ip.is_ipv6(),
        };
        let link_local = matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local());
        family_ok && !link_local
    }

    async fn reconcile_ops(&self, desired: Vec<LinkOp>) -> Applied<LinkOp> {
        self.ensure().await?;
        let have = self.dump().await?;
        let want: BTreeSet<IpAddr> =
            desired.iter().filter_map(|op| if let LinkOp::Bind(a) = op { Some(*a) } else { None }).collect();
        let ops = set_diff(&want, &have, LinkOp::Bind, LinkOp::Unbind);
        if !ops.is_empty() {
            info!(link = %self.name, ops = ops.len(), "link address drift repaired");
        }
        let results = self.apply_ops(&ops).await;
        Ok((ops, results))
    }
}

impl Subsystem for DummyLink {
    type Op = LinkOp;

    fn apply(&self, ops: Vec<LinkOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move { me.apply_ops(&ops).await }
    }

    fn reconcile(&self, desired: Vec<LinkOp>) -> impl Future<Output = Applied<LinkOp>> + 'static {
        let me = self.clone();
        async move { me.reconcile_ops(desired).await }
    }
}

impl LinkKernel for DummyLink {
    fn addresses(&self) -> impl Future<Output = KResult<BTreeSet<IpAddr>>> + 'static {
        let me = self.clone();
        async move { me.dump().await }
    }
}

/// /32 for IPv4, /128 for IPv6: a service address alone.
fn host_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

/// What counts as done: binding a bound address, unbinding a gone one.
fn is_idempotent(op: LinkOp, errno: Option<i32>) -> bool {
    let Some(errno) = errno else { return false };
    match op {
        LinkOp::Bind(_) => errno == Errno::EEXIST as i32,
        LinkOp::Unbind(_) => [Errno::ENOENT, Errno::EADDRNOTAVAIL, Errno::ENXIO].iter().any(|e| *e as i32 == errno),
    }
}

fn address_message(index: u32, ip: IpAddr, prefix: u8) -> AddressMessage {
    match ip {
        IpAddr::V4(v4) => AddressMessageBuilder::<std::net::Ipv4Addr>::new().index(index).address(v4, prefix).build(),
        IpAddr::V6(v6) => AddressMessageBuilder::<std::net::Ipv6Addr>::new().index(index).address(v6, prefix).build(),
    }
}

/// The address an RTM_NEWADDR describes: IFA_LOCAL (IPv4; IFA_ADDRESS is
/// the peer on point-to-point links), else IFA_ADDRESS.
fn local_address(m: &AddressMessage) -> Option<IpAddr> {
    let local = m.attributes.iter().find_map(|a| if let AddressAttribute::Local(ip) = a { Some(*ip) } else { None });
    local.or_else(|| {
        m.attributes.iter().find_map(|a| if let AddressAttribute::Address(ip) = a { Some(*ip) } else { None })
    })
}

/// The link's kind (IFLA_INFO_KIND): dummy, veth, ...; None for a plain device.
fn link_kind(link: &LinkMessage) -> Option<InfoKind> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => {
            infos.iter().find_map(|i| if let LinkInfo::Kind(k) = i { Some(k.clone()) } else { None })
        }
        _ => None,
    })
}

/// The errno of a netlink error reply (positive), if it is one.
fn errno_of(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| c.get().saturating_neg()),
        _ => None,
    }
}

/// Refused when the kernel answered with an errno; otherwise (the socket
/// failed, no answer) the outcome is unknown.
fn nl_error(op: impl std::fmt::Display, e: rtnetlink::Error) -> KernelError {
    let errno = errno_of(&e);
    KernelError::library(op, errno.is_some(), errno, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_hosts_and_treats_repeats_as_done() {
        assert_eq!(host_prefix("10.96.0.10".parse().unwrap()), 32);
        assert_eq!(host_prefix("fd00::10".parse().unwrap()), 128);
        let ip: IpAddr = "10.96.0.10".parse().unwrap();
        assert!(is_idempotent(LinkOp::Bind(ip), Some(Errno::EEXIST as i32)));
        assert!(!is_idempotent(LinkOp::Bind(ip), Some(Errno::EPERM as i32)));
        assert!(is_idempotent(LinkOp::Unbind(ip), Some(Errno::EADDRNOTAVAIL as i32)));
        assert!(is_idempotent(LinkOp::Unbind(ip), Some(Errno::ENOENT as i32)));
        assert!(!is_idempotent(LinkOp::Unbind(ip), Some(Errno::ENODEV as i32)));
        assert!(!is_idempotent(LinkOp::Unbind(ip), None));
    }

    #[test]
    fn reads_the_local_address_of_a_message() {
        let v4 = address_message(3, "10.96.0.10".parse().unwrap(), 32);
        assert_eq!(v4.header.index, 3);
        assert_eq!(v4.header.prefix_len, 32);
        assert_eq!(local_address(&v4), Some("10.96.0.10".parse().unwrap()));
        let mut v6 = address_message(3, "fd00::10".parse().unwrap(), 128);
        v6.attributes.retain(|a| matches!(a, AddressAttribute::Address(_)));
        assert_eq!(local_address(&v6), Some("fd00::10".parse().unwrap()));
    }

    #[test]
    fn tells_a_dummy_link_from_others() {
        let mut link = LinkMessage::default();
        assert_eq!(link_kind(&link), None);
        link.attributes.push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Dummy)]));
        assert_eq!(link_kind(&link), Some(InfoKind::Dummy));
    }

    #[test]
    fn outside_a_runtime_opening_is_an_error_not_a_panic() {
        let err = DummyLink::new().expect_err("no runtime");
        assert_eq!(err.op(), "open rtnetlink socket");
    }

    /// The handle needs a runtime and a socket; creating it touches nothing.
    #[tokio::test]
    async fn opens_without_touching_the_kernel() {
        let link = DummyLink::new().expect("rtnetlink socket").with_family(IpFamily::V4);
        assert_eq!(link.name(), DUMMY_LINK);
        assert_eq!(link.requests(), 0);
        assert!(link.owns(&"10.0.0.1".parse().unwrap()));
        assert!(!link.owns(&"fd00::1".parse().unwrap()));
        let any = DummyLink::new().expect("socket");
        assert!(!any.owns(&"fe80::1".parse().unwrap()));
    }
}
