//! The IP and CIDR fields of Services, EndpointSlices and the Node, read
//! with upstream's sloppy parsers ([`crate::net`]), and the values among
//! them that upstream skips: the model takes what parses, and
//! [`super::notice::ignored_values`] names (once per object) what does not.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::net::{parse_cidr_sloppy, parse_ip_sloppy};

/// A value of an IP or CIDR field that is not what the field holds: skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadValue {
    /// The field, without indices: `spec.loadBalancerSourceRanges` (the
    /// `field` label of `kube_proxy_rs_ignored_values_total`).
    pub field: &'static str,
    /// The field with its indices: `spec.loadBalancerSourceRanges[1]`.
    pub path: String,
    pub value: String,
    /// What the value is not: `an IP address`, `a CIDR`, `an IPv4 address`.
    pub wanted: &'static str,
    /// What skipping it means for the object.
    pub effect: &'static str,
}

impl BadValue {
    /// `spec.externalIPs[0] "bogus" is not an IP address: skipped`.
    pub fn detail(&self) -> String {
        format!("{} {:?} is not {}: {}", self.path, self.value, self.wanted, self.effect)
    }
}

/// The effect of most bad values.
pub const SKIPPED: &str = "skipped";

/// Upstream's `MapIPsByIPFamily` before the split by family: every text
/// of `field` that parses, and those that do not; blank ones are skipped
/// without a word, as upstream does.
pub fn ip_list(field: &'static str, texts: &[String]) -> (Vec<IpAddr>, Vec<BadValue>) {
    list(field, texts, parse_ip_sloppy, "an IP address", SKIPPED)
}

/// Upstream's `MapCIDRsByIPFamily` before the split by family: every text
/// of `field`, trimmed, that parses (its network), and those that do not;
/// blank ones are skipped without a word, as upstream does.
pub fn cidr_list(field: &'static str, texts: &[String], effect: &'static str) -> (Vec<IpNet>, Vec<BadValue>) {
    list(field, texts, |t| parse_cidr_sloppy(t.trim()), "a CIDR", effect)
}

fn list<T>(
    field: &'static str,
    texts: &[String],
    parse: impl Fn(&str) -> Option<T>,
    wanted: &'static str,
    effect: &'static str,
) -> (Vec<T>, Vec<BadValue>) {
    let mut good = Vec::with_capacity(texts.len());
    let mut bad = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        match parse(text) {
            Some(v) => good.push(v),
            None if text.trim().is_empty() => {}
            None => bad.push(BadValue { field, path: format!("{field}[{i}]"), value: text.clone(), wanted, effect }),
        }
    }
    (good, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_lists_keep_what_parses_and_name_the_rest() {
        let texts = ["010.0.0.1", "", " ", "bogus", "fd00::1", " 10.0.0.2"].map(String::from);
        let (ips, bad) = ip_list("spec.externalIPs", &texts);
        assert_eq!(ips, vec!["10.0.0.1".parse::<IpAddr>().unwrap(), "fd00::1".parse().unwrap()]);
        let named: Vec<String> = bad.iter().map(BadValue::detail).collect();
        // Untrimmed, as upstream's MapIPsByIPFamily: " 10.0.0.2" does not parse.
        assert_eq!(
            named,
            [
                "spec.externalIPs[3] \"bogus\" is not an IP address: skipped",
                "spec.externalIPs[5] \" 10.0.0.2\" is not an IP address: skipped"
            ]
        );
        assert!(bad.iter().all(|b| b.field == "spec.externalIPs"));
    }

    #[test]
    fn cidr_lists_are_trimmed_and_masked() {
        let ranges = [" 203.0.113.000/025 ", "10.1.2.3/8", "", "10.0.0.0/33"].map(String::from);
        let (nets, bad) = cidr_list("spec.loadBalancerSourceRanges", &ranges, "x");
        let want: Vec<IpNet> = vec!["203.0.113.0/25".parse().unwrap(), "10.0.0.0/8".parse().unwrap()];
        assert_eq!(nets, want);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].path, "spec.loadBalancerSourceRanges[3]");
        assert_eq!(bad[0].detail(), "spec.loadBalancerSourceRanges[3] \"10.0.0.0/33\" is not a CIDR: x");
    }
}
