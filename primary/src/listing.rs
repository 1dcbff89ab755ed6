//! `GET /api/v1/links?limit=&cursor=&status=&owner=&q=&domain=`: an owner's links, newest first, a page
//! at a time, from the owner index (`links_by_owner`, one partition per owner and month).
//!
//! The index is written before each link (see [`zlink_store::Links::index`]), so an entry may
//! name a link that was never created, or a slug another owner won, or carry the time of a
//! retried create: the list reads each entry's link and keeps only entries whose link exists,
//! belongs to the owner and was created at the entry's time. A status filter is applied to
//! those links, so a page may hold fewer than `limit` links while `next_cursor` is not null;
//! one request examines at most [`MAX_EXAMINED`] entries. Deleted links are listed only with
//! `status=DELETED`. `q=` keeps links whose alias or slug contains it, in any case (a scan of
//! the owner's list, bounded like any filter). `domain=` keeps the links on that branded domain
//! (one of the default domain's names: the default domain's links).

use crate::api::{link_json, writer};
use crate::app::AppState;
use crate::error::{json_response, ApiError, Resp};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use futures_util::stream::{self, StreamExt};
use http::{Request, StatusCode};
use std::collections::HashSet;
use zlink_store::links::{month_of_ms, ListPosition};
use zlink_store::Link;
use zlink_wire::LinkStatus;

pub const DEFAULT_LIMIT: usize = 20;
pub const MAX_LIMIT: usize = 100;
/// Index entries one request reads at most (a filter that matches few links ends the page
/// early, with a cursor to go on from).
pub const MAX_EXAMINED: usize = 1000;

/// A parsed list request.
#[derive(Debug, PartialEq, Eq)]
pub struct ListQuery {
    pub limit: usize,
    pub after: Option<ListPosition>,
    pub status: Option<LinkStatus>,
    pub owner: Option<String>,
    /// `q`: lowercased; a link matches if its alias or slug contains it (any case).
    pub search: Option<String>,
    /// `domain`: normalised.
    pub domain: Option<String>,
}

/// The cursor: `<created ms>.<slug>` of the last link returned, base64url without padding, so
/// clients treat it as opaque.
pub fn encode_cursor(p: &ListPosition) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}.{}", p.created_at_ms, p.key))
}

/// A cursor [`encode_cursor`] gave (canonical base64url only), else `None`.
pub fn decode_cursor(c: &str) -> Option<ListPosition> {
    if c.len() > 512 {
        return None;
    }
    let raw = String::from_utf8(URL_SAFE_NO_PAD.decode(c).ok()?).ok()?;
    let (ms, slug) = raw.split_once('.')?;
    let created_at_ms: i64 = ms.parse().ok()?;
    if created_at_ms < 0 || !zlink_wire::domain::is_valid_key(slug) {
        return None;
    }
    Some(ListPosition {
        created_at_ms,
        key: slug.into(),
    })
}

/// Parses the query string; anything unknown, repeated or out of range is refused.
pub fn parse_query(query: Option<&str>) -> Result<ListQuery, ApiError> {
    let mut q = ListQuery {
        limit: DEFAULT_LIMIT,
        after: None,
        status: None,
        owner: None,
        search: None,
        domain: None,
    };
    let invalid = |code: &'static str, m: &str| ApiError::Invalid(code, m.to_string());
    let mut seen: HashSet<String> = HashSet::new();
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if !seen.insert(k.to_string()) {
            return Err(invalid("invalid_query", "a query parameter is repeated"));
        }
        match k.as_ref() {
            "limit" => {
                q.limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| invalid("invalid_limit", "limit must be 1 to 100"))?;
            }
            "cursor" => {
                q.after =
                    Some(decode_cursor(&v).ok_or_else(|| {
                        invalid("invalid_cursor", "cursor is not one this API gave")
                    })?);
            }
            "status" => {
                q.status = Some(v.parse::<LinkStatus>().map_err(|()| {
                    invalid(
                        "invalid_status",
                        "status must be ACTIVE, DISABLED, EXPIRED or DELETED",
                    )
                })?);
            }
            "q" => {
                let n = v.chars().count();
                if n == 0 || n > crate::api::MAX_ALIAS_CHARS {
                    return Err(invalid("invalid_query", "q must be 1 to 100 characters"));
                }
                q.search = Some(v.to_lowercase());
            }
            "owner" => {
                crate::auth::validate_owner(&v)
                    .map_err(|m| ApiError::Invalid("invalid_owner", m))?;
                q.owner = Some(v.to_string());
            }
            "domain" => {
                let d = zlink_wire::domain::normalize(&v)
                    .map_err(|e| ApiError::Invalid("invalid_domain", e.to_string()))?;
                q.domain = Some(d);
            }
            _ => {
                return Err(invalid(
                    "invalid_query",
                    "unknown query parameter; known: limit, cursor, status, owner, q, domain",
                ))
            }
        }
    }
    Ok(q)
}

