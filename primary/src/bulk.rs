//! `POST /api/v1/links/bulk` with `{"links": [...]}`: up to [`MAX_ITEMS`] creates in one
//! request, each item the body of a single create, each with its own result in the item's
//! order. An item that fails (bad input, slug taken, a dependency down, over the key's write
//! limit) fails alone; the others are created. With an `Idempotency-Key`, item `i` is created
//! under the key `<key>#<i>`: retrying the whole request returns the same links (replays),
//! and creates only what the first attempt did not.
//!
//! The request is never answered 503 as a whole while its items succeed: the items get the
//! request deadline less a margin for the answer ([`items_deadline`]); an item not started by
//! then, or still writing then, answers `503 timeout` on its own (the ones still writing may
//! or may not exist: a retry with the same `Idempotency-Key` tells), the rest their results.

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
use std::time::Duration;

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
    let started = tokio::time::Instant::now();
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
    let deadline = items_deadline(started, state.settings.request_timeout);
    let now = state.clock.now_ms();
    let results: Vec<Result<Created, ApiError>> = stream::iter(body.links.into_iter().enumerate())
        .map(|(i, item)| {
            let (principal, idem_key) = (&principal, idem_key.as_deref());
            async move {
                if i >= admitted {
                    return Err(ApiError::RateLimited(1));
                }
                // Not started this late: nothing of it is written.
                if tokio::time::Instant::now() >= deadline {
                    return Err(ApiError::Timeout);
                }
                let item =
                    create_item(state, principal, item, idem_key.map(|k| format!("{k}#{i}")));
                tokio::time::timeout_at(deadline, item)
                    .await
                    .unwrap_or(Err(ApiError::Timeout))
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

/// When the items must be done: the request's deadline less a tenth of it (at least 100 ms,
/// at most 1 s) to build and send the answer of up to 1,000 items.
fn items_deadline(
    started: tokio::time::Instant,
    request_timeout: Duration,
) -> tokio::time::Instant {
    let margin = (request_timeout / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    started + request_timeout.saturating_sub(margin)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_items_leave_time_for_the_answer() {
        let t = tokio::time::Instant::now();
        let d = |ms| items_deadline(t, Duration::from_millis(ms)) - t;
        assert_eq!(d(5000), Duration::from_millis(4500));
        assert_eq!(d(30_000), Duration::from_millis(29_000));
        assert_eq!(d(500), Duration::from_millis(400));
        assert_eq!(d(50), Duration::ZERO);
    }
}
