//! What the handle reads back of a table (`iptables-save`, or on the
//! nf_tables backend its chain names and built-in chains' rules) and the
//! pure decisions taken on it: which of a mode's jumps are missing and the
//! restore lines that insert them, whether a mode's chains are there, and
//! the restore input that cleans a mode up.

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::chains::{is_service_chain, ChainProfile, Jump, CANARY};

/// The built-in chains of an iptables table.
pub(super) fn builtin_chains(table: &str) -> &'static [&'static str] {
    match table {
        "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        "filter" => &["INPUT", "FORWARD", "OUTPUT"],
        "mangle" => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
        "raw" => &["PREROUTING", "OUTPUT"],
        _ => &[],
    }
}

/// One table as `iptables-save -t TABLE` printed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedTable {
    /// Every chain, built-in or not.
    pub chains: BTreeSet<String>,
    /// The `-A ...` lines, in order.
    pub rules: Vec<String>,
}

impl SavedTable {
    pub fn parse(text: &str) -> SavedTable {
        let mut t = SavedTable::default();
        for line in text.lines().map(str::trim_end) {
            if let Some(decl) = line.strip_prefix(':') {
                if let Some(name) = decl.split_whitespace().next() {
                    t.chains.insert(name.to_string());
                }
            } else if line.starts_with("-A ") {
                t.rules.push(line.to_string());
            }
        }
        t
    }

    /// How many times `rule` (an `-A ...` line) appears.
    pub fn count(&self, rule: &str) -> usize {
        self.rules.iter().filter(|r| *r == rule).count()
    }
}

/// What the handle restores for `text` on a kernel with none of our chains
/// or jumps: `text` plus every jump of `profile` (`--dry-run` prints this).
pub fn restore_input_on_empty_kernel(profile: &ChainProfile, text: &str) -> String {
    let empty = SavedTable::default();
    insert_jumps(text, &missing_jumps(profile, &empty, &empty), &empty, &empty)
}

/// The mode's jumps (kept ones last) that the saved tables lack, in order.
pub(super) fn missing_jumps(profile: &ChainProfile, nat: &SavedTable, filter: &SavedTable) -> Vec<Jump> {
    profile
        .jumps
        .iter()
        .chain(profile.kept_jumps)
        .filter(|j| {
            let saved = if j.table == "nat" { nat } else { filter };
            saved.count(&j.save_line()) == 0
        })
        .copied()
        .collect()
}

/// Adds `-I FROM 1 ...` for each missing jump before the `COMMIT` of its
/// table's section in `text` (a table `text` lacks gets a section of its
/// own), declaring target chains that neither the kernel nor `text` has.
pub(super) fn insert_jumps(text: &str, missing: &[Jump], nat: &SavedTable, filter: &SavedTable) -> String {
    jump_parts(&[text], missing, nat, filter).concat()
}

/// A place in an input given in parts: (part, byte offset in it).
type At = (usize, usize);

/// The input `parts` with the missing jumps' lines inserted, as parts in
/// input order: slices of `parts` and the inserted lines (declarations of
/// target chains neither the kernel nor the input has, right after
/// `*table`; the `-I` lines before its `COMMIT`; a section of its own for a
/// table the input lacks). At 10,000 services the input is ≈ 55 MB: it is
/// not copied. Each part must end at a line end.
pub(super) fn jump_parts<'a>(
    parts: &[&'a str],
    missing: &[Jump],
    nat: &SavedTable,
    filter: &SavedTable,
) -> Vec<Cow<'a, str>> {
    let mut at: Vec<(At, String)> = Vec::new();
    let mut tail = String::new();
    for (table, saved) in [("nat", nat), ("filter", filter)] {
        let jumps: Vec<Jump> = missing.iter().copied().filter(|j| j.table == table).collect();
        if jumps.is_empty() {
            continue;
        }
        let mut targets: BTreeSet<&str> = jumps.iter().map(|j| j.to).filter(|c| !saved.chains.contains(*c)).collect();
        let section = section_bounds(parts, table, &mut targets);
        let decls: String = targets.iter().map(|c| format!(":{c} - [0:0]\n")).collect();
        let inserts: String = jumps.iter().map(|j| format!("{}\n", j.insert_line())).collect();
        match section {
            Some((start, commit)) => {
                at.push((start, decls));
                at.push((commit, inserts));
            }
            None => tail.push_str(&format!("*{table}\n{decls}{inserts}COMMIT\n")),
        }
    }
    at.sort_by_key(|(place, _)| *place);
    let mut out = Vec::with_capacity(parts.len() + 2 * at.len() + 2);
    let mut inserts = at.into_iter().peekable();
    for (i, part) in parts.iter().enumerate() {
        let mut pos = 0;
        while let Some(((_, offset), lines)) = inserts.next_if(|((p, _), _)| *p == i) {
            out.push(Cow::Borrowed(&part[pos..offset]));
            out.push(Cow::Owned(lines));
            pos = offset;
        }
        out.push(Cow::Borrowed(&part[pos..]));
    }
    if !tail.is_empty() {
        if parts.iter().rev().find(|p| !p.is_empty()).is_some_and(|p| !p.ends_with('\n')) {
            out.push(Cow::Borrowed("\n"));
        }
        out.push(Cow::Owned(tail));
    }
    out.retain(|p| !p.is_empty());
    out
}

