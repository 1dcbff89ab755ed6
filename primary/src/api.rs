//! The link API: create, read metadata, delete ([`patch`]: change status, destination, expiry,
//! alias; the list: [`crate::listing`]). Writes go through [`crate::write`].

pub mod patch;

use crate::app::{AppState, Limit};
use crate::auth::Principal;
use crate::body::{idempotency_key, read_json};
use crate::error::Resp;
use crate::error::{json_response, ApiError};
use crate::events::link_event;
use crate::views::LinkView;
use crate::write::{self, Change, Inserted};
use chrono::DateTime;
use http::{HeaderValue, Request, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use zlink_store::Link;
use zlink_wire::domain::LinkKey;
use zlink_wire::events::LinkEventKind;
use zlink_wire::{link, longurl, slug, LinkStatus};

/// Links may not expire further out than this (CQL timestamps and sanity).
const MAX_EXPIRY_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// The body of a create, and each item of a bulk create.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateRequest {
    url: String,
    slug: Option<String>,
    /// A registered, active branded domain of the caller's; absent: the default domain.
    domain: Option<String>,
    expires_at: Option<String>,
    redirect_code: Option<u16>,
    alias: Option<String>,
}

/// Characters an alias may have at most.
pub const MAX_ALIAS_CHARS: usize = 100;

/// An alias as stored: trimmed, 1 to [`MAX_ALIAS_CHARS`] characters, no control characters
/// (it is only ever shown escaped, like every string a user gave).
pub(crate) fn validate_alias(raw: &str) -> Result<String, ApiError> {
    let a = raw.trim();
    let n = a.chars().count();
    if n == 0 || n > MAX_ALIAS_CHARS || a.chars().any(char::is_control) {
        return Err(ApiError::Invalid(
            "invalid_alias",
            format!("alias must be 1 to {MAX_ALIAS_CHARS} characters without control characters"),
        ));
    }
    Ok(a.to_string())
}

/// What a create did: the link, and whether it was made by an earlier attempt of the same
/// idempotent request (a replay).
pub(crate) struct Created {
    pub link: Link,
    pub replayed: bool,
}

/// A link as the API answers it (on the frontend's or its branded domain's short URL).
pub(crate) fn link_json(state: &AppState, l: &Link, now_ms: i64) -> LinkView {
    LinkView::of(state.short_url(&l.key), l, now_ms)
}

pub(crate) fn sha256_hex(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    hex::encode(h.finalize())
}

pub(super) fn parse_expiry(raw: Option<&str>, now_ms: i64) -> Result<Option<i64>, ApiError> {
    let Some(raw) = raw else { return Ok(None) };
    let invalid = |m: &str| ApiError::Invalid("invalid_expires_at", m.to_string());
    let t = DateTime::parse_from_rfc3339(raw)
        .map_err(|_| invalid("expires_at must be an RFC 3339 timestamp"))?;
    let ms = t.timestamp_millis();
    if ms <= now_ms {
        return Err(invalid("expires_at must be in the future"));
    }
    if ms - now_ms > MAX_EXPIRY_MS {
        return Err(invalid("expires_at must be within 100 years"));
    }
    Ok(Some(ms))
}

/// `POST /api/v1/links`
#[utoipa::path(operation_id = "create_link", post, path = "/api/v1/links", tag = "links",
    request_body = crate::api::CreateRequest,
    params(("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key return the same link")),
    responses((status = 201, body = crate::views::LinkView), (status = 200, description = "Idempotent replay", body = crate::views::LinkView),
        (status = 409, body = crate::views::Error), (status = 422, body = crate::views::Error), (status = 429, body = crate::views::Error)),
    security(("bearer" = [])))]
