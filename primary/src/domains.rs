//! Branded short domains: `POST /api/v1/domains` (register), `GET /api/v1/domains` (the
//! caller's), `POST /api/v1/domains/{domain}/approve` (admin), and what the link API needs of
//! them: the domain of a create (registered, active, the caller's), the link key a per-link
//! route names (`?domain=`), the short URL of a key, and whether a host is one of ours.
//!
//! A registration is ACTIVE at once when an admin makes it or the name is under
//! `--branded-domains-allowed`; otherwise PENDING until an admin approves it. Links exist only on
//! active domains; the redirect path never reads this table (a link's key carries its domain).

use crate::api::{read_json, rfc3339, writer};
use crate::app::AppState;
use crate::auth::Principal;
use crate::error::{json_response, ApiError, Resp};
use http::{Request, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use zlink_store::domains::{Domain, DomainStatus};
use zlink_wire::destination;
use zlink_wire::domain::{self, HostDomain};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegisterRequest {
    domain: String,
}

fn invalid_domain(e: impl std::fmt::Display) -> ApiError {
    ApiError::Invalid("invalid_domain", e.to_string())
}

fn domain_json(d: &Domain) -> serde_json::Value {
    serde_json::json!({
        "domain": d.domain,
        "owner": d.owner,
        "status": d.status.as_str(),
        "created_at": rfc3339(d.created_at_ms),
    })
}

/// `POST /api/v1/domains` with `{"domain": "go.example.com"}`: 201 with the registration, or
/// 200 with the caller's existing one (registering twice changes nothing); 409 when another
/// owner has the name.
#[utoipa::path(operation_id = "register_domain", post, path = "/api/v1/domains", tag = "domains",
    request_body = crate::domains::RegisterRequest,
    responses((status = 201, body = crate::openapi::DomainView), (status = 200, description = "Already the caller's", body = crate::openapi::DomainView),
        (status = 409, body = crate::openapi::Error), (status = 422, body = crate::openapi::Error)),
    security(("bearer" = [])))]
pub async fn register(state: &AppState, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let principal = writer(state, &req).await?;
    let body: RegisterRequest = read_json(req, state.settings.max_body_bytes).await?;
    let name = domain::normalize(&body.domain).map_err(invalid_domain)?;
    if state.settings.hosts.is_default(&name) || state.destinations.is_own_domain(&name) {
        return Err(invalid_domain(
            "this is one of the service's own short domains",
        ));
    }
    let active = principal.admin || destination::in_list(&name, &state.settings.branded_allowed);
    let d = Domain {
        domain: name,
        owner: principal.owner.clone(),
        status: if active {
            DomainStatus::Active
        } else {
            DomainStatus::Pending
        },
        created_at_ms: state.clock.now_ms(),
        approved_by: principal.admin.then(|| principal.key_id.clone()),
    };
    let (stored, won) = state.store.domains.claim(&d).await?;
    if !won && stored.owner != principal.owner {
        return Err(ApiError::Conflict(
            "domain_taken",
            "this domain is registered by another owner".into(),
        ));
    }
    state.domain_cache.invalidate(&stored.domain).await;
    if won {
        tracing::info!(domain = %stored.domain, owner = ?stored.owner, status = stored.status.as_str(), "domain registered");
    }
    let status = if won {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(status, &domain_json(&stored)))
}

/// `GET /api/v1/domains`: the caller's domains.
#[utoipa::path(operation_id = "list_domains", get, path = "/api/v1/domains", tag = "domains",
    responses((status = 200, body = crate::openapi::DomainList)), security(("bearer" = [])))]
pub async fn list<B>(state: &AppState, req: &Request<B>) -> Result<Resp, ApiError> {
    let principal = state.principal(req).await?;
    let domains = state.store.domains.of_owner(&principal.owner).await?;
    let items: Vec<_> = domains.iter().map(domain_json).collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "domains": items }),
    ))
}

/// `POST /api/v1/domains/{domain}/approve` (admin keys only): PENDING → ACTIVE.
#[utoipa::path(operation_id = "approve_domain", post, path = "/api/v1/domains/{domain}/approve", tag = "domains",
    params(("domain" = String, Path)),
    responses((status = 200, body = crate::openapi::DomainView), (status = 403, body = crate::openapi::Error), (status = 404, body = crate::openapi::Error)),
    security(("bearer" = [])))]
