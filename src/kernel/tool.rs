//! Running the command-line tools the kernel handles drive (`ipset`,
//! `iptables-restore`, ...): async, killed if the caller's future is dropped
//! or the tool hangs, stdin fed while stdout and stderr are read.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tracing::trace;

use super::KernelError;

/// How long a tool may run before it is killed and the op fails.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// What a tool printed, and how it exited.
#[derive(Debug, Clone)]
pub struct ToolOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl ToolOutput {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The exit code (None if killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Stderr without blank lines and the nft tools' legacy-tables warnings,
    /// on one line; what an error message should carry.
    pub fn message(&self) -> String {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("# Warning:") && !l.starts_with("Ignoring deprecated"))
            .collect();
        if lines.is_empty() {
            format!("exited with {}", self.status)
        } else {
            lines.join("; ")
        }
    }
}

/// Runs `binary args...`, writing `stdin` to it. `op` names what was asked,
/// for errors. A tool that cannot be started, or runs past [`TOOL_TIMEOUT`],
/// is an error; a non-zero exit is not (the caller reads the output).
pub async fn run(op: &str, binary: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<ToolOutput, KernelError> {
    match stdin {
        Some(data) => run_with_input(op, binary, args, Some(&[data])).await,
        None => run_with_input(op, binary, args, None).await,
    }
}

/// [`run`] with the input in parts, written one after the other (a restore
/// input with lines inserted, without copying it into one buffer).
pub async fn run_with_input(
    op: &str,
    binary: &str,
    args: &[&str],
    stdin: Option<&[&[u8]]>,
) -> Result<ToolOutput, KernelError> {
    let bytes: usize = stdin.map_or(0, |parts| parts.iter().map(|p| p.len()).sum());
    trace!(binary, ?args, stdin_bytes = bytes, "running tool");
    let mut child = Command::new(binary)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| io_error(op, true, &format!("cannot run {binary}"), &e))?;
    let input = child.stdin.take();
    let write = async {
        if let (Some(mut pipe), Some(parts)) = (input, stdin) {
            for data in parts {
                pipe.write_all(data).await?;
            }
            pipe.shutdown().await?;
        }
        Ok::<(), std::io::Error>(())
    };
    let both = async { tokio::join!(write, child.wait_with_output()) };
    let (written, output) = tokio::time::timeout(TOOL_TIMEOUT, both)
        .await
        .map_err(|_| KernelError::unknown(op, format!("{binary} did not finish within {TOOL_TIMEOUT:?}; killed")))?;
    let output = output.map_err(|e| io_error(op, false, &format!("waiting for {binary}"), &e))?;
    let out = ToolOutput { status: output.status, stdout: text(output.stdout), stderr: text(output.stderr) };
    // A tool that stops reading early (it failed) breaks the pipe: its own
    // error is the one to report.
    if let Err(e) = written {
        if out.success() {
            return Err(io_error(op, false, &format!("writing to {binary}"), &e));
        }
    }
    Ok(out)
}

/// A tool's output as text, without a copy when it is UTF-8 (an
/// `iptables-save -t nat` at 10,000 services is ≈ 40 MB).
fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// `known`: the tool never ran (nothing applied), rather than ran with an
/// outcome we could not read.
fn io_error(op: &str, known: bool, what: &str, e: &std::io::Error) -> KernelError {
    KernelError::library(op, known, e.raw_os_error(), std::io::Error::new(e.kind(), format!("{what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_text_is_the_tools_bytes_moved_or_made_valid() {
        let bytes = b"-A KUBE-SERVICES\n".to_vec();
        let at = bytes.as_ptr();
        let t = text(bytes);
        assert_eq!((t.as_str(), t.as_ptr()), ("-A KUBE-SERVICES\n", at), "not copied");
        assert_eq!(text(vec![b'a', 0xff, b'b']), "a\u{fffd}b");
    }

    #[tokio::test]
    async fn feeds_stdin_and_reads_both_outputs() {
        let out = run("t", "sh", &["-c", "cat; echo oops >&2; exit 3"], Some(b"hello\n")).await.expect("sh runs");
        assert_eq!(out.stdout, "hello\n");
        assert_eq!(out.code(), Some(3));
        assert_eq!(out.message(), "oops");
    }

    #[tokio::test]
    async fn a_tool_that_stops_reading_reports_its_own_failure() {
        let big = vec![b'x'; 4 << 20];
        let out = run("t", "sh", &["-c", "echo bad input >&2; exit 1"], Some(&big)).await.expect("no pipe error");
        assert_eq!(out.message(), "bad input");
    }

    #[tokio::test]
    async fn a_missing_tool_is_an_error_naming_it() {
        let err = run("add x", "/nonexistent/ipset", &[], None).await.expect_err("cannot run");
        assert_eq!(err.op(), "add x");
        assert_eq!(err.errno_value(), Some(2));
        assert!(err.cause().to_string().contains("/nonexistent/ipset"), "{err}");
    }
}
