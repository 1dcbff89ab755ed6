//! Branded short domains' own API: `POST /api/v1/domains` (register), `GET /api/v1/domains`
//! (the caller's), `POST /api/v1/domains/{domain}/approve` (admin). What the link API needs of
//! them (the domain of a create, the key a route names) is [`crate::hosts`].
//!
//! A registration is ACTIVE at once when an admin makes it or the name is under
//! `--branded-domains-allowed`; otherwise PENDING until an admin approves it. Links exist only on
//! active domains; the redirect path never reads this table (a link's key carries its domain).

use crate::api::writer;
use crate::app::AppState;
use crate::body::read_json;
use crate::error::{json_response, ApiError, Resp};
use crate::views::{DomainList, DomainView};
use http::{Request, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use zlink_store::domains::{Domain, DomainStatus};
use zlink_wire::destination;
use zlink_wire::domain;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegisterRequest {
    domain: String,
}

fn invalid_domain(e: impl std::fmt::Display) -> ApiError {
    ApiError::Invalid("invalid_domain", e.to_string())
}

/// `POST /api/v1/domains` with `{"domain": "go.example.com"}`: 201 with the registration, or
/// 200 with the caller's existing one (registering twice changes nothing); 409 when another
/// owner has the name.
#[utoipa::path(operation_id = "register_domain", post, path = "/api/v1/domains", tag = "domains",
    request_body = crate::domains::RegisterRequest,
    responses((status = 201, body = crate::views::DomainView), (status = 200, description = "Already the caller's", body = crate::views::DomainView),
        (status = 409, body = crate::views::Error), (status = 422, body = crate::views::Error)),
    security(("bearer" = [])))]
pub async fn register(state: &AppState, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let principal = writer(state, &req).await?;
    let body: RegisterRequest = read_json(req, state.settings.max_body_bytes).await?;
    let name = domain::normalize(&body.domain).map_err(invalid_domain)?;
    // The own domains (host of --public-base-url, --short-domains) and their subdomains: a
    // superset of the default domain's names that a normalised name can be.
    if state.destinations.is_own_domain(&name) {
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
    if let Some(c) = &state.certs {
        c.invalidate(&stored.domain).await;
    }
    if won {
        tracing::info!(domain = %stored.domain, owner = ?stored.owner, status = stored.status.as_str(), "domain registered");
    }
    let status = if won {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(
        status,
        &DomainView::checked(&stored, state.certs.as_ref()).await,
    ))
}

/// `GET /api/v1/domains`: the caller's domains.
#[utoipa::path(operation_id = "list_domains", get, path = "/api/v1/domains", tag = "domains",
    responses((status = 200, body = crate::views::DomainList)), security(("bearer" = [])))]
pub async fn list<B>(state: &AppState, req: &Request<B>) -> Result<Resp, ApiError> {
    let principal = state.principal(req).await?;
    let domains = state.store.domains.of_owner(&principal.owner).await?;
    // Each domain's certificates checked (cached), eight domains at a time; a site that did
    // not answer is skipped for 30 s, so a listing waits at most one deadline for it.
    let mut views = Vec::with_capacity(domains.len());
    for chunk in domains.chunks(8) {
        let checked = chunk
            .iter()
            .map(|d| DomainView::checked(d, state.certs.as_ref()));
        views.extend(futures_util::future::join_all(checked).await);
    }
    let domains = views;
    Ok(json_response(StatusCode::OK, &DomainList { domains }))
}

/// `POST /api/v1/domains/{domain}/approve` (admin keys only): PENDING → ACTIVE.
#[utoipa::path(operation_id = "approve_domain", post, path = "/api/v1/domains/{domain}/approve", tag = "domains",
    params(("domain" = String, Path)),
    responses((status = 200, body = crate::views::DomainView), (status = 403, body = crate::views::Error), (status = 404, body = crate::views::Error)),
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
    Ok(json_response(
        StatusCode::OK,
        &DomainView::checked(&d, state.certs.as_ref()).await,
    ))
}
