//! `GET|HEAD /{slug}`: the hot path. Phases: validate → resolve (local → memcached → store)
//! → decide (404 / 410 / redirect) → respond → record the click (never awaited).

use crate::app::AppState;
use crate::app::Peer;
use crate::cache::Lookup;
use crate::error::ApiError;
use crate::error::Resp;
use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::Full;
use std::time::Instant;
use zlink_clients::clicks;
use zlink_wire::events::{ClickEvent, Tier};
use zlink_wire::{slug, LinkStatus};

pub async fn redirect<B>(state: &AppState, req: &Request<B>, slug: &str) -> Resp {
    let started = Instant::now();
    // The redirect's own deadline, below the frontend's per-try timeout: a 503 from here reaches
    // nginx in time for it to try the next rung, instead of nginx timing out on us.
    let resp = match tokio::time::timeout(state.settings.redirect_timeout, answer(state, req, slug))
        .await
    {
        Ok(resp) => resp,
        Err(_) => ApiError::Timeout.into_response(),
    };
    state
        .metrics
        .redirect_seconds
        .observe(started.elapsed().as_secs_f64());
    resp
}

async fn answer<B>(state: &AppState, req: &Request<B>, slug: &str) -> Resp {
    // Anything that is not a possible slug cannot exist: 404 without touching any cache.
    if !slug::is_valid_slug(slug) {
        return ApiError::NotFound.into_response();
    }
    // An auto-shaped slug whose ID was never handed out cannot exist either (scans).
    if slug::is_auto_shape(slug) {
        let may_exist = match state.codec.decode(slug) {
            Some(id) => state.issued.may_exist(id).await,
            None => Ok(false),
        };
        match may_exist {
            Ok(true) => {}
            Ok(false) => {
                state
                    .metrics
                    .lookups
                    .with_label_values(&["never_issued"])
                    .inc();
                return ApiError::NotFound.into_response();
            }
            Err(e) => return ApiError::from(e).into_response(),
        }
    }
    let (link, layer) = match state.cache.resolve(slug).await {
        Ok((Lookup::Found(link), layer)) => (link, layer),
        Ok((Lookup::Missing, layer)) => {
            let mut r = ApiError::NotFound.into_response();
            r.extensions_mut().insert(layer);
            return r;
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    let now = state.clock.now_ms();
    if link.status != LinkStatus::Active || link.exp.is_some_and(|exp| exp <= now) {
        return ApiError::Gone.into_response();
    }
    let (Ok(location), Ok(code)) = (
        HeaderValue::from_str(&link.url),
        StatusCode::from_u16(link.code),
    ) else {
        return ApiError::Internal(format!("link {slug:?} has an unusable url or code"))
            .into_response();
    };
    let mut resp = Resp::new(Full::new(Bytes::new()));
    resp.extensions_mut().insert(layer);
    *resp.status_mut() = code;
    let h = resp.headers_mut();
    h.insert(header::LOCATION, location);
    h.insert(header::CACHE_CONTROL, state.settings.cache_control.clone());
    h.insert("x-zlink-tier", HeaderValue::from_static("primary"));
    if clicks::is_click(req.method()) {
        let ev = click(state, req, slug, now);
        let id = ev.id;
        if state.events.clicked(ev) {
            resp.headers_mut()
                .insert(clicks::CLICK_ID_HEADER, clicks::click_id_value(id));
        }
    }
    resp
}

/// The click under the outermost hop's id and time (from a trusted proxy), so a request that
/// nginx already failed over and this primary finishes late is the same click, counted once.
fn click<B>(state: &AppState, req: &Request<B>, slug: &str, now_ms: i64) -> ClickEvent {
    let origin = state
        .settings
        .trusted_proxies
        .origin(Peer::ip_of(req), req.headers(), now_ms);
    clicks::event(
        Tier::Primary,
        &state.settings.ip_hash_salt,
        slug,
        &origin,
        req.headers(),
    )
}
