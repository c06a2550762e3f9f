//! `oomScoreAdj` (`--oom-score-adj`, default -999): written to this
//! process's `oom_score_adj` when the proxy starts serving, as upstream's
//! `ProxyServer.Run` does (so not with `--init-only`, whose process exits
//! after the node's set-up). A refusal (lowering the score needs
//! CAP_SYS_RESOURCE) is a warning naming the value; the proxy runs on.

use std::path::Path;

/// This process's OOM score adjustment.
pub const OOM_SCORE_ADJ: &str = "/proc/self/oom_score_adj";

/// Writes `value` to `file` (an `oom_score_adj`).
pub fn write_oom_score_adj(file: &Path, value: i32) -> std::io::Result<()> {
    std::fs::write(file, value.to_string())
}

/// Applies the configured adjustment, if any (a `null` in the config file
/// leaves the process's own, as upstream's nil pointer).
pub fn apply(value: Option<i32>) {
    apply_at(Path::new(OOM_SCORE_ADJ), value);
}

/// [`apply`] on another file (tests).
pub fn apply_at(file: &Path, value: Option<i32>) {
    let Some(value) = value else { return };
    match write_oom_score_adj(file, value) {
        Ok(()) => tracing::debug!(oom_score_adj = value, "oom_score_adj set"),
        Err(e) => tracing::warn!(
            oom_score_adj = value,
            file = %file.display(),
            error = %e,
            "could not set oom_score_adj to {value} (oomScoreAdj); running with the score the process has"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configured_value_is_written_and_none_leaves_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("oom_score_adj");
        std::fs::write(&file, "0\n").expect("write");
        apply_at(&file, None);
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "0\n");
        apply_at(&file, Some(-999));
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "-999");
    }

    #[test]
    fn a_refusal_is_reported_and_nothing_else_happens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("no-such-dir").join("oom_score_adj");
        assert!(write_oom_score_adj(&missing, -999).is_err());
        // No panic, no file created: the daemon goes on.
        apply_at(&missing, Some(-999));
        assert!(!missing.exists());
    }
}
