//! Which domain a request, a route or a create names, and whether a host is one of ours: what
//! the link API needs of branded domains ([`crate::domains`] is their own API). The redirect
//! path never reads the `domains` table (a link's key carries its domain).

use crate::app::AppState;
use crate::auth::Principal;
use crate::error::ApiError;
use http::Request;
use zlink_store::domains::{Domain, DomainStatus};
use zlink_wire::domain;

/// A registration, read through a few seconds' cache (creates on a domain read it each time).
pub(crate) async fn lookup(state: &AppState, name: &str) -> Result<Option<Domain>, ApiError> {
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
    let name =
        domain::normalize(raw).map_err(|e| ApiError::Invalid("invalid_domain", e.to_string()))?;
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
    state
        .settings
        .hosts
        .key_of(host, slug)
        .map(std::borrow::Cow::into_owned)
}

/// Suffixes of a destination host looked up at most: registered domains are short names, so
/// the shortest suffixes are read first.
const MAX_SUFFIXES: usize = 10;

/// True when `host` (a destination's) is a registered branded domain or under one: a link to it
/// would be a link to a link (SYSTEM.md invariant 13). Reads (through the cache) each suffix of
/// two labels or more, shortest first, at most [`MAX_SUFFIXES`].
pub(crate) async fn is_branded(state: &AppState, host: &str) -> Result<bool, ApiError> {
    if !domain::is_domain(host) {
        return Ok(false);
    }
    let dots: Vec<usize> = host.match_indices('.').map(|(i, _)| i).collect();
    // Suffix starts, shortest suffix first: after the second-to-last dot, ..., the whole name.
    let starts = dots.iter().rev().skip(1).map(|i| i + 1).chain([0]);
    for start in starts.take(MAX_SUFFIXES) {
        if lookup(state, &host[start..]).await?.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}
