//! The OpenAPI 3.1 description of primary's HTTP surface, generated at compile time by
//! `utoipa` and served at `GET /api/v1/openapi.json`. Request bodies are the handlers' own
//! request types ([`crate::api`], [`crate::domains`], [`crate::keys`], [`crate::bulk`]);
//! responses are described by the view types below, which mirror the JSON the handlers write.
//!
//! Each operation is the `#[utoipa::path]` on its handler. Kept true by tests: every [`crate::http::Route`] has a documented path (a unit test with an
//! exhaustive match, so a new route does not compile without a decision here), and the e2e test
//! `the_openapi_document_lists_exactly_the_routes_and_methods_primary_serves` asks a running
//! primary for every documented path and compares the methods it allows with the document's.

use utoipa::{OpenApi, ToSchema};

/// A link as the API returns it.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct LinkView {
    /// The slug (the path segment after the domain).
    slug: String,
    /// The branded domain; `null` on the default domain.
    domain: Option<String>,
    short_url: String,
    url: String,
    /// ACTIVE, DISABLED, EXPIRED or DELETED.
    status: String,
    created_at: String,
    expires_at: Option<String>,
    redirect_code: u16,
    owner: String,
    version: i64,
    /// `admin` (a takedown) or `owner`, while DISABLED.
    disabled_by: Option<String>,
    alias: Option<String>,
}

/// A page of an owner's links, newest first.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct LinkPage {
    links: Vec<LinkView>,
    /// Pass as `cursor` for the next page; `null` at the end.
    next_cursor: Option<String>,
}

/// A branded domain registration.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct DomainView {
    domain: String,
    owner: String,
    /// PENDING (waits for an admin) or ACTIVE.
    status: String,
    created_at: String,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct DomainList {
    domains: Vec<DomainView>,
}

/// Each item's outcome, in request order.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct BulkItem {
    index: usize,
    /// 201, or the status the item alone would have got.
    status: u16,
    replayed: Option<bool>,
    link: Option<LinkView>,
    error: Option<ErrorDetail>,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct BulkResult {
    created: usize,
    replayed: usize,
    failed: usize,
    results: Vec<BulkItem>,
}

/// Click totals: per day (last 30), per tier, agent class, device, and the top referrers,
/// countries and cities, over every rung's clicks.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Stats {
    slug: String,
    /// The branded domain; `null` on the default domain.
    domain: Option<String>,
    total: i64,
    humans: i64,
    bots: i64,
    by_agent: serde_json::Value,
    by_tier: serde_json::Value,
    by_device: serde_json::Value,
    last_days: serde_json::Value,
    top_referrers: serde_json::Value,
    top_countries: serde_json::Value,
    top_cities: serde_json::Value,
}

/// An API key, shown once at creation.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct KeyView {
    id: String,
    key: Option<String>,
    owner: String,
    /// `admin` or `owner`.
    role: String,
    created_at: Option<String>,
    revoked: Option<bool>,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `invalid_url`, `slug_taken`, `rate_limited`.
    code: String,
    message: String,
}

/// Every 4xx and 5xx answer.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Error {
    error: ErrorDetail,
}

struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "zlink", description = "URL shortener whose redirects keep working when its datacenter does not"),
    paths(crate::api::create, crate::listing::list, crate::bulk::create, crate::api::get, crate::api::patch, crate::api::delete, crate::stats::api, crate::qr::get, crate::domains::register, crate::domains::list, crate::domains::approve, crate::keys::create, crate::keys::revoke, crate::http::openapi, crate::redirect::redirect, crate::stats::info, crate::http::healthz, crate::http::readyz, crate::http::metrics),
    modifiers(&Bearer),
)]
struct ApiDoc;

/// The document as JSON (built once).
pub fn json() -> &'static str {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DOC.get_or_init(|| {
        ApiDoc::openapi()
            .to_json()
            .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    })
}

/// Documented (path, lower-case methods), e.g. for the route check.
pub fn operations() -> Vec<(String, Vec<String>)> {
    let v: serde_json::Value = serde_json::from_str(json()).unwrap_or_default();
    v["paths"]
        .as_object()
        .map(|paths| {
            paths
                .iter()
                .map(|(p, ops)| {
                    let methods = ops
                        .as_object()
                        .map(|o| o.keys().cloned().collect())
                        .unwrap_or_default();
                    (p.clone(), methods)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use crate::http::Route;

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
        let ops = super::operations();
        assert!(super::json().contains("\"openapi\":\"3.1"), "OpenAPI 3.1");
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
        ] {
            assert!(
                documented.contains(&documented_path(route)),
                "{route:?} is not documented"
            );
        }
    }
}
