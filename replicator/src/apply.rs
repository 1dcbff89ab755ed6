//! One link event → S3. The version guard makes this idempotent and order-proof: an event
//! whose version is not newer than the one recorded in `replica_versions` is skipped, so a
//! replay or a reordered duplicate can never resurrect a disabled link. The recorded version is
//! written only after S3 confirmed, so a crash in between just repeats the (idempotent) write.

use crate::metrics::Metrics;
use crate::s3::{S3Error, S3Store};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use zlink_clients::backoff::Backoff;
use zlink_clients::clock::Clock;
use zlink_clients::trace::Span;
use zlink_store::replicas::Replicas;
use zlink_store::{Db, StoreError};
use zlink_wire::blob::{Blob, GoneReason, Tombstone};
use zlink_wire::events::{LinkEvent, LinkEventKind, LINK_EVENT_SCHEMA};
use zlink_wire::{link, longurl, LinkStatus};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Put,
    Deleted,
    Skipped,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Put => "put",
            Outcome::Deleted => "delete",
            Outcome::Skipped => "skipped",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Can never be applied: goes to the dead-letter topic.
    #[error("{0}")]
    Permanent(String),
    /// Shutdown arrived while retrying; the event was not applied and its offset not stored.
    #[error("cancelled")]
    Cancelled,
}

/// Decodes and checks an event from the wire; anything odd is permanent.
pub fn decode(payload: Option<&[u8]>) -> Result<LinkEvent, ApplyError> {
    let bad = |m: &str| ApplyError::Permanent(m.to_string());
    let ev: LinkEvent = serde_json::from_slice(payload.ok_or_else(|| bad("empty message"))?)
        .map_err(|e| ApplyError::Permanent(format!("not a link event: {e}")))?;
    if ev.schema != LINK_EVENT_SCHEMA {
        return Err(bad("unknown event schema"));
    }
    if !ev.key.is_valid() {
        return Err(bad("invalid link key"));
    }
    if longurl::normalize(&ev.url).as_deref() != Ok(ev.url.as_str()) {
        return Err(bad("url is not a valid normalised URL"));
    }
    if !link::is_redirect_code(ev.redirect_code) || ev.version < 1 {
        return Err(bad("invalid redirect code or version"));
    }
    Ok(ev)
}

/// What S3 should hold for a link: its blob while it redirects, else a tombstone (and no blob).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Desired {
    Blob(Blob),
    Tombstone(Tombstone),
}

impl Desired {
    pub fn blob(&self) -> Option<&Blob> {
        match self {
            Desired::Blob(b) => Some(b),
            Desired::Tombstone(_) => None,
        }
    }
}

/// What S3 should hold after this event.
pub fn desired(ev: &LinkEvent, now_ms: i64) -> Desired {
    desired_state(
        ev.status,
        &ev.url,
        ev.redirect_code,
        ev.version,
        ev.expires_at_ms,
        now_ms,
    )
}

/// What S3 should hold for a link as stored: the same rule as for events.
pub fn desired_for_link(l: &zlink_store::Link, now_ms: i64) -> Desired {
    desired_state(
        l.status,
        &l.url,
        l.redirect_code,
        l.version,
        l.expires_at_ms,
        now_ms,
    )
}

fn desired_state(
    status: LinkStatus,
    url: &str,
    code: u16,
    version: i64,
    exp: Option<i64>,
    now_ms: i64,
) -> Desired {
    match status {
        LinkStatus::Active if exp.is_none_or(|e| e > now_ms) => Desired::Blob(Blob {
            url: url.to_string(),
            code,
            version,
            expires_at_ms: exp,
        }),
        LinkStatus::Disabled => Desired::Tombstone(Tombstone {
            reason: GoneReason::Disabled,
            version,
        }),
        LinkStatus::Active | LinkStatus::Expired => Desired::Tombstone(Tombstone {
            reason: GoneReason::Expired,
            version,
        }),
        LinkStatus::Deleted => Desired::Tombstone(Tombstone {
            reason: GoneReason::Deleted,
            version,
        }),
    }
}

