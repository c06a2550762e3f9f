//! [`IpsetHandle`]: one ipset, programmed in-process over the kernel's
//! ip_set netlink interface ([`netlink::NetlinkIpset`], our own codec in
//! [`codec`]): the same sets, members and parameters as upstream's `ipset`
//! tool programs, without starting a process.
//!
//! - A batch is one add/del request per op, pipelined ([`MAX_BATCH`](crate::kernel::netlink::MAX_BATCH)
//!   per datagram), each acked on its own: one bad entry fails only itself.
//!   The requests carry no `NLM_F_EXCL`, the tool's `-exist`: adding a
//!   member that is there and deleting one that is gone succeed.
//! - An entry that cannot belong to the set (another set type, another IP
//!   family) fails before anything is sent, as the tool's parser refuses it.
//! - `ensure` creates the set with upstream's parameters (`ipset create ...
//!   -exist`); a set of that name with other parameters is read back: of
//!   another type or family it is an error, otherwise it is used as it is.
//! - `members` lists the set and checks its type and family; the
//!   syncPeriod's check reads the header's member count alone.
//! - Every add/del request sent is counted ([`IpsetHandle::ops_sent`]).
//!
//! Why not the `ipset` crate (libipset bindings): its port type has no
//! protocol (a hash:ip,port member without one is refused), listing
//! hash:ip,port members fails and listing bitmap:port panics, a bad line in
//! its restore path exits the process (libipset's default error handler),
//! it needs bindgen and libclang, and libipset is GPL-2.0-only, which this
//! Apache-2.0 daemon should not link.

pub mod codec;
pub mod netlink;

#[cfg(test)]
mod captures;

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ipnet::IpNet;
use tracing::{info, warn};

use self::codec::SetHeader;
use self::netlink::{NetlinkIpset, IPSET_ERR_EXIST};
use super::{set_diff, Applied, Checked, IpsetKernel, KResult, KernelError, Subsystem};
use crate::msgs::ipset::SetLine;
use crate::msgs::{IpsetOp, SetEntry, SetSpec, SetType};
use crate::net::{IpFamily, Protocol};

/// `EEXIST`: what the kernel answers a create of a name that exists with
/// other parameters.
const EEXIST: i32 = crate::kernel::netlink::Errno::EEXIST.0;

/// One set, over a shared [`NetlinkIpset`] client. Cheap to clone; clones
/// share the client and the counter.
#[derive(Debug, Clone)]
pub struct IpsetHandle {
    spec: SetSpec,
    ipset: NetlinkIpset,
    ops_sent: Arc<AtomicU64>,
}

impl IpsetHandle {
    /// A handle for `spec` over `ipset` (one client serves every set).
    pub fn new(ipset: &NetlinkIpset, spec: SetSpec) -> IpsetHandle {
        IpsetHandle { spec, ipset: ipset.clone(), ops_sent: Arc::default() }
    }

    /// Add/del requests sent to the kernel so far (one netlink message each).
    pub fn ops_sent(&self) -> u64 {
        self.ops_sent.load(Ordering::Relaxed)
    }

    fn line(&self, op: &IpsetOp) -> String {
        SetLine(&self.spec.name, op).to_string()
    }

    /// Applies `ops` in order, one result each (see the module doc).
    async fn apply_ops(&self, ops: &[IpsetOp]) -> Vec<KResult<()>> {
        let mut results: Vec<KResult<()>> = Vec::with_capacity(ops.len());
        let mut sendable = Vec::with_capacity(ops.len());
        for op in ops {
            match misfit(&self.spec, op) {
                Some(why) => results.push(Err(KernelError::refused(self.line(op), why))),
                None => {
                    results.push(Ok(()));
                    sendable.push(op.clone());
                }
            }
        }
        if sendable.is_empty() {
            return results;
        }
        self.ops_sent.fetch_add(sendable.len() as u64, Ordering::Relaxed);
        let mut sent = self.ipset.apply(&self.spec, &sendable).await.into_iter().zip(&sendable);
        for (r, op) in results.iter_mut().zip(ops) {
            if r.is_err() {
                continue;
            }
            if let Some((outcome, sent_op)) = sent.next() {
                debug_assert_eq!(sent_op, op);
                *r = outcome.map_err(|e| e.for_op(self.line(op)));
            }
        }
        results
    }