pub async fn create(state: &AppState, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let principal = writer(state, &req).await?;
    let idem_key = idempotency_key(req.headers())?;
    let body: CreateRequest = read_json(req, state.settings.max_body_bytes).await?;
    let created = create_link(state, &principal, body, idem_key.as_deref()).await?;
    let mut resp = json_response(
        StatusCode::CREATED,
        &link_json(state, &created.link, state.clock.now_ms()),
    );
    if created.replayed {
        resp.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(resp)
}

/// Validates and creates one link for `principal` (the caller admitted the write). With an
/// idempotency key, every retry converges on the slug the first attempt claimed.
pub(crate) async fn create_link(
    state: &AppState,
    principal: &Principal,
    body: CreateRequest,
    idem_key: Option<&str>,
) -> Result<Created, ApiError> {
    let now = state.clock.now_ms();
    let draft = Draft::validate(state, principal, body, now).await?;
    let auto = match draft.slug {
        Some(_) => None,
        None => Some(state.ids.next_id().await?),
    };
    let mut key = draft.key(state, auto)?;
    // Every retry with the same key converges on the slug the first attempt claimed.
    let idem = match idem_key {
        Some(idem_key) => {
            let fingerprint = draft.fingerprint();
            if let Some(won_slug) =
                claim(state, principal, idem_key, key.as_str(), &fingerprint, now).await?
            {
                key = LinkKey::from(won_slug);
            }
            Some(item_idem(principal, idem_key))
        }
        None => None,
    };
    draft.insert(state, principal, key, idem, now).await
}

/// Claims `idem_key` for `claimed` (what a retry must converge on) with the request's
/// `fingerprint`: `None` when this request is the first, else what the first claimed; a key
/// first used with a different request is refused (422).
pub(crate) async fn claim(
    state: &AppState,
    principal: &Principal,
    idem_key: &str,
    claimed: &str,
    fingerprint: &str,
    now: i64,
) -> Result<Option<String>, ApiError> {
    match state
        .store
        .links
        .claim_idempotency(&principal.owner, idem_key, claimed, fingerprint, now)
        .await?
    {
        None => Ok(None),
        Some((_, won_fp)) if won_fp != fingerprint => Err(ApiError::Invalid(
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request".into(),
        )),
        Some((won, _)) => Ok(Some(won)),
    }
}

/// What a link made under idempotency key `idem_key` records (`idem`), so that a retry that
/// finds the link knows it as its own.
pub(crate) fn item_idem(principal: &Principal, idem_key: &str) -> String {
    sha256_hex(&[&principal.owner, idem_key])
}

/// A create's body validated and normalised, ready to be written under a key.
pub(crate) struct Draft {
    url: String,
    pub slug: Option<String>,
    domain: Option<String>,
    expires_at_ms: Option<i64>,
    redirect_code: u16,
    alias: Option<String>,
}

impl Draft {
    pub async fn validate(
        state: &AppState,
        principal: &Principal,
        body: CreateRequest,
        now: i64,
    ) -> Result<Draft, ApiError> {
        let url = longurl::normalize(&body.url)
            .map_err(|e| ApiError::Invalid("invalid_url", e.to_string()))?;
        state
            .destinations
            .check(&url)
            .map_err(|e| ApiError::Invalid(e.code(), e.to_string()))?;
        if let Some(s) = &body.slug {
            slug::validate_custom(s)
                .map_err(|e| ApiError::Invalid("invalid_slug", e.to_string()))?;
        }
        let domain = crate::hosts::for_create(state, principal, body.domain.as_deref()).await?;
        not_to_a_branded_domain(state, &url).await?;
        let expires_at_ms = parse_expiry(body.expires_at.as_deref(), now)?;
        let alias = body.alias.as_deref().map(validate_alias).transpose()?;
        let redirect_code = body.redirect_code.unwrap_or(state.settings.redirect_code);
        if !link::is_redirect_code(redirect_code) {
            return Err(ApiError::Invalid(
                "invalid_redirect_code",
                "redirect_code must be 301, 302, 307 or 308".into(),
            ));
        }
        Ok(Draft {
            url,
            slug: body.slug,
            domain,
            expires_at_ms,
            redirect_code,
            alias,
        })
    }

    /// The link key: the slug, or the auto slug of ID `auto`; on a branded domain
    /// `<domain>/<slug>`.
    pub fn key(&self, state: &AppState, auto: Option<u64>) -> Result<LinkKey, ApiError> {
        let slug = match (&self.slug, auto) {
            (Some(s), _) => s.clone(),
            (None, Some(id)) => state
                .codec
                .encode(id)
                .map_err(|e| ApiError::Internal(e.to_string()))?,
            (None, None) => return Err(ApiError::Internal("an auto slug without an ID".into())),
        };
        Ok(LinkKey::new(self.domain.as_deref(), &slug))
    }

    /// What makes two creates the same request (for an idempotency key).
    fn fingerprint(&self) -> String {
        sha256_hex(&[
            &self.url,
            self.slug.as_deref().unwrap_or(""),
            self.domain.as_deref().unwrap_or(""),
            &self
                .expires_at_ms
                .map(|e| e.to_string())
                .unwrap_or_default(),
            &self.redirect_code.to_string(),
            self.alias.as_deref().unwrap_or(""),
        ])
    }

    /// Writes the link under `key`. A link already there that carries the same `idem` is an
    /// earlier attempt's (a replay); any other is a taken slug.
    pub async fn insert(
        self,
        state: &AppState,
        principal: &Principal,
        key: LinkKey,
        idem: Option<String>,
        now: i64,
    ) -> Result<Created, ApiError> {
        let custom = self.slug.is_some();
        let new = Link {
            key,
            url: self.url,
            owner: principal.owner.clone(),
            status: LinkStatus::Active,
            redirect_code: self.redirect_code,
            created_at_ms: now,
            expires_at_ms: self.expires_at_ms,
            version: 1,
            idem: idem.clone(),
            disabled_by: None,
            alias: self.alias,
        };
        let existing =
            match write::insert(&state.store, state.events.uses_outbox(), &new, now).await? {
                Inserted::Taken(existing) => existing,
                Inserted::Created => {
                    state
                        .cache
                        .created(&new.key, &crate::cache::CachedLink::from(&new))
                        .await;
                    state
                        .events
                        .link_changed(link_event(LinkEventKind::Created, &new, now));
                    tracing::info!(slug = %new.key, owner = ?new.owner, "link created");
                    return Ok(Created {
                        link: new,
                        replayed: false,
                    });
                }
            };
        if idem.is_some() && existing.idem == idem {
            return Ok(Created {
                link: existing,
                replayed: true,
            });
        }
        if custom {
            return Err(ApiError::Conflict(
                "slug_taken",
                "this slug is already taken".into(),
            ));
        }
        // Auto slugs cannot collide unless the slug key changed under existing links.
        Err(ApiError::Internal(format!(
            "auto slug {:?} already exists; was ZLINK_SLUG_KEY changed?",
            new.key
        )))
    }
}

/// The principal of a link write, admitted under the write limits: per client address before
/// the key is even looked at, then per key.
pub(crate) async fn writer<B>(state: &AppState, req: &Request<B>) -> Result<Principal, ApiError> {
    state.admit_ip(Limit::WritesPerIp, state.client_ip(req))?;
    let principal = state.principal(req).await?;
    state.admit_write(&principal)?;
    Ok(principal)
}

pub(crate) async fn load_managed(
    state: &AppState,
    principal: &Principal,
    slug: &str,
    serial: bool,
) -> Result<Link, ApiError> {
    if !zlink_wire::domain::is_valid_key(slug) {
        return Err(ApiError::NotFound);
    }
    let link = if serial {
        state.store.links.get_serial(slug).await?
    } else {
        state.store.links.get(slug).await?
    };
    let link = link.ok_or(ApiError::NotFound)?;
    if !principal.may_manage(&link.owner) {
        return Err(ApiError::Forbidden);
    }
    Ok(link)
}

/// `GET /api/v1/links/{slug}`
#[utoipa::path(operation_id = "get_link", get, path = "/api/v1/links/{slug}", tag = "links",
    params(("slug" = String, Path), ("domain" = Option<String>, Query, description = "The link's branded domain")),
    responses((status = 200, body = crate::views::LinkView), (status = 404, body = crate::views::Error)),
    security(("bearer" = [])))]
