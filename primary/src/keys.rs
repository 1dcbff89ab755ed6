//! API keys as an API (admin keys only): `POST /api/v1/keys` issues a key, returned once (only
//! its hash is stored); `DELETE /api/v1/keys/{id}` revokes one, at once on this primary and
//! within [`crate::auth::KEY_CACHE_TTL`] on every other. `primary create-key` stays for the
//! first admin key.

use crate::api::writer;
use crate::app::AppState;
use crate::auth::{generate_key, hash_key, is_key_id, validate_owner, Principal};
use crate::body::read_json;
use crate::error::Resp;
use crate::error::{json_response, ApiError};
use crate::views::{rfc3339, KeyView};
use http::{Request, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateKey {
    owner: String,
    #[serde(default)]
    admin: bool,
}

fn admin_only(p: &Principal) -> Result<(), ApiError> {
    if p.admin {
        Ok(())
    } else {
        Err(ApiError::ForbiddenBecause(
            "admin_only",
            "only an admin key may manage API keys".into(),
        ))
    }
}

/// `POST /api/v1/keys` with `{"owner": "...", "admin": false}`.
#[utoipa::path(operation_id = "create_key", post, path = "/api/v1/keys", tag = "keys",
    request_body = crate::keys::CreateKey,
    responses((status = 201, body = crate::views::KeyView), (status = 403, body = crate::views::Error)),
    security(("bearer" = [])))]
pub async fn create(state: &AppState, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let principal = writer(state, &req).await?;
    admin_only(&principal)?;
    let body: CreateKey = read_json(req, state.settings.max_body_bytes).await?;
    validate_owner(&body.owner).map_err(|m| ApiError::Invalid("invalid_owner", m))?;
    let now = state.clock.now_ms();
    let (key, key_id) = generate_key();
    state
        .store
        .keys
        .insert(&hash_key(&key), &key_id, &body.owner, body.admin, now)
        .await?;
    tracing::info!(key_id = %key_id, owner = %body.owner, admin = body.admin, by = %principal.key_id, "API key created");
    Ok(json_response(
        StatusCode::CREATED,
        &KeyView {
            id: key_id,
            key: Some(key),
            owner: body.owner,
            role: KeyView::role(body.admin),
            created_at: Some(rfc3339(now)),
            revoked: None,
        },
    ))
}

/// `DELETE /api/v1/keys/{id}`
#[utoipa::path(operation_id = "revoke_key", delete, path = "/api/v1/keys/{id}", tag = "keys",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::views::KeyView), (status = 404, body = crate::views::Error)),
    security(("bearer" = [])))]
pub async fn revoke(state: &AppState, req: Request<Incoming>, id: &str) -> Result<Resp, ApiError> {
    let principal = writer(state, &req).await?;
    admin_only(&principal)?;
    if !is_key_id(id) {
        return Err(ApiError::NotFound);
    }
    let (hash, rec) = state
        .store
        .keys
        .revoke(id)
        .await?
        .ok_or(ApiError::NotFound)?;
    state.auth.forget(&hash).await;
    tracing::info!(key_id = %id, owner = %rec.owner, by = %principal.key_id, "API key revoked");
    Ok(json_response(
        StatusCode::OK,
        &KeyView {
            id: id.to_string(),
            key: None,
            owner: rec.owner,
            role: KeyView::role(rec.admin),
            created_at: None,
            revoked: Some(true),
        },
    ))
}
