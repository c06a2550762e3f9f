//! `NetlinkConntrack`: the conntrack actor's kernel handle. It reconciles
//! one family's conntrack table over ctnetlink (`NETLINK_NETFILTER`,
//! subsystem `NFNL_SUBSYS_CTNETLINK`), as upstream's
//! `conntrack.CleanStaleEntries` does: list, filter, delete.
//!
//! - [`NetlinkConntrack::clean_stale`] dumps the family's table once
//!   (`IPCTNL_MSG_CT_GET` + `NLM_F_DUMP`), asks [`filter::is_stale`] about
//!   each entry as it arrives (only the stale ones are kept), then deletes
//!   them, pipelined: [`MAX_BATCH`] `IPCTNL_MSG_CT_DELETE` requests per
//!   datagram, one ack each. An entry that is already gone (ENOENT) counts
//!   as deleted.
//! - Each delete names the entry's original tuple, zone and id, so only that
//!   entry goes (never a table flush, never a newer reuse of the tuple).
//! - A reconcile fails if its dump failed or if deleting one of its
//!   entries did, with the errno kept; the others are deleted all the same.
//! - Every netlink message sent is counted ([`NetlinkConntrack::messages_sent`]):
//!   a reconcile costs one dump plus one message per deleted entry.
//!
//! The messages are `netlink-packet-netfilter`'s [`NetfilterMessage`] (see
//! [`codec`] for what it lacks and how we fill it). The connection still
//! carries them as raw bytes ([`RawNfnl`]) and parsing happens here: with
//! `NetfilterMessage` as the connection's type, netlink-proto would drop a
//! reply that fails to parse with only a log line (`codecs.rs`: "failed to
//! decode packet"), which would silently leave a stale entry behind; here it
//! fails the dump instead.

pub mod codec;
pub mod filter;

use crate::kernel::netlink::{BatchFailure, Client, RawNfnl, Replies};
use std::fmt;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use netlink_packet_core::{DecodeError, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::NetfilterMessage;
use netlink_proto::sys::protocols::NETLINK_NETFILTER;
use netlink_proto::NetlinkProtoError;
use tracing::{debug, trace};

use self::codec::{Entry, ReplyError, Tuple};
use super::{ConntrackKernel, KResult, KernelError};
use crate::msgs::{ReconcileConntrack, Reconciled};
use crate::net::{IpFamily, Protocol};

pub use crate::kernel::netlink::MAX_BATCH;

pub use crate::kernel::netlink::DEFAULT_REPLY_TIMEOUT;

pub use crate::kernel::netlink::Errno;

/// What was asked of the kernel, printed as `conntrack` arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    /// List one family's table.
    Dump(IpFamily),
    /// Delete the entry with this original tuple.
    Delete(Tuple),
}

fn family_name(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4",
        IpFamily::V6 => "ipv6",
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Dump(family) => write!(f, "-L -f {}", family_name(*family)),
            Request::Delete(t) => {
                let proto =
                    Protocol::from_number(t.protocol).map_or_else(|| t.protocol.to_string(), |p| p.lower().into());
                write!(f, "-D -f {} -p {proto} -s {} -d {}", family_name(t.family()), t.src, t.dst)?;
                if let (Some(sport), Some(dport)) = (t.src_port, t.dst_port) {
                    write!(f, " --sport {sport} --dport {dport}")?;
                }
                Ok(())
            }
        }
    }
}

/// Errors of the ctnetlink client. Each names the request (`conntrack`
/// style) and keeps the cause.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ConntrackError {
    #[error("conntrack {request}: {errno}")]
    Kernel {
        request: Request,
        #[source]
        errno: Errno,
    },
    /// No reply in time, or the connection ended mid-answer: the request
    /// may or may not have been carried out.
    #[error("conntrack {request}: no reply from the kernel, outcome unknown")]
    NoReply { request: Request },
    #[error("conntrack {request}: netlink connection closed: {source}")]
    ConnectionClosed {
        request: Request,
        #[source]
        source: Arc<NetlinkProtoError>,
    },
    /// The socket's receive buffer overflowed: replies were lost.
    #[error("conntrack {request}: netlink receive buffer overrun, replies lost")]
    Overrun { request: Request },
    #[error("conntrack {request}: malformed reply: {source}")]
    Decode {
        request: Request,
        #[source]
        source: Arc<DecodeError>,
    },
    #[error("conntrack {request}: unusable reply: {source}")]
    Reply {
        request: Request,
        #[source]
        source: ReplyError,
    },
    #[error("cannot open a netfilter netlink socket: {0}")]
    Socket(#[source] Arc<io::Error>),
}

