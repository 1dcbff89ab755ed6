//! API keys: generation, hashing, and bearer-token authentication with a short-lived cache.
//!
//! A key is `zl_<16 hex id>_<64 hex secret>`; only SHA-256 of the whole key is stored. Lookups
//! are cached in-process for 5 s (known and unknown keys alike), so a revocation takes effect on
//! every primary within 5 s (at once on the one that revoked it), and a flood of bad keys does
//! not become a flood of store reads (unknown tokens are also limited per client address).

use crate::error::ApiError;
use crate::store::Store;
use moka::future::Cache;
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub key_id: String,
    pub owner: String,
    pub admin: bool,
}

impl Principal {
    pub fn may_manage(&self, owner: &str) -> bool {
        self.admin || self.owner == owner
    }
}

pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A new random key and its public id.
pub fn generate_key() -> (String, String) {
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    rand::rng().fill_bytes(&mut id);
    rand::rng().fill_bytes(&mut secret);
    let key_id = hex::encode(id);
    (format!("zl_{key_id}_{}", hex::encode(secret)), key_id)
}

/// Owner names are stored and compared as given; keep them boring.
pub fn validate_owner(owner: &str) -> Result<(), String> {
    if (1..=64).contains(&owner.len())
        && owner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
    {
        Ok(())
    } else {
        Err("owner must be 1-64 characters of [A-Za-z0-9-_.@]".into())
    }
}

/// How long a key lookup (found or not) is trusted: the bound on revocation across primaries.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(5);

/// A key id as generated: 16 lowercase hex digits.
pub fn is_key_id(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

pub struct Authenticator {
    store: Arc<Store>,
    cache: Cache<String, Option<Principal>>,
}

impl Authenticator {
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            store,
            cache: Cache::builder()
                .max_capacity(10_000)
                .time_to_live(KEY_CACHE_TTL)
                .build(),
        }
    }

    /// Forgets a key in this process (after revoking it here).
    pub async fn forget(&self, key_hash: &str) {
        self.cache.invalidate(key_hash).await;
    }

    /// Resolves an `Authorization` header value to a principal, or 401. A token this process
    /// does not know yet (positively or negatively) needs a store read: `admit` is asked
    /// first (the per-address limit on unknown tokens), so random tokens cannot become a flood
    /// of store reads.
    pub async fn authenticate(
        &self,
        header: Option<&http::HeaderValue>,
        admit: impl FnOnce() -> Result<(), ApiError>,
    ) -> Result<Principal, ApiError> {
        let token = header
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| {
                t.len() <= 256 && t.starts_with("zl_") && t.bytes().all(|b| b.is_ascii_graphic())
            })
            .ok_or(ApiError::Unauthorized)?;
        let hash = hash_key(token);
        if let Some(known) = self.cache.get(&hash).await {
            return known.ok_or(ApiError::Unauthorized);
        }
        admit()?;
        let store = self.store.clone();
        let found = self
            .cache
            .try_get_with(hash.clone(), async move {
                let rec = store.keys.get(&hash).await?;
                Ok::<_, zlink_store::StoreError>(rec.filter(|r| !r.revoked).map(|r| Principal {
                    key_id: r.key_id,
                    owner: r.owner,
                    admin: r.admin,
                }))
            })
            .await
            .map_err(|e| ApiError::from((*e).clone()))?;
        found.ok_or(ApiError::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_well_formed() {
        let (a, id_a) = generate_key();
        let (b, _) = generate_key();
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("zl_{id_a}_")));
        assert_eq!(a.len(), 3 + 16 + 1 + 64);
        assert_eq!(hash_key(&a).len(), 64);
        assert_ne!(hash_key(&a), hash_key(&b));
    }

    #[test]
    fn owners_are_restricted() {
        assert!(validate_owner("team-a").is_ok());
        assert!(validate_owner("a b").is_err());
        assert!(validate_owner("").is_err());
    }
}