/// `GET /api/v1/links`. An owner key lists its own links; an admin key its own or, with
/// `owner=`, anyone's. Counted against the key's write limits (a page costs up to a thousand
/// reads).
#[utoipa::path(operation_id = "list_links", get, path = "/api/v1/links", tag = "links",
    params(("limit" = Option<u32>, Query), ("cursor" = Option<String>, Query),
        ("status" = Option<String>, Query), ("owner" = Option<String>, Query),
        ("q" = Option<String>, Query, description = "Alias or slug contains"),
        ("domain" = Option<String>, Query, description = "Only links on this domain")),
    responses((status = 200, body = crate::views::LinkPage), (status = 422, body = crate::views::Error)),
    security(("bearer" = [])))]
pub async fn list<B>(state: &AppState, req: &Request<B>) -> Result<Resp, ApiError> {
    let principal = writer(state, req).await?;
    let q = parse_query(req.uri().query())?;
    let owner = match &q.owner {
        Some(o) if !principal.may_manage(o) => return Err(ApiError::Forbidden),
        Some(o) => o.clone(),
        None => principal.owner.clone(),
    };
    // The domain filter as a link key's domain part (`None`: the default domain).
    let domain_filter: Option<Option<&str>> = q
        .domain
        .as_deref()
        .map(|d| (!state.settings.hosts.is_default(d)).then_some(d));
    let now = state.clock.now_ms();
    let links = &state.store.links;
    let months: Vec<i32> = links
        .owner_months(&owner)
        .await?
        .into_iter()
        .filter(|m| {
            q.after
                .as_ref()
                .is_none_or(|p| *m <= month_of_ms(p.created_at_ms))
        })
        .collect();
    let mut out: Vec<Link> = Vec::new();
    let mut examined = 0usize;
    let mut pos = q.after.clone();
    for month in months {
        // The cursor bounds only its own month; older months are read from their newest.
        let mut after = pos
            .clone()
            .filter(|p| month_of_ms(p.created_at_ms) == month);
        loop {
            let want = (MAX_EXAMINED - examined).min(2 * q.limit + 8);
            let page = links
                .owner_page(&owner, month, after.as_ref(), want as i32)
                .await?;
            let short = page.len() < want;
            let read = read_links(state, &page).await?;
            for (entry, link) in page.into_iter().zip(read) {
                examined += 1;
                pos = Some(entry.clone());
                after = Some(entry.clone());
                let Some(link) = link else { continue };
                if link.owner != owner || link.created_at_ms != entry.created_at_ms {
                    continue;
                }
                let status = link.status.effective(link.expires_at_ms, now);
                let wanted = match q.status {
                    Some(s) => status == s,
                    // Deleted links only when asked for.
                    None => status != LinkStatus::Deleted,
                };
                let found = q.search.as_deref().is_none_or(|needle| {
                    link.key.to_lowercase().contains(needle)
                        || link
                            .alias
                            .as_deref()
                            .is_some_and(|a| a.to_lowercase().contains(needle))
                });
                let on_domain = domain_filter.is_none_or(|d| link.key.domain() == d);
                if !wanted || !found || !on_domain {
                    continue;
                }
                out.push(link);
                if out.len() == q.limit {
                    return Ok(page_response(state, &out, Some(&entry), now));
                }
            }
            if examined >= MAX_EXAMINED {
                return Ok(page_response(state, &out, pos.as_ref(), now));
            }
            if short {
                break;
            }
        }
    }
    Ok(page_response(state, &out, None, now))
}