impl ConntrackError {
    /// The kernel's errno, if the kernel refused the request.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            ConntrackError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// True when entries may have been deleted anyway.
    pub fn is_unknown_outcome(&self) -> bool {
        matches!(self, ConntrackError::NoReply { .. } | ConntrackError::ConnectionClosed { .. })
    }

    /// As the conntrack actor reports it: the reconcile of `family` failed.
    pub fn for_reconcile(&self, family: IpFamily) -> KernelError {
        let op = format!("conntrack reconcile {}", family_name(family));
        KernelError::library(op, !self.is_unknown_outcome(), self.errno().map(|e| e.0), self.clone())
    }
}

/// Conntrack's view of the shared raw nfnetlink payload.
impl RawNfnl {
    /// Emits a typed message.
    pub fn from_message(msg: &NetfilterMessage) -> RawNfnl {
        RawNfnl::emitted(msg)
    }

    /// Parses the bytes as a ctnetlink message.
    pub fn parse(&self) -> Result<NetfilterMessage, DecodeError> {
        codec::parse(self.message_type, &self.payload)
    }
}

type Msg = NetlinkMessage<RawNfnl>;

/// The same bytes as [`codec::netlink_request`], in the connection's type.
fn raw_request(msg: &NetfilterMessage) -> Msg {
    let mut nl =
        NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(RawNfnl::from_message(msg)));
    nl.header.flags = codec::request_flags(msg);
    nl.finalize();
    nl
}

/// The ctnetlink client: a cheap `Clone` handle (clones share the socket and
/// the counters); `&self` methods may run concurrently. The connection task
/// ends when the last clone is dropped.
#[derive(Clone)]
pub struct NetlinkConntrack {
    client: Client<RawNfnl>,
    entries_deleted: Arc<AtomicU64>,
    report: Option<Report>,
}

/// Told, after each reconcile whose dump went through, how long it took and
/// how many entries it deleted (upstream's conntrack reconciler metrics).
pub type Report = Arc<dyn Fn(Duration, u64) + Send + Sync>;

impl fmt::Debug for NetlinkConntrack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetlinkConntrack").field("client", &self.client).finish()
    }
}

impl NetlinkConntrack {
    /// Opens the netlink socket (in the calling thread's network namespace)
    /// and spawns its connection task: must run inside a Tokio runtime with
    /// I/O and time enabled.
    pub fn new() -> Result<NetlinkConntrack, ConntrackError> {
        let client = Client::open(NETLINK_NETFILTER).map_err(|e| ConntrackError::Socket(Arc::new(e)))?;
        Ok(NetlinkConntrack { client, entries_deleted: Arc::default(), report: None })
    }

    /// Reports each reconcile to `report`.
    pub fn with_report(mut self, report: Report) -> NetlinkConntrack {
        self.report = Some(report);
        self
    }

    /// Sets how long to wait for each reply (default 10 s).
    pub fn with_reply_timeout(mut self, timeout: Duration) -> NetlinkConntrack {
        self.client = self.client.with_reply_timeout(timeout);
        self
    }

    /// Netlink messages sent so far (dumps and deletes).
    pub fn messages_sent(&self) -> u64 {
        self.client.messages_sent()
    }

    /// Datagrams (sendmsg calls) sent so far; a delete batch is one datagram.
    pub fn datagrams_sent(&self) -> u64 {
        self.client.datagrams_sent()
    }

    /// Entries this handle deleted (not counting ones already gone).
    pub fn entries_deleted(&self) -> u64 {
        self.entries_deleted.load(Ordering::Relaxed)
    }

