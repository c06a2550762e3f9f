//! The documentation cannot rot: the README's quick start and the demo page
//! (docs/demo.md) run as written, and every relative link of the docs leads
//! somewhere.
//!
//! A ```` ```sh ```` block under a `<!-- test: run -->` line is run command
//! by command, in order, as root, from the repository's root, with the
//! demo's variables pointing at this test's binaries and at namespaces of
//! its own (`KPR_DEMO_PREFIX=kprdocs<pid><case>`; `kpr-demo` in a command,
//! a namespace name, becomes that prefix), so the host's network and a
//! user's demo are not touched. Each command must exit 0, and the lines
//! shown under it (`# → ...`) must be its output: a backend's answer
//! matches on its stable part (the pod's name up to its random suffix, a
//! real backend's address, port and node, the client address but not its
//! port), any other line exactly. A command whose comment says "in the
//! foreground" is started in the background; it must print before the next
//! command runs, which is retried (the daemon takes a moment to sync) for
//! up to a minute, and it must have exited once the block's last command
//! (`down`) is done, which must leave no namespace of the prefix.
//!
//! `.ci/install-deps.sh --demo` runs for real (it installs nothing when the
//! packages are there, as on CI, and apt installs them otherwise).
//! `cargo build` is not run: the binaries are the ones `cargo test` built
//! for this test (`KPR_DEMO_BIN`, `KPR_DEMO_BACKENDS_BIN`, which also make
//! `quickstart.sh` build nothing), and a build inside the test would wait
//! for the build directory's lock held by a running `cargo test` or rebuild
//! the crate without the test kit.
//!
//! Needs root, iproute2, socat, iptables, curl (.ci/install-deps.sh).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// How long the command after a foreground one is retried.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// How long a foreground command may take to print its first line or to
/// exit after `down`.
const EXIT_DEADLINE: Duration = Duration::from_secs(10);
/// The marker above a block to run.
const MARKER: &str = "<!-- test: run -->";
/// demo-node's addresses: the source a masqueraded request shows.
const NODE_ADDRS: [&str; 2] = ["192.168.50.2", "10.244.0.1"];

/// One command of a marked block.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DocCommand {
    /// The command line as written (continuation lines joined).
    line: String,
    /// The output shown under it, one `# →` line each.
    shown: Vec<String>,
    /// Its comment says it stays in the foreground.
    foreground: bool,
}

/// The marked blocks of a markdown text, each a list of commands.
fn marked_blocks(md: &str) -> Vec<Vec<DocCommand>> {
    let mut blocks = Vec::new();
    let mut lines = md.lines();
    while let Some(line) = lines.next() {
        if line.trim() != MARKER {
            continue;
        }
        let fence = lines.by_ref().find(|l| !l.trim().is_empty()).unwrap_or_default();
        assert_eq!(fence.trim(), "```sh", "{MARKER} must stand above a ```sh block");
        let mut block: Vec<DocCommand> = Vec::new();
        let mut pending = String::new();
        for l in lines.by_ref() {
            let t = l.trim();
            if t == "```" {
                break;
            }
            if let Some(out) = t.strip_prefix("# →") {
                let last = block.last_mut().expect("a # → line under no command");
                last.shown.push(out.trim().to_string());
            } else if t.starts_with('#') || t.is_empty() {
                continue;
            } else if let Some(part) = t.strip_suffix('\\') {
                pending.push_str(part);
            } else {
                pending.push_str(t);
                let line = std::mem::take(&mut pending);
                let foreground = comment(&line).contains("in the foreground");
                block.push(DocCommand { line, shown: Vec::new(), foreground });
            }
        }
        blocks.push(block);
    }
    blocks
}

/// A command line's comment: what follows ` #`.
fn comment(line: &str) -> &str {
    line.split_once(" #").map(|(_, c)| c).unwrap_or("")
}

