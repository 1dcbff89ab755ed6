//! `GET|HEAD /{slug}`: the hot path. Phases: validate → resolve (local → memcached → store)
//! → decide (404 / 410 / redirect) → respond → record the click (never awaited).

use crate::app::AppState;
use crate::cache::Lookup;
use crate::error::ApiError;
use crate::http::{Peer, Resp};
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::Full;
use sha2::{Digest, Sha256};
use std::net::IpAddr;
use std::time::Instant;
use zlink_wire::events::{ClickEvent, Tier, CLICK_EVENT_SCHEMA};
use zlink_wire::{slug, LinkStatus};

const MAX_REFERRER: usize = 1024;
const MAX_USER_AGENT: usize = 512;

pub async fn redirect<B>(state: &AppState, req: &Request<B>, slug: &str) -> Resp {
    let started = Instant::now();
    let resp = answer(state, req, slug).await;
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
    let link = match state.cache.resolve(slug).await {
        Ok(Lookup::Found(link)) => link,
        Ok(Lookup::Missing) => return ApiError::NotFound.into_response(),
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
    *resp.status_mut() = code;
    let h = resp.headers_mut();
    h.insert(header::LOCATION, location);
    h.insert(header::CACHE_CONTROL, state.settings.cache_control.clone());
    h.insert("x-zlink-tier", HeaderValue::from_static("primary"));
    state.events.clicked(click(state, req, slug, now));
    resp
}

fn header_text(headers: &HeaderMap, name: header::HeaderName, max: usize) -> Option<String> {
    let v = headers.get(name)?.to_str().ok()?;
    let mut end = v.len().min(max);
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    Some(v[..end].to_string())
}

/// The client address: the TCP peer, unless the peer is a local proxy (our nginx), in which case
/// the last `X-Forwarded-For` entry, which that proxy appended.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap) -> IpAddr {
    if !peer.is_loopback() {
        return peer;
    }
    // Only the rightmost entry was written by our proxy; anything left of it is client-supplied.
    headers
        .get_all("x-forwarded-for")
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .and_then(|s| s.trim().parse::<IpAddr>().ok())
        .unwrap_or(peer)
}

fn click<B>(state: &AppState, req: &Request<B>, slug: &str, now_ms: i64) -> ClickEvent {
    let headers = req.headers();
    let peer = req
        .extensions()
        .get::<Peer>()
        .map(|p| p.0.ip())
        .unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let ip = client_ip(peer, headers);
    let mut h = Sha256::new();
    h.update(state.settings.ip_hash_salt.as_bytes());
    h.update(ip.to_string().as_bytes());
    ClickEvent {
        schema: CLICK_EVENT_SCHEMA,
        id: uuid::Uuid::now_v7(),
        slug: slug.to_string(),
        at_ms: now_ms,
        tier: Tier::Primary,
        referrer: header_text(headers, header::REFERER, MAX_REFERRER),
        user_agent: header_text(headers, header::USER_AGENT, MAX_USER_AGENT),
        ip_hash: hex::encode(h.finalize()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ip_trusts_forwarded_for_only_from_loopback() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static("1.1.1.1, 203.0.113.9"),
        );
        assert_eq!(
            client_ip("127.0.0.1".parse().unwrap(), &h),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client_ip("198.51.100.1".parse().unwrap(), &h),
            "198.51.100.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client_ip("127.0.0.1".parse().unwrap(), &HeaderMap::new()),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn header_text_truncates_on_char_boundaries() {
        let mut h = HeaderMap::new();
        h.insert(header::USER_AGENT, HeaderValue::from_static("abcdef"));
        assert_eq!(
            header_text(&h, header::USER_AGENT, 3).as_deref(),
            Some("abc")
        );
    }
}