    /// One dump of `rc.family`'s table, then the deletion of every entry
    /// [`filter::is_stale`] names. Reported (see [`Report`]) once the dump
    /// went through, whether the deletes did or not.
    pub async fn clean_stale(&self, rc: &ReconcileConntrack) -> Result<Reconciled, ConntrackError> {
        let (started, deleted_before) = (std::time::Instant::now(), self.entries_deleted());
        let udp = Protocol::Udp.number();
        let mut udp_entries = 0;
        let mut stale = Vec::new();
        self.dump(rc.family, |entry| {
            if entry.orig.protocol == udp {
                udp_entries += 1;
                if filter::is_stale(rc, &entry) {
                    stale.push(entry);
                }
            }
        })
        .await?;
        debug!(family = family_name(rc.family), udp_entries, stale = stale.len(), "conntrack: deleting stale entries");
        let failed = self.delete(&stale).await.into_iter().find_map(Result::err);
        let deleted = self.entries_deleted().saturating_sub(deleted_before);
        if let Some(report) = &self.report {
            report(started.elapsed(), deleted);
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(Reconciled { udp_entries, deleted }),
        }
    }

    /// Every entry of `family`'s table.
    pub async fn entries(&self, family: IpFamily) -> Result<Vec<Entry>, ConntrackError> {
        let mut out = Vec::new();
        self.dump(family, |entry| out.push(entry)).await?;
        Ok(out)
    }

    /// Deletes `entries` (as dumped), one result per entry, in order.
    /// An entry that is already gone counts as deleted.
    pub async fn delete(&self, entries: &[Entry]) -> Vec<Result<(), ConntrackError>> {
        let mut out = Vec::with_capacity(entries.len());
        for chunk in entries.chunks(MAX_BATCH) {
            let msgs = chunk.iter().map(|e| raw_request(&codec::delete_request(e))).collect();
            match self.send_batch(msgs).await {
                Ok(codes) => out.extend(chunk.iter().zip(codes).map(|(e, code)| self.delete_outcome(e, code))),
                Err(failure) => out.extend(chunk.iter().map(|e| Err(failure.error(Request::Delete(e.orig))))),
            }
        }
        out
    }

    // ------------------------------------------------------------ internals

    /// Dumps `family`'s table, handing each entry to `visit` as it arrives
    /// (nothing but the matches is kept, whatever the table size). A reply
    /// that cannot be read fails the dump, after it is drained.
    async fn dump(&self, family: IpFamily, mut visit: impl FnMut(Entry)) -> Result<(), ConntrackError> {
        let request = Request::Dump(family);
        let msg = raw_request(&codec::dump_request(family));
        let mut replies = self.client.request(vec![msg]).map_err(|e| closed(&request, e))?;
        let mut outcome: Option<Result<(), ConntrackError>> = None;
        while let Some(reply) = self.next_reply(&mut replies, &request).await? {
            if outcome.as_ref().is_some_and(Result::is_err) {
                continue; // drain what is left of a failed dump
            }
            match dump_reply(reply, &request) {
                Ok(DumpReply::Entry(entry)) => visit(entry),
                Ok(DumpReply::Skip) => {}
                Ok(DumpReply::End) => outcome = Some(Ok(())),
                Err(e) => outcome = Some(Err(e)),
            }
        }
        // The stream ended without NLMSG_DONE: the connection went away.
        outcome.unwrap_or(Err(ConntrackError::NoReply { request }))
    }

    /// The next reply, `None` at the end of the stream; an error if overdue.
    async fn next_reply(
        &self,
        replies: &mut Replies<RawNfnl>,
        request: &Request,
    ) -> Result<Option<Msg>, ConntrackError> {
        replies.next().await.map_err(|_overdue| ConntrackError::NoReply { request: request.clone() })
    }

    /// Sends `msgs` in one datagram; returns each request's error code
    /// (0 for an ack), in request order.
    async fn send_batch(&self, msgs: Vec<Msg>) -> Result<Vec<i32>, BatchFailure> {
        trace!(messages = msgs.len(), "conntrack: sending delete batch");
        self.client.send_batch(msgs).await
    }

