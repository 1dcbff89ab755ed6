//! API keys: `api_keys` by hash (what authentication reads) and `api_key_ids` by public id
//! (what revocation reads). The key itself is never stored.

use crate::db::{first, Db, StoreError};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;
use std::sync::Arc;

/// A stored API key (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub key_id: String,
    pub owner: String,
    pub admin: bool,
    pub revoked: bool,
}

pub struct Keys {
    db: Arc<Db>,
    get: PreparedStatement,
    insert: PreparedStatement,
    insert_id: PreparedStatement,
    get_hash: PreparedStatement,
    revoke: PreparedStatement,
}

impl Keys {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        Ok(Keys {
            get: db
                .prepare(
                    "SELECT key_id, owner, role, revoked FROM api_keys WHERE key_hash = ?",
                    true,
                    false,
                )
                .await?,
            insert: db
                .prepare(
                    "INSERT INTO api_keys (key_hash, key_id, owner, role, created_at, revoked) \
                     VALUES (?, ?, ?, ?, ?, false)",
                    true,
                    false,
                )
                .await?,
            insert_id: db
                .prepare(
                    "INSERT INTO api_key_ids (key_id, key_hash) VALUES (?, ?)",
                    true,
                    false,
                )
                .await?,
            get_hash: db
                .prepare(
                    "SELECT key_hash FROM api_key_ids WHERE key_id = ?",
                    true,
                    false,
                )
                .await?,
            revoke: db
                .prepare(
                    "UPDATE api_keys SET revoked = true WHERE key_hash = ?",
                    true,
                    false,
                )
                .await?,
            db,
        })
    }

    pub async fn get(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        let res = self.db.exec(&self.get, (key_hash,)).await?;
        let row = first::<(String, String, String, Option<bool>)>(res)?;
        Ok(row.map(|(key_id, owner, role, revoked)| ApiKeyRecord {
            key_id,
            owner,
            admin: role == "admin",
            revoked: revoked.unwrap_or(false),
        }))
    }

    pub async fn insert(
        &self,
        key_hash: &str,
        key_id: &str,
        owner: &str,
        admin: bool,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let role = if admin { "admin" } else { "owner" };
        // The id row first: a key that exists can always be found by its id to be revoked.
        self.db.exec(&self.insert_id, (key_id, key_hash)).await?;
        let values = (key_hash, key_id, owner, role, CqlTimestamp(now_ms));
        self.db.exec(&self.insert, values).await?;
        Ok(())
    }

    /// Revokes the key with public id `key_id`. Returns its hash and its record as it was
    /// (`None`: no such key). Revoking twice is harmless.
    pub async fn revoke(&self, key_id: &str) -> Result<Option<(String, ApiKeyRecord)>, StoreError> {
        let res = self.db.exec(&self.get_hash, (key_id,)).await?;
        let Some((hash,)) = first::<(String,)>(res)? else {
            return Ok(None);
        };
        let Some(rec) = self.get(&hash).await? else {
            return Ok(None);
        };
        self.db.exec(&self.revoke, (&hash,)).await?;
        Ok(Some((hash, rec)))
    }
}
