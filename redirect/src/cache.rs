//! The cache layers both tiers put in front of their source of truth (primary: ScyllaDB;
//! lastresort: S3): the process's own cache ([`LocalCache`]) and the shared memcached
//! ([`Memcached`]), and the metrics they count.
//!
//! [`LocalCache`] is bounded by bytes, expires answers by kind (found/gone after a short TTL,
//! missing after a shorter one: negative caching) and coalesces loads: concurrent misses for
//! one slug share one load, so a cold slug costs one memcached get and at most one read of the
//! source per instance however many requests race for it.

use crate::decide::Answer;
use crate::front::{Front, Stamped};
use crate::hot::HotCounters;
use crate::layer;
use moka::future::Cache;
use moka::Expiry;
use prometheus::IntCounterVec;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use zlink_clients::memcache::{McError, Memcache};

/// The counters the cache layers share with their tier (registered under the tier's names).
#[derive(Clone)]
pub struct CacheMetrics {
    /// Lookups by the layer that answered (`layer`).
    pub lookups: IntCounterVec,
    /// memcached failures by kind (`kind`: timeout, io, backoff, protocol, decode,
    /// invalid_value).
    pub memcached_errors: IntCounterVec,
    /// `lookups` with every layer's series resolved (one atomic add per lookup).
    hot: HotCounters,
}

impl CacheMetrics {
    /// Around the tier's (registered) vectors.
    pub fn new(lookups: IntCounterVec, memcached_errors: IntCounterVec) -> Self {
        let hot = HotCounters::new(
            lookups.clone(),
            &[
                &[layer::LOCAL],
                &[layer::MEMCACHED],
                &[layer::STORE],
                &[layer::S3],
                &[layer::STALE],
                &[layer::NEVER_ISSUED],
            ],
        );
        CacheMetrics {
            lookups,
            memcached_errors,
            hot,
        }
    }

    pub fn answered(&self, layer: &'static str) {
        self.hot.inc(&[layer]);
    }

    pub fn memcached_failed(&self, e: &McError) {
        self.memcached_errors.with_label_values(&[e.kind()]).inc();
    }
}

/// Set by a load to the layer that answered it; requests that shared someone else's load (or
/// found the entry cached) were answered locally.
#[derive(Default)]
pub struct LayerCell(OnceLock<&'static str>);

impl LayerCell {
    pub fn set(&self, layer: &'static str) {
        let _ = self.0.set(layer);
    }

    /// The layer the load recorded, else local (the answer was cached or another request's
    /// load answered it).
    pub fn get(&self) -> &'static str {
        self.0.get().copied().unwrap_or(layer::LOCAL)
    }
}

struct TtlByKind {
    found: Duration,
    short: Duration,
    missing: Duration,
}

impl<V: Answer> Expiry<String, V> for TtlByKind {
    fn expire_after_create(&self, _: &String, v: &V, _: Instant) -> Option<Duration> {
        Some(self.of(v))
    }
}

/// A byte-bounded cache of answers; `ttl` of found/gone answers, `missing_ttl` of misses.
/// `missing_ttl: None` keeps every answer for `ttl` (lastresort's stale cache).
pub fn answers<V: Answer>(
    bytes: u64,
    ttl: Duration,
    missing_ttl: Option<Duration>,
) -> Cache<String, V> {
    match missing_ttl {
        Some(missing) => by_kind(
            bytes,
            TtlByKind {
                found: ttl,
                short: ttl,
                missing,
            },
        ),
        None => weighed(bytes).time_to_live(ttl).build(),
    }
}

fn weighed<V: Answer>(bytes: u64) -> moka::future::CacheBuilder<String, V, Cache<String, V>> {
    Cache::builder()
        .max_capacity(bytes)
        .weigher(|k: &String, v: &V| v.weight(k))
}

fn by_kind<V: Answer>(bytes: u64, ttls: TtlByKind) -> Cache<String, V> {
    weighed(bytes).expire_after(ttls).build()
}

