//! A large restore on iptables' nf_tables backend, as several transactions.
//!
//! `iptables-nft-restore --noflush` (iptables 1.8.9) takes time that grows
//! with the square of one transaction's size: 5,400 lines 0.24 s, 16,200
//! lines 0.88 s, the 134,000 chain declarations of 10,000 services 115 s,
//! and the whole 533,000-line input of a cold sync at 10,000 services more
//! than 15 minutes (README, "iptables-nft at scale"). Transactions of a few
//! thousand lines cost about 45 µs a line. So an input this large is
//! restored as a sequence, in an order where no packet ever meets a
//! half-written service:
//!
//! 1. the nat chains the input declares and the kernel lacks, created empty
//!    (nothing jumps to them yet);
//! 2. each per-service chain (`KUBE-SVC-...`, [`is_service_chain`]) with
//!    its rules in one transaction (and its declaration, when it existed
//!    before, so it is flushed and refilled atomically), endpoint chains
//!    first and the chains that jump to others after them; the chains it
//!    jumps to exist already;
//! 3. everything else as it was, in one transaction: the top-level chains
//!    that jump to the service chains, the deletion of stale chains, the
//!    other tables.
//!
//! A failure part-way leaves only unreferenced or complete chains behind,
//! and the failed sync is retried in full.

use std::collections::{BTreeSet, HashMap};

use crate::kernel::iptables::chains::is_service_chain;

/// Lines per transaction. Each transaction with rules also costs a dump of
/// the table's rules (≈ 0.6 s of kernel time once 10,000 services are
/// in), each line more the longer the transaction: measured at 10,000
/// services, 2,000 lines a transaction took 49 s in all, 3,000 36–40 s,
/// 4,000 38–42 s, 8,000 52 s, 16,000 89 s.
pub const MAX_LINES: usize = 3_000;
/// Inputs from this size on are split: full syncs of large clusters. A
/// partial sync at 10,000 services (≈ 16,000 lines, the top-level chains)
/// stays one transaction (≈ 0.9 s), which is cheaper than several that each
/// dump the table's rules, and needs no listing of the table's chains.
pub const SPLIT_FROM: usize = 10 * MAX_LINES;

/// An input's lines, sorted into the three steps of the module doc.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split<'a> {
    /// Step 1: nat chains to create.
    new_chains: Vec<&'a str>,
    /// Step 2: each per-service chain's declaration (None for one step 1
    /// creates: declaring it again would only cost time) and rules.
    service_chains: Vec<(Option<&'a str>, Vec<&'a str>)>,
    /// Step 3: the other lines, in their order.
    rest: Vec<&'a str>,
}

/// When a per-service chain is filled: endpoint chains first, then the
/// service chains that jump to them, then the external and firewall chains
/// that jump to those (upstream's KUBE-FW → KUBE-EXT → KUBE-SVC/SVL → KUBE-SEP).
fn fill_rank(chain: &str) -> u8 {
    use crate::kernel::iptables::chains::{EXT_PREFIX, FW_PREFIX, SEP_PREFIX};
    if chain.starts_with(SEP_PREFIX) {
        0
    } else if chain.starts_with(EXT_PREFIX) {
        2
    } else if chain.starts_with(FW_PREFIX) {
        3
    } else {
        1
    }
}

/// The chain a `:CHAIN - [0:0]` declaration names.
fn declared(line: &str) -> Option<&str> {
    line.strip_prefix(':').and_then(|d| d.split_whitespace().next())
}

/// The chain an `-A CHAIN ...` rule appends to.
fn appended(line: &str) -> Option<&str> {
    line.strip_prefix("-A ").and_then(|r| r.split_whitespace().next())
}

