//! zlink lastresort: serves redirects from S3 alone when everything else is gone.
//! It depends on nothing of primary's (no crate, no database, no calls): only S3 and the
//! host's own memcached are on the redirect path (SYSTEM.md invariant 8).
//!
//! - [`config`]: flags with env fallbacks, validated at start.
//! - [`lookup`]: in-process fresh/stale caches → memcached → S3, strict blob reading.
//! - [`journal`]: reads the change journal in S3 and forgets what it lists.
//! - [`http`]: `GET|HEAD /{slug}`, `/healthz`, `/readyz`, `/metrics`, `/stats`.
//! - [`metrics`]: Prometheus metrics and the local `/stats` aggregates.
//! - [`nginxlog`]: ingests the host nginx's rung-3 click log into the click spool.
//!
//! Clicks: every redirect appends its event to the local spool (`zlink_clients::clicks`), which
//! a replayer ships to Kafka `clicks` whenever Kafka is reachable.

pub mod config;
pub mod http;
pub mod journal;
pub mod lookup;
pub mod metrics;
pub mod nginxlog;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use zlink_clients::breaker::Breaker;
use zlink_clients::clicks::Clicks;
use zlink_clients::clock::SystemClock;
use zlink_clients::memcache::Memcache;
use zlink_clients::s3::S3Store;
use zlink_redirect::cache::Memcached;
use zlink_wire::events::Tier;

/// The composition root of `lastresort`: the state every request shares, built once.
pub struct App {
    pub state: Arc<http::State>,
}

impl App {
    /// From a validated config: opens the click spool (cutting off a torn tail) and starts its
    /// replayer, so call it inside the runtime.
    pub fn build(cfg: &config::Config, metrics: Arc<metrics::Metrics>) -> Result<App, String> {
        state(cfg, metrics).map(|state| App { state })
    }

    /// Serves on an already-bound listener until `shutdown` ([`run`]).
    pub async fn run(self, listener: TcpListener, shutdown: CancellationToken) {
        run(listener, self.state, shutdown).await
    }
}

fn state(cfg: &config::Config, metrics: Arc<metrics::Metrics>) -> Result<Arc<http::State>, String> {
    let clicks = Clicks::start(
        &cfg.clicks,
        cfg.kafka.trim(),
        Tier::Lastresort,
        &cfg.instance,
        metrics.clicks.clone(),
    )?;
    let s3 = Arc::new(S3Store::new(&cfg.s3)?);
    let memcached = (!cfg.memcached.trim().is_empty()).then(|| {
        let client = Memcache::new(
            cfg.memcached.trim(),
            8,
            Duration::from_millis(cfg.memcached_timeout_ms),
            Breaker::new(
                "memcached",
                cfg.memcached_breaker(),
                Some(metrics.breakers.clone()),
            ),
        );
        Memcached::new(
            Arc::new(client),
            format!("zlr:{}:{}", cfg.s3.s3_bucket, cfg.s3.s3_prefix),
            cfg.memcached_ttl_s,
            metrics.cache.clone(),
        )
    });
    let s3_breaker = Breaker::new("s3", cfg.s3_breaker(), Some(metrics.breakers.clone()));
    let lookup = lookup::Resolver::new(
        lookup::LookupSettings {
            fresh_ttl: Duration::from_millis(cfg.fresh_ttl_ms),
            journal_ttl: (cfg.journal_ttl_ms > 0)
                .then(|| Duration::from_millis(cfg.journal_ttl_ms)),
            journal_poll: Duration::from_millis(cfg.journal_poll_ms),
            missing_ttl: Duration::from_millis(cfg.missing_ttl_ms),
            stale_ttl: Duration::from_secs(cfg.stale_ttl_s),
            capacity: cfg.local_cache_bytes,
            s3_budget: Duration::from_millis(cfg.s3_budget_ms),
        },
        memcached,
        s3,
        s3_breaker,
        metrics.clone(),
    );
    let geo = zlink_clients::geo::Geo::open(
        cfg.clicks.geoip_db.clone(),
        zlink_clients::clicks::GEOIP_CHECK,
        Some(metrics.clicks.geoip_loads.clone()),
    );
    let nginx_log = cfg.nginx_click_log.as_ref().map(|log| {
        Arc::new(nginxlog::Tailer {
            log: log.clone(),
            position_file: cfg
                .clicks
                .spool_dir
                .clone()
                .unwrap_or_default()
                .join("nginx-click-log.position"),
            salt: cfg.clicks.ip_hash_salt.0.clone(),
            geo: geo.clone(),
            clicks: clicks.clone(),
            metrics: metrics.clone(),
        })
    });
    Ok(Arc::new(http::State {
        geo,
        trusted: cfg.clicks.trusted_proxies.clone(),
        nginx_log,
        lookup,
        clicks,
        metrics,
        clock: Arc::new(SystemClock),
        cache_control: ::http::HeaderValue::from_str(&cfg.redirect_cache_control)
            .map_err(|e| e.to_string())?,
        ready: false.into(),
        hosts: zlink_wire::domain::Hosts::new(cfg.short_domains.iter().map(String::as_str)),
        max_connections: cfg.runtime.max_connections,
        drain: std::time::Duration::from_millis(cfg.runtime.drain_ms),
    }))
}

/// Serves on `listener` until `shutdown`; probes S3 every 2 s for `/readyz`. On shutdown it
/// drains requests, then flushes the click spool and gives its replayer a moment with Kafka.
async fn run(listener: TcpListener, state: Arc<http::State>, shutdown: CancellationToken) {
    let probe = {
        let (state, shutdown) = (state.clone(), shutdown.clone());
        tokio::spawn(async move {
            loop {
                let ok = tokio::time::timeout(Duration::from_secs(1), state.lookup.s3().ping())
                    .await
                    .is_ok_and(|r| r.is_ok());
                state.ready.store(ok, Ordering::Relaxed);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        })
    };
    let tail = state
        .nginx_log
        .clone()
        .map(|t| tokio::spawn(t.run(shutdown.clone())));
    let journal = state.lookup.journal_poll().map(|poll| {
        tokio::spawn(journal::Reader::new(zlink_clients::now_ms()).run(
            state.clone(),
            poll,
            shutdown.clone(),
        ))
    });
    http::serve(listener, state.clone(), shutdown, Duration::from_secs(5)).await;
    let _ = probe.await;
    if let Some(t) = tail {
        let _ = t.await;
    }
    if let Some(j) = journal {
        let _ = j.await;
    }
    state.clicks.shutdown().await;
}
