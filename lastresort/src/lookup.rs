//! Slug → redirect, trusting nothing but S3: in-process cache → local memcached → S3 GetObject.
//!
//! Two in-process caches: `fresh` (short TTL, one coalesced load per slug however many requests
//! race for it) and `stale` (long TTL, written on every successful load). When S3 is slow or
//! down the lookup fails within its budget, and the last known answer from `stale` is served
//! instead; with no stale entry the caller answers 503 fast, so nginx drops to the next rung.
//! S3 sits behind a circuit breaker: once it has failed or hung a few times in a row it is not
//! asked at all (stale answers or a 503 in microseconds) until one probe per window.
//! An object that is not exactly what the replicator writes is treated as missing and counted:
//! it is never redirected to.

use crate::metrics::Metrics;
use moka::future::Cache;
use moka::Expiry;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zlink_clients::breaker::{Breaker, CallError};
use zlink_clients::memcache::Memcache;
use zlink_clients::s3::S3Store;
use zlink_clients::trace::Span;
use zlink_wire::blob;

/// What a redirect needs; also the memcached value (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub url: String,
    pub code: u16,
    /// Unix milliseconds.
    pub exp: Option<i64>,
}

impl Target {
    /// A value read from memcached is untrusted input: used only if it is what this service
    /// would have written (a URL that is its own normal form, an allowed redirect code).
    pub fn is_valid(&self) -> bool {
        zlink_wire::link::is_redirect_code(self.code)
            && zlink_wire::longurl::normalize(&self.url).is_ok_and(|n| n == self.url)
    }
}

#[derive(Debug, Clone)]
pub enum Answer {
    Found(Arc<Target>),
    /// No blob, but a tombstone: the link exists and is disabled or expired (410).
    Gone,
    Missing,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("S3 unavailable: {0}")]
pub struct Unavailable(pub String);

/// Reads the target out of an object: metadata when it carries the URL, else the HTML body.
/// Both are checked strictly; anything malformed is `None`.
pub fn target_of(
    metadata: &std::collections::HashMap<String, String>,
    body: &[u8],
) -> Option<Target> {
    let from_body = || {
        blob::parse(body).ok().map(|b| Target {
            url: b.url,
            code: b.code,
            exp: b.expires_at_ms,
        })
    };
    match blob::parse_metadata(|k| metadata.get(k).map(String::as_str)) {
        Ok(m) => match m.url {
            Some(url) => Some(Target {
                url,
                code: m.code,
                exp: m.expires_at_ms,
            }),
            None => from_body(),
        },
        Err(_) => from_body(),
    }
}

/// What S3 holds for a slug.
enum Stored {
    Blob(zlink_clients::s3::StoredObject),
    Tombstone,
    Nothing,
}

struct TtlByKind {
    found: Duration,
    missing: Duration,
}

impl Expiry<String, Answer> for TtlByKind {
    fn expire_after_create(&self, _: &String, v: &Answer, _: Instant) -> Option<Duration> {
        Some(match v {
            Answer::Found(_) | Answer::Gone => self.found,
            Answer::Missing => self.missing,
        })
    }
}

pub struct LookupSettings {
    pub fresh_ttl: Duration,
    pub missing_ttl: Duration,
    pub stale_ttl: Duration,
    pub capacity: u64,
    pub s3_budget: Duration,
    pub memcached_ttl_s: u32,
    pub memcached_prefix: String,
}

pub struct Lookup {
    s3_breaker: Breaker,
    fresh: Cache<String, Answer>,
    stale: Cache<String, Answer>,
    memcached: Option<Arc<Memcache>>,
    s3: Arc<S3Store>,
    metrics: Arc<Metrics>,
    settings: LookupSettings,
}

fn weigh(k: &str, v: &Answer) -> u32 {
    let n = match v {
        Answer::Found(t) => t.url.len(),
        Answer::Gone | Answer::Missing => 0,
    };
    u32::try_from(k.len() + n + 96).unwrap_or(u32::MAX)
}

impl Lookup {
    pub fn new(
        settings: LookupSettings,
        memcached: Option<Arc<Memcache>>,
        s3: Arc<S3Store>,
        s3_breaker: Breaker,
        metrics: Arc<Metrics>,
    ) -> Self {
        let fresh = Cache::builder()
            .max_capacity(settings.capacity)
            .weigher(|k: &String, v: &Answer| weigh(k, v))
            .expire_after(TtlByKind {
                found: settings.fresh_ttl,
                missing: settings.missing_ttl,
            })
            .build();
        let stale = Cache::builder()
            .max_capacity(settings.capacity)
            .weigher(|k: &String, v: &Answer| weigh(k, v))
            .time_to_live(settings.stale_ttl)
            .build();
        Lookup {
            s3_breaker,
            fresh,
            stale,
            memcached,
            s3,
            metrics,
            settings,
        }
    }

    /// The S3 client lookups use (also what `/readyz` probes).
    pub fn s3(&self) -> &Arc<S3Store> {
        &self.s3
    }

