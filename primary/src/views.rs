//! The JSON the API answers with, as OpenAPI schemas (the handlers build the same shapes with
//! `serde_json::json!`; the e2e test `the_openapi_document_lists_exactly_the_routes_and_methods_primary_serves`
//! compares a created link's and domain's keys with [`LinkView`] and [`DomainView`]).

use utoipa::ToSchema;

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
