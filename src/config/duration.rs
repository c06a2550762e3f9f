//! `GoDuration`: a non-negative [`Duration`] that reads and writes Go's
//! `time.Duration` text form (`"30s"`, `"1m0s"`, `"1h2m3.5s"`, `"500ms"`),
//! as `metav1.Duration` does in KubeProxyConfiguration files and as pflag's
//! duration flags do on the command line.
//!
//! Parsing follows Go's `time.ParseDuration` (units `ns`, `us`, `µs`, `μs`,
//! `ms`, `s`, `m`, `h`; fractions; several units in a row; a bare `"0"`)
//! except that negative durations are refused: no kube-proxy setting
//! accepts one. Formatting follows Go's `Duration.String()`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Go's limit for a duration: `math.MaxInt64` nanoseconds (about 292 years).
const MAX_NANOS: u128 = i64::MAX as u128;

/// A [`Duration`] with Go's text form. `Default` is zero (`"0s"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(pub Duration);

/// Why a string is not a Go duration. The message quotes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}")]
pub struct DurationParseError {
    /// The text that was refused.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl GoDuration {
    /// Zero, written `"0s"`.
    pub const ZERO: GoDuration = GoDuration(Duration::ZERO);

    /// A whole number of seconds.
    pub const fn from_secs(secs: u64) -> Self {
        GoDuration(Duration::from_secs(secs))
    }

    /// A whole number of milliseconds.
    pub const fn from_millis(millis: u64) -> Self {
        GoDuration(Duration::from_millis(millis))
    }

    /// The wrapped [`Duration`].
    pub const fn get(self) -> Duration {
        self.0
    }

    /// True for `0s`.
    /// [`GoDuration::is_zero`] by reference, for serde's `skip_serializing_if`.
    pub fn is_zero_ref(&self) -> bool {
        self.is_zero()
    }

    pub const fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl From<Duration> for GoDuration {
    fn from(d: Duration) -> Self {
        GoDuration(d)
    }
}

impl From<GoDuration> for Duration {
    fn from(d: GoDuration) -> Self {
        d.0
    }
}

impl FromStr for GoDuration {
    type Err = DurationParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_go_duration(s)
            .map(|nanos| GoDuration(nanos_to_duration(nanos)))
            .map_err(|reason| DurationParseError { input: s.to_string(), reason })
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_go_duration(self.0.as_nanos()))
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(DurationVisitor)
    }
}

struct DurationVisitor;

impl serde::de::Visitor<'_> for DurationVisitor {
    type Value = GoDuration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Go duration string such as \"30s\" or \"1m30s\"")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<GoDuration, E> {
        v.parse().map_err(E::custom)
    }
}

fn nanos_to_duration(nanos: u128) -> Duration {
    let secs = (nanos / 1_000_000_000) as u64;
    let sub = (nanos % 1_000_000_000) as u32;
    Duration::new(secs, sub)
}

/// Parses Go duration text into nanoseconds.
fn parse_go_duration(s: &str) -> Result<u128, &'static str> {
    let rest = match s.as_bytes().first() {
        Some(b'-') => {
            // Go accepts "-0"; anything else negative is refused here.
            return if s[1..] == *"0" { Ok(0) } else { Err("negative durations are not allowed") };
        }
        Some(b'+') => &s[1..],
        _ => s,
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err("empty duration");
    }
    let mut total: u128 = 0;
    let mut rest = rest;
    while !rest.is_empty() {
        let (nanos, tail) = parse_component(rest)?;
        total = total.checked_add(nanos).ok_or("duration out of range")?;
        rest = tail;
    }
    if total > MAX_NANOS {
        return Err("duration out of range");
    }
    Ok(total)
}

/// Parses one `<number>[.<fraction>]<unit>` group; returns its nanoseconds
/// and the text after it.
fn parse_component(s: &str) -> Result<(u128, &str), &'static str> {
    let (int_part, after_int) = split_digits(s);
    let (frac_part, after_num) = match after_int.strip_prefix('.') {
        Some(tail) => split_digits(tail),
        None => ("", after_int),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err("expected a number");
    }
    let unit_len = after_num.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(after_num.len());
    let (unit, tail) = after_num.split_at(unit_len);
    if unit.is_empty() {
        return Err("missing unit (one of ns, us, µs, ms, s, m, h)");
    }
    let unit_nanos = unit_nanos(unit).ok_or("unknown unit (use ns, us, µs, ms, s, m, h)")?;
    Ok((scale(int_part, frac_part, unit_nanos)?, tail))
}

fn split_digits(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s.split_at(end)
}

fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        _ => return None,
    })
}

