//! Everything a request handler needs, built once at start.

use crate::auth::{Authenticator, Principal};
use crate::cache::{CacheSettings, RedirectCache};
use crate::config::ServeConfig;
use crate::error::ApiError;
use crate::events::EventSink;
use crate::ids::IdAllocator;
use crate::limits::{retry_after_secs, Limiter, Limits};
use crate::memcache::Memcache;
use crate::metrics::Metrics;
use crate::store::Store;
use http::{HeaderValue, Request};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use zlink_clients::breaker::Breaker;
use zlink_clients::clock::Clock;
use zlink_redirect::cache::Memcached;
use zlink_store::clicks::ClickStore;
use zlink_wire::slug::SlugCodec;

pub use zlink_redirect::Peer;

/// Request-time settings derived from the validated config.
pub struct Settings {
    pub public_base_url: String,
    /// The default domain's host names (the host of --public-base-url, --short-domains):
    /// every other host name is a branded domain.
    pub hosts: zlink_wire::domain::Hosts,
    /// `http` or `https`: the scheme of short URLs on branded domains.
    pub short_scheme: &'static str,
    /// Branded domains an owner's registration activates at once (and their subdomains).
    pub branded_allowed: Vec<String>,
    pub redirect_code: u16,
    pub cache_control: HeaderValue,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    pub redirect_timeout: Duration,
    pub ip_hash_salt: String,
    /// Whose X-Request-Id / X-Request-Start / X-Forwarded-For make a click's id, time, client.
    pub trusted_proxies: zlink_clients::clicks::TrustedProxies,
    /// Country and city of a click's client (`--geoip-db`).
    pub geo: Arc<zlink_clients::geo::Geo>,
}

pub struct AppState {
    pub settings: Settings,
    pub store: Arc<Store>,
    pub cache: RedirectCache,
    pub ids: IdAllocator,
    /// The auto-slug IDs handed out so far (random-slug scans never reach the store).
    pub issued: crate::ids::IssuedIds,
    pub codec: SlugCodec,
    pub auth: Authenticator,
    pub events: Arc<dyn EventSink>,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    /// The click stats read model (aggregates), prepared on first use (only the stats routes need them).
    pub click_stats: tokio::sync::OnceCell<Arc<ClickStore>>,
    /// Branded domain registrations (or their absence) by name, kept two seconds: creates on a
    /// domain and the destination check read them.
    pub domain_cache: moka::future::Cache<String, Option<zlink_store::domains::Domain>>,
    /// (total, humans) per slug for the public info page, kept a few seconds.
    pub info_totals: moka::future::Cache<String, (i64, i64)>,
    /// Which destinations links may have.
    pub destinations: crate::policy::Destinations,
    /// Rate limits per key and per client address.
    pub limits: Limits,
    /// Each site's certificate for a branded domain (`--tls-sites`), for the domain API.
    pub certs: Option<crate::certs::CertChecks>,
}

/// Which per-address rate limit a request is checked against.
#[derive(Debug, Clone, Copy)]
pub enum Limit {
    WritesPerIp,
    InfoPerIp,
    UnknownKeysPerIp,
}

impl Limit {
    /// The metric label.
    fn label(self) -> &'static str {
        match self {
            Limit::WritesPerIp => "writes_per_ip",
            Limit::InfoPerIp => "info_per_ip",
            Limit::UnknownKeysPerIp => "unknown_keys_per_ip",
        }
    }
}

