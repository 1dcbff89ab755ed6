//! The ops endpoint of the background services (replicator, click counter): `/healthz`,
//! `/readyz`, `/metrics`. Readiness is probed by the service in the background and stored in
//! [`Ops::ready`], so a probe never waits on a dependency.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub struct Ops {
    /// Renders the service's registry in the Prometheus text format.
    pub render: Box<dyn Fn() -> Vec<u8> + Send + Sync>,
    pub ready: AtomicBool,
}

fn respond(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn handle(ops: &Ops, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let json = "application/json";
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => respond(StatusCode::OK, json, br#"{"status":"ok"}"#.to_vec()),
        (&Method::GET, "/readyz") if ops.ready.load(Ordering::Relaxed) => {
            respond(StatusCode::OK, json, br#"{"status":"ready"}"#.to_vec())
        }
        (&Method::GET, "/readyz") => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            json,
            br#"{"status":"not_ready"}"#.to_vec(),
        ),
        (&Method::GET, "/metrics") => {
            respond(StatusCode::OK, "text/plain; version=0.0.4", (ops.render)())
        }
        _ => respond(
            StatusCode::NOT_FOUND,
            json,
            br#"{"error":{"code":"not_found","message":"not found"}}"#.to_vec(),
        ),
    }
}

pub async fn serve(listener: TcpListener, ops: Arc<Ops>, shutdown: CancellationToken) {
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            s = listener.accept() => match s {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning on the error.
                    tracing::warn!(error = %e, "ops accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let ops = ops.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let ops = ops.clone();
                async move { Ok::<_, Infallible>(handle(&ops, &req)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Prometheus text exposition of a registry.
pub fn render(registry: &prometheus::Registry) -> Vec<u8> {
    use prometheus::Encoder;
    let mut out = Vec::new();
    // Encoding into a Vec cannot fail for well-formed metrics.
    let _ = prometheus::TextEncoder::new().encode(&registry.gather(), &mut out);
    out
}