impl<'a> Split<'a> {
    /// Sorts `lines` (a restore input); `existing` are the nat chains the
    /// kernel has.
    pub fn new(lines: impl Iterator<Item = &'a str> + Clone, existing: &BTreeSet<String>) -> Split<'a> {
        let mut table = "";
        let mut deleted = BTreeSet::new();
        for line in lines.clone() {
            if let Some(t) = line.strip_prefix('*') {
                table = t;
            } else if let Some(chain) = line.strip_prefix("-X ") {
                if table == "nat" {
                    deleted.insert(chain.trim());
                }
            }
        }
        let mut split = Split::default();
        let mut at: HashMap<&str, usize> = HashMap::new();
        table = "";
        for line in lines {
            if let Some(t) = line.strip_prefix('*') {
                table = t;
            } else if table == "nat" {
                if let Some(chain) = declared(line) {
                    let new = !deleted.contains(chain) && !existing.contains(chain);
                    if new {
                        split.new_chains.push(line);
                    }
                    if is_service_chain(chain) && !deleted.contains(chain) {
                        at.insert(chain, split.service_chains.len());
                        split.service_chains.push(((!new).then_some(line), Vec::new()));
                        continue;
                    }
                } else if let Some(i) = appended(line).and_then(|c| at.get(c)) {
                    split.service_chains[*i].1.push(line);
                    continue;
                }
            }
            split.rest.push(line);
        }
        // Jump targets before the chains that jump to them, so a chain
        // refilled to jump to a new one never meets it empty.
        split.service_chains.sort_by_key(|(decl, rules)| {
            let chain = decl.and_then(declared).or_else(|| rules.first().and_then(|r| appended(r)));
            chain.map_or(0, fill_rank)
        });
        split
    }

    /// The transactions, in order, each a whole restore input of at most
    /// `max` lines besides its `*nat`/`COMMIT` (a chain longer than that
    /// goes alone; the last one is as long as the rest).
    pub fn transactions(&self, max: usize) -> impl Iterator<Item = String> + '_ {
        let max = max.max(1);
        let declarations = self.new_chains.chunks(max).map(|c| nat(c.iter().copied()));
        let mut chains = Vec::new();
        let mut start = 0;
        let mut lines = 0;
        for (i, (decl, rules)) in self.service_chains.iter().enumerate() {
            let n = usize::from(decl.is_some()) + rules.len();
            if lines > 0 && lines + n > max {
                chains.push(start..i);
                (start, lines) = (i, 0);
            }
            lines += n;
        }
        if lines > 0 {
            chains.push(start..self.service_chains.len());
        }
        let filled = chains.into_iter().map(|range| {
            nat(self.service_chains[range]
                .iter()
                .flat_map(|(decl, rules)| decl.iter().copied().chain(rules.iter().copied())))
        });
        let rest = std::iter::once_with(|| lines_text(self.rest.iter().copied()));
        declarations.chain(filled).chain(rest)
    }
}

/// `lines` as a nat section.
fn nat<'a>(lines: impl Iterator<Item = &'a str>) -> String {
    lines_text(std::iter::once("*nat").chain(lines).chain(std::iter::once("COMMIT")))
}

