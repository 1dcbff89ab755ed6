//! Redirect lookup: in-process cache → memcached → ScyllaDB.
//!
//! The layers are the redirect kit's ([`zlink_redirect::cache`], the same as lastresort's): the
//! in-process cache is bounded by bytes, expires found links after a short TTL and missing slugs
//! after an even shorter one, and coalesces concurrent misses for one slug into one load, so a
//! cold slug costs one memcached get and at most one store read per instance. memcached
//! failures are counted and skipped, never returned: the store answers instead. This module
//! adds what only primary has: the store read, and writing a change through to memcached.

use crate::metrics::Metrics;
use crate::store::Store;
use http::HeaderValue;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use zlink_clients::backoff::Backoff;
use zlink_clients::trace::Span;
use zlink_redirect::cache::{LayerCell, LocalCache, Memcached, Trusted};
use zlink_redirect::decide::{is_servable, Answer, Located, Url, View};
use zlink_redirect::layer;
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
        self.ver >= 1 && is_servable(&self.url, self.code)
    }
}

impl Trusted for CachedLink {
    fn is_valid(&self) -> bool {
        CachedLink::is_valid(self)
    }
}

impl Url for CachedLink {
    fn url(&self) -> &str {
        &self.url
    }
}

#[derive(Debug, Clone)]
pub enum Lookup {
    /// Its `Location` built once, when it is cached.
    Found(Arc<Located<CachedLink>>),
    Missing,
}

impl Answer for Lookup {
    /// A link that is not active is gone; expiry is the decider's (it holds the clock).
    fn view(&self) -> View<'_> {
        match self {
            Lookup::Found(l) if l.status == LinkStatus::Active => View::Redirect {
                url: &l.url,
                code: l.code,
                exp: l.exp,
            },
            Lookup::Found(_) => View::Gone,
            Lookup::Missing => View::Missing,
        }
    }

    fn location(&self) -> Option<&HeaderValue> {
        match self {
            Lookup::Found(l) => l.location(),
            Lookup::Missing => None,
        }
    }
}

pub struct CacheSettings {
    pub local_bytes: u64,
    pub found_ttl: Duration,
    pub missing_ttl: Duration,
}

pub struct RedirectCache {
    local: LocalCache<Lookup>,
    memcached: Option<Memcached>,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
}

impl RedirectCache {
    pub fn new(
        settings: CacheSettings,
        memcached: Option<Memcached>,
        store: Arc<Store>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let local = LocalCache::new(
            settings.local_bytes,
            settings.found_ttl,
            settings.missing_ttl,
            metrics.cache.clone(),
        );
        Self {
            local,
            memcached,
            store,
            metrics,
        }
    }

    /// The local cache's answer for `slug`, if it holds one (no loader, no dependency).
    pub async fn cached(&self, slug: &str) -> Option<Lookup> {
        self.local.cached(slug).await
    }

    /// Resolves a (syntactically valid) slug, and the layer that answered. Errors only when
    /// the store itself failed.
    pub async fn resolve(&self, slug: &str) -> Result<(Lookup, &'static str), StoreError> {
        let cell = LayerCell::default();
        self.local
            .get_or_load(slug, &cell, || self.load(slug, &cell))
            .await
            .map_err(|shared| (*shared).clone())
    }

    async fn load(&self, slug: &str, cell: &LayerCell) -> Result<Lookup, StoreError> {
        if let Some(mc) = &self.memcached {
            if let Some(link) = mc.get::<CachedLink>(slug).await {
                cell.set(layer::MEMCACHED);
                return Ok(Lookup::Found(Arc::new(Located::new(link))));
            }
        }
        self.metrics.store_reads.inc();
        cell.set(layer::STORE);
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
        self.metrics.cache.answered(layer::STORE);
        match link {
            Some(link) => {
                let cached = CachedLink::from(&link);
                if let Some(mc) = &self.memcached {
                    mc.fill(slug, &cached);
                }
                Ok(Lookup::Found(Arc::new(Located::new(cached))))
            }
            // Missing slugs are cached only in-process: a memcached entry would outlive a create.
            None => Ok(Lookup::Missing),
        }
    }

    /// After a create: this instance forgets the slug (it may hold "missing": memcached never
    /// does), and memcached is filled with the new link in the background (`add`, as a
    /// redirect's fill: never over a value a later change wrote). A new link's first redirects,
    /// on every primary, are then memcached hits instead of store reads at quorum, which on a
    /// loaded ring can miss the redirect's store budget right when a link is shared.
    pub async fn created(&self, slug: &str, link: &CachedLink) {
        self.local.invalidate(slug).await;
        if let Some(mc) = &self.memcached {
            mc.fill(slug, link);
        }
    }

    /// After a status change: this instance forgets the slug and memcached gets the new value
    /// (`set`, within --memcached-write-timeout-ms, longer than a redirect's get) before the
    /// PATCH answers. Fills use `add`, so a fill that read the old row before the change and
    /// lands after this write cannot put the old answer back (the race test in
    /// tests/tests/e2e/security/). If the `set` fails the key is deleted before answering, and
    /// if that fails too, in the background until memcached takes it (a delete is always safe
    /// to repeat; an old `set` would not be), so a stale value outlives an outage by at most
    /// one retry.
    pub async fn changed(&self, slug: &str, link: &CachedLink) {
        self.local.invalidate(slug).await;
        let Some(layer) = &self.memcached else { return };
        let (mc, metrics, key) = (layer.client(), layer.metrics(), layer.key(slug));
        let Err(e) = mc.set_json(&key, link, layer.ttl_s()).await else {
            return;
        };
        metrics.memcached_failed(&e);
        // Not written: take the old value out before answering, if memcached lets us.
        let Err(e) = mc.delete(&key).await else {
            return;
        };
        metrics.memcached_failed(&e);
        tracing::warn!(slug = ?slug, error = %e, "memcached not updated after a change; deleting in the background");
        let (mc, metrics) = (mc.clone(), metrics.clone());
        tokio::spawn(async move {
            let mut wait = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
            for _ in 0..60 {
                tokio::time::sleep(wait.next_delay()).await;
                match mc.delete(&key).await {
                    Ok(()) => return,
                    Err(e) => metrics.memcached_failed(&e),
                }
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
