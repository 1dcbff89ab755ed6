//! The OpenAPI 3.1 description of primary's HTTP surface, generated at compile time by
//! `utoipa` from the `#[utoipa::path]` on each handler and served at `GET
//! /api/v1/openapi.json`. Request bodies are the handlers' own request types; responses are
//! [`crate::views`].
//!
//! Kept true by tests: every route of `crate::http` has a documented path (a unit test there,
//! with an exhaustive match, so a new route does not compile without a decision), and the e2e
//! test `the_openapi_document_lists_exactly_the_routes_and_methods_primary_serves` asks a
//! running primary for every documented path and compares the methods it allows with the
//! document's.

use crate::error::Resp;
use utoipa::OpenApi;

/// `GET /api/v1/openapi.json`
#[utoipa::path(operation_id = "openapi_json", get, path = "/api/v1/openapi.json", tag = "meta",
    responses((status = 200, content_type = "application/json", description = "OpenAPI 3.1")))]
pub(crate) fn serve() -> Resp {
    let mut r = Resp::new(http_body_util::Full::new(bytes::Bytes::from_static(
        json().as_bytes(),
    )));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
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
    paths(crate::api::create, crate::listing::list, crate::bulk::create, crate::api::get, crate::api::patch::patch, crate::api::delete, crate::stats::api, crate::qr::get, crate::domains::register, crate::domains::list, crate::domains::approve, crate::keys::create, crate::keys::revoke, serve, crate::redirect::redirect, crate::stats::info, crate::dashboard::serve, crate::ops::healthz, crate::ops::readyz, crate::ops::metrics),
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