fn lines_text<'a>(lines: impl Iterator<Item = &'a str>) -> String {
    let mut text = String::new();
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const INPUT: &str = "\
*filter
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -j RETURN
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-AAA - [0:0]
:KUBE-SEP-BBB - [0:0]
:KUBE-SEP-CCC - [0:0]
:KUBE-SVC-OLD - [0:0]
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SERVICES -d 10.0.0.1/32 -j KUBE-SVC-AAA
-A KUBE-SVC-AAA -m statistic --mode random --probability 0.5 -j KUBE-SEP-BBB
-A KUBE-SVC-AAA -j KUBE-SEP-CCC
-A KUBE-SEP-BBB -s 10.1.0.1/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-BBB -p tcp -j DNAT --to-destination 10.1.0.1:80
-A KUBE-SEP-CCC -p tcp -j DNAT --to-destination 10.1.0.2:80
-X KUBE-SVC-OLD
COMMIT
";

    fn existing(chains: &[&str]) -> BTreeSet<String> {
        chains.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn new_chains_first_then_each_service_chain_whole_then_the_rest() {
        let split = Split::new(INPUT.lines(), &existing(&["KUBE-SERVICES", "KUBE-SVC-AAA", "KUBE-SVC-OLD"]));
        let t: Vec<String> = split.transactions(3).collect();
        assert_eq!(
            t,
            [
                "*nat\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-SEP-BBB - [0:0]\n:KUBE-SEP-CCC - [0:0]\nCOMMIT\n",
                "*nat\n-A KUBE-SEP-BBB -s 10.1.0.1/32 -j KUBE-MARK-MASQ\n\
                 -A KUBE-SEP-BBB -p tcp -j DNAT --to-destination 10.1.0.1:80\n-A KUBE-SEP-CCC -p tcp -j DNAT --to-destination 10.1.0.2:80\nCOMMIT\n",
                "*nat\n:KUBE-SVC-AAA - [0:0]\n-A KUBE-SVC-AAA -m statistic --mode random --probability 0.5 -j KUBE-SEP-BBB\n\
                 -A KUBE-SVC-AAA -j KUBE-SEP-CCC\nCOMMIT\n",
                "*filter\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n\
                 :KUBE-MARK-MASQ - [0:0]\n:KUBE-SVC-OLD - [0:0]\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
                 -A KUBE-SERVICES -d 10.0.0.1/32 -j KUBE-SVC-AAA\n-X KUBE-SVC-OLD\nCOMMIT\n",
            ]
        );
    }

    #[test]
    fn every_line_is_written_once_apart_from_declarations_of_new_chains() {
        let split = Split::new(INPUT.lines(), &BTreeSet::new());
        let mut written: Vec<String> = split
            .transactions(100)
            .flat_map(|t| t.lines().map(str::to_string).collect::<Vec<_>>())
            .filter(|l| l != "*nat" && l != "COMMIT")
            .collect();
        let mut expected: Vec<String> =
            INPUT.lines().filter(|l| *l != "*nat" && *l != "COMMIT").map(str::to_string).collect();
        // New chains that are not per-service are declared twice: empty in
        // step 1, then again in step 3.
        expected.extend(["KUBE-SERVICES", "KUBE-MARK-MASQ"].map(|c| format!(":{c} - [0:0]")));
        written.sort();
        expected.sort();
        assert_eq!(written, expected);
    }

    #[test]
    fn a_chain_longer_than_the_limit_goes_alone() {
        let split = Split::new(
            INPUT.lines(),
            &existing(&["KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-SEP-BBB", "KUBE-SEP-CCC", "KUBE-SVC-AAA"]),
        );
        let t: Vec<String> = split.transactions(1).collect();
        assert_eq!(t.len(), 4, "three service chains one by one, then the rest: {t:?}");
        assert!(t[0].starts_with("*nat\n:KUBE-SEP-BBB"));
    }

    #[test]
    fn jump_targets_are_filled_before_the_chains_that_jump_to_them() {
        let input = "*nat\n:KUBE-FW-A - [0:0]\n:KUBE-EXT-A - [0:0]\n:KUBE-SVL-A - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-A - [0:0]\n\
                     -A KUBE-FW-A -j KUBE-EXT-A\n-A KUBE-EXT-A -j KUBE-SVL-A\n-A KUBE-SVL-A -j KUBE-SEP-A\n\
                     -A KUBE-SVC-A -j KUBE-SEP-A\n-A KUBE-SEP-A -j DNAT --to-destination 10.1.0.1:80\nCOMMIT\n";
        let existing = existing(&["KUBE-FW-A", "KUBE-EXT-A", "KUBE-SVL-A", "KUBE-SVC-A", "KUBE-SEP-A"]);
        let order: Vec<String> = Split::new(input.lines(), &existing)
            .transactions(1)
            .filter_map(|t| t.lines().nth(1).and_then(declared).map(str::to_string))
            .collect();
        assert_eq!(order, ["KUBE-SEP-A", "KUBE-SVL-A", "KUBE-SVC-A", "KUBE-EXT-A", "KUBE-FW-A"]);
    }
}
