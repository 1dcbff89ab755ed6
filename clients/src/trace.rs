//! Distributed traces (W3C Trace Context) and sampled request logs, shared by every tier.
//!
//! - A request's [`TraceContext`] comes from its `traceparent` header when a trusted proxy sent
//!   it (the frontend nginx starts one per request from `$request_id`), else is started here.
//! - It travels with the work: as the `traceparent` Kafka header of link events (primary's
//!   outbox → replicator → S3 write) and, when sampled, of clicks (spool record → replay), so
//!   every hop's spans and log lines carry the same `trace_id`.
//! - Within a process it is a task-local ([`in_scope`], [`current`]): every log line emitted
//!   while a request or message is handled has `trace_id` as a top-level field (JSON logs,
//!   [`crate::process::FlatJson`]).
//! - Spans ([`Span`]) are exported over OTLP/HTTP (protobuf, `<endpoint>/v1/traces`) only when
//!   `--otlp-endpoint` is set, and only for sampled traces: the parent's sampled flag, or the
//!   trace id under `--trace-sample-ratio` (a pure function of the id, so every tier picks the
//!   same traces without coordination). Without an endpoint a span is two random ids and no
//!   allocation.
//! - Redirect log lines are sampled ([`TraceArgs::log_sample_ratio`] of cache hits; store/S3
//!   reads and errors always).

use rand::Rng;
use std::fmt;
use std::sync::OnceLock;
use std::time::SystemTime;

/// The header (HTTP and Kafka) carrying a [`TraceContext`].
pub const TRACEPARENT: &str = "traceparent";
/// [`TRACEPARENT`] as an HTTP header name (a lookup by `&str` parses the name each time).
const TRACEPARENT_NAME: http::HeaderName = http::HeaderName::from_static(TRACEPARENT);

/// Tracing settings every service's command line shares.
#[derive(Debug, Clone, clap::Args)]
pub struct TraceArgs {
    /// OTLP/HTTP collector base URL (e.g. http://127.0.0.1:4318); spans go to
    /// `<endpoint>/v1/traces` as protobuf. Empty (the default): no span is exported; trace ids
    /// still travel and appear in logs.
    #[arg(long, env = "ZLINK_OTLP_ENDPOINT", default_value = "")]
    pub otlp_endpoint: String,
    /// Share of traces exported (0..=1) when no upstream already sampled them.
    #[arg(long, env = "ZLINK_TRACE_SAMPLE_RATIO", default_value_t = 0.01)]
    pub trace_sample_ratio: f64,
    /// Share of redirect hits from the local cache that are logged (0..=1); misses and errors
    /// are always logged.
    #[arg(long, env = "ZLINK_LOG_SAMPLE_RATIO", default_value_t = 0.01)]
    pub log_sample_ratio: f64,
    /// `off`: requests run without a trace (no context, spans, `trace_id` or redirect log
    /// lines); Kafka messages then carry no `traceparent`. A kill switch, and the baseline
    /// of the tracing cost benchmark.
    #[arg(long, env = "ZLINK_TRACES", default_value = "on", value_parser = ["on", "off"])]
    pub traces: String,
}

impl TraceArgs {
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("--trace-sample-ratio", self.trace_sample_ratio),
            ("--log-sample-ratio", self.log_sample_ratio),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must be between 0 and 1"));
            }
        }
        let e = self.otlp_endpoint.trim();
        if !(e.is_empty() || e.starts_with("http://") || e.starts_with("https://")) {
            return Err("--otlp-endpoint must be an http:// or https:// URL".into());
        }
        Ok(())
    }
}

/// One span's place in a trace: W3C `traceparent` version 00.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TraceContext {
    pub trace_id: u128,
    pub span_id: u64,
    pub sampled: bool,
}