/// `int.frac × unit` in nanoseconds; fraction digits below one nanosecond
/// are dropped, as Go does.
fn scale(int_part: &str, frac_part: &str, unit: u128) -> Result<u128, &'static str> {
    const RANGE: &str = "duration out of range";
    let mut whole: u128 = 0;
    for d in int_part.bytes() {
        whole = whole * 10 + u128::from(d - b'0');
        if whole > MAX_NANOS {
            return Err(RANGE);
        }
    }
    let mut nanos = whole.checked_mul(unit).ok_or(RANGE)?;
    let mut place = unit;
    for d in frac_part.bytes() {
        place /= 10;
        if place == 0 {
            break;
        }
        nanos += u128::from(d - b'0') * place;
    }
    if nanos > MAX_NANOS {
        return Err(RANGE);
    }
    Ok(nanos)
}

/// Formats nanoseconds as Go's `Duration.String()` does.
fn format_go_duration(nanos: u128) -> String {
    const SEC: u128 = 1_000_000_000;
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}\u{b5}s", with_fraction(nanos, 3));
    }
    if nanos < SEC {
        return format!("{}ms", with_fraction(nanos, 6));
    }
    let secs = nanos / SEC;
    let sec_text = with_fraction(nanos % (60 * SEC), 9);
    let (mins, hours) = ((secs / 60) % 60, secs / 3600);
    match (hours, secs / 60) {
        (0, 0) => format!("{sec_text}s"),
        (0, _) => format!("{mins}m{sec_text}s"),
        _ => format!("{hours}h{mins}m{sec_text}s"),
    }
}

/// `value / 10^digits` written with its fraction, trailing zeros trimmed.
fn with_fraction(value: u128, digits: u32) -> String {
    let div = 10u128.pow(digits);
    let (int, frac) = (value / div, value % div);
    if frac == 0 {
        return int.to_string();
    }
    let frac_text = format!("{frac:0width$}", width = digits as usize);
    format!("{int}.{}", frac_text.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Duration {
        s.parse::<GoDuration>().map(GoDuration::get).unwrap()
    }

    #[test]
    fn parses_go_duration_forms() {
        let ms = Duration::from_millis;
        let table: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("+0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("30s", Duration::from_secs(30)),
            ("+30s", Duration::from_secs(30)),
            ("1m0s", Duration::from_secs(60)),
            ("15m0s", Duration::from_secs(900)),
            ("24h0m0s", Duration::from_secs(86_400)),
            ("1h2m3.5s", ms(3_723_500)),
            ("500ms", ms(500)),
            ("1.5h", Duration::from_secs(5_400)),
            ("300us", Duration::from_micros(300)),
            ("300\u{b5}s", Duration::from_micros(300)),
            ("300\u{3bc}s", Duration::from_micros(300)),
            ("7ns", Duration::from_nanos(7)),
            (".5s", ms(500)),
            ("1.s", Duration::from_secs(1)),
            ("2h45m", Duration::from_secs(9_900)),
            ("1s1s", Duration::from_secs(2)),
            ("1.0000000001s", Duration::from_secs(1)),
            ("2562047h47m16.854775807s", Duration::new(9_223_372_036, 854_775_807)),
        ];
        for (text, want) in table {
            assert_eq!(d(text), *want, "parsing {text:?}");
        }
    }

    #[test]
    fn refuses_bad_durations_and_quotes_them() {
        for bad in [
            "",
            "-1s",
            "-",
            "+",
            "1",
            "s",
            ".",
            ".s",
            "1x",
            "1.5",
            "1s2",
            "30 s",
            " 30s",
            "1S",
            "2562047h47m16.854775808s",
            "9999999999999999999999h",
        ] {
            let err = bad.parse::<GoDuration>().unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn formats_like_go_duration_string() {
        let table: &[(Duration, &str)] = &[
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(1_100), "1.1\u{b5}s"),
            (Duration::from_micros(300), "300\u{b5}s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_micros(2_200), "2.2ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(900), "15m0s"),
            (Duration::from_secs(3_600), "1h0m0s"),
            (Duration::from_millis(3_723_500), "1h2m3.5s"),
            (Duration::from_secs(86_400), "24h0m0s"),
            (Duration::new(61, 1), "1m1.000000001s"),
        ];
        for (dur, want) in table {
            assert_eq!(GoDuration(*dur).to_string(), *want);
        }
    }

    #[test]
    fn format_then_parse_round_trips() {
        for text in ["0s", "1ns", "1.5\u{b5}s", "2.25ms", "59.999s", "1h0m0.5s", "100h0m0s"] {
            assert_eq!(text.parse::<GoDuration>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn serde_uses_the_go_text_form() {
        let v: GoDuration = serde_json::from_str("\"1m30s\"").unwrap();
        assert_eq!(v.get(), Duration::from_secs(90));
        assert_eq!(serde_json::to_string(&v).unwrap(), "\"1m30s\"");
        let err = serde_json::from_str::<GoDuration>("30").unwrap_err();
        assert!(err.to_string().contains("Go duration string"), "{err}");
        let err = serde_json::from_str::<GoDuration>("\"30x\"").unwrap_err();
        assert!(err.to_string().contains("\"30x\""), "{err}");
    }
}
