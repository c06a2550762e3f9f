//! `--dry-run --diff`: what the first sync would change, as `+`/`-` lines
//! in each tool's syntax. Pure: the desired lines come from the planner's
//! renderers, the live lines from the kernel's own dumps (read by
//! [`super`]), both already in one syntax; this module only
//! compares and prints.
//!
//! - Sections whose objects are a set (IPVS servers, set members,
//!   addresses) compare as multisets: a line is added, removed or kept.
//! - iptables compares per table and chain: chains we own are declared or
//!   removed (`+:CHAIN` / `-:CHAIN`), their rules compared as multisets;
//!   in the built-in chains only the rules that jump to chains we own
//!   count. A chain whose rules stay but change order is named.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// One section of the preview: its heading, its `+`/`-` lines (and
/// unprefixed context lines such as `*nat`), notes, and counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SectionDiff {
    pub heading: String,
    pub lines: Vec<String>,
    /// `# ...` lines printed after the heading (what was not compared, and why).
    pub notes: Vec<String>,
    pub added: usize,
    pub removed: usize,
    pub kept: usize,
}

impl SectionDiff {
    pub fn new(heading: &str) -> SectionDiff {
        SectionDiff { heading: heading.to_string(), ..SectionDiff::default() }
    }

    /// Adds a note (printed as `# note`).
    pub fn note(mut self, note: impl Into<String>) -> SectionDiff {
        self.notes.push(note.into());
        self
    }

    pub fn is_unchanged(&self) -> bool {
        self.added == 0 && self.removed == 0
    }

    /// Merges the multiset difference of `desired` and `live` into this
    /// section: `-` for live lines the plan lacks, `+` for planned lines the
    /// kernel lacks, in sorted order (a line's removal before its addition).
    pub fn compare(mut self, desired: &[String], live: &[String]) -> SectionDiff {
        let (added, removed, kept) = multiset_diff(desired, live);
        self.kept += kept;
        self.added += added.len();
        self.removed += removed.len();
        let mut changed: Vec<(&str, char)> =
            removed.iter().map(|l| (l.as_str(), '-')).chain(added.iter().map(|l| (l.as_str(), '+'))).collect();
        changed.sort();
        self.lines.extend(changed.into_iter().map(|(l, sign)| format!("{sign}{l}")));
        self
    }
}

/// (added, removed, kept): the lines of `desired` not in `live`, those of
/// `live` not in `desired` (counting repeats), and how many match.
fn multiset_diff<'a>(desired: &'a [String], live: &'a [String]) -> (Vec<&'a String>, Vec<&'a String>, usize) {
    let mut have: BTreeMap<&str, usize> = BTreeMap::new();
    for l in live {
        *have.entry(l.as_str()).or_default() += 1;
    }
    let mut added = Vec::new();
    let mut kept = 0;
    for l in desired {
        match have.get_mut(l.as_str()) {
            Some(n) if *n > 0 => {
                *n -= 1;
                kept += 1;
            }
            _ => added.push(l),
        }
    }
    let mut left = have;
    let mut removed = Vec::new();
    for l in live {
        if let Some(n) = left.get_mut(l.as_str()) {
            if *n > 0 {
                *n -= 1;
                removed.push(l);
            }
        }
    }
    (added, removed, kept)
}

/// The rules of one iptables table: chains declared, and each chain's
/// rules (the text after `-A CHAIN `) in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableRules {
    pub chains: BTreeSet<String>,
    pub rules: BTreeMap<String, Vec<String>>,
}

/// Tables by name, from `iptables-save` output or `iptables-restore` input.
pub type Tables = BTreeMap<String, TableRules>;

