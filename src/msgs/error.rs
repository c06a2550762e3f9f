//! A kernel op's failure, as the handles report it and acks carry it.
//!
//! What the coordinator needs to know is whether the outcome is known: an op
//! the kernel (or a tool's transaction) refused did not take effect, so that
//! key alone is retried; an op whose answer never came (a lost reply, a
//! socket error, a tool killed half-way) may or may not have taken effect,
//! so only a read of the kernel (a full resync of that actor) settles it.

use std::error::Error;
use std::fmt;
use std::io;
use std::sync::Arc;

/// A failed kernel op, with the op it was (briefly, as the tool's command
/// line or the netlink request would name it) and why.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KernelError {
    /// The kernel or the tool refused: nothing of the op took effect.
    #[error("{op}: {cause}")]
    Refused {
        op: String,
        #[source]
        cause: Cause,
    },
    /// No answer: the op may or may not have taken effect.
    #[error("{op}: outcome unknown: {cause}")]
    Unknown {
        op: String,
        #[source]
        cause: Cause,
    },
}

/// Why an op failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Cause {
    /// An errno from the kernel, or an I/O error of our own.
    #[error("{0}")]
    Os(#[source] Arc<io::Error>),
    /// A library's error (netlink clients and codecs), with the kernel's
    /// errno when it refused.
    #[error("{source}")]
    Library {
        errno: Option<i32>,
        #[source]
        source: Arc<dyn Error + Send + Sync>,
    },
    /// What a tool wrote on stderr, or a state we refuse to act on.
    #[error("{0}")]
    Message(String),
}

impl KernelError {
    /// Refused, with what the tool said (or why we did not act).
    pub fn refused(op: impl fmt::Display, message: impl Into<String>) -> KernelError {
        KernelError::Refused { op: op.to_string(), cause: Cause::Message(message.into()) }
    }

    /// Refused by the kernel with `errno`.
    pub fn errno(op: impl fmt::Display, errno: i32) -> KernelError {
        KernelError::Refused { op: op.to_string(), cause: Cause::Os(Arc::new(io::Error::from_raw_os_error(errno))) }
    }

    /// An I/O error before the op reached the kernel (a tool could not be
    /// started, a file could not be read): known not to have taken effect.
    pub fn io(op: impl fmt::Display, e: io::Error) -> KernelError {
        KernelError::Refused { op: op.to_string(), cause: Cause::Os(Arc::new(e)) }
    }

    /// No answer came: the outcome is unknown.
    pub fn unknown(op: impl fmt::Display, cause: impl Into<Cause>) -> KernelError {
        KernelError::Unknown { op: op.to_string(), cause: cause.into() }
    }

    /// A library's error, keeping it as the source: `known` says whether
    /// the op is known not to have taken effect (the kernel refused it, or
    /// it was never sent) rather than unanswered.
    pub fn library(
        op: impl fmt::Display,
        known: bool,
        errno: Option<i32>,
        e: impl Error + Send + Sync + 'static,
    ) -> KernelError {
        let (op, cause) = (op.to_string(), Cause::Library { errno, source: Arc::new(e) });
        match known {
            true => KernelError::Refused { op, cause },
            false => KernelError::Unknown { op, cause },
        }
    }

    /// The same failure, of another op (a tool's failure, for each op it
    /// carried).
    pub fn for_op(self, new_op: impl fmt::Display) -> KernelError {
        match self {
            KernelError::Refused { cause, .. } => KernelError::Refused { op: new_op.to_string(), cause },
            KernelError::Unknown { cause, .. } => KernelError::Unknown { op: new_op.to_string(), cause },
        }
    }

    /// The op, as named when it failed.
    pub fn op(&self) -> &str {
        match self {
            KernelError::Refused { op, .. } | KernelError::Unknown { op, .. } => op,
        }
    }

    pub fn cause(&self) -> &Cause {
        match self {
            KernelError::Refused { cause, .. } | KernelError::Unknown { cause, .. } => cause,
        }
    }

    /// The kernel's errno, when it gave one.
    pub fn errno_value(&self) -> Option<i32> {
        match self.cause() {
            Cause::Os(e) => e.raw_os_error(),
            Cause::Library { errno, .. } => *errno,
            Cause::Message(_) => None,
        }
    }

    /// Whether we know the op did not take effect (so retrying it alone is
    /// enough); false when only a read of the kernel can tell.
    pub fn outcome_known(&self) -> bool {
        matches!(self, KernelError::Refused { .. })
    }
}

impl From<String> for Cause {
    fn from(message: String) -> Cause {
        Cause::Message(message)
    }
}

impl From<&str> for Cause {
    fn from(message: &str) -> Cause {
        Cause::Message(message.to_string())
    }
}

impl From<io::Error> for Cause {
    fn from(e: io::Error) -> Cause {
        Cause::Os(Arc::new(e))
    }
}

/// Equal when the same kind of failure of the same op says the same (acks
/// are compared in tests).
impl PartialEq for KernelError {
    fn eq(&self, other: &KernelError) -> bool {
        self.outcome_known() == other.outcome_known()
            && self.op() == other.op()
            && self.to_string() == other.to_string()
    }
}

impl Eq for KernelError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_keep_their_errno_and_source() {
        let e = KernelError::errno("-A -t 10.0.0.1:80 -s rr", libc::ESRCH);
        assert!(e.outcome_known());
        assert_eq!(e.errno_value(), Some(libc::ESRCH));
        assert!(e.source().is_some(), "the errno is the source");
        assert!(e.to_string().starts_with("-A -t 10.0.0.1:80 -s rr: No such process"), "{e}");
    }

    #[test]
    fn a_lost_reply_is_an_unknown_outcome() {
        let e = KernelError::unknown("-a -t 10.0.0.1:80 -r 10.1.0.1:80", "reply lost");
        assert!(!e.outcome_known());
        assert_eq!(e.errno_value(), None);
        assert_eq!(e.to_string(), "-a -t 10.0.0.1:80 -r 10.1.0.1:80: outcome unknown: reply lost");
        let lib = io::Error::new(io::ErrorKind::BrokenPipe, "socket closed");
        let lost = KernelError::library("dump", false, None, lib);
        assert!(!lost.outcome_known() && lost.source().is_some());
        let refused = KernelError::library("dump", true, Some(libc::EPERM), io::Error::other("x"));
        assert!(refused.outcome_known());
        assert_eq!(refused.errno_value(), Some(libc::EPERM));
    }
}