    async fn ensure_set(&self) -> KResult<()> {
        let create = self.spec.create_line();
        let refused = match self.ipset.create(&self.spec).await {
            Ok(()) => return Ok(()),
            Err(e) if matches!(e.errno(), Some(EEXIST | IPSET_ERR_EXIST)) => e,
            Err(e) => return Err(e.for_op(create)),
        };
        // Same name, other type or parameters: say which.
        let have = match self.ipset.list(&self.spec.name, true).await {
            Ok(Some(listing)) => listing.header,
            Ok(None) => return Err(refused.for_op(create)),
            Err(e) => return Err(e.for_op(create)),
        };
        match header_mismatch(&self.spec, &have) {
            Some(why) => Err(KernelError::refused(create, why)),
            None => {
                warn!(set = %self.spec.name, have_type = %have.type_name, have_revision = have.revision, want = %create,
                    "ipset exists with other parameters; using it");
                Ok(())
            }
        }
    }

    async fn read_members(&self) -> KResult<BTreeSet<SetEntry>> {
        let op = format!("list {}", self.spec.name);
        let listing = match self.ipset.list(&self.spec.name, false).await {
            Ok(Some(listing)) => listing,
            Ok(None) => return Err(KernelError::refused(op, "the set does not exist")),
            Err(e) => return Err(e.for_op(op)),
        };
        if let Some(why) = header_mismatch(&self.spec, &listing.header) {
            return Err(KernelError::refused(op, why));
        }
        let mut members = BTreeSet::new();
        for attrs in &listing.members {
            match codec::member_entry(self.spec.set_type, attrs) {
                Some(e) => {
                    members.insert(e);
                }
                None => warn!(set = %self.spec.name, member = ?attrs, "ipset member not understood; left alone"),
            }
        }
        Ok(members)
    }

    /// The header's member count (`ipset list -t`); None when the set is
    /// missing or the count unreadable.
    async fn entry_count(&self) -> Option<usize> {
        let listing = self.ipset.list(&self.spec.name, true).await.ok()??;
        usize::try_from(listing.header.elements?).ok()
    }

    /// The syncPeriod's check: the member count from the set's header; a
    /// reconcile (a full listing) only when it differs or the set is gone.
    async fn verify_ops(&self, desired: Vec<IpsetOp>) -> KResult<Checked<IpsetOp>> {
        let want: BTreeSet<SetEntry> =
            desired.iter().filter_map(|op| if let IpsetOp::Add(e) = op { Some(canonical(*e)) } else { None }).collect();
        if self.entry_count().await == Some(want.len()) {
            return Ok(Checked { applied: Vec::new(), results: Vec::new(), drift: false });
        }
        let (applied, results) = self.reconcile_ops(desired).await?;
        Ok(Checked { applied, results, drift: false })
    }

    async fn reconcile_ops(&self, desired: Vec<IpsetOp>) -> Applied<IpsetOp> {
        self.ensure_set().await?;
        let have = self.read_members().await?;
        let want: BTreeSet<SetEntry> =
            desired.iter().filter_map(|op| if let IpsetOp::Add(e) = op { Some(canonical(*e)) } else { None }).collect();
        // Deletes first, to make room (upstream and cilium do the same).
        let mut ops = set_diff(&want, &have, IpsetOp::Add, IpsetOp::Del);
        ops.sort_by_key(|op| matches!(op, IpsetOp::Add(_)));
        if !ops.is_empty() {
            info!(set = %self.spec.name, ops = ops.len(), "ipset drift repaired");
        }
        let results = self.apply_ops(&ops).await;
        Ok((ops, results))
    }
}

impl Subsystem for IpsetHandle {
    type Op = IpsetOp;

    fn apply(&self, ops: Vec<IpsetOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move { me.apply_ops(&ops).await }
    }

    fn reconcile(&self, desired: Vec<IpsetOp>) -> impl Future<Output = Applied<IpsetOp>> + 'static {
        let me = self.clone();
        async move { me.reconcile_ops(desired).await }
    }

    fn verify(&self, desired: Vec<IpsetOp>) -> impl Future<Output = KResult<Checked<IpsetOp>>> + 'static {
        let me = self.clone();
        async move { me.verify_ops(desired).await }
    }
}

impl IpsetKernel for IpsetHandle {
    fn spec(&self) -> &SetSpec {
        &self.spec
    }

    fn ensure(&self) -> impl Future<Output = KResult<()>> + 'static {
        let me = self.clone();
        async move { me.ensure_set().await }
    }

    fn members(&self) -> impl Future<Output = KResult<BTreeSet<SetEntry>>> + 'static {
        let me = self.clone();
        async move { me.read_members().await }
    }
}

