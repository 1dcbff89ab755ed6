//! Process plumbing every zlink binary shares: logging and shutdown signals.

use serde_json::{Map, Value};
use std::fmt;
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The runtime's shape and how many connections it serves at once, on the command line of both
/// redirect tiers.
#[derive(Debug, Clone, clap::Args)]
pub struct RuntimeArgs {
    /// Threads that run the async work, requests included (tokio workers); 0: one per CPU
    /// this process may use. Where the cores are shared with nginx, the other services and
    /// the load, fewer workers than cores cost less CPU per request: fewer wake-ups and
    /// context switches (the local topology runs 1 on its 2 cores;
    /// docs/performance-notebook.md).
    #[arg(long, env = "ZLINK_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
    /// HTTP connections served at once; past it a new connection's requests are answered `503`
    /// with `Retry-After: 1` at once, until a slot frees (zlink_redirect::serve).
    /// What connections and their requests hold (buffers, in-flight redirects) is bounded by
    /// this instead of by the load: an open-loop overload of 30,000 requests a second took
    /// primary from 18 to 312 MiB without it, to 96 MiB with 4,096. The nginx tiers in front
    /// keep far fewer open (keepalive 64 per upstream and worker). Past it, up to four times
    /// as many more (at least 16,384) are kept open only to be refused cheaply, about 4.5 KiB
    /// each with the kernel's share.
    #[arg(long, env = "ZLINK_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// After a shutdown signal new connections are refused at once, and the open ones are
    /// served for up to this long more, every answer asking the client to close the
    /// connection, ms (0: none). Longer than the upstream `keepalive_timeout` of the nginx in
    /// front (4 s), so nginx closes the connections it leaves idle itself: no request is sent
    /// on a connection as this process closes it (measured in a rolling restart without it:
    /// one create in 237 answered 503, a POST nginx could not retry after a reset).
    #[arg(long, env = "ZLINK_DRAIN_MS", default_value_t = 5000)]
    pub drain_ms: u64,
}

impl RuntimeArgs {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=1_000_000).contains(&self.max_connections) {
            return Err("--max-connections must be between 1 and 1000000".into());
        }
        if self.drain_ms > 600_000 {
            return Err("--drain-ms must be at most 600000".into());
        }
        Ok(())
    }
}

/// The multi-thread runtime a binary runs on: `workers` workers (0: one per CPU, or
/// `TOKIO_WORKER_THREADS`), I/O and timers on.
pub fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.enable_all();
    if workers > 0 {
        b.worker_threads(workers);
    }
    b.build()
}

/// `tracing` to stderr (stdout carries command output, e.g. a created API key), filtered by
/// `RUST_LOG` (default info), colours only on a terminal. With `ZLINK_LOG_FORMAT=json`, one
/// flat JSON object per line ([`FlatJson`]): the fields of every enclosing span (a request's
/// `trace_id`, `slug`…) at the top level beside the event's own.
pub fn init_tracing() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if std::env::var("ZLINK_LOG_FORMAT").as_deref() == Ok("json") {
        builder
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .init();
    } else {
        builder.init();
    }
}

/// One JSON object per event: `ts`, `level`, `span` (the innermost span's name), the fields of
/// every enclosing span (outer first, inner wins), `trace_id` of the task's current trace
/// (`trace::current`), then the event's fields (`message` among them). Span fields are kept
/// as JSON by [`JsonFields`] when the span opens and parsed only when an event is written, so
/// spans that log nothing cost no parsing.
pub struct FlatJson;

impl<S> FormatEvent<S, JsonFields> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut obj = Map::new();
        obj.insert(
            "ts".into(),
            chrono::Utc::now()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                .into(),
        );
        obj.insert(
            "level".into(),
            event
                .metadata()
                .level()
                .as_str()
                .to_ascii_lowercase()
                .into(),
        );
        if let Some(scope) = ctx.event_scope() {
            let mut innermost = None;
            for span in scope.from_root() {
                innermost = Some(span.name());
                let ext = span.extensions();
                if let Some(f) = ext.get::<FormattedFields<JsonFields>>() {
                    if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(f) {
                        obj.extend(fields);
                    }
                }
            }
            if let Some(name) = innermost {
                obj.insert("span".into(), name.into());
            }
        }
        // The request or message this task works on (see `trace::in_scope`).
        if let Some(t) = crate::trace::current() {
            obj.insert("trace_id".into(), t.trace_id().to_string().into());
        }
        event.record(&mut Fields(&mut obj));
        writeln!(writer, "{}", Value::Object(obj))
    }
}

/// An event's fields into a JSON object (strings escaped by serde_json).
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

/// A token cancelled on the first SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("shutdown signal received");
        t.cancel();
    });
    token
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_the_enclosing_spans_fields_at_the_top_level() {
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .finish();
        tracing::subscriber::with_default(sub, || {
            let outer = tracing::info_span!("redirect.handle", trace_id = "4bf9", slug = "x");
            let _o = outer.enter();
            let inner = tracing::info_span!("memcached.get", slug = "y\"</script>");
            let _i = inner.enter();
            tracing::warn!(status_code = 302u64, ok = true, "a \"quoted\" message");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["trace_id"], "4bf9");
        assert_eq!(line["slug"], "y\"</script>", "the inner span wins");
        assert_eq!(line["span"], "memcached.get");
        assert_eq!(line["level"], "warn");
        assert_eq!(line["status_code"], 302);
        assert_eq!(line["message"], "a \"quoted\" message");
        assert!(line["ts"].as_str().unwrap().ends_with('Z'));
    }
}
