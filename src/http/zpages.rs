//! component-base's z-pages on the metrics server, as upstream kube-proxy
//! installs them there: `/flagz` (every flag and its value) behind the
//! ComponentFlagz gate, `/statusz` (start time, uptime, versions) behind
//! ComponentStatusz (both on by default since 1.36). Plain text for a request that accepts `text/plain`
//! (with no parameter but `charset=utf-8`; `*/*` and `text/*` do), else
//! `406` with upstream's message. As upstream, the delimiter between a
//! name and its value is one of `:`, `: `, `=` or ` `, chosen once per
//! process, so nothing parses the pages as an interface.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::{FeatureGates, Gate};

use super::{text_response, Request, Response, Routes};

const PLAIN: &str = "text/plain; charset=utf-8";
/// Upstream's component name in both pages.
const COMPONENT: &str = "kube-proxy";
const WARNING: &str = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility \
                       guarantees and is for debugging purposes only.";
/// httputil's `ErrUnsupportedMediaType`, as `http.Error` writes it.
const NOT_ACCEPTABLE: &str = "media type not acceptable, must be: text/plain\n";
const DELIMITERS: [&str; 4] = [":", ": ", "=", " "];

/// What the z-pages show.
#[derive(Debug, Clone)]
pub struct ZPages {
    /// `/flagz`'s flags and values; `None` while ComponentFlagz is off.
    pub flags: Option<BTreeMap<String, String>>,
    /// When the process started, for `/statusz`; `None` while ComponentStatusz is off.
    pub started: Option<SystemTime>,
    /// The delimiter between names and values.
    pub delim: &'static str,
}

impl ZPages {
    /// The pages the gates turn on, with `flags` for `/flagz`.
    pub fn new(gates: &FeatureGates, flags: BTreeMap<String, String>, started: SystemTime) -> ZPages {
        let nanos = started.duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos() as usize;
        ZPages {
            flags: gates.enabled(Gate::ComponentFlagz).then_some(flags),
            started: gates.enabled(Gate::ComponentStatusz).then_some(started),
            delim: DELIMITERS[nanos % DELIMITERS.len()],
        }
    }

    /// The routes of the pages that are on.
    pub fn routes(self) -> Routes {
        let mut routes = Routes::new();
        if let Some(flags) = self.flags {
            let body = flagz_body(&flags, self.delim);
            routes = routes.route("/flagz", move |req| zpage(req, || body.clone()));
        }
        if let Some(started) = self.started {
            let delim = self.delim;
            routes = routes.route("/statusz", move |req| {
                zpage(req, || statusz_body(started, SystemTime::now(), env!("CARGO_PKG_VERSION"), delim))
            });
        }
        routes
    }
}

fn zpage(req: &Request, body: impl FnOnce() -> String) -> Response {
    let accept = req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok());
    if acceptable(accept) {
        text_response(200, PLAIN, body())
    } else {
        text_response(406, PLAIN, NOT_ACCEPTABLE)
    }
}

/// httputil's `AcceptableMediaType`: some media range of the `Accept`
/// header matches `text/plain` and has no parameter but `charset=utf-8`
/// (`q` counts as one). No header accepts nothing.
pub fn acceptable(accept: Option<&str>) -> bool {
    accept.unwrap_or("").split(',').any(|range| {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("");
        let matches = match media.split_once('/') {
            Some((t, s)) => matches!(t.trim(), "text" | "*") && matches!(s.trim(), "plain" | "*"),
            None => media == "*",
        };
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        matches
            && match params.as_slice() {
                [] => true,
                [(k, v)] => k.trim() == "charset" && v.trim().eq_ignore_ascii_case("utf-8"),
                _ => false,
            }
    })
}

/// flagz's page: a header, then one `name<delim>value` line per flag,
/// sorted by name.
pub fn flagz_body(flags: &BTreeMap<String, String>, delim: &str) -> String {
    let mut body = format!("\n{COMPONENT} flags\n{WARNING}\n\n");
    for (name, value) in flags {
        body.push_str(&format!("{name}{delim}{value}\n"));
    }
    body
}

