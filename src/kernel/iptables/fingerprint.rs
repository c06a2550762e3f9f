//! Whether anything changed in a family's iptables since we last looked, for
//! the price of a syscall or one netlink message, not an `iptables-save`.
//!
//! - The legacy backend (`x_tables`): `IPT_SO_GET_INFO` (`IP6T_SO_GET_INFO`)
//!   gives each table's rule count and blob size without its rules; the
//!   fingerprint is those of mangle, nat and filter. The call waits for the
//!   x_tables lock, which a running `iptables-restore` holds: it runs on
//!   the blocking pool ([`crate::kernel::blocking`]).
//! - The nf_tables backend: the ruleset generation
//!   ([`NetlinkNftables::generation`], one exchange of the nfnetlink
//!   layer), which every nftables transaction (any table, any family)
//!   increments.
//!
//! Equal fingerprints mean nobody touched the tables (counters aside); a
//! different one says only that something changed, ours or not: the caller
//! then runs its real check.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{socket, AddressFamily, SockFlag, SockProtocol, SockType};

use crate::kernel::blocking::{off_thread, PoolError};
use crate::kernel::nftables::{NetlinkNftables, TransactionError};
use crate::net::IpFamily;

/// Which kernel interface the installed `iptables` drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Legacy,
    Nft,
}

impl Backend {
    /// From `iptables --version`: "iptables v1.8.9 (nf_tables)" or "(legacy)";
    /// versions before 1.8 name neither and are legacy.
    pub fn from_version(text: &str) -> Backend {
        if text.contains("nf_tables") {
            Backend::Nft
        } else {
            Backend::Legacy
        }
    }
}

/// A cheap summary of the tables' state; see the module doc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(Vec<u64>);

/// Why a fingerprint could not be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FingerprintError {
    #[error("reading the x_tables tables' sizes: {0}")]
    Legacy(#[source] std::sync::Arc<io::Error>),
    #[error("reading the nf_tables ruleset generation: {0}")]
    Nft(#[source] TransactionError),
    #[error(transparent)]
    Pool(#[from] PoolError),
}

/// The tables a legacy fingerprint covers.
const TABLES: [&str; 3] = ["mangle", "nat", "filter"];

/// Reads the fingerprint of `family`'s tables on `backend`: through `nft`
/// on the nf_tables backend; on the legacy one, a socket opened here (in
/// the calling thread's network namespace) and read on the blocking pool.
pub async fn fingerprint(
    family: IpFamily,
    backend: Backend,
    nft: &NetlinkNftables,
) -> Result<Fingerprint, FingerprintError> {
    let legacy_error = |e| FingerprintError::Legacy(std::sync::Arc::new(e));
    match backend {
        Backend::Legacy => {
            let (domain, level) = match family {
                IpFamily::V4 => (AddressFamily::Inet, libc::SOL_IP),
                IpFamily::V6 => (AddressFamily::Inet6, libc::SOL_IPV6),
            };
            let sock = socket(domain, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::Raw)
                .map_err(|e| legacy_error(e.into()))?;
            off_thread("x_tables GET_INFO", move || legacy(&sock, level)).await?.map_err(legacy_error)
        }
        Backend::Nft => nft.generation().await.map(|g| Fingerprint(vec![u64::from(g)])).map_err(FingerprintError::Nft),
    }
}

/// `struct ipt_getinfo` / `ip6t_getinfo`: name[32], valid_hooks,
/// hook_entry[5], underflow[5], num_entries, size (all u32).
const GETINFO_LEN: usize = 32 + 4 + 20 + 20 + 4 + 4;
/// `IPT_SO_GET_INFO` and `IP6T_SO_GET_INFO` (IPT_BASE_CTL).
const SO_GET_INFO: i32 = 64;

/// The sizes of [`TABLES`] through `sock`, an inet raw socket of the
/// family whose socket option level is `level`.
fn legacy(sock: &OwnedFd, level: i32) -> io::Result<Fingerprint> {
    let mut out = Vec::with_capacity(TABLES.len() * 2);
    for table in TABLES {
        let mut info = [0u8; GETINFO_LEN];
        info[..table.len()].copy_from_slice(table.as_bytes());
        let mut len = GETINFO_LEN as libc::socklen_t;
        // SAFETY: `info` is GETINFO_LEN writable bytes and `len` says so; the
        // kernel writes at most `len` bytes and updates `len`.
        let rc = unsafe { libc::getsockopt(sock.as_raw_fd(), level, SO_GET_INFO, info.as_mut_ptr().cast(), &mut len) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            // A table never loaded: nothing in it, ours included.
            if e.raw_os_error() == Some(libc::ENOENT) {
                out.extend([u64::MAX, u64::MAX]);
                continue;
            }
            return Err(e);
        }
        let word = |at: usize| u64::from(u32::from_ne_bytes([info[at], info[at + 1], info[at + 2], info[at + 3]]));
        out.extend([word(GETINFO_LEN - 8), word(GETINFO_LEN - 4)]);
    }
    Ok(Fingerprint(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_comes_from_the_version_line() {
        assert_eq!(Backend::from_version("iptables v1.8.9 (nf_tables)\n"), Backend::Nft);
        assert_eq!(Backend::from_version("iptables v1.8.9 (legacy)\n"), Backend::Legacy);
        assert_eq!(Backend::from_version("iptables v1.6.1\n"), Backend::Legacy);
    }
}
