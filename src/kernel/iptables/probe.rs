//! What the iptables binary's version says of the rules we may write.

/// Whether an iptables whose `iptables --version` printed `version_text`
/// supports MASQUERADE `--random-fully` (iptables >= 1.6.2), as upstream's
/// HasRandomFully decides.
pub fn random_fully(version_text: &str) -> bool {
    version_at_least(version_text, (1, 6, 2))
}

/// Parses "iptables v1.8.9 (legacy)" and compares with `min`.
fn version_at_least(text: &str, min: (u32, u32, u32)) -> bool {
    let Some(v) = text.split_whitespace().find_map(|w| w.strip_prefix('v')) else { return false };
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let got = (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    got >= min
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_iptables_versions() {
        assert!(version_at_least("iptables v1.8.9 (legacy)", (1, 6, 2)));
        assert!(version_at_least("iptables v1.6.2", (1, 6, 2)));
        assert!(!version_at_least("iptables v1.6.1", (1, 6, 2)));
        assert!(!version_at_least("garbage", (1, 6, 2)));
    }
}
