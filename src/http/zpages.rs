//! The z-pages on the metrics server, as upstream kube-proxy 1.36 installs
//! them there (k8s.io/apiserver `pkg/server/flagz` and `statusz`):
//! `/flagz` (every flag and its value) behind ComponentFlagz, `/statusz`
//! (start time, uptime, versions, the server's paths) behind
//! ComponentStatusz; both gates are beta and on by default since 1.36.
//!
//! Each page is plain text, or a `config.k8s.io` `Flagz`/`Statusz` object
//! (`v1beta1`, or the deprecated `v1alpha1`) as JSON or YAML for a client
//! that asks for it in `Accept` (`application/json;g=config.k8s.io;v=v1beta1;as=Statusz`).
//! The `Accept` header is negotiated as the apiserver's handlers do
//! ([`acceptable`]): no header, `*/*`, `text/*` or `text/plain` (with any
//! parameters but `as`, `g`, `v`, `stream` and `sv`) is text; a structured
//! type without a known kind is not acceptable, answered `406` with a
//! `Status`. As upstream, the text's delimiter between a name and its
//! value is one of `:`, `: `, `=` or ` ` (`/flagz` keeps the one it first
//! chose, `/statusz` draws one per request), so nothing parses the text
//! pages as an interface.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::StatusCode;
use serde::Serialize;

use crate::config::{FeatureGates, Gate};

use super::{Request, Response, Routes};

const PLAIN: &str = "text/plain; charset=utf-8";
/// Upstream's component name in both pages.
const COMPONENT: &str = "kube-proxy";
const WARNING: &str = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility \
                       guarantees and is for debugging purposes only.";
const DELIMITERS: [&str; 4] = [":", ": ", "=", " "];
/// The API group of the structured pages.
const GROUP: &str = "config.k8s.io";
/// The structured versions served; the first is deprecated.
const VERSIONS: [&str; 2] = ["v1alpha1", "v1beta1"];
/// What `/statusz` says of the Go version: there is none.
const GO_VERSION: &str = "none (a Rust binary)";
/// The media types the pages are served in, in the apiserver codec
/// factory's order (JSON, YAML, then the pages' text).
const MEDIA_TYPES: [(&str, &str); 3] = [("application", "json"), ("application", "yaml"), ("text", "plain")];
/// The top-level paths of the metrics server besides the z-pages (the
/// daemon's metrics routes and the dashboard), as `/statusz` lists them.
const SERVED_PATHS: [&str; 5] = ["/configz", "/dashboard", "/healthz", "/metrics", "/proxyMode"];

/// What the z-pages show.
#[derive(Debug, Clone)]
pub struct ZPages {
    /// `/flagz`'s flags and values; `None` while ComponentFlagz is off.
    pub flags: Option<BTreeMap<String, String>>,
    /// When the process started, for `/statusz`; `None` while ComponentStatusz is off.
    pub started: Option<SystemTime>,
    /// `/flagz`'s delimiter between names and values.
    pub delim: &'static str,
}

impl ZPages {
    /// The pages the gates turn on, with `flags` for `/flagz`.
    pub fn new(gates: &FeatureGates, flags: BTreeMap<String, String>, started: SystemTime) -> ZPages {
        ZPages {
            flags: gates.enabled(Gate::ComponentFlagz).then_some(flags),
            started: gates.enabled(Gate::ComponentStatusz).then_some(started),
            delim: pick_delimiter(started),
        }
    }

    /// The top-level paths `/statusz` lists: the metrics server's and
    /// `/flagz` when it is on (not `/statusz` itself, as upstream).
    pub fn listed_paths(&self) -> Vec<String> {
        let mut paths: Vec<String> = SERVED_PATHS.iter().map(|p| p.to_string()).collect();
        if self.flags.is_some() {
            paths.push("/flagz".to_string());
        }
        paths.sort();
        paths
    }

