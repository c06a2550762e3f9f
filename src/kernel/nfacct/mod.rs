//! `NetlinkNfacct`: the kernel's extended accounting objects (nfnetlink_acct,
//! the `nfacct` tool's objects) that iptables mode's `-m nfacct
//! --nfacct-name NAME` rules count packets into, as upstream's
//! `pkg/proxy/util/nfacct` drives them: create the objects iptables mode
//! names (idempotent: an existing one keeps its counts), read one's
//! packet count (the metrics, at scrape time), delete one (tests).
//!
//! Objects live in the network namespace of the socket (the daemon's), one
//! set for both IP families. Requests go over the nfnetlink layer
//! ([`crate::kernel::netlink::Nfnl`]) as raw bytes ([`RawNfnl`]) and replies
//! are parsed here ([`codec`]), so a malformed reply fails its request.
//!
//! Not every kernel has the subsystem (`CONFIG_NETFILTER_NETLINK_ACCT`):
//! without it every request fails with `EINVAL`, and without
//! `CAP_NET_ADMIN` with `EPERM` ([`NfacctError::errno`]). The caller
//! decides what that means (iptables mode writes its rules without the
//! match).

pub mod codec;

use std::fmt;
use std::io;
use std::sync::Arc;

use netlink_packet_core::DecodeError;

use self::codec::{AcctMessage, Counter, NameError};
use crate::kernel::netlink::{self, Errno, Msg, Nfnl, NfnlError, RawNfnl};

/// `EBUSY`: `NFNL_MSG_ACCT_NEW` of a name that exists (without `NLM_F_EXCL`),
/// or `DEL` of an object a rule uses.
const EBUSY: Errno = Errno(16);

/// What was asked of the kernel, printed as `nfacct` arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    Add(String),
    Get(String),
    Delete(String),
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Add(n) => write!(f, "nfacct add {n}"),
            Request::Get(n) => write!(f, "nfacct get {n}"),
            Request::Delete(n) => write!(f, "nfacct delete {n}"),
        }
    }
}

