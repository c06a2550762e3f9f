//! `NetlinkIpvs`: the async client that programs the kernel's IPVS table over
//! generic netlink, on one netlink-proto connection.
//!
//! - The family id is resolved once (CTRL_CMD_GETFAMILY "IPVS") and cached;
//!   a kernel without IPVS yields [`IpvsError::NotAvailable`].
//! - [`NetlinkIpvs::apply`] pipelines ops: up to [`MAX_BATCH`] requests go out
//!   in one datagram, then one ack or error per request comes back. It is
//!   idempotent: deleting what is gone succeeds, and adding what exists becomes
//!   an edit, so the kernel ends up as asked.
//! - Dumps ([`NetlinkIpvs::services`], [`NetlinkIpvs::dests`]) read the table
//!   for full resyncs and graceful termination.
//! - Every netlink message sent is counted ([`NetlinkIpvs::messages_sent`]).
//!
//! The connection carries replies as raw bytes ([`RawGenl`]) and parsing
//! happens here: netlink-proto drops a message its payload type cannot parse
//! with only a log line, which would silently lose a dump entry.

use crate::kernel::netlink::{BatchFailure, Client};
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use netlink_packet_core::{
    DecodeError, Emitable, NetlinkMessage, NetlinkPayload, NlasIterator, Parseable, ParseableParametrized, NLM_F_ACK,
    NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_packet_generic::constants::{CTRL_ATTR_FAMILY_ID, GENL_ID_CTRL};
use netlink_packet_generic::ctrl::{nlas::GenlCtrlAttrs, GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use netlink_proto::sys::protocols::NETLINK_GENERIC;
use netlink_proto::NetlinkProtoError;
use tokio::sync::OnceCell;
use tracing::{debug, trace};

use super::codec::{self, DestEntry, IpvsMessage, ReplyError, IPVS_GENL_NAME};
use crate::msgs::ipvs::{IpvsOp, VsKey, VsSpec};

pub use crate::kernel::netlink::MAX_BATCH;

pub use crate::kernel::netlink::DEFAULT_REPLY_TIMEOUT;

pub use crate::kernel::netlink::Errno;

/// What was asked of the kernel, printed as ipvsadm arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    Op(IpvsOp),
    ResolveFamily,
    DumpServices,
    DumpDests(VsKey),
    SetTimeouts { tcp: u32, tcp_fin: u32, udp: u32 },
    Flush,
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Op(op) => op.fmt(f),
            Request::ResolveFamily => write!(f, "resolve generic netlink family {IPVS_GENL_NAME}"),
            Request::DumpServices => f.write_str("-L -n"),
            Request::DumpDests(vs) => write!(f, "-L -n {vs}"),
            Request::SetTimeouts { tcp, tcp_fin, udp } => write!(f, "--set {tcp} {tcp_fin} {udp}"),
            Request::Flush => f.write_str("-C"),
        }
    }
}

/// Errors of the IPVS netlink client. Each names the request (ipvsadm
/// style) and keeps the cause.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum IpvsError {
    #[error("IPVS is not available in this kernel: load the ip_vs module, or choose another mode (the config file's `mode`, or --proxy-mode when there is no --config)")]
    NotAvailable,
    #[error("ipvs {request}: {errno}")]
    Kernel {
        request: Request,
        #[source]
        errno: Errno,
    },
    /// No reply in time, or the connection died: the request may or may not
    /// have been applied.
    #[error("ipvs {request}: no reply from the kernel, outcome unknown")]
    NoReply { request: Request },
    #[error("ipvs {request}: netlink connection closed: {source}")]
    ConnectionClosed {
        request: Request,
        #[source]
        source: Arc<NetlinkProtoError>,
    },
    #[error("ipvs {request}: malformed reply: {source}")]
    Decode {
        request: Request,
        #[source]
        source: Arc<DecodeError>,
    },
    #[error("ipvs {request}: unusable reply: {source}")]
    Reply {
        request: Request,
        #[source]
        source: ReplyError,
    },
    #[error("ipvs {request}: dump interrupted by a concurrent change")]
    DumpInterrupted { request: Request },
    #[error("cannot open a generic netlink socket: {0}")]
    Socket(#[source] Arc<io::Error>),
}

