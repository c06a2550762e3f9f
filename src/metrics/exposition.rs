//! The Prometheus text exposition format 0.0.4, which upstream's `/metrics`
//! serves (component-base's handler does not negotiate OpenMetrics), made
//! from the OpenMetrics text that `prometheus-client` encodes.
//!
//! The two differ only in the metadata lines here: OpenMetrics names a
//! counter family without `_total` (`# TYPE x counter`, sample `x_total`),
//! has `# UNIT` lines and ends with `# EOF`; the registry also appends a
//! full stop to every help text, which upstream's help texts don't have.

/// The content type of [`to_prometheus_text`]'s output.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Converts OpenMetrics text to the Prometheus text format 0.0.4.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A HELP line waits for its TYPE line, which says whether it is a counter.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, help.take(), "");
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let suffix = if kind == "counter" && !name.ends_with("_total") { "_total" } else { "" };
            match help.take() {
                Some((help_name, text)) if help_name == name => flush_help(&mut out, Some((name, text)), suffix),
                other => flush_help(&mut out, other, ""),
            }
            out.push_str(&format!("# TYPE {name}{suffix} {kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            flush_help(&mut out, help.take(), "");
            out.push_str(line);
            out.push('\n');
        }
    }
    flush_help(&mut out, help, "");
    out
}

/// Writes a pending HELP line, without the registry's trailing full stop.
fn flush_help(out: &mut String, help: Option<(&str, &str)>, suffix: &str) {
    if let Some((name, text)) = help {
        let text = text.strip_suffix('.').unwrap_or(text);
        out.push_str(&format!("# HELP {name}{suffix} {text}\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_get_total_in_their_metadata_and_eof_goes() {
        let om = "# HELP a_changes Cumulative changes.\n# TYPE a_changes counter\na_changes_total 3\n\
                  # HELP b_pending Pending.\n# TYPE b_pending gauge\nb_pending 1\n# EOF\n";
        let want = "# HELP a_changes_total Cumulative changes\n# TYPE a_changes_total counter\na_changes_total 3\n\
                    # HELP b_pending Pending\n# TYPE b_pending gauge\nb_pending 1\n";
        assert_eq!(to_prometheus_text(om), want);
    }

    #[test]
    fn histograms_and_units_pass_through() {
        let om = "# HELP h_seconds Latency.\n# TYPE h_seconds histogram\n# UNIT h_seconds seconds\n\
                  h_seconds_sum 0.5\nh_seconds_count 1\nh_seconds_bucket{le=\"+Inf\"} 1\n# EOF\n";
        let text = to_prometheus_text(om);
        assert!(!text.contains("# UNIT") && !text.contains("# EOF"), "{text}");
        assert!(text.starts_with("# HELP h_seconds Latency\n# TYPE h_seconds histogram\n"), "{text}");
        assert!(text.contains("h_seconds_bucket{le=\"+Inf\"} 1\n"), "{text}");
    }
}