pub struct LocalCache<V: Answer> {
    cache: Cache<String, Stamped<V>>,
    ttls: TtlByKind,
    front: Front,
    metrics: CacheMetrics,
}

/// moka's expiry of a [`Stamped`] value: the instant it carries (see [`crate::front`]).
struct AtStamp;

impl<V> Expiry<String, Stamped<V>> for AtStamp {
    fn expire_after_create(
        &self,
        _: &String,
        v: &Stamped<V>,
        created_at: Instant,
    ) -> Option<Duration> {
        Some(v.until.saturating_duration_since(created_at))
    }
}

impl TtlByKind {
    fn of<V: Answer>(&self, v: &V) -> Duration {
        if v.is_missing() {
            self.missing
        } else if v.is_short_lived() {
            self.short
        } else {
            self.found
        }
    }
}

impl<V: Answer> LocalCache<V> {
    pub fn new(
        bytes: u64,
        found_ttl: Duration,
        missing_ttl: Duration,
        metrics: CacheMetrics,
    ) -> Self {
        Self::with_short_ttl(bytes, found_ttl, found_ttl, missing_ttl, metrics)
    }

    /// Like [`Self::new`], with `short_ttl` for answers that are
    /// [`Answer::is_short_lived`] (found and gone answers otherwise live `found_ttl`).
    pub fn with_short_ttl(
        bytes: u64,
        found_ttl: Duration,
        short_ttl: Duration,
        missing_ttl: Duration,
        metrics: CacheMetrics,
    ) -> Self {
        LocalCache {
            cache: Cache::builder()
                .max_capacity(bytes)
                .weigher(|k: &String, v: &Stamped<V>| v.value.weight(k))
                .expire_after(AtStamp)
                .build(),
            ttls: TtlByKind {
                found: found_ttl,
                short: short_ttl,
                missing: missing_ttl,
            },
            front: Front::new(),
            metrics,
        }
    }

    /// The key's answer if this cache holds it (counted as answered by the local layer); no
    /// loader is built, nothing is loaded. This thread's front ([`crate::front`]) answers
    /// first; moka's answer is kept there. Moka's read runs boxed: its future is most of a
    /// kilobyte, which every redirect's future would otherwise hold and move (memcpy) though
    /// a hot key is answered by the front.
    pub async fn cached(&self, slug: &str) -> Option<V> {
        let now = Instant::now();
        let seen = self.front.seen(slug);
        if let Some(v) = self.front.get::<V>(slug, seen, now) {
            self.metrics.answered(layer::LOCAL);
            return Some(v);
        }
        let s = Box::pin(self.cache.get(slug)).await?;
        self.front.fill(slug, seen, &s, now);
        self.metrics.answered(layer::LOCAL);
        Some(s.value)
    }