/// statusz's page: a header, then start time (Go's `UnixDate`, UTC),
/// uptime, the language and binary version.
pub fn statusz_body(started: SystemTime, now: SystemTime, version: &str, delim: &str) -> String {
    let up = now.duration_since(started).unwrap_or_default();
    format!(
        "\n{COMPONENT} statusz\n{WARNING}\n\nStarted{delim} {}\nUp{delim} {}\nGo version{delim} none (a Rust binary)\nBinary version{delim} {version}\n\n",
        unix_date(started),
        uptime(up)
    )
}

/// Go's `time.UnixDate` layout in UTC: `Mon Jan _2 15:04:05 UTC 2006`.
fn unix_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    match jiff::Timestamp::from_second(secs) {
        Ok(ts) => ts.strftime("%a %b %e %H:%M:%S UTC %Y").to_string(),
        Err(_) => secs.to_string(),
    }
}

/// `N hr MM min SS sec`, as upstream's statusz.
fn uptime(up: Duration) -> String {
    let s = up.as_secs();
    format!("{} hr {:02} min {:02} sec", s / 3600, (s / 60) % 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers_as_upstreams_httputil() {
        for ok in ["text/plain", "*/*", "text/*", "text/plain; charset=utf-8", "application/json, text/plain", "*"] {
            assert!(acceptable(Some(ok)), "{ok}");
        }
        for no in [None, Some(""), Some("application/json"), Some("text/html"), Some("text/plain; charset=latin1")] {
            assert!(!acceptable(no), "{no:?}");
        }
        assert!(!acceptable(Some("text/plain; charset=utf-8; q=0.5")), "two parameters");
    }

    #[test]
    fn flagz_lists_every_flag_sorted_with_the_delimiter() {
        let flags: BTreeMap<String, String> =
            [("v", "2"), ("proxy-mode", "nftables"), ("feature-gates", "")].map(|(k, v)| (k.into(), v.into())).into();
        let body = flagz_body(&flags, "=");
        assert_eq!(
            body,
            format!("\nkube-proxy flags\n{WARNING}\n\nfeature-gates=\nproxy-mode=nftables\nv=2\n"),
            "{body}"
        );
    }

    #[test]
    fn statusz_shows_start_uptime_and_versions() {
        let started = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let body = statusz_body(started, started + Duration::from_secs(3 * 3600 + 62), "0.1.0", ": ");
        let lines: Vec<&str> = body.lines().collect();
        assert_eq!(lines[1], "kube-proxy statusz");
        assert!(lines[2].starts_with("Warning: This endpoint is not meant to be machine parseable"));
        assert!(lines.contains(&"Started:  Tue Nov 14 22:13:20 UTC 2023"), "{body}");
        assert!(lines.contains(&"Up:  3 hr 01 min 02 sec"), "{body}");
        assert!(lines.contains(&"Binary version:  0.1.0"), "{body}");
    }

    #[test]
    fn the_gates_choose_the_pages() {
        let flags: BTreeMap<String, String> = [("v".to_string(), "0".to_string())].into();
        let on = ZPages::new(&FeatureGates::defaults(), flags.clone(), SystemTime::now());
        assert!(DELIMITERS.contains(&on.delim));
        assert_eq!(on.routes().paths().collect::<Vec<_>>(), ["/flagz", "/statusz"], "on by default since 1.36");
        let off: BTreeMap<String, bool> = [("ComponentFlagz".into(), false), ("ComponentStatusz".into(), false)].into();
        let (gates, _) = FeatureGates::from_map(&off).unwrap();
        let pages = ZPages::new(&gates, flags, SystemTime::now());
        assert!(pages.flags.is_none() && pages.started.is_none());
        assert_eq!(pages.routes().paths().count(), 0);
    }
}
