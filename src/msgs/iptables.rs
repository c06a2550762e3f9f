//! Deltas for the iptables actor: one iptables-restore input per sync.

use std::fmt;

/// The rules of one sync, rendered as iptables-restore input.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RestoreInput {
    /// iptables-restore text: `*table` sections, chain declarations, rules, `COMMIT`.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IptablesOp {
    /// Apply with `iptables-restore --noflush`: only the chains the input
    /// declares are flushed and rewritten.
    Restore(RestoreInput),
}

impl fmt::Display for IptablesOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IptablesOp::Restore(r) => f.write_str(&r.text),
        }
    }
}