impl AppState {
    /// `cfg` must have passed [`ServeConfig::validate`].
    pub fn new(
        cfg: &ServeConfig,
        store: Arc<Store>,
        events: Arc<dyn EventSink>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>, String> {
        let memcached = cfg.memcached_addr().map(|addr| {
            let client = Arc::new(
                Memcache::new(
                    addr,
                    cfg.memcached_pool,
                    Duration::from_millis(cfg.memcached_timeout_ms),
                    Breaker::new(
                        "memcached",
                        cfg.memcached_breaker(),
                        Some(metrics.breakers.clone()),
                    ),
                )
                .with_write_timeout(Duration::from_millis(cfg.memcached_write_timeout_ms)),
            );
            // Keys prefixed by keyspace: deployments (and test keyspaces) sharing a memcached
            // never see each other's entries.
            Memcached::new(
                client,
                format!("zl:{}:", cfg.store.keyspace),
                cfg.memcached_ttl_s,
                metrics.cache.clone(),
            )
        });
        let cache = RedirectCache::new(
            CacheSettings {
                local_bytes: cfg.local_cache_bytes,
                found_ttl: Duration::from_millis(cfg.local_cache_ttl_ms),
                missing_ttl: Duration::from_millis(cfg.negative_cache_ttl_ms),
            },
            memcached,
            store.clone(),
            metrics.clone(),
        );
        let base_host = url::Url::parse(&cfg.public_base_url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string));
        let settings = Settings {
            public_base_url: cfg.public_base_url.clone(),
            hosts: zlink_wire::domain::Hosts::new(
                base_host
                    .iter()
                    .chain(&cfg.short_domains)
                    .map(String::as_str),
            ),
            short_scheme: if cfg.public_base_url.starts_with("https://") {
                "https"
            } else {
                "http"
            },
            branded_allowed: cfg
                .branded_domains_allowed
                .iter()
                .filter_map(|d| zlink_wire::domain::normalize(d).ok())
                .collect(),
            redirect_code: cfg.redirect_code,
            cache_control: HeaderValue::from_str(&cfg.redirect_cache_control)
                .map_err(|e| e.to_string())?,
            max_body_bytes: cfg.max_body_bytes,
            request_timeout: Duration::from_millis(cfg.request_timeout_ms),
            redirect_timeout: Duration::from_millis(cfg.redirect_timeout_ms),
            ip_hash_salt: cfg.clicks.ip_hash_salt.0.clone(),
            trusted_proxies: cfg.clicks.trusted_proxies.clone(),
            geo: zlink_clients::geo::Geo::open(
                cfg.clicks.geoip_db.clone(),
                zlink_clients::clicks::GEOIP_CHECK,
                Some(metrics.clicks.geoip_loads.clone()),
            ),
        };
        let own = base_host
            .into_iter()
            .chain(cfg.short_domains.iter().cloned())
            .collect();
        let destinations = crate::policy::Destinations::new(
            own,
            cfg.deny_hosts_file.clone(),
            cfg.allow_hosts_file.clone(),
        )?;
        // Bounded: an address or key idle long enough to refill is forgotten anyway.
        let limits = Limits {
            writes_per_key: Limiter::new(cfg.limit_writes_per_key, 100_000),
            writes_per_ip: Limiter::new(cfg.limit_writes_per_ip, 100_000),
            info_per_ip: Limiter::new(cfg.limit_info_per_ip, 100_000),
            unknown_keys_per_ip: Limiter::new(cfg.limit_unknown_keys_per_ip, 100_000),
            exempt: cfg.rate_limit_exempt.clone(),
        };
        let certs = crate::certs::CertChecks::new(
            crate::certs::parse_sites(&cfg.tls_sites)?,
            cfg.tls_ca_file.as_deref(),
            Duration::from_secs(2),
            Duration::from_secs(cfg.tls_check_cache_secs),
        )?;
        Ok(Arc::new(AppState {
            certs,
            limits,
            destinations,
            settings,
            ids: IdAllocator::new(store.clone(), cfg.id_block_size),
            issued: crate::ids::IssuedIds::new(store.clone()),
            codec: SlugCodec::new(cfg.slug_key.0.as_bytes()),
            auth: Authenticator::new(store.clone()),
            cache,
            store,
            events,
            metrics,
            clock,
            click_stats: tokio::sync::OnceCell::new(),
            domain_cache: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(2))
                .build(),
            info_totals: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(5))
                .build(),
        }))
    }
}

impl AppState {
    /// The short URL of a link key: on the default domain under --public-base-url, on a
    /// branded one `<scheme>://<domain>/<slug>`.
    pub fn short_url(&self, key: &str) -> String {
        match zlink_wire::domain::split(key) {
            (None, slug) => format!("{}/{slug}", self.settings.public_base_url),
            (Some(d), slug) => format!("{}://{d}/{slug}", self.settings.short_scheme),
        }
    }

    /// The client's address: X-Forwarded-For of a trusted proxy, else the TCP peer.
    pub fn client_ip<B>(&self, req: &Request<B>) -> IpAddr {
        self.settings
            .trusted_proxies
            .client(Peer::ip_of(req), req.headers())
    }

    /// Admits one request from `ip` under a per-address limit (exempt addresses always pass).
    pub fn admit_ip(&self, limit: Limit, ip: IpAddr) -> Result<(), ApiError> {
        if self.limits.exempt.contains(ip) {
            return Ok(());
        }
        let limiter = match limit {
            Limit::WritesPerIp => &self.limits.writes_per_ip,
            Limit::InfoPerIp => &self.limits.info_per_ip,
            Limit::UnknownKeysPerIp => &self.limits.unknown_keys_per_ip,
        };
        limiter
            .check(ip.to_canonical())
            .map_err(|wait| self.limited(limit.label(), wait))
    }

    /// Admits one link write by `principal` (admin keys are not limited).
    pub fn admit_write(&self, principal: &Principal) -> Result<(), ApiError> {
        if principal.admin {
            return Ok(());
        }
        self.limits
            .writes_per_key
            .check(principal.key_id.clone())
            .map_err(|wait| self.limited("writes_per_key", wait))
    }

    /// Admits up to `n` link writes by `principal` at once (a bulk create): as many as its
    /// bucket holds now, at least one, else 429. Admin keys are not limited.
    pub fn admit_writes(&self, principal: &Principal, n: usize) -> Result<usize, ApiError> {
        if principal.admin {
            return Ok(n);
        }
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.limits
            .writes_per_key
            .check_n(principal.key_id.clone(), n)
            .map(|k| k as usize)
            .map_err(|wait| self.limited("writes_per_key", wait))
    }

    fn limited(&self, label: &str, wait: std::time::Duration) -> ApiError {
        self.metrics.rate_limited.with_label_values(&[label]).inc();
        ApiError::RateLimited(retry_after_secs(wait))
    }

    /// The caller's principal from the `Authorization` header (401 if none); a token not yet
    /// known here is first admitted under the per-address limit on unknown tokens.
    pub async fn principal<B>(&self, req: &Request<B>) -> Result<Principal, ApiError> {
        let ip = self.client_ip(req);
        self.auth
            .authenticate(req.headers().get(http::header::AUTHORIZATION), || {
                self.admit_ip(Limit::UnknownKeysPerIp, ip)
            })
            .await
    }
}
