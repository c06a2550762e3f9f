//! Deltas for the iptables actor: one iptables-restore input per sync.

use std::fmt;

/// The rules of one sync, rendered as iptables-restore input: `*table`
/// sections, chain declarations, rules, `COMMIT`. Held in parts (the input
/// is their concatenation; each ends at a line end): a full sync at 10,000
/// services is ≈ 55 MB, and its per-service rules are moved in from the
/// planner rather than copied into one buffer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RestoreInput {
    parts: Vec<String>,
}

impl RestoreInput {
    /// One part.
    pub fn new(text: impl Into<String>) -> RestoreInput {
        RestoreInput::from_parts(vec![text.into()])
    }

    /// Several parts, in order (empty ones dropped).
    pub fn from_parts(mut parts: Vec<String>) -> RestoreInput {
        parts.retain(|p| !p.is_empty());
        RestoreInput { parts }
    }

    pub fn parts(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().map(String::as_str)
    }

    /// Bytes its parts hold allocated (their length and what is spare).
    pub fn allocated(&self) -> usize {
        self.parts.iter().map(String::capacity).sum()
    }

    pub fn lines(&self) -> impl Iterator<Item = &str> {
        self.parts().flat_map(str::lines)
    }

    /// The whole input in one string (tests, logs of small inputs).
    pub fn text(&self) -> String {
        self.parts.concat()
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
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
                let tables: Vec<&str> = r.lines().filter_map(|l| l.strip_prefix('*')).collect();
                write!(f, "iptables-restore of {} lines ({})", r.lines().count(), tables.join(", "))
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
        let cut = text.find("-A").unwrap();
        let op = IptablesOp::Restore(RestoreInput::from_parts(vec![text[..cut].to_string(), text[cut..].to_string()]));
        assert_eq!(op.to_string(), "iptables-restore of 6 lines (nat, filter)");
    }
}