/// Where `*table`'s section of the input starts (after its header line) and
/// its `COMMIT` line begins; removes from `targets` the chains the section
/// declares.
pub(super) fn section_bounds(parts: &[&str], table: &str, targets: &mut BTreeSet<&str>) -> Option<(At, At)> {
    let header = format!("*{table}");
    let mut start = None;
    for (i, part) in parts.iter().enumerate() {
        let mut offset = 0;
        for line in part.split_inclusive('\n') {
            let next = offset + line.len();
            match start {
                None if line.trim() == header => start = Some((i, next)),
                Some(s) if line.trim() == "COMMIT" => return Some((s, (i, offset))),
                Some(_) => {
                    if let Some(decl) = line.strip_prefix(':') {
                        targets.remove(decl.split(' ').next().unwrap_or(""));
                    }
                }
                None => {}
            }
            offset = next;
        }
    }
    None
}

/// Whether the saved tables hold a chain only `profile`'s mode writes.
pub(super) fn has_markers(profile: &ChainProfile, nat: &SavedTable, filter: &SavedTable) -> bool {
    let table = |t: &str| if t == "nat" { nat } else { filter };
    profile.markers.iter().any(|(t, c)| table(t).chains.contains(*c))
        || (profile.service_chains && nat.chains.iter().any(|c| is_service_chain(c)))
}

/// iptables' answers when a table cannot exist in this kernel.
pub(super) fn table_unavailable(message: &str) -> bool {
    ["Cannot initialize", "can't initialize", "Table does not exist"].iter().any(|m| message.contains(m))
}

/// The restore input that removes the modes' jumps, chains and canaries
/// from the saved tables, except the jumps, chains and canaries `keep` (the
/// mode now running) writes too; empty if there is nothing to remove.
pub(super) fn cleanup_input(
    profiles: &[&ChainProfile],
    keep: Option<&ChainProfile>,
    mangle: &SavedTable,
    nat: &SavedTable,
    filter: &SavedTable,
) -> String {
    let mut out = String::new();
    let service_chains = profiles.iter().any(|p| p.service_chains) && !keep.is_some_and(|k| k.service_chains);
    let kept_chain = |table: &str, c: &str| {
        keep.is_some_and(|k| {
            c == CANARY
                || (table == "nat" && k.nat_chains.contains(&c))
                || (table == "filter" && k.filter_chains.contains(&c))
        })
    };
    let kept_jump = |j: &Jump| keep.is_some_and(|k| k.jumps.iter().any(|kj| kj.save_line() == j.save_line()));
    for (table, saved) in [("mangle", mangle), ("nat", nat), ("filter", filter)] {
        let mut ours: Vec<&str> = Vec::new();
        let listed = profiles.iter().flat_map(|p| match table {
            "nat" => p.nat_chains,
            "filter" => p.filter_chains,
            _ => &[],
        });
        let service =
            saved.chains.iter().map(String::as_str).filter(|c| service_chains && table == "nat" && is_service_chain(c));
        for c in listed.copied().chain(service).chain([CANARY]) {
            if saved.chains.contains(c) && !ours.contains(&c) && !kept_chain(table, c) {
                ours.push(c);
            }
        }
        let mut deletes: Vec<String> = Vec::new();
        for j in profiles.iter().flat_map(|p| p.jumps).filter(|j| j.table == table && !kept_jump(j)) {
            let delete = format!("-D {} {}", j.from, j.spec());
            if !deletes.contains(&delete) {
                let n = saved.count(&j.save_line());
                deletes.extend(std::iter::repeat_n(delete, n));
            }
        }
        if ours.is_empty() && deletes.is_empty() {
            continue;
        }
        out.push_str(&format!("*{table}\n"));
        ours.iter().for_each(|c| out.push_str(&format!(":{c} - [0:0]\n")));
        deletes.iter().for_each(|d| out.push_str(&format!("{d}\n")));
        ours.iter().for_each(|c| out.push_str(&format!("-X {c}\n")));
        out.push_str("COMMIT\n");
    }
    out
}
