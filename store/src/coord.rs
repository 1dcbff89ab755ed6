//! Coordination between instances of one service: `leases` (rows written with a TTL, so one
//! instance at a time runs a background loop; a dead holder's lease lapses) and `cursors`
//! (durable positions of background scanners, so a restarted loop goes on where it stopped).
//! Used by primary's relay (sweeper lease, expiry cursor) and the replicator's S3 audit.

use crate::db::{applied, first, Db, StoreError};
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

pub struct Leases {
    db: Arc<Db>,
    take: PreparedStatement,
    renew: PreparedStatement,
}

impl Leases {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        Ok(Leases {
            take: db
                .prepare(
                    "INSERT INTO leases (name, holder) VALUES (?, ?) IF NOT EXISTS USING TTL ?",
                    false,
                    false,
                )
                .await?,
            renew: db
                .prepare(
                    "UPDATE leases USING TTL ? SET holder = ? WHERE name = ? IF holder = ?",
                    false,
                    false,
                )
                .await?,
            db,
        })
    }

    /// Takes or renews the lease `name` for `ttl_s` seconds. True while `holder` holds it.
    pub async fn lease(&self, name: &str, holder: &str, ttl_s: i32) -> Result<bool, StoreError> {
        let renew = (ttl_s, holder, name, holder);
        if applied(self.db.exec(&self.renew, renew).await?)? {
            return Ok(true);
        }
        applied(self.db.exec(&self.take, (name, holder, ttl_s)).await?)
    }
}

pub struct Cursors {
    db: Arc<Db>,
    get: PreparedStatement,
    init: PreparedStatement,
    set: PreparedStatement,
}

impl Cursors {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        Ok(Cursors {
            get: db
                .prepare("SELECT position FROM cursors WHERE name = ?", true, false)
                .await?,
            init: db
                .prepare(
                    "INSERT INTO cursors (name, position) VALUES (?, ?) IF NOT EXISTS",
                    false,
                    false,
                )
                .await?,
            set: db
                .prepare(
                    "UPDATE cursors SET position = ? WHERE name = ?",
                    true,
                    false,
                )
                .await?,
            db,
        })
    }

    /// The cursor's position, created at `initial` if it does not exist yet.
    pub async fn get(&self, name: &str, initial: i64) -> Result<i64, StoreError> {
        let res = self.db.exec(&self.get, (name,)).await?;
        if let Some((p,)) = first::<(i64,)>(res)? {
            return Ok(p);
        }
        self.db.exec(&self.init, (name, initial)).await?;
        let res = self.db.exec(&self.get, (name,)).await?;
        first::<(i64,)>(res)?
            .map(|(p,)| p)
            .ok_or_else(|| StoreError::Corrupt("cursor vanished".into()))
    }

    pub async fn set(&self, name: &str, position: i64) -> Result<(), StoreError> {
        self.db.exec(&self.set, (position, name)).await?;
        Ok(())
    }
}