pub async fn get(state: &AppState, req: Request<Incoming>, slug: &str) -> Result<Resp, ApiError> {
    let principal = state.principal(&req).await?;
    let link = load_managed(state, &principal, slug, false).await?;
    Ok(json_response(
        StatusCode::OK,
        &link_json(state, &link, state.clock.now_ms()),
    ))
}

/// Refuses a destination on a registered branded domain (a link to a link, like the service's
/// own short domains, which [`crate::policy`] refuses).
pub(super) async fn not_to_a_branded_domain(
    state: &AppState,
    normalized: &str,
) -> Result<(), ApiError> {
    let host = url::Url::parse(normalized)
        .ok()
        .and_then(|u| u.host_str().map(str::to_ascii_lowercase));
    match host {
        Some(h) if crate::hosts::is_branded(state, &h).await? => Err(ApiError::Invalid(
            "destination_own_domain",
            format!(
                "destination host {h:?} is one of this service's short domains (a link to a link)"
            ),
        )),
        _ => Ok(()),
    }
}

/// `DELETE /api/v1/links/{slug}` (owner or admin): the link becomes DELETED for good, from any
/// state (a takedown included): 410 on every rung, the replicator replaces its page with a
/// DELETED tombstone, the slug stays taken. Deleting a deleted link answers the same 200.
#[utoipa::path(operation_id = "delete_link", delete, path = "/api/v1/links/{slug}", tag = "links",
    params(("slug" = String, Path), ("domain" = Option<String>, Query)),
    responses((status = 200, body = crate::views::LinkView), (status = 404, body = crate::views::Error)),
    security(("bearer" = [])))]
