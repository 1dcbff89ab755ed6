//! `GET|HEAD /{slug}`: the hot path, the redirect kit's pipeline ([`zlink_redirect::pipeline`]:
//! parse → screen → look up → decide → respond → click) with primary's parts: the scan guard
//! (screen), local → memcached → store (look up), Kafka click emission through the relay
//! (click), the redirect deadline and latency histogram.

use crate::app::AppState;
use crate::cache::Lookup;
use crate::error::ApiError;
use http::{HeaderValue, Request};
use std::time::Duration;
use zlink_clients::clicks;
use zlink_redirect::pipeline::{self, RedirectTier};
use zlink_redirect::{layer, Peer, Reject, Resp};
use zlink_wire::events::Tier;
use zlink_wire::slug;

#[utoipa::path(operation_id = "redirect", get, path = "/{slug}", tag = "redirect",
    params(("slug" = String, Path)),
    responses((status = 302, description = "Location: the destination (301, 307 or 308 as the link says)"),
        (status = 404, body = crate::views::Error), (status = 410, body = crate::views::Error)))]
pub async fn redirect<B: Sync>(state: &AppState, req: &Request<B>, slug: &str) -> Resp {
    pipeline::redirect(state, req, slug).await
}

impl RedirectTier for AppState {
    const NAME: &'static str = "primary";
    type Answer = Lookup;

    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn cache_control(&self) -> &HeaderValue {
        &self.settings.cache_control
    }

    fn hosts(&self) -> &zlink_wire::domain::Hosts {
        &self.settings.hosts
    }

    /// Below the frontend's per-try timeout, so nginx can still try the next rung.
    fn deadline(&self) -> Option<Duration> {
        Some(self.settings.redirect_timeout)
    }

    /// An auto-shaped slug whose id was never handed out cannot exist (scans): 404 without a
    /// lookup.
    async fn screen(&self, slug: &str) -> Result<(), Reject> {
        if !slug::is_auto_shape(slug) {
            return Ok(());
        }
        let may_exist = match self.codec.decode(slug) {
            Some(id) if self.issued.known_issued(id) => Ok(true),
            // The counter re-read (a store call) stays out of the hot path's future.
            Some(id) => Box::pin(self.issued.may_exist(id)).await,
            None => Ok(false),
        };
        match may_exist {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.metrics.cache.answered(layer::NEVER_ISSUED);
                Err(Reject::NotFound)
            }
            Err(e) => Err(ApiError::from(e).reject()),
        }
    }

    async fn cached(&self, key: &str) -> Option<Lookup> {
        self.cache.cached(key).await
    }

    async fn lookup(&self, key: &str) -> Result<(Lookup, &'static str), Reject> {
        self.cache
            .resolve(key)
            .await
            .map_err(|e| ApiError::from(e).reject())
    }

    /// To Kafka through the relay, under the outermost hop's id and time (from a trusted
    /// proxy), so a request that nginx already failed over and this primary finishes late is
    /// the same click, counted once.
    fn click<B>(&self, req: &Request<B>, key: &str, now_ms: i64) -> Option<uuid::Uuid> {
        let origin = self
            .settings
            .trusted_proxies
            .origin(Peer::ip_of(req), req.headers(), now_ms);
        clicks::with_event(
            Tier::Primary,
            &self.settings.ip_hash_salt,
            &self.settings.geo,
            key,
            &origin,
            req.headers(),
            |ev| self.events.clicked(ev).then_some(ev.id),
        )
    }

    fn done(&self, _: Option<&str>, _: &Resp, elapsed: Duration) {
        self.metrics.redirect_seconds.observe(elapsed.as_secs_f64());
    }
}