impl IpvsError {
    /// The kernel's errno, if the kernel refused the request.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            IpvsError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// The request that failed, if the error is about one request.
    pub fn request(&self) -> Option<&Request> {
        match self {
            IpvsError::Kernel { request, .. }
            | IpvsError::NoReply { request }
            | IpvsError::ConnectionClosed { request, .. }
            | IpvsError::Decode { request, .. }
            | IpvsError::Reply { request, .. }
            | IpvsError::DumpInterrupted { request } => Some(request),
            IpvsError::NotAvailable | IpvsError::Socket(_) => None,
        }
    }

    /// True when the request may have been applied anyway: the caller's view
    /// of the kernel is untrustworthy (needs a full resync).
    pub fn is_unknown_outcome(&self) -> bool {
        matches!(self, IpvsError::NoReply { .. } | IpvsError::ConnectionClosed { .. })
    }
}

/// A generic netlink payload kept as bytes, so the connection never parses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawGenl {
    header: GenlHeader,
    payload: Vec<u8>,
}

impl RawGenl {
    /// Emits a typed family payload.
    pub fn from_payload<F: GenlFamily + Emitable>(typed: &F) -> RawGenl {
        let mut payload = vec![0; typed.buffer_len()];
        typed.emit(&mut payload);
        RawGenl { header: GenlHeader { cmd: typed.command(), version: typed.version() }, payload }
    }

    /// Parses the bytes as a typed family payload.
    pub fn parse<F: ParseableParametrized<[u8], GenlHeader>>(&self) -> Result<F, DecodeError> {
        F::parse_with_param(&self.payload, self.header)
    }
}

impl GenlFamily for RawGenl {
    fn family_name() -> &'static str {
        IPVS_GENL_NAME
    }

    fn command(&self) -> u8 {
        self.header.cmd
    }

    fn version(&self) -> u8 {
        self.header.version
    }
}

impl Emitable for RawGenl {
    fn buffer_len(&self) -> usize {
        self.payload.len()
    }

    fn emit(&self, buf: &mut [u8]) {
        buf[..self.payload.len()].copy_from_slice(&self.payload);
    }
}

impl ParseableParametrized<[u8], GenlHeader> for RawGenl {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(RawGenl { header, payload: buf.to_vec() })
    }
}

type Msg = NetlinkMessage<GenlMessage<RawGenl>>;

fn netlink_message(family_id: u16, raw: RawGenl, flags: u16) -> Msg {
    let mut genl = GenlMessage::from_payload(raw);
    genl.set_resolved_family_id(family_id);
    let mut nl = NetlinkMessage::from(genl);
    nl.header.flags = flags;
    nl.finalize();
    nl
}

/// The same bytes as [`codec::netlink_request`], in the connection's type.
fn ipvs_request(family_id: u16, msg: &IpvsMessage) -> Msg {
    netlink_message(family_id, RawGenl::from_payload(msg), codec::request_flags(msg))
}

/// The async IPVS client: a cheap `Clone` handle (clones share the socket,
/// the cached family id and the counters); `&self` methods may run
/// concurrently. The connection task ends when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct NetlinkIpvs {
    client: Client<GenlMessage<RawGenl>>,
    family: Arc<OnceCell<u16>>,
}

impl NetlinkIpvs {
    /// Opens the netlink socket and spawns its connection task. Must run
    /// inside a Tokio runtime with I/O and time enabled. Does not touch IPVS
    /// yet; see [`NetlinkIpvs::connect`].
    pub fn new() -> Result<NetlinkIpvs, IpvsError> {
        let client = Client::open(NETLINK_GENERIC).map_err(|e| IpvsError::Socket(Arc::new(e)))?;
        Ok(NetlinkIpvs { client, family: Arc::default() })
    }

