//! Reading click stats: `GET /api/v1/links/{slug}/stats` (owner or admin key) and the public
//! info page `GET /{slug}+` (destination, creation date, click count; no click recorded).

use crate::api::load_managed;
use crate::app::{AppState, Limit};
use crate::error::Resp;
use crate::error::{json_response, ApiError};
use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::Full;
use std::sync::Arc;
use zlink_store::clicks::{day_of, ClickStore};
use zlink_wire::blob::escape_html;
use zlink_wire::{slug, LinkStatus};

/// Days listed one by one in the stats API.
pub const RECENT_DAYS: i32 = 30;

/// The first day a link's clicks can be on: the day before it was created (clicks carry the
/// frontend's clock, which may be a little behind this one's).
fn since_day(link: &zlink_store::links::Link) -> i32 {
    day_of(link.created_at_ms).saturating_sub(1)
}

async fn click_store(state: &AppState) -> Result<Arc<ClickStore>, ApiError> {
    state
        .click_stats
        .get_or_try_init(|| async {
            ClickStore::prepare(state.store.db.clone())
                .await
                .map(Arc::new)
        })
        .await
        .cloned()
        .map_err(ApiError::from)
}

/// `GET /api/v1/links/{slug}/stats`
#[utoipa::path(operation_id = "link_stats", get, path = "/api/v1/links/{slug}/stats", tag = "links",
    params(("slug" = String, Path), ("domain" = Option<String>, Query)),
    responses((status = 200, body = crate::views::Stats), (status = 404, body = crate::views::Error)),
    security(("bearer" = [])))]
pub async fn api<B>(state: &AppState, req: &Request<B>, slug: &str) -> Result<Resp, ApiError> {
    let principal = state.principal(req).await?;
    let link = load_managed(state, &principal, slug, false).await?;
    let stats = click_store(state)
        .await?
        .link_stats(&link.key, since_day(&link))
        .await?;
    let today = day_of(state.clock.now_ms());
    let body = crate::views::Stats::of(&stats, &link.key, today, RECENT_DAYS);
    Ok(json_response(StatusCode::OK, &body))
}

/// `GET|HEAD /{slug}+`: a small HTML page; 404/410 like the redirect itself.
#[utoipa::path(operation_id = "info_page", get, path = "/{slug}+", tag = "redirect",
    params(("slug" = String, Path)),
    responses((status = 200, content_type = "text/html", description = "HTML page"), (status = 404, body = crate::views::Error)))]
pub async fn info<B>(state: &AppState, req: &Request<B>, slug: &str) -> Result<Resp, ApiError> {
    if !slug::is_valid_slug(slug) {
        return Err(ApiError::NotFound);
    }
    // The link on the domain the request's host names (an unknown name: none).
    let key = crate::hosts::key_of_host(state, req, slug).ok_or(ApiError::NotFound)?;
    state.admit_ip(Limit::InfoPerIp, state.client_ip(req))?;
    let link = state
        .store
        .links
        .get(&key)
        .await?
        .ok_or(ApiError::NotFound)?;
    let now = state.clock.now_ms();
    if link.status.effective(link.expires_at_ms, now) != LinkStatus::Active {
        return Err(ApiError::Gone);
    }
    // Public and unauthenticated: the total is cached for a few seconds so a flood of info
    // requests reads each link's counts once per TTL, not once per request.
    let store = click_store(state).await?;
    let total = state
        .info_totals
        .try_get_with(link.key.to_string(), async {
            store
                .link_stats(&link.key, since_day(&link))
                .await
                .map(|s| (s.total, s.humans()))
        })
        .await
        .map_err(|e| ApiError::from((*e).clone()))?;
    let created = chrono::DateTime::from_timestamp_millis(link.created_at_ms)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_default();
    let body = page(&state.short_url(&link.key), &link.url, &created, total);
    let mut resp = Resp::new(Full::new(Bytes::from(body)));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert("x-robots-tag", HeaderValue::from_static("noindex"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    Ok(resp)
}

/// The info page. Every value from a user (the destination) is HTML-escaped; the short URL is
/// built from the configured base and a validated slug, and escaped anyway.
pub fn page(
    short_url: &str,
    destination: &str,
    created: &str,
    (total, humans): (i64, i64),
) -> String {
    let (short, dest) = (escape_html(short_url), escape_html(destination));
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <meta name=\"robots\" content=\"noindex\"><title>{short}</title>\
         <style>body{{font:16px system-ui,sans-serif;max-width:40em;margin:3em auto;padding:0 1em}}\
         dt{{font-weight:bold}}dd{{margin:0 0 1em;overflow-wrap:anywhere}}</style></head>\n\
         <body><h1>{short}</h1><dl>\
         <dt>Destination</dt><dd><a href=\"{dest}\" rel=\"nofollow noopener noreferrer\">{dest}</a></dd>\
         <dt>Created</dt><dd>{created}</dd>\
         <dt>Clicks</dt><dd>{total} ({humans} by people, {bots} by bots and link previews)</dd>\
         </dl></body></html>\n",
        created = escape_html(created),
        bots = total - humans,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn page_escapes_the_destination() {
        let p = super::page(
            "http://s/abc",
            "https://e.com/\"><script>alert(1)</script>?a=1&b=2",
            "2026-11-22 10:00 UTC",
            (7, 5),
        );
        assert!(!p.contains("<script>"));
        assert!(p.contains("&lt;script&gt;"));
        assert!(p.contains("&amp;b=2"));
        assert!(p.contains("7 (5 by people, 2 by bots and link previews)"));
    }
}
