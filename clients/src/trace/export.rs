//! OTLP export through the OpenTelemetry SDK: our spans (ids chosen by us, times measured
//! by us) become SDK `SpanData` handed to its batch processor, which posts them from its
//! own thread. The HTTP client is reqwest on the service's runtime.
use super::{Recording, TraceContext, Value};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanProcessor};
use std::time::{Duration, SystemTime};

pub struct Exporter {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
}

impl Exporter {
    pub fn new(endpoint: &str, service: &str) -> Result<Exporter, String> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| "trace export must start inside the Tokio runtime".to_string())?;
        let client = RuntimeClient {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .map_err(|e| format!("OTLP HTTP client: {e}"))?,
            handle,
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("OTLP exporter: {e}"))?;
        let mut processor = BatchSpanProcessor::builder(exporter).build();
        processor.set_resource(
            &opentelemetry_sdk::Resource::builder()
                .with_service_name(service.to_string())
                .build(),
        );
        Ok(Exporter {
            processor,
            scope: InstrumentationScope::builder("zlink").build(),
        })
    }

    pub fn record(&self, ctx: &TraceContext, r: Recording, end: SystemTime) {
        let attributes = r
            .attrs
            .into_iter()
            .map(|(k, v)| match v {
                Value::Str(s) => KeyValue::new(k, s),
                Value::Static(s) => KeyValue::new(k, s),
                Value::Int(i) => KeyValue::new(k, i),
                Value::Bool(b) => KeyValue::new(k, b),
            })
            .collect();
        self.processor.on_end(SpanData {
            span_context: SpanContext::new(
                TraceId::from(ctx.trace_id),
                SpanId::from(ctx.span_id),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::from(r.parent_span_id),
            parent_span_is_remote: r.remote_parent,
            span_kind: if r.remote_parent {
                SpanKind::Server
            } else {
                SpanKind::Internal
            },
            name: r.name.into(),
            start_time: r.start,
            end_time: end,
            attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: match r.error {
                Some(e) => Status::error(e),
                None => Status::Unset,
            },
            instrumentation_scope: self.scope.clone(),
        });
    }

    pub fn flush(&self) {
        if let Err(e) = self.processor.force_flush() {
            tracing::warn!(error = %e, "flushing spans failed");
        }
    }
}

/// OTLP's HTTP client: reqwest on the service's Tokio runtime (the SDK's batch thread
/// has none of its own).
#[derive(Debug)]
struct RuntimeClient {
    client: reqwest::Client,
    handle: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for RuntimeClient {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let request = reqwest::Request::try_from(request)?;
        let sent = self.handle.spawn(async move {
            let resp = client.execute(request).await?;
            let mut out = http::Response::builder().status(resp.status());
            if let Some(h) = out.headers_mut() {
                *h = resp.headers().clone();
            }
            let body = resp.bytes().await?;
            Ok::<_, reqwest::Error>(out.body(body))
        });
        Ok(sent.await???)
    }
}
