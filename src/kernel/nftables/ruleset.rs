//! Two reads of the nf_tables ruleset as a whole, each one request on a
//! netlink socket of its own that gives up after a second: the ruleset
//! generation ([`generation`], `NFT_MSG_GETGEN`), and the names of one
//! table's chains ([`chain_names`], an `NFT_MSG_GETCHAIN` dump). The
//! iptables handle reads iptables-nft's tables with them; start-up probes
//! nftables mode's support with the chain dump.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{setsockopt, socket, sockopt, AddressFamily, SockFlag, SockProtocol, SockType};
use nix::sys::time::TimeVal;

use crate::net::IpFamily;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
const NLMSG_ERROR: u16 = 2;

/// The GETGEN request: nlmsghdr + nfgenmsg (AF_UNSPEC, NFNETLINK_V0).
fn getgen_request(seq: u32) -> [u8; 20] {
    let mut m = [0u8; 20];
    m[0..4].copy_from_slice(&20u32.to_ne_bytes());
    m[4..6].copy_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN).to_ne_bytes());
    m[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    m
}

/// The generation in a NEWGEN reply, or the errno of an error reply.
fn parse_getgen_reply(buf: &[u8]) -> io::Result<u32> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "unexpected nftables GETGEN reply");
    if buf.len() < 16 {
        return Err(bad());
    }
    let len = (u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize).min(buf.len());
    let ty = u16::from_ne_bytes([buf[4], buf[5]]);
    if ty == NLMSG_ERROR {
        let errno = buf.get(16..20).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).ok_or_else(bad)?;
        return Err(io::Error::from_raw_os_error(-errno));
    }
    if ty != (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN {
        return Err(bad());
    }
    // The payload after nlmsghdr (16): nfgenmsg, then the attributes.
    super::codec::generation_id(buf.get(16..len).unwrap_or(&[])).ok_or_else(bad)
}

/// A netlink netfilter socket whose receives time out after a second (an
/// error if the timeout cannot be set, so no read waits forever).
fn nfnetlink() -> io::Result<OwnedFd> {
    let sock = socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkNetFilter)?;
    setsockopt(&sock, sockopt::ReceiveTimeout, &TimeVal::new(1, 0))?;
    Ok(sock)
}

/// The nftables ruleset generation of the calling thread's network
/// namespace (every transaction increments it).
pub fn generation() -> io::Result<u32> {
    let sock = nfnetlink()?;
    let req = getgen_request(1);
    // SAFETY: `req` is readable for its length; an unbound netlink socket
    // sends to the kernel (pid 0) and is bound on first send.
    let sent = unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 512];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    parse_getgen_reply(&buf[..n as usize])
}

const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NLMSG_DONE: u16 = 3;

/// The names of the chains in the nf_tables table `table` of `family`
/// (iptables-nft's `ip`/`ip6` tables): one netlink dump, where
/// `iptables-nft-save` needs minutes once a table holds 100,000 chains.
/// Empty when the table does not exist.
pub fn chain_names(family: IpFamily, table: &str) -> io::Result<BTreeSet<String>> {
    let sock = nfnetlink()?;
    let req = getchain_request(family, 1);
    // SAFETY: `req` is readable for its length (see generation).
    if unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut chains = BTreeSet::new();
    let mut buf = vec![0u8; 1 << 17];
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if parse_chain_dump(&buf[..n as usize], table, &mut chains)? {
            return Ok(chains);
        }
    }
}

/// A GETCHAIN dump request for every chain of `family`.
fn getchain_request(family: IpFamily, seq: u32) -> [u8; 20] {
    let mut m = [0u8; 20];
    m[0..4].copy_from_slice(&20u32.to_ne_bytes());
    m[4..6].copy_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN).to_ne_bytes());
    m[6..8].copy_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    m[16] = match family {
        IpFamily::V4 => libc::NFPROTO_IPV4 as u8,
        IpFamily::V6 => libc::NFPROTO_IPV6 as u8,
    };
    m
}

