//! Jumps from the built-in chains to ours, and what each mode owns in the
//! kernel's iptables: the iptables handle ensures a mode's jumps before its
//! first restore and on full resyncs, and removes its chains on cleanup.

/// A jump from a built-in chain to one of ours (upstream's iptablesJumpChain).
/// On every full sync, before the restore, each missing jump is inserted at
/// position [`JUMP_POSITION`] in [`JUMPS`] order (upstream's EnsureRule
/// Prepend, after EnsureChain of `to`), so on a fresh node the last one
/// listed for a chain ends up first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Jump {
    pub table: &'static str,
    /// The built-in chain.
    pub from: &'static str,
    /// Matches before the comment (`-m conntrack --ctstate NEW`), or "".
    pub extra: &'static str,
    /// The comment, or "" for none.
    pub comment: &'static str,
    /// Our chain.
    pub to: &'static str,
}

/// Where a missing jump is inserted (`-I <from> 1 ...`).
pub const JUMP_POSITION: u32 = 1;

impl Jump {
    /// The rule as `iptables-save` prints it, without `-A <from>`.
    pub fn spec(&self) -> String {
        let mut s = String::new();
        if !self.extra.is_empty() {
            s.push_str(self.extra);
            s.push(' ');
        }
        if !self.comment.is_empty() {
            s.push_str(&format!("-m comment --comment \"{}\" ", self.comment));
        }
        s.push_str("-j ");
        s.push_str(self.to);
        s
    }

    /// The `iptables-save` line (`-A <from> <spec>`).
    pub fn save_line(&self) -> String {
        format!("-A {} {}", self.from, self.spec())
    }

    /// The restore line that inserts it (`-I <from> 1 <spec>`).
    pub fn insert_line(&self) -> String {
        format!("-I {} {JUMP_POSITION} {}", self.from, self.spec())
    }
}

/// Builds a [`Jump`].
pub const fn jump(
    table: &'static str,
    from: &'static str,
    extra: &'static str,
    comment: &'static str,
    to: &'static str,
) -> Jump {
    Jump { table, from, extra, comment, to }
}

/// What one proxy mode owns in iptables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainProfile {
    pub mode: &'static str,
    /// Ensured before the first restore and on every full one, in order;
    /// removed by cleanup.
    pub jumps: &'static [Jump],
    /// Ensured after `jumps`, never removed (kubelet's, which kube-proxy keeps).
    pub kept_jumps: &'static [Jump],
    /// nat chains cleanup flushes and deletes if present.
    pub nat_chains: &'static [&'static str],
    /// filter chains cleanup flushes and deletes if present.
    pub filter_chains: &'static [&'static str],
    /// The per-service chains (`KUBE-SVC-...`, [`crate::plan::iptables::is_service_chain`])
    /// in nat are this mode's too.
    pub service_chains: bool,
    /// (table, chain) only this mode writes: finding one means the node ran it.
    pub markers: &'static [(&'static str, &'static str)],
}
