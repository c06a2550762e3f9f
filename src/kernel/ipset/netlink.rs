//! `NetlinkIpset`: the async client of the kernel's ip_set subsystem over
//! nfnetlink, on the nfnetlink layer ([`crate::kernel::netlink::Nfnl`]).
//!
//! - The kernel's protocol is asked once (`IPSET_CMD_PROTOCOL`) and
//!   cached: we speak the newest both know (7 on kernels since 5.5, 6 before).
//! - A set type's revision is asked once per type and family
//!   (`IPSET_CMD_TYPE`) and cached: we create the newest revision both the
//!   kernel and the `ipset` tool we were checked against know
//!   ([`known_revision`]), so `ipset save` on the node still reads our sets.
//! - [`NetlinkIpset::apply`] pipelines add/del requests, up to
//!   [`MAX_BATCH`](netlink::MAX_BATCH) in one datagram, one ack each: one bad member fails only
//!   its own op. Without `NLM_F_EXCL` the kernel treats them as `-exist`.
//! - Listings ([`NetlinkIpset::list`]) are dumps, read to `NLMSG_DONE`.
//!
//! Requests go as raw bytes ([`RawNfnl`]) and replies are parsed here
//! ([`codec`]), so a malformed reply fails its request. The socket lives in
//! the network namespace of the thread that opened it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use netlink_packet_core::DecodeError;
use tokio::sync::OnceCell;
use tracing::debug;

use super::codec::{self, IpsetMessage, MemberAttr, NameError, Range, SetHeader};
use crate::kernel::netlink::{self, Errno, Msg, Nfnl, NfnlError, RawNfnl};
use crate::kernel::{KResult, KernelError};
use crate::msgs::ipset::SetLine;
use crate::msgs::{IpsetOp, SetSpec, SetType};

/// What was asked of the kernel, printed as `ipset` arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    Protocol,
    Type { type_name: String, family: u8 },
    Create(String),
    Destroy(String),
    List { name: String, header_only: bool },
    Op(String),
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Protocol => f.write_str("ask the kernel's ipset protocol"),
            Request::Type { type_name, family } => {
                write!(f, "ask the kernel's revisions of {type_name} ({})", codec::family_name(*family))
            }
            Request::Create(line) | Request::Op(line) => f.write_str(line),
            Request::Destroy(name) => write!(f, "destroy {name}"),
            Request::List { name, header_only: true } => write!(f, "list -t {name}"),
            Request::List { name, header_only: false } => write!(f, "list {name}"),
        }
    }
}