/// Adds the names of `table`'s chains in one datagram of a chain dump to
/// `out`; true once the dump is done.
fn parse_chain_dump(mut buf: &[u8], table: &str, out: &mut BTreeSet<String>) -> io::Result<bool> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "unexpected nftables chain dump");
    while buf.len() >= 16 {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < 16 || len > buf.len() {
            return Err(bad());
        }
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        match ty {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = buf.get(16..20).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).ok_or_else(bad)?;
                // No nf_tables at all: no chains.
                if -errno == libc::ENOENT || -errno == libc::EAFNOSUPPORT {
                    return Ok(true);
                }
                return Err(io::Error::from_raw_os_error(-errno));
            }
            t if t == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN => {
                let (mut in_table, mut name) = (false, None);
                for (aty, value) in attributes(&buf[20.min(len)..len]) {
                    let text = value.split(|b| *b == 0).next().unwrap_or_default();
                    match aty {
                        NFTA_CHAIN_TABLE => in_table = text == table.as_bytes(),
                        NFTA_CHAIN_NAME => name = Some(String::from_utf8_lossy(text).into_owned()),
                        _ => {}
                    }
                }
                if let (true, Some(name)) = (in_table, name) {
                    out.insert(name);
                }
            }
            _ => {}
        }
        buf = &buf[((len + 3) & !3).min(buf.len())..];
    }
    Ok(false)
}

/// The (type, value) attributes in `buf`.
fn attributes(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let alen = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let aty = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        if alen < 4 || alen > buf.len() {
            return None;
        }
        let value = &buf[4..alen];
        buf = &buf[((alen + 3) & !3).min(buf.len())..];
        Some((aty, value))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getgen_request_is_an_nftables_request() {
        let m = getgen_request(7);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 20);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 0x0a10);
        assert_eq!(u16::from_ne_bytes(m[6..8].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        assert_eq!(&m[16..20], &[0, 0, 0, 0]);
    }

    fn reply(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(((16 + payload.len()) as u32).to_ne_bytes());
        m.extend(ty.to_ne_bytes());
        m.extend([0u8; 10]);
        m.extend(payload);
        m
    }

    #[test]
    fn reads_the_generation_and_kernel_errors() {
        let mut payload = vec![0u8; 4]; // nfgenmsg
        payload.extend(8u16.to_ne_bytes());
        payload.extend(1u16.to_ne_bytes()); // NFTA_GEN_ID
        payload.extend(4242u32.to_be_bytes());
        assert_eq!(parse_getgen_reply(&reply(0x0a0f, &payload)).unwrap(), 4242);
        let err = reply(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes());
        assert_eq!(parse_getgen_reply(&err).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert!(parse_getgen_reply(&reply(0x0a0f, &[0u8; 4])).is_err(), "no generation attribute");
        assert!(parse_getgen_reply(&[1, 2, 3]).is_err());
    }

    fn attr(ty: u16, value: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend(((4 + value.len()) as u16).to_ne_bytes());
        a.extend(ty.to_ne_bytes());
        a.extend(value);
        while a.len() % 4 != 0 {
            a.push(0);
        }
        a
    }

    #[test]
    fn a_chain_dump_gives_the_names_of_one_tables_chains() {
        let chain = |table: &str, name: &str| {
            let mut p = vec![2u8, 0, 0, 0];
            p.extend(attr(NFTA_CHAIN_TABLE, format!("{table}\0").as_bytes()));
            p.extend(attr(NFTA_CHAIN_NAME, format!("{name}\0").as_bytes()));
            reply(0x0a03, &p)
        };
        let mut datagram = chain("nat", "KUBE-SERVICES");
        datagram.extend(chain("filter", "KUBE-FORWARD"));
        datagram.extend(chain("nat", "KUBE-SVC-ABC"));
        let mut out = BTreeSet::new();
        assert!(!parse_chain_dump(&datagram, "nat", &mut out).unwrap(), "not done yet");
        assert_eq!(out.into_iter().collect::<Vec<_>>(), ["KUBE-SERVICES", "KUBE-SVC-ABC"]);
        let mut out = BTreeSet::new();
        assert!(parse_chain_dump(&reply(NLMSG_DONE, &[0u8; 4]), "nat", &mut out).unwrap());
        let err = reply(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes());
        assert_eq!(parse_chain_dump(&err, "nat", &mut out).unwrap_err().raw_os_error(), Some(libc::EPERM));
        let m = getchain_request(IpFamily::V6, 3);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 0x0a04);
        assert_eq!(m[16], 10);
    }
}