pub async fn delete(
    state: &AppState,
    req: Request<Incoming>,
    slug: &str,
) -> Result<Resp, ApiError> {
    let principal = writer(state, &req).await?;
    let link = load_managed(state, &principal, slug, true).await?;
    let now = state.clock.now_ms();
    if link.status == LinkStatus::Deleted {
        return Ok(json_response(StatusCode::OK, &link_json(state, &link, now)));
    }
    // A takedown's record stays with the deleted link.
    let disabled_by = link.disabled_by.clone();
    let updated = change(
        state,
        &principal,
        link,
        Change::Status(LinkStatus::Deleted, disabled_by),
        LinkEventKind::Deleted,
    )
    .await?;
    Ok(json_response(
        StatusCode::OK,
        &link_json(state, &updated, now),
    ))
}

/// Applies `what` to `link` (read with a SERIAL read) through [`write::change`], then
/// announces it: memcached, then the event. When this returns, memcached already holds the new
/// state (see [`crate::cache::RedirectCache::changed`]).
pub(super) async fn change(
    state: &AppState,
    principal: &Principal,
    link: Link,
    what: Change,
    kind: LinkEventKind,
) -> Result<Link, ApiError> {
    let now = state.clock.now_ms();
    let outbox = state.events.uses_outbox();
    let Some((updated, _row)) = write::change(&state.store, outbox, link, what, now).await? else {
        return Err(ApiError::Conflict(
            "concurrent_update",
            "the link changed while this request was applied; read it and retry".into(),
        ));
    };
    state
        .cache
        .changed(&updated.key, &crate::cache::CachedLink::from(&updated))
        .await;
    state.events.link_changed(link_event(kind, &updated, now));
    tracing::info!(
        slug = %updated.key,
        status = %updated.status,
        version = updated.version,
        kind = crate::events::kind_label(kind),
        by = %principal.key_id,
        admin = principal.admin,
        "link changed"
    );
    Ok(updated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_must_be_future_rfc3339() {
        let now = 1_700_000_000_000;
        assert!(parse_expiry(Some("2023-11-14T22:13:21Z"), now).is_ok());
        assert!(parse_expiry(Some("2023-11-14T22:13:19Z"), now).is_err());
        assert!(parse_expiry(Some("tomorrow"), now).is_err());
        assert!(parse_expiry(Some("3023-01-01T00:00:00Z"), now).is_err());
        assert_eq!(parse_expiry(None, now).unwrap(), None);
    }

    #[test]
    fn fingerprint_parts_cannot_be_shifted() {
        assert_ne!(sha256_hex(&["ab", "c"]), sha256_hex(&["a", "bc"]));
    }
}
