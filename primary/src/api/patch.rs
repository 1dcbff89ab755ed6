//! `PATCH /api/v1/links/{slug}`: a status change, or a new destination, expiry and/or alias.
//! Every check comes before the first write (a bad request changes nothing); the change is
//! [`super::change`] (through [`crate::write`]).

use super::{
    change, link_json, load_managed, not_to_a_branded_domain, parse_expiry, validate_alias, writer,
};
use crate::app::AppState;
use crate::auth::Principal;
use crate::body::read_json;
use crate::error::Resp;
use crate::error::{json_response, ApiError};
use crate::write::{self, Change};
use http::{Request, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use zlink_store::{DisabledBy, Link};
use zlink_wire::events::LinkEventKind;
use zlink_wire::{longurl, LinkStatus};

/// The body of a PATCH: `status` alone, or any of `url`, `expires_at` and `alias`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PatchRequest {
    status: Option<String>,
    url: Option<String>,
    /// Absent: unchanged; `null`: no expiry; a timestamp: the new expiry.
    #[serde(default, deserialize_with = "present")]
    expires_at: Option<Option<String>>,
    /// Absent: unchanged; `null`: none.
    #[serde(default, deserialize_with = "present")]
    alias: Option<Option<String>>,
}

/// A field that is present, `null` included (so `null` and absent differ).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// `PATCH /api/v1/links/{slug}` with `{"status": "ACTIVE" | "DISABLED"}`, or with a new
/// `url` and/or `expires_at` (`null`: none). An admin's disable is a takedown: it records the
/// admin's key, and only an admin can re-enable or retarget the link. When this answers,
/// memcached already holds the new state (see [`crate::cache::RedirectCache::changed`]).
#[utoipa::path(operation_id = "patch_link", patch, path = "/api/v1/links/{slug}", tag = "links",
    request_body = crate::api::patch::PatchRequest,
    params(("slug" = String, Path), ("domain" = Option<String>, Query)),
    responses((status = 200, body = crate::views::LinkView), (status = 409, body = crate::views::Error), (status = 422, body = crate::views::Error)),
    security(("bearer" = [])))]
pub async fn patch(state: &AppState, req: Request<Incoming>, slug: &str) -> Result<Resp, ApiError> {
    // Authenticate (and limit) before reading the body.
    let principal = writer(state, &req).await?;
    let body: PatchRequest = read_json(req, state.settings.max_body_bytes).await?;
    let now = state.clock.now_ms();
    match body {
        PatchRequest {
            status: Some(status),
            url: None,
            expires_at: None,
            alias: None,
        } => patch_status(state, principal, slug, &status, now).await,
        PatchRequest {
            status: None,
            url,
            expires_at,
            alias,
        } if url.is_some() || expires_at.is_some() || alias.is_some() => {
            let alias = match alias {
                Some(Some(a)) => Some(Some(validate_alias(&a)?)),
                other => other,
            };
            if let Some(alias) = alias {
                let retargeting = url.is_some() || expires_at.is_some();
                // Everything checked before the alias is written: a bad request changes nothing.
                if retargeting {
                    let (u, _) = target_values(state, url.as_deref(), expires_at.as_ref(), now)?;
                    if let Some(u) = &u {
                        not_to_a_branded_domain(state, u).await?;
                    }
                }
                let link = load_managed(state, &principal, slug, true).await?;
                if retargeting {
                    may_retarget(&link, &principal, now)?;
                } else if link.status == LinkStatus::Deleted {
                    return Err(ApiError::Conflict(
                        "invalid_transition",
                        "a DELETED link cannot be changed".into(),
                    ));
                }
                write::set_alias(&state.store, &link.key, alias.as_deref()).await?;
                tracing::info!(slug = %link.key, by = %principal.key_id, "link alias changed");
                if url.is_none() && expires_at.is_none() {
                    let updated = Link { alias, ..link };
                    return Ok(json_response(
                        StatusCode::OK,
                        &link_json(state, &updated, now),
                    ));
                }
            }
            retarget(state, principal, slug, url, expires_at, now).await
        }
        PatchRequest { status: None, .. } => Err(ApiError::Invalid(
            "invalid_request",
            "nothing to change: give status, or url, expires_at and/or alias".into(),
        )),
        PatchRequest { .. } => Err(ApiError::Invalid(
            "invalid_request",
            "change the status on its own, not with url, expires_at or alias".into(),
        )),
    }
}