/// Errors of the nfacct client; each names the request and keeps the cause.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NfacctError {
    #[error("{request}: {errno}")]
    Kernel {
        request: Request,
        #[source]
        errno: Errno,
    },
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
    #[error("cannot open a netfilter netlink socket: {0}")]
    Socket(#[source] Arc<io::Error>),
    #[error(transparent)]
    Name(#[from] NameError),
}

impl NfacctError {
    /// The kernel's errno, if the kernel refused the request.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            NfacctError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// `request` failed in the netlink layer: the kernel refused it, or
    /// there is no answer.
    fn netlink(request: Request, source: NfnlError) -> NfacctError {
        match source.errno() {
            Some(errno) => NfacctError::Kernel { request, errno },
            None => NfacctError::Netlink { request, source },
        }
    }
}

/// The bytes of [`codec::netlink_request`], as the layer sends them.
fn raw_request(msg: &AcctMessage) -> Msg {
    netlink::request(RawNfnl::emitted(msg), codec::request_flags(msg))
}

/// The nfacct client: a cheap `Clone` handle over one nfnetlink socket
/// (clones share it; their requests take turns).
#[derive(Debug, Clone)]
pub struct NetlinkNfacct {
    nl: Nfnl,
}

impl NetlinkNfacct {
    /// Opens the socket in the calling thread's network namespace. Opening
    /// works on every kernel; whether the subsystem answers shows at the
    /// first request.
    pub fn new() -> Result<NetlinkNfacct, NfacctError> {
        let nl = Nfnl::open().map_err(|e| NfacctError::Socket(Arc::new(e)))?;
        Ok(NetlinkNfacct { nl })
    }

    /// Netlink messages sent so far.
    pub fn messages_sent(&self) -> u64 {
        self.nl.messages_sent()
    }

    /// Creates each object of `names` that does not exist (one datagram);
    /// one result per name, in order. An existing object is left as it is,
    /// counts included.
    pub async fn ensure(&self, names: &[&str]) -> Vec<Result<(), NfacctError>> {
        let mut out: Vec<Option<Result<(), NfacctError>>> =
            names.iter().map(|n| codec::check_name(n).err().map(|e| Err(e.into()))).collect();
        let valid: Vec<usize> = (0..names.len()).filter(|&i| out[i].is_none()).collect();
        if !valid.is_empty() {
            let msgs = valid.iter().map(|&i| raw_request(&codec::new_request(names[i]))).collect();
            for (&i, result) in valid.iter().zip(self.nl.acked(msgs).await) {
                out[i] = Some(ensure_outcome(names[i], result));
            }
        }
        out.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
    }

    /// The object `name`, `None` if there is none.
    pub async fn get(&self, name: &str) -> Result<Option<Counter>, NfacctError> {
        codec::check_name(name)?;
        let request = Request::Get(name.to_string());
        get_outcome(&request, self.nl.get(raw_request(&codec::get_request(name))).await)
    }

    /// Deletes the object `name`; `Ok(false)` if there was none. An object
    /// a rule still references cannot go (`EBUSY`).
    pub async fn delete(&self, name: &str) -> Result<bool, NfacctError> {
        codec::check_name(name)?;
        let request = Request::Delete(name.to_string());
        let result = self.nl.acked(vec![raw_request(&codec::delete_request(name))]).await.into_iter().next();
        match result.unwrap_or(Ok(())) {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(false),
            Err(e) => Err(NfacctError::netlink(request, e)),
        }
    }
}

/// A create's result: created, or already there (`EBUSY`, or `EEXIST`
/// from a kernel that treats us as exclusive).
fn ensure_outcome(name: &str, result: Result<(), NfnlError>) -> Result<(), NfacctError> {
    match result {
        Err(e) if !matches!(e.errno(), Some(EBUSY | Errno::EEXIST)) => {
            Err(NfacctError::netlink(Request::Add(name.to_string()), e))
        }
        _ => Ok(()),
    }
}

/// A `GET`'s answer: the object's description (`None` when the kernel
/// says there is no such object).
fn get_outcome(request: &Request, answer: Result<Vec<RawNfnl>, NfnlError>) -> Result<Option<Counter>, NfacctError> {
    let objects = match answer {
        Ok(objects) => objects,
        Err(e) if e.errno() == Some(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(NfacctError::netlink(request.clone(), e)),
    };
    let Some(raw) = objects.last() else {
        return Err(NfacctError::Reply { request: request.clone(), what: codec::Unusable::NoObject });
    };
    let msg = codec::parse(raw.message_type(), raw.payload())
        .map_err(|e| NfacctError::Decode { request: request.clone(), source: Arc::new(e) })?;
    Counter::from_message(&msg).map(Some).map_err(|what| NfacctError::Reply { request: request.clone(), what })
}

#[cfg(test)]
mod tests {
    use super::codec::{AcctAttr, AcctCommand};
    use super::*;
    use crate::kernel::netlink::replies::bytes_of;

    fn described(name: &str, packets: u64) -> RawNfnl {
        let m = AcctMessage::request(
            AcctCommand::New,
            vec![AcctAttr::Name(name.into()), AcctAttr::Packets(packets), AcctAttr::Bytes(packets * 60)],
        );
        RawNfnl::emitted(&m)
    }

    fn get(name: &str) -> Request {
        Request::Get(name.into())
    }

    fn refused(errno: i32) -> NfnlError {
        NfnlError::Refused(Errno(errno))
    }

    #[test]
    fn raw_requests_have_the_codec_bytes() {
        let m = codec::new_request("ct_state_invalid_dropped_pkts");
        let typed = codec::netlink_request(m.clone());
        let raw = raw_request(&m);
        assert_eq!(bytes_of(&typed), bytes_of(&raw));
    }

    #[test]
    fn a_get_reads_the_description() {
        let got = get_outcome(&get("x"), Ok(vec![described("x", 7)])).expect("a counter");
        assert_eq!(got, Some(Counter { name: "x".into(), packets: 7, bytes: 420 }));
    }

    #[test]
    fn a_missing_object_is_none_and_other_errors_keep_the_errno() {
        assert_eq!(get_outcome(&get("x"), Err(refused(2))).ok(), Some(None));
        let err = get_outcome(&get("x"), Err(refused(22))).expect_err("EINVAL: no subsystem");
        assert_eq!(err.errno(), Some(Errno(22)));
        assert_eq!(err.to_string(), "nfacct get x: Invalid argument (os error 22)");
        let err = get_outcome(&get("x"), Ok(Vec::new())).expect_err("ack alone");
        assert!(matches!(err, NfacctError::Reply { .. }), "{err:?}");
        let err = get_outcome(&get("x"), Err(NfnlError::Overdue(std::time::Duration::from_secs(1))));
        assert!(matches!(err, Err(NfacctError::Netlink { .. })), "{err:?}");
    }

    #[test]
    fn an_unreadable_description_fails_the_get() {
        let garbage = RawNfnl { message_type: 0x0700, payload: vec![0, 0, 0, 0, 0x08, 0x00, 0x02, 0x00, 1, 2, 3, 4] };
        let err = get_outcome(&get("x"), Ok(vec![garbage])).expect_err("decode");
        assert!(matches!(err, NfacctError::Decode { .. }), "{err:?}");
    }

    #[test]
    fn creating_what_exists_succeeds_and_other_errors_name_the_object() {
        assert!(ensure_outcome("x", Ok(())).is_ok());
        assert!(ensure_outcome("x", Err(refused(16))).is_ok(), "EBUSY: it exists");
        assert!(ensure_outcome("x", Err(refused(17))).is_ok(), "EEXIST");
        let err = ensure_outcome("x", Err(refused(1))).expect_err("EPERM");
        assert_eq!(err.to_string(), "nfacct add x: Operation not permitted (os error 1)");
    }

    #[tokio::test]
    async fn bad_names_never_reach_the_kernel() {
        let nfacct = NetlinkNfacct::new().expect("netfilter netlink socket");
        let long = "x".repeat(40);
        let results = nfacct.ensure(&[""]).await;
        assert!(matches!(results[0], Err(NfacctError::Name(NameError::Empty))));
        assert!(matches!(nfacct.get(&long).await, Err(NfacctError::Name(NameError::TooLong(_)))));
        assert_eq!(nfacct.messages_sent(), 0);
    }
}