/// `kpr-demo` and `kpr-demo-*` words (the lab's namespaces) with `prefix`
/// instead; `kpr-demo-backends` (a binary) stays.
fn with_prefix(line: &str, prefix: &str) -> String {
    (line.split(' '))
        .map(|w| match w.strip_prefix("kpr-demo") {
            Some(rest) if (rest.is_empty() || rest.starts_with('-')) && rest != "-backends" => {
                format!("{prefix}{rest}")
            }
            _ => w.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One row of `netns.sh list`: the pod and node of an address.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Backend {
    pod: String,
    node: String,
}

/// `netns.sh list`'s lines: address → backend.
fn parse_list(text: &str) -> BTreeMap<String, Backend> {
    (text.lines())
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() >= 3).then(|| (w[0].to_string(), Backend { pod: w[2].to_string(), node: w[1].to_string() }))
        })
        .collect()
}

/// A backend's answer, `POD IP:PORT/PROTO on NODE, client CIP:CPORT`.
#[derive(Debug, PartialEq, Eq)]
struct Answer<'a> {
    pod: &'a str,
    ip: &'a str,
    port_proto: &'a str,
    node: &'a str,
    client_ip: &'a str,
}

fn parse_answer(line: &str) -> Option<Answer<'_>> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let [pod, addr, "on", node, "client", client] = w[..] else { return None };
    let (ip, port_proto) = addr.split_once(':')?;
    let (client_ip, _port) = client.rsplit_once(':')?;
    Some(Answer { pod, ip, port_proto, node: node.strip_suffix(',')?, client_ip })
}

/// The pod's name without its random suffix: `web-5d8f7c9b6-`.
fn pod_pattern(pod: &str) -> &str {
    pod.rfind('-').map_or(pod, |i| &pod[..=i])
}

/// Whether `actual` is the output `shown` stands for: a backend's answer
/// from a backend of the same pods, with the same port, and the same
/// client address (any of the node's when the shown one is the node's);
/// anything else, the same text.
fn output_matches(shown: &str, actual: &str, backends: &BTreeMap<String, Backend>) -> Result<(), String> {
    let Some(want) = parse_answer(shown) else {
        return if shown == actual.trim() { Ok(()) } else { Err(format!("shown {shown:?}, got {actual:?}")) };
    };
    let real = |a: &Answer| backends.get(a.ip).is_some_and(|b| b.pod == a.pod && b.node == a.node);
    if !real(&want) {
        return Err(format!("the shown answer {shown:?} is from no backend of `netns.sh list`"));
    }
    let got = parse_answer(actual).ok_or_else(|| format!("not a backend's answer: {actual:?}"))?;
    let client_ok = got.client_ip == want.client_ip
        || (NODE_ADDRS.contains(&got.client_ip) && NODE_ADDRS.contains(&want.client_ip));
    if real(&got) && pod_pattern(got.pod) == pod_pattern(want.pod) && got.port_proto == want.port_proto && client_ok {
        Ok(())
    } else {
        Err(format!("shown {shown:?}, got {actual:?}"))
    }
}

/// The commands of one document, run as its marked blocks say, with this
/// test's binaries and namespace prefix; on drop (a failure included) its
/// background commands are killed and `down` runs.
struct DocRun {
    prefix: String,
    forward_port: u16,
    background: Vec<(String, Child, PathBuf)>,
    /// The next command follows a foreground one: retried until it works.
    retry: bool,
}

impl DocRun {
    fn new(case: &str) -> DocRun {
        let prefix = format!("kprdocs{}{case}", std::process::id());
        assert!(namespaces_of(&prefix).is_empty(), "namespaces of {prefix} exist before the test");
        let forward_port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port on 127.0.0.1")
            .port();
        DocRun { prefix, forward_port, background: Vec::new(), retry: false }
    }

    fn shell(&self, line: &str) -> Command {
        let mut c = Command::new("bash");
        c.args(["-o", "pipefail", "-c", line])
            .current_dir(ROOT)
            .env("KPR_DEMO_PREFIX", &self.prefix)
            .env("KPR_DEMO_BIN", env!("CARGO_BIN_EXE_kube-proxy-rs"))
            .env("KPR_DEMO_BACKENDS_BIN", env!("CARGO_BIN_EXE_kpr-demo-backends"))
            .env("KPR_DEMO_FORWARD_PORT", self.forward_port.to_string())
            .stdin(Stdio::null());
        c
    }