async fn patch_status(
    state: &AppState,
    principal: Principal,
    slug: &str,
    status: &str,
    now: i64,
) -> Result<Resp, ApiError> {
    let to = match status.parse::<LinkStatus>() {
        Ok(LinkStatus::Expired) => {
            return Err(ApiError::Invalid(
                "invalid_status",
                "EXPIRED is set by the expiry scheduler, not the API".into(),
            ))
        }
        Ok(LinkStatus::Deleted) => {
            return Err(ApiError::Invalid(
                "invalid_status",
                "a link is deleted with DELETE /api/v1/links/{slug}".into(),
            ))
        }
        Ok(s) => s,
        Err(()) => {
            return Err(ApiError::Invalid(
                "invalid_status",
                "status must be ACTIVE or DISABLED".into(),
            ))
        }
    };
    // A linearizable read, so the compare-and-set below starts from the latest version.
    let link = load_managed(state, &principal, slug, true).await?;
    let current = link.status.effective(link.expires_at_ms, now);
    if !current.can_become(to) {
        return Err(ApiError::Conflict(
            "invalid_transition",
            format!("a {current} link cannot become {to}"),
        ));
    }
    let taken_down = link.disabled_by.as_ref().is_some_and(|d| d.admin);
    if to == LinkStatus::Active && taken_down && !principal.admin {
        return Err(ApiError::ForbiddenBecause(
            "taken_down",
            "an administrator disabled this link; only an administrator can enable it".into(),
        ));
    }
    let disabled_by = (to == LinkStatus::Disabled).then(|| DisabledBy {
        admin: principal.admin,
        key_id: principal.key_id.clone(),
    });
    let kind = if to == LinkStatus::Disabled {
        LinkEventKind::Disabled
    } else {
        LinkEventKind::Enabled
    };
    let updated = change(
        state,
        &principal,
        link,
        Change::Status(to, disabled_by),
        kind,
    )
    .await?;
    Ok(json_response(
        StatusCode::OK,
        &link_json(state, &updated, now),
    ))
}

/// A retarget's new destination and expiry, each `None` when unchanged.
type TargetValues = (Option<String>, Option<Option<i64>>);

/// The new destination (normalised, within the destination policy) and expiry (in the
/// future; `Some(None)`: none) a retarget asks for.
fn target_values(
    state: &AppState,
    url: Option<&str>,
    expires_at: Option<&Option<String>>,
    now: i64,
) -> Result<TargetValues, ApiError> {
    let url = match url {
        Some(u) => {
            let u = longurl::normalize(u)
                .map_err(|e| ApiError::Invalid("invalid_url", e.to_string()))?;
            state
                .destinations
                .check(&u)
                .map_err(|e| ApiError::Invalid(e.code(), e.to_string()))?;
            Some(u)
        }
        None => None,
    };
    let expires_at_ms = match expires_at {
        Some(e) => Some(parse_expiry(e.as_deref(), now)?),
        None => None,
    };
    Ok((url, expires_at_ms))
}

/// Only an ACTIVE or DISABLED link gets a new destination or expiry, and a taken-down one only
/// from an admin.
fn may_retarget(link: &Link, principal: &Principal, now: i64) -> Result<(), ApiError> {
    let current = link.status.effective(link.expires_at_ms, now);
    if !matches!(current, LinkStatus::Active | LinkStatus::Disabled) {
        return Err(ApiError::Conflict(
            "invalid_transition",
            format!("a {current} link cannot be changed"),
        ));
    }
    if link.disabled_by.as_ref().is_some_and(|d| d.admin) && !principal.admin {
        return Err(ApiError::ForbiddenBecause(
            "taken_down",
            "an administrator disabled this link; only an administrator can change it".into(),
        ));
    }
    Ok(())
}

/// A new destination and/or expiry: a new version like any change, so memcached gets it at
/// once, other primaries' local caches within `--local-cache-ttl-ms`, S3 through the outbox and
/// the replicator (lastresort re-reads S3 pages it caches). Browsers keep what they cached: a
/// 301/308 answer may stay in a browser for good.
async fn retarget(
    state: &AppState,
    principal: Principal,
    slug: &str,
    url: Option<String>,
    expires_at: Option<Option<String>>,
    now: i64,
) -> Result<Resp, ApiError> {
    let (url, expires_at_ms) = target_values(state, url.as_deref(), expires_at.as_ref(), now)?;
    if let Some(u) = &url {
        not_to_a_branded_domain(state, u).await?;
    }
    let link = load_managed(state, &principal, slug, true).await?;
    may_retarget(&link, &principal, now)?;
    let new_url = url.unwrap_or_else(|| link.url.clone());
    let new_expiry = expires_at_ms.unwrap_or(link.expires_at_ms);
    if new_url == link.url && new_expiry == link.expires_at_ms {
        return Ok(json_response(StatusCode::OK, &link_json(state, &link, now)));
    }
    let updated = change(
        state,
        &principal,
        link,
        Change::Target {
            url: new_url,
            expires_at_ms: new_expiry,
        },
        LinkEventKind::Updated,
    )
    .await?;
    Ok(json_response(
        StatusCode::OK,
        &link_json(state, &updated, now),
    ))
}
