//! The HTTP surface: `GET|HEAD /{slug}` plus `/healthz`, `/readyz`, `/metrics`, `/stats`.
//! Status, `Location` and `Cache-Control` of redirects match what primary sends for the same
//! link (SYSTEM.md invariant 7); error bodies use primary's JSON shape.

use crate::lookup::{Answer, Lookup};
use crate::metrics::Metrics;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use zlink_clients::clicks::{self, Clicks};
use zlink_clients::now_ms;
use zlink_clients::trace::RequestTrace;
use zlink_wire::slug;

pub type Resp = Response<Full<Bytes>>;

pub struct State {
    pub lookup: Lookup,
    pub clicks: Arc<Clicks>,
    pub metrics: Arc<Metrics>,
    pub cache_control: HeaderValue,
    pub ready: AtomicBool,
    /// Tails the host nginx's rung-3 click log, when configured.
    pub nginx_log: Option<Arc<crate::nginxlog::Tailer>>,
    /// Proxies whose forwarding headers are believed (the host nginx).
    pub trusted: clicks::TrustedProxies,
}

fn json(status: StatusCode, body: serde_json::Value) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn error(status: StatusCode, code: &str, message: &str) -> Resp {
    json(
        status,
        serde_json::json!({"error": {"code": code, "message": message}}),
    )
}

fn gone() -> Resp {
    error(
        StatusCode::GONE,
        "gone",
        "this link has been disabled or has expired",
    )
}

async fn redirect(
    state: &State,
    slug: &str,
    peer: SocketAddr,
    method: &Method,
    headers: &http::HeaderMap,
    layer_out: &mut Option<&'static str>,
) -> Resp {
    if !slug::is_valid_slug(slug) {
        return error(StatusCode::NOT_FOUND, "not_found", "not found");
    }
    let answer = match state.lookup.resolve(slug).await {
        Ok((a, layer)) => {
            *layer_out = Some(layer);
            a
        }
        // Fast 503, so the nginx in front moves to the next rung.
        Err(_) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "a dependency is unavailable, retry later",
            )
        }
    };
    let target = match answer {
        Answer::Found(t) => t,
        Answer::Missing => return error(StatusCode::NOT_FOUND, "not_found", "not found"),
        Answer::Gone => return gone(),
    };
    let now = now_ms();
    if target.exp.is_some_and(|e| e <= now) {
        return gone();
    }
    let (Ok(location), Ok(code)) = (
        HeaderValue::from_str(&target.url),
        StatusCode::from_u16(target.code),
    ) else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        );
    };
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = code;
    r.headers_mut().insert(header::LOCATION, location);
    r.headers_mut()
        .insert(header::CACHE_CONTROL, state.cache_control.clone());
    r.headers_mut()
        .insert("x-zlink-tier", HeaderValue::from_static("lastresort"));
    // In the spool before the answer leaves; the id lets a client or a drill trace its click.
    // HEAD gets the same answer but is no click.
    if clicks::is_click(method) {
        let trace = zlink_clients::trace::current();
        if let Some(id) = state
            .clicks
            .record(slug, now, peer.ip(), headers, trace.as_ref())
        {
            r.headers_mut()
                .insert(clicks::CLICK_ID_HEADER, clicks::click_id_value(id));
        }
    }
    state.metrics.redirected(slug);
    r
}

async fn dispatch(state: Arc<State>, peer: SocketAddr, req: Request<Incoming>) -> Resp {
    // Rung 2 proper (the frontend failed this request over) or direct traffic (rung 4, probes).
    let via = if state.trusted.contains(peer.ip())
        && req.headers().contains_key(clicks::FAILOVER_HEADER)
    {
        "failover"
    } else {
        "direct"
    };
    let path = req.uri().path();
    let get_or_head = matches!(*req.method(), Method::GET | Method::HEAD);
    let resp = match path {
        "/healthz" if get_or_head => json(StatusCode::OK, serde_json::json!({"status": "ok"})),
        "/readyz" if get_or_head => {
            if state.ready.load(Ordering::Relaxed) {
                json(StatusCode::OK, serde_json::json!({"status": "ready"}))
            } else {
                json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({"status": "not_ready", "s3": "unreachable"}),
                )
            }
        }
        "/metrics" if get_or_head => {
            state.clicks.observe_metrics();
            let mut r = Response::new(Full::new(Bytes::from(state.metrics.render())));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        "/stats" if get_or_head => {
            let mut stats = state.metrics.stats(100);
            let spool = state.clicks.stats();
            stats["spool"] = serde_json::json!({
                "pending_clicks": spool.pending,
                "disk_bytes": spool.disk_bytes,
                "refused_full": spool.refused_full,
            });
            json(StatusCode::OK, stats)
        }
        _ => match path.strip_prefix('/') {
            Some(seg)
                if !seg.is_empty()
                    && !seg.contains('/')
                    && get_or_head
                    && !zlink_clients::trace::enabled() =>
            {
                redirect(&state, seg, peer, req.method(), req.headers(), &mut None).await
            }
            Some(seg) if !seg.is_empty() && !seg.contains('/') && get_or_head => {
                // Trusted proxies: the host nginx (which passes the frontend's traceparent on).
                let t = RequestTrace::start(
                    "redirect.handle",
                    "redirect",
                    state.trusted.contains(peer.ip()),
                    req.headers(),
                );
                let mut layer = None;
                let r = t
                    .run(std::pin::pin!(redirect(
                        &state,
                        seg,
                        peer,
                        req.method(),
                        req.headers(),
                        &mut layer,
                    )))
                    .await;
                t.finish(true, Some(seg), layer, r.status());
                r
            }
            Some(seg) if !seg.is_empty() && !seg.contains('/') => {
                let mut r = error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method_not_allowed",
                    "method not allowed",
                );
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
                r
            }
            _ => error(StatusCode::NOT_FOUND, "not_found", "not found"),
        },
    };
    state
        .metrics
        .requests
        .with_label_values(&[resp.status().as_str(), via])
        .inc();
    resp
}

/// Serves until `shutdown`, then drains in-flight requests for at most `grace`.
pub async fn serve(
    listener: TcpListener,
    state: Arc<State>,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            s = listener.accept() => match s {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let st = state.clone();
        let svc = hyper::service::service_fn(move |req| {
            let st = st.clone();
            async move { Ok::<_, Infallible>(dispatch(st, peer, req).await) }
        });
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), svc));
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(grace) => tracing::warn!("grace period over"),
    }
}
