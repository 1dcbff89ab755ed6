//! The ops endpoints every service answers, implemented once: `/healthz` (alive), `/readyz`
//! (200 ready, or 503 naming the dependency that is not), `/metrics` (Prometheus text).
//! Readiness is each service's own (primary pings its store; lastresort and the background
//! services probe in the background and keep a flag, so a probe never waits on a dependency);
//! how it is answered is here. The background services (replicator, click counter) serve these
//! on a listener of their own ([`serve`]); primary and lastresort route them beside their
//! redirects.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// An ops answer.
pub type OpsResponse = Response<Full<Bytes>>;

/// What `/readyz` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Not ready because `dependency` is in `state` (e.g. `"store"`, `"timeout"`): shown as
    /// `{"status": "not_ready", "<dependency>": "<state>"}`; fixed words, never error text.
    NotReady {
        dependency: &'static str,
        state: &'static str,
    },
}

fn respond(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> OpsResponse {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // A probe's answer is about now: no cache keeps it.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// A JSON answer that no cache keeps: every tier's errors, probes and API answers.
pub fn json<T: serde::Serialize + ?Sized>(status: StatusCode, body: &T) -> OpsResponse {
    // Serializing fails only for a map with keys that are not strings, which no body has.
    match serde_json::to_vec(body) {
        Ok(b) => respond(status, "application/json", b),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the answer could not be written",
        ),
    }
}

/// The one JSON error body of every tier: `{"error": {"code": ..., "message": ...}}`.
pub fn error(status: StatusCode, code: &str, message: &str) -> OpsResponse {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    respond(status, "application/json", body.to_string().into_bytes())
}

/// `GET /healthz`: the process is alive.
pub fn healthz() -> OpsResponse {
    json(StatusCode::OK, &serde_json::json!({"status": "ok"}))
}

/// `GET /readyz`: 200 when ready, else 503 naming what is not.
pub fn readyz(readiness: Readiness) -> OpsResponse {
    match readiness {
        Readiness::Ready => json(StatusCode::OK, &serde_json::json!({"status": "ready"})),
        Readiness::NotReady { dependency, state } => {
            let mut body = serde_json::json!({"status": "not_ready"});
            body[dependency] = state.into();
            json(StatusCode::SERVICE_UNAVAILABLE, &body)
        }
    }
}

/// `GET /metrics`: a rendered registry ([`render`]) in the Prometheus text format.
pub fn metrics(body: Vec<u8>) -> OpsResponse {
    respond(StatusCode::OK, "text/plain; version=0.0.4", body)
}

/// The state a background service's ops endpoint answers from.
pub struct Ops {
    /// Renders the service's registry in the Prometheus text format.
    render: Box<dyn Fn() -> Vec<u8> + Send + Sync>,
    /// Set by the service's own background probe.
    readiness: Mutex<Readiness>,
}

impl Ops {
    /// Not ready until the service's first probe says otherwise.
    pub fn new(render: Box<dyn Fn() -> Vec<u8> + Send + Sync>) -> Self {
        Ops {
            render,
            readiness: Mutex::new(Readiness::NotReady {
                dependency: "startup",
                state: "probing",
            }),
        }
    }

    pub fn set_readiness(&self, r: Readiness) {
        *self.readiness.lock().unwrap_or_else(|e| e.into_inner()) = r;
    }

    pub fn readiness(&self) -> Readiness {
        *self.readiness.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Readiness {
    /// Ready when every `(dependency, up)` is up; else not ready naming the first that is down
    /// (as `unavailable`).
    pub fn of(dependencies: &[(&'static str, bool)]) -> Readiness {
        match dependencies.iter().find(|(_, up)| !up) {
            None => Readiness::Ready,
            Some((dependency, _)) => Readiness::NotReady {
                dependency,
                state: "unavailable",
            },
        }
    }
}

fn handle(ops: &Ops, req: &Request<Incoming>) -> OpsResponse {
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed",
        );
    }
    match req.uri().path() {
        "/healthz" => healthz(),
        "/readyz" => readyz(ops.readiness()),
        "/metrics" => metrics((ops.render)()),
        _ => error(StatusCode::NOT_FOUND, "not_found", "not found"),
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
/// Registers every collector given (a clone: clones share their values) in `registry`; a name
/// registered twice is a programming error and panics at start-up.
#[macro_export]
macro_rules! register_metrics {
    ($registry:expr, $($collector:expr),+ $(,)?) => {{
        $(
            $registry
                .register(Box::new($collector.clone()))
                .expect("metric registered once");
        )+
    }};
}

pub fn render(registry: &prometheus::Registry) -> Vec<u8> {
    use prometheus::Encoder;
    let mut out = Vec::new();
    // Encoding into a Vec cannot fail for well-formed metrics.
    let _ = prometheus::TextEncoder::new().encode(&registry.gather(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body(r: OpsResponse) -> serde_json::Value {
        let b = r.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&b).unwrap()
    }

    #[tokio::test]
    async fn readiness_names_the_dependency_and_nothing_is_cached() {
        let r = readyz(Readiness::NotReady {
            dependency: "store",
            state: "timeout",
        });
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::CACHE_CONTROL], "no-store");
        assert_eq!(
            body(r).await,
            serde_json::json!({"status": "not_ready", "store": "timeout"})
        );
        let r = readyz(Readiness::Ready);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(body(r).await, serde_json::json!({"status": "ready"}));
        assert_eq!(body(healthz()).await, serde_json::json!({"status": "ok"}));
        assert_eq!(
            Readiness::of(&[("s3", true), ("store", false), ("kafka", false)]),
            Readiness::NotReady {
                dependency: "store",
                state: "unavailable"
            }
        );
        assert_eq!(Readiness::of(&[("store", true)]), Readiness::Ready);
        let m = metrics(b"x 1\n".to_vec());
        assert_eq!(
            m.headers()[header::CONTENT_TYPE],
            "text/plain; version=0.0.4"
        );
    }
}