    /// The routes of the pages that are on.
    pub fn routes(self) -> Routes {
        let mut routes = Routes::new();
        let paths = self.listed_paths();
        if let Some(flags) = self.flags {
            let text = flagz_body(&flags, self.delim);
            routes = routes.route("/flagz", move |req| {
                zpage(req, Page::Flagz, || text.clone(), |version| flagz_object(version, &flags))
            });
        }
        if let Some(started) = self.started {
            routes = routes.route("/statusz", move |req| {
                let status = Status::new(started, SystemTime::now(), env!("CARGO_PKG_VERSION"), paths.clone());
                let delim = pick_delimiter(SystemTime::now());
                zpage(req, Page::Statusz, || status.text(delim), |version| status.object(version))
            });
        }
        routes
    }
}

/// One of the delimiters, drawn from the clock's nanoseconds.
fn pick_delimiter(t: SystemTime) -> &'static str {
    let nanos = t.duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos() as usize;
    DELIMITERS[nanos % DELIMITERS.len()]
}

/// A z-page: its structured kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Page {
    Flagz,
    Statusz,
}

impl Page {
    fn kind(self) -> &'static str {
        match self {
            Page::Flagz => "Flagz",
            Page::Statusz => "Statusz",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Page::Flagz => "flagz",
            Page::Statusz => "statusz",
        }
    }
}

/// A structured encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

impl Format {
    fn media_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Yaml => "application/yaml",
        }
    }
}

/// How a page is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    Text,
    /// The page's object in `version`; `pretty` from the media type's
    /// `pretty=1`.
    Structured {
        format: Format,
        version: &'static str,
        pretty: bool,
    },
}

/// One media range of an `Accept` header, as goautoneg parses it.
#[derive(Debug, Clone, PartialEq)]
struct Clause<'a> {
    kind: &'a str,
    sub: &'a str,
    q: f64,
    params: Vec<(&'a str, &'a str)>,
}

/// goautoneg's `ParseAccept`: the media ranges (a missing `q` is 1, an
/// unreadable one 0), ordered by its comparison with Go's insertion sort.
fn parse_accept(header: &str) -> Vec<Clause<'_>> {
    let mut clauses: Vec<Clause> = Vec::new();
    for part in header.split(',') {
        let mut fields = part.split(';');
        let range: Vec<&str> = fields.next().unwrap_or("").split('/').collect();
        let (kind, sub) = match range.as_slice() {
            [t] if t.trim() == "*" => ("*", "*"),
            [t, s] => (t.trim(), s.trim()),
            _ => continue,
        };
        let mut clause = Clause { kind, sub, q: 1.0, params: Vec::new() };
        for (key, value) in fields.filter_map(|p| p.split_once('=')) {
            match key.trim() {
                "q" => clause.q = value.parse().unwrap_or(0.0),
                key => clause.params.push((key, value.trim())),
            }
        }
        clauses.push(clause);
    }
    let before =
        |a: &Clause, b: &Clause| a.q > b.q || (a.kind != "*" && b.kind == "*") || (a.sub != "*" && b.sub == "*");
    for i in 1..clauses.len() {
        let mut j = i;
        while j > 0 && before(&clauses[j], &clauses[j - 1]) {
            clauses.swap(j, j - 1);
            j -= 1;
        }
    }
    clauses
}

/// The apiserver's `acceptMediaTypeOptions` for `media` under a page's
/// restrictions (`Some(kind)`: text without a conversion, structured types
/// only as that kind of `config.k8s.io`) or the default ones (`None`: no
/// conversion, a watch stream only for JSON).
fn options(clause: &Clause, media: (&str, &str), page: Option<Page>) -> Option<Representation> {
    let (mut kind, mut group, mut version, mut pretty, mut convert) = ("", "", "", false, false);
    for &(key, value) in &clause.params {
        match key {
            "as" => (kind, convert) = (value, true),
            "g" => (group, convert) = (value, true),
            "v" => (version, convert) = (value, true),
            "stream" if !value.is_empty() && (page.is_some() || value != "watch" || media.1 != "json") => return None,
            "sv" if !value.is_empty() => return None,
            "pretty" => pretty = value == "1",
            _ => {}
        }
    }
    let format = match media {
        ("text", "plain") => return (!convert).then_some(Representation::Text),
        (_, "json") => Format::Json,
        _ => Format::Yaml,
    };
    match page {
        None if !convert => Some(Representation::Structured { format, version: "", pretty }),
        Some(page) if kind == page.kind() && group == GROUP => VERSIONS
            .iter()
            .find(|v| **v == version)
            .map(|&version| Representation::Structured { format, version, pretty }),
        _ => None,
    }
}