    /// The answer and the layer that gave it (`local`, `memcached`, `s3`, `stale`).
    pub async fn resolve(&self, slug: &str) -> Result<(Answer, &'static str), Unavailable> {
        // Set by the load below if this call ran it; callers sharing its load count as local.
        let layer = AtomicU8::new(0);
        let entry = self
            .fresh
            .entry_by_ref(slug)
            .or_try_insert_with(self.load(slug, &layer))
            .await;
        match entry {
            Ok(e) => {
                if !e.is_fresh() {
                    self.metrics.lookups.with_label_values(&["local"]).inc();
                }
                let label = match layer.load(Ordering::Relaxed) {
                    1 => zlink_clients::trace::LAYER_MEMCACHED,
                    2 => "s3",
                    _ => zlink_clients::trace::LAYER_LOCAL,
                };
                Ok((e.into_value(), label))
            }
            Err(err) => match self.stale.get(slug).await {
                Some(old) => {
                    self.metrics.lookups.with_label_values(&["stale"]).inc();
                    Ok((old, zlink_clients::trace::LAYER_STALE))
                }
                None => Err((*err).clone()),
            },
        }
    }

    fn mc_key(&self, slug: &str) -> String {
        format!("{}{slug}", self.settings.memcached_prefix)
    }

    async fn load(&self, slug: &str, layer: &AtomicU8) -> Result<Answer, Unavailable> {
        if let Some(mc) = &self.memcached {
            match mc.get_json::<Target>(&self.mc_key(slug)).await {
                Ok(Some(t)) if t.is_valid() => {
                    self.metrics.lookups.with_label_values(&["memcached"]).inc();
                    layer.store(1, Ordering::Relaxed);
                    let answer = Answer::Found(Arc::new(t));
                    self.stale.insert(slug.to_string(), answer.clone()).await;
                    return Ok(answer);
                }
                // Not a value of ours: a miss; S3's answer is what gets served.
                Ok(Some(_)) => {
                    self.metrics
                        .memcached_errors
                        .with_label_values(&["invalid_value"])
                        .inc();
                    tracing::warn!(slug = %slug, "memcached value failed validation; read S3");
                }
                Ok(None) => {}
                Err(e) => self.metrics.memcached_failed(&e),
            }
        }
        let started = Instant::now();
        layer.store(2, Ordering::Relaxed);
        let mut span = Span::in_current("s3.get");
        // A missing blob costs a second read: the tombstone tells disabled/expired (410) from
        // unknown (404). Both reads share one budget.
        let read = async {
            Ok::<_, zlink_clients::s3::S3Error>(match self.s3.get(slug).await? {
                Some(o) => Stored::Blob(o),
                None if self.s3.get_tombstone(slug).await?.is_some() => Stored::Tombstone,
                None => Stored::Nothing,
            })
        };
        let got = self
            .s3_breaker
            .call(self.settings.s3_budget, |_| true, read)
            .await;
        let object = match got {
            Ok(o) => {
                self.metrics
                    .s3_seconds
                    .observe(started.elapsed().as_secs_f64());
                o
            }
            // Open circuit: no request was made, nothing to time or count as an S3 error.
            Err(e @ CallError::Open(_)) => {
                span.set("circuit_open", true);
                return Err(Unavailable(e.to_string()));
            }
            Err(e) => {
                span.fail(&e);
                self.metrics
                    .s3_seconds
                    .observe(started.elapsed().as_secs_f64());
                self.metrics.s3_errors.inc();
                return Err(Unavailable(e.to_string()));
            }
        };
        span.set(
            "found",
            match &object {
                Stored::Blob(_) => "blob",
                Stored::Tombstone => "tombstone",
                Stored::Nothing => "nothing",
            },
        );
        span.end();
        self.metrics.lookups.with_label_values(&["s3"]).inc();
        let answer = match object {
            Stored::Nothing => Answer::Missing,
            Stored::Tombstone => Answer::Gone,
            Stored::Blob(o) => match target_of(&o.metadata, &o.body) {
                Some(t) => {
                    self.fill_memcached(slug, &t);
                    Answer::Found(Arc::new(t))
                }
                None => {
                    self.metrics.malformed.inc();
                    tracing::warn!(slug = %slug, "malformed blob in S3; treated as missing");
                    Answer::Missing
                }
            },
        };
        self.stale.insert(slug.to_string(), answer.clone()).await;
        Ok(answer)
    }

    fn fill_memcached(&self, slug: &str, t: &Target) {
        let Some(mc) = &self.memcached else { return };
        let metrics = self.metrics.clone();
        mc.fill_json_in_background(
            self.mc_key(slug),
            t,
            self.settings.memcached_ttl_s,
            move |e| metrics.memcached_failed(e),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use zlink_wire::blob::Blob;

    fn meta(b: &Blob) -> HashMap<String, String> {
        blob::metadata(b)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    #[test]
    fn target_comes_from_metadata_or_the_body_and_never_from_garbage() {
        let b = Blob {
            url: "https://e.com/x".into(),
            code: 301,
            version: 2,
            expires_at_ms: Some(9),
        };
        let body = blob::render(&b);
        let want = Target {
            url: b.url.clone(),
            code: 301,
            exp: Some(9),
        };
        assert_eq!(target_of(&meta(&b), body.as_bytes()), Some(want.clone()));
        assert_eq!(target_of(&HashMap::new(), body.as_bytes()), Some(want));
        assert_eq!(target_of(&HashMap::new(), b"<html>evil</html>"), None);
        let mut forged = meta(&b);
        forged.insert(blob::meta::URL.into(), "javascript:alert(1)".into());
        assert_eq!(target_of(&forged, b"garbage"), None);
    }
}
