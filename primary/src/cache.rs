//! Redirect lookup: in-process cache → memcached → ScyllaDB.
//!
//! The in-process cache (moka) is bounded by bytes and expires found links after a short TTL and
//! missing slugs after an even shorter one (negative caching). Concurrent misses for one slug
//! share one load (`or_try_insert_with` coalesces), so a cold slug costs one memcached lookup and
//! at most one store read per instance, however many requests arrive at once. memcached
//! failures are counted and skipped, never returned: the store answers instead.

use crate::memcache::Memcache;
use crate::metrics::Metrics;
use crate::store::Store;
use moka::future::Cache;
use moka::Expiry;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zlink_clients::trace::Span;
use zlink_store::{Link, StoreError};
use zlink_wire::LinkStatus;

/// What a redirect needs to know about a link; also the memcached value (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedLink {
    pub url: String,
    pub status: LinkStatus,
    pub code: u16,
    /// Unix milliseconds.
    pub exp: Option<i64>,
    pub ver: i64,
}

impl From<&Link> for CachedLink {
    fn from(l: &Link) -> Self {
        CachedLink {
            url: l.url.clone(),
            status: l.status,
            code: l.redirect_code,
            exp: l.expires_at_ms,
            ver: l.version,
        }
    }
}

impl CachedLink {
    /// A value read from memcached is untrusted input (anyone who can reach memcached can write
    /// it): it is used only if it is what this service would have written — a URL that is its
    /// own normalised form (so a valid `Location`), an allowed redirect code, a real version.
    pub fn is_valid(&self) -> bool {
        zlink_wire::link::is_redirect_code(self.code)
            && self.ver >= 1
            && zlink_wire::longurl::normalize(&self.url).is_ok_and(|n| n == self.url)
    }
}

#[derive(Debug, Clone)]
pub enum Lookup {
    Found(Arc<CachedLink>),
    Missing,
}

/// Which layer answered a lookup (the `cache_layer` of redirect spans and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Local = 0,
    Memcached = 1,
    Store = 2,
}

impl Layer {
    pub fn label(self) -> &'static str {
        match self {
            Layer::Local => zlink_clients::trace::LAYER_LOCAL,
            Layer::Memcached => zlink_clients::trace::LAYER_MEMCACHED,
            Layer::Store => "store",
        }
    }
}

struct TtlByKind {
    found: Duration,
    missing: Duration,
}

impl Expiry<String, Lookup> for TtlByKind {
    fn expire_after_create(&self, _: &String, value: &Lookup, _: Instant) -> Option<Duration> {
        Some(match value {
            Lookup::Found(_) => self.found,
            Lookup::Missing => self.missing,
        })
    }
}

pub struct CacheSettings {
    pub local_bytes: u64,
    pub found_ttl: Duration,
    pub missing_ttl: Duration,
    pub memcached_ttl_s: u32,
    /// Prefix of every memcached key, so deployments (and test keyspaces) sharing a memcached
    /// never see each other's entries.
    pub memcached_prefix: String,
}

pub struct RedirectCache {
    local: Cache<String, Lookup>,
    memcached: Option<Arc<Memcache>>,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    settings: CacheSettings,
}

impl RedirectCache {
    pub fn new(
        settings: CacheSettings,
        memcached: Option<Arc<Memcache>>,
        store: Arc<Store>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let local = Cache::builder()
            .max_capacity(settings.local_bytes)
            .weigher(|k: &String, v: &Lookup| {
                let v_len = match v {
                    Lookup::Found(l) => l.url.len(),
                    Lookup::Missing => 0,
                };
                u32::try_from(k.len() + v_len + 96).unwrap_or(u32::MAX)
            })
            .expire_after(TtlByKind {
                found: settings.found_ttl,
                missing: settings.missing_ttl,
            })
            .build();
        Self {
            local,
            memcached,
            store,
            metrics,
            settings,
        }
    }

    fn mc_key(&self, slug: &str) -> String {
        format!("{}{slug}", self.settings.memcached_prefix)
    }

    /// Resolves a (syntactically valid) slug. Errors only when the store itself failed.
    pub async fn resolve(&self, slug: &str) -> Result<(Lookup, Layer), StoreError> {
        // Set by the load below if this call ran it (concurrent callers share one load and
        // count as local hits).
        let layer = AtomicU8::new(Layer::Local as u8);
        let entry = self
            .local
            .entry_by_ref(slug)
            .or_try_insert_with(self.load(slug, &layer))
            .await;
        match entry {
            Ok(e) => {
                if !e.is_fresh() {
                    self.metrics.lookups.with_label_values(&["local"]).inc();
                }
                let layer = match layer.load(Ordering::Relaxed) {
                    1 => Layer::Memcached,
                    2 => Layer::Store,
                    _ => Layer::Local,
                };
                Ok((e.into_value(), layer))
            }
            Err(shared) => Err((*shared).clone()),
        }
    }