    /// A delete's result from its netlink error code: deleting what is
    /// already gone (ENOENT) succeeds.
    fn delete_outcome(&self, entry: &Entry, code: i32) -> Result<(), ConntrackError> {
        match code {
            0 => {
                self.entries_deleted.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            code if Errno::from_code(code) == Errno::ENOENT => Ok(()),
            code => Err(ConntrackError::Kernel { request: Request::Delete(entry.orig), errno: Errno::from_code(code) }),
        }
    }
}

/// What one dump reply means.
#[derive(Debug, PartialEq)]
enum DumpReply {
    Entry(Entry),
    /// Not an entry (e.g. a bare ack): nothing to do.
    Skip,
    /// `NLMSG_DONE`: the dump is complete.
    End,
}

/// Reads one dump reply: an entry, the end, or the kernel's error.
fn dump_reply(reply: Msg, request: &Request) -> Result<DumpReply, ConntrackError> {
    let kernel = |code: i32| ConntrackError::Kernel { request: request.clone(), errno: Errno::from_code(code) };
    match reply.payload {
        NetlinkPayload::InnerMessage(raw) => {
            let msg =
                raw.parse().map_err(|e| ConntrackError::Decode { request: request.clone(), source: Arc::new(e) })?;
            let entry = Entry::from_message(&msg)
                .map_err(|source| ConntrackError::Reply { request: request.clone(), source })?;
            Ok(DumpReply::Entry(entry))
        }
        NetlinkPayload::Error(e) if e.code.is_some() => Err(kernel(e.raw_code())),
        NetlinkPayload::Done(done) if done.code != 0 => Err(kernel(done.code)),
        NetlinkPayload::Done(_) => Ok(DumpReply::End),
        NetlinkPayload::Overrun(_) => Err(ConntrackError::Overrun { request: request.clone() }),
        _ => Ok(DumpReply::Skip),
    }
}

/// The client's error for a request of a batch that got no answer.
trait BatchError {
    fn error(&self, request: Request) -> ConntrackError;
}

impl BatchError for BatchFailure {
    fn error(&self, request: Request) -> ConntrackError {
        match self {
            BatchFailure::Closed(source) => ConntrackError::ConnectionClosed { request, source: source.clone() },
            BatchFailure::NoReply => ConntrackError::NoReply { request },
        }
    }
}

fn closed(request: &Request, e: NetlinkProtoError) -> ConntrackError {
    ConntrackError::ConnectionClosed { request: request.clone(), source: Arc::new(e) }
}

impl ConntrackKernel for NetlinkConntrack {
    fn reconcile(&self, rc: ReconcileConntrack) -> impl Future<Output = KResult<Reconciled>> + 'static {
        let me = self.clone();
        async move { me.clean_stale(&rc).await.map_err(|e| e.for_reconcile(rc.family)) }
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::NLM_F_MULTIPART;
    use netlink_packet_netfilter::conntrack::{ConntrackAttribute, ConntrackMessage};

    use super::*;
    use crate::kernel::netlink::replies::{ack, bytes_of, done, msg};

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().expect("test address")
    }

    fn entry() -> Entry {
        let t = |src: &str, dst: &str, sport, dport| Tuple {
            src: ip(src),
            dst: ip(dst),
            protocol: 17,
            src_port: Some(sport),
            dst_port: Some(dport),
        };
        Entry {
            orig: t("10.0.0.1", "10.96.0.10", 40001, 53),
            reply: t("10.244.1.1", "10.0.0.1", 5353, 40001),
            zone: None,
            id: Some(42),
        }
    }