/// The `traceparent` header of a Kafka message, if it has one (UTF-8).
pub fn kafka_traceparent<H: rdkafka::message::Headers>(headers: Option<&H>) -> Option<&str> {
    headers?
        .iter()
        .find(|h| h.key == TRACEPARENT)
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// A trace id printed as 32 lowercase hex digits, without allocating.
#[derive(Clone, Copy)]
pub struct TraceId(pub u128);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl TraceContext {
    /// Parses a `traceparent` value. Version 00 must be exactly `00-<32 hex>-<16 hex>-<2 hex>`;
    /// a later version may append fields after a dash (ignored), `ff` is invalid, as are
    /// all-zero ids and uppercase hex (W3C Trace Context §3.2).
    pub fn parse(v: &str) -> Option<TraceContext> {
        let b = v.trim().as_bytes();
        if b.len() < 55 || (b.len() > 55 && b[55] != b'-') {
            return None;
        }
        fn hex(s: &[u8]) -> Option<&str> {
            s.iter()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
                .then(|| std::str::from_utf8(s).ok())
                .flatten()
        }
        let version = hex(&b[0..2])?;
        if version == "ff" || (version == "00" && b.len() != 55) {
            return None;
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let trace_id = u128::from_str_radix(hex(&b[3..35])?, 16).ok()?;
        let span_id = u64::from_str_radix(hex(&b[36..52])?, 16).ok()?;
        let flags = u8::from_str_radix(hex(&b[53..55])?, 16).ok()?;
        (trace_id != 0 && span_id != 0).then_some(TraceContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// A new trace, sampled by [`TraceArgs::trace_sample_ratio`].
    pub fn root() -> TraceContext {
        let mut rng = rand::rng();
        let trace_id = rng.random::<u128>().max(1);
        TraceContext {
            trace_id,
            span_id: rng.random::<u64>().max(1),
            sampled: ratio_sampled(trace_id, settings().trace_sample_ratio),
        }
    }

    /// The context of a request or message that arrived with `traceparent` (a remote parent),
    /// or a new root. An unsampled parent may still be sampled by ratio: the decision is a
    /// function of the trace id, the same on every tier.
    pub fn continue_from(parent: Option<&str>) -> TraceContext {
        match parent.and_then(TraceContext::parse) {
            Some(p) => TraceContext::continue_from_parsed(p),
            None => TraceContext::root(),
        }
    }

    fn continue_from_parsed(p: TraceContext) -> TraceContext {
        TraceContext {
            sampled: p.sampled || ratio_sampled(p.trace_id, settings().trace_sample_ratio),
            ..p
        }
    }

    /// A child: same trace and decision, new span id.
    pub fn child(&self) -> TraceContext {
        TraceContext {
            span_id: rand::rng().random::<u64>().max(1),
            ..*self
        }
    }

    pub fn trace_id(&self) -> TraceId {
        TraceId(self.trace_id)
    }

    /// The `traceparent` value naming this span as the parent of the next hop.
    pub fn header(&self) -> String {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        )
    }
}

/// True for the share `ratio` of trace ids: the id's low 64 bits (random in every W3C id)
/// against the ratio's share of their range.
fn ratio_sampled(trace_id: u128, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    let bound = (ratio.max(0.0) * u64::MAX as f64) as u64;
    (trace_id as u64) < bound
}

/// The process's trace settings: set once by [`init`]; defaults (nothing exported, 1% sampled)
/// until then, e.g. in unit tests.
struct Settings {
    enabled: bool,
    trace_sample_ratio: f64,
    log_sample_ratio: f64,
    exporter: Option<export::Exporter>,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

fn settings() -> &'static Settings {
    SETTINGS.get_or_init(|| Settings {
        enabled: true,
        trace_sample_ratio: 0.01,
        log_sample_ratio: 0.01,
        exporter: None,
    })
}

/// Applies `args` for this process (`service` names it in exported spans). Call once, inside
/// the Tokio runtime, before serving; a second call is ignored.
pub fn init(args: &TraceArgs, service: &str) -> Result<(), String> {
    args.validate()?;
    let endpoint = args.otlp_endpoint.trim();
    let exporter = if endpoint.is_empty() {
        None
    } else {
        Some(export::Exporter::new(endpoint, service)?)
    };
    if SETTINGS
        .set(Settings {
            enabled: args.traces != "off",
            trace_sample_ratio: args.trace_sample_ratio,
            log_sample_ratio: args.log_sample_ratio,
            exporter,
        })
        .is_err()
    {
        tracing::warn!("trace settings were already applied; ignoring the second init");
    } else if !endpoint.is_empty() {
        tracing::info!(
            endpoint,
            ratio = args.trace_sample_ratio,
            "exporting spans over OTLP"
        );
    }
    Ok(())
}

/// Whether requests are traced (`--traces`, on unless turned off).
pub fn enabled() -> bool {
    settings().enabled
}

/// Sends the spans still buffered (at shutdown; bounded by the exporter's timeout).
pub fn flush() {
    if let Some(e) = &settings().exporter {
        e.flush();
    }
}

/// Whether a redirect hit from the local cache is logged this time.
pub fn log_hit() -> bool {
    let r = settings().log_sample_ratio;
    r >= 1.0 || (r > 0.0 && rand::rng().random::<f64>() < r)
}

/// An attribute value of a span.
#[derive(Debug, Clone)]
pub enum Value {
    Str(String),
    Static(&'static str),
    Int(i64),
    Bool(bool),
}

impl From<&'static str> for Value {
    fn from(v: &'static str) -> Self {
        Value::Static(v)
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<u16> for Value {
    fn from(v: u16) -> Self {
        Value::Int(i64::from(v))
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

/// One unit of work in a trace (`redirect.handle`, `memcached.get`, `s3.put`…). Its
/// [`ctx`](Span::ctx) is what children and the next hop continue from. Recorded only when the
/// trace is sampled and an exporter is configured; otherwise attributes are dropped unread.
pub struct Span {
    ctx: TraceContext,
    recording: Option<Box<Recording>>,
}

struct Recording {
    name: &'static str,
    parent_span_id: u64,
    /// The parent came from another process (header), not from a span of ours.
    remote_parent: bool,
    start: SystemTime,
    attrs: Vec<(&'static str, Value)>,
    error: Option<String>,
}

tokio::task_local! {
    /// The trace of the request or message this task is working on.
    static CURRENT: TraceContext;
}

/// Runs `fut` with `ctx` as the [`current`] trace (what [`Span::in_current`] continues).
pub async fn in_scope<F: std::future::Future>(ctx: TraceContext, fut: F) -> F::Output {
    CURRENT.scope(ctx, fut).await
}

/// The trace of the work this task is doing, if it runs under [`in_scope`].
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(|c| *c).ok()
}

impl Span {
    /// The first span of work that arrived over the network: a child of the caller's span when
    /// it sent a valid `traceparent` (pass `None` for callers that are not trusted), else the
    /// root of a new trace.
    pub fn server(name: &'static str, traceparent: Option<&str>) -> Span {
        if let Some(parent) = traceparent.and_then(TraceContext::parse) {
            return Span::start(name, &TraceContext::continue_from_parsed(parent), true);
        }
        // A root: the new trace's first span id is this span's, and it has no parent.
        let ctx = TraceContext::root();
        let mut s = Span::start(name, &ctx, false);
        s.ctx = ctx;
        if let Some(r) = &mut s.recording {
            r.parent_span_id = 0;
        }
        s
    }

    /// A child of the [`current`] trace (or a new root outside any).
    pub fn in_current(name: &'static str) -> Span {
        match current() {
            Some(c) => Span::start(name, &c, false),
            None => Span::server(name, None),
        }
    }

    /// A child span of `parent` (a span of this process).
    pub fn child(name: &'static str, parent: &TraceContext) -> Span {
        Span::start(name, parent, false)
    }

    /// The first span of this process for work that arrived with `parent` (from a header).
    pub fn remote_child(name: &'static str, parent: &TraceContext) -> Span {
        Span::start(name, parent, true)
    }

    fn start(name: &'static str, parent: &TraceContext, remote_parent: bool) -> Span {
        let ctx = parent.child();
        let recording = (ctx.sampled && settings().exporter.is_some()).then(|| {
            Box::new(Recording {
                name,
                parent_span_id: parent.span_id,
                remote_parent,
                start: SystemTime::now(),
                attrs: Vec::new(),
                error: None,
            })
        });
        Span { ctx, recording }
    }

    pub fn ctx(&self) -> &TraceContext {
        &self.ctx
    }

    pub fn is_recording(&self) -> bool {
        self.recording.is_some()
    }

    /// Sets an attribute (ignored unless recording).
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(r) = &mut self.recording {
            r.attrs.push((key, value.into()));
        }
    }

    /// Marks the span failed (ignored unless recording).
    pub fn fail(&mut self, error: &dyn fmt::Display) {
        if let Some(r) = &mut self.recording {
            r.error = Some(error.to_string());
        }
    }

    /// Ends the span now (dropping it does the same).
    pub fn end(self) {}
}

impl Drop for Span {
    fn drop(&mut self) {
        if let (Some(r), Some(e)) = (self.recording.take(), &settings().exporter) {
            e.record(&self.ctx, *r, SystemTime::now());
        }
    }
}

/// One incoming request's trace, the same on both redirect tiers: the server span
/// (`redirect.handle`, continued from a trusted proxy's `traceparent`), the task-local context
/// that children and every log line inside pick up (`trace_id` in JSON logs, see
/// [`crate::process::FlatJson`]), and at the end the span's attributes and the sampled
/// redirect log line.
///
/// No `tracing` span per request: with the JSON formatter one cost a third of a cached
/// redirect's CPU (`deploy/local/bench-observability`); the task-local costs a swap per poll.
pub struct RequestTrace {
    span: Span,
    started: std::time::Instant,
}

/// The label of a lookup answered from the process's own memory.
pub const LAYER_LOCAL: &str = "local";
/// ...from the shared memcached.
pub const LAYER_MEMCACHED: &str = "memcached";
/// ...from an entry kept for outages (lastresort, while S3 is unreachable).
pub const LAYER_STALE: &str = "stale";

/// Lookups answered by a cache (the process's own, the shared memcached, or a stale entry kept
/// for outages): their redirect log lines are sampled; a store or S3 read is always logged.
pub fn is_cache_hit(layer: &str) -> bool {
    matches!(layer, LAYER_LOCAL | LAYER_MEMCACHED | LAYER_STALE)
}

impl RequestTrace {
    /// `trusted`: the peer is a trusted proxy, so its `traceparent` is continued.
    pub fn start(
        name: &'static str,
        route: &'static str,
        trusted: bool,
        headers: &http::HeaderMap,
    ) -> Self {
        let parent = trusted
            .then(|| headers.get(TRACEPARENT_NAME))
            .flatten()
            .and_then(|v| v.to_str().ok());
        let mut span = Span::server(name, parent);
        span.set("http.route", route);
        RequestTrace {
            span,
            started: std::time::Instant::now(),
        }
    }

    pub fn ctx(&self) -> &TraceContext {
        self.span.ctx()
    }

    /// Runs the handler under this trace (its [`current`] context). The handler is pinned
    /// by the caller (`std::pin::pin!`) and passed by reference: a redirect's future is large,
    /// and moving it into the scope's future copied it on every request.
    pub async fn run<F: std::future::Future>(&self, fut: std::pin::Pin<&mut F>) -> F::Output {
        in_scope(*self.span.ctx(), fut).await
    }

    /// Ends the request: span attributes (`slug` only if well-formed, `cache_layer`,
    /// `status_code`), failed if 5xx; for a redirect, one log line — always for reads past the
    /// caches and for errors, sampled ([`TraceArgs::log_sample_ratio`]) for cache hits.
    pub fn finish(
        mut self,
        redirect: bool,
        slug: Option<&str>,
        layer: Option<&'static str>,
        status: http::StatusCode,
    ) {
        let slug = slug.filter(|s| zlink_wire::slug::is_valid_slug(s));
        let code = status.as_u16();
        self.span.set("status_code", code);
        if let Some(s) = slug.filter(|_| self.span.is_recording()) {
            self.span.set("slug", s.to_string());
        }
        if let Some(l) = layer {
            self.span.set("cache_layer", l);
        }
        if status.is_server_error() {
            self.span.fail(&status);
        }
        if redirect && (!layer.is_some_and(is_cache_hit) || code >= 400 || log_hit()) {
            tracing::info!(
                event = "redirect",
                trace_id = %self.span.ctx().trace_id(),
                slug = slug.unwrap_or(""),
                cache_layer = layer.unwrap_or("none"),
                status_code = code,
                latency_ms = self.started.elapsed().as_secs_f64() * 1000.0,
            );
        }
    }
}

mod export;

#[cfg(test)]
mod tests;
