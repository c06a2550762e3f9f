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
//!   as deleted. A dump the kernel marks interrupted (`NLM_F_DUMP_INTR`:
//!   the table changed under it, entries may be missing) is read again,
//!   up to [`DUMP_ATTEMPTS`](crate::kernel::netlink::DUMP_ATTEMPTS) times;
//!   after that the reconcile fails, deleting nothing, and is retried.
//! - Each delete names the entry's original tuple, zone and id, so only that
//!   entry goes (never a table flush, never a newer reuse of the tuple).
//! - A reconcile fails if its dump failed or if deleting one of its
//!   entries did, with the errno kept; the others are deleted all the same.
//! - Every netlink message sent is counted ([`NetlinkConntrack::messages_sent`]):
//!   a reconcile costs one dump plus one message per deleted entry.
//!
//! The messages are `netlink-packet-netfilter`'s [`NetfilterMessage`] (see
//! [`codec`] for what it lacks and how we fill it). The nfnetlink layer
//! ([`Nfnl`]) carries them as raw bytes ([`RawNfnl`]) and parsing happens
//! here, as the dump's entries arrive (on the blocking pool, with the
//! dump): a reply that fails to parse fails the dump rather than silently
//! leave a stale entry behind.

pub mod codec;
pub mod filter;

use crate::kernel::netlink::{self, Msg, Nfnl, NfnlError, RawNfnl};
use std::fmt;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use netlink_packet_core::DecodeError;
use netlink_packet_netfilter::NetfilterMessage;
use tracing::debug;

use self::codec::{Entry, ReplyError, Tuple};
use super::{ConntrackKernel, KResult, KernelError};
use crate::msgs::{ReconcileConntrack, Reconciled};
use crate::net::{IpFamily, Protocol};

pub use crate::kernel::netlink::MAX_BATCH;

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
    /// No (complete) answer: see the source (no reply in time, replies
    /// lost, an interrupted dump, ...).
    #[error("conntrack {request}: {source}")]
    Netlink {
        request: Request,
        #[source]
        source: NfnlError,
    },
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
        matches!(self, ConntrackError::Netlink { source, .. } if source.is_unknown_outcome())
    }

    /// `request` failed in the netlink layer: refused by the kernel, or
    /// without an answer.
    fn netlink(request: Request, source: NfnlError) -> ConntrackError {
        match source.errno() {
            Some(errno) => ConntrackError::Kernel { request, errno },
            None => ConntrackError::Netlink { request, source },
        }
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

/// The same bytes as [`codec::netlink_request`], as the layer sends them.
fn raw_request(msg: &NetfilterMessage) -> Msg {
    netlink::request(RawNfnl::from_message(msg), codec::request_flags(msg))
}

/// The ctnetlink client: a cheap `Clone` handle (clones share the socket and
/// the counters; their requests take turns).
#[derive(Clone)]
pub struct NetlinkConntrack {
    nl: Nfnl,
    entries_deleted: Arc<AtomicU64>,
    report: Option<Report>,
}

/// Told, after each reconcile whose dump went through, how long it took and
/// how many entries it deleted (upstream's conntrack reconciler metrics).
pub type Report = Arc<dyn Fn(Duration, u64) + Send + Sync>;

impl fmt::Debug for NetlinkConntrack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetlinkConntrack").field("nl", &self.nl).finish()
    }
}

impl NetlinkConntrack {
    /// Opens the netlink socket in the calling thread's network namespace.
    pub fn new() -> Result<NetlinkConntrack, ConntrackError> {
        let nl = Nfnl::open().map_err(|e| ConntrackError::Socket(Arc::new(e)))?;
        Ok(NetlinkConntrack { nl, entries_deleted: Arc::default(), report: None })
    }

    /// Reports each reconcile to `report`.
    pub fn with_report(mut self, report: Report) -> NetlinkConntrack {
        self.report = Some(report);
        self
    }

    /// Netlink messages sent so far (dumps and deletes).
    pub fn messages_sent(&self) -> u64 {
        self.nl.messages_sent()
    }

