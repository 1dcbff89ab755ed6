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
//!
//! How long `fresh` keeps an answer depends on the change journal ([`crate::journal`]): while
//! its reader keeps up, an answer read from S3 lives `--journal-ttl-ms` (60 s), because any
//! change to it is listed in the journal within about a second and forgotten then; otherwise
//! (journal off or not read for 3 polls, or an answer that came from memcached, which the
//! journal does not cover) it lives `--fresh-ttl-ms` (2 s). Losing the journal forgets every
//! long-lived answer at once.

use crate::metrics::Metrics;
use http::HeaderValue;
use moka::future::Cache;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zlink_clients::breaker::{Breaker, CallError};
use zlink_clients::s3::S3Store;
use zlink_clients::trace::Span;
use zlink_redirect::cache::{self, LayerCell, LocalCache, Memcached};
use zlink_redirect::decide::{Answer, Outcome, View};
use zlink_redirect::{layer, Target};
use zlink_wire::blob;

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

/// What the fresh cache holds: the answer, and whether it lives only the short TTL.
#[derive(Clone)]
struct Fresh {
    outcome: Outcome,
    short: bool,
}

impl Answer for Fresh {
    fn view(&self) -> View<'_> {
        self.outcome.view()
    }

    fn location(&self) -> Option<&HeaderValue> {
        self.outcome.location()
    }

    fn is_short_lived(&self) -> bool {
        self.short
    }
}

pub struct LookupSettings {
    /// How long an answer the journal does not cover is served from memory.
    pub fresh_ttl: Duration,
    /// How long an answer the journal covers is served from memory; `None`: no journal.
    pub journal_ttl: Option<Duration>,
    /// How often the journal is read.
    pub journal_poll: Duration,
    pub missing_ttl: Duration,
    pub stale_ttl: Duration,
    pub capacity: u64,
    pub s3_budget: Duration,
}

pub struct Resolver {
    s3_breaker: Breaker,
    fresh: LocalCache<Fresh>,
    /// The journal reader keeps up: answers read from S3 now may live the journal TTL.
    journal_trusted: AtomicBool,
    /// Bumped each time the journal stops being trusted (a load that straddles it is short).
    journal_epoch: AtomicU64,
    stale: Cache<String, Outcome>,
    memcached: Option<Memcached>,
    s3: Arc<S3Store>,
    metrics: Arc<Metrics>,
    settings: LookupSettings,
}

impl Resolver {
    pub fn new(
        settings: LookupSettings,
        memcached: Option<Memcached>,
        s3: Arc<S3Store>,
        s3_breaker: Breaker,
        metrics: Arc<Metrics>,
    ) -> Self {
        Resolver {
            s3_breaker,
            fresh: LocalCache::with_short_ttl(
                settings.capacity,
                settings.journal_ttl.unwrap_or(settings.fresh_ttl),
                settings.fresh_ttl,
                settings.missing_ttl,
                metrics.cache.clone(),
            ),
            journal_trusted: AtomicBool::new(false),
            journal_epoch: AtomicU64::new(0),
            stale: cache::answers(settings.capacity, settings.stale_ttl, None),
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

    /// The budget of one S3 lookup.
    pub fn s3_budget(&self) -> Duration {
        self.settings.s3_budget
    }

    /// How often the change journal is read; `None` if it is not (`--journal-ttl-ms 0`).
    pub fn journal_poll(&self) -> Option<Duration> {
        self.settings
            .journal_ttl
            .map(|_| self.settings.journal_poll)
    }

    /// The journal reader keeps up (`true`) or has fallen behind (`false`: every answer that
    /// relied on it is forgotten, and new ones live the short TTL until it is back).
    pub fn trust_journal(&self, trusted: bool) {
        let was = self.journal_trusted.swap(trusted, Ordering::SeqCst);
        if was && !trusted {
            self.journal_epoch.fetch_add(1, Ordering::SeqCst);
            self.fresh.invalidate_all();
            tracing::warn!(
                "change journal not read: answers from S3 are kept for --fresh-ttl-ms until it is"
            );
        } else if !was && trusted {
            tracing::info!("change journal read: answers from S3 are kept for --journal-ttl-ms");
        }
    }

    /// Forgets `key` here and in this host's memcached: the journal says it changed.
    pub async fn forget(&self, key: &str) {
        self.fresh.invalidate(key).await;
        if let Some(mc) = &self.memcached {
            mc.forget(key).await;
        }
    }

    /// The fresh cache's answer for `slug` if it holds one (nothing loaded).
    pub async fn cached(&self, slug: &str) -> Option<Outcome> {
        self.fresh.cached(slug).await.map(|f| f.outcome)
    }

    /// The answer and the layer that gave it (`local`, `memcached`, `s3`, `stale`).
    pub async fn resolve(&self, slug: &str) -> Result<(Outcome, &'static str), Unavailable> {
        let cell = LayerCell::default();
        match self
            .fresh
            .get_or_load(slug, &cell, || self.load_fresh(slug, &cell))
            .await
        {
            Ok((fresh, layer)) => Ok((fresh.outcome, layer)),
            Err(err) => match self.stale.get(slug).await {
                Some(old) => {
                    self.metrics.cache.answered(layer::STALE);
                    Ok((old, layer::STALE))
                }
                None => Err((*err).clone()),
            },
        }
    }

    /// [`Self::load`], and how long the answer may live: long only if the journal was trusted
    /// for the whole load and the answer came from S3 itself.
    async fn load_fresh(&self, slug: &str, cell: &LayerCell) -> Result<Fresh, Unavailable> {
        let epoch = self.journal_epoch.load(Ordering::SeqCst);
        let trusted_before = self.journal_trusted.load(Ordering::SeqCst);
        let outcome = self.load(slug, cell).await?;
        let covered = trusted_before
            && self.journal_trusted.load(Ordering::SeqCst)
            && self.journal_epoch.load(Ordering::SeqCst) == epoch
            && cell.get() == layer::S3;
        Ok(Fresh {
            outcome,
            short: !covered,
        })
    }

    async fn load(&self, slug: &str, cell: &LayerCell) -> Result<Outcome, Unavailable> {
        if let Some(mc) = &self.memcached {
            if let Some(t) = mc.get::<Target>(slug).await {
                cell.set(layer::MEMCACHED);
                let answer = Outcome::found(t);
                self.stale.insert(slug.to_string(), answer.clone()).await;
                return Ok(answer);
            }
        }
        let started = Instant::now();
        cell.set(layer::S3);
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
        self.metrics.cache.answered(layer::S3);
        let answer = match object {
            Stored::Nothing => Outcome::Missing,
            Stored::Tombstone => Outcome::Gone,
            Stored::Blob(o) => match target_of(&o.metadata, &o.body) {
                Some(t) => {
                    if let Some(mc) = &self.memcached {
                        mc.fill(slug, &t);
                    }
                    Outcome::found(t)
                }
                None => {
                    self.metrics.malformed.inc();
                    tracing::warn!(slug = %slug, "malformed blob in S3; treated as missing");
                    Outcome::Missing
                }
            },
        };
        self.stale.insert(slug.to_string(), answer.clone()).await;
        Ok(answer)
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