/// Parses `iptables-save` output or `iptables-restore` input: `*table`,
/// `:CHAIN ...`, `-A CHAIN rule`, `-I CHAIN [N] rule` (taken as one of the
/// chain's rules, in front). Other lines (`COMMIT`, `-X`, comments) are skipped.
pub fn parse_tables(text: &str) -> Tables {
    let mut tables = Tables::new();
    let mut table = String::new();
    for line in text.lines().map(str::trim_end) {
        if let Some(name) = line.strip_prefix('*') {
            table = name.to_string();
            tables.entry(table.clone()).or_default();
            continue;
        }
        let Some(t) = tables.get_mut(&table) else { continue };
        if let Some(decl) = line.strip_prefix(':') {
            if let Some(name) = decl.split_whitespace().next() {
                t.chains.insert(name.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("-A ") {
            if let Some((chain, rule)) = rest.split_once(' ') {
                t.rules.entry(chain.to_string()).or_default().push(rule.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("-I ") {
            if let Some((chain, rule)) = rest.split_once(' ') {
                let rule = match rule.split_once(' ') {
                    Some((n, r)) if n.bytes().all(|b| b.is_ascii_digit()) => r,
                    _ => rule,
                };
                t.rules.entry(chain.to_string()).or_default().insert(0, rule.to_string());
            }
        }
    }
    tables
}

/// The chain a rule jumps or goes to (`-j X` / `-g X`), if any.
fn target(rule: &str) -> Option<&str> {
    let mut words = rule.split_whitespace();
    while let Some(w) = words.next() {
        if w == "-j" || w == "-g" {
            return words.next();
        }
    }
    None
}

/// Whether `chain` is one of a table's built-in chains.
pub fn is_builtin(chain: &str) -> bool {
    matches!(chain, "PREROUTING" | "INPUT" | "FORWARD" | "OUTPUT" | "POSTROUTING")
}

/// Compares the planned tables with the live ones. `owned(table, chain)`
/// says which non-built-in chains the first sync rewrites or removes
/// (besides those the plan declares); rules in built-in chains count only
/// when they jump to such a chain.
pub fn iptables_diff(
    heading: &str,
    desired: &Tables,
    live: &Tables,
    owned: impl Fn(&str, &str) -> bool,
) -> SectionDiff {
    let mut out = SectionDiff::new(heading);
    let empty = TableRules::default();
    let names: BTreeSet<&String> = desired.keys().chain(live.keys()).collect();
    for table in ["raw", "mangle", "nat", "filter"].iter().map(|t| t.to_string()).filter(|t| names.contains(t)) {
        let want = desired.get(&table).unwrap_or(&empty);
        let have = live.get(&table).unwrap_or(&empty);
        let ours = |chain: &str| !is_builtin(chain) && (want.chains.contains(chain) || owned(&table, chain));
        let mut lines = Vec::new();
        let mut sub = SectionDiff::default();
        // Chains: declared by the plan, or ours and there.
        let chains: BTreeSet<&String> = want.chains.iter().chain(have.chains.iter().filter(|c| ours(c))).collect();
        for c in &chains {
            if is_builtin(c) {
                continue;
            }
            match (want.chains.contains(*c), have.chains.contains(*c)) {
                (true, false) => {
                    lines.push(format!("+:{c}"));
                    sub.added += 1;
                }
                (false, true) => {
                    lines.push(format!("-:{c}"));
                    sub.removed += 1;
                }
                _ => sub.kept += 1,
            }
        }
        // Rules: every chain with rules on either side that counts.
        let rule_chains: BTreeSet<&String> = want.rules.keys().chain(have.rules.keys()).collect();
        for c in rule_chains {
            let pick = |rules: Option<&Vec<String>>| -> Vec<String> {
                let rules = rules.map(Vec::as_slice).unwrap_or(&[]);
                if is_builtin(c) {
                    rules.iter().filter(|r| target(r).is_some_and(&ours)).cloned().collect()
                } else if ours(c) {
                    rules.to_vec()
                } else {
                    Vec::new()
                }
            };
            let (w, h) = (pick(want.rules.get(c)), pick(have.rules.get(c)));
            if w.is_empty() && h.is_empty() {
                continue;
            }
            let (added, removed, kept) = multiset_diff(&w, &h);
            sub.kept += kept;
            sub.added += added.len();
            sub.removed += removed.len();
            lines.extend(removed.iter().map(|r| format!("--A {c} {r}")));
            lines.extend(added.iter().map(|r| format!("+-A {c} {r}")));
            if added.is_empty() && removed.is_empty() && w != h && !is_builtin(c) {
                out.notes.push(format!("{table} {c}: the same rules in a new order"));
            }
        }
        if !lines.is_empty() {
            out.lines.push(format!("*{table}"));
            out.lines.extend(lines);
        }
        out.added += sub.added;
        out.removed += sub.removed;
        out.kept += sub.kept;
    }
    out
}

/// An `nft list table` listing as comparable lines, one per object and
/// item: `table ip kube-proxy`, `chain ip kube-proxy NAME [{ hook line }]`,
/// `rule ip kube-proxy CHAIN TEXT`, `set|map ip kube-proxy NAME { type ...;
/// ... }` and `element ip kube-proxy SET { ELEMENT }` (elements split out
/// of `elements = { ... }`, which `nft` wraps over lines). The elements of
/// a set declared `dynamic` or `timeout` are left out (the kernel adds them,
/// such as the affinity sets' client addresses, `... expires 9m50s`); its
/// declaration stays. Both sides of the nftables preview are printed by
/// `nft`, so equal objects give equal lines; a rule moved within its chain
/// is not told apart.
pub fn nft_listing_lines(listing: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut table = String::new();
    // The block being read: its kind, name, header attributes, items.
    let mut block: Option<(String, String, Vec<String>, Vec<String>)> = None;
    let mut elements: Option<String> = None;
    for line in listing.lines() {
        let depth = line.len() - line.trim_start_matches('\t').len();
        let text = line.trim();
        let in_set = block.as_ref().is_some_and(|b| b.0 != "chain");
        if elements.is_none() && depth == 2 && in_set && text.starts_with("elements = {") {
            elements = Some(String::new());
        }
        // `elements = { ... }`, on one line or wrapped over several.
        if let Some(acc) = elements.as_mut() {
            acc.push(' ');
            acc.push_str(text);
            if text.ends_with('}') {
                let all = elements.take().unwrap_or_default();
                if let Some((_, name, _, items)) = block.as_mut() {
                    let inner = all.trim().trim_start_matches("elements = {").trim_end_matches('}');
                    items.extend(
                        split_top_level(inner).into_iter().map(|e| format!("element {table} {name} {{ {e} }}")),
                    );
                }
            }
            continue;
        }
        match depth {
            0 if text.starts_with("table ") => {
                table = text.trim_start_matches("table ").trim_end_matches(" {").to_string();
                out.push(format!("table {table}"));
            }
            1 if text.ends_with(" {") => {
                let (kind, name) = text.trim_end_matches(" {").split_once(' ').unwrap_or((text, ""));
                block = Some((kind.to_string(), name.to_string(), Vec::new(), Vec::new()));
            }
            1 if text == "}" => {
                if let Some((kind, name, header, items)) = block.take() {
                    let attrs = if header.is_empty() { String::new() } else { format!(" {{ {} }}", header.join(" ")) };
                    out.push(format!("{kind} {table} {name}{attrs}"));
                    if !kernel_filled(&header) {
                        out.extend(items);
                    }
                }
            }
            2 => match block.as_mut() {
                Some((kind, _, header, _))
                    if kind != "chain" || text.starts_with("type ") || text.starts_with("comment ") =>
                {
                    header.push(format!("{};", text.trim_end_matches(';')));
                }
                Some((_, name, _, items)) => items.push(format!("rule {table} {name} {text}")),
                None => {}
            },
            _ => {}
        }
    }
    out
}

/// Whether a set's elements are the kernel's state rather than ours, by
/// its declared flags: `dynamic` (filled from the packet path, as the
/// affinity sets are by `update @affinity-…`) or `timeout` (each element
/// listed with its `expires` countdown).
fn kernel_filled(header: &[String]) -> bool {
    header
        .iter()
        .filter_map(|h| h.strip_prefix("flags "))
        .flat_map(|flags| flags.trim_end_matches(';').split(','))
        .any(|flag| matches!(flag.trim(), "dynamic" | "timeout"))
}

/// `a, b, "c, d"` → `a`, `b`, `"c, d"`: commas outside quotes and braces.
fn split_top_level(text: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted, mut depth) = (Vec::new(), String::new(), false, 0i32);
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(std::mem::take(&mut cur).trim().to_string());
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out.into_iter().map(|e| e.split_whitespace().collect::<Vec<_>>().join(" ")).collect()
}

/// Renders the sections and a `# summary` with one line per section.
pub fn render(sections: &[SectionDiff]) -> String {
    let mut out = String::new();
    for s in sections {
        let _ = writeln!(out, "{}", s.heading);
        for n in &s.notes {
            let _ = writeln!(out, "# {n}");
        }
        for l in &s.lines {
            let _ = writeln!(out, "{l}");
        }
    }
    out.push_str("# summary\n");
    for s in sections {
        let name = s.heading.trim_start_matches("# ");
        let _ = writeln!(out, "{name}: {} to add, {} to remove, {} kept", s.added, s.removed, s.kept);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &[&str]) -> Vec<String> {
        s.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn an_nft_listing_becomes_a_line_per_object_rule_and_element() {
        let listing = "table ip kube-proxy {\n\tcomment \"rules for kube-proxy\"\n\tset cluster-ips {\n\t\ttype ipv4_addr\n\t\tcomment \"Active ClusterIPs\"\n\t\telements = { 10.96.0.10, 10.96.0.11,\n\t\t\t     10.96.0.12 }\n\t}\n\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = { 10.96.0.10 . tcp . 80 : goto service-X-ns/a/tcp/p80 }\n\t}\n\tchain nat-prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t\tnumgen random mod 2 vmap { 0 : goto a, 1 : goto b }\n\t}\n}\n";
        let got = nft_listing_lines(listing);
        assert_eq!(
            got,
            [
                "table ip kube-proxy",
                "set ip kube-proxy cluster-ips { type ipv4_addr; comment \"Active ClusterIPs\"; }",
                "element ip kube-proxy cluster-ips { 10.96.0.10 }",
                "element ip kube-proxy cluster-ips { 10.96.0.11 }",
                "element ip kube-proxy cluster-ips { 10.96.0.12 }",
                "map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }",
                "element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 : goto service-X-ns/a/tcp/p80 }",
                "chain ip kube-proxy nat-prerouting { type nat hook prerouting priority dstnat; policy accept; }",
                "rule ip kube-proxy nat-prerouting jump services",
                "chain ip kube-proxy services",
                "rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
                "rule ip kube-proxy services numgen random mod 2 vmap { 0 : goto a, 1 : goto b }",
            ]
        );
        assert!(nft_listing_lines("").is_empty());
    }

    /// The kernel's affinity entries (`update @affinity-…` from the packet
    /// path, counting down) are not compared; the set's declaration is.
    #[test]
    fn elements_of_dynamic_and_timeout_sets_are_left_out() {
        let set = |flags: &str, elements: &str| {
            format!(
                "table ip kube-proxy {{\n\tset affinity-X {{\n\t\ttype ipv4_addr\n\t\tflags {flags}\n\t\t\
                 timeout 10m\n{elements}\t}}\n\n\tset cluster-ips {{\n\t\ttype ipv4_addr\n\t\t\
                 elements = {{ 10.96.0.10 }}\n\t}}\n}}\n"
            )
        };
        let planned = nft_listing_lines(&set("dynamic,timeout", ""));
        let live = nft_listing_lines(&set(
            "dynamic,timeout",
            "\t\telements = { 192.168.50.10 expires 9m50s112ms,\n\t\t\t     192.168.50.11 expires 2m1s }\n",
        ));
        assert_eq!(
            live,
            [
                "table ip kube-proxy",
                "set ip kube-proxy affinity-X { type ipv4_addr; flags dynamic,timeout; timeout 10m; }",
                "set ip kube-proxy cluster-ips { type ipv4_addr; }",
                "element ip kube-proxy cluster-ips { 10.96.0.10 }",
            ]
        );
        assert_eq!(planned, live);
        let timeout_only = nft_listing_lines(&set("timeout", "\t\telements = { 192.168.50.10 expires 1s }\n"));
        assert!(!timeout_only.iter().any(|l| l.contains("192.168.50.10")), "{timeout_only:?}");
        // Another declaration is a change.
        assert_ne!(nft_listing_lines(&set("timeout", "")), planned);
    }

    #[test]
    fn set_like_sections_list_removals_and_additions_sorted_and_count_the_rest() {
        let desired = lines(&["-A -t 10.96.0.1:443 -s rr", "-a -t 10.96.0.1:443 -r 10.0.0.2:6443 -m -w 1"]);
        let live = lines(&["-A -t 10.96.0.1:443 -s rr", "-a -t 10.96.0.1:443 -r 10.0.0.1:6443 -m -w 1"]);
        let d = SectionDiff::new("# ipvs").compare(&desired, &live);
        assert_eq!(
            d.lines,
            ["--a -t 10.96.0.1:443 -r 10.0.0.1:6443 -m -w 1", "+-a -t 10.96.0.1:443 -r 10.0.0.2:6443 -m -w 1"]
        );
        assert_eq!((d.added, d.removed, d.kept), (1, 1, 1));
    }

    #[test]
    fn repeated_lines_count_each_time() {
        let d = SectionDiff::new("# x").compare(&lines(&["a", "a"]), &lines(&["a", "a", "a"]));
        assert_eq!((d.added, d.removed, d.kept), (0, 1, 2));
    }

    #[test]
    fn parses_save_output_and_restore_input_alike() {
        let t = parse_tables(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\n\
             -I PREROUTING 1 -j KUBE-SERVICES\n-A PREROUTING -j DOCKER\nCOMMIT\n",
        );
        let nat = &t["nat"];
        assert!(nat.chains.contains("KUBE-SERVICES"));
        assert_eq!(nat.rules["PREROUTING"], ["-j KUBE-SERVICES", "-j DOCKER"]);
        assert_eq!(nat.rules["KUBE-SERVICES"], ["-j RETURN"]);
    }

    #[test]
    fn iptables_diff_counts_only_our_chains_and_the_jumps_to_them() {
        let desired = parse_tables(
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-NEW - [0:0]\n-A KUBE-SERVICES -d 10.96.0.2/32 -j KUBE-SVC-NEW\n\
             -A KUBE-SVC-NEW -j DNAT --to-destination 10.0.0.1:80\n-I PREROUTING 1 -j KUBE-SERVICES\nCOMMIT\n",
        );
        let live = parse_tables(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-OLD - [0:0]\n:DOCKER - [0:0]\n\
             -A PREROUTING -j KUBE-SERVICES\n-A PREROUTING -j DOCKER\n-A DOCKER -j RETURN\n\
             -A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-OLD\n-A KUBE-SVC-OLD -j DNAT --to-destination 10.0.0.1:80\n\
             COMMIT\n",
        );
        let owned = |_: &str, c: &str| c.starts_with("KUBE-");
        let d = iptables_diff("# iptables", &desired, &live, owned);
        assert_eq!(
            d.lines,
            [
                "*nat",
                "+:KUBE-SVC-NEW",
                "-:KUBE-SVC-OLD",
                "--A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-OLD",
                "+-A KUBE-SERVICES -d 10.96.0.2/32 -j KUBE-SVC-NEW",
                "+-A KUBE-SVC-NEW -j DNAT --to-destination 10.0.0.1:80",
                "--A KUBE-SVC-OLD -j DNAT --to-destination 10.0.0.1:80",
            ]
        );
        // KUBE-SERVICES declared on both sides, the PREROUTING jump kept; DOCKER not counted.
        assert_eq!((d.added, d.removed, d.kept), (3, 3, 2));
    }

    #[test]
    fn a_chain_in_a_new_order_is_named() {
        let desired = parse_tables("*filter\n:KUBE-X - [0:0]\n-A KUBE-X -j A\n-A KUBE-X -j B\nCOMMIT\n");
        let live = parse_tables("*filter\n:KUBE-X - [0:0]\n-A KUBE-X -j B\n-A KUBE-X -j A\nCOMMIT\n");
        let d = iptables_diff("# iptables", &desired, &live, |_, _| false);
        assert!(d.is_unchanged());
        assert_eq!(d.notes, ["filter KUBE-X: the same rules in a new order"]);
    }

    #[test]
    fn the_summary_names_every_section() {
        let a = SectionDiff::new("# ipvs").compare(&lines(&["x"]), &[]);
        let b = SectionDiff::new("# ipset ipv6").note("no sets").compare(&[], &[]);
        assert_eq!(
            render(&[a, b]),
            "# ipvs\n+x\n# ipset ipv6\n# no sets\n# summary\nipvs: 1 to add, 0 to remove, 0 kept\n\
             ipset ipv6: 0 to add, 0 to remove, 0 kept\n"
        );
    }
}