    /// Datagrams (sendmsg calls) sent so far; a delete batch is one datagram.
    pub fn datagrams_sent(&self) -> u64 {
        self.nl.datagrams_sent()
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
        let wanted = rc.clone();
        let (udp_entries, stale) = self
            .dump(rc.family, (0, Vec::new()), move |(udp_entries, stale): &mut (usize, Vec<Entry>), entry| {
                if entry.orig.protocol == udp {
                    *udp_entries += 1;
                    if filter::is_stale(&wanted, &entry) {
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
        self.dump(family, Vec::new(), |out: &mut Vec<Entry>, entry| out.push(entry)).await
    }

    /// Deletes `entries` (as dumped), one result per entry, in order.
    /// An entry that is already gone counts as deleted.
    pub async fn delete(&self, entries: &[Entry]) -> Vec<Result<(), ConntrackError>> {
        let msgs = entries.iter().map(|e| raw_request(&codec::delete_request(e))).collect();
        let results = self.nl.acked(msgs).await;
        entries.iter().zip(results).map(|(e, result)| self.delete_outcome(e, result)).collect()
    }

    // ------------------------------------------------------------ internals

    /// Dumps `family`'s table, handing each entry to `visit` with `state`
    /// as it arrives (nothing but what `visit` keeps is kept, whatever the
    /// table size). A reply that cannot be read fails the dump.
    async fn dump<S: Clone + Send + 'static>(
        &self,
        family: IpFamily,
        state: S,
        mut visit: impl FnMut(&mut S, Entry) + Send + 'static,
    ) -> Result<S, ConntrackError> {
        let request = Request::Dump(family);
        let msg = raw_request(&codec::dump_request(family));
        let read = request.clone();
        let dumped = self.nl.dump(msg, state, move |s, raw| dump_entry(&raw, &read).map(|entry| visit(s, entry)));
        dumped.await.map_err(|e| ConntrackError::netlink(request, e))?
    }

    /// A delete's result: deleting what is already gone (ENOENT) succeeds.
    fn delete_outcome(&self, entry: &Entry, result: Result<(), NfnlError>) -> Result<(), ConntrackError> {
        match result {
            Ok(()) => {
                self.entries_deleted.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(()),
            Err(e) => Err(ConntrackError::netlink(Request::Delete(entry.orig), e)),
        }
    }
}

/// One entry of a dump of `request`.
fn dump_entry(raw: &RawNfnl, request: &Request) -> Result<Entry, ConntrackError> {
    let msg = raw.parse().map_err(|e| ConntrackError::Decode { request: request.clone(), source: Arc::new(e) })?;
    Entry::from_message(&msg).map_err(|source| ConntrackError::Reply { request: request.clone(), source })
}

impl ConntrackKernel for NetlinkConntrack {
    fn reconcile(&self, rc: ReconcileConntrack) -> impl Future<Output = KResult<Reconciled>> + 'static {
        let me = self.clone();
        async move { me.clean_stale(&rc).await.map_err(|e| e.for_reconcile(rc.family)) }
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_netfilter::conntrack::{ConntrackAttribute, ConntrackMessage};

    use super::*;
    use crate::kernel::netlink::replies::bytes_of;

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

    fn dumped(e: &Entry) -> RawNfnl {
        RawNfnl::from_message(&new_msg(e, true))
    }

    fn refused(errno: i32) -> NfnlError {
        NfnlError::Refused(Errno(errno))
    }

    #[test]
    fn raw_requests_have_the_codec_bytes() {
        let m = codec::delete_request(&entry());
        let typed = codec::netlink_request(m.clone());
        let raw = raw_request(&m);
        assert_eq!(bytes_of(&typed), bytes_of(&raw));
    }

    #[test]
    fn dump_entries_are_read_and_the_layers_errors_name_the_request() {
        let request = Request::Dump(IpFamily::V4);
        assert_eq!(dump_entry(&dumped(&entry()), &request).ok(), Some(entry()));
        let err = ConntrackError::netlink(request.clone(), refused(1));
        assert_eq!(err.errno(), Some(Errno(1)));
        assert_eq!(err.to_string(), "conntrack -L -f ipv4: Operation not permitted (os error 1)");
        let err = ConntrackError::netlink(request, NfnlError::Interrupted(3));
        assert_eq!(err.to_string(), "conntrack -L -f ipv4: dump interrupted by concurrent changes 3 times in a row");
        assert!(!err.is_unknown_outcome(), "a dump deletes nothing");
        let err = ConntrackError::netlink(Request::Delete(entry().orig), NfnlError::Overrun);
        assert!(err.is_unknown_outcome());
    }

    #[test]
    fn unreadable_dump_entries_are_errors_not_skipped() {
        let request = Request::Dump(IpFamily::V6);
        let garbage = RawNfnl { message_type: 0x0100, payload: vec![0x0a, 0, 0, 0, 0x08, 0x00, 0x0c, 0x00, 1] };
        let err = dump_entry(&garbage, &request).expect_err("decode");
        assert!(matches!(err, ConntrackError::Decode { .. }), "{err:?}");
        let raw = RawNfnl::from_message(&new_msg(&entry(), false));
        let err = dump_entry(&raw, &request).expect_err("no reply tuple");
        assert_eq!(err.to_string(), "conntrack -L -f ipv6: unusable reply: reply lacks attribute CTA_TUPLE_REPLY");
    }

    #[test]
    fn deleting_what_is_gone_succeeds_and_other_errors_keep_errno() {
        let ct = NetlinkConntrack::new().expect("netfilter netlink socket");
        assert!(ct.delete_outcome(&entry(), Ok(())).is_ok());
        assert!(ct.delete_outcome(&entry(), Err(refused(2))).is_ok()); // ENOENT: already gone
        assert_eq!(ct.entries_deleted(), 1);
        let err = ct.delete_outcome(&entry(), Err(refused(1))).expect_err("EPERM");
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
        let overdue = NfnlError::Overdue(Duration::from_secs(10));
        let unknown = ConntrackError::Netlink { request: Request::Delete(entry().orig), source: overdue };
        assert!(unknown.is_unknown_outcome());
        assert_eq!(unknown.for_reconcile(IpFamily::V6).errno_value(), None);
        assert!(!unknown.for_reconcile(IpFamily::V6).outcome_known());
    }
}
