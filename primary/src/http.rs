//! HTTP plumbing: the route table, the middleware stack, and the accept loop.

use crate::app::AppState;
use crate::error::{ApiError, Resp};
use crate::{api, bulk, domains, hosts, keys, listing, ops, qr, redirect, stats};
use http::{Method, Request};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use zlink_clients::trace;
use zlink_redirect::pipeline::{self, traced};
use zlink_redirect::Peer;

/// Every path primary answers. Parsing is pure; method checks happen in [`dispatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    Healthz,
    Readyz,
    Metrics,
    OpenApi,
    Links,
    LinksBulk,
    Link(&'a str),
    Keys,
    Key(&'a str),
    Domains,
    DomainApprove(&'a str),
    LinkStats(&'a str),
    LinkQr(&'a str),
    Redirect(&'a str),
    Info(&'a str),
    /// `/dashboard` (`None`) and `/dashboard/<file>`.
    Dashboard(Option<&'a str>),
    ApiNotFound,
    NotFound,
}

impl<'a> Route<'a> {
    pub fn parse(path: &'a str) -> Self {
        match path {
            "/healthz" => Route::Healthz,
            "/readyz" => Route::Readyz,
            "/metrics" => Route::Metrics,
            "/api/v1/links" => Route::Links,
            "/api/v1/links/bulk" => Route::LinksBulk,
            "/api/v1/keys" => Route::Keys,
            "/api/v1/domains" => Route::Domains,
            "/api/v1/openapi.json" => Route::OpenApi,
            "/dashboard" => Route::Dashboard(None),
            _ => {
                if let Some(file) = path.strip_prefix(crate::dashboard::PATH) {
                    return Route::Dashboard(Some(file));
                }
                if let Some(id) = path.strip_prefix("/api/v1/keys/") {
                    if !id.contains('/') {
                        return Route::Key(id);
                    }
                }
                if let Some(rest) = path.strip_prefix("/api/v1/domains/") {
                    if let Some(d) = rest.strip_suffix("/approve") {
                        if !d.contains('/') {
                            return Route::DomainApprove(d);
                        }
                    }
                }
                if let Some(rest) = path.strip_prefix("/api/v1/links/") {
                    if !rest.contains('/') {
                        return Route::Link(rest);
                    }
                    if let Some(slug) = rest.strip_suffix("/stats") {
                        if !slug.contains('/') {
                            return Route::LinkStats(slug);
                        }
                    }
                    if let Some(slug) = rest.strip_suffix("/qr") {
                        if !slug.contains('/') {
                            return Route::LinkQr(slug);
                        }
                    }
                }
                if path == "/api" || path.starts_with("/api/") {
                    return Route::ApiNotFound;
                }
                match path.strip_prefix('/') {
                    Some(seg) if !seg.is_empty() && !seg.contains('/') => {
                        match seg.strip_suffix('+') {
                            Some(slug) => Route::Info(slug),
                            None => Route::Redirect(seg),
                        }
                    }
                    _ => Route::NotFound,
                }
            }
        }
    }

    /// Bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Route::Healthz => "healthz",
            Route::Readyz => "readyz",
            Route::Metrics => "metrics",
            Route::OpenApi => "openapi",
            Route::Links => "links",
            Route::LinksBulk => "links_bulk",
            Route::Link(_) => "link",
            Route::Keys => "keys",
            Route::Key(_) => "key",
            Route::Domains => "domains",
            Route::DomainApprove(_) => "domain_approve",
            Route::LinkStats(_) => "link_stats",
            Route::LinkQr(_) => "link_qr",
            Route::Redirect(_) => "redirect",
            Route::Info(_) => "info",
            Route::Dashboard(_) => "dashboard",
            Route::ApiNotFound | Route::NotFound => "not_found",
        }
    }
}

/// The route label travels to the metrics layer in the response extensions.
#[derive(Clone, Copy)]
struct RouteLabel(&'static str);

/// Every request but probes and scrapes runs in a trace: continued from the `traceparent` of a
/// trusted proxy (the frontend nginx starts one per request), else a new one. Its server span
/// (`redirect.handle`, `api.request`) is exported when sampled; every log line inside carries
/// its `trace_id`; redirects log one line each (cache hits sampled; store reads, errors always).
async fn dispatch(state: Arc<AppState>, req: Request<Incoming>) -> Resp {
    let route = Route::parse(req.uri().path());
    if !trace::enabled() || matches!(route, Route::Healthz | Route::Readyz | Route::Metrics) {
        return route_request(state, req).await;
    }
    let label = route.label();
    let (redirect, slug) = match route {
        Route::Redirect(s) => (true, Some(s.to_owned())),
        Route::Info(s) | Route::Link(s) | Route::LinkStats(s) | Route::LinkQr(s) => {
            (false, Some(s.to_owned()))
        }
        _ => (false, None),
    };
    let trusted = state.settings.trusted_proxies.contains(Peer::ip_of(&req));
    let name = if redirect {
        "redirect.handle"
    } else {
        "api.request"
    };
    let t = trace::RequestTrace::start(name, label, trusted, req.headers());
    // No lookup of the redirect pipeline runs here (a redirect's GET|HEAD never comes this
    // way): no cache layer.
    let handler = async { (route_request(state, req).await, None) };
    traced(t, redirect, slug.as_deref(), handler).await
}

/// Every route but a redirect's `GET|HEAD` ([`handle`] answers those itself; a redirect path
/// with another method gets its 405 here).
async fn route_request(state: Arc<AppState>, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_owned();
    let route = Route::parse(&path);
    let method = req.method().clone();
    // A per-link route names a link on the domain of its `?domain=` (default: the default
    // domain): the handlers get the link key.
    let key = match route {
        Route::Link(slug) | Route::LinkStats(slug) | Route::LinkQr(slug) => {
            match hosts::key_of(&state, req.uri().query(), slug) {
                Ok(k) => k,
                Err(e) => return e.into_response(),
            }
        }
        _ => String::new(),
    };
    let result = match (route, &method) {
        (Route::Healthz, &Method::GET | &Method::HEAD) => Ok(ops::healthz()),
        (Route::Readyz, &Method::GET | &Method::HEAD) => Ok(ops::readyz(&state).await),
        (Route::Metrics, &Method::GET) => Ok(ops::metrics(&state)),
        (Route::Healthz | Route::Readyz, _) => Err(ApiError::MethodNotAllowed("GET, HEAD")),
        (Route::Metrics, _) => Err(ApiError::MethodNotAllowed("GET")),
        (Route::OpenApi, &Method::GET) => Ok(crate::openapi::serve()),
        (Route::OpenApi, _) => Err(ApiError::MethodNotAllowed("GET")),
        (Route::Links, &Method::POST) => api::create(&state, req).await,
        (Route::Links, &Method::GET) => listing::list(&state, &req).await,
        (Route::Links, _) => Err(ApiError::MethodNotAllowed("GET, POST")),
        (Route::LinksBulk, &Method::POST) => bulk::create(&state, req).await,
        (Route::LinksBulk, _) => Err(ApiError::MethodNotAllowed("POST")),
        (Route::Link(_), &Method::GET) => api::get(&state, req, &key).await,
        (Route::Link(_), &Method::PATCH) => api::patch::patch(&state, req, &key).await,
        (Route::Link(_), &Method::DELETE) => api::delete(&state, req, &key).await,
        (Route::Link(_), _) => Err(ApiError::MethodNotAllowed("GET, PATCH, DELETE")),
        (Route::Keys, &Method::POST) => keys::create(&state, req).await,
        (Route::Keys, _) => Err(ApiError::MethodNotAllowed("POST")),
        (Route::Key(id), &Method::DELETE) => keys::revoke(&state, req, id).await,
        (Route::Key(_), _) => Err(ApiError::MethodNotAllowed("DELETE")),
        (Route::Domains, &Method::POST) => domains::register(&state, req).await,
        (Route::Domains, &Method::GET) => domains::list(&state, &req).await,
        (Route::Domains, _) => Err(ApiError::MethodNotAllowed("GET, POST")),
        (Route::DomainApprove(d), &Method::POST) => domains::approve(&state, &req, d).await,
        (Route::DomainApprove(_), _) => Err(ApiError::MethodNotAllowed("POST")),
        (Route::LinkStats(_), &Method::GET) => stats::api(&state, &req, &key).await,
        (Route::LinkStats(_), _) => Err(ApiError::MethodNotAllowed("GET")),
        (Route::LinkQr(_), &Method::GET) => qr::get(&state, &req, &key).await,
        (Route::LinkQr(_), _) => Err(ApiError::MethodNotAllowed("GET")),
        (Route::Info(slug), &Method::GET | &Method::HEAD) => stats::info(&state, &req, slug).await,
        (Route::Info(_), _) => Err(ApiError::MethodNotAllowed("GET, HEAD")),
        (Route::Dashboard(file), _) => crate::dashboard::serve(file, &method, req.headers()),
        (Route::Redirect(_), _) => Err(ApiError::MethodNotAllowed("GET, HEAD")),
        (Route::ApiNotFound | Route::NotFound, _) => Err(ApiError::NotFound),
    };
    let mut resp = result.unwrap_or_else(ApiError::into_response);
    resp.extensions_mut().insert(RouteLabel(route.label()));
    resp
}

/// Every request: a redirect (`GET|HEAD /{slug}`, the hot path) runs inline under its own
/// deadline (`--redirect-timeout-ms`, at most the request timeout, so it needs no second
/// timer); every other route runs boxed under the request deadline (past it: 503 JSON, so
/// nginx can fail over). Then the per-route request counter, timed-out requests included.
async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Resp {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        if let Route::Redirect(slug) = Route::parse(req.uri().path()) {
            let resp = redirect_traced(&state, &req, slug).await;
            state
                .metrics
                .requests_hot
                .inc(&["redirect", resp.status().as_str()]);
            return resp;
        }
    }
    let deadline = state.settings.request_timeout;
    let resp = match tokio::time::timeout(deadline, Box::pin(dispatch(state.clone(), req))).await {
        Ok(resp) => resp,
        Err(_) => {
            let mut r = ApiError::Timeout.into_response();
            r.extensions_mut().insert(RouteLabel("timeout"));
            r
        }
    };
    let route = resp
        .extensions()
        .get::<RouteLabel>()
        .map_or("unknown", |r| r.0);
    state
        .metrics
        .requests_hot
        .inc(&[route, resp.status().as_str()]);
    resp
}

/// A redirect in its trace (see [`dispatch`]), the request borrowed: no copy of the slug.
async fn redirect_traced(state: &AppState, req: &Request<Incoming>, slug: &str) -> Resp {
    if !trace::enabled() {
        return redirect::redirect(state, req, slug).await;
    }
    let trusted = state.settings.trusted_proxies.contains(Peer::ip_of(req));
    let t = trace::RequestTrace::start("redirect.handle", "redirect", trusted, req.headers());
    traced(t, true, Some(slug), pipeline::answer(state, req, slug)).await
}

/// Serves until `shutdown` is cancelled, at most `max_connections` connections at once, then
/// stops accepting, lets in-flight requests finish (up to `grace`), and returns (the redirect
/// kit's accept loop, as lastresort's).
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: CancellationToken,
    grace: Duration,
    max_connections: usize,
    drain: Duration,
) {
    let conns = zlink_redirect::serve::Connections {
        max: max_connections,
        drain,
        metrics: state.metrics.connections.clone(),
    };
    zlink_redirect::serve::serve(listener, shutdown, grace, conns, || {
        let app = state.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let app = app.clone();
            async move { Ok::<_, Infallible>(handle(app, req).await) }
        })
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::Route::{self, *};

    #[test]
    fn routes_parse() {
        let cases: &[(&str, Route)] = &[
            ("/healthz", Healthz),
            ("/readyz", Readyz),
            ("/metrics", Metrics),
            ("/api/v1/links", Links),
            ("/api/v1/links/bulk", LinksBulk),
            ("/api/v1/links/abc", Link("abc")),
            ("/api/v1/links/abc/stats", LinkStats("abc")),
            ("/api/v1/links/abc/qr", LinkQr("abc")),
            ("/api/v1/links/a/b/qr", ApiNotFound),
            ("/api/v1/keys", Keys),
            ("/api/v1/keys/0123456789abcdef", Key("0123456789abcdef")),
            ("/api/v1/keys/a/b", ApiNotFound),
            ("/api/v1/domains", Domains),
            (
                "/api/v1/domains/go.example.com/approve",
                DomainApprove("go.example.com"),
            ),
            ("/api/v1/domains/a/b/approve", ApiNotFound),
            ("/api/v1/domains/x", ApiNotFound),
            ("/api/v1/openapi.json", OpenApi),
            ("/api/v1/links/abc/stats/x", ApiNotFound),
            ("/api/v1/links/a/b/stats", ApiNotFound),
            ("/api/v2/x", ApiNotFound),
            ("/api", ApiNotFound),
            ("/abc", Redirect("abc")),
            ("/a%2Fb", Redirect("a%2Fb")),
            ("/abc+", Info("abc")),
            ("/+", Info("")),
            ("/abc/", NotFound),
            ("/dashboard", Dashboard(None)),
            ("/dashboard/", Dashboard(Some(""))),
            ("/dashboard/app.js", Dashboard(Some("app.js"))),
            ("/dashboard/a/b", Dashboard(Some("a/b"))),
            ("/", NotFound),
            ("//x", NotFound),
        ];
        for (path, want) in cases {
            assert_eq!(Route::parse(path), *want, "{path}");
        }
    }
}

#[cfg(test)]
mod documented {
    use super::Route;

    /// A path of each route, the placeholders filled in: an exhaustive match, so a new route
    /// needs a decision here (and a documented path) to compile.
    fn documented_path(r: Route) -> &'static str {
        match r {
            Route::Healthz => "/healthz",
            Route::Readyz => "/readyz",
            Route::Metrics => "/metrics",
            Route::OpenApi => "/api/v1/openapi.json",
            Route::Links => "/api/v1/links",
            Route::LinksBulk => "/api/v1/links/bulk",
            Route::Link(_) => "/api/v1/links/{slug}",
            Route::Keys => "/api/v1/keys",
            Route::Key(_) => "/api/v1/keys/{id}",
            Route::Domains => "/api/v1/domains",
            Route::DomainApprove(_) => "/api/v1/domains/{domain}/approve",
            Route::LinkStats(_) => "/api/v1/links/{slug}/stats",
            Route::LinkQr(_) => "/api/v1/links/{slug}/qr",
            Route::Redirect(_) => "/{slug}",
            Route::Info(_) => "/{slug}+",
            Route::Dashboard(_) => "/dashboard/",
            Route::ApiNotFound | Route::NotFound => "",
        }
    }

    /// Fills a documented path's placeholders with sample values.
    pub fn sample(path: &str) -> String {
        path.replace("{slug}", "abc-1")
            .replace("{id}", "k1")
            .replace("{domain}", "go.example.com")
    }

    #[test]
    fn every_route_has_a_documented_path_and_every_documented_path_a_route() {
        let ops = crate::openapi::operations();
        assert!(
            crate::openapi::json().contains("\"openapi\":\"3.1"),
            "OpenAPI 3.1"
        );
        for (path, methods) in &ops {
            assert!(!methods.is_empty(), "{path}");
            let s = sample(path);
            let route = Route::parse(&s);
            assert!(
                !matches!(route, Route::NotFound | Route::ApiNotFound),
                "documented {path} is no route"
            );
            assert_eq!(documented_path(route), path, "{path} parses to {route:?}");
        }
        let documented: Vec<&str> = ops.iter().map(|(p, _)| p.as_str()).collect();
        for route in [
            Route::Healthz,
            Route::Readyz,
            Route::Metrics,
            Route::OpenApi,
            Route::Links,
            Route::LinksBulk,
            Route::Link("x"),
            Route::Keys,
            Route::Key("x"),
            Route::Domains,
            Route::DomainApprove("x"),
            Route::LinkStats("x"),
            Route::LinkQr("x"),
            Route::Redirect("x"),
            Route::Info("x"),
            Route::Dashboard(Some("")),
        ] {
            assert!(
                documented.contains(&documented_path(route)),
                "{route:?} is not documented"
            );
        }
    }
}