    /// The cached answer, else the answer of `load()` (shared with every concurrent caller
    /// for the same slug), and the layer that answered: `load` records its layer in `cell`
    /// (which the caller made for this call). A failed load is returned to everyone who
    /// waited for it and is not cached.
    ///
    /// A hit is a plain read ([`LocalCache::cached`]); the miss path (entry coalescing and the
    /// tier's loader, whose future holds client calls and is kilobytes) runs boxed, so a hit
    /// neither builds nor moves it.
    pub async fn get_or_load<E, F>(
        &self,
        slug: &str,
        cell: &LayerCell,
        load: impl FnOnce() -> F,
    ) -> Result<(V, &'static str), Arc<E>>
    where
        E: Send + Sync + 'static,
        F: std::future::Future<Output = Result<V, E>>,
    {
        if let Some(v) = self.cached(slug).await {
            return Ok((v, layer::LOCAL));
        }
        let fut = load();
        let ttls = &self.ttls;
        let stamped = async move {
            let value = fut.await?;
            // Stamped when the load ends, just before moka inserts it: moka's expiry (from
            // its insertion) is then this instant.
            let until = Instant::now() + ttls.of(&value);
            Ok(Stamped { value, until })
        };
        let entry = Box::pin(self.cache.entry_by_ref(slug).or_try_insert_with(stamped)).await?;
        if !entry.is_fresh() {
            // Someone else loaded it between our read and our entry.
            self.metrics.answered(layer::LOCAL);
        }
        Ok((entry.into_value().value, cell.get()))
    }

    /// Forgets a slug in this instance (every thread's front included).
    pub async fn invalidate(&self, slug: &str) {
        self.cache.invalidate(slug).await;
        self.front.forgot(slug);
    }

    /// Forgets everything in this instance.
    pub fn invalidate_all(&self) {
        self.cache.invalidate_all();
        self.front.forgot_all();
    }
}

/// A value a tier caches in memcached: untrusted when read back.
pub trait Trusted: Serialize + DeserializeOwned {
    /// Only what this tier would have written is used (see [`crate::decide::is_servable`]).
    fn is_valid(&self) -> bool;
}

impl Trusted for crate::Target {
    fn is_valid(&self) -> bool {
        crate::Target::is_valid(self)
    }
}

/// The shared memcached in front of a tier's source of truth. Failures are counted and
/// skipped, never returned: the next layer answers instead.
pub struct Memcached {
    mc: Arc<Memcache>,
    /// Prefix of every key, so deployments (and test keyspaces) sharing a memcached never see
    /// each other's entries.
    prefix: String,
    ttl_s: u32,
    metrics: CacheMetrics,
}

impl Memcached {
    pub fn new(mc: Arc<Memcache>, prefix: String, ttl_s: u32, metrics: CacheMetrics) -> Self {
        Memcached {
            mc,
            prefix,
            ttl_s,
            metrics,
        }
    }

    pub fn client(&self) -> &Arc<Memcache> {
        &self.mc
    }

    /// The memcached key of a link key. memcached allows 250 bytes; a longer one (a link on a
    /// long branded domain) is its SHA-256 instead, still under the prefix (`#` is in no link key).
    pub fn key(&self, key: &str) -> String {
        let k = format!("{}{key}", self.prefix);
        if k.len() <= zlink_clients::memcache::MAX_KEY_BYTES {
            return k;
        }
        format!(
            "{}#{}",
            self.prefix,
            hex::encode(Sha256::digest(key.as_bytes()))
        )
    }

    pub fn ttl_s(&self) -> u32 {
        self.ttl_s
    }

    pub fn metrics(&self) -> &CacheMetrics {
        &self.metrics
    }

    /// A valid value (counted as answered by memcached), else `None`: a miss, a failure
    /// (counted by kind) or a value that failed validation (counted, logged; the next layer's
    /// answer overwrites it).
    pub async fn get<V: Trusted>(&self, slug: &str) -> Option<V> {
        match self.mc.get_json::<V>(&self.key(slug)).await {
            Ok(Some(v)) if v.is_valid() => {
                self.metrics.answered(layer::MEMCACHED);
                Some(v)
            }
            Ok(Some(_)) => {
                self.metrics
                    .memcached_errors
                    .with_label_values(&["invalid_value"])
                    .inc();
                tracing::warn!(slug = ?slug, "memcached value failed validation; read the next layer");
                None
            }
            Ok(None) => None,
            Err(e) => {
                self.metrics.memcached_failed(&e);
                None
            }
        }
    }

    /// Deletes a slug's entry (failures are counted; the entry then lives out its TTL).
    pub async fn forget(&self, slug: &str) {
        if let Err(e) = self.mc.delete(&self.key(slug)).await {
            self.metrics.memcached_failed(&e);
        }
    }