    async fn load(&self, slug: &str, layer: &AtomicU8) -> Result<Lookup, StoreError> {
        if let Some(mc) = &self.memcached {
            match mc.get_json::<CachedLink>(&self.mc_key(slug)).await {
                Ok(Some(link)) if link.is_valid() => {
                    self.metrics.lookups.with_label_values(&["memcached"]).inc();
                    layer.store(Layer::Memcached as u8, Ordering::Relaxed);
                    return Ok(Lookup::Found(Arc::new(link)));
                }
                // Not a value of ours: a miss; the store's answer below overwrites it.
                Ok(Some(_)) => {
                    self.metrics
                        .memcached_errors
                        .with_label_values(&["invalid_value"])
                        .inc();
                    tracing::warn!(slug = ?slug, "memcached value failed validation; read the store");
                }
                Ok(None) => {}
                Err(e) => self.metrics.memcached_failed(&e),
            }
        }
        self.metrics.store_reads.inc();
        layer.store(Layer::Store as u8, Ordering::Relaxed);
        let mut span = Span::in_current("scylla.select");
        span.set("table", "links");
        let link = self.store.links.get(slug).await.inspect_err(|e| {
            span.fail(e);
            self.metrics
                .store_errors
                .with_label_values(&["get_link"])
                .inc();
        })?;
        span.set("rows_returned", i64::from(link.is_some()));
        span.end();
        self.metrics.lookups.with_label_values(&["store"]).inc();
        match link {
            Some(link) => {
                let cached = Arc::new(CachedLink::from(&link));
                self.fill_memcached(slug, &cached);
                Ok(Lookup::Found(cached))
            }
            // Missing slugs are cached only in-process: a memcached entry would outlive a create.
            None => Ok(Lookup::Missing),
        }
    }

    /// Writes back to memcached in the background; the redirect never waits for it.
    fn fill_memcached(&self, slug: &str, link: &CachedLink) {
        let Some(mc) = &self.memcached else { return };
        let metrics = self.metrics.clone();
        mc.fill_json_in_background(
            self.mc_key(slug),
            link,
            self.settings.memcached_ttl_s,
            move |e| metrics.memcached_failed(e),
        );
    }

    /// Forgets a slug in this instance only (a create: memcached never holds "missing").
    pub async fn forget_local(&self, slug: &str) {
        self.local.invalidate(slug).await;
    }

    /// After a status change: this instance forgets the slug and memcached gets the new value
    /// (`set`, within --memcached-write-timeout-ms, longer than a redirect's get) before the
    /// PATCH answers. Fills use `add`, so a fill that read the old row before the change and
    /// lands after this write cannot put the old answer back (the race test in
    /// tests/tests/security.rs). If the `set` fails the key is deleted before answering, and
    /// if that fails too, in the background until memcached takes it (a delete is always safe
    /// to repeat; an old `set` would not be), so a stale value outlives an outage by at most
    /// one retry.
    pub async fn changed(&self, slug: &str, link: &CachedLink) {
        self.local.invalidate(slug).await;
        let Some(mc) = &self.memcached else { return };
        let key = self.mc_key(slug);
        let Err(e) = mc.set_json(&key, link, self.settings.memcached_ttl_s).await else {
            return;
        };
        self.metrics.memcached_failed(&e);
        // Not written: take the old value out before answering, if memcached lets us.
        let Err(e) = mc.delete(&key).await else {
            return;
        };
        self.metrics.memcached_failed(&e);
        tracing::warn!(slug = ?slug, error = %e, "memcached not updated after a change; deleting in the background");
        let (mc, metrics) = (mc.clone(), self.metrics.clone());
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(100);
            for _ in 0..60 {
                tokio::time::sleep(wait).await;
                match mc.delete(&key).await {
                    Ok(()) => return,
                    Err(e) => metrics.memcached_failed(&e),
                }
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            tracing::error!(key = ?key, "gave up deleting a changed link from memcached; it expires with its TTL");
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_values_we_would_write_are_trusted_from_memcached() {
        let good = CachedLink {
            url: "https://example.com/a?b=1".into(),
            status: LinkStatus::Active,
            code: 302,
            exp: None,
            ver: 1,
        };
        assert!(good.is_valid());
        let bad = |f: fn(&mut CachedLink)| {
            let mut l = good.clone();
            f(&mut l);
            l.is_valid()
        };
        assert!(!bad(
            |l| l.url = "https://example.com/\r\nSet-Cookie: x".into()
        ));
        assert!(!bad(|l| l.url = "javascript:alert(1)".into()));
        assert!(
            !bad(|l| l.url = "https://EXAMPLE.com".into()),
            "not normalised"
        );
        assert!(!bad(|l| l.url = String::new()));
        assert!(!bad(|l| l.code = 200));
        assert!(!bad(|l| l.ver = 0));
    }
}