/// The apiserver's `NegotiateMediaTypeOptions`: the first media range (in
/// goautoneg's order) that one of the served types matches and the
/// restrictions allow. `None`: not acceptable.
fn negotiate(accept: &str, page: Option<Page>) -> Option<Representation> {
    parse_accept(accept).iter().find_map(|clause| {
        MEDIA_TYPES.iter().find_map(|&(kind, sub)| {
            let matches = (clause.kind == kind && (clause.sub == sub || clause.sub == "*"))
                || (clause.kind == "*" && clause.sub == "*");
            if matches {
                options(clause, (kind, sub), page)
            } else {
                None
            }
        })
    })
}

/// How a page with structured kind `kind` (`Flagz`, `Statusz`) answers a
/// request with this `Accept` header: no header (or a blank one) is text;
/// `None` is not acceptable.
pub fn acceptable(accept: Option<&str>, kind: &str) -> Option<Representation> {
    let page = [Page::Flagz, Page::Statusz].into_iter().find(|p| p.kind() == kind)?;
    match accept.map(str::trim) {
        None | Some("") => Some(Representation::Text),
        Some(accept) => negotiate(accept, Some(page)),
    }
}

/// The apiserver's `isPrettyPrint`: `?pretty=` (Go's `ParseBool`) if given,
/// else whether the client is curl, Wget or a browser.
fn pretty_printed(req: &Request) -> bool {
    let query = req.uri().query().unwrap_or("");
    let pretty = query.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == "pretty").map(|(_, v)| v);
    if let Some(value) = pretty.filter(|v| !v.is_empty()) {
        return matches!(value, "1" | "t" | "T" | "TRUE" | "true" | "True");
    }
    let agent = req.headers().get(hyper::header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("");
    ["curl", "Wget", "Mozilla/5.0"].iter().any(|p| agent.starts_with(p))
}

/// A response with exactly the headers upstream's z-page handlers write.
fn response(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response {
    let mut resp = hyper::Response::new(Full::new(body.into()));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(value) = HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(CONTENT_TYPE, value);
    }
    resp
}