    /// [`NetlinkIpvs::new`], then resolves the family: fails with
    /// [`IpvsError::NotAvailable`] on a kernel without IPVS.
    pub async fn connect() -> Result<NetlinkIpvs, IpvsError> {
        let ipvs = NetlinkIpvs::new()?;
        ipvs.family_id().await?;
        Ok(ipvs)
    }

    /// Sets how long to wait for each reply (default 10 s).
    pub fn with_reply_timeout(mut self, timeout: Duration) -> NetlinkIpvs {
        self.client = self.client.with_reply_timeout(timeout);
        self
    }

    /// Netlink messages sent so far (requests, dumps and family lookups).
    pub fn messages_sent(&self) -> u64 {
        self.client.messages_sent()
    }

    /// Datagrams (sendmsg calls) sent so far; a batch is one datagram.
    pub fn datagrams_sent(&self) -> u64 {
        self.client.datagrams_sent()
    }

    /// The IPVS family id, resolved on first use and cached. A failure is
    /// not cached: loading ip_vs later makes the next call succeed.
    pub async fn family_id(&self) -> Result<u16, IpvsError> {
        self.family.get_or_try_init(|| self.resolve_family()).await.copied()
    }

    /// Applies `ops` in order and returns one result per op, in the same
    /// order. Requests are pipelined, [`MAX_BATCH`] per datagram. Deleting a
    /// missing service or destination (ENOENT/ESRCH) succeeds; adding an
    /// existing one (EEXIST) is retried as an edit, whose result it takes.
    pub async fn apply(&self, ops: &[IpvsOp]) -> Vec<Result<(), IpvsError>> {
        let mut results = self.run_ops(ops).await;
        let (indices, edits): (Vec<usize>, Vec<IpvsOp>) = ops
            .iter()
            .zip(&results)
            .enumerate()
            .filter_map(|(i, (op, result))| edit_instead(op, result).map(|edit| (i, edit)))
            .unzip();
        if !edits.is_empty() {
            debug!(count = edits.len(), "ipvs: adds found existing objects, editing them");
            for (i, result) in indices.into_iter().zip(self.run_ops(&edits).await) {
                results[i] = result;
            }
        }
        results
    }

    /// Every virtual service kube-proxy could own (firewall-mark services
    /// and other L4 protocols are left out).
    pub async fn services(&self) -> Result<Vec<(VsKey, VsSpec)>, IpvsError> {
        let request = Request::DumpServices;
        self.dump(&codec::dump_services(), &request, |msg| match codec::parse_service(&msg) {
            Ok(Some(entry)) => Ok(Some(entry)),
            Ok(None) => {
                debug!(?msg, "ipvs: skipping a service kube-proxy does not manage");
                Ok(None)
            }
            Err(source) => Err(IpvsError::Reply { request: request.clone(), source }),
        })
        .await
    }

    /// The destinations of `vs` with their active and inactive connection
    /// counts; empty if the service does not exist.
    pub async fn dests(&self, vs: &VsKey) -> Result<Vec<DestEntry>, IpvsError> {
        let request = Request::DumpDests(*vs);
        self.dump(&codec::dump_dests(vs), &request, |msg| {
            codec::parse_dest(&msg, vs)
                .map(Some)
                .map_err(|source| IpvsError::Reply { request: request.clone(), source })
        })
        .await
    }

    /// `ipvsadm --set`: connection timeouts in seconds; 0 leaves one as is.
    pub async fn set_timeouts(&self, tcp: u32, tcp_fin: u32, udp: u32) -> Result<(), IpvsError> {
        let request = Request::SetTimeouts { tcp, tcp_fin, udp };
        self.command(&codec::set_timeouts(tcp, tcp_fin, udp), request).await
    }

    /// `ipvsadm -C`: removes every service and destination.
    pub async fn flush(&self) -> Result<(), IpvsError> {
        self.command(&codec::flush(), Request::Flush).await
    }