    /// Fills memcached in the background (`add`: never over a newer value a change wrote);
    /// the redirect never waits for it.
    pub fn fill<V: Serialize>(&self, slug: &str, v: &V) {
        let metrics = self.metrics.clone();
        self.mc
            .fill_json_in_background(self.key(slug), v, self.ttl_s, move |e| {
                metrics.memcached_failed(e)
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::Outcome;
    use prometheus::Opts;

    fn local(found: Duration, missing: Duration) -> LocalCache<Outcome> {
        let lookups = IntCounterVec::new(Opts::new("l", "l"), &["layer"]).unwrap();
        let errors = IntCounterVec::new(Opts::new("e", "e"), &["kind"]).unwrap();
        LocalCache::new(1 << 20, found, missing, CacheMetrics::new(lookups, errors))
    }

    fn found(url: &str) -> Outcome {
        Outcome::found(crate::Target {
            url: url.into(),
            code: 302,
            exp: None,
        })
    }

    fn url_of(o: Option<Outcome>) -> Option<String> {
        match o? {
            Outcome::Found(t) => Some(t.url.clone()),
            Outcome::Gone => Some("gone".into()),
            Outcome::Missing => Some("missing".into()),
        }
    }

    async fn load(c: &LocalCache<Outcome>, key: &str, v: Outcome) -> &'static str {
        let cell = LayerCell::default();
        let (_, layer) = c
            .get_or_load(key, &cell, || async {
                cell.set(layer::STORE);
                Ok::<_, ()>(v)
            })
            .await
            .unwrap();
        layer
    }

    /// A read of the local cache is a small future (moka's read, most of a kilobyte, runs
    /// boxed): every redirect's future holds it and hyper moves that with each request.
    #[tokio::test]
    async fn a_read_is_a_small_future() {
        let c = local(Duration::from_secs(60), Duration::from_secs(1));
        load(&c, "a", found("https://a.example/")).await;
        let read = c.cached("a");
        assert!(
            std::mem::size_of_val(&read) <= 256,
            "{}",
            std::mem::size_of_val(&read)
        );
        assert_eq!(url_of(read.await).as_deref(), Some("https://a.example/"));
    }

    /// The front (read twice: moka's answer is kept there) answers exactly what the cache
    /// holds: a forgotten key is gone at once on this thread and on another, and nothing
    /// outlives its TTL (found or missing).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hits_end_with_an_invalidation_or_the_ttl() {
        let c = Arc::new(local(
            Duration::from_millis(300),
            Duration::from_millis(100),
        ));
        assert_eq!(
            load(&c, "a", found("https://a.example/")).await,
            layer::STORE
        );
        for _ in 0..3 {
            assert_eq!(
                url_of(c.cached("a").await).as_deref(),
                Some("https://a.example/")
            );
        }
        let c2 = c.clone();
        let elsewhere = tokio::spawn(async move { url_of(c2.cached("a").await) });
        assert_eq!(
            elsewhere.await.unwrap().as_deref(),
            Some("https://a.example/")
        );

        c.invalidate("a").await;
        assert_eq!(
            url_of(c.cached("a").await),
            None,
            "forgotten on this thread"
        );
        let c2 = c.clone();
        assert_eq!(
            tokio::spawn(async move { url_of(c2.cached("a").await) })
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            load(&c, "a", found("https://b.example/")).await,
            layer::STORE
        );
        assert_eq!(
            url_of(c.cached("a").await).as_deref(),
            Some("https://b.example/")
        );
        assert_eq!(
            url_of(c.cached("a").await).as_deref(),
            Some("https://b.example/")
        );

        assert_eq!(load(&c, "m", Outcome::Missing).await, layer::STORE);
        assert_eq!(url_of(c.cached("m").await).as_deref(), Some("missing"));
        assert_eq!(url_of(c.cached("m").await).as_deref(), Some("missing"));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            url_of(c.cached("m").await),
            None,
            "missing lives its shorter TTL"
        );
        assert_eq!(
            url_of(c.cached("a").await).as_deref(),
            Some("https://b.example/")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            url_of(c.cached("a").await),
            None,
            "found lives its TTL, not longer"
        );

        assert_eq!(
            load(&c, "x", found("https://x.example/")).await,
            layer::STORE
        );
        assert_eq!(
            url_of(c.cached("x").await).as_deref(),
            Some("https://x.example/")
        );
        c.invalidate_all();
        assert_eq!(url_of(c.cached("x").await), None);
    }
}