/// Link reads of one list request in flight at once.
const READ_CONCURRENCY: usize = 32;

/// The links of a page of entries, in the entries' order, [`READ_CONCURRENCY`] reads at a time
/// within the API's statement budget (not the redirect's tighter read budget: a list must not
/// trip the store breaker the redirects rely on).
async fn read_links(
    state: &AppState,
    entries: &[ListPosition],
) -> Result<Vec<Option<Link>>, ApiError> {
    let slugs: Vec<String> = entries.iter().map(|e| e.key.to_string()).collect();
    let links: Vec<Result<Option<Link>, _>> = stream::iter(slugs)
        .map(|slug| async move { state.store.links.get_for_api(&slug).await })
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    links
        .into_iter()
        .map(|l| l.map_err(ApiError::from))
        .collect()
}

fn page_response(state: &AppState, links: &[Link], next: Option<&ListPosition>, now: i64) -> Resp {
    let items: Vec<crate::views::LinkView> =
        links.iter().map(|l| link_json(state, l, now)).collect();
    json_response(
        StatusCode::OK,
        &crate::views::LinkPage {
            links: items,
            next_cursor: next.map(encode_cursor),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_only_canonical_ones_parse() {
        for slug in [
            "abcd",
            "Zz-_09",
            "abcdefghijklmnop",
            "0123456789abcdef0123456789abcdef",
        ] {
            let p = ListPosition {
                created_at_ms: 1_790_000_000_123,
                key: slug.into(),
            };
            let c = encode_cursor(&p);
            assert!(c
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
            assert_eq!(decode_cursor(&c), Some(p));
        }
        for bad in [
            "",
            "x",
            "!!!!",
            "MTIz",
            "LTEuYQ",
            "MS4vZXRj",
            &"A".repeat(600),
        ] {
            assert_eq!(decode_cursor(bad), None, "{bad:?}");
        }
        // Same bytes, non-zero trailing bits: not a cursor this API gave.
        let good = encode_cursor(&ListPosition {
            created_at_ms: 1,
            // "1.abcde": 7 bytes, so the last character carries 4 unused bits.
            key: "abcde".into(),
        });
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut tweaked = good.clone().into_bytes();
        let last = tweaked.last_mut().unwrap();
        let value = ALPHABET.iter().position(|b| b == last).unwrap();
        // The lowest of the unused bits set: the same 7 bytes, another spelling.
        *last = ALPHABET[value | 1];
        assert_ne!(tweaked, good.as_bytes());
        assert_eq!(decode_cursor(std::str::from_utf8(&tweaked).unwrap()), None);
    }

    #[test]
    fn queries_are_parsed_strictly() {
        let q = parse_query(None).unwrap();
        assert_eq!((q.limit, q.status, q.owner), (DEFAULT_LIMIT, None, None));
        let q = parse_query(Some("limit=5&status=DISABLED&owner=team-a&q=Spring%20Sale")).unwrap();
        assert_eq!(q.search.as_deref(), Some("spring sale"));
        assert_eq!(q.limit, 5);
        assert_eq!(q.status, Some(LinkStatus::Disabled));
        assert_eq!(q.owner.as_deref(), Some("team-a"));
        for bad in [
            "limit=0",
            "limit=101",
            "limit=x",
            "status=GONE",
            "cursor=%3Cscript%3E",
            "sort=asc",
            "limit=1&limit=2",
            "owner=%00",
            "q=",
        ] {
            let e = parse_query(Some(bad)).unwrap_err();
            assert!(matches!(e, ApiError::Invalid(..)), "{bad}: {e:?}");
        }
    }
}
