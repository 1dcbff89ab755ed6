//! The store's repositories a serving primary uses, prepared once on one (guarded) session.

use std::sync::Arc;
use zlink_store::domains::Domains;
use zlink_store::ids::IdBlocks;
use zlink_store::keys::Keys;
use zlink_store::outbox::{Expiries, Outbox};
use zlink_store::{Db, Links, StoreError};

pub struct Store {
    /// The session (readiness pings it).
    pub db: Arc<Db>,
    pub links: Links,
    pub domains: Domains,
    pub outbox: Outbox,
    pub expiries: Expiries,
    pub keys: Keys,
    pub ids: IdBlocks,
}

impl Store {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        Ok(Store {
            links: Links::prepare(db.clone()).await?,
            domains: Domains::prepare(db.clone()).await?,
            outbox: Outbox::prepare(db.clone()).await?,
            expiries: Expiries::prepare(db.clone()).await?,
            keys: Keys::prepare(db.clone()).await?,
            ids: IdBlocks::prepare(db.clone()).await?,
            db,
        })
    }
}
