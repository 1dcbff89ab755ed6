//! `POST /api/v1/links/bulk` with `{"links": [...]}`: up to [`MAX_ITEMS`] creates in one
//! request, each item the body of a single create, each with its own result in the item's
//! order. An item that fails (bad input, slug taken, a dependency down, over the key's write
//! limit) fails alone; the others are created. With an `Idempotency-Key`, item `i` is created
//! under the key `<key>#<i>`: retrying the whole request returns the same links (replays),
//! and creates only what the first attempt did not.

use crate::api::{create_link, link_json, CreateRequest, Created};
use crate::app::{AppState, Limit};
use crate::auth::Principal;
use crate::body::{idempotency_key, read_json};
use crate::error::{json_response, ApiError, Resp};
use crate::views::{BulkItem, BulkResult, ErrorDetail};
use futures_util::stream::{self, StreamExt};
use http::{Request, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;

/// Items one request may carry.
pub const MAX_ITEMS: usize = 1000;
/// The request body's cap: 1,000 items of up to ~4 KiB each.
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// Items created at once (each is a few store writes, two of them compare-and-sets).
const CONCURRENCY: usize = 32;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BulkRequest {
    /// 1 to 1,000 items, each a create's body.
    #[schema(value_type = Vec<crate::api::CreateRequest>)]
    links: Vec<serde_json::Value>,
}

/// `POST /api/v1/links/bulk`. The per-address write limit admits the request; the key's write
/// limit admits as many items as its bucket holds (the rest answer 429 each).
#[utoipa::path(operation_id = "bulk_create", post, path = "/api/v1/links/bulk", tag = "links",
    request_body = crate::bulk::BulkRequest,
    responses((status = 200, body = crate::views::BulkResult), (status = 422, body = crate::views::Error)),
    security(("bearer" = [])))]
pub async fn create(state: &AppState, req: Request<Incoming>) -> Result<Resp, ApiError> {
    state.admit_ip(Limit::WritesPerIp, state.client_ip(&req))?;
    let principal = state.principal(&req).await?;
    let idem_key = idempotency_key(req.headers())?;
    let body: BulkRequest = read_json(req, MAX_BODY_BYTES).await?;
    let n = body.links.len();
    if !(1..=MAX_ITEMS).contains(&n) {
        return Err(ApiError::Invalid(
            "invalid_bulk",
            format!("links must hold 1 to {MAX_ITEMS} items, not {n}"),
        ));
    }
    let admitted = state.admit_writes(&principal, n)?;
    let now = state.clock.now_ms();
    let results: Vec<Result<Created, ApiError>> = stream::iter(body.links.into_iter().enumerate())
        .map(|(i, item)| {
            let (principal, idem_key) = (&principal, idem_key.as_deref());
            async move {
                if i >= admitted {
                    return Err(ApiError::RateLimited(1));
                }
                create_item(state, principal, item, idem_key.map(|k| format!("{k}#{i}"))).await
            }
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let (mut created, mut replayed, mut failed) = (0, 0, 0);
    let items: Vec<BulkItem> = results
        .into_iter()
        .enumerate()
        .map(|(i, r)| match r {
            Ok(c) => {
                if c.replayed {
                    replayed += 1;
                } else {
                    created += 1;
                }
                BulkItem {
                    index: i,
                    status: 201,
                    replayed: Some(c.replayed),
                    link: Some(link_json(state, &c.link, now)),
                    error: None,
                }
            }
            Err(e) => {
                failed += 1;
                e.log();
                BulkItem {
                    index: i,
                    status: e.status().as_u16(),
                    replayed: None,
                    link: None,
                    error: Some(ErrorDetail {
                        code: e.code().to_string(),
                        message: e.to_string(),
                    }),
                }
            }
        })
        .collect();
    tracing::info!(
        owner = ?principal.owner,
        items = n,
        created,
        replayed,
        failed,
        "bulk create"
    );
    Ok(json_response(
        StatusCode::OK,
        &BulkResult {
            created,
            replayed,
            failed,
            results: items,
        },
    ))
}

async fn create_item(
    state: &AppState,
    principal: &Principal,
    item: serde_json::Value,
    idem_key: Option<String>,
) -> Result<Created, ApiError> {
    let body: CreateRequest = serde_json::from_value(item)
        .map_err(|e| ApiError::Invalid("invalid_request", e.to_string()))?;
    create_link(state, principal, body, idem_key.as_deref()).await
}