enum Failure {
    Transient(String),
    Permanent(String),
}

impl From<S3Error> for Failure {
    fn from(e: S3Error) -> Self {
        match e {
            S3Error::Transient(m) => Failure::Transient(m),
            S3Error::Permanent(m) => Failure::Permanent(m),
        }
    }
}

/// A row this code cannot have written does not heal by retrying: the event is parked in the
/// dead-letter topic (logged and counted there). Everything else the store says may pass.
impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Corrupt(_) => Failure::Permanent(e.to_string()),
            StoreError::Unavailable(_) | StoreError::Contention(_) | StoreError::CircuitOpen => {
                Failure::Transient(e.to_string())
            }
        }
    }
}

pub struct Applier {
    pub s3: Arc<S3Store>,
    /// The store session (readiness pings it).
    pub db: Arc<Db>,
    pub replicas: Replicas,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    /// Every object written is read back a little later (`crate::audit`).
    pub rechecks: Arc<crate::rechecks::Rechecks>,
}

const BACKOFF_START: Duration = Duration::from_millis(100);
/// At most this long between attempts while S3 is down: a link created just before S3 comes
/// back waits at most this for its next attempt, which ε (5 s) must absorb. (5 s here was
/// measured as 5.7 s create → every rung right after an S3 restart.) One attempt per second
/// per partition worker is no load on a recovering S3.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

