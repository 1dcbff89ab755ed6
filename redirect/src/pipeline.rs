//! `GET|HEAD /{slug}` as named phases, the same on both tiers:
//!
//! 1. **parse**: anything that is not a possible slug, or a `Host` that names no domain, is 404
//!    without touching a cache; the slug and the host's domain give the link key
//!    ([`zlink_wire::domain`]: the slug itself on the default domain, `<domain>/<slug>` on a
//!    branded one), which every later phase uses;
//! 2. **screen**: the tier may refuse early (primary: an auto-shaped slug never issued); a key
//!    the tier's local cache holds skips it (it passed the screen when it was loaded), which
//!    keeps the hot path to one in-memory lookup;
//! 3. **look up** through the tier's cache layers to its source of truth;
//! 4. **decide** ([`crate::decide`]): redirect, 404, 410 or 500;
//! 5. **respond**: status, `Location`, `Cache-Control`, `x-zlink-tier`, or the JSON error;
//! 6. **emit the click** (GET only, not for a canary link, never awaited by the answer beyond
//!    an in-memory hand-off): its id in `x-zlink-click-id`.
//!
//! The tier's deadline, below the nginx per-try timeout, counts from the request's start and
//! bounds phases 2 and 3 (the only ones that wait on anything outside the process): a 503 from
//! here reaches nginx in time to try the next rung instead of nginx timing out on us. A hit of
//! the local cache waits on nothing, so it arms no timer.

use crate::decide::{decide_located, Answer, Decision};
use crate::{Reject, Resp};
use bytes::Bytes;
use http::{header, HeaderValue, Request};
use http_body_util::Full;
use std::future::Future;
use std::time::{Duration, Instant};
use zlink_clients::clicks;
use zlink_clients::trace::RequestTrace;
use zlink_wire::domain::Hosts;
use zlink_wire::{canary, slug};