/// Why `op`'s entry cannot be a member of `spec`'s set (another set type,
/// an address of another family); None if it can.
fn misfit(spec: &SetSpec, op: &IpsetOp) -> Option<String> {
    let (IpsetOp::Add(e) | IpsetOp::Del(e)) = op;
    if e.set_type() != spec.set_type {
        return Some(format!(
            "a {} member does not fit set {} of type {}",
            e.set_type().as_str(),
            spec.name,
            spec.set_type.as_str()
        ));
    }
    let addrs: Vec<IpAddr> = match *e {
        SetEntry::Port(_) => Vec::new(),
        SetEntry::Ip(a) | SetEntry::IpPort(a, ..) => vec![a],
        SetEntry::IpPortIp(a, _, _, b) => vec![a, b],
        SetEntry::IpPortNet(a, _, _, n) => vec![a, n.addr()],
    };
    let want_v4 = spec.family == IpFamily::V4;
    addrs
        .iter()
        .find(|a| a.is_ipv4() != want_v4)
        .map(|a| format!("{a} is not an address of set {}'s family {}", spec.name, spec.family.ipset_family()))
}

/// Why an existing set (as the kernel describes it) can't serve `spec`:
/// another type or family. None if it can.
fn header_mismatch(spec: &SetSpec, have: &SetHeader) -> Option<String> {
    let want_type = spec.set_type.as_str();
    if have.type_name != want_type {
        return Some(format!("set {} exists with type {}, want {want_type}", spec.name, have.type_name));
    }
    if spec.set_type == SetType::BitmapPort {
        return None;
    }
    let have_family = codec::family_name(have.family);
    let want_family = spec.family.ipset_family();
    (have_family != want_family)
        .then(|| format!("set {} exists with family {have_family}, want {want_family}", spec.name))
}

/// Parses a member as `ipset save` prints it, for a set of type `t`.
pub fn parse_entry(t: SetType, s: &str) -> Option<SetEntry> {
    let parts: Vec<&str> = s.split(',').collect();
    match (t, parts.as_slice()) {
        (SetType::HashIp, [ip]) => Some(SetEntry::Ip(ip.parse().ok()?)),
        (SetType::BitmapPort, [port]) => Some(SetEntry::Port(port.parse().ok()?)),
        (SetType::HashIpPort, [ip, pp]) => {
            let (proto, port) = proto_port(pp)?;
            Some(SetEntry::IpPort(ip.parse().ok()?, proto, port))
        }
        (SetType::HashIpPortIp, [ip, pp, ip2]) => {
            let (proto, port) = proto_port(pp)?;
            Some(SetEntry::IpPortIp(ip.parse().ok()?, proto, port, ip2.parse().ok()?))
        }
        (SetType::HashIpPortNet, [ip, pp, net]) => {
            let (proto, port) = proto_port(pp)?;
            Some(SetEntry::IpPortNet(ip.parse().ok()?, proto, port, parse_net(net)?))
        }
        _ => None,
    }
}

/// `tcp:80` → (Tcp, 80).
fn proto_port(s: &str) -> Option<(Protocol, u16)> {
    let (proto, port) = s.split_once(':')?;
    let proto = Protocol::ALL.into_iter().find(|p| p.lower() == proto)?;
    Some((proto, port.parse().ok()?))
}

/// A net as ipset prints it: a host net (/32, /128) is printed bare.
fn parse_net(s: &str) -> Option<IpNet> {
    if s.contains('/') {
        return s.parse().ok();
    }
    let ip: IpAddr = s.parse().ok()?;
    Some(IpNet::from(ip))
}

