//! Everything a request handler needs, built once at start.

use crate::auth::Authenticator;
use crate::cache::{CacheSettings, RedirectCache};
use crate::clickstats::ClickStore;
use crate::clock::Clock;
use crate::config::ServeConfig;
use crate::events::EventSink;
use crate::ids::IdAllocator;
use crate::memcache::Memcache;
use crate::metrics::Metrics;
use crate::store::Store;
use http::HeaderValue;
use std::sync::Arc;
use std::time::Duration;
use zlink_clients::breaker::Breaker;
use zlink_wire::slug::SlugCodec;

/// Request-time settings derived from the validated config.
pub struct Settings {
    pub public_base_url: String,
    pub redirect_code: u16,
    pub cache_control: HeaderValue,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    pub redirect_timeout: Duration,
    pub ip_hash_salt: String,
    /// Whose X-Request-Id / X-Request-Start / X-Forwarded-For make a click's id, time, client.
    pub trusted_proxies: zlink_clients::clicks::TrustedProxies,
}

pub struct AppState {
    pub settings: Settings,
    pub store: Arc<Store>,
    pub cache: RedirectCache,
    pub ids: IdAllocator,
    pub codec: SlugCodec,
    pub auth: Authenticator,
    pub events: Arc<dyn EventSink>,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    /// Click aggregates, prepared on first use (only the stats routes need them).
    pub clicks: tokio::sync::OnceCell<Arc<ClickStore>>,
    /// (total, humans) per slug for the public info page, kept a few seconds.
    pub info_totals: moka::future::Cache<String, (i64, i64)>,
    /// Which destinations links may have.
    pub destinations: crate::policy::Destinations,
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
            Arc::new(Memcache::new(
                addr,
                cfg.memcached_pool,
                Duration::from_millis(cfg.memcached_timeout_ms),
                Breaker::new(
                    "memcached",
                    cfg.memcached_breaker(),
                    Some(metrics.breakers.clone()),
                ),
            ))
        });
        let cache = RedirectCache::new(
            CacheSettings {
                local_bytes: cfg.local_cache_bytes,
                found_ttl: Duration::from_millis(cfg.local_cache_ttl_ms),
                missing_ttl: Duration::from_millis(cfg.negative_cache_ttl_ms),
                memcached_ttl_s: cfg.memcached_ttl_s,
                memcached_prefix: format!("zl:{}:", cfg.store.keyspace),
            },
            memcached,
            store.clone(),
            metrics.clone(),
        );
        let settings = Settings {
            public_base_url: cfg.public_base_url.clone(),
            redirect_code: cfg.redirect_code,
            cache_control: HeaderValue::from_str(&cfg.redirect_cache_control)
                .map_err(|e| e.to_string())?,
            max_body_bytes: cfg.max_body_bytes,
            request_timeout: Duration::from_millis(cfg.request_timeout_ms),
            redirect_timeout: Duration::from_millis(cfg.redirect_timeout_ms),
            ip_hash_salt: cfg.clicks.ip_hash_salt.0.clone(),
            trusted_proxies: cfg.clicks.trusted_proxies.clone(),
        };
        let own = url::Url::parse(&cfg.public_base_url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .into_iter()
            .chain(cfg.short_domains.iter().cloned())
            .collect();
        let destinations = crate::policy::Destinations::new(
            own,
            cfg.deny_hosts_file.clone(),
            cfg.allow_hosts_file.clone(),
        )?;
        Ok(Arc::new(AppState {
            destinations,
            settings,
            ids: IdAllocator::new(store.clone(), cfg.id_block_size),
            codec: SlugCodec::new(cfg.slug_key.0.as_bytes()),
            auth: Authenticator::new(store.clone()),
            cache,
            store,
            events,
            metrics,
            clock,
            clicks: tokio::sync::OnceCell::new(),
            info_totals: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(5))
                .build(),
        }))
    }
}
