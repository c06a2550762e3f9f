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

/// Brief, for logs: a restore at 10,000 services is megabytes of text, so
/// it is named by its size and tables ("iptables-restore of 42 lines
/// (nat, filter)"), never printed whole.
impl fmt::Display for IptablesOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IptablesOp::Restore(r) => {
                let tables: Vec<&str> = r.text.lines().filter_map(|l| l.strip_prefix('*')).collect();
                write!(f, "iptables-restore of {} lines ({})", r.text.lines().count(), tables.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_is_named_by_its_size_and_tables_not_printed() {
        let text = "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n*filter\nCOMMIT\n".to_string();
        let op = IptablesOp::Restore(RestoreInput { text });
        assert_eq!(op.to_string(), "iptables-restore of 6 lines (nat, filter)");
    }
}