/// The member as the kernel stores it: a net's host bits are cleared.
fn canonical(e: SetEntry) -> SetEntry {
    match e {
        SetEntry::IpPortNet(ip, p, port, net) => SetEntry::IpPortNet(ip, p, port, net.trunc()),
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(set_type: SetType, family: IpFamily) -> SetSpec {
        SetSpec { name: "KUBE-TEST".into(), set_type, family, comment: "" }
    }

    fn header(type_name: &str, family: u8) -> SetHeader {
        SetHeader { type_name: type_name.into(), family, revision: 7, elements: None }
    }

    #[test]
    fn parses_members_of_every_type_and_protocol() {
        let cases = [
            (SetType::HashIp, "10.96.0.10", "10.96.0.10"),
            (SetType::HashIp, "fd00::a", "fd00::a"),
            (SetType::HashIpPort, "10.96.0.10,udp:53", "10.96.0.10,udp:53"),
            (SetType::HashIpPort, "10.96.0.10,sctp:9", "10.96.0.10,sctp:9"),
            (SetType::HashIpPort, "fd00::1,tcp:80", "fd00::1,tcp:80"),
            (SetType::HashIpPortIp, "10.244.0.7,tcp:8080,10.244.0.7", "10.244.0.7,tcp:8080,10.244.0.7"),
            (SetType::HashIpPortNet, "1.2.3.4,tcp:443,10.0.0.0/8", "1.2.3.4,tcp:443,10.0.0.0/8"),
            (SetType::HashIpPortNet, "1.2.3.4,tcp:443,10.1.2.3", "1.2.3.4,tcp:443,10.1.2.3/32"),
            (SetType::HashIpPortNet, "fd00::1,udp:53,fd00::9", "fd00::1,udp:53,fd00::9/128"),
            (SetType::BitmapPort, "30080", "30080"),
        ];
        for (t, text, shown) in cases {
            let e = parse_entry(t, text).unwrap_or_else(|| panic!("{t:?} {text}"));
            assert_eq!(e.to_string(), shown);
            assert_eq!(e.set_type(), t);
        }
    }

    #[test]
    fn rejects_members_we_cannot_represent() {
        for (t, text) in [
            (SetType::HashIpPort, "10.0.0.1,icmp:ping"),
            (SetType::HashIpPort, "10.0.0.1,47:0"),
            (SetType::HashIpPort, "10.0.0.1"),
            (SetType::BitmapPort, "tcp:80"),
            (SetType::HashIp, "10.0.0.1,tcp:80"),
        ] {
            assert_eq!(parse_entry(t, text), None, "{text}");
        }
    }

    #[test]
    fn an_existing_set_of_another_type_or_family_is_named() {
        let s = spec(SetType::HashIpPort, IpFamily::V4);
        assert_eq!(header_mismatch(&s, &header("hash:ip,port", codec::NFPROTO_IPV4)), None);
        assert_eq!(
            header_mismatch(&spec(SetType::HashIpPort, IpFamily::V6), &header("hash:ip,port", codec::NFPROTO_IPV4)),
            Some("set KUBE-TEST exists with family inet, want inet6".to_string())
        );
        assert_eq!(
            header_mismatch(&spec(SetType::HashIp, IpFamily::V4), &header("hash:ip,port", codec::NFPROTO_IPV4)),
            Some("set KUBE-TEST exists with type hash:ip,port, want hash:ip".to_string())
        );
        let bitmap = header("bitmap:port", codec::NFPROTO_UNSPEC);
        assert_eq!(header_mismatch(&spec(SetType::BitmapPort, IpFamily::V6), &bitmap), None);
    }

    #[test]
    fn entries_that_cannot_be_members_are_refused_before_sending() {
        let s = spec(SetType::HashIpPort, IpFamily::V4);
        let v6 = IpsetOp::Add(SetEntry::IpPort("fd00::1".parse().unwrap(), Protocol::Tcp, 80));
        assert_eq!(misfit(&s, &v6), Some("fd00::1 is not an address of set KUBE-TEST's family inet".to_string()));
        let wrong = IpsetOp::Del(SetEntry::Ip("10.0.0.3".parse().unwrap()));
        assert_eq!(
            misfit(&s, &wrong),
            Some("a hash:ip member does not fit set KUBE-TEST of type hash:ip,port".to_string())
        );
        let fine = IpsetOp::Add(SetEntry::IpPort("10.0.0.1".parse().unwrap(), Protocol::Sctp, 80));
        assert_eq!(misfit(&s, &fine), None);
        let net = SetEntry::IpPortNet("fd00::1".parse().unwrap(), Protocol::Udp, 53, "10.0.0.0/8".parse().unwrap());
        let mixed = IpsetOp::Add(net);
        assert!(misfit(&spec(SetType::HashIpPortNet, IpFamily::V6), &mixed).is_some(), "an IPv4 net in inet6");
        assert_eq!(misfit(&spec(SetType::BitmapPort, IpFamily::V6), &IpsetOp::Add(SetEntry::Port(30080))), None);
    }

    #[tokio::test]
    async fn misfits_fail_alone_and_nothing_is_sent_for_them() {
        let ipset = NetlinkIpset::new().expect("netfilter netlink socket");
        let h = IpsetHandle::new(&ipset, spec(SetType::HashIp, IpFamily::V4));
        let ops = vec![IpsetOp::Add(SetEntry::Ip("fd00::1".parse().unwrap())), IpsetOp::Add(SetEntry::Port(80))];
        let results = h.apply_ops(&ops).await;
        assert!(results.iter().all(Result::is_err));
        assert_eq!(results[0].as_ref().expect_err("v6").op(), "add KUBE-TEST fd00::1");
        assert_eq!((h.ops_sent(), ipset.messages_sent()), (0, 0));
        assert!(h.apply_ops(&[]).await.is_empty());
    }

    #[test]
    fn host_bits_of_nets_are_cleared_as_the_kernel_does() {
        let e = SetEntry::IpPortNet("1.2.3.4".parse().unwrap(), Protocol::Tcp, 80, "10.1.2.3/24".parse().unwrap());
        assert_eq!(canonical(e).to_string(), "1.2.3.4,tcp:80,10.1.2.0/24");
    }
}