    // ------------------------------------------------------------ internals

    async fn resolve_family(&self) -> Result<u16, IpvsError> {
        let ctrl =
            GenlCtrl { cmd: GenlCtrlCmd::GetFamily, nlas: vec![GenlCtrlAttrs::FamilyName(IPVS_GENL_NAME.to_owned())] };
        let msg = netlink_message(GENL_ID_CTRL, RawGenl::from_payload(&ctrl), NLM_F_REQUEST | NLM_F_ACK);
        let replies = self.exchange(msg, &Request::ResolveFamily).await?;
        let id = family_from_replies(replies)?;
        debug!(family_id = id, "ipvs: generic netlink family resolved");
        Ok(id)
    }

    /// Sends one request and returns every reply until the kernel is done.
    async fn exchange(&self, msg: Msg, request: &Request) -> Result<Vec<Msg>, IpvsError> {
        self.client.exchange(vec![msg]).await.map_err(|failure| failure.error(request.clone()))
    }

    /// Sends `msgs` in one datagram; returns each request's error code
    /// (0 for an ack), in request order.
    async fn send_batch(&self, msgs: Vec<Msg>) -> Result<Vec<i32>, BatchFailure> {
        trace!(messages = msgs.len(), "ipvs: sending batch");
        self.client.send_batch(msgs).await
    }

    async fn run_ops(&self, ops: &[IpvsOp]) -> Vec<Result<(), IpvsError>> {
        if ops.is_empty() {
            return Vec::new();
        }
        let family = match self.family_id().await {
            Ok(id) => id,
            Err(e) => return vec![Err(e); ops.len()],
        };
        let mut out = Vec::with_capacity(ops.len());
        for chunk in ops.chunks(MAX_BATCH) {
            let msgs = chunk.iter().map(|op| ipvs_request(family, &codec::op_message(op))).collect();
            match self.send_batch(msgs).await {
                Ok(codes) => out.extend(chunk.iter().zip(codes).map(|(op, c)| op_outcome(op, c))),
                Err(failure) => out.extend(chunk.iter().map(|op| Err(failure.error(Request::Op(op.clone()))))),
            }
        }
        out
    }

    /// One acknowledged request that is not an op (timeouts, flush).
    async fn command(&self, msg: &IpvsMessage, request: Request) -> Result<(), IpvsError> {
        let family = self.family_id().await?;
        let codes =
            self.send_batch(vec![ipvs_request(family, msg)]).await.map_err(|failure| failure.error(request.clone()))?;
        match codes.first() {
            Some(0) => Ok(()),
            Some(code) => Err(IpvsError::Kernel { request, errno: Errno::from_code(*code) }),
            None => Err(IpvsError::NoReply { request }),
        }
    }

    /// Runs a dump and turns each entry into what `entry` makes of it
    /// (`None`: left out) as soon as it is parsed: a parsed entry's
    /// attributes are dropped before the next is parsed (the parsed
    /// messages of a whole dump of 15,000 virtual servers held at once
    /// were ≈ 16 MB).
    async fn dump<T>(
        &self,
        msg: &IpvsMessage,
        request: &Request,
        mut entry: impl FnMut(IpvsMessage) -> Result<Option<T>, IpvsError>,
    ) -> Result<Vec<T>, IpvsError> {
        let family = self.family_id().await?;
        let replies = self.exchange(ipvs_request(family, msg), request).await?;
        let mut out = Vec::new();
        for reply in replies {
            if let Some(msg) = dump_entry(reply, request)? {
                out.extend(entry(msg)?);
            }
        }
        Ok(out)
    }
}

/// The client's error for a request of a batch that got no answer.
trait BatchError {
    fn error(&self, request: Request) -> IpvsError;
}

impl BatchError for BatchFailure {
    fn error(&self, request: Request) -> IpvsError {
        match self {
            BatchFailure::Closed(source) => IpvsError::ConnectionClosed { request, source: source.clone() },
            BatchFailure::NoReply => IpvsError::NoReply { request },
        }
    }
}

