//! `POST /api/v1/links/bulk` with `{"links": [...]}`: up to [`MAX_ITEMS`] creates in one
//! request, each item the body of a single create, each with its own result in the item's
//! order. An item that fails (bad input, slug taken, a dependency down, over the key's write
//! limit) fails alone; the others are created. With an `Idempotency-Key` the request makes one
//! claim for the whole body ([`claim_bulk`]: its fingerprint and the block of IDs its auto slugs
//! take, item `i` the block's `i`-th), and item `i`'s link records `<key>#<i>` as its `idem`:
//! retrying the whole request returns the same links (replays) and creates only what the first
//! attempt did not, at one compare-and-set per request instead of one per item.
//!
//! The request is never answered 503 as a whole while its items succeed: the items get the
//! request deadline less a margin for the answer ([`items_deadline`]); an item not started by
//! then, or still writing then, answers `503 timeout` on its own (the ones still writing may
//! or may not exist: a retry with the same `Idempotency-Key` tells), the rest their results.

use crate::api::{
    claim, create_link, item_idem, link_json, sha256_hex, CreateRequest, Created, Draft,
};
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
/// Items created at once (each a few store writes and one compare-and-set). An item waits on
/// round trips more than on CPU: 1,000 items took a median 2.3 s at 16 at once, 1.9-2.1 s at
/// 32, 1.85 s at 64 and 1.3 s at 128 on the default local topology (docs/benchmarks.md), with
/// the redirects served meanwhile still all answered by primary (p99 104 ms, 66 ms idle).
const CONCURRENCY: usize = 128;

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
    let block = match idem_key.as_deref() {
        Some(k) => claim_bulk(state, &principal, k, &body.links, now).await?,
        None => None,
    };
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
                let item = create_item(state, principal, item, idem_key.map(|k| (k, i)), block);
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

/// The one idempotency claim of a bulk request under `idem_key`: the body's fingerprint and,
/// when an item has no custom slug, the first ID of a block leased for the request (item `i`'s
/// auto slug is the block's `i`-th ID). A retry (same key, same body) gets the first attempt's
/// block, so each item converges on the link the first attempt made for it; the same key with
/// another body is refused as a whole (422), nothing written. A retry leases a block it then
/// leaves unused: a gap in the IDs, never an ID issued twice.
async fn claim_bulk(
    state: &AppState,
    principal: &Principal,
    idem_key: &str,
    links: &[serde_json::Value],
    now: i64,
) -> Result<Option<u64>, ApiError> {
    let body = serde_json::to_string(links).map_err(|e| ApiError::Internal(e.to_string()))?;
    let fingerprint = sha256_hex(&["bulk", &body]);
    let auto = links
        .iter()
        .any(|l| !l.get("slug").is_some_and(serde_json::Value::is_string));
    let block = match auto {
        true => Some(state.ids.lease_block(links.len() as u64).await?.start),
        false => None,
    };
    let claimed = format!("bulk:{}", block.map(|b| b.to_string()).unwrap_or_default());
    let Some(won) = claim(state, principal, idem_key, &claimed, &fingerprint, now).await? else {
        return Ok(block);
    };
    match won.strip_prefix("bulk:") {
        Some("") => Ok(None),
        Some(start) => start
            .parse()
            .map(Some)
            .map_err(|_| ApiError::Internal(format!("bulk claim {won:?} has no block"))),
        None => Err(ApiError::Internal(format!("claim {won:?} is not a bulk's"))),
    }
}

/// Item `i` of the request: with an idempotency key (`idem`: the key and `i`) created under
/// its custom slug or the block's `i`-th ID, else as a single create.
async fn create_item(
    state: &AppState,
    principal: &Principal,
    item: serde_json::Value,
    idem: Option<(&str, usize)>,
    block: Option<u64>,
) -> Result<Created, ApiError> {
    let body: CreateRequest = serde_json::from_value(item)
        .map_err(|e| ApiError::Invalid("invalid_request", e.to_string()))?;
    let Some((idem_key, i)) = idem else {
        return create_link(state, principal, body, None).await;
    };
    let now = state.clock.now_ms();
    let draft = Draft::validate(state, principal, body, now).await?;
    let key = draft.key(state, block.map(|b| b + i as u64))?;
    let idem = item_idem(principal, &format!("{idem_key}#{i}"));
    draft.insert(state, principal, key, Some(idem), now).await
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