/// Errors of the ipset client; each names the request and keeps the cause.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum IpsetError {
    /// The kernel refused: `code` is its errno, or one of ipset's own
    /// (4096 and up), read for a set of type `set_type`.
    #[error("{request}: {}", refusal(*code, *set_type))]
    Kernel { request: Request, code: i32, set_type: Option<SetType> },
    /// No (complete) answer: see the source.
    #[error("{request}: {source}")]
    Netlink {
        request: Request,
        #[source]
        source: NfnlError,
    },
    #[error("{request}: malformed reply: {source}")]
    Decode {
        request: Request,
        #[source]
        source: Arc<DecodeError>,
    },
    #[error("{request}: unusable reply: {what}")]
    Reply {
        request: Request,
        #[source]
        what: codec::Unusable,
    },
    #[error("{type_name}: the kernel has revisions {}-{} and we know up to {ours}", kernel.min, kernel.max)]
    Revision { type_name: &'static str, kernel: Range, ours: u8 },
    #[error("the kernel speaks ipset protocols {}-{}, we speak {}-{}", kernel.min, kernel.max, codec::IPSET_PROTOCOL_MIN, codec::IPSET_PROTOCOL)]
    Protocol { kernel: Range },
    #[error("cannot open a netfilter netlink socket: {0}")]
    Socket(#[source] Arc<std::io::Error>),
    #[error(transparent)]
    Name(#[from] NameError),
}

/// A refusal's meaning: ipset's own words for its codes, the errno's
/// otherwise (`ENOENT` is always a missing set here).
fn refusal(code: i32, set_type: Option<SetType>) -> String {
    match codec::error_message(code, set_type) {
        Some(m) => m.to_string(),
        None if code == Errno::ENOENT.0 => "the set does not exist".to_string(),
        None => Errno(code).to_string(),
    }
}

impl IpsetError {
    /// The kernel's code, if it refused the request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            IpsetError::Kernel { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when the request may have been applied anyway.
    pub fn is_unknown_outcome(&self) -> bool {
        matches!(self, IpsetError::Netlink { source, .. } if source.is_unknown_outcome())
    }

    /// As the handles report it: `op` failed with this cause.
    pub fn for_op(&self, op: impl fmt::Display) -> KernelError {
        KernelError::library(op, !self.is_unknown_outcome(), self.errno(), self.clone())
    }

    /// `request` failed in the netlink layer: refused by the kernel (read
    /// for a set of type `set_type`), or without an answer.
    fn netlink(request: Request, source: NfnlError, set_type: Option<SetType>) -> IpsetError {
        match source.errno() {
            Some(errno) => IpsetError::Kernel { request, code: errno.0, set_type },
            None => IpsetError::Netlink { request, source },
        }
    }
}

/// `IPSET_ERR_EXIST`: ipset's "it exists".
pub const IPSET_ERR_EXIST: i32 = 4103;

/// The newest revision of each type that the `ipset` tool we compared with
/// (7.17) creates on Linux 6.18: what the kernel calls `bucketsize` and
/// `initval` support. A newer kernel revision would be one `ipset save`
/// on the node might not read.
pub fn known_revision(t: SetType) -> u8 {
    match t {
        SetType::HashIp => 6,
        SetType::HashIpPort => 7,
        SetType::HashIpPortIp => 6,
        SetType::HashIpPortNet => 8,
        SetType::BitmapPort => 3,
    }
}

/// The revision to create: the newest both know, if the kernel still has it.
fn pick_revision(t: SetType, kernel: Range) -> Result<u8, IpsetError> {
    let ours = known_revision(t);
    let pick = ours.min(kernel.max);
    if pick < kernel.min {
        return Err(IpsetError::Revision { type_name: t.as_str(), kernel, ours });
    }
    Ok(pick)
}

/// The protocol to speak: the newest both know.
fn pick_protocol(kernel: Range) -> Result<u8, IpsetError> {
    let pick = codec::IPSET_PROTOCOL.min(kernel.max);
    if pick < codec::IPSET_PROTOCOL_MIN.max(kernel.min) {
        return Err(IpsetError::Protocol { kernel });
    }
    Ok(pick)
}

/// A set type's revision (of one family), asked once.
type Revision = Arc<OnceCell<u8>>;

/// The bytes of [`codec::netlink_request`], as the layer sends them.
fn raw_request(msg: &IpsetMessage) -> Msg {
    netlink::request(RawNfnl::emitted(msg), codec::request_flags(msg))
}

/// A set as listed: its header and its members' attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub header: SetHeader,
    pub members: Vec<Vec<MemberAttr>>,
}

/// The ipset client: a cheap `Clone` handle over one nfnetlink socket
/// (clones share it and the cached protocol and revisions; their requests
/// take turns).
#[derive(Debug, Clone)]
pub struct NetlinkIpset {
    nl: Nfnl,
    protocol: Arc<OnceCell<u8>>,
    revisions: Arc<Mutex<HashMap<(SetType, u8), Revision>>>,
}

impl NetlinkIpset {
    /// Opens the socket in the calling thread's network namespace.
    pub fn new() -> KResult<NetlinkIpset> {
        let nl = Nfnl::open().map_err(|e| KernelError::io("open ipset netlink socket", e))?;
        Ok(NetlinkIpset { nl, protocol: Arc::default(), revisions: Arc::default() })
    }

    /// Netlink messages sent so far (queries, listings and ops).
    pub fn messages_sent(&self) -> u64 {
        self.nl.messages_sent()
    }

    /// The protocol both speak, asked on first use and cached (a failure is not).
    pub async fn protocol(&self) -> Result<u8, IpsetError> {
        self.protocol.get_or_try_init(|| self.ask_protocol()).await.copied()
    }

    /// The revision of `spec`'s type to create, asked on first use and
    /// cached (the sets of one type wait for one answer; a failure is not cached).
    pub async fn revision(&self, spec: &SetSpec) -> Result<u8, IpsetError> {
        let family = codec::set_family(spec);
        let cell = match self.revisions.lock() {
            Ok(mut cache) => cache.entry((spec.set_type, family)).or_default().clone(),
            Err(_) => Arc::default(),
        };
        cell.get_or_try_init(|| self.ask_revision(spec.set_type, family)).await.copied()
    }

    /// Creates `spec` with upstream's parameters (`ipset create ... -exist`):
    /// a set of that name with the same parameters is fine; one with other
    /// parameters fails with `EEXIST` (Linux 6.18; [`IPSET_ERR_EXIST`] is
    /// ipset's own code for it).
    pub async fn create(&self, spec: &SetSpec) -> Result<(), IpsetError> {
        codec::check_name(&spec.name)?;
        let revision = self.revision(spec).await?;
        let protocol = self.protocol().await?;
        let request = Request::Create(spec.create_line());
        let result = self.command(codec::create_request(protocol, spec, revision)).await;
        result.map_err(|e| IpsetError::netlink(request, e, Some(spec.set_type)))
    }

    /// Destroys the set `name`; `Ok(false)` if there was none. A set an
    /// iptables rule references cannot go (ipset's `IPSET_ERR_BUSY`).
    pub async fn destroy(&self, name: &str) -> Result<bool, IpsetError> {
        codec::check_name(name)?;
        let protocol = self.protocol().await?;
        let request = Request::Destroy(name.to_string());
        match self.command(codec::destroy_request(protocol, name)).await {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(false),
            Err(e) => Err(IpsetError::netlink(request, e, None)),
        }
    }

    /// Lists the set `name` (only its header with `header_only`); `None`
    /// if there is no such set.
    pub async fn list(&self, name: &str, header_only: bool) -> Result<Option<Listing>, IpsetError> {
        codec::check_name(name)?;
        let protocol = self.protocol().await?;
        let request = Request::List { name: name.to_string(), header_only };
        listing(&request, self.nl.get(raw_request(&codec::list_request(protocol, name, header_only))).await)
    }

    /// Adds and deletes members of `spec`'s set, in order, one result per
    /// op. Requests are pipelined, [`MAX_BATCH`](netlink::MAX_BATCH) per datagram.
    pub async fn apply(&self, spec: &SetSpec, ops: &[IpsetOp]) -> Vec<Result<(), IpsetError>> {
        let request = |op: &IpsetOp| Request::Op(SetLine(&spec.name, op).to_string());
        if let Err(e) = codec::check_name(&spec.name) {
            return vec![Err(e.into()); ops.len()];
        }
        let protocol = match self.protocol().await {
            Ok(p) => p,
            Err(e) => return vec![Err(e); ops.len()],
        };
        let msgs = ops.iter().map(|op| raw_request(&codec::op_request(protocol, &spec.name, op))).collect();
        let results = self.nl.acked(msgs).await;
        let outcome = |(op, result): (&IpsetOp, Result<(), NfnlError>)| {
            result.map_err(|e| IpsetError::netlink(request(op), e, Some(spec.set_type)))
        };
        ops.iter().zip(results).map(outcome).collect()
    }

    // ------------------------------------------------------------ internals

    async fn ask_revision(&self, set_type: SetType, family: u8) -> Result<u8, IpsetError> {
        let protocol = self.protocol().await?;
        let type_name = set_type.as_str();
        let request = Request::Type { type_name: type_name.to_string(), family };
        let answer = self.query(codec::type_request(protocol, type_name, family), &request).await?;
        let range = codec::revision_range(&answer).map_err(|what| IpsetError::Reply { request, what })?;
        let revision = pick_revision(set_type, range)?;
        debug!(set_type = type_name, kernel_min = range.min, kernel_max = range.max, revision, "ipset: type revision");
        Ok(revision)
    }

    async fn ask_protocol(&self) -> Result<u8, IpsetError> {
        let request = Request::Protocol;
        let answer = self.query(codec::protocol_request(), &request).await?;
        let range = codec::protocol_range(&answer).map_err(|what| IpsetError::Reply { request, what })?;
        let protocol = pick_protocol(range)?;
        debug!(kernel_min = range.min, kernel_max = range.max, protocol, "ipset: protocol");
        Ok(protocol)
    }

    /// A query answered by one message (no ack asked).
    async fn query(&self, msg: IpsetMessage, request: &Request) -> Result<IpsetMessage, IpsetError> {
        let answer = self.nl.get(raw_request(&msg)).await.map_err(|e| IpsetError::netlink(request.clone(), e, None))?;
        match answer.first() {
            Some(raw) => parse_reply(request, raw),
            None => Err(IpsetError::Reply { request: request.clone(), what: codec::Unusable::NoAnswer }),
        }
    }

    /// One acknowledged command.
    async fn command(&self, msg: IpsetMessage) -> Result<(), NfnlError> {
        self.nl.acked(vec![raw_request(&msg)]).await.into_iter().next().unwrap_or(Ok(()))
    }
}

fn parse_reply(request: &Request, raw: &RawNfnl) -> Result<IpsetMessage, IpsetError> {
    codec::parse(raw.message_type(), raw.payload())
        .map_err(|e| IpsetError::Decode { request: request.clone(), source: Arc::new(e) })
}

/// A listing's answer: the header in the first message, members in any;
/// `None` when the kernel says there is no such set.
fn listing(request: &Request, answer: Result<Vec<RawNfnl>, NfnlError>) -> Result<Option<Listing>, IpsetError> {
    let objects = match answer {
        Ok(objects) => objects,
        Err(e) if e.errno() == Some(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(IpsetError::netlink(request.clone(), e, None)),
    };
    let mut header = None;
    let mut members = Vec::new();
    for raw in &objects {
        let msg = parse_reply(request, raw)?;
        if header.is_none() {
            header = codec::set_header(&msg).map_err(|what| IpsetError::Reply { request: request.clone(), what })?;
        }
        members.extend(codec::listed_members(&msg).map(<[MemberAttr]>::to_vec));
    }
    match header {
        Some(header) => Ok(Some(Listing { header, members })),
        None => Err(IpsetError::Reply { request: request.clone(), what: codec::Unusable::NoHeader }),
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{NetlinkMessage, NetlinkPayload};

    use super::super::captures::{LISTED_CLUSTER_IP, LIST_HEADER_ANSWER};
    use super::*;
    use crate::kernel::netlink::replies::bytes_of;
    use crate::msgs::SetEntry;
    use crate::net::{IpFamily, Protocol};

    /// The object of a captured reply.
    fn inner(captured: &[u8]) -> RawNfnl {
        match NetlinkMessage::<RawNfnl>::deserialize(captured).expect("parses").payload {
            NetlinkPayload::InnerMessage(raw) => raw,
            other => panic!("not an object: {other:?}"),
        }
    }

    fn list(name: &str) -> Request {
        Request::List { name: name.into(), header_only: false }
    }

    #[test]
    fn raw_requests_have_the_codec_bytes() {
        let op = IpsetOp::Add(SetEntry::IpPort("10.96.0.10".parse().unwrap(), Protocol::Udp, 53));
        let m = codec::op_request(7, "KUBE-CLUSTER-IP", &op);
        assert_eq!(bytes_of(&codec::netlink_request(m.clone())), bytes_of(&raw_request(&m)));
    }

    #[test]
    fn a_listing_reads_header_and_members_to_the_end() {
        let got = listing(&list("KUBE-CLUSTER-IP"), Ok(vec![inner(&LISTED_CLUSTER_IP)]))
            .expect("a listing")
            .expect("the set exists");
        assert_eq!(got.header.type_name, "hash:ip,port");
        assert_eq!(got.header.elements, Some(2));
        assert_eq!(got.members.len(), 2);
        let header_only = listing(&list("KUBE-CLUSTER-IP"), Ok(vec![inner(&LIST_HEADER_ANSWER)]))
            .expect("a listing")
            .expect("the set exists");
        assert!(header_only.members.is_empty());
    }

    #[test]
    fn a_missing_set_lists_as_none_and_other_errors_name_the_request() {
        let refused = |errno| Err(NfnlError::Refused(Errno(errno)));
        assert_eq!(listing(&list("KUBE-X"), refused(2)).expect("ENOENT is no error"), None);
        let err = listing(&list("KUBE-X"), refused(1)).expect_err("EPERM");
        assert_eq!(err.errno(), Some(1));
        assert_eq!(err.to_string(), "list KUBE-X: Operation not permitted (os error 1)");
        let err = listing(&list("KUBE-X"), Ok(Vec::new())).expect_err("no header");
        assert!(matches!(err, IpsetError::Reply { .. }), "{err:?}");
        let err = listing(&list("KUBE-X"), Err(NfnlError::Overrun)).expect_err("replies lost");
        assert!(err.is_unknown_outcome(), "{err:?}");
    }

    #[test]
    fn refusals_read_in_ipsets_words_for_the_set_type() {
        let full = IpsetError::Kernel {
            request: Request::Op("add KUBE-CLUSTER-IP 10.96.0.10,udp:53".into()),
            code: 4352,
            set_type: Some(SetType::HashIpPort),
        };
        assert_eq!(full.to_string(), "add KUBE-CLUSTER-IP 10.96.0.10,udp:53: the set is full (maxelem reached)");
        let gone = IpsetError::Kernel { request: Request::Destroy("X".into()), code: 2, set_type: None };
        assert_eq!(gone.to_string(), "destroy X: the set does not exist");
        let err = gone.for_op("destroy X");
        assert!(err.outcome_known());
        assert_eq!(err.errno_value(), Some(2));
        let overdue = NfnlError::Overdue(std::time::Duration::from_secs(10));
        let lost = IpsetError::Netlink { request: Request::Protocol, source: overdue }.for_op("add X 1.2.3.4");
        assert!(!lost.outcome_known());
    }

    #[test]
    fn the_revision_is_the_newest_both_know() {
        assert_eq!(pick_revision(SetType::HashIpPort, Range { min: 0, max: 7 }).ok(), Some(7));
        assert_eq!(pick_revision(SetType::HashIpPort, Range { min: 0, max: 9 }).ok(), Some(7), "a newer kernel");
        assert_eq!(pick_revision(SetType::HashIpPortNet, Range { min: 1, max: 6 }).ok(), Some(6), "an older one");
        let err = pick_revision(SetType::HashIp, Range { min: 7, max: 9 }).expect_err("none in common");
        assert_eq!(err.to_string(), "hash:ip: the kernel has revisions 7-9 and we know up to 6");
    }

    #[test]
    fn the_protocol_is_the_newest_both_speak() {
        assert_eq!(pick_protocol(Range { min: 6, max: 7 }).ok(), Some(7));
        assert_eq!(pick_protocol(Range { min: 6, max: 6 }).ok(), Some(6));
        assert_eq!(pick_protocol(Range { min: 6, max: 8 }).ok(), Some(7));
        assert!(pick_protocol(Range { min: 8, max: 9 }).is_err());
    }

    #[tokio::test]
    async fn bad_names_never_reach_the_kernel() {
        let ipset = NetlinkIpset::new().expect("netfilter netlink socket");
        let spec = SetSpec { name: "x".repeat(40), set_type: SetType::HashIp, family: IpFamily::V4, comment: "" };
        let results = ipset.apply(&spec, &[IpsetOp::Add(SetEntry::Ip("10.0.0.1".parse().unwrap()))]).await;
        assert!(matches!(results[0], Err(IpsetError::Name(NameError::TooLong(_)))));
        assert!(matches!(ipset.destroy("").await, Err(IpsetError::Name(NameError::Empty))));
        assert_eq!(ipset.messages_sent(), 0);
    }
}