/// An op's result from its netlink error code. Deleting what is already
/// gone succeeds: the kernel says ENOENT for a missing destination and
/// ESRCH for a missing service.
fn op_outcome(op: &IpvsOp, code: i32) -> Result<(), IpvsError> {
    let errno = Errno::from_code(code);
    let is_delete = matches!(op, IpvsOp::DelDest(..) | IpvsOp::DelService(..));
    if code == 0 || (is_delete && matches!(errno, Errno::ENOENT | Errno::ESRCH)) {
        return Ok(());
    }
    Err(IpvsError::Kernel { request: Request::Op(op.clone()), errno })
}

/// The edit to send when an add found the object already there (EEXIST).
fn edit_instead(op: &IpvsOp, result: &Result<(), IpvsError>) -> Option<IpvsOp> {
    if result.as_ref().err()?.errno() != Some(Errno::EEXIST) {
        return None;
    }
    match op {
        IpvsOp::AddService(vs, spec) => Some(IpvsOp::EditService(*vs, spec.clone())),
        IpvsOp::AddDest(vs, d, spec) => Some(IpvsOp::EditDest(*vs, *d, *spec)),
        _ => None,
    }
}

/// One reply of a dump: an entry, nothing (the end), or the kernel's error.
fn dump_entry(reply: Msg, request: &Request) -> Result<Option<IpvsMessage>, IpvsError> {
    let (header, payload) = reply.into_parts();
    let kernel = |code: i32| IpvsError::Kernel { request: request.clone(), errno: Errno::from_code(code) };
    match payload {
        NetlinkPayload::InnerMessage(_) if header.flags & NLM_F_DUMP_INTR != 0 => {
            Err(IpvsError::DumpInterrupted { request: request.clone() })
        }
        NetlinkPayload::InnerMessage(genl) => genl
            .payload
            .parse()
            .map(Some)
            .map_err(|e| IpvsError::Decode { request: request.clone(), source: Arc::new(e) }),
        NetlinkPayload::Error(e) if e.code.is_some() => Err(kernel(e.raw_code())),
        NetlinkPayload::Done(done) if done.code != 0 => Err(kernel(done.code)),
        _ => Ok(None),
    }
}

/// The family id from a CTRL_CMD_GETFAMILY exchange. ENOENT means the
/// kernel has no such family: IPVS is not loaded (or not built).
fn family_from_replies(replies: Vec<Msg>) -> Result<u16, IpvsError> {
    let request = Request::ResolveFamily;
    let mut id = None;
    for reply in replies {
        match reply.payload {
            NetlinkPayload::Error(e) if e.code.is_some() => {
                return Err(match Errno::from_code(e.raw_code()) {
                    Errno::ENOENT => IpvsError::NotAvailable,
                    errno => IpvsError::Kernel { request, errno },
                });
            }
            NetlinkPayload::InnerMessage(genl) if id.is_none() => {
                id = family_id_attr(&genl.payload)
                    .map_err(|e| IpvsError::Decode { request: request.clone(), source: Arc::new(e) })?;
            }
            _ => {}
        }
    }
    id.ok_or(IpvsError::Reply { request, source: ReplyError::Missing("CTRL_ATTR_FAMILY_ID") })
}