    /// `e` as the kernel dumps it (`IPCTNL_MSG_CT_NEW`), with `reply` or not.
    fn new_msg(e: &Entry, reply: bool) -> NetfilterMessage {
        let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(e.orig.attrs())];
        if reply {
            attrs.push(ConntrackAttribute::CtaTupleReply(e.reply.attrs()));
        }
        attrs.extend(e.zone.map(codec::zone_attr));
        attrs.extend(e.id.map(codec::id_attr));
        NetfilterMessage::new(codec::header(e.orig.family()), ConntrackMessage::New(attrs))
    }

    fn dumped(e: &Entry) -> Msg {
        msg(9, NLM_F_MULTIPART, NetlinkPayload::InnerMessage(RawNfnl::from_message(&new_msg(e, true))))
    }

    #[test]
    fn raw_requests_have_the_codec_bytes() {
        let m = codec::delete_request(&entry());
        let typed = codec::netlink_request(m.clone());
        let raw = raw_request(&m);
        assert_eq!(bytes_of(&typed), bytes_of(&raw));
    }

    #[test]
    fn dump_replies_yield_entries_the_end_and_kernel_errors() {
        let request = Request::Dump(IpFamily::V4);
        assert_eq!(dump_reply(dumped(&entry()), &request).ok(), Some(DumpReply::Entry(entry())));
        assert_eq!(dump_reply(done(NLM_F_MULTIPART, 0), &request).ok(), Some(DumpReply::End));
        let err = dump_reply(done(NLM_F_MULTIPART, -1), &request).expect_err("EPERM");
        assert_eq!(err.errno(), Some(Errno(1)));
        assert_eq!(err.to_string(), "conntrack -L -f ipv4: Operation not permitted (os error 1)");
        let err = dump_reply(ack(9, -22), &request).expect_err("EINVAL");
        assert_eq!(err.errno(), Some(Errno(22)));
        let overrun = dump_reply(msg(0, 0, NetlinkPayload::Overrun(Vec::new())), &request);
        assert!(matches!(overrun, Err(ConntrackError::Overrun { .. })));
    }

    #[test]
    fn unreadable_dump_entries_are_errors_not_skipped() {
        let request = Request::Dump(IpFamily::V6);
        let garbage = RawNfnl { message_type: 0x0100, payload: vec![0x0a, 0, 0, 0, 0x08, 0x00, 0x0c, 0x00, 1] };
        let err = dump_reply(msg(9, 0, NetlinkPayload::InnerMessage(garbage)), &request).expect_err("decode");
        assert!(matches!(err, ConntrackError::Decode { .. }), "{err:?}");
        let raw = RawNfnl::from_message(&new_msg(&entry(), false));
        let err = dump_reply(msg(9, 0, NetlinkPayload::InnerMessage(raw)), &request).expect_err("no reply tuple");
        assert_eq!(err.to_string(), "conntrack -L -f ipv6: unusable reply: reply lacks attribute CTA_TUPLE_REPLY");
    }

    #[tokio::test]
    async fn deleting_what_is_gone_succeeds_and_other_errors_keep_errno() {
        let ct = NetlinkConntrack::new().expect("netfilter netlink socket");
        assert!(ct.delete_outcome(&entry(), 0).is_ok());
        assert!(ct.delete_outcome(&entry(), -2).is_ok()); // ENOENT: already gone
        assert_eq!(ct.entries_deleted(), 1);
        let err = ct.delete_outcome(&entry(), -1).expect_err("EPERM");
        assert_eq!(err.errno(), Some(Errno(1)));
        assert_eq!(
            err.to_string(),
            "conntrack -D -f ipv4 -p udp -s 10.0.0.1 -d 10.96.0.10 --sport 40001 --dport 53: \
             Operation not permitted (os error 1)"
        );
        assert!(!err.is_unknown_outcome());
        assert_eq!(ct.messages_sent(), 0);
    }

    #[test]
    fn actor_errors_name_the_reconcile_and_keep_the_errno() {
        let err = ConntrackError::Kernel { request: Request::Dump(IpFamily::V4), errno: Errno(1) };
        let k = err.for_reconcile(IpFamily::V4);
        assert_eq!(k.op(), "conntrack reconcile ipv4");
        assert_eq!(k.errno_value(), Some(1));
        assert!(k.outcome_known());
        assert_eq!(
            k.to_string(),
            "conntrack reconcile ipv4: conntrack -L -f ipv4: Operation not permitted (os error 1)"
        );
        let unknown = ConntrackError::NoReply { request: Request::Delete(entry().orig) };
        assert!(unknown.is_unknown_outcome());
        assert_eq!(unknown.for_reconcile(IpFamily::V6).errno_value(), None);
        assert!(!unknown.for_reconcile(IpFamily::V6).outcome_known());
    }
}
