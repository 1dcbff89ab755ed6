//! The link write path: the one module that writes link rows and the outbox rows announcing
//! them. Callers decide (validation, ownership, transitions, idempotency); this module writes,
//! in the order the invariants need, and says what it wrote:
//!
//! - an outbox row precedes the change it announces (invariant 5: a crash after the change
//!   still leaves the row, and `relay` publishes the event whatever happens next);
//! - a new link's expiry entry and its owner's list entry precede the link (the scheduler and
//!   the list never miss a link that exists);
//! - a change is a compare-and-set on (status, version) to version + 1.
//!
//! Writers: the API's create and change ([`crate::api`], [`crate::bulk`]) and the expiry
//! scheduler ([`crate::relay`]). Announcing (memcached, the event's fast path) is theirs.

use crate::store::Store;
use zlink_store::outbox::OutboxRow;
use zlink_store::{DisabledBy, Link, StoreError};
use zlink_wire::LinkStatus;

/// One change of a link: a new version.
pub enum Change {
    Status(LinkStatus, Option<DisabledBy>),
    /// A new destination and/or expiry (the status stays).
    Target {
        url: String,
        expires_at_ms: Option<i64>,
    },
}

/// What writing a new link found.
#[derive(Debug)]
pub enum Inserted {
    /// The link is stored: by this write, or by a copy of it the store applied first (the
    /// driver may send a slow write to a second node; the copy that lost finds the winner's
    /// row, which is exactly the link).
    Created,
    /// Another link holds the key: taken, or an earlier attempt of the same idempotent
    /// request (the caller tells which).
    Taken(Link),
}

/// Writes `new` (version 1): its outbox row (with `outbox`), expiry entry and owner's list
/// entry first (independent of each other: written concurrently, one round trip), then the
/// link itself if its key is free.
pub async fn insert(
    store: &Store,
    outbox: bool,
    new: &Link,
    now: i64,
) -> Result<Inserted, StoreError> {
    let row = async {
        match outbox {
            true => {
                let row = OutboxRow::new(&new.key, now, new.version);
                store.outbox.add(&row).await
            }
            false => Ok(()),
        }
    };
    let expiry = async {
        match new.expires_at_ms {
            Some(exp) => store.expiries.add(&new.key, exp).await,
            None => Ok(()),
        }
    };
    tokio::try_join!(row, expiry, store.links.index(new))?;
    if store.links.insert_if_absent(new).await? {
        return Ok(Inserted::Created);
    }
    match store.links.get_serial(&new.key).await? {
        Some(existing) if existing == *new => Ok(Inserted::Created),
        Some(existing) => Ok(Inserted::Taken(existing)),
        None => Err(StoreError::Corrupt(format!(
            "slug {:?} claimed but unreadable",
            new.key
        ))),
    }
}

/// Applies `what` to `link` (as a SERIAL read found it) as version + 1: a new expiry's entry
/// first, then the outbox row (with `outbox`), then a compare-and-set on the link's status
/// and version. Returns the link as written and the outbox row announcing it; `None` when the
/// link changed meanwhile (the change is not applied; an outbox row already written only
/// republishes the current state, which the replicator's version guard makes harmless).
pub async fn change(
    store: &Store,
    outbox: bool,
    link: Link,
    what: Change,
    now: i64,
) -> Result<Option<(Link, Option<OutboxRow>)>, StoreError> {
    if let Change::Target {
        expires_at_ms: Some(exp),
        ..
    } = &what
    {
        store.expiries.add(&link.key, *exp).await?;
    }
    let row = match outbox {
        true => {
            let row = OutboxRow::new(&link.key, now, link.version + 1);
            store.outbox.add(&row).await?;
            Some(row)
        }
        false => None,
    };
    let links = &store.links;
    let (applied, updated) = match what {
        Change::Status(to, disabled_by) => (
            links
                .transition(
                    &link.key,
                    link.status,
                    link.version,
                    to,
                    disabled_by.as_ref(),
                )
                .await?,
            Link {
                status: to,
                version: link.version + 1,
                disabled_by,
                ..link
            },
        ),
        Change::Target { url, expires_at_ms } => (
            links
                .retarget(&link.key, link.status, link.version, &url, expires_at_ms)
                .await?,
            Link {
                url,
                expires_at_ms,
                version: link.version + 1,
                ..link
            },
        ),
    };
    Ok(applied.then_some((updated, row)))
}

/// The owner's name for a link (not replicated: no version, no event); what the store says
/// of it ([`zlink_store::links::Links::set_alias`]).
pub async fn set_alias(store: &Store, key: &str, alias: Option<&str>) -> Result<bool, StoreError> {
    store.links.set_alias(key, alias).await
}