/// CTRL_ATTR_FAMILY_ID of a controller reply. Only that attribute is
/// decoded, so attributes newer than netlink-packet-generic cannot break it.
fn family_id_attr(reply: &RawGenl) -> Result<Option<u16>, DecodeError> {
    for nla in NlasIterator::new(&reply.payload[..]) {
        let nla = nla?;
        if nla.kind() == CTRL_ATTR_FAMILY_ID {
            if let GenlCtrlAttrs::FamilyId(id) = GenlCtrlAttrs::parse(&nla)? {
                return Ok(Some(id));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::replies::{ack, bytes_of, done, msg};
    use crate::msgs::ipvs::{DestKey, DestSpec};
    use crate::net::Protocol;

    const NOT_AVAILABLE: &str =
        "IPVS is not available in this kernel: load the ip_vs module, or choose another mode (the config file's `mode`, or --proxy-mode when there is no --config)";

    /// Asserts in both environments: on a kernel without IPVS (this host,
    /// CI) the lookup fails with the operator hint; where ip_vs is loaded
    /// (the VM harness) it succeeds.
    #[tokio::test]
    async fn family_lookup_reports_a_kernel_without_ipvs() {
        let ipvs_loaded = std::path::Path::new("/proc/net/ip_vs").exists();
        let result = NetlinkIpvs::connect().await;
        if ipvs_loaded {
            assert!(result.is_ok(), "ip_vs is loaded: {result:?}");
            return;
        }
        let err = result.expect_err("no IPVS family without ip_vs");
        assert!(matches!(err, IpvsError::NotAvailable), "{err:?}");
        assert_eq!(err.to_string(), NOT_AVAILABLE);
    }

    #[tokio::test]
    async fn without_ipvs_every_op_fails_and_nothing_is_cached() {
        if std::path::Path::new("/proc/net/ip_vs").exists() {
            return; // this one only speaks about kernels without IPVS
        }
        let ipvs = NetlinkIpvs::new().expect("generic netlink socket");
        let results = ipvs.apply(&[IpvsOp::DelService(vs()), IpvsOp::DelService(vs())]).await;
        assert_eq!(results.len(), 2);
        assert!(results.iter().all(|r| matches!(r, Err(IpvsError::NotAvailable))));
        assert!(matches!(ipvs.services().await, Err(IpvsError::NotAvailable)));
        // Each call asked again (one GETFAMILY each): failures are not cached.
        assert_eq!(ipvs.messages_sent(), 2);
        assert_eq!(ipvs.datagrams_sent(), 2);
    }

    fn vs() -> VsKey {
        VsKey { addr: "10.96.0.1".parse().unwrap(), protocol: Protocol::Tcp, port: 443 }
    }

    fn dest() -> DestKey {
        DestKey { addr: "10.244.1.5".parse().unwrap(), port: 8443 }
    }

    fn rr() -> VsSpec {
        VsSpec { scheduler: "rr".into(), flags: 0, timeout: 0 }
    }

    fn inner<F: GenlFamily + Emitable>(typed: &F, flags: u16) -> Msg {
        let genl = GenlMessage::from_payload(RawGenl::from_payload(typed));
        msg(9, flags, NetlinkPayload::InnerMessage(genl))
    }

    #[test]
    fn raw_requests_have_the_codec_bytes() {
        let op = codec::add_dest(&vs(), &dest(), &DestSpec { weight: 1 });
        let typed = codec::netlink_request(op.clone(), 0x24);
        let raw = ipvs_request(0x24, &op);
        assert_eq!(bytes_of(&typed), bytes_of(&raw));
    }

    #[test]
    fn deletes_of_missing_objects_succeed_and_other_errors_keep_op_and_errno() {
        let del_dest = IpvsOp::DelDest(vs(), dest());
        let del_svc = IpvsOp::DelService(vs());
        assert!(op_outcome(&del_dest, -2).is_ok()); // ENOENT: dest gone
        assert!(op_outcome(&del_dest, -3).is_ok()); // ESRCH: service gone
        assert!(op_outcome(&del_svc, -3).is_ok());
        let add = IpvsOp::AddDest(vs(), dest(), DestSpec { weight: 1 });
        let err = op_outcome(&add, -3).expect_err("ESRCH on add");
        assert_eq!(err.errno(), Some(Errno::ESRCH));
        assert_eq!(err.request(), Some(&Request::Op(add)));
        assert_eq!(
            err.to_string(),
            "ipvs -a -t 10.96.0.1:443 -r 10.244.1.5:8443 -m -w 1: No such process (os error 3)"
        );
        assert!(!err.is_unknown_outcome());
    }

    #[test]
    fn adds_that_find_an_existing_object_become_edits() {
        let exists = |op: &IpvsOp| op_outcome(op, -17);
        let add_svc = IpvsOp::AddService(vs(), rr());
        let add_dest = IpvsOp::AddDest(vs(), dest(), DestSpec { weight: 2 });
        assert_eq!(edit_instead(&add_svc, &exists(&add_svc)), Some(IpvsOp::EditService(vs(), rr())));
        assert_eq!(
            edit_instead(&add_dest, &exists(&add_dest)),
            Some(IpvsOp::EditDest(vs(), dest(), DestSpec { weight: 2 }))
        );
        let edit = IpvsOp::EditService(vs(), rr());
        assert_eq!(edit_instead(&edit, &exists(&edit)), None);
        assert_eq!(edit_instead(&add_svc, &op_outcome(&add_svc, -1)), None);
        assert_eq!(edit_instead(&add_svc, &Ok(())), None);
    }

    #[test]
    fn family_lookup_maps_enoent_to_not_available() {
        let err = family_from_replies(vec![ack(1, -2)]).expect_err("ENOENT");
        assert!(matches!(err, IpvsError::NotAvailable));
        assert_eq!(err.to_string(), NOT_AVAILABLE);
        let err = family_from_replies(vec![ack(1, -1)]).expect_err("EPERM");
        assert_eq!(err.errno(), Some(Errno(1)));
        assert_eq!(err.to_string(), "ipvs resolve generic netlink family IPVS: Operation not permitted (os error 1)");
    }

    #[test]
    fn family_lookup_reads_the_id_from_the_controller_reply() {
        let reply = GenlCtrl {
            cmd: GenlCtrlCmd::NewFamily,
            nlas: vec![
                GenlCtrlAttrs::FamilyName("IPVS".into()),
                GenlCtrlAttrs::FamilyId(0x24),
                GenlCtrlAttrs::Version(1),
            ],
        };
        let replies = vec![inner(&reply, 0), ack(1, 0)];
        assert_eq!(family_from_replies(replies).ok(), Some(0x24));
        let err = family_from_replies(vec![ack(1, 0)]).expect_err("no id");
        assert!(matches!(err, IpvsError::Reply { .. }), "{err:?}");
    }

    #[test]
    fn dump_replies_yield_entries_and_surface_kernel_errors() {
        let request = Request::DumpServices;
        let entry = codec::add_service(&vs(), &rr());
        let parsed = dump_entry(inner(&entry, 0x2), &request).expect("entry");
        assert_eq!(parsed, Some(entry.clone()));
        assert_eq!(dump_entry(done(0, 0), &request).expect("end"), None);
        let err = dump_entry(done(0, -4), &request).expect_err("EINTR");
        assert_eq!(err.errno(), Some(Errno(4)));
        let err = dump_entry(ack(9, -22), &request).expect_err("EINVAL");
        assert_eq!(err.to_string(), "ipvs -L -n: Invalid argument (os error 22)");
        let interrupted = dump_entry(inner(&entry, 0x2 | NLM_F_DUMP_INTR), &request);
        assert!(matches!(interrupted, Err(IpvsError::DumpInterrupted { .. })));
    }

    #[test]
    fn requests_print_as_ipvsadm_arguments() {
        let timeouts = Request::SetTimeouts { tcp: 900, tcp_fin: 120, udp: 300 };
        assert_eq!(timeouts.to_string(), "--set 900 120 300");
        assert_eq!(Request::Flush.to_string(), "-C");
        assert_eq!(Request::DumpDests(vs()).to_string(), "-L -n -t 10.96.0.1:443");
        let no_reply = IpvsError::NoReply { request: Request::Op(IpvsOp::DelService(vs())) };
        assert!(no_reply.is_unknown_outcome());
        assert_eq!(no_reply.to_string(), "ipvs -D -t 10.96.0.1:443: no reply from the kernel, outcome unknown");
    }
}