/// Answers a z-page request: the text, the object (a function of the
/// version) in the negotiated encoding, or `406`.
fn zpage<T: Serialize>(
    req: &Request,
    page: Page,
    text: impl FnOnce() -> String,
    object: impl FnOnce(&'static str) -> T,
) -> Response {
    let accept = req.headers().get(hyper::header::ACCEPT).map(|v| v.to_str().unwrap_or("\u{0}"));
    match acceptable(accept, page.kind()) {
        Some(Representation::Text) => response(200, PLAIN, text()),
        Some(Representation::Structured { format, version, pretty }) => {
            let media = format!("{};g={GROUP};v={version};as={}", format.media_type(), page.kind());
            let mut resp = response(200, &media, encode(&object(version), format, pretty || pretty_printed(req)));
            if version == VERSIONS[0] {
                let warning = format!(
                    "299 - \"This version of the {} endpoint is deprecated. Please use a newer version.\"",
                    page.name()
                );
                if let Ok(value) = HeaderValue::from_str(&warning) {
                    resp.headers_mut().insert(hyper::header::WARNING, value);
                }
            }
            resp
        }
        None => not_acceptable(accept.unwrap_or(""), pretty_printed(req)),
    }
}

/// Go's `encoding/json` output: HTML-sensitive characters escaped;
/// compact with a newline, or indented by two spaces without one.
fn go_json<T: Serialize>(value: &T, pretty: bool) -> String {
    let text = if pretty { serde_json::to_string_pretty(value) } else { serde_json::to_string(value) };
    let mut text = text.unwrap_or_default();
    for (c, escaped) in
        [('<', "\\u003c"), ('>', "\\u003e"), ('&', "\\u0026"), ('\u{2028}', "\\u2028"), ('\u{2029}', "\\u2029")]
    {
        text = text.replace(c, escaped);
    }
    if !pretty {
        text.push('\n');
    }
    text
}

/// `value` as the apiserver's serializer writes it: JSON as Go's, YAML as
/// sigs.k8s.io/yaml's (the JSON object's keys sorted).
fn encode<T: Serialize>(value: &T, format: Format, pretty: bool) -> String {
    match format {
        Format::Json => go_json(value, pretty),
        Format::Yaml => {
            serde_json::to_value(value).ok().and_then(|v| yaml_serde::to_string(&v).ok()).unwrap_or_default()
        }
    }
}

/// A `metav1.Status` for a failure (`kind`/`apiVersion` empty when it is
/// written as a raw Go struct).
#[derive(Serialize)]
struct Status406<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    kind: &'a str,
    #[serde(rename = "apiVersion", skip_serializing_if = "str::is_empty")]
    api_version: &'a str,
    metadata: BTreeMap<String, String>,
    status: &'a str,
    message: String,
    reason: &'a str,
    code: u16,
}

/// The apiserver's `ErrorNegotiated` for a `NotAcceptable` error: the
/// `Status` in JSON or YAML if the client accepts one of them plainly,
/// else the Go struct as indented JSON.
fn not_acceptable(accept: &str, pretty: bool) -> Response {
    let served: Vec<String> = MEDIA_TYPES.iter().map(|(t, s)| format!("{t}/{s}")).collect();
    let mut status = Status406 {
        kind: "Status",
        api_version: "v1",
        metadata: BTreeMap::new(),
        status: "Failure",
        message: format!("only the following media types are accepted: {}", served.join(", ")),
        reason: "NotAcceptable",
        code: 406,
    };
    match negotiate(accept, None) {
        Some(Representation::Structured { format, pretty: asked, .. }) => {
            response(406, format.media_type(), encode(&status, format, asked || pretty))
        }
        _ => {
            (status.kind, status.api_version) = ("", "");
            response(406, "application/json", go_json(&status, true))
        }
    }
}

/// An object's `metadata`: its name.
#[derive(Serialize)]
struct Metadata {
    name: &'static str,
}

/// A `config.k8s.io` object: type meta, metadata, then the page's fields.
#[derive(Serialize)]
struct Object<T: Serialize> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: String,
    metadata: Metadata,
    #[serde(flatten)]
    fields: T,
}

fn object<T: Serialize>(page: Page, version: &str, fields: T) -> Object<T> {
    Object {
        kind: page.kind(),
        api_version: format!("{GROUP}/{version}"),
        metadata: Metadata { name: COMPONENT },
        fields,
    }
}

#[derive(Serialize)]
struct FlagzFields<'a> {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    flags: &'a BTreeMap<String, String>,
}

/// `/flagz`'s object.
fn flagz_object<'a>(version: &str, flags: &'a BTreeMap<String, String>) -> Object<FlagzFields<'a>> {
    object(Page::Flagz, version, FlagzFields { flags })
}

/// flagz's text: the header, then one `name<delim>value` line per flag,
/// sorted by name.
pub fn flagz_body(flags: &BTreeMap<String, String>, delim: &str) -> String {
    let mut body = format!("\n{COMPONENT} flagz\n{WARNING}\n");
    for (name, value) in flags {
        body.push_str(&format!("{name}{delim}{value}\n"));
    }
    body
}

