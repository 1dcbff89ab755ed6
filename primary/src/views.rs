//! The JSON the API answers with: each type is serialized as it is documented (its OpenAPI
//! schema is the body). Only [`Error`] documents a shape built elsewhere (the kit's
//! `zlink_redirect::error`, shared by every tier).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;
use zlink_store::clicks::{LinkStats, DAY_MS};
use zlink_store::Link;
use zlink_wire::events::{AgentClass, Device, Tier};
use zlink_wire::LinkStatus;

/// A link as the API returns it.
#[derive(Debug, Serialize, ToSchema)]
pub struct LinkView {
    /// The slug (the path segment after the domain).
    slug: String,
    /// The branded domain; `null` on the default domain.
    domain: Option<String>,
    short_url: String,
    url: String,
    /// ACTIVE, DISABLED, EXPIRED or DELETED: the effective status (a link past its expiry is
    /// EXPIRED whatever was stored).
    #[schema(value_type = String)]
    status: LinkStatus,
    created_at: String,
    expires_at: Option<String>,
    redirect_code: u16,
    owner: String,
    version: i64,
    /// `admin` (a takedown) or `owner`, while DISABLED.
    disabled_by: Option<&'static str>,
    alias: Option<String>,
}

impl LinkView {
    /// `l` as of `now_ms`, answered under `short_url`.
    pub fn of(short_url: String, l: &Link, now_ms: i64) -> LinkView {
        let (domain, slug) = (l.key.domain(), l.key.slug());
        LinkView {
            slug: slug.to_string(),
            domain: domain.map(str::to_string),
            short_url,
            url: l.url.clone(),
            status: l.status.effective(l.expires_at_ms, now_ms),
            created_at: rfc3339(l.created_at_ms),
            expires_at: l.expires_at_ms.map(rfc3339),
            redirect_code: l.redirect_code,
            owner: l.owner.clone(),
            version: l.version,
            // Whose disable this is: "admin" is a takedown, which only an admin can undo.
            disabled_by: l
                .disabled_by
                .as_ref()
                .map(|d| if d.admin { "admin" } else { "owner" }),
            alias: l.alias.clone(),
        }
    }
}

/// A time in milliseconds since 1970 as RFC 3339 (UTC, milliseconds), as every view shows it.
pub fn rfc3339(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// A page of an owner's links, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct LinkPage {
    pub links: Vec<LinkView>,
    /// Pass as `cursor` for the next page; `null` at the end.
    pub next_cursor: Option<String>,
}

/// A branded domain registration.
#[derive(Debug, Serialize, ToSchema)]
pub struct DomainView {
    pub domain: String,
    pub owner: String,
    /// PENDING (waits for an admin) or ACTIVE.
    pub status: String,
    pub created_at: String,
    /// Whether every site serves a valid certificate for the domain (where the service is
    /// configured with its sites, `--tls-sites`): its links are servable over HTTPS on every
    /// rung only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub https: Option<crate::certs::DomainHttps>,
}

impl DomainView {
    pub fn of(d: &zlink_store::domains::Domain) -> DomainView {
        DomainView {
            domain: d.domain.clone(),
            owner: d.owner.clone(),
            status: d.status.as_str().to_string(),
            created_at: rfc3339(d.created_at_ms),
            https: None,
        }
    }

