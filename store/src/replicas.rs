//! `replica_versions`: the newest version of each link the replicator has put into S3, so a
//! redelivered or reordered event never replaces a newer object with an older one.

use crate::db::{applied, first, Db, StoreError};
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

pub struct Replicas {
    db: Arc<Db>,
    get: PreparedStatement,
    init: PreparedStatement,
    bump: PreparedStatement,
}

impl Replicas {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        Ok(Replicas {
            get: db
                .prepare(
                    "SELECT version FROM replica_versions WHERE slug = ?",
                    true,
                    false,
                )
                .await?,
            init: db
                .prepare(
                    "INSERT INTO replica_versions (slug, version) VALUES (?, ?) IF NOT EXISTS",
                    false,
                    false,
                )
                .await?,
            bump: db
                .prepare(
                    "UPDATE replica_versions SET version = ? WHERE slug = ? IF version < ?",
                    false,
                    false,
                )
                .await?,
            db,
        })
    }

    /// The newest link version the replicator applied to S3 for `slug` (0: none).
    pub async fn version(&self, slug: &str) -> Result<i64, StoreError> {
        let row = first::<(i64,)>(self.db.exec(&self.get, (slug,)).await?)?;
        Ok(row.map_or(0, |(v,)| v))
    }

    /// Records that `version` of `slug` is in S3, unless a newer version already is.
    /// `absent`: the caller read no row for `slug`, so the insert is tried first (a create
    /// costs one LWT, not a failed conditional update and then the insert).
    pub async fn set_version(
        &self,
        slug: &str,
        version: i64,
        absent: bool,
    ) -> Result<(), StoreError> {
        if absent {
            if applied(self.db.exec(&self.init, (slug, version)).await?)? {
                return Ok(());
            }
            // Someone created the row meanwhile: the conditional bump settles it.
            applied(self.db.exec(&self.bump, (version, slug, version)).await?)?;
            return Ok(());
        }
        if applied(self.db.exec(&self.bump, (version, slug, version)).await?)? {
            return Ok(());
        }
        // Not applied: either a newer version is recorded (fine) or there is no row yet.
        if applied(self.db.exec(&self.init, (slug, version)).await?)? {
            return Ok(());
        }
        // Someone created the row meanwhile: one more conditional bump settles it.
        applied(self.db.exec(&self.bump, (version, slug, version)).await?)?;
        Ok(())
    }
}