impl Applier {
    /// Retries transient failures with exponential backoff and equal jitter until success,
    /// a permanent failure, or shutdown. Failures of S3 operations (`is_s3`) are counted in
    /// `s3_failures_total`; the store's are only logged. Every attempt is timed in
    /// `step_seconds{step=what}`.
    async fn retry<T, F, Fut>(
        &self,
        is_s3: bool,
        what: &'static str,
        shutdown: &CancellationToken,
        mut op: F,
    ) -> Result<T, ApplyError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let mut delay = Backoff::new(BACKOFF_START, BACKOFF_MAX);
        let timer = self.metrics.step_seconds.with_label_values(&[what]);
        loop {
            let started = std::time::Instant::now();
            let result = op().await;
            timer.observe(started.elapsed().as_secs_f64());
            match result {
                Ok(v) => return Ok(v),
                Err(Failure::Permanent(m)) => {
                    if is_s3 {
                        self.metrics
                            .s3_failures
                            .with_label_values(&["permanent"])
                            .inc();
                    }
                    return Err(ApplyError::Permanent(format!("{what}: {m}")));
                }
                Err(Failure::Transient(m)) => {
                    if is_s3 {
                        self.metrics
                            .s3_failures
                            .with_label_values(&["transient"])
                            .inc();
                    }
                    let sleep = delay.next_delay();
                    tracing::warn!(what, error = %m, retry_in_ms = sleep.as_millis() as u64, "transient failure");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Err(ApplyError::Cancelled),
                        _ = tokio::time::sleep(sleep) => {}
                    }
                }
            }
        }
    }

    pub async fn apply(
        &self,
        ev: &LinkEvent,
        shutdown: &CancellationToken,
    ) -> Result<Outcome, ApplyError> {
        let recorded = self
            .retry(false, "read_version", shutdown, || async {
                Ok(self.replicas.version(&ev.key).await?)
            })
            .await?;
        if ev.version <= recorded {
            return Ok(Outcome::Skipped);
        }
        // Write the new state before removing the old one: a reader in between sees the link as
        // it was, never as unknown.
        let outcome = match desired(ev, self.clock.now_ms()) {
            Desired::Blob(blob) => {
                let mut span = Span::in_current("s3.put");
                span.set("slug", ev.key.to_string());
                span.set("version", ev.version);
                self.retry(true, "put_blob", shutdown, || async {
                    Ok(self.s3.put(&ev.key, &blob).await?)
                })
                .await?;
                span.end();
                // A tombstone exists only for a version that was not an active, unexpiring
                // link, and every event of version 1 carries the same state (slugs are never
                // reused): a first version without expiry never had one, and its DELETE (one of
                // a create's two S3 requests) is left out.
                let first_version = recorded == 0 && ev.version == 1 && ev.expires_at_ms.is_none();
                if !first_version {
                    self.retry(true, "delete_tombstone", shutdown, || async {
                        Ok(self.s3.delete_tombstone(&ev.key).await?)
                    })
                    .await?;
                }
                Outcome::Put
            }
            Desired::Tombstone(t) => {
                let mut span = Span::in_current("s3.put_tombstone");
                span.set("slug", ev.key.to_string());
                span.set("version", ev.version);
                self.retry(true, "put_tombstone", shutdown, || async {
                    Ok(self.s3.put_tombstone(&ev.key, &t).await?)
                })
                .await?;
                span.end();
                self.retry(true, "delete_blob", shutdown, || async {
                    Ok(self.s3.delete(&ev.key).await?)
                })
                .await?;
                Outcome::Deleted
            }
        };
        self.retry(false, "record_version", shutdown, || async {
            Ok(self
                .replicas
                .set_version(&ev.key, ev.version, recorded == 0)
                .await?)
        })
        .await?;
        self.rechecks.push(&ev.key, ev.version, self.clock.now_ms());
        if ev.kind == LinkEventKind::Created && outcome == Outcome::Put {
            let secs = (self.clock.now_ms() - ev.at_ms).max(0) as f64 / 1000.0;
            self.metrics.create_to_s3_seconds.observe(secs);
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(status: LinkStatus, exp: Option<i64>) -> LinkEvent {
        LinkEvent {
            schema: LINK_EVENT_SCHEMA,
            kind: LinkEventKind::Created,
            key: "abc".into(),
            url: "https://e.com/".into(),
            status,
            version: 1,
            redirect_code: 302,
            created_at_ms: 0,
            expires_at_ms: exp,
            at_ms: 0,
        }
    }

    #[test]
    fn only_active_unexpired_links_have_a_blob_the_rest_a_tombstone() {
        let gone = |reason| Desired::Tombstone(Tombstone { reason, version: 1 });
        assert!(desired(&ev(LinkStatus::Active, None), 10).blob().is_some());
        assert!(desired(&ev(LinkStatus::Active, Some(11)), 10)
            .blob()
            .is_some());
        assert_eq!(
            desired(&ev(LinkStatus::Active, Some(10)), 10),
            gone(GoneReason::Expired)
        );
        assert_eq!(
            desired(&ev(LinkStatus::Disabled, None), 10),
            gone(GoneReason::Disabled)
        );
        assert_eq!(
            desired(&ev(LinkStatus::Expired, None), 10),
            gone(GoneReason::Expired)
        );
        assert_eq!(
            desired(&ev(LinkStatus::Deleted, Some(11)), 10),
            gone(GoneReason::Deleted)
        );
    }

    #[test]
    fn malformed_events_are_permanent_failures() {
        let good = serde_json::to_vec(&ev(LinkStatus::Active, None)).unwrap();
        assert!(decode(Some(&good)).is_ok());
        for bad in [
            &b"not json"[..],
            br#"{"schema":1}"#,
            &String::from_utf8(good.clone())
                .unwrap()
                .replace("\"abc\"", "\"../x\"")
                .into_bytes(),
            &String::from_utf8(good.clone())
                .unwrap()
                .replace("https://e.com/", "javascript:alert(1)")
                .into_bytes(),
            &String::from_utf8(good.clone())
                .unwrap()
                .replace("\"schema\":1", "\"schema\":9")
                .into_bytes(),
        ] {
            assert!(matches!(decode(Some(bad)), Err(ApplyError::Permanent(_))));
        }
        assert!(decode(None).is_err());
    }

    #[test]
    fn a_corrupt_row_is_parked_and_an_outage_retried() {
        let f = |e| matches!(Failure::from(e), Failure::Permanent(_));
        assert!(f(StoreError::Corrupt("status \"x\"".into())));
        assert!(!f(StoreError::Unavailable("down".into())));
        assert!(!f(StoreError::CircuitOpen));
        assert!(!f(StoreError::Contention("lost")));
    }
}
