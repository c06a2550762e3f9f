//! One daemon per network namespace. Two daemons in one namespace would
//! both write its kernel state, each undoing the other's at every sync. At
//! start the daemon binds the abstract unix socket `@kube-proxy-rs`, which
//! exists once per network namespace (and vanishes with the process, so a
//! killed daemon leaves nothing stale); it answers every connection with
//! its PID. A second daemon fails to bind, connects, and refuses to start
//! naming the first one's PID: the kernel's (`SO_PEERCRED`, in the second
//! one's PID namespace), or when that PID is not visible from there (the
//! first runs in a pod of its own) the one it answered with.

use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

use nix::sys::socket::{getsockopt, sockopt};

/// The abstract socket's name.
pub const NAME: &[u8] = b"kube-proxy-rs";

/// Another daemon holds this network namespace.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error("another kube-proxy-rs (pid {0}) already runs in this network namespace; stop it first")]
    Running(String),
    #[error("cannot take the instance socket @kube-proxy-rs: {0}")]
    Socket(#[source] std::io::Error),
}

/// Binds the instance socket of this network namespace for the rest of the
/// process's life (a thread answers on it), or says who holds it.
pub fn acquire() -> Result<(), InstanceError> {
    acquire_named(NAME)
}

/// [`acquire`] with another name (tests).
pub fn acquire_named(name: &[u8]) -> Result<(), InstanceError> {
    let addr = SocketAddr::from_abstract_name(name).map_err(InstanceError::Socket)?;
    match UnixListener::bind_addr(&addr) {
        Ok(listener) => {
            std::thread::Builder::new()
                .name("instance-socket".into())
                .spawn(move || {
                    for conn in listener.incoming() {
                        match conn {
                            Ok(mut conn) => {
                                let _ = conn.write_all(std::process::id().to_string().as_bytes());
                            }
                            // EMFILE and the like: not a reason to spin.
                            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
                        }
                    }
                })
                .map_err(InstanceError::Socket)?;
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(InstanceError::Running(holder(&addr))),
        Err(e) => Err(InstanceError::Socket(e)),
    }
}

/// The holder's PID: as the kernel gives it for our PID namespace, else
/// as it answers (its own namespace's), else "unknown".
fn holder(addr: &SocketAddr) -> String {
    let Ok(mut s) = UnixStream::connect_addr(addr) else {
        return "unknown".into();
    };
    let seen = getsockopt(&s, sockopt::PeerCredentials).map(|c| c.pid()).unwrap_or(0);
    if seen > 0 {
        return seen.to_string();
    }
    let mut answer = String::new();
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(1)));
    let _ = s.read_to_string(&mut answer);
    let pid = answer.trim();
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        "unknown".into()
    } else {
        format!("{pid} in another PID namespace")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_instance_is_refused_naming_the_first() {
        let name = format!("kube-proxy-rs-test-{}", std::process::id());
        acquire_named(name.as_bytes()).expect("first instance");
        let err = acquire_named(name.as_bytes()).expect_err("second refused").to_string();
        assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
    }
}