pub async fn approve<B>(state: &AppState, req: &Request<B>, raw: &str) -> Result<Resp, ApiError> {
    let principal = writer(state, req).await?;
    if !principal.admin {
        return Err(ApiError::ForbiddenBecause(
            "admin_only",
            "only an admin key may approve a domain".into(),
        ));
    }
    let name = domain::normalize(raw).map_err(|_| ApiError::NotFound)?;
    let Some(d) = state.store.domains.get(&name).await? else {
        return Err(ApiError::NotFound);
    };
    if d.status == DomainStatus::Pending
        && !state
            .store
            .domains
            .approve(&name, &principal.key_id)
            .await?
    {
        // Approved concurrently: the answer below reads it back.
        tracing::debug!(domain = %name, "domain approved concurrently");
    }
    state.domain_cache.invalidate(&name).await;
    let d = state
        .store
        .domains
        .get(&name)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(json_response(StatusCode::OK, &domain_json(&d)))
}

/// A registration, read through a few seconds' cache (creates on a domain read it each time).
async fn lookup(state: &AppState, name: &str) -> Result<Option<Domain>, ApiError> {
    state
        .domain_cache
        .try_get_with(name.to_string(), async {
            state.store.domains.get(name).await
        })
        .await
        .map_err(|e| ApiError::from((*e).clone()))
}

/// The domain a create names: `None` for the default domain (no `domain`, or one of the
/// service's own names), else the normalised name, which must be registered by the caller (an
/// admin may use any) and active.
pub(crate) async fn for_create(
    state: &AppState,
    principal: &Principal,
    raw: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let Some(raw) = raw else { return Ok(None) };
    let name = domain::normalize(raw).map_err(invalid_domain)?;
    if state.settings.hosts.is_default(&name) {
        return Ok(None);
    }
    let unknown = || {
        ApiError::Invalid(
            "unknown_domain",
            "this domain is not registered by this API key's owner".into(),
        )
    };
    let d = lookup(state, &name).await?.ok_or_else(unknown)?;
    if !principal.may_manage(&d.owner) {
        return Err(unknown());
    }
    if d.status != DomainStatus::Active {
        return Err(ApiError::Invalid(
            "domain_pending",
            "this domain waits for an admin's approval".into(),
        ));
    }
    Ok(Some(name))
}

/// The link key a per-link API route names: `slug` on the domain of its `?domain=` parameter
/// (the default domain without one). A malformed domain names no link (404).
pub(crate) fn key_of(
    state: &AppState,
    query: Option<&str>,
    slug: &str,
) -> Result<String, ApiError> {
    let mut found: Option<String> = None;
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if k == "domain" {
            if found.is_some() {
                return Err(ApiError::Invalid(
                    "invalid_query",
                    "a query parameter is repeated".into(),
                ));
            }
            found = Some(v.into_owned());
        }
    }
    let name = match found {
        None => None,
        Some(raw) => {
            let name = domain::normalize(&raw).map_err(|_| ApiError::NotFound)?;
            (!state.settings.hosts.is_default(&name)).then_some(name)
        }
    };
    Ok(domain::key(name.as_deref(), slug))
}

/// The key the info page `/{slug}+` names on the request's host.
pub(crate) fn key_of_host<B>(state: &AppState, req: &Request<B>, slug: &str) -> Option<String> {
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok());
    match state.settings.hosts.domain_of(host) {
        HostDomain::Default => Some(slug.to_string()),
        HostDomain::Branded(d) => Some(domain::key(Some(&d), slug)),
        HostDomain::Invalid => None,
    }
}

/// True when `host` (a destination's) is a registered branded domain or under one: a link to it
/// would be a link to a link (SYSTEM.md invariant 13). Reads at most five names.
pub(crate) async fn is_branded(state: &AppState, host: &str) -> Result<bool, ApiError> {
    let mut name = host;
    for _ in 0..5 {
        if !domain::is_domain(name) {
            return Ok(false);
        }
        if lookup(state, name).await?.is_some() {
            return Ok(true);
        }
        match name.split_once('.') {
            Some((_, parent)) if parent.contains('.') => name = parent,
            _ => return Ok(false),
        }
    }
    Ok(false)
}
