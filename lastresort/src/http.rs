//! The HTTP surface: `GET|HEAD /{slug}` (the redirect kit's pipeline with this tier's lookup
//! chain and click spool) plus `/healthz`, `/readyz`, `/metrics`, `/stats`. Redirects and
//! errors are the kit's, so they match what primary sends for the same link (SYSTEM.md
//! invariant 7) by construction.

use crate::lookup::Resolver;
use crate::metrics::Metrics;
use http::{HeaderValue, Method, Request, StatusCode};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use zlink_clients::clicks::{self, Clicks};
use zlink_clients::clock::Clock;
use zlink_clients::ops::{self, Readiness};
use zlink_clients::trace::{self, RequestTrace};
use zlink_redirect::decide::Outcome;
use zlink_redirect::error::json;
use zlink_redirect::pipeline::{self, RedirectTier};
use zlink_redirect::{Peer, Reject, Resp};
use zlink_wire::domain::Hosts;

pub struct State {
    pub lookup: Resolver,
    pub clicks: Arc<Clicks>,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub cache_control: HeaderValue,
    pub ready: AtomicBool,
    /// Tails the host nginx's rung-3 click log, when configured.
    pub nginx_log: Option<Arc<crate::nginxlog::Tailer>>,
    /// Proxies whose forwarding headers are believed (the host nginx).
    pub trusted: clicks::TrustedProxies,
    /// Country and city of a click's client (`--geoip-db`).
    pub geo: Arc<zlink_clients::geo::Geo>,
    /// The default domain's host names (`--short-domains`); other names are branded domains.
    pub hosts: Hosts,
    /// Connections served at once (`--max-connections`).
    pub max_connections: usize,
    /// How long the open connections are served after shutdown (`--drain-ms`).
    pub drain: std::time::Duration,
}

impl RedirectTier for State {
    const NAME: &'static str = "lastresort";
    type Answer = Outcome;

    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn cache_control(&self) -> &HeaderValue {
        &self.cache_control
    }

    fn hosts(&self) -> &Hosts {
        &self.hosts
    }

    /// The fresh cache's answer, if it holds one (the hot path: no loader, no timer).
    async fn cached(&self, key: &str) -> Option<Outcome> {
        self.lookup.cached(key).await
    }

    /// Fresh cache → memcached-lr → S3 (stale entries while S3 is down); with none of them,
    /// a fast 503 so the nginx in front moves to the next rung.
    async fn lookup(&self, key: &str) -> Result<(Outcome, &'static str), Reject> {
        self.lookup
            .resolve(key)
            .await
            .map_err(|_| Reject::Unavailable)
    }

    /// In the spool before the answer leaves; the id lets a client or a drill trace its click.
    fn click<B>(&self, req: &Request<B>, key: &str, now_ms: i64) -> Option<uuid::Uuid> {
        let trace = trace::current();
        self.clicks.record(
            key,
            now_ms,
            Peer::ip_of(req),
            req.headers(),
            trace.as_ref(),
            &self.geo,
        )
    }

    fn done(&self, key: Option<&str>, resp: &Resp, _: Duration) {
        if let (Some(key), true) = (key, resp.status().is_redirection()) {
            self.metrics.redirected(key);
        }
    }
}

async fn dispatch(state: Arc<State>, req: Request<Incoming>) -> Resp {
    let peer = Peer::ip_of(&req);
    // Rung 2 proper (the frontend failed this request over) or direct traffic (rung 4, probes).
    let via = if state.trusted.contains(peer) && req.headers().contains_key(clicks::FAILOVER) {
        "failover"
    } else {
        "direct"
    };
    let path = req.uri().path();
    let get_or_head = matches!(*req.method(), Method::GET | Method::HEAD);
    let resp = match path {
        "/healthz" if get_or_head => ops::healthz(),
        "/readyz" if get_or_head => ops::readyz(match state.ready.load(Ordering::Relaxed) {
            true => Readiness::Ready,
            false => Readiness::NotReady {
                dependency: "s3",
                state: "unreachable",
            },
        }),
        "/metrics" if get_or_head => {
            state.clicks.observe_metrics();
            ops::metrics(state.metrics.render())
        }
        "/stats" if get_or_head => {
            let mut stats = state.metrics.stats(100);
            let spool = state.clicks.stats();
            stats["spool"] = serde_json::json!({
                "pending_clicks": spool.pending,
                "disk_bytes": spool.disk_bytes,
                "refused_full": spool.refused_full,
            });
            json(StatusCode::OK, &stats)
        }
        _ => match path.strip_prefix('/') {
            Some(slug) if !slug.is_empty() && !slug.contains('/') && get_or_head => {
                if trace::enabled() {
                    // Trusted proxies: the host nginx (which passes the frontend's traceparent).
                    let t = RequestTrace::start(
                        "redirect.handle",
                        "redirect",
                        state.trusted.contains(peer),
                        req.headers(),
                    );
                    pipeline::traced(t, true, Some(slug), pipeline::answer(&*state, &req, slug))
                        .await
                } else {
                    pipeline::redirect(&*state, &req, slug).await
                }
            }
            Some(slug) if !slug.is_empty() && !slug.contains('/') => {
                Reject::MethodNotAllowed("GET, HEAD").into_response()
            }
            _ => Reject::NotFound.into_response(),
        },
    };
    state
        .metrics
        .requests_hot
        .inc(&[resp.status().as_str(), via]);
    resp
}

/// Serves until `shutdown` (at most `state.max_connections` connections at once), then drains
/// in-flight requests for at most `grace`.
pub async fn serve(
    listener: TcpListener,
    state: Arc<State>,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let conns = zlink_redirect::serve::Connections {
        max: state.max_connections,
        drain: state.drain,
        metrics: state.metrics.connections.clone(),
    };
    zlink_redirect::serve::serve(listener, shutdown, grace, conns, || {
        let st = state.clone();
        hyper::service::service_fn(move |req| {
            let st = st.clone();
            async move { Ok::<_, Infallible>(dispatch(st, req).await) }
        })
    })
    .await;
}
