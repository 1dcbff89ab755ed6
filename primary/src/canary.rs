//! The canary links (`zlink_wire::canary`) kept in existence: with `--canaries`, every primary
//! creates any canary that is absent, at start and then every [`EVERY`], through the one write
//! path ([`crate::write`]: outbox row first, so the replicator puts its S3 page like any
//! link's). Primaries racing to create one are fine: the slug claim is a compare-and-set, and
//! the loser finds exactly the row it wanted. A canary that exists in another state (disabled
//! or deleted by an admin) is left as it is and logged: its probes say so.

use crate::store::Store;
use crate::write::{self, Inserted};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use zlink_clients::clock::Clock;
use zlink_store::{Link, StoreError};
use zlink_wire::canary;
use zlink_wire::domain::LinkKey;
use zlink_wire::LinkStatus;

/// How often the canaries are checked once they all exist.
pub const EVERY: Duration = Duration::from_secs(600);
/// How soon a check that failed (store unreachable) is tried again.
const RETRY: Duration = Duration::from_secs(10);

/// Canary `n` as a new link at `now`.
pub fn link(n: u8, now: i64) -> Link {
    Link {
        key: LinkKey::new(None, &canary::slug(n)),
        url: canary::url(n),
        owner: canary::OWNER.to_string(),
        status: LinkStatus::Active,
        redirect_code: 302,
        created_at_ms: now,
        expires_at_ms: None,
        version: 1,
        idem: None,
        disabled_by: None,
        alias: None,
    }
}

/// Creates every absent canary; returns how many it created.
pub async fn ensure(store: &Store, outbox: bool, now: i64) -> Result<usize, StoreError> {
    let mut created = 0;
    for (n, slug, _) in canary::all() {
        match store.links.get_serial(&slug).await? {
            Some(l) if l.status == LinkStatus::Active && l.owner == canary::OWNER => {}
            Some(l) => {
                tracing::warn!(key = %l.key, status = l.status.as_str(), owner = ?l.owner, "canary link is not an active canary; its probes will fail");
            }
            None => match write::insert(store, outbox, &link(n, now), now).await? {
                Inserted::Created => {
                    tracing::info!(key = %slug, "canary link created");
                    created += 1;
                }
                Inserted::Taken(_) => {}
            },
        }
    }
    Ok(created)
}

/// Keeps the canaries in existence until `shutdown`.
pub async fn run(
    store: Arc<Store>,
    outbox: bool,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) {
    loop {
        let wait = match ensure(&store, outbox, clock.now_ms()).await {
            Ok(_) => EVERY,
            Err(e) => {
                tracing::warn!(error = %e, "canary links not checked; retrying");
                RETRY
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
