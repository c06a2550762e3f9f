//! The daemon's logs: tracing to stderr, klog-style `-v` verbosity, and
//! component-base's two formats: `text` (tracing's own lines) and `json`
//! (klog's JSON lines, [`json_line`]). Both, and the verbosity, follow the
//! effective configuration once it is loaded ([`apply`]): the command
//! line's `--logging-format`/`-v` until then, then the `logging` section
//! (file or flags), again on every reload.

use std::io::IsTerminal;
use std::sync::OnceLock;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::writer::MakeWriterExt;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::{Layered, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

use crate::config::LoggingConfiguration;

/// The output format (`logging.format`, `--logging-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    /// `json` is JSON; anything else (validation allows only `text`) is text.
    pub fn parse(name: &str) -> LogFormat {
        if name == "json" {
            LogFormat::Json
        } else {
            LogFormat::Text
        }
    }
}

type Filtered = Layered<reload::Layer<EnvFilter, Registry>, Registry>;
type Output = Box<dyn Layer<Filtered> + Send + Sync>;

struct Handles {
    filter: reload::Handle<EnvFilter, Registry>,
    output: reload::Handle<Output, Filtered>,
}

/// The running subscriber's swappable parts.
static HANDLES: OnceLock<Handles> = OnceLock::new();

fn filter_for(verbosity: u32) -> EnvFilter {
    let level = match verbosity {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    };
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(format!("warn,kube_proxy_rs={level}")))
}

/// The writer of one format: stderr, or (splitStream) errors to stderr and
/// everything else to stdout, as component-base's split streams.
fn output(format: LogFormat, split_stream: bool) -> Output {
    let layer = tracing_subscriber::fmt::layer();
    match (format, split_stream) {
        (LogFormat::Json, false) => layer.event_format(KlogJson).with_writer(std::io::stderr).boxed(),
        (LogFormat::Json, true) => layer.event_format(KlogJson).with_writer(split_writer()).boxed(),
        (LogFormat::Text, false) => {
            layer.with_ansi(std::io::stderr().is_terminal()).with_writer(std::io::stderr).boxed()
        }
        (LogFormat::Text, true) => layer.with_ansi(false).with_writer(split_writer()).boxed(),
    }
}

fn split_writer() -> impl for<'w> MakeWriter<'w> + Send + Sync + 'static {
    std::io::stderr.with_max_level(Level::ERROR).or_else(std::io::stdout)
}

/// Sets up tracing: klog-style `-v` verbosity (0-1 info, 2-3 debug, 4+
/// trace for our own logs; `RUST_LOG` overrides), lines on stderr in
/// `format`. A second call (tests) keeps the first subscriber.
pub fn init(verbosity: u32, format: LogFormat) {
    let (filter, filter_handle) = reload::Layer::new(filter_for(verbosity));
    let (out, output_handle) = reload::Layer::new(output(format, false));
    if tracing_subscriber::registry().with(filter).with(out).try_init().is_ok() {
        let _ = HANDLES.set(Handles { filter: filter_handle, output: output_handle });
    }
}

/// Applies the effective `logging` section: verbosity, format and the
/// format's splitStream.
pub fn apply(logging: &LoggingConfiguration) {
    set_verbosity(logging.verbosity);
    let format = LogFormat::parse(&logging.format);
    let options = match format {
        LogFormat::Json => &logging.options.json,
        LogFormat::Text => &logging.options.text,
    };
    if let Some(h) = HANDLES.get() {
        if let Err(e) = h.output.reload(output(format, options.split_stream)) {
            tracing::warn!(error = %e, "could not change the log format");
        }
    }
}

/// Changes the log verbosity of the running daemon.
pub fn set_verbosity(verbosity: u32) {
    if let Some(h) = HANDLES.get() {
        if let Err(e) = h.filter.reload(filter_for(verbosity)) {
            tracing::warn!(error = %e, "could not change the log verbosity");
        }
    }
}

/// klog's verbosity of an event at `level`, as `-v` maps to levels:
/// `None` for errors (klog's `ErrorS` lines carry `err`, not `v`).
fn klog_v(level: Level) -> Option<u64> {
    match level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(2),
        Level::TRACE => Some(4),
    }
}

/// One JSON line as component-base's JSON logger (zap through zapr) writes
/// it: `ts` (milliseconds since the epoch, a float, as its
/// `epochMillisTimeEncoder`), `caller`, `msg`, then `v` for an info line,
/// the key/values in order, and `err` last on an error line. The key
/// `error` is klog's `err`.
pub fn json_line(ts_millis: f64, caller: Option<&str>, level: Level, msg: &str, fields: &[(String, Value)]) -> String {
    let mut entries: Vec<(&str, Value)> = vec![("ts", Value::from(ts_millis))];
    if let Some(caller) = caller {
        entries.push(("caller", Value::from(caller)));
    }
    entries.push(("msg", Value::from(msg)));
    let v = klog_v(level);
    if let Some(v) = v {
        entries.push(("v", Value::from(v)));
    }
    let mut err = None;
    for (key, value) in fields {
        match key.as_str() {
            "error" | "err" if v.is_none() => err = Some(value.clone()),
            "error" => entries.push(("err", value.clone())),
            key => entries.push((key, value.clone())),
        }
    }
    entries.extend(err.map(|e| ("err", e)));
    let mut line = String::from("{");
    for (i, (key, value)) in entries.iter().enumerate() {
        if i > 0 {
            line.push(',');
        }
        line.push_str(&Value::from(*key).to_string());
        line.push(':');
        line.push_str(&value.to_string());
    }
    line.push_str("}\n");
    line
}