/// A redirect's response and the cache layer that answered its lookup (the trace's
/// `cache_layer`; `None` when no lookup answered). Returned beside the response, not in its
/// extensions: a response's first extension cost three allocations on every redirect.
pub type Answered = (Resp, Option<&'static str>);

/// What a tier supplies: its lookup chain, its click sink, its settings.
pub trait RedirectTier: Send + Sync + 'static {
    /// `x-zlink-tier` of its redirects.
    const NAME: &'static str;
    type Answer: Answer;

    /// Unix milliseconds (expiry is decided with it).
    fn now_ms(&self) -> i64;
    /// `Cache-Control` of redirects (the same on every rung).
    fn cache_control(&self) -> &HeaderValue;
    /// The default domain's host names (every other name is a branded domain).
    fn hosts(&self) -> &Hosts;
    /// The redirect's deadline from its start (bounding the screen and the lookup), if the
    /// tier has one.
    fn deadline(&self) -> Option<Duration> {
        None
    }
    /// Phase 2: refuse a slug that cannot exist before any lookup (the bare slug: auto slugs
    /// are unique across domains).
    fn screen(&self, _slug: &str) -> impl Future<Output = Result<(), Reject>> + Send {
        async { Ok(()) }
    }
    /// Before phase 2: the answer for `key` if the tier's in-process cache holds it (then
    /// neither the screen nor the lookup runs; the answer's layer is [`crate::layer::LOCAL`]).
    fn cached(&self, _key: &str) -> impl Future<Output = Option<Self::Answer>> + Send {
        async { None }
    }
    /// Phase 3: the answer for the link `key` and the layer that gave it ([`crate::layer`]).
    /// An error is a dependency failure the tier has already logged and counted.
    fn lookup(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<(Self::Answer, &'static str), Reject>> + Send;
    /// Phase 6: hands a click of a redirect of `key` to the tier's sink; its id, if it took it.
    fn click<B>(&self, req: &Request<B>, key: &str, now_ms: i64) -> Option<uuid::Uuid>;
    /// After the answer (metrics); `key` is `None` when the host named no domain.
    fn done(&self, _key: Option<&str>, _resp: &Resp, _elapsed: Duration) {}
}

/// Answers `GET|HEAD /{slug}` on the domain the request's `Host` names.
pub async fn redirect<T: RedirectTier, B: Sync>(tier: &T, req: &Request<B>, slug: &str) -> Resp {
    answer(tier, req, slug).await.0
}

/// [`redirect`], with the layer that answered (for [`traced`]).
pub async fn answer<T: RedirectTier, B: Sync>(tier: &T, req: &Request<B>, slug: &str) -> Answered {
    let started = Instant::now();
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    let key = tier.hosts().key_of(host, slug);
    let (resp, layer) = match &key {
        None => (Reject::NotFound.into_response(), None),
        Some(key) => phases(tier, req, slug, key, started).await,
    };
    tier.done(key.as_deref(), &resp, started.elapsed());
    (resp, layer)
}

async fn phases<T: RedirectTier, B: Sync>(
    tier: &T,
    req: &Request<B>,
    slug: &str,
    key: &str,
    started: Instant,
) -> Answered {
    if !slug::is_valid_slug(slug) {
        return (Reject::NotFound.into_response(), None);
    }
    let (answer, layer) = match tier.cached(key).await {
        Some(answer) => (answer, crate::layer::LOCAL),
        // The miss path runs boxed: its futures (the tier's client calls) are kilobytes that
        // a hit would otherwise carry and move with the request's future.
        None => match Box::pin(screen_and_look_up(tier, slug, key, started)).await {
            Ok(found) => found,
            Err(r) => return (r.into_response(), None),
        },
    };
    let now = tier.now_ms();
    let decision = decide_located(answer.view(), answer.location(), now);
    if decision == Decision::Reject(Reject::Internal) {
        tracing::error!(key = ?key, "stored link has an unusable url or code");
    }
    let mut resp = respond(decision, T::NAME, tier.cache_control());
    // A canary's redirect is a probe, not a click (zlink_wire::canary).
    if resp.status().is_redirection() && clicks::is_click(req.method()) && !canary::is_canary(key) {
        if let Some(id) = tier.click(req, key, now) {
            resp.headers_mut()
                .insert(clicks::CLICK_ID, clicks::click_id_value(id));
        }
    }
    (resp, Some(layer))
}

/// Phases 2 and 3 for a key the tier's local cache does not hold, under the tier's deadline
/// from the request's start (`started`).
async fn screen_and_look_up<T: RedirectTier>(
    tier: &T,
    slug: &str,
    key: &str,
    started: Instant,
) -> Result<(T::Answer, &'static str), Reject> {
    let miss = async {
        tier.screen(slug).await?;
        tier.lookup(key).await
    };
    match tier.deadline() {
        Some(d) => tokio::time::timeout_at((started + d).into(), miss)
            .await
            .unwrap_or(Err(Reject::Timeout)),
        None => miss.await,
    }
}

/// `x-zlink-tier`: which rung answered. A name built once (inserting the `&str` allocated a
/// new name on every redirect).
pub const TIER: http::HeaderName = http::HeaderName::from_static("x-zlink-tier");

/// Phase 5: the response of a decision.
pub fn respond(decision: Decision, tier: &'static str, cache_control: &HeaderValue) -> Resp {
    match decision {
        Decision::Reject(r) => r.into_response(),
        Decision::Redirect { code, location } => {
            let mut resp = Resp::new(Full::new(Bytes::new()));
            *resp.status_mut() = code;
            let h = resp.headers_mut();
            h.insert(header::LOCATION, location);
            h.insert(header::CACHE_CONTROL, cache_control.clone());
            h.insert(TIER, HeaderValue::from_static(tier));
            resp
        }
    }
}

/// Runs a request's handler under its trace and ends the trace with the response's status and
/// cache layer (see [`RequestTrace`]).
pub async fn traced(
    trace: RequestTrace,
    redirect: bool,
    slug: Option<&str>,
    handler: impl Future<Output = Answered>,
) -> Resp {
    let (resp, layer) = trace.run(std::pin::pin!(handler)).await;
    trace.finish(redirect, slug, layer, resp.status());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::{Outcome, Target};
    use zlink_wire::domain::Hosts;

    /// A tier whose lookup future is as large as a real one with its client calls (16 KiB held
    /// across an await) and never ends (a hung dependency), and whose local cache answers every
    /// key when it has a `hit`.
    struct BigLookup {
        hosts: Hosts,
        cache_control: HeaderValue,
        hit: Option<Outcome>,
        deadline: Option<Duration>,
    }

    fn tier(hit: Option<Outcome>, deadline: Option<Duration>) -> BigLookup {
        BigLookup {
            hosts: Hosts::new(["s.test"]),
            cache_control: HeaderValue::from_static("max-age=60"),
            hit,
            deadline,
        }
    }

    fn get(slug: &str) -> Request<()> {
        Request::builder()
            .uri(format!("/{slug}"))
            .header(header::HOST, "s.test")
            .body(())
            .unwrap()
    }

    impl RedirectTier for BigLookup {
        const NAME: &'static str = "test";
        type Answer = Outcome;
        fn now_ms(&self) -> i64 {
            0
        }
        fn cache_control(&self) -> &HeaderValue {
            &self.cache_control
        }
        fn hosts(&self) -> &Hosts {
            &self.hosts
        }
        fn deadline(&self) -> Option<Duration> {
            self.deadline
        }
        async fn cached(&self, _key: &str) -> Option<Outcome> {
            self.hit.clone()
        }
        async fn lookup(&self, _key: &str) -> Result<(Outcome, &'static str), Reject> {
            let held = [7u8; 16 * 1024];
            std::future::pending::<()>().await;
            Err(if std::hint::black_box(&held)[0] == 7 {
                Reject::Unavailable
            } else {
                Reject::Internal
            })
        }
        fn click<B>(&self, _: &Request<B>, _: &str, _: i64) -> Option<uuid::Uuid> {
            None
        }
    }

    /// A hit neither builds nor carries the miss path's futures: the redirect's future (which
    /// hyper moves with every request) stays small however large the tier's lookup is.
    #[tokio::test]
    async fn a_hits_future_does_not_carry_the_lookups() {
        let hit = Outcome::found(Target {
            url: "https://example.com/".into(),
            code: 302,
            exp: None,
        });
        let hot = tier(Some(hit), Some(Duration::from_millis(50)));
        let req = get("abc");
        let fut = answer(&hot, &req, "abc");
        assert!(
            std::mem::size_of_val(&fut) < 2048,
            "{}",
            std::mem::size_of_val(&fut)
        );
        let (resp, layer) = fut.await;
        assert_eq!(resp.status(), http::StatusCode::FOUND);
        assert_eq!(resp.headers()[header::LOCATION], "https://example.com/");
        assert_eq!(layer, Some(crate::layer::LOCAL));
    }

    /// A lookup that never ends is cut at the tier's deadline (a 503 the nginx in front retries
    /// on the next rung); without a deadline the tier waits, as lastresort does on its S3
    /// budget.
    #[tokio::test]
    async fn a_hung_lookup_ends_at_the_deadline() {
        let hasty = tier(None, Some(Duration::from_millis(50)));
        let (resp, layer) = answer(&hasty, &get("abc"), "abc").await;
        assert_eq!(resp.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(layer, None);
        let patient = tier(None, None);
        let waited = tokio::time::timeout(
            Duration::from_millis(200),
            answer(&patient, &get("abc"), "abc"),
        )
        .await;
        assert!(waited.is_err(), "no deadline: the lookup is awaited");
    }
}