/// What `/statusz` shows, at one moment.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    /// The start, in seconds since the epoch.
    #[serde(skip)]
    start: i64,
    /// The start in RFC 3339, UTC.
    start_time: String,
    uptime_seconds: u64,
    go_version: &'static str,
    binary_version: &'static str,
    emulation_version: &'static str,
    paths: Vec<String>,
}

impl Status {
    /// The start (to the second, as upstream reads it), the uptime since
    /// then, the versions and the listed paths.
    fn new(started: SystemTime, now: SystemTime, version: &'static str, paths: Vec<String>) -> Status {
        let start = started.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let uptime_seconds = now.duration_since(UNIX_EPOCH + Duration::from_secs(start)).unwrap_or_default().as_secs();
        let start = i64::try_from(start).unwrap_or_default();
        Status {
            start,
            start_time: time_format(start, "%Y-%m-%dT%H:%M:%SZ"),
            uptime_seconds,
            go_version: GO_VERSION,
            binary_version: version,
            emulation_version: FeatureGates::KUBERNETES_VERSION,
            paths,
        }
    }

    /// The text page, with `delim`.
    fn text(&self, delim: &str) -> String {
        let up = self.uptime_seconds;
        let uptime = format!("{} hr {:02} min {:02} sec", up / 3600, (up / 60) % 60, up % 60);
        format!(
            "\n{COMPONENT} statusz\n{WARNING}\n\nStarted{delim} {}\nUp{delim} {uptime}\nGo version{delim} {}\n\
             Binary version{delim} {}\nEmulation version{delim} {}\nPaths{delim} {}\n",
            time_format(self.start, "%a %b %e %H:%M:%S UTC %Y"),
            self.go_version,
            self.binary_version,
            self.emulation_version,
            self.paths.join(" "),
        )
    }

    /// The object in `version`.
    fn object(&self, version: &str) -> Object<&Status> {
        object(Page::Statusz, version, self)
    }
}

/// statusz's text page for a process started at `started`.
pub fn statusz_body(started: SystemTime, now: SystemTime, version: &'static str, delim: &str) -> String {
    Status::new(started, now, version, SERVED_PATHS.iter().map(|p| p.to_string()).collect()).text(delim)
}

