//! The planned state loaded into a private network namespace and read
//! back, so `--diff` compares it with the live state in the tools' own
//! syntax. Each job runs on a thread of its own, which it moves into a new
//! network namespace (gone when the thread ends).

use std::collections::BTreeSet;

use crate::kernel::iptables::IptablesBinaries;
use crate::kernel::nfacct::{NetlinkNfacct, NfacctError};
use crate::plan::nftables::names::TABLE as NFT_TABLE;

/// Why the planned state could not be loaded and read back.
#[derive(Debug, thiserror::Error)]
pub(super) enum ScratchError {
    #[error("cannot make a private network namespace: {0}")]
    Unshare(#[source] nix::Error),
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("scratch namespace: {0}")]
    Join(#[source] tokio::task::JoinError),
    #[error("scratch namespace thread panicked")]
    Panicked,
    #[error("cannot run {bin}: {source}")]
    Spawn {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{bin}: writing its input: {source}")]
    Input {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{bin}: {source}")]
    Wait {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    /// The command ran and failed: its standard error.
    #[error("{command}: {stderr}")]
    Failed { command: String, stderr: String },
    #[error("tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("nfacct: {0}")]
    NfacctSocket(#[source] NfacctError),
    #[error("creating the nfacct objects: {0}")]
    Nfacct(#[source] NfacctError),
}

/// Moves the calling thread into a new network namespace.
fn unshare_net() -> Result<(), ScratchError> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(ScratchError::Unshare)
}

/// `nft -f` of `text` in a new network namespace, then `nft list table`.
pub(super) fn nft_listed(text: &str, family: &str) -> Result<String, ScratchError> {
    unshare_net()?;
    run_with_input("nft", &["-f", "-"], text)?;
    run_with_input("nft", &["list", "table", family, NFT_TABLE], "")
}

/// Runs `job` on a thread of its own (which it may move into a private
/// network namespace: gone when the thread ends).
pub(super) async fn in_thread(
    job: impl FnOnce() -> Result<String, ScratchError> + Send + 'static,
) -> Result<String, ScratchError> {
    let job =
        std::thread::Builder::new().name("dry-run-scratch-netns".into()).spawn(job).map_err(ScratchError::Thread)?;
    tokio::task::spawn_blocking(move || job.join())
        .await
        .map_err(ScratchError::Join)?
        .unwrap_or(Err(ScratchError::Panicked))
}

/// `bin ARGS` with `input` on its stdin; its stdout, or why it failed.
fn run_with_input(bin: &str, args: &[&str], input: &str) -> Result<String, ScratchError> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ScratchError::Spawn { bin: bin.to_string(), source })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).map_err(|source| ScratchError::Input { bin: bin.to_string(), source })?;
    }
    let out = child.wait_with_output().map_err(|source| ScratchError::Wait { bin: bin.to_string(), source })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let command = format!("{bin} {}", args.join(" "));
        Err(ScratchError::Failed { command, stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() })
    }
}

/// Runs on a thread of its own: moves the thread into a new network
/// namespace (gone when the thread ends), creates the sets and counters,
/// restores, saves.
pub(super) fn saved_after_restore(
    bins: &IptablesBinaries,
    restore: &str,
    creates: &[String],
    nfacct: &BTreeSet<&'static str>,
) -> Result<String, ScratchError> {
    unshare_net()?;
    let run = run_with_input;
    if !creates.is_empty() {
        run("ipset", &["restore"], &(creates.join("\n") + "\n"))?;
    }
    if !nfacct.is_empty() {
        let names: Vec<&str> = nfacct.iter().copied().collect();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ScratchError::Runtime)?;
        rt.block_on(async {
            let client = NetlinkNfacct::new().map_err(ScratchError::NfacctSocket)?;
            match client.ensure(&names).await.into_iter().find_map(Result::err) {
                Some(e) => Err(ScratchError::Nfacct(e)),
                None => Ok(()),
            }
        })?;
    }
    run(&bins.restore, &["-w", "5", "--noflush"], restore)?;
    // The tables the restore made: this namespace has no others.
    run(&bins.save, &[], "")
}