    /// With each site's certificate state, when the service knows its sites.
    pub async fn checked(
        d: &zlink_store::domains::Domain,
        certs: Option<&crate::certs::CertChecks>,
    ) -> DomainView {
        let mut v = DomainView::of(d);
        if let Some(c) = certs {
            v.https = Some(c.of(&d.domain).await.as_ref().clone());
        }
        v
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DomainList {
    pub domains: Vec<DomainView>,
}

/// Each item's outcome, in request order: `replayed` and `link` when it was created (or
/// replayed), `error` when it was not.
#[derive(Debug, Serialize, ToSchema)]
pub struct BulkItem {
    pub index: usize,
    /// 201, or the status the item alone would have got.
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BulkResult {
    pub created: usize,
    pub replayed: usize,
    pub failed: usize,
    pub results: Vec<BulkItem>,
}

/// Click totals: per day (last 30), per tier, agent class, device, and the top referrers,
/// countries and cities, over every rung's clicks. Built from the store's read model
/// ([`Stats::of`]) and serialized as is: the schema is the body.
#[derive(Debug, Serialize, ToSchema)]
pub struct Stats {
    slug: String,
    /// The branded domain; `null` on the default domain.
    domain: Option<String>,
    total: i64,
    /// Clicks by browsers.
    humans: i64,
    /// Clicks by bots and link-preview crawlers.
    bots: i64,
    /// `browser`, `bot`, `preview` (each present, zeros included).
    by_agent: BTreeMap<&'static str, i64>,
    /// `primary`, `lastresort`, `lastresort-nginx` (each present, zeros included).
    by_tier: BTreeMap<&'static str, i64>,
    /// `desktop`, `mobile`, `tablet`, `other` (each present, zeros included).
    by_device: BTreeMap<&'static str, i64>,
    /// The last 30 days, oldest first, days without clicks included.
    last_days: Vec<DayClicks>,
    top_referrers: Vec<ReferrerClicks>,
    top_countries: Vec<CountryClicks>,
    top_cities: Vec<CityClicks>,
}

/// One day's clicks.
#[derive(Debug, Serialize, ToSchema)]
pub struct DayClicks {
    /// `YYYY-MM-DD` (UTC).
    date: String,
    clicks: i64,
}

/// A referrer host (`(direct)` without one, `(other)` past the daily cap).
#[derive(Debug, Serialize, ToSchema)]
pub struct ReferrerClicks {
    referrer: String,
    clicks: i64,
}

/// A country: ISO 3166 code, or `(unknown)`.
#[derive(Debug, Serialize, ToSchema)]
pub struct CountryClicks {
    country: String,
    clicks: i64,
}

/// A city; `country` is `null` for `(other)` (cities past the daily cap).
#[derive(Debug, Serialize, ToSchema)]
pub struct CityClicks {
    country: Option<String>,
    city: String,
    clicks: i64,
}

/// How many referrers, countries and cities the stats list.
const TOP: usize = 10;

impl Stats {
    /// The stats of the link `key` (`<domain>/<slug>` or a default-domain slug) as of `today`
    /// (days since 1970-01-01), listing the `days` days up to it.
    pub fn of(stats: &LinkStats, key: &str, today: i32, days: i32) -> Stats {
        let (domain, slug) = zlink_wire::domain::split(key);
        let date = |d: i32| {
            chrono::DateTime::from_timestamp_millis(i64::from(d) * DAY_MS)
                .map(|t| t.format("%Y-%m-%d").to_string())
                .unwrap_or_default()
        };
        let count = |m: &BTreeMap<String, i64>, name: &str| m.get(name).copied().unwrap_or(0);
        Stats {
            slug: slug.to_string(),
            domain: domain.map(str::to_string),
            total: stats.total,
            humans: stats.humans(),
            bots: stats.bots(),
            by_agent: AgentClass::ALL
                .into_iter()
                .map(|a| (a.name(), count(&stats.by_agent, a.name())))
                .collect(),
            by_tier: Tier::ALL
                .into_iter()
                .map(|t| (t.name(), count(&stats.by_tier, t.name())))
                .collect(),
            by_device: Device::ALL
                .into_iter()
                .map(|d| (d.name(), count(&stats.by_device, d.name())))
                .collect(),
            last_days: (today - days + 1..=today)
                .map(|d| DayClicks {
                    date: date(d),
                    clicks: stats.per_day.get(&d).copied().unwrap_or(0),
                })
                .collect(),
            top_referrers: stats
                .top_referrers(TOP)
                .into_iter()
                .map(|(r, clicks)| ReferrerClicks {
                    referrer: r.to_string(),
                    clicks,
                })
                .collect(),
            top_countries: stats
                .top_countries(TOP)
                .into_iter()
                .map(|(c, clicks)| CountryClicks {
                    country: c.to_string(),
                    clicks,
                })
                .collect(),
            top_cities: stats
                .top_cities(TOP)
                .into_iter()
                .map(|(key, clicks)| match key.split_once('/') {
                    Some((country, city)) => CityClicks {
                        country: Some(country.to_string()),
                        city: city.to_string(),
                        clicks,
                    },
                    None => CityClicks {
                        country: None,
                        city: key.to_string(),
                        clicks,
                    },
                })
                .collect(),
        }
    }
}

/// An API key: at creation with the key itself (shown once) and its time; at revocation
/// with `revoked`.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyView {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub owner: String,
    /// `admin` or `owner`.
    pub role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked: Option<bool>,
}

impl KeyView {
    pub fn role(admin: bool) -> &'static str {
        if admin {
            "admin"
        } else {
            "owner"
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `invalid_url`, `slug_taken`, `rate_limited`.
    pub code: String,
    pub message: String,
}

/// Every 4xx and 5xx answer (written by `zlink_redirect::error` for every tier).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Error {
    error: ErrorDetail,
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;
    use zlink_store::clicks::{DayCounts, MAX_CITIES_PER_DAY, OTHER, UNKNOWN};
    use zlink_wire::events::ClickEvent;

    fn ev(tier: Tier, agent: AgentClass, referrer: Option<&str>) -> ClickEvent {
        ClickEvent {
            schema: 1,
            id: Uuid::new_v4(),
            key: "abc".into(),
            at_ms: 1_700_000_000_000,
            tier,
            referrer: referrer.map(String::from),
            user_agent: None,
            agent,
            ip_hash: String::new(),
            device: Device::Mobile,
            country: Some("DE".into()),
            city: Some("Berlin".into()),
        }
    }

    fn json(s: &LinkStats, key: &str, today: i32, days: i32) -> serde_json::Value {
        serde_json::to_value(Stats::of(s, key, today, days)).unwrap()
    }

    #[test]
    fn the_body_lists_every_tier_and_agent_and_each_recent_day() {
        let mut d1 = DayCounts::default();
        let mut d2 = DayCounts::default();
        let a = ev(Tier::Primary, AgentClass::Browser, Some("https://a.com"));
        let b = ev(Tier::Lastresort, AgentClass::Preview, None);
        let c = ev(
            Tier::LastresortNginx,
            AgentClass::Bot,
            Some("https://a.com"),
        );
        d1.add(&[&a, &b]);
        d2.add(&[&c]);
        let mut s = LinkStats::default();
        s.merge_day(10, &d1.rows);
        s.merge_day(12, &d2.rows);
        let j = json(&s, "abc", 12, 3);
        assert_eq!(
            (j["slug"].as_str(), j["domain"].is_null()),
            (Some("abc"), true)
        );
        assert_eq!(
            (
                j["total"].as_i64(),
                j["humans"].as_i64(),
                j["bots"].as_i64()
            ),
            (Some(3), Some(1), Some(2))
        );
        assert_eq!(j["by_tier"]["lastresort-nginx"], 1);
        assert_eq!(j["by_agent"]["preview"], 1);
        assert_eq!(
            j["top_referrers"][0],
            serde_json::json!({"referrer": "a.com", "clicks": 2})
        );
        let days: Vec<i64> = j["last_days"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["clicks"].as_i64().unwrap())
            .collect();
        assert_eq!(days, vec![2, 0, 1]);
        assert_eq!(j["last_days"][0]["date"], "1970-01-11");
        let branded = json(&s, "go.example/abc", 12, 3);
        assert_eq!(
            (branded["slug"].as_str(), branded["domain"].as_str()),
            (Some("abc"), Some("go.example"))
        );
    }

    #[test]
    fn places_and_devices_are_listed_with_zeros_and_the_cap_as_other() {
        let mut d = DayCounts::default();
        let mut evs: Vec<ClickEvent> = (0..MAX_CITIES_PER_DAY + 3)
            .map(|i| {
                let mut e = ev(Tier::Primary, AgentClass::Browser, None);
                e.city = Some(format!("City {i}"));
                e
            })
            .collect();
        let mut unknown = ev(Tier::Primary, AgentClass::Browser, None);
        (unknown.country, unknown.city, unknown.device) = (None, None, Device::Desktop);
        evs.push(unknown);
        d.add(&evs.iter().collect::<Vec<_>>());
        let mut s = LinkStats::default();
        s.merge_day(1, &d.rows);
        let j = json(&s, "abc", 1, 1);
        assert_eq!(j["by_device"]["desktop"], 1);
        assert_eq!(j["by_device"]["tablet"], 0);
        assert_eq!(j["top_countries"][0]["country"], "DE");
        assert_eq!(j["top_countries"][1]["country"], UNKNOWN);
        assert_eq!(j["top_cities"].as_array().unwrap().len(), 10);
        assert_eq!(j["top_cities"][0]["city"], OTHER);
        assert!(j["top_cities"][0]["country"].is_null());
        assert_eq!(j["top_cities"][1]["country"], "DE");
    }

    #[test]
    fn a_link_shows_its_effective_status_and_who_disabled_it() {
        let mut l = Link {
            key: "go.example/abc".into(),
            url: "https://example.com/".into(),
            owner: "alice".into(),
            status: LinkStatus::Active,
            redirect_code: 302,
            created_at_ms: 1_700_000_000_000,
            expires_at_ms: Some(1_700_000_100_000),
            version: 3,
            idem: Some("not shown".into()),
            disabled_by: None,
            alias: Some("<b>launch</b>".into()),
        };
        let j = |l: &Link, now| {
            serde_json::to_value(LinkView::of("https://go.example/abc".into(), l, now)).unwrap()
        };
        let before = j(&l, 1_700_000_000_001);
        assert_eq!(before["status"], "ACTIVE");
        assert_eq!(
            (before["slug"].as_str(), before["domain"].as_str()),
            (Some("abc"), Some("go.example"))
        );
        assert_eq!(before["created_at"], "2023-11-14T22:13:20.000Z");
        assert_eq!(before["expires_at"], "2023-11-14T22:15:00.000Z");
        assert!(
            before.get("idem").is_none(),
            "the idempotency fingerprint stays inside"
        );
        assert_eq!(j(&l, 1_700_000_100_000)["status"], "EXPIRED");
        l.status = LinkStatus::Disabled;
        l.expires_at_ms = None;
        l.disabled_by = Some(zlink_store::DisabledBy {
            admin: true,
            key_id: "k1".into(),
        });
        let disabled = j(&l, 0);
        assert_eq!(
            (
                disabled["status"].as_str(),
                disabled["disabled_by"].as_str()
            ),
            (Some("DISABLED"), Some("admin"))
        );
        assert!(disabled["expires_at"].is_null());
    }
}