/// A Unix time in UTC with a strftime layout.
fn time_format(secs: i64, layout: &str) -> String {
    match jiff::Timestamp::from_second(secs) {
        Ok(ts) => ts.strftime(layout).to_string(),
        Err(_) => secs.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn structured(format: Format, version: &'static str) -> Option<Representation> {
        Some(Representation::Structured { format, version, pretty: false })
    }

    #[test]
    fn accept_is_negotiated_as_the_apiservers_handlers_do() {
        for text in [None, Some(""), Some(" "), Some("text/plain"), Some("*/*"), Some("text/*"), Some("*")] {
            assert_eq!(acceptable(text, "Statusz"), Some(Representation::Text), "{text:?}");
        }
        for text in ["text/plain; charset=utf-8; q=0.5", "text/plain; charset=latin1", "application/json, text/plain"] {
            assert_eq!(acceptable(Some(text), "Flagz"), Some(Representation::Text), "{text}");
        }
        let json = "application/json;as=Statusz;g=config.k8s.io;v=v1beta1";
        assert_eq!(acceptable(Some(json), "Statusz"), structured(Format::Json, "v1beta1"));
        let yaml = "application/yaml;as=Flagz;g=config.k8s.io;v=v1alpha1";
        assert_eq!(acceptable(Some(yaml), "Flagz"), structured(Format::Yaml, "v1alpha1"));
        let any = "*/*;as=Flagz;g=config.k8s.io;v=v1beta1";
        assert_eq!(acceptable(Some(any), "Flagz"), structured(Format::Json, "v1beta1"), "JSON comes first");
        let pretty = "application/json;as=Flagz;g=config.k8s.io;v=v1beta1;pretty=1";
        assert_eq!(
            acceptable(Some(pretty), "Flagz"),
            Some(Representation::Structured { format: Format::Json, version: "v1beta1", pretty: true })
        );
        // The higher q wins; a text range listed first but weighed less loses.
        let both = format!("text/plain;q=0.5, {json}");
        assert_eq!(acceptable(Some(&both), "Statusz"), structured(Format::Json, "v1beta1"));
        for no in [
            "application/json",
            "application/yaml",
            "text/html",
            "application/json;as=Flagz;g=config.k8s.io;v=v1beta1",
            "application/json;as=Statusz;g=config.k8s.io;v=v2",
            "application/json;as=Statusz;v=v1beta1",
            "text/plain;as=Statusz",
            "text/plain;stream=watch",
            "text/plain;sv=v1",
            "application/vnd.kubernetes.protobuf",
        ] {
            assert_eq!(acceptable(Some(no), "Statusz"), None, "{no}");
        }
    }

    #[test]
    fn flagz_text_lists_every_flag_sorted_with_the_delimiter() {
        let flags: BTreeMap<String, String> =
            [("v", "2"), ("proxy-mode", "nftables"), ("feature-gates", "")].map(|(k, v)| (k.into(), v.into())).into();
        let body = flagz_body(&flags, "=");
        assert_eq!(
            body,
            format!("\nkube-proxy flagz\n{WARNING}\nfeature-gates=\nproxy-mode=nftables\nv=2\n"),
            "{body}"
        );
    }

    #[test]
    fn statusz_text_shows_start_uptime_versions_and_paths() {
        let started = UNIX_EPOCH + Duration::from_millis(1_700_000_000_700);
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000 + 3 * 3600 + 62);
        let body = statusz_body(started, now, "0.1.0", ": ");
        let lines: Vec<&str> = body.lines().collect();
        assert_eq!(&lines[..3], ["", "kube-proxy statusz", WARNING]);
        assert_eq!(
            &lines[3..],
            [
                "",
                "Started:  Tue Nov 14 22:13:20 UTC 2023",
                "Up:  3 hr 01 min 02 sec",
                "Go version:  none (a Rust binary)",
                "Binary version:  0.1.0",
                "Emulation version:  1.36",
                "Paths:  /configz /dashboard /healthz /metrics /proxyMode",
            ],
            "{body}"
        );
    }

    #[test]
    fn structured_pages_are_config_k8s_io_objects() {
        let paths = vec!["/configz".to_string(), "/flagz".to_string()];
        let started = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let status = Status::new(started, started + Duration::from_secs(75), "0.1.0", paths);
        assert_eq!(
            encode(&status.object("v1beta1"), Format::Json, false),
            "{\"kind\":\"Statusz\",\"apiVersion\":\"config.k8s.io/v1beta1\",\"metadata\":{\"name\":\"kube-proxy\"},\
             \"startTime\":\"2023-11-14T22:13:20Z\",\"uptimeSeconds\":75,\"goVersion\":\"none (a Rust binary)\",\
             \"binaryVersion\":\"0.1.0\",\"emulationVersion\":\"1.36\",\"paths\":[\"/configz\",\"/flagz\"]}\n"
        );
        let back: serde_json::Value =
            yaml_serde::from_str(&encode(&status.object("v1beta1"), Format::Yaml, false)).unwrap();
        assert_eq!((back["emulationVersion"].as_str(), back["uptimeSeconds"].as_u64()), (Some("1.36"), Some(75)));
        let flags: BTreeMap<String, String> = [("v".to_string(), "<2>".to_string())].into();
        let pretty = encode(&flagz_object("v1alpha1", &flags), Format::Json, true);
        assert_eq!(
            pretty,
            "{\n  \"kind\": \"Flagz\",\n  \"apiVersion\": \"config.k8s.io/v1alpha1\",\n  \"metadata\": {\n    \
             \"name\": \"kube-proxy\"\n  },\n  \"flags\": {\n    \"v\": \"\\u003c2\\u003e\"\n  }\n}"
        );
        let yaml = encode(&flagz_object("v1beta1", &flags), Format::Yaml, false);
        let keys: Vec<&str> =
            yaml.lines().filter(|l| !l.starts_with(' ')).filter_map(|l| l.split(':').next()).collect();
        assert_eq!(keys, ["apiVersion", "flags", "kind", "metadata"], "sorted, as sigs.k8s.io/yaml: {yaml}");
        let back: serde_json::Value = yaml_serde::from_str(&yaml).unwrap();
        assert_eq!(back["flags"]["v"], "<2>");
        assert_eq!(back["apiVersion"], "config.k8s.io/v1beta1");
    }

    fn body_text(resp: Response) -> String {
        String::from_utf8(resp.into_body().into_inner().unwrap_or_default().to_vec()).unwrap()
    }

    #[test]
    fn a_client_no_page_can_answer_gets_a_status() {
        let message = "only the following media types are accepted: application/json, application/yaml, text/plain";
        let resp = not_acceptable("application/json", false);
        assert_eq!(resp.status(), 406);
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/json");
        let body = body_text(resp);
        assert_eq!(
            body,
            format!(
                "{{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{{}},\"status\":\"Failure\",\
                 \"message\":\"{message}\",\"reason\":\"NotAcceptable\",\"code\":406}}\n"
            )
        );
        let resp = not_acceptable("text/html", false);
        let body = body_text(resp);
        assert_eq!(
            body,
            format!(
                "{{\n  \"metadata\": {{}},\n  \"status\": \"Failure\",\n  \"message\": \"{message}\",\n  \
                 \"reason\": \"NotAcceptable\",\n  \"code\": 406\n}}"
            )
        );
    }

    #[test]
    fn the_gates_choose_the_pages() {
        let flags: BTreeMap<String, String> = [("v".to_string(), "0".to_string())].into();
        let on = ZPages::new(&FeatureGates::defaults(), flags.clone(), SystemTime::now());
        assert!(DELIMITERS.contains(&on.delim));
        assert!(on.listed_paths().contains(&"/flagz".to_string()));
        assert_eq!(on.routes().paths().collect::<Vec<_>>(), ["/flagz", "/statusz"], "on by default since 1.36");
        let off: BTreeMap<String, bool> = [("ComponentFlagz".into(), false), ("ComponentStatusz".into(), false)].into();
        let (gates, _) = FeatureGates::from_map(&off).unwrap();
        let pages = ZPages::new(&gates, flags, SystemTime::now());
        assert!(pages.flags.is_none() && pages.started.is_none());
        assert!(!pages.listed_paths().contains(&"/flagz".to_string()));
        assert_eq!(pages.routes().paths().count(), 0);
    }

    /// `/statusz` lists the metrics server's real top-level paths.
    #[test]
    fn the_listed_paths_are_the_metrics_servers() {
        use crate::config::{KubeProxyConfiguration, ProxyMode};
        use crate::http::dashboard::{dashboard_routes, About};
        use crate::stats::StatsRegistry;
        use std::sync::Arc;
        let cfg = KubeProxyConfiguration::with_defaults();
        let registry = StatsRegistry::default();
        let metrics = Arc::new(crate::metrics::ProxyMetrics::new(ProxyMode::Iptables, registry.clone()));
        let health = Arc::new(crate::health::ProxyHealth::new(std::time::Duration::from_secs(60)));
        let about =
            About { mode: ProxyMode::Iptables, node: "node-a".into(), families: vec![crate::net::IpFamily::V4] };
        let routes = super::super::metrics_routes(metrics, ProxyMode::Iptables, super::super::Configz::new(&cfg))
            .merge(dashboard_routes(about, registry, health));
        let mut top: Vec<String> =
            routes.paths().filter_map(|p| p.split('/').nth(1)).map(|p| format!("/{p}")).collect();
        top.dedup();
        assert_eq!(top, SERVED_PATHS);
    }
}