    /// Runs a command line to its end: exit 0 and its stdout, or what went wrong.
    fn run(&self, line: &str) -> Result<String, String> {
        let o = self.shell(&format!("timeout 600 {line}")).output().map_err(|e| format!("bash: {e}"))?;
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        if o.status.success() {
            Ok(out)
        } else {
            Err(format!("{line}: {}\nstdout: {out}\nstderr: {}", o.status, String::from_utf8_lossy(&o.stderr)))
        }
    }

    fn backends(&self) -> BTreeMap<String, Backend> {
        parse_list(&self.run("deploy/demo/netns.sh list").unwrap_or_else(|e| panic!("{e}")))
    }

    /// Starts a foreground command in the background, once it printed.
    fn start(&mut self, line: &str) {
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "docs-{}-{}.log",
            self.prefix,
            self.background.len()
        ));
        let file = std::fs::File::create(&log).expect("log file");
        let child = (self.shell(line).stdout(file.try_clone().expect("dup log")).stderr(file).spawn())
            .unwrap_or_else(|e| panic!("{line}: {e}"));
        self.background.push((line.to_string(), child, log.clone()));
        let deadline = Instant::now() + EXIT_DEADLINE;
        while std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) == 0 {
            let (_, child, _) = self.background.last_mut().expect("just pushed");
            if let Some(st) = child.try_wait().expect("try_wait") {
                panic!("{line} exited ({st}) at once: {}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            assert!(Instant::now() < deadline, "{line} printed nothing within {EXIT_DEADLINE:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A command that must succeed and show what the document shows;
    /// retried until `deadline` when given.
    fn check(&mut self, cmd: &DocCommand, line: &str, deadline: Option<Instant>) {
        let backends =
            if cmd.shown.iter().any(|s| parse_answer(s).is_some()) { self.backends() } else { BTreeMap::new() };
        loop {
            let result = self.run(line).and_then(|out| {
                let got: Vec<&str> = out.lines().collect();
                if got.len() != cmd.shown.len() && !cmd.shown.is_empty() {
                    return Err(format!("{line}: shown {:?}, got {got:?}", cmd.shown));
                }
                (cmd.shown.iter().zip(&got)).try_for_each(|(s, g)| output_matches(s, g, &backends))
            });
            match result {
                Ok(()) => return,
                Err(e) if deadline.is_some_and(|d| Instant::now() < d) => {
                    self.background_alive(&e);
                    std::thread::sleep(Duration::from_millis(300));
                }
                Err(e) => panic!("{}\n{e}\n{}", cmd.line, self.background_logs()),
            }
        }
    }

    /// Panics when a background command exited.
    fn background_alive(&mut self, last: &str) {
        for (line, child, log) in &mut self.background {
            if let Some(st) = child.try_wait().expect("try_wait") {
                panic!("{line} exited ({st}); last try: {last}\n{}", std::fs::read_to_string(log).unwrap_or_default());
            }
        }
    }

    fn background_logs(&self) -> String {
        (self.background.iter())
            .map(|(line, _, log)| format!("--- {line}:\n{}", std::fs::read_to_string(log).unwrap_or_default()))
            .collect()
    }

    /// Runs one marked block.
    fn block(&mut self, block: &[DocCommand]) {
        for cmd in block {
            let line = with_prefix(&cmd.line, &self.prefix);
            if cmd.line.split(" #").next().map(str::trim) == Some("cargo build") {
                // Stands for the build cargo test made (the module's doc says why).
                assert_built();
                continue;
            }
            if cmd.foreground {
                self.start(&line);
                self.retry = true;
                continue;
            }
            let deadline = self.retry.then(|| Instant::now() + READY_DEADLINE);
            self.check(cmd, &line, deadline);
            self.retry = false;
        }
    }

    /// After the last block: every background command exited, no namespace left.
    fn all_stopped(&mut self) {
        let deadline = Instant::now() + EXIT_DEADLINE;
        for (line, child, _) in &mut self.background {
            while child.try_wait().expect("try_wait").is_none() {
                assert!(Instant::now() < deadline, "{line} still runs after the document's last command");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        assert_eq!(namespaces_of(&self.prefix), Vec::<String>::new(), "namespaces left after the document ran");
    }
}

impl Drop for DocRun {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.background {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self.run("deploy/demo/netns.sh down");
    }
}

/// Namespaces whose name is the prefix or starts with `prefix-`.
fn namespaces_of(prefix: &str) -> Vec<String> {
    let o = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    assert!(o.status.success(), "ip netns list: {}", String::from_utf8_lossy(&o.stderr));
    (String::from_utf8_lossy(&o.stdout).lines())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n == prefix || n.starts_with(&format!("{prefix}-")))
        .map(str::to_string)
        .collect()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Runs every marked block of a document, in order, as one session.
fn run_document(rel: &str, case: &str, want_blocks: usize) {
    let blocks = marked_blocks(&read(rel));
    assert_eq!(blocks.len(), want_blocks, "{rel}: marked blocks");
    let mut run = DocRun::new(case);
    for block in &blocks {
        run.block(block);
    }
    run.all_stopped();
}

#[test]
fn the_readme_quick_start_runs_as_written() {
    run_document("README.md", "r", 2);
}

#[test]
fn the_demo_page_runs_as_written() {
    run_document("docs/demo.md", "d", 2);
}

// --- links -------------------------------------------------------------------

/// The lines of a markdown text outside fenced code blocks.
fn prose(md: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    md.lines().filter(move |l| {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped
/// (but `-` and `_`), spaces as `-`.
fn anchor(heading: &str) -> String {
    (heading.trim().to_lowercase().chars())
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a markdown text (a repeated heading gets `-1`, `-2`, ...).
fn anchors(md: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    (prose(md))
        .filter_map(|l| l.strip_prefix('#').map(|h| h.trim_start_matches('#')))
        .map(|h| {
            let a = anchor(h);
            let n = seen.entry(a.clone()).or_insert(0);
            *n += 1;
            if *n == 1 {
                a
            } else {
                format!("{a}-{}", *n - 1)
            }
        })
        .collect()
}

/// The targets of a markdown text's `[text](target)` links, outside code.
fn link_targets(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(md) {
        // Inline code may show link syntax; it is not a link.
        let line: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// What is wrong with the relative links of one file.
fn broken_links(rel: &str) -> Vec<String> {
    let md = read(rel);
    let dir = Path::new(ROOT).join(rel).parent().map(Path::to_path_buf).unwrap_or_default();
    let mut broken = Vec::new();
    for target in link_targets(&md) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, frag) = target.split_once('#').map_or((target.as_str(), None), |(p, f)| (p, Some(f)));
        let file = if path.is_empty() { Path::new(ROOT).join(rel) } else { dir.join(path) };
        if !file.exists() {
            broken.push(format!("{rel}: ({target}): no {}", file.display()));
            continue;
        }
        if let Some(frag) = frag {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            if !anchors(&text).iter().any(|a| a == frag) {
                broken.push(format!("{rel}: ({target}): no heading with anchor #{frag}"));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut files = vec!["README.md".to_string(), "deploy/README.md".into(), "tests/vm/README.md".into()];
    for entry in std::fs::read_dir(Path::new(ROOT).join("docs")).expect("docs/").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            files.push(format!("docs/{name}"));
        }
    }
    assert!(files.len() > 8, "docs/ has its pages: {files:?}");
    let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

// --- the pure parts ----------------------------------------------------------

#[test]
fn marked_blocks_are_read_with_their_shown_output_and_foreground_commands() {
    let md = "text\n\n```sh\nnot marked\n```\n<!-- test: run -->\n```sh\na x   # one\n# → out 1\n# a comment\nb \\\n  --flag   # runs in the foreground\nc\n```\n";
    let blocks = marked_blocks(md);
    let cmd = |line: &str, shown: &[&str], foreground| DocCommand {
        line: line.into(),
        shown: shown.iter().map(|s| s.to_string()).collect(),
        foreground,
    };
    assert_eq!(
        blocks,
        vec![vec![
            cmd("a x   # one", &["out 1"], false),
            cmd("b --flag   # runs in the foreground", &[], true),
            cmd("c", &[], false)
        ]]
    );
}

#[test]
fn namespace_words_get_the_prefix_and_the_binary_keeps_its_name() {
    assert_eq!(
        with_prefix("ip netns exec kpr-demo-client curl x # kpr-demo kpr-demo-backends kpr-demos", "p1"),
        "ip netns exec p1-client curl x # p1 kpr-demo-backends kpr-demos"
    );
}

#[test]
fn an_answer_matches_another_backend_of_the_same_pods_only() {
    let list = parse_list(
        "10.244.0.11 demo-node web-5d8f7c9b6-a1b2c tcp:8080\n10.244.1.21 other-node web-5d8f7c9b6-g5h6i tcp:8080\n10.244.0.13 demo-node web-lb-7f6b9c8d4-h7j8k tcp:8080\n",
    );
    let shown = "web-5d8f7c9b6-g5h6i 10.244.1.21:8080/tcp on other-node, client 192.168.50.2:48621";
    let ok = |got: &str| output_matches(shown, got, &list);
    assert_eq!(ok("web-5d8f7c9b6-a1b2c 10.244.0.11:8080/tcp on demo-node, client 10.244.0.1:1234"), Ok(()));
    assert_eq!(ok("web-5d8f7c9b6-g5h6i 10.244.1.21:8080/tcp on other-node, client 192.168.50.2:1"), Ok(()));
    for wrong in [
        "web-lb-7f6b9c8d4-h7j8k 10.244.0.13:8080/tcp on demo-node, client 192.168.50.2:1",
        "web-5d8f7c9b6-a1b2c 10.244.1.21:8080/tcp on other-node, client 192.168.50.2:1",
        "web-5d8f7c9b6-g5h6i 10.244.1.21:8081/tcp on other-node, client 192.168.50.2:1",
        "web-5d8f7c9b6-g5h6i 10.244.1.21:8080/tcp on other-node, client 192.168.50.10:1",
        "refused",
    ] {
        assert!(ok(wrong).is_err(), "{wrong} matched");
    }
    let invented = "web-5d8f7c9b6-zzzzz 10.244.1.21:8080/tcp on other-node, client 192.168.50.2:1";
    assert!(output_matches(invented, shown, &list).is_err(), "a shown answer from no backend");
    assert_eq!(output_matches("iptables", "iptables\n", &list), Ok(()));
    assert!(output_matches("iptables", "nftables", &list).is_err());
}

#[test]
fn anchors_as_github_makes_them() {
    let md = "# A page\n## `--dry-run --diff`: the migration preview\n```sh\n# not a heading\n```\n## Failed ops: per-key retries\n## A page\n";
    assert_eq!(
        anchors(md),
        ["a-page", "--dry-run---diff-the-migration-preview", "failed-ops-per-key-retries", "a-page-1"]
    );
    assert_eq!(link_targets("see [x](a.md#b) and `[y](not)` [z](../c)"), ["a.md#b", "../c"]);
}

/// What `cargo build` leaves for the demo: the binaries this test hands
/// netns.sh; fails when one is missing instead of passing over the step.
fn assert_built() {
    for bin in [env!("CARGO_BIN_EXE_kube-proxy-rs"), env!("CARGO_BIN_EXE_kpr-demo-backends")] {
        let meta = std::fs::metadata(bin).unwrap_or_else(|e| panic!("`cargo build` stands for {bin}: {e}"));
        assert!(meta.is_file() && meta.len() > 0, "`cargo build` stands for {bin}: not a built binary");
    }
}