/// The event's message and key/values, in order.
#[derive(Default)]
struct Fields {
    msg: String,
    kv: Vec<(String, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.msg = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
        } else {
            self.kv.push((field.name().to_string(), value));
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::from(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::from(format!("{value:?}")));
    }
}

/// tracing-subscriber's event formatter for [`json_line`].
struct KlogJson;

impl<S, N> FormatEvent<S, N> for KlogJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, _ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> std::fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let caller = meta.file().map(|f| format!("{f}:{}", meta.line().unwrap_or(0)));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let ts_millis = now.as_nanos() as f64 / 1e6;
        writer.write_str(&json_line(ts_millis, caller.as_deref(), *meta.level(), &fields.msg, &fields.kv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JSON object's entries in the order the line has them.
    struct Ordered(Vec<(String, Value)>);

    impl<'de> serde::Deserialize<'de> for Ordered {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Ordered;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                    let mut entries = Vec::new();
                    while let Some(entry) = map.next_entry()? {
                        entries.push(entry);
                    }
                    Ok(Ordered(entries))
                }
            }
            d.deserialize_map(V)
        }
    }

    impl std::ops::Index<&str> for Ordered {
        type Output = Value;
        fn index(&self, key: &str) -> &Value {
            self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v).unwrap_or(&Value::Null)
        }
    }

    fn parse(line: &str) -> Ordered {
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'), "one line: {line:?}");
        serde_json::from_str(line).unwrap()
    }

    fn keys(o: &Ordered) -> Vec<&str> {
        o.0.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn an_info_line_has_klogs_keys_in_klogs_order() {
        let kv = [("node".to_string(), Value::from("node-a")), ("count".to_string(), Value::from(3))];
        let line = json_line(1580306777047.28, Some("src/runtime.rs:42"), Level::INFO, "Starting", &kv);
        let o = parse(&line);
        assert_eq!(keys(&o), ["ts", "caller", "msg", "v", "node", "count"]);
        assert_eq!(o["ts"], Value::from(1580306777047.28));
        assert_eq!((o["caller"].as_str(), o["msg"].as_str()), (Some("src/runtime.rs:42"), Some("Starting")));
        assert_eq!((o["v"].as_u64(), o["count"].as_u64()), (Some(0), Some(3)));
    }

    #[test]
    fn verbosity_follows_the_level() {
        for (level, v) in [(Level::WARN, 0), (Level::DEBUG, 2), (Level::TRACE, 4)] {
            assert_eq!(parse(&json_line(1.0, None, level, "m", &[]))["v"], Value::from(v), "{level}");
        }
    }

    #[test]
    fn an_error_line_has_err_last_and_no_v() {
        let kv = [("error".to_string(), Value::from("timeout")), ("pod".to_string(), Value::from("p"))];
        let o = parse(&json_line(1.5, Some("src/main.rs:1"), Level::ERROR, "Failed to update", &kv));
        assert_eq!(keys(&o), ["ts", "caller", "msg", "pod", "err"]);
        assert_eq!(o["err"], Value::from("timeout"));
        let o = parse(&json_line(1.5, None, Level::ERROR, "failed complete: x", &[]));
        assert_eq!(keys(&o), ["ts", "msg"]);
        // On an info line the error key is still klog's.
        let o = parse(&json_line(1.5, None, Level::INFO, "retrying", &kv[..1]));
        assert_eq!(keys(&o), ["ts", "msg", "v", "err"]);
    }

    #[test]
    fn messages_and_values_are_escaped() {
        let kv = [("path".to_string(), Value::from("a\"b\nc"))];
        let o = parse(&json_line(1.0, None, Level::INFO, "quote \" and\nnewline", &kv));
        assert_eq!((o["msg"].as_str(), o["path"].as_str()), (Some("quote \" and\nnewline"), Some("a\"b\nc")));
    }

    #[test]
    fn the_formatter_writes_tracing_events_as_klog_json() {
        use std::sync::{Arc, Mutex};
        let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = buf.clone();
        let make = move || SinkWriter(sink.clone());
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().event_format(KlogJson).with_writer(make));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(ip_family = "IPv4", count = 2u64, ok = true, "synced");
            let e = std::io::Error::other("boom");
            tracing::error!(error = %e, "sync failed");
        });
        let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let info = parse(&format!("{}\n", lines[0]));
        assert_eq!(keys(&info), ["ts", "caller", "msg", "v", "ip_family", "count", "ok"]);
        assert!(info["caller"].as_str().unwrap().starts_with("src/logging.rs:"), "{}", lines[0]);
        let ts = info["ts"].as_f64().unwrap();
        assert!(ts > 1.7e12 && ts < 1e13, "milliseconds since the epoch: {ts}");
        let err = parse(&format!("{}\n", lines[1]));
        assert_eq!(keys(&err), ["ts", "caller", "msg", "err"]);
        assert_eq!(err["err"], Value::from("boom"));
    }

    struct SinkWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for SinkWriter {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(b);
            Ok(b.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
